/*
 * test_store — the SQLite backend through the public store interface:
 * migrations, versions, atomic execution creation under concurrency, paging,
 * the one-process lock.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fault.h"
#include "store/store.h"
#include "store/store_int.h"
#include "store_checks.h"

static char dir[64];
static char url[128];

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/idemflow-store-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(url, sizeof url, "sqlite:%s/t.db", dir);
    struct store *s = NULL;
    struct ifl_err e = {0};
    assert_int_equal(store_open(url, &s, &e), 0);
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

static void test_migrations_and_lock(void **state)
{
    struct store *s = *state;
    int v = 0;
    assert_int_equal(store_schema_version(s, &v, NULL), 0);
    assert_true(v >= 1);
    assert_string_equal(store_backend(s), "sqlite");
    struct store *second = NULL;
    struct ifl_err e = {0};
    assert_int_equal(store_open(url, &second, &e), IFL_EBUSY);
    assert_null(second);
    assert_non_null(strstr(e.msg, "in use"));
}

/* A hard link is one more name for the same file, which no path can see
 * through: the lock on the database file itself refuses it. */
static void test_a_hard_link_is_refused_too(void **state)
{
    (void)state;
    char db[128], alias[128], aurl[160];
    snprintf(db, sizeof db, "%s/t.db", dir);
    snprintf(alias, sizeof alias, "%s/alias.db", dir);
    snprintf(aurl, sizeof aurl, "sqlite:%s", alias);
    assert_int_equal(link(db, alias), 0);
    struct store *second = NULL;
    struct ifl_err e = {0};
    assert_int_equal(store_open(aurl, &second, &e), IFL_EBUSY);
    assert_null(second);
    assert_non_null(strstr(e.msg, "in use"));
    struct stat st;
    char wal[160];
    snprintf(wal, sizeof wal, "%s-wal", alias);
    assert_int_not_equal(stat(wal, &st), 0); /* SQLite never opened it */
}

static void test_workspace_and_workflows(void **state)
{
    struct store *s = *state;
    int created = -1, version = 0;
    assert_int_equal(store_workspace_put(s, "ws", "{}", &created, NULL), 0);
    assert_int_equal(created, 1);
    assert_int_equal(store_workspace_put(s, "ws", "{}", &created, NULL), 0);
    assert_int_equal(created, 0);
    assert_int_equal(store_workspace_exists(s, "ws", NULL), 0);
    assert_int_equal(store_workspace_exists(s, "nope", NULL), IFL_ENOTFOUND);
    assert_int_equal(store_workflow_put(s, "nope", "wf", "{}", &version, NULL), IFL_ENOTFOUND);
    assert_int_equal(store_workflow_put(s, "ws", "wf", "{\"v\":1}", &version, NULL), 0);
    assert_int_equal(version, 1);
    assert_int_equal(store_workflow_put(s, "ws", "wf", "{\"v\":2}", &version, NULL), 0);
    assert_int_equal(version, 2);
    struct store_workflow w;
    assert_int_equal(store_workflow_get(s, "ws", "wf", 0, &w, NULL), 0);
    assert_int_equal(w.version, 2);
    assert_string_equal(w.definition, "{\"v\":2}");
    store_workflow_clear(&w);
    assert_int_equal(store_workflow_get(s, "ws", "wf", 1, &w, NULL), 0);
    assert_string_equal(w.definition, "{\"v\":1}");
    store_workflow_clear(&w);
    assert_int_equal(store_workflow_get(s, "ws", "wf", 3, &w, NULL), IFL_ENOTFOUND);
}

static void test_secrets(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    assert_int_equal(store_secret_put(s, "ws", "B", "v1:bbb", NULL, NULL), 0);
    assert_int_equal(store_secret_put(s, "ws", "A", "v1:aaa", NULL, NULL), 0);
    assert_int_equal(store_secret_put(s, "ws", "A", "v1:aa2", NULL, NULL), 0);
    assert_int_equal(store_secret_put(s, "ghost", "A", "x", NULL, NULL), IFL_ENOTFOUND);
    char **names;
    size_t n;
    assert_int_equal(store_secret_list(s, "ws", &names, &n, NULL), 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "A");
    assert_string_equal(names[1], "B");
    store_strv_free(names, n);
    char *sealed;
    assert_int_equal(store_secret_get(s, "ws", "A", &sealed, NULL), 0);
    assert_string_equal(sealed, "v1:aa2");
    free(sealed);
    check_retired(s);
}

