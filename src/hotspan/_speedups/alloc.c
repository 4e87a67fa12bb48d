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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "sampler_api.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) { Py_INCREF(o); return o; }
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

/* ---------------------------------------------------------------- arithmetic */

/* Own log and exp: a libm dependency is not worth two functions used once per sample. */
static double
ln(double x) /* x > 0 */
{
    union {
        double d;
        uint64_t u;
    } v = {x};
    int e = (int)((v.u >> 52) & 0x7ff) - 1023;
    v.u = (v.u & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    double m = v.d;
    if (m > 1.4142135623730951) {
        m *= 0.5;
        e += 1;
    }
    double z = (m - 1.0) / (m + 1.0); /* |z| < 0.172: the atanh series converges fast */
    double z2 = z * z;
    double s =
        z * (2.0 + z2 * (2.0 / 3 + z2 * (2.0 / 5 + z2 * (2.0 / 7 + z2 * (2.0 / 9 + z2 * 2.0 / 11)))));
    return e * 0.6931471805599453 + s;
}

static double
one_minus_exp_neg(double x) /* 1 - exp(-x), x >= 0 */
{
    if (x < 1e-4)
        return x * (1.0 - x * (0.5 - x / 6.0));
    if (x > 40.0)
        return 1.0;
    int k = (int)(x / 0.6931471805599453);
    double r = x - k * 0.6931471805599453; /* [0, ln 2) */
    double t = 1.0;
    for (int i = 14; i >= 1; i--)
        t = 1.0 - r * t / i; /* Horner form of the Taylor series of exp(-r) */
    union {
        double d;
        uint64_t u;
    } scale = {.u = (uint64_t)(1023 - k) << 52};
    return 1.0 - t * scale.d;
}

/* ---------------------------------------------------------------- state */

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

static const HotspanSamplerAPI *api;
/* What the fast paths read, together: one cache line for the MEM/OBJ malloc and the RAW free,
 * and the functions we forward to, a line per domain (the RAW domain's is read by threads
 * that do not hold the GIL: no line written on every allocation is shared with them). */
typedef struct Filter Filter;
static struct {
    /* MEM/OBJ: bytes to the next sample.  Those domains may only be called with the GIL
     * held, so one countdown serves every thread, without a thread-local access (in a shared
     * object, initial-exec TLS still costs a load of its offset from the GOT). */
    int64_t countdown;
    Filter *_Atomic filter; /* see live samples below */
    /* Requests above this size the domain's allocator passes on to the RAW domain. */
    size_t forward_above[N_DOMAINS];
} hot __attribute__((aligned(64))) = {0, NULL, {SIZE_MAX, SIZE_MAX, SIZE_MAX}};
#define forward_above hot.forward_above
#define live_filter hot.filter
#ifdef Py_GIL_DISABLED
#  error "the MEM/OBJ countdown relies on the GIL"
#endif
typedef struct {
    PyMemAllocatorEx a;
} __attribute__((aligned(64))) Orig;
static Orig orig_lines[N_DOMAINS];
#define orig(d) (orig_lines[d].a)
static int hooked[N_DOMAINS]; /* ours is in that domain's chain (sampling or inert) */
static int forwarding_unclear; /* a domain forwards, but not simply above some size */
/* MEM/OBJ: a sampled request of a size the domain keeps itself (pymalloc's small blocks) is
 * asked of it at forward_above + 1 bytes instead, so that it comes from the RAW domain: its
 * free then reaches our RAW hook (pymalloc frees a block it does not own with PyMem_RawFree),
 * and that domain's own free needs no hook at all.  Set when start() saw that happen; the
 * live table then holds the block's RAW address, which is the program's minus raw_offset
 * (a debug layer's header). */
static int redirect[N_DOMAINS];
static intptr_t raw_offset[N_DOMAINS];
static _Atomic int sampling;
static _Atomic int64_t sample_bytes = 512 * 1024;
static _Atomic uint32_t generation; /* of start(): a thread whose own differs re-arms */
static int max_depth = 64;
static Frame *frame_buf; /* with the GIL: only the thread holding it samples */

static THREAD_LOCAL int64_t tls_countdown; /* RAW: bytes to the next sample */
static THREAD_LOCAL uint32_t tls_generation;
static THREAD_LOCAL uint64_t tls_rng;
static THREAD_LOCAL int tls_busy;
/* start()'s probes: 1, the RAW hook notes the block it allocates; 2, its free of that block. */
static THREAD_LOCAL int tls_probe;
static THREAD_LOCAL uintptr_t tls_probe_ptr;
static THREAD_LOCAL int tls_probe_seen;

/* Stacks: with the GIL. */
static Stack **stack_buckets;
static size_t stack_nbuckets; /* power of two */
static size_t stack_count;
static size_t stack_bytes;
static uint64_t epoch = 1;

static Window window; /* with the GIL */
static int collecting;
/* stop() or after_fork() came while another thread's collect held stacks: it frees them. */
static int release_pending;

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
/* In .bss: pages never used are never resident (at the minimum size, 4 + 4 + 32 KiB are). */
static Filter filters[2];
static uint8_t filter_counts[1u << FILTER_MAX_BITS]; /* 255: stuck until the next rebuild */
static uint64_t n_filter_rebuilds;
static pthread_mutex_t live_mutex = PTHREAD_MUTEX_INITIALIZER;
static LiveSlot *live_slots;
static size_t live_cap; /* power of two, or 0 */
static size_t live_count;
static int tracking;

/* Counts, for stats(). */
static uint64_t n_samples;
static uint64_t n_no_stack;
static uint64_t n_dropped_stacks;
static uint64_t n_dropped_window;
static uint64_t n_dropped_live;
static _Atomic uint64_t n_no_gil;
static uint64_t n_free_checks; /* frees the filter could not rule out (under live_mutex) */
static uint64_t n_live_freed;

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

/* ---------------------------------------------------------------- live table */

static LiveSlot *
live_find(uintptr_t p)
{
    if (live_cap == 0)
        return NULL;
    size_t mask = live_cap - 1;
    for (size_t i = ptr_hash(p) & mask;; i = (i + 1) & mask) {
        if (live_slots[i].ptr == p)
            return &live_slots[i];
        if (live_slots[i].ptr == 0)
            return NULL;
    }
}

static void
live_place(LiveSlot *slots, size_t cap, const LiveSlot *entry)
{
    size_t mask = cap - 1;
    size_t i = ptr_hash(entry->ptr) & mask;
    while (slots[i].ptr != 0)
        i = (i + 1) & mask;
    slots[i] = *entry;
}

static int
live_grow(void)
{
    size_t cap = live_cap ? live_cap * 2 : 1024;
    LiveSlot *slots = calloc(cap, sizeof(LiveSlot));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < live_cap; i++)
        if (live_slots[i].ptr != 0)
            live_place(slots, cap, &live_slots[i]);
    free(live_slots);
    live_slots = slots;
    live_cap = cap;
    return 0;
}

