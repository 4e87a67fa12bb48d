"""Tempo's TraceQL metrics API: ``GET /api/metrics/query_range`` and ``/api/metrics/query``.

Parameters are read as Tempo's query frontend reads them (``pkg/api/http.go``): ``q`` (or
``query``), ``start``/``end`` as unix seconds, unix nanoseconds (more than 10 digits),
fractional seconds or RFC 3339, ``since`` (a Prometheus duration, 1 h by default) when
``start`` is absent, ``step`` as a Go duration or seconds (Tempo's default step when absent),
``exemplars`` (at most 100) and ``maxSeries``.  Answers are Tempo's ``QueryRangeResponse`` and
``QueryInstantResponse`` in protobuf's JSON mapping as Tempo writes it (gogo jsonpb): camelCase
names, 64-bit integers as strings, zero values and empty lists left out; or the protobuf
messages with ``Accept: application/protobuf``.  Errors are 400 with Tempo's reason as plain
text.

:func:`query_range_json` and :func:`query_instant_json` give the exact bodies, for the gRPC
``StreamingQuerier`` to turn into ``tempopb`` messages.
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.model.profile import MAX_TIME_NS
from hotspan.model.trace import SearchError
from hotspan.query import traceql
from hotspan.query.engine import QueryError
from hotspan.query.traceql import (
    MAX_EXEMPLARS,
    MAX_INTERVALS,
    MAX_SERIES,
    Duration,
    Labels,
    LabelValue,
    MetricsRequest,
    MetricsResult,
    default_step,
    go_duration,
)
from hotspan.server.errors import HTTPError, text_errors
from hotspan.server.params import parse_since
from hotspan.server.request import query_state
from hotspan.server.tempo.api import PROTOBUF

if TYPE_CHECKING:
    from hotspan.server.state import ServerState

SEC = 1_000_000_000
DEFAULT_SINCE_NS = 3600 * SEC
_RFC3339 = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d\d):(\d\d))"
)


# -- parameters --------------------------------------------------------------------------------


def parse_timestamp(name: str, text: str) -> int:
    """Tempo's ``start``/``end``: fractional seconds (to the millisecond), seconds (up to 10
    digits), nanoseconds (more), or RFC 3339; in nanoseconds."""
    if "." in text:
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if math.isfinite(seconds) and 0 <= seconds < MAX_TIME_NS / SEC:
            whole = math.floor(seconds)
            return whole * SEC + round((seconds - whole) * 1000) * 1_000_000
    if re.fullmatch(r"[0-9]+", text):
        value = int(text)
        ns = value * SEC if len(text) <= 10 else value
        if ns < MAX_TIME_NS:
            return ns
    m = _RFC3339.fullmatch(text)
    if m:
        try:
            year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
            moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
            if m.group(9):
                offset = timedelta(hours=int(m.group(10)), minutes=int(m.group(11)))
                moment -= offset if m.group(9) == "+" else -offset
            ns = int(moment.timestamp()) * SEC + int((m.group(7) or "0").ljust(9, "0"))
            if 0 <= ns < MAX_TIME_NS:
                return ns
        except ValueError:
            pass
    raise HTTPError(
        400,
        f"could not parse '{name}' parameter: {text[:60]!r} is not unix seconds, unix "
        "nanoseconds or an RFC 3339 time",
    )


def parse_step(text: str) -> int:
    """Tempo's ``step``: seconds (a number) or a Go duration, in nanoseconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not math.isfinite(seconds) or abs(seconds * SEC) >= 2.0**63:
            raise HTTPError(400, f'cannot parse "{text}" to a valid duration. It overflows int64')
        step = int(seconds * SEC)
    else:
        try:
            if text != text.strip():
                raise QueryError("Go reads no spaces around a duration")
            step = traceql.parse_duration(text)
        except QueryError:
            raise HTTPError(400, f'cannot parse "{text[:60]}" to a valid duration') from None
    if step < 0:
        raise HTTPError(400, f'cannot parse "{text}": step must be positive')
    return step


