/* The agent's waits, and its turns at the GIL beside a busy program.
 *
 * A thread that wakes and wants the GIL back while another thread runs Python waits in
 * CPython's take_gil: every time the holder drops the GIL it signals the waiter, and the
 * holder takes it back before the waiter has run.  Only a wait of a whole switch interval
 * (5 ms) with no drop at all makes the holder hand over.  An asyncio loop drops the GIL at
 * every poll of its selector, far more often than that, so the waiter is signalled hundreds
 * of times a second, each a futex wake the program pays for, and gets the GIL only when the
 * loop idles: beside a saturated loop, never.
 *
 * So the agent's loop does not wait for the GIL that way.  Its wait (Waker.wait), once the
 * time is up, asks the main thread for a turn with Py_AddPendingCall; at its next check the
 * main thread runs grant_turn, which drops the GIL and waits until the agent's thread comes
 * back to its wait.  The program pays one handover and the agent's own work, nothing else.
 *
 * Either side may fall back to the GIL's queue, and beside a busy loop that fallback costs
 * the thousands of wake-ups turns exist to avoid; so each falls back only when the other
 * cannot be what it waits for.  The asking thread waits TURN_ASK_NS at a time, for as long
 * as the main thread holds the GIL (running Python, or without a core on a crowded machine:
 * it comes to its pending calls once it runs); when the main thread does not hold it (it
 * waits in C, or is gone) the agent takes the GIL as any thread would: it is free or soon
 * will be.  A busy event loop lets the GIL go for an instant at every poll of its selector,
 * so "does not hold it" takes TURN_LOOKS looks in a row, TURN_LOOK_NS apart.  The main thread takes the GIL back after TURN_MAX_NS unless a thread of the
 * turn's holds it (running, or again without a core), and after TURN_LONGEST_NS in any case.
 * Neither waits past TURN_LONGEST_NS.
 *
 * One turn at a time; one pending call of ours queued at most, so the program's own pending
 * calls (a queue of 32 before 3.12) never find it full because of us.  Free-threaded builds
 * have no GIL to wait for: their waits are plain waits. */
#include "internal.h"

#include <limits.h>
#include <poll.h>

#define TURN_ASK_NS 20000000ull      /* how often the asking thread looks at the GIL */
#define TURN_MAX_NS 100000000ull     /* a turn whose threads are off the GIL ends here */
#define TURN_LONGEST_NS 500000000ull /* no wait for a turn, or in one, lasts longer */
#define TURN_LOOKS 4
#define TURN_LOOK_NS 500000ull
/* At most this many threads in a turn: the agent has two that wait here. */
#define TURN_THREADS 4

enum { TURN_IDLE, TURN_ASKED, TURN_GRANTED };

/* One mutex for the turn and every waker (the agent has two threads that wait here, and a
 * signal is rare: a timeout, an upload, a settings change); a condition for the turn's state,
 * which the main thread and the asking thread wait on, and one for the wakers' flags, so that
 * a turn's handovers wake no other waiting thread (each wake is a futex call, and on a
 * virtual machine an interrupt to another CPU). */
static pthread_mutex_t turn_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cv, waker_cv;
static pthread_once_t turns_once = PTHREAD_ONCE_INIT;
static int turn_state = TURN_IDLE;
/* The threads a granted turn is for: the one that asked, and those its Python woke while it
 * ran (the uploader, handed an upload): the main thread waits until each has waited again. */
static int turn_holders;
#ifndef Py_GIL_DISABLED
/* Their thread states, to tell whether the GIL is theirs. */
static uint64_t turn_threads[TURN_THREADS];
static int turn_thread_count;
/* threading.main_thread().ident, read as the first Waker is made: only the main thread runs
 * pending calls. */
static unsigned long main_ident;
#endif
static unsigned long long turn_generation; /* of the turn asked or granted last */
static int turn_queued; /* a grant_turn of ours waits in the pending calls */
/* What became of the turns asked for (turns()): granted, withdrawn (the main thread did not
 * come in time), and granted but overrun (the main thread took the GIL back). */
static unsigned long long turns_granted, turns_withdrawn, turns_overrun;

typedef struct {
    PyObject_HEAD int flag;
    /* The turn this waker's thread holds a share of (0: none), and whether a set() during a
     * turn gave the thread it wakes a share. */
    unsigned long long holds;
    int joining;
    int waiting; /* threads in wait() now: only those can join a turn */
    /* The thread that waited last: the shares are its; another's wait_io (an exit flush)
     * leaves them alone. */
    unsigned long owner;
} WakerObject;

