/*
 * store_sqlite — the embedded backend.
 *
 * Durability: WAL journal, synchronous=FULL: an operation that returned 0 has
 * been fsynced.  To keep that affordable, every write goes through ONE writer
 * thread that owns the only write connection and commits whatever jobs have
 * queued up while the previous commit was syncing (group commit): a batch of
 * N jobs costs one fsync.  A job that fails rolls back alone and never
 * poisons its batch: the batch then runs again with each job in its own
 * SAVEPOINT (run_batch).  A caller's call returns only after the batch's
 * COMMIT succeeded.
 *
 * Reads use a small pool of read-only connections (WAL readers never block
 * the writer and see every committed batch).  A Bloom filter of the
 * execution ids (idset.h: filled by a scan at open, then by the writer at
 * each insert) answers store_execution_get for an id that certainly does
 * not exist without a read — the trigger's pre-read of a new id.
 *
 * One process per database: an exclusive flock on "<path>.lock" (path made
 * canonical: symlinks and other spellings share it) and another on the
 * database file itself (a hard link is one more name for the same file) are
 * taken at open and held until close.  flock is local: the database belongs
 * on a local disk.  The database file's descriptor is closed only after
 * every SQLite connection: closing any descriptor of a file drops all the
 * POSIX (fcntl) locks the process holds on it, and SQLite's are those.
 *
 * Must never: return success for a job whose batch did not commit; hold a
 * reader connection across calls.
 */
#include "store/idset.h"
#include "store/walvfs.h"
#include "store/store_int.h"
#include "base/clock.h"
#include "base/fault.h"
#include "base/log.h"
#include "base/mem.h"
#include "crypto/crypto.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <semaphore.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#define STMT_CACHE 128
#define MAX_READERS 16

struct conn {
    sqlite3 *db;
    struct {
        const char *sql; /* static SQL text; the pointer is the cache key */
        sqlite3_stmt *st;
    } cache[STMT_CACHE];
    int ncache;
    struct conn *next;
};

struct job {
    int (*fn)(struct conn *c, void *arg, struct ifl_err *e);
    void *arg;
    int rc;
    struct ifl_err err;
    sem_t done;                 /* posted by the writer once the job's batch committed … */
    void (*fin)(struct job *j); /* … or, when set, called instead (submitted jobs) */
    struct job *next;
};

struct sq {
    struct store base;
    char *path;
    int lockfd;
    int dbfd; /* flock on the database file; closed after every connection */
    struct conn writer;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    struct job *head, *tail;
    int stopping;
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    struct conn ckpt; /* the checkpointer's connection */
    pthread_t ckpt_thread;
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    pthread_cond_t ccv_idle; /* the checkpointer is done copying */
    int ckpt_wanted, ckpt_stop, ckpt_running;
    int wal_frames;          /* the WAL's frames after the writer's last commit (writer only) */
    atomic_int ckpt_busy;    /* the checkpointer is copying frames … */
    atomic_int ckpt_catchup; /* … and is done: the writer copies the rest */
    struct conn *free_readers;
    int nreaders;
    struct idset *ids;    /* every execution id the database may hold … */
    atomic_int ids_ready; /* … once its loader is done */
    atomic_int ids_stop;
    pthread_t ids_thread;
    int ids_running;
    char *claim_after;       /* the last workspace a claim looked at (writer only; NULL: none) */
    char *claim_empty_since; /* store_claim_lap's (writer only) */
};

/* ---- connections and statements ------------------------------------------ */

static int db_err(struct conn *c, struct ifl_err *e, const char *what)
{
    int code = sqlite3_extended_errcode(c->db);
    if (code == SQLITE_CONSTRAINT_FOREIGNKEY)
        return err_set(e, IFL_ENOTFOUND, "%s: referenced record does not exist", what);
    return err_set(e, IFL_ESTORE, "%s: sqlite: %s", what, sqlite3_errmsg(c->db));
}

/* Returns a reset, cleared statement for static SQL text `sql`. */
static sqlite3_stmt *stmt(struct conn *c, const char *sql, struct ifl_err *e)
{
    for (int i = 0; i < c->ncache; i++)
        if (c->cache[i].sql == sql)
            return c->cache[i].st;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v3(c->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK) {
        db_err(c, e, "prepare");
        return NULL;
    }
    if (c->ncache < STMT_CACHE) {
        c->cache[c->ncache].sql = sql;
        c->cache[c->ncache].st = st;
        c->ncache++;
    } else {
        log_warn("store.stmt_cache_full", "statement cache full; raise STMT_CACHE");
    }
    return st;
}

