/*
 * engine — the idempotency engine's front door: triggers (layer 1), workflow
 * and secret management, and (with later issues) the worker pool.
 *
 * Owns a cache of compiled workflow versions (immutable, so the cache never
 * goes stale) and the secrets key.  Borrows the store, which must outlive
 * it.  Every function is thread safe.
 */
#ifndef IFL_ENGINE_ENGINE_H
#define IFL_ENGINE_ENGINE_H

#include <jansson.h>
#include <stdatomic.h>

#include "base/err.h"
#include "crypto/crypto.h"
#include "store/store.h"

struct engine;
struct wf;

struct engine_opts {
    /* 32-byte secrets key; required. */
    uint8_t secrets_key[CRYPTO_KEY_LEN];
    /* With a database other processes write too (PostgreSQL): how long a
     * workflow's latest version and a workspace's secrets, once read, are
     * trusted before they are read again (0: never, every use reads;
     * `serve --shared-cache-ms`, default 1000).  A PUT through this process
     * takes effect here at once either way.  SQLite: unused (this process
     * is the database's only writer, so what it read stays true). */
    int64_t shared_cache_ms;
    /* Compiled workflow versions are kept in memory while their
     * definitions' text adds up to at most this many bytes (0: the
     * default, ENGINE_WF_CACHE_DEFAULT; `serve --workflow-cache-kb`).
     * Past it, the versions used least recently that are not their
     * workflow's latest are dropped, and compiled again from the store when
     * next needed.  A workflow's latest version always stays. */
    size_t workflow_cache_bytes;
};
#define ENGINE_WF_CACHE_DEFAULT ((size_t)4 << 20)

/* Counters exposed on /metrics. */
#define ENGINE_GW_NCLASSES 7
#define ENGINE_GW_NBUCKETS 12

struct engine_metrics {
    atomic_ullong steps_claimed, steps_completed, steps_failed, steps_recovered;
    atomic_ullong steps_claimed_early; /* … of the claimed: GATEWAYs claimed at trigger time */
    /* workers' claim queries, by whether they took steps */
    atomic_ullong claims_found, claims_empty;
    atomic_ullong fenced_writes, executions_completed, executions_failed;
    atomic_ullong steps_inlined; /* TRANSFORMs completed with their predecessor (also completed) */
    atomic_ullong ordering_stale, ordering_gaps; /* events dropped / admitted past a gap (§8) */
    /* schedule ticks: fired here, found fired by another process (or before
     * a restart), found superseded by a newer workflow version, skipped as
     * missed; the scheduler's listings, and the schedules it last found */
    atomic_ullong schedule_fired, schedule_taken, schedule_superseded, schedule_missed;
    atomic_ullong schedule_scans, schedule_entries;
    /* outgoing webhooks: attempts that delivered, will be retried, were
     * dead-lettered, or were fenced (their lease was taken over) */
    atomic_ullong hooks_delivered, hooks_retried, hooks_dead, hooks_fenced;
    /* retention: executions purged (kept as tombstones or deleted),
     * tombstones deleted after their dedup window, events deleted */
    atomic_ullong purged_executions, expired_tombstones, expired_events, retention_sweeps;
    atomic_ullong executions_reconcile; /* finished as requires_reconciliation */
    atomic_ullong executions_cancelled; /* cancelled by an operator */
    /* GATEWAY responses by request (0 the call, 1 its verify request) and
     * class (engine_gw_classes), and their durations: counts per bucket
     * (not cumulative; upper bounds engine_gw_buckets_ms, the last one
     * +Inf; their sum is the count) and the sum in ms. */
    atomic_ullong gw_responses[2][ENGINE_GW_NCLASSES];
    atomic_ullong gw_duration_bucket[ENGINE_GW_NBUCKETS];
    atomic_ullong gw_duration_sum_ms;
    atomic_ullong gw_deferred; /* calls put off: their destination had its share in flight */
    /* compiled workflow versions in memory, their definitions' bytes, and
     * those dropped past the budget (engine_opts.workflow_cache_bytes) */
    atomic_ullong wf_compiled, wf_compiled_bytes, wf_evicted;
};
/* The class names of engine_metrics.gw_responses, in index order. */
extern const char *const engine_gw_classes[ENGINE_GW_NCLASSES];
/* The duration buckets' upper bounds in ms (the last one +Inf is not
 * listed). */
