/* What a thread is doing as its signal handler interrupts it: holding the GIL, waiting for it,
 * or neither (off CPU for I/O, a sleep or a lock, or running native code that released it);
 * and whether it is running CPython's cyclic garbage collector.  Read from the interpreter's
 * own state and the registers the signal interrupted, a few loads and no system call, so every
 * sample can afford it.  Apart because it is the one part that needs the interpreter's
 * internal layout (pycore_interp.h), version by version.
 *
 * Waiting for the GIL: CPython's take_gil waits on a mutex and a condition variable that are
 * part of the GIL's own structure, so a thread blocked there is in a futex system call whose
 * first argument, the futex word's address, lies inside that structure.  A signal interrupts
 * the call and the kernel saves the thread's registers for the handler (with SA_RESTART the
 * call is set to start again, the argument registers as they were): that first argument is
 * read from them (x86-64's rdi, arm64's x0).  A thread interrupted anywhere else in the GIL's
 * code is about the GIL too.  Elsewhere (other architectures) a waiter reads as "released".
 * The main thread handing the agent's thread a turn at the GIL (turns.c) waits on the turn's
 * condition instead: waiting for the GIL too, the agent's.
 *
 * Waiting for a core: a signal is handled only once its thread runs, so a sample never sees a
 * thread waiting for one.  The kernel counts it, per thread (schedstat's run_delay): the
 * collector charges that exactly (run_delay_of).  Where the kernel does not count it, the
 * collector tells it from the thread (blocked_state: a thread that used no CPU since it was
 * last looked at yet is in no system call was runnable all along) and the handler from its
 * lateness (handler.c). */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#ifdef __linux__
#  include <sys/stat.h>
#  include <sys/syscall.h>
#  include <ucontext.h>
#endif

#ifdef __linux__
/* The file `name` of thread `tid`'s /proc directory (of this very process, readable without
 * privileges), opened: its descriptor, or -1.  The collector's, never the handler's. */
static int
open_task_file(pid_t tid, const char *name)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/%s", (int)tid, name);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* An open /proc file, from its start (procfs writes it afresh there), into `buf` as a
 * string: 0, or -1 when it cannot be read. */
static int
read_from_start(int fd, char *buf, size_t size)
{
    ssize_t n = pread(fd, buf, size - 1, 0);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return 0;
}

/* The file `name` of thread `tid`'s /proc directory into `buf`: 0, or -1. */
static int
read_task_file(pid_t tid, const char *name, char *buf, size_t size)
{
    int fd = open_task_file(tid, name);
    if (fd < 0)
        return -1;
    int rc = read_from_start(fd, buf, size);
    close(fd);
    return rc;
}
#endif

#if defined(__linux__) && (defined(Py_GIL_DISABLED) || PY_VERSION_HEX < 0x030F0000)
/* The system call thread `tid` is blocked in, from "nr arg0 arg1 ... sp pc", or "running" when
 * it is in none: 1 with its number and first argument, 0 in none, -1 when that cannot be
 * read. */
static int
syscall_of(pid_t tid, long *nr, uintptr_t *arg0)
{
    char buf[256];
    if (read_task_file(tid, "syscall", buf, sizeof buf) != 0)
        return -1;
    char *end;
    *nr = strtol(buf, &end, 10);
    if (end == buf)
        return 0;
    *arg0 = (uintptr_t)strtoull(end, NULL, 16);
    return 1;
}
#endif

int run_delay_exact;

/* "time on CPU, time runnable without a core, times scheduled in", all since the thread
 * began: the second, or -1. */
static int
parse_schedstat(const char *buf, uint64_t *ns)
{
    unsigned long long ran, waited;
    unsigned long scheduled;
    if (sscanf(buf, "%llu %llu %lu", &ran, &waited, &scheduled) != 3)
        return -1;
    /* A kernel that keeps no scheduler statistics writes zeros: a thread that has run (this
     * one, asked as sampling starts) has been scheduled in at least once. */
    if (scheduled == 0)
        return -1;
    *ns = (uint64_t)waited;
    return 0;
}

