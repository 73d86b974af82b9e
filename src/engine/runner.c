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
 * re-dispatched (it has no effect outside the engine) — unless evaluating
 * it crashed the process on its last MAX_LEASE_EXPIRIES attempts, when it
 * fails instead; a GATEWAY's outcome is unknown, so its `ambiguous` policy
 * decides (re-send with the key, verify, or park) — unless rendering its
 * request or handling its response crashed the process on its last
 * MAX_EVAL_CRASHES attempts, when it fails too.  A crash is told from a
 * kill by the crash markers (base/crashmark.h) the crashed process left,
 * which engine_start turns into notes on the attempts before recovering;
 * kills never fail a step.
 *
 * Fault points (docs/faults.md): step.after_claim, step.before_complete,
 * step.after_complete_commit, sweeper.before_recover.
 */
#include "base/clock.h"
#include "base/crashmark.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/engine_int.h"
#include "expr/template.h"
#include "json/json.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
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

static void wake(struct engine *g, int work)
{
    pthread_mutex_lock(&g->wmu);
    g->wake_seq++;
    g->work_seq += (unsigned long)work;
    pthread_cond_broadcast(&g->wcv);
    pthread_mutex_unlock(&g->wmu);
}

void engine_wake(struct engine *g)
{
    wake(g, 1);
}

void engine_wake_drain(struct engine *g)
{
    wake(g, 0);
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
        clock_abstime(until_ms, &ts);
        pthread_cond_timedwait(&g->wcv, &g->wmu, &ts);
    }
    pthread_mutex_unlock(&g->wmu);
}

