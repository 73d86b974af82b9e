/*
 * api — the engine's HTTP JSON API: routing, request validation, RFC 9457
 * problem documents, and the JSON shapes of spec §11.
 *
 * Independent of the HTTP library: api_handle() takes an http_req and fills
 * an http_res, so tests can drive it without sockets.  Bad input always gets
 * a problem document and changes nothing.  Never echoes secret values.
 */
#ifndef IFL_API_API_H
#define IFL_API_API_H

#include "engine/engine.h"
#include "http/http.h"

struct api;

struct api_opts {
    size_t max_body;         /* bytes; for the 413 detail */
    int max_depth;           /* JSON nesting limit for bodies */
    const char *admin_token; /* NULL = no auth (loopback only) */
    int test_clock;          /* serve POST /v1/test/clock (tests only) */
    /* A `Prefer: wait` waits at most this long (0: 60 s); a harness with no
     * workers (fuzz_api) keeps it short. */
    int64_t max_wait_ms;
};

/* Borrows g, which must outlive the api. */
struct api *api_new(struct engine *g, const struct api_opts *o);
void api_free(struct api *a);
/* Borrows srv (which serves this api) for /metrics' connection gauge; call
 * once it is started, before it is stopped.  Safe while requests run. */
void api_attach_server(struct api *a, const struct http_server *srv);

/* http_handler_fn-compatible entry point (ctx = struct api *). */
void api_handle(void *ctx, const struct http_req *req, struct http_res *res);
/* http_toobig_fn-compatible. */
void api_toobig(void *ctx, size_t limit, struct http_res *res);

/* Fills res with an application/problem+json document. */
void api_problem(struct http_res *res, int status, const char *slug, const char *detail,
                 const char *pointer);
/* Fills res from an error (status and slug from err_http_status /
 * err_problem_slug, or e->slug when set). */
void api_problem_err(struct http_res *res, const struct ifl_err *e);

#endif
