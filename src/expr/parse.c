/*
 * parse — JSONata lexer, Pratt parser and post-parse tree rewriting.
 *
 * A faithful port of jsonata-js 2.x parser.js: the same binding powers, the
 * same error codes (S01xx lexer, S02xx parser, S03xx regex, S04xx
 * signatures) and the same post-processing (location paths flattened into
 * steps, predicates into stages, tail calls marked as thunks, parent-operator
 * slots resolved).  All nodes live in the expression's arena; the parser
 * never allocates on the heap otherwise and bounds its own recursion.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "expr/expr_int.h"

#define PARSE_MAX_DEPTH 300

enum tkind { TK_END, TK_NAME, TK_VAR, TK_STR, TK_NUM, TK_VALUE, TK_REGEX, TK_OP };

struct tok {
    int kind;
    int pos;
    const char *s; /* name/var/string text or operator (NUL-terminated, arena) */
    uint32_t n;
    double num;
    val *lit;
    struct regex *re;
};

struct parser {
    const char *src;
    size_t len;
    size_t p;
    struct arena *a;
    struct tok t; /* current token */
    struct expr_error *err;
    jmp_buf jb;
    int depth;
    int ancestor_label, ancestor_index;
    struct node **ancestry;
    int nanc, capanc;
};

_Noreturn static void perr(struct parser *P, const char *code, int pos, const char *token)
{
    if (P->err) {
        memset(P->err, 0, sizeof *P->err);
        snprintf(P->err->code, sizeof P->err->code, "%s", code);
        P->err->position = pos;
        if (token)
            snprintf(P->err->token, sizeof P->err->token, "%s", token);
        ecode_msg(code, P->err->msg, sizeof P->err->msg);
        if (token && *token) {
            size_t l = strlen(P->err->msg);
            snprintf(P->err->msg + l, sizeof P->err->msg - l, " (token: %s)", token);
        }
    }
    longjmp(P->jb, 1);
}

static void *palloc(struct parser *P, size_t n)
{
    void *p = arena_alloc(P->a, n);
    memset(p, 0, n);
    return p;
}

static struct node *newnode(struct parser *P, int type, int pos)
{
    struct node *n = palloc(P, sizeof *n);
    n->type = (uint8_t)type;
    n->pos = pos;
    n->builtin = -1;
    return n;
}

/* ---- lexer ---- */

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v';
}
static int is_opch(char c)
{
    return c && strchr(".[]{}(),@#;:?+-*/%|=<>^&!~", c) != NULL;
}

static const char *intern_op(const char *s)
{
    static const char *const ops[] = {
        ".",  "[",  "]",  "{",  "}",  "(",  ")",  ",",  "@",  "#",   ";",  ":",  "?",
        "+",  "-",  "*",  "/",  "%",  "|",  "=",  "<",  ">",  "^",   "&",  "!",  "~",
        "..", ":=", "!=", ">=", "<=", "**", "~>", "?:", "??", "and", "or", "in", NULL};
    for (int i = 0; ops[i]; i++)
        if (!strcmp(ops[i], s))
            return ops[i];
    return NULL;
}

/* Appends cp as UTF-8 to a parser-owned growable buffer. */
struct pbuf {
    char *p;
    size_t n, cap;
};
static void pb_add(struct parser *P, struct pbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 64;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *np = arena_alloc(P->a, nc);
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void pb_cp(struct parser *P, struct pbuf *b, uint32_t cp)
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
    pb_add(P, b, o, k);
}

static int hex4(const char *s, size_t avail, uint32_t *out)
{
    if (avail < 4)
        return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = isdigit((unsigned char)c) ? c - '0'
                : (c >= 'a' && c <= 'f')  ? c - 'a' + 10
                : (c >= 'A' && c <= 'F')  ? c - 'A' + 10
                                          : -1;
        if (d < 0)
            return 0;
        v = v * 16 + (uint32_t)d;
    }
    *out = v;
    return 1;
}

static val *lit_str(struct parser *P, const char *s, size_t n)
{
    val *v = palloc(P, sizeof *v);
    v->t = T_STR;
    v->n = (uint32_t)n;
    v->u.s = s;
    return v;
}

static val *lit_num(struct parser *P, double d)
{
    val *v = palloc(P, sizeof *v);
    v->t = T_NUM;
    v->u.num = d;
    return v;
}

static void scan_regex(struct parser *P, struct tok *t)
{
    const char *s = P->src;
    size_t start = P->p;
    int depth = 0;
    while (P->p < P->len) {
        char ch = s[P->p];
        if (ch == '/' && depth == 0) {
            size_t bs = 0;
            while (P->p >= bs + 1 && s[P->p - (bs + 1)] == '\\')
                bs++;
            if (bs % 2 == 0) {
                size_t plen = P->p - start;
                if (plen == 0)
                    perr(P, "S0301", (int)P->p, NULL);
                P->p++;
                size_t fs = P->p;
                while (P->p < P->len && (s[P->p] == 'i' || s[P->p] == 'm'))
                    P->p++;
                char flags[8] = {0};
                size_t fl = P->p - fs;
                if (fl > 6)
                    fl = 6;
                memcpy(flags, s + fs, fl);
                char code[8] = {0};
                t->re = regex_compile(P->a, s + start, plen, flags, code);
                if (!t->re)
                    perr(P, code[0] ? code : "S0302", (int)start, NULL);
                t->s = arena_strndup(P->a, s + start, plen);
                t->n = (uint32_t)plen;
                return;
            }
        }
        if ((ch == '(' || ch == '[' || ch == '{') && (P->p == 0 || s[P->p - 1] != '\\'))
            depth++;
        if ((ch == ')' || ch == ']' || ch == '}') && (P->p == 0 || s[P->p - 1] != '\\'))
            depth--;
        P->p++;
    }
    perr(P, "S0302", (int)P->p, NULL);
}

/* Reads the next token into P->t.  prefix: the token starts an operand, so
 * '/' begins a regex. */
