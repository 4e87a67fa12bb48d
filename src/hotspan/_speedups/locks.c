/* Lock contention: `threading.Lock`/`RLock` stand-ins that time how long an acquire waits.
 *
 * A ProfiledLock wraps a real `_thread.lock` (ProfiledRLock a `_thread.RLock`).  Acquire first
 * tries the inner lock without blocking: when that succeeds (the lock was free, or an RLock is
 * already ours) nothing else happens, so an uncontended `with lock:` costs one extra C call.
 * Only when it fails is the blocking acquire timed, with the caller's own `blocking`/`timeout`
 * arguments handed to the inner lock so that its semantics (interrupts, timeouts, errors) stay
 * exactly the original's.  The wait is then charged to the caller's Python stack and span
 * labels, which the native sampler's C API (`sampler_api.h`) reads without calling Python.
 *
 * Recording state: waits aggregate per (stack, labels) in a bounded hash table of plain C
 * memory.  Every access to it happens with the GIL held and without calling Python, so the GIL
 * is its lock; free-threaded, where there is none, a mutex of its own (TABLE_LOCK) is, taken
 * only once a wait was timed.  `collect` detaches the table before it builds Python objects,
 * because building them can run arbitrary Python code (the cyclic GC, finalizers) which may
 * itself record.
 * Nothing here is held across a fork: `after_fork` drops the parent's entries, and the inner
 * locks keep the original's behaviour in a child (`_at_fork_reinit` is forwarded).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hashing.h"
#include "sampler_api.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* CPython fixes the signatures of methods and slots, used or not. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *
Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
#endif

#define TABLE_SLOTS 8192             /* a power of two */
#define MAX_ENTRIES (TABLE_SLOTS / 2) /* keeps linear probing short */
#define MAX_TABLE_BYTES ((size_t)8 << 20)
#define MAX_WALK 1024

static const HotspanSamplerAPI *api;

/* ---------------------------------------------------------------- the inner locks' methods */

/* A method of the inner lock type.  When it is a plain METH_VARARGS|METH_KEYWORDS C function
 * (CPython 3.9-3.13 for acquire) it is called directly, with no bound method or attribute
 * lookup; otherwise through its descriptor. */
typedef struct {
    PyObject *descr;
    PyCFunctionWithKeywords varkw;
} MethodRef;

typedef struct {
    PyObject *make; /* makes an inner lock: _thread.allocate_lock or _thread.RLock */
    MethodRef acquire;
    MethodRef release;
    const char *type_name;
} LockKind;

static LockKind lock_kind = {.type_name = "_thread.lock"};
static LockKind rlock_kind = {.type_name = "_thread.RLock"};
static PyObject *false_args;  /* (False,) */
static PyObject *empty_args;  /* () */
static double timeout_max;    /* _thread.TIMEOUT_MAX */
static PyObject *str_at_fork_reinit, *str_is_owned, *str_release_save, *str_acquire_restore,
    *str_recursion_count, *str_locked;

static int
method_ref(MethodRef *m, PyTypeObject *type, const char *name)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name); /* borrowed */
    if (d == NULL) {
        PyErr_Format(PyExc_ImportError, "%s has no %s", type->tp_name, name);
        return -1;
    }
    m->descr = Py_NewRef(d);
    m->varkw = NULL;
    if (Py_TYPE(d) == &PyMethodDescr_Type) {
        PyMethodDef *def = ((PyMethodDescrObject *)d)->d_method;
        if ((def->ml_flags & ~METH_COEXIST) == (METH_VARARGS | METH_KEYWORDS))
            m->varkw = (PyCFunctionWithKeywords)(void (*)(void))def->ml_meth;
    }
    return 0;
}

