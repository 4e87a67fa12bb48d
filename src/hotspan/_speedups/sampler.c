/* The agent's native sampler: CPU samples taken by each thread itself, wall samples of all.
 *
 * CPU: every profiled thread gets a POSIX timer on its own CPU clock that delivers SIGPROF to
 * that very thread each `interval` of CPU it burns.  The handler runs on the thread while it is
 * on CPU, so the stack it records is where the CPU went: a thread that loops 1 ms and sleeps
 * 4 ms is never caught "in" its sleep, and threads that do not hold the GIL (C code that
 * released it) are counted too.  A sampler thread that took the GIL to look at stacks would
 * see every busy thread at the point where it let the GIL go, which is usually its sleep.
 *
 * The handler cannot call Python: it copies (code pointer, instruction offset) pairs of the
 * thread's frames and the span/tag labels found in the thread's contextvars into a lock-free
 * ring.  `tick()`, called with the GIL by the agent's sampler thread, drains the ring, checks
 * each code pointer is still a code object with the same first line before it takes a
 * reference to it, and adds up samples in a dict.  The same call takes the wall samples: with
 * the GIL held every other thread is parked, so their frames can be read directly.
 *
 * Labels: the agent keeps one `Labels` object (span id, trace id, local root span id, tag set)
 * in a ContextVar.  The handler finds it by walking the thread's current context HAMT for that
 * variable, so threads and asyncio tasks (each runs in its own context) each see their own
 * value, exactly as ContextVar.get() would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#if PY_VERSION_HEX >= 0x030B0000
#  ifndef Py_BUILD_CORE
#    define Py_BUILD_CORE 1
#  endif
#  include "internal/pycore_frame.h"
#  undef Py_BUILD_CORE
#else
#  include <frameobject.h>
#endif

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
#endif

#ifdef __linux__
#  include <sys/syscall.h>
#  include <sys/uio.h>
#  define HAVE_THREAD_TIMERS 1
#endif

#define MAX_THREADS 4096
#define RING_CAPACITY 512
#define TIMER_MAGIC 0x68737031 /* "hsp1": our timers' sigev_value */
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
} LabelsObject;

static PyTypeObject LabelsType;

