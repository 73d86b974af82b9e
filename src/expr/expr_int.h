/*
 * expr_int — definitions shared by the files of the expr module only.
 *
 * Values (`val`) live in the per-evaluation arena and are 16 bytes.  JSON
 * input stays in jansson: arrays and objects are wrapped lazily (T_JARR,
 * T_JOBJ) and materialised in place the first time they are iterated.
 * Undefined is the NULL pointer.  Errors unwind with longjmp to expr_eval;
 * everything allocated during evaluation belongs to the arena, so nothing
 * leaks on that path (the few heap objects are registered for cleanup).
 */
#ifndef IFL_EXPR_INT_H
#define IFL_EXPR_INT_H

#include <jansson.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>

#include "base/mem.h"
#include "expr/expr.h"

enum vtype { T_NULL = 1, T_BOOL, T_NUM, T_STR, T_ARR, T_OBJ, T_JARR, T_JOBJ, T_FUNC };

/* array flags (JSONata's hidden properties) */
#define F_SEQ 1    /* a sequence, not a JSON array */
#define F_KEEP 2   /* keepSingleton */
#define F_CONS 4   /* built by an array constructor */
#define F_OUTER 8  /* outerWrapper around an input array */
#define F_TUPLE 16 /* tuple stream (items are T_OBJ tuples) */
#define F_RANGE 32 /* lazy integer range: u.num = first, n = count */

typedef struct val val;
struct obj;
struct fnv;

struct val {
    uint8_t t;
    uint8_t f;
    uint16_t x;
    uint32_t n; /* string bytes, array length, object member count */
    union {
        double num;
        int b;
        const char *s;
        val **items;
        struct obj *obj;
        json_t *j;
        struct fnv *fn;
    } u;
};

struct kv {
    const char *k;
    uint32_t klen;
    val *v;
};

struct obj {
    struct kv *kv;
    uint32_t n, cap;
    uint32_t *idx; /* open-addressing index of kv positions+1, or NULL */
    uint32_t icap;
};

/* ---- syntax tree ---- */

enum ntype {
    N_PATH = 1,
    N_BINARY,
    N_UNARY_MINUS,
    N_ARRAY,
    N_OBJECT,
    N_NAME,
    N_STRING,
    N_NUMBER,
    N_VALUE,
    N_WILDCARD,
    N_DESCENDANT,
    N_PARENT,
    N_CONDITION,
    N_BLOCK,
    N_BIND,
    N_REGEX,
    N_FUNCTION,
    N_PARTIAL,
    N_VARIABLE,
    N_LAMBDA,
    N_APPLY,
    N_TRANSFORM,
    N_SORT,
    N_PLACEHOLDER,
    N_OPERATOR,
    N_GROUPBY_RAW,
    N_SORT_RAW,
    N_FILTER_RAW,
    N_DOT_RAW,
    N_FOCUS_RAW,
    N_INDEX_RAW
};

enum op {
    OP_NONE,
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_MOD,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_LE,
    OP_GT,
    OP_GE,
    OP_CONCAT,
    OP_AND,
    OP_OR,
    OP_IN,
    OP_RANGE
};

struct sig;
struct regex;
struct node;

struct slot {
    char label[16];
    int level;
    int index;
};

struct stage {
    int is_index;      /* 0: filter, 1: index binding */
    struct node *expr; /* filter predicate */
    const char *name;  /* index variable */
    uint32_t nlen;
};

/* `a ?: b` and `a ?? b` are conditions whose "then" value is the condition's
 * own value: a is evaluated once, never copied (a copy per operator made
 * nested ones exponential in size). */
#define COND_ELVIS 1    /* a if a is truthy, else b */
#define COND_COALESCE 2 /* a if a is defined ($exists(a)), else b */

struct node {
    uint8_t type;
    uint8_t op;
    uint8_t keep_array, consarray, keep_singleton, thunk, tuple, descending;
    uint8_t cond_self; /* N_CONDITION without rhs: COND_ELVIS (?:) or COND_COALESCE (??) */
    int pos;
    const char *name; /* name, variable, string value, operator text */
    uint32_t nlen;
    double num;
    val *lit;                       /* literal value for N_STRING/N_NUMBER/N_VALUE */
    struct node *lhs, *rhs, *third; /* binary; condition: lhs?rhs:third */
    struct node **kids;             /* path steps, array items, block, args, params, sort terms */
    uint32_t nkids;
    struct node **pairs; /* object constructor key,value,key,value… */
    uint32_t npairs;     /* number of pairs */
    struct stage *preds; /* predicates (filters) after the node */
    uint32_t npreds;
    struct stage *stages; /* path step stages */
    uint32_t nstages;
    struct node *group; /* group-by: an N_OBJECT node */
    struct sig *sig;
    struct regex *re;
    int builtin; /* N_VARIABLE: index into builtins or -1 */
    /* tuple / ancestry */
    const char *focus; /* @$var */
    uint32_t focuslen;
    const char *index; /* #$var */
    uint32_t indexlen;
    struct slot *ancestor; /* label bound to the parent for % */
    struct slot *slot;     /* N_PARENT: its slot (label) */
    struct slot **seeking; /* slots seeking a parent */
    uint32_t nseeking;
};

