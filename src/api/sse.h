/*
 * sse — the text/event-stream answer of `…/run` (spec §4): an execution's
 * events as they commit, until it ends.  Private to src/api.
 */
#ifndef IFL_API_SSE_H
#define IFL_API_SSE_H

#include "engine/engine.h"
#include "store/store.h"
#include "http/http.h"

/* Fills res with the stream of execution out->id of workspace ws: first an
 * `execution` event (the trigger's answer: executionId, deduplicated,
 * status), then each event of the execution committed after feed position
 * `cursor` (taken before the trigger), as `id: <event id>`, `event: <type>`,
 * `data: <the feed's item>`, then `end` with the final status once the
 * execution completed, failed or was stale — or `timeout` after
 * max_ms.  A comment line keeps idle connections alive every 15 s. */
/* An event as the feed shows it (GET …/events, and each event of a stream):
 * {"id","type","executionId","aggregateVersion","createdAt","data"}, a new
 * reference. */
json_t *api_event_json(const struct store_event *ev);

void sse_run_stream(struct engine *g, struct http_res *res, const char *ws,
                    const struct trigger_res *out, const char *cursor, int64_t max_ms);

#endif
