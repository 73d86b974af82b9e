/*
 * regex — a small backtracking engine for JavaScript regular expressions.
 *
 * Supports what JSONata users write: alternation, greedy and lazy
 * quantifiers ({n,m} included), classes with ranges and \d \w \s escapes,
 * anchors and \b, capturing/non-capturing/named groups, lookahead,
 * backreferences and the i and m flags.  Patterns compile once (at
 * expression compile time) into an immutable program, so matching is
 * thread safe.  Matching works on UTF-8 code points.
 *
 * Never: recurse without bound or run without the evaluation time budget
 * (the VM uses an explicit stack and ticks the evaluation clock), so a
 * catastrophic pattern ends in U1001 rather than a hang.
 */
#include <stdio.h>
#include <stdlib.h>

#include "expr/expr_int.h"

#define RX_MAX_PROG 20000

enum {
    I_CHAR,
    I_ANY,
    I_CLASS,
    I_SPLIT,
    I_JMP,
    I_SAVE,
    I_MATCH,
    I_BOL,
    I_EOL,
    I_WORDB,
    I_NWORDB,
    I_BACKREF,
    I_LOOK,
    I_MARK,
    I_CHKPROG
};

struct cls {
    uint32_t *r; /* pairs lo,hi */
    int n;
    uint8_t neg;
    uint8_t d, D, w, W, s, S;
};

struct inst {
    uint8_t op;
    uint8_t neg;
    int x, y;
    uint32_t ch;
};

struct regex {
    struct inst *prog;
    int n;
    int ngroups;
    int nmarks;
    int icase, multi;
    struct cls *cls;
    int ncls;
};

/* ---- parse to a tree ---- */

enum {
    R_CHAR,
    R_ANY,
    R_CLASS,
    R_CAT,
    R_ALT,
    R_REP,
    R_GROUP,
    R_NCGROUP,
    R_BOL,
    R_EOL,
    R_WORDB,
    R_NWORDB,
    R_BACKREF,
    R_LOOK,
    R_EMPTY
};

struct rn {
    int t;
    uint32_t ch;
    int cls;
    int min, max, lazy; /* repeat */
    int group;
    int neg;
    struct rn *a, *b;
};

struct rp {
    const char *s;
    size_t n, i;
    struct arena *a;
    struct regex *re;
    int err;
    int depth;
    struct cls *cls;
    int ncls, capcls;
};

static struct rn *rnew(struct rp *p, int t)
{
    struct rn *r = arena_alloc(p->a, sizeof *r);
    memset(r, 0, sizeof *r);
    r->t = t;
    return r;
}

static uint32_t rnext(struct rp *p)
{
    return utf8_next(p->s, p->n, &p->i);
}
static int rpeek(struct rp *p)
{
    return p->i < p->n ? (unsigned char)p->s[p->i] : -1;
}

static int add_cls(struct rp *p, struct cls c)
{
    if (p->ncls == p->capcls) {
        int nc = p->capcls ? p->capcls * 2 : 8;
        struct cls *n = arena_alloc(p->a, sizeof *n * (size_t)nc);
        if (p->ncls)
            memcpy(n, p->cls, sizeof *n * (size_t)p->ncls);
        p->cls = n;
        p->capcls = nc;
    }
    p->cls[p->ncls] = c;
    return p->ncls++;
}

struct rbuf {
    uint32_t *r;
    int n, cap;
};
static void rb_add(struct rp *p, struct rbuf *b, uint32_t lo, uint32_t hi)
{
    if (b->n + 2 > b->cap) {
        int nc = b->cap ? b->cap * 2 : 16;
        uint32_t *nr = arena_alloc(p->a, sizeof *nr * (size_t)nc);
        if (b->n)
            memcpy(nr, b->r, sizeof *nr * (size_t)b->n);
        b->r = nr;
        b->cap = nc;
    }
    b->r[b->n++] = lo;
    b->r[b->n++] = hi;
}

