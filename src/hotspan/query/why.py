"""Why is this span slow: its profile beside the profile of the spans like it.

The baseline of a span is the other spans of its service with its name that started in a
window ending at its end (24 h by default), the ones nearest their median duration (so that
the slowest and the fastest do not pull the mean), at most ``baseline_spans`` of them.  Each
span, the one asked about as each baseline span, counts with its descendants: a handler's
time spent in a child span is its time too.  The span's own ancestors and descendants of that
name (a proxy's span around the same route, a recursive call) are not in its baseline: their
samples are its samples.  The store picks the baseline (:meth:`Store.baseline_spans`): the
median is over every span of that service and name in the window, however busy, and only the
chosen spans are read.

Per profile type (CPU first, then wall where stored), each function's self and total value in
the span is set beside its mean per baseline span; the functions are ranked by the extra self
value the span holds, and a diff flame graph (baseline mean on the left, the span on the
right) shows where.  The verdict says whether the span was computing or waiting: a span whose
CPU is well under its duration spent its time off-CPU (I/O, locks, sleeping), which its CPU
profile cannot explain but its wall profile can; so did one that computed no more than its
like yet took much longer, however large its CPU share.  A span whose extra time is mostly garbage
collection (the agent's ``[GC]`` frame, on CPU) was held up by the collector: "gc", whatever
its CPU share; one whose extra time is mostly waiting for the GIL (the agent's GIL-wait
profile) or for a core (its wall samples taken runnable, ``thread_state="cpu_wait"``) was
"contended", and the functions of its service that held the GIL around its time (the GIL-held
profile) are named.  The answer splits the span's time into CPU, GIL wait, CPU wait and the
rest (:class:`TimeSplit`).  Missing data is not waiting: a span without
a sample of any type is "pending" while its profiles may still be on their way (it ended
under ``PENDING_NS`` ago), "no-profile" after; a span too short for a few samples
("too-short") has too few to tell computing from waiting.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from hotspan.model.labels import Matcher, Selector
from hotspan.model.profile import ProfileType
from hotspan.model.trace import SpanRecord, StoredSpan
from hotspan.query import flamegraph
from hotspan.query.endpoints import service_selector
from hotspan.query.engine import DEFAULT_MAX_NODES, QueryEngine
from hotspan.query.traces import descendants
from hotspan.store.base import SampleFilter, StackValues, Store

CPU = ProfileType.parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
# What the hotspan agent sends for wall time (agent.outbox.WALL_TYPE under the name "wall").
WALL = ProfileType.parse("wall:wall:nanoseconds:wall:nanoseconds")
HOUR_NS = 3600 * 10**9
DEFAULT_WINDOW_NS = 24 * HOUR_NS
DEFAULT_BASELINE_SPANS = 50
DEFAULT_FUNCTIONS = 20
# CPU under this share of the duration: the span was mostly waiting.
WAITING_CPU_SHARE = 0.3
# Or this share of its extra duration off CPU (and at least WAITING_CPU_SHARE of it).
OFF_CPU_SHARE_OF_EXTRA = 0.75
# Five sampling periods at the agent's default 100 Hz: a shorter span holds a sample or two
# at most, and a CPU share read from those says nothing.
TOO_SHORT_NS = 50 * 10**6
# The agent uploads every 10 s by default: a span this recent may have samples on the way.
PENDING_NS = 15 * 10**9
# The spans of the chosen spans' traces (at most ``baseline_spans`` traces), read to find
# their descendants.
TRACE_SPANS_LIMIT = 100_000
_ANY = Selector(metric="", matchers=())
# The wall samples of threads that were runnable but had no core (the agent's thread_state).
_CPU_WAIT = Selector(metric="", matchers=(Matcher("thread_state", "=", "cpu_wait"),))

# What the hotspan agent sends for the GIL (agent.outbox.GIL_WAIT_TYPE, GIL_HELD_TYPE): the time
# threads waited for it, on their stacks, and the same time on the stacks that held it.
GIL_WAIT = ProfileType.parse("gil_wait:gil_wait:nanoseconds:wall:nanoseconds")
GIL_HELD = ProfileType.parse("gil_held:gil_held:nanoseconds:wall:nanoseconds")
VERDICTS = (
    "gc",
    "contended",
    "computing",
    "waiting",
    "too-short",
    "pending",
    "no-profile",
    "no-baseline",
)
# The frame the hotspan agent ends a sample taken during a garbage collection in.
GC_FRAME = "[GC]"
# The share of a span's extra duration that its extra time in garbage collections must account
# for to be the verdict: then the collector, not the code, is what the span waited for.
GC_SHARE_OF_EXTRA = 0.5
# Likewise for its extra time waiting for the GIL or for a core, for the verdict "contended".
CONTENDED_SHARE_OF_EXTRA = 0.5
# Samples are stamped with the start of their upload window (the agent's is 10 s): the GIL
# held while a span waited is in the windows that began up to this long before it.
UPLOAD_WINDOW_NS = 10 * 10**9
GIL_HOLDERS = 5
# Code objects Python makes for an expression inside a function: their time is the
# function's (a slow ``sum(x * x for x in rows)`` must name the function, not ``<genexpr>``).
_INLINE_CODE = ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>")


class SpanNotFound(LookupError):
    """The trace, or the span in it, is not stored."""


@dataclass(frozen=True)
class Baseline:
    spans: Tuple[SpanRecord, ...]  # the chosen spans like the one asked about
    start_ns: int  # the earliest start among them (the window's start if none)
    end_ns: int  # the latest end among them (the window's end if none)
    mean_duration_ns: int
    median_duration_ns: int
    span_ids: Tuple[int, ...]  # the chosen spans and their descendants
    trace_ids: Tuple[str, ...]


@dataclass(frozen=True)
class Delta:
    span: int  # in the span (with its descendants)
    baseline: float  # mean per baseline span

    @property
    def extra(self) -> float:
        return self.span - self.baseline


@dataclass(frozen=True)
class FunctionDelta:
    name: str
    self_value: Delta
    total: Delta
    # Of the span's extra duration, what this function's extra self value accounts for
    # (0..1); None for types that are not time, or a span no slower than its baseline.
    share_of_extra_duration: Optional[float]


@dataclass(frozen=True)
class ProfileComparison:
    profile_type: ProfileType
    value: Delta
    functions: Tuple[FunctionDelta, ...]  # the largest extra self value first
    # Left: the baseline's mean per span, each stack rounded to whole units but at least 1 if
    # it has any (a count type's rare stacks must not vanish); right: the span.
    flamegraph: flamegraph.FlameGraph


@dataclass(frozen=True)
class GilHolder:
    """A function of the span's service that held the GIL while threads waited for it, around
    the span's time: the waiting it caused, in nanoseconds."""

    name: str
    value: int


