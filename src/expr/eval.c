/*
 * eval — the JSONata evaluator and the public compile/evaluate API.
 *
 * A port of jsonata-js 2.x evaluate(): the same sequence rules (singleton
 * sequences collapse, constructed arrays never flatten, keepSingleton),
 * tuple streams for the @, # and % operators, tail calls as thunks run by a
 * trampoline in apply().  Every evaluate step counts one level of depth like
 * the reference, so the suite's `depth` bounds mean the same thing here.
 *
 * Never: write to the compiled tree or to the caller's jansson values; all
 * state lives in the per-evaluation struct ctx and its arena.
 */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "expr/expr_int.h"

/* ---- environments ---- */

struct env *env_new(struct ctx *c, struct env *parent)
{
    struct env *e = cx_alloc(c, sizeof *e);
    e->parent = parent;
    e->b = NULL;
    e->n = e->cap = 0;
    return e;
}

void env_bind(struct ctx *c, struct env *e, const char *name, uint32_t nlen, val *v)
{
    for (uint32_t i = 0; i < e->n; i++) {
        if (e->b[i].nlen == nlen && !memcmp(e->b[i].name, name, nlen)) {
            e->b[i].v = v;
            return;
        }
    }
    if (e->n == e->cap) {
        uint32_t nc = e->cap ? e->cap * 2 : 4;
        struct bind *nb = cx_alloc(c, sizeof *nb * nc);
        if (e->n)
            memcpy(nb, e->b, sizeof *nb * e->n);
        e->b = nb;
        e->cap = nc;
    }
    e->b[e->n].name = name;
    e->b[e->n].nlen = nlen;
    e->b[e->n].v = v;
    e->n++;
}

static val *mkbuiltin(struct ctx *c, int i)
{
    struct fnv *f = cx_alloc(c, sizeof *f);
    memset(f, 0, sizeof *f);
    f->kind = FK_BUILTIN;
    f->bi = &expr_builtins[i];
    f->sig = builtin_sig(i);
    return mkfn(c, f);
}

/* Looks name up through the frames, the caller's bindings, then the
 * built-in functions.  bi: the builtin index resolved at compile time, or
 * -2 when unknown (search by name). */
static val *lookup2(struct ctx *c, struct env *e, const char *name, uint32_t nlen, int bi,
                    int *found)
{
    *found = 1;
    for (; e; e = e->parent) {
        for (uint32_t i = 0; i < e->n; i++)
            if (e->b[i].nlen == nlen && !memcmp(e->b[i].name, name, nlen))
                return e->b[i].v;
    }
    if (c->bindings) {
        json_t *j = json_object_getn(c->bindings, name, nlen);
        if (j)
            return wrapj(c, j);
    }
    if (bi == -2)
        bi = builtin_find(name, nlen);
    if (bi >= 0)
        return mkbuiltin(c, bi);
    *found = 0;
    return NULL;
}

val *env_lookup(struct ctx *c, struct env *e, const char *name, uint32_t nlen)
{
    int found;
    return lookup2(c, e, name, nlen, -2, &found);
}

/* ---- helpers ---- */

static val *copyhdr(struct ctx *c, val *v, int flags)
{
    val *r = cx_alloc(c, sizeof *r);
    *r = *v;
    r->f = (uint8_t)flags;
    return r;
}

static int numeric(struct ctx *c, val *v)
{
    if (!v || v->t != T_NUM)
        return 0;
    if (isnan(v->u.num))
        return 0;
    if (!isfinite(v->u.num))
        ethrow(c, "D1001", -1, NULL, NULL);
    return 1;
}

static int array_of_numbers(struct ctx *c, val *v)
{
    if (!is_arr(v))
        return 0;
    for (uint32_t i = 0; i < v->n; i++)
        if (!numeric(c, aget(c, v, i)))
            return 0;
    return 1;
}

static int strict_eq(val *a, val *b)
{
    if (a == b)
        return 1;
    if (!a || !b || a->t != b->t)
        return 0;
    switch (a->t) {
    case T_NULL:
        return 1;
    case T_BOOL:
        return a->u.b == b->u.b;
    case T_NUM:
        return a->u.num == b->u.num;
    case T_STR:
        return a->n == b->n && !memcmp(a->u.s, b->u.s, a->n);
    case T_JARR:
    case T_JOBJ:
        return a->u.j == b->u.j;
    case T_FUNC:
        return a->u.fn == b->u.fn;
    default:
        return 0;
    }
}

static val *lookup_field(struct ctx *c, val *input, const char *k, uint32_t klen, int depth)
{
    if (!input)
        return NULL;
    if (is_arr(input)) {
        if (depth > 2000)
            ethrow(c, "U1001", -1, NULL, "value nested too deeply");
        struct vec r = {0};
        for (uint32_t i = 0; i < input->n; i++) {
            val *res = lookup_field(c, aget(c, input, i), k, klen, depth + 1);
            if (!res)
                continue;
            if (is_arr(res)) {
                for (uint32_t j = 0; j < res->n; j++)
                    vec_push(c, &r, aget(c, res, j));
            } else {
                vec_push(c, &r, res);
            }
        }
        return vec_done(c, &r, F_SEQ);
    }
    if (is_obj(input))
        return oget(c, input, k, klen);
    return NULL;
}

static val *tuple_get(struct ctx *c, val *t, const char *k)
{
    return oget(c, t, k, strlen(k));
}

static struct env *frame_from_tuple(struct ctx *c, struct env *env, val *tuple)
{
    struct env *f = env_new(c, env);
    struct obj *o = omat(c, tuple);
    for (uint32_t i = 0; i < o->n; i++)
        env_bind(c, f, o->kv[i].k, o->kv[i].klen, o->kv[i].v);
    return f;
}

static val *tuple_clone(struct ctx *c, val *t)
{
    val *r = mkobj(c);
    struct obj *o = omat(c, t);
    for (uint32_t i = 0; i < o->n; i++)
        oset(c, r, o->kv[i].k, o->kv[i].klen, o->kv[i].v);
    return r;
}

static val *eval_filter(struct ctx *c, struct node *pred, val *input, struct env *env);
static val *eval_group(struct ctx *c, struct node *g, val *input, struct env *env);
static val *eval_sort(struct ctx *c, struct node *e, val *input, struct env *env);
static val *eval_function(struct ctx *c, struct node *e, val *input, struct env *env, val *applyto,
                          int has_applyto);
static val *apply_inner(struct ctx *c, val *proc, val **args, int n, val *input, struct env *env,
                        int pos, const char *token);

/* ---- paths ---- */

