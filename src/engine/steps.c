/*
 * steps — see steps.h.
 *
 * The rows of one execution are loaded into memory, changed there by the
 * join rule, and written back guarded by the state each row had when read,
 * so a concurrent writer (another process, on PostgreSQL) cannot be
 * overwritten silently: a failed guard aborts the transaction with
 * IFL_ECONFLICT and the backend retries it.
 */
#include "engine/steps.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "json/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *steps_error_json(const char *code, const char *msg)
{
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string(code));
    json_object_set_new(o, "message", json_string(msg ? msg : ""));
    char *s = json_to_string(o);
    json_decref(o);
    return s;
}

/* Rows of one execution with a map from workflow vertex index to row. */
struct view {
    const struct wf *w;
    struct store_step *rows;
    size_t n;
    long *row_of;         /* per workflow vertex: row index or -1 */
    enum step_state *was; /* state when loaded (the write guard) */
    int *dirty;
    int dispatched;
    int64_t now;
    int64_t ver; /* the execution's aggregate version as events are appended */
};

static void view_init(struct view *v, const struct wf *w, struct store_step *rows, size_t n,
                      int64_t now)
{
    v->w = w;
    v->rows = rows;
    v->n = n;
    v->now = now;
    v->ver = 0;
    v->dispatched = 0;
    v->row_of = xmalloc(w->nv * sizeof *v->row_of);
    v->was = xmalloc((n ? n : 1) * sizeof *v->was);
    v->dirty = xcalloc(n ? n : 1, sizeof *v->dirty);
    for (size_t i = 0; i < w->nv; i++)
        v->row_of[i] = -1;
    for (size_t r = 0; r < n; r++) {
        long vi = wf_vertex_index(w, rows[r].vertex);
        if (vi >= 0)
            v->row_of[vi] = (long)r;
        v->was[r] = rows[r].state;
    }
}

static void view_free(struct view *v)
{
    free(v->row_of);
    free(v->was);
    free(v->dirty);
}

static void set_text(char **dst, const char *src)
{
    free(*dst);
    *dst = src ? xstrdup(src) : NULL;
}

static void decide(struct view *v, size_t edge, const struct decision *d);

/* A vertex was skipped: every outgoing edge is decided "not taken". */
static void skip_out(struct view *v, size_t vi)
{
    const struct wf_vertex *vx = &v->w->v[vi];
    struct decision nt = {EDGE_NOT_TAKEN, NULL};
    for (size_t k = 0; k < vx->n_out; k++)
        decide(v, vx->out[k], &nt);
}

/* Applies one edge decision to its target (the join rule of spec §3). */
static void decide(struct view *v, size_t edge, const struct decision *d)
{
    size_t to = v->w->e[edge].to;
    long r = v->row_of[to];
    if (r < 0)
        return;
    struct store_step *t = &v->rows[r];
    if (t->state != STEP_PENDING) {
        /* A target failed by an earlier edge's condition error (the only
         * FAILED step with undecided edges) keeps counting its other edges,
         * so that a retry can still apply the join rule (steps_retry). */
        if (t->state == STEP_FAILED && t->in_decided < (int)v->w->v[to].n_in) {
            t->in_decided++;
            t->in_taken += d->kind == EDGE_TAKEN;
            v->dirty[r] = 1;
        }
        return;
    }
    t->in_decided++;
    if (d->kind == EDGE_TAKEN)
        t->in_taken++;
    v->dirty[r] = 1;
    if (d->kind == EDGE_ERROR) {
        /* The condition's error fails the edge's target; the source stands. */
        t->state = STEP_FAILED;
        set_text(&t->error, d->error);
        return;
    }
    if (t->in_decided < (int)v->w->v[to].n_in)
        return;
    if (t->in_taken > 0) {
        t->state = STEP_DISPATCHED;
        t->next_run_at = v->now;
        v->dispatched = 1;
    } else {
        t->state = STEP_SKIPPED;
        skip_out(v, to);
    }
}

/* Applies vertex vi's decisions (one per outgoing edge) to its targets. */
static void decide_out(struct view *v, long vi, const struct decision *dec)
{
    const struct wf_vertex *vx = &v->w->v[vi];
    for (size_t k = 0; k < vx->n_out; k++)
        decide(v, vx->out[k], &dec[k]);
}

/* Completes row r (vertex vi) as a run of its own would: COMPLETED with
 * output at epoch+1 after attempt+1, then its decisions. */
static void complete_row(struct view *v, long r, long vi, const char *output,
                         const struct decision *dec)
{
    struct store_step *t = &v->rows[r];
    t->state = STEP_COMPLETED;
    t->epoch++;
    t->attempts++;
    set_text(&t->output, output);
    set_text(&t->error, NULL);
    decide_out(v, vi, dec);
}

const char *steps_status(const struct store_step *rows, size_t n)
{
    int recon = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        switch (rows[i].state) {
        case STEP_DISPATCHED:
        case STEP_EXECUTING:
            return "running";
        case STEP_REQUIRES_RECONCILIATION:
            recon = 1;
            break;
        case STEP_FAILED:
            failed = 1;
            break;
        default:
            break;
        }
    }
    return recon ? "requires_reconciliation" : failed ? "failed" : "completed";
}

