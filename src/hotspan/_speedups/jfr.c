/*
 * hotspan._speedups._jfr: a Java Flight Recorder recording straight to summed profile
 * samples, with their frames and stacks deduplicated and hashed as the store wants them.
 *
 * Why C: the Python reader (hotspan/formats/jfr.py and jfr_profiles.py) builds a tuple per
 * constant-pool value and per stack frame, and a JFR upload cost ~20 times a pprof one.
 * That reader is the reference: this one reads the same things the same way (the same
 * checks, the same values, the same refusals) and tests/formats hold them to identical
 * profiles on every recording of the test corpus; the fuzzer compares them too.
 *
 * Hostile input: every read is bounds-checked against its chunk, every count against the
 * bytes left, recursion is bounded (metadata elements 64 deep, types 32 deep), and the
 * values a recording may hold (pool values, array elements, events) are capped by the
 * caller's budget.  Errors are kept as text and raised as ValueError once the GIL is back.
 * Parsing runs without the GIL; it is taken back only for the rare text that Python must
 * decode (invalid UTF-8, UTF-16 surrogates) or rename (generated class names).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hashing.h"

static inline uint64_t
mix2(uint64_t a, uint64_t b)
{
    return fmix64(a * 0x9E3779B97F4A7C15ULL ^ fmix64(b + GOLDEN));
}

/* ---- limits and constants (mirror hotspan/formats/jfr.py) ------------------------------ */

#define HEADER_SIZE 68
#define MAX_ELEMENT_DEPTH 64
#define MAX_TYPE_DEPTH 32
#define MAX_READS_PER_BYTE 16
#define MAX_SAMPLE_VALUE ((1ULL << 53) - 1)

/* ---- growable memory ----------------------------------------------------------------- */

typedef struct {
    uint8_t *data;
    size_t len, cap;
} Bytes;

static int
grow(void **data, size_t *cap, size_t need, size_t item)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > ((size_t)1 << 40) / item)
            return -1;
        n *= 2;
    }
    void *p = realloc(*data, n * item);
    if (!p)
        return -1;
    *data = p;
    *cap = n;
    return 0;
}

#define VEC(T)                                                                                 \
    struct {                                                                                   \
        T *data;                                                                               \
        size_t len, cap;                                                                       \
    }
#define VEC_PUSH(v, x)                                                                         \
    (grow((void **)&(v).data, &(v).cap, (v).len + 1, sizeof(*(v).data))                        \
         ? -1                                                                                  \
         : ((v).data[(v).len++] = (x), 0))

typedef VEC(int64_t) I64s;

/* Open addressing: u64 key -> int64 value (pool ids are mostly small and dense: a
   multiplicative hash, its high bits, spreads them well). */
typedef struct {
    uint64_t key;
    int64_t val;
    uint8_t used;
} MapEntry;

typedef struct {
    MapEntry *e;
    size_t cap, n;
    int shift;
} Map;

static inline size_t
map_hash(const Map *m, uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> m->shift);
}

static void
map_free(Map *m)
{
    free(m->e);
    memset(m, 0, sizeof(*m));
}

static int64_t *
map_slot(Map *m, uint64_t key, int *found)
{
    if (m->n * 2 + 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        int bits = 0;
        while (((size_t)1 << bits) < cap)
            bits++;
        MapEntry *e = calloc(cap, sizeof(MapEntry));
        if (!e)
            return NULL;
        Map bigger = {e, cap, m->n, 64 - bits};
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->e[i].used)
                continue;
            size_t j = map_hash(&bigger, m->e[i].key);
            while (e[j].used)
                j = (j + 1) & (cap - 1);
            e[j] = m->e[i];
        }
        free(m->e);
        *m = bigger;
    }
    size_t j = map_hash(m, key);
    while (m->e[j].used) {
        if (m->e[j].key == key) {
            *found = 1;
            return &m->e[j].val;
        }
        j = (j + 1) & (m->cap - 1);
    }
    *found = 0;
    m->e[j].used = 1;
    m->e[j].key = key;
    m->n++;
    return &m->e[j].val;
}

