/*
 * test_json — unit tests for the json module: ECMAScript number formatting
 * (edge cases, the shared numbers.csv, a brute-force cross-check), RFC 8785
 * vectors, parse limits and errors, string escaping, UTF-16 key order.
 *
 * Conformance data lives in $IDEMFLOW_CONFORMANCE_DIR (default
 * ../shared/conformance relative to the repository root, the tests' cwd);
 * when it is absent those tests skip instead of failing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "crypto/crypto.h"
#include "json/json.h"

/* ---------------------------------------------------------------- helpers */

static const char *conformance_dir(void)
{
    const char *d = getenv("IDEMFLOW_CONFORMANCE_DIR");
    return d && *d ? d : "../shared/conformance";
}

/* Whole file into a fresh heap buffer (NUL-terminated); NULL when missing. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct buf b;
    buf_init(&b, 0);
    char tmp[8192];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        assert_int_equal(buf_append(&b, tmp, n), 0);
    fclose(f);
    *len = b.len;
    return buf_steal(&b);
}

static void skip_without_conformance(const char *sub)
{
    struct stat st;
    char *p = xasprintf("%s/%s", conformance_dir(), sub);
    int missing = stat(p, &st) != 0;
    free(p);
    if (missing)
        skip();
}

static json_t *parse_ok(const char *text)
{
    json_t *v = NULL;
    struct ifl_err e;
    err_clear(&e);
    int rc = json_parse(text, strlen(text), NULL, &v, &e);
    if (rc)
        print_error("parse of %s failed: %s\n", text, e.msg);
    assert_int_equal(rc, 0);
    assert_non_null(v);
    return v;
}

static int parse_rc(const char *text, size_t len, const struct json_limits *lim, struct ifl_err *e)
{
    json_t *v = (json_t *)1;
    err_clear(e);
    int rc = json_parse(text, len, lim, &v, e);
    if (rc) {
        assert_null(v);
        assert_int_equal(e->code, rc);
    } else {
        json_decref(v);
    }
    return rc;
}

static char *jcs_of(const json_t *v)
{
    struct buf b;
    buf_init(&b, 0);
    assert_int_equal(json_jcs(v, &b), 0);
    return buf_steal(&b);
}

static void assert_jcs(const char *in, const char *want)
{
    json_t *v = parse_ok(in);
    char *got = jcs_of(v);
    assert_string_equal(got, want);
    free(got);
    json_decref(v);
}

static double from_bits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static void assert_num(double d, const char *want)
{
    char out[32];
    int n = json_format_number(d, out);
    assert_string_equal(out, want);
    assert_int_equal(n, (int)strlen(want));
}

/* ------------------------------------------------------- number formatting */

static void test_number_edges(void **state)
{
    (void)state;
    volatile double a = 0.1, b = 0.2;
    assert_num(0.0, "0");
    assert_num(-0.0, "0");
    assert_num(1, "1");
    assert_num(-1, "-1");
    assert_num(1.5, "1.5");
    assert_num(-1.5, "-1.5");
    assert_num(a + b, "0.30000000000000004");
    assert_num(0.1, "0.1");
    assert_num(4.35, "4.35");
    assert_num(100, "100");
    assert_num(1e20, "100000000000000000000");
    assert_num(1e21, "1e+21");
    assert_num(-1e21, "-1e+21");
    assert_num(123456789012345680000.0, "123456789012345680000");
    assert_num(1.2345678901234568e21, "1.2345678901234568e+21");
    assert_num(1e-6, "0.000001");
    assert_num(1.234e-6, "0.000001234");
    assert_num(1e-7, "1e-7");
    assert_num(1.234e-7, "1.234e-7");
    assert_num(5e-324, "5e-324");
    assert_num(-5e-324, "-5e-324");
    assert_num(1.7976931348623157e308, "1.7976931348623157e+308");
    assert_num(2.2250738585072014e-308, "2.2250738585072014e-308");
    assert_num(9007199254740992.0, "9007199254740992");
    assert_num(9007199254740994.0, "9007199254740994");
    assert_num(9223372036854775808.0, "9223372036854776000");
    assert_num(333333333.33333329, "333333333.3333333");
    assert_num(1e30, "1e+30");
    assert_num(0.000000000000000000000000001, "1e-27");
    assert_num(from_bits(0x44b52d02c7e14af6ULL), "1e+23"); /* 9.999999999999999e22 is prev */
    assert_num(from_bits(0x44b52d02c7e14af5ULL), "9.999999999999997e+22");

    /* power-of-two significand: the shortest digits lie above the value,
     * where the rounding interval is twice as wide */
    assert_num(ldexp(1.0, -1017), "7.120236347223045e-307");
    assert_num(-ldexp(1.0, -1007), "-7.291122019556398e-304");

    char out[32];
    assert_int_equal(json_format_number(NAN, out), IFL_EINVAL);
    assert_int_equal(json_format_number(INFINITY, out), IFL_EINVAL);
    assert_int_equal(json_format_number(-INFINITY, out), IFL_EINVAL);
}

