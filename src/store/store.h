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

/* Opens the store named by url: "sqlite:PATH" (or a bare path) or, once
 * that backend lands, "postgres://…".  Applies pending schema migrations.
 * On success *out is owned by the caller (store_close). */
int store_open(const char *url, struct store **out, struct ifl_err *e);
void store_close(struct store *s); /* NULL ok */
/* "sqlite" / "postgres". */
const char *store_backend(const struct store *s);
/* Current schema version (after migrations). */
int store_schema_version(struct store *s, int *version, struct ifl_err *e);
/* Cheap liveness probe used by /readyz. */
int store_ping(struct store *s, struct ifl_err *e);

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
/* version 0 = latest. IFL_ENOTFOUND when absent. */
int store_workflow_get(struct store *s, const char *ws, const char *wf, int version,
                       struct store_workflow *out, struct ifl_err *e);

/* ---- secrets (values arrive already encrypted; the store never sees
 *      plaintext) ------------------------------------------------------ */
/* `sealed` is the ciphertext in text form (see crypto_seal). */
int store_secret_put(struct store *s, const char *ws, const char *name, const char *sealed,
                     struct ifl_err *e);
/* *sealed is a heap string the caller frees. IFL_ENOTFOUND when absent. */
int store_secret_get(struct store *s, const char *ws, const char *name, char **sealed,
                     struct ifl_err *e);
/* *names is a heap array of heap strings, sorted; free with
 * store_strv_free(names, n). */
int store_secret_list(struct store *s, const char *ws, char ***names, size_t *n,
                      struct ifl_err *e);
void store_strv_free(char **v, size_t n);

/* ---- executions --------------------------------------------------------- */
struct store_execution {
    char id[65];
    char *workspace, *workflow, *entry_point;
    int workflow_version;
    char *identity;     /* JSON object text: {"mode": …, …} */
    char *payload;      /* JSON text */
    char payload_hash[65];
    int test;
    char *status;       /* running | completed | failed | requires_reconciliation */
    int64_t version;    /* aggregate version, +1 per change */
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

/* A page of executions, newest first.  `after` is the opaque cursor from a
 * previous page (NULL for the first).  *items is a heap array the caller
 * frees with store_execution_list_free; *next is a heap cursor or NULL at
 * the end.  IFL_EINVAL for a malformed cursor. */
int store_execution_list(struct store *s, const char *ws, const char *after, int limit,
                         struct store_execution **items, size_t *n, char **next,
                         struct ifl_err *e);
void store_execution_list_free(struct store_execution *items, size_t n);

#endif
