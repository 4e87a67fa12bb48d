"""Grafana Tempo's HTTP API, as far as Grafana's Tempo data source uses it.

Trace by id (v1 and v2, JSON or protobuf), search (TraceQL, see query.trace_search, or the
legacy ``tags``), tag names and values (v1 and v2; ``q=`` narrows them to the spans a partial
TraceQL query matches, see query.traceql.autocomplete, but for those of events, links,
instrumentation scopes and status messages, which only the tag index holds), ``/api/echo`` and
``/api/status/buildinfo``.
Search answers carry only the fields Tempo's own ``SearchResponse`` has: Grafana decodes them
strictly, and an unknown field would fail the query.  The same search and TraceQL metrics
also answer over gRPC, on the main port too (server.tempo.grpc_api, server.http.h2_sniff).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hotspan.formats.otlp import encode_json
from hotspan.formats.otlp_traces import traces_data
from hotspan.formats.protowire import uvarint
from hotspan.model.profile import MAX_TIME_NS
from hotspan.model.trace import (
    TRACE_ORDERS,
    Condition,
    SearchError,
    SpanRecord,
    TraceQuery,
)
from hotspan.query import trace_search
from hotspan.query.engine import QueryError
from hotspan.query.trace_search import SearchParams
from hotspan.query.traceql import (
    Query,
    legacy_query,
    narrowing_conditions,
    parse_duration,
    parse_logfmt,
    parse_query,
    tag_names,
    tag_values,
)
from hotspan.query.traceql.ast import Attribute
from hotspan.query.traceql.lexer import Lexer
from hotspan.server.errors import HTTPError, text_errors
from hotspan.server.params import parse_since, seconds_param, seconds_value, trace_id_param
from hotspan.server.request import query_state
from hotspan.server.state import ServerState

PROTOBUF = "application/protobuf"
SEC = 1_000_000_000
DEFAULT_SEARCH_RANGE_NS = 24 * 3600 * SEC
MAX_LIMIT = 10_000
MAX_SPANS_PER_SPANSET = 1_000
# Spans read to narrow tag names and values by ``q``: the newest of the range.
MAX_AUTOCOMPLETE_SPANS = 10_000
# A tag request's range that ends less than this before now holds every span seen since its
# start (the tag index answers it); an earlier end needs the spans of the range.
RECENT_END_NS = 60 * SEC
# What Tempo lists in the intrinsic scope (its search.GetVirtualIntrinsicValues, in its
# order); hotspan searches on each.
INTRINSIC_TAGS = [
    "duration",
    "name",
    "status",
    "statusMessage",
    "kind",
    "rootServiceName",
    "rootName",
    "traceDuration",
    "event:name",
    "event:timeSinceStart",
    "link:spanID",
    "link:traceID",
    "instrumentation:name",
    "instrumentation:version",
    "trace:id",
    "span:id",
    "span:parentID",
    "span:status",
    "span:statusMessage",
    "span:duration",
    "span:name",
    "span:kind",
    "trace:rootName",
    "trace:rootService",
    "trace:duration",
]
# Below 2.2: Grafana 10 (traceQLStreaming toggle) then does not try gRPC streaming, which a
# proxy without HTTP/2 cleartext would break; newer Grafana streams when its data source's
# streaming options are on, whatever the version (both work on the main port: grpc_api.py).
TEMPO_VERSION = "2.1.0"


def _int_param(
    params: Mapping[str, str], name: str, default: int, zero_is_default: bool = False
) -> int:
    text = params.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise HTTPError(400, f"{name} must be an integer, got {text!r}") from None
    if value == 0 and zero_is_default:
        return default
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


async def _trace(request: Request):
    state, tenant = query_state(request)
    trace_id = trace_id_param(request.path_params["trace_id"])
    start = seconds_param(request, "start")
    end = seconds_param(request, "end")
    if start is not None and end is not None and end <= start:
        raise HTTPError(400, "end must be after start")
    spans = await run_in_threadpool(state.store.trace, tenant, trace_id)
    # As Tempo, which reads only the blocks of the window: a trace none of whose spans is in
    # it is not found (and one that is comes whole).
    if spans and (start is not None or end is not None):
        low, high = start or 0, end if end is not None else MAX_TIME_NS
        if not any(s.end_ns >= low and s.start_ns <= high for s in spans):
            spans = []
    return traces_data(spans), bool(spans)


@text_errors
async def trace_v1(request: Request) -> Response:
    data, found = await _trace(request)
    if not found:
        raise HTTPError(404, "trace not found")
    if _wants_protobuf(request):
        # Tempo's ``Trace`` is OTLP's ``TracesData`` on the wire.
        return Response(data.SerializeToString(), media_type=PROTOBUF)
    return JSONResponse({"batches": encode_json(data).get("resourceSpans", [])})


@text_errors
async def trace_v2(request: Request) -> Response:
    """``TraceByIDResponse``; an unknown trace is a 404, as on v1.

    Tempo's own v2 answers a 200 with an empty trace there, which Grafana before 11.3 draws as
    an empty waterfall; newer Grafana turns both answers into the same "failed to get trace
    ... 404" message.  The 404 says "not found" to every Grafana and every other client."""
    data, found = await _trace(request)
    if not found:
        raise HTTPError(404, "trace not found")
    if _wants_protobuf(request):
        body = data.SerializeToString()
        # Field 1 (trace) is always written: Grafana reads it without checking it is there.
        return Response(b"\x0a" + uvarint(len(body)) + body, media_type=PROTOBUF)
    return JSONResponse({"trace": encode_json(data)})