static void lex(struct parser *P, int infix)
{
    const char *s = P->src;
    struct tok *t = &P->t;
    memset(t, 0, sizeof *t);
again:
    while (P->p < P->len && is_ws(s[P->p]))
        P->p++;
    t->pos = (int)P->p;
    if (P->p >= P->len) {
        t->kind = TK_END;
        t->s = "(end)";
        return;
    }
    char c = s[P->p];
    char d = P->p + 1 < P->len ? s[P->p + 1] : 0;
    if (c == '/' && d == '*') {
        size_t cs = P->p;
        P->p += 2;
        for (;;) {
            if (P->p + 1 >= P->len)
                perr(P, "S0106", (int)cs, NULL);
            if (s[P->p] == '*' && s[P->p + 1] == '/')
                break;
            P->p++;
        }
        P->p += 2;
        goto again;
    }
    if (!infix && c == '/') {
        P->p++;
        t->kind = TK_REGEX;
        scan_regex(P, t);
        return;
    }
    static const char *const two[] = {"..", ":=", "!=", ">=", "<=", "**", "~>", "?:", "??", NULL};
    for (int i = 0; two[i]; i++) {
        if (c == two[i][0] && d == two[i][1]) {
            P->p += 2;
            t->kind = TK_OP;
            t->s = two[i];
            return;
        }
    }
    if (is_opch(c)) {
        char b[2] = {c, 0};
        P->p++;
        t->kind = TK_OP;
        t->s = intern_op(b);
        return;
    }
    if (c == '"' || c == '\'') {
        char q = c;
        struct pbuf b = {0};
        pb_add(P, &b, "", 0);
        P->p++;
        while (P->p < P->len) {
            char ch = s[P->p];
            if (ch == '\\') {
                P->p++;
                char e = P->p < P->len ? s[P->p] : 0;
                const char *m = NULL;
                switch (e) {
                case '"':
                    m = "\"";
                    break;
                case '\\':
                    m = "\\";
                    break;
                case '/':
                    m = "/";
                    break;
                case 'b':
                    m = "\b";
                    break;
                case 'f':
                    m = "\f";
                    break;
                case 'n':
                    m = "\n";
                    break;
                case 'r':
                    m = "\r";
                    break;
                case 't':
                    m = "\t";
                    break;
                default:
                    break;
                }
                if (m) {
                    pb_add(P, &b, m, 1);
                } else if (e == 'u') {
                    uint32_t cp;
                    if (!hex4(s + P->p + 1, P->len - P->p - 1, &cp))
                        perr(P, "S0104", (int)P->p, NULL);
                    P->p += 4;
                    if (cp >= 0xD800 && cp < 0xDC00 && P->p + 6 < P->len && s[P->p + 1] == '\\' &&
                        s[P->p + 2] == 'u') {
                        uint32_t lo;
                        if (hex4(s + P->p + 3, P->len - P->p - 3, &lo) && lo >= 0xDC00 &&
                            lo < 0xE000) {
                            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                            P->p += 6;
                        }
                    }
                    pb_cp(P, &b, cp);
                } else {
                    char tk[8] = {e, 0};
                    perr(P, "S0103", (int)P->p, tk);
                }
            } else if (ch == q) {
                P->p++;
                t->kind = TK_STR;
                t->s = b.p;
                t->n = (uint32_t)b.n;
                return;
            } else {
                pb_add(P, &b, &ch, 1);
            }
            P->p++;
        }
        perr(P, "S0101", (int)P->p, NULL);
    }
    if (isdigit((unsigned char)c)) {
        size_t i = P->p;
        if (s[i] == '0')
            i++;
        else
            while (i < P->len && isdigit((unsigned char)s[i]))
                i++;
        if (i + 1 < P->len && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
            i++;
            while (i < P->len && isdigit((unsigned char)s[i]))
                i++;
        }
        if (i < P->len && (s[i] == 'e' || s[i] == 'E')) {
            size_t j = i + 1;
            if (j < P->len && (s[j] == '+' || s[j] == '-'))
                j++;
            if (j < P->len && isdigit((unsigned char)s[j])) {
                while (j < P->len && isdigit((unsigned char)s[j]))
                    j++;
                i = j;
            }
        }
        char tmp[400];
        size_t nl = i - P->p;
        if (nl >= sizeof tmp)
            nl = sizeof tmp - 1;
        memcpy(tmp, s + P->p, nl);
        tmp[nl] = 0;
        double v = strtod(tmp, NULL);
        if (!isfinite(v))
            perr(P, "S0102", (int)P->p, tmp);
        P->p = i;
        t->kind = TK_NUM;
        t->num = v;
        return;
    }
    if (c == '`') {
        P->p++;
        const char *e = memchr(s + P->p, '`', P->len - P->p);
        if (!e) {
            P->p = P->len;
            perr(P, "S0105", (int)P->p, NULL);
        }
        size_t n = (size_t)(e - (s + P->p));
        t->kind = TK_NAME;
        t->s = arena_strndup(P->a, s + P->p, n);
        t->n = (uint32_t)n;
        P->p += n + 1;
        return;
    }
    size_t i = P->p;
    while (i < P->len && !is_ws(s[i]) && !is_opch(s[i]))
        i++;
    if (s[P->p] == '$') {
        t->kind = TK_VAR;
        t->s = arena_strndup(P->a, s + P->p + 1, i - P->p - 1);
        t->n = (uint32_t)(i - P->p - 1);
        P->p = i;
        return;
    }
    size_t n = i - P->p;
    const char *nm = s + P->p;
    P->p = i;
    if (n == 2 && !memcmp(nm, "or", 2)) {
        t->kind = TK_OP;
        t->s = "or";
    } else if (n == 2 && !memcmp(nm, "in", 2)) {
        t->kind = TK_OP;
        t->s = "in";
    } else if (n == 3 && !memcmp(nm, "and", 3)) {
        t->kind = TK_OP;
        t->s = "and";
    } else if (n == 4 && !memcmp(nm, "true", 4)) {
        t->kind = TK_VALUE;
        t->lit = VTRUE;
    } else if (n == 5 && !memcmp(nm, "false", 5)) {
        t->kind = TK_VALUE;
        t->lit = VFALSE;
    } else if (n == 4 && !memcmp(nm, "null", 4)) {
        t->kind = TK_VALUE;
        t->lit = VNULL;
    } else {
        t->kind = TK_NAME;
        t->s = arena_strndup(P->a, nm, n);
        t->n = (uint32_t)n;
    }
}