/* Removes the slot (linear probing, backward shift: no tombstones to clean up). */
static void
live_remove(LiveSlot *slot)
{
    size_t mask = live_cap - 1;
    size_t i = (size_t)(slot - live_slots);
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (live_slots[j].ptr == 0)
            break;
        size_t home = ptr_hash(live_slots[j].ptr) & mask;
        /* j's entry may move to i only if its home is not in (i, j]. */
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            live_slots[i] = live_slots[j];
            i = j;
        }
    }
    live_slots[i].ptr = 0;
}

/* Bits for `live` samples: about 1 in 64 set, so that few frees take the slow path. */
static unsigned
filter_bits_for(size_t live)
{
    unsigned bits = FILTER_MIN_BITS;
    while (bits < FILTER_MAX_BITS && ((size_t)1 << bits) < live * 64)
        bits++;
    return bits;
}

/* Under live_mutex: a fresh filter of `bits` for the live samples, then published. */
static void
filter_rebuild(unsigned bits)
{
    Filter *old = atomic_load_explicit(&live_filter, memory_order_relaxed);
    Filter *f = old == &filters[0] ? &filters[1] : &filters[0];
    f->shift = 64 - bits;
    memset((void *)f->words, 0, ((size_t)1 << bits) / 8);
    memset(filter_counts, 0, (size_t)1 << (64 - old->shift > bits ? 64 - old->shift : bits));
    for (size_t i = 0; i < live_cap; i++)
        if (live_slots[i].ptr != 0)
            filter_add(f, live_slots[i].ptr);
    n_filter_rebuilds++;
    atomic_store_explicit(&live_filter, f, memory_order_release);
}

/* With the GIL: `p` was just returned by the allocator and is not yet visible elsewhere. */
static void
live_add(uintptr_t p, Stack *stack, uint64_t size, const uint64_t *labels)
{
    pthread_mutex_lock(&live_mutex);
    if (!tracking || live_count >= MAX_LIVE ||
        (live_count + 1 > live_cap / 2 && live_grow() < 0)) {
        n_dropped_live++;
        pthread_mutex_unlock(&live_mutex);
        return;
    }
    LiveSlot *old = live_find(p);
    if (old != NULL) {
        /* A block freed behind our back (before the hook, or by a foreign allocator on top
         * of ours whose free bypassed us) and reused: forget the stale one. */
        atomic_fetch_sub_explicit(&old->stack->live_refs, 1, memory_order_relaxed);
        filter_remove(atomic_load_explicit(&live_filter, memory_order_relaxed), p);
        live_remove(old);
        live_count--;
    }
    LiveSlot entry = {.ptr = p, .stack = stack, .size = size};
    memcpy(entry.labels, labels, sizeof(entry.labels));
    live_place(live_slots, live_cap, &entry);
    live_count++;
    atomic_fetch_add_explicit(&stack->live_refs, 1, memory_order_relaxed);
    Filter *f = atomic_load_explicit(&live_filter, memory_order_relaxed);
    if (filter_bits_for(live_count) > 64 - f->shift)
        filter_rebuild(filter_bits_for(live_count)); /* with p, now in the table */
    else
        filter_add(f, p);
    pthread_mutex_unlock(&live_mutex);
}