int
waits_for_turn(uintptr_t address)
{
    /* The main thread granting a turn, and the agent's thread asking for one, wait on
     * turn_cv (the GIL is the other's meanwhile); turn_mu is held for instants. */
    uintptr_t cv = (uintptr_t)&turn_cv, mu = (uintptr_t)&turn_mu;
    return (address >= cv && address < cv + sizeof turn_cv) ||
           (address >= mu && address < mu + sizeof turn_mu);
}

static void
init_turn_conds(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&turn_cv, &attr);
    pthread_cond_init(&waker_cv, &attr);
    pthread_condattr_destroy(&attr);
}

/* In a forked child the parent's agent threads are gone: they may have held the mutex, and
 * glibc's condition counts their waits, which would hang a broadcast there.  Both are made
 * anew before anything of the child's runs (pthread_atfork, not the agent's fork hook: a
 * disabled agent has no sampler to be told). */
static void
turns_after_fork(void)
{
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    turn_mu = fresh;
    init_turn_conds();
    turn_state = TURN_IDLE;
    turn_holders = 0;
    turn_generation++;
    turn_queued = 0;
#ifndef Py_GIL_DISABLED
    turn_thread_count = 0;
    /* The forking thread is the child's main thread (threading makes it so). */
    if (main_ident != 0)
        main_ident = PyThread_get_thread_ident();
#endif
}

static void
init_turns(void)
{
    init_turn_conds();
    pthread_atfork(NULL, NULL, turns_after_fork);
}

#ifndef Py_GIL_DISABLED
/* turn_mu held: `tstate` is in the turn being granted. */
static void
add_turn_thread(uint64_t tstate)
{
    if (turn_thread_count < TURN_THREADS)
        turn_threads[turn_thread_count++] = tstate;
}

/* Whether the GIL is held by the main thread (0), or by a thread of the turn (1).  Unknown
 * (no sampler has found the GIL yet) reads as not held: the fallback of old. */
static int
gil_held_by(int of_turn)
{
    uint64_t holder = gil_holder_now();
    if (holder == 0)
        return 0;
    if (!of_turn)
        return main_ident != 0 && thread_ident_of(holder) == main_ident;
    for (int i = 0; i < turn_thread_count; i++) {
        if (turn_threads[i] == holder)
            return 1;
    }
    return 0;
}

/* Without the GIL or turn_mu: whether the main thread holds the GIL at one of a few looks
 * (see the top). */
static int
main_holds_gil(void)
{
    for (int i = 0; i < TURN_LOOKS; i++) {
        if (i > 0) {
            struct timespec pause = {0, (long)TURN_LOOK_NS};
            nanosleep(&pause, NULL);
        }
        if (gil_held_by(0))
            return 1;
    }
    return 0;
}

/* The main thread, at a pending call, holding the GIL: lets the asking thread run. */
static int
grant_turn(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&turn_mu);
    turn_queued = 0;
    if (turn_state != TURN_ASKED) {
        pthread_mutex_unlock(&turn_mu); /* withdrawn: the thread went on without a turn */
        return 0;
    }
    turn_state = TURN_GRANTED;
    turn_holders = 1;
    turns_granted++;
    unsigned long long generation = turn_generation;
    pthread_cond_broadcast(&turn_cv);
    pthread_mutex_unlock(&turn_mu);
    Py_BEGIN_ALLOW_THREADS
    uint64_t start = monotonic_ns();
    struct timespec deadline = timespec_ns(start + TURN_MAX_NS);
    pthread_mutex_lock(&turn_mu);
    while (turn_state == TURN_GRANTED && turn_generation == generation) {
        if (pthread_cond_timedwait(&turn_cv, &turn_mu, &deadline) != ETIMEDOUT)
            continue;
        uint64_t now = monotonic_ns();
        if (now - start >= TURN_LONGEST_NS || !gil_held_by(1))
            break;
        deadline = timespec_ns(now + TURN_ASK_NS); /* taken back, it would queue for it */
    }
    /* A turn that overran (the agent blocked on something) goes on as plain contention; its
     * holders' shares are void (their generation is gone). */
    if (turn_state == TURN_GRANTED && turn_generation == generation) {
        turn_state = TURN_IDLE;
        turn_generation++;
        turns_overrun++;
    }
    pthread_mutex_unlock(&turn_mu);
    Py_END_ALLOW_THREADS
    return 0;
}

