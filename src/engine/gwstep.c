/*
 * gwstep — running GATEWAY steps inside the engine (spec §6).
 *
 * A worker that claims a GATEWAY step renders its request (secrets as
 * sentinels, then unsealed on the wire copy only), hands it to the engine's
 * gateway client (libcurl multi: many calls in flight on one thread) and
 * moves on.  When the call ends, the client's thread queues the job and
 * wakes the workers; a worker classifies the response and turns it into a
 * step outcome, committed like any other (guarded by state and epoch).
 * The sweeper renews the leases of calls in flight.
 *
 * Decisions:
 *  - success → COMPLETED with {status, headers, body};
 *  - not sent / refused → DISPATCHED again after full-jitter backoff (never
 *    below Retry-After), or FAILED attempts_exhausted / deadline_exceeded;
 *  - ambiguous → `retry` as above; `verify` → DISPATCHED with verifyFirst
 *    (the next attempt asks the verify request before any re-send);
 *    `reconcile` → REQUIRES_RECONCILIATION;
 *  - 409 → onConflict; other 4xx → clientErrorMode.
 * A call whose destination (scheme, host, port) has its share of the
 * process's calls in flight is not sent: its claim is taken back
 * (`deferred`: DISPATCHED again, no attempt left), so a destination that
 * hangs holds at most its share of the slots, not every one.
 * The Idempotency-Key comes from the step's template, so every attempt —
 * after a restart or an operator retry too — sends the same value.
 */
#include "base/clock.h"
#include "base/crashmark.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "crypto/crypto.h"
#include "engine/engine_int.h"
#include "expr/template.h"
#include "json/json.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

struct gw_job {
    struct engine *g;
    char execution_id[65];
    char *vertex, *workspace;
    int64_t epoch;
    int attempts;
    const struct wf *w; /* a reference of its own (wf_hold) */
    long vi;
    json_t *ctx;
    struct gw_request req, vreq;
    int phase; /* 0: the call, 1: the verify request */
    /* the verify found the earlier call not done, and the call was sent
     * again in this attempt: what this attempt met settles the earlier
     * call's effect (its error says "afterVerify"; steps_effect_unknown) */
    int resent_after_verify;
    /* A re-send after a lease expiry (the error the recovery left says so):
     * its first response is noted on its attempt before anything evaluates
     * it, so the next recovery knows whether handling the response is what
     * stopped the process (runner.c, MAX_EVAL_CRASHES).  After a
     * verify response that says "not done", the note is cleared before the
     * call is re-sent, and that call's response is noted in turn. */
    int recovered, noted;
    /* The retry budget: attempts made, this one included, and when the
     * first of them started — since the last operator retry, if any. */
    int budget_attempts;
    int64_t first_attempt_ms;
    /* when the verify of this attempt's call may run (retry_or_fail), or 0 */
    int64_t verify_not_before;
    /* The last moment the call may leave (gw_request.send_by of req and
     * vreq): a quarter of a lease before the lease this process last knew
     * it held runs out — the sweeper moves it on at each renewal, and to
     * the past when a renewal finds the lease taken over. */
    _Atomic int64_t send_by;
    struct store_step *rows; /* the execution as read at the claim */
    size_t nrows;
    char *worker;
    struct gw_dest *dest; /* its share of its destination's calls, until its call ends */
    /* … and of its verify request's, when that goes elsewhere: until the
     * verify ends (a verify host that hangs holds only its own share) */
    struct gw_dest *vdest;
    struct gw_response *resp;
    /* req's scrub list also holds the workspace's secrets as read when the
     * answer came (engine_gw_drain): the list a TRANSFORM after it is
     * scrubbed with (0: that read failed; the TRANSFORM reads its own) */
    int scrub_now;
    struct gw_job *next;  /* done queue */
    struct gw_job *inext; /* in-flight list */
};

/* A destination's calls in this process, from render to the call's end
 * (or to job_free, for a call that never left): a list
 * under g->gmu (as many entries as destinations with a call out, at most
 * max_calls; an entry goes with its last call). */
struct gw_dest {
    struct gw_dest *next;
    int n;
    int64_t next_slot; /* the last deferred call's turn (dest_take) */
    char key[];        /* scheme://host:port, lower case */
};

/* The destination of a rendered url: scheme://host:port in lower case,
 * without userinfo, the port the scheme's when none is given. */
static char *dest_key(const char *url)
{
    const char *auth, *at, *end;
    if (!gw_url_authority(url, &auth, &at, &end))
        return xstrdup(url);
    int slen = (int)(auth - 3 - url);
    const char *host = at ? at + 1 : auth;
    int has_port = 0;
    for (const char *q = end; q > host && q[-1] != ']'; q--) /* not an IPv6 literal's colons */
        if (q[-1] == ':') {
            has_port = 1;
            break;
        }
    const char *port = has_port                                         ? ""
                       : slen == 5 && strncasecmp(url, "https", 5) == 0 ? ":443"
                       : slen == 4 && strncasecmp(url, "http", 4) == 0  ? ":80"
                                                                        : "";
    char *k = xasprintf("%.*s://%.*s%s", slen, url, (int)(end - host), host, port);
    for (char *q = k; *q; q++)
        *q = (char)tolower((unsigned char)*q);
    return k;
}

/* Takes one of destination k's max_calls_per_destination shares into
 * *slot (under g->gmu); 0 when it gets none, with *again_at when to try
 * again.  The calls put
 * off go on the destination's calendar, one turn after the other, as many
 * a second as it has shares, from DEFER_MIN_MS on and at most DEFER_MAX_MS
 * ahead (spread over the second half of that when the calendar is full):
 * a few waiting calls are soon tried again, and a backlog behind a
 * destination that hangs asks the store about once every DEFER_MAX_MS
 * each.  While calls wait their turn, a call that has not waited
 * (`waited` 0: a new one) joins them rather than take a share freed for
 * them. */
#define DEFER_MIN_MS 250
#define DEFER_MAX_MS 8000
static int take_locked(struct engine *g, const char *k, int waited, int64_t now, int64_t *again_at,
                       struct gw_dest **slot)
{
    int share = g->run.max_calls_per_destination;
    int64_t spacing = 1000 / share > 1 ? 1000 / share : 1;
    struct gw_dest *d = g->gw_dests;
    while (d && strcmp(d->key, k) != 0)
        d = d->next;
    int ok = !d || (d->n < share && (waited || d->next_slot <= now));
    if (ok && !d) {
        size_t kl = strlen(k) + 1;
        d = xcalloc(1, sizeof *d + kl);
        memcpy(d->key, k, kl);
        d->next = g->gw_dests;
        g->gw_dests = d;
    }
    if (ok) {
        d->n++;
        *slot = d;
    } else {
        int64_t slot_at = d->next_slot + spacing;
        if (slot_at < now + DEFER_MIN_MS)
            slot_at = now + DEFER_MIN_MS;
        if (slot_at > now + DEFER_MAX_MS) /* full: anywhere in its second half */
            *again_at = now + DEFER_MAX_MS / 2 + (int64_t)(gw_rnd01() * (DEFER_MAX_MS / 2));
        else
            *again_at = (d->next_slot = slot_at) + (int64_t)(gw_rnd01() * (double)spacing);
    }
    return ok;
}

