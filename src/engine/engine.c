/*
 * engine — see engine.h.
 *
 * Trigger path (hot): compiled workflow from the cache (one indexed read of
 * the latest version number), identity computation (JCS + SHA-256), then a
 * read of the id — the fast path for duplicates, skipped for an id the
 * store takes for new (store_execution_probe) — and, when absent, the
 * atomic insert.  The read is only an optimisation: correctness
 * rests on the insert's unique key, which settles concurrent duplicates.
 */
#include "engine/engine_int.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/identity.h"
#include "engine/steps.h"
#include "engine/workflow.h"
#include "crypto/whsig.h"
#include "expr/expr.h"
#include "json/json.h"

#include "base/clock.h"
#include "base/fault.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static unsigned hash3(const char *a, const char *b, int v)
{
    unsigned h = 2166136261u;
    for (; *a; a++)
        h = (h ^ (unsigned char)*a) * 16777619u;
    h = (h ^ 0xff) * 16777619u;
    for (; *b; b++)
        h = (h ^ (unsigned char)*b) * 16777619u;
    return (h ^ (unsigned)v) % CACHE_BUCKETS;
}

static void cache_drop(struct cached *c);

/* One workspace's sealed secrets (engine_int.h, scmu): its secrets, then
 * its retired values (store_secret_retired) — names[i] for i >= n_now is
 * the name a retired value was sealed under. */
struct sealed_cache {
    char *ws;
    char **names, **sealed;
    size_t n, n_now;
    int64_t read_ms; /* clock_mono_ms() when its read began */
    struct sealed_cache *next;
};

/* Drops ws's entries (NULL: every entry) and, with `stale_before` > 0, any
 * entry read before it; with `newer_than` >= 0 an entry of ws read after
 * it stays, and 1 says so.  The caller holds scmu or is the last user. */
static int sealed_cache_prune(struct engine *g, const char *ws, int64_t newer_than,
                              int64_t stale_before)
{
    int kept = 0;
    for (struct sealed_cache **p = &g->sc; *p;) {
        struct sealed_cache *c = *p;
        int mine = !ws || strcmp(c->ws, ws) == 0;
        if (mine && newer_than >= 0 && c->read_ms > newer_than) {
            kept = 1; /* a read that began after this one's: it stands */
            p = &c->next;
            continue;
        }
        if (!mine && !(stale_before > 0 && c->read_ms < stale_before)) {
            p = &c->next;
            continue;
        }
        *p = c->next;
        free(c->ws);
        store_strv_free(c->names, c->n);
        store_strv_free(c->sealed, c->n);
        free(c);
    }
    return kept;
}

static void sealed_cache_drop(struct engine *g, const char *ws)
{
    sealed_cache_prune(g, ws, -1, 0);
}

static char **strv_dup(char *const *v, size_t n)
{
    char **d = n ? xcalloc(n, sizeof *d) : NULL;
    for (size_t i = 0; i < n; i++)
        d[i] = xstrdup(v[i]);
    return d;
}

/* store_secret_all and store_secret_retired, in one list (as struct
 * sealed_cache holds them, *n_now the secrets'), through the cache
 * (engine_int.h); `fresh`: past it. */
static int sealed_all(struct engine *g, const char *ws, int fresh, char ***names, char ***sealed,
                      size_t *n, size_t *n_now, struct ifl_err *e)
{
    int64_t now = clock_mono_ms();
    pthread_mutex_lock(&g->scmu);
    uint64_t gen = g->sc_gen;
    for (struct sealed_cache *c = g->sc; c && !fresh; c = c->next)
        if (strcmp(c->ws, ws) == 0) {
            if (g->shared_ttl_ms != INT64_MAX && now - c->read_ms >= g->shared_ttl_ms)
                break; /* another process may have PUT since: read again */
            *names = strv_dup(c->names, c->n);
            *sealed = strv_dup(c->sealed, c->n);
            *n = c->n;
            *n_now = c->n_now;
            pthread_mutex_unlock(&g->scmu);
            return 0;
        }
    pthread_mutex_unlock(&g->scmu);
    char **rnames = NULL, **rsealed = NULL;
    size_t rn = 0;
    int rc = store_secret_all(g->store, ws, names, sealed, n, e);
    if (!rc)
        rc = store_secret_retired(g->store, ws, &rnames, &rsealed, &rn, e);
    if (!rc && rn) {
        *names = xrealloc(*names, (*n + rn) * sizeof **names);
        *sealed = xrealloc(*sealed, (*n + rn) * sizeof **sealed);
        memcpy(*names + *n, rnames, rn * sizeof *rnames);
        memcpy(*sealed + *n, rsealed, rn * sizeof *rsealed);
        free(rnames);
        free(rsealed);
    } else {
        store_strv_free(rnames, rn);
        store_strv_free(rsealed, rn);
        rn = 0;
    }
    *n_now = *n;
    *n += rn;
    if (rc || g->shared_ttl_ms <= 0)
        return rc;
    pthread_mutex_lock(&g->scmu);
    /* A PUT here since the read began (sc_gen moved): not kept.  Else it
     * replaces ws's older entry — not one a later read left — and, with a
     * shared database, the entries past their time go too. */
    int64_t stale = g->shared_ttl_ms == INT64_MAX ? 0 : now - g->shared_ttl_ms;
    if (g->sc_gen == gen && !sealed_cache_prune(g, ws, now, stale)) {
        struct sealed_cache *c = xcalloc(1, sizeof *c);
        c->ws = xstrdup(ws);
        c->names = strv_dup(*names, *n);
        c->sealed = strv_dup(*sealed, *n);
        c->n = *n;
        c->n_now = *n_now;
        c->read_ms = now;
        c->next = g->sc;
        g->sc = c;
    }
    pthread_mutex_unlock(&g->scmu);
    return 0;
}

int engine_new(struct store *s, const struct engine_opts *o, struct engine **out, struct ifl_err *e)
{
    struct engine *g = xcalloc(1, sizeof *g);
    g->store = s;
    memcpy(g->key, o->secrets_key, sizeof g->key);
    pthread_rwlock_init(&g->lock, NULL);
    /* One SQLite process owns its database, so every workflow and secret
     * PUT goes through these caches; with a shared database another process
     * may PUT, so what was read is trusted for o->shared_cache_ms. */
    g->shared_ttl_ms = strcmp(store_backend(s), "sqlite") == 0 ? INT64_MAX
                       : o->shared_cache_ms > 0                ? o->shared_cache_ms
                                                               : 0;
    g->wf_bytes_max = o->workflow_cache_bytes ? o->workflow_cache_bytes : ENGINE_WF_CACHE_DEFAULT;
    pthread_mutex_init(&g->wmu, NULL);
    pthread_mutex_init(&g->gmu, NULL);
    pthread_mutex_init(&g->kmu, NULL);
    pthread_mutex_init(&g->scmu, NULL);
    pthread_cond_init(&g->wcv, NULL);
    pthread_cond_init(&g->scv, NULL);
    pthread_cond_init(&g->ncv, NULL);
    g->trace_fd = -1;
    g->waiters = engine_waiters_new();
    *out = g;
    return 0;
}

void engine_free(struct engine *g)
{
    if (!g)
        return;
    engine_stop(g);
    engine_waiters_close(g);
    engine_waiters_free(g->waiters);
    pthread_mutex_destroy(&g->wmu);
    pthread_mutex_destroy(&g->gmu);
    pthread_mutex_destroy(&g->kmu);
    sealed_cache_drop(g, NULL);
    pthread_mutex_destroy(&g->scmu);
    pthread_cond_destroy(&g->wcv);
    pthread_cond_destroy(&g->scv);
    pthread_cond_destroy(&g->ncv);
    for (int i = 0; i < CACHE_BUCKETS; i++) {
        struct latest *l = g->latest[i];
        while (l) {
            struct latest *n = l->next;
            free(l->ws);
            free(l->wf);
            free(l);
            l = n;
        }
        cache_drop(g->buckets[i]);
    }
    pthread_rwlock_destroy(&g->lock);
    crypto_wipe(g->key, sizeof g->key);
    free(g);
}

struct store *engine_store(struct engine *g)
{
    return g->store;
}

/* A reference to the cached version, or NULL. */
static const struct wf *cache_find(struct engine *g, const char *ws, const char *wf, int version)
{
    const struct wf *found = NULL;
    pthread_rwlock_rdlock(&g->lock);
    for (struct cached *c = g->buckets[hash3(ws, wf, version)]; c; c = c->next)
        if (c->version == version && strcmp(c->ws, ws) == 0 && strcmp(c->wf, wf) == 0) {
            /* held before the lock goes: a trim cannot free it in between */
            found = wf_hold(c->w);
            atomic_store_explicit(&c->used, atomic_fetch_add(&g->wf_clock, 1) + 1,
                                  memory_order_relaxed);
            break;
        }
    pthread_rwlock_unlock(&g->lock);
    return found;
}

/* 1 when c is its workflow's latest version as this process knows it
 * (under lock). */
static int cache_is_latest(struct engine *g, const struct cached *c)
{
    for (struct latest *l = g->latest[hash3(c->ws, c->wf, 0)]; l; l = l->next)
        if (strcmp(l->ws, c->ws) == 0 && strcmp(l->wf, c->wf) == 0)
            return l->version == c->version;
    return 0;
}

struct trim_cand {
    unsigned long long used;
    size_t bytes;
};

static int cand_cmp(const void *a, const void *b)
{
    unsigned long long x = ((const struct trim_cand *)a)->used,
                       y = ((const struct trim_cand *)b)->used;
    return x < y ? -1 : x > y;
}

/* Past the budget, unlinks the least recently used versions that are not
 * their workflow's latest until the cached bytes are down to 3/4 of it
 * (under the write lock); returns them, for cache_drop once the lock is
 * gone.  Their holders keep them alive (wf_release). */
static struct cached *cache_trim(struct engine *g)
{
    if (g->wf_bytes <= g->wf_bytes_max)
        return NULL;
    struct trim_cand *cand = xmalloc(g->wf_n * sizeof *cand);
    size_t n = 0;
    for (int i = 0; i < CACHE_BUCKETS; i++)
        for (struct cached *c = g->buckets[i]; c; c = c->next)
            if (!cache_is_latest(g, c))
                cand[n++] = (struct trim_cand){atomic_load(&c->used), c->bytes};
    qsort(cand, n, sizeof *cand, cand_cmp);
    size_t target = g->wf_bytes_max / 4 * 3, bytes = g->wf_bytes, k = 0;
    while (k < n && bytes > target)
        bytes -= cand[k++].bytes;
    unsigned long long cutoff = k ? cand[k - 1].used : 0;
    free(cand);
    struct cached *out = NULL;
    if (!k)
        return NULL;
    for (int i = 0; i < CACHE_BUCKETS; i++)
        for (struct cached **p = &g->buckets[i]; *p;) {
            struct cached *c = *p;
            if (atomic_load(&c->used) <= cutoff && !cache_is_latest(g, c)) {
                *p = c->next;
                c->next = out;
                out = c;
                g->wf_n--;
                g->wf_bytes -= c->bytes;
                atomic_fetch_add(&g->m.wf_evicted, 1);
            } else {
                p = &c->next;
            }
        }
    return out;
}

static void cache_drop(struct cached *c)
{
    while (c) {
        struct cached *n = c->next;
        free(c->ws);
        free(c->wf);
        wf_free(c->w);
        free(c);
        c = n;
    }
}

/* Inserts w (the reference passes to the cache) unless another thread won,
 * then w is dropped; returns a reference to the cached one. */
