"""The agent in real programs: each test runs a Python program that calls
``hotspan.configure`` (and real OpenTelemetry SDK spans), pushing to a real ``hotspan server``,
and reads the profiles back through the query API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

import httpx
import pytest

from hotspan._speedups import load_sampler
from tests.helpers import QUERIER, TLS, flamegraph, function_totals, label_values

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
WALL = "wall:wall:nanoseconds:wall:nanoseconds"
# The profiles whose samples mark a span with pyroscope.profile.id.
SAMPLED = (CPU, WALL, "mutex:contentions:count:contentions:count")

# Functions that burn CPU until a deadline, shared by the programs below.
PRELUDE = """
import json, os, sys, threading, time
import hotspan

def burn(seconds):
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        x += 1
    return x

def hot_a(seconds):
    return burn(seconds)

def hot_b(seconds):
    return burn(seconds)

def report(**values):
    print("RESULT " + json.dumps(values), flush=True)
"""

OTEL = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("test")

def span_hex(span):
    return format(span.get_span_context().span_id, "016x")

def trace_hex(span):
    return format(span.get_span_context().trace_id, "032x")
"""


# What only the native sampler does: per-task labels, CPU caught where it burns.  The pure
# Python fallback (HOTSPAN_NO_SPEEDUPS=1) is documented to do neither.
native_only = pytest.mark.skipif(
    load_sampler() is None,
    reason="the pure-Python sampler labels per thread, not per task, "
    "and charges CPU to where a thread waits (docs/agent.md)",
)


def run_program(
    tmp_path: Path,
    body: str,
    env: Optional[Dict[str, str]] = None,
    otel: bool = True,
    timeout: float = 60,
) -> dict:
    script = tmp_path / f"prog_{uuid.uuid4().hex[:8]}.py"
    script.write_text(PRELUDE + (OTEL if otel else "") + textwrap.dedent(body))
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        # A crash prints every thread's Python stack (faulthandler) into the assertion.
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"no RESULT line: {proc.stdout}{proc.stderr}")


def span_graph(client: httpx.Client, service: str, span_ids: List[str], ptype: str = CPU) -> dict:
    now = int(time.time())
    r = client.post(
        f"{QUERIER}/SelectMergeSpanProfile",
        json={
            "profileTypeID": ptype,
            "labelSelector": f'{{service_name="{service}"}}',
            "spanSelector": span_ids,
            "start": (now - 600) * 1000,
            "end": (now + 60) * 1000,
        },
    )
    assert r.status_code == 200, r.text
    return r.json().get("flamegraph", {})


def span_profile(
    client: httpx.Client,
    service: str,
    span_ids: List[str],
    ptype: str = CPU,
) -> Dict[str, int]:
    return totals(span_graph(client, service, span_ids, ptype))


def service_profile(client: httpx.Client, selector: str, ptype: str = CPU) -> Dict[str, int]:
    now = int(time.time())
    return totals(flamegraph(client, selector, now - 600, now + 60, profile_type=ptype))


TOTAL = "<total>"


def totals(graph: dict) -> Dict[str, int]:
    """Total (self and callees) per function, and the whole profile's total under TOTAL."""
    out = function_totals(graph)
    out[TOTAL] = int(graph.get("total", 0) or 0)
    return out


def share(totals: Dict[str, int], name: str) -> float:
    return totals.get(name, 0) / totals[TOTAL] if totals[TOTAL] else 0.0


def configure_line(url: str, service: str, **extra: object) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in extra.items())
    return (
        f"agent = hotspan.configure(application_name={service!r}, server_address={url!r}, "
        f"upload_interval=60{', ' + args if args else ''})\n"
    )


