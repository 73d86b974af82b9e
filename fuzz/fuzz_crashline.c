/*
 * fuzz_crashline — the crash-marker lines the engine reads back at start
 * (engine_crash_parse; base/crashmark.h writes them).  A line that parses
 * has a 64-character id, a vertex and a phase without spaces, an epoch >= 1
 * and a known phase, and formatting it again (engine_crash_mark) parses to
 * the same fields.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 600)
        return 0; /* the reader's lines are at most 511 bytes */
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = '\0';
    struct engine_crash c;
    if (engine_crash_parse(s, &c) == 0) {
        if (strlen(c.xid) != 64 || !*c.vertex || strchr(c.vertex, ' ') || c.epoch < 1)
            abort();
        if (strcmp(c.phase, "rendering") && strcmp(c.phase, "responded") &&
            strcmp(c.phase, "running"))
            abort();
        char again[1400];
        struct engine_crash d;
        engine_crash_mark(again, sizeof again, c.xid, c.vertex, c.epoch, c.phase);
        if (engine_crash_parse(again, &d) || strcmp(d.xid, c.xid) || strcmp(d.vertex, c.vertex) ||
            d.epoch != c.epoch || strcmp(d.phase, c.phase))
            abort();
    }
    free(s);
    return 0;
}
