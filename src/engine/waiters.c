/*
 * waiters — callers waiting for an execution to leave `running` (a trigger
 * sent with `Prefer: wait=N`, docs/api.md).
 *
 * A waiter is added before the execution can finish (before the trigger's
 * transaction commits), so a finish committed at any later moment finds it:
 * the paths that commit a status change call engine_execution_moved, which
 * records the status in every waiter of that execution and fires the armed
 * ones.  A finish this process never sees (another engine process on the
 * same PostgreSQL, an operator action) is found by the timer thread, which
 * reads the status of every waiter armed for a second or more, once a
 * second; it also fires waiters whose deadline passed.
 *
 * Cost when nobody waits: one atomic load per finished execution.  Each
 * waiter fires its callback exactly once (moved, deadline, or close).
 * Must never call a callback with the registry's lock held.
 */
#include "engine/engine_int.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

#define BUCKETS 1024
#define POLL_MS 1000 /* how often an armed waiter's status is read */
#define BATCH 64     /* callbacks collected per pass of the timer */

struct engine_waiter {
    char xid[65];
    char *ws;
    char status[32];                      /* "" while the execution is (as far as known) running */
    struct engine_waiter *hnext, **hprev; /* bucket chain */
    struct engine_waiter *anext, **aprev; /* the armed list */
    int armed, fired;
    int64_t deadline_ms, polled_ms; /* clock_mono_ms() */
    engine_waiter_fn fn;
    void *arg;
};

struct engine_waiters {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the timer: a new deadline, or close */
    struct engine_waiter *bucket[BUCKETS];
    struct engine_waiter *armed;
    atomic_int count; /* waiters added and not removed */
    int closing;
    int thread_running;
    pthread_t thread;
};

