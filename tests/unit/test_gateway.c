/*
 * test_gateway — the GATEWAY rules: the spec's outcome table, Retry-After
 * in both forms, full-jitter backoff bounds, policy defaults, secret
 * masking in rendered requests, the egress policy, and (over loopback) a
 * request whose lease ran out never leaving.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include "base/clock.h"
#include "base/mem.h"
#include "gateway/gateway.h"
#include "json/json.h"

static json_t *parse(const char *s)
{
    json_t *v = NULL;
    assert_int_equal(json_parse(s, strlen(s), NULL, &v, NULL), 0);
    return v;
}

static enum gw_class cls(enum gw_transport t, long status, const char *retry_after, int64_t *ra)
{
    struct gw_response r = {.transport = t, .status = status, .headers = json_object()};
    if (retry_after)
        json_object_set_new(r.headers, "retry-after", json_string(retry_after));
    enum gw_class c = gw_classify(&r, 1700000000000LL, ra);
    json_decref(r.headers);
    return c;
}

static void test_outcome_table(void **state)
{
    int64_t ra;
    for (long s = 200; s < 400; s += 37)
        assert_int_equal(cls(GW_T_OK, s, NULL, &ra), GW_SUCCESS);
    assert_int_equal(cls(GW_T_NOT_SENT, 0, NULL, &ra), GW_RETRY);
    assert_int_equal(cls(GW_T_AMBIGUOUS, 0, NULL, &ra), GW_AMBIGUOUS);
    assert_int_equal(cls(GW_T_OK, 408, NULL, &ra), GW_RETRY);
    assert_int_equal(cls(GW_T_OK, 429, NULL, &ra), GW_RETRY);
    assert_int_equal(cls(GW_T_OK, 503, NULL, &ra), GW_RETRY);
    assert_int_equal(cls(GW_T_OK, 500, NULL, &ra), GW_AMBIGUOUS);
    assert_int_equal(cls(GW_T_OK, 502, NULL, &ra), GW_AMBIGUOUS);
    assert_int_equal(cls(GW_T_OK, 504, NULL, &ra), GW_AMBIGUOUS);
    assert_int_equal(cls(GW_T_OK, 409, NULL, &ra), GW_CONFLICT);
    assert_int_equal(cls(GW_T_OK, 404, NULL, &ra), GW_CLIENT_ERROR);
    assert_int_equal(cls(GW_T_OK, 422, NULL, &ra), GW_CLIENT_ERROR);
}

static void test_retry_after_forms(void **state)
{
    int64_t ra = -1;
    assert_int_equal(cls(GW_T_OK, 429, "3", &ra), GW_RETRY);
    assert_int_equal(ra, 3000);
    /* 1700000000 = Tue, 14 Nov 2023 22:13:20 GMT; ten seconds later: */
    assert_int_equal(cls(GW_T_OK, 503, "Tue, 14 Nov 2023 22:13:30 GMT", &ra), GW_RETRY);
    assert_int_equal(ra, 10000);
    assert_int_equal(cls(GW_T_OK, 503, "Tuesday, 14-Nov-23 22:13:30 GMT", &ra), GW_RETRY);
    assert_int_equal(ra, 10000);
    assert_int_equal(cls(GW_T_OK, 503, "Tue Nov 14 22:13:30 2023", &ra), GW_RETRY);
    assert_int_equal(ra, 10000);
    assert_int_equal(cls(GW_T_OK, 503, "Mon, 13 Nov 2023 00:00:00 GMT", &ra), GW_RETRY);
    assert_int_equal(ra, 0); /* a date in the past: no wait */
    assert_int_equal(cls(GW_T_OK, 429, "soon", &ra), GW_RETRY);
    assert_int_equal(ra, 0);
    assert_int_equal(cls(GW_T_OK, 429, "12abc", &ra), GW_RETRY);
    assert_int_equal(ra, 0);
    assert_int_equal(cls(GW_T_OK, 429, "7 ", &ra), GW_RETRY);
    assert_int_equal(ra, 7000);
    /* a year or more, or past any integer: capped at a year, which is past
     * every deadlineMs (30 days at most), never ignored */
    const int64_t year = 86400000LL * 365;
    assert_int_equal(cls(GW_T_OK, 429, "31536000", &ra), GW_RETRY);
    assert_int_equal(ra, year);
    assert_int_equal(cls(GW_T_OK, 503, "99999999999999999999999999", &ra), GW_RETRY);
    assert_int_equal(ra, year);
    assert_int_equal(cls(GW_T_OK, 503, "Fri, 14 Nov 2223 22:13:30 GMT", &ra), GW_RETRY);
    assert_int_equal(ra, year);
}

