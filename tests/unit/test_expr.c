/*
 * test_expr — unit tests for the expr module's API: compile errors,
 * evaluation results and undefined, bindings, limits, templates with
 * secrets, and concurrent evaluation of one compiled expression.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/mem.h"
#include "expr/expr.h"
#include "expr/expr_int.h" /* expr_builtins: the sweep below calls every one */
#include "expr/template.h"
#include "json/json.h"

/* Evaluates src against the JSON text data (NULL = undefined) and returns
 * the compact result ("undefined" or "ERR:CODE") in a static-free buffer. */
static char *run(const char *src, const char *data, const char *bindings,
                 const struct expr_limits *lim)
{
    json_t *in = data ? json_loads(data, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL) : NULL;
    json_t *b = bindings ? json_loads(bindings, 0, NULL) : NULL;
    struct expr *x = NULL;
    struct expr_error e;
    json_t *out = NULL;
    char *r;
    if (expr_compile(src, strlen(src), &x, &e) || expr_eval(x, in, b, lim, &out, &e)) {
        r = xasprintf("ERR:%s", e.code);
    } else if (!out) {
        r = xstrdup("undefined");
    } else {
        r = json_to_string(out);
    }
    json_decref(out);
    json_decref(in);
    json_decref(b);
    expr_free(x);
    return r;
}

static void check(const char *src, const char *data, const char *want)
{
    char *got = run(src, data, NULL, NULL);
    if (strcmp(got, want))
        fail_msg("%s => %s, want %s", src, got, want);
    free(got);
}

static void t_basics(void **s)
{
    (void)s;
    const char *pay = "{\"payload\":{\"order\":{\"id\":\"A17\",\"amount\":12.5}},"
                      "\"response\":{\"status\":404,\"body\":{\"items\":[]}}}";
    check("'charge-' & payload.order.id", pay, "\"charge-A17\"");
    check("response.status = 404 and $count(response.body.items) = 0", pay, "true");
    check("payload.order.amount * 2", pay, "25");
    check("payload.missing", pay, "undefined");
    check("0.1 + 0.2", NULL, "0.30000000000000004");
    check("[1..3].($ * 2)", NULL, "[2,4,6]");
    check("$sum([1,2,3])", NULL, "6");
    check("{'a': 1}.a", NULL, "1");
    check("$string({'b': [1, 'x']})", NULL, "\"{\\\"b\\\":[1,\\\"x\\\"]}\"");
    check("$map([1,2], function($v) { $v + 1 })", NULL, "[2,3]");
    check("$replace('abc', /b/, 'X')", NULL, "\"aXc\"");
    check("$fromMillis(0)", NULL, "\"1970-01-01T00:00:00.000Z\"");
    check("$toMillis('1970-01-01T00:00:01Z')", NULL, "1000");
    check("1 + 'a'", NULL, "ERR:T2002");
    check("$undefinedFunction()", NULL, "ERR:T1006");
    /* a filtered undefined kept as an array holds one undefined item: it is
     * false as a condition, as in JSONata (found by fuzz_expr: it crashed) */
    check("foo[true][] ? 'x' : 'y'", "{}", "\"y\"");
    check("$boolean(foo['a'][])", "{}", "false");
    check("foo[true][] and true", "{}", "false");
    /* a width modifier past INT_MAX saturates instead of overflowing (found
     * by fuzz_expr: signed overflow; 4294967297 wrapped to a width of 1) */
    char *wide = run("$fromMillis(0, '[Y,4294967297]')", NULL, NULL, NULL);
    char *capped = run("$fromMillis(0, '[Y,1048576]')", NULL, NULL, NULL);
    assert_true(strlen(wide) > 100);
    assert_string_equal(wide, capped);
    free(wide);
    free(capped);
}

