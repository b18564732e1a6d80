/* fastload._C: CudaStream and CudaEvent, the primitives of the upload stage
 * (fastload/loader/upload.py).
 *
 * CudaStream.upload copies a batch's arrays into device slots with one
 * cuMemcpyHtoDAsync each on the stream (non-blocking: it never waits for
 * the legacy default stream), then records one event; the GIL is released
 * throughout.  From page-locked slots the copies are DMA transfers that run
 * while the host goes on.  Every driver call runs inside the device's
 * primary context, the one torch, CuPy and JAX use.
 */
#include "bind/fastload.h"

#include "core/cuda/cuda_memory.h"
#include "core/status.h"

/* ---------------------------------------------------------------- CudaEvent */

static PyObject *CudaEvent_query(CudaEventObject *self, PyObject *unused)
{
    (void)unused;
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    fl_cu_result rc = cuda->event_query(self->event);
    if (rc == FL_CU_ERROR_NOT_READY)
        Py_RETURN_FALSE;
    if (rc != 0)
        return fl__cuda_raise(cuda, rc, "cuEventQuery", self->device), NULL;
    Py_RETURN_TRUE;
}

static PyObject *CudaEvent_synchronize(CudaEventObject *self, PyObject *unused)
{
    (void)unused;
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    fl_cu_result rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cuda->event_synchronize(self->event);
    Py_END_ALLOW_THREADS
    if (rc != 0)
        return fl__cuda_raise(cuda, rc, "cuEventSynchronize", self->device), NULL;
    Py_RETURN_NONE;
}

static void CudaEvent_dealloc(CudaEventObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    const fl_cuda *cuda = fl_cuda_get(NULL); /* NULL in a forked child: nothing to free */
    if (cuda && self->event && fl_cuda_enter(cuda, self->device) == 0) {
        cuda->event_destroy(self->event);
        fl_cuda_leave(cuda);
    }
    type->tp_free(self);
    Py_DECREF(type);
}