static void test_backoff_full_jitter(void **state)
{
    struct gw_policy p;
    json_t *cfg = parse("{\"url\":\"http://x\",\"retry\":{\"initialIntervalMs\":100,"
                        "\"backoffCoefficient\":2,\"maxIntervalMs\":1000}}");
    assert_int_equal(gw_policy_parse(cfg, &p, NULL), 0);
    json_decref(cfg);
    assert_int_equal(gw_backoff_ms(&p, 1, 0, 0.0), 0);
    assert_int_equal(gw_backoff_ms(&p, 1, 0, 0.999), 99);
    assert_int_equal(gw_backoff_ms(&p, 3, 0, 0.5), 200);     /* cap 400 */
    assert_int_equal(gw_backoff_ms(&p, 10, 0, 0.5), 500);    /* capped at maxInterval */
    assert_int_equal(gw_backoff_ms(&p, 1, 5000, 0.5), 5000); /* never below Retry-After */
    for (int n = 1; n < 20; n++) {
        int64_t w = gw_backoff_ms(&p, n, 0, (double)rand() / ((double)RAND_MAX + 1));
        assert_true(w >= 0 && w <= 1000);
    }
    /* the growth overflowing to infinity stays capped, also from 0 */
    p.backoff_coefficient = 100;
    assert_int_equal(gw_backoff_ms(&p, 1000, 0, 0.5), 500);
    p.initial_interval_ms = 0;
    assert_int_equal(gw_backoff_ms(&p, 1000, 0, 0.5), 0);
    assert_int_equal(gw_backoff_ms(&p, 1000, 70, 0.5), 70);
}

static void test_policy_defaults(void **state)
{
    struct gw_policy p;
    json_t *with_key = parse("{\"url\":\"http://x\",\"headers\":{\"idempotency-key\":\"= 'k'\"}}");
    assert_int_equal(gw_policy_parse(with_key, &p, NULL), 0);
    assert_int_equal(p.timeout_ms, 10000);
    assert_int_equal(p.max_attempts, 5);
    assert_int_equal(p.deadline_ms, 300000);
    assert_int_equal(p.ambiguous, GW_AMB_RETRY);
    assert_int_equal(p.on_conflict, GW_CONFLICT_COMPLETE);
    assert_false(p.client_error_complete);
    json_decref(with_key);
    json_t *no_key = parse("{\"url\":\"http://x\"}");
    assert_int_equal(gw_policy_parse(no_key, &p, NULL), 0);
    assert_int_equal(p.ambiguous, GW_AMB_RECONCILE);
    assert_int_equal(p.on_conflict, GW_CONFLICT_FAIL);
    json_decref(no_key);
    json_t *later = parse("{\"url\":\"http://x\",\"onConflict\":\"retry\","
                          "\"headers\":{\"Idempotency-Key\":\"k\"}}");
    assert_int_equal(gw_policy_parse(later, &p, NULL), 0);
    assert_int_equal(p.on_conflict, GW_CONFLICT_RETRY);
    json_decref(later);
    struct ifl_err ke = {0};
    later = parse("{\"url\":\"http://x\",\"onConflict\":\"retry\"}"); /* no key */
    assert_int_equal(gw_policy_parse(later, &p, &ke), IFL_EVALIDATION);
    assert_string_equal(ke.pointer, "/onConflict");
    json_decref(later);
    struct ifl_err e = {0};
    json_t *bad = parse("{\"url\":\"http://x\",\"ambiguous\":\"verify\"}");
    assert_int_equal(gw_policy_parse(bad, &p, &e), IFL_EVALIDATION);
    assert_string_equal(e.pointer, "/ambiguous");
    json_decref(bad);
    bad = parse("{\"url\":\"http://x\",\"retry\":{\"maxAttempts\":0}}");
    assert_int_equal(gw_policy_parse(bad, &p, &e), IFL_EVALIDATION);
    assert_string_equal(e.pointer, "/retry/maxAttempts");
    json_decref(bad);
    /* verify.afterMs: the step's timeoutMs unless given */
    json_t *v = parse("{\"url\":\"http://x\",\"timeoutMs\":2500,\"ambiguous\":\"verify\","
                      "\"verify\":{\"url\":\"http://x\",\"doneWhen\":\"= true\"}}");
    assert_int_equal(gw_policy_parse(v, &p, NULL), 0);
    assert_int_equal(p.verify_after_ms, 2500);
    json_object_set_new(json_object_get(v, "verify"), "afterMs", json_integer(0));
    assert_int_equal(gw_policy_parse(v, &p, NULL), 0);
    assert_int_equal(p.verify_after_ms, 0);
    json_object_set_new(json_object_get(v, "verify"), "afterMs", json_integer(-5));
    assert_int_equal(gw_policy_parse(v, &p, &e), IFL_EVALIDATION);
    assert_string_equal(e.pointer, "/verify/afterMs");
    json_decref(v);
}