def test_profile_pushed_and_read_back(module_server, tmp_path: Path) -> None:
    service = f"app_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service, tags={"env": "test"})
        + """
hot_a(0.6)
hot_b(0.2)
alloc = "alloc" in agent.collectors
looked = agent.collector_stats().get("threads", {}).get("snapshots", 0)
hotspan.shutdown()
stats = agent.upload_stats
report(sampler=agent.sampler_name, sent=stats.sent_uploads, failed=stats.failed_attempts,
       alloc=alloc, looked=looked)
""",
        otel=False,
    )
    # One CPU and one wall profile, the allocations the program made where the allocator hook
    # is built, and the threads profile when the program ran long enough for the window's early
    # look (a second; on a loaded machine it may) -- at exit the only thread left is the one
    # shutting down.  The locks profile has nothing: no lock was waited for (with threads
    # running in parallel, a free-threaded build's lock profile may have a wait of the agent's
    # own shutdown).
    assert result["failed"] == 0
    assert result["sent"] >= 2, result
    with module_server.client() as client:
        types = label_values(client, service, "__name__")
        wanted = {"process_cpu", "wall"}
        if result["sampler"] == "native" and result["looked"]:
            wanted.add("goroutines")
        if result["alloc"]:
            wanted |= {"memory"}
        # And the GIL profiles when a thread waited for it (the agent's own thread takes the
        # GIL now and then; where the sampler tells waits apart).
        assert wanted <= set(types) <= wanted | {"gil_wait", "gil_held"}, (types, result)
        cpu = service_profile(client, f'{{service_name="{service}", env="test"}}')
        wall = service_profile(client, f'{{service_name="{service}"}}', WALL)
    assert set(cpu) >= {"__main__.hot_a", "__main__.hot_b"}
    # 0.6 s against 0.2 s of CPU: a 75/25 split.
    a = cpu["__main__.hot_a"] / (cpu["__main__.hot_a"] + cpu["__main__.hot_b"])
    assert 0.65 < a < 0.85, cpu
    assert 0.5e9 < cpu[TOTAL] < 1.1e9
    assert wall.get("__main__.hot_a", 0) > 0.4e9


@pytest.mark.skipif(
    load_sampler() is None,
    reason="the pure-Python sampler charges a tick's CPU to where the thread is at the tick, "
    "which with threads running in parallel (free-threaded builds) is often the next span",
)
def test_nested_spans_in_threads(module_server, tmp_path: Path) -> None:
    service = f"threads_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
ids = {}
attrs = {}
def work(name, fn):
    with tracer.start_as_current_span(name + ".outer") as outer:
        ids[name + ".outer"] = span_hex(outer)
        with tracer.start_as_current_span(name + ".inner") as inner:
            ids[name + ".inner"] = span_hex(inner)
            fn(0.5)
        with tracer.start_as_current_span(name + ".empty") as empty:
            ids[name + ".empty"] = span_hex(empty)  # a sample lands here only if it waits
        burn(0.3)
    for span in (outer, inner, empty):
        attrs[span.name] = dict(span.attributes)
threads = [threading.Thread(target=work, args=("a", hot_a)),
           threading.Thread(target=work, args=("b", hot_b))]
for t in threads: t.start()
for t in threads: t.join()
hotspan.shutdown()
report(ids=ids, attrs=attrs)
""",
    )
    ids = result["ids"]
    # Spans with samples carry pyroscope.profile.id (their own id); a span without does not.
    # The empty spans last a few microseconds, so they almost never get one, but a thread
    # made to wait inside one (the other thread holds the GIL, the machine is busy) is
    # sampled there: the attribute must then match what the server stored under the span.
    for name in ("a.inner", "a.outer", "b.inner", "b.outer"):
        assert profile_id(result["attrs"][name]) == ids[name], name
    with module_server.client() as client:
        for name in ("a.empty", "b.empty"):
            stored = {t: span_profile(client, service, [ids[name]], t)[TOTAL] for t in SAMPLED}
            marked = profile_id(result["attrs"][name])
            assert marked in (None, ids[name]), (name, marked)
            assert (marked is not None) == any(stored.values()), (name, marked, stored)
        a_inner = span_profile(client, service, [ids["a.inner"]])
        b_inner = span_profile(client, service, [ids["b.inner"]])
        a_outer = span_profile(client, service, [ids["a.outer"]])
    # The inner span of thread a ran hot_a, never hot_b; the outer only its own burn().
    assert _calls(module_server.url, service, ids["a.inner"]) == {"__main__.hot_a"}
    assert _calls(module_server.url, service, ids["b.inner"]) == {"__main__.hot_b"}
    assert "__main__.hot_a" not in _calls(module_server.url, service, ids["a.outer"])
    assert 0.35e9 < a_inner[TOTAL] < 0.65e9
    assert 0.35e9 < b_inner[TOTAL] < 0.65e9
    assert 0.15e9 < a_outer[TOTAL] < 0.45e9


def profile_id(attributes: dict) -> Optional[str]:
    """A span's pyroscope.profile.id (the others are span stats, see test_agent_span_stats)."""
    return attributes.get("pyroscope.profile.id")