static void give_back_locked(struct engine *g, struct gw_dest **slot);

/* The shares j's requests need: its call's destination's, and its verify
 * request's when that is another destination (both, or neither).  The
 * room the workers see is counted in calls, one per job: a job verifying
 * on another host holds two destinations' shares, but one of the
 * process's max_calls. */
static int dest_take(struct gw_job *j, int waited, int64_t *again_at)
{
    struct engine *g = j->g;
    char *k = dest_key(j->req.url);
    char *vk = j->vreq.url ? dest_key(j->vreq.url) : NULL;
    pthread_mutex_lock(&g->gmu);
    int64_t now = clock_now_ms();
    int ok = take_locked(g, k, waited, now, again_at, &j->dest);
    if (ok && vk && strcmp(vk, k) != 0 && !take_locked(g, vk, waited, now, again_at, &j->vdest)) {
        give_back_locked(g, &j->dest);
        ok = 0;
    }
    g->gw_calls_n += ok;
    pthread_mutex_unlock(&g->gmu);
    free(vk);
    free(k);
    return ok;
}

/* Gives a share of j's back (under g->gmu): as its call (or its verify
 * request) ends, or with the job when it never left. */
static void give_back_locked(struct engine *g, struct gw_dest **slot)
{
    struct gw_dest *d = *slot;
    if (--d->n == 0)
        for (struct gw_dest **p = &g->gw_dests; *p; p = &(*p)->next)
            if (*p == d) {
                *p = d->next;
                free(d);
                break;
            }
    *slot = NULL;
}

/* Gives back every share j holds, and its call (under g->gmu). */
static void give_back_all_locked(struct gw_job *j)
{
    if (j->dest) {
        give_back_locked(j->g, &j->dest);
        j->g->gw_calls_n--;
    }
    if (j->vdest)
        give_back_locked(j->g, &j->vdest);
}

static void dest_give_back(struct gw_job *j)
{
    pthread_mutex_lock(&j->g->gmu);
    give_back_all_locked(j);
    pthread_mutex_unlock(&j->g->gmu);
}

static void job_free(struct gw_job *j)
{
    if (!j)
        return;
    dest_give_back(j);
    free(j->vertex);
    free(j->workspace);
    free(j->worker);
    store_steps_free(j->rows, j->nrows);
    json_decref(j->ctx);
    gw_request_clear(&j->req);
    gw_request_clear(&j->vreq);
    if (j->resp) {
        gw_response_clear(j->resp);
        free(j->resp);
    }
    wf_release(j->w);
    free(j);
}

/* ---- secrets ---------------------------------------------------------------- */

/* A workspace's secrets, read and decrypted once for a step's requests:
 * the ones its templates name are substituted, and every one is scrubbed
 * from what the destination answers — a provider may echo a secret that
 * another step sent (a webhook secret configured, then read back). */
struct sec {
    char **names, **values;
    size_t n;
};

static const char *sec_value(const struct sec *s, const char *name, int *rc)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0) {
            *rc = s->values[i] ? 0 : IFL_EINTERNAL; /* sealed under another key */
            return s->values[i];
        }
    *rc = IFL_ENOTFOUND;
    return NULL;
}

/* Template resolver: checks the secret exists, substitutes a sentinel. */
static int sentinel_secret(void *ctx, const char *name, char **value)
{
    int rc;
    if (!sec_value(ctx, name, &rc))
        return rc;
    *value = gw_secret_sentinel(name);
    return 0;
}

static int real_secret(void *ctx, const char *name, char **value)
{
    int rc;
    const char *v = sec_value(ctx, name, &rc);
    if (v)
        *value = xstrdup(v);
    return rc;
}

static int render(const struct sec *s, const struct tmpl *t, const char *method, json_t *ctx,
                  struct gw_request *out, struct ifl_err *e)
{
    json_t *rendered = NULL;
    int rc = tmpl_eval(t, ctx, sentinel_secret, (void *)s, &rendered, e);
    if (!rc)
        rc = gw_request_build(method, rendered, out, e);
    json_decref(rendered);
    if (!rc)
        rc = gw_request_unseal(out, real_secret, (void *)s, e);
    if (!rc)
        gw_request_scrub_also(out, s->values, s->n);
    return rc;
}

/* ---- in flight ---------------------------------------------------------------- */

static void on_done(void *ctx, struct gw_response *resp)
{
    struct gw_job *j = ctx;
    struct engine *g = j->g;
    j->resp = resp;
    if (resp->late)
        log_warn("step.lease_lost",
                 "%s/%s epoch %lld: the lease ran out before the request left (the process "
                 "paused?); not sent",
                 j->execution_id, j->vertex, (long long)j->epoch);
    pthread_mutex_lock(&g->gmu);
    int first = g->gw_done == NULL;
    j->next = g->gw_done;
    g->gw_done = j;
    pthread_mutex_unlock(&g->gmu);
    /* One wake-up per batch of finished calls: a list that was not empty
     * already had one, and the worker that drains it takes all of it. */
    if (first)
        engine_wake_drain(g);
}

static void submit(struct gw_job *j, const struct gw_request *r)
{
    struct engine *g = j->g;
    FAULT("gateway.before_send");
    gw_client_submit(g->gw, r, j->w->v[j->vi].policy.timeout_ms, on_done, j);
}

int engine_gw_inflight(struct engine *g)
{
    pthread_mutex_lock(&g->gmu);
    int n = g->gw_calls_n; /* every call holds its shares until it ends */
    pthread_mutex_unlock(&g->gmu);
    return n;
}

static void inflight_add(struct gw_job *j)
{
    struct engine *g = j->g;
    pthread_mutex_lock(&g->gmu);
    j->inext = g->gw_inflight;
    g->gw_inflight = j;
    pthread_mutex_unlock(&g->gmu);
}

static void inflight_remove(struct gw_job *j)
{
    struct engine *g = j->g;
    pthread_mutex_lock(&g->gmu);
    for (struct gw_job **p = &g->gw_inflight; *p; p = &(*p)->inext)
        if (*p == j) {
            *p = j->inext;
            break;
        }
    give_back_all_locked(j); /* the call ended: its destination may take the next one now */
    pthread_mutex_unlock(&g->gmu);
}

/* The send_by of a lease held until `until`: a quarter of a lease earlier,
 * for clocks a little apart across machines (another process takes the
 * step over once its own clock passes `until`). */
static int64_t send_by_of(const struct engine *g, int64_t until)
{
    return until - g->run.lease_ms / 4;
}

