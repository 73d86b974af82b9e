/*
 * json — parsing with limits, ECMAScript number formatting, compact and
 * RFC 8785 (JCS) canonical writers over jansson's json_t.
 *
 * Invariants:
 *  - json_parse never hands jansson a text that is over the byte cap or
 *    nested deeper than the depth cap: both are checked on the raw bytes
 *    first, so hostile input cannot drive jansson's recursion.
 *  - Numbers are written as ECMAScript Number::toString would write the
 *    double (jansson integers are converted to double first), so the same
 *    value always has the same text, whichever writer produced it.
 *  - The writers share one string escaper (JCS rules) and differ only in
 *    member order; they never emit NaN/Infinity.
 *
 * Must never: depend on the C locale's decimal point (digits are taken from
 * snprintf's output character by character and re-read without a '.'), or
 * leave a half-written value in the caller's buffer on failure.
 */
#include "json/json.h"
#include "base/clock.h"

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PARSE_FLAGS                                                                                \
    (JSON_DECODE_INT_AS_REAL | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL | JSON_DECODE_ANY)

/* ---------------------------------------------------------------- parsing */

/* Scans for [ and { outside strings.  Returns 0, or -1 with *where set to the
 * byte offset of the bracket that exceeds max.  Unbalanced or otherwise
 * malformed text is left for jansson to reject. */
/* The offset of the quote that ends the string whose opening quote is at
 * s[i] (len when it does not end). */
static size_t string_end(const char *s, size_t len, size_t i)
{
    for (i++; i < len && s[i] != '"'; i++)
        if (s[i] == '\\')
            i++;
    return i;
}

static int scan_depth(const char *s, size_t len, int max, size_t *where)
{
    int depth = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '"') {
            i = string_end(s, len, i);
        } else if (c == '[' || c == '{') {
            if (++depth > max) {
                *where = i;
                return -1;
            }
        } else if ((c == ']' || c == '}') && depth > 0) {
            depth--;
        }
    }
    return 0;
}

int json_format_number(double d, char out[32]); /* below */

/* Is the integer literal lit (digits, no sign, no leading zero) the
 * shortest decimal that reads back as d, with its trailing zeros written
 * out — as this engine itself writes such a number (12345678901234567000
 * for the double 12345678901234567168, 1e+23 as 1 and 23 zeros)?  Then
 * it names d as well as its exact value does. */
static int shortest_form(double d, const char *lit)
{
    char f[32];
    if (json_format_number(d, f) < 0)
        return 0;
    char dig[32];
    int k = 0, point = -1, exp = 0;
    const char *c = f;
    for (; *c && *c != 'e'; c++) {
        if (*c == '.')
            point = k;
        else if (k < (int)sizeof dig - 1)
            dig[k++] = *c;
    }
    if (*c == 'e')
        exp = atoi(c + 1);
    /* the exponent of the first digit */
    exp += (point < 0 ? k : point) - 1;
    while (k > 1 && dig[k - 1] == '0')
        k--;
    size_t n = strlen(lit), m = n;
    while (m > 1 && lit[m - 1] == '0')
        m--;
    return (int)n - 1 == exp && (size_t)k == m && memcmp(dig, lit, m) == 0;
}

/* The first number token of s[0..len) that a double cannot keep as
 * written (json_limits.exact_numbers): its offset, or -1.  s is valid
 * JSON (jansson read it). */