static void done_stmt(sqlite3_stmt *st)
{
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

static int exec(struct conn *c, const char *sql, struct ifl_err *e)
{
    char *msg = NULL;
    if (sqlite3_exec(c->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int rc = err_set(e, IFL_ESTORE, "sqlite: %s", msg ? msg : "error");
        sqlite3_free(msg);
        return rc;
    }
    return 0;
}

static void conn_close(struct conn *c)
{
    for (int i = 0; i < c->ncache; i++)
        sqlite3_finalize(c->cache[i].st);
    c->ncache = 0;
    if (c->db)
        sqlite3_close(c->db);
    c->db = NULL;
}

static int conn_open(struct conn *c, const char *path, int readonly, struct ifl_err *e)
{
    memset(c, 0, sizeof *c);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | (readonly ? 0 : SQLITE_OPEN_CREATE);
    /* writers append to the WAL: one pwrite per commit (walvfs.h) */
    if (sqlite3_open_v2(path, &c->db, flags, readonly ? NULL : store_walvfs()) != SQLITE_OK) {
        int rc = err_set(e, IFL_ESTORE, "cannot open %s: %s", path,
                         c->db ? sqlite3_errmsg(c->db) : "out of memory");
        conn_close(c);
        return rc;
    }
    sqlite3_busy_timeout(c->db, 5000);
    /* temp_store=MEMORY: statement journals (multi-row statements, and each
     * job's SAVEPOINT when a batch runs in its careful form) stay in memory
     * instead of a temp file (thousands of pwrites per batch otherwise).
     * cache_size: the hot tails of the B-trees stay cached.  The writer's is
     * kept small (8 MiB) on purpose: every COMMIT ends with SQLite scanning
     * its whole page-cache hash table (pcache1 truncate), so a 64 MiB cache
     * spent 8-10 % of the writer's CPU there, 8 MiB about 2 %; pages it
     * drops are re-read from the OS page cache.  A reader's cache is emptied
     * at the start of every read after another connection's commit (WAL),
     * by the same whole-table scan, so it gains nothing from size: 2 MiB (a
     * read after a write: 20-22 -> 16 us with a warm 16 MiB cache). */
    const char *pragmas = readonly ? "PRAGMA query_only=1; PRAGMA foreign_keys=ON;"
                                     " PRAGMA cache_size=-2048;"
                                   : "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
                                     " PRAGMA foreign_keys=ON; PRAGMA temp_store=MEMORY;"
                                     " PRAGMA cache_size=-8192;";
    int rc = exec(c, pragmas, e);
    if (rc)
        conn_close(c);
    return rc;
}

static struct conn *reader_get(struct sq *s, struct ifl_err *e)
{
    pthread_mutex_lock(&s->rmu);
    while (!s->free_readers && s->nreaders >= MAX_READERS)
        pthread_cond_wait(&s->rcv, &s->rmu);
    struct conn *c = s->free_readers;
    if (c) {
        s->free_readers = c->next;
        pthread_mutex_unlock(&s->rmu);
        return c;
    }
    s->nreaders++;
    pthread_mutex_unlock(&s->rmu);
    c = xmalloc(sizeof *c);
    if (conn_open(c, s->path, 1, e)) {
        free(c);
        pthread_mutex_lock(&s->rmu);
        s->nreaders--;
        pthread_cond_signal(&s->rcv);
        pthread_mutex_unlock(&s->rmu);
        return NULL;
    }
    return c;
}

static void reader_put(struct sq *s, struct conn *c)
{
    pthread_mutex_lock(&s->rmu);
    c->next = s->free_readers;
    s->free_readers = c;
    pthread_cond_signal(&s->rcv);
    pthread_mutex_unlock(&s->rmu);
}

/* A pooled reader and a prepared statement for sql, or NULL (reader
 * returned, *e filled).  Pair with read_end. */
static sqlite3_stmt *read_begin(struct sq *s, const char *sql, struct conn **c, struct ifl_err *e)
{
    *c = reader_get(s, e);
    if (!*c)
        return NULL;
    sqlite3_stmt *st = stmt(*c, sql, e);
    if (!st)
        reader_put(s, *c);
    return st;
}

static void read_end(struct sq *s, struct conn *c, sqlite3_stmt *st)
{
    done_stmt(st);
    reader_put(s, c);
}

/* Makes room for one more element in a doubling heap array. */

/* ---- the writer thread (group commit) ------------------------------------- */

/* Transaction control through the statement cache: parsed once, not per
 * job (sqlite3_exec re-parses every call). */
static const char sql_begin[] = "BEGIN IMMEDIATE";
static const char sql_savepoint[] = "SAVEPOINT job";
static const char sql_release[] = "RELEASE job";
static const char sql_rollback_to[] = "ROLLBACK TO job";
static const char sql_commit[] = "COMMIT";

static int ctl(struct conn *c, const char *sql, struct ifl_err *e)
{
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    int r = sqlite3_step(st);
    int rc = r == SQLITE_DONE ? 0 : db_err(c, e, sql);
    done_stmt(st);
    return rc;
}

/* The careful form of a batch: each job in its own savepoint, so one that
 * fails rolls back alone. */
static void run_batch_guarded(struct conn *c, struct job *batch)
{
    struct ifl_err e;
    int txrc = ctl(c, sql_begin, &e);
    for (struct job *j = batch; j; j = j->next) {
        if (txrc) {
            j->rc = txrc;
            j->err = e;
            continue;
        }
        err_clear(&j->err);
        if ((txrc = ctl(c, sql_savepoint, &e)))
            continue;
        j->rc = j->fn(c, j->arg, &j->err);
        if (j->rc)
            txrc = ctl(c, sql_rollback_to, &e);
        if (!txrc)
            txrc = ctl(c, sql_release, &e);
    }
    if (!txrc)
        txrc = ctl(c, sql_commit, &e);
    if (txrc) {
        log_error("store.commit_failed", "%s", e.msg);
        exec(c, "ROLLBACK", NULL);
        for (struct job *j = batch; j; j = j->next)
            if (j->rc == 0) {
                j->rc = txrc;
                j->err = e;
            }
    }
}

/* Runs a batch as one transaction.  Jobs almost never fail, so the batch is
 * first run without savepoints (two statements per job, and the copies of
 * every page a job touches again into the statement journal, saved); the
 * first job that fails rolls the whole batch back, and it runs again in the
 * careful form (a lone job's rollback is already its own).  Running a job
 * twice is allowed: a job derives everything from what it reads and resets
 * its outputs (store.h, "transactions"). */
static void run_batch(struct sq *s, struct job *batch)
{
    struct ifl_err e;
    struct conn *c = &s->writer;
    int txrc = ctl(c, sql_begin, &e);
    for (struct job *j = batch; !txrc && j; j = j->next) {
        err_clear(&j->err);
        if ((j->rc = j->fn(c, j->arg, &j->err)))
            txrc = j->rc;
    }
    if (!txrc && !(txrc = ctl(c, sql_commit, &e)))
        return;
    exec(c, "ROLLBACK", NULL);
    if (!batch->next && batch->rc)
        return; /* a lone job that failed: rolled back, its error stands */
    run_batch_guarded(c, batch);
}

/* ---- checkpoints ----------------------------------------------------------- */

/* Checkpoints, and why the writer finishes them.
 *
 * SQLite rewinds the WAL (writes from its start again, in blocks the file
 * already has) only when a write transaction begins on a WAL that is wholly
 * copied back into the database.  The checkpointer copies in the background
 * whatever the WAL held when it started (PASSIVE: it never blocks the
 * writer), but under sustained load the writer commits again meanwhile, so
 * it never catches up: the WAL grew without bound (160 MB in 6 s of the
 * gateway bench), every commit extended the file (so each fdatasync also
 * wrote the file's metadata), and each pass copied the last commit's pages
 * again with nothing to de-duplicate.  So the work is split: past CKPT_FRAMES frames
 * the checkpointer copies the bulk, then the writer, between two batches,
 * copies the few frames committed since (ckpt_catch_up), and its next
 * transaction rewinds the WAL.  A reader still using old frames only delays
 * the rewind to a later round.  wal_autocheckpoint=0: the writer runs the
 * bulk itself only when the checkpointer fell behind by CKPT_HOLD_FRAMES
 * (starved of CPU or disk on a loaded machine): it waits for the
 * checkpointer's pass to end, then copies the rest before its next batch
 * (ckpt_hold_back).  That is the back-pressure that bounds the WAL: writes
 * wait rather than the file growing without bound. */
#define CKPT_FRAMES 2000
#define CKPT_HOLD_FRAMES 5000

static int on_wal(void *arg, sqlite3 *db, const char *name, int frames)
{
    struct sq *s = arg;
    s->wal_frames = frames;
    if (frames >= CKPT_FRAMES && !atomic_load(&s->ckpt_busy) && !atomic_load(&s->ckpt_catchup)) {
        pthread_mutex_lock(&s->cmu);
        s->ckpt_wanted = 1;
        pthread_cond_signal(&s->ccv);
        pthread_mutex_unlock(&s->cmu);
    }
    return SQLITE_OK;
}

static void *checkpointer_main(void *arg)
{
    struct sq *s = arg;
    pthread_setname_np(pthread_self(), "store-ckpt");
    pthread_mutex_lock(&s->cmu);
    for (;;) {
        while (!s->ckpt_wanted && !s->ckpt_stop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += 1;
            pthread_cond_timedwait(&s->ccv, &s->cmu, &ts);
            if (!s->ckpt_wanted)
                break; /* a periodic passive checkpoint keeps the WAL short */
        }
        if (s->ckpt_stop)
            break;
        s->ckpt_wanted = 0;
        atomic_store(&s->ckpt_busy, 1);
        pthread_mutex_unlock(&s->cmu);
        FAULT("store.checkpoint"); /* with sleep: a checkpointer starved of CPU or disk */
        int log = 0, done = 0;
        int rc =
            sqlite3_wal_checkpoint_v2(s->ckpt.db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
        if (rc != SQLITE_OK && rc != SQLITE_BUSY)
            log_warn("store.checkpoint", "checkpoint failed: %s", sqlite3_errmsg(s->ckpt.db));
        if (rc == SQLITE_OK)
            atomic_store(&s->ckpt_catchup, 1);
        pthread_mutex_lock(&s->cmu);
        atomic_store(&s->ckpt_busy, 0);
        pthread_cond_broadcast(&s->ccv_idle);
    }
    pthread_mutex_unlock(&s->cmu);
    return NULL;
}

/* In the writer's thread, between batches: the frames committed while the
 * checkpointer ran (a few batches' worth). */
static void ckpt_catch_up(struct sq *s)
{
    int log = 0, done = 0;
    int rc = sqlite3_wal_checkpoint_v2(s->writer.db, NULL, SQLITE_CHECKPOINT_PASSIVE, &log, &done);
    if (rc != SQLITE_OK && rc != SQLITE_BUSY)
        log_warn("store.checkpoint", "catch-up checkpoint failed: %s",
                 sqlite3_errmsg(s->writer.db));
}

/* In the writer's thread, between batches, when the WAL outgrew
 * CKPT_HOLD_FRAMES: no batch runs until the WAL is copied back (all of it
 * but what a reader still uses), so the next transaction can rewind it. */
static void ckpt_hold_back(struct sq *s)
{
    pthread_mutex_lock(&s->cmu);
    while (atomic_load(&s->ckpt_busy))
        pthread_cond_wait(&s->ccv_idle, &s->cmu);
    pthread_mutex_unlock(&s->cmu);
    atomic_store(&s->ckpt_catchup, 0);
    ckpt_catch_up(s);
    s->wal_frames = 0; /* once per commit that finds the WAL long */
}

static void *writer_main(void *arg)
{
    struct sq *s = arg;
    pthread_setname_np(pthread_self(), "store-writer");
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stopping)
            pthread_cond_wait(&s->cv_work, &s->mu);
        if (!s->head)
            break;
        struct job *batch = s->head;
        s->head = s->tail = NULL;
        pthread_mutex_unlock(&s->mu);
        run_batch(s, batch);
        for (struct job *j = batch, *n; j; j = n) {
            n = j->next; /* the waiter may free j once it is posted */
            if (j->fin)
                j->fin(j);
            else
                sem_post(&j->done);
        }
        if (s->wal_frames >= CKPT_HOLD_FRAMES)
            ckpt_hold_back(s);
        else if (atomic_exchange(&s->ckpt_catchup, 0))
            ckpt_catch_up(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Appends the chain first..last to the next batch and wakes the writer;
 * IFL_EBUSY (nothing queued) once the store is closing. */
static int enqueue(struct sq *s, struct job *first, struct job *last)
{
    pthread_mutex_lock(&s->mu);
    int stopping = s->stopping;
    if (!stopping) {
        if (s->tail)
            s->tail->next = first;
        else
            s->head = first;
        s->tail = last;
        pthread_cond_signal(&s->cv_work);
    }
    pthread_mutex_unlock(&s->mu);
    return stopping ? IFL_EBUSY : 0;
}

/* Queues n jobs for the next batch (in order, atomically) and waits until
 * the batch holding them committed.  Each job has its own semaphore, so a
 * commit wakes exactly its own callers. */
static void write_jobs(struct sq *s, struct job *jobs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        sem_init(&jobs[i].done, 0, 0);
        jobs[i].next = i + 1 < n ? &jobs[i + 1] : NULL;
    }
    if (enqueue(s, &jobs[0], &jobs[n - 1])) {
        for (size_t i = 0; i < n; i++) {
            jobs[i].rc = err_set(&jobs[i].err, IFL_EBUSY, "store is closing");
            sem_destroy(&jobs[i].done);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        while (sem_wait(&jobs[i].done) != 0)
            ;
        sem_destroy(&jobs[i].done);
    }
}

/* Queues fn to run in the next batch and waits until that batch committed. */
static int write_job(struct sq *s, int (*fn)(struct conn *, void *, struct ifl_err *), void *arg,
                     struct ifl_err *e)
{
    struct job j = {.fn = fn, .arg = arg};
    write_jobs(s, &j, 1);
    if (j.rc && e)
        *e = j.err;
    return j.rc;
}

static void ckpt_stop(struct sq *s)
{
    if (!s->ckpt_running)
        return;
    pthread_mutex_lock(&s->cmu);
    s->ckpt_stop = 1;
    pthread_cond_signal(&s->ccv);
    pthread_mutex_unlock(&s->cmu);
    pthread_join(s->ckpt_thread, NULL);
    s->ckpt_running = 0;
}

/* ---- column helpers --------------------------------------------------------- */

static char *col_str(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? xstrndup((const char *)t, (size_t)sqlite3_column_bytes(st, i)) : NULL;
}

static void col_copy(sqlite3_stmt *st, int i, char *out, size_t cap)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    size_t n = t ? (size_t)sqlite3_column_bytes(st, i) : 0;
    if (n >= cap)
        n = cap - 1;
    if (n)
        memcpy(out, t, n);
    out[n] = '\0';
}

static void bind_text(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, i);
}

/* ---- schema ------------------------------------------------------------------ */

/* The id filter: sized at open from the largest seq (instant: the rowid),
 * filled by a thread of its own from an index-only scan of the ids (half a
 * second per million executions here), so opening does not wait for it.  Until
 * the scan is done every lookup reads; the writer adds each id it inserts
 * from the start, so when the scan ends the filter holds every id. */
static void *ids_main(void *arg)
{
    struct sq *s = arg;
    pthread_setname_np(pthread_self(), "store-ids");
    struct conn c = {0};
    sqlite3_stmt *st = NULL;
    struct ifl_err e = {0};
    int r = SQLITE_ERROR;
    int64_t t0 = clock_mono_ms(), n = 0;
    if (conn_open(&c, s->path, 1, &e) == 0 &&
        sqlite3_prepare_v2(c.db, "SELECT id FROM executions", -1, &st, NULL) == SQLITE_OK) {
        while (!atomic_load(&s->ids_stop) && (r = sqlite3_step(st)) == SQLITE_ROW) {
            idset_add(s->ids, (const char *)sqlite3_column_text(st, 0));
            n++;
        }
    }
    sqlite3_finalize(st);
    if (r == SQLITE_DONE) {
        atomic_store(&s->ids_ready, 1);
        log_info("store.ids_ready", "id filter ready: %lld executions in %lld ms", (long long)n,
                 (long long)(clock_mono_ms() - t0));
    } else if (!atomic_load(&s->ids_stop))
        log_warn("store.ids", "cannot read the execution ids (%s); every lookup reads",
                 e.msg[0] ? e.msg : (c.db ? sqlite3_errmsg(c.db) : "?"));
    conn_close(&c);
    return NULL;
}

static int ids_start(struct sq *s, struct ifl_err *e)
{
    sqlite3_stmt *st = NULL;
    int64_t n = 0;
    if (sqlite3_prepare_v2(s->writer.db, "SELECT max(seq) FROM executions", -1, &st, NULL) !=
        SQLITE_OK)
        return db_err(&s->writer, e, "ids");
    if (sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    s->ids = idset_new((size_t)n + 1000000);
    if (pthread_create(&s->ids_thread, NULL, ids_main, s) != 0)
        return err_set(e, IFL_EIO, "cannot start the id filter thread");
    s->ids_running = 1;
    return 0;
}

static void ids_stop(struct sq *s)
{
    if (!s->ids_running)
        return;
    atomic_store(&s->ids_stop, 1);
    pthread_join(s->ids_thread, NULL);
    s->ids_running = 0;
}

static int migrate(struct sq *s, struct ifl_err *e)
{
    struct conn *c = &s->writer;
    int rc = exec(c,
                  "CREATE TABLE IF NOT EXISTS schema_migrations ("
                  " version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)",
                  e);
    if (rc)
        return rc;
    sqlite3_stmt *vs = NULL;
    if (sqlite3_prepare_v2(c->db, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations", -1,
                           &vs, NULL) != SQLITE_OK)
        return db_err(c, e, "migrate");
    int newest = sqlite3_step(vs) == SQLITE_ROW ? sqlite3_column_int(vs, 0) : 0;
    sqlite3_finalize(vs);
    if ((rc = store_schema_newer(newest, e)))
        return rc;
    for (int i = 0; i < store_migrations_count; i++) {
        const struct store_migration *m = &store_migrations[i];
        if ((rc = exec(c, "BEGIN IMMEDIATE", e)))
            return rc;
        sqlite3_stmt *st = NULL;
        int have = 0;
        if (sqlite3_prepare_v2(c->db, "SELECT 1 FROM schema_migrations WHERE version = ?", -1, &st,
                               NULL) != SQLITE_OK) {
            rc = db_err(c, e, "migrate");
            goto fail;
        }
        sqlite3_bind_int(st, 1, m->version);
        have = sqlite3_step(st) == SQLITE_ROW;
        sqlite3_finalize(st);
        if (!have) {
            if ((rc = exec(c, m->sql, e)))
                goto fail;
            if (sqlite3_prepare_v2(c->db,
                                   "INSERT INTO schema_migrations (version, applied_at)"
                                   " VALUES (?, ?)",
                                   -1, &st, NULL) != SQLITE_OK) {
                rc = db_err(c, e, "migrate");
                goto fail;
            }
            sqlite3_bind_int(st, 1, m->version);
            sqlite3_bind_int64(st, 2, clock_now_ms());
            int sr = sqlite3_step(st);
            sqlite3_finalize(st);
            if (sr != SQLITE_DONE) {
                rc = db_err(c, e, "migrate");
                goto fail;
            }
            log_info("store.migrated", "applied schema migration %d", m->version);
        }
        if ((rc = exec(c, "COMMIT", e)))
            goto fail;
    }
    return 0;
fail:
    exec(c, "ROLLBACK", NULL);
    return rc;
}

static int op_schema_version(struct store *base, int *version, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    struct conn *c = reader_get(s, e);
    if (!c)
        return IFL_ESTORE;
    static const char sql[] = "SELECT COALESCE(MAX(version), 0) FROM schema_migrations";
    int rc = 0;
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st) {
        rc = IFL_ESTORE;
    } else {
        if (sqlite3_step(st) == SQLITE_ROW)
            *version = sqlite3_column_int(st, 0);
        else
            rc = db_err(c, e, "schema_version");
        done_stmt(st);
    }
    reader_put(s, c);
    return rc;
}

static int op_ping(struct store *base, struct ifl_err *e)
{
    int v;
    return op_schema_version(base, &v, e);
}

/* ---- workspaces ---------------------------------------------------------------- */

struct ws_put {
    const char *ws, *settings;
    int created;
};

static int job_ws_put(struct conn *c, void *arg, struct ifl_err *e)
{
    struct ws_put *a = arg;
    static const char sql[] = "INSERT INTO workspaces (name, settings, created_at) VALUES (?, ?, ?)"
                              " ON CONFLICT (name) DO NOTHING";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, a->ws);
    bind_text(st, 2, a->settings);
    sqlite3_bind_int64(st, 3, clock_now_ms());
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "workspace_put");
    done_stmt(st);
    a->created = sqlite3_changes(c->db) == 1;
    return rc;
}

