/* fastload._C: SlotPool (a pool of batch buffers) and SlotOwner (the object
 * that keeps one buffer alive while arrays over it exist); for process
 * workers, MappedSlotOwner and SlotReturns (a worker's slot as the parent
 * maps it, and the list that hands it back to the worker).
 *
 * Every array collate() makes over a slot has a SlotOwner as its NumPy base
 * (PyArray_SetBaseObject), so the slot is released exactly when the last
 * array — or torch tensor sharing its memory — is freed.  The parent's
 * arrays over a worker process's slot have a MappedSlotOwner as their base,
 * the same way: its dealloc returns the slot to the channel's SlotReturns
 * instead of a pool.  One mechanism, no Python callback per slot.  The
 * memory never carries NPY_ARRAY_OWNDATA: NumPy did not allocate it.
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

/* ------------------------------------- a worker process's slots in the parent
 *
 * A process worker collates into shared slots (SlotPool(memory="shared"));
 * the parent maps each arena once (fastload/loader/process_engine.py) and
 * builds a batch's arrays over its mapping.  Their lifetime is written the
 * way SlotOwner writes a slot's here: every array of a batch over one slot
 * has that slot's MappedSlotOwner as its NumPy base, and the owner's dealloc
 * — run when the last array, or torch tensor sharing its memory, dies —
 * gives the slot back.  Not to a pool (the memory is the worker's) but to
 * its channel's SlotReturns, a C list the channel drains into its next
 * request to the worker.  No Python code runs per slot.
 *
 * When the mapping is page-locked (a HostRegistration), a non-blocking copy
 * from the slot may still be queued when its last array dies: the owner
 * records the slot's release fence first, and the list keeps the slot until
 * that fence is done (take()).  The owner holds a buffer view of the mapping,
 * so the mapping (and its registration) lives while any array over it does,
 * even after the channel dropped it.  A closed list takes nothing back: its
 * worker is gone.
 *
 * All of it runs with the GIL held, which guards every field below.  An
 * owner's dealloc must not fail, so it never allocates: own() reserves room
 * in both lists for every slot that can come back. */

typedef struct slot_return {
    uint64_t slot_id;
    PyObject *registration; /* strong: the HostRegistration whose fence for
                               slot_id was recorded; NULL: unfenced */
} slot_return;

typedef struct slot_list {
    slot_return *items; /* oldest first; PyMem_Free'd by the list's owner */
    size_t len, cap;
} slot_list;

typedef struct SlotReturnsObject {
    PyObject_HEAD
    slot_list released; /* released since the last take() */
    slot_list waiting;  /* released before it, their fences pending then */
    size_t held;        /* MappedSlotOwners alive (for the channel's messages) */
    int closed;         /* close() ran: released slots go back to no one */
} SlotReturnsObject;

typedef struct MappedSlotOwnerObject {
    PyObject_HEAD
    fl_slot *slot;              /* &mapped: SlotOwner's layout, so its getters serve both */
    fl_slot mapped;             /* the slot in the mapping: data and capacity only */
    Py_buffer view;             /* of the mapping; view.obj NULL until taken */
    SlotReturnsObject *returns; /* strong; NULL until the owner is complete */
    uint64_t slot_id;
    int fenced;                 /* the mapping is a HostRegistration */
} MappedSlotOwnerObject;

static int slot_list_reserve(slot_list *list, size_t want)
{
    if (want <= list->cap)
        return 0;
    size_t cap = list->cap ? list->cap : 8;
    while (cap < want)
        cap *= 2;
    slot_return *items = PyMem_Realloc(list->items, cap * sizeof *items);
    if (!items) {
        PyErr_NoMemory();
        return -1;
    }
    list->items = items;
    list->cap = cap;
    return 0;
}

/* Appends within the reserved room (see own()). */
static void slot_list_push(slot_list *list, uint64_t slot_id, PyObject *registration)
{
    list->items[list->len].slot_id = slot_id;
    list->items[list->len].registration = registration;
    list->len++;
}

