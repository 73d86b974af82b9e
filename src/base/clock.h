/*
 * clock — wall and monotonic time in milliseconds, RFC 3339 rendering.
 * Thread safe; no global state.
 */
#ifndef IFL_BASE_CLOCK_H
#define IFL_BASE_CLOCK_H

#include <stdint.h>

int64_t clock_now_ms(void);  /* Unix epoch milliseconds (CLOCK_REALTIME) */
int64_t clock_mono_ms(void); /* CLOCK_MONOTONIC milliseconds            */
/* "2026-11-30T13:14:39.123Z" into out (32 bytes). Cannot fail. */
void clock_rfc3339(int64_t ms, char out[32]);

#endif
