"""End to end, nothing faked: a program with the OpenTelemetry SDK (BatchSpanProcessor, OTLP
exporter to hotspan) and the hotspan agent, one endpoint slow because of one function.  The
slow span's profile shows that function on top; the fast spans' profiles do not; per span,
CPU sits beside duration; descendants and whole traces have their profiles too."""

from __future__ import annotations

import json
import time
from typing import Dict, Iterator, List

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import (
    CPU,
    QUERIER,
    function_totals,
    run_programs,
    self_totals,
    traced_program,
)

PROGRAM = traced_program(
    "shop",
    """
    # Each function burns CPU in its own loop, so that it is the leaf of its samples.
    def slow_function():
        end = time.thread_time() + 0.4
        while time.thread_time() < end:
            pass

    def render_page():
        end = time.thread_time() + 0.08
        while time.thread_time() < end:
            pass

    def fast_work():
        end = time.thread_time() + 0.004
        while time.thread_time() < end:
            pass

    out = {"slow": [], "fast": []}
    for i in range(3):
        with tracer.start_as_current_span("GET /slow") as span:
            slow_function()
            with tracer.start_as_current_span("render"):
                render_page()
            with tracer.start_as_current_span("wait") as wait:
                time.sleep(0.15)
        ids = span.get_span_context()
        out["slow"].append({
            "trace": format(ids.trace_id, "032x"), "span": format(ids.span_id, "016x"),
            "wait": format(wait.get_span_context().span_id, "016x"),
        })
        for _ in range(10):
            with tracer.start_as_current_span("GET /fast") as fast:
                fast_work()
            ctx = fast.get_span_context()
            out["fast"].append(
                {"trace": format(ctx.trace_id, "032x"), "span": format(ctx.span_id, "016x")}
            )
    print("IDS " + json.dumps(out))
    """,
)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    with running_server(tmp_path_factory.mktemp("spans") / "data") as srv:
        (out,) = run_programs(PROGRAM, tmp_path_factory.mktemp("prog"), [srv.url])
        line = next(ln for ln in out.splitlines() if ln.startswith("IDS "))
        yield srv, json.loads(line[4:])


def span_profile(srv: RunningServer, spans: List[str], descendants: bool = False) -> dict:
    now = int(time.time())
    with srv.client() as c:
        r = c.post(
            f"{QUERIER}/SelectMergeSpanProfile",
            json={
                "profileTypeID": CPU,
                "labelSelector": '{service_name="shop"}',
                "spanSelector": spans,
                "start": (now - 600) * 1000,
                "end": (now + 60) * 1000,
                "includeDescendants": descendants,
            },
        )
    assert r.status_code == 200, r.text
    return r.json().get("flamegraph", {})


def top_function(graph: dict) -> str:
    selfs = {n: v for n, v in self_totals(graph).items() if n.startswith("__main__.")}
    return max(selfs, key=lambda n: selfs[n])


def test_slow_span_profile_shows_the_slow_function_on_top(shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    for slow in ids["slow"]:
        graph = span_profile(srv, [slow["span"]])
        assert top_function(graph) == "__main__.slow_function", self_totals(graph)
        # The child spans' samples carry their own ids: not in the span's own profile.
        assert "__main__.render_page" not in function_totals(graph)
    fast = span_profile(srv, [f["span"] for f in ids["fast"]])
    totals = function_totals(fast)
    assert "__main__.slow_function" not in totals
    assert "__main__.render_page" not in totals


def test_descendants_and_whole_trace(shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = ids["slow"][0]
    with_children = function_totals(span_profile(srv, [slow["span"]], descendants=True))
    assert "__main__.slow_function" in with_children and "__main__.render_page" in with_children
    # render_page burns a fifth of slow_function's CPU: the graph keeps the proportion.
    ratio = with_children["__main__.render_page"] / with_children["__main__.slow_function"]
    assert 0.08 < ratio < 0.5, with_children
    with srv.client() as c:
        whole = c.get(f"/api/traces/{slow['trace']}/profile").json()
        assert whole["traceID"] == slow["trace"]
        names = set(whole["flamegraph"]["names"])
        assert {"__main__.slow_function", "__main__.render_page"} <= names
        assert "__main__.fast_work" not in names  # other traces' samples
        one = c.get(
            f"/api/traces/{slow['trace']}/profile",
            params={"spanID": slow["span"], "descendants": "true"},
        ).json()
        assert set(one["spans"]) >= {slow["span"], slow["wait"]}
        assert "__main__.render_page" in one["flamegraph"]["names"]
        pprof = c.get(f"/api/traces/{slow['trace']}/profile", params={"format": "pprof"})
        assert pprof.status_code == 200 and len(pprof.content) > 100


def test_each_span_shows_cpu_beside_duration(shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = ids["slow"][1]
    with srv.client() as c:
        body = c.get(f"/api/traces/{slow['trace']}/spans").json()
    rows: Dict[str, dict] = {r["name"]: r for r in body["spans"]}
    assert set(rows) == {"GET /slow", "render", "wait"}
    root, render, wait = rows["GET /slow"], rows["render"], rows["wait"]
    assert root["spanID"] == slow["span"] and render["parentSpanID"] == slow["span"]
    ms = 1_000_000
    # Burning: the root's own CPU is most of its slow_function's 400 ms.
    assert 300 * ms < root["self"] <= int(root["durationNanos"])
    assert 40 * ms < render["self"] < 160 * ms
    # Waiting: 150 ms asleep, (almost) no CPU.
    assert int(wait["durationNanos"]) >= 150 * ms and wait["self"] <= 20 * ms
    assert root["total"] == root["self"] + render["total"] + wait["total"]
    assert body["total"] >= root["total"]
    with srv.client() as c:
        assert c.get(f"/api/traces/{'0' * 31}1/spans").status_code == 404


def test_traces_are_searchable_by_endpoint(shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    with srv.client() as c:
        slow = c.get(
            "/api/search", params={"q": '{resource.service.name="shop" && name="GET /slow"}'}
        ).json()
        assert sorted(t["traceID"] for t in slow["traces"]) == sorted(
            s["trace"] for s in ids["slow"]
        )
        assert all(t["durationMs"] >= 600 for t in slow["traces"])
        long = c.get("/api/search", params={"tags": "service.name=shop", "minDuration": "500ms"})
        assert {t["traceID"] for t in long.json()["traces"]} == {s["trace"] for s in ids["slow"]}


def test_span_ids_are_validated(shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    with srv.client() as c:
        r = c.post(
            f"{QUERIER}/SelectMergeSpanProfile",
            json={"profileTypeID": CPU, "labelSelector": "{}", "spanSelector": ["xyz"]},
        )
        assert r.status_code == 400 and "16 hex digits" in r.json()["message"]
        r = c.get(f"/api/traces/{ids['slow'][0]['trace']}/profile", params={"spanID": "12"})
        assert r.status_code == 400 and "spanID" in r.text
        assert c.get("/api/traces/not-hex/profile").status_code == 400
