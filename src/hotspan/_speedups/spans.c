/* Span conditions in C: the span processor that judges every span the program ends (slow,
 * failed, high CPU) and keeps each verdict for a while, the twin of agent/spans.py's
 * PyVerdicts and its processor.
 *
 * The OpenTelemetry SDK calls on_start, _on_ending and on_end of every processor for every
 * span.  In Python those three calls and the verdict cost about 0.7 us a span; here the two
 * hooks that do nothing are C no-ops and on_end is a few attribute reads and a store into an
 * open-addressed table, well under a tenth of that.
 *
 * Verdicts live in two generations of fixed-size tables (span id -> local parent id and
 * condition bits): when the newer one holds `max_spans / 2` verdicts or is `max_age_ns / 2`
 * old (looked at every 1,024 ends), the older one is dropped.  Memory is bounded by
 * construction: two tables of the next power of two above `max_spans` slots, 24 bytes each.
 *
 * Everything here runs with the GIL (the SDK's processors, the agent's upload path): these
 * extensions are not built for free-threaded CPython. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT, T_ULONGLONG: the same on 3.9 to 3.14 */

#include <stdint.h>
#include <string.h>
#include <time.h>

#define SLOW_BIT 1
#define ERROR_BIT 2
#define HIGH_CPU_BIT 4
#define MAX_ANCESTORS 256

typedef struct {
    uint64_t span_id; /* 0: empty */
    uint64_t parent;  /* the local parent's span id, or 0 */
    uint64_t bits;
} Slot;

typedef struct {
    Slot *slots;
    size_t mask;
    size_t count;
} Table;

typedef struct {
    PyObject_HEAD Table current, older;
    size_t generation_size;
    uint64_t generation_ns;
    uint64_t generation_start;
    uint64_t slow_ns; /* 0: off */
    int errors;
    double cpu_ratio; /* 0: off */
    PyObject *error_code; /* StatusCode.ERROR */
    PyObject *cpu_key;    /* the span attribute with the span's CPU time */
    unsigned long long ended, slow, error, high_cpu, forgotten;
} VerdictsObject;

static PyObject *str_start_time, *str_end_time, *str_status, *str_status_code, *str_context,
    *str_parent, *str_attributes;

static uint64_t
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline size_t
hash_id(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return (size_t)id;
}

static int
table_init(Table *t, size_t entries)
{
    size_t cap = 16;
    while (cap < 2 * entries)
        cap <<= 1;
    /* calloc: pages of the table the program never reaches are never touched. */
    t->slots = calloc(cap, sizeof(Slot));
    if (t->slots == NULL)
        return -1;
    t->mask = cap - 1;
    t->count = 0;
    return 0;
}

static const Slot *
table_find(const Table *t, uint64_t span_id)
{
    for (size_t i = hash_id(span_id) & t->mask;; i = (i + 1) & t->mask) {
        const Slot *s = &t->slots[i];
        if (s->span_id == span_id)
            return s;
        if (s->span_id == 0)
            return NULL;
    }
}

/* The table holds at most half its slots (rotation comes first), so a free slot is found. */
static void
table_put(Table *t, uint64_t span_id, uint64_t parent, uint64_t bits)
{
    for (size_t i = hash_id(span_id) & t->mask;; i = (i + 1) & t->mask) {
        Slot *s = &t->slots[i];
        if (s->span_id == span_id || s->span_id == 0) {
            if (s->span_id == 0)
                t->count++;
            s->span_id = span_id;
            s->parent = parent;
            s->bits = bits;
            return;
        }
    }
}

static const Slot *
verdict_of(VerdictsObject *self, uint64_t span_id)
{
    const Slot *s = table_find(&self->current, span_id);
    return s != NULL ? s : table_find(&self->older, span_id);
}

static void
rotate(VerdictsObject *self)
{
    self->forgotten += self->older.count;
    Table dropped = self->older;
    self->older = self->current;
    memset(dropped.slots, 0, (dropped.mask + 1) * sizeof(Slot));
    dropped.count = 0;
    self->current = dropped;
    self->generation_start = monotonic_ns();
}

static int
verdicts_init(VerdictsObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"slow_ns", "errors", "cpu_ratio", "max_spans", "max_age_ns", NULL};
    unsigned long long slow = 0, max_age = 600000000000ull;
    int errors = 0;
    double cpu_ratio = 0.0;
    Py_ssize_t max_spans = 50000;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Kpd|nK", kwlist, &slow, &errors, &cpu_ratio,
                                     &max_spans, &max_age))
        return -1;
    if (max_spans < 2 || max_spans > 100000000) {
        PyErr_SetString(PyExc_ValueError, "max_spans must be 2..100,000,000");
        return -1;
    }
    if (self->current.slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Verdicts is already initialised");
        return -1;
    }
    self->generation_size = (size_t)max_spans / 2;
    if (table_init(&self->current, self->generation_size) < 0 ||
        table_init(&self->older, self->generation_size) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    self->slow_ns = slow;
    self->errors = errors;
    self->cpu_ratio = cpu_ratio > 0 ? cpu_ratio : 0.0;
    self->generation_ns = max_age / 2;
    self->generation_start = monotonic_ns();
    return 0;
}

