"""Many short asyncio requests, each with nested OpenTelemetry SDK spans.

A request (``handle_request``) opens a ``request`` span and inside it ``parse`` (CPU),
``db`` (awaits, then CPU) and ``render`` (CPU) spans; 50 requests are in flight at a time, so
the event loop switches between tasks (and span contexts) at every ``await``.  The SDK's
``TracerProvider`` is installed globally with no exporter: the spans are created, recorded and
ended as in a service, but not sent anywhere.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Dict

import _harness

CONCURRENCY = 50
CPU_LOOPS = 150  # per parse/query/render step, ~20 us each


def parse(n: int) -> int:
    return _harness.spin(n)


def query(n: int) -> int:
    return _harness.spin(n)


def render(n: int) -> int:
    return _harness.spin(n)


async def handle_request(tracer: Any, i: int) -> int:
    with tracer.start_as_current_span("request", attributes={"request.id": i}):
        with tracer.start_as_current_span("parse"):
            x = parse(CPU_LOOPS)
        await asyncio.sleep(0)
        with tracer.start_as_current_span("db"):
            await asyncio.sleep(0)
            x += query(CPU_LOOPS)
        with tracer.start_as_current_span("render"):
            x += render(CPU_LOOPS)
        return x


async def serve(tracer: Any, requests: int) -> int:
    done = 0
    for lo in range(0, requests, CONCURRENCY):
        batch = range(lo, min(lo + CONCURRENCY, requests))
        await asyncio.gather(*(handle_request(tracer, i) for i in batch))
        done += len(batch)
    return done


def run_requests(requests: int) -> int:
    tracer = _harness.otel_tracer()
    return asyncio.run(serve(tracer, requests))


def calibrate(seconds: float) -> Dict[str, Any]:
    n = 2_000
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        run_requests(n)
        best = min(best, time.perf_counter() - t0)
    return {"requests": int(n * seconds / best)}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    done = run_requests(params["requests"])
    return {"requests": done, "work_function": "run_requests"}


if __name__ == "__main__":
    _harness.main(calibrate, work)