static const struct wf *cache_add(struct engine *g, const char *ws, const char *wf, int version,
                                  struct wf *w, size_t bytes)
{
    unsigned h = hash3(ws, wf, version);
    pthread_rwlock_wrlock(&g->lock);
    for (struct cached *c = g->buckets[h]; c; c = c->next)
        if (c->version == version && strcmp(c->ws, ws) == 0 && strcmp(c->wf, wf) == 0) {
            const struct wf *won = wf_hold(c->w);
            pthread_rwlock_unlock(&g->lock);
            wf_free(w);
            return won;
        }
    struct cached *c = xcalloc(1, sizeof *c);
    c->ws = xstrdup(ws);
    c->wf = xstrdup(wf);
    c->version = version;
    c->w = w;
    c->bytes = bytes;
    atomic_init(&c->used, atomic_fetch_add(&g->wf_clock, 1) + 1);
    c->next = g->buckets[h];
    g->buckets[h] = c;
    g->wf_n++;
    g->wf_bytes += bytes;
    const struct wf *held = wf_hold(w);
    struct cached *dropped = cache_trim(g);
    atomic_store(&g->m.wf_compiled, g->wf_n);
    atomic_store(&g->m.wf_compiled_bytes, g->wf_bytes);
    pthread_rwlock_unlock(&g->lock);
    cache_drop(dropped);
    return held;
}

/* The latest version if known and fresh, else 0. */
static int latest_find(struct engine *g, const char *ws, const char *wf)
{
    int v = 0;
    int64_t now = clock_mono_ms();
    pthread_rwlock_rdlock(&g->lock);
    for (struct latest *l = g->latest[hash3(ws, wf, 0)]; l; l = l->next)
        if (strcmp(l->ws, ws) == 0 && strcmp(l->wf, wf) == 0) {
            if (g->shared_ttl_ms == INT64_MAX || now - l->checked_ms < g->shared_ttl_ms)
                v = l->version;
            break;
        }
    pthread_rwlock_unlock(&g->lock);
    return v;
}

static void latest_set(struct engine *g, const char *ws, const char *wf, int version)
{
    unsigned h = hash3(ws, wf, 0);
    pthread_rwlock_wrlock(&g->lock);
    struct latest *l = g->latest[h];
    while (l && !(strcmp(l->ws, ws) == 0 && strcmp(l->wf, wf) == 0))
        l = l->next;
    if (!l) {
        l = xcalloc(1, sizeof *l);
        l->ws = xstrdup(ws);
        l->wf = xstrdup(wf);
        l->next = g->latest[h];
        g->latest[h] = l;
    }
    if (version >= l->version)
        l->version = version;
    l->checked_ms = clock_mono_ms();
    pthread_rwlock_unlock(&g->lock);
}

/* store_workflow_put_changed's test: the latest version's text parses to
 * a definition equal to arg's (key order and spacing aside). */
static int same_definition(const char *latest, void *arg)
{
    json_t *cur = NULL;
    int same = json_parse(latest, strlen(latest), NULL, &cur, NULL) == 0 && json_equal(cur, arg);
    json_decref(cur);
    return same;
}

/* engine_workflow_put, or with `changed` engine_workflow_put_changed. */
static int workflow_put(struct engine *g, const char *ws, const char *wf, json_t *def, int changed,
                        int *version, int *stored, struct ifl_err *e)
{
    struct wf *w = NULL;
    int rc = wf_compile(def, &w, e);
    struct store_workflow cur;
    if (rc && changed && store_workflow_get(g->store, ws, wf, 0, &cur, NULL) == 0) {
        /* the latest version, put under an earlier engine's looser rules:
         * what stands stands (wf_compile_stored) */
        if (same_definition(cur.definition, def)) {
            *version = cur.version;
            *stored = 0;
            rc = 0;
        }
        store_workflow_clear(&cur);
    }
    if (rc || !w)
        return rc;
    char *text = json_to_string(def); /* as accepted, not as normalised */
    if (!text) {
        wf_free(w);
        return err_set(e, IFL_EVALIDATION, "the definition holds a non-finite number");
    }
    rc = store_workflow_put_changed(g->store, ws, wf, text, changed ? same_definition : NULL, def,
                                    version, stored, e);
    size_t bytes = strlen(text);
    free(text);
    if (rc || !*stored) {
        wf_free(w);
        return rc;
    }
    /* latest first, so that the trim in cache_add keeps it */
    latest_set(g, ws, wf, *version);
    wf_release(cache_add(g, ws, wf, *version, w, bytes));
    atomic_store(&g->sched_dirty, 1);
    log_info("workflow.put", "workspace %s workflow %s version %d", ws, wf, *version);
    return 0;
}

int engine_workflow_put(struct engine *g, const char *ws, const char *wf, json_t *def, int *version,
                        struct ifl_err *e)
{
    int stored = 0;
    return workflow_put(g, ws, wf, def, 0, version, &stored, e);
}

int engine_workflow_put_changed(struct engine *g, const char *ws, const char *wf, json_t *def,
                                int *version, int *stored, struct ifl_err *e)
{
    return workflow_put(g, ws, wf, def, 1, version, stored, e);
}

char *engine_broken_error(const struct wf_vertex *v)
{
    char *msg = xasprintf("an earlier engine stored this workflow version, and this vertex no "
                          "longer compiles (%s): resolve the step, or put a corrected version "
                          "and start the execution over",
                          v->broken);
    char *t = steps_error_json("workflow_invalid", msg);
    free(msg);
    return t;
}

int engine_workflow_get(struct engine *g, const char *ws, const char *wf, int version,
                        const struct wf **out, int *version_out, struct ifl_err *e)
{
    *out = NULL;
    if (version == 0)
        version = latest_find(g, ws, wf); /* 0 when unknown or stale */
    if (version > 0) {
        const struct wf *c = cache_find(g, ws, wf, version);
        if (c) {
            *out = c;
            *version_out = version;
            return 0;
        }
    }
    struct store_workflow sw;
    int rc = store_workflow_get(g->store, ws, wf, version, &sw, e);
    if (rc)
        return rc;
    if (version == 0) /* before cache_add: its trim keeps a latest version */
        latest_set(g, ws, wf, sw.version);
    const struct wf *c = cache_find(g, ws, wf, sw.version);
    if (!c) {
        json_t *def = NULL;
        struct wf *w = NULL;
        struct ifl_err ce = {0}; /* e may be NULL: the log says why all the same */
        rc = json_parse(sw.definition, strlen(sw.definition), NULL, &def, &ce);
        if (!rc)
            rc = wf_compile_stored(def, &w, &ce);
        json_decref(def);
        if (!rc)
            for (size_t i = 0; i < w->nv; i++)
                if (w->v[i].broken)
                    log_warn("workflow.broken_vertex",
                             "stored workflow %s/%s v%d: vertex %s no longer compiles (%s); its "
                             "steps fail with workflow_invalid",
                             ws, wf, sw.version, w->v[i].id, w->v[i].broken);
        if (rc) {
            log_error("workflow.corrupt", "stored workflow %s/%s v%d does not compile: %s", ws, wf,
                      sw.version, ce.msg);
            store_workflow_clear(&sw);
            return err_set(e, IFL_EINTERNAL, "stored workflow version does not compile");
        }
        c = cache_add(g, ws, wf, sw.version, w, strlen(sw.definition));
    }
    *out = c;
    *version_out = sw.version;
    store_workflow_clear(&sw);
    return 0;
}

static char *secret_aad(const char *ws, const char *name)
{
    return xasprintf("idemflow-secret/v1/%s/%s", ws, name);
}

/* Decrypts `sealed`, sealed under ws/name: 0 and *value (release with
 * engine_secret_release), or nonzero (*value NULL). */
static int secret_open(struct engine *g, const char *ws, const char *name, const char *sealed,
                       char **value)
{
    char *aad = secret_aad(ws, name);
    size_t n;
    *value = NULL;
    int rc = crypto_open(g->key, aad, sealed, value, &n);
    free(aad);
    return rc;
}

int engine_secret_put(struct engine *g, const char *ws, const char *name, const char *value,
                      struct ifl_err *e)
{
    int rc = store_workspace_exists(g->store, ws, e);
    if (rc)
        return rc;
    /* Every GATEWAY answer of the workspace is scrubbed of every secret it
     * holds: their number bounds that work (a new name past it is refused;
     * a value of one it holds may change). */
    char **names = NULL;
    size_t n = 0;
    if ((rc = store_secret_list(g->store, ws, &names, &n, e)))
        return rc;
    int known = 0;
    for (size_t i = 0; i < n && !known; i++)
        known = strcmp(names[i], name) == 0;
    store_strv_free(names, n);
    if (!known && n >= ENGINE_SECRETS_MAX)
        return err_setp(e, IFL_EVALIDATION, "", "a workspace holds at most %d secrets",
                        ENGINE_SECRETS_MAX);
    /* The value it replaces is kept for the scrubs (store_secret_put),
     * unless it is the one this PUT repeats: a PUT that changes nothing
     * (a deploy that sets every secret again) keeps nothing. */
    char *same = NULL, *old = NULL;
    if (known && store_secret_get(g->store, ws, name, &same, NULL) == 0) {
        if (secret_open(g, ws, name, same, &old) || strcmp(old, value) != 0) {
            free(same);
            same = NULL;
        }
        engine_secret_release(old);
    }
    char *aad = secret_aad(ws, name), *sealed = NULL;
    rc = crypto_seal(g->key, aad, value, strlen(value), &sealed);
    free(aad);
    if (rc) {
        free(same);
        return err_set(e, rc, "cannot encrypt the secret");
    }
    rc = store_secret_put(g->store, ws, name, sealed, same, e);
    free(sealed);
    free(same);
    pthread_mutex_lock(&g->scmu); /* after the commit: see sealed_all */
    g->sc_gen++;
    sealed_cache_drop(g, ws);
    pthread_mutex_unlock(&g->scmu);
    return rc;
}

int engine_secret_get(struct engine *g, const char *ws, const char *name, char **value,
                      struct ifl_err *e)
{
    char *sealed = NULL;
    *value = NULL;
    int rc = store_secret_get(g->store, ws, name, &sealed, e);
    if (rc)
        return rc;
    rc = secret_open(g, ws, name, sealed, value);
    free(sealed);
    if (rc)
        return err_set(e, IFL_EINTERNAL, "secret '%s' cannot be decrypted with this secrets key",
                       name);
    return 0;
}

void engine_secret_release(char *value)
{
    if (value) {
        crypto_wipe(value, strlen(value));
        free(value);
    }
}

static int secrets_all(struct engine *g, const char *ws, int fresh, char ***names, char ***values,
                       size_t *n, struct ifl_err *e)
{
    char **sealed = NULL;
    *values = NULL;
    *names = NULL;
    *n = 0;
    if (FAULT_FAILS("secrets.read"))
        return err_set(e, IFL_ESTORE, "fault point secrets.read");
    size_t n_now = 0;
    int rc = sealed_all(g, ws, fresh, names, &sealed, n, &n_now, e);
    if (rc) { /* what a failed read filled (the names go with the caller's release) */
        store_strv_free(sealed, *n);
        return rc;
    }
    *values = *n ? xcalloc(*n, sizeof **values) : NULL;
    for (size_t i = 0; i < *n; i++) {
        if (secret_open(g, ws, (*names)[i], sealed[i], &(*values)[i]))
            (*values)[i] = NULL;
        if (i >= n_now) { /* a retired value: scrubbed, never rendered */
            free((*names)[i]);
            (*names)[i] = xstrdup("");
        }
    }
    store_strv_free(sealed, *n);
    return 0;
}

int engine_secrets_all(struct engine *g, const char *ws, char ***names, char ***values, size_t *n,
                       struct ifl_err *e)
{
    return secrets_all(g, ws, 0, names, values, n, e);
}

int engine_secrets_fresh(struct engine *g, const char *ws, char ***names, char ***values, size_t *n,
                         struct ifl_err *e)
{
    if (g->shared_ttl_ms == INT64_MAX)
        return 1; /* the cache is the database's truth */
    return secrets_all(g, ws, 1, names, values, n, e) ? -1 : 0;
}

int engine_secrets_now(struct engine *g, const char *ws, char ***names, char ***values, size_t *n)
{
    /* past the cache only where it may lag (not SQLite's) */
    return secrets_all(g, ws, g->shared_ttl_ms != INT64_MAX, names, values, n, NULL) ? -1 : 0;
}

void engine_secrets_release(char **names, char **values, size_t n)
{
    for (size_t i = 0; values && i < n; i++)
        engine_secret_release(values[i]);
    free(values);
    store_strv_free(names, n);
}

