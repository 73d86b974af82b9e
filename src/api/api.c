/*
 * api — see api.h.
 *
 * Routing is a split of the decoded path into at most 8 segments matched
 * against a small table; each handler validates its inputs fully before it
 * touches the engine, so a rejected request changes nothing.
 */
#include "api/api.h"
#include "api/sse.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "crypto/crypto.h"
#include "engine/identity.h"
#include "engine/workflow.h"
#include "json/json.h"

#include <ctype.h>
#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_SEGS 8

struct api {
    struct engine *g;
    struct api_opts o;
    atomic_ullong requests, responses_4xx, responses_5xx;
    atomic_ullong triggers_created, triggers_deduplicated, triggers_rejected;
    int64_t started_ms;
    uint8_t admin_digest[CRYPTO_SHA256_LEN]; /* SHA-256 of o.admin_token, when set */
    _Atomic(const struct http_server *) srv; /* borrowed; NULL until attached */
};

struct call {
    struct api *a;
    const struct http_req *req;
    struct http_res *res;
    char *seg[MAX_SEGS];
    int nseg;
    int deferred; /* the answer comes later (http_defer); counted then */
    /* No valid bearer token, on a route a signed webhook may take (the
     * trigger): the engine lets only a signed entry point answer. */
    int unauthenticated;
};

/* ---- responses ---------------------------------------------------------------- */

static void title_of(const char *slug, char *out, size_t cap)
{
    size_t i = 0;
    for (; slug[i] && i + 1 < cap; i++)
        out[i] = slug[i] == '-' ? ' ' : slug[i];
    out[i] = '\0';
    if (out[0] >= 'a' && out[0] <= 'z')
        out[0] = (char)(out[0] - 'a' + 'A');
}

void api_problem(struct http_res *res, int status, const char *slug, const char *detail,
                 const char *pointer)
{
    char title[64], type[96];
    title_of(slug, title, sizeof title);
    snprintf(type, sizeof type, "/problems/%s", slug);
    json_t *p = json_object();
    json_object_set_new(p, "type", json_string(type));
    json_object_set_new(p, "title", json_string(title));
    json_object_set_new(p, "status", json_integer(status));
    json_object_set_new(p, "detail", json_string_lossy(detail ? detail : title));
    if (pointer)
        json_object_set_new(p, "pointer", json_string_lossy(pointer));
    http_res_body(res, status, "application/problem+json", json_to_string(p));
    json_decref(p);
}

void api_problem_err(struct http_res *res, const struct ifl_err *e)
{
    int status = err_http_status(e->code);
    const char *slug = e->slug[0] ? e->slug : err_problem_slug(e->code);
    int has_ptr = e->code == IFL_EVALIDATION || e->pointer[0];
    api_problem(res, status, slug, e->msg[0] ? e->msg : NULL, has_ptr ? e->pointer : NULL);
}

/* api_problem whose pointer names one member of the body or query
 * (escaped), or the whole body when member is NULL. */
static void member_problem(struct http_res *res, int status, const char *slug, const char *why,
                           const char *member)
{
    struct buf ptr;
    buf_init(&ptr, 0);
    if (member)
        json_pointer_push(&ptr, member);
    api_problem(res, status, slug, why, member ? ptr.p : "");
    buf_free(&ptr);
}

void api_toobig(void *ctx, size_t limit, struct http_res *res)
{
    struct api *a = ctx;
    atomic_fetch_add(&a->responses_4xx, 1);
    char detail[128];
    snprintf(detail, sizeof detail, "the request body exceeds the limit of %zu bytes", limit);
    api_problem(res, 413, "payload-too-large", detail, NULL);
}

static void reply_json(struct http_res *res, int status, json_t *body /* stolen */)
{
    char *text = json_to_string(body);
    json_decref(body);
    if (!text) {
        api_problem(res, 500, "internal-error", "response holds a non-finite number", NULL);
        return;
    }
    http_res_body(res, status, "application/json", text);
}

/* ---- request helpers ----------------------------------------------------------- */

/* A body is JSON when it comes without a Content-Type or with a media type
 * (parameters aside) of application/json or any type/…+json; a type that
 * merely starts with "application/json" or has "+json" in a parameter is
 * not. */
static int content_type_ok(const struct http_req *r)
{
    const char *ct = r->header(r, "Content-Type");
    if (!ct || !*ct || r->body_len == 0)
        return 1;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    size_t n = strcspn(ct, ";");
    while (n && (ct[n - 1] == ' ' || ct[n - 1] == '\t'))
        n--;
    if (n == 16 && strncasecmp(ct, "application/json", 16) == 0)
        return 1;
    const char *slash = memchr(ct, '/', n);
    return slash && slash > ct && (size_t)(ct + n - slash) > 6 &&
           strncasecmp(ct + n - 5, "+json", 5) == 0;
}

/* Parses the body as JSON.  An empty body yields `empty_as` (a new ref of it,
 * or NULL → 400 "a JSON body is required").  On failure fills the response
 * and returns NULL. */
/* The body as JSON (a new reference), or NULL with the problem answered;
 * an empty body is empty_as when given.  sensitive: the body carries a
 * secret, so a syntax error does not quote the text it stopped at. */
static json_t *body_json_of(struct call *c, json_t *empty_as, int sensitive)
{
    const struct http_req *r = c->req;
    if (!content_type_ok(r)) {
        api_problem(c->res, 415, "unsupported-media-type",
                    "send the body as JSON with Content-Type: application/json", NULL);
        return NULL;
    }
    const char *p = r->body;
    size_t n = r->body_len;
    while (n && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++, n--;
    if (n == 0) {
        if (empty_as)
            return json_incref(empty_as);
        api_problem(c->res, 400, "invalid-json", "a JSON body is required", "");
        return NULL;
    }
    struct json_limits lim = {
        .max_bytes = c->a->o.max_body, .max_depth = c->a->o.max_depth, .exact_numbers = 1};
    struct ifl_err e = {0};
    json_t *v = NULL;
    if (json_parse(r->body, r->body_len, &lim, &v, &e)) {
        char *near = sensitive ? strstr(e.msg, " near ") : NULL;
        if (near)
            *near = '\0';
        if (e.code == IFL_ETOOBIG)
            api_problem(c->res, 413, "payload-too-large", e.msg, NULL);
        else
            api_problem(c->res, 400, "invalid-json", e.msg, "");
        return NULL;
    }
    return v;
}

static json_t *body_json(struct call *c, json_t *empty_as)
{
    return body_json_of(c, empty_as, 0);
}

/* body_json with an empty body read as {} (a new reference either way). */
static json_t *body_or_empty(struct call *c)
{
    json_t *empty = json_object();
    json_t *body = body_json(c, empty);
    json_decref(empty);
    return body;
}

static int check_name(struct call *c, const char *what, const char *name)
{
    /* a stored version's vertex may be named "." or ".." (refused for new
     * ones only): its entry point can still be triggered as "%2E%2E" */
    if (wf_name_valid(name) || (wf_name_dots(name) && strcmp(what, "vertex") == 0))
        return 0;
    char d[200];
    snprintf(d, sizeof d, "%s names are 1-128 characters of A-Z a-z 0-9 _ - ., not . or ..", what);
    api_problem(c->res, 400, "invalid-name", d, NULL);
    return -1;
}

static int workspace_exists(struct call *c, const char *ws)
{
    if (check_name(c, "workspace", ws))
        return -1;
    struct ifl_err e = {0};
    if (store_workspace_exists(engine_store(c->a->g), ws, &e)) {
        if (e.code == IFL_ENOTFOUND)
            err_slug(&e, "workspace-not-found");
        api_problem_err(c->res, &e);
        return -1;
    }
    return 0;
}

/* Parses a query boolean: 1 true, 0 false, -1 absent, -2 malformed (answered). */
static int query_bool(struct call *c, const char *name)
{
    const char *v = c->req->query(c->req, name);
    if (!v)
        return -1;
    if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
        return 1;
    if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
        return 0;
    char ptr[80];
    snprintf(ptr, sizeof ptr, "/%s", name);
    api_problem(c->res, 400, "invalid-parameter", "expected true or false (or 1 or 0)", ptr);
    return -2;
}

/* ---- handlers --------------------------------------------------------------------- */

static void h_workspace_put(struct call *c)
{
    const char *ws = c->seg[2];
    if (check_name(c, "workspace", ws))
        return;
    json_t *body = body_or_empty(c);
    if (!body)
        return;
    if (!json_is_object(body)) {
        json_decref(body);
        api_problem(c->res, 422, "validation-error", "workspace settings must be an object", "");
        return;
    }
    /* This version defines no workspace settings: a member is one it would
     * keep and never read, which the sender cannot tell from one it reads. */
    if (json_object_size(body)) {
        member_problem(c->res, 422, "validation-error",
                       "this version has no workspace settings: send {} (or no body)",
                       json_object_iter_key(json_object_iter(body)));
        json_decref(body);
        return;
    }
    char *settings = json_to_string(body);
    json_decref(body);
    int created = 0;
    struct ifl_err e = {0};
    int rc = store_workspace_put(engine_store(c->a->g), ws, settings, &created, &e);
    free(settings);
    if (rc) {
        api_problem_err(c->res, &e);
        return;
    }
    json_t *out = json_object();
    json_object_set_new(out, "workspace", json_string(ws));
    json_object_set_new(out, "created", json_boolean(created));
    reply_json(c->res, created ? 201 : 200, out);
}

static void h_workspace_get(struct call *c)
{
    if (workspace_exists(c, c->seg[2]))
        return;
    json_t *out = json_object();
    json_object_set_new(out, "workspace", json_string(c->seg[2]));
    reply_json(c->res, 200, out);
}

static void h_workflow_put(struct call *c)
{
    const char *ws = c->seg[2], *wf = c->seg[4];
    if (workspace_exists(c, ws) || check_name(c, "workflow", wf))
        return;
    json_t *def = body_json(c, NULL);
    if (!def)
        return;
    int version = 0;
    struct ifl_err e = {0};
    int rc = engine_workflow_put(c->a->g, ws, wf, def, &version, &e);
    json_decref(def);
    if (rc) {
        api_problem_err(c->res, &e);
        return;
    }
    json_t *out = json_object();
    json_object_set_new(out, "workflow", json_string(wf));
    json_object_set_new(out, "version", json_integer(version));
    char loc[512];
    snprintf(loc, sizeof loc, "/v1/workspaces/%s/workflows/%s?version=%d", ws, wf, version);
    http_res_header(c->res, "Location", loc);
    reply_json(c->res, 201, out);
}

static void h_workflow_get(struct call *c)
{
    const char *ws = c->seg[2], *wf = c->seg[4];
    if (workspace_exists(c, ws) || check_name(c, "workflow", wf))
        return;
    int version = 0;
    const char *vq = c->req->query(c->req, "version");
    if (vq) {
        char *end = NULL;
        long v = strtol(vq, &end, 10);
        if (end == vq || *end || v < 1 || v > 1000000000) {
            api_problem(c->res, 400, "invalid-parameter", "version must be a positive integer",
                        "/version");
            return;
        }
        version = (int)v;
    }
    struct store_workflow w;
    struct ifl_err e = {0};
    if (store_workflow_get(engine_store(c->a->g), ws, wf, version, &w, &e)) {
        api_problem_err(c->res, &e);
        return;
    }
    json_t *def = NULL;
    json_parse(w.definition, strlen(w.definition), NULL, &def, NULL);
    json_t *out = json_object();
    json_object_set_new(out, "workflow", json_string(wf));
    json_object_set_new(out, "version", json_integer(w.version));
    json_object_set_new(out, "createdAt", json_time(w.created_at));
    json_object_set_new(out, "definition", def ? def : json_null());
    store_workflow_clear(&w);
    reply_json(c->res, 200, out);
}

static int secret_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 128)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_'))
            return 0;
    }
    return 1;
}