/* Moves the send_by of the call of (id, vertex, epoch); 1 when that call
 * is still out here, 0 (nothing moved) when it ended meanwhile. */
static int send_by_set(struct engine *g, const char *id, const char *vertex, int64_t epoch,
                       int64_t at)
{
    int found = 0;
    pthread_mutex_lock(&g->gmu);
    for (struct gw_job *j = g->gw_inflight; j && !found; j = j->inext)
        if (j->epoch == epoch && strcmp(j->execution_id, id) == 0 &&
            strcmp(j->vertex, vertex) == 0) {
            atomic_store(&j->send_by, at);
            found = 1;
        }
    pthread_mutex_unlock(&g->gmu);
    return found;
}

void engine_gw_renew_leases(struct engine *g)
{
    struct renew {
        char id[65];
        char *vertex;
        int64_t epoch;
    } *r = NULL;
    size_t n = 0;
    pthread_mutex_lock(&g->gmu);
    for (struct gw_job *j = g->gw_inflight; j; j = j->inext) {
        r = xrealloc(r, (n + 1) * sizeof *r);
        memcpy(r[n].id, j->execution_id, sizeof r[n].id);
        r[n].vertex = xstrdup(j->vertex);
        r[n].epoch = j->epoch;
        n++;
    }
    pthread_mutex_unlock(&g->gmu);
    for (size_t i = 0; i < n; i++) {
        int ok = 0;
        struct ifl_err e = {0};
        int64_t now = clock_now_ms(), until = now + g->run.lease_ms;
        if (FAULT_FAILS("gateway.lease_renew")) { /* as a sweep that came too late */
            free(r[i].vertex);
            continue;
        }
        if (store_lease_renew(g->store, r[i].id, r[i].vertex, r[i].epoch, now, until, &ok, &e)) {
            log_warn("step.lease_renew_failed", "%s/%s: %s", r[i].id, r[i].vertex, e.msg);
        } else if (ok) {
            send_by_set(g, r[i].id, r[i].vertex, r[i].epoch, send_by_of(g, until));
        } else if (send_by_set(g, r[i].id, r[i].vertex, r[i].epoch, INT64_MIN)) {
            /* taken over: a call not yet sent never leaves now, and the
             * outcome of one that did will be fenced.  (A call that ended
             * since the list was made and whose outcome committed holds no
             * lease any more: nothing was lost.) */
            log_warn("step.lease_lost",
                     "%s/%s epoch %lld: the lease of a call in flight was "
                     "taken over",
                     r[i].id, r[i].vertex, (long long)r[i].epoch);
        }
        free(r[i].vertex);
    }
    free(r);
}

int engine_gw_keep(struct engine *g, const char *id, const char *vertex, int64_t epoch)
{
    int held = 0;
    pthread_mutex_lock(&g->gmu);
    for (struct gw_job *j = g->gw_inflight; j && !held; j = j->inext)
        held =
            j->epoch == epoch && strcmp(j->execution_id, id) == 0 && strcmp(j->vertex, vertex) == 0;
    pthread_mutex_unlock(&g->gmu);
    /* Only where this process is the database's one owner (SQLite): a
     * lapsed lease is revived (store_lease_renew at 0), since nobody else
     * lists it as expired.  With a shared database another process may be
     * recovering it right now, and its recovery is fenced by the epoch
     * only: there the lapse stands. */
    if (!held || strcmp(store_backend(g->store), "sqlite") != 0)
        return 0;
    int ok = 0;
    int64_t now = clock_now_ms(), until = now + g->run.lease_ms;
    if (store_lease_renew(g->store, id, vertex, epoch, 0, until, &ok, NULL) || !ok)
        return 0;
    send_by_set(g, id, vertex, epoch, send_by_of(g, until));
    return 1;
}

/* ---- starting a call ------------------------------------------------------------ */

/* What the step's last error (left by a recovery or a retry) asks of this
 * attempt: verify first, and whether it follows a lease expiry. */
static void prior_error(const struct store_step *rows, size_t n, const char *vertex, int *verify,
                        int *recovered, int64_t *not_before)
{
    *verify = *recovered = 0;
    *not_before = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(rows[i].vertex, vertex) != 0 || !rows[i].error)
            continue;
        json_t *err = NULL;
        if (json_parse(rows[i].error, strlen(rows[i].error), &json_stored_limits, &err, NULL) ==
            0) {
            *verify = json_is_true(json_object_get(err, "verifyFirst"));
            if (*verify)
                *not_before = steps_error_not_before_of(err);
            const char *code = json_string_value(json_object_get(err, "code"));
            *recovered = code && (strcmp(code, STEPS_LEASE_EXPIRED_MID_CALL) == 0 ||
                                  strcmp(code, STEPS_LEASE_EXPIRED_WHILE_RENDERING) == 0 ||
                                  strcmp(code, STEPS_LEASE_EXPIRED_AFTER_RESPONSE) == 0);
        }
        json_decref(err);
        return;
    }
}

void engine_gw_budget(const struct store_attempt *a, size_t n, const char *vertex, int attempts,
                      int *made, int64_t *first)
{
    *made = attempts;
    *first = clock_now_ms();
    int64_t since = 0; /* the epoch of the last operator retry */
    for (size_t i = 0; i < n; i++)
        if (strcmp(a[i].vertex, vertex) == 0 && steps_operator_retry(a[i].outcome) &&
            a[i].epoch > since)
            since = a[i].epoch;
    int count = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(a[i].vertex, vertex) != 0 || a[i].epoch <= since ||
            steps_operator_retry(a[i].outcome))
            continue;
        count++;
        if (a[i].started_at < *first)
            *first = a[i].started_at;
    }
    if (count >= 1) /* this attempt's own row is among them */
        *made = count;
}

/* The retry budget of a step claimed for its attempt number `attempts`
 * (engine_gw_budget); -1 when the history cannot be read.  A first
 * attempt has no history to read.  A deferred call left no attempt
 * (steps_apply's unclaim). */
static int retry_budget(struct engine *g, const char *xid, const char *vertex, int attempts,
                        int *made, int64_t *first)
{
    struct store_attempt *a = NULL;
    size_t n = 0;
    struct ifl_err e = {0};
    if (attempts > 1 && (FAULT_FAILS("gateway.history_read")
                             ? err_set(&e, IFL_ESTORE, "fault point gateway.history_read")
                             : store_attempts_get(g->store, xid, &a, &n, &e)) != 0) {
        log_warn("step.history_unread", "%s/%s: the step's attempts cannot be read: %s", xid,
                 vertex, e.msg);
        return -1;
    }
    engine_gw_budget(a, n, vertex, attempts, made, first);
    store_attempts_free(a, n);
    return 0;
}

