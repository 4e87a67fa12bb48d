"""Trace search: a TraceQL query (or Tempo's legacy tags) to Tempo's ``SearchResponse``.

Two paths.  Spanset filters joined by ``&&`` (what ``traceql.parse_traceql`` reads) and the
legacy ``tags`` search are one SQL statement (``store.find_traces``).  Everything else
(``||``, structural operators, pipelines, select()) runs in TraceQL's engine: candidate spans
meeting the query's pushdown conditions, newest first, name candidate traces (at most
MAX_CANDIDATE_TRACES, newest first); their spans are fetched by batches and evaluated trace by
trace until ``limit`` traces are found.  ``metrics.inspectedTraces`` says how many were looked
at, so a search that stopped at the bound says so.  The engine's work is bounded too: the spans
it reads in all (``SearchParams.max_spans``) and its time (``deadline_s``); a search stopped by
either answers what it found, with ``metrics.additionalMetrics`` saying ``partial`` and why.
A trace is judged only whole: one with more spans than a read returns is left out, and counted
(``tracesTooLarge``).

Both paths answer with the attributes Tempo shows on each span: the ones the query names
(conditions, by(), aggregates, select()), so Grafana shows them as columns; typed as received
(the raw OTLP span) for the first RAW_TYPED_TRACES traces, then as their text reads.  The
answer is Tempo's protobuf JSON mapping (camelCase, 64-bit integers as strings), so the gRPC
API converts it with ``json_format`` as it is.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hotspan.model.trace import (
    RS,
    SPAN_KINDS,
    STATUS_CODES,
    STRING_US,
    US,
    Condition,
    MatchedSpan,
    SearchError,
    SpanRecord,
    TraceQuery,
    TraceSummary,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import (
    Attribute,
    Duration,
    Nil,
    Query,
    Spanset,
    Text,
    evaluate,
    nested_set,
    plain,
)

ERROR_CODE = STATUS_CODES.index("error")

# How far the engine looks: the newest candidate spans, the traces they belong to, and the
# spans of those traces fetched per query.
MAX_CANDIDATE_SPANS = 50_000
MAX_CANDIDATE_TRACES = 2_000
TRACES_PER_BATCH = 100
MAX_SPANS_PER_BATCH = 200_000
# The work of one engine search: the spans it reads in all (candidates, traces, batches) and the
# time it runs, checked per trace; past either it answers with what it found, marked partial in
# ``metrics.additionalMetrics``.
MAX_SEARCH_SPANS = 1_000_000
SEARCH_DEADLINE_S = 30.0
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
    max_spans: int = MAX_SEARCH_SPANS
    deadline_s: float = SEARCH_DEADLINE_S


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
            _add_attributes(store, tenant, params, traces, shown)
        return _response(traces)
    return _pipeline_search(store, tenant, params, query)


# -- the SQL path --------------------------------------------------------------------------------


# Tempo's durationMs is a uint32: a trace longer than ~49.7 days (a clock far off) says that.
MAX_DURATION_MS = 2**32 - 1


def duration_ms(duration_ns: int) -> int:
    """A trace's duration as Tempo's search answers carry it."""
    return min(max(duration_ns, 0) // 1_000_000, MAX_DURATION_MS)


def _summary_json(t: TraceSummary) -> Dict[str, Any]:
    spanset = {"spans": [_span_json(s) for s in t.matched], "matched": t.matched_count}
    return {
        "traceID": t.trace_id,
        "rootServiceName": t.root_service or NO_ROOT,
        "rootTraceName": t.root_name,
        "startTimeUnixNano": str(t.start_ns),
        "durationMs": duration_ms(t.duration_ns),
        "spanSet": spanset,
        "spanSets": [spanset],
        "serviceStats": _service_stats_json(t.service_stats),
    }


def _service_stats_json(stats: Iterable[Tuple[str, int, int]]) -> Dict[str, Any]:
    """Tempo's ``serviceStats``: per service, its spans in the trace and how many failed
    (status error); zeros left out, as proto3 JSON does."""
    out: Dict[str, Any] = {}
    for service, spans, errors in stats:
        entry: Dict[str, int] = {"spanCount": spans} if spans else {}
        if errors:
            entry["errorCount"] = errors
        out[service] = entry
    return out


def _whole_stats(whole: Iterable[SpanRecord]) -> List[Tuple[str, int, int]]:
    """(service, spans, error spans) of a trace's spans, each span once."""
    seen: Dict[int, SpanRecord] = {s.span_id: s for s in whole}
    counts: Dict[str, List[int]] = {}
    for span in seen.values():
        entry = counts.setdefault(span.service, [0, 0])
        entry[0] += 1
        entry[1] += span.status_code == ERROR_CODE
    return [(service, n, e) for service, (n, e) in sorted(counts.items())]


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


