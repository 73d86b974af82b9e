/*
 * workflow — see workflow.h.
 *
 * Validation order is fixed so that the pointer a user gets is stable: shape
 * of the root, then each vertex in the definition's member order, then each
 * edge in array order, then graph properties (entry point, acyclicity).
 */
#include "engine/workflow.h"
#include "base/mem.h"
#include "engine/cron.h"
#include "expr/expr.h"
#include "expr/template.h"
#include "json/json.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int wf_name_dots(const char *s)
{
    return strcmp(s, ".") == 0 || strcmp(s, "..") == 0;
}

int wf_name_valid(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 128 || wf_name_dots(s))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

const char *wf_type_name(enum wf_vertex_type t)
{
    switch (t) {
    case WF_ENTRY_POINT:
        return "ENTRY_POINT";
    case WF_GATEWAY:
        return "GATEWAY";
    case WF_TRANSFORM:
        return "TRANSFORM";
    }
    return "?";
}

const struct wf *wf_hold(const struct wf *w)
{
    /* w points into the heap, never at a const object: the count may move */
    atomic_fetch_add_explicit(&((struct wf *)w)->refs, 1, memory_order_relaxed);
    return w;
}

void wf_release(const struct wf *w)
{
    wf_free((struct wf *)w);
}

void wf_free(struct wf *w)
{
    if (!w || atomic_fetch_sub_explicit(&w->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i < w->nv; i++) {
        struct wf_vertex *v = &w->v[i];
        free(v->id);
        identity_fields_clear(&v->fields);
        identity_fields_clear(&v->ord_key);
        identity_fields_clear(&v->ord_version);
        tmpl_free(v->output);
        tmpl_free(v->request);
        tmpl_free(v->verify);
        expr_free(v->done_when);
        free(v->broken);
        free(v->in);
        free(v->out);
    }
    for (size_t i = 0; i < w->ne; i++)
        expr_free(w->e[i].cond);
    free(w->v);
    free(w->e);
    free(w->topo);
    free(w->anc);
    json_decref(w->def);
    free(w);
}

long wf_vertex_index(const struct wf *w, const char *id)
{
    for (size_t i = 0; i < w->nv; i++)
        if (strcmp(w->v[i].id, id) == 0)
            return (long)i;
    return -1;
}

/* Builds "/vertices/<id>/<rest>" with the id escaped. */
static void vptr(char *out, size_t cap, const char *id, const char *rest)
{
    struct buf b;
    buf_init(&b, 0);
    buf_puts(&b, "/vertices");
    json_pointer_push(&b, id);
    if (rest)
        buf_puts(&b, rest);
    snprintf(out, cap, "%s", b.p);
    buf_free(&b);
}

/* The expression text of a "= expr" member: after the `=` (optional here)
 * and the spaces that follow it. */
static const char *expr_text(const char *s)
{
    if (*s == '=')
        s++;
    while (*s == ' ' || *s == '\t')
        s++;
    return s;
}

/* An HTTP header name (an RFC 9110 token), 1–64 characters. */
int wf_duration_parse(const char *s, int64_t *ms)
{
    if (!s || !*s)
        return -1;
    int64_t n = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        n = n * 10 + (*p - '0');
        if (n > 3650LL * 86400 * 1000)
            return -1;
    }
    if (p == s)
        return -1;
    int64_t unit = strcmp(p, "ms") == 0  ? 1
                   : strcmp(p, "s") == 0 ? 1000
                   : strcmp(p, "m") == 0 ? 60000
                   : strcmp(p, "h") == 0 ? 3600000
                   : strcmp(p, "d") == 0 ? 86400000
                                         : 0;
    if (!unit || n == 0 || n > 3650LL * 86400 * 1000 / unit)
        return -1;
    *ms = n * unit;
    return 0;
}

static int header_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || strchr("!#$%&'*+-.^_`|~", s[i])))
            return 0;
    return 1;
}

/* "/vertices/<id><base>/<member>" with id and member escaped (member
 * NULL: the base alone). */
static void member_ptr(char *out, size_t cap, const char *id, const char *base, const char *member)
{
    struct buf rest;
    buf_init(&rest, 0);
    buf_puts(&rest, base);
    if (member)
        json_pointer_push(&rest, member);
    vptr(out, cap, id, rest.p);
    buf_free(&rest);
}

/* Refuses member `m` of the entry point's signature with `why`. */
static int sig_refuse(struct wf_vertex *v, const char *m, const char *why, struct ifl_err *e)
{
    char p[IFL_ERR_PTR_MAX];
    member_ptr(p, sizeof p, v->id, "/config/signature", m);
    return err_setp(e, IFL_EVALIDATION, p, "%s", why);
}

