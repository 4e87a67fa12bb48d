/* The agent's native sampler: CPU and wall samples that each thread takes of itself, driven
 * by timers and a native thread, so that no part of sampling waits for the GIL.
 *
 * CPU: every thread gets a POSIX timer on its own CPU clock that delivers SIGPROF to that very
 * thread each `interval` of CPU it burns.  The handler runs on the thread while it is on CPU,
 * so the stack it records is where the CPU went, and threads that released the GIL (C code)
 * are counted too.  The timer is made as the thread starts (threads started through
 * `threading` make their own, see register_thread) or, for any other thread, by the collector
 * within 100 ms of its start.
 *
 * Wall: the collector, a plain pthread that never takes the GIL, ticks `rate` times a second.
 * A thread that ran since its last sample gets a one-shot timer that signals it at a random
 * moment of the next interval, and records its stack in the handler, as for CPU; a thread that
 * did not run (asleep, blocked, waiting) cannot have changed its stack, so its last sample is
 * charged again without disturbing it.  A sampler thread that had to win the GIL was starved exactly when the
 * program was busiest (a busy event loop, or many short system calls, release the GIL and take
 * it straight back), and then nothing was sampled at all.
 *
 * The handler cannot call Python: it copies (code pointer, instruction offset) pairs of the
 * thread's frames and the span/tag labels found in the thread's contextvars into a lock-free
 * ring.  The collector drains the ring into per-window aggregates in plain C memory (bounded;
 * what does not fit is counted), and closes a window every upload interval.  Python, when it
 * gets the GIL, checks each code pointer is still a code object with the same fingerprint
 * before it takes a reference to it, and turns finished windows into dicts.
 *
 * Labels: the agent keeps one `Labels` object (span id, trace id, local root span id, tag set)
 * in a ContextVar.  The handler finds it by walking the thread's current context HAMT for that
 * variable, so threads and asyncio tasks (each runs in its own context) each see their own
 * value, exactly as ContextVar.get() would.
 */
#ifndef _GNU_SOURCE
#  define _GNU_SOURCE 1 /* pthread_setname_np; 1 as pyconfig.h of 3.9 and 3.10 defines it */
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#if PY_VERSION_HEX >= 0x030B0000
#  ifndef Py_BUILD_CORE
#    define Py_BUILD_CORE 1
#  endif
#  if PY_VERSION_HEX >= 0x030E0000
/* 3.14 keeps the frame's layout and accessors apart from pycore_frame.h. */
#    include "internal/pycore_interpframe.h"
#  else
#    include "internal/pycore_frame.h"
#  endif
#  undef Py_BUILD_CORE
#else
#  include <frameobject.h>
#endif

#include "sampler_api.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
#endif

#ifdef __linux__
#  include <fcntl.h>
#  include <sys/syscall.h>
#  include <sys/uio.h>
#  define HAVE_THREAD_TIMERS 1
#  if defined(__has_include)
#    if __has_include(<linux/perf_event.h>)
#      include <fcntl.h>
#      include <linux/perf_event.h>
#      include <sys/ioctl.h>
#      define HAVE_PERF_EVENTS 1
/* The perf events' signal: a real-time one, which queues (see install_perf_handler). */
#      define PERF_SIGNAL (SIGRTMAX - 7)
#    endif
#  endif
#endif

#define MAX_THREADS 4096
#define RING_CAPACITY 1024       /* drained every tick (10 ms at 100 Hz) */
/* Our signals' si_value: a magic | the thread's slot index. */
#define CPU_MAGIC 0x68630000  /* "hc": the thread's CPU timer */
#define WALL_MAGIC 0x68770000 /* "hw": its wall timer, or the collector asking */
#define MAGIC_MASK 0x7fff0000
#define KIND_CPU 0
#define KIND_WALL 1
#define MAX_WINDOW_BYTES ((size_t)64 << 20)
#define MAX_DONE_WINDOWS 64
/* A thread that used less CPU than this since its last sample is taken to be where it was. */
#ifndef REPEAT_CPU_NS
#define REPEAT_CPU_NS 100000ull
#endif
/* A tick that comes late still counts the time that passed, but a process stopped (SIGSTOP,
 * a laptop lid) is not all "wall". */
#define MAX_WALL_PER_TICK_NS 1000000000ull
/* An idle thread is looked at at least this often, and the collector wakes at least this
 * often (when every thread is idle, only this often). */
#define IDLE_CHECK_NS 100000000ull
#define CODE_SET_BITS 15         /* 32768 slots (256 KiB), at most half used */
#define CODE_SET_MAX (1u << (CODE_SET_BITS - 1))

/* ---------------------------------------------------------------- labels */

typedef struct {
    PyObject_HEAD
    uint64_t span_id;
    uint64_t trace_hi;
    uint64_t trace_lo;
    uint64_t root_span_id;
    uint64_t tagset;
    /* Set when a sample carried these labels: the agent tags only spans that have samples
     * with pyroscope.profile.id, which costs nothing for the many that never do. */
    volatile int sampled;
    /* OpenTelemetry's current Context where the span linker made these labels current: the
     * linker keeps it here instead of in OpenTelemetry's own ContextVar, so that making a
     * span current sets one ContextVar, not two (see linker_attach).  NULL otherwise.  Not
     * followed by the GC: a cycle through it would need a Context holding these labels. */
    PyObject *otel_context;
    /* Span stats (see "span stats" below).  cpu_ns: the CPU of the samples taken with these
     * labels current (added by the signal handlers, atomically: a context, and so these
     * labels, can be current on several threads), plus that of child spans; alloc_bytes: the
     * allocation sampler's estimate, likewise.  Both are read and added to atomically. */
    uint64_t cpu_ns;
    uint64_t alloc_bytes;
    /* Set by the linker's attach when it measures the span (span_stats): STATS_THREAD
     * (attach_cpu_ns is the thread's CPU clock then) or STATS_LOOP (in a running asyncio
     * loop: cpu_ns is the figure). */
    int stats;
    uint64_t attach_cpu_ns;
    /* The garbage collections that ran on a thread while these labels were current there,
     * and their pauses (gc_callback adds them), plus those of child spans: read and added to
     * atomically, as cpu_ns. */
    uint64_t gc_pause_ns;
    uint64_t gc_count;
} LabelsObject;

#define STATS_THREAD 1
#define STATS_LOOP 2

static inline void
labels_charge(LabelsObject *labels, uint64_t cpu_ns, uint64_t alloc_bytes)
{
    if (cpu_ns)
        __atomic_fetch_add(&labels->cpu_ns, cpu_ns, __ATOMIC_RELAXED);
    if (alloc_bytes)
        __atomic_fetch_add(&labels->alloc_bytes, alloc_bytes, __ATOMIC_RELAXED);
}

static inline void
labels_charge_gc(LabelsObject *labels, uint64_t pause_ns, uint64_t count)
{
    if (count) {
        __atomic_fetch_add(&labels->gc_pause_ns, pause_ns, __ATOMIC_RELAXED);
        __atomic_fetch_add(&labels->gc_count, count, __ATOMIC_RELAXED);
    }
}

static PyTypeObject LabelsType;

static PyObject *
labels_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"span_id", "trace_hi",     "trace_lo", "root_span_id",
                             "tagset",  "otel_context", NULL};
    unsigned long long v[5] = {0, 0, 0, 0, 0};
    PyObject *otel_context = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|KKKKKO", kwlist, &v[0], &v[1], &v[2], &v[3],
                                     &v[4], &otel_context))
        return NULL;
    LabelsObject *self = (LabelsObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->span_id = v[0];
    self->trace_hi = v[1];
    self->trace_lo = v[2];
    self->root_span_id = v[3];
    self->tagset = v[4];
    if (otel_context != NULL && otel_context != Py_None)
        self->otel_context = Py_NewRef(otel_context);
    return (PyObject *)self;
}

