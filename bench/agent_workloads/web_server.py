"""A web service under load: Starlette on uvicorn, taking requests from another process.

``serve`` runs ``uvicorn.Server`` in the main thread (uvicorn's defaults: uvloop and
httptools where installed) on a listening socket bound to 127.0.0.1 in the setup, for a fixed
``seconds``; the async endpoint renders an HTML table in pure Python
(``_harness.render_page``, ~0.5 ms of CPU, sized by ``_harness.calibrate_server``) for every
request.  The load comes from ``bench/loadgen.py``, a separate process started in the setup
(``_harness.http_load``: before any profiler starts, and not profiled): 8 keep-alive
connections, one request in flight each, as fast as the server answers, until the server
closes them (bounded by ``seconds`` + 15 s in any case).

The work time is fixed, so the unit of work is one request: ``units`` = requests served,
and the bench's slowdown is time per request (the inverse of requests/s) against the
no-profiler run.  The server's main thread has all the CPU of the work (uvicorn, Starlette
and the endpoint); the load generator shares the machine's two CPUs with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator, Dict, List

# Imported here, before the profiler starts and outside the timed window, as a service has
# them imported long before its traffic comes.
import _harness
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

_served = 0


def _app(rows: int, seconds: float, server: List[uvicorn.Server]) -> Starlette:
    async def page(request: Request) -> HTMLResponse:
        global _served
        body = _harness.render_page(rows, int(request.query_params.get("page", "0")))
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


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    t0 = time.perf_counter()
    served = serve(params)
    return {**_harness.served(served, time.perf_counter() - t0), "work_function": "serve"}


if __name__ == "__main__":
    _harness.main(_harness.calibrate_server, work, _harness.http_load)