int
run_delay_of(pid_t tid, uint64_t *ns)
{
#ifdef __linux__
    char buf[96];
    if (read_task_file(tid, "schedstat", buf, sizeof buf) != 0)
        return -1;
    return parse_schedstat(buf, ns);
#else
    (void)tid;
    (void)ns;
    return -1;
#endif
}

#ifdef __linux__
/* The collector counts a waiting thread's waits every few intervals: an open, a read and a
 * close of its schedstat each time cost 4.9 us here, a read of the file kept open (pread: procfs
 * writes it afresh at offset 0) 0.6 us.  Kept for this many threads at most, so that a
 * program of thousands keeps its descriptors; the others are read the long way. */
#  define KEPT_TASK_FILES 64
static int kept_task_files;

void
drop_task_file(ThreadSlot *s)
{
    if (s->schedstat_fd1 == 0)
        return;
    int fd = s->schedstat_fd1 - 1;
    struct stat st;
    /* A program that closed every descriptor may hold a file of its own under this number
     * now: only ours is closed. */
    if (fstat(fd, &st) == 0 && (unsigned long long)st.st_ino == s->schedstat_ino &&
        (unsigned long long)st.st_dev == s->schedstat_dev)
        close(fd);
    s->schedstat_fd1 = 0;
    kept_task_files--;
}

void
drop_task_files(void)
{
    for (int k = 0; k < n_used_slots; k++)
        drop_task_file(&slots[used_slots[k]]);
}

int
slot_run_delay(ThreadSlot *s, pid_t tid, uint64_t *ns)
{
    char buf[96];
    if (s->schedstat_fd1 == 0 && kept_task_files < KEPT_TASK_FILES) {
        int fd = open_task_file(tid, "schedstat");
        if (fd >= 0 && fd < 3) {
            /* A program that closed its standard streams opens them again expecting these
             * numbers. */
            int high = fcntl(fd, F_DUPFD_CLOEXEC, 3);
            close(fd);
            fd = high;
        }
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) != 0) {
            close(fd);
            fd = -1;
        }
        if (fd >= 0) {
            s->schedstat_fd1 = fd + 1;
            s->schedstat_ino = (unsigned long long)st.st_ino;
            s->schedstat_dev = (unsigned long long)st.st_dev;
            kept_task_files++;
        }
    }
    if (s->schedstat_fd1 != 0) {
        if (read_from_start(s->schedstat_fd1 - 1, buf, sizeof buf) == 0 &&
            parse_schedstat(buf, ns) == 0)
            return 0;
        /* Its thread gone (ESRCH), or not our file any more: read the long way. */
        drop_task_file(s);
    }
    return run_delay_of(tid, ns);
}
#else
void
drop_task_file(ThreadSlot *s)
{
    (void)s;
}

void
drop_task_files(void)
{
}

int
slot_run_delay(ThreadSlot *s, pid_t tid, uint64_t *ns)
{
    (void)s;
    return run_delay_of(tid, ns);
}
#endif

#if !defined(Py_GIL_DISABLED) && PY_VERSION_HEX < 0x030F0000
/* The public headers define _PyGC_FINALIZED as a macro that the internal ones redefine (3.9 to
 * 3.11) or declare as a function (3.12): theirs is the one wanted here. */
#  undef _PyGC_FINALIZED
#  define Py_BUILD_CORE 1
#  include "internal/pycore_interp.h"
#  if PY_VERSION_HEX < 0x030C0000
#    include "internal/pycore_runtime.h"
#  endif
#  undef Py_BUILD_CORE
#  define HAVE_GC_STATE 1

/* The interpreter's GIL: set once, with the GIL, as sampling starts (3.12 and later: one per
 * interpreter, the main one's). */
