/*
 * clock — see clock.h.  Uses gmtime_r (never localtime).
 */
#include "base/clock.h"
#include "base/err.h"

#include <ctype.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static _Atomic int64_t offset_ms;

static int64_t real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t clock_now_ms(void)
{
    return real_ms() + atomic_load_explicit(&offset_ms, memory_order_relaxed);
}

int64_t clock_advance(int64_t ms)
{
    if (ms <= 0)
        return atomic_load(&offset_ms);
    return atomic_fetch_add(&offset_ms, ms) + ms;
}

int64_t clock_offset_ms(void)
{
    return atomic_load(&offset_ms);
}

void clock_abstime(int64_t until_ms, struct timespec *ts)
{
    int64_t real = until_ms - atomic_load(&offset_ms);
    if (real < 0)
        real = 0;
    ts->tv_sec = (time_t)(real / 1000);
    ts->tv_nsec = (long)(real % 1000) * 1000000L;
}

int64_t clock_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int clock_parse_rfc3339(const char *s, int64_t *ms)
{
    struct tm tm = {0};
    int frac = 0, n = 0;
    if (!s ||
        sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
               &tm.tm_min, &tm.tm_sec, &n) != 6 ||
        n != 19)
        return IFL_EINVAL;
    const char *p = s + n;
    if (*p == '.') {
        if (!isdigit((unsigned char)p[1]) || !isdigit((unsigned char)p[2]) ||
            !isdigit((unsigned char)p[3]))
            return IFL_EINVAL;
        frac = (p[1] - '0') * 100 + (p[2] - '0') * 10 + (p[3] - '0');
        p += 4;
    }
    if (strcmp(p, "Z") != 0 || tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 ||
        tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
        return IFL_EINVAL;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    *ms = (int64_t)timegm(&tm) * 1000 + frac;
    return 0;
}

void clock_rfc3339(int64_t ms, char out[32])
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03dZ", (int)(ms % 1000));
}
