/*
 * faults — see faults.h.
 *
 * The compact syntax is translated into the JSON form first, so there is one
 * validator and one set of error messages.  A fault that fails validation
 * leaves nothing behind: faults_parse either returns a whole set or none.
 */
#include "faults.h"
#include "base/mem.h"
#include "json/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FAULTS 64
#define MAX_LATENCY_MS 600000
#define MAX_SEED 9007199254740992.0 /* 2^53: seeds travel as JSON numbers */

struct fault {
    enum fault_kind kind;
    unsigned on;          /* enum fault_route bits               */
    int code;             /* FAULT_STATUS                        */
    int64_t ms;           /* FAULT_LATENCY                       */
    int after_commit;     /* FAULT_STATUS, FAULT_LATENCY         */
    int64_t retry_after;  /* -1 none                             */
    int retry_after_date; /* Retry-After as an HTTP-date          */
    char *order;          /* match: order id text, or NULL       */
    uint64_t every;       /* match: every Nth matching request; 0 = all */
    double probability;   /* match: 1.0 = always                 */
    int64_t count;        /* fires at most this often; -1 = no limit */
    uint64_t seen, fired;
    uint64_t rng;
};

struct faults {
    struct fault *v;
    size_t n;
    uint64_t seed;
};

static const char *const kind_names[FAULT_NKINDS] = {
    [FAULT_DROP_AFTER_COMMIT] = "drop_after_commit",
    [FAULT_STATUS] = "status",
    [FAULT_LATENCY] = "latency",
    [FAULT_IGNORE_IDEMPOTENCY] = "ignore_idempotency",
};

const char *faults_kind_name(enum fault_kind k)
{
    return (unsigned)k < FAULT_NKINDS ? kind_names[k] : "unknown";
}

/* splitmix64: a full-period 64-bit generator; good enough and tiny. */
static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A uniform double in [0, 1). */
static double draw(struct fault *x)
{
    return (double)(splitmix(&x->rng) >> 11) * 0x1.0p-53;
}

void faults_free(struct faults *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free(f->v[i].order);
    free(f->v);
    free(f);
}

/* ---- compact syntax -> JSON ------------------------------------------- */

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t' || *s == '\n')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n'))
        s[--n] = '\0';
    return s;
}

/* A compact value: true/false, a number when it reads as one in full, else
 * a string (order ids and `on` stay strings). */
static json_t *compact_value(const char *name, const char *v)
{
    if (!v || strcmp(v, "true") == 0)
        return json_true();
    if (strcmp(v, "false") == 0)
        return json_false();
    if (strcmp(name, "order") != 0 && strcmp(name, "on") != 0 && *v) {
        char *end = NULL;
        double d = strtod(v, &end);
        if (end && *end == '\0' && isfinite(d))
            return json_real(d);
    }
    return json_string(v);
}

/* Splits s at every sep into NUL-terminated pieces (in place); returns the
 * number of pieces, at most cap (the rest stays in the last piece). */
static size_t split(char *s, char sep, char **parts, size_t cap)
{
    size_t n = 0;
    parts[n++] = s;
    for (char *p = s; *p && n < cap; p++)
        if (*p == sep) {
            *p = '\0';
            parts[n++] = p + 1;
        }
    return n;
}

static int compact_to_json(const char *text, size_t len, json_t **out, struct ifl_err *e)
{
    char *copy = xstrndup(text, len);
    json_t *arr = json_array();
    /* Empty items (";;", a trailing ";") are skipped and do not count
     * against MAX_FAULTS: split all, then keep the non-empty ones. */
    size_t cap = 1;
    for (const char *p = copy; *p; p++)
        cap += *p == ';';
    char **faults = xcalloc(cap, sizeof *faults);
    size_t nf = split(copy, ';', faults, cap);
    int rc = 0;
    for (size_t i = 0; i < nf && rc == 0; i++) {
        char *f = trim(faults[i]);
        if (!*f)
            continue;
        char *parts[32];
        size_t np = split(f, ':', parts, 32);
        json_t *obj = json_object();
        json_array_append_new(arr, obj);
        for (size_t j = 0; j < np; j++) {
            char *name = trim(parts[j]);
            char *eq = strchr(name, '=');
            char *val = NULL;
            if (eq) {
                *eq = '\0';
                val = trim(eq + 1);
                name = trim(name);
            }
            if (!*name) {
                rc = err_set(e, IFL_EINVAL, "fault %zu: empty item", i + 1);
                break;
            }
            if (j == 0) {
                json_object_set_new(obj, "kind", json_string(name));
                if (!val)
                    continue;
                if (strcmp(name, "status") == 0)
                    json_object_set_new(obj, "code", compact_value("code", val));
                else if (strcmp(name, "latency") == 0)
                    json_object_set_new(obj, "ms", compact_value("ms", val));
                else
                    rc = err_set(e, IFL_EINVAL, "fault %zu: kind '%s' takes no value", i + 1, name);
                continue;
            }
            if (json_object_get(obj, name)) {
                rc = err_set(e, IFL_EINVAL, "fault %zu: '%s' given twice", i + 1, name);
                break;
            }
            json_object_set_new(obj, name, compact_value(name, val));
        }
    }
    free(copy);
    free(faults);
    if (rc) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return 0;
}