static PyMethodDef CudaEvent_methods[] = {
    {"query", (PyCFunction)CudaEvent_query, METH_NOARGS,
     "query()\n--\n\nTrue once the work recorded before the event is done."},
    {"synchronize", (PyCFunction)CudaEvent_synchronize, METH_NOARGS,
     "synchronize()\n--\n\nWaits (GIL released) until the event has completed."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot CudaEvent_slots[] = {
    {Py_tp_doc, "A CUDA event recorded after a batch's uploads (made by CudaStream.upload)."},
    {Py_tp_dealloc, CudaEvent_dealloc},
    {Py_tp_methods, CudaEvent_methods},
    {0, NULL},
};

PyType_Spec fl__CudaEvent_spec = {
    .name = "fastload._C.CudaEvent",
    .basicsize = sizeof(CudaEventObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = CudaEvent_slots,
};

/* --------------------------------------------------------------- CudaStream */

static PyObject *CudaStream_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"device", NULL};
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i:CudaStream", kwlist, &device))
        return NULL;
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    CudaStreamObject *self = (CudaStreamObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->device = device;
    fl_cu_result rc = fl_cuda_enter(cuda, device);
    if (rc == 0) {
        rc = cuda->stream_create(&self->stream, FL_CU_STREAM_NON_BLOCKING);
        fl_cuda_leave(cuda);
    }
    if (rc != 0) {
        self->stream = NULL;
        Py_DECREF(self);
        return fl__cuda_raise(cuda, rc, "creating a stream", device), NULL;
    }
    return (PyObject *)self;
}

static void CudaStream_dealloc(CudaStreamObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    const fl_cuda *cuda = fl_cuda_get(NULL);
    if (cuda && self->stream && fl_cuda_enter(cuda, self->device) == 0) {
        cuda->stream_destroy(self->stream); /* queued work still completes */
        fl_cuda_leave(cuda);
    }
    type->tp_free(self);
    Py_DECREF(type);
}

/* What one upload needs, gathered with the GIL held. */
typedef struct upload_item {
    const void *host;
    size_t bytes;
    fl_slot *slot;
} upload_item;

/* Enqueues the copies and the event; GIL released.  On failure returns the
 * driver's error and sets *failed to the item that failed (-1: the event). */
static fl_cu_result enqueue(const fl_cuda *cuda, CudaStreamObject *self, fl_slot_pool *pool,
                            upload_item *items, Py_ssize_t n, fl_cu_event *event,
                            Py_ssize_t *failed)
{
    fl_cu_result rc = fl_cuda_enter(cuda, self->device);
    if (rc != 0) {
        *failed = -1;
        return rc;
    }
    for (Py_ssize_t i = 0; i < n && rc == 0; i++) {
        *failed = i;
        if (fl_slot_acquire(pool, items[i].bytes, &items[i].slot) != FL_OK) {
            /* Idle buffers of other sizes may be what fills the device. */
            fl_slot_pool_trim(pool);
            if (fl_slot_acquire(pool, items[i].bytes, &items[i].slot) != FL_OK) {
                rc = fl_cuda_alloc_error();
                if (rc == 0)
                    rc = FL_CU_ERROR_OUT_OF_MEMORY;
                break;
            }
        }
        rc = fl_cuda_after_fence(cuda, items[i].slot, self->stream);
        if (rc == 0 && items[i].bytes)
            rc = cuda->memcpy_htod_async(fl_cuda_slot_address(items[i].slot), items[i].host,
                                         items[i].bytes, self->stream);
    }
    if (rc == 0) {
        *failed = -1;
        rc = cuda->event_create(event, FL_CU_EVENT_DISABLE_TIMING);
        if (rc == 0 && (rc = cuda->event_record(*event, self->stream)) != 0)
            cuda->event_destroy(*event);
    }
    if (rc != 0) {
        /* Copies already queued read host memory the caller still holds;
         * let them finish before the slots can be reused. */
        cuda->stream_synchronize(self->stream);
        for (Py_ssize_t i = 0; i < n; i++)
            fl_slot_release(items[i].slot);
    }
    fl_cuda_leave(cuda);
    return rc;
}

static PyObject *CudaStream_upload(CudaStreamObject *self, PyObject *const *args,
                                   Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "upload(arrays, pool) takes 2 arguments");
        return NULL;
    }
    fastload_state *state = fl__state_of_type(Py_TYPE(self));
    if (!PyObject_TypeCheck(args[1], state->SlotPool_type)) {
        PyErr_SetString(PyExc_TypeError, "upload: pool must be a SlotPool");
        return NULL;
    }
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    PyObject *arrays = PySequence_Tuple(args[0]); /* holds the arrays during the copies */
    if (!arrays)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(arrays);
    upload_item *items = PyMem_Calloc(n ? (size_t)n : 1, sizeof *items);
    PyObject *out = NULL, *event_obj = NULL;
    if (!items) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(arrays, i);
        if (!PyArray_Check(a) || !PyArray_IS_C_CONTIGUOUS((PyArrayObject *)a)) {
            PyErr_Format(PyExc_TypeError, "upload: item %zd is not a C-contiguous NumPy array",
                         i);
            goto done;
        }
        items[i].host = PyArray_DATA((PyArrayObject *)a);
        items[i].bytes = (size_t)PyArray_NBYTES((PyArrayObject *)a);
    }
    fl_cu_event event = NULL;
    Py_ssize_t failed = -1;
    fl_cu_result rc;
    fl_slot_pool *pool = ((SlotPoolObject *)args[1])->pool;
    Py_BEGIN_ALLOW_THREADS
    rc = enqueue(cuda, self, pool, items, n, &event, &failed);
    Py_END_ALLOW_THREADS
    if (rc == FL_CU_ERROR_OUT_OF_MEMORY && failed >= 0) {
        PyErr_Format(PyExc_MemoryError,
                     "CUDA out of memory: cannot allocate %zu bytes on cuda:%d for batch "
                     "array %zd (%s)", items[failed].bytes, self->device, failed,
                     fl_cuda_error_string(cuda, rc));
        goto done;
    }
    if (rc != 0) {
        fl__cuda_raise(cuda, rc, failed >= 0 ? "uploading a batch" : "recording an event",
                       self->device);
        goto done;
    }
    /* PyObject_New also takes the instance's reference to its heap type. */
    CudaEventObject *ev = PyObject_New(CudaEventObject, state->CudaEvent_type);
    if (!ev) {
        /* Nobody can wait for the copies now: finish them here. */
        Py_BEGIN_ALLOW_THREADS
        cuda->event_synchronize(event);
        if (fl_cuda_enter(cuda, self->device) == 0) {
            cuda->event_destroy(event);
            fl_cuda_leave(cuda);
        }
        Py_END_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n; i++)
            fl_slot_release(items[i].slot);
        goto done;
    }
    ev->event = event;
    ev->device = self->device;
    event_obj = (PyObject *)ev;
    PyObject *list = PyList_New(n);
    if (!list) {
        for (Py_ssize_t i = 0; i < n; i++)
            fl_slot_release(items[i].slot);
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(arrays, i);
        PyObject *d = fl__DeviceArray_new(state, items[i].slot, self->device, PyArray_DESCR(a),
                                          PyArray_NDIM(a), PyArray_DIMS(a), event_obj,
                                          (PyObject *)self);
        items[i].slot = NULL; /* owned by the DeviceArray (or released) now */
        if (!d) {
            for (Py_ssize_t j = i + 1; j < n; j++)
                fl_slot_release(items[j].slot);
            Py_DECREF(list);
            goto done;
        }
        PyList_SET_ITEM(list, i, d);
    }
    out = Py_BuildValue("(NO)", list, event_obj);
