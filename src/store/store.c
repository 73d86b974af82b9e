/*
 * store — backend selection, dispatch, the shared schema, and helpers that
 * every backend would otherwise repeat (cursor encoding, clearing structs).
 */
#include "store/store_int.h"
#include "base/mem.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

/* Schema migrations: applied in order, each in its own transaction, and
 * recorded in schema_migrations.  Never edit a released entry; append. */
/*
 * Layout for write locality: every table that grows with executions is
 * keyed by the execution's insertion sequence (executions.seq), not by its
 * random SHA-256 id, so a commit touches the tail pages of each B-tree
 * instead of one random page per row.  Only the id index is random.
 * (`WITHOUT ROWID` is SQLite's clustering; PostgreSQL's heap has none, so
 * its variant keeps the same keys and adds partial indexes for the scans.)
 */
const struct store_migration store_migrations[] = {
    {1,
     "CREATE TABLE workspaces ("
     " name TEXT PRIMARY KEY,"
     " settings TEXT NOT NULL,"
     " created_at BIGINT NOT NULL);"
     "CREATE TABLE workflows ("
     " workspace TEXT NOT NULL REFERENCES workspaces(name),"
     " name TEXT NOT NULL,"
     " version INTEGER NOT NULL,"
     " definition TEXT NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, name, version));"
     "CREATE TABLE secrets ("
     " workspace TEXT NOT NULL REFERENCES workspaces(name),"
     " name TEXT NOT NULL,"
     " sealed TEXT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, name));"
     "CREATE TABLE executions ("
     " seq INTEGER PRIMARY KEY,"
     " id TEXT NOT NULL UNIQUE,"
     " workspace TEXT NOT NULL REFERENCES workspaces(name),"
     " workflow TEXT NOT NULL,"
     " workflow_version INTEGER NOT NULL,"
     " entry_point TEXT NOT NULL,"
     " identity TEXT NOT NULL,"
     " payload TEXT NOT NULL,"
     " payload_hash TEXT NOT NULL,"
     " test INTEGER NOT NULL,"
     " status TEXT NOT NULL,"
     " version BIGINT NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " started_over_from TEXT);"
     "CREATE INDEX executions_by_ws ON executions (workspace, created_at, id);",
     /* PostgreSQL: an identity sequence; key text columns use the "C"
      * collation, so ordering is SQLite's byte order and indexes stay cheap;
      * JSON text is stored as `json` (kept verbatim, and reachable from SQL
      * as data->>'key', like SQLite's JSON operators on text). */
     "CREATE TABLE workspaces ("
     " name TEXT COLLATE \"C\" PRIMARY KEY,"
     " settings JSON NOT NULL,"
     " created_at BIGINT NOT NULL);"
     "CREATE TABLE workflows ("
     " workspace TEXT COLLATE \"C\" NOT NULL REFERENCES workspaces(name),"
     " name TEXT COLLATE \"C\" NOT NULL,"
     " version INTEGER NOT NULL,"
     " definition JSON NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, name, version));"
     "CREATE TABLE secrets ("
     " workspace TEXT COLLATE \"C\" NOT NULL REFERENCES workspaces(name),"
     " name TEXT COLLATE \"C\" NOT NULL,"
     " sealed TEXT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, name));"
     "CREATE TABLE executions ("
     " seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
     " id TEXT COLLATE \"C\" NOT NULL UNIQUE,"
     " workspace TEXT COLLATE \"C\" NOT NULL REFERENCES workspaces(name),"
     " workflow TEXT COLLATE \"C\" NOT NULL,"
     " workflow_version INTEGER NOT NULL,"
     " entry_point TEXT COLLATE \"C\" NOT NULL,"
     " identity JSON NOT NULL,"
     " payload JSON NOT NULL,"
     " payload_hash TEXT NOT NULL,"
     " test INTEGER NOT NULL,"
     " status TEXT NOT NULL,"
     " version BIGINT NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " started_over_from TEXT);"
     "CREATE INDEX executions_by_ws ON executions (workspace, created_at, id);"},
    {2,
     "CREATE TABLE steps ("
     " execution_seq BIGINT NOT NULL,"
     " vertex TEXT NOT NULL,"
     " execution_id TEXT NOT NULL,"
     " workspace TEXT NOT NULL,"
     " kind TEXT NOT NULL,"
     " state TEXT NOT NULL,"
     " attempts INTEGER NOT NULL,"
     " epoch BIGINT NOT NULL,"
     " lease_owner TEXT,"
     " lease_expires_at BIGINT,"
     " next_run_at BIGINT NOT NULL,"
     " in_decided INTEGER NOT NULL,"
     " in_taken INTEGER NOT NULL,"
     " output TEXT,"
     " error TEXT,"
     " updated_at BIGINT NOT NULL,"
     " PRIMARY KEY (execution_seq, vertex)) WITHOUT ROWID;"
     /* Partial indexes: a step is in at most one of them, and only while
      * its state needs finding, so most step writes touch no index. */
     "CREATE INDEX steps_due ON steps (next_run_at) WHERE state = 'DISPATCHED';"
     "CREATE INDEX steps_lease ON steps (lease_expires_at) WHERE state = 'EXECUTING';"
     "CREATE INDEX steps_by_ws ON steps (workspace, updated_at)"
     " WHERE state IN ('FAILED', 'REQUIRES_RECONCILIATION');"
     "CREATE TABLE step_attempts ("
     " execution_seq BIGINT NOT NULL,"
     " vertex TEXT NOT NULL,"
     " epoch BIGINT NOT NULL,"
     " execution_id TEXT NOT NULL,"
     " worker TEXT NOT NULL,"
     " started_at BIGINT NOT NULL,"
     " finished_at BIGINT,"
     " outcome TEXT,"
     " error TEXT,"
     " PRIMARY KEY (execution_seq, vertex, epoch)) WITHOUT ROWID;"
     "CREATE TABLE events ("
     " seq INTEGER PRIMARY KEY,"
     " id TEXT NOT NULL,"
     " workspace TEXT NOT NULL,"
     " execution_id TEXT,"
     " aggregate_version BIGINT,"
     " type TEXT NOT NULL,"
     " data TEXT NOT NULL,"
     " created_at BIGINT NOT NULL);"
     "CREATE INDEX events_by_ws ON events (workspace, seq);"
     "CREATE TABLE idempotency_keys ("
     " workspace TEXT NOT NULL,"
     " scope TEXT NOT NULL,"
     " key TEXT NOT NULL,"
     " fingerprint TEXT NOT NULL,"
     " status INTEGER NOT NULL,"
     " response TEXT NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, scope, key));",
     /* PostgreSQL: heap tables keyed the same way; the scans that look for
      * work use partial indexes, which stay small however many finished
      * steps accumulate. */
     "CREATE TABLE steps ("
     " execution_seq BIGINT NOT NULL,"
     " vertex TEXT COLLATE \"C\" NOT NULL,"
     " execution_id TEXT COLLATE \"C\" NOT NULL,"
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " kind TEXT NOT NULL,"
     " state TEXT NOT NULL,"
     " attempts INTEGER NOT NULL,"
     " epoch BIGINT NOT NULL,"
     " lease_owner TEXT,"
     " lease_expires_at BIGINT,"
     " next_run_at BIGINT NOT NULL,"
     " in_decided INTEGER NOT NULL,"
     " in_taken INTEGER NOT NULL,"
     " output JSON,"
     " error JSON,"
     " updated_at BIGINT NOT NULL,"
     " PRIMARY KEY (execution_seq, vertex));"
     "CREATE INDEX steps_due ON steps (next_run_at) WHERE state = 'DISPATCHED';"
     "CREATE INDEX steps_lease ON steps (lease_expires_at) WHERE state = 'EXECUTING';"
     "CREATE INDEX steps_by_ws ON steps (workspace, updated_at)"
     " WHERE state IN ('FAILED', 'REQUIRES_RECONCILIATION');"
     "CREATE TABLE step_attempts ("
     " execution_seq BIGINT NOT NULL,"
     " vertex TEXT COLLATE \"C\" NOT NULL,"
     " epoch BIGINT NOT NULL,"
     " execution_id TEXT COLLATE \"C\" NOT NULL,"
     " worker TEXT NOT NULL,"
     " started_at BIGINT NOT NULL,"
     " finished_at BIGINT,"
     " outcome TEXT,"
     " error JSON,"
     " PRIMARY KEY (execution_seq, vertex, epoch));"
     "CREATE TABLE events ("
     " seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
     " id TEXT COLLATE \"C\" NOT NULL,"
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " execution_id TEXT COLLATE \"C\","
     " aggregate_version BIGINT,"
     " type TEXT NOT NULL,"
     " data JSON NOT NULL,"
     " created_at BIGINT NOT NULL);"
     "CREATE INDEX events_by_ws ON events (workspace, seq);"
     "CREATE TABLE idempotency_keys ("
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " scope TEXT COLLATE \"C\" NOT NULL,"
     " key TEXT COLLATE \"C\" NOT NULL,"
     " fingerprint TEXT NOT NULL,"
     " status INTEGER NOT NULL,"
     " response JSON NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, scope, key));"},
    /* The event feed on PostgreSQL pages by (transaction id, seq) and only
     * shows transactions older than every running one, so an event that
     * commits late can never land behind a cursor (docs/postgres.md).
     * SQLite's single writer makes seq order commit order already. */
    {3, "SELECT 1;",
     "ALTER TABLE events ADD COLUMN txid xid8 NOT NULL DEFAULT pg_current_xact_id();"
     "CREATE INDEX events_by_ws_tx ON events (workspace, txid, seq);"},
    /* PostgreSQL: the transaction id of an execution's latest event, so that
     * a transaction that got its id before another one wrote the same
     * execution (it waited for that one's row lock) re-runs with a newer id
     * instead of putting its event before that one's in the (txid, seq)
     * feed (store_pg.c, tx_event_append).  No default for existing rows:
     * adding the column rewrites nothing. */
    {4, "SELECT 1;",
     "ALTER TABLE executions ADD COLUMN last_txid xid8;"
     "ALTER TABLE executions ALTER COLUMN last_txid SET DEFAULT pg_current_xact_id();"},
    /* The last version applied per ordering key of an entry point (spec §8,
     * "ordering"): advanced in the creating transaction of the execution it
     * admits. */
    {5,
     "CREATE TABLE ordering_keys ("
     " workspace TEXT NOT NULL,"
     " workflow TEXT NOT NULL,"
     " entry_point TEXT NOT NULL,"
     " key TEXT NOT NULL,"
     " version BIGINT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, workflow, entry_point, key));",
     "CREATE TABLE ordering_keys ("
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " workflow TEXT COLLATE \"C\" NOT NULL,"
     " entry_point TEXT COLLATE \"C\" NOT NULL,"
     " key TEXT COLLATE \"C\" NOT NULL,"
     " version BIGINT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, workflow, entry_point, key));"},
    /* One row per fired schedule tick (spec §9), inserted in the
     * transaction that creates the tick's execution: a tick is fired once
     * across processes and restarts.  Kept a day (store_ticks_expire). */
    {6,
     "CREATE TABLE schedule_ticks ("
     " workspace TEXT NOT NULL,"
     " workflow TEXT NOT NULL,"
     " entry_point TEXT NOT NULL,"
     " fire_at BIGINT NOT NULL,"
     " execution_id TEXT NOT NULL,"
     " PRIMARY KEY (workspace, workflow, entry_point, fire_at));"
     "CREATE INDEX schedule_ticks_by_time ON schedule_ticks (fire_at);",
     "CREATE TABLE schedule_ticks ("
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " workflow TEXT COLLATE \"C\" NOT NULL,"
     " entry_point TEXT COLLATE \"C\" NOT NULL,"
     " fire_at BIGINT NOT NULL,"
     " execution_id TEXT NOT NULL,"
     " PRIMARY KEY (workspace, workflow, entry_point, fire_at));"
     "CREATE INDEX schedule_ticks_by_time ON schedule_ticks (fire_at);"},
    /* 7: outgoing webhooks (spec §7 subscriptions; store/subs.c) */
    {7,
     "CREATE TABLE subscriptions ("
     " workspace TEXT NOT NULL,"
     " name TEXT NOT NULL,"
     " url TEXT NOT NULL,"
     " events TEXT NOT NULL,"
     " secret TEXT NOT NULL,"
     " settings TEXT NOT NULL,"
     " timeout_ms BIGINT NOT NULL,"
     " cursor TEXT NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, name));"
     "CREATE TABLE deliveries ("
     " seq INTEGER PRIMARY KEY,"
     " workspace TEXT NOT NULL,"
     " subscription TEXT NOT NULL,"
     " event_seq BIGINT NOT NULL,"
     " event_id TEXT NOT NULL,"
     " execution_id TEXT NOT NULL,"
     " aggregate_version BIGINT NOT NULL,"
     " state TEXT NOT NULL,"
     " attempts INTEGER NOT NULL DEFAULT 0,"
     " epoch BIGINT NOT NULL DEFAULT 0,"
     " next_at BIGINT NOT NULL,"
     " lease_until BIGINT NOT NULL DEFAULT 0,"
     " last_status INTEGER,"
     " last_error TEXT,"
     " created_at BIGINT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " UNIQUE (workspace, subscription, event_id));"
     "CREATE INDEX deliveries_due ON deliveries (state, next_at);"
     "CREATE INDEX deliveries_order ON deliveries"
     " (workspace, subscription, execution_id, aggregate_version);",
     "CREATE TABLE subscriptions ("
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " name TEXT COLLATE \"C\" NOT NULL,"
     " url TEXT NOT NULL,"
     " events TEXT NOT NULL,"
     " secret TEXT NOT NULL,"
     " settings TEXT NOT NULL,"
     " timeout_ms BIGINT NOT NULL,"
     " cursor TEXT NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, name));"
     "CREATE TABLE deliveries ("
     " seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " subscription TEXT COLLATE \"C\" NOT NULL,"
     " event_seq BIGINT NOT NULL,"
     " event_id TEXT COLLATE \"C\" NOT NULL,"
     " execution_id TEXT COLLATE \"C\" NOT NULL,"
     " aggregate_version BIGINT NOT NULL,"
     " state TEXT NOT NULL,"
     " attempts INTEGER NOT NULL DEFAULT 0,"
     " epoch BIGINT NOT NULL DEFAULT 0,"
     " next_at BIGINT NOT NULL,"
     " lease_until BIGINT NOT NULL DEFAULT 0,"
     " last_status INTEGER,"
     " last_error TEXT,"
     " created_at BIGINT NOT NULL,"
     " updated_at BIGINT NOT NULL,"
     " UNIQUE (workspace, subscription, event_id));"
     "CREATE INDEX deliveries_due ON deliveries (state, next_at);"
     "CREATE INDEX deliveries_order ON deliveries"
     " (workspace, subscription, execution_id, aggregate_version);"},
    /* 8: workspace tokens (spec §10; store/tokens.c): ids only, the token
     * itself is derived from the id under the secrets key */
    {8,
     "CREATE TABLE tokens ("
     " workspace TEXT NOT NULL,"
     " id TEXT NOT NULL,"
     " name TEXT NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, id));",
     "CREATE TABLE tokens ("
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " id TEXT COLLATE \"C\" NOT NULL,"
     " name TEXT NOT NULL,"
     " created_at BIGINT NOT NULL,"
     " PRIMARY KEY (workspace, id));"},
    /* 9: retention (spec §4; store/retention.c): a purged execution keeps
     * its row — status 'purged', payload dropped, steps and attempts gone —
     * until dedup_until, so its id still deduplicates through the unique
     * key; only such rows are in the index */
    {9,
     "ALTER TABLE executions ADD COLUMN dedup_until BIGINT;"
     "CREATE INDEX executions_tombstones ON executions (dedup_until)"
     " WHERE dedup_until IS NOT NULL;",
     NULL},
    /* 10: the executions an operator lists to act on (failed, parked,
     * stale, cancelled; store_execution_list_where): only such rows are in the index,
     * so a list filtered on one of them reads its page and no more however
     * many completed executions the workspace holds, and a trigger that
     * runs to completion never writes it */
    {10,
     "CREATE INDEX executions_attention ON executions (workspace, status, created_at, id)"
     " WHERE status IN " STORE_EXEC_RARE ";",
     NULL},
    /* 11, PostgreSQL: the transaction id that last advanced an ordering
     * key, as executions.last_txid (4) for an execution's events: a
     * transaction that took its id before another one advanced the key
     * (a batch of triggers that wrote another execution first, then waited
     * for the key's row lock) re-runs with a newer id instead of listing
     * the version it admits before the one it read in the (txid, seq) feed
     * (found by a judge; store_pg.c, ordering_lock). */
    {11, "SELECT 1;",
     "ALTER TABLE ordering_keys ADD COLUMN last_txid xid8;"
     "ALTER TABLE ordering_keys ALTER COLUMN last_txid SET DEFAULT pg_current_xact_id();"},
    /* 12: the execution an execution was last started over as:
     * the original takes no more operator actions and leaves the dead
     * letters, so its FAILED call cannot be retried beside the new one's
     * (found by a judge: a retry after a start-over charged twice). */
    /* Filled from started_over_from for executions started over before it
     * (the newest new one of each original), in one pass over the table. */
    {12,
     "ALTER TABLE executions ADD COLUMN started_over_to TEXT;"
     "UPDATE executions SET started_over_to = n.id"
     " FROM (SELECT started_over_from AS orig, id, MAX(seq) FROM executions"
     " WHERE started_over_from IS NOT NULL GROUP BY started_over_from) AS n"
     " WHERE executions.id = n.orig;",
     "ALTER TABLE executions ADD COLUMN started_over_to TEXT COLLATE \"C\";"
     "UPDATE executions SET started_over_to = n.id"
     " FROM (SELECT DISTINCT ON (started_over_from) started_over_from AS orig, id"
     " FROM executions WHERE started_over_from IS NOT NULL"
     " ORDER BY started_over_from, seq DESC) AS n"
     " WHERE executions.id = n.orig;"},
    /* 13, SQLite: migration 10's index with its predicate spelled as ORs
     * (STORE_EXEC_RARE_OR), which SQLite evaluates without building a
     * temporary B-tree on every insert and status change.  PostgreSQL
     * evaluates the IN list as it is. */
    {13,
     "DROP INDEX IF EXISTS executions_attention;"
     "CREATE INDEX executions_attention ON executions (workspace, status, created_at, id)"
     " WHERE " STORE_EXEC_RARE_OR ";",
     "SELECT 1;"},
    /* 14: the values a secret PUT replaced (store_secret_put's `retire`),
     * newest STORE_SECRETS_RETIRED of each workspace: what a destination
     * answered before a rotation may hold the old value, and everything
     * evaluated from it later is still scrubbed of it (docs/gateway.md). */
    {14,
     "CREATE TABLE secrets_retired ("
     " seq INTEGER PRIMARY KEY,"
     " workspace TEXT NOT NULL,"
     " name TEXT NOT NULL,"
     " sealed TEXT NOT NULL,"
     " retired_at BIGINT NOT NULL);"
     "CREATE INDEX secrets_retired_by_ws ON secrets_retired (workspace, seq);",
     "CREATE TABLE secrets_retired ("
     " seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
     " workspace TEXT COLLATE \"C\" NOT NULL,"
     " name TEXT COLLATE \"C\" NOT NULL,"
     " sealed TEXT NOT NULL,"
     " retired_at BIGINT NOT NULL);"
     "CREATE INDEX secrets_retired_by_ws ON secrets_retired (workspace, seq);"},
    /* 15: workspaces take turns at claims (store.h, store_claim): the
     * claim walks the workspaces that have due steps and takes each one's
     * oldest, every look an index seek. */
    {15, "CREATE INDEX steps_due_ws ON steps (workspace, next_run_at) WHERE state = 'DISPATCHED';",
     "CREATE INDEX steps_due_ws ON steps (workspace, next_run_at) WHERE state = 'DISPATCHED';"},
    /* 16, PostgreSQL: steps_due and steps_due_ws each only for the
     * statements that name its bound (store_int.h, STORE_PG_DUE_FLOOR).
     * SQLite plans by the schema alone, with no statistics or cached plan
     * to go stale. */
    {16, "SELECT 1;",
     "DROP INDEX steps_due;"
     "CREATE INDEX steps_due ON steps (next_run_at)"
     " WHERE state = 'DISPATCHED' AND " STORE_PG_DUE_FLOOR ";"
     "DROP INDEX steps_due_ws;"
     "CREATE INDEX steps_due_ws ON steps (workspace, next_run_at)"
     " WHERE state = 'DISPATCHED' AND " STORE_PG_DUE_WS_FLOOR ";"},
};
const int store_migrations_count = (int)(sizeof store_migrations / sizeof store_migrations[0]);