static PyObject *
call_method(const MethodRef *m, PyObject *self, PyObject *args, PyObject *kwargs)
{
    if (m->varkw != NULL)
        return m->varkw(self, args, kwargs);
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *full = PyTuple_New(n + 1);
    if (full == NULL)
        return NULL;
    PyTuple_SET_ITEM(full, 0, Py_NewRef(self));
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(full, i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    PyObject *r = PyObject_Call(m->descr, full, kwargs);
    Py_DECREF(full);
    return r;
}

static inline PyObject *
call_noargs(const MethodRef *m, PyObject *self)
{
    return PyObject_Vectorcall(m->descr, &self, 1, NULL);
}

/* ---------------------------------------------------------------- recording */

typedef struct {
    uint64_t hash;
    uint64_t labels[HOTSPAN_LABEL_WORDS];
    uint64_t contentions;
    uint64_t delay_ns;
    int depth;
    HotspanRawFrame frames[]; /* codes referenced (strong) while the entry lives */
} Entry;

static Entry **table;   /* TABLE_SLOTS slots, or NULL before start */
static size_t n_entries, table_bytes;
static int recording, max_depth = 64;
static uint64_t waits_recorded, waits_dropped, delay_dropped_ns;
#ifdef Py_GIL_DISABLED
static PyMutex table_mu;
#  define TABLE_LOCK() PyMutex_Lock(&table_mu)
#  define TABLE_UNLOCK() PyMutex_Unlock(&table_mu)
#else
/* The walk's buffer: one, as only the GIL's holder records. */
static HotspanRawFrame walk_buf[MAX_WALK];
#  define TABLE_LOCK() ((void)0)
#  define TABLE_UNLOCK() ((void)0)
#endif

static inline uint64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t
hash_of(const HotspanRawFrame *frames, int depth, const uint64_t *labels)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)depth;
    for (int i = 0; i < depth; i++)
        h = fmix64(h ^ frames[i].code ^ ((uint64_t)frames[i].lasti << 40));
    for (int i = 0; i < HOTSPAN_LABEL_WORDS; i++)
        h = fmix64(h ^ labels[i]);
    return h;
}

static inline int
frames_equal(const HotspanRawFrame *a, const HotspanRawFrame *b, int depth)
{
    for (int i = 0; i < depth; i++)
        if (a[i].code != b[i].code || a[i].lasti != b[i].lasti)
            return 0;
    return 1;
}

/* With the GIL, calling no Python: charge `delay` to the stack of the running thread (its
 * `skip` innermost frames left out) and its current labels. */
static void record_wait_locked(uint64_t delay, int skip, HotspanRawFrame *walk_buf);

static void
record_wait(uint64_t delay, int skip)
{
    if (!recording)
        return;
#ifdef Py_GIL_DISABLED
    HotspanRawFrame walk_buf[MAX_WALK]; /* 16 KiB of this thread's stack */
#endif
    TABLE_LOCK();
    record_wait_locked(delay, skip, walk_buf);
    TABLE_UNLOCK();
}

static void
record_wait_locked(uint64_t delay, int skip, HotspanRawFrame *walk_buf)
{
    if (!recording || table == NULL)
        return;
    PyThreadState *ts = PyThreadState_Get();
    int want = max_depth + skip;
    if (want > MAX_WALK)
        want = MAX_WALK;
    int n = api->walk_frames(ts, walk_buf, want);
    const HotspanRawFrame *frames = walk_buf + (skip < n ? skip : n);
    int depth = n - skip;
    if (depth < 0)
        depth = 0;
    if (depth > max_depth)
        depth = max_depth;
    uint64_t labels[HOTSPAN_LABEL_WORDS];
    api->read_labels(ts, labels);
    uint64_t h = hash_of(frames, depth, labels);
    size_t mask = TABLE_SLOTS - 1;
    for (size_t i = (size_t)h & mask, probes = 0; probes < TABLE_SLOTS;
         i = (i + 1) & mask, probes++) {
        Entry *e = table[i];
        if (e == NULL) {
            size_t size = sizeof(Entry) + (size_t)depth * sizeof(HotspanRawFrame);
            if (n_entries >= MAX_ENTRIES || table_bytes + size > MAX_TABLE_BYTES)
                break;
            e = malloc(size);
            if (e == NULL)
                break;
            e->hash = h;
            memcpy(e->labels, labels, sizeof(labels));
            e->contentions = 1;
            e->delay_ns = delay;
            e->depth = depth;
            memcpy(e->frames, frames, (size_t)depth * sizeof(HotspanRawFrame));
            /* The frames are this thread's running ones: their codes are alive now. */
            for (int k = 0; k < depth; k++)
                Py_INCREF((PyObject *)(uintptr_t)frames[k].code);
            table[i] = e;
            n_entries++;
            table_bytes += size;
            waits_recorded++;
            return;
        }
        if (e->hash == h && e->depth == depth && !memcmp(e->labels, labels, sizeof(labels)) &&
            frames_equal(e->frames, frames, depth)) {
            e->contentions++;
            e->delay_ns += delay;
            waits_recorded++;
            return;
        }
    }
    waits_dropped++;
    delay_dropped_ns += delay;
}