def _response(traces: List[Dict[str, Any]], work: Optional[_Work] = None) -> Dict[str, object]:
    # SearchMetrics in protobuf's JSON mapping: uint32 as numbers, (u)int64 as strings.
    metrics: Dict[str, object] = {}
    if work is not None:
        metrics = {"inspectedTraces": work.traces, "inspectedSpans": str(work.spans)}
    metrics.update(completedJobs=1, totalJobs=1)
    if work is not None and work.notes:
        metrics["additionalMetrics"] = {k: str(v) for k, v in work.notes.items()}
    body: Dict[str, object] = {"metrics": metrics}
    if traces:
        body = {"traces": traces, **body}
    return body


# -- the engine path -----------------------------------------------------------------------------


class _Work:
    """What an engine search read and whether it stopped short: ``notes`` go to
    ``metrics.additionalMetrics`` (``partial`` when a bound stopped it, with the bound:
    ``deadlineExceeded``, ``spanBudgetExceeded``; ``tracesTooLarge``: traces not judged
    because their spans were more than one read returns)."""

    def __init__(self, params: SearchParams) -> None:
        self.traces = 0
        self.spans = 0
        self.read = 0  # spans read from the store, candidates and whole traces
        self.max_spans = params.max_spans
        self.deadline = time.monotonic() + params.deadline_s
        self.notes: Dict[str, int] = {}

    def stop(self, reading: bool = True) -> bool:
        """Whether a bound is reached (and the answer is partial): the time, and the spans
        when about to read more (``reading``: spans read already are judged)."""
        if reading and self.read >= self.max_spans:
            self.notes.update(partial=1, spanBudgetExceeded=1)
        elif time.monotonic() > self.deadline:
            self.notes.update(partial=1, deadlineExceeded=1)
        return "partial" in self.notes

    def too_large(self) -> None:
        self.notes["tracesTooLarge"] = self.notes.get("tracesTooLarge", 0) + 1


def _pipeline_search(
    store: Any, tenant: str, params: SearchParams, query: Query
) -> Dict[str, object]:
    work = _Work(params)
    limit = min(MAX_CANDIDATE_SPANS, params.max_spans)
    candidates = store.span_records(
        tenant, params.start_ns, params.end_ns, query.pushdown, limit=limit
    )
    work.read += len(candidates)
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
    complete = not query.needs_traces and len(candidates) < limit
    by_duration = params.order == "duration"
    found: List[Tuple[List[SpanRecord], List[Spanset]]] = []
    for batch_start in range(0, len(trace_ids), TRACES_PER_BATCH):
        if work.stop():
            break
        batch = trace_ids[batch_start : batch_start + TRACES_PER_BATCH]
        if complete:
            batch_spans: Iterable[List[SpanRecord]] = (by_trace[t] for t in batch)
        else:
            batch_spans = _trace_spans(store, tenant, params, query, batch, work)
        for spans in batch_spans:
            if work.stop(reading=False):
                break
            work.traces += 1
            work.spans += len(spans)
            raw = _stored(store, tenant, spans[0].trace_id) if query.needs_raw else None
            spansets = evaluate(query, spans, raw)
            if spansets:
                found.append((spans, spansets))
        if not by_duration and len(found) >= params.limit:
            break
    wholes = _whole_traces(store, tenant, params, query, [spans for spans, _ in found])
    traces = []
    for spans, sets in found:
        whole = wholes.get(spans[0].trace_id, spans)
        traces.append((_trace_json(params, whole, sets), whole))
    if by_duration:
        traces.sort(key=lambda t: (-_duration_ns(t[1]), t[0]["traceID"]))
    else:
        traces.sort(key=lambda t: (-int(t[0]["startTimeUnixNano"]), t[0]["traceID"]))
    shown = [t for t, _ in traces[: params.limit]]
    if query.shown:
        known = {t["traceID"]: wholes[t["traceID"]] for t in shown if t["traceID"] in wholes}
        _add_attributes(store, tenant, params, shown, query.shown, known)
    return _response(shown, work)