/* ---- execution creation ------------------------------------------------------ */

/* {payload, steps, execution} around payload (a reference is taken).
 * payload_text: the text payload was parsed from, or NULL; a step output
 * with the same text (the entry's is the payload) shares its value instead
 * of being parsed again (the stored limits admit all the default ones do,
 * and nothing changes a context's values in place). */
static json_t *context_of(const struct store_execution *x, json_t *payload,
                          const char *payload_text, const struct store_step *rows, size_t n)
{
    json_t *ctx = json_object();
    json_object_set(ctx, "payload", payload);
    json_t *steps = json_object();
    for (size_t i = 0; i < n; i++) {
        if (rows[i].state != STEP_COMPLETED || !rows[i].output)
            continue;
        json_t *out = NULL;
        if (payload_text && strcmp(rows[i].output, payload_text) == 0)
            out = json_incref(payload);
        else if (json_parse(rows[i].output, strlen(rows[i].output), &json_stored_limits, &out,
                            NULL))
            continue;
        json_object_set_new(steps, rows[i].vertex, out);
    }
    json_object_set_new(ctx, "steps", steps);
    json_t *ex = json_object();
    json_object_set_new(ex, "id", json_string(x->id));
    json_object_set_new(ex, "workspace", json_string(x->workspace));
    json_object_set_new(ex, "workflow", json_string(x->workflow));
    json_object_set_new(ex, "test", json_boolean(x->test));
    json_object_set_new(ctx, "execution", ex);
    return ctx;
}

json_t *engine_context(const struct store_execution *x, const struct store_step *rows, size_t n)
{
    json_t *payload = NULL;
    const char *text = x->payload;
    if (json_parse(x->payload, strlen(x->payload), NULL, &payload, NULL)) {
        payload = json_null();
        text = NULL;
    }
    json_t *ctx = context_of(x, payload, text, rows, n);
    json_decref(payload);
    return ctx;
}

int engine_truthy(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_TRUE:
        return 1;
    case JSON_INTEGER:
    case JSON_REAL:
        return json_num(v) != 0;
    case JSON_STRING:
        return json_string_length(v) > 0;
    case JSON_OBJECT:
        return json_object_size(v) > 0;
    case JSON_ARRAY: {
        size_t i;
        json_t *it;
        json_array_foreach(v, i, it) if (engine_truthy(it)) return 1;
        return 0;
    }
    default:
        return 0;
    }
}

void engine_decide(const struct expr *cond, json_t *ctx, struct decision *d)
{
    d->error = NULL;
    if (!cond) {
        d->kind = EDGE_TAKEN;
        return;
    }
    json_t *out = NULL;
    struct expr_error xe = {0};
    if (expr_eval(cond, ctx, NULL, NULL, &out, &xe)) {
        d->kind = EDGE_ERROR;
        char msg[400];
        snprintf(msg, sizeof msg, "edge condition: %s", xe.msg);
        d->error = steps_error_json(xe.code, msg);
        return;
    }
    d->kind = out && engine_truthy(out) ? EDGE_TAKEN : EDGE_NOT_TAKEN;
    json_decref(out);
}

#define EARLY_MAX 8
struct create_args {
    const struct store_execution *x;
    const struct wf *w; /* rows[i] is the step of w->v[i] (steps_initial) */
    struct store_step *rows;
    size_t nrows;
    const char *status;
    int dispatched;
    int inlined;        /* TRANSFORMs completed at trigger time */
    const char *worker; /* … recorded as their attempt's worker */
    /* GATEWAY steps claimed at trigger time: their rows, their calls */
    struct {
        size_t row;
        long vi;
        struct gw_job *job;
    } early[EARLY_MAX];
    size_t nearly;
    char claimant[112]; /* … recorded as their attempt's worker and lease owner */
    int created;
    struct store_execution *existing;
    /* The entry point's ordering (spec §8), or NULL: an event whose version
     * is not newer than the key's last makes a "stale" execution (no steps);
     * one that skips versions is marked as a gap. */
    const struct store_ordering *ord;
    const char *ord_key_json; /* the key's value (JCS text), for the events */
    int stale, gap, had_last;
    int64_t last;
    /* A schedule's fire, or NULL: claimed first; when another fire took
     * the tick already, nothing is written (tick_taken). */
    const struct store_tick *tick;
    int tick_taken, tick_superseded;
};

/* 1 for a row completed at trigger time (not the entry: it has no attempt). */
static int inlined_row(const struct store_step *r)
{
    return r->state == STEP_COMPLETED && r->attempts > 0;
}

/* The TRANSFORMs the entry dispatched (and theirs, up to INLINE_MAX) run now,
 * in the trigger's thread: they are pure, their inputs are all here, and
 * they then commit with the execution in its one transaction — no claim, no
 * outcome transaction.  The first that fails to evaluate stays DISPATCHED,
 * for a worker to fail it with its error and events. */
static void inline_initial(struct engine *g, const struct wf *w, struct store_execution *nx,
                           json_t *ctx, struct create_args *ca)
{
    size_t used = 0; /* outputs so far (the entry's is the payload): the budget holds here too */
    for (int k = 0; k < INLINE_MAX; k++) {
        long vi = -1;
        for (size_t r = 0; r < ca->nrows && vi < 0; r++) {
            long t = wf_vertex_index(w, ca->rows[r].vertex);
            if (ca->rows[r].state == STEP_DISPATCHED && t >= 0 && w->v[t].type == WF_TRANSFORM)
                vi = t;
        }
        if (vi < 0)
            return;
        json_object_del(ctx, "response");
        json_t *out = NULL;
        char *out_text = NULL, *err_text = NULL;
        if (engine_transform_eval(g, nx->workspace, w, vi, ctx, NULL, &out, &out_text, &err_text)) {
            free(err_text);
            return;
        }
        if (k == 0) /* counted once, and only when a TRANSFORM ran */
            for (size_t r = 0; r < ca->nrows; r++)
                used += ca->rows[r].output ? strlen(ca->rows[r].output) : 0;
        used += strlen(out_text);
        if (used > STEPS_EXECUTION_OUTPUT_MAX) { /* a worker fails it, with its events */
            json_decref(out);
            free(out_text);
            return;
        }
        struct decision *d = engine_decide_edges(w, vi, ctx, out);
        if (expr_deadline_hit()) { /* a condition cut short: a worker decides it */
            engine_decisions_free(d, w->v[vi].n_out);
            json_decref(out);
            free(out_text);
            return;
        }
        /* as every error an evaluation writes (the context holds no GATEWAY
         * answer yet, but the rule has no exceptions) */
        engine_errors_scrub(g, nx->workspace, NULL, NULL, d, w->v[vi].n_out, NULL);
        steps_complete_initial(w, ca->rows, ca->nrows, vi, out_text, d);
        engine_decisions_free(d, w->v[vi].n_out);
        json_decref(out);
        free(out_text);
        ca->inlined++;
    }
}

/* What a call's job keeps of the rows it was claimed with: the join state
 * its completion plans with (engine_inline_plan: vertex, state, epoch, join
 * counters).  Outputs are in the job's context already, and a new
 * execution's rows carry no error for verify_first to read. */
static struct store_step *rows_for_job(const struct store_step *rows, size_t n)
{
    struct store_step *c = xcalloc(n ? n : 1, sizeof *c);
    for (size_t i = 0; i < n; i++) {
        memcpy(c[i].execution_id, rows[i].execution_id, sizeof c[i].execution_id);
        c[i].vertex = xstrdup(rows[i].vertex);
        c[i].state = rows[i].state;
        c[i].epoch = rows[i].epoch;
        c[i].attempts = rows[i].attempts;
        c[i].in_decided = rows[i].in_decided;
        c[i].in_taken = rows[i].in_taken;
    }
    return c;
}

/* GATEWAY steps the entry (or an inlined TRANSFORM) dispatched, due now, are
 * claimed by the creating transaction itself — EXECUTING at epoch 1, leased
 * to this process, their attempt row open — and their calls start right
 * after its commit, as a worker's would after a claim: no claim
 * transaction, no hand-off to a worker, no re-read of the execution.  The
 * request is rendered first; one that cannot be stays DISPATCHED for a
 * worker to fail it with its error.  Only while the gateway client has room
 * (otherwise the workers pace the calls), and never with --no-inline. */
static void claim_early(struct engine *g, const struct wf *w, const struct store_execution *nx,
                        json_t *payload, struct create_args *ca)
{
    if (g->run.no_inline || !g->gw) /* no gateway client: not started (or stopped) */
        return;
    int64_t now = clock_now_ms();
    int room = g->run.max_calls - engine_gw_inflight(g);
    snprintf(ca->claimant, sizeof ca->claimant, "%s/t", g->worker_prefix);
    for (size_t r = 0; r < ca->nrows && ca->nearly < EARLY_MAX && (int)ca->nearly < room; r++) {
        struct store_step *st = &ca->rows[r];
        long vi = wf_vertex_index(w, st->vertex);
        if (st->state != STEP_DISPATCHED || vi < 0 || w->v[vi].type != WF_GATEWAY ||
            st->next_run_at > now)
            continue;
        st->state = STEP_EXECUTING;
        st->epoch++;
        st->attempts++;
        st->lease_owner = xstrdup(ca->claimant);
        st->lease_expires_at = now + g->run.lease_ms;
        ca->early[ca->nearly].row = r;
        ca->early[ca->nearly++].vi = vi;
    }
    if (!ca->nearly)
        return;
    /* Each call gets a context of its own (the worker that finishes it adds
     * to it), built as a worker's is: see below. */
    size_t kept = 0;
    for (size_t k = 0; k < ca->nearly; k++) {
        struct store_step *st = &ca->rows[ca->early[k].row];
        struct store_claim c = {.vertex = st->vertex,
                                .workspace = st->workspace,
                                .kind = st->kind,
                                .epoch = st->epoch,
                                .attempts = st->attempts};
        snprintf(c.execution_id, sizeof c.execution_id, "%s", nx->id);
        size_t n = ca->nrows;
        struct store_step *seen = rows_for_job(ca->rows, n);
        char *err = NULL;
        int64_t again_at = 0;
        /* the context a worker's attempt would read, from the texts the
         * transaction stores (the payload's and the inline outputs'), so
         * that every attempt renders the same request: a value read back
         * from its text (-0 is written 0) is what later attempts see.
         * payload (non-NULL) is that value already: see prepare_steps. */
        json_t *jctx = payload ? context_of(nx, payload, nx->payload, ca->rows, ca->nrows)
                               : engine_context(nx, ca->rows, ca->nrows);
        struct gw_job *j =
            engine_gw_prepare(g, &c, w, ca->early[k].vi, jctx, &seen, &n, &err, &again_at);
        json_decref(jctx);
        store_steps_free(seen, n);
        free(err);
        if (!j) { /* back to DISPATCHED: a worker fails it, or sends it when it is to be tried
                     again (the others' plans go stale: safe) */
            if (again_at) /* its destination is busy: as a worker would defer it */
                st->next_run_at = again_at;
            st->state = STEP_DISPATCHED;
            st->epoch--;
            st->attempts--;
            free(st->lease_owner);
            st->lease_owner = NULL;
            st->lease_expires_at = 0;
            continue;
        }
        ca->early[kept] = ca->early[k];
        ca->early[kept++].job = j;
    }
    ca->nearly = kept;
}

/* After the creating transaction: the early calls start (it committed) or
 * are dropped (it did not, or found the execution there already). */
static void early_finish(struct engine *g, struct create_args *ca, int committed)
{
    for (size_t k = 0; k < ca->nearly; k++) {
        if (!committed) {
            engine_gw_discard(ca->early[k].job);
            continue;
        }
        const struct store_step *st = &ca->rows[ca->early[k].row];
        atomic_fetch_add(&g->m.steps_claimed, 1);
        atomic_fetch_add(&g->m.steps_claimed_early, 1);
        FAULT("step.after_claim");
        engine_trace(g, "run", st->execution_id, st->vertex, st->epoch);
        engine_gw_launch(ca->early[k].job, st->lease_expires_at - g->run.lease_ms);
    }
    ca->nearly = 0;
}

