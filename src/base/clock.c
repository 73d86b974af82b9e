/*
 * clock — see clock.h.  Uses gmtime_r (never localtime).
 */
#include "base/clock.h"

#include <stdatomic.h>
#include <stdio.h>
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

void clock_rfc3339(int64_t ms, char out[32])
{
    time_t s = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(out, 32, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03dZ", (int)(ms % 1000));
}