/* What a GATEWAY's request and verify render in: `payload`, `execution`,
 * and in `steps` only the outputs of the vertex's ancestors (spec §6: the
 * same Idempotency-Key on every attempt).  A parallel branch may complete
 * between two attempts, and a key or body that read its output would
 * change from one attempt to the next — a second charge under a new key.
 * Nothing else (an edge condition's `response`) either.  The steps go in
 * in the order of their names, whatever order the context had them in (a
 * trigger's in the order they ran, a worker's as the store lists them):
 * `steps.*` or `$keys(steps)` reads them in that order. */
static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static json_t *render_context(const struct wf *w, long vi, json_t *ctx)
{
    json_t *r = json_object(), *steps = json_object(), *all = json_object_get(ctx, "steps");
    json_object_set(r, "payload", json_object_get(ctx, "payload"));
    json_object_set(r, "execution", json_object_get(ctx, "execution"));
    const char **names = xcalloc(json_object_size(all) + 1, sizeof *names);
    size_t n = 0;
    const char *name;
    json_t *out;
    json_object_foreach(all, name, out)
    {
        long a = wf_vertex_index(w, name);
        if (a >= 0 && wf_is_ancestor(w, (size_t)a, (size_t)vi))
            names[n++] = name;
    }
    qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i < n; i++)
        json_object_set(steps, names[i], json_object_get(all, names[i]));
    free(names);
    json_object_set_new(r, "steps", steps);
    return r;
}

struct gw_job *engine_gw_prepare(struct engine *g, const struct store_claim *c, const struct wf *w,
                                 long vi, json_t *ctx, struct store_step **rows, size_t *n,
                                 char **err_text, int64_t *again_at)
{
    *again_at = 0;
    const struct wf_vertex *v = &w->v[vi];
    if (v->broken) {
        *err_text = engine_broken_error(v);
        return NULL;
    }
    struct gw_job *j = xcalloc(1, sizeof *j);
    j->g = g;
    memcpy(j->execution_id, c->execution_id, sizeof j->execution_id);
    j->vertex = xstrdup(c->vertex);
    j->workspace = xstrdup(c->workspace);
    j->epoch = c->epoch;
    j->attempts = c->attempts;
    j->w = wf_hold(w); /* the call may outlive its claimer's reference */
    j->vi = vi;
    j->ctx = json_incref(ctx);
    /* maxAttempts and the deadline count from the first attempt: this one,
     * or one in the history (read only when there is one) after the last
     * operator retry. */
    if (retry_budget(g, c->execution_id, c->vertex, c->attempts, &j->budget_attempts,
                     &j->first_attempt_ms)) {
        /* a read failed (an outage): a budget counted from now would
         * stretch the deadline (found by a reviewer); again later, nothing
         * sent, the error before kept */
        job_free(j);
        *again_at = clock_now_ms() + 1000;
        return NULL;
    }
    struct ifl_err e = {0};
    int verify;
    int64_t not_before;
    prior_error(*rows, *n, c->vertex, &verify, &j->recovered, &not_before);
    /* A retry or a recovery that could only start after the deadline (the
     * engine was down, or busy) does not start: nothing is sent past it. */
    if (j->budget_attempts > 1 && clock_now_ms() > j->first_attempt_ms + v->policy.deadline_ms) {
        json_t *ej = json_pack("{s:s,s:s,s:i}", "code", "deadline_exceeded", "message",
                               "the deadline had passed when this attempt could start; nothing "
                               "was sent",
                               "attempt", c->attempts);
        if (verify) { /* the outcome before is still unknown */
            json_object_set_new(ej, "verifyFirst", json_true());
            steps_error_set_not_before(ej, not_before);
        }
        *err_text = json_to_string(ej);
        json_decref(ej);
        job_free(j);
        return NULL;
    }
    /* A verify of a call that may still be in its provider's hands waits
     * (verifyNotBefore: retry_or_fail, a recovery): a claim before then —
     * an operator's retry, found by a judge — is taken back until then. */
    if (verify && not_before > clock_now_ms()) {
        job_free(j);
        *again_at = not_before;
        return NULL;
    }
    FAULT("gateway.before_render");
    json_t *rctx = NULL;
    int rc = 0;
    /* A secret the cached list lacks, or holds in a form this key cannot
     * open, may have been PUT by another process since it was read
     * (engine_int.h): the second pass reads the list again before the step
     * fails for it. */
    for (int pass = 0; pass < 2; pass++) {
        struct sec sec = {0};
        struct ifl_err re = {0};
        int r = pass ? engine_secrets_fresh(g, c->workspace, &sec.names, &sec.values, &sec.n, &re)
                : engine_secrets_all(g, c->workspace, &sec.names, &sec.values, &sec.n, &re) ? -1
                                                                                            : 0;
        if (r > 0) /* the list cannot lag: the first pass's error stands */
            break;
        if (r < 0) {
            /* The store failed a read (an outage): nothing is wrong with
             * the step and nothing was sent — *err_text NULL says "again
             * later". */
            log_warn("step.secrets_unread", "%s/%s: the workspace's secrets cannot be read: %s",
                     c->execution_id, c->vertex, re.msg);
            engine_secrets_release(sec.names, sec.values, sec.n);
            json_decref(rctx);
            job_free(j);
            /* taken back as a deferral is: the error the attempt before left
             * (its verifyFirst, found by a judge: a `not_sent` error written
             * over it let the next attempt send without verifying) stays */
            *again_at = clock_now_ms() + 1000;
            return NULL;
        }
        if (!rctx) {
            rctx = render_context(w, vi, ctx);
        } else { /* what the first pass's render left */
            gw_request_clear(&j->req);
            gw_request_clear(&j->vreq);
            e = (struct ifl_err){0};
        }
        rc = render(&sec, v->request, v->method, rctx, &j->req, &e) ||
             (verify && v->verify && render(&sec, v->verify, v->verify_method, rctx, &j->vreq, &e));
        engine_secrets_release(sec.names, sec.values, sec.n);
        if (!rc || (e.code != IFL_ENOTFOUND && e.code != IFL_EINTERNAL))
            break; /* IFL_EINTERNAL: a value that did not decrypt (a PUT under another key) */
    }
    json_decref(rctx);
    if (rc) {
        *err_text = steps_error_json("request_error", e.msg);
        job_free(j);
        return NULL;
    }
    /* A configured key that renders to nothing (an absent field, null, "",
     * nothing but spaces or tabs — found by a judge: libcurl then sends no
     * header at all) would send the call unkeyed under the policies chosen
     * for a keyed one (`ambiguous: retry`, `onConflict: complete`): a retry
     * could repeat the effect.  Nothing is sent. */
    if (v->policy.has_idempotency_key && !gw_request_has_key(&j->req)) {
        *err_text = steps_error_json("request_error",
                                     "the Idempotency-Key header rendered empty; nothing was sent");
        job_free(j);
        return NULL;
    }
    /* A second send of the call is harmless only with a key the provider
     * honours (the `retry` policy says it does); a verify request is a read
     * when it is a GET or HEAD. */
    /* Its destination's share of the calls in flight is taken: not sent,
     * and not an attempt of its budget (a call to another destination is
     * not held up behind a destination that hangs). */
    if (!dest_take(j, c->epoch > c->attempts, again_at)) {
        atomic_fetch_add(&g->m.gw_deferred, 1);
        job_free(j);
        return NULL;
    }
    j->req.resend_safe = v->policy.ambiguous == GW_AMB_RETRY && j->req.idempotency_key;
    j->req.one_send = 1; /* a second send's answer would hide the first's effect */
    j->req.fresh = v->policy.fresh_connections;
    j->vreq.resend_safe = j->vreq.method && (strcmp(j->vreq.method, "GET") == 0 ||
                                             strcmp(j->vreq.method, "HEAD") == 0);
    j->vreq.fresh = 1; /* its answer decides a re-send: never a stray on a reused connection */
    j->phase = j->vreq.url ? 1 : 0;
    j->rows = *rows;
    j->nrows = *n;
    *rows = NULL;
    *n = 0;
    return j;
}

