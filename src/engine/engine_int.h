/*
 * engine_int.h — the engine's state, shared by engine.c (triggers, cache,
 * secrets) and runner.c (workers, sweeper).  Private to src/engine.
 */
#ifndef IFL_ENGINE_ENGINE_INT_H
#define IFL_ENGINE_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/steps.h"
#include "engine/workflow.h"
#include "gateway/gateway.h"

#define CACHE_BUCKETS 256

/* A compiled workflow version (engine_workflow_get).  The cache holds one
 * reference to w; every caller of engine_workflow_get another. */
struct cached {
    char *ws, *wf;
    int version;
    struct wf *w;
    size_t bytes;       /* its definition's text: what the budget counts */
    atomic_ullong used; /* g->wf_clock when last found (least recently used go first) */
    struct cached *next;
};

/* The latest version of a workflow, as last read or written here. */
struct latest {
    char *ws, *wf;
    int version;
    int64_t checked_ms; /* clock_mono_ms() of the read */
    struct latest *next;
};

struct engine {
    struct store *store;
    struct latest *latest[CACHE_BUCKETS];
    /* How long a read "latest version" or a workspace's secrets are
     * trusted: INT64_MAX where this process is the database's only writer
     * (SQLite), else engine_opts.shared_cache_ms (0: never) */
    int64_t shared_ttl_ms;
    uint8_t key[CRYPTO_KEY_LEN];
    pthread_rwlock_t lock;
    struct cached *buckets[CACHE_BUCKETS];
    /* the compiled versions: how many, their definitions' bytes (under
     * lock), the budget past which the least recently used ones that are
     * not their workflow's latest are dropped (engine_opts), and the clock
     * of their uses */
    size_t wf_n, wf_bytes, wf_bytes_max;
    atomic_ullong wf_clock;

    /* runner (runner.c) */
    struct engine_run_opts run;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;     /* workers: work may be there (engine_wake) */
    pthread_cond_t scv;     /* the sweeper: only engine_stop signals it */
    unsigned long wake_seq; /* every wake-up */
    unsigned long work_seq; /* … of them, those that may have made steps claimable */
    int stopping;
    int calls_done; /* stopping, and the calls in flight have ended: the
                       sweeper stops renewing their leases (under wmu) */
    int started;
    pthread_t *workers;
    pthread_t sweeper;
    pthread_t scheduler; /* fires schedules (scheduler.c); naps on ncv */
    pthread_cond_t ncv;  /* the scheduler's naps: engine_stop, a test-clock move */
    int sched_woken;     /* the test clock moved since the scheduler's last nap (wmu) */
    int has_scheduler;
    atomic_int sched_dirty; /* a workflow was put here: rescan the schedules now */
    pthread_t hooks;        /* outgoing webhooks (hooks.c); waits on scv */
    int has_hooks;
    atomic_int hooks_dirty; /* a subscription was put or deleted here: list them now */
    pthread_t listener;     /* turns store_wait_work wake-ups into engine_wake */
    int has_listener;
    int trace_fd; /* IDEMFLOW_TRACE_FILE side channel, or -1 */
    char worker_prefix[96];

    struct engine_metrics m;
    struct engine_waiters *waiters; /* Prefer: wait (waiters.c) */

    /* GATEWAY calls (gwstep.c) */
    struct gw_client *gw;
    pthread_mutex_t gmu;
    struct gw_job *gw_done;     /* finished calls waiting for a worker */
    struct gw_job *gw_inflight; /* calls on the wire (their leases are renewed) */
    struct gw_dest *gw_dests;   /* shares per destination, from render to end (gmu) */
    int gw_calls_n;             /* calls holding shares: rendered, or on the wire */