void *store_grow(void *items, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return items;
    *cap = *cap ? *cap * 2 : 8;
    return xrealloc(items, *cap * size);
}

/* x lies in what a walk from a (exclusive) to b (inclusive) looked at;
 * "" is the place before the first workspace. */
static int walked_past(const char *x, const char *a, const char *b, int wrapped)
{
    if (!wrapped)
        return strcmp(x, a) > 0 && strcmp(x, b) <= 0;
    return strcmp(x, a) > 0 || strcmp(x, b) <= 0 || !*x;
}

int store_claim_lap(char **empty_since, const char *start, const char *last, int wrapped, int found,
                    int cut)
{
    if (found || !cut || !last) {
        free(*empty_since);
        *empty_since = NULL;
        return 0;
    }
    if (!*empty_since) {
        *empty_since = xstrdup(start ? start : "");
        return 1;
    }
    if (walked_past(*empty_since, start ? start : "", last, wrapped)) {
        free(*empty_since);
        *empty_since = NULL;
        return 0;
    }
    return 1;
}

int store_url_is_sqlite(const char *url)
{
    return !(strncmp(url, "postgres://", 11) == 0 || strncmp(url, "postgresql://", 13) == 0 ||
             strstr(url, "dbname=") || strstr(url, "host="));
}

