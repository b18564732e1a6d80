/* fastload._C: the Timers type — a loader's timers (core/observe/stats.h) as a
 * Python object, and the functions that let Python code add to them.
 *
 * fastload/observe/stats.py turns snapshots into what users read; this file only
 * moves numbers.  Rows are written by the threads bound to them, without the
 * GIL; everything here that reads or binds runs with it. */
#include "bind/fastload.h"

#include "core/observe/nvtx.h"
#include "core/observe/stats.h"
#include "core/status.h"

#include <assert.h>

/* STAGES, then the trace's other event kinds (TRACE_KINDS). */
static const char *const event_names[FL_EVENT_KINDS] = {
    [FL_STAGE_READ] = "read",       [FL_STAGE_DECODE] = "decode",
    [FL_STAGE_TRANSFORM] = "transform", [FL_STAGE_COLLATE] = "collate",
    [FL_STAGE_DATASET] = "dataset", [FL_STAGE_UPLOAD] = "upload",
    [FL_EVENT_JOB] = "batch",       [FL_EVENT_GIL] = "GIL wait",
};

/* A row as a flat tuple: stage_ns..., stage_calls..., busy, idle, gil, cpu,
 * jobs (fastload/observe/stats.py names the positions). */
#define ROW_FIELDS (2 * FL_STAGES + FL_ACTIVITIES + 1)

typedef struct TimersObject {
    PyObject_HEAD
    fl_stats *stats; /* one reference */
} TimersObject;

fl_stats *fl__stats_of(PyObject *obj)
{
    return ((TimersObject *)obj)->stats;
}