extern const long engine_gw_buckets_ms[ENGINE_GW_NBUCKETS - 1];
/* GATEWAY calls rendered and not yet ended: on the wire (a call or its
 * verify request), or about to be. */
int engine_gw_inflight(struct engine *g);

/* *out owned by the caller (engine_free).  Borrows s. */
int engine_new(struct store *s, const struct engine_opts *o, struct engine **out,
               struct ifl_err *e);
void engine_free(struct engine *g);
struct store *engine_store(struct engine *g);

/* Validates, compiles and stores a new version.  def is borrowed. */
int engine_workflow_put(struct engine *g, const char *ws, const char *wf, json_t *def, int *version,
                        struct ifl_err *e);
/* The same, unless the latest version's definition equals def (key order
 * and spacing aside): then nothing is stored, *version is the latest's and
 * *stored 0.  Decided in the store's transaction, so processes that put
 * one definition at once store one version (`serve --load`). */
int engine_workflow_put_changed(struct engine *g, const char *ws, const char *wf, json_t *def,
                                int *version, int *stored, struct ifl_err *e);
/* Compiled workflow (version 0 = latest).  *out is a reference the caller
 * holds until wf_release (the cache may drop the version meanwhile: the
 * reference keeps it alive); nothing is held on error.  A holder that
 * hands it to another with a life of its own gives that one a wf_hold of
 * its own (workflow.h). */
int engine_workflow_get(struct engine *g, const char *ws, const char *wf, int version,
                        const struct wf **out, int *version_out, struct ifl_err *e);

/* The most secrets a workspace holds (engine_secret_put refuses a new name
 * past it, IFL_EVALIDATION): every GATEWAY answer is scrubbed of them all. */
#define ENGINE_SECRETS_MAX 256

/* Seals and stores a secret value; the plaintext is never stored. */
int engine_secret_put(struct engine *g, const char *ws, const char *name, const char *value,
                      struct ifl_err *e);
/* Decrypts a secret; *value must be wiped and freed by the caller with
 * engine_secret_release. */
int engine_secret_get(struct engine *g, const char *ws, const char *name, char **value,
                      struct ifl_err *e);
void engine_secret_release(char *value);
/* Every secret of a workspace, decrypted in one read: *names (sorted) and
 * *values, n each; a value that does not decrypt with this key is NULL.
 * After the secrets come the values PUTs replaced (the newest
 * STORE_SECRETS_RETIRED: store_secret_put), each named "" — no template
 * can name one, so they are only ever scrubbed, never sent.  Through a
 * cache (engine_opts.shared_cache_ms).  Free with engine_secrets_release. */
int engine_secrets_all(struct engine *g, const char *ws, char ***names, char ***values, size_t *n,
                       struct ifl_err *e);
void engine_secrets_release(char **names, char **values, size_t n);

struct trigger_req {
    const char *ws, *wf, *vertex;
    json_t *payload;        /* borrowed; never NULL (null for an empty body) */
    const char *client_key; /* ?clientIdempotencyId or Idempotency-Key; NULL if none */
    int key_in_header;      /* client_key came from the Idempotency-Key header */
    int test;               /* a test run */
    int force_new;          /* random identity (test runs only) */
    /* For an entry point that verifies signed webhooks (spec §8): the raw
     * body and the request's headers (header(header_ctx, name), case-
     * insensitive, NULL when absent; borrowed for the call). */
    const char *body;
    size_t body_len;
    const char *(*header)(const void *header_ctx, const char *name);
    const void *header_ctx;
    /* The caller showed no valid bearer token: only an entry point with a
     * signature may take the request, and every other answer is 401. */
    int unauthenticated;
    /* > 0: a fire of the entry point's schedule for this instant (Unix ms;
     * the engine's scheduler), in workflow version tick_version: a random
     * id, no signature or ordering, and IFL_ECONFLICT when the tick was
     * fired already (slug "tick-fired") or a newer version was put before
     * it ("tick-superseded"). */
    int64_t tick_at;
    int tick_version;
    /* payload is body parsed by json_parse under limits no looser than its
     * defaults: when the engine's text of the payload is the body itself,
     * payload is what reading that text back gives, and is not parsed
     * again for the trigger's early calls. */
    int payload_is_body;
};

