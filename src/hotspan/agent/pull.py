"""Pull mode: Go's ``net/http/pprof`` paths, answered from the running agent, so that
``go tool pprof http://app/debug/pprof/profile?seconds=5`` (or a scraper such as
``hotspan server --scrape`` or Grafana Alloy) reads this process as it reads a Go program.

- ``profile?seconds=N``: the CPU samples of the next N seconds.  Not a second sampler: the
  request registers a *tap* on the samples the agent's loop drains; the loop closes the
  sampler's window when a tap starts and when it ends (so a pull sees its own N seconds, and
  pushes just get a shorter window then), and copies the CPU samples of the windows in between
  to the taps.  Several pulls may run at once.
- ``heap``: alloc_* since the endpoints were set up and inuse_* now (Go's heap profile);
  ``allocs``: the same, alloc_space first; ``mutex``: lock contention since then.  The
  running totals are fed from every profile the collectors give the agent (once an upload
  interval); a request asks for a collection first, so it sees the last moment too.
- ``goroutine``: one look now at every thread and pending asyncio task.

Nothing here runs while nobody pulls, except adding each collectors' round (a handful of
stacks every upload interval) to the totals once the endpoints exist (:func:`enable`).
The request side is a generator (:func:`serve`) that yields what it waits for, so that the
ASGI app awaits (never blocking the program's event loop) and WSGI / the control port block
their own thread.
"""

from __future__ import annotations

import threading
import time

from hotspan.agent.collectors import (
    ALLOC_PERIOD_TYPE,
    ALLOC_TYPES,
    LOCK_PERIOD_TYPE,
    LOCK_TYPES,
    THREAD_PERIOD_TYPE,
    THREAD_TYPES,
)

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, Generator, List, Mapping, Optional, Tuple

    Answer = Tuple[int, str, bytes]  # HTTP status, content type, body
    Wait = Tuple[threading.Event, float]  # what a request waits for, and how long at most

PREFIX = "/debug/pprof"
DEFAULT_SECONDS = 30
MAX_SECONDS = 300
# Distinct stacks kept per running total; beyond, the rest is charged to one "other" stack so
# that totals stay what was measured.
MAX_STACKS = 20_000
OTHER = (("other", "", 0, 0),)
# How long a request waits for the agent's loop to collect or close a window beyond its own
# N seconds (the loop ticks every 0.1 s; a program holding the GIL can delay it).
LOOP_SLACK_S = 5.0
PPROF = "application/octet-stream"
TEXT = "text/plain; charset=utf-8"
PROFILES = ("profile", "heap", "allocs", "mutex", "goroutine")
DESCRIPTIONS = {
    "allocs": "A sampling of all memory allocations since the endpoints were set up",
    "goroutine": "Stack traces of all current threads and pending asyncio tasks",
    "heap": "A sampling of memory allocations of live objects (and all allocations)",
    "mutex": "Stack traces of waiters on contended threading and asyncio locks",
    "profile": "CPU profile; 'seconds' says how long (default 30)",
}

HUB: Optional[PullHub] = None
_hub_lock = threading.Lock()


def enable() -> PullHub:
    """The process's hub, made on first use: from then on the agent feeds it."""
    global HUB
    with _hub_lock:
        if HUB is None:
            HUB = PullHub()
        return HUB


