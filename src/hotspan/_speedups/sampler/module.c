/* The module: its method table, the capsule API the other native collectors (alloc/, locks.c)
 * import, and module init.  Apart so that what the module exports is in one place. */
#include "internal.h"

/* The agent's own code (its modules, their dicts, functions and classes) lives as long as the
 * process, so the cyclic GC can never free it, yet every full collection walks it, and in a
 * program whose own heap is small that is a share of each collection.  Untracked, it is not
 * walked; a dict among them that is given a container tracks itself again (CPython does so on
 * insertion), and what these objects refer to counts as referred to from outside.  Each keeps
 * a reference from here for good: CPython frees a function or a class assuming the GC tracks
 * it (an untracked one would crash its deallocation, at exit or when a module's function is
 * replaced), so none of them may ever be freed. */
static PyObject *
sampler_gc_untrack(PyObject *mod, PyObject *objects)
{
    PyObject *seq = PySequence_Fast(objects, "gc_untrack() takes a sequence");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), count = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyObject_IS_GC(items[i]) && PyObject_GC_IsTracked(items[i])) {
            Py_INCREF(items[i]); /* never released: see above */
            PyObject_GC_UnTrack(items[i]);
            count++;
        }
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"start", (PyCFunction)(void (*)(void))sampler_start, METH_VARARGS | METH_KEYWORDS,
     "start(cpu_interval_ns, max_depth, cpu, wall=True, window_ns=0, resume=False) -> bool: "
     "whether CPU timers are on; a window closes every window_ns (0: only at "
     "collect(final=True)); with resume, what threads did since the last stop goes to their "
     "first samples"},
    {"stop", sampler_stop, METH_NOARGS, "stop(): no more samples; what was taken stays"},
    {"pin", sampler_pin, METH_NOARGS,
     "pin(): hold the code objects of the stacks sampled since the last call"},
    {"collect", (PyCFunction)(void (*)(void))sampler_collect, METH_VARARGS | METH_KEYWORDS,
     "collect(final=False, release_codes=True) -> ([(start_ns, end_ns, samples)], codes, "
     "lost)"},
    {"exclude", sampler_exclude, METH_VARARGS, "exclude(ident): never sample this thread"},
    {"register_thread", sampler_register_thread, METH_NOARGS,
     "register_thread(): the calling thread is sampled from now on (call as it starts)"},
    {"unregister_thread", sampler_unregister_thread, METH_VARARGS,
     "unregister_thread(code=None): the calling thread ends (call as it ends), having run "
     "code"},
    {"stats", sampler_stats, METH_NOARGS, "stats() -> dict: threads, timers, losses"},
    {"labels_changed", sampler_labels_changed, METH_NOARGS,
     "labels_changed(): the calling thread's labels changed other than by the C span linker "
     "(a tag set, the Python linker): where it waits is sampled again"},
    {"after_fork", sampler_after_fork, METH_NOARGS, "reset in a forked child"},
    {"enable_labels", sampler_enable_labels, METH_VARARGS, NULL},
    {"find_in", sampler_find_in, METH_O, NULL},
    {"gc_callback", sampler_gc_callback, METH_VARARGS,
     "gc_callback(phase, info): for gc.callbacks; charges each pause to the span current"},
    {"process_stats", sampler_process_stats, METH_NOARGS,
     "process_stats() -> (rss_bytes, threads, allocated_blocks), -1 where unknown (cached 10 "
     "ms)"},
    {"alloc_sampling", sampler_alloc_sampling, METH_NOARGS,
     "alloc_sampling() -> bool: whether the allocation sampler runs (spans get alloc_bytes)"},
    {"thread_labels", sampler_thread_labels, METH_NOARGS,
     "thread_labels() -> {ident: (span, trace_hi, trace_lo, root_span, tagset)}: every "
     "thread's "
     "current labels"},
    {"gc_untrack", sampler_gc_untrack, METH_O,
     "gc_untrack(objects) -> int: the cyclic GC no longer walks these (the agent's own "
     "code, which lives as long as the process); how many were tracked"},
    {"turns", sampler_turns, METH_NOARGS,
     "turns() -> dict: turns at the GIL asked for by a Waker's wait: granted, withdrawn "
     "(not granted in time), overrun (taken back)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "_sampler",
    "hotspan's native sampler (see _speedups/sampler/).",
    -1,
    methods,
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
    if (PyType_Ready(&LabelsType) < 0 || PyType_Ready(&LinkerType) < 0 ||
        PyType_Ready(&WakerType) < 0)
        return NULL;
    str_attach = PyUnicode_InternFromString("attach");
    str_detach = PyUnicode_InternFromString("detach");
    str_get_current = PyUnicode_InternFromString("get_current");
    str_get_span_context = PyUnicode_InternFromString("get_span_context");
    str_parent = PyUnicode_InternFromString("parent");
    str_context_attr = PyUnicode_InternFromString("_context");
    if (!str_attach || !str_detach || !str_get_current || !str_get_span_context ||
        !str_parent || !str_context_attr)
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
    init_threads_fork();
#ifdef Py_GIL_DISABLED
    /* Safe without the GIL (see codes.c, linker.c and labels.c for what that took); without
     * this, importing the module would turn the GIL back on for the whole program. */
    if (PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
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
    Py_INCREF(&WakerType);
    if (PyModule_AddObject(m, "Waker", (PyObject *)&WakerType) < 0) {
        Py_DECREF(&WakerType);
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
