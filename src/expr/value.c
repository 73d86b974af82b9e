/*
 * value — the evaluator's value model: constructors, lazy jansson wrappers,
 * JSON conversion, $string serialisation, deep equality and truthiness.
 *
 * Invariants: every value is allocated in the evaluation arena through
 * cx_alloc (which enforces the byte cap); the three constants null/true/false
 * are shared read-only; a T_JARR/T_JOBJ wrapper may be turned into its
 * materialised T_ARR/T_OBJ form in place, which is invisible to readers.
 * Recursive walks are bounded by VAL_MAX_NEST.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "expr/expr_int.h"
#include "json/json.h"

#define VAL_MAX_NEST 2000

const val v_null = {.t = T_NULL};
const val v_true = {.t = T_BOOL, .u = {.b = 1}};
const val v_false = {.t = T_BOOL, .u = {.b = 0}};

void *cx_alloc(struct ctx *c, size_t n)
{
    void *p = arena_alloc(c->a, n);
    if (arena_used(c->a) > c->max_bytes)
        ethrow(c, "U1002", -1, NULL, "limit %zu bytes", c->max_bytes);
    return p;
}

static double elapsed_ms(const struct timespec *a)
{
    struct timespec b;
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a->tv_sec) * 1e3 + (double)(b.tv_nsec - a->tv_nsec) / 1e6;
}

/* expr_deadline_set's, per thread: 0 = none */
static _Thread_local struct timespec deadline;
static _Thread_local int deadline_hit;

