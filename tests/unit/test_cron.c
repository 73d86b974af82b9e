/*
 * test_cron — five-field cron expressions: parsing, refusals, and the next
 * fire time in UTC across month ends, leap days, the day-of-month /
 * day-of-week OR rule and expressions that never fire.  Expected instants
 * were computed independently with Python's datetime.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/clock.h"
#include "engine/cron.h"

/* The next fire after the RFC 3339 instant `after`, as RFC 3339 (or
 * "never"). */
static const char *next_after(const char *expr, int64_t after_ms)
{
    static char out[32];
    struct cron c;
    struct ifl_err e = {0};
    if (cron_parse(expr, &c, &e))
        fail_msg("%s: %s", expr, e.msg);
    int64_t t = cron_next(&c, after_ms);
    if (t < 0)
        return "never";
    clock_rfc3339(t, out);
    return out;
}

/* 2026-12-02T05:58:25.500Z and friends, as Unix ms */
#define T_20261202_055825 1796191105500LL
#define T_20261231_235959 1798761599000LL
#define T_20270201_000000 1801440000000LL

static void test_next(void **state)
{
    (void)state;
    assert_string_equal(next_after("* * * * *", T_20261202_055825), "2026-12-02T05:59:00.000Z");
    assert_string_equal(next_after("*/15 * * * *", T_20261202_055825), "2026-12-02T06:00:00.000Z");
    assert_string_equal(next_after("5/20 * * * *", T_20261202_055825), "2026-12-02T06:05:00.000Z");
    assert_string_equal(next_after("58 5 * * *", T_20261202_055825), "2026-12-03T05:58:00.000Z");
    assert_string_equal(next_after("0 9 * * mon-fri", T_20261202_055825),
                        "2026-12-02T09:00:00.000Z"); /* a Wednesday */
    assert_string_equal(next_after("0 9 * * SAT", T_20261202_055825), "2026-12-05T09:00:00.000Z");
    assert_string_equal(next_after("0 0 * * 7", T_20261202_055825), "2026-12-06T00:00:00.000Z");
    assert_string_equal(next_after("@hourly", T_20261202_055825), "2026-12-02T06:00:00.000Z");
    assert_string_equal(next_after("@yearly", T_20261202_055825), "2027-01-01T00:00:00.000Z");
    assert_string_equal(next_after("* * * * *", T_20261231_235959), "2027-01-01T00:00:00.000Z");
    /* months without a 31st are skipped */
    assert_string_equal(next_after("0 0 31 * *", T_20270201_000000), "2027-03-31T00:00:00.000Z");
    /* the next 29 February is in 2028 */
    assert_string_equal(next_after("0 12 29 feb *", T_20261202_055825), "2028-02-29T12:00:00.000Z");
    /* both day fields restricted: either matches (13th, or any Friday) */
    assert_string_equal(next_after("0 0 13 * 5", T_20261202_055825), "2026-12-04T00:00:00.000Z");
    /* a restricted day-of-month with a '*' day-of-week: both must hold */
    assert_string_equal(next_after("0 0 13 * *", T_20261202_055825), "2026-12-13T00:00:00.000Z");
    /* the weekday rule can put decades between fires (found by an audit) */
    assert_string_equal(next_after("0 12 29 2 */7", 1104537600000LL), "2032-02-29T12:00:00.000Z");
    assert_string_equal(next_after("0 0 */31 2 1", 946684800000LL), "2010-02-01T00:00:00.000Z");
    /* strictly after: an instant on the minute is not its own next */
    assert_string_equal(next_after("* * * * *", 1796191080000LL), "2026-12-02T05:59:00.000Z");
    assert_string_equal(next_after("1,2,3 0 1 1 *", 0), "1970-01-01T00:01:00.000Z");
}

static void expect_bad(const char *expr)
{
    struct cron c;
    struct ifl_err e = {0};
    if (cron_parse(expr, &c, &e) != IFL_EVALIDATION)
        fail_msg("'%s' was accepted", expr);
    assert_true(e.msg[0] != '\0');
}

static void test_refusals(void **state)
{
    (void)state;
    const char *bad[] = {"",
                         "* * * *",
                         "* * * * * *",
                         "60 * * * *",
                         "* 24 * * *",
                         "* * 0 * *",
                         "* * 32 * *",
                         "* * * 13 *",
                         "* * * * 8",
                         "5-1 * * * *",
                         "*/0 * * * *",
                         "1- * * * *",
                         "a * * * *",
                         "* * * foo *",
                         "1,,2 * * * *",
                         "*/ * * * *",
                         "0001 * * * *",
                         "@often",
                         "1/1000 * * * *",
                         "0 0 30 2 *",
                         "0 0 31 4,6,9,11 *"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_bad(bad[i]);
    struct cron c;
    assert_int_equal(cron_parse("  0\t0 * * *  ", &c, NULL), 0);
    assert_int_equal(cron_parse("0-59/30 0,12 1-7 JAN,jul sun-sat", &c, NULL), 0);
    assert_int_equal(c.minutes, (1ULL << 0) | (1ULL << 30));
    assert_int_equal(c.hours, (1u << 0) | (1u << 12));
    assert_int_equal(c.months, (1u << 1) | (1u << 7));
    assert_int_equal(c.weekdays, 0x7f);
    assert_false(c.days_star);
}

/* clock_parse_rfc3339 reads back what clock_rfc3339 wrote (a step error's
 * verifyNotBefore), and nothing else. */
static void test_rfc3339_round_trip(void **state)
{
    (void)state;
    const int64_t at[] = {0, 1796324189853LL, 951782400000LL /* 2000-02-29 */, 4102444799999LL};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        char s[32];
        int64_t back = -1;
        clock_rfc3339(at[i], s);
        assert_int_equal(clock_parse_rfc3339(s, &back), 0);
        assert_int_equal(back, at[i]);
    }
    int64_t ms = 0;
    assert_int_equal(clock_parse_rfc3339("2026-12-03T19:00:00Z", &ms), 0);
    assert_int_equal(ms, 1796324400000LL);
    const char *bad[] = {"",
                         "2026-12-03",
                         "2026-12-03T19:00:00",
                         "2026-12-03T19:00:00.1Z",
                         "2026-13-03T19:00:00Z",
                         "2026-12-03T19:00:00+01:00",
                         "x",
                         NULL};
    for (size_t i = 0; bad[i]; i++)
        assert_int_equal(clock_parse_rfc3339(bad[i], &ms), IFL_EINVAL);
    assert_int_equal(clock_parse_rfc3339(NULL, &ms), IFL_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_next),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_rfc3339_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