struct trigger_res {
    char id[65];
    int created;      /* 1 → 201, 0 → 200 deduplicated (or stale) */
    int stale;        /* recorded as stale: older than its ordering key's last (200) */
    int same_payload; /* meaningful when !created */
    char status[32];
};

/* A trigger resolves the identity and creates the execution with one atomic
 * insert.  Errors: IFL_ENOTFOUND (workspace/workflow/entry point),
 * IFL_EVALIDATION (missing idempotency field), IFL_EKEYREUSED (client key,
 * other payload), IFL_EINVAL (bad client key), IFL_EUNAUTH (a signature
 * that does not verify, or an unauthenticated caller), IFL_EBUSY (the
 * entry point's signing secret is missing or unusable).  An entry point
 * with a signature verifies it before anything else and, for Standard
 * Webhooks, takes the webhook-id as the identity (mode "webhook").
 *
 * It runs in parts, so that the caller can drop its own reference to the
 * request's JSON (trigger_req.payload) before the commit: the GATEWAY calls
 * the transaction claims hold references to parts of it, and a reference
 * dropped later on the caller's thread races with the worker that handles a
 * call's response (jansson's reference counts are not fences).
 *   engine_trigger_begin: everything up to the creating transaction.  Non-zero
 *     is an error as above; 0 with *op NULL is an answer already in *out (a
 *     repeat); 0 with *op set (and out->id the execution's id) hands the
 *     caller an operation it must pass to
 *   engine_trigger_commit, which queues its transaction (engine_can_defer
 *     must be 1) and calls cb(arg) once, when it is durable or failed — on the
 *     store's writer thread, so cb must be quick and must not block;
 *   engine_trigger_end (any thread, after cb): starts the GATEWAY calls the
 *     transaction claimed, fills *out or *e, and frees op;
 * or, for a caller that waits for the commit (a thread per connection),
 *   engine_trigger_run: runs op's transaction on the calling thread, then
 *     as engine_trigger_end. */
struct engine_trigger_op;
typedef void (*engine_trigger_cb)(void *arg);
int engine_trigger_begin(struct engine *g, const struct trigger_req *r, struct trigger_res *out,
                         struct engine_trigger_op **op, struct ifl_err *e);
void engine_trigger_commit(struct engine_trigger_op *op, engine_trigger_cb cb, void *arg);
int engine_trigger_end(struct engine_trigger_op *op, struct trigger_res *out, struct ifl_err *e);
int engine_trigger_run(struct engine_trigger_op *op, struct trigger_res *out, struct ifl_err *e);
/* 1 when engine_trigger_commit can queue (the store can submit). */
int engine_can_defer(const struct engine *g);

/* ---- waiting for an execution to finish (waiters.c) ------------------------
 * For `Prefer: wait=N` on a trigger.  Add a waiter before the execution can
 * finish (before its trigger commits), so no finish is missed; arm it once
 * the caller is ready to be called.  Thread safe. */
struct engine_waiter;
typedef void (*engine_waiter_fn)(void *arg);
/* A waiter for execution xid of workspace ws; the caller owns it
 * (engine_waiter_remove).  Cannot fail. */
struct engine_waiter *engine_waiter_add(struct engine *g, const char *ws, const char *xid);
/* Returns 1 when the wait is over already (the execution left `running`,
 * the deadline — clock_mono_ms() — passed, or the engine is closing): fn
 * will not be called.  Otherwise 0, and fn(arg) is called exactly once, on
 * some engine thread, when the execution leaves `running` (seen in this
 * process, or read within about a second when another process finished it),
 * when the deadline passes, or at engine_waiters_close.  fn must be quick and
 * must not call back into the registry. */
int engine_waiter_arm(struct engine *g, struct engine_waiter *w, int64_t deadline_ms,
                      engine_waiter_fn fn, void *arg);
/* 1 with the status the execution moved to copied into status, or 0 (still
 * running, as far as known). */
