/* Taking a sample: the exponential countdown draw (and the log and exp it needs), reading the
 * allocating thread's stack and labels through _sampler's capsule API, and recording the
 * sample in the window, the live table and the span's estimate.  Apart because it is the
 * sampling decision and its arithmetic, reached only when a countdown runs out. */
#include "internal.h"

const HotspanSamplerAPI *api;
int max_depth = 64;
Frame *frame_buf; /* with the GIL (or sample_mutex): one thread samples at a time */
static THREAD_LOCAL uint64_t tls_rng;

/* Counts, for stats(). */
uint64_t n_samples;
uint64_t n_no_stack;
uint64_t n_dropped_stacks;
uint64_t n_dropped_window;

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
        z * (2.0 +
             z2 * (2.0 / 3 + z2 * (2.0 / 5 + z2 * (2.0 / 7 + z2 * (2.0 / 9 + z2 * 2.0 / 11)))));
    return e * 0.6931471805599453 + s;
}

double
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
int64_t
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

/* The thread holds the GIL (free-threaded: is attached, and holds sample_mutex); tls_busy is
 * set. */
void
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
void
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
