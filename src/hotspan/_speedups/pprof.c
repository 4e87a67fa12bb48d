/*
 * hotspan._speedups._pprof: decode a pprof profile straight from its protobuf wire bytes
 * into flat arrays, resolving every sample to its root-first frame ids and stack id.
 *
 * Why C: going through protobuf message objects costs a Python object per location id
 * (about 12,000 per 10-second Python CPU profile), which caps ingest well below 1,000
 * uploads/s on two cores.  The pure-Python path in hotspan/formats/pprof_decode.py has the
 * same interface and gives identical results; it is used when this module is not built.
 *
 * Every read is bounds-checked: malformed input raises ValueError, never crashes the server.
 * Decoding runs without the GIL (raw malloc, errors kept as text until the GIL is back), so
 * the server can decode on one core while its event loop runs on the other.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frame_cache.h"
#include "hashing.h"
#include "inflate.h"

/* ---- growable arrays --------------------------------------------------------------------- */

typedef struct {
    int64_t *data;
    Py_ssize_t len, cap;
} Vec;

/* The error of the current decode; set without the GIL, raised once it is held again. */
static _Thread_local char error_text[160];

static int
fail(const char *what)
{
    if (!error_text[0])
        snprintf(error_text, sizeof(error_text), "malformed pprof: %s", what);
    return -1;
}

/* Room for ``n`` more items. */
static int
vec_reserve(Vec *v, Py_ssize_t n)
{
    if (n <= v->cap - v->len)
        return 0;
    Py_ssize_t cap = v->cap ? v->cap : 64;
    while (cap - v->len < n)
        cap *= 2;
    int64_t *d = (int64_t *)realloc(v->data, (size_t)cap * sizeof(int64_t));
    if (!d) {
        snprintf(error_text, sizeof(error_text), "out of memory");
        return -1;
    }
    v->data = d;
    v->cap = cap;
    return 0;
}

static inline int
vec_push(Vec *v, int64_t x)
{
    if (v->len == v->cap && vec_reserve(v, 1) < 0)
        return -1;
    v->data[v->len++] = x;
    return 0;
}

static void
vec_free(Vec *v)
{
    free(v->data);
    v->data = NULL;
    v->len = v->cap = 0;
}

/* ---- results handed over as they are -----------------------------------------------------
 * A block of memory the decoder filled (an array's items, the inflated payload), lent to
 * Python as a read-only buffer and freed with it: copied into bytes objects, they were most of
 * what a decode did with the GIL held (a 10 s profile's are ~200 KB). */

typedef struct {
    PyObject_HEAD void *data;
    Py_ssize_t len;
} Block;

static void
block_dealloc(PyObject *self)
{
    free(((Block *)self)->data);
    PyObject_Free(self);
}

static int
block_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, b->data, b->len, 1, flags);
}

static Py_ssize_t
block_length(PyObject *self)
{
    return ((Block *)self)->len;
}

static PyBufferProcs block_buffer = {block_getbuffer, NULL};
static PySequenceMethods block_sequence = {block_length};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._pprof.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = block_dealloc,
    .tp_as_sequence = &block_sequence,
    .tp_as_buffer = &block_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes the decoder made, read through the buffer protocol (len: their count).",
};

/* A block owning ``data`` (malloc'd, ``len`` bytes used), which is freed now if the block
 * cannot be made.  The room it had to grow goes back: blocks live as long as their batch. */
static PyObject *
block_of(void *data, Py_ssize_t len)
{
    void *fitted = realloc(data, (size_t)len);
    if (fitted)
        data = fitted;
    Block *b = PyObject_New(Block, &BlockType);
    if (!b) {
        free(data);
        return NULL;
    }
    b->data = data;
    b->len = len;
    return (PyObject *)b;
}

/* The vector's items as a block, which takes its memory (the vector is left empty). */
static PyObject *
vec_block(Vec *v)
{
    if (v->len == 0)
        return PyBytes_FromStringAndSize(NULL, 0);
    PyObject *out = block_of(v->data, v->len * (Py_ssize_t)sizeof(int64_t));
    v->data = NULL;
    v->len = v->cap = 0;
    return out;
}

/* ---- protobuf wire reading --------------------------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
    int depth; /* messages around this one: 0 for the Profile, 1 for a Sample, ... */
} Reader;

/* upb (the Python decoder) allows 100 levels of messages and groups together. */
#define MAX_NESTING 100

/* A varint of at most ``max_bytes`` bytes.  upb (the Python decoder) reads values of up to 10
 * bytes but tags and lengths of up to 5, and refuses longer ones; so does this. */