static void fill(struct store_execution *x, const char *id, const char *payload)
{
    memset(x, 0, sizeof *x);
    snprintf(x->id, sizeof x->id, "%s", id);
    x->workspace = "ws";
    x->workflow = "wf";
    x->workflow_version = 1;
    x->entry_point = "start";
    x->identity = "{\"mode\":\"payload\"}";
    x->payload = (char *)payload;
    snprintf(x->payload_hash, sizeof x->payload_hash, "%064d", (int)strlen(payload));
}

struct racer {
    struct store *s;
    int created;
    int rc;
};

static void *race(void *arg)
{
    struct racer *r = arg;
    struct store_execution x, existing;
    fill(&x, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "{\"n\":1}");
    r->rc = store_execution_create(r->s, &x, &r->created, &existing, NULL);
    if (!r->created)
        store_execution_clear(&existing);
    return NULL;
}

static void test_concurrent_create_has_one_winner(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    enum { N = 32 };
    pthread_t t[N];
    struct racer r[N];
    for (int i = 0; i < N; i++) {
        r[i] = (struct racer){.s = s};
        pthread_create(&t[i], NULL, race, &r[i]);
    }
    int winners = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(r[i].rc, 0);
        winners += r[i].created;
    }
    assert_int_equal(winners, 1);
    struct store_execution *items;
    size_t n;
    char *next;
    assert_int_equal(store_execution_list(s, "ws", NULL, 100, &items, &n, &next, NULL), 0);
    assert_int_equal(n, 1);
    assert_null(next);
    assert_string_equal(items[0].status, "running");
    assert_int_equal(items[0].version, 0); /* events bump it; none here */
    store_execution_list_free(items, n);
}

static void test_existing_row_returned_and_unknown_workspace(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    struct store_execution x, existing;
    const char *id = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    fill(&x, id, "{\"first\":true}");
    assert_int_equal(store_execution_create(s, &x, &created, &existing, NULL), 0);
    assert_int_equal(created, 1);
    fill(&x, id, "{\"second\":true}");
    assert_int_equal(store_execution_create(s, &x, &created, &existing, NULL), 0);
    assert_int_equal(created, 0);
    assert_string_equal(existing.payload, "{\"first\":true}");
    store_execution_clear(&existing);
    fill(&x, "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc", "{}");
    x.workspace = "ghost";
    assert_int_equal(store_execution_create(s, &x, &created, &existing, NULL), IFL_ENOTFOUND);
    struct store_execution got;
    assert_int_equal(store_execution_get(s, "ws", id, &got, NULL), 0);
    assert_string_equal(got.payload, "{\"first\":true}");
    store_execution_clear(&got);
    assert_int_equal(store_execution_get(s, "other", id, &got, NULL), IFL_ENOTFOUND);
}

struct batch_arg {
    char id[65];
    int fail; /* write, then fail */
    int runs;
};

static int insert_then_maybe_fail(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct batch_arg *a = arg;
    a->runs++;
    struct store_execution x;
    fill(&x, a->id, "{}");
    int created = 0;
    int rc = store_tx_execution_insert(tx, &x, &created, e);
    if (!rc && a->fail)
        rc = err_set(e, IFL_EINVAL, "planned failure");
    return rc;
}

/* One batch (one commit), five transactions, the middle one fails after
 * writing: it rolls back alone, the four others commit. */
