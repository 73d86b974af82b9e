/*
 * store_checks.h — checks of the store through its public interface that
 * both backends must pass: the Idempotency-Key records of spec §7, the
 * ordering keys of spec §8 and the schedule ticks of spec §9.  Included by test_store.c (SQLite) and
 * test_store_pg.c (PostgreSQL).
 */
#ifndef IFL_TESTS_STORE_CHECKS_H
#define IFL_TESTS_STORE_CHECKS_H

#include "store/store.h"

struct idem_op {
    const char *key;
    int set; /* 0: store_tx_idem_put, 1: store_tx_idem_set */
    struct store_idem rec;
    int64_t expect; /* store_tx_idem_set's expect_created_at */
    int created, changed;
    struct store_idem old; /* owned */
};

static int idem_tx(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct idem_op *o = arg;
    store_idem_clear(&o->old);
    o->created = 0;
    if (o->set) {
        int changed = 0;
        int rc = store_tx_idem_set(tx, "ws", "retry", o->key, &o->rec, o->expect, &changed, e);
        o->changed = changed;
        return rc;
    }
    return store_tx_idem_put(tx, "ws", "retry", o->key, &o->rec, &o->created, &o->old, e);
}

static void check_idem_records(struct store *s)
{
    struct ifl_err e = {0};
    struct idem_op put = {.key = "k1", .rec = {.fingerprint = "fp1", .response = "null"}};
    assert_int_equal(store_tx_run(s, idem_tx, &put, &e), 0);
    assert_int_equal(put.created, 1);
    /* a second claim finds the first, with the time it was made */
    assert_int_equal(store_tx_run(s, idem_tx, &put, &e), 0);
    assert_int_equal(put.created, 0);
    assert_string_equal(put.old.fingerprint, "fp1");
    assert_int_equal(put.old.status, 0);
    int64_t t0 = put.old.created_at;
    assert_true(t0 > 0);
    /* the answer overwrites the claim, its time included */
    struct idem_op set = {.key = "k1",
                          .set = 1,
                          .expect = t0 + 1,
                          .rec = {.fingerprint = "fp1",
                                  .status = 200,
                                  .response = "{\"a\":1}",
                                  .created_at = t0 + 5}};
    /* a compare-and-set on another time changes nothing */
    assert_int_equal(store_tx_run(s, idem_tx, &set, &e), 0);
    assert_int_equal(set.changed, 0);
    set.expect = t0;
    assert_int_equal(store_tx_run(s, idem_tx, &set, &e), 0);
    assert_int_equal(set.changed, 1);
    assert_int_equal(store_tx_run(s, idem_tx, &put, &e), 0);
    assert_int_equal(put.created, 0);
    assert_int_equal(put.old.status, 200);
    assert_string_equal(put.old.response, "{\"a\":1}");
    assert_int_equal(put.old.created_at, t0 + 5);
    /* there is nothing to overwrite under another key */
    set.key = "k2";
    set.expect = -1;
    assert_int_equal(store_tx_run(s, idem_tx, &set, &e), 0);
    assert_int_equal(set.changed, 0);
    /* expiry deletes only records made before the cut-off, at most `limit` */
    struct idem_op other = {.key = "k3", .rec = {.fingerprint = "fp3", .response = "null"}};
    assert_int_equal(store_tx_run(s, idem_tx, &other, &e), 0);
    assert_int_equal(other.created, 1);
    int n = -1;
    assert_int_equal(store_idem_expire(s, t0, 10, &n, &e), 0);
    assert_int_equal(n, 0);
    assert_int_equal(store_idem_expire(s, INT64_MAX, 1, &n, &e), 0);
    assert_int_equal(n, 1);
    assert_int_equal(store_idem_expire(s, INT64_MAX, 10, &n, &e), 0);
    assert_int_equal(n, 1);
    /* gone: the key can be claimed again */
    assert_int_equal(store_tx_run(s, idem_tx, &put, &e), 0);
    assert_int_equal(put.created, 1);
    store_idem_clear(&put.old);
    store_idem_clear(&other.old);
}

struct ordering_op {
    struct store_ordering o;
    int advanced, had_last;
    int64_t last;
};

static int ordering_tx(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct ordering_op *a = arg;
    return store_tx_ordering_advance(tx, &a->o, &a->advanced, &a->had_last, &a->last, e);
}

