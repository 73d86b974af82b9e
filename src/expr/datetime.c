/*
 * datetime — $now, $millis, $fromMillis, $toMillis and the XPath picture
 * formatting of $formatNumber, $formatInteger and $parseInteger.
 *
 * All calendar arithmetic is done by hand on the proleptic Gregorian
 * calendar in UTC (plus an explicit offset), never through localtime or the
 * process time zone, so results are the same on every host and thread.
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "expr/expr_int.h"

#define ARG(i) (n > (i) ? a[i] : NULL)

/* days since 1970-01-01 -> civil date (Howard Hinnant's algorithm) */
static void civil_from_days(long long z, long long *y, int *m, int *d)
{
    z += 719468;
    long long era = (z >= 0 ? z : z - 146096) / 146097;
    long long doe = z - era * 146097;
    long long yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long yy = yoe + era * 400;
    long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    long long mp = (5 * doy + 2) / 153;
    *d = (int)(doy - (153 * mp + 2) / 5 + 1);
    *m = (int)(mp < 10 ? mp + 3 : mp - 9);
    *y = yy + (*m <= 2);
}

static long long days_from_civil(long long y, int m, int d)
{
    y -= m <= 2;
    long long era = (y >= 0 ? y : y - 399) / 400;
    long long yoe = y - era * 400;
    long long doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    long long doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

struct dt {
    long long year;
    int month, day, hour, minute, second, ms;
    int wday; /* 0 = Sunday */
    long long yday;
};

static void split_ms(double ms, struct dt *t)
{
    double days = floor(ms / 86400000.0);
    double rem = ms - days * 86400000.0;
    civil_from_days((long long)days, &t->year, &t->month, &t->day);
    long long r = (long long)rem;
    t->hour = (int)(r / 3600000);
    t->minute = (int)(r / 60000 % 60);
    t->second = (int)(r / 1000 % 60);
    t->ms = (int)(r % 1000);
    long long w = ((long long)days + 4) % 7;
    t->wday = (int)(w < 0 ? w + 7 : w);
    t->yday = (long long)days - days_from_civil(t->year, 1, 1) + 1;
}

static val *iso_string(struct ctx *c, double ms)
{
    if (!isfinite(ms) || fabs(ms) > 8.64e15)
        ethrow(c, "D3110", -1, NULL, "invalid time value");
    struct dt t;
    split_ms(ms, &t);
    char buf[64];
    int k;
    if (t.year >= 0 && t.year <= 9999)
        k = snprintf(buf, sizeof buf, "%04lld", t.year);
    else
        k = snprintf(buf, sizeof buf, "%c%06lld", t.year < 0 ? '-' : '+', llabs(t.year));
    k += snprintf(buf + k, sizeof buf - (size_t)k, "-%02d-%02dT%02d:%02d:%02d.%03dZ", t.month,
                  t.day, t.hour, t.minute, t.second, t.ms);
    return mkstr(c, buf, (size_t)k);
}

static double now_ms(struct ctx *c)
{
    if (c->now_ms < 0) {
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        c->now_ms = (double)rt.tv_sec * 1e3 + (double)(rt.tv_nsec / 1000000);
    }
    return c->now_ms;
}

val *fn_millis(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    return mknum(c, now_ms(c));
}

val *fn_now(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *args[3] = {mknum(c, now_ms(c)), ARG(0), ARG(1)};
    return fn_fromMillis(c, args, 3, in, e);
}

val *expr_format_datetime(struct ctx *c, double ms, val *picture, val *tz);

val *fn_fromMillis(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *m = ARG(0);
    if (!m)
        return NULL;
    if (!ARG(1) && !ARG(2))
        return iso_string(c, m->u.num);
    return expr_format_datetime(c, m->u.num, ARG(1), ARG(2));
}

static int digits(const char *s, size_t n, size_t *i, int cnt, long *out)
{
    long v = 0;
    for (int k = 0; k < cnt; k++) {
        if (*i >= n || !isdigit((unsigned char)s[*i]))
            return 0;
        v = v * 10 + (s[(*i)++] - '0');
    }
    *out = v;
    return 1;
}

/* ISO 8601 as accepted by the reference (its regex, then Date.parse). */
static int parse_iso(const char *s, size_t n, double *out)
{
    size_t i = 0;
    long y, mo = 1, d = 1, h = 0, mi = 0, se = 0;
    double frac = 0;
    int has_time = 0, has_tz = 0;
    long tzoff = 0;
    if (!digits(s, n, &i, 4, &y))
        return 0;
    if (i < n && s[i] == '-') {
        i++;
        if (!digits(s, n, &i, 2, &mo))
            return 0;
        if (i < n && s[i] == '-') {
            i++;
            if (!digits(s, n, &i, 2, &d))
                return 0;
        }
    }
    if (i < n && s[i] == 'T') {
        i++;
        has_time = 1;
        if (!digits(s, n, &i, 2, &h) || i >= n || s[i++] != ':' || !digits(s, n, &i, 2, &mi))
            return 0;
        if (i < n && s[i] == ':') {
            i++;
            if (!digits(s, n, &i, 2, &se))
                return 0;
        }
        if (i < n && s[i] == '.') {
            i++;
            double scale = 0.1;
            size_t st = i;
            while (i < n && isdigit((unsigned char)s[i])) {
                frac += (s[i] - '0') * scale;
                scale /= 10;
                i++;
            }
            if (i == st)
                return 0;
        }
    }
    if (i < n && s[i] == 'Z') {
        has_tz = 1;
        i++;
    } else if (i < n && (s[i] == '+' || s[i] == '-')) {
        int sign = s[i] == '-' ? -1 : 1;
        long th, tm;
        i++;
        if (!digits(s, n, &i, 2, &th))
            return 0;
        if (i < n && s[i] == ':')
            i++;
        if (!digits(s, n, &i, 2, &tm))
            return 0;
        has_tz = 1;
        tzoff = sign * (th * 60 + tm);
    }
    if (i != n)
        return 0;
    (void)has_time;
    (void)has_tz;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 24 || mi > 59 || se > 59) {
        *out = NAN;
        return 1;
    }
    double days = (double)days_from_civil(y, (int)mo, (int)d);
    *out = days * 86400000.0 + (double)(h * 3600 + mi * 60 + se) * 1000.0 +
           floor(frac * 1000 + 1e-9) - (double)tzoff * 60000.0;
    return 1;
}

val *expr_parse_datetime(struct ctx *c, val *s, val *picture);

val *fn_toMillis(struct ctx *c, val **a, int n, val *in, struct env *e)
{
    val *s = ARG(0);
    if (!s)
        return NULL;
    if (ARG(1))
        return expr_parse_datetime(c, s, a[1]);
    double ms;
    if (!parse_iso(s->u.s, s->n, &ms))
        ethrow(c, "D3110", -1, NULL, NULL);
    if (isnan(ms))
        return NULL;
    return mknum(c, ms);
}
