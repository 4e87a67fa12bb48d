"""TraceQL answers as Tempo's do where types and intrinsics decide, end to end.

Real servers (DuckDB, and ClickHouse when its fixture runs), spans made by the OpenTelemetry
SDK and sent by its OTLP/HTTP protobuf exporter, searches replayed as Grafana's Tempo data
source sends them (GET ``/api/search`` with ``q``, ``limit``, ``spss``, ``start``, ``end``).
Tempo's static types decide comparisons (pkg/traceql/enum_statics.go, isMatchingOperand): a
string never meets an int or a boolean, whatever its text; ints, floats and durations compare
as numbers.  Each query runs both on the SQL path and on the engine (the same filter after
``| select(name)``, which only the engine runs), which must agree.
"""

from __future__ import annotations

import time
import uuid
from typing import Dict, Iterator, List

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, set_span_in_context

from tests.clickhouse_fixture import clickhouse_available
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.conftest import RunningServer, start_server

SEC = 10**9
MS = 10**6
TENANT = "typed"
BASE_S = int(time.time()) - 2 * 3600
BASE = BASE_S * SEC
GRAFANA_HEADERS = {"Accept": "application/json, text/plain, */*", "X-Scope-OrgID": TENANT}

# One span per attribute value, each its own trace: its name says what it holds.
VALUES: Dict[str, object] = {
    "int 200": 200,
    "string 200": "200",
    "float 200": 200.0,
    "float 2.5": 2.5,
    "bool true": True,
    "string true": "true",
    "string ok": "ok",
}


@pytest.fixture(scope="module")
def servers(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dict[str, RunningServer]]:
    out = {"duckdb": start_server(tmp_path_factory.mktemp("duckdb") / "data")}
    try:
        if clickhouse_available():
            clickhouse = request.getfixturevalue("clickhouse_server")
            database = f"hotspan_test_{uuid.uuid4().hex}"
            clickhouse.command(f"CREATE DATABASE {database}")
            args = ["--store", clickhouse.url_for(database)]
            out["clickhouse"] = start_server(tmp_path_factory.mktemp("ch") / "data", args)
        _send(list(out.values()))
        yield out
    finally:
        for server in out.values():
            if server.process.poll() is None:
                server.stop()
            if server.process.stdout:
                server.process.stdout.close()


