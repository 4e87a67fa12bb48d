"""What every command that talks to a server shares: its options, one HTTP client, and the
spelling of selectors, profile types and time ranges a user types.

Standard library only (urllib): the commands run wherever hotspan is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from hotspan.agent.config import DEFAULT_SERVER_ADDRESS
from hotspan.model.durations import DurationError, parse_seconds

if TYPE_CHECKING:
    import urllib.error

TIMEOUT_S = 60.0
CHUNK_BYTES = 256 * 1024


class CLIError(Exception):
    """A failure to report in one line; ``code`` is the exit status (2: bad arguments)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--server``, ``--token`` and ``--tenant``, as every client command takes them."""
    parser.add_argument(
        "--server",
        default=os.environ.get("HOTSPAN_SERVER") or DEFAULT_SERVER_ADDRESS,
        help="server URL (default %(default)s, or HOTSPAN_SERVER)",
    )
    parser.add_argument("--token", help="a query token (or HOTSPAN_QUERY_TOKEN)")
    parser.add_argument("--tenant", help="tenant (X-Scope-OrgID; default: the server's)")


class Client:
    """One server, its token and tenant: JSON and binary calls with one-line errors."""

    def __init__(self, server: str, token: Optional[str] = None, tenant: Optional[str] = None):
        if not server.startswith(("http://", "https://")):
            raise CLIError(f"--server {server!r} must be an http:// or https:// URL", 2)
        try:
            parts = urllib.parse.urlsplit(server)
            usable = bool(parts.hostname) and parts.port != 0
        except ValueError:  # http://[::1, a port that is no number
            usable = False
        if not usable or any(c.isspace() or not c.isprintable() for c in server):
            raise CLIError(f"--server {server!r} is not a usable URL", 2)
        self.server = server.rstrip("/")
        self.headers: Dict[str, str] = {}
        token = token or os.environ.get("HOTSPAN_QUERY_TOKEN")
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        if tenant:
            self.headers["X-Scope-OrgID"] = tenant

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Client:
        return cls(args.server, args.token, args.tenant)

    def url(self, path: str, query: Optional[Dict[str, Any]] = None) -> str:
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query, doseq=True)
        return url

    def json(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Optional[Dict[str, Any]] = None,
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        raw = self.bytes(method, path, data, query, headers)
        try:
            answer = json.loads(raw or b"null")
        except ValueError:
            raise CLIError(f"{method} {self.url(path)}: the answer is not JSON") from None
        # Every hotspan (and Pyroscope) API the commands call answers an object, or nothing.
        if answer is not None and not isinstance(answer, dict):
            raise CLIError(f"{method} {self.url(path)}: the answer is not a JSON object")
        return answer

    def bytes(
        self,
        method: str,
        path: str,
        data: Optional[bytes] = None,
        query: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None,
        progress: Optional[Callable[[int, Optional[int]], None]] = None,
    ) -> bytes:
        """The answer's body; ``progress(read, total)`` is called as it arrives (``total``
        None when the server does not say)."""
        # At the first request: `hotspan server` and the commands that only read files take
        # CLIError and the option types from here, and urllib.request would add ~50 ms to
        # each of their starts.
        import http.client
        import urllib.error
        import urllib.request

        url = self.url(path, query)
        request = urllib.request.Request(
            url, data=data, method=method, headers={**self.headers, **(headers or {})}
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                if progress is None:
                    return response.read()
                length = response.headers.get("Content-Length")
                total = int(length) if length and length.isdigit() else None
                chunks = []
                read = 0
                while True:
                    chunk = response.read(CHUNK_BYTES)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    read += len(chunk)
                    progress(read, total)
                return b"".join(chunks)
        except urllib.error.HTTPError as exc:
            raise CLIError(f"{method} {url}: {exc.code} {_reason(exc)}") from None
        except urllib.error.URLError as exc:
            raise CLIError(f"cannot reach {self.server}: {exc.reason}") from None
        except http.client.HTTPException as exc:
            # Not HTTP, or an answer cut short: a server (or something in its place) broken.
            text = str(exc).strip()
            detail = type(exc).__name__ + (f": {text[:80]!r}" if text else "")
            raise CLIError(f"{method} {url}: not a valid HTTP answer ({detail})") from None
        except (OSError, ValueError) as exc:
            raise CLIError(f"{method} {url}: {exc}") from None


def path_segment(text: str, what: str) -> str:
    """``text`` as one segment of an API path, quoted; CLIError (exit 2) naming ``what`` when
    it cannot be one: empty, or holding '/' (no route takes it)."""
    if not text.strip() or "/" in text:
        raise CLIError(f"{what} must not be empty nor hold '/': {text!r}", 2)
    return urllib.parse.quote(text, safe="")


def _reason(exc: urllib.error.HTTPError) -> str:
    try:
        text = exc.read().decode("utf-8", "replace")
    except OSError:
        return exc.reason or ""
    try:
        doc = json.loads(text)
        return str(doc.get("error") or doc.get("message") or doc)
    except (ValueError, AttributeError):
        # Whatever else answered (a proxy's HTML page): one line of it.
        return " ".join(text.split())[:300] or str(exc.reason)


# --- selectors -------------------------------------------------------------------------------

_SERVICE_PREFIX = re.compile(r"\s*([A-Za-z0-9_][A-Za-z0-9_.\-/]*)\s*(?=\{|$)")
_BARE_VALUE = re.compile(r"(=~|!~|!=|=)\s*([^\s\"'`,{}~=][^,{}]*?)\s*(?=,|\})")


def selector_query(text: str) -> str:
    """The server's selector for what a user typed.

    ``my-service{commit=abc123}`` (Pyroscope's CLI and docs: the service name in front, values
    unquoted) becomes ``{service_name="my-service", commit="abc123"}``; a selector already in
    the server's form is checked and kept.  Raises CLIError (exit 2) naming the problem.
    """
    from hotspan.model.labels import SelectorError, parse_selector

    text = text.strip()
    service = ""
    rest = text
    m = _SERVICE_PREFIX.match(text)
    if m:
        service, rest = m.group(1), text[m.end() :]
    # Quote bare values, as Pyroscope's own CLI lets users type them.
    rest = _BARE_VALUE.sub(lambda v: f'{v.group(1)}"{_escape(v.group(2))}"', rest)
    if service:
        braces = rest.strip()
        if braces and not braces.endswith("}"):
            problem = (
                f"unexpected {braces[braces.rindex('}') + 1 :]!r} after the labels"
                if "}" in braces
                else "the labels' '{' has no closing '}'"
            )
            raise CLIError(f"bad selector {text!r}: {problem}", 2)
        inner = braces[1:-1].strip()
        service_matcher = f'service_name="{_escape(service)}"'
        rest = "{" + service_matcher + (", " + inner if inner else "") + "}"
    try:
        selector = parse_selector(rest)
    except SelectorError as exc:
        reason = str(exc)
        if rest != text:  # positions are in the rewritten text: show that text, not the typed
            reason += f" of {rest!r}"
        raise CLIError(f"bad selector {text!r}: {reason}", 2) from None
    if selector.metric:
        raise CLIError(
            f'bad selector {text!r}: write it as service{{label="value"}} or '
            '{service_name="service", label="value"}',
            2,
        )
    return "{" + ", ".join(str(m) for m in selector.matchers) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


# --- profile types ---------------------------------------------------------------------------

# The names a user types, for the types hotspan's agent (and Pyroscope's SDKs) send.
PROFILE_TYPE_ALIASES = {
    "cpu": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
    "wall": "wall:wall:nanoseconds:wall:nanoseconds",
    "alloc_objects": "memory:alloc_objects:count:space:bytes",
    "alloc_space": "memory:alloc_space:bytes:space:bytes",
    "inuse_objects": "memory:inuse_objects:count:space:bytes",
    "inuse_space": "memory:inuse_space:bytes:space:bytes",
    "lock_count": "mutex:contentions:count:contentions:count",
    "lock_time": "mutex:delay:nanoseconds:contentions:count",
    "goroutines": "goroutines:goroutine:count:goroutine:count",
    "gil_wait": "gil_wait:gil_wait:nanoseconds:wall:nanoseconds",
    "gil_held": "gil_held:gil_held:nanoseconds:wall:nanoseconds",
}


def profile_type_id(text: str) -> str:
    """A full profile type id (``process_cpu:cpu:nanoseconds:cpu:nanoseconds``) for an alias
    or an id; CLIError (exit 2) for anything else."""
    from hotspan.model.profile import ProfileType, ProfileTypeError

    text = text.strip()
    if text in PROFILE_TYPE_ALIASES:
        return PROFILE_TYPE_ALIASES[text]
    try:
        return ProfileType.parse(text).id
    except ProfileTypeError:
        raise CLIError(
            f"unknown profile type {text!r}: use one of {', '.join(PROFILE_TYPE_ALIASES)} "
            "or a full id such as process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            2,
        ) from None


# --- time ------------------------------------------------------------------------------------


def duration_s(text: str) -> float:
    """``7d``, ``12h``, ``90m``, ``30s`` or combinations (``1d12h``); ``0`` or ``off``: 0.
    The argparse type of every duration option."""
    try:
        return parse_seconds(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def time_ms(text: str, now_ms: Optional[int] = None) -> int:
    """A point in time as a user writes it: ``now``, ``now-1h``, unix seconds or
    milliseconds, or an RFC 3339 / ISO 8601 date (``2026-11-25T10:00:00Z``)."""
    from datetime import datetime, timezone

    now = int(time.time() * 1000) if now_ms is None else now_ms
    raw = text.strip()
    low = raw.lower()
    if low == "now":
        return now
    if low.startswith("now-"):
        try:
            return now - int(duration_s(low[4:]) * 1000)
        except argparse.ArgumentTypeError:
            pass
    elif re.fullmatch(r"\d+(\.\d+)?", low):
        value = float(low)
        return int(value if value > 1e11 else value * 1000)  # ms, or s
    else:
        try:
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=timezone.utc)
            return int(parsed.timestamp() * 1000)
        except ValueError:
            pass
    raise CLIError(
        f"{text!r} is not a time: use now, now-1h, unix seconds, or 2026-11-25T10:00:00Z", 2
    )


@dataclass(frozen=True)
class TimeRange:
    start_ms: int
    end_ms: int


def add_time_options(parser: argparse.ArgumentParser, default: str = "1h") -> None:
    parser.add_argument(
        "--time-range",
        default=None,
        metavar="DURATION",
        help=f"the last DURATION (1h, 30m, 7d; default {default} when no --from is given)",
    )
    parser.add_argument("--from", dest="from_", metavar="TIME", help="start (now-2h, RFC 3339)")
    parser.add_argument("--until", metavar="TIME", help="end (default now)")
    parser.set_defaults(default_time_range=default)


def time_range(
    time_range_text: Optional[str],
    from_text: Optional[str],
    until_text: Optional[str],
    default: str = "1h",
    now_ms: Optional[int] = None,
    option_prefix: str = "",
) -> TimeRange:
    """The window of ``--time-range`` or ``--from``/``--until`` (CLIError, exit 2, when both
    are given, or the range is empty); ``option_prefix`` ("baseline-") names a side's own
    options in those messages."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    names = {o: f"--{option_prefix}{o}" for o in ("time-range", "from", "until")}
    if time_range_text and from_text:
        raise CLIError(
            f"give {names['time-range']} or {names['from']}/{names['until']}, not both", 2
        )
    end = time_ms(until_text, now) if until_text else now
    if from_text:
        start = time_ms(from_text, now)
    else:
        try:
            span = duration_s(time_range_text or default)
        except argparse.ArgumentTypeError as exc:
            raise CLIError(f"{names['time-range']}: {exc}", 2) from None
        if span <= 0:
            raise CLIError(f"{names['time-range']} must be longer than 0", 2)
        start = end - int(span * 1000)
    if start >= end:
        raise CLIError(
            f"the time range is empty: {names['from']} must be before {names['until']}", 2
        )
    return TimeRange(start, end)


def args_time_range(args: argparse.Namespace, prefix: str = "") -> TimeRange:
    """The range of ``args`` from :func:`add_time_options` (``prefix``: "baseline_" for a
    side's own ``--baseline-time-range``/``--baseline-from``/``--baseline-until``).

    A side's own start (its time range or its from) replaces the shared start whole, so that
    ``--time-range 1h --baseline-from now-1d`` is not "both"; its own until replaces the shared
    until; what the side does not give falls back to the shared options."""

    def get(name: str) -> Optional[str]:
        return getattr(args, name, None)

    span, start, end = get("time_range"), get("from_"), get("until")
    option_prefix = ""
    if prefix:
        own_span, own_start, own_end = (get(prefix + n) for n in ("time_range", "from_", "until"))
        if own_span is not None or own_start is not None:
            span, start = own_span, own_start
            option_prefix = prefix.replace("_", "-")
        if own_end is not None:
            end = own_end
    default = getattr(args, "default_time_range", "1h")
    return time_range(span, start, end, default, option_prefix=option_prefix)
