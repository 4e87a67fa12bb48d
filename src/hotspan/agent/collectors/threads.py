"""Threads and tasks: at each upload, how many threads and how many pending asyncio tasks stand
on each stack (Go's goroutine profile is the model: "what are my 200 threads doing").

A snapshot, not a rate: every ``collect`` looks once at every thread (``sys._current_frames``)
and every pending task of every event loop, and counts them per (stack, span labels).  It runs
once per upload on the agent's thread, so it is plain Python.

The last window's look is the one taken as the main thread finishes, before the interpreter
joins the other threads: by the agent's shutdown (an ``atexit`` handler) they are gone, and a
program shorter than an upload interval would have had no look at them at all.

A suspended task's frames are on no thread's stack: its stack is its chain of awaiting
coroutines (``cr_await``), innermost first, under a synthetic ``<asyncio task>`` root so tasks
group apart from threads in a flame graph.  A task that is running at the moment is on its
thread's stack and is counted there only.

Where asyncio keeps its tasks depends on the version: a WeakSet ``_all_tasks`` (3.9-3.11),
``_scheduled_tasks`` plus ``_eager_tasks`` (3.12, 3.13), per-thread lists in C reachable only
one loop at a time through ``_asyncio.all_tasks(loop)`` (3.14+), whose loops are found on the
threads' stacks (``run_forever`` and friends) and through the tasks the WeakSet still holds.
"""

from __future__ import annotations

import contextvars
import gc
import sys
import threading
import time
import types

from hotspan._speedups import load_sampler
from hotspan.agent import context
from hotspan.agent.collectors import (
    NO_LABELS,
    THREAD_PERIOD_TYPE,
    THREAD_TYPES,
    ProfileData,
    StackSample,
)
from hotspan.agent.log import logger
from hotspan.agent.symbols import agent_code

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

    from hotspan.agent.collectors import LabelsTuple, RawFrame

    Stack = Tuple[RawFrame, ...]


# The synthetic root under every task stack, and the stack that counts the pending tasks a
# snapshot did not walk (beyond MAX_TASKS), so the profile's total stays the true count.
TASK_ROOT: RawFrame = ("<asyncio task>", "", 0, 0)
TASKS_NOT_WALKED: RawFrame = ("<asyncio tasks not walked>", "", 0, 0)

# Walking a task costs a few attribute reads per awaiting coroutine; a program with a million
# pending tasks must not make each upload cost seconds.
MAX_TASKS = 10_000
# Awaits followed per task: chains are short, but a broken or hostile awaitable could loop.
MAX_CHAIN = 1_000
# The agent's own threads (core.py's "hotspan-sampler", uploader.py's "hotspan-uploader",
# transport.py's "hotspan-resolve"): the program's threads are what this profile is about.
AGENT_THREAD_PREFIX = "hotspan-"
# Retries of copying a WeakSet another thread may be changing (as asyncio.all_tasks does).
COPY_RETRIES = 100
# Methods an event loop (or asyncio.Runner) runs under while it runs: their ``self`` leads
# to the loop, on 3.14+ the only way to another thread's tasks.
LOOP_FRAMES = frozenset(("run_forever", "run_until_complete", "_run_once", "run"))

SNAPSHOT_NS = 1_000_000_000
# A window's early look comes this long into it: a program that ends before its first upload
# (a batch job) still shows what its threads were doing, not only who was left at its end.
EARLY_LOOK_S = 1.0