static int
map_get(const Map *m, uint64_t key, int64_t *out)
{
    if (!m->cap)
        return 0;
    size_t j = map_hash(m, key);
    while (m->e[j].used) {
        if (m->e[j].key == key) {
            *out = m->e[j].val;
            return 1;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return 0;
}

/* Hash set of indexes into a table the caller compares against (hash kept beside). */
typedef struct {
    int64_t *idx; /* -1: empty */
    uint64_t *hash;
    size_t cap, n;
} Index;

static void
index_free(Index *x)
{
    free(x->idx);
    free(x->hash);
    memset(x, 0, sizeof(*x));
}

static int
index_grow(Index *x)
{
    if (x->n * 2 + 2 <= x->cap)
        return 0;
    size_t cap = x->cap ? x->cap * 2 : 64;
    int64_t *idx = malloc(cap * sizeof(int64_t));
    uint64_t *hash = malloc(cap * sizeof(uint64_t));
    if (!idx || !hash) {
        free(idx);
        free(hash);
        return -1;
    }
    for (size_t i = 0; i < cap; i++)
        idx[i] = -1;
    for (size_t i = 0; i < x->cap; i++) {
        if (x->idx[i] < 0)
            continue;
        size_t j = x->hash[i] & (cap - 1);
        while (idx[j] >= 0)
            j = (j + 1) & (cap - 1);
        idx[j] = x->idx[i];
        hash[j] = x->hash[i];
    }
    free(x->idx);
    free(x->hash);
    x->idx = idx;
    x->hash = hash;
    x->cap = cap;
    return 0;
}

/* ---- values -------------------------------------------------------------------------- */

/* What the Python reader's value would be: enough to act as parse() does on it. */
enum { V_NONE, V_INT, V_BOOL, V_REF, V_STR, V_FLOAT, V_TUPLE, V_LIST };

typedef struct {
    uint8_t kind;
    uint8_t enc; /* V_STR: 1 empty, 3 UTF-8, 4 UTF-16 units, 5 Latin-1 */
    uint64_t u;  /* V_INT, V_BOOL, V_REF; V_STR: byte or unit count */
    size_t pos;  /* V_STR: where the bytes or units start in the chunk */
} Val;

static inline int
is_int(const Val *v)
{
    return v->kind == V_INT || v->kind == V_BOOL || v->kind == V_REF;
}

/* ---- types --------------------------------------------------------------------------- */

enum {
    P_STRUCT,
    P_SHORT, /* short and char: the codec's 16-bit integer */
    P_INT,
    P_LONG,
    P_BYTE,
    P_BOOL,
    P_FLOAT,
    P_DOUBLE,
    P_STRING
};

typedef struct {
    int32_t name; /* metadata string */
    uint64_t type_id;
    uint8_t cp, array;
    int32_t tidx; /* the type's index, once checked (not for pool references) */
} Field;

typedef struct {
    uint64_t id;
    int32_t name;
    VEC(Field) fields;
    uint8_t prim;
    int8_t state; /* 0 unchecked, 1 checking, 2 checked */
    int32_t height;
    uint64_t size, reads;
    int8_t *slots;  /* field -> capture slot (-1: none), when read as a pool's value */
    int8_t *fslots; /* the same, when read as a stack frame */
} Type;

typedef struct {
    const char *s; /* ASCII text, or NULL when the string is not ASCII (equal to no name) */
    size_t n;
} MStr;

/* ---- the reader's state --------------------------------------------------------------- */

enum {
    KIND_CPU,
    KIND_WALL,
    KIND_IN_TLAB,
    KIND_OUTSIDE_TLAB,
    KIND_ALLOC_SAMPLE,
    KIND_LOCK,
    KIND_PARK,
    KIND_LIVE,
    KIND_MALLOC,
    N_KINDS
};
static const int KIND_VALUES[N_KINDS] = {1, 1, 2, 2, 2, 2, 2, 1, 2};

enum {
    E_EXEC,
    E_WALL,
    E_TLAB,
    E_OUTSIDE,
    E_ALLOC_SAMPLE,
    E_MONITOR,
    E_PARK,
    E_LIVE,
    E_MALLOC,
    E_SETTING,
    N_EVENTS
};
static const char *EVENT_NAMES[N_EVENTS] = {"jdk.ExecutionSample",
                                            "profiler.WallClockSample",
                                            "jdk.ObjectAllocationInNewTLAB",
                                            "jdk.ObjectAllocationOutsideTLAB",
                                            "jdk.ObjectAllocationSample",
                                            "jdk.JavaMonitorEnter",
                                            "jdk.ThreadPark",
                                            "profiler.LiveObject",
                                            "profiler.Malloc",
                                            "jdk.ActiveSetting"};

/* Capture slots of an event's wanted fields (jfr.py's PROFILE_EVENTS). */
enum { S_STACK, S_STATE, S_CTX, S_SPAN, S_SNAME, S_NUM, S_NAME, S_VALUE, N_SLOTS };
typedef struct {
    const char *name;
    int slot;
} Want;
static const Want WANTED[N_EVENTS][7] = {
    {{"stackTrace", S_STACK},
     {"state", S_STATE},
     {"contextId", S_CTX},
     {"spanId", S_SPAN},
     {"spanName", S_SNAME}},
    {{"stackTrace", S_STACK},
     {"state", S_STATE},
     {"samples", S_NUM},
     {"contextId", S_CTX},
     {"spanId", S_SPAN},
     {"spanName", S_SNAME}},
    {{"stackTrace", S_STACK},
     {"tlabSize", S_NUM},
     {"contextId", S_CTX},
     {"spanId", S_SPAN},
     {"spanName", S_SNAME}},
    {{"stackTrace", S_STACK},
     {"allocationSize", S_NUM},
     {"contextId", S_CTX},
     {"spanId", S_SPAN},
     {"spanName", S_SNAME}},
    {{"stackTrace", S_STACK}, {"weight", S_NUM}},
    {{"stackTrace", S_STACK},
     {"duration", S_NUM},
     {"contextId", S_CTX},
     {"spanId", S_SPAN},
     {"spanName", S_SNAME}},
    {{"stackTrace", S_STACK}, {"duration", S_NUM}},
    {{"stackTrace", S_STACK}},
    {{"stackTrace", S_STACK}, {"size", S_NUM}},
    {{"name", S_NAME}, {"value", S_VALUE}},
};

/* Pools whose values profiles look up (by the type of that name). */
enum { T_STACK, T_FRAME, T_METHOD, T_CLASS, T_SYMBOL, T_STATE, T_STRING, N_NAMED };
static const char *NAMED[N_NAMED] = {
    "jdk.types.StackTrace", "jdk.types.StackFrame",  "jdk.types.Method", "java.lang.Class",
    "jdk.types.Symbol",     "jdk.types.ThreadState", "java.lang.String"};

typedef struct {
    Val method, line;
} CapFrame;

typedef struct {
    size_t off, n; /* captured frames */
} StackEntry;

typedef struct {
    Val a, b;
} Pair;

typedef struct {
    int64_t stack;
    uint64_t ctx, span, sname;
    int64_t v[2];
} Row;

typedef struct {
    VEC(Row) rows;
    Index index;
    int order; /* 1 + position among kinds by first sample, 0: none yet */
} KindRows;

typedef struct {
    size_t off, len;
} Span;

typedef struct {
    /* input */
    const uint8_t *data;
    size_t size;
    uint64_t period;
    int64_t budget;
    uint64_t max_values;
    PyObject *merge; /* hotspan.formats.jfr.merge_generated_names */
    PyThreadState *ts;

    /* the chunk */
    const uint8_t *b;
    size_t n, pos, chunk_offset;
    int compressed;
    VEC(MStr) mstr;
    VEC(Type) types;
    Map type_of; /* id -> index */
    int32_t named[N_NAMED];
    int32_t sf_method, sf_line, st_frames; /* field positions in the named types */
    Map pool[N_NAMED];
    VEC(StackEntry) stacks;
    VEC(CapFrame) frames;
    VEC(Pair) pairs; /* values of the method, class, symbol, state and string pools */
    Map stack_cache, method_cache, symbol_cache; /* per chunk: ref -> resolved */
    VEC(Span) symbol_text;
    Bytes scratch, name_buf;

    /* the profiles (all chunks) */
    Bytes arena;
    VEC(Span) names;
    Index name_index;
    VEC(int64_t) frame_name;
    I64s frame_line;
    Index frame_index;
    I64s stack_frames;
    VEC(Span) stack_span;
    Index stack_index;
    I64s resolve_tmp;
    KindRows kinds[N_KINDS];
    int n_kinds;
    int has_event; /* the ``event`` setting: its text in arena at event_off */
    size_t event_off, event_len;

    char err[320];
    int py_error; /* a Python exception is set (GIL held when it was) */
} R;

static int
fail(R *r, const char *fmt, ...)
{
    if (!r->err[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, sizeof(r->err), fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int
nomem(R *r)
{
    return fail(r, "out of memory reading the recording");
}

static int
past_end(R *r)
{
    return fail(r,
                "chunk at offset %zu: a value runs past the end of its chunk (truncated or "
                "corrupt recording)",
                r->chunk_offset);
}

/* ---- primitive reads ------------------------------------------------------------------- */

static inline int
rd_varint(R *r, uint64_t *out)
{
    const uint8_t *b = r->b;
    size_t p = r->pos, n = r->n;
    uint64_t v = 0;
    *out = 0; /* set on every path: callers stop at the error, compilers cannot tell */
    for (int shift = 0;; shift += 7) {
        if (p >= n)
            return past_end(r);
        uint8_t c = b[p++];
        if (shift == 56) {
            v |= (uint64_t)c << 56;
            break;
        }
        v |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80)
            break;
    }
    r->pos = p;
    *out = v;
    return 0;
}

static inline int
rd_fixed(R *r, int width, uint64_t *out)
{
    *out = 0;
    if (r->n - r->pos < (size_t)width || r->pos > r->n)
        return past_end(r);
    uint64_t v = 0;
    for (int i = 0; i < width; i++)
        v = (v << 8) | r->b[r->pos + i];
    r->pos += width;
    *out = v;
    return 0;
}

static inline int
rd_short(R *r, uint64_t *out)
{
    return r->compressed ? rd_varint(r, out) : rd_fixed(r, 2, out);
}

static inline int
rd_int(R *r, uint64_t *out)
{
    return r->compressed ? rd_varint(r, out) : rd_fixed(r, 4, out);
}

static inline int
rd_long(R *r, uint64_t *out)
{
    return r->compressed ? rd_varint(r, out) : rd_fixed(r, 8, out);
}

static inline int
rd_byte(R *r, uint8_t *out)
{
    *out = 0;
    if (r->pos >= r->n)
        return past_end(r);
    *out = r->b[r->pos++];
    return 0;
}

static inline size_t
left(R *r)
{
    return r->pos <= r->n ? r->n - r->pos : 0;
}

static int
charge(R *r, uint64_t n)
{
    if (n > (uint64_t)r->budget) {
        r->budget = -1;
        return fail(r,
                    "the recording holds more than %llu constant-pool values, array elements "
                    "and profile events (the most hotspan reads of one upload)",
                    (unsigned long long)r->max_values);
    }
    r->budget -= (int64_t)n;
    return 0;
}

/* A string as codec.string reads it. */
static int
rd_string(R *r, Val *out)
{
    uint8_t enc;
    uint64_t n;
    if (rd_byte(r, &enc) < 0)
        return -1;
    out->kind = V_STR;
    out->enc = enc;
    out->u = 0;
    switch (enc) {
    case 3:
    case 5:
        if (rd_int(r, &n) < 0)
            return -1;
        if (n > left(r))
            return past_end(r);
        out->pos = r->pos;
        out->u = n;
        r->pos += n;
        return 0;
    case 0: out->kind = V_NONE; return 0;
    case 1: return 0;
    case 2: out->kind = V_REF; return rd_long(r, &out->u);
    case 4:
        if (rd_int(r, &n) < 0)
            return -1;
        if (n > left(r))
            return past_end(r);
        out->pos = r->pos;
        out->u = n;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t c;
            if (rd_short(r, &c) < 0)
                return -1;
        }
        return 0;
    default: return fail(r, "unknown string encoding %u at offset %zu", enc, r->pos - 1);
    }
}

/* ---- metadata -------------------------------------------------------------------------- */

static int
mstr_is(R *r, int32_t i, const char *s)
{
    if (i < 0)
        return s[0] == 0;
    MStr m = r->mstr.data[i];
    size_t n = strlen(s);
    return m.s && m.n == n && memcmp(m.s, s, n) == 0;
}

/* A metadata string, kept as ASCII text when it is (every name the reader compares is). */
static int
rd_mstr(R *r, MStr *out)
{
    Val v;
    if (rd_string(r, &v) < 0)
        return -1;
    out->s = "";
    out->n = 0;
    if (v.kind != V_STR || v.enc == 1 || v.u == 0)
        return 0;
    if (v.enc == 3 || v.enc == 5) {
        for (uint64_t i = 0; i < v.u; i++)
            if (r->b[v.pos + i] >= 0x80) {
                out->s = NULL;
                return 0;
            }
        out->s = (const char *)r->b + v.pos;
        out->n = v.u;
        return 0;
    }
    /* UTF-16 units: ASCII only if every unit is; copied out (the units are integers). */
    size_t save = r->pos;
    r->pos = v.pos;
    size_t start = r->arena.len;
    for (uint64_t i = 0; i < v.u; i++) {
        uint64_t c;
        if (rd_short(r, &c) < 0)
            return -1;
        if (c >= 0x80) {
            out->s = NULL;
            r->arena.len = start;
            r->pos = save;
            return 0;
        }
        if (grow((void **)&r->arena.data, &r->arena.cap, r->arena.len + 1, 1) < 0)
            return nomem(r);
        r->arena.data[r->arena.len++] = (uint8_t)c;
    }
    r->pos = save;
    /* The arena may move: metadata strings point into it only until the chunk ends, and
       nothing else grows it while the metadata is read. */
    out->s = (const char *)(uintptr_t)(start + 1); /* fixed up in fix_mstr */
    out->n = v.u | ((size_t)1 << 62);
    return 0;
}

static void
fix_mstr(R *r)
{
    for (size_t i = 0; i < r->mstr.len; i++) {
        MStr *m = &r->mstr.data[i];
        if (m->s && (m->n & ((size_t)1 << 62))) {
            m->n &= ~((size_t)1 << 62);
            m->s = (const char *)r->arena.data + ((uintptr_t)m->s - 1);
        }
    }
}

typedef struct {
    int32_t key, val;
} Attr;

/* The last value of attribute ``key`` (a later one replaces an earlier, as in a dict). */
static int32_t
attr(R *r, const Attr *a, size_t n, const char *key, int *present)
{
    *present = 0;
    int32_t out = -1;
    for (size_t i = 0; i < n; i++)
        if (mstr_is(r, a[i].key, key)) {
            out = a[i].val;
            *present = 1;
        }
    return out;
}

static int
int_attr(R *r, const Attr *a, size_t n, const char *key, uint64_t *out)
{
    int present;
    int32_t v = attr(r, a, n, key, &present);
    MStr m = present ? r->mstr.data[v] : (MStr){"", 0};
    int ok = m.s && m.n >= 1 && m.n <= 20;
    uint64_t x = 0;
    for (size_t i = 0; ok && i < m.n; i++) {
        unsigned d = (unsigned char)m.s[i] - '0';
        if (d > 9 || x > (UINT64_MAX - d) / 10)
            ok = 0;
        else
            x = x * 10 + d;
    }
    if (!ok)
        return fail(r, "metadata element lacks a numeric '%s'", key);
    *out = x;
    return 0;
}

static int
rd_mindex(R *r, size_t n_strings, int32_t *out)
{
    uint64_t i;
    *out = 0;
    if (rd_int(r, &i) < 0)
        return -1;
    if (i >= n_strings)
        return fail(r, "metadata refers to string %llu of %zu", (unsigned long long)i,
                    n_strings);
    *out = (int32_t)i;
    return 0;
}

static int
element(R *r, int depth, int32_t parent)
{
    if (depth > MAX_ELEMENT_DEPTH)
        return fail(r, "metadata elements nest too deeply");
    size_t ns = r->mstr.len;
    int32_t name;
    uint64_t count, children;
    if (rd_mindex(r, ns, &name) < 0 || rd_int(r, &count) < 0)
        return -1;
    if (count > left(r) / 2)
        return fail(r, "metadata element has more attributes than bytes");
    Attr small[16], *attrs = small;
    if (count > 16 && !(attrs = malloc(count * sizeof(Attr))))
        return nomem(r);
    int rc = -1;
    for (uint64_t i = 0; i < count; i++)
        if (rd_mindex(r, ns, &attrs[i].key) < 0 || rd_mindex(r, ns, &attrs[i].val) < 0)
            goto done;
    if (rd_int(r, &children) < 0)
        goto done;
    if (children > left(r) / 3) {
        fail(r, "metadata element has more children than bytes");
        goto done;
    }
    int32_t current = -1;
    int present;
    if (mstr_is(r, name, "class") && depth == 2) {
        uint64_t id;
        if (int_attr(r, attrs, count, "id", &id) < 0)
            goto done;
        int32_t tname = attr(r, attrs, count, "name", &present);
        if (!present || mstr_is(r, tname, "")) {
            fail(r, "metadata class without a name");
            goto done;
        }
        int found;
        int64_t *slot = map_slot(&r->type_of, id, &found);
        if (!slot) {
            nomem(r);
            goto done;
        }
        Type t = {0};
        t.id = id;
        t.name = tname;
        if (found) { /* declared again: the later declaration replaces it, in place */
            Type *old = &r->types.data[*slot];
            free(old->fields.data);
            *old = t;
        } else {
            *slot = (int64_t)r->types.len;
            if (VEC_PUSH(r->types, t) < 0) {
                nomem(r);
                goto done;
            }
        }
        current = (int32_t)*slot;
    } else if (mstr_is(r, name, "field") && parent >= 0) {
        int32_t dim = attr(r, attrs, count, "dimension", &present);
        int array = present && mstr_is(r, dim, "1");
        if (present && !mstr_is(r, dim, "") && !mstr_is(r, dim, "0") && !array) {
            fail(r, "field: arrays of more than one dimension");
            goto done;
        }
        Field f = {0};
        f.name = attr(r, attrs, count, "name", &present);
        if (int_attr(r, attrs, count, "class", &f.type_id) < 0)
            goto done;
        int32_t cp = attr(r, attrs, count, "constantPool", &present);
        f.cp = present && mstr_is(r, cp, "true");
        f.array = (uint8_t)array;
        if (VEC_PUSH(r->types.data[parent].fields, f) < 0) {
            nomem(r);
            goto done;
        }
    }
    for (uint64_t i = 0; i < children; i++)
        if (element(r, depth + 1, current) < 0)
            goto done;
    rc = 0;
done:
    if (attrs != small)
        free(attrs);
    return rc;
}

static const struct {
    const char *name;
    uint8_t prim;
    uint8_t size;
} PRIMS[] = {{"short", P_SHORT, 1}, {"char", P_SHORT, 1},    {"int", P_INT, 1},
             {"long", P_LONG, 1},   {"byte", P_BYTE, 1},     {"boolean", P_BOOL, 1},
             {"float", P_FLOAT, 4}, {"double", P_DOUBLE, 8}, {"java.lang.String", P_STRING, 1}};

static int
metadata(R *r, size_t at)
{
    size_t chunk_n = r->n;
    r->pos = at;
    uint64_t size, kind, x, n;
    if (rd_int(r, &size) < 0)
        return -1;
    if (size == 0 || size > chunk_n - at)
        return fail(r, "metadata event of %llu bytes does not fit its chunk",
                    (unsigned long long)size);
    r->n = at + size; /* nothing of it may be read past its end */
    int rc = -1;
    if (rd_long(r, &kind) < 0)
        goto done;
    if (kind != 0) {
        fail(r, "metadata offset points at an event of type %llu, not 0",
             (unsigned long long)kind);
        goto done;
    }
    for (int i = 0; i < 3; i++)
        if (rd_long(r, &x) < 0)
            goto done;
    if (rd_int(r, &n) < 0)
        goto done;
    if (n > left(r)) {
        fail(r, "metadata claims %llu strings, more than its bytes", (unsigned long long)n);
        goto done;
    }
    r->arena.len = 0;
    for (uint64_t i = 0; i < n; i++) {
        MStr m;
        if (rd_mstr(r, &m) < 0 || VEC_PUSH(r->mstr, m) < 0)
            goto done;
    }
    fix_mstr(r);
    if (element(r, 0, -1) < 0)
        goto done;
    for (size_t i = 0; i < r->types.len; i++) {
        Type *t = &r->types.data[i];
        t->prim = P_STRUCT;
        t->size = 1;
        for (size_t k = 0; k < sizeof(PRIMS) / sizeof(PRIMS[0]); k++)
            if (mstr_is(r, t->name, PRIMS[k].name)) {
                t->prim = PRIMS[k].prim;
                t->size = PRIMS[k].size;
            }
    }
    rc = 0;
done:
    r->n = chunk_n;
    return rc;
}

/* The type a name stands for: the last of that name in declaration order (as a dict built
   from the types would keep), -1 if none. */
static int32_t
type_named(R *r, const char *name)
{
    int32_t out = -1;
    for (size_t i = 0; i < r->types.len; i++)
        if (mstr_is(r, r->types.data[i].name, name))
            out = (int32_t)i;
    return out;
}

static int32_t
field_index(R *r, int32_t type, const char *name)
{
    if (type < 0)
        return -1;
    Type *t = &r->types.data[type];
    for (size_t i = 0; i < t->fields.len; i++)
        if (mstr_is(r, t->fields.data[i].name, name))
            return (int32_t)i;
    return -1;
}

static int
type_of(R *r, uint64_t id, int32_t *out)
{
    int64_t i;
    *out = 0;
    if (!map_get(&r->type_of, id, &i))
        return fail(r, "reference to undeclared type id %llu", (unsigned long long)id);
    *out = (int32_t)i;
    return 0;
}

/* _Types._check: height of a type, refusing what cannot be read in bounded work. */
static int
check(R *r, int32_t ti, int depth)
{
    Type *t = &r->types.data[ti];
    if (t->state == 2)
        return t->height;
    if (t->prim != P_STRUCT) {
        t->state = 2;
        t->height = 0;
        t->reads = 1;
        return 0;
    }
    if (t->state == 1)
        return fail(r, "a type contains itself");
    if (depth >= MAX_TYPE_DEPTH)
        return fail(r, "types nest more than %d deep", MAX_TYPE_DEPTH);
    t->state = 1;
    int height = 0;
    uint64_t size = 0, reads = 1;
    for (size_t i = 0; i < r->types.data[ti].fields.len; i++) {
        Field f = r->types.data[ti].fields.data[i];
        if (f.cp) {
            size++;
            reads++;
            continue;
        }
        int32_t ci;
        if (type_of(r, f.type_id, &ci) < 0)
            return -1;
        r->types.data[ti].fields.data[i].tidx = ci; /* read without looking it up again */
        int h = check(r, ci, depth + 1);
        if (h < 0)
            return -1;
        if (h > height)
            height = h;
        if (f.array) {
            size++;
            reads++;
        } else {
            size += r->types.data[ci].size;
            reads += r->types.data[ci].reads;
        }
    }
    t = &r->types.data[ti];
    if (reads > MAX_READS_PER_BYTE * (size + 1))
        return fail(r, "a type has too many empty fields");
    t->size = size;
    t->reads = reads;
    t->height = height + 1;
    t->state = 2;
    return height + 1;
}

/* ---- values ---------------------------------------------------------------------------- */

typedef struct {
    const int8_t *slots; /* per field: capture slot, -1 none; NULL: nothing captured */
    int nslots_read;     /* fields to read (an event stops after its last wanted one) */
    Val *vals;
    int32_t frames_field; /* field whose array is captured as stack frames, -1 none */
} Cap;

static int read_value(R *r, int32_t ti, Val *out, int depth);
static int read_struct(R *r, int32_t ti, const Cap *cap, int depth);

/* A stack frame type whose fields are all pool references or integers (the fast path). */
static int
flat_frames(R *r, int32_t ti)
{
    Type *t = &r->types.data[ti];
    for (size_t i = 0; i < t->fields.len; i++) {
        const Field *f = &t->fields.data[i];
        if (f->array)
            return 0;
        if (f->cp)
            continue;
        uint8_t prim = r->types.data[f->tidx].prim;
        if (prim != P_SHORT && prim != P_INT && prim != P_LONG && prim != P_BYTE &&
            prim != P_BOOL)
            return 0;
    }
    return 1;
}

static int
frame_slots(R *r, int32_t ti)
{
    Type *t = &r->types.data[ti];
    if (t->fslots)
        return 0;
    size_t n = t->fields.len;
    int8_t *s = malloc(n ? n : 1);
    if (!s)
        return nomem(r);
    for (size_t i = 0; i < n; i++)
        s[i] = (int32_t)i == r->sf_method ? 0 : ((int32_t)i == r->sf_line ? 1 : -1);
    t->fslots = s;
    return 0;
}

/* An array field; its elements captured as stack frames when ``frames``. */
static int
read_array(R *r, const Field *f, int frames, int depth)
{
    uint64_t n;
    if (rd_int(r, &n) < 0)
        return -1;
    int32_t ei = -1;
    uint64_t min_size = 1;
    if (!f->cp) {
        ei = f->tidx; /* the field's type was checked with its struct's */
        min_size = r->types.data[ei].size;
    }
    if (n && min_size == 0)
        return fail(r, "array of a type that occupies no bytes");
    if (min_size && n > left(r) / min_size)
        return fail(r, "array of %llu values runs past the end of its chunk",
                    (unsigned long long)n);
    if (charge(r, n) < 0)
        return -1;
    if (f->cp) {
        uint64_t x;
        for (uint64_t i = 0; i < n; i++)
            if (rd_long(r, &x) < 0)
                return -1;
        return 0;
    }
    Type *et = &r->types.data[ei];
    if (!frames || et->prim != P_STRUCT || r->sf_method < 0 ||
        (size_t)r->sf_method >= et->fields.len) {
        Val v;
        for (uint64_t i = 0; i < n; i++)
            if (read_value(r, ei, &v, depth + 1) < 0)
                return -1;
        return 0;
    }
    /* Stack frames: a tuple each, whose method and line are kept. */
    if (frame_slots(r, ei) < 0)
        return -1;
    int has_line = r->sf_line >= 0 && (size_t)r->sf_line < r->types.data[ei].fields.len;
    if (grow((void **)&r->frames.data, &r->frames.cap, r->frames.len + n, sizeof(CapFrame)) < 0)
        return nomem(r);
    if (flat_frames(r, ei)) {
        /* Every field a pool reference or an integer (as in every recording seen): read
           field by field here, the same reads as read_struct's, without its generality. */
        const Field *fields = r->types.data[ei].fields.data;
        size_t nf = r->types.data[ei].fields.len;
        for (uint64_t i = 0; i < n; i++) {
            Val got[2] = {{0}, {0}};
            for (size_t j = 0; j < nf; j++) {
                const Field *f = &fields[j];
                uint8_t prim = f->cp ? P_LONG : r->types.data[f->tidx].prim;
                Val v = {0};
                v.kind = prim == P_BOOL ? V_BOOL : V_INT;
                int rc;
                if (prim == P_BYTE || prim == P_BOOL) {
                    uint8_t c;
                    rc = rd_byte(r, &c);
                    v.u = prim == P_BOOL ? c != 0 : c;
                } else {
                    rc = prim == P_LONG ? rd_long(r, &v.u)
                                        : (prim == P_INT ? rd_int(r, &v.u) : rd_short(r, &v.u));
                }
                if (rc < 0)
                    return -1;
                if ((int32_t)j == r->sf_method)
                    got[0] = v;
                if ((int32_t)j == r->sf_line)
                    got[1] = v;
            }
            CapFrame cf = {got[0], has_line ? got[1] : (Val){0}};
            r->frames.data[r->frames.len++] = cf;
        }
        return 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        Val got[2] = {{0}, {0}};
        Cap cap = {r->types.data[ei].fslots, -1, got, -1};
        if (read_struct(r, ei, &cap, depth + 1) < 0)
            return -1;
        if (r->sf_line == r->sf_method)
            got[1] = got[0];
        CapFrame cf = {got[0], has_line ? got[1] : (Val){0}};
        if (VEC_PUSH(r->frames, cf) < 0)
            return nomem(r);
    }
    return 0;
}

static int
read_struct(R *r, int32_t ti, const Cap *cap, int depth)
{
    if (depth > MAX_TYPE_DEPTH + 1)
        return fail(r, "types nest too deeply");
    size_t nf = r->types.data[ti].fields.len;
    if (cap && cap->nslots_read >= 0 && (size_t)cap->nslots_read < nf)
        nf = (size_t)cap->nslots_read;
    for (size_t i = 0; i < nf; i++) {
        const Field *f = &r->types.data[ti].fields.data[i];
        Val v = {0};
        if (f->array) {
            int frames = cap && cap->frames_field == (int32_t)i;
            if (read_array(r, f, frames, depth) < 0)
                return -1;
            v.kind = V_LIST;
        } else if (f->cp) {
            v.kind = V_INT;
            if (rd_long(r, &v.u) < 0)
                return -1;
        } else {
            if (read_value(r, f->tidx, &v, depth + 1) < 0)
                return -1;
        }
        if (cap && cap->slots && cap->slots[i] >= 0)
            cap->vals[cap->slots[i]] = v;
    }
    return 0;
}

static int
read_value(R *r, int32_t ti, Val *out, int depth)
{
    Type *t = &r->types.data[ti];
    uint8_t c;
    out->kind = V_INT;
    switch (t->prim) {
    case P_SHORT: return rd_short(r, &out->u);
    case P_INT: return rd_int(r, &out->u);
    case P_LONG: return rd_long(r, &out->u);
    case P_BYTE:
        if (rd_byte(r, &c) < 0)
            return -1;
        out->u = c;
        return 0;
    case P_BOOL:
        if (rd_byte(r, &c) < 0)
            return -1;
        out->kind = V_BOOL;
        out->u = c != 0;
        return 0;
    case P_FLOAT:
    case P_DOUBLE: {
        uint64_t x;
        out->kind = V_FLOAT;
        return rd_fixed(r, t->prim == P_FLOAT ? 4 : 8, &x);
    }
    case P_STRING: return rd_string(r, out);
    default: out->kind = V_TUPLE; return read_struct(r, ti, NULL, depth);
    }
}

/* ---- constant pools -------------------------------------------------------------------- */

static int
pool_slots(R *r, int which)
{
    int32_t ti = r->named[which];
    if (ti < 0 || which == T_STRING || which == T_FRAME)
        return 0;
    Type *t = &r->types.data[ti];
    size_t n = t->fields.len;
    int8_t *s = malloc(n ? n : 1);
    if (!s)
        return nomem(r);
    const char *a = NULL, *b = NULL;
    switch (which) {
    case T_METHOD:
        a = "type";
        b = "name";
        break;
    case T_CLASS: a = "name"; break;
    case T_SYMBOL: a = "string"; break;
    case T_STATE: a = "name"; break;
    default: break;
    }
    int32_t ia = a ? field_index(r, ti, a) : -1, ib = b ? field_index(r, ti, b) : -1;
    for (size_t i = 0; i < n; i++)
        s[i] = (int32_t)i == ia ? 0 : ((int32_t)i == ib ? 1 : -1);
    free(t->slots);
    t->slots = s;
    return 0;
}

static int
pool_value(R *r, int32_t ti, int which, uint64_t key)
{
    if (which < 0) {
        Val v;
        return read_value(r, ti, &v, 0);
    }
    int64_t index;
    if (which == T_STACK) {
        StackEntry e = {r->frames.len, 0};
        Cap cap = {NULL, -1, NULL, r->st_frames};
        if (read_struct(r, ti, &cap, 0) < 0)
            return -1;
        e.n = r->frames.len - e.off;
        index = (int64_t)r->stacks.len;
        if (VEC_PUSH(r->stacks, e) < 0)
            return nomem(r);
    } else {
        Pair p = {{0}, {0}};
        if (which == T_STRING) {
            if (read_value(r, ti, &p.a, 0) < 0)
                return -1;
        } else {
            Cap cap = {r->types.data[ti].slots, -1, &p.a, -1};
            if (read_struct(r, ti, &cap, 0) < 0)
                return -1;
        }
        index = (int64_t)r->pairs.len;
        if (VEC_PUSH(r->pairs, p) < 0)
            return nomem(r);
    }
    int found;
    int64_t *slot = map_slot(&r->pool[which], key, &found);
    if (!slot)
        return nomem(r);
    *slot = index; /* a later value of the same key replaces it */
    return 0;
}

static int
constant_pools(R *r, uint64_t first)
{
    Map seen = {0};
    int rc = -1;
    uint64_t pos = first, total = 0;
    for (;;) {
        int found;
        int64_t *s = map_slot(&seen, pos, &found);
        if (!s) {
            nomem(r);
            goto done;
        }
        if (found) {
            fail(r, "constant pools chain back to offset %llu", (unsigned long long)pos);
            goto done;
        }
        if (pos < HEADER_SIZE || pos >= r->n) {
            fail(r, "constant pool offset %lld is outside the chunk", (long long)pos);
            goto done;
        }
        size_t here = (size_t)pos;
        uint64_t size = 0, kind = 0, x = 0, delta = 0, pools = 0;
        r->pos = here;
        if (rd_int(r, &size) < 0)
            goto done;
        if (size == 0 || size > r->n - here) {
            fail(r, "constant pool event at %zu of %llu bytes does not fit its chunk", here,
                 (unsigned long long)size);
            goto done;
        }
        total += size;
        if (total > r->n - HEADER_SIZE) {
            fail(r, "constant pool event at %zu overlaps another pool event", here);
            goto done;
        }
        size_t end = here + size;
        if (rd_long(r, &kind) < 0)
            goto done;
        if (kind != 1) {
            fail(r, "constant pool offset %zu points at an event of type %llu", here,
                 (unsigned long long)kind);
            goto done;
        }
        if (rd_long(r, &x) < 0 || rd_long(r, &x) < 0 || rd_long(r, &delta) < 0)
            goto done;
        r->pos += 1; /* flush flag */
        if (rd_int(r, &pools) < 0)
            goto done;
        for (uint64_t p = 0; p < pools; p++) {
            uint64_t type_id, count;
            int32_t ti;
            if (rd_long(r, &type_id) < 0 || type_of(r, type_id, &ti) < 0 || check(r, ti, 0) < 0)
                goto done;
            uint64_t per = 1 + r->types.data[ti].size;
            int which = -1; /* a pool profiles look values up in, -1 if none */
            for (int k = 0; k < N_NAMED; k++)
                if (r->named[k] == ti && k != T_FRAME)
                    which = k;
            if (rd_int(r, &count) < 0)
                goto done;
            if (r->pos > end || count > (end - r->pos) / per) {
                fail(r, "constant pool of %llu values runs past its event at %zu",
                     (unsigned long long)count, here);
                goto done;
            }
            if (charge(r, count) < 0)
                goto done;
            for (uint64_t i = 0; i < count; i++) {
                uint64_t key;
                if (rd_long(r, &key) < 0 || pool_value(r, ti, which, key) < 0)
                    goto done;
            }
            if (r->pos > end) {
                fail(r, "constant pool event at %zu overruns its size %llu", here,
                     (unsigned long long)size);
                goto done;
            }
        }
        if (delta == 0)
            break;
        pos = (uint64_t)here + delta; /* wraps below HEADER_SIZE when negative */
        if ((int64_t)delta < 0 && (uint64_t)(-(int64_t)delta) > here)
            pos = 0;
    }
    rc = 0;
done:
    map_free(&seen);
    return rc;
}

/* ---- text ------------------------------------------------------------------------------ */

/* Well-formed UTF-8 as CPython's strict decoder takes it (no surrogates, no overlongs). */
static int
utf8_valid(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF)
            k = 1;
        else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0)
                lo = 0xA0;
            if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0)
                lo = 0x90;
            if (c == 0xF4)
                hi = 0x8F;
        } else
            return 0;
        if (n - i <= k)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t j = 2; j <= k; j++)
            if (s[i + j] < 0x80 || s[i + j] > 0xBF)
                return 0;
        i += k + 1;
    }
    return 1;
}