static int resolver(void *ctx, const char *name, char **value)
{
    if (strcmp(name, "ODD") == 0) {
        *value = strdup("a\"b\\c &d/e");
        return 0;
    }
    if (strcmp(name, "KEY") != 0)
        return IFL_ENOTFOUND;
    *value = strdup("sk_live_SECRET");
    return 0;
}

/* A secret in a query member and in the body is found after the query's
 * percent-encoding and the body's JSON serialisation, and its value is
 * written encoded for the place; a payload value that looks like a
 * sentinel (the old fixed form, or the new form with a guessed nonce) is
 * sent as it is. */
static void test_secrets_in_query_and_body(void **state)
{
    char *odd = gw_secret_sentinel("ODD"), *key = gw_secret_sentinel("KEY");
    char *tagged = malloc(strlen(key) + 16);
    strcpy(tagged, "tok-");
    strcat(tagged, key);
    json_t *rendered = json_pack("{s:s, s:{s:s, s:s}, s:{s:s, s:s, s:s, s:s}}", "url",
                                 "http://127.0.0.1:9/c", "query", "q", odd, "k", tagged, "body",
                                 "odd", odd, "key", tagged, "forged", "\x01idemflow-secret:KEY\x02",
                                 "guessed", "~ifs00000000000000000000000000000000~KEY~");
    struct gw_request r;
    assert_int_equal(gw_request_build(NULL, rendered, &r, NULL), 0);
    assert_int_equal(gw_request_unseal(&r, resolver, NULL, NULL), 0);
    assert_string_equal(r.url, "http://127.0.0.1:9/c?q=a%22b%5Cc%20%26d%2Fe&k=tok-sk_live_SECRET");
    json_t *body = NULL;
    assert_int_equal(json_parse(r.body, strlen(r.body), NULL, &body, NULL), 0);
    assert_string_equal(json_string_value(json_object_get(body, "odd")), "a\"b\\c &d/e");
    assert_string_equal(json_string_value(json_object_get(body, "key")), "tok-sk_live_SECRET");
    assert_string_equal(json_string_value(json_object_get(body, "forged")),
                        "\x01idemflow-secret:KEY\x02");
    assert_string_equal(json_string_value(json_object_get(body, "guessed")),
                        "~ifs00000000000000000000000000000000~KEY~");
    json_decref(body);
    assert_int_equal(r.nsecrets,
                     3); /* both remembered for scrubbing echoes (and KEY in lower case) */
    json_t *mj = gw_request_masked(&r);
    char *masked = json_to_string(mj), *murl = gw_request_masked_url(&r);
    assert_null(strstr(masked, "sk_live"));
    char *nonce = strndup(key, strlen(key) - strlen("KEY~")); /* never shown */
    assert_null(strstr(masked, nonce));
    free(nonce);
    assert_non_null(strstr(masked, "\"odd\":\"****\""));
    assert_non_null(strstr(masked, "\"key\":\"tok-****\""));
    assert_string_equal(murl, "http://127.0.0.1:9/c?q=****&k=tok-****");
    free(masked);
    free(murl);
    json_decref(mj);
    gw_request_clear(&r);
    json_decref(rendered);
    free(odd);
    free(key);
    free(tagged);
}

