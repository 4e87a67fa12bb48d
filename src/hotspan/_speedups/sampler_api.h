/* What the native sampler (_sampler) lends the other native collectors (allocations, locks):
 * the running thread's Python stack and span/tag labels, read without calling Python and
 * without allocating, so that an allocator hook or a lock wrapper can take a sample without
 * re-entering itself.  Exported as a capsule, the CPython way for one extension module to call
 * another (as datetime's C API does):
 *
 *     const HotspanSamplerAPI *api = PyCapsule_Import(HOTSPAN_SAMPLER_API_CAPSULE, 0);
 */
#ifndef HOTSPAN_SAMPLER_API_H
#define HOTSPAN_SAMPLER_API_H

#include <Python.h>
#include <stdint.h>

#define HOTSPAN_SAMPLER_API_CAPSULE "hotspan._speedups._sampler._C_API"
#define HOTSPAN_SAMPLER_API_VERSION 2

/* One frame: the code object's address (0: not resolvable), the instruction offset in bytes,
 * and a fingerprint that tells a freed code object's successor at the same address apart. */
typedef struct {
    uint64_t code;
    uint32_t lasti;
    uint32_t fingerprint;
} HotspanRawFrame;

/* Span id, trace id (high, low), local root span id, tag set: the agent's Labels. */
#define HOTSPAN_LABEL_WORDS 5

typedef struct {
    int version;
    /* Frames of `ts`, leaf first; returns how many were written (at most max_depth). */
    int (*walk_frames)(PyThreadState *ts, HotspanRawFrame *out, int max_depth);
    /* The labels of `ts`'s current context into out (zeros where there are none); marks
     * them as sampled, so that their span gets its pyroscope.profile.id attribute. */
    void (*read_labels)(PyThreadState *ts, uint64_t out[HOTSPAN_LABEL_WORDS]);
    /* Span stats: `bytes` (an allocation sample's estimate) added to the alloc_bytes of
     * `ts`'s current labels, the figure its span gets as hotspan.alloc_bytes. */
    void (*charge_alloc)(PyThreadState *ts, uint64_t bytes);
    /* Whether an allocation sampler is running (1) or not (0): spans get hotspan.alloc_bytes
     * only while one is. */
    void (*set_alloc_sampling)(int on);
} HotspanSamplerAPI;

#endif
