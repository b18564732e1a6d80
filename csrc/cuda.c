/* fastload._C: what the CUDA driver (csrc/core/cuda.c) says, for
 * fastload/cuda.py. */
#include "fastload.h"

#include "core/cuda.h"

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
