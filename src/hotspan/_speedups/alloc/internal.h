/* Allocations and live heap: a hook on CPython's allocators (the PyMem_SetAllocator family)
 * that samples, on average, one allocation per `sample_bytes` bytes allocated.
 *
 * The hook sits in front of whatever allocator was installed (pymalloc, the debug hooks,
 * tracemalloc) in the RAW, MEM and OBJ domains and forwards every call to it.  What it adds
 * on the way:
 *
 * - malloc/calloc/realloc: a byte countdown (per thread for RAW; one for MEM/OBJ, which are
 *   only called with the GIL).  When it crosses zero, the allocation
 *   that crossed it is sampled and a new countdown is drawn from an exponential distribution
 *   (mean `sample_bytes`), as Go's runtime does (runtime/malloc.go, nextSample): a sampling
 *   process that is Poisson in bytes cannot alias a periodic allocation pattern, and it
 *   samples an allocation of size s with probability 1 - exp(-s/R), so weighting a sample by
 *   the inverse of that makes the totals unbiased estimates of all allocations.
 * - a sample records the Python stack and the span/tag labels of the allocating thread, read
 *   by _sampler's capsule API (no Python calls, no allocation), but only when that thread
 *   holds the GIL: the RAW domain is also used by threads that do not, and neither the stack
 *   nor the code objects may be touched then.  Those samples are skipped and counted.
 * - pymalloc passes requests over 512 bytes on to the RAW domain: those are counted there,
 *   once (see DEFINE_HOOKS).
 * - a sampled allocation is remembered, by address, while it lives (the live heap), so the
 *   free and realloc of its block must find it.  With pymalloc underneath, a sampled small
 *   MEM/OBJ request is made as a request above 512 bytes, which pymalloc takes from the RAW
 *   domain and frees back to it: every sampled block is then a RAW block, and the MEM/OBJ
 *   frees (most of a program's) go straight to pymalloc, unhooked (see `redirect`).  A RAW
 *   free asks a small bitmap indexed by a hash of the address, which answers "certainly
 *   not" with one load for nearly all of them; only the rest take the mutex that guards the
 *   table (RAW frees come without the GIL, so the GIL cannot be that guard).
 *
 * Our own tables live in plain malloc memory, never in the hooked domains, and a thread-local
 * flag keeps the hook from sampling while it (or collect) is at work on that thread.
 *
 * Code objects: a sampled stack holds a reference to each of its code objects (taken with the
 * GIL, in the hook) until collect() has named it and no live sample uses it any more; the
 * references are dropped in collect, with the GIL, after the tables are consistent again.
 *
 * One extension module, hotspan._speedups._alloc, built from the files of this directory;
 * this header is what they share (nothing here is exported from the module, see HIDDEN):
 *
 *   hooks.c     the allocator hooks: the fast paths and where a countdown runs out
 *   sampling.c  taking a sample: the countdown draw, the stack, labels and weight
 *   probe.c     start()'s probes of the allocator chain
 *   live.c      the live heap: sampled blocks still allocated, and the free path's filter
 *   stacks.c    sampled stacks, interned, holding their code objects
 *   window.c    allocations since the last collect, by stack and labels
 *   module.c    the module's functions, fork handlers and module init
 */
#ifndef HOTSPAN_ALLOC_INTERNAL_H
#define HOTSPAN_ALLOC_INTERNAL_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../sampler_api.h"

#include <pthread.h>
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

#if PY_VERSION_HEX >= 0x030D0000
#  define CURRENT_TSTATE() PyThreadState_GetUnchecked()
#else
#  define CURRENT_TSTATE() _PyThreadState_UncheckedGet()
#endif

/* initial-exec: a thread-local read is one %fs-relative load, not a call to __tls_get_addr,
 * which matters on a path every allocation takes. */
#define THREAD_LOCAL __thread __attribute__((tls_model("initial-exec")))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define NOINLINE __attribute__((noinline))
#define UNUSED __attribute__((unused))

#define N_DOMAINS 3              /* PYMEM_DOMAIN_RAW, _MEM, _OBJ */
#define FILTER_MIN_BITS 15       /* 4 KiB: stays in L1 beside the program's own data */
#define FILTER_MAX_BITS 21       /* 256 KiB */
#define MAX_LIVE 32768           /* live samples tracked (a 16 GiB heap at 512 KiB) */
#define MAX_STACKS 16384
#define MAX_STACK_BYTES ((size_t)4 << 20)
#define MAX_WINDOW_KEYS 16384    /* distinct (stack, labels) per window */
/* A thread whose countdown ends while sampling is off looks again after this many bytes, so
 * an inert hook costs next to nothing and a restart reaches every thread soon. */
#define INERT_RECHECK_BYTES ((int64_t)1 << 20)

