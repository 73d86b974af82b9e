/*
 * crypto — see crypto.h.
 */
#include "crypto/crypto.h"
#include "base/err.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

void crypto_sha256(const void *data, size_t len, uint8_t out[CRYPTO_SHA256_LEN])
{
    unsigned int n = 0;
    EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

void crypto_hex(const uint8_t *in, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[in[i] >> 4];
        out[2 * i + 1] = hx[in[i] & 15];
    }
    out[2 * n] = '\0';
}

void crypto_sha256_hex(const void *data, size_t len, char out[65])
{
    uint8_t d[CRYPTO_SHA256_LEN];
    crypto_sha256(data, len, d);
    crypto_hex(d, sizeof d, out);
}

void crypto_hmac_sha256(const void *key, size_t klen, const void *data, size_t len,
                        uint8_t out[CRYPTO_SHA256_LEN])
{
    unsigned int n = 0;
    HMAC(EVP_sha256(), key, (int)klen, data, len, out, &n);
}

int crypto_random(void *buf, size_t n)
{
    return RAND_bytes(buf, (int)n) == 1 ? 0 : IFL_EIO;
}

int crypto_random_hex32(char out[65])
{
    uint8_t r[32];
    int rc = crypto_random(r, sizeof r);
    if (rc)
        return rc;
    crypto_hex(r, sizeof r, out);
    OPENSSL_cleanse(r, sizeof r);
    return 0;
}

int crypto_equal(const void *a, size_t alen, const void *b, size_t blen)
{
    if (alen != blen)
        return 0;
    return CRYPTO_memcmp(a, b, alen) == 0;
}
