"""The C OTLP span reader against the Python one (its reference): a broad corpus of requests
(every kind of attribute value, events, links, status, resource and scope attributes, empty
and missing fields, unknown fields, big requests) gives identical batches; malformed and
mutated bytes are refused alike or read alike; doubles are written as Python writes them."""

from __future__ import annotations

import math
import random
import struct
from typing import Any, Callable, Optional, Tuple

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hotspan.formats import otlp_traces
from hotspan.formats.errors import FormatError
from hotspan.formats.otlp import MAX_ITEMS, TooLarge, any_value_text
from hotspan.model.trace import RS, STRING_US, US

pytestmark = pytest.mark.skipif(otlp_traces._fast is None, reason="C extension _otlp not built")

T = 1_700_000_000 * 10**9


def _value(v: AnyValue, kind: str, rng: random.Random, depth: int = 0) -> None:
    if kind == "string":
        v.string_value = rng.choice(
            ["", "GET", "200", "-1.5e3", "true", "x\x1ey\x1fz\x1c", "é☃𝄞", 'a"b\\c\n\t\x00\x7f']
        )
    elif kind == "bool":
        v.bool_value = rng.random() < 0.5
    elif kind == "int":
        v.int_value = rng.choice([0, -1, 7, 2**63 - 1, -(2**63), rng.randrange(-(10**12), 10**12)])
    elif kind == "double":
        v.double_value = rng.choice(
            [0.0, -0.0, 1.5, 3.0, 1e-5, 1e-4, 0.1, 1 / 3, 1e22, 2.0**70, -2.5e-300, 5e-324]
            + [math.inf, -math.inf, math.nan, rng.uniform(-1e6, 1e6), rng.random() * 1e-9]
        )
    elif kind == "bytes":
        v.bytes_value = bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
    elif kind == "array":
        arr = v.array_value
        for _ in range(rng.randrange(4)):
            _value(arr.values.add(), _kind(rng, depth), rng, depth + 1)
    elif kind == "kvlist":
        kvs = v.kvlist_value
        for _ in range(rng.randrange(5)):
            kv = kvs.values.add(key=rng.choice(["a", "b", "é", 'q"', "a"]))
            _value(kv.value, _kind(rng, depth), rng, depth + 1)


KINDS = ["string", "bool", "int", "double", "bytes", "array", "kvlist", "unset"]


def _kind(rng: random.Random, depth: int) -> str:
    return rng.choice(KINDS if depth < 3 else KINDS[:5])


def _attrs(attrs: Any, rng: random.Random, n: int) -> None:
    for i in range(n):
        kv = attrs.add(key=rng.choice(["k", "service.name", "http.method", f"k{i}", "", "ké"]))
        kind = _kind(rng, 0)
        if kind != "unset":
            _value(kv.value, kind, rng)


def _request(rng: random.Random, spans: int = 20) -> ExportTraceServiceRequest:
    r = ExportTraceServiceRequest()
    for _ in range(rng.randrange(1, 4)):
        rs = r.resource_spans.add()
        if rng.random() < 0.8:
            rs.resource.attributes.add(key="service.name").value.string_value = rng.choice(
                ["svc", "", "other"]
            )
            _attrs(rs.resource.attributes, rng, rng.randrange(4))
        if rng.random() < 0.3:
            rs.schema_url = "https://opentelemetry.io/schemas/1.21.0"
        for _ in range(rng.randrange(0, 3)):
            ss = rs.scope_spans.add()
            if rng.random() < 0.7:
                ss.scope.name = "lib"
                ss.scope.version = rng.choice(["", "1.0"])
                _attrs(ss.scope.attributes, rng, rng.randrange(3))
            for i in range(rng.randrange(spans)):
                _span(ss.spans.add(), rng, i)
    return r


