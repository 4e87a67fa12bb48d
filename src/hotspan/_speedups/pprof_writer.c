/*
 * hotspan._speedups._pprof_writer: the agent's pprof encoder (profile.proto), the C twin of
 * hotspan/agent/pprof_writer.py, with the same interface and byte-for-byte the same output.
 *
 * Why C: with span labels nearly every sample is a row of its own (one per span seen on a
 * stack), and the Python encoder spends ~40 us a row on dict lookups and bytearray appends:
 * at 100 Hz of CPU and wall samples that is close to 1% of a core, spent on the program's
 * own CPU (bench/results/agent_instructions.md).
 *
 * Shape: what a row needs at encode time is computed once, when it is first seen.  A stack
 * becomes the bytes of its packed location ids, a label set the bytes of its Label messages;
 * both are interned (one bytes object per distinct content), so a sample is the pair of
 * their addresses, aggregated in an open-addressing table.  Encoding then only copies bytes.
 * Compression stays in Python (zlib), so this module needs nothing but Python.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* CPython fixes the signatures of getters, used or not. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#endif

#define MAX_TYPES 16 /* values per sample: Go's heap profile has 4 */

/* ---------------------------------------------------------------- a growable byte buffer */

typedef struct {
    char *data;
    size_t len, cap;
} Buf;

