/*
 * hotspan._speedups._otlp: an OTLP ExportTraceServiceRequest's protobuf bytes straight to the
 * span batch the store takes (the twin of hotspan/formats/otlp_traces.py's to_span_batch).
 *
 * Why C: reading spans through protobuf message objects costs a Python object per field read
 * (tens of microseconds a span).  Here the wire bytes are walked once: each span's and each
 * resource's and scope's message is sliced out of the request as received, attributes are
 * written as text and flattened, and tags are deduplicated before any Python object exists.
 *
 * Two phases: the walk runs without the GIL (plain malloc, every length and varint checked
 * against the end of its message, nesting depth and sizes bounded); then, with the GIL, the
 * rows, groups and tags are built.  Whatever the walk does not model exactly as protobuf's
 * parser and the Python path would read it (wire types that do not match the schema, a
 * singular message given twice, deep nesting, more items than a request may hold, malformed
 * bytes) makes the call return None, and the caller runs the Python path on the same bytes:
 * that path stays the reference, and its errors are the server's answer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hashing.h"

/* Bounds of the walk: past them the Python path decides (it refuses the request or reads it). */
#define MAX_DEPTH 24            /* AnyValue nesting (arrays, kvlists) */
#define MAX_KVLIST 64           /* entries of one kvlist (deduplicated by a linear scan) */
#define MAX_BODY (1u << 30)     /* bytes of a request */
#define MAX_ARENA (256u << 20)  /* bytes of text written */
#define MAX_ATTRS (4u << 20)    /* attributes held at once; tags of a request */
#define MAX_VALUE_TEXT (1u << 20) /* an array's or kvlist's text (otlp.MAX_VALUE_TEXT) */
#define MAX_PROBE 64            /* tag table probes before the hash is deemed attacked */

enum { T_STRING, T_INT, T_FLOAT, T_BOOL, T_KEYWORD, N_TYPES };
enum { S_SPAN, S_RESOURCE, S_INTRINSIC, S_EVENT, S_LINK, S_INSTRUMENTATION, N_SCOPES };
enum { REJ_NONE, REJ_TRACE_ID, REJ_SPAN_ID, REJ_PARENT, REJ_START, REJ_END, REJ_ORDER };

/* Text: bytes of the request, or of the arena when ARENA_BIT is set in off. */
#define ARENA_BIT 0x80000000u
typedef struct {
    uint32_t off, len;
} ref;

typedef struct {
    ref key, value;
    uint8_t type;
} attr;

typedef struct {
    ref raw, schema, service, attrs;
    uint32_t attr0, nattr;
    uint64_t latest;
} resource;

typedef struct {
    uint32_t res;
    ref raw, schema;
} scope;

typedef struct {
    uint32_t scope;
    ref raw, name, attrs;
    const uint8_t *trace_id;
    uint64_t span_id, parent, start, end;
    int32_t kind, status;
    uint8_t reject;
} span;

typedef struct {
    uint64_t hash;
    ref key, value;
    uint8_t scope, type;
    uint64_t seen;
} tag;

typedef struct {
    void *p;
    size_t n, cap, size;
} vec;

typedef struct {
    const uint8_t *body;
    size_t body_len;
    char *arena;
    size_t alen, acap;
    vec resources, scopes, spans, attrs, tags;
    uint32_t *table; /* tag index + 1, 0 empty */
    size_t table_cap;
    uint64_t seed;
    size_t max_resources, max_scopes, max_items, max_tag_len;
    uint64_t min_time, max_time;
    size_t array_bytes; /* what array attributes wrote so far (otlp.ArrayBudget) */
    int bail;
} ctx;

/* Literal texts at the start of the arena. */
static const char LITERALS[] = "truefalsenamestatuskind"
                               "unsetokerror"
                               "unspecifiedinternalserverclientproducerconsumer"
                               "unknown_service"
                               "statusMessageevent:name"
                               "instrumentation:nameinstrumentation:version";
static const ref L_TRUE = {ARENA_BIT | 0, 4}, L_FALSE = {ARENA_BIT | 4, 5};
static const ref L_NAME = {ARENA_BIT | 9, 4}, L_STATUS = {ARENA_BIT | 13, 6};
static const ref L_KIND = {ARENA_BIT | 19, 4};
static const ref L_STATUS_CODES[3] = {
    {ARENA_BIT | 23, 5}, {ARENA_BIT | 28, 2}, {ARENA_BIT | 30, 5}};
static const ref L_KINDS[6] = {{ARENA_BIT | 35, 11}, {ARENA_BIT | 46, 8}, {ARENA_BIT | 54, 6},
                               {ARENA_BIT | 60, 6},  {ARENA_BIT | 66, 8}, {ARENA_BIT | 74, 8}};
static const ref L_UNKNOWN_SERVICE = {ARENA_BIT | 82, 15};
static const ref L_STATUS_MESSAGE = {ARENA_BIT | 97, 13}, L_EVENT_NAME = {ARENA_BIT | 110, 10};
static const ref L_SCOPE_NAME = {ARENA_BIT | 120, 20}, L_SCOPE_VERSION = {ARENA_BIT | 140, 23};

/* ---- small containers -------------------------------------------------------------------- */

static void *
vec_push(ctx *c, vec *v)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        void *p = realloc(v->p, cap * v->size);
        if (p == NULL) {
            c->bail = 1;
            return NULL;
        }
        v->p = p;
        v->cap = cap;
    }
    return (char *)v->p + v->size * v->n++;
}

/* Room for n more bytes of arena; 0 when past the cap or out of memory. */
static int
reserve(ctx *c, size_t n)
{
    if (c->alen + n <= c->acap)
        return 1;
    if (c->alen + n > MAX_ARENA) {
        c->bail = 1;
        return 0;
    }
    size_t cap = c->acap * 2;
    while (cap < c->alen + n)
        cap *= 2;
    char *p = realloc(c->arena, cap);
    if (p == NULL) {
        c->bail = 1;
        return 0;
    }
    c->arena = p;
    c->acap = cap;
    return 1;
}

static inline const uint8_t *
text(const ctx *c, ref r)
{
    return r.off & ARENA_BIT ? (const uint8_t *)c->arena + (r.off & ~ARENA_BIT)
                             : c->body + r.off;
}

static inline ref
arena_ref(const ctx *c, size_t start)
{
    ref r = {ARENA_BIT | (uint32_t)start, (uint32_t)(c->alen - start)};
    return r;
}

static inline ref
body_ref(const ctx *c, const uint8_t *p, size_t n)
{
    ref r = {(uint32_t)(p - c->body), (uint32_t)n};
    return r;
}

/* ---- wire format ------------------------------------------------------------------------- */

static int
varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (p >= end)
            return 0;
        uint8_t b = *p++;
        if (shift == 63 && b > 1)
            return 0;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* One field: its number and wire type, and its value (a varint or fixed number in *num, a
 * length-delimited one as [*data, *data + *len)).  0 at malformed bytes or a group. */