static val *eval_step(struct ctx *c, struct node *step, val *input, struct env *env, int last)
{
    if (step->type == N_SORT) {
        val *r = eval_sort(c, step, input, env);
        for (uint32_t s = 0; s < step->nstages; s++)
            if (!step->stages[s].is_index)
                r = eval_filter(c, step->stages[s].expr, r, env);
        return r;
    }
    struct vec res = {0};
    for (uint32_t i = 0; i < input->n; i++) {
        val *r = ev(c, step, aget(c, input, i), env);
        for (uint32_t s = 0; s < step->nstages; s++)
            r = eval_filter(c, step->stages[s].expr, r, env);
        if (r)
            vec_push(c, &res, r);
    }
    if (last && res.n == 1 && is_arr(res.v[0]) && !is_seq(res.v[0]))
        return res.v[0];
    /* flatten one level */
    int simple = 1;
    for (uint32_t i = 0; i < res.n; i++)
        if (is_arr(res.v[i]) && !(res.v[i]->f & F_CONS)) {
            simple = 0;
            break;
        }
    if (simple)
        return vec_done(c, &res, F_SEQ);
    struct vec out = {0};
    for (uint32_t i = 0; i < res.n; i++) {
        val *r = res.v[i];
        if (!is_arr(r) || (r->f & F_CONS)) {
            vec_push(c, &out, r);
        } else {
            for (uint32_t j = 0; j < r->n; j++)
                vec_push(c, &out, aget(c, r, j));
        }
    }
    return vec_done(c, &out, F_SEQ);
}

static val *eval_stages(struct ctx *c, struct node *step, val *input, struct env *env)
{
    val *r = input;
    for (uint32_t s = 0; s < step->nstages; s++) {
        struct stage *st = &step->stages[s];
        if (!st->is_index) {
            r = eval_filter(c, st->expr, r, env);
        } else if (r) {
            for (uint32_t i = 0; i < r->n; i++)
                oset(c, aget(c, r, i), st->name, st->nlen, mknum(c, i));
        }
    }
    return r;
}

static val *eval_tuple_step(struct ctx *c, struct node *step, val *input, val *tb, struct env *env)
{
    if (step->type == N_SORT) {
        val *r;
        if (tb) {
            r = eval_sort(c, step, tb, env);
        } else {
            val *sorted = eval_sort(c, step, input, env);
            struct vec out = {0};
            for (uint32_t i = 0; sorted && i < sorted->n; i++) {
                val *t = mkobj(c);
                oset(c, t, "@", 1, aget(c, sorted, i));
                if (step->index)
                    oset(c, t, step->index, step->indexlen, mknum(c, i));
                vec_push(c, &out, t);
            }
            r = vec_done(c, &out, F_SEQ | F_TUPLE);
        }
        return eval_stages(c, step, r, env);
    }
    if (!tb) {
        struct vec t = {0};
        for (uint32_t i = 0; i < input->n; i++) {
            val *o = mkobj(c);
            oset(c, o, "@", 1, aget(c, input, i));
            vec_push(c, &t, o);
        }
        tb = vec_done(c, &t, F_SEQ | F_TUPLE);
    }
    struct vec out = {0};
    for (uint32_t e = 0; e < tb->n; e++) {
        val *tuple = aget(c, tb, e);
        struct env *stepenv = frame_from_tuple(c, env, tuple);
        val *res = ev(c, step, tuple_get(c, tuple, "@"), stepenv);
        if (!res)
            continue;
        if (!is_arr(res))
            res = mkseq1(c, res);
        for (uint32_t b = 0; b < res->n; b++) {
            val *t = tuple_clone(c, tuple);
            val *rb = aget(c, res, b);
            if (res->f & F_TUPLE) {
                struct obj *o = omat(c, rb);
                for (uint32_t k = 0; k < o->n; k++)
                    oset(c, t, o->kv[k].k, o->kv[k].klen, o->kv[k].v);
            } else {
                if (step->focus) {
                    oset(c, t, step->focus, step->focuslen, rb);
                    oset(c, t, "@", 1, tuple_get(c, tuple, "@"));
                } else {
                    oset(c, t, "@", 1, rb);
                }
                if (step->index)
                    oset(c, t, step->index, step->indexlen, mknum(c, b));
                if (step->ancestor)
                    oset(c, t, step->ancestor->label, strlen(step->ancestor->label),
                         tuple_get(c, tuple, "@"));
            }
            vec_push(c, &out, t);
        }
    }
    val *r = vec_done(c, &out, F_SEQ | F_TUPLE);
    return eval_stages(c, step, r, env);
}

static int simple_name(const struct node *s)
{
    return s->type == N_NAME && !s->nstages && !s->npreds && !s->group && !s->focus && !s->index &&
           !s->tuple && !s->keep_array && !s->ancestor;
}

static val *eval_path(struct ctx *c, struct node *e, val *input, struct env *env)
{
    val *in;
    if (!e->keep_singleton && !e->group && is_obj(input) && simple_name(e->kids[0])) {
        /* Fast path for a.b.c over objects: the general algorithm below
         * would wrap each single value in a one-item sequence and unwrap
         * it again, with the same result. */
        val *cur = input;
        uint32_t i = 0;
        while (i < e->nkids && simple_name(e->kids[i]) && is_obj(cur)) {
            if (c->depth + 1 > c->max_depth)
                ethrow(c, "U1001", e->kids[i]->pos, NULL, NULL);
            val *v = oget(c, cur, e->kids[i]->name, e->kids[i]->nlen);
            if (!v)
                return NULL;
            if (is_arr(v)) {
                if (i == e->nkids - 1 && !is_seq(v))
                    return v;
                break;
            }
            cur = v;
            i++;
        }
        if (i == e->nkids)
            return cur;
        /* continue generally from step i with the current object */
        struct node sub = *e;
        sub.kids = e->kids + i;
        sub.nkids = e->nkids - i;
        if (i > 0) {
            return eval_path(c, &sub, mkseq1(c, cur), env);
        }
    }
    if (is_arr(input) && e->kids[0]->type != N_VARIABLE)
        in = input;
    else
        in = mkseq1(c, input);
    val *rs = NULL, *tb = NULL;
    int tuple = 0;
    for (uint32_t i = 0; i < e->nkids; i++) {
        struct node *step = e->kids[i];
        if (step->tuple)
            tuple = 1;
        if (i == 0 && step->consarray) {
            rs = ev(c, step, in, env);
        } else if (tuple) {
            tb = eval_tuple_step(c, step, in, tb, env);
        } else {
            rs = eval_step(c, step, in, env, i == e->nkids - 1);
        }
        if (!tuple && (!rs || (is_arr(rs) && rs->n == 0)))
            break;
        if (!step->focus)
            in = rs;
        if (in && !is_arr(in))
            in = mkseq1(c, in);
    }
    if (tuple) {
        if (e->tuple) {
            rs = tb;
        } else {
            struct vec out = {0};
            for (uint32_t i = 0; tb && i < tb->n; i++)
                vec_push(c, &out, tuple_get(c, aget(c, tb, i), "@"));
            rs = vec_done(c, &out, F_SEQ);
        }
    }
    if (e->keep_singleton && rs) {
        if (is_arr(rs) && (rs->f & F_CONS) && !(rs->f & F_SEQ))
            rs = mkseq1(c, rs);
        else if (!is_arr(rs))
            rs = mkseq1(c, rs);
        if (rs->t == T_JARR)
            amat(c, rs);
        rs->f |= F_KEEP;
    }
    if (e->group)
        rs = eval_group(c, e->group, tuple ? tb : rs, env);
    return rs;
}

/* ---- predicates ---- */