static void h_secret_put(struct call *c)
{
    const char *ws = c->seg[2], *name = c->seg[4];
    if (workspace_exists(c, ws))
        return;
    if (!secret_name_ok(name)) {
        api_problem(c->res, 400, "invalid-name",
                    "secret names are 1-128 characters of A-Z a-z 0-9 _", NULL);
        return;
    }
    json_t *body = body_json_of(c, NULL, 1);
    if (!body)
        return;
    json_t *v = json_object_get(body, "value");
    const char *why = NULL, *member = "value";
    if (!json_is_object(body) || !json_text(v) || json_string_length(v) == 0) {
        why = "expected {\"value\": \"…\"} with a non-empty string without NUL";
    } else if (json_string_length(v) < GW_SECRET_MIN) {
        why = "a secret value has at least 4 bytes: a shorter one is ordinary text (\"on\", "
              "\"id\"), which could not be masked where a destination echoes it";
    } else if (json_object_size(body) != 1) {
        why = "a secret takes only \"value\"";
        const char *k;
        json_t *m;
        json_object_foreach(body, k, m) if (strcmp(k, "value") != 0)
        {
            member = k;
            break;
        }
    }
    if (why) {
        member_problem(c->res, 422, "validation-error", why, member);
        json_decref(body); /* jansson frees the plaintext copy */
        return;
    }
    struct ifl_err e = {0};
    int rc = engine_secret_put(c->a->g, ws, name, json_string_value(v), &e);
    json_decref(body); /* jansson frees the plaintext copy */
    if (rc) {
        api_problem_err(c->res, &e);
        return;
    }
    http_res_body(c->res, 204, NULL, NULL);
}

static void h_secret_list(struct call *c)
{
    const char *ws = c->seg[2];
    if (workspace_exists(c, ws))
        return;
    char **names = NULL;
    size_t n = 0;
    struct ifl_err e = {0};
    if (store_secret_list(engine_store(c->a->g), ws, &names, &n, &e)) {
        api_problem_err(c->res, &e);
        return;
    }
    json_t *items = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *it = json_object();
        json_object_set_new(it, "name", json_string(names[i]));
        json_array_append_new(items, it);
    }
    store_strv_free(names, n);
    json_t *out = json_object();
    json_object_set_new(out, "items", items);
    json_object_set_new(out, "next", json_null());
    reply_json(c->res, 200, out);
}

/* The answer to a trigger that got past the request checks.  wait_s > 0:
 * the trigger asked `Prefer: wait` and was held (Preference-Applied). */
static void trigger_answer(struct api *a, struct http_res *res, const char *ws, int rc,
                           struct ifl_err *e, const struct trigger_res *out, long wait_s)
{
    if (rc) {
        if (e->code == IFL_ENOTFOUND && !e->slug[0])
            err_slug(e, "not-found");
        if (e->code == IFL_EUNAUTH && strcmp(e->slug, "unauthorized") == 0)
            http_res_header(res, "WWW-Authenticate", "Bearer");
        api_problem_err(res, e);
        atomic_fetch_add(&a->triggers_rejected, 1);
        return;
    }
    char loc[256];
    snprintf(loc, sizeof loc, "/v1/workspaces/%s/executions/%s", ws, out->id);
    http_res_header(res, "Location", loc);
    if (wait_s > 0) {
        char pa[32];
        snprintf(pa, sizeof pa, "wait=%ld", wait_s);
        http_res_header(res, "Preference-Applied", pa);
    }
    json_t *body = json_object();
    json_object_set_new(body, "executionId", json_string(out->id));
    json_object_set_new(body, "deduplicated", json_boolean(!out->created && !out->stale));
    if (out->stale)
        json_object_set_new(body, "stale", json_true());
    else if (!out->created)
        json_object_set_new(body, "samePayload", json_boolean(out->same_payload));
    /* A new execution is `running` (spec §4), also when the TRANSFORMs its
     * entry dispatched already finished it in the same commit; a trigger
     * that waited (`Prefer: wait`) gets the status it waited for. */
    json_object_set_new(body, "status",
                        json_string(out->created && wait_s <= 0 ? "running" : out->status));
    if (!out->stale)
        atomic_fetch_add(out->created ? &a->triggers_created : &a->triggers_deduplicated, 1);
    reply_json(res, out->created ? 201 : 200, body);
}

static void count_response(struct api *a, int status)
{
    if (status >= 500)
        atomic_fetch_add(&a->responses_5xx, 1);
    else if (status >= 400)
        atomic_fetch_add(&a->responses_4xx, 1);
}

/* The longest `Prefer: wait` honoured, in seconds (RFC 7240 lets a server
 * cap it; docs/api.md). */
#define MAX_WAIT_S 60

/* A trigger whose answer waits without a thread sleeping on it (the
 * event-driven front): for its creating transaction's commit and, with
 * `Prefer: wait=N`, then for its execution to leave `running`. */
struct deferred_trigger {
    struct api *a;
    char *ws;
    struct engine_trigger_op *op; /* until the commit's finish */
    struct http_later *later;
    struct engine_waiter *w; /* Prefer: wait; NULL without */
    long wait_s;
    int64_t deadline_ms;    /* clock_mono_ms() */
    struct trigger_res out; /* the answer while its execution runs */
    int rc;                 /* of engine_trigger_end, when it ran on the writer */
    struct ifl_err e;
    int run;         /* …/run: the answer is the execution's event stream */
    char cursor[48]; /* …/run: the feed's end before the trigger */
};

/* The longest a …/run stream stays open (docs/api.md). */
#define RUN_MAX_MS (10 * 60 * 1000)

/* A trigger's answer: JSON, or for …/run the event stream. */
static void answer(struct deferred_trigger *dt, struct http_res *res, int rc, struct ifl_err *e,
                   long wait_s)
{
    if (!dt->run || rc) {
        trigger_answer(dt->a, res, dt->ws, rc, e, &dt->out, wait_s);
        return;
    }
    char loc[256];
    snprintf(loc, sizeof loc, "/v1/workspaces/%s/executions/%s", dt->ws, dt->out.id);
    http_res_header(res, "Location", loc);
    if (!dt->out.stale)
        atomic_fetch_add(dt->out.created ? &dt->a->triggers_created : &dt->a->triggers_deduplicated,
                         1);
    sse_run_stream(dt->a->g, res, dt->ws, &dt->out, dt->cursor, RUN_MAX_MS);
}

static void dt_free(struct deferred_trigger *dt)
{
    engine_waiter_remove(dt->a->g, dt->w);
    free(dt->ws);
    free(dt);
}

static void trigger_committed(void *arg) /* on the store's writer thread */
{
    struct deferred_trigger *dt = arg;
    http_resume(dt->later);
}

static void wait_over(void *arg) /* an engine thread: moved, deadline or close */
{
    struct deferred_trigger *dt = arg;
    http_resume(dt->later);
}

/* With `Prefer: wait`, the commit does not resume the connection only to
 * suspend it again (each costs the event loop a round): the writer ends the
 * trigger here — starting its GATEWAY calls, as trigger_finish would — and
 * arms the waiter, so the connection is resumed once, for the answer
 * (wait_finish). */
static void trigger_committed_waiting(void *arg) /* on the store's writer thread */
{
    struct deferred_trigger *dt = arg;
    dt->rc = engine_trigger_end(dt->op, &dt->out, &dt->e);
    dt->op = NULL;
    /* (arm refuses a waiter whose execution moved or whose deadline passed) */
    if (dt->rc || strcmp(dt->out.status, "running") != 0 ||
        engine_waiter_arm(dt->a->g, dt->w, dt->deadline_ms, wait_over, dt))
        http_resume(dt->later);
}

/* The answer after a wait: the status the execution moved to, or still
 * `running` (deadline). */
static void wait_finish(void *arg, const struct http_req *req, struct http_res *res)
{
    (void)req;
    struct deferred_trigger *dt = arg;
    if (!dt->rc)
        engine_waiter_status(dt->a->g, dt->w, dt->out.status); /* unchanged when still running */
    answer(dt, res, dt->rc, &dt->e, dt->wait_s);
    count_response(dt->a, res->status);
    dt_free(dt);
}

/* Holds a committed trigger's answer (dt->out, status `running`) until its
 * execution leaves `running` or the deadline passes.  1: deferred (the
 * answer comes from wait_finish); 0: it cannot be deferred, answer now. */