static NOINLINE void
forget_slow(uintptr_t p)
{
    if (p == 0) /* free(NULL): 0 marks an empty slot */
        return;
    if (UNLIKELY(tls_probe == 2) && p == tls_probe_ptr)
        tls_probe_seen = 1;
    pthread_mutex_lock(&live_mutex);
    n_free_checks++;
    LiveSlot *slot = tracking ? live_find(p) : NULL;
    if (slot != NULL) {
        atomic_fetch_sub_explicit(&slot->stack->live_refs, 1, memory_order_relaxed);
        filter_remove(atomic_load_explicit(&live_filter, memory_order_relaxed), p);
        live_remove(slot);
        live_count--;
        n_live_freed++;
    }
    pthread_mutex_unlock(&live_mutex);
}

/* Empties the live table (the stacks' live_refs with it). */
static void
live_clear(int keep_tracking)
{
    pthread_mutex_lock(&live_mutex);
    for (size_t i = 0; i < live_cap; i++)
        if (live_slots[i].ptr != 0)
            atomic_store_explicit(&live_slots[i].stack->live_refs, 0, memory_order_relaxed);
    free(live_slots);
    live_slots = NULL;
    live_cap = 0;
    live_count = 0;
    filter_rebuild(FILTER_MIN_BITS);
    tracking = keep_tracking;
    pthread_mutex_unlock(&live_mutex);
}

/* ---------------------------------------------------------------- stacks */