static void
labels_dealloc(LabelsObject *self)
{
    Py_XDECREF(self->otel_context);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
labels_get_otel_context(LabelsObject *self, void *unused)
{
    return Py_NewRef(self->otel_context ? self->otel_context : Py_None);
}

static PyObject *
labels_get(LabelsObject *self, void *which)
{
    return PyLong_FromUnsignedLongLong(((uint64_t *)&self->span_id)[(intptr_t)which]);
}

static PyObject *
labels_get_sampled(LabelsObject *self, void *unused)
{
    return PyBool_FromLong(self->sampled);
}

static int
labels_set_sampled(LabelsObject *self, PyObject *value, void *unused)
{
    int truth = value ? PyObject_IsTrue(value) : 0;
    if (truth < 0)
        return -1;
    self->sampled = truth;
    return 0;
}

static PyObject *
labels_get_stat(LabelsObject *self, void *which)
{
    uint64_t *fields[] = {&self->cpu_ns, &self->alloc_bytes, &self->gc_pause_ns, &self->gc_count};
    return PyLong_FromUnsignedLongLong(__atomic_load_n(fields[(intptr_t)which], __ATOMIC_RELAXED));
}

/* _charge(cpu_ns, alloc_bytes, gc_pause_ns=0, gc_count=0): adds to the span stats (the Python
 * sampler's CPU, a child's figures), atomically as the signal handlers do. */
static PyObject *
labels_charge_method(LabelsObject *self, PyObject *args)
{
    unsigned long long cpu = 0, alloc = 0, pause = 0, count = 0;
    if (!PyArg_ParseTuple(args, "KK|KK", &cpu, &alloc, &pause, &count))
        return NULL;
    labels_charge(self, cpu, alloc);
    labels_charge_gc(self, pause, count);
    Py_RETURN_NONE;
}

static PyMethodDef labels_methods[] = {
    {"_charge", (PyCFunction)labels_charge_method, METH_VARARGS,
     "_charge(cpu_ns, alloc_bytes, gc_pause_ns=0, gc_count=0): add to this span's stats"},
    {NULL},
};

static PyGetSetDef labels_getset[] = {
    {"cpu_ns", (getter)labels_get_stat, NULL, NULL, (void *)0},
    {"alloc_bytes", (getter)labels_get_stat, NULL, NULL, (void *)1},
    {"gc_pause_ns", (getter)labels_get_stat, NULL, NULL, (void *)2},
    {"gc_count", (getter)labels_get_stat, NULL, NULL, (void *)3},
    {"sampled", (getter)labels_get_sampled, (setter)labels_set_sampled, NULL, NULL},
    {"otel_context", (getter)labels_get_otel_context, NULL, NULL, NULL},
    {"span_id", (getter)labels_get, NULL, NULL, (void *)0},
    {"trace_hi", (getter)labels_get, NULL, NULL, (void *)1},
    {"trace_lo", (getter)labels_get, NULL, NULL, (void *)2},
    {"root_span_id", (getter)labels_get, NULL, NULL, (void *)3},
    {"tagset", (getter)labels_get, NULL, NULL, (void *)4},
    {NULL},
};

static PyTypeObject LabelsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._sampler.Labels",
    .tp_basicsize = sizeof(LabelsObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = labels_new,
    .tp_dealloc = (destructor)labels_dealloc,
    .tp_getset = labels_getset,
    .tp_methods = labels_methods,
    .tp_doc = "Span and tag labels of the current context, readable from a signal handler.",
};

/* Mirrors of CPython's context and HAMT layouts (Python/context.c, Python/hamt.c; unchanged
 * since 3.7).  module init checks them against real contexts and turns label lookup off if
 * they do not match. */
typedef struct {
    PyObject_HEAD
    void *ctx_prev;
    PyObject *ctx_vars;
} CtxMirror;
typedef struct {
    PyObject_HEAD
    PyObject *h_root;
} HamtMirror;
typedef struct {
    PyObject_VAR_HEAD
    uint32_t b_bitmap;
    PyObject *b_array[1];
} BitmapNodeMirror;
typedef struct {
    PyObject_HEAD
    PyObject *a_array[32];
} ArrayNodeMirror;

static PyObject *labels_var;          /* the agent's ContextVar */
static int32_t labels_var_hash;
static PyTypeObject *bitmap_node_type;
static PyTypeObject *array_node_type;
static int labels_lookup_ok;

static LabelsObject *
find_labels(PyObject *context)
{
    if (!labels_lookup_ok || context == NULL)
        return NULL;
    PyObject *hamt = ((CtxMirror *)context)->ctx_vars;
    if (hamt == NULL)
        return NULL;
    PyObject *node = ((HamtMirror *)hamt)->h_root;
    uint32_t shift = 0;
    for (int level = 0; node != NULL && level < 8; level++) {
        PyTypeObject *type = Py_TYPE(node);
        uint32_t idx = ((uint32_t)labels_var_hash >> shift) & 0x1f;
        if (type == bitmap_node_type) {
            BitmapNodeMirror *b = (BitmapNodeMirror *)node;
            uint32_t bit = 1u << idx;
            if (!(b->b_bitmap & bit))
                return NULL;
            uint32_t pos = (uint32_t)__builtin_popcount(b->b_bitmap & (bit - 1));
            PyObject *key = b->b_array[2 * pos];
            PyObject *val = b->b_array[2 * pos + 1];
            if (key == NULL) {
                node = val;
            } else if (key == labels_var) {
                return (val != NULL && Py_TYPE(val) == &LabelsType) ? (LabelsObject *)val : NULL;
            } else {
                return NULL;
            }
        } else if (type == array_node_type) {
            node = ((ArrayNodeMirror *)node)->a_array[idx];
        } else {
            return NULL; /* a collision node: two keys with one 32-bit hash; not worth it */
        }
        shift += 5;
    }
    return NULL;
}

/* ---------------------------------------------------------------- frames */

typedef HotspanRawFrame RawFrame; /* see sampler_api.h */

/* What identifies a code object beyond its address, which a freed one's successor may reuse:
 * its first line and its name's (usually interned) string. */
static inline uint32_t
code_fingerprint(const PyCodeObject *code)
{
    return (uint32_t)code->co_firstlineno ^ (uint32_t)((uintptr_t)code->co_name >> 4) ^
           (uint32_t)((uintptr_t)code->co_name >> 36);
}

static inline PyObject *
thread_context(PyThreadState *ts)
{
    return ts->context;
}

/* Reads memory that may have been unmapped: process_vm_readv on ourselves fails with EFAULT
 * where a plain read would crash.  0 on success. */
static int
safe_read(const void *address, void *out, size_t size)
{
#ifdef __linux__
    struct iovec local = {out, size};
    struct iovec remote = {(void *)address, size};
    ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    return n == (ssize_t)size ? 0 : -1;
#else
    (void)address; (void)out; (void)size;
    return -1; /* cannot check: treat as gone */
#endif
}

/* Stacks whose newest frame was not there to read (see newest_live_frame). */
static _Atomic uint64_t unreadable_stacks;

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
static int
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

/* ---------------------------------------------------------------- the ring */

/* One sample as a signal handler records it on its own thread: the stack and labels, and the
 * CPU and wall time it stands for (either may be 0). */
typedef struct {
    _Atomic int state; /* 0 free, 1 being written, 2 ready */
    int depth;
    int slot;          /* the thread's slot, or -1 */
    uint32_t seq;      /* the slot's sample count when taken */
    uint64_t ident;
    uint64_t cpu_ns;
    uint64_t wall_ns;
    uint64_t labels[5];
    RawFrame frames[];
} Entry;

static char *ring;            /* RING_CAPACITY entries of entry_size bytes */
static size_t entry_size;
static int max_depth = 64;
static _Atomic unsigned long ring_pos;
static unsigned long drain_pos; /* the collector's: entries before it are consumed */
/* Samples taken but not kept (ring full, or the windows at their memory bound): reported. */
static _Atomic uint64_t lost_samples;
static _Atomic int sampling_enabled;
static int running;
static int cpu_on;            /* per-thread CPU timers wanted */
static int wall_on;
static uint64_t cpu_interval_ns;

static inline Entry *
entry_at(size_t i)
{
    return (Entry *)(ring + (i % RING_CAPACITY) * entry_size);
}

static void
copy_labels(LabelsObject *labels, uint64_t *out)
{
    if (labels == NULL) {
        memset(out, 0, 5 * sizeof(uint64_t));
        return;
    }
    labels->sampled = 1;
    out[0] = labels->span_id;
    out[1] = labels->trace_hi;
    out[2] = labels->trace_lo;
    out[3] = labels->root_span_id;
    out[4] = labels->tagset;
}

static uint64_t
realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- threads */

/* Every thread of the process has a slot, found by the collector (a scan of /proc/self/task)
 * or made by the thread itself as it starts (register_thread).  A signal carries its thread's
 * slot index, so the handler needs no lookup; it checks the slot is still its own. */
enum { PY_UNKNOWN = 0, PY_YES = 1, PY_NO = 2 };

typedef struct {
    uint64_t ident;
    uint64_t labels[5];
    uint32_t seq;
    int depth;
    RawFrame frames[];
} WallCopy; /* a thread's last wall sample, charged again while the thread does not run */

typedef struct {
    _Atomic pid_t tid;                 /* 0: free */
    _Atomic int python;                /* whether it has a Python thread state (PY_*) */
    _Atomic uint64_t pending_wall_ns;  /* wall time its next sample stands for */
    _Atomic uint64_t cpu_at_sample_ns; /* its CPU clock as its last sample was taken */
    /* Its CPU clock up to which its CPU is in the profile, and when its CPU timer expires
     * next.  A sample stands for the CPU between two expiries (the first: since the timer
     * was armed), whenever the signal comes: the kernel sees an expiry only at a scheduler
     * tick (4 ms at HZ=250), so a signal comes late, later the further its expiry was from
     * the tick, and weighing a sample by the CPU since the last signal would give the late
     * ones (at the ends of bursts) more.  What is left as the thread ends or sampling stops
     * is charged then (charge_cpu_tail), so the profile adds up to the thread's clock. */
    _Atomic uint64_t cpu_charged_ns;
    _Atomic uint64_t cpu_expiry_ns;
    _Atomic uint32_t seq;              /* samples it took */
    _Atomic int perf_first;            /* its perf event still has its random first period */
    /* The rest belongs to whoever holds `threads_mutex`. */
    int has_timer;      /* a CPU trigger: `timer`, or `perf_fd` when cpu_by_perf */
    int cpu_by_perf;
    int perf_fd;
    uint64_t perf_armed_cpu; /* its CPU clock when its event was made */
    timer_t timer;      /* on the thread's CPU clock, periodic */
    int has_wall_timer;
    timer_t wall_timer; /* on CLOCK_MONOTONIC, one-shot, set by each wall tick */
    unsigned scan_mark;
    uint64_t cpu_at_tick;               /* its CPU clock at the last check */
    uint64_t wall_since_ns;             /* monotonic: its wall time is charged up to here */
    uint64_t next_check_ns;             /* monotonic: when to look at it again */
    int idle_checks;                    /* checks in a row that found it had not run */
    uint64_t next_probe_ns;
    WallCopy *last_wall;               /* NULL until its first wall sample is drained */
    WallCopy *last_cpu;                /* its last CPU sample: where its remaining CPU goes */
} ThreadSlot;

static ThreadSlot slots[MAX_THREADS];
static int free_slots[MAX_THREADS];
static int n_free_slots;
static int used_slots[MAX_THREADS]; /* indices of the slots in use, in no order */
static int n_used_slots;
static pthread_mutex_t threads_mutex = PTHREAD_MUTEX_INITIALIZER;
static pid_t excluded[16];
static int n_excluded;
static uint64_t arm_random = 0x2545f4914f6cdd1dull; /* under threads_mutex */

static inline uint64_t
next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* tid -> slot index + 1, open addressing; only touched under threads_mutex, never by a
 * signal handler, so it can be rebuilt freely. */
#define TID_MAP_SIZE (2 * MAX_THREADS)
static int32_t tid_map_key[TID_MAP_SIZE]; /* 0 empty, -1 deleted */
static int16_t tid_map_val[TID_MAP_SIZE];
static int tid_map_deleted;

static inline uint64_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int
tid_map_get(pid_t tid)
{
    size_t mask = TID_MAP_SIZE - 1;
    for (size_t i = mix64((uint64_t)tid) & mask, n = 0; n < TID_MAP_SIZE; i = (i + 1) & mask, n++) {
        if (tid_map_key[i] == tid)
            return tid_map_val[i];
        if (tid_map_key[i] == 0)
            return -1;
    }
    return -1;
}

static void
tid_map_rebuild(void)
{
    memset(tid_map_key, 0, sizeof tid_map_key);
    tid_map_deleted = 0;
    size_t mask = TID_MAP_SIZE - 1;
    for (int k = 0; k < n_used_slots; k++) {
        int s = used_slots[k];
        pid_t tid = atomic_load(&slots[s].tid);
        size_t i = mix64((uint64_t)tid) & mask;
        while (tid_map_key[i] != 0)
            i = (i + 1) & mask;
        tid_map_key[i] = tid;
        tid_map_val[i] = (int16_t)s;
    }
}

static void
tid_map_put(pid_t tid, int slot)
{
    if (tid_map_deleted > MAX_THREADS / 2)
        tid_map_rebuild();
    size_t mask = TID_MAP_SIZE - 1;
    size_t i = mix64((uint64_t)tid) & mask;
    while (tid_map_key[i] > 0)
        i = (i + 1) & mask;
    if (tid_map_key[i] < 0)
        tid_map_deleted--;
    tid_map_key[i] = tid;
    tid_map_val[i] = (int16_t)slot;
}

static void
tid_map_del(pid_t tid)
{
    size_t mask = TID_MAP_SIZE - 1;
    for (size_t i = mix64((uint64_t)tid) & mask, n = 0; n < TID_MAP_SIZE; i = (i + 1) & mask, n++) {
        if (tid_map_key[i] == tid) {
            tid_map_key[i] = -1;
            tid_map_deleted++;
            return;
        }
        if (tid_map_key[i] == 0)
            return;
    }
}

static int
is_excluded(pid_t tid)
{
    for (int i = 0; i < n_excluded; i++)
        if (excluded[i] == tid)
            return 1;
    return 0;
}

static void
reset_threads(void)
{
    n_used_slots = 0;
    n_free_slots = 0;
    for (int i = MAX_THREADS - 1; i >= 0; i--) {
        atomic_store(&slots[i].tid, 0);
#ifdef HAVE_PERF_EVENTS
        /* In a forked child: the parent's events, on the parent's threads. */
        if (slots[i].cpu_by_perf)
            close(slots[i].perf_fd);
        slots[i].cpu_by_perf = 0;
#endif
        slots[i].has_timer = 0;
        slots[i].has_wall_timer = 0;
        free_slots[n_free_slots++] = i;
    }
    memset(tid_map_key, 0, sizeof tid_map_key);
    tid_map_deleted = 0;
}

#ifdef HAVE_THREAD_TIMERS
static pid_t
own_tid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

/* The kernel's encoding of a thread's CPU clock (CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD); start()
 * checks it against pthread_getcpuclockid before anything relies on it. */
static inline clockid_t
thread_clock(pid_t tid)
{
    return (clockid_t)((~(unsigned)tid << 3) | 6u);
}

static int
clock_ns(clockid_t clock, uint64_t *out)
{
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0)
        return -1;
    *out = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    return 0;
}

/* ---- the CPU trigger: a perf task-clock event for the main thread where the kernel allows
 * it, a POSIX CPU timer for the others (HOTSPAN_CPU_TRIGGER=perf: events for every thread,
 * =timer: timers only).
 *
 * A POSIX CPU timer's expiry is only noticed at a scheduler tick (4 ms at HZ=250) on which
 * the thread is running, so its signal lands where the thread is at that tick, not where
 * its CPU reached the interval.  For threads that run in bursts shorter than a tick, bursts
 * that start right after a tick (a woken thread on a busy machine often does) are seen late
 * and their ends get their beginnings' samples: 75/25 split measured as 69/31.  The kernel's
 * task-clock event counts the thread's CPU with an hrtimer armed while it runs, so its
 * overflow interrupts the thread where the interval ends.  The event signals its thread
 * (F_SETOWN_EX) with PERF_SIGNAL and disables itself after each overflow (REFRESH 1): the
 * handler re-enables it, and charges the thread's CPU since its previous sample.  Where
 * perf_event_open is not allowed (seccomp in containers, perf_event_paranoid > 2) the timer
 * takes over.  An event costs every context switch of its thread: see sampler_start. */
#ifdef HAVE_PERF_EVENTS
enum { PERF_UNTRIED, PERF_WITH_KERNEL, PERF_USER_ONLY, PERF_OFF };
static int perf_state = PERF_UNTRIED; /* under threads_mutex */
static int perf_main_only = 1;        /* events for the main thread only, timers for others */
#define PERF_FDS 4096
static _Atomic int perf_fd_slot[PERF_FDS]; /* fd -> slot index + 1, for the handler */
/* Overflows handled: proof that the kernel signals.  Where it takes the event but never
 * signals (valgrind does that), the scan sees a thread burn intervals without a sample and
 * goes back to timers (check_perf_signals). */
static _Atomic unsigned long perf_signals;
/* The events' own signal, a real-time one, which queues: on SIGPROF an overflow coming while
 * a wall or timer SIGPROF is pending would be merged into it and lost, and the event, off
 * until its handler runs, would stay off (measured: a busy event loop lost 80% of its CPU).
 * 0 when the program has a handler of its own there (then timers). */
static int perf_signal;
static struct sigaction previous_perf_action;

/* Under threads_mutex: 0 when `s` now has an enabled task-clock event. */
static int
arm_perf(ThreadSlot *s, int index, pid_t tid, uint64_t first)
{
    if (perf_state == PERF_OFF)
        return -1;
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_TASK_CLOCK;
    attr.sample_period = first;
    attr.disabled = 1;
    attr.exclude_hv = 1;
    attr.exclude_kernel = perf_state == PERF_USER_ONLY;
    int fd = (int)syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0 && perf_state == PERF_UNTRIED && (errno == EACCES || errno == EPERM)) {
        /* perf_event_paranoid 2: our own threads, user mode only.  An overflow that comes in
         * the kernel is skipped then; the next sample charges its CPU (the clock says how
         * much), so only where that CPU lands is less exact. */
        attr.exclude_kernel = 1;
        fd = (int)syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
        if (fd >= 0)
            perf_state = PERF_USER_ONLY;
    }
    if (fd < 0) {
        /* Not allowed or not there: timers from now on.  A thread that just died (ESRCH) or
         * a full fd table (EMFILE) says nothing about the next thread. */
        if (errno != ESRCH && errno != EMFILE && errno != ENFILE)
            perf_state = PERF_OFF;
        return -1;
    }
    if (perf_state == PERF_UNTRIED)
        perf_state = PERF_WITH_KERNEL;
    struct f_owner_ex owner = {F_OWNER_TID, tid};
    if (fd >= PERF_FDS || fcntl(fd, F_SETFL, O_ASYNC) != 0 ||
        fcntl(fd, F_SETSIG, perf_signal) != 0 ||
        fcntl(fd, F_SETOWN_EX, &owner) != 0) {
        close(fd);
        return -1;
    }
    s->perf_fd = fd;
    s->cpu_by_perf = 1;
    s->perf_armed_cpu = atomic_load(&s->cpu_charged_ns);
    atomic_store(&s->perf_first, 1);
    atomic_store_explicit(&perf_fd_slot[fd], index + 1, memory_order_release);
    if (ioctl(fd, PERF_EVENT_IOC_REFRESH, 1) != 0) {
        atomic_store(&perf_fd_slot[fd], 0);
        close(fd);
        s->cpu_by_perf = 0;
        return -1;
    }
    return 0;
}