static void t_compile_errors(void **s)
{
    (void)s;
    struct expr *x = NULL;
    struct expr_error e;
    assert_int_equal(expr_compile("1 +", 3, &x, &e), IFL_EEXPR);
    assert_null(x);
    assert_string_equal(e.code, "S0207");
    assert_int_equal(expr_compile("(1", 2, &x, &e), IFL_EEXPR);
    assert_string_equal(e.code, "S0203");
    assert_int_equal(expr_compile("'abc", 4, &x, &e), IFL_EEXPR);
    assert_string_equal(e.code, "S0101");
    assert_int_equal(expr_compile("a ! b", 5, &x, &e), IFL_EEXPR);
    assert_string_equal(e.code, "S0204");
    assert_int_equal(e.position, 2);
    /* hostile nesting is a syntax error, not a crash */
    char deep[20001];
    memset(deep, '(', 20000);
    deep[20000] = 0;
    assert_int_equal(expr_compile(deep, 20000, &x, &e), IFL_EEXPR);
    expr_free(NULL);
}

static void t_bindings(void **s)
{
    (void)s;
    char *r = run("$x & '-' & $y.z", NULL, "{\"x\":\"a\",\"y\":{\"z\":1}}", NULL);
    assert_string_equal(r, "\"a-1\"");
    free(r);
    r = run("$count", NULL, "{\"count\":7}", NULL); /* bindings shadow builtins */
    assert_string_equal(r, "7");
    free(r);
}

static void t_limits(void **s)
{
    (void)s;
    struct expr_limits lim = {50, 1000, 0};
    char *r =
        run("($f := function($n){ $n = 0 ? 0 : 1 + $f($n - 1) }; $f(1000))", NULL, NULL, &lim);
    assert_string_equal(r, "ERR:U1001");
    free(r);
    /* an endless tail call ends in the time limit: with room for 1 GiB of
     * values, which it fills at about 0.5 GiB/s here, not in the default
     * 16 MiB (reached in about 30 ms on a fast machine: U1002, a race with
     * the 50 ms under test) */
    struct expr_limits quick = {0, 50, (size_t)1 << 30};
    r = run("($f := function($n){ $f($n + 1) }; $f(0))", NULL, NULL, &quick);
    assert_string_equal(r, "ERR:U1001");
    free(r);
    struct expr_limits small = {0, 0, 1 << 16};
    r = run("[1..100000].$string()", NULL, NULL, &small);
    assert_string_equal(r, "ERR:U1002");
    free(r);
    /* catastrophic regex backtracking ends in the time limit */
    r = run("$match('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab', /(a*)*c/)", NULL, NULL, &quick);
    assert_true(!strcmp(r, "ERR:U1001") || !strcmp(r, "[]") || !strcmp(r, "undefined"));
    free(r);
}

/* $distinct keeps the first of each group of deep-equal items, in order:
 * numbers and strings never equal each other, objects compare their
 * members in any order, arrays item by item, 0 equals -0.  It hashes only
 * the first 32 levels of an item, so items that differ deeper down hash
 * alike and must still be told apart. */
static void t_distinct(void **s)
{
    (void)s;
    check("$distinct([1,\"1\",{\"a\":1},{\"a\":1},[1,2],[1,2],1.0])", NULL,
          "[1,\"1\",{\"a\":1},[1,2]]");
    check("$distinct([3,1,3,{'x':[1]},{'x':[1]},2,1,[2,1],[1,2],null,null,true,false,true])", NULL,
          "[3,1,{\"x\":[1]},2,[2,1],[1,2],null,true,false]");
    check("$distinct([{'a':1,'b':[2]},{'b':[2],'a':1},{'a':1,'b':[2],'c':3},{'a':1}])", NULL,
          "[{\"a\":1,\"b\":[2]},{\"a\":1,\"b\":[2],\"c\":3},{\"a\":1}]");
    check("$distinct([0, -0, 0.5, 1/2])", NULL, "[0,0.5]");
    check("$distinct($)", "[{\"k\":[1,{\"z\":2}]},5,{\"k\":[1,{\"z\":2}]},\"5\",5]",
          "[{\"k\":[1,{\"z\":2}]},5,\"5\"]");
    check("$distinct(a.b)", "{\"a\":[{\"b\":2},{\"b\":1},{\"b\":2}]}", "[2,1]");
    check("$distinct([7])", NULL, "[7]");
    check("$distinct(7)", NULL, "7");
    check("$distinct([5..9])", NULL, "[5,6,7,8,9]");
    check("$count($distinct([1..100000].($ % 1000)))", NULL, "1000");
    check("($w := function($v, $n){ $n = 0 ? $v : $w({'a': $v}, $n - 1) };"
          " $count($distinct([$w(1, 40), $w(2, 40), $w(1, 40), $w(2, 40), $w(1, 39)])))",
          NULL, "3");
}

