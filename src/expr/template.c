/*
 * template — compile-once, evaluate-many JSON templates (spec §3).
 *
 * The compiled form mirrors the definition: subtrees without expressions or
 * secret references are kept as constants (shared by reference on output),
 * strings starting with `=` hold a compiled expression, and literal strings
 * with `{{ secrets.NAME }}` keep their pieces.  Secret values are fetched at
 * evaluation time through the caller's resolver, substituted as plain text,
 * and never handed to the expression evaluator or put in error messages.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "expr/template.h"
#include "json/json.h"

enum { TN_CONST, TN_EXPR, TN_SECRET, TN_ARR, TN_OBJ };

struct tnode {
    int kind;
    json_t *j;      /* TN_CONST value / TN_SECRET literal (borrowed from def) */
    struct expr *x; /* TN_EXPR */
    char *ptr;      /* JSON Pointer of this member (for errors) */
    struct tnode *kids;
    char **keys; /* TN_OBJ member names */
    size_t n;
};

struct tmpl {
    json_t *def; /* private deep copy */
    struct tnode root;
};

#define SECRET_NAME_MAX TMPL_SECRET_NAME_MAX

/* Finds the next `{{ secrets.NAME }}` in s[from..n).  Returns 1 and the
 * span [*b, *e) and the name span, or 0. */
static int next_secret(const char *s, size_t n, size_t from, size_t *b, size_t *e, size_t *nb,
                       size_t *ne)
{
    for (size_t i = from; i + 1 < n; i++) {
        if (s[i] != '{' || s[i + 1] != '{')
            continue;
        size_t k = i + 2;
        while (k < n && s[k] == ' ')
            k++;
        if (n - k < 8 || memcmp(s + k, "secrets.", 8) != 0)
            continue;
        k += 8;
        size_t st = k;
        while (k < n && (s[k] == '_' || s[k] == '-' || (s[k] >= 'a' && s[k] <= 'z') ||
                         (s[k] >= 'A' && s[k] <= 'Z') || (s[k] >= '0' && s[k] <= '9')))
            k++;
        if (k == st || k - st > SECRET_NAME_MAX)
            continue;
        size_t en = k;
        while (k < n && s[k] == ' ')
            k++;
        if (k + 1 >= n || s[k] != '}' || s[k + 1] != '}')
            continue;
        *b = i;
        *e = k + 2;
        *nb = st;
        *ne = en;
        return 1;
    }
    return 0;
}

int tmpl_secret_ref(const char *s, char *name, size_t cap)
{
    size_t n = strlen(s), b, e, nb, ne;
    if (!next_secret(s, n, 0, &b, &e, &nb, &ne) || b != 0 || e != n || ne - nb >= cap)
        return 0;
    memcpy(name, s + nb, ne - nb);
    name[ne - nb] = '\0';
    return 1;
}

static void node_free(struct tnode *t)
{
    expr_free(t->x);
    free(t->ptr);
    for (size_t i = 0; i < t->n; i++) {
        node_free(&t->kids[i]);
        if (t->keys)
            free(t->keys[i]);
    }
    free(t->kids);
    free(t->keys);
}

static int build(struct tnode *t, json_t *v, struct buf *ptr, int depth, struct ifl_err *err)
{
    memset(t, 0, sizeof *t);
    t->kind = TN_CONST;
    t->j = v;
    t->ptr = xstrdup(ptr->p ? ptr->p : "");
    if (depth > 64)
        return err_setp(err, IFL_EVALIDATION, t->ptr, "template nested too deeply");
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (n > 0 && s[0] == '=') {
            size_t k = 1;
            while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\r'))
                k++;
            struct expr_error xe;
            if (expr_compile(s + k, n - k, &t->x, &xe))
                return err_setp(err, IFL_EVALIDATION, t->ptr,
                                "expression error %s at position %d: %s", xe.code, xe.position,
                                xe.msg);
            t->kind = TN_EXPR;
        } else {
            size_t b, e, nb, ne;
            if (next_secret(s, n, 0, &b, &e, &nb, &ne))
                t->kind = TN_SECRET;
        }
        return 0;
    }
    if (json_is_array(v)) {
        t->n = json_array_size(v);
        t->kids = xcalloc(t->n ? t->n : 1, sizeof *t->kids);
        int dynamic = 0;
        for (size_t i = 0; i < t->n; i++) {
            size_t save = ptr->len;
            char idx[32];
            snprintf(idx, sizeof idx, "%zu", i);
            json_pointer_push(ptr, idx);
            int rc = build(&t->kids[i], json_array_get(v, i), ptr, depth + 1, err);
            ptr->len = save;
            if (ptr->p)
                ptr->p[save] = 0;
            if (rc)
                return rc;
            dynamic |= t->kids[i].kind != TN_CONST;
        }
        if (dynamic)
            t->kind = TN_ARR;
        return 0;
    }
    if (json_is_object(v)) {
        t->n = json_object_size(v);
        t->kids = xcalloc(t->n ? t->n : 1, sizeof *t->kids);
        t->keys = xcalloc(t->n ? t->n : 1, sizeof *t->keys);
        int dynamic = 0;
        size_t i = 0;
        const char *key;
        json_t *m;
        json_object_foreach(v, key, m)
        {
            size_t save = ptr->len;
            json_pointer_push(ptr, key);
            t->keys[i] = xstrdup(key);
            int rc = build(&t->kids[i], m, ptr, depth + 1, err);
            ptr->len = save;
            if (ptr->p)
                ptr->p[save] = 0;
            if (rc) {
                t->n = i + 1;
                return rc;
            }
            dynamic |= t->kids[i].kind != TN_CONST;
            i++;
        }
        if (dynamic)
            t->kind = TN_OBJ;
        return 0;
    }
    return 0;
}