/* ---- Pratt parser ---- */

static int lbp_of(const struct tok *t)
{
    if (t->kind != TK_OP)
        return 0;
    static const struct {
        const char *op;
        int bp;
    } tab[] = {{".", 75},  {"[", 80},   {"{", 70},  {"(", 80},  {"@", 80},  {"#", 80},  {"?", 20},
               {"+", 50},  {"-", 50},   {"*", 60},  {"/", 60},  {"%", 60},  {"=", 40},  {"<", 40},
               {">", 40},  {"^", 40},   {"!=", 40}, {"<=", 40}, {">=", 40}, {"~>", 40}, {"?:", 40},
               {"??", 40}, {"and", 30}, {"or", 25}, {"in", 40}, {"&", 50},  {":=", 10}, {NULL, 0}};
    for (int i = 0; tab[i].op; i++)
        if (t->s == tab[i].op || !strcmp(t->s, tab[i].op))
            return tab[i].bp;
    return 0;
}

static int is_op(const struct tok *t, const char *op)
{
    return t->kind == TK_OP && !strcmp(t->s, op);
}

static const char *tok_text(struct parser *P, const struct tok *t)
{
    switch (t->kind) {
    case TK_END:
        return "(end)";
    case TK_OP:
        return t->s;
    case TK_NUM: {
        char *b = arena_alloc(P->a, 40);
        fmt_num(t->num, b);
        return b;
    }
    case TK_VALUE:
        return t->lit == VNULL ? "null" : t->lit == VTRUE ? "true" : "false";
    default:
        return t->s ? t->s : "";
    }
}

static void advance(struct parser *P, const char *id, int infix)
{
    if (id && !is_op(&P->t, id)) {
        if (P->t.kind == TK_END)
            perr(P, "S0203", P->t.pos, id);
        perr(P, "S0202", P->t.pos, tok_text(P, &P->t));
    }
    lex(P, infix);
    if (P->t.kind == TK_OP) {
        const char *o = P->t.s;
        if (!strcmp(o, "!") || !strcmp(o, "~"))
            perr(P, "S0204", P->t.pos, o);
    }
}

static struct node *expression(struct parser *P, int rbp);

static struct node *nud(struct parser *P, struct tok *t)
{
    struct node *n;
    switch (t->kind) {
    case TK_END:
        n = newnode(P, N_OPERATOR, t->pos);
        n->name = "(end)";
        return n;
    case TK_NAME:
        n = newnode(P, N_NAME, t->pos);
        n->name = t->s;
        n->nlen = t->n;
        return n;
    case TK_VAR:
        n = newnode(P, N_VARIABLE, t->pos);
        n->name = t->s;
        n->nlen = t->n;
        return n;
    case TK_STR:
        n = newnode(P, N_STRING, t->pos);
        n->name = t->s;
        n->nlen = t->n;
        n->lit = lit_str(P, t->s, t->n);
        return n;
    case TK_NUM:
        n = newnode(P, N_NUMBER, t->pos);
        n->num = t->num;
        n->lit = lit_num(P, t->num);
        return n;
    case TK_VALUE:
        n = newnode(P, N_VALUE, t->pos);
        n->lit = t->lit;
        return n;
    case TK_REGEX:
        n = newnode(P, N_REGEX, t->pos);
        n->re = t->re;
        n->name = t->s;
        n->nlen = t->n;
        return n;
    default:
        break;
    }
    const char *o = t->s;
    if (!strcmp(o, "and") || !strcmp(o, "or") || !strcmp(o, "in")) {
        n = newnode(P, N_NAME, t->pos);
        n->name = o;
        n->nlen = (uint32_t)strlen(o);
        return n;
    }
    if (!strcmp(o, "-")) {
        n = newnode(P, N_UNARY_MINUS, t->pos);
        n->lhs = expression(P, 70);
        return n;
    }
    if (!strcmp(o, "*"))
        return newnode(P, N_WILDCARD, t->pos);
    if (!strcmp(o, "**"))
        return newnode(P, N_DESCENDANT, t->pos);
    if (!strcmp(o, "%"))
        return newnode(P, N_PARENT, t->pos);
    if (!strcmp(o, "(")) {
        n = newnode(P, N_BLOCK, t->pos);
        struct node **items = NULL;
        uint32_t k = 0, cap = 0;
        while (!is_op(&P->t, ")")) {
            if (k == cap) {
                uint32_t nc = cap ? cap * 2 : 8;
                struct node **ni = palloc(P, sizeof *ni * nc);
                if (k)
                    memcpy(ni, items, sizeof *ni * k);
                items = ni;
                cap = nc;
            }
            items[k++] = expression(P, 0);
            if (!is_op(&P->t, ";"))
                break;
            advance(P, ";", 0);
        }
        advance(P, ")", 1);
        n->kids = items;
        n->nkids = k;
        return n;
    }
    if (!strcmp(o, "[")) {
        n = newnode(P, N_ARRAY, t->pos);
        struct node **items = NULL;
        uint32_t k = 0, cap = 0;
        if (!is_op(&P->t, "]")) {
            for (;;) {
                struct node *item = expression(P, 0);
                if (is_op(&P->t, "..")) {
                    struct node *r = newnode(P, N_BINARY, P->t.pos);
                    r->op = OP_RANGE;
                    r->name = "..";
                    r->lhs = item;
                    advance(P, "..", 0);
                    r->rhs = expression(P, 0);
                    item = r;
                }
                if (k == cap) {
                    uint32_t nc = cap ? cap * 2 : 8;
                    struct node **ni = palloc(P, sizeof *ni * nc);
                    if (k)
                        memcpy(ni, items, sizeof *ni * k);
                    items = ni;
                    cap = nc;
                }
                items[k++] = item;
                if (!is_op(&P->t, ","))
                    break;
                advance(P, ",", 0);
            }
        }
        advance(P, "]", 1);
        n->kids = items;
        n->nkids = k;
        return n;
    }
    if (!strcmp(o, "{")) {
        n = newnode(P, N_OBJECT, t->pos);
        goto object;
    object : {
        struct node **pairs = NULL;
        uint32_t k = 0, cap = 0;
        if (!is_op(&P->t, "}")) {
            for (;;) {
                struct node *kx = expression(P, 0);
                advance(P, ":", 0);
                struct node *vx = expression(P, 0);
                if (k == cap) {
                    uint32_t nc = cap ? cap * 2 : 8;
                    struct node **np = palloc(P, sizeof *np * nc * 2);
                    if (k)
                        memcpy(np, pairs, sizeof *np * k * 2);
                    pairs = np;
                    cap = nc;
                }
                pairs[2 * k] = kx;
                pairs[2 * k + 1] = vx;
                k++;
                if (!is_op(&P->t, ","))
                    break;
                advance(P, ",", 0);
            }
        }
        advance(P, "}", 1);
        n->pairs = pairs;
        n->npairs = k;
        return n;
    }
    }
    if (!strcmp(o, "|")) {
        n = newnode(P, N_TRANSFORM, t->pos);
        n->lhs = expression(P, 0);
        advance(P, "|", 0);
        n->rhs = expression(P, 0);
        if (is_op(&P->t, ",")) {
            advance(P, ",", 0);
            n->third = expression(P, 0);
        }
        advance(P, "|", 0);
        return n;
    }
    perr(P, "S0211", t->pos, o);
}

