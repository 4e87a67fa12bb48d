"""TraceQL metrics the store computes: the query as a :class:`MetricsPlan` when one
aggregation statement can answer it (:mod:`hotspan.store.metrics_sql`), and the store's rows
counted into a :class:`SeriesBuilder`, as the spans the engine reads are.

A query is pushed down when its filter is one ``{...}`` whose parts the store's conditions
are (``candidates.exact_pushdown``), bar ``x != nil`` tests (Traces Drilldown's), when its
function is ``rate``, ``count_over_time``, or reads the span's own duration
(``min/max/avg/sum_over_time``, ``histogram_over_time``, ``quantile_over_time``), and when
every ``by()`` key is name, status, kind or a span, resource or unscoped attribute.  The rest
(structural operators, pipelines, trace-wide intrinsics, attribute values, ``compare()``) is
read span by span.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from hotspan.model.trace import SPAN_KINDS, STATUS_CODES
from hotspan.query.traceql import ast
from hotspan.query.traceql.candidates import presence_tests
from hotspan.query.traceql.fields import plain
from hotspan.query.traceql.names import INTRINSICS
from hotspan.query.traceql.plan import Query
from hotspan.query.traceql.series import (
    EXEMPLARS_PER_BUCKET,
    FUNCTIONS,
    HISTOGRAM_FUNCTIONS,
    MS,
    SEC,
    VALUE_FUNCTIONS,
    MetricsRequest,
    SeriesBuilder,
    aligned_range,
)
from hotspan.store.base import Store
from hotspan.store.metrics_sql import MetricsPlan, key_supported

_DURATION = ("duration", "span:duration")
Convert = Callable[[object, object], object]


def _converter(key: str) -> Convert:
    """A key's label value from its (value, typed) columns, as ``series.value_getter``
    reads it from a span."""
    canonical = INTRINSICS.get(key)
    if canonical == "name":
        return lambda value, typed: value
    if canonical == "status":
        return lambda value, typed: (
            STATUS_CODES[value] if isinstance(value, int) and 0 <= value < 3 else None
        )
    if canonical == "kind":
        return lambda value, typed: (
            SPAN_KINDS[value] if isinstance(value, int) and 0 <= value < len(SPAN_KINDS) else None
        )
    return _attribute_value


def _attribute_value(value: object, typed: object) -> object:
    if value is None:
        return None
    if typed:
        return plain(ast.Text(str(value)))  # a number when the text reads as one
    return str(value)


def statement_range(req: MetricsRequest) -> Tuple[int, int, int, int]:
    """The spans' starts a statement reads (low, high, both included) and how it numbers
    their intervals (``(start - origin - 1) // step``), as the engine does."""
    start, end, _ = aligned_range(req)
    if req.instant:
        # One interval, closed: every start in [start, end] falls in interval 0.
        return start, end, start - 1, end - start + 2
    return start + 1, end, start, req.step_ns


def pushdown(query: Query, req: MetricsRequest) -> Optional[MetricsPlan]:
    """The plan of a metrics query the store can aggregate, or None (the engine reads the
    spans)."""
    stage = query.metrics
    if stage is None or stage.function not in FUNCTIONS:
        return None
    if query.needs_raw or any(c.key.startswith("raw:") for c in query.pushdown):
        return None  # raw conditions are necessary, not sufficient: the engine decides
    present = presence_tests(query)
    if present is None:
        return None
    reads_value = stage.function in (*HISTOGRAM_FUNCTIONS, *VALUE_FUNCTIONS)
    if reads_value and (stage.attribute or "duration") not in _DURATION:
        return None
    keys = (*stage.by, *present)
    if not all(key_supported(k) for k in keys):
        return None
    if stage.function in HISTOGRAM_FUNCTIONS:
        measure = "log2"
    elif stage.function in VALUE_FUNCTIONS:
        measure = "duration"
    else:
        measure = "count"
    low, high, origin, step = statement_range(req)
    exemplars = bool(req.exemplars) and not req.instant
    # (Else an exemplar's value is its interval's sample.)
    valued = stage.function == "quantile_over_time" or measure == "duration"
    return MetricsPlan(
        tuple(query.pushdown), low, high, origin, step, keys, measure, exemplars, valued
    )


def aggregate(
    store: Store, tenant: str, plan: MetricsPlan, builder: SeriesBuilder
) -> Optional[Tuple[int, int]]:
    """The store's groups of the plan counted into ``builder``, with exemplars; the spans
    and traces they hold, or None when the store cannot aggregate (nothing is counted
    then)."""
    got = store.metrics_rows(tenant, plan)
    if got is None:
        return None
    nby = len(builder.stage.by)
    nkeys = len(plan.keys)
    tail = 1 + 2 * nkeys
    # The store's last row counts the traces (None: too many spans to count them).
    traces = sum(int(r[tail + 1] or 0) for r in got if r[0] is None)  # type: ignore[call-overload]
    rows = [r for r in got if r[0] is not None]
    if not rows:
        return 0, traces
    # The engine meets the newest spans first, and makes its rows (and keeps its first
    # max_series groups) in that order: so are the groups taken, by their newest span.
    newest = np.array([r[tail + 6] for r in rows], dtype=np.int64)
    order = np.argsort(-newest, kind="stable")
    rows = [rows[i] for i in order.tolist()]
    columns = list(zip(*rows))
    # Each key's values converted once per distinct (value, typed), not once per group.
    keys: List[List[object]] = []
    for i, key in enumerate(plan.keys):
        convert = _converter(key)
        seen: Dict[Tuple[object, object], object] = {}
        pairs = list(zip(columns[1 + 2 * i], columns[2 + 2 * i]))
        for pair in set(pairs):
            seen[pair] = convert(*pair)
        keys.append([seen[pair] for pair in pairs])
    dropped = np.zeros(len(rows), dtype=bool)
    for values in keys[nby:]:
        dropped |= np.array([v is None for v in values])  # an x != nil test the span fails
    by_keys: List[tuple] = list(zip(*keys[:nby])) if nby else [()] * len(rows)
    row_keys = by_keys
    if builder.bucket_of is not None:
        bits = columns[tail]
        dropped |= np.array([b is None for b in bits])  # below 2 ns: no bucket
        bucket_of = {b: float(np.ldexp(1.0, b)) / SEC for b in set(bits) if b is not None}
        row_keys = [(k, bucket_of.get(b)) for k, b in zip(by_keys, bits)]
    row_of = builder.row_of_key
    index = np.array(
        [-1 if d else row_of(k) for k, d in zip(row_keys, dropped.tolist())],
        dtype=np.int64,
    )
    slots = np.array(columns[0], dtype=np.int64)
    counts = np.array(columns[tail + 1], dtype=np.float64)

    def value(i: int) -> Optional[np.ndarray]:
        if plan.measure != "duration":
            return None
        return np.array([math.nan if v is None else int(v) / SEC for v in columns[i]])

    builder.add_groups(index, slots, counts, value(tail + 2), value(tail + 3), value(tail + 4))
    if plan.exemplars and builder.buckets is not None:
        _exemplars(store, tenant, builder, columns, index, tail)
    return int(counts.sum()), traces


def _exemplars(
    store: Store,
    tenant: str,
    builder: SeriesBuilder,
    columns: List[tuple],
    index: np.ndarray,
    tail: int,
) -> None:
    """Each group's newest span is a candidate (the columns come newest first); the newest
    candidates first are spread over the range as the engine spreads exemplars
    (``_ExemplarBuckets``: at most two per time slice), one per trace."""
    buckets = builder.buckets
    assert buckets is not None
    spans, starts, durations = columns[tail + 5], columns[tail + 6], columns[tail + 7]
    ts_ms = np.array(starts, dtype=np.int64) // MS
    ok = (index >= 0) & np.array([s is not None for s in spans])
    ok &= (ts_ms >= buckets.start_ms) & (ts_ms <= buckets.end_ms)
    slices = np.clip((ts_ms - buckets.start_ms) // buckets.width, 0, buckets.slices - 1)
    # The first candidates of each slice (newest first), as many as a slice takes: the only
    # ones buckets.take could accept, found without a loop over every group.
    order = np.flatnonzero(ok)
    first = order[np.lexsort((order, slices[order]))]
    rank = np.arange(len(first)) - np.searchsorted(slices[first], slices[first])
    few = np.sort(first[rank < EXEMPLARS_PER_BUCKET])
    picked: List[int] = []
    for i in few.tolist():
        if buckets.full():
            break
        if buckets.take(int(ts_ms[i])):
            picked.append(i)
    if not picked:
        return
    span_ids = [int(spans[i]) for i in picked]
    traces: Dict[int, str] = store.span_traces(tenant, span_ids)
    seen = set()
    valued = builder.exemplar_value is not None
    for i, span_id in zip(picked, span_ids):
        trace_id = traces.get(span_id)
        if trace_id is None or trace_id in seen:
            continue
        seen.add(trace_id)
        duration = durations[i]
        value = int(duration) / SEC if valued and duration is not None else None
        builder.add_exemplar(int(index[i]), trace_id, span_id, value, int(ts_ms[i]))