/* "signature" of spec §8 into v->sig. */
static int compile_signature(struct wf_vertex *v, json_t *sig, struct ifl_err *e)
{
    struct wf_signature *g = &v->sig;
    if (!json_is_object(sig))
        return sig_refuse(v, NULL, "signature must be an object", e);
    const char *scheme = json_string_value(json_object_get(sig, "scheme"));
    if (scheme && strcmp(scheme, "standard-webhooks") == 0)
        g->scheme = WF_SIG_STANDARD;
    else if (scheme && strcmp(scheme, "hmac-sha256") == 0)
        g->scheme = WF_SIG_HMAC;
    else
        return sig_refuse(v, "scheme", "scheme must be \"standard-webhooks\" or \"hmac-sha256\"",
                          e);
    int std = g->scheme == WF_SIG_STANDARD;
    const char *k;
    json_t *m;
    json_object_foreach(sig, k, m)
    {
        static const char *const common[] = {"scheme", "secret", NULL};
        static const char *const standard[] = {"toleranceSeconds", NULL};
        static const char *const hmac[] = {"header",    "prefix",           "encoding",
                                           "timestamp", "toleranceSeconds", NULL};
        int known = 0;
        for (int i = 0; common[i]; i++)
            known |= strcmp(k, common[i]) == 0;
        for (int i = 0; std ? standard[i] != NULL : hmac[i] != NULL; i++)
            known |= strcmp(k, std ? standard[i] : hmac[i]) == 0;
        if (!known) {
            char why[200];
            snprintf(why, sizeof why, "%s is not a member of a %s signature (%s)", k, scheme,
                     std ? "scheme, secret, toleranceSeconds"
                         : "scheme, secret, header, prefix, encoding, timestamp, "
                           "toleranceSeconds");
            return sig_refuse(v, k, why, e);
        }
    }
    const char *secret = json_string_value(json_object_get(sig, "secret"));
    if (!secret || !tmpl_secret_ref(secret, g->secret, sizeof g->secret))
        return sig_refuse(v, "secret",
                          "secret must be a reference to a workspace secret, "
                          "\"{{ secrets.NAME }}\" (never the value itself)",
                          e);
    /* the template reads `-` in a NAME too, which no secret can have: every
     * delivery would answer 503, forever (the GATEWAY check, bad_secret_name) */
    if (strspn(g->secret, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") !=
        strlen(g->secret))
        return sig_refuse(v, "secret",
                          "a secret placeholder is {{ secrets.NAME }}, NAME letters, digits and "
                          "_: no secret can have this name",
                          e);
    g->tolerance_s = 300;
    json_t *tol = json_object_get(sig, "toleranceSeconds");
    if (tol) {
        /* numbers may arrive as reals (the JSON reader keeps big ones exact) */
        double d = json_is_number(tol) ? json_num(tol) : 0;
        if (!(d >= 1 && d <= 86400) || d != (double)(int64_t)d)
            return sig_refuse(v, "toleranceSeconds",
                              "toleranceSeconds must be an integer from 1 to 86400", e);
        g->tolerance_s = (int64_t)d;
    }
    if (std)
        return 0;
    g->header = json_string_value(json_object_get(sig, "header"));
    if (!g->header || !header_name_ok(g->header))
        return sig_refuse(v, "header",
                          "an hmac-sha256 signature needs header: the name of the header that "
                          "carries it",
                          e);
    static const char *const texts[] = {"prefix", "timestamp"};
    const char **outs[] = {&g->prefix, &g->ts_prefix};
    for (int i = 0; i < 2; i++) {
        json_t *tm = json_object_get(sig, texts[i]);
        if (!tm)
            continue;
        const char *t = *outs[i] = json_string_value(tm);
        int ok = t && *t && strlen(t) <= 64 && !strchr(t, ',');
        for (const char *c = t; ok && *c; c++)
            ok = *c >= 0x21 && *c <= 0x7e;
        if (!ok)
            return sig_refuse(v, texts[i],
                              "must be 1 to 64 printable characters without spaces or commas", e);
    }
    /* Stripe-style: "t=…,v1=…", signed over "t.body" */
    if (g->ts_prefix && !g->prefix)
        return sig_refuse(v, "prefix",
                          "a signature with a timestamp needs the prefix of its signatures "
                          "(e.g. \"v1=\")",
                          e);
    if (!g->ts_prefix && json_object_get(sig, "toleranceSeconds"))
        return sig_refuse(v, "toleranceSeconds",
                          "toleranceSeconds applies to a signature with a timestamp", e);
    const char *enc = json_string_value(json_object_get(sig, "encoding"));
    if (json_object_get(sig, "encoding") &&
        (!enc || (strcmp(enc, "hex") != 0 && strcmp(enc, "base64") != 0)))
        return sig_refuse(v, "encoding", "encoding must be \"hex\" or \"base64\"", e);
    g->base64 = enc && strcmp(enc, "base64") == 0;
    return 0;
}

/* An object holds only the members this version reads: a misspelled one
 * would otherwise be ignored and its default taken — an edge without its
 * condition, a call without its retry limit, an entry point without its
 * signature check.  IFL_EVALIDATION pointing at the first other member of
 * obj (at pointer `at`), or 0. */
static int only_members(json_t *obj, const char *const *known, const char *at, const char *what,
                        struct ifl_err *e)
{
    const char *k;
    json_t *m;
    json_object_foreach(obj, k, m)
    {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++)
            ok = strcmp(k, known[i]) == 0;
        if (ok)
            continue;
        struct buf p, list;
        buf_init(&p, 0);
        buf_init(&list, 0);
        buf_puts(&p, at);
        json_pointer_push(&p, k);
        for (int i = 0; known[i]; i++)
            buf_printf(&list, "%s%s", i ? ", " : "", known[i]);
        int rc = err_setp(e, IFL_EVALIDATION, p.p, "'%.64s' is not a member of %s (%s)", k, what,
                          list.p);
        buf_free(&p);
        buf_free(&list);
        return rc;
    }
    return 0;
}

/* "ordering" of spec §8: {"key": PATH, "version": PATH}, one payload path
 * each. */
static int compile_ordering(struct wf_vertex *v, json_t *ord, struct ifl_err *e)
{
    char p[IFL_ERR_PTR_MAX];
    if (!json_is_object(ord)) {
        vptr(p, sizeof p, v->id, "/config/ordering");
        return err_setp(e, IFL_EVALIDATION, p,
                        "ordering must be an object: {\"key\": PATH, \"version\": PATH}");
    }
    static const char *const members[] = {"key", "version", NULL};
    vptr(p, sizeof p, v->id, "/config/ordering");
    int rc = only_members(ord, members, p, "ordering", e);
    if (rc)
        return rc;
    struct id_fields *out[] = {&v->ord_key, &v->ord_version};
    for (int i = 0; i < 2; i++) {
        member_ptr(p, sizeof p, v->id, "/config/ordering", members[i]);
        json_t *path = json_object_get(ord, members[i]);
        if (!json_is_string(path))
            return err_setp(e, IFL_EVALIDATION, p, "ordering needs %s: a payload path (string)",
                            members[i]);
        struct ifl_err pe = {0};
        if (identity_fields_parse(path, out[i], &pe) || out[i]->n != 1) {
            identity_fields_clear(out[i]);
            return err_setp(e, IFL_EVALIDATION, p, "ordering %s must be one payload path%s%s",
                            members[i], pe.msg[0] ? ": " : "", pe.msg);
        }
    }
    v->has_ordering = 1;
    return 0;
}

