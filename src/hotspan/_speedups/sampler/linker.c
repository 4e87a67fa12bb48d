/* The span linker: OpenTelemetry's runtime context wrapped so that every attach and detach
 * also sets the labels ContextVar to the span's ids, tags sampled spans with their profile id
 * and sets span stats at detach.  Apart because it is a Python type of its own that runs for
 * every span a program makes current. */
#include "internal.h"

/* OpenTelemetry's runtime context, wrapped: every attach also sets the labels ContextVar to
 * the span's ids, every detach resets it.  This runs for every span a program makes current;
 * the same in Python measured +10% on a service opening four spans per 80 us request.  Rare
 * cases (a sampled span to tag, a token reset in another context) call back into Python. */
typedef struct {
    PyObject_HEAD PyObject *inner;           /* the runtime context being wrapped */
    PyObject *span_key;        /* the key OpenTelemetry keeps the current span under */
    PyObject *var;             /* the labels ContextVar */
    PyObject *on_reset_failed; /* (): our token was made in another context */
    /* OpenTelemetry's own ContextVar when `inner` is its stock ContextVarsRuntimeContext:
     * then attach/detach/get_current use it directly, which costs less than the Python
     * methods they replace (get_current alone is called four times per span). */
    PyObject *otel_var;
    int root_spans_only;
    int span_stats;            /* set the span stats at detach (see span stats) */
    /* (multi span processor): called at the first detach of a span from each SDK
     * TracerProvider (the SpanConditions hook, agent/spans.py); NULL when none is wanted. */
    PyObject *on_new_provider;
#define SEEN_PROVIDERS 8
    PyObject *providers[SEEN_PROVIDERS]; /* the span processors already handed over */
    int n_providers;
    unsigned watched; /* detaches that asked for a provider, once one was found */
} LinkerObject;

PyObject *str_attach, *str_detach, *str_get_current, *str_get_span_context, *str_parent;
PyObject *str_context_attr;

/* Span types whose get_span_context() returns their `_context` attribute (the SDK's Span, the
 * API's NonRecordingSpan), found out on the first span of each type: reading the attribute
 * costs a fifth of calling the method, on every span.  A type whose method returns anything
 * else keeps the call.  The references keep the types (and so their addresses) alive. */
#define SPAN_TYPES 8
static PyTypeObject *span_types[SPAN_TYPES];
static int span_type_reads_attr[SPAN_TYPES];

/* Free-threaded, spans attach on many threads at once: the type caches (written once a type)
 * and each linker's providers are written under a lock; reading a slot needs none, a slot is
 * set once, after what it stands for. */
#ifdef Py_GIL_DISABLED
static PyMutex linker_cache_mu;
#  define LINKER_CACHE_LOCK() PyMutex_Lock(&linker_cache_mu)
#  define LINKER_CACHE_UNLOCK() PyMutex_Unlock(&linker_cache_mu)
#else
#  define LINKER_CACHE_LOCK() ((void)0)
#  define LINKER_CACHE_UNLOCK() ((void)0)
#endif

static PyObject *
span_context_of(PyObject *span)
{
    PyTypeObject *type = Py_TYPE(span);
    int known = -1, k = 0;
    for (; k < SPAN_TYPES && span_types[k] != NULL; k++) {
        if (span_types[k] == type) {
            known = span_type_reads_attr[k];
            break;
        }
    }
    if (known == 1) {
        PyObject *ctx = PyObject_GetAttr(span, str_context_attr);
        if (ctx != NULL)
            return ctx;
        PyErr_Clear();
    }
    PyObject *ctx = PyObject_CallMethodObjArgs(span, str_get_span_context, NULL);
    if (known == -1 && ctx != NULL && k < SPAN_TYPES) {
        PyObject *attr = PyObject_GetAttr(span, str_context_attr);
        if (attr == NULL)
            PyErr_Clear();
        LINKER_CACHE_LOCK();
        /* Free-threaded, another thread may have taken the slot meanwhile: the next span of
         * this type finds out again. */
        if (span_types[k] == NULL) {
            span_type_reads_attr[k] = attr == ctx;
            __atomic_store_n(&span_types[k], (PyTypeObject *)Py_NewRef((PyObject *)type),
                             __ATOMIC_RELEASE);
        }
        LINKER_CACHE_UNLOCK();
        Py_XDECREF(attr);
    }
    return ctx;
}