/* payload_is_text: payload is what nx->payload's text reads back as (the
 * trigger's body was that very text; trigger_req.payload_is_body), so the
 * early calls' contexts need not parse it again. */
static int prepare_steps(struct engine *g, const struct wf *w, size_t entry,
                         struct store_execution *nx, json_t *payload, int payload_is_text,
                         struct create_args *ca)
{
    json_t *ctx = context_of(nx, payload, NULL, NULL, 0);
    /* This thread (an HTTP thread, serving every workspace's requests)
     * gives the trigger's own work ENGINE_INLINE_MS in all, and leaves what
     * does not fit to a worker, which evaluates it with an expression's
     * whole time limit: first the entry's edge conditions (cut short, the
     * entry itself is left DISPATCHED and a worker decides them — the same
     * context, so the same decisions), then work a worker would do anyway. */
    expr_deadline_set(ENGINE_INLINE_MS);
    struct decision *d = engine_decide_edges(w, (long)entry, ctx, payload);
    int deferred = expr_deadline_hit();
    steps_initial(w, entry, nx->id, nx->workspace, nx->payload, deferred ? NULL : d, clock_now_ms(),
                  &ca->rows, &ca->nrows, &ca->status);
    ca->w = w;
    engine_decisions_free(d, w->v[entry].n_out);
    ca->worker = g->worker_prefix;
    if (!g->run.no_inline && !deferred)
        inline_initial(g, w, nx, ctx, ca);
    claim_early(g, w, nx, payload_is_text ? payload : NULL, ca);
    expr_deadline_set(0);
    json_decref(ctx);
    ca->status = steps_status(ca->rows, ca->nrows);
    nx->status = (char *)ca->status;
    /* every event of the creating transaction, stamped 1, 2, … (no bumps) */
    nx->version = 1;
    for (size_t i = 0; i < ca->nrows; i++) {
        ca->dispatched |= ca->rows[i].state == STEP_DISPATCHED;
        nx->version += inlined_row(&ca->rows[i]) || ca->rows[i].state == STEP_SKIPPED ||
                       ca->rows[i].state == STEP_FAILED;
    }
    nx->version += strcmp(ca->status, "running") != 0;
    return 0;
}

/* One transaction: the execution row (the atomic dedup insert), its steps,
 * and its events. */
/* The ordering facts of an execution's first event. */
static json_t *ordering_json(const struct create_args *a)
{
    json_t *key = NULL;
    json_parse(a->ord_key_json, strlen(a->ord_key_json), &json_stored_limits, &key, NULL);
    return json_pack("{s:o, s:I, s:o, s:b}", "key", key ? key : json_null(), "version",
                     (json_int_t)a->ord->version, "previousVersion",
                     a->had_last ? json_integer(a->last) : json_null(), "gap", a->gap);
}

static json_t *created_data(const struct create_args *a)
{
    const struct store_execution *x = a->x;
    json_t *d = json_object();
    json_object_set_new(d, "workflow", json_string(x->workflow));
    json_object_set_new(d, "workflowVersion", json_integer(x->workflow_version));
    json_object_set_new(d, "entryPoint", json_string(x->entry_point));
    if (x->started_over_from)
        json_object_set_new(d, "startedOverFrom", json_string(x->started_over_from));
    if (a->ord)
        json_object_set_new(d, "ordering", ordering_json(a));
    return d;
}

/* An event older than its key's last: recorded as an execution in status
 * "stale", with no steps and one event, so that its redeliveries dedupe
 * and an operator can see what was dropped. */
static int tx_insert_stale(struct store_tx *tx, struct create_args *a, struct ifl_err *e)
{
    struct store_execution sx = *a->x;
    sx.status = "stale";
    sx.version = 1;
    int rc = store_tx_execution_insert(tx, &sx, &a->created, e);
    if (rc)
        return rc;
    if (!a->created)
        return store_tx_execution_get(tx, sx.workspace, sx.id, a->existing, e);
    a->stale = 1;
    return steps_event(tx, sx.workspace, sx.id, "execution.stale", created_data(a), 1, e);
}

static int tx_create_execution(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct create_args *a = arg;
    const struct store_execution *x = a->x;
    a->created = 0;
    a->stale = a->gap = a->had_last = a->tick_taken = a->tick_superseded = 0;
    a->last = 0;
    store_execution_clear(a->existing);
    int rc;
    if (a->tick) {
        int claimed = 0;
        if ((rc = store_tx_tick_claim(tx, a->tick, &claimed, &a->tick_superseded, e)))
            return rc;
        if (!claimed) {
            a->tick_taken = !a->tick_superseded;
            return 0;
        }
    }
    if (a->ord) {
        int advanced = 0;
        if ((rc = store_tx_ordering_advance(tx, a->ord, &advanced, &a->had_last, &a->last, e)))
            return rc;
        if (!advanced)
            return tx_insert_stale(tx, a, e);
        a->gap = a->had_last && a->ord->version > a->last + 1;
    }
    /* Twice at most: the row this insert ran into may be a tombstone that
     * retention deleted meanwhile (PostgreSQL), and then the id is free. */
    for (int round = 0;; round++) {
        rc = store_tx_execution_insert(tx, x, &a->created, e);
        if (rc || a->created)
            break;
        rc = store_tx_execution_get(tx, x->workspace, x->id, a->existing, e);
        if (rc != IFL_ENOTFOUND || round == 1) {
            /* a duplicate (or a reused key's 422): it admitted nothing, so
             * the key's version goes back */
            if (!rc && a->ord)
                rc = store_tx_ordering_reset(tx, a->ord, a->had_last, a->last, e);
            a->gap = 0;
            return rc;
        }
    }
    if (rc)
        return rc;
    rc = store_tx_steps_insert(tx, a->rows, a->nrows, e);
    for (size_t k = 0; !rc && k < a->nearly; k++) {
        const struct store_step *r = &a->rows[a->early[k].row];
        rc = store_tx_attempt_record(tx, x->id, r->vertex, r->epoch, a->claimant, NULL, e);
    }
    if (rc)
        return rc;
    /* The row was inserted with the version its last event takes
     * (prepare_steps counted them); the events are stamped 1, 2, … */
    int64_t v = 1;
    if ((rc = steps_event(tx, x->workspace, x->id, "execution.created", created_data(a), v, e)))
        return rc;
    /* in the order they ran: a step after those it follows */
    for (size_t t = 0; !rc && t < a->nrows; t++) {
        const struct store_step *r = &a->rows[a->w->topo[t]];
        if (inlined_row(r)) {
            rc = store_tx_attempt_record(tx, x->id, r->vertex, r->epoch, a->worker, "completed", e);
            if (!rc)
                rc = steps_event_text(tx, x->workspace, x->id, "step.completed",
                                      steps_event_data_text(r), ++v, e);
        } else if (r->state == STEP_SKIPPED || r->state == STEP_FAILED) {
            json_t *sd = json_object();
            json_object_set_new(sd, "vertex", json_string(r->vertex));
            json_object_set_new(sd, "state", json_string(store_step_state_name(r->state)));
            rc = steps_event(tx, x->workspace, x->id,
                             r->state == STEP_SKIPPED ? "step.skipped" : "step.failed", sd, ++v, e);
        }
    }
    if (!rc && strcmp(a->status, "running") != 0) {
        char type[64];
        snprintf(type, sizeof type, "execution.%s", a->status);
        rc = steps_event_text(tx, x->workspace, x->id, type, steps_status_data_text(a->status), ++v,
                              e);
    }
    if (!rc && v != x->version)
        rc = err_set(e, IFL_EINTERNAL, "execution %s: %lld events for version %lld", x->id,
                     (long long)v, (long long)x->version);
    return rc;
}

void engine_trace(struct engine *g, const char *what, const char *xid, const char *vertex,
                  int64_t epoch)
{
    if (g->trace_fd < 0)
        return;
    char line[256];
    int n = snprintf(line, sizeof line, "%s %s %s %lld\n", what, xid, vertex, (long long)epoch);
    if (n > 0 && (size_t)n < sizeof line && write(g->trace_fd, line, (size_t)n) != n)
        log_warn("trace.write", "cannot write the trace file");
}

/* Trace lines ("inline" before the commit, "completed" after it) for the
 * rows completed at trigger time (IDEMFLOW_TRACE_FILE, docs/faults.md). */
static void trace_inlined(struct engine *g, const struct create_args *ca, const char *what)
{
    for (size_t i = 0; g->trace_fd >= 0 && i < ca->nrows; i++)
        if (inlined_row(&ca->rows[i]))
            engine_trace(g, what, ca->x->id, ca->rows[i].vertex, ca->rows[i].epoch);
}

/* After a creating transaction committed: metrics and traces. */
static void created(struct engine *g, const struct create_args *ca)
{
    if (ca->stale) {
        atomic_fetch_add(&g->m.ordering_stale, 1);
        engine_execution_moved(g, ca->x->id, "stale");
        return;
    }
    if (ca->gap)
        atomic_fetch_add(&g->m.ordering_gaps, 1);
    if (ca->inlined) {
        atomic_fetch_add(&g->m.steps_inlined, (unsigned long)ca->inlined);
        atomic_fetch_add(&g->m.steps_completed, (unsigned long)ca->inlined);
        trace_inlined(g, ca, "completed");
    }
    if (strcmp(ca->status, "running") != 0)
        engine_execution_moved(g, ca->x->id, ca->status);
    if (ca->dispatched)
        engine_wake(g);
}

/* Compares a stored execution with the trigger that collided with it. */
static int answer_existing(const struct store_execution *x, const char *hash, int client_mode,
                           struct trigger_res *out, struct ifl_err *e)
{
    out->created = 0;
    out->same_payload = strcmp(x->payload_hash, hash) == 0;
    snprintf(out->id, sizeof out->id, "%s", x->id);
    snprintf(out->status, sizeof out->status, "%s", x->status);
    if (client_mode && !out->same_payload) {
        err_set(e, IFL_EKEYREUSED,
                "this idempotency key was already used with a different payload (execution %s)",
                x->id);
        err_slug(e, "idempotency-key-reused");
        return IFL_EKEYREUSED;
    }
    return 0;
}

/* A trigger between its decision to create an execution and the commit of
 * the creating transaction (engine_trigger_begin/commit/end). */
struct engine_trigger_op {
    struct engine *g;
    const struct wf *w;     /* a reference (engine_workflow_get); ca.w borrows it */
    char *ws, *wf, *vertex; /* copies: the request's strings may be gone */
    struct store_execution nx, x;
    struct create_args ca;
    char hash[65];
    int client_mode;
    struct store_ordering ord; /* ca.ord points here when the entry point orders */
    char *ord_key;             /* the key's JCS text */
    char ord_key_hash[65];
    struct store_tick tick; /* ca.tick points here for a schedule's fire */
    int rc;                 /* of the transaction */
    struct ifl_err err;
    engine_trigger_cb cb;
    void *cb_arg;
};

static void op_free(struct engine_trigger_op *op)
{
    free(op->nx.identity);
    free(op->nx.payload);
    store_steps_free(op->ca.rows, op->ca.nrows);
    store_execution_clear(&op->x);
    free(op->ord_key);
    free(op->ws);
    free(op->wf);
    free(op->vertex);
    wf_release(op->w);
    free(op);
}

/* The JSON Pointer of a dot path in the payload. */
static void path_pointer(const char *path, char *out, size_t cap)
{
    struct buf b;
    buf_init(&b, 0);
    for (const char *p = path; *p;) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        char *seg = xasprintf("%.*s", (int)n, p);
        json_pointer_push(&b, seg);
        free(seg);
        p += n + (dot != NULL);
    }
    snprintf(out, cap, "%s", b.p ? b.p : "");
    buf_free(&b);
}

/* The event's ordering key (JCS text, *key owned) and version, from the
 * paths of the entry point's "ordering".  IFL_EVALIDATION with a pointer
 * into the payload when one is missing or the version is not an integer. */