static int
buf_reserve(Buf *b, size_t more)
{
    if (b->len + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more)
        cap *= 2;
    char *data = PyMem_Realloc(b->data, cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static inline size_t
varint_size(uint64_t v)
{
    size_t n = 1;
    while (v > 0x7F) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Negative int64s go as their 64-bit two's complement, as protobuf encodes int64. */
static inline char *
put_varint(char *p, uint64_t v)
{
    while (v > 0x7F) {
        *p++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (char)v;
    return p;
}

/* A varint field (field < 16: a one-byte key), left out when zero (proto3). */
static inline char *
put_int(char *p, int field, int64_t v)
{
    if (v == 0)
        return p;
    *p++ = (char)(field << 3);
    return put_varint(p, (uint64_t)v);
}

static int
buf_varint(Buf *b, uint64_t v)
{
    if (buf_reserve(b, 10) < 0)
        return -1;
    b->len = (size_t)(put_varint(b->data + b->len, v) - b->data);
    return 0;
}

static int
buf_bytes(Buf *b, const void *p, size_t n)
{
    if (buf_reserve(b, n) < 0)
        return -1;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static int
buf_int(Buf *b, int field, int64_t v)
{
    if (buf_reserve(b, 11) < 0)
        return -1;
    b->len = (size_t)(put_int(b->data + b->len, field, v) - b->data);
    return 0;
}

/* A length-delimited field. */
static int
buf_field(Buf *b, int field, const void *p, size_t n)
{
    if (buf_varint(b, ((uint64_t)field << 3) | 2) < 0 || buf_varint(b, n) < 0)
        return -1;
    return buf_bytes(b, p, n);
}

/* ---------------------------------------------------------------- the encoder */

typedef struct {
    PyObject_HEAD PyObject *sample_types; /* tuple of (type, unit) */
    PyObject *period_type;  /* (type, unit) */
    long long period;
    Py_ssize_t n_types;
    PyObject *strings;      /* str -> index (int) */
    PyObject *string_list;  /* the strings in index order */
    PyObject *frames;       /* frame (name, filename, line, first_line) -> location id */
    PyObject *functions;    /* (name, filename, first_line) -> function id */
    PyObject *function_list; /* those keys in id order */
    int64_t *loc_function;  /* per location id - 1: its function id and line */
    int64_t *loc_line;
    size_t n_locs, cap_locs;
    PyObject *stacks;       /* stack key -> interned bytes: the packed location ids */
    PyObject *label_sets;   /* labels tuple -> interned bytes: its Label messages */
    PyObject *interned;     /* bytes -> the one bytes object of that content */
    /* samples, in insertion order, and a table of their indices + 1 (0: empty) */
    PyObject **s_stack, **s_labels;
    int64_t *s_values;
    size_t n_samples, cap_samples;
    uint32_t *table;
    size_t table_cap;
} Encoder;

static void
encoder_clear_samples(Encoder *self)
{
    for (size_t i = 0; i < self->n_samples; i++) {
        Py_DECREF(self->s_stack[i]);
        Py_DECREF(self->s_labels[i]);
    }
    PyMem_Free(self->s_stack);
    PyMem_Free(self->s_labels);
    PyMem_Free(self->s_values);
    PyMem_Free(self->table);
    self->s_stack = self->s_labels = NULL;
    self->s_values = NULL;
    self->table = NULL;
    self->n_samples = self->cap_samples = self->table_cap = 0;
}

static void
encoder_dealloc(Encoder *self)
{
    encoder_clear_samples(self);
    PyMem_Free(self->loc_function);
    PyMem_Free(self->loc_line);
    Py_XDECREF(self->sample_types);
    Py_XDECREF(self->period_type);
    Py_XDECREF(self->strings);
    Py_XDECREF(self->string_list);
    Py_XDECREF(self->frames);
    Py_XDECREF(self->functions);
    Py_XDECREF(self->function_list);
    Py_XDECREF(self->stacks);
    Py_XDECREF(self->label_sets);
    Py_XDECREF(self->interned);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A (str, str) pair, as a new tuple. */
static PyObject *
str_pair(PyObject *o, const char *what)
{
    PyObject *t = PySequence_Tuple(o);
    if (t == NULL)
        return NULL;
    if (PyTuple_GET_SIZE(t) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(t, 0)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(t, 1))) {
        Py_DECREF(t);
        PyErr_Format(PyExc_TypeError, "%s must be a (str, str) pair", what);
        return NULL;
    }
    return t;
}

static int
encoder_init(Encoder *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"sample_type", "period_type", "period", NULL};
    PyObject *sample_type, *period_type;
    long long period;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOL:ProfileWriter", kwlist, &sample_type,
                                     &period_type, &period))
        return -1;
    if (self->strings != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ProfileWriter is initialized once");
        return -1;
    }
    /* One (type, unit) pair, or a sequence of them. */
    PyObject *types;
    PyObject *first = PySequence_GetItem(sample_type, 0);
    if (first == NULL)
        return -1;
    int single = PyUnicode_Check(first);
    Py_DECREF(first);
    if (single) {
        PyObject *pair = str_pair(sample_type, "sample_type");
        if (pair == NULL)
            return -1;
        types = PyTuple_Pack(1, pair);
        Py_DECREF(pair);
    } else {
        PyObject *seq = PySequence_Tuple(sample_type);
        if (seq == NULL)
            return -1;
        Py_ssize_t n = PyTuple_GET_SIZE(seq);
        types = n ? PyTuple_New(n) : NULL;
        for (Py_ssize_t i = 0; types != NULL && i < n; i++) {
            PyObject *pair = str_pair(PyTuple_GET_ITEM(seq, i), "a sample type");
            if (pair == NULL)
                Py_CLEAR(types);
            else
                PyTuple_SET_ITEM(types, i, pair);
        }
        if (n == 0)
            PyErr_SetString(PyExc_ValueError, "no sample types");
        Py_DECREF(seq);
    }
    if (types == NULL)
        return -1;
    if (PyTuple_GET_SIZE(types) > MAX_TYPES) {
        Py_DECREF(types);
        PyErr_Format(PyExc_ValueError, "at most %d sample types", MAX_TYPES);
        return -1;
    }
    self->sample_types = types;
    self->n_types = PyTuple_GET_SIZE(types);
    self->period_type = str_pair(period_type, "period_type");
    if (self->period_type == NULL)
        return -1;
    self->period = period;
    self->strings = PyDict_New();
    self->string_list = PyList_New(0);
    self->frames = PyDict_New();
    self->functions = PyDict_New();
    self->function_list = PyList_New(0);
    self->stacks = PyDict_New();
    self->label_sets = PyDict_New();
    self->interned = PyDict_New();
    if (!self->strings || !self->string_list || !self->frames || !self->functions ||
        !self->function_list || !self->stacks || !self->label_sets || !self->interned)
        return -1;
    PyObject *empty = PyUnicode_FromStringAndSize("", 0);
    PyObject *zero = PyLong_FromLong(0);
    int rc = (empty && zero && PyDict_SetItem(self->strings, empty, zero) == 0 &&
              PyList_Append(self->string_list, empty) == 0)
                 ? 0
                 : -1;
    Py_XDECREF(empty);
    Py_XDECREF(zero);
    return rc;
}

/* The index of a string in the string table, added when new; -1 with an error. */
static Py_ssize_t
string_index(Encoder *self, PyObject *text)
{
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "a profile string must be str, not %.100s",
                     Py_TYPE(text)->tp_name);
        return -1;
    }
    PyObject *found = PyDict_GetItemWithError(self->strings, text); /* borrowed */
    if (found != NULL)
        return PyLong_AsSsize_t(found);
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t index = PyList_GET_SIZE(self->string_list);
    PyObject *boxed = PyLong_FromSsize_t(index);
    if (boxed == NULL)
        return -1;
    int rc = PyDict_SetItem(self->strings, text, boxed);
    Py_DECREF(boxed);
    if (rc < 0 || PyList_Append(self->string_list, text) < 0)
        return -1;
    return index;
}