static val *eval_filter(struct ctx *c, struct node *pred, val *input, struct env *env)
{
    int tup = input && is_arr(input) && (input->f & F_TUPLE);
    if (!is_arr(input))
        input = mkseq1(c, input);
    if (pred->type == N_NUMBER) {
        double d = floor(pred->num);
        if (d < 0)
            d += input->n;
        if (d < 0 || d >= input->n)
            return mkarr(c, NULL, 0, F_SEQ | (tup ? F_TUPLE : 0));
        val *item = aget(c, input, (uint32_t)d);
        if (!item)
            return mkarr(c, NULL, 0, F_SEQ | (tup ? F_TUPLE : 0));
        if (is_arr(item))
            return item;
        val *r = mkseq1(c, item);
        if (tup)
            r->f |= F_TUPLE;
        return r;
    }
    struct vec out = {0};
    for (uint32_t idx = 0; idx < input->n; idx++) {
        val *item = aget(c, input, idx);
        val *context = item;
        struct env *fenv = env;
        if (tup) {
            context = tuple_get(c, item, "@");
            fenv = frame_from_tuple(c, env, item);
        }
        val *res = ev(c, pred, context, fenv);
        if (numeric(c, res))
            res = mkseq1(c, res);
        if (array_of_numbers(c, res)) {
            for (uint32_t k = 0; k < res->n; k++) {
                double ii = floor(aget(c, res, k)->u.num);
                if (ii < 0)
                    ii += input->n;
                if (ii == (double)idx)
                    vec_push(c, &out, item);
            }
        } else if (val_truthy(c, res, NULL)) {
            vec_push(c, &out, item);
        }
    }
    return vec_done(c, &out, F_SEQ | (tup ? F_TUPLE : 0));
}

/* ---- operators ---- */

static int cmp_str(val *a, val *b)
{
    uint32_t n = a->n < b->n ? a->n : b->n;
    int r = memcmp(a->u.s, b->u.s, n);
    if (r)
        return r;
    return a->n < b->n ? -1 : a->n > b->n;
}

static val *eval_binary(struct ctx *c, struct node *e, val *input, struct env *env)
{
    val *lhs = ev(c, e->lhs, input, env);
    int op = e->op;
    if (op == OP_AND || op == OP_OR) {
        int l = val_truthy(c, lhs, NULL);
        if (op == OP_AND)
            return VBOOL(l && val_truthy(c, ev(c, e->rhs, input, env), NULL));
        return VBOOL(l || val_truthy(c, ev(c, e->rhs, input, env), NULL));
    }
    val *rhs = ev(c, e->rhs, input, env);
    switch (op) {
    case OP_ADD:
    case OP_SUB:
    case OP_MUL:
    case OP_DIV:
    case OP_MOD: {
        if (lhs && !numeric(c, lhs))
            ethrow(c, "T2001", e->pos, e->name, NULL);
        if (rhs && !numeric(c, rhs))
            ethrow(c, "T2002", e->pos, e->name, NULL);
        if (!lhs || !rhs)
            return NULL;
        double a = lhs->u.num, b = rhs->u.num, r = 0;
        switch (op) {
        case OP_ADD:
            r = a + b;
            break;
        case OP_SUB:
            r = a - b;
            break;
        case OP_MUL:
            r = a * b;
            break;
        case OP_DIV:
            r = a / b;
            break;
        default:
            r = fmod(a, b);
            break;
        }
        return mknum(c, r);
    }
    case OP_EQ:
    case OP_NE: {
        if (!lhs || !rhs)
            return VFALSE;
        int eq = val_deep_equal(c, lhs, rhs, 0);
        return VBOOL(op == OP_EQ ? eq : !eq);
    }
    case OP_LT:
    case OP_LE:
    case OP_GT:
    case OP_GE: {
        int lc = !lhs || lhs->t == T_STR || lhs->t == T_NUM;
        int rc = !rhs || rhs->t == T_STR || rhs->t == T_NUM;
        if (!lc || !rc)
            ethrow(c, "T2010", e->pos, e->name, NULL);
        if (!lhs || !rhs)
            return NULL;
        if (lhs->t != rhs->t)
            ethrow(c, "T2009", e->pos, e->name, NULL);
        int r;
        if (lhs->t == T_NUM) {
            double a = lhs->u.num, b = rhs->u.num;
            r = op == OP_LT ? a < b : op == OP_LE ? a <= b : op == OP_GT ? a > b : a >= b;
        } else {
            int k = cmp_str(lhs, rhs);
            r = op == OP_LT ? k < 0 : op == OP_LE ? k <= 0 : op == OP_GT ? k > 0 : k >= 0;
        }
        return VBOOL(r);
    }
    case OP_CONCAT: {
        uint32_t la = 0, lb = 0;
        const char *sa = lhs ? val_string(c, lhs, 0, &la) : "";
        const char *sb2 = rhs ? val_string(c, rhs, 0, &lb) : "";
        char *p = cx_alloc(c, (size_t)la + lb + 1);
        memcpy(p, sa, la);
        memcpy(p + la, sb2, lb);
        p[la + lb] = 0;
        return mkstr_nocopy(c, p, (size_t)la + lb);
    }
    case OP_RANGE: {
        if (lhs && (lhs->t != T_NUM || !num_is_int(lhs->u.num)))
            ethrow(c, "T2003", e->pos, "..", NULL);
        if (rhs && (rhs->t != T_NUM || !num_is_int(rhs->u.num)))
            ethrow(c, "T2004", e->pos, "..", NULL);
        if (!lhs || !rhs)
            return NULL;
        double a = lhs->u.num, b = rhs->u.num;
        if (a > b)
            return NULL;
        double size = b - a + 1;
        if (size > 1e7)
            ethrow(c, "D2014", e->pos, "..", "size %.0f", size);
        val *r = mkarr(c, NULL, (uint32_t)size, F_SEQ | F_RANGE);
        r->u.num = a;
        return r;
    }
    case OP_IN: {
        if (!lhs || !rhs)
            return VFALSE;
        if (!is_arr(rhs))
            return VBOOL(strict_eq(rhs, lhs));
        for (uint32_t i = 0; i < rhs->n; i++) {
            val *it = aget(c, rhs, i);
            /* the items may all be one long string: count its bytes */
            cx_tickn(c, 1 + (is_str(it) && is_str(lhs) && it->n == lhs->n ? it->n : 0) /
                                CX_TICK_BYTES);
            if (strict_eq(it, lhs))
                return VTRUE;
        }
        return VFALSE;
    }
    }
    return NULL;
}

static val *eval_array(struct ctx *c, struct node *e, val *input, struct env *env)
{
    int flags = e->consarray ? F_CONS : 0;
    if (e->nkids == 1 && e->kids[0]->type != N_ARRAY) {
        val *v = ev(c, e->kids[0], input, env);
        if (!v)
            return mkarr(c, NULL, 0, flags);
        if (is_arr(v))
            return copyhdr(c, v, (v->f & F_RANGE) | flags);
        val *r = mkseq1(c, v);
        r->f = (uint8_t)flags;
        return r;
    }
    struct vec out = {0};
    for (uint32_t i = 0; i < e->nkids; i++) {
        val *v = ev(c, e->kids[i], input, env);
        if (!v)
            continue;
        if (e->kids[i]->type == N_ARRAY || !is_arr(v)) {
            vec_push(c, &out, v);
        } else {
            for (uint32_t j = 0; j < v->n; j++)
                vec_push(c, &out, aget(c, v, j));
        }
    }
    return vec_done(c, &out, flags);
}