static int hold(struct deferred_trigger *dt, const struct http_req *req)
{
    dt->later = http_defer(req, wait_finish, dt);
    if (!dt->later)
        return 0;
    if (engine_waiter_arm(dt->a->g, dt->w, dt->deadline_ms, wait_over, dt))
        http_resume(dt->later); /* moved or due already: wait_finish answers at once */
    return 1;
}

static void wake_sleeper(void *arg)
{
    sem_post(arg);
}

/* A waiter for execution out->id, added after its status was read (a
 * repeat, or a commit already waited for): the status is read once more
 * into out->status, since a finish in between would otherwise be missed
 * until the deadline.  Returns the waiter (engine_waiter_remove). */
static struct engine_waiter *watch(struct api *a, const char *ws, struct trigger_res *out)
{
    struct engine_waiter *w = engine_waiter_add(a->g, ws, out->id);
    struct store_execution x;
    struct ifl_err e = {0};
    if (store_execution_get(engine_store(a->g), ws, out->id, &x, &e) == 0) {
        snprintf(out->status, sizeof out->status, "%s", x.status);
        store_execution_clear(&x);
    }
    return w;
}

/* The thread-per-connection front: the handler's own thread sleeps until
 * execution out->id leaves `running` or the deadline; out->status is
 * updated. */
static void wait_here(struct api *a, const char *ws, int64_t deadline_ms, struct trigger_res *out)
{
    struct engine_waiter *w = watch(a, ws, out);
    sem_t done;
    sem_init(&done, 0, 0);
    if (strcmp(out->status, "running") == 0 &&
        engine_waiter_arm(a->g, w, deadline_ms, wake_sleeper, &done) == 0)
        while (sem_wait(&done) != 0)
            ;
    engine_waiter_status(a->g, w, out->status);
    sem_destroy(&done);
    engine_waiter_remove(a->g, w);
}

/* The answer to a trigger without `Prefer: wait`, once its commit is done. */
static void trigger_finish(void *arg, const struct http_req *req, struct http_res *res)
{
    struct deferred_trigger *dt = arg;
    struct ifl_err e = {0};
    (void)req;
    int rc = engine_trigger_end(dt->op, &dt->out, &e); /* no wait: else trigger_committed_waiting */
    dt->op = NULL;
    answer(dt, res, rc, &e, 0);
    count_response(dt->a, res->status);
    dt_free(dt);
}

static const char *req_header(const void *req, const char *name)
{
    const struct http_req *r = req;
    return r->header(r, name);
}

static void key_problem(struct call *c, int k, const char *required_why);

/* mode: 0 the trigger, 1 a test run, 2 a streaming run (…/run) */
static void trigger(struct call *c, int mode)
{
    struct api *a = c->a;
    int test = mode == 1, fresh_default = mode != 0;
    const char *ws = c->seg[2], *wf = c->seg[4], *vx = c->seg[6];
    if (check_name(c, "workspace", ws) || check_name(c, "workflow", wf) ||
        check_name(c, "vertex", vx))
        goto rejected;
    int force = query_bool(c, "forceNewExecution");
    if (force == -2)
        goto rejected;
    if (mode == 0 && force == 1) {
        api_problem(c->res, 400, "force-new-not-allowed",
                    "forceNewExecution is not allowed on the production trigger: give the entry "
                    "point idempotencyFields or send a unique clientIdempotencyId",
                    "/forceNewExecution");
        goto rejected;
    }
    const char *qk = c->req->query(c->req, "clientIdempotencyId");
    const char *hk = c->req->header(c->req, "Idempotency-Key");
    if (hk && c->req->header_count && c->req->header_count(c->req, "Idempotency-Key") > 1) {
        key_problem(c, -2, NULL);
        goto rejected;
    }
    /* The header is an RFC 8941 sf-string (spec §7): `"k-1"` is the key
     * k-1, as ?clientIdempotencyId=k-1 is; any other value (a bare token,
     * or text with spaces) is the key as sent — without the whitespace
     * around it, which is no part of a field value (RFC 9110 §5.5). */
    char hbuf[IDENTITY_KEY_MAX + 1], tbuf[IDENTITY_KEY_MAX + 3];
    if (hk) {
        hk += strspn(hk, " \t");
        size_t hl = strlen(hk);
        while (hl && (hk[hl - 1] == ' ' || hk[hl - 1] == '\t'))
            hl--;
        if (hl < strlen(hk) && hl < sizeof tbuf) {
            memcpy(tbuf, hk, hl);
            tbuf[hl] = '\0';
            hk = tbuf;
        }
    }
    if (hk && hk[0] == '"' && http_sf_string(hk, hbuf, sizeof hbuf) == 0)
        hk = hbuf;
    else if (hk && strcmp(hk, "\"\"") == 0) {
        api_problem(c->res, 400, "invalid-idempotency-key",
                    "the Idempotency-Key is empty: a key is 1-255 printable ASCII characters",
                    NULL);
        goto rejected;
    }
    /* A test run is a new execution by default, unless the caller gave a
     * key: then the key decides, as on the trigger (a retried test run is
     * the same one).  A key with forceNewExecution=true says both. */
    if (fresh_default && force == 1 && (qk || hk)) {
        api_problem(c->res, 400, "conflicting-idempotency-keys",
                    "forceNewExecution=true asks for a new execution, the idempotency key for "
                    "the one it names: send one of them",
                    "/forceNewExecution");
        goto rejected;
    }
    if (fresh_default && force == -1)
        force = !(qk || hk);
    if (qk && hk && strcmp(qk, hk) != 0) {
        api_problem(c->res, 400, "conflicting-idempotency-keys",
                    "clientIdempotencyId and the Idempotency-Key header differ", NULL);
        goto rejected;
    }
    long wait_s = mode == 2 ? -1 : http_prefer_wait(c->req->header(c->req, "Prefer"));
    int64_t cap_ms = a->o.max_wait_ms > 0 ? a->o.max_wait_ms : MAX_WAIT_S * 1000;
    if (wait_s > (cap_ms + 999) / 1000)
        wait_s = (long)((cap_ms + 999) / 1000); /* what Preference-Applied says */
    int64_t wait_ms = wait_s > 0 ? wait_s * 1000 : 0;
    int64_t deadline_ms = clock_mono_ms() + (wait_ms < cap_ms ? wait_ms : cap_ms);
    json_t *payload = body_json(c, json_null());
    if (!payload)
        goto rejected;
    struct trigger_req tr = {
        .ws = ws,
        .wf = wf,
        .vertex = vx,
        .payload = payload,
        .client_key = qk ? qk : hk,
        .key_in_header = !qk && hk,
        .test = test,
        .force_new = force == 1,
        .payload_is_body = a->o.max_depth <= JSON_DEFAULT_MAX_DEPTH, /* body_json's limits */
        .body = c->req->body,
        .body_len = c->req->body_len,
        .header = req_header,
        .header_ctx = c->req,
        .unauthenticated = c->unauthenticated,
    };
    struct deferred_trigger *dt = xcalloc(1, sizeof *dt);
    dt->a = a;
    dt->wait_s = wait_s;
    dt->deadline_ms = deadline_ms;
    struct ifl_err e = {0};
    dt->run = mode == 2;
    if (dt->run && store_events_head(engine_store(a->g), dt->cursor, &e)) {
        json_decref(payload);
        free(dt);
        api_problem_err(c->res, &e);
        goto rejected;
    }
    struct engine_trigger_op *op = NULL;
    int rc = engine_trigger_begin(a->g, &tr, &dt->out, &op, &e);
    json_decref(payload); /* before any call starts: engine.h */
    if (!rc && op && !(engine_can_defer(a->g) && http_can_defer(c->req))) {
        rc = engine_trigger_run(op, &dt->out, &e); /* the commit, on this thread */
        op = NULL;
    }
    dt->ws = xstrdup(ws);
    if (!rc && wait_s > 0) {
        if (op) { /* before the commit: no finish can slip past the waiter */
            dt->w = engine_waiter_add(a->g, ws, dt->out.id);
        } else if (strcmp(dt->out.status, "running") != 0) {
            /* a repeat of a finished execution: nothing to wait for */
        } else if (http_can_defer(c->req)) { /* a repeat of a running one */
            dt->w = watch(a, ws, &dt->out);
            if (strcmp(dt->out.status, "running") == 0 && hold(dt, c->req)) {
                c->deferred = 1;
                return;
            }
        } else {
            wait_here(a, ws, deadline_ms, &dt->out); /* the thread-per-connection front */
        }
    }
    if (!rc && op) { /* answered once its transaction committed */
        dt->op = op;
        dt->later = http_defer(c->req, dt->w ? wait_finish : trigger_finish,
                               dt); /* non-NULL: http_can_defer */
        c->deferred = 1;
        engine_trigger_commit(op, dt->w ? trigger_committed_waiting : trigger_committed, dt);
        return;
    }
    answer(dt, c->res, rc, &e, wait_s > 0 ? wait_s : 0);
    dt_free(dt);
    return;
rejected:
    atomic_fetch_add(&a->triggers_rejected, 1);
}

static void h_trigger(struct call *c)
{
    trigger(c, 0);
}

static void h_test_run(struct call *c)
{
    trigger(c, 1);
}

static void h_run(struct call *c)
{
    trigger(c, 2);
}

static json_t *execution_json(const struct store_execution *x, int full)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(x->id));
    json_object_set_new(o, "workspace", json_string(x->workspace));
    json_object_set_new(o, "workflow", json_string(x->workflow));
    json_object_set_new(o, "workflowVersion", json_integer(x->workflow_version));
    json_object_set_new(o, "entryPoint", json_string(x->entry_point));
    json_t *identity = NULL;
    json_parse(x->identity, strlen(x->identity), NULL, &identity, NULL);
    json_object_set_new(o, "identity", identity ? identity : json_null());
    json_object_set_new(o, "test", json_boolean(x->test));
    json_object_set_new(o, "status", json_string(x->status));
    json_object_set_new(o, "version", json_integer(x->version));
    json_object_set_new(o, "createdAt", json_time(x->created_at));
    json_object_set_new(o, "updatedAt", json_time(x->updated_at));
    if (full) {
        json_t *payload = NULL;
        json_parse(x->payload, strlen(x->payload), NULL, &payload, NULL);
        json_object_set_new(o, "payload", payload ? payload : json_null());
    }
    json_object_set_new(o, "startedOverFrom",
                        x->started_over_from ? json_string(x->started_over_from) : json_null());
    return o;
}