/* The one bytes object with this content (a new reference). */
static PyObject *
intern_bytes(Encoder *self, const char *data, size_t len)
{
    PyObject *b = PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
    if (b == NULL)
        return NULL;
    PyObject *found = PyDict_SetDefault(self->interned, b, b); /* borrowed */
    Py_XINCREF(found);
    Py_DECREF(b);
    return found;
}

static int64_t
as_int64(PyObject *o, const char *what)
{
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) {
        PyErr_Format(PyExc_OverflowError, "%s does not fit in 64 bits", what);
        return -1;
    }
    return (int64_t)v;
}

/* The location id of a frame (name, filename, line, first_line); 0 with an error. */
static int64_t
location_id(Encoder *self, PyObject *frame)
{
    PyObject *found = PyDict_GetItemWithError(self->frames, frame); /* borrowed */
    if (found != NULL)
        return PyLong_AsLongLong(found);
    if (PyErr_Occurred())
        return 0;
    PyObject *seq =
        PySequence_Fast(frame, "a frame must be (name, filename, line, first_line)");
    if (seq == NULL)
        return 0;
    if (PySequence_Fast_GET_SIZE(seq) != 4) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "a frame must be (name, filename, line, first_line)");
        return 0;
    }
    PyObject **item = PySequence_Fast_ITEMS(seq);
    int64_t line = as_int64(item[2], "a line number");
    if (line == -1 && PyErr_Occurred()) {
        Py_DECREF(seq);
        return 0;
    }
    PyObject *fkey = PyTuple_Pack(3, item[0], item[1], item[3]);
    Py_DECREF(seq);
    if (fkey == NULL)
        return 0;
    int64_t function;
    found = PyDict_GetItemWithError(self->functions, fkey);
    if (found != NULL)
        function = PyLong_AsLongLong(found);
    else if (PyErr_Occurred()) {
        Py_DECREF(fkey);
        return 0;
    } else {
        function = (int64_t)PyList_GET_SIZE(self->function_list) + 1;
        PyObject *boxed = PyLong_FromLongLong(function);
        int rc = boxed ? PyDict_SetItem(self->functions, fkey, boxed) : -1;
        Py_XDECREF(boxed);
        if (rc < 0 || PyList_Append(self->function_list, fkey) < 0) {
            Py_DECREF(fkey);
            return 0;
        }
    }
    Py_DECREF(fkey);
    if (self->n_locs == self->cap_locs) {
        size_t cap = self->cap_locs ? self->cap_locs * 2 : 64;
        int64_t *f = PyMem_Realloc(self->loc_function, cap * sizeof(int64_t));
        if (f == NULL) {
            PyErr_NoMemory();
            return 0;
        }
        self->loc_function = f;
        int64_t *l = PyMem_Realloc(self->loc_line, cap * sizeof(int64_t));
        if (l == NULL) {
            PyErr_NoMemory();
            return 0;
        }
        self->loc_line = l;
        self->cap_locs = cap;
    }
    self->loc_function[self->n_locs] = function;
    self->loc_line[self->n_locs] = line;
    int64_t id = (int64_t)++self->n_locs;
    PyObject *boxed = PyLong_FromLongLong(id);
    int rc = boxed ? PyDict_SetItem(self->frames, frame, boxed) : -1;
    Py_XDECREF(boxed);
    return rc < 0 ? 0 : id;
}