def search_query(params: Mapping[str, str]) -> Tuple[SearchParams, Optional[Query], TraceQuery]:
    """What a search asks: its range, limits and order (``sort=duration``, a hotspan extension
    absent from Tempo, keeps the longest traces instead of the newest, longest first), its
    TraceQL query if any, and the SQL search that answers it when it is simple enough."""
    query = _search_query(params)
    sort = params.get("sort") or "recent"
    if sort not in TRACE_ORDERS:
        raise HTTPError(400, f"sort must be one of {', '.join(TRACE_ORDERS)}, not {sort!r}")
    search_params, traceql, sql = query
    return replace(search_params, order=sort), traceql, replace(sql, order=sort)


# Search parameters that are not tags in an old-style search (``?service.name=api``).
_SEARCH_PARAMS = frozenset(
    ("q", "tags", "minDuration", "maxDuration", "limit", "spss", "start", "end", "sort", "since")
)


def _search_query(params: Mapping[str, str]) -> Tuple[SearchParams, Optional[Query], TraceQuery]:
    start = seconds_value(params, "start")
    end = seconds_value(params, "end")
    if params.get("since"):
        # As Tempo's frontend: the last ``since`` before now, whatever start and end say.
        end = time.time_ns()
        start = max(end - parse_since(params["since"]), 0)
    bare_tags: List[Tuple[str, str]] = []
    if not start and not end:
        # As Tempo: no range, or start=0&end=0, is the recent data; with no q or tags either,
        # the other parameters are the tags (the first Grafana Tempo data source sent them so).
        start = end = None
        if not params.get("q") and not params.get("tags"):
            bare_tags = [(k, v) for k, v in params.items() if k not in _SEARCH_PARAMS and v]
    if end is None:
        end = time.time_ns()
    if start is None:
        start = end - DEFAULT_SEARCH_RANGE_NS
    if end <= start:
        raise HTTPError(400, "end must be after start")
    limit = min(_int_param(params, "limit", 20), MAX_LIMIT)
    # spss=0 is the default, as Tempo takes it.
    spss = min(_int_param(params, "spss", 3, zero_is_default=True), MAX_SPANS_PER_SPANSET)
    search_params = SearchParams(start, end, limit, spss)
    try:
        if params.get("q") and params.get("tags"):
            raise HTTPError(400, "q and tags cannot be used together")
        if params.get("q"):
            for name in ("minDuration", "maxDuration"):
                if params.get(name):
                    raise HTTPError(400, f"{name} goes with tags; in TraceQL use traceDuration")
            traceql = parse_query(params["q"])
            if traceql.metrics is not None:
                raise HTTPError(
                    400, "TraceQL metrics queries go to /api/metrics/query_range, not search"
                )
            spansets, trace_conds = traceql.simple or ((), ())
            sql = TraceQuery(start, end, spansets, trace_conds, limit, spss)
            return search_params, traceql, sql
        low = parse_duration(params["minDuration"]) if params.get("minDuration") else None
        high = parse_duration(params["maxDuration"]) if params.get("maxDuration") else None
        if (low or 0) < 0 or (high or 0) < 0:
            raise HTTPError(400, "minDuration and maxDuration are at least 0")
        if low and high and high < low:
            raise HTTPError(400, "maxDuration is shorter than minDuration")
        tags = parse_logfmt(params.get("tags", "")) or bare_tags
        return search_params, None, legacy_query(tags, start, end, low, high, limit)
    except QueryError as exc:
        raise HTTPError(400, str(exc)) from None


