/*
 * sse — see sse.h.
 *
 * The stream polls the workspace's event feed from the cursor the trigger
 * took before its commit (http_res_stream asks again about every 100 ms
 * while there is nothing to send), keeps the events of its execution, and
 * ends at the execution's terminal event.  Reading the feed rather than a
 * per-execution index keeps the hot insert path as it is; the price is
 * that a stream on a busy workspace reads the other executions' events too
 * (pages of 500).
 */
#include "api/sse.h"
#include "base/clock.h"
#include "base/mem.h"
#include "json/json.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 500
#define PAGES_PER_TURN 4
#define KEEPALIVE_MS 15000

struct sse {
    struct engine *g;
    char *ws;
    char xid[65];
    char cursor[48];
    struct buf out; /* bytes not yet handed to the server */
    size_t off;
    int ended; /* the last event is in out */
    int64_t deadline, last_write;
};

static void sse_event(struct sse *s, const char *id, const char *type, json_t *data)
{
    char *text = json_to_string(data);
    if (id)
        buf_printf(&s->out, "id: %s\n", id);
    buf_printf(&s->out, "event: %s\ndata: %s\n\n", type, text ? text : "null");
    free(text);
    s->last_write = clock_mono_ms();
}

json_t *api_event_json(const struct store_event *ev)
{
    char ts[32];
    clock_rfc3339(ev->created_at, ts);
    json_t *data = NULL;
    if (ev->data && json_parse(ev->data, strlen(ev->data), &json_stored_limits, &data, NULL))
        data = json_string(ev->data);
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(ev->id));
    json_object_set_new(o, "type", json_string(ev->type));
    json_object_set_new(o, "executionId",
                        ev->execution_id[0] ? json_string(ev->execution_id) : json_null());
    json_object_set_new(o, "aggregateVersion", json_integer(ev->aggregate_version));
    json_object_set_new(o, "createdAt", json_string(ts));
    json_object_set_new(o, "data", data ? data : json_null());
    return o;
}

static int terminal(const char *type)
{
    return strcmp(type, "execution.completed") == 0 || strcmp(type, "execution.failed") == 0 ||
           strcmp(type, "execution.stale") == 0 || strcmp(type, "execution.cancelled") == 0;
}

static void sse_end(struct sse *s, const char *type, const char *status)
{
    json_t *d = json_pack("{s:s, s:s}", "executionId", s->xid, "status", status);
    sse_event(s, NULL, type, d);
    json_decref(d);
    s->ended = 1;
}

/* Reads the feed after the cursor; appends this execution's events. */
static void poll_feed(struct sse *s)
{
    for (int page = 0; page < PAGES_PER_TURN && !s->ended; page++) {
        struct store_event *ev = NULL;
        size_t n = 0;
        struct ifl_err e = {0};
        if (store_events_list(engine_store(s->g), s->ws, s->cursor, PAGE, &ev, &n, &e))
            return; /* asked again at the next turn */
        for (size_t i = 0; i < n && !s->ended; i++) {
            snprintf(s->cursor, sizeof s->cursor, "%s", ev[i].cursor);
            if (strcmp(ev[i].execution_id, s->xid) != 0)
                continue;
            json_t *item = api_event_json(&ev[i]);
            sse_event(s, ev[i].id, ev[i].type, item);
            json_decref(item);
            if (terminal(ev[i].type))
                sse_end(s, "end", ev[i].type + strlen("execution."));
        }
        store_events_free(ev, n);
        if (n < PAGE)
            return;
    }
}

static long sse_read(void *arg, char *buf, size_t max)
{
    struct sse *s = arg;
    if (s->off == s->out.len) {
        if (s->ended)
            return -1;
        s->off = 0;
        s->out.len = 0;
        poll_feed(s);
        int64_t now = clock_mono_ms();
        if (!s->ended && s->out.len == 0 && now >= s->deadline) {
            struct store_execution x;
            struct ifl_err e = {0};
            int rc = store_execution_get(engine_store(s->g), s->ws, s->xid, &x, &e);
            sse_end(s, "timeout", rc ? "unknown" : x.status);
            if (!rc)
                store_execution_clear(&x);
        } else if (s->out.len == 0 && now - s->last_write >= KEEPALIVE_MS) {
            buf_puts(&s->out, ": keepalive\n\n");
            s->last_write = now;
        }
        if (s->out.len == 0)
            return 0;
    }
    size_t n = s->out.len - s->off;
    if (n > max)
        n = max;
    memcpy(buf, s->out.p + s->off, n);
    s->off += n;
    return (long)n;
}

static void sse_free(void *arg)
{
    struct sse *s = arg;
    buf_free(&s->out);
    free(s->ws);
    free(s);
}

void sse_run_stream(struct engine *g, struct http_res *res, const char *ws,
                    const struct trigger_res *out, const char *cursor, int64_t max_ms)
{
    struct sse *s = xcalloc(1, sizeof *s);
    s->g = g;
    s->ws = xstrdup(ws);
    snprintf(s->xid, sizeof s->xid, "%s", out->id);
    snprintf(s->cursor, sizeof s->cursor, "%s", cursor);
    buf_init(&s->out, 0);
    s->deadline = clock_mono_ms() + max_ms;
    json_t *first = json_pack("{s:s, s:b, s:s}", "executionId", out->id, "deduplicated",
                              !out->created && !out->stale, "status",
                              out->created ? "running" : out->status); /* as the 201 */
    sse_event(s, NULL, "execution", first);
    json_decref(first);
    /* a repeat of an execution that already ended: its events are behind
     * the cursor, so the answer is that and its status */
    if (!out->created && strcmp(out->status, "running") != 0 &&
        strcmp(out->status, "requires_reconciliation") != 0)
        sse_end(s, "end", out->status);
    http_res_stream(res, 200, "text/event-stream", sse_read, sse_free, s);
    http_res_header(res, "Cache-Control", "no-store");
    http_res_header(res, "X-Accel-Buffering", "no");
}