/* Builtin loops that allocate nothing per turn, on a value that shares its
 * parts (a tree of 2^30 leaves built in 30 steps) or on many references to
 * one long string: each ends in the time limit.  They used to run for
 * minutes without reading the clock.  The work is far beyond 50 ms on any
 * machine, so the outcome does not depend on its speed. */
static void t_builtin_loops_keep_the_time_limit(void **s)
{
    (void)s;
    struct expr_limits quick = {0, 50, 0};
    const char *cases[] = {
        /* deep equality, and the hash of $distinct */
        "($t := function($v, $n){ $n = 0 ? $v : $t({'a': $v, 'b': $v}, $n - 1) };"
        " $t(0, 30) = $t(0, 30))",
        "($t := function($v, $n){ $n = 0 ? $v : $t({'a': $v, 'b': $v}, $n - 1) };"
        " $count($distinct([$t(0, 30), $t(0, 30)])))",
        /* truthiness and $keys walk arrays */
        "($u := function($v, $n){ $n = 0 ? $v : $u([[$v], [$v]], $n - 1) };"
        " $boolean($u(false, 30)))",
        "($u := function($v, $n){ $n = 0 ? $v : $u([[$v], [$v]], $n - 1) };"
        " $keys($u({'k': 1}, 30)))",
        /* 2^18 references to one string of 1 MB: `in`, $sort and $map
         * over a builtin read it whole each time */
        "($s := $pad('', 1000000, 'a'); $z := $pad('', 999999, 'a') & 'b';"
        " $d := function($a, $n){ $n = 0 ? $a : $d($append($a, $a), $n - 1) };"
        " $z in $d([$s], 18))",
        "($s := $pad('', 1000000, 'a');"
        " $d := function($a, $n){ $n = 0 ? $a : $d($append($a, $a), $n - 1) };"
        " $count($sort($d([$s], 18))))",
        "($s := $pad('', 1000000, 'a');"
        " $d := function($a, $n){ $n = 0 ? $a : $d($append($a, $a), $n - 1) };"
        " $count($map($d(['b'], 18), $contains($s, ?))))",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *r = run(cases[i], NULL, NULL, &quick);
        if (strcmp(r, "ERR:U1001"))
            fail_msg("%s => %s, want ERR:U1001", cases[i], r);
        free(r);
    }
}

/* One compiled expression per source text (eval.c's intern table): a
 * second compile of the same text shares the first, each holder frees its
 * own reference, and the last free ends it — a text compiled after that is
 * compiled anew and still evaluates. */
static void t_the_same_text_compiles_once(void **s)
{
    (void)s;
    struct expr *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    assert_int_equal(expr_compile("payload.a & 'x'", 15, &a, NULL), 0);
    assert_int_equal(expr_compile("payload.a & 'x'", 15, &b, NULL), 0);
    assert_int_equal(expr_compile("payload.a & 'y'", 15, &c, NULL), 0);
    assert_ptr_equal(a, b);
    assert_ptr_not_equal(a, c);
    expr_free(a);
    json_t *in = json_pack("{s:{s:s}}", "payload", "a", "v"), *out = NULL;
    assert_int_equal(expr_eval(b, in, NULL, NULL, &out, NULL), 0); /* b still holds it */
    assert_string_equal(json_string_value(out), "vx");
    json_decref(out);
    expr_free(b);
    assert_int_equal(expr_compile("payload.a & 'x'", 15, &d, NULL), 0);
    assert_int_equal(expr_eval(d, in, NULL, NULL, &out, NULL), 0);
    assert_string_equal(json_string_value(out), "vx");
    json_decref(out);
    json_decref(in);
    expr_free(c);
    expr_free(d);
    struct expr *bad = (struct expr *)1;
    assert_int_not_equal(expr_compile("payload.(", 9, &bad, NULL), 0);
    assert_null(bad);
}

/* expr_deadline_set bounds every evaluation of the thread on top of its own
 * limit, says when it ended one (expr_deadline_hit), and goes with a set
 * of 0; an evaluation that ends at its own limit does not count as hit. */