static void arm(ThreadSlot *s, int index);
static void disarm(ThreadSlot *s);
static void on_signal(int signum, siginfo_t *info, void *ucontext);

/* Ours on the events' signal, unless the program has its own there. */
static int
install_perf_handler(void)
{
    int sig = PERF_SIGNAL;
    struct sigaction now;
    if (sigaction(sig, NULL, &now) != 0)
        return -1;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_signal)
        return 0;
    if (now.sa_handler != SIG_DFL) /* sa_handler and sa_sigaction share their storage */
        return -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGPROF); /* one sample at a time on a thread */
    if (sigaction(sig, &sa, &previous_perf_action) != 0)
        return -1;
    perf_signal = sig;
    return 0;
}

/* Under threads_mutex, from the scan: no overflow has ever come, and this thread's event has
 * seen four intervals of its CPU (the first is up to one): perf does not signal here. */
static void
check_perf_signals(ThreadSlot *s)
{
    uint64_t cpu;
    if (!s->cpu_by_perf || atomic_load(&perf_signals) != 0 ||
        clock_ns(thread_clock(atomic_load(&s->tid)), &cpu) != 0 ||
        cpu < s->perf_armed_cpu + 4 * cpu_interval_ns)
        return;
    perf_state = PERF_OFF;
    for (int k = 0; k < n_used_slots; k++) {
        int index = used_slots[k];
        if (!slots[index].cpu_by_perf)
            continue;
        disarm(&slots[index]);
        if (atomic_load(&slots[index].python) != PY_NO)
            arm(&slots[index], index);
    }
}

static const char *
cpu_trigger_name(void)
{
    if (perf_main_only && (perf_state == PERF_WITH_KERNEL || perf_state == PERF_USER_ONLY))
        return perf_state == PERF_WITH_KERNEL ? "perf (main thread), timer"
                                              : "perf (main thread, user mode), timer";
    return perf_state == PERF_WITH_KERNEL ? "perf"
           : perf_state == PERF_USER_ONLY ? "perf (user mode)"
           : perf_state == PERF_UNTRIED   ? "untried"
                                          : "timer";
}
#else
static const char *
cpu_trigger_name(void)
{
    return "timer";
}
#endif

static void
disarm(ThreadSlot *s)
{
#ifdef HAVE_PERF_EVENTS
    if (s->cpu_by_perf) {
        /* Unmapped first: a handler running now re-enables nothing it should not.  (It
         * could still, between its check and its ioctl, hit a new file with this number:
         * an ioctl no other file knows, which fails harmlessly.) */
        atomic_store_explicit(&perf_fd_slot[s->perf_fd], 0, memory_order_release);
        close(s->perf_fd);
        s->cpu_by_perf = 0;
        s->has_timer = 0;
    }
#endif
    if (s->has_timer)
        timer_delete(s->timer);
    if (s->has_wall_timer)
        timer_delete(s->wall_timer);
    s->has_timer = 0;
    s->has_wall_timer = 0;
}

/* A timer on `clock` that signals the slot's thread itself. */
static int
thread_timer(ThreadSlot *s, clockid_t clock, int magic, int index, timer_t *out)
{
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGPROF;
    ev.sigev_value.sival_int = magic | index;
    ev._sigev_un._tid = atomic_load(&s->tid);
    return timer_create(clock, &ev, out);
}

static void
arm(ThreadSlot *s, int index)
{
    if (s->has_timer || !cpu_on)
        return;
    pid_t tid = atomic_load(&s->tid);
    uint64_t cpu_now;
    if (clock_ns(thread_clock(tid), &cpu_now) != 0)
        return; /* the thread is gone: the next scan frees its slot */
    /* The first expiry at a random point of the first interval: a thread that burns 3 ms
     * would otherwise never reach a 10 ms timer, and a pool of such threads would have no
     * CPU at all; this way each is caught with probability 3/10, for 10 ms. */
    uint64_t first = 1000 + next_random(&arm_random) % cpu_interval_ns;
#ifdef HAVE_PERF_EVENTS
    /* Its CPU before this point is not the profile's; no expiry: the handler charges the
     * CPU since the last sample (set before the event is enabled: it may fire at once). */
    atomic_store_explicit(&s->cpu_charged_ns, cpu_now, memory_order_release);
    atomic_store_explicit(&s->cpu_expiry_ns, 0, memory_order_release);
    if ((!perf_main_only || tid == getpid()) && arm_perf(s, index, tid, first) == 0) {
        s->has_timer = 1;
        return;
    }
#endif
    if (thread_timer(s, thread_clock(tid), CPU_MAGIC, index, &s->timer) != 0)
        return;
    /* Its CPU before this point is not the profile's (it ran before sampling started). */
    atomic_store_explicit(&s->cpu_charged_ns, cpu_now, memory_order_release);
    struct itimerspec spec;
    spec.it_interval.tv_sec = (time_t)(cpu_interval_ns / 1000000000ull);
    spec.it_interval.tv_nsec = (long)(cpu_interval_ns % 1000000000ull);
    spec.it_value.tv_sec = (time_t)(first / 1000000000ull);
    spec.it_value.tv_nsec = (long)(first % 1000000000ull);
    /* Before the timer runs: on the calling thread its first signal may come at once. */
    atomic_store_explicit(&s->cpu_expiry_ns, cpu_now + first, memory_order_release);
    if (timer_settime(s->timer, 0, &spec, NULL) != 0) {
        timer_delete(s->timer);
        atomic_store(&s->cpu_charged_ns, 0);
        atomic_store(&s->cpu_expiry_ns, 0);
        return;
    }
    s->has_timer = 1;
}

/* A timer whose thread died reads back with no interval, even if its tid was reused since. */
static int
timer_alive(ThreadSlot *s)
{
#ifdef HAVE_PERF_EVENTS
    /* A perf event without a ring buffer polls as hung up, dead thread or not, and the
     * thread's start time would take three system calls: a thread that ends unseen and
     * whose tid is taken within a scan (100 ms) is caught when its clock goes back
     * (collector_tick), as with timers. */
    if (s->cpu_by_perf)
        return 1;
#endif
    struct itimerspec spec;
    if (timer_gettime(s->timer, &spec) != 0)
        return 0;
    return spec.it_interval.tv_sec != 0 || spec.it_interval.tv_nsec != 0;
}
#endif

/* Under threads_mutex.  The slot of `tid`, made if it has none (-1 when the table is full). */
static int
slot_for(pid_t tid, int python)
{
    int index = tid_map_get(tid);
    if (index >= 0)
        return index;
    if (n_free_slots == 0)
        return -1;
    index = free_slots[--n_free_slots];
    ThreadSlot *s = &slots[index];
    atomic_store(&s->python, python);
    atomic_store(&s->pending_wall_ns, 0);
    atomic_store(&s->cpu_at_sample_ns, 0);
    atomic_store(&s->cpu_charged_ns, 0);
    atomic_store(&s->cpu_expiry_ns, 0);
    s->has_timer = 0;
    s->scan_mark = 0;
    s->cpu_at_tick = 0;
    s->wall_since_ns = monotonic_ns();
    s->next_check_ns = 0;
    s->idle_checks = 0;
    s->next_probe_ns = 0;
    if (s->last_wall != NULL)
        s->last_wall->depth = -1;
    if (s->last_cpu != NULL)
        s->last_cpu->depth = -1;
    atomic_store_explicit(&s->tid, tid, memory_order_release);
    used_slots[n_used_slots++] = index;
    tid_map_put(tid, index);
    return index;
}

static void
slot_release(int index)
{
    ThreadSlot *s = &slots[index];
#ifdef HAVE_THREAD_TIMERS
    disarm(s);
#endif
    tid_map_del(atomic_load(&s->tid));
    atomic_store_explicit(&s->tid, 0, memory_order_release);
    for (int k = 0; k < n_used_slots; k++) {
        if (used_slots[k] == index) {
            used_slots[k] = used_slots[--n_used_slots];
            break;
        }
    }
    free_slots[n_free_slots++] = index;
}

/* Under threads_mutex: the agent's own threads are never sampled. */
static void
exclude_tid(pid_t tid)
{
    if (!is_excluded(tid) && n_excluded < (int)(sizeof excluded / sizeof excluded[0]))
        excluded[n_excluded++] = tid;
    int index = tid_map_get(tid);
    if (index >= 0)
        slot_release(index);
}

/* ---------------------------------------------------------------- the signal handler */

#ifdef HAVE_THREAD_TIMERS
static struct sigaction previous_action;
static int handler_installed;
static _Atomic uint64_t handler_ns;    /* CPU the handler used on our signals, all threads */
static _Atomic uint64_t handler_calls; /* and how many it handled */

/* SIGPROF from one of the thread's timers: its CPU timer (CPU_MAGIC), its wall timer
 * (WALL_MAGIC), or (SI_QUEUE) the collector asking a thread whether it has Python yet.  One
 * walk of the stack serves the CPU the timer stands for or the wall time the collector left
 * in the slot. */