class CpuTap:
    """One ``profile?seconds=N`` request: the CPU samples of the windows between two cuts."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.due = 0.0  # monotonic, set when the loop starts it
        self.start_ns = 0
        self.end_ns = 0
        self.period = 0
        self.samples: Dict[Tuple[Any, Any], int] = {}
        self.started = threading.Event()
        self.done = threading.Event()


class PullHub:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: List[CpuTap] = []
        self._active: List[CpuTap] = []
        # Running totals: leaf-first named stack -> values, in the sample types' order.
        self.allocs: Dict[Any, List[int]] = {}
        self.heap: Dict[Any, List[int]] = {}  # inuse, as of the last collection
        self.mutex: Dict[Any, List[int]] = {}
        self.alloc_period = 0
        self._waiters: List[threading.Event] = []

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._pending, self._active, self._waiters = [], [], []

    # ------------------------------------------------------------ the agent's loop

    def begin_cut(self) -> Optional[Tuple[List[CpuTap], List[CpuTap]]]:
        """(taps to start, taps to end) when the loop must close its window now, else None."""
        if not self._pending and not self._active:
            return None
        now = time.monotonic()
        with self._lock:
            starting = list(self._pending)
            ending = [t for t in self._active if now >= t.due]
        return (starting, ending) if starting or ending else None

    def feed_windows(self, outbox: Any, windows: List[Any], period: int) -> None:
        """CPU samples of windows the loop just drained, copied to the running taps."""
        active = self._active
        if not active:
            return
        from hotspan.agent.sampler import CPU

        names = outbox.named
        rows: Dict[Tuple[Any, Any], int] = {}
        for window in windows:
            for sample in window.samples:
                if sample.kind != CPU:
                    continue
                key = (names(sample.stack), _labels(outbox, sample.labels))
                rows[key] = rows.get(key, 0) + sample.value
        with self._lock:
            for tap in active:
                tap.period = period
                for key, value in rows.items():
                    tap.samples[key] = tap.samples.get(key, 0) + value

    def end_cut(self, cut: Tuple[List[CpuTap], List[CpuTap]]) -> None:
        starting, ending = cut
        now = time.monotonic()
        now_ns = time.time_ns()
        with self._lock:
            for tap in starting:
                self._pending.remove(tap)
                tap.due = now + tap.seconds
                tap.start_ns = now_ns
                self._active.append(tap)
                tap.started.set()
            for tap in ending:
                self._active.remove(tap)
                tap.end_ns = now_ns
                tap.done.set()

    def add_profiles(self, outbox: Any, profiles: List[Any]) -> None:
        """A collectors' round (alloc, locks), added to the running totals."""
        names = outbox.named
        for profile in profiles:
            types = tuple(profile.sample_types)
            if types == ALLOC_TYPES:
                heap: Dict[Any, List[int]] = {}
                with self._lock:
                    self.alloc_period = profile.period
                    for sample in profile.samples:
                        stack = names(sample.stack)
                        ao, asp, io, isp = sample.values
                        if ao or asp:
                            _add(self.allocs, stack, (ao, asp))
                        if io or isp:
                            _add(heap, stack, (io, isp))
                    self.heap = heap  # the live heap is a snapshot, not a sum
            elif types == LOCK_TYPES:
                with self._lock:
                    for sample in profile.samples:
                        _add(self.mutex, names(sample.stack), sample.values)

    def collected(self) -> None:
        """The loop finished a collectors' round: requests waiting for one go on."""
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.set()

    # ------------------------------------------------------------ requests

    def add_tap(self, tap: CpuTap) -> None:
        with self._lock:
            self._pending.append(tap)

    def drop_tap(self, tap: CpuTap) -> None:
        with self._lock:
            for taps in (self._pending, self._active):
                if tap in taps:
                    taps.remove(tap)

    def next_collection(self) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._waiters.append(event)
        return event

    def totals(self, name: str) -> Dict[Any, List[int]]:
        with self._lock:
            return {k: list(v) for k, v in getattr(self, name).items()}


def _add(table: Dict[Any, List[int]], stack: Any, values: Any) -> None:
    entry = table.get(stack)
    if entry is None:
        if len(table) >= MAX_STACKS:
            stack = OTHER
            entry = table.get(stack)
        if entry is None:
            table[stack] = list(values)
            return
    for i, v in enumerate(values):
        entry[i] += v


def _labels(outbox: Any, raw: Any) -> Tuple[Tuple[str, str], ...]:
    # The labels a push would carry (tags, span and trace ids), conditions aside: a pulled
    # profile has every sample.
    try:
        labels = outbox.labels(raw, None)
    except Exception:  # noqa: BLE001 - labels are a nicety, the sample is not
        labels = None
    return labels if labels is not None else ()


# ---------------------------------------------------------------- serving


def _agent() -> Any:
    from hotspan.agent.current import current_agent

    return current_agent()