def _uint_param(params: Mapping[str, str], name: str) -> int:
    """An unsigned parameter; as Tempo, one that does not parse counts as absent."""
    text = params.get(name) or ""
    return int(text) if text.isdigit() and int(text) < 2**32 else 0


def metrics_request(
    params: Mapping[str, str], instant: bool, now_ns: Optional[int] = None
) -> Tuple[str, MetricsRequest]:
    """(TraceQL text, range) of a request, checked as Tempo's frontend checks it."""
    text = params.get("q") or params.get("query") or ""
    if not text.strip():
        raise HTTPError(400, "q is required: a TraceQL metrics query such as {} | rate()")
    now = time.time_ns() if now_ns is None else now_ns
    since = parse_since(params["since"]) if params.get("since") else DEFAULT_SINCE_NS
    end = parse_timestamp("end", params["end"]) if params.get("end") else now
    if params.get("start"):
        start = parse_timestamp("start", params["start"])
    else:
        start = max(min(end, now) - since, 0)
    if start >= end:
        raise HTTPError(400, "end must be greater than start")
    max_series = min(_uint_param(params, "maxSeries") or MAX_SERIES, MAX_SERIES)
    if instant or params.get("instant", "").lower() in ("1", "t", "true"):
        return text, MetricsRequest(start, end, end - start, True, 0, max_series)
    step = parse_step(params["step"]) if params.get("step") else default_step(start, end)
    if step == 0 or (end - start) // step > MAX_INTERVALS:
        minimum = (end - start) // MAX_INTERVALS
        raise HTTPError(
            400,
            f"step of {go_duration(step)} is too small, minimum step for given range is "
            f"{go_duration(minimum)}",
        )
    # 0 asks for the default; more than the bound gets the bound (Tempo's max_exemplars).
    exemplars = min(_uint_param(params, "exemplars") or MAX_EXEMPLARS, MAX_EXEMPLARS)
    return text, MetricsRequest(start, end, step, False, exemplars, max_series)


# -- answers ---------------------------------------------------------------------------------


def any_value(value: LabelValue) -> Dict[str, Any]:
    """A label value as Tempo's ``AnyValue`` JSON (int64 as a string)."""
    if isinstance(value, Duration):
        return {"stringValue": go_duration(int(value))}
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": _double(value)}
    return {"stringValue": str(value)}


def _double(value: float) -> Any:
    """A double as jsonpb writes it: integral values without a fraction, non-finite as text."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _go_float(value: float) -> str:
    """A double about as Go's text format writes it (shortest digits, no ``.0``); Python
    moves to an exponent later (1e16 against 1e6), which orders only buckets over 11 days
    differently."""
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def _sort_text(value: LabelValue) -> str:
    """A label value as gogo's text format writes an AnyValue (Tempo sorts series by it)."""
    if isinstance(value, Duration):
        return f'string_value:"{go_duration(int(value))}" '
    if isinstance(value, bool):
        return f"bool_value:{str(value).lower()} "
    if isinstance(value, int):
        return f"int_value:{value} "
    if isinstance(value, float):
        return f"double_value:{_go_float(value)} "
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'string_value:"{escaped}" '


def _series_order(labels: Labels) -> Tuple[int, List[Tuple[str, str]]]:
    """Tempo's order of series: fewer labels first, then by key and value, label by label."""
    return len(labels), [(k, _sort_text(v)) for k, v in labels]


def _labels_json(labels: Labels) -> List[Dict[str, Any]]:
    return [{"key": k, "value": any_value(v)} for k, v in labels]


def _metrics_json(result: MetricsResult) -> Dict[str, Any]:
    """``SearchMetrics``: the spans and traces read, as one job (zeros left out)."""
    out: Dict[str, Any] = {}
    if result.inspected_traces:
        out["inspectedTraces"] = result.inspected_traces
    out["completedJobs"] = 1
    out["totalJobs"] = 1
    if result.inspected_spans:
        out["inspectedSpans"] = str(result.inspected_spans)
    return out