static int
field(const uint8_t **pp, const uint8_t *end, uint32_t *number, int *wt, uint64_t *num,
      const uint8_t **data, size_t *len)
{
    uint64_t key;
    const uint8_t *start = *pp;
    /* A key is a 32-bit varint, in at most 5 bytes: protobuf's own reader refuses a longer
     * one, even one that pads a small number with zero bits. */
    if (!varint(pp, end, &key) || *pp - start > 5 || key >> 32 || (key >> 3) == 0)
        return 0;
    *number = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0: return varint(pp, end, num);
    case 1:
    case 5: {
        int size = *wt == 1 ? 8 : 4; /* little-endian on the wire, whatever the host */
        if (end - *pp < size)
            return 0;
        *num = 0;
        for (int i = size - 1; i >= 0; i--)
            *num = *num << 8 | (*pp)[i];
        *pp += size;
        return 1;
    }
    case 2: {
        uint64_t n;
        if (!varint(pp, end, &n) || n > (uint64_t)(end - *pp))
            return 0;
        *data = *pp;
        *len = (size_t)n;
        *pp += n;
        return 1;
    }
    default: return 0;
    }
}

static int
utf8_ok(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint32_t cp;
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
            cp = b & 0x1F;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            cp = b & 0x0F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            cp = b & 0x07;
        } else {
            return 0;
        }
        if (n - i <= need)
            return 0;
        for (size_t k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((need == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (need == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += need + 1;
    }
    return 1;
}

/* ---- validation of messages whose content is only kept as bytes ------------------------- */

enum { K_NONE, K_VARINT, K_FIXED64, K_FIXED32, K_STRING, K_BYTES, K_MSG };
enum { M_KV, M_ANY, M_ARRAY, M_KVLIST, M_SCOPE, M_EVENT, M_LINK, M_STATUS, M_ENTITY, N_MSG };

typedef struct {
    uint8_t kind, msg;
} fdesc;

#define MAX_FIELD 17
static const fdesc SCHEMA[N_MSG][MAX_FIELD] = {
    [M_KV] = {[1] = {K_STRING, 0}, [2] = {K_MSG, M_ANY}, [3] = {K_VARINT, 0}},
    [M_ANY] = {[1] = {K_STRING, 0},
               [2] = {K_VARINT, 0},
               [3] = {K_VARINT, 0},
               [4] = {K_FIXED64, 0},
               [5] = {K_MSG, M_ARRAY},
               [6] = {K_MSG, M_KVLIST},
               [7] = {K_BYTES, 0},
               [8] = {K_VARINT, 0}},
    [M_ARRAY] = {[1] = {K_MSG, M_ANY}},
    [M_KVLIST] = {[1] = {K_MSG, M_KV}},
    [M_SCOPE] = {[1] = {K_STRING, 0},
                 [2] = {K_STRING, 0},
                 [3] = {K_MSG, M_KV},
                 [4] = {K_VARINT, 0}},
    [M_EVENT] = {[1] = {K_FIXED64, 0},
                 [2] = {K_STRING, 0},
                 [3] = {K_MSG, M_KV},
                 [4] = {K_VARINT, 0}},
    [M_LINK] = {[1] = {K_BYTES, 0},
                [2] = {K_BYTES, 0},
                [3] = {K_STRING, 0},
                [4] = {K_MSG, M_KV},
                [5] = {K_VARINT, 0},
                [6] = {K_FIXED32, 0}},
    [M_STATUS] = {[2] = {K_STRING, 0}, [3] = {K_VARINT, 0}},
    [M_ENTITY] = {[1] = {K_STRING, 0},
                  [2] = {K_STRING, 0},
                  [3] = {K_STRING, 0},
                  [4] = {K_STRING, 0}},
};

static const int WIRE_OF[] = {[K_VARINT] = 0, [K_FIXED64] = 1, [K_FIXED32] = 5,
                              [K_STRING] = 2, [K_BYTES] = 2,   [K_MSG] = 2};

/* Whether a field as found matches the schema's kind (a string's bytes are UTF-8, a
 * message's bytes a valid message).  A mismatch bails: protobuf would keep it as unknown. */
static int validate(ctx *c, int msg, const uint8_t *p, const uint8_t *end, int depth);

static int
check_field(ctx *c, int msg, uint32_t number, int wt, const uint8_t *data, size_t len,
            int depth)
{
    if (number >= MAX_FIELD || SCHEMA[msg][number].kind == K_NONE)
        return 1; /* unknown: kept as bytes */
    fdesc d = SCHEMA[msg][number];
    if (WIRE_OF[d.kind] != wt)
        return 0;
    if (d.kind == K_STRING)
        return utf8_ok(data, len);
    if (d.kind == K_MSG)
        return validate(c, d.msg, data, data + len, depth + 1);
    return 1;
}

static int
validate(ctx *c, int msg, const uint8_t *p, const uint8_t *end, int depth)
{
    if (depth > MAX_DEPTH)
        return 0;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *data = NULL;
        size_t len = 0;
        if (!field(&p, end, &number, &wt, &num, &data, &len) ||
            !check_field(c, msg, number, wt, data, len, depth))
            return 0;
    }
    return 1;
}

/* ---- attribute values as text (otlp.any_value_text) ------------------------------------- */

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int
put_base64(ctx *c, const uint8_t *s, size_t n)
{
    if (!reserve(c, (n + 2) / 3 * 4))
        return 0;
    char *o = c->arena + c->alen;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *o++ = B64[v >> 18];
        *o++ = B64[(v >> 12) & 63];
        *o++ = B64[(v >> 6) & 63];
        *o++ = B64[v & 63];
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        *o++ = B64[v >> 18];
        *o++ = B64[(v >> 12) & 63];
        *o++ = '=';
        *o++ = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8;
        *o++ = B64[v >> 18];
        *o++ = B64[(v >> 12) & 63];
        *o++ = B64[(v >> 6) & 63];
        *o++ = '=';
    }
    c->alen = (size_t)(o - c->arena);
    return 1;
}

static int
put(ctx *c, const char *s, size_t n)
{
    if (!reserve(c, n))
        return 0;
    memcpy(c->arena + c->alen, s, n);
    c->alen += n;
    return 1;
}

/* buf ("[-]D[.DDD]e[+-]X", size bytes) one more in its last digit; 0 if it does not fit. */
static int
next_up(char *buf, size_t size)
{
    char *e = strchr(buf, 'e');
    if (e == NULL || e == buf)
        return 0;
    int exp10 = atoi(e + 1);
    for (char *q = e - 1;; q--) {
        if (*q == '.')
            continue;
        if (*q != '9') {
            (*q)++;
            break;
        }
        *q = '0';
        if (q == buf || q[-1] == '-') { /* 9.99e5 + 0.01e5 = 1.00e6 */
            *q = '1';
            exp10++;
            break;
        }
    }
    size_t room = size - (size_t)(e - buf);
    int n = snprintf(e, room, "e%+03d", exp10);
    return n > 0 && (size_t)n < room;
}

/* A double as Python writes it: str(int(d)) when integral, repr(d) otherwise.  The shortest
 * digits that read back as d are those of the first precision whose correctly rounded
 * (glibc) form does: Python's repr gives the same digits (the tests compare both). */
