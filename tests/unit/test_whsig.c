/*
 * test_whsig — inbound webhook signatures: the Standard Webhooks vectors of
 * ../shared/conformance/standard-webhooks (skipped when absent; directory
 * from $IDEMFLOW_CONFORMANCE_DIR), GitHub's published X-Hub-Signature-256
 * example, and the edges of both schemes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/mem.h"
#include "crypto/crypto.h"
#include "crypto/whsig.h"

static json_t *vectors(void)
{
    const char *d = getenv("IDEMFLOW_CONFORMANCE_DIR");
    char *p = xasprintf("%s/standard-webhooks/vectors.json", d && *d ? d : "../shared/conformance");
    json_t *v = json_load_file(p, 0, NULL);
    free(p);
    return v;
}

/* A header of the vector, looked up case-insensitively, or NULL. */
static const char *header(json_t *headers, const char *name)
{
    const char *k;
    json_t *v;
    json_object_foreach(headers, k, v)
    {
        if (strcasecmp(k, name) == 0)
            return json_string_value(v);
    }
    return NULL;
}

static int verify_with(const char *secret, const char *id, const char *ts, const char *sigs,
                       const char *payload, int64_t now, int64_t tolerance)
{
    uint8_t *key = NULL;
    size_t klen = 0;
    assert_int_equal(whsig_secret_decode(secret, &key, &klen), 0);
    struct ifl_err e = {0};
    int rc = whsig_standard_verify(key, klen, id, ts, sigs, payload, strlen(payload), now,
                                   tolerance, &e);
    if (rc) {
        assert_int_equal(rc, IFL_EUNAUTH);
        assert_true(e.msg[0] != '\0');
    }
    crypto_wipe(key, klen);
    free(key);
    return rc;
}

static void test_standard_webhooks_vectors(void **state)
{
    (void)state;
    json_t *v = vectors();
    if (!v)
        skip();
    int64_t tolerance = json_integer_value(json_object_get(v, "tolerance_seconds"));
    size_t i;
    json_t *c;
    int checked = 0;
    json_array_foreach(json_object_get(v, "verify"), i, c)
    {
        json_t *h = json_object_get(c, "headers");
        int rc =
            verify_with(json_string_value(json_object_get(c, "secret")), header(h, "webhook-id"),
                        header(h, "webhook-timestamp"), header(h, "webhook-signature"),
                        json_string_value(json_object_get(c, "payload")),
                        json_integer_value(json_object_get(c, "now_unix")), tolerance);
        int want = json_is_true(json_object_get(c, "expect_valid"));
        if ((rc == 0) != want)
            fail_msg("verify vector '%s': got %s",
                     json_string_value(json_object_get(c, "description")),
                     rc == 0 ? "valid" : "invalid");
        checked++;
    }
    /* every signing vector signs the same here, and is a valid delivery at
     * its own timestamp */
    json_array_foreach(json_object_get(v, "sign"), i, c)
    {
        char ts[32];
        int64_t t = json_integer_value(json_object_get(c, "timestamp"));
        snprintf(ts, sizeof ts, "%lld", (long long)t);
        const char *payload = json_string_value(json_object_get(c, "payload"));
        uint8_t *key = NULL;
        size_t klen = 0;
        assert_int_equal(
            whsig_secret_decode(json_string_value(json_object_get(c, "secret")), &key, &klen), 0);
        char *sig = whsig_standard_sign(key, klen, json_string_value(json_object_get(c, "msg_id")),
                                        ts, payload, strlen(payload));
        assert_string_equal(sig, json_string_value(json_object_get(c, "signature")));
        free(sig);
        free(key);
        assert_int_equal(verify_with(json_string_value(json_object_get(c, "secret")),
                                     json_string_value(json_object_get(c, "msg_id")), ts,
                                     json_string_value(json_object_get(c, "signature")),
                                     json_string_value(json_object_get(c, "payload")), t, 300),
                         0);
        checked++;
    }
    assert_true(checked >= 20);
    json_decref(v);
}