int store_open(const char *url, struct store **out, struct ifl_err *e)
{
    *out = NULL;
    if (!url || !*url)
        return err_set(e, IFL_EINVAL, "empty database url");
    if (!store_url_is_sqlite(url))
        return store_pg_open(url, out, e);
    /* Another scheme ("Postgres://u:pw@…", "mysql://…") is no file name;
     * refused without repeating the rest, which may hold a password. */
    size_t sl = strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-");
    if (sl && strncmp(url + sl, "://", 3) == 0 && strncmp(url, "sqlite:", 7) != 0)
        return err_set(e, IFL_EINVAL,
                       "unknown database url scheme '%.*s': use postgres://, postgresql:// (in "
                       "lower case), sqlite:PATH or a file path",
                       (int)(sl > 32 ? 32 : sl), url);
    if (strncmp(url, "sqlite:", 7) == 0)
        url += 7;
    return store_sqlite_open(url, out, e);
}

int store_schema_newer(int have, struct ifl_err *e)
{
    /* A database a newer engine migrated: this one does not know what its
     * later migrations mean (a status it never wrote, a column it never
     * fills), so it does not guess — and applies none of its own. */
    int known = store_migrations[store_migrations_count - 1].version;
    if (have <= known)
        return 0;
    return err_set(e, IFL_EINVAL,
                   "the database's schema is at version %d, newer than this engine's %d: a "
                   "newer idemflow migrated it; run that version (going back is not supported)",
                   have, known);
}

