"""Trace questions on top of the store: span descendants, CPU per span.

The link between the halves is the span id each profile sample carries: a span's profile is
the samples with its id, its descendants' profile adds the ids of every span below it in its
trace, and a trace's profile is the samples with its trace id, and those with only the id of
one of its stored spans (Pyroscope's SDKs label samples with ``span_id`` alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import numpy as np

from hotspan.model.labels import Selector
from hotspan.model.profile import ProfileType
from hotspan.model.trace import SpanRecord, StoredSpan
from hotspan.query.engine import QueryEngine
from hotspan.store.base import SampleFilter, Store

# Samples are stamped with the start of their upload window, which may begin before the span.
SPAN_SLACK_NS = 3600 * 10**9
# The spans looked up for trace_totals' samples that carry only a span id.
MAX_TRACE_SPANS = 200_000


def descendants(spans: Iterable[Union[StoredSpan, SpanRecord]], roots: Iterable[int]) -> Set[int]:
    """The given span ids and every span below them."""
    children: Dict[int, List[int]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id, []).append(span.span_id)
    out: Set[int] = set()
    todo = list(roots)
    while todo:
        sid = todo.pop()
        if sid in out:
            continue  # a cycle in bad data must not loop forever
        out.add(sid)
        todo.extend(children.get(sid, ()))
    return out


@dataclass(frozen=True)
class SpanCPU:
    span: StoredSpan
    self_value: int  # samples with this span's id
    total_value: int  # this span's and its descendants'


@dataclass(frozen=True)
class TraceCPU:
    trace_id: str
    profile_type: ProfileType
    spans: Tuple[SpanCPU, ...]
    # Samples of the trace whose span id is no stored span of it (or no span at all).
    unattributed: int
    total: int


class TraceEngine:
    def __init__(self, store: Store, engine: QueryEngine) -> None:
        self.store = store
        self.engine = engine

    def with_descendants(self, tenant: str, span_ids: Sequence[int]) -> List[int]:
        """The span ids and their descendants in their traces (as stored so far)."""
        traces = self.store.span_traces(tenant, span_ids)
        out: Set[int] = set(span_ids)
        for trace_id in set(traces.values()):
            spans = self.store.trace(tenant, trace_id)
            mine = [s for s in span_ids if traces.get(s) == trace_id]
            out |= descendants(spans, mine)
        return sorted(out)

    def trace_cpu(
        self,
        tenant: str,
        trace_id: str,
        profile_type: ProfileType,
        selector: Selector,
        window: Optional[Tuple[int, int]] = None,
    ) -> Optional[TraceCPU]:
        """How much of the profile each span of a trace holds, beside its duration.  None if
        no span of the trace is stored.  ``window`` (ns) bounds the samples looked at;
        by default, an hour either side of the trace (samples are stamped with their upload
        window, which may start before the span)."""
        spans = self.store.trace(tenant, trace_id)
        if not spans:
            return None
        if window is None:
            window = (
                min(s.start_ns for s in spans) - SPAN_SLACK_NS,
                max(s.end_ns for s in spans) + SPAN_SLACK_NS,
            )
        series = self.engine.find_series(tenant, [selector], window[0], window[1], profile_type)
        where = SampleFilter(
            window[0], window[1], trace_ids=[trace_id], trace_span_ids=[s.span_id for s in spans]
        )
        sums = self.store.span_values(tenant, [s.series_id for s in series], where)
        own: Dict[int, int] = dict(zip(sums.span_ids.tolist(), sums.values.tolist()))
        parent = {s.span_id: s.parent_span_id for s in spans}
        totals: Dict[int, int] = {}
        for sid, value in own.items():
            # Add each span's own value to it and every ancestor (once: bad data may loop).
            seen: Set[int] = set()
            while sid in parent and sid not in seen:
                seen.add(sid)
                totals[sid] = totals.get(sid, 0) + value
                sid = parent[sid]
        rows = tuple(
            SpanCPU(s, own.get(s.span_id, 0), totals.get(s.span_id, 0))
            for s in sorted(spans, key=lambda s: (s.start_ns, s.span_id))
        )
        unattributed = sum(v for sid, v in own.items() if sid not in parent)
        return TraceCPU(
            trace_id,
            profile_type,
            rows,
            unattributed,
            int(np.asarray(sums.values, dtype=np.int64).sum()),
        )

    def trace_totals(
        self,
        tenant: str,
        profile_type: ProfileType,
        trace_ids: Sequence[str],
        start_ns: int,
        end_ns: int,
    ) -> Dict[str, int]:
        """The profile total of each trace over the samples stamped in [start_ns, end_ns):
        those with its trace id, and those with only a span id, of one of its spans that
        started within SPAN_SLACK_NS of the range (the latest MAX_TRACE_SPANS of them)."""
        series = self.engine.find_series(tenant, [], start_ns, end_ns, profile_type)
        series_ids = [s.series_id for s in series]
        if not series_ids or not trace_ids:
            return {}
        labelled = self.store.trace_values(
            tenant, series_ids, SampleFilter(start_ns, end_ns, trace_ids=trace_ids)
        )
        totals = {t: int(v) for t, v in zip(labelled.trace_ids, labelled.values.tolist()) if v}
        spans = self.store.span_infos(
            tenant,
            start_ns - SPAN_SLACK_NS,
            end_ns + SPAN_SLACK_NS,
            trace_ids=trace_ids,
            limit=MAX_TRACE_SPANS,
        )
        trace_of = {s.span_id: s.trace_id for s in spans}
        if trace_of:
            only_span = SampleFilter(start_ns, end_ns, trace_ids=[], trace_span_ids=list(trace_of))
            sums = self.store.span_values(tenant, series_ids, only_span)
            for sid, value in zip(sums.span_ids.tolist(), sums.values.tolist()):
                trace = trace_of.get(sid)
                if trace is not None and value:
                    totals[trace] = totals.get(trace, 0) + int(value)
        return totals
