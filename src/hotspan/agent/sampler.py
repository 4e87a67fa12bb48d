"""Taking samples: CPU and wall time of every thread, with the labels of its context.

Two implementations with one interface.  :class:`NativeSampler` (C, ``_speedups/sampler.c``)
takes CPU samples on each thread's own CPU timer and reads span labels per thread and per
asyncio task.  :class:`PythonSampler` is the fallback wherever the extension is not built:
it looks at ``sys._current_frames()`` each tick and charges each thread's CPU-clock delta to
the stack it sees, which is biased towards where a thread waits (it sees busy threads only
when they let the GIL go), and its span labels are per thread.
"""

from __future__ import annotations

import struct
import sys
import threading
import time
from typing import Any, Dict, List, NamedTuple, Tuple

from hotspan._speedups import load_sampler
from hotspan.agent.context import (
    THREAD_LABELS,
    enable_native_labels,
    keep_thread_labels,
    labels_tuple,
)

CPU, WALL = 0, 1

LabelsTuple = Tuple[int, int, int, int, int]  # span, trace hi, trace lo, root span, tag set
RawStack = Tuple[Tuple[Any, int], ...]  # (code object or None, byte offset), leaf first


class RawSample(NamedTuple):
    kind: int
    thread_ident: int
    labels: LabelsTuple
    stack: RawStack
    value: int  # nanoseconds


class Collected(NamedTuple):
    samples: List[RawSample]
    dropped: int  # CPU samples lost because the ring was full
    keepalive: Any  # holds the code objects of ``samples`` until they are named


class NativeSampler:
    name = "native"

    def __init__(self, sample_rate: int, max_depth: int, cpu: bool, wall: bool = True) -> None:
        self._mod = load_sampler()
        if self._mod is None:
            raise RuntimeError("the native sampler is not built")
        self._interval_ns = 1_000_000_000 // sample_rate
        self._max_depth = max_depth
        self._cpu = cpu
        self._wall = wall
        self.native_cpu = False
        self.labels = False
        self._unpack = struct.Struct("=QII").iter_unpack

    def start(self) -> None:
        self.labels = enable_native_labels()
        self.native_cpu = bool(
            self._mod.start(self._interval_ns, self._max_depth, self._cpu, self._wall)
        )

    def exclude(self, ident: int) -> None:
        self._mod.exclude(ident)

    def tick(self, wall_ns: int) -> None:
        self._mod.tick(wall_ns)

    def collect(self, release: bool = False) -> Collected:
        samples, codes, dropped = self._mod.collect(release)
        by_address = {id(code): code for code in codes}
        out = []
        stacks: Dict[bytes, RawStack] = {}
        for (kind, ident, *labels, frames), value in samples.items():
            stack = stacks.get(frames)
            if stack is None:
                stack = tuple(
                    (by_address.get(address), lasti) for address, lasti, _ in self._unpack(frames)
                )
                stacks[frames] = stack
            out.append(RawSample(kind, ident, tuple(labels), stack, value))
        return Collected(out, dropped, codes)

    def stop(self) -> None:
        self._mod.stop()

    def after_fork(self) -> None:
        self._mod.after_fork()


class PythonSampler:
    name = "python"

    def __init__(self, sample_rate: int, max_depth: int, cpu: bool, wall: bool = True) -> None:
        self._max_depth = max_depth
        self._cpu = cpu and hasattr(time, "pthread_getcpuclockid")
        self._excluded: set = set()
        self._cpu_seen: Dict[int, int] = {}
        self._aggregate: Dict[Tuple[int, int, LabelsTuple, RawStack], int] = {}
        self._lock = threading.Lock()
        self._ticks = 0
        self.native_cpu = False
        self.labels = True

    def start(self) -> None:
        keep_thread_labels()

    def exclude(self, ident: int) -> None:
        self._excluded.add(ident)

    def tick(self, wall_ns: int) -> None:
        frames = sys._current_frames()
        cpu_now: Dict[int, int] = {}
        with self._lock:
            aggregate = self._aggregate
            for ident, frame in frames.items():
                if ident in self._excluded:
                    continue
                stack = self._stack(frame)
                current = THREAD_LABELS.get(ident)
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
            self._cpu_seen = cpu_now
            self._ticks += 1
            if self._ticks % 1000 == 0:
                # Threads that ended leave their labels behind; drop them now and then.
                for ident in [i for i in list(THREAD_LABELS) if i not in frames]:
                    THREAD_LABELS.pop(ident, None)
        del frames

    def _cpu_delta(self, ident: int, cpu_now: Dict[int, int]) -> int:
        try:
            now = time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
        except (OSError, OverflowError):
            return 0
        cpu_now[ident] = now
        before = self._cpu_seen.get(ident)
        return now - before if before is not None else 0

    def _stack(self, frame: Any) -> RawStack:
        out = []
        while frame is not None and len(out) < self._max_depth:
            out.append((frame.f_code, frame.f_lasti))  # frame.f_lasti is in bytes on 3.9+
            frame = frame.f_back
        return tuple(out)

    def collect(self, release: bool = False) -> Collected:
        with self._lock:
            aggregate, self._aggregate = self._aggregate, {}
        samples = [
            RawSample(kind, ident, labels, stack, value)
            for (kind, ident, labels, stack), value in aggregate.items()
        ]
        return Collected(samples, 0, None)

    def stop(self) -> None:
        pass

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._aggregate = {}
        self._cpu_seen = {}
        self._excluded = set()


def make_sampler(sample_rate: int, max_depth: int, cpu: bool, wall: bool, native: bool) -> Any:
    if native and load_sampler() is not None:
        return NativeSampler(sample_rate, max_depth, cpu, wall)
    return PythonSampler(sample_rate, max_depth, cpu, wall)