def _calls(client_url: str, service: str, span: str) -> set:
    """Which of hot_a/hot_b appear in the span's CPU profile."""
    with httpx.Client(base_url=client_url, timeout=30, verify=TLS) as client:
        names = span_graph(client, service, [span]).get("names", [])
    return {n for n in names if n.startswith("__main__.hot_")}


@native_only
def test_concurrent_asyncio_tasks_keep_their_own_spans(module_server, tmp_path: Path) -> None:
    service = f"tasks_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
import asyncio
ids = {}
async def request(name, fn):
    with tracer.start_as_current_span("request " + name) as span:
        ids[name] = span_hex(span)
        for _ in range(60):
            fn(0.01)              # CPU in this task's own function...
            await asyncio.sleep(0)  # ...then let the other task run on the same loop
async def main():
    await asyncio.gather(request("a", hot_a), request("b", hot_b))
asyncio.run(main())
hotspan.shutdown()
report(ids=ids, dropped=agent.dropped_samples)
""",
    )
    ids = result["ids"]
    with module_server.client() as client:
        a = span_profile(client, service, [ids["a"]])
        b = span_profile(client, service, [ids["b"]])
        whole = service_profile(client, f'{{service_name="{service}"}}')
    assert _calls(module_server.url, service, ids["a"]) == {"__main__.hot_a"}
    assert _calls(module_server.url, service, ids["b"]) == {"__main__.hot_b"}
    assert 0.4e9 < a[TOTAL] < 0.8e9 and 0.4e9 < b[TOTAL] < 0.8e9, (a, b, whole, result)
    # Both tasks are in the service profile, and the spans account for nearly all of it.
    assert share(whole, "__main__.burn") > 0.9


def test_profile_id_attribute_and_root_spans_only(module_server, tmp_path: Path) -> None:
    service = f"roots_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service, root_spans_only=True)
        + """
with tracer.start_as_current_span("root") as root:
    with tracer.start_as_current_span("child") as child:
        hot_a(0.4)
hotspan.shutdown()
report(root=span_hex(root), child=span_hex(child), root_attrs=dict(root.attributes),
       child_attrs=dict(child.attributes))
""",
    )
    assert profile_id(result["root_attrs"]) == result["root"]
    assert profile_id(result["child_attrs"]) is None  # only roots carry samples in this mode
    with module_server.client() as client:
        assert span_profile(client, service, [result["child"]])[TOTAL] == 0
        root = span_profile(client, service, [result["root"]])
    assert root.get("__main__.burn", 0) > 0.3e9


@native_only
def test_threads_that_sleep_are_not_charged_cpu(module_server, tmp_path: Path) -> None:
    """Four threads loop 1 ms of CPU then sleep 4 ms: the CPU profile must be in the busy
    part, and add up to the CPU the threads really used.  They mostly wait, so they share two
    wall signals an interval (each is signalled every other interval): the signals stay under
    what one each an interval would be, and their wall profile stays exact in total and
    right in its split."""
    service = f"mixed_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
used = []
busy_walls = []
def busy_part():
    burn(0.001)
def idle_part():
    time.sleep(0.004)
def worker():
    start = time.thread_time()
    busy_wall = 0.0
    # ~9 s: wall samples are ~20% busy; 1,800 of them (one every other interval in each of
    # the four) keep that within ~5%.
    for _ in range(1800):
        t0 = time.perf_counter()
        busy_part()
        busy_wall += time.perf_counter() - t0
        idle_part()
    used.append(time.thread_time() - start)
    busy_walls.append(busy_wall)
threads = [threading.Thread(target=worker) for _ in range(4)]
started = time.perf_counter()
for t in threads: t.start()
for t in threads: t.join()
elapsed = time.perf_counter() - started
signals = agent.sampler_stats.get("handler_signals", 0)
hotspan.shutdown()
report(cpu_used=sum(used), busy_wall=sum(busy_walls), elapsed=elapsed, signals=signals)
""",
        otel=False,
    )
    with module_server.client() as client:
        cpu = service_profile(client, f'{{service_name="{service}"}}')
        wall = service_profile(client, f'{{service_name="{service}"}}', WALL)
    # Not 100%: a sleeping thread really burns CPU in its sleep call as it wakes and takes the
    # GIL back from three others, and the perf trigger puts that CPU there (up to ~6% here on
    # a loaded machine).  A sampler that charges sleep as CPU puts most of it on idle_part.
    assert share(cpu, "__main__.busy_part") >= 0.9, cpu
    profiled = cpu[TOTAL] / 1e9
    assert abs(profiled / result["cpu_used"] - 1) < 0.1, (profiled, result["cpu_used"])
    # Wall: each worker's whole life, and its busy part as long as it really took (measured
    # by the workers; on a loaded machine more than its CPU, as the workers wait to run): a
    # tick holding the GIL alone would only ever see the workers asleep.
    workers_wall = wall["__main__.worker"] / 1e9
    assert abs(workers_wall / (4 * result["elapsed"]) - 1) < 0.15, (workers_wall, result)
    busy_wall = wall.get("__main__.busy_part", 0) / 1e9
    assert abs(busy_wall / result["busy_wall"] - 1) < 0.15, (busy_wall, result)
    # At 100 Hz: two wall signals an interval for the four, one CPU signal per 10 ms of CPU,
    # and the main thread's few; a wall signal each an interval would be 400 a second.
    if load_sampler() is not None:
        bound = 100 * (2 * result["elapsed"] * 1.15 + result["cpu_used"] * 1.2) + 100
        assert result["signals"] < bound, (result, bound, 400 * result["elapsed"])