static void
on_signal(int signum, siginfo_t *info, void *ucontext)
{
    int magic = info != NULL ? info->si_value.sival_int & MAGIC_MASK : 0;
    int ours = (info != NULL && info->si_code == SI_TIMER &&
                (magic == CPU_MAGIC || magic == WALL_MAGIC)) ||
               (info != NULL && info->si_code == SI_QUEUE && magic == WALL_MAGIC &&
                info->si_pid == getpid());
    int perf_index = -1;
#ifdef HAVE_PERF_EVENTS
    /* A task-clock event's overflow: its signal with si_code POLL_HUP and its fd. */
    if (!ours && signum == perf_signal && perf_signal != 0 && info != NULL &&
        info->si_code == POLL_HUP && info->si_fd >= 0 && info->si_fd < PERF_FDS) {
        int mapped = atomic_load_explicit(&perf_fd_slot[info->si_fd], memory_order_acquire);
        if (mapped > 0) {
            ours = 1;
            magic = CPU_MAGIC;
            perf_index = mapped - 1;
            atomic_fetch_add_explicit(&perf_signals, 1, memory_order_relaxed);
        }
    }
#endif
    if (!ours) {
        /* Not ours: hand it to whoever had the signal before us. */
        const struct sigaction *previous = &previous_action;
#ifdef HAVE_PERF_EVENTS
        if (signum != SIGPROF)
            previous = &previous_perf_action;
#endif
        if ((previous->sa_flags & SA_SIGINFO) && previous->sa_sigaction != NULL)
            previous->sa_sigaction(signum, info, ucontext);
        else if (previous->sa_handler != SIG_DFL && previous->sa_handler != SIG_IGN &&
                 previous->sa_handler != NULL)
            previous->sa_handler(signum);
        return;
    }
    if (!atomic_load_explicit(&sampling_enabled, memory_order_acquire) || ring == NULL)
        return;
    int saved_errno = errno;
    int index = perf_index >= 0 ? perf_index : info->si_value.sival_int & ~MAGIC_MASK;
    ThreadSlot *slot = NULL;
    if (index < MAX_THREADS && atomic_load_explicit(&slots[index].tid, memory_order_acquire) ==
                                   own_tid())
        slot = &slots[index];
    PyThreadState *ts = PyGILState_GetThisThreadState();
    if (slot != NULL)
        atomic_store_explicit(&slot->python, ts != NULL ? PY_YES : PY_NO, memory_order_relaxed);
    uint64_t cpu = 0, wall = 0, cpu_now = 0;
    /* The slot's charged CPU before and after this sample: put back if no stack is read. */
    uint64_t charged_before = 0, charged_after = 0;
    int have_clock = clock_ns(CLOCK_THREAD_CPUTIME_ID, &cpu_now) == 0;
    if (magic == CPU_MAGIC && perf_index >= 0) {
        /* Precise: the CPU since the thread's previous sample (or since it was armed). */
        cpu = cpu_interval_ns;
        if (slot != NULL && have_clock) {
            charged_after = cpu_now;
            charged_before = atomic_exchange(&slot->cpu_charged_ns, cpu_now);
            cpu = charged_before != 0 && cpu_now > charged_before ? cpu_now - charged_before : 0;
        }
    }
    else if (magic == CPU_MAGIC) {
        uint64_t nominal =
            cpu_interval_ns * (uint64_t)(1 + (info->si_overrun > 0 ? info->si_overrun : 0));
        cpu = nominal;
        uint64_t expiry = slot != NULL ? atomic_load(&slot->cpu_expiry_ns) : 0;
        if (expiry != 0) {
            /* The expiries this signal stands for, as the kernel scheduled them. */
            uint64_t through = expiry + nominal - cpu_interval_ns;
            charged_after = through;
            charged_before = atomic_exchange(&slot->cpu_charged_ns, through);
            atomic_store(&slot->cpu_expiry_ns, through + cpu_interval_ns);
            cpu = charged_before != 0 && through > charged_before ? through - charged_before : 0;
        }
    }
    /* Only the wall timer's own signal takes the wall time: the CPU timer fires only while
     * the thread runs, so wall time it took would all land on running code. */
    if (slot != NULL && magic == WALL_MAGIC)
        wall = atomic_exchange_explicit(&slot->pending_wall_ns, 0, memory_order_acq_rel);
    if (ts != NULL && (cpu | wall) != 0) {
        unsigned long pos = atomic_fetch_add_explicit(&ring_pos, 1, memory_order_relaxed);
        Entry *e = entry_at(pos);
        int expected = 0;
        if (atomic_compare_exchange_strong(&e->state, &expected, 1)) {
            e->ident = (uint64_t)ts->thread_id;
            e->slot = slot != NULL ? index : -1;
            int depth = walk_frames(ts, e->frames, max_depth);
            if (depth < 0) {
                /* No stack to charge: what this sample stood for goes to the thread's next
                 * one (an empty entry, so the collector frees it in turn). */
                e->cpu_ns = e->wall_ns = 0;
                e->depth = 0;
                e->seq = 0;
                memset(e->labels, 0, sizeof e->labels);
                if (charged_after != 0)
                    atomic_compare_exchange_strong(&slot->cpu_charged_ns, &charged_after,
                                                   charged_before);
                if (wall != 0)
                    atomic_fetch_add(&slot->pending_wall_ns, wall);
            } else {
                e->cpu_ns = cpu;
                e->wall_ns = wall;
                e->seq = slot != NULL ? atomic_fetch_add(&slot->seq, 1) + 1 : 0;
                LabelsObject *found = find_labels(thread_context(ts));
                copy_labels(found, e->labels);
                /* The span's CPU under asyncio, where tasks interleave on one thread: what
                 * its samples stand for (see span stats). */
                if (found != NULL && cpu != 0)
                    labels_charge(found, cpu, 0);
                e->depth = depth;
            }
            atomic_store_explicit(&e->state, 2, memory_order_release);
        } else {
            atomic_fetch_add_explicit(&lost_samples, 1, memory_order_relaxed);
        }
        /* Read as the handler began: the few microseconds it takes are below what counts
         * as having run (REPEAT_CPU_NS). */
        if (slot != NULL && have_clock)
            atomic_store_explicit(&slot->cpu_at_sample_ns, cpu_now, memory_order_release);
    }
#ifdef HAVE_PERF_EVENTS
    /* The event disabled itself at the overflow: the next interval starts now. */
    int fd = perf_index >= 0 ? info->si_fd : -1;
    if (fd >= 0 && slot != NULL &&
        atomic_load_explicit(&perf_fd_slot[fd], memory_order_acquire) == perf_index + 1) {
        if (atomic_exchange(&slot->perf_first, 0)) {
            uint64_t period = cpu_interval_ns;
            ioctl(fd, PERF_EVENT_IOC_PERIOD, &period);
        }
        ioctl(fd, PERF_EVENT_IOC_REFRESH, 1);
    }
#endif
    /* The handler's own cost, from the thread's CPU clock it read as it began: what every
     * sample takes from the program, reported by stats(). */
    uint64_t cpu_end;
    if (have_clock && clock_ns(CLOCK_THREAD_CPUTIME_ID, &cpu_end) == 0 && cpu_end >= cpu_now) {
        atomic_fetch_add_explicit(&handler_ns, cpu_end - cpu_now, memory_order_relaxed);
        atomic_fetch_add_explicit(&handler_calls, 1, memory_order_relaxed);
    }
    errno = saved_errno;
}

/* The thread's wall timer fires once, `offset_ns` from now.  It is the kernel that signals the
 * thread then, whichever thread runs where: a signal sent by the collector itself would land
 * when the collector got a core, which on a machine with few cores is mostly when the thread
 * it samples has just given its own up (measured: a thread busy 20% of the time was caught
 * busy 3% of the time), so busy code would be under-counted in the wall profile. */
static int
schedule_wall_sample(ThreadSlot *s, int index, uint64_t offset_ns)
{
    if (!s->has_wall_timer) {
        if (thread_timer(s, CLOCK_MONOTONIC, WALL_MAGIC, index, &s->wall_timer) != 0)
            return -1;
        s->has_wall_timer = 1;
    }
    struct itimerspec spec;
    memset(&spec, 0, sizeof spec);
    spec.it_value.tv_sec = (time_t)(offset_ns / 1000000000ull);
    spec.it_value.tv_nsec = (long)(offset_ns % 1000000000ull);
    return timer_settime(s->wall_timer, 0, &spec, NULL);
}

static int
ask_for_sample(pid_t tid, int index)
{
    siginfo_t si;
    memset(&si, 0, sizeof si);
    si.si_signo = SIGPROF;
    si.si_code = SI_QUEUE;
    si.si_pid = getpid();
    si.si_uid = getuid();
    si.si_value.sival_int = WALL_MAGIC | index;
    return (int)syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, SIGPROF, &si);
}
#endif

/* ---------------------------------------------------------------- windows */

/* What was sampled during one upload window, aggregated without Python (the collector thread
 * never takes the GIL): stacks interned by content, samples summed by (kind, thread, labels,
 * stack).  Python turns a finished window into a dict when it next gets the GIL. */
typedef struct {
    uint64_t hash;
    uint32_t first; /* its frames are frames[first .. first + depth) */
    uint32_t depth;
} StackRec;

typedef struct {
    uint64_t ident;
    uint64_t labels[5];
    uint64_t value;
    uint32_t stack;
    uint32_t kind;
} SampleRec;

typedef struct Window {
    uint64_t start_ns, end_ns; /* wall clock */
    RawFrame *frames;
    size_t n_frames, cap_frames;
    StackRec *stacks;
    size_t n_stacks, cap_stacks;
    uint32_t *stack_index; /* open addressing: stack number + 1 */
    size_t stack_index_size;
    SampleRec *samples;
    size_t n_samples, cap_samples;
    uint32_t *sample_index;
    size_t sample_index_size;
    size_t pinned; /* stacks whose code objects pin() has taken references to */
    size_t bytes;
    struct Window *next;
} Window;

static Window *current;          /* being filled, under threads_mutex */
static Window *done_head, *done_tail;
static int n_done;
static size_t window_bytes;      /* all windows together, bounded by MAX_WINDOW_BYTES */
static _Atomic uint64_t windows_dropped;
static uint64_t window_ns;       /* upload interval */
static uint64_t window_deadline; /* monotonic */

static Window *
window_new(void)
{
    Window *w = calloc(1, sizeof *w);
    if (w != NULL)
        w->start_ns = realtime_ns();
    return w;
}

static void
window_free(Window *w)
{
    if (w == NULL)
        return;
    window_bytes -= w->bytes;
    free(w->frames);
    free(w->stacks);
    free(w->stack_index);
    free(w->samples);
    free(w->sample_index);
    free(w);
}

/* Grows *array to hold `need` items; counts the bytes against the windows' bound. */
static int
grow(Window *w, void **array, size_t *cap, size_t need, size_t item, int zero)
{
    if (need <= *cap)
        return 0;
    size_t new_cap = *cap ? *cap * 2 : 64;
    while (new_cap < need)
        new_cap *= 2;
    size_t added = (new_cap - *cap) * item;
    if (window_bytes + added > MAX_WINDOW_BYTES)
        return -1;
    void *p = realloc(*array, new_cap * item);
    if (p == NULL)
        return -1;
    if (zero)
        memset((char *)p + *cap * item, 0, added);
    *array = p;
    *cap = new_cap;
    w->bytes += added;
    window_bytes += added;
    return 0;
}

static int
rehash(Window *w, uint32_t **index, size_t *size, size_t count, int stacks)
{
    size_t new_size = *size ? *size * 2 : 256;
    size_t bytes = new_size * sizeof(uint32_t);
    if (window_bytes + bytes > MAX_WINDOW_BYTES)
        return -1;
    uint32_t *fresh = calloc(new_size, sizeof(uint32_t));
    if (fresh == NULL)
        return -1;
    for (size_t n = 0; n < count; n++) {
        uint64_t h;
        if (stacks) {
            h = w->stacks[n].hash;
        } else {
            const SampleRec *r = &w->samples[n];
            h = mix64(r->ident ^ mix64(r->stack + ((uint64_t)r->kind << 32)) ^ mix64(r->labels[0]) ^
                      mix64(r->labels[4] + r->labels[2]));
        }
        size_t i = h & (new_size - 1);
        while (fresh[i] != 0)
            i = (i + 1) & (new_size - 1);
        fresh[i] = (uint32_t)n + 1;
    }
    window_bytes -= *size * sizeof(uint32_t);
    w->bytes -= *size * sizeof(uint32_t);
    free(*index);
    *index = fresh;
    *size = new_size;
    window_bytes += bytes;
    w->bytes += bytes;
    return 0;
}

static inline uint64_t
sample_hash(uint64_t ident, uint32_t stack, uint32_t kind, const uint64_t *labels)
{
    return mix64(ident ^ mix64(stack + ((uint64_t)kind << 32)) ^ mix64(labels[0]) ^
                 mix64(labels[4] + labels[2]));
}

/* The number of this stack in w, interned; -1 when the window is at its bound. */
static int64_t
intern_stack(Window *w, const RawFrame *frames, int depth)
{
    uint64_t h = 0x9e3779b97f4a7c15ull + (uint64_t)depth;
    for (int i = 0; i < depth; i++)
        h = mix64(h ^ frames[i].code ^ ((uint64_t)frames[i].lasti << 40) ^ frames[i].fingerprint);
    if (w->n_stacks + 1 > w->stack_index_size / 2 &&
        rehash(w, &w->stack_index, &w->stack_index_size, w->n_stacks, 1) < 0)
        return -1;
    size_t mask = w->stack_index_size - 1;
    size_t i = h & mask;
    for (; w->stack_index[i] != 0; i = (i + 1) & mask) {
        const StackRec *s = &w->stacks[w->stack_index[i] - 1];
        if (s->hash == h && s->depth == (uint32_t)depth &&
            memcmp(&w->frames[s->first], frames, (size_t)depth * sizeof(RawFrame)) == 0)
            return w->stack_index[i] - 1;
    }
    if (grow(w, (void **)&w->frames, &w->cap_frames, w->n_frames + (size_t)depth,
             sizeof(RawFrame), 0) < 0 ||
        grow(w, (void **)&w->stacks, &w->cap_stacks, w->n_stacks + 1, sizeof(StackRec), 0) < 0)
        return -1;
    memcpy(&w->frames[w->n_frames], frames, (size_t)depth * sizeof(RawFrame));
    StackRec *s = &w->stacks[w->n_stacks];
    s->hash = h;
    s->first = (uint32_t)w->n_frames;
    s->depth = (uint32_t)depth;
    w->n_frames += (size_t)depth;
    w->stack_index[i] = (uint32_t)++w->n_stacks;
    return (int64_t)w->n_stacks - 1;
}

static int
window_add(Window *w, uint32_t kind, uint64_t ident, const uint64_t *labels,
           const RawFrame *frames, int depth, uint64_t value)
{
    int64_t stack = intern_stack(w, frames, depth);
    if (stack < 0)
        return -1;
    if (w->n_samples + 1 > w->sample_index_size / 2 &&
        rehash(w, &w->sample_index, &w->sample_index_size, w->n_samples, 0) < 0)
        return -1;
    uint64_t h = sample_hash(ident, (uint32_t)stack, kind, labels);
    size_t mask = w->sample_index_size - 1;
    size_t i = h & mask;
    for (; w->sample_index[i] != 0; i = (i + 1) & mask) {
        SampleRec *r = &w->samples[w->sample_index[i] - 1];
        if (r->stack == (uint32_t)stack && r->kind == kind && r->ident == ident &&
            memcmp(r->labels, labels, sizeof r->labels) == 0) {
            r->value += value;
            return 0;
        }
    }
    if (grow(w, (void **)&w->samples, &w->cap_samples, w->n_samples + 1, sizeof(SampleRec), 0) < 0)
        return -1;
    SampleRec *r = &w->samples[w->n_samples];
    r->ident = ident;
    memcpy(r->labels, labels, sizeof r->labels);
    r->value = value;
    r->stack = (uint32_t)stack;
    r->kind = kind;
    w->sample_index[i] = (uint32_t)++w->n_samples;
    return 0;
}

static void
add_or_count(uint32_t kind, uint64_t ident, const uint64_t *labels, const RawFrame *frames,
             int depth, uint64_t value)
{
    if (current == NULL || window_add(current, kind, ident, labels, frames, depth, value) < 0)
        atomic_fetch_add(&lost_samples, 1);
}

/* Under threads_mutex: the window being filled becomes a finished one. */
static void
finish_window(void)
{
    Window *fresh = window_new();
    if (fresh == NULL)
        return; /* keep filling the old one */
    Window *w = current;
    w->end_ns = fresh->start_ns;
    current = fresh;
    if (done_tail != NULL)
        done_tail->next = w;
    else
        done_head = w;
    done_tail = w;
    n_done++;
    /* Python has not come for them (it is starved, or the server is away and the uploader
     * full): the oldest go, counted. */
    while (n_done > MAX_DONE_WINDOWS) {
        Window *old = done_head;
        done_head = old->next;
        if (done_head == NULL)
            done_tail = NULL;
        n_done--;
        window_free(old);
        atomic_fetch_add(&windows_dropped, 1);
    }
}

