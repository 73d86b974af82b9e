/*
 * idset — see idset.h.  k = 4 probes by double hashing (Kirsch–Mitzenmacher)
 * from a 64-bit FNV-1a of the key and a splitmix64 finalizer of it; the bit
 * array is a power of two, so a probe is a mask.
 */
#include "store/idset.h"

#include "base/mem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <stdint.h>

#define PROBES 4

struct idset {
    _Atomic uint64_t *w;
    uint64_t mask; /* bits - 1 */
};

struct idset *idset_new(size_t expected)
{
    uint64_t bits = 1ull << 23; /* 1 MiB */
    while (bits < (uint64_t)expected * 16 && bits < (1ull << 36))
        bits <<= 1;
    struct idset *s = xcalloc(1, sizeof *s);
    s->w = xcalloc(bits / 64, sizeof *s->w);
    s->mask = bits - 1;
    return s;
}

static void hashes(const char *key, uint64_t *h1, uint64_t *h2)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    uint64_t z = h + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    *h1 = h;
    *h2 = (z ^ (z >> 31)) | 1;
}

void idset_add(struct idset *s, const char *key)
{
    uint64_t h1, h2;
    hashes(key, &h1, &h2);
    for (int i = 0; i < PROBES; i++) {
        uint64_t b = (h1 + (uint64_t)i * h2) & s->mask;
        atomic_fetch_or_explicit(&s->w[b >> 6], 1ull << (b & 63), memory_order_relaxed);
    }
}

int idset_maybe(const struct idset *s, const char *key)
{
    uint64_t h1, h2;
    hashes(key, &h1, &h2);
    for (int i = 0; i < PROBES; i++) {
        uint64_t b = (h1 + (uint64_t)i * h2) & s->mask;
        if (!(atomic_load_explicit(&s->w[b >> 6], memory_order_relaxed) & (1ull << (b & 63))))
            return 0;
    }
    return 1;
}

void idset_free(struct idset *s)
{
    if (!s)
        return;
    free((void *)s->w);
    free(s);
}