static void t_a_thread_deadline_bounds_every_evaluation(void **s)
{
    (void)s;
    const char *slow = "$count($match($pad('', 40, 'a') & 'b', /(a+)+$/))";
    struct expr_limits quick = {0, 20, 0};
    expr_deadline_set(20);
    char *r = run("1 + 1", NULL, NULL, NULL);
    assert_string_equal(r, "2");
    free(r);
    assert_int_equal(expr_deadline_hit(), 0);
    r = run(slow, NULL, NULL, NULL); /* its own limit is 1 s */
    assert_string_equal(r, "ERR:U1001");
    free(r);
    assert_int_equal(expr_deadline_hit(), 1);
    r = run("1 + 1", NULL, NULL, NULL); /* past the deadline: a short one still ends */
    assert_string_equal(r, "2");
    free(r);
    expr_deadline_set(0);
    assert_int_equal(expr_deadline_hit(), 0);
    r = run(slow, NULL, NULL, &quick);
    assert_string_equal(r, "ERR:U1001");
    free(r);
    assert_int_equal(expr_deadline_hit(), 0); /* its own limit, not the deadline */
}

/* A result that shares its parts converts to one copy per reference: it is
 * refused (U1002) when the copies would take more than 4 × the memory cap,
 * before any is made — 2^21 leaves, 2^18 references to a 100 KB string
 * (26 GB as copies) — while the same values, kept small, convert. */
static void t_a_shared_result_is_bounded_as_copies(void **s)
{
    (void)s;
    const char *big[] = {
        "($t := function($v, $n){ $n = 0 ? $v : $t({'a': $v, 'b': $v}, $n - 1) }; $t(1, 21))",
        "($s := $pad('', 100000, 'a');"
        " $d := function($a, $n){ $n = 0 ? $a : $d($append($a, $a), $n - 1) }; $d([$s], 18))",
    };
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        char *r = run(big[i], NULL, NULL, NULL);
        if (strcmp(r, "ERR:U1002"))
            fail_msg("%s => %.80s, want ERR:U1002", big[i], r);
        free(r);
    }
    char *r = run("($t := function($v, $n){ $n = 0 ? $v : $t({'a': $v, 'b': $v}, $n - 1) };"
                  " $t(1, 2))",
                  NULL, NULL, NULL);
    assert_string_equal(r, "{\"a\":{\"a\":1,\"b\":1},\"b\":{\"a\":1,\"b\":1}}");
    free(r);
}

/* $distinct and substring search scale: each case reads the clock before
 * and after the call (the steps of `[1..1000].$`) under the default 1 s
 * limit.  A quadratic $distinct spent about 5 s on these 40,000 strings,
 * a naive search about 5 s on these needles, and $match as long counting
 * the characters before each match from the start (each ended in U1001 at
 * the next reading); now each takes milliseconds. */
static void t_distinct_and_search_scale(void **s)
{
    (void)s;
    const char *big = "$h := $pad('', 1000000, 'a'); $n := $pad('', 500000, 'a') & 'b';"
                      " $m := 'b' & $pad('', 500000, 'a');";
    struct {
        const char *body, *want;
    } cases[] = {
        {"$count($distinct([1..40000].$string()))", "40000"},
        {"$count($distinct([1..100000]))", "100000"},
        {"$contains($h, $n)", "false"},
        {"$contains($h, $m)", "false"},
        {"$count($split($h, $n))", "1"},
        {"$substringBefore($h, $n) = $h", "true"},
        {"$substringAfter($h, $m) = $h", "true"},
        {"$replace($h, $n, 'x') = $h", "true"},
        {"$length($replace($h & 'b', $n, 'x'))", "500001"},
        {"$count($match($pad('', 3000000, 'b') & $pad('', 1000, 'a'), /a/))", "1000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *src = xasprintf("(%s [1..1000].$; $r := %s; [1..1000].$; $r)",
                              strstr(cases[i].body, "$h") ? big : "", cases[i].body);
        check(src, NULL, cases[i].want);
        free(src);
    }
}

/* Parent operators (`%`) under a chain of binary operators: every level
 * hands its operands' unresolved parent slots up to the next.  Those lists
 * were copied on every append, so the memory grew with the cube of the
 * chain (a 1 KB expression of this shape took ~300 MB and 2 s to compile,
 * found by fuzz_workflow); now ~3 MB.  The bound is the
 * arena's size, not a time. */