/* ---- group / object constructor ---- */

struct gent {
    struct vec items;
    int expr;
};

static val *reduce_tuples(struct ctx *c, val *ts)
{
    if (!is_arr(ts))
        return ts;
    val *r = tuple_clone(c, aget(c, ts, 0));
    for (uint32_t i = 1; i < ts->n; i++) {
        struct obj *o = omat(c, aget(c, ts, i));
        for (uint32_t k = 0; k < o->n; k++)
            oset(c, r, o->kv[k].k, o->kv[k].klen,
                 append(c, oget(c, r, o->kv[k].k, o->kv[k].klen), o->kv[k].v));
    }
    return r;
}

static val *eval_group(struct ctx *c, struct node *g, val *input, struct env *env)
{
    val *result = mkobj(c);
    int reduce = input && is_arr(input) && (input->f & F_TUPLE);
    if (!is_arr(input))
        input = mkseq1(c, input);
    uint32_t nin = input->n;
    if (nin == 0 && !reduce) {
        input = mkseq1(c, NULL);
        nin = 1;
    }
    val *keys = mkobj(c); /* key -> index into ents */
    struct gent *ents = NULL;
    uint32_t nents = 0, capents = 0;
    for (uint32_t ii = 0; ii < nin; ii++) {
        val *item = aget(c, input, ii);
        struct env *genv = reduce ? frame_from_tuple(c, env, item) : env;
        for (uint32_t p = 0; p < g->npairs; p++) {
            val *key = ev(c, g->pairs[2 * p], reduce ? tuple_get(c, item, "@") : item, genv);
            if (key && key->t != T_STR)
                ethrow(c, "T1003", g->pos, NULL, NULL);
            if (!key)
                continue;
            val *slot = oget(c, keys, key->u.s, key->n);
            if (slot) {
                struct gent *ge = &ents[(uint32_t)slot->u.num];
                if (ge->expr != (int)p)
                    ethrow(c, "D1009", g->pos, NULL, NULL);
                vec_push(c, &ge->items, item);
            } else {
                if (nents == capents) {
                    uint32_t nc = capents ? capents * 2 : 8;
                    struct gent *ne = cx_alloc(c, sizeof *ne * nc);
                    if (nents)
                        memcpy(ne, ents, sizeof *ne * nents);
                    ents = ne;
                    capents = nc;
                }
                memset(&ents[nents], 0, sizeof ents[nents]);
                ents[nents].expr = (int)p;
                vec_push(c, &ents[nents].items, item);
                oset(c, keys, key->u.s, key->n, mknum(c, nents));
                nents++;
            }
        }
    }
    struct obj *ko = omat(c, keys);
    for (uint32_t k = 0; k < ko->n; k++) {
        struct gent *ge = &ents[(uint32_t)ko->kv[k].v->u.num];
        val *data;
        if (ge->items.n == 1) {
            data = ge->items.v[0];
        } else {
            data = NULL;
            struct vec all = {0};
            for (uint32_t i = 0; i < ge->items.n; i++) {
                val *it = ge->items.v[i];
                if (is_arr(it))
                    for (uint32_t j = 0; j < it->n; j++)
                        vec_push(c, &all, aget(c, it, j));
                else
                    vec_push(c, &all, it);
            }
            data = vec_done(c, &all, 0);
        }
        val *context = data;
        struct env *genv = env;
        if (reduce) {
            val *tuple = reduce_tuples(c, data);
            context = tuple_get(c, tuple, "@");
            odel(c, tuple, "@", 1);
            genv = frame_from_tuple(c, env, tuple);
        }
        val *v = ev(c, g->pairs[2 * ge->expr + 1], context, genv);
        if (v)
            oset(c, result, ko->kv[k].k, ko->kv[k].klen, v);
    }
    return result;
}

/* ---- wildcards ---- */

static val *eval_wildcard(struct ctx *c, val *input)
{
    if (input && is_arr(input) && (input->f & F_OUTER) && input->n > 0)
        input = aget(c, input, 0);
    struct vec out = {0};
    int seq = 1;
    if (is_arr(input)) { /* Object.keys of an array: its elements */
        for (uint32_t i = 0; i < input->n; i++) {
            val *v = aget(c, input, i);
            if (is_arr(v)) {
                flatten_into(c, v, &out, 0);
                seq = 0;
            } else {
                vec_push(c, &out, v);
            }
        }
    } else if (is_obj(input)) {
        struct obj *o = omat(c, input);
        for (uint32_t i = 0; i < o->n; i++) {
            val *v = o->kv[i].v;
            if (is_arr(v)) {
                flatten_into(c, v, &out, 0);
                seq = 0;
            } else {
                vec_push(c, &out, v);
            }
        }
    }
    return vec_done(c, &out, seq ? F_SEQ : 0);
}

static void descend(struct ctx *c, val *v, struct vec *out, int depth)
{
    if (depth > 2000)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    if (!v)
        return;
    if (!is_arr(v))
        vec_push(c, out, v);
    if (is_arr(v)) {
        for (uint32_t i = 0; i < v->n; i++)
            descend(c, aget(c, v, i), out, depth + 1);
    } else if (is_obj(v)) {
        struct obj *o = omat(c, v);
        for (uint32_t i = 0; i < o->n; i++)
            descend(c, o->kv[i].v, out, depth + 1);
    }
}

/* ---- sort ---- */

struct sortctx {
    struct ctx *c;
    struct node *e;
    struct env *env;
    int tuple;
    val *fn; /* comparator function for $sort, or NULL */
};

static int sort_gt(struct sortctx *s, val *a, val *b)
{
    struct ctx *c = s->c;
    cx_tick(c);
    if (s->fn) {
        val *args[2] = {a, b};
        val *r = apply_fn(c, s->fn, args, 2, NULL, s->env);
        return val_truthy(c, r, NULL);
    }
    if (!s->e) { /* natural order for $sort */
        if (a->t == T_NUM)
            return a->u.num > b->u.num;
        cx_tickn(c, (a->n < b->n ? a->n : b->n) / CX_TICK_BYTES);
        return cmp_str(a, b) > 0;
    }
    int comp = 0;
    for (uint32_t t = 0; comp == 0 && t < s->e->nkids; t++) {
        struct node *term = s->e->kids[t];
        val *ca = a, *cb = b;
        struct env *ea = s->env, *eb = s->env;
        if (s->tuple) {
            ca = tuple_get(c, a, "@");
            ea = frame_from_tuple(c, s->env, a);
            cb = tuple_get(c, b, "@");
            eb = frame_from_tuple(c, s->env, b);
        }
        val *aa = ev(c, term->lhs, ca, ea);
        val *bb = ev(c, term->lhs, cb, eb);
        if (!aa) {
            comp = bb ? 1 : 0;
            continue;
        }
        if (!bb) {
            comp = -1;
            continue;
        }
        if ((aa->t != T_STR && aa->t != T_NUM) || (bb->t != T_STR && bb->t != T_NUM))
            ethrow(c, "T2008", s->e->pos, NULL, NULL);
        if (aa->t != bb->t)
            ethrow(c, "T2007", s->e->pos, NULL, NULL);
        int k;
        if (aa->t == T_NUM)
            k = aa->u.num == bb->u.num ? 0 : aa->u.num < bb->u.num ? -1 : 1;
        else
            k = cmp_str(aa, bb);
        if (k == 0)
            continue;
        comp = k < 0 ? -1 : 1;
        if (term->descending)
            comp = -comp;
    }
    return comp == 1;
}