static int ordering_of(const struct wf_vertex *v, json_t *payload, char **key, int64_t *version,
                       struct ifl_err *e)
{
    *key = NULL;
    json_t *km = NULL, *vm = NULL;
    const struct id_fields *missing = &v->ord_key;
    int rc = identity_fields_material(missing, payload, &km, e);
    if (!rc) {
        missing = &v->ord_version;
        rc = identity_fields_material(missing, payload, &vm, e);
    }
    if (rc) {
        char ptr[IFL_ERR_PTR_MAX];
        snprintf(ptr, sizeof ptr, "%s", e ? e->pointer : "");
        err_setp(e, rc, ptr, "the payload has no value at ordering %s '%s'",
                 missing == &v->ord_key ? "key" : "version", missing->paths[0]);
        err_slug(e, "missing-ordering-field");
        goto out;
    }
    json_t *kv = json_object_get(km, v->ord_key.paths[0]);
    json_t *vv = json_object_get(vm, v->ord_version.paths[0]);
    double d = json_is_number(vv) ? json_num(vv) : NAN;
    if (!(d >= -9007199254740992.0 && d <= 9007199254740992.0) || d != (double)(int64_t)d) {
        char ptr[IFL_ERR_PTR_MAX];
        path_pointer(v->ord_version.paths[0], ptr, sizeof ptr);
        rc = err_setp(e, IFL_EVALIDATION, ptr,
                      "the ordering version (%s) must be an integer of at most 2^53",
                      v->ord_version.paths[0]);
        err_slug(e, "invalid-ordering-version");
        goto out;
    }
    *version = (int64_t)d;
    struct buf b;
    buf_init(&b, 0);
    if (json_jcs(kv, &b)) {
        buf_free(&b);
        rc = err_set(e, IFL_EINVAL, "the ordering key holds a non-finite number");
        goto out;
    }
    *key = buf_steal(&b);
out:
    json_decref(km);
    json_decref(vm);
    return rc;
}

static const char *req_header(const struct trigger_req *r, const char *name)
{
    return r->header ? r->header(r->header_ctx, name) : NULL;
}

/* Verifies the signature the entry point asks for (spec §8) over the raw
 * body.  For Standard Webhooks, webhook_id (256 bytes) receives the
 * delivery's id, the identity of its execution; empty otherwise (the
 * hmac-sha256 senders' delivery ids are not signed, so the payload or
 * idempotencyFields identify those executions: a replayed body cannot make
 * a second one by changing an unsigned header). */
static int verify_signature(struct engine *g, const struct trigger_req *r,
                            const struct wf_signature *s, char *webhook_id, struct ifl_err *e)
{
    webhook_id[0] = '\0';
    char *secret = NULL;
    int rc = engine_secret_get(g, r->ws, s->secret, &secret, NULL);
    if (rc) {
        log_error("trigger.signature_secret",
                  "%s/%s/%s: the signing secret '%s' cannot be read; deliveries are refused "
                  "with 503 until it exists",
                  r->ws, r->wf, r->vertex, s->secret);
        return err_set(e, IFL_EBUSY, "this entry point cannot verify signatures right now");
    }
    if (s->scheme == WF_SIG_HMAC) {
        const char *value = req_header(r, s->header);
        enum whsig_encoding enc = s->base64 ? WHSIG_BASE64 : WHSIG_HEX;
        rc = s->ts_prefix ? whsig_hmac_ts_verify(secret, strlen(secret), value, s->ts_prefix,
                                                 s->prefix, enc, r->body, r->body_len,
                                                 clock_now_ms() / 1000, s->tolerance_s, e)
                          : whsig_hmac_verify(secret, strlen(secret), value, s->prefix, enc,
                                              r->body, r->body_len, e);
        engine_secret_release(secret);
        return rc;
    }
    uint8_t *key = NULL;
    size_t klen = 0;
    rc = whsig_secret_decode(secret, &key, &klen);
    engine_secret_release(secret);
    if (rc) {
        log_error("trigger.signature_secret",
                  "%s/%s/%s: the signing secret '%s' is not a Standard Webhooks secret "
                  "(whsec_ and the base64 of %d bytes or more); deliveries are refused with 503",
                  r->ws, r->wf, r->vertex, s->secret, WHSIG_KEY_MIN);
        return err_set(e, IFL_EBUSY, "this entry point cannot verify signatures right now");
    }
    const char *id = req_header(r, "webhook-id");
    rc = whsig_standard_verify(key, klen, id, req_header(r, "webhook-timestamp"),
                               req_header(r, "webhook-signature"), r->body, r->body_len,
                               clock_now_ms() / 1000, s->tolerance_s, e);
    crypto_wipe(key, klen);
    free(key);
    if (rc)
        return rc;
    if (!identity_client_key_valid(id))
        return err_setp(e, IFL_EINVAL, "/webhook-id",
                        "webhook-id must be 1-255 printable ASCII characters");
    snprintf(webhook_id, 256, "%s", id);
    return 0;
}

int engine_trigger_begin(struct engine *g, const struct trigger_req *r, struct trigger_res *out,
                         struct engine_trigger_op **opp, struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    *opp = NULL;
    FAULT("trigger.begin");
    const struct wf *w = NULL; /* a reference: the op's, or released at done */
    int version = 0;
    json_t *material = NULL, *identity = NULL;
    int rc =
        engine_workflow_get(g, r->ws, r->wf, r->tick_at ? r->tick_version : 0, &w, &version, e);
    long vi = rc ? -1 : wf_vertex_index(w, r->vertex);
    const struct wf_vertex *v = vi >= 0 && w->v[vi].type == WF_ENTRY_POINT ? &w->v[vi] : NULL;
    /* Without a bearer token only a signed entry point answers: what
     * exists is not told to an unauthenticated caller. */
    if (r->unauthenticated && !r->tick_at && (!v || v->sig.scheme == WF_SIG_NONE)) {
        err_set(e, IFL_EUNAUTH, "a valid bearer token is required");
        rc = err_slug(e, "unauthorized");
        goto done;
    }
    if (rc == IFL_ENOTFOUND && store_workspace_exists(g->store, r->ws, e) == IFL_ENOTFOUND)
        rc = err_slug(e, "workspace-not-found");
    if (rc)
        goto done;
    if (!v) {
        rc = err_set(e, IFL_ENOTFOUND, "workflow '%s' has no entry point '%s'", r->wf, r->vertex);
        goto done;
    }
    char webhook_id[256] = "";
    if (v->sig.scheme != WF_SIG_NONE && !r->tick_at &&
        (rc = verify_signature(g, r, &v->sig, webhook_id, e))) {
        if (rc == IFL_EUNAUTH)
            err_slug(e, "invalid-signature");
        goto done;
    }

    /* Identity: random when forced (test runs); else webhook id > client
     * key > idempotencyFields > payload. */
    const char *mode;
    identity = json_object();
    char id[65];
    if (r->force_new || r->tick_at) {
        mode = "random";
        rc = identity_random(r->ws, r->wf, r->vertex, id, e);
        if (r->tick_at) {
            char at[32];
            clock_rfc3339(r->tick_at, at);
            json_object_set_new(identity, "scheduledAt", json_string(at));
        }
    } else if (webhook_id[0]) {
        mode = "webhook";
        material = json_string(webhook_id);
        json_object_set(identity, "webhookId", material);
        rc = identity_compute(r->ws, r->wf, r->vertex, mode, material, id, e);
    } else {
        /* A signed entry point takes its identity from what is signed: a
         * client key (query or header) is not, so it is ignored there —
         * else a captured delivery replayed under new keys would start new
         * executions. */
        if (r->client_key && v->sig.scheme == WF_SIG_NONE) {
            if (!identity_client_key_valid(r->client_key)) {
                if (r->key_in_header) {
                    err_set(e, IFL_EINVAL,
                            "the Idempotency-Key header must be 1-255 printable ASCII characters");
                    rc = err_slug(e, "invalid-idempotency-key");
                } else {
                    rc = err_setp(e, IFL_EINVAL, "/clientIdempotencyId",
                                  "clientIdempotencyId must be 1-255 printable ASCII characters");
                }
                goto done;
            }
            mode = "client";
            material = json_string(r->client_key);
            json_object_set(identity, "key", material);
        } else if (v->has_fields) {
            mode = "fields";
            if ((rc = identity_fields_material(&v->fields, r->payload, &material, e)))
                goto done;
            json_object_set(identity, "fields", material);
        } else {
            mode = "payload";
            material = json_incref(r->payload);
        }
        rc = identity_compute(r->ws, r->wf, r->vertex, mode, material, id, e);
    }
    if (rc)
        goto done;
    json_object_set_new(identity, "mode", json_string(mode));

    struct buf canon;
    buf_init(&canon, 0);
    if (json_jcs(r->payload, &canon)) {
        buf_free(&canon);
        rc = err_set(e, IFL_EINVAL, "the payload holds a non-finite number");
        goto done;
    }
    char hash[65];
    crypto_sha256_hex(canon.p, canon.len, hash);
    buf_free(&canon);
    int client_mode = strcmp(mode, "client") == 0;

    /* Fast path for repeats: a read, no write (store_execution_probe: none
     * at all for an id the store knows to be new, or takes for new). */
    if (!r->force_new && !r->tick_at) {
        struct store_execution x = {0};
        rc = store_execution_probe(g->store, r->ws, id, &x, NULL);
        if (rc == 0) {
            rc = answer_existing(&x, hash, client_mode, out, e);
            store_execution_clear(&x);
            goto done;
        }
        rc = 0;
    }
    /* Test runs leave the production ordering alone. */
    char *ord_key = NULL;
    int64_t ord_version = 0;
    if (v->has_ordering && !r->test && !r->tick_at &&
        (rc = ordering_of(v, r->payload, &ord_key, &ord_version, e)))
        goto done;

    struct engine_trigger_op *op = xcalloc(1, sizeof *op);
    op->g = g;
    op->w = w; /* the reference passes to the op */
    w = NULL;
    op->ws = xstrdup(r->ws);
    op->wf = xstrdup(r->wf);
    op->vertex = xstrdup(r->vertex);
    memcpy(op->hash, hash, sizeof hash);
    op->client_mode = client_mode;
    struct store_execution *nx = &op->nx;
    snprintf(nx->id, sizeof nx->id, "%s", id);
    snprintf(out->id, sizeof out->id, "%s", id);
    nx->workspace = op->ws;
    nx->workflow = op->wf;
    nx->workflow_version = version;
    nx->entry_point = op->vertex;
    nx->identity = json_to_string(identity);
    nx->payload = json_to_string(r->payload);
    snprintf(nx->payload_hash, sizeof nx->payload_hash, "%s", hash);
    nx->test = r->test;
    op->ca.x = nx;
    op->ca.existing = &op->x;
    if (ord_key) {
        op->ord_key = ord_key;
        crypto_sha256_hex(ord_key, strlen(ord_key), op->ord_key_hash);
        op->ord =
            (struct store_ordering){op->ws, op->wf, op->vertex, op->ord_key_hash, ord_version};
        op->ca.ord = &op->ord;
        op->ca.ord_key_json = ord_key;
    }
    if (r->tick_at) {
        op->tick = (struct store_tick){op->ws, op->wf, op->vertex, r->tick_at, nx->id, version};
        op->ca.tick = &op->tick;
    }
    int is_text = r->payload_is_body && r->body && r->body_len == strlen(nx->payload) &&
                  memcmp(r->body, nx->payload, r->body_len) == 0;
    prepare_steps(g, op->w, (size_t)vi, nx, r->payload, is_text, &op->ca);
    trace_inlined(g, &op->ca, "inline");
    *opp = op;
done:
    json_decref(material);
    json_decref(identity);
    wf_release(w);
    return rc;
}

static void op_committed(void *arg, int rc, const struct ifl_err *e)
{
    struct engine_trigger_op *op = arg;
    op->rc = rc;
    if (rc && e)
        op->err = *e;
    op->cb(op->cb_arg);
}