static int
scratch_put(R *r, const void *p, size_t n)
{
    if (grow((void **)&r->scratch.data, &r->scratch.cap, r->scratch.len + n, 1) < 0)
        return nomem(r);
    memcpy(r->scratch.data + r->scratch.len, p, n);
    r->scratch.len += n;
    return 0;
}

static int
scratch_cp(R *r, uint32_t c)
{
    uint8_t b[4];
    size_t n;
    if (c < 0x80) {
        b[0] = (uint8_t)c;
        n = 1;
    } else if (c < 0x800) {
        b[0] = (uint8_t)(0xC0 | (c >> 6));
        b[1] = (uint8_t)(0x80 | (c & 0x3F));
        n = 2;
    } else {
        b[0] = (uint8_t)(0xE0 | (c >> 12));
        b[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (c & 0x3F));
        n = 3;
    }
    return scratch_put(r, b, n);
}

/* Python's answer put in scratch: ``str`` as UTF-8 (the reference decodes to such a str). */
static int
scratch_py(R *r, PyObject *s)
{
    if (!s) {
        r->py_error = 1;
        return fail(r, "Python failed decoding a string");
    }
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    int rc = u ? scratch_put(r, u, (size_t)n) : -1;
    if (!u) {
        PyErr_Clear();
        fail(r, "a string that does not encode as UTF-8");
    }
    Py_DECREF(s);
    return rc;
}