static struct node *led(struct parser *P, struct tok *t, struct node *left)
{
    const char *o = t->s;
    int bp = lbp_of(t);
    struct node *n;
    static const struct {
        const char *op;
        int code;
    } bin[] = {{"+", OP_ADD},   {"-", OP_SUB}, {"*", OP_MUL}, {"/", OP_DIV},
               {"%", OP_MOD},   {"=", OP_EQ},  {"!=", OP_NE}, {"<", OP_LT},
               {"<=", OP_LE},   {">", OP_GT},  {">=", OP_GE}, {"&", OP_CONCAT},
               {"and", OP_AND}, {"or", OP_OR}, {"in", OP_IN}, {NULL, 0}};
    for (int i = 0; bin[i].op; i++) {
        if (!strcmp(o, bin[i].op)) {
            n = newnode(P, N_BINARY, t->pos);
            n->op = (uint8_t)bin[i].code;
            n->name = bin[i].op;
            n->lhs = left;
            n->rhs = expression(P, bp);
            return n;
        }
    }
    if (!strcmp(o, ".")) {
        n = newnode(P, N_DOT_RAW, t->pos);
        n->lhs = left;
        n->rhs = expression(P, bp);
        return n;
    }
    if (!strcmp(o, "~>")) {
        n = newnode(P, N_APPLY, t->pos);
        n->name = "~>";
        n->lhs = left;
        n->rhs = expression(P, bp);
        return n;
    }
    if (!strcmp(o, "??") || !strcmp(o, "?:")) {
        n = newnode(P, N_CONDITION, t->pos);
        n->cond_self = o[1] == '?' ? COND_COALESCE : COND_ELVIS;
        n->lhs = left;
        n->third = expression(P, 0);
        return n;
    }
    if (!strcmp(o, "?")) {
        n = newnode(P, N_CONDITION, t->pos);
        n->lhs = left;
        n->rhs = expression(P, 0);
        if (is_op(&P->t, ":")) {
            advance(P, ":", 0);
            n->third = expression(P, 0);
        }
        return n;
    }
    if (!strcmp(o, "(")) {
        n = newnode(P, N_FUNCTION, t->pos);
        n->lhs = left;
        struct node **args = NULL;
        uint32_t k = 0, cap = 0;
        if (!is_op(&P->t, ")")) {
            for (;;) {
                struct node *a;
                if (is_op(&P->t, "?")) {
                    n->type = N_PARTIAL;
                    a = newnode(P, N_PLACEHOLDER, P->t.pos);
                    advance(P, "?", 0);
                } else {
                    a = expression(P, 0);
                }
                if (k == cap) {
                    uint32_t nc = cap ? cap * 2 : 4;
                    struct node **na = palloc(P, sizeof *na * nc);
                    if (k)
                        memcpy(na, args, sizeof *na * k);
                    args = na;
                    cap = nc;
                }
                args[k++] = a;
                if (!is_op(&P->t, ","))
                    break;
                advance(P, ",", 0);
            }
        }
        advance(P, ")", 1);
        n->kids = args;
        n->nkids = k;
        if (left->type == N_NAME && ((left->nlen == 8 && !memcmp(left->name, "function", 8)) ||
                                     (left->nlen == 2 && !memcmp(left->name, "\xCE\xBB", 2)))) {
            for (uint32_t i = 0; i < k; i++)
                if (args[i]->type != N_VARIABLE)
                    perr(P, "S0208", args[i]->pos, args[i]->name);
            n->type = N_LAMBDA;
            if (is_op(&P->t, "<")) {
                int sigpos = P->t.pos;
                int depth = 1;
                size_t end = (size_t)sigpos;
                while (depth > 0 && !is_op(&P->t, "{") && P->t.kind != TK_END) {
                    advance(P, NULL, 0);
                    if (is_op(&P->t, ">"))
                        depth--;
                    else if (is_op(&P->t, "<"))
                        depth++;
                    end = (size_t)P->t.pos;
                }
                advance(P, ">", 0);
                char sigtext[256];
                size_t sl = 0;
                for (size_t i = (size_t)sigpos; i <= end && i < P->len; i++)
                    if (!is_ws(P->src[i]) && sl + 1 < sizeof sigtext)
                        sigtext[sl++] = P->src[i];
                sigtext[sl] = 0;
                struct sig *sg = palloc(P, sizeof *sg);
                int epos = 0;
                char code[8];
                int rc = sig_parse(sigtext, sl, sg, &epos);
                if (rc) {
                    snprintf(code, sizeof code, "S%04d", rc);
                    perr(P, code, sigpos + epos, NULL);
                }
                n->sig = sg;
            }
            advance(P, "{", 0);
            n->lhs = expression(P, 0);
            advance(P, "}", 0);
        }
        return n;
    }
    if (!strcmp(o, "[")) {
        if (is_op(&P->t, "]")) {
            struct node *step = left;
            while (step && step->type == N_FILTER_RAW)
                step = step->lhs;
            step->keep_array = 1;
            advance(P, "]", 0);
            return left;
        }
        n = newnode(P, N_FILTER_RAW, t->pos);
        n->lhs = left;
        n->rhs = expression(P, 0);
        advance(P, "]", 1);
        return n;
    }
    if (!strcmp(o, "^")) {
        advance(P, "(", 0);
        n = newnode(P, N_SORT_RAW, t->pos);
        n->lhs = left;
        struct node **terms = NULL;
        uint32_t k = 0, cap = 0;
        for (;;) {
            int desc = 0;
            if (is_op(&P->t, "<")) {
                advance(P, "<", 0);
            } else if (is_op(&P->t, ">")) {
                desc = 1;
                advance(P, ">", 0);
            }
            struct node *term = newnode(P, N_SORT, P->t.pos);
            term->descending = (uint8_t)desc;
            term->lhs = expression(P, 0);
            if (k == cap) {
                uint32_t nc = cap ? cap * 2 : 4;
                struct node **nt = palloc(P, sizeof *nt * nc);
                if (k)
                    memcpy(nt, terms, sizeof *nt * k);
                terms = nt;
                cap = nc;
            }
            terms[k++] = term;
            if (!is_op(&P->t, ","))
                break;
            advance(P, ",", 0);
        }
        advance(P, ")", 0);
        n->kids = terms;
        n->nkids = k;
        return n;
    }
    if (!strcmp(o, "{")) {
        n = newnode(P, N_GROUPBY_RAW, t->pos);
        n->lhs = left;
        struct tok fake = *t;
        struct node *obj = nud(P, &fake); /* parses the pairs as an object constructor */
        n->rhs = obj;
        return n;
    }
    if (!strcmp(o, ":=")) {
        if (left->type != N_VARIABLE)
            perr(P, "S0212", left->pos, left->name);
        n = newnode(P, N_BIND, t->pos);
        n->lhs = left;
        n->rhs = expression(P, 9);
        return n;
    }
    if (!strcmp(o, "@") || !strcmp(o, "#")) {
        n = newnode(P, o[0] == '@' ? N_FOCUS_RAW : N_INDEX_RAW, t->pos);
        n->lhs = left;
        n->rhs = expression(P, 80);
        if (n->rhs->type != N_VARIABLE)
            perr(P, "S0214", n->rhs->pos, o);
        return n;
    }
    perr(P, "S0201", t->pos, o);
}