static long inexact_number(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '"') {
            i = string_end(s, len, i);
            continue;
        }
        if (!(c == '-' || (c >= '0' && c <= '9')))
            continue;
        size_t b = i, digits = 0;
        int integer = 1, nonzero = 0, lead = 1;
        for (; i < len && strchr("+-0123456789.eE", s[i]); i++) {
            if (s[i] == '.' || s[i] == 'e' || s[i] == 'E')
                integer = 0;
            if (s[i] >= '1' && s[i] <= '9' && integer)
                nonzero = 1;
            if (s[i] >= '0' && s[i] <= '9' && integer && !(lead && s[i] == '0')) {
                lead = 0;
                digits++;
            }
        }
        char tok[400];
        size_t n = i - b;
        i--; /* the loop's i++ moves past the token */
        if (n >= sizeof tok)
            return (long)b; /* 400 characters of one number: no double keeps that */
        memcpy(tok, s + b, n);
        tok[n] = '\0';
        double d = strtod(tok, NULL);
        if (!integer) {
            int any = 0; /* a non-zero digit before the exponent */
            for (size_t k = 0; k < n && tok[k] != 'e' && tok[k] != 'E'; k++)
                any |= tok[k] >= '1' && tok[k] <= '9';
            if (any && d == 0.0)
                return (long)b;
            continue;
        }
        if (!nonzero || digits <= 15)
            continue; /* 15 digits always fit */
        const char *lit = tok + (tok[0] == '-');
        while (*lit == '0' && lit[1])
            lit++;
        char back[400];
        snprintf(back, sizeof back, "%.0f", fabs(d));
        if (strcmp(back, lit) != 0 && !shortest_form(fabs(d), lit))
            return (long)b;
    }
    return -1;
}

const struct json_limits json_stored_limits = {.max_depth = JSON_STORED_MAX_DEPTH};

json_t *json_stored_value(const char *text)
{
    if (!text)
        return json_null();
    json_t *v = NULL;
    if (json_parse(text, strlen(text), &json_stored_limits, &v, NULL))
        return json_string(text);
    return v;
}

json_t *json_time(int64_t ms)
{
    char ts[32];
    clock_rfc3339(ms, ts);
    return json_string(ts);
}

/* The length of the valid UTF-8 sequence at p (RFC 3629: no overlong
 * forms, no surrogates, at most U+10FFFF), or 0. */
static size_t utf8_seq(const unsigned char *p)
{
    unsigned char c = p[0];
    if (c < 0x80)
        return 1;
    unsigned char lo = 0x80, hi = 0xBF;
    size_t n;
    if (c >= 0xC2 && c <= 0xDF)
        n = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

json_t *json_stringn_lossy(const char *s, size_t n, int *replaced)
{
    json_t *v = json_stringn(s, n);
    if (v || !s)
        return v;
    struct buf b;
    buf_init(&b, 0);
    for (size_t i = 0; i < n;) {
        unsigned char t[5] = {0}; /* zero-padded: a sequence cut by the end is invalid */
        size_t k = n - i < 4 ? n - i : 4;
        memcpy(t, s + i, k);
        size_t m = utf8_seq(t);
        if (!m && replaced)
            *replaced = 1;
        buf_append(&b, m ? s + i : "\xEF\xBF\xBD", m ? m : 3);
        i += m ? m : 1;
    }
    v = json_stringn(b.p ? b.p : "", b.len);
    buf_free(&b);
    return v;
}

int json_utf8_valid(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        size_t n = utf8_seq(p);
        if (!n)
            return 0;
        p += n;
    }
    return 1;
}

json_t *json_string_lossy(const char *s)
{
    return s ? json_stringn_lossy(s, strlen(s), NULL) : NULL;
}

int json_depth_ok(const char *text, size_t len, int max)
{
    size_t where = 0;
    return scan_depth(text, len, max, &where) == 0;
}

int json_parse(const char *text, size_t len, const struct json_limits *lim, json_t **out,
               struct ifl_err *e)
{
    size_t max_bytes = lim ? lim->max_bytes : 0;
    int max_depth = lim && lim->max_depth > 0 ? lim->max_depth : JSON_DEFAULT_MAX_DEPTH;
    size_t where = 0;

    *out = NULL;
    if (max_bytes && len > max_bytes)
        return err_set(e, IFL_ETOOBIG, "JSON text of %zu bytes exceeds the limit of %zu bytes", len,
                       max_bytes);
    if (!text && len)
        return err_set(e, IFL_EINVAL, "invalid JSON: no text");
    if (scan_depth(text, len, max_depth, &where))
        return err_set(e, IFL_EINVAL, "invalid JSON at byte offset %zu: nesting deeper than %d",
                       where, max_depth);

    json_error_t je;
    json_t *v = json_loadb(text ? text : "", len, PARSE_FLAGS, &je);
    if (!v)
        return err_set(e, IFL_EINVAL, "invalid JSON at line %d, column %d: %s", je.line, je.column,
                       je.text);
    long at = lim && lim->exact_numbers ? inexact_number(text, len) : -1;
    if (at >= 0) {
        json_decref(v);
        return err_set(e, IFL_EINVAL,
                       "invalid JSON at byte offset %ld: a number a double cannot keep as written "
                       "(an integer beyond 2^53 that would round, or one that would read as 0): "
                       "send it as a string",
                       at);
    }
    *out = v;
    return 0;
}