static void
verdicts_dealloc(VerdictsObject *self)
{
    free(self->current.slots);
    free(self->older.slots);
    Py_XDECREF(self->error_code);
    Py_XDECREF(self->cpu_key);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* An int attribute of `obj` as uint64; -1 (and no error set) when absent or not an int. */
static int
u64_attr(PyObject *obj, PyObject *name, uint64_t *out)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL || !PyLong_Check(v)) {
        Py_XDECREF(v);
        PyErr_Clear();
        return -1;
    }
    *out = (uint64_t)PyLong_AsUnsignedLongLongMask(v);
    Py_DECREF(v);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* (trace_id, span_id, is_remote, ...) of a SpanContext: its span id, and whether remote. */
static int
span_context_ids(PyObject *ctx, uint64_t *span_id, int *remote)
{
    if (!PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) < 3 ||
        !PyLong_Check(PyTuple_GET_ITEM(ctx, 1)))
        return -1;
    *span_id = (uint64_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(ctx, 1));
    *remote = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 2));
    if (PyErr_Occurred() || *remote < 0) {
        PyErr_Clear();
        return -1;
    }
    return 0;
}

/* The bits of the rules the ended span met; -1 when it is not the SDK's ReadableSpan as we
 * know it (then it is left pending, as the Python twin leaves it). */
static int
judge(VerdictsObject *self, PyObject *span, uint64_t *span_id, uint64_t *parent_id)
{
    uint64_t start, end;
    if (u64_attr(span, str_start_time, &start) < 0 || u64_attr(span, str_end_time, &end) < 0)
        return -1;
    int64_t duration = (int64_t)(end - start);
    int bits = 0;
    if (self->slow_ns && duration >= (int64_t)self->slow_ns)
        bits |= SLOW_BIT;
    if (self->errors && self->error_code != NULL && self->error_code != Py_None) {
        PyObject *status = PyObject_GetAttr(span, str_status);
        PyObject *code = status != NULL ? PyObject_GetAttr(status, str_status_code) : NULL;
        Py_XDECREF(status);
        if (code == NULL) {
            PyErr_Clear();
            return -1;
        }
        if (code == self->error_code)
            bits |= ERROR_BIT;
        Py_DECREF(code);
    }
    if (self->cpu_ratio > 0 && duration > 0 && self->cpu_key != NULL &&
        self->cpu_key != Py_None) {
        PyObject *attributes = PyObject_GetAttr(span, str_attributes);
        PyObject *cpu = attributes != NULL ? PyObject_GetItem(attributes, self->cpu_key) : NULL;
        Py_XDECREF(attributes);
        if (cpu == NULL) {
            PyErr_Clear();
        } else {
            double value = PyFloat_AsDouble(cpu);
            Py_DECREF(cpu);
            if (value == -1.0 && PyErr_Occurred())
                PyErr_Clear();
            else if (value >= self->cpu_ratio * (double)duration)
                bits |= HIGH_CPU_BIT;
        }
    }
    PyObject *ctx = PyObject_GetAttr(span, str_context);
    int remote = 0;
    int bad = ctx == NULL || span_context_ids(ctx, span_id, &remote) < 0;
    Py_XDECREF(ctx);
    if (bad) {
        PyErr_Clear();
        return -1;
    }
    *parent_id = 0;
    PyObject *parent = PyObject_GetAttr(span, str_parent);
    if (parent == NULL) {
        PyErr_Clear();
        return -1;
    }
    uint64_t pid = 0;
    if (parent != Py_None && span_context_ids(parent, &pid, &remote) == 0 && !remote)
        *parent_id = pid;
    Py_DECREF(parent);
    return bits;
}

static PyObject *
verdicts_on_end(VerdictsObject *self, PyObject *span)
{
    uint64_t span_id = 0, parent_id = 0;
    int bits = judge(self, span, &span_id, &parent_id);
    if (bits < 0 || span_id == 0)
        Py_RETURN_NONE;
    self->ended++;
    self->slow += (bits & SLOW_BIT) != 0;
    self->error += (bits & ERROR_BIT) != 0;
    self->high_cpu += (bits & HIGH_CPU_BIT) != 0;
    if (self->current.count >= self->generation_size ||
        ((self->ended & 1023) == 0 && self->generation_ns &&
         monotonic_ns() - self->generation_start > self->generation_ns))
        rotate(self);
    table_put(&self->current, span_id, parent_id, (uint64_t)bits);
    Py_RETURN_NONE;
}

/* on_start(span, parent_context=None) and _on_ending(span): nothing to do, cheaply. */
static PyObject *
verdicts_nothing(VerdictsObject *self, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
    (void)self;
    (void)args;
    (void)nargs;
    (void)kwnames;
    Py_RETURN_NONE;
}

static PyObject *
verdicts_force_flush(VerdictsObject *self, PyObject *const *args, Py_ssize_t nargs,
                     PyObject *kwnames)
{
    (void)self;
    (void)args;
    (void)nargs;
    (void)kwnames;
    Py_RETURN_TRUE;
}

