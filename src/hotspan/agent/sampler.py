"""Taking samples: CPU and wall time of every thread, with the labels of its context.

Two implementations with one interface.  :class:`NativeSampler` (C, ``_speedups/sampler/``)
samples from signal handlers on each thread, driven by per-thread CPU timers and a native
thread that never needs the GIL, so a busy program (an event loop, many short system calls)
cannot starve it; it reads span labels per thread and per asyncio task.
:class:`PythonSampler` is the fallback wherever the extension is not built: a tick looks at
``sys._current_frames()`` and charges each thread's CPU-clock delta to the stack it sees.  Its
ticks need the GIL: a Python thread ticks at the sample rate, and so that a busy program (which
starves that thread) is still seen, a SIGPROF timer on the process's CPU time ticks from the
main thread too, in a signal handler, whenever the other has not.  See :class:`PythonSampler`
for what that still cannot do.

Both close a *window* every ``window_ns`` (the upload interval); :meth:`collect` returns the
windows finished since the last call, each with its own time range.
"""

from __future__ import annotations

import contextlib
import struct
import sys
import threading
import time
from collections import namedtuple

from hotspan._speedups import load_sampler, speedups_disabled
from hotspan.agent.context import (
    LABELS,
    THREAD_LABELS,
    enable_native_labels,
    keep_thread_labels,
    labels_tuple,
)
from hotspan.agent.symbols import hide_code_tree

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from types import ModuleType
    from typing import Any, Callable, Dict, List, Optional, Tuple

    LabelsTuple = Tuple[int, int, int, int, int]  # span, trace hi, trace lo, root span, tag set
    RawStack = Tuple[Tuple[Any, int], ...]  # (code object or None, byte offset), leaf first

CPU, WALL = 0, 1

# kind: CPU or WALL; labels: LabelsTuple; stack: RawStack; value: nanoseconds
RawSample = namedtuple("RawSample", "kind thread_ident labels stack value")
# start_ns, end_ns: wall clock; samples: List[RawSample]
Window = namedtuple("Window", "start_ns end_ns samples")
# windows: List[Window]; lost: samples taken but not kept (ring or memory bound full);
# keepalive: holds the code objects of the samples until they are named
Collected = namedtuple("Collected", "windows lost keepalive")


class NativeSampler:
    name = "native"
    # The Python side only pins code objects and picks up finished windows; sampling itself
    # does not wait for it.
    tick_interval = 0.1

    def __init__(self, sample_rate: int, max_depth: int, cpu: bool, wall: bool = True) -> None:
        mod = load_sampler()
        if mod is None:
            raise RuntimeError("the native sampler is not built")
        self._mod: ModuleType = mod
        self._interval_ns = 1_000_000_000 // sample_rate
        self._max_depth = max_depth
        self._cpu = cpu
        self._wall = wall
        self.native_cpu = False
        self.labels = False
        self._unpack = struct.Struct("=QII").iter_unpack

    def start(self, window_ns: int) -> None:
        self.labels = enable_native_labels()
        _thread_hooks.install(self._mod.register_thread, self._mod.unregister_thread)
        self.native_cpu = bool(
            self._mod.start(self._interval_ns, self._max_depth, self._cpu, self._wall, window_ns)
        )

    def exclude(self, ident: int) -> None:
        self._mod.exclude(ident)

    def tick(self) -> None:
        self._mod.pin()

    def collect(self, final: bool = False) -> Collected:
        windows, codes, lost = self._mod.collect(final)
        if not windows:  # most ticks: nothing finished, nothing to name
            return Collected([], lost, codes)
        by_address = {id(code): code for code in codes}
        stacks: Dict[bytes, RawStack] = {}
        out = []
        for start_ns, end_ns, samples in windows:
            rows = []
            for (kind, ident, *labels, frames), value in samples.items():
                stack = stacks.get(frames)
                if stack is None:
                    stack = tuple(
                        (by_address.get(address), lasti)
                        for address, lasti, _ in self._unpack(frames)
                    )
                    stacks[frames] = stack
                rows.append(RawSample(kind, ident, tuple(labels), stack, value))
            out.append(Window(start_ns, end_ns, rows))
        return Collected(out, lost, codes)

    def cut(self) -> Collected:
        """What was taken, the window closed now, sampling going on (a pull starts or ends):
        the native module's final collect does just that."""
        return self.collect(final=True)

    def stats(self) -> Dict[str, int]:
        return dict(self._mod.stats())

    def stop(self) -> None:
        _thread_hooks.uninstall()
        self._mod.stop()

    def after_fork(self) -> None:
        self._mod.after_fork()