static int hexd(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Parses an escape after '\'.  Returns the code point, or sets *kind to
 * 'd','D','w','W','s','S','b','B' or a backreference number (>= 1000). */
static uint32_t parse_escape(struct rp *p, int *kind, int in_class)
{
    *kind = 0;
    if (p->i >= p->n) {
        p->err = 1;
        return 0;
    }
    uint32_t c = rnext(p);
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        *kind = (int)c;
        return 0;
    case 'b':
        if (in_class)
            return '\b';
        *kind = 'b';
        return 0;
    case 'B':
        *kind = 'B';
        return 0;
    case 't':
        return '\t';
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 'f':
        return '\f';
    case 'v':
        return '\v';
    case '0':
        return 0;
    case 'c':
        if (p->i < p->n) {
            int l = rpeek(p);
            if ((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z')) {
                p->i++;
                return (uint32_t)(l % 32);
            }
        }
        return '\\';
    case 'x': {
        if (p->i + 2 <= p->n && hexd(p->s[p->i]) >= 0 && hexd(p->s[p->i + 1]) >= 0) {
            uint32_t v = (uint32_t)(hexd(p->s[p->i]) * 16 + hexd(p->s[p->i + 1]));
            p->i += 2;
            return v;
        }
        return 'x';
    }
    case 'u': {
        if (p->i + 4 <= p->n) {
            uint32_t v = 0;
            int ok = 1;
            for (int k = 0; k < 4; k++) {
                int h = hexd(p->s[p->i + (size_t)k]);
                if (h < 0)
                    ok = 0;
                v = v * 16 + (uint32_t)(h < 0 ? 0 : h);
            }
            if (ok) {
                p->i += 4;
                return v;
            }
        }
        return 'u';
    }
    default:
        if (c >= '1' && c <= '9' && !in_class) {
            int v = (int)(c - '0');
            while (p->i < p->n && rpeek(p) >= '0' && rpeek(p) <= '9' && v < 100)
                v = v * 10 + (rnext(p) - '0');
            *kind = 1000 + v;
            return 0;
        }
        return c;
    }
}

static struct rn *parse_alt(struct rp *p);

static struct rn *parse_class(struct rp *p)
{
    struct cls c;
    memset(&c, 0, sizeof c);
    struct rbuf b = {0};
    if (rpeek(p) == '^') {
        c.neg = 1;
        p->i++;
    }
    int first = 1;
    while (p->i < p->n && (rpeek(p) != ']' || 0)) {
        (void)first;
        first = 0;
        uint32_t lo;
        int kind = 0;
        uint32_t ch = rnext(p);
        if (ch == '\\') {
            lo = parse_escape(p, &kind, 1);
            if (kind) {
                switch (kind) {
                case 'd':
                    c.d = 1;
                    break;
                case 'D':
                    c.D = 1;
                    break;
                case 'w':
                    c.w = 1;
                    break;
                case 'W':
                    c.W = 1;
                    break;
                case 's':
                    c.s = 1;
                    break;
                case 'S':
                    c.S = 1;
                    break;
                default:
                    break;
                }
                continue;
            }
        } else {
            lo = ch;
        }
        uint32_t hi = lo;
        if (rpeek(p) == '-' && p->i + 1 < p->n && p->s[p->i + 1] != ']') {
            p->i++;
            uint32_t h2 = rnext(p);
            if (h2 == '\\') {
                int k2;
                h2 = parse_escape(p, &k2, 1);
                if (k2) {
                    rb_add(p, &b, lo, lo);
                    rb_add(p, &b, '-', '-');
                    switch (k2) {
                    case 'd':
                        c.d = 1;
                        break;
                    case 'w':
                        c.w = 1;
                        break;
                    case 's':
                        c.s = 1;
                        break;
                    default:
                        break;
                    }
                    continue;
                }
            }
            hi = h2;
            if (hi < lo) {
                p->err = 1;
                return NULL;
            }
        }
        rb_add(p, &b, lo, hi);
    }
    if (rpeek(p) != ']') {
        p->err = 1;
        return NULL;
    }
    p->i++;
    c.r = b.r;
    c.n = b.n / 2;
    struct rn *r = rnew(p, R_CLASS);
    r->cls = add_cls(p, c);
    return r;
}

static struct rn *parse_atom(struct rp *p)
{
    int c = rpeek(p);
    struct rn *r;
    if (c == '(') {
        p->i++;
        if (++p->depth > 200) {
            p->err = 2; /* too large to compile (S0304), not malformed */
            return NULL;
        }
        int kind = R_GROUP, neg = 0;
        if (rpeek(p) == '?') {
            p->i++;
            int k = rpeek(p);
            if (k == ':') {
                p->i++;
                kind = R_NCGROUP;
            } else if (k == '=' || k == '!') {
                p->i++;
                kind = R_LOOK;
                neg = k == '!';
            } else if (k == '<' && p->i + 1 < p->n && p->s[p->i + 1] != '=' &&
                       p->s[p->i + 1] != '!') {
                while (p->i < p->n && rpeek(p) != '>')
                    p->i++;
                p->i++;
            } else {
                p->err = 1;
                return NULL;
            }
        }
        int g = 0;
        if (kind == R_GROUP)
            g = ++p->re->ngroups;
        struct rn *in = parse_alt(p);
        if (p->err || rpeek(p) != ')') {
            if (!p->err)
                p->err = 1;
            return NULL;
        }
        p->i++;
        p->depth--;
        r = rnew(p, kind);
        r->a = in;
        r->group = g;
        r->neg = neg;
        return r;
    }
    if (c == '[') {
        p->i++;
        return parse_class(p);
    }
    if (c == '.') {
        p->i++;
        return rnew(p, R_ANY);
    }
    if (c == '^') {
        p->i++;
        return rnew(p, R_BOL);
    }
    if (c == '$') {
        p->i++;
        return rnew(p, R_EOL);
    }
    if (c == '\\') {
        p->i++;
        int kind;
        uint32_t ch = parse_escape(p, &kind, 0);
        if (kind >= 1000) {
            r = rnew(p, R_BACKREF);
            r->group = kind - 1000;
            return r;
        }
        if (kind == 'b' || kind == 'B')
            return rnew(p, kind == 'b' ? R_WORDB : R_NWORDB);
        if (kind) {
            struct cls cl;
            memset(&cl, 0, sizeof cl);
            switch (kind) {
            case 'd':
                cl.d = 1;
                break;
            case 'D':
                cl.D = 1;
                break;
            case 'w':
                cl.w = 1;
                break;
            case 'W':
                cl.W = 1;
                break;
            case 's':
                cl.s = 1;
                break;
            case 'S':
                cl.S = 1;
                break;
            default:
                break;
            }
            r = rnew(p, R_CLASS);
            r->cls = add_cls(p, cl);
            return r;
        }
        r = rnew(p, R_CHAR);
        r->ch = ch;
        return r;
    }
    if (c == ')' || c == '|' || c < 0)
        return rnew(p, R_EMPTY);
    if (c == '*' || c == '+' || c == '?') {
        p->err = 1;
        return NULL;
    }
    r = rnew(p, R_CHAR);
    r->ch = rnext(p);
    return r;
}

static int parse_int(struct rp *p, int *out)
{
    size_t st = p->i;
    long v = 0;
    while (p->i < p->n && rpeek(p) >= '0' && rpeek(p) <= '9') {
        v = v * 10 + (rpeek(p) - '0');
        if (v > 100000)
            v = 100000;
        p->i++;
    }
    *out = (int)v;
    return p->i > st;
}

static struct rn *parse_rep(struct rp *p)
{
    struct rn *a = parse_atom(p);
    if (!a || p->err)
        return NULL;
    if (a->t == R_EMPTY)
        return a;
    for (;;) {
        int c = rpeek(p);
        int min, max;
        if (c == '*') {
            min = 0;
            max = -1;
            p->i++;
        } else if (c == '+') {
            min = 1;
            max = -1;
            p->i++;
        } else if (c == '?') {
            min = 0;
            max = 1;
            p->i++;
        } else if (c == '{') {
            size_t save = p->i;
            p->i++;
            if (!parse_int(p, &min)) {
                p->i = save;
                /* a literal '{' */
                struct rn *lit = rnew(p, R_CHAR);
                (void)lit;
                return a;
            }
            max = min;
            if (rpeek(p) == ',') {
                p->i++;
                if (!parse_int(p, &max))
                    max = -1;
            }
            if (rpeek(p) != '}') {
                p->i = save;
                return a;
            }
            p->i++;
            if (max >= 0 && max < min) {
                p->err = 1;
                return NULL;
            }
        } else {
            return a;
        }
        struct rn *r = rnew(p, R_REP);
        r->a = a;
        r->min = min;
        r->max = max;
        if (rpeek(p) == '?') {
            r->lazy = 1;
            p->i++;
        }
        a = r;
    }
}

static struct rn *parse_cat(struct rp *p)
{
    struct rn *left = NULL;
    while (p->i < p->n && rpeek(p) != '|' && rpeek(p) != ')') {
        struct rn *x;
        if (rpeek(p) == '{') {
            /* literal brace when not a quantifier */
            p->i++;
            x = rnew(p, R_CHAR);
            x->ch = '{';
            size_t save = p->i;
            (void)save;
        } else {
            x = parse_rep(p);
        }
        if (!x || p->err)
            return NULL;
        if (!left) {
            left = x;
        } else {
            struct rn *c = rnew(p, R_CAT);
            c->a = left;
            c->b = x;
            left = c;
        }
    }
    return left ? left : rnew(p, R_EMPTY);
}

static struct rn *parse_alt(struct rp *p)
{
    struct rn *left = parse_cat(p);
    if (!left || p->err)
        return NULL;
    while (rpeek(p) == '|') {
        p->i++;
        struct rn *right = parse_cat(p);
        if (!right || p->err)
            return NULL;
        struct rn *a = rnew(p, R_ALT);
        a->a = left;
        a->b = right;
        left = a;
    }
    return left;
}

/* ---- emit ---- */

struct em {
    struct rp *p;
    struct inst *prog;
    int n, cap;
    int nmarks;
    int err;
};

static int emit(struct em *e, int op)
{
    if (e->n >= RX_MAX_PROG) {
        e->err = 1;
        return e->n - 1 < 0 ? 0 : e->n - 1;
    }
    if (e->n == e->cap) {
        int nc = e->cap ? e->cap * 2 : 64;
        struct inst *np = arena_alloc(e->p->a, sizeof *np * (size_t)nc);
        if (e->n)
            memcpy(np, e->prog, sizeof *np * (size_t)e->n);
        e->prog = np;
        e->cap = nc;
    }
    memset(&e->prog[e->n], 0, sizeof e->prog[e->n]);
    e->prog[e->n].op = (uint8_t)op;
    return e->n++;
}

static void gen(struct em *e, struct rn *r, int depth);

static void gen_star(struct em *e, struct rn *body, int lazy, int depth)
{
    int mark = e->nmarks++;
    int l1 = emit(e, I_SPLIT);
    int l2 = emit(e, I_MARK);
    e->prog[l2].x = mark;
    gen(e, body, depth + 1);
    int ck = emit(e, I_CHKPROG);
    e->prog[ck].x = mark;
    int j = emit(e, I_JMP);
    e->prog[j].x = l1;
    int l3 = e->n;
    if (e->err)
        return;
    if (lazy) {
        e->prog[l1].x = l3;
        e->prog[l1].y = l2;
    } else {
        e->prog[l1].x = l2;
        e->prog[l1].y = l3;
    }
}

static void gen_opt(struct em *e, struct rn *body, int lazy, int depth)
{
    int s = emit(e, I_SPLIT);
    int l1 = e->n;
    gen(e, body, depth + 1);
    int l2 = e->n;
    if (e->err)
        return;
    if (lazy) {
        e->prog[s].x = l2;
        e->prog[s].y = l1;
    } else {
        e->prog[s].x = l1;
        e->prog[s].y = l2;
    }
}

static void gen(struct em *e, struct rn *r, int depth)
{
    if (e->err || !r)
        return;
    if (depth > 1000) {
        e->err = 1;
        return;
    }
    int k;
    switch (r->t) {
    case R_EMPTY:
        break;
    case R_CHAR:
        k = emit(e, I_CHAR);
        e->prog[k].ch = r->ch;
        break;
    case R_ANY:
        emit(e, I_ANY);
        break;
    case R_CLASS:
        k = emit(e, I_CLASS);
        e->prog[k].x = r->cls;
        break;
    case R_BOL:
        emit(e, I_BOL);
        break;
    case R_EOL:
        emit(e, I_EOL);
        break;
    case R_WORDB:
        emit(e, I_WORDB);
        break;
    case R_NWORDB:
        emit(e, I_NWORDB);
        break;
    case R_BACKREF:
        k = emit(e, I_BACKREF);
        e->prog[k].x = r->group;
        break;
    case R_CAT:
        gen(e, r->a, depth + 1);
        gen(e, r->b, depth + 1);
        break;
    case R_ALT: {
        int s = emit(e, I_SPLIT);
        e->prog[s].x = e->n;
        gen(e, r->a, depth + 1);
        int j = emit(e, I_JMP);
        if (e->err)
            return;
        e->prog[s].y = e->n;
        gen(e, r->b, depth + 1);
        if (e->err)
            return;
        e->prog[j].x = e->n;
        break;
    }
    case R_GROUP:
        k = emit(e, I_SAVE);
        e->prog[k].x = 2 * r->group;
        gen(e, r->a, depth + 1);
        k = emit(e, I_SAVE);
        e->prog[k].x = 2 * r->group + 1;
        break;
    case R_NCGROUP:
        gen(e, r->a, depth + 1);
        break;
    case R_LOOK: {
        int l = emit(e, I_LOOK);
        e->prog[l].neg = (uint8_t)r->neg;
        gen(e, r->a, depth + 1);
        emit(e, I_MATCH);
        if (e->err)
            return;
        e->prog[l].x = l + 1;
        e->prog[l].y = e->n;
        break;
    }
    case R_REP: {
        int min = r->min, max = r->max;
        if (min > 1000 || max > 1000) {
            e->err = 1;
            return;
        }
        for (int i = 0; i < min; i++)
            gen(e, r->a, depth + 1);
        if (max < 0) {
            gen_star(e, r->a, r->lazy, depth);
        } else {
            for (int i = min; i < max; i++)
                gen_opt(e, r->a, r->lazy, depth);
        }
        break;
    }
    }
}

struct regex *regex_compile(struct arena *a, const char *pat, size_t n, const char *flags,
                            char *errcode)
{
    struct regex *re = arena_alloc(a, sizeof *re);
    memset(re, 0, sizeof *re);
    re->icase = strchr(flags, 'i') != NULL;
    re->multi = strchr(flags, 'm') != NULL;
    struct rp p = {pat, n, 0, a, re, 0, 0, NULL, 0, 0};
    struct rn *tree = parse_alt(&p);
    if (!tree || p.err || p.i != n) {
        strcpy(errcode, p.err == 2 ? "S0304" : "S0303");
        return NULL;
    }
    struct em e = {&p, NULL, 0, 0, 0, 0};
    int k = emit(&e, I_SAVE);
    e.prog[k].x = 0;
    gen(&e, tree, 0);
    k = emit(&e, I_SAVE);
    e.prog[k].x = 1;
    emit(&e, I_MATCH);
    if (e.err) {
        strcpy(errcode, "S0304");
        return NULL;
    }
    re->prog = e.prog;
    re->n = e.n;
    re->nmarks = e.nmarks;
    re->cls = p.cls;
    re->ncls = p.ncls;
    return re;
}

int regex_ngroups(const struct regex *re)
{
    return re->ngroups;
}

/* ---- match ---- */

static int is_space(uint32_t c)
{
    return c == ' ' || (c >= 9 && c <= 13) || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000 || c == 0xFEFF;
}
static int is_word(uint32_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}
static int is_lt(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x2028 || c == 0x2029;
}

static uint32_t fold(uint32_t c)
{
    if (c >= 'A' && c <= 'Z')
        return c + 32;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7)
        return c + 32;
    if (c >= 0x391 && c <= 0x3A9)
        return c + 32;
    if (c >= 0x410 && c <= 0x42F)
        return c + 32;
    return c;
}