/* A V_STR as UTF-8 text, appended to scratch (what codec.string's str would be). */
static int
decode(R *r, const Val *v)
{
    if (v->enc == 1 || v->u == 0)
        return 0;
    const uint8_t *p = r->b + v->pos;
    if (v->enc == 3) {
        if (utf8_valid(p, v->u))
            return scratch_put(r, p, v->u);
        PyEval_RestoreThread(r->ts);
        int rc =
            scratch_py(r, PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)v->u, "replace"));
        r->ts = PyEval_SaveThread();
        return rc;
    }
    if (v->enc == 5) {
        for (uint64_t i = 0; i < v->u; i++)
            if (scratch_cp(r, p[i]) < 0)
                return -1;
        return 0;
    }
    /* UTF-16 units, one integer each; above 0xFFFF one is U+FFFD. */
    size_t save = r->pos, start = r->scratch.len;
    int surrogates = 0;
    r->pos = v->pos;
    for (uint64_t i = 0; i < v->u; i++) {
        uint64_t c;
        if (rd_short(r, &c) < 0)
            return -1;
        if (c > 0xFFFF)
            c = 0xFFFD;
        if (c >= 0xD800 && c <= 0xDFFF)
            surrogates = 1;
        if (scratch_cp(r, (uint32_t)c) < 0)
            return -1;
    }
    if (!surrogates) {
        r->pos = save;
        return 0;
    }
    /* Pairs and lone surrogates: as Python's UTF-16 decoder with errors="replace" does. */
    r->scratch.len = start;
    uint8_t *be = malloc(v->u * 2);
    if (!be)
        return nomem(r);
    r->pos = v->pos;
    for (uint64_t i = 0; i < v->u; i++) {
        uint64_t c;
        rd_short(r, &c);
        if (c > 0xFFFF)
            c = 0xFFFD;
        be[2 * i] = (uint8_t)(c >> 8);
        be[2 * i + 1] = (uint8_t)c;
    }
    r->pos = save;
    int order = 1;
    PyEval_RestoreThread(r->ts);
    int rc = scratch_py(
        r, PyUnicode_DecodeUTF16((const char *)be, (Py_ssize_t)(v->u * 2), "replace", &order));
    r->ts = PyEval_SaveThread();
    free(be);
    return rc;
}