static int compile_entry(struct wf_vertex *v, json_t *cfg, struct ifl_err *e)
{
    char p[IFL_ERR_PTR_MAX];
    /* A member this engine would not honour is refused, not ignored: a
     * workflow that asks for signature checks must not run unsigned
     * payloads, a schedule must not be silently idle, and a typo must not
     * fall back to another identity mode. */
    static const char *const known[] = {"idempotencyFields", "dedupWindow", "signature",
                                        "ordering",          "schedule",    NULL};
    vptr(p, sizeof p, v->id, "/config");
    int mrc = only_members(cfg, known, p, "an ENTRY_POINT's config", e);
    if (mrc)
        return mrc;
    json_t *sig = json_object_get(cfg, "signature");
    if (sig) {
        int rc = compile_signature(v, sig, e);
        if (rc)
            return rc;
    }
    json_t *ord = json_object_get(cfg, "ordering");
    if (ord) {
        int rc = compile_ordering(v, ord, e);
        if (rc)
            return rc;
    }
    json_t *sched = json_object_get(cfg, "schedule");
    if (sched) {
        vptr(p, sizeof p, v->id, "/config/schedule");
        if (!json_is_string(sched))
            return err_setp(e, IFL_EVALIDATION, p,
                            "schedule must be a cron expression (string, five fields, UTC)");
        struct ifl_err ce = {0};
        if (cron_parse(json_string_value(sched), &v->schedule, &ce))
            return err_setp(e, IFL_EVALIDATION, p, "%s", ce.msg);
        /* a fire has no payload of its own to take a version from */
        if (v->has_ordering)
            return err_setp(e, IFL_EVALIDATION, p,
                            "a scheduled entry point cannot also set ordering: its fires carry "
                            "no version");
        v->schedule_text = json_string_value(sched);
        v->has_schedule = 1;
    }
    v->dedup_window_ms = WF_DEDUP_WINDOW_DEFAULT_MS;
    json_t *dw = json_object_get(cfg, "dedupWindow");
    if (dw) {
        vptr(p, sizeof p, v->id, "/config/dedupWindow");
        if (wf_duration_parse(json_string_value(dw), &v->dedup_window_ms))
            return err_setp(e, IFL_EVALIDATION, p,
                            "dedupWindow must be a duration such as \"7d\", \"36h\", \"90m\" "
                            "or \"3600s\" (at most 3650 days)");
    }
    json_t *f = json_object_get(cfg, "idempotencyFields");
    if (f) {
        int rc = identity_fields_parse(f, &v->fields, e);
        if (rc) {
            char *rest = xasprintf("/config/idempotencyFields%s", e ? e->pointer : "");
            vptr(p, sizeof p, v->id, rest);
            free(rest);
            if (e)
                memcpy(e->pointer, p, sizeof e->pointer);
            return rc;
        }
        v->has_fields = 1;
    }
    return 0;
}

/* The first string under j that `bad` refuses: 1 with its JSON Pointer
 * appended to p (which keeps what it held before otherwise). */
static int find_string(json_t *j, struct buf *p, int (*bad)(json_t *s))
{
    size_t at = p->len;
    if (json_is_string(j))
        return bad(j);
    const char *k;
    json_t *x;
    size_t i;
    if (json_is_object(j)) {
        json_object_foreach(j, k, x)
        {
            json_pointer_push(p, k);
            if (find_string(x, p, bad))
                return 1;
            p->len = at;
            p->p[at] = '\0';
        }
    } else if (json_is_array(j)) {
        json_array_foreach(j, i, x)
        {
            buf_printf(p, "/%zu", i);
            if (find_string(x, p, bad))
                return 1;
            p->len = at;
            p->p[at] = '\0';
        }
    }
    return 0;
}

/* A string holding a NUL.  Every string of a definition is read as C text
 * somewhere — a vertex type, an edge end, a method, a condition's source,
 * a schedule — where a NUL would cut it short, and the engine would run
 * something other than what it stores and shows. */
static int has_nul(json_t *s)
{
    return memchr(json_string_value(s), '\0', json_string_length(s)) != NULL;
}

/* A literal (not an `=` expression) with a `{{` that begins a secret
 * placeholder (the word `secret` or `secrets`, in any case, after spaces)
 * but is not one the
 * template reads — `{{ secrets.NAME }}`, NAME A-Z a-z 0-9 _ (a secret name;
 * the template reads `-` too, which no secret can have): `{{ secret.KEY }}`,
 * `{{ Secrets.KEY }}`, `{{ secrets.KEY` unclosed, `{{ secrets.MY-KEY }}`
 * would be sent as that text (found by a judge: `Bearer {{ secret.S1 }}`
 * went out as written). */
static int bad_secret_name(json_t *s)
{
    const char *v = json_string_value(s);
    if (*v == '=')
        return 0;
    /* from each `{{`, overlapping ones too (`{{{`): the template reads any */
    for (const char *p = strstr(v, "{{"); p; p = strstr(p + 1, "{{")) {
        const char *k = p + 2;
        while (*k == ' ')
            k++;
        size_t w = 0; /* the word, as far as a name's characters go */
        while (isalnum((unsigned char)k[w]) || k[w] == '_' || k[w] == '-')
            w++;
        if (!((w == 6 || (w == 7 && (k[6] | 0x20) == 's')) && strncasecmp(k, "secret", 6) == 0))
            continue; /* not a placeholder's word: text of its own */
        if (strncmp(k, "secrets.", 8) != 0)
            return 1;
        k += 8;
        const char *st = k;
        int dash = 0;
        while (*k == '_' || *k == '-' || isalnum((unsigned char)*k))
            dash |= *k++ == '-';
        const char *en = k;
        while (*k == ' ')
            k++;
        if (dash || en == st || en - st > TMPL_SECRET_NAME_MAX || k[0] != '}' || k[1] != '}')
            return 1;
    }
    return 0;
}

