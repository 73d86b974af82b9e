/*
 * store — durable state behind one table of operations.
 *
 * Callers see only `struct store` (opaque) and the store_* functions below;
 * backends (store_sqlite.c now, store_pg.c later) fill a `struct store_ops`
 * in store_int.h.  Every operation is atomic on its own; an operation that
 * returns 0 has committed durably (for SQLite: WAL + synchronous=FULL, so a
 * 201 survives power loss).
 *
 * Invariants the backends must keep:
 *  - Execution creation is ONE atomic insert on a unique key (never
 *    read-then-write): two concurrent creates of one id yield one row; the
 *    loser learns it lost and reads the winner.
 *  - Workflow versions are immutable; a put makes version max+1 atomically.
 *  - Nothing crosses workspaces: every key includes the workspace.
 *
 * Thread safety: every function may be called from any thread concurrently.
 * Strings returned in structs are heap copies owned by the struct; release
 * with the matching *_clear / *_free function.
 */
#ifndef IFL_STORE_STORE_H
#define IFL_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

struct store;

/* Opens the store named by url: "sqlite:PATH" (or a bare path), or
 * PostgreSQL: "postgres://…", "postgresql://…" or a libpq key=value
 * conninfo naming dbname= or host= (docs/postgres.md).  Applies pending
 * schema migrations; IFL_EINVAL, before migrating anything, when the
 * database holds migrations newer than this engine knows (a newer
 * engine's).  On success *out is owned by
 * the caller (store_close). */
int store_open(const char *url, struct store **out, struct ifl_err *e);
/* 1 when url names the embedded SQLite store (a path or "sqlite:PATH"). */
int store_url_is_sqlite(const char *url);
void store_close(struct store *s); /* NULL ok */
/* "sqlite" / "postgres". */
const char *store_backend(const struct store *s);
/* The --db value as it may be logged (caller frees): a SQLite path as is;
 * a PostgreSQL URL or conninfo as libpq parses it, keyword=value, with
 * password and sslpassword (and every option libpq marks secret) as ****. */
char *store_url_shown(const char *url);
/* Current schema version (after migrations). */
int store_schema_version(struct store *s, int *version, struct ifl_err *e);
/* Cheap liveness probe used by /readyz. */
int store_ping(struct store *s, struct ifl_err *e);
/* Blocks until another commit may have made work claimable, or until
 * timeout_ms passes.  Backends shared by several processes (PostgreSQL:
 * LISTEN/NOTIFY, sent by every commit that inserts or dispatches a DISPATCHED
 * step, this process's own included) implement it; the others return
 * IFL_EUNSUPPORTED at once (SQLite has one process: its engine wakes its
 * workers itself).  Returns 1 when woken — by a notification that arrived
 * since the previous call consumed one, or after the listening connection
 * was re-established (notifications may have been lost: re-check) — and 0
 * on timeout.  On a database failure it keeps retrying until the timeout
 * and then returns IFL_ESTORE, so a loop around it never spins.  Several
 * threads may wait at once (one of them listens; all wake); the intended
 * use is one thread that turns wake-ups into the engine's own wake. */
int store_wait_work(struct store *s, int64_t timeout_ms);

/* ---- workspaces --------------------------------------------------------- */
/* *created = 1 when the workspace is new, 0 when it existed (settings kept). */
int store_workspace_put(struct store *s, const char *ws, const char *settings_json, int *created,
                        struct ifl_err *e);
/* 0 when it exists, IFL_ENOTFOUND otherwise. */
int store_workspace_exists(struct store *s, const char *ws, struct ifl_err *e);

/* ---- workflows ---------------------------------------------------------- */
struct store_workflow {
    char *workspace, *name;
    int version;
    char *definition; /* JSON text as accepted */
    int64_t created_at;
};
void store_workflow_clear(struct store_workflow *w);
/* Inserts version max+1 (1 for the first) and reports it. The workspace
 * must exist (IFL_ENOTFOUND otherwise). */
int store_workflow_put(struct store *s, const char *ws, const char *wf, const char *definition,
                       int *version, struct ifl_err *e);
/* As store_workflow_put, unless `same` says the latest version's definition
 * (its text, borrowed for the call) is this one (nonzero): then nothing is
 * stored and *version is the latest's.  *stored says which.  Decided in the
 * put's own transaction, holding the workspace's row lock (PostgreSQL) or
 * on the single writer (SQLite), so processes that put one definition at
 * once store it once.  `same` may run more than once (a retried
 * transaction). */
int store_workflow_put_changed(struct store *s, const char *ws, const char *wf,
                               const char *definition, int (*same)(const char *latest, void *arg),
                               void *arg, int *version, int *stored, struct ifl_err *e);
/* version 0 = latest. IFL_ENOTFOUND when absent. */
int store_workflow_get(struct store *s, const char *ws, const char *wf, int version,
                       struct store_workflow *out, struct ifl_err *e);

