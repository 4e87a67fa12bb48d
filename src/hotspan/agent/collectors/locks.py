"""Lock contention: how long threads and asyncio tasks wait to acquire a lock, on the stack of
the waiter and with the span labels of its context (Go's mutex profile: ``contentions`` and
``delay`` in nanoseconds).

What is profiled: every ``threading.Lock`` and ``threading.RLock`` made while the agent runs,
and so what is built on them and made in that time (``threading.Condition``, ``Semaphore``,
``BoundedSemaphore``, ``Event``, ``Barrier``, ``queue.Queue``, which call ``threading.Lock()``
or ``RLock()`` as they are constructed), and every ``asyncio.Lock``.  Locks made before the
agent started (at import time, say) stay as they were and are not profiled, and neither are
locks made through ``_thread`` directly.

How: :meth:`LockCollector.start` replaces the module attributes ``threading.Lock`` and
``threading.RLock`` with profiled lock types, and ``asyncio.Lock.acquire`` with a wrapper;
:meth:`LockCollector.stop` puts the originals back.  A profiled lock wraps a real
``_thread.lock`` / ``_thread.RLock``: acquire first tries it without blocking, which is all an
uncontended acquire costs, and only when that fails times the real blocking acquire (with the
caller's own ``blocking``/``timeout``, so that its semantics are the original's).  The time a
``Condition`` waits for ``notify`` is not contention: it waits on a lock of its own made by
``_thread``, which is not profiled.  A wait that ends without the lock (a ``timeout`` that
expired, a cancelled task) was still a wait, and counts.  Taking a ``Condition``'s lock back
after a notify is timed when the lock is a ``Lock`` (``Condition`` calls ``acquire``), not
when it is an ``RLock`` (``_acquire_restore`` has no non-blocking form to try first).

The native implementation (``hotspan._speedups._locks``) is a C lock type that records into
C memory, reading the stack and labels with the native sampler's C API; the Python twin
(:mod:`hotspan.agent.collectors.locks_py`) has the same interface and is imported only when
the extension is absent or ``native=False``.  Either
aggregates per (stack, labels), in bounded memory, and counts what it had to drop.
"""

from __future__ import annotations

import _thread
import contextvars
import sys
import threading
import time

from hotspan._speedups import load_module, load_sampler
from hotspan.agent import context
from hotspan.agent.after_import import AfterImport
from hotspan.agent.collectors import (
    LOCK_PERIOD_TYPE,
    LOCK_TYPES,
    ProfileData,
    StackSample,
)
from hotspan.agent.config import AgentConfig
from hotspan.agent.symbols import hide_code_tree

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, List, Optional, Tuple

    from hotspan.agent.collectors import LabelsTuple


_allocate_lock = _thread.allocate_lock
_CRLock: Any = getattr(_thread, "RLock", None)
_getframe = sys._getframe
_monotonic_ns = time.monotonic_ns


# ------------------------------------------------------------------ backends


class _NativeBackend:
    implementation = "native"

    def __init__(self, module: Any) -> None:
        self._mod = module
        self.Lock = module.ProfiledLock
        self.RLock = module.ProfiledRLock
        # record_here(delay, skip): charges a wait to the caller's stack without its `skip`
        # innermost frames.  The C function itself, as C callables push no frame.
        self.record_here = module.record

    def start(self, max_depth: int) -> None:
        _ensure_native_labels()
        self._mod.start(max_depth)

    def stop(self) -> None:
        self._mod.stop()

    def drain(self) -> List[Tuple[Any, LabelsTuple, int, int]]:
        return list(self._mod.collect())

    def after_fork(self) -> None:
        self._mod.after_fork()

    def stats(self) -> Dict[str, int]:
        return dict(self._mod.stats())


def _ensure_native_labels() -> None:
    """The C lock reads labels as the native sampler does, which needs the sampler to have
    learnt this Python's contextvars layout; it has when it runs, else teach it here."""
    sampler = load_sampler()
    if sampler is None:
        return
    probe = context.Labels(1, 0, 0, 0, 0)

    def find() -> Any:
        context.LABELS.set(probe)
        return sampler.find_in(contextvars.copy_context())

    if contextvars.Context().run(find) is not probe:
        context.enable_native_labels()


# ------------------------------------------------------------------ asyncio.Lock