/* A literal url no request could carry: not http(s), or a space or a
 * control character outside its `{{ … }}` placeholders. */
static int bad_url(const char *u)
{
    if (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0)
        return 1;
    const char *host = strstr(u, "//") + 2;
    if (*host == '\0' || strchr("/?#:", *host)) /* no host: http:///x (found by a judge) */
        return 1;
    for (const char *c = u; *c; c++) {
        if (c[0] == '{' && c[1] == '{') {
            const char *end = strstr(c, "}}");
            if (end) {
                c = end + 1;
                continue;
            }
        }
        if ((unsigned char)*c <= ' ' || *c == 0x7F)
            return 1;
    }
    return 0;
}

/* A literal header value with a control character (CR, LF: it would end
 * the header line). */
static int bad_header_value(json_t *s)
{
    const char *v = json_string_value(s);
    if (*v == '=')
        return 0;
    for (; *v; v++)
        if (((unsigned char)*v < ' ' && *v != '\t') || *v == 0x7F)
            return 1;
    return 0;
}

/* An expression that gives another value at each evaluation: the clock,
 * randomness, or `$eval` (which can spell either). */
static int unstable_expr(json_t *s)
{
    const char *src = json_string_value(s);
    if (*src != '=')
        return 0;
    src = expr_text(src);
    struct expr *x = NULL;
    struct expr_error xe;
    if (expr_compile(src, strlen(src), &x, &xe) != 0)
        return 0; /* the template's compile reports it */
    static const char *const unstable[] = {"now", "millis", "random", "eval", NULL};
    int hit = expr_uses_variable(x, unstable) != NULL;
    expr_free(x);
    return hit;
}

/* The first string of cfg's `parts` that `bad` finds, as IFL_EVALIDATION
 * with `why` and its pointer; 0 when there is none. */
static int find_in_parts(const struct wf_vertex *v, json_t *cfg, const char *const *parts,
                         int (*bad)(json_t *s), const char *why, struct ifl_err *e)
{
    int rc = 0;
    for (int i = 0; parts[i] && !rc; i++) {
        struct buf b;
        buf_init(&b, 0);
        buf_printf(&b, "/config/%s", parts[i]);
        if (find_string(json_object_get(cfg, parts[i]), &b, bad)) {
            char p[IFL_ERR_PTR_MAX];
            vptr(p, sizeof p, v->id, b.p);
            rc = err_setp(e, IFL_EVALIDATION, p, "%s", why);
        }
        buf_free(&b);
    }
    return rc;
}

/* New versions only: what a GATEWAY's literal parts show wrong before any
 * run — each would fail every call (`request_error`) or never resolve.
 * Stored versions keep running as they did (docs/upgrading.md). */
static int gateway_literals(struct wf_vertex *v, json_t *cfg, struct ifl_err *e)
{
    char p[IFL_ERR_PTR_MAX];
    int rc = 0;
    json_t *verify = json_object_get(cfg, "verify");
    for (int k = 0; k < 2 && !rc; k++) {
        json_t *part = k ? verify : cfg;
        const char *base = k ? "/config/verify" : "/config";
        const char *u = json_string_value(json_object_get(part, "url"));
        struct buf b;
        buf_init(&b, 0);
        char why[128];
        if (u && *u != '=' && bad_url(u)) {
            buf_printf(&b, "%s/url", base);
            vptr(p, sizeof p, v->id, b.p);
            rc = err_setp(e, IFL_EVALIDATION, p,
                          "a literal url starts with http:// or https:// and a host, and holds "
                          "no space or control character");
        } else if (u && *u != '=' && !strstr(u, "{{") && gw_url_check(u, why, sizeof why)) {
            /* what libcurl's parser refuses (found by a judge: a port past
             * 65535 — every call failed, unsent); no host is bad_url's */
            buf_printf(&b, "%s/url", base);
            vptr(p, sizeof p, v->id, b.p);
            rc = err_setp(e, IFL_EVALIDATION, p,
                          "a literal url no request can be sent to (%s): it needs a host, and a "
                          "port from 1 to 65535",
                          why);
        }
        buf_reset(&b);
        buf_printf(&b, "%s/headers", base);
        if (!rc && find_string(json_object_get(part, "headers"), &b, bad_header_value)) {
            vptr(p, sizeof p, v->id, b.p);
            rc = err_setp(e, IFL_EVALIDATION, p,
                          "a header value cannot hold a control character (CR and LF would end "
                          "the header line)");
        }
        buf_free(&b);
    }
    /* With a key, what the provider compares — url, query, body — must be
     * the same on every attempt: a provider answers a key sent again with
     * another body 422 (the IETF draft; Stripe 400), which after an
     * attempt whose outcome is unknown would fail a step whose call took
     * effect.  Other headers (a timestamp) may vary. */
    int keyed = 0;
    const char *hk;
    json_t *hv;
    json_object_foreach(json_object_get(cfg, "headers"), hk, hv)
    {
        if (strcasecmp(hk, "Idempotency-Key") != 0)
            continue;
        keyed = 1;
        /* a literal key of nothing but spaces or tabs sends nothing, ever
         * (gwstep.c: "rendered empty"; found by a judge) */
        const char *kv = json_string_value(hv);
        if (!rc && kv && *kv != '=' && kv[strspn(kv, " \t")] == '\0') {
            struct buf b;
            buf_init(&b, 0);
            buf_printf(&b, "/config/headers");
            json_pointer_push(&b, hk);
            vptr(p, sizeof p, v->id, b.p);
            buf_free(&b);
            rc = err_setp(e, IFL_EVALIDATION, p,
                          "the Idempotency-Key is empty: a call would never be sent (give it a "
                          "value, or leave the header out)");
        }
    }
    static const char *const compared[] = {"url", "query", "body", NULL};
    if (!rc && keyed)
        rc = find_in_parts(v, cfg, compared, unstable_expr,
                           "a request with an Idempotency-Key must be the same on every attempt: "
                           "$now, $millis, $random and $eval give another value each time (a "
                           "provider answers a key sent again with another body 422)",
                           e);
    static const char *const parts[] = {"url", "headers", "query", "body", "verify", NULL};
    if (!rc)
        rc = find_in_parts(v, cfg, parts, bad_secret_name,
                           "a secret placeholder is {{ secrets.NAME }}, NAME letters, digits and "
                           "_: as written it would never resolve, and go out as this text",
                           e);
    /* whole milliseconds and attempts (a fraction would be cut off) */
    static const char *const ints[][2] = {{"", "timeoutMs"},
                                          {"", "deadlineMs"},
                                          {"/retry", "maxAttempts"},
                                          {"/retry", "initialIntervalMs"},
                                          {"/retry", "maxIntervalMs"},
                                          {"/verify", "afterMs"},
                                          {NULL, NULL}};
    for (int i = 0; ints[i][0] && !rc; i++) {
        json_t *o = *ints[i][0] ? json_object_get(cfg, ints[i][0] + 1) : cfg;
        json_t *x = json_object_get(o, ints[i][1]);
        if (!json_is_real(x) || floor(json_real_value(x)) == json_real_value(x))
            continue;
        char rest[64];
        snprintf(rest, sizeof rest, "/config%s/%s", ints[i][0], ints[i][1]);
        vptr(p, sizeof p, v->id, rest);
        rc = err_setp(e, IFL_EVALIDATION, p, "%s is a whole number", ints[i][1]);
    }
    return rc;
}

