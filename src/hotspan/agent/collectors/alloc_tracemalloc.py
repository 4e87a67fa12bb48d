"""The allocation profile's pure-Python twin: :mod:`tracemalloc`, where the C allocator hook
(:mod:`hotspan.agent.collectors.alloc`) is not built and ``alloc_tracemalloc=True`` asks for it.
Its own module so that a program profiled with the hook never imports ``tracemalloc`` (with
``pickle``, ``fnmatch``, ``linecache``: see ``agent/log.py`` for why that matters).  Its limits
are in :mod:`hotspan.agent.collectors.alloc`'s docstring."""

from __future__ import annotations

import contextlib
import dis
import os
import sys
import time
import tracemalloc
import types

from hotspan.agent.collectors import (
    ALLOC_PERIOD_TYPE,
    ALLOC_TYPES,
    NO_LABELS,
    ProfileData,
    StackSample,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, List, Optional, Set, Tuple

    from hotspan.agent.symbols import FrameInfo


class TracemallocCollector:
    name = "alloc"
    implementation = "python"

    def __init__(self, sample_bytes: int, max_depth: int) -> None:
        self._sample_bytes = sample_bytes
        self._max_depth = max_depth
        self._owns_tracing = False
        self._running = False
        self._previous: Dict[Any, Tuple[int, int]] = {}  # traceback -> (bytes, count) alive
        self._since_ns = time.time_ns()
        self._names = _FrameNamer()
        self._snapshots = 0
        self._filters = [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, os.path.join(_AGENT_DIR, "*")),
        ]

    def start(self) -> None:
        if not tracemalloc.is_tracing():
            tracemalloc.start(self._max_depth)
            self._owns_tracing = True
        self._running = True
        self._previous = {}
        self._since_ns = time.time_ns()

    def collect(self, final: bool = False) -> List[ProfileData]:
        if not self._running or not tracemalloc.is_tracing():
            return []
        snapshot = tracemalloc.take_snapshot().filter_traces(self._filters)
        end_ns = time.time_ns()
        self._snapshots += 1
        current: Dict[Any, Tuple[int, int]] = {}
        for stat in snapshot.statistics("traceback"):
            current[stat.traceback] = (stat.size, stat.count)
        samples = []
        for traceback, (size, count) in current.items():
            old_size, old_count = self._previous.get(traceback, (0, 0))
            values = (max(count - old_count, 0), max(size - old_size, 0), count, size)
            samples.append(StackSample(self._stack(traceback), NO_LABELS, values))
        self._previous = current
        profile = ProfileData(
            ALLOC_TYPES, ALLOC_PERIOD_TYPE, self._sample_bytes, self._since_ns, end_ns, samples
        )
        self._since_ns = end_ns
        return [profile]

    def _stack(self, traceback: Any) -> Tuple[Tuple[str, str, int, int], ...]:
        # tracemalloc orders frames oldest first; profiles want the leaf first.
        name = self._names.name
        return tuple(name(frame.filename, frame.lineno) for frame in reversed(traceback))

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        self._previous = {}
        if self._owns_tracing:
            self._owns_tracing = False
            tracemalloc.stop()

    def after_fork(self) -> None:
        # The parent's blocks are the parent's news; the child starts from nothing.
        if self._owns_tracing and tracemalloc.is_tracing():
            tracemalloc.clear_traces()
        self._previous = {}
        self._since_ns = time.time_ns()

    def stats(self) -> Dict[str, int]:
        traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
        return {
            "snapshots": self._snapshots,
            "traced_bytes": traced,
            "tracemalloc_overhead_bytes": tracemalloc.get_tracemalloc_memory(),
        }


_AGENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MAX_NAMED = 100_000


class _FrameNamer:
    """``(file, line)`` to a frame: the innermost function of a loaded module whose lines
    cover it.  Built per file from the module's functions and classes (and the functions
    nested in their code), not by reading source files."""

    def __init__(self) -> None:
        self._ranges: Dict[str, List[Tuple[int, int, str, int]]] = {}
        self._named: Dict[Tuple[str, int], FrameInfo] = {}
        self._modules_seen = -1
        self._files: Dict[str, Tuple[str, Any]] = {}  # filename -> (module name, module)

    def name(self, filename: str, line: int) -> FrameInfo:
        key = (filename, line)
        found = self._named.get(key)
        if found is not None:
            return found
        if len(self._named) > MAX_NAMED:
            self._named.clear()
            self._ranges.clear()
        module_name, ranges = self._ranges_of(filename)
        best: Optional[Tuple[int, int, str, int]] = None
        for first, last, qualname, first_line in ranges:
            if first <= line <= last and (best is None or last - first < best[1] - best[0]):
                best = (first, last, qualname, first_line)
        if best is not None:
            found = (f"{module_name}.{best[2]}", filename, line, best[3])
        else:
            found = (f"{module_name}:{line}", filename, line, 0)
        self._named[key] = found
        return found

    def _ranges_of(self, filename: str) -> Tuple[str, List[Tuple[int, int, str, int]]]:
        if len(sys.modules) != self._modules_seen:
            self._modules_seen = len(sys.modules)
            for name, module in list(sys.modules.items()):
                path = getattr(module, "__file__", None)
                if isinstance(path, str) and path not in self._files:
                    self._files[path] = (name, module)
        entry = self._files.get(filename)
        if entry is None:
            base = os.path.splitext(os.path.basename(filename))[0] or filename
            return base, []
        module_name, module = entry
        ranges = self._ranges.get(filename)
        if ranges is None:
            ranges = []
            # A module we cannot walk just has no names.
            with contextlib.suppress(Exception):
                _collect_code_ranges(module, filename, ranges)
            self._ranges[filename] = ranges
        return module_name, ranges


def _collect_code_ranges(module: Any, filename: str, out: List[Tuple[int, int, str, int]]) -> None:
    seen: Set[int] = set()
    todo: List[Tuple[Any, str]] = []
    code: Optional[types.CodeType]
    for value in list(vars(module).values()):
        todo.append((value, ""))
        if isinstance(value, type):
            todo.extend((v, "") for v in list(vars(value).values())[:1000])
    while todo and len(seen) < 20_000:
        value, qualname = todo.pop()
        if isinstance(value, types.CodeType):
            code = value
        else:
            func = getattr(value, "__func__", value)  # classmethod, staticmethod
            code = getattr(func, "__code__", None)
            qualname = getattr(func, "__qualname__", "")
        if not isinstance(code, types.CodeType) or id(code) in seen:
            continue
        seen.add(id(code))
        if code.co_filename != filename:
            continue
        qualname = qualname or getattr(code, "co_qualname", None) or code.co_name
        lines = [line for _, line in dis.findlinestarts(code) if line]
        first = code.co_firstlineno
        out.append((first, max(lines + [first]), qualname, first))
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                nested = getattr(const, "co_qualname", None)
                todo.append((const, nested or f"{qualname}.<locals>.{const.co_name}"))
