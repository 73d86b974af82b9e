/*
 * test_inline — TRANSFORM successors completed in their predecessor's
 * outcome transaction (steps_apply with step_outcome.inl), on a real SQLite
 * store: applied when the rows are as the worker read them, with an attempt
 * row and an event each; not applied when any row changed meanwhile, nor for
 * a step the outcome did not dispatch; and the dry run (steps_sim) agrees
 * with the join rule.  Also store_execution_load, which workers read them with.
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

#include "base/clock.h"
#include "base/mem.h"
#include "engine/steps.h"
#include "engine/workflow.h"
#include "json/json.h"
#include "store/store.h"

static const char XID[] = "2222222222222222222222222222222222222222222222222222222222222222";

/* start -> a -> b -> c, and a -> j <- x (j joins a and x). */
static const char WF[] =
    "{\"vertices\":{"
    "\"start\":{\"type\":\"ENTRY_POINT\"},"
    "\"a\":{\"type\":\"TRANSFORM\",\"config\":{\"output\":1}},"
    "\"b\":{\"type\":\"TRANSFORM\",\"config\":{\"output\":2}},"
    "\"c\":{\"type\":\"TRANSFORM\",\"config\":{\"output\":3}},"
    "\"x\":{\"type\":\"TRANSFORM\",\"config\":{\"output\":4}},"
    "\"j\":{\"type\":\"TRANSFORM\",\"config\":{\"output\":5}}},"
    "\"edges\":[{\"from\":\"start\",\"to\":\"a\"},{\"from\":\"start\",\"to\":\"x\"},"
    "{\"from\":\"a\",\"to\":\"b\"},{\"from\":\"b\",\"to\":\"c\"},"
    "{\"from\":\"a\",\"to\":\"j\"},{\"from\":\"x\",\"to\":\"j\"}]}";

struct fx {
    char dir[64];
    struct store *s;
    struct wf *w;
};

struct seed {
    const struct wf *w;
};

static int tx_seed(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct seed *sd = arg;
    struct store_execution x = {0};
    snprintf(x.id, sizeof x.id, "%s", XID);
    x.workspace = "ws";
    x.workflow = "wf";
    x.workflow_version = 1;
    x.entry_point = "start";
    x.identity = "{}";
    x.payload = "{}";
    x.status = "running";
    int created;
    int rc = store_tx_execution_insert(tx, &x, &created, e);
    struct decision dec[2] = {{EDGE_TAKEN, NULL}, {EDGE_TAKEN, NULL}};
    long entry = wf_vertex_index(sd->w, "start");
    struct store_step *rows = NULL;
    size_t n = 0;
    const char *status;
    steps_initial(sd->w, (size_t)entry, XID, "ws", "{}", dec, clock_now_ms(), &rows, &n, &status);
    for (size_t i = 0; !rc && i < n; i++)
        rc = store_tx_step_insert(tx, &rows[i], e);
    store_steps_free(rows, n);
    return rc;
}

static int setup(void **state)
{
    struct fx *f = xcalloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/idemflow-inline-XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    char url[128];
    snprintf(url, sizeof url, "sqlite:%s/t.db", f->dir);
    assert_int_equal(store_open(url, &f->s, NULL), 0);
    int created;
    assert_int_equal(store_workspace_put(f->s, "ws", "{}", &created, NULL), 0);
    json_t *def = NULL;
    assert_int_equal(json_parse(WF, strlen(WF), NULL, &def, NULL), 0);
    assert_int_equal(wf_compile(def, &f->w, NULL), 0);
    json_decref(def);
    struct seed sd = {f->w};
    assert_int_equal(store_tx_run(f->s, tx_seed, &sd, NULL), 0);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fx *f = *state;
    store_close(f->s);
    wf_free(f->w);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

static const struct store_step *row(const struct store_step *rows, size_t n, const char *v)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].vertex, v) == 0)
            return &rows[i];
    fail_msg("no row %s", v);
    return NULL;
}

/* Claims every DISPATCHED step once; returns the epoch vertex `v` got
 * (-1 when it was not claimable) and *other that of `o` (may be NULL). */