static void trace(struct engine *g, const char *what, const struct store_claim *c)
{
    engine_trace(g, what, c->execution_id, c->vertex, c->epoch);
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

void engine_count_status(struct engine *g, const char *status)
{
    if (strcmp(status, "completed") == 0)
        atomic_fetch_add(&g->m.executions_completed, 1);
    else if (strcmp(status, "failed") == 0)
        atomic_fetch_add(&g->m.executions_failed, 1);
    else if (strcmp(status, "requires_reconciliation") == 0)
        atomic_fetch_add(&g->m.executions_reconcile, 1);
}

/* One claimed step between its execution and its committed outcome. */
struct pending {
    const struct store_claim *c;
    const struct wf *w; /* its workflow version: a reference (engine_workflow_get) */
    struct step_outcome o;
    int ready; /* an outcome to commit (0: loading failed; the lease will expire) */
    struct store_execution x;
    struct store_step *rows;
    size_t n;
    json_t *ctx, *out;
    char *out_text, *err_text;
    struct decision *d;
    size_t nd;
    struct inline_plan plan;
    /* A GATEWAY's call, prepared (its request rendered) and launched once
     * the batch's `rendering` notes are cleared (run_batch). */
    struct gw_job *job;
    int noted;
    int64_t leased_at; /* when its lease was last set: the claim, or a renewal */
    int lost;          /* a renewal found it taken over */
    char mark[256];    /* what a crash while executing it records (crashmark) */
};

static void pending_clear(struct pending *p)
{
    engine_inline_clear(&p->plan);
    engine_decisions_free(p->d, p->nd);
    json_decref(p->out);
    json_decref(p->ctx);
    free(p->out_text);
    free(p->err_text);
    store_steps_free(p->rows, p->n);
    store_execution_clear(&p->x);
    wf_release(p->w);
    p->w = NULL;
}

/* Runs one claimed step's body and prepares its outcome (no writes). */
/* Past half its lease, a claimed step not yet run has its lease renewed
 * (fenced by its epoch): 0, or -1 when it was taken over meanwhile. */
static int keep_lease(struct engine *g, struct pending *p)
{
    const struct store_claim *c = p->c;
    int64_t now = clock_now_ms();
    if (p->lost)
        return -1;
    if (now - p->leased_at <= g->run.lease_ms / 2)
        return 0;
    int ok = 0;
    struct ifl_err e = {0};
    if (store_lease_renew(g->store, c->execution_id, c->vertex, c->epoch, now,
                          now + g->run.lease_ms, &ok, &e) ||
        !ok) {
        log_warn("step.lease_lost", "%s/%s epoch %lld: lease lost before start", c->execution_id,
                 c->vertex, (long long)c->epoch);
        p->lost = 1;
        return -1;
    }
    p->leased_at = now;
    return 0;
}

static void execute(struct engine *g, struct pending *p, const char *worker)
{
    const struct store_claim *c = p->c;
    struct ifl_err e = {0};
    int version = 0;

    FAULT("step.after_claim");
    if (keep_lease(g, p))
        return;
    if (store_execution_load(g->store, c->workspace, c->execution_id, &p->x, &p->rows, &p->n, &e) ||
        engine_workflow_get(g, c->workspace, p->x.workflow, p->x.workflow_version, &p->w, &version,
                            &e)) {
        log_error("step.load_failed", "%s/%s: %s", c->execution_id, c->vertex, e.msg);
        return; /* the lease will expire and the sweeper re-dispatches */
    }
    const struct wf *w = p->w;
    /* only a body that runs (found by a judge: a claim that lost its lease
     * before it started left a `run` line after the step's completion) */
    trace(g, "run", c);
    long vi = wf_vertex_index(w, c->vertex);
    enum step_state to = STEP_FAILED;
    int64_t run_at = 0;
    int unclaim = 0;
    if (vi < 0) {
        p->err_text = steps_error_json("unknown_vertex", "the workflow version has no such vertex");
    } else if (w->v[vi].type == WF_GATEWAY) {
        p->ctx = engine_context(&p->x, p->rows, p->n);
        int64_t again_at = 0;
        p->job = engine_gw_prepare(g, c, w, vi, p->ctx, &p->rows, &p->n, &p->err_text, &again_at);
        if (p->job) {
            /* The call adds to its context on whichever worker drains it:
             * no reference may stay here (one dropped later, on this
             * thread, raced with those writes). */
            json_decref(p->ctx);
            p->ctx = NULL;
            return; /* launched by run_batch; the outcome comes when the call ends */
        }
        if (again_at) { /* nothing sent, nothing wrong with the step: again later */
            to = STEP_DISPATCHED;
            run_at = again_at;
            unclaim = 1;
        }
    } else if (w->v[vi].type == WF_ENTRY_POINT) {
        /* left by its trigger, whose time ran out deciding its edges
         * (prepare_steps): its output is the payload, as at a trigger */
        p->ctx = engine_context(&p->x, p->rows, p->n);
        p->out = json_incref(json_object_get(p->ctx, "payload"));
        p->out_text = xstrdup(p->x.payload);
        to = STEP_COMPLETED;
    } else if (w->v[vi].type == WF_TRANSFORM) {
        p->ctx = engine_context(&p->x, p->rows, p->n);
        if (engine_transform_eval(g, c->workspace, w, vi, p->ctx, NULL, &p->out, &p->out_text,
                                  &p->err_text) == 0)
            to = STEP_COMPLETED;
    }
    if (to == STEP_COMPLETED) {
        p->nd = w->v[vi].n_out;
        p->d = engine_decide_edges(w, vi, p->ctx, p->out);
        engine_inline_plan(g, c->workspace, w, vi, c->attempts, p->d, p->ctx, p->rows, p->n, NULL,
                           &p->plan);
    }
    engine_errors_scrub(g, c->workspace, NULL, &p->err_text, p->d, p->nd, &p->plan);
    p->o = (struct step_outcome){
        .w = w,
        .workspace = c->workspace,
        .execution_id = c->execution_id,
        .vertex = c->vertex,
        .epoch = c->epoch,
        .from = STEP_EXECUTING,
        .to = to,
        .output = p->out_text,
        .error = p->err_text,
        .attempt_outcome = to == STEP_COMPLETED ? "completed" : "failed",
        .run_at = run_at,
        .unclaim = unclaim,
        .dec = p->d,
        .now = clock_now_ms(),
    };
    engine_inline_attach(g, &p->plan, &p->o, worker);
    p->ready = 1;
}

/* A GATEWAY claimed again (a retry, a recovery) is noted `rendering` on its
 * attempt while its request is rendered, so that a recovery can tell a
 * crash in its templates from a death mid-call (MAX_EVAL_CRASHES).  The
 * claim's own transaction writes the note (store_claim_noted); this clears
 * it on the calls about to leave, once the batch ran.  A claim that sends
 * nothing keeps it: an outcome finishes its attempt, or it stopped early
 * (its lease lost, a read failed), and its recovery knows nothing left. */
static void clear_notes(struct engine *g, struct pending *p, size_t n)
{
    struct attempt_note *v = xcalloc(n, sizeof *v);
    size_t *of = xcalloc(n, sizeof *of);
    int *failed = xcalloc(n, sizeof *failed);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (p[i].noted && p[i].job) {
            of[k] = i;
            v[k++] =
                (struct attempt_note){p[i].c->execution_id, p[i].c->vertex, p[i].c->epoch, NULL};
        }
    engine_note_attempts_checked(g, v, k, failed);
    /* A call whose note stays `rendering` must not leave: a recovery reads
     * that note as "never sent" and sends it again, even under `reconcile`.
     * It is dropped, and its lease left to expire: recovered as one that
     * died rendering, which it is. */
    for (size_t j = 0; j < k; j++)
        if (failed[j] && p[of[j]].job) {
            log_warn("step.not_launched",
                     "%s/%s epoch %lld: its attempt's note could not be cleared; not sent, "
                     "recovered when its lease expires",
                     p[of[j]].c->execution_id, p[of[j]].c->vertex, (long long)p[of[j]].c->epoch);
            engine_gw_discard(p[of[j]].job);
            p[of[j]].job = NULL;
        }
    free(failed);
    free(of);
    free(v);
}

/* The lock order of a batch's outcomes (store_tx_run_many_ordered). */
static const char *outcome_key(const void *arg)
{
    return ((const struct step_outcome *)arg)->execution_id;
}

/* A batch's steps run in slices of at most this long: each slice's outcomes
 * are committed together, and the calls that finished meanwhile drained,
 * before the next slice runs.  Sixteen slow TRANSFORMs (an expression may
 * take a second) would otherwise hold their first outcome past its lease,
 * and every finished call's behind it (found by a judge: one workspace's
 * slow steps parked another's answered call as lease_expired_mid_call). */
#define SLICE_MS 250
/* … and of at most this many bytes of stored outputs read: each step reads
 * its whole execution (payload, every output) and keeps it, parsed, until
 * its outcome commits — fifteen steps of an execution holding 16 MiB of
 * outputs held half a gigabyte (found by a judge). */
#define SLICE_BYTES ((size_t)32 << 20)

/* How many steps a worker claims next, after a batch of n took `took` ms:
 * a claimed step waits for those before it in its batch, so a worker
 * claims about a slice's worth (at least one) and leaves the rest
 * claimable by the others — with the claim's turns across workspaces
 * (store_claim), one workspace's queue of slow steps then delays
 * another's step by about a step, not by a batch.  It starts at one (and
 * again after a claim that found nothing: the next steps may be slow) and
 * at most doubles a batch, up to the configured size. */
static int next_cap(const struct engine *g, int cap, size_t n, int64_t took)
{
    int64_t fit = took > 0 ? SLICE_MS * (int64_t)n / took : INT64_MAX;
    int64_t next = cap * 2 < g->run.batch ? cap * 2 : g->run.batch;
    if (fit < next)
        next = fit;
    return next < 1 ? 1 : (int)next;
}

/* The stored text a pending step read (its execution's payload and rows). */
static size_t pending_bytes(const struct pending *p)
{
    size_t n = p->x.payload ? strlen(p->x.payload) : 0;
    for (size_t i = 0; p->rows && i < p->n; i++)
        n += (p->rows[i].output ? strlen(p->rows[i].output) : 0) +
             (p->rows[i].error ? strlen(p->rows[i].error) : 0);
    return n;
}

/* Commits the outcomes of the executed steps p[0..n) (one group commit,
 * each outcome its own guarded transaction), after launching their calls. */
static void commit_slice(struct engine *g, struct pending *p, size_t n)
{
    void **args = xcalloc(n, sizeof *args);
    int *rcs = xcalloc(n, sizeof *rcs);
    struct ifl_err *errs = xcalloc(n, sizeof *errs);
    int noted = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        noted |= p[i].noted;
        if (p[i].ready)
            args[k++] = &p[i].o;
    }
    /* Lease first: a call dropped here never left, and keeps its note
     * (found by a reviewer: cleared, its recovery parked it as unknown). */
    for (size_t i = 0; i < n; i++)
        if (p[i].job && !engine_gw_hold(p[i].job, p[i].leased_at))
            p[i].job = NULL;
    if (noted) /* rendered: a death from now on is one mid-call */
        clear_notes(g, p, n);
    for (size_t i = 0; i < n; i++)
        if (p[i].job)
            engine_gw_send(p[i].job);
    store_tx_run_many_ordered(g->store, steps_apply, args, outcome_key, k, rcs, errs);
    int wake = 0;
    for (size_t i = 0; i < k; i++) {
        struct step_outcome *o = args[i];
        struct pending *pp = (struct pending *)((char *)o - offsetof(struct pending, o));
        const struct store_claim *c = pp->c;
        if (rcs[i] == IFL_ECONFLICT)
            rcs[i] = apply(g, o, &errs[i]); /* a concurrent writer: retry alone */
        if (rcs[i]) {
            log_error("step.complete_failed", "%s/%s: %s", c->execution_id, c->vertex, errs[i].msg);
            continue;
        }
        if (o->fenced) {
            atomic_fetch_add(&g->m.fenced_writes, 1);
            log_warn("step.fenced",
                     "%s/%s epoch %lld: the lease was taken over; this late outcome changed "
                     "nothing",
                     c->execution_id, c->vertex, (long long)c->epoch);
            continue;
        }
        int ok = o->to == STEP_COMPLETED && !o->over_budget;
        if (!o->unclaim) { /* a claim taken back neither completed nor failed */
            trace(g, ok ? "completed" : "failed", c);
            atomic_fetch_add(ok ? &g->m.steps_completed : &g->m.steps_failed, 1);
        }
        if (o->status_changed)
            engine_execution_moved(g, c->execution_id, o->status);
        engine_inline_done(g, &pp->plan, o);
        wake |= o->dispatched;
        FAULT("step.after_complete_commit");
    }
    if (wake)
        engine_wake(g);
    free(args);
    free(rcs);
    free(errs);
}

