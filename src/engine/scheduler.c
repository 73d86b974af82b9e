/*
 * scheduler — fires the schedules of ENTRY_POINTs (spec §9).
 *
 * Every process runs one scheduler thread.  It lists the latest version of
 * every workflow every RESCAN_MS (at once after a PUT in this process),
 * keeps the entry points that have a schedule, and once a second fires
 * those whose next tick has come: a trigger with a random execution id
 * and the payload {"scheduledAt", "schedule"}, whose creating transaction
 * first claims (workspace, workflow, entry point, tick) in schedule_ticks.
 * So a tick fires once whichever process gets there first, and a restart
 * does not fire it again.
 *
 * Missed ticks (no engine ran, or the clock jumped): only the latest due
 * tick fires, late, and only if it is at most LOOKBACK_MS old; the ones
 * before it are skipped (counted in schedule_missed when this process was
 * running then).  A new workflow version does not fire ticks from before
 * it was put.
 *
 * Invariant: this thread never fires after engine_stop set g->stopping
 * (engine_stop joins it before the workers and the HTTP client go).
 */
#include "engine/engine_int.h"
#include "base/clock.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_MS 1000
#define RESCAN_MS 10000
#define LOOKBACK_MS (3600LL * 1000)
#define RETRY_MAX_MS (10LL * 1000)

struct entry {
    char *ws, *wf, *vertex;
    int version;
    const struct wf *w; /* a reference of its own (wf_hold) */
    long vi;
    int64_t next;     /* the next tick to fire, or -1: never */
    int seen;         /* in the latest listing */
    int64_t failing;  /* the tick whose fire last failed for the store (logged once), or 0 */
    int64_t retry_at; /* when to try it again: after retry_ms (doubling up to RETRY_MAX_MS),
                         and before the next tick is due */
    int64_t retry_ms;
};

struct sched {
    struct entry *v;
    size_t n, cap;
};

static void entry_clear(struct entry *x)
{
    free(x->ws);
    free(x->wf);
    free(x->vertex);
    wf_release(x->w);
}

static struct entry *find(struct sched *s, const char *ws, const char *wf, const char *vertex,
                          int version)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i].version == version && strcmp(s->v[i].ws, ws) == 0 &&
            strcmp(s->v[i].wf, wf) == 0 && strcmp(s->v[i].vertex, vertex) == 0)
            return &s->v[i];
    return NULL;
}

static int fire(struct engine *g, struct entry *x, int64_t at, int64_t now);
static int due_one(struct engine *g, struct entry *x, int64_t now, int64_t until);

/* When the version that replaced x's was put, as the listing has it: x's
 * ticks from then on are superseded (tx_tick_claim's rule). */
static int64_t replaced_at(const struct store_workflow *items, size_t n, const struct entry *x)
{
    for (size_t i = 0; i < n; i++)
        if (items[i].version > x->version && strcmp(items[i].workspace, x->ws) == 0 &&
            strcmp(items[i].name, x->wf) == 0)
            return items[i].created_at;
    return INT64_MAX;
}

/* Rebuilds the list from the store: entries of versions still latest keep
 * their next tick; new ones start after max(put time, now - LOOKBACK_MS). */