def search_json(state: ServerState, tenant: str, params: Mapping[str, str]) -> Dict[str, object]:
    """Tempo's ``SearchResponse`` for a search's parameters (``q`` or ``tags``, ``start``,
    ``end``, ``limit``, ``spss``...), in protobuf's JSON mapping; HTTPError (400) when the
    search cannot run.  Blocking: the store is read here."""
    search_params, traceql, sql = search_query(params)
    try:
        return trace_search.search(state.store, tenant, search_params, traceql, sql)
    except (SearchError, QueryError) as exc:
        raise HTTPError(400, str(exc)) from None


@text_errors
async def search(request: Request) -> Response:
    state, tenant = query_state(request)
    body = await run_in_threadpool(search_json, state, tenant, request.query_params)
    return JSONResponse(body)


def _tag_range(params: Mapping[str, str]) -> Tuple[int, int]:
    """The time range of a tag request narrowed by ``q``: start/end, by default the last day."""
    end = seconds_value(params, "end") or time.time_ns()
    start = seconds_value(params, "start")
    if start is None:
        start = end - DEFAULT_SEARCH_RANGE_NS
    if end <= start:
        raise HTTPError(400, "end must be after start")
    return start, end


def _narrowed(
    state: ServerState, tenant: str, params: Mapping[str, str]
) -> Optional[List[SpanRecord]]:
    """The spans ``q`` narrows the autocomplete to (the newest of the range, at most
    MAX_AUTOCOMPLETE_SPANS), or None when there is no ``q`` or it narrows nothing (see
    query.traceql.autocomplete): then every tag, as Tempo does."""
    conditions = narrowing_conditions(params.get("q", ""))
    if conditions is None:
        return None
    start, end = _tag_range(params)
    try:
        return state.store.span_records(
            tenant, start, end, conditions, limit=MAX_AUTOCOMPLETE_SPANS
        )
    except SearchError:
        return None  # a condition no span can be compared with (status > "x"): as unparsable


_TAG_SCOPES = frozenset(
    ("all", "none", "span", "resource", "intrinsic", "event", "link", "instrumentation", "trace")
)


# The scopes whose tags the spans' records do not carry (only the OTLP message does): the
# tag index answers for them, not narrowed by ``q`` or by a range in the past.
_INDEX_ONLY_SCOPES = ("event", "link", "instrumentation")
_INDEX_ONLY_INTRINSICS = frozenset(
    ("statusMessage", "event:name", "instrumentation:name", "instrumentation:version")
)
# The span intrinsics whose values are listed, by either name (``span:name``).
_SPAN_INTRINSICS = {
    **{name: name for name in ("name", "status", "kind")},
    **{f"span:{name}": name for name in ("name", "status", "kind", "statusMessage")},
}


def _tag_names(
    state: ServerState, tenant: str, params: Mapping[str, str]
) -> Tuple[Dict[str, List[str]], Optional[str]]:
    scope = params.get("scope") or None
    # TraceQL's scopes ("none": every scope, as "all"); the trace scope has no attribute
    # (Tempo's 400 is for a scope TraceQL does not have).
    if scope is not None and scope not in _TAG_SCOPES:
        raise HTTPError(
            400,
            "scope must be resource, span, intrinsic, event, link, instrumentation, trace or "
            f"none, not {scope!r}",
        )
    scope = None if scope in ("all", "none") else scope
    if scope in ("intrinsic", "trace"):
        return {}, scope  # their names are TraceQL's own, whatever the spans hold
    since = seconds_value(params, "start") or 0
    records = None if scope in _INDEX_ONLY_SCOPES else _asked_spans(state, tenant, params)
    if records is None:
        return state.store.tag_names(tenant, since), scope
    names = tag_names(records)
    if scope is None:
        indexed = state.store.tag_names(tenant, since)
        names.update({name: indexed.get(name, []) for name in _INDEX_ONLY_SCOPES})
    return names, scope


def _asked_spans(
    state: ServerState, tenant: str, params: Mapping[str, str]
) -> Optional[List[SpanRecord]]:
    """The spans a tag request's names and values come from: those ``q`` narrows to; else
    those of a range that ended over RECENT_END_NS ago (the newest MAX_AUTOCOMPLETE_SPANS:
    as Tempo, the range's names and values, not any seen since its start); else None, for
    the tag index to answer (much faster: a range ending about now)."""
    records = _narrowed(state, tenant, params)
    if records is not None:
        return records
    end = seconds_value(params, "end")
    if end is None or end >= time.time_ns() - RECENT_END_NS:
        return None
    start, end = _tag_range(params)
    return state.store.span_records(tenant, start, end, (), limit=MAX_AUTOCOMPLETE_SPANS)


