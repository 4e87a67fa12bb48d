"""Tempo's tag autocomplete narrowed by ``q=``, and Tempo's streaming gRPC queries on the
main port, against one real server process.

Requests are replayed as Grafana's Tempo data source sends them: the editor's tag values call
(``language_provider.ts`` getOptionsV2: ``limit``, ``q`` = the whole text being typed, and
``start``/``end`` when a tags time range is set), and the backend's streaming calls
(``pkg/tsdb/tempo`` search_stream.go and metrics_stream.go: a grpc-go client dialing the data
source's host:port in cleartext, the data source's custom headers as metadata).  Expected
answers are computed from the spans sent, and gRPC answers are compared with the HTTP
endpoints' answers to the same query.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import grpc
import httpx
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span, Status

from hotspan.formats.proto import tempo_pb2
from tests.conftest import RunningServer, start_server

SEC = 10**9
MS = 10**6
TOKEN = "r3ad"
TENANT = "shop"
# Grafana's data source: its custom headers (tenant, token), sent as gRPC metadata too.
HEADERS = {"X-Scope-OrgID": TENANT, "Authorization": f"Bearer {TOKEN}"}
METADATA = (("x-scope-orgid", TENANT), ("authorization", f"Bearer {TOKEN}"))
NOW_S = int(time.time())
T0 = (NOW_S - 1800) * SEC  # half an hour ago: inside the default range of every endpoint
TAGS_LIMIT = "5000"  # Grafana's TAGS_LIMIT, sent as ``limit``

# Two services; what each sends: resource attributes, then spans (name, kind, status,
# attributes).  Values are str, int or bool, and keep their type in the tag values API.
SERVICES: Dict[str, Tuple[Dict[str, object], List[Tuple[str, int, int, Dict[str, object]]]]] = {
    "api": (
        {"service.name": "api", "deployment.environment": "prod"},
        [
            ("GET /pay", Span.SPAN_KIND_SERVER, 1, {"http.route": "/pay", "http.status_code": 200}),
            ("GET /cart", Span.SPAN_KIND_SERVER, 0, {"http.route": "/cart", "cache.hit": True}),
        ],
    ),
    "worker": (
        {"service.name": "worker", "queue.name": "jobs"},
        [
            ("send", Span.SPAN_KIND_CONSUMER, 2, {"http.route": "/internal", "retries": 3}),
        ],
    ),
}
KINDS = {Span.SPAN_KIND_SERVER: "server", Span.SPAN_KIND_CONSUMER: "consumer"}
STATUSES = ("unset", "ok", "error")


def _any(value: object) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    return AnyValue(string_value=str(value))


def _type(value: object) -> str:
    return "bool" if isinstance(value, bool) else "int" if isinstance(value, int) else "string"


def _attrs(values: Dict[str, object]) -> List[KeyValue]:
    return [KeyValue(key=k, value=_any(v)) for k, v in values.items()]


def _export() -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    n = 0
    for resource, spans in SERVICES.values():
        rs = ResourceSpans()
        rs.resource.attributes.extend(_attrs(resource))
        ss = rs.scope_spans.add()
        for name, kind, status, attrs in spans:
            n += 1
            start = T0 + n * 10 * SEC
            ss.spans.append(
                Span(
                    trace_id=n.to_bytes(16, "big"),
                    span_id=n.to_bytes(8, "big"),
                    name=name,
                    kind=kind,
                    start_time_unix_nano=start,
                    end_time_unix_nano=start + n * 100 * MS,
                    attributes=_attrs(attrs),
                    status=Status(code=status),
                )
            )
        request.resource_spans.append(rs)
    return request


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data: Path = tmp_path_factory.mktemp("tempo-grpc") / "data"
    # OTLP/HTTP and OTLP/gRPC on (any free ports): both must take OTLP only, the streaming
    # queries answering through the main port.
    server = start_server(data, ["--query-token", TOKEN])
    try:
        with server.client() as c:
            r = c.post(
                "/v1/traces",
                content=_export().SerializeToString(),
                headers={"content-type": "application/x-protobuf", "X-Scope-OrgID": TENANT},
            )
            assert r.status_code == 200, r.text
        yield server
    finally:
        if server.process.poll() is None:
            server.stop()
        if server.process.stdout:
            server.process.stdout.close()


def get(srv: RunningServer, path: str, **params: str) -> httpx.Response:
    with srv.client() as c:
        return c.get(path, params=params, headers=HEADERS)


def values_v2(srv: RunningServer, tag: str, q: Optional[str] = None, **extra: str) -> list:
    """Grafana's editor asking for a tag's values as the user types ``q``."""
    params = {"limit": TAGS_LIMIT, **extra}
    if q is not None:
        params["q"] = q
    r = get(srv, f"/api/v2/search/tag/{tag}/values", **params)
    assert r.status_code == 200, r.text
    return r.json()["tagValues"]


def tags_v2(
    srv: RunningServer, q: Optional[str] = None, limit: str = TAGS_LIMIT
) -> Dict[str, List[str]]:
    params = {"limit": limit}
    if q is not None:
        params["q"] = q
    r = get(srv, "/api/v2/search/tags", **params)
    assert r.status_code == 200, r.text
    return {s["name"]: s["tags"] for s in r.json()["scopes"]}


def expected_values(key: str, services: Sequence[str], scope: str = "span") -> list:
    """What the spans of ``services`` have for an attribute, as Tempo lists it."""
    found = set()
    for service in services:
        resource, spans = SERVICES[service]
        if scope == "resource" and key in resource:
            found.add((resource[key], _type(resource[key])))
        for _, _, _, attrs in spans if scope == "span" else ():
            if key in attrs:
                found.add((attrs[key], _type(attrs[key])))
    text = {(str(v).lower() if isinstance(v, bool) else str(v), t) for v, t in found}
    return [{"type": t, "value": v} for v, t in sorted(text)]


# -- q= narrows the autocomplete ------------------------------------------------------------


def test_tag_values_of_a_quoted_attribute_name(srv: RunningServer) -> None:
    """``span."http.route"`` names the attribute as TraceQL reads it (Tempo parses the tag
    as an identifier), the values of ``span.http.route``; a broken quote is a 400."""
    assert values_v2(srv, 'span."http.route"') == values_v2(srv, "span.http.route") != []
    assert values_v2(srv, 'resource."service.name"') == values_v2(srv, "resource.service.name")
    assert get(srv, '/api/v2/search/tag/span."http.route/values').status_code == 400


def test_tag_values_narrowed_by_the_query_being_typed(srv: RunningServer) -> None:
    everyone = values_v2(srv, "span.http.route")
    assert everyone == expected_values("http.route", ["api", "worker"])
    # The cursor after `span.http.route=`: Tempo drops that unfinished matcher.
    typing = '{resource.service.name="api" && span.http.route=}'
    assert values_v2(srv, "span.http.route", typing) == expected_values("http.route", ["api"])
    # The same with the tags time range set (Grafana then sends start and end).
    window = {"start": str(NOW_S - 3600), "end": str(NOW_S + 60)}
    assert values_v2(srv, "span.http.route", typing, **window) == expected_values(
        "http.route", ["api"]
    )
    # A window without those spans: nothing.
    old = {"start": str(NOW_S - 7 * 86400), "end": str(NOW_S - 6 * 86400)}
    assert values_v2(srv, "span.http.route", typing, **old) == []
    # Narrowed by a span attribute, a resource attribute's values.
    by_route = '{span.http.route="/internal" && resource.service.name='
    assert values_v2(srv, "resource.service.name", by_route) == expected_values(
        "service.name", ["worker"], "resource"
    )
    # An || inside the filter: narrowed by what every branch requires.
    either = (
        '{ (name="GET /pay" || name="send") && span.http.route="/pay" && resource.service.name=}'
    )
    assert values_v2(srv, "resource.service.name", either) == expected_values(
        "service.name", ["api"], "resource"
    )


def test_narrowed_values_keep_their_traceql_types(srv: RunningServer) -> None:
    api = '{resource.service.name="api"}'
    assert values_v2(srv, "span.http.status_code", api) == [{"type": "int", "value": "200"}]
    assert values_v2(srv, "span.cache.hit", api) == [{"type": "bool", "value": "true"}]
    worker = '{resource.service.name="worker"}'
    assert values_v2(srv, "span.retries", worker) == expected_values("retries", ["worker"])
    assert values_v2(srv, "span.retries", api) == []
    # Intrinsics: names are strings; status and kind keywords, all of them whatever q says
    # (Tempo lists them without reading spans).
    names = [{"type": "string", "value": n} for n, *_ in SERVICES["worker"][1]]
    assert values_v2(srv, "name", worker) == names
    assert values_v2(srv, "status", api) == [
        {"type": "keyword", "value": s} for s in ("ok", "error", "unset")
    ]
    assert len(values_v2(srv, "kind", worker)) == 6


@pytest.mark.parametrize(
    "q",
    [
        "{}",  # match-all
        "{ span.http.route = }",  # only an unfinished matcher
        '{ .a = "x" || span.http.route = }',  # an unfinished matcher in an ||: match-all
        "{ .a = 1 && }",  # does not parse even leniently
        '{resource.service.name="api"} && {resource.service.name="worker"}',  # two spansets
        # Structural operators, sibling and negated ones included: Tempo does not narrow.
        '{resource.service.name="api"} ~ {span.http.route="/internal"}',
        '{resource.service.name="api"} &>> {span.http.route="/internal"}',
        '{resource.service.name="api"} !> {span.http.route="/internal"}',
    ],
)
def test_queries_that_narrow_nothing_give_every_value(srv: RunningServer, q: str) -> None:
    assert values_v2(srv, "span.http.route", q) == values_v2(srv, "span.http.route")


def test_tag_names_narrowed_by_q(srv: RunningServer) -> None:
    everyone = tags_v2(srv)
    api = tags_v2(srv, '{resource.service.name="api" && }')  # dangling &&: unfiltered
    assert api == everyone
    resource, spans = SERVICES["api"]
    api = tags_v2(srv, '{resource.service.name="api"}')
    assert api["resource"] == sorted(resource)
    assert api["span"] == sorted({k for *_, attrs in spans for k in attrs})
    assert api["intrinsic"] == everyone["intrinsic"]
    assert set(api["span"]) < set(everyone["span"])
    assert set(api["resource"]) < set(everyone["resource"])


def test_tag_names_limit_is_per_scope(srv: RunningServer) -> None:
    """Tempo's ``limit`` on tag names: at most that many per scope (Grafana sends its tag
    limit); the intrinsic scope is Tempo's fixed list."""
    everyone = tags_v2(srv)
    assert len(everyone["span"]) > 1 and len(everyone["resource"]) > 1
    one = tags_v2(srv, limit="1")
    assert one == {**everyone, "span": everyone["span"][:1], "resource": everyone["resource"][:1]}
    r = get(srv, "/api/search/tags", limit="2")
    assert r.status_code == 200, r.text
    names = get(srv, "/api/search/tags").json()["tagNames"]
    assert r.json()["tagNames"] == names[:2] and len(names) > 2
    assert get(srv, "/api/v2/search/tags", limit="0").status_code == 400