void engine_trigger_commit(struct engine_trigger_op *op, engine_trigger_cb cb, void *arg)
{
    op->cb = cb;
    op->cb_arg = arg;
    FAULT("trigger.before_commit");
    int rc = store_tx_submit(op->g->store, tx_create_execution, &op->ca, op_committed, op);
    if (rc) {
        struct ifl_err e = {0};
        err_set(&e, rc, rc == IFL_EBUSY ? "the store is closing" : "the store cannot queue");
        op_committed(op, rc, &e);
    }
}

int engine_trigger_end(struct engine_trigger_op *op, struct trigger_res *out, struct ifl_err *e)
{
    struct engine *g = op->g;
    int rc = op->rc;
    early_finish(g, &op->ca, !rc && op->ca.created && !op->ca.stale);
    if (rc) {
        if (e)
            *e = op->err;
    } else if (op->ca.tick_taken) {
        rc = err_set(e, IFL_ECONFLICT, "this tick was fired already");
        err_slug(e, "tick-fired");
    } else if (op->ca.tick_superseded) {
        rc = err_set(e, IFL_ECONFLICT, "a newer version of the workflow was put before this tick");
        err_slug(e, "tick-superseded");
    } else if (op->ca.created) {
        out->created = !op->ca.stale;
        out->stale = op->ca.stale;
        out->same_payload = 1;
        snprintf(out->id, sizeof out->id, "%s", op->nx.id);
        snprintf(out->status, sizeof out->status, "%s", op->ca.stale ? "stale" : op->ca.status);
        created(g, &op->ca);
    } else {
        rc = answer_existing(&op->x, op->hash, op->client_mode, out, e);
    }
    op_free(op);
    return rc;
}

/* Commit and end in this thread, waiting for the commit (any store). */
int engine_trigger_run(struct engine_trigger_op *op, struct trigger_res *out, struct ifl_err *e)
{
    FAULT("trigger.before_commit");
    op->rc = store_tx_run(op->g->store, tx_create_execution, &op->ca, &op->err);
    return engine_trigger_end(op, out, e);
}

int engine_can_defer(const struct engine *g)
{
    return store_can_submit(g->store);
}

/* ---- operator actions ------------------------------------------------------------- */

/* Execution id of ws into *x (clear it after, also on error) and the
 * workflow version it pinned into *w (a reference to release, NULL on
 * error). */
static int execution_and_workflow(struct engine *g, const char *ws, const char *id,
                                  struct store_execution *x, const struct wf **w, struct ifl_err *e)
{
    memset(x, 0, sizeof *x);
    int version = 0;
    int rc = store_execution_get(g->store, ws, id, x, e);
    if (!rc)
        rc = engine_gone(x, e);
    if (!rc)
        rc = engine_workflow_get(g, ws, x->workflow, x->workflow_version, w, &version, e);
    return rc;
}

int engine_gone(const struct store_execution *x, struct ifl_err *e)
{
    if (strcmp(x->status, "purged") != 0)
        return 0;
    int rc = err_set(e, IFL_EGONE,
                     "execution %s finished and was purged by retention; its id still "
                     "deduplicates triggers until its entry point's dedupWindow has passed",
                     x->id);
    err_slug(e, "execution-purged");
    return rc;
}

/* ---- the API's Idempotency-Key on operator actions (spec §7) ------------------ */

#define KEY_RETENTION_DEFAULT_MS (24LL * 3600 * 1000)

int64_t engine_key_retention(const struct engine *g)
{
    return g->run.key_retention_ms > 0 ? g->run.key_retention_ms : KEY_RETENTION_DEFAULT_MS;
}

/* Claims k's key for an action of `scope`, first in its transaction: the
 * record it inserts is overwritten with the answer by op_key_answer before
 * the commit, so nobody ever reads the claim itself (on PostgreSQL a
 * concurrent claim from another session answers 409 while no committed
 * record exists: store_tx_idem_put).  A record past its retention is claimed anew.  On a repeat
 * with the same fingerprint, k->replayed = 1 and *replay (owned) = the
 * stored answer: the caller changes nothing. */
int engine_op_key_claim(struct engine *g, struct store_tx *tx, const char *ws, const char *scope,
                        struct engine_op_key *k, char **replay, struct ifl_err *e)
{
    k->replayed = 0;
    k->status = 0;
    free(*replay);
    *replay = NULL;
    if (!k->key)
        return 0;
    struct store_idem rec = {.fingerprint = (char *)k->fingerprint, .response = "null"};
    int rc = 0;
    /* At most a few rounds: a record past its retention is re-claimed by a
     * compare-and-set on its time; when that finds it changed (another
     * request re-claimed it, or the sweeper deleted it), look again. */
    for (int round = 0; round < 4; round++) {
        struct store_idem old = {0};
        int created = 0, changed = 0;
        rc = store_tx_idem_put(tx, ws, scope, k->key, &rec, &created, &old, e);
        if (rc || created) {
            store_idem_clear(&old);
            if (created)
                FAULT("opkey.after_claim");
            return rc;
        }
        int64_t now = clock_now_ms();
        if (old.created_at <= now - engine_key_retention(g)) {
            rec.created_at = now;
            FAULT("opkey.before_reclaim");
            rc = store_tx_idem_set(tx, ws, scope, k->key, &rec, old.created_at, &changed, e);
            store_idem_clear(&old);
            if (rc || changed)
                return rc;
            continue;
        }
        if (strcmp(old.fingerprint, k->fingerprint) != 0) {
            rc = err_set(e, IFL_EKEYREUSED,
                         "this Idempotency-Key was already used for another %s request", scope);
            err_slug(e, "idempotency-key-reused");
        } else {
            k->replayed = 1;
            k->status = old.status;
            *replay = old.response;
            old.response = NULL;
        }
        store_idem_clear(&old);
        return rc;
    }
    return err_set(e, IFL_EBUSY, "this Idempotency-Key is contended; send it again");
}

int engine_op_key_enter(struct engine *g, struct engine_key_inflight *n, const char *ws,
                        const char *scope, const char *key, struct ifl_err *e)
{
    *n = (struct engine_key_inflight){.ws = ws, .scope = scope, .key = key};
    if (!key)
        return 0;
    pthread_mutex_lock(&g->kmu);
    int busy = 0;
    for (const struct engine_key_inflight *o = g->keys_inflight; o && !busy; o = o->next)
        busy = strcmp(o->key, key) == 0 && strcmp(o->scope, scope) == 0 && strcmp(o->ws, ws) == 0;
    if (!busy) {
        n->next = g->keys_inflight;
        g->keys_inflight = n;
    }
    pthread_mutex_unlock(&g->kmu);
    if (!busy)
        return 0;
    n->key = NULL; /* not registered: leave does nothing */
    /* Another request with the key runs here.  When the key's record is
     * committed, that one is a repeat too (or a re-claim past retention,
     * which the claim's compare-and-set settles): go on and replay.  Only
     * a key without a committed record is the first request in flight. */
    int found = 0;
    int rc = store_idem_exists(g->store, ws, scope, key, &found, e);
    if (rc || found)
        return rc;
    return store_key_in_flight(e);
}

void engine_op_key_leave(struct engine *g, struct engine_key_inflight *n)
{
    if (!n->key)
        return;
    pthread_mutex_lock(&g->kmu);
    for (struct engine_key_inflight **p = &g->keys_inflight; *p; p = &(*p)->next)
        if (*p == n) {
            *p = n->next;
            break;
        }
    pthread_mutex_unlock(&g->kmu);
}

/* Stores the answer of the action that claimed k's key (nothing without
 * a key). */
int engine_op_key_answer(struct store_tx *tx, const char *ws, const char *scope,
                         const struct engine_op_key *k, int status, const char *answer,
                         struct ifl_err *e)
{
    if (!k->key)
        return 0;
    struct store_idem rec = {.fingerprint = (char *)k->fingerprint,
                             .status = status,
                             .response = (char *)answer,
                             .created_at = clock_now_ms()};
    int changed = 0;
    int rc = store_tx_idem_set(tx, ws, scope, k->key, &rec, -1, &changed, e);
    if (!rc && !changed)
        rc = err_set(e, IFL_ESTORE, "idempotency record vanished");
    return rc;
}

/* The replayed answer as JSON (a stored answer always parses; a damaged
 * one is a store error rather than a crash). */
int engine_replay_answer(const char *text, json_t **answer, struct ifl_err *e)
{
    if (json_parse(text, strlen(text), &json_stored_limits, answer, e) == 0)
        return 0;
    return err_set(e, IFL_ESTORE, "the stored answer of this Idempotency-Key is damaged");
}

/* An action on a purged execution (engine_gone): a repeat of one answered
 * before the purge still replays that answer (k->replayed, *answer);
 * anything else is the 410 already in *e.  The key's claim is rolled back
 * when there is nothing to replay. */
struct gone_args {
    struct engine *g;
    const char *ws, *scope;
    struct engine_op_key *k;
    char *replay;
};

static int tx_gone(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct gone_args *a = arg;
    struct ifl_err scratch = {0};
    int rc = engine_op_key_claim(a->g, tx, a->ws, a->scope, a->k, &a->replay, &scratch);
    if (rc == IFL_ECONFLICT && strcmp(scratch.slug, "idempotency-key-in-flight") == 0) {
        *e = scratch; /* the key's first request is still running: 409, not 410 */
        return rc;
    }
    if (rc || !a->k->replayed)
        return IFL_EGONE; /* rolls the claim back; *e keeps the 410 */
    return 0;
}

static int gone_or_replay(struct engine *g, const char *ws, const char *scope,
                          struct engine_op_key *k, json_t **answer, struct ifl_err *e)
{
    if (!k || !k->key)
        return e->code;
    struct ifl_err gone = *e;
    struct gone_args a = {g, ws, scope, k, NULL};
    int rc = store_tx_run(g->store, tx_gone, &a, e);
    if (!rc && k->replayed)
        rc = engine_replay_answer(a.replay, answer, e);
    else if (rc != IFL_ECONFLICT)
        *e = gone;
    free(a.replay);
    return rc ? (rc == IFL_EGONE ? gone.code : rc) : 0;
}

/* What an operator action reads before its transaction: an execution's
 * steps and, for its GATEWAY steps in a state of `states` (a bit per enum
 * step_state), the epoch each is at and whether its call's effect is
 * unknown (steps_effect_unknown, with resend for an action that sends the
 * call again).  On success the caller frees *rows and *seen (whose vertex
 * names are *rows'). */
#define STATE_BIT(st) (1u << (st))
static int gateway_steps_seen(struct engine *g, const char *id, unsigned states, int resend,
                              struct store_step **rows, size_t *n, struct steps_seen **seen,
                              size_t *n_seen, struct ifl_err *e)
{
    struct store_attempt *at = NULL;
    size_t na = 0;
    *seen = NULL;
    *n_seen = 0;
    int rc = store_steps_get(g->store, id, rows, n, e);
    if (rc)
        return rc;
    if ((rc = store_attempts_get(g->store, id, &at, &na, e))) {
        store_steps_free(*rows, *n);
        *rows = NULL;
        *n = 0;
        return rc;
    }
    *seen = xcalloc(*n ? *n : 1, sizeof **seen);
    for (size_t i = 0; i < *n; i++) {
        const struct store_step *st = &(*rows)[i];
        if (!(states & STATE_BIT(st->state)) || strcmp(st->kind, "GATEWAY") != 0)
            continue;
        (*seen)[(*n_seen)++] = (struct steps_seen){
            .vertex = st->vertex,
            .epoch = st->epoch,
            .unknown = steps_effect_unknown(at, na, st->vertex, resend),
        };
    }
    store_attempts_free(at, na);
    return 0;
}

struct retry_args {
    struct engine *g;
    struct steps_retry r;
    struct engine_op_key *k;
    char *replay; /* the stored answer, when k->replayed */
};

/* steps_retry's decide_edge: the condition over {payload, steps,
 * execution} with `response` the source's output, as at its completion. */