def _error(status: int, message: str) -> Answer:
    return status, TEXT, (message + "\n").encode()


def parse_seconds(query: Mapping[str, str], default: int) -> Tuple[Optional[int], str]:
    """(seconds, "") or (None, why not) for the ``seconds`` query parameter."""
    text = query.get("seconds")
    if text is None or text == "":
        return default, ""
    try:
        seconds = int(text)
    except ValueError:
        return None, f"seconds={text!r} is not a whole number of seconds"
    if not 1 <= seconds <= MAX_SECONDS:
        return None, f"seconds={seconds} must be between 1 and {MAX_SECONDS}"
    return seconds, ""


def _unavailable(agent: Any, name: str) -> Optional[Answer]:
    """Why the agent cannot answer profile ``name``, or None if it can."""
    if agent is None:
        return _error(503, "hotspan is not running in this process (call hotspan.configure)")
    settings = agent.live.effective()
    if not settings["enabled"]:
        return _error(503, "profiling is disabled in this process (enable it through control)")
    types = settings.get("profile_types", ())
    needs = {"profile": "cpu", "heap": "alloc", "allocs": "alloc", "mutex": "locks"}
    needs["goroutine"] = "threads"
    wanted = needs[name]
    if wanted not in types:
        return _error(404, f"the {wanted} profile is turned off in this agent, so {name} is too")
    if name == "profile":
        spec = agent._sampler_spec
        if spec is None or not spec[1]:
            return _error(503, "the CPU sampler is not running now (load shedding?)")
    elif name != "goroutine" and wanted not in agent.collectors:
        return _error(
            404, f"the {wanted} profile cannot be taken here (see the agent's log), so {name}"
        )
    return None


def index() -> Answer:
    lines = ["hotspan /debug/pprof/", "", "Types of profiles available:"]
    for name in PROFILES:
        lines.append(f"  {name:<10} {PREFIX}/{name}  {DESCRIPTIONS[name]}")
    lines += ["", "Read with: go tool pprof http://HOST:PORT/debug/pprof/profile?seconds=5"]
    return 200, TEXT, ("\n".join(lines) + "\n").encode()