class PythonSampler:
    """Ticks from the agent's thread, and from the main thread on ``ITIMER_PROF`` (when the
    main thread starts it and nobody else handles SIGPROF).  Limits: CPU totals are right but
    are charged to the stack seen at a tick, which for threads other than the one ticking is
    where they last let the GIL go; threads other than the main one that keep the GIL busy
    starve both ticks; span labels are per thread, not per asyncio task."""

    name = "python"
    # A tick that comes late (the GIL was busy) still counts the wall time that passed, but
    # never more than this: a process stopped (SIGSTOP) is not all "wall".  Longer than the
    # native sampler's second, because this sampler's ticks do come seconds late on a busy
    # program, and the wall totals should still add up.
    MAX_WALL_PER_TICK_NS = 5_000_000_000

    def __init__(self, sample_rate: int, max_depth: int, cpu: bool, wall: bool = True) -> None:
        self.tick_interval = 1.0 / sample_rate
        self._max_depth = max_depth
        self._cpu = cpu and hasattr(time, "pthread_getcpuclockid")
        self._wall = wall
        self._excluded: set = set()
        self._cpu_seen: Dict[int, int] = {}
        self._aggregate: Dict[Tuple[int, int, LabelsTuple, RawStack], int] = {}
        self._lock = threading.Lock()
        self._ticks = 0
        self._window_ns = 0
        self._window_start_ns = time.time_ns()
        self._last_tick = time.monotonic_ns()
        self._finished: List[Window] = []
        self._signal_ticks = False
        self.native_cpu = False
        self.labels = True

    def start(self, window_ns: int) -> None:
        keep_thread_labels()
        self._window_ns = window_ns
        self._window_start_ns = time.time_ns()
        self._last_tick = time.monotonic_ns()
        # Each thread's CPU clock now, so that the first tick, however late, charges the CPU
        # used since the start rather than only setting a baseline.
        self._cpu_seen = {}
        for ident in sys._current_frames():
            self._cpu_delta(ident, self._cpu_seen)
        self._start_signal_ticks()

    def _start_signal_ticks(self) -> None:
        """The agent's thread waits for the GIL like any other: a busy event loop, or a loop
        of short system calls, releases it and takes it straight back, and that thread is
        almost never scheduled (measured: 15 ticks in 3 s instead of 300).  A signal handler
        runs on the main thread, which is the one holding the GIL then."""
        import signal  # only this fallback needs it

        global _sigprof_target
        if not hasattr(signal, "setitimer"):
            return
        current = signal.getsignal(signal.SIGPROF)
        if current is not _on_sigprof:
            # Only the main thread may set a handler; once ours is there it stays, and a
            # sampler started again later (a new rate, profiling enabled again: from the
            # agent's thread) only points it at itself and arms the timer.
            if threading.current_thread() is not threading.main_thread() or current not in (
                signal.SIG_DFL,
                None,
            ):
                return
            try:
                signal.signal(signal.SIGPROF, _on_sigprof)
            except (OSError, ValueError):
                return
        _sigprof_target = self
        try:
            signal.setitimer(signal.ITIMER_PROF, self.tick_interval, self.tick_interval)
        except (OSError, ValueError):
            _sigprof_target = None
            return
        self._signal_ticks = True

    def _on_sigprof(self, signum: int, frame: Any) -> None:
        # Only when the agent's thread has not ticked lately (it does whenever it gets the
        # GIL), and never waiting: this runs in the middle of the program's own code.
        if time.monotonic_ns() - self._last_tick < self.tick_interval * 0.75e9:
            return
        with contextlib.suppress(Exception):
            self.tick(interrupted=frame)

    def exclude(self, ident: int) -> None:
        self._excluded.add(ident)

    def tick(self, interrupted: Any = None) -> None:
        """One look at every thread; ``interrupted`` is the main thread's frame when a signal
        handler ticks (its own frames are not the program's)."""
        if not self._lock.acquire(blocking=interrupted is None):
            return
        try:
            self._tick(interrupted)
        finally:
            self._lock.release()

    def _tick(self, interrupted: Any) -> None:
        now = time.monotonic_ns()
        wall_ns = min(now - self._last_tick, self.MAX_WALL_PER_TICK_NS) if self._wall else 0
        self._last_tick = now
        frames = sys._current_frames()
        if interrupted is not None:
            frames[threading.main_thread().ident] = interrupted  # type: ignore[index]
        cpu_now: Dict[int, int] = {}
        aggregate = self._aggregate
        # A signal handler runs on the main thread, in the context of the task it interrupted:
        # there its labels are the task's own, not the thread's last published ones.
        main_ident = threading.main_thread().ident if interrupted is not None else None
        for ident, frame in frames.items():
            if ident in self._excluded:
                continue
            stack = self._stack(frame)
            current = LABELS.get(None) if ident == main_ident else THREAD_LABELS.get(ident)
            if current is not None:
                current.sampled = True
            labels = labels_tuple(current)
            if wall_ns:
                key = (WALL, ident, labels, stack)
                aggregate[key] = aggregate.get(key, 0) + wall_ns
            if self._cpu:
                spent = self._cpu_delta(ident, cpu_now)
                if spent > 0:
                    key = (CPU, ident, labels, stack)
                    aggregate[key] = aggregate.get(key, 0) + spent
                    if current is not None:
                        current._charge(spent, 0)  # the span's CPU (span stats)
        self._cpu_seen = cpu_now
        self._ticks += 1
        if self._ticks % 1000 == 0:
            # Threads that ended leave their labels behind; drop them now and then.
            for ident in [i for i in list(THREAD_LABELS) if i not in frames]:
                THREAD_LABELS.pop(ident, None)
        if self._window_ns and time.time_ns() >= self._window_start_ns + self._window_ns:
            self._finish_window()
        del frames

    def _finish_window(self) -> None:
        end = time.time_ns()
        aggregate, self._aggregate = self._aggregate, {}
        samples = [
            RawSample(kind, ident, labels, stack, value)
            for (kind, ident, labels, stack), value in aggregate.items()
        ]
        self._finished.append(Window(self._window_start_ns, end, samples))
        self._window_start_ns = end

    def _cpu_delta(self, ident: int, cpu_now: Dict[int, int]) -> int:
        try:
            clock = thread_cpu_clock(ident)
            if clock is None:
                return 0
            now = time.clock_gettime_ns(clock)
        except (OSError, OverflowError):
            return 0
        cpu_now[ident] = now
        before = self._cpu_seen.get(ident)
        return now - before if before is not None else 0

    def _stack(self, frame: Any) -> RawStack:
        out: List[Tuple[Any, int]] = []
        while frame is not None and len(out) < self._max_depth:
            out.append((frame.f_code, frame.f_lasti))  # frame.f_lasti is in bytes on 3.9+
            frame = frame.f_back
        return tuple(out)

    def collect(self, final: bool = False) -> Collected:
        if final:
            self._stop_signal_ticks()
            # CPU burnt since the last tick is charged now, not lost with the window.
            self.tick()
        with self._lock:
            if final and (self._aggregate or not self._finished):
                self._finish_window()
            finished, self._finished = self._finished, []
        return Collected(finished, 0, None)

    def cut(self) -> Collected:
        """What was taken, the window closed now, sampling going on (a pull starts or ends)."""
        with self._lock:
            self._finish_window()
        return self.collect()

    def stats(self) -> Dict[str, int]:
        return {"ticks": self._ticks}

    def stop(self) -> None:
        self._stop_signal_ticks()

    def _stop_signal_ticks(self) -> None:
        if not self._signal_ticks:
            return
        import signal

        global _sigprof_target
        self._signal_ticks = False
        if _sigprof_target is self:
            _sigprof_target = None
        with contextlib.suppress(OSError, ValueError):
            signal.setitimer(signal.ITIMER_PROF, 0, 0)
        # The handler stays (a sampler started again from another thread re-arms it), and
        # with no target it does nothing.

    def after_fork(self) -> None:
        # setitimer is not inherited by a child; the handler is, and stays harmless.
        self._signal_ticks = False
        self._lock = threading.Lock()
        self._aggregate = {}
        self._finished = []
        self._cpu_seen = {}
        self._excluded = set()