static void rescan(struct engine *g, struct sched *s, int64_t now)
{
    struct store_workflow *items = NULL;
    size_t n = 0;
    struct ifl_err e = {0};
    FAULT("schedule.before_list");
    if (store_workflows_latest(g->store, &items, &n, &e)) {
        log_warn("schedule.scan_failed", "listing workflows for their schedules: %s", e.msg);
        return;
    }
    for (size_t i = 0; i < s->n; i++)
        s->v[i].seen = 0;
    for (size_t i = 0; i < n; i++) {
        const struct wf *w = NULL;
        int version = 0;
        if (engine_workflow_get(g, items[i].workspace, items[i].name, items[i].version, &w,
                                &version, NULL))
            continue;
        for (size_t vi = 0; vi < w->nv; vi++) {
            if (!w->v[vi].has_schedule)
                continue;
            struct entry *x = find(s, items[i].workspace, items[i].name, w->v[vi].id, version);
            if (!x) {
                if (s->n == s->cap) {
                    s->cap = s->cap ? 2 * s->cap : 8;
                    s->v = xrealloc(s->v, s->cap * sizeof *s->v);
                }
                x = &s->v[s->n++];
                *x = (struct entry){xstrdup(items[i].workspace),
                                    xstrdup(items[i].name),
                                    xstrdup(w->v[vi].id),
                                    version,
                                    wf_hold(w),
                                    (long)vi,
                                    0,
                                    0,
                                    0,
                                    0,
                                    0};
                /* The latest tick due since the version was put (within the
                 * look-back) fires now, unless it fired already; what came
                 * before it is not this process's to count as missed: another
                 * process may have fired it. */
                const struct cron *c = &w->v[vi].schedule;
                int64_t from = items[i].created_at > now - LOOKBACK_MS ? items[i].created_at
                                                                       : now - LOOKBACK_MS;
                int64_t t = cron_next(c, from), later;
                while (t >= 0 && (later = cron_next(c, t)) >= 0 && later <= now)
                    t = later;
                x->next = t;
            }
            x->seen = 1;
        }
        wf_release(w);
    }
    /* The listing took time: a tick may have fallen due since `now`. */
    int64_t listed = clock_now_ms();
    size_t kept = 0;
    for (size_t i = 0; i < s->n; i++) {
        struct entry *x = &s->v[i];
        /* A version replaced while its due tick waited to be tried again,
         * or whose tick fell due while this listing ran (it started before
         * the tick, and listed the version put after it): that tick is still
         * its own, as due() before a listing has it (found by a test whose
         * listing was stalled at the fault point schedule.before_list). */
        if (!x->seen && !engine_nap(g, 0)) {
            int again = 0;
            if (x->failing)
                again = fire(g, x, x->failing, now);
            else if (x->next >= 0 && x->next <= listed)
                again = due_one(g, x, listed, replaced_at(items, n, x));
            if (again) {
                atomic_fetch_add(&g->m.schedule_missed, 1);
                log_warn("schedule.missed",
                         "%s/%s/%s: a tick whose fire failed was left: version %d "
                         "was replaced",
                         x->ws, x->wf, x->vertex, x->version);
            }
        }
        if (x->seen)
            s->v[kept++] = *x;
        else
            entry_clear(x);
    }
    s->n = kept;
    store_workflows_free(items, n);
    atomic_store(&g->m.schedule_entries, s->n);
    atomic_fetch_add(&g->m.schedule_scans, 1);
}

/* One fire of x's tick `at`: 0 once the tick is settled (fired here or
 * elsewhere, superseded, or refused for good), 1 when the store failed
 * (unreachable, busy): the tick is still to fire, from x->retry_at. */