static void slot_list_clear(slot_list *list)
{
    /* Emptied before the references go: a registration's dealloc waits for
     * its fences with the GIL released. */
    slot_return *items = list->items;
    size_t len = list->len;
    list->items = NULL;
    list->len = list->cap = 0;
    for (size_t i = 0; i < len; i++)
        Py_XDECREF(items[i].registration);
    PyMem_Free(items);
}

static PyObject *slot_list_ids(const slot_list *list)
{
    PyObject *out = PyList_New((Py_ssize_t)list->len);
    for (size_t i = 0; out && i < list->len; i++) {
        PyObject *id = PyLong_FromUnsignedLongLong(list->items[i].slot_id);
        if (!id)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, id);
    }
    return out;
}

static PyObject *SlotReturns_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, ":SlotReturns", kwlist))
        return NULL;
    return type->tp_alloc(type, 0);
}

static void SlotReturns_dealloc(SlotReturnsObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    slot_list_clear(&self->released);
    slot_list_clear(&self->waiting);
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *SlotReturns_own(SlotReturnsObject *self, PyObject *const *args,
                                 Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "own(mapping, slot_id, slot_offset, slot_bytes): four arguments");
        return NULL;
    }
    unsigned long long slot_id = PyLong_AsUnsignedLongLong(args[1]);
    if (slot_id == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t offset = PyLong_AsSsize_t(args[2]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t bytes = PyLong_AsSsize_t(args[3]);
    if (bytes == -1 && PyErr_Occurred())
        return NULL;
    /* Room for this slot and every other that may come back (see above). */
    size_t room = self->held + 1 + self->released.len + self->waiting.len;
    if (slot_list_reserve(&self->released, room) < 0 ||
        slot_list_reserve(&self->waiting, room) < 0)
        return NULL;
    PyTypeObject *type = fl__state_of_type(Py_TYPE(self))->MappedSlotOwner_type;
    MappedSlotOwnerObject *owner = (MappedSlotOwnerObject *)type->tp_alloc(type, 0);
    if (!owner)
        return NULL;
    PyObject *mapping = args[0];
    if (PyObject_GetBuffer(mapping, &owner->view, PyBUF_WRITABLE) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_BufferError))
            goto fail;
        PyErr_Clear(); /* a read-only mapping gives read-only arrays */
        if (PyObject_GetBuffer(mapping, &owner->view, PyBUF_SIMPLE) < 0)
            goto fail;
    }
    if (offset < 0 || bytes < 0 || offset > owner->view.len - bytes) {
        PyErr_Format(PyExc_ValueError,
                     "own: a slot of %zd bytes at %zd does not lie in a %zd-byte mapping",
                     bytes, offset, owner->view.len);
        goto fail;
    }
    owner->mapped.data = (char *)owner->view.buf + offset;
    owner->mapped.capacity = (size_t)bytes;
    owner->slot = &owner->mapped;
    owner->slot_id = (uint64_t)slot_id;
    owner->fenced = fl__is_host_registration(mapping);
    Py_INCREF(self);
    owner->returns = self;
    self->held++;
    return (PyObject *)owner;
fail:
    Py_DECREF(owner); /* dealloc releases the view, if taken */
    return NULL;
}

/* Whether each entry of `list` may go back now (its fence, if any, is done):
 * fills done[], or returns -1 with an exception set, nothing changed. */
static int fences_done(const slot_list *list, char *done)
{
    for (size_t i = 0; i < list->len; i++) {
        const slot_return *entry = &list->items[i];
        int ok = entry->registration
                     ? fl__host_registration_fence_done(entry->registration, entry->slot_id)
                     : 1;
        if (ok < 0)
            return -1;
        done[i] = (char)ok;
    }
    return 0;
}

