"""TraceQL pipelines, structural operators and span attributes in ``/api/search``, end to end.

One real server for the module (and one on ClickHouse, which must answer alike); spans made
by the OpenTelemetry SDK and sent by its OTLP/HTTP protobuf exporter.  Searches are replayed
as Grafana's Tempo data source sends them (GET ``/api/search`` with ``q``, ``limit``,
``spss``, ``start``, ``end``, its Accept header and the tenant header) and the answers checked
field by field against Tempo's ``SearchResponse`` (pkg/tempopb/tempo.proto, protobuf's JSON
mapping): each answer is also parsed strictly into our copy of that message.
"""

from __future__ import annotations

import time
import uuid
from typing import Dict, Iterator, List, Optional

import httpx
import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from hotspan.formats.proto import tempo_pb2
from tests.clickhouse_fixture import clickhouse_available
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.conftest import RunningServer, start_server

SEC = 10**9
MS = 10**6
TENANT = "pipelines"
BASE_S = int(time.time()) - 2 * 3600
BASE = BASE_S * SEC
# What Grafana's Tempo data source sends with a TraceQL search (datasource.ts, _request).
GRAFANA_HEADERS = {"Accept": "application/json, text/plain, */*", "X-Scope-OrgID": TENANT}
TRACE_KEYS = {
    "traceID",
    "rootServiceName",
    "rootTraceName",
    "startTimeUnixNano",
    "durationMs",
    "spanSet",
    "spanSets",
    "serviceStats",
}
SPAN_KEYS = {"spanID", "name", "startTimeUnixNano", "durationNanos"}
METRIC_KEYS = {
    "inspectedTraces",
    "inspectedBytes",
    "totalBlocks",
    "completedJobs",
    "totalJobs",
    "totalBlockBytes",
    "inspectedSpans",
}


class Shop:
    """Services sending their spans to the server as the SDK does, each its own provider."""

    def __init__(self, urls: List[str]) -> None:
        self.urls = urls
        self.providers: Dict[str, TracerProvider] = {}
        self.memory = InMemorySpanExporter()
        self.exporters: List[OTLPSpanExporter] = []

    def tracer(self, service: str):  # type: ignore[no-untyped-def]
        if service not in self.providers:
            resource = Resource.create({"service.name": service, "deployment.environment": "prod"})
            provider = TracerProvider(resource=resource)
            provider.add_span_processor(SimpleSpanProcessor(self.memory))
            for url in self.urls:
                exporter = OTLPSpanExporter(
                    endpoint=url + "/v1/traces", headers={"X-Scope-OrgID": TENANT}, timeout=10
                )
                self.exporters.append(exporter)
                provider.add_span_processor(SimpleSpanProcessor(_Checked(exporter)))
            self.providers[service] = provider
        return self.providers[service].get_tracer("shop")

    def span(
        self,
        service: str,
        name: str,
        start_ms: float,
        end_ms: Optional[float],
        parent=None,  # type: ignore[no-untyped-def]
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Optional[dict] = None,
        error: bool = False,
        base: int = BASE,
    ):  # type: ignore[no-untyped-def]
        span = self.tracer(service).start_span(
            name,
            context=set_span_in_context(parent) if parent is not None else None,
            kind=kind,
            attributes=attributes,
            start_time=int(base + start_ms * MS),
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, "boom"))
        if end_ms is not None:
            span.end(end_time=int(base + end_ms * MS))
        return span

    def finish(self) -> List[ReadableSpan]:
        for provider in self.providers.values():
            provider.force_flush()
            provider.shutdown()
        assert _Checked.failures == 0
        return list(self.memory.get_finished_spans())