/* Takes the table out, leaving an empty one (or none when `replace` is 0).  NULL with
 * MemoryError when no new table could be made; then nothing changed. */
static int
detach_table(Entry ***out, int replace)
{
    Entry **fresh = NULL;
    if (replace) {
        fresh = calloc(TABLE_SLOTS, sizeof(Entry *));
        if (fresh == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    TABLE_LOCK();
    *out = table;
    table = fresh;
    n_entries = 0;
    table_bytes = 0;
    TABLE_UNLOCK();
    return 0;
}

/* Frees a detached table; dropping the code references may run Python (weakref callbacks),
 * which is why the table is detached first. */
static void
free_table(Entry **old)
{
    if (old == NULL)
        return;
    for (size_t i = 0; i < TABLE_SLOTS; i++) {
        Entry *e = old[i];
        if (e == NULL)
            continue;
        for (int k = 0; k < e->depth; k++)
            Py_DECREF((PyObject *)(uintptr_t)e->frames[k].code);
        free(e);
    }
    free(old);
}

static PyObject *
entry_to_tuple(const Entry *e)
{
    PyObject *stack = PyTuple_New(e->depth);
    if (stack == NULL)
        return NULL;
    for (int k = 0; k < e->depth; k++) {
        PyObject *lasti = PyLong_FromUnsignedLong(e->frames[k].lasti);
        if (lasti == NULL) {
            Py_DECREF(stack);
            return NULL;
        }
        PyObject *frame = PyTuple_Pack(2, (PyObject *)(uintptr_t)e->frames[k].code, lasti);
        Py_DECREF(lasti);
        if (frame == NULL) {
            Py_DECREF(stack);
            return NULL;
        }
        PyTuple_SET_ITEM(stack, k, frame);
    }
    const uint64_t *l = e->labels;
    return Py_BuildValue("(N(KKKKK)KK)", stack, (unsigned long long)l[0],
                         (unsigned long long)l[1], (unsigned long long)l[2],
                         (unsigned long long)l[3], (unsigned long long)l[4],
                         (unsigned long long)e->contentions, (unsigned long long)e->delay_ns);
}

/* ---------------------------------------------------------------- the lock types */

typedef struct {
    PyObject_HEAD PyObject *inner;
    const LockKind *kind;
    PyObject *weakreflist;
} ProfiledLock;

static PyTypeObject ProfiledLockType;
static PyTypeObject ProfiledRLockType;

static PyObject *
timed_acquire(ProfiledLock *self, PyObject *args, PyObject *kwargs)
{
    uint64_t start = now_ns();
    PyObject *r = call_method(&self->kind->acquire, self->inner, args, kwargs);
    uint64_t delay = now_ns() - start;
    if (r != NULL)
        record_wait(delay, 0);
    return r;
}

/* acquire() with no arguments: what `with lock:` does. */
static PyObject *
acquire_default(ProfiledLock *self)
{
    PyObject *r = call_method(&self->kind->acquire, self->inner, false_args, NULL);
    if (r != Py_False)
        return r; /* True (the uncontended path), or an error */
    Py_DECREF(r);
    return timed_acquire(self, empty_args, NULL);
}

/* Whether the timeout is one the inner lock accepts with blocking=True (-1, or 0..TIMEOUT_MAX):
 * anything else goes to the inner lock untouched, to fail as it fails. */
static int
plain_timeout(PyObject *timeout)
{
    if (timeout == NULL)
        return 1;
    double t;
    if (PyFloat_CheckExact(timeout))
        t = PyFloat_AS_DOUBLE(timeout);
    else if (PyLong_CheckExact(timeout)) {
        t = PyLong_AsDouble(timeout);
        if (t == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else
        return 0;
    return t == -1.0 || (t >= 0.0 && t <= timeout_max);
}

static PyObject *
pl_acquire(ProfiledLock *self, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) == 0 && (kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0))
        return acquire_default(self);
    static char *kwlist[] = {"blocking", "timeout", NULL};
    int blocking = 1;
    PyObject *timeout = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|pO:acquire", kwlist, &blocking, &timeout))
        return NULL;
    if (!blocking || !plain_timeout(timeout))
        return call_method(&self->kind->acquire, self->inner, args, kwargs);
    PyObject *r = call_method(&self->kind->acquire, self->inner, false_args, NULL);
    if (r != Py_False)
        return r;
    Py_DECREF(r);
    return timed_acquire(self, args, kwargs);
}

static PyObject *
pl_enter(ProfiledLock *self, PyObject *unused)
{
    return acquire_default(self);
}

static PyObject *
pl_release(ProfiledLock *self, PyObject *unused)
{
    return call_noargs(&self->kind->release, self->inner);
}

static PyObject *
pl_exit(ProfiledLock *self, PyObject *const *args, Py_ssize_t nargs)
{
    return call_noargs(&self->kind->release, self->inner);
}

static PyObject *
forward0(ProfiledLock *self, PyObject *name)
{
    return PyObject_CallMethodNoArgs(self->inner, name);
}

static PyObject *
pl_locked(ProfiledLock *self, PyObject *unused)
{
    return forward0(self, str_locked);
}

static PyObject *
pl_at_fork_reinit(ProfiledLock *self, PyObject *unused)
{
    return forward0(self, str_at_fork_reinit);
}

static PyObject *
pl_is_owned(ProfiledLock *self, PyObject *unused)
{
    return forward0(self, str_is_owned);
}

static PyObject *
pl_release_save(ProfiledLock *self, PyObject *unused)
{
    return forward0(self, str_release_save);
}

static PyObject *
pl_recursion_count(ProfiledLock *self, PyObject *unused)
{
    return forward0(self, str_recursion_count);
}

/* What Condition.wait calls to take the lock back after a notify: not timed, as the wait for
 * the notify is not contention. */
static PyObject *
pl_acquire_restore(ProfiledLock *self, PyObject *state)
{
    return PyObject_CallMethodOneArg(self->inner, str_acquire_restore, state);
}

static PyObject *
pl_repr(ProfiledLock *self)
{
    PyObject *inner = PyObject_Repr(self->inner);
    if (inner == NULL)
        return NULL;
    /* "<unlocked _thread.lock object at 0x...>" -> "<profiled unlocked _thread.lock ...>" */
    PyObject *out;
    if (PyUnicode_GET_LENGTH(inner) > 1 && PyUnicode_READ_CHAR(inner, 0) == '<') {
        PyObject *tail = PyUnicode_Substring(inner, 1, PyUnicode_GET_LENGTH(inner));
        out = tail ? PyUnicode_FromFormat("<profiled %U", tail) : NULL;
        Py_XDECREF(tail);
    } else
        out = PyUnicode_FromFormat("<profiled %U>", inner);
    Py_DECREF(inner);
    return out;
}

/* Wraps a new inner lock (a new reference, or NULL with the error of its making).  Neither
 * type can be subclassed and neither is tracked by the GC, so PyObject_New does. */
static PyObject *
wrap_inner(PyObject *type, const LockKind *kind, PyObject *inner)
{
    if (inner == NULL)
        return NULL;
    ProfiledLock *self = PyObject_New(ProfiledLock, (PyTypeObject *)type);
    if (self == NULL) {
        Py_DECREF(inner);
        return NULL;
    }
    self->inner = inner;
    self->kind = kind;
    self->weakreflist = NULL;
    return (PyObject *)self;
}

static PyObject *
make_lock(PyTypeObject *type, const LockKind *kind, PyObject *args, PyObject *kwds)
{
    return wrap_inner((PyObject *)type, kind, PyObject_Call(kind->make, args, kwds));
}

/* `threading.Lock()`, called for every lock a program makes (OpenTelemetry's SDK makes four
 * per span): a vectorcall, which skips type_call's argument tuple. */
static PyObject *
make_lock_fast(PyObject *type, const LockKind *kind, PyObject *const *args, size_t nargsf,
               PyObject *kwnames)
{
    return wrap_inner(type, kind, PyObject_Vectorcall(kind->make, args, nargsf, kwnames));
}

static PyObject *
lock_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return make_lock_fast(type, &lock_kind, args, nargsf, kwnames);
}

static PyObject *
rlock_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    return make_lock_fast(type, &rlock_kind, args, nargsf, kwnames);
}

