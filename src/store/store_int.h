/*
 * store_int.h — the backend table shared by store.c and the backends.
 * Callers outside src/store never include this file.
 */
#ifndef IFL_STORE_STORE_INT_H
#define IFL_STORE_STORE_INT_H

#include "store/store.h"

/* A statement written once for both backends (subs.c): SQLite's text with
 * numbered parameters ?1 … ?N, which PostgreSQL runs as $1 … $N; `pg`, when
 * set, is PostgreSQL's own text where the dialects differ (?N or $N). */
struct store_sql {
    const char *name;
    const char *sql;
    const char *pg;
};
/* A parameter: an integer, a string, or NULL (neither). */
struct store_val {
    int is_int;
    int64_t i;
    const char *s;
};
typedef int (*store_row_fn)(void *arg, const char *const *cols, int ncols);
#define STORE_VAL_I(x) ((struct store_val){.is_int = 1, .i = (x)})
#define STORE_VAL_S(x) ((struct store_val){.s = (x)})
#define STORE_MAX_COLS 24
/* Makes room for one more element in a doubling heap array (store.c). */
void *store_grow(void *items, size_t n, size_t *cap, size_t size);

/* The claim walk's laps (store.h, store_claim_noted's *more): a walk from
 * `start` (NULL: the first workspace) that looked up to `last`, wrapping
 * past the last workspace if `wrapped`, found `found` workspaces with due
 * steps and was `cut` short by its budget.  A walk that found none and was
 * cut asks for another at once (returns 1) — until the walks since the
 * first of them have looked at every workspace once: *empty_since (owned;
 * NULL while walks find work) is where that first one began. */
int store_claim_lap(char **empty_since, const char *start, const char *last, int wrapped, int found,
                    int cut);
/* A store_row_fn that counts rows into the int at arg (subs.c). */
int store_row_count(void *arg, const char *const *cols, int nc);

struct store_ops {
    const char *name;
    void (*close)(struct store *s);
    int (*schema_version)(struct store *s, int *version, struct ifl_err *e);
    int (*ping)(struct store *s, struct ifl_err *e);
    int (*workspace_put)(struct store *s, const char *ws, const char *settings, int *created,
                         struct ifl_err *e);
    int (*workspace_exists)(struct store *s, const char *ws, struct ifl_err *e);
    /* same: NULL, or as store_workflow_put_changed */
    int (*workflow_put)(struct store *s, const char *ws, const char *wf, const char *def,
                        int (*same)(const char *latest, void *arg), void *arg, int *version,
                        int *stored, struct ifl_err *e);
    int (*workflow_get)(struct store *s, const char *ws, const char *wf, int version,
                        struct store_workflow *out, struct ifl_err *e);
    int (*secret_put)(struct store *s, const char *ws, const char *name, const char *sealed,
                      const char *same, struct ifl_err *e);
    int (*secret_get)(struct store *s, const char *ws, const char *name, char **sealed,
                      struct ifl_err *e);
    /* sealed NULL: the names only */
    int (*secret_list)(struct store *s, const char *ws, char ***names, char ***sealed, size_t *n,
                       struct ifl_err *e);
    int (*secret_retired)(struct store *s, const char *ws, char ***names, char ***sealed, size_t *n,
                          struct ifl_err *e);
    int (*execution_get)(struct store *s, const char *ws, const char *id,
                         struct store_execution *out, struct ifl_err *e);
    /* Optional (NULL: execution_get): store_execution_probe. */
    int (*execution_probe)(struct store *s, const char *ws, const char *id,
                           struct store_execution *out, struct ifl_err *e);
    /* f is never NULL here (its members may be). */
    int (*execution_list)(struct store *s, const char *ws, const struct store_exec_filter *f,
                          int64_t after_ts, const char *after_id, int limit,
                          struct store_execution **items, size_t *n, struct ifl_err *e);
    /* Optional (NULL: execution_get, then steps_get): one snapshot. */
    int (*execution_load)(struct store *s, const char *ws, const char *id,
                          struct store_execution *x, struct store_step **items, size_t *n,
                          struct ifl_err *e);
    int (*steps_get)(struct store *s, const char *execution_id, struct store_step **items,
                     size_t *n, struct ifl_err *e);
    int (*attempts_get)(struct store *s, const char *execution_id, struct store_attempt **items,
                        size_t *n, struct ifl_err *e);
    /* store_claim_noted: limit 1 … STORE_CLAIM_MAX, *items NULL and *n 0
     * on entry; *items stays NULL when nothing is claimed */
    int (*claim)(struct store *s, const char *worker, int limit, int64_t now, int64_t lease_ms,
                 const char *retry_note, struct store_claim **items, size_t *n, int *more,
                 struct ifl_err *e);
    int (*lease_renew)(struct store *s, const char *execution_id, const char *vertex, int64_t epoch,
                       int64_t now, int64_t until, int *ok, struct ifl_err *e);
    int (*expired)(struct store *s, int64_t now, int limit, struct store_step **items, size_t *n,
                   struct ifl_err *e);
    int (*next_due)(struct store *s, int64_t *when, struct ifl_err *e);
    int (*dead_letters)(struct store *s, const char *ws, const struct store_dead_cursor *after,
                        int limit, struct store_step **items, size_t *n, struct ifl_err *e);
    int (*events_list)(struct store *s, const char *ws, const char *after, int limit,
                       struct store_event **items, size_t *n, struct ifl_err *e);