    /* A workspace's sealed secrets, as engine_secrets_all read them (every
     * GATEWAY claim asks), under scmu.  A secret PUT through this process
     * (engine_secret_put) bumps sc_gen and drops the entry; a read that
     * raced it (sc_gen moved) is not kept.  Where this process is the
     * database's one writer (SQLite) every PUT passes there, so an entry
     * stays true; with a shared database (PostgreSQL) another process may
     * PUT, so an entry is trusted for shared_ttl_ms from its read to
     * render calls — a claim whose template names a secret its entry lacks,
     * or holds unreadable, reads again (engine_secrets_fresh) — while what
     * scrubs read past it (engine_secrets_now: a call's answer is scrubbed
     * of the secrets it was rendered with and of those read as it came).
     * An entry replaces only an older one of its workspace, and expired
     * ones go when another is kept.  Values stay sealed. */
    pthread_mutex_t scmu;
    uint64_t sc_gen;
    struct sealed_cache *sc;

    /* Operator actions whose Idempotency-Key is in flight in this process
     * (engine_op_key_enter), under kmu. */
    pthread_mutex_t kmu;
    struct engine_key_inflight *keys_inflight;
};

/* engine_secrets_all read from the database now, past the cache, when
 * what the cache holds may lag a PUT by another process: 0 (then as
 * engine_secrets_all), -1 when that read failed, 1 (nothing filled) when
 * the cache cannot lag (SQLite). */
int engine_secrets_fresh(struct engine *g, const char *ws, char ***names, char ***values, size_t *n,
                         struct ifl_err *e);
/* The workspace's secrets as the database holds them now, for a scrub:
 * engine_secrets_fresh where the cache may lag, else through it.  0, or -1
 * when they cannot be read (release what was filled either way). */
int engine_secrets_now(struct engine *g, const char *ws, char ***names, char ***values, size_t *n);

struct gw_job;
#define GW_MAX_CALLS 256 /* engine_run_opts.max_calls's default */
/* How long a stop waits for GATEWAY calls in flight (and webhook
 * deliveries) before it ends them (gw_client_free): a destination that
 * never answers, or a workflow's hour-long timeoutMs, must not hold a
 * SIGTERM for longer than the operator's stop. */
#define GW_STOP_GRACE_MS 10000
#define HOOKS_STOP_GRACE_MS 2000

/* Wakes the workers to commit finished calls only: nothing became
 * claimable, so a worker that found nothing to claim does not ask again
 * (engine_wake is the one for dispatched work). */
void engine_wake_drain(struct engine *g);
/* The error JSON text (owned) of a step whose vertex is `broken` in its
 * stored workflow version (wf_compile_stored): workflow_invalid. */
char *engine_broken_error(const struct wf_vertex *v);
/* The scheduler thread (scheduler.c): fires the schedules of the latest
 * workflow versions, each tick once across processes (spec §9).  Exits
 * once g->stopping is set (under wmu; engine_stop signals ncv). */
void *engine_scheduler_main(void *arg);
/* The scheduler's nap: ms, or until engine_stop or a test-clock move
 * (engine_clock_advanced); 1 once stopping. */
int engine_sched_nap(struct engine *g, int64_t ms);
/* Waits ms (0: not at all) or until engine_stop; 1 once stopping. */
int engine_nap(struct engine *g, int64_t ms);
/* The outgoing-webhook thread (hooks.c): fans the feed out to the
 * subscriptions and delivers what is due (spec §7).  Exits once
 * g->stopping is set (after the batch it is sending). */
void *engine_hooks_main(void *arg);
/* How long Idempotency-Key records of operator actions live (engine.c). */
int64_t engine_key_retention(const struct engine *g);
/* The Idempotency-Key of an operator action (engine.c, spec §7), for the
 * action's own transaction: claim it first — on a repeat k->replayed = 1
 * and *replay (owned) = the first answer, and the caller changes nothing —
 * then store the answer with engine_op_key_answer.  Without a key both do
 * nothing. */
int engine_op_key_claim(struct engine *g, struct store_tx *tx, const char *ws, const char *scope,
                        struct engine_op_key *k, char **replay, struct ifl_err *e);
int engine_op_key_answer(struct store_tx *tx, const char *ws, const char *scope,
                         const struct engine_op_key *k, int status, const char *answer,
                         struct ifl_err *e);