/* ---- secrets (values arrive already encrypted; the store never sees
 *      plaintext) ------------------------------------------------------ */
/* `sealed` is the ciphertext in text form (see crypto_seal).  The value
 * it replaces, if any, is kept among the workspace's retired values (in
 * the same transaction; the newest STORE_SECRETS_RETIRED of them stay)
 * unless it is `sealed` itself (a repeat after an unknown commit) or
 * `same` (NULL: none), a ciphertext the caller read and found to hold the
 * plaintext it puts. */
#define STORE_SECRETS_RETIRED 64
int store_secret_put(struct store *s, const char *ws, const char *name, const char *sealed,
                     const char *same, struct ifl_err *e);
/* *sealed is a heap string the caller frees. IFL_ENOTFOUND when absent. */
int store_secret_get(struct store *s, const char *ws, const char *name, char **sealed,
                     struct ifl_err *e);
/* *names is a heap array of heap strings, sorted; free with
 * store_strv_free(names, n). */
int store_secret_list(struct store *s, const char *ws, char ***names, size_t *n, struct ifl_err *e);
/* The same with every secret's sealed value in (*sealed)[i] (free both
 * with store_strv_free). */
int store_secret_all(struct store *s, const char *ws, char ***names, char ***sealed, size_t *n,
                     struct ifl_err *e);
/* The workspace's retired values, newest first: (*names)[i] is the name
 * the value (*sealed)[i] was sealed under (free both with store_strv_free).
 * For scrubs only: a retired value is never rendered. */
int store_secret_retired(struct store *s, const char *ws, char ***names, char ***sealed, size_t *n,
                         struct ifl_err *e);
void store_strv_free(char **v, size_t n);

/* ---- executions --------------------------------------------------------- */
struct store_execution {
    char id[65];
    char *workspace, *workflow, *entry_point;
    int workflow_version;
    char *identity; /* JSON object text: {"mode": …, …} */
    char *payload;  /* JSON text */
    char payload_hash[65];
    int test;
    char *status;    /* running | completed | failed | requires_reconciliation | stale |
                        cancelled (store_execution_status_valid), or purged */
    int64_t version; /* aggregate version, +1 per change */
    int64_t created_at, updated_at;
    char *started_over_from; /* NULL when none */
};
void store_execution_clear(struct store_execution *x);

/* Creates the execution described by *x (id, workspace, workflow,
 * workflow_version, entry_point, identity, payload, payload_hash, test,
 * started_over_from; status/version/timestamps are set by the store) with
 * one atomic insert.  *created = 1 when this call created it; 0 when the id
 * already existed, in which case *existing (if non-NULL) is filled with the
 * stored row (caller clears it). */
int store_execution_create(struct store *s, const struct store_execution *x, int *created,
                           struct store_execution *existing, struct ifl_err *e);
/* IFL_ENOTFOUND when absent. */
int store_execution_get(struct store *s, const char *ws, const char *id,
                        struct store_execution *out, struct ifl_err *e);
/* The trigger's read for a repeat: as store_execution_get, except that
 * IFL_ENOTFOUND may also mean "not looked up" where the store judges the id
 * new without a read (PostgreSQL: an id this process has neither inserted
 * nor found).  The caller's unique insert settles such an id either way. */
int store_execution_probe(struct store *s, const char *ws, const char *id,
                          struct store_execution *out, struct ifl_err *e);

/* A page of executions, newest first.  `after` is the opaque cursor from a
 * previous page (NULL for the first).  *items is a heap array the caller
 * frees with store_execution_list_free; *next is a heap cursor or NULL at
 * the end.  IFL_EINVAL for a malformed cursor. */
int store_execution_list(struct store *s, const char *ws, const char *after, int limit,
                         struct store_execution **items, size_t *n, char **next, struct ifl_err *e);
/* 1 when s is a status an execution that is listed can have (running,
 * completed, failed, requires_reconciliation, stale, cancelled). */
int store_execution_status_valid(const char *s);
/* Which executions a list holds (borrowed strings; NULL matches every one). */
struct store_exec_filter {
    const char *status;   /* a store_execution_status_valid status */
    const char *workflow; /* a workflow name */
};
/* store_execution_list of only the executions f matches (f may be NULL).
 * The cursor is a position in the newest-first order, so a page's `next`
 * goes on with the same filter. */
int store_execution_list_where(struct store *s, const char *ws, const struct store_exec_filter *f,
                               const char *after, int limit, struct store_execution **items,
                               size_t *n, char **next, struct ifl_err *e);
void store_execution_list_free(struct store_execution *items, size_t n);

/* ---- steps (layer 2) -------------------------------------------------------
 * One row per (execution, vertex).  States and their meaning: spec §5.
 * Every transition out of EXECUTING is guarded by state AND epoch, so a
 * worker that lost its lease changes nothing. */
