/*
 * err — implementation of the error idiom; see err.h.
 */
#include "base/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void __attribute__((format(printf, 3, 0)))
vset(struct ifl_err *e, int code, const char *fmt, va_list ap)
{
    e->code = code;
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
}

int err_set(struct ifl_err *e, int code, const char *fmt, ...)
{
    if (!e)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vset(e, code, fmt, ap);
    va_end(ap);
    e->pointer[0] = '\0';
    e->slug[0] = '\0';
    return code;
}

int err_setp(struct ifl_err *e, int code, const char *pointer, const char *fmt, ...)
{
    if (!e)
        return code;
    va_list ap;
    va_start(ap, fmt);
    vset(e, code, fmt, ap);
    va_end(ap);
    snprintf(e->pointer, sizeof e->pointer, "%s", pointer ? pointer : "");
    e->slug[0] = '\0';
    return code;
}

int err_slug(struct ifl_err *e, const char *slug)
{
    if (!e)
        return IFL_EINTERNAL;
    snprintf(e->slug, sizeof e->slug, "%s", slug);
    return e->code;
}

void err_clear(struct ifl_err *e)
{
    if (e)
        memset(e, 0, sizeof *e);
}

static const struct {
    int code;
    const char *name;
    int status;
    const char *slug;
} table[] = {
    {IFL_OK, "OK", 200, "ok"},
    {IFL_EINVAL, "EINVAL", 400, "bad-request"},
    {IFL_ENOTFOUND, "ENOTFOUND", 404, "not-found"},
    {IFL_EVALIDATION, "EVALIDATION", 422, "validation-error"},
    {IFL_ECONFLICT, "ECONFLICT", 409, "conflict"},
    {IFL_ETOOBIG, "ETOOBIG", 413, "payload-too-large"},
    {IFL_EIO, "EIO", 500, "io-error"},
    {IFL_ESTORE, "ESTORE", 503, "store-unavailable"},
    {IFL_EKEYREUSED, "EKEYREUSED", 422, "idempotency-key-reused"},
    {IFL_EFORBIDDEN, "EFORBIDDEN", 400, "not-allowed"},
    {IFL_EBUSY, "EBUSY", 503, "busy"},
    {IFL_EUNSUPPORTED, "EUNSUPPORTED", 415, "unsupported"},
    {IFL_EINTERNAL, "EINTERNAL", 500, "internal-error"},
    {IFL_EUNAUTH, "EUNAUTH", 401, "unauthorized"},
    {IFL_EEXPR, "EEXPR", 422, "expression-error"},
    {IFL_EGONE, "EGONE", 410, "gone"},
};

static int find(int code)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].code == code)
            return (int)i;
    return -1;
}

const char *err_name(int code)
{
    int i = find(code);
    return i < 0 ? "EUNKNOWN" : table[i].name;
}

int err_http_status(int code)
{
    int i = find(code);
    return i < 0 ? 500 : table[i].status;
}

const char *err_problem_slug(int code)
{
    int i = find(code);
    return i < 0 ? "internal-error" : table[i].slug;
}
