/*
 * store_idem_check.h — the Idempotency-Key records of spec §7 through the
 * public store interface.  Included by test_store.c (SQLite) and
 * test_store_pg.c (PostgreSQL), so that both backends run the same checks.
 */
#ifndef IFL_TESTS_STORE_IDEM_CHECK_H
#define IFL_TESTS_STORE_IDEM_CHECK_H

#include "store/store.h"

struct idem_op {
    const char *key;
    int set; /* 0: store_tx_idem_put, 1: store_tx_idem_set */
    struct store_idem rec;
    int created;
    struct store_idem old; /* owned */
};

static int idem_tx(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct idem_op *o = arg;
    store_idem_clear(&o->old);
    o->created = 0;
    if (o->set)
        return store_tx_idem_set(tx, "ws", "retry", o->key, &o->rec, e);
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
                          .rec = {.fingerprint = "fp1",
                                  .status = 200,
                                  .response = "{\"a\":1}",
                                  .created_at = t0 + 5}};
    assert_int_equal(store_tx_run(s, idem_tx, &set, &e), 0);
    assert_int_equal(store_tx_run(s, idem_tx, &put, &e), 0);
    assert_int_equal(put.created, 0);
    assert_int_equal(put.old.status, 200);
    assert_string_equal(put.old.response, "{\"a\":1}");
    assert_int_equal(put.old.created_at, t0 + 5);
    /* there is nothing to overwrite under another key */
    set.key = "k2";
    assert_int_equal(store_tx_run(s, idem_tx, &set, &e), IFL_ESTORE);
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

#endif