class ThreadsCollector:
    name = "threads"
    implementation = "python"

    def __init__(self, max_depth: int, max_tasks: int = MAX_TASKS) -> None:
        self._max_depth = max(1, max_depth)
        self._max_tasks = max(0, max_tasks)
        self._running = False
        self._last_look: Optional[ProfileData] = None
        self._early_look: Optional[ProfileData] = None
        self._window_start = 0.0
        self._native = load_sampler()
        self._logged: Set[str] = set()
        self._snapshots = 0
        self._threads = 0
        self._tasks = 0
        self._not_walked = 0
        self._skipped = 0
        self._errors = 0

    # -------------------------------------------------------------- Collector

    def start(self) -> None:
        self._running = True
        self._last_look = self._early_look = None
        self._window_start = time.monotonic()
        _watch_main_end(self)

    def stop(self) -> None:
        self._running = False
        self._last_look = None
        if self in _WATCHING:
            _WATCHING.remove(self)

    def after_fork(self) -> None:
        # The child's first snapshot sees its own threads; a look at the parent's is not its.
        self._last_look = self._early_look = None
        self._window_start = time.monotonic()

    def stats(self) -> Dict[str, int]:
        return {
            "snapshots": self._snapshots,
            "threads": self._threads,  # in the last snapshot
            "tasks": self._tasks,  # pending, in the last snapshot
            "tasks_not_walked": self._not_walked,
            "skipped": self._skipped,  # tasks or threads that broke while looked at
            "errors": self._errors,
        }

    def collect(self, final: bool = False) -> List[ProfileData]:
        # One look per window.  The last window's is the look taken as the main thread
        # finished, when there was one since the last collect: by the agent's shutdown the
        # interpreter has joined the program's other threads, and the thread shutting the
        # agent down is this one, so a look then finds only the daemon threads left.
        if not self._running:
            return []
        last, self._last_look = self._last_look, None
        early, self._early_look = self._early_look, None
        self._window_start = time.monotonic()
        if final:
            # The look at the main thread's end counts the threads still running then; when
            # none were (they had been joined), the window's early look shows the program at
            # work instead of an empty profile.
            for look in (last, early):
                if look is not None and look.samples:
                    return [look]
        try:
            return [self.snapshot()]
        except Exception:  # noqa: BLE001 - never raise into the agent's loop or the program
            self._errors += 1
            self._log_once("snapshot", "hotspan: threads snapshot failed", exc_info=True)
            return []

    def look(self) -> None:
        """Called on each wake of the agent's loop: the window's early look, once, when the
        window is EARLY_LOOK_S old."""
        if (
            not self._running
            or self._early_look is not None
            or time.monotonic() - self._window_start < EARLY_LOOK_S
        ):
            return
        try:
            self._early_look = self.snapshot()
        except Exception:  # noqa: BLE001 - never raise into the agent's loop
            self._errors += 1
            self._log_once("snapshot", "hotspan: threads snapshot failed", exc_info=True)

    def _look_at_main_end(self) -> None:
        """On the main thread as it finishes (threading's shutdown), before the interpreter
        joins the program's other threads: the last look at them."""
        if not self._running:
            return
        try:
            self._last_look = self.snapshot()
        except Exception:  # noqa: BLE001 - never raise into the program's exit
            self._errors += 1
            self._log_once("snapshot", "hotspan: threads snapshot failed", exc_info=True)

    # -------------------------------------------------------------- the snapshot

    def snapshot(self) -> ProfileData:
        """One look at every thread and pending task, now."""
        start_ns = time.time_ns()
        counts: Dict[Tuple[Stack, LabelsTuple], int] = {}
        frames = sys._current_frames()
        try:
            self._threads = self._count_threads(frames, counts)
            self._tasks = self._count_tasks(frames, counts)
        finally:
            del frames
        self._snapshots += 1
        samples = [StackSample(stack, labels, (n,)) for (stack, labels), n in counts.items()]
        # A snapshot is an instant; the upload still needs a range (``until`` after ``from``,
        # the pprof duration), and one second, the ingest API's resolution, keeps it in the
        # second it was taken.  The samples are stored at start_ns itself.
        return ProfileData(
            THREAD_TYPES, THREAD_PERIOD_TYPE, 1, start_ns, start_ns + SNAPSHOT_NS, samples
        )

    def _count_threads(self, frames: Dict[int, Any], counts: Dict[Any, int]) -> int:
        me = threading.get_ident()
        agent = {t.ident for t in threading.enumerate() if t.name.startswith(AGENT_THREAD_PREFIX)}
        labels = self._thread_labels()
        depth = self._max_depth
        n = 0
        for ident, frame in frames.items():
            if ident == me or ident in agent:
                continue
            try:
                stack = _frame_stack(frame, depth)
            except Exception:  # noqa: BLE001 - a frame torn down as we looked
                self._skipped += 1
                continue
            key = (stack, labels.get(ident, NO_LABELS))
            counts[key] = counts.get(key, 0) + 1
            n += 1
        return n

    def _thread_labels(self) -> Dict[int, LabelsTuple]:
        # The Python sampler publishes labels per thread (THREAD_LABELS); the native one
        # leaves them in each thread's context, which only C can read for another thread.
        out = {ident: context.labels_tuple(v) for ident, v in dict(context.THREAD_LABELS).items()}
        reader = getattr(self._native, "thread_labels", None)
        if reader is not None:
            try:
                out.update(reader())
            except Exception:  # noqa: BLE001
                self._log_once("labels", "hotspan: thread labels unreadable", exc_info=True)
        return out

    def _count_tasks(self, frames: Dict[int, Any], counts: Dict[Any, int]) -> int:
        tasks = self._pending_candidates(frames)
        depth = self._max_depth
        walked = pending = not_walked = 0
        for task in tasks:
            try:
                if task.done():
                    continue
                if walked >= self._max_tasks:
                    not_walked += 1
                    continue
                walked += 1
                stack = _task_stack(task, depth)
                if stack is None:
                    continue  # running now: on its thread's stack
                labels = _task_labels(task)
            except Exception:  # noqa: BLE001 - a task finishing or broken as we looked
                self._skipped += 1
                continue
            key = (stack, labels)
            counts[key] = counts.get(key, 0) + 1
            pending += 1
        if not_walked:
            self._not_walked += not_walked
            key = ((TASKS_NOT_WALKED, TASK_ROOT), NO_LABELS)
            counts[key] = counts.get(key, 0) + not_walked
        return pending + not_walked

    def _pending_candidates(self, frames: Dict[int, Any]) -> List[Any]:
        """Every task asyncio tracks (some done), without importing asyncio: a program that
        never did has none."""
        tasks_module = sys.modules.get("asyncio.tasks")
        if tasks_module is None:
            return []
        found: Dict[int, Any] = {}
        known = False
        # 3.9-3.11: _all_tasks; 3.12+: _scheduled_tasks (on 3.14 only tasks that are not
        # _asyncio.Task's).  _eager_tasks hold tasks in their first, eager step: running,
        # so on a thread's stack, and skipped as running ones are.
        for attr in ("_all_tasks", "_scheduled_tasks"):
            members = getattr(tasks_module, attr, None)
            if members is None:
                continue
            known = True
            for task in self._copy(members):
                found[id(task)] = task
        per_loop = getattr(sys.modules.get("_asyncio"), "all_tasks", None)
        if per_loop is not None:  # 3.14+: C tasks live in per-thread lists, read by loop
            known = True
            loops = _find_loops(frames, found.values())
            if not loops:
                self._log_once(
                    "loops",
                    "hotspan: no running event loop found; on this Python asyncio tasks are "
                    "found through their loop only (a loop with no Python frame, as uvloop's, "
                    "is not seen)",
                )
            for loop in loops:
                try:
                    for task in per_loop(loop):
                        found[id(task)] = task
                except Exception:  # noqa: BLE001
                    self._skipped += 1
        if not known:
            self._log_once(
                "tasks", "hotspan: this Python keeps asyncio tasks where hotspan cannot see them"
            )
        return list(found.values())

    def _copy(self, members: Any) -> List[Any]:
        # A WeakSet's iteration runs Python code; a loop thread adding a task meanwhile
        # makes it raise, and a retry is what asyncio.all_tasks itself does.
        for _ in range(COPY_RETRIES):
            try:
                return list(members)
            except RuntimeError:
                continue
        self._skipped += 1
        return []

    def _log_once(self, key: str, message: str, exc_info: bool = False) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.debug(message, exc_info=exc_info)


