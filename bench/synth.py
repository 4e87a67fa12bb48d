"""Synthetic but realistically shaped Python profiling data.

Frames look like what py-spy / the Pyroscope Python SDK report: ``module.qualname`` names,
absolute file names (application code under /app, libraries under site-packages), line
numbers.  Stacks are grown from a common bootstrap prefix (``<module>`` -> runpy -> uvicorn
-> asyncio event loop) by copying a random prefix of an existing stack and extending it, so
they share prefixes the way real programs' stacks do.
"""

from __future__ import annotations

import gzip
from typing import List, Sequence, Tuple

import numpy as np

FrameT = Tuple[str, str, int]  # (name, filename, line)

SITE = "/usr/local/lib/python3.11/site-packages"
STDLIB = "/usr/local/lib/python3.11"

BOOTSTRAP: List[FrameT] = [
    ("<module>", "/app/main.py", 12),
    ("runpy._run_module_as_main", f"{STDLIB}/runpy.py", 198),
    ("runpy._run_code", f"{STDLIB}/runpy.py", 88),
    ("uvicorn.main.run", f"{SITE}/uvicorn/main.py", 577),
    ("uvicorn.server.Server.run", f"{SITE}/uvicorn/server.py", 65),
    ("asyncio.runners.run", f"{STDLIB}/asyncio/runners.py", 190),
    (
        "asyncio.base_events.BaseEventLoop.run_until_complete",
        f"{STDLIB}/asyncio/base_events.py",
        640,
    ),
    ("asyncio.base_events.BaseEventLoop.run_forever", f"{STDLIB}/asyncio/base_events.py", 607),
    ("asyncio.base_events.BaseEventLoop._run_once", f"{STDLIB}/asyncio/base_events.py", 1922),
    ("asyncio.events.Handle._run", f"{STDLIB}/asyncio/events.py", 80),
]

_PACKAGES = [
    # (top-level package, file root, submodules)
    (
        "app",
        "/app/app",
        [
            "api",
            "api.handlers",
            "services",
            "services.billing",
            "models",
            "db",
            "cache",
            "auth",
            "tasks",
            "utils",
            "serializers",
            "views",
        ],
    ),
    (
        "starlette",
        f"{SITE}/starlette",
        [
            "routing",
            "middleware.errors",
            "middleware.base",
            "requests",
            "responses",
            "applications",
            "concurrency",
        ],
    ),
    ("fastapi", f"{SITE}/fastapi", ["routing", "dependencies.utils", "encoders", "applications"]),
    (
        "sqlalchemy",
        f"{SITE}/sqlalchemy",
        [
            "orm.session",
            "orm.query",
            "orm.loading",
            "engine.base",
            "engine.default",
            "sql.compiler",
            "sql.elements",
            "engine.cursor",
            "orm.context",
        ],
    ),
    ("pydantic", f"{SITE}/pydantic", ["main", "fields", "validators", "json"]),
    ("json", f"{STDLIB}/json", ["encoder", "decoder", "__init__"]),
    ("asyncio", f"{STDLIB}/asyncio", ["tasks", "streams", "selector_events", "locks"]),
    ("httpx", f"{SITE}/httpx", ["_client", "_transports.default", "_models", "_content"]),
    ("redis", f"{SITE}/redis", ["client", "connection", "commands.core"]),
    ("logging", f"{STDLIB}/logging", ["__init__", "handlers"]),
    ("psycopg2", f"{SITE}/psycopg2", ["extras", "extensions"]),
    ("re", f"{STDLIB}/re", ["__init__", "_parser", "_compiler"]),
]

_CLASSES = [
    "Session",
    "Query",
    "Connection",
    "Engine",
    "Router",
    "Route",
    "Request",
    "Response",
    "Client",
    "Handler",
    "Serializer",
    "Model",
    "Cursor",
    "Compiler",
    "Encoder",
    "Decoder",
    "Pool",
    "Validator",
    "Task",
    "Middleware",
    "Service",
    "Repository",
]
_VERBS = [
    "get",
    "set",
    "load",
    "save",
    "execute",
    "fetch",
    "render",
    "encode",
    "decode",
    "validate",
    "dispatch",
    "handle",
    "call",
    "run",
    "process",
    "build",
    "parse",
    "compile",
    "send",
    "recv",
    "read",
    "write",
    "commit",
    "flush",
    "iter",
    "apply",
]
_NOUNS = [
    "",
    "_all",
    "_one",
    "_row",
    "_rows",
    "_items",
    "_request",
    "_response",
    "_user",
    "_invoice",
    "_order",
    "_batch",
    "_payload",
    "_headers",
    "_body",
    "_cache",
    "_query",
    "_result",
    "_context",
    "_params",
    "_json",
    "_chunk",
    "_stream",
    "_session",
]