class _AsyncioPatch:
    """Wraps ``asyncio.Lock.acquire``: when the lock is free and nobody waits, the original
    coroutine as it is; otherwise one that times the wait of the awaiting task."""

    def __init__(self, record_here: Any) -> None:
        self._record_here = record_here
        self._original: Any = None
        self._wrapper: Any = None
        self._lock_class: Any = None

    def install(self, locks_module: Any) -> None:
        lock_class: Any = getattr(locks_module, "Lock", None)
        original = getattr(lock_class, "acquire", None) if lock_class is not None else None
        if original is None or self._original is not None:
            return
        mixin = getattr(locks_module, "_ContextManagerMixin", None)
        aenter = getattr(getattr(mixin, "__aenter__", None), "__code__", None)
        cancelled: Any = getattr(locks_module, "exceptions", None)
        # An asyncio without CancelledError there: ``except ()`` catches nothing.
        cancelled = getattr(cancelled, "CancelledError", None) or ()
        record_here = self._record_here

        async def timed(lock: Any) -> bool:
            start = _monotonic_ns()
            try:
                got = await original(lock)
            except cancelled:
                _record_task_wait(record_here, _monotonic_ns() - start, aenter)
                raise
            _record_task_wait(record_here, _monotonic_ns() - start, aenter)
            return got

        def acquire(lock: Any) -> Any:
            # Returning the original coroutine (or ours) rather than being a coroutine
            # function keeps the uncontended path free of an extra coroutine.
            if not getattr(lock, "_locked", True) and not getattr(lock, "_waiters", None):
                return original(lock)
            return timed(lock)

        acquire.__name__ = "acquire"
        acquire.__qualname__ = getattr(original, "__qualname__", "Lock.acquire")
        acquire.__doc__ = original.__doc__
        acquire.__wrapped__ = original  # type: ignore[attr-defined]
        marker = getattr(sys.modules.get("asyncio.coroutines"), "_is_coroutine", None)
        if marker is not None:
            acquire._is_coroutine = marker  # type: ignore[attr-defined]
        lock_class.acquire = acquire
        self._lock_class, self._original, self._wrapper = lock_class, original, acquire

    def uninstall(self) -> None:
        if self._lock_class is not None and self._lock_class.__dict__.get("acquire") is (
            self._wrapper
        ):
            self._lock_class.acquire = self._original
        self._lock_class = self._original = self._wrapper = None


def _record_task_wait(record_here: Any, delay: int, aenter: Any) -> None:
    """From the timing coroutine, resumed in its task: the awaiting coroutines are its
    callers.  Leaf: whoever awaited acquire(); for ``async with lock:``, the coroutine that
    entered it rather than asyncio's ``__aenter__``."""
    try:
        caller = _getframe(2)
        skip = 2 if caller.f_code is aenter else 1  # 0: this function; 1: the timing coroutine
        record_here(delay, skip + 1)
    except Exception:  # noqa: BLE001 - a profiler must not break the program's locking
        pass


def _hide_own_frames() -> None:
    """The lock wrappers run inside the program's calls (a task awaiting a contended
    asyncio lock has ``timed`` in its stack), but are not the program's: stacks leave them
    out (locks_py does the same for the Python twin's acquire)."""
    for code in (_AsyncioPatch.install.__code__, _record_task_wait.__code__):
        hide_code_tree(code)


_hide_own_frames()


# ------------------------------------------------------------------ the collector


class LockCollector:
    """Lock contention as a :class:`~hotspan.agent.collectors.Collector`."""

    name = "locks"

    def __init__(self, max_depth: int, native: bool = True) -> None:
        module = load_module("_locks") if native else None
        if module is not None:
            self._backend: Any = _NativeBackend(module)
        else:
            from hotspan.agent.collectors.locks_py import PythonBackend

            self._backend = PythonBackend()
        self.implementation: str = self._backend.implementation
        self._max_depth = max_depth
        self._start_ns = time.time_ns()
        self._saved: Optional[Tuple[Any, Any]] = None
        self._asyncio = _AsyncioPatch(self._backend.record_here)
        self._hook: Optional[AfterImport] = None

    def start(self) -> None:
        self._backend.start(self._max_depth)
        self._start_ns = time.time_ns()
        backend = self._backend
        saved = (threading.Lock, threading.RLock)
        # Only the originals are replaced: a lock library that patched threading (gevent) has
        # locks of its own, which ours would break.
        # 3.13 made threading.Lock the lock type itself (_thread.lock), not allocate_lock.
        if threading.Lock is _allocate_lock or threading.Lock is _thread.LockType:
            threading.Lock = backend.Lock
        if (
            _CRLock is not None
            and getattr(threading, "_CRLock", None) is _CRLock
            and getattr(threading.RLock, "__module__", None) == "threading"
        ):
            threading.RLock = backend.RLock
        self._saved = saved
        locks_module = sys.modules.get("asyncio.locks")
        if locks_module is not None:
            self._asyncio.install(locks_module)
        else:
            # Patched as the program imports it: the agent does not import asyncio into
            # programs that never use it.
            self._hook = AfterImport("asyncio.locks", self._asyncio.install)
            self._hook.install()

    def collect(self, final: bool = False) -> List[ProfileData]:
        end_ns = time.time_ns()
        start_ns, self._start_ns = self._start_ns, end_ns
        waits = self._backend.drain()
        if not waits:
            return []
        samples = [
            StackSample(stack, tuple(labels), (n, delay)) for stack, labels, n, delay in waits
        ]
        return [
            ProfileData(LOCK_TYPES, LOCK_PERIOD_TYPE, 1, start_ns, end_ns, samples, keepalive=waits)
        ]

    def stop(self) -> None:
        saved, self._saved = self._saved, None
        if saved is not None:
            backend = self._backend
            if threading.Lock is backend.Lock:
                threading.Lock = saved[0]
            if threading.RLock is backend.RLock:
                threading.RLock = saved[1]
        hook, self._hook = self._hook, None
        if hook is not None:
            hook.uninstall()
        self._asyncio.uninstall()
        self._backend.stop()

    def after_fork(self) -> None:
        self._backend.after_fork()
        self._start_ns = time.time_ns()

    def stats(self) -> Dict[str, int]:
        return self._backend.stats()


def make_collector(config: AgentConfig) -> Optional[LockCollector]:
    if not config.locks:
        return None
    return LockCollector(config.max_depth, native=config.native)