@dataclass(frozen=True)
class TimeSplit:
    """Where a span's time went, in nanoseconds, its descendants' samples included: on CPU,
    waiting for the GIL, runnable but waiting for a core, and the rest of its duration (off
    CPU: asleep, in I/O, waiting for a lock or another service; under asyncio, other tasks'
    turns)."""

    duration: int
    cpu: int
    gil_wait: int
    cpu_wait: int

    @property
    def other(self) -> int:
        return max(0, self.duration - self.cpu - self.gil_wait - self.cpu_wait)


@dataclass(frozen=True)
class WhyAnswer:
    trace_id: str
    span: StoredSpan
    window_ns: int
    baseline: Baseline
    profiles: Tuple[ProfileComparison, ...]
    verdict: str
    summary: str
    # Where the span waited for the GIL: who held it meanwhile, the most waiting first, and
    # the time range (ns) they were read from.
    gil_holders: Tuple[GilHolder, ...] = ()
    gil_range: Tuple[int, int] = (0, 0)
    # Its time waiting for a core, beside its baseline's (None: no wall samples say).
    cpu_wait: Optional[Delta] = None
    split: Optional[TimeSplit] = None

    @property
    def extra_duration_ns(self) -> int:
        """The span's duration beyond its baseline's mean (0 without a baseline)."""
        if not self.baseline.spans:
            return 0
        return self.span.duration_ns - self.baseline.mean_duration_ns

    def profile(self, ptype: ProfileType) -> Optional[ProfileComparison]:
        return next((p for p in self.profiles if p.profile_type == ptype), None)


