/*
 * table — a string-keyed hash table of borrowed pointers, for the mock
 * provider's indexes (charges by id, charges by order, idempotency keys).
 *
 * Chained buckets, doubling at load factor 1, so every operation is O(1)
 * expected.  Keys are copied; values are borrowed (the caller owns them and
 * frees them, e.g. through table_free's callback).  Not thread safe: the
 * mock holds its one state mutex around every call.
 */
#ifndef MOCKPAY_TABLE_H
#define MOCKPAY_TABLE_H

#include <stddef.h>

struct table;

/* A new empty table; never NULL.  Free with table_free. */
struct table *table_new(void);
/* The value stored under key, or NULL. */
void *table_get(const struct table *t, const char *key);
/* Stores val under key (a copy of key is kept), replacing and returning the
 * previous value (NULL when there was none).  val must not be NULL. */
void *table_put(struct table *t, const char *key, void *val);
/* Removes key and returns its value (NULL when absent). */
void *table_del(struct table *t, const char *key);
size_t table_count(const struct table *t);
/* Calls fn for every entry, in no particular order.  fn must not modify t. */
void table_each(const struct table *t, void (*fn)(void *ctx, const char *key, void *val),
                void *ctx);
/* Frees the table; when free_val is non-NULL it is called on every value.
 * NULL ok. */
void table_free(struct table *t, void (*free_val)(void *val));

#endif
