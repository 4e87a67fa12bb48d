"""Agent overhead and correctness: hotspan's in-process agent against no profiler, py-spy and
pyroscope-io, on four workloads (``bench/agent_workloads/``), and on request on three busy
programs that starve a sampler thread of the GIL (``--workloads busy``).

    python bench/agent.py                 # 7 interleaved rounds x ~4 s of work (~10 min)
    python bench/agent.py --quick         # 3 rounds x ~1 s (~1.5 min)
    python bench/run.py --only agent [--quick]   # the same, from the bench runner
    python bench/agent.py --workloads busy [--quick]   # asyncio_yield, socket_pingpong,
                                          # web_server (~10 min, quick ~2.5 min): agent-busy.*

Every measurement is a fresh process.  In each round every workload runs once under every
profiler, in a shuffled order, and a profiler's slowdown is the median over rounds of
``work time / work time without a profiler in the same round``: the rounds share the
machine's state of the moment (frequency, neighbours), so the ratio cancels most of it.
Correctness is read from the profiles themselves: hotspan and pyroscope-io push to one
``hotspan server`` started for the bench, py-spy writes folded stacks to a file.
"""

from __future__ import annotations

import argparse
import http.client
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
from typing import Any, Callable, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

WORKLOAD_DIR = os.path.join(common.BENCH_DIR, "agent_workloads")
WORKLOADS = ["cpu_split", "threads", "alloc", "asyncio_spans"]
# Busy programs whose main thread lets the GIL go and takes it back many times per tick (a
# loop that yields, blocking syscalls, a web server): a sampler thread that needs the GIL
# starves there.  Not in the default run (it would take ~17 min); ``--workloads busy``.
BUSY_WORKLOADS = ["asyncio_yield", "socket_pingpong", "web_server"]
ALL_WORKLOADS = WORKLOADS + BUSY_WORKLOADS
# "none-again" is a second no-profiler run per round, compared with the first like any
# profiler: its "slowdown" is what noise alone gives (an A/A test), the scale to read the
# other rows against.
PROFILERS = ["none", "none-again", "hotspan", "pyspy", "pyroscope"]
# On request (--profilers): py-spy without --nonblocking (it stops the process for every
# sample, which is not how it runs in production, but it shows the attribution error the
# issue quotes), and hotspan with one feature off, to tell where a cost comes from.
EXTRA_PROFILERS = ["pyspy-blocking", "hotspan-nospans", "hotspan-nowall", "hotspan-python"]
ALL_PROFILERS = PROFILERS + EXTRA_PROFILERS
# ... except that blocking py-spy runs on the threads workload by default: that is where its
# attribution goes wrong, and the issue quotes it.
DEFAULT_EXTRA = {"threads": ["pyspy-blocking"]}
FULL = {"rounds": 7, "seconds": 4.0}
QUICK = {"rounds": 3, "seconds": 1.0}
RATE_HZ = 100
CPU_TYPE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
WALL_TYPE = "wall:wall:nanoseconds:wall:nanoseconds"

# Targets from the issue.
TARGET_SLOWDOWN_PCT = 1.0
TARGET_SPLIT_PP = 1.5
TARGET_BUSY_SHARE_PCT = 95.0
TARGET_CPU_RATIO_PCT = 5.0
TARGET_RSS_MIB = 10.0

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- running one workload process ------------------------------------------------------------


