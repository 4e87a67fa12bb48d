/* The signal handler and the ring it writes: a thread's CPU timer, its wall timer or its perf
 * event signals it, and the handler records the thread's stack and labels into a lock-free
 * ring the collector drains.  Apart because everything here runs in a signal handler and must
 * stay async-signal-safe. */
#include "internal.h"

char *ring;            /* RING_CAPACITY entries of entry_size bytes */
size_t entry_size;
int max_depth = 64;
_Atomic unsigned long ring_pos;
unsigned long drain_pos; /* the collector's: entries before it are consumed */
/* Samples taken but not kept (ring full, or the windows at their memory bound): reported. */
_Atomic uint64_t lost_samples;
_Atomic int sampling_enabled;
int running;
int cpu_on;            /* per-thread CPU timers wanted */
int wall_on;
uint64_t cpu_interval_ns;

#ifdef HAVE_THREAD_TIMERS
struct sigaction previous_action;
int handler_installed;
_Atomic uint64_t handler_ns;    /* CPU the handler used on our signals, all threads */
_Atomic uint64_t handler_calls; /* and how many it handled */
#  define HANDLER_COST_EVERY 16

/* A wall sample's state, beyond the GIL's: whether the thread was running as its timer
 * expired, and if not, whether it was waiting for a core (it handles the signal late, in its
 * own code) rather than blocked in a system call. */
static void
wall_sample_state(Entry *e, ThreadSlot *slot, const void *ucontext)
{
    int state = e->thread_state;
    uint64_t due = atomic_load_explicit(&slot->wall_due_ns, memory_order_relaxed);
    int late = due != 0 && monotonic_ns() > due + LATE_SIGNAL_NS;
    if (state == STATE_GIL_WAIT) {
        /* Woken as the GIL was let go, it had no core to take it on: nobody holds it.
         * Unless the kernel counts that wait (run_delay_exact): then the sample stands for
         * the rest, the wait for the GIL. */
        if (late && !run_delay_exact && gil_holder_now() == 0)
            e->thread_state = STATE_CPU_WAIT;
        return;
    }
    /* Holding the GIL, it is not blocked (CPython lets the GIL go around calls that block);
     * otherwise where it was interrupted tells. */
    int blocked = state == STATE_RUNNING ? 0 : interrupted_in_syscall(ucontext);
    if (blocked < 0)
        blocked = 1;
    if (blocked)
        return;
    if (!late) {
        e->on_cpu = 1;
#  ifdef Py_GIL_DISABLED
        /* No GIL to hold: on CPU is what "running" means there. */
        e->thread_state = STATE_RUNNING;
#  endif
    } else if (state != STATE_UNKNOWN) {
        e->thread_state = STATE_CPU_WAIT;
    }
}

/* SIGPROF from one of the thread's timers: its CPU timer (CPU_MAGIC), its wall timer
 * (WALL_MAGIC), or (SI_QUEUE) the collector asking a thread whether it has Python yet.  One
 * walk of the stack serves the CPU the timer stands for, and the wall time it was on CPU for,
 * or the wall time off CPU the collector charges to the wall timer's sample. */