def _send(servers: List[RunningServer]) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "typed"}))
    for server in servers:
        exporter = OTLPSpanExporter(
            endpoint=server.url + "/v1/traces", headers={"X-Scope-OrgID": TENANT}, timeout=10
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("typed")
    first = None
    for i, (name, value) in enumerate(VALUES.items()):
        t0 = BASE + i * SEC
        span = tracer.start_span(name, kind=SpanKind.SERVER, attributes={"v": value}, start_time=t0)
        span.end(end_time=t0 + 5 * MS)
        first = first or span
    assert first is not None
    # A root with three children, one of them with a child of its own.
    t0 = BASE + 30 * SEC
    root = tracer.start_span("parent of three", start_time=t0)
    ctx = set_span_in_context(root)
    for i in range(3):
        child = tracer.start_span(f"child {i}", context=ctx, start_time=t0 + i * MS)
        if i == 0:
            grandchild = tracer.start_span(
                "grandchild", context=set_span_in_context(child), start_time=t0 + MS
            )
            grandchild.end(end_time=t0 + 2 * MS)
        child.end(end_time=t0 + (i + 3) * MS)
    root.end(end_time=t0 + 10 * MS)
    # A payment with an exception event, a retry event, a status message, a link to the
    # "int 200" span, from its own instrumentation scope.
    t0 = BASE + 40 * SEC
    lib = provider.get_tracer("payments-lib", "1.2.3", attributes={"team": "pay"})
    linked = Link(first.get_span_context(), {"opentracing.ref_type": "follows_from"})
    pay = lib.start_span("charge", kind=SpanKind.CLIENT, links=[linked], start_time=t0)
    pay.add_event("retry", {"attempt": 2}, timestamp=t0 + 2 * MS)
    pay.record_exception(ValueError("card declined"), timestamp=t0 + 5 * MS)
    pay.set_status(Status(StatusCode.ERROR, "card declined"))
    pay.end(end_time=t0 + 8 * MS)
    provider.shutdown()


def grafana_search(srv: RunningServer, q: str) -> httpx.Response:
    params = {
        "q": q,
        "limit": "50",
        "spss": "10",
        "start": str(BASE_S - 60),
        "end": str(BASE_S + 3600),
    }
    with srv.client() as c:
        return c.get("/api/search", params=params, headers=GRAFANA_HEADERS)


def matched(srv: RunningServer, q: str) -> List[str]:
    r = grafana_search(srv, q)
    assert r.status_code == 200, (q, r.text)
    names = {s["name"] for t in r.json().get("traces", []) for s in t["spanSet"]["spans"]}
    return sorted(names)


TYPED = {
    # A string literal finds strings only, whatever their text.
    '{span.v = "200"}': ["string 200"],
    '{span.v != "200"}': ["string ok", "string true"],
    '{span.v = "true"}': ["string true"],
    '{span.v =~ "2.*"}': ["string 200"],
    '{span.v !~ "x.*"}': ["string 200", "string ok", "string true"],
    '{span.v > "1"}': ["string 200", "string ok", "string true"],
    # Numbers find ints and floats alike, never strings.
    "{span.v = 200}": ["float 200", "int 200"],
    "{span.v = 200.0}": ["float 200", "int 200"],
    "{span.v != 200}": ["float 2.5"],
    "{span.v > 2}": ["float 2.5", "float 200", "int 200"],
    "{span.v < 100}": ["float 2.5"],
    # Booleans find booleans only.
    "{span.v = true}": ["bool true"],
    "{span.v != false}": ["bool true"],
    "{span.v = false}": [],
    # A status or a kind is no string: not the string "ok".
    "{span.v = ok}": [],
    "{span.v != error}": [],
    # Unscoped: the same rules.
    '{.v = "200"}': ["string 200"],
    "{.v = 200}": ["float 200", "int 200"],
}


@pytest.mark.parametrize("q", list(TYPED))
def test_comparisons_follow_tempos_types(servers: Dict[str, RunningServer], q: str) -> None:
    for name, srv in servers.items():
        assert matched(srv, q) == TYPED[q], (name, q)
        # The engine (a pipeline runs there) answers as the SQL does.
        assert matched(srv, q + " | select(name)") == TYPED[q], (name, q)


def test_legacy_tags_search_finds_the_number(servers: Dict[str, RunningServer]) -> None:
    # Grafana's search form sends tags=; a number-like value finds the number, as Tempo's
    # http.status_code column does.
    for srv in servers.values():
        params = {"tags": "v=200", "start": str(BASE_S - 60), "end": str(BASE_S + 3600)}
        with srv.client() as c:
            r = c.get("/api/search", params=params, headers=GRAFANA_HEADERS)
        assert r.status_code == 200, r.text
        roots = sorted(t["rootTraceName"] for t in r.json().get("traces", []))
        assert roots == ["float 200", "int 200"]


@pytest.mark.parametrize(
    "q, expected",
    [
        ("{span:childCount = 3}", ["parent of three"]),
        ("{childCount = 1}", ["child 0"]),
        ("{span:childCount > 0 && span:childCount < 3}", ["child 0"]),
    ],
)
def test_child_count_at_top_level(
    servers: Dict[str, RunningServer], q: str, expected: List[str]
) -> None:
    for name, srv in servers.items():
        assert matched(srv, q) == expected, (name, q)


# -- time windows: trace by id, tag values ------------------------------------------------------


def _trace_id(srv: RunningServer, root: str) -> str:
    r = grafana_search(srv, f'{{name = "{root}"}}')
    return r.json()["traces"][0]["traceID"]


def test_trace_by_id_is_found_only_in_its_window(servers: Dict[str, RunningServer]) -> None:
    # Grafana's trace view with "time shift" set: /api/v2/traces/<id>?start=&end= (seconds).
    for name, srv in servers.items():
        trace_id = _trace_id(srv, "parent of three")
        around = {"start": str(BASE_S + 29), "end": str(BASE_S + 31)}
        before = {"start": str(BASE_S - 7200), "end": str(BASE_S - 3600)}
        with srv.client() as c:
            for path in (f"/api/v2/traces/{trace_id}", f"/api/traces/{trace_id}"):
                r = c.get(path, params=around, headers=GRAFANA_HEADERS)
                assert r.status_code == 200, (name, path, r.text)
                r = c.get(path, params=before, headers=GRAFANA_HEADERS)
                assert r.status_code == 404, (name, path, r.text)
                assert c.get(path, headers=GRAFANA_HEADERS).status_code == 200


def test_tag_values_are_those_of_the_range(servers: Dict[str, RunningServer]) -> None:
    # Grafana's tag value lookups send start and end with no q: only values of spans in it.
    window = {"start": str(BASE_S - 60), "end": str(BASE_S + 20)}
    for name, srv in servers.items():
        with srv.client() as c:
            r = c.get("/api/v2/search/tag/name/values", params=window, headers=GRAFANA_HEADERS)
            assert r.status_code == 200, r.text
            got = sorted(v["value"] for v in r.json()["tagValues"])
            assert got == sorted(VALUES), name
            r = c.get("/api/search/tag/v/values", params=window, headers=GRAFANA_HEADERS)
            assert sorted(r.json()["tagValues"]) == ["2.5", "200", "ok", "true"], name
            later = {"start": str(BASE_S + 20), "end": str(BASE_S + 60)}
            r = c.get("/api/search/tag/v/values", params=later, headers=GRAFANA_HEADERS)
            assert r.json()["tagValues"] == [], name
            r = c.get("/api/v2/search/tag/span.v/values", params=later, headers=GRAFANA_HEADERS)
            assert r.json()["tagValues"] == [], name


# -- what only the stored OTLP span holds: status message, events, links, scope ---------------

RAW_FIELDS = {
    '{event:name = "exception"}': ["charge"],
    '{event:name = "retry" && kind = client}': ["charge"],
    '{event:name = "nothing"}': [],
    '{event.exception.message = "card declined"}': ["charge"],
    "{event.attempt = 2}": ["charge"],
    '{event.attempt = "2"}': [],  # an int, not a string
    "{event:timeSinceStart > 4ms}": ["charge"],
    "{event:timeSinceStart > 6ms}": [],
    '{statusMessage = "card declined"}': ["charge"],
    '{span:statusMessage =~ "card.*"}': ["charge"],
    '{statusMessage = "x"}': [],
    '{instrumentation:name = "payments-lib"}': ["charge"],
    '{instrumentation:version = "1.2.3" && instrumentation.team = "pay"}': ["charge"],
    '{instrumentation:name = "typed" && span.v = 200}': ["float 200", "int 200"],
    '{link.opentracing.ref_type = "follows_from"}': ["charge"],
    "{link:spanID != nil}": ["charge"],
    '{link:traceID = "0123456789abcdef0123456789abcdef"}': [],
    '{event:name = nil && name = "charge"}': [],
    '{event:name = nil && name = "parent of three"}': ["parent of three"],
}


@pytest.mark.parametrize("q", list(RAW_FIELDS))
def test_status_message_events_links_and_scope(servers: Dict[str, RunningServer], q: str) -> None:
    # Grafana's editor offers them (Tempo's intrinsics and scopes); hotspan reads them from
    # the OTLP spans it stored.
    for name, srv in servers.items():
        assert matched(srv, q) == RAW_FIELDS[q], (name, q)


def test_link_ids_are_the_linked_span(servers: Dict[str, RunningServer]) -> None:
    for name, srv in servers.items():
        target = grafana_search(srv, '{name = "int 200"}').json()["traces"][0]
        span_id = target["spanSet"]["spans"][0]["spanID"]
        q = f'{{link:traceID = "{target["traceID"]}" && link:spanID = "{span_id}"}}'
        assert matched(srv, q) == ["charge"], name


def test_a_status_message_asked_for_is_on_the_spans_found(
    servers: Dict[str, RunningServer],
) -> None:
    # Tempo carries every attribute the query fetched, intrinsics such as statusMessage too:
    # Grafana shows it as a column of the span table.
    for name, srv in servers.items():
        for q in ('{statusMessage = "card declined"}', '{span:statusMessage =~ "card.*"}'):
            spans = [
                s for t in grafana_search(srv, q).json()["traces"] for s in t["spanSet"]["spans"]
            ]
            assert spans, (name, q)
            for span in spans:
                assert {
                    "key": "statusMessage",
                    "value": {"stringValue": "card declined"},
                } in span["attributes"], (name, q, span)


def test_the_exceptions_of_failed_spans_are_shown_as_traces_drilldown_asks(
    servers: Dict[str, RunningServer],
) -> None:
    # Traces Drilldown's Exceptions tab: the event attributes selected, shown on each span by
    # their bare names, as Tempo shows them.
    q = (
        "{true && status = error} | select(resource.service.name, event.exception.message, "
        "event.exception.stacktrace, event.exception.type) with(most_recent=true)"
    )
    for name, srv in servers.items():
        spans = [s for t in grafana_search(srv, q).json()["traces"] for s in t["spanSet"]["spans"]]
        charge = [s for s in spans if s.get("name") == "charge"]
        assert charge, (name, spans)
        shown = {a["key"]: a["value"] for a in charge[0]["attributes"]}
        assert shown["exception.message"] == {"stringValue": "card declined"}, (name, shown)
        assert shown["exception.type"] == {"stringValue": "ValueError"}, (name, shown)
        assert "ValueError: card declined" in shown["exception.stacktrace"]["stringValue"]


def test_tag_names_and_values_of_events_links_scopes_and_status_messages(
    servers: Dict[str, RunningServer],
) -> None:
    # Grafana's editor and Traces Drilldown's filters list them as Tempo does, from the spans
    # of the range (which ended over a minute ago, as most ranges Grafana sends).
    window = {"start": str(BASE_S - 60), "end": str(BASE_S + 3600), "limit": "5000"}
    expected = {
        "event.exception.message": [{"type": "string", "value": "card declined"}],
        "event.exception.type": [{"type": "string", "value": "ValueError"}],
        "event.attempt": [{"type": "int", "value": "2"}],
        "event:name": [
            {"type": "string", "value": "exception"},
            {"type": "string", "value": "retry"},
        ],
        "statusMessage": [{"type": "string", "value": "card declined"}],
        "span:statusMessage": [{"type": "string", "value": "card declined"}],
        "link.opentracing.ref_type": [{"type": "string", "value": "follows_from"}],
        "instrumentation:name": [
            {"type": "string", "value": "payments-lib"},
            {"type": "string", "value": "typed"},
        ],
        "instrumentation:version": [{"type": "string", "value": "1.2.3"}],
        "instrumentation.team": [{"type": "string", "value": "pay"}],
        # Unscoped, an attribute is a span's, a resource's or a scope's: not an event's.
        ".attempt": [],
        ".team": [{"type": "string", "value": "pay"}],
    }
    for name, srv in servers.items():
        with srv.client() as c:
            r = c.get("/api/v2/search/tags", params=window, headers=GRAFANA_HEADERS)
            assert r.status_code == 200, r.text
            scopes = {s["name"]: s["tags"] for s in r.json()["scopes"]}
            assert {"attempt", "exception.message", "exception.type"} <= set(scopes["event"])
            assert scopes["link"] == ["opentracing.ref_type"], name
            assert scopes["instrumentation"] == ["team"], name
            assert "exception.message" not in scopes["span"], name
            r = c.get(
                "/api/v2/search/tags", params={**window, "scope": "link"}, headers=GRAFANA_HEADERS
            )
            assert r.json()["scopes"] == [{"name": "link", "tags": ["opentracing.ref_type"]}]
            for tag, values in expected.items():
                # Narrowed by the query being typed, they are still listed (Tempo narrows
                # them; hotspan's tag index knows them, its span records do not).
                for q in (None, "{kind = client}"):
                    params = dict(window, **({"q": q} if q else {}))
                    r = c.get(
                        f"/api/v2/search/tag/{tag}/values", params=params, headers=GRAFANA_HEADERS
                    )
                    assert r.status_code == 200, (name, tag, r.text)
                    assert r.json()["tagValues"] == values, (name, tag, q)
            # Version 1, by the bare name, with the range or the query being typed too.
            for params in ({}, window, {**window, "q": "{kind = client}"}):
                for tag, value in (("statusMessage", "card declined"), ("event:name", "retry")):
                    r = c.get(
                        f"/api/search/tag/{tag}/values", params=params, headers=GRAFANA_HEADERS
                    )
                    assert value in r.json()["tagValues"], (name, tag, params)
            r = c.get(
                "/api/v2/search/tag/span:event:name/values", params=window, headers=GRAFANA_HEADERS
            )
            assert r.json()["tagValues"] == [], name
