/* The current window: allocations since the last collect, summed by (stack, labels).  Apart
 * as the one aggregate collect() empties. */
#include "internal.h"

Window window; /* with the GIL */

static size_t
window_hash(const Stack *s, const uint64_t *labels)
{
    uint64_t h = (uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < HOTSPAN_LABEL_WORDS; i++)
        h = (h ^ labels[i]) * 0x100000001b3ull;
    return (size_t)(h ^ (h >> 31));
}

WindowSlot *
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

void
window_free(Window *w)
{
    free(w->slots);
    w->slots = NULL;
    w->cap = 0;
    w->count = 0;
}