static struct node *expression(struct parser *P, int rbp)
{
    if (++P->depth > PARSE_MAX_DEPTH)
        perr(P, "S0201", P->t.pos, "expression nested too deeply");
    struct tok t = P->t;
    advance(P, NULL, 1);
    struct node *left = nud(P, &t);
    while (rbp < lbp_of(&P->t)) {
        t = P->t;
        advance(P, NULL, 0);
        left = led(P, &t, left);
    }
    P->depth--;
    return left;
}

/* ---- post-processing (processAST) ---- */

static void push_node(struct parser *P, struct node ***arr, uint32_t *n, struct node *x)
{
    struct node **na = palloc(P, sizeof *na * (*n + 1));
    if (*n)
        memcpy(na, *arr, sizeof *na * *n);
    na[*n] = x;
    *arr = na;
    (*n)++;
}

/* Appends to a `seeking` list.  Those lists are only ever built here, so
 * their capacity is implicit: the next power of two (a list is moved to a
 * twice larger block when its length reaches one).  Copying on every push
 * made a chain of parent operators (`%`) under binary operators cost memory
 * cubic in its length, as every enclosing operator appends its operands'
 * lists to its own (a 1 KB expression took ~300 MB and 2 s to compile; now
 * 3 MB: test_expr, t_parent_chains_compile_in_bounded_memory). */
static void push_slot(struct parser *P, struct slot ***arr, uint32_t *n, struct slot *x)
{
    if ((*n & (*n - 1)) == 0) { /* 0, 1, 2, 4, …: full */
        struct slot **na = palloc(P, sizeof *na * (*n ? 2 * (size_t)*n : 1));
        if (*n)
            memcpy(na, *arr, sizeof *na * *n);
        *arr = na;
    }
    (*arr)[(*n)++] = x;
}

static void push_stage(struct parser *P, struct stage **arr, uint32_t *n, struct stage st)
{
    struct stage *na = palloc(P, sizeof *na * (*n + 1));
    if (*n)
        memcpy(na, *arr, sizeof *na * *n);
    na[*n] = st;
    *arr = na;
    (*n)++;
}

static struct slot *seek_parent(struct parser *P, struct node *node, struct slot *slot)
{
    switch (node->type) {
    case N_NAME:
    case N_WILDCARD:
        slot->level--;
        if (slot->level == 0) {
            if (node->ancestor) {
                struct node *anc = P->ancestry[slot->index];
                memcpy(anc->slot->label, node->ancestor->label, sizeof anc->slot->label);
            }
            node->ancestor = slot;
            node->tuple = 1;
        }
        break;
    case N_PARENT:
        slot->level++;
        break;
    case N_BLOCK:
        if (node->nkids > 0) {
            node->tuple = 1;
            slot = seek_parent(P, node->kids[node->nkids - 1], slot);
        }
        break;
    case N_PATH: {
        node->tuple = 1;
        int index = (int)node->nkids - 1;
        slot = seek_parent(P, node->kids[index--], slot);
        while (slot->level > 0 && index >= 0)
            slot = seek_parent(P, node->kids[index--], slot);
        break;
    }
    default:
        perr(P, "S0217", node->pos, "parent");
    }
    return slot;
}