/* ---- functions ---- */

#define SIG_MAX 12
struct sigparam {
    char types[12]; /* accepted symbols, e.g. "sm", "asnblfom" */
    char type;      /* declared: s n b l o a f j x or '(' */
    char subtype;   /* a<s> etc, 0 when none */
    uint8_t opt, plus, context;
};
struct sig {
    struct sigparam p[SIG_MAX];
    int n;
};

struct ctx;
struct env;
typedef val *(*bifn)(struct ctx *c, val **args, int n, val *input, struct env *env);

struct builtin {
    const char *name;
    const char *sigtext;
    bifn fn;
    int arity; /* declared JS parameter count (for HOF arity rules) */
};

enum fkind { FK_LAMBDA = 1, FK_BUILTIN, FK_PARTIAL, FK_REGEX, FK_TRANSFORM, FK_CHAIN };

struct fnv {
    int kind;
    /* lambda */
    struct node *lam;     /* N_LAMBDA node (params in kids, body in lhs) */
    struct node **params; /* unbound params (partial application) */
    uint32_t nparams;
    val *input;
    struct env *env;
    int thunk;
    /* builtin / partial builtin */
    const struct builtin *bi;
    const struct sig *sig;
    val **pargs; /* partial builtin: bound args; holes are NULL with hole[] set */
    uint8_t *hole;
    int npargs;
    /* regex */
    struct regex *re;
    /* chain */
    val *f, *g;
};

/* ---- evaluation ---- */

struct bind {
    const char *name;
    uint32_t nlen;
    val *v;
};

struct env {
    struct env *parent;
    struct bind *b;
    uint32_t n, cap;
};

struct ctx {
    struct arena *a;
    jmp_buf jb;
    struct expr_error *err;
    int depth, max_depth;
    long max_ms;
    size_t max_bytes;
    struct timespec start;
    unsigned ticks;
    json_t *bindings;
    val *root;           /* $$ */
    double now_ms;       /* $now / $millis, fixed per evaluation */
    struct expr **owned; /* $eval compilations to free */
    int nowned, capowned;
    int depth_in_values;
};

/* errors (never return) */
_Noreturn void ethrow(struct ctx *c, const char *code, int pos, const char *token, const char *fmt,
                      ...) __attribute__((format(printf, 5, 6)));
void ecode_msg(const char *code, char *out, size_t n);

/* allocation */
void *cx_alloc(struct ctx *c, size_t n);
/* The time limit.  cx_tick counts one step and reads the clock every 256 of
 * them (the clock starts at the first reading, so short evaluations never
 * pay for it); past max_ms it throws U1001.  Every loop whose length is not
 * bounded by the memory cap (it allocates nothing per turn, or revisits what
 * it has) must tick: per turn, or, for work on bytes, through cx_tickn with
 * one step per CX_TICK_BYTES. */
void cx_tick(struct ctx *c);
void cx_tickn(struct ctx *c, size_t n); /* n steps at once */
#define CX_TICK_BYTES 4096

/* value constructors */
extern const val v_null, v_true, v_false;
#define VNULL ((val *)&v_null)
#define VTRUE ((val *)&v_true)
#define VFALSE ((val *)&v_false)
#define VBOOL(x) ((x) ? VTRUE : VFALSE)
val *mknum(struct ctx *c, double d);
val *mkstr(struct ctx *c, const char *s, size_t n); /* copies */
val *mkstr_nocopy(struct ctx *c, const char *s, size_t n);
val *mkarr(struct ctx *c, val **items, uint32_t n, int flags);
val *mkseq(struct ctx *c);
val *mkseq1(struct ctx *c, val *x);
val *mkobj(struct ctx *c);
val *mkfn(struct ctx *c, struct fnv *f);
val *wrapj(struct ctx *c, json_t *j);

/* growable arrays during construction */
struct vec {
    val **v;
    uint32_t n, cap;
};
void vec_push(struct ctx *c, struct vec *a, val *x);
val *vec_done(struct ctx *c, struct vec *a, int flags);