def ancestors(spans: Sequence[StoredSpan], span: StoredSpan) -> Set[int]:
    """The ids of the spans above ``span`` in its trace."""
    parents = {s.span_id: s.parent_span_id for s in spans}
    out: Set[int] = set()
    parent = span.parent_span_id
    while parent in parents and parent not in out:  # a cycle in bad data must not loop
        out.add(parent)
        parent = parents[parent]
    return out


def pick_span(spans: Sequence[StoredSpan], span_id: Optional[int]) -> StoredSpan:
    """The span asked for, or the trace's root: the earliest span without a parent in the
    trace (the longest of those starting together)."""
    if span_id is not None:
        for span in spans:
            if span.span_id == span_id:
                return span
        raise SpanNotFound(f"span {span_id:016x} is not in the trace")
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id not in ids] or list(spans)
    return min(roots, key=lambda s: (s.start_ns, -s.end_ns, s.span_id))


def per_function(engine: QueryEngine, values: StackValues) -> Tuple[np.ndarray, np.ndarray]:
    """Self and total value per name index (into ``engine.stacks.names``).  A function
    counts once per stack in its total, however often it recurses there."""
    matrix, lengths, vals = engine.name_matrix(values)
    keep = lengths > 0
    matrix, lengths, vals = matrix[keep], lengths[keep], vals[keep].astype(np.float64)
    if len(vals) == 0:
        return np.zeros(0), np.zeros(0)
    size = int(matrix.max()) + 1
    leaves = matrix[np.arange(len(lengths)), _self_positions(engine, matrix, lengths, size)]
    self_values = np.bincount(leaves, weights=vals, minlength=size)
    rows, cols = np.nonzero(matrix >= 0)
    pairs = np.unique(rows.astype(np.int64) * size + matrix[rows, cols])
    total = np.bincount(pairs % size, weights=vals[pairs // size], minlength=size)
    return self_values, total


def _self_positions(
    engine: QueryEngine, matrix: np.ndarray, lengths: np.ndarray, size: int
) -> np.ndarray:
    """Per stack, the depth its self time belongs to: the leaf, or the nearest frame above
    it that is not a comprehension, generator expression or lambda."""
    valid = matrix >= 0
    inline = np.zeros(size, dtype=bool)
    names = engine.stacks.names
    for idx in np.unique(matrix[valid]).tolist():
        inline[idx] = names[idx].rsplit(".", 1)[-1] in _INLINE_CODE
    named = valid & ~inline[np.where(valid, matrix, 0)]
    from_leaf = named[:, ::-1]
    last_named = matrix.shape[1] - 1 - from_leaf.argmax(axis=1)
    return np.where(from_leaf.any(axis=1), last_named, lengths - 1)


def _pad(a: np.ndarray, size: int) -> np.ndarray:
    return np.concatenate([a, np.zeros(size - len(a))]) if len(a) < size else a


class WhyEngine:
    def __init__(self, store: Store, engine: QueryEngine) -> None:
        self.store = store
        self.engine = engine

    def explain(
        self,
        tenant: str,
        trace_id: str,
        span_id: Optional[int] = None,
        profile_type: Optional[ProfileType] = None,
        window_ns: int = DEFAULT_WINDOW_NS,
        baseline_spans: int = DEFAULT_BASELINE_SPANS,
        limit: int = DEFAULT_FUNCTIONS,
        max_nodes: Optional[int] = DEFAULT_MAX_NODES,
    ) -> WhyAnswer:
        """Compares a span (by default the trace's root) with its baseline, for
        ``profile_type`` (CPU if None) and then CPU and wall, those stored for it.
        SpanNotFound when the trace or the span is unknown."""
        spans = self.store.trace(tenant, trace_id)
        if not spans:
            raise SpanNotFound("trace not found")
        span = pick_span(spans, span_id)
        span_ids = descendants(spans, [span.span_id])
        nested = span_ids | ancestors(spans, span)
        baseline = self.baseline(tenant, span, trace_id, nested, window_ns, baseline_spans)
        types: List[ProfileType] = []
        for ptype in (profile_type or CPU, CPU, WALL, GIL_WAIT):
            if ptype not in types:
                types.append(ptype)
        profiles = []
        for ptype in types:
            found = self.compare(
                tenant, ptype, span, trace_id, span_ids, baseline, limit, max_nodes
            )
            if found is not None:
                profiles.append(found)
        waited = next((p for p in profiles if p.profile_type == GIL_WAIT), None)
        gil_range = (span.start_ns - UPLOAD_WINDOW_NS, span.end_ns)
        holders: Tuple[GilHolder, ...] = ()
        if waited is not None and waited.value.span > 0:
            holders = self.gil_holders(tenant, span.service, *gil_range, trace_id, span_ids)
        cpu_wait = None
        if any(p.profile_type == WALL for p in profiles):
            cpu_wait = self.values(tenant, WALL, _CPU_WAIT, span, trace_id, span_ids, baseline)
        cpu = next((p for p in profiles if p.profile_type == CPU), None)
        split = None
        if cpu is not None or waited is not None:
            split = TimeSplit(
                span.duration_ns,
                cpu.value.span if cpu is not None else 0,
                waited.value.span if waited is not None else 0,
                cpu_wait.span if cpu_wait is not None else 0,
            )
        verdict, summary = _verdict(
            span, baseline, profiles, window_ns, time.time_ns(), holders, cpu_wait
        )
        return WhyAnswer(
            trace_id,
            span,
            window_ns,
            baseline,
            tuple(profiles),
            verdict,
            summary,
            holders,
            gil_range if holders else (0, 0),
            cpu_wait,
            split,
        )

    def gil_holders(
        self,
        tenant: str,
        service: str,
        start_ns: int,
        end_ns: int,
        trace_id: str,
        span_ids: Set[int],
    ) -> Tuple[GilHolder, ...]:
        """The functions of ``service`` that held the GIL while others waited, between the two
        times (samples' stamps), by the waiting they caused; but for what the span itself
        (``span_ids``, of ``trace_id``) held: threads that take turns at the GIL wait for each
        other, and the span's own code is not what held it up."""
        selector = service_selector(service)
        held = self.engine.stack_values(tenant, GIL_HELD, selector, SampleFilter(start_ns, end_ns))
        if not held.values.any():
            return ()
        own = self.engine.stack_values(
            tenant,
            GIL_HELD,
            selector,
            SampleFilter(
                start_ns,
                end_ns,
                span_ids=sorted(span_ids),
                trace_ids=[trace_id],
                trace_span_ids=sorted(span_ids),
            ),
        )
        all_self, _ = per_function(self.engine, held)
        own_self, _ = per_function(self.engine, own)
        size = max(len(all_self), len(own_self))
        self_values = _pad(all_self, size) - _pad(own_self, size)
        order = np.argsort(-self_values, kind="stable")[:GIL_HOLDERS]
        names = self.engine.stacks.names
        return tuple(
            GilHolder(names[i], int(self_values[i])) for i in order.tolist() if self_values[i] > 0
        )

    def baseline(
        self,
        tenant: str,
        span: StoredSpan,
        trace_id: str,
        nested: Set[int],
        window_ns: int,
        cap: int,
    ) -> Baseline:
        """``nested``: the span, its ancestors and its descendants (in ``trace_id``), which
        share its samples and so are no baseline for it."""
        start = max(span.end_ns - window_ns, 0)
        chosen = self.store.baseline_spans(
            tenant,
            span.service,
            span.name,
            start,
            span.end_ns,
            cap,
            exclude_trace=trace_id,
            exclude_span_ids=sorted(nested),
        ).spans
        if not chosen:
            return Baseline((), start, span.end_ns, 0, 0, (), ())
        traces = sorted({s.trace_id for s in chosen})
        # One query for every span of the chosen spans' traces: their descendants are there.
        # Children start after their parent; an hour more keeps late follow-ups.
        rows = self.store.span_infos(
            tenant, start, span.end_ns + HOUR_NS, trace_ids=traces, limit=TRACE_SPANS_LIMIT
        )
        by_trace: Dict[str, List[SpanRecord]] = {}
        for row in rows:
            by_trace.setdefault(row.trace_id, []).append(row)
        ids: Set[int] = set()
        for trace in traces:
            roots = [s.span_id for s in chosen if s.trace_id == trace]
            ids |= descendants(by_trace.get(trace, []), roots)
        durations = [s.end_ns - s.start_ns for s in chosen]
        return Baseline(
            tuple(chosen),
            min(s.start_ns for s in chosen),
            max(s.end_ns for s in chosen),
            round(sum(durations) / len(durations)),
            round(statistics.median(durations)),
            tuple(sorted(ids)),
            tuple(traces),
        )

    def compare(
        self,
        tenant: str,
        ptype: ProfileType,
        span: StoredSpan,
        trace_id: str,
        span_ids: Set[int],
        baseline: Baseline,
        limit: int,
        max_nodes: Optional[int],
    ) -> Optional[ProfileComparison]:
        """The span beside its baseline in one profile type; None when neither holds a
        sample of it (the type is not stored for them)."""
        mine, theirs = self._stacks(tenant, ptype, _ANY, span, trace_id, span_ids, baseline)
        if not mine.values.any() and not theirs.values.any():
            return None
        n = max(len(baseline.spans), 1)
        value = _total_delta(mine, theirs, n)
        functions = self._functions(mine, theirs, n, ptype, span, baseline, limit)
        means = np.rint(theirs.values / n).astype(np.int64)
        mean = StackValues(theirs.stack_ids, np.where(theirs.values > 0, np.maximum(means, 1), 0))
        graph = self.engine.diff(mean, mine, max_nodes)
        return ProfileComparison(ptype, value, functions, graph)

    def _stacks(
        self,
        tenant: str,
        ptype: ProfileType,
        selector: Selector,
        span: StoredSpan,
        trace_id: str,
        span_ids: Set[int],
        baseline: Baseline,
    ) -> Tuple[StackValues, StackValues]:
        """The samples of the span (and its descendants), and of its baseline spans."""
        # Samples are stamped with the start of their upload window: it may begin before the
        # span, and end after it.
        mine = self.engine.stack_values(
            tenant,
            ptype,
            selector,
            SampleFilter(
                span.start_ns - HOUR_NS,
                span.end_ns + HOUR_NS,
                span_ids=sorted(span_ids),
                trace_ids=[trace_id],
                trace_span_ids=sorted(span_ids),
            ),
        )
        theirs = StackValues.empty()
        if baseline.spans:
            theirs = self.engine.stack_values(
                tenant,
                ptype,
                selector,
                SampleFilter(
                    baseline.start_ns - HOUR_NS,
                    baseline.end_ns + HOUR_NS,
                    span_ids=list(baseline.span_ids),
                    trace_ids=list(baseline.trace_ids),
                    trace_span_ids=list(baseline.span_ids),
                ),
            )
        return mine, theirs

    def values(
        self,
        tenant: str,
        ptype: ProfileType,
        selector: Selector,
        span: StoredSpan,
        trace_id: str,
        span_ids: Set[int],
        baseline: Baseline,
    ) -> Delta:
        """The span's total of the samples ``selector`` picks, beside its baseline's mean."""
        mine, theirs = self._stacks(tenant, ptype, selector, span, trace_id, span_ids, baseline)
        return _total_delta(mine, theirs, max(len(baseline.spans), 1))

    def _functions(
        self,
        mine: StackValues,
        theirs: StackValues,
        n: int,
        ptype: ProfileType,
        span: StoredSpan,
        baseline: Baseline,
        limit: int,
    ) -> Tuple[FunctionDelta, ...]:
        my_self, my_total = per_function(self.engine, mine)
        their_self, their_total = per_function(self.engine, theirs)
        size = max(len(my_self), len(their_self))
        my_self, my_total = _pad(my_self, size), _pad(my_total, size)
        their_self, their_total = _pad(their_self / n, size), _pad(their_total / n, size)
        present = np.nonzero((my_total > 0) | (their_total > 0))[0]
        extra_self = my_self[present] - their_self[present]
        extra_total = my_total[present] - their_total[present]
        # Largest extra self first; then by extra total, then by index (stable answers).
        order = np.lexsort((present, -extra_total, -extra_self))[:limit]
        extra_ns = span.duration_ns - baseline.mean_duration_ns if baseline.spans else 0
        is_time = ptype.sample_unit == "nanoseconds"
        names = self.engine.stacks.names
        out = []
        for i in present[order].tolist():
            self_delta = Delta(int(my_self[i]), float(their_self[i]))
            share = None
            if is_time and extra_ns > 0:
                share = min(max(self_delta.extra / extra_ns, 0.0), 1.0)
            out.append(
                FunctionDelta(
                    names[i], self_delta, Delta(int(my_total[i]), float(their_total[i])), share
                )
            )
        return tuple(out)


def _total_delta(mine: StackValues, theirs: StackValues, n: int) -> Delta:
    """The span's total beside the mean of its ``n`` baseline spans."""
    return Delta(int(mine.values.sum()), float(theirs.values.sum()) / n)


def duration_text(ns: float) -> str:
    """``1.2 s``, ``35 ms``, ``800 µs``: a duration as people read it."""
    for size, unit in ((3600e9, "h"), (60e9, "min"), (1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= size:
            return f"{_short(ns / size)} {unit}"
    return f"{ns:.0f} ns"


def _short(x: float) -> str:
    digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{x:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{x:.0f}"


def _top_extra(profile: Optional[ProfileComparison]) -> str:
    if profile is None or not profile.functions or profile.functions[0].self_value.extra <= 0:
        return ""
    top = profile.functions[0]
    kind = "CPU" if profile.profile_type == CPU else profile.profile_type.sample_type
    amount = (
        duration_text(top.self_value.extra)
        if profile.profile_type.sample_unit == "nanoseconds"
        else f"{top.self_value.extra:.4g} {profile.profile_type.sample_unit}"
    )
    return f"; the most extra {kind} is in {top.name} (+{amount} per request)"


def _verdict(
    span: StoredSpan,
    baseline: Baseline,
    profiles: Sequence[ProfileComparison],
    window_ns: int,
    now_ns: int,
    holders: Sequence[GilHolder] = (),
    cpu_wait: Optional[Delta] = None,
) -> Tuple[str, str]:
    duration = span.duration_ns
    head = f"{span.service} {span.name} took {duration_text(duration)}"
    if baseline.spans:
        extra = duration - baseline.mean_duration_ns
        more = "more" if extra >= 0 else "less"
        like = "span" if len(baseline.spans) == 1 else "spans"
        head += (
            f", {duration_text(abs(extra))} {more} than the mean of {len(baseline.spans)} "
            f"{like} like it (median {duration_text(baseline.median_duration_ns)})"
        )
    if not any(p.value.span for p in profiles):
        if now_ns - span.end_ns < PENDING_NS:
            return "pending", (
                f"{head}; no profile holds samples of it yet: it ended "
                f"{duration_text(max(now_ns - span.end_ns, 0))} ago, and its samples may still "
                "be on their way (ask again in a few seconds)"
            )
        return "no-profile", f"{head}; no profile holds samples of it"
    cpu = next((p for p in profiles if p.profile_type == CPU), None)
    wall = next((p for p in profiles if p.profile_type == WALL), None)
    short = duration < TOO_SHORT_NS
    # A short span that slept may well hold no CPU sample, nor may its like: that is no sign
    # of a missing CPU profile.
    if cpu is None and not short:
        return "no-profile", head + "; no CPU profile holds samples of it or of spans like it"
    cpu_span = cpu.value.span if cpu is not None else 0
    cpu_text = "it holds no CPU samples"
    if cpu is not None:
        cpu_text = f"its CPU is {duration_text(cpu_span)}"
    if not baseline.spans:
        window = duration_text(window_ns)
        return "no-baseline", (
            f"{head}; no other {span.service} span named {span.name!r} started in the "
            f"{window} before it to compare with; {cpu_text}"
        )
    # Even with a sample: one 10 ms sample in a 30 ms span is a third of it, whether the span
    # computed throughout or the sample's period ended just as it began.
    if short:
        return "too-short", (
            f"{head}; {cpu_text}, but it is too short to tell computing from waiting: it "
            "spans fewer than 5 sampling periods at 100 Hz"
        )
    # Samples come with the agent's uploads (every 10 s by default): a span that ended moments
    # ago may hold only part of its samples yet, and a verdict drawn from them would be about
    # part of its time ("waiting", for the part not uploaded).
    if now_ns - span.end_ns < PENDING_NS and wall is not None and wall.value.span < duration / 2:
        return "pending", (
            f"{head}; {cpu_text}, but its wall profile holds only "
            f"{duration_text(wall.value.span)} of it yet: it ended "
            f"{duration_text(max(now_ns - span.end_ns, 0))} ago, and the rest of its samples may "
            "still be on their way (ask again in a few seconds)"
        )
    # The collector's extra time, on CPU or, where a busy machine kept it waiting for a core
    # meanwhile, in wall time (the wall profile samples the collecting thread either way).
    gcs = [
        f
        for p in (cpu, wall)
        if p is not None
        for f in p.functions
        if f.name == GC_FRAME and f.share_of_extra_duration is not None
    ]
    gc = max(gcs, key=lambda f: f.share_of_extra_duration or 0.0, default=None)
    if gc is not None and (gc.share_of_extra_duration or 0.0) >= GC_SHARE_OF_EXTRA:
        return "gc", (
            f"{head}; {cpu_text}; garbage collection took {duration_text(gc.self_value.span)} "
            f"of it, {duration_text(gc.self_value.extra)} more than in spans like it "
            f"({gc.share_of_extra_duration:.0%} of the extra time): it was "
            "collecting garbage (the [GC] frame; what ran under it made the objects)"
        )
    waited = next((p for p in profiles if p.profile_type == GIL_WAIT), None)
    extra_ns = duration - baseline.mean_duration_ns
    gil_extra = max(waited.value.extra, 0.0) if waited is not None else 0.0
    core_extra = max(cpu_wait.extra, 0.0) if cpu_wait is not None else 0.0
    if extra_ns > 0 and gil_extra + core_extra >= CONTENDED_SHARE_OF_EXTRA * extra_ns:
        gil_ns = waited.value.span if waited is not None else 0
        core_ns = cpu_wait.span if cpu_wait is not None else 0
        waits = [f"{duration_text(gil_ns)} for the GIL"] if gil_ns else []
        waits += [f"{duration_text(core_ns)} for a core"] if core_ns else []
        if gil_extra >= 3 * core_extra:
            held = "other threads held the GIL"
        elif core_extra >= 3 * gil_extra:
            held = (
                "other threads or processes had every core (more busy threads than cores, "
                "or a CPU quota spent)"
            )
        else:
            held = "other threads held the GIL or had every core"
        by = ", ".join(f"{h.name} ({duration_text(h.value)})" for h in holders[:3])
        return "contended", (
            f"{head}; {cpu_text}, and it waited {' and '.join(waits)}, "
            f"{duration_text(gil_extra + core_extra)} more than spans like it "
            f"({min((gil_extra + core_extra) / extra_ns, 1.0):.0%} of the extra time): it was "
            f"contended, runnable while {held}"
            + (f"; the GIL was held meanwhile most by {by}" if by and gil_ns else "")
        )
    # A span that computes about as much as its like but took much longer was not slowed by
    # its computing, however large a share of it its CPU is: its extra time was spent off CPU.
    # (One that computed more on a loaded machine, stretched threefold, still computed.)
    off_cpu_extra = extra_ns - (cpu.value.extra if cpu is not None else 0.0)
    slowed_off_cpu = extra_ns > 0 and off_cpu_extra >= max(
        OFF_CPU_SHARE_OF_EXTRA * extra_ns, WAITING_CPU_SHARE * duration
    )
    if cpu_span >= WAITING_CPU_SHARE * duration and not slowed_off_cpu:
        return "computing", f"{head}; {cpu_text}: it was computing{_top_extra(cpu)}"
    text = f"{head}; {cpu_text}: it was waiting"
    if cpu_span >= WAITING_CPU_SHARE * duration:
        text = (
            f"{head}; {cpu_text}, {duration_text(off_cpu_extra)} of the extra time off CPU: "
            "it computed no more than spans like it, and was waiting"
        )
    # The wall profile samples the span's thread whether on CPU or not: when it holds little
    # of the span, part of the time was spent where no thread of it was sampled (an awaiting
    # coroutine, another process) or its samples are missing.  Say so rather than guess.
    if wall is not None and wall.value.span < duration / 2:
        text += (
            f" (its wall profile holds only {duration_text(wall.value.span)} of it: the rest "
            "was not spent on a sampled thread, or its samples are missing)"
        )
    return "waiting", text + _top_extra(wall)