static struct _gil_runtime_state *gil_state;

void
thread_state_init(PyThreadState *ts)
{
#  if PY_VERSION_HEX >= 0x030C0000
    gil_state = ts->interp->ceval.gil;
#  else
    (void)ts;
    gil_state = &_PyRuntime.ceval.gil;
#  endif
}

static inline PyThreadState *
gil_holder(struct _gil_runtime_state *gil)
{
#  if PY_VERSION_HEX >= 0x030D0000
    if (!__atomic_load_n(&gil->locked, __ATOMIC_RELAXED))
        return NULL;
    return __atomic_load_n(&gil->last_holder, __ATOMIC_RELAXED);
#  else
    if (!__atomic_load_n(&gil->locked._value, __ATOMIC_RELAXED))
        return NULL;
    return (PyThreadState *)__atomic_load_n(&gil->last_holder._value, __ATOMIC_RELAXED);
#  endif
}

/* Whether `address` lies inside the GIL's structure (its mutex and condition variables). */
static inline int
in_gil(uintptr_t address)
{
    struct _gil_runtime_state *gil = gil_state;
    return gil != NULL && address >= (uintptr_t)gil && address < (uintptr_t)gil + sizeof *gil;
}

/* The first argument of the system call the signal interrupted (see the top), or 0. */
static inline uintptr_t
interrupted_arg0(const void *ucontext)
{
#  if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
    const ucontext_t *uc = ucontext;
    if (uc == NULL)
        return 0;
#    if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RDI];
#    else
    return (uintptr_t)uc->uc_mcontext.regs[0];
#    endif
#  else
    (void)ucontext;
    return 0;
#  endif
}

int
thread_state(PyThreadState *ts, const void *ucontext, uint64_t *holder)
{
    struct _gil_runtime_state *gil = gil_state;
    if (gil == NULL)
        return STATE_UNKNOWN;
    /* It was the last to take the GIL, and the GIL is taken.  A thread between dropping it
     * and the next holder's taking it reads as holding it, for a few instructions. */
    PyThreadState *taken_by = gil_holder(gil);
    if (taken_by == ts)
        return STATE_RUNNING;
    uintptr_t arg0 = interrupted_arg0(ucontext);
    if (in_gil(arg0) || (arg0 != 0 && waits_for_turn(arg0))) {
        *holder = (uint64_t)(uintptr_t)taken_by;
        return STATE_GIL_WAIT;
    }
    return STATE_RELEASED;
}

uint64_t
gil_holder_now(void)
{
    return gil_state != NULL ? (uint64_t)(uintptr_t)gil_holder(gil_state) : 0;
}

int
blocked_state(pid_t tid)
{
#  if defined(__linux__) && defined(SYS_futex)
    long nr;
    uintptr_t arg0;
    int in_call = syscall_of(tid, &nr, &arg0);
    if (in_call < 0)
        return -1;
    if (!in_call)
        return STATE_CPU_WAIT; /* in no system call, and it has not run */
    uintptr_t address = nr == SYS_futex ? arg0 : 0;
    if (address != 0 && waits_for_turn(address))
        return STATE_GIL_WAIT;
    if (address != 0 && in_gil(address)) {
        /* In the GIL's code while nobody holds it: woken to take it (or to see it taken),
         * it has had no core to do so. */
        return gil_holder(gil_state) != NULL ? STATE_GIL_WAIT : STATE_CPU_WAIT;
    }
    return STATE_RELEASED;
#  else
    (void)tid;
    return -1;
#  endif
}

uint64_t
thread_ident_of(uint64_t tstate)
{
    /* The holder may have ended and its state been freed since: read as memory that may be
     * gone (a system call: the collector's, never the handler's). */
    PyThreadState copy;
    if (tstate == 0 || safe_read((const void *)(uintptr_t)tstate, &copy, sizeof copy) != 0)
        return 0;
    return (uint64_t)copy.thread_id;
}
#else
void
thread_state_init(PyThreadState *ts)
{
    (void)ts;
}