static void test_numbers_csv(void **state)
{
    (void)state;
    skip_without_conformance("jcs/numbers.csv");
    char *path = xasprintf("%s/jcs/numbers.csv", conformance_dir());
    size_t len;
    char *text = slurp(path, &len);
    free(path);
    assert_non_null(text);

    int lines = 0, ok = 0;
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        char *end = nl ? nl : line + strlen(line);
        if (end > line && end[-1] == '\r')
            end[-1] = '\0';
        *end = '\0';
        if (*line) {
            lines++;
            uint8_t be[8];
            assert_int_equal(crypto_unhex(line, 16, be, sizeof be), 0);
            uint64_t u = 0;
            for (int i = 0; i < 8; i++)
                u = (u << 8) | be[i];
            assert_int_equal(line[16], ',');
            char out[32];
            json_format_number(from_bits(u), out);
            if (strcmp(out, line + 17) == 0)
                ok++;
            else if (lines - ok <= 10)
                print_error("numbers.csv line %d: %016llx -> %s, want %s\n", lines,
                            (unsigned long long)u, out, line + 17);
        }
        line = nl ? nl + 1 : end;
    }
    free(text);
    print_message("numbers.csv: %d/%d match\n", ok, lines);
    assert_int_equal(lines, 25021);
    assert_int_equal(ok, lines);
}

/* Reference: search every length 1..17, trying the correctly rounded digits
 * and their neighbours; returns the digit count of the shortest that reads
 * back as d. */
static int reference_digits(double d)
{
    for (int p = 1; p <= 17; p++) {
        char s[64];
        snprintf(s, sizeof s, "%.*e", p - 1, d);
        if (strtod(s, NULL) == d)
            return p;
        /* neighbours: adjust the p-digit integer significand by +-1 */
        char digits[32];
        int k = 0, x = 0, neg = 0;
        const char *c = s;
        for (; *c != 'e'; c++)
            if (*c >= '0' && *c <= '9')
                digits[k++] = *c;
        digits[k] = '\0';
        c++;
        neg = *c == '-';
        for (c++; *c; c++)
            x = x * 10 + (*c - '0');
        if (neg)
            x = -x;
        unsigned long long m = 0;
        for (int j = 0; j < k; j++)
            m = m * 10 + (unsigned long long)(digits[j] - '0');
        for (int delta = -1; delta <= 1; delta += 2) {
            snprintf(s, sizeof s, "%llue%d", m + (unsigned long long)(long long)delta, x - (p - 1));
            if (strtod(s, NULL) == d)
                return p;
        }
    }
    return 99;
}

