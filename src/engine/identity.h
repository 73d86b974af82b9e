/*
 * identity — execution identity (spec §4, layer 1).
 *
 *   id = lowercase hex SHA-256( JCS( ["idemflow/v1", workspace, workflow,
 *                                     entryVertex, mode, material] ) )
 *
 * The derivation is published so that clients and `idemflow id` compute the
 * same id offline.  Pure functions; thread safe; no I/O.
 */
#ifndef IFL_ENGINE_IDENTITY_H
#define IFL_ENGINE_IDENTITY_H

#include <jansson.h>
#include <stddef.h>

#include "base/err.h"

#define IDENTITY_PREFIX "idemflow/v1"

/* A parsed idempotencyFields specification. */
struct id_fields {
    char **paths; /* as written, trimmed */
    size_t n;
};

/* Parses `spec` (borrowed): a dot path string, a comma-separated list, or an
 * array of path strings.  IFL_EVALIDATION with e->pointer relative to the
 * spec ("" or "/i") on an empty or malformed path.  Free with
 * identity_fields_clear. */
int identity_fields_parse(const json_t *spec, struct id_fields *out, struct ifl_err *e);
void identity_fields_clear(struct id_fields *f);

/* Builds the "fields" material: an object mapping each path (as written) to
 * its value in payload.  A missing path is IFL_EVALIDATION with e->pointer
 * set to the JSON Pointer of the missing member in the payload.  *out is a
 * new reference. */
int identity_fields_material(const struct id_fields *f, json_t *payload, json_t **out,
                             struct ifl_err *e);

#define IDENTITY_KEY_MAX 255
/* 1–IDENTITY_KEY_MAX printable ASCII characters (0x20–0x7E). */
int identity_client_key_valid(const char *key);

/* Computes the id for mode ("payload", "fields", "client", "webhook") and
 * material (borrowed).  Returns 0 or IFL_EINVAL (non-finite number). */
int identity_compute(const char *ws, const char *wf, const char *vertex, const char *mode,
                     json_t *material, char out[65], struct ifl_err *e);

/* The id of a forced-new execution (test and streaming runs, schedule
 * fires, start-over): derived like every other, in mode "random" with 32
 * bytes of the OS CSPRNG as hex for material (spec §4). */
int identity_random(const char *ws, const char *wf, const char *vertex, char out[65],
                    struct ifl_err *e);

#endif