class _HwmSampler(threading.Thread):
    """Peak RSS (VmHWM) of a process that is not ours to ``getrusage``: py-spy's RSS comes
    back from ``wait4`` mixed with its child's, so it is read from /proc while it runs."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, common.proc_status(self.pid).get("VmHWM", 0))
            self._done.wait(0.1)

    def stop(self) -> int:
        self._done.set()
        self.join(2)
        return self.peak


def _pyspy_path() -> Optional[str]:
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.path.exists(beside) else shutil.which("py-spy")


def run_one(
    workload: str,
    profiler: str,
    params: Dict[str, Any],
    server_url: str,
    app: str,
    tmp: str,
) -> Dict[str, Any]:
    """One workload process under one profiler; the workload's JSON plus what only the parent
    can see (whole-process wall time, py-spy's own CPU and memory)."""
    cmd = [
        sys.executable,
        os.path.join(WORKLOAD_DIR, f"{workload}.py"),
        "--profiler",
        profiler,
        "--app",
        app,
        "--server",
        server_url,
        "--params",
        json.dumps(params),
    ]
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
    err_path = os.path.join(tmp, f"{app}.stderr")
    with open(err_path, "w") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd=common.REPO_DIR)
        hwm = _HwmSampler(proc.pid) if folded else None
        if hwm:
            hwm.start()
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        # wait4 rather than Popen.wait: it also returns the child's rusage.  For py-spy that
        # is py-spy plus the workload it spawned and reaped.
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
    peak = hwm.stop() if hwm else 0
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        with open(err_path) as f:
            tail = f.read()[-2000:]
        return {"error": f"exit {proc.returncode}: {tail}", "app": app, "profiler": profiler}
    result: Dict[str, Any] = json.loads(lines[-1])
    result["process_wall_s"] = wall
    result["rusage_cpu_s"] = ru.ru_utime + ru.ru_stime
    if folded:
        result["folded"] = folded
        result["pyspy_peak_rss"] = peak
    return result


