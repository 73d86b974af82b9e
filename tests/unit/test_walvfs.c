/*
 * test_walvfs — the WAL-gathering VFS: every commit is in the WAL file when
 * it returns (another connection and another process see it, without a
 * close or a checkpoint), commits larger than one gathered run included, and
 * the database stays intact.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/walvfs.h"

static char dir[64];
static char path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/idemflow-walvfs-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/t.db", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static sqlite3 *open_db(const char *vfs)
{
    sqlite3 *db = NULL;
    assert_int_equal(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs),
                     SQLITE_OK);
    assert_int_equal(sqlite3_exec(db,
                                  "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                                  " PRAGMA wal_autocheckpoint=0;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    return db;
}

static long long scalar(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    long long v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    return v;
}

/* Commit i writes a row of (i * 7919) % 300000 bytes: from nothing to
 * several gathered runs' worth of pages. */
static void commit_row(sqlite3 *db, int i)
{
    char sql[160];
    snprintf(sql, sizeof sql, "INSERT INTO t (i, blob) VALUES (%d, zeroblob(%d))", i,
             (i * 7919) % 300000);
    assert_int_equal(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
}

static void test_every_commit_is_visible_to_another_connection_at_once(void **state)
{
    (void)state;
    const char *vfs = store_walvfs();
    assert_non_null(vfs);
    sqlite3 *w = open_db(vfs);
    assert_int_equal(
        sqlite3_exec(w, "CREATE TABLE t (i INTEGER PRIMARY KEY, blob BLOB)", NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3 *r = open_db(NULL); /* the default VFS */
    for (int i = 1; i <= 120; i++) {
        commit_row(w, i);
        assert_int_equal(scalar(r, "SELECT count(*) FROM t"), i);
        assert_int_equal(scalar(r, "SELECT max(length(blob)) FROM t WHERE i = (SELECT max(i) "
                                   "FROM t)"),
                         (i * 7919) % 300000);
    }
    /* one transaction of about 2 MB: many runs, then the sync */
    assert_int_equal(sqlite3_exec(w,
                                  "BEGIN; INSERT INTO t (i, blob) VALUES (1000, zeroblob(2000000));"
                                  " UPDATE t SET blob = zeroblob(10) WHERE i = 7; COMMIT;",
                                  NULL, NULL, NULL),
                     SQLITE_OK);
    assert_int_equal(scalar(r, "SELECT length(blob) FROM t WHERE i = 1000"), 2000000);
    assert_int_equal(scalar(r, "SELECT length(blob) FROM t WHERE i = 7"), 10);
    /* a checkpoint and a WAL restart behind the writer's back */
    assert_int_equal(sqlite3_wal_checkpoint_v2(r, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL),
                     SQLITE_OK);
    commit_row(w, 2000);
    assert_int_equal(scalar(r, "SELECT count(*) FROM t"), 122);
    sqlite3_close(r);
    sqlite3_close(w);
    sqlite3 *again = open_db(NULL);
    assert_int_equal(scalar(again, "SELECT count(*) FROM t"), 122);
    sqlite3_stmt *st = NULL;
    assert_int_equal(sqlite3_prepare_v2(again, "PRAGMA integrity_check", -1, &st, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(st, 0), "ok");
    sqlite3_finalize(st);
    sqlite3_close(again);
}

/* A process that commits and dies without closing anything (no final
 * flush, no checkpoint): every commit that returned is in the WAL. */
static void test_commits_survive_a_process_that_dies_without_closing(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        sqlite3 *w = open_db(store_walvfs());
        if (sqlite3_exec(w, "CREATE TABLE t (i INTEGER PRIMARY KEY, blob BLOB)", NULL, NULL,
                         NULL) != SQLITE_OK)
            _exit(2);
        for (int i = 1; i <= 40; i++)
            commit_row(w, i);
        /* a transaction left open: its frames may be buffered, never synced */
        sqlite3_exec(w, "BEGIN; INSERT INTO t (i, blob) VALUES (99, zeroblob(50000));", NULL, NULL,
                     NULL);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    sqlite3 *r = open_db(NULL);
    assert_int_equal(scalar(r, "SELECT count(*) FROM t"), 40);
    assert_int_equal(scalar(r, "SELECT sum(length(blob)) FROM t"),
                     /* sum of (i * 7919) % 300000 for i = 1..40 */
                     scalar(r, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                               "WHERE i < 40) SELECT sum((i * 7919) % 300000) FROM n"));
    sqlite3_close(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_every_commit_is_visible_to_another_connection_at_once,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_commits_survive_a_process_that_dies_without_closing,
                                        setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