int engine_waiter_status(struct engine *g, const struct engine_waiter *w, char status[32]);
/* Unregisters and frees w; after fn was called, or when arm returned 1, or
 * before arming.  NULL ok. */
void engine_waiter_remove(struct engine *g, struct engine_waiter *w);
/* Fires every armed waiter now and stops the timer (shutdown: the HTTP
 * front can then answer everyone).  Later arms return 1. */
void engine_waiters_close(struct engine *g);

/* ---- the runner: workers and the lease sweeper (runner.c) ---------------- */

struct engine_run_opts {
    int workers;      /* worker threads; default 4 (more batches in each group commit) */
    int64_t lease_ms; /* step lease; default 15000 */
    /* How long the API's Idempotency-Key records are kept (spec §7);
     * default 24 h.  Read by the operator actions even before engine_start. */
    int64_t key_retention_ms;
    /* Retention (spec §4): finished executions, events and deliveries older
     * than this are purged (0: never, the default); a purged execution's
     * id deduplicates until its entry point's dedupWindow has passed. */
    int64_t retention_ms;
    int batch; /* steps claimed per round trip; default 16 */
    /* GATEWAY calls in flight in this process (default GW_MAX_CALLS), and
     * to one destination (scheme, host and port) of them (default seven
     * eighths of max_calls: the rest is kept for the other destinations): a call past its
     * destination's share waits DISPATCHED (`deferred`, no attempt spent) so that a destination
     * that hangs cannot take every slot (docs/gateway.md, "Concurrency"). */
    int max_calls, max_calls_per_destination;
    int no_inline; /* 1: every TRANSFORM waits for a claim (see engine_inline_plan) */
    /* Where crashed processes left their crash markers (base/crashmark.h;
     * the caller ran crashmark_init on it), or NULL: without it no crash is
     * told from a kill, so no step is ever failed for crashing. */
    const char *crash_dir;
};

/* Recovers steps left EXECUTING (SQLite: all at once, the lock proves their
 * owner is dead; PostgreSQL: as their leases expire) and starts the workers
 * and the sweeper. */
int engine_start(struct engine *g, const struct engine_run_opts *o, struct ifl_err *e);
/* Stops claiming, lets in-flight steps finish, joins the threads. */
void engine_stop(struct engine *g);
/* Wakes idle workers: call after committing work. Cheap. */
void engine_wake(struct engine *g);
/* After the test clock moved (serve --test-clock): wakes the workers, and
 * the scheduler from its nap, so a tick that fell due fires now rather than
 * at its next real-time pass (the sweeper and the webhook thread keep
 * their own pace). */
void engine_clock_advanced(struct engine *g);
const struct engine_metrics *engine_metrics(const struct engine *g);

/* ---- operator actions ------------------------------------------------------ */

/* An operator action's Idempotency-Key (spec §7).  The key record is
 * written in the action's own transaction: a repeat with the same
 * fingerprint replays the first answer, and changes nothing; another
 * fingerprint under the key is IFL_EKEYREUSED.  Only an answer that
 * changed something is kept: an action refused with an error leaves no
 * record, so the key may be sent again.  Records live for
 * engine_run_opts.key_retention_ms. */
struct engine_op_key {
    const char *key;         /* NULL: none given (the action runs unkeyed) */
    const char *fingerprint; /* hex SHA-256 of the request (method, path, body) */
    int replayed;            /* out: the answer is the first one's */
    int status;              /* out: its HTTP status, when replayed */
};

/* IFL_EGONE (slug execution-purged) when x was purged by retention (spec
 * §4: only its identity is left), else 0. */
int engine_gone(const struct store_execution *x, struct ifl_err *e);

/* FAILED and REQUIRES_RECONCILIATION steps back to DISPATCHED with a new
 * epoch.  *answer (new reference) = {"executionId", "retriedSteps",
 * "status"}, or the replayed one.  k may be NULL.  send_again: the
 * operator asks to re-send calls whose effect nothing can settle
 * (steps_retry; without it such a step is 409 step-outcome-unknown). */
int engine_retry(struct engine *g, const char *ws, const char *id, int send_again,
                 struct engine_op_key *k, json_t **answer, struct ifl_err *e);