/* The slots a node still seeks: its `seeking` list, then its own slot when
 * it is a parent operator (without copying the list). */
static uint32_t nseeks(const struct node *v)
{
    return v->nseeking + (v->type == N_PARENT);
}

static struct slot *seek_at(const struct node *v, uint32_t i)
{
    return i < v->nseeking ? v->seeking[i] : v->slot;
}

static void push_ancestry(struct parser *P, struct node *result, struct node *value)
{
    for (uint32_t i = 0, ns = nseeks(value); i < ns; i++)
        push_slot(P, &result->seeking, &result->nseeking, seek_at(value, i));
}

static void resolve_ancestry(struct parser *P, struct node *path)
{
    int index = (int)path->nkids - 1;
    struct node *laststep = path->kids[index];
    for (uint32_t is = 0, ns = nseeks(laststep); is < ns; is++) {
        struct slot *slot = seek_at(laststep, is);
        index = (int)path->nkids - 2;
        while (slot->level > 0) {
            if (index < 0) {
                push_slot(P, &path->seeking, &path->nseeking, slot);
                break;
            }
            struct node *step = path->kids[index--];
            while (index >= 0 && step->focus && path->kids[index]->focus)
                step = path->kids[index--];
            slot = seek_parent(P, step, slot);
        }
    }
}

static struct node *tail_call_optimize(struct parser *P, struct node *e)
{
    if (e->type == N_FUNCTION && !e->npreds) {
        struct node *th = newnode(P, N_LAMBDA, e->pos);
        th->thunk = 1;
        th->lhs = e;
        return th;
    }
    if (e->type == N_CONDITION) {
        if (e->rhs)
            e->rhs = tail_call_optimize(P, e->rhs);
        if (e->third)
            e->third = tail_call_optimize(P, e->third);
        return e;
    }
    if (e->type == N_BLOCK) {
        if (e->nkids > 0)
            e->kids[e->nkids - 1] = tail_call_optimize(P, e->kids[e->nkids - 1]);
        return e;
    }
    return e;
}

static struct node *post(struct parser *P, struct node *e);

static struct node *mkpath(struct parser *P, struct node *step)
{
    struct node *p = newnode(P, N_PATH, step->pos);
    push_node(P, &p->kids, &p->nkids, step);
    return p;
}

