/* Span stats: the garbage collections, allocation estimate and CPU a span cost, set as its
 * attributes at detach (the linker calls in here), and the gc callback that charges each
 * pause to the span current where it ran.  Apart because it is the one part that reads
 * process figures and talks to the allocation sampler.
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
#include "internal.h"

static uint64_t gc_started_ns;    /* the collection running now (with the GIL) */
int alloc_sampling;                /* an allocation sampler is running (capsule API) */

PyObject *
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

PyObject *
sampler_process_stats(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    long long rss, threads, heap;
    process_stats(&rss, &threads, &heap);
    return Py_BuildValue("(LLL)", rss, threads, heap);
}

PyObject *str_asyncio_events, *str_get_running_loop;
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
void
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

PyObject *str_is_recording, *str_set_attributes, *str_span_processor;
PyObject *key_cpu, *key_alloc, *key_gc_pause, *key_gc_count, *key_rss, *key_threads, *key_heap;

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
PyObject *
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
    if (!failed && count != 0 && (full || pause >= GC_ATTRIBUTE_MIN_NS))
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

void
api_charge_alloc(PyThreadState *ts, uint64_t bytes)
{
    LabelsObject *labels = find_labels(thread_context(ts));
    if (labels != NULL)
        labels_charge(labels, 0, bytes);
}

void
api_set_alloc_sampling(int on)
{
    __atomic_store_n(&alloc_sampling, on, __ATOMIC_RELAXED);
}

PyObject *
sampler_alloc_sampling(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    return PyBool_FromLong(__atomic_load_n(&alloc_sampling, __ATOMIC_RELAXED));
}