def _span(s: Span, rng: random.Random, i: int) -> None:
    s.trace_id = bytes([1 + i % 200]) + bytes(rng.randrange(256) for _ in range(15))
    s.span_id = bytes([0x80 | i % 100]) + bytes(rng.randrange(256) for _ in range(7))
    if rng.random() < 0.6:
        s.parent_span_id = bytes(rng.randrange(1, 256) for _ in range(8))
    s.name = rng.choice(["GET /", "", "é", "x" * 300, "200"])
    s.kind = rng.choice([0, 1, 2, 3, 4, 5, 9])
    s.start_time_unix_nano = T + rng.randrange(10**9)
    s.end_time_unix_nano = s.start_time_unix_nano + rng.randrange(10**8)
    if rng.random() < 0.5:
        s.status.code = rng.choice([0, 1, 2, 7])
        s.status.message = rng.choice(["", "boom"])
    _attrs(s.attributes, rng, rng.randrange(10))
    for _ in range(rng.randrange(3)):
        e = s.events.add(name="ev", time_unix_nano=T)
        _attrs(e.attributes, rng, rng.randrange(3))
    for _ in range(rng.randrange(2)):
        link = s.links.add(trace_id=b"\x02" * 16, span_id=b"\x03" * 8, trace_state="a=b")
        _attrs(link.attributes, rng, rng.randrange(2))
    s.dropped_attributes_count = rng.randrange(3)
    s.flags = rng.randrange(3)
    bad = rng.random()
    if bad < 0.03:
        s.trace_id = b""
    elif bad < 0.06:
        s.span_id = b"\x00" * 8
    elif bad < 0.08:
        s.parent_span_id = b"\x01" * 3
    elif bad < 0.1:
        s.start_time_unix_nano = 5
    elif bad < 0.12:
        s.end_time_unix_nano = s.start_time_unix_nano - 1


def _one_span() -> Tuple[ExportTraceServiceRequest, Span]:
    """A request of one span (one resource, one scope), and the span."""
    r = ExportTraceServiceRequest()
    span = (
        r.resource_spans.add()
        .scope_spans.add()
        .spans.add(
            trace_id=b"\x01" * 16, span_id=b"\x01" * 8, start_time_unix_nano=T, end_time_unix_nano=T
        )
    )
    return r, span


def _outcome(body: bytes, native: bool) -> Any:
    try:
        if native:
            return otlp_traces.from_protobuf(body)
        return otlp_traces.to_span_batch(otlp_traces.decode(body, False), len(body))
    except TooLarge:
        return "too large"
    except FormatError:
        return "refused"


def _native(body: bytes) -> Optional[otlp_traces.SpansResult]:
    """The C reader alone: None where it leaves the request to Python."""
    batch = otlp_traces.SpanBatch()
    done = otlp_traces._fast.span_batch(  # type: ignore[union-attr]
        body, batch, otlp_traces.SpanWriteRow, otlp_traces.SpanGroup, otlp_traces._LIMITS
    )
    if done is None:
        return None
    return otlp_traces.SpansResult(batch, otlp_traces.Rejections(*done))


def _same(body: bytes) -> otlp_traces.SpansResult:
    mine, theirs = _native(body), _outcome(body, native=False)
    assert mine is not None, "the C reader left a well-formed request to Python"
    assert isinstance(theirs, otlp_traces.SpansResult)
    assert mine.batch.rows == theirs.batch.rows
    assert mine.batch.groups == theirs.batch.groups
    assert list(mine.batch.tags.items()) == list(theirs.batch.tags.items())
    assert mine.rejected == theirs.rejected
    return mine


@pytest.mark.parametrize("seed", range(40))
def test_a_broad_corpus_reads_alike(seed: int) -> None:
    rng = random.Random(seed)
    body = _request(rng).SerializeToString()
    result = _same(body)
    if seed == 0:
        assert len(result.batch.rows) > 0


def test_every_value_kind_and_every_part_of_a_span_is_covered() -> None:
    kinds = set()
    rejected = 0
    for seed in range(40):
        r = _request(random.Random(seed))
        for rs in r.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    kinds.update(kv.value.WhichOneof("value") for kv in s.attributes)
        rejected += _same(r.SerializeToString()).rejected.count
    assert kinds >= {
        "string_value",
        "bool_value",
        "int_value",
        "double_value",
        "bytes_value",
        "array_value",
        "kvlist_value",
        None,
    }
    assert rejected > 0


