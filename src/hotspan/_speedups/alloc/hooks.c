/* The allocator hooks: what every allocation, reallocation and free of the three domains
 * goes through while the sampler is installed (a byte countdown, a filter load on a free),
 * the slow paths where a countdown runs out, and the allocator structs start() installs.
 * Apart because this is the hot path: the fast paths call nothing outside this file but the
 * header's inlines, so that the compiler sees them whole; only the slow ones (a sample, a
 * free that may be of a sampled block) call into sampling.c and live.c. */
#include "internal.h"

Hot hot __attribute__((aligned(64))) = {0, NULL, {SIZE_MAX, SIZE_MAX, SIZE_MAX}};
Orig orig_lines[N_DOMAINS];
/* MEM/OBJ: a sampled request of a size the domain keeps itself (pymalloc's small blocks) is
 * asked of it at forward_above + 1 bytes instead, so that it comes from the RAW domain: its
 * free then reaches our RAW hook (pymalloc frees a block it does not own with PyMem_RawFree),
 * and that domain's own free needs no hook at all.  Set when start() saw that happen; the
 * live table then holds the block's RAW address, which is the program's minus raw_offset
 * (a debug layer's header). */
int redirect[N_DOMAINS];
intptr_t raw_offset[N_DOMAINS];
_Atomic int sampling;
_Atomic int64_t sample_bytes = 512 * 1024;
_Atomic uint32_t generation; /* of start(): a thread whose own differs re-arms */

THREAD_LOCAL int64_t tls_countdown; /* RAW: bytes to the next sample */
THREAD_LOCAL uint32_t tls_generation;
THREAD_LOCAL int tls_busy;
/* start()'s probes: 1, the RAW hook notes the block it allocates; 2, its free of that block. */
THREAD_LOCAL int tls_probe;
THREAD_LOCAL uintptr_t tls_probe_ptr;
THREAD_LOCAL int tls_probe_seen;
_Atomic uint64_t n_no_gil;
#ifdef Py_GIL_DISABLED
THREAD_LOCAL int64_t tls_obj_countdown; /* MEM/OBJ: this thread's bytes to the next sample */
THREAD_LOCAL uint32_t tls_obj_generation;
pthread_mutex_t sample_mutex = PTHREAD_MUTEX_INITIALIZER;
#endif

/* RAW: this thread's countdown crossed zero on an allocation of `size` bytes at `ptr`. */
static NOINLINE void
countdown_expired(void *ptr, size_t size)
{
    if (UNLIKELY(tls_probe == 1)) {
        tls_probe_ptr = (uintptr_t)ptr;
        tls_countdown = INT64_MAX / 2;
        return;
    }
    if (ptr == NULL) {
        tls_countdown = 0; /* the allocation failed: the next one is the sample */
        return;
    }
    int64_t mean = atomic_load_explicit(&sample_bytes, memory_order_relaxed);
    if (!atomic_load_explicit(&sampling, memory_order_acquire)) {
        tls_countdown = INERT_RECHECK_BYTES;
        return;
    }
    uint32_t gen = atomic_load_explicit(&generation, memory_order_relaxed);
    if (UNLIKELY(tls_generation != gen)) {
        /* New to this run: sample from the next countdown, at its own random point. */
        arm_thread(gen);
        tls_countdown = draw_interval(mean);
        return;
    }
    tls_countdown = draw_interval(mean);
    if (tls_busy || size == 0)
        return;
    /* Not PyGILState_Check alone: it answers 1 when it cannot tell (sub-interpreters). */
    PyThreadState *ts = CURRENT_TSTATE();
    if (ts == NULL || !PyGILState_Check()) {
        atomic_fetch_add_explicit(&n_no_gil, 1, memory_order_relaxed);
        return;
    }
    tls_busy = 1;
    SAMPLE_LOCK();
    take_sample(ts, (uintptr_t)ptr, size, mean);
    SAMPLE_UNLOCK();
    tls_busy = 0;
}

enum { K_MALLOC, K_CALLOC, K_REALLOC };

/* Domain d's own allocation, the RAW hook kept from counting (or sampling) what it passes on:
 * that was counted here. */
static void *
call_uncounted(int d, int kind, void *ctx, void *ptr, size_t nelem, size_t size)
{
    int64_t saved = tls_countdown;
    tls_countdown = INT64_MAX / 2;
    void *p = kind == K_MALLOC   ? orig(d).malloc(ctx, size)
              : kind == K_CALLOC ? orig(d).calloc(ctx, nelem, size)
                                 : orig(d).realloc(ctx, ptr, size);
    tls_countdown = saved;
    return p;
}

/* MEM/OBJ, with the GIL (free-threaded: attached): the countdown ran out on this request of `size` bytes (nelem x size
 * for calloc).  Makes the allocation and, when it is sampled, records it. */
