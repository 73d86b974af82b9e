/*
 * bench/sqlitecost — the SQLite costs behind the store's settings, each as an
 * A/B in one process (median of 3 alternating rounds), on a temporary
 * database under /tmp:
 *
 *   returning   INSERT … RETURNING seq against INSERT + last_insert_rowid
 *               (SQLite builds an ephemeral table for RETURNING, whose cost
 *               grows with the connection's cache_size), CPU µs/insert
 *   commit      a COMMIT of 50 random-key inserts with a 64 MiB and an 8 MiB
 *               page cache (every COMMIT scans the cache's whole hash table),
 *               CPU µs/commit, synchronous=OFF to leave the disk out
 *   read        a one-row read right after another connection's commit, with
 *               a warm 16 MiB and a 2 MiB reader cache (a WAL reader empties
 *               its cache then), µs/read
 *   wal         a durable commit of 100 pages (synchronous=FULL, fdatasync)
 *               through the default VFS and through store/walvfs, µs/commit
 *   savepoint   a job of 8 inserts with and without SAVEPOINT/RELEASE around
 *               it (the writer's per-job isolation), CPU µs/job
 *
 * Prints one line per pair: name, A, B, B/A.  Bounded: about 20 s.
 */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "store/walvfs.h"

static char dir[64];

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static sqlite3 *fresh(const char *name, const char *vfs, const char *pragmas)
{
    char path[128], cmd[448];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(cmd, sizeof cmd, "rm -f %s %s-wal %s-shm", path, path, path);
    if (system(cmd) != 0)
        exit(1);
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs) != SQLITE_OK ||
        sqlite3_exec(db, pragmas, NULL, NULL, NULL) != SQLITE_OK) {
        fprintf(stderr, "sqlitecost: open %s: %s\n", path, sqlite3_errmsg(db));
        exit(1);
    }
    return db;
}

static void run(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) {
        fprintf(stderr, "sqlitecost: %s: %s\n", sql, err);
        exit(1);
    }
}

static sqlite3_stmt *prep(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "sqlitecost: %s: %s\n", sql, sqlite3_errmsg(db));
        exit(1);
    }
    return st;
}

static void step(sqlite3_stmt *st)
{
    while (sqlite3_step(st) == SQLITE_ROW)
        ;
    sqlite3_reset(st);
}

#define WAL_FAST "PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF; PRAGMA temp_store=MEMORY;"

static double returning(int b)
{
    /* the engine's events table and writer settings */
    sqlite3 *db = fresh("r.db", NULL, WAL_FAST " PRAGMA cache_size=-8192;");
    run(db, "CREATE TABLE events (seq INTEGER PRIMARY KEY, id TEXT NOT NULL, workspace TEXT NOT "
            "NULL, execution_id TEXT, aggregate_version BIGINT, type TEXT NOT NULL, data TEXT "
            "NOT NULL, created_at BIGINT NOT NULL); CREATE INDEX events_by_ws ON events "
            "(workspace, seq);");
    sqlite3_stmt *st = prep(
        db, b ? "INSERT INTO events (id, workspace, execution_id, aggregate_version, type, data,"
                " created_at) VALUES (?, 'ws', 'x', 1, 'step.completed', '{\"a\":1}', 5)"
              : "INSERT INTO events (id, workspace, execution_id, aggregate_version, type, data,"
                " created_at) VALUES (?, 'ws', 'x', 1, 'step.completed', '{\"a\":1}', 5)"
                " RETURNING seq");
    enum { N = 60000 };
    long long sum = 0;
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    run(db, "BEGIN");
    for (int i = 0; i < N; i++) {
        sqlite3_bind_int(st, 1, i);
        if (sqlite3_step(st) == SQLITE_ROW)
            sum += sqlite3_column_int64(st, 0);
        else
            sum += sqlite3_last_insert_rowid(db);
        step(st);
        if (i % 50 == 49)
            run(db, "COMMIT; BEGIN");
    }
    run(db, "COMMIT");
    double us = (clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) / N * 1e6;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return sum > 0 ? us : -1;
}