/* Chunk.text: a string value's text (resolving string-pool references) into scratch;
   1 if it is a str, 0 if not. */
static int
text(R *r, const Val *v)
{
    Val s = *v;
    if (s.kind == V_REF) {
        int64_t i;
        if (!map_get(&r->pool[T_STRING], s.u, &i))
            return 0;
        s = r->pairs.data[i].a;
    }
    if (s.kind != V_STR)
        return 0;
    return decode(r, &s) < 0 ? -1 : 1;
}

static int
text_is(R *r, const Val *v, const char *want)
{
    r->scratch.len = 0;
    int t = text(r, v);
    if (t <= 0)
        return t;
    size_t n = strlen(want);
    return r->scratch.len == n && memcmp(r->scratch.data, want, n) == 0;
}

static int
contains(const uint8_t *s, size_t n, const char *what)
{
    size_t k = strlen(what);
    const uint8_t *p = s, *end = s + n;
    while ((size_t)(end - p) >= k && (p = memchr(p, what[0], (size_t)(end - p) - k + 1))) {
        if (memcmp(p, what, k) == 0)
            return 1;
        p++;
    }
    return 0;
}

static int
all_in(const uint8_t *s, size_t n, const char *set)
{
    if (!n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!strchr(set, s[i]) || !s[i])
            return 0;
    return 1;
}

/* What merge_generated_names' lambda rule leaves of a suffix after ``$$Lambda``:
   ``\$?\d*[./](0x)?[\da-f]+`` or ``\d+``, the whole of it (ASCII, no newline). */
static int
lambda_suffix(const uint8_t *s, size_t n)
{
    if (all_in(s, n, "0123456789"))
        return 1;
    size_t i = 0;
    if (i < n && s[i] == '$')
        i++;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++;
    if (i >= n || (s[i] != '.' && s[i] != '/'))
        return 0;
    i++;
    if (all_in(s + i, n - i, "0123456789abcdef"))
        return 1;
    return n - i > 2 && s[i] == '0' && s[i + 1] == 'x' &&
           all_in(s + i + 2, n - i - 2, "0123456789abcdef");
}

/* merge_generated_names without Python where that is exact: 0 unchanged, 1 merged (n set
   to the length kept, "_" to be added), -1 when Python must do it.  Each of its rules
   needs a literal: without any, nothing changes; a lambda name in plain ASCII is merged
   here (the rule's longest prefix ending in ``$$Lambda`` whose suffix fits). */
static int
merge_here(const uint8_t *s, size_t *n)
{
    static const char accessor[] = "jdk/internal/reflect/GeneratedMethodAccessor";
    if (*n > 4096)
        return 0;
    /* Most names hold no '$' and no "lib": two quick scans rule every rule out. */
    int dollar = memchr(s, '$', *n) != NULL;
    int lambda = dollar && contains(s, *n, "$$Lambda");
    int other = (dollar && contains(s, *n, "$$EnhancerBySpringCGLIB$$")) ||
                contains(s, *n, "libzstd-jni-") || contains(s, *n, "libasyncProfiler-") ||
                contains(s, *n, "amazonCorrettoCryptoProvider") ||
                (*n >= sizeof(accessor) - 1 && memcmp(s, accessor, sizeof(accessor) - 1) == 0);
    if (!lambda && !other)
        return 0;
    if (other)
        return -1;
    for (size_t i = 0; i < *n; i++)
        if (s[i] >= 0x80 || s[i] == '\n')
            return -1;
    for (size_t at = *n - 8 + 1; at-- > 1;) { /* the prefix holds at least one character */
        if (memcmp(s + at, "$$Lambda", 8) == 0 && lambda_suffix(s + at + 8, *n - at - 8)) {
            *n = at + 8;
            return 1;
        }
    }
    return 0;
}