/* Advances (ws, wf, ep, key) to version; returns `advanced`, checks what
 * was there before. */
static int advance(struct store *s, const char *key, int64_t version, int want_had,
                   int64_t want_last)
{
    struct ordering_op a = {.o = {"ws", "wf", "ep", key, version}};
    struct ifl_err e = {0};
    assert_int_equal(store_tx_run(s, ordering_tx, &a, &e), 0);
    assert_int_equal(a.had_last, want_had);
    if (want_had)
        assert_int_equal(a.last, want_last);
    return a.advanced;
}

static void check_ordering_keys(struct store *s)
{
    assert_int_equal(advance(s, "\"k\"", 5, 0, 0), 1);   /* a new key takes any version */
    assert_int_equal(advance(s, "\"k\"", 5, 1, 5), 0);   /* the same: not newer */
    assert_int_equal(advance(s, "\"k\"", 3, 1, 5), 0);   /* older */
    assert_int_equal(advance(s, "\"k\"", 9, 1, 5), 1);   /* newer, past a gap */
    assert_int_equal(advance(s, "\"k\"", 8, 1, 9), 0);   /* the gap stays behind */
    assert_int_equal(advance(s, "\"k2\"", -4, 0, 0), 1); /* keys are independent */
    assert_int_equal(advance(s, "\"k2\"", -3, 1, -4), 1);
    assert_int_equal(advance(s, "\"k\"", 10, 1, 9), 1);
}

struct tick_op {
    struct store_tick t;
    int claimed, superseded;
};

static int tick_tx(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct tick_op *a = arg;
    return store_tx_tick_claim(tx, &a->t, &a->claimed, &a->superseded, e);
}

/* 1 claimed, 0 fired already, -1 superseded by a newer version */
static int claim_tick_of(struct store *s, const char *wf, int version, int64_t at,
                         const char *xid)
{
    struct tick_op a = {.t = {"ws", wf, "ep", at, xid, version}};
    assert_int_equal(store_tx_run(s, tick_tx, &a, NULL), 0);
    assert_false(a.claimed && a.superseded);
    return a.superseded ? -1 : a.claimed;
}

static int claim_tick(struct store *s, int64_t at, const char *xid)
{
    return claim_tick_of(s, "wf", 1, at, xid);
}

static void check_schedule_records(struct store *s)
{
    int created = 0, version = 0;
    assert_int_equal(store_workspace_put(s, "ws", "{}", &created, NULL), 0);
    assert_int_equal(store_workflow_put(s, "ws", "a", "{}", &version, NULL), 0);
    assert_int_equal(store_workflow_put(s, "ws", "a", "{\"v\":2}", &version, NULL), 0);
    assert_int_equal(store_workflow_put(s, "ws", "b", "{}", &version, NULL), 0);
    struct store_workflow *w = NULL;
    size_t n = 0;
    assert_int_equal(store_workflows_latest(s, &w, &n, NULL), 0);
    assert_int_equal(n, 2);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(w[i].workspace, "ws");
        assert_int_equal(w[i].version, strcmp(w[i].name, "a") == 0 ? 2 : 1);
        assert_true(w[i].created_at > 0);
        assert_null(w[i].definition);
    }
    store_workflows_free(w, n);
    /* a tick is fired once */
    assert_int_equal(claim_tick(s, 60000, "x1"), 1);
    assert_int_equal(claim_tick(s, 60000, "x2"), 0);
    assert_int_equal(claim_tick(s, 120000, "x3"), 1);
    int k = -1;
    assert_int_equal(store_ticks_expire(s, 60000, 10, &k, NULL), 0);
    assert_int_equal(k, 0);
    assert_int_equal(store_ticks_expire(s, 60001, 10, &k, NULL), 0);
    assert_int_equal(k, 1);
    assert_int_equal(claim_tick(s, 120000, "x4"), 0);
    /* workflow a's version 2 was put before this tick: version 1's schedule
     * no longer fires it, version 2's does; a tick from before the put
     * still belongs to version 1 */
    int64_t later = (int64_t)4102444800000LL; /* 2100 */
    assert_int_equal(claim_tick_of(s, "a", 1, later, "y1"), -1);
    assert_int_equal(claim_tick_of(s, "a", 2, later, "y2"), 1);
    assert_int_equal(claim_tick_of(s, "a", 1, 60000, "y3"), 1);
}

#endif
