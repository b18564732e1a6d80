/* fastload._C.dir_scan, dir_check, dir_samples: ImageFolder's tree listed
 * in C (csrc/core/source/dir_scan.h) and handed to Python compactly.
 *
 * A walk crosses the boundary as a dict of a few bytes objects (names back
 * to back, NUL-terminated) and int64 arrays, never as an object a file:
 * fastload/datasets/folder_index.py keeps it in an index file as it is,
 * and dir_samples turns it into ImageFiles' (paths, offsets) with the
 * extension filter.  The file system is read with the GIL released; the
 * bytes and arrays read without it are held (and immutable) meanwhile.
 */
#include "bind/fastload.h"

#include "core/source/dir_scan.h"
#include "core/status.h"

/* A new int64 array holding a copy of data[0..n), shaped (n / cols, cols)
 * when cols > 1. */
static PyObject *int64_copy(const int64_t *data, size_t n, int cols)
{
    npy_intp dims[2] = {(npy_intp)(n / (size_t)cols), cols};
    PyObject *array = PyArray_SimpleNew(cols > 1 ? 2 : 1, dims, NPY_INT64);
    if (array && n)
        memcpy(PyArray_DATA((PyArrayObject *)array), data, n * sizeof(int64_t));
    return array;
}

static int put(PyObject *dict, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *bytes_of(const char *data, size_t size)
{
    return PyBytes_FromStringAndSize(data ? data : "", (Py_ssize_t)size);
}

static PyObject *raise_status(int status, const char *msg)
{
    if (status == FL_ERR_NOMEM)
        return PyErr_Format(PyExc_MemoryError, "%s", msg);
    if (status == FL_ERR_INVALID)
        return PyErr_Format(PyExc_ValueError, "%s", msg);
    return PyErr_Format(PyExc_RuntimeError, "%s", msg);
}

PyObject *fl__dir_scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4 || !PyBytes_Check(args[0]) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "dir_scan(prefix: bytes, tops: list of bytes, threads, racy_after_ns)");
        return NULL;
    }
    int threads;
    long long racy_after = PyLong_AsLongLong(args[3]);
    if (fl__as_int(args[2], &threads) < 0 || (racy_after == -1 && PyErr_Occurred()))
        return NULL;
    PyObject *tops = PySequence_Tuple(args[1]); /* held: the names stay valid */
    if (!tops)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(tops);
    const char **names = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(char *));
    PyObject *result = NULL;
    if (!names) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *top = PyTuple_GET_ITEM(tops, i);
        if (!PyBytes_Check(top) || strlen(PyBytes_AS_STRING(top)) != (size_t)PyBytes_GET_SIZE(top)) {
            PyErr_SetString(PyExc_TypeError, "dir_scan: each top is bytes without a NUL");
            goto done;
        }
        names[i] = PyBytes_AS_STRING(top);
    }
    const char *prefix = PyBytes_AS_STRING(args[0]);
    fl_dir_walk walk;
    char msg[FL__MSG_SIZE] = "";
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = fl_dir_scan(prefix, names, (size_t)n, threads, (int64_t)racy_after, &walk, msg,
                         sizeof msg);
    Py_END_ALLOW_THREADS
    if (status != FL_OK) {
        raise_status(status, msg);
        goto done;
    }
    result = PyDict_New();
    if (!result || put(result, "top_folders", int64_copy(walk.top_folders, walk.n_tops + 1, 1)) ||
        put(result, "folder_paths", bytes_of(walk.folder_paths, walk.folder_paths_size)) ||
        put(result, "folder_offsets", int64_copy(walk.folder_offsets, walk.n_folders, 1)) ||
        put(result, "folder_files", int64_copy(walk.folder_files, walk.n_folders + 1, 1)) ||
        put(result, "names", bytes_of(walk.names, walk.names_size)) ||
        put(result, "check_paths", bytes_of(walk.check_paths, walk.check_paths_size)) ||
        put(result, "check_offsets", int64_copy(walk.check_offsets, walk.n_checks, 1)) ||
        put(result, "checks",
            int64_copy(walk.checks, walk.n_checks * FL_CHECK_FIELDS, FL_CHECK_FIELDS)) ||
        put(result, "complete", PyBool_FromLong(walk.complete)) ||
        put(result, "dirs_read", PyLong_FromSize_t(walk.dirs_read)))
        Py_CLEAR(result);
    fl_dir_walk_free(&walk);
done:
    PyMem_Free(names);
    Py_DECREF(tops);
    return result;
}

/* ------------------------------------------------ a walk read from a dict */

typedef struct held {
    PyObject *objects[8]; /* strong references keeping the arrays alive */
    int n;
    Py_buffer views[4];   /* the blobs, any buffer (bytes, an index file's mmap) */
    int n_views;
} held;