static void t_parent_chains_compile_in_bounded_memory(void **s)
{
    (void)s;
    for (int n = 100; n <= 500; n += 200) {
        char src[4096];
        size_t len = (size_t)snprintf(src, sizeof src, "a.b.(");
        for (int i = 0; i < n; i++)
            len += (size_t)snprintf(src + len, sizeof src - len, "%%-");
        len += (size_t)snprintf(src + len, sizeof src - len, "%%)");
        struct arena *a = arena_new(1 << 16);
        struct node *root = NULL;
        struct expr_error xe = {0};
        parse_expr(src, len, a, &root, &xe); /* compiles or not: the memory counts */
        size_t used = arena_used(a);
        print_message("n=%d: %zu bytes of source, %zu bytes of arena\n", n, len, used);
        assert_true(used < 16384 * len); /* was ~300 MB at n = 500 */
        arena_free(a);
    }
}

/* `a ?? b` and `a ?: b` use a's value twice (test and result).  Each once
 * copied its left operand, so 64 nested ones needed 2^64 nodes (a fuzzer's
 * out-of-memory); now a is evaluated once and the tree stays linear. */
static void t_default_operators(void **s)
{
    (void)s;
    check("0 ?? 5", NULL, "0");
    check("nope ?? 5", "{}", "5");
    check("0 ?: 5", NULL, "5");
    check("'x' ?: 5", NULL, "\"x\"");
    check("a.b ?? a.c ?: 'none'", "{\"a\":{\"c\":\"\"}}", "\"none\"");
    for (int op = 0; op < 2; op++) {
        char src[2048];
        size_t n = 0;
        for (int i = 0; i < 64; i++)
            src[n++] = '(';
        n += (size_t)snprintf(src + n, sizeof src - n, "nope");
        for (int i = 0; i < 64; i++)
            n += (size_t)snprintf(src + n, sizeof src - n, " %s %s)", op ? "?:" : "??",
                                  i < 63 ? "nope" : "'found'");
        assert_true(n < sizeof src);
        check(src, "{}", "\"found\"");
    }
}

/* Found by fuzz_expr with the dictionary and by the sweep below: an
 * infinite or NaN intermediate ($n/0 inside a lambda, which only the final
 * result is checked for) reached integer conversions; $sift without its
 * optional function and $formatInteger with an undefined picture crashed. */
/* A pattern that does not parse and one that is too large to compile had the
 * lexer's code S0302 ("No terminating /"), which named neither. */
static void t_regex_errors_name_their_cause(void **s)
{
    (void)s;
    check("$match('a', /a{2000}/)", NULL, "ERR:S0304");
    check("$match('a', /(((a{999}){999}){999})/)", NULL, "ERR:S0304");
    check("$match('a', /a{2,1}/)", NULL, "ERR:S0303");
    { /* groups nested past 200: too large (S0304), not malformed (judge) */
        char deep[1024] = "$match('a', /";
        for (int i = 0; i < 250; i++)
            strcat(deep, "(");
        strcat(deep, "a");
        for (int i = 0; i < 250; i++)
            strcat(deep, ")");
        strcat(deep, "/)");
        check(deep, NULL, "ERR:S0304");
    }
    check("$match('a', /[z-a]/)", NULL, "ERR:S0303");
    check("$match('a', /(a/", NULL, "ERR:S0302");
    check("$match('a', /a{999}/).match", NULL, "undefined");
    struct expr *x = NULL;
    struct expr_error e;
    const char *src = "$match('a', /a{2000}/)";
    assert_int_not_equal(expr_compile(src, strlen(src), &x, &e), 0);
    assert_non_null(strstr(e.msg, "too large"));
    assert_int_equal(e.position, 13); /* the pattern's first byte */
    expr_free(x);
}

