/*
 * workflow — parsing and validating workflow definitions (spec §3) into an
 * immutable, compiled graph the engine runs.
 *
 * A definition is accepted only when it is a DAG with at least one
 * ENTRY_POINT, every edge end exists, every vertex type is known, and every
 * expression compiles; otherwise IFL_EVALIDATION with a JSON Pointer to the
 * offending member.  A compiled `struct wf` is immutable and may be shared
 * between threads.
 */
#ifndef IFL_ENGINE_WORKFLOW_H
#define IFL_ENGINE_WORKFLOW_H

#include <jansson.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/cron.h"
#include "engine/identity.h"
#include "gateway/gateway.h"

struct expr;
struct tmpl;

enum wf_vertex_type { WF_ENTRY_POINT, WF_GATEWAY, WF_TRANSFORM };

/* An ENTRY_POINT's "signature" (spec §8): how its trigger authenticates
 * inbound webhooks.  Strings are borrowed from the definition. */
enum wf_sig_scheme { WF_SIG_NONE, WF_SIG_STANDARD, WF_SIG_HMAC };
struct wf_signature {
    enum wf_sig_scheme scheme;
    char secret[129];      /* the workspace secret's name */
    int64_t tolerance_s;   /* standard-webhooks: webhook-timestamp within ± this of now */
    const char *header;    /* hmac-sha256: the signature header */
    const char *prefix;    /* hmac-sha256: before the MAC ("sha256="), or NULL */
    const char *ts_prefix; /* hmac-sha256, Stripe-style: the timestamp element ("t="), or NULL */
    int base64;            /* hmac-sha256: the MAC in base64 (else hex) */
};

struct wf_vertex {
    char *id;
    enum wf_vertex_type type;
    json_t *config;                        /* borrowed from the definition */
    int has_fields;                        /* ENTRY_POINT: idempotencyFields present */
    struct id_fields fields;               /* ENTRY_POINT */
    struct wf_signature sig;               /* ENTRY_POINT: scheme WF_SIG_NONE when unsigned */
    int has_ordering;                      /* ENTRY_POINT: "ordering" present (spec §8) */
    struct id_fields ord_key, ord_version; /* … its key and version paths (one each) */
    int has_schedule;                      /* ENTRY_POINT: "schedule" present (spec §9) */
    struct cron schedule;                  /* … compiled */
    const char *schedule_text;             /* … as written (borrowed from config) */
    int64_t dedup_window_ms; /* ENTRY_POINT: "dedupWindow" (default 7 days): how long a
                                purged execution's identity still deduplicates */
    struct tmpl *output;     /* TRANSFORM: compiled "output" template */
    struct tmpl *request;    /* GATEWAY: compiled {url, headers, query, body} */
    const char *method;      /* GATEWAY: borrowed from config, or NULL */
    struct gw_policy policy; /* GATEWAY: timeouts, retries, outcome policies */
    struct tmpl *verify;     /* GATEWAY: compiled verify {url, headers, query}, or NULL */
    const char *verify_method;
    struct expr *done_when; /* GATEWAY: verify's doneWhen */
    /* A stored version only (wf_compile_stored): why this GATEWAY's or
     * TRANSFORM's config no longer compiles (owned), else NULL.  Its steps
     * fail with workflow_invalid; nothing else of the vertex is set. */
    char *broken;
    size_t *in, n_in;   /* indexes of incoming edges */
    size_t *out, n_out; /* indexes of outgoing edges */
};

struct wf_edge {
    size_t from, to;   /* vertex indexes */
    struct expr *cond; /* NULL when unconditional */
};

struct wf {
    json_t *def; /* owned: the definition as accepted */
    struct wf_vertex *v;
    size_t nv;
    struct wf_edge *e;
    size_t ne;
    size_t *topo; /* vertex indexes in topological order */
    /* anc[v * anc_words …]: a bit per vertex that has a path to v */
    uint64_t *anc;
    size_t anc_words;
    /* references: 1 from the compile, one more per wf_hold; the last
     * wf_release (or wf_free) frees it */
    atomic_long refs;
};

/* 1 when vertex a has a path to vertex v (a is one of v's ancestors).  A
 * step's ancestors are all decided before it runs and none of them runs
 * again while it waits, so their outputs cannot change between its
 * attempts — unlike a parallel branch's. */
int wf_is_ancestor(const struct wf *w, size_t a, size_t v);

/* Bounds of a definition (docs/api.md, "Limits"): every step of an
 * execution is a row its claims read, and every edge a decision. */
#define WF_MAX_VERTICES 256
#define WF_MAX_EDGES 4096

/* Validates and compiles a new definition `def` (borrowed; the wf keeps its
 * own reference): besides the rules of spec §3, every object in it holds
 * only the members this version reads (a misspelled `condition` would
 * otherwise make its edge unconditional).  *out is owned by the caller
 * (wf_free). */
int wf_compile(json_t *def, struct wf **out, struct ifl_err *e);
/* The same for a definition stored earlier, which an older engine may have
 * accepted under rules since tightened: members it ignored are ignored
 * again, the vertex and edge limits do not apply, a method in lower case
 * is read in upper case, and a GATEWAY or TRANSFORM whose config no longer
 * compiles is kept `broken` (its steps fail) rather than failing the whole
 * version — so every version the store holds keeps running, and no
 * execution of it is stranded. */
int wf_compile_stored(json_t *def, struct wf **out, struct ifl_err *e);
/* Drops the compile's reference (or one wf_hold took); the last one frees
 * the workflow.  NULL is ignored. */
void wf_free(struct wf *w);
/* Another reference to w, for a holder that outlives its lender's: what it
 * returns is w, valid until that holder's wf_release.  Thread-safe. */
const struct wf *wf_hold(const struct wf *w);
/* wf_free through a holder's const pointer (engine_workflow_get's, or
 * wf_hold's); NULL is ignored.  Thread-safe. */
void wf_release(const struct wf *w);

/* Index of the vertex named id, or -1. */
long wf_vertex_index(const struct wf *w, const char *id);

const char *wf_type_name(enum wf_vertex_type t);

/* A vertex / workflow / workspace name: 1–128 of [A-Za-z0-9_.-], not "." or "..". */
int wf_name_valid(const char *s);
/* "." or "..": path segments no client sends as they are (RFC 3986
 * §5.2.4 removes them: PUT …/workspaces/.. would reach /v1/), refused for
 * new names; a stored version's vertex may still have one. */
int wf_name_dots(const char *s);
/* A duration "N" + ms|s|m|h|d (N >= 1, at most 3650 days) into *ms; 0 or
 * -1 (NULL, malformed, out of range). */
int wf_duration_parse(const char *s, int64_t *ms);
#define WF_DEDUP_WINDOW_DEFAULT_MS (7LL * 86400 * 1000)

#endif