def tag_names_json(
    state: ServerState, tenant: str, params: Mapping[str, str], version: int
) -> Dict[str, object]:
    """Tempo's ``SearchTagsResponse`` (version 1) or ``SearchTagsV2Response`` (2) for the tag
    endpoints' parameters (``scope``, ``limit``, ``q``, ``start``, ``end``), in protobuf's
    JSON mapping; HTTPError (400) for a bad parameter.  Blocking: the store is read here."""
    names, scope = _tag_names(state, tenant, params)
    # Tempo's ``limit``: at most this many names (v2: per scope; Grafana sends 5000, or its
    # data source's tag limit).
    limit = _int_param(params, "limit", 0) or None
    if version == 1:
        if scope == "intrinsic":
            out = list(INTRINSIC_TAGS)
        else:
            wanted = [scope] if scope else ["span", "resource"]
            out = sorted({n for s in wanted for n in names.get(s, [])})
        return {"tagNames": out[:limit]}
    scopes: List[Dict[str, object]] = []
    if scope in (None, "intrinsic"):
        scopes.append({"name": "intrinsic", "tags": list(INTRINSIC_TAGS)})
    for name in ("resource", "span") + _INDEX_ONLY_SCOPES:
        tags = names.get(name, [])[:limit]
        # Every scope asked for, and when none is, those with a name: as Tempo lists them.
        if scope == name or (scope is None and (tags or name in ("resource", "span"))):
            scopes.append({"name": name, "tags": tags})
    if scope == "trace":
        scopes.append({"name": scope, "tags": []})
    return {"scopes": scopes}


async def _answer(
    request: Request, answer: Callable[..., Dict[str, object]], *args: object
) -> Response:
    """The JSON of ``answer(state, tenant, *args)``, on a worker thread (it reads the store)."""
    state, tenant = query_state(request)
    body = await run_in_threadpool(answer, state, tenant, *args)
    return JSONResponse(body)


@text_errors
async def tags_v1(request: Request) -> Response:
    return await _answer(request, tag_names_json, request.query_params, 1)


@text_errors
async def tags_v2(request: Request) -> Response:
    return await _answer(request, tag_names_json, request.query_params, 2)


def _identifier(tag: str) -> Tuple[Optional[str], str]:
    """(scope or None for any, attribute name) of a TraceQL identifier (a quoted name, as
    ``span."a key"``, unquoted as TraceQL reads it)."""
    if '"' in tag:
        try:
            tokens = Lexer(tag).tokens
        except QueryError as exc:
            raise HTTPError(400, str(exc)) from None
        attribute = tokens[0][1] if len(tokens) == 2 else None
        if isinstance(attribute, Attribute):
            return attribute.scope or None, attribute.name
    for scope in ("resource", "span") + _INDEX_ONLY_SCOPES:
        if tag.startswith(scope + "."):
            return scope, tag[len(scope) + 1 :]
    if tag.startswith("."):
        return None, tag[1:]
    if tag in _SPAN_INTRINSICS or tag in _INDEX_ONLY_INTRINSICS:
        return "intrinsic", _SPAN_INTRINSICS.get(tag, tag)
    return None, tag


ROOT_SPAN = Condition("span:parentID", "=", "0" * 16)
# Tag values Tempo lists whatever the spans hold: version 1's virtual tags (added to what
# the spans have), version 2's enumerated intrinsics (all there is).
V1_VIRTUAL = {"status.code": {"unset", "ok", "error"}, "error": {"true"}}
_KINDS = ("client", "server", "producer", "consumer", "internal", "unspecified")
V2_KEYWORDS = {
    "status": ("ok", "error", "unset"),
    "span:status": ("ok", "error", "unset"),
    "kind": _KINDS,
    "span:kind": _KINDS,
}
# The trace intrinsics whose values are those of the traces' root spans: the field read.
ROOT_TAGS = {
    "rootServiceName": "service",
    "trace:rootService": "service",
    "rootName": "name",
    "trace:rootName": "name",
}


def _root_values(
    state: ServerState, tenant: str, params: Mapping[str, str], field: str
) -> List[Tuple[str, str]]:
    """The services or names of the range's root spans (the newest MAX_AUTOCOMPLETE_SPANS):
    what ``rootServiceName`` and ``rootName`` can equal; with a ``q`` that narrows, those of
    the traces of the spans it matches, as Tempo reads a trace-level intrinsic."""
    start, end = _tag_range(params)
    matched = _narrowed(state, tenant, params)
    trace_ids = None if matched is None else sorted({r.trace_id for r in matched})
    if trace_ids == []:
        return []
    roots = state.store.span_records(
        tenant, start, end, (ROOT_SPAN,), trace_ids=trace_ids, limit=MAX_AUTOCOMPLETE_SPANS
    )
    seen = sorted({getattr(r, field) for r in roots} - {""})
    limit = _int_param(params, "limit", MAX_LIMIT, zero_is_default=True)
    return [(value, "string") for value in seen][:limit]