static int
put_double(ctx *c, double d)
{
    char buf[400];
    int n;
    if (isnan(d))
        return put(c, "nan", 3);
    if (isinf(d))
        return d > 0 ? put(c, "inf", 3) : put(c, "-inf", 4);
    if (d == 0)
        return put(c, "0", 1);
    if (d == floor(d)) {
        n = snprintf(buf, sizeof buf, "%.0f", d);
        return n > 0 && (size_t)n < sizeof buf && put(c, buf, (size_t)n);
    }
    char digits[32];
    int nd = 0, exp10 = 0, neg = d < 0, e2;
    /* An exact power of two has a gap below it half the gap above: there the shortest digits
     * that read back may be the correctly rounded ones plus one in the last place. */
    int pow2 = frexp(fabs(d), &e2) == 0.5;
    for (int prec = 0; prec < 17; prec++) {
        n = snprintf(buf, sizeof buf, "%.*e", prec, d);
        if (n <= 0 || (size_t)n >= sizeof buf)
            return 0;
        if (strtod(buf, NULL) == d || prec == 16)
            break;
        if (pow2 && next_up(buf, sizeof buf) && strtod(buf, NULL) == d)
            break;
    }
    /* buf is [-]D[.DDD]e[+-]XX */
    const char *q = buf + neg;
    for (; *q && *q != 'e'; q++)
        if (*q != '.')
            digits[nd++] = *q;
    if (*q != 'e')
        return 0;
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int decpt = exp10 + 1;
    char out[64];
    int o = 0;
    if (neg)
        out[o++] = '-';
    if (decpt <= -4 || decpt > 16) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp10 < 0 ? '-' : '+',
                      exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        out[o++] = '0';
        out[o++] = '.';
        for (int i = 0; i < -decpt; i++)
            out[o++] = '0';
        memcpy(out + o, digits, (size_t)nd);
        o += nd;
    } else {
        for (int i = 0; i < decpt; i++)
            out[o++] = i < nd ? digits[i] : '0';
        out[o++] = '.';
        if (nd > decpt) {
            memcpy(out + o, digits + decpt, (size_t)(nd - decpt));
            o += nd - decpt;
        } else {
            out[o++] = '0';
        }
    }
    return put(c, out, (size_t)o);
}

/* A JSON string as json.dumps writes it (ensure_ascii): reserve() 6 * n + 2 first. */
static void
put_json_string(ctx *c, const uint8_t *s, size_t n)
{
    static const char HEX[] = "0123456789abcdef";
    char *o = c->arena + c->alen;
    *o++ = '"';
    size_t i = 0;
    while (i < n) {
        uint32_t cp = s[i];
        if (cp < 0x80) {
            i++;
            if (cp >= 0x20 && cp <= 0x7E && cp != '"' && cp != '\\') {
                *o++ = (char)cp;
                continue;
            }
            *o++ = '\\';
            switch (cp) {
            case '"': *o++ = '"'; continue;
            case '\\': *o++ = '\\'; continue;
            case '\n': *o++ = 'n'; continue;
            case '\r': *o++ = 'r'; continue;
            case '\t': *o++ = 't'; continue;
            case '\b': *o++ = 'b'; continue;
            case '\f': *o++ = 'f'; continue;
            }
        } else {
            size_t need = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : 1;
            cp &= need == 3 ? 0x07 : need == 2 ? 0x0F : 0x1F;
            for (size_t k = 1; k <= need; k++)
                cp = (cp << 6) | (s[i + k] & 0x3F);
            i += need + 1;
            if (cp >= 0x10000) {
                uint32_t v = cp - 0x10000, hi = 0xD800 | (v >> 10);
                *o++ = '\\';
                *o++ = 'u';
                for (int k = 12; k >= 0; k -= 4)
                    *o++ = HEX[(hi >> k) & 15];
                cp = 0xDC00 | (v & 0x3FF);
            }
            *o++ = '\\';
        }
        *o++ = 'u';
        for (int k = 12; k >= 0; k -= 4)
            *o++ = HEX[(cp >> k) & 15];
    }
    *o++ = '"';
    c->alen = (size_t)(o - c->arena);
}

/* Bytes of the request: an ArrayValue's, before its elements are read (``found``: there is
 * one, empty or not). */
typedef struct {
    const uint8_t *p;
    size_t n;
    int found;
} span_bytes;

static int any_text(ctx *c, const uint8_t *p, const uint8_t *end, int depth, ref *out,
                    uint8_t *type);
static int json_array(ctx *c, const uint8_t *p, const uint8_t *end, int depth, size_t *start);
static int json_object(ctx *c, const uint8_t *p, const uint8_t *end, int depth, size_t *start);

/* The field an AnyValue sets (its oneof; ``which`` 0 for none) and what it holds.  0: what
 * any_text refuses, the oneof given twice (protobuf merges) or a profiles index. */
static int
any_oneof(const uint8_t *p, const uint8_t *end, uint32_t *which, uint64_t *value,
          const uint8_t **data, size_t *len)
{
    *which = 0;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num = 0;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return 0;
        if (number >= 1 && number <= 8) {
            if (*which || number == 8 || wt != WIRE_OF[SCHEMA[M_ANY][number].kind])
                return 0;
            *which = number;
            *value = num;
            *data = d;
            *len = n;
        }
    }
    return 1;
}

/* Whether an AnyValue holds an ArrayValue (1, its bytes in ``*array``), something else (0), or
 * is one any_text refuses (-1). */
static int
array_of(const uint8_t *p, const uint8_t *end, span_bytes *array)
{
    uint32_t which;
    uint64_t value;
    const uint8_t *data = NULL;
    size_t len = 0;
    if (!any_oneof(p, end, &which, &value, &data, &len))
        return -1;
    if (which != 5)
        return 0;
    array->p = data;
    array->n = len;
    array->found = 1;
    return 1;
}

/* A KeyValue: its key and its value as text; with ``array`` given, a value that is an
 * ArrayValue is left in it (``value`` unset) for the caller to take element by element.
 * 0: bail. */
static int
keyvalue(ctx *c, const uint8_t *p, const uint8_t *end, int depth, ref *key, ref *value,
         uint8_t *type, span_bytes *array)
{
    const uint8_t *vp = NULL;
    size_t vlen = 0;
    int has_value = 0;
    *key = body_ref(c, p, 0);
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *data = NULL;
        size_t len = 0;
        if (!field(&p, end, &number, &wt, &num, &data, &len))
            return 0;
        if (number == 1) {
            if (wt != 2 || !utf8_ok(data, len))
                return 0;
            *key = body_ref(c, data, len);
        } else if (number == 2) {
            if (wt != 2 || has_value)
                return 0;
            has_value = 1;
            vp = data;
            vlen = len;
        } else if (number == 3) {
            return 0; /* key_strindex: profiles' dictionary, not the span path's */
        }
    }
    if (!has_value) {
        *value = body_ref(c, c->body, 0);
        *type = T_STRING;
        return 1;
    }
    if (array != NULL) {
        int found = array_of(vp, vp + vlen, array);
        if (found != 0)
            return found > 0;
    }
    return any_text(c, vp, vp + vlen, depth + 1, value, type);
}

