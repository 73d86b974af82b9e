/*
 * gateway — GATEWAY steps (spec §6, layer 3): the policy of a step, the
 * rendering of its request, the classification of what came back, the
 * backoff between attempts, and a client that keeps many calls in flight on
 * libcurl's multi interface (one thread, no thread per call).
 *
 * The rules that keep money from moving twice live here:
 *  - an outcome is "not sent" only when libcurl proves no request byte left
 *    (connect/resolve failures, nothing uploaded); anything else that fails
 *    after sending is "ambiguous";
 *  - ambiguous outcomes are re-sent only under the `retry` policy (the
 *    request carries an Idempotency-Key), verified first under `verify`, and
 *    parked under `reconcile`;
 *  - rendered secrets never leave this module unmasked except on the wire:
 *    `struct gw_request` holds the real request and a masked twin for
 *    storage and logs.
 */
#ifndef IFL_GATEWAY_GATEWAY_H
#define IFL_GATEWAY_GATEWAY_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/err.h"

enum gw_ambiguous { GW_AMB_RETRY, GW_AMB_VERIFY, GW_AMB_RECONCILE };
/* onConflict, in the order of its names: fail, complete (already done),
 * retry (the provider's 409 means "a request with this key is still being
 * processed", as in the IETF draft and Stripe: try again later). */
enum gw_on_conflict { GW_CONFLICT_FAIL, GW_CONFLICT_COMPLETE, GW_CONFLICT_RETRY };

struct gw_policy {
    long timeout_ms;                 /* default 10000 */
    int max_attempts;                /* default 5 */
    long initial_interval_ms;        /* default 200 */
    double backoff_coefficient;      /* default 2 */
    long max_interval_ms;            /* default 30000 */
    long deadline_ms;                /* default 300000, across attempts */
    int client_error_complete;       /* clientErrorMode: 0 fail (default), 1 complete */
    enum gw_on_conflict on_conflict; /* default complete with an Idempotency-Key, else fail */
    enum gw_ambiguous ambiguous;     /* default retry with a key, else reconcile */
    int has_idempotency_key;         /* an Idempotency-Key header is configured */
    int has_verify;                  /* a verify request is configured */
    /* verify.afterMs: the least wait between an attempt whose outcome is
     * unknown and the verify request that asks about it — a provider may
     * still commit a request after the client gave up on it, and a verify
     * sees only what is committed.  Default: timeoutMs (as long again as
     * the call was given). */
    long verify_after_ms;
    int verify_after_set;  /* afterMs was given: a promise about the provider, kept
                              even past the deadline (engine_gw_verify_wait) */
    int fresh_connections; /* connections: "fresh" — every call on a connection of its
                              own, never a kept-alive one (default "reuse") */
};

/* Reads a GATEWAY config (borrowed) with the spec's defaults.  Validation
 * errors name the member with err->pointer relative to the config
 * ("/retry/maxAttempts").  Used at workflow PUT time and at run time. */
int gw_policy_parse(json_t *config, struct gw_policy *p, struct ifl_err *e);

/* ---- requests ---------------------------------------------------------------- */

struct gw_header {
    char *name, *value;
    char *sealed; /* the value with its secret sentinels, once unsealed (else NULL) */
};