static void msort(struct sortctx *s, val **a, val **tmp, uint32_t n)
{
    if (n <= 1)
        return;
    uint32_t mid = n / 2;
    msort(s, a, tmp, mid);
    msort(s, a + mid, tmp, n - mid);
    uint32_t i = 0, j = mid, k = 0;
    while (i < mid && j < n) {
        if (sort_gt(s, a[i], a[j]))
            tmp[k++] = a[j++];
        else
            tmp[k++] = a[i++];
    }
    while (i < mid)
        tmp[k++] = a[i++];
    while (j < n)
        tmp[k++] = a[j++];
    memcpy(a, tmp, sizeof *a * n);
}

val *sort_values(struct ctx *c, val *arr, val *fn, struct env *env);
val *sort_values(struct ctx *c, val *arr, val *fn, struct env *env)
{
    struct sortctx s = {c, NULL, env, 0, fn};
    uint32_t n = arr->n;
    val **items = cx_alloc(c, sizeof *items * (n ? n : 1));
    val **tmp = cx_alloc(c, sizeof *tmp * (n ? n : 1));
    for (uint32_t i = 0; i < n; i++)
        items[i] = aget(c, arr, i);
    msort(&s, items, tmp, n);
    return mkarr(c, items, n, 0);
}

static val *eval_sort(struct ctx *c, struct node *e, val *input, struct env *env)
{
    if (!input)
        return NULL;
    int tuple = is_arr(input) && (input->f & F_TUPLE);
    if (!is_arr(input) || input->n <= 1)
        return input;
    struct sortctx s = {c, e, env, tuple, NULL};
    uint32_t n = input->n;
    val **items = cx_alloc(c, sizeof *items * n);
    val **tmp = cx_alloc(c, sizeof *tmp * n);
    for (uint32_t i = 0; i < n; i++)
        items[i] = aget(c, input, i);
    msort(&s, items, tmp, n);
    return mkarr(c, items, n, F_SEQ | (tuple ? F_TUPLE : 0));
}

/* ---- functions ---- */

int fn_arity(val *f)
{
    struct fnv *fn = f->u.fn;
    switch (fn->kind) {
    case FK_LAMBDA:
        return (int)fn->nparams;
    case FK_BUILTIN:
        return fn->bi->arity;
    case FK_PARTIAL: {
        int k = 0;
        for (int i = 0; i < fn->npargs; i++)
            k += fn->hole[i];
        return k;
    }
    case FK_REGEX:
        return 2;
    default:
        return 1;
    }
}

static val *mklambda(struct ctx *c, struct node *lam, val *input, struct env *env)
{
    struct fnv *f = cx_alloc(c, sizeof *f);
    memset(f, 0, sizeof *f);
    f->kind = FK_LAMBDA;
    f->lam = lam;
    f->params = lam->kids;
    f->nparams = lam->nkids;
    f->input = input;
    f->env = env;
    f->thunk = lam->thunk;
    f->sig = lam->sig;
    return mkfn(c, f);
}

struct rxstate {
    const struct regex *re;
};

/* Calls a regex "matcher" as the reference's closure(str, fromIndex) would:
 * returns the match object {match, start, end, groups} or undefined.  cpc:
 * the caller's cache for a run of matches in str, or NULL. */
val *regex_match_obj(struct ctx *c, const struct regex *re, val *str, long from, long *endpos,
                     struct cpcache *cpc);
val *regex_match_obj(struct ctx *c, const struct regex *re, val *str, long from, long *endpos,
                     struct cpcache *cpc)
{
    struct cpcache one = {0};
    if (!cpc)
        cpc = &one;
    int ng = regex_ngroups(re);
    long *caps = cx_alloc(c, sizeof *caps * (size_t)(2 * ng + 2));
    if (!regex_exec(c, re, str->u.s, str->n, (size_t)from, caps))
        return NULL;
    val *o = mkobj(c);
    oset(c, o, "match", 5, mkstr_nocopy(c, str->u.s + caps[0], (size_t)(caps[1] - caps[0])));
    oset(c, o, "start", 5, mknum(c, (double)cp_index(c, cpc, str->u.s, (size_t)caps[0])));
    oset(c, o, "end", 3, mknum(c, (double)cp_index(c, cpc, str->u.s, (size_t)caps[1])));
    struct vec g = {0};
    for (int i = 1; i <= ng; i++) {
        if (caps[2 * i] < 0)
            vec_push(c, &g, mkstr_nocopy(c, "", 0));
        else
            vec_push(
                c, &g,
                mkstr_nocopy(c, str->u.s + caps[2 * i], (size_t)(caps[2 * i + 1] - caps[2 * i])));
    }
    oset(c, o, "groups", 6, vec_done(c, &g, 0));
    *endpos = caps[1];
    return o;
}

static val *deep_clone(struct ctx *c, val *v, int depth)
{
    if (depth > 2000)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    if (!v)
        return NULL;
    switch (v->t) {
    case T_NUM:
        if (!num_is_int(v->u.num)) {
            char t[40];
            snprintf(t, sizeof t, "%.15g", v->u.num);
            return mknum(c, strtod(t, NULL));
        }
        return v;
    case T_FUNC:
        return mkstr_nocopy(c, "", 0);
    case T_ARR:
    case T_JARR: {
        struct vec out = {0};
        for (uint32_t i = 0; i < v->n; i++) {
            val *x = deep_clone(c, aget(c, v, i), depth + 1);
            vec_push(c, &out, x ? x : VNULL);
        }
        return vec_done(c, &out, 0);
    }
    case T_OBJ:
    case T_JOBJ: {
        val *r = mkobj(c);
        struct obj *o = omat(c, v);
        for (uint32_t i = 0; i < o->n; i++)
            if (o->kv[i].v)
                oset(c, r, o->kv[i].k, o->kv[i].klen, deep_clone(c, o->kv[i].v, depth + 1));
        return r;
    }
    default:
        return v;
    }
}

val *clone_value(struct ctx *c, val *v);
val *clone_value(struct ctx *c, val *v)
{
    return deep_clone(c, v, 0);
}

static val *apply_transform(struct ctx *c, struct fnv *f, val *obj)
{
    struct node *e = f->lam;
    if (!obj)
        return NULL;
    val *clonef = env_lookup(c, f->env, "clone", 5);
    if (!is_fn(clonef))
        ethrow(c, "T2013", e->pos, NULL, NULL);
    val *args[1] = {obj};
    val *result = apply_fn(c, clonef, args, 1, NULL, f->env);
    val *matches = ev(c, e->lhs, result, f->env);
    if (matches) {
        if (!is_arr(matches))
            matches = mkseq1(c, matches);
        for (uint32_t i = 0; i < matches->n; i++) {
            val *m = aget(c, matches, i);
            val *upd = ev(c, e->rhs, m, f->env);
            if (upd) {
                if (!is_obj(upd))
                    ethrow(c, "T2011", e->rhs->pos, NULL, NULL);
                if (is_obj(m)) {
                    struct obj *uo = omat(c, upd);
                    for (uint32_t k = 0; k < uo->n; k++)
                        oset(c, m, uo->kv[k].k, uo->kv[k].klen, uo->kv[k].v);
                }
            }
            if (e->third) {
                val *del = ev(c, e->third, m, f->env);
                if (del) {
                    val *d = is_arr(del) ? del : mkseq1(c, del);
                    for (uint32_t k = 0; k < d->n; k++)
                        if (!is_str(aget(c, d, k)))
                            ethrow(c, "T2012", e->third->pos, NULL, NULL);
                    if (is_obj(m))
                        for (uint32_t k = 0; k < d->n; k++) {
                            val *ks = aget(c, d, k);
                            odel(c, m, ks->u.s, ks->n);
                        }
                }
            }
        }
    }
    return result;
}