char *store_url_shown(const char *url)
{
    if (!url)
        return xstrdup("");
    return store_url_is_sqlite(url) ? xstrdup(url) : store_pg_shown(url);
}

void store_close(struct store *s)
{
    if (s)
        s->ops->close(s);
}

const char *store_backend(const struct store *s)
{
    return s->ops->name;
}

int store_schema_version(struct store *s, int *version, struct ifl_err *e)
{
    return s->ops->schema_version(s, version, e);
}

int store_ping(struct store *s, struct ifl_err *e)
{
    return s->ops->ping(s, e);
}

int store_wait_work(struct store *s, int64_t timeout_ms)
{
    if (!s->ops->wait_work)
        return IFL_EUNSUPPORTED;
    return s->ops->wait_work(s, timeout_ms);
}

int store_workspace_put(struct store *s, const char *ws, const char *settings, int *created,
                        struct ifl_err *e)
{
    return s->ops->workspace_put(s, ws, settings ? settings : "{}", created, e);
}

int store_workspace_exists(struct store *s, const char *ws, struct ifl_err *e)
{
    return s->ops->workspace_exists(s, ws, e);
}

void store_workflow_clear(struct store_workflow *w)
{
    if (!w)
        return;
    free(w->workspace);
    free(w->name);
    free(w->definition);
    memset(w, 0, sizeof *w);
}

