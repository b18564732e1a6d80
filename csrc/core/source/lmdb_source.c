/* fastload core: LMDB sample store (see lmdb_source.h). */
#include "core/source/lmdb_source.h"

#include "core/memory/bus_guard.h"
#include "core/status.h"

#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Opens the environment; with_lock 0 adds MDB_NOLOCK. */
static int open_env(MDB_env **env, const char *path, unsigned flags)
{
    int rc = mdb_env_create(env);
    if (rc != MDB_SUCCESS)
        return rc;
    rc = mdb_env_set_maxdbs(*env, 64);
    if (rc == MDB_SUCCESS)
        rc = mdb_env_open(*env, path, flags, 0644);
    if (rc != MDB_SUCCESS) {
        mdb_env_close(*env);
        *env = NULL;
    }
    return rc;
}

int fl_lmdb_open(fl_lmdb_source *src, const char *path, const char *db, char *msg,
                 size_t msg_size)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fl_set_msg(msg, msg_size, "cannot open LMDB %s: %s", path, strerror(errno));
        return FL_ERR_IO;
    }
    unsigned flags = MDB_RDONLY | MDB_NOTLS | (S_ISDIR(st.st_mode) ? 0 : MDB_NOSUBDIR);
    MDB_env *env;
    int rc = open_env(&env, path, flags);
    src->no_lock = 0;
    /* A read-only copy (a dataset on a read-only mount, or owned by another
     * user) has no writable lock file; reading without locks is then safe
     * as long as nobody writes, which a dataset being read requires anyway. */
    if (rc == EACCES || rc == EROFS) {
        rc = open_env(&env, path, flags | MDB_NOLOCK);
        src->no_lock = 1;
    }
    if (rc != MDB_SUCCESS) {
        fl_set_msg(msg, msg_size, "cannot open LMDB %s: %s", path, mdb_strerror(rc));
        return rc == MDB_INVALID || rc == MDB_CORRUPTED || rc == MDB_VERSION_MISMATCH
                   ? FL_ERR_DECODE
                   : FL_ERR_IO;
    }
    MDB_txn *txn;
    MDB_dbi dbi;
    rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn);
    if (rc == MDB_SUCCESS) {
        rc = mdb_dbi_open(txn, db, 0, &dbi);
        if (rc == MDB_SUCCESS)
            rc = mdb_txn_commit(txn); /* keeps the handle open for later txns */
        else
            mdb_txn_abort(txn);
    }
    if (rc != MDB_SUCCESS) {
        fl_set_msg(msg, msg_size, "cannot open database %s%s%s of LMDB %s: %s",
                   db ? "'" : "", db ? db : "(default)", db ? "'" : "", path, mdb_strerror(rc));
        mdb_env_close(env);
        return rc == MDB_NOTFOUND ? FL_ERR_IO : FL_ERR_DECODE;
    }
    /* What a read that faults needs: the data file's name, descriptor and
     * size now, and its page size (the two meta pages lead the file). */
    MDB_stat env_stat;
    struct stat data_st;
    int fd = -1;
    size_t len = strlen(path);
    char *data_path = malloc(len + sizeof "/data.mdb");
    if (!data_path || mdb_env_stat(env, &env_stat) != MDB_SUCCESS || mdb_env_get_fd(env, &fd) != MDB_SUCCESS ||
        fstat(fd, &data_st) != 0) {
        int status = data_path ? FL_ERR_IO : FL_ERR_NOMEM;
        fl_set_msg(msg, msg_size, "cannot open LMDB %s: %s", path,
                   data_path ? "cannot inspect its data file" : "out of memory");
        free(data_path);
        mdb_env_close(env);
        return status;
    }
    memcpy(data_path, path, len + 1);
    if (S_ISDIR(st.st_mode))
        memcpy(data_path + len, "/data.mdb", sizeof "/data.mdb");
    src->env = env;
    src->dbi = dbi;
    src->path = path;
    src->data_path = data_path;
    src->data_fd = fd;
    src->data_size = (int64_t)data_st.st_size;
    src->page_size = env_stat.ms_psize;
    return FL_OK;
}

void fl_lmdb_close(fl_lmdb_source *src)
{
    if (src->env)
        mdb_env_close(src->env);
    src->env = NULL;
    free(src->data_path);
    src->data_path = NULL;
}

/* Sample `index`'s key; `digits` holds a decimal key. */
static MDB_val key_of(const fl_lmdb_source *src, int64_t index, char digits[24])
{
    MDB_val key;
    if (src->keys) {
        key.mv_data = (void *)(src->keys + src->key_offsets[index]);
        key.mv_size = (size_t)(src->key_offsets[index + 1] - src->key_offsets[index]);
    } else {
        int n = snprintf(digits, 24, "%" PRId64, index);
        key.mv_data = digits;
        key.mv_size = (size_t)n;
    }
    return key;
}

