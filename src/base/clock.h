/*
 * clock — wall and monotonic time in milliseconds, RFC 3339 rendering.
 * Thread safe.
 *
 * The wall clock the engine reads (clock_now_ms) may be moved forward by a
 * test (`idemflow serve --test-clock`, POST /v1/test/clock): one process-wide
 * offset, only ever increased, so Retry-After waits, backoff and deadlines
 * can be tested in hours of engine time without hours of real time.  Code
 * that sleeps until an engine-time instant converts it with clock_abstime.
 */
#ifndef IFL_BASE_CLOCK_H
#define IFL_BASE_CLOCK_H

#include <stdint.h>

int64_t clock_now_ms(void);  /* Unix epoch milliseconds (CLOCK_REALTIME) */
int64_t clock_mono_ms(void); /* CLOCK_MONOTONIC milliseconds            */
/* Moves the engine's wall clock forward by ms (> 0); returns the new offset. */
int64_t clock_advance(int64_t ms);
int64_t clock_offset_ms(void); /* 0 unless a test advanced the clock */
/* The CLOCK_REALTIME instant (for pthread_cond_timedwait) at which
 * clock_now_ms() reaches until_ms. */
struct timespec;
void clock_abstime(int64_t until_ms, struct timespec *ts);
/* "2026-11-30T13:14:39.123Z" into out (32 bytes). Cannot fail. */
void clock_rfc3339(int64_t ms, char out[32]);
/* The instant clock_rfc3339 wrote ("YYYY-MM-DDTHH:MM:SS.mmmZ", the
 * milliseconds optional) into *ms; 0, or IFL_EINVAL for anything else. */
int clock_parse_rfc3339(const char *s, int64_t *ms);

#endif