static NOINLINE void *
gil_countdown_expired(int d, int kind, void *ctx, void *ptr, size_t nelem, size_t size)
{
    size_t total = kind == K_CALLOC ? nelem * size : size;
    int64_t mean = atomic_load_explicit(&sample_bytes, memory_order_relaxed);
    if (!atomic_load_explicit(&sampling, memory_order_acquire)) {
        OBJ_COUNTDOWN = INERT_RECHECK_BYTES;
        return call_uncounted(d, kind, ctx, ptr, nelem, size);
    }
    uint32_t gen = atomic_load_explicit(&generation, memory_order_relaxed);
    if (UNLIKELY(tls_generation != gen))
        arm_thread(gen);
#ifdef Py_GIL_DISABLED
    if (UNLIKELY(tls_obj_generation != gen)) {
        /* This thread's own countdown, new to this run: from its own random point. */
        tls_obj_generation = gen;
        OBJ_COUNTDOWN = draw_interval(mean);
        return call_uncounted(d, kind, ctx, ptr, nelem, size);
    }
#endif
    OBJ_COUNTDOWN = draw_interval(mean);
    PyThreadState *ts = CURRENT_TSTATE();
    if (tls_busy || total == 0 || ts == NULL)
        return call_uncounted(d, kind, ctx, ptr, nelem, size);
    void *p;
    uintptr_t at;
    if (redirect[d] && total <= forward_above[d]) {
        size_t ask = forward_above[d] + 1;
        p = kind == K_MALLOC   ? call_uncounted(d, K_MALLOC, ctx, NULL, 0, ask)
            : kind == K_CALLOC ? call_uncounted(d, K_CALLOC, ctx, NULL, 1, ask)
                               : call_uncounted(d, K_REALLOC, ctx, ptr, 0, ask);
        at = (uintptr_t)p - (uintptr_t)raw_offset[d];
    } else {
        p = call_uncounted(d, kind, ctx, ptr, nelem, size);
        at = (uintptr_t)p;
    }
    if (p == NULL) {
        OBJ_COUNTDOWN = 0; /* the allocation failed: the next one is the sample */
        return NULL;
    }
    tls_busy = 1;
    SAMPLE_LOCK();
    take_sample(ts, at, total, mean);
    SAMPLE_UNLOCK();
    tls_busy = 0;
    return p;
}

/* Every RAW free and realloc (and MEM/OBJ ones where the sampled blocks stay in that domain):
 * before the block goes back, so that its address cannot be handed out (and sampled) again
 * while it is still in the table. */
static inline __attribute__((always_inline)) void
forget(void *ptr)
{
    const Filter *f = atomic_load_explicit(&live_filter, memory_order_acquire);
    if (UNLIKELY(filter_has(f, (uintptr_t)ptr)))
        forget_slow((uintptr_t)ptr);
}

#define HOT __attribute__((hot))

/* RAW: any thread, with or without the GIL; a countdown per thread.  The ctx we get is the
 * one of the allocator we replaced (ours is a copy of it), so it is passed on as it came. */
static NOINLINE void *
raw_sampled_malloc(void *ctx, size_t size)
{
    void *p = orig(0).malloc(ctx, size);
    countdown_expired(p, size);
    return p;
}

static HOT void *
hook_malloc_0(void *ctx, size_t size)
{
    int64_t left = tls_countdown - (int64_t)size;
    tls_countdown = left;
    if (UNLIKELY(left < 0))
        return raw_sampled_malloc(ctx, size);
    return orig(0).malloc(ctx, size);
}

static HOT void *
hook_calloc_0(void *ctx, size_t nelem, size_t elsize)
{
    size_t size = nelem * elsize;
    void *p = orig(0).calloc(ctx, nelem, elsize);
    int64_t left = tls_countdown - (int64_t)size;
    tls_countdown = left;
    if (UNLIKELY(left < 0))
        countdown_expired(p, size);
    return p;
}

static HOT void *
hook_realloc_0(void *ctx, void *ptr, size_t size)
{
    forget(ptr);
    void *p = orig(0).realloc(ctx, ptr, size);
    int64_t left = tls_countdown - (int64_t)size;
    tls_countdown = left;
    if (UNLIKELY(left < 0))
        countdown_expired(p, size);
    return p;
}

static NOINLINE void
raw_free_slow(void *ctx, void *ptr)
{
    forget_slow((uintptr_t)ptr);
    orig(0).free(ctx, ptr);
}

static HOT void
hook_free_0(void *ctx, void *ptr)
{
    const Filter *f = atomic_load_explicit(&live_filter, memory_order_acquire);
    if (UNLIKELY(filter_has(f, (uintptr_t)ptr)))
        raw_free_slow(ctx, ptr); /* a tail call too: nothing to keep across a call here */
    else
        orig(0).free(ctx, ptr);
}

