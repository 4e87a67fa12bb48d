/* Walking a thread's Python frames without the GIL and without allocating: what the signal
 * handler records, and what the allocation and lock collectors borrow through the capsule API.
 * Apart because it is the part that knows CPython's frame layout, version by version. */
#include "internal.h"

/* Reads memory that may have been unmapped: process_vm_readv on ourselves fails with EFAULT
 * where a plain read would crash.  0 on success. */
int
safe_read(const void *address, void *out, size_t size)
{
#ifdef __linux__
    struct iovec local = {out, size};
    struct iovec remote = {(void *)address, size};
    ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    return n == (ssize_t)size ? 0 : -1;
#else
    (void)address;
    (void)out;
    (void)size;
    return -1; /* cannot check: treat as gone */
#endif
}

/* Stacks whose newest frame was not there to read (see newest_live_frame). */
_Atomic uint64_t unreadable_stacks;

#if PY_VERSION_HEX >= 0x030B0000
/* Whether the thread's newest frame is memory that can be read.  Every older frame is: each
 * is held by a call in progress.  The newest may not be, for a few instructions: where a
 * function that makes a generator or coroutine returns it (RETURN_GENERATOR, 3.11 and 3.12,
 * and 3.13 before it cached a chunk), CPython pops the frame before it unlinks it, and if the
 * frame was the first of its stack chunk the chunk is unmapped meanwhile.  A signal pending
 * during that munmap is delivered as it returns, exactly there, and reading the frame
 * crashed the program (coroutines made at a chunk boundary, 3 runs of 3 at 1,000 Hz).  The two
 * places a running frame lives are checked without a system call: the thread's current
 * chunk, or the generator whose exception state the thread is using (a running generator's
 * frame is inside it).  Anything else is judged by newest_live_frame. */
static int
frame_is_live(PyThreadState *ts, _PyInterpreterFrame *f)
{
    const char *p = (const char *)f;
    /* The current chunk, or the one before it (a frame just pushed may have opened one). */
    const _PyStackChunk *chunk = ts->datastack_chunk;
    for (int k = 0; chunk != NULL && k < 2; k++, chunk = chunk->previous) {
        if (p >= (const char *)chunk &&
            p + sizeof(_PyInterpreterFrame) <= (const char *)chunk + chunk->size)
            return 1;
    }
    const char *exc = (const char *)ts->exc_info;
    return exc != NULL &&
           p - offsetof(PyGenObject, gi_iframe) == exc - offsetof(PyGenObject, gi_exc_state);
}

/* The thread's newest frame that can be read, or NULL (see frame_is_live). */
static _PyInterpreterFrame *
newest_live_frame(PyThreadState *ts, _PyInterpreterFrame *f)
{
    if (frame_is_live(ts, f))
        return f;
#  if PY_VERSION_HEX < 0x030D0000
    /* 3.11 and 3.12 enter a C call's eval loop by making its cframe (on the C stack) the
     * thread's before they have set its fields (the compiler orders those stores as it
     * likes): a signal in between finds the current frame, and the cframe's link to its
     * caller, in uninitialised stack memory (crashes on 3.12 under a busy uvloop server: a
     * current frame with f_code 0x100000000, then a caller link of 0x1).  Nothing of that
     * cframe is read then; the sample is not taken (and a 3.12 entry frame, current for a
     * moment as it returns, is not taken either). */
    return NULL;
#  else
    /* A frame on the C stack, or a generator between its yield's two stores: read through
     * process_vm_readv, which fails where the memory is gone. */
    _PyInterpreterFrame copy;
    return safe_read(f, &copy, sizeof copy) == 0 ? f : NULL;
#  endif
}
#endif

/* Leaf first.  Returns the number of frames written (at most max_depth), or -1 when the
 * newest frame was gone (the caller takes no sample then). */
