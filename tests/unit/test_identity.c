/*
 * test_identity — execution identity derivation (spec §4).  The golden ids
 * below were computed by the independent Python implementation in
 * tests/integration/jcs_ref.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "engine/identity.h"
#include "json/json.h"

static json_t *parse(const char *s)
{
    json_t *v = NULL;
    assert_int_equal(json_parse(s, strlen(s), NULL, &v, NULL), 0);
    return v;
}

static void test_golden_ids(void **state)
{
    char id[65];
    json_t *p = parse("{\"b\":[1,2.5,\"\\u00e9\"],\"a\":null}");
    assert_int_equal(identity_compute("acme", "orders", "start", "payload", p, id, NULL), 0);
    assert_string_equal(id, "d8f0e51ec64c104d4a475dbf19939c98992276e338238d0f9724a4e86c5e87e7");
    json_decref(p);
    /* member order in the input must not matter */
    p = parse("{\"a\":null,\"b\":[1.0,25e-1,\"é\"]}");
    assert_int_equal(identity_compute("acme", "orders", "start", "payload", p, id, NULL), 0);
    assert_string_equal(id, "d8f0e51ec64c104d4a475dbf19939c98992276e338238d0f9724a4e86c5e87e7");
    json_decref(p);
    json_t *k = json_string("key-1");
    assert_int_equal(identity_compute("acme", "orders", "start", "client", k, id, NULL), 0);
    assert_string_equal(id, "19a29139b938885da7fa5541afddf6d109c52c2a979e70f342738a54a15a089c");
    json_decref(k);
}

static void test_fields_material(void **state)
{
    struct id_fields f;
    json_t *spec = json_string(" order.id , customer.id");
    assert_int_equal(identity_fields_parse(spec, &f, NULL), 0);
    json_decref(spec);
    assert_int_equal(f.n, 2);
    assert_string_equal(f.paths[0], "order.id");
    assert_string_equal(f.paths[1], "customer.id");
    json_t *p = parse("{\"order\":{\"id\":\"o-1\",\"amount\":3},\"customer\":{\"id\":7}}");
    json_t *m = NULL;
    assert_int_equal(identity_fields_material(&f, p, &m, NULL), 0);
    char id[65];
    assert_int_equal(identity_compute("acme", "orders", "start", "fields", m, id, NULL), 0);
    assert_string_equal(id, "4f13e54ded7d8a2d94a13a9f79774a58afa0b01a7f0579bbc7d6599e9a31a286");
    json_decref(m);
    json_decref(p);
    /* a missing path names its pointer */
    p = parse("{\"order\":{\"amount\":3}}");
    struct ifl_err e = {0};
    assert_int_equal(identity_fields_material(&f, p, &m, &e), IFL_EVALIDATION);
    assert_string_equal(e.pointer, "/order/id");
    json_decref(p);
    identity_fields_clear(&f);
}

static void test_fields_arrays_and_indexes(void **state)
{
    struct id_fields f;
    json_t *spec = parse("[\"items.1.sku\", \"a/b\"]");
    assert_int_equal(identity_fields_parse(spec, &f, NULL), 0);
    json_decref(spec);
    json_t *p = parse("{\"items\":[{\"sku\":\"x\"},{\"sku\":\"y\"}],\"a/b\":1}");
    json_t *m = NULL;
    assert_int_equal(identity_fields_material(&f, p, &m, NULL), 0);
    assert_string_equal(json_string_value(json_object_get(m, "items.1.sku")), "y");
    json_decref(m);
    json_decref(p);
    identity_fields_clear(&f);
}

static void test_fields_rejects_bad_specs(void **state)
{
    const char *bad[] = {"\"\"", "\"a..b\"", "\".a\"",   "\"a.\"",   "[]",
                         "[1]",  "3",        "\"a,,b\"", "\"a, a\"", "\"a b\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct id_fields f;
        json_t *spec = parse(bad[i]);
        assert_int_equal(identity_fields_parse(spec, &f, NULL), IFL_EVALIDATION);
        json_decref(spec);
    }
}

static void test_client_keys(void **state)
{
    char k[300];
    memset(k, 'a', sizeof k);
    k[255] = '\0';
    assert_true(identity_client_key_valid(k));
    k[255] = 'a';
    k[256] = '\0';
    assert_false(identity_client_key_valid(k));
    assert_false(identity_client_key_valid(""));
    assert_false(identity_client_key_valid("tab\there"));
    assert_false(identity_client_key_valid("caf\xc3\xa9"));
    assert_true(identity_client_key_valid("order 42 / retry"));
}

static void test_random_ids_differ(void **state)
{
    char a[65], b[65];
    assert_int_equal(identity_random("ws", "wf", "v", a, NULL), 0);
    assert_int_equal(identity_random("ws", "wf", "v", b, NULL), 0);
    assert_int_equal(strlen(a), 64);
    assert_int_equal(strspn(a, "0123456789abcdef"), 64);
    assert_string_not_equal(a, b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_ids),
        cmocka_unit_test(test_fields_material),
        cmocka_unit_test(test_fields_arrays_and_indexes),
        cmocka_unit_test(test_fields_rejects_bad_specs),
        cmocka_unit_test(test_client_keys),
        cmocka_unit_test(test_random_ids_differ),
    };
    return cmocka_run_group_tests_name("identity", tests, NULL, NULL);
}