static void held_release(held *h)
{
    for (int i = 0; i < h->n; i++)
        Py_DECREF(h->objects[i]);
    for (int i = 0; i < h->n_views; i++)
        PyBuffer_Release(&h->views[i]);
    h->n = h->n_views = 0;
}

/* dict[key] as a C-contiguous int64 array of `count` elements (-1: any);
 * its data in *data and its length in *len.  Returns 0 or -1 (raised). */
static int int64_item(PyObject *dict, const char *key, Py_ssize_t count, held *h,
                      int64_t **data, size_t *len)
{
    PyObject *item = PyDict_GetItemString(dict, key); /* borrowed */
    if (!item) {
        PyErr_Format(PyExc_KeyError, "the walk has no %s", key);
        return -1;
    }
    PyObject *array = PyArray_FROMANY(item, NPY_INT64, 0, 2, NPY_ARRAY_IN_ARRAY);
    if (!array)
        return -1;
    h->objects[h->n++] = array;
    Py_ssize_t size = PyArray_SIZE((PyArrayObject *)array);
    if (count >= 0 && size != count) {
        PyErr_Format(PyExc_ValueError, "the walk's %s has %zd values, not %zd", key, size, count);
        return -1;
    }
    *data = PyArray_DATA((PyArrayObject *)array);
    *len = (size_t)size;
    return 0;
}

/* dict[key] as a buffer of bytes (held until held_release). */
static int bytes_item(PyObject *dict, const char *key, held *h, char **data, size_t *len)
{
    PyObject *item = PyDict_GetItemString(dict, key); /* borrowed */
    if (!item) {
        PyErr_Format(PyExc_KeyError, "the walk has no %s", key);
        return -1;
    }
    Py_buffer *view = &h->views[h->n_views];
    if (PyObject_GetBuffer(item, view, PyBUF_SIMPLE) < 0)
        return -1;
    h->n_views++;
    *data = view->buf;
    *len = (size_t)view->len;
    return 0;
}

/* The walk in `dict` (as dir_scan returns it), as views.  Checked: the
 * arrays' lengths agree (fl_dir_samples checks the values). */
static int walk_of(PyObject *dict, fl_dir_walk *w, held *h)
{
    memset(w, 0, sizeof(*w));
    size_t n;
    if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "the walk must be a dict");
        return -1;
    }
    if (int64_item(dict, "top_folders", -1, h, &w->top_folders, &n) < 0)
        return -1;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "the walk's top_folders is empty");
        return -1;
    }
    w->n_tops = n - 1;
    if (int64_item(dict, "folder_offsets", -1, h, &w->folder_offsets, &w->n_folders) < 0 ||
        int64_item(dict, "folder_files", (Py_ssize_t)w->n_folders + 1, h, &w->folder_files, &n) < 0 ||
        bytes_item(dict, "folder_paths", h, &w->folder_paths, &w->folder_paths_size) < 0 ||
        bytes_item(dict, "names", h, &w->names, &w->names_size) < 0)
        return -1;
    /* the names blob holds folder_files[-1] names (fl_dir_samples_room checks) */
    int64_t last = w->folder_files[w->n_folders];
    w->n_names = last > 0 ? (size_t)last : 0;
    return 0;
}

