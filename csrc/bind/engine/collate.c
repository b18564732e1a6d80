/* fastload._C: collate() — stacking NumPy-compatible samples into a batch
 * slot, with the copies done while the GIL is released.
 *
 * The structure of the first sample becomes a plan: a pre-order array of
 * nodes (containers and leaves).  Every sample is then checked against the
 * plan while the GIL is held; scalars are written straight into the slot and
 * array leaves are recorded as copy tasks, holding a reference to their
 * source and its layout (data, strides) read there, so the copies, which
 * run without the GIL, read no Python object.  Then the references are
 * dropped and the output tree is built from arrays over the slot.
 *
 * The rules reproduce torch's default_collate exactly for what they accept:
 * tuple and list containers become lists, dicts stay dicts, arrays and
 * tensors stack along a new first axis keeping their dtype, Python floats
 * become float64, ints int64, bools bool, NumPy scalars keep their dtype, and
 * str/bytes leaves become lists.  Anything else — a dtype torch cannot hold,
 * samples that disagree in type, shape or dtype, namedtuples, subclasses of
 * containers — returns NotImplemented, and the caller's Python collate gives
 * torch's answer, or torch's error.
 */
#include "bind/fastload.h"

#include "core/memory/slots.h"
#include "core/memory/strided.h"

#include <string.h>

enum node_kind {
    N_ARRAY,    /* ndarray (or subclass) leaf */
    N_TENSOR,   /* torch.Tensor leaf, read through .numpy() */
    N_NPSCALAR, /* NumPy scalar leaf */
    N_FLOAT,    /* Python float -> float64 */
    N_INT,      /* Python int -> int64 */
    N_BOOL,     /* Python bool -> bool */
    N_PASS,     /* str or bytes: collected into a list as they are */
    N_SEQ,      /* exact tuple or list -> list */
    N_DICT,     /* exact dict -> dict */
};

#define MAX_NODES 1024
#define MAX_DEPTH 16
#define LEAF_ALIGN 64

typedef struct node {
    int kind;
    PyTypeObject *type;     /* borrowed from the first sample; exact-type check */
    /* data leaves: */
    PyArray_Descr *descr;   /* owned */
    int ndim;               /* of one sample */
    npy_intp shape[NPY_MAXDIMS];
    size_t row_bytes;       /* one sample's bytes */
    size_t offset;          /* of the batch array in the slot */
    /* N_PASS: */
    PyObject *items;        /* owned list, filled per sample */
    int as_tuple;           /* inside a tuple/list: torch hands the column back
                               as the tuple zip() made, not as a list */
    /* containers: */
    Py_ssize_t n_children;  /* children follow in pre-order */
    PyObject *keys;         /* N_DICT: owned tuple of the first sample's keys */
} node;

typedef struct copy_task {
    PyObject *source;       /* owned ndarray, kept alive across the copy */
    char *dst;
    /* the source's layout, read with the GIL: */
    const char *data;
    const struct node *leaf; /* its shape is the leaf's */
    size_t itemsize;
    const int64_t *strides; /* in plan.strides; NULL: C-contiguous */
} copy_task;

typedef struct plan {
    fastload_state *state;
    node *nodes;
    int n_nodes;
    Py_ssize_t batch;
    size_t total_bytes;
    copy_task *tasks;       /* PyMem_RawMalloc: used without the GIL */
    Py_ssize_t n_tasks;
    int64_t *strides;       /* the strided sources' strides, back to back */
    size_t n_strides;
    fl_slot *slot;          /* owned until handed to a SlotOwner */
} plan;

/* Nonzero for the dtypes stacked in C: native byte order and a type torch
 * converts from NumPy.  torch.as_tensor refuses lists of unsigned 32/64-bit
 * NumPy scalars (and arrays of the (u)longlong aliases), so those, like every
 * other dtype, go to the Python collate, which reproduces torch's answer. */
