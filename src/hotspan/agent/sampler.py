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
for what that still cannot do; it lives in :mod:`hotspan.agent.sampler_py`, imported only
where it runs (it is still ``hotspan.agent.sampler.PythonSampler``).

Both close a *window* every ``window_ns`` (the upload interval); :meth:`collect` returns the
windows finished since the last call, each with its own time range, as the records of
:mod:`hotspan.agent.samples` (also found here).
"""

from __future__ import annotations

import threading

from hotspan._speedups import load_sampler, speedups_disabled
from hotspan.agent.context import enable_native_labels
from hotspan.agent.samples import (  # noqa: F401 - also found here, by outbox.py and governor.py
    CPU,
    GIL_HELD,
    KERNEL_CLOCKS,
    WALL,
    WALL_CPU_WAIT,
    WALL_GIL_WAIT,
    WALL_RELEASED,
    WALL_RUNNING,
    Collected,
    RawSample,
    Window,
    kernel_cpu_clock,
    thread_cpu_clock,
)
from hotspan.agent.symbols import AGENT, gc_frame, hide_code_tree

# The code addresses of the native sampler's [GC] frame and of the frame its GIL-held profile
# puts the agent's own turns at the GIL in (GC_FRAME_CODE, AGENT_FRAME_CODE in its internal.h).
GC_FRAME_CODE = 1
AGENT_FRAME_CODE = 3

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from types import ModuleType
    from typing import Any, Callable, Dict, Optional

    from hotspan.agent.sampler_py import PythonSampler  # noqa: F401 - see __getattr__
    from hotspan.agent.samples import RawStack


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
        self._unpack: Any = None  # the frames' (address, lasti, spare) rows, once needed

    def start(self, window_ns: int, after: Any = None) -> None:
        """``after``: the sampler this one replaces, stopped just now (a new rate); what the
        threads did in between goes to this one's first samples."""
        self.labels = enable_native_labels()
        _thread_hooks.install(self._mod.register_thread, self._mod.unregister_thread)
        resume = isinstance(after, NativeSampler)
        self.native_cpu = bool(
            self._mod.start(
                self._interval_ns, self._max_depth, self._cpu, self._wall, window_ns, resume
            )
        )

    def exclude(self, ident: int) -> None:
        self._mod.exclude(ident)

    def tick(self) -> None:
        self._mod.pin()

    def collect(self, final: bool = False) -> Collected:
        windows, codes, lost = self._mod.collect(final)
        if not windows:  # most ticks: nothing finished, nothing to name
            return Collected([], lost, codes)
        unpack = self._unpack
        if unpack is None:
            # With the first window, not with the agent: struct is ~60 objects for the GC to
            # walk in a program that had not imported it (see agent/log.py).
            import struct

            unpack = self._unpack = struct.Struct("=QII").iter_unpack
        by_address = {id(code): code for code in codes}
        stacks: Dict[bytes, RawStack] = {}
        out = []
        for start_ns, end_ns, samples in windows:
            rows = []
            for (kind, ident, *labels, frames), value in samples.items():
                stack = stacks.get(frames)
                if stack is None:
                    stack = tuple(
                        gc_frame(lasti)
                        if address == GC_FRAME_CODE
                        else AGENT
                        if address == AGENT_FRAME_CODE
                        else (by_address.get(address), lasti)
                        for address, lasti, _ in unpack(frames)
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
    from hotspan.agent.sampler_py import PythonSampler

    return PythonSampler(sample_rate, max_depth, cpu, wall)


def __getattr__(name: str) -> Any:
    # The pure-Python sampler lives in its own module, imported only where it runs (or a test
    # asks for it), but keeps its name here.
    if name == "PythonSampler":
        from hotspan.agent.sampler_py import PythonSampler

        return PythonSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