static uint64_t
id_arg(PyObject *arg, int *ok)
{
    uint64_t v = PyLong_Check(arg) ? (uint64_t)PyLong_AsUnsignedLongLongMask(arg) : 0;
    *ok = !PyErr_Occurred();
    return v;
}

/* entry(span_id): (condition bits, local parent's span id or 0), or None (pending). */
static PyObject *
verdicts_entry(VerdictsObject *self, PyObject *arg)
{
    int ok;
    uint64_t span_id = id_arg(arg, &ok);
    if (!ok)
        return NULL;
    const Slot *s = span_id ? verdict_of(self, span_id) : NULL;
    if (s == NULL)
        Py_RETURN_NONE;
    return Py_BuildValue("(KK)", (unsigned long long)s->bits, (unsigned long long)s->parent);
}

/* lineage(span_id): (bits of it and its local ancestors, whether all of them have ended). */
static PyObject *
verdicts_lineage(VerdictsObject *self, PyObject *arg)
{
    int ok;
    uint64_t span_id = id_arg(arg, &ok);
    if (!ok)
        return NULL;
    uint64_t bits = 0;
    for (int depth = 0; span_id && depth < MAX_ANCESTORS; depth++) {
        const Slot *s = verdict_of(self, span_id);
        if (s == NULL)
            return Py_BuildValue("(KO)", (unsigned long long)bits, Py_False);
        bits |= s->bits;
        span_id = s->parent;
    }
    return Py_BuildValue("(KO)", (unsigned long long)bits, Py_True);
}

static PyObject *
verdicts_stats(VerdictsObject *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("{sKsKsKsKsnsK}", "ended", self->ended, "slow", self->slow, "error",
                         self->error, "high_cpu", self->high_cpu, "kept",
                         (Py_ssize_t)(self->current.count + self->older.count), "forgotten",
                         self->forgotten);
}

static PyMethodDef verdicts_methods[] = {
    {"on_start", (PyCFunction)(void (*)(void))verdicts_nothing, METH_FASTCALL | METH_KEYWORDS,
     NULL},
    {"_on_ending", (PyCFunction)(void (*)(void))verdicts_nothing, METH_FASTCALL | METH_KEYWORDS,
     NULL},
    {"shutdown", (PyCFunction)(void (*)(void))verdicts_nothing, METH_FASTCALL | METH_KEYWORDS,
     NULL},
    {"force_flush", (PyCFunction)(void (*)(void))verdicts_force_flush,
     METH_FASTCALL | METH_KEYWORDS, NULL},
    {"on_end", (PyCFunction)verdicts_on_end, METH_O, "on_end(span): judge an ended span"},
    {"entry", (PyCFunction)verdicts_entry, METH_O,
     "entry(span_id): (condition bits, local parent id) of an ended span, or None"},
    {"lineage", (PyCFunction)verdicts_lineage, METH_O,
     "lineage(span_id): (bits of it and its local ancestors, whether all have ended)"},
    {"stats", (PyCFunction)verdicts_stats, METH_NOARGS, NULL},
    {NULL},
};

/* Set by the agent: the slow rule's threshold (0: off), StatusCode.ERROR once the SDK is
 * loaded, and the attribute with a span's CPU time (None or unset: that rule judges nothing). */
static PyMemberDef verdicts_members[] = {
    {"slow_ns", T_ULONGLONG, offsetof(VerdictsObject, slow_ns), 0, NULL},
    {"error_code", T_OBJECT, offsetof(VerdictsObject, error_code), 0, NULL},
    {"cpu_key", T_OBJECT, offsetof(VerdictsObject, cpu_key), 0, NULL},
    {NULL},
};

static PyTypeObject VerdictsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._spans.Verdicts",
    .tp_basicsize = sizeof(VerdictsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)verdicts_init,
    .tp_dealloc = (destructor)verdicts_dealloc,
    .tp_methods = verdicts_methods,
    .tp_members = verdicts_members,
    .tp_doc = "Verdicts(slow_ns, errors, cpu_ratio, max_spans=50000, max_age_ns=600e9): "
              "a span processor that keeps which ended spans were slow, failed or high-CPU.",
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spans", NULL, -1, NULL};

PyMODINIT_FUNC
PyInit__spans(void)
{
    static const struct {
        PyObject **where;
        const char *text;
    } names[] = {
        {&str_start_time, "_start_time"}, {&str_end_time, "_end_time"},
        {&str_status, "_status"},         {&str_status_code, "status_code"},
        {&str_context, "_context"},       {&str_parent, "_parent"},
        {&str_attributes, "_attributes"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].where = PyUnicode_InternFromString(names[i].text);
        if (*names[i].where == NULL)
            return NULL;
    }
    if (PyType_Ready(&VerdictsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&VerdictsType);
    if (PyModule_AddObject(m, "Verdicts", (PyObject *)&VerdictsType) < 0) {
        Py_DECREF(&VerdictsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