static int compile_gateway(struct wf_vertex *v, json_t *cfg, int strict, struct ifl_err *e)
{
    char p[IFL_ERR_PTR_MAX];
    static const char *methods[] = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", NULL};
    /* the call's method and the verify request's: each goes on the wire as
     * the request line's first word */
    json_t *verify_cfg = json_object_get(cfg, "verify");
    for (int k = 0; k < 2; k++) {
        json_t *mm = json_object_get(k ? verify_cfg : cfg, "method");
        if (!mm)
            continue;
        /* A stored version from before the method of verify was checked
         * (49514b2) may spell it in lower case: it runs as the method it
         * names, in the case that goes on the wire. */
        const char *mv = json_string_value(mm), *canon = NULL;
        for (int i = 0; mv && methods[i] && !canon; i++)
            if (strcmp(mv, methods[i]) == 0 || (!strict && strcasecmp(mv, methods[i]) == 0))
                canon = methods[i];
        if (canon && strcmp(mv, canon) != 0) /* frees mm and mv */
            json_object_set_new(k ? verify_cfg : cfg, "method", json_string(canon));
        if (!canon) {
            vptr(p, sizeof p, v->id, k ? "/config/verify/method" : "/config/method");
            return err_setp(e, IFL_EVALIDATION, p,
                            "method must be one of GET, POST, PUT, PATCH, DELETE, HEAD");
        }
    }
    json_t *m = json_object_get(cfg, "method");
    json_t *url = json_object_get(cfg, "url");
    if (!json_is_string(url) || !*json_string_value(url)) {
        vptr(p, sizeof p, v->id, "/config/url");
        return err_setp(e, IFL_EVALIDATION, p, "a GATEWAY needs a url (string)");
    }
    static const char *objs[] = {"headers", "query", NULL};
    for (int i = 0; objs[i]; i++) {
        json_t *o = json_object_get(cfg, objs[i]);
        if (o && !json_is_object(o)) {
            char rest[64];
            snprintf(rest, sizeof rest, "/config/%s", objs[i]);
            vptr(p, sizeof p, v->id, rest);
            return err_setp(e, IFL_EVALIDATION, p, "%s must be an object", objs[i]);
        }
    }
    /* Header names: tokens, and not the ones that frame the message (the
     * client sets those from the body it sends). */
    for (int i = 0; i < 2; i++) {
        json_t *hs = json_object_get(i ? verify_cfg : cfg, "headers");
        const char *hk;
        json_t *hv;
        json_object_foreach(hs, hk, hv)
        {
            int framing =
                strcasecmp(hk, "Content-Length") == 0 || strcasecmp(hk, "Transfer-Encoding") == 0;
            if (gw_header_name_valid(hk) && !framing)
                continue;
            struct buf b;
            buf_init(&b, 0);
            buf_puts(&b, i ? "/config/verify/headers" : "/config/headers");
            json_pointer_push(&b, hk);
            vptr(p, sizeof p, v->id, b.p);
            buf_free(&b);
            return err_setp(e, IFL_EVALIDATION, p,
                            framing ? "%s is set by the HTTP client from the body; leave it out"
                                    : "header names are HTTP tokens (letters, digits and "
                                      "!#$%%&'*+-.^_`|~)%s",
                            framing ? hk : "");
        }
    }
    int prc = strict ? gateway_literals(v, cfg, e) : 0;
    if (prc)
        return prc;
    prc = gw_policy_parse(cfg, &v->policy, e);
    if (prc) {
        char *rest = xasprintf("/config%s", e ? e->pointer : "");
        vptr(p, sizeof p, v->id, rest);
        free(rest);
        if (e)
            memcpy(e->pointer, p, sizeof e->pointer);
        return prc;
    }
    v->method = m ? json_string_value(m) : NULL;
    json_t *verify = json_object_get(cfg, "verify");
    if (verify) {
        json_t *vm = json_object_get(verify, "method");
        v->verify_method = vm ? json_string_value(vm) : "GET";
        json_t *vreq = json_object();
        static const char *vparts[] = {"url", "headers", "query", NULL};
        for (int i = 0; vparts[i]; i++) {
            json_t *x = json_object_get(verify, vparts[i]);
            if (x)
                json_object_set(vreq, vparts[i], x);
        }
        vptr(p, sizeof p, v->id, "/config/verify");
        int rc = tmpl_compile(vreq, p, &v->verify, e);
        json_decref(vreq);
        if (rc)
            return rc;
        const char *src = expr_text(json_string_value(json_object_get(verify, "doneWhen")));
        struct expr_error xe;
        if (expr_compile(src, strlen(src), &v->done_when, &xe)) {
            vptr(p, sizeof p, v->id, "/config/verify/doneWhen");
            return err_setp(e, IFL_EVALIDATION, p, "%s: %s (at position %d)", xe.code, xe.msg,
                            xe.position);
        }
    }
    /* The key must be the same on every attempt: not from the clock or
     * from randomness. */
    const char *hk;
    json_t *hv;
    json_object_foreach(json_object_get(cfg, "headers"), hk, hv)
    {
        const char *src = json_string_value(hv);
        if (strcasecmp(hk, "Idempotency-Key") != 0 || !src || *src != '=')
            continue;
        src = expr_text(src);
        struct expr *kx = NULL;
        struct expr_error xe;
        if (expr_compile(src, strlen(src), &kx, &xe) != 0)
            continue; /* tmpl_compile below reports it */
        /* `$eval` can spell any of them (`$eval('$ran' & 'dom()')`): new
         * versions refuse it too */
        static const char *const unstable[] = {"now", "millis", "random", NULL};
        static const char *const unstable_new[] = {"now", "millis", "random", "eval", NULL};
        const char *hit = expr_uses_variable(kx, strict ? unstable_new : unstable);
        expr_free(kx);
        if (hit) {
            char *rest = xasprintf("/config/headers/%s", hk);
            vptr(p, sizeof p, v->id, rest);
            free(rest);
            return err_setp(e, IFL_EVALIDATION, p,
                            "the Idempotency-Key must be the same on every attempt: $%s %s", hit,
                            strcmp(hit, "eval") == 0 ? "can call $random or $now"
                                                     : "gives another value each time");
        }
    }
    json_t *req = json_object();
    static const char *parts[] = {"url", "headers", "query", "body", NULL};
    for (int i = 0; parts[i]; i++) {
        json_t *x = json_object_get(cfg, parts[i]);
        if (x)
            json_object_set(req, parts[i], x);
    }
    vptr(p, sizeof p, v->id, "/config");
    int rc = tmpl_compile(req, p, &v->request, e);
    json_decref(req);
    return rc;
}

