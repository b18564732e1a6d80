/* fastload._C: what the CUDA driver (csrc/core/cuda/cuda.c) says, for
 * fastload/cuda.py, and the driver helpers of the CUDA types (upload.c,
 * device_array.c): loading it, raising its errors, stream waits. */
#include "bind/fastload.h"

#include "core/cuda/cuda.h"

const fl_cuda *fl__cuda_driver_or_raise(void)
{
    const char *why = NULL;
    const fl_cuda *cuda = fl_cuda_get(&why);
    if (!cuda)
        PyErr_Format(PyExc_RuntimeError, "CUDA is not available: %s", why);
    return cuda;
}

int fl__cuda_raise(const fl_cuda *cuda, fl_cu_result rc, const char *what, int device)
{
    PyErr_Format(PyExc_RuntimeError, "%s on cuda:%d failed: %s", what, device,
                 fl_cuda_error_string(cuda, rc));
    return -1;
}

int fl__cuda_wait_event(fl_cu_event event, int device, fl_cu_stream stream)
{
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return -1;
    fl_cu_result rc = fl_cuda_enter(cuda, device);
    if (rc == 0) {
        rc = cuda->stream_wait_event(stream, event, 0);
        fl_cuda_leave(cuda);
    }
    return rc != 0 ? fl__cuda_raise(cuda, rc, "cuStreamWaitEvent", device) : 0;
}

PyObject *fl__cuda_driver(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    const char *why = NULL;
    const fl_cuda *cuda;
    Py_BEGIN_ALLOW_THREADS /* dlopen and cuInit can take a while */
    cuda = fl_cuda_get(&why);
    Py_END_ALLOW_THREADS
    if (!cuda)
        return Py_BuildValue("{sOsisz}", "available", Py_False, "device_count", 0, "error", why);
    int count = 0;
    fl_cu_result rc = cuda->device_get_count(&count);
    if (rc != 0)
        return Py_BuildValue("{sOsiss}", "available", Py_False, "device_count", 0, "error",
                             fl_cuda_error_string(cuda, rc));
    return Py_BuildValue("{sOsisz}", "available", count > 0 ? Py_True : Py_False,
                         "device_count", count, "error",
                         count > 0 ? NULL : "the CUDA driver reports no device");
}

PyObject *fl__cuda_pci_bus_id(PyObject *module, PyObject *arg)
{
    (void)module;
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return NULL;
    if (value < 0 || value > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "cuda_pci_bus_id: no device %ld", value);
        return NULL;
    }
    int ordinal = (int)value;
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    char address[64];
    fl_cu_result rc = fl_cuda_pci_bus_id(cuda, ordinal, address, (int)sizeof address);
    if (rc != 0) {
        fl__cuda_raise(cuda, rc, "cuDeviceGetPCIBusId", ordinal);
        return NULL;
    }
    return PyUnicode_FromString(address);
}