static PyObject *
labels_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"span_id", "trace_hi", "trace_lo", "root_span_id", "tagset", NULL};
    unsigned long long v[5] = {0, 0, 0, 0, 0};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|KKKKK", kwlist, &v[0], &v[1], &v[2], &v[3],
                                     &v[4]))
        return NULL;
    LabelsObject *self = (LabelsObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->span_id = v[0];
    self->trace_hi = v[1];
    self->trace_lo = v[2];
    self->root_span_id = v[3];
    self->tagset = v[4];
    return (PyObject *)self;
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

static PyGetSetDef labels_getset[] = {
    {"sampled", (getter)labels_get_sampled, (setter)labels_set_sampled, NULL, NULL},
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
    .tp_getset = labels_getset,
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

typedef struct {
    uint64_t code;      /* PyCodeObject*, 0 = not resolvable */
    uint32_t lasti;     /* instruction offset in bytes */
    uint32_t fingerprint; /* of the code object when sampled: see code_fingerprint */
} RawFrame;

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

/* Leaf first.  Returns the number of frames written (at most max_depth). */
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
        PyObject *exe = f->f_executable;
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

typedef struct {
    _Atomic int state; /* 0 free, 1 being written, 2 ready */
    int depth;
    uint64_t ident;
    uint64_t weight;
    uint64_t labels[5];
    RawFrame frames[];
} Entry;

static char *ring;            /* RING_CAPACITY entries of entry_size bytes */
static size_t entry_size;
static int max_depth = 64;
static _Atomic unsigned long ring_pos;
static _Atomic unsigned long ring_dropped;
static _Atomic int cpu_enabled;
static int running;
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

/* ---------------------------------------------------------------- CPU timers */

#ifdef HAVE_THREAD_TIMERS
static struct sigaction previous_action;
static int handler_installed;

static void
on_cpu_signal(int signum, siginfo_t *info, void *ucontext)
{
    if (info == NULL || info->si_code != SI_TIMER || info->si_value.sival_int != TIMER_MAGIC) {
        /* Not ours: hand it to whoever had the signal before us. */
        if ((previous_action.sa_flags & SA_SIGINFO) && previous_action.sa_sigaction != NULL)
            previous_action.sa_sigaction(signum, info, ucontext);
        else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN &&
                 previous_action.sa_handler != NULL)
            previous_action.sa_handler(signum);
        return;
    }
    if (!atomic_load_explicit(&cpu_enabled, memory_order_acquire) || ring == NULL)
        return;
    int saved_errno = errno;
    PyThreadState *ts = PyGILState_GetThisThreadState();
    if (ts != NULL) {
        unsigned long pos = atomic_fetch_add_explicit(&ring_pos, 1, memory_order_relaxed);
        Entry *e = entry_at(pos);
        int expected = 0;
        if (atomic_compare_exchange_strong(&e->state, &expected, 1)) {
            e->ident = (uint64_t)ts->thread_id;
            e->weight = cpu_interval_ns * (uint64_t)(1 + (info->si_overrun > 0 ? info->si_overrun : 0));
            copy_labels(find_labels(thread_context(ts)), e->labels);
            e->depth = walk_frames(ts, e->frames, max_depth);
            atomic_store_explicit(&e->state, 2, memory_order_release);
        } else {
            atomic_fetch_add_explicit(&ring_dropped, 1, memory_order_relaxed);
        }
    }
    errno = saved_errno;
}
#endif

typedef struct {
    unsigned long ident;
    pid_t tid;
    int live;     /* seen in the last sync */
    timer_t timer;
} ThreadTimer;

static ThreadTimer timers[MAX_THREADS];
static int n_timers;
static uint64_t threads_signature;

static unsigned long excluded[16];
static int n_excluded;

static int
is_excluded(unsigned long ident)
{
    for (int i = 0; i < n_excluded; i++)
        if (excluded[i] == ident)
            return 1;
    return 0;
}

#ifdef HAVE_THREAD_TIMERS
static int
arm_timer(ThreadTimer *t)
{
    clockid_t clock;
    if (pthread_getcpuclockid((pthread_t)t->ident, &clock) != 0)
        return -1;
    /* The kernel encodes a thread's CPU clock as ~tid << 3 | flags; it is the only portable
     * way from a pthread_t to the tid a SIGEV_THREAD_ID timer needs. */
    pid_t tid = (pid_t)~(clock >> 3);
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGPROF;
    ev.sigev_value.sival_int = TIMER_MAGIC;
    ev._sigev_un._tid = tid;
    if (timer_create(clock, &ev, &t->timer) != 0)
        return -1;
    struct itimerspec spec;
    spec.it_interval.tv_sec = (time_t)(cpu_interval_ns / 1000000000ull);
    spec.it_interval.tv_nsec = (long)(cpu_interval_ns % 1000000000ull);
    spec.it_value = spec.it_interval;
    if (timer_settime(t->timer, 0, &spec, NULL) != 0) {
        timer_delete(t->timer);
        return -1;
    }
    t->tid = tid;
    return 0;
}

static pid_t
current_tid_of(unsigned long ident)
{
    clockid_t clock;
    if (pthread_getcpuclockid((pthread_t)ident, &clock) != 0)
        return -1;
    return (pid_t)~(clock >> 3);
}
#endif

/* With the GIL: timers for new threads, none for threads gone.  Every thread listed by the
 * interpreter is alive while we hold the GIL (it needs the GIL to delete its state). */
static void
sync_timers(PyInterpreterState *interp)
{
#ifdef HAVE_THREAD_TIMERS
    /* Thread state ids are never reused: their sum and count change whenever a thread comes
     * or goes, so the quadratic matching below runs only then, not on every tick. */
    uint64_t signature = 0x9e3779b97f4a7c15ull;
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL;
         ts = PyThreadState_Next(ts))
        signature = signature * 31u + (uint64_t)ts->id + 1u;
    if (signature == threads_signature)
        return;
    threads_signature = signature;
    for (int i = 0; i < n_timers; i++)
        timers[i].live = 0;
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL;
         ts = PyThreadState_Next(ts)) {
        unsigned long ident = ts->thread_id;
        if (ident == 0 || is_excluded(ident))
            continue;
        pid_t tid = current_tid_of(ident);
        int found = 0;
        for (int i = 0; i < n_timers; i++) {
            if (timers[i].ident == ident && timers[i].tid == tid) {
                timers[i].live = 1;
                found = 1;
                break;
            }
        }
        if (!found && n_timers < MAX_THREADS) {
            ThreadTimer *t = &timers[n_timers];
            t->ident = ident;
            if (arm_timer(t) == 0) {
                t->live = 1;
                n_timers++;
            }
        }
    }
    for (int i = 0; i < n_timers;) {
        if (!timers[i].live) {
            timer_delete(timers[i].timer);
            timers[i] = timers[--n_timers];
        } else {
            i++;
        }
    }
