/* The live heap: sampled blocks still allocated, in a table keyed by address, and the filter
 * bitmap a free reads to rule out (nearly) every block without the table's mutex.  Apart
 * because it is the only part shared with threads that do not hold the GIL. */
#include "internal.h"

/* In .bss: pages never used are never resident (at the minimum size, 4 + 4 + 32 KiB are). */
Filter filters[2];
uint8_t filter_counts[1u << FILTER_MAX_BITS]; /* 255: stuck until the next rebuild */
uint64_t n_filter_rebuilds;
pthread_mutex_t live_mutex = PTHREAD_MUTEX_INITIALIZER;
LiveSlot *live_slots;
size_t live_cap; /* power of two, or 0 */
size_t live_count;
static int tracking;

/* Counts, for stats(). */
uint64_t n_dropped_live;
uint64_t n_free_checks; /* frees the filter could not rule out (under live_mutex) */
uint64_t n_live_freed;

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
unsigned
filter_bits_for(size_t live)
{
    unsigned bits = FILTER_MIN_BITS;
    while (bits < FILTER_MAX_BITS && ((size_t)1 << bits) < live * 64)
        bits++;
    return bits;
}

/* Under live_mutex: a fresh filter of `bits` for the live samples, then published. */
void
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
void
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

NOINLINE void
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
void
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