/* Runs a batch of claimed steps, a slice at a time (SLICE_MS). */
static void run_batch(struct engine *g, const struct store_claim *cl, size_t n, int64_t claimed_at,
                      const char *worker)
{
    struct pending *p = xcalloc(n, sizeof *p);
    for (size_t i = 0; i < n; i++) {
        p[i].c = &cl[i];
        p[i].noted = strcmp(cl[i].kind, "GATEWAY") == 0 && STORE_CLAIM_NOTED(&cl[i]);
        p[i].leased_at = claimed_at;
    }
    for (size_t from = 0, i = 0; from < n; from = i) {
        int64_t t0 = clock_mono_ms();
        size_t bytes = 0;
        /* the steps still to run keep their leases (each renewed past half
         * of it; execute checks it again as it starts one) */
        for (size_t k = i; from > 0 && k < n; k++)
            keep_lease(g, &p[k]);
        do {
            engine_crash_mark(p[i].mark, sizeof p[i].mark, cl[i].execution_id, cl[i].vertex,
                              cl[i].epoch,
                              strcmp(cl[i].kind, "GATEWAY") == 0 ? STEPS_RENDERING : STEPS_RUNNING);
            crashmark_enter(p[i].mark);
            execute(g, &p[i], worker);
            crashmark_leave();
            if (p[i].ready)
                FAULT("step.before_complete");
            bytes += pending_bytes(&p[i]);
            i++;
        } while (i < n && clock_mono_ms() - t0 < SLICE_MS && bytes < SLICE_BYTES);
        commit_slice(g, p + from, i - from);
        for (size_t k = from; k < i; k++) /* committed: what they read goes now */
            pending_clear(&p[k]);
        if (i < n)
            engine_gw_drain(g);
    }
    free(p);
}

static void *worker_main(void *arg)
{
    struct worker_arg *wa = arg;
    struct engine *g = wa->g;
    char name[128];
    snprintf(name, sizeof name, "%s/w%d", g->worker_prefix, wa->index);
    char tname[16];
    snprintf(tname, sizeof tname, "worker-%d", wa->index);
    pthread_setname_np(pthread_self(), tname);
    crashmark_thread_init(); /* a stack overflow while evaluating is recorded too */
    free(wa);
    /* After a claim that found nothing: the work_seq it saw and when to look
     * again regardless (the next due step, or a second).  Until then only
     * an engine_wake (work_seq moves) makes a claim worth a transaction;
     * wake-ups for finished calls (engine_wake_drain) do not.  Looking
     * again is first a read of the next due time (one index seek): the
     * claim's walk, a seek per workspace with steps waiting, runs only
     * once something is due, so an idle worker no longer laps every
     * waiting workspace each second (found by a judge: 1,500 workspaces in
     * backoff, three engines of four workers, 9–18k seeks a second).
     * Work from another process shows up there as well: its rows are due. */
    unsigned long empty_work = 0;
    int64_t empty_until = INT64_MIN;
    int cap = 1; /* next_cap; after an empty claim, 1 again */
    for (;;) {
        pthread_mutex_lock(&g->wmu);
        int stop = g->stopping;
        unsigned long seen = g->wake_seq;
        unsigned long work = g->work_seq;
        pthread_mutex_unlock(&g->wmu);
        if (stop)
            break;
        engine_gw_drain(g);
        int room = g->run.max_calls - engine_gw_inflight(g);
        int limit = room < cap ? room : cap;
        struct store_claim *cl = NULL;
        size_t n = 0;
        struct ifl_err e = {0};
        int64_t now = clock_now_ms();
        if (limit <= 0) {
            idle_wait(g, seen, now + 1000); /* calls in flight will wake us */
            continue;
        }
        if (work == empty_work && empty_until != INT64_MIN) {
            if (now < empty_until) {
                idle_wait(g, seen, empty_until); /* nothing new to claim */
                continue;
            }
            int64_t due = INT64_MAX;
            if (store_next_due(g->store, &due, NULL) == 0 && due > now) {
                empty_until = due < now + 1000 ? due : now + 1000;
                idle_wait(g, seen, empty_until); /* nothing due yet */
                continue;
            }
        }
        int more = 0;
        if (store_claim_noted(g->store, name, limit, now, g->run.lease_ms, STEPS_RENDERING, &cl, &n,
                              &more, &e)) {
            log_error("worker.claim_failed", "%s", e.msg);
            idle_wait(g, seen, now + 500);
            continue;
        }
        atomic_fetch_add(n ? &g->m.claims_found : &g->m.claims_empty, 1);
        if (n == 0 && more)
            continue; /* the walk goes on where it stopped */
        if (n == 0) {
            cap = 1;
            int64_t due = INT64_MAX;
            store_next_due(g->store, &due, NULL);
            int64_t until = now + 1000;
            if (due < until)
                until = due > now ? due : now + 20; /* due but locked elsewhere */
            empty_work = work;
            empty_until = until;
            idle_wait(g, seen, until);
            continue;
        }
        empty_until = INT64_MIN;
        atomic_fetch_add(&g->m.steps_claimed, n);
        int64_t t0 = clock_mono_ms();
        run_batch(g, cl, n, now, name);
        cap = next_cap(g, cap, n, clock_mono_ms() - t0);
        store_claims_free(cl, n);
    }
    crashmark_thread_done();
    return NULL;
}