/* steps[] of the execution resource, each with its attempt history. */
static int steps_json(struct api *a, const char *id, json_t *exec, struct ifl_err *e)
{
    struct store_step *rows = NULL;
    struct store_attempt *at = NULL;
    size_t n = 0, na = 0;
    int rc = store_steps_get(engine_store(a->g), id, &rows, &n, e);
    if (!rc)
        rc = store_attempts_get(engine_store(a->g), id, &at, &na, e);
    if (rc) {
        store_steps_free(rows, n);
        return rc;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        const struct store_step *st = &rows[i];
        json_t *o = json_object();
        json_object_set_new(o, "vertex", json_string(st->vertex));
        json_object_set_new(o, "type", json_string(st->kind));
        json_object_set_new(o, "state", json_string(store_step_state_name(st->state)));
        json_object_set_new(o, "attempts", json_integer(st->attempts));
        json_object_set_new(o, "epoch", json_integer(st->epoch));
        json_object_set_new(o, "output", json_stored_value(st->output));
        json_object_set_new(o, "error", json_stored_value(st->error));
        json_object_set_new(o, "nextAttemptAt",
                            st->state == STEP_DISPATCHED ? json_time(st->next_run_at)
                                                         : json_null());
        if (st->state == STEP_EXECUTING) {
            json_object_set_new(o, "leaseOwner",
                                json_string(st->lease_owner ? st->lease_owner : ""));
            json_object_set_new(o, "leaseExpiresAt", json_time(st->lease_expires_at));
        }
        json_t *hist = json_array();
        for (size_t k = 0; k < na; k++) {
            if (strcmp(at[k].vertex, st->vertex) != 0)
                continue;
            json_t *h = json_object();
            json_object_set_new(h, "epoch", json_integer(at[k].epoch));
            json_object_set_new(h, "worker", json_string(at[k].worker));
            json_object_set_new(h, "startedAt", json_time(at[k].started_at));
            json_object_set_new(h, "finishedAt",
                                at[k].finished_at ? json_time(at[k].finished_at) : json_null());
            json_object_set_new(h, "outcome",
                                at[k].outcome ? json_string(at[k].outcome) : json_null());
            json_object_set_new(h, "error", json_stored_value(at[k].error));
            json_array_append_new(hist, h);
        }
        json_object_set_new(o, "history", hist);
        json_array_append_new(arr, o);
    }
    json_object_set_new(exec, "steps", arr);
    store_steps_free(rows, n);
    store_attempts_free(at, na);
    return 0;
}

static void h_execution_get(struct call *c)
{
    const char *ws = c->seg[2], *id = c->seg[4];
    if (workspace_exists(c, ws))
        return;
    struct store_execution x;
    struct ifl_err e = {0};
    if (store_execution_get(engine_store(c->a->g), ws, id, &x, &e)) {
        api_problem_err(c->res, &e);
        return;
    }
    if (engine_gone(&x, &e)) {
        store_execution_clear(&x);
        api_problem_err(c->res, &e);
        return;
    }
    json_t *o = execution_json(&x, 1);
    store_execution_clear(&x);
    if (steps_json(c->a, id, o, &e)) {
        json_decref(o);
        api_problem_err(c->res, &e);
        return;
    }
    reply_json(c->res, 200, o);
}

/* Reads an Idempotency-Key header: 0 and the key in out, 1 when absent, -1
 * when malformed, -2 when sent more than once (the values would combine
 * into a list, which is not one sf-string: the draft's 400). */
static int idempotency_key(const struct http_req *r, char *out, size_t cap)
{
    const char *h = r->header(r, "Idempotency-Key");
    if (!h)
        return 1;
    if (r->header_count && r->header_count(r, "Idempotency-Key") > 1)
        return -2;
    return http_sf_string(h, out, cap) ? -1 : 0;
}

/* The 400 for a malformed Idempotency-Key (k < 0) or a missing one where
 * the action requires it (k > 0). */
static void key_problem(struct call *c, int k, const char *required_why)
{
    if (k > 0)
        api_problem(c->res, 400, "idempotency-key-required", required_why, NULL);
    else if (k == -2)
        api_problem(c->res, 400, "invalid-idempotency-key",
                    "send one Idempotency-Key header, not several", NULL);
    else
        api_problem(c->res, 400, "invalid-idempotency-key",
                    "Idempotency-Key must be an RFC 8941 string or token of printable ASCII, at "
                    "most 255 characters",
                    NULL);
}

/* The optional Idempotency-Key of an operator action (spec §7) into k,
 * with the request's fingerprint: SHA-256 over the method, the path's
 * segments and the body (its JCS form when it is JSON, else its bytes).  key and fp
 * back k's strings.  0, or -1 after a 400. */
static int op_key(struct call *c, const json_t *body, char key[256], char fp[65],
                  struct engine_op_key *k)
{
    *k = (struct engine_op_key){0};
    int rc = idempotency_key(c->req, key, 256);
    if (rc > 0)
        return 0;
    if (rc < 0) {
        key_problem(c, rc, NULL);
        return -1;
    }
    struct buf b, j;
    buf_init(&b, 0); /* uncapped: the request's own bytes, already bounded */
    buf_init(&j, 0);
    /* the path as routed: "…/retry/" is the same action as "…/retry" (and
     * was never another fingerprint for a path without the slash) */
    buf_printf(&b, "%s\n", c->req->method);
    for (int i = 0; i < c->nseg; i++)
        buf_printf(&b, "/%s", c->seg[i]);
    buf_puts(&b, "\n");
    if (body && json_jcs(body, &j) == 0)
        buf_append(&b, j.p, j.len);
    else
        buf_append(&b, c->req->body, c->req->body_len);
    crypto_sha256_hex(b.p, b.len, fp);
    buf_free(&j);
    buf_free(&b);
    k->key = key;
    k->fingerprint = fp;
    return 0;
}

/* An operator action's answer: `status`, or the first answer replayed. */
static void reply_action(struct call *c, const struct engine_op_key *k, int status, json_t *answer)
{
    if (k->replayed)
        http_res_header(c->res, "Idempotent-Replayed", "true");
    reply_json(c->res, k->replayed ? k->status : status, answer);
}

/* An action that takes no body (start-over, redeliver; retry beyond its
 * sendAgain) refuses one that asks for something (malformed JSON, or any
 * member: a client passing steps or a new payload would otherwise get
 * another action than it asked for): empty or {} pass, and both come back
 * as a new {} (so that an Idempotency-Key's fingerprint is the same for
 * either).  NULL after a 400/415/422.  no_members: the same over a body
 * already read (taken), `why` the problem's detail. */
static json_t *no_members(struct call *c, const char *why, json_t *body)
{
    const char *bad = NULL;
    if (!json_is_object(body))
        bad = "";
    else if (json_object_size(body))
        bad = json_object_iter_key(json_object_iter(body));
    if (bad) {
        member_problem(c->res, 422, "validation-error", why, *bad ? bad : NULL);
        json_decref(body);
        return NULL;
    }
    return body;
}

static json_t *no_body(struct call *c, const char *action)
{
    char why[96];
    snprintf(why, sizeof why, "%s takes no body (send none, or {})", action);
    json_t *body = body_or_empty(c);
    return body ? no_members(c, why, body) : NULL;
}

/* POST …/executions/{id}/retry, body empty, {} or {"sendAgain": true|false}
 * (false, as none, is read as {}: the same key's fingerprint either way). */
static void h_retry(struct call *c)
{
    const char *ws = c->seg[2], *id = c->seg[4];
    if (workspace_exists(c, ws))
        return;
    json_t *body = body_or_empty(c);
    if (!body)
        return;
    json_t *again = json_is_object(body) ? json_object_get(body, "sendAgain") : NULL;
    if (again && !json_is_boolean(again)) {
        member_problem(c->res, 422, "validation-error", "sendAgain must be true or false",
                       "sendAgain");
        json_decref(body);
        return;
    }
    int send_again = json_is_true(again);
    if (again)
        json_object_del(body, "sendAgain");
    if (!(body = no_members(c,
                            "retry takes no member but sendAgain (send none, {}, or "
                            "{\"sendAgain\": true})",
                            body)))
        return;
    if (send_again) /* the key's fingerprint tells it from a plain retry */
        json_object_set_new(body, "sendAgain", json_true());
    char key[256], fp[65];
    struct engine_op_key k;
    int rc = op_key(c, body, key, fp, &k);
    json_decref(body);
    if (rc)
        return;
    json_t *answer = NULL;
    struct ifl_err e = {0};
    if (engine_retry(c->a->g, ws, id, send_again, &k, &answer, &e)) {
        api_problem_err(c->res, &e);
        return;
    }
    reply_action(c, &k, 200, answer);
}

/* POST …/executions/{id}/cancel, body empty, {} or {"reason": "…"}. */
static void h_cancel(struct call *c)
{
    const char *ws = c->seg[2], *id = c->seg[4];
    if (workspace_exists(c, ws))
        return;
    json_t *body = body_or_empty(c);
    if (!body)
        return;
    const char *bad = NULL, *why = NULL;
    const char *name;
    json_t *v;
    if (!json_is_object(body)) {
        bad = "";
        why = "expected an object: {} or {\"reason\": \"…\"}";
    } else {
        json_object_foreach(body, name, v)
        {
            if (strcmp(name, "reason") != 0) {
                bad = name;
                why = "unknown member; a cancel takes only \"reason\"";
                break;
            }
            if (!json_text(v) || json_string_length(v) == 0 || json_string_length(v) > 512) {
                bad = name;
                why = "reason must be a string of 1 to 512 bytes without NUL";
                break;
            }
        }
    }
    if (bad) {
        member_problem(c->res, 422, "validation-error", why, *bad ? bad : NULL);
        json_decref(body);
        return;
    }
    char key[256], fp[65];
    struct engine_op_key k;
    if (op_key(c, body, key, fp, &k)) {
        json_decref(body);
        return;
    }
    json_t *answer = NULL;
    struct ifl_err e = {0};
    int rc = engine_cancel(c->a->g, ws, id, json_string_value(json_object_get(body, "reason")), &k,
                           &answer, &e);
    json_decref(body);
    if (rc) {
        api_problem_err(c->res, &e);
        if (strcmp(e.slug, "step-executing") == 0) /* its call ends within its timeoutMs */
            http_res_header(c->res, "Retry-After", "1");
        return;
    }
    reply_action(c, &k, 200, answer);
}