/* ------------------------------------------------------- number formatting */

/* Decimal significand digits[0..k) (no leading/trailing zeros beyond the
 * first digit) and the decimal exponent of the first digit. */
struct dec {
    char digits[20];
    int k;
    int exp;
};

/* Reads "d.ddd…e±x" as produced by %e (any decimal-point character). */
static void read_e(const char *s, struct dec *r)
{
    r->k = 0;
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9' && r->k < (int)sizeof r->digits)
            r->digits[r->k++] = *s;
    int neg = 0, x = 0;
    if (*s == 'e')
        s++;
    if (*s == '-' || *s == '+')
        neg = *s++ == '-';
    for (; *s >= '0' && *s <= '9'; s++)
        x = x * 10 + (*s - '0');
    r->exp = neg ? -x : x;
}

static void strip_zeros(struct dec *r)
{
    while (r->k > 1 && r->digits[r->k - 1] == '0')
        r->k--;
}

/* Does the decimal r read back as exactly d?  Written as an integer
 * significand with an exponent, so the locale's decimal point is irrelevant. */
static int dec_is(const struct dec *r, double d)
{
    char s[48];
    snprintf(s, sizeof s, "%.*se%d", r->k, r->digits, r->exp - (r->k - 1));
    return strtod(s, NULL) == d;
}

/* The correctly rounded p-significant-digit decimal of d; true when it
 * reads back as d. */
static int round_to(double d, int p, struct dec *r)
{
    char s[48];
    snprintf(s, sizeof s, "%.*e", p - 1, d);
    read_e(s, r);
    return strtod(s, NULL) == d;
}

/* Adds one unit in the last digit (carrying, possibly renormalising). */
static void bump(struct dec *r)
{
    int i = r->k - 1;
    while (i >= 0 && r->digits[i] == '9')
        r->digits[i--] = '0';
    if (i >= 0) {
        r->digits[i]++;
    } else {
        r->digits[0] = '1';
        r->exp++;
    }
}

/* Shortest digits that read back as d (d finite, > 0); among equally short
 * ones the closest to d, as ECMA-262 asks.
 *
 * Why three probes suffice for normal numbers: a double's rounding interval
 * is at most 2^-53 of its value on either side, while 15-digit decimals are
 * at least 10^-15 apart relatively, so any decimal of <= 15 digits that reads
 * back as d is also d's correctly rounded 15-digit form (with zeros padded).
 * Hence: 15 digits round-trip -> strip zeros; else try 16; else 17 always
 * works.  The correctly rounded form is the closest, so it is the one that
 * round-trips whenever any of its length does — except when d's significand
 * is a power of two, where the interval below is half as wide as the one
 * above; then the next 16-digit decimal up may round-trip where the nearest
 * (below d) does not.  Subnormals have fewer significant bits, so for them we
 * search every length. */
static void shortest(double d, struct dec *r)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    int bexp = (int)((bits >> 52) & 0x7ff);
    int pow2 = (bits & 0xfffffffffffffULL) == 0 && bexp > 1;

    if (bexp == 0) {
        for (int p = 1; p < 17; p++)
            if (round_to(d, p, r))
                return;
        round_to(d, 17, r);
        return;
    }
    if (round_to(d, 15, r)) {
        strip_zeros(r);
        return;
    }
    if (round_to(d, 16, r))
        return;
    if (pow2) {
        struct dec up = *r;
        bump(&up);
        if (dec_is(&up, d)) {
            *r = up;
            strip_zeros(r);
            return;
        }
    }
    round_to(d, 17, r);
    strip_zeros(r);
}

