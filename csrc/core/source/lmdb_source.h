/* fastload core: an LMDB database as a dataset's sample store, read with
 * liblmdb from any thread without the GIL.
 *
 * The environment is opened read-only once (MDB_NOTLS, so read transactions
 * are not tied to the thread that made them) and shared by every worker
 * thread.  Sample i is the value of key i: its index written as ASCII
 * decimal ("0", "1", ...), the usual ImageNet-LMDB layout, or the i-th key
 * of a key list given as one blob and offsets.
 *
 * Raw arrays: fl_lmdb_gather copies each value (a fixed-size record) straight
 * into its batch row, one read transaction per batch.  Images: fl_lmdb_read
 * is the image source's byte provider; it copies the value into the worker's
 * read buffer before its transaction ends, since a value in the map is valid
 * only while a transaction holds it (a writer may reuse the page after).
 * The copy costs microseconds against the decode's milliseconds, and keeps
 * readers correct while another process writes the database.
 *
 * liblmdb reads the B-tree pages straight from its mapping, inside
 * mdb_txn_begin (the two meta pages) and mdb_get, so a data file cut short
 * under a reader would raise SIGBUS there.  Each read checks that the data
 * file still holds the meta pages (fstat of liblmdb's descriptor), then
 * begins its transaction outside the bus-error guard (bus_guard.h):
 * mdb_txn_begin allocates, and takes the reader-table mutex to register a
 * reader slot, nothing a guarded function may do.  It then runs its lookups and the copy under the guard; after a
 * fault the transaction is aborted outside the guard, which frees its
 * reader slot, so the environment stays usable (nothing of liblmdb's is
 * per thread: MDB_NOTLS) and no slot is left pinned to an old snapshot
 * however many faults the process sees; the call returns FL_ERR_CHANGED
 * naming the data file.  A file cut below its meta pages between that
 * check and mdb_txn_begin's read of them (a window of microseconds that
 * two workers and a cut can hit) is caught by the guard around the begin
 * too, after liblmdb has released its mutex: still FL_ERR_CHANGED, at the
 * cost of that transaction's memory and reader slot.
 */
#ifndef FL_LMDB_SOURCE_H
#define FL_LMDB_SOURCE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fl_lmdb_source {
    void *env;               /* MDB_env * */
    unsigned int dbi;        /* MDB_dbi */
    const char *path;
    const char *keys;        /* NULL: key i is i in decimal */
    const int64_t *key_offsets; /* key i is keys[key_offsets[i] .. key_offsets[i + 1]) */
    int64_t length;
    size_t value_size;       /* raw records: bytes per value; 0 for images */
    int no_lock;             /* opened with MDB_NOLOCK (the lock file could not be made) */
    /* The data file, for reads another process may cut short: */
    char *data_path;         /* owned (malloc); names it in messages */
    int data_fd;             /* liblmdb's descriptor of it (not ours to close) */
    int64_t data_size;       /* its size when opened */
    size_t page_size;        /* the database's page size (two meta pages lead the file) */
} fl_lmdb_source;

/* Opens `path` (a database directory, or the data file itself) read-only,
 * and the named database `db` (NULL: the default one).  Returns FL_OK, or a
 * status with a message in msg (the source then holds nothing). */
int fl_lmdb_open(fl_lmdb_source *src, const char *path, const char *db, char *msg,
                 size_t msg_size);

void fl_lmdb_close(fl_lmdb_source *src);

/* The number of entries of the database, or -1 with a message (*status:
 * FL_ERR_DECODE, or FL_ERR_CHANGED when the data file shrank). */
int64_t fl_lmdb_entries(const fl_lmdb_source *src, int *status, char *msg, size_t msg_size);

/* Copies the values of samples idx[0..n) into consecutive value_size-byte
 * rows of dst.  Returns FL_OK, or FL_ERR_IO (missing key) / FL_ERR_DECODE
 * (value of the wrong size) naming the key / FL_ERR_CHANGED (the data file
 * shrank), with *failed set to the index. */
int fl_lmdb_gather(const fl_lmdb_source *src, const int64_t *idx, size_t n, void *dst,
                   int64_t *failed, char *msg, size_t msg_size);

/* Gives room for a value of `size` bytes, or NULL when out of memory. */
typedef unsigned char *(*fl_lmdb_room_fn)(void *ctx, size_t size);

/* Copies sample `index`'s value, inside its read transaction, into the room
 * room(room_ctx, size) gives; *data points there.  Returns FL_OK, FL_ERR_IO
 * naming the key, FL_ERR_CHANGED, or FL_ERR_NOMEM. */
int fl_lmdb_read(const fl_lmdb_source *src, int64_t index, fl_lmdb_room_fn room, void *room_ctx,
                 const unsigned char **data, size_t *size, char *msg, size_t msg_size);

#endif /* FL_LMDB_SOURCE_H */
