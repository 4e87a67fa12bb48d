/* The collector: a native thread that never takes the GIL.  It drains the ring into the
 * current window, scans for new and ended threads, charges wall time (asking running threads
 * for a sample, charging idle ones at their last stack) and closes windows.  Apart because it
 * is the one thread of its own, with its own wake-up and shutdown. */
#include "internal.h"

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
    c->thread_state = e->thread_state;
    c->gil_holder = e->gil_holder;
    c->on_cpu = e->on_cpu;
    c->labels_gen = e->labels_gen;
    memcpy(c->frames, e->frames, (size_t)e->depth * sizeof(RawFrame));
}

/* A GIL one of the agent's (unsampled) threads held, its turns included: their own frame in
 * the GIL-held profile, so that the profiler's share of "whose code makes the others wait" is
 * in plain sight. */
static void
charge_agent_held(uint64_t amount)
{
    static const uint64_t no_labels[5];
    RawFrame agent = {.code = AGENT_FRAME_CODE};
    add_or_count(KIND_GIL_HELD, 0, no_labels, &agent, 1, amount);
}

/* Under threads_mutex: `amount` of the wall time of a thread (`waiter`) waiting for the GIL,
 * also charged to the thread that held it (`holder`, a thread state; 0: whoever holds it now,
 * unless that is the waiter itself by now), at its last CPU sample's stack: it was running
 * there, holding the others up. */
static void
charge_gil_held(uint64_t waiter, uint64_t holder, uint64_t amount)
{
    uint64_t ident = thread_ident_of(holder ? holder : gil_holder_now());
    if (ident == 0 || ident == waiter)
        return;
    if (is_agent_ident(ident)) {
        charge_agent_held(amount);
        return;
    }
    for (int k = 0; k < n_used_slots; k++) {
        WallCopy *c = slots[used_slots[k]].last_cpu;
        if (c != NULL && c->depth > 0 && c->ident == ident) {
            add_or_count(KIND_GIL_HELD, c->ident, c->labels, c->frames, c->depth, amount);
            return;
        }
    }
}

/* Under threads_mutex: `amount` of wall time where a thread was (`c`, or an entry's fields), by
 * the state it was in there. */
static void
charge_wall(uint64_t ident, const uint64_t *labels, const RawFrame *frames, int depth,
            int state, uint64_t holder, uint64_t amount)
{
    add_or_count(wall_kind(state), ident, labels, frames, depth, amount);
    if (state == STATE_GIL_WAIT)
        charge_gil_held(ident, holder, amount);
}

static inline void
charge_wall_at(const WallCopy *c, uint64_t amount)
{
    charge_wall(c->ident, c->labels, c->frames, c->depth, c->thread_state, 0, amount);
}

/* Under threads_mutex: `ns` more (or, negative, less) of waits for a core that the profile owes
 * thread `s`.  Bounded: a thread ends, sampling stops, or what went wrong is not carried on. */
static inline void
owe_core_wait(ThreadSlot *s, int64_t ns)
{
    int64_t debt = s->core_wait_debt_ns + ns, bound = (int64_t)MAX_WALL_PER_TICK_NS;
    s->core_wait_debt_ns = debt > bound ? bound : debt < -bound ? -bound : debt;
}

/* Under threads_mutex: the time thread `s` waited for a core since the last count, as the
 * kernel counts it, added to what the profile owes it.  The kernel counts a wait as it ends,
 * so the time is charged from the thread's next time off CPU: where a wait began in an
 * interval already charged, the total stays right and the next off-CPU stack stands for it.
 * A wait charged before the kernel counted it (a sample found the thread waiting,
 * charge_off_cpu) makes the debt negative until it does. */
static void
count_core_waits(ThreadSlot *s, pid_t tid)
{
    uint64_t now;
    if (!run_delay_exact || slot_run_delay(s, tid, &now) != 0)
        return;
    if (s->run_delay_ns != 0 && now + 1 > s->run_delay_ns)
        owe_core_wait(s, (int64_t)(now + 1 - s->run_delay_ns));
    s->run_delay_ns = now + 1;
}

/* Under threads_mutex: as much of `*amount` (time off CPU) as the profile owes thread `s` of
 * waits for a core, charged at `c`'s stack; `*amount` keeps the rest. */