static uint64_t
stack_hash(const Frame *frames, int n)
{
    uint64_t h = 0x84222325cbf29ce4ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h = (h ^ frames[i].code) * 0x100000001b3ull;
        h = (h ^ frames[i].lasti) * 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

static int
stacks_grow(void)
{
    size_t n = stack_nbuckets ? stack_nbuckets * 2 : 1024;
    Stack **buckets = calloc(n, sizeof(Stack *));
    if (buckets == NULL)
        return -1;
    for (size_t i = 0; i < stack_nbuckets; i++) {
        Stack *s = stack_buckets[i];
        while (s != NULL) {
            Stack *next = s->next;
            size_t b = s->hash & (n - 1);
            s->next = buckets[b];
            buckets[b] = s;
            s = next;
        }
    }
    free(stack_buckets);
    stack_buckets = buckets;
    stack_nbuckets = n;
    return 0;
}

/* With the GIL: the stack's record, made (holding its code objects) if new. */
static Stack *
intern_stack(const Frame *frames, int n)
{
    uint64_t h = stack_hash(frames, n);
    if (stack_nbuckets != 0) {
        for (Stack *s = stack_buckets[h & (stack_nbuckets - 1)]; s != NULL; s = s->next)
            if (s->hash == h && s->depth == (uint32_t)n &&
                memcmp(s->frames, frames, (size_t)n * sizeof(Frame)) == 0)
                return s;
    }
    size_t size = sizeof(Stack) + (size_t)n * sizeof(Frame);
    if (stack_count >= MAX_STACKS || stack_bytes + size > MAX_STACK_BYTES)
        return NULL;
    if (stack_count >= stack_nbuckets && stacks_grow() < 0 && stack_nbuckets == 0)
        return NULL;
    Stack *s = malloc(size);
    if (s == NULL)
        return NULL;
    s->hash = h;
    s->last_epoch = epoch;
    atomic_store_explicit(&s->live_refs, 0, memory_order_relaxed);
    s->depth = (uint32_t)n;
    s->built = NULL;
    memcpy(s->frames, frames, (size_t)n * sizeof(Frame));
    /* The frames are the running thread's own: their code objects are alive right now. */
    for (int i = 0; i < n; i++)
        Py_INCREF((PyObject *)(uintptr_t)frames[i].code);
    size_t b = h & (stack_nbuckets - 1);
    s->next = stack_buckets[b];
    stack_buckets[b] = s;
    stack_count++;
    stack_bytes += size;
    return s;
}

/* Unlinks the stacks that `keep` rejects into a list; with the GIL, no Python call. */
static Stack *
stacks_unlink(int all, uint64_t before_epoch)
{
    Stack *released = NULL;
    for (size_t i = 0; i < stack_nbuckets; i++) {
        Stack **link = &stack_buckets[i];
        while (*link != NULL) {
            Stack *s = *link;
            int release =
                all || (s->last_epoch < before_epoch &&
                        atomic_load_explicit(&s->live_refs, memory_order_relaxed) == 0);
            if (release) {
                *link = s->next;
                s->next = released;
                released = s;
                stack_count--;
                stack_bytes -= sizeof(Stack) + (size_t)s->depth * sizeof(Frame);
            } else {
                link = &s->next;
            }
        }
    }
    return released;
}

/* With the GIL, tables consistent: dropping a code object may run Python (a weakref
 * callback), which may allocate and sample. */
static void
stacks_release(Stack *list)
{
    while (list != NULL) {
        Stack *next = list->next;
        Py_CLEAR(list->built);
        for (uint32_t i = 0; i < list->depth; i++)
            Py_DECREF((PyObject *)(uintptr_t)list->frames[i].code);
        free(list);
        list = next;
    }
}

/* ---------------------------------------------------------------- window */

static size_t
window_hash(const Stack *s, const uint64_t *labels)
{
    uint64_t h = (uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < HOTSPAN_LABEL_WORDS; i++)
        h = (h ^ labels[i]) * 0x100000001b3ull;
    return (size_t)(h ^ (h >> 31));
}

static WindowSlot *
window_slot(Window *w, Stack *s, const uint64_t *labels)
{
    if (w->count + 1 > w->cap / 2) {
        if (w->count >= MAX_WINDOW_KEYS)
            goto lookup_only;
        size_t cap = w->cap ? w->cap * 2 : 256;
        WindowSlot *slots = calloc(cap, sizeof(WindowSlot));
        if (slots == NULL)
            goto lookup_only;
        for (size_t i = 0; i < w->cap; i++) {
            if (w->slots[i].stack == NULL)
                continue;
            size_t j = window_hash(w->slots[i].stack, w->slots[i].labels) & (cap - 1);
            while (slots[j].stack != NULL)
                j = (j + 1) & (cap - 1);
            slots[j] = w->slots[i];
        }
        free(w->slots);
        w->slots = slots;
        w->cap = cap;
    }
    size_t mask = w->cap - 1;
    for (size_t i = window_hash(s, labels) & mask;; i = (i + 1) & mask) {
        WindowSlot *slot = &w->slots[i];
        if (slot->stack == NULL) {
            slot->stack = s;
            memcpy(slot->labels, labels, sizeof(slot->labels));
            w->count++;
            return slot;
        }
        if (slot->stack == s && memcmp(slot->labels, labels, sizeof(slot->labels)) == 0)
            return slot;
    }
lookup_only:
    if (w->cap == 0)
        return NULL;
    for (size_t i = window_hash(s, labels) & (w->cap - 1);; i = (i + 1) & (w->cap - 1)) {
        WindowSlot *slot = &w->slots[i];
        if (slot->stack == NULL)
            return NULL;
        if (slot->stack == s && memcmp(slot->labels, labels, sizeof(slot->labels)) == 0)
            return slot;
    }
}

static void
window_free(Window *w)
{
    free(w->slots);
    w->slots = NULL;
    w->cap = 0;
    w->count = 0;
}

/* ---------------------------------------------------------------- sampling */

static inline uint64_t
rng_next(void)
{
    uint64_t x = tls_rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    tls_rng = x;
    return x * 0x2545F4914F6CDD1Dull;
}

/* Bytes to the next sample: exponential with mean `mean`. */
static int64_t
draw_interval(int64_t mean)
{
    double u = (double)((rng_next() >> 11) + 1) * (1.0 / 9007199254740992.0); /* (0, 1] */
    double bytes = -ln(u) * (double)mean;
    if (bytes < 1.0)
        bytes = 1.0;
    if (bytes > (double)mean * 64.0)
        bytes = (double)mean * 64.0;
    return (int64_t)bytes;
}

/* The thread holds the GIL; tls_busy is set. */
static void
take_sample(PyThreadState *ts, uintptr_t ptr, size_t size, int64_t mean)
{
    int n = api->walk_frames(ts, frame_buf, max_depth);
    if (n <= 0) {
        n_no_stack++;
        return;
    }
    uint64_t labels[HOTSPAN_LABEL_WORDS];
    api->read_labels(ts, labels);
    Stack *stack = intern_stack(frame_buf, n);
    if (stack == NULL) {
        n_dropped_stacks++;
        return;
    }
    n_samples++;
    stack->last_epoch = epoch;
    /* The sample stands for 1/p allocations of its size, p its chance of being sampled. */
    double weight = 1.0 / one_minus_exp_neg((double)size / (double)mean);
    WindowSlot *slot = window_slot(&window, stack, labels);
    if (slot != NULL) {
        slot->values[0] += weight;
        slot->values[1] += weight * (double)size;
    } else {
        n_dropped_window++;
    }
    live_add(ptr, stack, size, labels);
    /* The span's own estimate (hotspan.alloc_bytes), counted even when the window is full. */
    if (labels[0] != 0)
        api->charge_alloc(ts, (uint64_t)(weight * (double)size));
}

/* This thread's random stream, seeded on its first sample of each start(). */
static void
arm_thread(uint32_t gen)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t x = ((uint64_t)(uintptr_t)&tls_countdown) ^ ((uint64_t)now.tv_sec << 32) ^
                 (uint64_t)now.tv_nsec ^ ((uint64_t)getpid() << 40) ^ ((uint64_t)gen << 20);
    /* splitmix64's finalizer: nearby seeds (threads, processes started together) give
     * unrelated streams. */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    tls_rng = x ? x : 1;
    tls_generation = gen;
}

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
    take_sample(ts, (uintptr_t)ptr, size, mean);
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

/* MEM/OBJ, with the GIL: the countdown ran out on this request of `size` bytes (nelem x size
 * for calloc).  Makes the allocation and, when it is sampled, records it. */