enum step_state {
    STEP_PENDING,
    STEP_DISPATCHED,
    STEP_EXECUTING,
    STEP_COMPLETED,
    STEP_SKIPPED,
    STEP_FAILED,
    STEP_REQUIRES_RECONCILIATION,
};
const char *store_step_state_name(enum step_state st);
/* -1 for an unknown name. */
int store_step_state_parse(const char *name);

struct store_step {
    char execution_id[65];
    char *vertex;
    char *workspace;
    char *kind; /* vertex type: ENTRY_POINT | TRANSFORM | GATEWAY */
    enum step_state state;
    int attempts;
    int64_t epoch;
    char *lease_owner; /* NULL unless EXECUTING */
    int64_t lease_expires_at;
    int64_t next_run_at;
    int in_decided; /* incoming edges decided so far */
    int in_taken;   /* … of which taken */
    char *output;   /* JSON text or NULL */
    char *error;    /* JSON text {"code","message"} or NULL */
    int64_t updated_at;
};
void store_step_clear(struct store_step *st);
void store_steps_free(struct store_step *v, size_t n);

/* One attempt of a step: written at claim, finished at the outcome. */
struct store_attempt {
    char execution_id[65];
    char *vertex;
    int64_t epoch;
    char *worker;
    int64_t started_at, finished_at; /* finished_at 0 while running */
    char *outcome;                   /* NULL while running */
    char *error;                     /* JSON text or NULL */
};
void store_attempts_free(struct store_attempt *v, size_t n);

/* An event of the transactional outbox. */
struct store_event {
    int64_t seq; /* set by reads; an append may leave it 0 (PostgreSQL defers the insert) */
    char id[65];
    char *workspace;
    char execution_id[65];
    int64_t aggregate_version;
    char *type;
    char *data; /* JSON text */
    int64_t created_at;
    char cursor[48]; /* its feed position, opaque (store_events_list's `after`) */
    /* On append: 1 when the caller already set the execution's version to
     * aggregate_version in this transaction (an execution inserted with
     * version 1 and its execution.created event), so the backend must not
     * bump it again. */
    int version_preset;
};
void store_events_free(struct store_event *v, size_t n);

/* Steps of one execution, in vertex-name order (reads a committed snapshot). */
int store_steps_get(struct store *s, const char *execution_id, struct store_step **items, size_t *n,
                    struct ifl_err *e);
/* The execution and its steps (vertex-name order) read from ONE snapshot:
 * what a worker needs to run a claimed step.  IFL_ENOTFOUND when absent;
 * on success the caller clears *x and frees *items. */
int store_execution_load(struct store *s, const char *ws, const char *id, struct store_execution *x,
                         struct store_step **items, size_t *n, struct ifl_err *e);
/* Attempt history of one execution: by vertex, then epoch — each step's
 * attempts in the order they were made (an operator retry's row, written
 * with the retry's own clock reading, sorts before the claim that follows
 * it even when the claimant read the clock earlier). */
int store_attempts_get(struct store *s, const char *execution_id, struct store_attempt **items,
                       size_t *n, struct ifl_err *e);

/* A claimed step, handed to a worker. */
struct store_claim {
    char execution_id[65];
    char *vertex, *workspace, *kind;
    int64_t epoch;
    int attempts;
};
void store_claims_free(struct store_claim *v, size_t n);

/* Atomically moves up to `limit` DISPATCHED steps whose next_run_at <= now
 * to EXECUTING (one winner per step), increments each epoch and attempts,
 * sets the lease (owner `worker`, expiry now+lease_ms) and records an
 * attempt row — all in one transaction.  Never hands one step to two
 * claimants.  *items is a heap array (store_claims_free), NULL when
 * nothing was claimed.
 *
 * Workspaces take turns: the workspaces with DISPATCHED steps are walked
 * in name order from the one after the last a claim of this store handle
 * looked at (wrapping), until `limit` of them have due steps or
 * STORE_CLAIM_WALK were looked at, and the claim takes the oldest due step
 * of each in that order, then the second of each, and so on — so one
 * workspace's backlog delays another's step by at most a turn, not by the
 * backlog.  Within a workspace, oldest due first.  Each look is one index
 * seek (steps_due_ws gives a workspace's earliest step first: due or not
 * is read from it), so workspaces whose steps all wait (a backoff) cost a
 * seek each.  limit is capped at STORE_CLAIM_MAX. */
#define STORE_CLAIM_MAX 64
#define STORE_CLAIM_WALK 256
int store_claim(struct store *s, const char *worker, int limit, int64_t now, int64_t lease_ms,
                struct store_claim **items, size_t *n, struct ifl_err *e);
/* The same; a GATEWAY step claimed for its second attempt or later, or
 * claimed before without an attempt (its epoch ahead of its attempts: a
 * deferred call's claim taken back, an operator's action), gets an attempt
 * row whose outcome is already retry_note (a note on the running attempt,
 * as store_tx_attempt_note writes) in the claim's own transaction. */