def test_python_fallback_sampler(module_server, tmp_path: Path) -> None:
    service = f"fallback_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
with tracer.start_as_current_span("work") as span:
    hot_a(0.4)
hotspan.shutdown()
report(sampler=agent.sampler_name, span=span_hex(span))
""",
        env={"HOTSPAN_NO_SPEEDUPS": "1"},
    )
    assert result["sampler"] == "python"
    with module_server.client() as client:
        cpu = span_profile(client, service, [result["span"]])
    assert cpu.get("__main__.burn", 0) > 0.2e9


def test_environment_configures_like_pyroscope(module_server, tmp_path: Path) -> None:
    service = f"envapp_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        """
agent = hotspan.configure()
hot_a(0.3)
hotspan.shutdown()
report(name=agent.config.application_name, rate=agent.config.sample_rate,
       tags=agent.config.tags)
""",
        env={
            "PYROSCOPE_APPLICATION_NAME": service,
            "PYROSCOPE_SERVER_ADDRESS": module_server.url,
            "PYROSCOPE_TAGS": "env=dev, region=eu",
            "PYROSCOPE_SAMPLE_RATE": "50",
            "HOTSPAN_SAMPLE_RATE": "200",  # HOTSPAN_ wins over PYROSCOPE_
        },
        otel=False,
    )
    assert result == {"name": service, "rate": 200, "tags": {"env": "dev", "region": "eu"}}
    with module_server.client() as client:
        cpu = service_profile(client, f'{{service_name="{service}", region="eu"}}')
    assert cpu.get("__main__.burn", 0) > 0.15e9


def test_bad_settings_are_named(tmp_path: Path) -> None:
    from hotspan.agent.config import ConfigError, from_env

    with pytest.raises(ConfigError, match="application_name"):
        from_env(environ={}).validate()
    with pytest.raises(ConfigError, match="PYROSCOPE_SAMPLE_RATE"):
        from_env(environ={"PYROSCOPE_SAMPLE_RATE": "fast"})
    with pytest.raises(ConfigError, match="sample_rate"):
        from_env(environ={}, application_name="x", sample_rate=0).validate()
    with pytest.raises(ConfigError, match="tag"):
        from_env(environ={"PYROSCOPE_TAGS": "novalue"})
    with pytest.raises(ConfigError, match="unknown setting"):
        from_env(environ={}, aplication_name="typo")


@native_only
def test_tag_wrapper_follows_asyncio_tasks(module_server, tmp_path: Path) -> None:
    service = f"tags_{uuid.uuid4().hex[:6]}"
    run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
import asyncio
@hotspan.tag_wrapper({"route": "a"})
async def route_a():
    for _ in range(40):
        hot_a(0.01)
        await asyncio.sleep(0)
async def route_b():
    with hotspan.tag_wrapper({"route": "b"}):
        for _ in range(40):
            hot_b(0.01)
            await asyncio.sleep(0)
async def main():
    await asyncio.gather(route_a(), route_b())
asyncio.run(main())
hotspan.shutdown()
report()
""",
        otel=False,
    )
    with module_server.client() as client:
        a = _names(client, f'{{service_name="{service}", route="a"}}')
        b = _names(client, f'{{service_name="{service}", route="b"}}')
    assert "__main__.hot_a" in a and "__main__.hot_b" not in a
    assert "__main__.hot_b" in b and "__main__.hot_a" not in b


