/*
 * mockpay — see mockpay.h.
 *
 * A POST /v1/charges runs in up to three short critical sections: (1)
 * evaluate faults and look up or claim the idempotency key, (2) commit the
 * charge and record the response under the key, (3) bookkeeping for the
 * statistics.  Latency faults sleep between them, unlocked.  POST /reset may
 * run meanwhile: it bumps `epoch`, and a request that claimed a key before a
 * reset never touches that (freed) record afterwards.
 *
 * Must never: hold the mutex while sleeping or logging, read the
 * Authorization header, or let a network input grow a buffer without a cap.
 */
#include "mockpay.h"
#include "base/clock.h"
#include "base/mem.h"
#include "crypto/crypto.h"
#include "faults.h"
#include "json/json.h"
#include "table.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_KEY_LEN 255
#define MAX_ORDER_LEN 255
#define MAX_CURRENCY_LEN 15
#define MAX_AMOUNT 9007199254740991.0 /* 2^53 - 1 */

enum route {
    R_CHARGE_POST,
    R_CHARGE_LIST,
    R_CHARGE_GET,
    R_STATS,
    R_RESET,
    R_FAULTS_GET,
    R_FAULTS_POST,
    R_OTHER,
    R_NROUTES
};

static const char *const route_names[R_NROUTES] = {
    [R_CHARGE_POST] = "POST /v1/charges",
    [R_CHARGE_LIST] = "GET /v1/charges",
    [R_CHARGE_GET] = "GET /v1/charges/{id}",
    [R_STATS] = "GET /stats",
    [R_RESET] = "POST /reset",
    [R_FAULTS_GET] = "GET /faults",
    [R_FAULTS_POST] = "POST /faults",
    [R_OTHER] = "other",
};

struct charge {
    char id[32];
    char *order;   /* text form: the string, or the number as JSON writes it */
    int order_num; /* the order was given as a JSON number */
    int64_t amount;
    char currency[MAX_CURRENCY_LEN + 1];
    int64_t created; /* Unix seconds */
};

struct order_idx {
    size_t n, cap;
    struct charge **v;
};

enum { KEY_IN_FLIGHT, KEY_DONE };

struct keyrec {
    int state;
    char fp[65]; /* SHA-256 of the canonical request */
    int status;  /* KEY_DONE: the recorded response */
    char *body;
};

struct stats {
    uint64_t requests[R_NROUTES];
    uint64_t responses[600]; /* by status; [0] = dropped */
    uint64_t replays, conflicts, mismatches;
    uint64_t injected[FAULT_NKINDS];
    uint64_t connections; /* accepted, since start or reset */
};

struct mockpay {
    pthread_mutex_t mu;
    atomic_int stopping;
    /* frozen configuration */
    char *start_faults;
    uint64_t start_seed;
    size_t max_charges;
    int quiet;
    /* state, under mu */
    struct charge **charges;
    size_t ncharges, cap;
    struct table *by_id;    /* id -> struct charge *      */
    struct table *by_order; /* order -> struct order_idx * */
    struct table *keys;     /* Idempotency-Key -> struct keyrec * */
    struct faults *faults;
    uint64_t seed;
    uint64_t epoch;
    uint64_t id_state; /* never reset, so ids stay unique for the process */
    struct stats st;
};

/* What one request did, for its log line. */
struct reqlog {
    enum route route;
    int status; /* 0 = dropped */
    char order[MAX_ORDER_LEN + 1];
    int replayed;
    unsigned faults; /* enum fault_kind bits */
};

/* ---- helpers ---------------------------------------------------------- */

static void lock(struct mockpay *m)
{
    pthread_mutex_lock(&m->mu);
}

static void unlock(struct mockpay *m)
{
    pthread_mutex_unlock(&m->mu);
}

