"""Allocations and live heap in real programs: each test runs a program with the agent (and
real OpenTelemetry SDK spans) pushing to a real server, and reads the memory profiles back
through the query API, against the truth the program measures itself (``sys.getsizeof`` of
what it allocated or kept)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Dict

import httpx
import pytest

from hotspan._speedups import load_module, load_sampler
from tests.agent.test_agent import run_program
from tests.helpers import flamegraph, function_totals

ALLOC_SPACE = "memory:alloc_space:bytes:space:bytes"
ALLOC_OBJECTS = "memory:alloc_objects:count:space:bytes"
INUSE_SPACE = "memory:inuse_space:bytes:space:bytes"

native_only = pytest.mark.skipif(
    load_sampler() is None or load_module("_alloc") is None,
    reason="the allocator hook (_speedups/alloc/) is not built",
)


def configure(url: str, service: str, **extra: object) -> str:
    settings = {
        "application_name": service,
        "server_address": url,
        "upload_interval": 1,
        "locks": False,
        "threads": False,
        **extra,
    }
    args = ", ".join(f"{k}={v!r}" for k, v in settings.items())
    return f"agent = hotspan.configure({args})\n"


def profile(
    client: httpx.Client, service: str, ptype: str, selector: str = "", **extra: object
) -> Dict[str, int]:
    """Total per function (and the whole under "<total>") of the service's profile."""
    now = int(time.time())
    labels = f'service_name="{service}"' + (", " + selector if selector else "")
    graph = flamegraph(client, "{" + labels + "}", now - 600, now + 60, ptype, **extra)
    out = function_totals(graph)
    out["<total>"] = int(graph.get("total", 0) or 0)
    return out


@native_only
def test_alloc_space_splits_as_the_program_allocated(module_server, tmp_path: Path) -> None:
    service = f"alloc_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(module_server.url, service, alloc_sample_bytes=64 * 1024)
        + """
# Each iteration allocates the bytearray and its buffer.  The loop counts with repeat(), not
# range(): range's ints come from a free list on 3.14 and from the allocator before.
from itertools import repeat
SIZE = sys.getsizeof(bytearray(2048))
def alloc_a(n):
    for _ in repeat(None, n):
        bytearray(2048)
def alloc_b(n):
    for _ in repeat(None, n):
        bytearray(2048)
end = time.monotonic() + 1.5
rounds = 0
while time.monotonic() < end or rounds < 20:  # spans several uploads
    alloc_a(15000)
    alloc_b(5000)
    rounds += 1
stats = agent.collector_stats()
hotspan.shutdown()
report(a=rounds * 15000 * SIZE, b=rounds * 5000 * SIZE, a_allocations=rounds * 15000 * 2,
       stats=stats)
""",
        otel=False,
    )
    with module_server.client() as client:
        space = profile(client, service, ALLOC_SPACE)
        objects = profile(client, service, ALLOC_OBJECTS)
    a, b = space.get("__main__.alloc_a", 0), space.get("__main__.alloc_b", 0)
    assert a and b, (space, result)
    assert abs(a / (a + b) - 0.75) < 0.02, (a, b)
    # Scaled samples are estimates of all allocations, not just of their shares.
    assert abs(a / result["a"] - 1) < 0.05 and abs(b / result["b"] - 1) < 0.05, (a, b, result)
    count_a = objects.get("__main__.alloc_a", 0) / result["a_allocations"]
    assert 0.8 < count_a < 1.2, (objects, result)
    assert result["stats"]["alloc"]["samples"] > 5000
    # The agent's own threads encode and upload every second: none of that is the program's.
    # (hotspan.configure itself runs on the program's thread, and is the program's call.)
    threads = ("hotspan.agent.core.Agent._run", "hotspan.agent.uploader.Uploader._run")
    agents = [f for f in space if f in threads or f.startswith(("http.", "urllib."))]
    assert not agents, agents


LEAK = """
keep = []
def leak(n):
    for _ in range(n):
        keep.append(bytearray(8192))
def churn(n):
    for _ in range(n):
        bytearray(8192)
for _ in range(20):  # ~1.6 MB a second for 2 s
    leak(20)
    churn(20)
    time.sleep(0.1)
kept = sum(sys.getsizeof(b) for b in keep) + sys.getsizeof(keep) - sys.getsizeof([])
churned = 400 * sys.getsizeof(bytearray(8192))
collectors, stats = agent.collectors, agent.collector_stats()
hotspan.shutdown()
report(kept=kept, churned=churned, collector=collectors, stats=stats)
"""


def _check_leak(client: httpx.Client, service: str, result: dict) -> None:
    inuse = profile(client, service, INUSE_SPACE)
    alloc = profile(client, service, ALLOC_SPACE)
    leaked = inuse.get("__main__.leak", 0)
    assert abs(leaked / result["kept"] - 1) < 0.10, (leaked, result, inuse)
    # What was freed again is not live, but it was allocated.
    assert inuse.get("__main__.churn", 0) < 0.02 * leaked, inuse
    assert abs(alloc.get("__main__.churn", 0) / result["churned"] - 1) < 0.15, (alloc, result)