def test_empty_requests_and_missing_fields() -> None:
    for body in (b"", ExportTraceServiceRequest().SerializeToString()):
        assert len(_same(body).batch.rows) == 0
    r = ExportTraceServiceRequest()
    r.resource_spans.add().scope_spans.add().spans.add(
        trace_id=b"\x01" * 16, span_id=b"\x01" * 8, start_time_unix_nano=T, end_time_unix_nano=T
    )
    r.resource_spans.add()  # no resource, no scope
    result = _same(r.SerializeToString())
    [row] = result.batch.rows
    assert (row.service, row.name, row.attrs, row.parent_span_id) == ("unknown_service", "", "", 0)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    def varint(v: int) -> bytes:
        out = bytearray()
        while True:
            b = v & 0x7F
            v >>= 7
            out.append(b | (0x80 if v else 0))
            if not v:
                return bytes(out)

    key = varint(number << 3 | wire)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def test_unknown_fields_are_kept_in_the_raw_span_and_skipped() -> None:
    rng = random.Random(7)
    span = Span()
    _span(span, rng, 1)
    span.trace_id, span.start_time_unix_nano = b"\x05" * 16, T
    span.end_time_unix_nano = T + 1
    unknown = _field(99, 0, b"\x05") + _field(100, 2, b"xyz") + _field(101, 5, b"abcd")
    span_bytes = span.SerializeToString() + unknown
    scope = InstrumentationScope(name="s").SerializeToString() + _field(50, 1, b"12345678")
    resource = Resource().SerializeToString() + _field(77, 2, b"\xff\xfe")
    scope_spans = _field(1, 2, scope) + _field(2, 2, span_bytes) + _field(9, 0, b"\x01")
    resource_spans = _field(1, 2, resource) + _field(2, 2, scope_spans)
    body = _field(1, 2, resource_spans) + _field(5, 2, b"ignored")
    result = _same(body)
    [row] = result.batch.rows
    assert row.raw == span_bytes
    assert Span.FromString(row.raw).name == span.name


def test_a_big_request() -> None:
    rng = random.Random(3)
    r = ExportTraceServiceRequest()
    ss = r.resource_spans.add().scope_spans.add()
    for i in range(5000):
        _span(ss.spans.add(), rng, i)
    result = _same(r.SerializeToString())
    assert len(result.batch.rows) + result.rejected.count == 5000
    assert len(result.rejected.reasons) == 3


def test_an_array_is_one_record_per_element_in_both_readers() -> None:
    r, span = _one_span()
    service = r.resource_spans[0].resource.attributes.add(key="service.name").value.array_value
    service.values.add(string_value="api")
    service.values.add(string_value="ignored")
    accept = span.attributes.add(key="accept").value.array_value
    for text in ("text/html", "1", "true"):
        accept.values.add(string_value=text)
    codes = span.attributes.add(key="codes").value.array_value
    codes.values.add(int_value=200)
    codes.values.add(double_value=1.5)
    codes.values.add()  # an element without a value: the empty string, as a string
    codes.values.add().array_value.values.add(bool_value=True)  # nested: its JSON text
    span.attributes.add(key="empty").value.array_value.SetInParent()
    span.attributes.add(key="plain", value=AnyValue(string_value="x"))
    result = _same(r.SerializeToString())
    row = result.batch.rows[0]
    assert row.service == "api"
    assert row.attrs == (
        f"{RS}accept{US}text/html{RS}accept{STRING_US}1{RS}accept{STRING_US}true"
        f'{RS}codes{US}200{RS}codes{US}1.5{RS}codes{US}{RS}codes{US}["true"]'
        f"{RS}plain{US}x{RS}"
    )
    span_tags = {(k, v, kind) for (scope, k, v, kind) in result.batch.tags if scope == "span"}
    assert span_tags == {
        ("accept", "text/html", "string"),
        ("accept", "1", "string"),
        ("accept", "true", "string"),
        ("codes", "200", "int"),
        ("codes", "1.5", "float"),
        ("codes", "", "string"),
        ("codes", '["true"]', "string"),
        ("plain", "x", "string"),
    }