static NOINLINE void *
gil_countdown_expired(int d, int kind, void *ctx, void *ptr, size_t nelem, size_t size)
{
    size_t total = kind == K_CALLOC ? nelem * size : size;
    int64_t mean = atomic_load_explicit(&sample_bytes, memory_order_relaxed);
    if (!atomic_load_explicit(&sampling, memory_order_acquire)) {
        hot.countdown = INERT_RECHECK_BYTES;
        return call_uncounted(d, kind, ctx, ptr, nelem, size);
    }
    uint32_t gen = atomic_load_explicit(&generation, memory_order_relaxed);
    if (UNLIKELY(tls_generation != gen))
        arm_thread(gen);
    hot.countdown = draw_interval(mean);
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
        hot.countdown = 0; /* the allocation failed: the next one is the sample */
        return NULL;
    }
    tls_busy = 1;
    take_sample(ts, at, total, mean);
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

/* MEM and OBJ: only with the GIL.  pymalloc hands requests over 512 bytes to the RAW domain;
 * start() finds out above which size a domain does that (forward_above), and these hooks
 * leave those sizes to the RAW hook: counted once, and the common small request pays a
 * compare, a subtraction and the jump on. */
#define DEFINE_HOOKS(D)                                                                        \
    static HOT void *hook_malloc_##D(void *ctx, size_t size)                                  \
    {                                                                                          \
        if (size <= forward_above[D]) {                                                        \
            int64_t left = hot.countdown - (int64_t)size;                                      \
            hot.countdown = left;                                                              \
            if (UNLIKELY(left < 0))                                                            \
                return gil_countdown_expired(D, K_MALLOC, ctx, NULL, 0, size);                 \
        }                                                                                      \
        return orig(D).malloc(ctx, size);                                                      \
    }                                                                                          \
    static HOT void *hook_calloc_##D(void *ctx, size_t nelem, size_t elsize)                  \
    {                                                                                          \
        size_t size = nelem * elsize;                                                          \
        if (size <= forward_above[D]) {                                                        \
            int64_t left = hot.countdown - (int64_t)size;                                      \
            hot.countdown = left;                                                              \
            if (UNLIKELY(left < 0))                                                            \
                return gil_countdown_expired(D, K_CALLOC, ctx, NULL, nelem, elsize);           \
        }                                                                                      \
        return orig(D).calloc(ctx, nelem, elsize);                                             \
    }                                                                                          \
    static HOT void *hook_realloc_##D(void *ctx, void *ptr, size_t size)                      \
    {                                                                                          \
        if (ptr != NULL)                                                                       \
            forget((char *)ptr - raw_offset[D]);                                               \
        if (size > forward_above[D])                                                           \
            return orig(D).realloc(ctx, ptr, size);                                            \
        int64_t left = hot.countdown - (int64_t)size;                                          \
        hot.countdown = left;                                                                  \
        if (UNLIKELY(left < 0))                                                                \
            return gil_countdown_expired(D, K_REALLOC, ctx, ptr, 0, size);                     \
        /* Counted here: a block pymalloc does not own goes on to the RAW realloc. */          \
        return call_uncounted(D, K_REALLOC, ctx, ptr, 0, size);                                \
    }                                                                                          \
    static NOINLINE void free_slow_##D(void *ctx, void *ptr)                                  \
    {                                                                                          \
        forget_slow((uintptr_t)ptr);                                                           \
        orig(D).free(ctx, ptr);                                                                \
    }                                                                                          \
    static HOT void hook_free_##D(void *ctx, void *ptr)                                       \
    {                                                                                          \
        const Filter *f = atomic_load_explicit(&live_filter, memory_order_acquire);            \
        if (UNLIKELY(filter_has(f, (uintptr_t)ptr)))                                           \
            free_slow_##D(ctx, ptr);                                                           \
        else                                                                                   \
            orig(D).free(ctx, ptr);                                                            \
    }

DEFINE_HOOKS(1)
DEFINE_HOOKS(2)

static const PyMemAllocatorDomain domains[N_DOMAINS] = {PYMEM_DOMAIN_RAW, PYMEM_DOMAIN_MEM,
                                                        PYMEM_DOMAIN_OBJ};

static PyMemAllocatorEx
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

static int
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
static int
reaches_raw(int d, size_t size)
{
    const int64_t full = INT64_MAX / 2;
    int64_t saved = tls_countdown;
    tls_countdown = full;
    void *p = orig(d).malloc(orig(d).ctx, size);
    int64_t used = full - tls_countdown;
    if (p != NULL)
        orig(d).free(orig(d).ctx, p);
    tls_countdown = saved;
    return p != NULL && used >= (int64_t)size;
}

