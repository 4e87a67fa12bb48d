"""``GET /api/traces/{traceID}/why``: why is this span slow (hotspan.query.why), as JSON.

Parameters: ``spanID`` (16 hex digits; default the trace's root span), ``profileType`` (the
type compared first; default CPU, and CPU and wall follow where stored), ``window`` (how far
back the baseline reaches from the span's end, a duration such as 24h or 90m; default 24h),
``baselineSpans`` (at most this many spans like it, nearest their median duration; default
50), ``limit`` (functions listed per profile type; default 20), ``maxNodes`` (flame graphs).

Integers too large for a JavaScript number (nanosecond durations) are strings, as in OTLP JSON.

``verdict``: "too-short" (a span under 50 ms: a few samples at 100 Hz cannot tell), "gc"
(garbage collections, the agent's ``[GC]`` frame, account for at least half of its extra
duration), "contended" (its extra time waiting for the GIL, the agent's GIL-wait profile, and
for a core, its wall samples with ``thread_state="cpu_wait"``, is at least half of its extra
duration; ``gilHolders`` are the functions of its service that held the GIL around its time,
from ``gilRange``'s start to its end, in seconds), "computing" (its
CPU, with its descendants', is at least 30 % of its duration), "waiting"
(less), "pending" (no samples of any type yet, or its wall profile holds under half its
duration, and it ended under 15 s ago: the agent's next upload may bring them), "no-profile"
(no samples of it of any type, or no CPU samples of it or of its baseline), "no-baseline" (no
other span like it in the window).

``split`` divides the span's duration (its descendants' samples included) into ``cpuNanos``,
``gilWaitNanos``, ``cpuWaitNanos`` and ``otherNanos`` (the rest: off CPU, asleep, in I/O,
waiting for a lock or another service); null without CPU or GIL-wait samples.  ``cpuWait`` is
the span's time waiting for a core beside its baseline's mean, null without wall samples.

Each profile's ``flamegraph`` is a diff: left the baseline's mean per span, right the span.
The mean of each stack is rounded to a whole unit, and a stack the baseline holds is at least
1 (for a count type, a stack rarer than once per span would otherwise vanish).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from google.protobuf import json_format
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.formats.proto import querier_pb2
from hotspan.model.profile import ProfileType
from hotspan.query.engine import QueryError
from hotspan.query.flamegraph import FlameGraph, to_message
from hotspan.query.traceql import parse_duration
from hotspan.query.why import (
    DEFAULT_BASELINE_SPANS,
    DEFAULT_FUNCTIONS,
    DEFAULT_WINDOW_NS,
    Delta,
    ProfileComparison,
    SpanNotFound,
    WhyAnswer,
    WhyEngine,
)
from hotspan.server.errors import HTTPError, text_errors
from hotspan.server.params import max_nodes_value, profile_type, span_id_param, trace_id_param
from hotspan.server.request import query_state

SEC = 10**9
MAX_WINDOW_NS = 31 * 86400 * SEC
MAX_COUNT = 1000


def _window(text: Optional[str]) -> int:
    if not text:
        return DEFAULT_WINDOW_NS
    try:
        window = parse_duration(text)
    except QueryError as exc:
        raise HTTPError(400, f"window: {exc}") from None
    if not 0 < window <= MAX_WINDOW_NS:
        raise HTTPError(400, f"window must be above 0 and at most 31 days, got {text[:40]!r}")
    return window


def _count(name: str, text: Optional[str], default: int) -> int:
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise HTTPError(400, f"{name} must be an integer, got {text[:40]!r}") from None
    if not 0 < value <= MAX_COUNT:
        raise HTTPError(400, f"{name} must be from 1 to {MAX_COUNT}, got {value}")
    return value


def diff_json(graph: FlameGraph) -> Dict[str, Any]:
    """A two-sided flame graph as the querier's FlameGraphDiff in protojson (as Diff answers
    it): what the UI's diff view draws; left is the baseline, right the span."""
    message = querier_pb2.FlameGraphDiff()
    to_message(graph, message)
    return json_format.MessageToDict(message)


def _delta(delta: Delta) -> Dict[str, Any]:
    return {"span": delta.span, "baseline": delta.baseline, "extra": delta.extra}


def _profile_json(profile: ProfileComparison) -> Dict[str, Any]:
    return {
        "profileType": profile.profile_type.id,
        "spanValue": profile.value.span,
        "baselineMean": profile.value.baseline,
        "extra": profile.value.extra,
        "functions": [
            {
                "name": f.name,
                "self": _delta(f.self_value),
                "total": _delta(f.total),
                "shareOfExtraDuration": f.share_of_extra_duration,
            }
            for f in profile.functions
        ],
        "flamegraph": diff_json(profile.flamegraph),
    }


def answer_json(answer: WhyAnswer) -> Dict[str, Any]:
    span, baseline = answer.span, answer.baseline
    return {
        "traceID": answer.trace_id,
        "spanID": f"{span.span_id:016x}",
        "service": span.service,
        "name": span.name,
        "durationNanos": str(span.duration_ns),
        "baseline": {
            "spans": len(baseline.spans),
            "start": baseline.start_ns // SEC,
            "end": -(-baseline.end_ns // SEC),  # rounded up: the range holds the last end
            "meanDurationNanos": str(baseline.mean_duration_ns),
            "medianDurationNanos": str(baseline.median_duration_ns),
        },
        "extraDurationNanos": str(answer.extra_duration_ns),
        "verdict": answer.verdict,
        "summary": answer.summary,
        "profiles": [_profile_json(p) for p in answer.profiles],
        "gilHolders": [{"name": h.name, "nanos": str(h.value)} for h in answer.gil_holders],
        "cpuWait": (
            None
            if answer.cpu_wait is None
            else {"span": answer.cpu_wait.span, "baselineMean": answer.cpu_wait.baseline}
        ),
        "split": (
            None
            if answer.split is None
            else {
                "durationNanos": str(answer.split.duration),
                "cpuNanos": str(answer.split.cpu),
                "gilWaitNanos": str(answer.split.gil_wait),
                "cpuWaitNanos": str(answer.split.cpu_wait),
                "otherNanos": str(answer.split.other),
            }
        ),
        "gilRange": {"start": answer.gil_range[0] // SEC, "end": -(-answer.gil_range[1] // SEC)},
    }


@text_errors
async def why(request: Request) -> Response:
    state, tenant = query_state(request)
    params = request.query_params
    trace_id = trace_id_param(request.path_params["trace_id"])
    span_id = span_id_param(params.get("spanID"))
    ptype: Optional[ProfileType] = None
    if params.get("profileType"):
        ptype = profile_type(params["profileType"])
    window = _window(params.get("window"))
    baseline_spans = _count("baselineSpans", params.get("baselineSpans"), DEFAULT_BASELINE_SPANS)
    limit = _count("limit", params.get("limit"), DEFAULT_FUNCTIONS)
    max_nodes = max_nodes_value(params.get("maxNodes"))
    engine = WhyEngine(state.store, state.engine)
    try:
        answer = await run_in_threadpool(
            engine.explain,
            tenant,
            trace_id,
            span_id,
            ptype,
            window,
            baseline_spans,
            limit,
            max_nodes,
        )
    except SpanNotFound as exc:
        raise HTTPError(404, str(exc)) from None
    except QueryError as exc:
        raise HTTPError(400, str(exc)) from None
    return JSONResponse(answer_json(answer))


routes = [Route("/api/traces/{trace_id}/why", why, methods=["GET"])]
