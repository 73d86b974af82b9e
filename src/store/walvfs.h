/*
 * store/walvfs — an SQLite VFS that writes a commit's WAL frames with one
 * system call.
 *
 * SQLite appends a commit to the WAL one frame at a time, and each frame as
 * two writes (its 24-byte header, then the page): a group commit of 100
 * pages was 200 pwrite calls, a large part of the writer thread's system
 * time; now it is 4.  This VFS wraps the default one and, for WAL files only,
 * gathers writes that continue each other in a buffer (up to 124 KiB, what
 * the default VFS writes in one call) and writes the run with one pwrite
 * before anything that must see it: the
 * sync that makes the commit durable, a read, a size query, a truncate, a
 * file control, a write elsewhere in the file, the close.
 *
 * Durability is unchanged: a commit is durable when its xSync returns, and
 * xSync writes the run first.  Readers in other connections only read
 * frames the wal-index lists, which SQLite updates after that sync.  A
 * crash that loses the buffer loses frames that were never synced — an
 * uncommitted tail, which recovery ignores as it always did.
 *
 * Every other file (the database, its -shm, journals) is the default VFS's
 * own object, untouched.
 */
#ifndef IFL_STORE_WALVFS_H
#define IFL_STORE_WALVFS_H

#include <sqlite3.h>

#define STORE_WALVFS_NAME "idemflow-wal"

/* Registers the VFS once (thread safe; not as the default) and returns its
 * name for sqlite3_open_v2, or NULL when the default VFS cannot be wrapped
 * (then open with the default). */
const char *store_walvfs(void);

#endif
