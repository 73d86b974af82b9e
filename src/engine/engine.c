/*
 * engine — see engine.h.
 *
 * Trigger path (hot): compiled workflow from the cache (one indexed read of
 * the latest version number), identity computation (JCS + SHA-256), then a
 * read of the id on a WAL reader — the fast path for duplicates — and, when
 * absent, the atomic insert.  The read is only an optimisation: correctness
 * rests on the insert's unique key, which settles concurrent duplicates.
 */
#include "engine/engine.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/identity.h"
#include "engine/workflow.h"
#include "json/json.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CACHE_BUCKETS 256

struct cached {
    char *ws, *wf;
    int version;
    struct wf *w;
    struct cached *next;
};

struct engine {
    struct store *store;
    uint8_t key[CRYPTO_KEY_LEN];
    pthread_rwlock_t lock;
    struct cached *buckets[CACHE_BUCKETS];
};

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

int engine_new(struct store *s, const struct engine_opts *o, struct engine **out,
               struct ifl_err *e)
{
    struct engine *g = xcalloc(1, sizeof *g);
    g->store = s;
    memcpy(g->key, o->secrets_key, sizeof g->key);
    pthread_rwlock_init(&g->lock, NULL);
    *out = g;
    return 0;
}

void engine_free(struct engine *g)
{
    if (!g)
        return;
    for (int i = 0; i < CACHE_BUCKETS; i++) {
        struct cached *c = g->buckets[i];
        while (c) {
            struct cached *n = c->next;
            free(c->ws);
            free(c->wf);
            wf_free(c->w);
            free(c);
            c = n;
        }
    }
    pthread_rwlock_destroy(&g->lock);
    crypto_wipe(g->key, sizeof g->key);
    free(g);
}

struct store *engine_store(struct engine *g)
{
    return g->store;
}

static const struct wf *cache_find(struct engine *g, const char *ws, const char *wf, int version)
{
    const struct wf *found = NULL;
    pthread_rwlock_rdlock(&g->lock);
    for (struct cached *c = g->buckets[hash3(ws, wf, version)]; c; c = c->next)
        if (c->version == version && strcmp(c->ws, ws) == 0 && strcmp(c->wf, wf) == 0) {
            found = c->w;
            break;
        }
    pthread_rwlock_unlock(&g->lock);
    return found;
}

/* Inserts w unless another thread won; returns the cached one (w freed if
 * it lost). */
static const struct wf *cache_add(struct engine *g, const char *ws, const char *wf, int version,
                                  struct wf *w)
{
    unsigned h = hash3(ws, wf, version);
    pthread_rwlock_wrlock(&g->lock);
    for (struct cached *c = g->buckets[h]; c; c = c->next)
        if (c->version == version && strcmp(c->ws, ws) == 0 && strcmp(c->wf, wf) == 0) {
            pthread_rwlock_unlock(&g->lock);
            wf_free(w);
            return c->w;
        }
    struct cached *c = xcalloc(1, sizeof *c);
    c->ws = xstrdup(ws);
    c->wf = xstrdup(wf);
    c->version = version;
    c->w = w;
    c->next = g->buckets[h];
    g->buckets[h] = c;
    pthread_rwlock_unlock(&g->lock);
    return w;
}

int engine_workflow_put(struct engine *g, const char *ws, const char *wf, json_t *def,
                        int *version, struct ifl_err *e)
{
    struct wf *w = NULL;
    int rc = wf_compile(def, &w, e);
    if (rc)
        return rc;
    char *text = json_to_string(def); /* as accepted, not as normalised */
    if (!text) {
        wf_free(w);
        return err_set(e, IFL_EVALIDATION, "the definition holds a non-finite number");
    }
    rc = store_workflow_put(g->store, ws, wf, text, version, e);
    free(text);
    if (rc) {
        wf_free(w);
        return rc;
    }
    cache_add(g, ws, wf, *version, w);
    log_info("workflow.put", "workspace %s workflow %s version %d", ws, wf, *version);
    return 0;
}

