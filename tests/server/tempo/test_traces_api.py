"""OTLP traces in, Grafana Tempo's HTTP API out, against a real server process.

Spans are made by the real OpenTelemetry SDK and sent by its real OTLP exporters (HTTP
protobuf, gzip, the OTLP-only port, gRPC).  OTLP JSON is built from the SDK's own encoding
(``encode_spans``) with hex ids, and bad bodies are real SDK spans with one field spoiled.
Tests share two servers and keep apart by tenant (``X-Scope-OrgID``).
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence

import grpc
import httpx
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context

from tests import traceql_cases
from tests.conftest import RunningServer, start_server
from tests.helpers import TLS

SEC = 10**9
MS = 10**6
MAX_BODY = 200_000
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
PROTOBUF = "application/x-protobuf"
# Spans are stamped two hours ago: inside the default search range (24 h), and in the past.
BASE_S = int(time.time()) - 2 * 3600
BASE = BASE_S * SEC
WINDOW = {"start": str(BASE_S - 60), "end": str(BASE_S + 3600)}
SEARCH_KEYS = {
    "traceID",
    "rootServiceName",
    "rootTraceName",
    "startTimeUnixNano",
    "durationMs",
    "spanSet",
    "spanSets",
    "serviceStats",
}
# SearchMetrics as pinned by Grafana's Tempo data source: any other key fails its strict parser.
METRIC_KEYS = {
    "inspectedTraces",
    "inspectedBytes",
    "totalBlocks",
    "completedJobs",
    "totalJobs",
    "totalBlockBytes",
    "inspectedSpans",
}
# Tempo's intrinsic scope (search.GetVirtualIntrinsicValues), in its order.
INTRINSICS = [
    "duration",
    "name",
    "status",
    "statusMessage",
    "kind",
    "rootServiceName",
    "rootName",
    "traceDuration",
    "event:name",
    "event:timeSinceStart",
    "link:spanID",
    "link:traceID",
    "instrumentation:name",
    "instrumentation:version",
    "trace:id",
    "span:id",
    "span:parentID",
    "span:status",
    "span:statusMessage",
    "span:duration",
    "span:name",
    "span:kind",
    "trace:rootName",
    "trace:rootService",
    "trace:duration",
]


# -- servers ---------------------------------------------------------------------------------


def _stop(srv: RunningServer) -> None:
    if srv.process.poll() is None:
        srv.stop()
    if srv.process.stdout:
        srv.process.stdout.close()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    s = start_server(
        tmp_path_factory.mktemp("traces") / "data", ["--max-body-bytes", str(MAX_BODY)]
    )
    yield s
    _stop(s)


@pytest.fixture(scope="module")
def auth_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    s = start_server(
        tmp_path_factory.mktemp("auth") / "data",
        ["--ingest-token", "in-t", "--query-token", "q-t"],
    )
    yield s
    _stop(s)


# -- the SDK side ----------------------------------------------------------------------------


class Checked(SpanExporter):
    """A real exporter whose every result is kept, so that a test knows the export worked."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.results: List[SpanExportResult] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.exporter.export(spans)
        self.results.append(result)
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()


def http_exporter(
    url: str,
    tenant: Optional[str] = None,
    token: Optional[str] = None,
    compression: Compression = Compression.NoCompression,
) -> HttpSpanExporter:
    headers = {}
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return HttpSpanExporter(
        endpoint=url + "/v1/traces", headers=headers, timeout=10, compression=compression
    )


def grpc_exporter(
    address: str, tenant: Optional[str] = None, token: Optional[str] = None
) -> GrpcSpanExporter:
    headers = {}
    if tenant:
        headers["x-scope-orgid"] = tenant
    if token:
        headers["authorization"] = f"Bearer {token}"
    return GrpcSpanExporter(endpoint=address, insecure=True, headers=headers, timeout=10)


class Tracing:
    """A TracerProvider whose spans go to real exporters and are also kept in memory."""

    def __init__(
        self,
        resource: Dict[str, object],
        exporters: Sequence[SpanExporter] = (),
        batch: bool = False,
        id_generator: Optional[IdGenerator] = None,
    ) -> None:
        self.memory = InMemorySpanExporter()
        self.exporters = [Checked(e) for e in exporters]
        self.provider = TracerProvider(
            resource=Resource(resource),  # type: ignore[arg-type]
            id_generator=id_generator,
        )
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        for e in self.exporters:
            self.provider.add_span_processor(
                BatchSpanProcessor(e) if batch else SimpleSpanProcessor(e)
            )
        self.tracer = self.provider.get_tracer("hotspan.tests", "1.0")

    def span(
        self,
        name: str,
        start_ns: int,
        duration_ns: int,
        parent: Optional[object] = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Optional[Dict[str, object]] = None,
        status: Optional[Status] = None,
        end: bool = True,
    ):  # type: ignore[no-untyped-def]
        span = self.tracer.start_span(
            name,
            context=set_span_in_context(parent) if parent is not None else None,  # type: ignore[arg-type]
            kind=kind,
            attributes=attributes,  # type: ignore[arg-type]
            start_time=start_ns,
        )
        if status is not None:
            span.set_status(status)
        if end:
            span.end(end_time=start_ns + duration_ns)
        return span

    def finish(self) -> List[ReadableSpan]:
        """Flush and shut down; every export must have succeeded."""
        self.provider.force_flush()
        self.provider.shutdown()
        for e in self.exporters:
            assert e.results and all(r is SpanExportResult.SUCCESS for r in e.results), e.results
        return list(self.memory.get_finished_spans())


