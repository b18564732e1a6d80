/* fastload._C: HostRegistration, memory page-locked where it lies.
 *
 * A process worker's batches live in shared slots the parent maps once
 * (fastload/loader/process_engine.py).  With pin_memory=True the parent page-locks each
 * mapping with cuMemHostRegister when it first maps it, wraps it in a
 * HostRegistration, and builds the batch arrays over the registration (it
 * exports the same memory through the buffer protocol).  The registration
 * holds a buffer view of the mapping, so the mapping cannot be unmapped
 * while it is registered; the arrays hold the registration, so it is
 * unregistered only when the parent has dropped its mapping and the last
 * array over it is gone, and just before the mapping itself goes.
 *
 * Each slot of the memory has its own release fence.  The owner of a batch's
 * slot (memory/slot_pool.c's MappedSlotOwner) records it through
 * fl__host_registration_fence as the last array over the slot dies, and the
 * channel's return list (SlotReturns) asks fl__host_registration_fence_done
 * before the slot goes back to its worker; the methods below are the same
 * calls for Python (tests).
 */
#include "bind/fastload.h"

#include "core/cuda/cuda_memory.h"

#include <unistd.h>

typedef struct HostRegistrationObject {
    PyObject_HEAD
    Py_buffer view;           /* of the registered object; obj NULL until taken */
    fl_cuda_host_range range; /* the registration and its release fence */
    int registered;           /* range is registered with the driver */
} HostRegistrationObject;

static const fl_cuda *driver_or_raise(void)
{
    const char *why = NULL;
    const fl_cuda *cuda = fl_cuda_get(&why);
    if (!cuda)
        PyErr_Format(PyExc_RuntimeError, "CUDA is not available: %s", why);
    return cuda;
}

static PyObject *HostRegistration_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "device", NULL};
    PyObject *buffer;
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|i:HostRegistration", kwlist, &buffer,
                                     &device))
        return NULL;
    const fl_cuda *cuda = driver_or_raise();
    if (!cuda)
        return NULL;
    if (!cuda->mem_host_register) {
        PyErr_SetString(PyExc_RuntimeError,
                        "HostRegistration: this CUDA driver has no cuMemHostRegister_v2");
        return NULL;
    }
    HostRegistrationObject *self = (HostRegistrationObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0)
        goto fail;
    long page = sysconf(_SC_PAGESIZE);
    if (self->view.len == 0 || page <= 0 || (size_t)self->view.buf % (size_t)page != 0) {
        PyErr_Format(PyExc_ValueError,
                     "HostRegistration: the buffer must be non-empty and start on a page "
                     "boundary (%zd bytes at %p)",
                     self->view.len, self->view.buf);
        goto fail;
    }
    fl_cu_result rc;
    Py_BEGIN_ALLOW_THREADS /* registering pins every page: slow for large buffers */
    rc = fl_cuda_host_register(cuda, &self->range, self->view.buf, (size_t)self->view.len,
                               device);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        PyErr_Format(rc == FL_CU_ERROR_OUT_OF_MEMORY ? PyExc_MemoryError : PyExc_RuntimeError,
                     "cannot page-lock a %zd-byte buffer on cuda:%d: cuMemHostRegister "
                     "failed: %s",
                     self->view.len, device, fl_cuda_error_string(cuda, rc));
        goto fail;
    }
    self->registered = 1;
    return (PyObject *)self;
fail:
    Py_DECREF(self); /* dealloc releases the view, if taken */
    return NULL;
}

static void HostRegistration_dealloc(HostRegistrationObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    /* NULL in a forked child: the parent's registration is not the child's
     * to undo. */
    const fl_cuda *cuda = self->registered ? fl_cuda_get(NULL) : NULL;
    if (cuda) {
        /* Waits for a copy still queued from the memory.  A failure cannot
         * be reported from here, and the mapping goes next either way. */
        Py_BEGIN_ALLOW_THREADS
        fl_cuda_host_unregister(cuda, &self->range);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&self->view); /* now the mapping may be unmapped */
    type->tp_free(self);
    Py_DECREF(type);
}

static int HostRegistration_getbuffer(HostRegistrationObject *self, Py_buffer *view, int flags)
{
    return PyBuffer_FillInfo(view, (PyObject *)self, self->view.buf, self->view.len, 0, flags);
}

/* ---------------------------------------------- release fences, from C */

int fl__is_host_registration(PyObject *obj)
{
    /* The type is made per host_registration_type() call: its dealloc, not
     * its identity, says what it is. */
    return Py_TYPE(obj)->tp_dealloc == (destructor)HostRegistration_dealloc;
}