@pytest.mark.parametrize("scope", ["event", "link", "instrumentation"])
def test_tag_scopes_hotspan_keeps_nothing_of_answer_empty(srv: RunningServer, scope: str) -> None:
    """TraceQL's other scopes, which these spans have no attributes of (Tempo's API takes
    them): no names, rather than a 400 (tests/server/tempo/test_typed_search.py has some)."""
    r = get(srv, "/api/v2/search/tags", scope=scope)
    assert r.status_code == 200, r.text
    assert r.json()["scopes"] == [{"name": scope, "tags": []}]
    r = get(srv, "/api/search/tags", scope=scope)
    assert r.status_code == 200, r.text
    assert r.json()["tagNames"] == []
    assert get(srv, "/api/v2/search/tags", scope="events").status_code == 400


# -- gRPC on the main port ---------------------------------------------------------------------


def channel(srv: RunningServer) -> grpc.Channel:
    """grpc-go's Dial(host:port, insecure) of Grafana: the data source's address."""
    return grpc.insecure_channel(srv.url.removeprefix("http://"))


def stream(srv: RunningServer, method: str, request, response_type, metadata=METADATA) -> list:  # type: ignore[no-untyped-def]
    with channel(srv) as ch:
        call = ch.unary_stream(
            f"/tempopb.StreamingQuerier/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_type.FromString,
        )
        md = (*metadata, ("user-agent", "Grafana/12.0.0"))
        return list(call(request, metadata=md, timeout=30))


