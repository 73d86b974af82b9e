/*
 * err — the project's one error idiom.
 *
 * Every fallible function returns int: 0 on success or a negative IFL_E*
 * code.  Details travel in a caller-owned `struct ifl_err` (may be NULL when
 * the caller does not care).  The HTTP layer maps codes to RFC 9457 problem
 * types with err_problem_slug() / err_http_status(), so the mapping lives in
 * exactly one place.
 *
 * Never put secret material in an error message: messages reach logs and
 * responses.
 */
#ifndef IFL_BASE_ERR_H
#define IFL_BASE_ERR_H

#include <stddef.h>

enum ifl_code {
    IFL_OK = 0,
    IFL_EINVAL = -1,        /* malformed input (400)                        */
    IFL_ENOTFOUND = -2,     /* resource does not exist (404)                */
    IFL_EVALIDATION = -3,   /* semantically invalid input (422)            */
    IFL_ECONFLICT = -4,     /* conflicting state (409)                      */
    IFL_ETOOBIG = -5,       /* input over a size cap (413)                  */
    IFL_EIO = -6,           /* I/O or OS failure (500)                      */
    IFL_ESTORE = -7,        /* database failure (500/503)                   */
    IFL_EKEYREUSED = -8,    /* client idempotency key reused (422)          */
    IFL_EFORBIDDEN = -9,    /* operation not allowed here (400)             */
    IFL_EBUSY = -10,        /* transient, retry later (503)                 */
    IFL_EUNSUPPORTED = -11, /* unsupported media type / method (415/405)    */
    IFL_EINTERNAL = -12,    /* bug (500)                                    */
    IFL_EUNAUTH = -13,      /* missing/invalid credentials (401)            */
    IFL_EEXPR = -14,        /* expression compile or evaluation error      */
    IFL_EGONE = -15,        /* existed, purged by retention (410)          */
};

#define IFL_ERR_MSG_MAX 512
#define IFL_ERR_PTR_MAX 256

struct ifl_err {
    int code;                      /* enum ifl_code                      */
    char msg[IFL_ERR_MSG_MAX];     /* human readable detail              */
    char pointer[IFL_ERR_PTR_MAX]; /* JSON Pointer of the offending member,
                                      empty when not applicable          */
    char slug[64];                 /* optional problem slug override     */
};

/* Fills *e (when non-NULL) and returns code, so callers can write
 * `return err_set(e, IFL_EINVAL, "…", …);`. printf-style. */
int err_set(struct ifl_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like err_set, also recording a JSON Pointer (may be NULL). */
int err_setp(struct ifl_err *e, int code, const char *pointer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Sets the problem slug (e.g. "idempotency-key-reused"); returns e->code. */
int err_slug(struct ifl_err *e, const char *slug);

void err_clear(struct ifl_err *e);

/* Static name of a code ("EINVAL"). Cannot fail. */
const char *err_name(int code);

/* HTTP status and default problem slug for a code. Cannot fail. */
int err_http_status(int code);
const char *err_problem_slug(int code);

#endif
