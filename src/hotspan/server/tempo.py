"""Grafana Tempo's HTTP API, as far as Grafana's Tempo data source uses it.

Trace by id (v1 and v2, JSON or protobuf), search (TraceQL spanset filters or the legacy
``tags``), tag names and values (v1 and v2), ``/api/echo`` and ``/api/status/buildinfo``.
Search answers carry only the fields Tempo's own ``SearchResponse`` has: Grafana decodes them
strictly, and an unknown field would fail the query.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hotspan.formats.otlp import encode_json
from hotspan.formats.otlp_traces import traces_data
from hotspan.model.profile import MAX_TIME_NS
from hotspan.model.trace import (
    TRACE_INTRINSICS,
    TRACE_ORDERS,
    SearchError,
    TraceQuery,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import legacy_query, parse_duration, parse_logfmt, parse_traceql
from hotspan.server.errors import HTTPError
from hotspan.server.request import query_state

PROTOBUF = "application/protobuf"
SEC = 1_000_000_000
DEFAULT_SEARCH_RANGE_NS = 24 * 3600 * SEC
MAX_LIMIT = 10_000
MAX_SPANS_PER_SPANSET = 1_000
# What Tempo lists in the intrinsic scope that hotspan can search on.
INTRINSIC_TAGS = ["duration", "kind", "name", "status", *TRACE_INTRINSICS]
TEMPO_VERSION = "2.1.0"  # below 2.2: Grafana of 2023-24 then does not try gRPC streaming


def text_error(exc: HTTPError) -> Response:
    return PlainTextResponse(exc.message + "\n", status_code=exc.status)


def trace_id_param(text: str) -> str:
    """A trace id from a path: hex, any case, left-padded to 32 digits as Tempo does."""
    text = text.strip().lower()
    if not text or len(text) > 32 or any(c not in "0123456789abcdef" for c in text):
        raise HTTPError(400, f"trace id {text[:40]!r} is not up to 32 hex digits")
    return text.rjust(32, "0")


def seconds_param(request: Request, name: str) -> Optional[int]:
    text = request.query_params.get(name)
    if not text:
        return None
    try:
        seconds = int(text)
    except ValueError:
        raise HTTPError(400, f"{name} must be unix seconds, got {text[:40]!r}") from None
    # Milliseconds given for seconds would pass for a date thousands of years away.
    if not 0 <= seconds < MAX_TIME_NS // SEC:
        raise HTTPError(400, f"{name} must be unix seconds, got {seconds} (milliseconds?)")
    return seconds * SEC


def _int_param(request: Request, name: str, default: int) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise HTTPError(400, f"{name} must be an integer, got {text!r}") from None
    if value <= 0:
        raise HTTPError(400, f"{name} must be positive, got {value}")
    return value


def _wants_protobuf(request: Request) -> bool:
    return PROTOBUF in request.headers.get("accept", "")


async def echo(request: Request) -> Response:
    return PlainTextResponse("echo\n")


async def buildinfo(request: Request) -> Response:
    from hotspan import __version__

    return JSONResponse(
        {
            "version": TEMPO_VERSION,
            "revision": f"hotspan-{__version__}",
            "branch": "",
            "buildUser": "",
            "buildDate": "",
            "goVersion": "",
        }
    )


async def _trace(request: Request):  # type: ignore[no-untyped-def]
    state, tenant = query_state(request)
    trace_id = trace_id_param(request.path_params["trace_id"])
    spans = await run_in_threadpool(state.store.trace, tenant, trace_id)
    return traces_data(spans), bool(spans)


async def trace_v1(request: Request) -> Response:
    try:
        data, found = await _trace(request)
        if not found:
            raise HTTPError(404, "trace not found")
    except HTTPError as exc:
        return text_error(exc)
    if _wants_protobuf(request):
        # Tempo's ``Trace`` is OTLP's ``TracesData`` on the wire.
        return Response(data.SerializeToString(), media_type=PROTOBUF)
    return JSONResponse({"batches": encode_json(data).get("resourceSpans", [])})


async def trace_v2(request: Request) -> Response:
    """``TraceByIDResponse``; as in Tempo, an unknown trace is a 200 with an empty trace."""
    try:
        data, _ = await _trace(request)
    except HTTPError as exc:
        return text_error(exc)
    if _wants_protobuf(request):
        body = data.SerializeToString()
        # Field 1 (trace) is always written: Grafana reads it without checking it is there.
        return Response(b"\x0a" + _varint(len(body)) + body, media_type=PROTOBUF)
    return JSONResponse({"trace": encode_json(data)})


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def search_query(request: Request) -> TraceQuery:
    """The query of a search request; ``sort=duration`` (a hotspan extension, absent from
    Tempo) keeps the longest traces instead of the newest, longest first."""
    query = _search_query(request)
    sort = request.query_params.get("sort") or "recent"
    if sort not in TRACE_ORDERS:
        raise HTTPError(400, f"sort must be one of {', '.join(TRACE_ORDERS)}, not {sort!r}")
    return replace(query, order=sort) if sort != query.order else query


def _search_query(request: Request) -> TraceQuery:
    params = request.query_params
    start = seconds_param(request, "start")
    end = seconds_param(request, "end")
    if end is None:
        end = time.time_ns()
    if start is None:
        start = end - DEFAULT_SEARCH_RANGE_NS
    if end <= start:
        raise HTTPError(400, "end must be after start")
    limit = min(_int_param(request, "limit", 20), MAX_LIMIT)
    spss = min(_int_param(request, "spss", 3), MAX_SPANS_PER_SPANSET)
    try:
        if params.get("q") and params.get("tags"):
            raise HTTPError(400, "q and tags cannot be used together")
        if params.get("q"):
            spansets, trace_conds = parse_traceql(params["q"])
            for name in ("minDuration", "maxDuration"):
                if params.get(name):
                    raise HTTPError(400, f"{name} goes with tags; in TraceQL use traceDuration")
            return TraceQuery(start, end, spansets, trace_conds, limit, spss)
        low = parse_duration(params["minDuration"]) if params.get("minDuration") else None
        high = parse_duration(params["maxDuration"]) if params.get("maxDuration") else None
        if low and high and high < low:
            raise HTTPError(400, "maxDuration is shorter than minDuration")
        tags = parse_logfmt(params.get("tags", ""))
        return legacy_query(tags, start, end, low, high, limit)
    except QueryError as exc:
        raise HTTPError(400, str(exc)) from None


async def search(request: Request) -> Response:
    try:
        state, tenant = query_state(request)
        query = search_query(request)
        try:
            found = await run_in_threadpool(state.store.find_traces, tenant, query)
        except SearchError as exc:
            raise HTTPError(400, str(exc)) from None
    except HTTPError as exc:
        return text_error(exc)
    traces = []
    for t in found:
        spanset = {
            "spans": [
                {
                    "spanID": f"{s.span_id:016x}",
                    "name": s.name,
                    "startTimeUnixNano": str(s.start_ns),
                    "durationNanos": str(s.duration_ns),
                }
                for s in t.matched
            ],
            "matched": t.matched_count,
        }
        traces.append(
            {
                "traceID": t.trace_id,
                "rootServiceName": t.root_service or "<root span not yet received>",
                "rootTraceName": t.root_name,
                "startTimeUnixNano": str(t.start_ns),
                "durationMs": t.duration_ns // 1_000_000,
                "spanSet": spanset,
                "spanSets": [spanset],
            }
        )
    body: Dict[str, object] = {"metrics": {"completedJobs": 1, "totalJobs": 1}}
    if traces:
        body = {"traces": traces, **body}
    return JSONResponse(body)


async def _tag_names(request: Request) -> Tuple[Dict[str, List[str]], Optional[str]]:
    state, tenant = query_state(request)
    scope = request.query_params.get("scope") or None
    if scope not in (None, "span", "resource", "intrinsic", "all"):
        raise HTTPError(400, f"scope must be span, resource or intrinsic, not {scope!r}")
    since = seconds_param(request, "start") or 0
    names = await run_in_threadpool(state.store.tag_names, tenant, since)
    return names, None if scope == "all" else scope


async def tags_v1(request: Request) -> Response:
    try:
        names, scope = await _tag_names(request)
    except HTTPError as exc:
        return text_error(exc)
    if scope == "intrinsic":
        out = list(INTRINSIC_TAGS)
    else:
        scopes = [scope] if scope else ["span", "resource"]
        out = sorted({n for s in scopes for n in names.get(s, [])})
    return JSONResponse({"tagNames": out})


async def tags_v2(request: Request) -> Response:
    try:
        names, scope = await _tag_names(request)
    except HTTPError as exc:
        return text_error(exc)
    scopes = []
    for name in ("resource", "span"):
        if scope in (None, name):
            scopes.append({"name": name, "tags": names.get(name, [])})
    if scope in (None, "intrinsic"):
        scopes.insert(0, {"name": "intrinsic", "tags": list(INTRINSIC_TAGS)})
    return JSONResponse({"scopes": scopes})


def _identifier(tag: str) -> Tuple[Optional[str], str]:
    """(scope or None for any, attribute name) of a TraceQL identifier."""
    for prefix, scope in (("resource.", "resource"), ("span.", "span")):
        if tag.startswith(prefix):
            return scope, tag[len(prefix) :]
    if tag.startswith("."):
        return None, tag[1:]
    if tag in ("name", "status", "kind", "span:name", "span:status", "span:kind"):
        return "intrinsic", tag.split(":")[-1]
    if tag in ("rootServiceName", "trace:rootService"):
        return "resource", "service.name"
    return None, tag


async def _values(request: Request, scope: Optional[str], name: str) -> List[Tuple[str, str]]:
    state, tenant = query_state(request)
    since = seconds_param(request, "start") or 0
    limit = _int_param(request, "limit", MAX_LIMIT)
    values = await run_in_threadpool(state.store.tag_values, tenant, scope, name, since)
    return values[:limit]


async def tag_values_v1(request: Request) -> Response:
    try:
        values = await _values(request, None, request.path_params["tag"])
    except HTTPError as exc:
        return text_error(exc)
    return JSONResponse({"tagValues": sorted({value for value, _ in values})})


async def tag_values_v2(request: Request) -> Response:
    tag = request.path_params["tag"]
    scope, name = _identifier(tag)
    try:
        values = await _values(request, scope, name) if tag not in ("duration",) else []
    except HTTPError as exc:
        return text_error(exc)
    return JSONResponse({"tagValues": [{"type": kind, "value": value} for value, kind in values]})


routes = [
    Route("/api/echo", echo, methods=["GET"]),
    Route("/api/status/buildinfo", buildinfo, methods=["GET"]),
    Route("/api/traces/{trace_id}", trace_v1, methods=["GET"]),
    Route("/api/v2/traces/{trace_id}", trace_v2, methods=["GET"]),
    Route("/api/search", search, methods=["GET"]),
    Route("/api/search/tags", tags_v1, methods=["GET"]),
    Route("/api/v2/search/tags", tags_v2, methods=["GET"]),
    Route("/api/search/tag/{tag}/values", tag_values_v1, methods=["GET"]),
    Route("/api/v2/search/tag/{tag}/values", tag_values_v2, methods=["GET"]),
]