static int op_workspace_put(struct store *base, const char *ws, const char *settings, int *created,
                            struct ifl_err *e)
{
    struct ws_put a = {ws, settings, 0};
    int rc = write_job((struct sq *)base, job_ws_put, &a, e);
    *created = a.created;
    return rc;
}

/* Runs a single-row existence query with one text parameter... generalised
 * over up to three text parameters. */
static int read_exists(struct sq *s, const char *sql, const char *p1, const char *p2,
                       struct ifl_err *e)
{
    struct conn *c = reader_get(s, e);
    if (!c)
        return IFL_ESTORE;
    int rc;
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st) {
        rc = IFL_ESTORE;
    } else {
        bind_text(st, 1, p1);
        if (p2)
            bind_text(st, 2, p2);
        int r = sqlite3_step(st);
        rc = r == SQLITE_ROW ? 0 : r == SQLITE_DONE ? IFL_ENOTFOUND : db_err(c, e, "read");
        done_stmt(st);
    }
    reader_put(s, c);
    return rc;
}

static const char sql_ws_exists[] = "SELECT 1 FROM workspaces WHERE name = ?";

static int op_workspace_exists(struct store *base, const char *ws, struct ifl_err *e)
{
    int rc = read_exists((struct sq *)base, sql_ws_exists, ws, NULL, e);
    if (rc == IFL_ENOTFOUND)
        err_set(e, rc, "workspace '%s' does not exist", ws);
    return rc;
}

/* ---- workflows ------------------------------------------------------------------ */

/* A workflow's latest version (op_workflow_get; job_wf_put's `same`). */
static const char sql_wf_latest[] =
    "SELECT version, definition, created_at FROM workflows WHERE workspace = ? AND name = ?"
    " ORDER BY version DESC LIMIT 1";

struct wf_put {
    const char *ws, *wf, *def;
    int (*same)(const char *latest, void *arg);
    void *arg;
    int version, stored;
};

static int job_wf_put(struct conn *c, void *arg, struct ifl_err *e)
{
    struct wf_put *a = arg;
    sqlite3_stmt *st = stmt(c, sql_ws_exists, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, a->ws);
    int r = sqlite3_step(st);
    done_stmt(st);
    if (r == SQLITE_DONE)
        return err_set(e, IFL_ENOTFOUND, "workspace '%s' does not exist", a->ws);
    if (r != SQLITE_ROW)
        return db_err(c, e, "workflow_put");
    a->stored = 0;
    if (a->same) { /* on the writer: no other put comes between */
        if (!(st = stmt(c, sql_wf_latest, e)))
            return IFL_ESTORE;
        bind_text(st, 1, a->ws);
        bind_text(st, 2, a->wf);
        int same = 0;
        if ((r = sqlite3_step(st)) == SQLITE_ROW &&
            a->same((const char *)sqlite3_column_text(st, 1), a->arg)) {
            same = 1;
            a->version = sqlite3_column_int(st, 0);
        }
        done_stmt(st);
        if (r != SQLITE_ROW && r != SQLITE_DONE)
            return db_err(c, e, "workflow_put");
        if (same)
            return 0;
    }
    static const char sql[] =
        "INSERT INTO workflows (workspace, name, version, definition, created_at)"
        " SELECT ?1, ?2, COALESCE(MAX(version), 0) + 1, ?3, ?4 FROM workflows"
        " WHERE workspace = ?1 AND name = ?2 RETURNING version";
    if (!(st = stmt(c, sql, e)))
        return IFL_ESTORE;
    bind_text(st, 1, a->ws);
    bind_text(st, 2, a->wf);
    bind_text(st, 3, a->def);
    sqlite3_bind_int64(st, 4, clock_now_ms());
    int rc = 0;
    if (sqlite3_step(st) == SQLITE_ROW) {
        a->version = sqlite3_column_int(st, 0);
        a->stored = 1;
    } else {
        rc = db_err(c, e, "workflow_put");
    }
    while (rc == 0 && sqlite3_step(st) == SQLITE_ROW)
        ;
    done_stmt(st);
    return rc;
}

static int op_workflow_put(struct store *base, const char *ws, const char *wf, const char *def,
                           int (*same)(const char *latest, void *arg), void *arg, int *version,
                           int *stored, struct ifl_err *e)
{
    struct wf_put a = {ws, wf, def, same, arg, 0, 0};
    int rc = write_job((struct sq *)base, job_wf_put, &a, e);
    *version = a.version;
    *stored = rc ? 0 : a.stored;
    return rc;
}

static int op_workflow_get(struct store *base, const char *ws, const char *wf, int version,
                           struct store_workflow *out, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    static const char sql_version[] =
        "SELECT version, definition, created_at FROM workflows WHERE workspace = ? AND name = ?"
        " AND version = ?";
    struct conn *c = reader_get(s, e);
    if (!c)
        return IFL_ESTORE;
    int rc = 0;
    sqlite3_stmt *st = stmt(c, version ? sql_version : sql_wf_latest, e);
    if (!st) {
        rc = IFL_ESTORE;
        goto out;
    }
    bind_text(st, 1, ws);
    bind_text(st, 2, wf);
    if (version)
        sqlite3_bind_int(st, 3, version);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        out->workspace = xstrdup(ws);
        out->name = xstrdup(wf);
        out->version = sqlite3_column_int(st, 0);
        out->definition = col_str(st, 1);
        out->created_at = sqlite3_column_int64(st, 2);
    } else if (r == SQLITE_DONE) {
        rc = version ? err_set(e, IFL_ENOTFOUND, "workflow '%s' has no version %d", wf, version)
                     : err_set(e, IFL_ENOTFOUND, "workflow '%s' does not exist", wf);
    } else {
        rc = db_err(c, e, "workflow_get");
    }
    done_stmt(st);
out:
    reader_put(s, c);
    return rc;
}

/* ---- secrets ---------------------------------------------------------------------- */

struct secret_put {
    const char *ws, *name, *sealed, *same;
};

/* One writer: the value replaced is the one the retire reads. */
static int job_secret_put(struct conn *c, void *arg, struct ifl_err *e)
{
    struct secret_put *a = arg;
    static const char retire[] =
        "INSERT INTO secrets_retired (workspace, name, sealed, retired_at)"
        " SELECT workspace, name, sealed, ?3 FROM secrets"
        " WHERE workspace = ?1 AND name = ?2 AND sealed <> ?4 AND sealed IS NOT ?5";
    static const char trim[] = "DELETE FROM secrets_retired WHERE workspace = ?1 AND seq <="
                               " (SELECT seq FROM secrets_retired WHERE workspace = ?1"
                               " ORDER BY seq DESC LIMIT 1 OFFSET ?2)";
    static const char put[] =
        "INSERT INTO secrets (workspace, name, sealed, updated_at) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (workspace, name) DO UPDATE SET sealed = excluded.sealed,"
        " updated_at = excluded.updated_at";
    int64_t now = clock_now_ms();
    sqlite3_stmt *st;
    int rc = 0;
    if (!(st = stmt(c, retire, e)))
        return IFL_ESTORE;
    bind_text(st, 1, a->ws);
    bind_text(st, 2, a->name);
    sqlite3_bind_int64(st, 3, now);
    bind_text(st, 4, a->sealed);
    bind_text(st, 5, a->same);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "secret_retire");
    done_stmt(st);
    if (!rc && sqlite3_changes(c->db) > 0) {
        if (!(st = stmt(c, trim, e)))
            return IFL_ESTORE;
        bind_text(st, 1, a->ws);
        sqlite3_bind_int(st, 2, STORE_SECRETS_RETIRED);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "secret_trim");
        done_stmt(st);
    }
    if (rc)
        return rc;
    if (!(st = stmt(c, put, e)))
        return IFL_ESTORE;
    bind_text(st, 1, a->ws);
    bind_text(st, 2, a->name);
    bind_text(st, 3, a->sealed);
    sqlite3_bind_int64(st, 4, now);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "secret_put");
    done_stmt(st);
    return rc;
}

static int op_secret_put(struct store *base, const char *ws, const char *name, const char *sealed,
                         const char *same, struct ifl_err *e)
{
    struct secret_put a = {ws, name, sealed, same};
    return write_job((struct sq *)base, job_secret_put, &a, e);
}

static int op_secret_get(struct store *base, const char *ws, const char *name, char **sealed,
                         struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    static const char sql[] = "SELECT sealed FROM secrets WHERE workspace = ? AND name = ?";
    struct conn *c = reader_get(s, e);
    if (!c)
        return IFL_ESTORE;
    int rc = 0;
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st) {
        rc = IFL_ESTORE;
    } else {
        bind_text(st, 1, ws);
        bind_text(st, 2, name);
        int r = sqlite3_step(st);
        if (r == SQLITE_ROW)
            *sealed = col_str(st, 0);
        else if (r == SQLITE_DONE)
            rc = err_set(e, IFL_ENOTFOUND, "secret '%s' does not exist", name);
        else
            rc = db_err(c, e, "secret_get");
        done_stmt(st);
    }
    reader_put(s, c);
    return rc;
}

static int secret_rows(struct store *base, const char *sql, const char *ws, char ***names,
                       char ***sealed, size_t *n, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    struct conn *c;
    sqlite3_stmt *st = read_begin(s, sql, &c, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, ws);
    size_t cap = 0, scap = 0;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if (sealed) {
            *sealed = store_grow(*sealed, *n, &scap, sizeof **sealed);
            (*sealed)[*n] = col_str(st, 1);
        }
        *names = store_grow(*names, *n, &cap, sizeof **names);
        (*names)[(*n)++] = col_str(st, 0);
    }
    int rc = r == SQLITE_DONE ? 0 : db_err(c, e, "secret_list");
    read_end(s, c, st);
    return rc;
}

static int op_secret_list(struct store *base, const char *ws, char ***names, char ***sealed,
                          size_t *n, struct ifl_err *e)
{
    return secret_rows(base, "SELECT name, sealed FROM secrets WHERE workspace = ? ORDER BY name",
                       ws, names, sealed, n, e);
}

static int op_secret_retired(struct store *base, const char *ws, char ***names, char ***sealed,
                             size_t *n, struct ifl_err *e)
{
    return secret_rows(base,
                       "SELECT name, sealed FROM secrets_retired WHERE workspace = ?"
                       " ORDER BY seq DESC",
                       ws, names, sealed, n, e);
}

/* ---- executions -------------------------------------------------------------------- */

#define EXEC_COLS                                                                                  \
    "id, workspace, workflow, workflow_version, entry_point, identity, payload,"                   \
    " payload_hash, test, status, version, created_at, updated_at, started_over_from"

static void read_execution(sqlite3_stmt *st, struct store_execution *x)
{
    col_copy(st, 0, x->id, sizeof x->id);
    x->workspace = col_str(st, 1);
    x->workflow = col_str(st, 2);
    x->workflow_version = sqlite3_column_int(st, 3);
    x->entry_point = col_str(st, 4);
    x->identity = col_str(st, 5);
    x->payload = col_str(st, 6);
    col_copy(st, 7, x->payload_hash, sizeof x->payload_hash);
    x->test = sqlite3_column_int(st, 8);
    x->status = col_str(st, 9);
    x->version = sqlite3_column_int64(st, 10);
    x->created_at = sqlite3_column_int64(st, 11);
    x->updated_at = sqlite3_column_int64(st, 12);
    x->started_over_from = col_str(st, 13);
}

/* Both also read seq (column 14): the transaction's one costs nothing more. */
static const char sql_exec_get[] =
    "SELECT " EXEC_COLS ", seq FROM executions WHERE id = ? AND workspace = ?";

/* Reads one execution on connection c, and its seq when seq is not NULL. */
static int exec_get(struct conn *c, const char *ws, const char *id, struct store_execution *out,
                    int64_t *seq, struct ifl_err *e)
{
    sqlite3_stmt *st = stmt(c, sql_exec_get, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, id);
    bind_text(st, 2, ws);
    int rc = 0, r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        read_execution(st, out);
        if (seq)
            *seq = sqlite3_column_int64(st, 14);
    } else if (r == SQLITE_DONE)
        rc = err_set(e, IFL_ENOTFOUND, "execution '%s' does not exist", id);
    else
        rc = db_err(c, e, "execution_get");
    done_stmt(st);
    return rc;
}

