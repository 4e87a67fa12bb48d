"""Running a TraceQL metrics query (``{...} | rate() by (...)``) over a store: aggregated by
the store in one statement when it can (``metrics_pushdown``), else the spans ``candidates``
reads, counted into ``series``; then the second stage (``topk``, filters of values).
``compare()`` is answered by ``metrics_compare``.  The answer is partial, with a message, when
a bound is hit: spans read and wall time (span reads only), series, or cells (``MAX_CELLS``).
"""

from __future__ import annotations

from dataclasses import replace

from hotspan.query.engine import QueryError
from hotspan.query.traceql.candidates import (
    MAX_SPANS,
    Candidates,
    cell_bound_message,
    matched_spans,
    series_bound_message,
)
from hotspan.query.traceql.metrics_compare import run_compare
from hotspan.query.traceql.metrics_pushdown import aggregate, pushdown
from hotspan.query.traceql.plan import Query
from hotspan.query.traceql.series import (
    MAX_EXEMPLARS,
    MetricsRequest,
    MetricsResult,
    SeriesBuilder,
    filter_values,
    top_k,
    trace_wide,
    validate_stage,
)
from hotspan.store.base import Store

# Cells (rows x intervals) an answer may hold: each is a sample of ~40 bytes in the JSON
# answer (80 MB), 8 while counted.  maxSeries bounds the groups, but a histogram or quantile
# group has a row per power-of-two bucket (up to ~64).  Grafana asks for ~1,000 intervals.
MAX_CELLS = 2_000_000


def _hinted(query: Query, req: MetricsRequest) -> MetricsRequest:
    """``with(exemplars=false)`` or ``with(exemplars=N)`` over the request's exemplars."""
    hint = dict(query.hints).get("exemplars")
    if hint is False:
        return replace(req, exemplars=0)
    if isinstance(hint, int) and not isinstance(hint, bool):
        return replace(req, exemplars=max(min(hint, MAX_EXEMPLARS), 0))
    return req


def run_metrics(
    store: Store,
    tenant: str,
    query: Query,
    req: MetricsRequest,
    max_spans: int = MAX_SPANS,
    in_store: bool = True,
) -> MetricsResult:
    """The series of a metrics query over the stored spans (QueryError for a query Tempo
    refuses; the store's SearchError for a condition it cannot evaluate).  ``in_store``
    False reads the spans even when the store could aggregate them (to compare the two)."""
    stage = query.metrics
    if stage is None:
        raise QueryError(
            "not a metrics query: end it with a metrics function, such as "
            "{ status = error } | rate() by (resource.service.name)"
        )
    if stage.function == "compare":
        return run_compare(store, tenant, query, req, max_spans, in_store, MAX_CELLS)
    validate_stage(stage)
    builder = SeriesBuilder(stage, _hinted(query, req), MAX_CELLS)
    if req.instant:
        low, high = builder.start, builder.end  # Tempo's instant interval is closed
    else:
        low, high = builder.start + 1, builder.end  # intervals are right-closed
    state = Candidates()
    plan = pushdown(query, builder.req) if in_store else None
    inspected = aggregate(store, tenant, plan, builder) if plan is not None else None
    if inspected is not None:
        # Every matching span, no bound: the store aggregated them.
        state.read, trace_count = inspected
    else:
        keys = [*stage.by, stage.attribute or ""]
        whole = any(trace_wide(k) for k in keys)
        pages = matched_spans(store, tenant, query, low, high, max_spans, whole, state)
        for spans, traces in pages:
            builder.observe(spans, traces)
        trace_count = len(state.traces)
    series = builder.series()
    for name, arg in stage.second_stage:
        if name in ("topk", "bottomk"):
            series = top_k(series, int(arg), largest=name == "topk")
        else:
            series = filter_values(series, name, arg)
    partial = state.partial
    if builder.limited:
        partial = series_bound_message(req.max_series)
    elif builder.cells_limited:
        partial = cell_bound_message(MAX_CELLS)
    return MetricsResult(builder.timestamps_ms(), series, state.read, trace_count, partial)
