"""Trace search: a TraceQL query (or Tempo's legacy tags) to Tempo's ``SearchResponse``.

Two paths.  Spanset filters joined by ``&&`` (what ``traceql.parse_traceql`` reads) and the
legacy ``tags`` search are one SQL statement (``store.find_traces``).  Everything else
(``||``, structural operators, pipelines, select()) runs in ``traceql_eval``: candidate spans
meeting the query's pushdown conditions, newest first, name candidate traces (at most
MAX_CANDIDATE_TRACES, newest first); their spans are fetched by batches and evaluated trace by
trace until ``limit`` traces are found.  ``metrics.inspectedTraces`` says how many were looked
at, so a search that stopped at the bound says so.

Both paths answer with the attributes Tempo shows on each span: the ones the query names
(conditions, by(), aggregates, select()), typed as received (the raw OTLP span), so Grafana
shows them as columns.  The answer is Tempo's protobuf JSON mapping (camelCase, 64-bit
integers as strings), so the gRPC API converts it with ``json_format`` as it is.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hotspan.model.trace import (
    SPAN_KINDS,
    STATUS_CODES,
    Condition,
    SearchError,
    SpanRecord,
    TraceQuery,
    TraceSummary,
)
from hotspan.query import traceql_ast as ast
from hotspan.query.engine import QueryError
from hotspan.query.traceql import Query, Spanset, evaluate
from hotspan.query.traceql_eval import nested_set, plain

# How far the engine looks: the newest candidate spans, the traces they belong to, and the
# spans of those traces fetched per query.
MAX_CANDIDATE_SPANS = 50_000
MAX_CANDIDATE_TRACES = 2_000
TRACES_PER_BATCH = 100
MAX_SPANS_PER_BATCH = 200_000
# Spans of a trace may start before the search range or end after it: whole traces are read
# this far around it.
TRACE_MARGIN_NS = 3600 * 10**9
NO_ROOT = "<root span not yet received>"


@dataclass(frozen=True)
class SearchParams:
    """What a search asks, whatever its syntax: the range, how many traces and spans per
    spanset, in which order (``TRACE_ORDERS``)."""

    start_ns: int
    end_ns: int
    limit: int = 20
    spans_per_spanset: int = 3
    order: str = "recent"


def search(
    store: Any,
    tenant: str,
    params: SearchParams,
    query: Optional[Query],
    legacy: Optional[TraceQuery] = None,
) -> Dict[str, object]:
    """Tempo's ``SearchResponse`` JSON for ``query`` (TraceQL) or ``legacy`` (tags search).
    QueryError or SearchError when the query cannot run."""
    if query is None or query.simple is not None:
        if query is not None:
            spansets, trace_conds = query.simple  # type: ignore[misc]
            legacy = TraceQuery(
                params.start_ns,
                params.end_ns,
                spansets,
                trace_conds,
                params.limit,
                params.spans_per_spanset,
                params.order,
            )
        if legacy is None:
            raise ValueError("search needs a TraceQL query or a legacy one")
        found = store.find_traces(tenant, legacy)
        traces = [_summary_json(t) for t in found]
        if query is not None and len(legacy.spansets) > 1 and traces:
            _all_sides(store, tenant, params, legacy.spansets, traces)
        shown = query.shown if query is not None else ()
        if shown:
            _add_attributes(store, tenant, traces, shown)
        return _response(traces)
    return _pipeline_search(store, tenant, params, query)


# -- the SQL path --------------------------------------------------------------------------------


def _summary_json(t: TraceSummary) -> Dict[str, Any]:
    spanset = {
        "spans": [
            {
                "spanID": f"{s.span_id:016x}",
                "name": s.name,
                "startTimeUnixNano": str(s.start_ns),
                "durationNanos": str(s.duration_ns),
            }
            for s in t.matched
        ],
        "matched": t.matched_count,
    }
    return {
        "traceID": t.trace_id,
        "rootServiceName": t.root_service or NO_ROOT,
        "rootTraceName": t.root_name,
        "startTimeUnixNano": str(t.start_ns),
        "durationMs": t.duration_ns // 1_000_000,
        "spanSet": spanset,
        "spanSets": [spanset],
    }


def _all_sides(
    store: Any,
    tenant: str,
    params: SearchParams,
    spansets: Sequence[Sequence[Condition]],
    traces: List[Dict[str, Any]],
) -> None:
    """``{a} && {b}``: the SQL finds traces by the spans of ``a`` (with one of ``b``); Tempo
    shows the spans of both sides.  One read per side of the few traces found."""
    ids = [t["traceID"] for t in traces]
    union: Dict[str, Dict[int, SpanRecord]] = {t: {} for t in ids}
    for conds in spansets:
        records = store.span_records(
            tenant, params.start_ns, params.end_ns, conds, trace_ids=ids, limit=MAX_SPANS_PER_BATCH
        )
        for span in records:
            union.setdefault(span.trace_id, {}).setdefault(span.span_id, span)
    for trace in traces:
        spans = sorted(union[trace["traceID"]].values(), key=lambda s: (s.start_ns, s.span_id))
        if not spans:
            continue
        shown = spans[: max(params.spans_per_spanset, 1)]
        spanset = {"spans": [_span_json(s) for s in shown], "matched": len(spans)}
        trace["spanSet"] = spanset
        trace["spanSets"] = [spanset]


def _response(
    traces: List[Dict[str, Any]], inspected: Optional[Tuple[int, int]] = None
) -> Dict[str, object]:
    # SearchMetrics in protobuf's JSON mapping: uint32 as numbers, uint64 as strings.
    metrics: Dict[str, object] = {}
    if inspected is not None:
        metrics = {"inspectedTraces": inspected[0], "inspectedSpans": str(inspected[1])}
    metrics.update(completedJobs=1, totalJobs=1)
    body: Dict[str, object] = {"metrics": metrics}
    if traces:
        body = {"traces": traces, **body}
    return body


# -- the engine path -----------------------------------------------------------------------------


def _pipeline_search(
    store: Any, tenant: str, params: SearchParams, query: Query
) -> Dict[str, object]:
    candidates = store.span_records(
        tenant, params.start_ns, params.end_ns, query.pushdown, limit=MAX_CANDIDATE_SPANS
    )
    by_trace: Dict[str, List[SpanRecord]] = {}
    for span in candidates:
        spans = by_trace.get(span.trace_id)
        if spans is None:
            if len(by_trace) >= MAX_CANDIDATE_TRACES:
                continue
            spans = by_trace[span.trace_id] = []
        spans.append(span)
    trace_ids = list(by_trace)
    # Every candidate span was read: a query that needs no more than them has them already.
    complete = not query.needs_traces and len(candidates) < MAX_CANDIDATE_SPANS
    by_duration = params.order == "duration"
    found: List[Tuple[List[SpanRecord], List[Spanset]]] = []
    inspected_traces = inspected_spans = 0
    for batch_start in range(0, len(trace_ids), TRACES_PER_BATCH):
        batch = trace_ids[batch_start : batch_start + TRACES_PER_BATCH]
        if complete:
            batch_spans: Iterable[List[SpanRecord]] = (by_trace[t] for t in batch)
        else:
            batch_spans = _trace_spans(store, tenant, params, query, batch)
        for spans in batch_spans:
            inspected_traces += 1
            inspected_spans += len(spans)
            spansets = evaluate(query, spans)
            if spansets:
                found.append((spans, spansets))
        if not by_duration and len(found) >= params.limit:
            break
    wholes = _whole_traces(store, tenant, params, query, [spans for spans, _ in found])
    traces = [_trace_json(params, whole, sets) for whole, (_, sets) in zip(wholes, found)]
    if by_duration:
        traces.sort(key=lambda t: (-int(t["_duration"]), t["traceID"]))
    else:
        traces.sort(key=lambda t: (-int(t["startTimeUnixNano"]), t["traceID"]))
    traces = traces[: params.limit]
    for t in traces:
        t.pop("_duration")
    if query.shown:
        _add_attributes(store, tenant, traces, query.shown)
    return _response(traces, (inspected_traces, inspected_spans))


def _window(params: SearchParams) -> Tuple[int, int]:
    """Where whole traces are read: the search range and a margin around it."""
    return max(params.start_ns - TRACE_MARGIN_NS, 0), params.end_ns + TRACE_MARGIN_NS


def _trace_spans(
    store: Any, tenant: str, params: SearchParams, query: Query, batch: Sequence[str]
) -> Iterable[List[SpanRecord]]:
    """The spans of each trace of ``batch`` the query reads: all of them (within a margin
    around the range) when it needs whole traces, else those meeting its pushdown."""
    if query.needs_traces:
        start, end = _window(params)
        conditions: Sequence[Condition] = ()
    else:
        start, end, conditions = params.start_ns, params.end_ns, query.pushdown
    records = store.span_records(
        tenant, start, end, conditions, trace_ids=list(batch), limit=MAX_SPANS_PER_BATCH
    )
    by_trace: Dict[str, List[SpanRecord]] = {t: [] for t in batch}
    for span in records:
        by_trace.setdefault(span.trace_id, []).append(span)
    for trace_id in batch:
        if by_trace[trace_id]:
            yield by_trace[trace_id]


def _whole_traces(
    store: Any, tenant: str, params: SearchParams, query: Query, found: List[List[SpanRecord]]
) -> List[List[SpanRecord]]:
    """Every span of each found trace, for its root and bounds: the query read them all when
    it needs whole traces, else one more read (of the few traces found) gets them."""
    if query.needs_traces or not found:
        return found
    start, end = _window(params)
    ids = [spans[0].trace_id for spans in found]
    by_trace: Dict[str, List[SpanRecord]] = {t: [] for t in ids}
    for span in store.span_records(tenant, start, end, trace_ids=ids, limit=MAX_SPANS_PER_BATCH):
        by_trace.setdefault(span.trace_id, []).append(span)
    return [by_trace[t] or spans for t, spans in zip(ids, found)]


def _trace_json(
    params: SearchParams, whole: List[SpanRecord], spansets: List[Spanset]
) -> Dict[str, Any]:
    # The root: the span without a parent, else the earliest (its parent never arrived), as
    # the SQL search picks it.
    root = min(whole, key=lambda s: (s.parent_span_id != 0, s.start_ns, s.span_id))
    root_service, root_name = root.service or NO_ROOT, root.name
    start = min(s.start_ns for s in whole)
    end = max(s.end_ns for s in whole)
    out_sets = []
    for ss in spansets:
        shown = ss.spans[: params.spans_per_spanset]
        out: Dict[str, Any] = {"spans": [_span_json(s) for s in shown], "matched": len(ss.spans)}
        attributes = [_key_value(k, v) for k, v in ss.attributes.items()]
        if attributes:
            out["attributes"] = attributes
        out_sets.append(out)
    return {
        "traceID": whole[0].trace_id,
        "rootServiceName": root_service,
        "rootTraceName": root_name,
        "startTimeUnixNano": str(start),
        "durationMs": (end - start) // 1_000_000,
        "spanSet": out_sets[0],
        "spanSets": out_sets,
        "_duration": end - start,
    }


def _span_json(span: SpanRecord) -> Dict[str, Any]:
    return {
        "spanID": f"{span.span_id:016x}",
        "name": span.name,
        "startTimeUnixNano": str(span.start_ns),
        "durationNanos": str(span.end_ns - span.start_ns),
    }


# -- attributes ----------------------------------------------------------------------------------


def _key_value(key: str, value: object) -> Dict[str, Any]:
    return {"key": key, "value": _any_value(value)}


def _any_value(value: object) -> Dict[str, Any]:
    """A spanset attribute (by()'s value, an aggregate) as an OTLP AnyValue in JSON."""
    if value is None or isinstance(value, ast.Nil):
        return {"stringValue": "nil"}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, ast.Duration):
        return {"stringValue": str(value)}
    if isinstance(value, ast.Text):
        # Stored as text: typed back as it reads, as an attribute of that type would be.
        if value in ("true", "false"):
            return {"boolValue": value == "true"}
        value = plain(value)
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": str(value)}