void expr_deadline_set(long ms)
{
    deadline_hit = 0;
    if (ms <= 0) {
        deadline = (struct timespec){0};
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += ms / 1000;
    deadline.tv_nsec += (ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
}

int expr_deadline_hit(void)
{
    return deadline_hit;
}

static void check_clock(struct ctx *c)
{
    if (c->start.tv_sec == 0 && c->start.tv_nsec == 0)
        /* the clock starts at the first check: short evaluations never
         * pay for reading it */
        clock_gettime(CLOCK_MONOTONIC, &c->start);
    else if (c->max_ms > 0 && elapsed_ms(&c->start) > (double)c->max_ms)
        ethrow(c, "U1001", -1, NULL, "Expression evaluation timeout: Check for infinite loop");
    if (deadline.tv_sec && elapsed_ms(&deadline) >= 0) {
        deadline_hit = 1;
        ethrow(c, "U1001", -1, NULL, "Expression evaluation timeout: Check for infinite loop");
    }
}

void cx_tick(struct ctx *c)
{
    if ((++c->ticks & 255) != 0)
        return;
    check_clock(c);
}

void cx_tickn(struct ctx *c, size_t n)
{
    if (n == 0)
        return;
    unsigned before = c->ticks;
    c->ticks += (unsigned)(n < 0x1000000 ? n : 0x1000000);
    if (((before ^ c->ticks) & ~255u) == 0)
        return; /* still inside the same run of 256 */
    check_clock(c);
}

val *mknum(struct ctx *c, double d)
{
    val *v = cx_alloc(c, sizeof *v);
    v->t = T_NUM;
    v->f = 0;
    v->n = 0;
    v->u.num = d;
    return v;
}

val *mkstr_nocopy(struct ctx *c, const char *s, size_t n)
{
    if (n > 0xFFFFFFF0u)
        ethrow(c, "U1002", -1, NULL, "string too long");
    val *v = cx_alloc(c, sizeof *v);
    v->t = T_STR;
    v->f = 0;
    v->n = (uint32_t)n;
    v->u.s = s;
    return v;
}

val *mkstr(struct ctx *c, const char *s, size_t n)
{
    char *p = cx_alloc(c, n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = 0;
    return mkstr_nocopy(c, p, n);
}

val *mkarr(struct ctx *c, val **items, uint32_t n, int flags)
{
    val *v = cx_alloc(c, sizeof *v);
    v->t = T_ARR;
    v->f = (uint8_t)flags;
    v->n = n;
    v->u.items = items;
    return v;
}

val *mkseq(struct ctx *c)
{
    return mkarr(c, NULL, 0, F_SEQ);
}

val *mkseq1(struct ctx *c, val *x)
{
    val **it = cx_alloc(c, sizeof *it);
    it[0] = x;
    return mkarr(c, it, 1, F_SEQ);
}

val *mkobj(struct ctx *c)
{
    val *v = cx_alloc(c, sizeof *v);
    struct obj *o = cx_alloc(c, sizeof *o);
    memset(o, 0, sizeof *o);
    v->t = T_OBJ;
    v->f = 0;
    v->n = 0;
    v->u.obj = o;
    return v;
}

val *mkfn(struct ctx *c, struct fnv *f)
{
    val *v = cx_alloc(c, sizeof *v);
    v->t = T_FUNC;
    v->f = 0;
    v->n = 0;
    v->u.fn = f;
    return v;
}

val *wrapj(struct ctx *c, json_t *j)
{
    if (!j)
        return NULL;
    val *v;
    switch (json_typeof(j)) {
    case JSON_NULL:
        return VNULL;
    case JSON_TRUE:
        return VTRUE;
    case JSON_FALSE:
        return VFALSE;
    case JSON_INTEGER:
        return mknum(c, (double)json_integer_value(j));
    case JSON_REAL:
        return mknum(c, json_real_value(j));
    case JSON_STRING:
        return mkstr_nocopy(c, json_string_value(j), json_string_length(j));
    case JSON_ARRAY:
        v = cx_alloc(c, sizeof *v);
        v->t = T_JARR;
        v->f = 0;
        v->n = (uint32_t)json_array_size(j);
        v->u.j = j;
        return v;
    case JSON_OBJECT:
        v = cx_alloc(c, sizeof *v);
        v->t = T_JOBJ;
        v->f = 0;
        v->n = (uint32_t)json_object_size(j);
        v->u.j = j;
        return v;
    }
    return NULL;
}

void vec_push(struct ctx *c, struct vec *a, val *x)
{
    if (a->n == a->cap) {
        uint32_t nc = a->cap ? a->cap * 2 : 8;
        val **nv = cx_alloc(c, sizeof *nv * nc);
        if (a->n)
            memcpy(nv, a->v, sizeof *nv * a->n);
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
}

val *vec_done(struct ctx *c, struct vec *a, int flags)
{
    return mkarr(c, a->v, a->n, flags);
}

uint32_t alen(const val *a)
{
    return a->n;
}

void amat(struct ctx *c, val *a)
{
    if (a->t == T_JARR) {
        uint32_t n = a->n;
        val **it = cx_alloc(c, sizeof *it * (n ? n : 1));
        for (uint32_t i = 0; i < n; i++)
            it[i] = wrapj(c, json_array_get(a->u.j, i));
        a->u.items = it;
        a->t = T_ARR;
    } else if (a->t == T_ARR && (a->f & F_RANGE)) {
        uint32_t n = a->n;
        double first = a->u.num;
        val **it = cx_alloc(c, sizeof *it * (n ? n : 1));
        for (uint32_t i = 0; i < n; i++)
            it[i] = mknum(c, first + i);
        a->u.items = it;
        a->f &= (uint8_t)~F_RANGE;
    }
}

val *aget(struct ctx *c, val *a, uint32_t i)
{
    if (i >= a->n)
        return NULL;
    if (a->t == T_JARR)
        return wrapj(c, json_array_get(a->u.j, i));
    if (a->f & F_RANGE)
        return mknum(c, a->u.num + i);
    return a->u.items[i];
}

static uint32_t khash(const char *k, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)k[i]) * 16777619u;
    return h;
}

static void reindex(struct ctx *c, struct obj *o)
{
    uint32_t cap = 16;
    while (cap < o->n * 2 + 2)
        cap *= 2;
    o->idx = cx_alloc(c, sizeof *o->idx * cap);
    memset(o->idx, 0, sizeof *o->idx * cap);
    o->icap = cap;
    for (uint32_t i = 0; i < o->n; i++) {
        uint32_t h = khash(o->kv[i].k, o->kv[i].klen) & (cap - 1);
        while (o->idx[h])
            h = (h + 1) & (cap - 1);
        o->idx[h] = i + 1;
    }
}

struct obj *omat(struct ctx *c, val *o)
{
    if (o->t == T_JOBJ) {
        json_t *j = o->u.j;
        struct obj *ob = cx_alloc(c, sizeof *ob);
        memset(ob, 0, sizeof *ob);
        size_t n = json_object_size(j);
        ob->kv = cx_alloc(c, sizeof *ob->kv * (n ? n : 1));
        ob->cap = (uint32_t)(n ? n : 1);
        const char *k;
        size_t klen;
        json_t *m;
        json_object_keylen_foreach(j, k, klen, m)
        {
            ob->kv[ob->n].k = k;
            ob->kv[ob->n].klen = (uint32_t)klen;
            ob->kv[ob->n].v = wrapj(c, m);
            ob->n++;
        }
        o->t = T_OBJ;
        o->u.obj = ob;
        o->n = ob->n;
    }
    return o->u.obj;
}

static long ofind(struct obj *o, const char *k, size_t klen)
{
    if (o->idx) {
        uint32_t h = khash(k, klen) & (o->icap - 1);
        while (o->idx[h]) {
            struct kv *e = &o->kv[o->idx[h] - 1];
            if (e->klen == klen && !memcmp(e->k, k, klen))
                return o->idx[h] - 1;
            h = (h + 1) & (o->icap - 1);
        }
        return -1;
    }
    for (uint32_t i = 0; i < o->n; i++)
        if (o->kv[i].klen == klen && !memcmp(o->kv[i].k, k, klen))
            return i;
    return -1;
}

val *oget(struct ctx *c, val *o, const char *k, size_t klen)
{
    if (o->t == T_JOBJ)
        return wrapj(c, json_object_getn(o->u.j, k, klen));
    long i = ofind(o->u.obj, k, klen);
    return i < 0 ? NULL : o->u.obj->kv[i].v;
}

void oset(struct ctx *c, val *ov, const char *k, size_t klen, val *v)
{
    struct obj *o = omat(c, ov);
    long i = ofind(o, k, klen);
    if (i >= 0) {
        o->kv[i].v = v;
        return;
    }
    if (o->n == o->cap) {
        uint32_t nc = o->cap ? o->cap * 2 : 4;
        struct kv *nk = cx_alloc(c, sizeof *nk * nc);
        if (o->n)
            memcpy(nk, o->kv, sizeof *nk * o->n);
        o->kv = nk;
        o->cap = nc;
    }
    o->kv[o->n].k = k;
    o->kv[o->n].klen = (uint32_t)klen;
    o->kv[o->n].v = v;
    o->n++;
    ov->n = o->n;
    if (o->n > 8) {
        if (!o->idx || o->n * 2 + 2 > o->icap) {
            reindex(c, o);
        } else {
            uint32_t h = khash(k, klen) & (o->icap - 1);
            while (o->idx[h])
                h = (h + 1) & (o->icap - 1);
            o->idx[h] = o->n;
        }
    }
}

void odel(struct ctx *c, val *ov, const char *k, size_t klen)
{
    struct obj *o = omat(c, ov);
    long i = ofind(o, k, klen);
    if (i < 0)
        return;
    memmove(&o->kv[i], &o->kv[i + 1], sizeof *o->kv * (o->n - (uint32_t)i - 1));
    o->n--;
    ov->n = o->n;
    if (o->idx)
        reindex(c, o);
}

/* ---- utf-8 ---- */

uint32_t utf8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    uint32_t c = u[k];
    if (c < 0x80) {
        *i = k + 1;
        return c;
    }
    int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    if (extra == 0 || k + (size_t)extra >= n) {
        *i = k + 1;
        return c;
    }
    uint32_t cp = c & (0x3F >> extra);
    for (int j = 1; j <= extra; j++)
        cp = (cp << 6) | (u[k + (size_t)j] & 0x3F);
    *i = k + (size_t)extra + 1;
    return cp;
}

size_t utf8_len(const char *s, size_t n)
{
    size_t cnt = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            cnt++;
    return cnt;
}

size_t cp_index(struct ctx *c, struct cpcache *k, const char *s, size_t byte)
{
    if (k->s != s || k->byte > byte) {
        k->s = s;
        k->byte = 0;
        k->cp = 0;
    }
    cx_tickn(c, (byte - k->byte) / CX_TICK_BYTES);
    k->cp += utf8_len(s + k->byte, byte - k->byte);
    k->byte = byte;
    return k->cp;
}

/* ---- string builder ---- */

void sb_add(struct ctx *c, struct sb *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = cx_alloc(c, nc);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void sb_addc(struct ctx *c, struct sb *b, char ch)
{
    sb_add(c, b, &ch, 1);
}

void sb_addcp(struct ctx *c, struct sb *b, uint32_t cp)
{
    char o[4];
    size_t k;
    if (cp < 0x80) {
        o[0] = (char)cp;
        k = 1;
    } else if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        k = 2;
    } else if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        k = 3;
    } else {
        o[0] = (char)(0xF0 | (cp >> 18));
        o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (char)(0x80 | (cp & 0x3F));
        k = 4;
    }
    sb_add(c, b, o, k);
}

