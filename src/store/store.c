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
const struct store_migration store_migrations[] = {
    {1, "CREATE TABLE workspaces ("
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
        " id TEXT PRIMARY KEY,"
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
        "CREATE INDEX executions_by_ws ON executions (workspace, created_at, id);"},
};
const int store_migrations_count = (int)(sizeof store_migrations / sizeof store_migrations[0]);

int store_open(const char *url, struct store **out, struct ifl_err *e)
{
    *out = NULL;
    if (!url || !*url)
        return err_set(e, IFL_EINVAL, "empty database url");
    if (strncmp(url, "postgres://", 11) == 0 || strncmp(url, "postgresql://", 13) == 0)
        return err_set(e, IFL_EUNSUPPORTED, "the PostgreSQL backend is not built yet");
    if (strncmp(url, "sqlite:", 7) == 0)
        url += 7;
    return store_sqlite_open(url, out, e);
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
    return s->ops->workflow_put(s, ws, wf, def, version, e);
}

int store_workflow_get(struct store *s, const char *ws, const char *wf, int version,
                       struct store_workflow *out, struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    return s->ops->workflow_get(s, ws, wf, version, out, e);
}

int store_secret_put(struct store *s, const char *ws, const char *name, const char *sealed,
                     struct ifl_err *e)
{
    return s->ops->secret_put(s, ws, name, sealed, e);
}

int store_secret_get(struct store *s, const char *ws, const char *name, char **sealed,
                     struct ifl_err *e)
{
    *sealed = NULL;
    return s->ops->secret_get(s, ws, name, sealed, e);
}

int store_secret_list(struct store *s, const char *ws, char ***names, size_t *n,
                      struct ifl_err *e)
{
    *names = NULL;
    *n = 0;
    return s->ops->secret_list(s, ws, names, n, e);
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

int store_execution_create(struct store *s, const struct store_execution *x, int *created,
                           struct store_execution *existing, struct ifl_err *e)
{
    if (existing)
        memset(existing, 0, sizeof *existing);
    *created = 0;
    return s->ops->execution_create(s, x, created, existing, e);
}

int store_execution_get(struct store *s, const char *ws, const char *id,
                        struct store_execution *out, struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    return s->ops->execution_get(s, ws, id, out, e);
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

int store_execution_list(struct store *s, const char *ws, const char *after, int limit,
                         struct store_execution **items, size_t *n, char **next,
                         struct ifl_err *e)
{
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
    int rc = s->ops->execution_list(s, ws, ts, id, limit + 1, items, n, e);
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
