/* fastload._C: CudaStream and CudaEvent, the primitives of the upload stage
 * (fastload/loader/upload.py).
 *
 * CudaStream.upload takes a host batch as the loader made it (NumPy arrays
 * over its slots, or tensors, in dicts, lists and tuples), copies each array
 * into a device slot with one cuMemcpyHtoDAsync on the stream (non-blocking:
 * it never waits for the legacy default stream), records one event, and
 * returns the same structure over DeviceArrays: one call a batch, the GIL
 * released while the copies are queued.  An array keeps its layout: a dense
 * permutation of C order (a channels_last batch) is copied as the block it
 * is and described by its strides; only a scattered view is made contiguous
 * on the host first.  From page-locked slots the copies are DMA transfers
 * that run while the host goes on, so the stream keeps each host batch until
 * its event completes (and lets go of it on a later call).  Every driver
 * call runs inside the device's primary context, the one torch, CuPy and
 * JAX use.
 */
#include "bind/fastload.h"

#include "core/cuda/cuda_memory.h"
#include "core/cuda/gpu_decode.h"
#include "core/status.h"

#include <string.h>

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
    self->in_flight = PyList_New(0);
    if (!self->in_flight) {
        Py_DECREF(self);
        return NULL;
    }
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

static int CudaStream_traverse(CudaStreamObject *self, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(self));
    Py_VISIT(self->in_flight);
    return 0;
}

/* Lets go of the host batches, once the copies reading them are done. */
static int CudaStream_clear(CudaStreamObject *self)
{
    if (self->in_flight && PyList_GET_SIZE(self->in_flight) > 0) {
        const fl_cuda *cuda = fl_cuda_get(NULL); /* NULL in a forked child: nothing runs */
        if (cuda && self->stream && fl_cuda_enter(cuda, self->device) == 0) {
            Py_BEGIN_ALLOW_THREADS
            cuda->stream_synchronize(self->stream);
            Py_END_ALLOW_THREADS
            fl_cuda_leave(cuda);
        }
        if (PyList_SetSlice(self->in_flight, 0, PyList_GET_SIZE(self->in_flight), NULL) < 0)
            PyErr_WriteUnraisable((PyObject *)self);
    }
    return 0;
}

static void CudaStream_dealloc(CudaStreamObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    CudaStream_clear(self);
    Py_CLEAR(self->in_flight);
    const fl_cuda *cuda = fl_cuda_get(NULL);
    if (cuda && self->stream && fl_cuda_enter(cuda, self->device) == 0) {
        cuda->stream_destroy(self->stream); /* queued work still completes */
        fl_cuda_leave(cuda);
    }
    type->tp_free(self);
    Py_DECREF(type);
}

/* One host array of a batch: where its bytes start, how many, and the
 * layout the device array keeps (strides in elements). */
typedef struct upload_item {
    PyArrayObject *array; /* borrowed: the batch or the call's `kept` list holds it */
    const void *host;
    size_t bytes;
    npy_intp strides[NPY_MAXDIMS]; /* a dense permutation's, unless c_order */
    int c_order;
    fl_slot *slot;
} upload_item;

typedef struct upload_items {
    upload_item *items;
    Py_ssize_t count, capacity;
    PyObject *kept; /* list: arrays made here (tensor views, contiguous copies) */
    PyObject *tensor_type; /* torch.Tensor once torch is imported (fl__tensor_type), or NULL */
} upload_items;

/* Whether `a` covers one dense block of memory in some order of its axes
 * (C order, or a permutation of it such as a channels_last batch); fills
 * the strides in elements. */