int store_workflow_put(struct store *s, const char *ws, const char *wf, const char *def,
                       int *version, struct ifl_err *e)
{
    int stored = 0;
    return s->ops->workflow_put(s, ws, wf, def, NULL, NULL, version, &stored, e);
}

int store_workflow_put_changed(struct store *s, const char *ws, const char *wf, const char *def,
                               int (*same)(const char *latest, void *arg), void *arg, int *version,
                               int *stored, struct ifl_err *e)
{
    return s->ops->workflow_put(s, ws, wf, def, same, arg, version, stored, e);
}

int store_workflow_get(struct store *s, const char *ws, const char *wf, int version,
                       struct store_workflow *out, struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    return s->ops->workflow_get(s, ws, wf, version, out, e);
}

int store_secret_put(struct store *s, const char *ws, const char *name, const char *sealed,
                     const char *same, struct ifl_err *e)
{
    return s->ops->secret_put(s, ws, name, sealed, same, e);
}

int store_secret_get(struct store *s, const char *ws, const char *name, char **sealed,
                     struct ifl_err *e)
{
    *sealed = NULL;
    return s->ops->secret_get(s, ws, name, sealed, e);
}

int store_secret_list(struct store *s, const char *ws, char ***names, size_t *n, struct ifl_err *e)
{
    *names = NULL;
    *n = 0;
    return s->ops->secret_list(s, ws, names, NULL, n, e);
}

int store_secret_all(struct store *s, const char *ws, char ***names, char ***sealed, size_t *n,
                     struct ifl_err *e)
{
    *names = NULL;
    *sealed = NULL;
    *n = 0;
    return s->ops->secret_list(s, ws, names, sealed, n, e);
}

int store_secret_retired(struct store *s, const char *ws, char ***names, char ***sealed, size_t *n,
                         struct ifl_err *e)
{
    *names = NULL;
    *sealed = NULL;
    *n = 0;
    return s->ops->secret_retired(s, ws, names, sealed, n, e);
}