/* The size above which domain d passes requests to RAW (SIZE_MAX: it never does). */
static size_t
find_forwarding(int d)
{
    const size_t top = (size_t)1 << 20;
    if (!reaches_raw(d, top))
        return SIZE_MAX;
    size_t lo = 0, hi = top; /* hi reaches RAW; lo does not */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (reaches_raw(d, mid))
            hi = mid;
        else
            lo = mid;
    }
    const size_t above[] = {hi, hi + 1, hi + 4096, 2 * hi, top / 2};
    const size_t below[] = {1, hi / 2, hi - 1};
    int consistent = 1;
    for (size_t i = 0; i < sizeof(above) / sizeof(above[0]); i++)
        consistent = consistent && reaches_raw(d, above[i]);
    for (size_t i = 0; i < sizeof(below) / sizeof(below[0]); i++)
        consistent = consistent && (below[i] == 0 || below[i] >= hi || !reaches_raw(d, below[i]));
    if (!consistent) {
        /* Counted at both levels where they overlap: an overestimate, not a loss. */
        forwarding_unclear = 1;
        return SIZE_MAX;
    }
    return hi - 1;
}

/* Whether domain d (which forwards above forward_above[d]) frees such a block with the RAW
 * free, at the address the RAW malloc gave: then its sampled small requests can be made
 * big ones (see `redirect`).  Sets raw_offset[d]. */
static int
probe_redirect(int d)
{
    if (forward_above[d] == SIZE_MAX)
        return 0;
    int64_t saved = tls_countdown;
    tls_probe = 1;
    tls_probe_ptr = 0;
    tls_countdown = 0; /* the RAW hook's next allocation calls countdown_expired */
    void *q = orig(d).malloc(orig(d).ctx, forward_above[d] + 1);
    uintptr_t raw = tls_probe_ptr;
    tls_probe = 0;
    tls_countdown = saved;
    if (q == NULL)
        return 0;
    pthread_mutex_lock(&live_mutex);
    Filter *f = atomic_load_explicit(&live_filter, memory_order_relaxed);
    if (raw != 0)
        filter_add(f, raw); /* so that the RAW free of it takes the slow path */
    pthread_mutex_unlock(&live_mutex);
    tls_probe = 2;
    tls_probe_ptr = raw;
    tls_probe_seen = 0;
    orig(d).free(orig(d).ctx, q);
    int seen = tls_probe_seen;
    tls_probe = 0;
    pthread_mutex_lock(&live_mutex);
    if (raw != 0)
        filter_remove(atomic_load_explicit(&live_filter, memory_order_relaxed), raw);
    pthread_mutex_unlock(&live_mutex);
    raw_offset[d] = (intptr_t)((uintptr_t)q - raw);
    return raw != 0 && seen;
}

/* ---------------------------------------------------------------- module functions */

static int
import_api(void)
{
    if (api != NULL)
        return 0;
    /* PyCapsule_Import finds attributes, it does not import submodules. */
    PyObject *sampler = PyImport_ImportModule("hotspan._speedups._sampler");
    if (sampler == NULL)
        return -1;
    Py_DECREF(sampler);
    const HotspanSamplerAPI *found = PyCapsule_Import(HOTSPAN_SAMPLER_API_CAPSULE, 0);
    if (found == NULL)
        return -1;
    if (found->version != HOTSPAN_SAMPLER_API_VERSION) {
        PyErr_SetString(PyExc_RuntimeError, "hotspan._speedups._sampler: unknown API version");
        return -1;
    }
    api = found;
    return 0;
}