#else
    (void)interp;
#endif
}

static void
delete_timers(void)
{
#ifdef HAVE_THREAD_TIMERS
    for (int i = 0; i < n_timers; i++)
        timer_delete(timers[i].timer);
#endif
    n_timers = 0;
}

/* ---------------------------------------------------------------- code registry */

/* Code objects referenced by samples, kept alive so their address cannot be reused before the
 * agent has named them. */
static uint64_t *code_set;
static unsigned code_set_count;
static PyObject *code_refs; /* list */

static inline uint64_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
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

/* A freed object's memory keeps its type and fields until it is reused, but pymalloc (and
 * malloc's free lists) write a free-list pointer into its first word, where the reference
 * count was: a live count is small (or CPython's immortal count, below 2^32), a pointer is an
 * address far above 2^40.  Taking a reference to a freed code object would corrupt the
 * allocator's free list and crash the program later, so this check is what keeps it safe. */
static inline int
plausible_refcnt(Py_ssize_t refcnt)
{
    return refcnt > 0 && (uint64_t)refcnt < ((uint64_t)1 << 40);
}

/* Frames recorded by the signal handler point at code objects that were alive then; by now
 * one may have been freed (its memory unmapped, or reused).  Keep only pointers that still
 * are code objects with the same fingerprint, read safely; then hold a reference. */
static void
validate_frames(RawFrame *frames, int depth)
{
    for (int i = 0; i < depth; i++) {
        uint64_t ptr = frames[i].code;
        if (ptr == 0 || code_known(ptr))
            continue;
        PyCodeObject copy;
        const PyCodeObject *code = (const PyCodeObject *)(uintptr_t)ptr;
        if (safe_read(code, &copy, sizeof copy) == 0 && Py_TYPE(&copy) == &PyCode_Type &&
            plausible_refcnt(Py_REFCNT(&copy)) &&
            code_fingerprint(&copy) == frames[i].fingerprint &&
            code_register((PyObject *)code)) {
            continue;
        }
        frames[i].code = 0;
    }
}

/* ---------------------------------------------------------------- aggregation */

static PyObject *aggregate; /* dict: (kind, ident, l0..l4, frames bytes) -> ns */

static int
add_sample(int kind, uint64_t ident, const uint64_t *labels, const RawFrame *frames, int depth,
           uint64_t weight)
{
    /* The fingerprint only served validation: zero it so equal stacks make equal keys. */
    RawFrame key_frames[depth > 0 ? depth : 1];
    for (int i = 0; i < depth; i++) {
        key_frames[i].code = frames[i].code;
        key_frames[i].lasti = frames[i].lasti;
        key_frames[i].fingerprint = 0;
    }
    PyObject *key = Py_BuildValue("(iKKKKKKy#)", kind, (unsigned long long)ident,
                                  (unsigned long long)labels[0], (unsigned long long)labels[1],
                                  (unsigned long long)labels[2], (unsigned long long)labels[3],
                                  (unsigned long long)labels[4], (const char *)key_frames,
                                  (Py_ssize_t)(depth * (int)sizeof(RawFrame)));
    if (key == NULL)
        return -1;
    PyObject *old = PyDict_GetItemWithError(aggregate, key);
    if (old == NULL && PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    }
    unsigned long long total = weight;
    if (old != NULL)
        total += PyLong_AsUnsignedLongLong(old);
    PyObject *value = PyLong_FromUnsignedLongLong(total);
    int rc = value ? PyDict_SetItem(aggregate, key, value) : -1;
    Py_XDECREF(value);
    Py_DECREF(key);
    return rc;
}