static int dense_layout(PyArrayObject *a, npy_intp *strides)
{
    int ndim = PyArray_NDIM(a), order[NPY_MAXDIMS], n = 0;
    const npy_intp *dims = PyArray_DIMS(a), *bytes = PyArray_STRIDES(a);
    npy_intp itemsize = PyArray_ITEMSIZE(a);
    if (PyArray_SIZE(a) == 0 || itemsize == 0)
        return 0;
    for (int i = 0; i < ndim; i++) {
        if (dims[i] == 1)
            continue;
        int j = n++; /* insertion sort: largest stride first */
        while (j > 0 && bytes[order[j - 1]] < bytes[i]) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    npy_intp expected = itemsize;
    for (int k = n - 1; k >= 0; k--) {
        if (bytes[order[k]] != expected)
            return 0;
        strides[order[k]] = expected / itemsize;
        expected *= dims[order[k]];
    }
    npy_intp step = 1; /* a length-1 axis takes its C-order stride */
    for (int i = ndim - 1; i >= 0; i--) {
        if (dims[i] == 1)
            strides[i] = step;
        step *= dims[i];
    }
    return 1;
}

/* Appends the host array behind leaf `obj` (a NumPy array, or a CPU torch
 * tensor, read through its NumPy view); -1 with an exception set. */
static int add_leaf(upload_items *u, PyObject *obj)
{
    PyObject *array = obj;
    if (!PyArray_Check(obj)) { /* a tensor: its NumPy view shares the memory */
        array = PyObject_CallMethod(obj, "numpy", NULL);
        if (!array)
            return -1;
        int kept = PyArray_Check(array) ? PyList_Append(u->kept, array) : -1;
        Py_DECREF(array);
        if (kept < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "upload: Tensor.numpy() gave no array");
            return -1;
        }
    }
    PyArrayObject *a = (PyArrayObject *)array;
    if (PyDataType_REFCHK(PyArray_DESCR(a))) {
        PyErr_Format(PyExc_TypeError, "upload: batch array %zd holds Python objects (dtype %R)",
                     u->count, (PyObject *)PyArray_DESCR(a));
        return -1;
    }
    if (u->count == u->capacity) {
        Py_ssize_t capacity = u->capacity ? 2 * u->capacity : 8;
        upload_item *grown = PyMem_Realloc(u->items, (size_t)capacity * sizeof *grown);
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        u->items = grown;
        u->capacity = capacity;
    }
    upload_item *item = &u->items[u->count];
    memset(item, 0, sizeof *item);
    if (!PyArray_IS_C_CONTIGUOUS(a) && !dense_layout(a, item->strides)) {
        /* Scattered (a slice, say): one contiguous host copy, uploaded as C order. */
        PyObject *copy = PyArray_NewCopy(a, NPY_CORDER);
        if (!copy || PyList_Append(u->kept, copy) < 0) {
            Py_XDECREF(copy);
            return -1;
        }
        Py_DECREF(copy);
        a = (PyArrayObject *)copy;
    }
    item->c_order = PyArray_IS_C_CONTIGUOUS(a); /* DeviceArray gives it C strides itself */
    item->array = a;
    item->host = PyArray_DATA(a);
    item->bytes = (size_t)PyArray_NBYTES(a);
    u->count++;
    return 0;
}

static int is_leaf(const upload_items *u, PyObject *obj)
{
    return PyArray_Check(obj) ||
           (u->tensor_type && PyObject_TypeCheck(obj, (PyTypeObject *)u->tensor_type));
}

/* Collects the batch's arrays in the order rebuild() puts them back: a
 * dict's values in its order, a list's or tuple's items; other objects are
 * not uploaded. */
static int collect(upload_items *u, PyObject *obj)
{
    if (is_leaf(u, obj))
        return add_leaf(u, obj);
    if (!PyDict_Check(obj) && !PyList_Check(obj) && !PyTuple_Check(obj))
        return 0;
    if (Py_EnterRecursiveCall(" while uploading a batch"))
        return -1;
    int rc = 0;
    if (PyDict_Check(obj)) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (rc == 0 && PyDict_Next(obj, &pos, &key, &value))
            rc = collect(u, value);
    } else {
        PyObject *items = PySequence_Fast(obj, "upload");
        for (Py_ssize_t i = 0; items && rc == 0 && i < PySequence_Fast_GET_SIZE(items); i++)
            rc = collect(u, PySequence_Fast_GET_ITEM(items, i));
        rc = items ? rc : -1;
        Py_XDECREF(items);
    }
    Py_LeaveRecursiveCall();
    return rc;
}

/* The batch again, each array replaced by the next of `arrays` (a list);
 * dicts, lists and tuples are rebuilt as their own types (a namedtuple
 * from its fields), anything else is kept as it is. */
