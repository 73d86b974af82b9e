/*
 * http — the HTTP/1.1 server adapter over libmicrohttpd.
 *
 * It collects a request (method, decoded path, headers, query, body under a
 * cap), hands it to ONE handler function, and sends what the handler filled
 * in.  It knows nothing of routes or JSON beyond the 413 it must answer
 * itself when a body exceeds the cap (the body is never buffered past it).
 *
 * Threads, two models (http_opts.threads):
 *   0   one thread per connection: a handler may block (e.g. waiting for a
 *       group commit) without stalling other connections.
 *   N   event-driven: N threads, each serving its share of the connections
 *       from an epoll loop.  A handler that blocks stalls its thread's other
 *       connections for that long, so a handler with a long wait defers its
 *       answer instead (http_defer): the connection is suspended, and the
 *       thread serves others until whoever finishes the work resumes it.
 *       Far fewer threads and context switches per request.
 * Either way the handler must be thread safe.
 */
#ifndef IFL_HTTP_HTTP_H
#define IFL_HTTP_HTTP_H

#include <stddef.h>

#include "base/err.h"

struct http_req {
    const char *method; /* "GET", "POST", … */
    const char *path;   /* percent-decoded path, without the query */
    const char *body;   /* NUL-terminated; "" when empty */
    size_t body_len;
    /* Lookups (case-insensitive for headers); NULL when absent.  Borrowed,
     * valid for the duration of the handler call. */
    const char *(*header)(const struct http_req *r, const char *name);
    const char *(*query)(const struct http_req *r, const char *name);
    /* The first query parameter whose name is not in `known` (NULL-
     * terminated), that is given twice or without a value ("?limit",
     * "?after="), or NULL: a misspelled one would otherwise be ignored, of
     * a repeated one query() shows the first only, and an empty one would
     * read as absent. */
    const char *(*query_other)(const struct http_req *r, const char *const *known);
    /* How many header lines carry `name` (case-insensitive): header() shows
     * only the first, so a field that must be single checks this. */
    int (*header_count)(const struct http_req *r, const char *name);
    /* 1 when the path as sent held a percent-encoded '/' (%2F): `path` has
     * it decoded, so its segments no longer show where the client's were. */
    int path_encoded_slash;
    void *impl;
};

#define HTTP_MAX_RES_HEADERS 8

struct http_res {
    int status;
    const char *content_type; /* static string; default application/json */
    char *body;               /* owned by the response (freed after send) */
    size_t body_len;
    struct {
        char *name, *value; /* owned */
    } headers[HTTP_MAX_RES_HEADERS];
    int nheaders;
    /* a streamed answer (http_res_stream) instead of body */
    long (*stream_fn)(void *arg, char *buf, size_t max);
    void (*stream_free)(void *arg);
    void *stream_arg;
};

/* Adds a header to a response (copies both strings). Extra headers past
 * HTTP_MAX_RES_HEADERS are dropped. */
void http_res_header(struct http_res *res, const char *name, const char *value);
/* Sets the body (takes ownership of body). */
void http_res_body(struct http_res *res, int status, const char *content_type, char *body);
void http_res_clear(struct http_res *res);
/* A streamed answer of unknown length (chunked; e.g. text/event-stream).
 * After the headers the server asks fn(arg, buf, max) for more: it returns
 * the bytes it wrote to buf (> 0), 0 for "nothing yet" (asked again about
 * every 100 ms; an event-loop thread serves other connections meanwhile),
 * or -1 for the end.  fn runs on a server thread, one call at a time, and
 * must not block for long.  free_fn(arg) runs exactly once: when the
 * answer ended, the client left, or the answer was never sent.  A stopping
 * server ends every stream (fn is not asked again). */
typedef long (*http_stream_fn)(void *arg, char *buf, size_t max);
void http_res_stream(struct http_res *res, int status, const char *content_type, http_stream_fn fn,
                     void (*free_fn)(void *arg), void *arg);

typedef void (*http_handler_fn)(void *ctx, const struct http_req *req, struct http_res *res);
/* Called for the 413 the adapter answers itself (so the body is a problem
 * document consistent with the handler's). */
typedef void (*http_toobig_fn)(void *ctx, size_t limit, struct http_res *res);

struct http_opts {
    const char *listen;  /* "HOST:PORT" (IPv4) or "[ADDR]:PORT"; port 0 = any free */
    size_t max_body;     /* bytes; default 1 MiB */
    unsigned conn_limit; /* default 1024 */
    unsigned per_ip;     /* connections one client address may hold; 0: no limit */
    unsigned timeout_s;  /* idle connection timeout; default 60 */
    unsigned threads;    /* 0: a thread per connection; N: N event-loop threads */
    http_handler_fn handler;
    http_toobig_fn toobig;
    void *ctx;
};

struct http_server;

/* Binds and starts serving.  *out owned by the caller (http_server_stop). */
int http_server_start(const struct http_opts *o, struct http_server **out, struct ifl_err *e);
/* The bound port (useful with port 0). */
unsigned http_server_port(const struct http_server *s);
/* Connections the server holds now (all its threads), open or closing. */
unsigned http_server_connections(const struct http_server *s);
/* Stops accepting, waits for in-flight requests (deferred ones until they
 * are resumed and answered), frees. NULL ok. */
void http_server_stop(struct http_server *s);
/* Stops accepting new connections only (graceful drain begins) — with a
 * thread per connection; on the event loops it does nothing (see
 * server.c): the stop answers new requests 503 instead. */
void http_server_quiesce(struct http_server *s);

/* Deferred answers (event-driven model only).  In a handler, http_defer
 * suspends the request and returns a handle; the handler then returns
 * without filling res.  Some thread later calls http_resume(handle) (once,
 * and only after http_defer returned); a server thread then calls
 * finish(arg, req, res), which fills res as a handler would (req is the same
 * request).  finish runs exactly once, even when the client is gone by then
 * (res is then discarded).  A finish may itself call http_defer (a second
 * wait: same rules, with a new finish) unless the client is gone.
 * http_defer succeeds whenever http_can_defer(r) is 1; otherwise (the
 * thread-per-connection model, a request already deferred and not in its
 * finish, a finish whose client is gone, or a request that did not come from
 * a server: impl NULL, as a test or fuzz target builds them) it returns NULL
 * and suspends nothing: answer now. */
typedef void (*http_finish_fn)(void *arg, const struct http_req *req, struct http_res *res);
struct http_later;
struct http_later *http_defer(const struct http_req *r, http_finish_fn finish, void *arg);
void http_resume(struct http_later *l);
/* 1 when http_defer would defer r (the event-driven model). */
int http_can_defer(const struct http_req *r);

/* Parses a header value that is an RFC 8941 sf-string ("…" with \" and \\
 * escapes; parameters after it, `"k";a=1`, are checked and ignored) or,
 * leniently, a bare token of printable ASCII without spaces or quotes (all
 * of it: `k;a=1` is that key).  The unescaped value (1 to cap-1
 * characters) goes to out.  0 or IFL_EINVAL. */
int http_sf_string(const char *h, char *out, size_t cap);

/* The seconds of the first `wait` preference in a Prefer header value
 * (RFC 7240 §4.3: `Prefer: wait=10`, among other preferences, the value
 * bare or quoted), or -1: no header, no wait preference, or a malformed one
 * (to be ignored).  Large values are clamped to 100000000. */
long http_prefer_wait(const char *h);

/* Parses "HOST:PORT" into host (cap bytes) and port.  0 or IFL_EINVAL. */
int http_parse_listen(const char *listen, char *host, size_t cap, unsigned *port);

#endif
