/* Upload windows: what was sampled during one upload interval, aggregated in plain C memory
 * (stacks interned by content, samples summed by kind, thread, labels and stack), bounded by
 * MAX_WINDOW_BYTES.  Apart because the collector fills them without Python and Python reads
 * them with the GIL (codes.c); this file is only the data structure. */
#include "internal.h"

Window *current;          /* being filled, under threads_mutex */
Window *done_head, *done_tail;
int n_done;
size_t window_bytes;      /* all windows together, bounded by MAX_WINDOW_BYTES */
_Atomic uint64_t windows_dropped;
uint64_t window_ns;       /* upload interval */
uint64_t window_deadline; /* monotonic */

Window *
window_new(void)
{
    Window *w = calloc(1, sizeof *w);
    if (w != NULL)
        w->start_ns = realtime_ns();
    return w;
}

void
window_free(Window *w)
{
    if (w == NULL)
        return;
    window_bytes -= w->bytes;
    free(w->frames);
    free(w->stacks);
    free(w->stack_index);
    free(w->samples);
    free(w->sample_index);
    free(w);
}

/* Grows *array to hold `need` items; counts the bytes against the windows' bound. */
static int
grow(Window *w, void **array, size_t *cap, size_t need, size_t item, int zero)
{
    if (need <= *cap)
        return 0;
    size_t new_cap = *cap ? *cap * 2 : 64;
    while (new_cap < need)
        new_cap *= 2;
    size_t added = (new_cap - *cap) * item;
    if (window_bytes + added > MAX_WINDOW_BYTES)
        return -1;
    void *p = realloc(*array, new_cap * item);
    if (p == NULL)
        return -1;
    if (zero)
        memset((char *)p + *cap * item, 0, added);
    *array = p;
    *cap = new_cap;
    w->bytes += added;
    window_bytes += added;
    return 0;
}

static int
rehash(Window *w, uint32_t **index, size_t *size, size_t count, int stacks)
{
    size_t new_size = *size ? *size * 2 : 256;
    size_t bytes = new_size * sizeof(uint32_t);
    if (window_bytes + bytes > MAX_WINDOW_BYTES)
        return -1;
    uint32_t *fresh = calloc(new_size, sizeof(uint32_t));
    if (fresh == NULL)
        return -1;
    for (size_t n = 0; n < count; n++) {
        uint64_t h;
        if (stacks) {
            h = w->stacks[n].hash;
        } else {
            const SampleRec *r = &w->samples[n];
            h = mix64(r->ident ^ mix64(r->stack + ((uint64_t)r->kind << 32)) ^
                      mix64(r->labels[0]) ^ mix64(r->labels[4] + r->labels[2]));
        }
        size_t i = h & (new_size - 1);
        while (fresh[i] != 0)
            i = (i + 1) & (new_size - 1);
        fresh[i] = (uint32_t)n + 1;
    }
    window_bytes -= *size * sizeof(uint32_t);
    w->bytes -= *size * sizeof(uint32_t);
    free(*index);
    *index = fresh;
    *size = new_size;
    window_bytes += bytes;
    w->bytes += bytes;
    return 0;
}

static inline uint64_t
sample_hash(uint64_t ident, uint32_t stack, uint32_t kind, const uint64_t *labels)
{
    return mix64(ident ^ mix64(stack + ((uint64_t)kind << 32)) ^ mix64(labels[0]) ^
                 mix64(labels[4] + labels[2]));
}