static int64_t claim(struct store *s, const char *v, const char *o, int64_t *other)
{
    struct store_claim *c = NULL;
    size_t n = 0;
    assert_int_equal(store_claim(s, "w1", 16, clock_now_ms(), 60000, &c, &n, NULL), 0);
    int64_t epoch = -1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(c[i].vertex, v) == 0)
            epoch = c[i].epoch;
        if (o && strcmp(c[i].vertex, o) == 0)
            *other = c[i].epoch;
    }
    store_claims_free(c, n);
    assert_true(epoch >= 0);
    return epoch;
}

struct run {
    struct step_outcome o;
    struct decision taken[2];
    struct step_inline inl[3];
    enum step_state seen_state[8];
    int64_t seen_epoch[8];
};

/* An outcome completing `a` with both edges taken, planning b and c inline,
 * seen = the rows as read now. */
static void prepare(struct fx *f, struct run *r, int64_t epoch)
{
    memset(r, 0, sizeof *r);
    r->taken[0] = r->taken[1] = (struct decision){EDGE_TAKEN, NULL};
    struct store_step *rows = NULL;
    size_t n = 0;
    assert_int_equal(store_steps_get(f->s, XID, &rows, &n, NULL), 0);
    assert_true(n <= 8 && f->w->nv <= 8);
    for (size_t k = 0; k < f->w->nv; k++)
        r->seen_epoch[k] = -1;       /* no row (steps.h) */
    for (size_t i = 0; i < n; i++) { /* indexed by vertex, not by row */
        long k = wf_vertex_index(f->w, rows[i].vertex);
        assert_true(k >= 0);
        r->seen_state[k] = rows[i].state;
        r->seen_epoch[k] = rows[i].epoch;
    }
    r->inl[0] = (struct step_inline){wf_vertex_index(f->w, "b"), "2", r->taken};
    r->inl[1] = (struct step_inline){wf_vertex_index(f->w, "c"), "3", r->taken};
    r->o = (struct step_outcome){
        .w = f->w,
        .workspace = "ws",
        .execution_id = XID,
        .vertex = "a",
        .epoch = epoch,
        .from = STEP_EXECUTING,
        .to = STEP_COMPLETED,
        .output = "1",
        .attempt_outcome = "completed",
        .dec = r->taken,
        .now = clock_now_ms(),
        .inl = r->inl,
        .n_inl = 2,
        .seen_state = r->seen_state,
        .seen_epoch = r->seen_epoch,
        .n_seen = n,
        .worker = "w1",
    };
    store_steps_free(rows, n);
}

/* Claims `a` and sends it back to DISPATCHED with an error, as a refused
 * call's retry does; returns the epoch it had. */
static int64_t refused(struct fx *f, const char *error)
{
    int64_t epoch = claim(f->s, "a", NULL, NULL);
    struct step_outcome o = {.w = f->w,
                             .workspace = "ws",
                             .execution_id = XID,
                             .vertex = "a",
                             .epoch = epoch,
                             .from = STEP_EXECUTING,
                             .to = STEP_DISPATCHED,
                             .error = error,
                             .attempt_outcome = "refused",
                             .now = clock_now_ms()};
    assert_int_equal(store_tx_run(f->s, steps_apply, &o, NULL), 0);
    assert_false(o.fenced);
    return epoch;
}

/* The attempt rows of `a`: how many, and whether one has `epoch`. */
static size_t attempts_of_a(struct fx *f, int64_t epoch, int *has)
{
    struct store_attempt *h = NULL;
    size_t nh = 0, k = 0;
    *has = 0;
    assert_int_equal(store_attempts_get(f->s, XID, &h, &nh, NULL), 0);
    for (size_t i = 0; i < nh; i++)
        if (strcmp(h[i].vertex, "a") == 0) {
            k++;
            *has |= h[i].epoch == epoch;
        }
    store_attempts_free(h, nh);
    return k;
}