static PyObject *
lock_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    /* _thread.allocate_lock takes no arguments and says so itself. */
    return make_lock(type, &lock_kind, args, kwds);
}

static PyObject *
rlock_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    return make_lock(type, &rlock_kind, args, kwds);
}

static void
pl_dealloc(ProfiledLock *self)
{
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    Py_XDECREF(self->inner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define ACQUIRE_DOC                                                                            \
    "acquire(blocking=True, timeout=-1) -> bool: as the original; a wait is timed and "        \
    "charged "                                                                                 \
    "to the caller's stack and span"

static PyMethodDef lock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))pl_acquire, METH_VARARGS | METH_KEYWORDS,
     ACQUIRE_DOC},
    {"acquire_lock", (PyCFunction)(void (*)(void))pl_acquire, METH_VARARGS | METH_KEYWORDS,
     ACQUIRE_DOC},
    {"release", (PyCFunction)pl_release, METH_NOARGS, "release()"},
    {"release_lock", (PyCFunction)pl_release, METH_NOARGS, "release()"},
    {"locked", (PyCFunction)pl_locked, METH_NOARGS, "locked() -> bool"},
    {"locked_lock", (PyCFunction)pl_locked, METH_NOARGS, "locked() -> bool"},
    {"__enter__", (PyCFunction)pl_enter, METH_NOARGS, ACQUIRE_DOC},
    {"__exit__", (PyCFunction)(void (*)(void))pl_exit, METH_FASTCALL, "release()"},
    {"_at_fork_reinit", (PyCFunction)pl_at_fork_reinit, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef rlock_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))pl_acquire, METH_VARARGS | METH_KEYWORDS,
     ACQUIRE_DOC},
    {"release", (PyCFunction)pl_release, METH_NOARGS, "release()"},
    {"__enter__", (PyCFunction)pl_enter, METH_NOARGS, ACQUIRE_DOC},
    {"__exit__", (PyCFunction)(void (*)(void))pl_exit, METH_FASTCALL, "release()"},
    {"_is_owned", (PyCFunction)pl_is_owned, METH_NOARGS, NULL},
    {"_release_save", (PyCFunction)pl_release_save, METH_NOARGS, NULL},
    {"_acquire_restore", (PyCFunction)pl_acquire_restore, METH_O, NULL},
    {"_at_fork_reinit", (PyCFunction)pl_at_fork_reinit, METH_NOARGS, NULL},
    /* Removed at import when this Python's RLock has no such method. */
    {"_recursion_count", (PyCFunction)pl_recursion_count, METH_NOARGS, NULL},
    {"locked", (PyCFunction)pl_locked, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProfiledLockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._locks.ProfiledLock",
    .tp_basicsize = sizeof(ProfiledLock),
    .tp_dealloc = (destructor)pl_dealloc,
    .tp_repr = (reprfunc)pl_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A threading.Lock whose waits are timed (see locks.c).",
    .tp_weaklistoffset = offsetof(ProfiledLock, weakreflist),
    .tp_methods = lock_methods,
    .tp_new = lock_new,
    .tp_vectorcall = lock_vectorcall,
};