static PyObject *SlotReturns_take(SlotReturnsObject *self, PyObject *arg)
{
    Py_ssize_t max_waiting = PyLong_AsSsize_t(arg);
    if (max_waiting == -1 && PyErr_Occurred())
        return NULL;
    if (max_waiting < 0) {
        PyErr_SetString(PyExc_ValueError, "take: max_waiting must be >= 0");
        return NULL;
    }
    slot_list *waiting = &self->waiting, *released = &self->released;
    /* The released ones join the queue behind those already waiting (own()
     * reserved the room). */
    if (released->len)
        memcpy(waiting->items + waiting->len, released->items,
               released->len * sizeof(slot_return));
    waiting->len += released->len;
    released->len = 0;
    char *done = PyMem_Malloc(waiting->len ? waiting->len : 1);
    PyObject *out = PyList_New(0);
    if (!done || !out) {
        PyMem_Free(done);
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    if (fences_done(waiting, done) < 0)
        goto fail;
    /* Those whose fence is done (or who have none) go back, in order; the
     * others keep their places. */
    size_t kept = 0, n = waiting->len;
    for (size_t i = 0; i < n; i++) {
        slot_return entry = waiting->items[i];
        if (!done[i]) {
            waiting->items[kept++] = entry;
            continue;
        }
        PyObject *id = PyLong_FromUnsignedLongLong(entry.slot_id);
        if (!id || PyList_Append(out, id) < 0) {
            /* Out of memory: this one and the rest stay for the next take. */
            Py_XDECREF(id);
            memmove(waiting->items + kept, waiting->items + i, (n - i) * sizeof entry);
            waiting->len = kept + (n - i);
            goto fail_taken;
        }
        Py_DECREF(id);
        Py_XDECREF(entry.registration);
    }
    waiting->len = kept;
    PyMem_Free(done);
    done = NULL;
    /* A page-locked slot whose copies are still queued waits for a later
     * request while the worker fills another; past max_waiting of them the
     * oldest is waited for here, so a GPU far behind cannot grow the
     * worker's pool without bound. */
    while (waiting->len > (size_t)max_waiting) {
        slot_return entry = waiting->items[0];
        memmove(waiting->items, waiting->items + 1, (waiting->len - 1) * sizeof entry);
        waiting->len--;
        /* Out of the list while the GIL is released for the wait. */
        int rc = entry.registration
                     ? fl__host_registration_wait_fence(entry.registration, entry.slot_id)
                     : 0;
        PyObject *id = rc < 0 ? NULL : PyLong_FromUnsignedLongLong(entry.slot_id);
        if (!id || PyList_Append(out, id) < 0) {
            Py_XDECREF(id);
            /* Back at the head, for the next take; room: it was there. */
            memmove(waiting->items + 1, waiting->items, waiting->len * sizeof entry);
            waiting->items[0] = entry;
            waiting->len++;
            goto fail_taken;
        }
        Py_DECREF(id);
        Py_XDECREF(entry.registration);
    }
    return out;
fail_taken:
    /* The ids taken so far go back to the head of the queue, unfenced (their
     * fences are done), so that none is lost to the error. */
    {
        Py_ssize_t taken = PyList_GET_SIZE(out);
        memmove(waiting->items + taken, waiting->items, waiting->len * sizeof(slot_return));
        for (Py_ssize_t i = 0; i < taken; i++) {
            waiting->items[i].slot_id = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(out, i));
            waiting->items[i].registration = NULL;
        }
        waiting->len += (size_t)taken;
    }
fail:
    PyMem_Free(done);
    Py_DECREF(out);
    return NULL;
}

static PyObject *SlotReturns_close(SlotReturnsObject *self, PyObject *unused)
{
    (void)unused;
    self->closed = 1;
    slot_list_clear(&self->released);
    slot_list_clear(&self->waiting);
    Py_RETURN_NONE;
}

static PyObject *SlotReturns_get_held(SlotReturnsObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(self->held);
}

