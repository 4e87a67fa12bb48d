"""Per-endpoint profiling (see :mod:`hotspan.query.endpoints`).

- ``GET /api/v1/endpoints?service=&profileType=&start=&end=``: the service's endpoints with
  their request count and profile value, the costliest first, beside the service's total; and
  the time their requests waited for the GIL (``gilWaitPerRequest``), when the service's agent
  records it (``gilWaitProfileType`` is then that profile's ID, else null); the requests that
  failed (``errors``, ``errorRate``: their local root span's status is error) and their
  latency (``latencyNanos``: p50, p95, p99 of the local root spans' durations); their CPU and
  allocated bytes per request (``cpuPerRequest``, ``allocPerRequest``; null when the service
  records no such profile).  With
  ``by=<label>`` (``version``, say), ``groups`` too: the endpoints per value of that label of
  the service's profiles, each request counted under the value whose samples it has (value
  null: the requests without samples).
- ``GET /api/v1/endpoints/flamegraph?...&name=``: the flame graph of one endpoint's requests,
  ``{"flamegraph": ...}`` as in SelectMergeStacktracesResponse (protojson).

``start``/``end`` are unix seconds, as in hotspan's other ``/api`` endpoints (the last hour by
default); ``profileType`` is on-CPU time by default.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.model.profile import ProfileType
from hotspan.query.endpoints import Endpoint, EndpointEngine
from hotspan.query.engine import QueryError
from hotspan.query.why import GIL_WAIT
from hotspan.server.errors import HTTPError, text_errors
from hotspan.server.params import max_nodes_value, profile_type, time_range
from hotspan.server.pyroscope.span_profiles import flamegraph_json
from hotspan.server.request import query_state

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
CPU_TYPE = ProfileType.parse(CPU)
ALLOC_TYPE = ProfileType.parse("memory:alloc_space:bytes:space:bytes")
MAX_NAME = 1000
DEFAULT_RANGE_NS = 3600 * 10**9


def _params(request: Request) -> Tuple[str, ProfileType, int, int]:
    params = request.query_params
    service = params.get("service") or ""
    if not service.strip():
        raise HTTPError(400, "service is required: the service_name whose endpoints to list")
    ptype = profile_type(params.get("profileType") or CPU)
    start, end = time_range(request, DEFAULT_RANGE_NS)
    return service, ptype, start, end


@text_errors
async def endpoints(request: Request) -> Response:
    state, tenant = query_state(request)
    service, ptype, start, end = _params(request)
    by = request.query_params.get("by") or ""
    if len(by) > MAX_NAME or (by and not by.isprintable()):
        raise HTTPError(400, f"by must be a label name of at most {MAX_NAME} characters")
    engine = EndpointEngine(state.store, state.engine)
    found = await run_in_threadpool(
        engine.endpoints, tenant, service, ptype, start, end, GIL_WAIT, (CPU_TYPE, ALLOC_TYPE)
    )
    total = found.total
    gil = found.beside is not None or ptype == GIL_WAIT

    def per_request(kind: ProfileType, e: Endpoint) -> Optional[float]:
        totals = found.also.get(kind.id)
        return totals.get(e.name, 0) / e.requests if totals is not None and e.requests else None

    def endpoint(e: Endpoint, with_gil: bool, grouped: bool = False) -> Dict[str, Any]:
        return {
            "name": e.name,
            "requests": e.requests,
            "total": e.total,
            "perRequest": e.total / e.requests if e.requests else 0,
            "share": e.total / total if total else 0,
            "errors": e.errors,
            "errorRate": e.errors / e.requests if e.requests else 0,
            "latencyNanos": dict(zip(("p50", "p95", "p99"), e.latency_ns)),
            "gilWaitPerRequest": (
                (e.total if ptype == GIL_WAIT else e.beside) / e.requests
                if with_gil and e.requests
                else None
            ),
            # CPU and allocations per request whatever the profile asked for, null where the
            # service records no such profile (per value of a split: the profile asked for).
            "cpuPerRequest": None if grouped else per_request(CPU_TYPE, e),
            "allocPerRequest": None if grouped else per_request(ALLOC_TYPE, e),
        }

    answer: Dict[str, Any] = {
        "service": service,
        "profileType": ptype.id,
        "start": start // 10**9,
        "end": end // 10**9,
        "total": total,
        "unattributed": found.unattributed,
        "truncated": found.truncated,
        "gilWaitProfileType": GIL_WAIT.id if gil else None,
        "endpoints": [endpoint(e, gil) for e in found.endpoints],
    }
    if by:
        groups = await run_in_threadpool(engine.split, tenant, service, ptype, start, end, by)
        answer["by"] = by
        answer["groups"] = [
            {"value": g.value, "endpoints": [endpoint(e, False, grouped=True) for e in g.endpoints]}
            for g in groups
        ]
    return JSONResponse(answer)


@text_errors
async def flamegraph(request: Request) -> Response:
    state, tenant = query_state(request)
    service, ptype, start, end = _params(request)
    name = request.query_params.get("name")
    if not name:
        raise HTTPError(400, "name is required: the span name of the endpoint")
    if len(name) > MAX_NAME:
        raise HTTPError(400, f"name is longer than {MAX_NAME} characters")
    limit = max_nodes_value(request.query_params.get("maxNodes"))
    engine = EndpointEngine(state.store, state.engine)
    values, requests = await run_in_threadpool(
        engine.endpoint_values, tenant, service, name, ptype, start, end
    )
    try:
        graph = await run_in_threadpool(state.engine.flamegraph, values, limit)
    except QueryError as exc:
        raise HTTPError(400, str(exc)) from None
    return JSONResponse(
        {
            "service": service,
            "name": name,
            "profileType": ptype.id,
            "requests": requests,
            "flamegraph": flamegraph_json(graph),
        }
    )


routes = [
    Route("/api/v1/endpoints", endpoints, methods=["GET"]),
    Route("/api/v1/endpoints/flamegraph", flamegraph, methods=["GET"]),
]
