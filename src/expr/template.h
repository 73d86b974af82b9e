/*
 * template — workflow config values with embedded expressions (spec §3).
 *
 * A template is any JSON value.  A string starting with `=` is a JSONata
 * expression (the text after `=`, leading spaces ignored); any other string
 * is a literal in which `{{ secrets.NAME }}` (spaces optional) is replaced by
 * the workspace secret NAME.  Secrets are only reachable through `{{ }}`:
 * expressions never see them, and a substituted secret is never evaluated.
 *
 * A compiled template is immutable and may be evaluated concurrently.
 */
#ifndef IFL_EXPR_TEMPLATE_H
#define IFL_EXPR_TEMPLATE_H

#include <jansson.h>

#include "base/err.h"
#include "expr/expr.h"

struct tmpl;

/* Compiles every expression in def (borrowed; the template keeps its own
 * reference).  On a syntax error returns IFL_EVALIDATION with err->pointer =
 * base_pointer (may be NULL or "") + the JSON Pointer of the string, and
 * err->msg holding the JSONata code and position.  On success *out is owned
 * by the caller (tmpl_free). */
int tmpl_compile(json_t *def, const char *base_pointer, struct tmpl **out, struct ifl_err *err);

/* Frees t; NULL is allowed. */
void tmpl_free(struct tmpl *t);

/* Resolves secret name into a fresh heap string (*value_out, caller frees);
 * returns 0, or a negative IFL_E* code (e.g. IFL_ENOTFOUND). */
typedef int (*tmpl_secret_fn)(void *ctx, const char *name, char **value_out);

/* Evaluates t against context (the expression input, e.g. {payload, steps,
 * execution}; borrowed).  An expression member that evaluates to undefined
 * is dropped from its object, becomes null inside an array, and yields
 * JSON null at the top level.  On success *out is a new reference.  Errors:
 * IFL_EEXPR for an evaluation error (err->msg "CODE: message", err->pointer
 * the member), IFL_ENOTFOUND (or the resolver's code) for a missing secret,
 * IFL_EVALIDATION when a {{ }} literal is used without a resolver.  lim may
 * be NULL for the expression defaults. */
int tmpl_eval_lim(const struct tmpl *t, json_t *context, tmpl_secret_fn secrets, void *secrets_ctx,
                  const struct expr_limits *lim, json_t **out, struct ifl_err *err);
int tmpl_eval(const struct tmpl *t, json_t *context, tmpl_secret_fn secrets, void *secrets_ctx,
              json_t **out, struct ifl_err *err);

/* 1 when the template contains no expression and no secret reference (its
 * value is the definition itself). */
int tmpl_is_constant(const struct tmpl *t);

/* The longest NAME a `{{ secrets.NAME }}` placeholder may have: a longer
 * one is not read as a placeholder (it stays text). */
#define TMPL_SECRET_NAME_MAX 128

/* 1 when s is exactly one `{{ secrets.NAME }}` reference (nothing around
 * it), with NAME copied into name (cap bytes, NUL-terminated; 0 when it
 * does not fit). */
int tmpl_secret_ref(const char *s, char *name, size_t cap);

/* The JSON Pointer (base_pointer included) of the first string with a
 * `{{ secrets.NAME }}` reference, or NULL when there is none.  Borrowed
 * from t. */
const char *tmpl_secret_pointer(const struct tmpl *t);

#endif