/* The interned packed location ids of a stack (new reference). */
static PyObject *
encode_stack(Encoder *self, PyObject *stack)
{
    PyObject *seq = PySequence_Fast(stack, "a stack must be a sequence of frames");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Buf b = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t id = location_id(self, PySequence_Fast_GET_ITEM(seq, i));
        if (id == 0 || buf_varint(&b, (uint64_t)id) < 0) {
            Py_DECREF(seq);
            PyMem_Free(b.data);
            return NULL;
        }
    }
    Py_DECREF(seq);
    PyObject *out = intern_bytes(self, b.data, b.len);
    PyMem_Free(b.data);
    return out;
}

/* The interned Label messages (field 3 of a Sample) of a label set (new reference). */
static PyObject *
encode_labels(Encoder *self, PyObject *labels)
{
    PyObject *seq = PySequence_Fast(labels, "labels must be a sequence of (key, value)");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Buf b = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PySequence_Fast(PySequence_Fast_GET_ITEM(seq, i),
                                         "a label must be a (key, value) pair");
        if (pair == NULL)
            goto fail;
        if (PySequence_Fast_GET_SIZE(pair) != 2) {
            Py_DECREF(pair);
            PyErr_SetString(PyExc_ValueError, "a label must be a (key, value) pair");
            goto fail;
        }
        Py_ssize_t key = string_index(self, PySequence_Fast_GET_ITEM(pair, 0));
        Py_ssize_t text = key < 0 ? -1 : string_index(self, PySequence_Fast_GET_ITEM(pair, 1));
        Py_DECREF(pair);
        if (text < 0)
            goto fail;
        char msg[24];
        char *p = put_int(put_int(msg, 1, key), 2, text);
        if (buf_field(&b, 3, msg, (size_t)(p - msg)) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    PyObject *out = intern_bytes(self, b.data, b.len);
    PyMem_Free(b.data);
    return out;
fail:
    Py_DECREF(seq);
    PyMem_Free(b.data);
    return NULL;
}

static inline size_t
pair_hash(const void *a, const void *b)
{
    uint64_t h = (uint64_t)(uintptr_t)a * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)(uintptr_t)b + 0x7F4A7C159E3779B9ULL + (h << 6) + (h >> 2);
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return (size_t)h;
}

