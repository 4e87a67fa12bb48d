"""Profiling what matters: a real Starlette app under uvicorn, traced with the real
OpenTelemetry SDK, serving fast, slow and failing requests under load; its profiles on a real
server are labelled by the condition each request met, and with conditional_only only those
remain."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Dict

import httpx
import pytest

from hotspan._speedups import load_sampler
from tests.helpers import QUERIER, flamegraph, free_port, function_totals

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"

APP = """
import sys, time
import hotspan
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("app")
hotspan.configure(application_name=sys.argv[2], server_address=sys.argv[3], upload_interval=1,
                  max_overhead=100, slow_request_threshold=0.05, error_condition=True,
                  conditional_only=sys.argv[4] == "1")

def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def fast_handler():
    burn(0.003)

def slow_query():
    burn(0.02)

def slow_handler():
    burn(0.03)
    with tracer.start_as_current_span("db.query"):
        slow_query()

def failing_handler():
    burn(0.005)
    raise ValueError("no such thing")

HANDLERS = {"fast": fast_handler, "slow": slow_handler, "fail": failing_handler}

async def route(request):
    kind = request.path_params["kind"]
    with tracer.start_as_current_span("GET /" + kind) as span:
        try:
            HANDLERS[kind]()
        except ValueError as exc:
            span.set_status(Status(StatusCode.ERROR, str(exc)))
            return PlainTextResponse("failed", status_code=500)
    return PlainTextResponse("ok")

app = Starlette(routes=[Route("/{kind}", route)])

if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

pytestmark = pytest.mark.skipif(
    load_sampler() is None,
    reason="per-request labels under asyncio need the native sampler (docs/agent.md)",
)


def serve_and_load(tmp_path: Path, server_url: str, service: str, conditional_only: bool) -> None:
    script = tmp_path / f"{service}.py"
    script.write_text(textwrap.dedent(APP))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), service, server_url, str(int(conditional_only))],
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=url, timeout=30) as client:
            while True:
                try:
                    client.get("/fast")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.1)
            # Mostly fast requests, as a service has: a tenth slow, a tenth failing.
            for i in range(300):
                kind = "slow" if i % 10 == 3 else "fail" if i % 10 == 7 else "fast"
                assert client.get(f"/{kind}").status_code == (500 if kind == "fail" else 200)
    finally:
        proc.send_signal(signal.SIGINT)  # uvicorn stops; the agent's exit flush sends the rest
        assert proc.wait(30) == 0


def by_condition(client: httpx.Client, service: str, condition: str = "") -> Dict[str, int]:
    now = int(time.time())
    matcher = f', hotspan_condition="{condition}"' if condition else ""
    graph = flamegraph(client, f'{{service_name="{service}"{matcher}}}', now - 300, now + 60, CPU)
    return function_totals(graph)


def condition_values(client: httpx.Client, service: str) -> list:
    now = int(time.time())
    r = client.post(
        f"{QUERIER}/LabelValues",
        json={
            "name": "hotspan_condition",
            "matchers": [f'{{service_name="{service}"}}'],
            "start": (now - 300) * 1000,
            "end": (now + 60) * 1000,
        },
    )
    assert r.status_code == 200, r.text
    return sorted(r.json().get("names", []))


def test_slow_and_failing_requests_are_labelled(module_server, tmp_path: Path) -> None:
    service = f"cond_{uuid.uuid4().hex[:6]}"
    serve_and_load(tmp_path, module_server.url, service, conditional_only=False)
    with module_server.client() as client:
        assert condition_values(client, service) == ["error", "slow"]
        everything = by_condition(client, service)
        slow = by_condition(client, service, "slow")
        error = by_condition(client, service, "error")
    # 30 slow requests of 50 ms CPU each, the query's 20 ms inside a child span included.
    assert slow.get("__main__.slow_handler", 0) > 0.8 * everything["__main__.slow_handler"]
    assert slow.get("__main__.slow_query", 0) > 0.8 * everything["__main__.slow_query"]
    assert "__main__.fast_handler" not in slow and "__main__.failing_handler" not in slow
    assert error.get("__main__.failing_handler", 0) > 0.8 * everything["__main__.failing_handler"]
    assert "__main__.slow_handler" not in error
    # Normal requests stay, without the label.
    assert everything.get("__main__.fast_handler", 0) > 0


def test_conditional_only_keeps_only_the_requests_that_matter(
    module_server, tmp_path: Path
) -> None:
    service = f"condonly_{uuid.uuid4().hex[:6]}"
    serve_and_load(tmp_path, module_server.url, service, conditional_only=True)
    with module_server.client() as client:
        everything = by_condition(client, service)
    assert everything.get("__main__.slow_handler", 0) > 0
    assert everything.get("__main__.slow_query", 0) > 0
    assert everything.get("__main__.failing_handler", 0) > 0
    assert "__main__.fast_handler" not in everything