/* A TRANSFORM whose evaluation crashed the process this many times in a row
 * is failed instead of re-dispatched: re-running it at every start would
 * never let the engine stay up.  Only crashes count — a worker that died
 * with a crash marker naming the step (base/crashmark.h, collected at the
 * next start) — never kills: an operator's or a judge's SIGKILL may land on
 * the same step any number of times, and the step must still complete. */
#define MAX_LEASE_EXPIRIES 3

/* A GATEWAY claimed again (a retry, a recovery) notes "rendering" on its
 * attempt while its request is rendered (from its claim on, cleared in
 * run_batch), and one re-sent after a lease expiry notes "responded" when
 * its response arrives, before anything evaluates it (gwstep.c); a death
 * under a note is named after it (lease_expired_while_rendering, …_after_
 * response).  When the worker crashed there — a crash marker names the
 * attempt: its templates, edge conditions or `doneWhen` stopped the process
 * — the attempt ends `crashed_while_rendering` or `crashed_after_response`,
 * and after this many crashes in a row the step fails instead of being
 * tried again at every start.  A kill (no marker) never counts.  `retry`
 * sends the call again, with its key, once the cause is fixed. */
#define MAX_EVAL_CRASHES 3

/* How a GATEWAY's worker died, from its attempt's note. */
enum death { DIED_MID_CALL, DIED_RENDERING, DIED_AFTER_RESPONSE };

/* The outcome of an attempt whose worker died: [crashed][death]. */
static const char *const death_outcome[2][3] = {
    {[DIED_MID_CALL] = "lease_expired",
     [DIED_RENDERING] = STEPS_LEASE_EXPIRED_WHILE_RENDERING,
     [DIED_AFTER_RESPONSE] = STEPS_LEASE_EXPIRED_AFTER_RESPONSE},
    {[DIED_MID_CALL] = STEPS_CRASHED,
     [DIED_RENDERING] = STEPS_CRASHED_WHILE_RENDERING,
     [DIED_AFTER_RESPONSE] = STEPS_CRASHED_AFTER_RESPONSE},
};

/* Whether an attempt that ended in `outcome` crashed the process while
 * evaluating (a crash marker named it). */
static int died_evaluating(const char *outcome)
{
    return outcome && (strcmp(outcome, STEPS_CRASHED) == 0 ||
                       strcmp(outcome, STEPS_CRASHED_WHILE_RENDERING) == 0 ||
                       strcmp(outcome, STEPS_CRASHED_AFTER_RESPONSE) == 0);
}

/* Reads the step's attempt history: *death, *crashed and *started, from the
 * attempt at `epoch` (the one that just expired: its note, its start), and when its retry
 * budget started (*budget_from, engine_gw_budget: a first attempt's
 * recovery counts its deadline from that attempt, found by a reviewer);
 * returns how many attempts before it, counting back, crashed while
 * evaluating (another outcome stops the count); -1 when it cannot be read. */
static int attempt_history(struct engine *g, const struct store_step *st, int gateway,
                           enum death *death, int *crashed, int64_t *budget_from, int64_t *started)
{
    struct store_attempt *a = NULL;
    size_t n = 0;
    int made;
    *death = DIED_MID_CALL;
    *crashed = 0;
    *budget_from = *started = clock_now_ms();
    struct ifl_err e = {0};
    if (FAULT_FAILS("sweeper.history_read")
            ? err_set(&e, IFL_ESTORE, "fault point sweeper.history_read")
            : store_attempts_get(g->store, st->execution_id, &a, &n, &e)) {
        log_warn("step.history_unread", "%s/%s: the step's attempts cannot be read: %s",
                 st->execution_id, st->vertex, e.msg);
        return -1;
    }
    engine_gw_budget(a, n, st->vertex, st->attempts, &made, budget_from);
    int count = 0;
    for (int64_t ep = st->epoch; ep >= 1; ep--) {
        const struct store_attempt *hit = NULL;
        for (size_t i = 0; i < n && !hit; i++)
            if (a[i].epoch == ep && strcmp(a[i].vertex, st->vertex) == 0)
                hit = &a[i];
        if (!hit)
            continue; /* an epoch without an attempt row (an operator's action) */
        if (ep == st->epoch) {
            *started = hit->started_at;
            const char *note = hit->outcome ? hit->outcome : "";
            if (strncmp(note, STEPS_CRASH_NOTE_PREFIX, strlen(STEPS_CRASH_NOTE_PREFIX)) == 0) {
                *crashed = 1;
                note += strlen(STEPS_CRASH_NOTE_PREFIX);
            }
            if (gateway && strcmp(note, STEPS_RENDERING) == 0)
                *death = DIED_RENDERING;
            else if (gateway && strcmp(note, STEPS_RESPONDED) == 0)
                *death = DIED_AFTER_RESPONSE;
            continue;
        }
        if (!died_evaluating(hit->outcome))
            break;
        count++;
    }
    store_attempts_free(a, n);
    return count;
}