static PyTypeObject ProfiledRLockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._locks.ProfiledRLock",
    .tp_basicsize = sizeof(ProfiledLock),
    .tp_dealloc = (destructor)pl_dealloc,
    .tp_repr = (reprfunc)pl_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A threading.RLock whose waits are timed (see locks.c).",
    .tp_weaklistoffset = offsetof(ProfiledLock, weakreflist),
    .tp_methods = rlock_methods,
    .tp_new = rlock_new,
    .tp_vectorcall = rlock_vectorcall,
};

/* ---------------------------------------------------------------- module functions */

static PyObject *
mod_start(PyObject *mod, PyObject *args)
{
    int depth;
    if (!PyArg_ParseTuple(args, "i:start", &depth))
        return NULL;
    if (depth < 1 || depth > MAX_WALK) {
        PyErr_Format(PyExc_ValueError, "max_depth must be 1..%d", MAX_WALK);
        return NULL;
    }
    if (table == NULL) {
        Entry **old;
        if (detach_table(&old, 1) < 0)
            return NULL;
        free_table(old); /* NULL: there was none */
    }
    max_depth = depth;
    recording = 1;
    Py_RETURN_NONE;
}

static PyObject *
mod_stop(PyObject *mod, PyObject *unused)
{
    recording = 0;
    Entry **old;
    detach_table(&old, 0);
    free_table(old);
    Py_RETURN_NONE;
}

