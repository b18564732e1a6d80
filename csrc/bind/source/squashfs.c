/* fastload._C.squashfs_*: paths inside SquashFS images from Python
 * (csrc/core/source/squashfs_read.h): recognise one, stat it, list a
 * folder, read a file.  The image is read with the GIL released; errors are
 * OSError (the errno's subclass: FileNotFoundError, NotADirectoryError, ...)
 * whose filename is the whole path and whose message names the image and
 * the inner path.
 */
#include "bind/fastload.h"

#include "core/source/squashfs_read.h"
#include "core/status.h"

#include <errno.h>
#include <stdlib.h>

/* OSError(err, msg, path) for a failed core call. */
static void raise_sqfs_error(PyObject *path, int status, int err, const char *msg)
{
    if (status == FL_ERR_NOMEM) {
        PyErr_Format(PyExc_MemoryError, "%s", msg);
        return;
    }
    PyObject *text = PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "backslashreplace");
    if (!text)
        return;
    PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iNO", err ? err : EIO, text, path);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

/* The path as bytes (*encoded, a new reference) and its image part's length;
 * -1 with an exception, 0 with ValueError when it lies in no image. */
static int image_path(PyObject *arg, PyObject **encoded, PyObject **decoded, size_t *image_len)
{
    *encoded = *decoded = NULL;
    if (!PyUnicode_FSConverter(arg, encoded) || !PyUnicode_FSDecoder(arg, decoded))
        return -1;
    const char *path = PyBytes_AS_STRING(*encoded);
    Py_BEGIN_ALLOW_THREADS
    *image_len = fl_sqfs_image_part(path);
    Py_END_ALLOW_THREADS
    if (*image_len == 0) {
        PyErr_Format(PyExc_ValueError, "%R is not a path inside a SquashFS image "
                     "('<image>:/<inner path>')", *decoded);
        return -1;
    }
    return 0;
}

PyObject *fl__squashfs_split(PyObject *module, PyObject *arg)
{
    (void)module;
    PyObject *encoded = NULL, *result = NULL;
    if (!PyUnicode_FSConverter(arg, &encoded))
        return NULL;
    const char *path = PyBytes_AS_STRING(encoded);
    size_t image_len;
    Py_BEGIN_ALLOW_THREADS
    image_len = fl_sqfs_image_part(path);
    Py_END_ALLOW_THREADS
    if (image_len == 0) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *image = PyUnicode_DecodeFSDefaultAndSize(path, (Py_ssize_t)image_len);
        PyObject *inner = image ? PyUnicode_DecodeFSDefault(path + image_len + 1) : NULL;
        if (inner)
            result = PyTuple_Pack(2, image, inner);
        Py_XDECREF(image);
        Py_XDECREF(inner);
    }
    Py_DECREF(encoded);
    return result;
}

PyObject *fl__squashfs_stat(PyObject *module, PyObject *arg)
{
    (void)module;
    PyObject *encoded, *decoded, *result = NULL;
    size_t image_len;
    if (image_path(arg, &encoded, &decoded, &image_len) == 0) {
        fl_sqfs_stat st;
        char msg[512];
        int err = 0, status;
        const char *path = PyBytes_AS_STRING(encoded);
        Py_BEGIN_ALLOW_THREADS
        status = fl_sqfs_stat_path(path, image_len, &st, &err, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        if (status != FL_OK)
            raise_sqfs_error(decoded, status, err, msg);
        else
            result = Py_BuildValue("(iIKL)", st.kind, (unsigned int)st.mode,
                                   (unsigned long long)st.size, (long long)st.mtime);
    }
    Py_XDECREF(encoded);
    Py_XDECREF(decoded);
    return result;
}

PyObject *fl__squashfs_listdir(PyObject *module, PyObject *arg)
{
    (void)module;
    PyObject *encoded, *decoded, *result = NULL, *names = NULL, *kinds = NULL;
    size_t image_len;
    if (image_path(arg, &encoded, &decoded, &image_len) == 0) {
        fl_sqfs_listing listing;
        char msg[512];
        int err = 0, status;
        const char *path = PyBytes_AS_STRING(encoded);
        Py_BEGIN_ALLOW_THREADS
        status = fl_sqfs_list(path, image_len, &listing, &err, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        if (status != FL_OK) {
            raise_sqfs_error(decoded, status, err, msg);
        } else if ((names = PyList_New((Py_ssize_t)listing.count)) &&
                   (kinds = PyBytes_FromStringAndSize((const char *)listing.kinds,
                                                      (Py_ssize_t)listing.count))) {
            const char *at = listing.names;
            Py_ssize_t i = 0;
            for (; i < (Py_ssize_t)listing.count; i++) {
                size_t len = strlen(at);
                PyObject *name = PyBytes_FromStringAndSize(at, (Py_ssize_t)len);
                if (!name)
                    break;
                PyList_SET_ITEM(names, i, name); /* steals the reference */
                at += len + 1;
            }
            if (i == (Py_ssize_t)listing.count)
                result = PyTuple_Pack(2, names, kinds);
        }
        fl_sqfs_listing_free(&listing);
    }
    Py_XDECREF(names);
    Py_XDECREF(kinds);
    Py_XDECREF(encoded);
    Py_XDECREF(decoded);
    return result;
}

/* The room of a read into memory we allocate: *(unsigned char **)ctx. */
static unsigned char *malloc_room(void *ctx, size_t size)
{
    unsigned char **buf = ctx;
    *buf = malloc(size ? size : 1);
    return *buf;
}

PyObject *fl__squashfs_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 1 || nargs > 3) {
        PyErr_Format(PyExc_TypeError, "squashfs_read() takes 1 to 3 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    long long offset = 0, length = -1;
    if ((nargs > 1 && (offset = PyLong_AsLongLong(args[1])) == -1 && PyErr_Occurred()) ||
        (nargs > 2 && (length = PyLong_AsLongLong(args[2])) == -1 && PyErr_Occurred()))
        return NULL;
    if (offset < 0 || length < -1) {
        PyErr_SetString(PyExc_ValueError, "squashfs_read(): offset and length must be >= 0 "
                        "(length -1: to the end)");
        return NULL;
    }
    PyObject *encoded, *decoded, *result = NULL;
    size_t image_len;
    if (image_path(args[0], &encoded, &decoded, &image_len) == 0) {
        unsigned char *buf = NULL; /* ours: freed below */
        const unsigned char *data = NULL;
        size_t size = 0;
        char msg[512];
        int err = 0, status;
        const char *path = PyBytes_AS_STRING(encoded);
        Py_BEGIN_ALLOW_THREADS
        status = fl_sqfs_read_range(path, image_len, (uint64_t)offset,
                                    length < 0 ? FL_TO_END : (uint64_t)length,
                                    (size_t)PY_SSIZE_T_MAX, malloc_room, &buf, &data, &size,
                                    &err, msg, sizeof msg);
        Py_END_ALLOW_THREADS
        if (status != FL_OK)
            raise_sqfs_error(decoded, status, err, msg);
        else
            result = PyBytes_FromStringAndSize((const char *)data, (Py_ssize_t)size);
        free(buf);
    }
    Py_XDECREF(encoded);
    Py_XDECREF(decoded);
    return result;
}