static PyObject *rebuild(const upload_items *u, PyObject *obj, PyObject *arrays,
                         Py_ssize_t *next)
{
    if (is_leaf(u, obj))
        return Py_NewRef(PyList_GET_ITEM(arrays, (*next)++));
    if (!PyDict_Check(obj) && !PyList_Check(obj) && !PyTuple_Check(obj))
        return Py_NewRef(obj);
    if (Py_EnterRecursiveCall(" while uploading a batch"))
        return NULL;
    PyObject *out = NULL, *items = NULL;
    if (PyDict_Check(obj)) {
        PyObject *pairs = PyList_New(0), *key, *value;
        Py_ssize_t pos = 0;
        while (pairs && PyDict_Next(obj, &pos, &key, &value)) {
            PyObject *v = rebuild(u, value, arrays, next);
            PyObject *pair = v ? PyTuple_Pack(2, key, v) : NULL;
            Py_XDECREF(v);
            if (!pair || PyList_Append(pairs, pair) < 0)
                Py_CLEAR(pairs);
            Py_XDECREF(pair);
        }
        if (pairs && PyDict_CheckExact(obj)) {
            out = PyDict_New();
            for (Py_ssize_t i = 0; out && i < PyList_GET_SIZE(pairs); i++) {
                PyObject *pair = PyList_GET_ITEM(pairs, i);
                if (PyDict_SetItem(out, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)))
                    Py_CLEAR(out);
            }
        } else if (pairs) {
            out = PyObject_CallOneArg((PyObject *)Py_TYPE(obj), pairs);
        }
        Py_XDECREF(pairs);
        goto done;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(obj); /* a list or a tuple */
    items = PyList_New(n);
    for (Py_ssize_t i = 0; items && i < n; i++) {
        PyObject *v = rebuild(u, PySequence_Fast_GET_ITEM(obj, i), arrays, next);
        if (!v)
            Py_CLEAR(items);
        else
            PyList_SET_ITEM(items, i, v);
    }
    if (!items)
        goto done;
    if (PyList_CheckExact(obj)) {
        out = Py_NewRef(items);
    } else if (PyTuple_CheckExact(obj)) {
        out = PyList_AsTuple(items);
    } else if (PyTuple_Check(obj) && PyObject_HasAttrString(obj, "_fields")) {
        PyObject *args = PyList_AsTuple(items); /* a namedtuple takes its fields */
        out = args ? PyObject_Call((PyObject *)Py_TYPE(obj), args, NULL) : NULL;
        Py_XDECREF(args);
    } else {
        out = PyObject_CallOneArg((PyObject *)Py_TYPE(obj), items);
    }
done:
    Py_XDECREF(items);
    Py_LeaveRecursiveCall();
    return out;
}

/* A batch's GPU part and the stage that decodes it into the batch's first
 * array (the images), after that array's copy. */
typedef struct gpu_work {
    fl_gpu_decode *stage;        /* NULL: no GPU part */
    fl_gpu_batch part;
    size_t rows;                 /* of the images array */
    int status;                  /* fl_gpu_decode_run's */
    fl_gpu_decode_report report;
} gpu_work;

/* Enqueues the copies, the GPU part's decode (when `gpu` has a stage) and
 * the event; GIL released.  On failure returns the driver's error and sets
 * *failed to the item that failed (-1: the event); a GPU stage's failure
 * is FL_CU_ERROR_GPU_STAGE, with its status in gpu->status. */
#define FL_CU_ERROR_GPU_STAGE (-1)
static fl_cu_result enqueue(const fl_cuda *cuda, CudaStreamObject *self, fl_slot_pool *pool,
                            upload_item *items, Py_ssize_t n, gpu_work *gpu,
                            fl_cu_event *event, Py_ssize_t *failed)
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
    if (rc == 0 && gpu->stage) {
        *failed = -1;
        fl_gpu_decode_target target = {
            .images = fl_cuda_slot_address(items[0].slot),
            .row_bytes = gpu->rows ? items[0].bytes / gpu->rows : 0,
            .rows = gpu->rows,
        };
        gpu->status = fl_gpu_decode_run(gpu->stage, &gpu->part, &target, self->stream,
                                        &gpu->report);
        if (gpu->status != FL_OK)
            rc = FL_CU_ERROR_GPU_STAGE;
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
        for (Py_ssize_t i = 0; i < n; i++) {
            fl_slot_release(items[i].slot);
            items[i].slot = NULL;
        }
    }
    fl_cuda_leave(cuda);
    return rc;
}

/* Drops the host batches whose copies are done (all of them after a
 * synchronize: `all`); -1 with an exception set. */
static int release_done(const fl_cuda *cuda, CudaStreamObject *self, int all)
{
    PyObject *in_flight = self->in_flight;
    Py_ssize_t done = 0, n = PyList_GET_SIZE(in_flight);
    while (done < n && !all) {
        CudaEventObject *event = (CudaEventObject *)PyTuple_GET_ITEM(
            PyList_GET_ITEM(in_flight, done), 0);
        fl_cu_result rc = cuda->event_query(event->event);
        if (rc == FL_CU_ERROR_NOT_READY)
            break;
        if (rc != 0)
            return fl__cuda_raise(cuda, rc, "cuEventQuery", self->device);
        done++;
    }
    return PyList_SetSlice(in_flight, 0, all ? n : done, NULL);
}