def test_an_array_of_a_million_empty_strings_is_refused_not_flattened() -> None:
    # 4 bytes of protobuf an element: a 2.4 MB request would make 600,000 records of one span.
    r, span = _one_span()
    array = span.attributes.add(key="k").value.array_value
    for _ in range(600_000):
        array.values.add(string_value="")
    body = r.SerializeToString()
    assert len(body) < 2_500_000
    assert _native(body) is None
    with pytest.raises(FormatError, match="array attribute is over"):
        otlp_traces.from_protobuf(body)


def test_too_many_spans_is_left_to_python_which_refuses() -> None:
    r = ExportTraceServiceRequest()
    ss = r.resource_spans.add().scope_spans.add()
    for _ in range(MAX_ITEMS + 1):
        ss.spans.add()
    body = r.SerializeToString()
    assert _native(body) is None
    assert _outcome(body, native=True) == "too large"


def test_malformed_and_odd_requests_go_to_python() -> None:
    good = _request(random.Random(1)).SerializeToString()
    bad_utf8 = _field(1, 2, _field(2, 2, _field(2, 2, _field(5, 2, b"\xff"))))
    twice = _field(1, 2, _field(1, 2, b"") + _field(1, 2, b""))  # a resource given twice
    wrong_wire = _field(1, 2, _field(2, 2, _field(2, 2, _field(5, 0, b"\x01"))))
    nested = b""
    for _ in range(200):
        nested = _field(5, 2, _field(1, 2, nested))  # AnyValue.array_value.values
    deep = _field(1, 2, _field(2, 2, _field(2, 2, _field(9, 2, _field(2, 2, nested)))))
    for body in (good[:-3], good + b"\x0a\x05ab", bad_utf8, twice, wrong_wire, deep, b"\x00"):
        assert _native(body) is None
        assert _outcome(body, native=True) == _outcome(body, native=False)


def _normal(outcome: Any) -> Any:
    """A result with raw bytes read back as messages, groups by content: the C reader slices
    what the Python path re-serializes, which differ for bytes protobuf would not write."""
    if not isinstance(outcome, otlp_traces.SpansResult):
        return outcome
    b = outcome.batch

    def canon(cls: Callable[..., Any], raw: bytes) -> bytes:
        return cls.FromString(raw).SerializeToString(deterministic=True)  # type: ignore[no-any-return]

    def group(gid: int) -> Tuple[Any, ...]:
        g = b.groups[gid]
        return (g.service, canon(Resource, g.resource), g.resource_schema_url,
                canon(InstrumentationScope, g.scope), g.scope_schema_url, g.attrs)  # fmt: skip

    rows = [r._replace(raw=canon(Span, r.raw), group_id=group(r.group_id)) for r in b.rows]
    return rows, sorted(map(group, b.groups)), list(b.tags.items()), outcome.rejected