static int cls_has(const struct cls *c, uint32_t ch, int icase)
{
    int in = 0;
    if ((c->d && ch >= '0' && ch <= '9') || (c->D && !(ch >= '0' && ch <= '9')) ||
        (c->w && is_word(ch)) || (c->W && !is_word(ch)) || (c->s && is_space(ch)) ||
        (c->S && !is_space(ch)))
        in = 1;
    for (int i = 0; !in && i < c->n; i++) {
        if (ch >= c->r[2 * i] && ch <= c->r[2 * i + 1])
            in = 1;
        else if (icase) {
            uint32_t f = fold(ch);
            for (uint32_t x = c->r[2 * i]; x <= c->r[2 * i + 1] && x - c->r[2 * i] < 512; x++)
                if (fold(x) == f) {
                    in = 1;
                    break;
                }
        }
    }
    return c->neg ? !in : in;
}

static uint32_t prev_cp(const char *s, long pos)
{
    if (pos <= 0)
        return 0;
    long i = pos - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    size_t k = (size_t)i;
    return utf8_next(s, (size_t)pos, &k);
}

struct bt {
    int pc;
    int reg; /* -1: branch; else register to restore */
    long pos;
};

struct vm {
    struct ctx *c;
    const struct regex *re;
    const char *s;
    long n;
    long *regs;
    int nregs;
    struct bt *st;
    long sp, cap;
    unsigned long steps;
};

