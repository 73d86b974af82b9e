/*
 * funcs — the JSONata standard library (string, numeric, boolean, array,
 * object, higher-order and URL/base64 functions) and signature validation.
 *
 * Each built-in receives its arguments already validated against its
 * signature (the reference's `<s-nn?:s>` notation), so types are known;
 * undefined arguments arrive as NULL.  Built-ins allocate only in the
 * evaluation arena and report errors with ethrow().
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "expr/expr_int.h"

val *sort_values(struct ctx *c, val *arr, val *fn, struct env *env);
val *regex_match_obj(struct ctx *c, const struct regex *re, val *str, long from, long *endpos,
                     struct cpcache *cpc);
val *clone_value(struct ctx *c, val *v);

#define ARG(i) (n > (i) ? a[i] : NULL)

/* ---- signature validation ---- */

static char symbol_of(val *v)
{
    if (!v)
        return 'm';
    switch (v->t) {
    case T_FUNC:
        return 'f';
    case T_STR:
        return 's';
    case T_NUM:
        return 'n';
    case T_BOOL:
        return 'b';
    case T_NULL:
        return 'l';
    case T_ARR:
    case T_JARR:
        return 'a';
    default:
        return 'o';
    }
}

static int sig_accepts(const struct sigparam *p, char sym)
{
    return strchr(p->types, sym) != NULL;
}

/* Backtracking match of params[pi..np) against sym[si..n).  With
 * prefix >= 0, succeeds as soon as pi == prefix and returns the matched
 * length through *mlen. */
static int sig_match(const struct sig *s, int pi, const char *sym, int si, int n, int *lens,
                     int prefix, int *mlen)
{
    if (pi == (prefix >= 0 ? prefix : s->n)) {
        if (prefix >= 0) {
            *mlen = si;
            return 1;
        }
        return si == n;
    }
    const struct sigparam *p = &s->p[pi];
    int max = p->plus ? n - si : (si < n ? 1 : 0);
    int min = p->opt ? 0 : 1;
    int ok = 0;
    while (ok < max && sig_accepts(p, sym[si + ok]))
        ok++;
    for (int cnt = ok; cnt >= min; cnt--) {
        if (sig_match(s, pi + 1, sym, si + cnt, n, lens, prefix, mlen)) {
            lens[pi] = cnt;
            return 1;
        }
    }
    return 0;
}

static const char *plural(char t)
{
    switch (t) {
    case 'a':
        return "arrays";
    case 'b':
        return "booleans";
    case 'f':
        return "functions";
    case 'n':
        return "numbers";
    case 'o':
        return "objects";
    case 's':
        return "strings";
    default:
        return "values";
    }
}

val **sig_validate(struct ctx *c, const struct sig *s, val **args, int n, val *context, int *nout,
                   int pos, const char *token)
{
    char sym[64];
    if (n > 60)
        ethrow(c, "T0410", pos, token, "too many arguments");
    for (int i = 0; i < n; i++)
        sym[i] = symbol_of(args[i]);
    sym[n] = 0;
    int lens[SIG_MAX + 1];
    int mlen = 0;
    if (!sig_match(s, 0, sym, 0, n, lens, -1, &mlen)) {
        int good = 0;
        for (int k = 1; k <= s->n; k++) {
            int l;
            if (!sig_match(s, 0, sym, 0, n, lens, k, &l))
                ethrow(c, "T0410", pos, token, "argument %d", good + 1);
            good = l;
        }
        ethrow(c, "T0410", pos, token, "argument %d", good + 1);
    }
    int cap = (n > s->n ? n : s->n) + 1;
    val **out = cx_alloc(c, sizeof *out * (size_t)cap);
    memset(out, 0, sizeof *out * (size_t)cap);
    int k = 0, ai = 0;
    for (int pi = 0; pi < s->n; pi++) {
        const struct sigparam *p = &s->p[pi];
        if (lens[pi] == 0) {
            if (p->context) {
                if (!sig_accepts(p, symbol_of(context)) || (!context && !strchr(p->types, 'm')))
                    ethrow(c, "T0411", pos, token, "argument %d", ai + 1);
                out[k++] = context;
            } else {
                out[k++] = ai < n ? args[ai] : NULL;
                ai++;
            }
            continue;
        }
        for (int j = 0; j < lens[pi]; j++) {
            val *arg = args[ai];
            char single = sym[ai];
            if (p->type == 'a') {
                if (single == 'm') {
                    arg = NULL;
                } else {
                    int okk = 1;
                    if (p->subtype) {
                        if (single != 'a' && !(lens[pi] == 1 && single == p->subtype)) {
                            okk = 0;
                        } else if (single == 'a' && arg->n > 0) {
                            char it = symbol_of(aget(c, arg, 0));
                            if (it != p->subtype)
                                okk = 0;
                            else
                                for (uint32_t q = 1; q < arg->n; q++)
                                    if (symbol_of(aget(c, arg, q)) != it) {
                                        okk = 0;
                                        break;
                                    }
                        }
                    }
                    if (!okk)
                        ethrow(c, "T0412", pos, token, "argument %d must be an array of %s", ai + 1,
                               plural(p->subtype));
                    if (single != 'a') {
                        val **it = cx_alloc(c, sizeof *it);
                        it[0] = arg;
                        arg = mkarr(c, it, 1, 0);
                    }
                }
            }
            out[k++] = arg;
            ai++;
        }
    }
    *nout = k;
    return out;
}

/* ---- helpers ---- */

static double num(val *v)
{
    return v->u.num;
}

static val *str_of(struct ctx *c, const char *s, size_t n)
{
    return mkstr_nocopy(c, s, n);
}

/* byte offset of code point index cp in s (clamped) */
static size_t cp_to_byte(const char *s, size_t n, size_t cp)
{
    size_t i = 0;
    while (i < n && cp > 0) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        cp--;
    }
    return i;
}

/* The first occurrence of nd in h at or after byte `from`, or NULL.  glibc's
 * memmem is linear in hn + nn (two-way for long needles), where a naive
 * search was O(hn * nn); the bytes it may read count against the time
 * limit.  A UTF-8 needle can only match at a character boundary. */
static const char *find_sub(struct ctx *c, const char *h, size_t hn, const char *nd, size_t nn,
                            size_t from)
{
    if (nn == 0)
        return from <= hn ? h + from : NULL;
    if (from > hn || nn > hn - from)
        return NULL;
    const char *p = memmem(h + from, hn - from, nd, nn);
    cx_tickn(c, 1 + ((p ? (size_t)(p - h) + nn : hn) - from + nn) / CX_TICK_BYTES);
    return p;
}

/* ---- aggregation ---- */

static val *f_sum(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    if (!arr)
        return NULL;
    double t = 0;
    for (uint32_t i = 0; i < arr->n; i++)
        t += num(aget(c, arr, i));
    return mknum(c, t);
}

static val *f_count(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    return mknum(c, arr ? arr->n : 0);
}

static val *f_max(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    if (!arr || arr->n == 0)
        return NULL;
    double m = -INFINITY;
    for (uint32_t i = 0; i < arr->n; i++) {
        double d = num(aget(c, arr, i));
        if (d > m || isnan(d))
            m = d;
    }
    return mknum(c, m);
}