/* ---------------------------------------------------------------- the collector */

static void
keep_copy(WallCopy **where, const Entry *e)
{
    if (*where == NULL)
        *where = malloc(sizeof(WallCopy) + (size_t)max_depth * sizeof(RawFrame));
    WallCopy *c = *where;
    if (c == NULL)
        return;
    c->ident = e->ident;
    memcpy(c->labels, e->labels, sizeof c->labels);
    c->seq = e->seq;
    c->depth = e->depth;
    memcpy(c->frames, e->frames, (size_t)e->depth * sizeof(RawFrame));
}

/* Under threads_mutex: what the handlers recorded goes into the current window. */
static void
drain_ring(void)
{
    if (ring == NULL)
        return;
    /* From where the last drain stopped to the last position handed out: touching only those
     * entries (the ring is a megabyte; scanning it all each tick cost 0.5% of a core). */
    unsigned long end = atomic_load_explicit(&ring_pos, memory_order_acquire);
    if (end - drain_pos > RING_CAPACITY)
        drain_pos = end - RING_CAPACITY;
    for (; drain_pos != end; drain_pos++) {
        Entry *e = entry_at(drain_pos);
        int state = atomic_load_explicit(&e->state, memory_order_acquire);
        if (state != 2) {
            /* Being written, or about to be (its position was just taken): the next tick
             * reads it.  Unless the writer has been held up for long (a descheduled
             * thread), then the ring must go on: it is read on the next lap. */
            if (end - drain_pos < RING_CAPACITY / 2 && (state == 1 || end - drain_pos <= 8))
                break;
            continue;
        }
        if (e->cpu_ns) {
            add_or_count(KIND_CPU, e->ident, e->labels, e->frames, e->depth, e->cpu_ns);
            /* Kept, so that the CPU the thread uses after its last sample (it ends, or
             * sampling stops) goes where its CPU was going. */
            if (e->slot >= 0 && e->depth > 0)
                keep_copy(&slots[e->slot].last_cpu, e);
        }
        if (e->wall_ns && e->depth > 0) {
            add_or_count(KIND_WALL, e->ident, e->labels, e->frames, e->depth, e->wall_ns);
            /* Kept, so that while the thread does not run its wall time is charged here
             * without interrupting it. */
            if (e->slot >= 0)
                keep_copy(&slots[e->slot].last_wall, e);
        }
        atomic_store_explicit(&e->state, 0, memory_order_release);
    }
}

#ifdef HAVE_THREAD_TIMERS
static unsigned scan_generation;

/* Under threads_mutex: a slot (and a CPU timer) for every thread the process has, none for
 * threads gone.  Threads started through `threading` made theirs as they started. */
static void
scan_threads(void)
{
    DIR *dir = opendir("/proc/self/task");
    if (dir == NULL)
        return;
    unsigned mark = ++scan_generation;
    if (mark == 0)
        mark = ++scan_generation;
    struct dirent *d;
    while ((d = readdir(dir)) != NULL) {
        if (d->d_name[0] < '0' || d->d_name[0] > '9')
            continue;
        pid_t tid = (pid_t)atoi(d->d_name);
        if (tid <= 0 || is_excluded(tid))
            continue;
        int index = slot_for(tid, PY_UNKNOWN);
        if (index < 0)
            continue;
        ThreadSlot *s = &slots[index];
        s->scan_mark = mark;
        /* Once a second (a system call per thread): a timer of a thread that died, whose tid
         * another thread has now. */
        if (mark % 10 == 0 && s->has_timer && !timer_alive(s)) {
            /* The thread that had this tid died and another got the number. */
            disarm(s);
            atomic_store(&s->python, PY_UNKNOWN);
            if (s->last_wall != NULL)
                s->last_wall->depth = -1;
        }
#ifdef HAVE_PERF_EVENTS
        check_perf_signals(s);
#endif
        if (atomic_load(&s->python) != PY_NO)
            arm(s, index);
        else
            disarm(s);
    }
    closedir(dir);
    for (int k = n_used_slots - 1; k >= 0; k--) {
        int index = used_slots[k];
        if (k < n_used_slots && slots[index].scan_mark != mark)
            slot_release(index);
    }
}

/* Under threads_mutex.  Each Python thread's wall time since the last tick is charged to
 * where it is: a thread that ran since its last sample is asked (by signal) to take one, a
 * thread that did not (asleep, blocked) is charged at its last sample's stack again, which is
 * exact, because a thread that does not run cannot change its stack, and leaves idle threads
 * undisturbed. */
/* Returns when it next needs to run (monotonic ns). */
static uint64_t
wall_tick(uint64_t now_ns, uint64_t *random)
{
    /* Reading another thread's CPU clock is a system call (~1 us), and so is every wake-up of
     * this thread: a thread found idle again and again is looked at less often, at least every
     * 100 ms, and when all are idle the collector sleeps that long.  What a thread owes
     * meanwhile is charged at the check, still exactly when it has not run since. */
    uint64_t next_run = now_ns + IDLE_CHECK_NS;
    for (int k = 0; k < n_used_slots; k++) {
        int index = used_slots[k];
        ThreadSlot *s = &slots[index];
        pid_t tid = atomic_load(&s->tid);
        int python = atomic_load(&s->python);
        if (python == PY_NO && now_ns < s->next_probe_ns)
            continue;
        if (now_ns < s->next_check_ns) {
            if (s->next_check_ns < next_run)
                next_run = s->next_check_ns;
            continue;
        }
        uint64_t cpu;
        if (clock_ns(thread_clock(tid), &cpu) != 0)
            continue; /* gone: the next scan frees the slot */
        /* Late (a stopped process: SIGSTOP) is not all wall time. */
        uint64_t owed = now_ns - s->wall_since_ns;
        if (owed > MAX_WALL_PER_TICK_NS)
            owed = MAX_WALL_PER_TICK_NS;
        s->wall_since_ns = now_ns;
        if (cpu < s->cpu_at_tick) {
            /* Its clock went back: another thread has the tid now, and the timers made for
             * the old one signal nobody.  Start afresh (the next scan arms a CPU timer). */
            disarm(s);
            atomic_store(&s->python, PY_UNKNOWN);
            python = PY_UNKNOWN;
            s->idle_checks = 0;
            if (s->last_wall != NULL)
                s->last_wall->depth = -1;
        }
        if (python == PY_NO) {
            /* A thread without Python may get it later (PyGILState_Ensure): ask now and then. */
            s->next_probe_ns = now_ns + 1000000000ull;
            if (cpu > s->cpu_at_tick + REPEAT_CPU_NS)
                ask_for_sample(tid, index);
            s->cpu_at_tick = cpu;
            continue;
        }
        WallCopy *c = s->last_wall;
        int have_stack = c != NULL && c->depth > 0 && c->seq == atomic_load(&s->seq) &&
                         atomic_load(&s->pending_wall_ns) == 0;
        uint64_t at_sample = atomic_load_explicit(&s->cpu_at_sample_ns, memory_order_acquire);
        uint64_t ran = cpu - s->cpu_at_tick;
        /* Exact only if it did not run during the whole time charged, nor since the stack
         * was taken (which may be earlier, or inside that time). */
        int frozen = ran < REPEAT_CPU_NS && cpu < at_sample + REPEAT_CPU_NS;
        s->cpu_at_tick = cpu;
        if (frozen && have_stack) {
            add_or_count(KIND_WALL, c->ident, c->labels, c->frames, c->depth, owed);
            if (s->idle_checks < 1000)
                s->idle_checks++;
            uint64_t wait = (uint64_t)s->idle_checks * cpu_interval_ns;
            s->next_check_ns = now_ns + (wait < IDLE_CHECK_NS ? wait : IDLE_CHECK_NS);
            if (s->next_check_ns < next_run)
                next_run = s->next_check_ns;
            continue;
        }
        if (s->idle_checks > 0 && have_stack) {
            /* It woke while it was not looked at: all but the time it may have been running
             * (its CPU, at least one interval) goes where it had been waiting. */
            uint64_t recent = ran > cpu_interval_ns ? ran : cpu_interval_ns;
            if (owed > recent) {
                add_or_count(KIND_WALL, c->ident, c->labels, c->frames, c->depth, owed - recent);
                owed = recent;
            }
        }
        s->idle_checks = 0;
        s->next_check_ns = 0;
        next_run = now_ns; /* a running thread is looked at every interval */
        /* Where it is at a random moment of the next interval stands for this time. */
        atomic_fetch_add(&s->pending_wall_ns, owed);
        if (schedule_wall_sample(s, index, 1000 + next_random(random) % cpu_interval_ns) != 0)
            ask_for_sample(tid, index);
    }
    return next_run;
}

/* Under threads_mutex, after drain_ring: the CPU a thread used since its last CPU sample
 * (`cpu_now` is its clock now), charged to that sample's stack, or to `fallback` (depth
 * frames) when it has none.  Without this every thread would lose, on average, half an
 * interval as it ends and as sampling stops: with many short threads, percents. */
static void
charge_cpu_tail(ThreadSlot *s, uint64_t cpu_now, uint64_t ident, const uint64_t *labels,
                const RawFrame *fallback, int depth)
{
    uint64_t before = atomic_exchange(&s->cpu_charged_ns, cpu_now);
    if (before == 0 || cpu_now <= before || !cpu_on)
        return;
    uint64_t tail = cpu_now - before;
    WallCopy *c = s->last_cpu;
    if (c != NULL && c->depth > 0 && (ident == 0 || c->ident == ident))
        add_or_count(KIND_CPU, c->ident, c->labels, c->frames, c->depth, tail);
    else if (depth > 0 && ident != 0)
        add_or_count(KIND_CPU, ident, labels, fallback, depth, tail);
}

/* Under threads_mutex, as sampling stops: every thread's CPU since its last sample. */
static void
charge_cpu_tails(void)
{
    for (int k = 0; k < n_used_slots; k++) {
        ThreadSlot *s = &slots[used_slots[k]];
        uint64_t cpu;
        if (!s->has_timer || atomic_load(&s->python) != PY_YES ||
            clock_ns(thread_clock(atomic_load(&s->tid)), &cpu) != 0)
            continue;
        charge_cpu_tail(s, cpu, 0, NULL, NULL, 0);
    }
}

/* Under threads_mutex, as sampling stops: the wall time of threads not looked at lately
 * goes where they last were (they were idle when last looked at). */
static void
charge_owed(void)
{
    uint64_t now = monotonic_ns();
    for (int k = 0; k < n_used_slots; k++) {
        ThreadSlot *s = &slots[used_slots[k]];
        WallCopy *c = s->last_wall;
        /* And what a sample not taken yet would have stood for. */
        uint64_t owed = now - s->wall_since_ns + atomic_exchange(&s->pending_wall_ns, 0);
        if (c != NULL && c->depth > 0 && owed < 2 * MAX_WALL_PER_TICK_NS)
            add_or_count(KIND_WALL, c->ident, c->labels, c->frames, c->depth, owed);
        s->wall_since_ns = now;
    }
}

static pthread_t collector;
static pthread_cond_t collector_wake;
static int collector_started;
static _Atomic int collector_stop;
static uint64_t scan_every_ns = 100000000ull;

static void *
collector_main(void *unused)
{
    (void)unused;
    pid_t me = own_tid();
    pthread_setname_np(pthread_self(), "hotspan-native"); /* what `top -H` shows */
    pthread_mutex_lock(&threads_mutex);
    exclude_tid(me);
    uint64_t interval = cpu_interval_ns;
    uint64_t now = monotonic_ns(), next = now + interval, next_scan = now + scan_every_ns;
    uint64_t random = mix64(now ^ (uint64_t)me) | 1;
    while (!atomic_load(&collector_stop)) {
        struct timespec until = {(time_t)(next / 1000000000ull), (long)(next % 1000000000ull)};
        /* threads_mutex is released while it waits; stop() signals to end the wait. */
        while (!atomic_load(&collector_stop) &&
               pthread_cond_timedwait(&collector_wake, &threads_mutex, &until) == 0) {
        }
        if (atomic_load(&collector_stop))
            break;
        now = monotonic_ns();
        if (now >= next_scan) {
            scan_threads();
            next_scan = now + scan_every_ns;
        }
        drain_ring();
        uint64_t wanted = wall_on ? wall_tick(now, &random) : now + IDLE_CHECK_NS;
        if (window_ns && now >= window_deadline) {
            finish_window();
            window_deadline = now + window_ns;
        }
        if (wanted > next_scan)
            wanted = next_scan;
        if (window_ns && wanted > window_deadline)
            wanted = window_deadline;
        /* On the interval grid while threads run (a late tick does not shift the next). */
        next += interval;
        if (next < now)
            next = now + interval;
        if (wanted > next)
            next = wanted;
    }
    pthread_mutex_unlock(&threads_mutex);
    return NULL;
}

static int
start_collector(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&collector_wake, &attr);
    pthread_condattr_destroy(&attr);
    sigset_t all, old;
    sigfillset(&all);
    /* The thread inherits this mask: no signal meant for the program lands on it (a SIGINT
     * must interrupt the main thread's sleep, not ours). */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    atomic_store(&collector_stop, 0);
    int rc = pthread_create(&collector, NULL, collector_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    collector_started = rc == 0;
    return rc;
}