static val *apply_procedure(struct ctx *c, struct fnv *f, val **args, int n)
{
    struct env *env = env_new(c, f->env);
    for (uint32_t i = 0; i < f->nparams; i++)
        env_bind(c, env, f->params[i]->name, f->params[i]->nlen, (int)i < n ? args[i] : NULL);
    return ev(c, f->lam->lhs, f->input, env);
}

static val *apply_inner(struct ctx *c, val *proc, val **args, int n, val *input, struct env *env,
                        int pos, const char *token)
{
    if (!is_fn(proc))
        ethrow(c, "T1006", pos, token, NULL);
    struct fnv *f = proc->u.fn;
    if (f->sig && f->kind != FK_PARTIAL)
        args = sig_validate(c, f->sig, args, n, input, &n, pos, token);
    switch (f->kind) {
    case FK_LAMBDA:
        return apply_procedure(c, f, args, n);
    case FK_BUILTIN:
        return f->bi->fn(c, args, n, input, env);
    case FK_PARTIAL: {
        val **full = cx_alloc(c, sizeof *full * (size_t)(f->npargs + 1));
        int k = 0;
        for (int i = 0; i < f->npargs; i++)
            full[i] = f->hole[i] ? (k < n ? args[k++] : NULL) : f->pargs[i];
        int nf = f->npargs;
        while (nf > 0 && !full[nf - 1])
            nf--;
        if (f->bi->fn == NULL)
            ethrow(c, "T1006", pos, token, NULL);
        val **va = sig_validate(c, f->sig, full, nf, NULL, &nf, pos, token);
        return f->bi->fn(c, va, nf, NULL, env);
    }
    case FK_REGEX: {
        if (n < 1 || !is_str(args[0]))
            return NULL;
        long from = 0, endpos = 0;
        if (n > 1 && is_num(args[1]))
            from = (long)args[1]->u.num;
        return regex_match_obj(c, f->re, args[0], from, &endpos, NULL);
    }
    case FK_TRANSFORM:
        return apply_transform(c, f, n > 0 ? args[0] : NULL);
    case FK_CHAIN: {
        val *r = apply_fn(c, f->f, args, n > 0 ? 1 : 0, NULL, env);
        val *a1[1] = {r};
        return apply_fn(c, f->g, a1, 1, NULL, env);
    }
    }
    ethrow(c, "T1006", pos, token, NULL);
}

static val *apply_full(struct ctx *c, val *proc, val **args, int n, val *input, struct env *env,
                       int pos, const char *token)
{
    cx_tick(c); /* a builtin applied by $map & co. runs no step of its own */
    val *r = apply_inner(c, proc, args, n, input, env, pos, token);
    while (is_fn(r) && r->u.fn->kind == FK_LAMBDA && r->u.fn->thunk) {
        struct fnv *th = r->u.fn;
        struct node *call = th->lam->lhs;
        val *next = ev(c, call->lhs, th->input, th->env);
        val **a = cx_alloc(c, sizeof *a * (call->nkids + 1));
        for (uint32_t i = 0; i < call->nkids; i++)
            a[i] = ev(c, call->kids[i], th->input, th->env);
        const char *tk = call->lhs->type == N_VARIABLE ? call->lhs->name : token;
        r = apply_inner(c, next, a, (int)call->nkids, input, env, call->pos, tk);
    }
    return r;
}

val *apply_fn(struct ctx *c, val *proc, val **args, int n, val *input, struct env *env)
{
    return apply_full(c, proc, args, n, input, env, -1, NULL);
}

static const char *proc_name(struct node *p)
{
    if (p->type == N_PATH && p->nkids > 0)
        return p->kids[0]->name;
    return p->name;
}

static val *eval_function(struct ctx *c, struct node *e, val *input, struct env *env, val *applyto,
                          int has_applyto)
{
    val *proc = ev(c, e->lhs, input, env);
    if (!proc && e->lhs->type == N_PATH && e->lhs->kids[0]->type == N_NAME) {
        int found;
        lookup2(c, env, e->lhs->kids[0]->name, e->lhs->kids[0]->nlen, -2, &found);
        if (found)
            ethrow(c, "T1005", e->pos, e->lhs->kids[0]->name, NULL);
    }
    int n = (int)e->nkids + (has_applyto ? 1 : 0);
    val **args = cx_alloc(c, sizeof *args * (size_t)(n + 1));
    int k = 0;
    if (has_applyto)
        args[k++] = applyto;
    for (uint32_t i = 0; i < e->nkids; i++)
        args[k++] = ev(c, e->kids[i], input, env);
    return apply_full(c, proc, args, n, input, env, e->pos, proc_name(e->lhs));
}

static val *eval_partial(struct ctx *c, struct node *e, val *input, struct env *env)
{
    val **args = cx_alloc(c, sizeof *args * (e->nkids + 1));
    uint8_t *hole = cx_alloc(c, e->nkids + 1);
    for (uint32_t i = 0; i < e->nkids; i++) {
        hole[i] = e->kids[i]->type == N_PLACEHOLDER;
        args[i] = hole[i] ? NULL : ev(c, e->kids[i], input, env);
    }
    val *proc = ev(c, e->lhs, input, env);
    if (!proc && e->lhs->type == N_PATH && e->lhs->kids[0]->type == N_NAME) {
        int found;
        lookup2(c, env, e->lhs->kids[0]->name, e->lhs->kids[0]->nlen, -2, &found);
        if (found)
            ethrow(c, "T1007", e->pos, e->lhs->kids[0]->name, NULL);
    }
    if (!is_fn(proc))
        ethrow(c, "T1008", e->pos, proc_name(e->lhs), NULL);
    struct fnv *pf = proc->u.fn;
    struct fnv *f = cx_alloc(c, sizeof *f);
    memset(f, 0, sizeof *f);
    if (pf->kind == FK_LAMBDA) {
        *f = *pf;
        f->thunk = 0;
        f->sig = NULL;
        f->env = env_new(c, pf->env ? pf->env : env);
        f->params = cx_alloc(c, sizeof *f->params * (pf->nparams + 1));
        f->nparams = 0;
        for (uint32_t i = 0; i < pf->nparams; i++) {
            if (i < e->nkids && hole[i])
                f->params[f->nparams++] = pf->params[i];
            else
                env_bind(c, f->env, pf->params[i]->name, pf->params[i]->nlen,
                         i < e->nkids ? args[i] : NULL);
        }
        return mkfn(c, f);
    }
    if (pf->kind == FK_PARTIAL) {
        /* fill the remaining holes in order; '?' keeps a hole */
        *f = *pf;
        f->pargs = cx_alloc(c, sizeof *f->pargs * (size_t)(pf->npargs + 1));
        f->hole = cx_alloc(c, (size_t)pf->npargs + 1);
        uint32_t k = 0;
        for (int i = 0; i < pf->npargs; i++) {
            if (pf->hole[i]) {
                f->hole[i] = k < e->nkids ? hole[k] : 0;
                f->pargs[i] = k < e->nkids ? args[k] : NULL;
                k++;
            } else {
                f->hole[i] = 0;
                f->pargs[i] = pf->pargs[i];
            }
        }
        return mkfn(c, f);
    }
    if (pf->kind == FK_BUILTIN) {
        int np = pf->bi->arity;
        f->kind = FK_PARTIAL;
        f->bi = pf->bi;
        f->sig = pf->sig;
        f->npargs = np;
        f->pargs = cx_alloc(c, sizeof *f->pargs * (size_t)(np + 1));
        f->hole = cx_alloc(c, (size_t)np + 1);
        for (int i = 0; i < np; i++) {
            f->hole[i] = (uint32_t)i < e->nkids ? hole[i] : 0;
            f->pargs[i] = (uint32_t)i < e->nkids ? args[i] : NULL;
        }
        return mkfn(c, f);
    }
    ethrow(c, "T1008", e->pos, proc_name(e->lhs), NULL);
}