static void
charge_core_wait(ThreadSlot *s, const WallCopy *c, uint64_t *amount)
{
    if (s->core_wait_debt_ns <= 0 || c == NULL || c->depth <= 0)
        return;
    uint64_t waited = (uint64_t)s->core_wait_debt_ns;
    if (waited > *amount)
        waited = *amount;
    charge_wall(c->ident, c->labels, c->frames, c->depth, STATE_CPU_WAIT, 0, waited);
    *amount -= waited;
    owe_core_wait(s, -(int64_t)waited);
}

/* Under threads_mutex: `amount` of thread `s`'s time off CPU at `c`, by the state it was in
 * there (`holder`: the GIL's then).  Found waiting for a core (late to its signal, or runnable
 * all along), it was waiting when the kernel had not counted that wait yet: counted against
 * the kernel's count to come (count_core_waits). */
static void
charge_off_cpu(ThreadSlot *s, const WallCopy *c, uint64_t holder, uint64_t amount)
{
    charge_wall(c->ident, c->labels, c->frames, c->depth, c->thread_state, holder, amount);
    if (run_delay_exact && c->thread_state == STATE_CPU_WAIT)
        owe_core_wait(s, -(int64_t)amount);
}

/* Under threads_mutex: what the handlers recorded goes into the current window. */
void
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
            if (e->slot >= 0 && e->depth > 0) {
                /* Kept, so that the CPU the thread uses after its last sample (it ends, or
                 * sampling stops) goes where its CPU was going. */
                keep_copy(&slots[e->slot].last_cpu, e);
                /* Its time on CPU is wall time, there (wall_tick charges the rest). */
                if (wall_on)
                    charge_wall(e->ident, e->labels, e->frames, e->depth, e->thread_state,
                                e->gil_holder, e->cpu_ns);
            }
        }
        /* Kept: wall_tick charges the time off CPU around it here, and while the thread does
         * not run, its wall time too, without interrupting it. */
        if (e->wall_sample && e->depth > 0 && e->slot >= 0) {
            ThreadSlot *s = &slots[e->slot];
            WallCopy *old = s->last_wall;
            /* What waits for this sample was spent in the labels of the last one, and the
             * thread changed them before this one came (it woke, ended its span, waited
             * again): it goes there, not to the span after. */
            if (old != NULL && old->depth > 0 && old->labels_gen == s->pending_gen &&
                e->labels_gen != s->pending_gen) {
                uint64_t waited = atomic_exchange(&s->pending_wall_ns, 0);
                if (waited > 0)
                    charge_off_cpu(s, old, 0, waited);
                s->pending_after_change = 0;
            }
            keep_copy(&s->last_wall, e);
        }
        atomic_store_explicit(&e->state, 0, memory_order_release);
    }
}

#ifdef HAVE_THREAD_TIMERS
unsigned scan_generation;

/* Under threads_mutex: a slot (and a CPU timer) for every thread the process has, none for
 * threads gone.  Threads started through `threading` made theirs as they started. */
void
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
            disarm_afresh(s);
            atomic_store(&s->python, PY_UNKNOWN);
            if (s->last_wall != NULL)
                s->last_wall->depth = -1;
        }
#  ifdef HAVE_PERF_EVENTS
        check_perf_signals(s);
#  endif
        if (atomic_load(&s->python) != PY_NO) {
            arm(s, index);
        } else {
            /* Without Python it has no CPU of the profile's: a sample, if it ever gets
             * Python, charges only what it runs from then on. */
            disarm_afresh(s);
        }
    }
    closedir(dir);
    for (int k = n_used_slots - 1; k >= 0; k--) {
        int index = used_slots[k];
        if (k < n_used_slots && slots[index].scan_mark != mark)
            slot_release(index);
    }
}

/* When a thread's next wall sample is due, after its last was due at `last`: about an
 * interval later (half to one and a half), whenever the collector runs.  The moments must not
 * follow the collector's own: on a busy machine it gets a core when a thread gives one up,
 * as threads hand the GIL over, and samples timed from then caught threads taking turns at
 * the GIL waiting for it a fifth more than they did.  A thread not sampled lately starts
 * afresh at a random moment of the next interval. */
static uint64_t
next_wall_due(uint64_t last, uint64_t now_ns, uint64_t *random)
{
    if (last == 0 || last + IDLE_CHECK_NS < now_ns)
        return now_ns + 1000 + next_random(random) % cpu_interval_ns;
    uint64_t due = last;
    do
        due += cpu_interval_ns / 2 + next_random(random) % cpu_interval_ns;
    while (due < now_ns + 1000);
    return due;
}

