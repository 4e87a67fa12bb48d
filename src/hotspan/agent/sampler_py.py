"""The pure-Python sampler: the twin of :class:`~hotspan.agent.sampler.NativeSampler`, with its
interface, wherever the C extension is not built or ``native=False`` asks for it.

A tick looks at ``sys._current_frames()`` and charges each thread's CPU-clock delta to the
stack it sees.  Its ticks need the GIL: a Python thread ticks at the sample rate, and so that a
busy program (which starves that thread) is still seen, a SIGPROF timer on the process's CPU
time ticks from the main thread too, in a signal handler, whenever the other has not.

Imported only where it runs (:func:`hotspan.agent.sampler.make_sampler`): a program profiled by
the native sampler does not keep this module's functions and classes for its GC to walk.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time

from hotspan.agent.context import LABELS, THREAD_LABELS, keep_thread_labels, labels_tuple
from hotspan.agent.samples import CPU, WALL, Collected, RawSample, Window, thread_cpu_clock

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, List, Optional, Tuple

    from hotspan.agent.samples import LabelsTuple, RawStack


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

    def start(self, window_ns: int, after: Any = None) -> None:
        """``after``: the sampler this one replaces, stopped just now (a new rate); its last
        tick's clocks are this one's start, so that what the threads did since goes to this
        one's first tick."""
        keep_thread_labels()
        self._window_ns = window_ns
        self._window_start_ns = time.time_ns()
        if isinstance(after, PythonSampler):
            self._last_tick = after._last_tick
            self._cpu_seen = dict(after._cpu_seen)
        else:
            self._last_tick = time.monotonic_ns()
            # Each thread's CPU clock now, so that the first tick, however late, charges the
            # CPU used since the start rather than only setting a baseline.
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
        handler ticks (its own frames are not the program's).  Never waiting for a tick under
        way: that one looks at every thread now.  And the agent's thread must not: the main
        thread may hand it a turn at the GIL from inside the handler's tick, lock held, and
        wait for it (see _speedups/sampler/turns.c)."""
        if not self._lock.acquire(blocking=False):
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
        # The agent's thread does not wait for a tick under way (see tick): the windows
        # finished stay for its next round.
        if not self._lock.acquire(blocking=final):
            return Collected([], 0, None)
        try:
            if final and (self._aggregate or not self._finished):
                self._finish_window()
            finished, self._finished = self._finished, []
        finally:
            self._lock.release()
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