static struct node *post_inner(struct parser *P, struct node *e)
{
    struct node *result = NULL, *step;
    switch (e->type) {
    case N_DOT_RAW: {
        struct node *lstep = post(P, e->lhs);
        if (lstep->type == N_PATH) {
            result = lstep;
        } else {
            result = mkpath(P, lstep);
            result->pos = e->pos;
        }
        if (lstep->type == N_PARENT)
            push_slot(P, &result->seeking, &result->nseeking, lstep->slot);
        struct node *rest = post(P, e->rhs);
        if (rest->type == N_PATH) {
            for (uint32_t i = 0; i < rest->nkids; i++)
                push_node(P, &result->kids, &result->nkids, rest->kids[i]);
        } else {
            if (rest->npreds) {
                rest->stages = rest->preds;
                rest->nstages = rest->npreds;
                rest->preds = NULL;
                rest->npreds = 0;
            }
            push_node(P, &result->kids, &result->nkids, rest);
        }
        for (uint32_t i = 0; i < result->nkids; i++) {
            struct node *s = result->kids[i];
            if (s->type == N_NUMBER || s->type == N_VALUE)
                perr(P, "S0213", s->pos, s->type == N_NUMBER ? "number" : "value");
            if (s->type == N_STRING)
                s->type = N_NAME;
        }
        for (uint32_t i = 0; i < result->nkids; i++)
            if (result->kids[i]->keep_array)
                result->keep_singleton = 1;
        if (result->kids[0]->type == N_ARRAY)
            result->kids[0]->consarray = 1;
        if (result->kids[result->nkids - 1]->type == N_ARRAY)
            result->kids[result->nkids - 1]->consarray = 1;
        resolve_ancestry(P, result);
        break;
    }
    case N_FILTER_RAW: {
        result = post(P, e->lhs);
        step = result;
        int stages = 0;
        if (result->type == N_PATH) {
            step = result->kids[result->nkids - 1];
            stages = 1;
        }
        if (step->group)
            perr(P, "S0209", e->pos, NULL);
        struct node *pred = post(P, e->rhs);
        if (pred->nseeking) {
            for (uint32_t i = 0; i < pred->nseeking; i++) {
                struct slot *slot = pred->seeking[i];
                if (slot->level == 1)
                    seek_parent(P, step, slot);
                else
                    slot->level--;
            }
            push_ancestry(P, step, pred);
        }
        struct stage st = {0, pred, NULL, 0};
        if (stages)
            push_stage(P, &step->stages, &step->nstages, st);
        else
            push_stage(P, &step->preds, &step->npreds, st);
        break;
    }
    case N_GROUPBY_RAW: {
        result = post(P, e->lhs);
        if (result->group)
            perr(P, "S0210", e->pos, NULL);
        struct node *g = newnode(P, N_OBJECT, e->pos);
        g->npairs = e->rhs->npairs;
        g->pairs = palloc(P, sizeof *g->pairs * (g->npairs * 2 + 1));
        for (uint32_t i = 0; i < g->npairs * 2; i++)
            g->pairs[i] = post(P, e->rhs->pairs[i]);
        result->group = g;
        break;
    }
    case N_SORT_RAW: {
        result = post(P, e->lhs);
        if (result->type != N_PATH)
            result = mkpath(P, result);
        struct node *ss = newnode(P, N_SORT, e->pos);
        ss->nkids = e->nkids;
        ss->kids = palloc(P, sizeof *ss->kids * e->nkids);
        for (uint32_t i = 0; i < e->nkids; i++) {
            struct node *term = newnode(P, N_SORT, e->kids[i]->pos);
            term->descending = e->kids[i]->descending;
            term->lhs = post(P, e->kids[i]->lhs);
            push_ancestry(P, ss, term->lhs);
            ss->kids[i] = term;
        }
        push_node(P, &result->kids, &result->nkids, ss);
        resolve_ancestry(P, result);
        break;
    }
    case N_BIND:
        result = newnode(P, N_BIND, e->pos);
        result->lhs = post(P, e->lhs);
        result->rhs = post(P, e->rhs);
        push_ancestry(P, result, result->rhs);
        break;
    case N_FOCUS_RAW:
        result = post(P, e->lhs);
        step = result;
        if (result->type == N_PATH)
            step = result->kids[result->nkids - 1];
        if (step->nstages || step->npreds)
            perr(P, "S0215", e->pos, "@");
        if (step->type == N_SORT)
            perr(P, "S0216", e->pos, "@");
        if (e->keep_array)
            step->keep_array = 1;
        step->focus = e->rhs->name;
        step->focuslen = e->rhs->nlen;
        step->tuple = 1;
        break;
    case N_INDEX_RAW:
        result = post(P, e->lhs);
        step = result;
        if (result->type == N_PATH) {
            step = result->kids[result->nkids - 1];
        } else {
            result = mkpath(P, result);
            if (step->npreds) {
                step->stages = step->preds;
                step->nstages = step->npreds;
                step->preds = NULL;
                step->npreds = 0;
            }
        }
        if (!step->nstages) {
            step->index = e->rhs->name;
            step->indexlen = e->rhs->nlen;
        } else {
            struct stage st = {1, NULL, e->rhs->name, e->rhs->nlen};
            push_stage(P, &step->stages, &step->nstages, st);
        }
        step->tuple = 1;
        break;
    case N_APPLY:
        result = newnode(P, N_APPLY, e->pos);
        result->lhs = post(P, e->lhs);
        result->rhs = post(P, e->rhs);
        result->keep_array = result->lhs->keep_array || result->rhs->keep_array;
        break;
    case N_BINARY:
        result = newnode(P, N_BINARY, e->pos);
        result->op = e->op;
        result->name = e->name;
        result->lhs = post(P, e->lhs);
        result->rhs = post(P, e->rhs);
        push_ancestry(P, result, result->lhs);
        push_ancestry(P, result, result->rhs);
        break;
    case N_ARRAY:
        result = newnode(P, N_ARRAY, e->pos);
        result->nkids = e->nkids;
        result->kids = palloc(P, sizeof *result->kids * (e->nkids + 1));
        for (uint32_t i = 0; i < e->nkids; i++) {
            result->kids[i] = post(P, e->kids[i]);
            push_ancestry(P, result, result->kids[i]);
        }
        break;
    case N_OBJECT:
        result = newnode(P, N_OBJECT, e->pos);
        result->npairs = e->npairs;
        result->pairs = palloc(P, sizeof *result->pairs * (e->npairs * 2 + 1));
        for (uint32_t i = 0; i < e->npairs * 2; i++) {
            result->pairs[i] = post(P, e->pairs[i]);
            push_ancestry(P, result, result->pairs[i]);
        }
        break;
    case N_UNARY_MINUS:
        result = newnode(P, N_UNARY_MINUS, e->pos);
        result->lhs = post(P, e->lhs);
        if (result->lhs->type == N_NUMBER) {
            result = result->lhs;
            result->num = -result->num;
            result->lit = lit_num(P, result->num);
        } else {
            push_ancestry(P, result, result->lhs);
        }
        break;
    case N_FUNCTION:
    case N_PARTIAL:
        result = newnode(P, e->type, e->pos);
        result->nkids = e->nkids;
        result->kids = palloc(P, sizeof *result->kids * (e->nkids + 1));
        for (uint32_t i = 0; i < e->nkids; i++) {
            result->kids[i] = post(P, e->kids[i]);
            push_ancestry(P, result, result->kids[i]);
        }
        result->lhs = post(P, e->lhs);
        break;
    case N_LAMBDA:
        result = newnode(P, N_LAMBDA, e->pos);
        result->kids = e->kids;
        result->nkids = e->nkids;
        result->sig = e->sig;
        result->lhs = tail_call_optimize(P, post(P, e->lhs));
        break;
    case N_CONDITION:
        result = newnode(P, N_CONDITION, e->pos);
        result->cond_self = e->cond_self;
        result->lhs = post(P, e->lhs);
        push_ancestry(P, result, result->lhs);
        if (e->rhs) {
            result->rhs = post(P, e->rhs);
            push_ancestry(P, result, result->rhs);
        }
        if (e->third) {
            result->third = post(P, e->third);
            push_ancestry(P, result, result->third);
        }
        break;
    case N_TRANSFORM:
        result = newnode(P, N_TRANSFORM, e->pos);
        result->lhs = post(P, e->lhs);
        result->rhs = post(P, e->rhs);
        if (e->third)
            result->third = post(P, e->third);
        break;
    case N_BLOCK:
        result = newnode(P, N_BLOCK, e->pos);
        result->nkids = e->nkids;
        result->kids = palloc(P, sizeof *result->kids * (e->nkids + 1));
        for (uint32_t i = 0; i < e->nkids; i++) {
            struct node *part = post(P, e->kids[i]);
            push_ancestry(P, result, part);
            if (part->consarray || (part->type == N_PATH && part->kids[0]->consarray))
                result->consarray = 1;
            result->kids[i] = part;
        }
        break;
    case N_NAME:
        result = mkpath(P, e);
        if (e->keep_array)
            result->keep_singleton = 1;
        break;
    case N_PARENT: {
        result = newnode(P, N_PARENT, e->pos);
        struct slot *s = palloc(P, sizeof *s);
        snprintf(s->label, sizeof s->label, "!%d", P->ancestor_label++);
        s->level = 1;
        s->index = P->ancestor_index++;
        result->slot = s;
        if (P->nanc == P->capanc) {
            int nc = P->capanc ? P->capanc * 2 : 8;
            struct node **na = palloc(P, sizeof *na * (size_t)nc);
            if (P->nanc)
                memcpy(na, P->ancestry, sizeof *na * (size_t)P->nanc);
            P->ancestry = na;
            P->capanc = nc;
        }
        P->ancestry[P->nanc++] = result;
        break;
    }
    case N_STRING:
    case N_NUMBER:
    case N_VALUE:
    case N_WILDCARD:
    case N_DESCENDANT:
    case N_VARIABLE:
    case N_REGEX:
    case N_PLACEHOLDER:
        result = e;
        break;
    case N_OPERATOR:
        if (e->name && !strcmp(e->name, "(end)"))
            perr(P, "S0207", e->pos, NULL);
        perr(P, "S0201", e->pos, e->name);
    default:
        perr(P, "S0206", e->pos, NULL);
    }
    if (e->keep_array)
        result->keep_array = 1;
    return result;
}