void steps_initial(const struct wf *w, size_t entry, const char *execution_id, const char *ws,
                   const char *payload, const struct decision *dec, int64_t now,
                   struct store_step **rows, size_t *n, const char **status)
{
    struct store_step *r = xcalloc(w->nv, sizeof *r);
    for (size_t i = 0; i < w->nv; i++) {
        snprintf(r[i].execution_id, sizeof r[i].execution_id, "%s", execution_id);
        r[i].vertex = xstrdup(w->v[i].id);
        r[i].workspace = xstrdup(ws);
        r[i].kind = xstrdup(wf_type_name(w->v[i].type));
        r[i].state = STEP_PENDING;
        r[i].next_run_at = now;
        if (i == entry && !dec) {
            r[i].state = STEP_DISPATCHED;
        } else if (i == entry) {
            r[i].state = STEP_COMPLETED;
            r[i].output = xstrdup(payload);
        } else if (w->v[i].type == WF_ENTRY_POINT) {
            r[i].state = STEP_SKIPPED;
        }
    }
    struct view v;
    view_init(&v, w, r, w->nv, now);
    if (dec)
        decide_out(&v, (long)entry, dec);
    for (size_t i = 0; i < w->nv; i++)
        if (i != entry && w->v[i].type == WF_ENTRY_POINT)
            skip_out(&v, i);
    view_free(&v);
    *rows = r;
    *n = w->nv;
    *status = steps_status(r, w->nv);
}

struct steps_sim {
    struct view v;
    struct store_step *rows; /* copies: vertex borrowed, error owned */
    char **vertex;           /* owned vertex names */
    int *returned;
};

struct steps_sim *steps_sim_new(const struct wf *w, const struct store_step *rows, size_t n)
{
    struct steps_sim *s = xcalloc(1, sizeof *s);
    s->rows = xcalloc(n ? n : 1, sizeof *s->rows);
    s->vertex = xcalloc(n ? n : 1, sizeof *s->vertex);
    s->returned = xcalloc(n ? n : 1, sizeof *s->returned);
    for (size_t r = 0; r < n; r++) {
        s->vertex[r] = xstrdup(rows[r].vertex);
        s->rows[r].vertex = s->vertex[r];
        s->rows[r].state = rows[r].state;
        s->rows[r].in_decided = rows[r].in_decided;
        s->rows[r].in_taken = rows[r].in_taken;
    }
    view_init(&s->v, w, s->rows, n, 0);
    return s;
}

void steps_sim_complete(struct steps_sim *s, long vi, const struct decision *dec)
{
    long r = vi >= 0 && (size_t)vi < s->v.w->nv ? s->v.row_of[vi] : -1;
    if (r < 0)
        return;
    s->rows[r].state = STEP_COMPLETED;
    decide_out(&s->v, vi, dec);
}

long steps_sim_next(struct steps_sim *s)
{
    for (size_t r = 0; r < s->v.n; r++) {
        if (s->returned[r] || s->rows[r].state != STEP_DISPATCHED || s->v.was[r] != STEP_PENDING)
            continue;
        s->returned[r] = 1;
        return wf_vertex_index(s->v.w, s->rows[r].vertex);
    }
    return -1;
}

void steps_sim_free(struct steps_sim *s)
{
    if (!s)
        return;
    for (size_t r = 0; r < s->v.n; r++) {
        free(s->rows[r].error);
        free(s->vertex[r]);
    }
    view_free(&s->v);
    free(s->rows);
    free(s->vertex);
    free(s->returned);
    free(s);
}

void steps_complete_initial(const struct wf *w, struct store_step *rows, size_t n, long vi,
                            const char *output, const struct decision *dec)
{
    struct view v;
    view_init(&v, w, rows, n, rows[0].next_run_at);
    long r = vi >= 0 && (size_t)vi < w->nv ? v.row_of[vi] : -1;
    if (r >= 0)
        complete_row(&v, r, vi, output, dec);
    view_free(&v);
}

int steps_event_text(struct store_tx *tx, const char *ws, const char *xid, const char *type,
                     char *data, int64_t preset_version, struct ifl_err *e)
{
    struct store_event ev = {0};
    ev.workspace = (char *)ws;
    snprintf(ev.execution_id, sizeof ev.execution_id, "%s", xid);
    ev.type = (char *)type;
    ev.data = data;
    ev.aggregate_version = preset_version;
    ev.version_preset = preset_version > 0;
    int rc = store_tx_event_append(tx, &ev, e);
    free(data);
    return rc;
}

int steps_event(struct store_tx *tx, const char *ws, const char *xid, const char *type,
                json_t *data, int64_t preset_version, struct ifl_err *e)
{
    char *text = json_to_string(data);
    json_decref(data);
    return steps_event_text(tx, ws, xid, type, text, preset_version, e);
}

char *steps_event_data_text(const struct store_step *st)
{
    if (st->error) { /* the error is embedded as JSON: the general path */
        json_t *d = steps_event_data(st);
        char *text = json_to_string(d);
        json_decref(d);
        return text;
    }
    struct buf b;
    buf_init(&b, 0);
    buf_puts(&b, "{\"vertex\":");
    json_write_string(st->vertex, &b);
    buf_printf(&b, ",\"state\":\"%s\",\"epoch\":%lld,\"attempts\":%d}",
               store_step_state_name(st->state), (long long)st->epoch, st->attempts);
    return buf_steal(&b);
}