/* A url's userinfo goes out as Basic base64(user:password): that form is
 * scrubbed when the userinfo held a secret, and only then (fuzz_gateway:
 * a clear userinfo's base64 in a header counted as a leaked secret). */
static void test_userinfo_is_a_secret_only_when_it_holds_one(void **state)
{
    (void)state;
    char *s = gw_secret_sentinel("KEY");
    for (int in_userinfo = 0; in_userinfo < 2; in_userinfo++) {
        char url[512];
        if (in_userinfo)
            snprintf(url, sizeof url, "http://user:%s@127.0.0.1:9/c", s);
        else
            snprintf(url, sizeof url, "http://user@127.0.0.1:9/c?t=%s", s);
        json_t *rendered = json_pack("{s:s}", "url", url);
        struct gw_request r;
        assert_int_equal(gw_request_build("GET", rendered, &r, NULL), 0);
        assert_int_equal(gw_request_unseal(&r, resolver, NULL, NULL), 0);
        int basic = 0;
        const char *b64 = in_userinfo ? "dXNlcjpza19saXZlX1NFQ1JFVA==" /* user:sk_live_SECRET */
                                      : "dXNlcjo=";                    /* user: */
        for (size_t i = 0; i < r.nsecrets; i++)
            basic |= strcmp(r.secrets[i], b64) == 0;
        assert_int_equal(basic, in_userinfo);
        gw_request_clear(&r);
        json_decref(rendered);
    }
    free(s);
}

static void test_secrets_are_masked(void **state)
{
    char *s = gw_secret_sentinel("KEY");
    json_t *rendered = json_object();
    char *url = malloc(strlen(s) + 64);
    strcpy(url, "http://127.0.0.1:9/v1/charges?token=");
    strcat(url, s);
    json_object_set_new(rendered, "url", json_string(url));
    json_t *h = json_object();
    char *auth = malloc(strlen(s) + 16);
    strcpy(auth, "Bearer ");
    strcat(auth, s);
    json_object_set_new(h, "Authorization", json_string(auth));
    json_object_set_new(h, "Idempotency-Key", json_string("charge-42"));
    json_object_set_new(rendered, "headers", h);
    json_object_set_new(rendered, "query", json_pack("{s:s}", "a b", "c&d"));
    json_object_set_new(rendered, "body", json_pack("{s:i}", "amount", 5));
    struct gw_request r;
    assert_int_equal(gw_request_build(NULL, rendered, &r, NULL), 0);
    assert_string_equal(r.method, "POST");
    assert_string_equal(r.idempotency_key, "charge-42");
    json_t *mj = gw_request_masked(&r);
    char *masked = json_to_string(mj), *murl = gw_request_masked_url(&r);
    assert_null(strstr(masked, "sk_live"));
    assert_non_null(strstr(masked, "Bearer ****"));
    assert_non_null(strstr(murl, "token=****&a%20b=c%26d"));
    assert_int_equal(gw_request_unseal(&r, resolver, NULL, NULL), 0);
    /* unsealed, the masked twin is the same: no secret, the same masks */
    json_t *mj2 = gw_request_masked(&r);
    char *masked2 = json_to_string(mj2), *murl2 = gw_request_masked_url(&r);
    assert_string_equal(masked2, masked);
    assert_string_equal(murl2, murl);
    assert_null(strstr(masked2, "sk_live"));
    free(masked);
    free(masked2);
    free(murl);
    free(murl2);
    json_decref(mj);
    json_decref(mj2);
    assert_non_null(strstr(r.url, "token=sk_live_SECRET"));
    int found = 0;
    for (size_t i = 0; i < r.nheaders; i++)
        found |= strcmp(r.headers[i].value, "Bearer sk_live_SECRET") == 0;
    assert_true(found);
    /* the value is remembered once, though sent twice (with its lower
     * case form, as an echoed header name would come back) */
    assert_int_equal(r.nsecrets, 2);
    assert_string_equal(r.secrets[0], "sk_live_SECRET");
    assert_string_equal(r.secrets[1], "sk_live_secret");

    /* a provider echoing it: scrubbed from the body, header values and the
     * transport error text, the rest untouched */
    struct gw_response resp = {.transport = GW_T_OK, .status = 200};
    const char echo[] =
        "{\"auth\":\"Bearer sk_live_SECRET\",\"again\":\"sk_live_SECRETsk_live_SECRET\"}";
    resp.body = strdup(echo);
    resp.body_len = strlen(echo);
    resp.headers = json_pack("{s:s,s:s}", "x-echo", "token=sk_live_SECRET;", "x-other", "plain");
    snprintf(resp.error, sizeof resp.error, "upstream said sk_live_SECRET");
    gw_response_scrub(&resp, &r);
    assert_string_equal(resp.body, "{\"auth\":\"Bearer ****\",\"again\":\"********\"}");
    assert_int_equal(resp.body_len, strlen(resp.body));
    assert_string_equal(json_string_value(json_object_get(resp.headers, "x-echo")), "token=****;");
    assert_string_equal(json_string_value(json_object_get(resp.headers, "x-other")), "plain");
    assert_string_equal(resp.error, "upstream said ****");
    gw_response_clear(&resp);

    /* two secrets that share bytes, echoed as one run: masking one first
     * left the other's tail ("ghij") before the spans were merged */
    char *two[] = {"abcdef12", "ef12ghij", NULL};
    gw_request_scrub_also(&r, two, 3);
    const char run[] = "{\"x\":\"[abcdef12ghij] [ef12ghijk]\"}";
    resp = (struct gw_response){.transport = GW_T_OK, .status = 200};
    resp.body = strdup(run);
    resp.body_len = strlen(run);
    resp.headers = json_pack("{s:s}", "x-echo", "abcdef12ghij");
    snprintf(resp.error, sizeof resp.error, "said %s", "abcdef12ghij");
    gw_response_scrub(&resp, &r);
    assert_string_equal(resp.body, "{\"x\":\"[****] [****k]\"}");
    assert_string_equal(json_string_value(json_object_get(resp.headers, "x-echo")), "****");
    assert_string_equal(resp.error, "said ****");
    gw_response_clear(&resp);
    gw_request_clear(&r);
    json_decref(rendered);
    free(url);
    free(auth);
    free(s);
}