static struct node *post(struct parser *P, struct node *e)
{
    if (++P->depth > PARSE_MAX_DEPTH * 2)
        perr(P, "S0201", e->pos, "expression nested too deeply");
    struct node *r = post_inner(P, e);
    P->depth--;
    return r;
}

static void resolve_builtins(struct node *n, int depth)
{
    if (!n || depth > PARSE_MAX_DEPTH * 4)
        return;
    if (n->type == N_VARIABLE)
        n->builtin = builtin_find(n->name, n->nlen);
    resolve_builtins(n->lhs, depth + 1);
    resolve_builtins(n->rhs, depth + 1);
    resolve_builtins(n->third, depth + 1);
    resolve_builtins(n->group, depth + 1);
    for (uint32_t i = 0; i < n->nkids; i++)
        resolve_builtins(n->kids[i], depth + 1);
    for (uint32_t i = 0; i < n->npairs * 2; i++)
        resolve_builtins(n->pairs[i], depth + 1);
    for (uint32_t i = 0; i < n->npreds; i++)
        resolve_builtins(n->preds[i].expr, depth + 1);
    for (uint32_t i = 0; i < n->nstages; i++)
        resolve_builtins(n->stages[i].expr, depth + 1);
}

int parse_expr(const char *src, size_t len, struct arena *a, struct node **out,
               struct expr_error *err)
{
    struct parser *P = arena_alloc(a, sizeof *P);
    memset(P, 0, sizeof *P);
    P->src = src;
    P->len = len;
    P->a = a;
    P->err = err;
    if (setjmp(P->jb))
        return IFL_EEXPR;
    lex(P, 0);
    if (P->t.kind == TK_OP && (!strcmp(P->t.s, "!") || !strcmp(P->t.s, "~")))
        perr(P, "S0204", P->t.pos, P->t.s);
    struct node *e = expression(P, 0);
    if (P->t.kind != TK_END)
        perr(P, "S0201", P->t.pos, tok_text(P, &P->t));
    P->depth = 0;
    e = post(P, e);
    if (e->type == N_PARENT || e->nseeking)
        perr(P, "S0217", e->pos, "parent");
    resolve_builtins(e, 0);
    *out = e;
    return 0;
}

/* ---- function signatures ---- */

/* Parses "<...>" into s.  Returns 0 or the S04xx number, *errpos set. */
int sig_parse(const char *text, size_t n, struct sig *s, int *errpos)
{
    memset(s, 0, sizeof *s);
    size_t pos = 1;
    struct sigparam *prev = NULL;
    while (pos < n) {
        char sym = text[pos];
        if (sym == ':')
            break;
        struct sigparam *p = s->n < SIG_MAX ? &s->p[s->n] : NULL;
        switch (sym) {
        case 's':
        case 'n':
        case 'b':
        case 'l':
        case 'o':
        case 'a':
        case 'f':
        case 'j':
        case 'x':
            if (!p)
                return 402;
            memset(p, 0, sizeof *p);
            p->type = sym;
            if (sym == 'a' || sym == 'x')
                strcpy(p->types, "asnblfom");
            else if (sym == 'f')
                strcpy(p->types, "f");
            else if (sym == 'j')
                strcpy(p->types, "asnblom");
            else {
                p->types[0] = sym;
                p->types[1] = 'm';
            }
            prev = p;
            s->n++;
            break;
        case '-':
            if (prev)
                prev->context = prev->opt = 1;
            break;
        case '?':
            if (prev)
                prev->opt = 1;
            break;
        case '+':
            if (prev)
                prev->plus = 1;
            break;
        case '(': {
            size_t e = pos + 1;
            while (e < n && text[e] != ')')
                e++;
            if (!p)
                return 402;
            memset(p, 0, sizeof *p);
            size_t k = 0;
            for (size_t i = pos + 1; i < e; i++) {
                if (text[i] == '<') {
                    *errpos = (int)pos;
                    return 402;
                }
                if (k + 2 < sizeof p->types)
                    p->types[k++] = text[i];
            }
            p->types[k++] = 'm';
            p->type = '(';
            prev = p;
            s->n++;
            pos = e;
            break;
        }
        case '<': {
            if (!prev || (prev->type != 'a' && prev->type != 'f')) {
                *errpos = (int)pos;
                return 401;
            }
            int depth = 1;
            size_t e = pos;
            while (e + 1 < n && depth > 0) {
                e++;
                if (text[e] == '>')
                    depth--;
                else if (text[e] == '<')
                    depth++;
            }
            if (prev->type == 'a')
                prev->subtype = text[pos + 1];
            pos = e;
            break;
        }
        default:
            break;
        }
        pos++;
    }
    return 0;
}