static void test_a_failing_job_does_not_poison_its_batch(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    enum { N = 5 };
    struct batch_arg a[N];
    void *args[N];
    int rcs[N];
    struct ifl_err errs[N];
    for (int i = 0; i < N; i++) {
        a[i] = (struct batch_arg){.fail = i == 2};
        memset(a[i].id, 'd' + i, 64);
        a[i].id[64] = '\0';
        args[i] = &a[i];
    }
    store_tx_run_many(s, insert_then_maybe_fail, args, N, rcs, errs);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rcs[i], i == 2 ? IFL_EINVAL : 0);
        struct store_execution got;
        assert_int_equal(store_execution_get(s, "ws", a[i].id, &got, NULL),
                         i == 2 ? IFL_ENOTFOUND : 0);
        if (i != 2)
            store_execution_clear(&got);
    }
    assert_string_equal(errs[2].msg, "planned failure");
    /* A batch where every job succeeds runs each job once (the batch with
     * a failure may have run its jobs twice: store.h allows it). */
    for (int i = 0; i < N; i++) {
        a[i] = (struct batch_arg){.fail = 0};
        memset(a[i].id, 'm' + i, 64);
        a[i].id[64] = '\0';
    }
    store_tx_run_many(s, insert_then_maybe_fail, args, N, rcs, errs);
    for (int i = 0; i < N; i++) {
        assert_int_equal(rcs[i], 0);
        assert_int_equal(a[i].runs, 1);
    }
    /* A lone failing transaction: its error, nothing written, run once. */
    struct batch_arg lone = {.fail = 1};
    memset(lone.id, 'k', 64);
    lone.id[64] = '\0';
    struct ifl_err e = {0};
    assert_int_equal(store_tx_run(s, insert_then_maybe_fail, &lone, &e), IFL_EINVAL);
    assert_int_equal(lone.runs, 1);
    struct store_execution got;
    assert_int_equal(store_execution_get(s, "ws", lone.id, &got, NULL), IFL_ENOTFOUND);
}

/* store_tx_run_many_ordered runs a batch in its keys' byte order (ties in
 * their order), so two batches lock shared rows in one order, and hands the
 * results back in the caller's order. */
struct ordered_arg {
    const char *key;
    int fail;
    int stamp; /* when it ran (the last run, if the batch ran twice) */
};
static int ordered_clock;

static const char *ordered_key(const void *arg)
{
    return ((const struct ordered_arg *)arg)->key;
}

static int stamp_then_maybe_fail(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    (void)tx;
    struct ordered_arg *a = arg;
    a->stamp = ++ordered_clock;
    return a->fail ? err_set(e, IFL_EINVAL, "planned failure of %s", a->key) : 0;
}

static void test_ordered_batches_run_in_key_order(void **state)
{
    struct store *s = *state;
    enum { N = 5 };
    static const char *const keys[N] = {"c", "a2", "b", "a1", "b"};
    struct ordered_arg a[N];
    void *args[N];
    int rcs[N];
    struct ifl_err errs[N];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            a[i] = (struct ordered_arg){.key = keys[i], .fail = round == 1 && i == 2};
            args[i] = &a[i];
            rcs[i] = -1;
        }
        store_tx_run_many_ordered(s, stamp_then_maybe_fail, args, ordered_key, N, rcs, errs);
        /* a1 < a2 < b (index 2) < b (index 4) < c */
        assert_true(a[3].stamp < a[1].stamp);
        assert_true(a[1].stamp < a[2].stamp);
        assert_true(a[2].stamp < a[4].stamp);
        assert_true(a[4].stamp < a[0].stamp);
        for (int i = 0; i < N; i++)
            assert_int_equal(rcs[i], round == 1 && i == 2 ? IFL_EINVAL : 0);
    }
    assert_string_equal(errs[2].msg, "planned failure of b");
}

/* Events appended in a transaction are inserted in batches of a few rows
 * (store_sqlite: tx_events_flush): every one is there after the commit, in
 * append order with consecutive positions, across a batch boundary; a
 * transaction that fails after appending leaves none. */
struct ev_arg {
    int n, fail;
    const char *tag;
};

static int append_events(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct ev_arg *a = arg;
    for (int i = 0; i < a->n; i++) {
        char type[32], data[64];
        snprintf(type, sizeof type, "%s.%d", a->tag, i);
        snprintf(data, sizeof data, "{\"i\":%d}", i);
        struct store_event ev = {.workspace = "ws", .type = type, .data = data};
        int rc = store_tx_event_append(tx, &ev, e);
        if (rc)
            return rc;
    }
    return a->fail ? err_set(e, IFL_EINVAL, "planned failure") : 0;
}