/* Resolves one FAILED / REQUIRES_RECONCILIATION step: outcome "completed"
 * (with output, borrowed, may be NULL = null) or "failed".  *answer (new
 * reference) = {"executionId", "vertex", "status"}, or the replayed one.
 * k may be NULL. */
int engine_resolve(struct engine *g, const char *ws, const char *id, const char *vertex,
                   int completed, json_t *output, struct engine_op_key *k, json_t **answer,
                   struct ifl_err *e);
/* Cancels an unfinished execution (steps_cancel in steps.h says what it
 * does and when it refuses).  reason: NULL or text for the steps' error and
 * the event (borrowed).  *answer (new reference) = {"executionId",
 * "cancelledSteps", "status"}, or the replayed one.  k may be NULL. */
int engine_cancel(struct engine *g, const char *ws, const char *id, const char *reason,
                  struct engine_op_key *k, json_t **answer, struct ifl_err *e);
/* A new execution with a random id and startedOverFrom = id, made once per
 * Idempotency-Key: a repeat returns the same new id (*replayed = 1). */
int engine_start_over(struct engine *g, const char *ws, const char *id, const char *key,
                      char new_id[65], int *replayed, struct ifl_err *e);

/* The dead letters of ws (deadletters.c; spec §5): FAILED and
 * REQUIRES_RECONCILIATION steps ({"kind":"step","executionId","vertex",
 * "state","attempts","error","updatedAt"}) and dead webhook deliveries
 * ({"kind":"delivery","subscription","eventId","type","executionId",
 * "state","attempts","lastStatus","error","updatedAt"}), newest first:
 * *out = {"items": [...], "next": cursor or null} (new reference).  after:
 * NULL, or the `next` of a previous page (IFL_EINVAL otherwise). */
int engine_dead_letters(struct engine *g, const char *ws, const char *after, int limit,
                        json_t **out, struct ifl_err *e);

/* ---- outgoing webhooks (hooks.c; spec §7 subscriptions) -------------------------
 * Views are {"name","url","events","secret":"****","timeoutMs","retry",
 * "createdAt","updatedAt","deliveries":{pending,sending,delivered,dead}};
 * *out is a new reference.  Validation errors are IFL_EVALIDATION with a
 * pointer into the body. */
int engine_subscription_put(struct engine *g, const char *ws, const char *name, json_t *body,
                            int *created, json_t **out, struct ifl_err *e);
int engine_subscription_get(struct engine *g, const char *ws, const char *name, json_t **out,
                            struct ifl_err *e);
/* {"items": [views]} */
int engine_subscription_list(struct engine *g, const char *ws, json_t **out, struct ifl_err *e);
int engine_subscription_delete(struct engine *g, const char *ws, const char *name,
                               struct ifl_err *e);
/* {"items": [deliveries], "next": cursor or null}; state NULL for all. */
int engine_deliveries_list(struct engine *g, const char *ws, const char *name, const char *state,
                           int64_t after, int limit, json_t **out, struct ifl_err *e);
/* Sends an event to the subscription again (its delivery back to pending
 * with a fresh budget); *answer = the delivery, or the replayed answer
 * (k->status then holds its status; otherwise 202). */
int engine_redeliver(struct engine *g, const char *ws, const char *name, const char *event_id,
                     struct engine_op_key *k, json_t **answer, struct ifl_err *e);

/* ---- workspace tokens (tokens.c; spec §10) --------------------------------------- */
/* A new token for ws: *answer = {"id","workspace","name","createdAt","token"}
 * (new reference; the token is shown here only, and again on a replay of
 * the same Idempotency-Key).  name may be NULL. */
int engine_token_create(struct engine *g, const char *ws, const char *name, struct engine_op_key *k,
                        json_t **answer, struct ifl_err *e);
/* 0 when token is a live token of ws, -1 otherwise (malformed, another
 * workspace's, revoked, or made under another secrets key). */
int engine_token_check(struct engine *g, const char *ws, const char *token);
/* {"items":[{"id","workspace","name","createdAt"}]}, oldest first. */
int engine_token_list(struct engine *g, const char *ws, json_t **out, struct ifl_err *e);
/* Revokes it at once; IFL_ENOTFOUND. */
int engine_token_delete(struct engine *g, const char *ws, const char *id, struct ifl_err *e);

#endif