#define STORE_CLAIM_NOTED(c) ((c)->attempts > 1 || (c)->epoch > (c)->attempts)
/* *more: 1 when the walk stopped at STORE_CLAIM_WALK looks with
 * workspaces left to look at — what is due there is claimable at once by
 * a claim that walks on (many workspaces' steps waiting out a backoff
 * must not make a worker nap between every 256 of them). */
int store_claim_noted(struct store *s, const char *worker, int limit, int64_t now, int64_t lease_ms,
                      const char *retry_note, struct store_claim **items, size_t *n, int *more,
                      struct ifl_err *e);
/* Extends a lease to `until`; *ok = 0 when the step is no longer ours
 * (fenced) or its lease had already run out at `now`: a lapsed lease is not
 * revived, since another process may be recovering the step (it listed it
 * as expired) while this one would go on and send its call.  (now = 0
 * revives one: only for a database this process owns alone.) */
int store_lease_renew(struct store *s, const char *execution_id, const char *vertex, int64_t epoch,
                      int64_t now, int64_t until, int *ok, struct ifl_err *e);
/* Steps left EXECUTING whose lease expired before `now` (all EXECUTING
 * steps when now < 0), up to limit. */
int store_expired(struct store *s, int64_t now, int limit, struct store_step **items, size_t *n,
                  struct ifl_err *e);
/* Earliest next_run_at among DISPATCHED steps, or INT64_MAX when none. */
int store_next_due(struct store *s, int64_t *when, struct ifl_err *e);
/* Where a page of dead letters ended: its last step's (updated_at,
 * execution, vertex), the order they are listed in. */
struct store_dead_cursor {
    int64_t at;
    char execution_id[65];
    char vertex[129];
};
/* FAILED and REQUIRES_RECONCILIATION steps of a workspace, newest first
 * (ties by execution id, then vertex, descending), leaving out those of
 * cancelled executions (nothing an operator can do clears them); after:
 * NULL for the first page, else only those listed after it. */
int store_dead_letters(struct store *s, const char *ws, const struct store_dead_cursor *after,
                       int limit, struct store_step **items, size_t *n, struct ifl_err *e);
/* The event feed of a workspace after the position `after` (an event's
 * `cursor`; NULL = from the start), in an order no later commit can insert
 * into: an event never appears before a cursor already handed out (SQLite:
 * seq order, which is commit order; PostgreSQL: (transaction id, seq) order
 * of transactions older than every one still running — docs/postgres.md).
 * IFL_EINVAL for a malformed cursor. */
int store_events_list(struct store *s, const char *ws, const char *after, int limit,
                      struct store_event **items, size_t *n, struct ifl_err *e);
/* A cursor at the feed's end now: store_events_list after it lists every
 * event committed from now on (on PostgreSQL also a few committed just
 * before).  store/subs.c. */
int store_events_head(struct store *s, char cursor[48], struct ifl_err *e);

/* ---- transactions ----------------------------------------------------------
 * Engine logic that must commit atomically (a step outcome with its
 * successors, the execution status and events) runs as a function over a
 * transaction handle.  The function may run more than once (a backend may
 * retry it after a serialization failure), so it must derive everything from
 * what it reads through the handle and reset its outputs at entry.
 * Returning non-zero rolls the transaction back. */
struct store_tx;
typedef int (*store_tx_fn)(struct store_tx *tx, void *arg, struct ifl_err *e);
int store_tx_run(struct store *s, store_tx_fn fn, void *arg, struct ifl_err *e);
/* Runs fn once per args[i] as n independent transactions (each commits or
 * rolls back alone; rcs[i] and errs[i], which may be NULL, receive each
 * result) and returns when all are durable.  Backends may commit them
 * together (SQLite: one batch, one fsync). */
void store_tx_run_many(struct store *s, store_tx_fn fn, void **args, size_t n, int *rcs,
                       struct ifl_err *errs);
/* store_tx_run_many with the transactions run in the byte order of
 * key(args[i]) (the execution id each one locks; ties keep their order), so
 * that two batches that commit together (PostgreSQL: one transaction) take
 * their row locks in one order and cannot deadlock.  rcs and errs stay in
 * args' order. */
typedef const char *(*store_tx_key_fn)(const void *arg);
void store_tx_run_many_ordered(struct store *s, store_tx_fn fn, void **args, store_tx_key_fn key,
                               size_t n, int *rcs, struct ifl_err *errs);

/* Called once when a submitted transaction is durable (rc 0) or rolled back
 * (rc and *e say why), on the store's writer thread: it must be quick, must
 * not block and must not call the store. */
typedef void (*store_done_fn)(void *done_arg, int rc, const struct ifl_err *e);
/* 1 when the backend can run a transaction without a waiting caller
 * (SQLite: its writer thread), 0 otherwise (PostgreSQL). */
int store_can_submit(const struct store *s);
/* Queues fn(tx, arg) as one transaction and returns at once; done(done_arg,
 * …) follows as for store_done_fn.  arg must stay valid until then.  0, or
 * IFL_EBUSY when the store is closing / IFL_EUNSUPPORTED without
 * store_can_submit (done is then never called). */