int
walk_frames(PyThreadState *ts, RawFrame *out, int max_depth)
{
    int n = 0;
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts->current_frame;
#elif PY_VERSION_HEX >= 0x030B0000
    _PyInterpreterFrame *f = ts->cframe ? ts->cframe->current_frame : NULL;
#else
    PyFrameObject *f = ts->frame;
#endif
#if PY_VERSION_HEX >= 0x030B0000
    if (f != NULL && (f = newest_live_frame(ts, f)) == NULL) {
        atomic_fetch_add_explicit(&unreadable_stacks, 1, memory_order_relaxed);
        return -1;
    }
#endif
    for (int guard = 0; f != NULL && n < max_depth && guard < 4096; guard++) {
        if (((uintptr_t)f & 7) != 0)
            break;
#if PY_VERSION_HEX >= 0x030B0000
#  if PY_VERSION_HEX >= 0x030C0000
        if (f->owner == FRAME_OWNED_BY_CSTACK) {
            f = f->previous;
            continue;
        }
#  endif
#  if PY_VERSION_HEX >= 0x030D0000
#    if PY_VERSION_HEX >= 0x030E0000
        /* A tagged reference since 3.14: the low bits say how it is owned. */
        PyObject *exe = PyStackRef_AsPyObjectBorrow(f->f_executable);
#    else
        PyObject *exe = f->f_executable;
#    endif
        if (exe == NULL || ((uintptr_t)exe & 7) || Py_TYPE(exe) != &PyCode_Type) {
            f = f->previous;
            continue;
        }
        PyCodeObject *code = (PyCodeObject *)exe;
#  else
        PyCodeObject *code = f->f_code;
        if (code == NULL || ((uintptr_t)code & 7) || Py_TYPE(code) != &PyCode_Type)
            break;
#  endif
        if (_PyFrame_IsIncomplete(f)) {
            f = f->previous;
            continue;
        }
        int lasti = _PyInterpreterFrame_LASTI(f);
        out[n].code = (uint64_t)(uintptr_t)code;
        out[n].lasti = lasti < 0 ? 0 : (uint32_t)lasti * (uint32_t)sizeof(_Py_CODEUNIT);
        out[n].fingerprint = code_fingerprint(code);
        n++;
        f = f->previous;
#else
        PyCodeObject *code = f->f_code;
        if (code == NULL || ((uintptr_t)code & 7) || Py_TYPE(code) != &PyCode_Type)
            break;
        int lasti = f->f_lasti;
#  if PY_VERSION_HEX >= 0x030A0000
        lasti *= 2; /* 3.10 counts instructions, not bytes */
#  endif
        out[n].code = (uint64_t)(uintptr_t)code;
        out[n].lasti = lasti < 0 ? 0 : (uint32_t)lasti;
        out[n].fingerprint = code_fingerprint(code);
        n++;
        f = f->f_back;
#endif
    }
    return n;
}

/* Where a thread is in its Python code, as one number: its newest frame and that frame's
 * caller, each with the instruction it is at.  Its CPU clock cannot tell a thread that a wall
 * signal woke and that went back to its wait from one that returned from its wait and began
 * another (a few microseconds of CPU either way), and a stack charged again for a thread that
 * "did not run" would then hold the second wait too.  The handler reads the number on its own
 * thread as it takes a wall sample, and the collector again later through safe_read, from
 * `frame_field` (where the thread keeps its newest frame: stable while it stays in the
 * evaluation loop it was sampled in; one it has left reads as having moved). */
#if PY_VERSION_HEX >= 0x030B0000
typedef _PyInterpreterFrame WhereFrame;
#  if PY_VERSION_HEX >= 0x030D0000
#    define WHERE_INSTR_FIELD instr_ptr
#  else
#    define WHERE_INSTR_FIELD prev_instr
#  endif
#  define WHERE_INSTR(f) ((uint64_t)(uintptr_t)(f).WHERE_INSTR_FIELD)
#  define WHERE_BACK_FIELD previous
#else
typedef PyFrameObject WhereFrame;
#  define WHERE_INSTR_FIELD f_lasti
#  define WHERE_INSTR(f) ((uint64_t)(uint32_t)(f).f_lasti)
#  define WHERE_BACK_FIELD f_back
#endif
#define WHERE_BACK(f) ((void *)(f).WHERE_BACK_FIELD)
#define WHERE_END(field) (offsetof(WhereFrame, field) + sizeof(((WhereFrame *)0)->field))
#define WHERE_PREFIX                                                                           \
    (WHERE_END(WHERE_INSTR_FIELD) > WHERE_END(WHERE_BACK_FIELD) ? WHERE_END(WHERE_INSTR_FIELD) \
                                                                : WHERE_END(WHERE_BACK_FIELD))

const void *
frame_field(PyThreadState *ts)
{
#if PY_VERSION_HEX >= 0x030D0000
    return &ts->current_frame;
#elif PY_VERSION_HEX >= 0x030B0000
    return ts->cframe != NULL ? (const void *)&ts->cframe->current_frame : NULL;
#else
    return &ts->frame;
#endif
}

static int
plain_read(const void *address, void *out, size_t size)
{
    memcpy(out, address, size);
    return 0;
}

int
where_at(const void *field, int safe, uint64_t *out)
{
    int (*read)(const void *, void *, size_t) = safe ? safe_read : plain_read;
    void *f = NULL;
    if (field == NULL || read(field, &f, sizeof f) != 0)
        return -1;
    uint64_t h = mix64((uint64_t)(uintptr_t)f);
    for (int k = 0; k < 2 && f != NULL; k++) {
        /* The frame up to the two fields, not past them: less to copy, and nothing read
         * beyond a small frame's end. */
        WhereFrame copy;
        if (((uintptr_t)f & 7) != 0 || read(f, &copy, WHERE_PREFIX) != 0)
            return -1;
        h = mix64(h ^ WHERE_INSTR(copy));
        f = WHERE_BACK(copy);
        h = mix64(h ^ (uint64_t)(uintptr_t)f);
    }
    *out = h;
    return 0;
}
