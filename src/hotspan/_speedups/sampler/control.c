/* The module's functions that drive the sampler: start, stop, pin, collect, exclude,
 * register_thread, unregister_thread, stats and after_fork.  Apart because they are the
 * Python-facing entry points, each taking threads_mutex and calling into the other files. */
#include "internal.h"

PyObject *
sampler_start(PyObject *mod, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cpu_interval_ns", "max_depth", "cpu", "wall",
                             "window_ns",       "resume",    NULL};
    unsigned long long interval, window = 0;
    int depth, cpu, wall = 1, resume = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Kip|pKp", kwlist, &interval, &depth, &cpu,
                                     &wall, &window, &resume))
        return NULL;
    if (depth < 1 || depth > 1000 || interval < 1000000ull) {
        PyErr_SetString(PyExc_ValueError, "max_depth must be 1..1000 and the interval >= 1 ms");
        return NULL;
    }
    if (running) {
        PyErr_SetString(PyExc_RuntimeError, "the sampler is already running");
        return NULL;
    }
    thread_state_init(PyThreadState_Get());
    {
        uint64_t waited;
        run_delay_exact = run_delay_of(own_tid(), &waited) == 0;
    }
#ifndef HAVE_THREAD_TIMERS
    PyErr_SetString(PyExc_RuntimeError, "per-thread CPU timers need Linux");
    return NULL;
#else
    {
        clockid_t mine;
        if (pthread_getcpuclockid(pthread_self(), &mine) != 0 ||
            mine != thread_clock(own_tid())) {
            PyErr_SetString(PyExc_RuntimeError,
                            "this kernel encodes thread CPU clocks unknownly");
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
#  ifdef HAVE_PERF_EVENTS
        sigaddset(&sa.sa_mask, PERF_SIGNAL); /* one sample at a time on a thread */
#  endif
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
    reset_excluded(); /* the tids of an earlier agent's threads may belong to new threads now */
    reset_threads();
#  ifdef HAVE_PERF_EVENTS
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
#  endif
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
    if (!resume)
        handover_drop();
    scan_threads();
    handover_drop();
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

PyObject *
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
    handover_keep();
    /* (Its counts of waits may have opened threads' files again: a stopped sampler keeps
     * none.) */
    drop_task_files();
#endif
    atomic_store(&sampling_enabled, 0);
    running = 0;
    pthread_mutex_unlock(&threads_mutex);
    /* The handler stays installed: a signal already queued for a thread must not meet the
     * default SIGPROF action, which kills the process.  Disabled, it returns at once.  The
     * ring is kept for the same reason (a late handler may still be writing to it). */
    Py_RETURN_NONE;
}

PyObject *
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
PyObject *
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
    PyObject *codes = codes_take(release_codes);
    if (codes == NULL) {
        Py_DECREF(windows);
        return NULL;
    }
    uint64_t lost = atomic_exchange(&lost_samples, 0);
    return Py_BuildValue("(NNK)", windows, codes, (unsigned long long)lost);
}

PyObject *
sampler_exclude(PyObject *mod, PyObject *args)
{
    unsigned long ident;
    if (!PyArg_ParseTuple(args, "k", &ident))
        return NULL;
#ifdef HAVE_THREAD_TIMERS
    clockid_t clock;
    if (pthread_getcpuclockid((pthread_t)ident, &clock) != 0)
        Py_RETURN_NONE;
    pid_t tid = (pid_t) ~(clock >> 3);
    lock_threads();
    exclude_tid(tid);
    exclude_ident((uint64_t)ident);
    pthread_mutex_unlock(&threads_mutex);
#endif
    Py_RETURN_NONE;
}

/* Called by a thread as it starts (before it runs anything) and as it ends, so that its CPU
 * timer covers all of its life however short, and is gone with it. */
PyObject *
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

PyObject *
sampler_labels_changed(PyObject *mod, PyObject *unused)
{
    labels_changed();
    Py_RETURN_NONE;
}

/* unregister_thread(code=None).  The kernel checks CPU timers only at its scheduler tick (4 ms
 * at HZ=250): a thread that ends soon after its timer expired never gets that signal, and
 * every thread ends with CPU its samples do not cover yet (half an interval on average; a
 * pool of short threads would lose percents).  That CPU is charged here, to the stack of the
 * thread's last CPU sample, or, for a thread that had none, to `code` (the function the
 * thread ran: its own frames are gone by now) or else to where it is. */
PyObject *
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
        /* Its wall time off CPU since it was last looked at, and what its last sample would
         * have stood for, likewise (a thread of a few ms may end before it is looked at); its
         * time on CPU since is in its CPU tail. */
        uint64_t wall = 0;
        if (wall_on && s->wall_since_ns != 0) {
            if (cpu_now == 0)
                clock_ns(CLOCK_THREAD_CPUTIME_ID, &cpu_now);
            wall = wall_off_cpu(s, monotonic_ns(), cpu_now);
        }
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
            if (wall > 0 && charge_last_wait(s, (uint64_t)ts->thread_id, wall)) {
                /* (Where it waited.) */
            } else if (wall > 0 && depth > 0) {
                /* Ending, it runs Python: it holds the GIL, where that can be told. */
                uint64_t holder = 0;
                int state = thread_state(ts, NULL, &holder);
                add_or_count(wall_kind(state), (uint64_t)ts->thread_id, labels, frames, depth,
                             wall);
            }
        }
        slot_release(index);
    }
    pthread_mutex_unlock(&threads_mutex);
#endif
    Py_RETURN_NONE;
}

PyObject *
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
    return Py_BuildValue("{s:s,s:i,s:i,s:i,s:n,s:i,s:K,s:K,s:K,s:K,s:K}", "cpu_trigger",
                         trigger, "threads", threads, "timers", timers, "python_threads",
                         python, "window_bytes", (Py_ssize_t)bytes, "windows_pending", pending,
                         "lost_samples", (unsigned long long)atomic_load(&lost_samples),
                         "windows_dropped", (unsigned long long)atomic_load(&windows_dropped),
                         "unreadable_stacks",
                         (unsigned long long)atomic_load(&unreadable_stacks), "handler_ns",
                         (unsigned long long)atomic_load(&handler_ns), "handler_signals",
                         (unsigned long long)atomic_load(&handler_calls));
}

PyObject *
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
    reset_excluded();
    reset_threads();
    handover_drop(); /* the parent's threads */
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
