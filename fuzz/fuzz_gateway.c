/*
 * fuzz_gateway — both sides of a GATEWAY call that take outside data:
 *
 *   the request: a rendered {method?, url, headers, query, body} template
 *     (as tmpl_eval leaves it; the payload chooses its strings), with "@S"
 *     in a string standing for a secret's sentinel, built and unsealed.
 *     Whatever is accepted must be safe on the wire: a token method, a url
 *     without spaces or control characters, header values without CR, LF
 *     or NUL — also after the secret (which holds a CR LF) is substituted,
 *     which must then be refused.  The masked twin never shows the secret.
 *   the response: a status line, header lines and a body, as a provider
 *     sends them: decoded by its Content-Encoding (gzip, deflate),
 *     scrubbed of the secrets the request carried, classified,
 *     Retry-After read, turned into the step's output — which must not
 *     show a secret either.
 *
 * Input: REQUEST_JSON NUL STATUS LF (NAME ": " VALUE LF)* LF BODY
 */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "gateway/gateway.h"
#include "json/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const secrets[] = {"sk_fuzz/+\"x y&z", "sk_crlf\r\nX-Evil: 1"};

static int resolve(void *ctx, const char *name, char **value)
{
    (void)ctx;
    *value = xstrdup(strcmp(name, "CRLF") == 0 ? secrets[1] : secrets[0]);
    return 0;
}

/* Every "@S" in the strings of v becomes the sentinel of secret K, "@C" of
 * secret CRLF. */
static void seal(json_t *v)
{
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (!strstr(s, "@S") && !strstr(s, "@C"))
            return;
        struct buf b;
        buf_init(&b, 0);
        for (const char *p = s; *p; p++) {
            if (p[0] == '@' && (p[1] == 'S' || p[1] == 'C')) {
                char *sen = gw_secret_sentinel(p[1] == 'S' ? "K" : "CRLF");
                buf_puts(&b, sen);
                free(sen);
                p++;
            } else {
                buf_append(&b, p, 1);
            }
        }
        json_string_set(v, b.p ? b.p : "");
        buf_free(&b);
        return;
    }
    const char *k;
    json_t *x;
    size_t i;
    if (json_is_object(v))
        json_object_foreach(v, k, x) seal(x);
    else if (json_is_array(v))
        json_array_foreach(v, i, x) seal(x);
}

static int wire_safe(const char *s, int tab_ok)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c < 0x20 && !(tab_ok && c == '\t')) || c == 0x7f)
            return 0;
    }
    return 1;
}

static void check_request(const struct gw_request *r)
{
    if (!gw_header_name_valid(r->method) || !wire_safe(r->url, 0) || strchr(r->url, ' '))
        abort();
    for (size_t i = 0; i < r->nheaders; i++)
        if (!gw_header_name_valid(r->headers[i].name) || !wire_safe(r->headers[i].value, 1))
            abort();
}

static int planted;

/* text (JSON) shows none of the secrets req sent: raw, or escaped as JSON
 * text spells it. */
static void no_secret(const char *text, const struct gw_request *req)
{
    for (size_t i = 0; !planted && text && req && i < req->nsecrets; i++) {
        json_t *js = json_string(req->secrets[i]);
        char *esc = json_dumps(js, JSON_ENCODE_ANY);
        json_decref(js);
        esc[strlen(esc) - 1] = '\0';
        if (strstr(text, req->secrets[i]) || strstr(text, esc + 1))
            abort();
        free(esc);
    }
}

static void response(const char *in, size_t n, const struct gw_request *req)
{
    char *copy = xstrndup(in, n); /* NUL-terminated for strtol */
    const char *p = copy;
    struct gw_response r = {0};
    r.transport = GW_T_OK;
    r.status = strtol(p, NULL, 10);
    r.headers = json_object();
    const char *end = p + n, *line = memchr(p, '\n', n);
    p = line ? line + 1 : end;
    while (p < end && *p != '\n') {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (colon && colon > p && (size_t)(colon - p) < 64) {
            char name[64];
            size_t nl = (size_t)(colon - p);
            for (size_t i = 0; i < nl; i++)
                name[i] = (char)(p[i] >= 'A' && p[i] <= 'Z' ? p[i] + 32 : p[i]);
            name[nl] = '\0';
            const char *v = colon + 1;
            while (v < eol && *v == ' ')
                v++;
            json_object_set_new(r.headers, name, json_stringn_nocheck(v, (size_t)(eol - v)));
        }
        p = eol < end ? eol + 1 : end;
    }
    if (p < end && *p == '\n')
        p++;
    r.body_len = (size_t)(end - p);
    r.body = xstrndup(p, r.body_len);
    gw_response_decode(&r); /* a Content-Encoding header: gzip, deflate, others */
    if ((r.body == NULL) != (r.body_too_large || r.body_undecodable))
        abort();
    gw_response_scrub(&r, req);
    int64_t ra = 0;
    enum gw_class c = gw_classify(&r, 1700000000000, &ra);
    if (!gw_class_name(c) || ra < 0)
        abort();
    json_t *out = gw_output(&r);
    gw_output_scrub(out, req);
    char *text = out ? json_dumps(out, JSON_ENCODE_ANY) : NULL;
    no_secret(text, req);
    free(text);
    json_decref(out);
    gw_response_clear(&r);
    free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t rlen = nul ? (size_t)(nul - data) : size;
    /* a request that spells a secret itself (in any JSON escaping) carries
     * data, not a leak; a response may: echoes are what the scrub is for */
    planted = 0;
    json_t *rendered = NULL;
    struct gw_request req = {0}, *built = NULL;
    if (json_parse((const char *)data, rlen, NULL, &rendered, NULL) == 0 &&
        json_is_object(rendered)) {
        char *plain = json_dumps(rendered, JSON_ENCODE_ANY);
        planted = plain && strstr(plain, "sk_") != NULL;
        free(plain);
        seal(rendered);
        const char *method = json_string_value(json_object_get(rendered, "method"));
        if (gw_request_build(method, rendered, &req, NULL) == 0) {
            check_request(&req);
            if (gw_request_unseal(&req, resolve, NULL, NULL) == 0) {
                check_request(&req);
                built = &req;
            }
            json_t *m = gw_request_masked(&req);
            char *mt = json_dumps(m, JSON_ENCODE_ANY);
            no_secret(mt, &req);
            free(mt);
            json_decref(m);
            char *mu = gw_request_masked_url(&req);
            no_secret(mu, &req);
            free(mu);
        }
    }
    json_decref(rendered);
    if (nul)
        response((const char *)nul + 1, size - rlen - 1, built);
    gw_request_clear(&req);
    return 0;
}