static val *f_min(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    if (!arr || arr->n == 0)
        return NULL;
    double m = INFINITY;
    for (uint32_t i = 0; i < arr->n; i++) {
        double d = num(aget(c, arr, i));
        if (d < m || isnan(d))
            m = d;
    }
    return mknum(c, m);
}

static val *f_average(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    if (!arr || arr->n == 0)
        return NULL;
    double t = 0;
    for (uint32_t i = 0; i < arr->n; i++)
        t += num(aget(c, arr, i));
    return mknum(c, t / arr->n);
}

/* ---- strings ---- */

static val *f_string(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *v = ARG(0);
    if (!v)
        return NULL;
    val *pretty = ARG(1);
    uint32_t len;
    const char *s = val_string(c, v, pretty && pretty->t == T_BOOL && pretty->u.b, &len);
    if (v->t == T_STR)
        return v;
    return str_of(c, s, len);
}

static val *substr_cp(struct ctx *c, val *sv, double start, int has_len, double length)
{
    cx_tickn(c, sv->n / CX_TICK_BYTES);
    size_t total = utf8_len(sv->u.s, sv->n);
    double len = (double)total;
    if (len + start < 0)
        start = 0;
    double end;
    if (has_len) {
        if (length <= 0)
            return str_of(c, "", 0);
        end = start >= 0 ? start + length : len + start + length;
    } else {
        end = len;
    }
    /* Array.prototype.slice */
    double s0 = trunc(start), e0 = trunc(end);
    if (isnan(s0))
        s0 = 0;
    if (isnan(e0))
        e0 = 0;
    if (s0 < 0)
        s0 = fmax(len + s0, 0);
    else
        s0 = fmin(s0, len);
    if (e0 < 0)
        e0 = fmax(len + e0, 0);
    else
        e0 = fmin(e0, len);
    if (e0 <= s0)
        return str_of(c, "", 0);
    size_t bs = cp_to_byte(sv->u.s, sv->n, (size_t)s0);
    size_t be = bs + cp_to_byte(sv->u.s + bs, sv->n - bs, (size_t)(e0 - s0));
    return str_of(c, sv->u.s + bs, be - bs);
}

static val *f_substring(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0);
    if (!s)
        return NULL;
    val *st = ARG(1), *ln = ARG(2);
    return substr_cp(c, s, st ? num(st) : 0, ln != NULL, ln ? num(ln) : 0);
}

static val *f_substringBefore(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0), *ch = ARG(1);
    if (!s)
        return NULL;
    if (!ch)
        return s;
    const char *p = find_sub(c, s->u.s, s->n, ch->u.s, ch->n, 0);
    return p ? str_of(c, s->u.s, (size_t)(p - s->u.s)) : s;
}

static val *f_substringAfter(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0), *ch = ARG(1);
    if (!s)
        return NULL;
    if (!ch)
        return s;
    const char *p = find_sub(c, s->u.s, s->n, ch->u.s, ch->n, 0);
    if (!p)
        return s;
    size_t off = (size_t)(p - s->u.s) + ch->n;
    return str_of(c, s->u.s + off, s->n - off);
}

static uint32_t case_map(uint32_t cp, int upper)
{
    if (upper) {
        if (cp >= 'a' && cp <= 'z')
            return cp - 32;
        if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7))
            return cp - 32;
        if (cp == 0xFF)
            return 0x178;
        if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 &&
            cp != 0x149 && cp != 0x17F) {
            if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E))
                return (cp % 2 == 0) ? cp - 1 : cp;
            return (cp % 2 == 1) ? cp - 1 : cp;
        }
        if (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2)
            return cp - 32;
        if (cp >= 0x430 && cp <= 0x44F)
            return cp - 32;
        if (cp >= 0x450 && cp <= 0x45F)
            return cp - 80;
        return cp;
    }
    if (cp >= 'A' && cp <= 'Z')
        return cp + 32;
    if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7)
        return cp + 32;
    if (cp >= 0x100 && cp <= 0x17F && cp != 0x130 && cp != 0x131 && cp != 0x138 && cp != 0x149 &&
        cp != 0x17F) {
        if ((cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E))
            return (cp % 2 == 1) ? cp + 1 : cp;
        return (cp % 2 == 0) ? cp + 1 : cp;
    }
    if (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2)
        return cp + 32;
    if (cp >= 0x410 && cp <= 0x42F)
        return cp + 32;
    if (cp >= 0x400 && cp <= 0x40F)
        return cp + 80;
    return cp;
}

static val *recase(struct ctx *c, val *s, int upper)
{
    if (!s)
        return NULL;
    struct sb b = {0};
    size_t i = 0;
    while (i < s->n) {
        uint32_t cp = utf8_next(s->u.s, s->n, &i);
        if (upper && cp == 0xDF) {
            sb_add(c, &b, "SS", 2);
            continue;
        }
        sb_addcp(c, &b, case_map(cp, upper));
    }
    return sb_val(c, &b);
}

static val *f_lowercase(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return recase(c, ARG(0), 0);
}

static val *f_uppercase(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return recase(c, ARG(0), 1);
}

static val *f_length(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0);
    if (!s)
        return NULL;
    cx_tickn(c, s->n / CX_TICK_BYTES);
    return mknum(c, (double)utf8_len(s->u.s, s->n));
}

static val *f_trim(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0);
    if (!s)
        return NULL;
    struct sb b = {0};
    sb_add(c, &b, "", 0);
    for (uint32_t i = 0; i < s->n;) {
        char ch = s->u.s[i];
        if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
            while (i < s->n && (s->u.s[i] == ' ' || s->u.s[i] == '\t' || s->u.s[i] == '\n' ||
                                s->u.s[i] == '\r'))
                i++;
            sb_addc(c, &b, ' ');
        } else {
            sb_addc(c, &b, ch);
            i++;
        }
    }
    size_t st = 0, en = b.n;
    if (en > 0 && b.p[0] == ' ')
        st = 1;
    if (en > st && b.p[en - 1] == ' ')
        en--;
    return str_of(c, b.p + st, en - st);
}

static val *f_pad(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0), *w = ARG(1), *ch = ARG(2);
    if (!s)
        return NULL;
    const char *pc = " ";
    size_t pn = 1;
    if (ch && ch->n > 0) {
        pc = ch->u.s;
        pn = ch->n;
    }
    double width = w ? trunc(num(w)) : 0;
    double padlen = fabs(width) - (double)utf8_len(s->u.s, s->n);
    if (!(padlen > 0))
        return s;
    if (padlen > 1e7)
        ethrow(c, "U1002", -1, NULL, "padding too long");
    size_t pl = (size_t)padlen;
    struct sb b = {0};
    if (width < 0) {
        size_t cnt = 0, i = 0;
        while (cnt < pl) {
            size_t st = i;
            utf8_next(pc, pn, &i);
            sb_add(c, &b, pc + st, i - st);
            if (i >= pn)
                i = 0;
            cnt++;
        }
        sb_add(c, &b, s->u.s, s->n);
    } else {
        sb_add(c, &b, s->u.s, s->n);
        size_t cnt = 0, i = 0;
        while (cnt < pl) {
            size_t st = i;
            utf8_next(pc, pn, &i);
            sb_add(c, &b, pc + st, i - st);
            if (i >= pn)
                i = 0;
            cnt++;
        }
    }
    return sb_val(c, &b);
}