static void h_resolve(struct call *c)
{
    const char *ws = c->seg[2], *id = c->seg[4], *vx = c->seg[6];
    if (workspace_exists(c, ws))
        return;
    json_t *body = body_json(c, NULL);
    if (!body)
        return;
    const char *outcome = json_string_value(json_object_get(body, "outcome"));
    int completed = outcome && strcmp(outcome, "completed") == 0;
    if (!json_is_object(body) || !outcome || (!completed && strcmp(outcome, "failed") != 0)) {
        json_decref(body);
        api_problem(c->res, 422, "validation-error",
                    "expected {\"outcome\": \"completed\", \"output\": …} or "
                    "{\"outcome\": \"failed\"}",
                    "/outcome");
        return;
    }
    /* Any other member — a misspelled "output" — would complete the step
     * with a null output, which cannot be taken back. */
    const char *name;
    json_t *v;
    json_object_foreach(body, name, v)
    {
        if (strcmp(name, "outcome") == 0 || (completed && strcmp(name, "output") == 0))
            continue;
        member_problem(c->res, 422, "validation-error",
                       completed ? "a completed resolution takes only \"outcome\" and \"output\""
                                 : "a failed resolution takes only \"outcome\"",
                       name);
        json_decref(body);
        return;
    }
    /* … and so would a forgotten one: null is an output only when sent. */
    if (completed && !json_object_get(body, "output")) {
        json_decref(body);
        member_problem(c->res, 422, "validation-error",
                       "a completed resolution needs \"output\": what the step's successors "
                       "read as its result (send null to mean none)",
                       "output");
        return;
    }
    char key[256], fp[65];
    struct engine_op_key k;
    if (op_key(c, body, key, fp, &k)) {
        json_decref(body);
        return;
    }
    json_t *answer = NULL;
    struct ifl_err e = {0};
    int rc = engine_resolve(c->a->g, ws, id, vx, completed, json_object_get(body, "output"), &k,
                            &answer, &e);
    json_decref(body);
    if (rc) {
        api_problem_err(c->res, &e);
        return;
    }
    reply_action(c, &k, 200, answer);
}

static void h_start_over(struct call *c)
{
    const char *ws = c->seg[2], *id = c->seg[4];
    json_t *body = NULL;
    if (workspace_exists(c, ws) || !(body = no_body(c, "start-over")))
        return;
    json_decref(body); /* the key alone names a start-over (no fingerprint) */
    char key[256];
    int k = idempotency_key(c->req, key, sizeof key);
    if (k != 0) {
        key_problem(c, k,
                    "start-over requires an Idempotency-Key header, since a retried start-over "
                    "would otherwise start twice");
        return;
    }
    char new_id[65];
    int replayed = 0;
    struct ifl_err e = {0};
    if (engine_start_over(c->a->g, ws, id, key, new_id, &replayed, &e)) {
        api_problem_err(c->res, &e);
        return;
    }
    char loc[256];
    snprintf(loc, sizeof loc, "/v1/workspaces/%s/executions/%s", ws, new_id);
    http_res_header(c->res, "Location", loc);
    if (replayed)
        http_res_header(c->res, "Idempotent-Replayed", "true");
    json_t *o = json_object();
    json_object_set_new(o, "executionId", json_string(new_id));
    json_object_set_new(o, "startedOverFrom", json_string(id));
    reply_json(c->res, 201, o);
}

/* ?limit= (1 … 1000, else dflt) into *limit; 0, or -1 after a 400. */
static int query_limit(struct call *c, int dflt, int *limit)
{
    const char *lq = c->req->query(c->req, "limit");
    *limit = dflt;
    if (!lq)
        return 0;
    char *end = NULL;
    long v = strtol(lq, &end, 10);
    /* digits only: strtol would take " 5" and "+5" */
    if (!isdigit((unsigned char)lq[0]) || *end || v < 1 || v > 1000) {
        api_problem(c->res, 400, "invalid-parameter", "limit must be between 1 and 1000", "/limit");
        return -1;
    }
    *limit = (int)v;
    return 0;
}

/* A list read's failure: a malformed ?after= cursor is 400
 * invalid-parameter naming it (IFL_EINVAL from the read), anything else as
 * its code says. */
static void list_problem(struct call *c, int rc, const struct ifl_err *e)
{
    if (rc != IFL_EINVAL)
        api_problem_err(c->res, e);
    else if (e->pointer[0] && strcmp(e->pointer, "/after") != 0)
        api_problem(c->res, 400, "invalid-parameter", e->msg, e->pointer);
    else
        api_problem(c->res, 400, "invalid-parameter",
                    "after must be the `next` of a previous page of this list", "/after");
}

static void h_dead_letters(struct call *c)
{
    const char *ws = c->seg[2];
    if (workspace_exists(c, ws))
        return;
    int limit;
    if (query_limit(c, 100, &limit))
        return;
    json_t *o = NULL;
    struct ifl_err e = {0};
    int rc = engine_dead_letters(c->a->g, ws, c->req->query(c->req, "after"), limit, &o, &e);
    if (rc) {
        list_problem(c, rc, &e);
        return;
    }
    reply_json(c->res, 200, o);
}

static void h_events(struct call *c)
{
    const char *ws = c->seg[2];
    if (workspace_exists(c, ws))
        return;
    int limit;
    if (query_limit(c, 100, &limit))
        return;
    const char *aq = c->req->query(c->req, "after");
    struct store_event *ev = NULL;
    size_t n = 0;
    struct ifl_err e = {0};
    int rc = store_events_list(engine_store(c->a->g), ws, aq, limit, &ev, &n, &e);
    if (rc) {
        list_problem(c, rc, &e);
        return;
    }
    json_t *items = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(items, api_event_json(&ev[i]));
    json_t *o = json_object();
    json_object_set_new(o, "items", items);
    if (n > 0) {
        json_object_set_new(o, "next", json_string(ev[n - 1].cursor));
    } else {
        json_object_set_new(o, "next", aq ? json_string(aq) : json_null());
    }
    store_events_free(ev, n);
    reply_json(c->res, 200, o);
}

static void h_execution_list(struct call *c)
{
    const char *ws = c->seg[2];
    if (workspace_exists(c, ws))
        return;
    int limit;
    if (query_limit(c, 50, &limit))
        return;
    struct store_execution *items = NULL;
    size_t n = 0;
    char *next = NULL;
    struct ifl_err e = {0};
    struct store_exec_filter f = {c->req->query(c->req, "status"),
                                  c->req->query(c->req, "workflow")};
    if (f.status && !store_execution_status_valid(f.status)) {
        api_problem(c->res, 400, "invalid-parameter",
                    "status must be running, completed, failed, requires_reconciliation, stale or "
                    "cancelled",
                    "/status");
        return;
    }
    if (f.workflow && !wf_name_valid(f.workflow)) {
        api_problem(c->res, 400, "invalid-parameter",
                    "workflow names are 1-128 characters of A-Z a-z 0-9 _ - .", "/workflow");
        return;
    }
    int rc =
        store_execution_list_where(engine_store(c->a->g), ws, &f, c->req->query(c->req, "after"),
                                   limit, &items, &n, &next, &e);
    if (rc) {
        list_problem(c, rc, &e);
        return;
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, execution_json(&items[i], 0));
    store_execution_list_free(items, n);
    json_t *out = json_object();
    json_object_set_new(out, "items", arr);
    json_object_set_new(out, "next", next ? json_string(next) : json_null());
    free(next);
    reply_json(c->res, 200, out);
}

static void h_healthz(struct call *c)
{
    http_res_body(c->res, 200, "application/json", xstrdup("{\"status\":\"ok\"}"));
}

static void h_readyz(struct call *c)
{
    struct ifl_err e = {0};
    if (store_ping(engine_store(c->a->g), &e)) {
        api_problem(c->res, 503, "not-ready", e.msg, NULL);
        return;
    }
    http_res_body(c->res, 200, "application/json", xstrdup("{\"status\":\"ready\"}"));
}