int store_tx_submit(struct store *s, store_tx_fn fn, void *arg, store_done_fn done, void *done_arg);

int store_tx_execution_get(struct store_tx *tx, const char *ws, const char *id,
                           struct store_execution *out, struct ifl_err *e);
/* Creates the execution (ON CONFLICT DO NOTHING); *created as for
 * store_execution_create. */
int store_tx_execution_insert(struct store_tx *tx, const struct store_execution *x, int *created,
                              struct ifl_err *e);
/* Sets status and bumps updated_at; with version > 0 also sets the
 * aggregate version (the caller appended events with version_preset up to
 * it in this transaction, having read the execution in it). */
int store_tx_execution_set_status(struct store_tx *tx, const char *id, const char *status,
                                  int64_t version, struct ifl_err *e);
/* The execution that execution id (of ws) was last started over as: with
 * new_id, records it (it becomes the last); without (NULL), only reads.
 * *was (caller frees; NULL when none) is the one recorded before.  On
 * PostgreSQL it locks the execution's row. */
int store_tx_execution_started_over(struct store_tx *tx, const char *ws, const char *id,
                                    const char *new_id, char **was, struct ifl_err *e);
int store_tx_steps_get(struct store_tx *tx, const char *execution_id, struct store_step **items,
                       size_t *n, struct ifl_err *e);
/* store_tx_execution_get (which locks the row), then store_tx_steps_get, in
 * one round trip where the backend can.  Of the execution only id,
 * workspace, status and version are certain to be filled (what moving its
 * steps needs; SQLite reads no more, PostgreSQL reads the whole row).  On
 * failure nothing is left to free. */
int store_tx_execution_load(struct store_tx *tx, const char *ws, const char *id,
                            struct store_execution *x, struct store_step **items, size_t *n,
                            struct ifl_err *e);
int store_tx_step_insert(struct store_tx *tx, const struct store_step *st, struct ifl_err *e);
/* store_tx_step_insert for rows[0..n), in as few statements as the backend
 * can (SQLite: four rows a statement). */
int store_tx_steps_insert(struct store_tx *tx, const struct store_step *rows, size_t n,
                          struct ifl_err *e);
/* Writes every mutable column of *st for its (execution, vertex) only when
 * the row's state is `expect_state` and (expect_epoch < 0 or) its epoch is
 * `expect_epoch`.  *changed = 0 when the guard failed (nothing written). */
int store_tx_step_update(struct store_tx *tx, const struct store_step *st,
                         enum step_state expect_state, int64_t expect_epoch, int *changed,
                         struct ifl_err *e);
/* Finishes the attempt row of (execution, vertex, epoch). */
int store_tx_attempt_finish(struct store_tx *tx, const char *execution_id, const char *vertex,
                            int64_t epoch, const char *outcome, const char *error,
                            struct ifl_err *e);
/* Deletes the attempt row of (execution, vertex, epoch) while it is still
 * running: a claim taken back before anything was tried (a GATEWAY call
 * deferred: its destination had its share of the calls in flight). */
int store_tx_attempt_delete(struct store_tx *tx, const char *execution_id, const char *vertex,
                            int64_t epoch, struct ifl_err *e);
/* Notes `outcome` on the attempt of (execution, vertex, epoch) while it is
 * still running (finished_at stays NULL, store_tx_attempt_finish replaces
 * the note): what a recovery reads if the process dies before the outcome.
 * Changes nothing when the attempt already finished. */
int store_tx_attempt_note(struct store_tx *tx, const char *execution_id, const char *vertex,
                          int64_t epoch, const char *outcome, struct ifl_err *e);
/* Records an attempt that started and finished inside this transaction
 * (a TRANSFORM completed inline by the worker that completed its
 * predecessor): started_at = finished_at = now.  With outcome NULL, an
 * attempt that starts now and stays open (a step claimed by the
 * transaction that created it; store_tx_attempt_finish ends it). */
int store_tx_attempt_record(struct store_tx *tx, const char *execution_id, const char *vertex,
                            int64_t epoch, const char *worker, const char *outcome,
                            struct ifl_err *e);
/* Appends an event: increments the execution's version and stamps it as the
 * event's aggregate_version (written back into ev). ev->id is generated when
 * empty. */
int store_tx_event_append(struct store_tx *tx, struct store_event *ev, struct ifl_err *e);

/* Ordering of an entry point's events (spec §8): the last version applied
 * per key. */
struct store_ordering {
    const char *ws, *wf, *entry_point;
    const char *key; /* the key: hex SHA-256 of its value's JCS text (a bounded index key) */
    int64_t version;
};
/* Advances the key's version to o->version when it is newer than the last
 * one applied (or the key is new): *advanced = 1.  Otherwise *advanced = 0
 * and nothing changes.  *had_last and *last tell the version applied
 * before.  Inside the caller's transaction; on PostgreSQL the key's row
 * stays locked until it ends, so concurrent events of one key are decided
 * one after the other. */