static int denied(const char *addr)
{
    struct sockaddr_storage ss = {0};
    char shown[64] = "";
    if (strchr(addr, ':')) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        assert_int_equal(inet_pton(AF_INET6, addr, &a->sin6_addr), 1);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        assert_int_equal(inet_pton(AF_INET, addr, &a->sin_addr), 1);
    }
    int d = gw_egress_denied((struct sockaddr *)&ss, shown, sizeof shown);
    if (d)
        assert_true(shown[0] != '\0');
    return d;
}

static void test_egress_policy(void **state)
{
    (void)state;
    /* the default: link-local only (cloud metadata), loopback allowed */
    assert_true(denied("169.254.169.254"));
    assert_true(denied("fe80::1"));
    assert_true(denied("::ffff:169.254.169.254")); /* IPv4-mapped */
    assert_false(denied("127.0.0.1"));
    assert_false(denied("10.1.2.3"));
    assert_false(denied("169.253.255.255"));
    assert_false(denied("169.255.0.0"));
    struct ifl_err e = {0};
    assert_int_equal(gw_egress_set("private, 192.0.2.128/25,2001:db8::/33", &e), 0);
    assert_true(denied("10.1.2.3"));
    assert_true(denied("172.31.255.255"));
    assert_false(denied("172.32.0.0"));
    assert_true(denied("100.127.0.1"));
    assert_false(denied("100.128.0.1"));
    assert_true(denied("fd00::1"));
    assert_true(denied("192.0.2.200"));
    assert_false(denied("192.0.2.127"));
    assert_true(denied("2001:db8:7fff::1"));
    assert_false(denied("2001:db8:8000::1"));
    assert_false(denied("169.254.169.254")); /* replaced, not added to */
    assert_int_equal(gw_egress_set("none", &e), 0);
    assert_false(denied("169.254.169.254"));
    assert_int_equal(gw_egress_set("loopback,link-local", &e), 0);
    assert_true(denied("127.8.9.10") && denied("::1") && denied("169.254.0.1"));
    /* found by a judge: 0.0.0.0 and :: reach this host too */
    assert_true(denied("0.0.0.0") && denied("0.1.2.3") && denied("::") && denied("::ffff:0.0.0.0"));
    assert_false(denied("1.0.0.0") || denied("::2"));
    for (const char *bad[] = {"lan", "10.0.0.0/33", "::/129", "1.2.3/8", "10.0.0.0/", ""},
                    **b = bad;
         b < bad + 6; b++)
        assert_int_equal(gw_egress_set(*b, &e), IFL_EINVAL);
    assert_int_equal(gw_egress_set(" , ", &e), IFL_EINVAL); /* empty: say none */
    assert_true(denied("127.0.0.1")); /* what failed to parse changed nothing */
}

