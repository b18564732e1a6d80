/* fastload._C: SlotPool (a pool of batch buffers) and SlotOwner (the object
 * that keeps one buffer alive while arrays over it exist).
 *
 * Every array collate() makes over a slot has a SlotOwner as its NumPy base
 * (PyArray_SetBaseObject), so the slot is released exactly when the last
 * array — or torch tensor sharing its memory — is freed.  The memory never
 * carries NPY_ARRAY_OWNDATA: NumPy did not allocate it.
 */
#include "bind/fastload.h"

#include "core/cuda/cuda_memory.h"
#include "core/memory/shm.h"
#include "core/status.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* ---------------------------------------------------------------- SlotPool */

static PyObject *SlotPool_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_free", "memory", "device", "max_free_bytes", NULL};
    Py_ssize_t max_free = 16;
    const char *memory = "host";
    int device = 0;
    PyObject *max_free_bytes_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n$siO:SlotPool", kwlist, &max_free, &memory,
                                     &device, &max_free_bytes_obj))
        return NULL;
    if (max_free < 0) {
        PyErr_SetString(PyExc_ValueError, "SlotPool: max_free must be >= 0");
        return NULL;
    }
    size_t max_free_bytes = SIZE_MAX;
    if (max_free_bytes_obj != Py_None) {
        max_free_bytes = PyLong_AsSize_t(max_free_bytes_obj);
        if (max_free_bytes == (size_t)-1 && PyErr_Occurred()) {
            if (PyErr_ExceptionMatches(PyExc_OverflowError))
                PyErr_Format(PyExc_ValueError,
                             "SlotPool: max_free_bytes must be None or an int from 0 to %zu",
                             (size_t)SIZE_MAX);
            return NULL;
        }
    }
    fl_slot_allocator cuda_memory, shared_memory, *allocator = NULL;
    int staging = strcmp(memory, "staging") == 0;
    if (strcmp(memory, "pinned") == 0 || staging || strcmp(memory, "device") == 0) {
        const char *why = NULL;
        if (!fl_cuda_get(&why)) {
            PyErr_Format(PyExc_RuntimeError, "SlotPool(memory='%s') needs CUDA: %s", memory,
                         why);
            return NULL;
        }
        cuda_memory = memory[0] == 'd' ? fl_cuda_device_allocator(device)
                                       : fl_cuda_pinned_allocator(device, !staging);
        allocator = &cuda_memory;
    } else if (strcmp(memory, "shared") == 0) {
        shared_memory = fl_shm_allocator();
        allocator = &shared_memory;
    } else if (strcmp(memory, "host") != 0) {
        PyErr_Format(PyExc_ValueError,
                     "SlotPool: memory must be 'host', 'shared', 'pinned', 'staging' or "
                     "'device', not '%s'",
                     memory);
        return NULL;
    }
    SlotPoolObject *self = (SlotPoolObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->pool = fl_slot_pool_new((size_t)max_free, max_free_bytes, allocator);
    if (!self->pool) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void SlotPool_dealloc(SlotPoolObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    fl_slot_pool_release(self->pool); /* slots still out keep the pool alive */
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *SlotPool_counts(SlotPoolObject *self, PyObject *unused)
{
    (void)unused;
    size_t live = 0, free_listed = 0;
    fl_slot_pool_counts(self->pool, &live, &free_listed);
    return Py_BuildValue("(nn)", (Py_ssize_t)live, (Py_ssize_t)free_listed);
}

static PyObject *SlotPool_stats(SlotPoolObject *self, PyObject *unused)
{
    (void)unused;
    fl_slot_pool_stats stats;
    fl_slot_pool_stats_get(self->pool, &stats);
    return Py_BuildValue("{snsnsnsn}", "live", (Py_ssize_t)stats.live, "free",
                         (Py_ssize_t)stats.free, "free_bytes", (Py_ssize_t)stats.free_bytes,
                         "allocations", (Py_ssize_t)stats.allocations);
}

static PyMethodDef SlotPool_methods[] = {
    {"counts", (PyCFunction)SlotPool_counts, METH_NOARGS,
     "counts()\n--\n\n(allocated slots, slots waiting on the free list)"},
    {"stats", (PyCFunction)SlotPool_stats, METH_NOARGS,
     "stats()\n--\n\n{'live', 'free', 'free_bytes', 'allocations'}: slots allocated now,\n"
     "those idle on the free list and their bytes, slots allocated over the pool's life."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot SlotPool_slots[] = {
    {Py_tp_doc, "SlotPool(max_free=16, *, memory='host', device=0, max_free_bytes=None)\n--\n\n"
                "Batch buffers, recycled; at most max_free kept idle, of at most\n"
                "max_free_bytes together (None: no byte bound).  memory: 'host'\n"
                "(page-aligned), 'pinned' (page-locked by the CUDA driver, fenced on\n"
                "release against queued copies), 'staging' (page-locked, read only by\n"
                "fastload's upload stage), 'device' (memory of CUDA device `device`) or\n"
                "'shared' (one memfd a slot, for process workers: see shared_slot())."},
    {Py_tp_new, SlotPool_new},
    {Py_tp_dealloc, SlotPool_dealloc},
    {Py_tp_methods, SlotPool_methods},
    {0, NULL},
};

PyType_Spec fl__SlotPool_spec = {
    .name = "fastload._C.SlotPool",
    .basicsize = sizeof(SlotPoolObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = SlotPool_slots,
};

/* --------------------------------------------------------------- SlotOwner */

int fl__acquire_slot(PyObject *pool, size_t bytes, fl_slot **out)
{
    int status;
    /* Without the GIL: a fresh slot may be a large allocation, and a reused
     * pinned one may first wait for a copy still reading it. */
    Py_BEGIN_ALLOW_THREADS
    status = fl_slot_acquire(((SlotPoolObject *)pool)->pool, bytes, out);
    Py_END_ALLOW_THREADS
    if (status != FL_OK) {
        fl__raise_slot_error(status, bytes);
        return -1;
    }
    return 0;
}

/* The one text for descriptors run out (here, in a worker's slot pool, and
 * in the parent's fastload/loader/process_engine.py, through too_many_files_message):
 * what was being done, which limit, what holds the descriptors (`held`, a
 * clause), and what to do. */
static PyObject *too_many_files_message(const char *doing, const char *held)
{
    char limit[32] = "unknown";
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(limit, sizeof limit, "unlimited");
        else
            snprintf(limit, sizeof limit, "%llu", (unsigned long long)rl.rlim_cur);
    }
    return PyUnicode_FromFormat(
        "fastload: too many open files: no file descriptor left %s.  This process's limit "
        "is %s descriptors (RLIMIT_NOFILE soft limit); %s.  Raise the limit (`ulimit -n` in "
        "the shell, or resource.setrlimit(resource.RLIMIT_NOFILE, ...)) or release the "
        "batches you keep.  Batches of up to %zu bytes share shared-memory files; each "
        "larger one holds a descriptor while it lives (torch's set_sharing_strategy does "
        "not apply).",
        doing, limit, held, (size_t)FL_SHM_SMALL_BYTES);
}

PyObject *fl__too_many_files_message(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "too_many_files_message(doing, held): two str");
        return NULL;
    }
    const char *doing = PyUnicode_AsUTF8(args[0]);
    const char *held = doing ? PyUnicode_AsUTF8(args[1]) : NULL;
    return held ? too_many_files_message(doing, held) : NULL;
}

PyObject *fl__raise_slot_error(int status, size_t bytes)
{
    if (status != FL_ERR_FDS)
        return PyErr_Format(PyExc_MemoryError,
                            "fastload: cannot allocate a %zu-byte batch buffer", bytes);
    /* Out of descriptors is not out of memory: say so (too_many_files_message). */
    size_t arenas = 0, slots = 0;
    fl_shm_counts(&arenas, &slots);
    char doing[128], held[256];
    snprintf(doing, sizeof doing,
             "for the shared memory of a %zu-byte batch buffer in worker process %d", bytes,
             (int)getpid());
    snprintf(held, sizeof held,
             "%zu batch slots are live here (batches the loop keeps alive, in flight, or kept "
             "for reuse) in %zu shared-memory files",
             slots, arenas);
    PyObject *message = too_many_files_message(doing, held);
    if (message) {
        PyErr_SetObject(PyExc_RuntimeError, message);
        Py_DECREF(message);
    }
    return NULL;
}

PyObject *fl__SlotOwner_new(fastload_state *state, fl_slot *slot)
{
    PyTypeObject *type = state->SlotOwner_type;
    SlotOwnerObject *self = (SlotOwnerObject *)type->tp_alloc(type, 0);
    if (!self) {
        fl_slot_release(slot);
        return NULL;
    }
    self->slot = slot;
    return (PyObject *)self;
}

PyObject *fl__slot_array(PyObject *owner, size_t offset, PyArray_Descr *descr, int ndim,
                         const npy_intp *dims, PyObject *convert)
{
    fl_slot *slot = ((SlotOwnerObject *)owner)->slot;
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, ndim, (npy_intp *)dims, NULL,
                                         (char *)slot->data + offset, NPY_ARRAY_CARRAY, NULL);
    if (!arr)
        return NULL;
    Py_INCREF(owner);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, owner) < 0) {
        Py_DECREF(owner);
        Py_DECREF(arr);
        return NULL;
    }
    if (convert == Py_None)
        return arr;
    PyObject *out = PyObject_CallOneArg(convert, arr);
    Py_DECREF(arr);
    return out;
}

