/*
 * cron — see cron.h.  Matching walks the days of matching months (a month
 * that does not match is skipped whole), then the minutes of a matching
 * day.  The Gregorian calendar repeats every 400 years, weekdays included,
 * so an expression with no fire in 400 years never fires.
 */
#include "engine/cron.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_TEXT 256
#define SEARCH_DAYS 146097 /* 400 Gregorian years */

struct field {
    const char *name;
    int lo, hi;
    const char *const *names; /* NULL, or hi - lo + 1 names for lo.. */
};

static const char *const month_names[] = {"jan", "feb", "mar", "apr", "may", "jun",
                                          "jul", "aug", "sep", "oct", "nov", "dec"};
static const char *const day_names[] = {"sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun"};

static const struct field fields[5] = {
    {"minute", 0, 59, NULL},          {"hour", 0, 23, NULL},
    {"day of month", 1, 31, NULL},    {"month", 1, 12, month_names},
    {"day of week", 0, 7, day_names},
};

/* A number or a name of field f at *p; advances *p.  -1 when neither. */
static int value(const struct field *f, const char **p)
{
    const char *s = *p;
    if (*s >= '0' && *s <= '9') {
        int v = 0, n = 0;
        while (*s >= '0' && *s <= '9' && n < 3)
            v = v * 10 + (*s++ - '0'), n++;
        if (*s >= '0' && *s <= '9')
            return -1;
        *p = s;
        return v;
    }
    if (f->names)
        for (int i = 0; i <= f->hi - f->lo; i++)
            if (strncasecmp(s, f->names[i], 3) == 0) {
                *p = s + 3;
                return f->lo + i;
            }
    return -1;
}

/* One field's text [s, end) into the bits of *bits; *star when it starts
 * with '*'. */
static int field_parse(const struct field *f, const char *s, const char *end, uint64_t *bits,
                       int *star, struct ifl_err *e)
{
    *bits = 0;
    *star = *s == '*';
    const char *p = s;
    for (;;) {
        int a, b, step = 1, single = 0;
        if (*p == '*') {
            a = f->lo;
            b = f->hi;
            p++;
        } else {
            if ((a = value(f, &p)) < 0)
                goto bad;
            b = a;
            single = *p != '-';
            if (*p == '-') {
                p++;
                if ((b = value(f, &p)) < 0)
                    goto bad;
            }
        }
        if (*p == '/') {
            p++;
            const char *q = p;
            step = 0;
            while (*q >= '0' && *q <= '9' && q - p < 3)
                step = step * 10 + (*q++ - '0');
            if (q == p || step < 1 || (*q >= '0' && *q <= '9'))
                goto bad;
            if (single)
                b = f->hi; /* "A/S": from A to the field's end */
            p = q;
        }
        if (a < f->lo || b > f->hi || a > b)
            return err_set(e, IFL_EVALIDATION,
                           "the %s field's values must be %d to %d, low to high", f->name, f->lo,
                           f->hi);
        for (int v = a; v <= b; v += step)
            *bits |= 1ULL << v;
        if (p == end)
            return 0;
        if (*p != ',')
            goto bad;
        p++;
    }
bad:
    return err_set(e, IFL_EVALIDATION,
                   "the %s field ('%.*s') is not a cron field: N, A-B, *, with /STEP and commas",
                   f->name, (int)(end - s), s);
}

static const struct {
    const char *name, *fields;
} macros[] = {
    {"@yearly", "0 0 1 1 *"}, {"@annually", "0 0 1 1 *"}, {"@monthly", "0 0 1 * *"},
    {"@weekly", "0 0 * * 0"}, {"@daily", "0 0 * * *"},    {"@midnight", "0 0 * * *"},
    {"@hourly", "0 * * * *"},
};

int cron_parse(const char *text, struct cron *c, struct ifl_err *e)
{
    memset(c, 0, sizeof *c);
    if (strlen(text) > MAX_TEXT)
        return err_set(e, IFL_EVALIDATION, "a schedule is at most %d characters", MAX_TEXT);
    for (size_t i = 0; i < sizeof macros / sizeof macros[0]; i++)
        if (strcasecmp(text, macros[i].name) == 0)
            return cron_parse(macros[i].fields, c, e);
    const char *p = text;
    uint64_t bits[5];
    int star[5];
    for (int i = 0; i < 5; i++) {
        while (*p == ' ' || *p == '\t')
            p++;
        const char *end = p;
        while (*end && *end != ' ' && *end != '\t')
            end++;
        if (end == p)
            return err_set(e, IFL_EVALIDATION,
                           "a schedule has five fields: minute hour day-of-month month "
                           "day-of-week (UTC), or a macro such as @daily");
        int rc = field_parse(&fields[i], p, end, &bits[i], &star[i], e);
        if (rc)
            return rc;
        p = end;
    }
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p)
        return err_set(e, IFL_EVALIDATION,
                       "a schedule has five fields: minute hour day-of-month month day-of-week");
    c->minutes = bits[0];
    c->hours = (uint32_t)bits[1];
    c->days = (uint32_t)bits[2];
    c->months = (uint16_t)bits[3];
    c->weekdays = (uint8_t)((bits[4] | bits[4] >> 7) & 0x7f); /* 7 is Sunday */
    c->days_star = (uint8_t)star[2];
    c->weekdays_star = (uint8_t)star[4];
    if (cron_next(c, 0) < 0)
        return err_set(e, IFL_EVALIDATION, "this schedule never fires (no such day)");
    return 0;
}

/* Civil date of a day number (days since 1970-01-01), H. Hinnant's
 * algorithm. */
static void civil(int64_t z, int *y, unsigned *m, unsigned *d)
{
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = (int)(yoe + era * 400) + (*m <= 2);
}

/* Days from 1970-01-01 to y-m-01 (Hinnant's days_from_civil). */
static int64_t first_of_month(int y, unsigned m)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    unsigned yoe = (unsigned)(y - era * 400);
    unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5;
    unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + (int64_t)doe - 719468;
}

/* 1 when the day matches; 0 when not; when its month does not match,
 * *skip_to = the first day of the next month (else day + 1). */
static int day_matches(const struct cron *c, int64_t day, int64_t *skip_to)
{
    int y;
    unsigned m, d;
    civil(day, &y, &m, &d);
    *skip_to = day + 1;
    if (!(c->months >> m & 1)) {
        *skip_to = m == 12 ? first_of_month(y + 1, 1) : first_of_month(y, m + 1);
        return 0;
    }
    int dom = (int)(c->days >> d & 1);
    int dow = c->weekdays >> ((day % 7 + 11) % 7) & 1; /* 1970-01-01 was a Thursday */
    if (!c->days_star && !c->weekdays_star)
        return dom || dow;
    return dom && dow;
}

int64_t cron_next(const struct cron *c, int64_t after_ms)
{
    if (after_ms < 0)
        after_ms = -1;
    int64_t t = (after_ms + 60000) / 60000 * 60000; /* the next whole minute */
    int64_t day = t / 86400000, start = day, next;
    int first = (int)(t % 86400000 / 60000);
    for (; day - start < SEARCH_DAYS; day = next, first = 0) {
        if (!day_matches(c, day, &next))
            continue;
        for (int h = first / 60; h < 24; h++) {
            if (!(c->hours >> h & 1))
                continue;
            for (int mi = h == first / 60 ? first % 60 : 0; mi < 60; mi++)
                if (c->minutes >> mi & 1)
                    return day * 86400000 + (int64_t)(h * 60 + mi) * 60000;
        }
    }
    return -1;
}