static void test_events_arrive_in_order_or_not_at_all(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    struct ev_arg ok = {11, 0, "ok"}, bad = {6, 1, "bad"}, last = {1, 0, "last"};
    void *args[3] = {&ok, &bad, &last};
    int rcs[3];
    store_tx_run_many(s, append_events, args, 3, rcs, NULL);
    assert_int_equal(rcs[0], 0);
    assert_int_equal(rcs[1], IFL_EINVAL);
    assert_int_equal(rcs[2], 0);
    struct store_event *evs = NULL;
    size_t n = 0;
    assert_int_equal(store_events_list(s, "ws", NULL, 100, &evs, &n, NULL), 0);
    assert_int_equal(n, 12);
    for (size_t i = 0; i < n; i++) {
        char type[32], data[64];
        snprintf(type, sizeof type, i < 11 ? "ok.%zu" : "last.0", i);
        snprintf(data, sizeof data, "{\"i\":%zu}", i < 11 ? i : 0);
        assert_string_equal(evs[i].type, type);
        assert_string_equal(evs[i].data, data);
        assert_int_equal(strlen(evs[i].id), 64);
        if (i)
            assert_int_equal(evs[i].seq, evs[i - 1].seq + 1);
    }
    store_events_free(evs, n);
}

/* An execution's steps created in one call (four rows a statement): all six
 * are there with every column as given, and steps of an execution that does
 * not exist are refused. */
struct steps_arg {
    struct store_execution x;
    struct store_step rows[6];
};

static int create_with_steps(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct steps_arg *a = arg;
    int created = 0;
    int rc = store_tx_execution_insert(tx, &a->x, &created, e);
    return rc ? rc : store_tx_steps_insert(tx, a->rows, 6, e);
}

static int steps_only(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    return store_tx_steps_insert(tx, ((struct steps_arg *)arg)->rows, 6, e);
}

static void test_steps_inserted_together(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    struct steps_arg a;
    char id[65];
    memset(id, 'p', 64);
    id[64] = '\0';
    fill(&a.x, id, "{}");
    char names[6][8], outs[6][16];
    for (int i = 0; i < 6; i++) {
        snprintf(names[i], sizeof names[i], "v%d", i);
        snprintf(outs[i], sizeof outs[i], "{\"o\":%d}", i);
        a.rows[i] = (struct store_step){.vertex = names[i],
                                        .workspace = "ws",
                                        .kind = "TRANSFORM",
                                        .state = i % 2 ? STEP_PENDING : STEP_COMPLETED,
                                        .attempts = i,
                                        .epoch = 10 + i,
                                        .next_run_at = 100 + i,
                                        .in_decided = i,
                                        .in_taken = i / 2,
                                        .output = i % 2 ? NULL : outs[i]};
        snprintf(a.rows[i].execution_id, sizeof a.rows[i].execution_id, "%s", id);
    }
    struct ifl_err e = {0};
    assert_int_equal(store_tx_run(s, create_with_steps, &a, &e), 0);
    struct store_execution got;
    struct store_step *rows = NULL;
    size_t n = 0;
    assert_int_equal(store_execution_load(s, "ws", id, &got, &rows, &n, &e), 0);
    assert_int_equal(n, 6);
    for (size_t i = 0; i < n; i++) { /* ordered by vertex: v0 .. v5 */
        assert_string_equal(rows[i].vertex, names[i]);
        assert_int_equal(rows[i].state, i % 2 ? STEP_PENDING : STEP_COMPLETED);
        assert_int_equal(rows[i].attempts, (int)i);
        assert_int_equal(rows[i].epoch, 10 + (int64_t)i);
        assert_int_equal(rows[i].next_run_at, 100 + (int64_t)i);
        assert_int_equal(rows[i].in_decided, (int)i);
        assert_int_equal(rows[i].in_taken, (int)i / 2);
        if (i % 2)
            assert_null(rows[i].output);
        else
            assert_string_equal(rows[i].output, outs[i]);
    }
    store_steps_free(rows, n);
    store_execution_clear(&got);
    /* steps of an execution that does not exist: refused, nothing written */
    memset(id, 'q', 64);
    for (int i = 0; i < 6; i++)
        snprintf(a.rows[i].execution_id, sizeof a.rows[i].execution_id, "%s", id);
    struct steps_arg *b = &a;
    assert_int_not_equal(store_tx_run(s, steps_only, b, &e), 0);
}