/* ---- matchers (regex or user functions returning match objects) ---- */

struct mit {
    val *matcher;
    val *str;
    val *cur;    /* current match object */
    long sb, eb; /* current match byte offsets */
    long last;   /* native: lastIndex in bytes */
    int native;
    struct cpcache cpc; /* native: code point offsets of the matches */
};

static int mit_load(struct ctx *c, struct mit *m, val *r)
{
    m->cur = r;
    if (!r)
        return 0;
    if (!is_obj(r))
        ethrow(c, "T1010", -1, NULL, NULL);
    val *st = oget(c, r, "start", 5), *en = oget(c, r, "end", 3), *g = oget(c, r, "groups", 6),
        *nx = oget(c, r, "next", 4);
    if (!(is_num(st) || is_arr(g) || is_fn(nx)))
        ethrow(c, "T1010", -1, NULL, NULL);
    if (!m->native) {
        m->sb = is_num(st) ? (long)cp_to_byte(m->str->u.s, m->str->n, (size_t)num(st)) : 0;
        m->eb = is_num(en) ? (long)cp_to_byte(m->str->u.s, m->str->n, (size_t)num(en)) : m->sb;
    }
    (void)en;
    return 1;
}

static int mit_first(struct ctx *c, struct mit *m, val *matcher, val *str, struct env *env)
{
    m->matcher = matcher;
    m->str = str;
    m->native = matcher->u.fn->kind == FK_REGEX;
    memset(&m->cpc, 0, sizeof m->cpc);
    if (m->native) {
        long endpos = 0;
        val *r = regex_match_obj(c, matcher->u.fn->re, str, 0, &endpos, &m->cpc);
        if (!r) {
            m->cur = NULL;
            return 0;
        }
        m->cur = r;
        m->eb = endpos;
        m->sb = endpos - (long)oget(c, r, "match", 5)->n;
        m->last = endpos;
        return 1;
    }
    val *args[1] = {str};
    return mit_load(c, m, apply_fn(c, matcher, args, 1, NULL, env));
}

static int mit_next(struct ctx *c, struct mit *m, struct env *env)
{
    if (m->native) {
        if (m->last >= (long)m->str->n) {
            m->cur = NULL;
            return 0;
        }
        long endpos = 0;
        val *r = regex_match_obj(c, m->matcher->u.fn->re, m->str, m->last, &endpos, &m->cpc);
        if (!r) {
            m->cur = NULL;
            return 0;
        }
        val *mt = oget(c, r, "match", 5);
        if (mt->n == 0)
            ethrow(c, "D1004", -1, NULL, NULL);
        m->cur = r;
        m->eb = endpos;
        m->sb = endpos - (long)mt->n;
        m->last = endpos;
        return 1;
    }
    val *nx = oget(c, m->cur, "next", 4);
    if (!is_fn(nx)) {
        m->cur = NULL;
        return 0;
    }
    return mit_load(c, m, apply_fn(c, nx, NULL, 0, NULL, env));
}

static val *f_contains(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0), *t = ARG(1);
    if (!s || !t)
        return NULL;
    if (t->t == T_STR)
        return VBOOL(find_sub(c, s->u.s, s->n, t->u.s, t->n, 0) != NULL);
    struct mit m;
    return VBOOL(mit_first(c, &m, t, s, e));
}

static val *f_match(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0), *re = ARG(1), *lim = ARG(2);
    if (!s)
        return NULL;
    if (lim && num(lim) < 0)
        ethrow(c, "D3040", -1, NULL, NULL);
    struct vec out = {0};
    if (!lim || num(lim) > 0) {
        struct mit m;
        double count = 0;
        int ok = mit_first(c, &m, re, s, e);
        while (ok && (!lim || count < num(lim))) {
            val *o = mkobj(c);
            oset(c, o, "match", 5, oget(c, m.cur, "match", 5));
            oset(c, o, "index", 5, oget(c, m.cur, "start", 5));
            oset(c, o, "groups", 6, oget(c, m.cur, "groups", 6));
            vec_push(c, &out, o);
            ok = mit_next(c, &m, e);
            count++;
        }
    }
    return vec_done(c, &out, F_SEQ);
}

static void replace_dollar(struct ctx *c, struct sb *b, val *rep, val *mobj)
{
    val *groups = oget(c, mobj, "groups", 6);
    uint32_t ng = groups && is_arr(groups) ? groups->n : 0;
    const char *r = rep->u.s;
    size_t rn = rep->n, pos = 0;
    while (pos < rn) {
        const char *d = memchr(r + pos, '$', rn - pos);
        if (!d)
            break;
        size_t idx = (size_t)(d - r);
        sb_add(c, b, r + pos, idx - pos);
        pos = idx + 1;
        char dv = pos < rn ? r[pos] : 0;
        if (dv == '$') {
            sb_addc(c, b, '$');
            pos++;
        } else if (dv == '0') {
            val *m = oget(c, mobj, "match", 5);
            sb_add(c, b, m->u.s, m->n);
            pos++;
        } else {
            int maxd = ng == 0 ? 1 : (int)floor(log10((double)ng)) + 1;
            long v = -1;
            int used = 0;
            for (int k = 0;
                 k < maxd && pos + (size_t)k < rn && r[pos + k] >= '0' && r[pos + k] <= '9'; k++) {
                v = (v < 0 ? 0 : v) * 10 + (r[pos + k] - '0');
                used = k + 1;
            }
            if (maxd > 1 && v > (long)ng) {
                v = -1;
                used = 0;
                for (int k = 0;
                     k < maxd - 1 && pos + (size_t)k < rn && r[pos + k] >= '0' && r[pos + k] <= '9';
                     k++) {
                    v = (v < 0 ? 0 : v) * 10 + (r[pos + k] - '0');
                    used = k + 1;
                }
            }
            if (v >= 0) {
                if (ng > 0 && v >= 1 && (uint32_t)v <= ng) {
                    val *g = aget(c, groups, (uint32_t)v - 1);
                    if (g && g->t == T_STR)
                        sb_add(c, b, g->u.s, g->n);
                }
                char tmp[24];
                int tl = snprintf(tmp, sizeof tmp, "%ld", v);
                (void)used;
                pos += (size_t)tl;
            } else {
                sb_addc(c, b, '$');
            }
        }
    }
    if (pos < rn)
        sb_add(c, b, r + pos, rn - pos);
}