/* The 128-bit trace id as two words; -1 if it is not an int that fits. */
static int
trace_id_words(PyObject *trace, uint64_t *hi, uint64_t *lo)
{
    unsigned char b[16];
#if PY_VERSION_HEX >= 0x030D0000
    Py_ssize_t n =
        PyLong_AsNativeBytes(trace, b, 16,
                             Py_ASNATIVEBYTES_LITTLE_ENDIAN | Py_ASNATIVEBYTES_UNSIGNED_BUFFER |
                                 Py_ASNATIVEBYTES_REJECT_NEGATIVE);
    if (n < 0 || n > 16)
        return -1;
#else
    if (_PyLong_AsByteArray((PyLongObject *)trace, b, 16, 1, 0) < 0)
        return -1;
#endif
    uint64_t h = 0, l = 0;
    for (int i = 7; i >= 0; i--) {
        l = (l << 8) | b[i];
        h = (h << 8) | b[8 + i];
    }
    *hi = h;
    *lo = l;
    return 0;
}

static void
linker_dealloc(LinkerObject *self)
{
    Py_XDECREF(self->inner);
    Py_XDECREF(self->span_key);
    Py_XDECREF(self->var);
    Py_XDECREF(self->on_reset_failed);
    Py_XDECREF(self->otel_var);
    Py_XDECREF(self->on_new_provider);
    for (int k = 0; k < self->n_providers; k++)
        Py_DECREF(self->providers[k]);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
linker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"inner",           "span_key",   "var", "on_reset_failed",
                             "root_spans_only", "span_stats", NULL};
    PyObject *inner, *key, *var, *on_reset_failed;
    int root_only = 0, span_stats = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO|pp", kwlist, &inner, &key, &var,
                                     &on_reset_failed, &root_only, &span_stats))
        return NULL;
    if (!PyContextVar_CheckExact(var)) {
        PyErr_SetString(PyExc_TypeError, "var must be a ContextVar");
        return NULL;
    }
    LinkerObject *self = (LinkerObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->inner = Py_NewRef(inner);
    self->span_key = Py_NewRef(key);
    self->var = Py_NewRef(var);
    self->on_reset_failed = Py_NewRef(on_reset_failed);
    self->root_spans_only = root_only;
    self->span_stats = span_stats;
    if (strcmp(Py_TYPE(inner)->tp_name, "ContextVarsRuntimeContext") == 0) {
        PyObject *otel_var = PyObject_GetAttrString(inner, "_current_context");
        if (otel_var != NULL && PyContextVar_CheckExact(otel_var))
            self->otel_var = otel_var;
        else
            Py_XDECREF(otel_var);
        PyErr_Clear();
    }
    return (PyObject *)self;
}

/* The labels for `span` (borrowed, may be NULL) under `previous` (may be NULL).  Never fails
 * for a span it does not understand: that just has no span labels. */