static void
stop_collector(void)
{
    if (!collector_started)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&threads_mutex);
    atomic_store(&collector_stop, 1);
    pthread_cond_signal(&collector_wake);
    pthread_mutex_unlock(&threads_mutex);
    pthread_join(collector, NULL);
    Py_END_ALLOW_THREADS
    collector_started = 0;
}
#endif

/* Takes threads_mutex without holding up every Python thread while the collector has it. */
static void
lock_threads(void)
{
    if (pthread_mutex_trylock(&threads_mutex) == 0)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&threads_mutex);
    Py_END_ALLOW_THREADS
}

/* ---------------------------------------------------------------- code registry */

/* Code objects referenced by samples, kept alive so their address cannot be reused before the
 * agent has named them. */
static uint64_t *code_set;
static unsigned code_set_count;
static PyObject *code_refs; /* list */

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
#if PY_VERSION_HEX >= 0x030E0000 && SIZEOF_VOID_P > 4 && !PY_BIG_ENDIAN
    /* Count, then overflow (0 short of four billion references), then a few flag bits. */
    return (uint32_t)word != 0 && ((word >> 32) & 0xFFFF) == 0 && (word >> 48) < 0x100;
#else
    return word < ((uint64_t)1 << 40) && (int64_t)word > 0;
#endif
}

/* With the GIL (so that no code object is freed meanwhile).  A frame recorded by a signal
 * handler points at a code object that was alive then; by now it may have been freed (its
 * memory unmapped, or reused).  1 if the pointer still is a code object with the same
 * fingerprint, read safely, and now referenced by code_refs. */
static int
code_valid(const RawFrame *frame)
{
    uint64_t ptr = frame->code;
    if (ptr == 0)
        return 0;
    if (code_known(ptr))
        return 1;
    PyCodeObject copy;
    const PyCodeObject *code = (const PyCodeObject *)(uintptr_t)ptr;
    return safe_read(code, &copy, sizeof copy) == 0 && Py_TYPE(&copy) == &PyCode_Type &&
           plausible_header(code, &copy) &&
           code_fingerprint(&copy) == frame->fingerprint && code_register((PyObject *)code);
}

/* With the GIL and threads_mutex: references to the code objects of stacks new in w, so that
 * they stay what the samples saw until the window is sent. */
static void
pin_window(Window *w)
{
    for (; w->pinned < w->n_stacks; w->pinned++) {
        const StackRec *s = &w->stacks[w->pinned];
        for (uint32_t i = 0; i < s->depth; i++)
            (void)code_valid(&w->frames[s->first + i]);
    }
}

/* With the GIL: {(kind, ident, l0..l4, frames bytes): ns} of a detached window. */
static PyObject *
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
        PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(s->depth * sizeof(RawFrame)));
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
        PyObject *key = Py_BuildValue(
            "(IKKKKKKO)", r->kind, (unsigned long long)r->ident, (unsigned long long)r->labels[0],
            (unsigned long long)r->labels[1], (unsigned long long)r->labels[2],
            (unsigned long long)r->labels[3], (unsigned long long)r->labels[4], stacks[r->stack]);
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

/* ---------------------------------------------------------------- module functions */

static PyObject *
sampler_start(PyObject *mod, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cpu_interval_ns", "max_depth", "cpu", "wall", "window_ns", NULL};
    unsigned long long interval, window = 0;
    int depth, cpu, wall = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Kip|pK", kwlist, &interval, &depth, &cpu,
                                     &wall, &window))
        return NULL;
    if (depth < 1 || depth > 1000 || interval < 1000000ull) {
        PyErr_SetString(PyExc_ValueError, "max_depth must be 1..1000 and the interval >= 1 ms");
        return NULL;
    }
    if (running) {
        PyErr_SetString(PyExc_RuntimeError, "the sampler is already running");
        return NULL;
    }
#ifndef HAVE_THREAD_TIMERS
    PyErr_SetString(PyExc_RuntimeError, "per-thread CPU timers need Linux");
    return NULL;
#else
    {
        clockid_t mine;
        if (pthread_getcpuclockid(pthread_self(), &mine) != 0 || mine != thread_clock(own_tid())) {
            PyErr_SetString(PyExc_RuntimeError, "this kernel encodes thread CPU clocks unknownly");
            return NULL;
        }
    }
    size_t size = sizeof(Entry) + (size_t)depth * sizeof(RawFrame);
    size = (size + 63) & ~(size_t)63;
    /* A ring from an earlier run may still be written by a late signal, so it is never freed:
     * reused when its entries fit, else left behind (only when max_depth changed). */
    if (ring == NULL || size != entry_size) {
        ring = NULL;
        entry_size = size;
        ring = PyMem_RawCalloc(RING_CAPACITY, entry_size);
    } else {
        for (size_t i = 0; i < RING_CAPACITY; i++)
            atomic_store(&entry_at(i)->state, 0);
    }
    drain_pos = atomic_load(&ring_pos);
    Py_CLEAR(code_refs);
    PyMem_RawFree(code_set);
    code_set = PyMem_RawCalloc((size_t)1 << CODE_SET_BITS, sizeof(uint64_t));
    code_refs = PyList_New(0);
    if (ring == NULL || code_set == NULL || code_refs == NULL) {
        PyMem_RawFree(code_set);
        code_set = NULL;
        Py_CLEAR(code_refs);
        return PyErr_NoMemory();
    }
    code_set_count = 0;
    struct sigaction current_action;
    if (handler_installed && sigaction(SIGPROF, NULL, &current_action) == 0 &&
        current_action.sa_sigaction != on_signal)
        handler_installed = 0; /* replaced since (the pure-Python sampler's, say) */
    if (!handler_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_signal;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
        sigemptyset(&sa.sa_mask);
#ifdef HAVE_PERF_EVENTS
        sigaddset(&sa.sa_mask, PERF_SIGNAL); /* one sample at a time on a thread */
#endif
        if (sigaction(SIGPROF, &sa, &previous_action) != 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            return NULL;
        }
        handler_installed = 1;
    }
    pthread_mutex_lock(&threads_mutex);
    max_depth = depth;
    cpu_interval_ns = interval;
    cpu_on = cpu;
    wall_on = wall;
    window_ns = window;
    window_deadline = monotonic_ns() + window;
    n_excluded = 0; /* the tids of an earlier agent's threads may belong to new threads now */
    reset_threads();
#ifdef HAVE_PERF_EVENTS
    const char *trigger = getenv("HOTSPAN_CPU_TRIGGER");
    /* A task-clock event is switched in and out with its thread, an hrtimer armed and
     * cancelled at every context switch, and the threads of a threaded server, handing the
     * GIL to each other, switch tens of thousands of times a second (+2-4% of its time with
     * an event each, bench/results/agent-defaults.md).  So by default only the main thread,
     * where a CPU-bound program or an event loop runs, gets one; "perf": every thread;
     * "timer": none. */
    perf_state = trigger != NULL && strcmp(trigger, "timer") == 0 ? PERF_OFF : PERF_UNTRIED;
    perf_main_only = trigger == NULL || strcmp(trigger, "perf") != 0;
    if (perf_state != PERF_OFF && install_perf_handler() != 0)
        perf_state = PERF_OFF;
#endif
    while (done_head != NULL) {
        Window *w = done_head;
        done_head = w->next;
        window_free(w);
    }
    done_tail = NULL;
    n_done = 0;
    window_free(current);
    current = window_new();
    atomic_store(&lost_samples, 0);
    atomic_store(&unreadable_stacks, 0);
    atomic_store(&windows_dropped, 0);
    atomic_store(&sampling_enabled, 1);
    scan_threads();
    pthread_mutex_unlock(&threads_mutex);
    if (current == NULL || start_collector() != 0) {
        atomic_store(&sampling_enabled, 0);
        PyErr_SetString(PyExc_RuntimeError, "could not start the collector thread");
        return NULL;
    }
    running = 1;
    return PyBool_FromLong(cpu);
#endif
}

static void
disarm_all(void)
{
#ifdef HAVE_THREAD_TIMERS
    for (int k = 0; k < n_used_slots; k++)
        disarm(&slots[used_slots[k]]);
#endif
}

static PyObject *
sampler_stop(PyObject *mod, PyObject *unused)
{
    if (!running)
        Py_RETURN_NONE;
#ifdef HAVE_THREAD_TIMERS
    stop_collector();
#endif
    lock_threads();
    disarm_all();
    /* What the handlers recorded so far belongs to the last window: keep it for collect(). */
    drain_ring();
#ifdef HAVE_THREAD_TIMERS
    charge_cpu_tails();
    charge_owed();
#endif
    atomic_store(&sampling_enabled, 0);
    running = 0;
    pthread_mutex_unlock(&threads_mutex);
    /* The handler stays installed: a signal already queued for a thread must not meet the
     * default SIGPROF action, which kills the process.  Disabled, it returns at once.  The
     * ring is kept for the same reason (a late handler may still be writing to it). */
    Py_RETURN_NONE;
}

static PyObject *
sampler_pin(PyObject *mod, PyObject *unused)
{
    if (code_set == NULL)
        Py_RETURN_NONE;
    lock_threads();
    if (current != NULL)
        pin_window(current);
    for (Window *w = done_head; w != NULL; w = w->next)
        pin_window(w);
    pthread_mutex_unlock(&threads_mutex);
    Py_RETURN_NONE;
}

/* Returns ([(start_ns, end_ns, samples dict), ...], code objects list, lost samples) for the
 * finished windows; with `final`, the one being filled too.  The code list keeps every code
 * object the samples point at alive; with `release_codes` the sampler forgets them (the
 * caller drops the list once it has named them). */
static PyObject *
sampler_collect(PyObject *mod, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"final", "release_codes", NULL};
    int final = 0, release_codes = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|pp", kwlist, &final, &release_codes))
        return NULL;
    if (code_set == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the sampler was never started");
        return NULL;
    }
    lock_threads();
    if (final) {
        drain_ring();
        if (current != NULL && (current->n_samples > 0 || done_head == NULL))
            finish_window();
    }
    Window *taken = done_head;
    done_head = done_tail = NULL;
    n_done = 0;
    /* Codes are let go only once they are named, that is with a window to name them in. */
    release_codes = release_codes && taken != NULL;
    if (release_codes && current != NULL)
        current->pinned = 0; /* its codes are let go below: pin them again */
    pthread_mutex_unlock(&threads_mutex);

    PyObject *windows = PyList_New(0);
    int failed = windows == NULL;
    while (taken != NULL) {
        Window *w = taken;
        taken = w->next;
        if (!failed) {
            PyObject *samples = window_dict(w);
            PyObject *item = samples ? Py_BuildValue("(KKN)", (unsigned long long)w->start_ns,
                                                     (unsigned long long)w->end_ns, samples)
                                     : NULL;
            if (item == NULL || PyList_Append(windows, item) < 0)
                failed = 1;
            Py_XDECREF(item);
        }
        pthread_mutex_lock(&threads_mutex); /* window_bytes is shared with the collector */
        window_free(w);
        pthread_mutex_unlock(&threads_mutex);
    }
    if (failed) {
        Py_XDECREF(windows);
        return NULL;
    }
    PyObject *codes = code_refs;
    if (release_codes) {
        PyObject *empty = PyList_New(0);
        if (empty == NULL) {
            Py_DECREF(windows);
            return NULL;
        }
        code_refs = empty;
        memset(code_set, 0, ((size_t)1 << CODE_SET_BITS) * sizeof(uint64_t));
        code_set_count = 0;
    } else {
        Py_INCREF(codes);
    }
    uint64_t lost = atomic_exchange(&lost_samples, 0);
    return Py_BuildValue("(NNK)", windows, codes, (unsigned long long)lost);
}

static PyObject *
sampler_exclude(PyObject *mod, PyObject *args)
{
    unsigned long ident;
    if (!PyArg_ParseTuple(args, "k", &ident))
        return NULL;
#ifdef HAVE_THREAD_TIMERS
    clockid_t clock;
    if (pthread_getcpuclockid((pthread_t)ident, &clock) != 0)
        Py_RETURN_NONE;
    pid_t tid = (pid_t)~(clock >> 3);
    lock_threads();
    exclude_tid(tid);
    pthread_mutex_unlock(&threads_mutex);
#endif
    Py_RETURN_NONE;
}

/* Called by a thread as it starts (before it runs anything) and as it ends, so that its CPU
 * timer covers all of its life however short, and is gone with it. */
static PyObject *
sampler_register_thread(PyObject *mod, PyObject *unused)
{
#ifdef HAVE_THREAD_TIMERS
    if (!running)
        Py_RETURN_NONE;
    pid_t tid = own_tid();
    lock_threads();
    if (running && !is_excluded(tid)) {
        int index = slot_for(tid, PY_YES);
        if (index >= 0) {
            ThreadSlot *s = &slots[index];
            atomic_store(&s->python, PY_YES);
            s->scan_mark = scan_generation;
            arm(s, index);
            /* The collector may be asleep for 100 ms (all threads idle): a new thread is
             * looked at on its next interval. */
            pthread_cond_signal(&collector_wake);
        }
    }
    pthread_mutex_unlock(&threads_mutex);
#endif
    Py_RETURN_NONE;
}

