/*
 * json — parsing with limits, writing with ECMAScript number formatting, and
 * RFC 8785 (JCS) canonical serialization, over jansson's json_t.
 *
 * Invariants:
 *  - Every number the project parses is an IEEE-754 double (jansson "real"),
 *    as in JavaScript and JSONata; integers created by the program
 *    (json_integer) are written the same way a double of that value would be.
 *  - Writers never emit NaN or Infinity: those are errors (JCS forbids them).
 *  - Strings may contain U+0000 (lengths are explicit).
 *  - Object member order is preserved by json_write and sorted by UTF-16 code
 *    units by json_jcs (RFC 8785 §3.2.3).
 */
#ifndef IFL_JSON_JSON_H
#define IFL_JSON_JSON_H

#include <jansson.h>
#include <stddef.h>

#include "base/err.h"
#include "base/mem.h"

struct json_limits {
    size_t max_bytes; /* 0 = no cap                               */
    int max_depth;    /* nesting of arrays/objects; 0 = default 64 */
    /* Refuse a number a double cannot keep as written: an integer beyond
     * 2^53 that would round (9007199254740993 reads as …992), a non-zero
     * number that would read as 0 (1e-400).  Every number is a double
     * (RFC 8785), so two such payloads would be one execution, and the
     * stored one another number than the caller sent. */
    int exact_numbers;
};

#define JSON_DEFAULT_MAX_DEPTH 64
/* How deep what the engine stores (step outputs, errors) may nest: a
 * GATEWAY output wraps a response body parsed to 256 levels, a TRANSFORM
 * may wrap its inputs.  Outputs past it fail their step (invalid_output);
 * stored text is read back with this limit, never the default. */
#define JSON_STORED_MAX_DEPTH 512
extern const struct json_limits json_stored_limits; /* {.max_depth = JSON_STORED_MAX_DEPTH} */

/* A stored text as a value (new reference): JSON null for NULL, the parsed
 * value when the text is JSON (under json_stored_limits), else a string. */
json_t *json_stored_value(const char *text);
/* Unix ms as an RFC 3339 UTC string value (clock_rfc3339); new reference. */
json_t *json_time(int64_t ms);

/* s as a string value (new reference), each byte that is not part of
 * valid UTF-8 (a client's "%FF" echoed in a message) replaced by U+FFFD:
 * json_string refuses such text, and a message built from input must not
 * vanish from the document it belongs in. */
json_t *json_string_lossy(const char *s);
/* The n bytes at s (NULs included) as a string value, as json_string_lossy
 * does; *replaced (when given) is set to 1 when a byte was replaced. */
json_t *json_stringn_lossy(const char *s, size_t n, int *replaced);
/* 1 when s is valid UTF-8 (RFC 3629), else 0. */
int json_utf8_valid(const char *s);

/* 1 when text[0..len) nests arrays and objects at most max deep (strings
 * skipped), else 0.  Does not validate the text otherwise. */
int json_depth_ok(const char *text, size_t len, int max);

/* Parses exactly one JSON value from text[0..len) (surrounding whitespace
 * allowed).  Rejects duplicate object keys, invalid UTF-8, lone surrogates,
 * numbers that overflow a double, nesting deeper than lim->max_depth (checked
 * before jansson sees the text) and texts over lim->max_bytes (IFL_ETOOBIG).
 * lim may be NULL for defaults.  On success *out is a new reference the
 * caller releases with json_decref().  On failure returns IFL_EINVAL (or
 * IFL_ETOOBIG) and e->msg names the line/column and reason. */
int json_parse(const char *text, size_t len, const struct json_limits *lim, json_t **out,
               struct ifl_err *e);

/* Formats d as ECMAScript Number::toString (shortest round-trip digits,
 * exponent rules of ECMA-262 §6.1.6.1.20).  out must hold 32 bytes.
 * Returns the length, or IFL_EINVAL for NaN/Infinity.  "-0" formats as "0". */
int json_format_number(double d, char out[32]);

/* Appends the RFC 8785 canonical form of v to out.  Returns 0, IFL_EINVAL for
 * non-finite numbers, or IFL_ETOOBIG when out's cap is exceeded. */
int json_jcs(const json_t *v, struct buf *out);

/* Appends compact JSON (insertion order, ECMAScript numbers, the same string
 * escaping as JCS) to out.  Same errors as json_jcs. */
int json_write(const json_t *v, struct buf *out);

/* Appends s (NUL-terminated) as a JSON string, escaped as json_write
 * does.  Returns 0 or IFL_ETOOBIG. */
int json_write_string(const char *s, struct buf *out);

/* Convenience: compact JSON as a fresh heap string (caller frees), or NULL
 * when v holds a non-finite number. */
char *json_to_string(const json_t *v);
/* json_to_string of at most max bytes: NULL past it, with *too_big = 1
 * (may be NULL), found without building the rest.  An expression's value
 * may hold one big value many times over (`[1..30000].($$.payload)` holds
 * references, not copies): its text is what must be bounded. */
char *json_to_string_max(const json_t *v, size_t max, int *too_big);

/* Appends the escaped form of one object key / path segment to a JSON
 * Pointer being built in out ("~" -> "~0", "/" -> "~1"), with a leading '/'.*/
void json_pointer_push(struct buf *out, const char *segment);

/* The text of a JSON string that holds no NUL (borrowed from v), else NULL:
 * for values used as C strings, which a NUL would silently cut short. */
const char *json_text(const json_t *v);

/* The number value of a jansson number (integer or real). */
double json_num(const json_t *v);

#endif
