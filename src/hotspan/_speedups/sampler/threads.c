/* Thread slots and their CPU triggers: a slot for every thread of the process (found by tid
 * without a lookup in the handler), a POSIX CPU timer or a perf task-clock event per thread,
 * arming and disarming them.  Apart because it is all under threads_mutex and all about the
 * kernel's timers and events, not about what a sample holds. */
#include "internal.h"

ThreadSlot slots[MAX_THREADS];
static int free_slots[MAX_THREADS];
static int n_free_slots;
int used_slots[MAX_THREADS]; /* indices of the slots in use, in no order */
int n_used_slots;
pthread_mutex_t threads_mutex = PTHREAD_MUTEX_INITIALIZER;
static pid_t excluded[16];
int n_excluded;
/* The same threads' idents (threading.get_ident()), where they are known: a GIL one of them
 * held is the agent's. */
static uint64_t excluded_idents[16];
static int n_excluded_idents;
static uint64_t arm_random = 0x2545f4914f6cdd1dull; /* under threads_mutex */

/* tid -> slot index + 1, open addressing; only touched under threads_mutex, never by a
 * signal handler, so it can be rebuilt freely. */
#define TID_MAP_SIZE (2 * MAX_THREADS)
static int32_t tid_map_key[TID_MAP_SIZE]; /* 0 empty, -1 deleted */
static int16_t tid_map_val[TID_MAP_SIZE];
static int tid_map_deleted;

int
tid_map_get(pid_t tid)
{
    size_t mask = TID_MAP_SIZE - 1;
    for (size_t i = mix64((uint64_t)tid) & mask, n = 0; n < TID_MAP_SIZE;
         i = (i + 1) & mask, n++) {
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
    for (size_t i = mix64((uint64_t)tid) & mask, n = 0; n < TID_MAP_SIZE;
         i = (i + 1) & mask, n++) {
        if (tid_map_key[i] == tid) {
            tid_map_key[i] = -1;
            tid_map_deleted++;
            return;
        }
        if (tid_map_key[i] == 0)
            return;
    }
}

int
is_excluded(pid_t tid)
{
    for (int i = 0; i < n_excluded; i++)
        if (excluded[i] == tid)
            return 1;
    return 0;
}

void
reset_threads(void)
{
    __atomic_store_n(&n_used_slots, 0, __ATOMIC_RELAXED);
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
pid_t
own_tid(void)
{
    return (pid_t)syscall(SYS_gettid);
}

int
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
 * (F_SETOWN_EX) with PERF_SIGNAL at each overflow and stays enabled, so a sample costs the
 * thread no system call to re-arm it (each is a few microseconds on a virtual machine); the
 * handler charges the thread's CPU since its previous sample.  Where
 * perf_event_open is not allowed (seccomp in containers, perf_event_paranoid > 2) the timer
 * takes over.  An event costs every context switch of its thread: see sampler_start. */
#  ifdef HAVE_PERF_EVENTS
int perf_state = PERF_UNTRIED; /* under threads_mutex */
int perf_main_only = 1;        /* events for the main thread only, timers for others */
_Atomic int perf_fd_slot[PERF_FDS]; /* fd -> slot index + 1, for the handler */
/* Overflows handled: proof that the kernel signals.  Where it takes the event but never
 * signals (valgrind does that), the scan sees a thread burn intervals without a sample and
 * goes back to timers (check_perf_signals). */
_Atomic unsigned long perf_signals;
/* The events' own signal, a real-time one, which queues: on SIGPROF an overflow coming while
 * a wall or timer SIGPROF is pending would be merged into it and lost, and the event, off
 * until its handler runs, would stay off (measured: a busy event loop lost 80% of its CPU).
 * 0 when the program has a handler of its own there (then timers). */
int perf_signal;
struct sigaction previous_perf_action;

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
        fcntl(fd, F_SETSIG, perf_signal) != 0 || fcntl(fd, F_SETOWN_EX, &owner) != 0) {
        close(fd);
        return -1;
    }
    s->perf_fd = fd;
    s->cpu_by_perf = 1;
    s->perf_armed_cpu = atomic_load(&s->cpu_charged_ns);
    atomic_store(&s->perf_first, 1);
    atomic_store_explicit(&perf_fd_slot[fd], index + 1, memory_order_release);
    if (ioctl(fd, PERF_EVENT_IOC_ENABLE, 0) != 0) {
        atomic_store(&perf_fd_slot[fd], 0);
        close(fd);
        s->cpu_by_perf = 0;
        return -1;
    }
    return 0;
}