def merged(messages: list, response_type):  # type: ignore[no-untyped-def]
    """What Grafana makes of a stream: the traces (series) of every message."""
    out = response_type()
    for m in messages:
        out.MergeFrom(m)
    return out


def test_grpc_search_over_the_main_port_equals_http(srv: RunningServer) -> None:
    q = '{resource.service.name="api"}'
    start, end = NOW_S - 3600, NOW_S + 60
    # Grafana unmarshals its query model into SearchRequest: query, limit; times in seconds.
    request = tempo_pb2.SearchRequest(Query=q, Limit=20, start=start, end=end)
    messages = stream(srv, "Search", request, tempo_pb2.SearchResponse)
    assert messages, "the stream ended without a message"
    got = merged(messages, tempo_pb2.SearchResponse)
    r = get(srv, "/api/search", q=q, limit="20", start=str(start), end=str(end))
    assert r.status_code == 200, r.text
    want = json_format.ParseDict(r.json(), tempo_pb2.SearchResponse())
    assert got == want
    assert len(got.traces) == len(SERVICES["api"][1])


def test_grpc_metrics_query_range_over_the_main_port_equals_http(srv: RunningServer) -> None:
    q = "{} | rate() by (resource.service.name)"
    start, end = (NOW_S - 3600) * SEC, (NOW_S + 60) * SEC
    request = tempo_pb2.QueryRangeRequest(query=q, start=start, end=end, step=60 * SEC)
    messages = stream(srv, "MetricsQueryRange", request, tempo_pb2.QueryRangeResponse)
    assert messages
    got = merged(messages, tempo_pb2.QueryRangeResponse)
    r = get(srv, "/api/metrics/query_range", q=q, start=str(start), end=str(end), step="60s")
    assert r.status_code == 200, r.text
    want = json_format.ParseDict(
        r.json(), tempo_pb2.QueryRangeResponse(), ignore_unknown_fields=True
    )
    assert got == want
    services = {
        kv.value.string_value for s in got.series for kv in s.labels if kv.key.endswith("name")
    }
    assert services == set(SERVICES)