/* The error a recovery leaves on a GATEWAY it re-dispatches (JSON text). */
static char *gateway_expiry_error(enum death d, enum gw_ambiguous amb, int crashed,
                                  int verify_before, int64_t not_before)
{
    static const char *const why[] = {
        [DIED_MID_CALL] = "the worker stopped while the call was in flight; its outcome is "
                          "unknown",
        [DIED_RENDERING] = "the worker stopped while rendering the request",
        [DIED_AFTER_RESPONSE] = "the worker stopped after the call's response arrived, before "
                                "its outcome was stored",
    };
    json_t *ej = json_pack("{s:s,s:s}", "code",
                           d == DIED_MID_CALL ? STEPS_LEASE_EXPIRED_MID_CALL : death_outcome[0][d],
                           "message", why[d]);
    /* under `verify`; or, whatever the policy, when the attempt before left
     * the call's effect unknown and this one, dead while rendering, sent
     * nothing that settled it (an operator's retry of a parked call) */
    if (amb == GW_AMB_VERIFY || (verify_before && d == DIED_RENDERING))
        json_object_set_new(ej, "verifyFirst", json_true());
    steps_error_set_not_before(ej, not_before); /* for any verify: a retry's, an operator's */
    if (crashed) /* the process crashed there (a crash marker), not killed */
        json_object_set_new(ej, "crashed", json_true());
    char *err = json_to_string(ej);
    json_decref(ej);
    return err;
}

/* The error of a step failed because evaluating it kept stopping the
 * process (JSON text). */
static char *poison_error(int gateway, int expiries, int verify_first, int64_t not_before)
{
    json_t *ej = json_pack(
        "{s:s,s:s,s:i}", "code", STEPS_LEASE_EXPIRED_REPEATEDLY, "message",
        gateway ? "the process crashed each time it rendered this call's request or handled its "
                  "response; failed so that it cannot stop the engine again.  Once the cause "
                  "is fixed, retry sends the call again with its key"
                : "the process crashed each time it ran this step; failed so that it cannot "
                  "stop the engine again",
        "expiries", expiries);
    if (verify_first) /* it may have been sent: an operator's retry verifies first */
        json_object_set_new(ej, "verifyFirst", json_true());
    steps_error_set_not_before(ej, not_before);
    char *err = json_to_string(ej);
    json_decref(ej);
    return err;
}

void engine_crash_mark(char *buf, size_t cap, const char *xid, const char *vertex, int64_t epoch,
                       const char *phase)
{
    snprintf(buf, cap, "%s %s %lld %s", xid, vertex, (long long)epoch, phase);
}

int engine_crash_parse(char *line, struct engine_crash *out)
{
    char *f[4], *p = line;
    for (int i = 0; i < 4; i++) { /* four space-separated fields */
        f[i] = p;
        p = strchr(p, ' ');
        if ((i < 3) != (p != NULL))
            return -1;
        if (p)
            *p++ = '\0';
    }
    char *end = NULL;
    errno = 0;
    long long epoch = strtoll(f[2], &end, 10);
    if (!isdigit((unsigned char)f[2][0]) || errno || *end || epoch < 1 || strlen(f[0]) != 64 ||
        !*f[1])
        return -1;
    if (strcmp(f[3], STEPS_RENDERING) != 0 && strcmp(f[3], STEPS_RESPONDED) != 0 &&
        strcmp(f[3], STEPS_RUNNING) != 0)
        return -1;
    *out = (struct engine_crash){.xid = f[0], .vertex = f[1], .phase = f[3], .epoch = epoch};
    return 0;
}

/* The notes collected from crash markers; their strings are owned here. */
struct crash_notes {
    struct attempt_note *v;
    size_t n, cap;
};

/* One marker line: a note "crashed:PHASE" on that attempt (written only
 * while it is still running: store_tx_attempt_note). */
static void crash_line(void *arg, const char *line)
{
    struct crash_notes *cn = arg;
    char buf[512];
    struct engine_crash c;
    snprintf(buf, sizeof buf, "%s", line);
    if (engine_crash_parse(buf, &c))
        return; /* a torn or foreign line: skipped */
    if (cn->n == cn->cap) {
        cn->cap = cn->cap ? cn->cap * 2 : 8;
        cn->v = xrealloc(cn->v, cn->cap * sizeof *cn->v);
    }
    cn->v[cn->n++] = (struct attempt_note){xstrdup(c.xid), xstrdup(c.vertex), c.epoch,
                                           xasprintf("%s%s", STEPS_CRASH_NOTE_PREFIX, c.phase)};
    log_warn("engine.crash_found", "the last process crashed evaluating %s/%s epoch %lld (%s)",
             c.xid, c.vertex, (long long)c.epoch, c.phase);
}

/* Turns the crash markers earlier processes left into notes on their
 * attempts, so that the recoveries below can tell crashes from kills. */
static void collect_crashes(struct engine *g)
{
    if (!g->run.crash_dir)
        return;
    struct crash_notes cn = {0};
    struct ifl_err e = {0};
    if (crashmark_collect(g->run.crash_dir, crash_line, &cn, &e))
        log_warn("engine.crash_markers", "%s", e.msg);
    engine_note_attempts(g, cn.v, cn.n);
    for (size_t i = 0; i < cn.n; i++) {
        free((char *)cn.v[i].execution_id);
        free((char *)cn.v[i].vertex);
        free((char *)cn.v[i].note);
    }
    free(cn.v);
}

/* Recovers expired (or, with now < 0, all) EXECUTING steps. */
/* 1 once a stop began: the sweeper's passes end between their store
 * operations, each of which may ride out an outage for the store's retry
 * window (PostgreSQL: 20 s) — a stop waits for one of them, not for every
 * one a pass has left (found by a judge: 88 s with the database down). */
