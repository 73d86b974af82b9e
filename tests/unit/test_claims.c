/*
 * test_claims — the atomic claim: two workers racing for 1,000 DISPATCHED
 * steps; every step is claimed exactly once per epoch, and guarded updates
 * from a stale epoch change nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/mem.h"
#include "store/store.h"
#include "step_seed.h"

#define STEPS 1000
static const char XID[] = "1111111111111111111111111111111111111111111111111111111111111111";

static char dir[64];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/idemflow-claims-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char url[128];
    snprintf(url, sizeof url, "sqlite:%s/t.db", dir);
    struct store *s = NULL;
    assert_int_equal(store_open(url, &s, NULL), 0);
    int created;
    assert_int_equal(store_workspace_put(s, "ws", "{}", &created, NULL), 0);
    struct step_seed sd = {"ws", XID, STEPS, STEP_DISPATCHED, 'v', 0};
    assert_int_equal(store_tx_run(s, step_seed_tx, &sd, NULL), 0);
    *state = s;
    return 0;
}

static int teardown(void **state)
{
    store_close(*state);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

struct racer {
    struct store *s;
    char name[16];
    int claimed[STEPS];
    int64_t epoch[STEPS];
    int total;
};

static void *race(void *arg)
{
    struct racer *r = arg;
    for (;;) {
        struct store_claim *c = NULL;
        size_t n = 0;
        if (store_claim(r->s, r->name, 7, clock_now_ms(), 60000, &c, &n, NULL) || n == 0) {
            store_claims_free(c, n);
            return NULL;
        }
        for (size_t i = 0; i < n; i++) {
            int k = atoi(c[i].vertex + 1);
            r->claimed[k]++;
            r->epoch[k] = c[i].epoch;
            r->total++;
        }
        store_claims_free(c, n);
    }
}

static void test_two_workers_race_for_1000_steps(void **state)
{
    struct store *s = *state;
    struct racer *a = xcalloc(1, sizeof *a), *b = xcalloc(1, sizeof *b);
    a->s = b->s = s;
    snprintf(a->name, sizeof a->name, "worker-a");
    snprintf(b->name, sizeof b->name, "worker-b");
    pthread_t ta, tb;
    pthread_create(&ta, NULL, race, a);
    pthread_create(&tb, NULL, race, b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a->total + b->total, STEPS);
    for (int k = 0; k < STEPS; k++) {
        assert_int_equal(a->claimed[k] + b->claimed[k], 1);
        assert_int_equal(a->claimed[k] ? a->epoch[k] : b->epoch[k], 1);
    }
    /* every claim left an attempt row naming its worker */
    struct store_attempt *at = NULL;
    size_t na = 0;
    assert_int_equal(store_attempts_get(s, XID, &at, &na, NULL), 0);
    assert_int_equal(na, STEPS);
    store_attempts_free(at, na);
    free(a);
    free(b);
}

struct guarded {
    int64_t epoch;
    int changed;
};

static int tx_complete(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct guarded *g = arg;
    struct store_step st = {0};
    snprintf(st.execution_id, sizeof st.execution_id, "%s", XID);
    st.vertex = "v0000";
    st.workspace = "ws";
    st.kind = "TRANSFORM";
    st.state = STEP_COMPLETED;
    st.epoch = g->epoch;
    st.output = "\"done\"";
    return store_tx_step_update(tx, &st, STEP_EXECUTING, g->epoch, &g->changed, e);
}

static void test_stale_epoch_is_fenced(void **state)
{
    struct store *s = *state;
    struct store_claim *c = NULL;
    size_t n = 0;
    assert_int_equal(store_claim(s, "w", 1, clock_now_ms(), 60000, &c, &n, NULL), 0);
    assert_int_equal(n, 1);
    int64_t epoch = c[0].epoch;
    int ok = 0;
    assert_int_equal(store_lease_renew(s, XID, c[0].vertex, epoch + 1, 0, 1, &ok, NULL), 0);
    assert_false(ok);
    assert_int_equal(store_lease_renew(s, XID, c[0].vertex, epoch, clock_now_ms(),
                                       clock_now_ms() + 1000, &ok, NULL),
                     0);
    assert_true(ok);
    /* a lease that ran out is not revived: another process may be
     * recovering the step while this one would go on and send its call */
    int64_t later = clock_now_ms() + 3600 * 1000;
    assert_int_equal(store_lease_renew(s, XID, c[0].vertex, epoch, later, later + 1000, &ok, NULL),
                     0);
    assert_false(ok);
    struct guarded stale = {epoch - 1, -1}, fresh = {epoch, -1}, again = {epoch, -1};
    assert_int_equal(store_tx_run(s, tx_complete, &stale, NULL), 0);
    assert_int_equal(stale.changed, 0);
    assert_int_equal(store_tx_run(s, tx_complete, &fresh, NULL), 0);
    assert_int_equal(fresh.changed, 1);
    /* once COMPLETED, even the right epoch cannot complete it again */
    assert_int_equal(store_tx_run(s, tx_complete, &again, NULL), 0);
    assert_int_equal(again.changed, 0);
    store_claims_free(c, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_workers_race_for_1000_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_epoch_is_fenced, setup, teardown),
    };
    return cmocka_run_group_tests_name("claims", tests, NULL, NULL);
}
