/* fastload._C.tar_index: the index of a tar shard (csrc/core/source/tar.c) as
 * Python objects; tar_read: the bytes of its small members (the labels).
 *
 * The file is opened, read and grouped with the GIL released; only the
 * results are converted with it.  Errors name the shard: OSError (the
 * errno's subclass) when the file cannot be opened or read, MemoryError, or
 * fastload.DecodeError (an OSError) when the bytes are not a tar archive
 * fastload accepts, the message naming the member and offset concerned.
 */
#include "bind/fastload.h"

#include "core/source/squashfs_read.h"
#include "core/source/tar.h"
#include "core/status.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

/* A new int64 array holding a copy of data[0..n). */
static PyObject *int64_array(const int64_t *data, size_t n)
{
    npy_intp dims[1] = {(npy_intp)n};
    PyObject *array = PyArray_SimpleNew(1, dims, NPY_INT64);
    if (array && n)
        memcpy(PyArray_DATA((PyArrayObject *)array), data, n * sizeof(int64_t));
    return array;
}

static void raise_tar_error(PyObject *module, PyObject *path, int status,
                            const fl_tar_error *error)
{
    PyObject *msg = PyUnicode_DecodeUTF8(error->msg, (Py_ssize_t)strlen(error->msg),
                                         "backslashreplace");
    if (!msg)
        return;
    if (status == FL_ERR_IO && error->err != 0) {
        /* OSError(errno, text, filename): the errno's subclass, naming the file. */
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iOO", error->err, msg, path);
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
    } else if (status == FL_ERR_NOMEM) {
        PyErr_Format(PyExc_MemoryError, "%U: %U", path, msg);
    } else if (status == FL_ERR_IO) {
        PyErr_Format(PyExc_OSError, "%U: %U", path, msg);
    } else {
        PyErr_Format(fl__state_of_module(module)->DecodeError, "%U: %U", path, msg);
    }
    Py_DECREF(msg);
}

static int add_array(PyObject *dict, const char *key, const int64_t *data, size_t n)
{
    PyObject *array = int64_array(data, n);
    if (!array)
        return -1;
    int rc = PyDict_SetItemString(dict, key, array);
    Py_DECREF(array);
    return rc;
}

static PyObject *index_dict(const fl_tar_index *index, const fl_tar_samples *samples, int group)
{
    PyObject *dict = PyDict_New();
    if (!dict)
        return NULL;
    PyObject *names = PyBytes_FromStringAndSize(index->names ? index->names : "",
                                                (Py_ssize_t)index->names_size);
    if (!names || PyDict_SetItemString(dict, "names", names) < 0 ||
        add_array(dict, "name_offsets", index->name_offsets, index->count) < 0 ||
        add_array(dict, "offsets", index->data_offsets, index->count) < 0 ||
        add_array(dict, "sizes", index->sizes, index->count) < 0 ||
        (group && (add_array(dict, "key_lengths", samples->key_lengths, index->count) < 0 ||
                   add_array(dict, "sample_members", samples->members, samples->n_members) < 0 ||
                   add_array(dict, "sample_starts", samples->starts, samples->n_samples + 1) <
                       0))) {
        Py_XDECREF(names);
        Py_DECREF(dict);
        return NULL;
    }
    Py_DECREF(names);
    return dict;
}

/* fl_sqfs_read_range's room for a whole shard: malloc, ours to free. */
static unsigned char *shard_room(void *ctx, size_t size)
{
    unsigned char **buf = ctx;
    *buf = malloc(size ? size : 1);
    return *buf;
}

/* Indexes a shard inside a SquashFS image: read whole into memory (an image
 * offers no descriptor to read headers through; the index file spares the
 * read the next time). */
static int index_in_image(const char *file, size_t image_len, fl_tar_index *index,
                          fl_tar_error *error)
{
    unsigned char *buf = NULL; /* ours: freed below */
    const unsigned char *data = NULL;
    size_t size = 0;
    int status = fl_sqfs_read_range(file, image_len, 0, FL_TO_END, SIZE_MAX, shard_room, &buf,
                                    &data, &size, &error->err, error->msg, sizeof error->msg);
    if (status == FL_OK)
        status = fl_tar_index_memory(data, size, index, error);
    free(buf);
    return status;
}

PyObject *fl__tar_index(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "tar_index() takes 1 or 2 arguments (%zd given)", nargs);
        return NULL;
    }
    int group = 1;
    if (nargs == 2 && (group = PyObject_IsTrue(args[1])) < 0)
        return NULL;
    PyObject *encoded = NULL, *path = NULL, *result = NULL;
    if (!PyUnicode_FSConverter(args[0], &encoded) || !PyUnicode_FSDecoder(args[0], &path))
        goto done;

    const char *file = PyBytes_AS_STRING(encoded);
    fl_tar_index index;
    fl_tar_samples samples;
    fl_tar_error error;
    fl_tar_index_init(&index);
    fl_tar_samples_init(&samples);
    int status = FL_OK, open_errno = 0;
    Py_BEGIN_ALLOW_THREADS
    size_t image_len = fl_sqfs_image_part(file);
    int fd = image_len ? -1 : open(file, O_RDONLY | O_CLOEXEC);
    if (image_len) {
        status = index_in_image(file, image_len, &index, &error);
        if (status == FL_OK && group)
            status = fl_tar_group(&index, &samples, &error);
    } else if (fd < 0) {
        open_errno = errno;
    } else {
        status = fl_tar_index_fd(fd, 0, &index, &error);
        if (status == FL_OK && group)
            status = fl_tar_group(&index, &samples, &error);
        close(fd);
    }
    Py_END_ALLOW_THREADS

    if (open_errno) {
        errno = open_errno;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
    } else if (status != FL_OK) {
        raise_tar_error(module, path, status, &error);
    } else {
        result = index_dict(&index, &samples, group);
    }
    fl_tar_samples_free(&samples);
    fl_tar_index_free(&index);
