/*
 * faults — the mock provider's fault set: parsing (JSON or the compact CLI
 * syntax documented in docs/mockpay.md), deterministic evaluation, and its
 * JSON rendering for GET /faults.
 *
 * Invariants: evaluation draws from one seeded PRNG stream per fault
 * (splitmix64; never rand()), and only for requests that reach that fault's
 * probability test, so the same seed and the same request sequence always
 * fire the same faults.  Not thread safe: the caller holds its state lock.
 */
#ifndef MOCKPAY_FAULTS_H
#define MOCKPAY_FAULTS_H

#include <jansson.h>
#include <stdint.h>

#include "base/err.h"

enum fault_kind {
    FAULT_DROP_AFTER_COMMIT,
    FAULT_STATUS,
    FAULT_LATENCY,
    FAULT_IGNORE_IDEMPOTENCY,
    FAULT_NKINDS
};

/* Which endpoints a fault applies to (a bit set). */
enum fault_route {
    FAULT_ON_CHARGE = 1, /* POST /v1/charges            */
    FAULT_ON_VERIFY = 2, /* GET /v1/charges[/{id}]      */
    FAULT_ON_ANY = 3,
};

/* What the faults decided for one request. */
struct fault_hit {
    unsigned kinds;         /* bit (1 << enum fault_kind) per kind that fired   */
    int64_t delay_ms;       /* latency before processing                        */
    int64_t delay_after_ms; /* latency after processing, before the response    */
    int ignore_keys;        /* treat the Idempotency-Key as absent              */
    int outcome;            /* -1 none, FAULT_DROP_AFTER_COMMIT or FAULT_STATUS */
    int code;               /* FAULT_STATUS: the status to answer               */
    int after_commit;       /* FAULT_STATUS: answer it after processing         */
    int64_t retry_after;    /* seconds, -1 when no Retry-After header           */
    int retry_after_date;   /* 1: send Retry-After as an HTTP-date              */
    int outcome_fault;      /* the index of the outcome fault that fired, or -1 */
};

struct faults;

/* Static name of a kind ("drop_after_commit"). Cannot fail. */
const char *faults_kind_name(enum fault_kind k);

/* Parses a fault set from text: a JSON array of fault objects, a JSON object
 * {"seed": N, "faults": [...]}, or the compact syntax
 * ("drop_after_commit:count=1;status=429:retry_after=1").  An empty text is
 * an empty set.  *seed is the PRNG seed to use; a JSON "seed" member
 * replaces it.  On success *out is owned by the caller (faults_free).
 * Returns 0 or IFL_EINVAL with e->msg (and e->pointer) naming the problem. */
int faults_parse(const char *text, size_t len, uint64_t *seed, struct faults **out,
                 struct ifl_err *e);

/* Evaluates every fault against one request (route, and the order id in its
 * text form or NULL) in list order, updating the faults' counters and PRNG
 * streams, and fills *hit.  At most one outcome fault (drop or status) fires
 * per request; once one has, later outcome faults are not evaluated.
 * Cannot fail. */
void faults_eval(struct faults *f, enum fault_route route, const char *order,
                 struct fault_hit *hit);

/* Takes back the outcome fault of *hit (drop, status): it did not apply —
 * the request charged nothing to drop or to answer after — so it is not
 * counted as fired and its `count` is not used up; *hit keeps its other
 * kinds.  Its `seen` stays, and so do the PRNG draws: the same request
 * sequence still gives the same faults.  Cannot fail. */
void faults_unfire_outcome(struct faults *f, struct fault_hit *hit);

/* {"seed": N, "faults": [{…spec…, "seen": n, "fired": n}, …]}; new reference. */
json_t *faults_to_json(const struct faults *f);

/* NULL ok. */
void faults_free(struct faults *f);

#endif
