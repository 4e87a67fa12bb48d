/* The module: start, stop, collect, stats and the other module functions, the fork handlers,
 * and module init.  Apart so that what the module exports is in one place. */
#include "internal.h"

static int hooked[N_DOMAINS]; /* ours is in that domain's chain (sampling or inert) */
static int collecting;
/* stop() or after_fork() came while another thread's collect held stacks: it frees them. */
static int release_pending;

static int
import_api(void)
{
    if (api != NULL)
        return 0;
    /* PyCapsule_Import finds attributes, it does not import submodules. */
    PyObject *sampler = PyImport_ImportModule("hotspan._speedups._sampler");
    if (sampler == NULL)
        return -1;
    Py_DECREF(sampler);
    const HotspanSamplerAPI *found = PyCapsule_Import(HOTSPAN_SAMPLER_API_CAPSULE, 0);
    if (found == NULL)
        return -1;
    if (found->version != HOTSPAN_SAMPLER_API_VERSION) {
        PyErr_SetString(PyExc_RuntimeError, "hotspan._speedups._sampler: unknown API version");
        return -1;
    }
    api = found;
    return 0;
}

static PyObject *
alloc_ready(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    if (import_api() < 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* Drops every sample and stack (with the GIL). */
static void
drop_everything(int keep_tracking)
{
    Stack *released = NULL;
    SAMPLE_LOCK();
    live_clear(keep_tracking);
    window_free(&window);
    epoch++; /* every stack is now unused since an older window */
    if (collecting)
        release_pending = 1; /* its rows point at stacks: it releases them when done */
    else
        released = stacks_unlink(1, 0);
    SAMPLE_UNLOCK();
    stacks_release(released); /* may run Python: not under the lock */
}

static PyObject *
alloc_start(PyObject *mod UNUSED, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sample_bytes", "max_depth", NULL};
    long long bytes = 512 * 1024;
    int depth = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|Li", kwlist, &bytes, &depth))
        return NULL;
    if (bytes < 1 || depth < 1 || depth > 4096) {
        PyErr_SetString(PyExc_ValueError, "sample_bytes >= 1, 1 <= max_depth <= 4096");
        return NULL;
    }
    if (import_api() < 0)
        return NULL;
    if (atomic_load(&sampling)) {
        PyErr_SetString(PyExc_RuntimeError, "already started");
        return NULL;
    }
    Frame *buf = malloc((size_t)depth * sizeof(Frame));
    if (buf == NULL)
        return PyErr_NoMemory();
    SAMPLE_LOCK();
    Frame *old_buf = frame_buf;
    frame_buf = buf;
    max_depth = depth;
    SAMPLE_UNLOCK();
    free(old_buf);
    drop_everything(1);
    atomic_store(&sample_bytes, (int64_t)bytes);
    uint32_t gen = atomic_fetch_add(&generation, 1) + 1;
    OBJ_COUNTDOWN = INT64_MAX / 2; /* no MEM/OBJ sample while probing */
    int installed[N_DOMAINS] = {0};
    for (int d = 0; d < N_DOMAINS; d++) {
        if (hooked[d])
            continue; /* inert since a stop() that could not unhook: sampling resumes */
        PyMem_GetAllocator(domains[d], &orig(d));
        redirect[d] = 0;
        raw_offset[d] = 0;
        PyMemAllocatorEx ours = our_allocator(d);
        PyMem_SetAllocator(domains[d], &ours);
        hooked[d] = installed[d] = 1;
    }
    forwarding_unclear = 0;
    for (int d = 1; d < N_DOMAINS; d++) {
        forward_above[d] = SIZE_MAX; /* while probing: the hook counts everything */
        forward_above[d] = find_forwarding(d);
    }
    for (int d = 1; d < N_DOMAINS; d++) {
        if (!installed[d] || !probe_redirect(d)) {
            if (installed[d])
                raw_offset[d] = 0;
            continue;
        }
        /* That domain's free goes straight to its allocator: nothing it frees is ours. */
        redirect[d] = 1;
        PyMemAllocatorEx ours = our_allocator(d);
        PyMem_SetAllocator(domains[d], &ours);
    }
    arm_thread(gen);
#ifdef Py_GIL_DISABLED
    tls_obj_generation = gen;
#endif
    OBJ_COUNTDOWN = draw_interval((int64_t)bytes);
    atomic_store_explicit(&sampling, 1, memory_order_release);
    api->set_alloc_sampling(1);
    Py_RETURN_NONE;
}

static PyObject *
alloc_stop(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    atomic_store_explicit(&sampling, 0, memory_order_release);
    if (api != NULL)
        api->set_alloc_sampling(0);
    int inert = 0;
    for (int d = 0; d < N_DOMAINS; d++) {
        if (!hooked[d])
            continue;
        if (is_ours(d)) {
            PyMem_SetAllocator(domains[d], &orig(d));
            hooked[d] = 0;
            redirect[d] = 0;
            raw_offset[d] = 0;
        } else {
            /* Someone chained on top of us: restoring what was there before us would cut
             * them out.  Stay in the chain, forwarding only. */
            inert++;
        }
    }
    drop_everything(0);
    return PyLong_FromLong(inert);
}

typedef struct {
    Stack *stack;
    uint64_t labels[HOTSPAN_LABEL_WORDS];
    double values[4];
} Row;

static PyObject *
build_stack(Stack *s)
{
    if (s->built != NULL)
        return Py_NewRef(s->built);
    PyObject *tuple = PyTuple_New(s->depth);
    if (tuple == NULL)
        return NULL;
    for (uint32_t i = 0; i < s->depth; i++) {
        PyObject *pair = Py_BuildValue("(OI)", (PyObject *)(uintptr_t)s->frames[i].code,
                                       (unsigned int)s->frames[i].lasti);
        if (pair == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, pair);
    }
    s->built = Py_NewRef(tuple);
    return tuple;
}

static PyObject *
alloc_collect(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return out;
    SAMPLE_LOCK();
    if (collecting) {
        SAMPLE_UNLOCK();
        return out;
    }
    collecting = 1;
    int was_busy = tls_busy;
    tls_busy = 1; /* our own allocations here are not the program's */

    /* Until the rows are copied out, no Python call: nothing may sample meanwhile. */
    Window taken = window;
    memset(&window, 0, sizeof(window));
    uint64_t closing = epoch++;
    size_t dropped_inuse = 0;
    pthread_mutex_lock(&live_mutex);
    for (size_t i = 0; i < live_cap; i++) {
        LiveSlot *live = &live_slots[i];
        if (live->ptr == 0)
            continue;
        WindowSlot *slot = window_slot(&taken, live->stack, live->labels);
        if (slot == NULL) {
            dropped_inuse++;
            continue;
        }
        double weight = 1.0 / one_minus_exp_neg((double)live->size / (double)sample_bytes);
        slot->values[2] += weight;
        slot->values[3] += weight * (double)live->size;
        live->stack->last_epoch = closing; /* in `taken`: kept until it is built */
    }
    Filter *f = atomic_load_explicit(&live_filter, memory_order_relaxed);
    if (filter_bits_for(live_count * 4) < 64 - f->shift) /* far too big for what lives now */
        filter_rebuild(filter_bits_for(live_count));
    pthread_mutex_unlock(&live_mutex);
    n_dropped_window += dropped_inuse;
    Stack *released = stacks_unlink(0, closing);
    SAMPLE_UNLOCK();

    Row *rows = taken.count ? malloc(taken.count * sizeof(Row)) : NULL;
    size_t n_rows = 0;
    if (rows != NULL) {
        for (size_t i = 0; i < taken.cap; i++) {
            WindowSlot *slot = &taken.slots[i];
            if (slot->stack == NULL)
                continue;
            rows[n_rows].stack = slot->stack;
            memcpy(rows[n_rows].labels, slot->labels, sizeof(slot->labels));
            memcpy(rows[n_rows].values, slot->values, sizeof(slot->values));
            n_rows++;
        }
    } else if (taken.count) {
        n_dropped_window += taken.count;
    }
    window_free(&taken);

    /* The rows' stacks stay in the table (last used in `closing`) until the next collect,
     * the only place that releases them. */
    int failed = 0;
    for (size_t i = 0; i < n_rows && !failed; i++) {
        Row *r = &rows[i];
        PyObject *stack = build_stack(r->stack);
        PyObject *row =
            stack == NULL
                ? NULL
                : Py_BuildValue(
                      "(N(KKKKK)LLLL)", stack, (unsigned long long)r->labels[0],
                      (unsigned long long)r->labels[1], (unsigned long long)r->labels[2],
                      (unsigned long long)r->labels[3], (unsigned long long)r->labels[4],
                      (long long)(r->values[0] + 0.5), (long long)(r->values[1] + 0.5),
                      (long long)(r->values[2] + 0.5), (long long)(r->values[3] + 0.5));
        if (row == NULL || PyList_Append(out, row) < 0)
            failed = 1;
        Py_XDECREF(row);
    }
    for (size_t i = 0; i < n_rows; i++)
        Py_CLEAR(rows[i].stack->built);
    free(rows);
    stacks_release(released);
    Stack *pending = NULL;
    SAMPLE_LOCK();
    if (release_pending) {
        release_pending = 0;
        pending = stacks_unlink(0, epoch);
    }
    collecting = 0;
    SAMPLE_UNLOCK();
    stacks_release(pending);
    tls_busy = was_busy;
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *
alloc_after_fork(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    /* A collect on a parent thread is not coming back (the mutex: see fork_prepare). */
    collecting = 0;
    release_pending = 0;
    tls_busy = 0;
    int keep = atomic_load(&sampling);
    drop_everything(keep);
    atomic_fetch_add(&generation, 1);
    Py_RETURN_NONE;
}

static PyObject *
alloc_stats(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    pthread_mutex_lock(&live_mutex);
    unsigned long long live = live_count, checks = n_free_checks, freed = n_live_freed,
                       live_dropped = n_dropped_live;
    pthread_mutex_unlock(&live_mutex);
    int hooked_n = 0, inert_n = 0;
    for (int d = 0; d < N_DOMAINS; d++) {
        hooked_n += hooked[d];
        inert_n += hooked[d] && !atomic_load(&sampling);
    }
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsnsisisnsisisisK}", "samples", (unsigned long long)n_samples,
        "no_stack", (unsigned long long)n_no_stack, "dropped_stacks",
        (unsigned long long)n_dropped_stacks, "dropped_window",
        (unsigned long long)n_dropped_window, "dropped_live", live_dropped, "no_gil",
        (unsigned long long)atomic_load(&n_no_gil), "live", live, "free_checks", checks,
        "live_freed", freed, "stacks", (Py_ssize_t)stack_count, "hooked_domains", hooked_n,
        "inert_domains", inert_n, "obj_forwards_above",
        forward_above[2] == SIZE_MAX ? (Py_ssize_t)-1 : (Py_ssize_t)forward_above[2],
        "forwarding_unclear", forwarding_unclear, "redirected_domains",
        redirect[1] + redirect[2], "filter_bits", 64 - (int)atomic_load(&live_filter)->shift,
        "filter_rebuilds", (unsigned long long)n_filter_rebuilds);
}

static PyObject *
alloc_exclude_thread(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    /* The agent's own threads (encoding, uploading) allocate for the agent, not the program:
     * their allocations are never sampled.  collect() saves and restores the flag. */
    tls_busy = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"exclude_thread", alloc_exclude_thread, METH_NOARGS,
     "exclude_thread(): never sample the allocations of the calling thread"},
    {"ready", alloc_ready, METH_NOARGS,
     "ready() -> bool: whether _sampler's stack and label readers can be had"},
    {"start", (PyCFunction)(void (*)(void))alloc_start, METH_VARARGS | METH_KEYWORDS,
     "start(sample_bytes=524288, max_depth=64): hook the allocators and sample"},
    {"stop", alloc_stop, METH_NOARGS,
     "stop() -> int: unhook and drop all samples; returns how many domains stay hooked "
     "(inert, forwarding only) because another hook was installed on top of ours"},
    {"collect", alloc_collect, METH_NOARGS,
     "collect() -> [(stack, labels, alloc_objects, alloc_space, inuse_objects, inuse_space)]: "
     "allocations since the last call and the sampled ones alive now, per stack and labels"},
    {"after_fork", alloc_after_fork, METH_NOARGS,
     "in a forked child: drop the parent's samples"},
    {"stats", alloc_stats, METH_NOARGS, "stats() -> dict of counts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_alloc",
    "hotspan's allocation sampler (see _speedups/alloc/).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

/* A thread without the GIL may hold live_mutex (a RAW free) as another forks: the child's
 * first free that reaches the table would wait for it forever, before Python (and our
 * after_fork) runs there.  So no fork happens while it is held. */
static void
fork_prepare(void)
{
    SAMPLE_LOCK(); /* taken before live_mutex, as a sample does */
    pthread_mutex_lock(&live_mutex);
}

static void
fork_parent(void)
{
    pthread_mutex_unlock(&live_mutex);
    SAMPLE_UNLOCK();
}

static void
fork_child(void)
{
    pthread_mutex_unlock(&live_mutex);
    SAMPLE_UNLOCK();
}

PyMODINIT_FUNC
PyInit__alloc(void)
{
    static int atfork_registered;
    if (!atfork_registered && pthread_atfork(fork_prepare, fork_parent, fork_child) == 0)
        atfork_registered = 1;
    if (atomic_load(&live_filter) == NULL) { /* not again for a second interpreter */
        filters[0].shift = filters[1].shift = 64 - FILTER_MIN_BITS;
        atomic_store(&live_filter, &filters[0]);
    }
    PyObject *m = PyModule_Create(&module);
#ifdef Py_GIL_DISABLED
    /* Safe without the GIL (see OBJ_COUNTDOWN and SAMPLE_LOCK in internal.h). */
    if (m != NULL && PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED) < 0)
        Py_CLEAR(m);
#endif
    return m;
}