def _stored(store: Any, tenant: str, trace_id: str) -> Dict[int, Any]:
    """A trace's stored spans (with their OTLP messages and scopes), by span id."""
    return {s.span_id: s for s in store.trace(tenant, trace_id)}


def _duration_ns(spans: Sequence[SpanRecord]) -> int:
    return max(s.end_ns for s in spans) - min(s.start_ns for s in spans)


def _window(params: SearchParams) -> Tuple[int, int]:
    """Where whole traces are read: the search range and a margin around it."""
    return max(params.start_ns - TRACE_MARGIN_NS, 0), params.end_ns + TRACE_MARGIN_NS


def _trace_spans(
    store: Any,
    tenant: str,
    params: SearchParams,
    query: Query,
    batch: Sequence[str],
    work: _Work,
) -> Iterable[List[SpanRecord]]:
    """The spans of each trace of ``batch`` the query reads: all of them (within a margin
    around the range) when it needs whole traces, else those meeting its pushdown.  A read
    the store cut (``MAX_SPANS_PER_BATCH``) is done again trace by trace, and a trace still
    cut is not judged (counted in ``tracesTooLarge``): the engine never sees part of one."""
    if query.needs_traces:
        start, end = _window(params)
        conditions: Sequence[Condition] = ()
    else:
        start, end, conditions = params.start_ns, params.end_ns, query.pushdown

    def read(ids: Sequence[str]) -> Optional[Dict[str, List[SpanRecord]]]:
        records = store.span_records(
            tenant, start, end, conditions, trace_ids=list(ids), limit=MAX_SPANS_PER_BATCH
        )
        work.read += len(records)
        if len(records) >= MAX_SPANS_PER_BATCH:
            return None
        by_trace: Dict[str, List[SpanRecord]] = {t: [] for t in ids}
        for span in records:
            by_trace.setdefault(span.trace_id, []).append(span)
        return by_trace

    whole = read(batch)
    for trace_id in batch:
        if whole is not None:
            spans = whole[trace_id]
        elif work.stop():
            return
        else:
            alone = read([trace_id]) if len(batch) > 1 else None
            if alone is None:
                work.too_large()
                continue
            spans = alone[trace_id]
        if spans:
            yield spans


def _whole_traces(
    store: Any, tenant: str, params: SearchParams, query: Query, found: List[List[SpanRecord]]
) -> Dict[str, List[SpanRecord]]:
    """Every span of each found trace, by trace id, for its root, bounds and attributes: the
    query read them all when it needs whole traces, else more reads (TRACES_PER_BATCH traces
    each) get them; a trace too large for one read is left out (its caller keeps the spans
    it has)."""
    if query.needs_traces:
        return {spans[0].trace_id: spans for spans in found}
    ids = [spans[0].trace_id for spans in found]
    out: Dict[str, List[SpanRecord]] = {}
    for i in range(0, len(ids), TRACES_PER_BATCH):
        out.update(_read_whole(store, tenant, params, ids[i : i + TRACES_PER_BATCH]))
    return out


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
        "durationMs": duration_ms(end - start),
        "spanSet": out_sets[0],
        "spanSets": out_sets,
        "serviceStats": _service_stats_json(_whole_stats(whole)),
    }