static double commit(int b)
{
    sqlite3 *db = fresh("c.db", NULL,
                        b ? WAL_FAST " PRAGMA cache_size=-8192; PRAGMA wal_autocheckpoint=10000;"
                          : WAL_FAST " PRAGMA cache_size=-65536; PRAGMA wal_autocheckpoint=10000;");
    run(db, "CREATE TABLE x (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, pad TEXT)");
    sqlite3_stmt *st = prep(db, "INSERT INTO x (id, pad) VALUES (hex(randomblob(32)), "
                                "zeroblob(300))");
    enum { BATCHES = 2500 };
    double tc = 0;
    for (int i = 0; i < BATCHES; i++) {
        run(db, "BEGIN");
        for (int k = 0; k < 50; k++)
            step(st);
        double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        run(db, "COMMIT");
        tc += clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return tc / BATCHES * 1e6;
}

static double read_after_write(int b)
{
    sqlite3 *w = fresh("d.db", NULL, WAL_FAST);
    run(w, "CREATE TABLE x (a INTEGER PRIMARY KEY, b BLOB); WITH RECURSIVE n(i) AS (SELECT 1 "
           "UNION ALL SELECT i + 1 FROM n WHERE i < 60000) INSERT INTO x (b) SELECT "
           "zeroblob(200) FROM n;");
    char path[128];
    snprintf(path, sizeof path, "%s/d.db", dir);
    sqlite3 *r = NULL;
    if (sqlite3_open_v2(path, &r, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK)
        exit(1);
    run(r, b ? "PRAGMA cache_size=-2048" : "PRAGMA cache_size=-16384");
    run(r, "SELECT sum(length(b)) FROM x"); /* warms the reader's cache */
    sqlite3_stmt *ins = prep(w, "INSERT INTO x (b) VALUES (1)");
    sqlite3_stmt *sel = prep(r, "SELECT b FROM x WHERE a = ?");
    enum { N = 4000 };
    double t = 0;
    for (int i = 0; i < N; i++) {
        step(ins);
        double t0 = clock_s(CLOCK_MONOTONIC);
        sqlite3_bind_int(sel, 1, i * 7 + 1);
        step(sel);
        t += clock_s(CLOCK_MONOTONIC) - t0;
    }
    sqlite3_finalize(ins);
    sqlite3_finalize(sel);
    sqlite3_close(r);
    sqlite3_close(w);
    return t / N * 1e6;
}

static double wal(int b)
{
    sqlite3 *db = fresh("w.db", b ? store_walvfs() : NULL,
                        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                        " PRAGMA wal_autocheckpoint=0;");
    run(db, "CREATE TABLE x (a INTEGER PRIMARY KEY, b BLOB)");
    sqlite3_stmt *st = prep(db, "INSERT INTO x (b) VALUES (zeroblob(3900))");
    enum { COMMITS = 150 };
    double t0 = clock_s(CLOCK_MONOTONIC);
    for (int i = 0; i < COMMITS; i++) {
        run(db, "BEGIN");
        for (int k = 0; k < 100; k++) /* about 100 pages */
            step(st);
        run(db, "COMMIT");
        if (i % 50 == 49)
            run(db, "PRAGMA wal_checkpoint(TRUNCATE)");
    }
    double us = (clock_s(CLOCK_MONOTONIC) - t0) / COMMITS * 1e6;
    sqlite3_finalize(st);
    sqlite3_close(db);
    return us;
}

static double savepoint(int b)
{
    sqlite3 *db = fresh("s.db", NULL, WAL_FAST);
    run(db, "CREATE TABLE x (a INTEGER PRIMARY KEY, b BLOB)");
    sqlite3_stmt *ins = prep(db, "INSERT INTO x (b) VALUES (zeroblob(100))");
    sqlite3_stmt *sv = prep(db, "SAVEPOINT job");
    sqlite3_stmt *rl = prep(db, "RELEASE job");
    enum { BATCHES = 1500, JOBS = 40 };
    double t0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < BATCHES; i++) {
        run(db, "BEGIN");
        for (int j = 0; j < JOBS; j++) {
            if (b)
                step(sv);
            for (int k = 0; k < 8; k++)
                step(ins);
            if (b)
                step(rl);
        }
        run(db, "COMMIT");
    }
    double us = (clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) / (BATCHES * JOBS) * 1e6;
    sqlite3_finalize(ins);
    sqlite3_finalize(sv);
    sqlite3_finalize(rl);
    sqlite3_close(db);
    return us;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void pair(const char *name, const char *a, const char *b, const char *unit,
                 double (*fn)(int))
{
    double va[3], vb[3];
    for (int r = 0; r < 3; r++) {
        va[r] = fn(0);
        vb[r] = fn(1);
    }
    qsort(va, 3, sizeof va[0], cmp);
    qsort(vb, 3, sizeof vb[0], cmp);
    printf("%-10s %-22s %8.2f  %-22s %8.2f  %-14s B/A %.2f\n", name, a, va[1], b, vb[1], unit,
           vb[1] / va[1]);
    fflush(stdout);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/idemflow-sqlitecost-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("sqlitecost: mkdtemp");
        return 1;
    }
    printf("sqlitecost: SQLite %s, medians of 3 alternating rounds\n", sqlite3_libversion());
    pair("returning", "A RETURNING seq", "B last_insert_rowid", "CPU us/insert", returning);
    pair("commit", "A cache 64 MiB", "B cache 8 MiB", "CPU us/commit", commit);
    pair("read", "A reader 16 MiB", "B reader 2 MiB", "us/read", read_after_write);
    pair("wal", "A default VFS", "B walvfs", "us/commit", wal);
    pair("savepoint", "A plain job", "B SAVEPOINT job", "CPU us/job", savepoint);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 1;
}