/* An operator action's key while the action runs: spec §7 answers a repeat
 * sent meanwhile with 409.  engine_op_key_enter registers n (the caller's,
 * kept until engine_op_key_leave) and returns 0, or IFL_ECONFLICT (slug
 * idempotency-key-in-flight) when the same (ws, scope, key) is in flight
 * here already.  Without a key (key NULL) both do nothing.  Across
 * PostgreSQL processes the store's claim of the key answers the same
 * (store_tx_idem_put). */
struct engine_key_inflight {
    struct engine_key_inflight *next;
    const char *ws, *scope, *key;
};
int engine_op_key_enter(struct engine *g, struct engine_key_inflight *n, const char *ws,
                        const char *scope, const char *key, struct ifl_err *e);
void engine_op_key_leave(struct engine *g, struct engine_key_inflight *n);
/* A stored answer as JSON (*answer new reference). */
int engine_replay_answer(const char *text, json_t **answer, struct ifl_err *e);

/* Starts a claimed GATEWAY step's call in two halves: prepare renders the
 * request (NULL with *err_text, heap JSON, when it cannot be), launch sends
 * it.  A step claimed by the transaction that creates its execution is
 * prepared before that commit and launched after it; one a worker claimed,
 * once the batch's `rendering` notes are cleared (runner.c).  On success
 * prepare takes *rows (*rows = NULL, *n = 0: they plan the inline
 * completions of its successors; on failure they stay the caller's) and a
 * reference of its own to ctx.  The call adds to ctx (the response, the
 * edges' view) on whichever worker drains it, so the caller drops its own
 * reference before the launch: one dropped later, on another thread, races
 * with those writes.  The job is then launched (it owns itself) or
 * discarded. */
/* A note on a running attempt (store_tx_attempt_note): `rendering` or
 * `responded`, or NULL to clear it.  runner.c, MAX_EVAL_CRASHES. */
struct attempt_note {
    const char *execution_id, *vertex;
    int64_t epoch;
    const char *note;
};
/* Formats what a crash while evaluating an attempt records (crashmark):
 * "XID VERTEX EPOCH PHASE"; phase is rendering, responded or running. */
void engine_crash_mark(char *buf, size_t cap, const char *xid, const char *vertex, int64_t epoch,
                       const char *phase);
/* Parses such a line in place (line is modified; the fields point into it):
 * 0, or -1 for a torn or foreign line — not four space-separated fields, an
 * id that is not 64 characters, an epoch that is not a number >= 1, or
 * another phase. */
struct engine_crash {
    const char *xid, *vertex, *phase;
    int64_t epoch;
};
int engine_crash_parse(char *line, struct engine_crash *out);
/* Writes notes[0..n) in one group commit.  A note that fails is logged; it
 * only weakens the crash-loop guard. */
void engine_note_attempts(struct engine *g, const struct attempt_note *notes, size_t n);
/* The same; failed[i] (n of them) says whether notes[i] was not written. */
void engine_note_attempts_checked(struct engine *g, const struct attempt_note *notes, size_t n,
                                  int *failed);

/* Renders a claimed GATEWAY step's call.  NULL when it is not to be sent:
 * with *again_at set, nothing is wrong with it — its destination has its
 * share of the calls in flight, or the store could not be read — and its
 * claim is to be taken back as if it had never been (step_outcome's
 * unclaim: no attempt left, the error as it was), to run at *again_at;
 * otherwise *err_text is the step's error (it fails). */
struct gw_job *engine_gw_prepare(struct engine *g, const struct store_claim *c, const struct wf *w,
                                 long vi, json_t *ctx, struct store_step **rows, size_t *n,
                                 char **err_text, int64_t *again_at);
/* Makes sure a prepared call may leave: claimed_at is when its step was
 * claimed; past half the lease the lease is renewed first.  Returns 1 when
 * it may (it leaves only while the lease is held: gw_request.send_by);
 * 0 when the lease was taken over or could not be renewed — the call is
 * dropped unsent (j freed). */
