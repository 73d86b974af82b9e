/*
 * store/walvfs — see walvfs.h.
 *
 * A shim in the usual SQLite way: the VFS's file objects are big enough for
 * ours followed by the default VFS's, and every file that is not a WAL is
 * the default VFS's own object, opened in place.  A WAL file gets our
 * methods: writes that continue the gathered run are copied into its
 * buffer; anything else (a read, a sync, a size, a truncate, a write
 * elsewhere, a run past the cap, the close) first writes the run out.
 */
#include "store/walvfs.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The default (unix) VFS writes at most 128 KiB - 1 per call (it masks the
 * length to 17 bits), so a run is at most 124 KiB: 30 frames of 4 KiB
 * pages.  A larger commit goes out in that many pieces. */
#define RUN_CAP (124u << 10)

struct walfile {
    sqlite3_file base;  /* pMethods: wal_methods */
    sqlite3_file *real; /* the default VFS's file, right after this struct */
    unsigned char *buf; /* the gathered run: bytes [off, off + len) of the file */
    size_t len;
    sqlite3_int64 off;
};

static sqlite3_vfs *parent;
static sqlite3_vfs vfs;

static int flush(struct walfile *f)
{
    if (!f->len)
        return SQLITE_OK;
    int rc = f->real->pMethods->xWrite(f->real, f->buf, (int)f->len, f->off);
    f->len = 0;
    return rc;
}

static int w_close(sqlite3_file *p)
{
    struct walfile *f = (struct walfile *)p;
    int rc = flush(f);
    int rc2 = f->real->pMethods->xClose(f->real);
    free(f->buf);
    f->buf = NULL;
    return rc != SQLITE_OK ? rc : rc2;
}

static int w_read(sqlite3_file *p, void *out, int amt, sqlite3_int64 ofs)
{
    struct walfile *f = (struct walfile *)p;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xRead(f->real, out, amt, ofs);
}

static int w_write(sqlite3_file *p, const void *data, int amt, sqlite3_int64 ofs)
{
    struct walfile *f = (struct walfile *)p;
    if (f->len && ofs == f->off + (sqlite3_int64)f->len && f->len + (size_t)amt <= RUN_CAP) {
        memcpy(f->buf + f->len, data, (size_t)amt);
        f->len += (size_t)amt;
        return SQLITE_OK;
    }
    int rc = flush(f);
    if (rc != SQLITE_OK)
        return rc;
    if ((size_t)amt > RUN_CAP / 2)
        return f->real->pMethods->xWrite(f->real, data, amt, ofs);
    if (!f->buf && !(f->buf = malloc(RUN_CAP)))
        return f->real->pMethods->xWrite(f->real, data, amt, ofs);
    memcpy(f->buf, data, (size_t)amt);
    f->len = (size_t)amt;
    f->off = ofs;
    return SQLITE_OK;
}

static int w_truncate(sqlite3_file *p, sqlite3_int64 size)
{
    struct walfile *f = (struct walfile *)p;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xTruncate(f->real, size);
}

static int w_sync(sqlite3_file *p, int flags)
{
    struct walfile *f = (struct walfile *)p;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xSync(f->real, flags);
}

static int w_size(sqlite3_file *p, sqlite3_int64 *size)
{
    struct walfile *f = (struct walfile *)p;
    int rc = flush(f);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xFileSize(f->real, size);
}

/* The rest pass through to the real file (locks and geometry do not
 * touch its bytes). */
#define REAL(p) (((struct walfile *)(p))->real)
static int w_lock(sqlite3_file *p, int l)
{
    return REAL(p)->pMethods->xLock(REAL(p), l);
}
static int w_unlock(sqlite3_file *p, int l)
{
    return REAL(p)->pMethods->xUnlock(REAL(p), l);
}
static int w_reserved(sqlite3_file *p, int *out)
{
    return REAL(p)->pMethods->xCheckReservedLock(REAL(p), out);
}
static int w_fcntl(sqlite3_file *p, int op, void *arg)
{
    /* size hints, sync hints, … act on the file: let them see every byte */
    int rc = flush((struct walfile *)p);
    return rc != SQLITE_OK ? rc : REAL(p)->pMethods->xFileControl(REAL(p), op, arg);
}
static int w_sector(sqlite3_file *p)
{
    return REAL(p)->pMethods->xSectorSize(REAL(p));
}
static int w_caps(sqlite3_file *p)
{
    return REAL(p)->pMethods->xDeviceCharacteristics(REAL(p));
}