/* Without the GIL, turn_mu held: asks the main thread to hand the GIL over at its next check,
 * and waits for it while the main thread holds the GIL.  True if granted (the caller, thread
 * state `tstate`, holds the turn's first share). */
static int
ask_turn(uint64_t tstate)
{
    if (turn_state != TURN_IDLE)
        return 0; /* a turn for other threads: this one takes the GIL as usual */
    turn_state = TURN_ASKED;
    turn_thread_count = 0;
    add_turn_thread(tstate);
    unsigned long long generation = ++turn_generation;
    if (!turn_queued) {
        turn_queued = 1;
        pthread_mutex_unlock(&turn_mu);
        int queued = Py_AddPendingCall(grant_turn, NULL) == 0;
        pthread_mutex_lock(&turn_mu);
        if (!queued) {
            turn_queued = 0;
            if (turn_state == TURN_ASKED && turn_generation == generation)
                turn_state = TURN_IDLE;
            return 0;
        }
    }
    uint64_t start = monotonic_ns();
    struct timespec deadline = timespec_ns(start + TURN_ASK_NS);
    while (turn_state == TURN_ASKED && turn_generation == generation) {
        if (pthread_cond_timedwait(&turn_cv, &turn_mu, &deadline) != ETIMEDOUT)
            continue;
        uint64_t now = monotonic_ns();
        if (now - start >= TURN_LONGEST_NS)
            break;
        pthread_mutex_unlock(&turn_mu);
        int holds = main_holds_gil();
        pthread_mutex_lock(&turn_mu);
        if (turn_state != TURN_ASKED || turn_generation != generation)
            continue; /* granted (or ended) while it looked */
        if (!holds)
            break;
        deadline = timespec_ns(now + TURN_ASK_NS);
    }
    if (turn_generation != generation)
        return 0;
    if (turn_state == TURN_ASKED) {
        turn_state = TURN_IDLE; /* the main thread did not come: withdrawn */
        turns_withdrawn++;
        return 0;
    }
    return turn_state == TURN_GRANTED;
}

/* Without the GIL, turn_mu held: how a waker's thread (thread state `tstate`) that has
 * waited comes back to the GIL: in the turn under way if there is one, else by asking for
 * its own (after the one asked for by another thread, if any, is granted or withdrawn).
 * With no turn to be had, it takes the GIL in the queue as any thread would. */
static void
come_back(WakerObject *self, uint64_t tstate)
{
    uint64_t start = monotonic_ns();
    for (;;) {
        if (turn_state == TURN_GRANTED) {
            turn_holders++;
            self->holds = turn_generation;
            add_turn_thread(tstate);
            return;
        }
        if (turn_state == TURN_IDLE) {
            if (ask_turn(tstate))
                self->holds = turn_generation;
            return;
        }
        uint64_t now = monotonic_ns();
        if (now - start >= TURN_LONGEST_NS)
            return;
        struct timespec deadline = timespec_ns(now + TURN_ASK_NS);
        pthread_cond_timedwait(&turn_cv, &turn_mu, &deadline);
    }
}

/* turn_mu held: a share of turn `generation` is given back; the last one ends the turn. */
static void
release_share(unsigned long long generation)
{
    if (turn_state != TURN_GRANTED || turn_generation != generation)
        return; /* that turn ended already (it overran) */
    if (--turn_holders <= 0) {
        turn_state = TURN_IDLE;
        pthread_cond_broadcast(&turn_cv);
    }
}

/* turn_mu held: the share of a turn the waker's thread holds, if any, is given back (one it
 * joined by a set() it has not yet woken to stays: it is about to run in that turn). */
static void
give_back_share(WakerObject *self)
{
    if (self->holds && !self->joining) {
        release_share(self->holds);
        self->holds = 0;
    }
}
#endif

/* ---------------------------------------------------------------- Waker */

