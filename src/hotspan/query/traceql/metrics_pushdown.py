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
from hotspan.store.metrics_sql import MetricsPlan, MetricsRow, key_supported

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
    start, end, _ = aligned_range(req)
    if req.instant:
        # One interval, closed: every start in [start, end] falls in interval 0.
        low, high, origin, step = start, end, start - 1, end - start + 2
    else:
        low, high, origin, step = start + 1, end, start, req.step_ns
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
    rows = store.metrics_rows(tenant, plan)
    if rows is None:
        return None
    nby = len(builder.stage.by)
    nkeys = len(plan.keys)
    convert = [_converter(k) for k in plan.keys]
    histogram = builder.bucket_of is not None
    tail = 1 + 2 * nkeys
    # The store's last row counts the traces (None: too many spans to count them).
    traces = sum(int(r[tail + 1] or 0) for r in rows if r[0] is None)  # type: ignore[call-overload]
    rows = [r for r in rows if r[0] is not None]
    # The engine meets the newest spans first, and makes its rows (and keeps its first
    # max_series groups) in that order: so are the groups taken, by their newest span.
    rows = sorted(rows, key=lambda r: -int(r[tail + 6]))  # type: ignore[call-overload]
    inspected = 0
    index: List[int] = []
    for row in rows:
        inspected += int(row[tail + 1])  # type: ignore[call-overload]
        values = tuple(convert[i](row[1 + 2 * i], row[2 + 2 * i]) for i in range(nkeys))
        if any(v is None for v in values[nby:]):
            index.append(-1)  # an x != nil test the span fails
            continue
        key: tuple = values[:nby]
        if histogram:
            if row[tail] is None:
                index.append(-1)  # below 2 ns: no bucket
                continue
            bits = int(row[tail])  # type: ignore[call-overload]
            key = (key, float(np.ldexp(1.0, bits)) / SEC)
        index.append(builder.row_of_key(key))
    if not rows:
        return inspected, traces
    table = np.array([r[tail + 1 : tail + 5] for r in rows], dtype=object)
    target = np.array(index, dtype=np.int64)
    slots = np.array([int(r[0]) for r in rows], dtype=np.int64)  # type: ignore[call-overload]
    counts = table[:, 0].astype(np.float64)

    def column(i: int) -> Optional[np.ndarray]:
        if plan.measure != "duration":
            return None
        return np.array([math.nan if v is None else int(v) / SEC for v in table[:, i]])

    builder.add_groups(target, slots, counts, column(1), column(2), column(3))
    if plan.exemplars and builder.buckets is not None:
        _exemplars(store, tenant, builder, rows, index, tail)
    return inspected, traces


def _exemplars(
    store: Store,
    tenant: str,
    builder: SeriesBuilder,
    rows: List[MetricsRow],
    index: List[int],
    tail: int,
) -> None:
    """Each group's newest span is a candidate; the newest candidates first are spread over
    the range as the engine spreads exemplars (``_ExemplarBuckets``), one per trace."""
    buckets = builder.buckets
    assert buckets is not None
    candidates = sorted(
        (
            (int(r[tail + 6]), i)  # type: ignore[call-overload]
            for i, r in enumerate(rows)
            if index[i] >= 0 and r[tail + 5] is not None
        ),
        reverse=True,
    )
    picked: List[Tuple[int, int]] = []
    for start_ns, i in candidates:
        if buckets.full():
            break
        if buckets.take(start_ns // MS):
            picked.append((start_ns, i))
    if not picked:
        return
    span_ids = [int(rows[i][tail + 5]) for _, i in picked]  # type: ignore[call-overload]
    traces: Dict[int, str] = store.span_traces(tenant, span_ids)
    seen = set()
    valued = builder.exemplar_value is not None
    for (start_ns, i), span_id in zip(picked, span_ids):
        trace_id = traces.get(span_id)
        if trace_id is None or trace_id in seen:
            continue
        seen.add(trace_id)
        duration = rows[i][tail + 7]
        value = int(duration) / SEC if valued and duration is not None else None  # type: ignore[call-overload]
        builder.add_exemplar(index[i], trace_id, span_id, value, start_ns // MS)
