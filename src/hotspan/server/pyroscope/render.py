"""Pyroscope's legacy HTTP query API: ``/pyroscope/render`` and friends, flamebearer JSON."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple, Union

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.formats import ingest_params
from hotspan.formats.errors import FormatError
from hotspan.model.labels import SERVICE_NAME, Matcher, Selector, SelectorError, parse_selector
from hotspan.model.profile import ProfileType, ProfileTypeError
from hotspan.query import dot
from hotspan.query.engine import QueryError
from hotspan.query.flamegraph import FlameGraph
from hotspan.server.errors import HTTPError, json_error
from hotspan.server.params import max_nodes_value
from hotspan.server.request import query_state
from hotspan.server.state import ServerState
from hotspan.store.base import SampleFilter

# Legacy ``app.<suffix>`` -> (metric name, preferred sample types).
_LEGACY_SAMPLE_TYPES = {
    "cpu": ("process_cpu", ("cpu", "samples")),
    "itimer": ("process_cpu", ("cpu", "samples")),
    "wall": ("wall", ("wall", "samples")),
}


def _params_range(request: Request, prefix: str = "") -> Tuple[int, int]:
    """``from``/``until``, or ``leftFrom``/``leftUntil`` with a prefix."""
    from_key, until_key = (prefix + "From", prefix + "Until") if prefix else ("from", "until")
    now = time.time_ns()
    try:
        start = ingest_params.parse_time(request.query_params.get(from_key), now - 3600 * 10**9)
        end = ingest_params.parse_time(request.query_params.get(until_key), now)
    except FormatError as exc:
        raise HTTPError(400, str(exc)) from None
    if end <= start:
        raise HTTPError(400, f"invalid time range: {until_key} must be after {from_key}")
    return start, end


def resolve_query(
    state: ServerState, tenant: str, query: str, start: int, end: int
) -> Tuple[ProfileType, Selector]:
    """``app.cpu{env="prod"}`` or ``process_cpu:cpu:nanoseconds:cpu:nanoseconds{...}``."""
    if not query:
        raise HTTPError(400, "query parameter 'query' is required, e.g. myapp.cpu{}")
    try:
        sel = parse_selector(query)
    except SelectorError as exc:
        raise HTTPError(400, f"bad query {query!r}: {exc}") from None
    if sel.metric.count(":") == 4:
        try:
            return ProfileType.parse(sel.metric), Selector("", sel.matchers)
        except ProfileTypeError as exc:
            raise HTTPError(400, str(exc)) from None
    app, suffix = ingest_params.split_suffix(sel.metric)
    if not app:
        raise HTTPError(400, f"query {query!r} names no application")
    sel = Selector("", sel.matchers + (Matcher(SERVICE_NAME, "=", app),))
    metric, preferred = _LEGACY_SAMPLE_TYPES.get(suffix, (None, (suffix,)))
    candidates = {
        rec.profile_type
        for rec in state.engine.find_series(tenant, [sel], start, end)
        if (metric is None or rec.profile_type.name == metric)
    }
    for sample_type in preferred:
        for ptype in sorted(candidates, key=lambda t: t.id):
            if ptype.sample_type == sample_type:
                return ptype, sel
    raise HTTPError(404, f"no {suffix} profiles for application {app!r} in this time range")


def _units(ptype: ProfileType) -> Tuple[str, int]:
    return flamebearer_units(ptype.sample_type, ptype.sample_unit)


def flamebearer_units(sample_type: str, sample_unit: str) -> Tuple[str, int]:
    """Flamebearer units and sample rate, as Pyroscope reports them."""
    if sample_unit == "nanoseconds":
        return "samples", 1_000_000_000
    if sample_unit == "bytes":
        return "bytes", 100
    if sample_type in ("inuse_objects", "alloc_objects", "goroutines", "goroutine"):
        return "objects", 100
    return "samples", 100


def flamebearer_profile(
    graph: FlameGraph, sample_type: str, sample_unit: str, name: str
) -> Dict[str, Any]:
    """A flame graph as Pyroscope's flamebearer profile (its version, graph and metadata)."""
    units, rate = flamebearer_units(sample_type, sample_unit)
    metadata = {"format": "single", "spyName": "", "sampleRate": rate, "units": units, "name": name}
    return {"version": 1, "flamebearer": flamebearer(graph), "metadata": metadata}