# The collectors running, each to take its last look as the main thread finishes.
_WATCHING: List[ThreadsCollector] = []
_hooked = False


def _watch_main_end(collector: ThreadsCollector) -> None:
    global _hooked
    if collector not in _WATCHING:
        _WATCHING.append(collector)
    if _hooked:
        return
    # threading's own hook (3.9+) for what must run before the non-daemon threads are
    # joined (concurrent.futures uses it); none on other Pythons, nor once shutting down.
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        return
    try:
        register(_main_ends)
    except RuntimeError:
        return
    _hooked = True


def _main_ends() -> None:
    try:
        for collector in list(_WATCHING):
            collector._look_at_main_end()
    except Exception:  # noqa: BLE001 - an exception here would stop threading's shutdown
        pass


# The look runs on the program's main thread, after its last line: hotspan's work, one
# ``hotspan`` frame in any sample taken meanwhile, not the program's.
agent_code(_main_ends.__code__)


def _frame_stack(frame: Any, depth: int) -> Stack:
    out: List[Tuple[Any, int]] = []
    while frame is not None and len(out) < depth:
        out.append((frame.f_code, max(frame.f_lasti, 0)))
        frame = frame.f_back
    return tuple(out)


def _task_stack(task: Any, depth: int) -> Optional[Stack]:
    """The task's awaiting coroutines, innermost first, under TASK_ROOT; None when the task is
    running (its frames are on a thread's stack)."""
    obj = task.get_coro()
    if obj is None:
        return (TASK_ROOT,)
    if getattr(obj, "cr_running", False) or getattr(obj, "gi_running", False):
        return None
    outer_first: List[RawFrame] = []
    for _ in range(MAX_CHAIN):
        kind = type(obj)
        # Native coroutines first: nearly every link is one, and this runs per task.
        if kind is _COROUTINE or hasattr(obj, "cr_frame"):  # (Cython's have cr_* too)
            frame, obj = obj.cr_frame, obj.cr_await
        elif kind is _ASYNC_GENERATOR:
            frame, obj = obj.ag_frame, obj.ag_await
        elif kind is _GENERATOR:  # generator-based coroutine (yield from)
            frame, obj = obj.gi_frame, obj.gi_yieldfrom
        elif kind.__name__ in _ASYNC_GEN_AWAITABLES:
            # ``async for``/``anext()``: what is awaited is the generator's __anext__
            # awaitable, which shows its generator only to the GC.
            obj = _async_generator_of(obj)
            if obj is None:
                break
            continue
        else:  # a Future, another Task (its own stack), an awaitable we cannot look into
            break
        if frame is not None:
            lasti = frame.f_lasti
            outer_first.append((frame.f_code, lasti if lasti > 0 else 0))
        if obj is None:
            break
    keep = max(depth - 1, 1)  # the root takes one place; the innermost frames matter most
    if len(outer_first) > keep:
        del outer_first[:-keep]
    outer_first.reverse()
    outer_first.append(TASK_ROOT)
    return tuple(outer_first)


