"""Per-endpoint profiling, against a real server fed by a real traced program: the
OpenTelemetry SDK's spans and the hotspan agent's samples, three endpoints of known cost."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from hotspan.model.trace import SpanRecord
from hotspan.query.endpoints import local_roots
from tests.conftest import RunningServer, running_server
from tests.helpers import CPU, function_totals, native_states, run_programs, traced_program

GIL_WAIT = "gil_wait:gil_wait:nanoseconds:wall:nanoseconds"

SEC = 10**9
# Three endpoints of known cost, each request a local root span of its own: checkout burns
# 0.12 s itself and 0.06 s in a child span, search 0.05 s, health next to nothing; and some
# CPU outside any span, which no endpoint may claim.
PROGRAM = traced_program(
    "shop",
    """
    def charge_card():
        burn(0.06)

    def checkout():
        burn(0.12)
        with tracer.start_as_current_span("charge"):
            charge_card()

    def search_index():
        burn(0.05)

    def startup():
        burn(0.1)

    startup()
    for i in range(8):
        if i < 3:
            with tracer.start_as_current_span("GET /checkout"):
                checkout()
        if i < 5:
            with tracer.start_as_current_span("GET /search") as span:
                search_index()
                if i in (1, 3):  # two of the five searches fail
                    span.set_status(trace.Status(trace.StatusCode.ERROR, "index offline"))
        with tracer.start_as_current_span("GET /health"):
            time.sleep(0.01)
    time.sleep(1.5)
    """,
)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("endpoints") / "data") as srv:
        run_programs(PROGRAM, tmp_path_factory.mktemp("prog"), [srv.url])
        yield srv


def window() -> dict:
    now = int(time.time())
    return {"start": now - 600, "end": now + 60}


def get_endpoints(srv: RunningServer, **params) -> dict:  # type: ignore[no-untyped-def]
    # Spans arrive with the SDK's batch export, samples with the agent's uploads: both are
    # flushed when the program ends, and committed by the store a moment later.
    query = {"service": "shop", **window(), **params}
    deadline = time.monotonic() + 20
    with srv.client() as c:
        while True:
            r = c.get("/api/v1/endpoints", params=query)
            assert r.status_code == 200, r.text
            body = r.json()
            found = {e["name"]: e for e in body["endpoints"]}
            if found.get("GET /health", {}).get("requests") == 8 or time.monotonic() > deadline:
                return body
            time.sleep(0.3)


def test_endpoints_ranked_by_cpu_with_request_counts(shop: RunningServer) -> None:
    body = get_endpoints(shop)
    assert body["profileType"] == CPU
    names = [e["name"] for e in body["endpoints"]]
    # Only local roots: "charge" is part of checkout's requests, not an endpoint.
    assert sorted(names) == ["GET /checkout", "GET /health", "GET /search"]
    assert names[:2] == ["GET /checkout", "GET /search"]
    found = {e["name"]: e for e in body["endpoints"]}
    assert {n: e["requests"] for n, e in found.items()} == {
        "GET /checkout": 3,
        "GET /search": 5,
        "GET /health": 8,
    }
    checkout, search = found["GET /checkout"], found["GET /search"]
    # CPU per request whatever the profile asked for; no allocation profile, no figure.
    assert checkout["cpuPerRequest"] == pytest.approx(checkout["perRequest"])
    assert checkout["allocPerRequest"] is None
    # 0.18 s per checkout (its child span's CPU included), 0.05 s per search.
    assert checkout["perRequest"] > 2 * search["perRequest"]
    assert checkout["perRequest"] >= 0.14 * SEC
    assert checkout["perRequest"] == pytest.approx(checkout["total"] / 3)
    assert checkout["share"] == pytest.approx(checkout["total"] / body["total"])
    # startup() ran outside any span: the service's total holds it, no endpoint does.
    assert body["unattributed"] >= 0.05 * SEC
    assert body["unattributed"] == body["total"] - sum(e["total"] for e in body["endpoints"])
    assert body["truncated"] is False


def test_endpoints_have_error_rates_and_latency_percentiles(shop: RunningServer) -> None:
    found = {e["name"]: e for e in get_endpoints(shop)["endpoints"]}
    assert {n: (e["errors"], e["errorRate"]) for n, e in found.items()} == {
        "GET /checkout": (0, 0),
        "GET /search": (2, pytest.approx(0.4)),
        "GET /health": (0, 0),
    }
    for e in found.values():
        latency = e["latencyNanos"]
        assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"], e
    # The durations of the requests' spans: checkout burns 0.18 s, health sleeps 10 ms.
    assert found["GET /checkout"]["latencyNanos"]["p50"] >= 0.17 * SEC
    assert 0.01 * SEC <= found["GET /health"]["latencyNanos"]["p50"] < 0.1 * SEC


# A report that runs Python while another thread spins in Python beside it: it waits for the
# GIL about half its time; a health check sleeps and hardly waits.
CONTENDED = traced_program(
    "contended",
    """
    import threading

    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(300))

    def price_rows():
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            sum(range(300))

    spinner = threading.Thread(target=spin)
    spinner.start()
    for i in range(3):
        with tracer.start_as_current_span("GET /report"):
            price_rows()
        with tracer.start_as_current_span("GET /status"):
            time.sleep(0.1)
    stop.set()
    spinner.join()
    time.sleep(1.5)
    """,
)


@native_states
def test_endpoints_show_the_time_requests_waited_for_the_gil(
    shop: RunningServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    run_programs(CONTENDED, tmp_path_factory.mktemp("contended"), [shop.url])
    deadline = time.monotonic() + 20
    with shop.client() as c:
        while True:
            r = c.get("/api/v1/endpoints", params={"service": "contended", **window()})
            assert r.status_code == 200, r.text
            body = r.json()
            found = {e["name"]: e for e in body["endpoints"]}
            report = found.get("GET /report", {})
            if (report.get("gilWaitPerRequest") or 0) > 0.05 * SEC:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.3)
    assert body["gilWaitProfileType"] == GIL_WAIT
    assert report["requests"] == 3
    # Half of its 0.3 s for the GIL, give or take; the sleeper hardly any.
    assert report["gilWaitPerRequest"] < 0.3 * SEC
    assert found["GET /status"]["gilWaitPerRequest"] < 0.2 * report["gilWaitPerRequest"]
    # Asked for the GIL-wait profile itself, the column is that profile's per request.
    with shop.client() as c:
        r = c.get(
            "/api/v1/endpoints",
            params={"service": "contended", "profileType": GIL_WAIT, **window()},
        )
    again = {e["name"]: e for e in r.json()["endpoints"]}["GET /report"]
    assert again["gilWaitPerRequest"] == pytest.approx(again["perRequest"])


def test_endpoint_flamegraph_holds_its_requests_and_their_child_spans(shop: RunningServer) -> None:
    get_endpoints(shop)
    with shop.client() as c:
        r = c.get(
            "/api/v1/endpoints/flamegraph",
            params={"service": "shop", "name": "GET /checkout", **window()},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["requests"] == 3
        functions = function_totals(body["flamegraph"])
        assert functions.get("__main__.checkout", 0) > 0
        assert functions.get("__main__.charge_card", 0) > 0  # the child span "charge"
        assert "__main__.search_index" not in functions
        assert "__main__.startup" not in functions
        r = c.get(
            "/api/v1/endpoints/flamegraph",
            params={"service": "shop", "name": "GET /nosuch", **window()},
        )
        assert r.status_code == 200
        assert r.json()["requests"] == 0
        assert int(r.json()["flamegraph"].get("total", 0)) == 0


# One service as two versions side by side (the agent's `version` tag): v2 prices three times
# slower, and one of its requests fails.
VERSIONED = traced_program(
    "pricing",
    """
    version = sys.argv[2]
    kept = []
    for i in range(4):
        with tracer.start_as_current_span("GET /price") as span:
            burn(0.05 if version == "v1" else 0.15)
            kept.append([bytes(1000) for _ in range(2000)])  # ~2 MB a request
            if version == "v2" and i == 0:
                span.set_status(trace.Status(trace.StatusCode.ERROR, "timeout"))
    time.sleep(1.5)
    """,
    tags='{"version": sys.argv[2]}',
    agent="alloc_sample_bytes=64 * 1024",
)


def test_endpoints_split_by_a_label_of_the_profiles(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with running_server(tmp_path_factory.mktemp("split") / "data") as srv:
        run_programs(VERSIONED, tmp_path_factory.mktemp("prog"), [srv.url, "v1"], [srv.url, "v2"])
        deadline = time.monotonic() + 20
        with srv.client() as c:
            while True:
                r = c.get(
                    "/api/v1/endpoints", params={"service": "pricing", "by": "version", **window()}
                )
                assert r.status_code == 200, r.text
                body = r.json()
                groups = {g["value"]: g["endpoints"] for g in body["groups"]}
                done = sum(e["requests"] for g in groups.values() for e in g) == 8
                if done and None not in groups or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
            bad = c.get("/api/v1/endpoints", params={"service": "pricing", "by": "x" * 2000})
            assert bad.status_code == 400
    assert body["by"] == "version"
    assert set(groups) == {"v1", "v2"}, groups
    (v1,), (v2,) = groups["v1"], groups["v2"]
    assert (v1["name"], v1["requests"], v1["errors"]) == ("GET /price", 4, 0)
    assert (v2["name"], v2["requests"], v2["errors"]) == ("GET /price", 4, 1)
    # 0.15 s against 0.05 s of CPU per request.
    assert v2["perRequest"] > 2 * v1["perRequest"], (v1, v2)
    assert v2["latencyNanos"]["p50"] > v1["latencyNanos"]["p50"]
    # Together they are the endpoint of the whole service.
    (whole,) = body["endpoints"]
    assert whole["requests"] == 8 and whole["total"] == v1["total"] + v2["total"]
    # Beside the profile shown, CPU and allocations per request (~2 MB each).
    assert whole["cpuPerRequest"] == pytest.approx(whole["perRequest"])
    assert 0.5e6 < whole["allocPerRequest"] < 8e6, whole


def test_endpoints_of_another_tenant_or_service_are_empty(shop: RunningServer) -> None:
    get_endpoints(shop)
    with shop.client(headers={"X-Scope-OrgID": "other"}) as c:
        body = c.get("/api/v1/endpoints", params={"service": "shop", **window()}).json()
        assert body["endpoints"] == [] and body["total"] == 0
        graph = c.get(
            "/api/v1/endpoints/flamegraph",
            params={"service": "shop", "name": "GET /checkout", **window()},
        ).json()
        assert graph["requests"] == 0
    with shop.client() as c:
        body = c.get("/api/v1/endpoints", params={"service": "nosuch", **window()}).json()
        assert body["endpoints"] == [] and body["total"] == 0


@pytest.mark.parametrize(
    "path, params, fragment",
    [
        ("/api/v1/endpoints", {}, "service is required"),
        (
            "/api/v1/endpoints",
            {"service": "shop", "profileType": "nope"},
            "profile type 'nope' is not name:sample_type",
        ),
        ("/api/v1/endpoints", {"service": "shop", "start": "soon"}, "start"),
        ("/api/v1/endpoints", {"service": "shop", "start": "2000", "end": "1000"}, "range"),
        (
            "/api/v1/endpoints",
            {"service": "shop", "start": "1764150000000", "end": "1764153600000"},
            "(milliseconds?)",
        ),
        ("/api/v1/traces/profiled", {"traceID": "a" * 32, "start": "-5", "end": "10"}, "seconds"),
        ("/api/v1/endpoints/flamegraph", {"service": "shop"}, "name is required"),
        ("/api/v1/endpoints/flamegraph", {"service": "shop", "name": "x" * 1001}, "longer"),
        ("/api/v1/endpoints/flamegraph", {"name": "GET /x"}, "service is required"),
    ],
)
def test_bad_parameters_are_400(
    shop: RunningServer, path: str, params: dict, fragment: str
) -> None:
    with shop.client() as c:
        r = c.get(path, params=params)
    assert r.status_code == 400
    assert fragment in r.text


def test_bad_tenant_is_400(shop: RunningServer) -> None:
    with shop.client(headers={"X-Scope-OrgID": "a/b"}) as c:
        r = c.get("/api/v1/endpoints", params={"service": "shop"})
    assert r.status_code == 400


def info(span: int, parent: int, service: str, name: str = "x") -> SpanRecord:
    (record,) = SpanRecord.outlines([("t" * 32, span, parent, name, service, 0, 1, 0)])
    return record


def test_local_roots_follow_parents_within_the_service_only() -> None:
    # api:1 -> api:2 -> db:3 -> api:4 -> api:5; api:6's parent 99 is unknown.
    spans = [
        info(1, 0, "api"),
        info(2, 1, "api"),
        info(3, 2, "db"),
        info(4, 3, "api"),
        info(5, 4, "api"),
        info(6, 99, "api"),
        info(7, 7, "api"),  # its own parent: bad data must not loop
    ]
    assert local_roots(spans, "api") == {1: 1, 2: 1, 4: 4, 5: 4, 6: 6, 7: 7}
    assert local_roots(spans, "db") == {3: 3}


def test_profiled_traces_api(shop: RunningServer) -> None:
    get_endpoints(shop)
    now = int(time.time())
    with shop.client() as c:
        found = c.get(
            "/api/search",
            params={"q": '{name="GET /checkout"}', "start": now - 600, "end": now + 60},
        ).json()["traces"]
        health = c.get(
            "/api/search",
            params={"q": '{name="GET /health"}', "start": now - 600, "end": now + 60},
        ).json()["traces"]
        ids = [t["traceID"] for t in found + health]
        assert len(ids) == 11
        r = c.get(
            "/api/v1/traces/profiled",
            params={"traceID": ids, "start": now - 600, "end": now + 60},
        )
        assert r.status_code == 200, r.text
        totals = r.json()["traces"]
        # Every checkout holds its 0.18 s of CPU; a health check sleeps: it holds at most a
        # sample or two taken while its span started (on a loaded machine).
        for t in found:
            assert totals[t["traceID"]] >= 0.1 * SEC
        assert all(totals.get(t["traceID"], 0) <= 0.03 * SEC for t in health), totals
        r = c.get(
            "/api/v1/traces/profiled",
            params={"traceID": ",".join(ids), "start": now - 600, "end": now + 60},
        )
        assert r.json()["traces"] == totals
        # Short ids are padded as Tempo pads them; other tenants see nothing.
        short = ids[0].lstrip("0")
        r = c.get(
            "/api/v1/traces/profiled",
            params={"traceID": short, "start": now - 600, "end": now + 60},
        )
        assert list(r.json()["traces"]) == [ids[0]]
        other = c.get(
            "/api/v1/traces/profiled",
            params={"traceID": ids, "start": now - 600, "end": now + 60},
            headers={"X-Scope-OrgID": "other"},
        ).json()
        assert other["traces"] == {}
        for params, fragment in [
            ({"start": now - 600, "end": now}, "traceID"),
            ({"traceID": "xyz", "start": now - 600, "end": now}, "hex"),
            ({"traceID": ids[0]}, "start and end"),
            ({"traceID": ids[0], "start": now, "end": now - 5}, "after"),
            ({"traceID": ["a"] * 1001, "start": now - 600, "end": now}, "at most"),
        ]:
            r = c.get("/api/v1/traces/profiled", params=params)
            assert r.status_code == 400, params
            assert fragment in r.text