int json_format_number(double d, char out[32])
{
    if (!isfinite(d))
        return IFL_EINVAL;
    if (d == 0) {
        out[0] = '0';
        out[1] = '\0';
        return 1;
    }
    /* Integers below 2^53: every neighbour is representable, so the shortest
     * digits are the integer's own, and ECMA-262 prints them plainly. */
    if (fabs(d) < 9007199254740992.0 && d == trunc(d))
        return snprintf(out, 32, "%" PRId64, (int64_t)d);

    struct dec r;
    shortest(fabs(d), &r);

    char *o = out;
    if (d < 0)
        *o++ = '-';
    int k = r.k, n = r.exp + 1;
    if (k <= n && n <= 21) {
        memcpy(o, r.digits, (size_t)k);
        o += k;
        for (int i = 0; i < n - k; i++)
            *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, r.digits, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, r.digits + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -n; i++)
            *o++ = '0';
        memcpy(o, r.digits, (size_t)k);
        o += k;
    } else {
        int x = n - 1;
        *o++ = r.digits[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, r.digits + 1, (size_t)(k - 1));
            o += k - 1;
        }
        *o++ = 'e';
        *o++ = x < 0 ? '-' : '+';
        if (x < 0)
            x = -x;
        char tmp[8];
        int t = 0;
        do {
            tmp[t++] = (char)('0' + x % 10);
            x /= 10;
        } while (x);
        while (t)
            *o++ = tmp[--t];
    }
    *o = '\0';
    return (int)(o - out);
}

/* ----------------------------------------------------------------- writing */

static const char hexdig[] = "0123456789abcdef";

/* JCS string: the two-character escapes, other C0 controls as \u00xx, every
 * other byte (including '/', DEL and non-ASCII UTF-8) literal. */
static int put_string(struct buf *out, const char *s, size_t n)
{
    int rc = buf_putc(out, '"');
    size_t run = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t elen = 2;
        esc[0] = '\\';
        switch (c) {
        case '"':
            esc[1] = '"';
            break;
        case '\\':
            esc[1] = '\\';
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            if (c >= 0x20)
                continue;
            memcpy(esc + 1, "u00", 3);
            esc[4] = hexdig[c >> 4];
            esc[5] = hexdig[c & 15];
            elen = 6;
        }
        rc = buf_append(out, s + run, i - run);
        if (!rc)
            rc = buf_append(out, esc, elen);
        run = i + 1;
    }
    if (!rc)
        rc = buf_append(out, s + run, n - run);
    if (!rc)
        rc = buf_putc(out, '"');
    return rc;
}

static int put_number(struct buf *out, double d)
{
    char tmp[32];
    int n = json_format_number(d, tmp);
    if (n < 0)
        return n;
    return buf_append(out, tmp, (size_t)n);
}

/* One UTF-8 sequence as a code point; malformed bytes count as themselves
 * (jansson only holds valid UTF-8, so that is a safety net only). */
static uint32_t next_cp(const unsigned char **pp, const unsigned char *end)
{
    const unsigned char *p = *pp;
    uint32_t c = *p++;
    int more = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    if (more && end - p >= more) {
        c &= 0x3fu >> more;
        for (int i = 0; i < more; i++)
            c = (c << 6) | (*p++ & 0x3fu);
    }
    *pp = p;
    return c;
}

struct member {
    const char *key;
    size_t len;
    json_t *value;
};

/* Orders keys by their UTF-16 code units (RFC 8785 §3.2.3).  UTF-16 order
 * equals code point order except that a supplementary character (lead
 * surrogate D800–DBFF) sorts before BMP characters E000–FFFF. */
static int cmp_members(const void *pa, const void *pb)
{
    const struct member *a = pa, *b = pb;
    const unsigned char *p = (const unsigned char *)a->key, *pe = p + a->len;
    const unsigned char *q = (const unsigned char *)b->key, *qe = q + b->len;
    while (p < pe && q < qe) {
        uint32_t x = next_cp(&p, pe), y = next_cp(&q, qe);
        if (x == y)
            continue;
        uint32_t ux = x >= 0x10000 ? 0xd800 + ((x - 0x10000) >> 10) : x;
        uint32_t uy = y >= 0x10000 ? 0xd800 + ((y - 0x10000) >> 10) : y;
        if (ux != uy)
            return ux < uy ? -1 : 1;
        return x < y ? -1 : 1; /* same lead surrogate: trail decides */
    }
    return (p < pe) - (q < qe);
}

static int put_value(const json_t *v, struct buf *out, int sorted);