static PyObject *
alloc_ready(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    if (import_api() < 0) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

/* Drops every sample and stack (with the GIL). */
static void
drop_everything(int keep_tracking)
{
    live_clear(keep_tracking);
    window_free(&window);
    epoch++; /* every stack is now unused since an older window */
    if (collecting)
        release_pending = 1; /* its rows point at stacks: it releases them when done */
    else
        stacks_release(stacks_unlink(1, 0));
}

static PyObject *
alloc_start(PyObject *mod UNUSED, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sample_bytes", "max_depth", NULL};
    long long bytes = 512 * 1024;
    int depth = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|Li", kwlist, &bytes, &depth))
        return NULL;
    if (bytes < 1 || depth < 1 || depth > 4096) {
        PyErr_SetString(PyExc_ValueError, "sample_bytes >= 1, 1 <= max_depth <= 4096");
        return NULL;
    }
    if (import_api() < 0)
        return NULL;
    if (atomic_load(&sampling)) {
        PyErr_SetString(PyExc_RuntimeError, "already started");
        return NULL;
    }
    Frame *buf = malloc((size_t)depth * sizeof(Frame));
    if (buf == NULL)
        return PyErr_NoMemory();
    free(frame_buf);
    frame_buf = buf;
    max_depth = depth;
    drop_everything(1);
    atomic_store(&sample_bytes, (int64_t)bytes);
    uint32_t gen = atomic_fetch_add(&generation, 1) + 1;
    hot.countdown = INT64_MAX / 2; /* no MEM/OBJ sample while probing */
    int installed[N_DOMAINS] = {0};
    for (int d = 0; d < N_DOMAINS; d++) {
        if (hooked[d])
            continue; /* inert since a stop() that could not unhook: sampling resumes */
        PyMem_GetAllocator(domains[d], &orig(d));
        redirect[d] = 0;
        raw_offset[d] = 0;
        PyMemAllocatorEx ours = our_allocator(d);
        PyMem_SetAllocator(domains[d], &ours);
        hooked[d] = installed[d] = 1;
    }
    forwarding_unclear = 0;
    for (int d = 1; d < N_DOMAINS; d++) {
        forward_above[d] = SIZE_MAX; /* while probing: the hook counts everything */
        forward_above[d] = find_forwarding(d);
    }
    for (int d = 1; d < N_DOMAINS; d++) {
        if (!installed[d] || !probe_redirect(d)) {
            if (installed[d])
                raw_offset[d] = 0;
            continue;
        }
        /* That domain's free goes straight to its allocator: nothing it frees is ours. */
        redirect[d] = 1;
        PyMemAllocatorEx ours = our_allocator(d);
        PyMem_SetAllocator(domains[d], &ours);
    }
    arm_thread(gen);
    hot.countdown = draw_interval((int64_t)bytes);
    atomic_store_explicit(&sampling, 1, memory_order_release);
    api->set_alloc_sampling(1);
    Py_RETURN_NONE;
}

static PyObject *
alloc_stop(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    atomic_store_explicit(&sampling, 0, memory_order_release);
    if (api != NULL)
        api->set_alloc_sampling(0);
    int inert = 0;
    for (int d = 0; d < N_DOMAINS; d++) {
        if (!hooked[d])
            continue;
        if (is_ours(d)) {
            PyMem_SetAllocator(domains[d], &orig(d));
            hooked[d] = 0;
            redirect[d] = 0;
            raw_offset[d] = 0;
        } else {
            /* Someone chained on top of us: restoring what was there before us would cut
             * them out.  Stay in the chain, forwarding only. */
            inert++;
        }
    }
    drop_everything(0);
    return PyLong_FromLong(inert);
}

typedef struct {
    Stack *stack;
    uint64_t labels[HOTSPAN_LABEL_WORDS];
    double values[4];
} Row;

static PyObject *
build_stack(Stack *s)
{
    if (s->built != NULL)
        return Py_NewRef(s->built);
    PyObject *tuple = PyTuple_New(s->depth);
    if (tuple == NULL)
        return NULL;
    for (uint32_t i = 0; i < s->depth; i++) {
        PyObject *pair = Py_BuildValue("(OI)", (PyObject *)(uintptr_t)s->frames[i].code,
                                       (unsigned int)s->frames[i].lasti);
        if (pair == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, i, pair);
    }
    s->built = Py_NewRef(tuple);
    return tuple;
}

static PyObject *
alloc_collect(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    PyObject *out = PyList_New(0);
    if (out == NULL || collecting)
        return out;
    collecting = 1;
    int was_busy = tls_busy;
    tls_busy = 1; /* our own allocations here are not the program's */

    /* Until the rows are copied out, no Python call: nothing may sample meanwhile. */
    Window taken = window;
    memset(&window, 0, sizeof(window));
    uint64_t closing = epoch++;
    size_t dropped_inuse = 0;
    pthread_mutex_lock(&live_mutex);
    for (size_t i = 0; i < live_cap; i++) {
        LiveSlot *live = &live_slots[i];
        if (live->ptr == 0)
            continue;
        WindowSlot *slot = window_slot(&taken, live->stack, live->labels);
        if (slot == NULL) {
            dropped_inuse++;
            continue;
        }
        double weight = 1.0 / one_minus_exp_neg((double)live->size / (double)sample_bytes);
        slot->values[2] += weight;
        slot->values[3] += weight * (double)live->size;
        live->stack->last_epoch = closing; /* in `taken`: kept until it is built */
    }
    Filter *f = atomic_load_explicit(&live_filter, memory_order_relaxed);
    if (filter_bits_for(live_count * 4) < 64 - f->shift) /* far too big for what lives now */
        filter_rebuild(filter_bits_for(live_count));
    pthread_mutex_unlock(&live_mutex);
    n_dropped_window += dropped_inuse;
    Stack *released = stacks_unlink(0, closing);

    Row *rows = taken.count ? malloc(taken.count * sizeof(Row)) : NULL;
    size_t n_rows = 0;
    if (rows != NULL) {
        for (size_t i = 0; i < taken.cap; i++) {
            WindowSlot *slot = &taken.slots[i];
            if (slot->stack == NULL)
                continue;
            rows[n_rows].stack = slot->stack;
            memcpy(rows[n_rows].labels, slot->labels, sizeof(slot->labels));
            memcpy(rows[n_rows].values, slot->values, sizeof(slot->values));
            n_rows++;
        }
    } else if (taken.count) {
        n_dropped_window += taken.count;
    }
    window_free(&taken);

    /* The rows' stacks stay in the table (last used in `closing`) until the next collect,
     * the only place that releases them. */
    int failed = 0;
    for (size_t i = 0; i < n_rows && !failed; i++) {
        Row *r = &rows[i];
        PyObject *stack = build_stack(r->stack);
        PyObject *row = stack == NULL
                            ? NULL
                            : Py_BuildValue("(N(KKKKK)LLLL)", stack,
                                            (unsigned long long)r->labels[0],
                                            (unsigned long long)r->labels[1],
                                            (unsigned long long)r->labels[2],
                                            (unsigned long long)r->labels[3],
                                            (unsigned long long)r->labels[4],
                                            (long long)(r->values[0] + 0.5),
                                            (long long)(r->values[1] + 0.5),
                                            (long long)(r->values[2] + 0.5),
                                            (long long)(r->values[3] + 0.5));
        if (row == NULL || PyList_Append(out, row) < 0)
            failed = 1;
        Py_XDECREF(row);
    }
    for (size_t i = 0; i < n_rows; i++)
        Py_CLEAR(rows[i].stack->built);
    free(rows);
    stacks_release(released);
    if (release_pending) {
        release_pending = 0;
        stacks_release(stacks_unlink(0, epoch));
    }
    tls_busy = was_busy;
    collecting = 0;
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *
alloc_after_fork(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    /* A collect on a parent thread is not coming back (the mutex: see fork_prepare). */
    collecting = 0;
    release_pending = 0;
    tls_busy = 0;
    int keep = atomic_load(&sampling);
    drop_everything(keep);
    atomic_fetch_add(&generation, 1);
    Py_RETURN_NONE;
}

static PyObject *
alloc_stats(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    pthread_mutex_lock(&live_mutex);
    unsigned long long live = live_count, checks = n_free_checks, freed = n_live_freed,
                       live_dropped = n_dropped_live;
    pthread_mutex_unlock(&live_mutex);
    int hooked_n = 0, inert_n = 0;
    for (int d = 0; d < N_DOMAINS; d++) {
        hooked_n += hooked[d];
        inert_n += hooked[d] && !atomic_load(&sampling);
    }
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsnsisisnsisisisK}", "samples", (unsigned long long)n_samples, "no_stack",
        (unsigned long long)n_no_stack, "dropped_stacks", (unsigned long long)n_dropped_stacks,
        "dropped_window", (unsigned long long)n_dropped_window, "dropped_live", live_dropped,
        "no_gil", (unsigned long long)atomic_load(&n_no_gil), "live", live, "free_checks",
        checks, "live_freed", freed, "stacks", (Py_ssize_t)stack_count, "hooked_domains",
        hooked_n, "inert_domains", inert_n, "obj_forwards_above",
        forward_above[2] == SIZE_MAX ? (Py_ssize_t)-1 : (Py_ssize_t)forward_above[2],
        "forwarding_unclear", forwarding_unclear, "redirected_domains", redirect[1] + redirect[2],
        "filter_bits",
        64 - (int)atomic_load(&live_filter)->shift, "filter_rebuilds",
        (unsigned long long)n_filter_rebuilds);
}