def flamebearer(graph: FlameGraph) -> Dict[str, Any]:
    return {
        "names": graph.names,
        "levels": [level.tolist() for level in graph.levels],
        "numTicks": int(sum(graph.totals)),
        "maxSelf": graph.max_self,
    }


# Pyroscope's timeline step (its querier's CalcPointInterval): about 1,500 points over the
# range, at least 15 s, rounded to a round step: (at most this interval, step) in ms.
_ROUND_STEPS_MS = (
    (17_500, 15_000),
    (25_000, 20_000),
    (45_000, 30_000),
    (90_000, 60_000),
    (210_000, 120_000),
    (450_000, 300_000),
    (750_000, 600_000),
    (1_050_000, 900_000),
    (1_500_000, 1_200_000),
    (2_700_000, 1_800_000),
    (5_400_000, 3_600_000),
    (9_000_000, 7_200_000),
    (16_200_000, 10_800_000),
    (32_400_000, 21_600_000),
    (86_400_000, 43_200_000),
    (604_800_000, 86_400_000),
    (1_814_400_000, 604_800_000),
    (3_628_800_000 - 1, 2_592_000_000),
)
_TIMELINE_POINTS = 1500
_YEAR_MS = 31_536_000_000


def timeline_step_s(start_ns: int, end_ns: int) -> int:
    """The step of a render timeline over a range, in seconds, as Pyroscope picks it."""
    interval_ms = (end_ns - start_ns) // _TIMELINE_POINTS // 10**6
    step_ms = next((step for top, step in _ROUND_STEPS_MS if interval_ms <= top), _YEAR_MS)
    return step_ms // 1000


def _timeline(
    state: ServerState, tenant: str, ptype: ProfileType, sel: Selector, start: int, end: int
) -> Dict[str, Any]:
    """Pyroscope's timeline: its step over the range, the start snapped down to a whole step,
    a sample per step (0 where nothing was seen).  Pyroscope snaps the end down too and leaves
    out the step the range ends in; here that step is kept, so the newest data shows."""
    step_s = timeline_step_s(start, end)
    step_ns = step_s * 10**9
    start, end = start // step_ns * step_ns, -(-end // step_ns) * step_ns
    start_s = start // 10**9
    if start >= end:
        return {"startTime": start_s, "samples": [], "durationDelta": step_s, "watermarks": None}
    # The store's steps are (t - step, t], stamped t; a timeline's are [t, t + step): asked a
    # nanosecond early, each step holds what the timeline's holds, stamped a millisecond
    # before its end.
    found = state.engine.select_series(
        tenant, ptype, sel, SampleFilter(start - 1, end - 1), step_ns, [], False, None
    )
    samples = [0] * ((end - start) // step_ns)
    start_ms, step_ms = start // 10**6, step_ns // 10**6
    for ts in found:
        for t_ms, v in zip(ts.timestamps_ms, ts.values):
            i = (t_ms + 1 - start_ms) // step_ms - 1
            if 0 <= i < len(samples):
                samples[i] += int(v)
    return {"startTime": start_s, "samples": samples, "durationDelta": step_s, "watermarks": None}


def _max_nodes(request: Request) -> int:
    """``max-nodes`` (or ``maxNodes``), with the querier's default and limit."""
    params = request.query_params
    name = "maxNodes" if params.get("maxNodes") else "max-nodes"
    return max_nodes_value(params.get(name), name)


def _guard(fn):
    async def endpoint(request: Request) -> Response:
        try:
            state, tenant = query_state(request)
            answer = await run_in_threadpool(fn, request, state, tenant)
            return answer if isinstance(answer, Response) else JSONResponse(answer)
        except HTTPError as exc:
            return json_error(exc)
        except QueryError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)

    endpoint.__name__ = fn.__name__
    return endpoint


def _single(
    state: ServerState, tenant: str, query: str, start: int, end: int, max_nodes: int
) -> Tuple[ProfileType, Selector, FlameGraph]:
    ptype, sel = resolve_query(state, tenant, query, start, end)
    values = state.engine.stack_values(tenant, ptype, sel, SampleFilter(start, end))
    return ptype, sel, state.engine.flamegraph(values, max_nodes)


# ``format=dot``: at most this many functions unless ``max-nodes`` asks otherwise (Pyroscope's).
DOT_MAX_NODES = 100