def calibrate(
    workload: str, seconds: float, variant: Optional[Dict[str, Any]] = None
) -> Dict[str, Any]:
    """The params for ~``seconds`` of work, for the workload's ``variant`` (keyword arguments
    of its ``calibrate``; the default variant when None)."""
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(WORKLOAD_DIR, f"{workload}.py"),
            "--calibrate",
            str(seconds),
            "--params",
            json.dumps(variant or {}),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=common.REPO_DIR,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _probe_hotspan(server_url: str) -> Optional[str]:
    """None if ``hotspan.configure`` works in this environment, else why not."""
    code = (
        "import hotspan; hotspan.configure(application_name='agent-bench-probe', "
        f"server_address={server_url!r}, sample_rate={RATE_HZ}); hotspan.shutdown()"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


def _probe_pyroscope() -> Optional[str]:
    r = subprocess.run([sys.executable, "-c", "import pyroscope"], capture_output=True, text=True)
    return None if r.returncode == 0 else "pyroscope-io is not installed (pip install pyroscope-io)"


# -- reading the profiles back ---------------------------------------------------------------


def _base_name(name: str) -> str:
    """``func`` from ``func``, ``module.func``, ``Class.func`` or ``func (file.py:12)``."""
    name = name.split(" (", 1)[0]
    return name.rsplit(".", 1)[-1].rsplit(":", 1)[-1]


def _flamegraph_totals(graph: Dict[str, Any]) -> Tuple[int, Dict[str, int]]:
    """Total and per-function totals (ns) of a querier flame graph (``names`` + ``levels`` of
    [offset, total, self, name index] quadruples); a function counted once per node, which is
    once per stack as long as it does not recurse (the workloads' functions do not)."""
    names = graph.get("names", [])
    out: Dict[str, int] = {}
    for level in graph.get("levels", [])[1:]:
        values = [int(v) for v in level.get("values", [])]
        for i in range(0, len(values), 4):
            key = _base_name(names[values[i + 3]])
            out[key] = out.get(key, 0) + values[i + 1]
    return int(graph.get("total", 0) or 0), out


def _query(server: common.Server, app: str, ptype: str, start_ns: int, end_ns: int) -> Any:
    body = json.dumps(
        {
            "profileTypeID": ptype,
            "labelSelector": f'{{service_name="{app}"}}',
            # The whole process lifetime and some slack: uploads are stamped with their
            # collection window, which starts before the work and ends at the exit flush.
            "start": start_ns // 1_000_000 - 120_000,
            "end": end_ns // 1_000_000 + 120_000,
        }
    )
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request(
            "POST",
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            body=body,
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise RuntimeError(f"query {app} {ptype}: HTTP {resp.status} {data[:300]!r}")
    return _flamegraph_totals(json.loads(data).get("flamegraph", {}))


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
    if any(p.startswith("pyspy") for p in profilers) and not _pyspy_path():
        for p in profilers:
            if p.startswith("pyspy"):
                skipped[p] = "py-spy is not installed (pip install py-spy)"
    for p, why in skipped.items():
        log(f"  skipping {p}: {why}")
    return skipped


def cpu_profile(server: common.Server, run: Dict[str, Any]) -> Tuple[int, Dict[str, int]]:
    """A run's CPU profile, total and per function (ns): py-spy's folded file (removed from
    the run, which is kept in the results), else what the server stored for the run's app."""
    if "folded" in run:
        return _folded_totals(run.pop("folded"))
    return _query(server, run["app"], CPU_TYPE, run["start_ns"], run["end_ns"])


def _folded_totals(path: str) -> Tuple[int, Dict[str, int]]:
    """py-spy ``--format raw``: ``frame;frame;... count`` lines, root first, each frame
    ``func (file.py:line)``; samples at RATE_HZ become nanoseconds."""
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
        for fn in {_base_name(fr) for fr in stack.split(";") if fr}:
            out[fn] = out.get(fn, 0) + ns
    return total, out


def correctness(workload: str, run: Dict[str, Any], fn: Dict[str, int]) -> Dict[str, Any]:
    """Per-run correctness numbers from per-function CPU totals (ns)."""
    out: Dict[str, Any] = {}
    work_fn = run["work_function"]
    seen = fn.get(work_fn, 0) / 1e9
    if workload == "threads":
        truth = run["threads_cpu_total_s"]
        busy, idle = fn.get("busy_part", 0), fn.get("idle_part", 0)
        worker = fn.get("worker", 0)
        out["busy_share_pct"] = 100.0 * busy / worker if worker else None
        out["idle_share_pct"] = 100.0 * idle / worker if worker else None
    else:
        truth = run["main_thread_cpu_s"]
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


def _med(values: List[float]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


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
    agent_cpu: List[float] = []
    ext_cpu: List[float] = []
    rss: List[float] = []
    rss_start: List[float] = []
    imp: List[float] = []
    shut: List[float] = []
    corr: Dict[str, List[float]] = {}
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
        "agent_threads_cpu_pct_of_core": _spread(agent_cpu, 1),
        "external_cpu_pct_of_core": _spread(ext_cpu, 1),
        "rss_overhead_mib": _spread(rss, 1),
        "rss_at_start_mib": _spread(rss_start, 1),
        "correctness": {k: _spread(v) for k, v in corr.items()},
        "errors": errors,
    }


# -- the benchmark ---------------------------------------------------------------------------


def run(
    quick: bool = False,
    log: Log = _stderr,
    rounds: Optional[int] = None,
    seconds: Optional[float] = None,
    profilers: Optional[List[str]] = None,
    workloads: Optional[List[str]] = None,
    seed: int = 1,
) -> Dict[str, Any]:
    cfg = dict(QUICK if quick else FULL)
    n_rounds = int(rounds or cfg["rounds"])
    secs = float(seconds or cfg["seconds"])
    workloads = list(workloads or WORKLOADS)
    per_workload = {
        w: (list(profilers) if profilers else PROFILERS + DEFAULT_EXTRA.get(w, []))
        for w in workloads
    }
    for ps in per_workload.values():
        if "none" not in ps:
            ps.insert(0, "none")
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
        },
        "versions": _versions(),
        # Other work on the machine during the bench shows up as noise; this says if there was.
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        skipped = unavailable(profilers, server.url, log)
        active = {w: [p for p in ps if p not in skipped] for w, ps in per_workload.items()}

        params = {}
        for w in workloads:
            params[w] = calibrate(w, secs)
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
                    runs[w][(p, i)] = run_one(w, p, params[w], server.url, app, tmp)
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
                if "error" in r or p.startswith("none"):
                    continue
                try:
                    total_ns, fn = cpu_profile(server, r)
                    r["profile_cpu_total_s"] = total_ns / 1e9
                    r["correctness"] = correctness(w, r, fn)
                    if p.startswith("hotspan"):
                        _, wall_fn = _query(server, r["app"], WALL_TYPE, r["start_ns"], r["end_ns"])
                        r["wall"] = wall_info(w, r, wall_fn)
                except (OSError, RuntimeError, KeyError, ValueError) as exc:
                    r["correctness"] = {"error": str(exc)}
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
        report["targets"] = targets(report)
        report["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
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


def _versions() -> Dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("py-spy", "pyroscope-io", "opentelemetry-sdk", "starlette", "uvicorn"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def targets(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The issue's targets, checked for hotspan."""
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


# -- report ----------------------------------------------------------------------------------


def _f(v: Optional[float], digits: int = 1, sign: bool = False) -> str:
    if v is None:
        return "–"
    return f"{v:+.{digits}f}" if sign else f"{v:.{digits}f}"


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
    "web_server": "Starlette on uvicorn under load from another process (8 keep-alive connections)",
}
_PROFILER_TITLES = {
    "hotspan": "hotspan",
    "none-again": "*no profiler, again (A/A: the noise)*",
    "pyspy": "py-spy `record --nonblocking`",
    "pyspy-blocking": "py-spy `record` (blocking)",
    "pyroscope": "pyroscope-io (defaults: `gil_only=True`)",
    "hotspan-nospans": "hotspan, `trace_correlation=False`",
    "hotspan-nowall": "hotspan, `wall=False`",
    "hotspan-python": "hotspan, `native=False` (pure-Python sampler)",
}


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
    lines: List[str] = []
    add = lines.append
    add(f"# hotspan agent overhead and correctness{' (quick)' if p['quick'] else ''}")
    add("")
    add(f"Command: `{command}` — total wall time {wall_s:.0f} s.")
    add("")
    add(
        f"Machine: {machine['nproc']} CPUs ({machine['cpu_model']}), Python {machine['python']} "
        f"({machine['implementation']}), {machine['platform']}; hotspan commit "
        f"{machine['git_commit']} (imported from `{machine['hotspan_src']}`); "
        + ", ".join(f"{k} {v}" for k, v in a["versions"].items())
        + f"; {machine['date_utc']} UTC. Load average (1/5/15 min) at start "
        f"{a['loadavg_start']}, at end {a.get('loadavg_end')}."
    )
    add("")
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
    rows = a.get("targets") or []
    if rows:
        add("")
        add("## Targets (hotspan)")
        add("")
        add("| target | measured | verdict |")
        add("|---|---:|---|")
        for r in rows:
            verdict = "–" if r["ok"] is None else ("meets target" if r["ok"] else "**misses**")
            add(f"| {r['target']} | {_f(r['measured'], 2)} {r['unit']} | {verdict} |")
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


def write(report: Dict[str, Any], out_dir: str, quick: bool, md: str) -> str:
    """``agent[-quick].*``; ``agent-busy[-quick].*`` when only busy programs ran, so that they
    never overwrite the default run's numbers."""
    busy = set(report["params"]["workloads"]) <= set(BUSY_WORKLOADS)
    return save(
        report, md, out_dir, "agent" + ("-busy" if busy else "") + ("-quick" if quick else "")
    )


def save(report: Dict[str, Any], md: str, out_dir: str, name: str) -> str:
    """``out_dir/name.json`` and ``.md``; returns the path without the suffix."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, name)
    with open(stem + ".json", "w") as f:
        json.dump(report, f, indent=2)
    with open(stem + ".md", "w") as f:
        f.write(md)
    return stem


def comma_list(ap: argparse.ArgumentParser, text: str, allowed: List[str], what: str) -> List[str]:
    """The names in a comma-separated option; an unknown one is a usage error."""
    names = [n for n in text.split(",") if n]
    unknown = set(names) - set(allowed)
    if unknown:
        ap.error(f"unknown {what}(s): {', '.join(sorted(unknown))} (from {', '.join(allowed)})")
    return names


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="3 rounds x ~1 s of work")
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 7, quick 3)")
    ap.add_argument("--seconds", type=float, help="seconds of work per run (default 4)")
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
        f"{','.join(BUSY_WORKLOADS)} (default: {','.join(WORKLOADS)})",
    )
    ap.add_argument("--out", default=os.path.join(common.BENCH_DIR, "results"))
    args = ap.parse_args()
    profilers = comma_list(ap, args.profilers, ALL_PROFILERS, "profiler")
    workloads = comma_list(
        ap, args.workloads.replace("busy", ",".join(BUSY_WORKLOADS)), ALL_WORKLOADS, "workload"
    )
    t0 = time.perf_counter()
    command = "python bench/agent.py" + "".join(f" {a}" for a in sys.argv[1:])
    machine = common.machine()
    report = run(
        quick=args.quick,
        rounds=args.rounds,
        seconds=args.seconds,
        profilers=profilers or None,
        workloads=workloads or None,
    )
    wall = time.perf_counter() - t0
    report.update(command=command, machine=machine, wall_s=round(wall, 1))
    md = markdown(report, command, machine, wall)
    stem = write(report, args.out, args.quick, md)
    print(md)
    _stderr(f"wrote {stem}.md/.json in {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