def test_grpc_tag_values_v2_equals_http(srv: RunningServer) -> None:
    q = '{resource.service.name="api" && span.http.route='
    request = tempo_pb2.SearchTagValuesRequest(tagName="span.http.route", query=q)
    got = merged(
        stream(srv, "SearchTagValuesV2", request, tempo_pb2.SearchTagValuesV2Response),
        tempo_pb2.SearchTagValuesV2Response,
    )
    want = json_format.ParseDict(
        {"tagValues": values_v2(srv, "span.http.route", q)}, tempo_pb2.SearchTagValuesV2Response()
    )
    assert got == want
    assert json_format.MessageToDict(got)["tagValues"] == expected_values("http.route", ["api"])


def test_grpc_checks_the_token_and_reads_the_tenant_from_metadata(srv: RunningServer) -> None:
    request = tempo_pb2.SearchRequest(Query="{}", start=NOW_S - 3600, end=NOW_S + 60)
    with pytest.raises(grpc.RpcError) as err:
        stream(
            srv, "Search", request, tempo_pb2.SearchResponse, metadata=(("x-scope-orgid", TENANT),)
        )
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    other = (("x-scope-orgid", "someone-else"), ("authorization", f"Bearer {TOKEN}"))
    got = merged(
        stream(srv, "Search", request, tempo_pb2.SearchResponse, other), tempo_pb2.SearchResponse
    )
    assert list(got.traces) == []
    mine = merged(
        stream(srv, "Search", request, tempo_pb2.SearchResponse), tempo_pb2.SearchResponse
    )
    assert len(mine.traces) == sum(len(spans) for _, spans in SERVICES.values())