static PyObject *
labels_for(PyObject *span, LabelsObject *previous, int find_root)
{
    LabelsObject *labels = (LabelsObject *)LabelsType.tp_alloc(&LabelsType, 0);
    if (labels == NULL)
        return NULL;
    labels->tagset = previous ? previous->tagset : 0;
    if (span == NULL || span == Py_None)
        return (PyObject *)labels;
    PyObject *ctx = span_context_of(span);
    /* SpanContext is a tuple: (trace_id, span_id, is_remote, ...). */
    if (ctx == NULL || !PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) < 3 ||
        !PyLong_Check(PyTuple_GET_ITEM(ctx, 0)) || !PyLong_Check(PyTuple_GET_ITEM(ctx, 1))) {
        Py_XDECREF(ctx);
        PyErr_Clear();
        return (PyObject *)labels;
    }
    uint64_t span_id = (uint64_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(ctx, 1));
    uint64_t trace_hi = 0, trace_lo = 0;
    PyObject *trace = PyTuple_GET_ITEM(ctx, 0);
    int bad_trace = 0;
    /* The parent's trace id, the same int: its words are known (the conversion was the
     * costliest step of a span's attach). */
    if (previous != NULL && previous->trace_obj == trace) {
        trace_hi = previous->trace_hi;
        trace_lo = previous->trace_lo;
    } else {
        bad_trace = trace_id_words(trace, &trace_hi, &trace_lo) < 0;
    }
    if (bad_trace || PyErr_Occurred() || span_id == 0 || (trace_hi | trace_lo) == 0) {
        Py_DECREF(ctx);
        PyErr_Clear();
        return (PyObject *)labels;
    }
    labels->trace_obj = Py_NewRef(trace);
    Py_DECREF(ctx);
    uint64_t root = span_id;
    /* Only root_spans_only needs the local root; finding it costs an attribute lookup. */
    if (find_root && previous != NULL && previous->root_span_id &&
        previous->trace_lo == trace_lo && previous->trace_hi == trace_hi) {
        /* A child of a local span keeps its local root; a remote parent makes a new one. */
        PyObject *parent = PyObject_GetAttr(span, str_parent);
        if (parent == NULL) {
            PyErr_Clear();
        } else {
            if (PyTuple_Check(parent) && PyTuple_GET_SIZE(parent) >= 3) {
                int remote = PyObject_IsTrue(PyTuple_GET_ITEM(parent, 2));
                if (remote == 0)
                    root = previous->root_span_id;
                else if (remote < 0)
                    PyErr_Clear();
            }
            Py_DECREF(parent);
        }
    }
    labels->span_id = span_id;
    labels->trace_hi = trace_hi;
    labels->trace_lo = trace_lo;
    labels->root_span_id = root;
    return (PyObject *)labels;
}

static PyObject *
current_labels_of(PyObject *var)
{
    PyObject *value = NULL;
    if (PyContextVar_Get(var, NULL, &value) < 0) {
        PyErr_Clear();
        return NULL;
    }
    if (value != NULL && Py_TYPE(value) != &LabelsType)
        Py_CLEAR(value);
    return value; /* new reference or NULL */
}

static PyObject *
inner_detach(LinkerObject *self, PyObject *token)
{
    if (self->otel_var != NULL && PyContextVar_Reset(self->otel_var, token) == 0)
        Py_RETURN_NONE;
    if (self->otel_var != NULL)
        return NULL; /* ValueError/RuntimeError, as ContextVar.reset raises them */
    return PyObject_CallMethodObjArgs(self->inner, str_detach, token, NULL);
}

/* With OpenTelemetry's stock runtime context (otel_var set), the OpenTelemetry Context rides
 * in our labels and OpenTelemetry's own ContextVar is left alone: attach sets one ContextVar
 * and detach resets one, instead of two each (a ContextVar set copies a path of the context's
 * HAMT; with two it was a third of what a span cost).  The token is our ContextVar's.  Tokens
 * made before the linker was installed are OpenTelemetry's, and go back to its ContextVar. */