/* Ours on the events' signal, unless the program has its own there. */
int
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
void
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

const char *
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
#  else
const char *
cpu_trigger_name(void)
{
    return "timer";
}
#  endif

void
disarm(ThreadSlot *s)
{
#  ifdef HAVE_PERF_EVENTS
    if (s->cpu_by_perf) {
        /* Unmapped first: a handler running now re-enables nothing it should not.  (It
         * could still, between its check and its ioctl, hit a new file with this number:
         * an ioctl no other file knows, which fails harmlessly.) */
        atomic_store_explicit(&perf_fd_slot[s->perf_fd], 0, memory_order_release);
        close(s->perf_fd);
        s->cpu_by_perf = 0;
        s->has_timer = 0;
    }
#  endif
    if (s->has_timer)
        timer_delete(s->timer);
    if (s->has_wall_timer)
        timer_delete(s->wall_timer);
    s->has_timer = 0;
    s->has_wall_timer = 0;
    drop_task_file(s);
}

/* A timer on `clock` that signals the slot's thread itself. */
int
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

void
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
    /* The CPU before this point is the profile's only up to where an earlier trigger of this
     * thread (or the last sampler's, handed over) charged it; the first sample charges the
     * rest.  A thread never sampled starts here (it ran before sampling started). */
    uint64_t charged = atomic_load(&s->cpu_charged_ns);
    if (charged == 0 || charged > cpu_now)
        charged = cpu_now;
#  ifdef HAVE_PERF_EVENTS
    /* No expiry: the handler charges the CPU since the last sample (set before the event is
     * enabled: it may fire at once). */
    atomic_store_explicit(&s->cpu_charged_ns, charged, memory_order_release);
    atomic_store_explicit(&s->cpu_expiry_ns, 0, memory_order_release);
    if ((!perf_main_only || tid == getpid()) && arm_perf(s, index, tid, first) == 0) {
        s->has_timer = 1;
        return;
    }
#  endif
    if (thread_timer(s, thread_clock(tid), CPU_MAGIC, index, &s->timer) != 0)
        return;
    atomic_store_explicit(&s->cpu_charged_ns, charged, memory_order_release);
    struct itimerspec spec;
    spec.it_interval = timespec_ns(cpu_interval_ns);
    spec.it_value = timespec_ns(first);
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

/* Disarmed, and what the profile has of its CPU forgotten: the next arm starts at its clock
 * then, not at an earlier charge (arm keeps one), for a tid another thread has now or a thread
 * without Python. */
void
disarm_afresh(ThreadSlot *s)
{
    disarm(s);
    atomic_store(&s->cpu_charged_ns, 0);
    s->run_delay_ns = 0;
    s->core_wait_debt_ns = 0;
}

/* A timer whose thread died reads back with no interval, even if its tid was reused since. */
int
timer_alive(ThreadSlot *s)
{
#  ifdef HAVE_PERF_EVENTS
    /* A perf event without a ring buffer polls as hung up, dead thread or not, and the
     * thread's start time would take three system calls: a thread that ends unseen and
     * whose tid is taken within a scan (100 ms) is caught when its clock goes back
     * (collector_tick), as with timers. */
    if (s->cpu_by_perf)
        return 1;
#  endif
    struct itimerspec spec;
    if (timer_gettime(s->timer, &spec) != 0)
        return 0;
    return spec.it_interval.tv_sec != 0 || spec.it_interval.tv_nsec != 0;
}
#endif

/* What the last stop left for a start that follows it at once (the agent's sampler at a new
 * rate): each Python thread's CPU clock up to which its CPU is in the profile, and the time up
 * to which its wall time is.  A resuming start takes them, so that what the threads did
 * between the two samplers goes to the new one's first samples instead of being lost (a
 * busy thread runs on while the agent's thread stops one sampler and starts the next, and on
 * a crowded machine that takes tens of milliseconds). */