static PyObject *
mod_collect(PyObject *mod, PyObject *unused)
{
    Entry **old;
    if (detach_table(&old, recording) < 0)
        return NULL;
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out != NULL && old != NULL && i < TABLE_SLOTS; i++) {
        if (old[i] == NULL)
            continue;
        PyObject *item = entry_to_tuple(old[i]);
        if (item == NULL || PyList_Append(out, item) < 0)
            Py_CLEAR(out);
        Py_XDECREF(item);
    }
    free_table(old);
    return out;
}

static PyObject *
mod_record(PyObject *mod, PyObject *args)
{
    unsigned long long delay;
    int skip;
    if (!PyArg_ParseTuple(args, "Ki:record", &delay, &skip))
        return NULL;
    if (skip < 0)
        skip = 0;
    if (skip > MAX_WALK)
        skip = MAX_WALK;
    record_wait((uint64_t)delay, skip);
    Py_RETURN_NONE;
}

static PyObject *
mod_after_fork(PyObject *mod, PyObject *unused)
{
    Entry **old;
    if (detach_table(&old, recording) < 0)
        return NULL;
    free_table(old);
    TABLE_LOCK();
    waits_recorded = waits_dropped = delay_dropped_ns = 0;
    TABLE_UNLOCK();
    Py_RETURN_NONE;
}

static PyObject *
mod_stats(PyObject *mod, PyObject *unused)
{
    TABLE_LOCK();
    uint64_t recorded = waits_recorded, dropped = waits_dropped, dropped_ns = delay_dropped_ns;
    size_t entries = n_entries;
    TABLE_UNLOCK();
    return Py_BuildValue("{sKsKsKsn}", "waits_recorded", (unsigned long long)recorded,
                         "waits_dropped", (unsigned long long)dropped, "delay_dropped_ns",
                         (unsigned long long)dropped_ns, "entries", (Py_ssize_t)entries);
}

