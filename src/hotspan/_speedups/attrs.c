/*
 * hotspan._speedups._attrs: a span's flattened attributes (hotspan.model.trace) split into the
 * keys and values of the embedded store's attribute index, the C twin of
 * hotspan/store/attr_index.py's py_split_attributes.
 *
 * Why C: every attribute of every span stored becomes a row of the index.  Split by DuckDB's
 * string functions (string_split, unnest, strpos, substr), that was three quarters of the
 * instructions of the index's insert and the largest part of what a span costs the writer; in
 * Python it costs more still (several microseconds a span).
 *
 * A text is records, each after a record separator (RS); a record's key ends at its unit
 * separator (US) or at the mark of a string that reads as a number (STRING_US), whichever of
 * the two first ones comes later, as the SQL of duckdb_schema.span_attr_rows reads it; the value
 * keeps its mark.  Empty records are skipped; a record with no mark is all key, its value empty.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define RS 0x1e
#define US 0x1f
#define STRING_US 0x1c

/* The first index in [start, end) of the character c, or -1. */
static Py_ssize_t
find_char(int kind, const void *data, Py_ssize_t start, Py_ssize_t end, Py_UCS4 c)
{
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *s = (const Py_UCS1 *)data;
        const void *hit = memchr(s + start, (int)c, (size_t)(end - start));
        return hit ? (const Py_UCS1 *)hit - s : -1;
    }
    for (Py_ssize_t i = start; i < end; i++)
        if (PyUnicode_READ(kind, data, i) == c)
            return i;
    return -1;
}

/* Appends the key and value of the record [start, end) of text; 0, or -1 with an exception. */
static int
add_record(PyObject *text, int kind, const void *data, Py_ssize_t start, Py_ssize_t end,
           PyObject *keys, PyObject *values, PyObject *empty)
{
    Py_ssize_t us = find_char(kind, data, start, end, US);
    Py_ssize_t string_us = find_char(kind, data, start, end, STRING_US);
    Py_ssize_t mark = us > string_us ? us : string_us;
    PyObject *key, *value;
    if (mark < 0) {
        key = PyUnicode_Substring(text, start, end);
        Py_INCREF(empty);
        value = empty;
    } else {
        key = PyUnicode_Substring(text, start, mark);
        value = PyUnicode_Substring(text, mark, end);
    }
    int failed = key == NULL || value == NULL || PyList_Append(keys, key) < 0 ||
                 PyList_Append(values, value) < 0;
    Py_XDECREF(key);
    Py_XDECREF(value);
    return failed ? -1 : 0;
}

PyDoc_STRVAR(split_doc, "split_attributes(texts) -> (counts, keys, values)\n\n"
                        "The index rows of flattened attribute texts: counts, the native int64 "
                        "number of rows of each text, as bytes; the rows' keys and values.");

static PyObject *
split_attributes(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *seq = PySequence_Fast(arg, "split_attributes() takes a sequence of str");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *counts = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int64_t));
    PyObject *keys = PyList_New(0);
    PyObject *values = PyList_New(0);
    PyObject *empty = PyUnicode_FromStringAndSize(NULL, 0);
    if (counts == NULL || keys == NULL || values == NULL || empty == NULL)
        goto fail;
    int64_t *count = (int64_t *)PyBytes_AS_STRING(counts);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *text = items[i];
        if (!PyUnicode_Check(text)) {
            PyErr_Format(PyExc_TypeError, "split_attributes() takes str, not %.100s",
                         Py_TYPE(text)->tp_name);
            goto fail;
        }
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(text) < 0)
            goto fail;
#endif
        int kind = PyUnicode_KIND(text);
        const void *data = PyUnicode_DATA(text);
        Py_ssize_t len = PyUnicode_GET_LENGTH(text);
        Py_ssize_t before = PyList_GET_SIZE(keys);
        Py_ssize_t start = 0;
        while (start <= len) {
            Py_ssize_t rs = find_char(kind, data, start, len, RS);
            Py_ssize_t end = rs < 0 ? len : rs;
            if (end > start &&
                add_record(text, kind, data, start, end, keys, values, empty) < 0)
                goto fail;
            start = end + 1;
        }
        count[i] = (int64_t)(PyList_GET_SIZE(keys) - before);
    }
    Py_DECREF(seq);
    Py_DECREF(empty);
    return Py_BuildValue("(NNN)", counts, keys, values);
fail:
    Py_DECREF(seq);
    Py_XDECREF(counts);
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(empty);
    return NULL;
}

static PyMethodDef methods[] = {
    {"split_attributes", split_attributes, METH_O, split_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "hotspan._speedups._attrs",
    .m_doc = "Span attributes split for the attribute index (C twin of "
             "hotspan.store.attr_index).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__attrs(void)
{
    return PyModule_Create(&module);
}