def _names(client: httpx.Client, selector: str) -> set:
    now = int(time.time())
    return set(flamegraph(client, selector, now - 600, now + 60).get("names", []))


def test_without_opentelemetry_installed(module_server, tmp_path: Path) -> None:
    service = f"nootel_{uuid.uuid4().hex[:6]}"
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    # A path entry that makes `import opentelemetry` fail, as on a machine without it.
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'opentelemetry' or name.startswith('opentelemetry.'):\n"
        "            raise ImportError('blocked for the test')\n"
        "sys.meta_path.insert(0, _Block())\n"
    )
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
try:
    import opentelemetry
    has_otel = True
except ImportError:
    has_otel = False
hot_a(0.3)
hotspan.shutdown()
report(has_otel=has_otel, linking=agent.span_linking)
""",
        env={"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])},
        otel=False,
    )
    assert result == {"has_otel": False, "linking": False}
    with module_server.client() as client:
        assert service_profile(client, f'{{service_name="{service}"}}').get("__main__.burn", 0) > 0


def test_forked_children_keep_profiling(module_server, tmp_path: Path) -> None:
    service = f"fork_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
import multiprocessing
def child_work():
    burn(0.5)
    hotspan.shutdown()
ctx = multiprocessing.get_context("fork")
procs = [ctx.Process(target=child_work) for _ in range(2)]
for p in procs: p.start()
for p in procs: p.join()
hot_a(0.2)
hotspan.shutdown()
report(codes=[p.exitcode for p in procs])
""",
        otel=False,
    )
    assert result["codes"] == [0, 0]
    with module_server.client() as client:
        cpu = service_profile(client, f'{{service_name="{service}"}}')
    # Only the children ran child_work: its CPU came from their own samplers.
    assert cpu.get("__main__.child_work", 0) > 0.7e9, cpu
    assert cpu.get("__main__.hot_a", 0) > 0.1e9, cpu


def test_forked_multiprocessing_workers_send_their_profile_as_they_end(
    module_server, tmp_path: Path
) -> None:
    """multiprocessing's forked workers end with os._exit (atexit never runs): what they
    profiled is sent by a finalizer of multiprocessing's own exit path, with no shutdown()
    in the program, from a Process and from a Pool closed and joined."""
    service = f"mpexit_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
import multiprocessing
def child_work(_=None):
    burn(0.5)
ctx = multiprocessing.get_context("fork")
procs = [ctx.Process(target=child_work) for _ in range(2)]
for p in procs: p.start()
for p in procs: p.join()
def pool_work(_):
    hot_b(0.25)
pool = ctx.Pool(2)
pool.map(pool_work, range(2))
pool.close()
pool.join()
hotspan.shutdown()
report(codes=[p.exitcode for p in procs])
""",
        otel=False,
    )
    assert result["codes"] == [0, 0]
    with module_server.client() as client:
        cpu = service_profile(client, f'{{service_name="{service}"}}')
    assert cpu.get("__main__.child_work", 0) > 0.7e9, cpu
    assert cpu.get("__main__.hot_b", 0) > 0.3e9, cpu


def test_server_away_slow_or_failing_never_stalls_the_program(tmp_path: Path) -> None:
    """Uploads every 0.1 s to a server that is away, hangs, or answers 500: the program's
    own loop never waits on them, the agent's buffer stays bounded, and drops are counted."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Failing(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    failing = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=failing.serve_forever, daemon=True).start()
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(100)  # accepts connections, never answers
    away = socket.socket()
    away.bind(("127.0.0.1", 0))
    away_port = away.getsockname()[1]
    away.close()
    targets = {
        "away": f"http://127.0.0.1:{away_port}",
        "hanging": f"http://127.0.0.1:{hanging.getsockname()[1]}",
        "failing": f"http://127.0.0.1:{failing.server_address[1]}",
    }
    try:
        for kind, url in targets.items():
            result = run_program(
                tmp_path,
                f"""
import resource
agent = hotspan.configure(application_name="away", server_address={url!r},
                          upload_interval=0.1, max_buffer_bytes=8 * 1024,
                          upload_timeout=30.0, thread_name_label=True)
# Many distinct stacks make each upload big, so the buffer fills quickly.
def deep(n, seconds):
    return burn(seconds) if n == 0 else deep(n - 1, seconds)
worst_gap = 0.0
last = time.perf_counter()
deadline = last + 2.0
i = 0
while time.perf_counter() < deadline:
    deep(i % 40, 0.002)
    now = time.perf_counter()
    worst_gap = max(worst_gap, now - last)
    last = now
    i += 1
t0 = time.perf_counter()
hotspan.shutdown()
shutdown_s = time.perf_counter() - t0
stats = agent.upload_stats
report(worst_gap=worst_gap, shutdown_s=shutdown_s, sent=stats.sent_uploads,
       dropped=stats.dropped_uploads, failed=stats.failed_attempts,
       pending=agent._uploader.pending_bytes,
       rss_kib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
""",
                otel=False,
            )
            assert result["sent"] == 0, (kind, result)
            # The loop's iterations take ~2 ms; an upload on this thread would take seconds.
            assert result["worst_gap"] < 0.5, (kind, result)
            assert result["shutdown_s"] < 5.0, (kind, result)  # exit flush deadline is 3 s
            assert result["dropped"] > 0, (kind, result)
            assert result["pending"] <= 8 * 1024, (kind, result)
    finally:
        failing.shutdown()
        hanging.close()


