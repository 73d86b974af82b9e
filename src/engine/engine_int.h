/*
 * engine_int.h — the engine's state, shared by engine.c (triggers, cache,
 * secrets) and runner.c (workers, sweeper).  Private to src/engine.
 */
#ifndef IFL_ENGINE_ENGINE_INT_H
#define IFL_ENGINE_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/steps.h"
#include "engine/workflow.h"
#include "gateway/gateway.h"

#define CACHE_BUCKETS 256

struct cached {
    char *ws, *wf;
    int version;
    struct wf *w;
    struct cached *next;
};

/* The latest version of a workflow, as last read or written here. */
struct latest {
    char *ws, *wf;
    int version;
    int64_t checked_ms; /* clock_mono_ms() of the read */
    struct latest *next;
};

struct engine {
    struct store *store;
    struct latest *latest[CACHE_BUCKETS];
    int64_t latest_ttl_ms; /* how long a read "latest version" is trusted */
    uint8_t key[CRYPTO_KEY_LEN];
    pthread_rwlock_t lock;
    struct cached *buckets[CACHE_BUCKETS];

    /* runner (runner.c) */
    struct engine_run_opts run;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    unsigned long wake_seq;
    int stopping;
    int started;
    pthread_t *workers;
    pthread_t sweeper;
    pthread_t listener; /* turns store_wait_work wake-ups into engine_wake */
    int has_listener;
    int trace_fd; /* IDEMFLOW_TRACE_FILE side channel, or -1 */
    char worker_prefix[96];

    struct engine_metrics m;

    /* GATEWAY calls (gwstep.c) */
    struct gw_client *gw;
    pthread_mutex_t gmu;
    struct gw_job *gw_done;     /* finished calls waiting for a worker */
    struct gw_job *gw_inflight; /* calls on the wire (their leases are renewed) */
    int gw_inflight_n;
};

struct gw_job;
#define GW_MAX_INFLIGHT 256

/* Starts a claimed GATEWAY step's call (no outcome yet).  Returns 0, or -1
 * with *err_text (heap JSON) when the request cannot be rendered. */
int engine_gw_start(struct engine *g, const struct store_claim *c, const struct wf *w, long vi,
                    json_t *ctx, const struct store_step *rows, size_t n, char **err_text);
/* Commits the outcomes of finished calls; returns how many. */
size_t engine_gw_drain(struct engine *g);
/* Extends the leases of every call in flight. */
void engine_gw_renew_leases(struct engine *g);
int engine_gw_inflight(struct engine *g);

/* JSONata's $boolean casting of a result (NULL = undefined = false). */
int engine_truthy(json_t *v);

/* Evaluates an edge condition against ctx (borrowed) into *d. */
void engine_decide(const struct expr *cond, json_t *ctx, struct decision *d);
/* The expression context {payload, steps, execution} (new reference). */
json_t *engine_context(const struct store_execution *x, const struct store_step *rows, size_t n);

#endif