static int fire(struct engine *g, struct entry *x, int64_t at, int64_t now)
{
    const struct wf_vertex *v = &x->w->v[x->vi];
    char when[32];
    clock_rfc3339(at, when);
    json_t *payload = json_pack("{s:s, s:s}", "scheduledAt", when, "schedule", v->schedule_text);
    struct trigger_req r = {.ws = x->ws,
                            .wf = x->wf,
                            .vertex = x->vertex,
                            .payload = payload,
                            .tick_at = at,
                            .tick_version = x->version};
    struct trigger_res out;
    struct engine_trigger_op *op = NULL;
    struct ifl_err e = {0};
    int rc = engine_trigger_begin(g, &r, &out, &op, &e);
    json_decref(payload); /* before any call starts: engine.h */
    if (!rc && op)
        rc = engine_trigger_run(op, &out, &e);
    int again = 0;
    if (!rc) {
        atomic_fetch_add(&g->m.schedule_fired, 1);
        log_info("schedule.fired", "%s/%s/%s tick %s: execution %s", x->ws, x->wf, x->vertex, when,
                 out.id);
    } else if (strcmp(e.slug, "tick-fired") == 0) {
        atomic_fetch_add(&g->m.schedule_taken, 1);
    } else if (strcmp(e.slug, "tick-superseded") == 0) {
        atomic_fetch_add(&g->m.schedule_superseded, 1);
    } else if (e.code == IFL_ESTORE || e.code == IFL_EIO || e.code == IFL_EBUSY) {
        /* A database outage longer than the store's own retries: the tick
         * is tried again every pass while it is within the look-back. */
        again = 1;
        if (x->failing != at)
            log_warn("schedule.fire_failed",
                     "%s/%s/%s tick %s: %s (tried again, every minute at most, while at most an "
                     "hour late)",
                     x->ws, x->wf, x->vertex, when, e.msg);
        x->retry_ms = x->failing == at && x->retry_ms ? x->retry_ms * 2 : 1000;
        if (x->retry_ms > RETRY_MAX_MS)
            x->retry_ms = RETRY_MAX_MS;
        x->retry_at = now + x->retry_ms;
        /* a pass before the next tick tries once more: past it, this tick
         * would be a missed one */
        int64_t next = cron_next(&v->schedule, at);
        if (next >= 0 && x->retry_at > next - 2 * TICK_MS)
            x->retry_at = next - 2 * TICK_MS;
    } else {
        log_warn("schedule.fire_failed", "%s/%s/%s tick %s: %s", x->ws, x->wf, x->vertex, when,
                 e.msg);
    }
    x->failing = again ? at : 0;
    if (!again)
        x->retry_ms = x->retry_at = 0;
    return again;
}

/* Fires x's latest tick due at `now` and before `until` (the store's own
 * cut: a newer version created at or before a tick supersedes it), and
 * counts the ones before it as missed.  Returns fire()'s "again" (the tick
 * stays x->next), or 0. */
static int due_one(struct engine *g, struct entry *x, int64_t now, int64_t until)
{
    const struct cron *c = &x->w->v[x->vi].schedule;
    int64_t at = x->next, later;
    unsigned long missed = 0;
    while ((later = cron_next(c, at)) >= 0 && later <= now && later < until) {
        at = later;
        missed++;
    }
    int late = now - at > LOOKBACK_MS;
    missed += (unsigned long)late;
    /* counted before the fire, so that a reader who saw the fire's count
     * sees the missed ones too */
    if (missed) {
        atomic_fetch_add(&g->m.schedule_missed, missed);
        log_warn("schedule.missed", "%s/%s/%s: %lu ticks were due while none fired", x->ws, x->wf,
                 x->vertex, missed);
    }
    int again = late ? 0 : fire(g, x, at, now);
    x->next = again ? at : cron_next(c, at);
    return again;
}

static void due(struct engine *g, struct sched *s, int64_t now)
{
    for (size_t i = 0; i < s->n; i++) {
        struct entry *x = &s->v[i];
        if (x->next < 0 || x->next > now || (x->failing && now < x->retry_at))
            continue;
        if (engine_nap(g, 0)) /* stopping: a fire may wait out the store's retries */
            return;
        due_one(g, x, now, INT64_MAX);
    }
}

void *engine_scheduler_main(void *arg)
{
    struct engine *g = arg;
    pthread_setname_np(pthread_self(), "scheduler");
    struct sched s = {0};
    int64_t rescan_at = 0;
    for (;;) {
        /* Due ticks first: one that fell due before a new version was put
         * still fires, in the version it belongs to. */
        int64_t now = clock_now_ms();
        due(g, &s, now);
        if (now >= rescan_at || atomic_exchange(&g->sched_dirty, 0)) {
            rescan(g, &s, now);
            rescan_at = now + RESCAN_MS;
            /* A listing's new entries whose latest tick is already due (this
             * process started, or learned of the version, after it) fire in
             * this pass, at the same `now`: a second later a boundary may
             * have passed, and due() would take that tick for a missed one
             * (found by a crash-test audit). */
            due(g, &s, now);
        }
        if (engine_sched_nap(g, TICK_MS))
            break;
    }
    for (size_t i = 0; i < s.n; i++)
        entry_clear(&s.v[i]);
    free(s.v);
    return NULL;
}
