"""What every agent workload shares: profiler set-up, timing, and the one JSON result line.

A workload script is run as a fresh process per measurement::

    python bench/agent_workloads/<name>.py \
        --profiler none|hotspan|pyroscope|pyspy|ddtrace|tracemalloc \
        --app APP --server URL --params JSON
    python bench/agent_workloads/<name>.py --calibrate SECONDS [--params JSON]
        # prints the params JSON; --params chooses a variant of the workload (keyword
        # arguments of its ``calibrate``, e.g. ``{"call_ms": 0.025}``)

``pyspy`` means "profiled from outside": the script sets nothing up (py-spy is the parent
process).  ``ddtrace`` imports ``ddtrace.profiling.auto`` as its users do; its settings come
from the ``DD_*`` environment the bench gives the process.  ``tracemalloc`` is the standard
library's tracer with 25 frames per allocation, as a memory profiler built on it would run it.
Only the work section is timed for the slowdown; importing and starting the agent is timed on
its own ("import+start") and so is stopping it ("shutdown", which includes the
final upload).  A workload may have a ``setup``: a context manager entered before the profiler
starts and left after it stopped, for what the profiled process talks to (a peer process, a
load generator), so that starting and stopping it is in no measured window and no profiler
sees it.  The result is the last line of stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import sys
import threading
import time
from typing import Any, Callable, ContextManager, Dict, Iterator, Optional, Set, Tuple

Params = Dict[str, Any]
# Entered with the run's params before the profiler starts; what it yields is what ``work``
# gets (the params plus live objects such as sockets, which JSON cannot carry).
Setup = Callable[[Params], ContextManager[Params]]
CLK_TCK = os.sysconf("SC_CLK_TCK")
# bench/agent_instructions.py lowers it under valgrind, whose ~50x slower CPU would otherwise
# give the sampler ~50x more samples per unit of work than a native run.
SAMPLE_RATE = int(os.environ.get("HOTSPAN_BENCH_SAMPLE_RATE", "100"))
# hotspan with one feature off, to tell which part of the agent a cost comes from.
HOTSPAN_VARIANTS: Dict[str, Dict[str, Any]] = {
    "hotspan": {},
    "hotspan-nospans": {"trace_correlation": False},
    "hotspan-nowall": {"wall": False},
    "hotspan-nolocks": {"locks": False},
    "hotspan-nothreads": {"threads": False},
    "hotspan-noalloc": {"alloc_sample_bytes": 0},
    "hotspan-python": {"native": False},
    # The defaults with POSIX CPU timers for every thread (HOTSPAN_CPU_TRIGGER=timer, set by
    # bench/agent.py): what the main thread's perf event costs.
    "hotspan-timer": {},
    # The CPU and wall profiles alone: what the allocation, lock and thread profiles add.
    "hotspan-cpuonly": {"alloc_sample_bytes": 0, "locks": False, "threads": False},
    # The same, and no runtime stats or error conditions on spans: the CPU and wall profiles
    # and span linking alone.
    "hotspan-cpuwall": {
        "alloc_sample_bytes": 0,
        "locks": False,
        "threads": False,
        "span_stats": False,
        "error_condition": False,
    },
    # Every profile type and span feature off: the agent's threads and hooks alone, what it
    # costs before it samples anything.
    "hotspan-idle": {
        "cpu": False,
        "wall": False,
        "alloc_sample_bytes": 0,
        "locks": False,
        "threads": False,
        "trace_correlation": False,
        "span_stats": False,
        "error_condition": False,
    },
}


def spin(n: int) -> int:
    """The unit of CPU work the workloads calibrate against (pure Python, no allocation)."""
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x


def loops_per_ms() -> float:
    """``spin`` iterations per millisecond of CPU, best of a few tries (the least disturbed)."""
    n = 250_000  # ~10 ms: shorter tries read low on this VM now and then
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        spin(n)
        best = min(best, time.thread_time() - t0)
    return n / (best * 1000)


def scale_to(
    seconds: float,
    trial: int,
    run: Callable[[int], object],
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """How many units of ``run`` take ``seconds`` of ``clock`` (wall time, or the thread's CPU
    time for work that never waits): ``trial`` units timed three times, the fastest (the least
    disturbed) scaled."""
    best = float("inf")
    for _ in range(3):
        t0 = clock()
        run(trial)
        best = min(best, clock() - t0)
    return max(1, int(trial * seconds / best))


_TRACER: Any = None


def otel_tracer() -> Any:
    """A tracer of the OpenTelemetry SDK, its ``TracerProvider`` installed globally with no
    exporter: spans are created, recorded and ended as in a service, but sent nowhere."""
    global _TRACER
    if _TRACER is None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())
        _TRACER = trace.get_tracer("hotspan.bench")
    return _TRACER


def _thread_cpu() -> Dict[int, float]:
    """CPU seconds per live thread of this process, from /proc (covers non-Python threads,
    e.g. pyroscope-io's Rust sampler, that ``threading`` does not know)."""
    out: Dict[int, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                data = f.read()
        except OSError:  # the thread exited meanwhile
            continue
        fields = data[data.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def _rusage_cpu(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _status(key: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _maxrss_bytes() -> int:
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss over fork and exec, so a child
    # of a big parent (the bench runner has DuckDB and NumPy loaded) reports the parent's peak.
    return _status("VmHWM:")


def _vm_rss() -> int:
    return _status("VmRSS:")


def _start_profiler(profiler: str, app: str, server: str) -> Optional[Callable[[], None]]:
    """Start the in-process profiler; returns its stop function."""
    if profiler in HOTSPAN_VARIANTS:
        import hotspan

        # A long upload interval, so that only the exit flush uploads: the measured window
        # then holds sampling alone, not a periodic upload.
        hotspan.configure(
            application_name=app,
            server_address=server,
            sample_rate=SAMPLE_RATE,
            upload_interval=3600,
            **HOTSPAN_VARIANTS[profiler],
        )
        return hotspan.shutdown
    if profiler == "pyroscope":
        import pyroscope

        # pyroscope-io's defaults except rate and address: gil_only=True, oncpu=True,
        # upload_interval=10, the py-spy based sampler.  gil_only=True is what it ships with,
        # and it is the setting that makes it see only the thread holding the GIL.
        pyroscope.configure(application_name=app, server_address=server, sample_rate=SAMPLE_RATE)

        def stop() -> None:
            pyroscope.shutdown()  # flushes the last partial upload before it returns

        return stop
    if profiler.startswith("ddtrace"):
        # The profiler starts on import, with its defaults and what DD_PROFILING_* asks for
        # (ddtrace-stack: every collector but the stack sampler off).
        import ddtrace.profiling.auto  # noqa: F401
        from ddtrace.profiling import bootstrap

        return bootstrap.profiler.stop  # type: ignore[attr-defined,no-any-return]
    if profiler == "tracemalloc":
        import tracemalloc

        tracemalloc.start(25)

        def stop_tracemalloc() -> None:
            # What a tool on top of it does once per period: a snapshot of what is alive.
            tracemalloc.take_snapshot().statistics("traceback")
            tracemalloc.stop()

        return stop_tracemalloc
    # none-again: the A/A control run; pyspy*: py-spy is the parent process.
    if profiler.startswith(("none", "pyspy")):
        return None
    raise SystemExit(f"unknown profiler {profiler!r}")


def _tick_counter(profiler: str) -> Callable[[], Optional[int]]:
    """Counts the ticks of hotspan's sampler thread, where it ticks from Python.

    The wall profile cannot show missed ticks: a late tick is credited with all the wall time
    since the one before (up to 1 s), so two ticks in 3 s still store ~2 s of wall.  Counting
    the calls is the only way to see a sampler thread that does not get the GIL.  This wraps
    a private attribute: an agent without it (a sampler that ticks in C) gives None.
    """
    if profiler not in HOTSPAN_VARIANTS:
        return lambda: None
    try:
        from hotspan import agent

        sampler = agent.current_agent()._sampler
        tick = sampler.tick
    except AttributeError:
        return lambda: None
    if getattr(sampler, "tick_interval", 0) > 1 / SAMPLE_RATE:
        # The native sampler samples from C: its Python thread only picks up finished
        # windows, and its ticks say nothing about sampling.
        return lambda: None
    count = [0]

    def counting_tick(*args: Any, **kwargs: Any) -> None:
        count[0] += 1
        tick(*args, **kwargs)

    sampler.tick = counting_tick
    return lambda: count[0]


def _profiler_info(profiler: str) -> Dict[str, Any]:
    """What the profiler really ran, where it tells: ddtrace's collectors (which of them
    DD_PROFILING_* left on; a private attribute, so nothing where it is gone), and hotspan's
    sampler counters (its signals and the time its handler took)."""
    if profiler in HOTSPAN_VARIANTS:
        import hotspan

        agent = hotspan.current_agent()
        return {"hotspan_sampler": dict(agent.sampler_stats)} if agent is not None else {}
    if not profiler.startswith("ddtrace"):
        return {}
    from ddtrace.profiling import bootstrap

    try:
        collectors = bootstrap.profiler._collectors  # type: ignore[attr-defined]
    except AttributeError:
        return {}
    return {"ddtrace_collectors": sorted({type(c).__name__ for c in collectors})}


@contextlib.contextmanager
def _no_setup(params: Params) -> Iterator[Params]:
    yield params


# -- web servers under load (web_server.py, wsgi_threaded.py) ----------------------------------

RENDER_MS = 0.5  # CPU per request
CONNECTIONS = 8  # keep-alive connections of the load generator, one request in flight each
PAGES = 64  # distinct request paths, so that no layer can answer from a cache
LOADGEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "loadgen.py")


def render_page(rows: int, page: int) -> str:
    """A request's work: an HTML table of ``rows`` rows, in pure Python."""
    parts = ["<table><tr><th>#</th><th>item</th><th>price</th></tr>"]
    for i in range(rows):
        code = (page * 7919 + i * 31) & 0xFFFF
        parts.append(f"<tr><td>{i}</td><td>item-{code:05d}</td><td>{code / 7:.2f}</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def calibrate_server(seconds: float, render_ms: float = RENDER_MS) -> Params:
    """A server workload's params: its fixed ``seconds`` and the rows of ``render_page`` that
    take ``render_ms`` of CPU."""
    rows = 200
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()
        for page in range(20):
            render_page(rows, page)
        best = min(best, (time.thread_time() - t0) / 20)
    return {"seconds": seconds, "rows": max(1, int(rows * render_ms / 1000 / best))}


def split_cores() -> Tuple[Set[int], Set[int]]:
    """The cores of a server workload and of its load generator: the load generator on the
    last core this process may use, the server (and every thread it starts, the profiler's
    included) on the others.  As a client on another machine would, the load generator then
    takes no core from the server; and the server's threads, handing the GIL to one another
    on one core, do not also pay for moving it between two (on 2 cores that made a run 25%
    slower or faster by where the scheduler happened to put them: no profiler's cost could be
    read under it).  With a single core, both share it."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return set(cores), set(cores)
    return set(cores[:-1]), {cores[-1]}


@contextlib.contextmanager
def http_load(params: Params) -> Iterator[Params]:
    """A server workload's setup: a listening socket on 127.0.0.1 (``params["listener"]``)
    and ``bench/loadgen.py``, a process of its own, already connecting to it: CONNECTIONS
    keep-alive connections, one ``GET /page?page=N`` in flight each, as fast as the server
    answers, until the server closes them (bounded by ``seconds`` + 15 s in any case).  The
    server and the load generator run on cores of their own (``split_cores``), set before
    the profiler starts, so that its threads are on the server's."""
    import pickle
    import socket
    import subprocess
    import tempfile

    requests = [
        (f"GET /page?page={i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode(), 0, 0)
        for i in range(PAGES)
    ]
    listener = socket.create_server(("127.0.0.1", 0), backlog=CONNECTIONS * 2)
    fd, path = tempfile.mkstemp(prefix="hotspan-bench-web-", suffix=".pickle")
    with os.fdopen(fd, "wb") as f:
        pickle.dump(requests, f)
    cmd = [
        sys.executable,  # the workload's own interpreter (HOTSPAN_BENCH_PYTHON where set)
        LOADGEN,
        "--port",
        str(listener.getsockname()[1]),
        "--requests",
        path,
        "--concurrency",
        str(CONNECTIONS),
        "--warmup",
        "0",
        "--duration",
        str(params["seconds"] + 15),
    ]
    server_cores, loadgen_cores = split_cores()
    os.sched_setaffinity(0, server_cores)  # this thread, and the threads it starts from now
    gen = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, loadgen_cores),
    )
    try:
        # "measure-start" comes once its connections are being opened: they complete in the
        # listen backlog, and their first requests wait there until the server accepts them.
        assert gen.stdout is not None
        gen.stdout.readline()
        yield {**params, "listener": listener}
    finally:
        gen.terminate()
        gen.wait(30)
        listener.close()
        os.unlink(path)


def served(requests: int, seconds: float) -> Dict[str, Any]:
    """A server workload's result: ``units`` = requests served, so that the bench's slowdown
    is time per request (the inverse of requests/s) against the no-profiler run."""
    return {
        "requests": requests,
        "requests_per_s": requests / seconds if seconds else 0.0,
        "units": requests,
    }


def main(
    calibrate: Callable[..., Params],
    work: Callable[[Params], Dict[str, Any]],
    setup: Setup = _no_setup,
) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiler", default="none")
    ap.add_argument("--app", default="agent-bench")
    ap.add_argument("--server", default="http://127.0.0.1:4040")
    ap.add_argument("--params", default="{}")
    ap.add_argument("--calibrate", type=float, metavar="SECONDS")
    args = ap.parse_args()
    if args.calibrate is not None:
        print(json.dumps(calibrate(args.calibrate, **json.loads(args.params))))
        return

    with setup(json.loads(args.params)) as params:
        rss_before = _vm_rss()
        t0 = time.perf_counter()
        stop = _start_profiler(args.profiler, args.app, args.server)
        import_start_s = time.perf_counter() - t0
        rss_started = _vm_rss()
        ticks = _tick_counter(args.profiler)

        # Garbage from start-up must not be collected inside one profiler's window and not
        # another's.
        gc.collect()
        main_tid = threading.get_native_id()
        threads0 = _thread_cpu()
        cpu0 = _rusage_cpu()
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        main0 = time.thread_time()
        ticks0 = ticks()
        wall0_ns = time.time_ns()
        p0 = time.perf_counter()
        extra = work(params)
        work_s = time.perf_counter() - p0
        main_cpu = time.thread_time() - main0
        ticks1 = ticks()
        cpu = _rusage_cpu() - cpu0
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        # A thread the work joined can stay in /proc a moment after join() returned: wait for
        # it (50 ms at most, untimed), or its CPU would count as the profiler's below.
        settle = time.perf_counter() + 0.05
        while len(_thread_cpu()) > len(threads0) and time.perf_counter() < settle:
            time.sleep(0.001)
        threads1 = _thread_cpu()
        wall1_ns = time.time_ns()
        maxrss_work = _maxrss_bytes()
        extra.update(_profiler_info(args.profiler))

        # Threads alive before and after the work that are not the main thread belong to the
        # profiler (the workloads' own threads are joined inside the work).
        other = {
            tid: cpu1 - threads0.get(tid, 0.0) for tid, cpu1 in threads1.items() if tid != main_tid
        }

        t1 = time.perf_counter()
        if stop is not None:
            stop()
        shutdown_s = time.perf_counter() - t1

    result: Dict[str, Any] = {
        "profiler": args.profiler,
        "app": args.app,
        "import_start_s": import_start_s,
        "work_s": work_s,
        "work_cpu_s": cpu,
        # The kernel's part (signals, timers, waking threads: what callgrind does not count)
        # and the context switches, both during the work.
        "work_sys_s": usage1.ru_stime - usage0.ru_stime,
        "work_context_switches": (usage1.ru_nvcsw - usage0.ru_nvcsw)
        + (usage1.ru_nivcsw - usage0.ru_nivcsw),
        "main_thread_cpu_s": main_cpu,
        "other_threads_cpu_s": sum(other.values()),
        "other_threads": len(other),
        "shutdown_s": shutdown_s,
        "start_ns": wall0_ns,
        "end_ns": wall1_ns,
        "rss_before_start": rss_before,
        "rss_after_start": rss_started,
        "maxrss_work": maxrss_work,
        "maxrss": _maxrss_bytes(),
        "sampler_ticks": None if ticks0 is None or ticks1 is None else ticks1 - ticks0,
        **extra,
    }
    # Last: the process's whole CPU so far, so that an external profiler's own CPU can be
    # told apart from ours in the rusage its parent gets.  That rusage also holds the
    # setup's child processes (peer, load generator), reaped when the setup was left.
    result["process_cpu_s"] = _rusage_cpu() + _rusage_cpu(resource.RUSAGE_CHILDREN)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