static int compile_transform(struct wf_vertex *v, json_t *cfg, struct ifl_err *e)
{
    char p[IFL_ERR_PTR_MAX];
    json_t *out = json_object_get(cfg, "output");
    if (!out) {
        vptr(p, sizeof p, v->id, "/config/output");
        return err_setp(e, IFL_EVALIDATION, p, "a TRANSFORM needs an output template");
    }
    vptr(p, sizeof p, v->id, "/config/output");
    int rc = tmpl_compile(out, p, &v->output, e);
    /* An output is stored and shown (spec §6: secrets never appear in step
     * outputs): secrets belong in GATEWAY requests, which keep a masked copy. */
    const char *sp = rc ? NULL : tmpl_secret_pointer(v->output);
    if (sp)
        rc = err_setp(e, IFL_EVALIDATION, sp,
                      "{{ secrets.… }} is only allowed in a GATEWAY request (url, headers, query, "
                      "body, verify): a TRANSFORM output is stored and shown");
    return rc;
}

/* only_members for a new GATEWAY's or TRANSFORM's config, with the objects
 * in it (an ENTRY_POINT's config is checked in compile_entry, always). */
static int config_members(const struct wf_vertex *v, json_t *cfg, struct ifl_err *e)
{
    static const char *const gateway[] = {
        "method",      "url",   "headers",         "query",      "body",      "timeoutMs",
        "deadlineMs",  "retry", "clientErrorMode", "onConflict", "ambiguous", "verify",
        "connections", NULL};
    static const char *const retry[] = {"maxAttempts", "initialIntervalMs", "backoffCoefficient",
                                        "maxIntervalMs", NULL};
    static const char *const verify[] = {"method",   "url",     "headers", "query",
                                         "doneWhen", "afterMs", NULL};
    static const char *const transform[] = {"output", NULL};
    char p[IFL_ERR_PTR_MAX];
    vptr(p, sizeof p, v->id, "/config");
    if (v->type == WF_TRANSFORM)
        return only_members(cfg, transform, p, "a TRANSFORM's config", e);
    if (v->type != WF_GATEWAY)
        return 0;
    int rc = only_members(cfg, gateway, p, "a GATEWAY's config", e);
    if (!rc && json_is_object(json_object_get(cfg, "retry"))) {
        vptr(p, sizeof p, v->id, "/config/retry");
        rc = only_members(json_object_get(cfg, "retry"), retry, p, "retry", e);
    }
    if (!rc && json_is_object(json_object_get(cfg, "verify"))) {
        vptr(p, sizeof p, v->id, "/config/verify");
        rc = only_members(json_object_get(cfg, "verify"), verify, p, "verify", e);
    }
    return rc;
}