done:
    Py_XDECREF(encoded);
    Py_XDECREF(path);
    return result;
}

/* Member i's bytes, read into out + at[i]; GIL released.  Returns 0, or the
 * errno (EIO for a member past the end of the file, *bad naming it). */
static int read_members(int fd, const int64_t *offsets, const int64_t *sizes, Py_ssize_t n,
                        char *out, Py_ssize_t *bad)
{
    size_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t done = 0, size = (size_t)sizes[i];
        while (done < size) {
            ssize_t got = pread(fd, out + at + done, size - done, (off_t)(offsets[i] + done));
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                *bad = i;
                return got < 0 ? errno : EIO;
            }
            done += (size_t)got;
        }
        at += size;
    }
    return 0;
}

/* fl_sqfs_read_range's room for a member: the place in the output. */
static unsigned char *fixed_room(void *ctx, size_t size)
{
    (void)size;
    return ctx;
}

/* Member i's bytes from a shard inside a SquashFS image, as read_members
 * does.  Returns FL_OK or the core's status, with *err and msg. */
static int read_members_in_image(const char *file, size_t image_len, const int64_t *offsets,
                                 const int64_t *sizes, Py_ssize_t n, char *out, int *err,
                                 char *msg, size_t msg_size)
{
    size_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *data = NULL;
        size_t got = 0;
        int status = fl_sqfs_read_range(file, image_len, (uint64_t)offsets[i],
                                        (uint64_t)sizes[i], 4096, fixed_room, out + at, &data,
                                        &got, err, msg, msg_size);
        if (status != FL_OK)
            return status;
        at += (size_t)sizes[i];
    }
    return FL_OK;
}

PyObject *fl__tar_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "tar_read() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *encoded = NULL, *path = NULL, *result = NULL;
    PyArrayObject *offsets = NULL, *sizes = NULL;
    if (!PyUnicode_FSConverter(args[0], &encoded) || !PyUnicode_FSDecoder(args[0], &path))
        goto done;
    offsets = (PyArrayObject *)PyArray_FROMANY(args[1], NPY_INT64, 1, 1, NPY_ARRAY_CARRAY_RO);
    sizes = offsets ? (PyArrayObject *)PyArray_FROMANY(args[2], NPY_INT64, 1, 1,
                                                       NPY_ARRAY_CARRAY_RO)
                    : NULL;
    if (!sizes)
        goto done;
    Py_ssize_t n = PyArray_DIM(offsets, 0);
    if (PyArray_DIM(sizes, 0) != n) {
        PyErr_SetString(PyExc_ValueError, "tar_read: offsets and sizes differ in length");
        goto done;
    }
    const int64_t *at = PyArray_DATA(offsets), *size = PyArray_DATA(sizes);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (at[i] < 0 || size[i] < 0 || size[i] > 4096) {
            PyErr_Format(PyExc_ValueError, "tar_read: member %zd has offset %lld and size %lld "
                         "(sizes up to 4096 bytes)", i, (long long)at[i], (long long)size[i]);
            goto done;
        }
        total += (Py_ssize_t)size[i]; /* at most 4096 * n: no overflow */
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (!result)
        goto done;
    const char *file = PyBytes_AS_STRING(encoded);
    char *out = PyBytes_AS_STRING(result);
    int err = 0;
    Py_ssize_t bad = -1;
    int image_status = FL_OK;
    char image_msg[512];
    Py_BEGIN_ALLOW_THREADS
    size_t image_len = fl_sqfs_image_part(file);
    int fd = image_len ? -1 : open(file, O_RDONLY | O_CLOEXEC);
    if (image_len) {
        image_status = read_members_in_image(file, image_len, at, size, n, out, &err,
                                             image_msg, sizeof image_msg);
    } else if (fd < 0) {
        err = errno;
    } else {
        err = read_members(fd, at, size, n, out, &bad);
        close(fd);
    }
    Py_END_ALLOW_THREADS
    if (image_status != FL_OK) {
        Py_CLEAR(result);
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "isO", err ? err : EIO, image_msg,
                                              path);
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        goto done;
    }
    if (err == EIO && bad >= 0) {
        /* OSError(EIO, ...), as for any file cut under the loader. */
        Py_CLEAR(result);
        PyObject *msg = PyUnicode_FromFormat(
            "file changed under the loader: %R is shorter than when it was indexed (member "
            "%zd: %lld bytes at offset %lld)", path, bad, (long long)size[bad],
            (long long)at[bad]);
        PyObject *exc = msg ? PyObject_CallFunction(PyExc_OSError, "iN", EIO, msg) : NULL;
        if (exc) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
    } else if (err) {
        Py_CLEAR(result);
        errno = err;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
    }
done:
    Py_XDECREF(offsets);
    Py_XDECREF(sizes);
    Py_XDECREF(encoded);
    Py_XDECREF(path);
    return result;
}
