/*
 * listener — the mock provider's HTTP front: libmicrohttpd, one thread per
 * connection, a capped request body, and one handler per request that may
 * either answer or drop the connection without a response.
 *
 * It exists beside src/http/server.c because that adapter always answers;
 * dropping a connection after the provider committed a charge is the fault
 * the mock must be able to inject.  Requests and responses use the same
 * struct http_req / struct http_res as the project's server.
 */
#ifndef MOCKPAY_LISTENER_H
#define MOCKPAY_LISTENER_H

#include <stddef.h>

#include "base/err.h"
#include "http/http.h"

/* What a handler wants done with the connection. */
enum listener_action {
    LISTENER_RESPOND = 0, /* send res                                     */
    LISTENER_DROP = 1,    /* close the connection without sending anything */
};

/* Must be thread safe; fills res (status, body, headers) when it responds. */
typedef enum listener_action (*listener_fn)(void *ctx, const struct http_req *req,
                                            struct http_res *res);
/* Called (thread safe) once for every accepted connection. */
typedef void (*listener_conn_fn)(void *ctx);

struct listener;

/* Binds `listen` ("HOST:PORT", port 0 = any free) and serves.  Bodies over
 * max_body bytes are answered 413 without calling fn.  on_conn (NULL ok)
 * hears of each new connection, with the same ctx.  *out is owned by the
 * caller (listener_stop).  Returns 0, IFL_EINVAL (bad address) or IFL_EIO. */
int listener_start(const char *listen, size_t max_body, listener_fn fn, listener_conn_fn on_conn,
                   void *ctx, struct listener **out, struct ifl_err *e);
/* The bound port. */
unsigned listener_port(const struct listener *l);
/* Stops accepting, lets the requests already begun finish (30 s at most),
 * closes connections, waits for handler threads, frees.  NULL ok. */
void listener_stop(struct listener *l);

#endif
