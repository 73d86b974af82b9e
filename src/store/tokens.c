/*
 * tokens — workspace tokens in the store (see store.h, "workspace tokens"),
 * as portable statements (store_sql; subs.c explains them).
 */
#include "base/mem.h"
#include "store/store_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct store_sql q_insert = {
    "token_insert", "INSERT INTO tokens (workspace, id, name, created_at) VALUES (?1, ?2, ?3, ?4)",
    NULL};
static const struct store_sql q_exists = {
    "token_exists", "SELECT 1 FROM tokens WHERE workspace = ?1 AND id = ?2", NULL};
static const struct store_sql q_list = {
    "token_list",
    "SELECT id, name, created_at FROM tokens WHERE workspace = ?1 ORDER BY created_at, id", NULL};
static const struct store_sql q_delete = {
    "token_delete", "DELETE FROM tokens WHERE workspace = ?1 AND id = ?2 RETURNING 1", NULL};

void store_tokens_free(struct store_token *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

int store_tx_token_insert(struct store_tx *tx, const char *ws, const char *id, const char *name,
                          int64_t now, struct ifl_err *e)
{
    struct store_val p[] = {STORE_VAL_S(ws), STORE_VAL_S(id), STORE_VAL_S(name), STORE_VAL_I(now)};
    return tx->s->ops->tx_query(tx, &q_insert, p, 4, NULL, NULL, e);
}

int store_token_exists(struct store *s, const char *ws, const char *id, struct ifl_err *e)
{
    int n = 0;
    struct store_val p[] = {STORE_VAL_S(ws), STORE_VAL_S(id)};
    int rc = s->ops->query(s, &q_exists, p, 2, store_row_count, &n, e);
    if (!rc && !n)
        rc = err_set(e, IFL_ENOTFOUND, "no such token");
    return rc;
}

struct token_rows {
    struct store_token *items;
    size_t n, cap;
};

static int token_row(void *arg, const char *const *c, int nc)
{
    struct token_rows *r = arg;
    if (nc < 3)
        return 0;
    r->items = store_grow(r->items, r->n, &r->cap, sizeof *r->items);
    struct store_token *t = &r->items[r->n++];
    memset(t, 0, sizeof *t);
    if (c[0])
        snprintf(t->id, sizeof t->id, "%s", c[0]);
    t->name = xstrdup(c[1] ? c[1] : "");
    t->created_at = c[2] ? strtoll(c[2], NULL, 10) : 0;
    return 0;
}

int store_token_list(struct store *s, const char *ws, struct store_token **items, size_t *n,
                     struct ifl_err *e)
{
    struct token_rows r = {0};
    struct store_val p[] = {STORE_VAL_S(ws)};
    int rc = s->ops->query(s, &q_list, p, 1, token_row, &r, e);
    if (rc) {
        store_tokens_free(r.items, r.n);
        r = (struct token_rows){0};
    }
    *items = r.items;
    *n = r.n;
    return rc;
}

struct del_args {
    const char *ws, *id;
};

static int tx_delete(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct del_args *a = arg;
    int n = 0;
    struct store_val p[] = {STORE_VAL_S(a->ws), STORE_VAL_S(a->id)};
    int rc = tx->s->ops->tx_query(tx, &q_delete, p, 2, store_row_count, &n, e);
    if (!rc && !n)
        rc = err_set(e, IFL_ENOTFOUND, "no token %s", a->id);
    return rc;
}

int store_token_delete(struct store *s, const char *ws, const char *id, struct ifl_err *e)
{
    struct del_args a = {ws, id};
    return store_tx_run(s, tx_delete, &a, e);
}
