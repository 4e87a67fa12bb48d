"""Does the agent's sampler starve?  Busy programs whose main thread lets the GIL go and takes
it back many times per tick, each run a fresh process profiled at 100 Hz.

    python bench/agent_starvation.py            # 8 programs x 3 runs x 3 profilers, ~4 s each
    python bench/agent_starvation.py --quick    # the same with ~1 s of work per run
    python bench/agent_starvation.py --profilers hotspan,pyroscope,hotspan-python,pyspy

A sampler that needs the GIL (a Python thread that ticks) loses it to a main thread that
releases and retakes it every millisecond or faster: CPython's waiting thread asks for a forced
switch only when the GIL has not changed hands for 5 ms, and a main thread that lets it go in
every ``select``/``send``/``recv`` changes hands all the time, mostly back to itself.  Per run
this reports what the profile server stored: the CPU profile's total, and the main thread's
wall profile as 10 ms samples per 3 s; and, counted in the process, how often hotspan's
sampler thread ticked.  The programs are the agent workloads' (``bench/agent_workloads/``),
in variants; hotspan and pyroscope-io push to one ``hotspan server``, read back after all runs.
Results: ``bench/results/agent_starvation.md`` / ``.json`` (``--quick``: ``-quick``).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import agent  # noqa: E402
import common  # noqa: E402


class Program(NamedTuple):
    key: str
    title: str
    workload: str
    variant: Dict[str, Any]


# The busy programs that starved a sampler, and the send/recv ones with both kinds of peer
# (socket_pingpong.py): another process (recv waits for the round trip) and the same loop (no
# syscall ever waits).
PROGRAMS = [
    Program(
        "plain",
        "plain loop calling a pure-Python function (~1 ms calls)",
        "socket_pingpong",
        {"call_ms": 1.0, "send_recv": False},
    ),
    Program(
        "yield",
        "the same in a coroutine, `await asyncio.sleep(0)` between calls",
        "asyncio_yield",
        {"span": False},
    ),
    Program(
        "yield_otel",
        "the same with the OpenTelemetry SDK and a span around it",
        "asyncio_yield",
        {"span": True},
    ),
    Program(
        "sleep_100us",
        "coroutine with `await asyncio.sleep(0.0001)` between calls",
        "asyncio_yield",
        {"span": False, "sleep_s": 0.0001},
    ),
    Program(
        "socket_process",
        "plain loop, send/recv between calls (echo peer: another process)",
        "socket_pingpong",
        {"call_ms": 1.0, "peer": "process"},
    ),
    Program(
        "socket_loop",
        "plain loop, send/recv between calls (echo peer: the same loop)",
        "socket_pingpong",
        {"call_ms": 1.0, "peer": "loop"},
    ),
    Program(
        "short_socket_process",
        "plain loop, short calls (~25 us) + send/recv (peer: another process)",
        "socket_pingpong",
        {"call_ms": 0.025, "peer": "process"},
    ),
    Program(
        "short_socket_loop",
        "plain loop, short calls (~25 us) + send/recv (peer: the same loop)",
        "socket_pingpong",
        {"call_ms": 0.025, "peer": "loop"},
    ),
]
PROFILERS = ["hotspan", "pyroscope", "hotspan-python"]
ALL_PROFILERS = PROFILERS + ["pyspy"]
FULL = {"runs": 3, "seconds": 4.0}
QUICK = {"runs": 3, "seconds": 1.0}
WINDOW_S = 3.0  # "samples in 3 s": the window counted per run
TICK_S = 1 / agent.RATE_HZ


def _per_window(count: float, work_s: float) -> float:
    return count * WINDOW_S / work_s if work_s else 0.0


def measure(server: common.Server, run: Dict[str, Any], profiler: str) -> Dict[str, Any]:
    """What the profile of one run says, next to what the run really did."""
    out: Dict[str, Any] = {
        "work_s": run["work_s"],
        "real_cpu_s": run["main_thread_cpu_s"],
        "process_work_cpu_s": run["work_cpu_s"],
    }
    total_ns, _ = agent.cpu_profile(server, run)
    out["cpu_stored_s"] = total_ns / 1e9
    if profiler.startswith("hotspan"):
        _, wall = agent._query(server, run["app"], agent.WALL_TYPE, run["start_ns"], run["end_ns"])
        # Only the main thread runs the work function: its wall is the main thread's during
        # the work, as 10 ms samples, scaled to a 3 s window.
        wall_s = wall.get(run["work_function"], 0) / 1e9
        out["wall_samples_per_3s"] = _per_window(wall_s / TICK_S, run["work_s"])
        ticks = run.get("sampler_ticks")
        out["ticks_per_3s"] = None if ticks is None else _per_window(ticks, run["work_s"])
    return out


def run(
    quick: bool = False,
    runs: Optional[int] = None,
    seconds: Optional[float] = None,
    profilers: Optional[List[str]] = None,
    programs: Optional[List[str]] = None,
    log: agent.Log = common.log,
    seed: int = 1,
) -> Dict[str, Any]:
    cfg = QUICK if quick else FULL
    n_runs = int(runs or cfg["runs"])
    secs = float(seconds or cfg["seconds"])
    chosen = [p for p in PROGRAMS if not programs or p.key in programs]
    tmp = tempfile.mkdtemp(prefix="hotspan-bench-starvation-")
    server = common.Server(os.path.join(tmp, "data")).start()
    report: Dict[str, Any] = {
        "params": {
            "quick": quick,
            "runs": n_runs,
            "seconds_of_work": secs,
            "rate_hz": agent.RATE_HZ,
            "programs": [p._asdict() for p in chosen],
            "profilers": list(profilers or PROFILERS),
            "seed": seed,
        },
        "versions": common.tool_versions(common.AGENT_TOOLS),
        "loadavg_start": common.loadavg(),
    }
    try:
        skipped = agent.unavailable(report["params"]["profilers"], server.url, log)
        active = [p for p in report["params"]["profilers"] if p not in skipped]
        params = {}
        for prog in chosen:
            params[prog.key] = common.calibrate_agent_workload(prog.workload, secs, prog.variant)
            log(f"  calibrated {prog.key}: {params[prog.key]}")
        report["workload_params"] = params

        nonce = uuid.uuid4().hex[:6]
        rng = random.Random(seed)
        results: Dict[str, Dict[str, List[Dict[str, Any]]]] = {
            prog.key: {p: [] for p in active} for prog in chosen
        }
        t_start = time.perf_counter()
        for i in range(n_runs):
            # Every program under every profiler once per round, shuffled: what the machine
            # does meanwhile falls on all of them alike.
            order = [(prog, p) for prog in chosen for p in active]
            rng.shuffle(order)
            for prog, p in order:
                app = f"starvation-{nonce}-{prog.key}-{p}-r{i}"
                r = agent.run_one(prog.workload, p, params[prog.key], server.url, app, tmp)
                if "error" in r:
                    log(f"  {prog.key}/{p} run {i}: {r['error'][-300:]}")
                results[prog.key][p].append(r)
            log(f"  round {i + 1}/{n_runs} done ({time.perf_counter() - t_start:.0f} s)")

        # Read back after all runs, so that no query competes with a measured run.
        for per in results.values():
            for p, rs in per.items():
                for r in rs:
                    if "error" not in r:
                        try:
                            r["measured"] = measure(server, r, p)
                        except (OSError, RuntimeError, KeyError, ValueError) as exc:
                            r["measured"] = {"error": str(exc)}
        report["skipped"] = skipped
        report["results"] = results
        report["loadavg_end"] = common.loadavg()
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return report


# -- report ----------------------------------------------------------------------------------


def _values(rs: List[Dict[str, Any]], key: str, digits: int) -> str:
    """One value per run, in run order: ``3.91 / 0.02 / 4.00``."""
    vals = []
    for r in rs:
        v = r.get("measured", {}).get(key) if "error" not in r else None
        vals.append("err" if "error" in r else ("–" if v is None else f"{v:.{digits}f}"))
    return " / ".join(vals) if vals else "–"


_COLUMNS = {
    "hotspan": [
        ("wall_samples_per_3s", 0, "hotspan: main-thread wall samples in 3 s"),
        ("ticks_per_3s", 0, "hotspan: sampler ticks in 3 s"),
        ("cpu_stored_s", 2, "hotspan: CPU stored per run, s"),
    ],
    "pyroscope": [("cpu_stored_s", 2, "pyroscope-io: CPU stored per run, s")],
    "hotspan-python": [
        ("ticks_per_3s", 0, "hotspan `native=False`: sampler ticks in 3 s"),
        ("cpu_stored_s", 2, "hotspan `native=False`: CPU stored per run, s"),
    ],
    "pyspy": [("cpu_stored_s", 2, "py-spy `--nonblocking`: CPU seen per run, s")],
}


def markdown(report: Dict[str, Any]) -> str:
    p, machine = report["params"], report["machine"]
    lines: List[str] = []
    add = lines.append
    load = (report["loadavg_start"], report.get("loadavg_end"))
    lines += common.head(
        f"Does the agent's sampler starve?{' (quick)' if p['quick'] else ''}",
        report["command"],
        report["wall_s"],
        common.machine_text(machine, report["versions"], load),
    )
    add("")
    add(
        f"Each run: a fresh process doing ~{p['seconds_of_work']:g} s of work (sizes calibrated "
        f"once per program), profiled at {p['rate_hz']} Hz; {p['runs']} runs per program and "
        "profiler, interleaved in a shuffled order; values are per run, in run order. "
        "**Wall samples in 3 s** = the wall profile stored for the work function (only the "
        "main thread runs it) / 10 ms, scaled from the run's work time to 3 s (~300 wanted). "
        "hotspan credits a late tick with all the wall time since the one before (up to 1 s), "
        "so this can look right while the sampler starves: **sampler ticks in 3 s** counts "
        "how often hotspan's sampler thread really ran during the work, in the process (– "
        "where the agent does not tick from Python). **CPU stored** = the total of the CPU "
        "profile the server stored for the run (py-spy: its folded output), against **real "
        "CPU** = the main thread's CPU time during the work (`time.thread_time`) in the "
        "runs of the first profiler (the others' runs do the same work: their real CPU is in "
        "the JSON, `main_thread_cpu_s`). hotspan runs with "
        "`upload_interval=3600` (one upload, at exit); pyroscope-io with its defaults "
        "(`gil_only=True`, `oncpu=True`); `native=False` is hotspan's pure-Python sampler "
        "(as with `HOTSPAN_NO_SPEEDUPS=1`)."
    )
    for prof, why in report.get("skipped", {}).items():
        add("")
        add(f"Not measured: {prof} — {why}")
    active = [prof for prof in p["profilers"] if prof not in report.get("skipped", {})]
    cols = [
        (prof, key, digits, title)
        for prof in active
        for key, digits, title in _COLUMNS.get(prof, [])
    ]
    if active:
        cols.insert(0, (active[0], "real_cpu_s", 2, f"real CPU per run ({active[0]} runs), s"))
    add("")
    add(
        f"| program (~{p['seconds_of_work']:g} s of work) | "
        + " | ".join(title for *_, title in cols)
        + " |"
    )
    add("|---|" + "---:|" * len(cols))
    for prog in p["programs"]:
        per = report["results"][prog["key"]]
        cells = [_values(per.get(prof, []), key, digits) for prof, key, digits, _ in cols]
        add(f"| {prog['title']} | " + " | ".join(cells) + " |")
    errors = [
        f"{k}/{prof}: {r['error'][-200:]!r}"
        for k, per in report["results"].items()
        for prof, rs in per.items()
        for r in rs
        if "error" in r
    ]
    if errors:
        add("")
        add(f"{len(errors)} failed run(s), first: `{errors[0]}`")
    add("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    keys = [p.key for p in PROGRAMS]
    ap.add_argument("--programs", default=",".join(keys), help="comma-separated (default: all)")
    ap.add_argument(
        "--profilers",
        default=",".join(PROFILERS),
        help=f"comma-separated, from {','.join(ALL_PROFILERS)} (default: {','.join(PROFILERS)})",
    )
    ap.add_argument("--runs", type=int, help="runs per program and profiler (default 3)")
    ap.add_argument("--seconds", type=float, help="seconds of work per run (default 4, quick 1)")
    ap.add_argument("--quick", action="store_true", help="~1 s of work per run")
    ap.add_argument("--out", default=common.RESULTS_DIR)
    args = ap.parse_args()
    profilers = common.comma_list(ap, args.profilers, ALL_PROFILERS, "profiler")
    programs = common.comma_list(ap, args.programs, keys, "program")

    t0 = time.perf_counter()
    machine = common.machine()
    report = run(args.quick, args.runs, args.seconds, profilers, programs)
    report.update(
        command=common.command_line("agent_starvation.py"),
        machine=machine,
        wall_s=round(time.perf_counter() - t0, 1),
    )
    md = markdown(report)
    stem = common.write_results("agent_starvation", report, md, args.out, args.quick)
    print(md)
    common.log(f"wrote {stem}.md/.json in {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
