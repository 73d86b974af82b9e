/*
 * runner — the worker pool and the lease sweeper (spec §5, layer 2).
 *
 * Workers claim DISPATCHED steps in batches (one transaction per batch),
 * execute them outside any transaction, and apply each outcome in one
 * transaction guarded by state and epoch (steps_apply).  They sleep on a
 * condition variable that engine_wake() signals after any commit that
 * dispatched work, with a timed wait for the earliest scheduled step, so
 * new work is picked up without polling delays.
 *
 * The sweeper recovers steps whose lease expired: a TRANSFORM is simply
 * re-dispatched (it has no effect outside the engine); a GATEWAY's outcome
 * is unknown, so it is parked as REQUIRES_RECONCILIATION until the GATEWAY
 * layer (idempotency keys, verify) takes over that decision.
 *
 * Fault points (docs/faults.md): step.after_claim, step.before_complete,
 * step.after_complete_commit, sweeper.before_recover.
 */
#include "base/clock.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/engine_int.h"
#include "expr/template.h"
#include "json/json.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct worker_arg {
    struct engine *g;
    int index;
};

void engine_wake(struct engine *g)
{
    pthread_mutex_lock(&g->wmu);
    g->wake_seq++;
    pthread_cond_broadcast(&g->wcv);
    pthread_mutex_unlock(&g->wmu);
}

const struct engine_metrics *engine_metrics(const struct engine *g)
{
    return &g->m;
}

/* Waits until woken, stopping, or `until_ms` (wall clock) passes. */
static void idle_wait(struct engine *g, unsigned long seen, int64_t until_ms)
{
    pthread_mutex_lock(&g->wmu);
    if (!g->stopping && g->wake_seq == seen) {
        struct timespec ts;
        ts.tv_sec = (time_t)(until_ms / 1000);
        ts.tv_nsec = (long)(until_ms % 1000) * 1000000L;
        pthread_cond_timedwait(&g->wcv, &g->wmu, &ts);
    }
    pthread_mutex_unlock(&g->wmu);
}

static void trace(struct engine *g, const char *what, const struct store_claim *c)
{
    if (g->trace_fd < 0)
        return;
    char line[256];
    int n = snprintf(line, sizeof line, "%s %s %s %lld\n", what, c->execution_id, c->vertex,
                     (long long)c->epoch);
    if (n > 0 && (size_t)n < sizeof line && write(g->trace_fd, line, (size_t)n) != n)
        log_warn("trace.write", "cannot write the trace file");
}

struct secret_ctx {
    struct engine *g;
    const char *ws;
};

static int secret_lookup(void *ctx, const char *name, char **value)
{
    struct secret_ctx *sc = ctx;
    return engine_secret_get(sc->g, sc->ws, name, value, NULL);
}

/* Applies an outcome, retrying when a concurrent writer changed the rows. */
static int apply(struct engine *g, struct step_outcome *o, struct ifl_err *e)
{
    int rc;
    for (int attempt = 0;; attempt++) {
        rc = store_tx_run(g->store, steps_apply, o, e);
        if (rc != IFL_ECONFLICT || attempt == 5)
            break;
    }
    return rc;
}

static void count_status(struct engine *g, const char *status)
{
    if (strcmp(status, "completed") == 0)
        atomic_fetch_add(&g->m.executions_completed, 1);
    else if (strcmp(status, "failed") == 0)
        atomic_fetch_add(&g->m.executions_failed, 1);
}