static void push(struct vm *m, int pc, int reg, long pos)
{
    if (m->sp == m->cap) {
        long nc = m->cap ? m->cap * 2 : 256;
        struct bt *ns = cx_alloc(m->c, sizeof *ns * (size_t)nc);
        if (m->sp)
            memcpy(ns, m->st, sizeof *ns * (size_t)m->sp);
        m->st = ns;
        m->cap = nc;
    }
    m->st[m->sp].pc = pc;
    m->st[m->sp].reg = reg;
    m->st[m->sp].pos = pos;
    m->sp++;
}

static int word_at(struct vm *m, long pos)
{
    if (pos >= m->n)
        return 0;
    size_t k = (size_t)pos;
    return is_word(utf8_next(m->s, (size_t)m->n, &k));
}

/* Runs the program from pc at pos; returns 1 on a match (regs filled). */
static int run(struct vm *m, int pc0, long pos0, int depth)
{
    const struct regex *re = m->re;
    long base = m->sp;
    int pc = pc0;
    long pos = pos0;
    if (depth > 100)
        ethrow(m->c, "U1001", -1, NULL, "regular expression nested too deeply");
    push(m, -1, -2, 0); /* sentinel */
    for (;;) {
        if ((++m->steps & 63) == 0)
            cx_tick(m->c);
        const struct inst *in = &re->prog[pc];
        int ok = 1;
        switch (in->op) {
        case I_CHAR:
        case I_ANY:
        case I_CLASS: {
            if (pos >= m->n) {
                ok = 0;
                break;
            }
            size_t k = (size_t)pos;
            uint32_t ch = utf8_next(m->s, (size_t)m->n, &k);
            if (in->op == I_CHAR)
                ok = ch == in->ch || (re->icase && fold(ch) == fold(in->ch));
            else if (in->op == I_ANY)
                ok = !is_lt(ch);
            else
                ok = cls_has(&re->cls[in->x], ch, re->icase);
            if (ok) {
                pos = (long)k;
                pc++;
            }
            break;
        }
        case I_SPLIT:
            push(m, in->y, -1, pos);
            pc = in->x;
            break;
        case I_JMP:
            pc = in->x;
            break;
        case I_SAVE:
        case I_MARK:
            push(m, 0, in->op == I_SAVE ? in->x : 2 * re->ngroups + 2 + in->x,
                 m->regs[in->op == I_SAVE ? in->x : 2 * re->ngroups + 2 + in->x]);
            m->regs[in->op == I_SAVE ? in->x : 2 * re->ngroups + 2 + in->x] = pos;
            pc++;
            break;
        case I_CHKPROG:
            ok = m->regs[2 * re->ngroups + 2 + in->x] != pos;
            if (ok)
                pc++;
            break;
        case I_MATCH:
            m->sp = base;
            return 1;
        case I_BOL:
            ok = pos == 0 || (re->multi && is_lt(prev_cp(m->s, pos)));
            if (ok)
                pc++;
            break;
        case I_EOL: {
            if (pos == m->n) {
                pc++;
                break;
            }
            size_t k = (size_t)pos;
            ok = re->multi && is_lt(utf8_next(m->s, (size_t)m->n, &k));
            if (ok)
                pc++;
            break;
        }
        case I_WORDB:
        case I_NWORDB: {
            int a = pos > 0 && is_word(prev_cp(m->s, pos));
            int b = word_at(m, pos);
            ok = (a != b) == (in->op == I_WORDB);
            if (ok)
                pc++;
            break;
        }
        case I_BACKREF: {
            int g = in->x;
            if (g > re->ngroups || m->regs[2 * g] < 0 || m->regs[2 * g + 1] < 0) {
                pc++;
                break;
            }
            long len = m->regs[2 * g + 1] - m->regs[2 * g];
            if (pos + len > m->n) {
                ok = 0;
                break;
            }
            if (re->icase) {
                size_t i1 = (size_t)m->regs[2 * g], i2 = (size_t)pos;
                while (i1 < (size_t)m->regs[2 * g + 1]) {
                    if (i2 >= (size_t)m->n || fold(utf8_next(m->s, (size_t)m->n, &i1)) !=
                                                  fold(utf8_next(m->s, (size_t)m->n, &i2))) {
                        ok = 0;
                        break;
                    }
                }
                if (ok) {
                    pos = (long)i2;
                    pc++;
                }
            } else {
                ok = !memcmp(m->s + m->regs[2 * g], m->s + pos, (size_t)len);
                if (ok) {
                    pos += len;
                    pc++;
                }
            }
            break;
        }
        case I_LOOK: {
            long *save = cx_alloc(m->c, sizeof *save * (size_t)m->nregs);
            memcpy(save, m->regs, sizeof *save * (size_t)m->nregs);
            int r = run(m, in->x, pos, depth + 1);
            if (in->neg || !r)
                memcpy(m->regs, save, sizeof *save * (size_t)m->nregs);
            ok = in->neg ? !r : r;
            if (ok)
                pc = in->y;
            break;
        }
        }
        if (ok)
            continue;
        /* backtrack */
        for (;;) {
            struct bt *b = &m->st[--m->sp];
            if (b->reg == -2) {
                m->sp = base;
                return 0;
            }
            if (b->reg >= 0) {
                m->regs[b->reg] = b->pos;
                continue;
            }
            pc = b->pc;
            pos = b->pos;
            break;
        }
    }
}

int regex_exec(struct ctx *c, const struct regex *re, const char *s, size_t n, size_t from,
               long *caps)
{
    struct vm m;
    memset(&m, 0, sizeof m);
    m.c = c;
    m.re = re;
    m.s = s;
    m.n = (long)n;
    m.nregs = 2 * re->ngroups + 2 + re->nmarks;
    m.regs = cx_alloc(c, sizeof *m.regs * (size_t)m.nregs);
    int first_char = re->n > 1 && re->prog[1].op == I_CHAR && !re->icase && re->prog[1].ch < 0x80;
    for (size_t start = from; start <= n;) {
        if (first_char) {
            const char *f = memchr(s + start, (int)re->prog[1].ch, n - start);
            if (!f)
                return 0;
            start = (size_t)(f - s);
        }
        for (int i = 0; i < m.nregs; i++)
            m.regs[i] = -1;
        m.sp = 0;
        if (run(&m, 0, (long)start, 0)) {
            for (int i = 0; i < 2 * re->ngroups + 2; i++)
                caps[i] = m.regs[i];
            return 1;
        }
        if (start >= n)
            break;
        utf8_next(s, n, &start);
    }
    return 0;
}