struct gw_request {
    char *method;
    char *url;       /* with the query string appended */
    size_t query_at; /* where in url the `query` members begin (their secrets
                        are percent-encoded; the url template's are not) */
    struct gw_header *headers;
    size_t nheaders;
    char *body; /* NULL for none */
    /* url and body with their secret sentinels, kept by gw_request_unseal
     * when it substituted one (else NULL): what gw_request_masked* masks. */
    char *sealed_url, *sealed_body;
    char *idempotency_key; /* the Idempotency-Key header value, if any (masked
                              when it contains a secret) */
    /* 1 when sending it twice is harmless (a keyed request under `ambiguous:
     * retry`, a GET or HEAD).  libcurl, unasked, re-sends a request on a
     * fresh connection when a reused one dies before any response byte —
     * which is also what a provider that drops its answer after committing
     * looks like — so a request without this flag always gets a fresh
     * connection of its own.  gw_request_build sets 0. */
    int resend_safe;
    /* 1: a second send within the call — libcurl's re-send above, on a
     * fresh connection, of a request whose reused connection died before
     * any response byte — is stopped before it leaves, and the call ends
     * GW_T_AMBIGUOUS: the first send may have taken effect, and the
     * answer to the second (a 503, a 429, a 400) would say nothing of it
     * (found by a judge: a 503 to the re-send was taken as a refusal, and
     * the execution cancelled, with the charge made).  gw_request_build
     * sets 0. */
    int one_send;
    /* 1: the request goes out on a connection of its own, never a kept-alive
     * one: its answer must not be one a destination sent twice on a reused
     * connection (a verify's decides whether a call is sent again: found by
     * a judge, a verify read another order's charges under load).
     * gw_request_build sets 0. */
    int fresh;
    /* When set: the clock_now_ms() time from which the request must not
     * leave any more (its sender's lease, which another process may take
     * over once it lapses), read just before libcurl writes the request on
     * a connection; past it the call ends GW_T_NOT_SENT and nothing is
     * written.  Not owned; the sender moves it (renewals) while the call is
     * out.  gw_request_build sets NULL: no limit. */
    const _Atomic int64_t *send_by;
    /* The secret values substituted on the wire (wiped on clear), so that a
     * response echoing one can be scrubbed (gw_response_scrub). */
    char **secrets;
    size_t nsecrets;
};
void gw_request_clear(struct gw_request *r);
/* Adds secret values that r's answer must not show, though r may not
 * carry them (the other secrets of the workspace), to r's scrub list, with
 * the forms a destination may echo them in that no decoding gives back (as
 * a form decoder reads them, trimmed, lower case, as Latin-1).  values[i]
 * NULL is skipped; none is owned. */
void gw_request_scrub_also(struct gw_request *r, char *const *values, size_t n);

/* The same request with every substituted secret replaced by "****": the
 * only form that may be stored, returned or logged.  Built on demand (only
 * failures show it): {"method","url","headers","body"} as a new reference,
 * and the url alone as a heap string. */
json_t *gw_request_masked(const struct gw_request *r);
char *gw_request_masked_url(const struct gw_request *r);

/* 1 when s is an HTTP field name (an RFC 9110 token). */
int gw_header_name_valid(const char *s);

/* The authority of url, "scheme://[userinfo@]host[:port]/…": *auth where
 * it begins (after "://"; url itself when there is none, returning 0),
 * *at the '@' that ends its userinfo (the last one before the path) or
 * NULL, *end where it ends (at '/', '?', '#' or the string's end).  All
 * point into url. */
int gw_url_authority(const char *url, const char **auth, const char **at, const char **end);

/* 0 when libcurl would send to url (it parses it whole: a host it accepts,
 * a port from 1 to 65535); else 1, and why (libcurl's reason) in
 * why[0..n).  For urls kept to be called later (subscriptions), refused at
 * once rather than failing every delivery. */
int gw_url_check(const char *url, char *why, size_t n);

/* Renders `rendered` (the evaluated {url, headers, query, body} template,
 * borrowed; strings may contain secret sentinels, see gw_secret_sentinel)
 * into a request.  method NULL = "GET" without a body, "POST" with one.
 * IFL_EINVAL (nothing to send) when the url holds a space or a control
 * character, a header name is no token, or a header value holds a control
 * character other than HTAB — rendered data must not add a header or a
 * request; gw_request_unseal checks the same after substituting secrets. */
int gw_request_build(const char *method, json_t *rendered, struct gw_request *out,
                     struct ifl_err *e);

/* 1 when r carries an Idempotency-Key header with a value (after its
 * secrets, and without the spaces and tabs around it, which a header value
 * loses when it is built or unsealed): what goes on the wire. */
int gw_request_has_key(const struct gw_request *r);

/* Secret resolution for rendering: the template engine substitutes the
 * string this returns (a sentinel naming the secret); gw_request_build
 * replaces sentinels with the real value on the wire copy and "****" in the
 * masked copy.  The resolver passed to the sentinel step only checks that
 * the secret exists. */