int store_tx_ordering_advance(struct store_tx *tx, const struct store_ordering *o, int *advanced,
                              int *had_last, int64_t *last, struct ifl_err *e);
/* Undoes an advance of this transaction: the key back to `last`, or gone
 * when it had none (had_last 0).  For an event that turned out to be a
 * duplicate after its key was advanced. */
int store_tx_ordering_reset(struct store_tx *tx, const struct store_ordering *o, int had_last,
                            int64_t last, struct ifl_err *e);

/* Schedules (spec §9). */
struct store_tick {
    const char *ws, *wf, *entry_point;
    int64_t fire_at; /* the scheduled instant, Unix ms */
    const char *execution_id;
    int version; /* the workflow version whose schedule it is */
};
/* Records the tick as fired by execution_id unless it was already (*claimed
 * 0) or a newer version of the workflow was put at or before the tick
 * (*claimed 0, *superseded 1: that version's schedule decides).  Inside the
 * caller's transaction (the one that creates the execution); a concurrent
 * claim of the same tick on PostgreSQL waits for this transaction and then
 * finds it claimed.  On PostgreSQL it also waits for a workflow put of the
 * workspace in flight (and a later put waits for this transaction, then
 * takes a later time), so a tick never fires in two versions. */
int store_tx_tick_claim(struct store_tx *tx, const struct store_tick *t, int *claimed,
                        int *superseded, struct ifl_err *e);
/* Deletes at most `limit` ticks scheduled before `before` (ms); *n = how
 * many.  A transaction of its own. */
int store_ticks_expire(struct store *s, int64_t before, int limit, int *n, struct ifl_err *e);
/* The latest version of every workflow, without its definition
 * (workspace, name, version, created_at).  *items: free with
 * store_workflows_free. */
int store_workflows_latest(struct store *s, struct store_workflow **items, size_t *n,
                           struct ifl_err *e);
void store_workflows_free(struct store_workflow *items, size_t n);

/* Idempotency records of the engine's own API (spec §7). */
struct store_idem {
    char *fingerprint;
    int status;
    char *response;     /* JSON text */
    int64_t created_at; /* ms; read back from the store, and written by store_tx_idem_set */
};
void store_idem_clear(struct store_idem *r);
/* Inserts the record (created_at = now; r->created_at is not used) unless
 * (ws, scope, key) exists; *created tells which, and when it existed
 * *existing holds the stored one.  On PostgreSQL the key's
 * transaction-scoped advisory lock is taken first: when another session
 * holds it and no committed record exists (its claim is in flight), this
 * fails at once with store_key_in_flight's 409 rather than wait; with a
 * committed record it goes on (a replay, or a re-claim past retention
 * settled by store_tx_idem_set's compare-and-set).  A transaction run
 * again after a lost connection waits for the lock instead (the lost
 * session may still hold it). */
int store_tx_idem_put(struct store_tx *tx, const char *ws, const char *scope, const char *key,
                      const struct store_idem *r, int *created, struct store_idem *existing,
                      struct ifl_err *e);
/* The 409 of spec §7 for an Idempotency-Key whose first request is still
 * in flight (slug idempotency-key-in-flight); returns IFL_ECONFLICT. */
int store_key_in_flight(struct ifl_err *e);
/* *found = 1 when (ws, scope, key) has a committed record — an answered
 * request, or one past its retention — read outside any transaction (a
 * claim not yet committed is not seen). */
int store_idem_exists(struct store *s, const char *ws, const char *scope, const char *key,
                      int *found, struct ifl_err *e);
/* Overwrites the existing record (ws, scope, key) with all of *r, created_at
 * included: the answer of the operation that claimed the key, or a new
 * claim on a key past its retention.  With expect_created_at >= 0 only a
 * record still made at that time is overwritten (a compare-and-set: on
 * PostgreSQL a concurrent re-claim of the same expired record makes this
 * wait, then change nothing).  *changed tells whether a record was. */
int store_tx_idem_set(struct store_tx *tx, const char *ws, const char *scope, const char *key,
                      const struct store_idem *r, int64_t expect_created_at, int *changed,
                      struct ifl_err *e);
/* Deletes at most `limit` records created before `before` (ms), in one
 * transaction of its own; *n = how many. */
int store_idem_expire(struct store *s, int64_t before, int limit, int *n, struct ifl_err *e);

/* ---- outgoing webhooks (spec §7 subscriptions; store/subs.c) ----------------
 * A subscription fans the event feed out into delivery rows (one per event
 * it wants) as its cursor moves; deliveries are claimed with leases and
 * epochs like steps, one execution's in aggregate-version order. */