static val *f_replace(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0), *pat = ARG(1), *rep = ARG(2), *lim = ARG(3);
    if (!s)
        return NULL;
    if (pat && pat->t == T_STR && pat->n == 0)
        ethrow(c, "D3010", -1, NULL, NULL);
    if (lim && num(lim) < 0)
        ethrow(c, "D3011", -1, NULL, NULL);
    if (!pat || !rep)
        ethrow(c, "T0410", -1, NULL, NULL);
    if (lim && num(lim) == 0)
        return s;
    struct sb b = {0};
    sb_add(c, &b, "", 0);
    double count = 0;
    if (pat->t == T_STR) {
        size_t pos = 0;
        const char *p;
        while ((p = find_sub(c, s->u.s, s->n, pat->u.s, pat->n, pos)) &&
               (!lim || count < num(lim))) {
            size_t idx = (size_t)(p - s->u.s);
            sb_add(c, &b, s->u.s + pos, idx - pos);
            if (rep->t == T_STR) {
                sb_add(c, &b, rep->u.s, rep->n);
            } else {
                uint32_t l;
                const char *t = val_string(c, rep, 0, &l);
                sb_add(c, &b, t, l);
            }
            pos = idx + pat->n;
            count++;
        }
        sb_add(c, &b, s->u.s + pos, s->n - pos);
        return sb_val(c, &b);
    }
    struct mit m;
    if (!mit_first(c, &m, pat, s, e))
        return s;
    long pos = 0;
    int ok = 1;
    while (ok && (!lim || count < num(lim))) {
        sb_add(c, &b, s->u.s + pos, (size_t)(m.sb - pos));
        if (rep->t == T_STR) {
            replace_dollar(c, &b, rep, m.cur);
        } else {
            val *args[1] = {m.cur};
            val *r = apply_fn(c, rep, args, 1, NULL, e);
            if (!r || r->t != T_STR)
                ethrow(c, "D3012", -1, NULL, NULL);
            sb_add(c, &b, r->u.s, r->n);
        }
        pos = m.eb;
        count++;
        ok = mit_next(c, &m, e);
    }
    sb_add(c, &b, s->u.s + pos, s->n - (size_t)pos);
    return sb_val(c, &b);
}

static val *f_split(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0), *sep = ARG(1), *lim = ARG(2);
    if (!s)
        return NULL;
    if (lim && num(lim) < 0)
        ethrow(c, "D3020", -1, NULL, NULL);
    if (!sep)
        ethrow(c, "T0410", -1, NULL, NULL);
    struct vec out = {0};
    double limit = lim ? trunc(num(lim)) : INFINITY;
    if (lim && limit == 0)
        return vec_done(c, &out, 0);
    if (sep->t == T_STR) {
        if (sep->n == 0) {
            size_t i = 0;
            while (i < s->n && out.n < limit) {
                size_t st = i;
                utf8_next(s->u.s, s->n, &i);
                vec_push(c, &out, str_of(c, s->u.s + st, i - st));
            }
            return vec_done(c, &out, 0);
        }
        size_t pos = 0;
        for (;;) {
            if (out.n >= limit)
                break;
            const char *p = find_sub(c, s->u.s, s->n, sep->u.s, sep->n, pos);
            if (!p) {
                vec_push(c, &out, str_of(c, s->u.s + pos, s->n - pos));
                break;
            }
            vec_push(c, &out, str_of(c, s->u.s + pos, (size_t)(p - s->u.s) - pos));
            pos = (size_t)(p - s->u.s) + sep->n;
        }
        return vec_done(c, &out, 0);
    }
    struct mit m;
    if (!mit_first(c, &m, sep, s, e)) {
        vec_push(c, &out, s);
        return vec_done(c, &out, 0);
    }
    long start = 0;
    double count = 0;
    int ok = 1;
    while (ok && (!lim || count < limit)) {
        vec_push(c, &out, str_of(c, s->u.s + start, (size_t)(m.sb - start)));
        start = m.eb;
        ok = mit_next(c, &m, e);
        count++;
    }
    if (!lim || count < limit)
        vec_push(c, &out, str_of(c, s->u.s + start, s->n - (size_t)start));
    return vec_done(c, &out, 0);
}

static val *f_join(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0), *sep = ARG(1);
    if (!arr)
        return NULL;
    struct sb b = {0};
    sb_add(c, &b, "", 0);
    for (uint32_t i = 0; i < arr->n; i++) {
        if (i && sep)
            sb_add(c, &b, sep->u.s, sep->n);
        val *s = aget(c, arr, i);
        sb_add(c, &b, s->u.s, s->n);
    }
    return sb_val(c, &b);
}

/* ---- numbers ---- */

static int match_decimal(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    size_t d = i;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i == d)
        return 0;
    if (i < n && s[i] == '.') {
        i++;
        size_t f = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == f)
            return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t x = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == x)
            return 0;
    }
    return i == n;
}

static val *f_number(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *v = ARG(0);
    if (!v)
        return NULL;
    if (v->t == T_NUM)
        return v;
    if (v->t == T_BOOL)
        return mknum(c, v->u.b ? 1 : 0);
    if (v->t == T_STR) {
        char tmp[512];
        if (v->n < sizeof tmp && match_decimal(v->u.s, v->n)) {
            memcpy(tmp, v->u.s, v->n);
            tmp[v->n] = 0;
            double d = strtod(tmp, NULL);
            if (isfinite(d))
                return mknum(c, d);
        }
        if (v->n > 2 && v->n < 64 && v->u.s[0] == '0') {
            char k = (char)(v->u.s[1] | 0x20);
            int base = k == 'x' ? 16 : k == 'o' ? 8 : k == 'b' ? 2 : 0;
            if (base) {
                double d = 0;
                int ok = 1;
                for (uint32_t i = 2; i < v->n; i++) {
                    char ch = v->u.s[i];
                    int dv = ch >= '0' && ch <= '9'                     ? ch - '0'
                             : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'f' ? (ch | 0x20) - 'a' + 10
                                                                        : 99;
                    if (dv >= base) {
                        ok = 0;
                        break;
                    }
                    d = d * base + dv;
                }
                if (ok)
                    return mknum(c, d);
            }
        }
    }
    ethrow(c, "D3030", -1, NULL, NULL);
}

static val *f_abs(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return ARG(0) ? mknum(c, fabs(num(a[0]))) : NULL;
}

static val *f_floor(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return ARG(0) ? mknum(c, floor(num(a[0]))) : NULL;
}

static val *f_ceil(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return ARG(0) ? mknum(c, ceil(num(a[0]))) : NULL;
}

/* Shifts the decimal point of d by k places exactly, as the reference does
 * through the string form "mantissa e exponent". */
static double shift10(double d, int k)
{
    char s[40], t[64];
    fmt_num(d, s);
    char *ep = strchr(s, 'e');
    long ex = 0;
    if (ep) {
        ex = strtol(ep + 1, NULL, 10);
        *ep = 0;
    }
    snprintf(t, sizeof t, "%se%ld", s, ex + k);
    return strtod(t, NULL);
}

double expr_round(double arg, int prec);
double expr_round(double arg, int prec)
{
    double orig = arg;
    if (prec)
        arg = shift10(arg, prec);
    if (!isfinite(arg))
        return orig; /* a precision past the double's digits changes nothing */
    double r = floor(arg);
    if (arg - r >= 0.5)
        r += 1;
    double diff = r - arg;
    if (fabs(diff) == 0.5 && fabs(fmod(r, 2)) == 1)
        r -= 1;
    if (prec)
        r = shift10(r, -prec);
    if (r == 0)
        r = 0;
    return r;
}