def hex_id(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


def tid(span: ReadableSpan) -> str:
    return hex_id(span.context.trace_id, 32)


def sid(span: ReadableSpan) -> str:
    return hex_id(span.context.span_id, 16)


def otlp_json(request: ExportTraceServiceRequest) -> dict:
    """OTLP JSON of a request: protobuf's JSON mapping with trace and span ids in hex."""

    def fix(node):  # type: ignore[no-untyped-def]
        if isinstance(node, dict):
            return {
                k: base64.b64decode(v).hex()
                if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                else fix(v)
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    return fix(json_format.MessageToDict(request, use_integers_for_enums=True))


def post_otlp(
    url: str,
    body: bytes,
    content_type: str = PROTOBUF,
    tenant: Optional[str] = None,
    headers: Optional[dict] = None,
) -> httpx.Response:
    h = {"content-type": content_type, **(headers or {})}
    if tenant:
        h["X-Scope-OrgID"] = tenant
    with httpx.Client(timeout=30, verify=TLS) as c:
        return c.post(url + "/v1/traces", content=body, headers=h)


# -- the Tempo side --------------------------------------------------------------------------


def get(srv: RunningServer, path: str, tenant: Optional[str] = None, **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
    headers = dict(kw.pop("headers", {}))
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    with srv.client() as c:
        return c.get(path, headers=headers, **kw)


def trace_json(srv: RunningServer, trace_id: str, tenant: Optional[str] = None) -> dict:
    r = get(srv, f"/api/traces/{trace_id}", tenant)
    assert r.status_code == 200, r.text
    return r.json()


def trace_proto(srv: RunningServer, trace_id: str, tenant: Optional[str] = None) -> TracesData:
    r = get(srv, f"/api/traces/{trace_id}", tenant, headers={"Accept": "application/protobuf"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/protobuf"
    return TracesData.FromString(r.content)


def spans_by_name(doc: dict, key: str = "batches") -> Dict[str, dict]:
    out = {}
    for rs in doc[key]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                assert span["name"] not in out
                out[span["name"]] = span
    return out


def proto_spans(data) -> Dict[bytes, bytes]:  # type: ignore[no-untyped-def]
    """span id -> the serialized span, over every resource and scope."""
    return {
        span.span_id: span.SerializeToString()
        for rs in data.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    }


def search(srv: RunningServer, tenant: str, **params: str) -> httpx.Response:
    return get(srv, "/api/search", tenant, params=params)


def found(srv: RunningServer, tenant: str, **params: str) -> List[str]:
    """Trace ids a search finds, in the answer's order."""
    r = search(srv, tenant, **params)
    assert r.status_code == 200, r.text
    return [t["traceID"] for t in r.json().get("traces", [])]


def _varint(data: bytes, pos: int):  # type: ignore[no-untyped-def]
    shift = value = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def trace_by_id_response(body: bytes) -> TracesData:
    """Tempo's ``TraceByIDResponse``: field 1 (the trace), always there; nothing else here."""
    assert body[:1] == b"\x0a", body[:8]
    length, pos = _varint(body, 1)
    assert pos + length == len(body), "only field 1: status COMPLETE, no message"
    return TracesData.FromString(body[pos:])


# -- 1. round trips --------------------------------------------------------------------------


class FixedIds(IdGenerator):
    """Trace ids with leading zero digits, as Tempo's path parsing pads them."""

    def __init__(self) -> None:
        self.next_span = 0xFEDC_BA98_7654_0000  # the high bit set: unsigned 64-bit ids

    def generate_trace_id(self) -> int:
        return 0xABC123

    def generate_span_id(self) -> int:
        self.next_span += 1
        return self.next_span


def shop_trace(tracing: Tracing, t0: int) -> List[ReadableSpan]:
    """Three spans: server root, client child (error, an event), internal leaf (a link)."""
    root = tracing.span(
        "GET /cart",
        t0,
        40 * MS,
        kind=SpanKind.SERVER,
        attributes={
            "http.status_code": 200,
            "http.method": "GET",
            "ratio": 0.25,
            "cached": False,
            "tags": ["a", "b"],
        },
        status=Status(StatusCode.OK),
        end=False,
    )
    child = tracing.span(
        "SELECT carts",
        t0 + 5 * MS,
        20 * MS,
        parent=root,
        kind=SpanKind.CLIENT,
        attributes={"db.rows": 3},
        end=False,
    )
    child.add_event("retry", {"attempt": 2}, timestamp=t0 + 6 * MS)
    child.set_status(Status(StatusCode.ERROR, "connection reset"))
    leaf = tracing.tracer.start_span(
        "decode",
        context=set_span_in_context(child),
        links=[Link(root.get_span_context(), {"link.why": "follows"})],
        start_time=t0 + 10 * MS,
    )
    leaf.end(end_time=t0 + 15 * MS)
    child.end(end_time=t0 + 25 * MS)
    root.end(end_time=t0 + 40 * MS)
    return tracing.finish()


RESOURCE = {"service.name": "cart", "deployment.environment": "prod", "pod.replica": 3}
TRANSPORTS = [
    "http-protobuf",
    "http-protobuf-gzip",
    "otlp-port",
    "grpc",
    "http-json",
    "http-json-gzip",
]


def send_shop_trace(srv: RunningServer, transport: str, tenant: str) -> List[ReadableSpan]:
    exporters: List[SpanExporter] = []
    if transport == "http-protobuf":
        exporters = [http_exporter(srv.url, tenant)]
    elif transport == "http-protobuf-gzip":
        exporters = [http_exporter(srv.url, tenant, compression=Compression.Gzip)]
    elif transport == "otlp-port":
        assert srv.otlp_http_url
        exporters = [http_exporter(srv.otlp_http_url, tenant)]
    elif transport == "grpc":
        assert srv.otlp_grpc_address
        exporters = [grpc_exporter(srv.otlp_grpc_address, tenant)]
    spans = shop_trace(Tracing(RESOURCE, exporters), BASE)
    if transport.startswith("http-json"):
        body = json.dumps(otlp_json(encode_spans(spans))).encode()
        headers = {}
        if transport.endswith("gzip"):
            body, headers = gzip.compress(body), {"content-encoding": "gzip"}
        r = post_otlp(srv.url, body, "application/json; charset=utf-8", tenant, headers)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        assert r.json() == {}, "no partial_success when every span is stored"
    return spans


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_spans_come_back_from_the_trace_api(srv, transport: str) -> None:  # type: ignore[no-untyped-def]
    tenant = f"rt-{transport}"
    spans = send_shop_trace(srv, transport, tenant)
    by_name = {s.name: s for s in spans}
    root, child = by_name["GET /cart"], by_name["SELECT carts"]
    trace_id = tid(root)

    doc = trace_json(srv, trace_id, tenant)
    assert list(doc) == ["batches"]
    assert len(doc["batches"]) == 1
    batch = doc["batches"][0]
    assert batch["resource"]["attributes"] == [
        {"key": "service.name", "value": {"stringValue": "cart"}},
        {"key": "deployment.environment", "value": {"stringValue": "prod"}},
        {"key": "pod.replica", "value": {"intValue": "3"}},
    ]
    assert [ss["scope"] for ss in batch["scopeSpans"]] == [
        {"name": "hotspan.tests", "version": "1.0"}
    ]
    got = spans_by_name(doc)
    assert list(got) == ["GET /cart", "SELECT carts", "decode"], "in start order"
    for span in got.values():
        assert span["traceId"] == trace_id
    assert got["GET /cart"]["spanId"] == sid(root)
    assert "parentSpanId" not in got["GET /cart"]
    assert got["SELECT carts"]["spanId"] == sid(child)
    assert got["SELECT carts"]["parentSpanId"] == sid(root)
    assert got["decode"]["parentSpanId"] == sid(child)
    assert [got[n]["kind"] for n in got] == [2, 3, 1]  # SERVER, CLIENT, INTERNAL
    assert got["GET /cart"]["status"] == {"code": 1}
    assert got["SELECT carts"]["status"] == {"code": 2, "message": "connection reset"}
    assert got["decode"].get("status", {}) == {}
    assert got["GET /cart"]["startTimeUnixNano"] == str(BASE)
    assert got["GET /cart"]["endTimeUnixNano"] == str(BASE + 40 * MS)
    assert got["GET /cart"]["attributes"] == [
        {"key": "http.status_code", "value": {"intValue": "200"}},
        {"key": "http.method", "value": {"stringValue": "GET"}},
        {"key": "ratio", "value": {"doubleValue": 0.25}},
        {"key": "cached", "value": {"boolValue": False}},
        {
            "key": "tags",
            "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"stringValue": "b"}]}},
        },
    ]
    assert got["SELECT carts"]["attributes"] == [{"key": "db.rows", "value": {"intValue": "3"}}]
    assert got["SELECT carts"]["events"] == [
        {
            "timeUnixNano": str(BASE + 6 * MS),
            "name": "retry",
            "attributes": [{"key": "attempt", "value": {"intValue": "2"}}],
        }
    ]
    [link] = got["decode"]["links"]
    assert (link["traceId"], link["spanId"]) == (trace_id, sid(root))
    assert link["attributes"] == [{"key": "link.why", "value": {"stringValue": "follows"}}]

    # Protobuf: OTLP TracesData, every span exactly as the SDK encoded it.
    data = trace_proto(srv, trace_id, tenant)
    sent = encode_spans(spans)
    assert proto_spans(data) == proto_spans(sent)
    assert len(data.resource_spans) == 1
    assert data.resource_spans[0].resource == sent.resource_spans[0].resource
    assert (
        data.resource_spans[0].scope_spans[0].scope == sent.resource_spans[0].scope_spans[0].scope
    )

    # Other tenants (the default one included) do not see it.
    assert get(srv, f"/api/traces/{trace_id}").status_code == 404
    assert get(srv, f"/api/traces/{trace_id}", "someone-else").status_code == 404


@pytest.fixture(scope="module")
def shop(srv) -> List[ReadableSpan]:  # type: ignore[no-untyped-def]
    return shop_trace(Tracing(RESOURCE, [http_exporter(srv.url, "shop")]), BASE)


def test_trace_v2_json_and_protobuf(srv, shop) -> None:  # type: ignore[no-untyped-def]
    trace_id = tid(shop[0])
    r = get(srv, f"/api/v2/traces/{trace_id}", "shop")
    assert r.status_code == 200
    doc = r.json()
    assert list(doc) == ["trace"]
    assert list(doc["trace"]) == ["resourceSpans"]
    got = spans_by_name(doc["trace"], "resourceSpans")
    assert {n: (s["traceId"], s["spanId"]) for n, s in got.items()} == {
        s.name: (trace_id, sid(s)) for s in shop
    }
    assert got["decode"]["parentSpanId"] == got["SELECT carts"]["spanId"]
    assert doc["trace"]["resourceSpans"] == trace_json(srv, trace_id, "shop")["batches"]

    r = get(srv, f"/api/v2/traces/{trace_id}", "shop", headers={"Accept": "application/protobuf"})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/protobuf"
    assert proto_spans(trace_by_id_response(r.content)) == proto_spans(encode_spans(shop))


def test_unknown_trace_is_404_in_v1_and_v2(srv, shop) -> None:  # type: ignore[no-untyped-def]
    unknown = "0123456789abcdef0123456789abcdef"
    for version in ("", "/v2"):
        for accept in ("application/json", "application/protobuf"):
            r = get(srv, f"/api{version}/traces/{unknown}", "shop", headers={"Accept": accept})
            assert (r.status_code, r.text) == (404, "trace not found\n"), (version, accept)
    # A known trace of another tenant is unknown here.
    assert get(srv, f"/api/v2/traces/{tid(shop[0])}", "shop").status_code == 200
    assert get(srv, f"/api/v2/traces/{tid(shop[0])}", "not-shop").status_code == 404


@pytest.mark.parametrize(
    "bad_id", ["not-hex", "0123456789abcdef0123456789abcdef0", "12 34", "g" * 32]
)
@pytest.mark.parametrize("version", ["", "/v2"])
def test_bad_trace_id_in_path_is_400(srv, bad_id: str, version: str) -> None:  # type: ignore[no-untyped-def]
    r = get(srv, f"/api{version}/traces/{bad_id}", "shop")
    assert r.status_code == 400, r.text
    assert "hex" in r.text


def test_trace_ids_are_read_as_tempo_reads_them(srv) -> None:  # type: ignore[no-untyped-def]
    """Any case, leading zeros optional (left-padded to 32 digits)."""
    spans = shop_trace(
        Tracing(RESOURCE, [http_exporter(srv.url, "ids")], id_generator=FixedIds()), BASE
    )
    assert tid(spans[0]) == "00000000000000000000000000abc123"
    for text in ("abc123", "ABC123", "0000abc123", tid(spans[0]), tid(spans[0]).upper()):
        data = trace_proto(srv, text, "ids")
        assert len(proto_spans(data)) == 3, text
    [found_trace] = search(srv, "ids", q="{}", **WINDOW).json()["traces"]
    assert found_trace["traceID"] == tid(spans[0])
    assert [s["spanID"] for s in found_trace["spanSet"]["spans"]] == [
        "fedcba9876540001",
        "fedcba9876540002",
        "fedcba9876540003",
    ]
    doc = trace_json(srv, "abc123", "ids")
    assert [s["spanId"] for s in spans_by_name(doc).values()] == [
        "fedcba9876540001",
        "fedcba9876540002",
        "fedcba9876540003",
    ]
    # Grafana adds the time range when it has one: the trace is still found.
    r = get(srv, "/api/v2/traces/abc123", "ids", params=WINDOW)
    assert len(spans_by_name(r.json()["trace"], "resourceSpans")) == 3


def test_a_retried_export_does_not_double_spans_in_the_trace(srv) -> None:  # type: ignore[no-untyped-def]
    tracing = Tracing({"service.name": "retry"})
    spans = shop_trace(tracing, BASE)
    exporter = http_exporter(srv.url, "retried")
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert exporter.export(spans) is SpanExportResult.SUCCESS  # say, after a timeout
    assert proto_spans(trace_proto(srv, tid(spans[0]), "retried")) == proto_spans(
        encode_spans(spans)
    )


def test_a_retried_export_does_not_double_spans_in_search(srv) -> None:  # type: ignore[no-untyped-def]
    tracing = Tracing({"service.name": "retry"})
    spans = shop_trace(tracing, BASE)
    exporter = http_exporter(srv.url, "retried-search")
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    [trace] = search(srv, "retried-search", q="{}", **WINDOW).json()["traces"]
    assert trace["spanSet"]["matched"] == 3
    assert [s["name"] for s in trace["spanSet"]["spans"]] == ["GET /cart", "SELECT carts", "decode"]


def test_large_batched_exports_over_grpc_and_http_at_once(srv) -> None:  # type: ignore[no-untyped-def]
    """BatchSpanProcessor (batches of 512) on both transports at the same time."""
    assert srv.otlp_grpc_address
    exporters = {
        "http": http_exporter(srv.url, "batched"),
        "grpc": grpc_exporter(srv.otlp_grpc_address, "batched"),
    }
    sent: Dict[str, List[ReadableSpan]] = {}

    def run(name: str) -> None:
        tracing = Tracing({"service.name": f"batch-{name}"}, [exporters[name]], batch=True)
        root = tracing.span(f"root-{name}", BASE, SEC, end=False)
        for i in range(1200):
            tracing.span(f"{name}-{i}", BASE + i * 1000, 500, root, attributes={"i": i})
        root.end(end_time=BASE + SEC)
        sent[name] = tracing.finish()

    threads = [threading.Thread(target=run, args=(name,)) for name in exporters]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in exporters:
        got = proto_spans(trace_proto(srv, tid(sent[name][0]), "batched"))
        assert got == proto_spans(encode_spans(sent[name])), name
        assert len(got) == 1201
    r = search(srv, "batched", q="{span.i>=1000}", spss="2", **WINDOW)
    assert sorted((t["rootTraceName"], t["spanSet"]["matched"]) for t in r.json()["traces"]) == [
        ("root-grpc", 200),
        ("root-http", 200),
    ]


def test_other_endpoints_grafana_calls(srv) -> None:  # type: ignore[no-untyped-def]
    r = get(srv, "/api/echo")
    assert (r.status_code, r.text) == (200, "echo\n")
    assert r.headers["content-type"].startswith("text/plain")
    r = get(srv, "/api/status/buildinfo")
    assert r.status_code == 200
    info = r.json()
    assert set(info) == {"version", "revision", "branch", "buildUser", "buildDate", "goVersion"}
    major, minor = (int(x) for x in info["version"].split(".")[:2])
    assert (major, minor) < (2, 2), "older Grafana must not try Tempo's gRPC streaming"
    # The OTLP-only port answers OTLP only.
    assert srv.otlp_http_url
    with httpx.Client(timeout=10, verify=TLS) as c:
        assert c.get(srv.otlp_http_url + "/api/search").status_code == 404
        assert c.get(srv.otlp_http_url + "/api/echo").status_code == 404


# -- 2. search -------------------------------------------------------------------------------


@dataclass
class SearchData:
    ids: Dict[str, str]  # T1..T5 -> trace id
    spans: Dict[str, List[ReadableSpan]]


@pytest.fixture(scope="module")
def sd(srv) -> SearchData:  # type: ignore[no-untyped-def]
    """Five traces in tenant "search", started at BASE + 0, 60, 120, 600 and 900 s.

    T1 checkout/prod  POST /pay 120ms, status error, http.status_code=500
                      > charge card (client, 80ms, payment.provider=stripe)
    T2 checkout/prod  GET /cart 20ms, http.status_code=200 > SELECT cart (client 5ms, postgresql)
    T3 inventory/stg  GET /stock 300ms, 404 > cache miss (internal 60ms, cache.hit=false)
    T4 inventory/stg  GET /stock 2s, 200 > SELECT stock (client 1.5s, postgresql, error)
    T5 frontend       GET / 50ms > checkout/prod POST /pay (server 30ms, 200)
    """

    def exp() -> HttpSpanExporter:
        return http_exporter(srv.url, "search")

    checkout = Tracing(
        {"service.name": "checkout", "deployment.environment": "prod"}, [exp()], batch=True
    )
    inventory = Tracing(
        {"service.name": "inventory", "deployment.environment": "staging"}, [exp()], batch=True
    )
    frontend = Tracing({"service.name": "frontend"}, [exp()], batch=True)
    server, client = SpanKind.SERVER, SpanKind.CLIENT
    error = Status(StatusCode.ERROR, "failed")

    t = BASE
    r1 = checkout.span(
        "POST /pay", t, 120 * MS, None, server, {"http.status_code": 500}, error, end=False
    )
    checkout.span("charge card", t + 10 * MS, 80 * MS, r1, client, {"payment.provider": "stripe"})
    r1.end(end_time=t + 120 * MS)
    t = BASE + 60 * SEC
    r2 = checkout.span("GET /cart", t, 20 * MS, None, server, {"http.status_code": 200}, end=False)
    checkout.span("SELECT cart", t + 1 * MS, 5 * MS, r2, client, {"db.system": "postgresql"})
    r2.end(end_time=t + 20 * MS)
    t = BASE + 120 * SEC
    r3 = inventory.span(
        "GET /stock", t, 300 * MS, None, server, {"http.status_code": 404}, end=False
    )
    inventory.span("cache miss", t + 100 * MS, 60 * MS, r3, attributes={"cache.hit": False})
    r3.end(end_time=t + 300 * MS)
    t = BASE + 600 * SEC
    r4 = inventory.span(
        "GET /stock", t, 2 * SEC, None, server, {"http.status_code": 200}, end=False
    )
    inventory.span(
        "SELECT stock", t + 100 * MS, 1500 * MS, r4, client, {"db.system": "postgresql"}, error
    )
    r4.end(end_time=t + 2 * SEC)
    t = BASE + 900 * SEC
    r5 = frontend.span("GET /", t, 50 * MS, kind=server, end=False)
    checkout.span("POST /pay", t + 10 * MS, 30 * MS, r5, server, {"http.status_code": 200})
    r5.end(end_time=t + 50 * MS)

    spans = checkout.finish() + inventory.finish() + frontend.finish()
    roots = [r1, r2, r3, r4, r5]
    ids = {f"T{i + 1}": hex_id(r.get_span_context().trace_id, 32) for i, r in enumerate(roots)}
    by_trace = {name: [s for s in spans if tid(s) == ids[name]] for name in ids}
    assert [len(v) for v in by_trace.values()] == [2, 2, 2, 2, 2]
    return SearchData(ids, by_trace)


def _ids(sd: SearchData, *names: str) -> List[str]:
    return [sd.ids[n] for n in names]


def test_search_answer_has_exactly_tempos_fields(srv, sd: SearchData) -> None:
    r = search(srv, "search", q="{}", **WINDOW)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"traces", "metrics"}
    assert set(body["metrics"]) <= METRIC_KEYS
    traces = {t["traceID"]: t for t in body["traces"]}
    assert list(traces) == _ids(sd, "T5", "T4", "T3", "T2", "T1"), "newest first"
    for t in traces.values():
        assert set(t) == SEARCH_KEYS
        assert t["spanSet"] == t["spanSets"][0]
        assert len(t["spanSets"]) == 1
        for span in t["spanSet"]["spans"]:
            assert set(span) <= {
                "spanID",
                "name",
                "startTimeUnixNano",
                "durationNanos",
                "attributes",
            }
    t1 = traces[sd.ids["T1"]]
    assert {
        k: t1[k] for k in ("rootServiceName", "rootTraceName", "startTimeUnixNano", "durationMs")
    } == {
        "rootServiceName": "checkout",
        "rootTraceName": "POST /pay",
        "startTimeUnixNano": str(BASE),
        "durationMs": 120,
    }
    names = {s.name: s for s in sd.spans["T1"]}
    root, child = names["POST /pay"], names["charge card"]
    assert t1["spanSet"] == {
        "spans": [
            {
                "spanID": sid(root),
                "name": "POST /pay",
                "startTimeUnixNano": str(BASE),
                "durationNanos": str(120 * MS),
            },
            {
                "spanID": sid(child),
                "name": "charge card",
                "startTimeUnixNano": str(BASE + 10 * MS),
                "durationNanos": str(80 * MS),
            },
        ],
        "matched": 2,
    }
    # The root is the span without a parent, even when another service's span came later.
    t5 = traces[sd.ids["T5"]]
    assert (t5["rootServiceName"], t5["rootTraceName"], t5["durationMs"]) == (
        "frontend",
        "GET /",
        50,
    )
    assert traces[sd.ids["T4"]]["durationMs"] == 2000
    # Tempo's serviceStats: each service's spans in the trace, and those with status error
    # (zeros left out, as proto3 JSON does).
    assert t1["serviceStats"] == {"checkout": {"spanCount": 2, "errorCount": 1}}
    assert traces[sd.ids["T2"]]["serviceStats"] == {"checkout": {"spanCount": 2}}
    assert traces[sd.ids["T4"]]["serviceStats"] == {"inventory": {"spanCount": 2, "errorCount": 1}}
    assert set(t5["serviceStats"]) == {"frontend", "checkout"}


def test_service_stats_are_the_same_whichever_path_answers(srv, sd: SearchData) -> None:
    # A structural query is answered by the engine over whole traces, not by SQL.
    sql = {
        t["traceID"]: t["serviceStats"]
        for t in search(srv, "search", q="{}", **WINDOW).json()["traces"]
    }
    piped = search(srv, "search", q="{} >> {}", **WINDOW).json()["traces"]
    assert piped
    for t in piped:
        assert t["serviceStats"] == sql[t["traceID"]], t["traceID"]


def test_search_with_nothing_found_has_no_traces_key(srv, sd: SearchData) -> None:
    r = search(srv, "search", q='{name="no such span"}', **WINDOW)
    assert r.status_code == 200
    body = r.json()
    assert "traces" not in body
    assert set(body) == {"metrics"}


def test_search_limit_spss_and_window(srv, sd: SearchData) -> None:
    assert found(srv, "search", q="{}", limit="2", **WINDOW) == _ids(sd, "T5", "T4")
    assert found(srv, "search", q="{}", limit="1", **WINDOW) == _ids(sd, "T5")
    # Without start/end: the last 24 hours.
    assert found(srv, "search", q="{}") == _ids(sd, "T5", "T4", "T3", "T2", "T1")
    assert found(srv, "search", tags="") == _ids(sd, "T5", "T4", "T3", "T2", "T1")
    window = {"start": str(BASE_S + 100), "end": str(BASE_S + 700)}
    assert found(srv, "search", q="{}", **window) == _ids(sd, "T4", "T3")
    assert found(srv, "search", tags="service.name=inventory", **window) == _ids(sd, "T4", "T3")
    window = {"start": str(BASE_S - 3600), "end": str(BASE_S - 60)}
    assert found(srv, "search", q="{}", **window) == []
    # spss: spans shown per trace; matched still counts them all.
    r = search(srv, "search", q="{}", spss="1", **WINDOW)
    t1 = r.json()["traces"][-1]
    assert t1["traceID"] == sd.ids["T1"]
    assert [s["name"] for s in t1["spanSet"]["spans"]] == ["POST /pay"]
    assert t1["spanSet"]["matched"] == 2


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "ten"},
        {"spss": "-1"},
        {"start": "yesterday"},
        {"start": str(BASE_S + 10), "end": str(BASE_S)},
        {"start": str(BASE_S), "end": str(BASE_S)},
        {"q": "{}", "tags": "name=x"},
        {"q": "{}", "minDuration": "1s"},
        {"minDuration": "1s", "maxDuration": "10ms"},
        {"minDuration": "soon"},
        {"tags": "service.name"},
        {"tags": "name=a name=b"},
        {"tags": 'name="unterminated'},
    ],
)
def test_bad_search_parameters_are_400(srv, params: Dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    r = search(srv, "search", **params)
    assert r.status_code == 400, (params, r.text)
    assert len(r.text.strip()) > 10, "a reason is given"


def test_search_parameters_as_tempo_reads_them(srv, sd) -> None:  # type: ignore[no-untyped-def]
    """spss=0 is the default (3); start=0&end=0 is no range (the recent data); and with no
    q, tags or range, the other parameters are the tags, as Grafana's first Tempo data source
    sent them."""
    r = search(srv, "search", q="{}", spss="0", **WINDOW)
    assert r.status_code == 200, r.text
    assert r.json()["traces"] == search(srv, "search", q="{}", spss="3", **WINDOW).json()["traces"]
    assert r.json() != search(srv, "search", q="{}", spss="1", **WINDOW).json()
    assert found(srv, "search", q="{}", start="0", end="0") == found(srv, "search", q="{}")
    by_tags = found(srv, "search", tags="service.name=inventory")
    assert by_tags == _ids(sd, "T4", "T3")
    assert found(srv, "search", **{"service.name": "inventory"}) == by_tags
    # With a range, other parameters are not tags (Tempo's rule too).
    assert len(found(srv, "search", **{"service.name": "inventory"}, **WINDOW)) > 2


@pytest.mark.parametrize("key", ["span:id", "span:parentID"])
def test_a_bad_id_is_named_by_its_own_key(srv, key: str) -> None:  # type: ignore[no-untyped-def]
    r = search(srv, "search", q=f'{{{key}="zz"}}', **WINDOW)
    assert r.status_code == 400 and f"{key} 'zz' is not hex" in r.text, r.text


LEGACY = traceql_cases.LEGACY


@pytest.mark.parametrize("tags", sorted(LEGACY))
def test_legacy_tag_search(srv, sd: SearchData, tags: str) -> None:
    assert found(srv, "search", tags=tags, **WINDOW) == _ids(sd, *LEGACY[tags])


def test_legacy_durations_bound_the_trace_duration(srv, sd: SearchData) -> None:
    # Trace durations: T1 120ms, T2 20ms, T3 300ms, T4 2s, T5 50ms.
    assert found(srv, "search", minDuration="250ms", **WINDOW) == _ids(sd, "T4", "T3")
    assert found(srv, "search", maxDuration="100ms", **WINDOW) == _ids(sd, "T5", "T2")
    # Both bounds inclusive.
    assert found(srv, "search", minDuration="120ms", maxDuration="300ms", **WINDOW) == _ids(
        sd, "T3", "T1"
    )
    assert found(srv, "search", minDuration="1.5s", **WINDOW) == _ids(sd, "T4")
    # On the trace, not on one span: T1's longest span other than the root is 80ms.
    assert found(
        srv, "search", tags="payment.provider=stripe", minDuration="100ms", **WINDOW
    ) == _ids(sd, "T1")
    assert found(srv, "search", tags="service.name=checkout", minDuration="200ms", **WINDOW) == []
    r = search(srv, "search", tags="service.name=checkout", maxDuration="60ms", **WINDOW)
    assert [
        (t["rootServiceName"], t["rootTraceName"], t["durationMs"]) for t in r.json()["traces"]
    ] == [
        ("frontend", "GET /", 50),
        ("checkout", "GET /cart", 20),
    ]


TRACEQL = {**traceql_cases.TRACEQL, "{ }": ["T5", "T4", "T3", "T2", "T1"]}


@pytest.mark.parametrize("q", sorted(TRACEQL))
def test_traceql_search(srv, sd: SearchData, q: str) -> None:
    assert found(srv, "search", q=q, **WINDOW) == _ids(sd, *TRACEQL[q])


def test_traceql_spanset_shows_the_matching_spans(srv, sd: SearchData) -> None:
    r = search(srv, "search", q="{kind=client}", **WINDOW)
    got = {t["traceID"]: t["spanSet"] for t in r.json()["traces"]}
    assert {k: ([s["name"] for s in v["spans"]], v["matched"]) for k, v in got.items()} == {
        sd.ids["T4"]: (["SELECT stock"], 1),
        sd.ids["T2"]: (["SELECT cart"], 1),
        sd.ids["T1"]: (["charge card"], 1),
    }
    assert got[sd.ids["T4"]]["spans"][0]["durationNanos"] == str(1500 * MS)


@pytest.mark.parametrize(
    "q",
    [
        # Pipelines and structural operators run (tests/server/tempo/test_search_pipelines.py);
        # a metrics query sent to search, or what TraceQL does not read, is refused.
        "{} | rate()",
        '{parent.x="a"}',
        '{span:nothing="a"}',
        "{name=}",
        "{name=GET}",
        '{name="a"',
        'name="a"',
        "{status > fast}",
        "{duration > 10 parsecs}",
    ],
)
def test_unsupported_traceql_is_400_with_a_message(srv, q: str) -> None:  # type: ignore[no-untyped-def]
    r = search(srv, "search", q=q, **WINDOW)
    assert r.status_code == 400, (q, r.text)
    assert len(r.text.strip()) > 10
    if "|" in q:
        assert "/api/metrics/query_range" in r.text


# -- 3. tags, tenants, tokens ----------------------------------------------------------------


@pytest.fixture(scope="module")
def tagged(srv) -> List[ReadableSpan]:  # type: ignore[no-untyped-def]
    tracing = Tracing(
        {"service.name": "tagsvc", "k8s.namespace.name": "shop"}, [http_exporter(srv.url, "tags")]
    )
    root = tracing.span(
        "GET /items",
        BASE,
        30 * MS,
        kind=SpanKind.SERVER,
        attributes={"http.method": "GET", "http.status_code": 200, "retry": True},
        status=Status(StatusCode.ERROR, "boom"),
        end=False,
    )
    tracing.span("fetch", BASE + MS, 10 * MS, root, SpanKind.CLIENT, {"http.method": "POST"})
    root.end(end_time=BASE + 30 * MS)
    # A second tenant with other names, to check they never mix.
    other = Tracing({"service.name": "secret-svc"}, [http_exporter(srv.url, "tags-other")])
    other.span("hidden", BASE, MS, kind=SpanKind.PRODUCER, attributes={"secret.key": "s3cr3t"})
    other.finish()
    return tracing.finish()


def test_tag_names_v1(srv, tagged) -> None:  # type: ignore[no-untyped-def]
    def names(**params: str) -> List[str]:
        r = get(srv, "/api/search/tags", "tags", params=params)
        assert r.status_code == 200, r.text
        assert set(r.json()) <= {"tagNames", "metrics"}
        return r.json()["tagNames"]

    assert names() == [
        "http.method",
        "http.status_code",
        "k8s.namespace.name",
        "retry",
        "service.name",
    ]
    assert names(scope="span") == ["http.method", "http.status_code", "retry"]
    assert names(scope="resource") == ["k8s.namespace.name", "service.name"]
    assert names(scope="intrinsic") == INTRINSICS
    r = get(srv, "/api/search/tags", "tags", params={"scope": "galaxy"})
    assert r.status_code == 400 and "scope" in r.text


def test_tag_names_of_a_past_range_are_those_of_its_spans(srv, tagged) -> None:  # type: ignore[no-untyped-def]
    """As Tempo, and as tag values: a range that ended a while ago names the attributes of
    its own spans, not of every span since its start (Grafana sends its time range)."""

    def names(start: int, end: int) -> Dict[str, List[str]]:
        params = {"start": str(start), "end": str(end)}
        r = get(srv, "/api/v2/search/tags", "tags", params=params)
        assert r.status_code == 200, r.text
        return {s["name"]: s["tags"] for s in r.json()["scopes"]}

    empty = names(BASE_S - 7200, BASE_S - 3600)
    assert empty["resource"] == empty["span"] == [], empty
    assert empty["intrinsic"] == INTRINSICS
    found = names(BASE_S - 60, BASE_S + 600)
    assert found["span"] == ["http.method", "http.status_code", "retry"], found


def test_tag_names_v2(srv, tagged) -> None:  # type: ignore[no-untyped-def]
    r = get(srv, "/api/v2/search/tags", "tags")
    assert r.status_code == 200
    assert r.json() == {
        "scopes": [
            {"name": "intrinsic", "tags": INTRINSICS},
            {"name": "resource", "tags": ["k8s.namespace.name", "service.name"]},
            {"name": "span", "tags": ["http.method", "http.status_code", "retry"]},
        ]
    }
    r = get(srv, "/api/v2/search/tags", "tags", params={"scope": "resource"})
    assert r.json() == {
        "scopes": [{"name": "resource", "tags": ["k8s.namespace.name", "service.name"]}]
    }
    r = get(srv, "/api/v2/search/tags", "tags", params={"scope": "intrinsic"})
    assert r.json() == {"scopes": [{"name": "intrinsic", "tags": INTRINSICS}]}
    # A tenant with no spans: only the intrinsics.
    r = get(srv, "/api/v2/search/tags", "nobody-here")
    assert r.json()["scopes"] == [
        {"name": "intrinsic", "tags": INTRINSICS},
        {"name": "resource", "tags": []},
        {"name": "span", "tags": []},
    ]


TAG_VALUES_V1 = {
    "service.name": ["tagsvc"],
    "http.method": ["GET", "POST"],
    "k8s.namespace.name": ["shop"],
    "http.status_code": ["200"],
    "retry": ["true"],
    "secret.key": [],
    "no.such.tag": [],
    # Tempo's virtual tags: their values whatever the spans hold.
    "status.code": ["error", "ok", "unset"],
    "error": ["true"],
}


@pytest.mark.parametrize("tag", sorted(TAG_VALUES_V1))
def test_tag_values_v1(srv, tagged, tag: str) -> None:  # type: ignore[no-untyped-def]
    r = get(srv, f"/api/search/tag/{tag}/values", "tags")
    assert r.status_code == 200
    assert r.json()["tagValues"] == TAG_VALUES_V1[tag]


def _s(*values: str) -> List[dict]:
    return [{"type": "string", "value": v} for v in values]


def _k(*values: str) -> List[dict]:
    return [{"type": "keyword", "value": v} for v in values]


TAG_VALUES_V2 = {
    "resource.service.name": _s("tagsvc"),
    ".service.name": _s("tagsvc"),
    "span.service.name": [],
    "rootServiceName": _s("tagsvc"),
    "resource.k8s.namespace.name": _s("shop"),
    "span.http.method": _s("GET", "POST"),
    ".http.method": _s("GET", "POST"),
    "resource.http.method": [],
    "name": _s("GET /items", "fetch"),
    # Every value TraceQL has, in Tempo's order, whatever the spans hold (as Tempo answers).
    "status": [{"type": "keyword", "value": v} for v in ("ok", "error", "unset")],
    "span:kind": [
        {"type": "keyword", "value": v}
        for v in ("client", "server", "producer", "consumer", "internal", "unspecified")
    ],
    "span.secret.key": [],
}


@pytest.mark.parametrize("tag", sorted(TAG_VALUES_V2))
def test_tag_values_v2(srv, tagged, tag: str) -> None:  # type: ignore[no-untyped-def]
    r = get(srv, f"/api/v2/search/tag/{tag}/values", "tags")
    assert r.status_code == 200
    assert r.json() == {"tagValues": TAG_VALUES_V2[tag]}


def test_tag_values_v2_keep_the_attribute_type(srv, tagged) -> None:  # type: ignore[no-untyped-def]
    r = get(srv, "/api/v2/search/tag/span.http.status_code/values", "tags")
    assert r.json() == {"tagValues": [{"type": "int", "value": "200"}]}


def test_tag_apis_take_a_start_time(srv, tagged) -> None:  # type: ignore[no-untyped-def]
    """Tags seen (a span ending) since ``start`` only."""
    later = {"start": str(BASE_S + 3600)}
    r = get(srv, "/api/v2/search/tags", "tags", params=later)
    assert r.json()["scopes"][1:] == [
        {"name": "resource", "tags": []},
        {"name": "span", "tags": []},
    ]
    assert get(srv, "/api/search/tags", "tags", params=later).json()["tagNames"] == []
    r = get(srv, "/api/v2/search/tag/resource.service.name/values", "tags", params=later)
    assert r.json() == {"tagValues": []}
    earlier = {"start": str(BASE_S - 60)}
    r = get(srv, "/api/v2/search/tag/resource.service.name/values", "tags", params=earlier)
    assert r.json() == {"tagValues": _s("tagsvc")}
    r = get(srv, "/api/v2/search/tag/span.http.method/values", "tags", params={"limit": "1"})
    assert r.json() == {"tagValues": _s("GET")}


def test_tag_values_per_attribute_are_capped(srv) -> None:  # type: ignore[no-untyped-def]
    tracing = Tracing({"service.name": "ids"})
    for i in range(1100):  # one export: values unique per span, such as request ids
        tracing.span("req", BASE, MS, attributes={"request.id": f"r{i:05d}"})
    assert http_exporter(srv.url, "capped").export(tracing.finish()) is SpanExportResult.SUCCESS
    r = get(srv, "/api/search/tag/request.id/values", "capped")
    assert len(r.json()["tagValues"]) <= 1000


def test_tenants_never_see_each_other(srv, tagged) -> None:  # type: ignore[no-untyped-def]
    trace_id = tid(tagged[0])
    assert get(srv, f"/api/traces/{trace_id}", "tags").status_code == 200
    for tenant in ("tags-other", None, "tags2"):
        assert get(srv, f"/api/traces/{trace_id}", tenant).status_code == 404
        assert found(srv, tenant or "anonymous", tags="service.name=tagsvc", **WINDOW) == []
        assert found(srv, tenant or "anonymous", q='{resource.service.name="tagsvc"}') == []
        r = get(srv, "/api/search/tag/service.name/values", tenant)
        assert "tagsvc" not in r.json()["tagValues"]
        assert "k8s.namespace.name" not in get(srv, "/api/search/tags", tenant).json()["tagNames"]
    r = get(srv, "/api/search/tags", "tags-other")
    assert r.json()["tagNames"] == ["secret.key", "service.name"]
    assert get(srv, "/api/search/tag/service.name/values", "tags-other").json() == {
        "tagValues": ["secret-svc"]
    }
    assert found(srv, "tags-other", q="{}", **WINDOW) != []
    assert found(srv, "tags-other", q="{}", **WINDOW)[0] != trace_id
    # A malformed tenant id is refused, not mapped to some tenant.
    assert get(srv, f"/api/traces/{trace_id}", "bad/tenant").status_code == 400
    assert search(srv, "bad tenant", q="{}").status_code == 400


def test_tokens_are_enforced_over_http(auth_srv) -> None:  # type: ignore[no-untyped-def]
    tracing = Tracing({"service.name": "authsvc"})
    spans = shop_trace(tracing, BASE)
    trace_id = tid(spans[0])
    # Ingest: no token, a wrong one, the query token: refused by the real exporter.
    for token in (None, "wrong", "q-t"):
        assert http_exporter(auth_srv.url, token=token).export(spans) is SpanExportResult.FAILURE
    r = post_otlp(auth_srv.url, encode_spans(spans).SerializeToString())
    assert r.status_code == 401
    assert "token" in status_pb2.Status.FromString(r.content).message
    assert (
        get(
            auth_srv, f"/api/traces/{trace_id}", headers={"Authorization": "Bearer q-t"}
        ).status_code
        == 404
    )
    # The ingest token, on the main port and on the OTLP-only port.
    assert http_exporter(auth_srv.url, token="in-t").export(spans) is SpanExportResult.SUCCESS
    assert auth_srv.otlp_http_url
    assert http_exporter(auth_srv.otlp_http_url).export(spans) is SpanExportResult.FAILURE
    assert (
        http_exporter(auth_srv.otlp_http_url, "t2", token="in-t").export(spans)
        is SpanExportResult.SUCCESS
    )
    # Query: only with the query token.
    for path in (
        f"/api/traces/{trace_id}",
        f"/api/v2/traces/{trace_id}",
        "/api/search",
        "/api/search/tags",
        "/api/v2/search/tags",
        "/api/search/tag/service.name/values",
        "/api/v2/search/tag/resource.service.name/values",
    ):
        for headers in ({}, {"Authorization": "Bearer in-t"}, {"Authorization": "Bearer nope"}):
            r = get(auth_srv, path, headers=headers)
            assert r.status_code == 401, (path, headers, r.status_code)
            assert "token" in r.text
        assert get(auth_srv, path, headers={"Authorization": "Bearer q-t"}).status_code == 200
    r = get(auth_srv, f"/api/traces/{trace_id}", headers={"Authorization": "Bearer q-t"})
    assert set(spans_by_name(r.json())) == {"GET /cart", "SELECT carts", "decode"}
    # Basic auth with the token as password (what Grafana sends with basic auth on).
    basic = base64.b64encode(b"grafana:q-t").decode()
    r = get(
        auth_srv, "/api/search", params={"q": "{}"}, headers={"Authorization": f"Basic {basic}"}
    )
    assert [t["traceID"] for t in r.json()["traces"]] == [trace_id]


def test_tokens_and_tenants_are_enforced_over_grpc(auth_srv) -> None:  # type: ignore[no-untyped-def]
    assert auth_srv.otlp_grpc_address
    spans = shop_trace(Tracing({"service.name": "grpc-auth"}), BASE)
    trace_id = tid(spans[0])
    for token in (None, "wrong", "q-t"):
        exporter = grpc_exporter(auth_srv.otlp_grpc_address, "g", token)
        assert exporter.export(spans) is SpanExportResult.FAILURE
    with grpc.insecure_channel(auth_srv.otlp_grpc_address) as channel:
        call = channel.unary_unary(EXPORT)
        with pytest.raises(grpc.RpcError) as err:
            call(encode_spans(spans).SerializeToString(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "token" in (err.value.details() or "")
    q = {"Authorization": "Bearer q-t", "X-Scope-OrgID": "g"}
    assert get(auth_srv, f"/api/traces/{trace_id}", headers=q).status_code == 404
    exporter = grpc_exporter(auth_srv.otlp_grpc_address, "g", "in-t")
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    r = get(auth_srv, f"/api/traces/{trace_id}", headers=q)
    assert r.status_code == 200
    assert {s["spanId"] for s in spans_by_name(r.json()).values()} == {sid(s) for s in spans}
    # Tenant "g" only.
    r = get(auth_srv, f"/api/traces/{trace_id}", headers={"Authorization": "Bearer q-t"})
    assert r.status_code == 404


# -- 4. bad OTLP -----------------------------------------------------------------------------


@dataclass
class Victim:
    trace_id: str
    body: bytes  # /api/traces/{id} as protobuf
    tags: dict


@pytest.fixture(scope="module")
def victim(srv) -> Victim:  # type: ignore[no-untyped-def]
    spans = shop_trace(Tracing({"service.name": "victim"}, [http_exporter(srv.url, "bad")]), BASE)
    trace_id = tid(spans[0])
    r = get(srv, f"/api/traces/{trace_id}", "bad", headers={"Accept": "application/protobuf"})
    assert r.status_code == 200
    return Victim(trace_id, r.content, get(srv, "/api/v2/search/tags", "bad").json())


def _intact(srv: RunningServer, victim: Victim) -> None:
    assert srv.process.poll() is None, "server died"
    r = get(
        srv, f"/api/traces/{victim.trace_id}", "bad", headers={"Accept": "application/protobuf"}
    )
    assert (r.status_code, r.content) == (200, victim.body)
    assert get(srv, "/api/v2/search/tags", "bad").json() == victim.tags
    assert found(srv, "bad", q="{}", **WINDOW) == [victim.trace_id]


def sdk_request(*names: str, t0: int = BASE) -> ExportTraceServiceRequest:
    """An export request of real SDK spans (one trace), made without sending it."""
    tracing = Tracing({"service.name": "spoiled"})
    root = tracing.span(names[0], t0, 10 * MS, end=False)
    for name in names[1:]:
        tracing.span(name, t0 + MS, MS, root)
    root.end(end_time=t0 + 10 * MS)
    spans = tracing.finish()
    request = encode_spans(sorted(spans, key=lambda s: s.name != names[0]))
    assert [s.name for s in request.resource_spans[0].scope_spans[0].spans] == list(names)
    return request


YEAR_2500_NS = 16_725_225_600 * SEC
SPOILERS = {
    "missing trace id": (lambda s: setattr(s, "trace_id", b""), "trace id"),
    "all-zero trace id": (lambda s: setattr(s, "trace_id", bytes(16)), "trace id"),
    "trace id of 8 bytes": (lambda s: setattr(s, "trace_id", b"\x01" * 8), "trace id"),
    "missing span id": (lambda s: setattr(s, "span_id", b""), "span id"),
    "span id of 4 bytes": (lambda s: setattr(s, "span_id", b"\x01\x02\x03\x04"), "span id"),
    "span id of 16 bytes": (lambda s: setattr(s, "span_id", b"\x01" * 16), "span id"),
    "parent span id of 3 bytes": (lambda s: setattr(s, "parent_span_id", b"abc"), "parent"),
    "end before start": (
        lambda s: setattr(s, "end_time_unix_nano", s.start_time_unix_nano - 1),
        "ends before it starts",
    ),
    "start in 1970": (lambda s: setattr(s, "start_time_unix_nano", 86_400 * SEC), "start time"),
    "start at 0": (lambda s: setattr(s, "start_time_unix_nano", 0), "start time"),
    "end in 2500": (lambda s: setattr(s, "end_time_unix_nano", YEAR_2500_NS), "end time"),
    "start and end in 2500": (
        lambda s: (
            setattr(s, "start_time_unix_nano", YEAR_2500_NS),
            setattr(s, "end_time_unix_nano", YEAR_2500_NS + SEC),
        ),
        "time",
    ),
}


def spoiled(case: str, names=("only",)) -> ExportTraceServiceRequest:  # type: ignore[no-untyped-def]
    request = sdk_request(*names)
    spoil, _ = SPOILERS[case]
    spoil(request.resource_spans[0].scope_spans[0].spans[-1])
    return request


def _status(r: httpx.Response, is_json: bool, code: int = 3) -> str:
    """The google.rpc.Status message of an error answer, in the request's encoding; ``code``
    is the google.rpc.Code expected (3: INVALID_ARGUMENT, 8: RESOURCE_EXHAUSTED)."""
    if is_json:
        assert r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["code"] == code
        return body["message"]
    assert r.headers["content-type"] == PROTOBUF
    status = status_pb2.Status.FromString(r.content)
    assert status.code == code
    return status.message


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
@pytest.mark.parametrize("case", sorted(SPOILERS))
def test_a_request_with_no_usable_span_is_400_with_the_reason(  # type: ignore[no-untyped-def]
    srv, victim, case: str, encoding: str
) -> None:
    request = spoiled(case)
    if encoding == "json":
        body, ctype = json.dumps(otlp_json(request)).encode(), "application/json"
    else:
        body, ctype = request.SerializeToString(), PROTOBUF
    r = post_otlp(srv.url, body, ctype, "bad")
    assert r.status_code == 400, (case, r.text)
    message = _status(r, encoding == "json")
    assert "no span could be stored" in message
    assert SPOILERS[case][1] in message, message
    _intact(srv, victim)


NOT_OTLP = {
    "truncated protobuf": (PROTOBUF, "truncated", "cannot decode"),
    "garbage protobuf": (PROTOBUF, b"\x0a\xff\xff\xff\xff\x0fnot a message", "cannot decode"),
    "not json": ("application/json", b"{resourceSpans: oops", "not JSON"),
    "json array": ("application/json", b"[1, 2]", "object"),
    "json wrong type": ("application/json", b'{"resourceSpans": 5}', "ExportTraceServiceRequest"),
    "json bad time": (
        "application/json",
        b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}',
        "ExportTraceServiceRequest",
    ),
    "json start in year 3000": ("application/json", "year3000", "ExportTraceServiceRequest"),
    "json odd hex id": ("application/json", "oddhex", "odd number"),
    "json not utf-8": ("application/json", b'{"resourceSpans": "\xff\xfe"}', "JSON"),
}


@pytest.mark.parametrize("case", sorted(NOT_OTLP))
def test_a_body_that_is_not_otlp_is_400_with_the_reason(srv, victim, case: str) -> None:  # type: ignore[no-untyped-def]
    ctype, body, reason = NOT_OTLP[case]
    if body == "truncated":
        whole = sdk_request("a", "b", "c").SerializeToString()
        body = whole[: len(whole) - 7]
    elif body == "year3000":
        doc = otlp_json(sdk_request("far"))
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["startTimeUnixNano"] = str(
            32_503_680_000 * SEC
        )
        body = json.dumps(doc).encode()
    elif body == "oddhex":
        doc = otlp_json(sdk_request("odd"))
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "abc"
        body = json.dumps(doc).encode()
    r = post_otlp(srv.url, body, ctype, "bad")
    assert r.status_code == 400, (case, r.text)
    message = _status(r, ctype == "application/json")
    assert reason in message, message
    _intact(srv, victim)


def test_json_with_only_unknown_fields_is_an_empty_request(srv, victim) -> None:  # type: ignore[no-untyped-def]
    """OTLP/JSON receivers must ignore unknown fields: nothing to store, nothing wrong."""
    r = post_otlp(srv.url, b'{"hello": "world"}', "application/json", "bad")
    assert (r.status_code, r.json()) == (200, {})
    _intact(srv, victim)


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_one_good_one_bad_span_is_a_partial_success(srv, victim, encoding: str) -> None:  # type: ignore[no-untyped-def]
    tenant = f"partial-{encoding}"
    request = spoiled("span id of 4 bytes", names=(f"good-{encoding}", "bad"))
    good = request.resource_spans[0].scope_spans[0].spans[0]
    if encoding == "json":
        r = post_otlp(srv.url, json.dumps(otlp_json(request)).encode(), "application/json", tenant)
        assert r.status_code == 200, r.text
        partial = r.json()["partialSuccess"]
        assert int(partial["rejectedSpans"]) == 1
        message = partial["errorMessage"]
    else:
        r = post_otlp(srv.url, request.SerializeToString(), PROTOBUF, tenant)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == PROTOBUF
        response = ExportTraceServiceResponse.FromString(r.content)
        assert response.partial_success.rejected_spans == 1
        message = response.partial_success.error_message
    assert "span 'bad'" in message and "span id" in message, message
    data = trace_proto(srv, good.trace_id.hex(), tenant)
    assert list(proto_spans(data).values()) == [good.SerializeToString()]
    assert found(srv, tenant, q="{}", **WINDOW) == [good.trace_id.hex()]
    assert get(srv, "/api/search/tag/name/values", tenant).json()["tagValues"] == [
        f"good-{encoding}"
    ]
    _intact(srv, victim)


def test_many_bad_spans_are_counted_with_a_few_reasons(srv, victim) -> None:  # type: ignore[no-untyped-def]
    request = sdk_request("kept", *(f"b{i}" for i in range(6)))
    for span in request.resource_spans[0].scope_spans[0].spans[1:]:
        span.span_id = b"\x07"
    r = post_otlp(srv.url, request.SerializeToString(), PROTOBUF, "partial-many")
    response = ExportTraceServiceResponse.FromString(r.content)
    assert response.partial_success.rejected_spans == 6
    assert response.partial_success.error_message.endswith("(and 3 more)")
    _intact(srv, victim)


def test_grpc_refuses_bad_requests_with_invalid_argument(srv, victim) -> None:  # type: ignore[no-untyped-def]
    assert srv.otlp_grpc_address
    whole = sdk_request("a", "b").SerializeToString()
    bad = {
        "truncated": (whole[:-5], "cannot decode"),
        "end before start": (spoiled("end before start").SerializeToString(), "ends before"),
        "missing trace id": (spoiled("missing trace id").SerializeToString(), "trace id"),
    }
    with grpc.insecure_channel(srv.otlp_grpc_address) as channel:
        call = channel.unary_unary(EXPORT)
        for case, (body, reason) in bad.items():
            with pytest.raises(grpc.RpcError) as err:
                call(body, metadata=(("x-scope-orgid", "bad"),), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, case
            assert reason in (err.value.details() or ""), (case, err.value.details())
        # Partial success over gRPC.
        request = spoiled("span id of 4 bytes", names=("grpc-good", "grpc-bad"))
        out = call(request.SerializeToString(), metadata=(("x-scope-orgid", "partial-grpc"),))
        response = ExportTraceServiceResponse.FromString(out)
        assert response.partial_success.rejected_spans == 1
        assert "grpc-bad" in response.partial_success.error_message
        # Over the size limit.
        with pytest.raises(grpc.RpcError) as err:
            call(b"\x0a" + bytes(MAX_BODY + 10), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    good = request.resource_spans[0].scope_spans[0].spans[0]
    assert list(proto_spans(trace_proto(srv, good.trace_id.hex(), "partial-grpc")).values()) == [
        good.SerializeToString()
    ]
    _intact(srv, victim)


@pytest.mark.parametrize(
    "ctype", ["text/plain", "application/grpc", "application/x-www-form-urlencoded", ""]
)
def test_unsupported_content_type_is_415(srv, victim, ctype: str) -> None:  # type: ignore[no-untyped-def]
    r = post_otlp(srv.url, sdk_request("x").SerializeToString(), ctype, "bad")
    assert r.status_code == 415, r.text
    assert "content type" in status_pb2.Status.FromString(r.content).message
    _intact(srv, victim)


def test_encoding_problems(srv, victim) -> None:  # type: ignore[no-untyped-def]
    body = sdk_request("x").SerializeToString()
    r = post_otlp(srv.url, body, PROTOBUF, "bad", {"content-encoding": "gzip"})
    assert r.status_code == 400
    assert "gzip" in _status(r, False)
    r = post_otlp(srv.url, gzip.compress(body)[:-6], PROTOBUF, "bad", {"content-encoding": "gzip"})
    assert r.status_code == 400
    r = post_otlp(srv.url, body, PROTOBUF, "bad", {"content-encoding": "br"})
    assert r.status_code == 415
    _intact(srv, victim)


def test_body_over_the_limit_is_413(srv, victim) -> None:  # type: ignore[no-untyped-def]
    big = sdk_request("big")
    big.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="blob").value.string_value = (
        "x" * MAX_BODY
    )
    body = big.SerializeToString()
    assert len(body) > MAX_BODY
    for url in (srv.url, srv.otlp_http_url):
        assert url
        r = post_otlp(url, body, PROTOBUF, "bad")
        assert r.status_code == 413
        assert str(MAX_BODY) in _status(r, False, code=8)
        r = post_otlp(url, json.dumps(otlp_json(big)).encode(), "application/json", "bad")
        assert r.status_code == 413
        assert str(MAX_BODY) in _status(r, True, code=8)

    # Without Content-Length (chunked): counted as it arrives.
    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 16_384):
            yield body[i : i + 16_384]

    with httpx.Client(timeout=30, verify=TLS) as c:
        r = c.post(
            srv.url + "/v1/traces",
            content=chunks(),
            headers={"content-type": PROTOBUF, "X-Scope-OrgID": "bad"},
        )
    assert r.status_code == 413
    # The real exporter gets the same answer and gives up (413 is not retried).
    assert http_exporter(srv.url, "bad").export([_big_sdk_span()]) is SpanExportResult.FAILURE
    _intact(srv, victim)


def _big_sdk_span() -> ReadableSpan:
    tracing = Tracing({"service.name": "big"})
    tracing.span("big", BASE, MS, attributes={"blob": "y" * MAX_BODY})
    return tracing.finish()[0]


def test_auth_error_answers_in_the_requests_encoding(auth_srv) -> None:  # type: ignore[no-untyped-def]
    r = post_otlp(auth_srv.url, b"{}", "application/json")
    assert r.status_code == 401
    assert r.headers["content-type"] == "application/json"
    assert "token" in r.json()["message"]


# -- requests built to cost the server much for little ---------------------------------------


def test_costly_requests_are_refused_quickly(srv, victim) -> None:  # type: ignore[no-untyped-def]
    cases = {
        # 10,001 empty resource spans: 20 kB of protobuf, refused by count.
        "too many resources": (b"\x0a\x00" * 10_001, PROTOBUF, 413, "resource spans"),
        # 400 kB of them behind gzip: expands past the body limit.
        "gzip bomb": (gzip.compress(b"\x0a\x00" * 200_000), PROTOBUF, 400, "limit"),
        "deep JSON": (b'{"a":' * 30_000 + b"1" + b"}" * 30_000, "application/json", 400, "deep"),
        "deep JSON under the parser's limit": (
            b'{"resourceSpans":[' + b'{"a":' * 900 + b"1" + b"}" * 900 + b"]}",
            "application/json",
            200,  # unknown fields, however deep, are ignored
            "",
        ),
    }
    for name, (body, ctype, status, reason) in cases.items():
        started = time.monotonic()
        headers = {"content-encoding": "gzip"} if name == "gzip bomb" else {}
        r = post_otlp(srv.url, body, ctype, "bad", headers)
        assert r.status_code == status, (name, r.status_code, r.content[:200])
        if status != 200:
            assert reason in _status(r, ctype == "application/json", 8 if status == 413 else 3)
        assert time.monotonic() - started < 5, name
    _intact(srv, victim)


@pytest.mark.parametrize(
    "q",
    [
        "{name = 5}",
        "{name != 5}",
        "{resource.service.name = 5}",
        "{rootServiceName = 5}",
        '{traceDuration > "long"}',
        '{name =~ "("}',
        "{duration > 1e400}",
        "{span.n > 1e400}",
    ],
)
def test_search_values_of_the_wrong_kind_are_400(srv, q: str) -> None:  # type: ignore[no-untyped-def]
    r = get(srv, "/api/search", "search", params={"q": q})
    assert r.status_code == 400, (q, r.text)
    assert srv.process.poll() is None


def test_absurd_durations_are_400(srv) -> None:  # type: ignore[no-untyped-def]
    r = get(srv, "/api/search", "search", params={"minDuration": "9" * 400 + "h"})
    assert r.status_code == 400 and "too long" in r.text


def test_tags_in_use_stay_listed_though_their_row_is_an_hour_old(srv) -> None:  # type: ignore[no-untyped-def]
    """A tag's stored time is rewritten at most hourly; queries and retention go by the
    latest time it was seen."""
    now = int(time.time())
    tracing = Tracing({"service.name": "lagging"}, [http_exporter(srv.url, "lag")])
    tracing.span("early", (now - 40 * 60) * SEC, MS, attributes={"lag.k": "va"})
    tracing.span("late", (now - 60) * SEC, MS, attributes={"lag.k": "va"})
    tracing.finish()
    recent = {"start": str(now - 600), "end": str(now + 60)}
    values = get(srv, "/api/v2/search/tag/span.lag.k/values", "lag", params=recent).json()
    assert values["tagValues"] == [{"type": "string", "value": "va"}]
    names = get(srv, "/api/v2/search/tags", "lag", params={**recent, "scope": "span"}).json()
    assert names["scopes"] == [{"name": "span", "tags": ["lag.k"]}]


# -- hotspan's extension: sort=duration ----------------------------------------------------


def test_search_sort_by_duration_keeps_the_longest_traces(srv, sd: SearchData) -> None:
    # Trace durations: T1 120ms, T2 20ms, T3 300ms, T4 2s, T5 50ms.
    assert found(srv, "search", q="{}", sort="duration", **WINDOW) == _ids(
        sd, "T4", "T3", "T1", "T5", "T2"
    )
    # The limit keeps the longest, not the newest (T5 and T4).
    assert found(srv, "search", q="{}", sort="duration", limit="2", **WINDOW) == _ids(
        sd, "T4", "T3"
    )
    assert found(
        srv, "search", q='{resource.service.name="checkout"}', sort="duration", **WINDOW
    ) == _ids(sd, "T1", "T5", "T2")
    assert found(srv, "search", tags="service.name=checkout", sort="duration", **WINDOW) == _ids(
        sd, "T1", "T5", "T2"
    )
    assert found(srv, "search", q="{traceDuration>100ms}", sort="duration", **WINDOW) == _ids(
        sd, "T4", "T3", "T1"
    )
    # Without the parameter (or with sort=recent), Tempo's order: the newest first.
    assert found(srv, "search", q="{}", sort="recent", **WINDOW) == _ids(
        sd, "T5", "T4", "T3", "T2", "T1"
    )
    r = search(srv, "search", q="{}", sort="slowest", **WINDOW)
    assert r.status_code == 400 and "sort must be one of recent, duration" in r.text