static int digit_count(const char *s)
{
    /* significant digits of an ECMAScript number text */
    int n = 0, started = 0, trailing_zeros = 0;
    for (; *s && *s != 'e'; s++) {
        if (*s < '0' || *s > '9')
            continue;
        if (*s == '0' && !started)
            continue;
        started = 1;
        n++;
        trailing_zeros = *s == '0' ? trailing_zeros + 1 : 0;
    }
    return n - trailing_zeros;
}

static void check_against_reference(double d)
{
    char out[32];
    if (d == 0)
        return;
    assert_true(json_format_number(d, out) > 0);
    if (strtod(out, NULL) != d) {
        print_error("%a formatted as %s does not read back\n", d, out);
        fail();
    }
    int want = reference_digits(fabs(d));
    if (digit_count(out) != want) {
        print_error("%a formatted as %s, reference has %d digits\n", d, out, want);
        fail();
    }
}

static void test_number_random(void **state)
{
    (void)state;
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        double d = from_bits(x);
        if (isfinite(d) && d != 0)
            check_against_reference(d);
    }
    /* every power of two (the asymmetric-interval case) and its neighbours */
    for (int e = -1074; e <= 1023; e++) {
        double d = ldexp(1.0, e);
        check_against_reference(d);
        check_against_reference(nextafter(d, 0));
        if (e < 1023)
            check_against_reference(nextafter(d, INFINITY));
    }
}

/* ----------------------------------------------------------- JCS vectors */

static void test_jcs_vectors(void **state)
{
    (void)state;
    skip_without_conformance("jcs/input");
    static const char *const names[] = {"arrays",  "french", "structures",
                                        "unicode", "values", "weird"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char *ip = xasprintf("%s/jcs/input/%s.json", conformance_dir(), names[i]);
        char *op = xasprintf("%s/jcs/output/%s.json", conformance_dir(), names[i]);
        size_t ilen, olen;
        char *in = slurp(ip, &ilen), *want = slurp(op, &olen);
        assert_non_null(in);
        assert_non_null(want);

        json_t *v = NULL;
        struct ifl_err e;
        err_clear(&e);
        int rc = json_parse(in, ilen, NULL, &v, &e);
        if (rc)
            print_error("%s: %s\n", names[i], e.msg);
        assert_int_equal(rc, 0);
        struct buf b;
        buf_init(&b, 0);
        assert_int_equal(json_jcs(v, &b), 0);
        if (b.len != olen || memcmp(b.p, want, olen) != 0)
            print_error("%s: got %s\nwant %s\n", names[i], b.p, want);
        assert_int_equal(b.len, olen);
        assert_memory_equal(b.p, want, olen);

        buf_free(&b);
        json_decref(v);
        free(in);
        free(want);
        free(ip);
        free(op);
    }
}

/* ------------------------------------------------------------ parse errors */

static void test_parse_errors(void **state)
{
    (void)state;
    struct ifl_err e;
    static const char *const bad[] = {
        "",      "{",     "[1,]",   "{\"a\":1,}", "1 2",         "'a'",         "nul",
        "[1 2]", "{a:1}", "01",     "1.",         "NaN",         "Infinity",    "\"\\x\"",
        "\"a",   "1e400", "-1e400", "[\"\t\"]",   "\"\\ud800\"", "\"\\udc00\"", "\"\\ud800x\"",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = parse_rc(bad[i], strlen(bad[i]), NULL, &e);
        if (rc != IFL_EINVAL)
            print_error("accepted: %s\n", bad[i]);
        assert_int_equal(rc, IFL_EINVAL);
        assert_non_null(strstr(e.msg, "invalid JSON at"));
    }

    assert_int_equal(parse_rc("{\"a\":1,\n \"a\":2}", 15, NULL, &e), IFL_EINVAL);
    assert_non_null(strstr(e.msg, "line 2"));
    assert_non_null(strstr(e.msg, "duplicate"));

    assert_int_equal(parse_rc("[1,x]", 5, NULL, &e), IFL_EINVAL);
    assert_non_null(strstr(e.msg, "line 1, column 4"));

    /* invalid UTF-8: stray continuation, overlong '/', surrogate encoded in
     * UTF-8, truncated sequence, code point past U+10FFFF */
    static const char *const bad_utf8[] = {"\"\x80\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"",
                                           "\"\xe2\x82\"", "\"\xf4\x90\x80\x80\""};
    for (size_t i = 0; i < sizeof bad_utf8 / sizeof bad_utf8[0]; i++)
        assert_int_equal(parse_rc(bad_utf8[i], strlen(bad_utf8[i]), NULL, &e), IFL_EINVAL);

    /* a raw NUL byte in the text is not JSON */
    assert_int_equal(parse_rc("\"a\0b\"", 5, NULL, &e), IFL_EINVAL);

    /* errors without an error struct, and scalars at top level */
    json_t *v = NULL;
    assert_int_equal(json_parse("[", 1, NULL, &v, NULL), IFL_EINVAL);
    assert_null(v);
    assert_int_equal(parse_rc(" 12 ", 4, NULL, &e), 0);
    assert_int_equal(parse_rc("\"\\ud83d\\ude00\"", 14, NULL, &e), 0);
    assert_int_equal(parse_rc("1e-400", 6, NULL, &e), 0); /* underflow is 0 */
}