static int op_execution_get(struct store *base, const char *ws, const char *id,
                            struct store_execution *out, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    if (atomic_load(&s->ids_ready) && !idset_maybe(s->ids, id))
        return err_set(e, IFL_ENOTFOUND, "execution '%s' does not exist", id);
    struct conn *c = reader_get(s, e);
    if (!c)
        return IFL_ESTORE;
    int rc = exec_get(c, ws, id, out, NULL, e);
    reader_put(s, c);
    return rc;
}

/* A rare status walks its partial index (STORE_EXEC_RARE_OR: the predicate
 * repeated so that the planner can prove the index applies), not every
 * execution of the workspace.  Not static: test_store checks its plan. */
const char store_sqlite_list_rare[] =
    "SELECT " EXEC_COLS " FROM executions WHERE workspace = ?1 AND status = ?5"
    " AND " STORE_EXEC_RARE_OR " AND (created_at, id) < (?2, ?3)"
    " AND (?6 IS NULL OR workflow = ?6)"
    " ORDER BY created_at DESC, id DESC LIMIT ?4";

static int op_execution_list(struct store *base, const char *ws, const struct store_exec_filter *f,
                             int64_t after_ts, const char *after_id, int limit,
                             struct store_execution **items, size_t *n, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    static const char sql[] =
        "SELECT " EXEC_COLS " FROM executions WHERE workspace = ?1 AND status <> 'purged'"
        " AND (created_at, id) < (?2, ?3)"
        " AND (?5 IS NULL OR status = ?5) AND (?6 IS NULL OR workflow = ?6)"
        " ORDER BY created_at DESC, id DESC LIMIT ?4";
    struct conn *c;
    sqlite3_stmt *st =
        read_begin(s, store_execution_status_rare(f->status) ? store_sqlite_list_rare : sql, &c, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, ws);
    sqlite3_bind_int64(st, 2, after_ts);
    bind_text(st, 3, after_id);
    sqlite3_bind_int(st, 4, limit);
    bind_text(st, 5, f->status);
    bind_text(st, 6, f->workflow);
    *items = xcalloc((size_t)limit, sizeof **items);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW && *n < (size_t)limit)
        read_execution(st, &(*items)[(*n)++]);
    int rc = r == SQLITE_ROW || r == SQLITE_DONE ? 0 : db_err(c, e, "execution_list");
    read_end(s, c, st);
    return rc;
}

/* ---- transactions ------------------------------------------------------------------ */

#define EV_ROWS 4 /* events a statement inserts, at most */

struct sq_tx {
    struct store_tx base;
    struct conn *c;
    /* The last execution this transaction named, and its seq: the key of its
     * steps and attempts.  Looked up once, not by a subquery on the random id
     * index in every statement (about ten a GATEWAY execution). */
    char seq_id[65];
    int64_t seq;
    /* Appended events not yet inserted: they go in by EV_ROWS in one
     * statement (tx_events_flush), at the latest when the transaction's
     * function returns. */
    struct pending_ev {
        char id[65], execution_id[65];
        char *workspace, *type, *data; /* owned */
        int64_t aggregate_version, created_at;
    } ev[EV_ROWS];
    int nev;
};

static int tx_events_flush(struct sq_tx *t, struct ifl_err *e);

static void tx_events_drop(struct sq_tx *t)
{
    for (int i = 0; i < t->nev; i++) {
        free(t->ev[i].workspace);
        free(t->ev[i].type);
        free(t->ev[i].data);
    }
    t->nev = 0;
}

static struct conn *txc(struct store_tx *tx)
{
    return ((struct sq_tx *)tx)->c;
}

static void tx_seq_remember(struct store_tx *tx, const char *id, int64_t seq)
{
    struct sq_tx *t = (struct sq_tx *)tx;
    snprintf(t->seq_id, sizeof t->seq_id, "%s", id);
    t->seq = seq;
}

/* The seq of execution id in *seq, 0 when there is none. */
static int tx_seq(struct store_tx *tx, const char *id, int64_t *seq, struct ifl_err *e)
{
    struct sq_tx *t = (struct sq_tx *)tx;
    if (t->seq_id[0] && strcmp(t->seq_id, id) == 0) {
        *seq = t->seq;
        return 0;
    }
    *seq = 0;
    static const char sql[] = "SELECT seq FROM executions WHERE id = ?";
    sqlite3_stmt *st = stmt(t->c, sql, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, id);
    int r = sqlite3_step(st), rc = 0;
    if (r == SQLITE_ROW) {
        *seq = sqlite3_column_int64(st, 0);
        tx_seq_remember(tx, id, *seq);
    } else if (r != SQLITE_DONE) {
        rc = db_err(t->c, e, "execution_seq");
    }
    done_stmt(st);
    return rc;
}

struct tx_job {
    struct store *s;
    store_tx_fn fn;
    void *arg;
};

static int job_tx(struct conn *c, void *arg, struct ifl_err *e)
{
    struct tx_job *j = arg;
    struct sq_tx tx = {.base = {j->s}, .c = c};
    int rc = j->fn(&tx.base, j->arg, e);
    if (!rc)
        rc = tx_events_flush(&tx, e);
    tx_events_drop(&tx);
    return rc;
}

static int op_tx_run(struct store *base, store_tx_fn fn, void *arg, struct ifl_err *e)
{
    struct tx_job j = {base, fn, arg};
    return write_job((struct sq *)base, job_tx, &j, e);
}

/* A submitted transaction: queued like any job, its caller called back. */
struct submitted {
    struct job j; /* first: the writer hands fin a struct job * */
    struct tx_job tj;
    store_done_fn done;
    void *done_arg;
};

static void submitted_fin(struct job *j)
{
    struct submitted *sj = (struct submitted *)j;
    sj->done(sj->done_arg, j->rc, &j->err);
    free(sj);
}

static int op_tx_submit(struct store *base, store_tx_fn fn, void *arg, store_done_fn done,
                        void *done_arg)
{
    struct sq *s = (struct sq *)base;
    struct submitted *sj = xcalloc(1, sizeof *sj);
    sj->tj = (struct tx_job){base, fn, arg};
    sj->j.fn = job_tx;
    sj->j.arg = &sj->tj;
    sj->j.fin = submitted_fin;
    sj->done = done;
    sj->done_arg = done_arg;
    int rc = enqueue(s, &sj->j, &sj->j);
    if (rc)
        free(sj);
    return rc;
}

/* n transactions in one batch (one fsync), each in its own savepoint. */
static void op_tx_run_many(struct store *base, store_tx_fn fn, void **args, size_t n, int *rcs,
                           struct ifl_err *errs)
{
    struct tx_job *tj = xcalloc(n, sizeof *tj);
    struct job *jobs = xcalloc(n, sizeof *jobs);
    for (size_t i = 0; i < n; i++) {
        tj[i] = (struct tx_job){base, fn, args[i]};
        jobs[i].fn = job_tx;
        jobs[i].arg = &tj[i];
    }
    write_jobs((struct sq *)base, jobs, n);
    for (size_t i = 0; i < n; i++) {
        rcs[i] = jobs[i].rc;
        if (errs)
            errs[i] = jobs[i].err;
    }
    free(jobs);
    free(tj);
}

static int tx_execution_get(struct store_tx *tx, const char *ws, const char *id,
                            struct store_execution *out, struct ifl_err *e)
{
    int64_t seq = 0;
    int rc = exec_get(txc(tx), ws, id, out, &seq, e);
    if (!rc)
        tx_seq_remember(tx, id, seq);
    return rc;
}

static int tx_execution_insert(struct store_tx *tx, const struct store_execution *x, int *created,
                               struct ifl_err *e)
{
    struct conn *c = txc(tx);
    idset_add(((struct sq *)tx->s)->ids, x->id); /* before it can commit */
    static const char sql[] = "INSERT INTO executions (" EXEC_COLS ")"
                              " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                              " ON CONFLICT (id) DO NOTHING";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    int64_t now = clock_now_ms();
    bind_text(st, 1, x->id);
    bind_text(st, 2, x->workspace);
    bind_text(st, 3, x->workflow);
    sqlite3_bind_int(st, 4, x->workflow_version);
    bind_text(st, 5, x->entry_point);
    bind_text(st, 6, x->identity);
    bind_text(st, 7, x->payload);
    bind_text(st, 8, x->payload_hash);
    sqlite3_bind_int(st, 9, x->test);
    bind_text(st, 10, x->status ? x->status : "running");
    sqlite3_bind_int64(st, 11, x->version);
    sqlite3_bind_int64(st, 12, now);
    sqlite3_bind_int64(st, 13, now);
    bind_text(st, 14, x->started_over_from);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "execution_insert");
    done_stmt(st);
    if (!rc)
        *created = sqlite3_changes(c->db) == 1;
    if (!rc && *created)
        tx_seq_remember(tx, x->id, sqlite3_last_insert_rowid(c->db));
    return rc;
}

static int tx_execution_set_status(struct store_tx *tx, const char *id, const char *status,
                                   int64_t version, struct ifl_err *e)
{
    struct conn *c = txc(tx);
    int64_t seq;
    int rc = tx_seq(tx, id, &seq, e);
    if (rc || !seq)
        return rc;
    static const char sql[] = "UPDATE executions SET status = ?1, updated_at = ?2,"
                              " version = CASE WHEN ?4 > 0 THEN ?4 ELSE version END WHERE seq = ?3";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, status);
    sqlite3_bind_int64(st, 2, clock_now_ms());
    sqlite3_bind_int64(st, 3, seq);
    sqlite3_bind_int64(st, 4, version);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "execution_set_status");
    done_stmt(st);
    return rc;
}

static int tx_execution_started_over(struct store_tx *tx, const char *ws, const char *id,
                                     const char *new_id, char **was, struct ifl_err *e)
{
    struct conn *c = txc(tx);
    static const char get[] =
        "SELECT started_over_to FROM executions WHERE id = ?1 AND workspace = ?2";
    sqlite3_stmt *st = stmt(c, get, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, id);
    bind_text(st, 2, ws);
    int r = sqlite3_step(st), rc = 0;
    if (r == SQLITE_ROW)
        *was = col_str(st, 0);
    else if (r == SQLITE_DONE)
        rc = err_set(e, IFL_ENOTFOUND, "execution %s not found", id);
    else
        rc = db_err(c, e, "execution_started_over");
    done_stmt(st);
    if (rc || !new_id)
        return rc;
    static const char set[] = "UPDATE executions SET started_over_to = ?1, updated_at = ?2"
                              " WHERE id = ?3 AND workspace = ?4";
    if (!(st = stmt(c, set, e)))
        return IFL_ESTORE;
    bind_text(st, 1, new_id);
    sqlite3_bind_int64(st, 2, clock_now_ms());
    bind_text(st, 3, id);
    bind_text(st, 4, ws);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "execution_started_over");
    done_stmt(st);
    return rc;
}

#define STEP_COLS                                                                                  \
    "execution_id, vertex, workspace, kind, state, attempts, epoch, lease_owner,"                  \
    " lease_expires_at, next_run_at, in_decided, in_taken, output, error, updated_at"

static void read_step(sqlite3_stmt *st, struct store_step *x)
{
    col_copy(st, 0, x->execution_id, sizeof x->execution_id);
    x->vertex = col_str(st, 1);
    x->workspace = col_str(st, 2);
    x->kind = col_str(st, 3);
    const unsigned char *state = sqlite3_column_text(st, 4);
    int parsed = store_step_state_parse((const char *)state);
    x->state = parsed < 0 ? STEP_FAILED : (enum step_state)parsed;
    x->attempts = sqlite3_column_int(st, 5);
    x->epoch = sqlite3_column_int64(st, 6);
    x->lease_owner = col_str(st, 7);
    x->lease_expires_at = sqlite3_column_int64(st, 8);
    x->next_run_at = sqlite3_column_int64(st, 9);
    x->in_decided = sqlite3_column_int(st, 10);
    x->in_taken = sqlite3_column_int(st, 11);
    x->output = col_str(st, 12);
    x->error = col_str(st, 13);
    x->updated_at = sqlite3_column_int64(st, 14);
}