int engine_gw_hold(struct gw_job *j, int64_t claimed_at)
{
    struct engine *g = j->g;
    FAULT("gateway.before_launch");
    /* The call must not leave once its lease may have lapsed (a long batch
     * or commit since the claim): by then another worker may have the step,
     * and a second send of an unkeyed call is a second effect.  Past half
     * the lease, renew it first, fenced by the epoch, or drop the call.
     * Once out, it leaves only while the lease is held (send_by), which a
     * pause of the whole process (a VM frozen, swapped out) between here
     * and the write could otherwise outlast. */
    int64_t until = claimed_at + g->run.lease_ms;
    if (clock_now_ms() - claimed_at > g->run.lease_ms / 2) {
        int ok = 0;
        struct ifl_err e = {0};
        int64_t now = clock_now_ms();
        until = now + g->run.lease_ms;
        if (store_lease_renew(g->store, j->execution_id, j->vertex, j->epoch, now, until, &ok,
                              &e) ||
            !ok) {
            log_warn("step.lease_lost",
                     "%s/%s epoch %lld: lease lost before the call left; not "
                     "sent",
                     j->execution_id, j->vertex, (long long)j->epoch);
            job_free(j);
            return 0;
        }
    }
    atomic_store(&j->send_by, send_by_of(g, until));
    j->req.send_by = j->vreq.send_by = &j->send_by;
    return 1;
}

void engine_gw_send(struct gw_job *j)
{
    inflight_add(j);
    submit(j, j->phase ? &j->vreq : &j->req);
}

void engine_gw_launch(struct gw_job *j, int64_t claimed_at)
{
    if (engine_gw_hold(j, claimed_at))
        engine_gw_send(j);
}

void engine_gw_discard(struct gw_job *j)
{
    job_free(j);
}

/* ---- finishing a call ------------------------------------------------------------ */

static const char *note_key(const void *arg)
{
    return ((const struct attempt_note *)arg)->execution_id;
}

static int note_tx(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    const struct attempt_note *a = arg;
    return store_tx_attempt_note(tx, a->execution_id, a->vertex, a->epoch, a->note, e);
}

void engine_note_attempts(struct engine *g, const struct attempt_note *notes, size_t n)
{
    engine_note_attempts_checked(g, notes, n, NULL);
}

void engine_note_attempts_checked(struct engine *g, const struct attempt_note *notes, size_t n,
                                  int *failed)
{
    if (!n)
        return;
    void **args = xcalloc(n, sizeof *args);
    int *rcs = xcalloc(n, sizeof *rcs);
    struct ifl_err *errs = xcalloc(n, sizeof *errs);
    for (size_t i = 0; i < n; i++)
        args[i] = (void *)&notes[i];
    store_tx_run_many_ordered(g->store, note_tx, args, note_key, n, rcs, errs);
    for (size_t i = 0; i < n; i++) {
        if (rcs[i])
            log_warn("step.note_failed", "%s/%s: %s", notes[i].execution_id, notes[i].vertex,
                     errs[i].msg);
        if (failed)
            failed[i] = rcs[i] != 0;
    }
    free(args);
    free(rcs);
    free(errs);
}

static struct attempt_note job_note(const struct gw_job *j, const char *note)
{
    return (struct attempt_note){j->execution_id, j->vertex, j->epoch, note};
}

/* A call the stop ended after it left (gw_client_free's grace ran out):
 * what it did is unknown, as when a process dies mid-call, and it is left
 * as such a death leaves it — EXECUTING under its lease, for the next start
 * (or, on PostgreSQL, another process once the lease lapses) to recover: a
 * keyed call sent again with its key, `verify` verifying first, `reconcile`
 * parked.  No attempt is spent on it and no deadline checked now, so a
 * stop never turns a call on its last attempt into a FAILED step. */
static int stopped_mid_call(const struct gw_job *j)
{
    return j->resp && j->resp->shutdown && j->resp->transport != GW_T_NOT_SENT;
}

/* Notes "responded" on the attempts of the re-sent calls in `list` whose
 * response just arrived, before anything evaluates one (its `doneWhen`, its
 * edge conditions): all in one group commit, so that after a restart, when
 * every re-sent call answers at once, the time a kill can land between
 * the note and the outcome stays one commit long.  Only on this rare path
 * (a first attempt is never noted: the hot path writes nothing extra). */
static void note_responses(struct engine *g, struct gw_job *list)
{
    size_t n = 0, k = 0;
    for (struct gw_job *j = list; j; j = j->next)
        n += j->recovered && !j->noted && !stopped_mid_call(j);
    if (!n)
        return;
    struct attempt_note *v = xcalloc(n, sizeof *v);
    for (struct gw_job *j = list; j; j = j->next)
        if (j->recovered && !j->noted && !stopped_mid_call(j)) {
            j->noted = 1;
            v[k++] = job_note(j, STEPS_RESPONDED);
        }
    engine_note_attempts(g, v, k);
    free(v);
}

/* Clears a re-sent call's note before the call goes out again (a verify
 * response said "not done"): a death from now on is one mid-call. */
static void note_clear(struct gw_job *j)
{
    if (!j->noted)
        return;
    j->noted = 0;
    struct attempt_note v = job_note(j, NULL);
    engine_note_attempts(j->g, &v, 1);
}

/* The step's error after response r to the request this phase sent (the
 * verify request in phase 1); `note` (may be NULL) is appended to its
 * message.  `cause` (may be NULL): what this attempt met, when `code` says
 * only that the attempts or the time ran out (steps_effect_unknown reads
 * whether the call's effect is still unknown from it). */