int tmpl_compile(json_t *def, const char *base_pointer, struct tmpl **out, struct ifl_err *err)
{
    *out = NULL;
    struct tmpl *t = xcalloc(1, sizeof *t);
    t->def = json_deep_copy(def ? def : json_null());
    if (!t->def)
        t->def = json_null();
    struct buf ptr;
    buf_init(&ptr, 0);
    buf_puts(&ptr, base_pointer ? base_pointer : "");
    int rc = build(&t->root, t->def, &ptr, 0, err);
    buf_free(&ptr);
    if (rc) {
        tmpl_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void tmpl_free(struct tmpl *t)
{
    if (!t)
        return;
    node_free(&t->root);
    json_decref(t->def);
    free(t);
}

int tmpl_is_constant(const struct tmpl *t)
{
    return t->root.kind == TN_CONST;
}

static const char *secret_ptr(const struct tnode *n)
{
    if (n->kind == TN_SECRET)
        return n->ptr;
    if (n->kind == TN_ARR || n->kind == TN_OBJ)
        for (size_t i = 0; i < n->n; i++) {
            const char *p = secret_ptr(&n->kids[i]);
            if (p)
                return p;
        }
    return NULL;
}

const char *tmpl_secret_pointer(const struct tmpl *t)
{
    return secret_ptr(&t->root);
}

static int subst(const struct tnode *t, tmpl_secret_fn secrets, void *sctx, json_t **out,
                 struct ifl_err *err)
{
    const char *s = json_string_value(t->j);
    size_t n = json_string_length(t->j);
    if (!secrets)
        return err_setp(err, IFL_EVALIDATION, t->ptr, "secrets are not available here");
    struct buf b;
    buf_init(&b, 0);
    size_t pos = 0, bs, es, nb, ne;
    while (next_secret(s, n, pos, &bs, &es, &nb, &ne)) {
        buf_append(&b, s + pos, bs - pos);
        char name[SECRET_NAME_MAX + 1];
        memcpy(name, s + nb, ne - nb);
        name[ne - nb] = 0;
        char *value = NULL;
        int rc = secrets(sctx, name, &value);
        if (rc || !value) {
            free(value);
            buf_free(&b);
            return err_setp(err, rc ? rc : IFL_ENOTFOUND, t->ptr, "secret %s is not defined", name);
        }
        buf_puts(&b, value);
        /* scrub the copy we were handed */
        memset(value, 0, strlen(value));
        free(value);
        pos = es;
    }
    buf_append(&b, s + pos, n - pos);
    *out = json_stringn(b.p ? b.p : "", b.len);
    if (b.p)
        memset(b.p, 0, b.len);
    buf_free(&b);
    return 0;
}

/* Returns 0 and *out (NULL = undefined) or an error. */
static int eval_node(const struct tnode *t, json_t *ctx, tmpl_secret_fn secrets, void *sctx,
                     const struct expr_limits *lim, json_t **out, struct ifl_err *err)
{
    *out = NULL;
    switch (t->kind) {
    case TN_CONST:
        *out = json_incref(t->j);
        return 0;
    case TN_SECRET:
        return subst(t, secrets, sctx, out, err);
    case TN_EXPR: {
        struct expr_error xe;
        if (expr_eval(t->x, ctx, NULL, lim, out, &xe))
            return err_setp(err, IFL_EEXPR, t->ptr, "%s: %s", xe.code, xe.msg);
        return 0;
    }
    case TN_ARR: {
        json_t *a = json_array();
        for (size_t i = 0; i < t->n; i++) {
            json_t *v;
            int rc = eval_node(&t->kids[i], ctx, secrets, sctx, lim, &v, err);
            if (rc) {
                json_decref(a);
                return rc;
            }
            json_array_append_new(a, v ? v : json_null());
        }
        *out = a;
        return 0;
    }
    case TN_OBJ: {
        json_t *o = json_object();
        for (size_t i = 0; i < t->n; i++) {
            json_t *v;
            int rc = eval_node(&t->kids[i], ctx, secrets, sctx, lim, &v, err);
            if (rc) {
                json_decref(o);
                return rc;
            }
            if (v)
                json_object_set_new(o, t->keys[i], v);
        }
        *out = o;
        return 0;
    }
    }
    return err_set(err, IFL_EINTERNAL, "bad template node");
}

int tmpl_eval_lim(const struct tmpl *t, json_t *context, tmpl_secret_fn secrets, void *secrets_ctx,
                  const struct expr_limits *lim, json_t **out, struct ifl_err *err)
{
    json_t *v = NULL;
    int rc = eval_node(&t->root, context, secrets, secrets_ctx, lim, &v, err);
    if (rc) {
        *out = NULL;
        return rc;
    }
    *out = v ? v : json_null();
    return 0;
}

int tmpl_eval(const struct tmpl *t, json_t *context, tmpl_secret_fn secrets, void *secrets_ctx,
              json_t **out, struct ifl_err *err)
{
    return tmpl_eval_lim(t, context, secrets, secrets_ctx, NULL, out, err);
}
