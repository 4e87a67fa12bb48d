/* What a thread is doing as its signal handler interrupts it: whether it holds the GIL, and
 * whether it is running CPython's cyclic garbage collector.  Read from the interpreter's own
 * state, a few loads and no system call, so every sample can afford it.  Apart because it is
 * the one part that needs the interpreter's internal layout (pycore_interp.h), version by
 * version. */
#include "internal.h"

#if !defined(Py_GIL_DISABLED) && PY_VERSION_HEX < 0x030E0000
/* The public headers define _PyGC_FINALIZED as a macro that the internal ones redefine (3.9 to
 * 3.11) or declare as a function (3.12): theirs is the one wanted here. */
#  undef _PyGC_FINALIZED
#  define Py_BUILD_CORE 1
#  include "internal/pycore_interp.h"
#  if PY_VERSION_HEX < 0x030C0000
#    include "internal/pycore_runtime.h"
#  endif
#  undef Py_BUILD_CORE
#  define HAVE_GC_STATE 1

/* Whether `ts` holds the GIL: it was the last to take it, and it is taken.  A thread between
 * dropping it and the next holder's taking it reads as holding it, for a few instructions. */
static int
holds_gil(PyThreadState *ts)
{
#  if PY_VERSION_HEX >= 0x030D0000
    struct _gil_runtime_state *gil = ts->interp->ceval.gil;
    return gil != NULL && __atomic_load_n(&gil->locked, __ATOMIC_RELAXED) &&
           __atomic_load_n(&gil->last_holder, __ATOMIC_RELAXED) == ts;
#  else
#    if PY_VERSION_HEX >= 0x030C0000
    struct _gil_runtime_state *gil = ts->interp->ceval.gil; /* one per interpreter */
    if (gil == NULL)
        return 0;
#    else
    struct _gil_runtime_state *gil = &_PyRuntime.ceval.gil;
#    endif
    return __atomic_load_n(&gil->locked._value, __ATOMIC_RELAXED) &&
           __atomic_load_n(&gil->last_holder._value, __ATOMIC_RELAXED) == (uintptr_t)ts;
#  endif
}
#endif

int
collecting_generation(PyThreadState *ts)
{
#ifdef HAVE_GC_STATE
    struct _gc_runtime_state *gc = &ts->interp->gc;
    /* The collector runs with the GIL: a thread without it is not the one collecting. */
    if (!__atomic_load_n(&gc->collecting, __ATOMIC_RELAXED) || !holds_gil(ts))
        return -1;
    /* A collection of generation g empties the counts of 0..g as it begins and adds one to
     * g + 1's: only a collection of 1 or 2 leaves generation 1's count at 0, and only one of
     * 2 leaves generation 2's at 0 too.  (Generation 0's count grows with what finalizers
     * allocate meanwhile: not read.)  Between the collector's start and the emptying, its
     * "start" callbacks run, read as generation 0 or an earlier generation. */
    if (__atomic_load_n(&gc->generations[1].count, __ATOMIC_RELAXED) != 0)
        return 0;
    return __atomic_load_n(&gc->generations[2].count, __ATOMIC_RELAXED) != 0 ? 1 : 2;
#else
    (void)ts;
    return -1;
#endif
}