static int
grow_samples(Encoder *self)
{
    size_t cap = self->cap_samples ? self->cap_samples * 2 : 64;
    PyObject **st = PyMem_Realloc(self->s_stack, cap * sizeof(PyObject *));
    if (st == NULL)
        return -1;
    self->s_stack = st;
    PyObject **lb = PyMem_Realloc(self->s_labels, cap * sizeof(PyObject *));
    if (lb == NULL)
        return -1;
    self->s_labels = lb;
    int64_t *v = PyMem_Realloc(self->s_values, cap * (size_t)self->n_types * sizeof(int64_t));
    if (v == NULL)
        return -1;
    self->s_values = v;
    self->cap_samples = cap;
    /* The table stays at most half full. */
    size_t tcap = cap * 2;
    uint32_t *t = PyMem_Calloc(tcap, sizeof(uint32_t));
    if (t == NULL)
        return -1;
    for (size_t i = 0; i < self->n_samples; i++) {
        size_t j = pair_hash(self->s_stack[i], self->s_labels[i]) & (tcap - 1);
        while (t[j])
            j = (j + 1) & (tcap - 1);
        t[j] = (uint32_t)(i + 1);
    }
    PyMem_Free(self->table);
    self->table = t;
    self->table_cap = tcap;
    return 0;
}