static void retry_decide_edge(const void *scrub, const struct wf *w, size_t edge,
                              const struct store_execution *x, const struct store_step *rows,
                              size_t n, const struct store_step *from, struct decision *d)
{
    json_t *ctx = engine_context(x, rows, n), *out = NULL;
    if (!from->output ||
        json_parse(from->output, strlen(from->output), &json_stored_limits, &out, NULL))
        out = json_null();
    json_object_set_new(ctx, "response", out);
    engine_decide(w->e[edge].cond, ctx, d);
    json_decref(ctx);
    if (scrub)
        engine_text_scrub(scrub, &d->error);
    else /* the secrets could not be read */
        engine_text_redact(&d->error);
}

static json_t *retry_answer(const struct steps_retry *r)
{
    return json_pack("{s:s, s:i, s:s}", "executionId", r->execution_id, "retriedSteps", r->retried,
                     "status", r->status);
}

static int tx_retry(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct retry_args *a = arg;
    int rc = engine_op_key_claim(a->g, tx, a->r.workspace, "retry", a->k, &a->replay, e);
    if (rc || a->k->replayed)
        return rc;
    if ((rc = steps_retry(tx, &a->r, e)) || !a->k->key)
        return rc;
    json_t *o = retry_answer(&a->r);
    char *text = json_to_string(o);
    json_decref(o);
    rc = engine_op_key_answer(tx, a->r.workspace, "retry", a->k, 200, text, e);
    free(text);
    return rc;
}

static int retry_keyed(struct engine *g, const char *ws, const char *id, int send_again,
                       struct engine_op_key *k, json_t **answer, struct ifl_err *e)
{
    struct engine_op_key none = {0};
    if (!k)
        k = &none;
    struct store_execution x;
    const struct wf *w = NULL;
    int rc = execution_and_workflow(g, ws, id, &x, &w, e);
    store_execution_clear(&x);
    if (rc == IFL_EGONE)
        return gone_or_replay(g, ws, "retry", k, answer, e);
    if (rc)
        return rc;
    struct store_step *rows = NULL;
    struct steps_seen *seen = NULL;
    size_t n = 0, n_seen = 0;
    if ((rc = gateway_steps_seen(g, id,
                                 STATE_BIT(STEP_FAILED) | STATE_BIT(STEP_REQUIRES_RECONCILIATION),
                                 1, &rows, &n, &seen, &n_seen, e))) {
        wf_release(w);
        return rc;
    }
    /* read before the transaction: a condition's error is scrubbed of them */
    struct gw_request scrub = {0};
    int unread = engine_scrub_list(g, ws, &scrub);
    struct retry_args a = {
        .g = g,
        .r = {.w = w,
              .workspace = ws,
              .execution_id = id,
              .now = clock_now_ms(),
              .seen = seen,
              .n_seen = n_seen,
              .decide_edge = retry_decide_edge,
              .decide_ctx = unread ? NULL : &scrub,
              .send_again = send_again},
        .k = k,
    };
    rc = store_tx_run(g->store, tx_retry, &a, e);
    gw_request_clear(&scrub);
    free(seen);
    store_steps_free(rows, n);
    if (!rc && k->replayed)
        rc = engine_replay_answer(a.replay, answer, e);
    else if (!rc)
        *answer = retry_answer(&a.r);
    if (!rc && !k->replayed && a.r.retried) {
        engine_wake(g);
        /* every step it retried was skipped: the execution ended here */
        if (a.r.ended)
            engine_execution_moved(g, id, a.r.status);
    }
    free(a.replay);
    wf_release(w);
    return rc;
}

int engine_retry(struct engine *g, const char *ws, const char *id, int send_again,
                 struct engine_op_key *k, json_t **answer, struct ifl_err *e)
{
    *answer = NULL;
    struct engine_key_inflight n;
    int rc = engine_op_key_enter(g, &n, ws, "retry", k ? k->key : NULL, e);
    if (!rc) {
        rc = retry_keyed(g, ws, id, send_again, k, answer, e);
        engine_op_key_leave(g, &n);
    }
    return rc;
}

struct cancel_args {
    struct engine *g;
    struct steps_cancel c;
    struct engine_op_key *k;
    char *replay;
};

static json_t *cancel_answer(const struct steps_cancel *c)
{
    return json_pack("{s:s, s:i, s:s}", "executionId", c->execution_id, "cancelledSteps",
                     c->cancelled, "status", c->status);
}

static int tx_cancel(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct cancel_args *a = arg;
    int rc = engine_op_key_claim(a->g, tx, a->c.workspace, "cancel", a->k, &a->replay, e);
    if (rc || a->k->replayed)
        return rc;
    if ((rc = steps_cancel(tx, &a->c, e)) || !a->k->key)
        return rc;
    json_t *o = cancel_answer(&a->c);
    char *text = json_to_string(o);
    json_decref(o);
    rc = engine_op_key_answer(tx, a->c.workspace, "cancel", a->k, 200, text, e);
    free(text);
    return rc;
}

static int cancel_keyed(struct engine *g, const char *ws, const char *id, const char *reason,
                        struct engine_op_key *k, json_t **answer, struct ifl_err *e)
{
    struct engine_op_key none = {0};
    if (!k)
        k = &none;
    struct store_execution x;
    memset(&x, 0, sizeof x);
    int rc = store_execution_get(g->store, ws, id, &x, e);
    if (!rc)
        rc = engine_gone(&x, e);
    store_execution_clear(&x);
    if (rc == IFL_EGONE)
        return gone_or_replay(g, ws, "cancel", k, answer, e);
    if (rc)
        return rc;
    /* Whether a waiting or failed GATEWAY step's earlier call may have
     * taken effect is in its attempts, read here; the transaction checks
     * that each such step is still at the epoch read (no attempt since). */
    struct store_step *rows = NULL;
    struct steps_seen *seen = NULL;
    size_t n = 0, n_seen = 0;
    if ((rc = gateway_steps_seen(g, id, STATE_BIT(STEP_DISPATCHED) | STATE_BIT(STEP_FAILED), 0,
                                 &rows, &n, &seen, &n_seen, e)))
        return rc;
    struct cancel_args a = {
        .g = g,
        .c = {.workspace = ws,
              .execution_id = id,
              .reason = reason,
              .now = clock_now_ms(),
              .seen = seen,
              .n_seen = n_seen},
        .k = k,
    };
    rc = store_tx_run(g->store, tx_cancel, &a, e);
    if (!rc && k->replayed)
        rc = engine_replay_answer(a.replay, answer, e);
    else if (!rc)
        *answer = cancel_answer(&a.c);
    if (!rc && !k->replayed && a.c.moved) {
        atomic_fetch_add(&g->m.executions_cancelled, 1);
        engine_execution_moved(g, id, "cancelled");
    }
    free(a.replay);
    free(seen);
    store_steps_free(rows, n);
    return rc;
}

int engine_cancel(struct engine *g, const char *ws, const char *id, const char *reason,
                  struct engine_op_key *k, json_t **answer, struct ifl_err *e)
{
    *answer = NULL;
    struct engine_key_inflight n;
    int rc = engine_op_key_enter(g, &n, ws, "cancel", k ? k->key : NULL, e);
    if (!rc) {
        rc = cancel_keyed(g, ws, id, reason, k, answer, e);
        engine_op_key_leave(g, &n);
    }
    return rc;
}

struct resolve_args {
    struct engine *g;
    struct step_outcome *o;
    struct engine_op_key *k;
    char *replay;
    /* Set when the step cannot be resolved (read before the transaction):
     * a repeat of an earlier resolve still replays; otherwise this error,
     * and the key is rolled back. */
    const struct ifl_err *refuse;
    /* The step was resolved as failed already and is asked the same: no
     * change, no event; the answer (and a key's record of it) only. */
    int noop;
    int64_t version; /* … the execution's, as read: it must not have moved since */
};

static json_t *resolve_answer(const struct step_outcome *o)
{
    return json_pack("{s:s, s:s, s:s}", "executionId", o->execution_id, "vertex", o->vertex,
                     "status", o->status);
}

static int tx_resolve(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct resolve_args *a = arg;
    int rc = engine_op_key_claim(a->g, tx, a->o->workspace, "resolve", a->k, &a->replay, e);
    if (rc || a->k->replayed)
        return rc;
    if (a->refuse) {
        if (e)
            *e = *a->refuse;
        return a->refuse->code;
    }
    if ((rc = steps_not_started_over(tx, a->o->workspace, a->o->execution_id, e)))
        return rc;
    if (a->noop) {
        struct store_execution cur;
        if ((rc = store_tx_execution_get(tx, a->o->workspace, a->o->execution_id, &cur, e)))
            return rc;
        int moved = cur.version != a->version;
        store_execution_clear(&cur);
        if (moved)
            return err_set(e, IFL_ECONFLICT, "step '%s' changed while resolving; try again",
                           a->o->vertex);
    } else if ((rc = steps_apply(tx, a->o, e))) {
        return rc;
    }
    if (a->o->cancelled) {
        err_set(e, IFL_ECONFLICT, "execution %s was cancelled; start it over to run it again",
                a->o->execution_id);
        return e ? err_slug(e, "execution-cancelled") : IFL_ECONFLICT;
    }
    if (a->o->fenced) { /* changed since it was read: nothing to keep */
        rc =
            err_set(e, IFL_ECONFLICT, "step '%s' changed while resolving; try again", a->o->vertex);
        return rc;
    }
    if (!a->k->key)
        return 0;
    json_t *o = resolve_answer(a->o);
    char *text = json_to_string(o);
    json_decref(o);
    rc = engine_op_key_answer(tx, a->o->workspace, "resolve", a->k, 200, text, e);
    free(text);
    return rc;
}

static int resolve_keyed(struct engine *g, const char *ws, const char *id, const char *vertex,
                         int completed, json_t *output, struct engine_op_key *k, json_t **answer,
                         struct ifl_err *e)
{
    struct engine_op_key none = {0};
    if (!k)
        k = &none;
    struct store_execution x;
    const struct wf *w = NULL;
    struct store_step *rows = NULL;
    size_t n = 0;
    struct decision *d = NULL;
    json_t *ctx = NULL;
    char *out_text = NULL, *err_text = NULL;
    struct ifl_err refuse = {0};
    struct resolve_args a = {.g = g, .k = k};
    int rc = execution_and_workflow(g, ws, id, &x, &w, e);
    if (rc == IFL_EGONE)
        rc = gone_or_replay(g, ws, "resolve", k, answer, e);
    if (rc || k->replayed)
        goto out;
    long vi = wf_vertex_index(w, vertex);
    if (vi < 0) {
        rc = err_set(e, IFL_ENOTFOUND, "execution %s has no step '%s'", id, vertex);
        goto out;
    }
    if ((rc = store_steps_get(g->store, id, &rows, &n, e)))
        goto out;
    enum step_state from = STEP_PENDING;
    int found = 0, resolved_failed = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].vertex, vertex) == 0) {
            from = rows[i].state;
            found = 1;
            resolved_failed =
                from == STEP_FAILED && steps_error_code_is(rows[i].error, "resolved_failed");
        }
    if (strcmp(x.status, "cancelled") == 0) { /* whatever the step's state */
        err_set(&refuse, IFL_ECONFLICT, "execution %s was cancelled; start it over to run it again",
                id);
        err_slug(&refuse, "execution-cancelled");
        if (!k->key) {
            rc = refuse.code;
            if (e)
                *e = refuse;
            goto out;
        }
        a.refuse = &refuse;
    } else if (from != STEP_FAILED && from != STEP_REQUIRES_RECONCILIATION) {
        if (found)
            err_set(&refuse, IFL_ECONFLICT,
                    "step '%s' is %s; only FAILED or REQUIRES_RECONCILIATION steps can be "
                    "resolved",
                    vertex, store_step_state_name(from));
        else /* a stale execution (no steps were made) */
            err_set(&refuse, IFL_ECONFLICT,
                    "execution %s is %s and has no steps; only FAILED or "
                    "REQUIRES_RECONCILIATION steps can be resolved",
                    id, x.status);
        err_slug(&refuse, "step-not-resolvable");
        if (!k->key) { /* nothing to replay: no transaction */
            rc = refuse.code;
            if (e)
                *e = refuse;
            goto out;
        }
        a.refuse = &refuse;
    } else if (!completed && resolved_failed) {
        a.noop = 1; /* asked again: it stands (spec §7: a repeat changes nothing) */
    } else if (completed) {
        /* Scrubbed of the workspace's secrets as a TRANSFORM's output is: a
         * step's output never shows one (spec §6), also one an operator
         * pasted from a provider's answer (found by a judge: stored plain). */
        struct gw_request list = {0};
        if (engine_scrub_list(g, ws, &list)) {
            rc = err_set(e, IFL_EBUSY,
                         "the workspace's secrets cannot be read to scrub the output of them; "
                         "nothing was changed: try again");
            goto out;
        }
        json_t *shown = json_deep_copy(output ? output : json_null());
        if (list.nsecrets)
            gw_output_scrub(shown, &list);
        out_text = json_to_string(shown);
        ctx = engine_context(&x, rows, n);
        d = engine_decide_edges(w, vi, ctx, shown);
        engine_errors_scrub(g, ws, &list, NULL, d, w->v[vi].n_out, NULL);
        json_decref(shown);
        gw_request_clear(&list);
    } else {
        err_text = steps_error_json("resolved_failed", "resolved as failed by an operator");
    }
    struct step_outcome o = {
        .w = w,
        .workspace = ws,
        .execution_id = id,
        .vertex = vertex,
        .epoch = -1,
        .from = from,
        .to = completed ? STEP_COMPLETED : STEP_FAILED,
        .output = out_text,
        .error = err_text,
        .attempt_outcome = STEPS_RESOLVED,
        .dec = d,
        .bump_epoch = 1,
        .now = clock_now_ms(),
    };
    a.o = &o;
    if (a.noop) {
        snprintf(o.status, sizeof o.status, "%s", x.status);
        a.version = x.version;
    }
    rc = store_tx_run(g->store, tx_resolve, &a, e);
    if (!rc && k->replayed)
        rc = engine_replay_answer(a.replay, answer, e);
    else if (!rc)
        *answer = resolve_answer(&o);
    if (!rc && !k->replayed && o.dispatched)
        engine_wake(g);