PyObject *fl__dir_samples(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyBytes_Check(args[0]) || (args[2] != Py_None && !PyTuple_Check(args[2]))) {
        PyErr_SetString(PyExc_TypeError,
                        "dir_samples(prefix: bytes, walk: dict, extensions: tuple of bytes or None)");
        return NULL;
    }
    held h = {.n = 0, .n_views = 0};
    fl_dir_walk walk;
    PyObject *result = NULL, *counts = NULL, *paths = NULL, *offsets = NULL;
    const char **exts = NULL;
    size_t *ext_lens = NULL, n_exts = 0;
    int64_t *undecided = NULL;
    char msg[FL__MSG_SIZE] = "";
    int status;
    const char *prefix = PyBytes_AS_STRING(args[0]);
    size_t prefix_len = (size_t)PyBytes_GET_SIZE(args[0]);
    if (strlen(prefix) != prefix_len) {
        PyErr_SetString(PyExc_ValueError, "dir_samples: the prefix contains a NUL");
        return NULL;
    }
    if (walk_of(args[1], &walk, &h) < 0)
        goto done;
    if (args[2] != Py_None) {
        n_exts = (size_t)PyTuple_GET_SIZE(args[2]);
        exts = PyMem_Malloc((n_exts ? n_exts : 1) * sizeof(char *));
        ext_lens = PyMem_Malloc((n_exts ? n_exts : 1) * sizeof(size_t));
        if (!exts || !ext_lens) {
            PyErr_NoMemory();
            goto done;
        }
        for (size_t e = 0; e < n_exts; e++) {
            PyObject *ext = PyTuple_GET_ITEM(args[2], e); /* the tuple holds it */
            if (!PyBytes_Check(ext)) {
                PyErr_SetString(PyExc_TypeError, "dir_samples: each extension is bytes");
                goto done;
            }
            exts[e] = PyBytes_AS_STRING(ext);
            ext_lens[e] = (size_t)PyBytes_GET_SIZE(ext);
        }
    }
    size_t room = 0;
    Py_BEGIN_ALLOW_THREADS
    status = fl_dir_samples_room(prefix_len, &walk, &room, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (status != FL_OK) {
        raise_status(status, msg);
        goto done;
    }
    if (room > PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        goto done;
    }
    npy_intp tops[1] = {(npy_intp)walk.n_tops}, names[1] = {(npy_intp)walk.n_names};
    counts = PyArray_SimpleNew(1, tops, NPY_INT64);
    offsets = PyArray_SimpleNew(1, names, NPY_INT64);
    /* The paths are written straight into the bytes object: nothing else
     * holds it until it is returned, so filling it without the GIL is safe. */
    paths = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)room);
    if (!counts || !offsets || !paths)
        goto done;
    size_t used = 0, n_samples = 0, n_undecided = 0;
    char *out = PyBytes_AS_STRING(paths);
    int64_t *offset_data = PyArray_DATA((PyArrayObject *)offsets);
    int64_t *count_data = PyArray_DATA((PyArrayObject *)counts);
    Py_BEGIN_ALLOW_THREADS
    status = fl_dir_samples(prefix, &walk, exts, ext_lens, exts ? n_exts : 0, out, room, &used,
                            offset_data, &n_samples, count_data, &undecided, &n_undecided, msg,
                            sizeof msg);
    Py_END_ALLOW_THREADS
    if (status != FL_OK) {
        raise_status(status, msg);
        goto done;
    }
    if (used < room && _PyBytes_Resize(&paths, (Py_ssize_t)used) < 0)
        goto done; /* paths is NULL now */
    if (n_samples < walk.n_names) {
        PyObject *kept = int64_copy(offset_data, n_samples, 1);
        if (!kept)
            goto done;
        Py_SETREF(offsets, kept);
    }
    result = Py_BuildValue("(OOON)", paths, offsets, counts, int64_copy(undecided, n_undecided, 1));
done:
    free(undecided);
    Py_XDECREF(paths);
    Py_XDECREF(offsets);
    Py_XDECREF(counts);
    PyMem_Free(exts);
    PyMem_Free(ext_lens);
    held_release(&h);
    return result;
}

PyObject *fl__dir_checksum(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t sum;
    Py_BEGIN_ALLOW_THREADS
    sum = fl_dir_checksum(view.buf, (size_t)view.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong((unsigned long long)sum);
}

PyObject *fl__dir_check(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "dir_check(prefix: bytes, walk: dict, threads)");
        return NULL;
    }
    int threads;
    if (fl__as_int(args[2], &threads) < 0)
        return NULL;
    held h = {.n = 0, .n_views = 0};
    PyObject *result = NULL;
    char *paths;
    size_t paths_size, n, n_fields;
    int64_t *offsets, *checks;
    if (!PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "the walk must be a dict");
        goto done;
    }
    if (int64_item(args[1], "check_offsets", -1, &h, &offsets, &n) < 0 ||
        int64_item(args[1], "checks", (Py_ssize_t)(n * FL_CHECK_FIELDS), &h, &checks, &n_fields) < 0 ||
        bytes_item(args[1], "check_paths", &h, &paths, &paths_size) < 0)
        goto done;
    if (n && (paths_size == 0 || paths[paths_size - 1] != '\0')) {
        PyErr_SetString(PyExc_ValueError, "the walk's check_paths are not NUL-terminated");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (offsets[i] < 0 || (size_t)offsets[i] >= paths_size) {
            PyErr_SetString(PyExc_ValueError, "the walk's check_offsets are out of range");
            goto done;
        }
    }
    const char *prefix = PyBytes_AS_STRING(args[0]);
    int64_t changed = -1;
    size_t reread = 0;
    char msg[FL__MSG_SIZE] = "";
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = fl_dir_check(prefix, paths, offsets, checks, n, threads, &changed, &reread, msg,
                          sizeof msg);
    Py_END_ALLOW_THREADS
    if (status != FL_OK)
        raise_status(status, msg);
    else
        result = Py_BuildValue("(Ln)", (long long)changed, (Py_ssize_t)reread);
done:
    held_release(&h);
    return result;
}