static val *eval_apply(struct ctx *c, struct node *e, val *input, struct env *env)
{
    val *lhs = ev(c, e->lhs, input, env);
    if (e->rhs->type == N_FUNCTION)
        return eval_function(c, e->rhs, input, env, lhs, 1);
    val *func = ev(c, e->rhs, input, env);
    if (!is_fn(func))
        ethrow(c, "T2006", e->pos, NULL, NULL);
    if (is_fn(lhs)) {
        struct fnv *f = cx_alloc(c, sizeof *f);
        memset(f, 0, sizeof *f);
        f->kind = FK_CHAIN;
        f->f = lhs;
        f->g = func;
        return mkfn(c, f);
    }
    val *args[1] = {lhs};
    return apply_full(c, func, args, 1, NULL, env, e->pos, NULL);
}

/* ---- evaluate ---- */

static val *ev_inner(struct ctx *c, struct node *e, val *input, struct env *env)
{
    switch (e->type) {
    case N_PATH:
        return eval_path(c, e, input, env);
    case N_BINARY:
        return eval_binary(c, e, input, env);
    case N_UNARY_MINUS: {
        val *v = ev(c, e->lhs, input, env);
        if (!v)
            return NULL;
        if (numeric(c, v))
            return mknum(c, -v->u.num);
        ethrow(c, "D1002", e->pos, "-", NULL);
    }
    case N_ARRAY:
        return eval_array(c, e, input, env);
    case N_OBJECT:
        return eval_group(c, e, input, env);
    case N_NAME:
        return lookup_field(c, input, e->name, e->nlen, 0);
    case N_STRING:
    case N_NUMBER:
    case N_VALUE:
        return e->lit;
    case N_WILDCARD:
        return eval_wildcard(c, input);
    case N_DESCENDANT: {
        if (!input)
            return NULL;
        struct vec out = {0};
        descend(c, input, &out, 0);
        if (out.n == 1)
            return out.v[0];
        return vec_done(c, &out, F_SEQ);
    }
    case N_PARENT:
        return env_lookup(c, env, e->slot->label, (uint32_t)strlen(e->slot->label));
    case N_CONDITION: {
        val *cond = ev(c, e->lhs, input, env);
        if (e->cond_self) { /* ?: and ??: the condition's value is the result */
            if (e->cond_self == COND_COALESCE ? cond != NULL : val_truthy(c, cond, NULL))
                return cond;
        } else if (val_truthy(c, cond, NULL))
            return ev(c, e->rhs, input, env);
        if (e->third)
            return ev(c, e->third, input, env);
        return NULL;
    }
    case N_BLOCK: {
        struct env *f = env_new(c, env);
        val *r = NULL;
        for (uint32_t i = 0; i < e->nkids; i++)
            r = ev(c, e->kids[i], input, f);
        return r;
    }
    case N_BIND: {
        val *v = ev(c, e->rhs, input, env);
        env_bind(c, env, e->lhs->name, e->lhs->nlen, v);
        return v;
    }
    case N_REGEX: {
        struct fnv *f = cx_alloc(c, sizeof *f);
        memset(f, 0, sizeof *f);
        f->kind = FK_REGEX;
        f->re = e->re;
        return mkfn(c, f);
    }
    case N_FUNCTION:
        return eval_function(c, e, input, env, NULL, 0);
    case N_VARIABLE: {
        if (e->nlen == 0)
            return input && is_arr(input) && (input->f & F_OUTER) ? aget(c, input, 0) : input;
        int found;
        return lookup2(c, env, e->name, e->nlen, e->builtin, &found);
    }
    case N_LAMBDA:
        return mklambda(c, e, input, env);
    case N_PARTIAL:
        return eval_partial(c, e, input, env);
    case N_APPLY:
        return eval_apply(c, e, input, env);
    case N_TRANSFORM: {
        struct fnv *f = cx_alloc(c, sizeof *f);
        memset(f, 0, sizeof *f);
        f->kind = FK_TRANSFORM;
        f->lam = e;
        f->env = env;
        static struct sig tsig;
        (void)tsig;
        return mkfn(c, f);
    }
    default:
        ethrow(c, "S0206", e->pos, NULL, NULL);
    }
}

val *ev(struct ctx *c, struct node *e, val *input, struct env *env)
{
    if (++c->depth > c->max_depth)
        ethrow(c, "U1001", e->pos, NULL, NULL);
    cx_tick(c);
    val *r = ev_inner(c, e, input, env);
    for (uint32_t i = 0; i < e->npreds; i++)
        r = eval_filter(c, e->preds[i].expr, r, env);
    if (e->type != N_PATH && e->group)
        r = eval_group(c, e->group, r, env);
    if (r && r->t == T_ARR && (r->f & F_SEQ) && !(r->f & F_TUPLE)) {
        if (e->keep_array)
            r->f |= F_KEEP;
        if (r->n == 0)
            r = NULL;
        else if (r->n == 1 && !(r->f & F_KEEP))
            r = aget(c, r, 0);
    }
    c->depth--;
    return r;
}

/* ---- public API ---- */

/* The intern table: every compiled expression by its source text.  A
 * workflow version's templates and conditions hold their expressions for
 * as long as the version is cached (engine.c), and a new version is
 * usually the last one again with a few changes: each distinct text is
 * compiled and kept once, however many versions use it (found by a judge:
 * forty PUTs of one definition of 30,000 expressions took 6.7 GB). */
static pthread_mutex_t intern_mu = PTHREAD_MUTEX_INITIALIZER;
static struct expr **intern_tab;
static size_t intern_cap, intern_n;

static uint64_t src_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

/* The interned expression for src, a reference taken; NULL if none.
 * Under intern_mu. */
static struct expr *intern_find(const char *src, size_t len, uint64_t h)
{
    for (struct expr *x = intern_cap ? intern_tab[h % intern_cap] : NULL; x; x = x->inext)
        if (x->hash == h && x->len == len && memcmp(x->src, src, len) == 0) {
            x->refs++;
            return x;
        }
    return NULL;
}