def test_bad_query_is_invalid_argument(srv: RunningServer) -> None:
    request = tempo_pb2.SearchRequest(Query="{ this is not traceql", start=NOW_S - 60, end=NOW_S)
    with pytest.raises(grpc.RpcError) as err:
        stream(srv, "Search", request, tempo_pb2.SearchResponse)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_http_still_answers_on_the_port_after_grpc(srv: RunningServer) -> None:
    request = tempo_pb2.SearchTagsRequest()
    assert stream(srv, "SearchTagsV2", request, tempo_pb2.SearchTagsV2Response)
    with srv.client() as c:
        assert c.get("/api/echo").text == "echo\n"
        r = c.get("/api/v2/search/tags", headers=HEADERS)
        assert r.status_code == 200 and r.json()["scopes"]
        # A request line that starts like HTTP/2's preface but is not it: uvicorn's answer.
        r = c.request("PRI", "/", headers=HEADERS)
        assert r.http_version == "HTTP/1.1" and 400 <= r.status_code < 500
        assert c.get("/api/echo").text == "echo\n"


def test_concurrent_grpc_and_http_on_the_main_port(srv: RunningServer) -> None:
    q = '{resource.service.name="worker"}'
    request = tempo_pb2.SearchRequest(Query=q, start=NOW_S - 3600, end=NOW_S + 60)
    r = get(srv, "/api/search", q=q, start=str(NOW_S - 3600), end=str(NOW_S + 60))
    want = json_format.ParseDict(r.json(), tempo_pb2.SearchResponse())
    with channel(srv) as ch, ThreadPoolExecutor(8) as pool:
        call = ch.unary_stream(
            "/tempopb.StreamingQuerier/Search",
            request_serializer=tempo_pb2.SearchRequest.SerializeToString,
            response_deserializer=tempo_pb2.SearchResponse.FromString,
        )
        calls = [
            pool.submit(
                lambda: merged(
                    list(call(request, metadata=METADATA, timeout=30)), tempo_pb2.SearchResponse
                )
            )
            for _ in range(16)
        ]
        echoes = [pool.submit(lambda: get(srv, "/api/echo").text) for _ in range(8)]
        assert all(c.result() == want for c in calls)
        assert all(e.result() == "echo\n" for e in echoes)


def test_big_answers_are_sent_in_pieces_under_the_message_limit() -> None:
    from hotspan.server.tempo.grpc_api import MAX_MESSAGE_BYTES, _segments

    span = tempo_pb2.Span(spanID="0" * 16, name="x" * 2000, durationNanos=1)
    whole = tempo_pb2.SearchResponse()
    for i in range(4000):
        t = whole.traces.add(traceID=f"{i:032x}", rootServiceName="api")
        t.spanSet.spans.append(span)
    whole.metrics.completedJobs = 1
    assert whole.ByteSize() > 2 * MAX_MESSAGE_BYTES
    pieces = _segments(whole, "traces")
    assert len(pieces) > 2
    assert all(p.ByteSize() <= MAX_MESSAGE_BYTES for p in pieces)
    assert merged(pieces, tempo_pb2.SearchResponse) == whole
    assert [p.HasField("metrics") for p in pieces] == [False] * (len(pieces) - 1) + [True]


