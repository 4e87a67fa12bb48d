"""The Python twin of ``hotspan._speedups._locks``: the same lock types and recording, for
when the extension is absent or ``native=False``.  A module of its own so that a process
with the C module never imports it (every function and class is an object that each full
garbage collection walks)."""

from __future__ import annotations

import _thread
import contextlib
import sys
import time

from hotspan.agent import context
from hotspan.agent.symbols import hide_code_tree

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, List, Tuple

    from hotspan.agent.collectors import LabelsTuple

MAX_ENTRIES = 4096  # distinct (stack, labels) kept between two collects, as the C table

_allocate_lock = _thread.allocate_lock
_CRLock: Any = getattr(_thread, "RLock", None)
_TIMEOUT_MAX = _thread.TIMEOUT_MAX
_getframe = sys._getframe
_monotonic_ns = time.monotonic_ns


class _Recorder:
    """Waits aggregated per (stack, labels), bounded; the twin of the C module's table."""

    def __init__(self) -> None:
        self.max_depth = 64
        self.recording = False
        self._lock = _allocate_lock()  # never a profiled one: recording must not record
        self._waits: Dict[Tuple[Any, LabelsTuple], List[int]] = {}
        self.recorded = 0
        self.dropped = 0
        self.delay_dropped_ns = 0

    def record(self, frame: Any, delay: int) -> None:
        """Charges ``delay`` to ``frame`` (leaf) and its callers, with the labels of the
        current context."""
        if not self.recording:
            return
        stack = []
        depth = self.max_depth
        while frame is not None and depth > 0:
            stack.append((frame.f_code, frame.f_lasti))  # f_lasti is in bytes on 3.9+
            frame = frame.f_back
            depth -= 1
        current = context.LABELS.get(None)
        if current is not None:
            # So that the span gets its pyroscope.profile.id, as for a CPU sample.
            with contextlib.suppress(AttributeError):
                current.sampled = True
        key = (tuple(stack), context.labels_tuple(current))
        with self._lock:
            entry = self._waits.get(key)
            if entry is not None:
                entry[0] += 1
                entry[1] += delay
            elif len(self._waits) < MAX_ENTRIES:
                self._waits[key] = [1, delay]
            else:
                self.dropped += 1
                self.delay_dropped_ns += delay
                return
            self.recorded += 1

    def drain(self) -> List[Tuple[Any, LabelsTuple, int, int]]:
        with self._lock:
            waits, self._waits = self._waits, {}
        return [(stack, labels, n, delay) for (stack, labels), (n, delay) in waits.items()]

    def after_fork(self) -> None:
        self._lock = _allocate_lock()  # another thread may have held it at the fork
        self._waits = {}
        self.recorded = self.dropped = self.delay_dropped_ns = 0

    def stats(self) -> Dict[str, int]:
        return {
            "waits_recorded": self.recorded,
            "waits_dropped": self.dropped,
            "delay_dropped_ns": self.delay_dropped_ns,
            "entries": len(self._waits),
        }


_recorder = _Recorder()


def _plain_timeout(timeout: Any) -> bool:
    """A timeout the inner lock takes with blocking=True; any other goes to it untouched, to
    fail as it fails."""
    if type(timeout) is int or type(timeout) is float:
        return timeout == -1 or 0 <= timeout <= _TIMEOUT_MAX
    return False


class _PyProfiled:
    """What the Python twins of the C ProfiledLock and ProfiledRLock share: a real lock inside,
    an uncontended acquire as one non-blocking try, and a wait timed only when that fails."""

    __slots__ = ("_inner", "__weakref__")
    _inner: Any  # the real lock, set by the subclasses

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        inner = self._inner
        if not blocking or not (timeout == -1 or _plain_timeout(timeout)):
            return inner.acquire(blocking, timeout)
        if inner.acquire(False):
            return True
        start = _monotonic_ns()
        got = inner.acquire(blocking, timeout)
        _recorder.record(_getframe(1), _monotonic_ns() - start)
        return got

    def __enter__(self) -> bool:
        inner = self._inner
        if inner.acquire(False):
            return True
        start = _monotonic_ns()
        got = inner.acquire()
        _recorder.record(_getframe(1), _monotonic_ns() - start)
        return got

    def release(self) -> None:
        self._inner.release()

    def __exit__(self, *exc: object) -> None:
        self._inner.release()

    def _at_fork_reinit(self) -> None:
        self._inner._at_fork_reinit()

    def __repr__(self) -> str:
        return "<profiled " + repr(self._inner)[1:]


class PyProfiledLock(_PyProfiled):
    """``threading.Lock`` whose waits are timed (the Python twin of the C ProfiledLock)."""

    __slots__ = ()

    def __init__(self) -> None:
        self._inner = _allocate_lock()

    def locked(self) -> bool:
        return self._inner.locked()

    acquire_lock = _PyProfiled.acquire
    release_lock = _PyProfiled.release
    locked_lock = locked


class PyProfiledRLock(_PyProfiled):
    """``threading.RLock`` whose waits are timed (the Python twin of the C ProfiledRLock)."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inner = _CRLock(*args, **kwargs)

    # What threading.Condition uses.  Taking the lock back after a notify is not timed: the
    # wait for the notify is not contention.
    def _is_owned(self) -> bool:
        return self._inner._is_owned()

    def _release_save(self) -> Any:
        return self._inner._release_save()

    def _acquire_restore(self, state: Any) -> None:
        self._inner._acquire_restore(state)

    def __getattr__(self, name: str) -> Any:
        # What this Python's RLock has beyond the above (_recursion_count, locked).
        if name == "_inner":  # not set: the inner RLock could not be made
            raise AttributeError(name)
        return getattr(self._inner, name)


class PythonBackend:
    implementation = "python"
    Lock = PyProfiledLock
    RLock = PyProfiledRLock

    def start(self, max_depth: int) -> None:
        _recorder.max_depth = max_depth
        _recorder.recording = True

    def stop(self) -> None:
        _recorder.recording = False
        _recorder.drain()

    def drain(self) -> List[Tuple[Any, LabelsTuple, int, int]]:
        return _recorder.drain()

    def record_here(self, delay: int, skip: int) -> None:
        _recorder.record(_getframe(skip + 1), delay)

    def after_fork(self) -> None:
        _recorder.after_fork()

    def stats(self) -> Dict[str, int]:
        return _recorder.stats()


def _hide_own_frames() -> None:
    """The twin's acquire sits under every blocked thread but is not the program's: stacks
    leave it out."""
    codes = [_Recorder.record.__code__, PythonBackend.record_here.__code__]
    codes.append(_plain_timeout.__code__)
    for cls in (_PyProfiled, PyProfiledLock, PyProfiledRLock):
        codes += [f.__code__ for f in vars(cls).values() if hasattr(f, "__code__")]
    for code in codes:
        hide_code_tree(code)


_hide_own_frames()