done:
    Py_XDECREF(event_obj);
    PyMem_Free(items);
    Py_DECREF(arrays);
    return out;
}

static PyObject *CudaStream_synchronize(CudaStreamObject *self, PyObject *unused)
{
    (void)unused;
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda)
        return NULL;
    fl_cu_result rc = fl_cuda_enter(cuda, self->device);
    if (rc == 0) {
        Py_BEGIN_ALLOW_THREADS
        rc = cuda->stream_synchronize(self->stream);
        Py_END_ALLOW_THREADS
        fl_cuda_leave(cuda);
    }
    if (rc != 0)
        return fl__cuda_raise(cuda, rc, "cuStreamSynchronize", self->device), NULL;
    Py_RETURN_NONE;
}

static PyObject *CudaStream_get_handle(CudaStreamObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->stream);
}

static PyObject *CudaStream_get_device(CudaStreamObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->device);
}

static PyMethodDef CudaStream_methods[] = {
    {"upload", (PyCFunction)(void (*)(void))CudaStream_upload, METH_FASTCALL,
     "upload(arrays, pool)\n--\n\n"
     "Copies each C-contiguous array into a device slot of `pool` (a\n"
     "SlotPool(memory='device')) on this stream and records an event after\n"
     "them.  Returns ([DeviceArray, ...], CudaEvent).  The host arrays must\n"
     "stay alive until the event completes."},
    {"synchronize", (PyCFunction)CudaStream_synchronize, METH_NOARGS,
     "synchronize()\n--\n\nWaits (GIL released) until the stream's work is done."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef CudaStream_getset[] = {
    {"handle", (getter)CudaStream_get_handle, NULL, "the CUstream, as an int", NULL},
    {"device", (getter)CudaStream_get_device, NULL, "the device ordinal", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot CudaStream_slots[] = {
    {Py_tp_doc, "CudaStream(device)\n--\n\n"
                "A non-blocking stream in the device's primary context, owned by one\n"
                "upload stage."},
    {Py_tp_new, CudaStream_new},
    {Py_tp_dealloc, CudaStream_dealloc},
    {Py_tp_methods, CudaStream_methods},
    {Py_tp_getset, CudaStream_getset},
    {0, NULL},
};

PyType_Spec fl__CudaStream_spec = {
    .name = "fastload._C.CudaStream",
    .basicsize = sizeof(CudaStreamObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = CudaStream_slots,
};