@native_only
def test_inuse_space_of_a_leak(module_server, tmp_path: Path) -> None:
    service = f"leak_{uuid.uuid4().hex[:6]}"
    # One upload, at shutdown: inuse is a snapshot, and the query adds snapshots up.
    result = run_program(
        tmp_path,
        configure(module_server.url, service, alloc_sample_bytes=4096, upload_interval=60) + LEAK,
        otel=False,
    )
    assert result["collector"]["alloc"] == "native"
    assert result["stats"]["alloc"]["live_freed"] > 0
    with module_server.client() as client:
        _check_leak(client, service, result)


REUSE_LEAK = """
N = 6000
keep = [None] * (3 * N)  # no list growth to blame on any of the functions below
def leak_small(n, at):  # pymalloc blocks, each address just freed by the churn before it
    for i in range(n):
        for _ in range(8):
            bytes(300)
        keep[at + i] = bytes(300)
def leak_big(n, at):  # RAW blocks beside them, with the same reuse
    for i in range(n):
        for _ in range(8):
            bytes(5000)
        keep[at + i] = bytes(5000)
def leak_shrunk(n, at):  # a RAW block realloc'ed down to a size pymalloc keeps small
    for i in range(n):
        b = bytearray(6000)
        del b[250:]
        keep[at + i] = b
for k in range(3):
    leak_small(N // 3, k * N // 3)
    leak_big(N // 3, N + k * N // 3)
    leak_shrunk(N // 3, 2 * N + k * N // 3)
truth = {
    name: sum(sys.getsizeof(o) for o in keep[i * N : (i + 1) * N])
    for i, name in enumerate(["small", "big", "shrunk"])
}
stats = agent.collector_stats()
hotspan.shutdown()
report(truth=truth, stats=stats)
"""


@native_only
def test_inuse_space_unbiased_beside_churn_and_shrinking_reallocs(
    module_server, tmp_path: Path
) -> None:
    """Live samples must survive the reuse of freed addresses around them, whatever the block
    size, and a realloc that pymalloc hands on to the RAW domain must be counted once (it
    was counted at both levels: a leak of shrunk buffers came out at twice its size)."""
    service = f"reuse_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(module_server.url, service, alloc_sample_bytes=1024, upload_interval=60)
        + REUSE_LEAK,
        otel=False,
    )
    with module_server.client() as client:
        inuse = profile(client, service, INUSE_SPACE)
    truth = result["truth"]
    # A sample every KiB: ~2,000 to ~6,000 samples each, 2% of sampling error (every 4 KiB,
    # the small blocks' ~500 samples came out 17% under the truth in one loaded CI run of
    # many, and in the 3.14 line once: too near a 15% bound to tell a bias by).
    for name in ("small", "big", "shrunk"):
        seen = inuse.get(f"__main__.leak_{name}", 0)
        assert abs(seen / truth[name] - 1) < 0.12, (name, seen, truth, inuse, result["stats"])


def test_no_tracemalloc_unless_asked(tmp_path: Path) -> None:
    """Without the C hook, the allocation profile is off rather than tracemalloc's cost."""
    from hotspan.agent.collectors.alloc import make_collector
    from hotspan.agent.config import AgentConfig

    on = {"application_name": "x", "native": False, "alloc_sample_bytes": 512 * 1024}
    assert make_collector(AgentConfig(**on)) is None
    twin = make_collector(AgentConfig(**on, alloc_tracemalloc=True))
    assert twin is not None and twin.implementation == "python"


def test_python_twin_round_trips(module_server, tmp_path: Path) -> None:
    service = f"twin_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(
            module_server.url,
            service,
            alloc_sample_bytes=4096,
            upload_interval=60,
            alloc_tracemalloc=True,
        )
        + LEAK,
        env={"HOTSPAN_NO_SPEEDUPS": "1"},
        otel=False,
    )
    assert result["collector"]["alloc"] == "python"
    with module_server.client() as client:
        inuse = profile(client, service, INUSE_SPACE)
        alloc = profile(client, service, ALLOC_SPACE)
    # tracemalloc is exact on what is alive; it cannot see what came and went between
    # snapshots (churn), as its docstring says.
    assert abs(inuse.get("__main__.leak", 0) / result["kept"] - 1) < 0.05, (inuse, result)
    assert inuse.get("__main__.churn", 0) < 0.02 * result["kept"], inuse
    assert alloc.get("__main__.leak", 0) == inuse.get("__main__.leak", 0)