static int halted(struct engine *g)
{
    pthread_mutex_lock(&g->wmu);
    int stop = g->stopping;
    pthread_mutex_unlock(&g->wmu);
    return stop;
}

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
    for (size_t i = 0; i < n && !halted(g); i++) {
        struct store_step *st = &rows[i];
        /* A call this process still holds did not die: its lease lapsed
         * while renewals waited (a sweep busy recovering others, a writer
         * behind).  Renewed, fenced by its epoch, not recovered — found by a
         * judge: an answered call parked as lease_expired_mid_call. */
        if (engine_gw_keep(g, st->execution_id, st->vertex, st->epoch))
            continue;
        struct store_execution x;
        const struct wf *w = NULL;
        int version;
        if (store_execution_get(g->store, st->workspace, st->execution_id, &x, &e))
            continue;
        int rc =
            engine_workflow_get(g, st->workspace, x.workflow, x.workflow_version, &w, &version, &e);
        store_execution_clear(&x);
        if (rc)
            continue;
        /* A GATEWAY whose worker died mid-call: the outcome is unknown, so
         * its `ambiguous` policy decides (re-send with the key, verify first,
         * or park for an operator). */
        long vi = wf_vertex_index(w, st->vertex);
        int gateway = vi >= 0 && w->v[vi].type == WF_GATEWAY;
        /* A broken vertex (a stored version that no longer compiles) has no
         * policy to trust: an operator decides. */
        enum gw_ambiguous amb = !gateway          ? GW_AMB_RETRY
                                : w->v[vi].broken ? GW_AMB_RECONCILE
                                                  : w->v[vi].policy.ambiguous;
        int park = gateway && amb == GW_AMB_RECONCILE;
        enum death death = DIED_MID_CALL;
        int expiries = 1, poison = 0, crashed = 0;
        int64_t budget_from, started;
        int before = attempt_history(g, st, gateway, &death, &crashed, &budget_from, &started);
        if (before < 0) {
            wf_release(w);
            continue; /* a read failed (an outage): the next sweep tries again */
        }
        /* Its note says it died rendering: the call never left (a call
         * leaves only once its note is cleared, run_batch), so there is
         * nothing to reconcile — it is tried again, as under any policy. */
        if (park && death == DIED_RENDERING && !w->v[vi].broken)
            park = 0;
        if (!park && crashed) { /* only crashes count: a kill is tried again, always */
            expiries += before;
            poison = expiries >= (gateway ? MAX_EVAL_CRASHES : MAX_LEASE_EXPIRIES);
        }
        int verify_before = gateway && steps_error_verify_first(st->error);
        /* A call that may still be in the provider's hands is verified no
         * sooner than verify.afterMs (gwstep.c retry_or_fail) after its
         * worker gave it up: from now, or from when its timeout would have
         * ended had the worker lived, whichever is later — the death says
         * nothing of the provider, who goes on as with a call that timed
         * out (found by a judge: a call killed 0.1 s after it left was
         * verified 0.8 s after the restart, before the provider committed
         * it, 1.2 s after it arrived).  An attempt that verified first may
         * have sent the call again once its verify said "not done", up to
         * a timeoutMs (the verify's) after it started: its call's timeout
         * counts from there (found by a judge again).  Also when it died
         * after a response was noted: that may have been a timeout (found
         * by a reviewer).  The error's mark holds any later verify to it,
         * an operator's retry's too. */
        int64_t now_ms = clock_now_ms(), run_at = 0, not_before = 0;
        /* … and one an earlier attempt left stays: a claim that died before
         * its take-back (found by a reviewer) is no verify */
        if (verify_before)
            not_before = steps_error_verify_not_before(st->error);
        if (gateway && death != DIED_RENDERING && w->v[vi].policy.has_verify) {
            const struct gw_policy *gp = &w->v[vi].policy;
            int64_t timed_out = started + gp->timeout_ms * (verify_before ? 2 : 1);
            int64_t gave_up = timed_out > now_ms ? timed_out : now_ms;
            if (not_before < gave_up + gp->verify_after_ms)
                not_before = gave_up + gp->verify_after_ms;
            if (!park && !poison && amb == GW_AMB_VERIFY) {
                int64_t deadline = budget_from + gp->deadline_ms;
                run_at = now_ms + engine_gw_verify_wait(gp, gave_up + gp->verify_after_ms - now_ms,
                                                        0, deadline - now_ms);
                if (run_at < not_before)
                    not_before = run_at;
                /* A wait that ends past the deadline (an afterMs the
                 * workflow set, or a deadline already gone): the next
                 * claim comes at the deadline and fails the step
                 * (engine_gw_prepare), its mark kept for an operator's
                 * retry, rather than idle DISPATCHED until the mark. */
                if (run_at > deadline + 1)
                    run_at = deadline + 1;
            }
        }
        char *err = poison ? poison_error(gateway, expiries, amb == GW_AMB_VERIFY || verify_before,
                                          not_before)
                    : gateway ? gateway_expiry_error(death, amb, crashed, verify_before, not_before)
                              : NULL;
        FAULT("sweeper.before_recover");
        struct step_outcome o = {
            .w = w,
            .workspace = st->workspace,
            .execution_id = st->execution_id,
            .vertex = st->vertex,
            .epoch = st->epoch,
            .from = STEP_EXECUTING,
            .to = park     ? STEP_REQUIRES_RECONCILIATION
                  : poison ? STEP_FAILED
                           : STEP_DISPATCHED,
            .error = err,
            .attempt_outcome = death_outcome[crashed][death],
            .now = now_ms,
            .run_at = run_at,
        };
        if (apply(g, &o, &e) == 0 && !o.fenced) {
            recovered++;
            atomic_fetch_add(&g->m.steps_recovered, 1);
            if (o.status_changed) /* parked or failed: the execution may have ended */
                engine_execution_moved(g, st->execution_id, o.status);
            log_warn("step.recovered", "%s/%s epoch %lld: lease expired; %s", st->execution_id,
                     st->vertex, (long long)st->epoch,
                     park     ? "parked for reconciliation"
                     : poison ? "failed: its worker died on every one of its last attempts"
                              : "re-dispatched");
        }
        free(err);
        wf_release(w);
    }
    store_steps_free(rows, n);
    if (recovered)
        engine_wake(g);
    return recovered;
}

/* A fired schedule tick is kept this long: far longer than the scheduler
 * looks back for missed ticks (scheduler.c). */
#define TICK_RETENTION_MS (24LL * 3600 * 1000)

/* Deletes the Idempotency-Key records past their retention and old
 * schedule ticks, a bounded number per round (an expired key is claimed
 * anew when it comes back, so this only reclaims space). */
/* The dedup window of an execution's entry point: the longer of its own
 * workflow version's and the latest version's (a window lengthened since
 * holds for it too).  -1 when its version cannot be read: not purged now. */
static int64_t dedup_window(struct engine *g, const struct store_purge *p)
{
    int64_t window = -1;
    for (int latest = 0; latest < 2; latest++) {
        const struct wf *w = NULL;
        int version = 0;
        struct ifl_err we = {0};
        if (engine_workflow_get(g, p->workspace, p->workflow, latest ? 0 : p->workflow_version, &w,
                                &version, &we) != 0) {
            if (!latest)
                return -1;
            continue;
        }
        long vi = wf_vertex_index(w, p->entry_point);
        int64_t v = vi >= 0 ? w->v[vi].dedup_window_ms : WF_DEDUP_WINDOW_DEFAULT_MS;
        wf_release(w);
        if (v > window)
            window = v;
    }
    return window;
}

#define PURGE_BUDGET_MS 1000