/* The key as text for a message: printable bytes as they are, others as \xNN. */
static void describe_key(MDB_val key, char *out, size_t out_size)
{
    size_t o = 0;
    const unsigned char *k = key.mv_data;
    for (size_t i = 0; i < key.mv_size && o + 5 < out_size; i++) {
        if (k[i] >= 0x20 && k[i] < 0x7f && k[i] != '\\')
            out[o++] = (char)k[i];
        else
            o += (size_t)snprintf(out + o, out_size - o, "\\x%02x", k[i]);
    }
    out[o] = '\0';
}

/* ---------------------------------------------------------- guarded reads
 *
 * A lookup's read transaction is begun outside the guard: mdb_txn_begin
 * allocates the transaction and takes the reader-table mutex in lock.mdb to
 * register a reader slot, none of which a jump out of it could undo.  What
 * it reads of the data file is the two meta pages at its start: the file's
 * size is looked at first (fstat of liblmdb's descriptor, the file mapped),
 * so a file cut below them is reported instead of read.  (liblmdb does not
 * tell where it maps the file, so the pages cannot be touched under the
 * guard instead: MDB_envinfo's me_mapaddr is the fixed address asked for
 * with MDB_FIXEDMAP, NULL otherwise.)  Only the reads of the map run under
 * the guard (mdb_stat, the mdb_get lookups, copying raw records into their
 * rows: in a read-only transaction they allocate nothing and take no
 * lock), recording how far they got, so that after a fault the caller
 * knows the sample being read; the transaction is then aborted, and the
 * message written, outside the guard. */

typedef struct lookup {
    const fl_lmdb_source *src;
    const int64_t *idx;      /* the samples to look up */
    size_t n;
    char *dst;               /* NULL: look up only; else copy each record here */
    int stat;                /* 1: mdb_stat instead of lookups (into `st`) */
    MDB_stat st;
    MDB_txn *txn;            /* the read transaction once begun (the caller ends it) */
    int rc;                  /* MDB_SUCCESS, or the failing liblmdb call's code */
    volatile size_t done;    /* samples looked up (and copied) so far */
    MDB_val value;           /* the last value looked up */
} lookup;

/* 0 when the data file is cut below its two meta pages, which
 * mdb_txn_begin reads from the map. */
static int meta_pages_there(const fl_lmdb_source *src)
{
    struct stat st;
    if (fstat(src->data_fd, &st) != 0)
        return 1; /* not known: let liblmdb tell */
    return (uint64_t)st.st_size >= 2 * (uint64_t)src->page_size;
}

static void begin_txn(void *arg)
{
    lookup *l = arg;
    l->rc = mdb_txn_begin(l->src->env, NULL, MDB_RDONLY, &l->txn);
}

static void run_lookup(void *arg)
{
    lookup *l = arg;
    const fl_lmdb_source *src = l->src;
    if (l->stat) {
        l->rc = mdb_stat(l->txn, src->dbi, &l->st);
        return;
    }
    for (; l->done < l->n; l->done++) {
        char digits[24];
        MDB_val key = key_of(src, l->idx[l->done], digits);
        l->rc = mdb_get(l->txn, src->dbi, &key, &l->value);
        if (l->rc != MDB_SUCCESS || !l->dst)
            return;
        if (l->value.mv_size != src->value_size)
            return; /* the caller names the key */
        memcpy(l->dst + l->done * src->value_size, l->value.mv_data, src->value_size);
    }
}

/* The message for a bus error at `fault` (NULL: the file was found cut
 * short before reading) while reading what `l` got to. */
static void lookup_fault_msg(const lookup *l, const void *fault, char *msg, size_t msg_size)
{
    char what[64] = "the database's header";
    if (l->n && l->done < l->n)
        snprintf(what, sizeof what, "sample index %" PRId64, l->idx[l->done]);
    const fl_lmdb_source *src = l->src;
    fl_bus_fault_msg(msg, msg_size, src->data_path, src->data_fd, src->data_size, fault, what);
}

/* Begins the lookup's transaction and runs it; on a bus error aborts the
 * transaction and writes the message.  Returns FL_OK (l->txn NULL when the
 * transaction could not begin, with l->rc) or FL_ERR_CHANGED. */
static int guarded_lookup(lookup *l, char *msg, size_t msg_size)
{
    const void *fault = NULL;
    l->txn = NULL;
    l->done = 0;
    if (!meta_pages_there(l->src)) {
        lookup_fault_msg(l, NULL, msg, msg_size);
        return FL_ERR_CHANGED;
    }
    /* The check keeps every cut but one out of mdb_txn_begin: a file cut
     * between it and the begin's read of the meta pages.  That read comes
     * after liblmdb has allocated the transaction and released its reader
     * mutex, so the guard may catch it: the transaction's memory and its
     * reader slot are lost (nothing can free them), not the process. */
    if (fl_guarded(begin_txn, l, &fault) != FL_OK) {
        l->txn = NULL;
        lookup_fault_msg(l, fault, msg, msg_size);
        return FL_ERR_CHANGED;
    }
    if (l->rc != MDB_SUCCESS) {
        l->txn = NULL;
        return FL_OK;
    }
    if (fl_guarded(run_lookup, l, &fault) == FL_OK)
        return FL_OK;
    mdb_txn_abort(l->txn); /* frees its reader slot */
    l->txn = NULL;
    lookup_fault_msg(l, fault, msg, msg_size);
    return FL_ERR_CHANGED;
}