struct store_subscription {
    char *workspace, *name, *url;
    char *events;   /* JSON array text: the event types it wants */
    char *secret;   /* sealed (crypto_seal); never the plain value */
    char *settings; /* JSON object text: timeoutMs, retry */
    int64_t timeout_ms;
    char *cursor; /* feed position: events after it are not fanned out yet */
    int64_t created_at, updated_at;
};
void store_subscription_clear(struct store_subscription *x);
void store_subscriptions_free(struct store_subscription *v, size_t n);
/* Creates or updates (x->workspace, x->name) at `now`.  A new one starts at
 * the feed's current end (it gets the events committed afterwards) and
 * needs x->secret (else IFL_EVALIDATION, pointer /secret); an update with
 * x->secret NULL keeps the stored one, and keeps the cursor.  *created
 * tells which. */
int store_subscription_put(struct store *s, const struct store_subscription *x, int64_t now,
                           int *created, struct ifl_err *e);
/* IFL_ENOTFOUND when absent; on success the caller clears *out. */
int store_subscription_get(struct store *s, const char *ws, const char *name,
                           struct store_subscription *out, struct ifl_err *e);
/* By name; ws NULL: every workspace's. */
int store_subscription_list(struct store *s, const char *ws, struct store_subscription **items,
                            size_t *n, struct ifl_err *e);
/* Deletes it and its deliveries in one transaction; IFL_ENOTFOUND. */
int store_subscription_delete(struct store *s, const char *ws, const char *name, struct ifl_err *e);
/* How many of its deliveries are pending, sending, delivered, dead. */
int store_subscription_counts(struct store *s, const char *ws, const char *name, int64_t counts[4],
                              struct ifl_err *e);

struct store_delivery {
    int64_t seq;
    char *workspace, *subscription;
    char event_id[65], execution_id[65];
    int64_t event_seq, aggregate_version;
    char state[16]; /* pending | sending | delivered | dead */
    int attempts;
    int64_t epoch, next_at, created_at, updated_at;
    int last_status; /* the last attempt's HTTP status, 0 for none */
    char *last_error;
    /* the event (lists and claims) and the subscription (claims only) */
    char *type, *data, *url, *secret, *settings;
    int64_t event_created_at;
};
void store_delivery_clear(struct store_delivery *d);
void store_deliveries_free(struct store_delivery *v, size_t n);
/* The fan-out's rows for events ev[0..n) (rows zeroed by the caller; the
 * strings stay ev's). */
void store_delivery_rows_of(const struct store_event *ev, size_t n, struct store_delivery *rows);
/* Fan-out: moves the subscription's cursor from `from` to `to` and inserts
 * a pending delivery due at `now` for each of rows[0..n) (their event_seq,
 * event_id, execution_id, aggregate_version, type) that
 * wants(ctx, events, type) accepts — `events` being the subscription's
 * event types as they are in this transaction, not as a cached copy says
 * (another process may just have changed them) — in one transaction, and
 * only if the cursor still is `from` (*advanced = 1): a process that moved
 * it first did the same work. */
typedef int (*store_wants_fn)(void *ctx, const char *events, const char *type);
int store_subscription_advance(struct store *s, const char *ws, const char *name, const char *from,
                               const char *to, const struct store_delivery *rows, size_t n,
                               store_wants_fn wants, void *ctx, int64_t now, int *advanced,
                               struct ifl_err *e);
/* Claims up to `limit` deliveries: pending ones due at `now` and sending
 * ones whose lease ran out, each only while no earlier event (lower
 * aggregate version) of its execution is pending or sending for its
 * subscription.  Each becomes sending with epoch + 1 and attempts + 1,
 * leased until now + its subscription's timeout + 5 s; one taken over from
 * a lapsed lease gets last_error STORE_DLV_UNRECORDED.  The items carry the
 * event and the subscription as they are now.  skip_ws and skip_subs
 * (NULL: none) are JSON arrays of text: no delivery of a workspace in the
 * first, nor of a subscription "ws/name" in the second, is claimed. */
int store_deliveries_claim(struct store *s, int64_t now, int limit, const char *skip_ws,
                           const char *skip_subs, struct store_delivery **items, size_t *n,
                           struct ifl_err *e);
/* The end of a claimed attempt, guarded by its epoch (ok = 0: the lease
 * was taken over, nothing written). */
struct store_delivery_outcome {
    int64_t seq, epoch;
    const char *state; /* delivered | pending (again at next_at) | dead */
    int64_t next_at;
    int last_status;
    const char *last_error;
    int uncount; /* the attempt never left: it does not count */
    int ok;      /* out */
};
/* A delivery claim's lease: its subscription's timeout plus this much
 * (written as SQL text in store/subs.c; engine/hooks.c derives the send-by
 * and the answer's deadline from it). */
#define STORE_DLV_LEASE_SLACK_MS 5000
#define STORE_STR_(x) #x
#define STORE_STR(x) STORE_STR_(x)

/* The last_error a claim leaves on a delivery it takes over from a lapsed
 * `sending` lease: the attempt before ended with its process, unrecorded
 * (no quote or backslash: it is spliced into SQL). */