static char *class_error_note(const char *code, const char *cause, const struct gw_job *j,
                              const struct gw_response *r, int verify_first_next, const char *note)
{
    const struct gw_request *req = j->phase == 1 ? &j->vreq : &j->req;
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string(code));
    if (cause)
        json_object_set_new(o, "cause", json_string(cause));
    char msg[700];
    char *url = gw_request_masked_url(req);
    if (r->transport == GW_T_OK)
        snprintf(msg, sizeof msg, "%s %s answered %ld%s%s", req->method, url, r->status,
                 note ? "; " : "", note ? note : "");
    else
        snprintf(msg, sizeof msg, "%s %s: %s (%s)", req->method, url, r->error,
                 r->transport == GW_T_NOT_SENT ? "not sent" : "sent; outcome unknown");
    free(url);
    json_object_set_new(o, "message", json_string(msg));
    if (r->transport == GW_T_OK)
        json_object_set_new(o, "status", json_integer(r->status));
    json_object_set_new(o, "attempt", json_integer(j->attempts));
    json_object_set_new(o, "request", gw_request_masked(req));
    if (verify_first_next)
        json_object_set_new(o, "verifyFirst", json_true());
    steps_error_set_not_before(o, j->verify_not_before);
    if (j->resent_after_verify && j->phase == 0)
        json_object_set_new(o, "afterVerify", json_true());
    char *s = json_to_string(o);
    json_decref(o);
    return s;
}

static char *class_error(const char *code, const struct gw_job *j, const struct gw_response *r,
                         int verify_first_next)
{
    return class_error_note(code, NULL, j, r, verify_first_next, NULL);
}

/* Whether the call j sent may still be in its provider's hands, and a
 * verify is configured to ask about it (retry_or_fail). */
static int held_by_provider(const struct gw_job *j, const struct gw_response *r)
{
    int in_hand = r && (r->transport == GW_T_AMBIGUOUS ||
                        (r->transport == GW_T_OK && (r->status == 502 || r->status == 504)));
    return j->phase == 0 && in_hand && j->w->v[j->vi].policy.has_verify;
}

/* Schedules another attempt, or fails the step when attempts or the deadline
 * run out.  Fills o (to, run_at, error text).  verify_next: the call's
 * outcome is unknown and the next attempt must verify first — kept in a
 * FAILED step's error too, so that an operator's retry verifies before it
 * sends (steps_retry). */
static void retry_or_fail(struct gw_job *j, const struct gw_response *r, int64_t retry_after,
                          const char *why, int verify_next, const char *note,
                          struct step_outcome *o, char **err_text)
{
    const struct gw_policy *p = &j->w->v[j->vi].policy;
    int64_t now = clock_now_ms();
    /* The call this attempt sent got no answer (a timeout, a reset, the
     * process's stop) or a proxy's 502 or 504, and the next attempt
     * verifies: not before verify.afterMs, for a provider that may still be
     * processing it — a verify sees only what it committed.  (The
     * provider's own answer, a 500 say, means it is done with it.) */
    int hold = verify_next && held_by_provider(j, r);
    j->verify_not_before = hold ? now + p->verify_after_ms : 0; /* also when it fails now */
    if (j->budget_attempts >= p->max_attempts) {
        o->to = STEP_FAILED;
        *err_text = class_error_note("attempts_exhausted", why, j, r, verify_next, note);
        o->attempt_outcome = "attempts_exhausted";
        return;
    }
    int64_t wait = gw_backoff_ms(p, j->budget_attempts, retry_after, gw_rnd01());
    if (hold) {
        wait = engine_gw_verify_wait(p, p->verify_after_ms, wait,
                                     j->first_attempt_ms + p->deadline_ms - now);
        if (now + wait < j->verify_not_before) /* before the deadline, as late as can be */
            j->verify_not_before = now + wait;
    }
    if (now + wait > j->first_attempt_ms + p->deadline_ms) {
        o->to = STEP_FAILED;
        *err_text = class_error_note("deadline_exceeded", why, j, r, verify_next, note);
        o->attempt_outcome = "deadline_exceeded";
        return;
    }
    o->to = STEP_DISPATCHED;
    o->run_at = now + wait;
    *err_text = class_error_note(why, NULL, j, r, verify_next, note);
    o->attempt_outcome = why;
}

int64_t engine_gw_verify_wait(const struct gw_policy *p, int64_t after, int64_t base, int64_t left)
{
    if (base >= after)
        return base;
    /* within the deadline, past it anyway, or an afterMs the workflow set:
     * the provider may go on that long (the step fails deadline_exceeded,
     * its mark kept for an operator's retry) */
    if (after <= left || base > left || p->verify_after_set)
        return after;
    int64_t room = left - base; /* claimed a moment after it is due: keep a margin */
    return left - (room > 2000 ? 1000 : room / 2);
}

const char *const engine_gw_classes[ENGINE_GW_NCLASSES] = {
    "success", "not_sent", "refused", "ambiguous", "conflict", "client_error", "egress_denied"};
const long engine_gw_buckets_ms[ENGINE_GW_NBUCKETS - 1] = {5,   10,   25,   50,   100,  250,
                                                           500, 1000, 2500, 5000, 10000};

/* Counts a response in the metrics: its class and its duration. */
static void count_response(struct engine *g, int verify, enum gw_class cls,
                           const struct gw_response *r)
{
    int k;
    if (r->denied)
        k = 6;
    else if (cls == GW_RETRY)
        k = r->transport == GW_T_NOT_SENT ? 1 : 2;
    else
        k = cls == GW_SUCCESS ? 0 : cls == GW_AMBIGUOUS ? 3 : cls == GW_CONFLICT ? 4 : 5;
    atomic_fetch_add(&g->m.gw_responses[verify ? 1 : 0][k], 1);
    int b = 0;
    while (b < ENGINE_GW_NBUCKETS - 1 && r->elapsed_ms > engine_gw_buckets_ms[b])
        b++;
    atomic_fetch_add(&g->m.gw_duration_bucket[b], 1);
    atomic_fetch_add(&g->m.gw_duration_sum_ms,
                     (unsigned long long)(r->elapsed_ms > 0 ? r->elapsed_ms : 0));
}

/* Turns a finished call into an outcome.  Returns 1 when an outcome is ready
 * in *o (with texts in *out_text / *err_text, and a completed step's output
 * also as JSON in *out, a new reference), 0 when another call was started
 * instead (verify said "not done": re-send). */
