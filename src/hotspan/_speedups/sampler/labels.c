/* Span and tag labels: the Labels type the agent keeps in a ContextVar, and finding it in a
 * thread's context from a signal handler (a walk of CPython's context HAMT, whose layout is
 * mirrored here).  Apart from the handler and the linker because both read labels, and the
 * layout mirrors are the one place that knows CPython's context internals. */
#include "internal.h"

static PyObject *
labels_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"span_id", "trace_hi",     "trace_lo", "root_span_id",
                             "tagset",  "otel_context", NULL};
    unsigned long long v[5] = {0, 0, 0, 0, 0};
    PyObject *otel_context = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|KKKKKO", kwlist, &v[0], &v[1], &v[2], &v[3],
                                     &v[4], &otel_context))
        return NULL;
    LabelsObject *self = (LabelsObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->span_id = v[0];
    self->trace_hi = v[1];
    self->trace_lo = v[2];
    self->root_span_id = v[3];
    self->tagset = v[4];
    if (otel_context != NULL && otel_context != Py_None)
        self->otel_context = Py_NewRef(otel_context);
    return (PyObject *)self;
}

static void
labels_dealloc(LabelsObject *self)
{
    Py_XDECREF(self->otel_context);
    Py_XDECREF(self->trace_obj);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
labels_get_otel_context(LabelsObject *self, void *unused)
{
    return Py_NewRef(self->otel_context ? self->otel_context : Py_None);
}

static PyObject *
labels_get(LabelsObject *self, void *which)
{
    return PyLong_FromUnsignedLongLong(((uint64_t *)&self->span_id)[(intptr_t)which]);
}

static PyObject *
labels_get_sampled(LabelsObject *self, void *unused)
{
    return PyBool_FromLong(self->sampled);
}

static int
labels_set_sampled(LabelsObject *self, PyObject *value, void *unused)
{
    int truth = value ? PyObject_IsTrue(value) : 0;
    if (truth < 0)
        return -1;
    self->sampled = truth;
    return 0;
}

static PyObject *
labels_get_stat(LabelsObject *self, void *which)
{
    uint64_t *fields[] = {&self->cpu_ns, &self->alloc_bytes, &self->gc_pause_ns,
                          &self->gc_count};
    return PyLong_FromUnsignedLongLong(
        __atomic_load_n(fields[(intptr_t)which], __ATOMIC_RELAXED));
}

/* _charge(cpu_ns, alloc_bytes, gc_pause_ns=0, gc_count=0): adds to the span stats (the Python
 * sampler's CPU, a child's figures), atomically as the signal handlers do. */
static PyObject *
labels_charge_method(LabelsObject *self, PyObject *args)
{
    unsigned long long cpu = 0, alloc = 0, pause = 0, count = 0;
    if (!PyArg_ParseTuple(args, "KK|KK", &cpu, &alloc, &pause, &count))
        return NULL;
    labels_charge(self, cpu, alloc);
    labels_charge_gc(self, pause, count);
    Py_RETURN_NONE;
}

/* _forget_span(): these labels name no span from now on, in every context holding them (the
 * contexts copied from one share the object).  Each word is stored whole, so a signal handler
 * copying them meanwhile sees each either before or after. */
static PyObject *
labels_forget_span(LabelsObject *self, PyObject *unused)
{
    __atomic_store_n(&self->span_id, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&self->root_span_id, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&self->trace_hi, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&self->trace_lo, 0, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

static PyMethodDef labels_methods[] = {
    {"_charge", (PyCFunction)labels_charge_method, METH_VARARGS,
     "_charge(cpu_ns, alloc_bytes, gc_pause_ns=0, gc_count=0): add to this span's stats"},
    {"_forget_span", (PyCFunction)labels_forget_span, METH_NOARGS,
     "_forget_span(): name no span from now on (the span was a stand-in)"},
    {NULL},
};

static PyGetSetDef labels_getset[] = {
    {"cpu_ns", (getter)labels_get_stat, NULL, NULL, (void *)0},
    {"alloc_bytes", (getter)labels_get_stat, NULL, NULL, (void *)1},
    {"gc_pause_ns", (getter)labels_get_stat, NULL, NULL, (void *)2},
    {"gc_count", (getter)labels_get_stat, NULL, NULL, (void *)3},
    {"sampled", (getter)labels_get_sampled, (setter)labels_set_sampled, NULL, NULL},
    {"otel_context", (getter)labels_get_otel_context, NULL, NULL, NULL},
    {"span_id", (getter)labels_get, NULL, NULL, (void *)0},
    {"trace_hi", (getter)labels_get, NULL, NULL, (void *)1},
    {"trace_lo", (getter)labels_get, NULL, NULL, (void *)2},
    {"root_span_id", (getter)labels_get, NULL, NULL, (void *)3},
    {"tagset", (getter)labels_get, NULL, NULL, (void *)4},
    {NULL},
};

PyTypeObject LabelsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._sampler.Labels",
    .tp_basicsize = sizeof(LabelsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = labels_new,
    .tp_dealloc = (destructor)labels_dealloc,
    .tp_getset = labels_getset,
    .tp_methods = labels_methods,
    .tp_doc = "Span and tag labels of the current context, readable from a signal handler.",
};

/* Mirrors of CPython's context and HAMT layouts (Python/context.c, Python/hamt.c; unchanged
 * since 3.7).  module init checks them against real contexts and turns label lookup off if
 * they do not match. */
typedef struct {
    PyObject_HEAD void *ctx_prev;
    PyObject *ctx_vars;
} CtxMirror;
typedef struct {
    PyObject_HEAD PyObject *h_root;
} HamtMirror;
typedef struct {
    PyObject_VAR_HEAD uint32_t b_bitmap;
    PyObject *b_array[1];
} BitmapNodeMirror;
typedef struct {
    PyObject_HEAD PyObject *a_array[32];
} ArrayNodeMirror;

static PyObject *labels_var;          /* the agent's ContextVar */
static int32_t labels_var_hash;
static PyTypeObject *bitmap_node_type;
static PyTypeObject *array_node_type;
static int labels_lookup_ok;

LabelsObject *
find_labels(PyObject *context)
{
    if (!labels_lookup_ok || context == NULL)
        return NULL;
    PyObject *hamt = ((CtxMirror *)context)->ctx_vars;
    if (hamt == NULL)
        return NULL;
    PyObject *node = ((HamtMirror *)hamt)->h_root;
    uint32_t shift = 0;
    for (int level = 0; node != NULL && level < 8; level++) {
        PyTypeObject *type = Py_TYPE(node);
        uint32_t idx = ((uint32_t)labels_var_hash >> shift) & 0x1f;
        if (type == bitmap_node_type) {
            BitmapNodeMirror *b = (BitmapNodeMirror *)node;
            uint32_t bit = 1u << idx;
            if (!(b->b_bitmap & bit))
                return NULL;
            uint32_t pos = (uint32_t)__builtin_popcount(b->b_bitmap & (bit - 1));
            PyObject *key = b->b_array[2 * pos];
            PyObject *val = b->b_array[2 * pos + 1];
            if (key == NULL) {
                node = val;
            } else if (key == labels_var) {
                return (val != NULL && Py_TYPE(val) == &LabelsType) ? (LabelsObject *)val
                                                                    : NULL;
            } else {
                return NULL;
            }
        } else if (type == array_node_type) {
            node = ((ArrayNodeMirror *)node)->a_array[idx];
        } else {
            return NULL; /* a collision node: two keys with one 32-bit hash; not worth it */
        }
        shift += 5;
    }
    return NULL;
}

void
copy_labels(LabelsObject *labels, uint64_t *out)
{
    if (labels == NULL) {
        memset(out, 0, 5 * sizeof(uint64_t));
        return;
    }
    labels->sampled = 1;
    out[0] = labels->span_id;
    out[1] = labels->trace_hi;
    out[2] = labels->trace_lo;
    out[3] = labels->root_span_id;
    out[4] = labels->tagset;
}

PyObject *
sampler_enable_labels(PyObject *mod, PyObject *args)
{
    /* Node types learned from real HAMTs built by the caller: (var, bitmap-rooted context,
     * array-rooted context).  Lookup is enabled only if both find the var's value. */
    PyObject *var, *small_ctx, *big_ctx;
    if (!PyArg_ParseTuple(args, "OOO", &var, &small_ctx, &big_ctx))
        return NULL;
    if (!PyContext_CheckExact(small_ctx) || !PyContext_CheckExact(big_ctx)) {
        PyErr_SetString(PyExc_TypeError, "contexts expected");
        return NULL;
    }
    labels_lookup_ok = 0;
    PyObject *small_root = ((HamtMirror *)((CtxMirror *)small_ctx)->ctx_vars)->h_root;
    PyObject *big_root = ((HamtMirror *)((CtxMirror *)big_ctx)->ctx_vars)->h_root;
    if (small_root == NULL || big_root == NULL)
        Py_RETURN_FALSE;
    bitmap_node_type = Py_TYPE(small_root);
    array_node_type = Py_TYPE(big_root);
    if (bitmap_node_type == array_node_type)
        Py_RETURN_FALSE;
    Py_XSETREF(labels_var, Py_NewRef(var));
    Py_hash_t h = PyObject_Hash(var);
    if (h == -1)
        return NULL;
#if SIZEOF_PY_HASH_T > 4
    int32_t folded = (int32_t)(h & 0xffffffffl) ^ (int32_t)(h >> 32);
    labels_var_hash = folded == -1 ? -2 : folded;
#else
    labels_var_hash = (int32_t)h;
#endif
    labels_lookup_ok = 1;
    Py_RETURN_TRUE;
}

PyObject *
sampler_find_in(PyObject *mod, PyObject *ctx)
{
    if (!PyContext_CheckExact(ctx)) {
        PyErr_SetString(PyExc_TypeError, "a contextvars.Context expected");
        return NULL;
    }
    LabelsObject *found = find_labels(ctx);
    if (found == NULL)
        Py_RETURN_NONE;
    return Py_NewRef((PyObject *)found);
}

/* With the GIL: {thread ident: (span, trace hi, trace lo, root span, tag set)} for every thread
 * of this interpreter whose current context holds labels.  The threads-and-tasks profile needs
 * other threads' labels, which Python cannot read (a ContextVar is only readable from its own
 * thread). */
#ifdef Py_GIL_DISABLED
/* Free-threaded, another thread's context may be replaced and freed while it is read: each
 * thread's labels are those of its last sample instead (labels_of_last_samples), which is
 * what it had current at most a sampling interval ago, while it ran. */
PyObject *
sampler_thread_labels(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return labels_of_last_samples();
}
#else
PyObject *
sampler_thread_labels(PyObject *mod, PyObject *unused)
{
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    PyInterpreterState *interp = PyInterpreterState_Get();
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL;
         ts = PyThreadState_Next(ts)) {
        LabelsObject *found = find_labels(thread_context(ts));
        if (found == NULL)
            continue;
        uint64_t l[HOTSPAN_LABEL_WORDS];
        copy_labels(found, l);
        PyObject *key = PyLong_FromUnsignedLongLong((unsigned long long)ts->thread_id);
        PyObject *value = Py_BuildValue("(KKKKK)", (unsigned long long)l[0],
                                        (unsigned long long)l[1], (unsigned long long)l[2],
                                        (unsigned long long)l[3], (unsigned long long)l[4]);
        int failed = key == NULL || value == NULL || PyDict_SetItem(out, key, value) < 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}
#endif