char *steps_status_data_text(const char *status)
{
    struct buf b;
    buf_init(&b, 0);
    buf_puts(&b, "{\"status\":");
    json_write_string(status, &b);
    buf_putc(&b, '}');
    return buf_steal(&b);
}

json_t *steps_event_data(const struct store_step *st)
{
    json_t *d = json_object();
    json_object_set_new(d, "vertex", json_string(st->vertex));
    json_object_set_new(d, "state", json_string(store_step_state_name(st->state)));
    json_object_set_new(d, "epoch", json_integer(st->epoch));
    json_object_set_new(d, "attempts", json_integer(st->attempts));
    if (st->error) {
        json_t *err = NULL;
        json_parse(st->error, strlen(st->error), &json_stored_limits, &err, NULL);
        json_object_set_new(d, "error", err ? err : json_string(st->error));
    }
    return d;
}

static const char *step_event_type(enum step_state s)
{
    switch (s) {
    case STEP_COMPLETED:
        return "step.completed";
    case STEP_FAILED:
        return "step.failed";
    case STEP_SKIPPED:
        return "step.skipped";
    case STEP_REQUIRES_RECONCILIATION:
        return "step.requires_reconciliation";
    case STEP_DISPATCHED:
        return "step.dispatched";
    default:
        return "step.updated";
    }
}

/* The rows in the workflow's topological order (a step after those it
 * follows: the order they ran), then any row of no vertex: a heap array of
 * v->n row indexes. */
static size_t *rows_in_order(const struct view *v)
{
    size_t *order = xcalloc(v->n ? v->n : 1, sizeof *order);
    size_t k = 0;
    for (size_t t = 0; t < v->w->nv; t++)
        if (v->row_of[v->w->topo[t]] >= 0)
            order[k++] = (size_t)v->row_of[v->w->topo[t]];
    for (size_t r = 0; k < v->n && r < v->n; r++) /* rows of no vertex of w: none, in practice */
        if (wf_vertex_index(v->w, v->rows[r].vertex) < 0)
            order[k++] = r;
    return order;
}

/* Writes every dirty row guarded by its loaded state, and an event for
 * each terminal transition, in the order the steps ran (rows_in_order). */
static int flush_rows(struct store_tx *tx, struct view *v, const char *ws, const char *xid,
                      long except, struct ifl_err *e)
{
    size_t *order = rows_in_order(v);
    int rc = 0;
    for (size_t k = 0; !rc && k < v->n; k++) {
        size_t r = order[k];
        if (!v->dirty[r] || (long)r == except)
            continue;
        int changed = 0;
        if ((rc = store_tx_step_update(tx, &v->rows[r], v->was[r], -1, &changed, e)))
            break;
        if (!changed) {
            rc = err_set(e, IFL_ECONFLICT, "step %s changed concurrently", v->rows[r].vertex);
            break;
        }
        enum step_state now_state = v->rows[r].state;
        if (now_state != v->was[r] && now_state != STEP_DISPATCHED && now_state != STEP_PENDING)
            rc = steps_event_text(tx, ws, xid, step_event_type(v->rows[r].state),
                                  steps_event_data_text(&v->rows[r]), ++v->ver, e);
    }
    free(order);
    return rc;
}

/* Writes the dirty rows and their events (flush_rows), skipping row
 * `except` (already written by the caller); then the execution status
 * (and its event) when it moved. */
static int flush(struct store_tx *tx, struct view *v, const char *ws, const char *xid,
                 const char *old_status, int64_t ver0, long except, char status_out[32],
                 struct ifl_err *e)
{
    int rc = flush_rows(tx, v, ws, xid, except, e);
    if (rc)
        return rc;
    const char *status = steps_status(v->rows, v->n);
    snprintf(status_out, 32, "%s", status);
    int moved = strcmp(status, old_status) != 0;
    if (moved) {
        char type[64];
        snprintf(type, sizeof type, "execution.%s", status);
        rc = steps_event_text(tx, ws, xid, type, steps_status_data_text(status), ++v->ver, e);
        if (rc)
            return rc;
    }
    /* One write of the execution row: status and the version the events
     * above were stamped with (read in this transaction: the row is ours). */
    if (!moved && v->ver == ver0)
        return 0;
    return store_tx_execution_set_status(tx, xid, status, v->ver, e);
}

/* 1 when every row has the state and epoch the worker read. */
/* Every row as the worker read it: matched by vertex, so the order rows
 * come in (the store's, or the creating transaction's) does not matter. */
static int as_seen(const struct step_outcome *o, const struct view *v, size_t n)
{
    if (!o->seen_state || n != o->n_seen)
        return 0;
    for (size_t vi = 0; vi < o->w->nv; vi++) {
        long r = v->row_of[vi];
        if (r < 0 ? o->seen_epoch[vi] != -1
                  : v->rows[r].state != o->seen_state[vi] || v->rows[r].epoch != o->seen_epoch[vi])
            return 0;
    }
    return 1;
}

/* Completes the planned TRANSFORM successors this outcome just dispatched
 * (see struct step_outcome); stops at the first that does not apply. */
