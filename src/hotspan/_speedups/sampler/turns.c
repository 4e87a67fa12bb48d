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
 * back to its wait (or TURN_MAX_NS).  The program pays one handover and the agent's own
 * work, nothing else.  When the main thread does not come within TURN_ASK_NS (it waits in C,
 * or is gone), the agent takes the GIL as any thread would: then it is free or soon will be.
 *
 * One turn at a time; one pending call of ours queued at most, so the program's own pending
 * calls (a queue of 32 before 3.12) never find it full because of us.  Free-threaded builds
 * have no GIL to wait for: their waits are plain waits. */
#include "internal.h"

#define TURN_ASK_NS 20000000ull  /* how long a wait asks the main thread before going on */
#define TURN_MAX_NS 100000000ull /* the longest the main thread waits for a turn to end */

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
static unsigned long long turn_generation; /* of the turn asked or granted last */
static int turn_queued; /* a grant_turn of ours waits in the pending calls */
static unsigned long long turns_granted; /* for tests */

typedef struct {
    PyObject_HEAD int flag;
    /* The turn this waker's thread holds a share of (0: none), and whether a set() during a
     * turn gave the thread it wakes a share. */
    unsigned long long holds;
    int joining;
    int waiting; /* threads in wait() now: only those can join a turn */
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
}

static void
init_turns(void)
{
    init_turn_conds();
    pthread_atfork(NULL, NULL, turns_after_fork);
}

#ifndef Py_GIL_DISABLED
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
    struct timespec deadline = timespec_ns(monotonic_ns() + TURN_MAX_NS);
    pthread_mutex_lock(&turn_mu);
    while (turn_state == TURN_GRANTED && turn_generation == generation) {
        if (pthread_cond_timedwait(&turn_cv, &turn_mu, &deadline) == ETIMEDOUT)
            break;
    }
    /* A turn that overran (the agent blocked on something) goes on as plain contention; its
     * holders' shares are void (their generation is gone). */
    if (turn_state == TURN_GRANTED && turn_generation == generation) {
        turn_state = TURN_IDLE;
        turn_generation++;
    }
    pthread_mutex_unlock(&turn_mu);
    Py_END_ALLOW_THREADS
    return 0;
}

/* Without the GIL, turn_mu held: asks the main thread to hand the GIL over at its next check,
 * and waits a little for it.  True if granted (the caller holds the turn's first share). */
static int
ask_turn(void)
{
    if (turn_state != TURN_IDLE)
        return 0; /* a turn for other threads: this one takes the GIL as usual */
    turn_state = TURN_ASKED;
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
    struct timespec deadline = timespec_ns(monotonic_ns() + TURN_ASK_NS);
    while (turn_state == TURN_ASKED && turn_generation == generation) {
        if (pthread_cond_timedwait(&turn_cv, &turn_mu, &deadline) == ETIMEDOUT)
            break;
    }
    if (turn_generation != generation)
        return 0;
    if (turn_state == TURN_ASKED) {
        turn_state = TURN_IDLE; /* the main thread did not come: withdrawn */
        return 0;
    }
    return turn_state == TURN_GRANTED;
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
#endif

/* ---------------------------------------------------------------- Waker */

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
    Py_BEGIN_ALLOW_THREADS
    /* Unused without a timeout (a negative double must not become a uint64_t). */
    struct timespec deadline =
        timespec_ns(timeout >= 0 ? monotonic_ns() + (uint64_t)(timeout * 1e9) : 0);
    pthread_mutex_lock(&turn_mu);
#ifndef Py_GIL_DISABLED
    /* About to wait: this thread's share of a turn is over.  (Already set: it goes on, in
     * the turn it holds, if any.) */
    if (!self->flag && self->holds && !self->joining) {
        release_share(self->holds);
        self->holds = 0;
    }
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
    } else if (!flag && ask_turn()) {
        self->holds = turn_generation;
    }
    /* Else set by another thread outside a turn, which is about to wait for this one. */
#endif
    pthread_mutex_unlock(&turn_mu);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(flag);
}

static PyMethodDef waker_methods[] = {
    {"set", (PyCFunction)waker_set, METH_NOARGS, "set(): wakes every wait"},
    {"clear", (PyCFunction)waker_clear, METH_NOARGS, NULL},
    {"is_set", (PyCFunction)waker_is_set, METH_NOARGS, NULL},
    {"wait", (PyCFunction)(void (*)(void))waker_wait, METH_FASTCALL,
     "wait(timeout=None) -> bool: whether set; at a timeout the GIL comes back as a turn "
     "the main thread hands over"},
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
    unsigned long long granted = turns_granted;
    pthread_mutex_unlock(&turn_mu);
    return PyLong_FromUnsignedLongLong(granted);
}