/* CPU drained per thread since the last wall tick.  A thread's wall time is its CPU time
 * (charged where the CPU samples saw it, on the thread, while it ran) plus the rest of the
 * tick, charged where the tick finds it.  A tick holds the GIL, so it finds a busy thread
 * only where that thread let the GIL go (usually its sleep): without this, a thread that
 * computes 1 ms and sleeps 4 ms would show 100% of its wall time asleep. */
#define CPU_SEEN_SLOTS 1024
static struct {
    unsigned long ident;
    uint64_t ns;
} cpu_seen[CPU_SEEN_SLOTS];
static int wall_from_cpu; /* wall profile on and native CPU samples to build it from */

static void
note_cpu(unsigned long ident, uint64_t ns)
{
    size_t mask = CPU_SEEN_SLOTS - 1;
    for (size_t i = mix64(ident) & mask, n = 0; n < CPU_SEEN_SLOTS; i = (i + 1) & mask, n++) {
        if (cpu_seen[i].ident == ident || cpu_seen[i].ident == 0) {
            cpu_seen[i].ident = ident;
            cpu_seen[i].ns += ns;
            return;
        }
    }
}

static uint64_t
take_cpu(unsigned long ident)
{
    size_t mask = CPU_SEEN_SLOTS - 1;
    for (size_t i = mix64(ident) & mask, n = 0; n < CPU_SEEN_SLOTS; i = (i + 1) & mask, n++) {
        if (cpu_seen[i].ident == ident)
            return cpu_seen[i].ns;
        if (cpu_seen[i].ident == 0)
            return 0;
    }
    return 0;
}