static int
any_text(ctx *c, const uint8_t *p, const uint8_t *end, int depth, ref *out, uint8_t *type)
{
    uint32_t which = 0;
    uint64_t value = 0;
    const uint8_t *data = NULL;
    size_t len = 0;
    if (depth > MAX_DEPTH || !any_oneof(p, end, &which, &value, &data, &len))
        return 0;
    *type = T_STRING;
    size_t start = c->alen;
    switch (which) {
    case 0: *out = body_ref(c, c->body, 0); return 1;
    case 1:
        if (!utf8_ok(data, len))
            return 0;
        *out = body_ref(c, data, len);
        return 1;
    case 2:
        *type = T_BOOL;
        *out = value ? L_TRUE : L_FALSE;
        return 1;
    case 3: {
        char buf[24];
        int n = snprintf(buf, sizeof buf, "%lld", (long long)(int64_t)value);
        *type = T_INT;
        if (!put(c, buf, (size_t)n))
            return 0;
        break;
    }
    case 4: {
        double dv;
        memcpy(&dv, &value, 8);
        *type = T_FLOAT;
        if (!put_double(c, dv))
            return 0;
        break;
    }
    case 7:
        if (!put_base64(c, data, len))
            return 0;
        break;
    case 5:
        if (!json_array(c, data, data + len, depth, &start))
            return 0;
        break;
    case 6:
        if (!json_object(c, data, data + len, depth, &start))
            return 0;
        break;
    default: return 0;
    }
    *out = arena_ref(c, start);
    return 1;
}

typedef struct {
    ref *p;
    size_t n, cap;
} refs;

static int
refs_push(refs *v, ref r)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 8;
        ref *p = realloc(v->p, cap * sizeof(ref));
        if (p == NULL)
            return 0;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = r;
    return 1;
}

/* json.dumps([text of each value]) of an ArrayValue. */
static int
json_array(ctx *c, const uint8_t *p, const uint8_t *end, int depth, size_t *start)
{
    refs elems = {NULL, 0, 0};
    size_t need = 2;
    int ok = 0;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            goto done;
        if (number != 1)
            continue;
        ref r;
        uint8_t t;
        if (wt != 2 || !any_text(c, d, d + n, depth + 1, &r, &t) || !refs_push(&elems, r))
            goto done;
        need += 6 * (size_t)r.len + 4;
    }
    if (!reserve(c, need))
        goto done;
    *start = c->alen; /* the elements' own texts are before it */
    c->arena[c->alen++] = '[';
    for (size_t k = 0; k < elems.n; k++) {
        if (k) {
            c->arena[c->alen++] = ',';
            c->arena[c->alen++] = ' ';
        }
        put_json_string(c, text(c, elems.p[k]), elems.p[k].len);
    }
    c->arena[c->alen++] = ']';
    ok = c->alen - *start <= MAX_VALUE_TEXT; /* past it, Python refuses the request */
done:
    free(elems.p);
    return ok;
}

static inline int
same_text(const ctx *c, ref a, ref b)
{
    return a.len == b.len && memcmp(text(c, a), text(c, b), a.len) == 0;
}

/* json.dumps({key: text of value}) of a KeyValueList: a key given twice keeps its first
 * place and its last value, as a dict does. */
static int
json_object(ctx *c, const uint8_t *p, const uint8_t *end, int depth, size_t *start)
{
    refs kv = {NULL, 0, 0};
    size_t need = 2;
    int ok = 0;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            goto done;
        if (number != 1)
            continue;
        ref k, v;
        uint8_t t;
        if (wt != 2 || kv.n >= 2 * MAX_KVLIST ||
            !keyvalue(c, d, d + n, depth + 1, &k, &v, &t, NULL) || !refs_push(&kv, k) ||
            !refs_push(&kv, v))
            goto done;
        need += 6 * ((size_t)k.len + v.len) + 8;
    }
    if (!reserve(c, need))
        goto done;
    *start = c->alen;
    c->arena[c->alen++] = '{';
    int written = 0;
    for (size_t i = 0; i < kv.n; i += 2) {
        int earlier = 0;
        for (size_t j = 0; j < i && !earlier; j += 2)
            earlier = same_text(c, kv.p[i], kv.p[j]);
        if (earlier)
            continue;
        size_t last = i;
        for (size_t j = i + 2; j < kv.n; j += 2)
            if (same_text(c, kv.p[i], kv.p[j]))
                last = j;
        if (written++) {
            c->arena[c->alen++] = ',';
            c->arena[c->alen++] = ' ';
        }
        put_json_string(c, text(c, kv.p[i]), kv.p[i].len);
        c->arena[c->alen++] = ':';
        c->arena[c->alen++] = ' ';
        put_json_string(c, text(c, kv.p[last + 1]), kv.p[last + 1].len);
    }
    c->arena[c->alen++] = '}';
    ok = c->alen - *start <= MAX_VALUE_TEXT;
done:
    free(kv.p);
    return ok;
}

/* ---- flattening (model.trace.flatten_attributes) and tags -------------------------------- */

#define RS 0x1e
#define US 0x1f
#define STRING_US 0x1c

/* Whether s reads as a number or a boolean (model.trace.reads_typed). */
static int
reads_typed(const uint8_t *s, size_t n)
{
    if ((n == 4 && memcmp(s, "true", 4) == 0) || (n == 5 && memcmp(s, "false", 5) == 0))
        return 1;
    size_t i = 0, digits = 0;
    if (i < n && (s[i] == '+' || s[i] == '-'))
        i++;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, digits++;
    }
    if (!digits)
        return 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t exp_digits = 0;
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++, exp_digits++;
        if (!exp_digits)
            return 0;
    }
    return i == n;
}

static inline void
put_clean(ctx *c, const uint8_t *s, size_t n)
{
    char *o = c->arena + c->alen;
    for (size_t i = 0; i < n; i++) {
        uint8_t b = s[i];
        o[i] = (char)(b == RS || b == US || b == STRING_US ? ' ' : b);
    }
    c->alen += n;
}

/* The flattened text of attrs [a0, a0 + n). */
static int
flatten(ctx *c, size_t a0, size_t n, ref *out)
{
    size_t need = 1;
    const attr *as = (const attr *)c->attrs.p + a0;
    for (size_t i = 0; i < n; i++)
        need += (size_t)as[i].key.len + as[i].value.len + 2;
    if (!reserve(c, need))
        return 0;
    as = (const attr *)c->attrs.p + a0;
    size_t start = c->alen;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *v = text(c, as[i].value);
        size_t vl = as[i].value.len;
        c->arena[c->alen++] = RS;
        put_clean(c, text(c, as[i].key), as[i].key.len);
        int typed = as[i].type == T_STRING && vl && strchr("0123456789+-.tf", v[0]) != NULL &&
                    reads_typed(v, vl);
        c->arena[c->alen++] = typed ? STRING_US : US;
        put_clean(c, v, vl);
    }
    if (n)
        c->arena[c->alen++] = RS;
    *out = arena_ref(c, start);
    return 1;
}

static uint64_t
hash_text(uint64_t h, const uint8_t *s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = fmix64(h ^ w) * 0x9E3779B97F4A7C15ULL;
    }
    uint64_t w = 0;
    memcpy(&w, s + i, n - i);
    return fmix64(h ^ w ^ ((uint64_t)n << 56));
}

/* Python's len() of UTF-8 text: its bytes that do not continue a character. */
static size_t
chars(const uint8_t *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += (s[i] & 0xC0) != 0x80;
    return k;
}

static int
grow_table(ctx *c)
{
    size_t cap = c->table_cap ? c->table_cap * 2 : 1024;
    uint32_t *t = calloc(cap, sizeof(uint32_t));
    if (t == NULL)
        return 0;
    const tag *tags = c->tags.p;
    for (size_t i = 0; i < c->tags.n; i++) {
        size_t at = tags[i].hash & (cap - 1);
        while (t[at])
            at = (at + 1) & (cap - 1);
        t[at] = (uint32_t)i + 1;
    }
    free(c->table);
    c->table = t;
    c->table_cap = cap;
    return 1;
}