/* What one file of the module defines for the others: hidden, so that the module exports
 * nothing but its init function, as when it was one file of statics. */
#define HIDDEN __attribute__((visibility("hidden")))

typedef HotspanRawFrame Frame;

typedef struct Stack {
    struct Stack *next; /* hash chain, or the release list */
    uint64_t hash;
    uint64_t last_epoch;          /* the window that last used it */
    _Atomic uint32_t live_refs;   /* live samples on it (changed under live_mutex) */
    uint32_t depth;
    PyObject *built;              /* its tuple, only while collect builds */
    Frame frames[];
} Stack;

typedef struct {
    Stack *stack; /* NULL: free slot */
    uint64_t labels[HOTSPAN_LABEL_WORDS];
    double values[4]; /* alloc objects, alloc bytes, inuse objects, inuse bytes */
} WindowSlot;

typedef struct {
    WindowSlot *slots;
    size_t cap; /* power of two, or 0 */
    size_t count;
} Window;

typedef struct {
    uintptr_t ptr; /* 0: free slot */
    Stack *stack;
    uint64_t size;
    uint64_t labels[HOTSPAN_LABEL_WORDS];
} LiveSlot;

typedef struct Filter Filter;
/* What the fast paths read, together: one cache line for the MEM/OBJ malloc and the RAW free,
 * and the functions we forward to, a line per domain (the RAW domain's is read by threads
 * that do not hold the GIL: no line written on every allocation is shared with them). */
typedef struct {
    /* MEM/OBJ: bytes to the next sample.  Those domains may only be called with the GIL
     * held, so one countdown serves every thread, without a thread-local access (in a shared
     * object, initial-exec TLS still costs a load of its offset from the GOT).  Free-threaded
     * builds have no GIL to share it under: there each thread has its own (OBJ_COUNTDOWN). */
    int64_t countdown;
    Filter *_Atomic filter; /* see live samples below */
    /* Requests above this size the domain's allocator passes on to the RAW domain. */
    size_t forward_above[N_DOMAINS];
} Hot;

HIDDEN extern Hot hot;
#define forward_above hot.forward_above
#define live_filter hot.filter
/* Free-threaded builds: no GIL makes one thread at a time allocate from the MEM/OBJ domains,
 * so each thread counts down its own bytes, and taking a sample (the stack buffer, the stack
 * and window tables) is under sample_mutex.  Its holders call no Python and wait for nothing
 * else (the live table's mutex aside, always taken after it), so a thread that waits for it
 * while attached holds up a stop-the-world only that long.  With the GIL, the GIL is that
 * lock. */
#ifdef Py_GIL_DISABLED
#  define OBJ_COUNTDOWN tls_obj_countdown
#  define SAMPLE_LOCK() pthread_mutex_lock(&sample_mutex)
#  define SAMPLE_UNLOCK() pthread_mutex_unlock(&sample_mutex)
#else
#  define OBJ_COUNTDOWN hot.countdown
#  define SAMPLE_LOCK() ((void)0)
#  define SAMPLE_UNLOCK() ((void)0)
#endif
typedef struct {
    PyMemAllocatorEx a;
} __attribute__((aligned(64))) Orig;
HIDDEN extern Orig orig_lines[N_DOMAINS];
#define orig(d) (orig_lines[d].a)

/* Live samples: under live_mutex; the filter bitmap is read without it.
 *
 * The filter has a bit set for the address of every live sample.  What the free path reads
 * is only that bitmap (4 KiB for up to 512 live samples, so it stays in L1: a byte-per-slot
 * counting filter of the same precision missed the cache on most frees, which cost more than
 * the rest of the hook).  How many live samples share each bit is kept beside it, read only
 * under the mutex, so a bit is cleared when its last sample is freed: pymalloc hands a freed
 * address straight out again, and a stale bit on it would send every later free of that
 * address down the slow path.
 *
 * As the live count grows (or shrinks) the bitmap is rebuilt at a new size into the other of
 * two buffers and published with one pointer store.  A free that loaded the old pointer still
 * reads every bit it needs: the old buffer is not reused until the rebuild after next.  (A
 * thread stalled between those two loads across two rebuilds could miss one removal: one
 * freed sample counted as live until its address is sampled again.) */
struct Filter {
    unsigned shift; /* 64 - bits */
    _Atomic uint64_t words[(1u << FILTER_MAX_BITS) / 64];
};