static char *nested(int depth, const char *open, const char *close)
{
    struct buf b;
    buf_init(&b, 0);
    for (int i = 0; i < depth; i++)
        buf_puts(&b, open);
    for (int i = 0; i < depth; i++)
        buf_puts(&b, close);
    return buf_steal(&b);
}

static void test_parse_depth(void **state)
{
    (void)state;
    struct ifl_err e;
    char *s64 = nested(64, "[", "]"), *s65 = nested(65, "[", "]");
    assert_int_equal(parse_rc(s64, strlen(s64), NULL, &e), 0);
    assert_int_equal(parse_rc(s65, strlen(s65), NULL, &e), IFL_EINVAL);
    assert_non_null(strstr(e.msg, "byte offset 64"));
    free(s64);
    free(s65);

    /* objects count too: 64 objects deep parse, one more array does not */
    struct buf b;
    buf_init(&b, 0);
    buf_puts(&b, "[");
    for (int i = 0; i < 64; i++)
        buf_puts(&b, "{\"k\":");
    buf_puts(&b, "1");
    for (int i = 0; i < 64; i++)
        buf_puts(&b, "}");
    buf_puts(&b, "]");
    assert_int_equal(parse_rc(b.p, b.len, NULL, &e), IFL_EINVAL);
    assert_non_null(strstr(e.msg, "nesting deeper than 64"));
    assert_int_equal(parse_rc(b.p + 1, b.len - 2, NULL, &e), 0);
    buf_free(&b);

    /* brackets inside strings (with escaped quotes) do not count */
    const char *str = "[\"[[[[\\\"[[[{{{{\", \"\\\\\", \"]]]\"]";
    struct json_limits lim = {.max_bytes = 0, .max_depth = 1};
    assert_int_equal(parse_rc(str, strlen(str), &lim, &e), 0);
    assert_int_equal(parse_rc("[[1]]", 5, &lim, &e), IFL_EINVAL);
    assert_non_null(strstr(e.msg, "byte offset 1"));
    lim.max_depth = 0; /* default */
    char *s100 = nested(100, "[", "]");
    assert_int_equal(parse_rc(s100, strlen(s100), &lim, &e), IFL_EINVAL);
    lim.max_depth = 200;
    assert_int_equal(parse_rc(s100, strlen(s100), &lim, &e), 0);
    free(s100);

    /* what the engine stores is read back with JSON_STORED_MAX_DEPTH */
    char *s512 = nested(JSON_STORED_MAX_DEPTH, "[", "]");
    char *s513 = nested(JSON_STORED_MAX_DEPTH + 1, "{\"a\":", "}");
    assert_true(json_depth_ok(s512, strlen(s512), JSON_STORED_MAX_DEPTH));
    assert_false(json_depth_ok(s513, strlen(s513), JSON_STORED_MAX_DEPTH));
    assert_true(json_depth_ok("[\"[[[[\"]", 9, 1));
    assert_int_equal(parse_rc(s512, strlen(s512), &json_stored_limits, &e), 0);
    assert_int_equal(parse_rc(s513, strlen(s513), &json_stored_limits, &e), IFL_EINVAL);
    free(s512);
    free(s513);
}