static val *f_round(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    if (!ARG(0))
        return NULL;
    double p = ARG(1) ? trunc(num(a[1])) : 0;
    if (!isfinite(num(a[0])))
        return a[0];
    /* No double has digits 400 places either side of the point, so a
     * precision past that (or an infinite one) rounds as ±400 does. */
    p = isnan(p) ? 0 : fmax(-400, fmin(400, p));
    return mknum(c, expr_round(num(a[0]), (int)p));
}

static val *f_sqrt(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    if (!ARG(0))
        return NULL;
    if (num(a[0]) < 0)
        ethrow(c, "D3060", -1, NULL, NULL);
    return mknum(c, sqrt(num(a[0])));
}

static val *f_power(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    if (!ARG(0))
        return NULL;
    double r = pow(num(a[0]), ARG(1) ? num(a[1]) : NAN);
    if (!isfinite(r))
        ethrow(c, "D3061", -1, NULL, NULL);
    return mknum(c, r);
}

static uint64_t rng_next(struct ctx *c)
{
    /* splitmix64 over a per-evaluation state derived from the clock */
    static const uint64_t g = 0x9E3779B97F4A7C15ull;
    uint64_t z = g * (uint64_t)(c->depth_in_values++) + (uint64_t)(uintptr_t)c;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    z ^= (uint64_t)ts.tv_nsec * g;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static val *f_random(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return mknum(c, (double)(rng_next(c) >> 11) / 9007199254740992.0);
}

static val *f_formatBase(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    if (!ARG(0))
        return NULL;
    double v = expr_round(num(a[0]), 0);
    double radix = ARG(1) ? expr_round(num(a[1]), 0) : 10;
    if (!(radix >= 2 && radix <= 36))
        ethrow(c, "D3100", -1, NULL, NULL);
    if (!isfinite(v)) /* an infinite intermediate, e.g. $n/0 passed in */
        ethrow(c, "D1001", -1, NULL, NULL);
    char buf[80];
    int neg = v < 0;
    double x = fabs(v);
    int k = 0;
    char tmp[80];
    if (x == 0)
        tmp[k++] = '0';
    while (x >= 1 && k < 70) {
        int d = (int)fmod(x, radix);
        tmp[k++] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
        x = floor(x / radix);
    }
    int o = 0;
    if (neg)
        buf[o++] = '-';
    while (k > 0)
        buf[o++] = tmp[--k];
    return str_of(c, arena_strndup(c->a, buf, (size_t)o), (size_t)o);
}

/* ---- booleans ---- */

static val *f_boolean(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *v = ARG(0);
    if (!v)
        return NULL;
    if (v->t == T_NUM && isinf(v->u.num))
        ethrow(c, "D1001", -1, NULL, NULL);
    return VBOOL(val_truthy(c, v, NULL));
}

static val *f_not(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *v = ARG(0);
    if (!v)
        return NULL;
    return VBOOL(!val_truthy(c, v, NULL));
}

static val *f_exists(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return VBOOL(ARG(0) != NULL);
}

/* ---- higher order ---- */

static val *hof_call(struct ctx *c, val *f, val *a1, val *a2, val *a3, struct env *e)
{
    if (!is_fn(f)) /* $sift's function is optional in its signature, as in the reference */
        ethrow(c, "T1006", -1, NULL, NULL);
    int ar = fn_arity(f);
    val *args[3] = {a1, a2, a3};
    int n = 1;
    if (ar >= 2)
        n = 2;
    if (ar >= 3)
        n = 3;
    return apply_fn(c, f, args, n, NULL, e);
}

static val *f_map(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0), *f = ARG(1);
    if (!arr)
        return NULL;
    struct vec out = {0};
    for (uint32_t i = 0; i < arr->n; i++) {
        val *r = hof_call(c, f, aget(c, arr, i), mknum(c, i), arr, e);
        if (r)
            vec_push(c, &out, r);
    }
    return vec_done(c, &out, F_SEQ);
}

static val *f_filter(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0), *f = ARG(1);
    if (!arr)
        return NULL;
    struct vec out = {0};
    for (uint32_t i = 0; i < arr->n; i++) {
        val *it = aget(c, arr, i);
        val *r = hof_call(c, f, it, mknum(c, i), arr, e);
        if (val_truthy(c, r, NULL))
            vec_push(c, &out, it);
    }
    return vec_done(c, &out, F_SEQ);
}

static val *f_single(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0), *f = ARG(1);
    if (!arr)
        return NULL;
    val *result = NULL;
    int found = 0;
    for (uint32_t i = 0; i < arr->n; i++) {
        val *it = aget(c, arr, i);
        int pos = 1;
        if (f)
            pos = val_truthy(c, hof_call(c, f, it, mknum(c, i), arr, e), NULL);
        if (pos) {
            if (found)
                ethrow(c, "D3138", -1, NULL, NULL);
            result = it;
            found = 1;
        }
    }
    if (!found)
        ethrow(c, "D3139", -1, NULL, NULL);
    return result;
}

static val *f_zip(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    uint32_t len = UINT32_MAX;
    for (int i = 0; i < n; i++)
        len = a[i] && is_arr(a[i]) ? (a[i]->n < len ? a[i]->n : len) : 0;
    if (n == 0)
        len = 0;
    struct vec out = {0};
    for (uint32_t i = 0; i < len; i++) {
        struct vec t = {0};
        for (int k = 0; k < n; k++)
            vec_push(c, &t, aget(c, a[k], i));
        vec_push(c, &out, vec_done(c, &t, 0));
    }
    return vec_done(c, &out, 0);
}

static val *f_reduce(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0), *f = ARG(1), *init = ARG(2);
    if (!arr)
        return NULL;
    int ar = fn_arity(f);
    if (ar < 2)
        ethrow(c, "D3050", -1, NULL, NULL);
    uint32_t idx;
    val *result;
    if (!init && arr->n > 0) {
        result = aget(c, arr, 0);
        idx = 1;
    } else {
        result = init;
        idx = 0;
    }
    while (idx < arr->n) {
        val *args[4] = {result, aget(c, arr, idx), mknum(c, idx), arr};
        result = apply_fn(c, f, args, ar >= 4 ? 4 : ar >= 3 ? 3 : 2, NULL, e);
        idx++;
    }
    return result;
}

static val *f_sift(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *o = ARG(0), *f = ARG(1);
    if (!o || !is_obj(o))
        return NULL;
    val *r = mkobj(c);
    struct obj *ob = omat(c, o);
    for (uint32_t i = 0; i < ob->n; i++) {
        val *res = hof_call(c, f, ob->kv[i].v, str_of(c, ob->kv[i].k, ob->kv[i].klen), o, e);
        if (val_truthy(c, res, NULL))
            oset(c, r, ob->kv[i].k, ob->kv[i].klen, ob->kv[i].v);
    }
    return r->n ? r : NULL;
}

