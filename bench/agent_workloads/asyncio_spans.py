"""Many short asyncio requests, each with nested OpenTelemetry SDK spans.

A request (``handle_request``) opens a ``request`` span and inside it ``parse`` (CPU),
``db`` (awaits, then CPU) and ``render`` (CPU) spans; 50 requests are in flight at a time, so
the event loop switches between tasks (and span contexts) at every ``await``.  The SDK's
``TracerProvider`` is installed globally with no exporter: the spans are created, recorded and
ended as in a service, but not sent anywhere.

Truth for span linking, when the params ask for it (``"span_ids": true``, which the bench
adds in its defaults run): the ids of every request's ``parse``, ``db`` and ``render`` spans
and its trace id, kept in arrays as the requests run and written to a file after them
(``span_ids_file``: the span ids, then each trace id as two 64-bit halves, all unsigned 64-bit
native integers; the bench reads and removes it): a profiler that links samples to spans puts
the CPU of ``parse``, ``query`` and ``render`` under these spans.
"""

from __future__ import annotations

import array
import asyncio
import os
import tempfile
from typing import Any, Dict, Optional

import _harness

CONCURRENCY = 50
CPU_LOOPS = 150  # per parse/query/render step, ~20 us each


def parse(n: int) -> int:
    return _harness.spin(n)


def query(n: int) -> int:
    return _harness.spin(n)


def render(n: int) -> int:
    return _harness.spin(n)


class SpanIds:
    """The span ids of the requests' CPU steps and their trace ids (two halves each)."""

    def __init__(self) -> None:
        self.spans = array.array("Q")
        self.traces = array.array("Q")

    def add(self, request: Any, *steps: Any) -> None:
        self.spans.extend(s.get_span_context().span_id for s in steps)
        trace = request.get_span_context().trace_id
        self.traces.extend((trace >> 64, trace & 0xFFFFFFFFFFFFFFFF))

    def save(self) -> str:
        fd, path = tempfile.mkstemp(prefix="hotspan-bench-spans-", suffix=".bin")
        with os.fdopen(fd, "wb") as f:
            self.spans.tofile(f)
            self.traces.tofile(f)
        return path


async def handle_request(tracer: Any, i: int, ids: Optional[SpanIds] = None) -> int:
    with tracer.start_as_current_span("request", attributes={"request.id": i}) as request:
        with tracer.start_as_current_span("parse") as parse_span:
            x = parse(CPU_LOOPS)
        await asyncio.sleep(0)
        with tracer.start_as_current_span("db") as db_span:
            await asyncio.sleep(0)
            x += query(CPU_LOOPS)
        with tracer.start_as_current_span("render") as render_span:
            x += render(CPU_LOOPS)
        if ids is not None:
            ids.add(request, parse_span, db_span, render_span)
        return x


async def serve(tracer: Any, requests: int, ids: Optional[SpanIds] = None) -> int:
    done = 0
    for lo in range(0, requests, CONCURRENCY):
        batch = range(lo, min(lo + CONCURRENCY, requests))
        await asyncio.gather(*(handle_request(tracer, i, ids) for i in batch))
        done += len(batch)
    return done


def run_requests(requests: int, ids: Optional[SpanIds] = None) -> int:
    tracer = _harness.otel_tracer()
    return asyncio.run(serve(tracer, requests, ids))


def calibrate(seconds: float) -> Dict[str, Any]:
    return {"requests": _harness.scale_to(seconds, 2_000, run_requests)}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    ids = SpanIds() if params.get("span_ids") else None
    done = run_requests(params["requests"], ids)
    out: Dict[str, Any] = {
        "requests": done,
        "work_function": "run_requests",
        # A profiler that shows each task's stack under the task (ddtrace) has some of the
        # work in serve or handle_request without run_requests below.
        "work_functions": ["run_requests", "serve", "handle_request"],
    }
    if ids is not None:
        out.update(span_ids=len(ids.spans), span_ids_file=ids.save())
    return out


if __name__ == "__main__":
    _harness.main(calibrate, work)