static int compile_vertices(struct wf *w, json_t *vertices, int strict, struct ifl_err *e)
{
    w->v = xcalloc(json_object_size(vertices), sizeof *w->v);
    const char *id;
    json_t *vx;
    char p[IFL_ERR_PTR_MAX];
    json_object_foreach(vertices, id, vx)
    {
        struct wf_vertex *v = &w->v[w->nv++];
        v->id = xstrdup(id);
        /* a stored version from before "." and ".." were refused runs on */
        if (!wf_name_valid(id) && (strict || !wf_name_dots(id))) {
            vptr(p, sizeof p, id, NULL);
            return err_setp(e, IFL_EVALIDATION, p,
                            "vertex ids are 1-128 characters of A-Z a-z 0-9 _ - ., not . or ..");
        }
        if (!json_is_object(vx)) {
            vptr(p, sizeof p, id, NULL);
            return err_setp(e, IFL_EVALIDATION, p, "a vertex must be an object");
        }
        static const char *const members[] = {"type", "config", NULL};
        vptr(p, sizeof p, id, NULL);
        int mrc = strict ? only_members(vx, members, p, "a vertex", e) : 0;
        if (mrc)
            return mrc;
        json_t *type = json_object_get(vx, "type");
        const char *t = json_string_value(type);
        if (!t) {
            vptr(p, sizeof p, id, "/type");
            return err_setp(e, IFL_EVALIDATION, p, "a vertex needs a type");
        }
        if (strcmp(t, "ENTRY_POINT") == 0)
            v->type = WF_ENTRY_POINT;
        else if (strcmp(t, "GATEWAY") == 0)
            v->type = WF_GATEWAY;
        else if (strcmp(t, "TRANSFORM") == 0)
            v->type = WF_TRANSFORM;
        else {
            vptr(p, sizeof p, id, "/type");
            return err_setp(e, IFL_EVALIDATION, p,
                            "unknown vertex type '%s' (ENTRY_POINT, GATEWAY or TRANSFORM)", t);
        }
        json_t *cfg = json_object_get(vx, "config");
        if (cfg && !json_is_object(cfg)) {
            vptr(p, sizeof p, id, "/config");
            return err_setp(e, IFL_EVALIDATION, p, "config must be an object");
        }
        if (!cfg) {
            cfg = json_object();
            json_object_set_new(vx, "config", cfg);
        }
        v->config = cfg;
        mrc = strict ? config_members(v, cfg, e) : 0;
        if (mrc)
            return mrc;
        struct ifl_err ve = {0};
        int rc = v->type == WF_ENTRY_POINT ? compile_entry(v, cfg, &ve)
                 : v->type == WF_GATEWAY   ? compile_gateway(v, cfg, strict, &ve)
                                           : compile_transform(v, cfg, &ve);
        if (rc && !strict && v->type != WF_ENTRY_POINT) {
            /* A stored version that an earlier engine accepted and this one
             * no longer compiles: its executions must not be stranded.  The
             * vertex stays, marked, and its steps fail (workflow_invalid,
             * a dead letter) instead of every load of the version failing
             * and its claimed steps waiting for leases forever. */
            v->broken = xasprintf("%s%s%s", ve.pointer, ve.pointer[0] ? ": " : "", ve.msg);
            continue;
        }
        if (rc) {
            if (e)
                *e = ve;
            return rc;
        }
    }
    return 0;
}

static void push_idx(size_t **arr, size_t *n, size_t v)
{
    *arr = xrealloc(*arr, (*n + 1) * sizeof **arr);
    (*arr)[(*n)++] = v;
}

static int compile_edges(struct wf *w, json_t *edges, int strict, struct ifl_err *e)
{
    w->e = xcalloc(json_array_size(edges) + 1, sizeof *w->e);
    size_t i;
    json_t *ed;
    char p[IFL_ERR_PTR_MAX];
    json_array_foreach(edges, i, ed)
    {
        if (!json_is_object(ed)) {
            snprintf(p, sizeof p, "/edges/%zu", i);
            return err_setp(e, IFL_EVALIDATION, p, "an edge must be an object");
        }
        static const char *const members[] = {"from", "to", "condition", NULL};
        snprintf(p, sizeof p, "/edges/%zu", i);
        int mrc = strict ? only_members(ed, members, p, "an edge", e) : 0;
        if (mrc)
            return mrc;
        const char *ends[2] = {"from", "to"};
        long idx[2];
        for (int k = 0; k < 2; k++) {
            const char *name = json_string_value(json_object_get(ed, ends[k]));
            snprintf(p, sizeof p, "/edges/%zu/%s", i, ends[k]);
            if (!name)
                return err_setp(e, IFL_EVALIDATION, p, "an edge needs '%s' (a vertex id)", ends[k]);
            idx[k] = wf_vertex_index(w, name);
            if (idx[k] < 0)
                return err_setp(e, IFL_EVALIDATION, p, "no vertex named '%s'", name);
        }
        snprintf(p, sizeof p, "/edges/%zu/to", i);
        if (w->v[idx[1]].type == WF_ENTRY_POINT)
            return err_setp(e, IFL_EVALIDATION, p, "an edge cannot lead into an ENTRY_POINT");
        if (idx[0] == idx[1])
            return err_setp(e, IFL_EVALIDATION, p, "an edge cannot loop to its own vertex");
        for (size_t k = 0; k < w->ne; k++)
            if (w->e[k].from == (size_t)idx[0] && w->e[k].to == (size_t)idx[1])
                return err_setp(e, IFL_EVALIDATION, p, "duplicate edge %s -> %s", w->v[idx[0]].id,
                                w->v[idx[1]].id);
        struct wf_edge *edge = &w->e[w->ne++];
        edge->from = (size_t)idx[0];
        edge->to = (size_t)idx[1];
        json_t *cond = json_object_get(ed, "condition");
        if (cond && !json_is_null(cond)) {
            snprintf(p, sizeof p, "/edges/%zu/condition", i);
            const char *src = json_string_value(cond);
            if (!src)
                return err_setp(e, IFL_EVALIDATION, p,
                                "a condition must be an expression string (\"= …\")");
            if (strict && *src != '=')
                return err_setp(e, IFL_EVALIDATION, p,
                                "a condition is an expression: start it with = (\"= %.40s\"); a "
                                "literal would be a string, and any non-empty string is true",
                                src);
            src = expr_text(src);
            struct expr_error xe;
            if (expr_compile(src, strlen(src), &edge->cond, &xe))
                return err_setp(e, IFL_EVALIDATION, p, "%s: %s (at position %d)", xe.code, xe.msg,
                                xe.position);
        }
        push_idx(&w->v[edge->from].out, &w->v[edge->from].n_out, w->ne - 1);
        push_idx(&w->v[edge->to].in, &w->v[edge->to].n_in, w->ne - 1);
    }
    return 0;
}