/* SpanBatch.add_tags for one attribute. */
static int
add_tag(ctx *c, int scope_id, ref key, ref value, int type, uint64_t seen)
{
    const uint8_t *v = text(c, value);
    if (value.len > c->max_tag_len && chars(v, value.len) > c->max_tag_len)
        return 1;
    const uint8_t *k = text(c, key);
    uint64_t h = hash_text(
        hash_text(c->seed ^ (uint64_t)(scope_id * N_TYPES + type), k, key.len), v, value.len);
    if ((c->tags.n + 1) * 2 > c->table_cap && !grow_table(c))
        return 0;
    size_t at = h & (c->table_cap - 1);
    for (int probes = 0; c->table[at]; probes++) {
        tag *t = (tag *)c->tags.p + (c->table[at] - 1);
        if (t->hash == h && t->scope == scope_id && t->type == type &&
            same_text(c, t->key, key) && same_text(c, t->value, value)) {
            if (t->seen < seen)
                t->seen = seen;
            return 1;
        }
        if (probes > MAX_PROBE)
            return 0;
        at = (at + 1) & (c->table_cap - 1);
    }
    tag *t = c->tags.n < MAX_ATTRS ? vec_push(c, &c->tags) : NULL;
    if (t == NULL)
        return 0;
    t->hash = h;
    t->key = key;
    t->value = value;
    t->scope = (uint8_t)scope_id;
    t->type = (uint8_t)type;
    t->seen = seen;
    c->table[at] = (uint32_t)c->tags.n;
    return 1;
}

/* ---- the request ------------------------------------------------------------------------- */

static int
push_one(ctx *c, const attr *a)
{
    attr *slot = c->attrs.n < MAX_ATTRS ? vec_push(c, &c->attrs) : NULL;
    if (slot == NULL)
        return 0;
    *slot = *a;
    return 1;
}

/* An attribute; an array's elements each as an attribute of its key (otlp.add_array_pairs). */
static int
push_attr(ctx *c, const uint8_t *d, size_t n)
{
    attr a;
    span_bytes array = {NULL, 0, 0};
    if (c->attrs.n >= MAX_ATTRS || !keyvalue(c, d, d + n, 0, &a.key, &a.value, &a.type, &array))
        return 0;
    if (!array.found)
        return push_one(c, &a);
    const uint8_t *p = array.p, *end = array.p + array.n;
    size_t size = 0; /* bytes, where Python counts characters: past the bound Python decides */
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *e = NULL;
        size_t len = 0;
        if (!field(&p, end, &number, &wt, &num, &e, &len))
            return 0;
        if (number != 1)
            continue;
        /* At the depth json_array reads its elements at. */
        if (wt != 2 || !any_text(c, e, e + len, 2, &a.value, &a.type))
            return 0;
        size_t record = (size_t)a.key.len + a.value.len + 2;
        size += record;
        c->array_bytes += record;
        if (size > MAX_VALUE_TEXT || c->array_bytes > MAX_VALUE_TEXT + 2 * c->body_len ||
            !push_one(c, &a))
            return 0;
    }
    return 1;
}

static int
parse_status(ctx *c, const uint8_t *p, const uint8_t *end, int32_t *code, ref *message)
{
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return 0;
        if (number == 2) {
            if (wt != 2 || !utf8_ok(d, n))
                return 0;
            *message = body_ref(c, d, n);
        }
        if (number == 3) {
            if (wt != 0)
                return 0;
            *code = (int32_t)(uint32_t)num;
        }
    }
    return 1;
}

/* Whether a KeyValue's value is a string, a boolean, an int or a double (1), something else
 * or none (0), or one any_text refuses (-1). */
static int
scalar_kv(const uint8_t *p, const uint8_t *end)
{
    const uint8_t *vp = NULL;
    size_t vlen = 0;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return -1;
        if (number == 2) {
            if (wt != 2 || vp != NULL)
                return -1;
            vp = d;
            vlen = n;
        }
    }
    uint32_t which = 0;
    uint64_t value;
    const uint8_t *data = NULL;
    size_t len = 0;
    if (vp == NULL)
        return 0;
    if (!any_oneof(vp, vp + vlen, &which, &value, &data, &len))
        return -1;
    return which >= 1 && which <= 4;
}

/* The tags of an event's, a link's or an instrumentation scope's attributes (those with a
 * scalar value: an array's or a map's text is never bounded here, and must not get the request
 * refused), and an event's or a scope's name (and a scope's version) as intrinsics when not
 * empty (the last of a field repeated, as protobuf reads it), for the tag APIs
 * (otlp_traces._scalar_pairs). */
static int
nested_tags(ctx *c, int msg, const uint8_t *p, const uint8_t *end, uint64_t seen)
{
    uint32_t attrs_field = msg == M_LINK ? 4 : 3;
    int scope_id = msg == M_EVENT ? S_EVENT : msg == M_LINK ? S_LINK : S_INSTRUMENTATION;
    ref name = {0, 0}, version = {0, 0};
    size_t a0 = c->attrs.n;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return 0;
        if (wt != 2)
            continue;
        if (number == attrs_field) {
            int scalar = scalar_kv(d, d + n);
            attr a;
            if (scalar < 0 ||
                (scalar && (!keyvalue(c, d, d + n, 0, &a.key, &a.value, &a.type, NULL) ||
                            !push_one(c, &a))))
                return 0;
        } else if (msg != M_LINK && number == (msg == M_EVENT ? 2u : 1u)) {
            name = body_ref(c, d, n);
        } else if (msg == M_SCOPE && number == 2) {
            version = body_ref(c, d, n);
        }
    }
    const attr *as = (const attr *)c->attrs.p + a0;
    for (size_t i = 0; i < c->attrs.n - a0; i++)
        if (!add_tag(c, scope_id, as[i].key, as[i].value, as[i].type, seen))
            return 0;
    c->attrs.n = a0;
    if (name.len && !add_tag(c, S_INTRINSIC, msg == M_EVENT ? L_EVENT_NAME : L_SCOPE_NAME, name,
                             T_STRING, seen))
        return 0;
    return !version.len || add_tag(c, S_INTRINSIC, L_SCOPE_VERSION, version, T_STRING, seen);
}

/* The tags of a span's status message, events, then links (after its own attributes): in
 * the order otlp_traces.to_span_batch adds them, which the batch's tags keep. */
static int
span_extra_tags(ctx *c, const uint8_t *start, const uint8_t *end, ref message, uint64_t seen)
{
    if (message.len && !add_tag(c, S_INTRINSIC, L_STATUS_MESSAGE, message, T_STRING, seen))
        return 0;
    for (uint32_t wanted = 11; wanted <= 13; wanted += 2) {
        for (const uint8_t *p = start; p < end;) {
            uint32_t number;
            int wt;
            uint64_t num;
            const uint8_t *d = NULL;
            size_t n = 0;
            if (!field(&p, end, &number, &wt, &num, &d, &n))
                return 0;
            if (number == wanted &&
                !nested_tags(c, number == 11 ? M_EVENT : M_LINK, d, d + n, seen))
                return 0;
        }
    }
    return 1;
}

static const uint8_t NO_ID[1] = {0};

static int
all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

