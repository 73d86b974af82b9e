/*
 * http/client — a small blocking HTTP client over libcurl, for the CLI's
 * operator commands (and, later, GATEWAY steps).
 *
 * Response bodies are capped; nothing here logs request or response
 * contents (they may hold secrets), and errors show the url with its
 * password masked.
 */
#ifndef IFL_HTTP_CLIENT_H
#define IFL_HTTP_CLIENT_H

#include <stddef.h>

#include "base/err.h"

struct http_call {
    const char *method; /* "GET", "POST", … */
    const char *url;
    const char *body;           /* NULL for none; sent as application/json */
    const char *const *headers; /* NULL-terminated "Name: value" lines, or NULL */
    long timeout_ms;            /* 0 = 30000 */
    size_t max_response;        /* 0 = 16 MiB */
};

struct http_reply {
    long status;
    char *body; /* NUL-terminated; caller frees (http_reply_clear) */
    size_t len;
};

/* Performs the call.  Transport failures are IFL_EIO with a message;
 * any HTTP status is success (inspect reply->status). */
int http_client_do(const struct http_call *c, struct http_reply *reply, struct ifl_err *e);
void http_reply_clear(struct http_reply *r);

#endif
