/*
 * fuzz_whsig — inbound webhook signatures (crypto/whsig.h) on arbitrary
 * header values, secrets and bodies.  The input is split at the first
 * three NUL bytes into secret, webhook-id, webhook-timestamp and the rest
 * (signature header, then body after a further NUL).  Every verdict must be
 * 0 or IFL_EUNAUTH; a decoded secret is never empty; and a signature this
 * target computes itself over the same id, timestamp and body always
 * verifies, wherever it sits in a list of junk.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "crypto/crypto.h"
#include "crypto/whsig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The next NUL-terminated piece of [*p, end), copied; the rest when there
 * is no NUL. */
static char *piece(const uint8_t **p, const uint8_t *end)
{
    const uint8_t *z = memchr(*p, 0, (size_t)(end - *p));
    size_t n = z ? (size_t)(z - *p) : (size_t)(end - *p);
    char *s = xmalloc(n + 1);
    memcpy(s, *p, n);
    s[n] = '\0';
    *p += n + (z != NULL);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data, *end = data + size;
    char *secret = piece(&p, end), *id = piece(&p, end), *ts = piece(&p, end),
         *sigs = piece(&p, end);
    const uint8_t *body = p;
    size_t n = (size_t)(end - p);
    struct ifl_err e = {0};
    int rc = whsig_hmac_verify(secret, strlen(secret), sigs, "sha256=", WHSIG_HEX, body, n, &e);
    if (rc != 0 && rc != IFL_EUNAUTH)
        abort();
    rc = whsig_hmac_verify(secret, strlen(secret), sigs, NULL, WHSIG_BASE64, body, n, &e);
    if (rc != 0 && rc != IFL_EUNAUTH)
        abort();
    rc = whsig_hmac_ts_verify(secret, strlen(secret), sigs, "t=", "v1=", WHSIG_HEX, body, n,
                              1614265330, 300, &e);
    if (rc != 0 && rc != IFL_EUNAUTH)
        abort();
    uint8_t *key = NULL;
    size_t klen = 0;
    if (whsig_secret_decode(secret, &key, &klen) == 0) {
        if (!key || klen == 0)
            abort();
        rc = whsig_standard_verify(key, klen, id, ts, sigs, body, n, 1614265330, 300, &e);
        if (rc != 0 && rc != IFL_EUNAUTH)
            abort();
        /* the right signature, among the fuzzer's */
        char *sig = whsig_standard_sign(key, klen, id, ts, body, n);
        char *list = xasprintf("%.40s %s %.40s", sigs, sig, sigs);
        char *ts_now = xasprintf("%s", ts);
        long long t = 0;
        int digits = ts[0] != '\0' && strlen(ts) <= 12 && strspn(ts, "0123456789") == strlen(ts);
        if (digits)
            t = strtoll(ts, NULL, 10);
        rc = whsig_standard_verify(key, klen, id, ts_now, list, body, n, t, 300, &e);
        /* valid exactly when the id is there and the timestamp is digits
         * (any list junk before the match is skipped, at most 16 entries) */
        if (digits && id[0] && !strchr(sigs, ' ') && (rc != 0))
            abort();
        if (!digits && rc == 0)
            abort();
        free(ts_now);
        free(list);
        free(sig);
        crypto_wipe(key, klen);
        free(key);
    }
    free(secret);
    free(id);
    free(ts);
    free(sigs);
    return 0;
}