/* A deferred GATEWAY call (gwstep.c): the claim is taken back as if it
 * never was — DISPATCHED at run_at, its attempt uncounted and its row
 * gone, the error the attempt before left kept — and only by the claim's
 * own epoch, which the next claim goes past. */
static void test_unclaim_leaves_no_attempt(void **state)
{
    struct fx *f = *state;
    const char err[] = "{\"code\":\"refused\",\"verifyFirst\":true}";
    int64_t first = refused(f, err);
    int64_t epoch = claim(f->s, "a", NULL, NULL), at = clock_now_ms() + 5000;
    int has = 0;
    assert_int_equal(attempts_of_a(f, epoch, &has), 2);
    assert_true(has); /* the claim's own attempt, open */
    struct step_outcome o = {.w = f->w,
                             .workspace = "ws",
                             .execution_id = XID,
                             .vertex = "a",
                             .epoch = epoch,
                             .from = STEP_EXECUTING,
                             .unclaim = 1,
                             .run_at = at,
                             .now = clock_now_ms()};
    assert_int_equal(store_tx_run(f->s, steps_apply, &o, NULL), 0);
    assert_false(o.fenced);
    struct store_step *rows = NULL;
    size_t n = 0;
    assert_int_equal(store_steps_get(f->s, XID, &rows, &n, NULL), 0);
    const struct store_step *a = row(rows, n, "a");
    assert_int_equal(a->state, STEP_DISPATCHED);
    assert_int_equal(a->attempts, 1);
    assert_int_equal(a->epoch, epoch); /* not handed out again */
    assert_int_equal(a->next_run_at, at);
    assert_string_equal(a->error, err);
    assert_null(a->lease_owner);
    store_steps_free(rows, n);
    assert_int_equal(attempts_of_a(f, epoch, &has), 1);
    assert_false(has);
    assert_int_equal(attempts_of_a(f, first, &has), 1);
    assert_true(has); /* the refused attempt stays */
    /* the next claim goes past the epoch taken back; a late unclaim of
     * that epoch (a stale worker) is fenced and deletes nothing */
    struct store_claim *c = NULL;
    assert_int_equal(store_claim(f->s, "w2", 16, at, 60000, &c, &n, NULL), 0);
    int64_t next = -1;
    for (size_t i = 0; i < n; i++)
        if (strcmp(c[i].vertex, "a") == 0)
            next = c[i].epoch;
    store_claims_free(c, n);
    assert_int_equal(next, epoch + 1);
    o.now = clock_now_ms();
    assert_int_equal(store_tx_run(f->s, steps_apply, &o, NULL), 0);
    assert_true(o.fenced);
    assert_int_equal(attempts_of_a(f, next, &has), 2);
    assert_true(has);
}

static void test_inline_applies_on_unchanged_rows(void **state)
{
    struct fx *f = *state;
    struct run r;
    prepare(f, &r, claim(f->s, "a", NULL, NULL));
    assert_int_equal(store_tx_run(f->s, steps_apply, &r.o, NULL), 0);
    assert_false(r.o.fenced);
    assert_int_equal(r.o.inlined, 2);
    struct store_step *rows = NULL;
    size_t n = 0;
    assert_int_equal(store_steps_get(f->s, XID, &rows, &n, NULL), 0);
    const struct store_step *b = row(rows, n, "b"), *c = row(rows, n, "c");
    assert_int_equal(b->state, STEP_COMPLETED);
    assert_int_equal(b->epoch, 1);
    assert_int_equal(b->attempts, 1);
    assert_string_equal(b->output, "2");
    assert_int_equal(c->state, STEP_COMPLETED);
    assert_string_equal(c->output, "3");
    /* j joins a and x: a's edge is decided, x's is not, so j waits */
    assert_int_equal(row(rows, n, "j")->state, STEP_PENDING);
    store_steps_free(rows, n);
    struct store_attempt *at = NULL;
    size_t na = 0, seen_b = 0;
    assert_int_equal(store_attempts_get(f->s, XID, &at, &na, NULL), 0);
    for (size_t i = 0; i < na; i++)
        if (strcmp(at[i].vertex, "b") == 0) {
            seen_b++;
            assert_int_equal(at[i].epoch, 1);
            assert_string_equal(at[i].worker, "w1");
            assert_string_equal(at[i].outcome, "completed");
            assert_true(at[i].finished_at >= at[i].started_at && at[i].finished_at > 0);
        }
    store_attempts_free(at, na);
    assert_int_equal(seen_b, 1);
    struct store_event *ev = NULL;
    size_t ne = 0;
    int completed_b = 0;
    assert_int_equal(store_events_list(f->s, "ws", 0, 100, &ev, &ne, NULL), 0);
    for (size_t i = 0; i < ne; i++) {
        assert_int_equal(ev[i].aggregate_version, (int64_t)i + 1);
        if (strcmp(ev[i].type, "step.completed") == 0 && strstr(ev[i].data, "\"b\""))
            completed_b++;
    }
    store_events_free(ev, ne);
    assert_int_equal(completed_b, 1);
}