static void h_metrics(struct call *c)
{
    struct api *a = c->a;
    const struct engine_metrics *m = engine_metrics(a->g);
    struct buf b;
    buf_init(&b, 0);
    buf_printf(
        &b,
        "# HELP idemflow_http_requests_total HTTP requests received.\n"
        "# TYPE idemflow_http_requests_total counter\n"
        "idemflow_http_requests_total %llu\n"
        "# HELP idemflow_http_responses_total HTTP error responses by class.\n"
        "# TYPE idemflow_http_responses_total counter\n"
        "idemflow_http_responses_total{class=\"4xx\"} %llu\n"
        "idemflow_http_responses_total{class=\"5xx\"} %llu\n"
        "# HELP idemflow_triggers_total Triggers by outcome.\n"
        "# TYPE idemflow_triggers_total counter\n"
        "idemflow_triggers_total{outcome=\"created\"} %llu\n"
        "idemflow_triggers_total{outcome=\"deduplicated\"} %llu\n"
        "idemflow_triggers_total{outcome=\"rejected\"} %llu\n"
        "idemflow_triggers_total{outcome=\"stale\"} %llu\n"
        "# HELP idemflow_schedule_ticks_total Schedule ticks: fired by this process, found "
        "fired already (another process, or before a restart), skipped as missed.\n"
        "# TYPE idemflow_schedule_ticks_total counter\n"
        "idemflow_schedule_ticks_total{outcome=\"fired\"} %llu\n"
        "idemflow_schedule_ticks_total{outcome=\"taken\"} %llu\n"
        "idemflow_schedule_ticks_total{outcome=\"superseded\"} %llu\n"
        "idemflow_schedule_ticks_total{outcome=\"missed\"} %llu\n"
        "# HELP idemflow_schedule_scans_total Listings of the workflows' schedules.\n"
        "# TYPE idemflow_schedule_scans_total counter\n"
        "idemflow_schedule_scans_total %llu\n"
        "# HELP idemflow_schedules Scheduled entry points found by the last listing.\n"
        "# TYPE idemflow_schedules gauge\n"
        "idemflow_schedules %llu\n"
        "# HELP idemflow_ordering_gaps_total Events admitted past missing versions of their "
        "ordering key.\n"
        "# TYPE idemflow_ordering_gaps_total counter\n"
        "idemflow_ordering_gaps_total %llu\n"
        "# HELP idemflow_steps_total Step outcomes.\n"
        "# TYPE idemflow_steps_total counter\n"
        "idemflow_steps_total{event=\"claimed\"} %llu\n"
        "idemflow_steps_total{event=\"claimed_at_trigger\"} %llu\n"
        "idemflow_steps_total{event=\"completed\"} %llu\n"
        "idemflow_steps_total{event=\"failed\"} %llu\n"
        "idemflow_steps_total{event=\"recovered\"} %llu\n"
        "idemflow_steps_total{event=\"inlined\"} %llu\n"
        "# HELP idemflow_claim_queries_total Claims the workers asked the store for, by whether "
        "they took steps.\n"
        "# TYPE idemflow_claim_queries_total counter\n"
        "idemflow_claim_queries_total{result=\"claimed\"} %llu\n"
        "idemflow_claim_queries_total{result=\"empty\"} %llu\n"
        "# HELP idemflow_fenced_writes_total Late outcomes from workers whose lease was taken over "
        "(changed nothing).\n"
        "# TYPE idemflow_fenced_writes_total counter\n"
        "idemflow_fenced_writes_total %llu\n"
        "# HELP idemflow_executions_finished_total Executions that reached a terminal status.\n"
        "# TYPE idemflow_executions_finished_total counter\n"
        "idemflow_executions_finished_total{status=\"completed\"} %llu\n"
        "idemflow_executions_finished_total{status=\"failed\"} %llu\n"
        "idemflow_executions_finished_total{status=\"requires_reconciliation\"} %llu\n"
        "idemflow_executions_finished_total{status=\"cancelled\"} %llu\n"
        "# HELP idemflow_uptime_seconds Seconds since start.\n"
        "# TYPE idemflow_uptime_seconds gauge\n"
        "idemflow_uptime_seconds %lld\n"
        "# HELP idemflow_webhook_deliveries_total Outgoing webhook attempts by outcome (fenced: "
        "the delivery's lease had been taken over; nothing written).\n"
        "# TYPE idemflow_webhook_deliveries_total counter\n"
        "idemflow_webhook_deliveries_total{outcome=\"delivered\"} %llu\n"
        "idemflow_webhook_deliveries_total{outcome=\"retry\"} %llu\n"
        "idemflow_webhook_deliveries_total{outcome=\"dead\"} %llu\n"
        "idemflow_webhook_deliveries_total{outcome=\"fenced\"} %llu\n"
        "# HELP idemflow_retention_total Retention: executions purged, tombstones deleted after "
        "their dedup window, events deleted.\n"
        "# TYPE idemflow_retention_total counter\n"
        "idemflow_retention_total{what=\"purged_executions\"} %llu\n"
        "idemflow_retention_total{what=\"expired_tombstones\"} %llu\n"
        "idemflow_retention_total{what=\"expired_events\"} %llu\n"
        "# HELP idemflow_retention_sweeps_total Retention sweeps run (one a minute of engine "
        "time).\n"
        "# TYPE idemflow_retention_sweeps_total counter\n"
        "idemflow_retention_sweeps_total %llu\n",
        (unsigned long long)atomic_load(&a->requests),
        (unsigned long long)atomic_load(&a->responses_4xx),
        (unsigned long long)atomic_load(&a->responses_5xx),
        (unsigned long long)atomic_load(&a->triggers_created),
        (unsigned long long)atomic_load(&a->triggers_deduplicated),
        (unsigned long long)atomic_load(&a->triggers_rejected),
        (unsigned long long)atomic_load(&m->ordering_stale),
        (unsigned long long)atomic_load(&m->schedule_fired),
        (unsigned long long)atomic_load(&m->schedule_taken),
        (unsigned long long)atomic_load(&m->schedule_superseded),
        (unsigned long long)atomic_load(&m->schedule_missed),
        (unsigned long long)atomic_load(&m->schedule_scans),
        (unsigned long long)atomic_load(&m->schedule_entries),
        (unsigned long long)atomic_load(&m->ordering_gaps),
        (unsigned long long)atomic_load(&m->steps_claimed),
        (unsigned long long)atomic_load(&m->steps_claimed_early),
        (unsigned long long)atomic_load(&m->steps_completed),
        (unsigned long long)atomic_load(&m->steps_failed),
        (unsigned long long)atomic_load(&m->steps_recovered),
        (unsigned long long)atomic_load(&m->steps_inlined),
        (unsigned long long)atomic_load(&m->claims_found),
        (unsigned long long)atomic_load(&m->claims_empty),
        (unsigned long long)atomic_load(&m->fenced_writes),
        (unsigned long long)atomic_load(&m->executions_completed),
        (unsigned long long)atomic_load(&m->executions_failed),
        (unsigned long long)atomic_load(&m->executions_reconcile),
        (unsigned long long)atomic_load(&m->executions_cancelled),
        (long long)((clock_mono_ms() - a->started_ms) / 1000),
        (unsigned long long)atomic_load(&m->hooks_delivered),
        (unsigned long long)atomic_load(&m->hooks_retried),
        (unsigned long long)atomic_load(&m->hooks_dead),
        (unsigned long long)atomic_load(&m->hooks_fenced),
        (unsigned long long)atomic_load(&m->purged_executions),
        (unsigned long long)atomic_load(&m->expired_tombstones),
        (unsigned long long)atomic_load(&m->expired_events),
        (unsigned long long)atomic_load(&m->retention_sweeps));
    buf_printf(&b, "# HELP idemflow_gateway_responses_total GATEWAY responses by request (the "
                   "call, or its verify request) and outcome class (docs/gateway.md).\n"
                   "# TYPE idemflow_gateway_responses_total counter\n");
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < ENGINE_GW_NCLASSES; k++)
            buf_printf(&b, "idemflow_gateway_responses_total{request=\"%s\",class=\"%s\"} %llu\n",
                       r ? "verify" : "call", engine_gw_classes[k],
                       (unsigned long long)atomic_load(&m->gw_responses[r][k]));
    buf_printf(&b,
               "# HELP idemflow_gateway_calls_in_flight GATEWAY requests on the wire.\n"
               "# TYPE idemflow_gateway_calls_in_flight gauge\n"
               "idemflow_gateway_calls_in_flight %d\n"
               "# HELP idemflow_gateway_calls_deferred_total GATEWAY calls put off (DISPATCHED "
               "again, nothing sent, no attempt spent): their destination had its share of the "
               "calls in flight (serve --max-calls-per-destination).\n"
               "# TYPE idemflow_gateway_calls_deferred_total counter\n"
               "idemflow_gateway_calls_deferred_total %llu\n"
               "# HELP idemflow_gateway_response_seconds How long GATEWAY requests took, "
               "from the send to the answer (or the failure).\n"
               "# TYPE idemflow_gateway_response_seconds histogram\n",
               engine_gw_inflight(a->g), (unsigned long long)atomic_load(&m->gw_deferred));
    unsigned long long cum = 0;
    for (int k = 0; k < ENGINE_GW_NBUCKETS; k++) {
        cum += atomic_load(&m->gw_duration_bucket[k]);
        if (k < ENGINE_GW_NBUCKETS - 1)
            buf_printf(&b, "idemflow_gateway_response_seconds_bucket{le=\"%g\"} %llu\n",
                       engine_gw_buckets_ms[k] / 1000.0, cum);
        else
            buf_printf(&b, "idemflow_gateway_response_seconds_bucket{le=\"+Inf\"} %llu\n", cum);
    }
    buf_printf(&b,
               "idemflow_gateway_response_seconds_sum %.3f\n"
               "idemflow_gateway_response_seconds_count %llu\n",
               (double)atomic_load(&m->gw_duration_sum_ms) / 1000.0,
               cum); /* the +Inf bucket's count, as the format wants */
    buf_printf(&b,
               "# HELP idemflow_workflow_versions_compiled Workflow versions kept compiled in "
               "memory.\n"
               "# TYPE idemflow_workflow_versions_compiled gauge\n"
               "idemflow_workflow_versions_compiled %llu\n"
               "# HELP idemflow_workflow_versions_compiled_bytes Their definitions' text, against "
               "serve --workflow-cache-kb.\n"
               "# TYPE idemflow_workflow_versions_compiled_bytes gauge\n"
               "idemflow_workflow_versions_compiled_bytes %llu\n"
               "# HELP idemflow_workflow_versions_evicted_total Compiled versions dropped past the "
               "budget (not their workflow's latest; compiled again when next used).\n"
               "# TYPE idemflow_workflow_versions_evicted_total counter\n"
               "idemflow_workflow_versions_evicted_total %llu\n",
               (unsigned long long)atomic_load(&m->wf_compiled),
               (unsigned long long)atomic_load(&m->wf_compiled_bytes),
               (unsigned long long)atomic_load(&m->wf_evicted));
    const struct http_server *srv = atomic_load(&a->srv);
    if (srv)
        buf_printf(&b,
                   "# HELP idemflow_http_connections HTTP connections the server holds (this "
                   "one included), against serve --max-connections and "
                   "--max-connections-per-ip.\n"
                   "# TYPE idemflow_http_connections gauge\n"
                   "idemflow_http_connections %u\n",
                   http_server_connections(srv));
    http_res_body(c->res, 200, "text/plain; version=0.0.4", buf_steal(&b));
}

/* POST /v1/test/clock {"advanceMs": N}: moves the engine's wall clock
 * forward (serve --test-clock only; 404 otherwise) and wakes the workers, so
 * tests see Retry-After waits, backoff and deadlines pass without sleeping.
 * Leases run on the same clock: advance only while no step is executing. */
