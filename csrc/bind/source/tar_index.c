/* fastload._C.tar_index: the index of a tar shard (csrc/core/source/tar.c) as
 * Python objects.
 *
 * The file is opened, read and grouped with the GIL released; only the
 * results are converted with it.  Errors name the shard: OSError (the
 * errno's subclass) when the file cannot be opened or read, MemoryError, or
 * fastload.DecodeError (an OSError) when the bytes are not a tar archive
 * fastload accepts, the message naming the member and offset concerned.
 */
#include "bind/fastload.h"

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
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
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