static int dtype_supported(PyArray_Descr *d, int is_scalar)
{
    if (!PyArray_ISNBO(d->byteorder))
        return 0;
    switch (d->type_num) {
    case NPY_BOOL: case NPY_BYTE: case NPY_UBYTE: case NPY_SHORT: case NPY_USHORT:
    case NPY_INT: case NPY_LONG: case NPY_HALF: case NPY_FLOAT: case NPY_DOUBLE:
    case NPY_CFLOAT: case NPY_CDOUBLE:
        return 1;
    case NPY_UINT: case NPY_ULONG:
        return !is_scalar;
    default:
        return 0;
    }
}

static int descr_equal(PyArray_Descr *a, PyArray_Descr *b)
{
    return a->type_num == b->type_num && PyDataType_ELSIZE(a) == PyDataType_ELSIZE(b) &&
           PyArray_ISNBO(a->byteorder) == PyArray_ISNBO(b->byteorder);
}

static void plan_clear(plan *p)
{
    for (int i = 0; i < p->n_nodes; i++) {
        Py_XDECREF(p->nodes[i].descr);
        Py_XDECREF(p->nodes[i].items);
        Py_XDECREF(p->nodes[i].keys);
    }
    PyMem_Free(p->nodes);
    p->nodes = NULL;
    p->n_nodes = 0;
    if (p->tasks) {
        for (Py_ssize_t i = 0; i < p->n_tasks; i++)
            Py_XDECREF(p->tasks[i].source);
        PyMem_RawFree(p->tasks);
        p->tasks = NULL;
    }
    PyMem_RawFree(p->strides);
    p->strides = NULL;
    fl_slot_release(p->slot);
    p->slot = NULL;
}

/* Reads a torch tensor as an ndarray sharing its memory, or returns NULL with
 * no error set when it cannot (requires grad, not on the CPU, bfloat16, ...). */
static PyObject *tensor_as_array(PyObject *tensor)
{
    PyObject *arr = PyObject_CallMethod(tensor, "numpy", NULL);
    if (!arr || !PyArray_Check(arr)) {
        PyErr_Clear();
        Py_XDECREF(arr);
        return NULL;
    }
    return arr;
}

/* ------------------------------------------------------------- planning */

/* Appends the node(s) describing `obj` (the first sample) to the plan.
 * Returns 0, 1 when the sample is outside the C rules, -1 on a Python error. */
