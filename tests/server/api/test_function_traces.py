"""The traces where a function is hot (``/api/v1/function/traces``), against a real server fed
by a real traced program: the OpenTelemetry SDK's spans and the hotspan agent's samples."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import CPU, run_programs
from tests.server.api.test_endpoints import PROGRAM

SEC = 10**9
SELECTOR = '{service_name="shop"}'


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("function-traces") / "data") as srv:
        run_programs(PROGRAM, tmp_path_factory.mktemp("prog"), [srv.url])
        yield srv


def hot(srv: RunningServer, function: str, traces: int = 0, **params) -> dict:  # type: ignore[no-untyped-def]
    """The answer, once it has samples of the function and ``traces`` traces (samples and
    spans are committed a moment after the program ends); whatever it is after 20 s."""
    now = int(time.time())
    query = {"query": SELECTOR, "function": function, "start": now - 600, "end": now + 60}
    query.update(params)
    deadline = time.monotonic() + 20
    with srv.client() as c:
        while True:
            r = c.get("/api/v1/function/traces", params=query)
            assert r.status_code == 200, r.text
            body = r.json()
            named = all(t["rootTraceName"] for t in body["traces"])
            if body["value"] and len(body["traces"]) >= traces and named:
                return body
            if time.monotonic() > deadline:
                return body
            time.sleep(0.3)


def test_a_function_leads_to_the_traces_that_ran_it(shop: RunningServer) -> None:
    # charge_card runs only inside checkout requests (0.06 s each, three of them).
    body = hot(shop, "__main__.charge_card", traces=3)
    assert body["profileType"] == CPU
    traces = body["traces"]
    assert len(traces) == 3, body
    assert {t["rootTraceName"] for t in traces} == {"GET /checkout"}
    assert {t["rootServiceName"] for t in traces} == {"shop"}
    values = [t["value"] for t in traces]
    assert values == sorted(values, reverse=True)
    for t in traces:
        # Its part of each checkout: 0.06 s of the 0.18 s.
        assert 0.02 * SEC <= t["value"] <= 0.12 * SEC, t
        assert t["value"] < t["traceTotal"], t
        assert t["durationNanos"] >= 0.15 * SEC, t
    assert body["inTraces"] == sum(values)
    assert body["value"] >= body["inTraces"]
    assert 0 < body["value"] < body["total"]


def test_a_function_outside_every_trace_has_none(shop: RunningServer) -> None:
    # startup() ran before any span: samples, but no trace.
    body = hot(shop, "__main__.startup")
    assert body["value"] > 0 and body["traces"] == [] and body["inTraces"] == 0
    with shop.client() as c:
        now = int(time.time())
        r = c.get(
            "/api/v1/function/traces",
            params={"query": SELECTOR, "function": "no.such", "start": now - 600, "end": now},
        )
        assert r.status_code == 200 and r.json()["value"] == 0, r.text


def test_limit_and_bad_input(shop: RunningServer) -> None:
    assert len(hot(shop, "__main__.burn", traces=2, limit="2")["traces"]) == 2
    with shop.client() as c:
        for params in (
            {},
            {"function": "x" * 3000},
            {"function": "f", "query": "{service_name="},
            {"function": "f", "limit": "0"},
            {"function": "f", "limit": "many"},
            {"function": "f", "start": "200", "end": "100"},
            {"function": "f", "profileType": "nonsense"},
        ):
            r = c.get("/api/v1/function/traces", params=params)
            assert r.status_code == 400, (params, r.status_code, r.text)