static int apply_inline(struct store_tx *tx, struct view *v, struct step_outcome *o,
                        struct ifl_err *e)
{
    for (size_t k = 0; k < o->n_inl; k++) {
        const struct step_inline *in = &o->inl[k];
        long r = in->vi >= 0 && (size_t)in->vi < v->w->nv ? v->row_of[in->vi] : -1;
        if (r < 0 || v->rows[r].state != STEP_DISPATCHED || v->was[r] != STEP_PENDING)
            break;
        complete_row(v, r, in->vi, in->output, in->dec);
        const struct store_step *t = &v->rows[r];
        int rc = store_tx_attempt_record(tx, o->execution_id, t->vertex, t->epoch, o->worker,
                                         "completed", e);
        if (rc)
            return rc;
        o->inlined++;
    }
    v->dispatched = 0;
    for (size_t r = 0; r < v->n; r++)
        if (v->dirty[r] && v->rows[r].state == STEP_DISPATCHED)
            v->dispatched = 1;
    return 0;
}

int steps_apply(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct step_outcome *o = arg;
    o->inlined = 0;
    o->status_changed = 0;
    o->fenced = 0;
    o->over_budget = 0;
    o->dispatched = 0;
    o->cancelled = 0;
    o->status[0] = '\0';
    struct store_execution x;
    struct store_step *rows = NULL;
    size_t n = 0;
    char *over_budget = NULL;
    int rc = store_tx_execution_load(tx, o->workspace, o->execution_id, &x, &rows, &n, e);
    if (rc)
        return rc;
    struct view v;
    view_init(&v, o->w, rows, n, o->now);
    v.ver = x.version;
    long vi = wf_vertex_index(o->w, o->vertex);
    long r = vi >= 0 ? v.row_of[vi] : -1;
    if (r < 0) {
        rc = err_set(e, IFL_ENOTFOUND, "execution %s has no step %s", o->execution_id, o->vertex);
        goto out;
    }
    struct store_step *st = &rows[r];
    /* A cancelled execution takes no outcome (steps_cancel left no step
     * EXECUTING; this is the guard for an operator's resolve). */
    o->cancelled = strcmp(x.status, "cancelled") == 0;
    if (o->cancelled || st->state != o->from || (o->epoch >= 0 && st->epoch != o->epoch)) {
        o->fenced = 1;
        snprintf(o->status, sizeof o->status, "%s", x.status);
        goto out;
    }
    if (o->unclaim) {
        int changed = 0;
        st->state = STEP_DISPATCHED;
        free(st->lease_owner);
        st->lease_owner = NULL;
        st->lease_expires_at = 0;
        st->attempts--;
        st->next_run_at = o->run_at ? o->run_at : o->now;
        if ((rc = store_tx_step_update(tx, st, o->from, o->epoch, &changed, e)) == 0 && changed)
            rc = store_tx_attempt_delete(tx, o->execution_id, o->vertex, o->epoch, e);
        o->fenced = !changed;
        snprintf(o->status, sizeof o->status, "%s", x.status);
        goto out;
    }
    int inline_ok = o->n_inl && o->to == STEP_COMPLETED && as_seen(o, &v, n);
    /* The execution's output budget, counted on the rows as they are in
     * this transaction: over it, the step fails instead; its inlined
     * successors are left to workers when only they do not fit. */
    enum step_state to = o->to;
    const char *output = o->output, *error = o->error, *attempt_outcome = o->attempt_outcome;
    if (to == STEP_COMPLETED) {
        size_t kept = output ? strlen(output) : 0, planned = 0;
        for (size_t i = 0; i < n; i++)
            if ((long)i != r && rows[i].output)
                kept += strlen(rows[i].output);
        for (size_t k = 0; inline_ok && k < o->n_inl; k++)
            planned += o->inl[k].output ? strlen(o->inl[k].output) : 0;
        if (kept + planned > STEPS_EXECUTION_OUTPUT_MAX)
            inline_ok = 0;
        if (kept > STEPS_EXECUTION_OUTPUT_MAX) {
            /* A call's answer: the call took effect (found by a reviewer: a
             * plain "failed" let an operator's retry send it again,
             * unverified) */
            int answer = !o->bump_epoch && strcmp(st->kind, "GATEWAY") == 0;
            o->over_budget = 1;
            to = STEP_FAILED;
            output = NULL;
            /* a resolve stays one in the history: the operator settled
             * what the call did, whatever became of the output */
            attempt_outcome = o->bump_epoch ? attempt_outcome
                              : answer      ? STEPS_ANSWER_OVER_BUDGET
                                            : "failed";
            error = over_budget = steps_error_json(
                "output_budget_exceeded",
                answer ? "the call was answered, and took effect as its answer says, but the "
                         "answer would take the execution's stored outputs past 16 MiB: resolve "
                         "the step with the output to keep (a retry verifies first when a "
                         "verify is configured; with neither a verify nor an Idempotency-Key "
                         "it sends the call again only when asked to, with sendAgain)"
                       : "this output would take the execution's stored outputs past 16 MiB");
        }
    }
    int64_t claimed_epoch = st->epoch;
    st->state = to;
    free(st->lease_owner);
    st->lease_owner = NULL;
    st->lease_expires_at = 0;
    if (o->bump_epoch)
        st->epoch++;
    if (to == STEP_COMPLETED)
        set_text(&st->output, output);
    if (to == STEP_DISPATCHED) {
        st->next_run_at = o->run_at ? o->run_at : o->now;
        v.dispatched = 1;
    }
    set_text(&st->error, error);
    int changed = 0;
    if ((rc = store_tx_step_update(tx, st, o->from, o->epoch, &changed, e)))
        goto out;
    if (!changed) {
        o->fenced = 1; /* unreachable on one connection; kept for safety */
        goto out;
    }
    if (o->from == STEP_EXECUTING &&
        (rc = store_tx_attempt_finish(tx, o->execution_id, o->vertex, claimed_epoch,
                                      attempt_outcome, error, e)))
        goto out;
    /* An operator's resolve: a row of its own in the history, at the epoch
     * it gave the step, so that who settled the step, when and how shows
     * there (and steps_effect_unknown reads the call's effect as settled). */
    if (o->from != STEP_EXECUTING && o->bump_epoch &&
        ((rc = store_tx_attempt_record(tx, o->execution_id, o->vertex, st->epoch, "operator", NULL,
                                       e)) ||
         (rc = store_tx_attempt_finish(tx, o->execution_id, o->vertex, st->epoch, attempt_outcome,
                                       error, e))))
        goto out;
    if (to != STEP_DISPATCHED &&
        (rc = steps_event_text(tx, o->workspace, o->execution_id, step_event_type(to),
                               steps_event_data_text(st), ++v.ver, e)))
        goto out;
    if (to == STEP_COMPLETED && o->dec) {
        decide_out(&v, vi, o->dec);
        if (inline_ok && (rc = apply_inline(tx, &v, o, e)))
            goto out;
    }
    rc = flush(tx, &v, o->workspace, o->execution_id, x.status, x.version, r, o->status, e);
    o->status_changed = strcmp(o->status, x.status) != 0;
    o->dispatched = v.dispatched;
out:
    free(over_budget);
    view_free(&v);
    store_steps_free(rows, n);
    store_execution_clear(&x);
    return rc;
}

