/*
 * fuzz_expr — libFuzzer target: compile and evaluate arbitrary JSONata.
 *
 * Input layout: the expression, optionally followed by a NUL byte and a
 * JSON input document.  Evaluation runs under tight limits so hostile
 * expressions end in U1001/U1002 instead of hanging; any crash, leak or UB
 * is a bug.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "expr/expr.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    const char *nul = memchr(s, 0, size);
    size_t elen = nul ? (size_t)(nul - s) : size;
    json_t *input = NULL;
    if (nul && size - elen > 1)
        input =
            json_loadb(nul + 1, size - elen - 1, JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL, NULL);
    struct expr *x = NULL;
    struct expr_error e;
    if (expr_compile(s, elen, &x, &e) == 0) {
        struct expr_limits lim = {100, 200, (size_t)4 << 20};
        json_t *out = NULL;
        if (expr_eval(x, input, NULL, &lim, &out, &e) == 0)
            json_decref(out);
        expr_free(x);
    }
    json_decref(input);
    return 0;
}