/* accessors */
static inline int is_arr(const val *v)
{
    return v && (v->t == T_ARR || v->t == T_JARR);
}
static inline int is_obj(const val *v)
{
    return v && (v->t == T_OBJ || v->t == T_JOBJ);
}
static inline int is_fn(const val *v)
{
    return v && v->t == T_FUNC;
}
static inline int is_str(const val *v)
{
    return v && v->t == T_STR;
}
static inline int is_num(const val *v)
{
    return v && v->t == T_NUM;
}
static inline int is_seq(const val *v)
{
    return v && v->t == T_ARR && (v->f & F_SEQ);
}
uint32_t alen(const val *a);
val *aget(struct ctx *c, val *a, uint32_t i);
void amat(struct ctx *c, val *a); /* materialise T_JARR / range into T_ARR items */
struct obj *omat(struct ctx *c, val *o);
val *oget(struct ctx *c, val *o, const char *k, size_t klen);
void oset(struct ctx *c, val *o, const char *k, size_t klen, val *v);
void odel(struct ctx *c, val *o, const char *k, size_t klen);

/* conversions */
json_t *val_to_json(struct ctx *c, val *v, int depth);
int val_truthy(struct ctx *c, val *v, int *defined); /* $boolean */
int val_deep_equal(struct ctx *c, val *a, val *b, int depth);
/* A hash that agrees with val_deep_equal: values it calls equal hash alike
 * (members of objects in any order, 0 and -0, T_JARR and T_ARR).  Looks at
 * the first levels of nesting only, so it never throws on deep values. */
uint64_t val_hash(struct ctx *c, val *v);
const char *val_string(struct ctx *c, val *v, int prettify, uint32_t *len); /* $string */
void fmt_num(double d, char out[40]);
int num_is_int(double d);
val *append(struct ctx *c, val *a, val *b);
val *flatten_into(struct ctx *c, val *v, struct vec *out, int depth);

/* string builder in the arena */
struct sb {
    char *p;
    size_t n, cap;
};
void sb_add(struct ctx *c, struct sb *b, const char *s, size_t n);
void sb_addc(struct ctx *c, struct sb *b, char ch);
void sb_addcp(struct ctx *c, struct sb *b, uint32_t cp);
val *sb_val(struct ctx *c, struct sb *b);

/* utf-8 */
uint32_t utf8_next(const char *s, size_t n, size_t *i);
size_t utf8_len(const char *s, size_t n);
/* Code point index of byte offset `byte` in s, for offsets that mostly grow
 * (the matches of one scan): the cache keeps the last answer, so a scan
 * costs O(n) in all rather than O(n) per match.  Start with a zeroed cache;
 * it is valid for one string at a time. */
struct cpcache {
    const char *s;
    size_t byte, cp;
};
size_t cp_index(struct ctx *c, struct cpcache *k, const char *s, size_t byte);

/* evaluator entry points used by functions */
val *ev(struct ctx *c, struct node *e, val *input, struct env *env);
val *apply_fn(struct ctx *c, val *proc, val **args, int n, val *input, struct env *env);
int fn_arity(val *f);
struct env *env_new(struct ctx *c, struct env *parent);
void env_bind(struct ctx *c, struct env *e, const char *name, uint32_t nlen, val *v);
val *env_lookup(struct ctx *c, struct env *e, const char *name, uint32_t nlen);

/* builtins */
extern const struct builtin expr_builtins[];
extern const int expr_nbuiltins;
int builtin_find(const char *name, size_t n);
const struct sig *builtin_sig(int i);
int sig_parse(const char *text, size_t n, struct sig *out, int *errpos);
val **sig_validate(struct ctx *c, const struct sig *s, val **args, int n, val *context, int *nout,
                   int pos, const char *token);

/* compile */
struct expr {
    char *src;
    size_t len;
    struct arena *a;
    struct node *root;
    /* Interned (eval.c): one compiled expression per source text, shared
     * by every holder — immutable once compiled, so safe to share. */
    unsigned refs;      /* under the intern table's mutex */
    uint64_t hash;      /* of src */
    struct expr *inext; /* the intern table's chain */
};
int parse_expr(const char *src, size_t len, struct arena *a, struct node **out,
               struct expr_error *err);

/* regex */
struct regex *regex_compile(struct arena *a, const char *pat, size_t n, const char *flags,
                            char *errcode);
/* Finds the first match at or after byte `from`.  Returns 1 and fills caps
 * (2*ngroups+2 byte offsets, -1 unset) or 0.  Throws U1001 via ctx on
 * runaway backtracking. */
int regex_exec(struct ctx *c, const struct regex *re, const char *s, size_t n, size_t from,
               long *caps);
int regex_ngroups(const struct regex *re);

/* date/time and number pictures */
val *fn_fromMillis(struct ctx *c, val **a, int n, val *in, struct env *e);
val *fn_toMillis(struct ctx *c, val **a, int n, val *in, struct env *e);
val *fn_now(struct ctx *c, val **a, int n, val *in, struct env *e);
val *fn_millis(struct ctx *c, val **a, int n, val *in, struct env *e);
val *fn_formatNumber(struct ctx *c, val **a, int n, val *in, struct env *e);
val *fn_formatInteger(struct ctx *c, val **a, int n, val *in, struct env *e);
val *fn_parseInteger(struct ctx *c, val **a, int n, val *in, struct env *e);

#endif