    /* Transactions: tx_run runs fn inside one transaction on a backend
     * connection; the tx_* operations below use that connection. */
    int (*tx_run)(struct store *s, store_tx_fn fn, void *arg, struct ifl_err *e);
    /* Optional: n independent transactions committed together. */
    void (*tx_run_many)(struct store *s, store_tx_fn fn, void **args, size_t n, int *rcs,
                        struct ifl_err *errs);
    /* Optional: fn queued, done called after the commit (store_tx_submit). */
    int (*tx_submit)(struct store *s, store_tx_fn fn, void *arg, store_done_fn done,
                     void *done_arg);
    int (*tx_execution_get)(struct store_tx *tx, const char *ws, const char *id,
                            struct store_execution *out, struct ifl_err *e);
    int (*tx_execution_insert)(struct store_tx *tx, const struct store_execution *x, int *created,
                               struct ifl_err *e);
    int (*tx_execution_set_status)(struct store_tx *tx, const char *id, const char *status,
                                   int64_t version, struct ifl_err *e);
    int (*tx_execution_started_over)(struct store_tx *tx, const char *ws, const char *id,
                                     const char *new_id, char **was, struct ifl_err *e);
    int (*tx_steps_get)(struct store_tx *tx, const char *execution_id, struct store_step **items,
                        size_t *n, struct ifl_err *e);
    /* Optional (NULL: tx_execution_get, then tx_steps_get). */
    int (*tx_execution_load)(struct store_tx *tx, const char *ws, const char *id,
                             struct store_execution *x, struct store_step **items, size_t *n,
                             struct ifl_err *e);
    int (*tx_step_insert)(struct store_tx *tx, const struct store_step *st, struct ifl_err *e);
    /* optional: n steps at once (else tx_step_insert for each) */
    int (*tx_steps_insert)(struct store_tx *tx, const struct store_step *rows, size_t n,
                           struct ifl_err *e);
    int (*tx_step_update)(struct store_tx *tx, const struct store_step *st,
                          enum step_state expect_state, int64_t expect_epoch, int *changed,
                          struct ifl_err *e);
    /* finish 0: a note (store_tx_attempt_note): finished_at stays NULL */
    int (*tx_attempt_finish)(struct store_tx *tx, const char *execution_id, const char *vertex,
                             int64_t epoch, const char *outcome, const char *error, int finish,
                             struct ifl_err *e);
    int (*tx_attempt_delete)(struct store_tx *tx, const char *execution_id, const char *vertex,
                             int64_t epoch, struct ifl_err *e);
    int (*tx_attempt_record)(struct store_tx *tx, const char *execution_id, const char *vertex,
                             int64_t epoch, const char *worker, const char *outcome,
                             struct ifl_err *e);
    int (*tx_event_append)(struct store_tx *tx, struct store_event *ev, struct ifl_err *e);
    int (*idem_exists)(struct store *s, const char *ws, const char *scope, const char *key,
                       int *found, struct ifl_err *e);
    int (*tx_idem_put)(struct store_tx *tx, const char *ws, const char *scope, const char *key,
                       const struct store_idem *r, int *created, struct store_idem *existing,
                       struct ifl_err *e);
    int (*tx_ordering_advance)(struct store_tx *tx, const struct store_ordering *o, int *advanced,
                               int *had_last, int64_t *last, struct ifl_err *e);
    int (*tx_ordering_reset)(struct store_tx *tx, const struct store_ordering *o, int had_last,
                             int64_t last, struct ifl_err *e);
    int (*tx_tick_claim)(struct store_tx *tx, const struct store_tick *t, int *claimed,
                         int *superseded, struct ifl_err *e);
    int (*tx_ticks_expire)(struct store_tx *tx, int64_t before, int limit, int *n,
                           struct ifl_err *e);
    int (*tx_workflows_latest)(struct store_tx *tx, struct store_workflow **items, size_t *n,
                               struct ifl_err *e);
    int (*tx_idem_set)(struct store_tx *tx, const char *ws, const char *scope, const char *key,
                       const struct store_idem *r, int64_t expect_created_at, int *changed,
                       struct ifl_err *e);
    int (*tx_idem_expire)(struct store_tx *tx, int64_t before, int limit, int *n,
                          struct ifl_err *e);

