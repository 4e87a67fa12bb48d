"""Profiling what matters: a real Starlette app under uvicorn, traced with the real
OpenTelemetry SDK, serving fast, slow and failing requests under load; its profiles on a real
server are labelled by the condition each request met, and with conditional_only only those
remain.  A fast request the host's load stretched past the threshold is slow as the agent
judges it, so the app names those spans and the tests allow for them alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Dict, List, Sequence

import httpx
import pytest

from hotspan._speedups import load_sampler
from tests.helpers import QUERIER, TLS, flamegraph, free_port, function_totals

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
FAST = "__main__.fast_handler"

APP = """
import sys, time
import hotspan
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

SLOW_S = 0.05

# Fast requests a loaded host stretched past the threshold: slow, by the SDK's clock.
class NameSlowFastSpans:
    def __init__(self, path):
        self.out = open(path, "a")

    def on_start(self, span, parent_context=None):
        pass

    def _on_ending(self, span):
        pass

    def on_end(self, span):
        if span.name == "GET /fast" and span.end_time - span.start_time >= SLOW_S * 1e9:
            self.out.write(format(span.context.span_id, "016x") + "\\n")
            self.out.flush()

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True

provider = TracerProvider()
provider.add_span_processor(NameSlowFastSpans(sys.argv[5]))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("app")
hotspan.configure(application_name=sys.argv[2], server_address=sys.argv[3], upload_interval=1,
                  max_overhead=100, slow_request_threshold=SLOW_S, error_condition=True,
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


def serve_and_load(
    tmp_path: Path, server_url: str, service: str, conditional_only: bool
) -> List[str]:
    """Serves and loads the app; the span ids of the fast requests that were slow."""
    script = tmp_path / f"{service}.py"
    script.write_text(textwrap.dedent(APP))
    slow_fast = tmp_path / f"{service}.slow_fast"  # made by the app as it starts
    port = free_port()
    argv = [str(port), service, server_url, str(int(conditional_only)), str(slow_fast)]
    proc = subprocess.Popen(
        [sys.executable, str(script), *argv], env={**os.environ, "PYTHONFAULTHANDLER": "1"}
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=url, timeout=30, verify=TLS) as client:
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
    return slow_fast.read_text().split()


def by_condition(
    client: httpx.Client, service: str, condition: str = "", spans: Sequence[str] = ()
) -> Dict[str, int]:
    """Functions' CPU in the service's profiles, of one condition, or of some spans."""
    now = int(time.time())
    matcher = f', hotspan_condition="{condition}"' if condition else ""
    selector = f'{{service_name="{service}"{matcher}}}'
    extra = {"spanSelector": list(spans)} if spans else {}
    return function_totals(flamegraph(client, selector, now - 300, now + 60, CPU, **extra))


def fast_handler_in(client: httpx.Client, service: str, spans: Sequence[str]) -> int:
    """The fast handler's CPU in the fast requests that were slow."""
    return by_condition(client, service, spans=spans).get(FAST, 0) if spans else 0


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
    slow_fast = serve_and_load(tmp_path, module_server.url, service, conditional_only=False)
    with module_server.client() as client:
        assert condition_values(client, service) == ["error", "slow"]
        everything = by_condition(client, service)
        slow = by_condition(client, service, "slow")
        error = by_condition(client, service, "error")
        excused = fast_handler_in(client, service, slow_fast)
    # 30 slow requests of 50 ms CPU each, the query's 20 ms inside a child span included.
    assert slow.get("__main__.slow_handler", 0) > 0.8 * everything["__main__.slow_handler"]
    assert slow.get("__main__.slow_query", 0) > 0.8 * everything["__main__.slow_query"]
    assert slow.get(FAST, 0) == excused, slow_fast
    assert "__main__.failing_handler" not in slow
    assert error.get("__main__.failing_handler", 0) > 0.8 * everything["__main__.failing_handler"]
    assert "__main__.slow_handler" not in error
    # Normal requests stay, without the label.
    assert everything.get(FAST, 0) > excused


def test_conditional_only_keeps_only_the_requests_that_matter(
    module_server, tmp_path: Path
) -> None:
    service = f"condonly_{uuid.uuid4().hex[:6]}"
    slow_fast = serve_and_load(tmp_path, module_server.url, service, conditional_only=True)
    with module_server.client() as client:
        everything = by_condition(client, service)
        excused = fast_handler_in(client, service, slow_fast)
    assert everything.get("__main__.slow_handler", 0) > 0
    assert everything.get("__main__.slow_query", 0) > 0
    assert everything.get("__main__.failing_handler", 0) > 0
    assert everything.get(FAST, 0) == excused, slow_fast