/* Adds values to the sample (stack, labels), both interned: the table holds their refs. */
static int
add_sample(Encoder *self, PyObject *stack, PyObject *labels, const int64_t *values)
{
    if (self->n_samples >= UINT32_MAX - 1) {
        PyErr_SetString(PyExc_OverflowError, "too many samples in one profile");
        return -1;
    }
    if (self->table_cap) {
        size_t mask = self->table_cap - 1;
        for (size_t j = pair_hash(stack, labels) & mask;; j = (j + 1) & mask) {
            uint32_t slot = self->table[j];
            if (slot == 0)
                break;
            size_t i = slot - 1;
            if (self->s_stack[i] == stack && self->s_labels[i] == labels) {
                int64_t *total = self->s_values + i * (size_t)self->n_types;
                for (Py_ssize_t k = 0; k < self->n_types; k++)
                    total[k] += values[k];
                return 0;
            }
        }
    }
    if (self->n_samples == self->cap_samples && grow_samples(self) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    size_t i = self->n_samples++;
    self->s_stack[i] = Py_NewRef(stack);
    self->s_labels[i] = Py_NewRef(labels);
    memcpy(self->s_values + i * (size_t)self->n_types, values,
           (size_t)self->n_types * sizeof(int64_t));
    size_t mask = self->table_cap - 1;
    size_t j = pair_hash(stack, labels) & mask;
    while (self->table[j])
        j = (j + 1) & mask;
    self->table[j] = (uint32_t)(i + 1);
    return 0;
}

PyDoc_STRVAR(
    add_doc,
    "add(stack, value, labels=(), stack_key=None)\n\n"
    "``stack`` leaf first, of (name, filename, line, first_line); ``value`` in the sample "
    "type's\n"
    "unit (one per sample type when there are several).  A sample whose values are all zero\n"
    "records nothing.  ``stack_key`` stands for ``stack`` in this writer (a tuple stack is "
    "its\n"
    "own key).");

static PyObject *
encoder_add(Encoder *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *stack, *value, *labels, *stack_key = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 4) {
        PyErr_SetString(PyExc_TypeError, "add() takes at most 4 arguments");
        return NULL;
    }
    PyObject *slot[4] = {NULL, NULL, NULL, NULL};
    for (Py_ssize_t i = 0; i < nargs; i++)
        slot[i] = args[i];
    static const char *names[4] = {"stack", "value", "labels", "stack_key"};
    for (Py_ssize_t k = 0; k < nkw; k++) {
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
        if (name == NULL)
            return NULL;
        int at = -1;
        for (int i = 0; i < 4; i++)
            if (strcmp(name, names[i]) == 0)
                at = i;
        if (at < 0 || slot[at] != NULL) {
            PyErr_Format(PyExc_TypeError, "add() got an unexpected or repeated argument '%s'",
                         name);
            return NULL;
        }
        slot[at] = args[nargs + k];
    }
    if (slot[0] == NULL || slot[1] == NULL) {
        PyErr_SetString(PyExc_TypeError, "add() needs stack and value");
        return NULL;
    }
    stack = slot[0];
    value = slot[1];
    labels = slot[2];
    if (slot[3] != NULL)
        stack_key = slot[3];
    if (self->strings == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ProfileWriter not initialized");
        return NULL;
    }

    int64_t values[MAX_TYPES];
    if (PyLong_CheckExact(value)) {
        int64_t v = as_int64(value, "a sample value");
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (v <= 0)
            Py_RETURN_NONE;
        if (self->n_types != 1) {
            PyErr_Format(PyExc_ValueError, "1 values for %zd sample types", self->n_types);
            return NULL;
        }
        values[0] = v;
    } else {
        PyObject *seq = PySequence_Fast(value, "value must be an int or a sequence of ints");
        if (seq == NULL)
            return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        int positive = 0;
        for (Py_ssize_t i = 0; i < n && i < MAX_TYPES; i++) {
            int64_t v = as_int64(PySequence_Fast_GET_ITEM(seq, i), "a sample value");
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
            values[i] = v;
            positive |= v > 0;
        }
        Py_DECREF(seq);
        if (!positive && n <= MAX_TYPES)
            Py_RETURN_NONE;
        if (n != self->n_types) {
            PyErr_Format(PyExc_ValueError, "%zd values for %zd sample types", n, self->n_types);
            return NULL;
        }
    }

    /* The stack, resolved once per writer and key. */
    if (stack_key == Py_None && PyTuple_Check(stack))
        stack_key = stack;
    PyObject *packed = NULL;
    if (stack_key != Py_None) {
        packed = PyDict_GetItemWithError(self->stacks, stack_key);
        if (packed == NULL && PyErr_Occurred())
            return NULL;
        Py_XINCREF(packed);
    }
    if (packed == NULL) {
        packed = encode_stack(self, stack);
        if (packed == NULL)
            return NULL;
        if (stack_key != Py_None && PyDict_SetItem(self->stacks, stack_key, packed) < 0) {
            Py_DECREF(packed);
            return NULL;
        }
    }

    /* The labels: a tuple is interned once per writer. */
    PyObject *encoded = NULL;
    if (labels == NULL)
        labels = PyTuple_New(0); /* the empty tuple is a singleton: cheap */
    else
        Py_INCREF(labels);
    if (labels == NULL) {
        Py_DECREF(packed);
        return NULL;
    }
    int is_tuple = PyTuple_Check(labels);
    if (is_tuple) {
        encoded = PyDict_GetItemWithError(self->label_sets, labels);
        if (encoded == NULL && PyErr_Occurred())
            goto fail;
        Py_XINCREF(encoded);
    }
    if (encoded == NULL) {
        encoded = encode_labels(self, labels);
        if (encoded == NULL)
            goto fail;
        if (is_tuple && PyDict_SetItem(self->label_sets, labels, encoded) < 0)
            goto fail;
    }
    int rc = add_sample(self, packed, encoded, values);
    Py_DECREF(labels);
    Py_DECREF(packed);
    Py_DECREF(encoded);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
fail:
    Py_DECREF(labels);
    Py_DECREF(packed);
    Py_XDECREF(encoded);
    return NULL;
}

static Py_ssize_t
encoder_len(Encoder *self)
{
    return (Py_ssize_t)self->n_samples;
}

/* A ValueType message (type, unit) as field `field` of the profile. */
static int
put_value_type(Encoder *self, Buf *out, int field, PyObject *pair)
{
    Py_ssize_t type = string_index(self, PyTuple_GET_ITEM(pair, 0));
    Py_ssize_t unit = type < 0 ? -1 : string_index(self, PyTuple_GET_ITEM(pair, 1));
    if (unit < 0)
        return -1;
    Buf msg = {0};
    int rc = (buf_int(&msg, 1, type) < 0 || buf_int(&msg, 2, unit) < 0 ||
              buf_field(out, field, msg.data, msg.len) < 0)
                 ? -1
                 : 0;
    PyMem_Free(msg.data);
    return rc;
}