/* A row changed after the worker read them (x completed elsewhere): the
 * plan was computed on other inputs, so nothing is inlined; b waits for a
 * claim. */
static void test_inline_skipped_when_a_row_changed(void **state)
{
    struct fx *f = *state;
    struct run r;
    int64_t ex = -1;
    prepare(f, &r, claim(f->s, "a", "x", &ex));
    assert_true(ex >= 0);
    struct step_outcome ox = {
        .w = f->w,
        .workspace = "ws",
        .execution_id = XID,
        .vertex = "x",
        .epoch = ex,
        .from = STEP_EXECUTING,
        .to = STEP_COMPLETED,
        .output = "4",
        .attempt_outcome = "completed",
        .dec = r.taken,
        .now = clock_now_ms(),
    };
    assert_int_equal(store_tx_run(f->s, steps_apply, &ox, NULL), 0);
    assert_int_equal(store_tx_run(f->s, steps_apply, &r.o, NULL), 0);
    assert_false(r.o.fenced);
    assert_int_equal(r.o.inlined, 0);
    struct store_step *rows = NULL;
    size_t n = 0;
    assert_int_equal(store_steps_get(f->s, XID, &rows, &n, NULL), 0);
    assert_int_equal(row(rows, n, "a")->state, STEP_COMPLETED);
    assert_int_equal(row(rows, n, "b")->state, STEP_DISPATCHED);
    assert_int_equal(row(rows, n, "b")->epoch, 0);
    assert_int_equal(row(rows, n, "c")->state, STEP_PENDING);
    store_steps_free(rows, n);
}

/* A planned step this outcome did not dispatch (j still waits for x) is not
 * completed, and the plan stops there. */
static void test_inline_only_what_this_outcome_dispatched(void **state)
{
    struct fx *f = *state;
    struct run r;
    prepare(f, &r, claim(f->s, "a", NULL, NULL));
    r.inl[0] = (struct step_inline){wf_vertex_index(f->w, "j"), "5", r.taken};
    r.inl[1] = (struct step_inline){wf_vertex_index(f->w, "b"), "2", r.taken};
    assert_int_equal(store_tx_run(f->s, steps_apply, &r.o, NULL), 0);
    assert_int_equal(r.o.inlined, 0);
    struct store_step *rows = NULL;
    size_t n = 0;
    assert_int_equal(store_steps_get(f->s, XID, &rows, &n, NULL), 0);
    assert_int_equal(row(rows, n, "j")->state, STEP_PENDING);
    assert_int_equal(row(rows, n, "b")->state, STEP_DISPATCHED);
    store_steps_free(rows, n);
}

/* The dry run dispatches what the join rule would: b after a, then c after
 * b; j only once both a and x completed. */