int steps_error_code_is(const char *error, const char *code)
{
    json_t *v = NULL;
    if (!error || json_parse(error, strlen(error), &json_stored_limits, &v, NULL))
        return 0;
    int is = json_is_object(v) && json_text(json_object_get(v, "code")) &&
             strcmp(json_text(json_object_get(v, "code")), code) == 0;
    json_decref(v);
    return is;
}

int steps_error_verify_first(const char *error)
{
    json_t *ej = NULL;
    int v = error && json_parse(error, strlen(error), &json_stored_limits, &ej, NULL) == 0 &&
            json_is_true(json_object_get(ej, "verifyFirst"));
    json_decref(ej);
    return v;
}

int64_t steps_error_not_before_of(const json_t *error)
{
    int64_t ms = 0;
    if (clock_parse_rfc3339(json_string_value(json_object_get(error, "verifyNotBefore")), &ms))
        return 0;
    return ms;
}

int64_t steps_error_verify_not_before(const char *error)
{
    json_t *ej = NULL;
    int64_t ms = 0;
    if (error && json_parse(error, strlen(error), &json_stored_limits, &ej, NULL) == 0)
        ms = steps_error_not_before_of(ej);
    json_decref(ej);
    return ms;
}

void steps_error_set_not_before(json_t *error, int64_t ms)
{
    if (ms <= 0)
        return;
    char at[32];
    clock_rfc3339(ms, at);
    json_object_set_new(error, "verifyNotBefore", json_string(at));
}

/* An IFL_ECONFLICT refusal (rc, the err_set that filled *e) with its
 * problem slug; e may be NULL. */
static int conflict(struct ifl_err *e, const char *slug, int rc)
{
    if (e)
        err_slug(e, slug);
    return rc;
}

const struct steps_seen *steps_seen_find(const struct steps_seen *v, size_t n, const char *vertex)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(v[i].vertex, vertex) == 0)
            return &v[i];
    return NULL;
}

/* A FAILED step that never ran was failed by an incoming edge's condition
 * error (spec §3).  A retry decides its incoming edges again — a source
 * COMPLETED: its condition, evaluated now; SKIPPED: not taken; anything
 * else: undecided — and applies the join rule: dispatched when all are
 * decided and one was taken, SKIPPED (and the skip propagated) when none
 * was, PENDING while some are undecided.  Returns 0 with the step's row
 * moved, or 1 when a condition fails again (*error, owned: the step stays
 * FAILED).  The guard is never passed over: counting the failed edge as
 * taken would run a call its condition was there to hold back. */
static int redecide(const struct steps_retry *a, struct view *v, const struct store_execution *x,
                    size_t r, long vi, char **error)
{
    const struct wf_vertex *vx = &a->w->v[vi];
    int decided = 0, taken = 0;
    *error = NULL;
    for (size_t k = 0; k < vx->n_in; k++) {
        const struct wf_edge *ed = &a->w->e[vx->in[k]];
        long fr = v->row_of[ed->from];
        enum step_state fs = fr >= 0 ? v->rows[fr].state : STEP_PENDING;
        if (fs == STEP_SKIPPED) {
            decided++;
        } else if (fs == STEP_COMPLETED) {
            struct decision d = {EDGE_TAKEN, NULL};
            if (ed->cond)
                a->decide_edge(a->decide_ctx, a->w, vx->in[k], x, v->rows, v->n, &v->rows[fr], &d);
            if (d.kind == EDGE_ERROR) {
                free(*error);
                *error = d.error;
                continue;
            }
            decided++;
            taken += d.kind == EDGE_TAKEN;
        }
    }
    if (*error)
        return 1;
    struct store_step *st = &v->rows[r];
    st->in_decided = decided;
    st->in_taken = taken;
    v->dirty[r] = 1;
    if (decided < (int)vx->n_in) {
        st->state = STEP_PENDING;
    } else if (taken) {
        st->state = STEP_DISPATCHED;
    } else {
        st->state = STEP_SKIPPED;
        skip_out(v, (size_t)vi);
    }
    return 0;
}

