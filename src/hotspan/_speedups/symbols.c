/*
 * hotspan._speedups._symbols: naming sampled stacks, the C fast path of
 * hotspan/agent/symbols.py's Symbolizer.name_stack.
 *
 * Why C: an upload names every distinct stack it has, frame by frame (a stack with span
 * labels comes back in every span it was seen in, and each upload starts afresh), and in
 * Python a frame costs a call and two dict lookups.  On a service making many spans that was
 * most of the agent's upload cost (bench/results/agent_instructions.md).
 *
 * A FrameCache maps (code object, byte offset) to the frame's name, file, line and first line,
 * asking the Python namer once per pair.  It is keyed by the code object's address: the entry
 * holds a reference to the code, so that address cannot be reused while the entry lives.  When
 * it is full it starts afresh, as the Python cache does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* CPython fixes the signatures of slots, used or not. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#endif

typedef struct {
    PyObject *code;  /* strong; NULL: an empty slot */
    Py_ssize_t lasti;
    PyObject *frame; /* strong: (name, filename, line, first_line) */
} Slot;

typedef struct {
    PyObject_HEAD PyObject *namer; /* namer(code, lasti) -> frame */
    Slot *slots;
    size_t cap, used, max_entries;
    uint64_t misses;
} FrameCache;

static void
cache_clear(FrameCache *self)
{
    /* Detached first: a code object's deallocation can run Python (weakref callbacks). */
    Slot *old = self->slots;
    size_t cap = self->cap;
    self->slots = NULL;
    self->cap = self->used = 0;
    for (size_t i = 0; old != NULL && i < cap; i++) {
        Py_XDECREF(old[i].code);
        Py_XDECREF(old[i].frame);
    }
    PyMem_Free(old);
}

/* The namer is a bound method of the Symbolizer that holds this cache: a cycle, which the
 * collector breaks here.  Codes and frames cannot lead back, and are not visited. */
static int
cache_traverse(FrameCache *self, visitproc visit, void *arg)
{
    Py_VISIT(self->namer);
    return 0;
}

static int
cache_tp_clear(FrameCache *self)
{
    Py_CLEAR(self->namer);
    cache_clear(self);
    return 0;
}

static void
cache_dealloc(FrameCache *self)
{
    PyObject_GC_UnTrack(self);
    cache_tp_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
cache_init(FrameCache *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"namer", "max_entries", NULL};
    PyObject *namer;
    Py_ssize_t max_entries = 100000;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|n:FrameCache", kwlist, &namer,
                                     &max_entries))
        return -1;
    if (!PyCallable_Check(namer) || max_entries < 1) {
        PyErr_SetString(PyExc_TypeError, "FrameCache(namer: callable, max_entries: int >= 1)");
        return -1;
    }
    Py_XSETREF(self->namer, Py_NewRef(namer));
    self->max_entries = (size_t)max_entries;
    return 0;
}

static inline size_t
slot_hash(const void *code, Py_ssize_t lasti)
{
    uint64_t h = ((uint64_t)(uintptr_t)code >> 4) * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)lasti * 0xC2B2AE3D27D4EB4FULL;
    h ^= h >> 31;
    return (size_t)h;
}

static int
grow(FrameCache *self)
{
    size_t cap = self->cap ? self->cap * 2 : 1024;
    Slot *fresh = PyMem_Calloc(cap, sizeof(Slot));
    if (fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < self->cap; i++) {
        Slot *s = &self->slots[i];
        if (s->code == NULL)
            continue;
        size_t j = slot_hash(s->code, s->lasti) & (cap - 1);
        while (fresh[j].code != NULL)
            j = (j + 1) & (cap - 1);
        fresh[j] = *s;
    }
    PyMem_Free(self->slots);
    self->slots = fresh;
    self->cap = cap;
    return 0;
}

/* The frame of (code, lasti), a borrowed reference valid until the next call; NULL with an
 * error. */