static void test_parse_too_big(void **state)
{
    (void)state;
    struct ifl_err e;
    struct json_limits lim = {.max_bytes = 7, .max_depth = 0};
    assert_int_equal(parse_rc("[1,2,3]", 7, &lim, &e), 0);
    assert_int_equal(parse_rc("[1,2,3] ", 8, &lim, &e), IFL_ETOOBIG);
    assert_int_equal(e.code, IFL_ETOOBIG);
    lim.max_bytes = 0; /* uncapped */
    assert_int_equal(parse_rc("[1,2,3] ", 8, &lim, &e), 0);
}

/* ------------------------------------------------------ strings and order */

static void test_nul_in_strings(void **state)
{
    (void)state;
    json_t *v = parse_ok("\"a\\u0000b\"");
    assert_int_equal(json_string_length(v), 3);
    assert_memory_equal(json_string_value(v), "a\0b", 3);
    char *s = jcs_of(v);
    assert_string_equal(s, "\"a\\u0000b\"");
    free(s);
    json_decref(v);

    /* the program may build a key holding NUL; writers keep its length */
    v = json_object();
    json_object_setn_new(v, "k\0z", 3, json_true());
    json_object_set_new(v, "k", json_false());
    s = jcs_of(v);
    assert_string_equal(s, "{\"k\":false,\"k\\u0000z\":true}");
    free(s);
    json_decref(v);
}

static void test_escaping(void **state)
{
    (void)state;
    assert_jcs("\"\\u0001\\u001f\\u0008\\u000c\\n\\r\\t\\\"\\\\\\/\\u007f\\u0080\"",
               "\"\\u0001\\u001f\\b\\f\\n\\r\\t\\\"\\\\/\x7f\xc2\x80\"");
    assert_jcs("\"\\u001B\\u000b\"", "\"\\u001b\\u000b\"");
    assert_jcs("\"</script>\"", "\"</script>\"");
    assert_jcs("[true,false,null,\"\"]", "[true,false,null,\"\"]");
    assert_jcs(" { } ", "{}");
    assert_jcs("[1.0, -0, 1E2, 0.5e1]", "[1,0,100,5]");
}

static void test_utf16_order(void **state)
{
    (void)state;
    /* U+20AC < U+1F600 (D83D DE00) < U+FB33 in UTF-16, not in UTF-8 */
    assert_jcs("{\"\\ufb33\":1,\"\\ud83d\\ude00\":2,\"\\u20ac\":3}",
               "{\"\xe2\x82\xac\":3,\"\xf0\x9f\x98\x80\":2,\"\xef\xac\xb3\":1}");
    /* same lead surrogate: the trail decides; a prefix sorts first */
    assert_jcs("{\"\\ud83d\\ude01\":1,\"\\ud83d\\ude00\":2,\"ab\":3,\"a\":4,\"\":5}",
               "{\"\":5,\"a\":4,\"ab\":3,\"\xf0\x9f\x98\x80\":2,\"\xf0\x9f\x98\x81\":1}");
    /* U+FFFF vs U+10000 (D800 DC00) */
    assert_jcs("{\"\\uffff\":1,\"\\ud800\\udc00\":2}",
               "{\"\xf0\x90\x80\x80\":2,\"\xef\xbf\xbf\":1}");

    /* more members than the on-stack sort array, in reverse order */
    json_t *v = json_object();
    for (int i = 40; i >= 0; i--) {
        char k[8];
        snprintf(k, sizeof k, "k%02d", i);
        json_object_set_new(v, k, json_integer(i));
    }
    char *s = jcs_of(v);
    assert_true(strncmp(s, "{\"k00\":0,\"k01\":1,", 17) == 0);
    assert_non_null(strstr(s, "\"k39\":39,\"k40\":40}"));
    free(s);
    json_decref(v);
}