/* Retention (spec §4): purges executions that finished longer ago than the
 * retention — each a tombstone until its entry point's dedupWindow has
 * passed since it was created, else deleted — then old events and
 * deliveries, and tombstones whose window has passed.  Batches of their
 * own transactions (the writer is free between them) for up to
 * PURGE_BUDGET_MS; 1 when work is left (the sweeper comes back in a
 * second rather than a minute, so a backlog drains). */
static int purge_old(struct engine *g, int64_t now)
{
    enum { BATCH = 200, EV_BATCH = 1000 };
    struct ifl_err e = {0};
    int64_t cutoff = now - g->run.retention_ms, until = clock_mono_ms() + PURGE_BUDGET_MS;
    int more = 0;
    while (g->run.retention_ms > 0 && !halted(g)) {
        struct store_purge *v = NULL;
        size_t n = 0;
        if (store_purge_candidates(g->store, cutoff, BATCH, &v, &n, &e)) {
            log_warn("retention.scan_failed", "finding executions to purge: %s", e.msg);
            goto out; /* the store is down: the rest would wait it out too */
        }
        size_t keep = 0;
        for (size_t i = 0; i < n; i++) {
            int64_t window = dedup_window(g, &v[i]);
            if (window < 0) { /* unreadable workflow: left for a later sweep */
                store_purge_clear(&v[i]);
                continue;
            }
            v[keep] = v[i];
            v[keep++].dedup_until = v[i].created_at + window;
        }
        int rc = keep ? store_purge(g->store, v, keep, now, &e) : 0;
        unsigned long k = 0;
        for (size_t i = 0; !rc && i < keep; i++)
            k += (unsigned long)v[i].purged;
        atomic_fetch_add(&g->m.purged_executions, k);
        store_purges_free(v, keep);
        if (rc) {
            log_warn("retention.purge_failed", "purging executions: %s", e.msg);
            goto out;
        }
        if (n < BATCH)
            break;
        if (clock_mono_ms() >= until) {
            more = 1;
            break;
        }
    }
    int k = EV_BATCH;
    while (g->run.retention_ms > 0 && k == EV_BATCH && !halted(g)) {
        if (clock_mono_ms() >= until) {
            more = 1;
            break;
        }
        if (store_events_expire(g->store, cutoff, EV_BATCH, &k, &e)) {
            log_warn("retention.events_failed", "expiring events: %s", e.msg);
            goto out;
        }
        atomic_fetch_add(&g->m.expired_events, (unsigned long)k);
    }
    k = EV_BATCH;
    while (k == EV_BATCH && !halted(g)) {
        if (clock_mono_ms() >= until) {
            more = 1;
            break;
        }
        if (store_tombstones_expire(g->store, now, EV_BATCH, &k, &e)) {
            log_warn("retention.tombstones_failed", "expiring tombstones: %s", e.msg);
            goto out;
        }
        atomic_fetch_add(&g->m.expired_tombstones, (unsigned long)k);
    }
out:
    atomic_fetch_add(&g->m.retention_sweeps, 1);
    return more;
}

/* 1 when retention work is left for the next second. */
/* A key record is deleted this long after its retention ended: past its
 * retention it is claimed anew anyway (engine.c, a compare-and-set on the
 * record); the grace keeps that path, and not a race with this sweep, the
 * one an expired key takes (found flaky: a test's repeat lost that race). */
#define KEY_PURGE_GRACE_MS (3600LL * 1000)

static int expire_records(struct engine *g, int64_t now)
{
    enum { BATCH = 1000, ROUNDS = 10 };
    int n = BATCH;
    struct ifl_err e = {0};
    /* A kind that fails (the store is down) ends the pass: the others
     * would wait out the same outage, one retry window each. */
    for (int i = 0; i < ROUNDS && n == BATCH && !halted(g); i++)
        if (store_idem_expire(g->store, now - engine_key_retention(g) - KEY_PURGE_GRACE_MS, BATCH,
                              &n, &e)) {
            log_warn("keys.expire_failed", "expiring Idempotency-Key records: %s", e.msg);
            return 0;
        }
    n = BATCH;
    for (int i = 0; i < ROUNDS && n == BATCH && !halted(g); i++)
        if (store_ticks_expire(g->store, now - TICK_RETENTION_MS, BATCH, &n, &e)) {
            log_warn("ticks.expire_failed", "expiring schedule ticks: %s", e.msg);
            return 0;
        }
    n = BATCH; /* delivered webhooks are kept as long as keys */
    for (int i = 0; i < ROUNDS && n == BATCH && !halted(g); i++)
        if (store_deliveries_expire(g->store, now - engine_key_retention(g), BATCH, &n, &e)) {
            log_warn("hooks.expire_failed", "expiring delivered webhooks: %s", e.msg);
            return 0;
        }
    return halted(g) ? 0 : purge_old(g, now);
}

static void *sweeper_main(void *arg)
{
    struct engine *g = arg;
    pthread_setname_np(pthread_self(), "sweeper");
    int64_t period = g->run.lease_ms / 4;
    if (period < 20)
        period = 20;
    if (period > 2000)
        period = 2000;
    int stop = 0;
    int64_t keys_due = 0; /* expire keys at start, then once a minute */
    for (;;) {
        /* Sleep a full period on a condition variable of its own: work
         * wake-ups (one per commit or finished call) are for the workers. */
        int64_t until = clock_now_ms() + period;
        struct timespec ts;
        clock_abstime(until, &ts);
        pthread_mutex_lock(&g->wmu);
        while (!g->calls_done && g->stopping == stop && clock_now_ms() < until)
            pthread_cond_timedwait(&g->scv, &g->wmu, &ts);
        stop = g->stopping;
        int done = g->calls_done;
        pthread_mutex_unlock(&g->wmu);
        if (done)
            break;
        /* Stopping, calls still in flight keep their leases until they end
         * (engine_stop waits for them): another process must not take one
         * over while its request may still reach the provider. */
        engine_gw_renew_leases(g);
        if (stop)
            continue;
        int64_t now = clock_now_ms();
        recover(g, now);
        if (now >= keys_due && !halted(g)) {
            keys_due = now + (expire_records(g, now) ? 1000 : 60000);
        }
    }
    return NULL;
}