static PyObject *Timers_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"rows", NULL};
    int rows;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i:Timers", kwlist, &rows))
        return NULL;
    if (rows < 1 || rows > 4096) {
        PyErr_SetString(PyExc_ValueError, "Timers: rows must be in 1..4096");
        return NULL;
    }
    TimersObject *self = (TimersObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->stats = fl_stats_new(rows);
    if (!self->stats) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void Timers_dealloc(TimersObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    /* A thread still bound to a row holds no reference: unbinding is the
     * binder's job (bind()'s doc), and engines hold references of their own. */
    fl_stats_release(self->stats);
    type->tp_free(self);
    Py_DECREF(type);
}

static int row_index(TimersObject *self, PyObject *arg, int *out)
{
    long row = PyLong_AsLong(arg);
    if (row == -1 && PyErr_Occurred())
        return -1;
    if (row < 0 || row >= self->stats->num_rows) {
        PyErr_Format(PyExc_IndexError, "Timers: no row %ld (it has %d)", row,
                     self->stats->num_rows);
        return -1;
    }
    *out = (int)row;
    return 0;
}

static uint64_t load(_Atomic uint64_t *counter)
{
    return atomic_load_explicit(counter, memory_order_relaxed);
}

static PyObject *row_tuple(fl_stats *stats, int r)
{
    fl_stats_row *row = &stats->rows[r];
    PyObject *t = PyTuple_New(ROW_FIELDS);
    if (!t)
        return NULL;
    uint64_t values[ROW_FIELDS];
    int k = 0;
    for (int s = 0; s < FL_STAGES; s++)
        values[k++] = load(&row->stage_ns[s]);
    for (int s = 0; s < FL_STAGES; s++)
        values[k++] = load(&row->stage_calls[s]);
    for (int a = 0; a < FL_ACTIVITIES; a++)
        values[k++] = a == FL_CPU ? fl_stats_row_cpu(stats, r) : load(&row->activity_ns[a]);
    values[k++] = load(&row->jobs);
    for (int i = 0; i < ROW_FIELDS; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(values[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *Timers_snapshot(TimersObject *self, PyObject *unused)
{
    (void)unused;
    fl_stats *stats = self->stats;
    PyObject *rows = PyList_New(stats->num_rows);
    PyObject *hist = PyList_New(0);
    PyObject *result = NULL;
    if (!rows || !hist)
        goto done;
    for (int r = 0; r < stats->num_rows; r++) {
        PyObject *t = row_tuple(stats, r);
        if (!t)
            goto done;
        PyList_SET_ITEM(rows, r, t);
    }
    const fl_stats_consumer *c = &stats->consumer;
    for (int b = 0; b < FL_STATS_BUCKETS; b++) {
        if (!c->wait_hist[b])
            continue;
        uint64_t lo, hi;
        fl_stats_bucket_range(b, &lo, &hi);
        PyObject *item = Py_BuildValue("(KKK)", (unsigned long long)lo, (unsigned long long)hi,
                                       (unsigned long long)c->wait_hist[b]);
        if (!item || PyList_Append(hist, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    result = Py_BuildValue(
        "{sOs{sKsKsKsKsKsKsKsKsKsO}}", "rows", rows, "consumer", "batches",
        (unsigned long long)c->batches, "wait_ns", (unsigned long long)c->wait_ns, "period_ns",
        (unsigned long long)c->period_ns, "depth_samples", (unsigned long long)c->depth_samples,
        "in_flight_sum", (unsigned long long)c->in_flight_sum, "ready_sum",
        (unsigned long long)c->ready_sum, "empty_asks", (unsigned long long)c->empty_asks,
        "idle_at_cap_asks", (unsigned long long)c->idle_at_cap_asks, "starved_wait_ns",
        (unsigned long long)c->starved_wait_ns, "wait_hist", hist);
done:
    Py_XDECREF(rows);
    Py_XDECREF(hist);
    return result;
}

static PyObject *Timers_reset(TimersObject *self, PyObject *unused)
{
    (void)unused;
    fl_stats_reset(self->stats);
    Py_RETURN_NONE;
}

static PyObject *Timers_record_next(TimersObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    uint64_t now = fl_stats_now();
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "record_next(called_at, last) takes 2 arguments");
        return NULL;
    }
    unsigned long long v[2];
    for (int i = 0; i < 2; i++) {
        v[i] = PyLong_AsUnsignedLongLong(args[i]);
        if (v[i] == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    uint64_t called_at = v[0], since = v[1] ? v[1] : v[0];
    if (called_at > now || since > now) {
        PyErr_SetString(PyExc_ValueError, "record_next: times after now (use clock_ns())");
        return NULL;
    }
    fl_stats_record_batch(self->stats, now - called_at, now - since);
    return PyLong_FromUnsignedLongLong(now);
}

static PyObject *Timers_note_depth(TimersObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 4) {
        PyErr_SetString(PyExc_TypeError,
                        "note_depth(in_flight, ready, deliverable=None, idle_at_cap=False) takes "
                        "2 to 4 arguments");
        return NULL;
    }
    unsigned long long in_flight = PyLong_AsUnsignedLongLong(args[0]);
    unsigned long long ready = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    int deliverable = ready > 0, idle_at_cap = 0;
    if (nargs > 2 && args[2] != Py_None && (deliverable = PyObject_IsTrue(args[2])) < 0)
        return NULL;
    if (nargs > 3 && (idle_at_cap = PyObject_IsTrue(args[3])) < 0)
        return NULL;
    fl_stats_note_depth(self->stats, in_flight, ready, deliverable, idle_at_cap);
    Py_RETURN_NONE;
}

static PyObject *Timers_take(TimersObject *self, PyObject *arg)
{
    int r;
    if (row_index(self, arg, &r) < 0)
        return NULL;
    PyObject *t = row_tuple(self->stats, r);
    if (t) /* only the row's writer calls this, so nothing lands in between */
        fl_stats_row_zero(&self->stats->rows[r]);
    return t;
}

static PyObject *Timers_add(TimersObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int r;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "add(row, values) takes 2 arguments");
        return NULL;
    }
    if (row_index(self, args[0], &r) < 0)
        return NULL;
    if (!PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != ROW_FIELDS) {
        PyErr_Format(PyExc_ValueError, "Timers.add: values must be a tuple of %d ints "
                                       "(as take() returns)", ROW_FIELDS);
        return NULL;
    }
    uint64_t v[ROW_FIELDS];
    for (int i = 0; i < ROW_FIELDS; i++) {
        v[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(args[1], i));
        if (v[i] == (uint64_t)-1 && PyErr_Occurred())
            return NULL;
    }
    /* The consumer adds a process worker's times: it is that row's writer. */
    fl_stats_row *row = &self->stats->rows[r];
    int k = 0;
    for (int s = 0; s < FL_STAGES; s++, k++)
        atomic_fetch_add_explicit(&row->stage_ns[s], v[k], memory_order_relaxed);
    for (int s = 0; s < FL_STAGES; s++, k++)
        atomic_fetch_add_explicit(&row->stage_calls[s], v[k], memory_order_relaxed);
    for (int a = 0; a < FL_ACTIVITIES; a++, k++)
        atomic_fetch_add_explicit(&row->activity_ns[a], v[k], memory_order_relaxed);
    atomic_fetch_add_explicit(&row->jobs, v[k], memory_order_relaxed);
    Py_RETURN_NONE;
}

static int stage_arg(PyObject *arg, fl_stage *out)
{
    long stage = PyLong_AsLong(arg);
    if (stage == -1 && PyErr_Occurred())
        return -1;
    if (stage < 0 || stage >= FL_STAGES) {
        PyErr_Format(PyExc_ValueError, "no stage %ld (STAGES has %d)", stage, FL_STAGES);
        return -1;
    }
    *out = (fl_stage)stage;
    return 0;
}

static PyObject *Timers_add_stage(TimersObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    int r;
    fl_stage stage;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "add_stage(row, stage, start_ns, end_ns) takes 4 arguments");
        return NULL;
    }
    if (row_index(self, args[0], &r) < 0 || stage_arg(args[1], &stage) < 0)
        return NULL;
    unsigned long long start = PyLong_AsUnsignedLongLong(args[2]);
    unsigned long long end = PyLong_AsUnsignedLongLong(args[3]);
    if (PyErr_Occurred())
        return NULL;
    if (end < start) {
        PyErr_SetString(PyExc_ValueError, "add_stage: end_ns before start_ns");
        return NULL;
    }
    fl_stats_add_stage(&self->stats->rows[r], stage, end - start);
    fl_trace_record((int)stage, start, end);
    Py_RETURN_NONE;
}

/* Bindings made from Python nest (a loader iterated inside another's
 * dataset): each bind saves the one it replaces, each unbind restores it. */
#define MAX_NESTED_BINDS 16
static _Thread_local fl_stats_row *replaced[MAX_NESTED_BINDS];
static _Thread_local int nested;

static PyObject *Timers_bind(TimersObject *self, PyObject *arg)
{
    int r;
    if (row_index(self, arg, &r) < 0)
        return NULL;
    if (nested == MAX_NESTED_BINDS) {
        PyErr_SetString(PyExc_RuntimeError, "Timers.bind: loaders nested too deeply");
        return NULL;
    }
    replaced[nested++] = fl_stats_bind(&self->stats->rows[r]);
    Py_RETURN_NONE;
}

static PyObject *Timers_unbind(TimersObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    fl_stats_bind(nested > 0 ? replaced[--nested] : NULL);
    Py_RETURN_NONE;
}

static PyObject *Timers_get_rows(TimersObject *self, void *closure)
{
    (void)closure;
    return PyLong_FromLong(self->stats->num_rows);
}

static PyMethodDef Timers_methods[] = {
    {"snapshot", (PyCFunction)Timers_snapshot, METH_NOARGS,
     "snapshot()\n--\n\n"
     "{'rows': [row tuple per row], 'consumer': {...}}: a row tuple holds\n"
     "the ns and calls of each stage in STAGES order, then busy, idle,\n"
     "GIL-wait and CPU ns and the number of jobs; the consumer's wait histogram is a\n"
     "list of (lo_ns, hi_ns, count) for the buckets in use."},
    {"reset", (PyCFunction)Timers_reset, METH_NOARGS, "reset()\n--\n\nZeroes every counter."},
    {"record_next", (PyCFunction)(void (*)(void))Timers_record_next, METH_FASTCALL,
     "record_next(called_at, last, /)\n--\n\n"
     "The loop's next(), called at `called_at` (clock_ns()), returns a batch\n"
     "now: records its wait and the time since `last` (the previous batch's\n"
     "return, or 0 for the first of an epoch).  Returns now, the next call's\n"
     "`last`."},
    {"note_depth", (PyCFunction)(void (*)(void))Timers_note_depth, METH_FASTCALL,
     "note_depth(in_flight, ready, deliverable=None, idle_at_cap=False, /)\n--\n\n"
     "As the loop asks for a batch: in_flight batches are in flight, `ready`\n"
     "of them done; `deliverable`: the next one to deliver is done (None:\n"
     "ready > 0); `idle_at_cap`: none is, and a worker has nothing to do\n"
     "because in_flight is at the cap.  A thread Engine notes this itself."},
    {"take", (PyCFunction)Timers_take, METH_O,
     "take(row, /)\n--\n\n"
     "Row `row` as a tuple (see snapshot), zeroed after.  Only for the thread\n"
     "bound to that row."},
    {"add", (PyCFunction)(void (*)(void))Timers_add, METH_FASTCALL,
     "add(row, values, /)\n--\n\nAdds a tuple from take() (another process's) to a row."},
    {"add_stage", (PyCFunction)(void (*)(void))Timers_add_stage, METH_FASTCALL,
     "add_stage(row, stage, start_ns, end_ns, /)\n--\n\n"
     "Adds a stage that ran from start_ns to end_ns (clock_ns()) on the calling\n"
     "thread to a row no thread is bound to (the caller is its one writer)."},
    {"bind", (PyCFunction)Timers_bind, METH_O,
     "bind(row, /)\n--\n\n"
     "The calling thread's work is timed into row `row` until unbind(); the\n"
     "caller keeps this object alive until then.  Binds nest."},
    {"unbind", (PyCFunction)Timers_unbind, METH_NOARGS,
     "unbind()\n--\n\nRestores the binding the last bind() replaced."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Timers_getset[] = {
    {"rows", (getter)Timers_get_rows, NULL, "number of rows", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Timers_slots[] = {
    {Py_tp_doc, "Timers(rows)\n--\n\n"
                "A loader's timers: `rows` rows of per-stage and per-activity times\n"
                "(one per worker, and one for the consumer's thread), and the\n"
                "consumer's wait per batch."},
    {Py_tp_new, Timers_new},
    {Py_tp_dealloc, Timers_dealloc},
    {Py_tp_methods, Timers_methods},
    {Py_tp_getset, Timers_getset},
    {0, NULL},
};

PyType_Spec fl__Timers_spec = {
    .name = "fastload._C.Timers",
    .basicsize = sizeof(TimersObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Timers_slots,
};

/* ------------------------------------------- stages run by Python code
 *
 * Python code may run anything between the start and the end of a stage
 * (a dataset that iterates another loader, whose timers come and go), so
 * nothing is kept across them but a token: the start time, and whether an
 * NVTX range was pushed.  The end goes to the row bound to the thread then. */

static int stage_of(PyObject *arg, fl_stage *out)
{
    return stage_arg(arg, out);
}

/* Token: start_ns * 2 + pushed; 0 when nothing is timed. */
static PyObject *stage_start(fl_stage stage)
{
    if (!fl_stats_current())
        return PyLong_FromLong(0);
    int pushed = fl_nvtx_on();
    if (pushed)
        fl_stats_nvtx_push(stage);
    return PyLong_FromUnsignedLongLong((fl_stats_now() << 1) | (uint64_t)pushed);
}

static int stage_finish(fl_stage stage, PyObject *token_obj)
{
    unsigned long long token = PyLong_AsUnsignedLongLong(token_obj);
    if (token == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (token == 0)
        return 0;
    uint64_t start = token >> 1, now = fl_stats_now();
    fl_stats_row *row = fl_stats_current();
    if (row && now >= start) {
        fl_stats_add_stage(row, stage, now - start);
        fl_trace_record((int)stage, start, now);
    }
    if (token & 1)
        fl_nvtx_pop();
    return 0;
}

PyObject *fl__stage_begin(PyObject *module, PyObject *arg)
{
    (void)module;
    fl_stage stage;
    if (stage_of(arg, &stage) < 0)
        return NULL;
    return stage_start(stage);
}

PyObject *fl__stage_end(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    fl_stage stage;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "stage_end(stage, token) takes 2 arguments");
        return NULL;
    }
    if (stage_of(args[0], &stage) < 0 || stage_finish(stage, args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *fl__stage_switch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    fl_stage ended, next;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "stage_switch(ended, token, next) takes 3 arguments");
        return NULL;
    }
    if (stage_of(args[0], &ended) < 0 || stage_of(args[2], &next) < 0 ||
        stage_finish(ended, args[1]) < 0)
        return NULL;
    return stage_start(next);
}

PyObject *fl__clock_ns(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(fl_stats_now());
}

/* ------------------------------------------------------------- profilers */

static_assert(sizeof(fl_trace_event) == 24, "fastload/observe/profiler.py reads 24-byte events");

PyObject *fl__trace_start(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_ssize_t capacity = PyLong_AsSsize_t(arg);
    if (capacity == -1 && PyErr_Occurred())
        return NULL;
    if (capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "trace_start: capacity must be >= 1");
        return NULL;
    }
    if (fl_trace_start((size_t)capacity) != FL_OK)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyObject *fl__trace_take(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_ssize_t max = PyLong_AsSsize_t(arg);
    if (max == -1 && PyErr_Occurred())
        return NULL;
    if (max < 0) {
        PyErr_SetString(PyExc_ValueError, "trace_take: max must be >= 0");
        return NULL;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, max * (Py_ssize_t)sizeof(fl_trace_event));
    if (!bytes)
        return NULL;
    uint64_t dropped = 0;
    size_t n = fl_trace_take((fl_trace_event *)PyBytes_AS_STRING(bytes), (size_t)max, &dropped);
    if (_PyBytes_Resize(&bytes, (Py_ssize_t)(n * sizeof(fl_trace_event))) < 0)
        return NULL;
    return Py_BuildValue("(NK)", bytes, (unsigned long long)dropped);
}

PyObject *fl__trace_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    fl_trace_stop();
    Py_RETURN_NONE;
}

PyObject *fl__trace_on(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(fl_trace_on());
}

PyObject *fl__nvtx_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    const char *path = NULL;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "nvtx_start(path=None) takes at most 1 argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        path = PyUnicode_AsUTF8(args[0]);
        if (!path)
            return NULL;
    }
    char msg[512];
    if (fl_nvtx_start(path, msg, sizeof msg) < 0) {
        PyErr_SetString(PyExc_OSError, msg);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyObject *fl__nvtx_stop(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    fl_nvtx_stop();
    Py_RETURN_NONE;
}

PyObject *fl__nvtx_on(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyBool_FromLong(fl_nvtx_on());
}

PyObject *fl__set_stats_enabled(PyObject *module, PyObject *arg)
{
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    fl_stats_set_enabled(on);
    Py_RETURN_NONE;
}

static int add_names(PyObject *module, const char *attr, int n)
{
    PyObject *names = PyTuple_New(n);
    if (!names)
        return -1;
    for (int s = 0; s < n; s++) {
        PyObject *name = PyUnicode_FromString(event_names[s]);
        if (!name) {
            Py_DECREF(names);
            return -1;
        }
        PyTuple_SET_ITEM(names, s, name);
    }
    if (PyModule_AddObject(module, attr, names) < 0) {
        Py_DECREF(names);
        return -1;
    }
    return 0;
}

int fl__stats_module_exec(PyObject *module)
{
    fl_nvtx_auto(); /* a profiler that listens for NVTX gets ranges from the start */
    if (add_names(module, "STAGES", FL_STAGES) < 0 ||
        add_names(module, "TRACE_KINDS", FL_EVENT_KINDS) < 0)
        return -1;
    return 0;
}