int steps_not_started_over(struct store_tx *tx, const char *ws, const char *id, struct ifl_err *e)
{
    char *to = NULL;
    int rc = store_tx_execution_started_over(tx, ws, id, NULL, &to, e);
    if (!rc && to)
        rc = conflict(e, "execution-started-over",
                      err_set(e, IFL_ECONFLICT,
                              "execution %s was started over as %s: act on that one (its "
                              "steps would run beside the new execution's)",
                              id, to));
    free(to);
    return rc;
}

int steps_retry(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct steps_retry *a = arg;
    a->retried = 0;
    a->ended = 0;
    a->status[0] = '\0';
    struct store_execution x;
    struct store_step *rows = NULL;
    size_t n = 0;
    int rc = store_tx_execution_load(tx, a->workspace, a->execution_id, &x, &rows, &n, e);
    if (rc)
        return rc;
    if (strcmp(x.status, "purged") == 0) /* purged since the caller looked */
        rc = err_set(e, IFL_EGONE, "execution %s was purged by retention", a->execution_id);
    else if (strcmp(x.status, "cancelled") == 0)
        rc = conflict(e, "execution-cancelled",
                      err_set(e, IFL_ECONFLICT,
                              "execution %s was cancelled; start it over to run it again",
                              a->execution_id));
    else
        rc = steps_not_started_over(tx, a->workspace, a->execution_id, e);
    struct view v;
    view_init(&v, a->w, rows, n, a->now);
    int *retried = xcalloc(n ? n : 1, sizeof *retried);
    int *sent_again = xcalloc(n ? n : 1, sizeof *sent_again);
    struct store_execution full = {0};
    for (size_t i = 0; !rc && i < n; i++) {
        struct store_step *st = &rows[i];
        enum step_state was = st->state;
        if (was != STEP_FAILED && was != STEP_REQUIRES_RECONCILIATION)
            continue;
        long vi = wf_vertex_index(a->w, st->vertex);
        int verify_first = steps_error_verify_first(st->error);
        if (strcmp(st->kind, "GATEWAY") == 0) {
            const struct steps_seen *seen = steps_seen_find(a->seen, a->n_seen, st->vertex);
            if (!seen || seen->epoch != st->epoch) {
                rc = err_set(e, IFL_ECONFLICT, "step %s changed concurrently", st->vertex);
                break;
            }
            /* An outcome nothing settled, parked or failed without a
             * verifyFirst mark (`ambiguous: reconcile`, attempts run out):
             * with a verify configured, it runs before the call is sent
             * again, as it would within the step's own attempts. */
            if (seen->unknown && vi >= 0 && a->w->v[vi].verify)
                verify_first = 1;
            /* Nothing could settle it — no key, no verify — so a re-send is
             * the operator's to ask for, having checked with the provider
             * (found by a judge: a script retrying the dead letters charged
             * every parked order twice). */
            int unsettled = (seen->unknown || verify_first) && vi >= 0 && !a->w->v[vi].verify &&
                            !a->w->v[vi].policy.has_idempotency_key;
            if (unsettled && !a->send_again) {
                rc = conflict(e, "step-outcome-unknown",
                              err_set(e, IFL_ECONFLICT,
                                      "step %s's call may have taken effect, and neither an "
                                      "Idempotency-Key nor a verify can tell: check with the "
                                      "provider, then resolve the step if it did, or retry with "
                                      "{\"sendAgain\": true} if it did not",
                                      st->vertex));
                break;
            }
            sent_again[i] = unsettled;
        }
        if (was == STEP_FAILED && vi >= 0 && st->attempts == 0 && a->decide_edge) {
            char *again = NULL;
            /* the whole row (the load reads only what moving steps needs):
             * the conditions read its payload */
            if (!full.id[0] &&
                (rc = store_tx_execution_get(tx, a->workspace, a->execution_id, &full, e)))
                break;
            if (redecide(a, &v, &full, i, vi, &again)) {
                /* fails again: the step stays FAILED, with the error of now
                 * (the operator sees why), and is not counted as retried */
                if (!st->error || strcmp(st->error, again) != 0) {
                    free(st->error);
                    st->error = again;
                    v.dirty[i] = 1;
                } else {
                    free(again);
                }
                continue;
            }
        } else {
            st->state = STEP_DISPATCHED;
        }
        st->epoch++;
        st->next_run_at = a->now;
        /* A call whose outcome is still unknown verifies before it sends,
         * also when an operator sends it again — and not before its mark
         * says (an automated retry of a dead letter comes at once: found
         * by a judge). */
        int64_t not_before = verify_first ? steps_error_verify_not_before(st->error) : 0;
        free(st->error);
        st->error = NULL;
        if (verify_first) {
            json_t *ej = json_pack("{s:s,s:s,s:b}", "code", "operator_retry", "message",
                                   "retried by an operator; the call's earlier outcome is "
                                   "unknown, so verify runs first",
                                   "verifyFirst", 1);
            if (not_before > a->now)
                steps_error_set_not_before(ej, not_before);
            st->error = json_to_string(ej);
            json_decref(ej);
        }
        v.dirty[i] = 1;
        retried[i] = 1;
        a->retried++;
    }
    /* The retry's event first, then the rows it moved (and those a skip
     * reached), each guarded by the state it was loaded in, with their
     * events in version order. */
    int64_t ver = x.version + 1;
    if (!rc && a->retried) {
        json_t *d = json_object();
        json_object_set_new(d, "retriedSteps", json_integer(a->retried));
        rc = steps_event(tx, a->workspace, a->execution_id, "execution.retried", d, ver, e);
    }
    size_t *order = rows_in_order(&v); /* the skips' events after what they follow */
    for (size_t k = 0; !rc && k < n; k++) {
        size_t i = order[k];
        if (!v.dirty[i])
            continue;
        int changed = 0;
        rc = store_tx_step_update(tx, &rows[i], v.was[i], -1, &changed, e);
        if (!rc && !changed)
            rc = err_set(e, IFL_ECONFLICT, "step %s changed concurrently", rows[i].vertex);
        if (!rc && retried[i]) /* in the history, and where a new retry budget starts */
            rc = store_tx_attempt_record(
                tx, a->execution_id, rows[i].vertex, rows[i].epoch, "operator",
                sent_again[i] ? STEPS_OPERATOR_SEND_AGAIN : STEPS_OPERATOR_RETRY, e);
        if (!rc && rows[i].state == STEP_SKIPPED)
            rc = steps_event_text(tx, a->workspace, a->execution_id, "step.skipped",
                                  steps_event_data_text(&rows[i]), ++ver, e);
    }
    free(order);
    /* Nothing retried: the execution keeps its status (a stale one has no
     * steps to derive one from). */
    const char *status = a->retried ? steps_status(rows, n) : x.status;
    snprintf(a->status, sizeof a->status, "%s", status);
    if (!rc && a->retried) {
        /* a retry whose steps were all skipped ends the execution */
        if (strcmp(status, "running") != 0 && strcmp(status, x.status) != 0) {
            a->ended = 1;
            char type[64];
            snprintf(type, sizeof type, "execution.%s", status);
            rc = steps_event_text(tx, a->workspace, a->execution_id, type,
                                  steps_status_data_text(status), ++ver, e);
        }
        if (!rc)
            rc = store_tx_execution_set_status(tx, a->execution_id, status, ver, e);
    }
    free(retried);
    free(sent_again);
    store_execution_clear(&full);
    view_free(&v);
    store_steps_free(rows, n);
    store_execution_clear(&x);
    return rc;
}