/* Kahn's algorithm; on a cycle, points at an edge whose ends both remain. */
static int toposort(struct wf *w, struct ifl_err *e)
{
    size_t *indeg = xcalloc(w->nv, sizeof *indeg);
    w->topo = xcalloc(w->nv, sizeof *w->topo);
    for (size_t i = 0; i < w->ne; i++)
        indeg[w->e[i].to]++;
    size_t head = 0, tail = 0;
    for (size_t i = 0; i < w->nv; i++)
        if (!indeg[i])
            w->topo[tail++] = i;
    while (head < tail) {
        struct wf_vertex *v = &w->v[w->topo[head++]];
        for (size_t k = 0; k < v->n_out; k++)
            if (--indeg[w->e[v->out[k]].to] == 0)
                w->topo[tail++] = w->e[v->out[k]].to;
    }
    int rc = 0;
    if (tail < w->nv) {
        for (size_t i = 0; i < w->ne; i++)
            if (indeg[w->e[i].from] && indeg[w->e[i].to]) {
                char p[64];
                snprintf(p, sizeof p, "/edges/%zu", i);
                rc = err_setp(e, IFL_EVALIDATION, p,
                              "the graph has a cycle through %s -> %s; workflows must be DAGs",
                              w->v[w->e[i].from].id, w->v[w->e[i].to].id);
                break;
            }
    }
    free(indeg);
    return rc;
}

/* Each vertex's ancestors, sources first so that a vertex's parents are
 * complete when it is reached. */
static void ancestors(struct wf *w)
{
    size_t words = (w->nv + 63) / 64;
    w->anc_words = words;
    w->anc = xcalloc(w->nv * words + 1, sizeof *w->anc);
    for (size_t t = 0; t < w->nv; t++) {
        size_t v = w->topo[t];
        uint64_t *dst = w->anc + v * words;
        for (size_t k = 0; k < w->v[v].n_in; k++) {
            size_t from = w->e[w->v[v].in[k]].from;
            const uint64_t *src = w->anc + from * words;
            for (size_t x = 0; x < words; x++)
                dst[x] |= src[x];
            dst[from / 64] |= (uint64_t)1 << (from % 64);
        }
    }
}

int wf_is_ancestor(const struct wf *w, size_t a, size_t v)
{
    return a < w->nv && v < w->nv && (w->anc[v * w->anc_words + a / 64] >> (a % 64) & 1);
}

/* Every vertex is reached from an ENTRY_POINT: one that is not would stay
 * PENDING in every execution, which would still end `completed` (spec §3's
 * join rule dispatches nothing without an incoming edge). */
static int check_reachable(const struct wf *w, struct ifl_err *e)
{
    char *seen = xcalloc(w->nv ? w->nv : 1, 1);
    for (size_t t = 0; t < w->nv; t++) { /* topological order: sources first */
        size_t i = w->topo[t];
        const struct wf_vertex *v = &w->v[i];
        if (v->type == WF_ENTRY_POINT)
            seen[i] = 1;
        for (size_t k = 0; seen[i] && k < v->n_out; k++)
            seen[w->e[v->out[k]].to] = 1;
    }
    int rc = 0;
    for (size_t t = 0; t < w->nv && !rc; t++) { /* a source first: the one to wire up */
        size_t i = w->topo[t];
        if (seen[i])
            continue;
        char p[IFL_ERR_PTR_MAX];
        vptr(p, sizeof p, w->v[i].id, "");
        rc = err_setp(e, IFL_EVALIDATION, p,
                      "no ENTRY_POINT leads to vertex '%s': it would never run (give it an "
                      "incoming edge, or leave it out)",
                      w->v[i].id);
    }
    free(seen);
    return rc;
}

static int compile(json_t *def, int strict, struct wf **out, struct ifl_err *e)
{
    *out = NULL;
    if (!json_is_object(def))
        return err_setp(e, IFL_EVALIDATION, "", "a workflow definition must be a JSON object");
    static const char *const members[] = {"vertices", "edges", NULL};
    int mrc = strict ? only_members(def, members, "", "a workflow definition", e) : 0;
    if (mrc)
        return mrc;
    if (strict) {
        struct buf p;
        buf_init(&p, 0);
        buf_puts(&p, "");
        if (find_string(def, &p, has_nul))
            mrc = err_setp(e, IFL_EVALIDATION, p.p,
                           "a string of a definition cannot hold a NUL (\\u0000): it would be "
                           "read cut short");
        buf_free(&p);
        if (mrc)
            return mrc;
    }
    json_t *vertices = json_object_get(def, "vertices");
    if (!json_is_object(vertices) || json_object_size(vertices) == 0)
        return err_setp(e, IFL_EVALIDATION, "/vertices",
                        "vertices must be a non-empty object keyed by vertex id");
    /* The limits bind new versions; a stored one an engine without them
     * accepted (before 1bb5a1b) still runs. */
    if (strict && json_object_size(vertices) > WF_MAX_VERTICES)
        return err_setp(e, IFL_EVALIDATION, "/vertices", "a workflow has at most %d vertices",
                        WF_MAX_VERTICES);
    json_t *edges = json_object_get(def, "edges");
    if (edges && !json_is_array(edges))
        return err_setp(e, IFL_EVALIDATION, "/edges", "edges must be an array");
    if (strict && json_array_size(edges) > WF_MAX_EDGES)
        return err_setp(e, IFL_EVALIDATION, "/edges", "a workflow has at most %d edges",
                        WF_MAX_EDGES);
    struct wf *w = xcalloc(1, sizeof *w);
    atomic_init(&w->refs, 1);
    w->def = json_deep_copy(def);
    vertices = json_object_get(w->def, "vertices");
    edges = json_object_get(w->def, "edges");
    int rc = compile_vertices(w, vertices, strict, e);
    if (!rc && edges)
        rc = compile_edges(w, edges, strict, e);
    if (!rc) {
        int entries = 0;
        for (size_t i = 0; i < w->nv; i++)
            entries += w->v[i].type == WF_ENTRY_POINT;
        if (!entries)
            rc = err_setp(e, IFL_EVALIDATION, "/vertices",
                          "a workflow needs at least one ENTRY_POINT vertex");
    }
    if (!rc)
        rc = toposort(w, e);
    if (!rc)
        ancestors(w);
    if (!rc && strict)
        rc = check_reachable(w, e);
    if (rc) {
        wf_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int wf_compile(json_t *def, struct wf **out, struct ifl_err *e)
{
    return compile(def, 1, out, e);
}

int wf_compile_stored(json_t *def, struct wf **out, struct ifl_err *e)
{
    return compile(def, 0, out, e);
}