static PyObject *
linker_attach(LinkerObject *self, PyObject *context)
{
    PyObject *span = NULL;
    if (PyDict_Check(context)) {
        span = PyDict_GetItemWithError(context, self->span_key); /* borrowed */
        if (span == NULL && PyErr_Occurred())
            PyErr_Clear();
    }
    if (self->otel_var != NULL) {
        Py_INCREF(context); /* labels_for may run Python: the span and its container live */
        Py_XINCREF(span);
        PyObject *previous = current_labels_of(self->var);
        LabelsObject *labels = (LabelsObject *)labels_for(
            span, (LabelsObject *)previous, self->root_spans_only || self->span_stats);
        Py_XDECREF(previous);
        Py_XDECREF(span);
        if (labels == NULL) {
            Py_DECREF(context);
            return NULL;
        }
        if (self->span_stats && labels->span_id)
            stats_begin(labels);
        labels->otel_context = context; /* the reference taken above */
        PyObject *token = PyContextVar_Set(self->var, (PyObject *)labels);
        Py_DECREF(labels);
        labels_changed();
        return token;
    }
    PyObject *token = PyObject_CallMethodObjArgs(self->inner, str_attach, context, NULL);
    if (token == NULL)
        return NULL;
    Py_XINCREF(span);
    PyObject *previous = current_labels_of(self->var);
    PyObject *labels =
        labels_for(span, (LabelsObject *)previous, self->root_spans_only || self->span_stats);
    Py_XDECREF(previous);
    if (labels == NULL) {
        PyErr_Clear();
        Py_XDECREF(span);
        return token; /* never break the program's tracing */
    }
    if (self->span_stats && ((LabelsObject *)labels)->span_id)
        stats_begin((LabelsObject *)labels);
    PyObject *ours = PyContextVar_Set(self->var, labels);
    if (ours == NULL) {
        PyErr_Clear();
        Py_DECREF(labels);
        Py_XDECREF(span);
        return token;
    }
    labels_changed();
    PyObject *pair = PyTuple_Pack(4, token, ours, labels, span ? span : Py_None);
    Py_DECREF(token);
    Py_DECREF(ours);
    Py_DECREF(labels);
    Py_XDECREF(span);
    return pair;
}

PyObject *str_set_attribute, *key_profile_id;

/* span.is_recording(), false on any error (cleared): attributes go only to recording spans. */
static int
span_recording(PyObject *span)
{
    PyObject *recording = PyObject_CallMethodNoArgs(span, str_is_recording);
    int yes = recording != NULL && PyObject_IsTrue(recording) == 1;
    Py_XDECREF(recording);
    if (!yes)
        PyErr_Clear();
    return yes;
}

/* A detached span whose labels got samples: tagged for traces-to-profiles (context.py's
 * mark_profiled is the twin).  In C, so that no frame of the agent's stands in the program's
 * stacks while it runs. */
static void
linker_profiled(LinkerObject *self, PyObject *span, LabelsObject *labels)
{
    if (!self->root_spans_only || labels->root_span_id == labels->span_id) {
        if (span == NULL || !span_recording(span))
            return;
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)labels->span_id);
        PyObject *id = PyUnicode_FromString(hex);
        PyObject *r = id != NULL ? PyObject_CallMethodObjArgs(span, str_set_attribute,
                                                              key_profile_id, id, NULL)
                                 : NULL;
        Py_XDECREF(id);
        if (r == NULL)
            PyErr_Clear(); /* never break the program's tracing */
        Py_XDECREF(r);
        return;
    }
    /* The samples belong to the root: it gets the attribute at its own detach. */
    PyObject *restored = current_labels_of(self->var);
    if (restored != NULL && ((LabelsObject *)restored)->root_span_id == labels->root_span_id)
        ((LabelsObject *)restored)->sampled = 1;
    Py_XDECREF(restored);
}

/* Span types without a `_span_processor` (not the SDK's): not asked again. */
static PyTypeObject *no_processor_types[SPAN_TYPES];

/* The SDK span's processor (its provider's multi span processor), handed to on_new_provider
 * the first time it is seen. */