static int describe(plan *p, PyObject *obj, int depth)
{
    if (p->n_nodes >= MAX_NODES || depth > MAX_DEPTH)
        return 1;
    int index = p->n_nodes++;
    node *n = &p->nodes[index];
    memset(n, 0, sizeof *n);
    n->type = Py_TYPE(obj);

    PyObject *arr = NULL;
    if (p->state->tensor_type && Py_IS_TYPE(obj, (PyTypeObject *)p->state->tensor_type)) {
        n->kind = N_TENSOR;
        arr = tensor_as_array(obj);
        if (!arr)
            return 1;
    } else if (PyArray_Check(obj)) {
        n->kind = N_ARRAY;
        arr = obj;
        Py_INCREF(arr);
    }
    if (arr) {
        PyArrayObject *a = (PyArrayObject *)arr;
        /* The batch adds a dimension; the strided copy takes FL_MAX_DIMS. */
        int ok = dtype_supported(PyArray_DESCR(a), 0) && PyArray_NDIM(a) < NPY_MAXDIMS &&
                 PyArray_NDIM(a) <= FL_MAX_DIMS;
        if (ok) {
            n->descr = PyArray_DESCR(a);
            Py_INCREF(n->descr);
            n->ndim = PyArray_NDIM(a);
            if (n->ndim > 0) /* a 0-d array's dims pointer may be NULL */
                memcpy(n->shape, PyArray_DIMS(a), sizeof(npy_intp) * (size_t)n->ndim);
            n->row_bytes = (size_t)PyArray_NBYTES(a);
        }
        Py_DECREF(arr);
        return ok ? 0 : 1;
    }
    if (PyArray_IsScalar(obj, Generic)) {
        PyArray_Descr *d = PyArray_DescrFromScalar(obj);
        if (!d)
            return -1;
        if (!dtype_supported(d, 1)) {
            Py_DECREF(d);
            return 1;
        }
        n->kind = N_NPSCALAR;
        n->descr = d;
        n->row_bytes = (size_t)PyDataType_ELSIZE(d);
        return 0;
    }
    if (PyBool_Check(obj) || PyLong_CheckExact(obj) || PyFloat_CheckExact(obj)) {
        int type_num = PyBool_Check(obj) ? NPY_BOOL : PyLong_CheckExact(obj) ? NPY_INT64 : NPY_DOUBLE;
        n->kind = PyBool_Check(obj) ? N_BOOL : PyLong_CheckExact(obj) ? N_INT : N_FLOAT;
        n->descr = PyArray_DescrFromType(type_num);
        if (!n->descr)
            return -1;
        n->row_bytes = (size_t)PyDataType_ELSIZE(n->descr);
        return 0;
    }
    if (PyUnicode_CheckExact(obj) || PyBytes_CheckExact(obj)) {
        n->kind = N_PASS;
        n->items = PyList_New(0);
        return n->items ? 0 : -1;
    }
    if (PyTuple_CheckExact(obj) || PyList_CheckExact(obj)) {
        n->kind = N_SEQ;
        n->n_children = PySequence_Fast_GET_SIZE(obj);
        for (Py_ssize_t i = 0; i < n->n_children; i++) {
            int child = p->n_nodes;
            int rc = describe(p, PySequence_Fast_GET_ITEM(obj, i), depth + 1);
            if (rc != 0)
                return rc;
            p->nodes[child].as_tuple = 1;
        }
        return 0;
    }
    if (PyDict_CheckExact(obj)) {
        n->kind = N_DICT;
        PyObject *keys = PyDict_Keys(obj);
        if (!keys)
            return -1;
        n->keys = PyList_AsTuple(keys);
        Py_DECREF(keys);
        if (!n->keys)
            return -1;
        n->n_children = PyTuple_GET_SIZE(n->keys);
        for (Py_ssize_t i = 0; i < n->n_children; i++) {
            /* `n` stays valid: the node array is allocated at full size. */
            PyObject *value = PyDict_GetItemWithError(obj, PyTuple_GET_ITEM(n->keys, i));
            if (!value)
                return PyErr_Occurred() ? -1 : 1;
            int rc = describe(p, value, depth + 1);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    return 1;
}

/* Lays the data leaves out in the slot, each batch array aligned. */
static int layout(plan *p)
{
    size_t offset = 0;
    for (int i = 0; i < p->n_nodes; i++) {
        node *n = &p->nodes[i];
        if (!n->descr)
            continue;
        if (n->row_bytes != 0 && (size_t)p->batch > (SIZE_MAX - offset) / n->row_bytes / 2)
            return 1;
        n->offset = offset;
        offset += n->row_bytes * (size_t)p->batch;
        offset = (offset + LEAF_ALIGN - 1) / LEAF_ALIGN * LEAF_ALIGN;
    }
    p->total_bytes = offset;
    return 0;
}

/* -------------------------------------------------------------- filling */

static int record_copy(plan *p, PyObject *arr, const node *leaf, char *dst)
{
    PyArrayObject *a = (PyArrayObject *)arr;
    copy_task *t = &p->tasks[p->n_tasks++];
    t->source = arr; /* takes the reference */
    t->dst = dst;
    t->data = PyArray_BYTES(a);
    t->leaf = leaf;
    t->itemsize = (size_t)PyArray_ITEMSIZE(a);
    t->strides = NULL;
    if (!PyArray_IS_C_CONTIGUOUS(a)) {
        int64_t *strides = p->strides + p->n_strides;
        for (int d = 0; d < leaf->ndim; d++)
            strides[d] = PyArray_STRIDE(a, d);
        p->n_strides += (size_t)leaf->ndim;
        t->strides = strides;
    }
    return 0;
}

/* Checks sample `b`'s subtree `obj` against node *cursor and fills its part of
 * the slot.  Advances *cursor past the subtree.  Returns 0, 1 on mismatch,
 * -1 on a Python error. */
static int fill(plan *p, PyObject *obj, int *cursor, Py_ssize_t b)
{
    node *n = &p->nodes[(*cursor)++];
    if (!Py_IS_TYPE(obj, n->type))
        return 1;
    char *dst = n->descr ? (char *)p->slot->data + n->offset + n->row_bytes * (size_t)b : NULL;

    switch (n->kind) {
    case N_ARRAY:
    case N_TENSOR: {
        PyObject *arr;
        if (n->kind == N_TENSOR) {
            arr = tensor_as_array(obj);
            if (!arr)
                return 1;
        } else {
            arr = obj;
            Py_INCREF(arr);
        }
        PyArrayObject *a = (PyArrayObject *)arr;
        if (!descr_equal(PyArray_DESCR(a), n->descr) || PyArray_NDIM(a) != n->ndim ||
            (n->ndim > 0 &&
             memcmp(PyArray_DIMS(a), n->shape, sizeof(npy_intp) * (size_t)n->ndim) != 0)) {
            Py_DECREF(arr);
            return 1;
        }
        return record_copy(p, arr, n, dst);
    }
    case N_NPSCALAR: {
        PyArray_Descr *d = PyArray_DescrFromScalar(obj);
        if (!d)
            return -1;
        int same = descr_equal(d, n->descr);
        Py_DECREF(d);
        if (!same)
            return 1;
        PyArray_ScalarAsCtype(obj, dst);
        return 0;
    }
    case N_FLOAT: {
        double v = PyFloat_AS_DOUBLE(obj);
        memcpy(dst, &v, sizeof v);
        return 0;
    }
    case N_INT: {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
        if (overflow)
            return 1; /* torch raises; let the Python collate say so */
        if (v == -1 && PyErr_Occurred())
            return -1;
        int64_t v64 = (int64_t)v;
        memcpy(dst, &v64, sizeof v64);
        return 0;
    }
    case N_BOOL: {
        npy_bool v = obj == Py_True;
        memcpy(dst, &v, sizeof v);
        return 0;
    }
    case N_PASS:
        return PyList_Append(n->items, obj);
    case N_SEQ: {
        if (PySequence_Fast_GET_SIZE(obj) != n->n_children)
            return 1;
        for (Py_ssize_t i = 0; i < n->n_children; i++) {
            int rc = fill(p, PySequence_Fast_GET_ITEM(obj, i), cursor, b);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    case N_DICT: {
        PyObject *keys = n->keys;
        if (PyDict_GET_SIZE(obj) != n->n_children)
            return 1;
        for (Py_ssize_t i = 0; i < n->n_children; i++) {
            PyObject *value = PyDict_GetItemWithError(obj, PyTuple_GET_ITEM(keys, i));
            if (!value)
                return PyErr_Occurred() ? -1 : 1;
            int rc = fill(p, value, cursor, b);
            if (rc != 0)
                return rc;
        }
        return 0;
    }
    }
    return 1;
}

static void run_copies(const plan *p)
{
    for (Py_ssize_t i = 0; i < p->n_tasks; i++) {
        const copy_task *t = &p->tasks[i];
        if (!t->strides) {
            memcpy(t->dst, t->data, t->leaf->row_bytes);
            continue;
        }
        fl_strided src = {.data = t->data, .ndim = t->leaf->ndim, .itemsize = t->itemsize};
        for (int d = 0; d < src.ndim; d++) {
            src.shape[d] = t->leaf->shape[d];
            src.strides[d] = t->strides[d];
        }
        fl_copy_strided(t->dst, &src);
    }
}

/* ---------------------------------------------------------------- output */

static PyObject *build(plan *p, int *cursor, PyObject *owner, PyObject *convert)
{
    node *n = &p->nodes[(*cursor)++];
    if (n->descr) {
        npy_intp dims[NPY_MAXDIMS];
        dims[0] = p->batch;
        memcpy(dims + 1, n->shape, sizeof(npy_intp) * (size_t)n->ndim);
        Py_INCREF(n->descr); /* stolen by fl__slot_array */
        return fl__slot_array(owner, n->offset, n->descr, n->ndim + 1, dims, convert);
    }
    if (n->kind == N_PASS) {
        if (n->as_tuple)
            return PyList_AsTuple(n->items);
        Py_INCREF(n->items);
        return n->items;
    }
    if (n->kind == N_SEQ) {
        PyObject *list = PyList_New(n->n_children);
        if (!list)
            return NULL;
        for (Py_ssize_t i = 0; i < n->n_children; i++) {
            PyObject *child = build(p, cursor, owner, convert);
            if (!child) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, i, child);
        }
        return list;
    }
    /* N_DICT */
    PyObject *dict = PyDict_New();
    if (!dict)
        return NULL;
    for (Py_ssize_t i = 0; i < n->n_children; i++) {
        PyObject *child = build(p, cursor, owner, convert);
        if (!child || PyDict_SetItem(dict, PyTuple_GET_ITEM(n->keys, i), child) < 0) {
            Py_XDECREF(child);
            Py_DECREF(dict);
            return NULL;
        }
        Py_DECREF(child);
    }
    return dict;
}

/* ------------------------------------------------------------------ entry */

PyObject *fl__collate(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    fastload_state *state = fl__state_of_module(module);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "collate(samples, pool, convert) takes 3 arguments");
        return NULL;
    }
    PyObject *samples = args[0], *pool_obj = args[1], *convert = args[2];
    if (!PyList_CheckExact(samples) || PyList_GET_SIZE(samples) == 0)
        Py_RETURN_NOTIMPLEMENTED;
    if (!PyObject_TypeCheck(pool_obj, state->SlotPool_type)) {
        PyErr_SetString(PyExc_TypeError, "collate: pool must be a SlotPool");
        return NULL;
    }

    fl__tensor_type(state); /* so that describe() reads tensor samples */
    plan p = {0};
    p.state = state;
    p.batch = PyList_GET_SIZE(samples);
    PyObject *result = NULL, *owner = NULL;
    int rc;

    p.nodes = PyMem_Calloc(MAX_NODES, sizeof *p.nodes);
    if (!p.nodes) {
        PyErr_NoMemory();
        goto done;
    }
    rc = describe(&p, PyList_GET_ITEM(samples, 0), 0);
    if (rc == 0)
        rc = layout(&p);
    if (rc != 0)
        goto fallback_or_error;

    Py_ssize_t leaves = 0, leaf_dims = 0;
    for (int i = 0; i < p.n_nodes; i++) {
        if (p.nodes[i].kind == N_ARRAY || p.nodes[i].kind == N_TENSOR) {
            leaves++;
            leaf_dims += p.nodes[i].ndim;
        }
    }
    if (leaves > 0) {
        p.tasks = PyMem_RawCalloc((size_t)(leaves * p.batch), sizeof *p.tasks);
        p.strides = PyMem_RawMalloc(sizeof *p.strides * (size_t)(leaf_dims * p.batch + 1));
        if (!p.tasks || !p.strides) {
            PyErr_NoMemory();
            goto done;
        }
    }
    if (fl__acquire_slot(pool_obj, p.total_bytes, &p.slot) < 0)
        goto done;
    for (Py_ssize_t b = 0; b < p.batch; b++) {
        int cursor = 0;
        rc = fill(&p, PyList_GET_ITEM(samples, b), &cursor, b);
        if (rc != 0)
            goto fallback_or_error;
    }

    /* The sources are kept alive by the tasks' references; nothing here
     * touches a Python object. */
    Py_BEGIN_ALLOW_THREADS
    run_copies(&p);
    Py_END_ALLOW_THREADS

    owner = fl__SlotOwner_new(state, p.slot);
    p.slot = NULL; /* the owner has it now */
    if (!owner)
        goto done;
    /* build() reads the slot through the plan; borrow it back from the owner
     * for that, and forget it again before plan_clear. */
    p.slot = ((SlotOwnerObject *)owner)->slot;
    {
        int cursor = 0;
        result = build(&p, &cursor, owner, convert);
    }
    p.slot = NULL;
    goto done;

fallback_or_error:
    if (rc == 1) {
        result = Py_NotImplemented;
        Py_INCREF(result);
    }
done:
    Py_XDECREF(owner);
    plan_clear(&p);
    return result;
}