void fl__host_registration_fence(PyObject *registration, uint64_t key)
{
    const fl_cuda *cuda = fl_cuda_get(NULL);
    if (!cuda)
        return; /* a forked child: nothing of its own can be queued */
    HostRegistrationObject *self = (HostRegistrationObject *)registration;
    Py_BEGIN_ALLOW_THREADS /* waits for the default stream if no event can be recorded */
    fl_cuda_host_fence(cuda, &self->range, key);
    Py_END_ALLOW_THREADS
}

int fl__host_registration_fence_done(PyObject *registration, uint64_t key)
{
    const fl_cuda *cuda = fl_cuda_get(NULL);
    if (!cuda)
        return 1;
    HostRegistrationObject *self = (HostRegistrationObject *)registration;
    fl_cu_result rc = fl_cuda_host_fence_query(cuda, &self->range, key);
    if (rc == FL_CU_ERROR_NOT_READY)
        return 0;
    if (rc != 0) {
        fl__cuda_raise(cuda, rc, "cuEventQuery (a batch slot's release fence)",
                       self->range.ordinal);
        return -1;
    }
    return 1;
}

int fl__host_registration_wait_fence(PyObject *registration, uint64_t key)
{
    const fl_cuda *cuda = fl_cuda_get(NULL);
    if (!cuda)
        return 0;
    HostRegistrationObject *self = (HostRegistrationObject *)registration;
    fl_cu_result rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fl_cuda_host_fence_wait(cuda, &self->range, key);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        fl__cuda_raise(cuda, rc, "cuEventSynchronize (a batch slot's release fence)",
                       self->range.ordinal);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- methods */

static int key_of(PyObject *arg, uint64_t *key)
{
    unsigned long long value = PyLong_AsUnsignedLongLong(arg);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *key = (uint64_t)value;
    return 0;
}

static PyObject *HostRegistration_release_fence(PyObject *self, PyObject *arg)
{
    uint64_t key;
    if (key_of(arg, &key) < 0)
        return NULL;
    fl__host_registration_fence(self, key);
    Py_RETURN_NONE;
}

static PyObject *HostRegistration_fence_done(PyObject *self, PyObject *arg)
{
    uint64_t key;
    if (key_of(arg, &key) < 0)
        return NULL;
    int done = fl__host_registration_fence_done(self, key);
    return done < 0 ? NULL : PyBool_FromLong(done);
}

static PyObject *HostRegistration_wait_fence(PyObject *self, PyObject *arg)
{
    uint64_t key;
    if (key_of(arg, &key) < 0 || fl__host_registration_wait_fence(self, key) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *HostRegistration_get_address(HostRegistrationObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->view.buf);
}

static PyObject *HostRegistration_get_nbytes(HostRegistrationObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(self->view.len);
}

static PyMethodDef HostRegistration_methods[] = {
    {"release_fence", (PyCFunction)HostRegistration_release_fence, METH_O,
     "release_fence(slot_id, /)\n--\n\n"
     "Records slot `slot_id`'s release fence on the legacy default stream: call\n"
     "when the last array over that slot of the memory is gone (a non-blocking\n"
     "copy from it may be queued).  Each slot has its own fence (an event of a\n"
     "small pool, reused once complete)."},
    {"fence_done", (PyCFunction)HostRegistration_fence_done, METH_O,
     "fence_done(slot_id, /)\n--\n\n"
     "True once the work queued before slot `slot_id`'s release_fence() is done\n"
     "(or when none is pending): that slot may be written again."},
    {"wait_fence", (PyCFunction)HostRegistration_wait_fence, METH_O,
     "wait_fence(slot_id, /)\n--\n\n"
     "Waits (GIL released) until fence_done(slot_id) would be True."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef HostRegistration_getset[] = {
    {"address", (getter)HostRegistration_get_address, NULL, "address of the memory", NULL},
    {"nbytes", (getter)HostRegistration_get_nbytes, NULL, "size of the memory in bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot HostRegistration_slots[] = {
    {Py_tp_doc, "HostRegistration(buffer, device=0)\n--\n\n"
                "Page-locks a writable, page-aligned buffer in place (cuMemHostRegister,\n"
                "portable, in device `device`'s primary context) and exports the same\n"
                "memory.  Keeps the buffer alive; unregisters it when the registration\n"
                "dies, after the release fence, if any, has completed."},
    {Py_tp_new, HostRegistration_new},
    {Py_tp_dealloc, HostRegistration_dealloc},
    {Py_tp_methods, HostRegistration_methods},
    {Py_tp_getset, HostRegistration_getset},
    {Py_bf_getbuffer, HostRegistration_getbuffer},
    {0, NULL},
};

static PyType_Spec HostRegistration_spec = {
    .name = "fastload._C.HostRegistration",
    .basicsize = sizeof(HostRegistrationObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = HostRegistration_slots,
};

PyObject *fl__host_registration_type(PyObject *module, PyObject *unused)
{
    (void)unused;
    return PyType_FromModuleAndSpec(module, &HostRegistration_spec, NULL);
}
