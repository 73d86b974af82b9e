/*
 * crypto — the few primitives idemflow needs, over OpenSSL libcrypto:
 * SHA-256, HMAC-SHA256, CSPRNG bytes, hex and base64, constant-time compare.
 * Nothing here logs; nothing here keeps key material after returning.
 */
#ifndef IFL_CRYPTO_CRYPTO_H
#define IFL_CRYPTO_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#define CRYPTO_SHA256_LEN 32

/* out receives 32 bytes. Cannot fail. */
void crypto_sha256(const void *data, size_t len, uint8_t out[CRYPTO_SHA256_LEN]);
/* out receives 64 lowercase hex chars and a NUL. Cannot fail. */
void crypto_sha256_hex(const void *data, size_t len, char out[65]);
/* HMAC-SHA256; out receives 32 bytes. Cannot fail. */
void crypto_hmac_sha256(const void *key, size_t klen, const void *data, size_t len,
                        uint8_t out[CRYPTO_SHA256_LEN]);
/* Fills buf from the OS CSPRNG. Returns 0 or IFL_EIO. */
int crypto_random(void *buf, size_t n);
/* Lowercase hex of n bytes into out (2n+1 bytes). Cannot fail. */
void crypto_hex(const uint8_t *in, size_t n, char *out);
/* Exactly 2 * n hex digits (either case) of s[0..len) into n bytes of out.
 * 0, or IFL_EINVAL (another length, a non-hex character). */
int crypto_unhex(const char *s, size_t len, uint8_t *out, size_t n);
/* 32 random bytes as 64 hex chars + NUL. Returns 0 or IFL_EIO. */
int crypto_random_hex32(char out[65]);
/* Constant-time equality of two equal-length buffers (0 when lengths
 * differ). */
int crypto_equal(const void *a, size_t alen, const void *b, size_t blen);

/* Standard base64 (with padding) of n bytes; caller frees. Cannot fail. */
char *crypto_base64(const void *in, size_t n);
/* Decodes standard base64 (padding required); *out is heap memory the
 * caller frees.  Returns 0 or IFL_EINVAL. */
int crypto_unbase64(const char *in, size_t len, uint8_t **out, size_t *outlen);

#define CRYPTO_KEY_LEN 32
/* AES-256-GCM seal: returns "v1:" + base64(nonce[12] | ciphertext | tag[16])
 * in *out (caller frees).  `aad` binds the ciphertext to its context (e.g.
 * "workspace/name") so a sealed value cannot be moved to another record.
 * Returns 0 or IFL_EIO. */
int crypto_seal(const uint8_t key[CRYPTO_KEY_LEN], const char *aad, const void *plain, size_t n,
                char **out);
/* Opens what crypto_seal produced; *plain is NUL-terminated heap memory the
 * caller must cleanse (crypto_wipe) and free.  IFL_EINVAL on tampering or a
 * wrong key/aad. */
int crypto_open(const uint8_t key[CRYPTO_KEY_LEN], const char *aad, const char *sealed,
                char **plain, size_t *n);
/* Zeroes memory in a way the compiler cannot elide. */
void crypto_wipe(void *p, size_t n);

#endif