/* n bytes of in compressed as gzip (wbits 31), zlib (15) or raw deflate (-15). */
static size_t squeeze(const char *in, size_t n, int wbits, unsigned char *out, size_t cap)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    assert_int_equal(deflateInit2(&z, 9, Z_DEFLATED, wbits, 8, Z_DEFAULT_STRATEGY), Z_OK);
    z.next_in = (Bytef *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    assert_int_equal(deflate(&z, Z_FINISH), Z_STREAM_END);
    size_t got = cap - z.avail_out;
    deflateEnd(&z);
    return got;
}

/* decode enc over the n bytes at in: the return code, and the text in *out. */
static int decoded(const char *enc, const void *in, size_t n, size_t cap, char **out)
{
    char *body = xmalloc(n + 1);
    memcpy(body, in, n);
    body[n] = 0;
    size_t len = n;
    int rc = gw_body_decode(enc, &body, &len, cap);
    if (rc == 0) /* decoded: NUL-terminated (no NUL inside these) */
        assert_int_equal(strlen(body), len);
    else /* unchanged */
        assert_int_equal(len, n);
    *out = body;
    return rc;
}

/* Content codings: gzip (every member), deflate wrapped or raw, stacked;
 * unknown tokens leave the bytes be; damaged or unsupported ones fail and
 * leave them unchanged; the cap holds on the decoded size. */
static void test_body_decode(void **state)
{
    (void)state;
    const char *doc = "{\"id\": \"ch_1\", \"status\": \"succeeded\"}";
    size_t dn = strlen(doc);
    unsigned char gz[256], gz2[256], zl[256], raw[256], twice[512];
    size_t gn = squeeze(doc, dn, 31, gz, sizeof gz);
    size_t g2 = squeeze(doc + 10, dn - 10, 31, gz2, sizeof gz2);
    size_t zn = squeeze(doc, dn, 15, zl, sizeof zl);
    size_t rn = squeeze(doc, dn, -15, raw, sizeof raw);
    size_t tn = squeeze((const char *)gz, gn, 31, twice, sizeof twice);
    unsigned char two[512]; /* doc's first 10 bytes, then the rest: two members */
    size_t m1 = squeeze(doc, 10, 31, two, sizeof two);
    memcpy(two + m1, gz2, g2);
    unsigned char padded[300] = {0};
    memcpy(padded, gz, gn);
    struct {
        const char *enc;
        const void *in;
        size_t n;
    } good[] = {
        {"gzip", gz, gn},         {" X-GZIP ", gz, gn},  {"gzip", two, m1 + g2},
        {"deflate", zl, zn},      {"deflate", raw, rn},  {"gzip, identity, gzip", twice, tn},
        {"utf-8", doc, dn},       {"identity", doc, dn}, {"", doc, dn}, /* not decoded: */
        {"x-custom", doc, dn},                                          /* as they came */
        {"gzip, utf-8", gz, gn},  /* a token not known is taken for identity */
        {"gzip", padded, gn + 4}, /* zeros after the last member: padding */
    };
    char *out;
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        assert_int_equal(decoded(good[i].enc, good[i].in, good[i].n, 1 << 20, &out), 0);
        assert_string_equal(out, doc);
        free(out);
    }
    /* failures leave the body as it was */
    struct {
        const char *enc;
        const void *in;
        size_t n;
        int rc;
    } bad[] = {
        {"gzip", gz, gn / 2, GW_DECODE_DAMAGED}, /* cut short */
        {"gzip", gz, gn - 8, GW_DECODE_DAMAGED}, /* no trailer */
        {"gzip", doc, dn, GW_DECODE_DAMAGED},    /* not gzip */
        {"deflate", doc, dn, GW_DECODE_DAMAGED}, /* neither wrapped nor raw */
        {"br", gz, gn, GW_DECODE_UNSUPPORTED},   /* a compression not decoded here */
        {"gzip, zstd", gz, gn, GW_DECODE_UNSUPPORTED},
        {"gzip", gz, gn, GW_DECODE_TOO_LARGE}, /* the cap (below) */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(decoded(bad[i].enc, bad[i].in, bad[i].n, i == 6 ? 8 : 1 << 20, &out),
                         bad[i].rc);
        assert_memory_equal(out, bad[i].in, bad[i].n);
        free(out);
    }
    unsigned char tail[300]; /* a member, then bytes that are not one */
    memcpy(tail, gz, gn);
    memcpy(tail + gn, "GARBAGE", 7);
    assert_int_equal(decoded("gzip", tail, gn + 7, 1 << 20, &out), GW_DECODE_DAMAGED);
    free(out);
    char layers[200] = "gzip"; /* 17: more than any server applies */
    for (int i = 1; i < 17; i++)
        strcat(layers, ", gzip");
    assert_int_equal(decoded(layers, gz, gn, 1 << 20, &out), GW_DECODE_UNSUPPORTED);
    free(out);
}