int64_t fl_lmdb_entries(const fl_lmdb_source *src, int *status, char *msg, size_t msg_size)
{
    lookup l = {.src = src, .stat = 1};
    *status = guarded_lookup(&l, msg, msg_size);
    if (*status != FL_OK)
        return -1;
    int rc = l.rc;
    if (l.txn)
        mdb_txn_abort(l.txn);
    if (rc != MDB_SUCCESS) {
        *status = FL_ERR_DECODE;
        fl_set_msg(msg, msg_size, "cannot read LMDB %s: %s", src->path, mdb_strerror(rc));
        return -1;
    }
    return (int64_t)l.st.ms_entries;
}

/* The message for a lookup of sample `index` that ended with liblmdb's
 * `rc` (or, rc MDB_SUCCESS, with a value of the wrong size); returns the
 * status: FL_ERR_IO for a missing key, else FL_ERR_DECODE. */
static int lookup_error(const fl_lmdb_source *src, int64_t index, int rc, size_t got, char *msg,
                        size_t msg_size)
{
    char digits[24], shown[96];
    describe_key(key_of(src, index, digits), shown, sizeof shown);
    if (rc == MDB_SUCCESS) {
        fl_set_msg(msg, msg_size, "LMDB %s: the value of key '%s' (sample %" PRId64
                   ") holds %zu bytes, not the %zu of one record", src->path, shown, index, got,
                   src->value_size);
        return FL_ERR_DECODE;
    }
    if (rc == MDB_NOTFOUND)
        fl_set_msg(msg, msg_size, "LMDB %s has no key '%s' (sample %" PRId64 ")", src->path,
                   shown, index);
    else
        fl_set_msg(msg, msg_size, "LMDB %s: cannot read key '%s' (sample %" PRId64 "): %s",
                   src->path, shown, index, mdb_strerror(rc));
    return rc == MDB_NOTFOUND ? FL_ERR_IO : FL_ERR_DECODE;
}

/* The status of a lookup that ran to its end without a bus error: FL_OK,
 * or its transaction's or first sample's failure with the message. */
static int lookup_status(const lookup *l, char *msg, size_t msg_size)
{
    if (!l->txn) {
        fl_set_msg(msg, msg_size, "LMDB %s: cannot begin a read: %s", l->src->path,
                   mdb_strerror(l->rc));
        return FL_ERR_IO;
    }
    if (l->done == l->n)
        return FL_OK;
    return lookup_error(l->src, l->idx[l->done], l->rc, l->value.mv_size, msg, msg_size);
}

int fl_lmdb_gather(const fl_lmdb_source *src, const int64_t *idx, size_t n, void *dst,
                   int64_t *failed, char *msg, size_t msg_size)
{
    lookup l = {.src = src, .idx = idx, .n = n, .dst = dst};
    int status = guarded_lookup(&l, msg, msg_size);
    if (status == FL_OK)
        status = lookup_status(&l, msg, msg_size);
    if (status != FL_OK)
        *failed = l.done < n ? idx[l.done] : (n ? idx[0] : -1);
    if (l.txn)
        mdb_txn_abort(l.txn);
    return status;
}

int fl_lmdb_read(const fl_lmdb_source *src, int64_t index, fl_lmdb_room_fn room, void *room_ctx,
                 const unsigned char **data, size_t *size, char *msg, size_t msg_size)
{
    lookup l = {.src = src, .idx = &index, .n = 1};
    int status = guarded_lookup(&l, msg, msg_size);
    if (status == FL_OK && !l.txn)
        status = lookup_status(&l, msg, msg_size);
    if (status == FL_OK && l.rc != MDB_SUCCESS)
        status = lookup_error(src, index, l.rc, 0, msg, msg_size);
    if (status == FL_OK) {
        /* The room is made outside the guard (it may allocate); the value
         * stays valid while the transaction is open. */
        size_t bytes = l.value.mv_size;
        unsigned char *copy = room(room_ctx, bytes);
        const void *fault = NULL;
        if (!copy) {
            fl_set_msg(msg, msg_size, "LMDB %s: out of memory for a %zu-byte value", src->path,
                       bytes);
            status = FL_ERR_NOMEM;
        } else if (fl_guarded_copy(copy, l.value.mv_data, bytes, &fault) != FL_OK) {
            char what[48];
            snprintf(what, sizeof what, "sample index %" PRId64, index);
            fl_bus_fault_msg(msg, msg_size, src->data_path, src->data_fd, src->data_size, fault,
                             what);
            status = FL_ERR_CHANGED;
        } else {
            *data = copy;
            *size = bytes;
        }
    }
    if (l.txn)
        mdb_txn_abort(l.txn);
    return status;
}