/* Whether the thread is where its last wall sample found it (see where_at). */
static int
still_there(ThreadSlot *s)
{
    const void *field =
        (const void *)atomic_load_explicit(&s->where_field, memory_order_acquire);
    uint64_t now;
    return field != NULL && where_at(field, 1, &now) == 0 &&
           now == atomic_load_explicit(&s->where, memory_order_relaxed);
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
    /* A wall signal to a thread that waits (for a socket, a lock, the GIL) wakes it: a few
     * microseconds of the kernel's each, and a threaded server's eight connection threads,
     * each running a little every interval, would take 800 a second, several percent of the
     * server's time (the WSGI workload of bench/agent.py).  Threads that ran less than half
     * the time since they were last looked at share WALL_WAIT_SIGNALS_PER_TICK signals an
     * interval: with more of them than that, each is signalled every `wait_stride`
     * intervals, its sample standing for all the time since its last (the totals stay exact,
     * its stacks are fewer).
     * Threads that mostly run, and programs with few waiting threads, are not affected.
     * The stride follows the last tick's count of waiting threads. */
    static int waiting_last_tick;
    int wait_stride =
        (waiting_last_tick + WALL_WAIT_SIGNALS_PER_TICK - 1) / WALL_WAIT_SIGNALS_PER_TICK;
    if (wait_stride > WALL_WAIT_MAX_STRIDE)
        wait_stride = WALL_WAIT_MAX_STRIDE;
    int waiting = 0;
    for (int k = 0; k < n_used_slots; k++) {
        int index = used_slots[k];
        ThreadSlot *s = &slots[index];
        pid_t tid = atomic_load(&s->tid);
        int python = atomic_load(&s->python);
        if (python == PY_NO && now_ns < s->next_probe_ns)
            continue;
        /* A thread looked at less often as it keeps not running, unless it changed span
         * meanwhile: where its time goes changed then. */
        if (now_ns < s->next_check_ns && !labels_moved(s)) {
            if (s->next_check_ns < next_run)
                next_run = s->next_check_ns;
            continue;
        }
        uint64_t cpu;
        if (clock_ns(thread_clock(tid), &cpu) != 0)
            continue; /* gone: the next scan frees the slot */
        /* Late (a stopped process: SIGSTOP) is not all wall time.  A slot the scan made for a
         * new thread starts after now_ns was read. */
        uint64_t owed = now_ns > s->wall_since_ns ? now_ns - s->wall_since_ns : 0;
        if (owed > MAX_WALL_PER_TICK_NS)
            owed = MAX_WALL_PER_TICK_NS;
        s->wall_since_ns = now_ns;
        if (cpu < s->cpu_at_tick) {
            /* Its clock went back: another thread has the tid now, and the timers made for
             * the old one signal nobody.  Start afresh (the next scan arms a CPU timer). */
            disarm_afresh(s);
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
        int wanted = atomic_load(&s->wall_wanted);
        int have_stack = c != NULL && c->depth > 0 && c->seq == atomic_load(&s->seq) && !wanted;
        /* The wall timer armed at the last tick fired since: where the thread was then. */
        int inside = s->wall_armed && !wanted && c != NULL && c->depth > 0 &&
                     (int32_t)(c->seq - s->wall_armed_seq) > 0;
        /* Asked at once, that sample stands for the time that waited for it, not for this
         * interval: a thread that moved on since is not charged there twice. */
        int at_once = inside && s->wall_now;
        s->wall_armed = 0;
        uint64_t at_sample = atomic_load_explicit(&s->cpu_at_sample_ns, memory_order_acquire);
        uint64_t ran = cpu - s->cpu_at_tick;
        /* The moment of the first change of its labels since it was last taken, read before
         * their count (the thread sets it after its count, only while it is 0).  Taken once a
         * change is seen, and cleared when none is (the wall sample taken since came after
         * it): left, the thread's next change would not set its own, and that change's split
         * would fall at this one's moment, a span's wait given to the next. */
        uint64_t changed_at = atomic_load_explicit(&s->labels_changed_ns, memory_order_acquire);
        int moved = labels_moved(s);
        if (changed_at != 0) {
            atomic_store_explicit(&s->labels_changed_ns, 0, memory_order_relaxed);
            if (!moved)
                changed_at = 0;
        }
        /* Exact only if it did not run during the whole time charged, nor since the stack
         * was taken (which may be earlier, or inside that time), nor left that sample's span:
         * a thread that sleeps in span after span runs too little between them to count. */
        int frozen = ran < REPEAT_CPU_NS && cpu < at_sample + REPEAT_CPU_NS && !moved;
        /* Ran at all, it may have gone from one wait to the next in that little: looked up
         * where it is (a few reads of its memory; a thread that did not run is not).  One last
         * seen running, or waiting for the GIL or a core, only once it is blocked in a system
         * call (a read of /proc, which the frozen path below needs anyway): until then it is
         * where it was, and its waits for a core are counted there. */
        int was_running = have_stack && (c->thread_state == STATE_RUNNING ||
                                         c->thread_state == STATE_GIL_WAIT ||
                                         c->thread_state == STATE_CPU_WAIT || c->on_cpu);
        int now_state = frozen && was_running ? blocked_state(tid) : -1;
        int went_on = frozen && have_stack && ran > 0 &&
                      (!was_running || now_state == STATE_RELEASED) && !still_there(s);
        if (went_on)
            frozen = 0;
        s->cpu_at_tick = cpu;
        if (frozen && have_stack) {
            /* It has not run, so its stack is where it was, but not its state: a thread seen
             * running (Python, or native code without the GIL, the GIL's own code included),
             * or waiting for the GIL, may since have got the GIL and gone to sleep, all within
             * too little CPU to count, or be waiting for the GIL or a core.  Such a thread is
             * asked where it is blocked (a read of /proc; a thread last seen asleep or in I/O
             * is not). */
            owed += atomic_exchange(&s->pending_wall_ns, 0);
            s->pending_after_change = 0;
            if (was_running) {
                if (now_state >= 0) {
                    c->thread_state = now_state;
                    c->on_cpu = 0;
                }
                /* What the kernel saw of it meanwhile (a thread found asleep is not asked:
                 * it waits for a core only as it wakes, and then runs). */
                count_core_waits(s, tid);
                charge_core_wait(s, c, &owed);
            }
            charge_off_cpu(s, c, 0, owed);
            /* One that woke since and is back where it was (a loop around a wait with a
             * timeout, or a round of other waits it was not looked at in) is looked at
             * sooner again: the next round is seen. */
            if (ran > 0)
                s->idle_checks = 0;
            if (s->idle_checks < 1000)
                s->idle_checks++;
            int spaced = s->idle_checks - IDLE_CHECK_INTERVALS;
            uint64_t wait = (uint64_t)(spaced > 1 ? spaced : 1) * cpu_interval_ns;
            s->next_check_ns = now_ns + (wait < IDLE_CHECK_NS ? wait : IDLE_CHECK_NS);
            if (s->next_check_ns < next_run)
                next_run = s->next_check_ns;
            continue;
        }
        int cpu_samples = cpu_charges_wall(s);
        /* Off CPU for more than a moment: how much of that without a core (and a first count
         * to start from).  A count is a read of /proc (0.6 us from a kept file, 5 us without:
         * slot_run_delay): a thread that mostly waits is counted as often as it is signalled
         * (wait_stride), its debt charged meanwhile. */
        int count_waits = owed > ran + REPEAT_CPU_NS || s->run_delay_ns == 0;
        if (count_waits && ran * 2 < owed && s->run_delay_ns != 0 &&
            ++s->counts_skipped < wait_stride)
            count_waits = 0;
        if (count_waits)
            s->counts_skipped = 0;
        /* Changed span since it was last seen waiting there: found not running at that
         * stack at the last look, or sampled there off CPU (a CPU sample since, in the little
         * it ran, does not change where it waited).  A sample taken running says nothing of
         * where it waited since.  Or asked for a sample at the last look, still in that
         * sample's labels then, and changed them before the sample came (its signal due after
         * the change, or merged into a CPU timer's): the time up to the change is in them. */
        int split =
            moved && (wanted ? s->pending_gen == c->labels_gen
                             : s->idle_checks > 0 || (have_stack && !c->on_cpu &&
                                                      c->thread_state == STATE_RELEASED));
        int woke = (s->idle_checks > 0 && have_stack) || went_on;
        if (woke || split) {
            /* It woke while it was not looked at: all but the time it may have been running
             * (its CPU, at least one interval) goes where it had been waiting, as it woke
             * and waited for a core there too.  One that changed span: the time up to the
             * change. */
            uint64_t recent = ran > cpu_interval_ns ? ran : cpu_interval_ns;
            /* Gone on to another wait, it left this one at a moment nothing tells: half the
             * time is each's, as it is on average. */
            if (went_on && recent < owed / 2)
                recent = owed / 2;
            if (split && changed_at != 0) {
                /* (Read after now_ns: it is changing span as it is looked at.) */
                uint64_t since = changed_at < now_ns ? now_ns - changed_at : 0;
                if (since < owed)
                    recent = ran > since ? ran : since;
            }
            uint64_t before = owed > recent ? owed - recent : 0;
            owed -= before;
            /* What earlier ticks left for the next sample came before the change too,
             * unless it is what a change seen earlier left and no sample has come for it
             * since (one that came, `inside`, is where that time was spent). */
            if ((split && (!s->pending_after_change || inside)) || (went_on && inside))
                before += atomic_exchange(&s->pending_wall_ns, 0);
            if (before > 0) {
                /* (A read of /proc: for a change of span, as often as count_waits allows.) */
                if (count_waits || s->idle_checks > 0)
                    count_core_waits(s, tid);
                charge_core_wait(s, c, &before);
                charge_off_cpu(s, c, 0, before);
                count_waits = 0;
            }
            /* The time since the change is not that sample's, even if it was the one asked
             * for at the last tick. */
            if (split || went_on)
                inside = 0;
        }
        s->idle_checks = 0;
        s->next_check_ns = 0;
        next_run = now_ns; /* a running thread is looked at every interval */
        /* Its time on CPU is charged by its CPU samples, where they were taken (at moments
         * random in its CPU time); the rest, off CPU, by a wall sample taken off CPU.  A
         * wall sample stands for no more than that: its moment follows the collector's,
         * which on a busy machine gets a core as a thread gives one up, as threads hand
         * the GIL over, and samples standing for all the time caught threads taking turns
         * at the GIL waiting for it a fifth more than they did. */
        uint64_t on_cpu = cpu_samples ? (ran < owed ? ran : owed) : 0;
        uint64_t off = owed - on_cpu;
        WallCopy *cc = s->last_cpu;
        /* Its waits for a core, where it was then: the wall sample taken meanwhile (late, as
         * its thread had no core), else where it last ran. */
        if (count_waits)
            count_core_waits(s, tid);
        charge_core_wait(s, inside ? c : cc != NULL && cc->depth > 0 ? cc : c, &off);
        /* On CPU (nearly) the whole time, or waiting for a core: its CPU samples stand for
         * it, and the little it was off CPU otherwise goes where it last ran, rather than
         * interrupting it again and again to find it off CPU. */
        int throughout = cpu_samples && off * 50 <= owed;
        if (throughout && off > 0 && cc != NULL && cc->depth > 0) {
            charge_wall_at(cc, off);
            off = 0;
        }
        uint64_t waited = atomic_exchange(&s->pending_wall_ns, 0);
        if (at_once && (!cpu_samples || !c->on_cpu)) {
            charge_off_cpu(s, c, c->gil_holder, waited);
            waited = 0;
        }
        off += waited;
        if (inside && !at_once && (!cpu_samples || !c->on_cpu)) {
            charge_off_cpu(s, c, c->gil_holder, off);
            off = 0;
        }
        if (off > MAX_WALL_PER_TICK_NS && c != NULL && c->depth > 0) {
            charge_off_cpu(s, c, 0, off - MAX_WALL_PER_TICK_NS);
            off = MAX_WALL_PER_TICK_NS;
        }
        atomic_fetch_add(&s->pending_wall_ns, off);
        s->pending_gen = atomic_load_explicit(&s->labels_gen, memory_order_relaxed);
        s->pending_after_change = off > 0 && (split || s->pending_after_change);
        if (wanted) {
            /* Its signal has not been handled: the thread has not run since the timer
             * expired (it will handle the signal first), unless the signal was lost,
             * merged into a CPU timer's SIGPROF pending at the same time. */
            if (now_ns < atomic_load(&s->wall_due_ns) + 4 * cpu_interval_ns) {
                /* Still asked for: the sample, when it comes, stands for what waits. */
                s->wall_armed = 1;
                continue;
            }
            atomic_store(&s->wall_wanted, 0);
        }
        if (throughout)
            continue;
        /* Its wait so far has no stack (a thread that had only run, or a new one): asked at
         * once, as one that changed span is, or its wait would go to wherever it is when the
         * sample comes, in the span after when it changes span before. */
        int unplaced = c == NULL || c->depth <= 0 || went_on;
        if (ran * 2 < owed) {
            waiting++;
            if (!unplaced && s->wall_waits_skipped + 1 < wait_stride) {
                s->wall_waits_skipped++;
                continue;
            }
        }
        s->wall_waits_skipped = 0;
        /* One that changed span while it waited is asked where it is now, before it moves
         * on to the next: it mostly did not run, so the moment cannot follow anyone's turn
         * at the GIL.  So is one that woke from a wait since it was last looked at and is
         * blocked again (in a system call, not for the GIL: a read of /proc): what waits for
         * a sample is the time up to now, and a short wait that follows the one it woke from
         * (a call after a job was taken) would be over by a moment in the next interval
         * (waits of 5 ms after waits of 100 ms were charged 70% short).  One that runs, or
         * waits for the GIL or a core, keeps the moment of its own chain. */
        int ask_now = (split || unplaced) && ran * 2 < owed;
        if (!ask_now && woke && ran * 2 < owed && blocked_state(tid) == STATE_RELEASED)
            ask_now = 1;
        uint64_t due = ask_now ? now_ns + 1000
                               : next_wall_due(atomic_load(&s->wall_due_ns), now_ns, random);
        s->wall_armed = 1;
        s->wall_now = ask_now;
        s->wall_armed_seq = atomic_load(&s->seq);
        atomic_store(&s->wall_due_ns, due);
        atomic_store(&s->wall_wanted, 1);
        if (schedule_wall_sample(s, index, due - now_ns) != 0 &&
            ask_for_sample(tid, index) != 0) {
            atomic_store(&s->wall_wanted, 0);
            s->wall_armed = 0;
        }
    }
    waiting_last_tick = waiting;
    return next_run;
}

/* Under threads_mutex, after drain_ring: the CPU a thread used since its last CPU sample
 * (`cpu_now` is its clock now), charged to that sample's stack, or to `fallback` (depth
 * frames) when it has none.  Without this every thread would lose, on average, half an
 * interval as it ends and as sampling stops: with many short threads, percents. */
void
charge_cpu_tail(ThreadSlot *s, uint64_t cpu_now, uint64_t ident, const uint64_t *labels,
                const RawFrame *fallback, int depth)
{
    uint64_t before = atomic_exchange(&s->cpu_charged_ns, cpu_now);
    if (before == 0 || cpu_now <= before || !cpu_on)
        return;
    uint64_t tail = cpu_now - before;
    WallCopy *c = s->last_cpu;
    /* Time on CPU, so wall time too, as with its samples (drain_ring). */
    if (c != NULL && c->depth > 0 && (ident == 0 || c->ident == ident)) {
        add_or_count(KIND_CPU, c->ident, c->labels, c->frames, c->depth, tail);
        if (cpu_charges_wall(s))
            charge_wall_at(c, tail);
    } else if (depth > 0 && ident != 0) {
        add_or_count(KIND_CPU, ident, labels, fallback, depth, tail);
        if (cpu_charges_wall(s))
            add_or_count(KIND_WALL_RUNNING, ident, labels, fallback, depth, tail);
    }
}

int
charge_last_wait(ThreadSlot *s, uint64_t ident, uint64_t amount)
{
    const WallCopy *c = s->last_wall;
    if (s->idle_checks == 0 || c == NULL || c->depth <= 0 || c->ident != ident ||
        c->seq != atomic_load(&s->seq) || labels_moved(s))
        return 0;
    charge_wall_at(c, amount);
    return 1;
}

uint64_t
wall_off_cpu(ThreadSlot *s, uint64_t now_ns, uint64_t cpu_now)
{
    uint64_t owed = now_ns > s->wall_since_ns ? now_ns - s->wall_since_ns : 0;
    if (cpu_charges_wall(s) && cpu_now > s->cpu_at_tick) {
        uint64_t ran = cpu_now - s->cpu_at_tick;
        owed -= ran < owed ? ran : owed;
    }
    return owed + atomic_exchange(&s->pending_wall_ns, 0);
}

/* Under threads_mutex, as sampling stops: every thread's CPU since its last sample. */
void
charge_cpu_tails(void)
{
    for (int k = 0; k < n_used_slots; k++) {
        ThreadSlot *s = &slots[used_slots[k]];
        uint64_t cpu;
        /* Disarmed by now: a thread whose CPU the profile has holds a charge (from arm). */
        if (atomic_load(&s->python) != PY_YES ||
            clock_ns(thread_clock(atomic_load(&s->tid)), &cpu) != 0)
            continue;
        charge_cpu_tail(s, cpu, 0, NULL, NULL, 0);
    }
}

/* Under threads_mutex, as sampling stops: the wall time of threads not looked at lately
 * goes where they last were (they were idle when last looked at). */
void
charge_owed(void)
{
    uint64_t now = monotonic_ns();
    for (int k = 0; k < n_used_slots; k++) {
        ThreadSlot *s = &slots[used_slots[k]];
        /* Where it was last seen: its last wall sample, or a CPU sample taken since (a thread
         * on CPU has its wall time from those, and may have no wall sample at all). */
        WallCopy *c = s->last_wall, *cc = s->last_cpu;
        if (cc != NULL && cc->depth > 0 &&
            (c == NULL || c->depth <= 0 || (int32_t)(cc->seq - c->seq) > 0))
            c = cc;
        /* And what a sample not taken yet would have stood for. */
        pid_t tid = atomic_load(&s->tid);
        uint64_t cpu = 0;
        clock_ns(thread_clock(tid), &cpu);
        uint64_t owed = wall_off_cpu(s, now, cpu);
        /* Its waits for a core up to now are counted and, as far as the time owed goes,
         * charged; a replacing sampler takes over the count and what is left of the debt
         * (handover_keep), so that no wait is owed twice, nor lost. */
        if (atomic_load(&s->python) == PY_YES)
            count_core_waits(s, tid);
        if (c != NULL && c->depth > 0 && owed < 2 * MAX_WALL_PER_TICK_NS) {
            charge_core_wait(s, c, &owed);
            charge_wall_at(c, owed);
        }
        s->wall_since_ns = now;
        s->cpu_at_tick = cpu;
    }
}

static pthread_t collector;
pthread_cond_t collector_wake;
int collector_started;
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
        struct timespec until = timespec_ns(next);
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

int
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

void
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
void
lock_threads(void)
{
    if (pthread_mutex_trylock(&threads_mutex) == 0)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&threads_mutex);
    Py_END_ALLOW_THREADS
}