static void t_non_finite_arguments(void **s)
{
    (void)s;
    static const char *const errs[][2] = {
        {"($f := function($n) { $formatBase($n/0) }; $f(10))", "ERR:D1001"},
        {"($f := function($n) { $formatBase(-$n/0, 16) }; $f(10))", "ERR:D1001"},
        {"($f := function($n) { $formatBase(10, 0*$n/0) }; $f(10))", "ERR:D3100"},
        {"($f := function($n) { $formatInteger(0*$n/0, 'w') }; $f(10))", "ERR:D1001"},
        {"($f := function($n) { $formatInteger($n/0, 'I') }; $f(10))", "ERR:D1001"},
        {"$sift({'a': 1})", "ERR:T1006"},
        {"$formatInteger(5, nope)", "ERR:T0410"},
    };
    for (size_t i = 0; i < sizeof errs / sizeof errs[0]; i++)
        check(errs[i][0], NULL, errs[i][1]);
    check("$round(1.5, 1e300)", NULL, "1.5");
    check("($f := function($n) { $round(2.5, $n/0) }; $f(10))", NULL, "2.5");
    check("$round(1234.5, -1e300)", NULL, "0");
    check("$round(1234.5, -2)", NULL, "1200");
    check("$formatBase(255, 16)", NULL, "\"ff\"");
}

/* Every builtin called with 0-2 arguments drawn from awkward values and with
 * 3 from a smaller set, inside a lambda so that $n/0 arrives unchecked (the
 * sweep that found the cases above): none may crash (or, under the
 * sanitizers, touch memory or convert wrongly), and each call ends in a
 * value, undefined or an error code.  "nope" is an undefined argument. */
static void t_builtins_awkward_arguments(void **s)
{
    (void)s;
    static const char *const vals[] = {"nope",
                                       "null",
                                       "0",
                                       "-1",
                                       "2.5",
                                       "1e300",
                                       "($n/0)",
                                       "(0*$n/0)",
                                       "'abc'",
                                       "''",
                                       "[1,'a']",
                                       "[]",
                                       "{'a':1}",
                                       "true",
                                       "function($x){$x}",
                                       "function($a,$b,$c){$a}",
                                       "$string",
                                       "'[Y0001]'"};
    static const char *const few[] = {"nope",  "null",    "-1",      "($n/0)",          "(0*$n/0)",
                                      "'abc'", "[1,'a']", "{'a':1}", "function($x){$x}"};
    const int nv = (int)(sizeof vals / sizeof vals[0]), nf = (int)(sizeof few / sizeof few[0]);
    size_t calls = 0, errors = 0;
    for (int b = 0; b < expr_nbuiltins; b++) {
        for (int arity = 0; arity <= 3; arity++) {
            const char *const *set = arity == 3 ? few : vals;
            int n = arity == 3 ? nf : nv, idx[3] = {0, 0, 0};
            for (;;) {
                char src[512];
                int o =
                    snprintf(src, sizeof src, "($f := function($n) { $%s(", expr_builtins[b].name);
                for (int i = 0; i < arity; i++)
                    o += snprintf(src + o, sizeof src - (size_t)o, "%s%s", i ? ", " : "",
                                  set[idx[i]]);
                snprintf(src + o, sizeof src - (size_t)o, ") }; $f(10))");
                char *got = run(src, NULL, NULL, NULL);
                assert_non_null(got);
                errors += strncmp(got, "ERR:", 4) == 0;
                free(got);
                calls++;
                int i = arity - 1;
                while (i >= 0 && ++idx[i] == n)
                    idx[i--] = 0;
                if (i < 0)
                    break;
            }
        }
    }
    print_message("%zu calls of %d builtins, %zu of them errors\n", calls, expr_nbuiltins, errors);
    assert_true(calls > 50000);
    assert_true(errors > 0 && errors < calls);
}

static int secrets(void *ctx, const char *name, char **out)
{
    (void)ctx;
    if (!strcmp(name, "PAYMENTS_KEY")) {
        *out = xstrdup("sk_live_1");
        return 0;
    }
    return IFL_ENOTFOUND;
}