/* Submitted transactions: each caller's done runs once, after its
 * transaction committed (its row is there) or rolled back alone (not), on
 * another thread than the submitter's; the submitter never waits. */
struct submit_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done, rcs[8];
    char msgs[8][sizeof(struct ifl_err){0}.msg];
    pthread_t threads[8];
};

struct submit_one {
    struct batch_arg a;
    struct submit_wait *w;
    int i;
};

static void submitted_done(void *arg, int rc, const struct ifl_err *e)
{
    struct submit_one *o = arg;
    pthread_mutex_lock(&o->w->mu);
    o->w->rcs[o->i] = rc;
    snprintf(o->w->msgs[o->i], sizeof o->w->msgs[o->i], "%s", rc ? e->msg : "");
    o->w->threads[o->i] = pthread_self();
    o->w->done++;
    pthread_cond_signal(&o->w->cv);
    pthread_mutex_unlock(&o->w->mu);
}

static void test_submitted_transactions_call_back_after_commit(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    assert_int_equal(store_can_submit(s), 1);
    enum { N = 8 };
    struct submit_wait w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    struct submit_one o[N];
    for (int i = 0; i < N; i++) {
        o[i] = (struct submit_one){.a = {.fail = i == 5}, .w = &w, .i = i};
        memset(o[i].a.id, 'm' + i, 64);
        o[i].a.id[64] = '\0';
        w.rcs[i] = 99;
        assert_int_equal(store_tx_submit(s, insert_then_maybe_fail, &o[i].a, submitted_done, &o[i]),
                         0);
    }
    pthread_mutex_lock(&w.mu);
    while (w.done < N)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    for (int i = 0; i < N; i++) {
        assert_int_equal(w.rcs[i], i == 5 ? IFL_EINVAL : 0);
        /* twice when its batch held the failing one (store.h allows it) */
        assert_in_range(o[i].a.runs, 1, 2);
        assert_false(pthread_equal(w.threads[i], pthread_self()));
        struct store_execution got;
        assert_int_equal(store_execution_get(s, "ws", o[i].a.id, &got, NULL),
                         i == 5 ? IFL_ENOTFOUND : 0);
        if (i != 5)
            store_execution_clear(&got);
    }
    assert_string_equal(w.msgs[5], "planned failure");
}

/* Sustained writes keep the WAL bounded: the store checkpoints past 2000
 * frames (8 MB) and the writer finishes each checkpoint so that SQLite
 * rewinds the WAL.  Before that, a writer that never paused outran every
 * background checkpoint and the WAL grew by all that was written. */
struct flood {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inflight, failed;
};

static void flood_done(void *arg, int rc, const struct ifl_err *e)
{
    (void)e;
    struct flood *f = arg;
    pthread_mutex_lock(&f->mu);
    f->inflight--;
    f->failed += rc != 0;
    pthread_cond_signal(&f->cv);
    pthread_mutex_unlock(&f->mu);
}

struct flood_row {
    char id[65];
    const char *payload;
};

static int flood_insert(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct flood_row *r = arg;
    struct store_execution x;
    fill(&x, r->id, r->payload);
    int created = 0;
    return store_tx_execution_insert(tx, &x, &created, e);
}

/* Floods the store with ROWS rows of ROW_BYTES bytes (WINDOW in flight);
 * the WAL's largest size seen. */