static int
parse_span(ctx *c, const uint8_t *p, const uint8_t *end, uint32_t scope_index)
{
    const uint8_t *start = p;
    const uint8_t *tid = NO_ID, *sid = NO_ID, *pid = NO_ID;
    size_t tid_len = 0, sid_len = 0, pid_len = 0;
    span s;
    memset(&s, 0, sizeof s);
    s.scope = scope_index;
    s.name = body_ref(c, start, 0);
    size_t a0 = c->attrs.n;
    ref message = {0, 0};
    int nested = 0; /* events or links */
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num = 0;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return 0;
        switch (number) {
        case 1:
        case 2:
        case 4:
            if (wt != 2)
                return 0;
            if (number == 1)
                tid = d, tid_len = n;
            else if (number == 2)
                sid = d, sid_len = n;
            else
                pid = d, pid_len = n;
            break;
        case 3:
        case 5:
            if (wt != 2 || !utf8_ok(d, n))
                return 0;
            if (number == 5)
                s.name = body_ref(c, d, n);
            break;
        case 6:
            if (wt != 0)
                return 0;
            s.kind = (int32_t)(uint32_t)num;
            break;
        case 7:
        case 8:
            if (wt != 1)
                return 0;
            if (number == 7)
                s.start = num;
            else
                s.end = num;
            break;
        case 9:
            if (wt != 2 || !push_attr(c, d, n))
                return 0;
            break;
        case 10:
        case 12:
        case 14:
            if (wt != 0)
                return 0;
            break;
        case 11:
        case 13:
            if (wt != 2 || !validate(c, number == 11 ? M_EVENT : M_LINK, d, d + n, 0))
                return 0;
            nested = 1;
            break;
        case 15:
            if (wt != 2 || !parse_status(c, d, d + n, &s.status, &message))
                return 0;
            break;
        case 16:
            if (wt != 5)
                return 0;
            break;
        }
    }
    s.raw = body_ref(c, start, (size_t)(end - start));
    /* model: the checks of otlp_traces._row, in its order */
    if (tid_len != 16 || all_zero(tid, 16))
        s.reject = REJ_TRACE_ID;
    else if (sid_len != 8 || all_zero(sid, 8))
        s.reject = REJ_SPAN_ID;
    else if (pid_len != 0 && pid_len != 8)
        s.reject = REJ_PARENT;
    else if (s.start < c->min_time || s.start >= c->max_time)
        s.reject = REJ_START;
    else if (s.end < c->min_time || s.end >= c->max_time)
        s.reject = REJ_END;
    else if (s.end < s.start)
        s.reject = REJ_ORDER;
    if (tid_len == 16)
        s.trace_id = tid;
    for (size_t i = 0; sid_len == 8 && i < 8; i++)
        s.span_id = s.span_id << 8 | sid[i];
    for (size_t i = 0; pid_len == 8 && i < 8; i++)
        s.parent = s.parent << 8 | pid[i];
    if (s.kind < 0 || s.kind > 5)
        s.kind = 0;
    if (s.status < 0 || s.status > 2)
        s.status = 0;
    size_t na = c->attrs.n - a0;
    if (!s.reject) {
        if (!flatten(c, a0, na, &s.attrs))
            return 0;
        const attr *as = (const attr *)c->attrs.p + a0;
        for (size_t i = 0; i < na; i++)
            if (!add_tag(c, S_SPAN, as[i].key, as[i].value, as[i].type, s.end))
                return 0;
        if (!add_tag(c, S_INTRINSIC, L_NAME, s.name, T_STRING, s.end) ||
            !add_tag(c, S_INTRINSIC, L_STATUS, L_STATUS_CODES[s.status], T_KEYWORD, s.end) ||
            !add_tag(c, S_INTRINSIC, L_KIND, L_KINDS[s.kind], T_KEYWORD, s.end))
            return 0;
        c->attrs.n = a0;
        if ((nested || message.len) && !span_extra_tags(c, start, end, message, s.end))
            return 0;
        resource *r = (resource *)c->resources.p + ((scope *)c->scopes.p)[scope_index].res;
        if (s.end > r->latest)
            r->latest = s.end;
    }
    c->attrs.n = a0; /* a span's attributes live on in its flattened text and its tags */
    if (c->spans.n >= c->max_items)
        return 0;
    span *slot = vec_push(c, &c->spans);
    if (slot == NULL)
        return 0;
    *slot = s;
    return 1;
}

static int
parse_scope_spans(ctx *c, const uint8_t *p, const uint8_t *end, uint32_t res_index)
{
    scope sc;
    int has_scope = 0;
    sc.res = res_index;
    sc.raw = body_ref(c, p, 0);
    sc.schema = body_ref(c, p, 0);
    for (const uint8_t *q = p; q < end;) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&q, end, &number, &wt, &num, &d, &n))
            return 0;
        if (number == 1) {
            if (wt != 2 || has_scope || !validate(c, M_SCOPE, d, d + n, 0))
                return 0;
            has_scope = 1;
            sc.raw = body_ref(c, d, n);
        } else if (number == 2 && wt != 2) {
            return 0;
        } else if (number == 3) {
            if (wt != 2 || !utf8_ok(d, n))
                return 0;
            sc.schema = body_ref(c, d, n);
        }
    }
    if (c->scopes.n >= c->max_scopes)
        return 0;
    scope *slot = vec_push(c, &c->scopes);
    if (slot == NULL)
        return 0;
    *slot = sc;
    uint32_t index = (uint32_t)(c->scopes.n - 1);
    size_t first_span = c->spans.n;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return 0;
        if (number == 2 && !parse_span(c, d, d + n, index))
            return 0;
    }
    uint64_t latest = 0;
    const span *spans = (const span *)c->spans.p;
    for (size_t i = first_span; i < c->spans.n; i++)
        if (!spans[i].reject && spans[i].end > latest)
            latest = spans[i].end;
    if (!latest || !has_scope)
        return 1;
    const uint8_t *raw = text(c, sc.raw);
    return nested_tags(c, M_SCOPE, raw, raw + sc.raw.len, latest);
}

static int
parse_resource(ctx *c, const uint8_t *p, const uint8_t *end)
{
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return 0;
        if (number == 1 && (wt != 2 || !push_attr(c, d, n)))
            return 0;
        if (number == 2 && wt != 0)
            return 0;
        if (number == 3 && (wt != 2 || !validate(c, M_ENTITY, d, d + n, 0)))
            return 0;
    }
    return 1;
}