/* Version 1: SQLite never maps a WAL file nor keeps its wal-index there. */
static const sqlite3_io_methods wal_methods = {
    .iVersion = 1,
    .xClose = w_close,
    .xRead = w_read,
    .xWrite = w_write,
    .xTruncate = w_truncate,
    .xSync = w_sync,
    .xFileSize = w_size,
    .xLock = w_lock,
    .xUnlock = w_unlock,
    .xCheckReservedLock = w_reserved,
    .xFileControl = w_fcntl,
    .xSectorSize = w_sector,
    .xDeviceCharacteristics = w_caps,
};

static int v_open(sqlite3_vfs *v, sqlite3_filename name, sqlite3_file *p, int flags, int *out)
{
    (void)v;
    if (!(flags & SQLITE_OPEN_WAL))
        return parent->xOpen(parent, name, p, flags, out); /* the parent's object, in place */
    struct walfile *f = (struct walfile *)p;
    memset(f, 0, sizeof *f);
    f->real = (sqlite3_file *)(f + 1);
    int rc = parent->xOpen(parent, name, f->real, flags, out);
    f->base.pMethods = rc == SQLITE_OK ? &wal_methods : NULL;
    return rc;
}

static int v_delete(sqlite3_vfs *v, const char *name, int sync)
{
    (void)v;
    return parent->xDelete(parent, name, sync);
}
static int v_access(sqlite3_vfs *v, const char *name, int flags, int *out)
{
    (void)v;
    return parent->xAccess(parent, name, flags, out);
}
static int v_fullpath(sqlite3_vfs *v, const char *name, int n, char *out)
{
    (void)v;
    return parent->xFullPathname(parent, name, n, out);
}
static void *v_dlopen(sqlite3_vfs *v, const char *name)
{
    (void)v;
    return parent->xDlOpen(parent, name);
}
static void v_dlerror(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    parent->xDlError(parent, n, out);
}
static void (*v_dlsym(sqlite3_vfs *v, void *h, const char *sym))(void)
{
    (void)v;
    return parent->xDlSym(parent, h, sym);
}
static void v_dlclose(sqlite3_vfs *v, void *h)
{
    (void)v;
    parent->xDlClose(parent, h);
}
static int v_random(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return parent->xRandomness(parent, n, out);
}
static int v_sleep(sqlite3_vfs *v, int us)
{
    (void)v;
    return parent->xSleep(parent, us);
}
static int v_time(sqlite3_vfs *v, double *out)
{
    (void)v;
    return parent->xCurrentTime(parent, out);
}
static int v_lasterr(sqlite3_vfs *v, int n, char *out)
{
    (void)v;
    return parent->xGetLastError(parent, n, out);
}
static int v_time64(sqlite3_vfs *v, sqlite3_int64 *out)
{
    (void)v;
    return parent->xCurrentTimeInt64(parent, out);
}

static int registered = SQLITE_ERROR;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void do_register(void)
{
    parent = sqlite3_vfs_find(NULL);
    if (!parent || parent->iVersion < 2)
        return;
    vfs = (sqlite3_vfs){
        .iVersion = 2,
        .szOsFile = (int)sizeof(struct walfile) + parent->szOsFile,
        .mxPathname = parent->mxPathname,
        .zName = STORE_WALVFS_NAME,
        .xOpen = v_open,
        .xDelete = v_delete,
        .xAccess = v_access,
        .xFullPathname = v_fullpath,
        .xDlOpen = v_dlopen,
        .xDlError = v_dlerror,
        .xDlSym = v_dlsym,
        .xDlClose = v_dlclose,
        .xRandomness = v_random,
        .xSleep = v_sleep,
        .xCurrentTime = v_time,
        .xGetLastError = v_lasterr,
        .xCurrentTimeInt64 = v_time64,
    };
    registered = sqlite3_vfs_register(&vfs, 0);
}

const char *store_walvfs(void)
{
    pthread_once(&once, do_register);
    return registered == SQLITE_OK ? STORE_WALVFS_NAME : NULL;
}