out:
    free(a.replay);
    engine_decisions_free(d, d ? w->v[wf_vertex_index(w, vertex)].n_out : 0);
    json_decref(ctx);
    free(out_text);
    free(err_text);
    store_steps_free(rows, n);
    store_execution_clear(&x);
    wf_release(w);
    return rc;
}

int engine_resolve(struct engine *g, const char *ws, const char *id, const char *vertex,
                   int completed, json_t *output, struct engine_op_key *k, json_t **answer,
                   struct ifl_err *e)
{
    *answer = NULL;
    struct engine_key_inflight n;
    int rc = engine_op_key_enter(g, &n, ws, "resolve", k ? k->key : NULL, e);
    if (!rc) {
        rc = resolve_keyed(g, ws, id, vertex, completed, output, k, answer, e);
        engine_op_key_leave(g, &n);
    }
    return rc;
}

struct start_over_args {
    struct engine *g;
    struct create_args ca;
    const char *ws;
    struct engine_op_key k;
    char *response, *replay;
    /* The execution started over, at the version it was read at. */
    const char *old_id;
    int64_t old_version;
    /* Set when no new execution can be made (the latest version lost the
     * entry point; the execution is unfinished, or may have charged where
     * nothing settled it): a repeat of an earlier start-over still
     * replays; a new key gets this error and nothing is written. */
    const struct ifl_err *refuse;
};

static int tx_start_over(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct start_over_args *a = arg;
    int rc = engine_op_key_claim(a->g, tx, a->ws, "start-over", &a->k, &a->replay, e);
    if (rc || a->k.replayed)
        return rc;
    if (a->refuse) { /* rolls the key back */
        if (e)
            *e = *a->refuse;
        return a->refuse->code;
    }
    /* What made it safe to start over was judged on the execution as read
     * before: it must not have moved since (a retry, a resolve). */
    struct store_execution cur;
    if ((rc = store_tx_execution_get(tx, a->ws, a->old_id, &cur, e)))
        return rc;
    if (cur.version != a->old_version)
        rc = err_set(e, IFL_ECONFLICT, "execution %s changed while starting it over; try again",
                     a->old_id);
    store_execution_clear(&cur);
    /* Recorded on the original, which takes no retry or resolve after it
     * (steps_not_started_over; found by a judge: a retry of the original
     * after its start-over sent its call beside the new execution's).  A
     * start-over again is a new run on purpose, and is recorded instead. */
    char *was = NULL;
    if (!rc)
        rc = store_tx_execution_started_over(tx, a->ws, a->old_id, a->ca.x->id, &was, e);
    free(was);
    if (rc || (rc = tx_create_execution(tx, &a->ca, e)))
        return rc;
    return engine_op_key_answer(tx, a->ws, "start-over", &a->k, 201, a->response, e);
}

/* Whether execution x (read outside a transaction) may be started over:
 * when not, refuse->code is IFL_ECONFLICT with a slug (0 is returned
 * either way; another code is a store error).  Starting over runs its steps
 * again in a new execution, so a call whose effect nothing settled would be
 * sent again blindly (spec §1): an unfinished execution is cancelled first
 * (its own steps would go on), a step in REQUIRES_RECONCILIATION resolved,
 * and a FAILED GATEWAY step whose call may have taken effect retried or
 * resolved as completed.  A cancelled execution can hold such a step too
 * (a cancel goes through after a resolve as failed, which settles nothing
 * for a re-send): it cannot be retried or resolved any more, so it does
 * not start over. */
static int start_over_allowed(struct engine *g, const struct store_execution *x,
                              struct ifl_err *refuse, struct ifl_err *e)
{
    if (strcmp(x->status, "running") == 0) {
        err_set(refuse, IFL_ECONFLICT,
                "execution %s is still running: cancel it (or let it finish), then start it over",
                x->id);
        err_slug(refuse, "execution-running");
        return 0;
    }
    if (strcmp(x->status, "requires_reconciliation") == 0) {
        err_set(refuse, IFL_ECONFLICT,
                "execution %s has a step that may have taken effect: resolve it, then start over",
                x->id);
        err_slug(refuse, "step-needs-reconciliation");
        return 0;
    }
    int cancelled = strcmp(x->status, "cancelled") == 0;
    if (strcmp(x->status, "failed") != 0 && !cancelled)
        return 0;
    struct store_step *rows = NULL;
    struct steps_seen *seen = NULL;
    size_t n = 0, n_seen = 0;
    int rc = gateway_steps_seen(g, x->id, STATE_BIT(STEP_FAILED), 1, &rows, &n, &seen, &n_seen, e);
    for (size_t i = 0; !rc && !refuse->code && i < n_seen; i++) {
        if (!seen[i].unknown)
            continue;
        if (cancelled)
            err_set(refuse, IFL_ECONFLICT,
                    "execution %s was cancelled with step '%s' resolved as failed after a call "
                    "whose effect is unknown (the charge may have happened): a start-over would "
                    "send it again; check with the provider, and trigger a new execution if it "
                    "did not take effect",
                    x->id, seen[i].vertex);
        else
            err_set(refuse, IFL_ECONFLICT,
                    "step '%s' failed after a call whose effect is unknown (the charge may have "
                    "happened): retry it (the same key or its verify settles that; with neither, "
                    "sendAgain once you checked it did not) or resolve it as completed if it did, "
                    "then start over",
                    seen[i].vertex);
        err_slug(refuse, "step-outcome-unknown");
    }
    free(seen);
    store_steps_free(rows, n);
    return rc;
}

static int start_over_keyed(struct engine *g, const char *ws, const char *id, const char *key,
                            char new_id[65], int *replayed, struct ifl_err *e)
{
    /* Start-over takes no body: its fingerprint is where it points (kept
     * as it was before the other actions took keys, so that records
     * written by earlier versions still replay). */
    char fp[65];
    char *fps = xasprintf("start-over\n%s\n%s", ws, id);
    crypto_sha256_hex(fps, strlen(fps), fp);
    free(fps);
    struct store_execution old;
    int rc = store_execution_get(g->store, ws, id, &old, e);
    if (rc)
        return rc;
    if ((rc = engine_gone(&old, e))) {
        store_execution_clear(&old);
        struct engine_op_key k = {.key = key, .fingerprint = fp};
        json_t *r = NULL;
        if ((rc = gone_or_replay(g, ws, "start-over", &k, &r, e)) == 0) {
            const char *rid = json_string_value(json_object_get(r, "executionId"));
            snprintf(new_id, 65, "%s", rid ? rid : "");
            *replayed = 1;
        }
        json_decref(r);
        return rc;
    }
    const struct wf *w = NULL;
    int version = 0;
    json_t *payload = NULL, *identity = NULL;
    struct start_over_args a = {0};
    struct store_execution nx = {0}, existing = {0};
    /* The latest version of the workflow: start-over exists to run again
     * after a fix. */
    if ((rc = engine_workflow_get(g, ws, old.workflow, 0, &w, &version, e)))
        goto out;
    long vi = wf_vertex_index(w, old.entry_point);
    struct ifl_err refuse = {0};
    if (vi < 0 || w->v[vi].type != WF_ENTRY_POINT) {
        err_set(&refuse, IFL_ECONFLICT, "the latest workflow version has no entry point '%s'",
                old.entry_point);
        a.refuse = &refuse;
    } else if ((rc = start_over_allowed(g, &old, &refuse, e))) {
        goto out;
    } else if (refuse.code) {
        a.refuse = &refuse;
    }
    if ((rc = json_parse(old.payload, strlen(old.payload), &json_stored_limits, &payload, e)))
        goto out;
    if ((rc = identity_random(ws, old.workflow, old.entry_point, nx.id, e)))
        goto out;
    identity = json_pack("{s:s}", "mode", "random");
    nx.workspace = (char *)ws;
    nx.workflow = old.workflow;
    nx.workflow_version = version;
    nx.entry_point = old.entry_point;
    nx.identity = json_to_string(identity);
    nx.payload = old.payload;
    memcpy(nx.payload_hash, old.payload_hash, sizeof nx.payload_hash);
    nx.test = old.test;
    nx.started_over_from = old.id;
    a.g = g;
    a.ca.x = &nx;
    a.ca.existing = &existing;
    a.ws = ws;
    a.old_id = old.id;
    a.old_version = old.version;
    a.k = (struct engine_op_key){.key = key, .fingerprint = fp};
    a.response = xasprintf("{\"executionId\":\"%s\"}", nx.id);
    if (!a.refuse) {
        prepare_steps(g, w, (size_t)vi, &nx, payload, 0, &a.ca);
        trace_inlined(g, &a.ca, "inline");
    }
    rc = store_tx_run(g->store, tx_start_over, &a, e);
    early_finish(g, &a.ca, !rc && !a.k.replayed && a.ca.created);
    if (!rc && a.k.replayed) {
        json_t *r = NULL;
        if (!(rc = engine_replay_answer(a.replay, &r, e))) {
            const char *rid = json_string_value(json_object_get(r, "executionId"));
            snprintf(new_id, 65, "%s", rid ? rid : "");
            *replayed = 1;
        }
        json_decref(r);
    } else if (!rc) {
        snprintf(new_id, 65, "%s", nx.id);
        created(g, &a.ca);
    }
out:
    store_steps_free(a.ca.rows, a.ca.nrows);
    free(a.response);
    free(a.replay);
    free(nx.identity);
    store_execution_clear(&existing);
    json_decref(identity);
    json_decref(payload);
    store_execution_clear(&old);
    wf_release(w);
    return rc;
}

int engine_start_over(struct engine *g, const char *ws, const char *id, const char *key,
                      char new_id[65], int *replayed, struct ifl_err *e)
{
    *replayed = 0;
    struct engine_key_inflight n;
    int rc = engine_op_key_enter(g, &n, ws, "start-over", key, e);
    if (!rc) {
        rc = start_over_keyed(g, ws, id, key, new_id, replayed, e);
        engine_op_key_leave(g, &n);
    }
    return rc;
}
