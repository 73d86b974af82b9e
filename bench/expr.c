/*
 * bench/expr — evaluations per second of the engine's typical expressions
 * (an idempotency key, an edge condition, a URL) on a realistic payload.
 *
 *   build/bench/expr          prints "name evals/s" lines
 *   build/bench/expr --dump   prints the payload then one expression per
 *                             line, so bench/expr.sh can run the reference
 *                             implementation on exactly the same inputs
 */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "expr/expr.h"

static const char payload[] =
    "{\"payload\":{\"order\":{\"id\":\"ord_8f14e45fceea167a\",\"number\":100234,\"amount\":4999,"
    "\"currency\":\"EUR\",\"lines\":[{\"sku\":\"SKU-1\",\"qty\":2,\"price\":1250},"
    "{\"sku\":\"SKU-2\",\"qty\":1,\"price\":2499}],\"createdAt\":\"2024-05-01T10:00:00Z\"},"
    "\"customer\":{\"id\":\"cus_42\",\"email\":\"ada@example.com\",\"name\":\"Ada Lovelace\","
    "\"address\":{\"city\":\"London\",\"country\":\"GB\"}},\"metadata\":{\"source\":\"web\","
    "\"campaign\":\"spring\"}},"
    "\"response\":{\"status\":404,\"headers\":{\"content-type\":\"application/json\"},"
    "\"body\":{\"items\":[],\"error\":{\"code\":\"not_found\"}}},"
    "\"steps\":{\"order_received\":{\"ok\":true}},"
    "\"execution\":{\"id\":\"exe_1\",\"workspace\":\"acme\",\"workflow\":\"charge\",\"test\":false}"
    "}";

static const char *const exprs[][2] = {
    {"key", "'charge-' & payload.order.id"},
    {"condition", "response.status = 404 and $count(response.body.items) = 0"},
    {"url", "'https://api.example.com/v1/customers/' & payload.customer.id & '/orders/' & "
            "payload.order.number & '?currency=' & payload.order.currency"},
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    size_t n = sizeof exprs / sizeof exprs[0];
    if (argc > 1 && !strcmp(argv[1], "--dump")) {
        printf("%s\n", payload);
        for (size_t i = 0; i < n; i++)
            printf("%s\t%s\n", exprs[i][0], exprs[i][1]);
        return 0;
    }
    json_t *in = json_loads(payload, JSON_DECODE_INT_AS_REAL, NULL);
    for (size_t i = 0; i < n; i++) {
        struct expr *x;
        struct expr_error e;
        if (expr_compile(exprs[i][1], strlen(exprs[i][1]), &x, &e)) {
            fprintf(stderr, "%s: %s\n", e.code, e.msg);
            return 1;
        }
        long iters = 0;
        double t0 = now_s(), t;
        do {
            for (int k = 0; k < 1000; k++) {
                json_t *out = NULL;
                if (expr_eval(x, in, NULL, NULL, &out, &e)) {
                    fprintf(stderr, "%s: %s\n", e.code, e.msg);
                    return 1;
                }
                json_decref(out);
            }
            iters += 1000;
            t = now_s();
        } while (t - t0 < 1.0);
        printf("%s %.0f\n", exprs[i][0], (double)iters / (t - t0));
        expr_free(x);
    }
    json_decref(in);
    return 0;
}