/* unregister_thread(code=None).  The kernel checks CPU timers only at its scheduler tick (4 ms
 * at HZ=250): a thread that ends soon after its timer expired never gets that signal, and
 * every thread ends with CPU its samples do not cover yet (half an interval on average; a
 * pool of short threads would lose percents).  That CPU is charged here, to the stack of the
 * thread's last CPU sample, or, for a thread that had none, to `code` (the function the
 * thread ran: its own frames are gone by now) or else to where it is. */
static PyObject *
sampler_unregister_thread(PyObject *mod, PyObject *args)
{
    PyObject *code = Py_None;
    if (!PyArg_ParseTuple(args, "|O", &code))
        return NULL;
#ifdef HAVE_THREAD_TIMERS
    if (!running)
        Py_RETURN_NONE;
    pid_t tid = own_tid();
    lock_threads();
    int index = tid_map_get(tid);
    if (index >= 0) {
        ThreadSlot *s = &slots[index];
        PyThreadState *ts = PyThreadState_Get();
        uint64_t cpu_now = 0;
        int tail = s->has_timer && clock_ns(CLOCK_THREAD_CPUTIME_ID, &cpu_now) == 0 &&
                   cpu_now > atomic_load(&s->cpu_charged_ns);
        /* Its wall time since it was last looked at, and what its last sample would have
         * stood for, likewise (a thread of a few ms may end before it is looked at). */
        uint64_t wall = atomic_exchange(&s->pending_wall_ns, 0);
        if (wall_on && s->wall_since_ns != 0)
            wall += monotonic_ns() - s->wall_since_ns;
        if (tail || wall > 0) {
            RawFrame frames[1];
            uint64_t labels[5];
            int depth = 0;
            if (PyCode_Check(code)) {
                frames[0].code = (uint64_t)(uintptr_t)code;
                frames[0].lasti = 0;
                frames[0].fingerprint = code_fingerprint((PyCodeObject *)code);
                depth = 1;
            } else {
                depth = walk_frames(ts, frames, 1);
                if (depth < 0)
                    depth = 0;
            }
            copy_labels(find_labels(thread_context(ts)), labels);
            if (tail) {
                /* Its last samples may still be in the ring. */
                drain_ring();
                charge_cpu_tail(s, cpu_now, (uint64_t)ts->thread_id, labels, frames, depth);
            }
            if (wall > 0 && depth > 0)
                add_or_count(KIND_WALL, (uint64_t)ts->thread_id, labels, frames, depth, wall);
        }
        slot_release(index);
    }
    pthread_mutex_unlock(&threads_mutex);
#endif
    Py_RETURN_NONE;
}

static PyObject *
sampler_stats(PyObject *mod, PyObject *unused)
{
    lock_threads();
    int threads = n_used_slots, timers = 0, python = 0;
    for (int k = 0; k < n_used_slots; k++) {
        timers += slots[used_slots[k]].has_timer;
        python += atomic_load(&slots[used_slots[k]].python) == PY_YES;
    }
    size_t bytes = window_bytes;
    int pending = n_done;
    const char *trigger = cpu_trigger_name();
    pthread_mutex_unlock(&threads_mutex);
    return Py_BuildValue("{s:s,s:i,s:i,s:i,s:n,s:i,s:K,s:K,s:K,s:K,s:K}", "cpu_trigger", trigger,
                         "threads", threads, "timers", timers,
                         "python_threads", python, "window_bytes", (Py_ssize_t)bytes,
                         "windows_pending", pending, "lost_samples",
                         (unsigned long long)atomic_load(&lost_samples), "windows_dropped",
                         (unsigned long long)atomic_load(&windows_dropped),
                         "unreadable_stacks",
                         (unsigned long long)atomic_load(&unreadable_stacks), "handler_ns",
                         (unsigned long long)atomic_load(&handler_ns), "handler_signals",
                         (unsigned long long)atomic_load(&handler_calls));
}

static PyObject *
sampler_after_fork(PyObject *mod, PyObject *unused)
{
    /* In the child only this thread exists: no collector, no timers (they are not inherited),
     * a mutex possibly held by the parent's collector, and ring entries a vanished thread was
     * writing would stay busy. */
    atomic_store(&sampling_enabled, 0);
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    threads_mutex = fresh;
#ifdef HAVE_THREAD_TIMERS
    collector_started = 0;
#endif
    running = 0;
    n_excluded = 0;
    reset_threads();
    if (ring != NULL) {
        for (size_t i = 0; i < RING_CAPACITY; i++)
            atomic_store(&entry_at(i)->state, 0);
    }
    drain_pos = atomic_load(&ring_pos);
    /* The parent's windows are the parent's to send; their memory is simply left. */
    current = NULL;
    done_head = done_tail = NULL;
    n_done = 0;
    window_bytes = 0;
    PyMem_RawFree(code_set);
    code_set = NULL;
    Py_CLEAR(code_refs);
    Py_RETURN_NONE;
}

static PyObject *
sampler_enable_labels(PyObject *mod, PyObject *args)
{
    /* Node types learned from real HAMTs built by the caller: (var, bitmap-rooted context,
     * array-rooted context).  Lookup is enabled only if both find the var's value. */
    PyObject *var, *small_ctx, *big_ctx;
    if (!PyArg_ParseTuple(args, "OOO", &var, &small_ctx, &big_ctx))
        return NULL;
    if (!PyContext_CheckExact(small_ctx) || !PyContext_CheckExact(big_ctx)) {
        PyErr_SetString(PyExc_TypeError, "contexts expected");
        return NULL;
    }
    labels_lookup_ok = 0;
    PyObject *small_root = ((HamtMirror *)((CtxMirror *)small_ctx)->ctx_vars)->h_root;
    PyObject *big_root = ((HamtMirror *)((CtxMirror *)big_ctx)->ctx_vars)->h_root;
    if (small_root == NULL || big_root == NULL)
        Py_RETURN_FALSE;
    bitmap_node_type = Py_TYPE(small_root);
    array_node_type = Py_TYPE(big_root);
    if (bitmap_node_type == array_node_type)
        Py_RETURN_FALSE;
    Py_XSETREF(labels_var, Py_NewRef(var));
    Py_hash_t h = PyObject_Hash(var);
    if (h == -1)
        return NULL;
#if SIZEOF_PY_HASH_T > 4
    int32_t folded = (int32_t)(h & 0xffffffffl) ^ (int32_t)(h >> 32);
    labels_var_hash = folded == -1 ? -2 : folded;
#else
    labels_var_hash = (int32_t)h;
#endif
    labels_lookup_ok = 1;
    Py_RETURN_TRUE;
}

static PyObject *
sampler_find_in(PyObject *mod, PyObject *ctx)
{
    if (!PyContext_CheckExact(ctx)) {
        PyErr_SetString(PyExc_TypeError, "a contextvars.Context expected");
        return NULL;
    }
    LabelsObject *found = find_labels(ctx);
    if (found == NULL)
        Py_RETURN_NONE;
    return Py_NewRef((PyObject *)found);
}


/* ---------------------------------------------------------------- span stats
 *
 * What a span cost, as attributes set at the detach of a span the linker made current.  Two
 * modes, because the SDK's set_attributes costs several microseconds a call:
 *
 * - By default (span_stats off) nothing is measured at attach, and at detach only a span that
 *   saw a garbage collection on its thread, or an allocation sample, gets its figures
 *   (most spans see neither, and pay two loads):
 *   - hotspan.gc.pause_ns, hotspan.gc.collections: the collections that ran on the span's
 *     thread (its task, in an asyncio loop) while its labels were current (gc_callback
 *     charges each pause to the labels current where it ran), its children's included;
 *   - hotspan.alloc_bytes: the allocation sampler's estimate of the bytes allocated with the
 *     span's labels current (Labels.alloc_bytes, added through the capsule API), while one
 *     runs.
 *   The span's CPU is in its CPU samples, which carry its span id: the server sums them.
 * - With span_stats on, every span also gets:
 *   - hotspan.cpu_time_ns: on a thread without a running asyncio loop, the thread's CPU clock
 *     at detach minus at attach (exact).  Inside a running loop, where tasks interleave on
 *     the thread, the CPU of the samples taken with the span's labels current (Labels.cpu_ns,
 *     added by the signal handler): each task runs in its own context, so that is the task's
 *     own, within a sample's CPU.
 *   - at a local root span: process.memory.usage (RSS bytes), process.thread.count
 *     (OpenTelemetry semantic-convention names) and hotspan.process.heap_objects
 *     (sys.getallocatedblocks()), read at most every PROCESS_STATS_TTL_NS.
 *
 * A child's figures are also added to the labels current after its detach (its parent's)
 * when they are of the same trace, so a span's figures include its children's, as a
 * profile's total does. */

static uint64_t gc_started_ns;    /* the collection running now (with the GIL) */
static int alloc_sampling;         /* an allocation sampler is running (capsule API) */

static PyObject *
sampler_gc_callback(PyObject *mod, PyObject *args)
{
    (void)mod;
    PyObject *phase, *info;
    if (!PyArg_UnpackTuple(args, "gc_callback", 2, 2, &phase, &info))
        return NULL;
    if (!PyUnicode_Check(phase))
        Py_RETURN_NONE;
    /* "start" and "stop": compared by their first letters, the rest is CPython's promise. */
    Py_UCS4 first = PyUnicode_GET_LENGTH(phase) > 2 ? PyUnicode_READ_CHAR(phase, 2) : 0;
    if (first == 'a') {
        __atomic_store_n(&gc_started_ns, monotonic_ns(), __ATOMIC_RELAXED);
    } else if (first == 'o') {
        uint64_t started = __atomic_exchange_n(&gc_started_ns, 0, __ATOMIC_RELAXED);
        uint64_t now = monotonic_ns();
        if (started != 0 && now >= started) {
            /* The collection ran on this thread, inside whatever its context has current. */
            PyThreadState *ts = PyThreadState_Get();
            LabelsObject *labels = find_labels(thread_context(ts));
            if (labels != NULL && labels->span_id)
                labels_charge_gc(labels, now - started, 1);
        }
    }
    Py_RETURN_NONE;
}

#define PROCESS_STATS_TTL_NS 10000000ull /* 10 ms: a root span per request costs one read */
static uint64_t process_stats_at_ns;
static long long process_rss = -1, process_threads = -1, process_heap = -1;

/* With the GIL: RSS bytes, threads and allocated blocks (-1 where unknown), cached briefly. */
static void
process_stats(long long *rss, long long *threads, long long *heap)
{
    uint64_t now = monotonic_ns();
    if (process_stats_at_ns == 0 || now - process_stats_at_ns > PROCESS_STATS_TTL_NS) {
        process_stats_at_ns = now;
        process_rss = process_threads = -1;
#ifdef __linux__
        char buf[1024];
        int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t n = read(fd, buf, sizeof buf - 1);
            close(fd);
            char *p = n > 0 ? (buf[n] = 0, strrchr(buf, ')')) : NULL;
            /* Fields from the third (state) on, after the command's closing parenthesis. */
            for (int field = 2; p != NULL && *p; field++) {
                p = strchr(p, ' ');
                if (p == NULL)
                    break;
                p++;
                if (field + 1 == 20)
                    process_threads = strtoll(p, NULL, 10);
                if (field + 1 == 24) {
                    process_rss = strtoll(p, NULL, 10) * (long long)sysconf(_SC_PAGESIZE);
                    break;
                }
            }
        }
#endif
        process_heap = -1;
        PyObject *blocks = PySys_GetObject("getallocatedblocks"); /* borrowed */
        PyObject *r = blocks != NULL ? PyObject_CallNoArgs(blocks) : NULL;
        if (r != NULL)
            process_heap = PyLong_AsLongLong(r);
        Py_XDECREF(r);
        if (PyErr_Occurred())
            PyErr_Clear();
    }
    *rss = process_rss;
    *threads = process_threads;
    *heap = process_heap;
}

static PyObject *
sampler_process_stats(PyObject *mod, PyObject *unused)
{
    (void)mod; (void)unused;
    long long rss, threads, heap;
    process_stats(&rss, &threads, &heap);
    return Py_BuildValue("(LLL)", rss, threads, heap);
}

static PyObject *str_asyncio_events, *str_get_running_loop;
static PyObject *get_running_loop; /* asyncio.events._get_running_loop, once imported */

/* Whether this thread runs an asyncio loop now (never raises). */
static int
in_running_loop(void)
{
    if (get_running_loop == NULL) {
        PyObject *events = PyImport_GetModule(str_asyncio_events);
        if (events == NULL) {
            PyErr_Clear();
            return 0; /* asyncio not imported: no loop */
        }
        get_running_loop = PyObject_GetAttr(events, str_get_running_loop);
        Py_DECREF(events);
        if (get_running_loop == NULL) {
            PyErr_Clear();
            return 0;
        }
    }
    PyObject *loop = PyObject_CallNoArgs(get_running_loop);
    if (loop == NULL) {
        PyErr_Clear();
        return 0;
    }
    int running = loop != Py_None;
    Py_DECREF(loop);
    return running;
}