int engine_nap(struct engine *g, int64_t ms)
{
    struct timespec ts;
    clock_abstime(clock_now_ms() + ms, &ts);
    pthread_mutex_lock(&g->wmu);
    if (!g->stopping && ms > 0)
        pthread_cond_timedwait(&g->scv, &g->wmu, &ts);
    int stop = g->stopping;
    pthread_mutex_unlock(&g->wmu);
    return stop;
}

int engine_sched_nap(struct engine *g, int64_t ms)
{
    int64_t until = clock_now_ms() + ms;
    struct timespec ts;
    clock_abstime(until, &ts);
    pthread_mutex_lock(&g->wmu);
    /* Its own condition variable: a clock move wakes neither the sweeper
     * nor the webhook thread, whose passes tests time by the clock too. */
    while (!g->stopping && !g->sched_woken && clock_now_ms() < until)
        if (pthread_cond_timedwait(&g->ncv, &g->wmu, &ts) == ETIMEDOUT)
            break;
    g->sched_woken = 0;
    int stop = g->stopping;
    pthread_mutex_unlock(&g->wmu);
    return stop;
}

void engine_clock_advanced(struct engine *g)
{
    wake(g, 1);
    pthread_mutex_lock(&g->wmu);
    g->sched_woken = 1;
    pthread_cond_broadcast(&g->ncv);
    pthread_mutex_unlock(&g->wmu);
}

/* Shared stores (PostgreSQL): other processes' commits arrive as
 * notifications; each one wakes this process's idle workers. */
static void *listener_main(void *arg)
{
    struct engine *g = arg;
    pthread_setname_np(pthread_self(), "listener");
    for (;;) {
        pthread_mutex_lock(&g->wmu);
        int stop = g->stopping;
        pthread_mutex_unlock(&g->wmu);
        if (stop)
            break;
        int rc = store_wait_work(g->store, 250);
        if (rc == 1)
            engine_wake(g);
    }
    return NULL;
}

int engine_start(struct engine *g, const struct engine_run_opts *o, struct ifl_err *e)
{
    if (g->started)
        return 0;
    g->run = *o;
    if (g->run.workers <= 0)
        g->run.workers = 4;
    if (g->run.lease_ms <= 0)
        g->run.lease_ms = 15000;
    if (g->run.batch <= 0)
        g->run.batch = 16;
    if (g->run.max_calls <= 0)
        g->run.max_calls = GW_MAX_CALLS;
    if (g->run.max_calls_per_destination <= 0)
        g->run.max_calls_per_destination = /* all but an eighth, kept for the others */
            g->run.max_calls >= 8 ? g->run.max_calls - g->run.max_calls / 8 : g->run.max_calls;
    if (g->run.max_calls_per_destination > g->run.max_calls)
        g->run.max_calls_per_destination = g->run.max_calls;
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    snprintf(g->worker_prefix, sizeof g->worker_prefix, "%s:%ld", host, (long)getpid());
    const char *trace_path = getenv("IDEMFLOW_TRACE_FILE");
    if (trace_path && *trace_path) {
        g->trace_fd = open(trace_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
        if (g->trace_fd < 0)
            return err_set(e, IFL_EIO, "cannot open IDEMFLOW_TRACE_FILE %s", trace_path);
    }
    collect_crashes(g);
    /* SQLite: the database lock proves no other process runs these steps,
     * so every step left EXECUTING belonged to a dead process. */
    if (strcmp(store_backend(g->store), "sqlite") == 0) {
        int total = 0, k;
        while ((k = recover(g, -1)) > 0)
            total += k;
        if (total)
            log_info("engine.recovered", "recovered %d steps left executing", total);
        /* the same for webhook deliveries: sent again at once */
        struct ifl_err re = {0};
        if (store_deliveries_release(g->store, &re))
            log_warn("hooks.release_failed", "releasing deliveries left sending: %s", re.msg);
    }
    if (g->run.retention_ms > 0) {
        struct ifl_err pe = {0};
        if (store_retention_prepare(g->store, &pe))
            log_warn("retention.prepare_failed", "creating the purge index: %s", pe.msg);
    }
    g->stopping = 0;
    g->calls_done = 0;
    if (gw_client_new(g->run.max_calls, &g->gw, e))
        return IFL_EIO;
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
    if (pthread_create(&g->scheduler, NULL, engine_scheduler_main, g) != 0) {
        engine_stop(g);
        return err_set(e, IFL_EIO, "cannot start the scheduler thread");
    }
    g->has_scheduler = 1;
    if (pthread_create(&g->hooks, NULL, engine_hooks_main, g) != 0) {
        engine_stop(g);
        return err_set(e, IFL_EIO, "cannot start the webhook thread");
    }
    g->has_hooks = 1;
    if (store_wait_work(g->store, 0) != IFL_EUNSUPPORTED) {
        if (pthread_create(&g->listener, NULL, listener_main, g) != 0) {
            engine_stop(g);
            return err_set(e, IFL_EIO, "cannot start the listener thread");
        }
        g->has_listener = 1;
    }
    return 0;
}

void engine_stop(struct engine *g)
{
    if (!g->workers)
        return;
    pthread_mutex_lock(&g->wmu);
    g->stopping = 1;
    pthread_cond_broadcast(&g->wcv);
    pthread_cond_broadcast(&g->scv);
    pthread_cond_broadcast(&g->ncv);
    pthread_mutex_unlock(&g->wmu);
    /* first: a fire may start a GATEWAY call, which needs the client */
    if (g->has_scheduler)
        pthread_join(g->scheduler, NULL);
    g->has_scheduler = 0;
    if (g->has_hooks)
        pthread_join(g->hooks, NULL);
    g->has_hooks = 0;
    for (int i = 0; i < g->run.workers; i++)
        pthread_join(g->workers[i], NULL);
    /* Calls in flight finish (the client waits for them), then their
     * outcomes are committed here. */
    gw_client_free(g->gw, GW_STOP_GRACE_MS);
    g->gw = NULL;
    engine_gw_drain(g);
    pthread_mutex_lock(&g->wmu);
    g->calls_done = 1; /* their outcomes are committed: no lease left to renew */
    pthread_cond_broadcast(&g->scv);
    pthread_mutex_unlock(&g->wmu);
    if (g->started)
        pthread_join(g->sweeper, NULL);
    if (g->has_listener)
        pthread_join(g->listener, NULL);
    g->has_listener = 0;
    free(g->workers);
    g->workers = NULL;
    g->started = 0;
    if (g->trace_fd >= 0)
        close(g->trace_fd);
    g->trace_fd = -1;
}