/* With a decoder, `batch` is a native batch [images, labels, part]: the
 * uploaded batch is [images, labels] (returned in *uploaded, a new
 * reference), the part set up in *gpu.  -1 with an exception set. */
static int split_batch(PyObject *batch, PyObject *decoder, PyObject **uploaded, gpu_work *gpu)
{
    PyArrayObject *images, *part;
    if (!PyList_Check(batch) || PyList_GET_SIZE(batch) != 3 ||
        !PyArray_Check(PyList_GET_ITEM(batch, 0)) || !PyArray_Check(PyList_GET_ITEM(batch, 2))) {
        PyErr_SetString(PyExc_TypeError,
                        "upload: with a decoder the batch is [images, labels, GPU part]");
        return -1;
    }
    images = (PyArrayObject *)PyList_GET_ITEM(batch, 0);
    part = (PyArrayObject *)PyList_GET_ITEM(batch, 2);
    if (PyArray_TYPE(part) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(part) ||
        fl_gpu_batch_view(&gpu->part, PyArray_DATA(part), (size_t)PyArray_NBYTES(part)) !=
            FL_OK ||
        PyArray_NDIM(images) < 1) {
        PyErr_SetString(PyExc_ValueError, "upload: the batch's GPU part is malformed");
        return -1;
    }
    gpu->stage = ((GpuDecoderObject *)decoder)->stage;
    gpu->rows = (size_t)PyArray_DIM(images, 0);
    *uploaded = PyList_GetSlice(batch, 0, 2);
    return *uploaded ? 0 : -1;
}

/* The exception for a GPU stage that failed. */
static void raise_gpu_error(fastload_state *state, const gpu_work *gpu, int device)
{
    const fl_gpu_decode_report *r = &gpu->report;
    if (gpu->status == FL_ERR_NOMEM)
        PyErr_Format(PyExc_MemoryError, "GPU decoding on cuda:%d: %s", device, r->msg);
    else if (r->failed_sample >= 0)
        PyErr_Format(state->DecodeError, "cannot decode sample index %lld: %s",
                     (long long)r->failed_sample, r->msg);
    else
        PyErr_Format(PyExc_RuntimeError, "GPU decoding on cuda:%d: %s", device, r->msg);
}

