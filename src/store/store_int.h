/*
 * store_int.h — the backend table shared by store.c and the backends.
 * Callers outside src/store never include this file.
 */
#ifndef IFL_STORE_STORE_INT_H
#define IFL_STORE_STORE_INT_H

#include "store/store.h"

struct store_ops {
    const char *name;
    void (*close)(struct store *s);
    int (*schema_version)(struct store *s, int *version, struct ifl_err *e);
    int (*ping)(struct store *s, struct ifl_err *e);
    int (*workspace_put)(struct store *s, const char *ws, const char *settings, int *created,
                         struct ifl_err *e);
    int (*workspace_exists)(struct store *s, const char *ws, struct ifl_err *e);
    int (*workflow_put)(struct store *s, const char *ws, const char *wf, const char *def,
                        int *version, struct ifl_err *e);
    int (*workflow_get)(struct store *s, const char *ws, const char *wf, int version,
                        struct store_workflow *out, struct ifl_err *e);
    int (*secret_put)(struct store *s, const char *ws, const char *name, const char *sealed,
                      struct ifl_err *e);
    int (*secret_get)(struct store *s, const char *ws, const char *name, char **sealed,
                      struct ifl_err *e);
    int (*secret_list)(struct store *s, const char *ws, char ***names, size_t *n,
                       struct ifl_err *e);
    int (*execution_create)(struct store *s, const struct store_execution *x, int *created,
                            struct store_execution *existing, struct ifl_err *e);
    int (*execution_get)(struct store *s, const char *ws, const char *id,
                         struct store_execution *out, struct ifl_err *e);
    int (*execution_list)(struct store *s, const char *ws, int64_t after_ts,
                          const char *after_id, int limit, struct store_execution **items,
                          size_t *n, struct ifl_err *e);
};

/* Every backend's handle starts with this. */
struct store {
    const struct store_ops *ops;
};

/* Backend constructors. */
int store_sqlite_open(const char *path, struct store **out, struct ifl_err *e);

/* The schema, as ordered migrations shared by every backend.  Each entry's
 * SQL is portable (TEXT, BIGINT, INTEGER, ON CONFLICT); `sqlite_only` /
 * `pg_only` hold the rare dialect-specific statements. */
struct store_migration {
    int version;
    const char *sql;
};
extern const struct store_migration store_migrations[];
extern const int store_migrations_count;

#endif