static int
parse_resource_spans(ctx *c, const uint8_t *p, const uint8_t *end)
{
    resource r;
    int has_resource = 0;
    memset(&r, 0, sizeof r);
    r.raw = body_ref(c, p, 0);
    r.schema = body_ref(c, p, 0);
    r.attr0 = (uint32_t)c->attrs.n;
    for (const uint8_t *q = p; q < end;) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&q, end, &number, &wt, &num, &d, &n))
            return 0;
        if (number == 1) {
            if (wt != 2 || has_resource || !parse_resource(c, d, d + n))
                return 0;
            has_resource = 1;
            r.raw = body_ref(c, d, n);
        } else if (number == 2 && wt != 2) {
            return 0;
        } else if (number == 3) {
            if (wt != 2 || !utf8_ok(d, n))
                return 0;
            r.schema = body_ref(c, d, n);
        }
    }
    r.nattr = (uint32_t)(c->attrs.n - r.attr0);
    const attr *as = (const attr *)c->attrs.p + r.attr0;
    r.service = L_UNKNOWN_SERVICE;
    for (uint32_t i = 0; i < r.nattr; i++) {
        if (as[i].key.len == 12 && memcmp(text(c, as[i].key), "service.name", 12) == 0) {
            if (as[i].value.len)
                r.service = as[i].value;
            break;
        }
    }
    if (!flatten(c, r.attr0, r.nattr, &r.attrs) || c->resources.n >= c->max_resources)
        return 0;
    resource *slot = vec_push(c, &c->resources);
    if (slot == NULL)
        return 0;
    *slot = r;
    size_t index = c->resources.n - 1;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return 0;
        if (number == 2 && !parse_scope_spans(c, d, d + n, (uint32_t)index))
            return 0;
    }
    resource *done = (resource *)c->resources.p + index;
    if (done->latest) {
        as = (const attr *)c->attrs.p + done->attr0;
        for (uint32_t i = 0; i < done->nattr; i++)
            if (!add_tag(c, S_RESOURCE, as[i].key, as[i].value, as[i].type, done->latest))
                return 0;
    }
    c->attrs.n = done->attr0;
    return 1;
}

static int
parse_request(ctx *c)
{
    const uint8_t *p = c->body, *end = c->body + c->body_len;
    while (p < end) {
        uint32_t number;
        int wt;
        uint64_t num;
        const uint8_t *d = NULL;
        size_t n = 0;
        if (!field(&p, end, &number, &wt, &num, &d, &n))
            return 0;
        if (number == 1 && (wt != 2 || !parse_resource_spans(c, d, d + n)))
            return 0;
    }
    return 1;
}

/* ---- Python objects ---------------------------------------------------------------------- */

static PyObject *SCOPE_NAMES[N_SCOPES], *TYPE_NAMES[N_TYPES], *STR_ADD_GROUP, *STR_ROWS,
    *STR_TAGS;

static PyObject *
py_text(const ctx *c, ref r)
{
    return PyUnicode_DecodeUTF8((const char *)text(c, r), r.len, NULL);
}

static PyObject *
py_bytes(const ctx *c, ref r)
{
    return PyBytes_FromStringAndSize((const char *)text(c, r), r.len);
}

static PyObject *
trace_hex(const uint8_t *id)
{
    static const char HEX[] = "0123456789abcdef";
    PyObject *s = PyUnicode_New(32, 127);
    if (s == NULL)
        return NULL;
    Py_UCS1 *o = PyUnicode_1BYTE_DATA(s);
    for (int i = 0; i < 16; i++) {
        o[2 * i] = (Py_UCS1)HEX[id[i] >> 4];
        o[2 * i + 1] = (Py_UCS1)HEX[id[i] & 15];
    }
    return s;
}

static PyObject *
reason(const ctx *c, const span *s)
{
    PyObject *name = py_text(c, s->name), *out = NULL;
    if (name == NULL)
        return NULL;
    const char *tail = " ns is not a time between the years 2000 and 2116";
    switch (s->reject) {
    case REJ_TRACE_ID:
        out = PyUnicode_FromFormat("span %R: trace id must be 16 bytes, not all zero", name);
        break;
    case REJ_SPAN_ID:
        out = PyUnicode_FromFormat("span %R: span id must be 8 bytes, not all zero", name);
        break;
    case REJ_PARENT:
        out = PyUnicode_FromFormat("span %R: parent span id must be 8 bytes or empty", name);
        break;
    case REJ_START:
        out = PyUnicode_FromFormat("span %R: start time %llu%s", name,
                                   (unsigned long long)s->start, tail);
        break;
    case REJ_END:
        out = PyUnicode_FromFormat("span %R: end time %llu%s", name, (unsigned long long)s->end,
                                   tail);
        break;
    default: out = PyUnicode_FromFormat("span %R ends before it starts", name);
    }
    Py_DECREF(name);
    return out;
}

/* The rows, groups and tags into batch; (rejected count, first reasons). */
static PyObject *
build(const ctx *c, PyObject *batch, PyObject *row_type, PyObject *group_type,
      Py_ssize_t max_reasons)
{
    PyObject *rows = NULL, *tags = NULL, *add_group = NULL, *reasons = NULL, *gids = NULL;
    PyObject *services = NULL, *result = NULL;
    Py_ssize_t rejected = 0;
    const resource *res = c->resources.p;
    const scope *scopes = c->scopes.p;
    const span *spans = c->spans.p;
    const tag *ts = c->tags.p;
    if ((rows = PyObject_GetAttr(batch, STR_ROWS)) == NULL ||
        (tags = PyObject_GetAttr(batch, STR_TAGS)) == NULL ||
        (add_group = PyObject_GetAttr(batch, STR_ADD_GROUP)) == NULL ||
        (reasons = PyList_New(0)) == NULL ||
        (gids = PyList_New((Py_ssize_t)c->scopes.n)) == NULL ||
        (services = PyList_New((Py_ssize_t)c->resources.n)) == NULL)
        goto done;
    if (!PyList_Check(rows) || !PyDict_Check(tags)) {
        PyErr_SetString(PyExc_TypeError, "batch.rows must be a list and batch.tags a dict");
        goto done;
    }
    for (size_t i = 0; i < c->resources.n; i++) {
        PyObject *service = py_text(c, res[i].service);
        if (service == NULL)
            goto done;
        PyList_SET_ITEM(services, (Py_ssize_t)i, service);
    }
    {
        PyObject *resource_bytes = NULL, *resource_schema = NULL, *resource_attrs = NULL;
        uint32_t current = UINT32_MAX;
        int failed = 0;
        for (size_t i = 0; i < c->scopes.n && !failed; i++) {
            const scope *sc = &scopes[i];
            if (sc->res != current) {
                Py_XDECREF(resource_bytes);
                Py_XDECREF(resource_schema);
                Py_XDECREF(resource_attrs);
                current = sc->res;
                resource_bytes = py_bytes(c, res[current].raw);
                resource_schema = py_text(c, res[current].schema);
                resource_attrs = py_text(c, res[current].attrs);
                if (!resource_bytes || !resource_schema || !resource_attrs) {
                    failed = 1;
                    break;
                }
            }
            PyObject *scope_bytes = py_bytes(c, sc->raw),
                     *scope_schema = py_text(c, sc->schema);
            PyObject *group = NULL, *gid = NULL;
            if (scope_bytes && scope_schema)
                group = PyObject_CallFunctionObjArgs(
                    group_type, PyList_GET_ITEM(services, current), resource_bytes,
                    resource_schema, scope_bytes, scope_schema, resource_attrs, NULL);
            if (group)
                gid = PyObject_CallOneArg(add_group, group);
            Py_XDECREF(scope_bytes);
            Py_XDECREF(scope_schema);
            Py_XDECREF(group);
            if (gid == NULL)
                failed = 1;
            else
                PyList_SET_ITEM(gids, (Py_ssize_t)i, gid);
        }
        Py_XDECREF(resource_bytes);
        Py_XDECREF(resource_schema);
        Py_XDECREF(resource_attrs);
        if (failed)
            goto done;
    }
    PyTypeObject *rt = (PyTypeObject *)row_type;
    for (size_t i = 0; i < c->spans.n; i++) {
        const span *s = &spans[i];
        if (s->reject) {
            if (rejected++ < max_reasons) {
                PyObject *why = reason(c, s);
                if (why == NULL || PyList_Append(reasons, why) < 0) {
                    Py_XDECREF(why);
                    goto done;
                }
                Py_DECREF(why);
            }
            continue;
        }
        PyObject *row = rt->tp_alloc(rt, 12);
        if (row == NULL)
            goto done;
        PyObject *service = PyList_GET_ITEM(services, scopes[s->scope].res);
        PyObject *gid = PyList_GET_ITEM(gids, s->scope);
        Py_INCREF(service);
        Py_INCREF(gid);
        PyObject *items[12] = {trace_hex(s->trace_id),
                               PyLong_FromUnsignedLongLong(s->span_id),
                               PyLong_FromUnsignedLongLong(s->parent),
                               py_text(c, s->name),
                               PyLong_FromLong(s->kind),
                               service,
                               PyLong_FromUnsignedLongLong(s->start),
                               PyLong_FromUnsignedLongLong(s->end),
                               PyLong_FromLong(s->status),
                               py_text(c, s->attrs),
                               gid,
                               py_bytes(c, s->raw)};
        int ok = 1;
        for (int k = 0; k < 12; k++) {
            ok &= items[k] != NULL;
            PyTuple_SET_ITEM(row, k, items[k]);
        }
        if (!ok || PyList_Append(rows, row) < 0) {
            Py_DECREF(row);
            goto done;
        }
        Py_DECREF(row);
    }
    for (size_t i = 0; i < c->tags.n; i++) {
        const tag *t = &ts[i];
        PyObject *key = py_text(c, t->key), *value = py_text(c, t->value), *k = NULL;
        PyObject *seen = PyLong_FromUnsignedLongLong(t->seen);
        if (key && value && seen)
            k = PyTuple_Pack(4, SCOPE_NAMES[t->scope], key, value, TYPE_NAMES[t->type]);
        Py_XDECREF(key);
        Py_XDECREF(value);
        int ok = k != NULL;
        if (ok) {
            PyObject *old = PyDict_GetItemWithError(tags, k);
            if (old == NULL && PyErr_Occurred())
                ok = 0;
            else if (old == NULL || PyObject_RichCompareBool(old, seen, Py_LT) == 1)
                ok = PyDict_SetItem(tags, k, seen) == 0;
        }
        Py_XDECREF(k);
        Py_XDECREF(seen);
        if (!ok || PyErr_Occurred())
            goto done;
    }
    result = Py_BuildValue("(nO)", rejected, reasons);
done:
    Py_XDECREF(rows);
    Py_XDECREF(tags);
    Py_XDECREF(add_group);
    Py_XDECREF(reasons);
    Py_XDECREF(gids);
    Py_XDECREF(services);
    return result;
}