/* Executes one claimed step and records its outcome. */
static void run_step(struct engine *g, const struct store_claim *c, int64_t claimed_at)
{
    struct ifl_err e = {0};
    struct store_execution x = {0};
    struct store_step *rows = NULL;
    size_t n = 0;
    const struct wf *w = NULL;
    json_t *ctx = NULL, *out = NULL;
    char *out_text = NULL, *err_text = NULL;
    struct decision *d = NULL;
    size_t nd = 0;
    int version = 0;

    FAULT("step.after_claim");
    trace(g, "run", c);
    if (clock_now_ms() - claimed_at > g->run.lease_ms / 2) {
        int ok = 0;
        if (store_lease_renew(g->store, c->execution_id, c->vertex, c->epoch,
                              clock_now_ms() + g->run.lease_ms, &ok, &e) ||
            !ok) {
            log_warn("step.lease_lost", "%s/%s epoch %lld: lease lost before start",
                     c->execution_id, c->vertex, (long long)c->epoch);
            return;
        }
    }
    if (store_execution_get(g->store, c->workspace, c->execution_id, &x, &e) ||
        store_steps_get(g->store, c->execution_id, &rows, &n, &e) ||
        engine_workflow_get(g, c->workspace, x.workflow, x.workflow_version, &w, &version, &e)) {
        log_error("step.load_failed", "%s/%s: %s", c->execution_id, c->vertex, e.msg);
        goto out; /* the lease will expire and the sweeper re-dispatches */
    }
    long vi = wf_vertex_index(w, c->vertex);
    enum step_state to = STEP_FAILED;
    if (vi < 0) {
        err_text = steps_error_json("unknown_vertex", "the workflow version has no such vertex");
    } else if (w->v[vi].type == WF_TRANSFORM) {
        ctx = engine_context(&x, rows, n);
        struct secret_ctx sc = {g, c->workspace};
        struct ifl_err te = {0};
        if (tmpl_eval(w->v[vi].output, ctx, secret_lookup, &sc, &out, &te) == 0) {
            to = STEP_COMPLETED;
            out_text = json_to_string(out ? out : json_null());
            if (!out_text) {
                to = STEP_FAILED;
                err_text = steps_error_json("invalid_output", "the output is not valid JSON");
            }
        } else {
            err_text = steps_error_json("expression_error", te.msg);
        }
    } else {
        err_text = steps_error_json("not_implemented",
                                    "GATEWAY steps are not executed by this version yet");
    }
    if (to == STEP_COMPLETED) {
        json_object_set(json_object_get(ctx, "steps"), c->vertex, out ? out : json_null());
        nd = w->v[vi].n_out;
        d = xcalloc(nd + 1, sizeof *d);
        json_object_set(ctx, "response", out ? out : json_null());
        for (size_t k = 0; k < nd; k++)
            engine_decide(w->e[w->v[vi].out[k]].cond, ctx, &d[k]);
    }
    FAULT("step.before_complete");
    struct step_outcome o = {
        .w = w,
        .workspace = c->workspace,
        .execution_id = c->execution_id,
        .vertex = c->vertex,
        .epoch = c->epoch,
        .from = STEP_EXECUTING,
        .to = to,
        .output = out_text,
        .error = err_text,
        .attempt_outcome = to == STEP_COMPLETED ? "completed" : "failed",
        .dec = d,
        .now = clock_now_ms(),
    };
    if (apply(g, &o, &e)) {
        log_error("step.complete_failed", "%s/%s: %s", c->execution_id, c->vertex, e.msg);
        goto out;
    }
    if (o.fenced) {
        atomic_fetch_add(&g->m.fenced_writes, 1);
        log_warn("step.fenced",
                 "%s/%s epoch %lld: the lease was taken over; this late outcome changed nothing",
                 c->execution_id, c->vertex, (long long)c->epoch);
        goto out;
    }
    trace(g, to == STEP_COMPLETED ? "completed" : "failed", c);
    atomic_fetch_add(to == STEP_COMPLETED ? &g->m.steps_completed : &g->m.steps_failed, 1);
    count_status(g, o.status);
    FAULT("step.after_complete_commit");
    if (o.dispatched)
        engine_wake(g);
out:
    if (d)
        for (size_t k = 0; k < nd; k++)
            free(d[k].error);
    free(d);
    json_decref(out);
    json_decref(ctx);
    free(out_text);
    free(err_text);
    store_steps_free(rows, n);
    store_execution_clear(&x);
}

static void *worker_main(void *arg)
{
    struct worker_arg *wa = arg;
    struct engine *g = wa->g;
    char name[128];
    snprintf(name, sizeof name, "%s/w%d", g->worker_prefix, wa->index);
    free(wa);
    for (;;) {
        pthread_mutex_lock(&g->wmu);
        int stop = g->stopping;
        unsigned long seen = g->wake_seq;
        pthread_mutex_unlock(&g->wmu);
        if (stop)
            break;
        struct store_claim *cl = NULL;
        size_t n = 0;
        struct ifl_err e = {0};
        int64_t now = clock_now_ms();
        if (store_claim(g->store, name, g->run.batch, now, g->run.lease_ms, &cl, &n, &e)) {
            log_error("worker.claim_failed", "%s", e.msg);
            idle_wait(g, seen, now + 500);
            continue;
        }
        if (n == 0) {
            int64_t due = INT64_MAX;
            store_next_due(g->store, &due, NULL);
            int64_t until = now + 1000;
            if (due < until)
                until = due > now ? due : now + 1;
            idle_wait(g, seen, until);
            continue;
        }
        atomic_fetch_add(&g->m.steps_claimed, n);
        for (size_t i = 0; i < n; i++)
            run_step(g, &cl[i], now);
        store_claims_free(cl, n);
    }
    return NULL;
}