/* --ca-file: a file that cannot be read is refused, naming it. */
static void test_ca_file_must_be_readable(void **state)
{
    (void)state;
    struct ifl_err e = {0};
    assert_int_equal(gw_ca_file_set("/nonexistent/ca.pem", &e), IFL_EINVAL);
    assert_non_null(strstr(e.msg, "/nonexistent/ca.pem"));
    assert_int_equal(gw_ca_file_set("", &e), IFL_EINVAL);
    assert_int_equal(gw_ca_file_set(NULL, &e), IFL_EINVAL);
}

/* A loopback listener that never accepts on its own: what a call wrote
 * stays in the accepted socket for the test to read. */
static int listener(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* The bytes the call left on its connection (-1: it never connected). */
static ssize_t bytes_written(int lfd)
{
    int c = accept(lfd, NULL, NULL);
    if (c < 0)
        return -1;
    char buf[4096];
    ssize_t n = recv(c, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        n = 0;
    close(c);
    return n;
}

static void test_a_lapsed_lease_stops_the_request(void **state)
{
    (void)state;
    struct ifl_err e = {0};
    assert_int_equal(gw_egress_set("none", &e), 0); /* loopback, whatever ran before */
    int port = 0, lfd = listener(&port);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/charges", port);
    json_t *rendered = json_pack("{s:s, s:{s:s}, s:{s:i}}", "url", url, "headers",
                                 "Idempotency-Key", "k-1", "body", "amount", 7);
    struct gw_request r;
    assert_int_equal(gw_request_build("POST", rendered, &r, NULL), 0);
    /* the lease ran out (a pause of the whole process, say): connected,
     * nothing written, and the outcome says so */
    _Atomic int64_t send_by = clock_now_ms() - 1;
    r.send_by = &send_by;
    struct gw_response out;
    assert_int_equal(gw_call(&r, 2000, &out), 0);
    assert_int_equal(out.transport, GW_T_NOT_SENT);
    assert_true(out.late);
    assert_non_null(strstr(out.error, "lease"));
    gw_response_clear(&out);
    assert_int_equal(bytes_written(lfd), 0);
    /* still held: the request leaves (no answer comes, so it times out) */
    atomic_store(&send_by, clock_now_ms() + 60000);
    assert_int_equal(gw_call(&r, 300, &out), 0);
    assert_int_equal(out.transport, GW_T_AMBIGUOUS);
    gw_response_clear(&out);
    assert_true(bytes_written(lfd) > 0);
    gw_request_clear(&r);
    json_decref(rendered);
    close(lfd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outcome_table),
        cmocka_unit_test(test_retry_after_forms),
        cmocka_unit_test(test_backoff_full_jitter),
        cmocka_unit_test(test_policy_defaults),
        cmocka_unit_test(test_secrets_are_masked),
        cmocka_unit_test(test_userinfo_is_a_secret_only_when_it_holds_one),
        cmocka_unit_test(test_secrets_in_query_and_body),
        cmocka_unit_test(test_egress_policy),
        cmocka_unit_test(test_ca_file_must_be_readable),
        cmocka_unit_test(test_body_decode),
        cmocka_unit_test(test_a_lapsed_lease_stops_the_request),
    };
    return cmocka_run_group_tests_name("gateway", tests, NULL, NULL);
}
