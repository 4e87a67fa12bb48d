"""``querier.v1.QuerierService`` over Connect: what Grafana's Pyroscope data source calls.

Exemplars (the profiles or spans behind a timeline point or a heatmap cell) name a profile
by an id that ``profile_id_selector`` takes back: Grafana's "View profile" link on an exemplar
asks SelectMergeStacktraces for that one profile (see :mod:`hotspan.query.exemplars`).
"""

from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from google.protobuf.message import Message
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from hotspan.formats.proto import querier_pb2, types_pb2
from hotspan.model.profile import MAX_TIME_NS, ProfileType, span_id_to_int
from hotspan.query.engine import QueryError
from hotspan.query.exemplars import Exemplar
from hotspan.query.flamegraph import FlameGraph, to_message
from hotspan.query.heatmap import Heatmap
from hotspan.server.errors import HTTPError
from hotspan.server.params import check_max_nodes, profile_type, selector
from hotspan.server.pyroscope.connect import read_message, unary, write_message
from hotspan.server.request import query_state
from hotspan.server.state import ServerState
from hotspan.store.base import SampleFilter, StackValues

SERVICE = "/querier.v1.QuerierService"
M = TypeVar("M", bound=Message)
MS = 1_000_000
DEFAULT_RANGE_MS = 3600 * 1000
# Longer steps than this would carry point times past 64-bit nanoseconds.
MAX_STEP_S = 10 * 366 * 86400
# Points of a series (time slots of a heatmap) in one answer.
MAX_STEPS = 100_000
# Cells (time slots x value buckets, over every series) of one heatmap answer.
MAX_HEATMAP_CELLS = 2_000_000


def check_steps(start_ns: int, end_ns: int, step_ns: int) -> None:
    """A 400 when a range has over MAX_STEPS steps: its answer would be that many points
    (and a heatmap 20 cells for each)."""
    if (end_ns - start_ns) // step_ns > MAX_STEPS:
        raise HTTPError(400, f"step is too small for the time range (over {MAX_STEPS:,} points)")


def check_heatmap_cells(
    maps: Sequence[Heatmap], lows: Sequence[int], max_cells: int = MAX_HEATMAP_CELLS
) -> None:
    """A 400 when heatmaps have over ``max_cells`` cells: each non-empty slot of a series is
    sent with a count per value bucket.  Within MAX_STEPS, many series (``group_by``) still
    make many: ``limit`` or a longer step narrows them."""
    cells = sum(len(hm.slots) for hm in maps) * len(lows)
    if cells > max_cells:
        raise HTTPError(
            400,
            f"the heatmap has too many cells ({cells:,}, over {max_cells:,}): use a longer "
            "step, a shorter range, a limit or fewer group_by labels",
        )


def time_range(start_ms: int, end_ms: int) -> Tuple[int, int]:
    """Milliseconds from the request to nanoseconds; 0/0 means the last hour."""
    if start_ms == 0 and end_ms == 0:
        end_ms = time.time_ns() // MS
        start_ms = end_ms - DEFAULT_RANGE_MS
    if end_ms == 0:
        end_ms = time.time_ns() // MS
    if start_ms < 0 or end_ms <= start_ms or end_ms > MAX_TIME_NS // MS:
        raise HTTPError(400, f"invalid time range: start {start_ms} ms, end {end_ms} ms")
    return start_ms * MS, end_ms * MS


def max_nodes(msg, field: str = "max_nodes") -> int:
    """A message's ``max_nodes``: absent or 0 is the default."""
    return check_max_nodes(getattr(msg, field) if msg.HasField(field) else 0)


def pprof_max_nodes(msg) -> Optional[int]:
    """A pprof request's ``max_nodes``: absent or 0 is the whole profile (a pprof export
    must not be cut, which is why Pyroscope leaves this limit off by default); otherwise
    checked as every max nodes, and the profile truncated into ``other`` nodes."""
    if not msg.HasField("max_nodes") or msg.max_nodes == 0:
        return None
    return check_max_nodes(msg.max_nodes)


def span_ids(texts: Sequence[str]) -> List[int]:
    out = []
    for text in texts:
        if len(text) != 16:
            raise HTTPError(400, f"span id {text!r} is not 16 hex digits")
        try:
            out.append(span_id_to_int(text))
        except ValueError:
            raise HTTPError(400, f"span id {text!r} is not 16 hex digits") from None
    return out