char *gw_secret_sentinel(const char *name);
typedef int (*gw_secret_fn)(void *ctx, const char *name, char **value);
/* Replaces sentinels in the wire copy of r using fn (values wiped after
 * use).  Returns 0 or the resolver's error. */
int gw_request_unseal(struct gw_request *r, gw_secret_fn fn, void *ctx, struct ifl_err *e);

/* ---- egress (egress.c) --------------------------------------------------------- */
/* The addresses outbound calls (GATEWAY steps, verify requests, outgoing
 * webhooks) may not connect to, for the whole process: a comma-separated
 * list of groups — link-local (169.254.0.0/16, fe80::/10: cloud metadata
 * services live there), loopback, private (RFC 1918, 100.64.0.0/10,
 * fc00::/7), unspecified — and CIDRs, or "none".  Until it is set,
 * link-local is denied.  IFL_EINVAL for an unknown word. */
int gw_egress_set(const char *spec, struct ifl_err *e);
struct sockaddr;
/* 1 when a connection to sa is denied (the address then goes to shown as
 * text, cap bytes), else 0.  IPv4-mapped IPv6 addresses count as IPv4. */
int gw_egress_denied(const struct sockaddr *sa, char *shown, size_t cap);

/* ---- trusted CAs ---------------------------------------------------------------- */
/* A PEM file of the CAs whose certificates https:// calls (GATEWAY steps,
 * verify requests, outgoing webhooks) trust, for the whole process, in
 * place of the system's bundle (a private CA in front of internal
 * providers; the tests' HTTPS providers).  Set before any client starts;
 * the path is copied.  IFL_EINVAL when it cannot be read. */
int gw_ca_file_set(const char *path, struct ifl_err *e);

/* ---- responses and their class ------------------------------------------------ */

enum gw_transport {
    GW_T_OK,        /* an HTTP response arrived */
    GW_T_NOT_SENT,  /* failed before any request byte left */
    GW_T_AMBIGUOUS, /* failed after sending (timeout, reset) */
};

struct gw_response {
    enum gw_transport transport;
    long status;
    json_t *headers; /* object of lowercase name → value */
    char *body;      /* raw body (capped) */
    size_t body_len;
    int body_too_large;   /* the body passed the cap (4 MiB): body is NULL,
                             the output says "bodyTooLarge": true */
    int body_undecodable; /* its Content-Encoding could not be undone (damaged, or
                             br/zstd/compress): body is NULL, the output says
                             "bodyUndecodable": true */
    char error[256];      /* transport error text */
    int denied;           /* not sent: the egress policy refused the address */
    int late;             /* not sent: the request's send_by had passed */
    int shutdown;         /* ended by the client's stop (gw_client_free), not by the call */
    int64_t elapsed_ms;
};
void gw_response_clear(struct gw_response *r);

/* ---- content codings (decode.c) ----------------------------------------------- */
enum {
    GW_DECODE_DAMAGED = 1,     /* the stream is cut short, corrupt, or followed by other bytes */
    GW_DECODE_TOO_LARGE = 2,   /* decoded, it passes cap */
    GW_DECODE_UNSUPPORTED = 3, /* a compression not decoded here (br, zstd, compress) */
};
/* Undoes the Content-Encoding `encoding` (a header value: codings in the
 * order applied; NULL none) on the *len bytes at *body (malloc'd; replaced
 * with the decoded bytes, NUL-terminated, at most cap of them): gzip,
 * x-gzip and deflate (at most 16 layers); identity, and a token it does
 * not know (a misconfigured "utf-8"), are skipped.
 * 0, or a GW_DECODE_* (then *body holds what came, or a layer of it undone:
 * not the answer's content). */
int gw_body_decode(const char *encoding, char **body, size_t *len, size_t cap);
/* The response's body decoded by its Content-Encoding header (gw_body_decode,
 * capped at 4 MiB); one that cannot be is dropped, with body_too_large or
 * body_undecodable set: the status still decides.  The client does this to
 * every answer. */