/* MEM and OBJ: only with the GIL (free-threaded: by an attached thread).  pymalloc hands requests over 512 bytes to the RAW domain;
 * start() finds out above which size a domain does that (forward_above), and these hooks
 * leave those sizes to the RAW hook: counted once, and the common small request pays a
 * compare, a subtraction and the jump on. */
#define DEFINE_HOOKS(D)                                                                        \
    static HOT void *hook_malloc_##D(void *ctx, size_t size)                                   \
    {                                                                                          \
        if (size <= forward_above[D]) {                                                        \
            int64_t left = OBJ_COUNTDOWN - (int64_t)size;                                      \
            OBJ_COUNTDOWN = left;                                                              \
            if (UNLIKELY(left < 0))                                                            \
                return gil_countdown_expired(D, K_MALLOC, ctx, NULL, 0, size);                 \
        }                                                                                      \
        return orig(D).malloc(ctx, size);                                                      \
    }                                                                                          \
    static HOT void *hook_calloc_##D(void *ctx, size_t nelem, size_t elsize)                   \
    {                                                                                          \
        size_t size = nelem * elsize;                                                          \
        if (size <= forward_above[D]) {                                                        \
            int64_t left = OBJ_COUNTDOWN - (int64_t)size;                                      \
            OBJ_COUNTDOWN = left;                                                              \
            if (UNLIKELY(left < 0))                                                            \
                return gil_countdown_expired(D, K_CALLOC, ctx, NULL, nelem, elsize);           \
        }                                                                                      \
        return orig(D).calloc(ctx, nelem, elsize);                                             \
    }                                                                                          \
    static HOT void *hook_realloc_##D(void *ctx, void *ptr, size_t size)                       \
    {                                                                                          \
        if (ptr != NULL)                                                                       \
            forget((char *)ptr - raw_offset[D]);                                               \
        if (size > forward_above[D])                                                           \
            return orig(D).realloc(ctx, ptr, size);                                            \
        int64_t left = OBJ_COUNTDOWN - (int64_t)size;                                          \
        OBJ_COUNTDOWN = left;                                                                  \
        if (UNLIKELY(left < 0))                                                                \
            return gil_countdown_expired(D, K_REALLOC, ctx, ptr, 0, size);                     \
        /* Counted here: a block pymalloc does not own goes on to the RAW realloc. */          \
        return call_uncounted(D, K_REALLOC, ctx, ptr, 0, size);                                \
    }                                                                                          \
    static NOINLINE void free_slow_##D(void *ctx, void *ptr)                                   \
    {                                                                                          \
        forget_slow((uintptr_t)ptr);                                                           \
        orig(D).free(ctx, ptr);                                                                \
    }                                                                                          \
    static HOT void hook_free_##D(void *ctx, void *ptr)                                        \
    {                                                                                          \
        const Filter *f = atomic_load_explicit(&live_filter, memory_order_acquire);            \
        if (UNLIKELY(filter_has(f, (uintptr_t)ptr)))                                           \
            free_slow_##D(ctx, ptr);                                                           \
        else                                                                                   \
            orig(D).free(ctx, ptr);                                                            \
    }

DEFINE_HOOKS(1)
DEFINE_HOOKS(2)

const PyMemAllocatorDomain domains[N_DOMAINS] = {PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM,
                                                 PYMEM_DOMAIN_OBJ};

PyMemAllocatorEx
our_allocator(int d)
{
    /* The ctx of the allocator we replace: whoever reads a torn struct calls either function
     * with the ctx it expects. */
    PyMemAllocatorEx a = {orig(d).ctx, NULL, NULL, NULL, NULL};
    switch (d) {
    case 0:
        a.malloc = hook_malloc_0, a.calloc = hook_calloc_0, a.realloc = hook_realloc_0,
        a.free = hook_free_0;
        break;
    case 1:
        a.malloc = hook_malloc_1, a.calloc = hook_calloc_1, a.realloc = hook_realloc_1,
        a.free = redirect[1] ? orig(1).free : hook_free_1;
        break;
    default:
        a.malloc = hook_malloc_2, a.calloc = hook_calloc_2, a.realloc = hook_realloc_2,
        a.free = redirect[2] ? orig(2).free : hook_free_2;
        break;
    }
    return a;
}

int
is_ours(int d)
{
    PyMemAllocatorEx current;
    PyMem_GetAllocator(domains[d], &current);
    PyMemAllocatorEx ours = our_allocator(d);
    return current.malloc == ours.malloc && current.free == ours.free &&
           current.calloc == ours.calloc && current.realloc == ours.realloc;
}

/* Whether a request of `size` bytes to domain d's own allocator comes through our RAW hook:
 * the RAW hook counts it down from this thread's countdown (sampling is still off). */