static void
ctx_free(ctx *c)
{
    free(c->arena);
    free(c->resources.p);
    free(c->scopes.p);
    free(c->spans.p);
    free(c->attrs.p);
    free(c->tags.p);
    free(c->table);
}

static uint64_t SEED;

PyDoc_STRVAR(
    span_batch_doc,
    "span_batch(body, batch, row_type, group_type, limits) -> (rejected, reasons) | None\n\n"
    "Add the spans of an ExportTraceServiceRequest's protobuf bytes to batch (a\n"
    "SpanBatch, empty): rows of row_type, groups of group_type, tags.  limits:\n"
    "(max resources, max scopes, max spans, max tag value length, min time, max time,\n"
    "max reasons).  None, with batch untouched, for a request the Python path must\n"
    "read (malformed, odd or too large).");

static PyObject *
span_batch(PyObject *self, PyObject *args)
{
    PyObject *body, *batch, *row_type, *group_type;
    unsigned long long max_resources, max_scopes, max_items, max_tag_len, min_time, max_time;
    Py_ssize_t max_reasons;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!OO!O(KKKKKKn)", &PyBytes_Type, &body, &batch, &PyType_Type,
                          &row_type, &group_type, &max_resources, &max_scopes, &max_items,
                          &max_tag_len, &min_time, &max_time, &max_reasons))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)row_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "row_type must be a tuple type");
        return NULL;
    }
    if ((size_t)PyBytes_GET_SIZE(body) >= MAX_BODY)
        Py_RETURN_NONE;
    ctx c;
    memset(&c, 0, sizeof c);
    c.body = (const uint8_t *)PyBytes_AS_STRING(body);
    c.body_len = (size_t)PyBytes_GET_SIZE(body);
    c.resources.size = sizeof(resource);
    c.scopes.size = sizeof(scope);
    c.spans.size = sizeof(span);
    c.attrs.size = sizeof(attr);
    c.tags.size = sizeof(tag);
    c.seed = SEED;
    c.max_resources = (size_t)max_resources;
    c.max_scopes = (size_t)max_scopes;
    c.max_items = (size_t)max_items;
    c.max_tag_len = (size_t)max_tag_len;
    c.min_time = min_time;
    c.max_time = max_time;
    int ok;
    /* body is immutable bytes, held by the caller: the walk needs nothing else of Python */
    Py_BEGIN_ALLOW_THREADS;
    c.acap = 4096 + c.body_len;
    c.arena = malloc(c.acap);
    ok = c.arena != NULL;
    if (ok) {
        memcpy(c.arena, LITERALS, sizeof LITERALS - 1);
        c.alen = sizeof LITERALS - 1;
        ok = parse_request(&c) && !c.bail;
    }
    Py_END_ALLOW_THREADS;
    PyObject *out = NULL;
    if (ok) {
        out = build(&c, batch, row_type, group_type, max_reasons);
    } else {
        Py_INCREF(Py_None);
        out = Py_None;
    }
    ctx_free(&c);
    return out;
}

static PyMethodDef methods[] = {
    {"span_batch", span_batch, METH_VARARGS, span_batch_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_otlp",
    .m_doc = "OTLP spans from protobuf bytes to span batches.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__otlp(void)
{
    static const char *scopes[N_SCOPES] = {"span",  "resource", "intrinsic",
                                           "event", "link",     "instrumentation"};
    static const char *types[N_TYPES] = {"string", "int", "float", "bool", "keyword"};
    for (int i = 0; i < N_SCOPES; i++)
        if ((SCOPE_NAMES[i] = PyUnicode_InternFromString(scopes[i])) == NULL)
            return NULL;
    for (int i = 0; i < N_TYPES; i++)
        if ((TYPE_NAMES[i] = PyUnicode_InternFromString(types[i])) == NULL)
            return NULL;
    if ((STR_ADD_GROUP = PyUnicode_InternFromString("add_group")) == NULL ||
        (STR_ROWS = PyUnicode_InternFromString("rows")) == NULL ||
        (STR_TAGS = PyUnicode_InternFromString("tags")) == NULL)
        return NULL;
    /* The tag table's hash seed: per process, so that colliding keys cannot be precomputed
     * (and a long probe sends the request to the Python path in any case). */
    PyObject *os = PyImport_ImportModule("os");
    PyObject *rnd = os ? PyObject_CallMethod(os, "urandom", "i", 8) : NULL;
    Py_XDECREF(os);
    if (rnd == NULL)
        return NULL;
    memcpy(&SEED, PyBytes_AS_STRING(rnd), 8);
    Py_DECREF(rnd);
    return PyModule_Create(&module);
}