/* Runs a step query (parameters bound by the caller) and collects rows. */
static int collect_steps(struct conn *c, sqlite3_stmt *st, struct store_step **items, size_t *n,
                         struct ifl_err *e)
{
    size_t cap = 0;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        *items = store_grow(*items, *n, &cap, sizeof **items);
        memset(&(*items)[*n], 0, sizeof **items);
        read_step(st, &(*items)[(*n)++]);
    }
    int rc = r == SQLITE_DONE ? 0 : db_err(c, e, "steps");
    done_stmt(st);
    return rc;
}

static const char sql_steps_of[] =
    "SELECT " STEP_COLS
    " FROM steps WHERE execution_seq = (SELECT seq FROM executions WHERE id = ?) ORDER BY vertex";

static int steps_of(struct conn *c, const char *id, struct store_step **items, size_t *n,
                    struct ifl_err *e)
{
    sqlite3_stmt *st = stmt(c, sql_steps_of, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, id);
    return collect_steps(c, st, items, n, e);
}

static int tx_steps_get(struct store_tx *tx, const char *execution_id, struct store_step **items,
                        size_t *n, struct ifl_err *e)
{
    int64_t seq;
    int rc = tx_seq(tx, execution_id, &seq, e);
    if (rc || !seq)
        return rc;
    static const char sql[] =
        "SELECT " STEP_COLS " FROM steps WHERE execution_seq = ? ORDER BY vertex";
    sqlite3_stmt *st = stmt(txc(tx), sql, e);
    if (!st)
        return IFL_ESTORE;
    sqlite3_bind_int64(st, 1, seq);
    return collect_steps(txc(tx), st, items, n, e);
}

/* The head of the execution (what moving its steps needs: not its payload
 * or identity, which a completion would copy out for nothing), then its
 * steps by the seq read with it. */
static int tx_execution_load(struct store_tx *tx, const char *ws, const char *id,
                             struct store_execution *x, struct store_step **items, size_t *n,
                             struct ifl_err *e)
{
    struct conn *c = txc(tx);
    static const char sql[] =
        "SELECT status, version, seq FROM executions WHERE id = ? AND workspace = ?";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, id);
    bind_text(st, 2, ws);
    int rc = 0, r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        snprintf(x->id, sizeof x->id, "%s", id);
        x->workspace = xstrdup(ws);
        x->status = col_str(st, 0);
        x->version = sqlite3_column_int64(st, 1);
        tx_seq_remember(tx, id, sqlite3_column_int64(st, 2));
    } else if (r == SQLITE_DONE) {
        rc = err_set(e, IFL_ENOTFOUND, "execution '%s' does not exist", id);
    } else {
        rc = db_err(c, e, "execution_load");
    }
    done_stmt(st);
    if (!rc && (rc = tx_steps_get(tx, id, items, n, e)))
        store_execution_clear(x);
    return rc;
}

/* Binds the mutable columns of x as parameters k+1 .. k+11. */
static void bind_step_mutables(sqlite3_stmt *st, int k, const struct store_step *x, int64_t now)
{
    bind_text(st, k + 1, store_step_state_name(x->state));
    sqlite3_bind_int(st, k + 2, x->attempts);
    sqlite3_bind_int64(st, k + 3, x->epoch);
    bind_text(st, k + 4, x->lease_owner);
    sqlite3_bind_int64(st, k + 5, x->lease_expires_at);
    sqlite3_bind_int64(st, k + 6, x->next_run_at);
    sqlite3_bind_int(st, k + 7, x->in_decided);
    sqlite3_bind_int(st, k + 8, x->in_taken);
    bind_text(st, k + 9, x->output);
    bind_text(st, k + 10, x->error);
    sqlite3_bind_int64(st, k + 11, now);
}

/* Up to STEP_ROWS steps per INSERT (an execution's steps are created
 * together: one statement instead of one per step). */
#define STEP_ROWS 4
#define STEP_VALUES "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
#define STEP_INSERT                                                                                \
    "INSERT INTO steps (state, attempts, epoch, lease_owner, lease_expires_at, next_run_at,"       \
    " in_decided, in_taken, output, error, updated_at, execution_id, vertex, workspace, kind,"     \
    " execution_seq) VALUES " STEP_VALUES

static int tx_steps_insert(struct store_tx *tx, const struct store_step *rows, size_t n,
                           struct ifl_err *e)
{
    static const char *const sql[STEP_ROWS] = {
        STEP_INSERT,
        STEP_INSERT ", " STEP_VALUES,
        STEP_INSERT ", " STEP_VALUES ", " STEP_VALUES,
        STEP_INSERT ", " STEP_VALUES ", " STEP_VALUES ", " STEP_VALUES,
    };
    struct conn *c = txc(tx);
    int64_t now = clock_now_ms();
    for (size_t at = 0; at < n;) {
        size_t k = n - at < STEP_ROWS ? n - at : STEP_ROWS;
        sqlite3_stmt *st = stmt(c, sql[k - 1], e);
        if (!st)
            return IFL_ESTORE;
        for (size_t i = 0; i < k; i++) {
            const struct store_step *x = &rows[at + i];
            int64_t seq;
            int rc = tx_seq(tx, x->execution_id, &seq, e);
            if (rc) {
                done_stmt(st);
                return rc;
            }
            int b = 16 * (int)i;
            bind_step_mutables(st, b, x, now);
            bind_text(st, b + 12, x->execution_id);
            bind_text(st, b + 13, x->vertex);
            bind_text(st, b + 14, x->workspace);
            bind_text(st, b + 15, x->kind);
            if (seq) /* none: NULL, refused by the NOT NULL constraint */
                sqlite3_bind_int64(st, b + 16, seq);
            else
                sqlite3_bind_null(st, b + 16);
        }
        int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "step_insert");
        done_stmt(st);
        if (rc)
            return rc;
        at += k;
    }
    return 0;
}

static int tx_step_insert(struct store_tx *tx, const struct store_step *x, struct ifl_err *e)
{
    return tx_steps_insert(tx, x, 1, e);
}

static int tx_step_update(struct store_tx *tx, const struct store_step *x,
                          enum step_state expect_state, int64_t expect_epoch, int *changed,
                          struct ifl_err *e)
{
    struct conn *c = txc(tx);
    int64_t seq;
    int rc = tx_seq(tx, x->execution_id, &seq, e);
    *changed = 0;
    if (rc || !seq)
        return rc;
    static const char sql[] =
        "UPDATE steps SET state = ?, attempts = ?, epoch = ?, lease_owner = ?,"
        " lease_expires_at = ?, next_run_at = ?, in_decided = ?, in_taken = ?, output = ?,"
        " error = ?, updated_at = ?"
        " WHERE execution_seq = ? AND vertex = ? AND state = ? AND (? < 0 OR epoch = ?)";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    bind_step_mutables(st, 0, x, clock_now_ms());
    sqlite3_bind_int64(st, 12, seq);
    bind_text(st, 13, x->vertex);
    bind_text(st, 14, store_step_state_name(expect_state));
    sqlite3_bind_int64(st, 15, expect_epoch);
    sqlite3_bind_int64(st, 16, expect_epoch);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "step_update");
    done_stmt(st);
    if (!rc)
        *changed = sqlite3_changes(c->db) == 1;
    return rc;
}

static int tx_attempt_finish(struct store_tx *tx, const char *execution_id, const char *vertex,
                             int64_t epoch, const char *outcome, const char *error, int finish,
                             struct ifl_err *e)
{
    struct conn *c = txc(tx);
    int64_t seq;
    int rc = tx_seq(tx, execution_id, &seq, e);
    if (rc || !seq)
        return rc;
    static const char sql[] = "UPDATE step_attempts SET finished_at = ?, outcome = ?, error = ?"
                              " WHERE execution_seq = ? AND vertex = ? AND epoch = ?"
                              " AND finished_at IS NULL";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    if (finish)
        sqlite3_bind_int64(st, 1, clock_now_ms());
    else
        sqlite3_bind_null(st, 1); /* a note: still running */
    bind_text(st, 2, outcome);
    bind_text(st, 3, error);
    sqlite3_bind_int64(st, 4, seq);
    bind_text(st, 5, vertex);
    sqlite3_bind_int64(st, 6, epoch);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "attempt_finish");
    done_stmt(st);
    return rc;
}

static int tx_attempt_delete(struct store_tx *tx, const char *execution_id, const char *vertex,
                             int64_t epoch, struct ifl_err *e)
{
    struct conn *c = txc(tx);
    int64_t seq;
    int rc = tx_seq(tx, execution_id, &seq, e);
    if (rc || !seq)
        return rc;
    static const char sql[] = "DELETE FROM step_attempts"
                              " WHERE execution_seq = ? AND vertex = ? AND epoch = ?"
                              " AND finished_at IS NULL";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    sqlite3_bind_int64(st, 1, seq);
    bind_text(st, 2, vertex);
    sqlite3_bind_int64(st, 3, epoch);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "attempt_delete");
    done_stmt(st);
    return rc;
}

static int tx_attempt_record(struct store_tx *tx, const char *execution_id, const char *vertex,
                             int64_t epoch, const char *worker, const char *outcome,
                             struct ifl_err *e)
{
    struct conn *c = txc(tx);
    int64_t seq;
    int rc = tx_seq(tx, execution_id, &seq, e);
    if (rc || !seq) /* no such execution: nothing to record */
        return rc;
    static const char sql[] =
        "INSERT INTO step_attempts (execution_id, vertex, epoch, worker, started_at,"
        " finished_at, outcome, execution_seq)"
        " VALUES (?1, ?2, ?3, ?4, ?5, CASE WHEN ?6 IS NULL THEN NULL ELSE ?5 END, ?6, ?7)";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    sqlite3_bind_int64(st, 7, seq);
    bind_text(st, 1, execution_id);
    bind_text(st, 2, vertex);
    sqlite3_bind_int64(st, 3, epoch);
    bind_text(st, 4, worker);
    sqlite3_bind_int64(st, 5, clock_now_ms());
    bind_text(st, 6, outcome);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "attempt_record");
    done_stmt(st);
    return rc;
}

/* Inserts the pending events in one statement (seq is the rowid, assigned
 * in append order: no RETURNING, which costs SQLite an ephemeral table per
 * statement). */
static int tx_events_flush(struct sq_tx *t, struct ifl_err *e)
{
#define EV_VALUES "(?, ?, ?, ?, ?, ?, ?)"
#define EV_INSERT                                                                                  \
    "INSERT INTO events (id, workspace, execution_id, aggregate_version, type, data, created_at)"  \
    " VALUES " EV_VALUES
    static const char *const sql[EV_ROWS] = {
        EV_INSERT,
        EV_INSERT ", " EV_VALUES,
        EV_INSERT ", " EV_VALUES ", " EV_VALUES,
        EV_INSERT ", " EV_VALUES ", " EV_VALUES ", " EV_VALUES,
    };
    if (!t->nev)
        return 0;
    sqlite3_stmt *st = stmt(t->c, sql[t->nev - 1], e);
    if (!st)
        return IFL_ESTORE;
    for (int i = 0; i < t->nev; i++) {
        const struct pending_ev *p = &t->ev[i];
        int k = 7 * i;
        bind_text(st, k + 1, p->id);
        bind_text(st, k + 2, p->workspace);
        bind_text(st, k + 3, p->execution_id[0] ? p->execution_id : NULL);
        sqlite3_bind_int64(st, k + 4, p->aggregate_version);
        bind_text(st, k + 5, p->type);
        bind_text(st, k + 6, p->data);
        sqlite3_bind_int64(st, k + 7, p->created_at);
    }
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(t->c, e, "event_append");
    done_stmt(st);
    tx_events_drop(t);
    return rc;
}

static int tx_event_append(struct store_tx *tx, struct store_event *ev, struct ifl_err *e)
{
    struct conn *c = txc(tx);
    int rc = 0;
    if (!ev->id[0] && crypto_random_hex32(ev->id))
        return err_set(e, IFL_EIO, "random generator failed");
    ev->created_at = clock_now_ms();
    if (!ev->version_preset)
        ev->aggregate_version = 0;
    if (ev->execution_id[0] && !ev->version_preset) {
        static const char bump[] = "UPDATE executions SET version = version + 1, updated_at = ?"
                                   " WHERE id = ? RETURNING version";
        sqlite3_stmt *st = stmt(c, bump, e);
        if (!st)
            return IFL_ESTORE;
        sqlite3_bind_int64(st, 1, ev->created_at);
        bind_text(st, 2, ev->execution_id);
        if (sqlite3_step(st) == SQLITE_ROW)
            ev->aggregate_version = sqlite3_column_int64(st, 0);
        else
            rc = err_set(e, IFL_ENOTFOUND, "event for unknown execution %s", ev->execution_id);
        while (sqlite3_step(st) == SQLITE_ROW)
            ;
        done_stmt(st);
        if (rc)
            return rc;
    }
    struct sq_tx *t = (struct sq_tx *)tx;
    if (t->nev == EV_ROWS && (rc = tx_events_flush(t, e)))
        return rc;
    struct pending_ev *p = &t->ev[t->nev++];
    memcpy(p->id, ev->id, sizeof p->id);
    memcpy(p->execution_id, ev->execution_id, sizeof p->execution_id);
    p->workspace = xstrdup(ev->workspace);
    p->type = xstrdup(ev->type);
    p->data = xstrdup(ev->data ? ev->data : "{}");
    p->aggregate_version = ev->aggregate_version;
    p->created_at = ev->created_at;
    ev->seq = 0; /* deferred: the insert happens with the next ones */
    return 0;
}

