/*
 * mockpay — the mock payment provider's state and routes: charges with
 * Stripe-style Idempotency-Key semantics, a read endpoint for verify flows,
 * statistics, and run-time fault injection (faults.h).
 *
 * Invariants:
 *  - One mutex guards all state; it is never held while sleeping (latency
 *    faults) or while writing logs, so an in-flight request with a key is
 *    visible to others as "in flight" (409) for exactly as long as it runs.
 *  - A charge is committed before any after-commit fault acts on its
 *    response, and an idempotency key records the committed (201) response,
 *    so a retry with the same key and body replays the charge.
 *  - Memory is bounded: at most max_charges charges (then 507), bodies
 *    capped at 64 KiB by the listener, keys of at most 255 bytes.
 *  - Never logs or stores the Authorization header.
 */
#ifndef MOCKPAY_MOCKPAY_H
#define MOCKPAY_MOCKPAY_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "http/http.h"
#include "listener.h"

#define MOCKPAY_MAX_BODY (64u * 1024u)
#define MOCKPAY_DEFAULT_MAX_CHARGES 1000000u

struct mockpay_opts {
    uint64_t seed;      /* PRNG seed for faults and charge ids                  */
    const char *faults; /* start-up fault spec (compact or JSON); NULL = none.
                           Copied: POST /reset restores this set.              */
    size_t max_charges; /* 0 = MOCKPAY_DEFAULT_MAX_CHARGES                      */
    int quiet;          /* 1: no per-request log lines                          */
};

struct mockpay;

/* Validates the options (the fault spec above all) and builds the state.
 * *out is owned by the caller (mockpay_free).  0 or IFL_EINVAL with e->msg. */
int mockpay_new(const struct mockpay_opts *o, struct mockpay **out, struct ifl_err *e);

/* The request handler (a listener_fn; ctx is the struct mockpay).  Thread
 * safe; blocks for injected latency. */
enum listener_action mockpay_handle(void *ctx, const struct http_req *req, struct http_res *res);
/* Counts a new client connection (a listener_conn_fn; ctx is the struct
 * mockpay), reported by GET /stats as "connections". */
void mockpay_connected(void *ctx);

/* Makes injected latency end at once (for a prompt graceful exit); requests
 * still complete.  Async-signal unsafe; call from the main thread. */
void mockpay_shutdown(struct mockpay *m);

/* Frees everything.  No request may be running.  NULL ok. */
void mockpay_free(struct mockpay *m);

#endif