class _Checked(SpanExporter):
    """An exporter wrapper that counts failed exports."""

    failures = 0

    def __init__(self, exporter: OTLPSpanExporter) -> None:
        self.exporter = exporter

    def export(self, spans):  # type: ignore[no-untyped-def]
        result = self.exporter.export(spans)
        if result is not SpanExportResult.SUCCESS:
            _Checked.failures += 1
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _checkout(shop: Shop, base: int, fail: bool) -> Dict[str, object]:
    """GET /checkout (frontend) → POST checkout (client) → POST /pay (checkout) → charge card,
    SELECT orders; and a cache get under the root.  With ``fail``, the payment fails."""
    root = shop.span(
        "frontend",
        "GET /checkout",
        0,
        None,
        kind=SpanKind.SERVER,
        attributes={"http.method": "GET", "http.status_code": 500 if fail else 200},
        base=base,
    )
    call = shop.span("frontend", "POST checkout", 5, 90, root, SpanKind.CLIENT, base=base)
    pay = shop.span(
        "checkout",
        "POST /pay",
        10,
        None,
        call,
        SpanKind.SERVER,
        {"http.method": "POST", "http.status_code": 500 if fail else 200},
        base=base,
    )
    charge = shop.span(
        "checkout",
        "charge card",
        20,
        60,
        pay,
        SpanKind.CLIENT,
        {"payment.provider": "stripe", "amount": 12.5, "retry": fail},
        error=fail,
        base=base,
    )
    select = shop.span(
        "checkout",
        "SELECT orders",
        61,
        70,
        pay,
        SpanKind.CLIENT,
        {"db.system": "postgresql", "db.rows": 7},
        base=base,
    )
    if fail:
        pay.set_status(Status(StatusCode.ERROR))
    pay.end(end_time=base + 85 * MS)
    cache = shop.span(
        "frontend", "cache get", 91, 93, root, attributes={"cache.hit": True}, base=base
    )
    root.end(end_time=base + 100 * MS)
    return {
        "root": root,
        "call": call,
        "pay": pay,
        "charge": charge,
        "select": select,
        "cache": cache,
    }


def _cart(shop: Shop, base: int) -> Dict[str, object]:
    """GET /cart (frontend) → GET /cart/items (cart) → SELECT cart (postgresql)."""
    root = shop.span("frontend", "GET /cart", 0, None, kind=SpanKind.SERVER, base=base)
    items = shop.span(
        "cart",
        "GET /cart/items",
        2,
        None,
        root,
        SpanKind.SERVER,
        {
            "http.method": "GET",
            "http.status_code": 200,
            # Arrays, as semantic conventions make request headers and the SDK sends lists.
            "http.request.header.accept": ["text/html", "application/json"],
            "retry.after": [1, 30],
            "cache.flags": [True, False],
            # A Kubernetes label's name holds a "/": Grafana asks its values with %2F.
            "app.kubernetes.io/name": "cart",
        },
        base=base,
    )
    select = shop.span(
        "cart",
        "SELECT cart",
        3,
        8,
        items,
        SpanKind.CLIENT,
        # The span's own value of an attribute its resource has too (prod): `.x` reads this.
        {
            "db.system": "postgresql",
            "deployment.environment": "canary",
            "db.tables": ["cart", "items", "404"],
        },
        base=base,
    )
    items.end(end_time=base + 9 * MS)
    root.end(end_time=base + 10 * MS)
    return {"root": root, "items": items, "select": select}


def hex_id(value: int, digits: int) -> str:
    return format(value, f"0{digits}x")


def sid(span) -> str:  # type: ignore[no-untyped-def]
    return hex_id(span.get_span_context().span_id, 16)


def tid(span) -> str:  # type: ignore[no-untyped-def]
    return hex_id(span.get_span_context().trace_id, 32)


class Data:
    def __init__(self, failed: dict, ok: dict, cart: dict) -> None:  # type: ignore[type-arg]
        self.failed, self.ok, self.cart = failed, ok, cart


@pytest.fixture(scope="module")
def servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dict[str, RunningServer]]:
    """A server on DuckDB, and one on ClickHouse when the fixture can run it."""
    out = {"duckdb": start_server(tmp_path_factory.mktemp("duckdb") / "data")}
    try:
        if clickhouse_available():
            clickhouse = request.getfixturevalue("clickhouse_server")
            database = f"hotspan_test_{uuid.uuid4().hex}"
            clickhouse.command(f"CREATE DATABASE {database}")
            args = ["--store", clickhouse.url_for(database)]
            out["clickhouse"] = start_server(tmp_path_factory.mktemp("ch") / "data", args)
        yield out
    finally:
        for server in out.values():
            if server.process.poll() is None:
                server.stop()
            if server.process.stdout:
                server.process.stdout.close()