/* At attach, with span_stats on: where the span's CPU starts. */
static void
stats_begin(LabelsObject *labels)
{
    uint64_t cpu;
    if (!in_running_loop() && clock_ns(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
        labels->attach_cpu_ns = cpu;
        labels->stats = STATS_THREAD;
    } else {
        labels->stats = STATS_LOOP;
    }
}

static PyObject *str_is_recording, *str_set_attributes, *str_span_processor;
static PyObject *key_cpu, *key_alloc, *key_gc_pause, *key_gc_count, *key_rss, *key_threads,
    *key_heap;

static int
put_stat(PyObject *dict, PyObject *key, long long value)
{
    PyObject *v = PyLong_FromLongLong(value);
    int r = v == NULL ? -1 : PyDict_SetItem(dict, key, v);
    Py_XDECREF(v);
    return r;
}

/* The span's stats as set_attributes takes them (new reference), or NULL.  `full`: span_stats
 * is on, and `cpu` is the span's CPU. */
static PyObject *
stats_attributes(LabelsObject *labels, int full, uint64_t cpu)
{
    PyObject *d = PyDict_New();
    if (d == NULL)
        return NULL;
    uint64_t pause = __atomic_load_n(&labels->gc_pause_ns, __ATOMIC_RELAXED);
    uint64_t count = __atomic_load_n(&labels->gc_count, __ATOMIC_RELAXED);
    uint64_t alloc = __atomic_load_n(&labels->alloc_bytes, __ATOMIC_RELAXED);
    /* Zero figures are left out (most spans see no collection and no allocation sample):
     * the SDK's set_attributes costs ~0.5 us per attribute. */
    int failed = full && put_stat(d, key_cpu, (long long)cpu) < 0;
    if (!failed && alloc != 0 && __atomic_load_n(&alloc_sampling, __ATOMIC_RELAXED))
        failed = put_stat(d, key_alloc, (long long)alloc) < 0;
    if (!failed && count != 0)
        failed = put_stat(d, key_gc_pause, (long long)pause) < 0 ||
                 put_stat(d, key_gc_count, (long long)count) < 0;
    if (!failed && full && labels->root_span_id == labels->span_id) {
        long long rss, threads, heap;
        process_stats(&rss, &threads, &heap);
        failed = (rss >= 0 && put_stat(d, key_rss, rss) < 0) ||
                 (threads >= 0 && put_stat(d, key_threads, threads) < 0) ||
                 (heap >= 0 && put_stat(d, key_heap, heap) < 0);
    }
    if (failed)
        Py_CLEAR(d);
    return d;
}

static void
api_charge_alloc(PyThreadState *ts, uint64_t bytes)
{
    LabelsObject *labels = find_labels(thread_context(ts));
    if (labels != NULL)
        labels_charge(labels, 0, bytes);
}

static void
api_set_alloc_sampling(int on)
{
    __atomic_store_n(&alloc_sampling, on, __ATOMIC_RELAXED);
}

static PyObject *
sampler_alloc_sampling(PyObject *mod, PyObject *unused)
{
    (void)mod; (void)unused;
    return PyBool_FromLong(__atomic_load_n(&alloc_sampling, __ATOMIC_RELAXED));
}

/* ---------------------------------------------------------------- span linking */

/* OpenTelemetry's runtime context, wrapped: every attach also sets the labels ContextVar to
 * the span's ids, every detach resets it.  This runs for every span a program makes current;
 * the same in Python measured +10% on a service opening four spans per 80 us request.  Rare
 * cases (a sampled span to tag, a token reset in another context) call back into Python. */
typedef struct {
    PyObject_HEAD
    PyObject *inner;           /* the runtime context being wrapped */
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

static PyObject *str_attach, *str_detach, *str_get_current, *str_get_span_context, *str_parent;
static PyObject *str_context_attr;

/* Span types whose get_span_context() returns their `_context` attribute (the SDK's Span, the
 * API's NonRecordingSpan), found out on the first span of each type: reading the attribute
 * costs a fifth of calling the method, on every span.  A type whose method returns anything
 * else keeps the call.  The references keep the types (and so their addresses) alive. */
#define SPAN_TYPES 8
static PyTypeObject *span_types[SPAN_TYPES];
static int span_type_reads_attr[SPAN_TYPES];

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
        span_types[k] = (PyTypeObject *)Py_NewRef((PyObject *)type);
        span_type_reads_attr[k] = attr == ctx;
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
    Py_ssize_t n = PyLong_AsNativeBytes(trace, b, 16,
                                        Py_ASNATIVEBYTES_LITTLE_ENDIAN |
                                            Py_ASNATIVEBYTES_UNSIGNED_BUFFER |
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
    static char *kwlist[] = {"inner", "span_key", "var", "on_reset_failed",
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
    int bad_trace = trace_id_words(PyTuple_GET_ITEM(ctx, 0), &trace_hi, &trace_lo) < 0;
    Py_DECREF(ctx);
    if (bad_trace || PyErr_Occurred() || span_id == 0 || (trace_hi | trace_lo) == 0) {
        PyErr_Clear();
        return (PyObject *)labels;
    }
    uint64_t root = span_id;
    /* Only root_spans_only needs the local root; finding it costs an attribute lookup. */
    if (find_root && previous != NULL && previous->root_span_id &&
        previous->trace_lo == trace_lo &&
        previous->trace_hi == trace_hi) {
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
    PyObject *pair = PyTuple_Pack(4, token, ours, labels, span ? span : Py_None);
    Py_DECREF(token);
    Py_DECREF(ours);
    Py_DECREF(labels);
    Py_XDECREF(span);
    return pair;
}

static PyObject *str_set_attribute, *key_profile_id;

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
        if (k < SPAN_TYPES)
            no_processor_types[k] = (PyTypeObject *)Py_NewRef((PyObject *)type);
        return;
    }
    for (int i = 0; i < self->n_providers; i++) {
        if (self->providers[i] == processor) {
            Py_DECREF(processor);
            return;
        }
    }
    PyObject *r = PyObject_CallOneArg(self->on_new_provider, processor);
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
    if (self->n_providers < SEEN_PROVIDERS)
        self->providers[self->n_providers++] = processor; /* the reference taken above */
    else
        Py_DECREF(processor); /* beyond: asked each time (the callback does nothing twice) */
}

/* Whether a span's labels hold figures for its attributes without span_stats (see span
 * stats): a collection ran inside, or an allocation was sampled. */
static inline int
has_figures(LabelsObject *labels)
{
    return __atomic_load_n(&labels->gc_count, __ATOMIC_RELAXED) != 0 ||
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

static PyTypeObject LinkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._sampler.SpanLinker",
    .tp_basicsize = sizeof(LinkerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = linker_new,
    .tp_dealloc = (destructor)linker_dealloc,
    .tp_methods = linker_methods,
    .tp_getset = linker_getset,
    .tp_doc = "OpenTelemetry's runtime context, setting span labels on attach/detach.",
};

/* With the GIL: {thread ident: (span, trace hi, trace lo, root span, tag set)} for every thread
 * of this interpreter whose current context holds labels.  The threads-and-tasks profile needs
 * other threads' labels, which Python cannot read (a ContextVar is only readable from its own
 * thread). */
static PyObject *
sampler_thread_labels(PyObject *mod, PyObject *unused)
{
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    PyInterpreterState *interp = PyInterpreterState_Get();
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL;
         ts = PyThreadState_Next(ts)) {
        LabelsObject *found = find_labels(thread_context(ts));
        if (found == NULL)
            continue;
        uint64_t l[HOTSPAN_LABEL_WORDS];
        copy_labels(found, l);
        PyObject *key = PyLong_FromUnsignedLongLong((unsigned long long)ts->thread_id);
        PyObject *value = Py_BuildValue("(KKKKK)", (unsigned long long)l[0],
                                        (unsigned long long)l[1], (unsigned long long)l[2],
                                        (unsigned long long)l[3], (unsigned long long)l[4]);
        int failed = key == NULL || value == NULL || PyDict_SetItem(out, key, value) < 0;
        Py_XDECREF(key);
        Py_XDECREF(value);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))sampler_start, METH_VARARGS | METH_KEYWORDS,
     "start(cpu_interval_ns, max_depth, cpu, wall=True, window_ns=0) -> bool: whether CPU "
     "timers are on; a window closes every window_ns (0: only at collect(final=True))"},
    {"stop", sampler_stop, METH_NOARGS, "stop(): no more samples; what was taken stays"},
    {"pin", sampler_pin, METH_NOARGS,
     "pin(): hold the code objects of the stacks sampled since the last call"},
    {"collect", (PyCFunction)(void (*)(void))sampler_collect, METH_VARARGS | METH_KEYWORDS,
     "collect(final=False, release_codes=True) -> ([(start_ns, end_ns, samples)], codes, lost)"},
    {"exclude", sampler_exclude, METH_VARARGS, "exclude(ident): never sample this thread"},
    {"register_thread", sampler_register_thread, METH_NOARGS,
     "register_thread(): the calling thread is sampled from now on (call as it starts)"},
    {"unregister_thread", sampler_unregister_thread, METH_VARARGS,
     "unregister_thread(code=None): the calling thread ends (call as it ends), having run code"},
    {"stats", sampler_stats, METH_NOARGS, "stats() -> dict: threads, timers, losses"},
    {"after_fork", sampler_after_fork, METH_NOARGS, "reset in a forked child"},
    {"enable_labels", sampler_enable_labels, METH_VARARGS, NULL},
    {"find_in", sampler_find_in, METH_O, NULL},
    {"gc_callback", sampler_gc_callback, METH_VARARGS,
     "gc_callback(phase, info): for gc.callbacks; charges each pause to the span current"},
    {"process_stats", sampler_process_stats, METH_NOARGS,
     "process_stats() -> (rss_bytes, threads, allocated_blocks), -1 where unknown (cached 10 ms)"},
    {"alloc_sampling", sampler_alloc_sampling, METH_NOARGS,
     "alloc_sampling() -> bool: whether the allocation sampler runs (spans get alloc_bytes)"},
    {"thread_labels", sampler_thread_labels, METH_NOARGS,
     "thread_labels() -> {ident: (span, trace_hi, trace_lo, root_span, tagset)}: every thread's "
     "current labels"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sampler", "hotspan's native sampler (see sampler.c).", -1, methods,
};

/* ---------------------------------------------------------------- what other collectors use */

static void
api_read_labels(PyThreadState *ts, uint64_t out[HOTSPAN_LABEL_WORDS])
{
    copy_labels(find_labels(thread_context(ts)), out);
}

/* The other collectors call with the GIL, never inside CPython's frame pops; a stack that
 * cannot be read is an empty one to them. */
static int
api_walk_frames(PyThreadState *ts, RawFrame *out, int max_depth)
{
    int n = walk_frames(ts, out, max_depth);
    return n < 0 ? 0 : n;
}

static const HotspanSamplerAPI sampler_api = {
    .version = HOTSPAN_SAMPLER_API_VERSION,
    .walk_frames = api_walk_frames,
    .read_labels = api_read_labels,
    .charge_alloc = api_charge_alloc,
    .set_alloc_sampling = api_set_alloc_sampling,
};

PyMODINIT_FUNC
PyInit__sampler(void)
{
    if (PyType_Ready(&LabelsType) < 0 || PyType_Ready(&LinkerType) < 0)
        return NULL;
    str_attach = PyUnicode_InternFromString("attach");
    str_detach = PyUnicode_InternFromString("detach");
    str_get_current = PyUnicode_InternFromString("get_current");
    str_get_span_context = PyUnicode_InternFromString("get_span_context");
    str_parent = PyUnicode_InternFromString("parent");
    str_context_attr = PyUnicode_InternFromString("_context");
    if (!str_attach || !str_detach || !str_get_current || !str_get_span_context || !str_parent ||
        !str_context_attr)
        return NULL;
    str_asyncio_events = PyUnicode_InternFromString("asyncio.events");
    str_get_running_loop = PyUnicode_InternFromString("_get_running_loop");
    str_is_recording = PyUnicode_InternFromString("is_recording");
    str_set_attributes = PyUnicode_InternFromString("set_attributes");
    str_set_attribute = PyUnicode_InternFromString("set_attribute");
    key_profile_id = PyUnicode_InternFromString("pyroscope.profile.id");
    str_span_processor = PyUnicode_InternFromString("_span_processor");
    key_cpu = PyUnicode_InternFromString("hotspan.cpu_time_ns");
    key_alloc = PyUnicode_InternFromString("hotspan.alloc_bytes");
    key_gc_pause = PyUnicode_InternFromString("hotspan.gc.pause_ns");
    key_gc_count = PyUnicode_InternFromString("hotspan.gc.collections");
    key_rss = PyUnicode_InternFromString("process.memory.usage");
    key_threads = PyUnicode_InternFromString("process.thread.count");
    key_heap = PyUnicode_InternFromString("hotspan.process.heap_objects");
    if (!str_asyncio_events || !str_get_running_loop || !str_is_recording ||
        !str_set_attributes || !str_span_processor || !key_cpu || !key_alloc || !key_gc_pause ||
        !key_gc_count || !key_rss || !key_threads || !key_heap || !str_set_attribute ||
        !key_profile_id)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&LabelsType);
    if (PyModule_AddObject(m, "Labels", (PyObject *)&LabelsType) < 0) {
        Py_DECREF(&LabelsType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&LinkerType);
    if (PyModule_AddObject(m, "SpanLinker", (PyObject *)&LinkerType) < 0) {
        Py_DECREF(&LinkerType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *api = PyCapsule_New((void *)&sampler_api, HOTSPAN_SAMPLER_API_CAPSULE, NULL);
    if (api == NULL || PyModule_AddObject(m, "_C_API", api) < 0) {
        Py_XDECREF(api);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