#ifndef Py_GIL_DISABLED
/* With the GIL: main_ident, and where the GIL is (a sampler started later finds the same). */
static int
find_main_ident(void)
{
    PyObject *threading = PyImport_ImportModule("threading");
    if (threading == NULL)
        return -1;
    PyObject *main = PyObject_CallMethod(threading, "main_thread", NULL);
    Py_DECREF(threading);
    if (main == NULL)
        return -1;
    PyObject *ident = PyObject_GetAttrString(main, "ident");
    Py_DECREF(main);
    if (ident == NULL)
        return -1;
    unsigned long value = ident == Py_None ? 0 : PyLong_AsUnsignedLong(ident);
    Py_DECREF(ident);
    if (value == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    thread_state_init(PyThreadState_Get());
    pthread_mutex_lock(&turn_mu);
    main_ident = value;
    pthread_mutex_unlock(&turn_mu);
    return 0;
}
#endif

/* threading.Event's set/clear/is_set/wait for one waiting thread of the agent's (never the
 * main thread: a turn asked for there would wait TURN_ASK_NS for itself).  Its wait gives
 * back the thread's share of a turn, and comes back with the GIL through a turn: at a
 * timeout, by asking for one; when set during a turn, by joining it. */
static PyObject *
waker_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Waker() takes no arguments");
        return NULL;
    }
    pthread_once(&turns_once, init_turns);
#ifndef Py_GIL_DISABLED
    if (main_ident == 0 && find_main_ident() < 0)
        return NULL;
#endif
    return type->tp_alloc(type, 0);
}

static void
waker_dealloc(WakerObject *self)
{
#ifndef Py_GIL_DISABLED
    pthread_mutex_lock(&turn_mu);
    if (self->holds)
        release_share(self->holds);
    pthread_mutex_unlock(&turn_mu);
#endif
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
waker_set(WakerObject *self, PyObject *unused)
{
    (void)unused;
    pthread_mutex_lock(&turn_mu);
    self->flag = 1;
#ifndef Py_GIL_DISABLED
    /* Set in a turn (the main thread waits, so the caller is one of the agent's threads): the
     * thread this wakes joins it, or it would wake to find the main thread running again.  A
     * waker nobody waits on now gives no share: one that was never waited on again (a thread
     * gone) would hold the main thread for TURN_MAX_NS. */
    if (turn_state == TURN_GRANTED && self->waiting > 0 && !self->joining &&
        self->holds != turn_generation) {
        self->joining = 1;
        self->holds = turn_generation;
        turn_holders++;
    }
#endif
    pthread_cond_broadcast(&waker_cv);
    pthread_mutex_unlock(&turn_mu);
    Py_RETURN_NONE;
}

static PyObject *
waker_clear(WakerObject *self, PyObject *unused)
{
    (void)unused;
    pthread_mutex_lock(&turn_mu);
    self->flag = 0;
    pthread_mutex_unlock(&turn_mu);
    Py_RETURN_NONE;
}

static PyObject *
waker_is_set(WakerObject *self, PyObject *unused)
{
    (void)unused;
    pthread_mutex_lock(&turn_mu);
    int flag = self->flag;
    pthread_mutex_unlock(&turn_mu);
    return PyBool_FromLong(flag);
}

static PyObject *
waker_wait(WakerObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    double timeout = -1.0;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "wait(timeout=None) takes one argument at most");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        timeout = PyFloat_AsDouble(args[0]);
        if (timeout == -1.0 && PyErr_Occurred())
            return NULL;
        if (timeout < 0)
            timeout = 0;
        if (timeout > 1e7) /* past any wait the agent makes, and far from overflowing */
            timeout = 1e7;
    }
    int flag;
#ifndef Py_GIL_DISABLED
    uint64_t me = (uint64_t)(uintptr_t)PyThreadState_Get();
#endif
    self->owner = PyThread_get_thread_ident();
    Py_BEGIN_ALLOW_THREADS
    /* Unused without a timeout (a negative double must not become a uint64_t). */
    struct timespec deadline =
        timespec_ns(timeout >= 0 ? monotonic_ns() + (uint64_t)(timeout * 1e9) : 0);
    pthread_mutex_lock(&turn_mu);
#ifndef Py_GIL_DISABLED
    /* About to wait: this thread's share of a turn is over.  (Already set: it goes on, in
     * the turn it holds, if any.) */
    if (!self->flag)
        give_back_share(self);
#endif
    self->waiting++;
    while (!self->flag) {
        int rc = timeout >= 0 ? pthread_cond_timedwait(&waker_cv, &turn_mu, &deadline)
                              : pthread_cond_wait(&waker_cv, &turn_mu);
        if (rc == ETIMEDOUT)
            break;
    }
    self->waiting--;
    flag = self->flag;
#ifndef Py_GIL_DISABLED
    if (self->joining) {
        self->joining = 0; /* woken in a turn: a share of it is this thread's */
        if (turn_state == TURN_GRANTED && turn_generation == self->holds)
            add_turn_thread(me);
    } else if (!flag) {
        come_back(self, me);
    }
    /* Else set by another thread outside a turn, which is about to wait for this one. */
