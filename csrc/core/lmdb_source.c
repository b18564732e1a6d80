/* fastload core: LMDB sample store (see lmdb_source.h). */
#include "lmdb_source.h"

#include "status.h"

#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
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
    src->env = env;
    src->dbi = dbi;
    src->path = path;
    return FL_OK;
}

void fl_lmdb_close(fl_lmdb_source *src)
{
    if (src->env)
        mdb_env_close(src->env);
    src->env = NULL;
}

int64_t fl_lmdb_entries(const fl_lmdb_source *src, char *msg, size_t msg_size)
{
    MDB_txn *txn;
    MDB_stat st;
    int rc = mdb_txn_begin(src->env, NULL, MDB_RDONLY, &txn);
    if (rc == MDB_SUCCESS) {
        rc = mdb_stat(txn, src->dbi, &st);
        mdb_txn_abort(txn);
    }
    if (rc != MDB_SUCCESS) {
        fl_set_msg(msg, msg_size, "cannot read LMDB %s: %s", src->path, mdb_strerror(rc));
        return -1;
    }
    return (int64_t)st.ms_entries;
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

static int get_value(const fl_lmdb_source *src, MDB_txn *txn, int64_t index, MDB_val *value,
                     char *msg, size_t msg_size)
{
    char digits[24], shown[96];
    MDB_val key = key_of(src, index, digits);
    int rc = mdb_get(txn, src->dbi, &key, value);
    if (rc == MDB_SUCCESS) {
        if (src->value_size && value->mv_size != src->value_size) {
            describe_key(key, shown, sizeof shown);
            fl_set_msg(msg, msg_size, "LMDB %s: the value of key '%s' (sample %" PRId64
                       ") holds %zu bytes, not the %zu of one record", src->path, shown, index,
                       value->mv_size, src->value_size);
            return FL_ERR_DECODE;
        }
        return FL_OK;
    }
    describe_key(key, shown, sizeof shown);
    if (rc == MDB_NOTFOUND)
        fl_set_msg(msg, msg_size, "LMDB %s has no key '%s' (sample %" PRId64 ")", src->path,
                   shown, index);
    else
        fl_set_msg(msg, msg_size, "LMDB %s: cannot read key '%s' (sample %" PRId64 "): %s",
                   src->path, shown, index, mdb_strerror(rc));
    return rc == MDB_NOTFOUND ? FL_ERR_IO : FL_ERR_DECODE;
}

/* Begins a read transaction.  Returns FL_OK, or FL_ERR_IO with a message. */
static int begin_read(const fl_lmdb_source *src, MDB_txn **txn, char *msg, size_t msg_size)
{
    int rc = mdb_txn_begin(src->env, NULL, MDB_RDONLY, txn);
    if (rc == MDB_SUCCESS)
        return FL_OK;
    fl_set_msg(msg, msg_size, "LMDB %s: cannot begin a read: %s", src->path, mdb_strerror(rc));
    return FL_ERR_IO;
}

int fl_lmdb_gather(const fl_lmdb_source *src, const int64_t *idx, size_t n, void *dst,
                   int64_t *failed, char *msg, size_t msg_size)
{
    MDB_txn *txn;
    if (begin_read(src, &txn, msg, msg_size) != FL_OK) {
        *failed = n ? idx[0] : -1;
        return FL_ERR_IO;
    }
    int status = FL_OK;
    for (size_t p = 0; p < n; p++) {
        MDB_val value;
        status = get_value(src, txn, idx[p], &value, msg, msg_size);
        if (status != FL_OK) {
            *failed = idx[p];
            break;
        }
        memcpy((char *)dst + p * src->value_size, value.mv_data, src->value_size);
    }
    mdb_txn_abort(txn);
    return status;
}

int fl_lmdb_read(const fl_lmdb_source *src, int64_t index, fl_lmdb_room_fn room, void *room_ctx,
                 const unsigned char **data, size_t *size, char *msg, size_t msg_size)
{
    MDB_txn *txn;
    if (begin_read(src, &txn, msg, msg_size) != FL_OK)
        return FL_ERR_IO;
    MDB_val value;
    int status = get_value(src, txn, index, &value, msg, msg_size);
    if (status == FL_OK) {
        unsigned char *copy = room(room_ctx, value.mv_size);
        if (copy) {
            if (value.mv_size)
                memcpy(copy, value.mv_data, value.mv_size);
            *data = copy;
            *size = value.mv_size;
        } else {
            fl_set_msg(msg, msg_size, "LMDB %s: out of memory for a %zu-byte value", src->path,
                       value.mv_size);
            status = FL_ERR_NOMEM;
        }
    }
    mdb_txn_abort(txn);
    return status;
}
