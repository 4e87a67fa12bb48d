"""The traces where a function is hot: those whose samples hold most of its time in a range.

From a flame graph's frame to the requests that paid for it: the stacks that hold the
function (by its exact name) are found in the range's profile, then the samples of those
stacks summed per trace, the largest first, each beside the trace's whole value and the
name of its root span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from hotspan.model.labels import Selector
from hotspan.model.profile import ProfileType
from hotspan.model.trace import SpanRecord
from hotspan.query.engine import QueryEngine
from hotspan.query.stacks import stack_hits
from hotspan.store.base import SampleFilter

# Samples carry the start of their agent's upload window: a trace's spans may have started
# up to this long after its first samples' stamps.
SPAN_SLACK_NS = 5 * 60 * 10**9


@dataclass(frozen=True)
class HotTrace:
    trace_id: str
    value: int  # the function's samples in the trace (the stacks holding it)
    total: int  # all of the trace's samples in the range
    root_service: str  # "" when the trace's spans are not stored
    root_name: str
    duration_ns: int


@dataclass(frozen=True)
class FunctionTraces:
    function: str
    value: int  # the function's samples in the range, in traces or not
    in_traces: int  # the part of them that carries a trace id
    total: int  # every sample of the selection in the range
    traces: Tuple[HotTrace, ...]  # the largest value first


def function_traces(
    engine: QueryEngine,
    tenant: str,
    profile_type: ProfileType,
    selector: Selector,
    function: str,
    start_ns: int,
    end_ns: int,
    limit: int = 20,
) -> FunctionTraces:
    series = engine.find_series(tenant, [selector], start_ns, end_ns, profile_type)
    series_ids = [s.series_id for s in series]
    if not series_ids:
        return FunctionTraces(function, 0, 0, 0, ())
    where = SampleFilter(start_ns, end_ns)
    values = engine.store.stack_values(tenant, series_ids, where)
    total = int(values.values.sum()) if len(values.values) else 0
    # The rows first: they load the stacks' names the lookup below reads.
    rows = engine.stacks.rows(values.stack_ids) if total else np.zeros(0, np.int64)
    name = engine.stacks.find_name(function)
    known = rows >= 0
    name_hit = np.zeros(len(engine.stacks.names) + 1, dtype=bool)
    if name >= 0:
        name_hit[name] = True
    hit = stack_hits(engine.stacks, rows[known], name_hit)
    stacks = values.stack_ids[known][hit] if len(rows) else values.stack_ids[:0]
    value = int(values.values[known][hit].sum()) if len(rows) else 0
    if not value:
        return FunctionTraces(function, 0, 0, total, ())
    hot = engine.store.trace_values(
        tenant, series_ids, SampleFilter(start_ns, end_ns, stack_ids=stacks.tolist())
    )
    order = np.argsort(-hot.values, kind="stable")[: max(limit, 0)]
    top = [(hot.trace_ids[i], int(hot.values[i])) for i in order.tolist()]
    ids = [t for t, _ in top]
    whole = engine.store.trace_values(
        tenant, series_ids, SampleFilter(start_ns, end_ns, trace_ids=ids)
    )
    totals = dict(zip(whole.trace_ids, whole.values.tolist()))
    roots = _roots(engine, tenant, ids, start_ns, end_ns)
    traces = tuple(
        HotTrace(tid, v, int(totals.get(tid, v)), *roots.get(tid, ("", "", 0))) for tid, v in top
    )
    return FunctionTraces(function, value, int(hot.values.sum()), total, traces)


def _roots(
    engine: QueryEngine, tenant: str, trace_ids: List[str], start_ns: int, end_ns: int
) -> Dict[str, Tuple[str, str, int]]:
    """(root service, root name, duration) of each trace whose spans are stored."""
    if not trace_ids:
        return {}
    spans = engine.store.span_infos(
        tenant, start_ns - SPAN_SLACK_NS, end_ns + SPAN_SLACK_NS, trace_ids=trace_ids
    )
    by_trace: Dict[str, List[SpanRecord]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    out: Dict[str, Tuple[str, str, int]] = {}
    for trace_id, members in by_trace.items():
        # The span without a parent, else the earliest, as the trace search picks it.
        root = min(members, key=lambda s: (s.parent_span_id != 0, s.start_ns, s.span_id))
        start = min(s.start_ns for s in members)
        end = max(s.end_ns for s in members)
        out[trace_id] = (root.service, root.name, end - start)
    return out