@_guard
def render(request: Request, state: ServerState, tenant: str) -> Union[Dict[str, Any], Response]:
    start, end = _params_range(request)
    query = request.query_params.get("query", "")
    if request.query_params.get("format") == "dot":
        return _dot(request, state, tenant, query, start, end)
    ptype, sel, graph = _single(state, tenant, query, start, end, _max_nodes(request))
    return {
        **flamebearer_profile(graph, ptype.sample_type, ptype.sample_unit, query),
        "timeline": _timeline(state, tenant, ptype, sel, start, end),
        "groups": None,
        "heatmap": None,
    }


def _dot(
    request: Request, state: ServerState, tenant: str, query: str, start: int, end: int
) -> Response:
    """The profile as a call graph in DOT (what Grafana's "Explain flame graph" reads); no
    samples, no text."""
    params = request.query_params
    limit = DOT_MAX_NODES
    if params.get("max-nodes") or params.get("maxNodes"):
        limit = _max_nodes(request)
    ptype, sel = resolve_query(state, tenant, query, start, end)
    values = state.engine.stack_values(tenant, ptype, sel, SampleFilter(start, end))
    if not len(values.stack_ids):
        return Response("", media_type="text/plain")
    matrix, lengths, stack_values = state.engine.name_matrix(values)
    text = dot.write(
        matrix,
        lengths,
        stack_values,
        state.engine.stacks.names,
        limit,
        ptype.sample_type,
        ptype.sample_unit,
    )
    return Response(text, media_type="text/plain")


@_guard
def render_diff(request: Request, state: ServerState, tenant: str) -> Dict[str, Any]:
    limit = _max_nodes(request)
    left_start, left_end = _params_range(request, "left")
    right_start, right_end = _params_range(request, "right")
    left_query = request.query_params.get("leftQuery", "")
    right_query = request.query_params.get("rightQuery", "") or left_query
    left_type, left_sel = resolve_query(state, tenant, left_query, left_start, left_end)
    right_type, right_sel = resolve_query(state, tenant, right_query, right_start, right_end)
    if left_type != right_type:
        raise HTTPError(400, f"cannot diff {left_type.id} against {right_type.id}")
    engine = state.engine
    left = engine.stack_values(tenant, left_type, left_sel, SampleFilter(left_start, left_end))
    right = engine.stack_values(tenant, right_type, right_sel, SampleFilter(right_start, right_end))
    graph = engine.diff(left, right, limit)
    units, rate = _units(left_type)
    bearer = flamebearer(graph)
    bearer["leftTicks"], bearer["rightTicks"] = graph.totals
    return {
        "version": 1,
        "flamebearer": bearer,
        "metadata": {
            "format": "double",
            "spyName": "",
            "sampleRate": rate,
            "units": units,
            "name": left_query,
        },
        "leftTicks": graph.totals[0],
        "rightTicks": graph.totals[1],
        "timeline": _timeline(state, tenant, left_type, left_sel, left_start, left_end),
    }


def _series_selectors(request: Request) -> List[str]:
    query = request.query_params.get("query")
    if not query:
        return []
    try:
        sel = parse_selector(query)
    except SelectorError as exc:
        raise HTTPError(400, f"bad query {query!r}: {exc}") from None
    matchers = list(sel.matchers)
    if sel.metric:
        app, _ = ingest_params.split_suffix(sel.metric)
        matchers.append(Matcher(SERVICE_NAME, "=", app))
    return ["{" + ",".join(str(m) for m in matchers) + "}"]


@_guard
def label_values(request: Request, state: ServerState, tenant: str) -> List[str]:
    name: Optional[str] = request.query_params.get("label")
    if not name:
        raise HTTPError(400, "query parameter 'label' is required")
    start, end = _params_range(request)
    return state.engine.label_values(tenant, name, _series_selectors(request), start, end)


@_guard
def label_names(request: Request, state: ServerState, tenant: str) -> List[str]:
    start, end = _params_range(request)
    names = state.engine.label_names(tenant, _series_selectors(request), start, end)
    return [n for n in names if not n.startswith("__")]


routes = [
    Route("/pyroscope/render", render, methods=["GET"]),
    Route("/pyroscope/render-diff", render_diff, methods=["GET"]),
    Route("/pyroscope/label-values", label_values, methods=["GET"]),
    Route("/pyroscope/labels", label_names, methods=["GET"]),
]
