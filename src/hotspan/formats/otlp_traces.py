"""OTLP traces in (``ExportTraceServiceRequest``) and out (``TracesData``).

A span that cannot be stored (ids missing or of the wrong length, times that are not times)
is rejected on its own and counted, as OTLP's partial success expects; the rest of the request
is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, TracesData

from hotspan._speedups import load_module
from hotspan.formats.errors import FormatError
from hotspan.formats.otlp import (
    MAX_ITEMS,
    MAX_REASONS,
    MAX_RESOURCES,
    MAX_SCOPES,
    MIN_TIME_NS,
    ArrayBudget,
    Rejections,
    add_array_pairs,
    any_value_text,
    attribute_pairs,
    check_count,
    check_time,
    decode_request,
)
from hotspan.model.profile import MAX_TIME_NS
from hotspan.model.trace import (
    MAX_TAG_VALUE_LENGTH,
    SPAN_KINDS,
    STATUS_CODES,
    SpanBatch,
    SpanGroup,
    SpanWriteRow,
    StoredSpan,
    flatten_attributes,
)

SERVICE_NAME_ATTR = "service.name"
UNKNOWN_SERVICE = "unknown_service"

__all__ = [
    "ExportTraceServiceRequest",
    "ExportTraceServiceResponse",
    "SpansResult",
    "decode",
    "from_protobuf",
    "to_span_batch",
    "traces_data",
]


@dataclass
class SpansResult:
    batch: SpanBatch
    rejected: Rejections = field(default_factory=Rejections)


def decode(body: bytes, is_json: bool) -> ExportTraceServiceRequest:
    return decode_request(body, is_json, ExportTraceServiceRequest)


# The C twin of to_span_batch, reading the request's bytes (None when not built).
_fast = load_module("_otlp")
_LIMITS = (
    MAX_RESOURCES,
    MAX_SCOPES,
    MAX_ITEMS,
    MAX_TAG_VALUE_LENGTH,
    MIN_TIME_NS,
    MAX_TIME_NS,
    MAX_REASONS,
)


def from_protobuf(body: bytes, native: bool = True) -> SpansResult:
    """:func:`to_span_batch` of a protobuf ``ExportTraceServiceRequest``'s bytes.  The C
    reader (when built) gives the same batch, except that a span's ``raw``, a resource and a
    scope are the bytes received rather than re-serialized (the same bytes for a request
    written as protobuf writes it); a request it does not read as the Python path would
    (malformed, unusual or too large) is left to the Python path, which refuses it or reads it.
    """
    if native and _fast is not None:
        batch = SpanBatch()
        done = _fast.span_batch(bytes(body), batch, SpanWriteRow, SpanGroup, _LIMITS)
        if done is not None:
            count, reasons = done
            return SpansResult(batch, Rejections(count, reasons))
    return to_span_batch(decode(body, False), len(body))


def to_span_batch(
    request: ExportTraceServiceRequest, request_bytes: Optional[int] = None
) -> SpansResult:
    """The spans of a request as a batch, with the spans refused and why (FormatError for a
    request refused whole).  ``request_bytes``: the size it came in (its protobuf size when
    not given), which bounds what its array attributes may write (ArrayBudget)."""
    result = SpansResult(SpanBatch())
    budget = ArrayBudget(request.ByteSize() if request_bytes is None else request_bytes)
    batch = result.batch
    check_count(len(request.resource_spans), MAX_RESOURCES, "resource spans")
    scopes = sum(len(rs.scope_spans) for rs in request.resource_spans)
    check_count(scopes, MAX_SCOPES, "scope spans")
    spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    check_count(spans, MAX_ITEMS, "spans")
    # Every span costs tens of microseconds of Python here, most of it reading protobuf
    # fields (each read makes an object): each field is read once, into a local.
    append_row = batch.rows.append
    add_tags = batch.add_tags
    for rs in request.resource_spans:
        resource_attrs = attribute_pairs(rs.resource.attributes, budget)
        service = next((v for k, v, _ in resource_attrs if k == SERVICE_NAME_ATTR), "")
        service = service or UNKNOWN_SERVICE
        resource = rs.resource.SerializeToString()
        resource_text = flatten_attributes(resource_attrs)
        latest = 0
        for ss in rs.scope_spans:
            scope_latest = 0
            gid = batch.add_group(
                SpanGroup(
                    service=service,
                    resource=resource,
                    resource_schema_url=rs.schema_url,
                    scope=ss.scope.SerializeToString(),
                    scope_schema_url=ss.schema_url,
                    attrs=resource_text,
                )
            )
            for span in ss.spans:
                span_attrs = _pairs(span.attributes, budget)
                try:
                    row = _row(span, service, gid, flatten_attributes(span_attrs))
                except FormatError as exc:
                    result.rejected.add(str(exc))
                    continue
                append_row(row)
                end = row.end_ns
                add_tags("span", span_attrs, end)
                intrinsics = [
                    ("name", row.name, "string"),
                    ("status", STATUS_CODES[row.status_code], "keyword"),
                    ("kind", SPAN_KINDS[row.kind], "keyword"),
                ]
                add_tags("intrinsic", intrinsics, end)
                if span.events or span.links or span.status.message:
                    _add_extra_tags(batch, span, end)
                if end > scope_latest:
                    scope_latest = end
            if scope_latest:
                _add_scope_tags(batch, ss.scope, scope_latest)
                if scope_latest > latest:
                    latest = scope_latest
        if latest:
            add_tags("resource", resource_attrs, latest)
    return result


def _add_extra_tags(batch: SpanBatch, span: Span, end: int) -> None:
    """The tags of a span's status message, events and links (TraceQL's ``statusMessage``,
    ``event:name``, ``event.*`` and ``link.*``), which the tag APIs list as Tempo does."""
    if span.status.message:
        batch.add_tags("intrinsic", [("statusMessage", span.status.message, "string")], end)
    for event in span.events:
        batch.add_tags("event", _pairs(event.attributes, None), end)
        if event.name:
            batch.add_tags("intrinsic", [("event:name", event.name, "string")], end)
    for link in span.links:
        batch.add_tags("link", _pairs(link.attributes, None), end)


def _add_scope_tags(batch: SpanBatch, scope: InstrumentationScope, latest: int) -> None:
    """The tags of an instrumentation scope (``instrumentation:name``, ``:version`` and
    ``instrumentation.*``), seen when the latest of its spans ended."""
    batch.add_tags("instrumentation", _pairs(scope.attributes, None), latest)
    named = [("instrumentation:name", scope.name), ("instrumentation:version", scope.version)]
    batch.add_tags("intrinsic", [(k, v, "string") for k, v in named if v], latest)


# TraceQL's type of an attribute by its AnyValue kind, as ``attribute_pairs`` names them.
_TYPES = {"int_value": "int", "double_value": "float", "bool_value": "bool"}


def _pairs(attributes: Iterable[Any], budget: Optional[ArrayBudget]) -> List[Tuple[str, str, str]]:
    """:func:`~hotspan.formats.otlp.attribute_pairs`, with the kinds spans carry most
    (strings, integers, booleans) read without a second look at the value.  Without a
    ``budget``, only strings, booleans, ints and doubles: events', links' and scopes'
    attributes are only indexed as tags, where an array's or a map's text, never bounded
    there, must not get a request refused."""
    out = []
    for kv in attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "string_value":
            out.append((kv.key, value.string_value, "string"))
        elif kind == "int_value":
            out.append((kv.key, str(value.int_value), "int"))
        elif kind == "bool_value":
            out.append((kv.key, "true" if value.bool_value else "false", "bool"))
        elif kind == "array_value":
            if budget is not None:
                add_array_pairs(out, kv.key, value.array_value, budget)
        elif budget is not None or kind == "double_value":
            out.append((kv.key, any_value_text(value), _TYPES.get(kind, "string")))
    return out


def _row(span: Span, service: str, gid: int, attrs: str) -> SpanWriteRow:
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if len(trace_id) != 16 or not any(trace_id):
        raise FormatError(f"span {span.name!r}: trace id must be 16 bytes, not all zero")
    if len(span_id) != 8 or not any(span_id):
        raise FormatError(f"span {span.name!r}: span id must be 8 bytes, not all zero")
    if len(parent) not in (0, 8):
        raise FormatError(f"span {span.name!r}: parent span id must be 8 bytes or empty")
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if not (MIN_TIME_NS <= start < MAX_TIME_NS and MIN_TIME_NS <= end < MAX_TIME_NS):
        check_time(start, f"span {span.name!r}: start time")
        check_time(end, f"span {span.name!r}: end time")
    if end < start:
        raise FormatError(f"span {span.name!r} ends before it starts")
    kind: int = span.kind
    if not 0 <= kind < len(SPAN_KINDS):
        kind = 0
    status: int = span.status.code
    if not 0 <= status < len(STATUS_CODES):
        status = 0
    return SpanWriteRow(
        trace_id.hex(),
        int.from_bytes(span_id, "big"),
        int.from_bytes(parent, "big") if parent else 0,
        span.name,
        kind,
        service,
        start,
        end,
        status,
        attrs,
        gid,
        span.SerializeToString(),
    )


def traces_data(spans: Iterable[StoredSpan]) -> TracesData:
    """Stored spans back as OTLP, one ``ResourceSpans`` per resource and scope."""
    out = TracesData()
    by_group: Dict[tuple, object] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        g = span.group
        key = (g.resource, g.resource_schema_url, g.scope, g.scope_schema_url)
        scope_spans = by_group.get(key)
        if scope_spans is None:
            rs = out.resource_spans.add(schema_url=g.resource_schema_url)
            rs.resource.CopyFrom(Resource.FromString(g.resource))
            scope_spans = rs.scope_spans.add(schema_url=g.scope_schema_url)
            scope_spans.scope.CopyFrom(InstrumentationScope.FromString(g.scope))
            by_group[key] = scope_spans
        scope_spans.spans.add().MergeFromString(span.raw)  # type: ignore[attr-defined]
    return out