/* Attempt outcomes (gwstep.c, runner.c) after which the call's effect is
 * not known. */
static int unknown_outcome(const char *outcome)
{
    static const char *const unknown[] = {
        "ambiguous", /* reconcile's, before 2026-12-03 */
        "ambiguous_outcome", "conflict", "verify_failed", "verify_inconclusive", "lease_expired",
        STEPS_CRASHED, STEPS_LEASE_EXPIRED_AFTER_RESPONSE, STEPS_CRASHED_AFTER_RESPONSE,
        /* it took effect: as unknown, a retry verifies */
        STEPS_ANSWER_OVER_BUDGET, NULL};
    for (int k = 0; unknown[k]; k++)
        if (strcmp(outcome, unknown[k]) == 0)
            return 1;
    return 0;
}

int steps_operator_retry(const char *outcome)
{
    return outcome && (strcmp(outcome, STEPS_OPERATOR_RETRY) == 0 ||
                       strcmp(outcome, STEPS_OPERATOR_SEND_AGAIN) == 0);
}

int steps_effect_unknown(const struct store_attempt *a, size_t n, const char *vertex, int resend)
{
    int64_t last_unknown = -1, last_settled = -1;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(a[i].vertex, vertex) != 0 || !a[i].outcome)
            continue;
        /* What the error adds (gwstep.c): an attempt that spent the last
         * try or the time names what it met (`cause`); one whose verify
         * found the earlier call not done and sent it again says so
         * (`afterVerify`).  Read only for the attempts that can carry them. */
        int spent = strcmp(a[i].outcome, "attempts_exhausted") == 0 ||
                    strcmp(a[i].outcome, "deadline_exceeded") == 0;
        json_t *ej = NULL;
        if (a[i].error && (spent || strstr(a[i].error, "afterVerify")) &&
            json_parse(a[i].error, strlen(a[i].error), &json_stored_limits, &ej, NULL) != 0)
            ej = NULL;
        const char *cause = spent ? json_string_value(json_object_get(ej, "cause")) : NULL;
        int unknown = unknown_outcome(a[i].outcome) || (cause && unknown_outcome(cause));
        /* settled: a verify found it not done (and this attempt's own
         * re-send got a clear answer), or an operator resolved it (as
         * failed: not for an action that sends again) */
        int resolved = strcmp(a[i].outcome, STEPS_RESOLVED) == 0 &&
                       !(resend && steps_error_code_is(a[i].error, "resolved_failed"));
        int settled = strcmp(a[i].outcome, "verified_not_done") == 0 || resolved ||
                      strcmp(a[i].outcome, STEPS_OPERATOR_SEND_AGAIN) == 0 ||
                      (!unknown && json_is_true(json_object_get(ej, "afterVerify")));
        json_decref(ej);
        if (settled && a[i].epoch > last_settled)
            last_settled = a[i].epoch;
        if (unknown && a[i].epoch > last_unknown)
            last_unknown = a[i].epoch;
    }
    return last_unknown >= 0 && last_unknown > last_settled;
}