def _otlp_value(value: Any) -> Optional[Dict[str, Any]]:
    """An OTLP AnyValue message in protobuf's JSON mapping."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "string_value":
        return {"stringValue": value.string_value}
    if kind == "bool_value":
        return {"boolValue": value.bool_value}
    if kind == "int_value":
        return {"intValue": str(value.int_value)}
    if kind == "double_value":
        return {"doubleValue": value.double_value}
    if kind == "bytes_value":
        return {"bytesValue": base64.b64encode(value.bytes_value).decode()}
    if kind == "array_value":
        values = [_otlp_value(v) or {} for v in value.array_value.values]
        return {"arrayValue": {"values": values}}
    items = [
        {"key": kv.key, "value": _otlp_value(kv.value) or {}} for kv in value.kvlist_value.values
    ]
    return {"kvlistValue": {"values": items}}


def _add_attributes(
    store: Any,
    tenant: str,
    traces: List[Dict[str, Any]],
    shown: Sequence[ast.Attribute],
) -> None:
    """Put on each span of ``traces`` the ``shown`` attributes it has, typed as received."""
    needs_raw = any(a.scope != "intrinsic" for a in shown)
    for trace in traces:
        wanted = {
            int(span["spanID"], 16): span
            for spanset in trace["spanSets"]
            for span in spanset["spans"]
        }
        stored = {s.span_id: s for s in store.trace(tenant, trace["traceID"])} if wanted else {}
        children: Dict[int, int] = {}
        if any(a.name == "childCount" for a in shown):
            for s in stored.values():
                if s.parent_span_id in stored:
                    children[s.parent_span_id] = children.get(s.parent_span_id, 0) + 1
        # Traces Drilldown's structure tab draws the tree from these three.
        nested = (
            nested_set(list(stored.values()))  # type: ignore[arg-type]
            if any(a.name.startswith("nestedSet") for a in shown)
            else {}
        )
        for span_id, span in wanted.items():
            item = stored.get(span_id)
            if item is None:
                continue
            attrs, resource = ({}, {})
            if needs_raw:
                attrs = {kv.key: kv.value for kv in Span.FromString(item.raw).attributes}
                resource = {
                    kv.key: kv.value for kv in Resource.FromString(item.group.resource).attributes
                }
            out = []
            for attr in shown:
                value = _shown_value(attr, item, attrs, resource, children, nested)
                if value is not None:
                    out.append({"key": _shown_key(attr), "value": value})
            if out:
                span["attributes"] = out


def _shown_key(attr: ast.Attribute) -> str:
    """The key Tempo gives an attribute in search results: its name, without scope."""
    if attr.scope != "intrinsic":
        return attr.name
    return attr.name.split(":")[-1] if attr.name.startswith("span:") else attr.name


def _shown_value(
    attr: ast.Attribute,
    span: Any,
    attrs: Dict[str, Any],
    resource: Dict[str, Any],
    children: Dict[int, int],
    nested: Dict[int, Tuple[int, int, int]],
) -> Optional[Dict[str, Any]]:
    if attr.scope == "intrinsic" and attr.name.startswith("nestedSet"):
        place = ("nestedSetLeft", "nestedSetRight", "nestedSetParent").index(attr.name)
        return {"intValue": str(nested.get(span.span_id, (0, 0, 0))[place])}
    if attr.scope == "intrinsic":
        if attr.name == "status":
            code = span.status_code
            return {"stringValue": STATUS_CODES[code] if 0 <= code < 3 else str(code)}
        if attr.name == "kind":
            kind = span.kind
            return {"stringValue": SPAN_KINDS[kind] if 0 <= kind < len(SPAN_KINDS) else str(kind)}
        if attr.name == "childCount":
            return {"intValue": str(children.get(span.span_id, 0))}
        if attr.name == "span:parentID":
            parent = span.parent_span_id
            return {"stringValue": f"{parent:016x}"} if parent else None
        return None
    if attr.scope in ("span", "") and attr.name in attrs:
        return _otlp_value(attrs[attr.name])
    if attr.scope in ("resource", "") and attr.name in resource:
        return _otlp_value(resource[attr.name])
    return None


__all__ = ["SearchParams", "search", "QueryError", "SearchError"]