def serve(path: str, query: Mapping[str, str]) -> Generator[Wait, None, Answer]:
    """Answers ``path`` (below ``/debug/pprof``, e.g. ``/profile``); yields what it waits for."""
    name = path.strip("/")
    if name in ("", "index"):
        return index()
    if name not in PROFILES:
        return _error(404, f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    hub = enable()
    agent = _agent()
    problem = _unavailable(agent, name)
    if problem is not None:
        return problem
    if name == "goroutine":
        if query.get("seconds"):
            return _error(400, "seconds is not supported for goroutine (it is a snapshot)")
        return _goroutine(agent, query)
    default = DEFAULT_SECONDS if name == "profile" else 0
    seconds, why = parse_seconds(query, default)
    if seconds is None:
        return _error(400, why)
    if name == "profile":
        answer = yield from _cpu(agent, hub, seconds)
        return answer
    # Totals, after a collection (so the last moments count); with seconds, what changed.
    table = "mutex" if name == "mutex" else "allocs"
    yield _collect(agent, hub)
    before = hub.totals(table)
    if seconds:
        deadline = time.monotonic() + seconds
        yield threading.Event(), seconds  # nothing sets it: a plain wait
        if time.monotonic() < deadline:
            return _error(503, "interrupted")
        yield _collect(agent, hub)
        before = _delta(hub.totals(table), before)
    if name == "mutex":
        return 200, PPROF, _encode(LOCK_TYPES, LOCK_PERIOD_TYPE, 1, before)
    heap = hub.totals("heap")
    rows: Dict[Any, List[int]] = {s: v + [0, 0] for s, v in before.items()}
    for stack, (io, isp) in heap.items():
        rows.setdefault(stack, [0, 0, 0, 0])[2:] = [io, isp]
    period = hub.alloc_period or int(agent.live.effective()["alloc_sample_bytes"])
    # Go's allocs profile shows alloc_space first: its heap profile, inuse_space.
    default_type = "alloc_space" if name == "allocs" else ""
    return 200, PPROF, _encode(ALLOC_TYPES, ALLOC_PERIOD_TYPE, period, rows, default_type)


def _collect(agent: Any, hub: PullHub) -> Wait:
    event = hub.next_collection()
    agent.collect_soon()
    return event, LOOP_SLACK_S


def _delta(after: Dict[Any, List[int]], before: Dict[Any, List[int]]) -> Dict[Any, List[int]]:
    out = {}
    for stack, values in after.items():
        old = before.get(stack)
        diff = values if old is None else [max(a - b, 0) for a, b in zip(values, old)]
        if any(diff):
            out[stack] = diff
    return out


def _cpu(agent: Any, hub: PullHub, seconds: int) -> Generator[Wait, None, Answer]:
    tap = CpuTap(seconds)
    hub.add_tap(tap)
    try:
        yield tap.started, LOOP_SLACK_S
        if not tap.started.is_set():
            return _error(503, "the agent's loop did not start the profile (is it running?)")
        yield tap.done, seconds + LOOP_SLACK_S
        if not tap.done.is_set():
            return _error(503, "the agent's loop did not finish the profile in time")
    finally:
        hub.drop_tap(tap)
    from hotspan.agent.pprof_writer import ProfileWriter

    period = tap.period or 1_000_000_000 // max(1, agent._rate)
    writer = ProfileWriter(("cpu", "nanoseconds"), ("cpu", "nanoseconds"), period)
    for (stack, labels), value in tap.samples.items():
        writer.add(stack, value, labels)
    return 200, PPROF, writer.encode(tap.start_ns, max(tap.end_ns - tap.start_ns, 0))


def _goroutine(agent: Any, query: Mapping[str, str]) -> Answer:
    from hotspan.agent.collectors.threads import ThreadsCollector
    from hotspan.agent.symbols import Symbolizer

    snapshot = ThreadsCollector(agent.config.max_depth).snapshot()
    # A symbolizer of our own: the agent's is its loop's, and this runs on a request's thread.
    redact = agent.outbox.redact if agent.outbox.redact else None
    names = Symbolizer(redact).name_stack
    rows: Dict[Tuple[Any, Any], int] = {}
    for sample in snapshot.samples:
        key = (names(sample.stack), _labels(agent.outbox, sample.labels))
        rows[key] = rows.get(key, 0) + sample.values[0]
    if query.get("debug", "0") not in ("", "0"):
        return 200, TEXT, _goroutine_text(rows)
    from hotspan.agent.pprof_writer import ProfileWriter

    writer = ProfileWriter(THREAD_TYPES[0], THREAD_PERIOD_TYPE, 1)
    for (stack, labels), n in rows.items():
        writer.add(stack, n, labels)
    return 200, PPROF, writer.encode(time.time_ns(), 0)


def _goroutine_text(rows: Dict[Tuple[Any, Any], int]) -> bytes:
    """``goroutine?debug=1``: Go's readable form, stacks by count."""
    out = [f"goroutine profile: total {sum(rows.values())}"]
    for (stack, labels), n in sorted(rows.items(), key=lambda kv: -kv[1]):
        tags = " ".join(f"{k}={v}" for k, v in labels)
        out.append(f"{n} @" + (f" # labels: {tags}" if tags else ""))
        for name, filename, line, _ in stack:
            out.append(f"#\t{name}\t{filename}:{line}")
        out.append("")
    return ("\n".join(out) + "\n").encode()


def _encode(
    types: Any,
    period_type: Any,
    period: int,
    rows: Dict[Any, List[int]],
    default_sample_type: str = "",
) -> bytes:
    from hotspan.agent.pprof_writer import ProfileWriter

    writer = ProfileWriter(types, period_type, period)
    for stack, values in rows.items():
        writer.add(stack, values)
    return writer.encode(time.time_ns(), 0, default_sample_type)


# ---------------------------------------------------------------- drivers and HTTP glue


def _step(gen: Generator[Wait, None, Answer]) -> Tuple[bool, Any]:
    # StopIteration must not cross a Future (asyncio turns it into RuntimeError).
    try:
        return False, gen.send(None)
    except StopIteration as stop:
        return True, stop.value


def answer(path: str, query: Mapping[str, str]) -> Answer:
    """Serves a request on the calling thread (WSGI, the control port), waiting on it."""
    gen = serve(path, query)
    while True:
        finished, value = _step(gen)
        if finished:
            return value
        event, timeout = value
        event.wait(timeout)


async def answer_async(path: str, query: Mapping[str, str]) -> Answer:
    """Serves a request from an event loop: the short steps run in the loop's executor, the
    waits (N seconds of CPU) are awaited, so the program's loop never blocks."""
    import asyncio

    loop = asyncio.get_running_loop()
    gen = serve(path, query)
    while True:
        finished, value = await loop.run_in_executor(None, _step, gen)
        if finished:
            return value
        event, timeout = value
        deadline = loop.time() + timeout
        while not event.is_set() and loop.time() < deadline:
            await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))