/* hooks.c */
HIDDEN extern int redirect[N_DOMAINS];
HIDDEN extern intptr_t raw_offset[N_DOMAINS];
HIDDEN extern _Atomic int sampling;
HIDDEN extern _Atomic int64_t sample_bytes;
HIDDEN extern _Atomic uint32_t generation;
HIDDEN extern THREAD_LOCAL int64_t tls_countdown;
HIDDEN extern THREAD_LOCAL uint32_t tls_generation;
HIDDEN extern THREAD_LOCAL int tls_busy;
HIDDEN extern THREAD_LOCAL int tls_probe;
HIDDEN extern THREAD_LOCAL uintptr_t tls_probe_ptr;
HIDDEN extern THREAD_LOCAL int tls_probe_seen;
HIDDEN extern _Atomic uint64_t n_no_gil;
#ifdef Py_GIL_DISABLED
HIDDEN extern THREAD_LOCAL int64_t tls_obj_countdown;
HIDDEN extern THREAD_LOCAL uint32_t tls_obj_generation;
HIDDEN extern pthread_mutex_t sample_mutex;
#endif

/* sampling.c */
HIDDEN extern const HotspanSamplerAPI *api;
HIDDEN extern int max_depth;
HIDDEN extern Frame *frame_buf;
HIDDEN extern uint64_t n_samples;
HIDDEN extern uint64_t n_no_stack;
HIDDEN extern uint64_t n_dropped_stacks;
HIDDEN extern uint64_t n_dropped_window;

/* probe.c */
HIDDEN extern int forwarding_unclear;

/* live.c */
HIDDEN extern Filter filters[2];
HIDDEN extern uint8_t filter_counts[1u << FILTER_MAX_BITS];
HIDDEN extern uint64_t n_filter_rebuilds;
HIDDEN extern pthread_mutex_t live_mutex;
HIDDEN extern LiveSlot *live_slots;
HIDDEN extern size_t live_cap;
HIDDEN extern size_t live_count;
HIDDEN extern uint64_t n_dropped_live;
HIDDEN extern uint64_t n_free_checks;
HIDDEN extern uint64_t n_live_freed;

/* stacks.c */
HIDDEN extern size_t stack_count;
HIDDEN extern uint64_t epoch;

/* window.c */
HIDDEN extern Window window;

static inline uint64_t
filter_bit(const Filter *f, uintptr_t p)
{
    /* Blocks are 16-byte aligned: p's low bits are zeros, the product's top bits still mix the
     * rest (one instruction less than hashing p >> 4). */
    return ((uint64_t)p * 0x9E3779B97F4A7C15ull) >> f->shift;
}

static inline int
filter_has(const Filter *f, uintptr_t p)
{
    uint64_t bit = filter_bit(f, p);
    return (atomic_load_explicit(&f->words[bit >> 6], memory_order_relaxed) >> (bit & 63)) & 1;
}

/* Under live_mutex. */
static inline void
filter_add(Filter *f, uintptr_t p)
{
    uint64_t bit = filter_bit(f, p);
    if (filter_counts[bit] == 0)
        atomic_fetch_or_explicit(&f->words[bit >> 6], 1ull << (bit & 63), memory_order_release);
    if (filter_counts[bit] != 255)
        filter_counts[bit]++;
}

/* Under live_mutex. */
static inline void
filter_remove(Filter *f, uintptr_t p)
{
    uint64_t bit = filter_bit(f, p);
    if (filter_counts[bit] == 255 || filter_counts[bit] == 0)
        return;
    if (--filter_counts[bit] == 0)
        atomic_fetch_and_explicit(&f->words[bit >> 6], ~(1ull << (bit & 63)),
                                  memory_order_relaxed);
}

static inline size_t
ptr_hash(uintptr_t p)
{
    return (size_t)(((uint64_t)(p >> 4) * 0xD6E8FEB86659FD93ull) >> 17);
}

/* sampling.c */
HIDDEN double one_minus_exp_neg(double x);
HIDDEN int64_t draw_interval(int64_t mean);
HIDDEN void take_sample(PyThreadState *ts, uintptr_t ptr, size_t size, int64_t mean);
HIDDEN void arm_thread(uint32_t gen);

/* hooks.c */
HIDDEN extern const PyMemAllocatorDomain domains[N_DOMAINS];
HIDDEN PyMemAllocatorEx our_allocator(int d);
HIDDEN int is_ours(int d);

/* probe.c */
HIDDEN size_t find_forwarding(int d);
HIDDEN int probe_redirect(int d);

/* live.c */
HIDDEN unsigned filter_bits_for(size_t live);
HIDDEN void filter_rebuild(unsigned bits);
HIDDEN void live_add(uintptr_t p, Stack *stack, uint64_t size, const uint64_t *labels);
HIDDEN NOINLINE void forget_slow(uintptr_t p);
HIDDEN void live_clear(int keep_tracking);

/* stacks.c */
HIDDEN Stack *intern_stack(const Frame *frames, int n);
HIDDEN Stack *stacks_unlink(int all, uint64_t before_epoch);
HIDDEN void stacks_release(Stack *list);

/* window.c */
HIDDEN WindowSlot *window_slot(Window *w, Stack *s, const uint64_t *labels);
HIDDEN void window_free(Window *w);

#endif