int engine_workflow_get(struct engine *g, const char *ws, const char *wf, int version,
                        const struct wf **out, int *version_out, struct ifl_err *e)
{
    *out = NULL;
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
    const struct wf *c = cache_find(g, ws, wf, sw.version);
    if (!c) {
        json_t *def = NULL;
        struct wf *w = NULL;
        rc = json_parse(sw.definition, strlen(sw.definition), NULL, &def, e);
        if (!rc)
            rc = wf_compile(def, &w, e);
        json_decref(def);
        if (rc) {
            log_error("workflow.corrupt", "stored workflow %s/%s v%d does not compile: %s", ws,
                      wf, sw.version, e ? e->msg : "");
            store_workflow_clear(&sw);
            return err_set(e, IFL_EINTERNAL, "stored workflow version does not compile");
        }
        c = cache_add(g, ws, wf, sw.version, w);
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

int engine_secret_put(struct engine *g, const char *ws, const char *name, const char *value,
                      struct ifl_err *e)
{
    int rc = store_workspace_exists(g->store, ws, e);
    if (rc)
        return rc;
    char *aad = secret_aad(ws, name), *sealed = NULL;
    rc = crypto_seal(g->key, aad, value, strlen(value), &sealed);
    free(aad);
    if (rc)
        return err_set(e, rc, "cannot encrypt the secret");
    rc = store_secret_put(g->store, ws, name, sealed, e);
    free(sealed);
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
    char *aad = secret_aad(ws, name);
    size_t n;
    rc = crypto_open(g->key, aad, sealed, value, &n);
    free(aad);
    free(sealed);
    if (rc)
        return err_set(e, IFL_EINTERNAL,
                       "secret '%s' cannot be decrypted with this secrets key", name);
    return 0;
}

void engine_secret_release(char *value)
{
    if (value) {
        crypto_wipe(value, strlen(value));
        free(value);
    }
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

int engine_trigger(struct engine *g, const struct trigger_req *r, struct trigger_res *out,
                   struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    const struct wf *w = NULL;
    int version = 0;
    int rc = engine_workflow_get(g, r->ws, r->wf, 0, &w, &version, e);
    if (rc == IFL_ENOTFOUND && store_workspace_exists(g->store, r->ws, e) == IFL_ENOTFOUND)
        return err_slug(e, "workspace-not-found");
    if (rc)
        return rc;
    long vi = wf_vertex_index(w, r->vertex);
    if (vi < 0 || w->v[vi].type != WF_ENTRY_POINT)
        return err_set(e, IFL_ENOTFOUND, "workflow '%s' has no entry point '%s'", r->wf,
                       r->vertex);
    const struct wf_vertex *v = &w->v[vi];

    /* Identity: client key > idempotencyFields > payload; random when forced. */
    const char *mode;
    json_t *material = NULL, *identity = json_object();
    char id[65];
    if (r->force_new) {
        mode = "random";
        rc = identity_random(id, e);
    } else {
        if (r->client_key) {
            if (!identity_client_key_valid(r->client_key)) {
                rc = err_setp(e, IFL_EINVAL, "/clientIdempotencyId",
                              "clientIdempotencyId must be 1-255 printable ASCII characters");
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

    /* Fast path for repeats: a WAL read, no write. */
    struct store_execution x;
    if (!r->force_new) {
        rc = store_execution_get(g->store, r->ws, id, &x, NULL);
        if (rc == 0) {
            rc = answer_existing(&x, hash, client_mode, out, e);
            store_execution_clear(&x);
            goto done;
        }
    }

    struct store_execution nx = {0};
    snprintf(nx.id, sizeof nx.id, "%s", id);
    nx.workspace = (char *)r->ws;
    nx.workflow = (char *)r->wf;
    nx.workflow_version = version;
    nx.entry_point = (char *)r->vertex;
    nx.identity = json_to_string(identity);
    nx.payload = json_to_string(r->payload);
    snprintf(nx.payload_hash, sizeof nx.payload_hash, "%s", hash);
    nx.test = r->test;
    int created = 0;
    rc = store_execution_create(g->store, &nx, &created, &x, e);
    free(nx.identity);
    free(nx.payload);
    if (rc)
        goto done;
    if (created) {
        out->created = 1;
        out->same_payload = 1;
        snprintf(out->id, sizeof out->id, "%s", id);
        snprintf(out->status, sizeof out->status, "running");
    } else {
        rc = answer_existing(&x, hash, client_mode, out, e);
        store_execution_clear(&x);
    }
done:
    json_decref(material);
    json_decref(identity);
    return rc;
}