def test_opentelemetry_imported_after_configure_is_hooked(module_server, tmp_path: Path) -> None:
    service = f"late_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
already = "opentelemetry.context" in sys.modules
"""
        + OTEL
        + """
with tracer.start_as_current_span("late") as span:
    hot_a(0.3)
hotspan.shutdown()
report(already=already, span=span_hex(span))
""",
        otel=False,
    )
    assert result["already"] is False  # the agent itself did not import OpenTelemetry
    with module_server.client() as client:
        assert span_profile(client, service, [result["span"]]).get("__main__.hot_a", 0) > 0.2e9


def test_fork_while_a_window_is_being_encoded(module_server, tmp_path: Path) -> None:
    """A fork copies locks in the state other threads held them: the child must not wait on
    the parent's encoder forever (it exits with a flush)."""
    service = f"forklock_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
import signal
codes = []
for _ in range(3):
    with agent.outbox._lock:  # as if the sampler thread were encoding a window right now
        pid = os.fork()
    if pid == 0:
        burn(0.2)
        sys.exit(0)  # atexit flushes: must not block on the copied lock
    deadline = time.time() + 20
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            codes.append(status >> 8 if status & 0x7F == 0 else -(status & 0x7F))
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        codes.append("hung")
hotspan.shutdown()
report(codes=codes)
""",
        otel=False,
    )
    assert result["codes"] == [0, 0, 0]


def test_a_fork_handler_before_the_agents_may_start_a_thread(module_server, tmp_path: Path) -> None:
    """A fork handler registered before the agent's (OpenTelemetry's TracerProvider starts a
    thread in the child) runs before the agent has reset its sampler in the child: the new
    thread registers itself while the sampler's lock is in whatever state the parent's
    collector left it.  It hung 2 to 15 % of such children; none may."""
    service = f"forkhandler_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        """
import signal
def start_a_thread():
    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
os.register_at_fork(after_in_child=start_a_thread)
"""
        + configure_line(module_server.url, service)
        + """
stop = False
def busy():  # keeps the collector taking its lock
    while not stop:
        sum(range(1000))
for _ in range(4):
    threading.Thread(target=busy, daemon=True).start()
forks = hung = 0
end = time.time() + 4
while time.time() < end:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    forks += 1
    deadline = time.time() + 3
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.time() > deadline:
            hung += 1
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.001)
stop = True
hotspan.shutdown()
report(forks=forks, hung=hung)
""",
        otel=False,
    )
    assert result["forks"] >= 10 and result["hung"] == 0, result


def test_restarted_agent_samples_threads_that_reuse_old_idents(
    module_server,
    tmp_path: Path,
) -> None:
    service = f"restart_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service)
        + """
old = {agent._thread.ident, agent._uploader.thread_ident}
hotspan.shutdown()
stop = threading.Event()
def worker():
    while not stop.is_set():
        hot_b(0.01)
workers = [threading.Thread(target=worker) for _ in range(4)]
for t in workers: t.start()
reused = sum(t.ident in old for t in workers)
"""
        + configure_line(module_server.url, service)
        + """
time.sleep(1.0)
stop.set()
for t in workers: t.join()
agent._sampler.stop()
collected = agent._sampler.collect(final=True)
seen = {s.thread_ident for w in collected.windows for s in w.samples if s.kind == 0}
hotspan.shutdown(flush=False)
report(reused=reused, unseen=[t.ident in seen for t in workers].count(False))
""",
        otel=False,
    )
    assert result["unseen"] == 0, result