static PyObject *CudaStream_upload(CudaStreamObject *self, PyObject *const *args,
                                   Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "upload(batch, pool, decoder=None) takes 2 or 3 "
                                         "arguments");
        return NULL;
    }
    fastload_state *state = fl__state_of_type(Py_TYPE(self));
    if (!PyObject_TypeCheck(args[1], state->SlotPool_type)) {
        PyErr_SetString(PyExc_TypeError, "upload: pool must be a SlotPool");
        return NULL;
    }
    PyObject *decoder = nargs == 3 ? args[2] : Py_None;
    if (decoder != Py_None && !PyObject_TypeCheck(decoder, state->GpuDecoder_type)) {
        PyErr_SetString(PyExc_TypeError, "upload: decoder must be a GpuDecoder or None");
        return NULL;
    }
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda || release_done(cuda, self, 0) < 0)
        return NULL;
    PyObject *batch = args[0], *uploaded = NULL;
    gpu_work gpu = {0};
    if (decoder != Py_None) {
        if (split_batch(batch, decoder, &uploaded, &gpu) < 0)
            return NULL;
    } else {
        uploaded = Py_NewRef(batch);
    }
    upload_items u = {.kept = PyList_New(0), .tensor_type = fl__tensor_type(state)};
    PyObject *out = NULL, *event_obj = NULL, *arrays = NULL;
    if (!u.kept || collect(&u, uploaded) < 0)
        goto done;
    fl_cu_event event = NULL;
    Py_ssize_t failed = -1, n = u.count;
    fl_cu_result rc;
    fl_slot_pool *pool = ((SlotPoolObject *)args[1])->pool;
    Py_BEGIN_ALLOW_THREADS
    rc = enqueue(cuda, self, pool, u.items, n, &gpu, &event, &failed);
    Py_END_ALLOW_THREADS
    if (gpu.stage) {
        GpuDecoderObject *d = (GpuDecoderObject *)decoder;
        const fl_gpu_batch_head *h = gpu.part.head;
        d->gpu_images = gpu.report.gpu_images;
        d->cpu_images = gpu.report.cpu_images;
        d->worker_cpu_images = h->cpu_count;
        d->worker_gpu_images = h->count;
        d->worker_cpu_ns = h->cpu_ns;
        d->worker_prep_ns = h->prep_ns;
    }
    if (rc == FL_CU_ERROR_GPU_STAGE) {
        raise_gpu_error(state, &gpu, self->device);
        goto done;
    }
    if (rc == FL_CU_ERROR_OUT_OF_MEMORY && failed >= 0) {
        PyErr_Format(PyExc_MemoryError,
                     "CUDA out of memory: cannot allocate %zu bytes on cuda:%d for batch "
                     "array %zd (%s)", u.items[failed].bytes, self->device, failed,
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
    if (ev) {
        ev->event = event;
        ev->device = self->device;
        event_obj = (PyObject *)ev;
    }
    /* The host memory is read until the event completes: the stream keeps
     * the batch (and the arrays made from it here) until then. */
    PyObject *held = event_obj ? Py_BuildValue("(O(OO))", event_obj, batch, u.kept) : NULL;
    if (!held || PyList_Append(self->in_flight, held) < 0) {
        Py_XDECREF(held);
        /* Nobody can wait for the copies now: finish them here. */
        Py_BEGIN_ALLOW_THREADS
        cuda->event_synchronize(event);
        if (!event_obj && fl_cuda_enter(cuda, self->device) == 0) {
            cuda->event_destroy(event);
            fl_cuda_leave(cuda);
        }
        Py_END_ALLOW_THREADS
        goto done;
    }
    Py_DECREF(held);
    arrays = PyList_New(n);
    for (Py_ssize_t i = 0; arrays && i < n; i++) {
        PyArrayObject *a = u.items[i].array;
        PyObject *d = fl__DeviceArray_new(state, u.items[i].slot, self->device,
                                          PyArray_DESCR(a), PyArray_NDIM(a), PyArray_DIMS(a),
                                          u.items[i].c_order ? NULL : u.items[i].strides,
                                          event_obj, (PyObject *)self);
        u.items[i].slot = NULL; /* owned by the DeviceArray (or released) now */
        if (!d)
            Py_CLEAR(arrays);
        else
            PyList_SET_ITEM(arrays, i, d);
    }
    if (arrays) {
        Py_ssize_t next = 0;
        PyObject *device_batch = rebuild(&u, uploaded, arrays, &next);
        out = device_batch ? Py_BuildValue("(NO)", device_batch, event_obj) : NULL;
    }
done:
    for (Py_ssize_t i = 0; i < u.count; i++)
        if (u.items[i].slot)
            fl_slot_release(u.items[i].slot); /* a later copy into it queues behind */
    Py_XDECREF(arrays);
    Py_XDECREF(event_obj);
    Py_XDECREF(u.kept);
    Py_XDECREF(uploaded);
    PyMem_Free(u.items);
    return out;
}

static PyObject *CudaStream_collect(CudaStreamObject *self, PyObject *unused)
{
    (void)unused;
    const fl_cuda *cuda = fl__cuda_driver_or_raise();
    if (!cuda || release_done(cuda, self, 0) < 0)
        return NULL;
    return PyLong_FromSsize_t(PyList_GET_SIZE(self->in_flight));
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
    if (release_done(cuda, self, 1) < 0)
        return NULL;
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
     "upload(batch, pool, decoder=None)\n--\n\n"
     "Copies every array of `batch` (a NumPy array or CPU tensor, or a dict,\n"
     "list or tuple of them, nested) into a device slot of `pool` (a\n"
     "SlotPool(memory='device')) on this stream, one copy each, and records\n"
     "an event after them.  Returns (the batch with a DeviceArray for each\n"
     "array, CudaEvent).  The stream keeps the host batch until the event\n"
     "completes (see collect).  With a GpuDecoder, `batch` is a native batch\n"
     "[images, labels, GPU part]: the part's images are decoded on the GPU\n"
     "into their rows of the uploaded images, and [images, labels] returned."},
    {"collect", (PyCFunction)CudaStream_collect, METH_NOARGS,
     "collect()\n--\n\nLets go of the host batches whose copies are done; returns how\n"
     "many are still in flight (upload collects too)."},
    {"synchronize", (PyCFunction)CudaStream_synchronize, METH_NOARGS,
     "synchronize()\n--\n\nWaits (GIL released) until the stream's work is done, and lets go\n"
     "of every host batch."},
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
    {Py_tp_traverse, CudaStream_traverse},
    {Py_tp_clear, CudaStream_clear},
    {Py_tp_methods, CudaStream_methods},
    {Py_tp_getset, CudaStream_getset},
    {0, NULL},
};

PyType_Spec fl__CudaStream_spec = {
    .name = "fastload._C.CudaStream",
    .basicsize = sizeof(CudaStreamObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .slots = CudaStream_slots,
};
