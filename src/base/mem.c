/*
 * mem — see mem.h.  The only place in the project that handles ENOMEM.
 */
#include "base/mem.h"
#include "base/err.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void oom(size_t n)
{
    fprintf(stderr, "{\"level\":\"fatal\",\"msg\":\"out of memory allocating %zu bytes\"}\n", n);
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        oom(n * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

char *xasprintf(const char *fmt, ...)
{
    struct buf b;
    buf_init(&b, 0);
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return xstrdup("");
    if ((size_t)n < sizeof tmp)
        return xstrndup(tmp, (size_t)n);
    char *p = xmalloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void buf_init(struct buf *b, size_t max)
{
    b->p = NULL;
    b->len = 0;
    b->cap = 0;
    b->max = max;
}

static int reserve(struct buf *b, size_t extra)
{
    if (b->max && (b->len + extra > b->max || b->len + extra < b->len))
        return IFL_ETOOBIG;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
    return 0;
}

int buf_append(struct buf *b, const void *data, size_t n)
{
    int rc = reserve(b, n);
    if (rc)
        return rc;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int buf_puts(struct buf *b, const char *s)
{
    return buf_append(b, s, strlen(s));
}

int buf_putc(struct buf *b, char c)
{
    return buf_append(b, &c, 1);
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return IFL_EINTERNAL;
    if ((size_t)n < sizeof tmp)
        return buf_append(b, tmp, (size_t)n);
    int rc = reserve(b, (size_t)n);
    if (rc)
        return rc;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

char *buf_steal(struct buf *b)
{
    char *p = b->p ? b->p : xstrdup("");
    b->p = NULL;
    b->len = b->cap = 0;
    return p;
}

void buf_reset(struct buf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
}

void buf_free(struct buf *b)
{
    if (!b)
        return;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

struct chunk {
    struct chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

struct arena {
    struct chunk *head;
    size_t chunk;
    size_t total;
};

struct arena *arena_new(size_t chunk)
{
    struct arena *a = xcalloc(1, sizeof *a);
    a->chunk = chunk ? chunk : 8192;
    return a;
}

void *arena_alloc(struct arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct chunk *c = a->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > a->chunk ? n : a->chunk;
        c = xmalloc(sizeof *c + size);
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->total += n;
    return p;
}

char *arena_strndup(struct arena *a, const char *s, size_t n)
{
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

size_t arena_used(const struct arena *a)
{
    return a->total;
}

void arena_reset(struct arena *a)
{
    struct chunk *c = a->head;
    /* keep the newest chunk for reuse */
    if (!c)
        return;
    struct chunk *rest = c->next;
    while (rest) {
        struct chunk *n = rest->next;
        free(rest);
        rest = n;
    }
    c->next = NULL;
    c->used = 0;
    a->total = 0;
}

void arena_free(struct arena *a)
{
    if (!a)
        return;
    struct chunk *c = a->head;
    while (c) {
        struct chunk *n = c->next;
        free(c);
        c = n;
    }
    free(a);
}
