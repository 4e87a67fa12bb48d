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
 *
 * One extension module, hotspan._speedups._sampler, built from the files of this directory;
 * this header is what they share (nothing here is exported from the module, see HIDDEN):
 *
 *   labels.c      the Labels type and finding it in a thread's context
 *   frames.c      walking a thread's frames
 *   state.c       whether a thread holds the GIL or is collecting garbage
 *   threads.c     thread slots, their CPU timers and perf events
 *   handler.c     the signal handler and the ring it writes
 *   windows.c     upload windows: samples aggregated in C memory
 *   collector.c   the native collector thread
 *   codes.c       code objects checked and kept alive; windows made into dicts
 *   control.c     start, stop, collect and the other functions that drive the sampler
 *   span_stats.c  what a span cost (gc pauses, allocations, CPU) and the gc callback
 *   linker.c      the span linker (OpenTelemetry's runtime context, wrapped)
 *   module.c      the method table, the capsule API and module init
 */
#ifndef HOTSPAN_SAMPLER_INTERNAL_H
#define HOTSPAN_SAMPLER_INTERNAL_H

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

#include "../sampler_api.h"

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
static inline PyObject *
Py_NewRef(PyObject *o)
{
    Py_INCREF(o);
    return o;
}
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
/* What a window's samples are (agent/samples.py has the same numbers).  Wall time goes by
 * the thread's state as its sample was taken (state.c): unknown where it cannot be told. */
#define KIND_CPU 0
#define KIND_WALL 1          /* state unknown */
#define KIND_WALL_RUNNING 2  /* holding the GIL */
#define KIND_WALL_GIL_WAIT 3 /* waiting for the GIL */
#define KIND_WALL_RELEASED 4 /* neither: off CPU, or native code that let the GIL go */
#define KIND_GIL_HELD 5      /* on the holder's stack: the time others waited for its GIL */
#define KIND_WALL_CPU_WAIT 6 /* runnable, waiting for a core */
#define MAX_WINDOW_BYTES ((size_t)64 << 20)
#define MAX_DONE_WINDOWS 64
/* A thread that used less CPU than this since its last sample is taken to be where it was. */
#ifndef REPEAT_CPU_NS
#  define REPEAT_CPU_NS 100000ull
#endif
/* A tick that comes late still counts the time that passed, but a process stopped (SIGSTOP,
 * a laptop lid) is not all "wall". */
#define MAX_WALL_PER_TICK_NS 1000000000ull
/* An idle thread is looked at at least this often, and the collector wakes at least this often
 * (when every thread is idle, only this often). */
#define IDLE_CHECK_NS 100000000ull
/* A thread found idle is looked at every interval for this many intervals, then less and less
 * often (up to IDLE_CHECK_NS).  What it does after it wakes is seen only at the next look, and
 * short waits that fit between two looks go to the waits either side of them: with looks
 * spaced up to 100 ms from the first, a thread's waits of 5-80 ms between waits of 50-300 ms
 * were charged 20-25% short (0-2% looked at every interval).  A look is a read of its CPU
 * clock (0.4 us), and a thread idle for long is likely to stay so (a pool's idle workers). */
#define IDLE_CHECK_INTERVALS 30
/* Wall signals an interval takes from threads that mostly wait (see wall_tick), and the most
 * intervals one such sample may stand for. */
#define WALL_WAIT_SIGNALS_PER_TICK 2
#define WALL_WAIT_MAX_STRIDE 10
/* A thread that handles its wall timer's signal this much after the timer expired, in its own
 * code (not blocked in a system call), was not running meanwhile: it was waiting for a core (a
 * running thread is interrupted within microseconds, a runnable one waits for its turn,
 * milliseconds).  How long, the kernel tells where it counts (run_delay_exact). */
#define LATE_SIGNAL_NS 1000000ull
#define CODE_SET_BITS 15         /* 32768 slots (256 KiB), at most half used */
#define CODE_SET_MAX (1u << (CODE_SET_BITS - 1))

/* What one file of the module defines for the others: hidden, so that the module exports
 * nothing but its init function, as when it was one file of statics. */
#define HIDDEN __attribute__((visibility("hidden")))

/* ---------------------------------------------------------------- labels.c: labels */

typedef struct {
    PyObject_HEAD uint64_t span_id;
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
    /* The span's trace id as OpenTelemetry holds it (a strong reference, or NULL): a child
     * span's context holds its parent's very int, and the linker then takes trace_hi and
     * trace_lo from the parent's labels instead of converting a 128-bit int again. */
    PyObject *trace_obj;
    /* Span stats (see span_stats.c).  cpu_ns: the CPU of the samples taken with these
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

HIDDEN extern PyTypeObject LabelsType;
HIDDEN LabelsObject *find_labels(PyObject *context);
HIDDEN void copy_labels(LabelsObject *labels, uint64_t *out);
HIDDEN PyObject *sampler_enable_labels(PyObject *mod, PyObject *args);
HIDDEN PyObject *sampler_find_in(PyObject *mod, PyObject *ctx);
HIDDEN PyObject *sampler_thread_labels(PyObject *mod, PyObject *unused);

/* ---------------------------------------------------------------- frames.c: frames */

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

HIDDEN extern _Atomic uint64_t unreadable_stacks;
HIDDEN int safe_read(const void *address, void *out, size_t size);
HIDDEN int walk_frames(PyThreadState *ts, RawFrame *out, int max_depth);
/* Where the thread keeps its newest frame, and where it is from there (its newest two frames
 * and their instructions, as one number; `safe`: read through safe_read, from another thread).
 * 0 on success. */
HIDDEN const void *frame_field(PyThreadState *ts);
HIDDEN int where_at(const void *field, int safe, uint64_t *out);

/* ---------------------------------------------------------------- state.c: thread state */

/* The synthetic frame a sample taken during a garbage collection ends in (RawFrame.code; no
 * code object is at an odd address), its lasti the generation collected. */
#define GC_FRAME_CODE 1u
/* The frame the GIL-held profile puts the time others waited while one of the agent's own
 * (unsampled) threads held the GIL in: the agent names it "hotspan". */
#define AGENT_FRAME_CODE 3u
/* In a signal handler, given the thread's state (thread_state's answer): the generation the
 * cyclic collector is collecting on this thread (0-2; 3: collecting, which generation not
 * told, as on 3.14), or -1 when it is not running here (or where this build cannot tell:
 * free-threaded builds for now). */
HIDDEN int collecting_generation(PyThreadState *ts, int state);

enum {
    STATE_UNKNOWN = 0,
    STATE_RUNNING = 1,
    STATE_GIL_WAIT = 2,
    STATE_RELEASED = 3,
    STATE_CPU_WAIT = 4
};

/* With the GIL, as sampling starts: where the interpreter's GIL is. */
HIDDEN void thread_state_init(PyThreadState *ts);
/* In a signal handler (`ucontext` its third argument): the thread's STATE_*; for a thread
 * waiting for the GIL, `*holder` is the holder's thread state (0 if none). */
HIDDEN int thread_state(PyThreadState *ts, const void *ucontext, uint64_t *holder);
/* Whether a futex at `address` is the one threads wait on for a turn at the GIL with the
 * agent's thread (turns.c): waiting there is waiting for the GIL. */
HIDDEN int waits_for_turn(uintptr_t address);
/* In a signal handler: 1 if the signal interrupted a system call the thread was blocked in, 0
 * if it interrupted the thread's own code, -1 if that cannot be told. */
HIDDEN int interrupted_in_syscall(const void *ucontext);
/* The thread state that holds the GIL now, or 0. */
HIDDEN uint64_t gil_holder_now(void);
/* The collector's: the state of a thread that has not run since it was last looked at, from
 * the system call it is blocked in (STATE_GIL_WAIT or STATE_RELEASED), or STATE_CPU_WAIT
 * when it is in none (runnable: waiting for a core); -1 if unknown. */
HIDDEN int blocked_state(pid_t tid);
/* The thread ident (threading.get_ident()) of a thread state that may be gone, or 0. */
HIDDEN uint64_t thread_ident_of(uint64_t tstate);
/* The collector's: the time thread `tid` has spent runnable without a core since it began, as
 * the kernel counts it: 0 with `*ns` set, -1 where the kernel does not say. */
HIDDEN int run_delay_of(pid_t tid, uint64_t *ns);
/* Set as sampling starts, if run_delay_of answers: the collector then charges each thread's
 * waits for a core as the kernel counts them, less what samples found as it happened (a
 * signal handled late, a thread runnable all along). */
HIDDEN extern int run_delay_exact;

static inline uint32_t
wall_kind(int state)
{
    switch (state) {
    case STATE_RUNNING: return KIND_WALL_RUNNING;
    case STATE_GIL_WAIT: return KIND_WALL_GIL_WAIT;
    case STATE_RELEASED: return KIND_WALL_RELEASED;
    case STATE_CPU_WAIT: return KIND_WALL_CPU_WAIT;
    default: return KIND_WALL;
    }
}

/* ---------------------------------------------------------------- handler.c: the ring */

/* One sample as a signal handler records it on its own thread: the stack and labels, the CPU
 * it stands for (0: none), and whether the wall timer asked for it. */
typedef struct {
    _Atomic int state; /* 0 free, 1 being written, 2 ready */
    int depth;
    int slot;          /* the thread's slot, or -1 */
    uint32_t seq;      /* the slot's sample count when taken */
    uint64_t ident;
    uint64_t cpu_ns;
    uint64_t labels[5];
    int thread_state;    /* STATE_* as it was taken */
    int wall_sample;     /* taken by the wall timer: where the thread was at its moment */
    int on_cpu;          /* that thread was running then (not blocked, nor waiting) */
    uint64_t gil_holder; /* waiting for the GIL: the holder's thread state, else 0 */
    uint32_t labels_gen; /* its slot's labels_gen when taken */
    RawFrame frames[];
} Entry;

HIDDEN extern char *ring;
HIDDEN extern size_t entry_size;
HIDDEN extern int max_depth;
HIDDEN extern _Atomic unsigned long ring_pos;
HIDDEN extern unsigned long drain_pos;
HIDDEN extern _Atomic uint64_t lost_samples;
HIDDEN extern _Atomic int sampling_enabled;
HIDDEN extern int running;
HIDDEN extern int cpu_on;
HIDDEN extern int wall_on;
HIDDEN extern uint64_t cpu_interval_ns;

static inline Entry *
entry_at(size_t i)
{
    return (Entry *)(ring + (i % RING_CAPACITY) * entry_size);
}

static inline uint64_t
realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* `ns` nanoseconds as a timespec: a deadline on a clock, or a timer's interval. */
static inline struct timespec
timespec_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    return ts;
}

static inline uint64_t
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- threads.c: threads */

/* Every thread of the process has a slot, found by the collector (a scan of /proc/self/task)
 * or made by the thread itself as it starts (register_thread).  A signal carries its thread's
 * slot index, so the handler needs no lookup; it checks the slot is still its own. */
enum { PY_UNKNOWN = 0, PY_YES = 1, PY_NO = 2 };

typedef struct {
    uint64_t ident;
    uint64_t labels[5];
    uint32_t seq;
    int depth;
    int thread_state; /* STATE_* as the sample was taken */
    uint64_t gil_holder; /* waiting for the GIL: the holder's thread state then, else 0 */
    int on_cpu;          /* running as it was taken */
    uint32_t labels_gen; /* its slot's labels_gen then */
    RawFrame frames[];
} WallCopy; /* a thread's last wall sample, charged again while the thread does not run */

typedef struct {
    _Atomic pid_t tid;                 /* 0: free */
    _Atomic int python;                /* whether it has a Python thread state (PY_*) */
    /* Wall time off CPU that no sample has stood for yet: the next one taken off CPU does. */
    _Atomic uint64_t pending_wall_ns;
    /* Set as its wall timer is armed, taken by the handler: the sample then stands for the
     * interval it lands in, charged at the next tick (wall_tick). */
    _Atomic int wall_wanted;
    _Atomic uint64_t wall_due_ns; /* monotonic: when that timer expires */
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
    _Atomic uint32_t seq; /* samples it took */
    /* Where its last wall sample found it (where_at), and where to read that again. */
    _Atomic uint64_t where;
    _Atomic uintptr_t where_field;
    _Atomic int perf_first; /* its perf event still has its random first period */
    /* Moved by the thread itself each time the span linker changes its labels (see
     * labels_changed): a thread that has not run since its last wall sample is where that
     * sample was, but no longer in that sample's span if this moved.  The moment of the first
     * change since the collector last looked (monotonic, 0: none) splits the time between. */
    _Atomic uint32_t labels_gen;
    _Atomic uint64_t labels_changed_ns;
    /* The rest belongs to whoever holds `threads_mutex`. */
    int has_timer; /* a CPU trigger: `timer`, or `perf_fd` when cpu_by_perf */
    int cpu_by_perf;
    int perf_fd;
    uint64_t perf_armed_cpu; /* its CPU clock when its event was made */
    timer_t timer; /* on the thread's CPU clock, periodic */
    int has_wall_timer;
    timer_t wall_timer; /* on CLOCK_MONOTONIC, one-shot, set by each wall tick */
    unsigned scan_mark;
    uint64_t cpu_at_tick; /* its CPU clock at the last check */
    uint64_t run_delay_ns; /* 1 + its run_delay_of at the last count; 0: none yet */
    /* Its schedstat file, kept open (slot_run_delay): the descriptor plus 1 (0: none), and
     * the file's identity, so that only that file is ever closed. */
    int schedstat_fd1;
    unsigned long long schedstat_ino, schedstat_dev;
    int64_t core_wait_debt_ns; /* counted by the kernel, not charged yet (collector.c) */
    uint64_t wall_since_ns; /* monotonic: its wall time is charged up to here */
    uint64_t next_check_ns; /* monotonic: when to look at it again */
    int idle_checks; /* checks in a row that found it had not run */
    uint64_t next_probe_ns;
    WallCopy *last_wall; /* NULL until its first wall sample is drained */
    WallCopy *last_cpu; /* its last CPU sample: where its remaining CPU goes */
    int wall_waits_skipped; /* wall signals it was spared in a row (wall_tick) */
    int counts_skipped; /* counts of its waits for a core skipped in a row (wall_tick) */
    int wall_armed; /* a wall timer was armed at the last tick (or is still awaited) */
    int wall_now; /* and it was asked at once (see wall_tick) */
    int pending_after_change; /* pending_wall_ns holds time since a change of its labels */
    uint32_t pending_gen; /* labels_gen when pending_wall_ns was last added to */
    uint32_t wall_armed_seq; /* `seq` as it was armed */
} ThreadSlot;

HIDDEN extern ThreadSlot slots[MAX_THREADS];

/* The span linker, on the thread whose labels it has just changed (see labels_gen).  On every
 * span's path: inline, its slot found once per thread (labels_changed_lookup). */
#ifdef HAVE_THREAD_TIMERS
typedef struct {
    int slot; /* its slot as last found, or -1 */
    pid_t tid; /* its tid then */
    unsigned missed; /* slots_made + 1 when it last found none */
} OwnSlot;
HIDDEN extern __thread OwnSlot own_slot;
HIDDEN void labels_changed_lookup(void);

static inline void
labels_changed(void)
{
    if (!running)
        return;
    int index = own_slot.slot;
    if (index < 0 ||
        atomic_load_explicit(&slots[index].tid, memory_order_relaxed) != own_slot.tid) {
        labels_changed_lookup();
        return;
    }
    /* One writer, this thread: a plain increment, no locked instruction; a clock read only
     * for the first change since the collector last looked. */
    ThreadSlot *s = &slots[index];
    atomic_store_explicit(&s->labels_gen,
                          atomic_load_explicit(&s->labels_gen, memory_order_relaxed) + 1,
                          memory_order_relaxed);
    if (atomic_load_explicit(&s->labels_changed_ns, memory_order_relaxed) == 0)
        atomic_store_explicit(&s->labels_changed_ns, monotonic_ns(), memory_order_relaxed);
}
#else
static inline void
labels_changed(void)
{
}
#endif

/* Whether the thread's labels changed since its last wall sample (see labels_gen). */
static inline int
labels_moved(ThreadSlot *s)
{
    const WallCopy *c = s->last_wall;
    return c != NULL && c->depth > 0 &&
           c->labels_gen != atomic_load_explicit(&s->labels_gen, memory_order_relaxed);
}

/* Whether the thread's CPU samples charge its time on CPU to the wall profile too (drain_ring),
 * leaving wall_tick only its time off CPU. */
static inline int
cpu_charges_wall(const ThreadSlot *s)
{
    return wall_on && cpu_on && s->has_timer;
}
HIDDEN extern int used_slots[MAX_THREADS];
HIDDEN extern int n_used_slots;
HIDDEN extern pthread_mutex_t threads_mutex;
HIDDEN extern int n_excluded;

static inline uint64_t
next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static inline uint64_t
mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

HIDDEN int tid_map_get(pid_t tid);
HIDDEN int is_excluded(pid_t tid);
HIDDEN void reset_threads(void);
HIDDEN int slot_for(pid_t tid, int python);
HIDDEN void handover_keep(void);
HIDDEN void handover_drop(void);
HIDDEN void init_threads_fork(void);
HIDDEN void codes_after_fork(void);
HIDDEN void slot_release(int index);
HIDDEN void exclude_tid(pid_t tid);
/* Under threads_mutex: the agent's threads by ident too, and whether an ident is one. */
HIDDEN void exclude_ident(uint64_t ident);
HIDDEN int is_agent_ident(uint64_t ident);
HIDDEN void reset_excluded(void);
HIDDEN int clock_ns(clockid_t clock, uint64_t *out);
HIDDEN const char *cpu_trigger_name(void);

#ifdef HAVE_THREAD_TIMERS
HIDDEN pid_t own_tid(void);

/* The kernel's encoding of a thread's CPU clock (CPUCLOCK_SCHED | CPUCLOCK_PERTHREAD); start()
 * checks it against pthread_getcpuclockid before anything relies on it. */
static inline clockid_t
thread_clock(pid_t tid)
{
    return (clockid_t)((~(unsigned)tid << 3) | 6u);
}

HIDDEN void arm(ThreadSlot *s, int index);
/* run_delay_of for a slot's thread, through the slot's kept file; and that file let go (the
 * thread's slot freed or reused), or every thread's (sampling stopped, in a forked child). */
HIDDEN int slot_run_delay(ThreadSlot *s, pid_t tid, uint64_t *ns);
HIDDEN void drop_task_file(ThreadSlot *s);
HIDDEN void drop_task_files(void);
HIDDEN void disarm(ThreadSlot *s);
HIDDEN void disarm_afresh(ThreadSlot *s);
HIDDEN int thread_timer(ThreadSlot *s, clockid_t clock, int magic, int index, timer_t *out);
HIDDEN int timer_alive(ThreadSlot *s);
#endif

#ifdef HAVE_PERF_EVENTS
enum { PERF_UNTRIED, PERF_WITH_KERNEL, PERF_USER_ONLY, PERF_OFF };
#  define PERF_FDS 4096
HIDDEN extern int perf_state;
HIDDEN extern int perf_main_only;
HIDDEN extern _Atomic int perf_fd_slot[PERF_FDS];
HIDDEN extern _Atomic unsigned long perf_signals;
HIDDEN extern int perf_signal;
HIDDEN extern struct sigaction previous_perf_action;
HIDDEN int install_perf_handler(void);
HIDDEN void check_perf_signals(ThreadSlot *s);
#endif

/* ---------------------------------------------------------------- handler.c: the signal handler */

#ifdef HAVE_THREAD_TIMERS
HIDDEN extern struct sigaction previous_action;
HIDDEN extern int handler_installed;
HIDDEN extern _Atomic uint64_t handler_ns;
HIDDEN extern _Atomic uint64_t handler_calls;
HIDDEN void on_signal(int signum, siginfo_t *info, void *ucontext);
HIDDEN int schedule_wall_sample(ThreadSlot *s, int index, uint64_t offset_ns);
HIDDEN int ask_for_sample(pid_t tid, int index);
#endif

/* ---------------------------------------------------------------- windows.c: windows */

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

HIDDEN extern Window *current;
HIDDEN extern Window *done_head, *done_tail;
HIDDEN extern int n_done;
HIDDEN extern size_t window_bytes;
HIDDEN extern _Atomic uint64_t windows_dropped;
HIDDEN extern uint64_t window_ns;
HIDDEN extern uint64_t window_deadline;
HIDDEN Window *window_new(void);
HIDDEN void window_free(Window *w);
HIDDEN void add_or_count(uint32_t kind, uint64_t ident, const uint64_t *labels,
                         const RawFrame *frames, int depth, uint64_t value);
HIDDEN void finish_window(void);

/* ---------------------------------------------------------------- collector.c: the collector */

HIDDEN void drain_ring(void);
HIDDEN void lock_threads(void);
#ifdef Py_GIL_DISABLED
HIDDEN PyObject *labels_of_last_samples(void);
#endif
#ifdef HAVE_THREAD_TIMERS
HIDDEN extern unsigned scan_generation;
HIDDEN extern pthread_cond_t collector_wake;
HIDDEN extern int collector_started;
HIDDEN void scan_threads(void);
HIDDEN void charge_cpu_tail(ThreadSlot *s, uint64_t cpu_now, uint64_t ident,
                            const uint64_t *labels, const RawFrame *fallback, int depth);
HIDDEN void charge_cpu_tails(void);
/* Under threads_mutex, as thread `s` (`ident`) ends: `amount` of its wall time off CPU charged
 * where its last wall sample was, when the last look found it waiting there still and it has
 * not changed span since (it waited there until it woke to end).  0: not charged. */
HIDDEN int charge_last_wait(ThreadSlot *s, uint64_t ident, uint64_t amount);
/* Under threads_mutex: the thread's wall time not charged yet that it spent off CPU (its CPU
 * clock now `cpu_now`), what is pending included, taken from the slot. */
HIDDEN uint64_t wall_off_cpu(ThreadSlot *s, uint64_t now_ns, uint64_t cpu_now);
HIDDEN void charge_owed(void);
HIDDEN int start_collector(void);
HIDDEN void stop_collector(void);
#endif

/* ---------------------------------------------------------------- codes.c: code registry */

HIDDEN extern uint64_t *code_set;
HIDDEN extern unsigned code_set_count;
HIDDEN extern PyObject *code_refs;
HIDDEN void pin_window(Window *w);
HIDDEN PyObject *window_dict(Window *w);
HIDDEN PyObject *codes_take(int release);

/* ---------------------------------------------------------------- control.c: module functions */

HIDDEN PyObject *sampler_start(PyObject *mod, PyObject *args, PyObject *kwds);
HIDDEN PyObject *sampler_stop(PyObject *mod, PyObject *unused);
HIDDEN PyObject *sampler_pin(PyObject *mod, PyObject *unused);
HIDDEN PyObject *sampler_collect(PyObject *mod, PyObject *args, PyObject *kwds);
HIDDEN PyObject *sampler_exclude(PyObject *mod, PyObject *args);
HIDDEN PyObject *sampler_register_thread(PyObject *mod, PyObject *unused);
HIDDEN PyObject *sampler_labels_changed(PyObject *mod, PyObject *unused);
HIDDEN PyObject *sampler_unregister_thread(PyObject *mod, PyObject *args);
HIDDEN PyObject *sampler_stats(PyObject *mod, PyObject *unused);
HIDDEN PyObject *sampler_after_fork(PyObject *mod, PyObject *unused);

/* ---------------------------------------------------------------- span_stats.c: span stats */

/* Interned by module init. */
HIDDEN extern PyObject *str_asyncio_events, *str_get_running_loop;
HIDDEN extern int alloc_sampling;
HIDDEN extern PyObject *str_is_recording, *str_set_attributes, *str_span_processor;
HIDDEN extern PyObject *key_cpu, *key_alloc, *key_gc_pause, *key_gc_count, *key_rss,
    *key_threads, *key_heap;
HIDDEN void stats_begin(LabelsObject *labels);
HIDDEN PyObject *stats_attributes(LabelsObject *labels, int full, uint64_t cpu);
HIDDEN void api_charge_alloc(PyThreadState *ts, uint64_t bytes);
HIDDEN void api_set_alloc_sampling(int on);
HIDDEN PyObject *sampler_gc_callback(PyObject *mod, PyObject *args);
HIDDEN PyObject *sampler_process_stats(PyObject *mod, PyObject *unused);
HIDDEN PyObject *sampler_alloc_sampling(PyObject *mod, PyObject *unused);

/* ---------------------------------------------------------------- linker.c: span linking */

/* A span's garbage-collection pauses are set as its attributes from this total on, without
 * span_stats: young collections run every few hundred allocations and pause for tens of
 * microseconds, and an attribute on each span that saw one (hundreds a second on an
 * allocating service, the SDK's set_attributes at ~6 us each) would cost more than a pause
 * that short can explain.  Smaller pauses still add up in the parent, so a request that
 * collected many times shows them at its root. */
#define GC_ATTRIBUTE_MIN_NS 1000000ull

HIDDEN extern PyTypeObject LinkerType;

/* ---------------------------------------------------------------- turns.c: the agent's waits */

HIDDEN extern PyTypeObject WakerType;
HIDDEN PyObject *sampler_turns(PyObject *mod, PyObject *unused);
/* Interned by module init. */
HIDDEN extern PyObject *str_attach, *str_detach, *str_get_current, *str_get_span_context,
    *str_parent;
HIDDEN extern PyObject *str_context_attr;
HIDDEN extern PyObject *str_set_attribute, *key_profile_id;

#endif
