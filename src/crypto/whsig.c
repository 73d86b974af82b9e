/*
 * whsig — inbound webhook signatures (whsig.h).  Every check that fails
 * returns IFL_EUNAUTH with a message naming the check; the computed MAC
 * is wiped before returning.
 */
#include "crypto/whsig.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "crypto/crypto.h"

/* A Unix timestamp must fit this many digits (year 2286 is 10). */
#define MAX_TS_DIGITS 12
/* Signatures in one webhook-signature header that are looked at. */
#define MAX_SIGNATURES 16

int whsig_secret_decode(const char *secret, uint8_t **key, size_t *klen)
{
    *key = NULL;
    *klen = 0;
    if (strncmp(secret, "whsec_", 6) == 0)
        secret += 6;
    size_t n = strlen(secret);
    if (n == 0 || crypto_unbase64(secret, n, key, klen) != 0)
        return IFL_EINVAL;
    if (*klen < WHSIG_KEY_MIN) {
        crypto_wipe(*key, *klen);
        free(*key);
        *key = NULL;
        return IFL_EINVAL;
    }
    return 0;
}

/* Digits only, at most MAX_TS_DIGITS: the strict form every Standard
 * Webhooks library accepts. */
static int parse_ts(const char *s, int64_t *out)
{
    size_t n = strlen(s);
    if (n == 0 || n > MAX_TS_DIGITS)
        return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return 0;
}

/* HMAC-SHA256(key, id "." timestamp "." body). */
static void standard_mac(const uint8_t *key, size_t klen, const char *id, const char *timestamp,
                         const void *body, size_t n, uint8_t mac[CRYPTO_SHA256_LEN])
{
    struct buf msg;
    buf_init(&msg, 0);
    buf_puts(&msg, id);
    buf_putc(&msg, '.');
    buf_puts(&msg, timestamp);
    buf_putc(&msg, '.');
    buf_append(&msg, body, n);
    crypto_hmac_sha256(key, klen, msg.p, msg.len, mac);
    buf_free(&msg);
}

char *whsig_standard_sign(const uint8_t *key, size_t klen, const char *id, const char *timestamp,
                          const void *body, size_t n)
{
    uint8_t mac[CRYPTO_SHA256_LEN];
    standard_mac(key, klen, id, timestamp, body, n, mac);
    char *b64 = crypto_base64(mac, sizeof mac);
    crypto_wipe(mac, sizeof mac);
    char *sig = xasprintf("v1,%s", b64);
    free(b64);
    return sig;
}

int whsig_standard_verify(const uint8_t *key, size_t klen, const char *id, const char *timestamp,
                          const char *signatures, const void *body, size_t n, int64_t now_s,
                          int64_t tolerance_s, struct ifl_err *e)
{
    if (!id || !*id || !timestamp || !signatures)
        return err_set(e, IFL_EUNAUTH,
                       "a signed webhook needs webhook-id, webhook-timestamp and "
                       "webhook-signature headers");
    int64_t ts = 0;
    if (parse_ts(timestamp, &ts))
        return err_set(e, IFL_EUNAUTH, "webhook-timestamp must be Unix seconds");
    if (ts < now_s - tolerance_s || ts > now_s + tolerance_s)
        return err_set(e, IFL_EUNAUTH,
                       "webhook-timestamp is more than %lld s away from now (stale or future)",
                       (long long)tolerance_s);
    uint8_t mac[CRYPTO_SHA256_LEN];
    standard_mac(key, klen, id, timestamp, body, n, mac);
    /* "v1,<base64>" entries separated by spaces; any one that matches. */
    int match = 0, seen = 0;
    const char *p = signatures;
    while (*p && seen < MAX_SIGNATURES) {
        while (*p == ' ')
            p++;
        const char *end = strchr(p, ' ');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0)
            break;
        seen++;
        if (len > 3 && strncmp(p, "v1,", 3) == 0) {
            uint8_t *sig = NULL;
            size_t slen = 0;
            if (crypto_unbase64(p + 3, len - 3, &sig, &slen) == 0)
                match |= crypto_equal(sig, slen, mac, sizeof mac);
            free(sig);
        }
        p += len;
    }
    crypto_wipe(mac, sizeof mac);
    return match ? 0 : err_set(e, IFL_EUNAUTH, "no webhook-signature matches the payload");
}

