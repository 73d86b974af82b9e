/*
 * test_crashmark — a crash (a fatal signal the process raises) on a thread
 * that names what it evaluates leaves that name in a marker file; a kill, or
 * a crash on a thread that names nothing, leaves nothing; collecting reads
 * and removes the markers.  Each case runs in a forked child that dies.
 * The engine's marker lines ("XID VERTEX EPOCH PHASE") parse back, and
 * torn or foreign lines do not.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/crashmark.h"
#include "engine/engine_int.h"

struct lines {
    char got[8][128];
    int n;
};

static void take(void *arg, const char *line)
{
    struct lines *l = arg;
    if (l->n < 8)
        snprintf(l->got[l->n++], sizeof l->got[0], "%s", line);
}

enum how { CRASH_NAMED, CRASH_UNNAMED, KILL_NAMED, CRASH_OVERFLOW };

static volatile int sink, never = -1;
static int recurse(int n) /* overflows the stack: SIGSEGV on the guard page */
{
    volatile char pad[1024];
    pad[0] = (char)n;
    if (n == never)
        return 0;
    return recurse(n + 1) + pad[0];
}

/* Sanitizers handle SIGSEGV themselves (a report, then exit). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* Forks a child that initializes crashmark on dir and dies as `how`;
 * returns the signal it died of. */
static int die_in_child(const char *dir, enum how how)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (crashmark_init(dir, NULL) != 0)
            _exit(90);
        crashmark_thread_init();
        if (how != CRASH_UNNAMED)
            crashmark_enter("0123 v1 7 rendering");
        if (how == KILL_NAMED)
            raise(SIGKILL);
        if (how == CRASH_OVERFLOW)
            sink = recurse(0);
        abort();
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    return WTERMSIG(st);
}

static void test_only_a_named_crash_leaves_a_marker(void **state)
{
    (void)state;
    char dir[] = "/tmp/ifl-crashmark-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char sub[128];
    snprintf(sub, sizeof sub, "%s/a/b", dir); /* created with its parents */
    struct lines l = {0};

    assert_int_equal(die_in_child(sub, KILL_NAMED), SIGKILL);
    assert_int_equal(die_in_child(sub, CRASH_UNNAMED), SIGABRT);
    assert_int_equal(crashmark_collect(sub, take, &l, NULL), 0);
    assert_int_equal(l.n, 0); /* a kill is not a crash; an unnamed crash names nothing */

    assert_int_equal(die_in_child(sub, CRASH_NAMED), SIGABRT);
    assert_int_equal(die_in_child(sub, CRASH_NAMED), SIGABRT);
    assert_int_equal(crashmark_collect(sub, take, &l, NULL), 0);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.got[0], "0123 v1 7 rendering");
    assert_string_equal(l.got[1], "0123 v1 7 rendering");

    l.n = 0; /* collected markers are gone */
    assert_int_equal(crashmark_collect(sub, take, &l, NULL), 0);
    assert_int_equal(l.n, 0);
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_a_stack_overflow_is_recorded_on_the_signal_stack(void **state)
{
    (void)state;
    if (SANITIZED)
        skip();
    char dir[] = "/tmp/ifl-crashmark-XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct lines l = {0};
    assert_int_equal(die_in_child(dir, CRASH_OVERFLOW), SIGSEGV);
    assert_int_equal(crashmark_collect(dir, take, &l, NULL), 0);
    assert_int_equal(l.n, 1);
    assert_string_equal(l.got[0], "0123 v1 7 rendering");
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_a_directory_others_can_write_is_refused(void **state)
{
    (void)state;
    char dir[] = "/tmp/ifl-crashmark-XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(chmod(dir, 0777), 0); /* anyone could plant markers */
    struct ifl_err e = {0};
    assert_int_not_equal(crashmark_init(dir, &e), 0); /* (fails before any handler) */
    assert_non_null(strstr(e.msg, "only it can write"));
    assert_int_equal(rmdir(dir), 0);
}

static void test_a_missing_directory_has_no_markers(void **state)
{
    (void)state;
    struct lines l = {0};
    assert_int_equal(crashmark_collect("/tmp/ifl-crashmark-does-not-exist", take, &l, NULL), 0);
    assert_int_equal(l.n, 0);
}

#define XID "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static void test_an_engine_marker_line_parses_back(void **state)
{
    (void)state;
    char line[512];
    struct engine_crash c;
    engine_crash_mark(line, sizeof line, XID, "charge", 12, "rendering");
    assert_int_equal(engine_crash_parse(line, &c), 0);
    assert_string_equal(c.xid, XID);
    assert_string_equal(c.vertex, "charge");
    assert_int_equal(c.epoch, 12);
    assert_string_equal(c.phase, "rendering");
    const char *phases[] = {"responded", "running"};
    for (size_t i = 0; i < 2; i++) {
        engine_crash_mark(line, sizeof line, XID, "v", 1, phases[i]);
        assert_int_equal(engine_crash_parse(line, &c), 0);
        assert_string_equal(c.phase, phases[i]);
    }
}

static void test_torn_or_foreign_lines_do_not_parse(void **state)
{
    (void)state;
    const char *bad[] = {
        "",
        XID,
        XID " charge 3",                 /* torn: no phase */
        XID " charge 3 rendering extra", /* five fields */
        XID " charge 0 rendering",       /* epoch < 1 */
        XID " charge -2 rendering",
        XID " charge +2 rendering",
        XID " charge 2x rendering",
        XID " charge 99999999999999999999 rendering",
        XID "  3 rendering", /* empty vertex */
        XID " charge 3 exploded",
        "0123 charge 3 rendering",  /* a short id */
        XID "0 charge 3 rendering", /* a long one */
        XID " charge 3 rendering ",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[512];
        struct engine_crash c;
        snprintf(line, sizeof line, "%s", bad[i]);
        if (engine_crash_parse(line, &c) == 0)
            fail_msg("parsed: \"%s\"", bad[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_only_a_named_crash_leaves_a_marker),
        cmocka_unit_test(test_a_stack_overflow_is_recorded_on_the_signal_stack),
        cmocka_unit_test(test_a_directory_others_can_write_is_refused),
        cmocka_unit_test(test_a_missing_directory_has_no_markers),
        cmocka_unit_test(test_an_engine_marker_line_parses_back),
        cmocka_unit_test(test_torn_or_foreign_lines_do_not_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