int engine_gw_hold(struct gw_job *j, int64_t claimed_at);
/* Sends a held call (ownership passes to the engine). */
void engine_gw_send(struct gw_job *j);
/* engine_gw_hold, then engine_gw_send. */
void engine_gw_launch(struct gw_job *j, int64_t claimed_at);
void engine_gw_discard(struct gw_job *j);
/* Commits the outcomes of finished calls; returns how many. */
size_t engine_gw_drain(struct engine *g);
/* Extends the leases of every call in flight. */
void engine_gw_renew_leases(struct engine *g);
/* When this process owns its database (SQLite) and holds the call of step
 * (id, vertex) at `epoch` — in flight, or answered and waiting for its
 * outcome's commit — extends its lease even if it lapsed (fenced by the
 * epoch), as engine_gw_renew_leases does, and returns 1 if that took;
 * else 0. */
int engine_gw_keep(struct engine *g, const char *id, const char *vertex, int64_t epoch);
/* The wait before the verify of a call that may still be in the provider's
 * hands: at least `after` (verify.afterMs from now, or more: a recovery's)
 * and `base` (the backoff, Retry-After), but when only the default afterMs
 * of p (timeoutMs, a guess) would cross the deadline (`left` ms away), a
 * little before it — a verify at the deadline's edge settles more than a
 * step failed unverified.  gwstep.c (retries) and runner.c (recoveries). */
int64_t engine_gw_verify_wait(const struct gw_policy *p, int64_t after, int64_t base, int64_t left);
/* The retry budget of a GATEWAY step from its execution's attempt history
 * (a, n): its attempts since the last operator retry (`attempts` when it
 * has none) and when the first of them started (now, when none did) —
 * what maxAttempts and deadlineMs count from. */
void engine_gw_budget(const struct store_attempt *a, size_t n, const char *vertex, int attempts,
                      int *made, int64_t *first);

/* ---- inline TRANSFORM completion (inline.c) ------------------------------------
 * The worker that completes a step evaluates the TRANSFORMs that completion
 * dispatches (and theirs, up to INLINE_MAX) and commits them COMPLETED in the
 * same transaction, saving each a claim and an outcome transaction.
 * steps_apply applies them only while every row of the execution is as the
 * worker read it; otherwise they stay DISPATCHED for a worker to claim. */
#define INLINE_MAX 16
/* The time a trigger's inline work (its TRANSFORMs and their conditions,
 * the render of a call it claims) may take on the HTTP thread, in all: past
 * it that work is left to a worker (expr_deadline_set). */
#define ENGINE_INLINE_MS 10
struct inline_item {
    long vi;
    char *output;
    struct decision *dec;
    size_t nd;
    int64_t epoch; /* the epoch it gets when applied */
};
struct inline_plan {
    struct inline_item it[INLINE_MAX];
    struct step_inline items[INLINE_MAX];
    size_t n;
    enum step_state *seen_state;
    int64_t *seen_epoch;
    size_t n_seen;
};
/* Plans the inline completions that completing vertex vi with decisions dec
 * would make, given the execution's rows as read.  ctx is the completed
 * step's context ({payload, steps with vi's output, execution}); it is
 * modified.  An empty plan (p->n = 0) when there is nothing to inline — and
 * always when vi is on its second attempt or later (`attempts` > 1): had an
 * inline evaluation stopped the process, the step that ran it would be
 * blamed for every lease expiry, so its successors then go through claims,
 * where each is recovered (and, crashing every time, failed) on its own.
 * The plan's evaluations get ENGINE_INLINE_MS in all (expr_deadline_set,
 * reset when it returns: not for a caller under a deadline of its own);
 * what does not fit is left to a claim. */
void engine_inline_plan(struct engine *g, const char *ws, const struct wf *w, long vi, int attempts,
                        const struct decision *dec, json_t *ctx, const struct store_step *rows,
                        size_t n, const struct gw_request *scrub, struct inline_plan *p);
/* Points o at the plan (which must outlive the transaction); traces each
 * planned step as "inline" (IDEMFLOW_TRACE_FILE). */
