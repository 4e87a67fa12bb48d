/* The code registry: code objects the samples point at, checked to still be what was sampled
 * (a freed one's memory is read safely and judged) before a reference is taken, and kept
 * alive until the agent has named them; and a finished window turned into a dict.  Apart
 * because this is where raw pointers from signal handlers become Python objects. */
#include "internal.h"

#ifdef Py_GIL_DISABLED
#  define Py_BUILD_CORE 1
#  include "internal/pycore_object.h" /* _Py_TryIncref */
#  undef Py_BUILD_CORE
#endif

/* Code objects referenced by samples, kept alive so their address cannot be reused before the
 * agent has named them. */
uint64_t *code_set;
unsigned code_set_count;
PyObject *code_refs; /* list */

#ifdef Py_GIL_DISABLED
/* Free-threaded, the registry is shared by whichever threads collect (see code_valid). */
static pthread_mutex_t codes_mu = PTHREAD_MUTEX_INITIALIZER;
#  define CODES_LOCK() pthread_mutex_lock(&codes_mu)
#  define CODES_UNLOCK() pthread_mutex_unlock(&codes_mu)
#else
#  define CODES_LOCK() ((void)0)
#  define CODES_UNLOCK() ((void)0)
#endif

/* In a forked child (threads.c): the lock a vanished collector may have held, made anew. */
void
codes_after_fork(void)
{
#ifdef Py_GIL_DISABLED
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    codes_mu = fresh;
#endif
}

static int
code_known(uint64_t ptr)
{
    size_t mask = ((size_t)1 << CODE_SET_BITS) - 1;
    for (size_t i = mix64(ptr) & mask;; i = (i + 1) & mask) {
        if (code_set[i] == ptr)
            return 1;
        if (code_set[i] == 0)
            return 0;
    }
}

/* 1 if registered (or already), 0 if the set is full. */
static int
code_register(PyObject *code)
{
    uint64_t ptr = (uint64_t)(uintptr_t)code;
    size_t mask = ((size_t)1 << CODE_SET_BITS) - 1;
    size_t i = mix64(ptr) & mask;
    for (;; i = (i + 1) & mask) {
        if (code_set[i] == ptr)
            return 1;
        if (code_set[i] == 0)
            break;
    }
    if (code_set_count >= CODE_SET_MAX)
        return 0;
    if (PyList_Append(code_refs, code) < 0) {
        PyErr_Clear();
        return 0;
    }
    code_set[i] = ptr;
    code_set_count++;
    return 1;
}

/* What a frame's code pointer says without a look at the object: 0 none, 1 a frame the agent
 * names itself or a code object already held, -1 a code object to check. */
static int
code_settled(uint64_t ptr)
{
    if (ptr == 0)
        return 0;
    if (ptr == GC_FRAME_CODE || ptr == AGENT_FRAME_CODE)
        return 1;
    return code_known(ptr) ? 1 : -1;
}

#ifndef Py_GIL_DISABLED
/* A freed object's memory keeps its type and fields until it is reused, but the allocator
 * writes its free-list link into the first word, where the reference count was: pymalloc the
 * next free block of the same pool (or NULL), mimalloc the next block of the same page, glibc
 * a pointer (and its tcache key over ob_type).  Taking a reference to a freed code object
 * corrupts that free list and crashes the program later, so this check is what keeps it safe.
 * A live code object's count is small (or an immortal constant); a link is 0 or an address
 * near the block itself.  Comparing with the block's own address, not with a fixed bound,
 * matters where the heap is low: under valgrind pymalloc's pools sit near 0x5000000, whose
 * links a "below 2^40" test took for counts, and an INCREF on a freed block followed.
 * The whole first word is judged, not Py_REFCNT: since 3.14 that word is a 32-bit count, a
 * 16-bit overflow and 16 bits of flags, and Py_REFCNT reads only the count, whose half of a
 * link looks like any count (a program that makes and drops a function every millisecond
 * crashed in 3 runs of 3 on 3.14). */
static inline int
plausible_header(const void *object, const void *copy)
{
    uint64_t word;
    memcpy(&word, copy, sizeof word);
    if (word == 0 || ((word ^ (uint64_t)(uintptr_t)object) >> 22) == 0)
        return 0; /* no link, or a link within the same 4 MiB: a pool (16 KiB) or page */
#  if PY_VERSION_HEX >= 0x030E0000 && SIZEOF_VOID_P > 4 && !PY_BIG_ENDIAN
    /* Count, then overflow (0 short of four billion references), then a few flag bits. */
    if (!((uint32_t)word != 0 && ((word >> 32) & 0xFFFF) == 0 && (word >> 48) < 0x100))
        return 0;
#  else
    if (!(word < ((uint64_t)1 << 40) && (int64_t)word > 0))
        return 0;
#  endif
    /* Where the heap is low, a link to a block elsewhere passes the tests above as a count:
     * under valgrind, whose heap starts near 0x4000000 (a churn of short-lived functions
     * crashed 3.9 there in every run), or in an interpreter not built position-independent,
     * whose heap follows it at a few MiB.  Links are aligned addresses of mapped memory; a
     * count that is both is not believed (the frame is then named "unknown", which is safe,
     * where a reference taken to a freed block is not). */
    char byte;
    return (word & 7) != 0 || word < 0x10000 ||
           safe_read((const void *)(uintptr_t)word, &byte, 1) != 0;
}

/* With the GIL (so that no code object is freed meanwhile).  A frame recorded by a signal
 * handler points at a code object that was alive then; by now it may have been freed (its
 * memory unmapped, or reused).  1 if the pointer still is a code object with the same
 * fingerprint, read safely, and now referenced by code_refs. */