async def _run(fn: Callable, *args):
    try:
        return await run_in_threadpool(fn, *args)
    except QueryError as exc:
        raise HTTPError(400, str(exc)) from None


@unary
async def profile_types(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.ProfileTypesRequest)
    start, end = time_range(req.start, req.end)
    types = await _run(state.engine.profile_types, tenant, start, end)
    resp = querier_pb2.ProfileTypesResponse()
    for t in types:
        resp.profile_types.add(
            ID=t.id,
            name=t.name,
            sample_type=t.sample_type,
            sample_unit=t.sample_unit,
            period_type=t.period_type,
            period_unit=t.period_unit,
        )
    return write_message(request, resp)


@unary
async def label_names(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, types_pb2.LabelNamesRequest)
    start, end = time_range(req.start, req.end)
    names = await _run(state.engine.label_names, tenant, list(req.matchers), start, end)
    return write_message(request, types_pb2.LabelNamesResponse(names=names))


@unary
async def label_values(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, types_pb2.LabelValuesRequest)
    if not req.name:
        raise HTTPError(400, "name is required")
    start, end = time_range(req.start, req.end)
    values = await _run(state.engine.label_values, tenant, req.name, list(req.matchers), start, end)
    return write_message(request, types_pb2.LabelValuesResponse(names=values))


@unary
async def series(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.SeriesRequest)
    start, end = time_range(req.start, req.end)
    found = await _run(
        state.engine.series_labels, tenant, list(req.matchers), list(req.label_names), start, end
    )
    resp = querier_pb2.SeriesResponse()
    for labels in found:
        resp.labels_set.add().labels.extend(
            types_pb2.LabelPair(name=k, value=v) for k, v in sorted(labels.items())
        )
    return write_message(request, resp)


def selected_span_ids(selector: Sequence[str]) -> Optional[List[int]]:
    """A request's span selector, checked: None when it names no span (no filter)."""
    return span_ids(selector) if len(selector) else None


def selected_trace_ids(selector: Sequence[str]) -> Optional[List[str]]:
    """A request's trace id selector, checked: None when it names no trace (no filter)."""
    if not len(selector):
        return None
    traces = list(selector)
    for t in traces:
        if len(t) != 32 or not all(c in "0123456789abcdefABCDEF" for c in t):
            raise HTTPError(400, f"trace id {t!r} is not 32 hex digits")
    return traces


async def _stack_values(
    state: ServerState,
    tenant: str,
    type_id: str,
    label_selector: str,
    start_ms: int,
    end_ms: int,
    spans: Optional[List[int]] = None,
    req=None,  # the request: trace/profile ids, call site
) -> Tuple[ProfileType, SampleFilter, StackValues]:
    ptype = profile_type(type_id)
    sel = selector(label_selector)
    start, end = time_range(start_ms, end_ms)
    traces = selected_trace_ids(req.trace_id_selector) if req is not None else None
    where = SampleFilter(start, end, span_ids=spans, trace_ids=traces)
    profile_ids = list(req.profile_id_selector) if req is not None else []
    if profile_ids:  # the profiles behind exemplars ("View profile" in Grafana)
        values = await _run(
            state.engine.profile_stack_values, tenant, ptype, sel, where, profile_ids
        )
    else:
        values = await _run(state.engine.stack_values, tenant, ptype, sel, where)
    if req is not None and req.HasField("stack_trace_selector"):
        call_site = [loc.name for loc in req.stack_trace_selector.call_site]
        values = await _run(state.engine.filter_call_site, values, call_site)
    return ptype, where, values


async def _answer(request: Request, build: Callable[[], Message]) -> Response:
    """The message built and serialized on a worker thread: a flame graph of many nodes
    takes long enough to encode (protojson above all) to stall every other request."""
    return await run_in_threadpool(lambda: write_message(request, build()))


def _flamegraph_message(graph: FlameGraph, cls: Callable[[], M]) -> Callable[[], M]:
    def build() -> M:
        resp = cls()
        to_message(graph, resp.flamegraph)  # type: ignore[attr-defined]
        return resp

    return build


