"""A web service under load: Starlette on uvicorn, taking requests from another process.

``serve`` runs ``uvicorn.Server`` in the main thread (uvicorn's defaults: uvloop and
httptools where installed) on a listening socket bound to 127.0.0.1 in the setup, for a fixed
``seconds``; the async endpoint renders an HTML table in pure Python (``render_page``, ~0.5 ms
of CPU, sized by ``calibrate``) for every request.  The load comes from ``bench/loadgen.py``,
a separate process started in the setup (before any profiler starts, and not profiled):
8 keep-alive connections, one request in flight each, as fast as the server answers, until
the server closes them (bounded by ``seconds`` + 15 s in any case).

The work time is fixed, so the unit of work is one request: ``units`` = requests served,
and the bench's slowdown is time per request (the inverse of requests/s) against the
no-profiler run.  The server's main thread has all the CPU of the work (uvicorn, Starlette
and the endpoint); the load generator shares the machine's two CPUs with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, AsyncIterator, Dict, Iterator, List

# Imported here, before the profiler starts and outside the timed window, as a service has
# them imported long before its traffic comes.
import _harness
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

RENDER_MS = 0.5
CONNECTIONS = 8
PAGES = 64  # distinct request paths, so that no layer can answer from a cache
LOADGEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "loadgen.py")

_served = 0


def render_page(rows: int, page: int) -> str:
    parts = ["<table><tr><th>#</th><th>item</th><th>price</th></tr>"]
    for i in range(rows):
        code = (page * 7919 + i * 31) & 0xFFFF
        parts.append(f"<tr><td>{i}</td><td>item-{code:05d}</td><td>{code / 7:.2f}</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def _app(rows: int, seconds: float, server: List[uvicorn.Server]) -> Starlette:
    async def page(request: Request) -> HTMLResponse:
        global _served
        body = render_page(rows, int(request.query_params.get("page", "0")))
        _served += 1
        return HTMLResponse(body)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        # The fixed window starts when the server is up; uvicorn checks should_exit every
        # 0.1 s, then closes the connections after the requests in flight.
        loop = asyncio.get_running_loop()
        loop.call_later(seconds, setattr, server[0], "should_exit", True)
        yield

    return Starlette(routes=[Route("/page", page)], lifespan=lifespan)


def serve(params: Dict[str, Any]) -> int:
    holder: List[uvicorn.Server] = []
    app = _app(params["rows"], params["seconds"], holder)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
    holder.append(uvicorn.Server(config))
    holder[0].run(sockets=[params["listener"]])
    return _served


@contextlib.contextmanager
def load(params: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """A listening socket and the load generator already connecting to it."""
    requests = [
        (f"GET /page?page={i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(), 0, 0)
        for i in range(PAGES)
    ]
    listener = socket.create_server(("127.0.0.1", 0), backlog=CONNECTIONS * 2)
    fd, path = tempfile.mkstemp(prefix="hotspan-bench-web-", suffix=".pickle")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(requests, f)
    cmd = [
        sys.executable,
        LOADGEN,
        "--port",
        str(listener.getsockname()[1]),
        "--requests",
        path,
        "--concurrency",
        str(CONNECTIONS),
        "--warmup",
        "0",
        "--duration",
        str(params["seconds"] + 15),
    ]
    gen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        # "measure-start" comes once its connections are being opened: they complete in the
        # listen backlog, and their first requests wait there until uvicorn accepts them.
        assert gen.stdout is not None
        gen.stdout.readline()
        yield {**params, "listener": listener}
    finally:
        gen.terminate()
        gen.wait(30)
        listener.close()
        os.unlink(path)


def calibrate(seconds: float, render_ms: float = RENDER_MS) -> Dict[str, Any]:
    rows = 200
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        for page in range(20):
            render_page(rows, page)
        best = min(best, (time.thread_time() - t0) / 20)
    return {"seconds": seconds, "rows": max(1, int(rows * render_ms / 1000 / best))}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    t0 = time.perf_counter()
    served = serve(params)
    elapsed = time.perf_counter() - t0
    return {
        "requests": served,
        "requests_per_s": served / elapsed if elapsed else 0.0,
        "units": served,
        "work_function": "serve",
    }


if __name__ == "__main__":
    _harness.main(calibrate, work, load)