val *sb_val(struct ctx *c, struct sb *b)
{
    if (!b->p)
        return mkstr_nocopy(c, "", 0);
    return mkstr_nocopy(c, b->p, b->n);
}

/* ---- numbers ---- */

void fmt_num(double d, char out[40])
{
    if (d == floor(d) && fabs(d) < 1e15) {
        long long v = (long long)d;
        char tmp[24];
        int k = 0, neg = v < 0;
        unsigned long long u = neg ? (unsigned long long)(-v) : (unsigned long long)v;
        do {
            tmp[k++] = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        int o = 0;
        if (neg)
            out[o++] = '-';
        while (k)
            out[o++] = tmp[--k];
        out[o] = 0;
        return;
    }
    if (json_format_number(d, out) < 0) {
        if (isnan(d))
            strcpy(out, "NaN");
        else
            strcpy(out, d > 0 ? "Infinity" : "-Infinity");
    }
}

int num_is_int(double d)
{
    return isfinite(d) && floor(d) == d;
}

/* ---- conversion to jansson ---- */

/* What one converted node costs on the heap besides its text (a json_t
 * and its share of a container), for the budget below. */
#define OUT_NODE_BYTES 64

/* Throws (before anything is allocated on the heap) when v cannot be
 * converted: non-finite numbers, nesting beyond VAL_MAX_NEST, or a
 * conversion that would take more than 4 × the evaluation's memory cap
 * (*size counts it).  A value may share its parts — N references to one
 * payload, a tree of 2^n leaves built in n steps — and within the cap
 * stand for gigabytes once each reference is its own copy.  Also
 * materialises lazy ranges so the conversion itself never allocates in the
 * arena. */
static void check_out(struct ctx *c, val *v, int depth, size_t *size)
{
    if (!v)
        return;
    if (depth > VAL_MAX_NEST)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    cx_tick(c); /* a value may share parts: its tree can be far larger than its memory */
    if (v->t == T_NUM && !isfinite(v->u.num))
        ethrow(c, "D1001", -1, NULL, "number out of range");
    *size += OUT_NODE_BYTES + (v->t == T_STR ? v->n : 0);
    if (c->max_bytes && *size > 4 * c->max_bytes)
        ethrow(c, "U1002", -1, NULL, "the result would take more than %zu bytes as JSON values",
               4 * c->max_bytes);
    if (v->t == T_ARR) {
        amat(c, v);
        for (uint32_t i = 0; i < v->n; i++)
            check_out(c, v->u.items[i], depth + 1, size);
    } else if (v->t == T_OBJ) {
        for (uint32_t i = 0; i < v->u.obj->n; i++) {
            *size += v->u.obj->kv[i].klen;
            check_out(c, v->u.obj->kv[i].v, depth + 1, size);
        }
    }
}

static json_t *to_json(struct ctx *c, val *v, int depth);

json_t *val_to_json(struct ctx *c, val *v, int depth)
{
    size_t size = 0;
    check_out(c, v, depth, &size);
    return to_json(c, v, depth);
}

static json_t *to_json(struct ctx *c, val *v, int depth)
{
    if (!v)
        return NULL;
    switch (v->t) {
    case T_NULL:
        return json_null();
    case T_BOOL:
        return json_boolean(v->u.b);
    case T_NUM:
        return isfinite(v->u.num) ? json_real(v->u.num == 0 ? 0.0 : v->u.num) : json_null();
    case T_STR:
        return json_stringn(v->u.s, v->n);
    case T_JARR:
    case T_JOBJ:
        return json_incref(v->u.j);
    case T_FUNC:
        return json_string("");
    case T_ARR: {
        json_t *a = json_array();
        for (uint32_t i = 0; i < v->n; i++) {
            val *it = v->u.items[i];
            if (it)
                json_array_append_new(a, to_json(c, it, depth + 1));
        }
        return a;
    }
    case T_OBJ: {
        json_t *o = json_object();
        struct obj *ob = v->u.obj;
        for (uint32_t i = 0; i < ob->n; i++) {
            if (!ob->kv[i].v)
                continue;
            json_object_setn_new(o, ob->kv[i].k, ob->kv[i].klen,
                                 to_json(c, ob->kv[i].v, depth + 1));
        }
        return o;
    }
    }
    return NULL;
}

/* ---- truthiness, equality ---- */

static int truthy(struct ctx *c, val *v, int depth)
{
    /* An undefined item of an array (`$x[true][]` keeps its undefined
     * input as one): JSONata's $boolean(undefined), false. */
    if (!v)
        return 0;
    if (depth > VAL_MAX_NEST)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    cx_tick(c);
    switch (v->t) {
    case T_NULL:
        return 0;
    case T_BOOL:
        return v->u.b;
    case T_NUM:
        return v->u.num != 0 && !isnan(v->u.num);
    case T_STR:
        return v->n > 0;
    case T_FUNC:
        return 0;
    case T_OBJ:
    case T_JOBJ:
        return v->n > 0;
    case T_ARR:
    case T_JARR:
        if (v->n == 1)
            return truthy(c, aget(c, v, 0), depth + 1);
        for (uint32_t i = 0; i < v->n; i++)
            if (truthy(c, aget(c, v, i), depth + 1))
                return 1;
        return 0;
    }
    return 0;
}

int val_truthy(struct ctx *c, val *v, int *defined)
{
    if (defined)
        *defined = v != NULL;
    if (!v)
        return 0;
    return truthy(c, v, 0);
}

int val_deep_equal(struct ctx *c, val *a, val *b, int depth)
{
    if (a == b)
        return 1;
    if (!a || !b)
        return 0;
    if (depth > VAL_MAX_NEST)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    cx_tick(c);
    if (is_arr(a) && is_arr(b)) {
        if (a->n != b->n)
            return 0;
        for (uint32_t i = 0; i < a->n; i++)
            if (!val_deep_equal(c, aget(c, a, i), aget(c, b, i), depth + 1))
                return 0;
        return 1;
    }
    if (is_obj(a) && is_obj(b)) {
        if (a->n != b->n)
            return 0;
        struct obj *oa = omat(c, a);
        for (uint32_t i = 0; i < oa->n; i++) {
            val *bv = oget(c, b, oa->kv[i].k, oa->kv[i].klen);
            if (!bv || !val_deep_equal(c, oa->kv[i].v, bv, depth + 1))
                return 0;
        }
        return 1;
    }
    if (a->t != b->t)
        return 0;
    switch (a->t) {
    case T_NULL:
        return 1;
    case T_BOOL:
        return a->u.b == b->u.b;
    case T_NUM:
        return a->u.num == b->u.num;
    case T_STR:
        if (a->n != b->n)
            return 0;
        cx_tickn(c, a->n / CX_TICK_BYTES);
        return !memcmp(a->u.s, b->u.s, a->n);
    case T_FUNC:
        return a->u.fn == b->u.fn;
    default:
        return 0;
    }
}

/* Levels of nesting val_hash looks into; deeper parts hash as one constant
 * and are left to val_deep_equal. */
#define HASH_DEPTH 32

static uint64_t mix64(uint64_t h)
{
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

static uint64_t hash_bytes(struct ctx *c, const char *s, size_t n, uint64_t h)
{
    cx_tickn(c, n / CX_TICK_BYTES);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = (h ^ w) * 0x100000001b3ULL;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
    return mix64(h ^ n);
}

static uint64_t hash_val(struct ctx *c, val *v, int depth)
{
    if (!v)
        return 0x9e3779b97f4a7c15ULL;
    cx_tick(c);
    if (is_arr(v)) {
        uint64_t h = 0x41 + v->n;
        if (depth >= HASH_DEPTH)
            return mix64(h);
        for (uint32_t i = 0; i < v->n; i++)
            h = mix64(h ^ hash_val(c, aget(c, v, i), depth + 1)) + i;
        return h;
    }
    if (is_obj(v)) {
        /* a sum over the members: the same for any order */
        uint64_t h = 0x4f + v->n;
        if (depth >= HASH_DEPTH)
            return mix64(h);
        struct obj *o = omat(c, v);
        for (uint32_t i = 0; i < o->n; i++)
            h += mix64(hash_bytes(c, o->kv[i].k, o->kv[i].klen, 0x6b) ^
                       hash_val(c, o->kv[i].v, depth + 1) * 31);
        return h;
    }
    switch (v->t) {
    case T_BOOL:
        return v->u.b ? 0x7401 : 0x7400;
    case T_NUM: {
        double d = v->u.num;
        if (d == 0)
            d = 0; /* -0 equals 0 */
        if (isnan(d))
            return 0x4e614e; /* equal only to itself, which hashes alike */
        uint64_t bits;
        memcpy(&bits, &d, sizeof bits);
        return mix64(bits ^ 0x6e);
    }
    case T_STR:
        return hash_bytes(c, v->u.s, v->n, 0xcbf29ce484222325ULL);
    case T_FUNC:
        return mix64((uint64_t)(uintptr_t)v->u.fn ^ 0x66);
    default: /* T_NULL */
        return 0x6e756c6c;
    }
}

uint64_t val_hash(struct ctx *c, val *v)
{
    return hash_val(c, v, 0);
}

/* ---- $string ---- */

static void put_jstr(struct ctx *c, struct sb *b, const char *s, size_t n)
{
    sb_addc(c, b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        if (ch == '"')
            esc = "\\\"";
        else if (ch == '\\')
            esc = "\\\\";
        else if (ch == '\n')
            esc = "\\n";
        else if (ch == '\r')
            esc = "\\r";
        else if (ch == '\t')
            esc = "\\t";
        else if (ch == '\b')
            esc = "\\b";
        else if (ch == '\f')
            esc = "\\f";
        else if (ch < 0x20) {
            snprintf(tmp, sizeof tmp, "\\u%04x", ch);
            esc = tmp;
        } else if (ch == 0xED && i + 2 < n && ((unsigned char)s[i + 1] & 0xE0) == 0xA0) {
            /* lone surrogate encoded as WTF-8 */
            uint32_t cp =
                0xD000 | (((unsigned char)s[i + 1] & 0x3F) << 6) | ((unsigned char)s[i + 2] & 0x3F);
            sb_add(c, b, s + i - run, run);
            run = 0;
            snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            sb_add(c, b, tmp, 6);
            i += 2;
            continue;
        }
        if (esc) {
            sb_add(c, b, s + i - run, run);
            run = 0;
            sb_add(c, b, esc, strlen(esc));
        } else {
            run++;
        }
    }
    sb_add(c, b, s + n - run, run);
    sb_addc(c, b, '"');
}

static void indent(struct ctx *c, struct sb *b, int pretty, int level)
{
    if (!pretty)
        return;
    sb_addc(c, b, '\n');
    for (int i = 0; i < level; i++)
        sb_add(c, b, "  ", 2);
}

static void stringify(struct ctx *c, struct sb *b, val *v, int pretty, int level)
{
    if (level > VAL_MAX_NEST)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    char num[40];
    switch (v->t) {
    case T_NULL:
        sb_add(c, b, "null", 4);
        return;
    case T_BOOL:
        if (v->u.b)
            sb_add(c, b, "true", 4);
        else
            sb_add(c, b, "false", 5);
        return;
    case T_NUM: {
        double d = v->u.num;
        if (isnan(d)) {
            sb_add(c, b, "null", 4);
            return;
        }
        if (!isfinite(d))
            ethrow(c, "D1001", -1, NULL, NULL);
        if (!num_is_int(d)) {
            char t[40];
            snprintf(t, sizeof t, "%.15g", d);
            d = strtod(t, NULL);
        }
        fmt_num(d, num);
        sb_add(c, b, num, strlen(num));
        return;
    }
    case T_STR:
        put_jstr(c, b, v->u.s, v->n);
        return;
    case T_FUNC:
        sb_add(c, b, "\"\"", 2);
        return;
    case T_ARR:
    case T_JARR: {
        if (v->n == 0) {
            sb_add(c, b, "[]", 2);
            return;
        }
        sb_addc(c, b, '[');
        for (uint32_t i = 0; i < v->n; i++) {
            if (i)
                sb_addc(c, b, ',');
            indent(c, b, pretty, level + 1);
            val *it = aget(c, v, i);
            if (it)
                stringify(c, b, it, pretty, level + 1);
            else
                sb_add(c, b, "null", 4);
        }
        indent(c, b, pretty, level);
        sb_addc(c, b, ']');
        return;
    }
    case T_OBJ:
    case T_JOBJ: {
        struct obj *o = omat(c, v);
        int first = 1;
        sb_addc(c, b, '{');
        for (uint32_t i = 0; i < o->n; i++) {
            if (!o->kv[i].v)
                continue;
            if (!first)
                sb_addc(c, b, ',');
            first = 0;
            indent(c, b, pretty, level + 1);
            put_jstr(c, b, o->kv[i].k, o->kv[i].klen);
            sb_addc(c, b, ':');
            if (pretty)
                sb_addc(c, b, ' ');
            stringify(c, b, o->kv[i].v, pretty, level + 1);
        }
        if (!first)
            indent(c, b, pretty, level);
        sb_addc(c, b, '}');
        return;
    }
    }
}

const char *val_string(struct ctx *c, val *v, int prettify, uint32_t *len)
{
    if (v->t == T_STR) {
        *len = v->n;
        return v->u.s;
    }
    if (v->t == T_FUNC) {
        *len = 0;
        return "";
    }
    if (v->t == T_NUM && !isfinite(v->u.num))
        ethrow(c, "D3001", -1, NULL, NULL);
    if (v->t == T_NUM && num_is_int(v->u.num)) {
        char *p = cx_alloc(c, 40);
        fmt_num(v->u.num, p);
        *len = (uint32_t)strlen(p);
        return p;
    }
    if (v->t == T_ARR && (v->f & F_OUTER) && v->n > 0)
        v = aget(c, v, 0);
    struct sb b = {0};
    stringify(c, &b, v, prettify, 0);
    *len = (uint32_t)b.n;
    return b.p ? b.p : "";
}

/* ---- sequences ---- */

val *append(struct ctx *c, val *a, val *b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    if (a->t == T_ARR && a->n == 0 && is_arr(b)) {
        /* [].concat(b): a plain copy of b; shares b's (immutable) items */
        val *r = cx_alloc(c, sizeof *r);
        *r = *b;
        r->f = (uint8_t)(b->f & F_RANGE);
        return r;
    }
    uint32_t na = is_arr(a) ? a->n : 1, nb = is_arr(b) ? b->n : 1;
    if ((uint64_t)na + nb > 0xFFFFFFF0u)
        ethrow(c, "U1002", -1, NULL, "array too long");
    val **it = cx_alloc(c, sizeof *it * (na + nb ? na + nb : 1));
    if (is_arr(a))
        for (uint32_t i = 0; i < na; i++)
            it[i] = aget(c, a, i);
    else
        it[0] = a;
    if (is_arr(b))
        for (uint32_t i = 0; i < nb; i++)
            it[na + i] = aget(c, b, i);
    else
        it[na] = b;
    return mkarr(c, it, na + nb, 0);
}

val *flatten_into(struct ctx *c, val *v, struct vec *out, int depth)
{
    if (depth > VAL_MAX_NEST)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    if (is_arr(v)) {
        for (uint32_t i = 0; i < v->n; i++)
            flatten_into(c, aget(c, v, i), out, depth + 1);
    } else {
        vec_push(c, out, v);
    }
    return NULL;
}