static int put_object(const json_t *v, struct buf *out, int sorted)
{
    const char *key;
    size_t klen;
    json_t *val;
    int rc = buf_putc(out, '{');
    if (rc)
        return rc;

    if (!sorted || json_object_size(v) < 2) {
        int first = 1;
        json_object_keylen_foreach((json_t *)v, key, klen, val)
        {
            if (!first && (rc = buf_putc(out, ',')))
                return rc;
            first = 0;
            if ((rc = put_string(out, key, klen)) || (rc = buf_putc(out, ':')) ||
                (rc = put_value(val, out, sorted)))
                return rc;
        }
        return buf_putc(out, '}');
    }

    struct member small[16], *m = small;
    size_t n = json_object_size(v), i = 0;
    if (n > sizeof small / sizeof small[0])
        m = xmalloc(n * sizeof *m);
    json_object_keylen_foreach((json_t *)v, key, klen, val)
    {
        m[i].key = key;
        m[i].len = klen;
        m[i].value = val;
        i++;
    }
    qsort(m, i, sizeof *m, cmp_members);
    for (size_t j = 0; j < i && !rc; j++) {
        if (j)
            rc = buf_putc(out, ',');
        if (!rc)
            rc = put_string(out, m[j].key, m[j].len);
        if (!rc)
            rc = buf_putc(out, ':');
        if (!rc)
            rc = put_value(m[j].value, out, sorted);
    }
    if (m != small)
        free(m);
    return rc ? rc : buf_putc(out, '}');
}

static int put_value(const json_t *v, struct buf *out, int sorted)
{
    int rc;
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return put_object(v, out, sorted);
    case JSON_ARRAY:
        if ((rc = buf_putc(out, '[')))
            return rc;
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i && (rc = buf_putc(out, ',')))
                return rc;
            if ((rc = put_value(json_array_get(v, i), out, sorted)))
                return rc;
        }
        return buf_putc(out, ']');
    case JSON_STRING:
        return put_string(out, json_string_value(v), json_string_length(v));
    case JSON_INTEGER:
        return put_number(out, (double)json_integer_value(v));
    case JSON_REAL:
        return put_number(out, json_real_value(v));
    case JSON_TRUE:
        return buf_append(out, "true", 4);
    case JSON_FALSE:
        return buf_append(out, "false", 5);
    case JSON_NULL:
        return buf_append(out, "null", 4);
    }
    return IFL_EINTERNAL;
}

/* Runs a writer and, on failure, restores out to its previous length. */
static int write_top(const json_t *v, struct buf *out, int sorted)
{
    size_t start = out->len;
    int rc = v ? put_value(v, out, sorted) : IFL_EINVAL;
    if (rc && out->p) {
        out->len = start;
        out->p[start] = '\0';
    }
    return rc;
}

int json_jcs(const json_t *v, struct buf *out)
{
    return write_top(v, out, 1);
}

int json_write(const json_t *v, struct buf *out)
{
    return write_top(v, out, 0);
}

int json_write_string(const char *s, struct buf *out)
{
    return put_string(out, s, strlen(s));
}

char *json_to_string_max(const json_t *v, size_t max, int *too_big)
{
    struct buf b;
    buf_init(&b, max);
    int rc = json_write(v, &b);
    if (too_big)
        *too_big = rc == IFL_ETOOBIG;
    if (rc) {
        buf_free(&b);
        return NULL;
    }
    return buf_steal(&b);
}

char *json_to_string(const json_t *v)
{
    return json_to_string_max(v, 0, NULL);
}

void json_pointer_push(struct buf *out, const char *segment)
{
    size_t start = out->len;
    int rc = buf_putc(out, '/');
    for (const char *s = segment; *s && !rc; s++) {
        if (*s == '~')
            rc = buf_append(out, "~0", 2);
        else if (*s == '/')
            rc = buf_append(out, "~1", 2);
        else
            rc = buf_putc(out, *s);
    }
    if (rc && out->p) { /* over the cap: leave the pointer as it was */
        out->len = start;
        out->p[start] = '\0';
    }
}

const char *json_text(const json_t *v)
{
    const char *s = json_string_value(v);
    return s && strlen(s) == json_string_length(v) ? s : NULL;
}

double json_num(const json_t *v)
{
    return json_number_value(v);
}