void store_strv_free(char **v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void store_execution_clear(struct store_execution *x)
{
    if (!x)
        return;
    free(x->workspace);
    free(x->workflow);
    free(x->entry_point);
    free(x->identity);
    free(x->payload);
    free(x->status);
    free(x->started_over_from);
    memset(x, 0, sizeof *x);
}

struct create_args {
    const struct store_execution *x;
    int created;
    struct store_execution *existing;
};

static int tx_create(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct create_args *a = arg;
    a->created = 0;
    if (a->existing)
        store_execution_clear(a->existing);
    int rc = store_tx_execution_insert(tx, a->x, &a->created, e);
    if (!rc && !a->created && a->existing)
        rc = store_tx_execution_get(tx, a->x->workspace, a->x->id, a->existing, e);
    return rc;
}

int store_execution_create(struct store *s, const struct store_execution *x, int *created,
                           struct store_execution *existing, struct ifl_err *e)
{
    if (existing)
        memset(existing, 0, sizeof *existing);
    struct create_args a = {x, 0, existing};
    int rc = store_tx_run(s, tx_create, &a, e);
    *created = a.created;
    return rc;
}

int store_execution_get(struct store *s, const char *ws, const char *id,
                        struct store_execution *out, struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    return s->ops->execution_get(s, ws, id, out, e);
}

int store_execution_probe(struct store *s, const char *ws, const char *id,
                          struct store_execution *out, struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    return (s->ops->execution_probe ? s->ops->execution_probe : s->ops->execution_get)(s, ws, id,
                                                                                       out, e);
}

/* Cursor: "<created_at>.<id>" — opaque to clients, validated here. */
static int cursor_parse(const char *c, int64_t *ts, char id[65])
{
    char *end = NULL;
    long long v = strtoll(c, &end, 10);
    if (end == c || *end != '.' || v < 0)
        return IFL_EINVAL;
    const char *p = end + 1;
    size_t n = strlen(p);
    if (n != 64)
        return IFL_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return IFL_EINVAL;
    memcpy(id, p, 65);
    *ts = v;
    return 0;
}

int store_execution_status_valid(const char *s)
{
    static const char *const statuses[] = {
        "running", "completed", "failed", "requires_reconciliation", "stale", "cancelled"};
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if (strcmp(s, statuses[i]) == 0)
            return 1;
    return 0;
}

int store_execution_status_rare(const char *s)
{
    return s && (strcmp(s, "failed") == 0 || strcmp(s, "requires_reconciliation") == 0 ||
                 strcmp(s, "stale") == 0 || strcmp(s, "cancelled") == 0);
}

int store_execution_list(struct store *s, const char *ws, const char *after, int limit,
                         struct store_execution **items, size_t *n, char **next, struct ifl_err *e)
{
    return store_execution_list_where(s, ws, NULL, after, limit, items, n, next, e);
}

int store_execution_list_where(struct store *s, const char *ws, const struct store_exec_filter *f,
                               const char *after, int limit, struct store_execution **items,
                               size_t *n, char **next, struct ifl_err *e)
{
    static const struct store_exec_filter all = {0};
    int64_t ts = INT64_MAX;
    char id[65];
    memset(id, 'g', 64); /* sorts after every hex id */
    id[64] = '\0';
    *items = NULL;
    *n = 0;
    *next = NULL;
    if (after && *after && cursor_parse(after, &ts, id))
        return err_setp(e, IFL_EINVAL, "/after", "malformed cursor");
    if (limit < 1 || limit > 1000)
        return err_setp(e, IFL_EINVAL, "/limit", "limit must be between 1 and 1000");
    /* Ask for one more row to know whether a next page exists. */
    int rc = s->ops->execution_list(s, ws, f ? f : &all, ts, id, limit + 1, items, n, e);
    if (rc)
        return rc;
    if (*n > (size_t)limit) {
        store_execution_clear(&(*items)[limit]);
        *n = (size_t)limit;
        struct store_execution *last = &(*items)[limit - 1];
        *next = xasprintf("%" PRId64 ".%s", last->created_at, last->id);
    }
    return 0;
}

void store_execution_list_free(struct store_execution *items, size_t n)
{
    if (!items)
        return;
    for (size_t i = 0; i < n; i++)
        store_execution_clear(&items[i]);
    free(items);
}

/* ---- steps, events, transactions ------------------------------------------ */

static const char *const state_names[] = {
    [STEP_PENDING] = "PENDING",
    [STEP_DISPATCHED] = "DISPATCHED",
    [STEP_EXECUTING] = "EXECUTING",
    [STEP_COMPLETED] = "COMPLETED",
    [STEP_SKIPPED] = "SKIPPED",
    [STEP_FAILED] = "FAILED",
    [STEP_REQUIRES_RECONCILIATION] = "REQUIRES_RECONCILIATION",
};

const char *store_step_state_name(enum step_state st)
{
    if ((unsigned)st < sizeof state_names / sizeof state_names[0])
        return state_names[st];
    return "UNKNOWN";
}

int store_step_state_parse(const char *name)
{
    for (size_t i = 0; i < sizeof state_names / sizeof state_names[0]; i++)
        if (name && strcmp(state_names[i], name) == 0)
            return (int)i;
    return -1;
}

void store_step_clear(struct store_step *st)
{
    if (!st)
        return;
    free(st->vertex);
    free(st->workspace);
    free(st->kind);
    free(st->lease_owner);
    free(st->output);
    free(st->error);
    memset(st, 0, sizeof *st);
}

void store_steps_free(struct store_step *v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        store_step_clear(&v[i]);
    free(v);
}

void store_attempts_free(struct store_attempt *v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++) {
        free(v[i].vertex);
        free(v[i].worker);
        free(v[i].outcome);
        free(v[i].error);
    }
    free(v);
}

void store_events_free(struct store_event *v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++) {
        free(v[i].workspace);
        free(v[i].type);
        free(v[i].data);
    }
    free(v);
}

void store_claims_free(struct store_claim *v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++) {
        free(v[i].vertex);
        free(v[i].workspace);
        free(v[i].kind);
    }
    free(v);
}

void store_idem_clear(struct store_idem *r)
{
    if (!r)
        return;
    free(r->fingerprint);
    free(r->response);
    memset(r, 0, sizeof *r);
}

#define ZERO_OUT(items, n)                                                                         \
    do {                                                                                           \
        *(items) = NULL;                                                                           \
        *(n) = 0;                                                                                  \
    } while (0)

int store_steps_get(struct store *s, const char *execution_id, struct store_step **items, size_t *n,
                    struct ifl_err *e)
{
    ZERO_OUT(items, n);
    return s->ops->steps_get(s, execution_id, items, n, e);
}

int store_execution_load(struct store *s, const char *ws, const char *id, struct store_execution *x,
                         struct store_step **items, size_t *n, struct ifl_err *e)
{
    memset(x, 0, sizeof *x);
    ZERO_OUT(items, n);
    if (s->ops->execution_load)
        return s->ops->execution_load(s, ws, id, x, items, n, e);
    int rc = s->ops->execution_get(s, ws, id, x, e);
    if (!rc && (rc = s->ops->steps_get(s, id, items, n, e)))
        store_execution_clear(x);
    return rc;
}

int store_attempts_get(struct store *s, const char *execution_id, struct store_attempt **items,
                       size_t *n, struct ifl_err *e)
{
    ZERO_OUT(items, n);
    return s->ops->attempts_get(s, execution_id, items, n, e);
}

int store_claim(struct store *s, const char *worker, int limit, int64_t now, int64_t lease_ms,
                struct store_claim **items, size_t *n, struct ifl_err *e)
{
    int more;
    return store_claim_noted(s, worker, limit, now, lease_ms, NULL, items, n, &more, e);
}

int store_claim_noted(struct store *s, const char *worker, int limit, int64_t now, int64_t lease_ms,
                      const char *retry_note, struct store_claim **items, size_t *n, int *more,
                      struct ifl_err *e)
{
    ZERO_OUT(items, n);
    *more = 0;
    if (limit <= 0)
        return 0;
    if (limit > STORE_CLAIM_MAX)
        limit = STORE_CLAIM_MAX;
    return s->ops->claim(s, worker, limit, now, lease_ms, retry_note, items, n, more, e);
}