static void test_write_order(void **state)
{
    (void)state;
    json_t *v = parse_ok("{\"b\":1,\"a\":[2.50,{\"z\":null,\"y\":\"\\u00e9\"}]}");
    char *s = json_to_string(v);
    assert_string_equal(s, "{\"b\":1,\"a\":[2.5,{\"z\":null,\"y\":\"\xc3\xa9\"}]}");
    free(s);
    s = jcs_of(v);
    assert_string_equal(s, "{\"a\":[2.5,{\"y\":\"\xc3\xa9\",\"z\":null}],\"b\":1}");
    free(s);
    json_decref(v);

    /* program-made integers are written as the double of that value */
    v = json_pack("[I,I,i,f]", (json_int_t)9007199254740993LL, (json_int_t)INT64_MIN, -7, 0.25);
    s = json_to_string(v);
    assert_string_equal(s, "[9007199254740992,-9223372036854776000,-7,0.25]");
    free(s);
    json_decref(v);
}

static void test_buffer_cap(void **state)
{
    (void)state;
    json_t *v = parse_ok("{\"key\":\"a fairly long value\",\"n\":[1,2,3]}");
    struct buf b;
    buf_init(&b, 16);
    assert_int_equal(buf_puts(&b, "pre"), 0);
    assert_int_equal(json_jcs(v, &b), IFL_ETOOBIG);
    assert_int_equal(b.len, 3);
    assert_string_equal(b.p, "pre");
    assert_int_equal(json_write(v, &b), IFL_ETOOBIG);
    assert_string_equal(b.p, "pre");
    buf_free(&b);
    json_decref(v);
}

static void test_pointer_and_num(void **state)
{
    (void)state;
    struct buf b;
    buf_init(&b, 0);
    json_pointer_push(&b, "a/b~c");
    json_pointer_push(&b, "");
    json_pointer_push(&b, "0");
    assert_string_equal(b.p, "/a~1b~0c//0");
    buf_free(&b);

    json_t *i = json_integer(42), *r = json_real(-2.5), *s = json_string("x");
    assert_true(json_num(i) == 42.0);
    assert_true(json_num(r) == -2.5);
    assert_true(json_num(s) == 0.0);
    json_decref(i);
    json_decref(r);
    json_decref(s);

    json_t *p = parse_ok("12");
    assert_true(json_is_real(p));
    assert_true(json_num(p) == 12.0);
    json_decref(p);
}

static void lossy_is(const char *in, const char *want)
{
    json_t *v = json_string_lossy(in);
    assert_non_null(v);
    assert_string_equal(json_string_value(v), want);
    json_decref(v);
}

/* Invalid UTF-8 (a client's "%FF" echoed in a problem's detail) becomes
 * U+FFFD per bad byte; valid text, 4-byte forms included, stays as it is. */