static void SlotOwner_dealloc(SlotOwnerObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    fl_slot_release(self->slot);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *SlotOwner_get_nbytes(SlotOwnerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(self->slot->capacity);
}

static PyObject *SlotOwner_get_address(SlotOwnerObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(self->slot->data);
}

static PyGetSetDef SlotOwner_getset[] = {
    {"nbytes", (getter)SlotOwner_get_nbytes, NULL, "capacity of the slot in bytes", NULL},
    {"address", (getter)SlotOwner_get_address, NULL, "address of the slot's memory", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot SlotOwner_slots[] = {
    {Py_tp_doc, "Keeps one batch slot alive; the base of the arrays over it."},
    {Py_tp_dealloc, SlotOwner_dealloc},
    {Py_tp_getset, SlotOwner_getset},
    {0, NULL},
};

PyType_Spec fl__SlotOwner_spec = {
    .name = "fastload._C.SlotOwner",
    .basicsize = sizeof(SlotOwnerObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = SlotOwner_slots,
};

/* ------------------------------------------------------- shared slots */

PyObject *fl__shared_slot(PyObject *module, PyObject *array)
{
    fastload_state *state = fl__state_of_module(module);
    if (!PyArray_Check(array)) {
        PyErr_SetString(PyExc_TypeError, "shared_slot: expected a NumPy array");
        return NULL;
    }
    PyObject *base = PyArray_BASE((PyArrayObject *)array);
    if (!base || Py_TYPE(base) != state->SlotOwner_type)
        Py_RETURN_NONE;
    fl_slot *slot = ((SlotOwnerObject *)base)->slot;
    fl_shm_info info;
    if (fl_shm_lookup(slot->data, &info) != FL_OK)
        Py_RETURN_NONE;
    Py_ssize_t offset = PyArray_BYTES((PyArrayObject *)array) - (char *)slot->data;
    return Py_BuildValue("(iKnKnnn)", info.fd, (unsigned long long)info.arena_id,
                         (Py_ssize_t)info.arena_bytes, (unsigned long long)info.slot_id,
                         (Py_ssize_t)info.slot_offset, (Py_ssize_t)info.slot_bytes, offset);
}

PyObject *fl__take_freed_shared_slots(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    PyObject *out = PyList_New(0);
    uint64_t ids[64];
    size_t n;
    do {
        n = fl_shm_take_freed(ids, 64);
        for (size_t i = 0; out && i < n; i++) {
            PyObject *id = PyLong_FromUnsignedLongLong(ids[i]);
            if (!id || PyList_Append(out, id) < 0)
                Py_CLEAR(out);
            Py_XDECREF(id);
        }
    } while (out && n == 64);
    return out;
}