static off_t flood_wal(struct store *s)
{
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    enum { ROWS = 4000, ROW_BYTES = 12000, WINDOW = 48 };
    char *payload = malloc(ROW_BYTES + 16);
    assert_non_null(payload);
    int n = snprintf(payload, 16, "{\"p\":\"");
    memset(payload + n, 'x', ROW_BYTES);
    snprintf(payload + n + ROW_BYTES, 16, "\"}");
    struct flood_row *rows = calloc(ROWS, sizeof *rows);
    assert_non_null(rows);
    struct flood f = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    char wal[160];
    snprintf(wal, sizeof wal, "%s/t.db-wal", dir);
    off_t max_wal = 0;
    for (int i = 0; i < ROWS; i++) {
        snprintf(rows[i].id, sizeof rows[i].id, "%064d", i);
        rows[i].payload = payload;
        pthread_mutex_lock(&f.mu);
        while (f.inflight >= WINDOW)
            pthread_cond_wait(&f.cv, &f.mu);
        f.inflight++;
        pthread_mutex_unlock(&f.mu);
        assert_int_equal(store_tx_submit(s, flood_insert, &rows[i], flood_done, &f), 0);
        struct stat st;
        if (stat(wal, &st) == 0 && st.st_size > max_wal)
            max_wal = st.st_size;
    }
    pthread_mutex_lock(&f.mu);
    while (f.inflight > 0)
        pthread_cond_wait(&f.cv, &f.mu);
    pthread_mutex_unlock(&f.mu);
    assert_int_equal(f.failed, 0);
    struct store_execution got;
    assert_int_equal(store_execution_get(s, "ws", rows[ROWS - 1].id, &got, NULL), 0);
    store_execution_clear(&got);
    fprintf(stderr, "# largest WAL: %lld bytes for %d rows of %d bytes\n", (long long)max_wal, ROWS,
            ROW_BYTES);
    free(rows);
    free(payload);
    return max_wal;
}

/* ≈ 48 MB go through the WAL; it never holds more than 3 checkpoints' worth
 * (2,000 frames each of a 4 KiB page and its 24-byte header). */
static void test_the_wal_stays_bounded_under_sustained_writes(void **state)
{
    off_t max_wal = flood_wal(*state);
    assert_true(max_wal > 0);
    assert_true(max_wal < 3 * 2000 * (4096 + 24));
}

/* The checkpointer starved (each of its passes stalls a second, as on a
 * machine whose CPU or disk other work holds): the writer holds its batches
 * back past 5,000 frames and copies the WAL itself — writes wait, the WAL
 * stays bounded.  Arms a fault point for the rest of the process: the
 * group's last test. */
static int setup_starved(void **state)
{
    setenv("IDEMFLOW_FAULT", "store.checkpoint:sleep=1000@*", 1);
    fault_init(); /* before the store's threads start */
    return setup(state);
}

static void test_a_starved_checkpointer_holds_the_writes_back(void **state)
{
    off_t max_wal = flood_wal(*state);
    assert_true(max_wal > 0);
    assert_true(max_wal < 3 * 2000 * (4096 + 24));
}

static void test_paging(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    for (int i = 0; i < 10; i++) {
        struct store_execution x;
        char id[65];
        snprintf(id, sizeof id, "%064x", i + 1);
        fill(&x, id, "{}");
        assert_int_equal(store_execution_create(s, &x, &created, NULL, NULL), 0);
        assert_int_equal(created, 1);
    }
    char *after = NULL;
    int total = 0, pages = 0;
    do {
        struct store_execution *items;
        size_t n;
        char *next;
        assert_int_equal(store_execution_list(s, "ws", after, 4, &items, &n, &next, NULL), 0);
        total += (int)n;
        pages++;
        store_execution_list_free(items, n);
        free(after);
        after = next;
    } while (after);
    assert_int_equal(total, 10);
    assert_int_equal(pages, 3);
    struct store_execution *items;
    size_t n;
    char *next;
    assert_int_equal(store_execution_list(s, "ws", "bogus", 4, &items, &n, &next, NULL),
                     IFL_EINVAL);
    assert_int_equal(store_execution_list(s, "ws", NULL, 0, &items, &n, &next, NULL), IFL_EINVAL);
}

static void test_reopen_keeps_data(void **state)
{
    struct store *s = *state;
    int created, version;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    store_workflow_put(s, "ws", "wf", "{}", &version, NULL);
    store_close(s);
    struct ifl_err e = {0};
    assert_int_equal(store_open(url, &s, &e), 0);
    *state = s;
    assert_int_equal(store_workspace_exists(s, "ws", NULL), 0);
    struct store_workflow w;
    assert_int_equal(store_workflow_get(s, "ws", "wf", 0, &w, NULL), 0);
    assert_int_equal(w.version, 1);
    store_workflow_clear(&w);
}