def test_grpc_tags_v2_max_tags_per_scope(srv: RunningServer) -> None:
    request = tempo_pb2.SearchTagsRequest(maxTagsPerScope=1)
    got = merged(
        stream(srv, "SearchTagsV2", request, tempo_pb2.SearchTagsV2Response),
        tempo_pb2.SearchTagsV2Response,
    )
    scopes = {s.name: list(s.tags) for s in got.scopes}
    assert scopes == tags_v2(srv, limit="1")
    assert len(scopes["span"]) == len(scopes["resource"]) == 1


def test_legacy_tags_of_a_grpc_search_keep_quotes_and_backslashes() -> None:
    from hotspan.query.traceql import parse_logfmt
    from hotspan.server.tempo.grpc_api import search_params

    tags = {"a": "plain", "b": 'say "hi"', "c": "C:\\dir\\", "d": "x=y", "e": "two words"}
    params = search_params(tempo_pb2.SearchRequest(Tags=tags))
    assert dict(parse_logfmt(params["tags"])) == tags


def test_otlp_ports_take_otlp_only(srv: RunningServer) -> None:
    """Tempo's queries answer on the main port only: the OTLP ports may be open to collectors
    that must not read traces (the OTLP/HTTP port answers 404 to anything but OTLP)."""
    assert srv.otlp_grpc_address and srv.otlp_http_url
    request = tempo_pb2.SearchRequest(Query="{}", start=NOW_S - 3600, end=NOW_S + 60)
    for address, code in (
        (srv.otlp_grpc_address, grpc.StatusCode.UNIMPLEMENTED),
        (srv.otlp_http_url.removeprefix("http://"), grpc.StatusCode.UNAVAILABLE),
    ):
        with grpc.insecure_channel(address) as ch:
            call = ch.unary_stream(
                "/tempopb.StreamingQuerier/Search",
                request_serializer=tempo_pb2.SearchRequest.SerializeToString,
                response_deserializer=tempo_pb2.SearchResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as err:
                list(call(request, metadata=METADATA, timeout=10))
            assert err.value.code() == code, address
    # OTLP/gRPC still takes spans there (another tenant, so as not to change the others'
    # counts), and the main port's gRPC finds them.
    tenant = "ingested-over-grpc"
    with grpc.insecure_channel(srv.otlp_grpc_address) as ch:
        export = ch.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=ExportTraceServiceRequest.SerializeToString,
            response_deserializer=lambda b: b,
        )
        export(_export(), metadata=(("x-scope-orgid", tenant),), timeout=30)
    md = (("x-scope-orgid", tenant), ("authorization", f"Bearer {TOKEN}"))
    got = merged(
        stream(srv, "Search", request, tempo_pb2.SearchResponse, md), tempo_pb2.SearchResponse
    )
    assert len(got.traces) == sum(len(spans) for _, spans in SERVICES.values())


API_ONLY = '{resource.service.name="api"}'
WINDOW = {"start": NOW_S - 3600, "end": NOW_S + 60}


