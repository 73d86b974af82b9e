/*
 * test_wfcache — the engine's compiled workflow versions (engine.c,
 * engine_workflow_get): past the budget the least recently used versions
 * that are not their workflow's latest are dropped and compiled again when
 * next asked for; a reference taken before the drop keeps its version
 * alive (under ASan a freed one would be a use after free); a workflow's
 * latest version is never dropped.  Real SQLite store, no server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "engine/engine.h"
#include "engine/workflow.h"
#include "store/store.h"

#include "engine_fixture.h"

/* A definition of about 300 bytes whose TRANSFORM outputs its version `v`
 * (so a recompiled version can be told from another). */
static json_t *def_of(int v)
{
    json_t *d = json_pack("{s:{s:{s:s}, s:{s:s, s:{s:{s:i, s:s}}}}, s:[{s:s, s:s}]}", "vertices",
                          "start", "type", "ENTRY_POINT", "out", "type", "TRANSFORM", "config",
                          "output", "v", v, "pad",
                          "................................................................"
                          "................................................................"
                          "................................................................",
                          "edges", "from", "start", "to", "out");
    assert_non_null(d);
    return d;
}

static int setup(void **state)
{
    /* room for about four of def_of's versions */
    struct engine_opts o = {.workflow_cache_bytes = 1200};
    struct fixture *f = engine_fixture_new("wfcache", &o);
    int created = 0;
    assert_int_equal(store_workspace_put(f->s, "ws", "{}", &created, NULL), 0);
    *state = f;
    return 0;
}

static void put_version(struct fixture *f, const char *wf, int want)
{
    json_t *d = def_of(want);
    int version = 0;
    struct ifl_err e = {0};
    assert_int_equal(engine_workflow_put(f->g, "ws", wf, d, &version, &e), 0);
    assert_int_equal(version, want);
    json_decref(d);
}

/* The `v` its TRANSFORM outputs, read from the compiled definition. */
static int v_of(const struct wf *w)
{
    long vi = wf_vertex_index(w, "out");
    assert_true(vi >= 0);
    json_t *cfg =
        json_object_get(json_object_get(json_object_get(w->def, "vertices"), "out"), "config");
    return (int)json_number_value(json_object_get(json_object_get(cfg, "output"), "v"));
}

static const struct wf *get(struct fixture *f, const char *wf, int version)
{
    const struct wf *w = NULL;
    int got = 0;
    struct ifl_err e = {0};
    assert_int_equal(engine_workflow_get(f->g, "ws", wf, version, &w, &got, &e), 0);
    assert_non_null(w);
    if (version)
        assert_int_equal(got, version);
    return w;
}

static void test_old_versions_past_the_budget_are_dropped_and_compiled_again(void **state)
{
    struct fixture *f = *state;
    const struct engine_metrics *m = engine_metrics(f->g);
    put_version(f, "a", 1);
    const struct wf *held = get(f, "a", 1); /* held across the drops below */
    for (int v = 2; v <= 40; v++)
        put_version(f, "a", v);
    assert_true(atomic_load(&m->wf_evicted) > 0);
    /* bounded: the budget's bytes, or its 3/4 plus the last one put */
    assert_true(atomic_load(&m->wf_compiled_bytes) <= 1200);
    assert_true(atomic_load(&m->wf_compiled) <= 5);
    /* the held reference still reads its own version */
    assert_int_equal(v_of(held), 1);
    /* asked for again, it is compiled again: a different object, the same
     * definition */
    const struct wf *again = get(f, "a", 1);
    assert_ptr_not_equal(again, held);
    assert_int_equal(v_of(again), 1);
    wf_release(held);
    wf_release(again);
    /* every version still comes back right, however often the cache turns */
    for (int v = 1; v <= 40; v++) {
        const struct wf *w = get(f, "a", v);
        assert_int_equal(v_of(w), v);
        wf_release(w);
    }
    assert_true(atomic_load(&m->wf_compiled_bytes) <= 1200);
}

static void test_a_workflows_latest_version_is_never_dropped(void **state)
{
    struct fixture *f = *state;
    put_version(f, "keep", 1);
    /* held, so that a dropped and recompiled version cannot come back at
     * its address */
    const struct wf *latest = get(f, "keep", 0);
    /* another workflow's versions push the budget many times over */
    for (int v = 1; v <= 30; v++)
        put_version(f, "churn", v);
    for (int v = 1; v <= 30; v++)
        wf_release(get(f, "churn", v));
    /* still the same object: found in the cache, not compiled again */
    const struct wf *w = get(f, "keep", 0);
    assert_ptr_equal(w, latest);
    assert_int_equal(v_of(w), 1);
    wf_release(w);
    wf_release(latest);
}

int main(void)
{
    log_set_level(LOG_WARN); /* not a line per migration and put */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(
            test_old_versions_past_the_budget_are_dropped_and_compiled_again, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_workflows_latest_version_is_never_dropped, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