def _values(
    state: ServerState, tenant: str, params: Mapping[str, str], scope: Optional[str], name: str
) -> List[Tuple[str, str]]:
    """(value, TraceQL type) of a tag, sorted, of the spans ``q`` narrows to if it does."""
    since = seconds_value(params, "start") or 0
    # As Tempo: limit=0 is no limit (the most hotspan answers).
    limit = _int_param(params, "limit", MAX_LIMIT, zero_is_default=True)
    values = state.store.tag_values(tenant, scope, name, since)
    # (Version 1 asks for any scope: its statusMessage is the intrinsic's too.)
    if scope in _INDEX_ONLY_SCOPES or (
        scope in (None, "intrinsic") and name in _INDEX_ONLY_INTRINSICS
    ):
        return values[:limit]
    records = _asked_spans(state, tenant, params)
    if records is not None:
        seen = tag_values(records, scope, name)
        if scope is None:  # an instrumentation scope's too, which the records do not carry
            seen |= {v for v, _ in state.store.tag_values(tenant, "instrumentation", name, since)}
        values = _typed(seen, values, scope, name)
    return values[:limit]


def _typed(
    seen: Set[str], indexed: List[Tuple[str, str]], scope: Optional[str], name: str
) -> List[Tuple[str, str]]:
    """Values read from spans (text) with the TraceQL types the tag index recorded for them
    when they were received (a value stored as int and as string keeps both); a value the
    index no longer has gets the type of its kind of tag."""
    kinds: Dict[str, List[str]] = {}
    for value, kind in indexed:
        if value in seen:
            kinds.setdefault(value, []).append(kind)
    default = "keyword" if scope == "intrinsic" and name in ("status", "kind") else "string"
    return sorted((value, kind) for value in seen for kind in kinds.get(value, [default]))


def tag_values_json(
    state: ServerState, tenant: str, tag: str, params: Mapping[str, str], version: int
) -> Dict[str, object]:
    """Tempo's ``SearchTagValuesResponse`` (version 1: any attribute of that name, values
    only) or ``SearchTagValuesV2Response`` (2: a TraceQL identifier, typed values) for the tag
    values endpoints' parameters (``limit``, ``q``, ``start``, ``end``), in protobuf's JSON
    mapping; HTTPError (400) for a bad parameter.  Blocking: the store is read here."""
    if version == 1:
        values = _values(state, tenant, params, None, tag)
        return {"tagValues": sorted({value for value, _ in values} | V1_VIRTUAL.get(tag, set()))}
    if tag in V2_KEYWORDS:
        # Every value TraceQL knows, without reading spans (Tempo answers these so).
        return {"tagValues": [{"type": "keyword", "value": v} for v in V2_KEYWORDS[tag]]}
    if tag in ROOT_TAGS:
        values = _root_values(state, tenant, params, ROOT_TAGS[tag])
    elif tag in ("duration", "traceDuration", "trace:duration"):
        values = []
    else:
        scope, name = _identifier(tag)
        values = _values(state, tenant, params, scope, name)
    return {"tagValues": [{"type": kind, "value": value} for value, kind in values]}


@text_errors
async def tag_values_v1(request: Request) -> Response:
    tag = request.path_params["tag"]
    return await _answer(request, tag_values_json, tag, request.query_params, 1)


@text_errors
async def tag_values_v2(request: Request) -> Response:
    tag = request.path_params["tag"]
    return await _answer(request, tag_values_json, tag, request.query_params, 2)


routes = [
    Route("/api/echo", echo, methods=["GET"]),
    Route("/api/status/buildinfo", buildinfo, methods=["GET"]),
    Route("/api/traces/{trace_id}", trace_v1, methods=["GET"]),
    Route("/api/v2/traces/{trace_id}", trace_v2, methods=["GET"]),
    Route("/api/search", search, methods=["GET"]),
    Route("/api/search/tags", tags_v1, methods=["GET"]),
    Route("/api/v2/search/tags", tags_v2, methods=["GET"]),
    # {tag:path}: an attribute name may hold a "/" (app.kubernetes.io/name), sent as %2F.
    Route("/api/search/tag/{tag:path}/values", tag_values_v1, methods=["GET"]),
    Route("/api/v2/search/tag/{tag:path}/values", tag_values_v2, methods=["GET"]),
]
