/*
 * test_crypto — published vectors for SHA-256 (FIPS 180-2) and HMAC-SHA256
 * (RFC 4231 case 2), base64, and the AES-256-GCM seal: round trip, tamper
 * and context (AAD) binding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "crypto/crypto.h"

static void test_sha256_vector(void **state)
{
    char hex[65];
    crypto_sha256_hex("abc", 3, hex);
    assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void test_hmac_rfc4231_case2(void **state)
{
    uint8_t mac[32];
    char hex[65];
    crypto_hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, mac);
    crypto_hex(mac, 32, hex);
    assert_string_equal(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    /* and back, in either case */
    uint8_t back[32];
    assert_int_equal(crypto_unhex(hex, 64, back, 32), 0);
    assert_memory_equal(back, mac, 32);
    assert_int_equal(crypto_unhex("5BDCC146", 8, back, 4), 0);
    assert_memory_equal(back, mac, 4);
    assert_int_equal(crypto_unhex("5bdcc14", 7, back, 4), IFL_EINVAL);
    assert_int_equal(crypto_unhex("5bdcc1g6", 8, back, 4), IFL_EINVAL);
}

static void test_base64_round_trip(void **state)
{
    for (size_t n = 0; n < 40; n++) {
        uint8_t in[40], *out = NULL;
        size_t on = 0;
        for (size_t i = 0; i < n; i++)
            in[i] = (uint8_t)(i * 37 + 11);
        char *b = crypto_base64(in, n);
        assert_int_equal(crypto_unbase64(b, strlen(b), &out, &on), 0);
        assert_int_equal(on, n);
        assert_memory_equal(out, in, n);
        free(out);
        free(b);
    }
    uint8_t *out = NULL;
    size_t on;
    assert_int_equal(crypto_unbase64("abc", 3, &out, &on), IFL_EINVAL);
    assert_int_equal(crypto_unbase64("a*c=", 4, &out, &on), IFL_EINVAL);
}

static void test_seal_open(void **state)
{
    uint8_t key[32], other[32];
    assert_int_equal(crypto_random(key, 32), 0);
    assert_int_equal(crypto_random(other, 32), 0);
    char *sealed = NULL, *plain = NULL;
    size_t n = 0;
    assert_int_equal(crypto_seal(key, "ws/NAME", "sk_live_123", 11, &sealed), 0);
    assert_null(strstr(sealed, "sk_live"));
    assert_int_equal(crypto_open(key, "ws/NAME", sealed, &plain, &n), 0);
    assert_int_equal(n, 11);
    assert_string_equal(plain, "sk_live_123");
    free(plain);
    /* wrong key, wrong context, tampered ciphertext: all refused */
    assert_int_equal(crypto_open(other, "ws/NAME", sealed, &plain, &n), IFL_EINVAL);
    assert_int_equal(crypto_open(key, "ws/OTHER", sealed, &plain, &n), IFL_EINVAL);
    size_t len = strlen(sealed);
    sealed[len - 6] = sealed[len - 6] == 'A' ? 'B' : 'A';
    assert_int_equal(crypto_open(key, "ws/NAME", sealed, &plain, &n), IFL_EINVAL);
    free(sealed);
    /* two seals of one value differ (random nonce) */
    char *a = NULL, *b = NULL;
    crypto_seal(key, NULL, "x", 1, &a);
    crypto_seal(key, NULL, "x", 1, &b);
    assert_string_not_equal(a, b);
    free(a);
    free(b);
}

static void test_equal(void **state)
{
    assert_true(crypto_equal("abc", 3, "abc", 3));
    assert_false(crypto_equal("abc", 3, "abd", 3));
    assert_false(crypto_equal("abc", 3, "abcd", 4));
}

/* Ids from the per-thread pool: well-formed and all distinct, across
 * several refills of the pool. */
static void test_random_ids_distinct(void **state)
{
    (void)state;
    enum { N = 200 };
    static char ids[N][65];
    for (int i = 0; i < N; i++) {
        assert_int_equal(crypto_random_hex32(ids[i]), 0);
        assert_int_equal(strlen(ids[i]), 64);
        assert_int_equal(strspn(ids[i], "0123456789abcdef"), 64);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(ids[i], ids[j]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vector),
        cmocka_unit_test(test_hmac_rfc4231_case2),
        cmocka_unit_test(test_base64_round_trip),
        cmocka_unit_test(test_seal_open),
        cmocka_unit_test(test_equal),
        cmocka_unit_test(test_random_ids_distinct),
    };
    return cmocka_run_group_tests_name("crypto", tests, NULL, NULL);
}