/* The number of this stack in w, interned; -1 when the window is at its bound. */
static int64_t
intern_stack(Window *w, const RawFrame *frames, int depth)
{
    uint64_t h = 0x9e3779b97f4a7c15ull + (uint64_t)depth;
    for (int i = 0; i < depth; i++)
        h = mix64(h ^ frames[i].code ^ ((uint64_t)frames[i].lasti << 40) ^
                  frames[i].fingerprint);
    if (w->n_stacks + 1 > w->stack_index_size / 2 &&
        rehash(w, &w->stack_index, &w->stack_index_size, w->n_stacks, 1) < 0)
        return -1;
    size_t mask = w->stack_index_size - 1;
    size_t i = h & mask;
    for (; w->stack_index[i] != 0; i = (i + 1) & mask) {
        const StackRec *s = &w->stacks[w->stack_index[i] - 1];
        if (s->hash == h && s->depth == (uint32_t)depth &&
            memcmp(&w->frames[s->first], frames, (size_t)depth * sizeof(RawFrame)) == 0)
            return w->stack_index[i] - 1;
    }
    if (grow(w, (void **)&w->frames, &w->cap_frames, w->n_frames + (size_t)depth,
             sizeof(RawFrame), 0) < 0 ||
        grow(w, (void **)&w->stacks, &w->cap_stacks, w->n_stacks + 1, sizeof(StackRec), 0) < 0)
        return -1;
    memcpy(&w->frames[w->n_frames], frames, (size_t)depth * sizeof(RawFrame));
    StackRec *s = &w->stacks[w->n_stacks];
    s->hash = h;
    s->first = (uint32_t)w->n_frames;
    s->depth = (uint32_t)depth;
    w->n_frames += (size_t)depth;
    w->stack_index[i] = (uint32_t)++w->n_stacks;
    return (int64_t)w->n_stacks - 1;
}

static int
window_add(Window *w, uint32_t kind, uint64_t ident, const uint64_t *labels,
           const RawFrame *frames, int depth, uint64_t value)
{
    int64_t stack = intern_stack(w, frames, depth);
    if (stack < 0)
        return -1;
    if (w->n_samples + 1 > w->sample_index_size / 2 &&
        rehash(w, &w->sample_index, &w->sample_index_size, w->n_samples, 0) < 0)
        return -1;
    uint64_t h = sample_hash(ident, (uint32_t)stack, kind, labels);
    size_t mask = w->sample_index_size - 1;
    size_t i = h & mask;
    for (; w->sample_index[i] != 0; i = (i + 1) & mask) {
        SampleRec *r = &w->samples[w->sample_index[i] - 1];
        if (r->stack == (uint32_t)stack && r->kind == kind && r->ident == ident &&
            memcmp(r->labels, labels, sizeof r->labels) == 0) {
            r->value += value;
            return 0;
        }
    }
    if (grow(w, (void **)&w->samples, &w->cap_samples, w->n_samples + 1, sizeof(SampleRec), 0) <
        0)
        return -1;
    SampleRec *r = &w->samples[w->n_samples];
    r->ident = ident;
    memcpy(r->labels, labels, sizeof r->labels);
    r->value = value;
    r->stack = (uint32_t)stack;
    r->kind = kind;
    w->sample_index[i] = (uint32_t)++w->n_samples;
    return 0;
}

void
add_or_count(uint32_t kind, uint64_t ident, const uint64_t *labels, const RawFrame *frames,
             int depth, uint64_t value)
{
    if (current == NULL || window_add(current, kind, ident, labels, frames, depth, value) < 0)
        atomic_fetch_add(&lost_samples, 1);
}

/* Under threads_mutex: the window being filled becomes a finished one. */
void
finish_window(void)
{
    Window *fresh = window_new();
    if (fresh == NULL)
        return; /* keep filling the old one */
    Window *w = current;
    w->end_ns = fresh->start_ns;
    current = fresh;
    if (done_tail != NULL)
        done_tail->next = w;
    else
        done_head = w;
    done_tail = w;
    n_done++;
    /* Python has not come for them (it is starved, or the server is away and the uploader
     * full): the oldest go, counted. */
    while (n_done > MAX_DONE_WINDOWS) {
        Window *old = done_head;
        done_head = old->next;
        if (done_head == NULL)
            done_tail = NULL;
        n_done--;
        window_free(old);
        atomic_fetch_add(&windows_dropped, 1);
    }
}
