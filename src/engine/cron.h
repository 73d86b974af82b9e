/*
 * cron — five-field cron expressions (spec §9), evaluated in UTC.
 *
 *   minute hour day-of-month month day-of-week
 *
 * Each field is `*` or a comma list of `N`, `A-B`, with an optional `/STEP`
 * (`*` + step, `A-B/S`, and `A/S` meaning A to the field's end).  Months
 * take JAN–DEC, days of the week SUN–SAT (0 and 7 are Sunday), in any
 * case.  As in Vixie cron, when both day fields are restricted (neither
 * starts with `*`) a day matches when either does.  The macros @yearly,
 * @annually, @monthly, @weekly, @daily, @midnight and @hourly stand for
 * their five fields.  Pure functions; thread safe.
 */
#ifndef IFL_ENGINE_CRON_H
#define IFL_ENGINE_CRON_H

#include <stdint.h>

#include "base/err.h"

struct cron {
    uint64_t minutes;     /* bit m: minute m matches */
    uint32_t hours, days; /* days: bit 1..31 */
    uint16_t months;      /* bit 1..12 */
    uint8_t weekdays;     /* bit 0..6, Sunday 0 */
    uint8_t days_star, weekdays_star;
};

/* Parses text into *c.  0, or IFL_EVALIDATION with a message naming the
 * field at fault, or saying that the expression never fires. */
int cron_parse(const char *text, struct cron *c, struct ifl_err *e);

/* The first instant (Unix ms, on a whole minute) strictly after after_ms
 * (>= 0) that c matches, or -1 when it never fires (e.g. "0 0 30 2 *"):
 * none within 400 years, after which the calendar repeats. */
int64_t cron_next(const struct cron *c, int64_t after_ms);

#endif