static int
code_valid(const RawFrame *frame)
{
    uint64_t ptr = frame->code;
    int settled = code_settled(ptr);
    if (settled >= 0)
        return settled;
    PyCodeObject copy;
    const PyCodeObject *code = (const PyCodeObject *)(uintptr_t)ptr;
    return safe_read(code, &copy, sizeof copy) == 0 && Py_TYPE(&copy) == &PyCode_Type &&
           plausible_header(code, &copy) && code_fingerprint(&copy) == frame->fingerprint &&
           code_register((PyObject *)code);
}
#else
/* Free-threaded: other threads run meanwhile and may free a code object between the check
 * and the reference.  The reference is taken the way CPython's own lock-free readers take
 * one (_Py_TryIncref), which fails on an object whose count has reached zero, and the code is
 * checked again once held.  Code objects rarely die at all there: a code object's constants,
 * the code of every function it defines, are immortal (3.13).  The
 * registry is shared by whichever threads collect, under its own lock; nothing under it runs
 * Python code, allocates a tracked object or waits for other threads. */

static int
code_valid_locked(const RawFrame *frame, PyObject **release)
{
    uint64_t ptr = frame->code;
    int settled = code_settled(ptr);
    if (settled >= 0)
        return settled;
    PyCodeObject copy;
    PyObject *code = (PyObject *)(uintptr_t)ptr;
    if (safe_read(code, &copy, sizeof copy) != 0 || Py_TYPE(&copy) != &PyCode_Type ||
        code_fingerprint(&copy) != frame->fingerprint || !_Py_TryIncref(code))
        return 0;
    /* Held now.  Should it have become another object in between (its memory reused), the
     * reference stays (a leak, where a release could free what its owner still builds). */
    if (Py_TYPE(code) != &PyCode_Type ||
        code_fingerprint((const PyCodeObject *)code) != frame->fingerprint)
        return 0;
    *release = code; /* code_refs holds it now, or it is not kept */
    return code_register(code);
}

static int
code_valid(const RawFrame *frame)
{
    PyObject *release = NULL;
    CODES_LOCK();
    int valid = code_valid_locked(frame, &release);
    CODES_UNLOCK();
    Py_XDECREF(release);
    return valid;
}
#endif

/* The code objects the samples so far point at (a new reference to the list); with
 * `release`, the registry starts afresh, and they stay alive only as long as the caller
 * keeps the list. */
PyObject *
codes_take(int release)
{
    PyObject *empty = release ? PyList_New(0) : NULL;
    if (release && empty == NULL)
        return NULL;
    CODES_LOCK();
    PyObject *codes = code_refs;
    if (release) {
        code_refs = empty;
        memset(code_set, 0, ((size_t)1 << CODE_SET_BITS) * sizeof(uint64_t));
        code_set_count = 0;
    } else {
        Py_INCREF(codes);
    }
    CODES_UNLOCK();
    return codes;
}

/* With the GIL and threads_mutex: references to the code objects of stacks new in w, so that
 * they stay what the samples saw until the window is sent. */
void
pin_window(Window *w)
{
    for (; w->pinned < w->n_stacks; w->pinned++) {
        const StackRec *s = &w->stacks[w->pinned];
        for (uint32_t i = 0; i < s->depth; i++)
            (void)code_valid(&w->frames[s->first + i]);
    }
}

/* With the GIL: {(kind, ident, l0..l4, frames bytes): ns} of a detached window. */
PyObject *
window_dict(Window *w)
{
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    PyObject **stacks = PyMem_Calloc(w->n_stacks ? w->n_stacks : 1, sizeof(PyObject *));
    if (stacks == NULL) {
        Py_DECREF(out);
        return PyErr_NoMemory();
    }
    int failed = 0;
    for (size_t n = 0; n < w->n_stacks && !failed; n++) {
        const StackRec *s = &w->stacks[n];
        /* Codes that are no longer what was sampled become 0 ("unknown"); the fingerprint only
         * served that check and is zeroed, so equal stacks make equal keys. */
        PyObject *bytes =
            PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(s->depth * sizeof(RawFrame)));
        if (bytes == NULL) {
            failed = 1;
            break;
        }
        RawFrame *out_frames = (RawFrame *)PyBytes_AS_STRING(bytes);
        for (uint32_t i = 0; i < s->depth; i++) {
            const RawFrame *f = &w->frames[s->first + i];
            out_frames[i].code = code_valid(f) ? f->code : 0;
            out_frames[i].lasti = f->lasti;
            out_frames[i].fingerprint = 0;
        }
        stacks[n] = bytes;
    }
    for (size_t n = 0; n < w->n_samples && !failed; n++) {
        const SampleRec *r = &w->samples[n];
        PyObject *key =
            Py_BuildValue("(IKKKKKKO)", r->kind, (unsigned long long)r->ident,
                          (unsigned long long)r->labels[0], (unsigned long long)r->labels[1],
                          (unsigned long long)r->labels[2], (unsigned long long)r->labels[3],
                          (unsigned long long)r->labels[4], stacks[r->stack]);
        if (key == NULL) {
            failed = 1;
            break;
        }
        /* Two stacks can become one once unknown codes are zeroed: add, do not overwrite. */
        PyObject *old = PyDict_GetItemWithError(out, key);
        unsigned long long total = r->value;
        if (old != NULL)
            total += PyLong_AsUnsignedLongLong(old);
        PyObject *value = PyErr_Occurred() ? NULL : PyLong_FromUnsignedLongLong(total);
        if (value == NULL || PyDict_SetItem(out, key, value) < 0)
            failed = 1;
        Py_XDECREF(value);
        Py_DECREF(key);
    }
    for (size_t n = 0; n < w->n_stacks; n++)
        Py_XDECREF(stacks[n]);
    PyMem_Free(stacks);
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}