static void h_test_clock(struct call *c)
{
    if (!c->a->o.test_clock) {
        api_problem(c->res, 404, "not-found", "no such resource", NULL);
        return;
    }
    /* Not a change to data a repeat could replay (there is no workspace to
     * keep a key in): a key is refused rather than ignored. */
    if (c->req->header(c->req, "Idempotency-Key")) {
        api_problem(c->res, 400, "idempotency-key-not-supported",
                    "POST /v1/test/clock moves the clock on every call; send it without an "
                    "Idempotency-Key",
                    NULL);
        return;
    }
    json_t *body = body_json(c, NULL);
    if (!body)
        return;
    const char *bad = NULL;
    if (!json_is_object(body))
        bad = "";
    else
        for (void *it = json_object_iter(body); it && !bad; it = json_object_iter_next(body, it))
            if (strcmp(json_object_iter_key(it), "advanceMs") != 0)
                bad = json_object_iter_key(it);
    if (bad) {
        member_problem(c->res, 422, "validation-error", "expected {\"advanceMs\": N}",
                       *bad ? bad : NULL);
        json_decref(body);
        return;
    }
    json_t *v = json_object_get(body, "advanceMs");
    double d = json_is_number(v) ? json_number_value(v) : -1;
    int64_t ms = d >= 1 && d <= 366.0 * 86400 * 1000 && d == (double)(int64_t)d ? (int64_t)d : -1;
    json_decref(body);
    if (ms < 1 || ms > 366LL * 86400 * 1000) {
        api_problem(c->res, 422, "validation-error",
                    "advanceMs must be an integer from 1 to 31622400000 (366 days)", "/advanceMs");
        return;
    }
    int64_t off = clock_advance(ms);
    engine_clock_advanced(c->a->g);
    json_t *o = json_object();
    json_object_set_new(o, "offsetMs", json_integer(off));
    json_object_set_new(o, "now", json_time(clock_now_ms()));
    reply_json(c->res, 200, o);
}

/* ---- subscriptions (outgoing webhooks, spec §7) ---------------------------------------- */

/* The answer of a read or delete: the problem of a failed rc, else out
 * with status (NULL out: an empty 204). */
static void answer_of(struct call *c, int rc, const struct ifl_err *e, int status, json_t *out)
{
    if (rc)
        api_problem_err(c->res, e);
    else if (out)
        reply_json(c->res, status, out);
    else
        http_res_body(c->res, 204, NULL, NULL);
}

static void h_sub_put(struct call *c)
{
    const char *ws = c->seg[2], *name = c->seg[4];
    if (workspace_exists(c, ws) || check_name(c, "subscription", name))
        return;
    json_t *body = body_json_of(c, NULL, 1);
    if (!body)
        return;
    json_t *view = NULL;
    int created = 0;
    struct ifl_err e = {0};
    int rc = engine_subscription_put(c->a->g, ws, name, body, &created, &view, &e);
    json_decref(body);
    if (rc) {
        api_problem_err(c->res, &e);
        return;
    }
    char loc[512];
    snprintf(loc, sizeof loc, "/v1/workspaces/%s/subscriptions/%s", ws, name);
    http_res_header(c->res, "Location", loc);
    reply_json(c->res, created ? 201 : 200, view);
}

static void h_sub_get(struct call *c)
{
    const char *ws = c->seg[2], *name = c->seg[4];
    if (workspace_exists(c, ws) || check_name(c, "subscription", name))
        return;
    json_t *view = NULL;
    struct ifl_err e = {0};
    int rc = engine_subscription_get(c->a->g, ws, name, &view, &e);
    answer_of(c, rc, &e, 200, view);
}

static void h_sub_list(struct call *c)
{
    const char *ws = c->seg[2];
    if (workspace_exists(c, ws))
        return;
    json_t *out = NULL;
    struct ifl_err e = {0};
    int rc = engine_subscription_list(c->a->g, ws, &out, &e);
    answer_of(c, rc, &e, 200, out);
}

static void h_sub_delete(struct call *c)
{
    const char *ws = c->seg[2], *name = c->seg[4];
    if (workspace_exists(c, ws) || check_name(c, "subscription", name))
        return;
    struct ifl_err e = {0};
    answer_of(c, engine_subscription_delete(c->a->g, ws, name, &e), &e, 204, NULL);
}

static void h_deliveries(struct call *c)
{
    const char *ws = c->seg[2], *name = c->seg[4];
    if (workspace_exists(c, ws) || check_name(c, "subscription", name))
        return;
    int limit;
    if (query_limit(c, 50, &limit))
        return;
    const char *state = c->req->query(c->req, "state");
    if (state && strcmp(state, "pending") && strcmp(state, "sending") &&
        strcmp(state, "delivered") && strcmp(state, "dead")) {
        api_problem(c->res, 400, "invalid-parameter",
                    "state must be pending, sending, delivered or dead", "/state");
        return;
    }
    const char *aq = c->req->query(c->req, "after");
    long long after = 0;
    if (aq) {
        char *end = NULL;
        errno = 0;
        after = strtoll(aq, &end, 10);
        if (!isdigit((unsigned char)aq[0]) || *end || errno == ERANGE) {
            api_problem(c->res, 400, "invalid-parameter",
                        "after must be the `next` of a previous page of this list", "/after");
            return;
        }
    }
    json_t *out = NULL;
    struct ifl_err e = {0};
    int rc = engine_deliveries_list(c->a->g, ws, name, state, after, limit, &out, &e);
    answer_of(c, rc, &e, 200, out);
}

static void h_redeliver(struct call *c)
{
    const char *ws = c->seg[2], *name = c->seg[4], *event_id = c->seg[6];
    json_t *body = NULL;
    if (workspace_exists(c, ws) || check_name(c, "subscription", name) ||
        !(body = no_body(c, "redeliver")))
        return;
    char key[256], fp[65];
    struct engine_op_key k;
    int rc = op_key(c, body, key, fp, &k);
    json_decref(body);
    if (rc)
        return;
    json_t *answer = NULL;
    struct ifl_err e = {0};
    if (engine_redeliver(c->a->g, ws, name, event_id, &k, &answer, &e)) {
        api_problem_err(c->res, &e);
        return;
    }
    reply_action(c, &k, 202, answer);
}

/* ---- workspace tokens (spec §10) ------------------------------------------------------- */

static void h_token_create(struct call *c)
{
    const char *ws = c->seg[2];
    if (workspace_exists(c, ws))
        return;
    json_t *body = body_or_empty(c); /* none and {} are the same request */
    if (!body)
        return;
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "name") != 0) {
            member_problem(c->res, 422, "validation-error", "the only member is name", k);
            json_decref(body);
            return;
        }
    }
    json_t *name = json_object_get(body, "name");
    int not_object = !json_is_object(body);
    if (not_object || (name && !json_text(name))) {
        json_decref(body);
        api_problem(c->res, 422, "validation-error",
                    "expected {\"name\": \"…\"}, a name of printable characters",
                    not_object ? "" : "/name");
        return;
    }
    char key[256], fp[65];
    struct engine_op_key ok;
    if (op_key(c, body, key, fp, &ok)) {
        json_decref(body);
        return;
    }
    json_t *answer = NULL;
    struct ifl_err e = {0};
    int rc = engine_token_create(c->a->g, ws, json_string_value(name), &ok, &answer, &e);
    json_decref(body);
    if (rc) {
        api_problem_err(c->res, &e);
        return;
    }
    http_res_header(c->res, "Cache-Control", "no-store");
    reply_action(c, &ok, 201, answer);
}

static void h_token_list(struct call *c)
{
    const char *ws = c->seg[2];
    if (workspace_exists(c, ws))
        return;
    json_t *out = NULL;
    struct ifl_err e = {0};
    int rc = engine_token_list(c->a->g, ws, &out, &e);
    answer_of(c, rc, &e, 200, out);
}

static void h_token_delete(struct call *c)
{
    const char *ws = c->seg[2];
    if (workspace_exists(c, ws))
        return;
    struct ifl_err e = {0};
    answer_of(c, engine_token_delete(c->a->g, ws, c->seg[4], &e), &e, 204, NULL);
}

/* ---- routing ------------------------------------------------------------------------ */

struct route {
    const char *method;
    const char *pattern[MAX_SEGS]; /* "*" matches one segment */
    int nseg;
    void (*fn)(struct call *c);
    /* The query parameters it takes, NULL-terminated (NULL: none); any
     * other is 400 before the handler runs: a misspelled filter or cursor
     * would otherwise be ignored and answer something else than was asked
     * (a trigger's, keyed on another identity than the caller chose). */
    const char *const *params;
    int any_query; /* the probes: parameters ignored (scrapers add their own) */
};

static const char *const q_trigger[] = {"clientIdempotencyId", "forceNewExecution", NULL};
static const char *const q_version[] = {"version", NULL};
static const char *const q_page[] = {"after", "limit", NULL};
static const char *const q_executions[] = {"after", "limit", "status", "workflow", NULL};
static const char *const q_deliveries[] = {"after", "limit", "state", NULL};

