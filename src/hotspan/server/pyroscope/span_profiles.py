"""hotspan's own trace-to-profile endpoints, beside the Tempo API.

- ``GET /api/traces/{traceID}/profile``: the flame graph of a whole trace, or of one span
  (``spanID``), with its descendants if ``descendants=true``; ``format=pprof`` for pprof.
- ``GET /api/traces/{traceID}/spans``: every span of the trace with its duration beside the
  profile value its samples hold, its own and with its descendants': a span that took 2 s and
  holds 1.9 s of CPU was computing, one that holds 10 ms was waiting.

- ``GET /api/v1/traces/profiled?traceID=a&traceID=b&start=&end=`` (or ``traceID=a,b``): the
  profile total of each listed trace (up to MAX_TRACE_IDS, one store query for all), for the
  trace list's CPU column and its "has profile" mark; traces without samples are left out.

All take ``profileType`` (default on-CPU time) and ``start``/``end`` (unix seconds; for one
trace, by default an hour either side of it, since samples are stamped with the start of their
upload window); the first two also take ``labelSelector``.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Tuple

from google.protobuf import json_format
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.formats.proto import querier_pb2
from hotspan.model.labels import Selector
from hotspan.model.profile import ProfileType
from hotspan.query.engine import QueryError
from hotspan.query.flamegraph import FlameGraph, to_message
from hotspan.query.traces import SPAN_SLACK_NS
from hotspan.server.errors import HTTPError, text_errors
from hotspan.server.params import (
    max_nodes_value,
    profile_type,
    seconds_param,
    selector,
    span_id_param,
    trace_id_param,
)
from hotspan.server.request import query_state
from hotspan.server.state import ServerState
from hotspan.store.base import SampleFilter

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
PPROF = "application/vnd.google.protobuf"
# The trace list shows at most 1000 traces; a longer list is a client's mistake.
MAX_TRACE_IDS = 1000


def flamegraph_json(graph: FlameGraph) -> Dict[str, Any]:
    """A flame graph as the querier's FlameGraph message in protojson: what the UI decodes,
    from hotspan's own endpoints as from SelectMergeStacktraces."""
    message = querier_pb2.FlameGraph()
    to_message(graph, message)
    return json_format.MessageToDict(message)


def _window(request: Request, spans) -> Tuple[int, int]:
    start = seconds_param(request, "start")
    end = seconds_param(request, "end")
    if start is None:
        start = min(s.start_ns for s in spans) - SPAN_SLACK_NS if spans else 0
    if end is None:
        end = max(s.end_ns for s in spans) + SPAN_SLACK_NS if spans else 0
    if end <= start:
        raise HTTPError(400, "end must be after start (or give a trace that has spans)")
    return start, end


class _Common(NamedTuple):
    state: ServerState
    tenant: str
    trace_id: str
    profile_type: ProfileType
    selector: Selector


def _common(request: Request) -> _Common:
    """What both endpoints read first: caller, trace id, profile type, label selector."""
    state, tenant = query_state(request)
    params = request.query_params
    return _Common(
        state,
        tenant,
        trace_id_param(request.path_params["trace_id"]),
        profile_type(params.get("profileType") or CPU),
        selector(params.get("labelSelector") or "{}"),
    )


@text_errors
async def profile(request: Request) -> Response:
    state, tenant, trace_id, ptype, sel = _common(request)
    params = request.query_params
    span = span_id_param(request.query_params.get("spanID"))
    descendants = params.get("descendants", "").lower() in ("1", "true", "yes")
    limit = max_nodes_value(params.get("maxNodes"))
    fmt = params.get("format") or "json"
    if fmt not in ("json", "pprof"):
        raise HTTPError(400, f"format must be json or pprof, not {fmt!r}")
    spans = await run_in_threadpool(state.store.trace, tenant, trace_id)
    start, end = _window(request, spans)
    span_ids = None
    if span is not None:
        span_ids = [span]
        if descendants:
            span_ids = await run_in_threadpool(state.traces.with_descendants, tenant, span_ids)
    where = SampleFilter(
        start,
        end,
        span_ids=span_ids,
        trace_ids=[trace_id],
        trace_span_ids=[s.span_id for s in spans],
    )
    try:
        values = await run_in_threadpool(state.engine.stack_values, tenant, ptype, sel, where)
        if fmt == "pprof":
            pprof = await run_in_threadpool(state.engine.pprof, ptype, values, where, None)
            return Response(pprof.SerializeToString(), media_type=PPROF)
        graph = await run_in_threadpool(state.engine.flamegraph, values, limit)
    except QueryError as exc:
        raise HTTPError(400, str(exc)) from None
    return JSONResponse(
        {
            "traceID": trace_id,
            "spanID": f"{span:016x}" if span is not None else None,
            "descendants": descendants,
            "spans": [f"{s:016x}" for s in span_ids] if span_ids else None,
            "profileType": ptype.id,
            "flamegraph": flamegraph_json(graph),
        }
    )


@text_errors
async def spans(request: Request) -> Response:
    state, tenant, trace_id, ptype, sel = _common(request)
    window = None
    start, end = seconds_param(request, "start"), seconds_param(request, "end")
    if (start is None) != (end is None):
        raise HTTPError(400, "give both start and end, or neither")
    if start is not None and end is not None:
        if end <= start:
            raise HTTPError(400, "end must be after start")
        window = (start, end)
    found = await run_in_threadpool(state.traces.trace_cpu, tenant, trace_id, ptype, sel, window)
    if found is None:
        raise HTTPError(404, "trace not found")
    return JSONResponse(
        {
            "traceID": trace_id,
            "profileType": ptype.id,
            "total": found.total,
            "unattributed": found.unattributed,
            "spans": [
                {
                    "spanID": f"{row.span.span_id:016x}",
                    "parentSpanID": f"{row.span.parent_span_id:016x}"
                    if row.span.parent_span_id
                    else "",
                    "name": row.span.name,
                    "service": row.span.service,
                    "startTimeUnixNano": str(row.span.start_ns),
                    "durationNanos": str(row.span.duration_ns),
                    "self": row.self_value,
                    "total": row.total_value,
                }
                for row in found.spans
            ],
        }
    )


@text_errors
async def profiled(request: Request) -> Response:
    state, tenant = query_state(request)
    params = request.query_params
    # Repeated (traceID=a&traceID=b) or comma-separated (traceID=a,b), as clients build it.
    texts = [t for value in params.getlist("traceID") for t in value.split(",") if t.strip()]
    if not texts:
        raise HTTPError(400, "give the traces as traceID=<id>&traceID=<id>...")
    if len(texts) > MAX_TRACE_IDS:
        raise HTTPError(400, f"at most {MAX_TRACE_IDS} traceID values, got {len(texts)}")
    trace_ids = sorted({trace_id_param(t) for t in texts})
    ptype = profile_type(params.get("profileType") or CPU)
    start, end = seconds_param(request, "start"), seconds_param(request, "end")
    if start is None or end is None:
        raise HTTPError(400, "start and end (unix seconds) are required")
    if end <= start:
        raise HTTPError(400, "end must be after start")
    totals = await run_in_threadpool(
        state.traces.trace_totals, tenant, ptype, trace_ids, start, end
    )
    return JSONResponse({"profileType": ptype.id, "traces": totals})


routes = [
    Route("/api/v1/traces/profiled", profiled, methods=["GET"]),
    Route("/api/traces/{trace_id}/profile", profile, methods=["GET"]),
    Route("/api/traces/{trace_id}/spans", spans, methods=["GET"]),
]
