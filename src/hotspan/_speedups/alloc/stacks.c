/* Sampled stacks, interned by content, each holding references to its code objects until no
 * window and no live sample uses it.  Apart because it is the only part that owns Python
 * references, released with the GIL once the tables are consistent. */
#include "internal.h"

/* Stacks: with the GIL. */
static Stack **stack_buckets;
static size_t stack_nbuckets; /* power of two */
size_t stack_count;
static size_t stack_bytes;
uint64_t epoch = 1;

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
Stack *
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
Stack *
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
void
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