static int op_idem_exists(struct store *base, const char *ws, const char *scope, const char *key,
                          int *found, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    static const char sql[] =
        "SELECT 1 FROM idempotency_keys WHERE workspace = ? AND scope = ? AND key = ?";
    struct conn *c;
    sqlite3_stmt *st = read_begin(s, sql, &c, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, ws);
    bind_text(st, 2, scope);
    bind_text(st, 3, key);
    int r = sqlite3_step(st);
    *found = r == SQLITE_ROW;
    int rc = r == SQLITE_ROW || r == SQLITE_DONE ? 0 : db_err(c, e, "idem_exists");
    read_end(s, c, st);
    return rc;
}

static int tx_idem_put(struct store_tx *tx, const char *ws, const char *scope, const char *key,
                       const struct store_idem *r, int *created, struct store_idem *existing,
                       struct ifl_err *e)
{
    struct conn *c = txc(tx);
    static const char ins[] =
        "INSERT INTO idempotency_keys (workspace, scope, key, fingerprint, status, response,"
        " created_at) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (workspace, scope, key) DO NOTHING";
    sqlite3_stmt *st = stmt(c, ins, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, ws);
    bind_text(st, 2, scope);
    bind_text(st, 3, key);
    bind_text(st, 4, r->fingerprint);
    sqlite3_bind_int(st, 5, r->status);
    bind_text(st, 6, r->response);
    sqlite3_bind_int64(st, 7, clock_now_ms());
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "idem_put");
    done_stmt(st);
    if (rc)
        return rc;
    *created = sqlite3_changes(c->db) == 1;
    if (*created || !existing)
        return 0;
    static const char sel[] = "SELECT fingerprint, status, response, created_at FROM"
                              " idempotency_keys WHERE workspace = ? AND scope = ? AND key = ?";
    if (!(st = stmt(c, sel, e)))
        return IFL_ESTORE;
    bind_text(st, 1, ws);
    bind_text(st, 2, scope);
    bind_text(st, 3, key);
    if (sqlite3_step(st) == SQLITE_ROW) {
        existing->fingerprint = col_str(st, 0);
        existing->status = sqlite3_column_int(st, 1);
        existing->response = col_str(st, 2);
        existing->created_at = sqlite3_column_int64(st, 3);
    } else {
        rc = db_err(c, e, "idem_get");
    }
    done_stmt(st);
    return rc;
}

static int tx_ordering_advance(struct store_tx *tx, const struct store_ordering *o, int *advanced,
                               int *had_last, int64_t *last, struct ifl_err *e)
{
    struct conn *c = txc(tx);
    static const char sel[] = "SELECT version FROM ordering_keys WHERE workspace = ? AND"
                              " workflow = ? AND entry_point = ? AND key = ?";
    sqlite3_stmt *st = stmt(c, sel, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, o->ws);
    bind_text(st, 2, o->wf);
    bind_text(st, 3, o->entry_point);
    bind_text(st, 4, o->key);
    int r = sqlite3_step(st);
    if (r == SQLITE_ROW) {
        *had_last = 1;
        *last = sqlite3_column_int64(st, 0);
    }
    int rc = r == SQLITE_ROW || r == SQLITE_DONE ? 0 : db_err(c, e, "ordering_get");
    done_stmt(st);
    if (rc || (*had_last && *last >= o->version))
        return rc;
    /* one writer: nobody can come between the read and this write */
    static const char up[] =
        "INSERT INTO ordering_keys (workspace, workflow, entry_point, key, version, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (workspace, workflow, entry_point, key)"
        " DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at";
    if (!(st = stmt(c, up, e)))
        return IFL_ESTORE;
    bind_text(st, 1, o->ws);
    bind_text(st, 2, o->wf);
    bind_text(st, 3, o->entry_point);
    bind_text(st, 4, o->key);
    sqlite3_bind_int64(st, 5, o->version);
    sqlite3_bind_int64(st, 6, clock_now_ms());
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "ordering_put");
    done_stmt(st);
    *advanced = rc == 0;
    return rc;
}

static int tx_ordering_reset(struct store_tx *tx, const struct store_ordering *o, int had_last,
                             int64_t last, struct ifl_err *e)
{
    struct conn *c = txc(tx);
    static const char upd[] = "UPDATE ordering_keys SET version = ? WHERE workspace = ? AND"
                              " workflow = ? AND entry_point = ? AND key = ?";
    static const char del[] = "DELETE FROM ordering_keys WHERE workspace = ? AND workflow = ?"
                              " AND entry_point = ? AND key = ?";
    sqlite3_stmt *st = stmt(c, had_last ? upd : del, e);
    if (!st)
        return IFL_ESTORE;
    int k = 1;
    if (had_last)
        sqlite3_bind_int64(st, k++, last);
    bind_text(st, k++, o->ws);
    bind_text(st, k++, o->wf);
    bind_text(st, k++, o->entry_point);
    bind_text(st, k, o->key);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "ordering_reset");
    done_stmt(st);
    return rc;
}

static int tx_tick_claim(struct store_tx *tx, const struct store_tick *t, int *claimed,
                         int *superseded, struct ifl_err *e)
{
    struct conn *c = txc(tx);
    static const char newer[] = "SELECT 1 FROM workflows WHERE workspace = ? AND name = ?"
                                " AND version > ? AND created_at <= ? LIMIT 1";
    sqlite3_stmt *st = stmt(c, newer, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, t->ws);
    bind_text(st, 2, t->wf);
    sqlite3_bind_int(st, 3, t->version);
    sqlite3_bind_int64(st, 4, t->fire_at);
    int r = sqlite3_step(st);
    int rc = r == SQLITE_ROW || r == SQLITE_DONE ? 0 : db_err(c, e, "tick_newer");
    done_stmt(st);
    if (rc || (*superseded = r == SQLITE_ROW))
        return rc;
    static const char ins[] =
        "INSERT INTO schedule_ticks (workspace, workflow, entry_point, fire_at, execution_id)"
        " VALUES (?, ?, ?, ?, ?) ON CONFLICT (workspace, workflow, entry_point, fire_at)"
        " DO NOTHING";
    if (!(st = stmt(c, ins, e)))
        return IFL_ESTORE;
    bind_text(st, 1, t->ws);
    bind_text(st, 2, t->wf);
    bind_text(st, 3, t->entry_point);
    sqlite3_bind_int64(st, 4, t->fire_at);
    bind_text(st, 5, t->execution_id);
    rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "tick_claim");
    done_stmt(st);
    if (!rc)
        *claimed = sqlite3_changes(c->db) == 1;
    return rc;
}

/* Runs a "delete at most ?2 rows older than ?1" statement; *n = rows. */
static int expire_rows(struct store_tx *tx, const char *sql, int64_t before, int limit, int *n,
                       struct ifl_err *e)
{
    struct conn *c = txc(tx);
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    sqlite3_bind_int64(st, 1, before);
    sqlite3_bind_int(st, 2, limit);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "expire");
    done_stmt(st);
    if (!rc)
        *n = sqlite3_changes(c->db);
    return rc;
}

static int tx_ticks_expire(struct store_tx *tx, int64_t before, int limit, int *n,
                           struct ifl_err *e)
{
    return expire_rows(tx,
                       "DELETE FROM schedule_ticks WHERE rowid IN (SELECT rowid FROM"
                       " schedule_ticks WHERE fire_at < ? LIMIT ?)",
                       before, limit, n, e);
}

static int tx_workflows_latest(struct store_tx *tx, struct store_workflow **items, size_t *n,
                               struct ifl_err *e)
{
    struct conn *c = txc(tx);
    /* SQLite takes the bare created_at from the row holding max(version) */
    static const char sel[] = "SELECT workspace, name, max(version), created_at FROM workflows"
                              " GROUP BY workspace, name";
    sqlite3_stmt *st = stmt(c, sel, e);
    if (!st)
        return IFL_ESTORE;
    size_t cap = 0;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            *items = xrealloc(*items, cap * sizeof **items);
        }
        struct store_workflow *w = &(*items)[(*n)++];
        memset(w, 0, sizeof *w);
        w->workspace = col_str(st, 0);
        w->name = col_str(st, 1);
        w->version = sqlite3_column_int(st, 2);
        w->created_at = sqlite3_column_int64(st, 3);
    }
    int rc = r == SQLITE_DONE ? 0 : db_err(c, e, "workflows_latest");
    done_stmt(st);
    return rc;
}

static int tx_idem_set(struct store_tx *tx, const char *ws, const char *scope, const char *key,
                       const struct store_idem *r, int64_t expect_created_at, int *changed,
                       struct ifl_err *e)
{
    struct conn *c = txc(tx);
    static const char upd[] = "UPDATE idempotency_keys SET fingerprint = ?, status = ?,"
                              " response = ?, created_at = ?"
                              " WHERE workspace = ? AND scope = ? AND key = ?"
                              " AND (? < 0 OR created_at = ?)";
    sqlite3_stmt *st = stmt(c, upd, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, r->fingerprint);
    sqlite3_bind_int(st, 2, r->status);
    bind_text(st, 3, r->response);
    sqlite3_bind_int64(st, 4, r->created_at);
    bind_text(st, 5, ws);
    bind_text(st, 6, scope);
    bind_text(st, 7, key);
    sqlite3_bind_int64(st, 8, expect_created_at);
    sqlite3_bind_int64(st, 9, expect_created_at);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "idem_set");
    done_stmt(st);
    if (!rc)
        *changed = sqlite3_changes(c->db) == 1;
    return rc;
}

static int tx_idem_expire(struct store_tx *tx, int64_t before, int limit, int *n, struct ifl_err *e)
{
    return expire_rows(tx,
                       "DELETE FROM idempotency_keys WHERE rowid IN (SELECT rowid FROM"
                       " idempotency_keys WHERE created_at < ? LIMIT ?)",
                       before, limit, n, e);
}

/* ---- step reads, claims, leases ----------------------------------------------------- */

static int op_steps_get(struct store *base, const char *execution_id, struct store_step **items,
                        size_t *n, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    struct conn *c = reader_get(s, e);
    if (!c)
        return IFL_ESTORE;
    int rc = steps_of(c, execution_id, items, n, e);
    reader_put(s, c);
    return rc;
}

/* One read transaction for both, so the second query finds the pages the
 * first brought into this connection's cache (a new read transaction after
 * a commit starts with an emptied cache) and both see one snapshot. */
static const char sql_read_begin[] = "BEGIN";

static int op_execution_load(struct store *base, const char *ws, const char *id,
                             struct store_execution *x, struct store_step **items, size_t *n,
                             struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    struct conn *c = reader_get(s, e);
    if (!c)
        return IFL_ESTORE;
    int rc = ctl(c, sql_read_begin, e);
    if (!rc && !(rc = exec_get(c, ws, id, x, NULL, e)) && (rc = steps_of(c, id, items, n, e)))
        store_execution_clear(x);
    if (ctl(c, sql_commit, NULL))
        exec(c, "ROLLBACK", NULL);
    reader_put(s, c);
    return rc;
}

static int op_attempts_get(struct store *base, const char *execution_id,
                           struct store_attempt **items, size_t *n, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    static const char sql[] =
        "SELECT execution_id, vertex, epoch, worker, started_at, finished_at, outcome, error"
        " FROM step_attempts WHERE execution_seq = (SELECT seq FROM executions WHERE id = ?)"
        " ORDER BY vertex, epoch";
    struct conn *c;
    sqlite3_stmt *st = read_begin(s, sql, &c, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, execution_id);
    size_t cap = 0;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        *items = store_grow(*items, *n, &cap, sizeof **items);
        struct store_attempt *a = &(*items)[(*n)++];
        memset(a, 0, sizeof *a);
        col_copy(st, 0, a->execution_id, sizeof a->execution_id);
        a->vertex = col_str(st, 1);
        a->epoch = sqlite3_column_int64(st, 2);
        a->worker = col_str(st, 3);
        a->started_at = sqlite3_column_int64(st, 4);
        a->finished_at = sqlite3_column_int64(st, 5);
        a->outcome = col_str(st, 6);
        a->error = col_str(st, 7);
    }
    int rc = r == SQLITE_DONE ? 0 : db_err(c, e, "attempts_get");
    read_end(s, c, st);
    return rc;
}

