/*
 * cli — `idemflow eval EXPR [--data FILE] [--bindings JSON]`.
 *
 * Reads the input document from --data or stdin (empty input = undefined),
 * evaluates EXPR and prints the result as compact JSON with ECMAScript
 * number formatting, or nothing when the result is undefined.  Errors go to
 * stderr as "CODE: message" with exit status 1 (2 for usage errors).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "expr/expr.h"
#include "json/json.h"

#define CLI_MAX_INPUT ((size_t)64 << 20)

static int read_all(FILE *f, struct buf *b)
{
    char tmp[65536];
    size_t r;
    while ((r = fread(tmp, 1, sizeof tmp, f)) > 0)
        if (buf_append(b, tmp, r))
            return IFL_ETOOBIG;
    return ferror(f) ? IFL_EIO : 0;
}

static int only_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r')
            return 0;
    return 1;
}

int expr_cli_main(int argc, char **argv)
{
    const char *src = NULL, *data = NULL, *bind = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--data") && i + 1 < argc)
            data = argv[++i];
        else if (!strcmp(argv[i], "--bindings") && i + 1 < argc)
            bind = argv[++i];
        else if (!src)
            src = argv[i];
        else {
            fprintf(stderr, "usage: idemflow eval EXPR [--data FILE] [--bindings JSON]\n");
            return 2;
        }
    }
    if (!src) {
        fprintf(stderr, "usage: idemflow eval EXPR [--data FILE] [--bindings JSON]\n");
        return 2;
    }
    int rc = 1;
    struct buf in;
    buf_init(&in, CLI_MAX_INPUT);
    json_t *input = NULL, *bindings = NULL, *out = NULL;
    struct expr *x = NULL;
    struct ifl_err je;
    if (data) {
        FILE *f = fopen(data, "rb");
        if (!f) {
            fprintf(stderr, "EIO: cannot open %s\n", data);
            goto done;
        }
        int r = read_all(f, &in);
        fclose(f);
        if (r) {
            fprintf(stderr, "%s: cannot read %s\n", err_name(r), data);
            goto done;
        }
    } else if (!isatty(0)) {
        int r = read_all(stdin, &in);
        if (r) {
            fprintf(stderr, "%s: cannot read stdin\n", err_name(r));
            goto done;
        }
    }
    if (in.len && !only_space(in.p, in.len)) {
        struct json_limits lim = {.max_bytes = CLI_MAX_INPUT, .max_depth = 512};
        if (json_parse(in.p, in.len, &lim, &input, &je)) {
            fprintf(stderr, "EINVAL: input is not JSON: %s\n", je.msg);
            goto done;
        }
    }
    if (bind) {
        struct json_limits lim = {.max_bytes = CLI_MAX_INPUT, .max_depth = 512};
        if (json_parse(bind, strlen(bind), &lim, &bindings, &je) || !json_is_object(bindings)) {
            fprintf(stderr, "EINVAL: --bindings must be a JSON object\n");
            goto done;
        }
    }
    struct expr_error xe;
    if (expr_compile(src, strlen(src), &x, &xe) || expr_eval(x, input, bindings, NULL, &out, &xe)) {
        fprintf(stderr, "%s: %s", xe.code, xe.msg);
        if (xe.position >= 0)
            fprintf(stderr, " (position %d)", xe.position);
        fprintf(stderr, "\n");
        goto done;
    }
    if (out) {
        struct buf o;
        buf_init(&o, 0);
        if (json_write(out, &o)) {
            fprintf(stderr, "D1001: result cannot be written as JSON\n");
            buf_free(&o);
            goto done;
        }
        fwrite(o.p, 1, o.len, stdout);
        fputc('\n', stdout);
        buf_free(&o);
    }
    rc = 0;
done:
    expr_free(x);
    json_decref(input);
    json_decref(bindings);
    json_decref(out);
    buf_free(&in);
    return rc;
}