/* Chunk.symbol: a symbol's text, generated class names merged; kept in the arena. */
static int
symbol(R *r, const Val *ref, Span *out)
{
    out->off = out->len = 0;
    if (!is_int(ref))
        return 0;
    int64_t cached;
    if (map_get(&r->symbol_cache, ref->u, &cached)) {
        *out = r->symbol_text.data[cached];
        return 0;
    }
    r->scratch.len = 0;
    int64_t i;
    if (map_get(&r->pool[T_SYMBOL], ref->u, &i) && text(r, &r->pairs.data[i].a) < 0)
        return -1;
    const uint8_t *s = r->scratch.data;
    size_t n = r->scratch.len;
    int here = merge_here(s, &n);
    if (here == 1 && scratch_put(r, "_", 1) == 0) {
        /* the "_" just added goes right after the kept prefix */
        memmove(r->scratch.data + n, r->scratch.data + r->scratch.len - 1, 1);
        n += 1;
        s = r->scratch.data;
    } else if (here == 1) {
        return -1;
    }
    if (here < 0) {
        PyEval_RestoreThread(r->ts);
        PyObject *str = PyUnicode_DecodeUTF8((const char *)s, (Py_ssize_t)n, "strict");
        PyObject *merged = str ? PyObject_CallOneArg(r->merge, str) : NULL;
        Py_XDECREF(str);
        int rc;
        if (!merged) {
            r->py_error = 1;
            rc = fail(r, "merge_generated_names failed");
        } else if (!PyUnicode_Check(merged)) {
            Py_DECREF(merged);
            rc = fail(r, "merge_generated_names did not return text");
        } else {
            r->scratch.len = 0; /* after the str was made of it */
            rc = scratch_py(r, merged);
        }
        r->ts = PyEval_SaveThread();
        if (rc < 0)
            return -1;
        s = r->scratch.data;
        n = r->scratch.len;
    }
    Span sp = {r->arena.len, n};
    if (grow((void **)&r->arena.data, &r->arena.cap, r->arena.len + n, 1) < 0)
        return nomem(r);
    if (n)
        memcpy(r->arena.data + r->arena.len, s, n);
    r->arena.len += n;
    int found;
    int64_t *slot = map_slot(&r->symbol_cache, ref->u, &found);
    if (!slot || VEC_PUSH(r->symbol_text, sp) < 0)
        return nomem(r);
    *slot = (int64_t)r->symbol_text.len - 1;
    *out = sp;
    return 0;
}

/* The index of a frame name (interned), from bytes in scratch. */
static int64_t
intern_name(R *r, const uint8_t *s, size_t n)
{
    uint64_t h = fmix64(fnv_bytes(FNV_OFFSET, s, n));
    if (index_grow(&r->name_index) < 0)
        return nomem(r);
    Index *x = &r->name_index;
    size_t j = h & (x->cap - 1);
    while (x->idx[j] >= 0) {
        if (x->hash[j] == h) {
            Span sp = r->names.data[x->idx[j]];
            if (sp.len == n && memcmp(r->arena.data + sp.off, s, n) == 0)
                return x->idx[j];
        }
        j = (j + 1) & (x->cap - 1);
    }
    Span sp = {r->arena.len, n};
    if (grow((void **)&r->arena.data, &r->arena.cap, r->arena.len + n, 1) < 0)
        return nomem(r);
    if (n)
        memcpy(r->arena.data + r->arena.len, s, n);
    r->arena.len += n;
    if (VEC_PUSH(r->names, sp) < 0)
        return nomem(r);
    x->idx[j] = (int64_t)r->names.len - 1;
    x->hash[j] = h;
    x->n++;
    return x->idx[j];
}

/* Chunk.frame_name: ``class.method`` of a method reference; -1 when unknown (-2: error). */
static int64_t
frame_name(R *r, uint64_t ref)
{
    int64_t cached;
    if (map_get(&r->method_cache, ref, &cached))
        return cached;
    int64_t out = -1, mi, ci;
    if (map_get(&r->pool[T_METHOD], ref, &mi)) {
        Pair m = r->pairs.data[mi];
        if (is_int(&m.a) && map_get(&r->pool[T_CLASS], m.a.u, &ci)) {
            Val cls_name = r->pairs.data[ci].a;
            Span a, b;
            if (symbol(r, &cls_name, &a) < 0 || symbol(r, &m.b, &b) < 0)
                return -2;
            /* Built apart from the arena, which intern_name may move as it copies it in. */
            size_t n = a.len + b.len + 1;
            if (grow((void **)&r->name_buf.data, &r->name_buf.cap, n, 1) < 0)
                return nomem(r) - 1;
            memcpy(r->name_buf.data, r->arena.data + a.off, a.len);
            r->name_buf.data[a.len] = '.';
            memcpy(r->name_buf.data + a.len + 1, r->arena.data + b.off, b.len);
            out = intern_name(r, r->name_buf.data, n);
            if (out < 0)
                return -2;
        }
    }
    int found;
    int64_t *slot = map_slot(&r->method_cache, ref, &found);
    if (!slot)
        return nomem(r) - 1;
    *slot = out;
    return out;
}

static int64_t
frame_index(R *r, int64_t name, int64_t line)
{
    uint64_t h = mix2((uint64_t)name, (uint64_t)line);
    if (index_grow(&r->frame_index) < 0)
        return nomem(r);
    Index *x = &r->frame_index;
    size_t j = h & (x->cap - 1);
    while (x->idx[j] >= 0) {
        int64_t f = x->idx[j];
        if (x->hash[j] == h && r->frame_name.data[f] == name && r->frame_line.data[f] == line)
            return f;
        j = (j + 1) & (x->cap - 1);
    }
    if (VEC_PUSH(r->frame_name, name) < 0 || VEC_PUSH(r->frame_line, line) < 0)
        return nomem(r);
    x->idx[j] = (int64_t)r->frame_name.len - 1;
    x->hash[j] = h;
    x->n++;
    return x->idx[j];
}

/* Chunk.stack: the global index of a stack trace's frames (leaf first), -1 when there is
   no such stack trace, -2 on error. */
static int64_t
resolve_stack(R *r, const Val *ref)
{
    if (!is_int(ref))
        return -1;
    int64_t cached, ei;
    if (map_get(&r->stack_cache, ref->u, &cached))
        return cached;
    int64_t out = -1;
    if (map_get(&r->pool[T_STACK], ref->u, &ei)) {
        StackEntry e = r->stacks.data[ei];
        r->resolve_tmp.len = 0;
        for (size_t i = 0; i < e.n; i++) {
            CapFrame cf = r->frames.data[e.off + i];
            if (!is_int(&cf.method))
                continue;
            int64_t name = frame_name(r, cf.method.u);
            if (name == -2)
                return -2;
            if (name < 0)
                continue;
            /* JFR's line number is an int: -1 (no line) arrives as 2^32 - 1, or from other
             * writers as the int64's bits; pprof's "unknown" is 0. */
            int64_t line =
                cf.line.kind == V_INT && cf.line.u <= INT32_MAX ? (int64_t)cf.line.u : 0;
            int64_t f = frame_index(r, name, line);
            if (f < 0 || VEC_PUSH(r->resolve_tmp, f) < 0)
                return -2;
        }
        const int64_t *fr = r->resolve_tmp.data;
        size_t n = r->resolve_tmp.len;
        uint64_t h = GOLDEN ^ n;
        for (size_t i = 0; i < n; i++)
            h = mix2(h, (uint64_t)fr[i]);
        if (index_grow(&r->stack_index) < 0)
            return nomem(r) - 1;
        Index *x = &r->stack_index;
        size_t j = h & (x->cap - 1);
        while (x->idx[j] >= 0) {
            Span sp = r->stack_span.data[x->idx[j]];
            if (x->hash[j] == h && sp.len == n &&
                (n == 0 || memcmp(r->stack_frames.data + sp.off, fr, n * sizeof(int64_t)) == 0))
                break;
            j = (j + 1) & (x->cap - 1);
        }
        if (x->idx[j] >= 0) {
            out = x->idx[j];
        } else {
            Span sp = {r->stack_frames.len, n};
            if (grow((void **)&r->stack_frames.data, &r->stack_frames.cap,
                     r->stack_frames.len + n, sizeof(int64_t)) < 0 ||
                VEC_PUSH(r->stack_span, sp) < 0)
                return nomem(r) - 1;
            /* resolve_tmp is apart from stack_frames: no aliasing */
            if (n)
                memcpy(r->stack_frames.data + r->stack_frames.len, r->resolve_tmp.data,
                       n * sizeof(int64_t));
            r->stack_frames.len += n;
            out = (int64_t)r->stack_span.len - 1;
            x->idx[j] = out;
            x->hash[j] = h;
            x->n++;
        }
    }
    int found;
    int64_t *slot = map_slot(&r->stack_cache, ref->u, &found);
    if (!slot)
        return nomem(r) - 1;
    *slot = out;
    return out;
}

/* ---- profiles -------------------------------------------------------------------------- */

static int
add(R *r, int kind, int64_t stack, uint64_t ctx, uint64_t span, uint64_t sname, int64_t v0,
    int64_t v1)
{
    KindRows *k = &r->kinds[kind];
    if (!k->order)
        k->order = ++r->n_kinds;
    uint64_t h = mix2(mix2(mix2((uint64_t)stack, ctx), span), sname);
    if (index_grow(&k->index) < 0)
        return nomem(r);
    size_t j = h & (k->index.cap - 1);
    while (k->index.idx[j] >= 0) {
        Row *row = &k->rows.data[k->index.idx[j]];
        if (k->index.hash[j] == h && row->stack == stack && row->ctx == ctx &&
            row->span == span && row->sname == sname) {
            int64_t add[2] = {v0, v1};
            for (int i = 0; i < KIND_VALUES[kind]; i++) {
                row->v[i] += add[i];
                if ((uint64_t)row->v[i] > MAX_SAMPLE_VALUE)
                    row->v[i] = (int64_t)MAX_SAMPLE_VALUE;
            }
            return 0;
        }
        j = (j + 1) & (k->index.cap - 1);
    }
    Row row = {stack, ctx, span, sname, {v0, v1}};
    if (VEC_PUSH(k->rows, row) < 0)
        return nomem(r);
    k->index.idx[j] = (int64_t)k->rows.len - 1;
    k->index.hash[j] = h;
    k->index.n++;
    return 0;
}

