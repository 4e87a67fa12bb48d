"""Samples labelled with a span id and no trace id, as Pyroscope's SDKs send them (Go's
otel-profiling, Java's, .NET's: ``span_id`` and ``span_name`` only): hotspan's trace views
find them through the trace's stored spans.  Spans come from the OpenTelemetry SDK over
OTLP/HTTP, the profile as a Go service would push it, to a real server."""

from __future__ import annotations

import time
from typing import Dict, Iterator, NamedTuple

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.conftest import RunningServer, running_server
from tests.helpers import CPU, function_totals, ingest_pprof, make_pprof

MS = 10**6


class Shop(NamedTuple):
    srv: RunningServer
    trace: str
    root: str
    child: str
    other_trace: str
    start_s: int


def _span_ids(srv: RunningServer) -> Dict[str, str]:
    provider = TracerProvider(resource=Resource.create({"service.name": "goshop"}))
    exporter = OTLPSpanExporter(endpoint=srv.url + "/v1/traces", timeout=10)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    ids: Dict[str, str] = {}
    with (
        tracer.start_as_current_span("GET /checkout") as root,
        tracer.start_as_current_span("charge") as child,
    ):
        pass
    with tracer.start_as_current_span("GET /other") as other:
        pass
    provider.shutdown()
    for key, span in (("root", root), ("child", child), ("other", other)):
        ctx = span.get_span_context()
        ids[key] = format(ctx.span_id, "016x")
        ids[key + "_trace"] = format(ctx.trace_id, "032x")
    return ids


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    with running_server(tmp_path_factory.mktemp("span-only") / "data") as srv:
        ids = _span_ids(srv)
        start_s = int(time.time()) - 5
        samples = [
            # As Go's otel-profiling labels them: the span's id and name, no trace.
            (["main.checkout", "main.main"], 300 * MS, {"span_id": ids["root"]}),
            (["main.charge", "main.main"], 700 * MS, {"span_id": ids["child"]}),
            (["main.other", "main.main"], 100 * MS, {"span_id": ids["other"]}),
            (["main.idle", "main.main"], 50 * MS, {}),
            # As hotspan's agent labels them: the span and its trace (not counted twice).
            (
                ["main.checkout_traced", "main.main"],
                20 * MS,
                {"span_id": ids["root"], "trace_id": ids["root_trace"]},
            ),
        ]
        for _, _, labels in samples:
            if "span_id" in labels and "trace_id" not in labels:
                labels["span_name"] = "GET /checkout"
        body = make_pprof(samples, time_ns=start_s * 10**9)
        with srv.client() as c:
            r = ingest_pprof(c, "goshop{}", body, start_s)
            assert r.status_code == 200, r.text
        yield Shop(srv, ids["root_trace"], ids["root"], ids["child"], ids["other_trace"], start_s)


def _get(srv: RunningServer, path: str, **params: object) -> dict:
    with srv.client() as c:
        r: httpx.Response = c.get(path, params={"profileType": CPU, **params})
    assert r.status_code == 200, r.text
    return r.json()


def test_span_cpu_of_a_trace_whose_samples_carry_only_span_ids(shop: Shop) -> None:
    got = _get(shop.srv, f"/api/traces/{shop.trace}/spans")
    by_name = {s["name"]: (s["self"], s["total"]) for s in got["spans"]}
    assert by_name == {
        "GET /checkout": (320 * MS, 1020 * MS),
        "charge": (700 * MS, 700 * MS),
    }
    assert got["total"] == 1020 * MS
    assert got["unattributed"] == 0


def test_trace_and_span_flame_graphs(shop: Shop) -> None:
    whole = function_totals(_get(shop.srv, f"/api/traces/{shop.trace}/profile")["flamegraph"])
    assert whole.get("main.checkout") == 300 * MS
    assert whole.get("main.charge") == 700 * MS
    assert whole.get("main.checkout_traced") == 20 * MS
    assert "main.other" not in whole and "main.idle" not in whole
    root = _get(shop.srv, f"/api/traces/{shop.trace}/profile", spanID=shop.root)
    assert "main.charge" not in function_totals(root["flamegraph"])
    below = _get(
        shop.srv, f"/api/traces/{shop.trace}/profile", spanID=shop.root, descendants="true"
    )
    assert function_totals(below["flamegraph"]).get("main.charge") == 700 * MS


def test_trace_list_totals(shop: Shop) -> None:
    got = _get(
        shop.srv,
        "/api/v1/traces/profiled",
        traceID=f"{shop.trace},{shop.other_trace},{'0' * 31}1",
        start=shop.start_s - 60,
        end=shop.start_s + 60,
    )
    assert got["traces"] == {shop.trace: 1020 * MS, shop.other_trace: 100 * MS}