int
thread_state(PyThreadState *ts, const void *ucontext, uint64_t *holder)
{
    (void)ts;
    (void)ucontext;
    (void)holder;
#  ifdef Py_GIL_DISABLED
    /* No GIL to hold or wait for: where the signal found it tells the rest (on CPU, waiting
     * for a core, or blocked; handler.c). */
    return STATE_RELEASED;
#  else
    return STATE_UNKNOWN;
#  endif
}

uint64_t
gil_holder_now(void)
{
    return 0;
}

int
blocked_state(pid_t tid)
{
#  if defined(__linux__) && defined(Py_GIL_DISABLED)
    /* Without a GIL a thread waits only for a core or for something else: in no system call
     * (and it has not run), it was runnable all along. */
    long nr;
    uintptr_t arg0;
    int in_call = syscall_of(tid, &nr, &arg0);
    return in_call < 0 ? -1 : in_call ? STATE_RELEASED : STATE_CPU_WAIT;
#  else
    (void)tid;
    return -1;
#  endif
}

uint64_t
thread_ident_of(uint64_t tstate)
{
    (void)tstate;
    return 0;
}
#endif

/* Whether the signal interrupted a system call the thread was blocked in: to restart it, the
 * kernel has set the thread's instruction pointer back to the call's instruction (x86-64's
 * `syscall`, arm64's `svc #0`), or the call returns EINTR.  -1 where that cannot be told. */
int
interrupted_in_syscall(const void *ucontext)
{
#if defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
    const ucontext_t *uc = ucontext;
    if (uc == NULL)
        return -1;
#  if defined(__x86_64__)
    if ((long long)uc->uc_mcontext.gregs[REG_RAX] == -EINTR)
        return 1;
    /* Read as memory that may not be readable (code mapped execute-only, with protection
     * keys): a system call, once per wall sample of a thread without the GIL. */
    unsigned char code[2];
    if (safe_read((const void *)(uintptr_t)uc->uc_mcontext.gregs[REG_RIP], code, 2) != 0)
        return -1;
    return code[0] == 0x0f && code[1] == 0x05;
#  else
    if ((long long)uc->uc_mcontext.regs[0] == -EINTR)
        return 1;
    uint32_t code;
    if (safe_read((const void *)(uintptr_t)uc->uc_mcontext.pc, &code, sizeof code) != 0)
        return -1;
    return code == 0xd4000001u;
#  endif
#else
    (void)ucontext;
    return -1;
#endif
}

int
collecting_generation(PyThreadState *ts, int state)
{
#ifdef HAVE_GC_STATE
    struct _gc_runtime_state *gc = &ts->interp->gc;
    /* The collector runs with the GIL: a thread without it is not the one collecting. */
    if (state != STATE_RUNNING || !__atomic_load_n(&gc->collecting, __ATOMIC_RELAXED))
        return -1;
    /* A collection of generation g empties the counts of 0..g as it begins and adds one to
     * g + 1's: only a collection of 1 or 2 leaves generation 1's count at 0, and only one of
     * 2 leaves generation 2's at 0 too.  (Generation 0's count grows with what finalizers
     * allocate meanwhile: not read.)  Between the collector's start and the emptying, its
     * "start" callbacks run, read as generation 0 or an earlier generation. */
#  if PY_VERSION_HEX >= 0x030E0000
    /* 3.14's collector counts by its generations differently from release to release (it
     * was incremental for a time): which generation is not told. */
    return 3;
#  else
    if (__atomic_load_n(&gc->generations[1].count, __ATOMIC_RELAXED) != 0)
        return 0;
    return __atomic_load_n(&gc->generations[2].count, __ATOMIC_RELAXED) != 0 ? 1 : 2;
#  endif
#else
    (void)ts;
    (void)state;
    return -1;
#endif
}