static PyObject *SlotReturns_get_closed(SlotReturnsObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->closed);
}

static PyObject *SlotReturns_get_freed(SlotReturnsObject *self, void *closure)
{
    (void)closure;
    return slot_list_ids(&self->released);
}

static PyObject *SlotReturns_get_fenced(SlotReturnsObject *self, void *closure)
{
    (void)closure;
    return slot_list_ids(&self->waiting);
}

static PyObject *SlotReturns_get_fence_of(SlotReturnsObject *self, void *closure)
{
    (void)closure;
    PyObject *out = PyDict_New();
    const slot_list *lists[2] = {&self->waiting, &self->released};
    for (int l = 0; out && l < 2; l++) {
        for (size_t i = 0; out && i < lists[l]->len; i++) {
            const slot_return *entry = &lists[l]->items[i];
            if (!entry->registration)
                continue;
            PyObject *id = PyLong_FromUnsignedLongLong(entry->slot_id);
            if (!id || PyDict_SetItem(out, id, entry->registration) < 0)
                Py_CLEAR(out);
            Py_XDECREF(id);
        }
    }
    return out;
}

static PyMethodDef SlotReturns_methods[] = {
    {"own", (PyCFunction)(void (*)(void))SlotReturns_own, METH_FASTCALL,
     "own(mapping, slot_id, slot_offset, slot_bytes, /)\n--\n\n"
     "A new MappedSlotOwner of slot `slot_id`: `slot_bytes` bytes at\n"
     "`slot_offset` of `mapping` (an mmap, or a HostRegistration of one).  When\n"
     "it dies the slot comes back to this list (fenced first if `mapping` is a\n"
     "HostRegistration), unless the list is closed by then."},
    {"take", (PyCFunction)SlotReturns_take, METH_O,
     "take(max_waiting, /)\n--\n\n"
     "The ids of the slots that may go back to their worker now, oldest first,\n"
     "taken off the list.  A slot whose release fence is pending stays for a\n"
     "later take(); past `max_waiting` of them, the oldest is waited for (GIL\n"
     "released) and goes too."},
    {"close", (PyCFunction)SlotReturns_close, METH_NOARGS,
     "close()\n--\n\n"
     "The worker is gone: drops the slots waiting, and takes none back from now on."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef SlotReturns_getset[] = {
    {"held", (getter)SlotReturns_get_held, NULL, "slots with live arrays (owners alive)", NULL},
    {"closed", (getter)SlotReturns_get_closed, NULL, "close() ran", NULL},
    {"freed", (getter)SlotReturns_get_freed, NULL,
     "ids of the slots released since the last take(), oldest first", NULL},
    {"fenced", (getter)SlotReturns_get_fenced, NULL,
     "ids kept by the last take(): their fences were pending", NULL},
    {"fence_of", (getter)SlotReturns_get_fence_of, NULL,
     "{slot id: its HostRegistration} of the fenced slots not yet taken", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot SlotReturns_slots[] = {
    {Py_tp_doc, "SlotReturns()\n--\n\n"
                "The parent's return list of one worker process: the slots of the batches\n"
                "the parent received from it, as their last arrays die (own(), take())."},
    {Py_tp_new, SlotReturns_new},
    {Py_tp_dealloc, SlotReturns_dealloc},
    {Py_tp_methods, SlotReturns_methods},
    {Py_tp_getset, SlotReturns_getset},
    {0, NULL},
};

PyType_Spec fl__SlotReturns_spec = {
    .name = "fastload._C.SlotReturns",
    .basicsize = sizeof(SlotReturnsObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = SlotReturns_slots,
};

static void MappedSlotOwner_dealloc(MappedSlotOwnerObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    SlotReturnsObject *returns = self->returns;
    if (returns) {
        PyObject *registration = self->fenced ? self->view.obj : NULL;
        /* Fenced even when closed: the registration's dealloc waits for it
         * before unregistering. */
        if (registration)
            fl__host_registration_fence(registration, self->slot_id);
        returns->held--;
        if (!returns->closed) {
            Py_XINCREF(registration);
            slot_list_push(&returns->released, self->slot_id, registration);
        }
        self->returns = NULL;
        Py_DECREF(returns);
    }
    if (self->view.obj)
        PyBuffer_Release(&self->view); /* the mapping may go now */
    type->tp_free(self);
    Py_DECREF(type);
}

static PyObject *MappedSlotOwner_array(MappedSlotOwnerObject *self, PyObject *const *args,
                                       Py_ssize_t nargs)
{
    if (nargs != 4 || !PyTuple_Check(args[2]) || !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "array(offset, dtype, shape, strides): shape and strides tuples");
        return NULL;
    }
    Py_ssize_t offset = PyLong_AsSsize_t(args[0]);
    if (offset == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t ndim = PyTuple_GET_SIZE(args[2]);
    if (ndim > NPY_MAXDIMS || PyTuple_GET_SIZE(args[3]) != ndim) {
        PyErr_SetString(PyExc_ValueError, "array: shape and strides of one length, "
                                          "at most NPY_MAXDIMS");
        return NULL;
    }
    npy_intp dims[NPY_MAXDIMS], strides[NPY_MAXDIMS];
    for (Py_ssize_t i = 0; i < ndim; i++) {
        dims[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[2], i));
        strides[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[3], i));
        if ((dims[i] == -1 || strides[i] == -1) && PyErr_Occurred())
            return NULL;
        if (dims[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "array: negative dimension");
            return NULL;
        }
    }
    PyArray_Descr *descr = NULL;
    if (!PyArray_DescrConverter(args[1], &descr))
        return NULL;
    if (PyDataType_REFCHK(descr)) {
        PyErr_SetString(PyExc_TypeError, "array: a slot holds no Python objects");
        Py_DECREF(descr);
        return NULL;
    }
    npy_intp size = (npy_intp)self->slot->capacity;
    if (offset < 0 || offset > size ||
        !PyArray_CheckStrides((int)PyDataType_ELSIZE(descr), (int)ndim, size, offset, dims,
                              strides)) {
        PyErr_Format(PyExc_ValueError,
                     "array: the array at %zd does not lie in its %zd-byte slot", offset,
                     (Py_ssize_t)size);
        Py_DECREF(descr);
        return NULL;
    }
    /* Steals descr, even on failure. */
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, (int)ndim, dims, strides,
                                         (char *)self->slot->data + offset,
                                         self->view.readonly ? 0 : NPY_ARRAY_WRITEABLE, NULL);
    if (!arr)
        return NULL;
    Py_INCREF(self);
    if (PyArray_SetBaseObject((PyArrayObject *)arr, (PyObject *)self) < 0) {
        Py_DECREF(self);
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyMethodDef MappedSlotOwner_methods[] = {
    {"array", (PyCFunction)(void (*)(void))MappedSlotOwner_array, METH_FASTCALL,
     "array(offset, dtype, shape, strides, /)\n--\n\n"
     "An array over the slot at byte `offset`, with this owner as its base\n"
     "(checked to lie in the slot)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot MappedSlotOwner_slots[] = {
    {Py_tp_doc, "Keeps one slot of a worker process alive in the parent; the base of the\n"
                "arrays over it (SlotReturns.own())."},
    {Py_tp_dealloc, MappedSlotOwner_dealloc},
    {Py_tp_methods, MappedSlotOwner_methods},
    {Py_tp_getset, SlotOwner_getset},
    {0, NULL},
};

PyType_Spec fl__MappedSlotOwner_spec = {
    .name = "fastload._C.MappedSlotOwner",
    .basicsize = sizeof(MappedSlotOwnerObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = MappedSlotOwner_slots,
};
