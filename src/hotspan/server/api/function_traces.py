"""``GET /api/v1/function/traces?query=&function=&profileType=&start=&end=&limit=``: the traces
where a function is hot (see :mod:`hotspan.query.function_traces`).

``query`` is a label selector (all series if empty), ``function`` a frame name as the flame
graph shows it, ``start``/``end`` unix seconds (the last hour by default), ``limit`` at most
100 traces (20 by default).
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.model.labels import SelectorError, parse_selector
from hotspan.query.function_traces import function_traces
from hotspan.server.errors import HTTPError, text_errors
from hotspan.server.params import profile_type, time_range
from hotspan.server.request import query_state

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
MAX_FUNCTION = 2000
MAX_LIMIT = 100
DEFAULT_RANGE_NS = 3600 * 10**9


@text_errors
async def hot_traces(request: Request) -> Response:
    state, tenant = query_state(request)
    params = request.query_params
    function = params.get("function") or ""
    if not function:
        raise HTTPError(400, "function is required: a frame name as the flame graph shows it")
    if len(function) > MAX_FUNCTION:
        raise HTTPError(400, f"function is longer than {MAX_FUNCTION} characters")
    try:
        selector = parse_selector(params.get("query") or "{}")
    except SelectorError as exc:
        raise HTTPError(400, f"bad query: {exc}") from None
    ptype = profile_type(params.get("profileType") or CPU)
    start, end = time_range(request, DEFAULT_RANGE_NS)
    try:
        limit = int(params.get("limit") or 20)
    except ValueError:
        raise HTTPError(400, "limit must be a whole number") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise HTTPError(400, f"limit must be between 1 and {MAX_LIMIT}")
    found = await run_in_threadpool(
        function_traces, state.engine, tenant, ptype, selector, function, start, end, limit
    )
    return JSONResponse(
        {
            "function": function,
            "profileType": ptype.id,
            "start": start // 10**9,
            "end": end // 10**9,
            "value": found.value,
            "inTraces": found.in_traces,
            "total": found.total,
            "traces": [
                {
                    "traceID": t.trace_id,
                    "value": t.value,
                    "traceTotal": t.total,
                    "rootServiceName": t.root_service,
                    "rootTraceName": t.root_name,
                    "durationNanos": t.duration_ns,
                }
                for t in found.traces
            ],
        }
    )


routes = [Route("/api/v1/function/traces", hot_traces, methods=["GET"])]