    /* A portable statement (struct store_sql) with parameters p[0..np),
     * each result row handed to cb (may be NULL) as text columns (NULL for
     * SQL NULL); cb returning non-zero stops the rows and is returned.
     * query reads outside any transaction; tx_query runs in tx. */
    int (*query)(struct store *s, const struct store_sql *q, const struct store_val *p, int np,
                 store_row_fn cb, void *arg, struct ifl_err *e);
    int (*tx_query)(struct store_tx *tx, const struct store_sql *q, const struct store_val *p,
                    int np, store_row_fn cb, void *arg, struct ifl_err *e);

    /* Optional (NULL: store_wait_work returns IFL_EUNSUPPORTED): waits for
     * a cross-process work notification; contract at store_wait_work. */
    int (*wait_work)(struct store *s, int64_t timeout_ms);
};

/* Every transaction handle starts with this. */
struct store_tx {
    struct store *s;
};

/* Every backend's handle starts with this. */
struct store {
    const struct store_ops *ops;
};

/* Backend constructors. */
int store_sqlite_open(const char *path, struct store **out, struct ifl_err *e);
/* conninfo: a postgres:// URL or a libpq key=value string. */
int store_pg_open(const char *conninfo, struct store **out, struct ifl_err *e);
char *store_pg_shown(const char *conninfo);

/* The statuses an execution rarely ends in and an operator lists to act
 * on: migration 10's partial index holds only rows in one of them.  A list
 * statement filtered on such a status repeats this literal set, so that the
 * planner (SQLite's and PostgreSQL's alike, with the status a parameter)
 * can prove the index applies. */
#define STORE_EXEC_RARE "('failed', 'requires_reconciliation', 'stale', 'cancelled')"
/* The same set as SQLite's index predicate (migration 13) and its list
 * statement: equalities joined by OR.  SQLite codes an IN list of more than
 * two constants as a temporary B-tree, built on every run of a statement
 * that evaluates it: every execution's insert built one and every status
 * change two, only to find the row outside the index (≈ 2-3 µs each). */
#define STORE_EXEC_RARE_OR                                                                         \
    "(status = 'failed' OR status = 'requires_reconciliation' OR status = 'stale'"                 \
    " OR status = 'cancelled')"
/* SQLite's list statement for one rare status (store_sqlite.c). */
extern const char store_sqlite_list_rare[];
/* 1 when s is one of STORE_EXEC_RARE. */
int store_execution_status_rare(const char *s);

/* PostgreSQL's two indexes of DISPATCHED steps (migration 16), each for
 * its own statements: steps_due (by time) for the next due time
 * (S_NEXT_DUE), steps_due_ws (by workspace, then time) for the claim's
 * walk and its per-workspace seek (S_CLAIM_WALK, S_CLAIM).  On statistics
 * taken while no step was DISPATCHED, a cached generic plan of the walk
 * scanned every waiting step through steps_due, once per workspace looked
 * at (found by a judge: 1,800 waiting steps, a walk of 646 ms against 1.2
 * ms), and the next due time read every one through steps_due_ws (found by
 * the next).  So each index's predicate holds a bound that every row meets
 * and only its own statements state: no other query can be proved to
 * match it, and none can be planned through it. */
#define STORE_PG_DUE_FLOOR "next_run_at > -9223372036854775807"
#define STORE_PG_DUE_WS_FLOOR "workspace >= ''"

/* The schema, as ordered migrations shared by every backend.  Each entry's
 * SQL is portable (TEXT, BIGINT, INTEGER, ON CONFLICT); `sqlite_only` /
 * `pg_only` hold the rare dialect-specific statements. */
struct store_migration {
    int version;
    const char *sql;    /* portable SQL, or SQLite's when pg_sql is set */
    const char *pg_sql; /* PostgreSQL's variant, NULL when `sql` is portable */
};
extern const struct store_migration store_migrations[];
extern const int store_migrations_count;
/* IFL_EINVAL, saying so, when a database's highest applied migration
 * `have` is newer than this engine's last: checked before migrating. */
int store_schema_newer(int have, struct ifl_err *e);

#endif
