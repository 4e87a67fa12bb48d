"""Agent overhead and correctness: hotspan's in-process agent against no profiler, py-spy and
pyroscope-io, on four workloads (``bench/agent_workloads/``), and on request on three busy
programs that starve a sampler thread of the GIL (``--workloads busy``).

    python bench/agent.py                 # 7 interleaved rounds x ~4 s of work (~10 min)
    python bench/agent.py --quick         # 3 rounds x ~1 s (~1.5 min)
    python bench/run.py --only agent [--quick]   # the same, from the bench runner
    python bench/agent.py --workloads busy [--quick]   # asyncio_yield, socket_pingpong,
                                          # web_server (~10 min, quick ~2.5 min): agent-busy.*
    python bench/agent.py --workloads profiles [--quick]   # every profile type on, against
                                          # ddtrace's profiler and tracemalloc, and each
                                          # profile type against a truth the workload
                                          # measures (~20 min, quick ~5 min): agent-profiles.*
    python bench/agent.py --workloads defaults [--quick] [--only W,W] [--profilers P,P]
                                          # every profiler with its defaults (and hotspan and
                                          # ddtrace as stack samplers) on six workloads
                                          # (~21 min, quick ~5 min): agent-defaults.*

Every measurement is a fresh process.  In each round every workload runs once under every
profiler, in a shuffled order, and a profiler's slowdown is the median over rounds of
``work time / work time without a profiler in the same round``: the rounds share the
machine's state of the moment (frequency, neighbours), so the ratio cancels most of it.
Correctness is read from the profiles themselves: hotspan and pyroscope-io push to one
``hotspan server`` started for the bench, py-spy writes folded stacks to a file.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import glob
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Collection, Dict, List, Optional, Set, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402

sys.path.insert(0, common.AGENT_WORKLOAD_DIR)

import _harness  # noqa: E402

WORKLOAD_DIR = common.AGENT_WORKLOAD_DIR
WORKLOADS = ["cpu_split", "threads", "alloc", "asyncio_spans"]
# Busy programs whose main thread lets the GIL go and takes it back many times per tick (a
# loop that yields, blocking syscalls, a web server): a sampler thread that needs the GIL
# starves there.  Not in the default run (it would take ~17 min); ``--workloads busy``.
BUSY_WORKLOADS = ["asyncio_yield", "socket_pingpong", "web_server"]
# ``--workloads profiles``: every profile type on (CPU, wall, allocations and heap, locks,
# threads and tasks) against ddtrace's profiler (memory and lock collectors on) and
# tracemalloc on these ...
PROFILE_WORKLOADS = ["cpu_split", "threads", "alloc", "gc_containers", "asyncio_spans"]
# ... and hotspan alone on workloads that measure the truth of one profile type each
# (bursty_threads: CPU, against no profiler too, since its CPU time is what rose there).
TRUTH_WORKLOADS = ["alloc_split", "heap_leak", "lock_contention", "threads_tasks", "bursty_threads"]
TRUTH_PROFILERS = {"bursty_threads": ["none", "hotspan"]}
# ``--workloads defaults``: every profiler with its defaults (and a stack-only setting of
# hotspan and ddtrace) on six workloads a service is made of.
DEFAULTS_WORKLOADS = [
    "cpu_split",
    "threads",
    "gc_containers",
    "asyncio_spans",
    "web_server",
    "wsgi_threaded",
]
ALL_WORKLOADS = WORKLOADS + BUSY_WORKLOADS + ["gc_containers", "wsgi_threaded"] + TRUTH_WORKLOADS
# "none-again" is a second no-profiler run per round, compared with the first like any
# profiler: its "slowdown" is what noise alone gives (an A/A test), the scale to read the
# other rows against.
PROFILERS = ["none", "none-again", "hotspan", "pyspy", "pyroscope"]
PROFILE_PROFILERS = ["none", "none-again", "hotspan", "hotspan-cpuonly", "ddtrace", "tracemalloc"]
# On request (--profilers): py-spy without --nonblocking (it stops the process for every
# sample, which is not how it runs in production, but it shows its attribution error), and
# hotspan with one feature off, to tell where a cost comes from.
EXTRA_PROFILERS = [
    "pyspy-blocking",
    "hotspan-nospans",
    "hotspan-nowall",
    "hotspan-nolocks",
    "hotspan-nothreads",
    "hotspan-noalloc",
    "hotspan-timer",
    "hotspan-python",
    "hotspan-cpuonly",
    "hotspan-idle",
]
# Variants that take no CPU profile: nothing to check their accuracy against.
NO_CPU_PROFILE = {"hotspan-idle"}
DEFAULTS_PROFILERS = [
    "none",
    "none-again",
    "hotspan",
    "hotspan-cpuwall",
    "pyroscope",
    "pyspy",
    "ddtrace-stack",
    "ddtrace",
]
ALL_PROFILERS = (
    PROFILERS + ["hotspan-cpuwall", "ddtrace-stack", "ddtrace", "tracemalloc"] + EXTRA_PROFILERS
)
# ... except that blocking py-spy runs on the threads workload by default: that is where its
# attribution goes wrong.
DEFAULT_EXTRA = {"threads": ["pyspy-blocking"]}
FULL = {"rounds": 7, "seconds": 4.0}
QUICK = {"rounds": 3, "seconds": 1.0}
# 5 s of work: the CPU targets of the profiles run hold for runs of 5 s or more.
PROFILES_FULL = {"rounds": 4, "seconds": 5.0}
PROFILES_QUICK = {"rounds": 2, "seconds": 1.0}
# 8 runs per workload and round, 48 per round: ~3 min a round at 3 s of work (a run takes
# ~0.35 s more than its work), ~20 min in all; quick ~5 min.
DEFAULTS_FULL = {"rounds": 7, "seconds": 3.0}
DEFAULTS_QUICK = {"rounds": 3, "seconds": 1.5}
# threads_tasks only starts its threads and tasks and waits: a second is plenty.
FIXED_SECONDS = {"threads_tasks": 1.0}
RATE_HZ = 100
CPU_TYPE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
DDTRACE_CPU_TYPE = "cpu-time"  # nanoseconds
WALL_TYPE = "wall:wall:nanoseconds:wall:nanoseconds"
ALLOC_SPACE_TYPE = "memory:alloc_space:bytes:space:bytes"
ALLOC_OBJECTS_TYPE = "memory:alloc_objects:count:space:bytes"
INUSE_SPACE_TYPE = "memory:inuse_space:bytes:space:bytes"
INUSE_OBJECTS_TYPE = "memory:inuse_objects:count:space:bytes"
LOCK_DELAY_TYPE = "mutex:delay:nanoseconds:contentions:count"
LOCK_COUNT_TYPE = "mutex:contentions:count:contentions:count"
GOROUTINE_TYPE = "goroutines:goroutine:count:goroutine:count"
# Profile type -> the collector module that sends it (src/hotspan/agent/collectors/).
NEW_TYPES = {
    ALLOC_SPACE_TYPE: "alloc",
    INUSE_SPACE_TYPE: "alloc",
    LOCK_DELAY_TYPE: "locks",
    GOROUTINE_TYPE: "threads",
}

# The agent's targets.
TARGET_SLOWDOWN_PCT = 1.0
TARGET_SPLIT_PP = 1.5
TARGET_BUSY_SHARE_PCT = 95.0
TARGET_CPU_RATIO_PCT = 5.0
TARGET_RSS_MIB = 10.0
# The profiles run's targets.
TARGET_PROFILES_SLOWDOWN_PCT = 3.0
TARGET_PROFILES_RSS_MIB = 8.0
TARGET_ALLOC_SPLIT_PP = 2.0
TARGET_LEAK_PCT = 10.0
TARGET_LOCK_DELAY_PCT = 10.0
TARGET_PROFILES_CPU_PCT = 2.0
TARGET_PROFILES_SPLIT_PP = 1.0
MIN_CPU_RUN_S = 5.0
# The defaults run's cpu_split is as long as the accuracy rows above require.  At 100 Hz a 3 s
# run's 75/25 share moves by ~0.5 pp (sd) with where its ~300 samples fall against its ~30
# changes of function alone, even for a sampler exact at every sample: the worst of 10 such
# runs would judge the sampling rate, not the profiler.
DEFAULTS_MIN_SECONDS = {"cpu_split": MIN_CPU_RUN_S}
# The defaults run's targets, for hotspan with its defaults on every workload.
TARGET_DEFAULTS_SLOWDOWN_PCT = 2.0
TARGET_DEFAULTS_CPU_PCT = 3.0
TARGET_DEFAULTS_RSS_MIB = 8.0
TARGET_CPU_SEEN = (0.97, 1.03)
TARGET_SPAN_LABELLED_PCT = 90.0

Log = Callable[[str], None]


# -- running one workload process ------------------------------------------------------------


def _pyspy_path() -> Optional[str]:
    beside = os.path.join(os.path.dirname(common.workload_python()), "py-spy")
    return beside if os.path.exists(beside) else shutil.which("py-spy")


def run_one(
    workload: str,
    profiler: str,
    params: Dict[str, Any],
    server_url: str,
    app: str,
    tmp: str,
    timeout: Optional[float] = None,
) -> Dict[str, Any]:
    """One workload process under one profiler; the workload's JSON plus what only the parent
    can see (whole-process wall time, py-spy's own CPU and memory).  A run past ``timeout``
    seconds is killed and reported as such (``timed_out_s``)."""
    cmd = common.workload_command(workload, profiler, app, server_url, params)
    folded = ""
    if profiler.startswith("pyspy"):
        pyspy = _pyspy_path()
        assert pyspy is not None
        folded = os.path.join(tmp, f"{app}.txt")
        flags = ["--nonblocking"] if profiler == "pyspy" else []
        cmd = [
            pyspy,
            "record",
            *flags,
            "--rate",
            str(RATE_HZ),
            "--format",
            "raw",
            "--output",
            folded,
            "--",
            *cmd,
        ]
    env = None
    dd_output = ""
    if profiler in DDTRACE_VARIANTS:
        dd_output = os.path.join(tmp, f"{app}.pprof")
        env = dict(os.environ, **_ddtrace_env(app, dd_output, profiler))
    elif profiler == "hotspan-timer":
        env = dict(os.environ, HOTSPAN_CPU_TRIGGER="timer")
    err_path = os.path.join(tmp, f"{app}.stderr")
    with open(err_path, "w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=err, cwd=common.REPO_DIR, env=env
        )
        # py-spy's RSS comes back from wait4 mixed with its child's: read from /proc instead.
        hwm = common.RssSampler(proc.pid, 0.1, "VmHWM") if folded else None
        if hwm:
            hwm.start()
        killer = threading.Timer(timeout, proc.kill) if timeout else None
        if killer:
            killer.start()
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        # wait4 rather than Popen.wait: it also returns the child's rusage.  For py-spy that
        # is py-spy plus the workload it spawned and reaped.
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        if killer:
            killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
    if timeout and wall >= timeout:
        return {
            "error": f"killed after {timeout:.0f} s",
            "timed_out_s": timeout,
            "app": app,
            "profiler": profiler,
        }
    peak = hwm.stop() if hwm else 0
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        with open(err_path) as f:
            tail = f.read()[-2000:]
        return {"error": f"exit {proc.returncode}: {tail}", "app": app, "profiler": profiler}
    result: Dict[str, Any] = json.loads(lines[-1])
    result["process_wall_s"] = wall
    with open(err_path, errors="replace") as f:
        # A profiler that cannot send complains here: a profiler must not be loud.
        result["stderr_lines"] = sum(1 for line in f if line.strip())
    if dd_output:
        # Proof that ddtrace profiled: what its file exporter wrote.  Its profiles are read
        # with the others' (``cpu_profile``), the rest is removed now.
        written = glob.glob(dd_output + ".*")
        pprofs = [p for p in written if p.endswith(".pprof")]
        result["ddtrace_pprof_bytes"] = sum(os.path.getsize(p) for p in pprofs)
        result["pprof"] = pprofs
        for path in set(written) - set(pprofs):
            os.remove(path)
    result["rusage_cpu_s"] = ru.ru_utime + ru.ru_stime
    if folded:
        result["folded"] = folded
        result["pyspy_peak_rss"] = peak
    return result


# Profilers slow enough to make a run last for ever (tracemalloc traces every allocation:
# tens of times slower on pure-Python loops, whose ints are allocations): their runs are cut
# at this many times the work's length (plus start-up), and reported as "slower than".
SLOW_PROFILERS = {"tracemalloc": 3.0}


def _timeout(profiler: str, seconds: float) -> Optional[float]:
    factor = SLOW_PROFILERS.get(profiler)
    return None if factor is None else factor * seconds + 5.0


def _workload_path(workload: str) -> str:
    return os.path.join(WORKLOAD_DIR, f"{workload}.py")


def _collector_modules() -> List[str]:
    path = os.path.join(common.REPO_DIR, "src", "hotspan", "agent", "collectors")
    return sorted(n[:-3] for n in os.listdir(path) if n.endswith(".py") and n[0] != "_")


def _unused_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ddtrace's profiler: "ddtrace" as it ships (in ddtrace 4.x its stack, memory, heap, lock
# and exception collectors are on by default), "ddtrace-stack" with every collector but the
# stack sampler off and without the per-sample timestamps (timeline) and the endpoint counts
# it adds beside them: a plain stack sampler, as hotspan-cpuwall is for hotspan.
DDTRACE_VARIANTS: Dict[str, Dict[str, str]] = {
    "ddtrace": {},
    "ddtrace-stack": {
        "DD_PROFILING_MEMORY_ENABLED": "false",
        "DD_PROFILING_HEAP_ENABLED": "false",
        "DD_PROFILING_LOCK_ENABLED": "false",
        "DD_PROFILING_EXCEPTION_ENABLED": "false",
        "DD_PROFILING_PYTORCH_ENABLED": "false",
        "DD_PROFILING_TIMELINE_ENABLED": "false",
        "DD_PROFILING_ENDPOINT_COLLECTION_ENABLED": "false",
    },
}


def _ddtrace_env(app: str, output: str, profiler: str = "ddtrace") -> Dict[str, str]:
    """ddtrace's profiler as its documentation sets it up (``DDTRACE_VARIANTS``); profiles go
    to its file exporter (there is no Datadog agent here), and the agent URL is a closed local
    port, so that nothing else it might send waits on a timeout.  Telemetry and remote
    configuration, which are not the profiler, are off."""
    return {
        "DD_PROFILING_ENABLED": "true",
        "DD_PROFILING_OUTPUT_PPROF": output,
        "DD_SERVICE": app,
        "DD_TRACE_AGENT_URL": f"http://127.0.0.1:{_unused_port()}",
        "DD_INSTRUMENTATION_TELEMETRY_ENABLED": "false",
        "DD_REMOTE_CONFIGURATION_ENABLED": "false",
        **DDTRACE_VARIANTS[profiler],
    }


def _probe_hotspan(server_url: str) -> Optional[str]:
    """None if ``hotspan.configure`` works in this environment, else why not (its bytecode
    written first, as an install does)."""
    common.compile_hotspan(common.workload_python())
    code = (
        "import hotspan; hotspan.configure(application_name='agent-bench-probe', "
        f"server_address={server_url!r}, sample_rate={RATE_HZ}); hotspan.shutdown()"
    )
    r = subprocess.run(
        [common.workload_python(), "-c", code], capture_output=True, text=True, timeout=60
    )
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


def _workload_python_version() -> Optional[str]:
    """The version of ``--python``'s interpreter ("3.13.15t" for a free-threaded one), or None
    when the workloads run on the bench's own."""
    if not os.environ.get("HOTSPAN_BENCH_PYTHON"):
        return None
    code = (
        "import platform, sys; print(platform.python_version() + "
        "('t' if hasattr(sys, '_is_gil_enabled') and not sys._is_gil_enabled() else ''))"
    )
    r = subprocess.run([common.workload_python(), "-c", code], capture_output=True, text=True)
    return r.stdout.strip() or "?"


def _probe_pyroscope() -> Optional[str]:
    r = subprocess.run(
        [common.workload_python(), "-c", "import pyroscope"], capture_output=True, text=True
    )
    return None if r.returncode == 0 else "pyroscope-io is not installed (pip install pyroscope-io)"


# -- reading the profiles back ---------------------------------------------------------------


WORK = common.WORK
_med = common.median_or_none
_f = common.fmt_opt


def _query(
    server: common.Server,
    app: str,
    ptype: str,
    start_ns: int,
    end_ns: int,
    spans: Optional[List[str]] = None,
    traces: Optional[List[str]] = None,
    work: Collection[str] = (),
) -> Any:
    """The flame graph totals of an app's profile (``common.flamegraph_totals``); of its samples
    labelled with one of ``spans`` (span ids) or ``traces`` (trace ids, 32 hex digits) when
    given."""
    extra: Dict[str, Any] = {}
    if spans is not None:
        extra["spanSelector"] = spans
    if traces is not None:
        extra["traceIdSelector"] = traces
    graph = common.flamegraph(
        server.url,
        ptype,
        f'{{service_name="{app}"}}',
        # The whole process lifetime and some slack: uploads are stamped with their
        # collection window, which starts before the work and ends at the exit flush.
        start_ns // 1_000_000 - 120_000,
        end_ns // 1_000_000 + 120_000,
        **extra,
    )
    return common.flamegraph_totals(graph, work)


def unavailable(profilers: List[str], server_url: str, log: Log) -> Dict[str, str]:
    """The profilers that cannot run here, and why: they are skipped and named in the
    results."""
    skipped: Dict[str, str] = {}
    if any(p.startswith("hotspan") for p in profilers):
        why = _probe_hotspan(server_url)
        if why:
            skipped.update({p: why for p in profilers if p.startswith("hotspan")})
    if "pyroscope" in profilers:
        why = _probe_pyroscope()
        if why:
            skipped["pyroscope"] = why
    dd = [p for p in profilers if p in DDTRACE_VARIANTS]
    if dd:
        r = subprocess.run(
            [common.workload_python(), "-c", "import ddtrace.profiling"],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            skipped.update({p: "ddtrace is not installed (pip install ddtrace)" for p in dd})
    if any(p.startswith("pyspy") for p in profilers) and not _pyspy_path():
        for p in profilers:
            if p.startswith("pyspy"):
                skipped[p] = "py-spy is not installed (pip install py-spy)"
    for p, why in skipped.items():
        log(f"  skipping {p}: {why}")
    return skipped


def cpu_profile(server: common.Server, run: Dict[str, Any]) -> Tuple[int, Dict[str, int]]:
    """A run's CPU profile, total and per function (ns), with WORK for the run's
    ``work_functions`` if it names them: py-spy's folded file or ddtrace's pprof files
    (removed from the run, which is kept in the results, and from the disk), else what the
    server stored for the run's app."""
    work = run.get("work_functions", ())
    if "folded" in run:
        return _folded_totals(run.pop("folded"), work)
    if "pprof" in run:
        paths = run.pop("pprof")
        try:
            return _pprof_totals(paths, DDTRACE_CPU_TYPE, work)
        finally:
            for path in paths:
                _remove(path)
    return _query(server, run["app"], CPU_TYPE, run["start_ns"], run["end_ns"], work=work)


def _zstd_decompress(data: bytes) -> bytes:
    """ddtrace writes its pprof files zstd-compressed: the standard library's zstd (3.14),
    else backports.zstd (which clickhouse-connect, a test dependency, brings), else the
    ``zstd`` command."""
    try:
        from compression import zstd  # type: ignore[import-not-found]
    except ImportError:
        try:
            from backports import zstd  # type: ignore[no-redef]
        except ImportError:
            return subprocess.run(
                ["zstd", "-dc"], input=data, capture_output=True, check=True
            ).stdout
    return zstd.decompress(data)  # type: ignore[no-any-return]


def _pprof_totals(
    paths: List[str], sample_type: str, work: Collection[str] = ()
) -> Tuple[int, Dict[str, int]]:
    """Total and per-function totals of one sample type of pprof files (each function counted
    once per stack; WORK as ``common.add_stack``)."""
    from hotspan.formats.proto import profile_pb2

    total = 0
    out: Dict[str, int] = {}
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        if data[:4] == b"\x28\xb5\x2f\xfd":  # zstd's magic number
            data = _zstd_decompress(data)
        elif data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        prof = profile_pb2.Profile()
        prof.ParseFromString(data)
        names = [t.decode("utf-8", "replace") for t in prof.string_table]  # bytes here
        types = [names[t.type] for t in prof.sample_type]
        if sample_type not in types:
            continue
        col = types.index(sample_type)
        func = {fu.id: common.base_name(names[fu.name]) for fu in prof.function}
        at = {lo.id: {func[line.function_id] for line in lo.line} for lo in prof.location}
        for sample in prof.sample:
            value = sample.value[col]
            total += value
            common.add_stack(out, set().union(*(at[i] for i in sample.location_id)), value, work)
    return total, out


def _folded_totals(path: str, work: Collection[str] = ()) -> Tuple[int, Dict[str, int]]:
    """py-spy ``--format raw``: ``frame;frame;... count`` lines, root first, each frame
    ``func (file.py:line)``; samples at RATE_HZ become nanoseconds (WORK as
    ``common.add_stack``)."""
    per_sample = 1_000_000_000 // RATE_HZ
    total = 0
    out: Dict[str, int] = {}
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return 0, {}
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        ns = int(count_text) * per_sample
        total += ns
        common.add_stack(out, {common.base_name(fr) for fr in stack.split(";") if fr}, ns, work)
    return total, out


def correctness(workload: str, run: Dict[str, Any], fn: Dict[str, int]) -> Dict[str, Any]:
    """Per-run correctness numbers from per-function CPU totals (ns)."""
    out: Dict[str, Any] = {}
    # The work's CPU: in any of its work_functions where the workload names several.
    seen = fn.get(WORK if "work_functions" in run else run["work_function"], 0) / 1e9
    # Workloads whose own threads do the work count their CPU themselves.
    truth = run.get("threads_cpu_total_s", run["main_thread_cpu_s"])
    if workload == "threads":
        busy, idle = fn.get("busy_part", 0), fn.get("idle_part", 0)
        worker = fn.get("worker", 0)
        out["busy_share_pct"] = 100.0 * busy / worker if worker else None
        out["idle_share_pct"] = 100.0 * idle / worker if worker else None
    # CPU the profile puts in the work function / CPU the workload's threads really used.
    out["cpu_seen_pct"] = 100.0 * seen / truth if truth else None
    if "requests_per_s" in run:
        out["requests_per_s"] = run["requests_per_s"]
    if workload == "cpu_split":
        a, b = fn.get("func_a", 0), fn.get("func_b", 0)
        if a + b:
            share = 100.0 * a / (a + b)
            out["share_a_pct"] = share
            out["true_share_a_pct"] = run["true_share_a_pct"]
            out["split_error_pp"] = share - run["true_share_a_pct"]
    return out


# asyncio_spans' CPU steps, each inside a span of its own (parse, db, render).
SPAN_STEP_FUNCTIONS = ("parse", "query", "render")


def _remove(path: Optional[str]) -> None:
    if path:
        with contextlib.suppress(OSError):
            os.remove(path)


def _span_ids(path: str, spans: int) -> Tuple[List[str], List[str]]:
    """asyncio_spans' ``span_ids_file``: its steps' span ids and its requests' trace ids, in
    hex."""
    ids = array.array("Q")
    with open(path, "rb") as f:
        ids.frombytes(f.read())
    halves = ids[spans:]
    return (
        [f"{x:016x}" for x in ids[:spans]],
        [f"{hi:016x}{lo:016x}" for hi, lo in zip(halves[::2], halves[1::2])],
    )


def span_labels(
    server: common.Server, run: Dict[str, Any], fn: Dict[str, int], ids_file: str
) -> Dict[str, Any]:
    """Span linking, checked: the share of the CPU profile of asyncio_spans' steps (``fn``,
    per function) whose samples carry the span id of the step's own span, and the trace id of
    its request (the ids from the run's ``span_ids_file``)."""
    steps = sum(fn.get(f, 0) for f in SPAN_STEP_FUNCTIONS)
    if not steps:
        return {}
    spans, traces = _span_ids(ids_file, run["span_ids"])
    out: Dict[str, Any] = {}
    for key, selector in (
        ("span_labelled_pct", {"spans": spans}),
        ("trace_labelled_pct", {"traces": traces}),
    ):
        _, sel = _query(server, run["app"], CPU_TYPE, run["start_ns"], run["end_ns"], **selector)
        out[key] = 100.0 * sum(sel.get(f, 0) for f in SPAN_STEP_FUNCTIONS) / steps
    return out


# Short names of the profile types the profiles run reads back.
PROFILE_TYPES = {
    "cpu": CPU_TYPE,
    "wall": WALL_TYPE,
    "alloc_space": ALLOC_SPACE_TYPE,
    "inuse_space": INUSE_SPACE_TYPE,
    "lock_delay": LOCK_DELAY_TYPE,
    "goroutines": GOROUTINE_TYPE,
}


def profiles_readback(server: common.Server, workload: str, run: Dict[str, Any]) -> None:
    """A hotspan run of the profiles bench: the total of every profile type the server
    stored for it (``run["profiles"]``), and the workload's truth against the profile of its
    type (``run["correctness"]``)."""
    fns: Dict[str, Dict[str, int]] = {}
    totals: Dict[str, float] = {}
    for short, ptype in PROFILE_TYPES.items():
        total, fns[short] = _query(server, run["app"], ptype, run["start_ns"], run["end_ns"])
        totals[short] = total
    run["profiles"] = totals
    c: Dict[str, Any] = {}
    if workload in ("cpu_split", "threads", "bursty_threads"):
        c.update(correctness(workload, run, fns["cpu"]))
    if workload == "bursty_threads":
        a, b = fns["cpu"].get("burst_a", 0), fns["cpu"].get("burst_b", 0)
        if a + b:
            c["share_a_pct"] = 100.0 * a / (a + b)
            c["true_share_a_pct"] = run["true_share_a_pct"]
            c["split_error_pp"] = c["share_a_pct"] - run["true_share_a_pct"]
    if workload == "alloc_split":
        a, b = fns["alloc_space"].get("alloc_a", 0), fns["alloc_space"].get("alloc_b", 0)
        if a + b:
            c["alloc_share_a_pct"] = 100.0 * a / (a + b)
            c["true_alloc_share_a_pct"] = run["true_share_a_pct"]
            c["alloc_split_error_pp"] = c["alloc_share_a_pct"] - run["true_share_a_pct"]
            c["alloc_space_seen_pct"] = 100.0 * (a + b) / (run["bytes_a"] + run["bytes_b"])
    if workload == "heap_leak":
        leak = fns["inuse_space"].get("leak_step", 0)
        if totals["inuse_space"]:
            c["leak_seen_pct"] = 100.0 * leak / run["leaked_bytes"]
            c["inuse_total_mib"] = totals["inuse_space"] / 2**20
            c["leaked_mib"] = run["leaked_bytes"] / 2**20
    if workload == "lock_contention" and totals["lock_delay"]:
        c["lock_delay_seen_pct"] = 100.0 * totals["lock_delay"] / run["lock_wait_ns"]
        c["lock_delay_in_acquire_pct"] = (
            100.0 * fns["lock_delay"].get("timed_acquire", 0) / run["lock_wait_ns"]
        )
        c["lock_wait_s"] = run["lock_wait_ns"] / 1e9
    if workload == "threads_tasks":
        g = fns["goroutines"]
        if totals["goroutines"]:
            c["threads_counted"] = g.get("sleeper", 0)
            c["tasks_counted"] = g.get("pending_task", 0)
            c["threads_count_error"] = g.get("sleeper", 0) - run["sleeping_threads"]
            c["tasks_count_error"] = g.get("pending_task", 0) - run["pending_tasks"]
    run["correctness"] = c


def wall_info(workload: str, run: Dict[str, Any], fn: Dict[str, int]) -> Dict[str, Any]:
    """hotspan's wall profile, for information: where the threads' time went, and how often
    its sampler thread really ticked (a late tick is credited with all the wall time since the
    last, so the wall profile alone cannot show a starved sampler)."""
    out: Dict[str, Any] = {}
    if run.get("sampler_ticks") is not None:
        out["ticks_per_s"] = run["sampler_ticks"] / run["work_s"]
    if workload == "threads":
        worker = fn.get("worker", 0)
        if worker:
            out["wall_busy_share_pct"] = 100.0 * fn.get("busy_part", 0) / worker
            out["wall_idle_share_pct"] = 100.0 * fn.get("idle_part", 0) / worker
        # At least this share of the threads' time is in busy_part: the CPU they used there
        # (more if they also waited for the GIL in it).
        out["wall_busy_at_least_pct"] = 100.0 * run["threads_cpu_total_s"] / (4 * run["work_s"])
        # Four threads over the work section.
        out["wall_seen_pct"] = 100.0 * worker / 1e9 / (4 * run["work_s"])
    else:
        out["wall_seen_pct"] = 100.0 * fn.get(run["work_function"], 0) / 1e9 / run["work_s"]
    return out


# -- statistics ------------------------------------------------------------------------------


def _spread(values: List[float], digits: int = 2) -> Dict[str, Any]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {
        "median": round(statistics.median(vals), digits),
        "min": round(min(vals), digits),
        "max": round(max(vals), digits),
        "n": len(vals),
    }


def _unit_ratio_pct(r: Dict[str, Any], base: Dict[str, Any], *keys: str) -> float:
    """The sum of ``keys`` per unit of work, against the no-profiler run, minus 1, in %.  A run
    of a fixed amount of work is one unit; a server run for a fixed time counts its requests
    (``units``), so that its slowdown is time per request, i.e. 1 / requests per second."""
    mine = sum(r[k] for k in keys) / r.get("units", 1)
    theirs = sum(base[k] for k in keys) / base.get("units", 1)
    return 100 * (mine / theirs - 1)


def summarize(
    workload: str, profiler: str, runs: Dict[Tuple[str, int], Dict[str, Any]], rounds: int
) -> Dict[str, Any]:
    """Per-pair ratios against the no-profiler run of the same round, then medians."""
    slow: List[float] = []
    slow_imp: List[float] = []
    slow_proc: List[float] = []
    slow_cpu: List[float] = []
    extra_cpu: List[float] = []
    kernel_cpu: List[float] = []
    agent_cpu: List[float] = []
    ext_cpu: List[float] = []
    rss: List[float] = []
    rss_start: List[float] = []
    imp: List[float] = []
    shut: List[float] = []
    corr: Dict[str, List[float]] = {}
    received: Dict[str, int] = {}
    cut: List[float] = []
    stderr_lines: List[float] = []
    dd_bytes: List[float] = []
    dd_collectors: Set[str] = set()
    exit_residual = _med(
        [
            r["rusage_cpu_s"] - r["process_cpu_s"]
            for (p, _), r in runs.items()
            if p == "none" and "error" not in r
        ]
    )
    errors = []
    for i in range(rounds):
        r, base = runs.get((profiler, i)), runs.get(("none", i))
        if r is not None and "timed_out_s" in r:
            if base is not None and "error" not in base:
                # Killed: its work took at least the time past start-up (~5 s of slack).
                cut.append(100 * ((r["timed_out_s"] - 5.0) / base["work_s"] - 1))
            continue
        if r is None or "error" in r:
            if r is not None:
                errors.append(r["error"])
            continue
        imp.append(1000 * r["import_start_s"])
        shut.append(1000 * r["shutdown_s"])
        for k, v in r.get("correctness", {}).items():
            if isinstance(v, (int, float)):
                corr.setdefault(k, []).append(v)
        for k, v in r.get("wall", {}).items():
            corr.setdefault(k, []).append(v)
        for k, v in r.get("profiles", {}).items():
            received[k] = received.get(k, 0) + (1 if v else 0)
        stderr_lines.append(r.get("stderr_lines", 0))
        if "ddtrace_pprof_bytes" in r:
            dd_bytes.append(r["ddtrace_pprof_bytes"] / 1024)
        dd_collectors.update(r.get("ddtrace_collectors", []))
        if base is None or "error" in base or not r.get("units", 1) or not base.get("units", 1):
            continue
        slow.append(_unit_ratio_pct(r, base, "work_s"))
        slow_imp.append(_unit_ratio_pct(r, base, "import_start_s", "work_s"))
        slow_proc.append(_unit_ratio_pct(r, base, "process_wall_s"))
        # CPU time of the work, all threads: where the work mostly sleeps (threads), a CPU
        # cost hardly shows in wall time.
        slow_cpu.append(_unit_ratio_pct(r, base, "work_cpu_s"))
        # CPU the process used beyond the same work without a profiler, per second of work.
        same_work_cpu = base["work_cpu_s"] * r.get("units", 1) / base.get("units", 1)
        extra = (r["work_cpu_s"] - same_work_cpu) / r["work_s"]
        agent_cpu.append(100 * r["other_threads_cpu_s"] / r["work_s"])
        if "work_sys_s" in r and "work_sys_s" in base:
            # The kernel's part of that (signals, timers, wake-ups: no instruction count sees
            # it), beyond the same work's without a profiler.
            same_work_sys = base["work_sys_s"] * r.get("units", 1) / base.get("units", 1)
            kernel_cpu.append(100 * (r["work_sys_s"] - same_work_sys) / r["work_s"])
        external = 0.0
        rss_mib = (r["maxrss"] - base["maxrss"]) / 2**20
        if "pyspy_peak_rss" in r:
            # py-spy's own CPU: wait4 gives py-spy + its child; the child reported its own
            # just before exiting, and what a process spends after that is taken from the
            # no-profiler runs.
            own = r["rusage_cpu_s"] - r["process_cpu_s"] - (exit_residual or 0.0)
            external = max(own, 0.0) / r["process_wall_s"]
            rss_mib += r["pyspy_peak_rss"] / 2**20
        ext_cpu.append(100 * external)
        extra_cpu.append(100 * (extra + external))
        rss.append(rss_mib)
        rss_start.append((r["rss_after_start"] - r["rss_before_start"]) / 2**20)
    return {
        "workload": workload,
        "profiler": profiler,
        "slowdown_pct": _spread(slow),
        "slowdown_with_import_pct": _spread(slow_imp),
        "process_wall_slowdown_pct": _spread(slow_proc),
        "cpu_time_slowdown_pct": _spread(slow_cpu),
        "import_start_ms": _spread(imp, 1),
        "shutdown_ms": _spread(shut, 1),
        "profiler_cpu_pct_of_core": _spread(extra_cpu, 1),
        "kernel_cpu_pct_of_core": _spread(kernel_cpu, 1),
        "agent_threads_cpu_pct_of_core": _spread(agent_cpu, 1),
        "external_cpu_pct_of_core": _spread(ext_cpu, 1),
        "rss_overhead_mib": _spread(rss, 1),
        "rss_at_start_mib": _spread(rss_start, 1),
        "correctness": {k: _spread(v) for k, v in corr.items()},
        # Runs killed for taking too long: the slowdown each had at least.
        "cut_runs_slowdown_at_least_pct": _spread(cut, 0),
        # Profile type -> in how many runs the server had some of it.
        "profiles_received": received,
        "stderr_lines": _spread(stderr_lines, 0),
        "ddtrace_pprof_kib": _spread(dd_bytes, 0),
        "ddtrace_collectors": sorted(dd_collectors),
        "errors": errors,
    }


# -- the benchmark ---------------------------------------------------------------------------


def run(
    quick: bool = False,
    log: Log = common.log,
    rounds: Optional[int] = None,
    seconds: Optional[float] = None,
    profilers: Optional[List[str]] = None,
    workloads: Optional[List[str]] = None,
    seed: int = 1,
    profiles: bool = False,
    defaults: bool = False,
) -> Dict[str, Any]:
    """The interleaved rounds.  ``profiles``: the profiles run (every profile type on, against
    ddtrace and tracemalloc, and the truth workloads); ``defaults``: the defaults run (every
    profiler as it ships, and stack-only hotspan and ddtrace, on DEFAULTS_WORKLOADS); each has
    its own workloads and profilers unless given."""
    if profiles:
        cfg = dict(PROFILES_QUICK if quick else PROFILES_FULL)
        default_workloads = PROFILE_WORKLOADS + TRUTH_WORKLOADS
    elif defaults:
        cfg = dict(DEFAULTS_QUICK if quick else DEFAULTS_FULL)
        default_workloads = DEFAULTS_WORKLOADS
    else:
        cfg = dict(QUICK if quick else FULL)
        default_workloads = WORKLOADS
    n_rounds = int(rounds or cfg["rounds"])
    secs = float(seconds or cfg["seconds"])
    workloads = list(workloads or default_workloads)
    # A workload another change has not written yet is named in the results, not faked.
    missing = [w for w in workloads if not os.path.exists(_workload_path(w))]
    workloads = [w for w in workloads if w not in missing]
    per_workload: Dict[str, List[str]] = {}
    for w in workloads:
        if profilers:
            per_workload[w] = list(profilers)
        elif profiles:
            per_workload[w] = list(TRUTH_PROFILERS.get(w, ["hotspan"]))
            if w in PROFILE_WORKLOADS:
                per_workload[w] = list(PROFILE_PROFILERS)
        elif defaults:
            per_workload[w] = list(DEFAULTS_PROFILERS)
        else:
            per_workload[w] = PROFILERS + DEFAULT_EXTRA.get(w, [])
        # The truth workloads compare a profile with the workload's own count, not with a
        # run without profiler.
        if "none" not in per_workload[w] and not (profiles and w in TRUTH_WORKLOADS):
            per_workload[w].insert(0, "none")
    profilers = sorted({p for ps in per_workload.values() for p in ps}, key=ALL_PROFILERS.index)
    tmp = tempfile.mkdtemp(prefix="hotspan-bench-agent-")
    server = common.Server(os.path.join(tmp, "data")).start()
    skipped: Dict[str, str] = {}
    report: Dict[str, Any] = {
        "params": {
            "quick": quick,
            "rounds": n_rounds,
            "seconds_of_work": secs,
            "rate_hz": RATE_HZ,
            "workloads": workloads,
            "profilers": profilers,
            "seed": seed,
            "profiles": profiles,
            "defaults": defaults,
            "python": _workload_python_version(),
        },
        "missing_workloads": missing,
        # Which collector modules exist in the tree measured (a missing one sends nothing).
        "collectors": _collector_modules(),
        "versions": _versions(),
        "hotspan_defaults": _hotspan_defaults(),
        # Other work on the machine during the bench shows up as noise; this says if there was.
        "loadavg_start": common.loadavg(),
    }
    try:
        skipped = unavailable(profilers, server.url, log)
        active = {w: [p for p in ps if p not in skipped] for w, ps in per_workload.items()}

        params = {}
        for w in workloads:
            work_s = secs
            if profiles:
                work_s = FIXED_SECONDS.get(w, secs)
            elif defaults and not quick:
                work_s = max(secs, DEFAULTS_MIN_SECONDS.get(w, 0.0))
            params[w] = common.calibrate_agent_workload(w, work_s)
            if defaults and w == "asyncio_spans":
                params[w]["span_ids"] = True  # the truth for the span labels check
            log(f"  calibrated {w}: {params[w]}")
        report["workload_params"] = params

        nonce = uuid.uuid4().hex[:6]
        rng = random.Random(seed)
        runs: Dict[str, Dict[Tuple[str, int], Dict[str, Any]]] = {w: {} for w in workloads}
        total = n_rounds * sum(len(ps) for ps in active.values())
        done = 0
        t_start = time.perf_counter()
        for i in range(n_rounds):
            for w in workloads:
                order = active[w][:]
                rng.shuffle(order)
                for p in order:
                    app = f"agentbench-{nonce}-{w}-{p}-r{i}"
                    runs[w][(p, i)] = run_one(
                        w, p, params[w], server.url, app, tmp, timeout=_timeout(p, secs)
                    )
                    done += 1
                    if "error" in runs[w][(p, i)]:
                        log(f"  {w}/{p} round {i}: {runs[w][(p, i)]['error'][-300:]}")
            el = time.perf_counter() - t_start
            log(
                f"  round {i + 1}/{n_rounds} done ({done}/{total} runs, {el:.0f} s, "
                f"~{el / done * (total - done):.0f} s to go)"
            )

        # Profiles are read after all runs, so that no query competes with a measured run.
        for w in workloads:
            for (p, _), r in runs[w].items():
                ids_file = r.pop("span_ids_file", None)
                try:
                    if "error" in r or p.startswith("none") or p in NO_CPU_PROFILE:
                        continue
                    if profiles:
                        if p.startswith("hotspan"):
                            profiles_readback(server, w, r)
                        continue
                    total_ns, fn = cpu_profile(server, r)
                    r["profile_cpu_total_s"] = total_ns / 1e9
                    r["correctness"] = correctness(w, r, fn)
                    if ids_file and p.startswith("hotspan"):
                        r["correctness"].update(span_labels(server, r, fn, ids_file))
                    if p.startswith("hotspan") and not defaults:
                        _, wall_fn = _query(server, r["app"], WALL_TYPE, r["start_ns"], r["end_ns"])
                        r["wall"] = wall_info(w, r, wall_fn)
                except (OSError, RuntimeError, KeyError, ValueError, DecodeError) as exc:
                    r["correctness"] = {"error": str(exc)}
                except subprocess.SubprocessError as exc:  # zstd, for ddtrace's profiles
                    r["correctness"] = {"error": str(exc)}
                finally:
                    # What was not read: the span ids but for hotspan, ddtrace's profiles in the
                    # profiles run.
                    for path in [ids_file, *r.pop("pprof", [])]:
                        _remove(path)
        report["skipped"] = skipped
        report["results"] = {
            w: {p: summarize(w, p, runs[w], n_rounds) for p in active[w] if p != "none"}
            for w in workloads
        }
        report["baseline"] = {w: _baseline(runs[w]) for w in workloads}
        report["runs"] = {
            w: [dict(r, round=i) for (p, i), r in sorted(runs[w].items(), key=lambda kv: kv[0][1])]
            for w in workloads
        }
        # Again at the end: a collector written while the bench ran sent in the later runs.
        report["collectors"] = _collector_modules()
        if profiles:
            report["targets"] = profiles_targets(report)
        elif defaults:
            report["targets"] = defaults_targets(report)
        else:
            report["targets"] = targets(report)
        report["loadavg_end"] = common.loadavg()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _baseline(runs: Dict[Tuple[str, int], Dict[str, Any]]) -> Dict[str, Any]:
    """The no-profiler runs' work time, CPU, peak RSS (and requests/s for a server)."""
    base = [r for (p, _), r in runs.items() if p == "none" and "error" not in r]
    out = {
        "work_s": _spread([r["work_s"] for r in base], 3),
        "maxrss_mib": _spread([r["maxrss"] / 2**20 for r in base], 1),
        "work_cpu_s": _spread([r["work_cpu_s"] for r in base], 3),
    }
    if any("requests_per_s" in r for r in base):
        out["requests_per_s"] = _spread([r.get("requests_per_s") for r in base], 0)
    return out


# The settings of hotspan's that say what its defaults profile.
_HOTSPAN_SETTINGS = (
    "cpu",
    "wall",
    "trace_correlation",
    "alloc_sample_bytes",
    "locks",
    "threads",
    "span_stats",
    "error_condition",
    "max_overhead",
)


def _hotspan_defaults() -> Dict[str, Any]:
    """What hotspan profiles by default, in the tree measured (none where it does not say)."""
    try:
        from hotspan.agent.config import AgentConfig
    except ImportError:
        return {}
    return {k: getattr(AgentConfig, k) for k in _HOTSPAN_SETTINGS if hasattr(AgentConfig, k)}


def _versions() -> Dict[str, str]:
    return common.tool_versions(common.AGENT_TOOLS)


def targets(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The agent's targets, checked for hotspan."""
    res = report["results"]
    rows: List[Dict[str, Any]] = []

    def add(what: str, measured: Optional[float], ok: Optional[bool], unit: str) -> None:
        rows.append({"target": what, "measured": measured, "unit": unit, "ok": ok})

    for w, per in res.items():
        h = per.get("hotspan")
        if not h:
            continue
        for key, label in (
            ("slowdown_pct", "work"),
            ("slowdown_with_import_pct", "import+start+work"),
        ):
            m = h[key]["median"]
            add(
                f"{w}: slowdown ({label}) median <= {TARGET_SLOWDOWN_PCT}%",
                m,
                None if m is None else m <= TARGET_SLOWDOWN_PCT,
                "%",
            )
        m = h["rss_overhead_mib"]["median"]
        add(f"{w}: RSS overhead < {TARGET_RSS_MIB} MiB", m, None if m is None else m < 10, "MiB")
        c = h["correctness"]
        if w == "cpu_split":
            e = c.get("split_error_pp", {})
            worst = None if e.get("n", 0) == 0 else max(abs(e["min"]), abs(e["max"]))
            add(
                f"cpu_split: 75/25 split within {TARGET_SPLIT_PP} pp (worst run)",
                worst,
                None if worst is None else worst <= TARGET_SPLIT_PP,
                "pp",
            )
        if w == "threads":
            b = c.get("busy_share_pct", {}).get("min")
            add(
                f"threads: >= {TARGET_BUSY_SHARE_PCT}% of CPU profile in busy_part (worst run)",
                b,
                None if b is None else b >= TARGET_BUSY_SHARE_PCT,
                "%",
            )
        # The same check on the busy programs (the target for threads, applied to
        # them): a starved sampler shows here first.
        if w == "threads" or w in BUSY_WORKLOADS:
            s = c.get("cpu_seen_pct", {})
            worst = None if s.get("n", 0) == 0 else max(abs(s["min"] - 100), abs(s["max"] - 100))
            add(
                f"{w}: profiled CPU within {TARGET_CPU_RATIO_PCT}% of thread_time "
                "(worst run, |seen - 100%|)",
                worst,
                None if worst is None else worst <= TARGET_CPU_RATIO_PCT,
                "%",
            )
    return rows


def _worst_abs(values: List[float], centre: float = 0.0) -> Optional[float]:
    vals = [abs(v - centre) for v in values if v is not None]
    return max(vals) if vals else None


def _per_run(
    report: Dict[str, Any], w: str, key: str, min_work_s: float = 0.0, profiler: str = "hotspan"
) -> List[float]:
    """A correctness number of each run of ``profiler`` on ``w`` that has it."""
    return [
        r["correctness"][key]
        for r in report.get("runs", {}).get(w, [])
        if r.get("profiler") == profiler
        and "error" not in r
        and r.get("work_s", 0) >= min_work_s
        and r.get("correctness", {}).get(key) is not None
    ]


def profiles_targets(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The profiles run's budget and correctness targets, for hotspan with every profile type on.  A
    row whose profile type has no collector in the tree says so ("missing")."""
    res = report["results"]
    have = set(report.get("collectors", []))
    rows: List[Dict[str, Any]] = []

    def add(
        what: str, measured: Optional[float], ok: Optional[bool], unit: str, note: str = ""
    ) -> None:
        rows.append({"target": what, "measured": measured, "unit": unit, "ok": ok, "note": note})

    def per_run(w: str, key: str, min_work_s: float = 0.0) -> List[float]:
        return _per_run(report, w, key, min_work_s)

    for w in report.get("missing_workloads", []):
        add(f"{w}: workload", None, None, "", f"missing: bench/agent_workloads/{w}.py")
    for w in PROFILE_WORKLOADS:
        h = res.get(w, {}).get("hotspan")
        if not h:
            continue
        m = h["slowdown_pct"]["median"]
        add(
            f"{w}: slowdown, every profile type on, median <= {TARGET_PROFILES_SLOWDOWN_PCT}%",
            m,
            None if m is None else m <= TARGET_PROFILES_SLOWDOWN_PCT,
            "%",
        )
        m = h["rss_overhead_mib"]["median"]
        add(
            f"{w}: RSS overhead <= +{TARGET_PROFILES_RSS_MIB} MiB",
            m,
            None if m is None else m <= TARGET_PROFILES_RSS_MIB,
            "MiB",
        )

    def truth_row(
        w: str, key: str, collector: str, what: str, limit: float, unit: str, centre: float = 0
    ) -> None:
        if w not in res:
            return
        if collector and collector not in have:
            add(what, None, None, unit, f"missing: no `collectors/{collector}.py`")
            return
        worst = _worst_abs(per_run(w, key), centre)
        note = "" if worst is not None else "no profile of this type reached the server"
        add(what, worst, None if worst is None else worst <= limit, unit, note)

    truth_row(
        "alloc_split",
        "alloc_split_error_pp",
        "alloc",
        f"alloc_split: alloc_space 75/25 within {TARGET_ALLOC_SPLIT_PP} pp (worst run)",
        TARGET_ALLOC_SPLIT_PP,
        "pp",
    )
    truth_row(
        "heap_leak",
        "leak_seen_pct",
        "alloc",
        f"heap_leak: inuse_space of the leaking stack within {TARGET_LEAK_PCT}% of the bytes "
        "leaked (worst run, |seen - 100%|)",
        TARGET_LEAK_PCT,
        "%",
        100.0,
    )
    truth_row(
        "lock_contention",
        "lock_delay_seen_pct",
        "locks",
        f"lock_contention: total delay within {TARGET_LOCK_DELAY_PCT}% of the measured wait "
        "(worst run, |seen - 100%|)",
        TARGET_LOCK_DELAY_PCT,
        "%",
        100.0,
    )
    for key, what in (("threads_count_error", "threads"), ("tasks_count_error", "tasks")):
        truth_row(
            "threads_tasks",
            key,
            "threads",
            f"threads_tasks: {what} counted exactly (worst run, |counted - true|)",
            0,
            what,
        )
    for w in ("cpu_split", "threads", "bursty_threads"):
        if w not in res:
            continue
        vals = per_run(w, "cpu_seen_pct", MIN_CPU_RUN_S)
        worst = _worst_abs(vals, 100.0)
        add(
            f"{w}: profiled CPU within {TARGET_PROFILES_CPU_PCT}% of thread_time (worst of "
            f"{len(vals)} runs >= {MIN_CPU_RUN_S:g} s, |seen - 100%|)",
            worst,
            None if worst is None else worst <= TARGET_PROFILES_CPU_PCT,
            "%",
            "" if vals else f"no run of {MIN_CPU_RUN_S:g} s or more",
        )
        if w in ("cpu_split", "bursty_threads"):
            vals = per_run(w, "split_error_pp", MIN_CPU_RUN_S)
            worst = _worst_abs(vals)
            add(
                f"{w}: 75/25 within {TARGET_PROFILES_SPLIT_PP} pp (worst of {len(vals)} "
                f"runs >= {MIN_CPU_RUN_S:g} s)",
                worst,
                None if worst is None else worst <= TARGET_PROFILES_SPLIT_PP,
                "pp",
                "" if vals else f"no run of {MIN_CPU_RUN_S:g} s or more",
            )
    return rows


def defaults_targets(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The defaults run's targets, for hotspan with its defaults: its budget on every
    workload (medians over rounds) and its accuracy (every run)."""
    rows: List[Dict[str, Any]] = []

    def add(what: str, measured: Optional[float], ok: Optional[bool], unit: str) -> None:
        rows.append({"target": what, "measured": measured, "unit": unit, "ok": ok})

    def at_most(what: str, measured: Optional[float], limit: float, unit: str) -> None:
        add(what, measured, None if measured is None else measured <= limit, unit)

    lo, hi = TARGET_CPU_SEEN
    for w, per in report["results"].items():
        h = per.get("hotspan")
        if not h:
            continue
        at_most(
            f"{w}: slowdown, median <= {TARGET_DEFAULTS_SLOWDOWN_PCT:g}%",
            h["slowdown_pct"]["median"],
            TARGET_DEFAULTS_SLOWDOWN_PCT,
            "%",
        )
        at_most(
            f"{w}: process CPU, median <= +{TARGET_DEFAULTS_CPU_PCT:g}%",
            h["cpu_time_slowdown_pct"]["median"],
            TARGET_DEFAULTS_CPU_PCT,
            "%",
        )
        at_most(
            f"{w}: peak RSS, median <= +{TARGET_DEFAULTS_RSS_MIB:g} MiB",
            h["rss_overhead_mib"]["median"],
            TARGET_DEFAULTS_RSS_MIB,
            "MiB",
        )
        seen = [v / 100 for v in _per_run(report, w, "cpu_seen_pct")]
        worst = max(seen, key=lambda v: abs(v - 1), default=None)
        add(
            f"{w}: CPU seen {lo:g}-{hi:g} (worst of {len(seen)} runs)",
            worst,
            None if worst is None else lo <= worst <= hi,
            "",
        )
        if w == "cpu_split":
            at_most(
                f"cpu_split: 75/25 split within {TARGET_SPLIT_PP} pp (worst run)",
                _worst_abs(_per_run(report, w, "split_error_pp")),
                TARGET_SPLIT_PP,
                "pp",
            )
        if w == "asyncio_spans":
            for key, what in (("span_labelled_pct", "span"), ("trace_labelled_pct", "trace")):
                least = min(_per_run(report, w, key), default=None)
                add(
                    f"asyncio_spans: >= {TARGET_SPAN_LABELLED_PCT:g}% of the CPU in "
                    f"parse/query/render labelled with its {what} (worst run)",
                    least,
                    None if least is None else least >= TARGET_SPAN_LABELLED_PCT,
                    "%",
                )
    return rows


# -- report ----------------------------------------------------------------------------------


def _longer_runs(report: Dict[str, Any]) -> str:
    """The workloads a defaults run gave more work than the rest, with why, for its text."""
    secs = report["params"]["seconds_of_work"]
    longer = {
        w: float(s)
        for w, s in DEFAULTS_MIN_SECONDS.items()
        if w in report.get("workload_params", {}) and s > secs and not report["params"]["quick"]
    }
    if not longer:
        return ""
    names = ", ".join(f"{w} ~{s:g} s" for w, s in longer.items())
    return (
        f"; {names}, so that its 75/25 error is the profiler's, not where 100 Hz samples fall "
        "against its changes of function"
    )


def _range(s: Dict[str, Any], digits: int = 1, sign: bool = True) -> str:
    if not s or s.get("median") is None:
        return "–"
    lo, hi = _f(s["min"], digits, sign), _f(s["max"], digits, sign)
    return f"{_f(s['median'], digits, sign)} [{lo}..{hi}]"


_WORKLOAD_TITLES = {
    "cpu_split": "CPU-bound, `func_a`/`func_b` at 75/25",
    "threads": "4 threads: 1 ms CPU (`busy_part`) + 4 ms sleep (`idle_part`) each",
    "alloc": "allocation-heavy loop",
    "asyncio_spans": "asyncio requests with nested OpenTelemetry SDK spans",
    "asyncio_yield": "a coroutine: ~1 ms pure-Python calls, `await asyncio.sleep(0)` between, "
    "in an OpenTelemetry span",
    "socket_pingpong": "a loop: ~0.1 ms pure-Python calls, a 32-byte send/recv to an echo "
    "process between",
    "web_server": "Starlette on uvicorn under load from another process (8 keep-alive "
    "connections; server and load on cores of their own)",
    "wsgi_threaded": "a WSGI app on wsgiref's server, a thread per connection, under load from "
    "another process (8 keep-alive connections; server and load on cores of their own)",
}
_PROFILER_TITLES = {
    # The agent's defaults: every profile type on.
    "hotspan": "hotspan, every profile type on",
    "hotspan-cpuonly": "hotspan, CPU and wall only",
    "hotspan-cpuwall": "hotspan, CPU and wall only (and span linking)",
    "ddtrace": "ddtrace profiler as it ships",
    "ddtrace-stack": "ddtrace profiler, stack sampler only",
    "tracemalloc": "tracemalloc, 25 frames",
    "none-again": "*no profiler, again (A/A: the noise)*",
    "pyspy": "py-spy `record --nonblocking`",
    "pyspy-blocking": "py-spy `record` (blocking)",
    "pyroscope": "pyroscope-io (defaults: `gil_only=True`)",
    "hotspan-nospans": "hotspan, `trace_correlation=False`",
    "hotspan-nowall": "hotspan, `wall=False`",
    "hotspan-nolocks": "hotspan, `locks=False`",
    "hotspan-nothreads": "hotspan, `threads=False`",
    "hotspan-noalloc": "hotspan, `alloc_sample_bytes=0`",
    "hotspan-timer": "hotspan, CPU timers only (`HOTSPAN_CPU_TRIGGER=timer`)",
    "hotspan-python": "hotspan, `native=False` (pure-Python sampler)",
    "hotspan-idle": "hotspan, every profile type and span feature off (the agent idle)",
}


def _head(
    title: str,
    a: Dict[str, Any],
    command: str,
    machine: Dict[str, Any],
    wall_s: float,
    more: str = "",
) -> List[str]:
    """A report's first lines: title, command, the machine, the versions measured and the load
    average around the run (and ``more`` after them)."""
    load = (a["loadavg_start"], a.get("loadavg_end"))
    python = a["params"].get("python")
    if python:
        more = f" The workloads ran on CPython {python} (`--python`)." + more
    return [
        *common.head(
            f"{title}{' (quick)' * a['params']['quick']}",
            command,
            wall_s,
            common.machine_text(machine, a["versions"], load) + more,
        ),
        "",
    ]


def _targets_table(a: Dict[str, Any], what: str) -> List[str]:
    """The report's targets, checked: a section of its own (none without targets)."""
    rows = a.get("targets") or []
    if not rows:
        return []
    out = ["", f"## Targets ({what})", "", "| target | measured | verdict |", "|---|---:|---|"]
    for r in rows:
        if r["ok"] is None:
            verdict = r.get("note") or "–"
        else:
            verdict = "meets target" if r["ok"] else "**misses**"
        digits = 2 if r["unit"] else 3  # a ratio (CPU seen) has no unit
        out.append(f"| {r['target']} | {_f(r['measured'], digits)} {r['unit']} | {verdict} |")
    return out


def _correctness_text(workload: str, c: Dict[str, Any]) -> str:
    def med(key: str) -> Optional[float]:
        return c.get(key, {}).get("median")

    parts = []
    if workload == "cpu_split" and med("share_a_pct") is not None:
        e = c["split_error_pp"]
        parts.append(
            f"func_a {_f(med('share_a_pct'))}% (true {_f(med('true_share_a_pct'))}%), "
            f"error {_range(e)} pp"
        )
    if workload == "threads" and med("busy_share_pct") is not None:
        parts.append(
            f"busy_part {_f(med('busy_share_pct'))}%, idle_part {_f(med('idle_share_pct'))}%"
            f" [worst busy {_f(c['busy_share_pct']['min'])}%]"
        )
    if med("cpu_seen_pct") is not None:
        s = c["cpu_seen_pct"]
        parts.append(f"CPU seen {_f(s['median'])}% [{_f(s['min'])}..{_f(s['max'])}]")
    if workload != "threads" and med("wall_seen_pct") is not None:
        s = c["wall_seen_pct"]
        parts.append(f"wall/elapsed {_f(s['median'])}% [{_f(s['min'])}..{_f(s['max'])}]")
    elif workload in BUSY_WORKLOADS and "cpu_seen_pct" in c:
        parts.append("wall/elapsed – (no wall profile)")
    if med("ticks_per_s") is not None:
        parts.append(f"sampler ticks {_f(med('ticks_per_s'), 0)}/s")
    if med("requests_per_s") is not None:
        parts.append(f"{_f(med('requests_per_s'), 0)} req/s")
    if med("wall_busy_share_pct") is not None:
        parts.append(
            f"(wall profile: busy_part {_f(med('wall_busy_share_pct'))}%, "
            f"truth >= {_f(med('wall_busy_at_least_pct'))}%)"
        )
    if "error" in c:
        parts.append(f"error: {c['error']}")
    return "; ".join(parts) or "–"


def markdown(report: Dict[str, Any], command: str, machine: Dict[str, Any], wall_s: float) -> str:
    a = report
    p = a["params"]
    lines = _head("hotspan agent overhead and correctness", a, command, machine, wall_s)
    add = lines.append
    add(
        f"Every profiler samples at {p['rate_hz']} Hz. {p['rounds']} rounds; in each, every "
        f"workload runs once per profiler, in a shuffled order, each run a fresh process doing "
        f"~{p['seconds_of_work']:g} s of identical work (sizes calibrated once per bench). "
        "**Slowdown** = median over rounds of work time / work time of the no-profiler run of "
        "the same round, minus 1 [min..max over rounds]; the work section is timed alone with "
        "`perf_counter`, and *with import+start* adds the time to import and start the agent "
        "to both sides. **CPU time** = the same ratio for the CPU time of the work (all "
        "threads; where the work mostly sleeps, as in `threads`, wall time hides a CPU cost). "
        "The *no profiler, again* row is a second no-profiler run in every round, compared "
        "like a profiler: its numbers are what noise alone gives. "
        "**Profiler CPU** = CPU the profiled process used beyond the "
        "no-profiler run of the same round during the work, plus (py-spy) py-spy's own "
        "process, as % of one core. **RSS overhead** = peak RSS minus the no-profiler run's "
        "(plus py-spy's own peak RSS). **CPU seen** = CPU the profile puts in the workload's "
        "work function / CPU its threads really used (`time.thread_time`)."
    )
    if set(a["results"]) & set(BUSY_WORKLOADS):
        add("")
        add(
            "Busy programs: **wall/elapsed** = the wall profile of the work function (only the "
            "main thread runs it) / the work's elapsed time; only hotspan sends a wall profile. "
            "**Sampler ticks** = how often hotspan's sampler thread ran per second of work "
            "(100 wanted), counted in the process: a late tick is credited with all the wall "
            "time since the last one (up to 1 s), so wall/elapsed alone hides a starved "
            "sampler. `web_server` runs for a fixed time: its slowdown is time per request "
            "(no-profiler requests/s / requests/s, minus 1), CPU time is CPU per request, and "
            "CPU seen compares with the server's main thread (uvicorn's event loop, all of "
            "the work)."
        )
    if a.get("skipped"):
        add("")
        for prof, why in a["skipped"].items():
            add(f"Not measured: {prof} — {why}")
    for w, per in a["results"].items():
        base = a["baseline"][w]
        add("")
        add(f"## {_WORKLOAD_TITLES.get(w, w)} (`bench/agent_workloads/{w}.py`)")
        add("")
        add(
            f"No profiler: work {_f(base['work_s']['median'], 2)} s "
            f"[{_f(base['work_s']['min'], 2)}..{_f(base['work_s']['max'], 2)}], "
            f"CPU {_f(base['work_cpu_s']['median'], 2)} s, peak RSS "
            f"{_f(base['maxrss_mib']['median'])} MiB"
            + (
                f", {_range(base['requests_per_s'], 0, False)} requests/s."
                if "requests_per_s" in base
                else "."
            )
        )
        add("")
        add(
            "| profiler | slowdown % | with import+start % | CPU time % | import+start ms "
            "| shutdown ms | profiler CPU, % of a core | RSS overhead MiB | correctness |"
        )
        add("|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for prof, s in per.items():
            add(
                f"| {_PROFILER_TITLES.get(prof, prof)} | {_range(s['slowdown_pct'])} | "
                f"{_range(s['slowdown_with_import_pct'])} | "
                f"{_range(s['cpu_time_slowdown_pct'])} | "
                f"{_f(s['import_start_ms']['median'])} | {_f(s['shutdown_ms']['median'])} | "
                f"{_f(s['profiler_cpu_pct_of_core']['median'])} | "
                f"{_f(s['rss_overhead_mib']['median'])} | "
                f"{_correctness_text(w, s['correctness'])} |"
            )
            if s["errors"]:
                add(f"| | {len(s['errors'])} failed run(s): `{s['errors'][0][-200:]!r}` ||||||||")
    lines += _targets_table(a, "hotspan")
    add("")
    add(
        "Notes: shutdown includes the final upload (hotspan runs with `upload_interval=3600` so "
        "that only this one happens; pyroscope-io keeps its default 10 s, so a run may include "
        "one periodic upload). py-spy has no import+start: its start-up cost shows in the "
        "whole-process times in `agent.json` (`process_wall_slowdown_pct`). On a 2-core VM "
        "single runs vary by several percent; the medians of per-round ratios are what to read."
    )
    add("")
    return "\n".join(lines)


_WORKLOAD_TITLES.update(
    {
        "gc_containers": "many container objects, the cyclic GC busy",
        "alloc_split": "`alloc_a`/`alloc_b` allocating 75/25 of the bytes",
        "heap_leak": "a leak at a known rate, 8x as many bytes freed beside it",
        "lock_contention": "two threads on a lock held 5 ms of every 10 ms",
        "threads_tasks": "sleeping threads and pending asyncio tasks on known stacks",
        "bursty_threads": "bursty threads (CPU bursts and sleeps)",
    }
)


def _truth_text(workload: str, c: Dict[str, Any]) -> str:
    """The profiles run's correctness column: the profile against the workload's truth."""

    def med(key: str) -> Optional[float]:
        return c.get(key, {}).get("median")

    parts = []
    if med("alloc_share_a_pct") is not None:
        parts.append(
            f"alloc_space of alloc_a {_f(med('alloc_share_a_pct'), 2)}% (true "
            f"{_f(med('true_alloc_share_a_pct'), 2)}%), error "
            f"{_range(c['alloc_split_error_pp'], 2)} pp; alloc_space / bytes allocated "
            f"{_range(c['alloc_space_seen_pct'], 1, False)}%"
        )
    if med("leak_seen_pct") is not None:
        parts.append(
            f"inuse_space of leak_step / bytes leaked {_range(c['leak_seen_pct'], 1, False)}% "
            f"(leaked {_f(med('leaked_mib'), 0)} MiB; all stacks "
            f"{_f(med('inuse_total_mib'), 0)} MiB)"
        )
    if med("lock_delay_seen_pct") is not None:
        parts.append(
            f"total delay / measured wait {_range(c['lock_delay_seen_pct'], 1, False)}% "
            f"(wait {_f(med('lock_wait_s'), 2)} s; in timed_acquire "
            f"{_f(med('lock_delay_in_acquire_pct'))}%)"
        )
    if med("threads_counted") is not None:
        parts.append(
            f"threads in sleeper {_range(c['threads_counted'], 0, False)}, tasks in "
            f"pending_task {_range(c['tasks_counted'], 0, False)}"
        )
    if med("cpu_seen_pct") is not None:
        parts.append(f"CPU seen {_range(c['cpu_seen_pct'], 1, False)}%")
    if med("split_error_pp") is not None:
        parts.append(f"75/25 error {_range(c['split_error_pp'], 2)} pp")
    if "error" in c:
        parts.append(f"error: {c['error']}")
    return "; ".join(parts) or "–"


def _received_text(s: Dict[str, Any]) -> str:
    got = s.get("profiles_received") or {}
    parts = [f"{k} {n}" for k, n in got.items() if n]
    text = ("profiles (runs): " + ", ".join(parts)) if got else ""
    if s.get("ddtrace_pprof_kib", {}).get("median") is not None:
        text += f"pprof written {_f(s['ddtrace_pprof_kib']['median'], 0)} KiB"
    lines = s.get("stderr_lines", {}).get("max")
    if lines:
        text += f"; stderr lines up to {lines:.0f}"
    return text or "–"


def markdown_profiles(
    report: Dict[str, Any], command: str, machine: Dict[str, Any], wall_s: float
) -> str:
    a = report
    p = a["params"]
    collectors = ", ".join(a.get("collectors", [])) or "none"
    lines = _head(
        "hotspan agent: every profile type, overhead and correctness",
        a,
        command,
        machine,
        wall_s,
        f" Collector modules present: {collectors}.",
    )
    add = lines.append
    add(
        f"{p['rounds']} interleaved rounds; in each, every workload runs once per profiler in "
        f"a shuffled order, each run a fresh process doing ~{p['seconds_of_work']:g} s of "
        "identical work. **hotspan** runs with its defaults: CPU and wall at "
        f"{p['rate_hz']} Hz, allocations and live heap sampled every 512 KiB on average, "
        "lock contention, threads and tasks. **ddtrace** is `import ddtrace.profiling.auto` "
        "with `DD_PROFILING_ENABLED` true and its defaults (its stack, memory and lock "
        "collectors are on by default in ddtrace 4.x; `agent-profiles.json` lists the "
        "collectors that ran, `ddtrace_collectors`), writing its profiles with its file "
        "exporter (`DD_PROFILING_OUTPUT_PPROF`; no Datadog agent "
        "here). **tracemalloc** is `tracemalloc.start(25)`, a snapshot taken at the end. "
        "**Slowdown** = median over rounds of work time / no-profiler work time of the same "
        "round, minus 1 [min..max]; **CPU time** = the same for the CPU time of the work (all "
        "threads). **Extra CPU** = CPU beyond the no-profiler run of the same round per "
        "second of work, in % of one core: the profiler's CPU per second of profiled time, "
        "wherever it is spent (its threads, hooks on the program's own threads); **profiler "
        "threads** = the CPU of threads other than the program's, same unit. **RSS** = peak "
        "RSS minus the no-profiler run's. The *no profiler, again* row is a second "
        "no-profiler run per round: the noise."
    )
    for w in a.get("missing_workloads", []):
        add("")
        add(f"Not measured: `{w}` — `bench/agent_workloads/{w}.py` does not exist yet.")
    for prof, why in (a.get("skipped") or {}).items():
        add("")
        add(f"Not measured: {prof} — {why}")
    overhead = [w for w in a["results"] if w in PROFILE_WORKLOADS or w not in TRUTH_WORKLOADS]
    for w in overhead:
        per = a["results"][w]
        base = a["baseline"][w]
        add("")
        add(f"## {_WORKLOAD_TITLES.get(w, w)} (`bench/agent_workloads/{w}.py`)")
        add("")
        add(
            f"No profiler: work {_range(base['work_s'], 2, False)} s, CPU "
            f"{_f(base['work_cpu_s']['median'], 2)} s, peak RSS "
            f"{_f(base['maxrss_mib']['median'])} MiB."
        )
        add("")
        add(
            "| profiler | slowdown % | CPU time % | extra CPU, % of a core | profiler threads, "
            "% of a core | import+start ms | shutdown ms | RSS MiB | correctness | profiles |"
        )
        add("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for prof, st in per.items():
            slow = _range(st["slowdown_pct"])
            cut = st.get("cut_runs_slowdown_at_least_pct", {})
            if cut.get("n"):
                # Below zero when the no-profiler run itself took longer than the cut: then the
                # cut says nothing but that the run was killed.
                least = f", so > +{_f(cut['min'], 0)}" if cut["min"] > 0 else ""
                slow = (
                    f"{cut['n']} run(s) killed at {SLOW_PROFILERS.get(prof, 0):g}x the work + "
                    f"5 s{least}; others {slow}"
                )
            add(
                f"| {_PROFILER_TITLES.get(prof, prof)} | {slow} | "
                f"{_range(st['cpu_time_slowdown_pct'])} | "
                f"{_f(st['profiler_cpu_pct_of_core']['median'])} | "
                f"{_f(st['agent_threads_cpu_pct_of_core']['median'])} | "
                f"{_f(st['import_start_ms']['median'])} | {_f(st['shutdown_ms']['median'])} | "
                f"{_f(st['rss_overhead_mib']['median'])} | "
                f"{_truth_text(w, st['correctness'])} | {_received_text(st)} |"
            )
            if st["errors"]:
                err = st["errors"][0][-200:]
                add(f"| | {len(st['errors'])} failed run(s): `{err!r}` |||||||||")
    truth = [w for w in a["results"] if w in TRUTH_WORKLOADS and w not in PROFILE_WORKLOADS]
    if truth:
        add("")
        add("## Each profile type against the workload's own count (hotspan)")
        add("")
        add("| workload | runs | work s | what the profile shows [min..max over runs] | profiles |")
        add("|---|---:|---:|---|---|")
        for w in truth:
            st = a["results"][w].get("hotspan")
            if not st:
                continue
            n = len([r for r in a["runs"][w] if r.get("profiler") == "hotspan"])
            work = _f(_med([r.get("work_s") for r in a["runs"][w] if "error" not in r]), 2)
            add(
                f"| {_WORKLOAD_TITLES.get(w, w)} (`{w}`) | {n} | {work} | "
                f"{_truth_text(w, st['correctness'])} | {_received_text(st)} |"
            )
            if st["errors"]:
                add(f"| | {len(st['errors'])} failed run(s): `{st['errors'][0][-200:]!r}` ||||")
            other = {k: v for k, v in a["results"][w].items() if k != "hotspan"}
            for prof, o in other.items():
                add(
                    f"| ↳ {_PROFILER_TITLES.get(prof, prof)}: slowdown "
                    f"{_range(o['slowdown_pct'])}%, CPU time {_range(o['cpu_time_slowdown_pct'])}%"
                    " | | | | |"
                )
            if "hotspan" in a["results"][w] and "none" in a["params"]["profilers"]:
                h = a["results"][w]["hotspan"]
                if h["slowdown_pct"]["n"]:
                    add(
                        f"| ↳ hotspan: slowdown {_range(h['slowdown_pct'])}%, CPU time "
                        f"{_range(h['cpu_time_slowdown_pct'])}%, extra CPU "
                        f"{_f(h['profiler_cpu_pct_of_core']['median'])}% of a core | | | | |"
                    )
    lines += _targets_table(a, "hotspan, every profile type on")
    add("")
    add(
        "Notes: every run's upload interval is 3600 s, so hotspan sends once, at shutdown "
        "(shutdown ms includes it): the heap and threads profiles are the state at the end "
        "of the work, which the truth workloads keep alive until then. A sampled profile has "
        "a sampling error of its own: at 512 KiB per sample, `heap_leak`'s ~256 MiB are ~500 "
        "samples (~4.5% relative standard error), `alloc_split`'s gigabytes tens of "
        "thousands. ddtrace's profiles are not read back (they go to a file; the column shows "
        "that it wrote them)."
    )
    add("")
    return "\n".join(lines)


# The defaults run's summary columns.
_DEFAULTS_COLUMNS = {
    "none-again": "A/A noise",
    "hotspan": "hotspan defaults",
    "hotspan-cpuwall": "hotspan CPU+wall",
    "pyroscope": "pyroscope-io",
    "pyspy": "py-spy",
    "ddtrace-stack": "ddtrace stack",
    "ddtrace": "ddtrace default",
}


def _ratio(s: Dict[str, Any]) -> str:
    """A spread of percentages (CPU seen) as ratios."""
    if not s or s.get("median") is None:
        return "–"
    return f"{s['median'] / 100:.3f} [{s['min'] / 100:.3f}..{s['max'] / 100:.3f}]"


def _defaults_accuracy(s: Dict[str, Any]) -> str:
    """The defaults run's accuracy column: what else the workload can tell of the profile."""
    c = s["correctness"]
    parts = []
    if c.get("split_error_pp", {}).get("n"):
        parts.append(f"75/25 error {_range(c['split_error_pp'], 2)} pp")
    if c.get("busy_share_pct", {}).get("n"):
        parts.append(f"busy_part {_range(c['busy_share_pct'], 1, False)}% of worker")
    if c.get("span_labelled_pct", {}).get("n"):
        parts.append(
            f"span labels {_range(c['span_labelled_pct'], 1, False)}%, trace labels "
            f"{_range(c['trace_labelled_pct'], 1, False)}%"
        )
    if c.get("requests_per_s", {}).get("n"):
        parts.append(f"{_f(c['requests_per_s']['median'], 0)} req/s")
    if "error" in c:
        parts.append(f"error: {c['error']}")
    names = s.get("ddtrace_collectors") or []
    if names:
        # Its lock collectors are one per kind of lock: counted, not named.
        locks = [n for n in names if n.startswith(("Threading", "Asyncio"))]
        shown = [n.replace("Collector", "") for n in names if n not in locks]
        shown += [f"{len(locks)} lock"] if locks else []
        parts.append(
            f"pprof written {_f(s['ddtrace_pprof_kib']['median'], 0)} KiB; collectors: "
            + ", ".join(shown)
        )
    lines = s.get("stderr_lines", {}).get("max")
    if lines:
        parts.append(f"stderr lines up to {lines:.0f}")
    return "; ".join(parts) or "–"


def markdown_defaults(
    report: Dict[str, Any], command: str, machine: Dict[str, Any], wall_s: float
) -> str:
    a = report
    p = a["params"]
    lines = _head(
        "Profilers with their defaults: overhead and accuracy", a, command, machine, wall_s
    )
    add = lines.append
    add(
        f"{p['rounds']} interleaved rounds; in each, every workload runs once per profiler in "
        f"a shuffled order, each run a fresh process doing ~{p['seconds_of_work']:g} s of "
        "identical work (the web servers: serving for that long"
        + _longer_runs(a)
        + "). Sampling at "
        f"{p['rate_hz']} Hz where it can be set (hotspan, pyroscope-io, py-spy; ddtrace "
        "chooses its own, adaptively). **hotspan defaults**: nothing set but the rate and an "
        "upload interval of 3600 s; its defaults in the tree measured: "
        + ", ".join(f"`{k}={v!r}`" for k, v in a.get("hotspan_defaults", {}).items())
        + ". **hotspan CPU+wall**: "
        + ", ".join(f"`{k}={v!r}`" for k, v in _harness.HOTSPAN_VARIANTS["hotspan-cpuwall"].items())
        + ": the CPU and wall profiles and span linking only. **pyroscope-io**: its defaults "
        "(`gil_only=True`). **py-spy**: "
        "`py-spy record --nonblocking` from outside. **ddtrace**: `import "
        "ddtrace.profiling.auto` with `DD_PROFILING_ENABLED=true` and nothing else set (the "
        "collectors that ran are listed in its rows); **ddtrace stack**: the same with "
        + ", ".join(f"`{k}={v}`" for k, v in DDTRACE_VARIANTS["ddtrace-stack"].items())
        + ". ddtrace writes its profiles with its file exporter (no Datadog agent here); its "
        "CPU profile is their `cpu-time`. "
        "**Slowdown** = median over rounds of work time / the same round's no-profiler work "
        "time, minus 1 [min..max]; for the web servers, time per request. **Process CPU** = "
        "the same for the CPU the process used during the work (all its threads; per request "
        "for the web servers; py-spy's own process is not in it). **Peak RSS** = peak RSS "
        "minus the no-profiler run's (py-spy: plus its own peak RSS). **Profiler CPU** = CPU "
        "beyond the no-profiler run per second of work, in % of one core, py-spy's own "
        "process included; the summary's *kernel CPU in the process*: the system time of the "
        "work beyond the no-profiler run's, the same way (py-spy's process not in it). "
        "**CPU seen** = CPU the profile puts in the work (the stacks through "
        "the workload's work function; for `asyncio_spans` also those through `serve` or "
        "`handle_request` alone, as ddtrace shows each task's stack) / CPU its threads "
        "really used (`time.thread_time`), a ratio. The "
        "*no profiler, again* row is a second no-profiler run per round: the noise."
    )
    for prof, why in (a.get("skipped") or {}).items():
        add("")
        add(f"Not measured: {prof} — {why}")
    for w in a.get("missing_workloads", []):
        add("")
        add(f"Not measured: `{w}` — `bench/agent_workloads/{w}.py` does not exist.")
    for w, per in a["results"].items():
        base = a["baseline"][w]
        add("")
        add(f"## {_WORKLOAD_TITLES.get(w, w)} (`bench/agent_workloads/{w}.py`)")
        add("")
        rate = base.get("requests_per_s")
        add(
            f"No profiler: work {_range(base['work_s'], 2, False)} s, CPU "
            f"{_f(base['work_cpu_s']['median'], 2)} s, peak RSS "
            f"{_f(base['maxrss_mib']['median'])} MiB"
            + (f", {_range(rate, 0, False)} requests/s." if rate else ".")
        )
        add("")
        add(
            "| profiler | slowdown % | process CPU % | peak RSS MiB | profiler CPU, % of a "
            "core | CPU seen | accuracy | import+start ms | shutdown ms |"
        )
        add("|---|---:|---:|---:|---:|---:|---|---:|---:|")
        for prof, st in per.items():
            add(
                f"| {_PROFILER_TITLES.get(prof, prof)} | {_range(st['slowdown_pct'])} | "
                f"{_range(st['cpu_time_slowdown_pct'])} | {_range(st['rss_overhead_mib'])} | "
                f"{_f(st['profiler_cpu_pct_of_core']['median'])} | "
                f"{_ratio(st['correctness'].get('cpu_seen_pct', {}))} | "
                f"{_defaults_accuracy(st)} | {_f(st['import_start_ms']['median'])} | "
                f"{_f(st['shutdown_ms']['median'])} |"
            )
            if st["errors"]:
                add(f"| | {len(st['errors'])} failed run(s): `{st['errors'][0][-200:]!r}` |||||||")
    columns = [c for c in _DEFAULTS_COLUMNS if c in p["profilers"]]
    add("")
    add("## Summary (medians over rounds)")
    add("")
    add("| workload | " + " | ".join(_DEFAULTS_COLUMNS[c] for c in columns) + " |")
    add("|---|" + "---:|" * len(columns))
    for title, key, digits, sign in (
        ("slowdown %", "slowdown_pct", 1, True),
        ("process CPU %", "cpu_time_slowdown_pct", 1, True),
        ("peak RSS MiB", "rss_overhead_mib", 1, True),
        ("profiler CPU, % of a core", "profiler_cpu_pct_of_core", 1, False),
        ("kernel CPU in the process, % of a core", "kernel_cpu_pct_of_core", 1, False),
        ("CPU seen", "cpu_seen_pct", 3, False),
    ):
        add(f"| **{title}** |" + " |" * len(columns))
        for w, per in a["results"].items():
            cells = []
            for c in columns:
                st = per.get(c, {})
                m = (st.get("correctness", {}) if key == "cpu_seen_pct" else st).get(key, {})
                m = (m or {}).get("median")
                if m is not None and key == "cpu_seen_pct":
                    m /= 100
                cells.append(_f(m, digits, sign))
            add(f"| {w} | " + " | ".join(cells) + " |")
    lines += _targets_table(a, "hotspan defaults")
    add("")
    add(
        "Notes: hotspan runs with `upload_interval=3600`, so its one upload is the exit flush "
        "(in shutdown ms); pyroscope-io keeps its 10 s interval, ddtrace its 60 s. CPU seen "
        "and the split come from each profiler's own CPU profile: hotspan's and "
        "pyroscope-io's as stored by the bench's hotspan server, py-spy's folded output, "
        "ddtrace's pprof files. "
        "Span labels: the CPU profile of `parse`, `query` and `render` with only the samples "
        "labelled with one of those steps' own span ids (trace labels: the requests' trace "
        "ids), over all of it; only hotspan's is checked: pyroscope-io and py-spy do not "
        "link samples to spans, ddtrace only to its own tracer's. On a 2-core VM single runs "
        "vary by several percent: read the rows against the A/A row."
    )
    add("")
    return "\n".join(lines)


def write(report: Dict[str, Any], out_dir: str, quick: bool, md: str) -> str:
    """``agent[-quick].*``; ``agent-busy[-quick].*`` when only busy programs ran,
    ``agent-profiles[-quick].*`` and ``agent-defaults[-quick].*`` for those runs, so that none
    overwrites another's numbers."""
    busy = set(report["params"]["workloads"]) <= set(BUSY_WORKLOADS)
    kind = "-busy" if busy else ""
    for mode in ("profiles", "defaults"):
        if report["params"].get(mode):
            kind = f"-{mode}"
    if report["params"].get("python"):
        kind += "-" + report["params"]["python"]
    return common.write_results("agent" + kind, report, md, out_dir, quick)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer rounds of less work")
    ap.add_argument(
        "--rounds",
        type=int,
        help="interleaved rounds (default 7, quick 3; profiles 4, quick 2; defaults 7, quick 3)",
    )
    ap.add_argument(
        "--seconds",
        type=float,
        help="seconds of work per run (default 4, quick 1; profiles 5, quick 1; defaults 3, "
        "quick 1.5)",
    )
    ap.add_argument(
        "--profilers",
        default="",
        help=f"comma-separated, from {','.join(ALL_PROFILERS)} (default: "
        f"{','.join(PROFILERS)}, and pyspy-blocking on threads)",
    )
    ap.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, from {','.join(ALL_WORKLOADS)}; 'busy' = "
        f"{','.join(BUSY_WORKLOADS)}; 'profiles' = the profiles run "
        f"({','.join(PROFILE_WORKLOADS + TRUTH_WORKLOADS)}); 'defaults' = the defaults run "
        f"({','.join(DEFAULTS_WORKLOADS)} under {','.join(DEFAULTS_PROFILERS)}) (default: "
        f"{','.join(WORKLOADS)})",
    )
    ap.add_argument(
        "--only",
        default="",
        help="with 'profiles' or 'defaults': comma-separated, only these of its workloads",
    )
    ap.add_argument("--out", default=common.RESULTS_DIR)
    ap.add_argument(
        "--python",
        help="run the workloads on this interpreter (with hotspan installed; the bench's "
        "server stays on this one): a free-threaded build, whose results go to "
        "<name>-<version>.md",
    )
    args = ap.parse_args()
    if args.python:
        os.environ["HOTSPAN_BENCH_PYTHON"] = args.python
    profilers = common.comma_list(ap, args.profilers, ALL_PROFILERS, "profiler")
    profiles = args.workloads == "profiles"
    defaults = args.workloads == "defaults"
    if profiles or defaults:
        mode_workloads = PROFILE_WORKLOADS + TRUTH_WORKLOADS if profiles else DEFAULTS_WORKLOADS
        workloads = common.comma_list(ap, args.only, mode_workloads, "workload")
    else:
        if args.only:
            ap.error("--only goes with --workloads profiles or defaults")
        workloads = common.comma_list(
            ap, args.workloads.replace("busy", ",".join(BUSY_WORKLOADS)), ALL_WORKLOADS, "workload"
        )
    t0 = time.perf_counter()
    command = common.command_line("agent.py")
    machine = common.machine()
    report = run(
        quick=args.quick,
        rounds=args.rounds,
        seconds=args.seconds,
        profilers=profilers or None,
        workloads=workloads or None,
        profiles=profiles,
        defaults=defaults,
    )
    wall = time.perf_counter() - t0
    report.update(command=command, machine=machine, wall_s=round(wall, 1))
    render = markdown_profiles if profiles else markdown_defaults if defaults else markdown
    md = render(report, command, machine, wall)
    stem = write(report, args.out, args.quick, md)
    print(md)
    common.log(f"wrote {stem}.md/.json in {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