static void
watch_provider(LinkerObject *self, PyObject *span)
{
    /* Programs make their providers at start, nearly always one: once one is known, a span
     * in 64 is asked (a provider made later is hooked within its first 64 spans). */
    if (self->n_providers > 0 && (self->watched++ & 63) != 0)
        return;
    PyTypeObject *type = Py_TYPE(span);
    int k = 0;
    for (; k < SPAN_TYPES && no_processor_types[k] != NULL; k++) {
        if (no_processor_types[k] == type)
            return;
    }
    PyObject *processor = PyObject_GetAttr(span, str_span_processor);
    if (processor == NULL) {
        PyErr_Clear();
        LINKER_CACHE_LOCK();
        if (k < SPAN_TYPES && no_processor_types[k] == NULL)
            __atomic_store_n(&no_processor_types[k],
                             (PyTypeObject *)Py_NewRef((PyObject *)type), __ATOMIC_RELEASE);
        LINKER_CACHE_UNLOCK();
        return;
    }
    int seen = 0;
#ifdef Py_GIL_DISABLED
    Py_BEGIN_CRITICAL_SECTION(self);
#endif
    for (int i = 0; i < self->n_providers && !seen; i++)
        seen = self->providers[i] == processor;
    if (!seen) {
        /* The callback does nothing twice, so one that another thread also makes for the
         * same processor (free-threaded) is harmless. */
        PyObject *r = PyObject_CallOneArg(self->on_new_provider, processor);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
        if (self->n_providers < SEEN_PROVIDERS) {
            self->providers[self->n_providers++] = processor; /* the reference taken above */
            processor = NULL;
        }
    }
#ifdef Py_GIL_DISABLED
    Py_END_CRITICAL_SECTION();
#endif
    Py_XDECREF(processor); /* seen, or beyond SEEN_PROVIDERS: asked each time */
}

/* Whether a span's labels hold figures its parent adds up without span_stats: a collection
 * ran inside, or an allocation was sampled. */
static inline int
has_figures(LabelsObject *labels)
{
    return __atomic_load_n(&labels->gc_count, __ATOMIC_RELAXED) != 0 ||
           (__atomic_load_n(&labels->alloc_bytes, __ATOMIC_RELAXED) != 0 &&
            __atomic_load_n(&alloc_sampling, __ATOMIC_RELAXED));
}

/* Whether those figures go on the span as attributes (see GC_ATTRIBUTE_MIN_NS). */
static inline int
figures_to_set(LabelsObject *labels)
{
    return __atomic_load_n(&labels->gc_pause_ns, __ATOMIC_RELAXED) >= GC_ATTRIBUTE_MIN_NS ||
           (__atomic_load_n(&labels->alloc_bytes, __ATOMIC_RELAXED) != 0 &&
            __atomic_load_n(&alloc_sampling, __ATOMIC_RELAXED));
}

/* After the detach of `labels` (its span may be NULL): the span stats, its figures added to
 * its parent's, and the provider watch. */
static void
linker_span_done(LinkerObject *self, PyObject *span, LabelsObject *labels)
{
    if (span != NULL && self->on_new_provider != NULL)
        watch_provider(self, span);
    int full = labels->stats != 0;
    if (!full && !has_figures(labels))
        return; /* nearly every span, by default */
    uint64_t cpu = 0;
    if (labels->stats == STATS_THREAD) {
        uint64_t now;
        if (clock_ns(CLOCK_THREAD_CPUTIME_ID, &now) == 0 && now > labels->attach_cpu_ns)
            cpu = now - labels->attach_cpu_ns;
    } else {
        cpu = __atomic_load_n(&labels->cpu_ns, __ATOMIC_RELAXED);
    }
    labels->stats = 0; /* once */
    PyObject *restored = current_labels_of(self->var);
    if (restored != NULL && restored != (PyObject *)labels &&
        ((LabelsObject *)restored)->trace_lo == labels->trace_lo &&
        ((LabelsObject *)restored)->trace_hi == labels->trace_hi) {
        LabelsObject *parent = (LabelsObject *)restored;
        labels_charge(parent, __atomic_load_n(&labels->cpu_ns, __ATOMIC_RELAXED),
                      __atomic_load_n(&labels->alloc_bytes, __ATOMIC_RELAXED));
        labels_charge_gc(parent, __atomic_load_n(&labels->gc_pause_ns, __ATOMIC_RELAXED),
                         __atomic_load_n(&labels->gc_count, __ATOMIC_RELAXED));
    }
    Py_XDECREF(restored);
    if (!full && !figures_to_set(labels))
        return;
    if (span == NULL || !span_recording(span))
        return;
    PyObject *attributes = stats_attributes(labels, full, cpu);
    PyObject *r = attributes != NULL
                      ? PyObject_CallMethodOneArg(span, str_set_attributes, attributes)
                      : NULL;
    if (r == NULL)
        PyErr_Clear(); /* never break the program's tracing */
    Py_XDECREF(r);
    Py_XDECREF(attributes);
}

