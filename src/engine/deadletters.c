/*
 * deadletters — the operator's list of what needs a hand (spec §5):
 * FAILED and REQUIRES_RECONCILIATION steps, and dead webhook deliveries,
 * in one list, newest first.
 *
 * The two come from two tables; a page takes up to `limit` of each, past
 * the cursor, and keeps the newest `limit` of the merge.  The order is
 * (updatedAt descending; at one instant steps before deliveries; then the
 * row's own key descending), so a cursor names one position in both:
 *
 *   step      AT~EXECUTION~VERTEX            (the form pages had before)
 *   delivery  AT~hook~SUBSCRIPTION~EVENT_ID  ("hook" is not a 64-hex id)
 */
#include "base/mem.h"
#include "engine/engine_int.h"
#include "json/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_STEP, KIND_HOOK };

struct cursor {
    int64_t at;
    int kind;
    char a[129], b[129]; /* step: execution, vertex; hook: subscription, event id */
};

/* 0, or -1 when `text` is no cursor this list hands out. */
static int cursor_parse(const char *text, struct cursor *c)
{
    memset(c, 0, sizeof *c);
    long long at = 0;
    int used = 0;
    if (sscanf(text, "%lld~hook~%128[A-Za-z0-9_.-]~%128[0-9a-f]%n", &at, c->a, c->b, &used) == 3 &&
        !text[used] && at >= 0 && strlen(c->b) == 64) {
        c->at = at;
        c->kind = KIND_HOOK;
        return 0;
    }
    used = 0;
    if (sscanf(text, "%lld~%64[0-9a-f]~%128[A-Za-z0-9_.-]%n", &at, c->a, c->b, &used) == 3 &&
        !text[used] && at >= 0 && strlen(c->a) == 64) {
        c->at = at;
        c->kind = KIND_STEP;
        return 0;
    }
    return -1;
}

static json_t *step_item(const struct store_step *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string("step"));
    json_object_set_new(o, "executionId", json_string(r->execution_id));
    json_object_set_new(o, "vertex", json_string(r->vertex));
    json_object_set_new(o, "state", json_string(store_step_state_name(r->state)));
    json_object_set_new(o, "attempts", json_integer(r->attempts));
    json_object_set_new(o, "error", json_stored_value(r->error));
    json_object_set_new(o, "updatedAt", json_time(r->updated_at));
    return o;
}

static json_t *hook_item(const struct store_delivery *d)
{
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string("delivery"));
    json_object_set_new(o, "subscription", json_string(d->subscription));
    json_object_set_new(o, "eventId", json_string(d->event_id));
    json_object_set_new(o, "type", d->type ? json_string(d->type) : json_null());
    json_object_set_new(o, "executionId",
                        d->execution_id[0] ? json_string(d->execution_id) : json_null());
    json_object_set_new(o, "state", json_string(d->state));
    json_object_set_new(o, "attempts", json_integer(d->attempts));
    json_object_set_new(o, "lastStatus",
                        d->last_status ? json_integer(d->last_status) : json_null());
    json_object_set_new(o, "error", d->last_error ? json_string(d->last_error) : json_null());
    json_object_set_new(o, "updatedAt", json_time(d->updated_at));
    return o;
}

/* > 0 when step s comes before delivery d in the list's order. */
static int step_first(const struct store_step *s, const struct store_delivery *d)
{
    return s->updated_at >= d->updated_at; /* at one instant, steps first */
}

int engine_dead_letters(struct engine *g, const char *ws, const char *after, int limit,
                        json_t **out, struct ifl_err *e)
{
    *out = NULL;
    struct cursor c = {.at = INT64_MAX, .kind = KIND_STEP};
    if (after && cursor_parse(after, &c))
        return err_set(e, IFL_EINVAL, "after must be the `next` of a previous page");
    /* Where each table resumes.  After a step: the steps past it, and the
     * deliveries of its instant or older.  After a delivery: the steps
     * strictly older, and the deliveries past it. */
    struct store_dead_cursor sc = {.at = c.at}, *sp = NULL;
    int64_t hat = c.at;
    const char *hsub = "", *hev = "";
    if (after && c.kind == KIND_STEP) {
        snprintf(sc.execution_id, sizeof sc.execution_id, "%s", c.a);
        snprintf(sc.vertex, sizeof sc.vertex, "%s", c.b);
        hat = c.at == INT64_MAX ? c.at : c.at + 1; /* updated_at <= at */
    } else if (after) {
        hsub = c.a; /* ("", "") ranks below every step key: updated_at < at */
        hev = c.b;
    }
    if (after)
        sp = &sc;
    struct store_step *steps = NULL;
    struct store_delivery *hooks = NULL;
    size_t ns = 0, nh = 0;
    int rc = store_dead_letters(g->store, ws, sp, limit, &steps, &ns, e);
    if (!rc)
        rc = store_deliveries_dead(g->store, ws, hat, hsub, hev, limit, &hooks, &nh, e);
    if (rc)
        goto out;
    json_t *items = json_array();
    size_t i = 0, j = 0;
    char *next = NULL;
    while ((i < ns || j < nh) && json_array_size(items) < (size_t)limit) {
        int take_step = j >= nh || (i < ns && step_first(&steps[i], &hooks[j]));
        free(next);
        if (take_step) {
            const struct store_step *r = &steps[i++];
            json_array_append_new(items, step_item(r));
            next = xasprintf("%lld~%s~%s", (long long)r->updated_at, r->execution_id, r->vertex);
        } else {
            const struct store_delivery *d = &hooks[j++];
            json_array_append_new(items, hook_item(d));
            next = xasprintf("%lld~hook~%s~%s", (long long)d->updated_at, d->subscription,
                             d->event_id);
        }
    }
    /* a full page may have a next one; a short page is the last */
    int full = json_array_size(items) == (size_t)limit;
    *out = json_pack("{s:o, s:o}", "items", items, "next",
                     full && next ? json_string(next) : json_null());
    free(next);
out:
    store_steps_free(steps, ns);
    store_deliveries_free(hooks, nh);
    return rc;
}