def test_mutated_bytes_are_refused_alike_or_read_alike() -> None:
    rng = random.Random(11)
    seeds = [_request(random.Random(s), spans=4).SerializeToString() for s in range(8)]
    native_reads = 0
    for _ in range(1500):
        body = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            op = rng.randrange(3)
            at = rng.randrange(len(body) + 1)
            if op == 0 and body:
                body[min(at, len(body) - 1)] = rng.randrange(256)
            elif op == 1:
                del body[at : at + rng.randrange(1, 4)]
            else:
                body[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
        data = bytes(body)
        native_reads += _native(data) is not None
        assert _normal(_outcome(data, native=True)) == _normal(_outcome(data, native=False))
    assert native_reads > 30


def _double_text(d: float) -> str:
    r, s = _one_span()
    s.attributes.add(key="d").value.double_value = d
    result = _native(r.SerializeToString())
    assert result is not None
    return result.batch.rows[0].attrs[3:-1]


def test_doubles_are_written_as_python_writes_them() -> None:
    rng = random.Random(5)
    # Powers of two are where the shortest digits are hardest to find (uneven neighbours).
    values = [2.0**k for k in range(-1074, 1024)] + [-(2.0**-k) for k in range(1, 60)]
    values += [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(3000)]
    values += [rng.uniform(-1, 1) * 10.0 ** rng.randrange(-30, 30) for _ in range(3000)]
    values += [1e16, 1e17, 123456789012345678.0, 0.1 + 0.2, 1e-4, 9.999e-5, 5e-324]
    for d in values:
        v = AnyValue(double_value=d)
        assert _double_text(d) == any_value_text(v), d


def test_python_decode_error_is_the_answer() -> None:
    with pytest.raises(FormatError):
        otlp_traces.from_protobuf(b"\x0a\x05ab")
    with pytest.raises(DecodeError):
        ExportTraceServiceRequest.FromString(b"\x0a\x05ab")


def test_nested_values_cannot_blow_up_as_text() -> None:
    # Each level of nesting escapes the quotes of the one below: 4x the text per level.
    value = AnyValue(string_value='"')
    for _ in range(40):
        outer = AnyValue()
        outer.array_value.values.add().CopyFrom(value)
        value = outer
    r, span = _one_span()
    span.attributes.add(key="deep").value.CopyFrom(value)
    body = r.SerializeToString()
    assert len(body) < 300
    assert _native(body) is None
    with pytest.raises(FormatError, match="characters as text"):
        otlp_traces.from_protobuf(body)
    with pytest.raises(FormatError, match="characters as text"):
        otlp_traces.to_span_batch(otlp_traces.decode(body, False), len(body))


def test_status_message_events_links_and_scope_are_tags_in_both_readers() -> None:
    r, span = _one_span()
    r.resource_spans[0].resource.attributes.add(key="service.name").value.string_value = "api"
    scope = r.resource_spans[0].scope_spans[0].scope
    scope.name, scope.version = "opentelemetry.instrumentation.flask", "0.48b0"
    scope.attributes.add(key="lib.tier").value.int_value = 2
    span.status.code, span.status.message = 2, "connection refused"
    # A link before the event on the wire: both readers still add events' tags first.
    span.links.add(trace_id=b"\x02" * 16, span_id=b"\x03" * 8).attributes.add(
        key="link.kind"
    ).value.string_value = "follows"
    event = span.events.add(name="exception", time_unix_nano=T)
    event.attributes.add(key="exception.type").value.string_value = "ConnectionError"
    event.attributes.add(key="exception.escaped").value.bool_value = True
    span.events.add(name="")  # no name: no event:name value
    span.status.message = "connection refused"
    tags = set(_same(r.SerializeToString()).batch.tags)
    assert {t for t in tags if t[0] not in ("span", "resource")} == {
        ("intrinsic", "name", "", "string"),
        ("intrinsic", "status", "error", "keyword"),
        ("intrinsic", "kind", "unspecified", "keyword"),
        ("intrinsic", "statusMessage", "connection refused", "string"),
        ("intrinsic", "event:name", "exception", "string"),
        ("event", "exception.type", "ConnectionError", "string"),
        ("event", "exception.escaped", "true", "bool"),
        ("link", "link.kind", "follows", "string"),
        ("intrinsic", "instrumentation:name", "opentelemetry.instrumentation.flask", "string"),
        ("intrinsic", "instrumentation:version", "0.48b0", "string"),
        ("instrumentation", "lib.tier", "2", "int"),
    }


def test_an_events_or_links_array_or_map_is_not_a_tag_and_never_gets_the_request_refused() -> None:
    # Only a span's and a resource's attributes are bounded as text (and refused past it):
    # an event's map whose text would be over that bound is left out of the tags instead.
    r, span = _one_span()
    event = span.events.add(name="exception")
    event.attributes.add(key="ok").value.double_value = 0.1
    big = event.attributes.add(key="details").value.kvlist_value.values.add(key="quote")
    big.value.string_value = '"' * 600_000
    array = span.links.add(trace_id=b"\x02" * 16, span_id=b"\x03" * 8).attributes.add(key="ids")
    array.value.array_value.values.add().int_value = 7
    scope = r.resource_spans[0].scope_spans[0].scope
    scope.attributes.add(key="nothing")  # no value: not a tag either
    tags = set(_same(r.SerializeToString()).batch.tags)
    assert {t for t in tags if t[0] in ("event", "link", "instrumentation")} == {
        ("event", "ok", "0.1", "float")
    }