/* The upstream canonical vector, so this file checks something without
 * the conformance folder too. */
#define SECRET "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#define MSG_ID "msg_p5jXN8AQM9LWM0D4loKWxJek"
#define TS "1614265330"
#define PAYLOAD "{\"test\": 2432232314}"
#define SIG "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

static void test_standard_webhooks_edges(void **state)
{
    (void)state;
    int64_t now = 1614265330;
    assert_int_equal(verify_with(SECRET, MSG_ID, TS, SIG, PAYLOAD, now, 300), 0);
    /* a list with junk around the match; a v1 that is not base64 */
    assert_int_equal(verify_with(SECRET, MSG_ID, TS, "v1,@@@@  v1a,xx " SIG " ", PAYLOAD, now, 300),
                     0);
    /* the tolerance is inclusive both ways */
    assert_int_equal(verify_with(SECRET, MSG_ID, TS, SIG, PAYLOAD, now + 300, 300), 0);
    assert_int_equal(verify_with(SECRET, MSG_ID, TS, SIG, PAYLOAD, now + 301, 300), IFL_EUNAUTH);
    assert_int_equal(verify_with(SECRET, MSG_ID, TS, SIG, PAYLOAD, now - 301, 300), IFL_EUNAUTH);
    /* timestamps: signs, spaces, too many digits */
    assert_int_equal(verify_with(SECRET, MSG_ID, "+1614265330", SIG, PAYLOAD, now, 300),
                     IFL_EUNAUTH);
    assert_int_equal(verify_with(SECRET, MSG_ID, " 1614265330", SIG, PAYLOAD, now, 300),
                     IFL_EUNAUTH);
    assert_int_equal(verify_with(SECRET, MSG_ID, "0001614265330", SIG, PAYLOAD, now, 300),
                     IFL_EUNAUTH);
    assert_int_equal(verify_with(SECRET, "", TS, SIG, PAYLOAD, now, 300), IFL_EUNAUTH);
    assert_int_equal(verify_with(SECRET, MSG_ID, TS, "", PAYLOAD, now, 300), IFL_EUNAUTH);
    /* another key */
    assert_int_equal(
        verify_with("whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", MSG_ID, TS, SIG, PAYLOAD, now, 300),
        IFL_EUNAUTH);
    uint8_t *key = NULL;
    size_t klen = 0;
    assert_int_equal(whsig_secret_decode("whsec_", &key, &klen), IFL_EINVAL);
    assert_int_equal(whsig_secret_decode("whsec_not base64!", &key, &klen), IFL_EINVAL);
    assert_null(key);
    /* a key a guess finds: 1 and 15 bytes refused, 16 taken, the prefix optional */
    assert_int_equal(whsig_secret_decode("whsec_AA==", &key, &klen), IFL_EINVAL);
    assert_int_equal(whsig_secret_decode("whsec_AAAAAAAAAAAAAAAAAAAA", &key, &klen), IFL_EINVAL);
    assert_null(key);
    assert_int_equal(whsig_secret_decode("whsec_AAAAAAAAAAAAAAAAAAAAAA==", &key, &klen), 0);
    assert_int_equal(klen, 16);
    free(key);
    assert_int_equal(whsig_secret_decode("AAAAAAAAAAAAAAAAAAAAAA==", &key, &klen), 0);
    assert_int_equal(klen, 16);
    free(key);
}

static int hmac_check(const char *value, const char *prefix, enum whsig_encoding enc)
{
    static const char key[] = "It's a Secret to Everybody", body[] = "Hello, World!";
    struct ifl_err e = {0};
    return whsig_hmac_verify(key, strlen(key), value, prefix, enc, body, strlen(body), &e);
}