#endif
    pthread_mutex_unlock(&turn_mu);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(flag);
}

/* poll(2) for one descriptor, EINTR retried within the time left: 1 ready (or in error,
 * which the caller's next call reports), 0 timed out, -1 with errno. */
static int
poll_one(int fd, int write, double timeout)
{
    uint64_t deadline = monotonic_ns() + (uint64_t)(timeout * 1e9);
    for (;;) {
        struct pollfd entry = {.fd = fd, .events = write ? POLLOUT : POLLIN};
        uint64_t now = monotonic_ns();
        int ms = now >= deadline ? 0 : (int)((deadline - now + 999999) / 1000000);
        int n = poll(&entry, 1, ms);
        if (n >= 0)
            return n > 0;
        if (errno != EINTR)
            return -1;
    }
}

/* The agent's network waits: an upload's thread that waited for its answer in a turn would
 * hold the program for the round trip; one that waited on its own and took the GIL back in
 * the queue would be woken at every drop of it.  So the thread gives back its share of the
 * turn, waits for the descriptor without the GIL, and comes back by a turn.  Any other
 * thread (an exit flush) just waits: the shares are the waker's thread's, and the main thread
 * has no turn to ask for. */
static PyObject *
waker_wait_io(WakerObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "wait_io(fd, write, timeout) takes three arguments");
        return NULL;
    }
    long fd = PyLong_AsLong(args[0]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "wait_io: not a file descriptor");
        return NULL;
    }
    int write = PyObject_IsTrue(args[1]);
    if (write < 0)
        return NULL;
    double timeout = PyFloat_AsDouble(args[2]);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(timeout >= 0)) /* NaN too */
        timeout = 0;
    if (timeout > 1e7)
        timeout = 1e7;
    int ready;
#ifndef Py_GIL_DISABLED
    uint64_t me = (uint64_t)(uintptr_t)PyThreadState_Get();
    unsigned long caller = PyThread_get_thread_ident();
    int turns = main_ident != 0 && caller != main_ident && caller == self->owner;
#endif
    Py_BEGIN_ALLOW_THREADS
    /* Ready already (a send with room, a connection made at once): no need to leave. */
    ready = poll_one((int)fd, write, 0);
    if (ready != 0)
        goto done;
#ifndef Py_GIL_DISABLED
    if (turns) {
        pthread_mutex_lock(&turn_mu);
        give_back_share(self);
        pthread_mutex_unlock(&turn_mu);
    }
#endif
    ready = poll_one((int)fd, write, timeout);
    int saved = errno;
#ifndef Py_GIL_DISABLED
    if (turns) {
        pthread_mutex_lock(&turn_mu);
        come_back(self, me);
        pthread_mutex_unlock(&turn_mu);
    }
#endif
    errno = saved;
done:
    Py_END_ALLOW_THREADS
    if (ready < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyBool_FromLong(ready);
}

static PyMethodDef waker_methods[] = {
    {"set", (PyCFunction)waker_set, METH_NOARGS, "set(): wakes every wait"},
    {"clear", (PyCFunction)waker_clear, METH_NOARGS, NULL},
    {"is_set", (PyCFunction)waker_is_set, METH_NOARGS, NULL},
    {"wait", (PyCFunction)(void (*)(void))waker_wait, METH_FASTCALL,
     "wait(timeout=None) -> bool: whether set; at a timeout the GIL comes back as a turn "
     "the main thread hands over"},
    {"wait_io", (PyCFunction)(void (*)(void))waker_wait_io, METH_FASTCALL,
     "wait_io(fd, write, timeout) -> bool: whether the descriptor is ready (readable, or "
     "writable if write); meanwhile the thread is out of its turn, and it comes back by one"},
    {NULL},
};

PyTypeObject WakerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "hotspan._speedups._sampler.Waker",
    .tp_basicsize = sizeof(WakerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = waker_new,
    .tp_dealloc = (destructor)waker_dealloc,
    .tp_methods = waker_methods,
    .tp_doc = "threading.Event for the agent's loop: it takes the GIL back by turns "
              "(see _speedups/sampler/turns.c).",
};

PyObject *
sampler_turns(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    pthread_mutex_lock(&turn_mu);
    unsigned long long granted = turns_granted, withdrawn = turns_withdrawn,
                       overrun = turns_overrun;
    pthread_mutex_unlock(&turn_mu);
    return Py_BuildValue("{sKsKsK}", "granted", granted, "withdrawn", withdrawn, "overrun",
                         overrun);
}