def _with_status(body: Dict[str, Any], result: MetricsResult) -> Dict[str, Any]:
    body["metrics"] = _metrics_json(result)
    if result.partial:
        body["status"] = "PARTIAL"
        body["message"] = result.partial
    return body


def range_body(result: MetricsResult) -> Dict[str, Any]:
    """``QueryRangeResponse`` JSON: series with at least one sample, in Tempo's order."""
    series = []
    for s in sorted(result.series, key=lambda s: _series_order(s.labels)):
        samples = []
        for ts, value in zip(result.timestamps_ms.tolist(), s.values.tolist()):
            if not math.isnan(value):
                sample: Dict[str, Any] = {"timestampMs": str(ts)}
                if value != 0:
                    sample["value"] = _double(value)
                samples.append(sample)
        if not samples:
            continue
        entry: Dict[str, Any] = {"labels": _labels_json(s.labels), "samples": samples}
        if s.exemplars:
            entry["exemplars"] = [
                {
                    "labels": _labels_json(e.labels),
                    **({"value": _double(e.value)} if e.value != 0 else {}),
                    "timestampMs": str(e.timestamp_ms),
                }
                for e in s.exemplars
            ]
        series.append(entry)
    return _with_status({"series": series} if series else {}, result)


def instant_body(result: MetricsResult) -> Dict[str, Any]:
    """``QueryInstantResponse`` JSON: one value per series (Tempo's instant query is a range
    query of one step)."""
    series = []
    for s in sorted(result.series, key=lambda s: _series_order(s.labels)):
        if len(s.values) == 0 or math.isnan(s.values[0]):
            continue
        entry: Dict[str, Any] = {"labels": _labels_json(s.labels)}
        if s.values[0] != 0:
            entry["value"] = _double(float(s.values[0]))
        series.append(entry)
    return _with_status({"series": series} if series else {}, result)


def _run(state: ServerState, tenant: str, text: str, req: MetricsRequest) -> MetricsResult:
    try:
        expression = traceql.parse_metrics_expression(text)
        return traceql.run_metrics_expression(state.store, tenant, expression, req)
    except (QueryError, SearchError) as exc:
        raise HTTPError(400, str(exc)) from None


def query_range_json(state: ServerState, tenant: str, params: Mapping[str, str]) -> Dict:
    """The body of ``GET /api/metrics/query_range`` (HTTPError 400 for a bad request)."""
    text, req = metrics_request(params, instant=False)
    return range_body(_run(state, tenant, text, req))


def query_instant_json(state: ServerState, tenant: str, params: Mapping[str, str]) -> Dict:
    """The body of ``GET /api/metrics/query`` (HTTPError 400 for a bad request)."""
    text, req = metrics_request(params, instant=True)
    return instant_body(_run(state, tenant, text, req))


def _answer(request: Request, body: Dict, message: str) -> Response:
    """JSON, or protobuf when asked (``Accept: application/protobuf``, as Tempo serves)."""
    if PROTOBUF not in request.headers.get("accept", ""):
        return JSONResponse(body)
    from google.protobuf import json_format

    from hotspan.formats.proto import tempo_pb2

    proto = json_format.ParseDict(body, getattr(tempo_pb2, message)())
    return Response(proto.SerializeToString(), media_type=PROTOBUF)


@text_errors
async def query_range(request: Request) -> Response:
    state, tenant = query_state(request)
    params = dict(request.query_params)
    body = await run_in_threadpool(query_range_json, state, tenant, params)
    return _answer(request, body, "QueryRangeResponse")


@text_errors
async def query_instant(request: Request) -> Response:
    state, tenant = query_state(request)
    params = dict(request.query_params)
    body = await run_in_threadpool(query_instant_json, state, tenant, params)
    return _answer(request, body, "QueryInstantResponse")


routes = [
    Route("/api/metrics/query_range", query_range, methods=["GET"]),
    Route("/api/metrics/query", query_instant, methods=["GET"]),
]