@pytest.fixture(scope="module")
def data(servers: Dict[str, RunningServer]) -> Data:
    """The shop's traces, sent to every server."""
    shop = Shop([server.url for server in servers.values()])
    # Oldest first: the failed checkout, the cart, then a checkout that went well.
    failed = _checkout(shop, BASE, fail=True)
    cart = _cart(shop, BASE + 60 * SEC)
    ok = _checkout(shop, BASE + 120 * SEC, fail=False)
    shop.finish()
    return Data(failed, ok, cart)


@pytest.fixture
def srv(servers: Dict[str, RunningServer], data: Data) -> RunningServer:
    return servers["duckdb"]


def grafana_search(srv: RunningServer, q: str, limit: int = 20, spss: int = 3) -> httpx.Response:
    """The request Grafana's Tempo data source makes for a TraceQL query (not streaming)."""
    params = {
        "q": q,
        "limit": str(limit),
        "spss": str(spss),
        "start": str(BASE_S - 60),
        "end": str(BASE_S + 3600),
    }
    with srv.client() as c:
        return c.get("/api/search", params=params, headers=GRAFANA_HEADERS)


def answer(srv: RunningServer, q: str, **kw: int) -> dict:  # type: ignore[type-arg]
    r = grafana_search(srv, q, **kw)
    assert r.status_code == 200, (q, r.text)
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    # Tempo's SearchResponse, strictly: an unknown field or a wrong type fails here.
    json_format.ParseDict(body, tempo_pb2.SearchResponse())
    assert set(body) <= {"traces", "metrics"}
    assert set(body["metrics"]) <= METRIC_KEYS
    for trace in body.get("traces", []):
        assert set(trace) == TRACE_KEYS
        assert trace["spanSet"] == trace["spanSets"][0]
        assert len(trace["traceID"]) == 32 and int(trace["traceID"], 16)
        assert trace["startTimeUnixNano"].isdigit() and isinstance(trace["durationMs"], int)
        for spanset in trace["spanSets"]:
            assert set(spanset) <= {"spans", "matched", "attributes"}
            assert isinstance(spanset["matched"], int)
            for span in spanset["spans"]:
                assert SPAN_KEYS <= set(span) <= SPAN_KEYS | {"attributes"}
                assert len(span["spanID"]) == 16
                assert span["startTimeUnixNano"].isdigit() and span["durationNanos"].isdigit()
    return body


def traces(body: dict) -> Dict[str, dict]:  # type: ignore[type-arg]
    return {t["traceID"]: t for t in body.get("traces", [])}


def spans_of(spanset: dict) -> List[str]:  # type: ignore[type-arg]
    return [s["name"] for s in spanset["spans"]]


def attributes(span: dict) -> Dict[str, dict]:  # type: ignore[type-arg]
    return {a["key"]: a["value"] for a in span.get("attributes", [])}


# -- structural operators ----------------------------------------------------------------------