def _span_json(span: Union[SpanRecord, MatchedSpan]) -> Dict[str, Any]:
    """A span the search found (either path), as Tempo's Span message."""
    return {
        "spanID": f"{span.span_id:016x}",
        "name": span.name,
        "startTimeUnixNano": str(span.start_ns),
        "durationNanos": str(span.duration_ns),
    }


# -- attributes ----------------------------------------------------------------------------------


def _key_value(key: str, value: object) -> Dict[str, Any]:
    return {"key": key, "value": _any_value(value)}


def _any_value(value: object) -> Dict[str, Any]:
    """A spanset attribute (by()'s value, an aggregate) as an OTLP AnyValue in JSON."""
    if value is None or isinstance(value, Nil):
        return {"stringValue": "nil"}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, Duration):
        return {"stringValue": str(value)}
    if isinstance(value, Text):
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


# Values typed as received come from the raw OTLP spans, which the store gives only a whole
# trace at a time: the first RAW_TYPED_TRACES traces of an answer get them (what Grafana shows
# first); the others' are typed from the span index's text (a string "200" shows as a number),
# read for TRACES_PER_BATCH traces per statement, or taken from the spans the engine read.
RAW_TYPED_TRACES = 100


def _add_attributes(
    store: Any,
    tenant: str,
    params: SearchParams,
    traces: List[Dict[str, Any]],
    shown: Sequence[Attribute],
    known: Optional[Dict[str, List[SpanRecord]]] = None,
) -> None:
    """Put on each span of ``traces`` the ``shown`` attributes it has; ``known``: every span
    of some of the traces, by trace id, when the caller has them."""
    wanted = []
    for trace in traces:
        spans = {int(s["spanID"], 16): s for ss in trace["spanSets"] for s in ss["spans"]}
        if spans:
            wanted.append((trace["traceID"], spans))
    raw = RAW_TYPED_TRACES if any(_needs_raw(a) for a in shown) else 0
    for trace_id, spans in wanted[:raw]:
        _label(spans, store.trace(tenant, trace_id), shown, typed=True)
    rest = wanted[raw:]
    known = known or {}
    unknown = [t for t, _ in rest if t not in known]
    for i in range(0, len(unknown), TRACES_PER_BATCH):
        known.update(_read_whole(store, tenant, params, unknown[i : i + TRACES_PER_BATCH]))
    for trace_id, spans in rest:
        if trace_id in known:
            _label(spans, known[trace_id], shown, typed=False)


def _read_whole(
    store: Any, tenant: str, params: SearchParams, ids: Sequence[str]
) -> Dict[str, List[SpanRecord]]:
    """The spans of traces ``ids`` (in the margin around the range), leaving out a trace the
    store cut (read again alone): a cut trace would number its tree wrong."""
    start, end = _window(params)
    records = store.span_records(tenant, start, end, trace_ids=list(ids), limit=MAX_SPANS_PER_BATCH)
    if len(records) >= MAX_SPANS_PER_BATCH:
        if len(ids) == 1:
            return {}
        out: Dict[str, List[SpanRecord]] = {}
        for trace_id in ids:
            out.update(_read_whole(store, tenant, params, [trace_id]))
        return out
    by_trace: Dict[str, List[SpanRecord]] = {}
    for span in records:
        by_trace.setdefault(span.trace_id, []).append(span)
    return by_trace