static PyObject *
linker_detach(LinkerObject *self, PyObject *token)
{
    if (self->otel_var != NULL && PyContextToken_CheckExact(token)) {
        /* The labels this token's attach made current, when detaches nest as attaches did. */
        PyObject *leaving = current_labels_of(self->var);
        if (PyContextVar_Reset(self->var, token) < 0) {
            Py_XDECREF(leaving);
            /* Not ours: a token of OpenTelemetry's ContextVar from before the linker.  Or
             * ours, reset in another context: then that ContextVar raises as ours did, and
             * OpenTelemetry logs "Failed to detach context" as it always has. */
            PyObject *err_type, *err_value, *err_tb;
            PyErr_Fetch(&err_type, &err_value, &err_tb);
            if (PyContextVar_Reset(self->otel_var, token) == 0) {
                Py_XDECREF(err_type);
                Py_XDECREF(err_value);
                Py_XDECREF(err_tb);
                Py_RETURN_NONE;
            }
            PyErr_Clear();
            PyErr_Restore(err_type, err_value, err_tb);
            return NULL;
        }
        labels_changed();
        LabelsObject *labels = (LabelsObject *)leaving;
        if (labels != NULL && labels->span_id &&
            (labels->sampled || labels->stats || self->on_new_provider != NULL ||
             has_figures(labels)) &&
            labels->otel_context != NULL && PyDict_Check(labels->otel_context)) {
            PyObject *span = PyDict_GetItemWithError(labels->otel_context, self->span_key);
            if (span == NULL)
                PyErr_Clear();
            Py_XINCREF(span);
            if (labels->sampled)
                linker_profiled(self, span, labels);
            linker_span_done(self, span, labels);
            Py_XDECREF(span);
        }
        Py_XDECREF(leaving);
        Py_RETURN_NONE;
    }
    if (!PyTuple_CheckExact(token) || PyTuple_GET_SIZE(token) != 4 ||
        Py_TYPE(PyTuple_GET_ITEM(token, 2)) != &LabelsType)
        return inner_detach(self, token);
    PyObject *done = inner_detach(self, PyTuple_GET_ITEM(token, 0));
    if (done == NULL)
        return NULL;
    Py_DECREF(done);
    if (PyContextVar_Reset(self->var, PyTuple_GET_ITEM(token, 1)) < 0) {
        PyErr_Clear();
        PyObject *r = PyObject_CallNoArgs(self->on_reset_failed);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    labels_changed();
    LabelsObject *labels = (LabelsObject *)PyTuple_GET_ITEM(token, 2);
    PyObject *span = PyTuple_GET_ITEM(token, 3);
    if (labels->sampled && labels->span_id)
        linker_profiled(self, span == Py_None ? NULL : span, labels);
    if (labels->span_id)
        linker_span_done(self, span == Py_None ? NULL : span, labels);
    Py_RETURN_NONE;
}

static PyObject *
linker_get_current(LinkerObject *self, PyObject *unused)
{
    if (self->otel_var != NULL) {
        PyObject *labels = current_labels_of(self->var);
        if (labels != NULL) {
            PyObject *context = ((LabelsObject *)labels)->otel_context;
            Py_XINCREF(context);
            Py_DECREF(labels);
            if (context != NULL)
                return context;
        }
        /* Nothing attached since the linker: OpenTelemetry's own ContextVar (its default, or
         * what was attached before). */
        PyObject *value = NULL;
        if (PyContextVar_Get(self->otel_var, NULL, &value) < 0)
            return NULL;
        if (value != NULL)
            return value;
    }
    return PyObject_CallMethodObjArgs(self->inner, str_get_current, NULL);
}

static PyObject *
linker_labels_for(LinkerObject *self, PyObject *span)
{
    PyObject *previous = current_labels_of(self->var);
    PyObject *labels = labels_for(span, (LabelsObject *)previous, self->root_spans_only);
    Py_XDECREF(previous);
    return labels;
}

static PyObject *
linker_get_inner(LinkerObject *self, void *unused)
{
    return Py_NewRef(self->inner);
}

static PyObject *
linker_get_root_only(LinkerObject *self, void *unused)
{
    return PyBool_FromLong(self->root_spans_only);
}

static int
linker_set_root_only(LinkerObject *self, PyObject *value, void *unused)
{
    int truth = value ? PyObject_IsTrue(value) : 0;
    if (truth < 0)
        return -1;
    self->root_spans_only = truth;
    return 0;
}

static PyObject *
linker_get_span_stats(LinkerObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(self->span_stats);
}

static int
linker_set_span_stats(LinkerObject *self, PyObject *value, void *unused)
{
    (void)unused;
    int truth = value ? PyObject_IsTrue(value) : 0;
    if (truth < 0)
        return -1;
    self->span_stats = truth;
    return 0;
}

static PyObject *
linker_get_on_new_provider(LinkerObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(self->on_new_provider ? self->on_new_provider : Py_None);
}

/* Setting it (None: off) forgets the providers seen: a new hook is told of each again. */
static int
linker_set_on_new_provider(LinkerObject *self, PyObject *value, void *unused)
{
    (void)unused;
    if (value != NULL && value != Py_None && !PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "on_new_provider must be callable or None");
        return -1;
    }
    Py_XSETREF(self->on_new_provider,
               value != NULL && value != Py_None ? Py_NewRef(value) : NULL);
    for (int k = 0; k < self->n_providers; k++)
        Py_CLEAR(self->providers[k]);
    self->n_providers = 0;
    return 0;
}