static int
put_samples(Encoder *self, Buf *out)
{
    Buf values = {0};
    for (size_t i = 0; i < self->n_samples; i++) {
        values.len = 0;
        const int64_t *v = self->s_values + i * (size_t)self->n_types;
        for (Py_ssize_t k = 0; k < self->n_types; k++)
            if (buf_varint(&values, (uint64_t)v[k]) < 0)
                goto fail;
        PyObject *stack = self->s_stack[i], *labels = self->s_labels[i];
        size_t stack_len = (size_t)PyBytes_GET_SIZE(stack);
        size_t labels_len = (size_t)PyBytes_GET_SIZE(labels);
        size_t body = labels_len + 1 + varint_size(values.len) + values.len;
        if (stack_len)
            body += 1 + varint_size(stack_len) + stack_len;
        if (buf_varint(out, (2 << 3) | 2) < 0 || buf_varint(out, body) < 0)
            goto fail;
        if (stack_len && buf_field(out, 1, PyBytes_AS_STRING(stack), stack_len) < 0)
            goto fail;
        if (buf_field(out, 2, values.data, values.len) < 0 ||
            buf_bytes(out, PyBytes_AS_STRING(labels), labels_len) < 0)
            goto fail;
    }
    PyMem_Free(values.data);
    return 0;
fail:
    PyMem_Free(values.data);
    return -1;
}

static int
put_locations(Encoder *self, Buf *out)
{
    for (size_t i = 0; i < self->n_locs; i++) {
        char line[24];
        char *p = put_int(put_int(line, 1, self->loc_function[i]), 2, self->loc_line[i]);
        char loc[48];
        char *q = put_int(loc, 1, (int64_t)(i + 1));
        *q++ = (char)((4 << 3) | 2);
        q = put_varint(q, (uint64_t)(p - line));
        memcpy(q, line, (size_t)(p - line));
        q += p - line;
        if (buf_field(out, 4, loc, (size_t)(q - loc)) < 0)
            return -1;
    }
    return 0;
}

static int
put_functions(Encoder *self, Buf *out)
{
    Py_ssize_t n = PyList_GET_SIZE(self->function_list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(self->function_list, i); /* (name, filename, first) */
        Py_ssize_t name = string_index(self, PyTuple_GET_ITEM(key, 0));
        Py_ssize_t file = name < 0 ? -1 : string_index(self, PyTuple_GET_ITEM(key, 1));
        if (file < 0)
            return -1;
        int64_t first = as_int64(PyTuple_GET_ITEM(key, 2), "a first line");
        if (first == -1 && PyErr_Occurred())
            return -1;
        char fn[64];
        char *p = put_int(fn, 1, (int64_t)(i + 1));
        p = put_int(p, 2, name); /* name and system_name: Python has one */
        p = put_int(p, 3, name);
        p = put_int(put_int(p, 4, file), 5, first);
        if (buf_field(out, 5, fn, (size_t)(p - fn)) < 0)
            return -1;
    }
    return 0;
}

static int
put_strings(Encoder *self, Buf *out)
{
    Py_ssize_t n = PyList_GET_SIZE(self->string_list);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = PyList_GET_ITEM(self->string_list, i);
        Py_ssize_t len;
        const char *utf8 = PyUnicode_AsUTF8AndSize(text, &len);
        if (utf8 != NULL) {
            if (buf_field(out, 6, utf8, (size_t)len) < 0)
                return -1;
            continue;
        }
        /* Lone surrogates (a file name from undecodable bytes): replaced, as Python's twin. */
        PyErr_Clear();
        PyObject *b = PyUnicode_AsEncodedString(text, "utf-8", "replace");
        if (b == NULL)
            return -1;
        int rc = buf_field(out, 6, PyBytes_AS_STRING(b), (size_t)PyBytes_GET_SIZE(b));
        Py_DECREF(b);
        if (rc < 0)
            return -1;
    }
    return 0;
}