int store_lease_renew(struct store *s, const char *execution_id, const char *vertex, int64_t epoch,
                      int64_t now, int64_t until, int *ok, struct ifl_err *e)
{
    *ok = 0;
    return s->ops->lease_renew(s, execution_id, vertex, epoch, now, until, ok, e);
}

int store_expired(struct store *s, int64_t now, int limit, struct store_step **items, size_t *n,
                  struct ifl_err *e)
{
    ZERO_OUT(items, n);
    return s->ops->expired(s, now, limit, items, n, e);
}

int store_next_due(struct store *s, int64_t *when, struct ifl_err *e)
{
    *when = INT64_MAX;
    return s->ops->next_due(s, when, e);
}

int store_dead_letters(struct store *s, const char *ws, const struct store_dead_cursor *after,
                       int limit, struct store_step **items, size_t *n, struct ifl_err *e)
{
    ZERO_OUT(items, n);
    return s->ops->dead_letters(s, ws, after, limit, items, n, e);
}

int store_events_list(struct store *s, const char *ws, const char *after, int limit,
                      struct store_event **items, size_t *n, struct ifl_err *e)
{
    ZERO_OUT(items, n);
    return s->ops->events_list(s, ws, after, limit, items, n, e);
}

int store_tx_run(struct store *s, store_tx_fn fn, void *arg, struct ifl_err *e)
{
    return s->ops->tx_run(s, fn, arg, e);
}

void store_tx_run_many(struct store *s, store_tx_fn fn, void **args, size_t n, int *rcs,
                       struct ifl_err *errs)
{
    if (n == 0)
        return;
    if (s->ops->tx_run_many) {
        s->ops->tx_run_many(s, fn, args, n, rcs, errs);
        return;
    }
    for (size_t i = 0; i < n; i++)
        rcs[i] = s->ops->tx_run(s, fn, args[i], errs ? &errs[i] : NULL);
}

struct keyed {
    const char *key;
    size_t at; /* index in the caller's arrays (the tie-break: stable) */
};