async def _graph_answer(
    request: Request,
    state: ServerState,
    values: StackValues,
    limit: int,
    tree: bool,
    cls: Callable[..., Message],
) -> Response:
    """The merged stacks as Pyroscope's serialized tree (``tree``) or as a flame graph, in a
    ``cls`` message (both built off the event loop)."""
    if tree:
        serialized = await _run(state.engine.tree, values, limit)
        return await _answer(request, lambda: cls(tree=serialized))
    graph = await _run(state.engine.flamegraph, values, limit)
    return await _answer(request, _flamegraph_message(graph, cls))


@unary
async def select_merge_stacktraces(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.SelectMergeStacktracesRequest)
    fmt = req.format
    if fmt not in (
        querier_pb2.PROFILE_FORMAT_UNSPECIFIED,
        querier_pb2.PROFILE_FORMAT_FLAMEGRAPH,
        querier_pb2.PROFILE_FORMAT_TREE,
        querier_pb2.PROFILE_FORMAT_PPROF,
    ):
        raise HTTPError(
            400, "only the flamegraph, tree and pprof formats are supported", "invalid_argument"
        )
    # Checked before any data is read, as Pyroscope does; pprof is whole unless asked.
    pprof = fmt == querier_pb2.PROFILE_FORMAT_PPROF
    pprof_limit = pprof_max_nodes(req) if pprof else None
    graph_limit = 0 if pprof else max_nodes(req)
    spans = selected_span_ids(req.span_selector)
    ptype, where, values = await _stack_values(
        state, tenant, req.profile_typeID, req.label_selector, req.start, req.end, spans, req
    )
    resp = querier_pb2.SelectMergeStacktracesResponse()
    if pprof:
        profile = await _run(state.engine.pprof, ptype, values, where, pprof_limit)

        def with_profile() -> Message:
            resp.pprof.profile.CopyFrom(profile)  # a copy of every message in it
            return resp

        return await _answer(request, with_profile)
    tree = fmt == querier_pb2.PROFILE_FORMAT_TREE
    return await _graph_answer(
        request, state, values, graph_limit, tree, querier_pb2.SelectMergeStacktracesResponse
    )


@unary
async def select_merge_span_profile(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.SelectMergeSpanProfileRequest)
    limit = max_nodes(req)
    if not req.span_selector:
        raise HTTPError(400, "span_selector must list at least one span id")
    spans = span_ids(req.span_selector)
    if req.include_descendants:
        spans = await _run(state.traces.with_descendants, tenant, spans)
    _, _, values = await _stack_values(
        state, tenant, req.profile_typeID, req.label_selector, req.start, req.end, spans
    )
    # As Pyroscope: the tree when asked for, a flame graph for every other format.
    tree = req.format == querier_pb2.PROFILE_FORMAT_TREE
    return await _graph_answer(
        request, state, values, limit, tree, querier_pb2.SelectMergeSpanProfileResponse
    )


@unary
async def select_merge_profile(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.SelectMergeProfileRequest)
    limit = pprof_max_nodes(req)
    ptype, where, values = await _stack_values(
        state, tenant, req.profile_typeID, req.label_selector, req.start, req.end, None, req
    )
    profile = await _run(state.engine.pprof, ptype, values, where, limit)
    return await _answer(request, lambda: profile)


def exemplar_kind(value: int, allowed: Sequence[str] = ("individual", "span")) -> Optional[str]:
    """A request's ``exemplar_type``: None (none wanted), "individual" or "span"."""
    if value in (types_pb2.EXEMPLAR_TYPE_UNSPECIFIED, types_pb2.EXEMPLAR_TYPE_NONE):
        return None
    kind: Dict[int, str] = {
        types_pb2.EXEMPLAR_TYPE_INDIVIDUAL: "individual",
        types_pb2.EXEMPLAR_TYPE_SPAN: "span",
    }
    if value not in kind:
        raise HTTPError(400, f"unknown exemplar type: {value}")
    if kind[value] not in allowed:
        raise HTTPError(400, f"{kind[value]} exemplars only available for {kind[value]} query type")
    return kind[value]


def exemplar_message(ex: Exemplar, out: types_pb2.Exemplar) -> None:
    out.timestamp = ex.timestamp_ms
    out.value = ex.value
    out.profile_id = ex.profile_id
    out.span_id = ex.span_hex
    out.trace_id = ex.trace_id or ""
    out.labels.extend(types_pb2.LabelPair(name=k, value=v) for k, v in sorted(ex.labels.items()))


