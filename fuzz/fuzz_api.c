/*
 * fuzz_api — the engine's HTTP API, request by request, on a real SQLite
 * store: routing, path and query names, headers (Idempotency-Key, the
 * client idempotency id), JSON bodies, workflow and secret PUTs, triggers,
 * test runs, operator actions, reads of executions, dead letters and events.
 *
 * Input: up to 8 requests separated by NUL bytes, each
 *     METHOD SP TARGET LF (NAME ": " VALUE LF)* LF BODY
 * where TARGET is a path with an optional "?k=v&k2=v2" query (taken as
 * already decoded, as the HTTP adapter hands them over).
 *
 * The engine runs without workers (no GATEWAY call leaves the process;
 * TRANSFORMs still complete inline) over a database in /dev/shm (or /tmp),
 * seeded with workspace "w", secret "w/KEY" and workflow "w/orders"
 * (ENTRY_POINT -> TRANSFORM -> GATEWAY), and rebuilt every RESET_EVERY
 * inputs so it stays small.  Every answer must be a status in 200..599 and:
 *   - a JSON body when its content type says JSON;
 *   - from 400 up, an RFC 9457 document (application/problem+json) whose
 *     "status" is the response's and which has a "type" and a "title";
 *   - never the planted secret's value, in the body or any header (unless
 *     an input since the last rebuild carried it: that is data, not a leak).
 * Anything else aborts, as do crashes, leaks and undefined behaviour.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "api/api.h"
#include "base/log.h"
#include "engine/engine.h"
#include "store/store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_REQUESTS 8
#define MAX_FIELDS 16
#define RESET_EVERY 2000

static const char secret_value[] = "fz-plant-6d1c8e2f-secret";

struct kv {
    const char *k, *v;
};

struct freq {
    struct http_req base;
    struct kv hdr[MAX_FIELDS], qry[MAX_FIELDS];
    int nhdr, nqry;
};

static const char *find(const struct kv *kv, int n, const char *name, int nocase)
{
    for (int i = 0; i < n; i++)
        if (nocase ? strcasecmp(kv[i].k, name) == 0 : strcmp(kv[i].k, name) == 0)
            return kv[i].v;
    return NULL;
}

static const char *get_header(const struct http_req *r, const char *name)
{
    const struct freq *f = (const struct freq *)r;
    return find(f->hdr, f->nhdr, name, 1);
}

static const char *get_query(const struct http_req *r, const char *name)
{
    const struct freq *f = (const struct freq *)r;
    return find(f->qry, f->nqry, name, 0);
}

static const char *get_query_other(const struct http_req *r, const char *const *known)
{
    const struct freq *f = (const struct freq *)r;
    for (int i = 0; i < f->nqry; i++) {
        int ok = !*f->qry[i].k; /* an empty segment names nothing */
        for (int k = 0; known[k] && !ok; k++)
            ok = strcmp(f->qry[i].k, known[k]) == 0;
        for (int j = 0; j < i && ok && *f->qry[i].k; j++)
            ok = strcmp(f->qry[j].k, f->qry[i].k) != 0; /* given twice */
        if (!ok)
            return f->qry[i].k;
    }
    return NULL;
}

static int get_header_count(const struct http_req *r, const char *name)
{
    const struct freq *f = (const struct freq *)r;
    int n = 0;
    for (int i = 0; i < f->nhdr; i++)
        n += strcasecmp(f->hdr[i].k, name) == 0;
    return n;
}

static char dir[64], dbpath[96];
static struct store *store;
static struct engine *engine;
static struct api *api;
static unsigned long inputs;
/* An input carried the value since the store was built: the engine may now
 * hold it as plain data (a payload, a resolve output), and showing that is
 * no leak. */
static int carried;

/* Whether p[0..n) holds the planted value.  Hidden from the fuzzer's
 * comparison tracing (and not memmem, which libFuzzer intercepts), so it
 * cannot learn the value and type it in as data. */
__attribute__((no_sanitize("coverage"))) static int has_secret(const char *p, size_t n)
{
    size_t k = sizeof secret_value - 1;
    for (size_t i = 0; i + k <= n; i++) {
        size_t j = 0;
        while (j < k && p[i + j] == secret_value[j])
            j++;
        if (j == k)
            return 1;
    }
    return 0;
}

static void must(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_api: %s\n", what);
        abort();
    }
}

static void check(const struct http_res *res)
{
    must(res->status >= 200 && res->status <= 599, "status out of range");
    const char *ct = res->content_type ? res->content_type : "application/json";
    if (res->body && !carried)
        must(!has_secret(res->body, res->body_len), "secret value in a response body");
    for (int i = 0; i < res->nheaders && !carried; i++)
        must(!has_secret(res->headers[i].value, strlen(res->headers[i].value)),
             "secret value in a response header");
    json_t *doc = NULL;
    if (res->body && strstr(ct, "json")) {
        doc = json_loadb(res->body, res->body_len, JSON_DECODE_ANY, NULL);
        must(doc != NULL, "a JSON content type with a body that is not JSON");
    }
    if (res->status >= 400) {
        must(strcmp(ct, "application/problem+json") == 0, "an error that is not problem+json");
        must(json_is_object(doc), "a problem document that is not an object");
        must(json_is_string(json_object_get(doc, "type")), "a problem without a type");
        must(json_is_string(json_object_get(doc, "title")), "a problem without a title");
        must(json_integer_value(json_object_get(doc, "status")) == res->status,
             "a problem whose status is not the response's");
    }
    json_decref(doc);
}