#define STORE_DLV_UNRECORDED                                                                       \
    "no answer recorded: the process ended while sending it, or its lease ran out"
int store_deliveries_finish(struct store *s, struct store_delivery_outcome *o, size_t n,
                            int64_t now, struct ifl_err *e);
/* When a delivery may next be claimable: the earliest next_at of a pending
 * one or lease of a sending one (INT64_MAX: none). */
int store_deliveries_next_due(struct store *s, int64_t *when, struct ifl_err *e);
/* Ends every sending delivery's lease (SQLite at start: the only process). */
int store_deliveries_release(struct store *s, struct ifl_err *e);
/* One subscription's deliveries with seq > after, oldest first; state NULL
 * for all. */
int store_deliveries_list(struct store *s, const char *ws, const char *name, const char *state,
                          int64_t after, int limit, struct store_delivery **items, size_t *n,
                          struct ifl_err *e);
/* Dead deliveries of ws (every subscription's), newest first: those
 * before (at, subscription, event_id) in (updated_at, subscription,
 * event_id) descending order — (INT64_MAX, "", "") for the first page. */
int store_deliveries_dead(struct store *s, const char *ws, int64_t at, const char *subscription,
                          const char *event_id, int limit, struct store_delivery **items, size_t *n,
                          struct ifl_err *e);
/* Sets the delivery of event_id back to pending, due at now, with a fresh
 * attempt budget, inside the caller's transaction; *out (cleared by the
 * caller) = the row after.  IFL_ENOTFOUND, or IFL_ECONFLICT while an
 * attempt is sending it. */
int store_tx_delivery_redeliver(struct store_tx *tx, const char *ws, const char *name,
                                const char *event_id, int64_t now, struct store_delivery *out,
                                struct ifl_err *e);
/* Deletes at most `limit` deliveries delivered before `before`; *n = how
 * many. */
int store_deliveries_expire(struct store *s, int64_t before, int limit, int *n, struct ifl_err *e);

/* ---- workspace tokens (spec §10; store/tokens.c) ------------------------------ */
struct store_token {
    char id[33];
    char *name;
    int64_t created_at;
};
void store_tokens_free(struct store_token *v, size_t n);
/* Records token id for ws inside the caller's transaction. */
int store_tx_token_insert(struct store_tx *tx, const char *ws, const char *id, const char *name,
                          int64_t now, struct ifl_err *e);
/* 0 when (ws, id) is recorded (not revoked), IFL_ENOTFOUND otherwise. */
int store_token_exists(struct store *s, const char *ws, const char *id, struct ifl_err *e);
/* Oldest first. */
int store_token_list(struct store *s, const char *ws, struct store_token **items, size_t *n,
                     struct ifl_err *e);
/* Revokes it; IFL_ENOTFOUND when absent. */
int store_token_delete(struct store *s, const char *ws, const char *id, struct ifl_err *e);

/* ---- retention (spec §4; store/retention.c) -------------------------------------
 * A finished execution older than the retention is purged: its steps and
 * attempts are deleted and its row becomes a tombstone (status "purged",
 * payload null) until dedup_until — its id, identity and payload hash still
 * deduplicate triggers through the unique key, with no cost to them — or is
 * deleted at once when that time has passed.  Events and deliveries older
 * than the retention are deleted by age. */
/* Creates the index the purge scans (finished executions by the time they
 * finished); only processes that purge pay for it.  Idempotent; on
 * PostgreSQL built concurrently, without blocking writes. */
int store_retention_prepare(struct store *s, struct ifl_err *e);
struct store_purge {
    int64_t seq;
    char id[65];
    char *workspace, *workflow, *entry_point;
    int workflow_version;
    int64_t created_at;
    int64_t dedup_until; /* set by the caller: tombstone until then; <= now: delete */
    int purged;          /* out */
};
void store_purge_clear(struct store_purge *p);
void store_purges_free(struct store_purge *v, size_t n);
/* Executions that finished (completed, failed, stale: their last update)
 * before `before`, oldest first. */
int store_purge_candidates(struct store *s, int64_t before, int limit, struct store_purge **items,
                           size_t *n, struct ifl_err *e);
/* Purges v[0..n) in one transaction, each only if it is still finished
 * (an operator retry may have moved it meanwhile): purged = 1. */
int store_purge(struct store *s, struct store_purge *v, size_t n, int64_t now, struct ifl_err *e);
/* Deletes events created before `before` among the `limit` oldest rows;
 * *n = how many (so 0 may leave old rows further on only if younger ones
 * came first).  Deliveries are left: a pending one whose event is gone is
 * dead-lettered when claimed, a dead one stays (retention.c). */
int store_events_expire(struct store *s, int64_t before, int limit, int *n, struct ifl_err *e);
/* Deletes at most `limit` tombstones whose dedup_until is before `now`. */
int store_tombstones_expire(struct store *s, int64_t now, int limit, int *n, struct ifl_err *e);

#endif