@pytest.mark.parametrize(
    "method, request_, response_type, path, params",
    [
        (
            "SearchTags",
            tempo_pb2.SearchTagsRequest(scope="resource"),
            tempo_pb2.SearchTagsResponse,
            "/api/search/tags",
            {"scope": "resource"},
        ),
        (
            "SearchTags",
            tempo_pb2.SearchTagsRequest(query=API_ONLY, maxTagsPerScope=2),
            tempo_pb2.SearchTagsResponse,
            "/api/search/tags",
            {"q": API_ONLY, "limit": "2"},
        ),
        (
            "SearchTagsV2",
            tempo_pb2.SearchTagsRequest(query='{resource.service.name="worker"}', **WINDOW),
            tempo_pb2.SearchTagsV2Response,
            "/api/v2/search/tags",
            {"q": '{resource.service.name="worker"}', **{k: str(v) for k, v in WINDOW.items()}},
        ),
        (
            "SearchTagValues",
            tempo_pb2.SearchTagValuesRequest(tagName="http.route", query=API_ONLY),
            tempo_pb2.SearchTagValuesResponse,
            "/api/search/tag/http.route/values",
            {"q": API_ONLY},
        ),
        (
            "SearchTagValuesV2",
            tempo_pb2.SearchTagValuesRequest(tagName="resource.service.name", maxTagValues=1),
            tempo_pb2.SearchTagValuesV2Response,
            "/api/v2/search/tag/resource.service.name/values",
            {"limit": "1"},
        ),
    ],
)
def test_grpc_tag_calls_answer_as_http(  # type: ignore[no-untyped-def]
    srv: RunningServer, method: str, request_, response_type, path: str, params: Dict[str, str]
) -> None:
    """Each tag call gives what its HTTP endpoint gives for the same parameters."""
    got = merged(stream(srv, method, request_, response_type), response_type)
    r = get(srv, path, **params)
    assert r.status_code == 200, r.text
    assert got == json_format.ParseDict(r.json(), response_type())
    assert got.ByteSize() > 0  # something to compare