static PyMethodDef linker_methods[] = {
    {"attach", (PyCFunction)linker_attach, METH_O, NULL},
    {"detach", (PyCFunction)linker_detach, METH_O, NULL},
    {"get_current", (PyCFunction)linker_get_current, METH_NOARGS, NULL},
    {"labels_for", (PyCFunction)linker_labels_for, METH_O,
     "labels_for(span): the labels attach would set for this span, here"},
    {NULL},
};

static PyGetSetDef linker_getset[] = {
    {"inner", (getter)linker_get_inner, NULL, NULL, NULL},
    {"root_spans_only", (getter)linker_get_root_only, (setter)linker_set_root_only, NULL, NULL},
    {"span_stats", (getter)linker_get_span_stats, (setter)linker_set_span_stats, NULL, NULL},
    {"on_new_provider", (getter)linker_get_on_new_provider, (setter)linker_set_on_new_provider,
     NULL, NULL},
    {NULL},
};

PyTypeObject LinkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._sampler.SpanLinker",
    .tp_basicsize = sizeof(LinkerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = linker_new,
    .tp_dealloc = (destructor)linker_dealloc,
    .tp_methods = linker_methods,
    .tp_getset = linker_getset,
    .tp_doc = "OpenTelemetry's runtime context, setting span labels on attach/detach.",
};
