/*
 * idset — a Bloom filter over strings: "maybe present" or "certainly not".
 *
 * The SQLite backend keeps one over its execution ids: every id the database
 * holds was either there at open (added by a scan) or inserted by this
 * process's writer (added before its commit), so "certainly not" proves an
 * execution does not exist and a trigger for a new id skips its pre-read.
 * A false "maybe" (1 in several hundred at the sizing below, more once the
 * set outgrows it) only costs that read.
 *
 * Threads: idset_add and idset_maybe may run concurrently from any threads
 * (relaxed atomic bit operations; a reader may miss an add still in
 * progress, which callers must tolerate: the SQLite writer adds before the
 * insert commits, and an id not yet visible falls back to the write path,
 * which finds it).
 */
#ifndef IFL_STORE_IDSET_H
#define IFL_STORE_IDSET_H

#include <stddef.h>

struct idset;

/* Sized for `expected` keys (at least 1 MiB of bits, 16 bits per key).
 * Owned by the caller (idset_free). Never NULL. */
struct idset *idset_new(size_t expected);
void idset_add(struct idset *s, const char *key);
/* 0: key was certainly never added; 1: it may have been. */
int idset_maybe(const struct idset *s, const char *key);
/* NULL ok. */
void idset_free(struct idset *s);

#endif