static PyObject *
alloc_exclude_thread(PyObject *mod UNUSED, PyObject *unused UNUSED)
{
    /* The agent's own threads (encoding, uploading) allocate for the agent, not the program:
     * their allocations are never sampled.  collect() saves and restores the flag. */
    tls_busy = 1;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"exclude_thread", alloc_exclude_thread, METH_NOARGS,
     "exclude_thread(): never sample the allocations of the calling thread"},
    {"ready", alloc_ready, METH_NOARGS,
     "ready() -> bool: whether _sampler's stack and label readers can be had"},
    {"start", (PyCFunction)(void (*)(void))alloc_start, METH_VARARGS | METH_KEYWORDS,
     "start(sample_bytes=524288, max_depth=64): hook the allocators and sample"},
    {"stop", alloc_stop, METH_NOARGS,
     "stop() -> int: unhook and drop all samples; returns how many domains stay hooked "
     "(inert, forwarding only) because another hook was installed on top of ours"},
    {"collect", alloc_collect, METH_NOARGS,
     "collect() -> [(stack, labels, alloc_objects, alloc_space, inuse_objects, inuse_space)]: "
     "allocations since the last call and the sampled ones alive now, per stack and labels"},
    {"after_fork", alloc_after_fork, METH_NOARGS, "in a forked child: drop the parent's samples"},
    {"stats", alloc_stats, METH_NOARGS, "stats() -> dict of counts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_alloc", "hotspan's allocation sampler (see alloc.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* A thread without the GIL may hold live_mutex (a RAW free) as another forks: the child's
 * first free that reaches the table would wait for it forever, before Python (and our
 * after_fork) runs there.  So no fork happens while it is held. */
static void
fork_prepare(void)
{
    pthread_mutex_lock(&live_mutex);
}

static void
fork_parent(void)
{
    pthread_mutex_unlock(&live_mutex);
}

static void
fork_child(void)
{
    pthread_mutex_unlock(&live_mutex);
}

PyMODINIT_FUNC
PyInit__alloc(void)
{
    static int atfork_registered;
    if (!atfork_registered && pthread_atfork(fork_prepare, fork_parent, fork_child) == 0)
        atfork_registered = 1;
    if (atomic_load(&live_filter) == NULL) { /* not again for a second interpreter */
        filters[0].shift = filters[1].shift = 64 - FILTER_MIN_BITS;
        atomic_store(&live_filter, &filters[0]);
    }
    return PyModule_Create(&module);
}