typedef struct {
    pid_t tid;
    uint64_t cpu_charged_ns; /* 0: CPU was not sampled */
    uint64_t wall_since_ns;
    /* Its CPU clock at wall_since_ns: the next tick's "ran" is the CPU of the time between,
     * and the rest of that time, off CPU (waiting for a core, on a crowded machine), is
     * charged; with the clock's whole count it all reads as on CPU, and goes uncharged. */
    uint64_t cpu_at_tick;
    uint64_t run_delay_ns; /* its count of waits for a core, counted up to the stop */
    /* Of those, what the stop could not charge (more than the time it owed: waits that began
     * in time already charged), for the next sampler to charge from its off-CPU time. */
    int64_t core_wait_debt_ns;
} Handover;
static Handover handover[MAX_THREADS];
static int n_handover; /* non-zero only between a stop and the next start's scan */

/* Under threads_mutex, as sampling stops, after the tails and the wall time owed are
 * charged. */
void
handover_keep(void)
{
    n_handover = 0;
    for (int k = 0; k < n_used_slots; k++) {
        ThreadSlot *s = &slots[used_slots[k]];
        if (atomic_load(&s->python) != PY_YES)
            continue;
        Handover *h = &handover[n_handover++];
        h->tid = atomic_load(&s->tid);
        h->cpu_charged_ns = cpu_on ? atomic_load(&s->cpu_charged_ns) : 0;
        h->wall_since_ns = s->wall_since_ns;
        h->cpu_at_tick = s->cpu_at_tick;
        h->run_delay_ns = s->run_delay_ns;
        h->core_wait_debt_ns = s->core_wait_debt_ns;
    }
}

void
handover_drop(void)
{
    n_handover = 0;
}

/* In a forked child only the forking thread exists, and the parent's collector may have held
 * threads_mutex.  It is made anew, and sampling marked stopped, before anything of the child
 * runs: a fork handler registered before the agent's (OpenTelemetry's starts a thread, which
 * registers itself here) must neither wait on the parent's lock nor arm a timer.  The agent's
 * own fork hook (sampler_after_fork) resets the rest, with the GIL. */
static void
threads_after_fork(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    threads_mutex = fresh;
    running = 0;
    atomic_store(&sampling_enabled, 0);
    /* The parent's threads' files: the child would keep them open for nothing. */
    drop_task_files();
    codes_after_fork();
}

void
init_threads_fork(void)
{
    pthread_atfork(NULL, NULL, threads_after_fork);
}

/* A new slot takes what the last stop left for its thread.  A linear search, but only while
 * a resuming start scans the threads. */
static void
handover_take(ThreadSlot *s, pid_t tid)
{
    for (int k = 0; k < n_handover; k++) {
        if (handover[k].tid != tid)
            continue;
        atomic_store(&s->python, PY_YES);
        atomic_store(&s->cpu_charged_ns, handover[k].cpu_charged_ns);
        s->wall_since_ns = handover[k].wall_since_ns;
        s->cpu_at_tick = handover[k].cpu_at_tick;
        s->run_delay_ns = handover[k].run_delay_ns;
        s->core_wait_debt_ns = handover[k].core_wait_debt_ns;
        handover[k] = handover[--n_handover];
        return;
    }
}

/* Slots made so far: a thread that found none looks again only once another has been made. */
static _Atomic unsigned slots_made;

#ifdef HAVE_THREAD_TIMERS
__thread OwnSlot own_slot = {.slot = -1};

/* Without the lock, as the collector holds it: the slots in use, read as they may be changing,
 * each one taken only if its tid is this thread's as it is read (as labels_changed checks at
 * every span).  A thread's first span in a program that runs while the collector works, as
 * any busy one does: passing over it would leave the wait of that span to the span before. */
static int
own_slot_unlocked(pid_t tid)
{
    int n = __atomic_load_n(&n_used_slots, __ATOMIC_ACQUIRE);
    if (n > MAX_THREADS)
        n = MAX_THREADS;
    for (int k = 0; k < n; k++) {
        int index = __atomic_load_n(&used_slots[k], __ATOMIC_RELAXED);
        if (index >= 0 && index < MAX_THREADS &&
            atomic_load_explicit(&slots[index].tid, memory_order_acquire) == tid)
            return index;
    }
    return -1;
}

