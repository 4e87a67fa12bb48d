"""Collectors of the profiles other than CPU and wall: allocations and live heap, lock
contention, threads and tasks.

Each collector is one concept in one module, with a native implementation (a C module in
``hotspan._speedups``) where the hot path needs it and a pure-Python twin with the same
interface, as the CPU/wall sampler (:mod:`hotspan.agent.sampler`) has.  The agent's core only
schedules them (``collect`` once per upload interval, on the agent's own thread) and encodes
what they return as pprof; it knows nothing of how they collect.

A collector never raises into the program, never calls into Python from a place where the
program did not expect it (an allocator hook, a signal handler), and bounds its memory: what
it cannot keep it counts in :meth:`Collector.stats`.
"""

from __future__ import annotations

from hotspan._speedups import load_module

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, Dict, List, Protocol, Tuple

    LabelsTuple = Tuple[int, int, int, int, int]  # span, trace hi, trace lo, root span, tag set
    # A frame as a collector gives it, leaf first: a (code object or None, byte offset) pair,
    # which the agent names, or an already named FrameInfo (name, filename, line, first line)
    # for collectors that have no code object (tracemalloc knows files and lines only).
    RawFrame = Tuple[Any, ...]

NO_LABELS: LabelsTuple = (0, 0, 0, 0, 0)

# Plain classes with __slots__, not namedtuples: see RawSample in agent/samples.py.


class StackSample:
    """One sample, with one value per sample type of its profile, in their order.

    ``stack``: Tuple[RawFrame, ...], leaf first; ``labels``: LabelsTuple; ``values``:
    Tuple[int, ...]; ``thread_ident``: 0 when not a thread's (an asyncio task's, an
    allocation's)."""

    __slots__ = ("stack", "labels", "values", "thread_ident")

    def __init__(
        self, stack: Tuple[RawFrame, ...], labels: LabelsTuple, values: Any, thread_ident: int = 0
    ) -> None:
        self.stack = stack
        self.labels = labels
        self.values = values
        self.thread_ident = thread_ident


class ProfileData:
    """One pprof profile, in Go's shapes, so Pyroscope and Grafana name and scale it.

    ``sample_types``: ((type, unit), ...); ``period_type``: (type, unit); ``start_ns``,
    ``end_ns``: wall clock; ``samples``: List[StackSample]; ``keepalive``: whatever keeps the
    samples' code objects alive until they are named."""

    __slots__ = (
        "sample_types",
        "period_type",
        "period",
        "start_ns",
        "end_ns",
        "samples",
        "keepalive",
    )

    def __init__(
        self,
        sample_types: Tuple[Tuple[str, str], ...],
        period_type: Tuple[str, str],
        period: int,
        start_ns: int,
        end_ns: int,
        samples: List[StackSample],
        keepalive: Any = None,
    ) -> None:
        self.sample_types = sample_types
        self.period_type = period_type
        self.period = period
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.samples = samples
        self.keepalive = keepalive


def alloc_exclusion() -> Callable[[], None]:
    """What each of the agent's own threads calls first: their allocations (encoding,
    uploading) are the agent's, not the program's, and are never sampled.  Looked up by the
    thread that starts it, so that the new thread allocates nothing before the call (a lookup
    there, with its strings, was sampled now and then as the program's).  Here rather than in
    :mod:`.alloc`, which the agent imports only when it takes that profile (off by default)."""
    mod = load_module("_alloc")
    return mod.exclude_thread if mod is not None else _nothing


def _nothing() -> None:
    pass


# Go's sample types, so the server (and Pyroscope) derive memory/mutex/goroutines names.
ALLOC_TYPES = (
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
)
ALLOC_PERIOD_TYPE = ("space", "bytes")
LOCK_TYPES = (("contentions", "count"), ("delay", "nanoseconds"))
LOCK_PERIOD_TYPE = ("contentions", "count")
THREAD_TYPES = (("goroutine", "count"),)
THREAD_PERIOD_TYPE = ("goroutine", "count")


# A protocol for type checkers only: collectors do not subclass it, and at run time it would
# be one more class, with its methods, for the program's GC to walk.
if TYPE_CHECKING:

    class Collector(Protocol):
        """What the agent's core expects of a collector (collectors need not subclass it)."""

        name: str  # "alloc", "locks", "threads"
        implementation: str  # "native" or "python"

        def start(self) -> None:
            """Begin collecting (on the thread that configures the agent, with the GIL)."""

        def collect(self, final: bool = False) -> List[ProfileData]:
            """The profiles of the time since the last call; ``final`` at shutdown."""

        # Optional, so not a member: look(self) -> None, called on every wake of the
        # agent's loop (a few times a second at most), for a collector that takes snapshots
        # between its collects.

        def stop(self) -> None:
            """Stop collecting and undo every hook; safe to call twice."""

        def after_fork(self) -> None:
            """In a forked child: drop the parent's data, keep collecting for the child."""

        def stats(self) -> Dict[str, int]:
            """Own counts (samples taken, lost, ...), shown in ``Agent.sampler_stats``."""