static uint64_t
num(const Val *v) /* jfr_profiles._int */
{
    if (!is_int(v))
        return 0;
    return v->u < MAX_SAMPLE_VALUE ? v->u : MAX_SAMPLE_VALUE;
}

static uint64_t
id_of(const Val *v) /* jfr_profiles._id */
{
    return is_int(v) ? v->u : 0;
}

/* Chunk.thread_state compared with ``want``: 1 equal, 0 not (or no state), -1 error; -2 when
   there is no state at all (None). */
static int
state_is(R *r, const Val *ref, const char *want)
{
    int64_t i;
    if (!is_int(ref) || !map_get(&r->pool[T_STATE], ref->u, &i))
        return -2;
    r->scratch.len = 0;
    int t = text(r, &r->pairs.data[i].a);
    if (t < 0)
        return -1;
    size_t n = strlen(want);
    return t == 1 && r->scratch.len == n && memcmp(r->scratch.data, want, n) == 0;
}

static int
event_is_wall(R *r)
{
    return r->has_event && r->event_len == 4 &&
           memcmp(r->arena.data + r->event_off, "wall", 4) == 0;
}

static int
on_event(R *r, int e, const Val *v)
{
    if (e == E_SETTING) {
        int is = text_is(r, &v[S_NAME], "event");
        if (is < 0)
            return -1;
        if (!is)
            return 0;
        r->scratch.len = 0;
        int t = text(r, &v[S_VALUE]);
        if (t < 0)
            return -1;
        size_t n = t == 1 ? r->scratch.len : 0;
        if (grow((void **)&r->arena.data, &r->arena.cap, r->arena.len + n, 1) < 0)
            return nomem(r);
        if (n)
            memcpy(r->arena.data + r->arena.len, r->scratch.data, n);
        r->event_off = r->arena.len;
        r->event_len = n;
        r->arena.len += n;
        r->has_event = 1;
        return 0;
    }
    int64_t stack = resolve_stack(r, &v[S_STACK]);
    if (stack == -2)
        return -1;
    if (stack < 0)
        return 0; /* no such stack trace: Pyroscope drops the sample too */
    uint64_t ctx = id_of(&v[S_CTX]), span = id_of(&v[S_SPAN]), sname = id_of(&v[S_SNAME]);
    int64_t period = (int64_t)r->period;
    switch (e) {
    case E_EXEC: {
        int sleeping = state_is(r, &v[S_STATE], "STATE_SLEEPING");
        if (sleeping == -1)
            return -1;
        if (sleeping == 0 && add(r, KIND_CPU, stack, ctx, span, sname, period, 0) < 0)
            return -1;
        if (event_is_wall(r) && add(r, KIND_WALL, stack, ctx, span, sname, period, 0) < 0)
            return -1;
        return 0;
    }
    case E_WALL: {
        uint64_t samples = is_int(&v[S_NUM]) ? v[S_NUM].u : 1;
        uint64_t value;
        if (samples && r->period > MAX_SAMPLE_VALUE / samples)
            value = MAX_SAMPLE_VALUE;
        else
            value = samples * r->period;
        if (value > MAX_SAMPLE_VALUE)
            value = MAX_SAMPLE_VALUE;
        if (event_is_wall(r)) {
            int running = state_is(r, &v[S_STATE], "STATE_RUNNABLE");
            if (running == -1)
                return -1;
            if (running == 1 &&
                add(r, KIND_CPU, stack, ctx, span, sname, (int64_t)value, 0) < 0)
                return -1;
        }
        return add(r, KIND_WALL, stack, ctx, span, sname, (int64_t)value, 0);
    }
    case E_TLAB:
        return add(r, KIND_IN_TLAB, stack, ctx, span, sname, 1, (int64_t)num(&v[S_NUM]));
    case E_OUTSIDE:
        return add(r, KIND_OUTSIDE_TLAB, stack, ctx, span, sname, 1, (int64_t)num(&v[S_NUM]));
    case E_MONITOR:
        return add(r, KIND_LOCK, stack, ctx, span, sname, 1, (int64_t)num(&v[S_NUM]));
    /* Pyroscope keeps no context for these. */
    case E_PARK: return add(r, KIND_PARK, stack, 0, 0, 0, 1, (int64_t)num(&v[S_NUM]));
    case E_LIVE: return add(r, KIND_LIVE, stack, 0, 0, 0, 1, 0);
    case E_ALLOC_SAMPLE:
        return add(r, KIND_ALLOC_SAMPLE, stack, 0, 0, 0, 1, (int64_t)num(&v[S_NUM]));
    case E_MALLOC: return add(r, KIND_MALLOC, stack, 0, 0, 0, 1, (int64_t)num(&v[S_NUM]));
    default: return 0;
    }
}

/* ---- chunks ---------------------------------------------------------------------------- */

static uint64_t
be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return v;
}

static void
chunk_reset(R *r)
{
    for (size_t i = 0; i < r->types.len; i++) {
        free(r->types.data[i].fields.data);
        free(r->types.data[i].slots);
        free(r->types.data[i].fslots);
    }
    r->types.len = 0;
    r->mstr.len = 0;
    map_free(&r->type_of);
    for (int k = 0; k < N_NAMED; k++)
        map_free(&r->pool[k]);
    map_free(&r->stack_cache);
    map_free(&r->method_cache);
    map_free(&r->symbol_cache);
    r->stacks.len = r->frames.len = r->pairs.len = r->symbol_text.len = 0;
}

typedef struct {
    int32_t type;
    int8_t *slots;
    int last;
} EventReader;

static int
read_chunk(R *r, size_t offset, size_t size, uint64_t cp, uint64_t meta)
{
    r->b = r->data + offset;
    r->n = size;
    r->chunk_offset = offset;
    EventReader ev[N_EVENTS];
    memset(ev, 0, sizeof(ev));
    int rc = -1;
    /* The arena holds the metadata's converted strings while it is read: the chunk's own
       texts go after the profile's (kept across chunks) */
    size_t keep = r->arena.len;
    Bytes saved = r->arena;
    r->arena = (Bytes){0};
    int meta_rc = metadata(r, (size_t)meta);
    Bytes meta_arena = r->arena;
    r->arena = saved;
    r->arena.len = keep;
    if (meta_rc < 0) {
        free(meta_arena.data);
        return -1;
    }
    for (int k = 0; k < N_NAMED; k++)
        r->named[k] = type_named(r, NAMED[k]);
    r->st_frames = field_index(r, r->named[T_STACK], "frames");
    r->sf_method = field_index(r, r->named[T_FRAME], "method");
    r->sf_line = field_index(r, r->named[T_FRAME], "lineNumber");
    for (int k = 0; k < N_NAMED; k++)
        if (pool_slots(r, k) < 0)
            goto done;
    if (constant_pools(r, cp) < 0)
        goto done;
    for (int e = 0; e < N_EVENTS; e++) {
        ev[e].type = type_named(r, EVENT_NAMES[e]);
        if (ev[e].type < 0)
            continue;
        if (check(r, ev[e].type, 0) < 0)
            goto done;
        Type *t = &r->types.data[ev[e].type];
        size_t nf = t->fields.len;
        ev[e].slots = malloc(nf ? nf : 1);
        if (!ev[e].slots) {
            nomem(r);
            goto done;
        }
        ev[e].last = -1;
        for (size_t i = 0; i < nf; i++) {
            ev[e].slots[i] = -1;
            for (int w = 0; w < 7 && WANTED[e][w].name; w++)
                if (mstr_is(r, t->fields.data[i].name, WANTED[e][w].name)) {
                    ev[e].slots[i] = (int8_t)WANTED[e][w].slot;
                    ev[e].last = (int)i;
                }
        }
    }
    r->pos = HEADER_SIZE;
    while (r->pos < r->n) {
        size_t start = r->pos;
        uint64_t esize, kind;
        if (rd_int(r, &esize) < 0)
            goto done;
        if (esize == 0 || esize > r->n - start) {
            fail(r, "event at offset %zu of %llu bytes does not fit its chunk", offset + start,
                 (unsigned long long)esize);
            goto done;
        }
        if (rd_long(r, &kind) < 0)
            goto done;
        for (int e = 0; e < N_EVENTS; e++) {
            if (ev[e].type < 0 || r->types.data[ev[e].type].id != kind)
                continue;
            Val vals[N_SLOTS];
            memset(vals, 0, sizeof(vals));
            Cap cap = {ev[e].slots, ev[e].last + 1, vals, -1};
            if (read_struct(r, ev[e].type, &cap, 0) < 0)
                goto done;
            if (r->pos > start + esize) {
                fail(r, "event at offset %zu overruns its size %llu", offset + start,
                     (unsigned long long)esize);
                goto done;
            }
            if (charge(r, 1) < 0 || on_event(r, e, vals) < 0)
                goto done;
            break;
        }
        r->pos = start + (size_t)esize;
    }
    rc = 0;
done:
    for (int e = 0; e < N_EVENTS; e++)
        free(ev[e].slots);
    free(meta_arena.data);
    chunk_reset(r);
    return rc;
}