/* The test's database file opened directly with SQLite, beside the store. */
static sqlite3 *raw_db(void)
{
    char path[160];
    snprintf(path, sizeof path, "%s/t.db", dir);
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    return db;
}

/* Closes the store to change its file by hand (*state NULL meanwhile, so
 * that teardown closes nothing if an assert ends the test early). */
static sqlite3 *close_for_surgery(void **state)
{
    store_close(*state);
    *state = NULL;
    return raw_db();
}

/* Opens the store again (its migrations run) into *state. */
static struct store *reopen(void **state)
{
    struct store *s = NULL;
    struct ifl_err e = {0};
    assert_int_equal(store_open(url, &s, &e), 0);
    *state = s;
    return s;
}

/* Migration 12 fills executions.started_over_to from the started_over_from
 * of executions an earlier engine made: each original names its newest new
 * one.  (The column is taken away and the migration run again on reopen.) */
static void test_migration_12_records_earlier_start_overs(void **state)
{
    struct store *s = *state;
    char ids[4][65];
    started_over_seed(s, ids);
    sqlite3 *db = close_for_surgery(state);
    assert_int_equal(sqlite3_exec(db,
                                  "ALTER TABLE executions DROP COLUMN started_over_to;"
                                  "DELETE FROM schema_migrations WHERE version = 12;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
    started_over_check(reopen(state), ids);
}

/* How many instructions of `op` the statement sql compiles to on db. */
static int opcodes(sqlite3 *db, const char *sql, const char *op)
{
    char *explain = sqlite3_mprintf("EXPLAIN %s", sql);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, explain, -1, &st, NULL), SQLITE_OK);
    sqlite3_free(explain);
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW)
        n += strcmp((const char *)sqlite3_column_text(st, 1), op) == 0;
    sqlite3_finalize(st);
    return n;
}

static const char sql_status_change[] = "UPDATE executions SET status = ?1 WHERE seq = ?2";
static const char sql_new_execution[] =
    "INSERT INTO executions (id, workspace, workflow, workflow_version, entry_point, identity,"
    " payload, payload_hash, test, status, version, created_at, updated_at)"
    " VALUES (?1, ?2, ?3, 1, ?4, ?5, ?6, ?7, 0, ?8, 1, ?9, ?9)";

/* Migration 13: the partial index of rare statuses, made by migration 10
 * with an IN list, which SQLite evaluated by building a temporary B-tree
 * on every execution's insert and two on every status change, is made
 * again with ORs.  A database of an earlier engine (the old index, no 13
 * recorded) gets it on open; the list of a rare status still walks it. */
static void test_migration_13_takes_the_temporary_btrees_off_every_write(void **state)
{
    sqlite3 *db = close_for_surgery(state);
    assert_int_equal(sqlite3_exec(db,
                                  "DROP INDEX executions_attention;"
                                  "CREATE INDEX executions_attention ON executions"
                                  " (workspace, status, created_at, id)"
                                  " WHERE status IN " STORE_EXEC_RARE ";"
                                  "DELETE FROM schema_migrations WHERE version = 13;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    /* what the check below sees on the old index */
    assert_int_equal(opcodes(db, sql_status_change, "OpenEphemeral"), 2);
    assert_int_equal(opcodes(db, sql_new_execution, "OpenEphemeral"), 1);
    sqlite3_close(db);
    struct store *s = reopen(state);
    db = raw_db();
    assert_int_equal(opcodes(db, sql_status_change, "OpenEphemeral"), 0);
    assert_int_equal(opcodes(db, sql_new_execution, "OpenEphemeral"), 0);
    /* the store's own list statement still walks the index */
    char *plan = sqlite3_mprintf("EXPLAIN QUERY PLAN %s", store_sqlite_list_rare);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, plan, -1, &st, NULL), SQLITE_OK);
    sqlite3_free(plan);
    int walks = 0;
    while (sqlite3_step(st) == SQLITE_ROW)
        walks |= strstr((const char *)sqlite3_column_text(st, 3), "executions_attention") != NULL;
    sqlite3_finalize(st);
    assert_true(walks);
    /* the three spellings of the set agree on every status */
    static const char *const statuses[] = {
        "running", "completed", "failed", "requires_reconciliation",
        "stale",   "cancelled", "purged"};
    assert_int_equal(sqlite3_prepare_v2(db,
                                        "SELECT status IN " STORE_EXEC_RARE ", " STORE_EXEC_RARE_OR
                                        " FROM (SELECT ?1 AS status)",
                                        -1, &st, NULL),
                     SQLITE_OK);
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++) {
        sqlite3_bind_text(st, 1, statuses[i], -1, SQLITE_STATIC);
        assert_int_equal(sqlite3_step(st), SQLITE_ROW);
        int rare = store_execution_status_rare(statuses[i]);
        assert_int_equal(sqlite3_column_int(st, 0), rare);
        assert_int_equal(sqlite3_column_int(st, 1), rare);
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    check_execution_filters(s); /* and lists each status as before */
}

