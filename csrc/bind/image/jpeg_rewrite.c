/* fastload._C: add_restart_markers(), the binding of
 * csrc/core/image/jpeg_transcode.h.  The rewrite runs with the GIL released,
 * reading the caller's bytes object in place: bytes are immutable, and the
 * caller's reference keeps it alive for the call.
 */
#include "bind/fastload.h"

#include "core/image/jpeg_transcode.h"
#include "core/status.h"

#include <stdlib.h>

PyObject *fl__add_restart_markers(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "add_restart_markers(data: bytes, max_interval: int, "
                                         "optimize: bool, max_pixels: int)");
        return NULL;
    }
    long max_interval = PyLong_AsLong(args[1]);
    if (max_interval == -1 && PyErr_Occurred())
        return NULL;
    if (max_interval < 0 || max_interval > 65535) {
        PyErr_SetString(PyExc_ValueError, "max_interval must be from 0 to 65535");
        return NULL;
    }
    int optimize = PyObject_IsTrue(args[2]);
    if (optimize < 0)
        return NULL;
    unsigned long long max_pixels = PyLong_AsUnsignedLongLong(args[3]);
    if (max_pixels == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    size_t size = (size_t)PyBytes_GET_SIZE(args[0]);
    unsigned char *out = NULL; /* owned by us until copied into the result */
    size_t out_size = 0;
    int interval = 0;
    char msg[256];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_jpeg_add_restarts(data, size, (int)max_interval, optimize, (uint64_t)max_pixels, &out,
                              &out_size, &interval, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc != FL_OK) {
        fastload_state *state = fl__state_of_module(module);
        if (rc == FL_ERR_NOMEM)
            PyErr_Format(PyExc_MemoryError, "add_restart_markers: %s", msg);
        else if (rc == FL_ERR_INVALID)
            PyErr_Format(PyExc_ValueError, "add_restart_markers: %s", msg);
        else
            PyErr_Format(state->DecodeError, "add_restart_markers: %s", msg);
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)out_size);
    free(out);
    if (!bytes)
        return NULL;
    return Py_BuildValue("(Ni)", bytes, interval);
}