_sigprof_target: Optional[PythonSampler] = None


def _on_sigprof(signum: int, frame: Any) -> None:
    target = _sigprof_target
    if target is not None:
        target._on_sigprof(signum, frame)


class _ThreadHooks:
    """Makes every thread started through :mod:`threading` call ``on_start`` before it runs
    anything and ``on_end(code it ran)`` as it finishes, so that a thread's CPU timer exists
    from its first instruction to its last (a thread per request can live a few
    milliseconds).

    The wrapper stays on the thread's stack under everything it runs, so its frame is hidden
    (see below), and it calls nothing in Python but threading's own
    ``_bootstrap_inner``: what is left of a thread's stack is what it is without the agent."""

    def __init__(self) -> None:
        self._original: Optional[Callable[[Any], None]] = None

    def install(self, on_start: Callable[[], None], on_end: Callable[[Any], None]) -> None:
        original = self._original or threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

        def _bootstrap_inner(thread: threading.Thread) -> None:
            # try/except rather than contextlib.suppress: no frame of contextlib's in the
            # thread's first samples, and a thread's start costs less.
            code = None
            try:
                on_start()
                # What the thread runs, named before run() deletes its target.
                target = getattr(thread, "_target", None) or thread.run
                code = getattr(target, "__code__", None)
            except Exception:  # noqa: BLE001 - never break the program's threads
                pass
            try:
                original(thread)
            finally:
                try:  # noqa: SIM105 - see above: no contextlib frame
                    on_end(code)
                except Exception:  # noqa: BLE001
                    pass

        self._original = original
        threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]

    def uninstall(self) -> None:
        if self._original is not None:
            threading.Thread._bootstrap_inner = self._original  # type: ignore[attr-defined]
            self._original = None


# The wrapper's code object is one constant of ``install``, shared by every wrapper it makes:
# hidden once, it is left out of every stack (see Symbolizer.name_stack).
hide_code_tree(_ThreadHooks.install.__code__)
_thread_hooks = _ThreadHooks()


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


_said_fallback = False


def make_sampler(sample_rate: int, max_depth: int, cpu: bool, wall: bool, native: bool) -> Any:
    global _said_fallback
    if native and load_sampler() is not None:
        return NativeSampler(sample_rate, max_depth, cpu, wall)
    if native and not _said_fallback and not speedups_disabled():
        # Once a process: the fallback samples less exactly (docs/agent.md, "The pure-Python
        # fallback"), and whoever runs it should know why it is the one running.
        from hotspan._speedups import native_unavailable_reason
        from hotspan.agent.log import logger

        _said_fallback = True
        logger.warning("hotspan: using the pure-Python sampler: %s", native_unavailable_reason())
    return PythonSampler(sample_rate, max_depth, cpu, wall)