def frame_universe(rng: np.random.Generator, n: int) -> List[FrameT]:
    """``n`` distinct frames (plus the bootstrap frames first)."""
    out: List[FrameT] = list(BOOTSTRAP)
    seen = set(out)
    while len(out) < n:
        pkg, root, subs = _PACKAGES[int(rng.integers(len(_PACKAGES)))]
        sub = subs[int(rng.integers(len(subs)))]
        module = f"{pkg}.{sub}" if pkg != sub else pkg
        verb = _VERBS[int(rng.integers(len(_VERBS)))] + _NOUNS[int(rng.integers(len(_NOUNS)))]
        if rng.random() < 0.6:
            cls = _CLASSES[int(rng.integers(len(_CLASSES)))]
            qual = f"{cls}.{'_' if rng.random() < 0.3 else ''}{verb}"
        else:
            qual = verb
        filename = f"{root}/{sub.replace('.', '/')}.py"
        frame = (f"{module}.{qual}", filename, int(rng.integers(1, 1500)))
        if frame not in seen:
            seen.add(frame)
            out.append(frame)
    return out


def grow_stacks(
    rng: np.random.Generator,
    n: int,
    n_frames: int,
    min_depth: int,
    max_depth: int,
    prefix: Sequence[int] = tuple(range(len(BOOTSTRAP))),
    frame_lo: int = len(BOOTSTRAP),
) -> List[Tuple[int, ...]]:
    """``n`` distinct root-first stacks of frame indexes in ``[frame_lo, n_frames)`` (after the
    common ``prefix``).  Each new stack copies a random-length prefix of an earlier one, so
    the result is a bushy tree: a few hot trunks, many leaves."""
    stacks: List[Tuple[int, ...]] = []
    seen = set()
    base = tuple(prefix)
    span = n_frames - frame_lo
    # Callees cluster: a frame's children come from a window near it, like a module's helpers.
    while len(stacks) < n:
        depth = int(rng.integers(min_depth, max_depth + 1))
        if stacks and rng.random() < 0.97:
            parent = stacks[int(rng.integers(len(stacks)))]
            limit = min(len(parent), depth) - 1
            lo = len(base)
            cut = int(lo + (limit - lo) * rng.beta(2.0, 1.2)) if limit > lo else lo
            stack = list(parent[:cut])
        else:
            stack = list(base)
        cur = stack[-1] if len(stack) > len(base) else int(frame_lo + rng.integers(span))
        while len(stack) < depth:
            cur = frame_lo + (cur - frame_lo + int(rng.integers(-40, 41))) % span
            stack.append(cur)
        key = tuple(stack)
        if key not in seen:
            seen.add(key)
            stacks.append(key)
    return stacks


def zipf_weights(n: int, s: float = 1.1, offset: float = 5.0) -> np.ndarray:
    w = 1.0 / (np.arange(n) + offset) ** s
    return w / w.sum()


# -- pprof ---------------------------------------------------------------------------------

PERIOD_NS = 10_000_000  # 100 Hz


class PprofTemplate:
    """A set of stacks over a frame universe, serialised to pprof with chosen values."""

    def __init__(self, frames: Sequence[FrameT], stacks: Sequence[Tuple[int, ...]]) -> None:
        self.frames = frames
        self.stacks = list(stacks)

    def build(
        self, stack_indexes: Sequence[int], ticks: Sequence[int], time_ns: int, duration_ns: int
    ) -> bytes:
        """Gzipped pprof; ``ticks[i]`` samples at 100 Hz for ``stacks[stack_indexes[i]]``."""
        from hotspan.formats.proto import profile_pb2

        prof = profile_pb2.Profile()
        strings = {"": 0}
        table = [b""]

        def s(text: str) -> int:
            idx = strings.get(text)
            if idx is None:
                idx = strings[text] = len(table)
                table.append(text.encode())
            return idx

        cpu, ns = s("cpu"), s("nanoseconds")
        prof.sample_type.add(type=cpu, unit=ns)
        prof.period_type.type = cpu
        prof.period_type.unit = ns
        prof.period = PERIOD_NS
        prof.time_nanos = time_ns
        prof.duration_nanos = duration_ns
        prof.mapping.add(id=1, filename=s("python"), has_functions=True)
        functions = {}
        locations = {}
        for idx, count in zip(stack_indexes, ticks):
            loc_ids = []
            for f in reversed(self.stacks[idx]):  # pprof: leaf first
                loc = locations.get(f)
                if loc is None:
                    name, filename, line = self.frames[f]
                    fkey = (name, filename)
                    fn = functions.get(fkey)
                    if fn is None:
                        fn = functions[fkey] = len(functions) + 1
                        prof.function.add(
                            id=fn, name=s(name), system_name=s(name), filename=s(filename)
                        )
                    loc = locations[f] = len(locations) + 1
                    location = prof.location.add(id=loc, mapping_id=1)
                    location.line.add(function_id=fn, line=line)
                loc_ids.append(loc)
            prof.sample.add(location_id=loc_ids, value=[int(count) * PERIOD_NS])
        prof.string_table.extend(table)
        return gzip.compress(prof.SerializeToString(), compresslevel=6)
