"""Query parameters several APIs read alike: trace and span ids, unix seconds, profile
types, label selectors, the flame graph's node limit.  Each refuses a bad value with an
HTTPError (400) that names the parameter."""

from __future__ import annotations

import re
import time
from typing import Mapping, Optional, Tuple

from starlette.requests import Request

from hotspan.model.labels import Selector, SelectorError, parse_selector
from hotspan.model.profile import MAX_TIME_NS, ProfileType, ProfileTypeError, span_id_to_int
from hotspan.query.engine import DEFAULT_MAX_NODES
from hotspan.server.errors import HTTPError

SEC = 10**9
# As Pyroscope's -querier.max-flamegraph-nodes-max: a request for more nodes is refused
# (-querier.max-flamegraph-nodes-default is DEFAULT_MAX_NODES, 8192).
MAX_NODES_LIMIT = 1 << 20


def trace_id_param(text: str) -> str:
    """A trace id from a path: hex, any case, left-padded to 32 digits as Tempo does."""
    text = text.strip().lower()
    if not text or len(text) > 32 or any(c not in "0123456789abcdef" for c in text):
        raise HTTPError(400, f"trace id {text[:40]!r} is not up to 32 hex digits")
    return text.rjust(32, "0")


def seconds_param(request: Request, name: str) -> Optional[int]:
    """``seconds_value`` of a request's query string, for the endpoints that hold a Request."""
    return seconds_value(request.query_params, name)


def seconds_value(params: Mapping[str, str], name: str) -> Optional[int]:
    """A parameter in unix seconds, as nanoseconds; None when absent or empty."""
    text = params.get(name)
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


def span_id_param(text: Optional[str]) -> Optional[int]:
    """A ``spanID`` parameter: 16 hex digits as an unsigned span id; None when not given."""
    if not text:
        return None
    if len(text) != 16 or any(c not in "0123456789abcdefABCDEF" for c in text):
        raise HTTPError(400, f"spanID {text[:40]!r} is not 16 hex digits")
    return span_id_to_int(text)


def profile_type(text: str) -> ProfileType:
    try:
        return ProfileType.parse(text)
    except ProfileTypeError as exc:
        raise HTTPError(400, str(exc)) from None


def selector(text: str) -> Selector:
    try:
        return parse_selector(text)
    except SelectorError as exc:
        raise HTTPError(400, f"bad label selector {text!r}: {exc}") from None


def check_max_nodes(value: int) -> int:
    """A request's max nodes as Pyroscope's querier takes it: 0 is the default
    (DEFAULT_MAX_NODES), over MAX_NODES_LIMIT or negative is an invalid_argument that names
    the limit."""
    if value == 0:
        return DEFAULT_MAX_NODES
    if value > MAX_NODES_LIMIT:
        raise HTTPError(
            400, f"max flamegraph nodes limit {value} is greater than allowed {MAX_NODES_LIMIT}"
        )
    if value < 0:
        raise HTTPError(
            400, f"max flamegraph nodes limit must be set (max allowed {MAX_NODES_LIMIT})"
        )
    return value


def max_nodes_value(text: Optional[str], name: str = "maxNodes") -> int:
    """``maxNodes`` (or ``max-nodes``) from a query string: absent or 0 is the default."""
    if not text:
        return DEFAULT_MAX_NODES
    try:
        value = int(text)
    except ValueError:
        raise HTTPError(400, f"{name} must be an integer, got {text!r}") from None
    return check_max_nodes(value)


def time_range(request: Request, default_ns: int) -> Tuple[int, int]:
    """``start``/``end`` in unix seconds as nanoseconds: ``end`` now and ``start``
    ``default_ns`` before it when not given; a 400 unless end is after start."""
    end = seconds_param(request, "end") or time.time_ns()
    start = seconds_param(request, "start")
    if start is None:
        start = end - default_ns
    if start < 0 or end <= start:
        raise HTTPError(400, "invalid time range: end must be after start (unix seconds)")
    return start, end


_SEC = 10**9
# A Prometheus duration, as Tempo reads ``since``: ``15m``, ``1h30m``, ``2d``.
_PROM_DURATION = re.compile(
    r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?"
)
_PROM_UNITS_NS = [
    365 * 24 * 3600 * _SEC,
    7 * 24 * 3600 * _SEC,
    24 * 3600 * _SEC,
    3600 * _SEC,
    60 * _SEC,
    _SEC,
    1_000_000,
]


def parse_since(text: str) -> int:
    """A Prometheus duration (``15m``, ``1h30m``, ``2d``) in nanoseconds."""
    m = _PROM_DURATION.fullmatch(text) if len(text) <= 64 else None
    if text == "0":
        return 0
    if not text or m is None or not any(m.groups()):
        raise HTTPError(
            400, f"could not parse 'since' parameter: not a valid duration string: {text[:60]!r}"
        )
    return sum(int(g) * unit for g, unit in zip(m.groups(), _PROM_UNITS_NS) if g)