static unsigned hash(const char *xid)
{
    unsigned h = 2166136261u;
    for (const char *p = xid; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h % BUCKETS;
}

struct engine_waiters *engine_waiters_new(void)
{
    struct engine_waiters *r = xcalloc(1, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
}

static void unarm(struct engine_waiter *w)
{
    if (!w->aprev)
        return;
    *w->aprev = w->anext;
    if (w->anext)
        w->anext->aprev = w->aprev;
    w->aprev = NULL;
    w->anext = NULL;
}

/* Marks w fired and takes it off the armed list; returns 1 when its callback
 * is the caller's to call (it was armed and had not fired).  Lock held. */
static int fire(struct engine_waiter *w)
{
    if (!w->armed || w->fired)
        return 0;
    w->fired = 1;
    unarm(w);
    return 1;
}

struct engine_waiter *engine_waiter_add(struct engine *g, const char *ws, const char *xid)
{
    struct engine_waiters *r = g->waiters;
    struct engine_waiter *w = xcalloc(1, sizeof *w);
    snprintf(w->xid, sizeof w->xid, "%s", xid);
    w->ws = xstrdup(ws);
    pthread_mutex_lock(&r->mu);
    struct engine_waiter **b = &r->bucket[hash(w->xid)];
    w->hnext = *b;
    w->hprev = b;
    if (*b)
        (*b)->hprev = &w->hnext;
    *b = w;
    atomic_fetch_add(&r->count, 1);
    pthread_mutex_unlock(&r->mu);
    return w;
}

static void *timer_main(void *arg);

int engine_waiter_arm(struct engine *g, struct engine_waiter *w, int64_t deadline_ms,
                      engine_waiter_fn fn, void *arg)
{
    struct engine_waiters *r = g->waiters;
    pthread_mutex_lock(&r->mu);
    if (w->status[0] || r->closing || deadline_ms <= clock_mono_ms()) {
        pthread_mutex_unlock(&r->mu);
        return 1;
    }
    w->armed = 1;
    w->fn = fn;
    w->arg = arg;
    w->deadline_ms = deadline_ms;
    w->polled_ms = clock_mono_ms();
    w->anext = r->armed;
    w->aprev = &r->armed;
    if (r->armed)
        r->armed->aprev = &w->anext;
    r->armed = w;
    if (!r->thread_running) {
        r->thread_running = 1;
        r->thread_running = pthread_create(&r->thread, NULL, timer_main, g) == 0;
        if (!r->thread_running) { /* no timer: answer now rather than never */
            fire(w);
            pthread_mutex_unlock(&r->mu);
            log_error("waiters.thread", "cannot start the wait timer thread");
            return 1;
        }
    }
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return 0;
}

int engine_waiter_status(struct engine *g, const struct engine_waiter *w, char status[32])
{
    struct engine_waiters *r = g->waiters;
    pthread_mutex_lock(&r->mu);
    int moved = w->status[0] != '\0';
    if (moved)
        memcpy(status, w->status, sizeof w->status);
    pthread_mutex_unlock(&r->mu);
    return moved;
}

void engine_waiter_remove(struct engine *g, struct engine_waiter *w)
{
    if (!w)
        return;
    struct engine_waiters *r = g->waiters;
    pthread_mutex_lock(&r->mu);
    unarm(w);
    *w->hprev = w->hnext;
    if (w->hnext)
        w->hnext->hprev = w->hprev;
    atomic_fetch_sub(&r->count, 1);
    pthread_mutex_unlock(&r->mu);
    free(w->ws);
    free(w);
}

struct call {
    engine_waiter_fn fn;
    void *arg;
};

/* Records that xid moved to `status` in its waiters and fires the armed
 * ones (more than BATCH on one execution: the timer fires the rest, their
 * status already recorded, within POLL_MS). */
static void notify(struct engine_waiters *r, const char *xid, const char *status)
{
    struct call calls[BATCH];
    size_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (struct engine_waiter *w = r->bucket[hash(xid)]; w; w = w->hnext) {
        if (strcmp(w->xid, xid) != 0)
            continue;
        snprintf(w->status, sizeof w->status, "%s", status);
        if (n < BATCH && fire(w))
            calls[n++] = (struct call){w->fn, w->arg};
    }
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < n; i++)
        calls[i].fn(calls[i].arg);
}

void engine_execution_moved(struct engine *g, const char *xid, const char *status)
{
    engine_count_status(g, status);
    struct engine_waiters *r = g->waiters;
    if (atomic_load(&r->count) && strcmp(status, "running") != 0)
        notify(r, xid, status);
}

/* One pass: fires due waiters (deadline passed, or a status recorded
 * without a callback), and reads the status of those due for a poll.
 * Returns the next time anything is due. */
static int64_t timer_pass(struct engine *g)
{
    struct engine_waiters *r = g->waiters;
    struct call calls[BATCH];
    struct {
        char xid[65];
        char *ws;
    } polls[BATCH];
    size_t n = 0, np = 0;
    int64_t now = clock_mono_ms(), next = now + POLL_MS;
    pthread_mutex_lock(&r->mu);
    for (struct engine_waiter *w = r->armed, *nx; w && n < BATCH; w = nx) {
        nx = w->anext;
        if (r->closing || w->status[0] || w->deadline_ms <= now) {
            fire(w);
            calls[n++] = (struct call){w->fn, w->arg};
            continue;
        }
        if (now - w->polled_ms >= POLL_MS && np < BATCH) {
            w->polled_ms = now;
            memcpy(polls[np].xid, w->xid, sizeof w->xid);
            polls[np++].ws = xstrdup(w->ws);
        }
        int64_t due = w->polled_ms + POLL_MS;
        if (w->deadline_ms < due)
            due = w->deadline_ms;
        if (due < next)
            next = due;
    }
    if (n == BATCH)
        next = now; /* more to fire */
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < n; i++)
        calls[i].fn(calls[i].arg);
    for (size_t i = 0; i < np; i++) {
        struct store_execution x;
        struct ifl_err e = {0};
        if (store_execution_get(g->store, polls[i].ws, polls[i].xid, &x, &e) == 0) {
            if (strcmp(x.status, "running") != 0)
                notify(r, polls[i].xid, x.status); /* not counted: it moved elsewhere */
            store_execution_clear(&x);
        }
        free(polls[i].ws);
    }
    return next;
}

static void *timer_main(void *arg)
{
    struct engine *g = arg;
    struct engine_waiters *r = g->waiters;
    for (;;) {
        int64_t next = timer_pass(g);
        pthread_mutex_lock(&r->mu);
        if (r->closing && !r->armed) {
            pthread_mutex_unlock(&r->mu);
            break;
        }
        int64_t wait = next - clock_mono_ms();
        if (wait > 0 && !r->closing) {
            struct timespec ts;
            clock_abstime(clock_now_ms() + wait, &ts);
            pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        }
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

void engine_waiters_close(struct engine *g)
{
    struct engine_waiters *r = g->waiters;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->closing = 1;
    int running = r->thread_running;
    r->thread_running = 0;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (running)
        pthread_join(r->thread, NULL);
}

void engine_waiters_free(struct engine_waiters *r)
{
    if (!r)
        return;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}
