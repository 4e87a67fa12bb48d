"""OTLP spans to rows: the span path reads attributes on its own (fewer protobuf reads than
``attribute_pairs``) and must give the same text and types for every kind of value; spans
that cannot be stored are refused one by one, the rest kept."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from hotspan.formats import otlp_traces
from hotspan.formats.otlp import ArrayBudget, attribute_pairs
from hotspan.model.trace import flatten_attributes

T = 1_700_000_000 * 10**9


def _request() -> ExportTraceServiceRequest:
    r = ExportTraceServiceRequest()
    rs = r.resource_spans.add()
    rs.resource.attributes.add(key="service.name").value.string_value = "svc"
    rs.scope_spans.add()
    return r


def _span(r: ExportTraceServiceRequest, **fields):  # type: ignore[no-untyped-def]
    span = (
        r.resource_spans[0]
        .scope_spans[0]
        .spans.add(
            trace_id=b"\x01" * 16,
            span_id=bytes([2, 0, 0, 0, 0, 0, 0, len(r.resource_spans[0].scope_spans[0].spans) + 1]),
            name="op",
            start_time_unix_nano=T,
            end_time_unix_nano=T + 10**6,
        )
    )
    for key, value in fields.items():
        setattr(span, key, value)
    return span


def test_every_kind_of_value_reads_as_attribute_pairs_reads_it() -> None:
    r = _request()
    span = _span(r)
    values = span.attributes
    values.add(key="s").value.string_value = "text"
    values.add(key="s200").value.string_value = "200"
    values.add(key="i").value.int_value = -7
    values.add(key="big").value.int_value = 2**62
    values.add(key="t").value.bool_value = True
    values.add(key="f").value.bool_value = False
    values.add(key="d").value.double_value = 1.5
    values.add(key="d3").value.double_value = 3.0
    values.add(key="nan").value.double_value = float("nan")
    values.add(key="by").value.bytes_value = b"\x00\x01"
    values.add(key="arr").value.array_value.values.add().int_value = 3
    kv = values.add(key="kv").value.kvlist_value.values.add(key="z")
    kv.value.bool_value = True
    values.add(key="unset")
    values.add(key="sep\x1ekey").value.string_value = "v\x1fw"
    expected = attribute_pairs(span.attributes, ArrayBudget(span.ByteSize()))
    assert otlp_traces._pairs(span.attributes, ArrayBudget(span.ByteSize())) == expected
    [row] = otlp_traces.to_span_batch(r).batch.rows
    assert row.attrs == flatten_attributes(expected)
    assert {t for _, _, t in expected} == {"string", "int", "bool", "float"}


def test_bad_spans_are_refused_one_by_one() -> None:
    r = _request()
    good = _span(r, kind=2)
    good.status.code = 2
    _span(r, kind=99).status.code = 9  # out of range: read as unspecified / unset
    _span(r, trace_id=b"")
    _span(r, span_id=b"\x00" * 8)
    _span(r, parent_span_id=b"\x01" * 3)
    _span(r, start_time_unix_nano=5)
    _span(r, end_time_unix_nano=2**63)
    _span(r, start_time_unix_nano=T + 10**9)
    result = otlp_traces.to_span_batch(r)
    assert result.rejected.count == 6
    message = result.rejected.message()
    assert "trace id must be 16 bytes" in message and "span id must be 8 bytes" in message
    first, second = result.batch.rows
    assert (first.kind, first.status_code, first.service) == (2, 2, "svc")
    assert (second.kind, second.status_code) == (0, 0)
    assert first.trace_id == "01" * 16 and first.span_id == 0x0200000000000001
    assert first.raw == good.SerializeToString()
