/*
 * fuzz_json — libFuzzer target for the json module.
 *
 * Parses arbitrary bytes with the default limits; when the parse succeeds,
 * writes the RFC 8785 form, parses that back and requires its canonical form
 * to be byte-identical (JCS is idempotent) and its numbers to pass the
 * exact-numbers check (what the engine writes, a client may send back), and
 * exercises json_write too.
 * Any mismatch aborts, which libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct json_limits lim = {.max_bytes = 1 << 20, .max_depth = 0};
    json_t *v = NULL, *w = NULL;
    struct ifl_err e;
    struct buf a, b;

    if (json_parse((const char *)data, size, &lim, &v, &e) != 0)
        return 0;
    buf_init(&a, 0);
    buf_init(&b, 0);
    if (json_jcs(v, &a) != 0)
        abort(); /* a parsed value always has finite numbers */
    if (json_parse(a.p, a.len, NULL, &w, &e) != 0) {
        fprintf(stderr, "JCS output does not parse: %s\n%s\n", e.msg, a.p);
        abort();
    }
    if (json_jcs(w, &b) != 0 || a.len != b.len || memcmp(a.p, b.p, a.len) != 0) {
        fprintf(stderr, "JCS not idempotent:\n%s\n%s\n", a.p, b.p ? b.p : "");
        abort();
    }
    /* what the engine writes, a request may send back: every number of a
     * canonical form is one a double keeps as written (exact_numbers) */
    json_t *x = NULL;
    struct json_limits exact = {.max_bytes = 0, .max_depth = 1000, .exact_numbers = 1};
    if (json_parse(a.p, a.len, &exact, &x, &e) != 0) {
        fprintf(stderr, "JCS output refused as inexact: %s\n%s\n", e.msg, a.p);
        abort();
    }
    json_decref(x);
    x = NULL; /* and the raw input, parsed so, never crashes */
    if (json_parse((const char *)data, size, &exact, &x, &e) == 0)
        json_decref(x);
    char *s = json_to_string(v);
    if (!s)
        abort();
    free(s);
    buf_free(&a);
    buf_free(&b);
    json_decref(v);
    json_decref(w);
    return 0;
}
