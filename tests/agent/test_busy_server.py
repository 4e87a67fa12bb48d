"""The agent in a Starlette app under uvicorn taking requests as fast as a client in another
process sends them, five runs of 6 s, profiled at 100 Hz, pushing to a real server: each run
must store the CPU its threads really used and the main thread's wall time (within 5%), and
put render()'s CPU under the traces of the requests that ran it, each trace its true share.
The checks and the programs' shared parts are test_busy.py's (the busy loops); the server runs
are a module of their own so that the timing tests' two workers share the work evenly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import List

import pytest

from tests.agent.test_agent import OTEL, PRELUDE, totals
from tests.agent.test_busy import (
    BUSY_PRELUDE,
    FINISH,
    REPETITIONS,
    TOLERANCE,
    agent_line,
    busy_profile,
    check_run,
    native_only,
)
from tests.helpers import flamegraph

WORK_SECONDS = 6

TRACES = 4  # one trace id per client connection, as a load test run under a trace sends

WEB_SERVER = """
import json as _json
import uvicorn
from opentelemetry.propagate import extract
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

render_cpu = {{}}  # trace id -> CPU spent in render() under that trace's requests

def render(n):
    return _json.dumps([{{"id": i, "name": "item-%d" % i, "price": i * 1.5}} for i in range(n)])

async def items(request):
    start = time.thread_time()
    body = render(60)
    trace_id = format(trace.get_current_span().get_span_context().trace_id, "032x")
    render_cpu[trace_id] = render_cpu.get(trace_id, 0.0) + time.thread_time() - start
    return Response(body, media_type="application/json")

class SpanPerRequest:
    # What an OpenTelemetry ASGI instrumentation does: a server span per request, child of
    # the caller's traceparent, current while the request is handled.
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        carrier = {{k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}}
        with tracer.start_as_current_span("GET " + scope["path"], context=extract(carrier)):
            await self.app(scope, receive, send)

app = SpanPerRequest(Starlette(routes=[Route("/items", items)]))
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(128)
print("PORT", listener.getsockname()[1], flush=True)
config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
server = uvicorn.Server(config)

def stop_later():
    time.sleep({seconds})
    server.should_exit = True

threading.Thread(target=stop_later, daemon=True).start()
server.run(sockets=[listener])
result = dict(render_cpu=render_cpu)
"""

# The load: one keep-alive connection per trace, each in a thread, requests back to back.
CLIENT = """
import socket, sys, threading, time
port, seconds, traces = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3].split(",")
counts = [0] * len(traces)

def load(i):
    request = (
        "GET /items HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n"
        f"traceparent: 00-{traces[i]}-{i + 1:016x}-01\\r\\n\\r\\n"
    ).encode()
    conn = socket.create_connection(("127.0.0.1", port))
    end = time.monotonic() + seconds
    buffer = b""

    def more():
        # The server stops on its own clock (it may close before our end): that ends the
        # run, rather than a recv loop that spins on b"" forever.
        chunk = conn.recv(65536)
        if not chunk:
            raise EOFError
        return chunk

    try:
        while time.monotonic() < end:
            conn.sendall(request)
            while b"\\r\\n\\r\\n" not in buffer:
                buffer += more()
            head, _, buffer = buffer.partition(b"\\r\\n\\r\\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\\r\\n")[0])
            while len(buffer) < length:
                buffer += more()
            buffer = buffer[length:]
            counts[i] += 1
    except (EOFError, ConnectionResetError, BrokenPipeError):
        print("closed early", i, time.monotonic() - end, file=sys.stderr, flush=True)
    conn.close()

threads = [threading.Thread(target=load, args=(i,)) for i in range(len(traces))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("REQUESTS", sum(counts), flush=True)
"""


def run_web_server(tmp_path: Path, service: str, url: str, trace_ids: List[str]) -> dict:
    """The app in one process, the client in another, started once the app listens."""
    script = tmp_path / "app.py"
    script.write_text(
        PRELUDE
        + OTEL
        + BUSY_PRELUDE
        + agent_line(url, service)
        + WEB_SERVER.format(seconds=WORK_SECONDS)
        + FINISH
    )
    client = tmp_path / "client.py"
    client.write_text(textwrap.dedent(CLIENT))
    # A crash prints every thread's Python stack (faulthandler) into the assertion below.
    app = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    try:
        assert app.stdout is not None
        line = app.stdout.readline()
        assert line.startswith("PORT "), line + (app.stderr.read() if app.stderr else "")
        port = line.split()[1]
        load = subprocess.run(
            [sys.executable, str(client), port, str(WORK_SECONDS - 1), ",".join(trace_ids)],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("HOTSPAN_")},
        )
        out, err = app.communicate(timeout=60)
        assert load.returncode == 0, (load.stderr, app.returncode, err[-3000:])
    finally:
        if app.poll() is None:
            app.kill()
            app.communicate()
    assert app.returncode == 0, (app.returncode, err[-6000:])
    result = json.loads(next(x for x in out.splitlines() if x.startswith("RESULT "))[7:])
    result["requests"] = int(load.stdout.split()[-1])
    return result


@native_only
@pytest.mark.parametrize("run", range(REPETITIONS))
def test_busy_web_server(module_server, tmp_path: Path, run: int) -> None:
    service = f"busy_web_{uuid.uuid4().hex[:6]}"
    trace_ids = [uuid.uuid4().hex for _ in range(TRACES)]
    result = run_web_server(tmp_path, service, module_server.url, trace_ids)
    assert result["requests"] > 1000, result  # it was busy
    check_run(module_server, service, result, run)
    # Span labels: render() runs only inside request spans, so all of its CPU is under the
    # load's traces, and each trace (one connection's requests, interleaved with the others'
    # on one event loop) gets its own share: about a quarter, sampling noise allowing.
    whole = busy_profile(module_server, service).get("__main__.render", 0)
    now = int(time.time())
    per_trace = {}
    with module_server.client() as client:
        for trace_id in trace_ids:
            graph = flamegraph(
                client,
                f'{{service_name="{service}"}}',
                now - 600,
                now + 60,
                traceIdSelector=[trace_id],
            )
            per_trace[trace_id] = totals(graph).get("__main__.render", 0)
    labelled = sum(per_trace.values())
    assert whole > 0 and labelled / whole >= 1 - TOLERANCE, (
        f"run {run}: render() CPU under the load's traces {labelled / 1e9:.3f} s "
        f"of {whole / 1e9:.3f} s"
    )
    # Each trace's share of the samples against its share of render()'s CPU by the program's
    # own clocks.  Sampling alone spreads a share by sqrt(p(1-p)/n) over n samples: a machine
    # busy with other work leaves the program fewer samples, hence the bound's floor at four
    # of those (a bias, such as samples charged to the task that runs next, is larger).
    real = result["render_cpu"]
    samples = labelled / 1e7  # 100 Hz: a sample is 10 ms of CPU
    for trace_id, value in per_trace.items():
        share, true_share = value / labelled, real[trace_id] / sum(real.values())
        spread = (true_share * (1 - true_share) / max(samples, 1)) ** 0.5
        assert abs(share - true_share) < max(0.1, 4 * spread), (
            run,
            trace_id,
            share,
            true_share,
            samples,
        )