static int keyed_cmp(const void *a, const void *b)
{
    const struct keyed *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

void store_tx_run_many_ordered(struct store *s, store_tx_fn fn, void **args, store_tx_key_fn key,
                               size_t n, int *rcs, struct ifl_err *errs)
{
    if (n == 0)
        return;
    struct keyed *order = xcalloc(n, sizeof *order);
    void **sorted = xcalloc(n, sizeof *sorted);
    int *srcs = xcalloc(n, sizeof *srcs);
    struct ifl_err *serrs = errs ? xcalloc(n, sizeof *serrs) : NULL;
    for (size_t i = 0; i < n; i++)
        order[i] = (struct keyed){key(args[i]), i};
    qsort(order, n, sizeof *order, keyed_cmp);
    for (size_t i = 0; i < n; i++)
        sorted[i] = args[order[i].at];
    store_tx_run_many(s, fn, sorted, n, srcs, serrs);
    for (size_t i = 0; i < n; i++) {
        rcs[order[i].at] = srcs[i];
        if (errs)
            errs[order[i].at] = serrs[i];
    }
    free(serrs);
    free(srcs);
    free(sorted);
    free(order);
}

int store_can_submit(const struct store *s)
{
    return s->ops->tx_submit != NULL;
}

int store_tx_submit(struct store *s, store_tx_fn fn, void *arg, store_done_fn done, void *done_arg)
{
    if (!s->ops->tx_submit)
        return IFL_EUNSUPPORTED;
    return s->ops->tx_submit(s, fn, arg, done, done_arg);
}

int store_tx_execution_get(struct store_tx *tx, const char *ws, const char *id,
                           struct store_execution *out, struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    return tx->s->ops->tx_execution_get(tx, ws, id, out, e);
}

int store_tx_execution_insert(struct store_tx *tx, const struct store_execution *x, int *created,
                              struct ifl_err *e)
{
    *created = 0;
    return tx->s->ops->tx_execution_insert(tx, x, created, e);
}

int store_tx_execution_set_status(struct store_tx *tx, const char *id, const char *status,
                                  int64_t version, struct ifl_err *e)
{
    return tx->s->ops->tx_execution_set_status(tx, id, status, version, e);
}

int store_tx_execution_started_over(struct store_tx *tx, const char *ws, const char *id,
                                    const char *new_id, char **was, struct ifl_err *e)
{
    *was = NULL;
    return tx->s->ops->tx_execution_started_over(tx, ws, id, new_id, was, e);
}

int store_tx_steps_get(struct store_tx *tx, const char *execution_id, struct store_step **items,
                       size_t *n, struct ifl_err *e)
{
    ZERO_OUT(items, n);
    return tx->s->ops->tx_steps_get(tx, execution_id, items, n, e);
}

int store_tx_execution_load(struct store_tx *tx, const char *ws, const char *id,
                            struct store_execution *x, struct store_step **items, size_t *n,
                            struct ifl_err *e)
{
    memset(x, 0, sizeof *x);
    ZERO_OUT(items, n);
    if (tx->s->ops->tx_execution_load)
        return tx->s->ops->tx_execution_load(tx, ws, id, x, items, n, e);
    int rc = tx->s->ops->tx_execution_get(tx, ws, id, x, e);
    if (!rc && (rc = tx->s->ops->tx_steps_get(tx, id, items, n, e)))
        store_execution_clear(x);
    return rc;
}

int store_tx_step_insert(struct store_tx *tx, const struct store_step *st, struct ifl_err *e)
{
    return tx->s->ops->tx_step_insert(tx, st, e);
}

int store_tx_steps_insert(struct store_tx *tx, const struct store_step *rows, size_t n,
                          struct ifl_err *e)
{
    if (tx->s->ops->tx_steps_insert)
        return tx->s->ops->tx_steps_insert(tx, rows, n, e);
    int rc = 0;
    for (size_t i = 0; !rc && i < n; i++)
        rc = tx->s->ops->tx_step_insert(tx, &rows[i], e);
    return rc;
}

int store_tx_step_update(struct store_tx *tx, const struct store_step *st,
                         enum step_state expect_state, int64_t expect_epoch, int *changed,
                         struct ifl_err *e)
{
    *changed = 0;
    return tx->s->ops->tx_step_update(tx, st, expect_state, expect_epoch, changed, e);
}

int store_tx_attempt_finish(struct store_tx *tx, const char *execution_id, const char *vertex,
                            int64_t epoch, const char *outcome, const char *error,
                            struct ifl_err *e)
{
    return tx->s->ops->tx_attempt_finish(tx, execution_id, vertex, epoch, outcome, error, 1, e);
}

int store_tx_attempt_delete(struct store_tx *tx, const char *execution_id, const char *vertex,
                            int64_t epoch, struct ifl_err *e)
{
    return tx->s->ops->tx_attempt_delete(tx, execution_id, vertex, epoch, e);
}

int store_tx_attempt_note(struct store_tx *tx, const char *execution_id, const char *vertex,
                          int64_t epoch, const char *outcome, struct ifl_err *e)
{
    return tx->s->ops->tx_attempt_finish(tx, execution_id, vertex, epoch, outcome, NULL, 0, e);
}

int store_tx_attempt_record(struct store_tx *tx, const char *execution_id, const char *vertex,
                            int64_t epoch, const char *worker, const char *outcome,
                            struct ifl_err *e)
{
    return tx->s->ops->tx_attempt_record(tx, execution_id, vertex, epoch, worker, outcome, e);
}

int store_tx_event_append(struct store_tx *tx, struct store_event *ev, struct ifl_err *e)
{
    return tx->s->ops->tx_event_append(tx, ev, e);
}

int store_key_in_flight(struct ifl_err *e)
{
    err_set(e, IFL_ECONFLICT,
            "a request with this Idempotency-Key is still in flight; send it again once it "
            "has been answered to get its answer");
    return err_slug(e, "idempotency-key-in-flight");
}

int store_idem_exists(struct store *s, const char *ws, const char *scope, const char *key,
                      int *found, struct ifl_err *e)
{
    *found = 0;
    return s->ops->idem_exists(s, ws, scope, key, found, e);
}

int store_tx_idem_put(struct store_tx *tx, const char *ws, const char *scope, const char *key,
                      const struct store_idem *r, int *created, struct store_idem *existing,
                      struct ifl_err *e)
{
    *created = 0;
    if (existing)
        memset(existing, 0, sizeof *existing);
    return tx->s->ops->tx_idem_put(tx, ws, scope, key, r, created, existing, e);
}

int store_tx_ordering_advance(struct store_tx *tx, const struct store_ordering *o, int *advanced,
                              int *had_last, int64_t *last, struct ifl_err *e)
{
    *advanced = 0;
    *had_last = 0;
    *last = 0;
    return tx->s->ops->tx_ordering_advance(tx, o, advanced, had_last, last, e);
}

int store_tx_ordering_reset(struct store_tx *tx, const struct store_ordering *o, int had_last,
                            int64_t last, struct ifl_err *e)
{
    return tx->s->ops->tx_ordering_reset(tx, o, had_last, last, e);
}

int store_tx_tick_claim(struct store_tx *tx, const struct store_tick *t, int *claimed,
                        int *superseded, struct ifl_err *e)
{
    *claimed = 0;
    *superseded = 0;
    return tx->s->ops->tx_tick_claim(tx, t, claimed, superseded, e);
}

struct latest_args {
    struct store_workflow *items;
    size_t n;
};

static int tx_latest(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct latest_args *a = arg;
    store_workflows_free(a->items, a->n);
    a->items = NULL;
    a->n = 0;
    return tx->s->ops->tx_workflows_latest(tx, &a->items, &a->n, e);
}

int store_workflows_latest(struct store *s, struct store_workflow **items, size_t *n,
                           struct ifl_err *e)
{
    struct latest_args a = {0};
    int rc = store_tx_run(s, tx_latest, &a, e);
    if (rc) {
        store_workflows_free(a.items, a.n);
        a.items = NULL;
        a.n = 0;
    }
    *items = a.items;
    *n = a.n;
    return rc;
}

void store_workflows_free(struct store_workflow *items, size_t n)
{
    for (size_t i = 0; i < n; i++)
        store_workflow_clear(&items[i]);
    free(items);
}

/* One bounded expiry (the backend's tx_ticks_expire or tx_idem_expire) in
 * a transaction of its own. */
struct expire_args {
    int (*op)(struct store_tx *tx, int64_t before, int limit, int *n, struct ifl_err *e);
    int64_t before;
    int limit, n;
};

static int tx_expire(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct expire_args *a = arg;
    a->n = 0;
    return a->op(tx, a->before, a->limit, &a->n, e);
}

static int expire(struct store *s, struct expire_args *a, int *n, struct ifl_err *e)
{
    int rc = store_tx_run(s, tx_expire, a, e);
    *n = rc ? 0 : a->n;
    return rc;
}

int store_ticks_expire(struct store *s, int64_t before, int limit, int *n, struct ifl_err *e)
{
    struct expire_args a = {s->ops->tx_ticks_expire, before, limit, 0};
    return expire(s, &a, n, e);
}

int store_tx_idem_set(struct store_tx *tx, const char *ws, const char *scope, const char *key,
                      const struct store_idem *r, int64_t expect_created_at, int *changed,
                      struct ifl_err *e)
{
    *changed = 0;
    return tx->s->ops->tx_idem_set(tx, ws, scope, key, r, expect_created_at, changed, e);
}

int store_idem_expire(struct store *s, int64_t before, int limit, int *n, struct ifl_err *e)
{
    struct expire_args a = {s->ops->tx_idem_expire, before, limit, 0};
    return expire(s, &a, n, e);
}