static const struct route routes[] = {
    {"GET", {"healthz"}, 1, h_healthz, NULL, 1},
    {"GET", {"readyz"}, 1, h_readyz, NULL, 1},
    {"GET", {"metrics"}, 1, h_metrics, NULL, 1},
    {"PUT", {"v1", "workspaces", "*"}, 3, h_workspace_put, NULL, 0},
    {"GET", {"v1", "workspaces", "*"}, 3, h_workspace_get, NULL, 0},
    {"PUT", {"v1", "workspaces", "*", "workflows", "*"}, 5, h_workflow_put, NULL, 0},
    {"GET", {"v1", "workspaces", "*", "workflows", "*"}, 5, h_workflow_get, q_version, 0},
    {"PUT", {"v1", "workspaces", "*", "secrets", "*"}, 5, h_secret_put, NULL, 0},
    {"GET", {"v1", "workspaces", "*", "secrets"}, 4, h_secret_list, NULL, 0},
    {"POST",
     {"v1", "workspaces", "*", "workflows", "*", "entry-points", "*", "trigger"},
     8,
     h_trigger,
     q_trigger,
     0},
    {"POST",
     {"v1", "workspaces", "*", "workflows", "*", "entry-points", "*", "test-runs"},
     8,
     h_test_run,
     q_trigger,
     0},
    {"POST",
     {"v1", "workspaces", "*", "workflows", "*", "entry-points", "*", "run"},
     8,
     h_run,
     q_trigger,
     0},
    {"GET", {"v1", "workspaces", "*", "executions", "*"}, 5, h_execution_get, NULL, 0},
    {"GET", {"v1", "workspaces", "*", "executions"}, 4, h_execution_list, q_executions, 0},
    {"POST", {"v1", "workspaces", "*", "executions", "*", "retry"}, 6, h_retry, NULL, 0},
    {"POST", {"v1", "workspaces", "*", "executions", "*", "cancel"}, 6, h_cancel, NULL, 0},
    {"POST", {"v1", "workspaces", "*", "executions", "*", "start-over"}, 6, h_start_over, NULL, 0},
    {"POST",
     {"v1", "workspaces", "*", "executions", "*", "steps", "*", "resolve"},
     8,
     h_resolve,
     NULL,
     0},
    {"GET", {"v1", "workspaces", "*", "dead-letters"}, 4, h_dead_letters, q_page, 0},
    {"GET", {"v1", "workspaces", "*", "events"}, 4, h_events, q_page, 0},
    {"PUT", {"v1", "workspaces", "*", "subscriptions", "*"}, 5, h_sub_put, NULL, 0},
    {"GET", {"v1", "workspaces", "*", "subscriptions", "*"}, 5, h_sub_get, NULL, 0},
    {"DELETE", {"v1", "workspaces", "*", "subscriptions", "*"}, 5, h_sub_delete, NULL, 0},
    {"GET", {"v1", "workspaces", "*", "subscriptions"}, 4, h_sub_list, NULL, 0},
    {"GET",
     {"v1", "workspaces", "*", "subscriptions", "*", "deliveries"},
     6,
     h_deliveries,
     q_deliveries,
     0},
    {"POST",
     {"v1", "workspaces", "*", "subscriptions", "*", "deliveries", "*", "redeliver"},
     8,
     h_redeliver,
     NULL,
     0},
    {"POST", {"v1", "workspaces", "*", "tokens"}, 4, h_token_create, NULL, 0},
    {"GET", {"v1", "workspaces", "*", "tokens"}, 4, h_token_list, NULL, 0},
    {"DELETE", {"v1", "workspaces", "*", "tokens", "*"}, 5, h_token_delete, NULL, 0},
    {"POST", {"v1", "test", "clock"}, 3, h_test_clock, NULL, 0},
};

static int split(struct call *c, const char *path)
{
    const char *p = path;
    while (*p == '/')
        p++;
    while (*p) {
        if (c->nseg == MAX_SEGS)
            return -1;
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 0)
            return -1; /* "//" */
        c->seg[c->nseg++] = xstrndup(p, len);
        p += len;
        if (*p == '/')
            p++;
    }
    return 0;
}

/* 1 when every query parameter is one of params (NULL: none is);
 * else answers 400 with the first other one and returns 0. */
static int query_known(struct call *c, const char *const *params)
{
    static const char *const none[] = {NULL};
    const char *const *known = params ? params : none;
    const char *other = c->req->query_other ? c->req->query_other(c->req, known) : NULL;
    if (!other)
        return 1;
    struct buf why;
    buf_init(&why, 0);
    int twice = 0;
    for (size_t i = 0; known[i] && !twice; i++)
        twice = strcmp(known[i], other) == 0;
    const char *v = twice ? c->req->query(c->req, other) : NULL;
    if (twice && (!v || !*v)) {
        buf_printf(&why, "query parameter '%s' has no value: give one, or leave it out", other);
        member_problem(c->res, 400, "invalid-parameter", why.p, other);
        buf_free(&why);
        return 0;
    }
    if (twice) {
        buf_printf(&why, "query parameter '%s' is given more than once", other);
        member_problem(c->res, 400, "invalid-parameter", why.p, other);
        buf_free(&why);
        return 0;
    }
    buf_printf(&why, "unknown query parameter '%s': ", other);
    if (!known[0])
        buf_printf(&why, "this resource takes none");
    for (size_t i = 0; known[i]; i++)
        buf_printf(&why, "%s%s", i == 0 ? "this resource takes " : ", ", known[i]);
    member_problem(c->res, 400, "invalid-parameter", why.p, other);
    buf_free(&why);
    return 0;
}

static int auth_ok(struct call *c)
{
    const char *tok = c->a->o.admin_token;
    if (!tok || c->nseg == 0 || strcmp(c->seg[0], "v1") != 0)
        return 1;
    const char *h = c->req->header(c->req, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0)
        return 0;
    /* digests of equal length: the comparison tells nothing, not even the
     * token's length */
    uint8_t got[CRYPTO_SHA256_LEN];
    crypto_sha256(h + 7, strlen(h + 7), got);
    return crypto_equal(c->a->admin_digest, sizeof got, got, sizeof got);
}

void api_handle(void *ctx, const struct http_req *req, struct http_res *res)
{
    struct api *a = ctx;
    struct call c = {.a = a, .req = req, .res = res};
    struct buf allow; /* the methods the path takes, for a 405's Allow (RFC 9110 §15.5.6) */
    buf_init(&allow, 0);
    atomic_fetch_add(&a->requests, 1);
    if (split(&c, req->path)) {
        api_problem(res, 404, "not-found", "no such resource", NULL);
        goto done;
    }
    /* A trigger without the token may still be a signed webhook: the
     * engine answers it only for an entry point that verifies signatures
     * (engine_trigger_begin), 401 otherwise. */
    int admin = auth_ok(&c);
    if (!admin && c.nseg >= 3 && strcmp(c.seg[0], "v1") == 0 &&
        strcmp(c.seg[1], "workspaces") == 0) {
        /* a workspace token reaches its own workspace, tokens aside */
        const char *h = req->header(req, "Authorization");
        if (h && strncasecmp(h, "Bearer ", 7) == 0 &&
            engine_token_check(a->g, c.seg[2], h + 7) == 0) {
            if (c.nseg >= 4 && strcmp(c.seg[3], "tokens") == 0) {
                api_problem(res, 403, "forbidden", "workspace tokens cannot manage tokens", NULL);
                goto done;
            }
            admin = 1;
        }
    }
    c.unauthenticated = !admin;
    int webhook_route = c.nseg == 8 && strcmp(req->method, "POST") == 0 &&
                        strcmp(c.seg[1], "workspaces") == 0 && strcmp(c.seg[3], "workflows") == 0 &&
                        strcmp(c.seg[5], "entry-points") == 0 && strcmp(c.seg[7], "trigger") == 0;
    if (c.unauthenticated && !webhook_route) {
        http_res_header(res, "WWW-Authenticate", "Bearer");
        api_problem(res, 401, "unauthorized", "a valid bearer token is required", NULL);
        goto done;
    }
    /* After the token check (an unauthenticated client learns nothing of
     * the path's form).  A control character in a segment (a percent-encoded
     * NUL arrives as DEL) names nothing: 400, as the name checks answer for the names
     * they check — also for an execution id, a token id, a subscription.  So
     * does a segment that is not UTF-8 ("%FF"): PostgreSQL refuses such a
     * parameter, which would read as the store failing (found by a test). */
    if (req->path_encoded_slash) { /* RFC 3986 §2.2: data, never a separator */
        api_problem(res, 400, "invalid-name",
                    "a path segment holds a percent-encoded '/' (%2F), which no name can hold",
                    NULL);
        goto done;
    }
    for (int i = 0; i < c.nseg; i++) {
        for (const char *p = c.seg[i]; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f) {
                api_problem(res, 400, "invalid-name",
                            "a path segment holds a control character (a percent-encoded NUL?)",
                            NULL);
                goto done;
            }
        if (!json_utf8_valid(c.seg[i])) {
            api_problem(res, 400, "invalid-name", "a path segment is not UTF-8 text", NULL);
            goto done;
        }
    }
    int path_matched = 0;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const struct route *r = &routes[i];
        if (r->nseg != c.nseg)
            continue;
        int ok = 1;
        for (int k = 0; k < c.nseg && ok; k++)
            ok = strcmp(r->pattern[k], "*") == 0 || strcmp(r->pattern[k], c.seg[k]) == 0;
        if (!ok)
            continue;
        path_matched = 1;
        /* the probes take HEAD as GET (RFC 9110 §9.3.2; load balancers
         * probe with it): libmicrohttpd sends the head without the body */
        int head =
            r->any_query && strcmp(req->method, "HEAD") == 0 && strcmp(r->method, "GET") == 0;
        if (head || strcmp(r->method, req->method) == 0) {
            if (!r->any_query && !query_known(&c, r->params)) {
                if (r->params == q_trigger) /* a trigger refused, as trigger() counts them */
                    atomic_fetch_add(&a->triggers_rejected, 1);
                goto done;
            }
            r->fn(&c);
            goto done;
        }
        buf_printf(&allow, "%s%s%s", allow.len ? ", " : "", r->method,
                   r->any_query && strcmp(r->method, "GET") == 0 ? ", HEAD" : "");
    }
    if (path_matched) {
        api_problem(res, 405, "method-not-allowed", "this resource does not accept that method",
                    NULL);
        http_res_header(res, "Allow", allow.p);
    } else
        api_problem(res, 404, "not-found", "no such resource", NULL);
done:
    buf_free(&allow);
    if (!c.deferred)
        count_response(a, res->status);
    for (int i = 0; i < c.nseg; i++)
        free(c.seg[i]);
}

struct api *api_new(struct engine *g, const struct api_opts *o)
{
    struct api *a = xcalloc(1, sizeof *a);
    a->g = g;
    a->o = *o;
    if (!a->o.max_body)
        a->o.max_body = 1u << 20;
    if (!a->o.max_depth)
        a->o.max_depth = JSON_DEFAULT_MAX_DEPTH;
    a->started_ms = clock_mono_ms();
    if (a->o.admin_token)
        crypto_sha256(a->o.admin_token, strlen(a->o.admin_token), a->admin_digest);
    return a;
}

void api_attach_server(struct api *a, const struct http_server *srv)
{
    atomic_store(&a->srv, srv);
}

void api_free(struct api *a)
{
    free(a);
}
