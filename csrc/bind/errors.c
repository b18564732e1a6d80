/* fastload._C: raising and carrying exceptions — the error helpers every
 * binding file may use (declared in fastload.h).  They call nothing else of
 * the binding. */
#include "bind/fastload.h"

PyObject *fl__take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb && value)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

void fl__raise_exception(PyObject *exc)
{
    if (!exc)
        return;
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyObject *type = (PyObject *)Py_TYPE(exc);
    Py_INCREF(type);
    PyErr_Restore(type, exc, PyException_GetTraceback(exc));
#endif
}

int fl__index_error(long long index, int64_t count)
{
    PyErr_Format(PyExc_IndexError, "index %lld is out of range for a dataset of %lld samples",
                 index, (long long)count);
    return -1;
}