/* Sleeps ms milliseconds, in slices, ending early once shutdown begins. */
static void nap(struct mockpay *m, int64_t ms)
{
    int64_t end = clock_mono_ms() + ms;
    for (;;) {
        int64_t left = end - clock_mono_ms();
        if (left <= 0 || atomic_load(&m->stopping))
            return;
        if (left > 20)
            left = 20;
        struct timespec ts = {0, (long)left * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static const char *reason(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 507:
        return "Insufficient Storage";
    default:
        return status >= 500 ? "Server Error" : "Client Error";
    }
}

/* An RFC 9457 problem document as the response. */
static void problem(struct http_res *res, int status, const char *slug, const char *detail)
{
    char type[96];
    snprintf(type, sizeof type, "/problems/%s", slug);
    json_t *p = json_pack("{s:s,s:s,s:i,s:s}", "type", type, "title", reason(status), "status",
                          status, "detail", detail ? detail : reason(status));
    http_res_body(res, status, "application/problem+json", json_to_string(p));
    json_decref(p);
}

static void reply_json(struct http_res *res, int status, json_t *v)
{
    http_res_body(res, status, "application/json", json_to_string(v));
    json_decref(v);
}

/* "Sun, 06 Nov 1994 08:49:37 GMT" (RFC 9110 IMF-fixdate) into out. */
static void http_date(int64_t secs, char out[32])
{
    static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t t = (time_t)secs;
    struct tm tm;
    gmtime_r(&t, &tm);
    snprintf(out, 32, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday % 7], tm.tm_mday,
             months[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* The response an injected status fault answers. */
static void fault_response(const struct fault_hit *hit, struct http_res *res)
{
    http_res_clear(res);
    if (hit->code == 200) /* a maintenance page in front of the API */
        http_res_body(res, 200, "text/html; charset=utf-8",
                      xstrdup("<html><body><h1>Down for maintenance</h1></body></html>\n"));
    else
        problem(res, hit->code, "injected-fault",
                hit->after_commit ? "injected fault (after commit)" : "injected fault");
    if (hit->code < 400) /* a redirect, as to a sign-in page in front of the API */
        http_res_header(res, "Location", "/login");
    if (hit->retry_after >= 0) {
        char v[32];
        if (hit->retry_after_date) {
            /* Rounded up, so the date is never sooner than now + N seconds. */
            int64_t now = clock_now_ms();
            http_date((now + 999) / 1000 + hit->retry_after, v);
        } else {
            snprintf(v, sizeof v, "%lld", (long long)hit->retry_after);
        }
        http_res_header(res, "Retry-After", v);
    }
}

static void count_faults(struct mockpay *m, const struct fault_hit *hit, struct reqlog *lg)
{
    for (int k = 0; k < FAULT_NKINDS; k++)
        if (hit->kinds & (1u << k))
            m->st.injected[k]++;
    lg->faults |= hit->kinds;
}

/* Applies what follows processing: after-commit latency, then a drop or an
 * after-commit status in place of the response. */
static enum listener_action finish(struct mockpay *m, const struct fault_hit *hit,
                                   struct http_res *res)
{
    if (hit->delay_after_ms > 0)
        nap(m, hit->delay_after_ms);
    if (hit->outcome == FAULT_DROP_AFTER_COMMIT)
        return LISTENER_DROP;
    if (hit->outcome == FAULT_STATUS && hit->after_commit)
        fault_response(hit, res);
    return LISTENER_RESPOND;
}

/* ---- charges ---------------------------------------------------------- */

static json_t *charge_json(const struct charge *c)
{
    json_t *order = c->order_num ? json_real(strtod(c->order, NULL)) : json_string(c->order);
    return json_pack("{s:s,s:s,s:o,s:I,s:s,s:s,s:I}", "id", c->id, "object", "charge", "order",
                     order, "amount", (json_int_t)c->amount, "currency", c->currency, "status",
                     "succeeded", "created", (json_int_t)c->created);
}

static void charge_free(void *p)
{
    struct charge *c = p;
    if (c)
        free(c->order);
    free(c);
}

static void order_idx_free(void *p)
{
    struct order_idx *o = p;
    if (o)
        free(o->v);
    free(o);
}

static void keyrec_free(void *p)
{
    struct keyrec *k = p;
    if (k)
        free(k->body);
    free(k);
}

/* A fresh charge id "ch_" + 24 hex digits: the first 16 are a bijection of a
 * process-wide counter (so ids never repeat), all are seeded. Under mu. */
static void next_id(struct mockpay *m, char out[32])
{
    uint64_t z = (m->id_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    uint64_t w = (z * 0xD1B54A32D192ED03ull) >> 32;
    snprintf(out, 32, "ch_%016llx%08llx", (unsigned long long)z, (unsigned long long)w);
}

/* Stores a new charge and returns it (borrowed; valid until the next reset).
 * Under mu; the caller has checked the cap. */
static struct charge *commit_charge(struct mockpay *m, const char *order, int order_num,
                                    int64_t amount, const char *currency)
{
    struct charge *c = xcalloc(1, sizeof *c);
    next_id(m, c->id);
    c->order = xstrdup(order);
    c->order_num = order_num;
    c->amount = amount;
    snprintf(c->currency, sizeof c->currency, "%s", currency);
    c->created = clock_now_ms() / 1000;
    if (m->ncharges == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 1024;
        m->charges = xrealloc(m->charges, m->cap * sizeof *m->charges);
    }
    m->charges[m->ncharges++] = c;
    table_put(m->by_id, c->id, c);
    struct order_idx *o = table_get(m->by_order, order);
    if (!o) {
        o = xcalloc(1, sizeof *o);
        table_put(m->by_order, order, o);
    }
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 2;
        o->v = xrealloc(o->v, o->cap * sizeof *o->v);
    }
    o->v[o->n++] = c;
    return c;
}

/* A validated POST /v1/charges body. */
struct charge_req {
    json_t *doc;
    char order[MAX_ORDER_LEN + 1];
    int order_num;
    int64_t amount;
    char currency[MAX_CURRENCY_LEN + 1];
    char fp[65];
};

/* Parses and validates the body; 0, or -1 after filling res with a 400. */
static int parse_charge(const struct http_req *req, struct charge_req *cr, struct http_res *res)
{
    struct ifl_err e = {0};
    struct json_limits lim = {.max_bytes = MOCKPAY_MAX_BODY, .max_depth = 16};
    if (json_parse(req->body, req->body_len, &lim, &cr->doc, &e)) {
        problem(res, 400, "invalid-json", e.msg);
        return -1;
    }
    const char *why = NULL;
    json_t *order = json_object_get(cr->doc, "order");
    json_t *amount = json_object_get(cr->doc, "amount");
    json_t *currency = json_object_get(cr->doc, "currency");
    double a = amount && json_is_number(amount) ? json_num(amount) : NAN;
    char num[32];
    if (!json_is_object(cr->doc)) {
        why = "the body must be a JSON object";
    } else if (json_is_string(order) && json_string_length(order) > 0 &&
               json_string_length(order) <= MAX_ORDER_LEN &&
               strlen(json_string_value(order)) == json_string_length(order)) {
        snprintf(cr->order, sizeof cr->order, "%s", json_string_value(order));
    } else if (json_is_number(order) && json_format_number(json_num(order), num) > 0) {
        snprintf(cr->order, sizeof cr->order, "%s", num);
        cr->order_num = 1;
    } else {
        why = "'order' must be a non-empty string (at most 255 bytes, no NUL) or a number";
    }
    if (!why && !(a >= 1 && a <= MAX_AMOUNT && a == floor(a)))
        why = "'amount' must be a positive integer (minor units)";
    if (!why && currency &&
        !(json_is_string(currency) && json_string_length(currency) >= 1 &&
          json_string_length(currency) <= MAX_CURRENCY_LEN &&
          strlen(json_string_value(currency)) == json_string_length(currency)))
        why = "'currency' must be a string of 1 to 15 characters";
    if (why) {
        problem(res, 400, "invalid-request", why);
        return -1;
    }
    cr->amount = (int64_t)a;
    snprintf(cr->currency, sizeof cr->currency, "%s",
             currency ? json_string_value(currency) : "usd");
    /* The fingerprint: method, path and the canonical (RFC 8785) body, so
     * member order and number spelling do not matter, values do. */
    struct buf b;
    buf_init(&b, 0);
    buf_puts(&b, "POST /v1/charges\n");
    if (json_jcs(cr->doc, &b)) {
        buf_free(&b);
        problem(res, 400, "invalid-json", "the body holds a number JSON cannot carry");
        return -1;
    }
    crypto_sha256_hex(b.p, b.len, cr->fp);
    buf_free(&b);
    return 0;
}

/* 0 when the Idempotency-Key header is absent or valid (1 to 255 printable
 * ASCII characters); -1 after filling res with a 400. */
static int check_key(const char *key, struct http_res *res)
{
    if (!key)
        return 0;
    size_t n = strlen(key);
    int ok = n >= 1 && n <= MAX_KEY_LEN;
    for (size_t i = 0; ok && i < n; i++)
        ok = key[i] >= 0x20 && key[i] <= 0x7e;
    if (!ok)
        problem(res, 400, "invalid-idempotency-key",
                "Idempotency-Key must be 1 to 255 printable ASCII characters");
    return ok ? 0 : -1;
}

static void charge_headers(struct http_res *res, const char *key, int replayed)
{
    if (key)
        http_res_header(res, "Idempotency-Key", key);
    if (replayed)
        http_res_header(res, "Idempotent-Replayed", "true");
}

static enum listener_action charge_post(struct mockpay *m, const struct http_req *req,
                                        struct http_res *res, struct reqlog *lg)
{
    struct charge_req cr = {0};
    /* A header value has no surrounding whitespace (RFC 9110 §5.5);
     * libmicrohttpd strips the leading one only: "K" and "K " are one key. */
    const char *key = req->header(req, "Idempotency-Key");
    char keybuf[MAX_KEY_LEN + 1];
    if (key) {
        size_t n = strlen(key);
        while (n && (key[n - 1] == ' ' || key[n - 1] == '\t'))
            n--;
        if (n <= MAX_KEY_LEN) {
            memcpy(keybuf, key, n);
            keybuf[n] = '\0';
            key = keybuf;
        }
    }
    if (check_key(key, res) || parse_charge(req, &cr, res)) {
        json_decref(cr.doc);
        return LISTENER_RESPOND;
    }
    json_decref(cr.doc);
    snprintf(lg->order, sizeof lg->order, "%s", cr.order);

    struct fault_hit hit;
    struct keyrec *rec = NULL;
    int claimed = 0, decided = 0;
    uint64_t epoch;
    lock(m);
    faults_eval(m->faults, FAULT_ON_CHARGE, cr.order, &hit);
    if (hit.ignore_keys)
        key = NULL;
    if (hit.outcome == FAULT_STATUS && !hit.after_commit) {
        /* Refused in front of the charge logic: nothing stored, key free. */
        count_faults(m, &hit, lg);
        unlock(m);
        nap(m, hit.delay_ms + hit.delay_after_ms);
        fault_response(&hit, res);
        return LISTENER_RESPOND;
    }
    if (key) {
        rec = table_get(m->keys, key);
        if (rec && rec->state == KEY_IN_FLIGHT) {
            m->st.conflicts++;
            problem(res, 409, "idempotency-key-in-use",
                    "a request with this Idempotency-Key is still being processed");
            decided = 1;
        } else if (rec && strcmp(rec->fp, cr.fp) != 0) {
            m->st.mismatches++;
            problem(res, 422, "idempotency-key-reused",
                    "this Idempotency-Key was used with a different request body");
            decided = 1;
        } else if (rec) {
            m->st.replays++;
            http_res_body(res, rec->status, "application/json", xstrdup(rec->body));
            charge_headers(res, key, 1);
            lg->replayed = 1;
            decided = 1;
        } else if (table_count(m->keys) >= m->max_charges + 1024) {
            problem(res, 507, "storage-full", "too many idempotency keys");
            decided = 1;
        } else if (m->ncharges >= m->max_charges) {
            problem(res, 507, "storage-full", "the charge cap is reached (see --max-charges)");
            decided = 1;
        } else {
            rec = xcalloc(1, sizeof *rec);
            rec->state = KEY_IN_FLIGHT;
            memcpy(rec->fp, cr.fp, sizeof rec->fp);
            table_put(m->keys, key, rec);
            claimed = 1;
        }
    }
    /* A drop or an after-commit status stands in for the answer to a
     * charge (made now, or replayed); a request answered 409, 422 or 507
     * charged nothing: such a fault is taken back, not applied. */
    if (decided && !lg->replayed)
        faults_unfire_outcome(m->faults, &hit);
    count_faults(m, &hit, lg);
    epoch = m->epoch;
    unlock(m);

    if (hit.delay_ms > 0)
        nap(m, hit.delay_ms);

    if (!decided) {
        lock(m);
        int mine = claimed && m->epoch == epoch; /* else a reset freed rec */
        if (m->ncharges >= m->max_charges) {
            problem(res, 507, "storage-full", "the charge cap is reached (see --max-charges)");
            if (mine)
                keyrec_free(table_del(m->keys, key));
            hit.outcome = -1; /* nothing charged: nothing to drop (a rare race: the
                                 cap is checked before the decision too) */
        } else {
            struct charge *c = commit_charge(m, cr.order, cr.order_num, cr.amount, cr.currency);
            reply_json(res, 201, charge_json(c));
            charge_headers(res, key, 0);
            if (mine) {
                rec->state = KEY_DONE;
                rec->status = 201;
                rec->body = xstrdup(res->body);
            }
        }
        unlock(m);
    }
    return finish(m, &hit, res);
}

/* GET /v1/charges?order=ID and GET /v1/charges/{id} (id != NULL). */
static enum listener_action charge_read(struct mockpay *m, const struct http_req *req,
                                        struct http_res *res, struct reqlog *lg, const char *id)
{
    const char *order = id ? NULL : req->query(req, "order");
    if (!id && (!order || !*order)) {
        problem(res, 400, "invalid-parameter", "the 'order' query parameter is required");
        return LISTENER_RESPOND;
    }
    struct fault_hit hit;
    json_t *out = NULL;
    lock(m);
    if (id) {
        struct charge *c = table_get(m->by_id, id);
        if (c) {
            snprintf(lg->order, sizeof lg->order, "%s", c->order);
            out = charge_json(c);
        }
    } else {
        snprintf(lg->order, sizeof lg->order, "%s", order);
        struct order_idx *o = table_get(m->by_order, order);
        json_t *data = json_array();
        for (size_t i = 0; o && i < o->n; i++)
            json_array_append_new(data, charge_json(o->v[i]));
        out = json_pack("{s:s,s:o}", "object", "list", "data", data);
    }
    faults_eval(m->faults, FAULT_ON_VERIFY, lg->order[0] ? lg->order : NULL, &hit);
    count_faults(m, &hit, lg);
    unlock(m);
    if (hit.outcome == FAULT_STATUS && !hit.after_commit) {
        json_decref(out);
        nap(m, hit.delay_ms + hit.delay_after_ms);
        fault_response(&hit, res);
        return LISTENER_RESPOND;
    }
    if (hit.delay_ms > 0)
        nap(m, hit.delay_ms);
    if (out)
        reply_json(res, 200, out);
    else
        problem(res, 404, "not-found", "no such charge");
    return finish(m, &hit, res);
}

/* ---- control endpoints ------------------------------------------------ */

static void stats_order(void *ctx, const char *key, void *val)
{
    const struct order_idx *o = val;
    json_object_set_new(ctx, key, json_integer((json_int_t)o->n));
}

static void stats(struct mockpay *m, struct http_res *res)
{
    json_t *per_order = json_object();
    json_t *requests = json_object();
    json_t *responses = json_object();
    json_t *injected = json_object();
    lock(m);
    table_each(m->by_order, stats_order, per_order);
    for (int r = 0; r < R_NROUTES; r++)
        json_object_set_new(requests, route_names[r], json_integer((json_int_t)m->st.requests[r]));
    for (int s = 0; s < 600; s++) {
        if (!m->st.responses[s])
            continue;
        char k[16];
        snprintf(k, sizeof k, "%d", s);
        json_object_set_new(responses, s ? k : "dropped",
                            json_integer((json_int_t)m->st.responses[s]));
    }
    for (int k = 0; k < FAULT_NKINDS; k++)
        json_object_set_new(injected, faults_kind_name((enum fault_kind)k),
                            json_integer((json_int_t)m->st.injected[k]));
    json_t *v = json_pack(
        "{s:I,s:o,s:o,s:o,s:I,s:I,s:I,s:I,s:o,s:I,s:I}", "charges", (json_int_t)m->ncharges,
        "charges_per_order", per_order, "requests", requests, "responses", responses, "replays",
        (json_int_t)m->st.replays, "in_flight_conflicts", (json_int_t)m->st.conflicts,
        "key_mismatches", (json_int_t)m->st.mismatches, "dropped", (json_int_t)m->st.responses[0],
        "faults_injected", injected, "idempotency_keys", (json_int_t)table_count(m->keys),
        "connections", (json_int_t)m->st.connections);
    unlock(m);
    reply_json(res, 200, v);
}

/* Empties the charge state (under mu). */
static void clear_state(struct mockpay *m)
{
    table_free(m->by_id, NULL);
    table_free(m->by_order, order_idx_free);
    table_free(m->keys, keyrec_free);
    for (size_t i = 0; i < m->ncharges; i++)
        charge_free(m->charges[i]);
    free(m->charges);
    m->charges = NULL;
    m->ncharges = m->cap = 0;
    m->by_id = table_new();
    m->by_order = table_new();
    m->keys = table_new();
}

static void reset(struct mockpay *m, struct http_res *res)
{
    uint64_t seed = m->start_seed;
    struct faults *f = NULL;
    /* Parsed once at start already, so this cannot fail. */
    faults_parse(m->start_faults, strlen(m->start_faults), &seed, &f, NULL);
    lock(m);
    clear_state(m);
    faults_free(m->faults);
    m->faults = f;
    m->seed = seed;
    m->epoch++;
    memset(&m->st, 0, sizeof m->st);
    unlock(m);
    reply_json(res, 200, json_pack("{s:b}", "reset", 1));
}

static void faults_get(struct mockpay *m, struct http_res *res)
{
    lock(m);
    json_t *v = faults_to_json(m->faults);
    unlock(m);
    reply_json(res, 200, v);
}

static void faults_post(struct mockpay *m, const struct http_req *req, struct http_res *res)
{
    struct ifl_err e = {0};
    struct faults *f = NULL;
    lock(m);
    uint64_t seed = m->seed;
    unlock(m);
    if (faults_parse(req->body, req->body_len, &seed, &f, &e)) {
        problem(res, 400, "invalid-faults", e.msg);
        return;
    }
    lock(m);
    faults_free(m->faults);
    m->faults = f;
    m->seed = seed;
    json_t *v = faults_to_json(m->faults);
    unlock(m);
    reply_json(res, 200, v);
}

/* ---- dispatch, logging ------------------------------------------------ */

static enum route route_of(const char *method, const char *path, const char **id)
{
    int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    *id = NULL;
    if (strcmp(path, "/v1/charges") == 0)
        return post ? R_CHARGE_POST : get ? R_CHARGE_LIST : R_OTHER;
    if (strncmp(path, "/v1/charges/", 12) == 0 && path[12] && !strchr(path + 12, '/')) {
        *id = path + 12;
        return get ? R_CHARGE_GET : R_OTHER;
    }
    if (strcmp(path, "/stats") == 0 && get)
        return R_STATS;
    if (strcmp(path, "/reset") == 0 && post)
        return R_RESET;
    if (strcmp(path, "/faults") == 0)
        return get ? R_FAULTS_GET : post ? R_FAULTS_POST : R_OTHER;
    return R_OTHER;
}

static int known_path(const char *path)
{
    return strcmp(path, "/v1/charges") == 0 || strncmp(path, "/v1/charges/", 12) == 0 ||
           strcmp(path, "/stats") == 0 || strcmp(path, "/reset") == 0 ||
           strcmp(path, "/faults") == 0;
}

/* One JSON line on stderr with a single write(2). */
static void log_request(const struct mockpay *m, const struct http_req *req,
                        const struct reqlog *lg, int64_t ms)
{
    if (m->quiet)
        return;
    char ts[32];
    clock_rfc3339(clock_now_ms(), ts);
    json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s,s:i}", "ts", ts, "level", "info", "event",
                          "mockpay.request", "method", req->method, "path", req->path, "status",
                          lg->status);
    if (!lg->status)
        json_object_set_new(o, "dropped", json_true());
    if (lg->order[0])
        json_object_set_new(o, "order", json_string(lg->order));
    if (lg->replayed)
        json_object_set_new(o, "replayed", json_true());
    if (lg->faults) {
        json_t *f = json_array();
        for (int k = 0; k < FAULT_NKINDS; k++)
            if (lg->faults & (1u << k))
                json_array_append_new(f, json_string(faults_kind_name((enum fault_kind)k)));
        json_object_set_new(o, "faults", f);
    }
    json_object_set_new(o, "ms", json_integer((json_int_t)ms));
    struct buf b;
    buf_init(&b, 0);
    if (json_write(o, &b) == 0 && buf_putc(&b, '\n') == 0) {
        ssize_t w = write(STDERR_FILENO, b.p, b.len);
        (void)w;
    }
    buf_free(&b);
    json_decref(o);
}

void mockpay_connected(void *ctx)
{
    struct mockpay *m = ctx;
    lock(m);
    m->st.connections++;
    unlock(m);
}

enum listener_action mockpay_handle(void *ctx, const struct http_req *req, struct http_res *res)
{
    struct mockpay *m = ctx;
    int64_t t0 = clock_mono_ms();
    const char *id;
    struct reqlog lg = {0};
    enum listener_action act = LISTENER_RESPOND;
    lg.route = route_of(req->method, req->path, &id);
    lock(m);
    m->st.requests[lg.route]++;
    unlock(m);
    switch (lg.route) {
    case R_CHARGE_POST:
        act = charge_post(m, req, res, &lg);
        break;
    case R_CHARGE_LIST:
        act = charge_read(m, req, res, &lg, NULL);
        break;
    case R_CHARGE_GET:
        act = charge_read(m, req, res, &lg, id);
        break;
    case R_STATS:
        stats(m, res);
        break;
    case R_RESET:
        reset(m, res);
        break;
    case R_FAULTS_GET:
        faults_get(m, res);
        break;
    case R_FAULTS_POST:
        faults_post(m, req, res);
        break;
    case R_OTHER:
    default:
        if (known_path(req->path))
            problem(res, 405, "method-not-allowed", "method not allowed on this path");
        else
            problem(res, 404, "not-found", "no such endpoint");
        break;
    }
    lg.status = act == LISTENER_DROP ? 0 : res->status;
    lock(m);
    if (lg.status >= 0 && lg.status < 600)
        m->st.responses[lg.status]++;
    unlock(m);
    log_request(m, req, &lg, clock_mono_ms() - t0);
    return act;
}

/* ---- lifecycle -------------------------------------------------------- */

int mockpay_new(const struct mockpay_opts *o, struct mockpay **out, struct ifl_err *e)
{
    const char *spec = o->faults ? o->faults : "";
    uint64_t seed = o->seed;
    struct faults *f = NULL;
    int rc = faults_parse(spec, strlen(spec), &seed, &f, e);
    if (rc)
        return rc;
    struct mockpay *m = xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    atomic_init(&m->stopping, 0);
    m->start_faults = xstrdup(spec);
    m->start_seed = seed;
    m->seed = seed;
    m->faults = f;
    m->max_charges = o->max_charges ? o->max_charges : MOCKPAY_DEFAULT_MAX_CHARGES;
    m->quiet = o->quiet;
    m->id_state = seed * 0x2545F4914F6CDD1Dull + 1;
    clear_state(m);
    *out = m;
    return 0;
}

void mockpay_shutdown(struct mockpay *m)
{
    if (m)
        atomic_store(&m->stopping, 1);
}

void mockpay_free(struct mockpay *m)
{
    if (!m)
        return;
    table_free(m->by_id, NULL);
    table_free(m->by_order, order_idx_free);
    table_free(m->keys, keyrec_free);
    for (size_t i = 0; i < m->ncharges; i++)
        charge_free(m->charges[i]);
    free(m->charges);
    faults_free(m->faults);
    free(m->start_faults);
    pthread_mutex_destroy(&m->mu);
    free(m);
}