static int decide(struct gw_job *j, struct step_outcome *o, char **out_text, json_t **out_json,
                  char **err_text)
{
    const struct wf_vertex *v = &j->w->v[j->vi];
    const struct gw_policy *p = &v->policy;
    struct gw_response *r = j->resp;
    int64_t ra = 0;
    enum gw_class cls = gw_classify(r, clock_now_ms(), &ra);
    count_response(j->g, j->phase == 1, cls, r);
    o->attempt_outcome = gw_class_name(cls);
    if (r->shutdown) {
        /* queued when the stop began: never left — the claim is taken back
         * (no attempt spent: found by a reviewer; the error before, its
         * verifyFirst and mark too, stays for the next start) */
        o->to = STEP_DISPATCHED;
        o->unclaim = 1;
        return 1;
    }
    if (r->denied) { /* the policy will not change by waiting: no retry */
        o->to = STEP_FAILED;
        o->attempt_outcome = "egress_denied";
        /* a denied verify leaves the call's outcome unknown: a retry
         * verifies first */
        *err_text = class_error("egress_denied", j, r, j->phase == 1);
        return 1;
    }
    if (j->phase == 1) {
        /* The verify request: has the ambiguous call already taken effect?
         * Only an answer about the resource can say: 2xx, or 404/410
         * (nothing there).  Another 4xx — 401 for an expired credential, 400
         * or 405 for a wrong request — says nothing about it, and `doneWhen`
         * reading false on its problem body would re-send a call that may
         * have charged.  Nor does a 3xx (found by a judge: a 302 to a
         * sign-in page re-sent the charge): redirects are not followed, so
         * it says where to look, not what is there. */
        if ((cls == GW_CLIENT_ERROR && r->status != 404 && r->status != 410) ||
            (cls == GW_SUCCESS && r->status >= 300)) {
            char note[160];
            snprintf(note, sizeof note,
                     "verify answered %ld: only a 2xx, 404 or 410 answer says whether the "
                     "call took effect",
                     r->status);
            retry_or_fail(j, r, ra, "verify_inconclusive", 1, note, o, err_text);
            return 1;
        }
        if (cls == GW_SUCCESS || cls == GW_CLIENT_ERROR) {
            json_t *out = gw_output(r);
            gw_output_scrub(out, &j->req);
            gw_output_scrub(out, &j->vreq);
            json_object_set(j->ctx, "response", out);
            json_t *res = NULL;
            struct expr_error xe = {0};
            int erc = expr_eval(v->done_when, j->ctx, NULL, NULL, &res, &xe);
            int done = erc == 0 && res && engine_truthy(res);
            json_decref(res);
            json_object_del(j->ctx, "response");
            if (erc) {
                /* No answer is not "not done": verify again later, never
                 * re-send on it. */
                json_decref(out);
                char note[320];
                snprintf(note, sizeof note, "doneWhen failed: %s", xe.msg);
                retry_or_fail(j, r, 0, "verify_inconclusive", 1, note, o, err_text);
                return 1;
            }
            if (done) {
                json_object_set_new(out, "verified", json_true());
                *out_text = json_to_string(out);
                *out_json = out;
                o->to = STEP_COMPLETED;
                o->attempt_outcome = "verified";
                return 1;
            }
            /* "Not done" read on a 2xx whose body is no JSON document — a
             * maintenance page a proxy serves in front of the API (found by
             * a judge: it re-sent the charge) — is not the resource's state
             * either: inconclusive.  A 204 is an answer: nothing there. */
            json_t *b = json_object_get(out, "body");
            int doc = json_is_object(b) || json_is_array(b);
            json_decref(out);
            if (cls == GW_SUCCESS && r->status != 204 && !doc) {
                char note[200];
                snprintf(note, sizeof note,
                         "verify answered %ld with a body that is no JSON object or array; "
                         "doneWhen's \"not done\" is trusted only on one (or a 204, 404, 410)",
                         r->status);
                retry_or_fail(j, r, 0, "verify_inconclusive", 1, note, o, err_text);
                return 1;
            }
            pthread_mutex_lock(&j->g->wmu);
            int stopping = j->g->stopping;
            pthread_mutex_unlock(&j->g->wmu);
            if (stopping) {
                /* Shutting down: no new call now; the next attempt verifies again. */
                o->to = STEP_DISPATCHED;
                *err_text = class_error("verified_not_done", j, r, 1);
                o->attempt_outcome = "verified_not_done";
                return 1;
            }
            /* Nothing is sent past the deadline (found by a reviewer: the
             * re-send left after it when the verify answered late).  A later
             * retry verifies again: the provider may still commit. */
            if (clock_now_ms() > j->first_attempt_ms + p->deadline_ms) {
                o->to = STEP_FAILED;
                *err_text = class_error_note(
                    "deadline_exceeded", "verified_not_done", j, r, 1,
                    "the verify found the call not done after the deadline; not sent again");
                o->attempt_outcome = "deadline_exceeded";
                return 1;
            }
            gw_response_clear(r);
            free(r);
            j->resp = NULL;
            j->phase = 0; /* not done: now (and only now) re-send */
            j->resent_after_verify = 1;
            if (j->vdest) { /* the verify host's share: the call holds its own */
                pthread_mutex_lock(&j->g->gmu);
                give_back_locked(j->g, &j->vdest);
                pthread_mutex_unlock(&j->g->gmu);
            }
            note_clear(j);
            submit(j, &j->req);
            return 0;
        }
        retry_or_fail(j, r, ra, "verify_failed", 1, NULL, o, err_text);
        return 1;
    }
    switch (cls) {
    case GW_SUCCESS:
        break;
    case GW_RETRY:
        retry_or_fail(j, r, ra, r->transport == GW_T_NOT_SENT ? "not_sent" : "refused", 0, NULL, o,
                      err_text);
        return 1;
    case GW_AMBIGUOUS:
        if (p->ambiguous == GW_AMB_RECONCILE) {
            o->to = STEP_REQUIRES_RECONCILIATION;
            /* an operator's retry verifies first, when a verify is configured */
            if (held_by_provider(j, r))
                j->verify_not_before = clock_now_ms() + p->verify_after_ms;
            *err_text = class_error("ambiguous_outcome", j, r, 0);
            o->attempt_outcome = "ambiguous_outcome"; /* as under retry and verify */
            return 1;
        }
        retry_or_fail(j, r, 0, "ambiguous_outcome", p->ambiguous == GW_AMB_VERIFY, NULL, o,
                      err_text);
        return 1;
    case GW_CONFLICT:
        if (p->on_conflict == GW_CONFLICT_RETRY) {
            /* not done yet: the same request again later (with `verify`,
             * verified first: an earlier send's outcome may still be open) */
            retry_or_fail(j, r, ra, "conflict", p->ambiguous == GW_AMB_VERIFY, NULL, o, err_text);
            /* out of attempts or time while a request with the key may
             * still take effect: an outcome unknown, so under `reconcile`
             * parked for an operator rather than FAILED */
            if (o->to == STEP_FAILED && p->ambiguous == GW_AMB_RECONCILE)
                o->to = STEP_REQUIRES_RECONCILIATION;
            return 1;
        }
        if (p->on_conflict == GW_CONFLICT_FAIL) {
            o->to = STEP_FAILED;
            *err_text = class_error("conflict", j, r, 0);
            return 1;
        }
        break;
    case GW_CLIENT_ERROR:
        if (!p->client_error_complete) {
            o->to = STEP_FAILED;
            *err_text = class_error("client_error", j, r, 0);
            return 1;
        }
        break;
    }
    json_t *out = gw_output(r);
    gw_output_scrub(out, &j->req);
    gw_output_scrub(out, &j->vreq);
    *out_text = json_to_string(out);
    *out_json = out;
    o->to = STEP_COMPLETED;
    return 1;
}

