/*
 * table — see table.h.  FNV-1a hashing, chained buckets, power-of-two sizes.
 */
#include "table.h"
#include "base/mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    struct entry *next;
    uint64_t hash;
    void *val;
    char key[]; /* NUL-terminated copy */
};

struct table {
    struct entry **b;
    size_t nb; /* power of two */
    size_t n;
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

struct table *table_new(void)
{
    struct table *t = xcalloc(1, sizeof *t);
    t->nb = 64;
    t->b = xcalloc(t->nb, sizeof *t->b);
    return t;
}

static struct entry **find(const struct table *t, const char *key, uint64_t h)
{
    struct entry **pp = &t->b[h & (t->nb - 1)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->hash == h && strcmp((*pp)->key, key) == 0)
            return pp;
    return pp;
}

static void grow(struct table *t)
{
    size_t nb = t->nb * 2;
    struct entry **b = xcalloc(nb, sizeof *b);
    for (size_t i = 0; i < t->nb; i++) {
        struct entry *e = t->b[i];
        while (e) {
            struct entry *next = e->next;
            e->next = b[e->hash & (nb - 1)];
            b[e->hash & (nb - 1)] = e;
            e = next;
        }
    }
    free(t->b);
    t->b = b;
    t->nb = nb;
}

void *table_get(const struct table *t, const char *key)
{
    struct entry **pp = find(t, key, hash_str(key));
    return *pp ? (*pp)->val : NULL;
}

void *table_put(struct table *t, const char *key, void *val)
{
    uint64_t h = hash_str(key);
    struct entry **pp = find(t, key, h);
    if (*pp) {
        void *old = (*pp)->val;
        (*pp)->val = val;
        return old;
    }
    size_t kl = strlen(key);
    struct entry *e = xmalloc(sizeof *e + kl + 1);
    memcpy(e->key, key, kl + 1);
    e->hash = h;
    e->val = val;
    e->next = NULL;
    *pp = e;
    if (++t->n > t->nb)
        grow(t);
    return NULL;
}

void *table_del(struct table *t, const char *key)
{
    struct entry **pp = find(t, key, hash_str(key));
    struct entry *e = *pp;
    if (!e)
        return NULL;
    void *val = e->val;
    *pp = e->next;
    free(e);
    t->n--;
    return val;
}

size_t table_count(const struct table *t)
{
    return t->n;
}

void table_each(const struct table *t, void (*fn)(void *ctx, const char *key, void *val), void *ctx)
{
    for (size_t i = 0; i < t->nb; i++)
        for (struct entry *e = t->b[i]; e; e = e->next)
            fn(ctx, e->key, e->val);
}

void table_free(struct table *t, void (*free_val)(void *val))
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nb; i++) {
        struct entry *e = t->b[i];
        while (e) {
            struct entry *next = e->next;
            if (free_val)
                free_val(e->val);
            free(e);
            e = next;
        }
    }
    free(t->b);
    free(t);
}