int steps_cancel(struct store_tx *tx, void *arg, struct ifl_err *e)
{
    struct steps_cancel *a = arg;
    a->cancelled = 0;
    a->moved = 0;
    a->status[0] = '\0';
    struct store_execution x;
    struct store_step *rows = NULL;
    size_t n = 0;
    char *error = NULL;
    int rc = store_tx_execution_load(tx, a->workspace, a->execution_id, &x, &rows, &n, e);
    if (rc)
        return rc;
    snprintf(a->status, sizeof a->status, "%s", x.status);
    if (strcmp(x.status, "purged") == 0) {
        rc = err_set(e, IFL_EGONE, "execution %s was purged by retention", a->execution_id);
        goto out;
    }
    if (strcmp(x.status, "cancelled") == 0)
        goto out; /* cancelled before: nothing to do */
    if (strcmp(x.status, "completed") == 0 || strcmp(x.status, "stale") == 0) {
        rc = conflict(e, "execution-finished",
                      err_set(e, IFL_ECONFLICT,
                              "execution %s is %s; only an unfinished execution can be cancelled",
                              a->execution_id, x.status));
        goto out;
    }
    const struct store_step *unknown = NULL;
    for (size_t i = 0; i < n; i++) {
        const struct store_step *st = &rows[i];
        const struct steps_seen *seen = NULL;
        int judged = strcmp(st->kind, "GATEWAY") == 0 &&
                     (st->state == STEP_DISPATCHED || st->state == STEP_FAILED);
        if (judged) {
            seen = steps_seen_find(a->seen, a->n_seen, st->vertex);
            if (seen && seen->epoch != st->epoch)
                seen = NULL;
        }
        if (st->state == STEP_EXECUTING || (judged && !seen && st->state == STEP_DISPATCHED)) {
            rc = conflict(e, "step-executing",
                          err_set(e, IFL_ECONFLICT,
                                  "step '%s' is executing (its call may be on the wire); cancel "
                                  "again once it has ended",
                                  st->vertex));
            goto out;
        }
        if (judged && !seen) { /* FAILED since the caller read it */
            rc = err_set(e, IFL_ECONFLICT, "step '%s' changed while cancelling; cancel again",
                         st->vertex);
            goto out;
        }
        if (st->state == STEP_REQUIRES_RECONCILIATION) {
            rc = conflict(e, "step-needs-reconciliation",
                          err_set(e, IFL_ECONFLICT,
                                  "step '%s' may have taken effect; resolve it first, then cancel",
                                  st->vertex));
            goto out;
        }
        if (seen && seen->unknown && !unknown)
            unknown = st;
    }
    if (unknown && unknown->state == STEP_DISPATCHED) {
        rc = conflict(e, "step-outcome-unknown",
                      err_set(e, IFL_ECONFLICT,
                              "step '%s' sent a call whose effect is unknown (the charge may have "
                              "happened): its next attempt settles that with the same key or a "
                              "verify; cancel once it has ended",
                              unknown->vertex));
        goto out;
    }
    if (unknown) {
        rc = conflict(e, "step-outcome-unknown",
                      err_set(e, IFL_ECONFLICT,
                              "step '%s' failed after a call whose effect is unknown (the charge "
                              "may have happened): retry it (the same key or its verify settles "
                              "that) or resolve it, then cancel",
                              unknown->vertex));
        goto out;
    }
    {
        json_t *ej = json_pack("{s:s, s:s}", "code", "cancelled", "message",
                               a->reason ? a->reason : "cancelled by an operator");
        error = json_to_string(ej);
        json_decref(ej);
    }
    for (size_t i = 0; !rc && i < n; i++) {
        struct store_step *st = &rows[i];
        enum step_state was = st->state;
        if (was != STEP_PENDING && was != STEP_DISPATCHED)
            continue;
        st->state = STEP_SKIPPED;
        st->epoch++;
        set_text(&st->error, error);
        int changed = 0;
        rc = store_tx_step_update(tx, st, was, -1, &changed, e);
        if (!rc && !changed) /* a claim from another process took it meanwhile */
            rc = conflict(e, "step-executing",
                          err_set(e, IFL_ECONFLICT,
                                  "step '%s' was claimed while cancelling; cancel again once its "
                                  "attempt has ended",
                                  st->vertex));
        if (!rc)
            a->cancelled++;
    }
    if (!rc) {
        json_t *d = json_pack("{s:s, s:i}", "status", "cancelled", "cancelledSteps", a->cancelled);
        if (a->reason)
            json_object_set_new(d, "reason", json_string(a->reason));
        rc = steps_event(tx, a->workspace, a->execution_id, "execution.cancelled", d, x.version + 1,
                         e);
    }
    if (!rc)
        rc = store_tx_execution_set_status(tx, a->execution_id, "cancelled", x.version + 1, e);
    if (!rc) {
        snprintf(a->status, sizeof a->status, "cancelled");
        a->moved = 1;
    }
out:
    free(error);
    store_steps_free(rows, n);
    store_execution_clear(&x);
    return rc;
}