/* A finished job's outcome, with everything it needs to commit. */
struct gw_outcome {
    struct gw_job *job;
    struct step_outcome o;
    char *out_text, *err_text;
    struct decision *d;
    size_t nd;
    struct inline_plan plan;
};

/* The lock order of a drain's outcomes (store_tx_run_many_ordered). */
static const char *outcome_key(const void *arg)
{
    return ((const struct gw_outcome *)arg)->o.execution_id;
}

static int apply_one(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    return steps_apply(tx, &((struct gw_outcome *)arg)->o, e);
}

size_t engine_gw_drain(struct engine *g)
{
    pthread_mutex_lock(&g->gmu);
    struct gw_job *list = g->gw_done;
    g->gw_done = NULL;
    pthread_mutex_unlock(&g->gmu);
    size_t cap = 0, n = 0;
    for (struct gw_job *j = list; j; j = j->next)
        cap++;
    if (!cap)
        return 0;
    note_responses(g, list);
    struct gw_outcome *outs = xcalloc(cap, sizeof *outs);
    char mark[256]; /* what a crash while evaluating the response records */
    /* the secrets of the workspace of the last job, as read for this batch */
    struct {
        char *ws, **names, **values;
        size_t n;
        int ok;
    } now = {0};
    for (struct gw_job *j = list, *next; j; j = next, crashmark_leave()) {
        next = j->next;
        /* The request was rendered with the secrets as they were (on
         * PostgreSQL up to --shared-cache-ms before, from the cache); a
         * secret PUT since — by another process too — is added as read now,
         * once per workspace of the batch (found by a judge: a TRANSFORM
         * decoding an echo of a value rotated elsewhere stored it plain). */
        if (!now.ws || strcmp(now.ws, j->workspace) != 0) {
            engine_secrets_release(now.names, now.values, now.n);
            free(now.ws);
            now.ws = xstrdup(j->workspace);
            now.names = now.values = NULL;
            now.n = 0;
            now.ok = engine_secrets_now(g, j->workspace, &now.names, &now.values, &now.n) == 0;
        }
        j->scrub_now = now.ok;
        if (now.ok)
            gw_request_scrub_also(&j->req, now.values, now.n);
        engine_crash_mark(mark, sizeof mark, j->execution_id, j->vertex, j->epoch, STEPS_RESPONDED);
        crashmark_enter(mark);
        struct gw_outcome *go = &outs[n];
        go->o = (struct step_outcome){0};
        /* A provider that echoes a secret must not get it stored or shown. */
        gw_response_scrub(j->resp, &j->req);
        gw_response_scrub(j->resp, &j->vreq);
        if (stopped_mid_call(j)) {
            log_info("step.stopped_mid_call",
                     "%s/%s epoch %lld: the stop ended the call before its answer came; the "
                     "step is recovered as after a crash",
                     j->execution_id, j->vertex, (long long)j->epoch);
            inflight_remove(j);
            job_free(j);
            continue;
        }
        json_t *out = NULL;
        if (!decide(j, &go->o, &go->out_text, &out, &go->err_text))
            continue; /* another call is in flight for this job */
        inflight_remove(j);
        FAULT("gateway.after_response");
        go->job = j;
        go->o.w = j->w;
        go->o.workspace = j->workspace;
        go->o.execution_id = j->execution_id;
        go->o.vertex = j->vertex;
        go->o.epoch = j->epoch;
        go->o.from = STEP_EXECUTING;
        go->o.output = go->out_text;
        go->o.error = go->err_text;
        go->o.now = clock_now_ms();
        if (go->o.to == STEP_COMPLETED) {
            go->nd = j->w->v[j->vi].n_out;
            go->d = engine_decide_edges(j->w, j->vi, j->ctx, out);
            go->o.dec = go->d;
            json_decref(out);
            engine_inline_plan(g, j->workspace, j->w, j->vi, j->attempts, go->d, j->ctx, j->rows,
                               j->nrows, j->scrub_now ? &j->req : NULL, &go->plan);
        }
        /* the request's scrub list holds every secret of the workspace */
        engine_errors_scrub(g, j->workspace, &j->req, &go->err_text, go->d, go->nd, &go->plan);
        go->o.error = go->err_text;
        if (go->o.to == STEP_COMPLETED)
            engine_inline_attach(g, &go->plan, &go->o, g->worker_prefix);
        n++;
    }
    engine_secrets_release(now.names, now.values, now.n);
    free(now.ws);
    void **args = xcalloc(n + 1, sizeof *args);
    int *rcs = xcalloc(n + 1, sizeof *rcs);
    struct ifl_err *errs = xcalloc(n + 1, sizeof *errs);
    for (size_t i = 0; i < n; i++)
        args[i] = &outs[i];
    store_tx_run_many_ordered(g->store, apply_one, args, outcome_key, n, rcs, errs);
    int wake = 0;
    for (size_t i = 0; i < n; i++) {
        struct gw_outcome *go = &outs[i];
        if (rcs[i] == IFL_ECONFLICT)
            rcs[i] = store_tx_run(g->store, apply_one, go, &errs[i]);
        if (rcs[i])
            log_error("gateway.complete_failed", "%s/%s: %s", go->o.execution_id, go->o.vertex,
                      errs[i].msg);
        else if (go->o.fenced) {
            atomic_fetch_add(&g->m.fenced_writes, 1);
            log_warn("step.fenced",
                     "%s/%s epoch %lld: the lease was taken over; this late outcome changed "
                     "nothing",
                     go->o.execution_id, go->o.vertex, (long long)go->o.epoch);
        } else {
            if (go->o.to == STEP_COMPLETED && !go->o.over_budget)
                atomic_fetch_add(&g->m.steps_completed, 1);
            else if (go->o.to != STEP_DISPATCHED)
                atomic_fetch_add(&g->m.steps_failed, 1);
            wake |= go->o.dispatched;
            if (go->o.status_changed)
                engine_execution_moved(g, go->o.execution_id, go->o.status);
            engine_inline_done(g, &go->plan, &go->o);
            if (go->o.to == STEP_COMPLETED || go->o.to == STEP_FAILED)
                engine_trace(
                    g, go->o.to == STEP_COMPLETED && !go->o.over_budget ? "completed" : "failed",
                    go->o.execution_id, go->o.vertex, go->o.epoch);
        }
        engine_decisions_free(go->d, go->nd);
        engine_inline_clear(&go->plan);
        free(go->out_text);
        free(go->err_text);
        job_free(go->job);
    }
    if (wake)
        engine_wake(g);
    free(outs);
    free(args);
    free(rcs);
    free(errs);
    return n;
}
