/*
 * fuzz_cron — schedule expressions (engine/cron.h).  The input is the
 * text; an accepted expression must fire, at times that are whole
 * minutes, strictly after the instant asked about, and stable: the next
 * fire after (t - 1 ms) is t itself, and the one after t is later still.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cron.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 300)
        return 0;
    char text[301];
    memcpy(text, data, size);
    text[size] = '\0';
    struct cron c;
    struct ifl_err e = {0};
    if (cron_parse(text, &c, &e)) {
        if (e.code != IFL_EVALIDATION || !e.msg[0])
            abort();
        return 0;
    }
    static const int64_t after[] = {0, 1796191105500LL, 1798761599000LL, 4102444799999LL};
    for (size_t i = 0; i < sizeof after / sizeof after[0]; i++) {
        int64_t t = cron_next(&c, after[i]);
        if (t < 0) /* accepted means it fires: the calendar repeats every 400 years */
            abort();
        if (t <= after[i] || t % 60000 != 0 || cron_next(&c, t - 1) != t)
            abort();
        int64_t u = cron_next(&c, t);
        if (u >= 0 && u <= t)
            abort();
    }
    return 0;
}
