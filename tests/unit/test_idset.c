/*
 * test_idset — the Bloom filter of execution ids: no false "certainly not",
 * few false "maybe", and adds racing lookups from other threads.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>

#include "store/idset.h"

enum { N = 100000 };

static void key(char out[65], unsigned i, unsigned salt)
{
    snprintf(out, 65, "%08x%056x", salt, i);
}

static void test_every_added_key_may_be_there(void **state)
{
    (void)state;
    struct idset *s = idset_new(N);
    char k[65];
    for (unsigned i = 0; i < N; i++) {
        key(k, i, 1);
        idset_add(s, k);
    }
    int misses = 0, false_maybe = 0;
    for (unsigned i = 0; i < N; i++) {
        key(k, i, 1);
        misses += !idset_maybe(s, k);
        key(k, i, 2);
        false_maybe += idset_maybe(s, k);
    }
    assert_int_equal(misses, 0);
    assert_true(false_maybe < N / 100); /* sized for < 0.3 % at this load */
    idset_free(s);
}

static void test_empty_set_says_certainly_not(void **state)
{
    (void)state;
    struct idset *s = idset_new(0);
    assert_int_equal(idset_maybe(s, "abc"), 0);
    assert_int_equal(idset_maybe(s, ""), 0);
    idset_add(s, "");
    assert_int_equal(idset_maybe(s, ""), 1);
    idset_free(s);
    idset_free(NULL);
}

struct adder {
    struct idset *s;
    unsigned salt;
};

static void *add_all(void *arg)
{
    struct adder *a = arg;
    char k[65];
    for (unsigned i = 0; i < N / 4; i++) {
        key(k, i, a->salt);
        idset_add(a->s, k);
    }
    return NULL;
}

/* Four threads add at once (sharing words of the bit array): none of their
 * bits is lost. */
static void test_concurrent_adds_lose_nothing(void **state)
{
    (void)state;
    struct idset *s = idset_new(N);
    pthread_t t[4];
    struct adder a[4];
    for (unsigned i = 0; i < 4; i++) {
        a[i] = (struct adder){s, 10 + i};
        pthread_create(&t[i], NULL, add_all, &a[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    char k[65];
    int misses = 0;
    for (unsigned salt = 10; salt < 14; salt++)
        for (unsigned i = 0; i < N / 4; i++) {
            key(k, i, salt);
            misses += !idset_maybe(s, k);
        }
    assert_int_equal(misses, 0);
    idset_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_added_key_may_be_there),
        cmocka_unit_test(test_empty_set_says_certainly_not),
        cmocka_unit_test(test_concurrent_adds_lose_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