static int
drain_ring(void)
{
    if (ring == NULL)
        return 0;
    for (size_t i = 0; i < RING_CAPACITY; i++) {
        Entry *e = entry_at(i);
        if (atomic_load_explicit(&e->state, memory_order_acquire) != 2)
            continue;
        validate_frames(e->frames, e->depth);
        int rc = add_sample(0, e->ident, e->labels, e->frames, e->depth, e->weight);
        if (rc == 0 && wall_from_cpu) {
            rc = add_sample(1, e->ident, e->labels, e->frames, e->depth, e->weight);
            note_cpu((unsigned long)e->ident, e->weight);
        }
        atomic_store_explicit(&e->state, 0, memory_order_release);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int
sample_walls(PyInterpreterState *interp, uint64_t wall_ns, RawFrame *scratch)
{
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts != NULL;
         ts = PyThreadState_Next(ts)) {
        if (ts->thread_id == 0 || is_excluded(ts->thread_id))
            continue;
        uint64_t weight = wall_ns;
        if (wall_from_cpu) {
            uint64_t on_cpu = take_cpu(ts->thread_id);
            /* Quantised CPU samples can exceed one tick; the excess is simply not charged
             * again here, so wall time per thread stays close to elapsed time. */
            weight = on_cpu >= wall_ns ? 0 : wall_ns - on_cpu;
            if (weight == 0)
                continue;
        }
        int depth = walk_frames(ts, scratch, max_depth);
        if (depth == 0)
            continue; /* a thread state with no Python running (being set up or torn down) */
        for (int i = 0; i < depth; i++) {
            if (!code_register((PyObject *)(uintptr_t)scratch[i].code))
                scratch[i].code = 0;
        }
        uint64_t labels[5];
        copy_labels(find_labels(thread_context(ts)), labels);
        if (add_sample(1, ts->thread_id, labels, scratch, depth, weight) < 0)
            return -1;
    }
    memset(cpu_seen, 0, sizeof cpu_seen);
    return 0;
}

/* ---------------------------------------------------------------- module functions */

static PyObject *
sampler_start(PyObject *mod, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cpu_interval_ns", "max_depth", "cpu", "wall", NULL};
    unsigned long long interval;
    int depth, cpu, wall = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Kip|p", kwlist, &interval, &depth, &cpu,
                                     &wall))
        return NULL;
    if (depth < 1 || depth > 1000 || interval < 1000000ull) {
        PyErr_SetString(PyExc_ValueError, "max_depth must be 1..1000 and the interval >= 1 ms");
        return NULL;
    }
    if (running) {
        PyErr_SetString(PyExc_RuntimeError, "the sampler is already running");
        return NULL;
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
    Py_CLEAR(aggregate);
    Py_CLEAR(code_refs);
    PyMem_RawFree(code_set);
    max_depth = depth;
    cpu_interval_ns = interval;
    n_excluded = 0; /* the idents of an earlier agent's threads may belong to new threads now */
    threads_signature = 0;
    code_set = PyMem_RawCalloc((size_t)1 << CODE_SET_BITS, sizeof(uint64_t));
    aggregate = PyDict_New();
    code_refs = PyList_New(0);
    if (ring == NULL || code_set == NULL || aggregate == NULL || code_refs == NULL) {
        PyMem_RawFree(code_set);
        code_set = NULL;
        Py_CLEAR(aggregate);
        Py_CLEAR(code_refs);
        return PyErr_NoMemory();
    }
    code_set_count = 0;
    running = 1;
    int native_cpu = 0;
#ifdef HAVE_THREAD_TIMERS
    if (cpu) {
        if (!handler_installed) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_sigaction = on_cpu_signal;
            sa.sa_flags = SA_SIGINFO | SA_RESTART;
            sigemptyset(&sa.sa_mask);
            if (sigaction(SIGPROF, &sa, &previous_action) == 0)
                handler_installed = 1;
        }
        native_cpu = handler_installed;
    }
#endif
    memset(cpu_seen, 0, sizeof cpu_seen);
    wall_from_cpu = native_cpu && wall;
    atomic_store(&ring_dropped, 0);
    atomic_store(&cpu_enabled, native_cpu);
    return PyBool_FromLong(native_cpu);
}

static PyObject *
sampler_stop(PyObject *mod, PyObject *unused)
{
    atomic_store(&cpu_enabled, 0);
    delete_timers();
    running = 0;
    /* What the handlers recorded so far belongs to the last window: keep it for collect(). */
    if (aggregate != NULL && drain_ring() < 0)
        PyErr_Clear();
    /* The handler stays installed: a signal already queued for a thread must not meet the
     * default SIGPROF action, which kills the process.  Disabled, it returns at once.  The
     * ring is kept for the same reason (a late handler may still be writing to it). */
    if (ring != NULL) {
        for (size_t i = 0; i < RING_CAPACITY; i++)
            atomic_store(&entry_at(i)->state, 0);
    }
    Py_RETURN_NONE;
}