void gw_response_decode(struct gw_response *r);
/* Replaces every occurrence of a secret value that req sent (values of 4
 * bytes or more; shorter ones would mangle any body) with "****" in the
 * response's body and header values, before anything stores or shows it. */
void gw_response_scrub(struct gw_response *resp, const struct gw_request *req);

enum gw_class {
    GW_SUCCESS,      /* 2xx, 3xx → COMPLETED */
    GW_RETRY,        /* not sent, or refused (408/429/503): retry */
    GW_AMBIGUOUS,    /* outcome unknown: the `ambiguous` policy */
    GW_CONFLICT,     /* 409: onConflict */
    GW_CLIENT_ERROR, /* other 4xx: clientErrorMode */
};

/* Classifies per the spec's table.  *retry_after_ms receives Retry-After
 * (seconds or HTTP-date, relative to now_ms) or 0. */
enum gw_class gw_classify(const struct gw_response *r, int64_t now_ms, int64_t *retry_after_ms);
const char *gw_class_name(enum gw_class c);
/* The response's Retry-After (delta-seconds or HTTP-date, relative to
 * now_ms) in ms, capped at a year; 0 when absent or malformed.
 * gw_classify reads it only for the classes that retry. */
int64_t gw_retry_after_ms(const struct gw_response *r, int64_t now_ms);

/* The output of a step: {status, headers, body} with JSON bodies parsed
 * (new reference). */
json_t *gw_output(const struct gw_response *r);
/* The shortest secret value the scrubs below recognise: a shorter one would
 * match ordinary text ("on", "id"), so the API refuses to store one. */
#define GW_SECRET_MIN 4
/* The most text a rendered body, header or query value may take (an
 * execution's outputs together take at most as much): past it the request
 * is not built — and the bytes are not made — and the step fails
 * request_error. */
#define GW_RENDERED_MAX ((size_t)16 << 20)

/* Replaces a secret value req sent (4 bytes or more) with "****" in every
 * string of out, the parsed output: a body may spell a secret with JSON
 * escapes (\/, \u0041) that the byte scrub cannot see. */
void gw_output_scrub(json_t *out, const struct gw_request *req);

/* Full-jitter backoff before attempt n+1 (n >= 1 attempts made):
 * random(0, min(max, initial × coefficient^(n-1))), never below
 * retry_after_ms.  `rnd` in [0, 1). */
int64_t gw_backoff_ms(const struct gw_policy *p, int attempts_made, int64_t retry_after_ms,
                      double rnd);

/* A uniform random number in [0, 1) from the CSPRNG (0.5 if it fails): the
 * `rnd` of gw_backoff_ms. */
double gw_rnd01(void);

/* Parses an HTTP-date (IMF-fixdate, RFC 850, asctime) to Unix ms; -1 if
 * malformed. */
int64_t gw_http_date_ms(const char *s);

/* ---- the client: many calls in flight on one thread --------------------------- */

struct gw_client;
typedef void (*gw_done_fn)(void *ctx, struct gw_response *resp /* callee owns */);

/* max_inflight: concurrent transfers (default 256). *out owned by caller. */
int gw_client_new(int max_inflight, struct gw_client **out, struct ifl_err *e);
/* Stops the thread: queued calls not yet started end at once unsent
 * (GW_T_NOT_SENT, "shutdown"); calls in flight get grace_ms to end on their
 * own, then end with GW_T_AMBIGUOUS ("shutdown") unless no byte was sent.
 * Every `done` has run when it returns. */
void gw_client_free(struct gw_client *c, int64_t grace_ms);
/* Queues a call; `done` runs on the client's thread when it ends (keep it
 * short: hand the response to another thread).  The request must stay
 * valid until done runs. */
void gw_client_submit(struct gw_client *c, const struct gw_request *req, long timeout_ms,
                      gw_done_fn done, void *ctx);
/* Performs one call synchronously (verify requests, tests). */
int gw_call(const struct gw_request *req, long timeout_ms, struct gw_response *out);

#endif