/* Rare (a thread's first span, its slot gone to another thread): the tid is asked again, as
 * a forked child's thread has a new one.  A span never waits for the collector's lock.
 * Without a slot, looked for again only once another slot has been made. */
void
labels_changed_lookup(void)
{
    unsigned made = atomic_load_explicit(&slots_made, memory_order_relaxed) + 1;
    if (made == own_slot.missed)
        return;
    own_slot.tid = own_tid();
    if (pthread_mutex_trylock(&threads_mutex) == 0) {
        own_slot.slot = tid_map_get(own_slot.tid);
        pthread_mutex_unlock(&threads_mutex);
    } else {
        own_slot.slot = own_slot_unlocked(own_slot.tid);
    }
    if (own_slot.slot < 0)
        own_slot.missed = made;
    else
        labels_changed();
}
#endif

/* Under threads_mutex.  The slot of `tid`, made if it has none (-1 when the table is full). */
int
slot_for(pid_t tid, int python)
{
    int index = tid_map_get(tid);
    if (index >= 0)
        return index;
    if (n_free_slots == 0)
        return -1;
    index = free_slots[--n_free_slots];
    atomic_fetch_add_explicit(&slots_made, 1, memory_order_relaxed);
    ThreadSlot *s = &slots[index];
    atomic_store(&s->python, python);
    atomic_store(&s->pending_wall_ns, 0);
    atomic_store(&s->wall_wanted, 0);
    atomic_store(&s->wall_due_ns, 0);
    s->wall_armed = 0;
    s->wall_now = 0;
    s->pending_after_change = 0;
    atomic_store(&s->cpu_at_sample_ns, 0);
    atomic_store(&s->where_field, 0);
    atomic_store(&s->labels_changed_ns, 0);
    atomic_store(&s->cpu_charged_ns, 0);
    atomic_store(&s->cpu_expiry_ns, 0);
    s->has_timer = 0;
    s->scan_mark = 0;
    s->cpu_at_tick = 0;
    s->run_delay_ns = 0;
    s->core_wait_debt_ns = 0;
    s->wall_since_ns = monotonic_ns();
    s->next_check_ns = 0;
    s->idle_checks = 0;
    s->wall_waits_skipped = 0;
    s->counts_skipped = 0;
    s->next_probe_ns = 0;
    if (n_handover > 0)
        handover_take(s, tid);
    if (s->last_wall != NULL)
        s->last_wall->depth = -1;
    if (s->last_cpu != NULL)
        s->last_cpu->depth = -1;
    atomic_store_explicit(&s->tid, tid, memory_order_release);
    /* (Stored whole: own_slot_unlocked reads them without the lock.) */
    __atomic_store_n(&used_slots[n_used_slots], index, __ATOMIC_RELAXED);
    __atomic_store_n(&n_used_slots, n_used_slots + 1, __ATOMIC_RELEASE);
    tid_map_put(tid, index);
    return index;
}

void
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
            __atomic_store_n(&used_slots[k], used_slots[n_used_slots - 1], __ATOMIC_RELAXED);
            __atomic_store_n(&n_used_slots, n_used_slots - 1, __ATOMIC_RELEASE);
            break;
        }
    }
    free_slots[n_free_slots++] = index;
}

void
exclude_ident(uint64_t ident)
{
    if (!is_agent_ident(ident) &&
        n_excluded_idents < (int)(sizeof excluded_idents / sizeof excluded_idents[0]))
        excluded_idents[n_excluded_idents++] = ident;
}

int
is_agent_ident(uint64_t ident)
{
    for (int i = 0; i < n_excluded_idents; i++)
        if (excluded_idents[i] == ident)
            return 1;
    return 0;
}

void
reset_excluded(void)
{
    n_excluded = 0;
    n_excluded_idents = 0;
}

/* Under threads_mutex: the agent's own threads are never sampled. */
void
exclude_tid(pid_t tid)
{
    if (!is_excluded(tid) && n_excluded < (int)(sizeof excluded / sizeof excluded[0]))
        excluded[n_excluded++] = tid;
    int index = tid_map_get(tid);
    if (index >= 0)
        slot_release(index);
}
