"""What a sampler gives: the records of its samples (:class:`RawSample` rows in :class:`Window`
objects, handed out as :class:`Collected`), and the per-thread CPU clocks they are measured
with.  Shared by :mod:`hotspan.agent.sampler` and the pure-Python sampler in
:mod:`hotspan.agent.sampler_py`, and imported by what reads the samples.
"""

from __future__ import annotations

import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, List, Tuple

    LabelsTuple = Tuple[int, int, int, int, int]  # span, trace hi, trace lo, root span, tag set
    # Leaf first: (code object or None, byte offset), or a frame already named (the pure-Python
    # sampler's, the native sampler's [GC]: symbols.FrameInfo).
    RawStack = Tuple[Tuple[Any, ...], ...]

# What a sample is (the native sampler's KIND_*): CPU, or wall time by the thread's state as it
# was taken (running with the GIL, waiting for it, released, waiting for a core; WALL where the
# sampler cannot tell: the pure-Python one, free-threaded builds), or on a thread
# holding the GIL, the wall time others waited for it (GIL_HELD).
CPU, WALL, WALL_RUNNING, WALL_GIL_WAIT, WALL_RELEASED, GIL_HELD, WALL_CPU_WAIT = range(7)

# Plain classes with __slots__ rather than namedtuples: a namedtuple class brings ~30 objects
# (its methods, their closures, a getter per field) that every full collection of the
# program's cyclic GC walks for as long as the agent is loaded (see agent/log.py).


class RawSample:
    """One row of a window: ``kind`` CPU, one of the wall kinds or GIL_HELD, ``labels`` a
    LabelsTuple, ``stack`` a RawStack, ``value`` nanoseconds."""

    __slots__ = ("kind", "thread_ident", "labels", "stack", "value")

    def __init__(
        self, kind: int, thread_ident: int, labels: LabelsTuple, stack: RawStack, value: int
    ) -> None:
        self.kind = kind
        self.thread_ident = thread_ident
        self.labels = labels
        self.stack = stack
        self.value = value


class Window:
    """The samples of one window, from ``start_ns`` to ``end_ns`` (wall clock)."""

    __slots__ = ("start_ns", "end_ns", "samples")

    def __init__(self, start_ns: int, end_ns: int, samples: List[RawSample]) -> None:
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.samples = samples


class Collected:
    """What a collect gave: the windows finished, ``lost`` samples taken but not kept (ring
    or memory bound full), and ``keepalive``, which holds the code objects of the samples
    until they are named."""

    __slots__ = ("windows", "lost", "keepalive")

    def __init__(self, windows: List[Window], lost: int, keepalive: Any) -> None:
        self.windows = windows
        self.lost = lost
        self.keepalive = keepalive


def kernel_cpu_clock(native_id: int) -> int:
    # Linux's per-thread CPU clock of a kernel thread id (CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED).
    return ((~native_id) << 3) | 6


def _kernel_clocks_usable() -> bool:
    if not sys.platform.startswith("linux") or not hasattr(time, "pthread_getcpuclockid"):
        return False
    try:
        own = time.pthread_getcpuclockid(threading.get_ident())
    except OSError:
        return False
    return own == kernel_cpu_clock(threading.get_native_id())


KERNEL_CLOCKS = _kernel_clocks_usable()
_FREE_THREADED = hasattr(sys, "_is_gil_enabled") and not sys._is_gil_enabled()


def thread_cpu_clock(ident: int) -> Any:
    """The CPU clock of thread ``ident``, or None.  By its kernel id where it has one: a thread
    that has ended then reads as an error (EINVAL), where pthread_getcpuclockid reads the
    ended thread's freed pthread struct.  A thread can end between the listing of threads and
    this call, and on a free-threaded build it often did (the fallback crashed the program in
    9 runs of 15 of tests/test_agent_threads.py's program on 3.13t)."""
    if KERNEL_CLOCKS:
        thread = threading._active.get(ident)  # type: ignore[attr-defined]
        native = getattr(thread, "native_id", None)
        if native is not None:
            return kernel_cpu_clock(native)
        if _FREE_THREADED:
            return None  # a thread threading does not know: nothing holds it alive meanwhile
    return time.pthread_getcpuclockid(ident)