static val *f_each(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *o = ARG(0), *f = ARG(1);
    struct vec out = {0};
    if (o && is_obj(o)) {
        struct obj *ob = omat(c, o);
        for (uint32_t i = 0; i < ob->n; i++) {
            val *r = hof_call(c, f, ob->kv[i].v, str_of(c, ob->kv[i].k, ob->kv[i].klen), o, e);
            if (r)
                vec_push(c, &out, r);
        }
    }
    return vec_done(c, &out, F_SEQ);
}

/* ---- objects and arrays ---- */

static void keys_into(struct ctx *c, val *v, val *seen, struct vec *out, int depth)
{
    if (depth > 1000)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    cx_tick(c); /* arrays may share items: the walk can outgrow the memory cap */
    if (is_arr(v)) {
        for (uint32_t i = 0; i < v->n; i++)
            keys_into(c, aget(c, v, i), seen, out, depth + 1);
    } else if (is_obj(v)) {
        struct obj *o = omat(c, v);
        for (uint32_t i = 0; i < o->n; i++) {
            if (oget(c, seen, o->kv[i].k, o->kv[i].klen))
                continue;
            oset(c, seen, o->kv[i].k, o->kv[i].klen, VTRUE);
            vec_push(c, out, str_of(c, o->kv[i].k, o->kv[i].klen));
        }
    }
}

static val *f_keys(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    struct vec out = {0};
    val *seen = mkobj(c);
    if (ARG(0))
        keys_into(c, a[0], seen, &out, 0);
    return vec_done(c, &out, F_SEQ);
}

static val *lookup_rec(struct ctx *c, val *input, val *key, int depth)
{
    if (depth > 1000)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    if (is_arr(input)) {
        struct vec out = {0};
        for (uint32_t i = 0; i < input->n; i++) {
            val *r = lookup_rec(c, aget(c, input, i), key, depth + 1);
            if (!r)
                continue;
            if (is_arr(r))
                for (uint32_t j = 0; j < r->n; j++)
                    vec_push(c, &out, aget(c, r, j));
            else
                vec_push(c, &out, r);
        }
        return vec_done(c, &out, F_SEQ);
    }
    if (is_obj(input))
        return oget(c, input, key->u.s, key->n);
    return NULL;
}

static val *f_lookup(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    if (!ARG(1))
        return NULL;
    return lookup_rec(c, ARG(0), a[1], 0);
}

static val *f_append(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return append(c, ARG(0), ARG(1));
}

static val *spread(struct ctx *c, val *v, int depth)
{
    if (depth > 1000)
        ethrow(c, "U1001", -1, NULL, "value nested too deeply");
    if (is_arr(v)) {
        val *r = mkseq(c);
        for (uint32_t i = 0; i < v->n; i++)
            r = append(c, r, spread(c, aget(c, v, i), depth + 1));
        return r;
    }
    if (is_obj(v)) {
        struct vec out = {0};
        struct obj *o = omat(c, v);
        for (uint32_t i = 0; i < o->n; i++) {
            val *x = mkobj(c);
            oset(c, x, o->kv[i].k, o->kv[i].klen, o->kv[i].v);
            vec_push(c, &out, x);
        }
        return vec_done(c, &out, F_SEQ);
    }
    return v;
}

static val *f_spread(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return spread(c, ARG(0), 0);
}

static val *f_merge(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    if (!arr)
        return NULL;
    val *r = mkobj(c);
    for (uint32_t i = 0; i < arr->n; i++) {
        val *o = aget(c, arr, i);
        if (!is_obj(o))
            continue;
        struct obj *ob = omat(c, o);
        for (uint32_t k = 0; k < ob->n; k++)
            oset(c, r, ob->kv[k].k, ob->kv[k].klen, ob->kv[k].v);
    }
    return r;
}

static val *f_reverse(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    if (!arr)
        return NULL;
    if (arr->n <= 1)
        return arr;
    val **it = cx_alloc(c, sizeof *it * arr->n);
    for (uint32_t i = 0; i < arr->n; i++)
        it[arr->n - 1 - i] = aget(c, arr, i);
    return mkarr(c, it, arr->n, 0);
}

static val *f_error(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *m = ARG(0);
    if (m && m->n)
        ethrow(c, "D3137", -1, NULL, "%.*s", (int)(m->n > 190 ? 190 : m->n), m->u.s);
    ethrow(c, "D3137", -1, NULL, "$error() function evaluated");
}

static val *f_assert(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *cond = ARG(0), *m = ARG(1);
    if (!cond || !cond->u.b) {
        if (m && m->n)
            ethrow(c, "D3141", -1, NULL, "%.*s", (int)(m->n > 190 ? 190 : m->n), m->u.s);
        ethrow(c, "D3141", -1, NULL, "$assert() statement failed");
    }
    return NULL;
}

static val *f_type(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *v = ARG(0);
    if (!v)
        return NULL;
    const char *t;
    switch (v->t) {
    case T_NULL:
        t = "null";
        break;
    case T_NUM:
        if (isinf(v->u.num))
            ethrow(c, "D1001", -1, NULL, NULL);
        t = isnan(v->u.num) ? "object" : "number";
        break;
    case T_STR:
        t = "string";
        break;
    case T_BOOL:
        t = "boolean";
        break;
    case T_ARR:
    case T_JARR:
        t = "array";
        break;
    case T_FUNC:
        t = "function";
        break;
    default:
        t = "object";
        break;
    }
    return str_of(c, t, strlen(t));
}

static val *f_sort(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0), *f = ARG(1);
    if (!arr)
        return NULL;
    if (arr->n <= 1)
        return arr;
    if (!f) {
        int nums = 1, strs = 1;
        for (uint32_t i = 0; i < arr->n; i++) {
            val *x = aget(c, arr, i);
            if (!x || x->t != T_NUM || isnan(x->u.num))
                nums = 0;
            else if (isinf(x->u.num))
                ethrow(c, "D1001", -1, NULL, NULL);
            if (!x || x->t != T_STR)
                strs = 0;
        }
        if (!nums && !strs)
            ethrow(c, "D3070", -1, NULL, NULL);
    }
    return sort_values(c, arr, f, e);
}

static val *f_shuffle(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    if (!arr)
        return NULL;
    if (arr->n <= 1)
        return arr;
    val **r = cx_alloc(c, sizeof *r * arr->n);
    for (uint32_t i = 0; i < arr->n; i++) {
        uint32_t j = (uint32_t)(rng_next(c) % (i + 1));
        if (i != j)
            r[i] = r[j];
        r[j] = aget(c, arr, i);
    }
    return mkarr(c, r, arr->n, 0);
}

/* The items of arr that are not deep-equal to an earlier one, in their
 * order.  Expected O(n) in the size of arr: a hash table of the kept items
 * (val_hash agrees with val_deep_equal) leaves val_deep_equal to confirm
 * candidates, where comparing every pair was O(n^2). */