/* ---- JSON -> struct fault --------------------------------------------- */

/* An integral number in [lo, hi] from member `name` of o, or dflt. */
static int get_int(const json_t *o, const char *name, int64_t lo, int64_t hi, int64_t dflt,
                   int64_t *out, const char *ptr, struct ifl_err *e)
{
    const json_t *v = json_object_get(o, name);
    if (!v) {
        *out = dflt;
        return 0;
    }
    double d = json_is_number(v) ? json_num(v) : NAN;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return err_setp(e, IFL_EINVAL, ptr, "'%s' must be an integer from %lld to %lld", name,
                        (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return 0;
}

static int get_bool(const json_t *o, const char *name, int *out, const char *ptr, struct ifl_err *e)
{
    const json_t *v = json_object_get(o, name);
    if (!v) {
        *out = 0;
        return 0;
    }
    if (!json_is_boolean(v))
        return err_setp(e, IFL_EINVAL, ptr, "'%s' must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

static int kind_of(const char *s)
{
    for (int k = 0; k < FAULT_NKINDS; k++)
        if (strcmp(s, kind_names[k]) == 0)
            return k;
    if (strcmp(s, "drop") == 0)
        return FAULT_DROP_AFTER_COMMIT;
    return -1;
}

static int fault_from_json(const json_t *o, size_t idx, struct fault *x, struct ifl_err *e)
{
    static const char *const allowed[] = {
        "kind",  "code",  "ms",          "after_commit", "retry_after", "retry_after_date",
        "order", "every", "probability", "count",        "on",          NULL};
    char ptr[64];
    snprintf(ptr, sizeof ptr, "/faults/%zu", idx);
    if (!json_is_object(o))
        return err_setp(e, IFL_EINVAL, ptr, "fault %zu must be an object", idx + 1);
    const char *key;
    const json_t *val;
    json_object_foreach((json_t *)o, key, val)
    {
        int ok = 0;
        for (int i = 0; allowed[i]; i++)
            ok |= strcmp(key, allowed[i]) == 0;
        if (!ok)
            return err_setp(e, IFL_EINVAL, ptr, "fault %zu: unknown member '%s'", idx + 1, key);
    }
    const json_t *k = json_object_get(o, "kind");
    int kind = json_is_string(k) ? kind_of(json_string_value(k)) : -1;
    if (kind < 0)
        return err_setp(e, IFL_EINVAL, ptr,
                        "fault %zu: 'kind' must be one of drop_after_commit, status, latency, "
                        "ignore_idempotency",
                        idx + 1);
    memset(x, 0, sizeof *x);
    x->kind = (enum fault_kind)kind;
    int64_t v;
    if (get_int(o, "code", 200, 599, 0, &v, ptr, e))
        return IFL_EINVAL;
    x->code = (int)v;
    if (x->code > 200 && x->code < 300)
        return err_setp(e, IFL_EINVAL, ptr, "fault %zu: 'code' must be 200 or 300-599", idx + 1);
    if ((kind == FAULT_STATUS) != (x->code != 0))
        return err_setp(e, IFL_EINVAL, ptr,
                        "fault %zu: 'code' (200 or 300-599) goes with kind status", idx + 1);
    if (get_int(o, "ms", 0, MAX_LATENCY_MS, -1, &x->ms, ptr, e))
        return IFL_EINVAL;
    if ((kind == FAULT_LATENCY) != (x->ms >= 0))
        return err_setp(e, IFL_EINVAL, ptr, "fault %zu: 'ms' (0-%d) goes with kind latency",
                        idx + 1, MAX_LATENCY_MS);
    if (get_bool(o, "after_commit", &x->after_commit, ptr, e))
        return IFL_EINVAL;
    if (x->after_commit && kind != FAULT_STATUS && kind != FAULT_LATENCY)
        return err_setp(e, IFL_EINVAL, ptr,
                        "fault %zu: 'after_commit' applies to status and latency", idx + 1);
    int64_t ra, rad;
    if (get_int(o, "retry_after", 0, 86400, -1, &ra, ptr, e) ||
        get_int(o, "retry_after_date", 0, 86400, -1, &rad, ptr, e))
        return IFL_EINVAL;
    if (ra >= 0 && rad >= 0)
        return err_setp(e, IFL_EINVAL, ptr,
                        "fault %zu: give 'retry_after' or 'retry_after_date', not both", idx + 1);
    if ((ra >= 0 || rad >= 0) && kind != FAULT_STATUS)
        return err_setp(e, IFL_EINVAL, ptr, "fault %zu: Retry-After goes with kind status",
                        idx + 1);
    x->retry_after = ra >= 0 ? ra : rad;
    x->retry_after_date = rad >= 0;
    int64_t every, count;
    if (get_int(o, "every", 1, INT64_C(1) << 40, 0, &every, ptr, e) ||
        get_int(o, "count", 0, INT64_C(1) << 40, -1, &count, ptr, e))
        return IFL_EINVAL;
    x->every = (uint64_t)every;
    x->count = count;
    const json_t *p = json_object_get(o, "probability");
    x->probability = 1.0;
    if (p) {
        double d = json_is_number(p) ? json_num(p) : NAN;
        if (!(d >= 0.0 && d <= 1.0))
            return err_setp(e, IFL_EINVAL, ptr, "fault %zu: 'probability' must be from 0 to 1",
                            idx + 1);
        x->probability = d;
    }
    const json_t *on = json_object_get(o, "on");
    x->on = FAULT_ON_CHARGE;
    if (on) {
        const char *s = json_is_string(on) ? json_string_value(on) : "";
        if (strcmp(s, "charge") == 0)
            x->on = FAULT_ON_CHARGE;
        else if (strcmp(s, "verify") == 0)
            x->on = FAULT_ON_VERIFY;
        else if (strcmp(s, "any") == 0)
            x->on = FAULT_ON_ANY;
        else
            return err_setp(e, IFL_EINVAL, ptr, "fault %zu: 'on' must be charge, verify or any",
                            idx + 1);
    }
    const json_t *ord = json_object_get(o, "order");
    if (ord) {
        char num[32];
        if (json_is_string(ord) && json_string_length(ord) > 0 &&
            strlen(json_string_value(ord)) == json_string_length(ord)) {
            x->order = xstrdup(json_string_value(ord));
        } else if (json_is_number(ord) && json_format_number(json_num(ord), num) > 0) {
            x->order = xstrdup(num);
        } else {
            return err_setp(e, IFL_EINVAL, ptr,
                            "fault %zu: 'order' must be a non-empty string or a number", idx + 1);
        }
    }
    return 0;
}

int faults_parse(const char *text, size_t len, uint64_t *seed, struct faults **out,
                 struct ifl_err *e)
{
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r'))
        i++;
    json_t *doc = NULL;
    int rc;
    if (i < len && (text[i] == '[' || text[i] == '{')) {
        struct json_limits lim = {.max_bytes = 1 << 16, .max_depth = 8};
        rc = json_parse(text, len, &lim, &doc, e);
    } else {
        rc = compact_to_json(text, len, &doc, e);
    }
    if (rc)
        return rc;
    json_t *list = doc;
    uint64_t sd = *seed;
    if (json_is_object(doc)) {
        const char *key;
        json_t *val;
        json_object_foreach(doc, key, val)
        {
            if (strcmp(key, "seed") != 0 && strcmp(key, "faults") != 0) {
                json_decref(doc);
                return err_setp(e, IFL_EINVAL, "", "unknown member '%s' (want seed, faults)", key);
            }
        }
        const json_t *s = json_object_get(doc, "seed");
        if (s) {
            double d = json_is_number(s) ? json_num(s) : -1;
            if (!(d >= 0 && d <= MAX_SEED) || d != floor(d)) {
                json_decref(doc);
                return err_setp(e, IFL_EINVAL, "/seed", "'seed' must be an integer from 0 to 2^53");
            }
            sd = (uint64_t)d;
        }
        list = json_object_get(doc, "faults");
        if (!list) {
            list = json_array();
            json_object_set_new(doc, "faults", list);
        }
    }
    if (!json_is_array(list) || json_array_size(list) > MAX_FAULTS) {
        json_decref(doc);
        return err_setp(e, IFL_EINVAL, "/faults", "faults must be an array of at most %d",
                        MAX_FAULTS);
    }
    struct faults *f = xcalloc(1, sizeof *f);
    f->n = json_array_size(list);
    f->v = xcalloc(f->n ? f->n : 1, sizeof *f->v);
    f->seed = sd;
    for (size_t k = 0; k < f->n; k++) {
        rc = fault_from_json(json_array_get(list, k), k, &f->v[k], e);
        if (rc) {
            json_decref(doc);
            faults_free(f);
            return rc;
        }
        uint64_t st = sd ^ (0xD1B54A32D192ED03ull * (k + 1));
        f->v[k].rng = splitmix(&st);
    }
    json_decref(doc);
    *seed = sd;
    *out = f;
    return 0;
}

void faults_eval(struct faults *f, enum fault_route route, const char *order, struct fault_hit *hit)
{
    memset(hit, 0, sizeof *hit);
    hit->outcome = -1;
    hit->outcome_fault = -1;
    hit->retry_after = -1;
    for (size_t i = 0; f && i < f->n; i++) {
        struct fault *x = &f->v[i];
        int outcome = x->kind == FAULT_DROP_AFTER_COMMIT || x->kind == FAULT_STATUS;
        if (!(x->on & (unsigned)route))
            continue;
        if (x->order && (!order || strcmp(x->order, order) != 0))
            continue;
        if (x->count >= 0 && x->fired >= (uint64_t)x->count)
            continue;
        if (outcome && hit->outcome >= 0)
            continue;
        x->seen++;
        if (x->every && x->seen % x->every)
            continue;
        if (x->probability < 1.0 && draw(x) >= x->probability)
            continue;
        x->fired++;
        hit->kinds |= 1u << x->kind;
        switch (x->kind) {
        case FAULT_LATENCY:
            if (x->after_commit)
                hit->delay_after_ms += x->ms;
            else
                hit->delay_ms += x->ms;
            break;
        case FAULT_IGNORE_IDEMPOTENCY:
            hit->ignore_keys = 1;
            break;
        case FAULT_STATUS:
            hit->code = x->code;
            hit->after_commit = x->after_commit;
            hit->retry_after = x->retry_after;
            hit->retry_after_date = x->retry_after_date;
            /* fallthrough */
        case FAULT_DROP_AFTER_COMMIT:
        default:
            hit->outcome = (int)x->kind;
            hit->outcome_fault = (int)i;
            break;
        }
    }
}

void faults_unfire_outcome(struct faults *f, struct fault_hit *hit)
{
    if (hit->outcome < 0)
        return;
    if (f && hit->outcome_fault >= 0 && (size_t)hit->outcome_fault < f->n)
        f->v[hit->outcome_fault].fired--;
    hit->kinds &= ~(1u << hit->outcome);
    hit->outcome = -1;
    hit->outcome_fault = -1;
}

json_t *faults_to_json(const struct faults *f)
{
    static const char *const on_names[] = {"", "charge", "verify", "any"};
    json_t *arr = json_array();
    for (size_t i = 0; f && i < f->n; i++) {
        const struct fault *x = &f->v[i];
        json_t *o = json_object();
        json_object_set_new(o, "kind", json_string(kind_names[x->kind]));
        if (x->kind == FAULT_STATUS)
            json_object_set_new(o, "code", json_integer(x->code));
        if (x->kind == FAULT_LATENCY)
            json_object_set_new(o, "ms", json_integer(x->ms));
        if (x->after_commit)
            json_object_set_new(o, "after_commit", json_true());
        if (x->retry_after >= 0)
            json_object_set_new(o, x->retry_after_date ? "retry_after_date" : "retry_after",
                                json_integer(x->retry_after));
        json_object_set_new(o, "on", json_string(on_names[x->on & 3]));
        if (x->order)
            json_object_set_new(o, "order", json_string(x->order));
        if (x->every)
            json_object_set_new(o, "every", json_integer((json_int_t)x->every));
        if (x->probability < 1.0)
            json_object_set_new(o, "probability", json_real(x->probability));
        if (x->count >= 0)
            json_object_set_new(o, "count", json_integer(x->count));
        json_object_set_new(o, "seen", json_integer((json_int_t)x->seen));
        json_object_set_new(o, "fired", json_integer((json_int_t)x->fired));
        json_array_append_new(arr, o);
    }
    return json_pack("{s:I,s:o}", "seed", (json_int_t)(f ? f->seed : 0), "faults", arr);
}
