/*
 * identity — see identity.h.
 */
#include "engine/identity.h"
#include "base/mem.h"
#include "crypto/crypto.h"
#include "json/json.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void identity_fields_clear(struct id_fields *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free(f->paths[i]);
    free(f->paths);
    f->paths = NULL;
    f->n = 0;
}

/* A path is dot-separated non-empty segments without spaces inside. */
static int path_ok(const char *p)
{
    if (!*p || *p == '.')
        return 0;
    size_t n = strlen(p);
    if (p[n - 1] == '.' || strstr(p, ".."))
        return 0;
    for (; *p; p++)
        if (isspace((unsigned char)*p) || *p == ',')
            return 0;
    return 1;
}

static int add_path(struct id_fields *f, const char *s, size_t len, const char *ptr,
                    struct ifl_err *e)
{
    while (len && isspace((unsigned char)*s))
        s++, len--;
    while (len && isspace((unsigned char)s[len - 1]))
        len--;
    char *p = xstrndup(s, len);
    if (!path_ok(p)) {
        free(p);
        return err_setp(e, IFL_EVALIDATION, ptr,
                        "idempotencyFields: '%.*s' is not a dot path like \"order.id\"", (int)len,
                        s);
    }
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->paths[i], p) == 0) {
            free(p);
            return err_setp(e, IFL_EVALIDATION, ptr, "idempotencyFields: path '%s' repeated",
                            f->paths[i]);
        }
    f->paths = xrealloc(f->paths, (f->n + 1) * sizeof *f->paths);
    f->paths[f->n++] = p;
    return 0;
}

int identity_fields_parse(const json_t *spec, struct id_fields *out, struct ifl_err *e)
{
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (json_is_string(spec)) {
        const char *s = json_string_value(spec);
        const char *start = s;
        for (;;) {
            const char *comma = strchr(start, ',');
            size_t len = comma ? (size_t)(comma - start) : strlen(start);
            if ((rc = add_path(out, start, len, "", e)))
                goto fail;
            if (!comma)
                break;
            start = comma + 1;
        }
    } else if (json_is_array(spec) && json_array_size(spec) > 0) {
        size_t i;
        json_t *v;
        json_array_foreach(spec, i, v)
        {
            char ptr[32];
            snprintf(ptr, sizeof ptr, "/%zu", i);
            if (!json_is_string(v)) {
                rc = err_setp(e, IFL_EVALIDATION, ptr, "idempotencyFields entries must be strings");
                goto fail;
            }
            if ((rc = add_path(out, json_string_value(v), strlen(json_string_value(v)), ptr, e)))
                goto fail;
        }
    } else {
        return err_setp(e, IFL_EVALIDATION, "",
                        "idempotencyFields must be a dot path, a comma-separated list or a "
                        "non-empty array of paths");
    }
    return 0;
fail:
    identity_fields_clear(out);
    return rc;
}

/* Looks up a dot path; numeric segments index arrays. Borrowed result. */
static json_t *lookup(json_t *v, const char *path, struct buf *ptr)
{
    const char *s = path;
    while (v) {
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        char *seg = xstrndup(s, len);
        json_pointer_push(ptr, seg);
        if (json_is_object(v)) {
            v = json_object_getn(v, seg, len);
        } else if (json_is_array(v)) {
            char *end = NULL;
            unsigned long idx = strtoul(seg, &end, 10);
            v = (len && end && *end == '\0' && isdigit((unsigned char)seg[0]))
                    ? json_array_get(v, idx)
                    : NULL;
        } else {
            v = NULL;
        }
        free(seg);
        if (!dot)
            break;
        s = dot + 1;
    }
    return v;
}

int identity_fields_material(const struct id_fields *f, json_t *payload, json_t **out,
                             struct ifl_err *e)
{
    json_t *m = json_object();
    for (size_t i = 0; i < f->n; i++) {
        struct buf ptr;
        buf_init(&ptr, 0);
        json_t *v = lookup(payload, f->paths[i], &ptr);
        if (!v) {
            int rc = err_setp(e, IFL_EVALIDATION, ptr.p ? ptr.p : "",
                              "the payload has no value at idempotency field '%s'", f->paths[i]);
            err_slug(e, "missing-idempotency-field");
            buf_free(&ptr);
            json_decref(m);
            return rc;
        }
        buf_free(&ptr);
        json_object_set(m, f->paths[i], v);
    }
    *out = m;
    return 0;
}

int identity_client_key_valid(const char *key)
{
    size_t n = strlen(key);
    if (n < 1 || n > IDENTITY_KEY_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e)
            return 0;
    return 1;
}

int identity_compute(const char *ws, const char *wf, const char *vertex, const char *mode,
                     json_t *material, char out[65], struct ifl_err *e)
{
    json_t *arr = json_array();
    json_array_append_new(arr, json_string(IDENTITY_PREFIX));
    json_array_append_new(arr, json_string(ws));
    json_array_append_new(arr, json_string(wf));
    json_array_append_new(arr, json_string(vertex));
    json_array_append_new(arr, json_string(mode));
    json_array_append(arr, material ? material : json_null());
    struct buf b;
    buf_init(&b, 0);
    int rc = json_jcs(arr, &b);
    json_decref(arr);
    if (rc) {
        buf_free(&b);
        return err_set(e, IFL_EINVAL, "identity material cannot be canonicalized");
    }
    crypto_sha256_hex(b.p, b.len, out);
    buf_free(&b);
    return 0;
}

int identity_random(const char *ws, const char *wf, const char *vertex, char out[65],
                    struct ifl_err *e)
{
    char hex[65];
    if (crypto_random_hex32(hex))
        return err_set(e, IFL_EIO, "the OS random generator failed");
    json_t *material = json_string(hex);
    int rc = identity_compute(ws, wf, vertex, "random", material, out, e);
    json_decref(material);
    return rc;
}