def split_query(text: str) -> Dict[str, str]:
    from urllib.parse import parse_qsl

    return dict(parse_qsl(text, keep_blank_values=True))


def subpath(path: str) -> Optional[str]:
    """What follows ``/debug/pprof`` in ``path`` ("" for the index), or None."""
    if path == PREFIX or path.startswith(PREFIX + "/"):
        return path[len(PREFIX) :]
    return None


UNAUTHORIZED: Answer = (401, TEXT, b"missing or invalid token\n")


def headers(content_type: str, body: bytes, status: int) -> List[Tuple[str, str]]:
    headers = [("Content-Type", content_type), ("Content-Length", str(len(body)))]
    if content_type == PPROF:
        headers.append(("Content-Disposition", 'attachment; filename="profile"'))
    if status == 401:
        headers.append(("WWW-Authenticate", 'Basic realm="hotspan"'))
    return headers


def asgi_app(token: Optional[str] = None) -> Any:
    """An ASGI application answering ``/debug/pprof/...``, to mount at ``/debug/pprof``
    (Starlette ``Mount("/debug/pprof", app)``, FastAPI ``app.mount(...)``) or at the root.
    ``token``: requests must carry it (Bearer, or Basic with it as password)."""
    from hotspan.agent.control import authorized, serve_lifespan

    enable()

    async def app(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if await serve_lifespan(scope, receive, send) or scope["type"] != "http":
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        # Mounted: Starlette leaves the full path (root_path holds the mount point).
        if root and path.startswith(root):
            path = path[len(root) :]
        rest = subpath(path)
        if rest is None:
            rest = path  # mounted at /debug/pprof, with a server that strips the prefix
        sent = {k.lower(): v for k, v in scope.get("headers", ())}
        if scope.get("method", "GET") not in ("GET", "HEAD"):
            result: Answer = (405, TEXT, b"use GET\n")
        elif not authorized(sent.get(b"authorization", b"").decode("latin-1"), token, basic=True):
            result = UNAUTHORIZED
        else:
            query = split_query(scope.get("query_string", b"").decode("latin-1"))
            result = await answer_async(rest, query)
        status, ctype, body = result
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (k.lower().encode(), v.encode()) for k, v in headers(ctype, body, status)
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def wsgi_app(token: Optional[str] = None) -> Any:
    """A WSGI application answering ``/debug/pprof/...`` (mounted there, e.g. with werkzeug's
    ``DispatcherMiddleware``, or at the root).  A CPU profile blocks its request's thread for
    the N seconds it covers."""
    from hotspan.agent.control import authorized, status_line

    enable()

    def app(environ: Dict[str, Any], start_response: Any) -> List[bytes]:
        path = environ.get("PATH_INFO", "")
        rest = subpath(environ.get("SCRIPT_NAME", "") + path)
        if rest is None:
            rest = path
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            result: Answer = (405, TEXT, b"use GET\n")
        elif not authorized(environ.get("HTTP_AUTHORIZATION", ""), token, basic=True):
            result = UNAUTHORIZED
        else:
            result = answer(rest, split_query(environ.get("QUERY_STRING", "")))
        status, ctype, body = result
        start_response(status_line(status), headers(ctype, body, status))
        return [body]

    return app