def _label(
    wanted: Dict[int, Dict[str, Any]],
    trace: Sequence[Any],
    shown: Sequence[Attribute],
    typed: bool,
) -> None:
    """Label the ``wanted`` spans (JSON, by span id) of one trace, whose spans are ``trace``:
    StoredSpans with their raw messages when ``typed``, else SpanRecords."""
    stored = {s.span_id: s for s in trace}
    children: Dict[int, int] = {}
    if any(a.name == "childCount" for a in shown):
        for s in stored.values():
            if s.parent_span_id in stored:
                children[s.parent_span_id] = children.get(s.parent_span_id, 0) + 1
    # Traces Drilldown's structure tab draws the tree from these three.
    nested = (
        nested_set(list(stored.values()))
        if any(a.name.startswith("nestedSet") for a in shown)
        else {}
    )
    needs_values = any(_needs_raw(a) for a in shown)
    wants_events = any(a.scope == "event" for a in shown)
    for span_id, span in wanted.items():
        item = stored.get(span_id)
        if item is None:
            continue
        attrs: Dict[str, Dict[str, Any]] = {}
        resource: Dict[str, Dict[str, Any]] = {}
        events: Dict[str, Dict[str, Any]] = {}
        if needs_values and typed:
            message = Span.FromString(item.raw)
            attrs = _typed(message.attributes)
            if message.status.message:
                attrs[STATUS_MESSAGE] = {"stringValue": message.status.message}
            resource = _typed(Resource.FromString(item.group.resource).attributes)
            if wants_events:
                # As Tempo shows them: by bare name, the latest event's value of each.
                for event in message.events:
                    events.update(_typed(event.attributes))
        elif needs_values:
            attrs = _index_values(item.attrs)
            resource = _index_values(item.resource_attrs)
        out = []
        for attr in shown:
            if attr.scope == "event":
                value = events.get(attr.name)  # only a trace read whole has its events
            else:
                value = _shown_value(attr, item, attrs, resource, children, nested)
            if value is not None:
                out.append({"key": _shown_key(attr), "value": value})
        if out:
            span["attributes"] = out


# Where _label keeps a span's status message among its attributes: a key no attribute has.
STATUS_MESSAGE = "\0statusMessage"


def _needs_raw(attr: Attribute) -> bool:
    """Whether a shown attribute's value is read from the stored OTLP span."""
    return attr.scope != "intrinsic" or attr.name == "statusMessage"


def _index_values(flat: str) -> Dict[str, Dict[str, Any]]:
    """A flattened attribute text's values as AnyValues: typed as their text reads, but for
    strings that read as a number or a boolean (kept after STRING_US); a key with several
    records (an array's elements) as an array."""
    out: Dict[str, Dict[str, Any]] = {}
    for record in flat.split(RS):
        key, sep, value = record.partition(US)
        if sep:
            item = _any_value(Text(value))
        else:
            key, sep, value = record.partition(STRING_US)
            if not sep:
                continue
            item = {"stringValue": value}
        before = out.get(key)
        if before is None:
            out[key] = item
        elif "arrayValue" in before:
            before["arrayValue"]["values"].append(item)
        else:
            out[key] = {"arrayValue": {"values": [before, item]}}
    return out


def _typed(attributes: Iterable[Any]) -> Dict[str, Dict[str, Any]]:
    out: Dict[str, Dict[str, Any]] = {}
    for kv in attributes:
        value = _otlp_value(kv.value)
        if value is not None:
            out[kv.key] = value
    return out


def _shown_key(attr: Attribute) -> str:
    """The key Tempo gives an attribute in search results: its name, without scope."""
    if attr.scope != "intrinsic":
        return attr.name
    return attr.name.split(":")[-1] if attr.name.startswith("span:") else attr.name


def _shown_value(
    attr: Attribute,
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
        if attr.name == "statusMessage":  # span:statusMessage too: the parser's name
            return attrs.get(STATUS_MESSAGE)
        return None
    if attr.scope in ("span", "") and attr.name in attrs:
        return attrs[attr.name]
    if attr.scope in ("resource", "") and attr.name in resource:
        return resource[attr.name]
    return None


__all__ = ["SearchParams", "search", "QueryError", "SearchError"]
