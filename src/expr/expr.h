/*
 * expr — JSONata expressions: compile once, evaluate many times.
 *
 * A compiled `struct expr` is an immutable syntax tree (plus precompiled
 * regular expressions and literal values).  Evaluation never writes to it, so
 * one expression may be evaluated concurrently from several threads.  Every
 * evaluation runs in its own arena that is released before expr_eval returns;
 * only the result, converted to jansson, outlives the call.
 *
 * Semantics follow the JSONata reference implementation (jsonata-js 2.x): see
 * docs/expr.md for the value model, the limits and the known gaps.
 *
 * Never: read anything but the input and bindings handed in (no environment,
 * no files, no secrets), or run without the depth/time/size limits.
 */
#ifndef IFL_EXPR_EXPR_H
#define IFL_EXPR_EXPR_H

#include <jansson.h>
#include <stddef.h>

#include "base/err.h"

struct expr; /* compiled, immutable; safe to evaluate concurrently */

struct expr_error {
    char code[8];   /* JSONata error code, e.g. "T2001", "S0201", "U1001" */
    int position;   /* character offset in the source, or -1 */
    char token[64]; /* offending token when known, else "" */
    char msg[256];  /* human readable message (never contains secrets) */
};

struct expr_limits {
    int max_depth;    /* nesting of evaluation steps; default 200 */
    long max_time_ms; /* wall-clock budget; default 1000 */
    size_t max_bytes; /* cap on memory used by produced values; default 16 MiB */
};

#define EXPR_DEFAULT_DEPTH 200
#define EXPR_DEFAULT_TIME_MS 1000
#define EXPR_DEFAULT_BYTES ((size_t)16 << 20)
#define EXPR_MAX_SOURCE ((size_t)1 << 20) /* longest accepted source text */

/* Compiles src[0..len).  On success *out is a new expression the caller frees
 * with expr_free().  On a syntax error returns IFL_EEXPR and fills *err (may
 * be NULL) with the S0xxx code and position. */
int expr_compile(const char *src, size_t len, struct expr **out, struct expr_error *err);

/* Frees x; NULL is allowed. */
void expr_free(struct expr *x);

/* The source text the expression was compiled from (borrowed, valid until
 * expr_free). */
const char *expr_source(const struct expr *x);

/* The first of `names` (NULL-terminated, without `$`) that x refers to as a
 * variable or function ($now, $random(), …), or NULL: a static check, so
 * a function reached another way ($lookup, a lambda's argument) is not
 * seen. */
const char *expr_uses_variable(const struct expr *x, const char *const *names);

/* Evaluates x.  input: borrowed, NULL means undefined.  bindings: borrowed
 * JSON object of variables (names without `$`) or NULL.  lim: NULL for the
 * defaults.  On success returns 0 and *out is a new reference the caller
 * releases with json_decref(), or NULL when the result is undefined.  A
 * function-valued result (or member) is converted to "" as $string() does.
 * On failure returns IFL_EEXPR and fills *err (may be NULL); limit breaches
 * report code "U1001". */
int expr_eval(const struct expr *x, json_t *input, json_t *bindings, const struct expr_limits *lim,
              json_t **out, struct expr_error *err);

/* A deadline, on top of each evaluation's own max_time_ms, for every
 * evaluation the calling thread runs until it is set again: `ms` from now
 * (0: none).  For work a thread may leave to another when it takes too
 * long (an HTTP thread's inline steps: engine.c).  Past it an evaluation
 * ends with U1001, as at its own limit, and expr_deadline_hit() turns 1. */
void expr_deadline_set(long ms);
/* 1 when an evaluation on this thread ended at that deadline since it was
 * set. */
int expr_deadline_hit(void);

/* `idemflow eval EXPR [--data FILE] [--bindings JSON]`; argv[0] is "eval".
 * Prints the result as JSON on stdout (nothing when undefined) and returns
 * 0; on error prints "CODE: message" on stderr and returns 1 (2 on usage
 * errors). */
int expr_cli_main(int argc, char **argv);

#endif