/* Recovers expired (or, with now < 0, all) EXECUTING steps. */
static int recover(struct engine *g, int64_t now)
{
    struct store_step *rows = NULL;
    size_t n = 0;
    struct ifl_err e = {0};
    if (store_expired(g->store, now, 256, &rows, &n, &e)) {
        log_error("sweeper.failed", "%s", e.msg);
        return 0;
    }
    int recovered = 0;
    for (size_t i = 0; i < n; i++) {
        struct store_step *st = &rows[i];
        struct store_execution x;
        const struct wf *w = NULL;
        int version;
        if (store_execution_get(g->store, st->workspace, st->execution_id, &x, &e))
            continue;
        int rc = engine_workflow_get(g, st->workspace, x.workflow, x.workflow_version, &w,
                                     &version, &e);
        store_execution_clear(&x);
        if (rc)
            continue;
        int gateway = strcmp(st->kind, "GATEWAY") == 0;
        char *err = gateway ? steps_error_json("lease_expired_mid_call",
                                               "the worker stopped while the call was in flight; "
                                               "its outcome is unknown")
                            : NULL;
        FAULT("sweeper.before_recover");
        struct step_outcome o = {
            .w = w,
            .workspace = st->workspace,
            .execution_id = st->execution_id,
            .vertex = st->vertex,
            .epoch = st->epoch,
            .from = STEP_EXECUTING,
            .to = gateway ? STEP_REQUIRES_RECONCILIATION : STEP_DISPATCHED,
            .error = err,
            .attempt_outcome = "lease_expired",
            .now = clock_now_ms(),
        };
        if (apply(g, &o, &e) == 0 && !o.fenced) {
            recovered++;
            atomic_fetch_add(&g->m.steps_recovered, 1);
            log_warn("step.recovered", "%s/%s epoch %lld: lease expired; %s", st->execution_id,
                     st->vertex, (long long)st->epoch,
                     gateway ? "parked for reconciliation" : "re-dispatched");
        }
        free(err);
    }
    store_steps_free(rows, n);
    if (recovered)
        engine_wake(g);
    return recovered;
}

static void *sweeper_main(void *arg)
{
    struct engine *g = arg;
    int64_t period = g->run.lease_ms / 4;
    if (period < 20)
        period = 20;
    if (period > 2000)
        period = 2000;
    for (;;) {
        pthread_mutex_lock(&g->wmu);
        int stop = g->stopping;
        if (!stop) {
            int64_t until = clock_now_ms() + period;
            struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000L};
            pthread_cond_timedwait(&g->wcv, &g->wmu, &ts);
            stop = g->stopping;
        }
        pthread_mutex_unlock(&g->wmu);
        if (stop)
            break;
        recover(g, clock_now_ms());
    }
    return NULL;
}

int engine_start(struct engine *g, const struct engine_run_opts *o, struct ifl_err *e)
{
    if (g->started)
        return 0;
    g->run = *o;
    if (g->run.workers <= 0)
        g->run.workers = 2;
    if (g->run.lease_ms <= 0)
        g->run.lease_ms = 15000;
    if (g->run.batch <= 0)
        g->run.batch = 16;
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(g->worker_prefix, sizeof g->worker_prefix, "%s:%ld", host, (long)getpid());
    const char *trace_path = getenv("IDEMFLOW_TRACE_FILE");
    if (trace_path && *trace_path) {
        g->trace_fd = open(trace_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (g->trace_fd < 0)
            return err_set(e, IFL_EIO, "cannot open IDEMFLOW_TRACE_FILE %s", trace_path);
    }
    /* SQLite: the database lock proves no other process runs these steps,
     * so every step left EXECUTING belonged to a dead process. */
    if (strcmp(store_backend(g->store), "sqlite") == 0) {
        int total = 0, k;
        while ((k = recover(g, -1)) > 0)
            total += k;
        if (total)
            log_info("engine.recovered", "recovered %d steps left executing", total);
    }
    g->stopping = 0;
    g->workers = xcalloc((size_t)g->run.workers, sizeof *g->workers);
    for (int i = 0; i < g->run.workers; i++) {
        struct worker_arg *wa = xmalloc(sizeof *wa);
        wa->g = g;
        wa->index = i;
        if (pthread_create(&g->workers[i], NULL, worker_main, wa) != 0) {
            free(wa);
            g->run.workers = i;
            engine_stop(g);
            return err_set(e, IFL_EIO, "cannot start worker threads");
        }
    }
    if (pthread_create(&g->sweeper, NULL, sweeper_main, g) != 0) {
        engine_stop(g);
        return err_set(e, IFL_EIO, "cannot start the sweeper thread");
    }
    g->started = 1;
    return 0;
}

void engine_stop(struct engine *g)
{
    if (!g->workers)
        return;
    pthread_mutex_lock(&g->wmu);
    g->stopping = 1;
    pthread_cond_broadcast(&g->wcv);
    pthread_mutex_unlock(&g->wmu);
    for (int i = 0; i < g->run.workers; i++)
        pthread_join(g->workers[i], NULL);
    if (g->started)
        pthread_join(g->sweeper, NULL);
    free(g->workers);
    g->workers = NULL;
    g->started = 0;
    if (g->trace_fd >= 0)
        close(g->trace_fd);
    g->trace_fd = -1;
}