@unary
async def select_series(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.SelectSeriesRequest)
    ptype = profile_type(req.profile_typeID)
    sel = selector(req.label_selector)
    start, end = time_range(req.start, req.end)
    # As Pyroscope: a step under a millisecond is refused, not rounded up.
    if not math.isfinite(req.step) or req.step < 0.001:
        raise HTTPError(400, f"step must be >= 1ms, got {req.step}")
    if req.step > MAX_STEP_S:
        raise HTTPError(400, f"step must be at most {MAX_STEP_S} seconds, got {req.step}")
    step_ns = int(req.step * 1e9)
    check_steps(start, end, step_ns)
    average = (
        req.HasField("aggregation")
        and req.aggregation == types_pb2.TIME_SERIES_AGGREGATION_TYPE_AVERAGE
    )
    if req.HasField("limit") and req.limit < 0:
        raise HTTPError(400, f"limit must be non-negative, got {req.limit}")
    limit = req.limit if req.HasField("limit") else None
    # Pyroscope answers "span" as unimplemented; hotspan names each point's largest span.
    exemplars = exemplar_kind(req.exemplar_type)
    found = await _run(
        state.engine.select_series,
        tenant,
        ptype,
        sel,
        # The UI's timeline of one trace or span plots what its flame graph shows.
        SampleFilter(
            start,
            end,
            span_ids=selected_span_ids(req.span_selector),
            trace_ids=selected_trace_ids(req.trace_id_selector),
        ),
        step_ns,
        list(req.group_by),
        average,
        limit,
        exemplars,
    )
    resp = querier_pb2.SelectSeriesResponse()
    for ts in found:
        out = resp.series.add()
        out.labels.extend(
            types_pb2.LabelPair(name=k, value=v) for k, v in sorted(ts.labels.items())
        )
        for i, (t, v) in enumerate(zip(ts.timestamps_ms, ts.values)):
            point = out.points.add(timestamp=t, value=v)
            for ex in ts.exemplars[i] if ts.exemplars else ():
                exemplar_message(ex, point.exemplars.add())
    return write_message(request, resp)


HEATMAP_TYPES = {
    querier_pb2.HEATMAP_QUERY_TYPE_INDIVIDUAL: "individual",
    querier_pb2.HEATMAP_QUERY_TYPE_SPAN: "span",
}


@unary
async def select_heatmap(request: Request) -> Response:
    """Profiles (or spans within them) counted per time slot and value bucket, with the
    largest of each cell as its exemplar: Grafana's heatmap and exemplar views."""
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.SelectHeatmapRequest)
    if not math.isfinite(req.step) or req.step < 0.001:
        raise HTTPError(400, f"step must be >= 1ms, got {req.step}")
    if req.step > MAX_STEP_S:
        raise HTTPError(400, f"step must be at most {MAX_STEP_S} seconds, got {req.step}")
    if req.HasField("limit") and req.limit < 0:
        raise HTTPError(400, f"limit must be non-negative, got {req.limit}")
    kind = HEATMAP_TYPES.get(req.query_type)
    if kind is None:
        raise HTTPError(400, "valid heatmap query type must be specified")
    # As Pyroscope: exemplars only of the kind of point the heatmap counts.
    exemplars = exemplar_kind(req.exemplar_type, (kind,))
    ptype = profile_type(req.profile_typeID)
    sel = selector(req.label_selector)
    start, end = time_range(req.start, req.end)
    step_ms = int(req.step * 1000)
    check_steps(start, end, step_ms * MS)
    maps, lows = await _run(
        state.engine.heatmap,
        tenant,
        ptype,
        sel,
        start // MS,
        end // MS,
        step_ms,
        list(req.group_by),
        kind == "span",
        exemplars is not None,
        req.limit or None,
    )
    check_heatmap_cells(maps, lows)
    resp = querier_pb2.SelectHeatmapResponse()
    for hm in maps:
        out = resp.series.add()
        out.labels.extend(
            types_pb2.LabelPair(name=k, value=v) for k, v in sorted(hm.labels.items())
        )
        for slot in hm.slots:
            msg = out.slots.add(timestamp=slot.timestamp_ms, y_min=lows, counts=slot.counts)
            for ex in slot.exemplars:
                exemplar_message(ex, msg.exemplars.add())
    return write_message(request, resp)