struct claim_args {
    const char *worker;
    int limit;
    int64_t now, lease_ms;
    const char *retry_note;
    char **after, **empty_since; /* struct sq's claim_after, claim_empty_since */
    struct store_claim *items;
    size_t n;
    int more; /* store_claim_noted's */
};

/* One workspace's oldest due steps, as the claim's walk found them. */
struct claim_due {
    int64_t seq[STORE_CLAIM_MAX];
    char *vertex[STORE_CLAIM_MAX];
    int n;
};

/* The claim's walk (store.h, store_claim): the workspaces with DISPATCHED
 * steps in name order, from the one after *after, wrapping once, until
 * `limit` of them have due steps or STORE_CLAIM_WALK were looked at; each
 * found with its oldest due steps (up to limit).  A look is one index seek
 * (steps_due_ws): the next workspace's earliest step, which says whether
 * it has one due; a workspace whose steps all wait (a backoff) costs that
 * seek, however many it has.  *after becomes the last looked at. */
static int claim_walk(struct conn *c, struct claim_args *a, struct claim_due *due, int *nd,
                      struct ifl_err *e)
{
    static const char next_ws[] = "SELECT workspace, next_run_at FROM steps"
                                  " WHERE state = 'DISPATCHED' AND workspace > ?1"
                                  " ORDER BY workspace, next_run_at LIMIT 1";
    static const char due_of[] = "SELECT execution_seq, vertex FROM steps"
                                 " WHERE state = 'DISPATCHED' AND workspace = ?1"
                                 " AND next_run_at <= ?2 ORDER BY next_run_at LIMIT ?3";
    char *start = *a->after ? xstrdup(*a->after) : NULL, *at = start ? xstrdup(start) : xstrdup("");
    int wrapped = 0, rc = 0, looked = 0;
    *nd = 0;
    for (; looked < STORE_CLAIM_WALK && *nd < a->limit;) {
        sqlite3_stmt *st = stmt(c, next_ws, e);
        if (!st) {
            rc = IFL_ESTORE;
            break;
        }
        bind_text(st, 1, at);
        int r = sqlite3_step(st);
        char *ws = r == SQLITE_ROW ? col_str(st, 0) : NULL;
        int64_t first = r == SQLITE_ROW ? sqlite3_column_int64(st, 1) : 0;
        done_stmt(st);
        if (r != SQLITE_ROW && r != SQLITE_DONE) {
            rc = db_err(c, e, "claim_walk");
            break;
        }
        if (!ws || (wrapped && strcmp(ws, start) > 0)) { /* the end; or back where it began */
            free(ws);
            if (wrapped || !start)
                break;
            wrapped = 1;
            free(at);
            at = xstrdup("");
            continue;
        }
        looked++;
        free(at);
        at = ws;
        if (first > a->now) /* nothing of it is due yet */
            continue;
        if (!(st = stmt(c, due_of, e))) {
            rc = IFL_ESTORE;
            break;
        }
        bind_text(st, 1, ws);
        sqlite3_bind_int64(st, 2, a->now);
        sqlite3_bind_int(st, 3, a->limit);
        struct claim_due *d = &due[*nd];
        d->n = 0;
        while ((r = sqlite3_step(st)) == SQLITE_ROW && d->n < a->limit) {
            d->seq[d->n] = sqlite3_column_int64(st, 0);
            d->vertex[d->n++] = col_str(st, 1);
        }
        done_stmt(st);
        if (r != SQLITE_ROW && r != SQLITE_DONE) {
            rc = db_err(c, e, "claim_due"); /* its vertices are freed by the caller */
            break;
        }
        *nd += d->n > 0;
    }
    if (!rc)
        a->more = store_claim_lap(a->empty_since, start, looked ? at : NULL, wrapped, *nd,
                                  looked == STORE_CLAIM_WALK && *nd < a->limit);
    if (!rc && strcmp(at, "") != 0) {
        free(*a->after);
        *a->after = at;
        at = NULL;
    }
    free(at);
    free(start);
    return rc;
}

static int job_claim(struct conn *c, void *arg, struct ifl_err *e)
{
    struct claim_args *a = arg;
    store_claims_free(a->items, a->n); /* a batch may run a job twice */
    a->items = NULL;
    a->n = 0;
    struct claim_due *due = xcalloc((size_t)a->limit, sizeof *due);
    int nd = 0;
    int rc = claim_walk(c, a, due, &nd, e);
    /* In turn: the oldest due step of each workspace (in the walk's order),
     * then the second of each, …; the single writer makes each flip final
     * (state is checked all the same); RETURNING hands back the row. */
    static const char take[] =
        "UPDATE steps SET state = 'EXECUTING', epoch = epoch + 1, attempts = attempts + 1,"
        " lease_owner = ?1, lease_expires_at = ?2, updated_at = ?3"
        " WHERE execution_seq = ?4 AND vertex = ?5 AND state = 'DISPATCHED'"
        " RETURNING execution_id, vertex, workspace, kind, epoch, attempts, execution_seq";
    static const char hist[] =
        "INSERT INTO step_attempts (execution_id, vertex, epoch, worker, started_at,"
        " execution_seq, outcome) VALUES (?, ?, ?, ?, ?, ?, ?)";
    a->items = xcalloc((size_t)a->limit, sizeof *a->items);
    int64_t *seqs = xcalloc((size_t)a->limit, sizeof *seqs);
    for (int turn = 0; !rc && turn < a->limit && (int)a->n < a->limit; turn++) {
        int any = 0;
        for (int k = 0; !rc && k < nd && (int)a->n < a->limit; k++) {
            if (turn >= due[k].n)
                continue;
            any = 1;
            sqlite3_stmt *st = stmt(c, take, e);
            if (!st) {
                rc = IFL_ESTORE;
                break;
            }
            bind_text(st, 1, a->worker);
            sqlite3_bind_int64(st, 2, a->now + a->lease_ms);
            sqlite3_bind_int64(st, 3, a->now);
            sqlite3_bind_int64(st, 4, due[k].seq[turn]);
            bind_text(st, 5, due[k].vertex[turn]);
            int r = sqlite3_step(st);
            if (r == SQLITE_ROW) {
                struct store_claim *cl = &a->items[a->n];
                col_copy(st, 0, cl->execution_id, sizeof cl->execution_id);
                cl->vertex = col_str(st, 1);
                cl->workspace = col_str(st, 2);
                cl->kind = col_str(st, 3);
                cl->epoch = sqlite3_column_int64(st, 4);
                cl->attempts = sqlite3_column_int(st, 5);
                seqs[a->n++] = sqlite3_column_int64(st, 6);
                r = sqlite3_step(st);
            }
            rc = r == SQLITE_DONE ? 0 : db_err(c, e, "claim");
            done_stmt(st);
        }
        if (!any)
            break;
    }
    for (int k = 0; k < a->limit; k++) /* an entry's n counts what it holds */
        for (int i = 0; i < due[k].n; i++)
            free(due[k].vertex[i]);
    free(due);
    for (size_t i = 0; !rc && i < a->n; i++) {
        sqlite3_stmt *st = stmt(c, hist, e);
        if (!st) {
            rc = IFL_ESTORE;
            break;
        }
        bind_text(st, 1, a->items[i].execution_id);
        bind_text(st, 2, a->items[i].vertex);
        sqlite3_bind_int64(st, 3, a->items[i].epoch);
        bind_text(st, 4, a->worker);
        sqlite3_bind_int64(st, 5, a->now);
        sqlite3_bind_int64(st, 6, seqs[i]);
        int noted = strcmp(a->items[i].kind, "GATEWAY") == 0 && STORE_CLAIM_NOTED(&a->items[i]);
        bind_text(st, 7, noted ? a->retry_note : NULL);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "attempt_insert");
        done_stmt(st);
    }
    free(seqs);
    if (!a->n) { /* nothing claimed: no array, as the caller expects */
        free(a->items);
        a->items = NULL;
    }
    return rc;
}

static int op_claim(struct store *base, const char *worker, int limit, int64_t now,
                    int64_t lease_ms, const char *retry_note, struct store_claim **items, size_t *n,
                    int *more, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    struct claim_args a = {
        worker, limit, now, lease_ms, retry_note, &s->claim_after, &s->claim_empty_since,
        NULL,   0,     0};
    int rc = write_job(s, job_claim, &a, e);
    *more = a.more;
    if (rc) {
        store_claims_free(a.items, a.n);
        return rc;
    }
    *items = a.items;
    *n = a.n;
    return 0;
}

struct renew_args {
    const char *id, *vertex;
    int64_t epoch, now, until;
    int ok;
};

static int job_renew(struct conn *c, void *arg, struct ifl_err *e)
{
    struct renew_args *a = arg;
    static const char sql[] = "UPDATE steps SET lease_expires_at = ? WHERE execution_seq = "
                              "(SELECT seq FROM executions WHERE id = ?)"
                              " AND vertex = ? AND state = 'EXECUTING' AND epoch = ?"
                              " AND lease_expires_at >= ?";
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st)
        return IFL_ESTORE;
    sqlite3_bind_int64(st, 1, a->until);
    bind_text(st, 2, a->id);
    bind_text(st, 3, a->vertex);
    sqlite3_bind_int64(st, 4, a->epoch);
    sqlite3_bind_int64(st, 5, a->now);
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_err(c, e, "lease_renew");
    done_stmt(st);
    a->ok = !rc && sqlite3_changes(c->db) == 1;
    return rc;
}

static int op_lease_renew(struct store *base, const char *execution_id, const char *vertex,
                          int64_t epoch, int64_t now, int64_t until, int *ok, struct ifl_err *e)
{
    struct renew_args a = {execution_id, vertex, epoch, now, until, 0};
    int rc = write_job((struct sq *)base, job_renew, &a, e);
    *ok = a.ok;
    return rc;
}

static int op_expired(struct store *base, int64_t now, int limit, struct store_step **items,
                      size_t *n, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    static const char sql[] = "SELECT " STEP_COLS " FROM steps WHERE state = 'EXECUTING'"
                              " AND (? < 0 OR lease_expires_at < ?) LIMIT ?";
    struct conn *c;
    sqlite3_stmt *st = read_begin(s, sql, &c, e);
    if (!st)
        return IFL_ESTORE;
    sqlite3_bind_int64(st, 1, now);
    sqlite3_bind_int64(st, 2, now);
    sqlite3_bind_int(st, 3, limit);
    int rc = collect_steps(c, st, items, n, e); /* finishes st */
    reader_put(s, c);
    return rc;
}

static int op_next_due(struct store *base, int64_t *when, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    static const char sql[] = "SELECT MIN(next_run_at) FROM steps WHERE state = 'DISPATCHED'";
    struct conn *c = reader_get(s, e);
    if (!c)
        return IFL_ESTORE;
    int rc = 0;
    sqlite3_stmt *st = stmt(c, sql, e);
    if (!st) {
        rc = IFL_ESTORE;
    } else {
        if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
            *when = sqlite3_column_int64(st, 0);
        done_stmt(st);
    }
    reader_put(s, c);
    return rc;
}

static int op_dead_letters(struct store *base, const char *ws,
                           const struct store_dead_cursor *after, int limit,
                           struct store_step **items, size_t *n, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    static const char sql[] = "SELECT " STEP_COLS " FROM steps WHERE workspace = ?1"
                              " AND state IN ('FAILED', 'REQUIRES_RECONCILIATION')"
                              " AND NOT EXISTS (SELECT 1 FROM executions x"
                              " WHERE x.seq = steps.execution_seq"
                              " AND (x.status = 'cancelled' OR x.started_over_to IS NOT NULL))"
                              " AND (?2 = 0 OR (updated_at, execution_id, vertex) < (?3, ?4, ?5))"
                              " ORDER BY updated_at DESC, execution_id DESC, vertex DESC LIMIT ?6";
    struct conn *c;
    sqlite3_stmt *st = read_begin(s, sql, &c, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, ws);
    sqlite3_bind_int(st, 2, after != NULL);
    sqlite3_bind_int64(st, 3, after ? after->at : 0);
    bind_text(st, 4, after ? after->execution_id : "");
    bind_text(st, 5, after ? after->vertex : "");
    sqlite3_bind_int(st, 6, limit);
    int rc = collect_steps(c, st, items, n, e); /* finishes st */
    reader_put(s, c);
    return rc;
}