static inline int
read_varint_upto(Reader *r, uint64_t *out, int max_bytes)
{
    /* Most varints of a profile (ids, string indexes, tags) are one byte. */
    if (r->p < r->end && !(*r->p & 0x80)) {
        *out = *r->p++;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (r->p >= r->end)
            return fail("truncated varint");
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return fail("varint too long");
}

static inline int
read_varint(Reader *r, uint64_t *out)
{
    return read_varint_upto(r, out, 10);
}

/* A field's tag: field number and wire type; the number may be 0 (see read_key). */
static inline int
read_tag(Reader *r, uint32_t *field, uint32_t *wire)
{
    uint64_t key;
    if (read_varint_upto(r, &key, 5) < 0)
        return -1;
    if (key > 0xFFFFFFFFULL)
        return fail("invalid field number");
    *field = (uint32_t)(key >> 3);
    *wire = (uint32_t)(key & 7);
    return 0;
}

/* Reads a field key; *field = 0 at the end of the message. */
static inline int
read_key(Reader *r, uint32_t *field, uint32_t *wire)
{
    if (r->p >= r->end) {
        *field = 0;
        return 0;
    }
    if (read_tag(r, field, wire) < 0)
        return -1;
    if (*field == 0)
        return fail("invalid field number");
    return 0;
}

static inline int
read_len(Reader *r, Reader *sub)
{
    uint64_t n;
    if (read_varint_upto(r, &n, 5) < 0)
        return -1;
    if (n > (uint64_t)(r->end - r->p))
        return fail("length past the end");
    sub->p = r->p;
    sub->end = r->p + n;
    sub->depth = r->depth + 1;
    r->p += n;
    return 0;
}

static int skip(Reader *r, uint32_t field, uint32_t wire);

/* A group (deprecated wire types 3/4): skip fields until the matching end-group key.
 * ``level``: the messages and groups around it, itself included. */
static int
skip_group(Reader *r, uint32_t field, int level)
{
    uint32_t f, w;
    if (level > MAX_NESTING)
        return fail("groups nested too deep");
    for (;;) {
        /* Inside a group upb takes field number 0 as any other unknown field. */
        if (r->p >= r->end)
            return fail("unterminated group");
        if (read_tag(r, &f, &w) < 0)
            return -1;
        if (w == 4)
            return f == field ? 0 : fail("mismatched end of group");
        if (w == 3) {
            if (skip_group(r, f, level + 1) < 0)
                return -1;
        } else if (skip(r, f, w) < 0) {
            return -1;
        }
    }
}

static int
skip(Reader *r, uint32_t field, uint32_t wire)
{
    uint64_t v;
    Reader sub;
    switch (wire) {
    case 3: return skip_group(r, field, r->depth + 1);
    case 0: return read_varint(r, &v);
    case 1:
        if (r->end - r->p < 8)
            return fail("truncated fixed64");
        r->p += 8;
        return 0;
    case 2: return read_len(r, &sub);
    case 5:
        if (r->end - r->p < 4)
            return fail("truncated fixed32");
        r->p += 4;
        return 0;
    default: return fail("unsupported wire type");
    }
}

/* A varint field; with another wire type it is an unknown field and skipped, as upb does. */
static inline int
read_int(Reader *r, uint32_t field, uint32_t wire, int64_t *out)
{
    uint64_t v;
    if (wire != 0)
        return skip(r, field, wire);
    if (read_varint(r, &v) < 0)
        return -1;
    *out = (int64_t)v;
    return 0;
}

/* A repeated integer field, packed (wire 2) or not (wire 0). */
static int
read_ints(Reader *r, uint32_t field, uint32_t wire, Vec *out)
{
    uint64_t v;
    if (wire == 0) {
        if (read_varint(r, &v) < 0)
            return -1;
        return vec_push(out, (int64_t)v);
    }
    if (wire != 2)
        return skip(r, field, wire);
    Reader sub;
    if (read_len(r, &sub) < 0)
        return -1;
    /* A varint is at least a byte: room for them all at once, then no check per value. */
    if (vec_reserve(out, sub.end - sub.p) < 0)
        return -1;
    while (sub.p < sub.end) {
        if (read_varint(&sub, &v) < 0)
            return -1;
        out->data[out->len++] = (int64_t)v;
    }
    return 0;
}

/* ---- id -> index lookup ------------------------------------------------------------------
 * Ids are almost always 1..n: then a direct table.  Otherwise sorted pairs and a binary search.
 * Duplicate ids: the first one wins, as in the Python path. */

typedef struct {
    uint64_t id;
    Py_ssize_t index;
} IdIndex;

typedef struct {
    Py_ssize_t *dense; /* dense[id] = index, or -1 */
    uint64_t dense_len;
    IdIndex *sorted;
    Py_ssize_t n;
} Lookup;

static int
cmp_id(const void *a, const void *b)
{
    const IdIndex *x = (const IdIndex *)a, *y = (const IdIndex *)b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int
build_lookup(Lookup *lk, const Vec *ids)
{
    uint64_t max_id = 0;
    memset(lk, 0, sizeof(*lk));
    lk->n = ids->len;
    for (Py_ssize_t i = 0; i < ids->len; i++)
        if ((uint64_t)ids->data[i] > max_id)
            max_id = (uint64_t)ids->data[i];
    if (max_id < (uint64_t)ids->len * 4 + 64) {
        lk->dense_len = max_id + 1;
        lk->dense = (Py_ssize_t *)malloc(sizeof(Py_ssize_t) * (size_t)lk->dense_len);
        if (!lk->dense)
            return fail("out of memory");
        for (uint64_t i = 0; i < lk->dense_len; i++)
            lk->dense[i] = -1;
        for (Py_ssize_t i = ids->len - 1; i >= 0; i--)
            lk->dense[(uint64_t)ids->data[i]] = i;
        return 0;
    }
    lk->sorted = (IdIndex *)malloc(sizeof(IdIndex) * (size_t)(ids->len ? ids->len : 1));
    if (!lk->sorted)
        return fail("out of memory");
    for (Py_ssize_t i = 0; i < ids->len; i++) {
        lk->sorted[i].id = (uint64_t)ids->data[i];
        lk->sorted[i].index = i;
    }
    qsort(lk->sorted, (size_t)ids->len, sizeof(IdIndex), cmp_id);
    return 0;
}

static void
free_lookup(Lookup *lk)
{
    free(lk->dense);
    free(lk->sorted);
    memset(lk, 0, sizeof(*lk));
}

static inline Py_ssize_t
find(const Lookup *lk, uint64_t id)
{
    if (lk->dense)
        return id < lk->dense_len ? lk->dense[id] : -1;
    Py_ssize_t lo = 0, hi = lk->n; /* leftmost entry with this id */
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (lk->sorted[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (lo < lk->n && lk->sorted[lo].id == id) ? lk->sorted[lo].index : -1;
}

/* ---- decoding ---------------------------------------------------------------------------- */

typedef struct {
    /* raw submessages of the profile, by field */
    Vec sample_pos, mapping_pos, location_pos, function_pos,
        string_pos; /* (offset, len) pairs */
    Vec sample_types; /* (type, unit) pairs */
    int64_t period_type, period_unit, has_period_type, period, time_nanos, duration_nanos;
    int64_t default_sample_type; /* a string index; 0: none */
    /* functions and mappings */
    Vec fn_id, fn_name, fn_file, map_id, map_file;
    /* locations: frame ids (root-most first within a location) */
    Vec loc_id, loc_frame_off, loc_frames;
    /* frame table */
    Vec frame_id, frame_name, frame_file, frame_line;
    /* samples */
    Vec stack, frame_off, frames, values, labels, tmp_locs;
    Py_ssize_t max_depth, max_frames; /* limits: frames per stack, frames in all */
    Py_ssize_t max_loc_frames;        /* the most frames a location expands to */
} Decoder;

static void
decoder_free(Decoder *d)
{
    Vec *all[] = {&d->sample_pos,    &d->mapping_pos,  &d->location_pos, &d->function_pos,
                  &d->string_pos,    &d->sample_types, &d->fn_id,        &d->fn_name,
                  &d->fn_file,       &d->map_id,       &d->map_file,     &d->loc_id,
                  &d->loc_frame_off, &d->loc_frames,   &d->frame_id,     &d->frame_name,
                  &d->frame_file,    &d->frame_line,   &d->stack,        &d->frame_off,
                  &d->frames,        &d->values,       &d->labels,       &d->tmp_locs};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        vec_free(all[i]);
}

static int
remember(Vec *pos, const uint8_t *base, Reader *sub)
{
    if (vec_push(pos, (int64_t)(sub->p - base)) < 0)
        return -1;
    return vec_push(pos, (int64_t)(sub->end - sub->p));
}

static int
check_string(const Decoder *d, int64_t idx)
{
    if (idx < 0 || idx >= d->string_pos.len / 2)
        return fail("string index out of range");
    return 0;
}

static const uint8_t *
string_at(const Decoder *d, const uint8_t *base, int64_t idx, size_t *len)
{
    *len = (size_t)d->string_pos.data[2 * idx + 1];
    return base + d->string_pos.data[2 * idx];
}

static int
decode_top(Decoder *d, const uint8_t *base, Reader *r)
{
    uint32_t field, wire;
    Reader sub;
    for (;;) {
        if (read_key(r, &field, &wire) < 0)
            return -1;
        if (field == 0)
            return 0;
        if (field >= 1 && field <= 6 && wire == 2) {
            if (read_len(r, &sub) < 0)
                return -1;
            Vec *pos = NULL;
            if (field == 1) {
                int64_t type = 0, unit = 0;
                uint32_t f2, w2;
                for (;;) {
                    if (read_key(&sub, &f2, &w2) < 0)
                        return -1;
                    if (f2 == 0)
                        break;
                    if (f2 == 1) {
                        if (read_int(&sub, f2, w2, &type) < 0)
                            return -1;
                    } else if (f2 == 2) {
                        if (read_int(&sub, f2, w2, &unit) < 0)
                            return -1;
                    } else if (skip(&sub, f2, w2) < 0)
                        return -1;
                }
                if (vec_push(&d->sample_types, type) < 0 ||
                    vec_push(&d->sample_types, unit) < 0)
                    return -1;
                continue;
            }
            pos = field == 2   ? &d->sample_pos
                  : field == 3 ? &d->mapping_pos
                  : field == 4 ? &d->location_pos
                  : field == 5 ? &d->function_pos
                               : &d->string_pos;
            if (remember(pos, base, &sub) < 0)
                return -1;
        } else if (field == 11 && wire == 2) {
            uint32_t f2, w2;
            if (read_len(r, &sub) < 0)
                return -1;
            d->has_period_type = 1;
            for (;;) {
                if (read_key(&sub, &f2, &w2) < 0)
                    return -1;
                if (f2 == 0)
                    break;
                if (f2 == 1) {
                    if (read_int(&sub, f2, w2, &d->period_type) < 0)
                        return -1;
                } else if (f2 == 2) {
                    if (read_int(&sub, f2, w2, &d->period_unit) < 0)
                        return -1;
                } else if (skip(&sub, f2, w2) < 0)
                    return -1;
            }
        } else if (field == 9) {
            if (read_int(r, field, wire, &d->time_nanos) < 0)
                return -1;
        } else if (field == 10) {
            if (read_int(r, field, wire, &d->duration_nanos) < 0)
                return -1;
        } else if (field == 12) {
            if (read_int(r, field, wire, &d->period) < 0)
                return -1;
        } else if (field == 14) {
            if (read_int(r, field, wire, &d->default_sample_type) < 0)
                return -1;
        } else if (field == 13 && wire == 2) {
            /* comment (repeated int64), unused here; but upb reads the packed run and refuses
             * a varint cut short inside it, and both decoders must refuse the same. */
            uint64_t v;
            if (read_len(r, &sub) < 0)
                return -1;
            while (sub.p < sub.end)
                if (read_varint(&sub, &v) < 0)
                    return -1;
        } else if (skip(r, field, wire) < 0) {
            return -1;
        }
    }
}

static int
decode_functions(Decoder *d, const uint8_t *base)
{
    for (Py_ssize_t i = 0; i < d->function_pos.len; i += 2) {
        Reader r = {base + d->function_pos.data[i],
                    base + d->function_pos.data[i] + d->function_pos.data[i + 1], 1};
        int64_t id = 0, name = 0, system_name = 0, file = 0;
        uint32_t f, w;
        for (;;) {
            if (read_key(&r, &f, &w) < 0)
                return -1;
            if (f == 0)
                break;
            if (f == 1) {
                if (read_int(&r, f, w, &id) < 0)
                    return -1;
            } else if (f == 2) {
                if (read_int(&r, f, w, &name) < 0)
                    return -1;
            } else if (f == 3) {
                if (read_int(&r, f, w, &system_name) < 0)
                    return -1;
            } else if (f == 4) {
                if (read_int(&r, f, w, &file) < 0)
                    return -1;
            } else if (skip(&r, f, w) < 0)
                return -1;
        }
        if (check_string(d, name) < 0 || check_string(d, system_name) < 0 ||
            check_string(d, file) < 0)
            return -1;
        if (name == 0)
            name = system_name;
        if (vec_push(&d->fn_id, id) < 0 || vec_push(&d->fn_name, name) < 0 ||
            vec_push(&d->fn_file, file) < 0)
            return -1;
    }
    return 0;
}

static int
decode_mappings(Decoder *d, const uint8_t *base)
{
    for (Py_ssize_t i = 0; i < d->mapping_pos.len; i += 2) {
        Reader r = {base + d->mapping_pos.data[i],
                    base + d->mapping_pos.data[i] + d->mapping_pos.data[i + 1], 1};
        int64_t id = 0, file = 0;
        uint32_t f, w;
        for (;;) {
            if (read_key(&r, &f, &w) < 0)
                return -1;
            if (f == 0)
                break;
            if (f == 1) {
                if (read_int(&r, f, w, &id) < 0)
                    return -1;
            } else if (f == 5) {
                if (read_int(&r, f, w, &file) < 0)
                    return -1;
            } else if (skip(&r, f, w) < 0)
                return -1;
        }
        if (check_string(d, file) < 0)
            return -1;
        if (vec_push(&d->map_id, id) < 0 || vec_push(&d->map_file, file) < 0)
            return -1;
    }
    return 0;
}

/* Some .NET profilers write every function id as 0, one function per location: give function i
 * the id of location i, as Pyroscope does, so that the names are not lost. */
static int
repair_function_ids(Decoder *d, const uint8_t *base)
{
    if (d->fn_id.len == 0 || d->fn_id.len != d->location_pos.len / 2)
        return 0;
    for (Py_ssize_t i = 0; i < d->fn_id.len; i++)
        if (d->fn_id.data[i] != 0)
            return 0;
    for (Py_ssize_t i = 0; i < d->location_pos.len; i += 2) {
        Reader r = {base + d->location_pos.data[i],
                    base + d->location_pos.data[i] + d->location_pos.data[i + 1], 1};
        int64_t id = 0;
        uint32_t f, w;
        for (;;) {
            if (read_key(&r, &f, &w) < 0)
                return -1;
            if (f == 0)
                break;
            if (f == 1) {
                if (read_int(&r, f, w, &id) < 0)
                    return -1;
            } else if (skip(&r, f, w) < 0)
                return -1;
        }
        d->fn_id.data[i / 2] = id;
    }
    return 0;
}

static int
add_frame(Decoder *d, const uint8_t *base, int64_t name, int64_t file, int64_t line)
{
    /* name == -1: an unsymbolized address; ``line`` holds the address. */
    size_t name_len = 0, file_len = 0;
    const uint8_t *name_p = (const uint8_t *)"", *file_p = string_at(d, base, file, &file_len);
    if (name >= 0)
        name_p = string_at(d, base, name, &name_len);
    int64_t id = cached_frame_id(name_p, name_len, file_p, file_len, line);
    if (vec_push(&d->frame_id, id) < 0 || vec_push(&d->frame_name, name) < 0 ||
        vec_push(&d->frame_file, file) < 0 || vec_push(&d->frame_line, line) < 0 ||
        vec_push(&d->loc_frames, id) < 0)
        return -1;
    return 0;
}

static int
decode_locations(Decoder *d, const uint8_t *base)
{
    Lookup fn_index, map_index;
    Vec lines = {0};
    int rc = -1;
    memset(&fn_index, 0, sizeof(fn_index));
    memset(&map_index, 0, sizeof(map_index));
    if (build_lookup(&fn_index, &d->fn_id) < 0 || build_lookup(&map_index, &d->map_id) < 0)
        goto done;
    if (vec_push(&d->loc_frame_off, 0) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < d->location_pos.len; i += 2) {
        Reader r = {base + d->location_pos.data[i],
                    base + d->location_pos.data[i] + d->location_pos.data[i + 1], 1};
        int64_t id = 0, mapping = 0, address = 0;
        uint32_t f, w;
        lines.len = 0;
        for (;;) {
            if (read_key(&r, &f, &w) < 0)
                goto done;
            if (f == 0)
                break;
            if (f == 1) {
                if (read_int(&r, f, w, &id) < 0)
                    goto done;
            } else if (f == 2) {
                if (read_int(&r, f, w, &mapping) < 0)
                    goto done;
            } else if (f == 3) {
                if (read_int(&r, f, w, &address) < 0)
                    goto done;
            } else if (f == 4 && w == 2) {
                Reader sub;
                int64_t fn = 0, line = 0;
                uint32_t f2, w2;
                if (read_len(&r, &sub) < 0)
                    goto done;
                for (;;) {
                    if (read_key(&sub, &f2, &w2) < 0)
                        goto done;
                    if (f2 == 0)
                        break;
                    if (f2 == 1) {
                        if (read_int(&sub, f2, w2, &fn) < 0)
                            goto done;
                    } else if (f2 == 2) {
                        if (read_int(&sub, f2, w2, &line) < 0)
                            goto done;
                    } else if (skip(&sub, f2, w2) < 0)
                        goto done;
                }
                if (vec_push(&lines, fn) < 0 || vec_push(&lines, line) < 0)
                    goto done;
            } else if (skip(&r, f, w) < 0)
                goto done;
        }
        if (vec_push(&d->loc_id, id) < 0)
            goto done;
        if (lines.len == 0) {
            Py_ssize_t m = find(&map_index, (uint64_t)mapping);
            if (add_frame(d, base, -1, m >= 0 ? d->map_file.data[m] : 0, address) < 0)
                goto done;
        } else {
            /* line[0] is the innermost inlined callee: walk back to get root-most first. */
            for (Py_ssize_t j = lines.len - 2; j >= 0; j -= 2) {
                Py_ssize_t k = find(&fn_index, (uint64_t)lines.data[j]);
                int64_t name = k >= 0 ? d->fn_name.data[k] : 0,
                        file = k >= 0 ? d->fn_file.data[k] : 0;
                if (add_frame(d, base, name, file, lines.data[j + 1]) < 0)
                    goto done;
            }
        }
        Py_ssize_t expanded =
            d->loc_frames.len - d->loc_frame_off.data[d->loc_frame_off.len - 1];
        if (expanded > d->max_loc_frames)
            d->max_loc_frames = expanded;
        if (vec_push(&d->loc_frame_off, d->loc_frames.len) < 0)
            goto done;
    }
    rc = 0;
done:
    free_lookup(&fn_index);
    free_lookup(&map_index);
    vec_free(&lines);
    return rc;
}

static int
decode_samples(Decoder *d, const uint8_t *base)
{
    Py_ssize_t n_types = d->sample_types.len / 2;
    Lookup loc_index;
    Vec vals = {0};
    int rc = -1;
    if (build_lookup(&loc_index, &d->loc_id) < 0)
        goto done;
    if (vec_push(&d->frame_off, 0) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < d->sample_pos.len; i += 2) {
        Reader r = {base + d->sample_pos.data[i],
                    base + d->sample_pos.data[i] + d->sample_pos.data[i + 1], 1};
        Py_ssize_t sample = i / 2;
        uint32_t f, w;
        d->tmp_locs.len = 0;
        vals.len = 0;
        for (;;) {
            if (read_key(&r, &f, &w) < 0)
                goto done;
            if (f == 0)
                break;
            if (f == 1) {
                if (read_ints(&r, f, w, &d->tmp_locs) < 0)
                    goto done;
            } else if (f == 2) {
                if (read_ints(&r, f, w, &vals) < 0)
                    goto done;
            } else if (f == 3 && w == 2) {
                Reader sub;
                int64_t key = 0, str = 0, num = 0;
                uint32_t f2, w2;
                if (read_len(&r, &sub) < 0)
                    goto done;
                for (;;) {
                    if (read_key(&sub, &f2, &w2) < 0)
                        goto done;
                    if (f2 == 0)
                        break;
                    if (f2 == 1) {
                        if (read_int(&sub, f2, w2, &key) < 0)
                            goto done;
                    } else if (f2 == 2) {
                        if (read_int(&sub, f2, w2, &str) < 0)
                            goto done;
                    } else if (f2 == 3) {
                        if (read_int(&sub, f2, w2, &num) < 0)
                            goto done;
                    } else if (skip(&sub, f2, w2) < 0)
                        goto done;
                }
                if (check_string(d, key) < 0 || check_string(d, str) < 0)
                    goto done;
                if (str != 0) {
                    if (vec_push(&d->labels, sample) < 0 || vec_push(&d->labels, key) < 0 ||
                        vec_push(&d->labels, str) < 0)
                        goto done;
                }
            } else if (skip(&r, f, w) < 0)
                goto done;
        }
        if (vals.len != n_types) {
            snprintf(error_text, sizeof(error_text),
                     "malformed pprof: sample has %zd values for %zd sample types", vals.len,
                     n_types);
            goto done;
        }
        Py_ssize_t start = d->frames.len;
        /* Room for the deepest stack kept, so that the copy below checks nothing per frame:
         * max_depth, or less when its locations cannot expand to that many. */
        Py_ssize_t room = d->max_depth;
        if (d->tmp_locs.len * d->max_loc_frames < room)
            room = d->tmp_locs.len * d->max_loc_frames;
        if (vec_reserve(&d->frames, room) < 0)
            goto done;
        int64_t *out = d->frames.data + start, *end = out + room;
        const int64_t *off = d->loc_frame_off.data, *loc_frames = d->loc_frames.data;
        /* Root first; past max_depth the deepest frames are dropped (as Pyroscope does), but
         * every location id is still checked. */
        for (Py_ssize_t j = d->tmp_locs.len - 1; j >= 0; j--) {
            Py_ssize_t k = find(&loc_index, (uint64_t)d->tmp_locs.data[j]);
            if (k < 0) {
                snprintf(error_text, sizeof(error_text),
                         "malformed pprof: unknown location id %llu",
                         (unsigned long long)d->tmp_locs.data[j]);
                goto done;
            }
            for (Py_ssize_t m = off[k]; m < off[k + 1] && out < end; m++)
                *out++ = loc_frames[m];
        }
        d->frames.len = out - d->frames.data;
        if (d->frames.len > d->max_frames) {
            fail("profile expands to too many frames");
            goto done;
        }
        if (vec_push(&d->stack, hash_stack_raw(d->frames.data + start,
                                               (size_t)(d->frames.len - start))) < 0 ||
            vec_push(&d->frame_off, d->frames.len) < 0)
            goto done;
        if (vec_reserve(&d->values, vals.len) < 0)
            goto done;
        memcpy(d->values.data + d->values.len, vals.data, (size_t)vals.len * sizeof(int64_t));
        d->values.len += vals.len;
    }
    rc = 0;
done:
    free_lookup(&loc_index);
    vec_free(&vals);
    return rc;
}

static int
decode_all(Decoder *d, const uint8_t *base, Reader *r)
{
    if (decode_top(d, base, r) < 0)
        return -1;
    if (d->string_pos.len == 0)
        return fail("empty string table");
    for (Py_ssize_t i = 0; i < d->sample_types.len; i++)
        if (check_string(d, d->sample_types.data[i]) < 0)
            return -1;
    if (d->has_period_type &&
        (check_string(d, d->period_type) < 0 || check_string(d, d->period_unit) < 0))
        return -1;
    if (decode_functions(d, base) < 0 || repair_function_ids(d, base) < 0 ||
        decode_mappings(d, base) < 0 || decode_locations(d, base) < 0 ||
        decode_samples(d, base) < 0)
        return -1;
    return 0;
}

PyDoc_STRVAR(
    decode_doc,
    "decode(data: bytes, max_depth: int, max_frames: int, max_size: int = -1) -> tuple\n\n"
    "Decode a pprof profile, keeping at most max_depth root-most frames per stack and "
    "refusing\n"
    "profiles that expand to more than max_frames frames in all.  With max_size >= 0, gzipped "
    "data\n"
    "is inflated first (to at most max_size bytes) and an empty payload is refused.  Returns "
    "(payload,\n"
    "string_pos, sample_types, period_type, period_unit, has_period_type, period, "
    "time_nanos,\n"
    "duration_nanos, frame_id, frame_name, frame_file, frame_line, stack, frame_off, frames,\n"
    "values, labels, default_sample_type): the payload decoded, the string table as (offset, "
    "length) pairs into "
    "it,\n"
    "and the array items as buffers of native int64 (bytes, or blocks the decoder filled: "
    "read\n"
    "them through the buffer protocol).  Raises ValueError on malformed input.");

static PyObject *
decode(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Decoder d;
    Py_ssize_t max_depth, max_frames, max_size = -1;
    PyObject *payload = NULL, *result = NULL;
    uint8_t *inflated = NULL;
    size_t inflated_len = 0;
    memset(&d, 0, sizeof(d));
    if (!PyArg_ParseTuple(args, "y*nn|n", &view, &max_depth, &max_frames, &max_size))
        return NULL;
    d.max_depth = max_depth;
    d.max_frames = max_frames;
    const uint8_t *base = (const uint8_t *)view.buf;
    Py_ssize_t len = view.len;
    int gzipped =
        max_size >= 0 && len >= 2 && base[0] == GZIP_MAGIC_0 && base[1] == GZIP_MAGIC_1;
    int ok;
    /* Inflating and decoding in one stretch without the GIL: see inflate.c. */
    Py_BEGIN_ALLOW_THREADS
    error_text[0] = 0;
    ok = 1;
    if (gzipped) {
        ok = gunzip_bounded(base, (size_t)len, (size_t)max_size, &inflated, &inflated_len,
                            error_text, sizeof(error_text)) == 0;
        base = inflated;
        len = (Py_ssize_t)inflated_len;
    }
    if (ok && max_size >= 0 && len == 0) {
        snprintf(error_text, sizeof(error_text), "empty pprof profile");
        ok = 0;
    }
    if (ok) {
        Reader r = {base, base + len};
        ok = decode_all(&d, base, &r) == 0;
    }
    Py_END_ALLOW_THREADS
    if (!ok) {
        PyErr_SetString(strcmp(error_text, "out of memory") == 0 ? PyExc_MemoryError
                                                                 : PyExc_ValueError,
                        error_text);
        goto done;
    }
    /* The string table stays in the payload: most uploads name only stacks the store has. */
    if (!gzipped && view.obj && PyBytes_CheckExact(view.obj)) {
        payload = view.obj;
        Py_INCREF(payload);
    } else if (gzipped) {
        payload = block_of(inflated, len);
        inflated = NULL; /* the block's now, or already freed */
    } else {
        payload = PyBytes_FromStringAndSize((const char *)base, len);
    }
    if (!payload)
        goto done;
    result = Py_BuildValue(
        "(ONNLLLLLLNNNNNNNNNL)", payload, vec_block(&d.string_pos), vec_block(&d.sample_types),
        (long long)d.period_type, (long long)d.period_unit, (long long)d.has_period_type,
        (long long)d.period, (long long)d.time_nanos, (long long)d.duration_nanos,
        vec_block(&d.frame_id), vec_block(&d.frame_name), vec_block(&d.frame_file),
        vec_block(&d.frame_line), vec_block(&d.stack), vec_block(&d.frame_off),
        vec_block(&d.frames), vec_block(&d.values), vec_block(&d.labels),
        (long long)d.default_sample_type);
done:
    Py_XDECREF(payload);
    free(inflated);
    decoder_free(&d);
    PyBuffer_Release(&view);
    return result;
}

static PyObject *
py_hash_frame(PyObject *self, PyObject *args)
{
    Py_buffer name, file;
    long long line;
    if (!PyArg_ParseTuple(args, "y*y*L", &name, &file, &line))
        return NULL;
    int64_t h = hash_frame_raw((const uint8_t *)name.buf, (size_t)name.len,
                               (const uint8_t *)file.buf, (size_t)file.len, (int64_t)line);
    PyBuffer_Release(&name);
    PyBuffer_Release(&file);
    return PyLong_FromLongLong((long long)h);
}

static PyObject *
py_hash_stacks(PyObject *self, PyObject *args)
{
    /* hash_stacks(frames: bytes of int64, offsets: bytes of int64) -> bytes of int64 */
    Py_buffer frames, offsets;
    if (!PyArg_ParseTuple(args, "y*y*", &frames, &offsets))
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t nf = frames.len / 8, no = offsets.len / 8;
    const int64_t *f = (const int64_t *)frames.buf, *o = (const int64_t *)offsets.buf;
    if (no < 1) {
        PyErr_SetString(PyExc_ValueError, "offsets must hold at least one entry");
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, (no - 1) * 8);
    if (!out)
        goto done;
    int64_t *h = (int64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i + 1 < no; i++) {
        if (o[i] < 0 || o[i] > o[i + 1] || o[i + 1] > nf) {
            Py_CLEAR(out);
            PyErr_SetString(PyExc_ValueError, "offsets out of range");
            goto done;
        }
        h[i] = hash_stack_raw(f + o[i], (size_t)(o[i + 1] - o[i]));
    }
done:
    PyBuffer_Release(&frames);
    PyBuffer_Release(&offsets);
    return out;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {"hash_frame", py_hash_frame, METH_VARARGS,
     "hash_frame(name: bytes, filename: bytes, line: int) -> int"},
    {"hash_stacks", py_hash_stacks, METH_VARARGS,
     "hash_stacks(frames: bytes, offsets: bytes) -> bytes (int64 stack ids)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hotspan._speedups._pprof",
                                    "C fast path for pprof decoding and stack hashing.", -1,
                                    methods};

PyMODINIT_FUNC
PyInit__pprof(void)
{
    if (PyType_Ready(&BlockType) < 0)
        return NULL;
    return PyModule_Create(&module);
}