@native_only
def test_allocations_carry_span_and_tags(module_server, tmp_path: Path) -> None:
    service = f"span_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        # No CPU or wall samples: whatever marks the span comes from allocations.
        configure(module_server.url, service, alloc_sample_bytes=64 * 1024, cpu=False, wall=False)
        + """
SIZE = sys.getsizeof(bytearray(4096))
def in_span(n):
    for _ in range(n):
        bytearray(4096)
def outside(n):
    for _ in range(n):
        bytearray(4096)
def tagged(n):
    for _ in range(n):
        bytearray(4096)
with tracer.start_as_current_span("work") as span:
    in_span(10000)
outside(10000)
@hotspan.tag_wrapper({"route": "a"})
def route_a():
    tagged(10000)
def worker():
    with hotspan.tag_wrapper({"route": "b"}):
        outside(5000)
route_a()
t = threading.Thread(target=worker)
t.start(); t.join()
hotspan.shutdown()
report(span=span_hex(span), trace=trace_hex(span), attrs=dict(span.attributes),
       truth=10000 * SIZE)
""",
    )
    span, trace = result["span"], result["trace"]
    assert result["attrs"]["pyroscope.profile.id"] == span
    # Span stats (on by default): the span's own allocation estimate.
    assert abs(result["attrs"]["hotspan.alloc_bytes"] / result["truth"] - 1) < 0.15, result
    with module_server.client() as client:
        in_span = profile(
            client, service, ALLOC_SPACE, spanSelector=[span], traceIdSelector=[trace]
        )
        other_trace = profile(
            client, service, ALLOC_SPACE, spanSelector=[span], traceIdSelector=["1" * 32]
        )
        route_a = profile(client, service, ALLOC_SPACE, 'route="a"')
        route_b = profile(client, service, ALLOC_SPACE, 'route="b"')
    assert "__main__.outside" not in in_span and "__main__.tagged" not in in_span, in_span
    assert abs(in_span.get("__main__.in_span", 0) / result["truth"] - 1) < 0.15, in_span
    assert other_trace["<total>"] == 0
    assert route_a.get("__main__.tagged", 0) > 0.8 * result["truth"], route_a
    assert "__main__.in_span" not in route_a and "__main__.outside" not in route_a
    assert route_b.get("__main__.outside", 0) > 0 and "__main__.tagged" not in route_b


@native_only
def test_numpy_allocations_in_threads(module_server, tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    service = f"numpy_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(module_server.url, service, alloc_sample_bytes=16 * 1024)
        + """
import numpy as np
def crunch(seed):
    rng = np.random.default_rng(seed)
    kept = []
    for i in range(60):
        a = rng.random((150, 150))
        b = a @ a.T                       # releases the GIL
        c = np.sort(b, axis=None)         # so does this
        kept.append(np.concatenate([c[:100], a.ravel()[:100]]).tolist())
        if len(kept) > 20:
            kept.pop(0)
    return len(kept)
threads = [threading.Thread(target=crunch, args=(i,)) for i in range(3)]
for t in threads: t.start()
crunch(9)
for t in threads: t.join()
stats = agent.collector_stats()
hotspan.shutdown()
report(stats=stats)
""",
        otel=False,
    )
    assert result["stats"]["alloc"]["samples"] > 50
    with module_server.client() as client:
        space = profile(client, service, ALLOC_SPACE)
    assert space.get("__main__.crunch", 0) > 0, space


@native_only
def test_configure_twice_shutdown_foreign_hook_and_fork(module_server, tmp_path: Path) -> None:
    service = f"life_{uuid.uuid4().hex[:6]}"
    line = configure(module_server.url, service, alloc_sample_bytes=16 * 1024, upload_interval=60)
    result = run_program(
        tmp_path,
        "import tracemalloc\nfrom hotspan._speedups import _alloc\n"
        + line.replace("16384", "1048576")
        + line  # a second configure: the first agent stops (and unhooks) before this starts
        + """
twice = _alloc.stats()["hooked_domains"]
tracemalloc.start()              # chained on top of our hook
hotspan.shutdown(flush=False)    # cannot unhook without cutting tracemalloc out
inert = _alloc.stats()
junk = [bytearray(100) for _ in range(20000)]
del junk
tracemalloc.stop()               # puts our (inert) hook back
"""
        + line
        + """
parent_keep = []
def parent_leak():
    for _ in range(2000):
        parent_keep.append(bytearray(1000))
def child_alloc():
    kept = [bytearray(1000) for _ in range(2000)]
    return len(kept)
parent_leak()
pid = os.fork()
if pid == 0:
    child_alloc()
    hotspan.shutdown()
    os._exit(0)
_, status = os.waitpid(pid, 0)
hotspan.shutdown(flush=False)    # the parent sends nothing after the fork
report(twice=twice, inert=inert, after=_alloc.stats(), status=status)
""",
        otel=False,
    )
    assert result["twice"] == 3
    assert result["inert"]["inert_domains"] == 3 and result["inert"]["live"] == 0
    assert result["after"]["hooked_domains"] == 0  # tracemalloc gone: really unhooked
    assert result["status"] == 0
    with module_server.client() as client:
        alloc = profile(client, service, ALLOC_SPACE)
        inuse = profile(client, service, INUSE_SPACE)
    assert alloc.get("__main__.child_alloc", 0) > 0, alloc
    # The parent's samples stayed with the parent.
    assert "__main__.parent_leak" not in alloc and "__main__.parent_leak" not in inuse, inuse
