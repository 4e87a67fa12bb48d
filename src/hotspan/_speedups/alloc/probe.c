/* start()'s probes of the allocator chain: above which size a domain passes requests on to
 * the RAW domain (forward_above), and whether its blocks come back through the RAW free
 * (redirect).  Apart because they run once per start, and only there. */
#include "internal.h"

int forwarding_unclear; /* a domain forwards, but not simply above some size */

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
size_t
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
        consistent =
            consistent && (below[i] == 0 || below[i] >= hi || !reaches_raw(d, below[i]));
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
int
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
