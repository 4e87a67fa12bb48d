"""Allocations and live heap, as Go's heap profile: ``alloc_objects``/``alloc_space`` (what was
allocated since the last upload) and ``inuse_objects``/``inuse_space`` (what of it is alive
now), per stack and span/tag labels.

Two implementations with one interface:

* :class:`NativeAllocCollector` (``_speedups/alloc/``): a hook on CPython's allocators that
  samples one allocation per ``alloc_sample_bytes`` bytes on average, at random (exponential)
  intervals, and scales each sample to an unbiased estimate of all allocations, as Go does.
  Each sample carries the stack and the span/trace/tag labels of the allocating thread or
  task.  Sampled allocations are tracked until freed, which gives the live heap.  Allocations
  made on a thread that does not hold the GIL (raw allocations from C code that released it)
  are not sampled: their stack cannot be read safely; ``stats()["no_gil"]`` counts them.
* :class:`TracemallocCollector` (:mod:`.alloc_tracemalloc`), the twin where the extension is not
  built, ``native=False`` or ``HOTSPAN_NO_SPEEDUPS=1``, *and* ``alloc_tracemalloc=True``
  (``HOTSPAN_ALLOC_TRACEMALLOC``) asks for it: :mod:`tracemalloc` with ``max_depth`` frames
  and a snapshot per upload.  It does not fit the agent's overhead budget, so without that
  setting the fallback takes no allocation profile (and says so once).  Its limits:

  - it traces *every* allocation: programs run markedly slower (often 2x or more on
    allocation-heavy code) and use more memory, and each snapshot walks every live block while
    holding the GIL;
  - ``inuse_*`` is exact, but ``alloc_*`` is only the growth of each stack's live bytes since
    the previous snapshot: what was allocated and freed in between is not seen;
  - no span or tag labels: tracemalloc records no context with an allocation;
  - tracemalloc knows files and lines, not functions: a frame is named ``module.qualname``
    when a function of a loaded module (or a class's method, or a function nested in them)
    covers that line, else ``module:line``.
"""

from __future__ import annotations

import time

from hotspan._speedups import load_module, load_sampler
from hotspan.agent.collectors import ALLOC_PERIOD_TYPE, ALLOC_TYPES, ProfileData, StackSample
from hotspan.agent.log import logger

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, List, Optional

    from hotspan.agent.collectors import Collector
    from hotspan.agent.config import AgentConfig


def make_collector(config: AgentConfig) -> Optional[Collector]:
    """The allocation collector for ``config``, or None when the profile is off."""
    if config.alloc_sample_bytes <= 0:
        return None
    if config.native and load_sampler() is not None:
        mod = load_module("_alloc")
        if mod is not None and mod.ready():
            return NativeAllocCollector(mod, config.alloc_sample_bytes, config.max_depth)
    if not config.alloc_tracemalloc:
        logger.info(
            "hotspan: no allocation profile: the C allocator hook is not available here, and "
            "tracemalloc (alloc_tracemalloc=True) is off because it slows programs down"
        )
        return None
    from hotspan.agent.collectors.alloc_tracemalloc import TracemallocCollector

    return TracemallocCollector(config.alloc_sample_bytes, config.max_depth)


class NativeAllocCollector:
    name = "alloc"
    implementation = "native"

    def __init__(self, mod: Any, sample_bytes: int, max_depth: int) -> None:
        self._mod = mod
        self._sample_bytes = sample_bytes
        self._max_depth = max_depth
        self._since_ns = time.time_ns()
        self._running = False
        self._inert = 0

    def start(self) -> None:
        self._mod.start(self._sample_bytes, self._max_depth)
        self._running = True
        self._since_ns = time.time_ns()

    def collect(self, final: bool = False) -> List[ProfileData]:
        if not self._running:
            return []
        rows = self._mod.collect()
        end_ns = time.time_ns()
        samples = [
            StackSample(stack, labels, (ao, asp, io, isp))
            for stack, labels, ao, asp, io, isp in rows
            if ao or asp or io or isp
        ]
        profile = ProfileData(
            ALLOC_TYPES, ALLOC_PERIOD_TYPE, self._sample_bytes, self._since_ns, end_ns, samples
        )
        self._since_ns = end_ns
        return [profile]

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        self._inert = self._mod.stop()
        if self._inert:
            logger.info(
                "hotspan: another allocator hook was installed over ours; %d domain(s) keep "
                "ours in their chain, forwarding only",
                self._inert,
            )

    def after_fork(self) -> None:
        self._mod.after_fork()
        self._since_ns = time.time_ns()

    def stats(self) -> Dict[str, int]:
        return dict(self._mod.stats())