static void test_sim_follows_the_join_rule(void **state)
{
    struct fx *f = *state;
    struct store_step *rows = NULL;
    size_t n = 0;
    assert_int_equal(store_steps_get(f->s, XID, &rows, &n, NULL), 0);
    struct decision taken[2] = {{EDGE_TAKEN, NULL}, {EDGE_TAKEN, NULL}};
    struct steps_sim *s = steps_sim_new(f->w, rows, n);
    steps_sim_complete(s, wf_vertex_index(f->w, "a"), taken);
    assert_int_equal(steps_sim_next(s), wf_vertex_index(f->w, "b"));
    assert_int_equal(steps_sim_next(s), -1);
    steps_sim_complete(s, wf_vertex_index(f->w, "b"), taken);
    assert_int_equal(steps_sim_next(s), wf_vertex_index(f->w, "c"));
    steps_sim_complete(s, wf_vertex_index(f->w, "x"), taken);
    assert_int_equal(steps_sim_next(s), wf_vertex_index(f->w, "j"));
    assert_int_equal(steps_sim_next(s), -1);
    steps_sim_free(s);
    /* the store is untouched by the dry run */
    struct store_step *again = NULL;
    size_t m = 0;
    assert_int_equal(store_steps_get(f->s, XID, &again, &m, NULL), 0);
    for (size_t i = 0; i < m; i++)
        assert_int_equal(again[i].state, rows[i].state);
    store_steps_free(again, m);
    store_steps_free(rows, n);
}

/* store_execution_load: the execution and its rows, as the separate reads
 * give them; an unknown id is IFL_ENOTFOUND with nothing to free. */
static void test_execution_load(void **state)
{
    struct fx *f = *state;
    struct store_execution x;
    struct store_step *rows = NULL, *ref = NULL;
    size_t n = 0, m = 0;
    assert_int_equal(store_execution_load(f->s, "ws", XID, &x, &rows, &n, NULL), 0);
    assert_string_equal(x.id, XID);
    assert_string_equal(x.workflow, "wf");
    assert_int_equal(store_steps_get(f->s, XID, &ref, &m, NULL), 0);
    assert_int_equal(n, m);
    assert_int_equal(n, 6);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(rows[i].vertex, ref[i].vertex);
        assert_int_equal(rows[i].state, ref[i].state);
    }
    store_steps_free(rows, n);
    store_steps_free(ref, m);
    store_execution_clear(&x);
    rows = NULL;
    n = 7;
    assert_int_equal(store_execution_load(f->s, "ws", "nope", &x, &rows, &n, NULL), IFL_ENOTFOUND);
    assert_null(rows);
    assert_int_equal(n, 0);
    assert_int_equal(store_execution_load(f->s, "other", XID, &x, &rows, &n, NULL), IFL_ENOTFOUND);
}

/* The event data written directly is what the JSON form serializes to:
 * escapes, large epochs, each state; with an error, the general path. */
static void test_event_data_text_matches_the_json_form(void **state)
{
    (void)state;
    const char *vertices[] = {"charge", "quote\"back\\slash", "tab\there", "ünï/\x01"};
    enum step_state states[] = {STEP_COMPLETED, STEP_FAILED, STEP_SKIPPED,
                                STEP_REQUIRES_RECONCILIATION};
    for (size_t i = 0; i < 4; i++) {
        struct store_step st = {0};
        st.vertex = (char *)vertices[i];
        st.state = states[i];
        st.epoch =
            i == 3 ? 9007199254740991LL : (int64_t)i; /* 2^53 - 1: beyond it JSON numbers round */
        st.attempts = (int)i * 7;
        st.error = i == 1 ? "{\"code\":\"x\",\"message\":\"m \\\"q\\\"\"}" : NULL;
        json_t *d = steps_event_data(&st);
        char *want = json_to_string(d), *got = steps_event_data_text(&st);
        assert_string_equal(got, want);
        free(want);
        free(got);
        json_decref(d);
    }
    json_t *sd = json_pack("{s:s}", "status", "completed");
    char *want = json_to_string(sd), *got = steps_status_data_text("completed");
    assert_string_equal(got, want);
    free(want);
    free(got);
    json_decref(sd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_inline_applies_on_unchanged_rows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unclaim_leaves_no_attempt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inline_skipped_when_a_row_changed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inline_only_what_this_outcome_dispatched, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sim_follows_the_join_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_execution_load, setup, teardown),
        cmocka_unit_test(test_event_data_text_matches_the_json_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