static val *f_distinct(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *arr = ARG(0);
    if (!arr)
        return NULL;
    if (!is_arr(arr) || arr->n <= 1)
        return arr;
    int flags = is_seq(arr) ? F_SEQ : 0;
    if (arr->f & F_RANGE) { /* distinct integers already: a copy of the range */
        val *r = mkarr(c, NULL, arr->n, flags | F_RANGE);
        r->u.num = arr->u.num;
        return r;
    }
    size_t cap = 16;
    while (cap < (size_t)arr->n * 2)
        cap *= 2;
    uint32_t *slot = cx_alloc(c, sizeof *slot * cap); /* kept item index + 1, 0 empty */
    memset(slot, 0, sizeof *slot * cap);
    uint64_t *hash = cx_alloc(c, sizeof *hash * arr->n); /* of each kept item */
    struct vec out = {0};
    for (uint32_t i = 0; i < arr->n; i++) {
        val *v = aget(c, arr, i);
        uint64_t h = val_hash(c, v);
        size_t k = (size_t)h & (cap - 1);
        int dup = 0;
        for (; slot[k] && !dup; k = (k + 1) & (cap - 1)) {
            uint32_t j = slot[k] - 1;
            dup = hash[j] == h && val_deep_equal(c, v, out.v[j], 0);
        }
        if (dup)
            continue;
        hash[out.n] = h;
        slot[k] = out.n + 1;
        vec_push(c, &out, v);
    }
    return vec_done(c, &out, flags);
}

static val *f_clone(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return clone_value(c, ARG(0));
}

/* ---- encoding ---- */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static val *f_base64encode(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0);
    if (!s)
        return NULL;
    /* Buffer.from(str, 'binary'): each UTF-16 unit truncated to a byte */
    struct sb bytes = {0};
    size_t i = 0;
    while (i < s->n) {
        uint32_t cp = utf8_next(s->u.s, s->n, &i);
        if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            sb_addc(c, &bytes, (char)((0xD800 + (v >> 10)) & 0xFF));
            sb_addc(c, &bytes, (char)((0xDC00 + (v & 0x3FF)) & 0xFF));
        } else {
            sb_addc(c, &bytes, (char)(cp & 0xFF));
        }
    }
    struct sb b = {0};
    sb_add(c, &b, "", 0);
    const unsigned char *u = (const unsigned char *)bytes.p;
    for (size_t k = 0; k < bytes.n; k += 3) {
        uint32_t v = (uint32_t)u[k] << 16;
        if (k + 1 < bytes.n)
            v |= (uint32_t)u[k + 1] << 8;
        if (k + 2 < bytes.n)
            v |= u[k + 2];
        char q[4] = {b64[(v >> 18) & 63], b64[(v >> 12) & 63],
                     k + 1 < bytes.n ? b64[(v >> 6) & 63] : '=',
                     k + 2 < bytes.n ? b64[v & 63] : '='};
        sb_add(c, &b, q, 4);
    }
    return sb_val(c, &b);
}

static val *f_base64decode(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0);
    if (!s)
        return NULL;
    struct sb b = {0};
    sb_add(c, &b, "", 0);
    uint32_t acc = 0;
    int bits = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        char ch = s->u.s[i];
        const char *p = ch ? strchr(b64, ch) : NULL;
        int v;
        if (ch == '-')
            v = 62;
        else if (ch == '_')
            v = 63;
        else if (p)
            v = (int)(p - b64);
        else if (ch == '=')
            break;
        else
            continue;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            sb_addcp(c, &b, (acc >> bits) & 0xFF);
        }
    }
    return sb_val(c, &b);
}

static val *uri_encode(struct ctx *c, val *s, const char *keep, const char *fname)
{
    if (!s)
        return NULL;
    struct sb b = {0};
    sb_add(c, &b, "", 0);
    const unsigned char *u = (const unsigned char *)s->u.s;
    for (uint32_t i = 0; i < s->n; i++) {
        unsigned char ch = u[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            (ch && strchr(keep, ch))) {
            sb_addc(c, &b, (char)ch);
        } else {
            if (ch == 0xED && i + 1 < s->n && (u[i + 1] & 0xE0) == 0xA0)
                ethrow(c, "D3140", -1, fname, "Malformed URL passed to $%s()", fname);
            char t[4];
            snprintf(t, sizeof t, "%%%02X", ch);
            sb_add(c, &b, t, 3);
        }
    }
    return sb_val(c, &b);
}

static val *f_encodeUrlComponent(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return uri_encode(c, ARG(0), "-_.!~*'()", "encodeUrlComponent");
}

static val *f_encodeUrl(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return uri_encode(c, ARG(0), "-_.!~*'();/?:@&=+$,#", "encodeUrl");
}