static void test_hmac_github_example(void **state)
{
    (void)state;
    /* docs.github.com, "Validating webhook deliveries" */
    const char *hex = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    assert_int_equal(hmac_check(hex, "sha256=", WHSIG_HEX), 0);
    assert_int_equal(
        hmac_check("sha256=757107EA0EB2509FC211221CCE984B8A37570B6D7586C22C46F4379C8B043E17",
                   "sha256=", WHSIG_HEX),
        0);
    assert_int_equal(hmac_check(hex + 7, NULL, WHSIG_HEX), 0);
    assert_int_equal(hmac_check("dXEH6g6yUJ/CESIczphLijdXC211hsIsRvQ3nIsEPhc=", NULL, WHSIG_BASE64),
                     0);
    /* wrong prefix, one digit off, truncated, missing, wrong encoding */
    assert_int_equal(hmac_check(hex, "sha1=", WHSIG_HEX), IFL_EUNAUTH);
    assert_int_equal(
        hmac_check("sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e18",
                   "sha256=", WHSIG_HEX),
        IFL_EUNAUTH);
    assert_int_equal(hmac_check("sha256=757107ea", "sha256=", WHSIG_HEX), IFL_EUNAUTH);
    assert_int_equal(hmac_check(NULL, "sha256=", WHSIG_HEX), IFL_EUNAUTH);
    assert_int_equal(hmac_check(hex, "sha256=", WHSIG_BASE64), IFL_EUNAUTH);
}

/* Stripe-style "t=…,v1=…": the MAC is over "t.body"; the expected value
 * was computed with Python's hmac module. */
static int stripe_check(const char *value, int64_t now)
{
    static const char key[] = "whsec_stripe_test_secret";
    static const char body[] = "{\"id\": \"evt_1\", \"type\": \"charge.succeeded\"}";
    struct ifl_err e = {0};
    return whsig_hmac_ts_verify(key, strlen(key), value, "t=", "v1=", WHSIG_HEX, body, strlen(body),
                                now, 300, &e);
}

#define STRIPE_MAC "ddd8dac55a1324c2535ddf0ea514712eb1d9ed942e593ddac9f636ab6ce83573"

static void test_hmac_with_a_timestamp(void **state)
{
    (void)state;
    int64_t now = 1614265330;
    assert_int_equal(stripe_check("t=1614265330,v1=" STRIPE_MAC, now), 0);
    /* other schemes' entries and rolled secrets around the match */
    assert_int_equal(
        stripe_check(
            "t=1614265330, v0=abc,v1="
            "0000000000000000000000000000000000000000000000000000000000000000,v1=" STRIPE_MAC,
            now),
        0);
    assert_int_equal(stripe_check("v1=" STRIPE_MAC ",t=1614265330", now), 0);
    /* the tolerance, both ways */
    assert_int_equal(stripe_check("t=1614265330,v1=" STRIPE_MAC, now + 300), 0);
    assert_int_equal(stripe_check("t=1614265330,v1=" STRIPE_MAC, now + 301), IFL_EUNAUTH);
    assert_int_equal(stripe_check("t=1614265330,v1=" STRIPE_MAC, now - 301), IFL_EUNAUTH);
    /* the timestamp is signed: another one does not verify */
    assert_int_equal(stripe_check("t=1614265331,v1=" STRIPE_MAC, now), IFL_EUNAUTH);
    /* missing or malformed parts */
    assert_int_equal(stripe_check("v1=" STRIPE_MAC, now), IFL_EUNAUTH);
    assert_int_equal(stripe_check("t=16142x5330,v1=" STRIPE_MAC, now), IFL_EUNAUTH);
    assert_int_equal(stripe_check("t=1614265330,v0=" STRIPE_MAC, now), IFL_EUNAUTH);
    assert_int_equal(stripe_check("t=1614265330", now), IFL_EUNAUTH);
    assert_int_equal(stripe_check(NULL, now), IFL_EUNAUTH);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_standard_webhooks_vectors),
        cmocka_unit_test(test_standard_webhooks_edges),
        cmocka_unit_test(test_hmac_github_example),
        cmocka_unit_test(test_hmac_with_a_timestamp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