@pytest.mark.parametrize(
    "method, request_, path, params",
    [
        (
            "SearchTagsV2",
            tempo_pb2.SearchTagsRequest(scope="events"),
            "/api/v2/search/tags",
            {"scope": "events"},
        ),
        (
            "SearchTagValuesV2",
            tempo_pb2.SearchTagValuesRequest(
                tagName="span.http.route", query=API_ONLY, start=NOW_S + 60, end=NOW_S - 3600
            ),
            "/api/v2/search/tag/span.http.route/values",
            {"q": API_ONLY, "start": str(NOW_S + 60), "end": str(NOW_S - 3600)},
        ),
    ],
)
def test_grpc_tag_calls_refuse_as_http(  # type: ignore[no-untyped-def]
    srv: RunningServer, method: str, request_, path: str, params: Dict[str, str]
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stream(srv, method, request_, tempo_pb2.SearchTagsV2Response)
    r = get(srv, path, **params)
    assert r.status_code == 400
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == r.text.strip()


def test_duration_values_need_the_token_too(srv: RunningServer) -> None:
    path = "/api/v2/search/tag/duration/values"
    with srv.client() as c:
        assert c.get(path, headers={"X-Scope-OrgID": TENANT}).status_code == 401
    r = get(srv, path)
    assert r.status_code == 200 and r.json() == {"tagValues": []}


def test_grpc_metrics_query_range_instant_is_one_step(srv: RunningServer) -> None:
    """QueryRangeRequest.instant (Tempo passes it on as ``instant=``): true makes the range
    one step from start to end; false, as unset, a range of ``step``."""
    q = "{} | count_over_time() by (resource.service.name)"
    start, end = (NOW_S - 3600) * SEC, (NOW_S + 60) * SEC
    step = 60 * SEC
    answers = {}
    for instant in (True, False, None):
        request = tempo_pb2.QueryRangeRequest(query=q, start=start, end=end, step=step)
        if instant is not None:
            request.instant = instant
        answers[instant] = merged(
            stream(srv, "MetricsQueryRange", request, tempo_pb2.QueryRangeResponse),
            tempo_pb2.QueryRangeResponse,
        )
    params = {"q": q, "start": str(start), "end": str(end), "step": "60s", "instant": "true"}
    r = get(srv, "/api/metrics/query_range", **params)
    assert r.status_code == 200, r.text
    want = json_format.ParseDict(r.json(), tempo_pb2.QueryRangeResponse())
    assert answers[True] == want
    counts = {
        s.labels[0].value.string_value: [p.value for p in s.samples] for s in answers[True].series
    }
    assert counts == {name: [len(spans)] for name, (_, spans) in SERVICES.items()}
    assert answers[False] == answers[None] != answers[True]
    assert all(len(s.samples) > 1 for s in answers[False].series)


def export(srv: RunningServer, tenant: str, request: ExportTraceServiceRequest) -> None:
    """Spans of a tenant of their own, so that the other tests' answers stay as they are."""
    with srv.client() as c:
        r = c.post(
            "/v1/traces",
            content=request.SerializeToString(),
            headers={"content-type": "application/x-protobuf", "X-Scope-OrgID": tenant},
        )
        assert r.status_code == 200, r.text


def test_a_trace_longer_than_durationms_holds_is_answered_at_its_bound(
    srv: RunningServer,
) -> None:
    # A span whose clock was 60 days off: Tempo's durationMs (uint32 ms) ends at ~49.7 days.
    tenant = "skewed"
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(_attrs({"service.name": "skew"}))
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\xaa" * 16, b"\xbb" * 8, "skewed"
    span.start_time_unix_nano = T0 - 60 * 86400 * SEC
    span.end_time_unix_nano = T0
    export(srv, tenant, request)
    headers = {**HEADERS, "X-Scope-OrgID": tenant}
    with srv.client() as c:
        r = c.get("/api/search", params={"q": "{}"}, headers=headers)
    assert r.status_code == 200, r.text
    (trace,) = r.json()["traces"]
    assert trace["durationMs"] == 2**32 - 1
    metadata = (("x-scope-orgid", tenant), METADATA[1])
    got = merged(
        stream(
            srv, "Search", tempo_pb2.SearchRequest(Query="{}"), tempo_pb2.SearchResponse, metadata
        ),
        tempo_pb2.SearchResponse,
    )
    assert [t.durationMs for t in got.traces] == [2**32 - 1]


def test_root_tags_take_the_values_of_root_spans(srv: RunningServer) -> None:
    # A frontend's root span with a db span below it: the db is never a trace's root.
    tenant = "rooted"
    request = ExportTraceServiceRequest()
    for service, name, span_id, parent in (
        ("frontend", "GET /", b"\x01" * 8, b""),
        ("db", "query", b"\x02" * 8, b"\x01" * 8),
        ("batch", "nightly", b"\x03" * 8, b""),
    ):
        rs = request.resource_spans.add()
        rs.resource.attributes.extend(_attrs({"service.name": service}))
        span = rs.scope_spans.add().spans.add()
        trace_id = b"\xdd" * 16 if service == "batch" else b"\xcc" * 16
        span.trace_id, span.span_id, span.parent_span_id = trace_id, span_id, parent
        span.name = name
        span.start_time_unix_nano, span.end_time_unix_nano = T0, T0 + MS
    export(srv, tenant, request)

    def values(tag: str, q: Optional[str] = None) -> list:
        params = {"limit": TAGS_LIMIT, **({"q": q} if q else {})}
        with srv.client() as c:
            r = c.get(
                f"/api/v2/search/tag/{tag}/values",
                params=params,
                headers={**HEADERS, "X-Scope-OrgID": tenant},
            )
        assert r.status_code == 200, r.text
        return [v["value"] for v in r.json()["tagValues"]]

    assert values("resource.service.name") == ["batch", "db", "frontend"]
    assert values("rootServiceName") == values("trace:rootService") == ["batch", "frontend"]
    assert values("rootName") == values("trace:rootName") == ["GET /", "nightly"]
    # The query being typed narrows them to the traces of the spans it matches: the db's
    # spans are in the frontend's traces.
    q = '{resource.service.name = "db" && rootServiceName = }'
    assert values("rootServiceName", q) == values("trace:rootService", q) == ["frontend"]
    assert values("rootName", '{name = "nightly"}') == ["nightly"]
    assert values("rootName", '{name = "nothing"}') == []