static int hexv(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    ch = (char)(ch | 0x20);
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

static val *uri_decode(struct ctx *c, val *s, const char *reserved, const char *fname)
{
    if (!s)
        return NULL;
    struct sb b = {0};
    sb_add(c, &b, "", 0);
    const char *p = s->u.s;
    uint32_t n = s->n;
    for (uint32_t i = 0; i < n;) {
        if (p[i] != '%') {
            sb_addc(c, &b, p[i++]);
            continue;
        }
        if (i + 2 >= n + 0 && !(i + 2 < n))
            ethrow(c, "D3140", -1, fname, "Malformed URL passed to $%s()", fname);
        int h = hexv(p[i + 1]), l = hexv(p[i + 2]);
        if (h < 0 || l < 0)
            ethrow(c, "D3140", -1, fname, "Malformed URL passed to $%s()", fname);
        unsigned char b0 = (unsigned char)(h * 16 + l);
        if (b0 < 0x80) {
            if (b0 && strchr(reserved, b0))
                sb_add(c, &b, p + i, 3);
            else
                sb_addc(c, &b, (char)b0);
            i += 3;
            continue;
        }
        int extra = b0 >= 0xF0 && b0 < 0xF8 ? 3 : b0 >= 0xE0 ? 2 : b0 >= 0xC2 && b0 < 0xE0 ? 1 : -1;
        if (extra < 0 || b0 >= 0xF8)
            ethrow(c, "D3140", -1, fname, "Malformed URL passed to $%s()", fname);
        char out[4];
        out[0] = (char)b0;
        uint32_t j = i + 3;
        for (int k = 1; k <= extra; k++) {
            if (j + 2 >= n + 1 || p[j] != '%')
                ethrow(c, "D3140", -1, fname, "Malformed URL passed to $%s()", fname);
            int hh = hexv(p[j + 1]), ll = hexv(p[j + 2]);
            if (hh < 0 || ll < 0 || ((hh * 16 + ll) & 0xC0) != 0x80)
                ethrow(c, "D3140", -1, fname, "Malformed URL passed to $%s()", fname);
            out[k] = (char)(hh * 16 + ll);
            j += 3;
        }
        sb_add(c, &b, out, (size_t)extra + 1);
        i = j;
    }
    return sb_val(c, &b);
}

static val *f_decodeUrlComponent(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return uri_decode(c, ARG(0), "", "decodeUrlComponent");
}

static val *f_decodeUrl(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return uri_decode(c, ARG(0), ";/?:@&=+$,#", "decodeUrl");
}

/* ---- $eval ---- */

int expr_eval_val(struct ctx *c, struct node *root, val *input, struct env *env, val **out);

/* Evaluates root with errors mapped to D3121 (limits pass through). */
static val *eval_guarded(struct ctx *c, struct node *root, val *input, struct env *e)
{
    jmp_buf saved;
    memcpy(saved, c->jb, sizeof saved);
    val *volatile result = NULL;
    int volatile depth = c->depth;
    if (setjmp(c->jb) == 0) {
        val *r;
        expr_eval_val(c, root, input, e, &r);
        result = r;
        memcpy(c->jb, saved, sizeof saved);
        return result;
    }
    memcpy(c->jb, saved, sizeof saved);
    c->depth = depth;
    if (!strcmp(c->err->code, "U1001") || !strcmp(c->err->code, "U1002"))
        longjmp(c->jb, 1);
    char inner[300];
    snprintf(inner, sizeof inner, "%s: %s", c->err->code, c->err->msg);
    ethrow(c, "D3121", -1, NULL, "%.200s", inner);
}

static val *f_eval(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *src = ARG(0), *focus = ARG(1);
    if (!src)
        return NULL;
    val *input = in;
    if (n > 1 && focus) {
        input = focus;
        if (is_arr(input) && !is_seq(input)) {
            input = mkseq1(c, input);
            input->f |= F_OUTER;
        }
    }
    struct expr *x = NULL;
    struct expr_error perr;
    if (expr_compile(src->u.s, src->n, &x, &perr))
        ethrow(c, "D3120", -1, NULL, "%s: %s", perr.code, perr.msg);
    if (c->nowned == c->capowned) {
        c->capowned = c->capowned ? c->capowned * 2 : 4;
        c->owned = xrealloc(c->owned, sizeof *c->owned * (size_t)c->capowned);
    }
    c->owned[c->nowned++] = x;
    return eval_guarded(c, x->root, input, e);
}

/* ---- table ---- */

const struct builtin expr_builtins[] = {
    {"abs", "<n-:n>", f_abs, 1},
    {"append", "<xx:a>", f_append, 2},
    {"assert", "<bs?:x>", f_assert, 2},
    {"average", "<a<n>:n>", f_average, 1},
    {"base64decode", "<s-:s>", f_base64decode, 1},
    {"base64encode", "<s-:s>", f_base64encode, 1},
    {"boolean", "<x-:b>", f_boolean, 1},
    {"ceil", "<n-:n>", f_ceil, 1},
    {"clone", "<(oa)-:o>", f_clone, 1},
    {"contains", "<s-(sf):b>", f_contains, 2},
    {"count", "<a:n>", f_count, 1},
    {"decodeUrl", "<s-:s>", f_decodeUrl, 1},
    {"decodeUrlComponent", "<s-:s>", f_decodeUrlComponent, 1},
    {"distinct", "<x:x>", f_distinct, 1},
    {"each", "<o-f:a>", f_each, 2},
    {"encodeUrl", "<s-:s>", f_encodeUrl, 1},
    {"encodeUrlComponent", "<s-:s>", f_encodeUrlComponent, 1},
    {"error", "<s?:x>", f_error, 1},
    {"eval", "<sx?:x>", f_eval, 2},
    {"exists", "<x:b>", f_exists, 1},
    {"filter", "<af>", f_filter, 2},
    {"floor", "<n-:n>", f_floor, 1},
    {"formatBase", "<n-n?:s>", f_formatBase, 2},
    {"formatInteger", "<n-s:s>", fn_formatInteger, 2},
    {"formatNumber", "<n-so?:s>", fn_formatNumber, 3},
    {"fromMillis", "<n-s?s?:s>", fn_fromMillis, 3},
    {"join", "<a<s>s?:s>", f_join, 2},
    {"keys", "<x-:a<s>>", f_keys, 1},
    {"length", "<s-:n>", f_length, 1},
    {"lookup", "<x-s:x>", f_lookup, 2},
    {"lowercase", "<s-:s>", f_lowercase, 1},
    {"map", "<af>", f_map, 2},
    {"match", "<s-f<s:o>n?:a<o>>", f_match, 3},
    {"max", "<a<n>:n>", f_max, 1},
    {"merge", "<a<o>:o>", f_merge, 1},
    {"millis", "<:n>", fn_millis, 0},
    {"min", "<a<n>:n>", f_min, 1},
    {"not", "<x-:b>", f_not, 1},
    {"now", "<s?s?:s>", fn_now, 2},
    {"number", "<(nsb)-:n>", f_number, 1},
    {"pad", "<s-ns?:s>", f_pad, 3},
    {"parseInteger", "<s-s:n>", fn_parseInteger, 2},
    {"power", "<n-n:n>", f_power, 2},
    {"random", "<:n>", f_random, 0},
    {"reduce", "<afj?:j>", f_reduce, 3},
    {"replace", "<s-(sf)(sf)n?:s>", f_replace, 4},
    {"reverse", "<a:a>", f_reverse, 1},
    {"round", "<n-n?:n>", f_round, 2},
    {"shuffle", "<a:a>", f_shuffle, 1},
    {"sift", "<o-f?:o>", f_sift, 2},
    {"single", "<af?>", f_single, 2},
    {"sort", "<af?:a>", f_sort, 2},
    {"split", "<s-(sf)n?:a<s>>", f_split, 3},
    {"spread", "<x-:a<o>>", f_spread, 1},
    {"sqrt", "<n-:n>", f_sqrt, 1},
    {"string", "<x-b?:s>", f_string, 1},
    {"substring", "<s-nn?:s>", f_substring, 3},
    {"substringAfter", "<s-s:s>", f_substringAfter, 2},
    {"substringBefore", "<s-s:s>", f_substringBefore, 2},
    {"sum", "<a<n>:n>", f_sum, 1},
    {"toMillis", "<s-s?:n>", fn_toMillis, 2},
    {"trim", "<s-:s>", f_trim, 1},
    {"type", "<x:s>", f_type, 1},
    {"uppercase", "<s-:s>", f_uppercase, 1},
    {"zip", "<a+>", f_zip, 0},
};
const int expr_nbuiltins = (int)(sizeof expr_builtins / sizeof expr_builtins[0]);

static struct sig parsed_sigs[sizeof expr_builtins / sizeof expr_builtins[0]];
static pthread_once_t sigs_once = PTHREAD_ONCE_INIT;

static void parse_sigs(void)
{
    for (int i = 0; i < expr_nbuiltins; i++) {
        int ep;
        sig_parse(expr_builtins[i].sigtext, strlen(expr_builtins[i].sigtext), &parsed_sigs[i], &ep);
    }
}

const struct sig *builtin_sig(int i)
{
    pthread_once(&sigs_once, parse_sigs);
    return &parsed_sigs[i];
}

int builtin_find(const char *name, size_t n)
{
    int lo = 0, hi = expr_nbuiltins - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const char *k = expr_builtins[mid].name;
        size_t kl = strlen(k);
        int r = memcmp(k, name, kl < n ? kl : n);
        if (r == 0)
            r = kl < n ? -1 : kl > n ? 1 : 0;
        if (r == 0)
            return mid;
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}