/* Runs one request; body is NUL-terminated at body[len]. */
static int handle(struct freq *f, struct http_res *res)
{
    memset(res, 0, sizeof *res);
    f->base.header = get_header;
    f->base.query = get_query;
    f->base.query_other = get_query_other;
    f->base.header_count = get_header_count;
    f->base.impl = NULL; /* not from the server: never deferred */
    api_handle(api, &f->base, res);
    check(res);
    int status = res->status;
    http_res_clear(res);
    return status;
}

static int simple(const char *method, const char *path, const char *body)
{
    struct freq f = {
        .base = {.method = method, .path = path, .body = body, .body_len = strlen(body)}};
    struct http_res res;
    return handle(&f, &res);
}

static const char seed_workflow[] =
    "{\"vertices\":{"
    "\"start\":{\"type\":\"ENTRY_POINT\",\"config\":{\"idempotencyFields\":[\"order.id\"]}},"
    "\"price\":{\"type\":\"TRANSFORM\",\"config\":{\"output\":{\"total\":"
    "\"= $sum(payload.items.(price * qty))\"}}},"
    "\"call\":{\"type\":\"GATEWAY\",\"config\":{\"method\":\"POST\","
    "\"url\":\"= 'http://127.0.0.1:9/v1/charges?o=' & payload.order.id\","
    "\"headers\":{\"Idempotency-Key\":\"= 'charge-' & payload.order.id\","
    "\"Authorization\":\"Bearer {{ secrets.KEY }}\"},"
    "\"body\":{\"amount\":\"= steps.price.total\"}}}},"
    "\"edges\":[{\"from\":\"start\",\"to\":\"price\"},"
    "{\"from\":\"price\",\"to\":\"call\",\"condition\":\"= response.total > 0\"}]}";

static void teardown(void)
{
    api_free(api);
    engine_free(engine);
    store_close(store);
    api = NULL, engine = NULL, store = NULL;
    static const char *const suffix[] = {"", "-wal", "-shm", ".lock", "-journal"};
    char p[128];
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        snprintf(p, sizeof p, "%s%s", dbpath, suffix[i]);
        unlink(p);
    }
}

static void finish(void)
{
    teardown();
    rmdir(dir);
}

static void setup(void)
{
    int first = !dir[0];
    if (first) {
        log_set_level(LOG_ERROR + 1);
        snprintf(dir, sizeof dir, "%s/ifl-fuzz-api.XXXXXX",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
        must(mkdtemp(dir) != NULL, "mkdtemp");
        snprintf(dbpath, sizeof dbpath, "%s/api.db", dir);
    }
    struct ifl_err e;
    carried = 0;
    must(store_open(dbpath, &store, &e) == 0, "store_open");
    struct engine_opts eo;
    memset(eo.secrets_key, 0x5a, sizeof eo.secrets_key);
    must(engine_new(store, &eo, &engine, &e) == 0, "engine_new");
    /* no workers run here, so a `Prefer: wait` would wait out its deadline */
    api =
        api_new(engine, &(struct api_opts){.max_body = 1 << 16, .max_depth = 32, .max_wait_ms = 5});
    char body[128];
    snprintf(body, sizeof body, "{\"value\": \"%s\"}", secret_value);
    must(simple("PUT", "/v1/workspaces/w", "{}") / 100 == 2, "seed workspace");
    must(simple("PUT", "/v1/workspaces/w/secrets/KEY", body) / 100 == 2, "seed secret");
    must(simple("PUT", "/v1/workspaces/w/workflows/orders", seed_workflow) / 100 == 2,
         "seed workflow");
    /* After OpenSSL registered its own exit handler (the secret above), so
     * ours runs first: the store's threads end while libcrypto can still
     * free their per-thread state. */
    if (first)
        atexit(finish);
}

/* Splits "k=v&k2=v2" in place. */
static void parse_query(struct freq *f, char *q)
{
    while (q && *q && f->nqry < MAX_FIELDS) {
        char *amp = strchr(q, '&');
        if (amp)
            *amp = '\0';
        char *eq = strchr(q, '=');
        if (eq)
            *eq = '\0';
        f->qry[f->nqry++] = (struct kv){q, eq ? eq + 1 : ""};
        q = amp ? amp + 1 : NULL;
    }
}

/* Parses one request from s (NUL-terminated, modified in place) and runs it. */
static void one(char *s)
{
    struct freq f = {0};
    char *eol = strchr(s, '\n');
    if (!eol)
        return;
    *eol = '\0';
    char *sp = strchr(s, ' ');
    if (!sp)
        return;
    *sp = '\0';
    f.base.method = s;
    char *target = sp + 1, *q = strchr(target, '?');
    if (q)
        *q++ = '\0';
    f.base.path = target;
    parse_query(&f, q);
    char *p = eol + 1;
    while (*p && *p != '\n') {
        char *end = strchr(p, '\n');
        if (end)
            *end = '\0';
        char *colon = strstr(p, ": ");
        if (colon && f.nhdr < MAX_FIELDS) {
            *colon = '\0';
            f.hdr[f.nhdr++] = (struct kv){p, colon + 2};
        }
        if (!end) { /* no blank line: no body */
            p += strlen(p);
            break;
        }
        p = end + 1;
    }
    if (*p == '\n')
        p++;
    f.base.body = p;
    f.base.body_len = strlen(p);
    struct http_res res;
    handle(&f, &res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16)
        return 0;
    if (!api)
        setup();
    if (has_secret((const char *)data, size))
        carried = 1;
    char *buf = malloc(size + 1);
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *s = buf, *end = buf + size;
    for (int n = 0; n < MAX_REQUESTS && s < end; n++) {
        size_t len = strlen(s);
        one(s);
        s += len + 1;
    }
    free(buf);
    if (++inputs % RESET_EVERY == 0) {
        teardown();
        setup();
    }
    return 0;
}