static void t_templates(void **s)
{
    (void)s;
    json_t *def =
        json_loads("{\"headers\":{\"Idempotency-Key\":\"= 'charge-' & payload.order.id\","
                   "\"Authorization\":\"Bearer {{ secrets.PAYMENTS_KEY }}\"},"
                   "\"body\":{\"order\":\"=payload.order.id\",\"none\":\"=payload.nope\"},"
                   "\"n\":[1,\"=payload.nope\"],\"lit\":\"{{secrets}}\"}",
                   0, NULL);
    struct tmpl *t = NULL;
    struct ifl_err e;
    assert_int_equal(tmpl_compile(def, "/vertices/charge/config", &t, &e), 0);
    json_decref(def); /* the template keeps its own copy */
    json_t *ctx = json_loads("{\"payload\":{\"order\":{\"id\":\"A1\"}}}", 0, NULL);
    json_t *out = NULL;
    assert_int_equal(tmpl_eval(t, ctx, secrets, NULL, &out, &e), 0);
    char *txt = json_to_string(out);
    assert_string_equal(txt, "{\"headers\":{\"Idempotency-Key\":\"charge-A1\",\"Authorization\":"
                             "\"Bearer sk_live_1\"},\"body\":{\"order\":\"A1\"},"
                             "\"n\":[1,null],\"lit\":\"{{secrets}}\"}");
    free(txt);
    json_decref(out);
    tmpl_free(t);

    /* expressions cannot read secrets; a syntax error names the member */
    def = json_loads("{\"a\":{\"b\":[\"ok\",\"= 1 +\"]}}", 0, NULL);
    assert_int_equal(tmpl_compile(def, "/vertices/x/config", &t, &e), IFL_EVALIDATION);
    assert_string_equal(e.pointer, "/vertices/x/config/a/b/1");
    assert_non_null(strstr(e.msg, "S0207"));
    json_decref(def);

    def = json_string("{{ secrets.MISSING }}");
    assert_int_equal(tmpl_compile(def, NULL, &t, &e), 0);
    assert_int_not_equal(tmpl_eval(t, ctx, secrets, NULL, &out, &e), 0);
    assert_null(strstr(e.msg, "sk_live"));
    tmpl_free(t);
    json_decref(def);

    def = json_string("=$secrets");
    assert_int_equal(tmpl_compile(def, NULL, &t, &e), 0);
    assert_int_equal(tmpl_eval(t, ctx, secrets, NULL, &out, &e), 0);
    assert_true(json_is_null(out)); /* undefined at top level is null */
    json_decref(out);
    tmpl_free(t);
    json_decref(def);
    json_decref(ctx);
}

struct thr {
    struct expr *x;
    json_t *in;
    int ok;
};

static void *worker(void *p)
{
    struct thr *t = p;
    t->ok = 1;
    for (int i = 0; i < 2000; i++) {
        json_t *out = NULL;
        struct expr_error e;
        if (expr_eval(t->x, t->in, NULL, NULL, &out, &e) || !json_is_string(out) ||
            strcmp(json_string_value(out), "charge-A17/3"))
            t->ok = 0;
        json_decref(out);
    }
    return NULL;
}

static void t_concurrent(void **s)
{
    (void)s;
    const char *src = "'charge-' & payload.order.id & '/' & $count(payload.items[$ > 1])";
    struct expr *x;
    struct expr_error e;
    assert_int_equal(expr_compile(src, strlen(src), &x, &e), 0);
    json_t *in =
        json_loads("{\"payload\":{\"order\":{\"id\":\"A17\"},\"items\":[1,2,3,4]}}", 0, NULL);
    pthread_t th[4];
    struct thr st[4];
    for (int i = 0; i < 4; i++) {
        st[i].x = x;
        st[i].in = in;
        pthread_create(&th[i], NULL, worker, &st[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(st[i].ok);
    }
    json_decref(in);
    expr_free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(t_basics),
        cmocka_unit_test(t_compile_errors),
        cmocka_unit_test(t_bindings),
        cmocka_unit_test(t_limits),
        cmocka_unit_test(t_templates),
        cmocka_unit_test(t_concurrent),
        cmocka_unit_test(t_default_operators),
        cmocka_unit_test(t_non_finite_arguments),
        cmocka_unit_test(t_builtins_awkward_arguments),
        cmocka_unit_test(t_parent_chains_compile_in_bounded_memory),
        cmocka_unit_test(t_distinct),
        cmocka_unit_test(t_builtin_loops_keep_the_time_limit),
        cmocka_unit_test(t_distinct_and_search_scale),
        cmocka_unit_test(t_a_shared_result_is_bounded_as_copies),
        cmocka_unit_test(t_regex_errors_name_their_cause),
        cmocka_unit_test(t_a_thread_deadline_bounds_every_evaluation),
        cmocka_unit_test(t_the_same_text_compiles_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