static PyObject *
sampler_tick(PyObject *mod, PyObject *args)
{
    unsigned long long wall_ns;
    if (!PyArg_ParseTuple(args, "K", &wall_ns))
        return NULL;
    if (!running) {
        PyErr_SetString(PyExc_RuntimeError, "the sampler is not running");
        return NULL;
    }
    PyInterpreterState *interp = PyThreadState_Get()->interp;
    if (atomic_load(&cpu_enabled))
        sync_timers(interp);
    if (drain_ring() < 0)
        return NULL;
    if (wall_ns > 0) {
        RawFrame *scratch = PyMem_Malloc((size_t)max_depth * sizeof(RawFrame));
        if (scratch == NULL)
            return PyErr_NoMemory();
        int rc = sample_walls(interp, wall_ns, scratch);
        PyMem_Free(scratch);
        if (rc < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* Returns (samples dict, code objects list, dropped count) and starts a new window.  The code
 * list keeps every code object the samples point at alive; the caller drops it when named. */
static PyObject *
sampler_collect(PyObject *mod, PyObject *args)
{
    int release_codes = 0;
    if (!PyArg_ParseTuple(args, "|p", &release_codes))
        return NULL;
    if (aggregate == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the sampler was never started");
        return NULL;
    }
    if (drain_ring() < 0)
        return NULL;
    PyObject *fresh = PyDict_New();
    if (fresh == NULL)
        return NULL;
    PyObject *samples = aggregate;
    aggregate = fresh;
    PyObject *codes = code_refs;
    if (release_codes) {
        PyObject *empty = PyList_New(0);
        if (empty == NULL) {
            aggregate = samples;
            Py_DECREF(fresh);
            return NULL;
        }
        code_refs = empty;
        memset(code_set, 0, ((size_t)1 << CODE_SET_BITS) * sizeof(uint64_t));
        code_set_count = 0;
    } else {
        Py_INCREF(codes);
    }
    unsigned long dropped = atomic_exchange(&ring_dropped, 0);
    return Py_BuildValue("(NNk)", samples, codes, dropped);
}

static PyObject *
sampler_exclude(PyObject *mod, PyObject *args)
{
    unsigned long ident;
    if (!PyArg_ParseTuple(args, "k", &ident))
        return NULL;
    if (!is_excluded(ident) && n_excluded < (int)(sizeof excluded / sizeof excluded[0]))
        excluded[n_excluded++] = ident;
    Py_RETURN_NONE;
}

static PyObject *
sampler_after_fork(PyObject *mod, PyObject *unused)
{
    /* Timers are not inherited, and entries a vanished thread was writing would stay busy. */
    atomic_store(&cpu_enabled, 0);
    running = 0;
    n_timers = 0;
    n_excluded = 0;
    threads_signature = 0;
    if (ring != NULL) {
        for (size_t i = 0; i < RING_CAPACITY; i++)
            atomic_store(&entry_at(i)->state, 0);
    }
    PyMem_RawFree(ring);
    ring = NULL;
    PyMem_RawFree(code_set);
    code_set = NULL;
    Py_CLEAR(aggregate);
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
    PyObject *on_profiled;     /* (span, labels, restored labels): a sampled span's detach */
    PyObject *on_reset_failed; /* (): our token was made in another context */
    /* OpenTelemetry's own ContextVar when `inner` is its stock ContextVarsRuntimeContext:
     * then attach/detach/get_current use it directly, which costs less than the Python
     * methods they replace (get_current alone is called four times per span). */
    PyObject *otel_var;
    int root_spans_only;
} LinkerObject;

static PyObject *str_attach, *str_detach, *str_get_current, *str_get_span_context, *str_parent;
static PyObject *sixty_four;

static void
linker_dealloc(LinkerObject *self)
{
    Py_XDECREF(self->inner);
    Py_XDECREF(self->span_key);
    Py_XDECREF(self->var);
    Py_XDECREF(self->on_profiled);
    Py_XDECREF(self->on_reset_failed);
    Py_XDECREF(self->otel_var);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
linker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"inner", "span_key", "var", "on_profiled", "on_reset_failed",
                             "root_spans_only", NULL};
    PyObject *inner, *key, *var, *on_profiled, *on_reset_failed;
    int root_only = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOO|p", kwlist, &inner, &key, &var,
                                     &on_profiled, &on_reset_failed, &root_only))
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
    self->on_profiled = Py_NewRef(on_profiled);
    self->on_reset_failed = Py_NewRef(on_reset_failed);
    self->root_spans_only = root_only;
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
    PyObject *ctx = PyObject_CallMethodObjArgs(span, str_get_span_context, NULL);
    /* SpanContext is a tuple: (trace_id, span_id, is_remote, ...). */
    if (ctx == NULL || !PyTuple_Check(ctx) || PyTuple_GET_SIZE(ctx) < 3 ||
        !PyLong_Check(PyTuple_GET_ITEM(ctx, 0)) || !PyLong_Check(PyTuple_GET_ITEM(ctx, 1))) {
        Py_XDECREF(ctx);
        PyErr_Clear();
        return (PyObject *)labels;
    }
    PyObject *trace = PyTuple_GET_ITEM(ctx, 0);
    uint64_t span_id = (uint64_t)PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(ctx, 1));
    uint64_t trace_lo = (uint64_t)PyLong_AsUnsignedLongLongMask(trace);
    PyObject *high = PyNumber_Rshift(trace, sixty_four);
    uint64_t trace_hi = high ? (uint64_t)PyLong_AsUnsignedLongLongMask(high) : 0;
    Py_XDECREF(high);
    Py_DECREF(ctx);
    if (PyErr_Occurred() || span_id == 0 || (trace_hi | trace_lo) == 0) {
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

static PyObject *
linker_attach(LinkerObject *self, PyObject *context)
{
    PyObject *token = self->otel_var != NULL
                          ? PyContextVar_Set(self->otel_var, context)
                          : PyObject_CallMethodObjArgs(self->inner, str_attach, context, NULL);
    if (token == NULL)
        return NULL;
    PyObject *span = NULL;
    if (PyDict_Check(context)) {
        span = PyDict_GetItemWithError(context, self->span_key); /* borrowed */
        if (span == NULL && PyErr_Occurred())
            PyErr_Clear();
    }
    PyObject *previous = current_labels_of(self->var);
    PyObject *labels = labels_for(span, (LabelsObject *)previous, self->root_spans_only);
    Py_XDECREF(previous);
    if (labels == NULL) {
        PyErr_Clear();
        return token; /* never break the program's tracing */
    }
    PyObject *ours = PyContextVar_Set(self->var, labels);
    if (ours == NULL) {
        PyErr_Clear();
        Py_DECREF(labels);
        return token;
    }
    PyObject *pair = PyTuple_Pack(4, token, ours, labels, span ? span : Py_None);
    Py_DECREF(token);
    Py_DECREF(ours);
    Py_DECREF(labels);
    return pair;
}

static PyObject *
linker_detach(LinkerObject *self, PyObject *token)
{
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
    if (labels->sampled && labels->span_id) {
        PyObject *restored = current_labels_of(self->var);
        PyObject *r = PyObject_CallFunctionObjArgs(self->on_profiled, PyTuple_GET_ITEM(token, 3),
                                                   (PyObject *)labels,
                                                   restored ? restored : Py_None, NULL);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
        Py_XDECREF(restored);
    }
    Py_RETURN_NONE;
}

static PyObject *
linker_get_current(LinkerObject *self, PyObject *unused)
{
    if (self->otel_var != NULL) {
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

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))sampler_start, METH_VARARGS | METH_KEYWORDS,
     "start(cpu_interval_ns, max_depth, cpu, wall=True) -> bool: whether native CPU timers are "
     "on (then the wall profile takes running threads' stacks from the CPU samples)"},
    {"stop", sampler_stop, METH_NOARGS, "stop(): no more CPU samples"},
    {"tick", sampler_tick, METH_VARARGS,
     "tick(wall_ns): arm timers of new threads, drain CPU samples, take wall samples"},
    {"collect", sampler_collect, METH_VARARGS,
     "collect(release_codes=False) -> (samples, code objects, dropped)"},
    {"exclude", sampler_exclude, METH_VARARGS, "exclude(ident): never sample this thread"},
    {"after_fork", sampler_after_fork, METH_NOARGS, "reset in a forked child"},
    {"enable_labels", sampler_enable_labels, METH_VARARGS, NULL},
    {"find_in", sampler_find_in, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sampler", "hotspan's native sampler (see sampler.c).", -1, methods,
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
    sixty_four = PyLong_FromLong(64);
    if (!str_attach || !str_detach || !str_get_current || !str_get_span_context || !str_parent ||
        !sixty_four)
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
    return m;
}