static PyObject *
frame_of(FrameCache *self, PyObject *code, Py_ssize_t lasti)
{
    if (self->cap) {
        size_t mask = self->cap - 1;
        for (size_t j = slot_hash(code, lasti) & mask;; j = (j + 1) & mask) {
            Slot *s = &self->slots[j];
            if (s->code == NULL)
                break;
            if (s->code == code && s->lasti == lasti)
                return s->frame;
        }
    }
    self->misses++;
    PyObject *boxed = PyLong_FromSsize_t(lasti);
    if (boxed == NULL)
        return NULL;
    PyObject *frame = PyObject_CallFunctionObjArgs(self->namer, code, boxed, NULL);
    Py_DECREF(boxed);
    if (frame == NULL)
        return NULL;
    if (self->used >= self->max_entries)
        cache_clear(self);
    if ((self->used + 1) * 2 > self->cap && grow(self) < 0) {
        Py_DECREF(frame);
        return NULL;
    }
    size_t mask = self->cap - 1;
    size_t j = slot_hash(code, lasti) & mask;
    while (self->slots[j].code != NULL)
        j = (j + 1) & mask;
    self->slots[j].code = Py_NewRef(code);
    self->slots[j].lasti = lasti;
    self->slots[j].frame = frame; /* the namer's reference */
    self->used++;
    return frame;
}

PyDoc_STRVAR(
    name_stack_doc,
    "name_stack(stack) -> tuple\n\n"
    "``stack`` is a sequence of (code object or None, byte offset); the result, one frame\n"
    "(name, filename, line, first_line) per entry, from the cache or the namer.");

static PyObject *
cache_name_stack(FrameCache *self, PyObject *stack)
{
    if (self->namer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "FrameCache not initialized");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(stack, "a stack must be a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyTuple_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PySequence_Fast_GET_ITEM(seq, i);
        PyObject *frame;
        if (PyTuple_CheckExact(entry) && PyTuple_GET_SIZE(entry) == 2 &&
            PyLong_CheckExact(PyTuple_GET_ITEM(entry, 1))) {
            PyObject *code = PyTuple_GET_ITEM(entry, 0);
            Py_ssize_t lasti = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 1));
            if (lasti == -1 && PyErr_Occurred())
                goto fail;
            if (code == Py_None) {
                /* Not cached: None has one address and many offsets, all unknown. */
                frame = PyObject_CallFunctionObjArgs(self->namer, code,
                                                     PyTuple_GET_ITEM(entry, 1), NULL);
                if (frame == NULL)
                    goto fail;
                PyTuple_SET_ITEM(out, i, frame);
                continue;
            }
            frame = frame_of(self, code, lasti);
            if (frame == NULL)
                goto fail;
            PyTuple_SET_ITEM(out, i, Py_NewRef(frame));
        } else if (PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 4) {
            /* Already a frame (a stack the pure-Python sampler named itself). */
            PyTuple_SET_ITEM(out, i, Py_NewRef(entry));
        } else {
            PyErr_SetString(PyExc_TypeError, "a stack entry must be (code, offset)");
            goto fail;
        }
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

static PyObject *
cache_clear_method(FrameCache *self, PyObject *unused)
{
    (void)unused;
    cache_clear(self);
    Py_RETURN_NONE;
}

static PyObject *
cache_stats(FrameCache *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("{s:n,s:K}", "entries", (Py_ssize_t)self->used, "misses",
                         (unsigned long long)self->misses);
}

static Py_ssize_t
cache_len(FrameCache *self)
{
    return (Py_ssize_t)self->used;
}

static PyMethodDef cache_methods[] = {
    {"name_stack", (PyCFunction)cache_name_stack, METH_O, name_stack_doc},
    {"clear", (PyCFunction)cache_clear_method, METH_NOARGS, "forget every entry"},
    {"stats", (PyCFunction)cache_stats, METH_NOARGS, "{entries, misses}"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods cache_as_sequence = {
    .sq_length = (lenfunc)cache_len,
};

static PyTypeObject FrameCacheType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._symbols.FrameCache",
    .tp_basicsize = sizeof(FrameCache),
    .tp_dealloc = (destructor)cache_dealloc,
    .tp_as_sequence = &cache_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)cache_traverse,
    .tp_clear = (inquiry)cache_tp_clear,
    .tp_doc = "FrameCache(namer, max_entries=100000): (code, offset) -> frame, named once.",
    .tp_methods = cache_methods,
    .tp_init = (initproc)cache_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hotspan._speedups._symbols",
    .m_doc = "Naming sampled stacks (C twin of hotspan.agent.symbols).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__symbols(void)
{
    if (PyType_Ready(&FrameCacheType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FrameCacheType);
    if (PyModule_AddObject(m, "FrameCache", (PyObject *)&FrameCacheType) < 0) {
        Py_DECREF(&FrameCacheType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