void engine_inline_attach(struct engine *g, const struct inline_plan *p, struct step_outcome *o,
                          const char *worker);
/* After the commit: metrics and trace lines for what was applied. */
void engine_inline_done(struct engine *g, const struct inline_plan *p,
                        const struct step_outcome *o);
void engine_inline_clear(struct inline_plan *p);

/* Evaluates TRANSFORM vi's output over ctx: 0 with *out (new reference, may
 * be NULL = null) and *out_text (heap JSON), or -1 with *err_text (heap
 * error JSON).  The output is scrubbed of every value `scrub` holds — the
 * call it follows in this process: the secrets its request was rendered
 * with and those read as its answer came (engine_gw_drain), so a value
 * rotated meanwhile, by this or another process, is masked either way —
 * or, with scrub NULL, of the workspace's secrets read now. */
/* Error texts scrubbed of the workspace's secrets.  An expression may
 * rebuild a secret from an answer the byte scrub let through (a
 * destination that echoed it base64-encoded, or split in two fields) and
 * put it in an error: `$error(...)` in a TRANSFORM or an edge condition, a
 * request's url or header, a call's stored request (found by a judge: the
 * plain value in the step's error, its events and the dead letters).  So
 * every such text is scrubbed as a TRANSFORM's output is: each string of
 * the JSON text gets "****" for every secret value `list` holds (a
 * request's scrub list, gw_request_scrub_also).  engine_text_scrub
 * replaces *text (NULL: nothing). */
void engine_text_scrub(const struct gw_request *list, char **text);
/* When the secrets cannot be read to scrub *text (a JSON error): keeps its
 * code and machine members, drops its `message` (a note says why) and its
 * `request`.  NULL: nothing. */
void engine_text_redact(char **text);
/* Reads the workspace's secrets into list's scrub list (list zeroed
 * first; gw_request_clear frees it); 0, or -1 when they cannot be read. */
int engine_scrub_list(struct engine *g, const char *ws, struct gw_request *list);
/* What an outcome stores that an evaluation wrote: *err, each decision's
 * error, and the inline plan's (p may be NULL).  With list NULL the
 * secrets are read, only when there is a text; when they cannot be, each
 * text is redacted (engine_text_redact). */
void engine_errors_scrub(struct engine *g, const char *ws, const struct gw_request *list,
                         char **err, struct decision *d, size_t nd, struct inline_plan *p);
int engine_transform_eval(struct engine *g, const char *ws, const struct wf *w, long vi,
                          json_t *ctx, const struct gw_request *scrub, json_t **out,
                          char **out_text, char **err_text);
/* Sets steps.<vi> and response to out in ctx and evaluates vi's outgoing
 * edge conditions: a heap array, one per edge (engine_decisions_free). */
struct decision *engine_decide_edges(const struct wf *w, long vi, json_t *ctx, json_t *out);
void engine_decisions_free(struct decision *d, size_t n);

/* Counts an execution that reached a terminal status (metrics). */
void engine_count_status(struct engine *g, const char *status);
/* After a commit moved execution xid to status: counts it (as
 * engine_count_status) and wakes whoever waits for it (waiters.c). */
void engine_execution_moved(struct engine *g, const char *xid, const char *status);

/* The registry of engine_waiter (waiters.c); freed after engine_waiters_close. */
struct engine_waiters;
struct engine_waiters *engine_waiters_new(void);
void engine_waiters_free(struct engine_waiters *r);

/* JSONata's $boolean casting of a result (NULL = undefined = false). */
int engine_truthy(json_t *v);

/* Evaluates an edge condition against ctx (borrowed) into *d. */
void engine_decide(const struct expr *cond, json_t *ctx, struct decision *d);
/* The expression context {payload, steps, execution} (new reference). */
json_t *engine_context(const struct store_execution *x, const struct store_step *rows, size_t n);
/* Appends "WHAT XID VERTEX EPOCH" to the trace file, if any (docs/faults.md). */
void engine_trace(struct engine *g, const char *what, const char *xid, const char *vertex,
                  int64_t epoch);

#endif