/* Executions written before a close are found after the reopen (the id
 * filter is rebuilt from the table), and ids never written are not. */
static void test_reopen_finds_every_execution(void **state)
{
    struct store *s = *state;
    int created;
    store_workspace_put(s, "ws", "{}", &created, NULL);
    enum { N = 300 };
    char ids[N][65];
    for (int i = 0; i < N; i++) {
        snprintf(ids[i], sizeof ids[i], "%064x", i * 7919 + 1);
        struct store_execution x, existing;
        fill(&x, ids[i], "{}");
        assert_int_equal(store_execution_create(s, &x, &created, &existing, NULL), 0);
        assert_int_equal(created, 1);
    }
    store_close(s);
    struct ifl_err e = {0};
    assert_int_equal(store_open(url, &s, &e), 0);
    *state = s;
    for (int i = 0; i < N; i++) {
        struct store_execution got;
        assert_int_equal(store_execution_get(s, "ws", ids[i], &got, NULL), 0);
        store_execution_clear(&got);
        char other[65];
        snprintf(other, sizeof other, "%064x", i * 7919 + 2);
        assert_int_equal(store_execution_get(s, "ws", other, &got, &e), IFL_ENOTFOUND);
        assert_non_null(strstr(e.msg, "does not exist"));
    }
}

static void test_schedule_records(void **state)
{
    check_schedule_records(*state);
}

static void test_subscriptions(void **state)
{
    check_subscriptions(*state);
}

static void test_execution_filters(void **state)
{
    check_execution_filters(*state);
}

static void test_ordering_keys(void **state)
{
    check_ordering_keys(*state);
}

static void test_claims_take_turns_across_workspaces(void **state)
{
    check_claim_turns(*state);
}

static void test_a_claim_walks_past_waiting_workspaces(void **state)
{
    check_claim_walks_past_waiting_workspaces(*state);
}

static void test_idempotency_records(void **state)
{
    check_idem_records(*state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_migrations_and_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_hard_link_is_refused_too, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workspace_and_workflows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_secrets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_concurrent_create_has_one_winner, setup, teardown),
        cmocka_unit_test_setup_teardown(test_existing_row_returned_and_unknown_workspace, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_a_failing_job_does_not_poison_its_batch, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ordered_batches_run_in_key_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_events_arrive_in_order_or_not_at_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_steps_inserted_together, setup, teardown),
        cmocka_unit_test_setup_teardown(test_submitted_transactions_call_back_after_commit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_the_wal_stays_bounded_under_sustained_writes, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_paging, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idempotency_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ordering_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_claims_take_turns_across_workspaces, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_claim_walks_past_waiting_workspaces, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_subscriptions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_execution_filters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schedule_records, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reopen_keeps_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reopen_finds_every_execution, setup, teardown),
        cmocka_unit_test_setup_teardown(
            test_migration_13_takes_the_temporary_btrees_off_every_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_migration_12_records_earlier_start_overs, setup,
                                        teardown),
        /* last: it arms a fault point */
        cmocka_unit_test_setup_teardown(test_a_starved_checkpointer_holds_the_writes_back,
                                        setup_starved, teardown),
    };
    return cmocka_run_group_tests_name("store_sqlite", tests, NULL, NULL);
}
