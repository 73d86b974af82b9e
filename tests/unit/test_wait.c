/*
 * test_wait — `Prefer: wait` end to end below HTTP: the header's parser
 * (http_prefer_wait) and the engine's registry of waiters (waiters.c): a
 * waiter fires exactly once — when its execution moves, at its deadline, or
 * at close — and a move recorded before arming ends the wait at once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "engine/engine_int.h"
#include "http/http.h"
#include "store/store.h"

#include "engine_fixture.h"

static void test_prefer_wait_parses_rfc7240_forms(void **state)
{
    (void)state;
    assert_int_equal(http_prefer_wait("wait=10"), 10);
    assert_int_equal(http_prefer_wait("WAIT = 7"), 7);
    assert_int_equal(http_prefer_wait("wait=\"3\""), 3);
    assert_int_equal(http_prefer_wait("respond-async, wait=5"), 5);
    assert_int_equal(http_prefer_wait("handling=lenient; x=\"a,wait=9\", wait=4"), 4);
    assert_int_equal(http_prefer_wait("wait=2;foo=bar"), 2);
    assert_int_equal(http_prefer_wait("wait=0"), 0);
    assert_int_equal(http_prefer_wait("wait=99999999999999999999"), 100000000);
    assert_int_equal(http_prefer_wait("wait=1, wait=8"), 1); /* the first counts */
}

static void test_prefer_wait_ignores_what_it_cannot_use(void **state)
{
    (void)state;
    const char *bad[] = {
        NULL,       "",          "respond-async", "wait",    "wait=", "wait=-1",    "wait=3x",
        "wait=\"3", "wait=\"\"", "waiting=3",     "await=3", ",,, ;", "\"wait=3\"", "x=\"wait=3"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(http_prefer_wait(bad[i]), -1);
}

static int setup(void **state)
{
    struct engine_opts o = {.shared_cache_ms = 0};
    *state = engine_fixture_new("wait", &o);
    return 0;
}

static void count_call(void *arg)
{
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void wait_calls(atomic_int *calls, int n)
{
    for (int i = 0; i < 5000 && atomic_load(calls) < n; i++)
        usleep(1000);
}

static void test_a_move_fires_every_armed_waiter_of_that_execution_once(void **state)
{
    struct fixture *f = *state;
    atomic_int calls = 0, other = 0;
    struct engine_waiter *a = engine_waiter_add(f->g, "ws", "x1");
    struct engine_waiter *b = engine_waiter_add(f->g, "ws", "x1");
    struct engine_waiter *c = engine_waiter_add(f->g, "ws", "x2");
    int64_t later = clock_mono_ms() + 60000;
    assert_int_equal(engine_waiter_arm(f->g, a, later, count_call, &calls), 0);
    assert_int_equal(engine_waiter_arm(f->g, b, later, count_call, &calls), 0);
    assert_int_equal(engine_waiter_arm(f->g, c, later, count_call, &other), 0);
    engine_execution_moved(f->g, "x1", "running"); /* not an end */
    assert_int_equal(atomic_load(&calls), 0);
    engine_execution_moved(f->g, "x1", "completed");
    assert_int_equal(atomic_load(&calls), 2);     /* on the mover's thread */
    engine_execution_moved(f->g, "x1", "failed"); /* fired already: not again */
    assert_int_equal(atomic_load(&calls), 2);
    char st[32];
    assert_true(engine_waiter_status(f->g, a, st));
    assert_string_equal(st, "failed"); /* the latest move: the status at answer time */
    assert_false(engine_waiter_status(f->g, c, st));
    assert_int_equal(atomic_load(&other), 0);
    engine_waiter_remove(f->g, a);
    engine_waiter_remove(f->g, b);
    engine_waiters_close(f->g); /* fires c */
    assert_int_equal(atomic_load(&other), 1);
    assert_false(engine_waiter_status(f->g, c, st));
    engine_waiter_remove(f->g, c);
    /* after close, a wait is over before it starts */
    struct engine_waiter *d = engine_waiter_add(f->g, "ws", "x3");
    assert_int_equal(engine_waiter_arm(f->g, d, later, count_call, &other), 1);
    engine_waiter_remove(f->g, d);
    assert_int_equal(atomic_load(&other), 1);
}

static void test_a_move_before_arming_ends_the_wait_at_once(void **state)
{
    struct fixture *f = *state;
    atomic_int calls = 0;
    struct engine_waiter *w = engine_waiter_add(f->g, "ws", "x4");
    engine_execution_moved(f->g, "x4", "requires_reconciliation");
    assert_int_equal(engine_waiter_arm(f->g, w, clock_mono_ms() + 60000, count_call, &calls), 1);
    char st[32];
    assert_true(engine_waiter_status(f->g, w, st));
    assert_string_equal(st, "requires_reconciliation");
    engine_waiter_remove(f->g, w);
    assert_int_equal(atomic_load(&calls), 0);
}

static void test_the_deadline_fires_a_waiter_whose_execution_still_runs(void **state)
{
    struct fixture *f = *state;
    atomic_int calls = 0;
    struct engine_waiter *w = engine_waiter_add(f->g, "ws", "x5");
    int64_t t0 = clock_mono_ms();
    assert_int_equal(engine_waiter_arm(f->g, w, t0 + 150, count_call, &calls), 0);
    wait_calls(&calls, 1);
    assert_int_equal(atomic_load(&calls), 1);
    assert_true(clock_mono_ms() - t0 >= 150);
    char st[32];
    assert_false(engine_waiter_status(f->g, w, st)); /* still running, as far as known */
    engine_waiter_remove(f->g, w);
    /* a deadline already past: over at once */
    w = engine_waiter_add(f->g, "ws", "x6");
    assert_int_equal(engine_waiter_arm(f->g, w, clock_mono_ms() - 1, count_call, &calls), 1);
    engine_waiter_remove(f->g, w);
    assert_int_equal(atomic_load(&calls), 1);
}

static void test_a_removed_waiter_is_never_fired(void **state)
{
    struct fixture *f = *state;
    atomic_int calls = 0;
    struct engine_waiter *w = engine_waiter_add(f->g, "ws", "x7");
    assert_int_equal(engine_waiter_arm(f->g, w, clock_mono_ms() + 100, count_call, &calls), 0);
    engine_waiter_remove(f->g, w);
    engine_execution_moved(f->g, "x7", "completed");
    /* a later deadline: once it fired, the timer has passed the removed one's */
    atomic_int later = 0;
    struct engine_waiter *v = engine_waiter_add(f->g, "ws", "x8");
    assert_int_equal(engine_waiter_arm(f->g, v, clock_mono_ms() + 200, count_call, &later), 0);
    wait_calls(&later, 1);
    assert_int_equal(atomic_load(&later), 1);
    engine_waiter_remove(f->g, v);
    assert_int_equal(atomic_load(&calls), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefer_wait_parses_rfc7240_forms),
        cmocka_unit_test(test_prefer_wait_ignores_what_it_cannot_use),
        cmocka_unit_test_setup_teardown(test_a_move_fires_every_armed_waiter_of_that_execution_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_move_before_arming_ends_the_wait_at_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_the_deadline_fires_a_waiter_whose_execution_still_runs,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_removed_waiter_is_never_fired, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