static int op_events_list(struct store *base, const char *ws, const char *after, int limit,
                          struct store_event **items, size_t *n, struct ifl_err *e)
{
    struct sq *s = (struct sq *)base;
    long long after_seq = 0;
    if (after) {
        char *end = NULL;
        errno = 0;
        after_seq = strtoll(after, &end, 10);
        if (end == after || *end || after_seq < 0 || errno)
            return err_set(e, IFL_EINVAL, "malformed event cursor");
    }
    static const char sql[] =
        "SELECT seq, id, workspace, execution_id, aggregate_version, type, data, created_at"
        " FROM events WHERE workspace = ? AND seq > ? ORDER BY seq LIMIT ?";
    struct conn *c;
    sqlite3_stmt *st = read_begin(s, sql, &c, e);
    if (!st)
        return IFL_ESTORE;
    bind_text(st, 1, ws);
    sqlite3_bind_int64(st, 2, after_seq);
    sqlite3_bind_int(st, 3, limit);
    size_t cap = 0;
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        *items = store_grow(*items, *n, &cap, sizeof **items);
        struct store_event *ev = &(*items)[(*n)++];
        memset(ev, 0, sizeof *ev);
        ev->seq = sqlite3_column_int64(st, 0);
        col_copy(st, 1, ev->id, sizeof ev->id);
        ev->workspace = col_str(st, 2);
        col_copy(st, 3, ev->execution_id, sizeof ev->execution_id);
        ev->aggregate_version = sqlite3_column_int64(st, 4);
        ev->type = col_str(st, 5);
        ev->data = col_str(st, 6);
        ev->created_at = sqlite3_column_int64(st, 7);
        snprintf(ev->cursor, sizeof ev->cursor, "%lld", (long long)ev->seq);
    }
    int rc = r == SQLITE_DONE ? 0 : db_err(c, e, "events_list");
    read_end(s, c, st);
    if (rc || *n || after_seq == 0)
        return rc;
    /* An empty page: a cursor past every seq handed out was never a page's
     * `next` (the newest event outlives retention, so the maximum never
     * falls), and taking it would skip every event up to it. */
    static const char max_sql[] = "SELECT COALESCE(MAX(seq), 0) FROM events";
    if (!(st = read_begin(s, max_sql, &c, e)))
        return IFL_ESTORE;
    r = sqlite3_step(st);
    long long max = r == SQLITE_ROW ? sqlite3_column_int64(st, 0) : 0;
    rc = r == SQLITE_ROW ? 0 : db_err(c, e, "events_list");
    read_end(s, c, st);
    if (!rc && after_seq > max)
        rc = err_set(e, IFL_EINVAL, "the event cursor is ahead of the feed: no page gave it");
    return rc;
}

/* ---- lifecycle --------------------------------------------------------------------- */

static void op_close(struct store *base)
{
    struct sq *s = (struct sq *)base;
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    ids_stop(s);
    ckpt_stop(s);
    conn_close(&s->ckpt);
    while (s->free_readers) {
        struct conn *c = s->free_readers;
        s->free_readers = c->next;
        conn_close(c);
        free(c);
    }
    conn_close(&s->writer);
    if (s->dbfd >= 0)
        close(s->dbfd); /* last: SQLite's POSIX locks on the file are gone */
    if (s->lockfd >= 0)
        close(s->lockfd); /* releases the flock */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->rmu);
    pthread_cond_destroy(&s->rcv);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->ccv);
    pthread_cond_destroy(&s->ccv_idle);
    idset_free(s->ids);
    free(s->claim_after);
    free(s->claim_empty_since);
    free(s->path);
    free(s);
}

/* ---- portable statements (store_sql) -------------------------------------------- */

static int gen_rows(struct conn *c, sqlite3_stmt *st, const struct store_sql *q,
                    const struct store_val *p, int np, store_row_fn cb, void *arg,
                    struct ifl_err *e)
{
    for (int k = 0; k < np; k++) {
        if (p[k].is_int)
            sqlite3_bind_int64(st, k + 1, p[k].i);
        else
            bind_text(st, k + 1, p[k].s);
    }
    int r, rc = 0;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        int nc = sqlite3_column_count(st);
        if (nc > STORE_MAX_COLS)
            nc = STORE_MAX_COLS;
        const char *cols[STORE_MAX_COLS];
        for (int k = 0; k < nc; k++)
            cols[k] = (const char *)sqlite3_column_text(st, k);
        if (cb && (rc = cb(arg, cols, nc)) != 0)
            break;
    }
    if (!rc && r != SQLITE_DONE)
        rc = db_err(c, e, q->name);
    return rc;
}

static int op_query(struct store *base, const struct store_sql *q, const struct store_val *p,
                    int np, store_row_fn cb, void *arg, struct ifl_err *e)
{
    struct conn *c;
    sqlite3_stmt *st = read_begin((struct sq *)base, q->sql, &c, e);
    if (!st)
        return IFL_ESTORE;
    int rc = gen_rows(c, st, q, p, np, cb, arg, e);
    read_end((struct sq *)base, c, st);
    return rc;
}

static int tx_query(struct store_tx *tx, const struct store_sql *q, const struct store_val *p,
                    int np, store_row_fn cb, void *arg, struct ifl_err *e)
{
    struct conn *c = txc(tx);
    sqlite3_stmt *st = stmt(c, q->sql, e);
    if (!st)
        return IFL_ESTORE;
    int rc = gen_rows(c, st, q, p, np, cb, arg, e);
    done_stmt(st);
    return rc;
}

static const struct store_ops sqlite_ops = {
    .name = "sqlite",
    .close = op_close,
    .schema_version = op_schema_version,
    .ping = op_ping,
    .workspace_put = op_workspace_put,
    .workspace_exists = op_workspace_exists,
    .workflow_put = op_workflow_put,
    .workflow_get = op_workflow_get,
    .secret_put = op_secret_put,
    .secret_get = op_secret_get,
    .secret_list = op_secret_list,
    .secret_retired = op_secret_retired,
    .steps_get = op_steps_get,
    .execution_load = op_execution_load,
    .attempts_get = op_attempts_get,
    .claim = op_claim,
    .lease_renew = op_lease_renew,
    .expired = op_expired,
    .next_due = op_next_due,
    .dead_letters = op_dead_letters,
    .events_list = op_events_list,
    .tx_run = op_tx_run,
    .tx_run_many = op_tx_run_many,
    .tx_submit = op_tx_submit,
    .tx_execution_get = tx_execution_get,
    .tx_execution_insert = tx_execution_insert,
    .tx_execution_set_status = tx_execution_set_status,
    .tx_execution_started_over = tx_execution_started_over,
    .tx_steps_get = tx_steps_get,
    .tx_execution_load = tx_execution_load,
    .tx_step_insert = tx_step_insert,
    .tx_steps_insert = tx_steps_insert,
    .tx_step_update = tx_step_update,
    .tx_attempt_finish = tx_attempt_finish,
    .tx_attempt_delete = tx_attempt_delete,
    .tx_attempt_record = tx_attempt_record,
    .tx_event_append = tx_event_append,
    .tx_idem_put = tx_idem_put,
    .tx_ordering_advance = tx_ordering_advance,
    .tx_ordering_reset = tx_ordering_reset,
    .tx_tick_claim = tx_tick_claim,
    .tx_ticks_expire = tx_ticks_expire,
    .tx_workflows_latest = tx_workflows_latest,
    .tx_idem_set = tx_idem_set,
    .tx_idem_expire = tx_idem_expire,
    .query = op_query,
    .tx_query = tx_query,
    .execution_get = op_execution_get,
    .execution_list = op_execution_list,
    .idem_exists = op_idem_exists,
};

/* Process-wide: SQLite's memory statistics take a global mutex on every
 * allocation; nothing here reads them. */
static void sqlite_global_config(void)
{
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
}

/* "<path>.lock" for the database's canonical path: a symlink or another
 * spelling of the same file ("./db", "dir/../db") must find the same lock.
 * The file may not exist yet: then its directory is resolved.  (A hard link
 * is another name still; so is a lock file deleted while held.) */
static char *lock_path_for(const char *path)
{
    char *real = realpath(path, NULL);
    if (!real) {
        const char *slash = strrchr(path, '/');
        char *dir = slash ? xstrndup(path, slash == path ? 1 : (size_t)(slash - path)) : NULL;
        char *rdir = realpath(dir ? dir : ".", NULL);
        if (rdir)
            real = xasprintf("%s/%s", strcmp(rdir, "/") == 0 ? "" : rdir, slash ? slash + 1 : path);
        free(rdir);
        free(dir);
    }
    char *lp = xasprintf("%s.lock", real ? real : path);
    free(real);
    return lp;
}

int store_sqlite_open(const char *path, struct store **out, struct ifl_err *e)
{
    if (!sqlite3_threadsafe())
        return err_set(e, IFL_ESTORE, "sqlite was built without thread support");
    struct sq *s = xcalloc(1, sizeof *s);
    s->base.ops = &sqlite_ops;
    s->path = xstrdup(path);
    s->lockfd = -1;
    s->dbfd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_mutex_init(&s->rmu, NULL);
    pthread_cond_init(&s->rcv, NULL);
    pthread_mutex_init(&s->cmu, NULL);
    pthread_cond_init(&s->ccv, NULL);
    pthread_cond_init(&s->ccv_idle, NULL);
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, sqlite_global_config);
    int rc;
    char *lockpath = lock_path_for(path);
    s->lockfd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->lockfd < 0) {
        rc = err_set(e, IFL_EIO, "cannot open lock file %s (errno %d)", lockpath, errno);
        free(lockpath);
        goto fail_early;
    }
    if (flock(s->lockfd, LOCK_EX | LOCK_NB) != 0) {
        rc = err_set(e, IFL_EBUSY,
                     "database %s is in use by another idemflow process (lock %s held)", path,
                     lockpath);
        free(lockpath);
        goto fail_early;
    }
    free(lockpath);
    /* The file itself, for its other names (hard links).  Opened before
     * SQLite, so a refusal here closes a descriptor no connection of this
     * store shares.  (Inside one process, a second store over a hard link
     * would still drop the first one's POSIX locks when it closes this
     * descriptor: one store per database per process.) */
    s->dbfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s->dbfd < 0) {
        rc = err_set(e, IFL_EIO, "cannot open database file %s (errno %d)", path, errno);
        goto fail_early;
    }
    if (flock(s->dbfd, LOCK_EX | LOCK_NB) != 0) {
        rc = err_set(e, IFL_EBUSY,
                     "database %s is in use by another idemflow process (the file, under "
                     "another name, is locked)",
                     path);
        goto fail_early;
    }
    if ((rc = conn_open(&s->writer, path, 0, e)))
        goto fail_early;
    if ((rc = migrate(s, e)))
        goto fail_early;
    if ((rc = ids_start(s, e)))
        goto fail_early;
    if ((rc = exec(&s->writer, "PRAGMA wal_autocheckpoint=0", e)))
        goto fail_early;
    sqlite3_wal_hook(s->writer.db, on_wal, s);
    if ((rc = conn_open(&s->ckpt, path, 1, e)))
        goto fail_early;
    exec(&s->ckpt, "PRAGMA query_only=0", NULL);
    if (pthread_create(&s->ckpt_thread, NULL, checkpointer_main, s) != 0) {
        rc = err_set(e, IFL_EIO, "cannot start the checkpoint thread");
        goto fail_early;
    }
    s->ckpt_running = 1;
    if (pthread_create(&s->thread, NULL, writer_main, s) != 0) {
        rc = err_set(e, IFL_EIO, "cannot start the store writer thread");
        goto fail_early;
    }
    *out = &s->base;
    return 0;
fail_early:
    ids_stop(s);
    ckpt_stop(s);
    conn_close(&s->ckpt);
    while (s->free_readers) { /* the id scan's */
        struct conn *c = s->free_readers;
        s->free_readers = c->next;
        conn_close(c);
        free(c);
    }
    conn_close(&s->writer);
    if (s->dbfd >= 0)
        close(s->dbfd); /* after the connections (see the top of this file) */
    if (s->lockfd >= 0)
        close(s->lockfd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->rmu);
    pthread_cond_destroy(&s->rcv);
    pthread_mutex_destroy(&s->cmu);
    pthread_cond_destroy(&s->ccv);
    pthread_cond_destroy(&s->ccv_idle);
    idset_free(s->ids);
    free(s->path);
    free(s);
    return rc;
}