/* sig[0..slen) decoded as enc into got (32 bytes); 1 when it is one. */
static int decode_mac(const char *sig, size_t slen, enum whsig_encoding enc,
                      uint8_t got[CRYPTO_SHA256_LEN])
{
    if (enc == WHSIG_HEX)
        return crypto_unhex(sig, slen, got, CRYPTO_SHA256_LEN) == 0;
    uint8_t *b = NULL;
    size_t blen = 0;
    int ok = crypto_unbase64(sig, slen, &b, &blen) == 0 && blen == CRYPTO_SHA256_LEN;
    if (ok)
        memcpy(got, b, CRYPTO_SHA256_LEN);
    free(b);
    return ok;
}

int whsig_hmac_ts_verify(const void *key, size_t klen, const char *value, const char *ts_prefix,
                         const char *prefix, enum whsig_encoding enc, const void *body, size_t n,
                         int64_t now_s, int64_t tolerance_s, struct ifl_err *e)
{
    if (!value)
        return err_set(e, IFL_EUNAUTH, "the webhook's signature header is missing");
    size_t tlen = strlen(ts_prefix), plen = strlen(prefix);
    /* the timestamp first: its element, digits only */
    char ts[MAX_TS_DIGITS + 1] = "";
    int64_t t = 0;
    const char *p = value;
    for (int seen = 0; *p && seen < MAX_SIGNATURES; seen++) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t len = strcspn(p, ",");
        if (len > tlen && strncmp(p, ts_prefix, tlen) == 0 && len - tlen <= MAX_TS_DIGITS) {
            memcpy(ts, p + tlen, len - tlen);
            ts[len - tlen] = '\0';
        }
        p += len;
    }
    if (!ts[0] || parse_ts(ts, &t))
        return err_set(e, IFL_EUNAUTH, "the webhook's signature header has no '%s' timestamp",
                       ts_prefix);
    if (t < now_s - tolerance_s || t > now_s + tolerance_s)
        return err_set(e, IFL_EUNAUTH,
                       "the webhook's timestamp is more than %lld s away from now (stale or "
                       "future)",
                       (long long)tolerance_s);
    struct buf msg;
    buf_init(&msg, 0);
    buf_puts(&msg, ts);
    buf_putc(&msg, '.');
    buf_append(&msg, body, n);
    uint8_t mac[CRYPTO_SHA256_LEN], got[CRYPTO_SHA256_LEN];
    crypto_hmac_sha256(key, klen, msg.p, msg.len, mac);
    buf_free(&msg);
    int match = 0;
    p = value;
    for (int seen = 0; *p && seen < MAX_SIGNATURES; seen++) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t len = strcspn(p, ",");
        while (len && p[len - 1] == ' ')
            len--;
        if (len > plen && strncmp(p, prefix, plen) == 0 &&
            decode_mac(p + plen, len - plen, enc, got))
            match |= crypto_equal(got, sizeof got, mac, sizeof mac);
        p += strcspn(p, ",");
    }
    crypto_wipe(mac, sizeof mac);
    return match ? 0 : err_set(e, IFL_EUNAUTH, "no signature in the header matches the payload");
}

int whsig_hmac_verify(const void *key, size_t klen, const char *value, const char *prefix,
                      enum whsig_encoding enc, const void *body, size_t n, struct ifl_err *e)
{
    if (!value)
        return err_set(e, IFL_EUNAUTH, "the webhook's signature header is missing");
    size_t plen = prefix ? strlen(prefix) : 0;
    if (plen && strncmp(value, prefix, plen) != 0)
        return err_set(e, IFL_EUNAUTH, "the webhook's signature does not start with '%s'", prefix);
    const char *sig = value + plen;
    size_t slen = strlen(sig);
    uint8_t mac[CRYPTO_SHA256_LEN], got[CRYPTO_SHA256_LEN];
    int ok = decode_mac(sig, slen, enc, got);
    if (ok) {
        crypto_hmac_sha256(key, klen, body, n, mac);
        ok = crypto_equal(got, sizeof got, mac, sizeof mac);
        crypto_wipe(mac, sizeof mac);
    }
    return ok ? 0 : err_set(e, IFL_EUNAUTH, "the webhook's signature does not match the payload");
}
