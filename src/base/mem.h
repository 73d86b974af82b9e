/*
 * mem — allocation that cannot fail, growable buffers with caps, arenas.
 *
 * Allocation failure aborts the process through one place (xmalloc & co), so
 * error paths elsewhere are about real errors only.  Every buffer that grows
 * from network input carries a cap: buf_* return IFL_ETOOBIG past it.
 */
#ifndef IFL_BASE_MEM_H
#define IFL_BASE_MEM_H

#include <stdarg.h>
#include <stddef.h>

/* Never return NULL; abort on exhaustion. Free with free(). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
/* printf into a fresh heap string; caller frees. */
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A growable byte buffer, always NUL-terminated when p != NULL.
 * `max` == 0 means uncapped (only for data the program itself produces). */
struct buf {
    char *p;
    size_t len;
    size_t cap;
    size_t max;
};

void buf_init(struct buf *b, size_t max);
/* Returns 0 or IFL_ETOOBIG (b unchanged). */
int buf_append(struct buf *b, const void *data, size_t n);
int buf_puts(struct buf *b, const char *s);
int buf_putc(struct buf *b, char c);
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Detaches the data (caller frees with free()); b is reset. Never NULL. */
char *buf_steal(struct buf *b);
void buf_reset(struct buf *b);
void buf_free(struct buf *b);

/* A bump arena: many small allocations freed in one call.  Not thread safe;
 * one arena per request or evaluation. */
struct arena;
struct arena *arena_new(size_t chunk);
/* 16-byte aligned; never NULL. Valid until arena_free/arena_reset. */
void *arena_alloc(struct arena *a, size_t n);
char *arena_strndup(struct arena *a, const char *s, size_t n);
/* Total bytes handed out since creation/reset. */
size_t arena_used(const struct arena *a);
void arena_reset(struct arena *a);
void arena_free(struct arena *a);

#endif