#ifdef Py_GIL_DISABLED
/* {thread ident: (span, trace hi, trace lo, root span, tag set)} from each thread's latest
 * sample, for the threads whose sample had labels (see sampler_thread_labels). */
PyObject *
labels_of_last_samples(void)
{
    typedef struct {
        uint64_t ident;
        uint64_t labels[5];
    } Found;
    Found *found = PyMem_RawCalloc(MAX_THREADS, sizeof(Found));
    if (found == NULL)
        return PyErr_NoMemory();
    int n = 0;
    lock_threads();
    for (int k = 0; k < n_used_slots; k++) {
        const ThreadSlot *s = &slots[used_slots[k]];
        const WallCopy *c = s->last_cpu, *w = s->last_wall;
        if (c == NULL || c->depth <= 0 ||
            (w != NULL && w->depth > 0 && (int32_t)(w->seq - c->seq) > 0))
            c = w;
        if (c == NULL || c->depth <= 0 || c->ident == 0)
            continue;
        int any = 0;
        for (int i = 0; i < 5; i++)
            any |= c->labels[i] != 0;
        if (!any)
            continue;
        found[n].ident = c->ident;
        memcpy(found[n].labels, c->labels, sizeof found[n].labels);
        n++;
    }
    pthread_mutex_unlock(&threads_mutex);
    PyObject *out = PyDict_New();
    for (int i = 0; out != NULL && i < n; i++) {
        const uint64_t *l = found[i].labels;
        PyObject *key = PyLong_FromUnsignedLongLong((unsigned long long)found[i].ident);
        PyObject *value = Py_BuildValue("(KKKKK)", (unsigned long long)l[0],
                                        (unsigned long long)l[1], (unsigned long long)l[2],
                                        (unsigned long long)l[3], (unsigned long long)l[4]);
        if (key == NULL || value == NULL || PyDict_SetItem(out, key, value) < 0)
            Py_CLEAR(out);
        Py_XDECREF(key);
        Py_XDECREF(value);
    }
    PyMem_RawFree(found);
    return out;
}
#endif