PyDoc_STRVAR(encode_raw_doc, "encode_raw(time_ns, duration_ns) -> bytes\n\n"
                             "The profile as protobuf bytes, not compressed.");

static PyObject *
encoder_encode_raw(Encoder *self, PyObject *args)
{
    long long time_ns, duration_ns;
    if (!PyArg_ParseTuple(args, "LL:encode_raw", &time_ns, &duration_ns))
        return NULL;
    if (self->strings == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "ProfileWriter not initialized");
        return NULL;
    }
    Buf out = {0};
    for (Py_ssize_t i = 0; i < self->n_types; i++)
        if (put_value_type(self, &out, 1, PyTuple_GET_ITEM(self->sample_types, i)) < 0)
            goto fail;
    if (put_samples(self, &out) < 0 || put_locations(self, &out) < 0 ||
        put_functions(self, &out) < 0)
        goto fail;
    /* period_type's strings go in the table before it is written (field 11 comes after). */
    Buf period_type = {0};
    if (put_value_type(self, &period_type, 11, self->period_type) < 0 ||
        put_strings(self, &out) < 0 || buf_int(&out, 9, time_ns) < 0 ||
        buf_int(&out, 10, duration_ns) < 0 ||
        buf_bytes(&out, period_type.data, period_type.len) < 0 ||
        buf_int(&out, 12, self->period) < 0) {
        PyMem_Free(period_type.data);
        goto fail;
    }
    PyMem_Free(period_type.data);
    PyObject *result = PyBytes_FromStringAndSize(out.data, (Py_ssize_t)out.len);
    PyMem_Free(out.data);
    return result;
fail:
    PyMem_Free(out.data);
    return NULL;
}

static PyObject *
encoder_get_sample_types(Encoder *self, void *closure)
{
    return Py_NewRef(self->sample_types ? self->sample_types : Py_None);
}

static PyObject *
encoder_get_period_type(Encoder *self, void *closure)
{
    return Py_NewRef(self->period_type ? self->period_type : Py_None);
}

static PyObject *
encoder_get_period(Encoder *self, void *closure)
{
    return PyLong_FromLongLong(self->period);
}

static PyMethodDef encoder_methods[] = {
    {"add", (PyCFunction)(void (*)(void))encoder_add, METH_FASTCALL | METH_KEYWORDS, add_doc},
    {"encode_raw", (PyCFunction)encoder_encode_raw, METH_VARARGS, encode_raw_doc},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef encoder_getset[] = {
    {"sample_types", (getter)encoder_get_sample_types, NULL, "((type, unit), ...)", NULL},
    {"period_type", (getter)encoder_get_period_type, NULL, "(type, unit)", NULL},
    {"period", (getter)encoder_get_period, NULL, "the sampling period", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods encoder_as_sequence = {
    .sq_length = (lenfunc)encoder_len,
};

static PyTypeObject EncoderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._pprof_writer.ProfileEncoder",
    .tp_basicsize = sizeof(Encoder),
    .tp_dealloc = (destructor)encoder_dealloc,
    .tp_as_sequence = &encoder_as_sequence,
    /* It holds only strings, ints, tuples of them and bytes: no cycle can pass through it. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "ProfileEncoder(sample_type, period_type, period): one profile; add samples, "
              "then encode_raw.",
    .tp_methods = encoder_methods,
    .tp_getset = encoder_getset,
    .tp_init = (initproc)encoder_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hotspan._speedups._pprof_writer",
    .m_doc = "The agent's pprof encoder (C twin of hotspan.agent.pprof_writer).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__pprof_writer(void)
{
    if (PyType_Ready(&EncoderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&EncoderType);
    if (PyModule_AddObject(m, "ProfileEncoder", (PyObject *)&EncoderType) < 0) {
        Py_DECREF(&EncoderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