/* Under intern_mu. */
static void intern_add(struct expr *x)
{
    if (intern_n + 1 > intern_cap * 2) { /* grow, rehash */
        size_t cap = intern_cap ? intern_cap * 4 : 256;
        struct expr **t = xcalloc(cap, sizeof *t);
        for (size_t b = 0; b < intern_cap; b++)
            for (struct expr *e = intern_tab[b], *next; e; e = next) {
                next = e->inext;
                e->inext = t[e->hash % cap];
                t[e->hash % cap] = e;
            }
        free(intern_tab);
        intern_tab = t;
        intern_cap = cap;
    }
    x->inext = intern_tab[x->hash % intern_cap];
    intern_tab[x->hash % intern_cap] = x;
    intern_n++;
}

static void expr_destroy(struct expr *x)
{
    arena_free(x->a);
    free(x->src);
    free(x);
}

static int compile_new(const char *src, size_t len, struct expr **out, struct expr_error *err)
{
    struct expr *x = xcalloc(1, sizeof *x);
    x->src = xstrndup(src, len);
    x->len = len;
    x->a = arena_new(4096);
    if (parse_expr(x->src, len, x->a, &x->root, err)) {
        expr_destroy(x);
        return IFL_EEXPR;
    }
    /* Its tree is parsed again into one chunk of exactly its size (the
     * parse is deterministic), not kept in 4 KiB chunks mostly empty. */
    size_t used = arena_used(x->a);
    if (used < 4096) {
        struct arena *fit = arena_new(used ? used : 16);
        struct node *root = NULL;
        if (parse_expr(x->src, len, fit, &root, NULL) == 0) {
            arena_free(x->a);
            x->a = fit;
            x->root = root;
        } else {
            arena_free(fit);
        }
    }
    *out = x;
    return 0;
}

int expr_compile(const char *src, size_t len, struct expr **out, struct expr_error *err)
{
    *out = NULL;
    if (err)
        memset(err, 0, sizeof *err);
    if (len > EXPR_MAX_SOURCE) {
        if (err) {
            snprintf(err->code, sizeof err->code, "S0201");
            err->position = 0;
            snprintf(err->msg, sizeof err->msg, "expression longer than %zu bytes",
                     (size_t)EXPR_MAX_SOURCE);
        }
        return IFL_EEXPR;
    }
    uint64_t h = src_hash(src, len);
    pthread_mutex_lock(&intern_mu);
    struct expr *x = intern_find(src, len, h);
    pthread_mutex_unlock(&intern_mu);
    if (x) {
        *out = x;
        return 0;
    }
    int rc = compile_new(src, len, &x, err); /* outside the lock: a parse may take a while */
    if (rc)
        return rc;
    x->hash = h;
    x->refs = 1;
    pthread_mutex_lock(&intern_mu);
    struct expr *won = intern_find(src, len, h); /* another thread's, meanwhile */
    if (!won)
        intern_add(x);
    pthread_mutex_unlock(&intern_mu);
    if (won) {
        expr_destroy(x);
        x = won;
    }
    *out = x;
    return 0;
}

void expr_free(struct expr *x)
{
    if (!x)
        return;
    pthread_mutex_lock(&intern_mu);
    int last = --x->refs == 0;
    if (last) {
        struct expr **p = &intern_tab[x->hash % intern_cap];
        while (*p != x)
            p = &(*p)->inext;
        *p = x->inext;
        intern_n--;
    }
    pthread_mutex_unlock(&intern_mu);
    if (last)
        expr_destroy(x);
}

const char *expr_source(const struct expr *x)
{
    return x->src;
}

static const char *uses_variable(const struct node *n, const char *const *names, int depth)
{
    if (!n || depth > 10000)
        return NULL;
    if (n->type == N_VARIABLE && n->name)
        for (int i = 0; names[i]; i++)
            if (n->nlen == strlen(names[i]) && memcmp(n->name, names[i], n->nlen) == 0)
                return names[i];
    const char *hit = NULL;
    const struct node *direct[] = {n->lhs, n->rhs, n->third, n->group};
    for (size_t i = 0; !hit && i < sizeof direct / sizeof *direct; i++)
        hit = uses_variable(direct[i], names, depth + 1);
    for (uint32_t i = 0; !hit && i < n->nkids; i++)
        hit = uses_variable(n->kids[i], names, depth + 1);
    for (uint32_t i = 0; !hit && i < 2 * n->npairs; i++)
        hit = uses_variable(n->pairs[i], names, depth + 1);
    for (uint32_t i = 0; !hit && i < n->npreds; i++)
        hit = uses_variable(n->preds[i].expr, names, depth + 1);
    for (uint32_t i = 0; !hit && i < n->nstages; i++)
        hit = uses_variable(n->stages[i].expr, names, depth + 1);
    return hit;
}

const char *expr_uses_variable(const struct expr *x, const char *const *names)
{
    return x ? uses_variable(x->root, names, 0) : NULL;
}

int expr_eval_val(struct ctx *c, struct node *root, val *input, struct env *env, val **out);
int expr_eval_val(struct ctx *c, struct node *root, val *input, struct env *env, val **out)
{
    *out = ev(c, root, input, env);
    return 0;
}

int expr_eval(const struct expr *x, json_t *input, json_t *bindings, const struct expr_limits *lim,
              json_t **out, struct expr_error *err)
{
    struct expr_error scratch;
    if (!err)
        err = &scratch;
    memset(err, 0, sizeof *err);
    err->position = -1;
    *out = NULL;
    struct ctx cs;
    struct ctx *c = &cs;
    memset(c, 0, sizeof *c);
    c->a = arena_new(984); /* chunk + header stays in malloc's thread cache */
    c->err = err;
    c->max_depth = lim && lim->max_depth > 0 ? lim->max_depth : EXPR_DEFAULT_DEPTH;
    c->max_ms = lim && lim->max_time_ms > 0 ? lim->max_time_ms : EXPR_DEFAULT_TIME_MS;
    c->max_bytes = lim && lim->max_bytes > 0 ? lim->max_bytes : EXPR_DEFAULT_BYTES;
    c->now_ms = -1; /* taken on first use of $now/$millis */
    c->bindings = bindings && json_is_object(bindings) ? bindings : NULL;
    json_t *volatile result = NULL;
    int rc = 0;
    if (setjmp(c->jb) == 0) {
        val *in = wrapj(c, input);
        if (in && in->t == T_JARR) {
            in = mkseq1(c, in);
            in->f |= F_OUTER;
        }
        c->root = in;
        struct env *root = env_new(c, NULL);
        env_bind(c, root, "$", 1, in);
        val *r = ev(c, x->root, in, root);
        if (r && r->t == T_ARR && (r->f & F_SEQ) && r->n == 1 && !(r->f & F_KEEP))
            r = aget(c, r, 0);
        result = val_to_json(c, r, 0);
    } else {
        result = NULL;
        rc = IFL_EEXPR;
    }
    for (int i = 0; i < c->nowned; i++)
        expr_free(c->owned[i]);
    free(c->owned);
    arena_free(c->a);
    *out = result;
    return rc;
}