void
on_signal(int signum, siginfo_t *info, void *ucontext)
{
    int magic = info != NULL ? info->si_value.sival_int & MAGIC_MASK : 0;
    int ours = (info != NULL && info->si_code == SI_TIMER &&
                (magic == CPU_MAGIC || magic == WALL_MAGIC)) ||
               (info != NULL && info->si_code == SI_QUEUE && magic == WALL_MAGIC &&
                info->si_pid == getpid());
    int perf_index = -1;
#  ifdef HAVE_PERF_EVENTS
    /* A task-clock event's overflow: its signal with si_code POLL_IN and its fd. */
    if (!ours && signum == perf_signal && perf_signal != 0 && info != NULL &&
        (info->si_code == POLL_IN || info->si_code == POLL_HUP) && info->si_fd >= 0 &&
        info->si_fd < PERF_FDS) {
        int mapped = atomic_load_explicit(&perf_fd_slot[info->si_fd], memory_order_acquire);
        if (mapped > 0) {
            ours = 1;
            magic = CPU_MAGIC;
            perf_index = mapped - 1;
            atomic_fetch_add_explicit(&perf_signals, 1, memory_order_relaxed);
        }
    }
#  endif
    if (!ours) {
        /* Not ours: hand it to whoever had the signal before us. */
        const struct sigaction *previous = &previous_action;
#  ifdef HAVE_PERF_EVENTS
        if (signum != SIGPROF)
            previous = &previous_perf_action;
#  endif
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
    if (index < MAX_THREADS &&
        atomic_load_explicit(&slots[index].tid, memory_order_acquire) == own_tid())
        slot = &slots[index];
    PyThreadState *ts = PyGILState_GetThisThreadState();
    if (slot != NULL)
        atomic_store_explicit(&slot->python, ts != NULL ? PY_YES : PY_NO, memory_order_relaxed);
    uint64_t cpu = 0, cpu_now = 0;
    /* The slot's charged CPU before and after this sample: put back if no stack is read. */
    uint64_t charged_before = 0, charged_after = 0;
    int have_clock = 0;
    /* The handler's own cost is measured on one signal in HANDLER_COST_EVERY: two more
     * reads of the clock. */
    unsigned long call = atomic_fetch_add_explicit(&handler_calls, 1, memory_order_relaxed);
    uint64_t cost_from = 0;
    int measure =
        call % HANDLER_COST_EVERY == 0 && clock_ns(CLOCK_THREAD_CPUTIME_ID, &cost_from) == 0;
    /* A CPU sample charges what the thread's CPU clock says (one read, ~0.2 us), not a count
     * of periods: a task-clock event ticks on the time its thread is scheduled in, which on
     * a virtual machine includes what the hypervisor stole and the interrupts served, so on
     * a busy host its overflows overstate the thread's CPU by several percent. */
    have_clock = measure || clock_ns(CLOCK_THREAD_CPUTIME_ID, &cost_from) == 0;
    cpu_now = cost_from;
    if (magic == CPU_MAGIC && perf_index >= 0) {
        /* Precise: the CPU since the thread's previous sample (or since it was armed). */
        cpu = cpu_interval_ns;
        if (slot != NULL && have_clock) {
            charged_after = cpu_now;
            charged_before = atomic_exchange(&slot->cpu_charged_ns, cpu_now);
            cpu =
                charged_before != 0 && cpu_now > charged_before ? cpu_now - charged_before : 0;
        }
    } else if (magic == CPU_MAGIC) {
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
            cpu =
                charged_before != 0 && through > charged_before ? through - charged_before : 0;
        }
    }
    /* The wall timer's signal, as the collector asked for it: where the thread is now stands
     * for wall time, charged by the collector at its next tick. */
    int wanted = slot != NULL && magic == WALL_MAGIC &&
                 atomic_exchange_explicit(&slot->wall_wanted, 0, memory_order_acq_rel);
    if (ts != NULL && (cpu != 0 || wanted)) {
        unsigned long pos = atomic_fetch_add_explicit(&ring_pos, 1, memory_order_relaxed);
        Entry *e = entry_at(pos);
        int expected = 0;
        if (atomic_compare_exchange_strong(&e->state, &expected, 1)) {
            e->ident = (uint64_t)ts->thread_id;
            e->slot = slot != NULL ? index : -1;
            e->gil_holder = 0;
            e->thread_state = thread_state(ts, ucontext, &e->gil_holder);
            e->wall_sample = wanted;
            e->on_cpu = 0;
            if (wanted)
                wall_sample_state(e, slot, ucontext);
            /* A sample taken while the thread collects garbage ends in a [GC] frame above
             * the code whose allocation set the collection off. */
            int generation = collecting_generation(ts, e->thread_state);
            int depth;
            if (generation >= 0 && max_depth > 1) {
                depth = walk_frames(ts, e->frames + 1, max_depth - 1);
                if (depth >= 0) {
                    e->frames[0].code = GC_FRAME_CODE;
                    e->frames[0].lasti = (uint32_t)generation;
                    e->frames[0].fingerprint = 0;
                    depth++;
                }
            } else {
                depth = walk_frames(ts, e->frames, max_depth);
            }
            if (depth < 0) {
                /* No stack to charge: what this sample stood for goes to the thread's next
                 * one (an empty entry, so the collector frees it in turn). */
                e->cpu_ns = 0;
                e->wall_sample = 0;
                e->depth = 0;
                e->seq = 0;
                memset(e->labels, 0, sizeof e->labels);
                if (charged_after != 0)
                    atomic_compare_exchange_strong(&slot->cpu_charged_ns, &charged_after,
                                                   charged_before);
            } else {
                e->cpu_ns = cpu;
                e->seq = slot != NULL ? atomic_fetch_add(&slot->seq, 1) + 1 : 0;
                e->labels_gen =
                    slot != NULL ? atomic_load_explicit(&slot->labels_gen, memory_order_relaxed)
                                 : 0;
                LabelsObject *found = find_labels(thread_context(ts));
                copy_labels(found, e->labels);
                /* The span's CPU under asyncio, where tasks interleave on one thread: what
                 * its samples stand for (see span stats). */
                if (found != NULL && cpu != 0)
                    labels_charge(found, cpu, 0);
                e->depth = depth;
                if (wanted) {
                    /* So that the collector can tell whether it is still here (where_at;
                     * its newest frames were just read: they can be). */
                    const void *field = frame_field(ts);
                    uint64_t where = 0;
                    if (field == NULL || where_at(field, 0, &where) != 0)
                        field = NULL;
                    atomic_store_explicit(&slot->where, where, memory_order_relaxed);
                    atomic_store_explicit(&slot->where_field, (uintptr_t)field,
                                          memory_order_release);
                }
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
#  ifdef HAVE_PERF_EVENTS
    /* After its random first period, the event's own. */
    int fd = perf_index >= 0 ? info->si_fd : -1;
    if (fd >= 0 && slot != NULL && atomic_load(&slot->perf_first) &&
        atomic_load_explicit(&perf_fd_slot[fd], memory_order_acquire) == perf_index + 1 &&
        atomic_exchange(&slot->perf_first, 0)) {
        uint64_t period = cpu_interval_ns;
        ioctl(fd, PERF_EVENT_IOC_PERIOD, &period);
    }
#  endif
    /* The handler's own cost: what every sample takes from the program, reported by
     * stats(). */
    uint64_t cost_to;
    if (measure && clock_ns(CLOCK_THREAD_CPUTIME_ID, &cost_to) == 0 && cost_to >= cost_from)
        atomic_fetch_add_explicit(&handler_ns, (cost_to - cost_from) * HANDLER_COST_EVERY,
                                  memory_order_relaxed);
    errno = saved_errno;
}

/* The thread's wall timer fires once, `offset_ns` from now.  It is the kernel that signals the
 * thread then, whichever thread runs where: a signal sent by the collector itself would land
 * when the collector got a core, which on a machine with few cores is mostly when the thread
 * it samples has just given its own up (measured: a thread busy 20% of the time was caught
 * busy 3% of the time), so busy code would be under-counted in the wall profile. */
int
schedule_wall_sample(ThreadSlot *s, int index, uint64_t offset_ns)
{
    if (!s->has_wall_timer) {
        if (thread_timer(s, CLOCK_MONOTONIC, WALL_MAGIC, index, &s->wall_timer) != 0)
            return -1;
        s->has_wall_timer = 1;
    }
    struct itimerspec spec;
    memset(&spec, 0, sizeof spec);
    spec.it_value = timespec_ns(offset_ns);
    return timer_settime(s->wall_timer, 0, &spec, NULL);
}

int
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