static void test_string_lossy(void **state)
{
    (void)state;
    lossy_is("plain", "plain");
    lossy_is("caf\xC3\xA9 \xF0\x9F\x98\x80", "caf\xC3\xA9 \xF0\x9F\x98\x80");
    lossy_is("id '\xFF'", "id '\xEF\xBF\xBD'");
    lossy_is("\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD");                   /* overlong '/' */
    lossy_is("\xED\xA0\x80x", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDx"); /* a surrogate */
    lossy_is("\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
    lossy_is("end \xE2\x82", "end \xEF\xBF\xBD\xEF\xBF\xBD"); /* cut short at the end */
    lossy_is("", "");
    assert_null(json_string_lossy(NULL));
    assert_true(json_utf8_valid("caf\xC3\xA9 \xF0\x9F\x98\x80"));
    assert_true(json_utf8_valid(""));
    assert_false(json_utf8_valid("\xFF"));
    assert_false(json_utf8_valid("a\xC0\xAF"));
    assert_false(json_utf8_valid("\xED\xA0\x80"));
    assert_false(json_utf8_valid("end \xE2\x82"));
    /* by length: NULs kept, nothing read past n, and a flag for a replacement */
    int replaced = 0;
    json_t *v = json_stringn_lossy("a\0b", 3, &replaced);
    assert_int_equal(json_string_length(v), 3);
    assert_memory_equal(json_string_value(v), "a\0b", 3);
    assert_int_equal(replaced, 0);
    json_decref(v);
    v = json_stringn_lossy("\xE2\x82\xAC", 2, &replaced); /* the euro sign, cut at 2 */
    assert_string_equal(json_string_value(v), "\xEF\xBF\xBD\xEF\xBF\xBD");
    assert_int_equal(replaced, 1);
    json_decref(v);
}

/* json_limits.exact_numbers: an integer a double would round, or a
 * non-zero number it would read as 0, is refused (with its offset); what a
 * double holds is taken, and strings and the default limits are not
 * looked at. */
static void test_exact_numbers(void **state)
{
    (void)state;
    struct ifl_err e = {0};
    struct json_limits x = {.exact_numbers = 1};
    const char *bad[] = {"9007199254740993",
                         "[1, -9007199254740993]",
                         "99999999999999999",
                         "123456789012345678901234567890",
                         "1e-400",
                         "{\"a\": 0.5e-330}",
                         "-2.5E-999",
                         "12345678901234567169",
                         "12345678901234567100"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (parse_rc(bad[i], strlen(bad[i]), &x, &e) != IFL_EINVAL)
            fail_msg("%s was taken", bad[i]);
        assert_non_null(strstr(e.msg, "send it as a string"));
    }
    assert_int_equal(parse_rc("[1, -9007199254740993]", 22, &x, &e), IFL_EINVAL);
    assert_non_null(strstr(e.msg, "byte offset 4"));
    /* …and an integer written as this engine writes its double (the
     * shortest digits, then zeros: 12345678901234567000 is the double
     * 12345678901234567168, 1e+23 written out) */
    const char *good[] = {"12345678901234567000",
                          "100000000000000000000000",
                          "-123456789012345680000000000000",
                          "9007199254740992",
                          "9007199254740994",
                          "12345678901234567168",
                          "-1234567890123456",
                          "0.1",
                          "5e-324",
                          "0e-999",
                          "-0.0",
                          "1e300",
                          "\"9007199254740993\"",
                          "[\"1e-400\", 100000000000000000000]",
                          "000",
                          "0"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        int rc = parse_rc(good[i], strlen(good[i]), &x, &e);
        if (strcmp(good[i], "000") == 0)
            assert_int_equal(rc, IFL_EINVAL); /* not JSON at all */
        else if (rc)
            fail_msg("%s was refused: %s", good[i], e.msg);
    }
    assert_int_equal(parse_rc("9007199254740993", 16, NULL, &e), 0); /* not asked for */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_number_edges),    cmocka_unit_test(test_numbers_csv),
        cmocka_unit_test(test_number_random),   cmocka_unit_test(test_jcs_vectors),
        cmocka_unit_test(test_parse_errors),    cmocka_unit_test(test_parse_depth),
        cmocka_unit_test(test_parse_too_big),   cmocka_unit_test(test_nul_in_strings),
        cmocka_unit_test(test_escaping),        cmocka_unit_test(test_utf16_order),
        cmocka_unit_test(test_write_order),     cmocka_unit_test(test_buffer_cap),
        cmocka_unit_test(test_pointer_and_num), cmocka_unit_test(test_string_lossy),
        cmocka_unit_test(test_exact_numbers),
    };
    return cmocka_run_group_tests_name("json", tests, NULL, NULL);
}