@unary
async def diff(request: Request) -> Response:
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.DiffRequest)
    if not req.left.profile_typeID or not req.right.profile_typeID:
        raise HTTPError(400, "left and right selections both need a profile_typeID")
    # As Pyroscope: the larger of the two sides' max nodes, checked before any data is read.
    limit = check_max_nodes(max(req.left.max_nodes, req.right.max_nodes))
    # Each side is a SelectMergeStacktracesRequest and is narrowed the same way: by label
    # selector, trace ids and span ids (the UI compares two spans or two traces this way).
    sides = []
    for side in (req.left, req.right):
        _, _, values = await _stack_values(
            state,
            tenant,
            side.profile_typeID,
            side.label_selector,
            side.start,
            side.end,
            selected_span_ids(side.span_selector),
            side,
        )
        sides.append(values)
    left, right = sides
    graph = await _run(state.engine.diff, left, right, limit)
    return await _answer(request, _flamegraph_message(graph, querier_pb2.DiffResponse))


@unary
async def get_profile_stats(request: Request) -> Response:
    """Whether the tenant has any data, and its time span (Grafana asks before querying)."""
    state, tenant = query_state(request)
    await read_message(request, state.config, types_pb2.GetProfileStatsRequest)
    records = state.store.series(tenant)
    resp = types_pb2.GetProfileStatsResponse(data_ingested=bool(records))
    if records:
        resp.oldest_profile_time = min(r.first_ts for r in records) // MS
        resp.newest_profile_time = max(r.last_ts for r in records) // MS
    return write_message(request, resp)


# The scope AnalyzeQuery names per store: hotspan reads one store, no blocks or replicas.
_STORE_SCOPES = {"DuckDBStore": "Embedded store (DuckDB)", "ClickHouseStore": "ClickHouse"}


@unary
async def analyze_query(request: Request) -> Response:
    """What a query would read, in Pyroscope's shape: one scope for hotspan's store (series,
    profiles and the bytes they take in the range) and the query's impact.  As Pyroscope, no
    range (start or end 0) answers an empty analysis."""
    state, tenant = query_state(request)
    req = await read_message(request, state.config, querier_pb2.AnalyzeQueryRequest)
    resp = querier_pb2.AnalyzeQueryResponse()
    if req.start == 0 or req.end == 0:
        return write_message(request, resp)
    start, end = time_range(req.start, req.end)
    sel = selector(req.query) if req.query.strip() else None
    found = await _run(state.engine.analyze, tenant, sel, start, end)
    store = type(state.store).__name__
    resp.query_scopes.add(
        component_type=_STORE_SCOPES.get(store, store),
        component_count=1,
        series_count=found.series,
        profile_count=found.profiles,
        profile_bytes=found.bytes,
    )
    resp.query_impact.total_bytes_in_time_range = found.bytes
    resp.query_impact.total_queried_series = found.queried_series
    return write_message(request, resp)


routes = [
    Route(f"{SERVICE}/ProfileTypes", profile_types, methods=["POST"]),
    Route(f"{SERVICE}/LabelNames", label_names, methods=["POST"]),
    Route(f"{SERVICE}/LabelValues", label_values, methods=["POST"]),
    Route(f"{SERVICE}/Series", series, methods=["POST"]),
    Route(f"{SERVICE}/SelectMergeStacktraces", select_merge_stacktraces, methods=["POST"]),
    Route(f"{SERVICE}/SelectMergeSpanProfile", select_merge_span_profile, methods=["POST"]),
    Route(f"{SERVICE}/SelectMergeProfile", select_merge_profile, methods=["POST"]),
    Route(f"{SERVICE}/SelectSeries", select_series, methods=["POST"]),
    Route(f"{SERVICE}/SelectHeatmap", select_heatmap, methods=["POST"]),
    Route(f"{SERVICE}/Diff", diff, methods=["POST"]),
    Route(f"{SERVICE}/GetProfileStats", get_profile_stats, methods=["POST"]),
    Route(f"{SERVICE}/AnalyzeQuery", analyze_query, methods=["POST"]),
]