def test_descendant_returns_the_right_side_with_the_attributes_named(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    body = answer(srv, '{resource.service.name="frontend"} >> {status=error}')
    got = traces(body)
    assert list(got) == [tid(data.failed["root"])]
    trace = got[tid(data.failed["root"])]
    assert trace["rootServiceName"] == "frontend"
    assert trace["rootTraceName"] == "GET /checkout"
    assert trace["startTimeUnixNano"] == str(BASE)
    assert trace["durationMs"] == 100
    spanset = trace["spanSet"]
    assert spanset["matched"] == 2
    assert "attributes" not in spanset
    pay, charge = spanset["spans"]
    assert pay == {
        "spanID": sid(data.failed["pay"]),
        "name": "POST /pay",
        "startTimeUnixNano": str(BASE + 10 * MS),
        "durationNanos": str(75 * MS),
        "attributes": [
            {"key": "service.name", "value": {"stringValue": "checkout"}},
            {"key": "status", "value": {"stringValue": "error"}},
        ],
    }
    assert charge["name"] == "charge card" and charge["spanID"] == sid(data.failed["charge"])
    assert body["metrics"]["inspectedTraces"] >= 1
    assert int(body["metrics"]["inspectedSpans"]) >= 6


@pytest.mark.parametrize(
    "q,expected",
    [
        ('{name="POST /pay"} > {}', ["charge card", "SELECT orders"]),
        ('{name="charge card"} < {}', ["POST /pay"]),
        ('{name="charge card"} << {kind=server}', ["GET /checkout", "POST /pay"]),
        ('{name="charge card"} ~ {}', ["SELECT orders"]),
        ('{kind=server} !> {resource.service.name="checkout"}', ["POST /pay"]),
        ('{kind=client} !> {resource.service.name="checkout"}', ["charge card", "SELECT orders"]),
        ('{name="nope"} > {}', []),
        ('{} !< {resource.service.name="checkout"}', ["charge card", "SELECT orders"]),
        ('{name="POST /pay"} &> {name="charge card"}', ["POST /pay", "charge card"]),
    ],
)
def test_structural_operators_in_each_checkout(
    srv, data: Data, q: str, expected: List[str]
) -> None:  # type: ignore[no-untyped-def]
    got = traces(answer(srv, q))
    checkouts = [tid(data.ok["root"]), tid(data.failed["root"])]
    if not expected:
        assert got == {}
        return
    assert list(got) == checkouts  # newest first
    for trace_id in checkouts:
        assert spans_of(got[trace_id]["spanSet"]) == expected


# -- spanset operators and pipelines -------------------------------------------------------------


def test_union_finds_traces_with_either_side(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    got = traces(
        answer(srv, '{name="GET /cart/items"} || {span.payment.provider="stripe" && status=error}')
    )
    assert list(got) == [tid(data.cart["root"]), tid(data.failed["root"])]
    assert spans_of(got[tid(data.cart["root"])]["spanSet"]) == ["GET /cart/items"]
    assert spans_of(got[tid(data.failed["root"])]["spanSet"]) == ["charge card"]


def test_and_between_spansets_shows_both_sides(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    # As Tempo: the spans of each side, not only the first's (the SQL path and the engine's).
    for q in [
        '{name="POST /pay"} && {name="cache get"}',
        '{name="POST /pay"} && {name="cache get"} | select(name)',
    ]:
        got = traces(answer(srv, q))
        assert list(got) == [tid(data.ok["root"]), tid(data.failed["root"])], q
        for trace in got.values():
            assert spans_of(trace["spanSet"]) == ["POST /pay", "cache get"], q
            assert trace["spanSet"]["matched"] == 2, q
    simple = answer(srv, "{kind=server} && {kind=client}")
    engine = answer(srv, "{kind=server} && {kind=client} | select(name)")
    failed = traces(simple)[tid(data.failed["root"])]["spanSet"]
    assert failed["matched"] == 5  # 2 server spans, 3 client spans
    assert spans_of(failed) == ["GET /checkout", "POST checkout", "POST /pay"]  # spss 3
    assert [t["spanSet"] for t in simple["traces"]] == [t["spanSet"] for t in engine["traces"]]


def test_or_inside_a_filter(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    got = traces(answer(srv, '{name="SELECT cart" || (name="charge card" && status=error)}'))
    assert list(got) == [tid(data.cart["root"]), tid(data.failed["root"])]


def test_by_and_count_add_spanset_attributes(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    body = answer(srv, "{status=error} | by(resource.service.name) | count() > 1")
    got = traces(body)
    assert list(got) == [tid(data.failed["root"])]
    spanset = got[tid(data.failed["root"])]["spanSet"]
    assert spans_of(spanset) == ["POST /pay", "charge card"]
    assert spanset["attributes"] == [
        {"key": "by(resource.service.name)", "value": {"stringValue": "checkout"}},
        {"key": "count()", "value": {"intValue": "2"}},
    ]


def test_by_makes_one_spanset_per_value(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    got = traces(answer(srv, "{kind=server} | by(resource.service.name)"))
    assert list(got) == [tid(data.ok["root"]), tid(data.cart["root"]), tid(data.failed["root"])]
    for trace in got.values():
        assert trace["spanSet"] == trace["spanSets"][0]
    cart = got[tid(data.cart["root"])]["spanSets"]
    assert [(spans_of(s), s["attributes"][0]["value"]["stringValue"]) for s in cart] == [
        (["GET /cart"], "frontend"),
        (["GET /cart/items"], "cart"),
    ]


def test_avg_duration_filters_traces_and_prints_a_duration(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    # Client spans of a checkout: 85, 40 and 9 ms; of the cart: 5 ms.
    got = traces(answer(srv, "{kind=client} | avg(duration) > 20ms"))
    assert list(got) == [tid(data.ok["root"]), tid(data.failed["root"])]
    spanset = got[tid(data.ok["root"])]["spanSet"]
    assert spanset["matched"] == 3
    assert spanset["attributes"] == [
        {"key": "avg(duration)", "value": {"stringValue": "44.666666ms"}}
    ]
    assert traces(answer(srv, "{kind=client} | max(duration) < 6ms")).keys() == {
        tid(data.cart["root"])
    }


def test_spss_bounds_the_spans_shown_not_matched(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    got = traces(answer(srv, "{} | count() > 5", spss=2))
    assert list(got) == [tid(data.ok["root"]), tid(data.failed["root"])]
    spanset = got[tid(data.ok["root"])]["spanSet"]
    assert spanset["matched"] == 6
    assert spans_of(spanset) == ["GET /checkout", "POST checkout"]


def test_limit_keeps_the_newest_traces(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    got = traces(answer(srv, "{} | count() > 0", limit=2))
    assert list(got) == [tid(data.ok["root"]), tid(data.cart["root"])]


def test_select_shows_typed_attributes(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    q = '{name="charge card"} | select(span.amount, span.retry, span.payment.provider, kind)'
    got = traces(answer(srv, q))
    charge = got[tid(data.failed["root"])]["spanSet"]["spans"][0]
    assert charge["attributes"] == [
        {"key": "amount", "value": {"doubleValue": 12.5}},
        {"key": "retry", "value": {"boolValue": True}},
        {"key": "payment.provider", "value": {"stringValue": "stripe"}},
        {"key": "kind", "value": {"stringValue": "client"}},
    ]
    assert attributes(got[tid(data.ok["root"])]["spanSet"]["spans"][0])["retry"] == {
        "boolValue": False
    }


# -- Traces Drilldown: root spans and the structure tab -----------------------------------------

# Traces Drilldown's structure tab, as it sends it (limit 200, spss 20).
STRUCTURE = (
    "({nestedSetParent<0 && true } &>> { kind = server }) || ({nestedSetParent<0 && true }) "
    "| select(status, resource.service.name, name, nestedSetParent, nestedSetLeft, nestedSetRight)"
)


def test_root_spans_as_drilldown_asks_for_them(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    roots = [data.ok["root"], data.cart["root"], data.failed["root"]]
    for q in ["{nestedSetParent<0}", "{nestedSetParent<0 && true}", "{nestedSetParent=-1}"]:
        got = traces(answer(srv, q))
        assert list(got) == [tid(r) for r in roots], q
        for root in roots:
            assert [s["spanID"] for s in got[tid(root)]["spanSet"]["spans"]] == [sid(root)], q
    failed = traces(answer(srv, "{nestedSetParent<0 && status = error}"))
    assert failed == {}  # the failed checkout's root did not fail, its payment did
    got = traces(answer(srv, "{nestedSetParent>=0 && kind = server}"))
    assert [s["name"] for s in got[tid(data.cart["root"])]["spanSet"]["spans"]] == [
        "GET /cart/items"
    ]


def test_structure_tab_gets_the_nested_set_of_each_span(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    got = traces(answer(srv, STRUCTURE, limit=200, spss=20))
    assert list(got) == [tid(data.ok["root"]), tid(data.cart["root"]), tid(data.failed["root"])]
    spans = got[tid(data.failed["root"])]["spanSet"]["spans"]
    assert [s["name"] for s in spans] == ["GET /checkout", "POST /pay"]
    # Depth first from the root in start order: GET /checkout (1) → POST checkout (2) →
    # POST /pay (3) → charge card (4, 5), SELECT orders (6, 7); POST /pay closes at 8.
    assert [attributes(s) for s in spans] == [
        {
            "kind": {"stringValue": "server"},  # the query names it
            "status": {"stringValue": "unset"},
            "service.name": {"stringValue": "frontend"},
            "nestedSetParent": {"intValue": "-1"},
            "nestedSetLeft": {"intValue": "1"},
            "nestedSetRight": {"intValue": "12"},
        },
        {
            "kind": {"stringValue": "server"},
            "status": {"stringValue": "error"},
            "service.name": {"stringValue": "checkout"},
            "nestedSetParent": {"intValue": "2"},
            "nestedSetLeft": {"intValue": "3"},
            "nestedSetRight": {"intValue": "8"},
        },
    ]
    cart = got[tid(data.cart["root"])]["spanSet"]["spans"]
    assert [(s["name"], attributes(s)["nestedSetParent"]) for s in cart] == [
        ("GET /cart", {"intValue": "-1"}),
        ("GET /cart/items", {"intValue": "1"}),
    ]


# -- attributes on the SQL path ------------------------------------------------------------------


def test_simple_queries_show_the_attributes_they_name(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    got = traces(answer(srv, "{span.http.status_code >= 500 && kind = server}"))
    assert list(got) == [tid(data.failed["root"])]
    spans = got[tid(data.failed["root"])]["spanSet"]["spans"]
    assert [s["name"] for s in spans] == ["GET /checkout", "POST /pay"]
    for span in spans:
        assert span["attributes"] == [
            {"key": "http.status_code", "value": {"intValue": "500"}},
            {"key": "kind", "value": {"stringValue": "server"}},
        ]
    # Unscoped and resource attributes; a span without one leaves it out.
    got = traces(answer(srv, '{.db.system="postgresql" && resource.deployment.environment="prod"}'))
    select = got[tid(data.cart["root"])]["spanSet"]["spans"][0]
    assert select["attributes"] == [
        {"key": "db.system", "value": {"stringValue": "postgresql"}},
        {"key": "deployment.environment", "value": {"stringValue": "prod"}},
    ]


def test_names_durations_and_empty_filters_show_no_attributes(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    for q in ["{}", '{name="GET /cart" && duration > 1ms}', "{traceDuration > 50ms}"]:
        for trace in answer(srv, q)["traces"]:
            for span in trace["spanSet"]["spans"]:
                assert "attributes" not in span, q


# -- the SQL path and the engine agree --------------------------------------------------------

# Filters the SQL path runs alone; with `| select(span:id)` the engine runs them.  `.x` is the
# span's attribute when the span has it, else its resource's (Tempo's AttributeFor).
BOTH_PATHS = [
    '{.deployment.environment = "prod"}',
    '{.deployment.environment = "canary"}',
    '{.deployment.environment != "prod"}',
    '{.deployment.environment =~ "p.*"}',
    '{.service.name = "cart"}',
    "{.http.status_code >= 500}",
    '{resource.deployment.environment = "prod" && .db.system = "postgresql"}',
    '{span.deployment.environment = "canary"}',
    '{kind = client && .deployment.environment != "canary"}',
]


def found_spans(body: dict) -> Dict[str, tuple]:  # type: ignore[type-arg]
    return {
        t["traceID"]: (sorted(s["spanID"] for s in t["spanSet"]["spans"]), t["spanSet"]["matched"])
        for t in body.get("traces", [])
    }


def test_sql_and_engine_find_the_same_spans(servers: Dict[str, RunningServer], data: Data) -> None:
    canary = data.cart["select"]
    for name, server in servers.items():
        for q in BOTH_PATHS:
            sql = found_spans(answer(server, q, spss=100))
            engine = found_spans(answer(server, q + " | select(span:id)", spss=100))
            assert sql == engine, (name, q)
        # The span's own value wins over its resource's: found as canary only.
        prod = found_spans(answer(server, '{.deployment.environment = "prod"}', spss=100))
        assert sid(canary) not in prod[tid(data.cart["root"])][0], name
        assert found_spans(answer(server, '{.deployment.environment = "canary"}', spss=100)) == {
            tid(data.cart["root"]): ([sid(canary)], 1)
        }, name


def test_an_array_attribute_is_compared_element_by_element(
    servers: Dict[str, RunningServer], data: Data
) -> None:
    items, select = data.cart["items"], data.cart["select"]
    cart = tid(data.cart["root"])
    for name, server in servers.items():
        # Each by the store's statement, and by the engine (select() makes the engine read).
        for q, span in [
            ('{span.db.tables = "items"}', select),
            ('{span.db.tables = "404"}', select),
            ('{span.db.tables != "orders"}', select),
            ('{span.db.tables =~ "it.*"}', select),
            ('{span.db.tables !~ "z.*"}', select),
            ('{span.db.tables > "d"}', select),
            ('{.http.request.header.accept = "application/json"}', items),
            ("{span.retry.after > 10}", items),
            ("{span.retry.after = 30}", items),
            ("{span.retry.after != 2}", items),
            ("{span.cache.flags = false}", items),
            ("{span.cache.flags != nil && span.retry.after >= 30}", items),
        ]:
            for path in (q, q + " | select(span:id)"):
                found = found_spans(answer(server, path, spss=100))
                assert found == {cart: ([sid(span)], 1)}, (name, path)
        for q in [
            "{span.db.tables = 404}",  # a string element never equals a number
            '{span.db.tables != "cart"}',
            '{span.db.tables !~ "c.*"}',
            "{span.retry.after < 1}",
            "{span.retry.after != 1}",
            "{span.cache.flags != true}",
        ]:
            for path in (q, q + " | select(span:id)"):
                assert found_spans(answer(server, path, spss=100)) == {}, (name, path)
        # Each element is a value of the attribute, as Grafana's value picker lists them.
        with server.client() as c:
            r = c.get(
                "/api/v2/search/tag/span.db.tables/values",
                params={"start": str(BASE_S - 60), "end": str(BASE_S + 3600)},
                headers=GRAFANA_HEADERS,
            )
        assert r.status_code == 200, r.text
        values = {(v["type"], v["value"]) for v in r.json()["tagValues"]}
        assert values == {("string", "cart"), ("string", "items"), ("string", "404")}, name


def test_names_with_a_slash_since_and_tempos_scope_names(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    window = {"start": str(BASE_S - 60), "end": str(BASE_S + 3600)}
    with srv.client() as c:
        for path in (
            "/api/v2/search/tag/span.app.kubernetes.io%2Fname/values",
            "/api/search/tag/app.kubernetes.io%2Fname/values",
        ):
            # limit=0: no limit, as Tempo reads it.
            r = c.get(path, params={**window, "limit": "0"}, headers=GRAFANA_HEADERS)
            assert r.status_code == 200, (path, r.text)
            values = r.json()["tagValues"]
            assert values in ([{"type": "string", "value": "cart"}], ["cart"]), (path, values)
        # Tempo's "none" is every scope; "trace" holds no attribute.
        every = c.get("/api/v2/search/tags", params=window, headers=GRAFANA_HEADERS).json()
        none = c.get(
            "/api/v2/search/tags", params={**window, "scope": "none"}, headers=GRAFANA_HEADERS
        ).json()
        assert none == every and any(s["tags"] for s in every["scopes"])
        trace = c.get("/api/v2/search/tags", params={**window, "scope": "trace"})
        assert trace.status_code == 200 and trace.json() == {
            "scopes": [{"name": "trace", "tags": []}]
        }
        # since: the last so long before now, as Tempo's frontend reads it.
        recent = {"q": "{}", "limit": "100"}
        hours = c.get("/api/search", params={**recent, "since": "3h"}, headers=GRAFANA_HEADERS)
        minute = c.get("/api/search", params={**recent, "since": "1m"}, headers=GRAFANA_HEADERS)
        bad = c.get("/api/search", params={**recent, "since": "soon"}, headers=GRAFANA_HEADERS)
        ages = c.get(
            "/api/search", params={**recent, "since": "9" * 30 + "y"}, headers=GRAFANA_HEADERS
        )
    assert ages.status_code == 200 and tid(data.cart["root"]) in traces(ages.json())
    assert tid(data.cart["root"]) in traces(hours.json())
    assert traces(minute.json()) == {}
    assert bad.status_code == 400 and "since" in bad.text


def test_tags_search_reads_go_durations(srv, data: Data) -> None:  # type: ignore[no-untyped-def]
    # Tempo reads minDuration with Go's time.ParseDuration: ".05s" is 50ms (a TraceQL
    # duration literal reads the same).  Checkouts take 100ms, the cart 10ms.
    params = {"tags": "", "start": str(BASE_S - 60), "end": str(BASE_S + 3600)}
    with srv.client() as c:
        r = c.get("/api/search", params={**params, "minDuration": ".05s"}, headers=GRAFANA_HEADERS)
        negative = c.get("/api/search", params={**params, "minDuration": "-1s"})
    assert r.status_code == 200, r.text
    assert sorted(traces(r.json())) == sorted([tid(data.ok["root"]), tid(data.failed["root"])])
    assert sorted(traces(answer(srv, "{traceDuration > .05s}"))) == sorted(traces(r.json()))
    assert negative.status_code == 400


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "q,message",
    [
        ("({} | by(kind)) > {}", "coalesce()"),
        ("{} | rate() by (resource.service.name)", "/api/metrics/query_range"),
        ('{name="a"} | count(', "expected"),
        ("{span.x = 1} >>> {}", "TraceQL"),
        ("{}" + " | count() > 0" * 2000, "parts, more than"),
        ("{}" + " | count() > 0" * 40, "pipeline stages"),
    ],
)
def test_errors_are_400_with_the_reason(srv, q: str, message: str) -> None:  # type: ignore[no-untyped-def]
    r = grafana_search(srv, q)
    assert r.status_code == 400, r.text
    assert message in r.text
    assert r.headers["content-type"].startswith("text/plain")


def test_nothing_found_is_an_answer_without_traces(srv) -> None:  # type: ignore[no-untyped-def]
    body = answer(srv, '{name="nothing"} >> {}')
    assert "traces" not in body
    assert body["metrics"]["completedJobs"] == 1


# -- ClickHouse ------------------------------------------------------------------------------------

SAME_ON_CLICKHOUSE = [
    '{resource.service.name="frontend"} >> {status=error}',
    "{status=error} | by(resource.service.name) | count() > 1",
    "{kind=server} | by(resource.service.name)",
    "{kind=client} | avg(duration) > 20ms",
    '{name="charge card"} | select(span.amount, span.retry, kind)',
    '{name="GET /cart/items"} || {span.payment.provider="stripe" && status=error}',
    "{span.http.status_code >= 500 && kind = server}",
    '{} !< {resource.service.name="checkout"}',
    "{nestedSetParent<0}",
    "{nestedSetParent<0 && true}",
    STRUCTURE,
    "{kind=server} && {kind=client}",
    '{span.db.tables = "items" && span.db.tables != "orders"}',
    "{span.retry.after > 10 && span.retry.after != 2}",
]


def test_clickhouse_answers_as_duckdb(servers: Dict[str, RunningServer], data: Data) -> None:
    if "clickhouse" not in servers:
        pytest.skip("ClickHouse fixture not available")
    for q in SAME_ON_CLICKHOUSE:
        duck = answer(servers["duckdb"], q)
        assert duck.get("traces"), q
        assert answer(servers["clickhouse"], q) == duck, q