_COROUTINE = types.CoroutineType
_ASYNC_GENERATOR = types.AsyncGeneratorType
_GENERATOR = types.GeneratorType
_ASYNC_GEN_AWAITABLES = frozenset(("async_generator_asend", "async_generator_athrow"))


def _async_generator_of(awaitable: Any) -> Any:
    for referent in gc.get_referents(awaitable):
        if isinstance(referent, types.AsyncGeneratorType):
            return referent
    return None


def _task_labels(task: Any) -> LabelsTuple:
    get_context = getattr(task, "get_context", None)  # 3.12+; else the pure-Python Task's
    ctx = get_context() if get_context is not None else getattr(task, "_context", None)
    if ctx is None:
        # 3.9-3.11's C Task does not expose its context, but visits it first in its GC
        # traversal (before its future's callbacks' contexts).
        for referent in gc.get_referents(task):
            if isinstance(referent, contextvars.Context):
                ctx = referent
                break
    if ctx is None:
        return NO_LABELS
    return context.labels_tuple(ctx.get(context.LABELS))


def _find_loops(frames: Dict[int, Any], tasks: Iterable[Any]) -> List[Any]:
    """The event loops running in any thread (seen on its stack), those of the given tasks,
    and the current thread's."""
    events = sys.modules.get("asyncio.events")
    base = getattr(events, "AbstractEventLoop", None)
    if base is None:
        return []
    runner = getattr(sys.modules.get("asyncio.runners"), "Runner", None)
    loops: Dict[int, Any] = {}

    def add(candidate: Any) -> None:
        if isinstance(candidate, base):
            loops[id(candidate)] = candidate

    for frame in frames.values():
        for _ in range(MAX_CHAIN):
            if frame is None:
                break
            if frame.f_code.co_name in LOOP_FRAMES:
                try:
                    owner = frame.f_locals.get("self")
                except Exception:  # noqa: BLE001
                    owner = None
                add(owner)
                if runner is not None and isinstance(owner, runner):
                    add(getattr(owner, "_loop", None))
            frame = frame.f_back
    for task in tasks:
        try:
            add(task.get_loop())
        except Exception:  # noqa: BLE001
            continue
    get_running = getattr(events, "_get_running_loop", None)
    if get_running is not None:
        add(get_running())
    return list(loops.values())


def make_collector(config: Any) -> Optional[ThreadsCollector]:
    if not getattr(config, "threads", False):
        return None
    return ThreadsCollector(config.max_depth)