static PyMethodDef methods[] = {
    {"start", mod_start, METH_VARARGS, "start(max_depth): record waits from now on"},
    {"stop", mod_stop, METH_NOARGS, "stop(): record no more, drop what was not collected"},
    {"collect", mod_collect, METH_NOARGS,
     "collect() -> [(((code, lasti), ...), labels, contentions, delay_ns)] since the last "
     "call"},
    {"record", mod_record, METH_VARARGS,
     "record(delay_ns, skip): charge a wait to the caller's stack (skip innermost frames) and "
     "labels"},
    {"after_fork", mod_after_fork, METH_NOARGS, "in a forked child: drop the parent's waits"},
    {"stats", mod_stats, METH_NOARGS, "stats() -> dict"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_locks",
    .m_doc = "hotspan's lock-contention collector (see locks.c).",
    .m_size = -1,
    .m_methods = methods,
};

static int
drop_method_unless(PyTypeObject *type, PyTypeObject *inner, const char *name)
{
    if (PyDict_GetItemString(inner->tp_dict, name) != NULL)
        return 0;
    if (PyDict_DelItemString(type->tp_dict, name) < 0)
        return -1;
    PyType_Modified(type);
    return 0;
}

PyMODINIT_FUNC
PyInit__locks(void)
{
    /* PyCapsule_Import would only import the package "hotspan" and then look attributes up,
     * which fails until something imported the sampler: import it first. */
    PyObject *sampler = PyImport_ImportModule("hotspan._speedups._sampler");
    if (sampler == NULL)
        return NULL;
    PyObject *capsule = PyObject_GetAttrString(sampler, "_C_API");
    Py_DECREF(sampler);
    if (capsule == NULL)
        return NULL;
    api = (const HotspanSamplerAPI *)PyCapsule_GetPointer(capsule, HOTSPAN_SAMPLER_API_CAPSULE);
    Py_DECREF(capsule); /* the API is a static of the sampler module, which stays loaded */
    if (api == NULL)
        return NULL;
    if (api->version != HOTSPAN_SAMPLER_API_VERSION) {
        PyErr_SetString(PyExc_ImportError, "hotspan._speedups._sampler: another API version");
        return NULL;
    }
    PyObject *thread = PyImport_ImportModule("_thread");
    if (thread == NULL)
        return NULL;
    lock_kind.make = PyObject_GetAttrString(thread, "allocate_lock");
    rlock_kind.make = PyObject_GetAttrString(thread, "RLock");
    PyObject *lock_type = PyObject_GetAttrString(thread, "LockType");
    PyObject *tmax = PyObject_GetAttrString(thread, "TIMEOUT_MAX");
    Py_DECREF(thread);
    if (lock_kind.make == NULL || rlock_kind.make == NULL || lock_type == NULL || tmax == NULL)
        goto fail;
    timeout_max = PyFloat_AsDouble(tmax);
    if (timeout_max == -1.0 && PyErr_Occurred())
        goto fail;
    if (!PyType_Check(lock_type) || !PyType_Check(rlock_kind.make)) {
        PyErr_SetString(PyExc_ImportError, "_thread's lock types are not types");
        goto fail;
    }
    if (method_ref(&lock_kind.acquire, (PyTypeObject *)lock_type, "acquire") < 0 ||
        method_ref(&lock_kind.release, (PyTypeObject *)lock_type, "release") < 0 ||
        method_ref(&rlock_kind.acquire, (PyTypeObject *)rlock_kind.make, "acquire") < 0 ||
        method_ref(&rlock_kind.release, (PyTypeObject *)rlock_kind.make, "release") < 0)
        goto fail;
    false_args = PyTuple_Pack(1, Py_False);
    empty_args = PyTuple_New(0);
    str_at_fork_reinit = PyUnicode_InternFromString("_at_fork_reinit");
    str_is_owned = PyUnicode_InternFromString("_is_owned");
    str_release_save = PyUnicode_InternFromString("_release_save");
    str_acquire_restore = PyUnicode_InternFromString("_acquire_restore");
    str_recursion_count = PyUnicode_InternFromString("_recursion_count");
    str_locked = PyUnicode_InternFromString("locked");
    if (!false_args || !empty_args || !str_at_fork_reinit || !str_is_owned ||
        !str_release_save || !str_acquire_restore || !str_recursion_count || !str_locked)
        goto fail;
    if (PyType_Ready(&ProfiledLockType) < 0 || PyType_Ready(&ProfiledRLockType) < 0)
        goto fail;
    PyTypeObject *rlock_type = (PyTypeObject *)rlock_kind.make;
    if (drop_method_unless(&ProfiledRLockType, rlock_type, "_recursion_count") < 0 ||
        drop_method_unless(&ProfiledRLockType, rlock_type, "locked") < 0 ||
        drop_method_unless(&ProfiledRLockType, rlock_type, "_at_fork_reinit") < 0 ||
        drop_method_unless(&ProfiledLockType, (PyTypeObject *)lock_type, "_at_fork_reinit") < 0)
        goto fail;
    Py_CLEAR(lock_type);
    Py_CLEAR(tmax);
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifdef Py_GIL_DISABLED
    if (PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    Py_INCREF(&ProfiledLockType);
    if (PyModule_AddObject(m, "ProfiledLock", (PyObject *)&ProfiledLockType) < 0) {
        Py_DECREF(&ProfiledLockType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ProfiledRLockType);
    if (PyModule_AddObject(m, "ProfiledRLock", (PyObject *)&ProfiledRLockType) < 0) {
        Py_DECREF(&ProfiledRLockType);
        Py_DECREF(m);
        return NULL;
    }
    return m;

fail:
    Py_XDECREF(lock_type);
    Py_XDECREF(tmax);
    return NULL;
}