static int
read_recording(R *r)
{
    const uint8_t *d = r->data;
    size_t n = r->size;
    if (n < 4 || memcmp(d, "FLR\0", 4) != 0)
        return fail(r, "not a JFR recording: no 'FLR' magic at the start");
    if (n < HEADER_SIZE)
        return fail(r, "a truncated JFR recording: %zu bytes, shorter than a chunk's header",
                    n);
    size_t offset = 0;
    while (offset < n) {
        size_t rest = n - offset;
        if (rest < HEADER_SIZE)
            return fail(r, "chunk at offset %zu: %zu bytes left, a chunk header needs %d",
                        offset, rest, HEADER_SIZE);
        const uint8_t *h = d + offset;
        if (memcmp(h, "FLR\0", 4) != 0)
            return fail(r, "chunk at offset %zu: no 'FLR' magic", offset);
        unsigned major = ((unsigned)h[4] << 8) | h[5];
        if (major != 2)
            return fail(r, "chunk at offset %zu: JFR version %u is not supported (2.x is)",
                        offset, major);
        int64_t size = (int64_t)be64(h + 8), cp = (int64_t)be64(h + 16),
                meta = (int64_t)be64(h + 24);
        uint32_t features =
            ((uint32_t)h[64] << 24) | ((uint32_t)h[65] << 16) | ((uint32_t)h[66] << 8) | h[67];
        if (size < HEADER_SIZE || (uint64_t)size > rest)
            return fail(r,
                        "chunk at offset %zu claims %lld bytes but %zu are left (truncated "
                        "recording?)",
                        offset, (long long)size, rest);
        if (cp < HEADER_SIZE || cp >= size)
            return fail(r,
                        "chunk at offset %zu: constant pool offset %lld is outside the chunk",
                        offset, (long long)cp);
        if (meta < HEADER_SIZE || meta >= size)
            return fail(r, "chunk at offset %zu: metadata offset %lld is outside the chunk",
                        offset, (long long)meta);
        r->compressed = features & 1;
        if (read_chunk(r, offset, (size_t)size, (uint64_t)cp, (uint64_t)meta) < 0)
            return -1;
        offset += (size_t)size;
    }
    return 0;
}

/* ---- Python interface ------------------------------------------------------------------ */

static void
r_free(R *r)
{
    chunk_reset(r);
    free(r->types.data);
    free(r->mstr.data);
    free(r->stacks.data);
    free(r->frames.data);
    free(r->pairs.data);
    free(r->symbol_text.data);
    free(r->scratch.data);
    free(r->name_buf.data);
    free(r->arena.data);
    free(r->names.data);
    index_free(&r->name_index);
    free(r->frame_name.data);
    free(r->frame_line.data);
    index_free(&r->frame_index);
    free(r->stack_frames.data);
    free(r->stack_span.data);
    index_free(&r->stack_index);
    free(r->resolve_tmp.data);
    for (int k = 0; k < N_KINDS; k++) {
        free(r->kinds[k].rows.data);
        index_free(&r->kinds[k].index);
    }
}

static PyObject *
i64_bytes(const int64_t *p, size_t n)
{
    return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)(n * sizeof(int64_t)));
}

static PyObject *
build(R *r, Py_ssize_t max_depth)
{
    size_t nf = r->frame_name.len, ns = r->stack_span.len, nn = r->names.len;
    int64_t *name_off = malloc((nn + 1) * sizeof(int64_t));
    int64_t *frame_id = malloc((nf ? nf : 1) * sizeof(int64_t));
    int64_t *stack_off = malloc((ns + 1) * sizeof(int64_t));
    int64_t *stack_id = malloc((ns ? ns : 1) * sizeof(int64_t));
    int64_t *root = malloc((size_t)(max_depth > 0 ? max_depth : 1) * sizeof(int64_t));
    PyObject *out = NULL, *kinds = NULL, *names = NULL;
    if (!name_off || !frame_id || !stack_off || !stack_id || !root) {
        PyErr_NoMemory();
        goto done;
    }
    /* Names packed one after another (UTF-8), offsets beside. */
    size_t total = 0;
    for (size_t i = 0; i < nn; i++)
        total += r->names.data[i].len;
    names = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (!names)
        goto done;
    char *w = PyBytes_AS_STRING(names);
    size_t at = 0;
    for (size_t i = 0; i < nn; i++) {
        Span sp = r->names.data[i];
        name_off[i] = (int64_t)at;
        memcpy(w + at, r->arena.data + sp.off, sp.len);
        at += sp.len;
    }
    name_off[nn] = (int64_t)at;
    for (size_t i = 0; i < nf; i++) {
        Span sp = r->names.data[r->frame_name.data[i]];
        frame_id[i] = hash_frame_raw(r->arena.data + sp.off, sp.len, (const uint8_t *)"", 0,
                                     r->frame_line.data[i]);
    }
    for (size_t s = 0; s < ns; s++) {
        Span sp = r->stack_span.data[s];
        stack_off[s] = (int64_t)sp.off;
        size_t depth = sp.len < (size_t)max_depth ? sp.len : (size_t)max_depth;
        for (size_t i = 0; i < depth; i++) /* root first: the leaf-first list reversed */
            root[i] = frame_id[r->stack_frames.data[sp.off + sp.len - 1 - i]];
        stack_id[s] = hash_stack_raw(root, depth);
    }
    stack_off[ns] = (int64_t)r->stack_frames.len;
    kinds = PyList_New(0);
    if (!kinds)
        goto done;
    for (int order = 1; order <= r->n_kinds; order++) {
        for (int k = 0; k < N_KINDS; k++) {
            if (r->kinds[k].order != order)
                continue;
            KindRows *kr = &r->kinds[k];
            size_t n = kr->rows.len, nv = (size_t)KIND_VALUES[k];
            PyObject *cols[5] = {NULL};
            for (int c = 0; c < 5; c++)
                cols[c] = PyBytes_FromStringAndSize(
                    NULL, (Py_ssize_t)(n * sizeof(int64_t) * (c == 4 ? nv : 1)));
            int ok = 1;
            for (int c = 0; c < 5; c++)
                ok = ok && cols[c];
            if (ok) {
                int64_t *st = (int64_t *)PyBytes_AS_STRING(cols[0]);
                uint64_t *cx = (uint64_t *)PyBytes_AS_STRING(cols[1]);
                uint64_t *sp = (uint64_t *)PyBytes_AS_STRING(cols[2]);
                uint64_t *sn = (uint64_t *)PyBytes_AS_STRING(cols[3]);
                int64_t *vv = (int64_t *)PyBytes_AS_STRING(cols[4]);
                for (size_t i = 0; i < n; i++) {
                    Row *row = &kr->rows.data[i];
                    st[i] = row->stack;
                    cx[i] = row->ctx;
                    sp[i] = row->span;
                    sn[i] = row->sname;
                    for (size_t j = 0; j < nv; j++)
                        vv[i * nv + j] = row->v[j];
                }
            }
            PyObject *item =
                ok ? Py_BuildValue("(iNNNNN)", k, cols[0], cols[1], cols[2], cols[3], cols[4])
                   : NULL;
            if (!ok)
                for (int c = 0; c < 5; c++)
                    Py_XDECREF(cols[c]);
            if (!item || PyList_Append(kinds, item) < 0) {
                Py_XDECREF(item);
                goto done;
            }
            Py_DECREF(item);
        }
    }
    PyObject *event = r->has_event
                          ? PyUnicode_DecodeUTF8((const char *)r->arena.data + r->event_off,
                                                 (Py_ssize_t)r->event_len, "strict")
                          : PyUnicode_FromString("");
    if (!event)
        goto done;
    out = Py_BuildValue("(NONNNNNNNO)", event, names, i64_bytes(name_off, nn + 1),
                        i64_bytes(r->frame_name.data, nf), i64_bytes(r->frame_line.data, nf),
                        i64_bytes(frame_id, nf), i64_bytes(stack_off, ns + 1),
                        i64_bytes(r->stack_frames.data, r->stack_frames.len),
                        i64_bytes(stack_id, ns), kinds);
done:
    Py_XDECREF(names);
    Py_XDECREF(kinds);
    free(name_off);
    free(frame_id);
    free(stack_off);
    free(stack_id);
    free(root);
    return out;
}

PyDoc_STRVAR(decode_doc,
             "decode(data, period, max_values, max_depth, merge) -> tuple\n\n"
             "A recording's profile samples, summed per kind as jfr_profiles.parse sums them\n"
             "(see hotspan/formats/jfr_profiles.py for the tuple's layout).  ValueError names\n"
             "what is wrong with a recording it refuses.");

static PyObject *
jfr_decode(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer buf;
    unsigned long long period, max_values;
    Py_ssize_t max_depth;
    PyObject *merge;
    if (!PyArg_ParseTuple(args, "y*KKnO:decode", &buf, &period, &max_values, &max_depth,
                          &merge))
        return NULL;
    R *r = calloc(1, sizeof(R));
    if (!r) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    r->data = buf.buf;
    r->size = (size_t)buf.len;
    r->period = period;
    r->max_values = max_values;
    r->budget = max_values > (unsigned long long)INT64_MAX ? INT64_MAX : (int64_t)max_values;
    r->merge = merge;
    r->ts = PyEval_SaveThread();
    int rc = read_recording(r);
    PyEval_RestoreThread(r->ts);
    PyObject *out = NULL;
    if (rc < 0) {
        if (!r->py_error || !PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, r->err[0] ? r->err : "corrupt recording");
        }
    } else {
        out = build(r, max_depth < 0 ? 0 : max_depth);
    }
    r_free(r);
    free(r);
    PyBuffer_Release(&buf);
    return out;
}

static PyMethodDef methods[] = {
    {"decode", jfr_decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_jfr",
    "JFR recordings to profile samples (see jfr.c).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__jfr(void)
{
    return PyModule_Create(&module);
}
