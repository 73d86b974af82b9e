/*
 * test_sfkey — http_sf_string, the Idempotency-Key header's parser (spec §7,
 * RFC 8941 §3.3.3 and §3.1.2): a string with escapes, parameters after it
 * checked and ignored, a bare token taken whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/err.h"
#include "http/http.h"

static const char *key_of(const char *h)
{
    static char out[256];
    return http_sf_string(h, out, sizeof out) == 0 ? out : NULL;
}

static void test_a_string_is_its_unescaped_text(void **state)
{
    (void)state;
    assert_string_equal(key_of("\"k-1\""), "k-1");
    assert_string_equal(key_of(" \"my key\"\t"), "my key");
    assert_string_equal(key_of("\"a\\\"b\\\\c\""), "a\"b\\c");
    assert_string_equal(key_of("k-1"), "k-1");     /* a bare token, leniently */
    assert_string_equal(key_of("k;a=1"), "k;a=1"); /* … taken whole */
}

static void test_parameters_after_a_string_are_ignored(void **state)
{
    (void)state;
    /* found by a judge: a trigger took `"k8";p=1` as that whole text (a
     * different execution from `"k8"`), an operator action refused it */
    const char *same[] = {"\"k8\";p=1",      "\"k8\"; p=1;q",    "\"k8\";a=?0;b=?1",
                          "\"k8\";a=-12.5",  "\"k8\";a=\"x;y\"", "\"k8\";a=tok/en:1",
                          "\"k8\";a=:AQID:", "\"k8\";*x_1.-=2"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        const char *k = key_of(same[i]);
        assert_non_null(k);
        assert_string_equal(k, "k8");
    }
}

static void test_malformed_values_are_refused(void **state)
{
    (void)state;
    const char *bad[] = {"",
                         "\"\"",
                         "\"k8",
                         "\"k8\"x",
                         "\"k8\";",
                         "\"k8\";P=1",
                         "\"k8\";1a=1",
                         "\"k8\";a=",
                         "\"k8\";a=?2",
                         "\"k8\";a=\"x",
                         "\"k8\";a=1.2345",
                         "\"k8\";a=:x y:",
                         "\"k8\" ;a=1",
                         "\"a\\xb\"",
                         "\"é\"",
                         "a b",
                         "\"k8\";a=1234567890123456"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char out[256];
        if (http_sf_string(bad[i], out, sizeof out) == 0)
            fail_msg("accepted %s as %s", bad[i], out);
    }
    char small[4];
    assert_int_equal(http_sf_string("\"abcd\"", small, sizeof small), IFL_EINVAL);
    assert_int_equal(http_sf_string("\"abc\"", small, sizeof small), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_string_is_its_unescaped_text),
        cmocka_unit_test(test_parameters_after_a_string_are_ignored),
        cmocka_unit_test(test_malformed_values_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
