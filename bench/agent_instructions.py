"""The agent's cost in instructions, which a noisy shared VM cannot blur: each workload under
``valgrind --tool=callgrind``, with no profiler, no profiler again (the A/A control: what a
count moves by with no agent at all), hotspan with CPU and wall only, and hotspan with its
defaults (every profile type but allocations, which are off by default), at two sizes of work;
the cost is the extra instructions per unit of work (the difference between the two sizes, so
that start-up and the exit upload cancel).  The web servers (``wsgi_threaded``,
``web_server``) serve for a fixed time with their load generator outside valgrind: their unit
is a request, and their cost the extra instructions per request.

    python bench/agent_instructions.py [--workloads cpu_split,alloc,...] [--seconds 0.15]
                                       [--server-seconds 5] [--repeats 3]
                                       [--name agent_instructions-3.12]

Run by another interpreter (a venv of scripts/matrix.sh, say), it measures the agent there.

Needs Debian's ``valgrind``.  Writes ``bench/results/agent_instructions.{md,json}``.  Under
valgrind the program runs ~50x slower while the sampler's timers count real CPU time, so the
sample rate is lowered to 2 Hz (``HOTSPAN_BENCH_SAMPLE_RATE``) to keep samples per unit of work
near a native run at 100 Hz; the per-operation costs (the allocator hook, profiled locks, span
labels) do not depend on it.  Instruction counts are not time: a cache miss or a mispredicted
branch costs more than an instruction, so read these beside the timed runs of ``agent.py``.

One count is not a measurement: which sample rows the exit upload encodes, where CPython's
type cache and pymalloc pools collide and the agent's tick under valgrind's slower clock move
a count by up to a point.  Each workload is counted ``--repeats`` times (each repeat with its
own calibration); the table gives the median and the range.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

WORKLOAD_DIR = common.AGENT_WORKLOAD_DIR
# The parameter that sets each workload's amount of work (the rest stays as calibrated).
SCALE = {
    "cpu_split": "rounds",
    "alloc": "n",
    "gc_containers": "steps",
    "asyncio_spans": "requests",
    "threads": "iterations",
    # The servers serve for a fixed time (valgrind's, with the load generator outside it,
    # natively): their unit of work is a request, counted by the run.
    "wsgi_threaded": "seconds",
    "web_server": "seconds",
}
SERVERS = {"wsgi_threaded", "web_server"}
PROFILERS = ["none", "none-again", "hotspan-cpuonly", "hotspan"]
LABELS = {
    "none": "no profiler",
    "none-again": "no profiler, again (A/A)",
    "hotspan-cpuonly": "hotspan, CPU and wall only",
    "hotspan": "hotspan, its defaults",
}
DEAD_SERVER = "http://127.0.0.1:9"  # nothing listens: the exit upload fails at once


def python_binary() -> str:
    # pyenv's `python3` is a shell script: valgrind must start the interpreter itself.
    return os.path.realpath(sys.executable)


def instructions(workload: str, profiler: str, params: Dict[str, object]) -> Tuple[int, float]:
    """The instructions of one run and its units of work (a server's requests; otherwise the
    size the params set)."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "callgrind.out")
        # Timers, not perf events: valgrind delivers a signal only between its blocks of
        # guest code, and a task-clock event stays off from its overflow until the handler
        # has run, so under valgrind it samples far less often than natively.
        env = dict(
            os.environ,
            # The interpreter itself runs (see python_binary): a venv's packages come along
            # by path, as they would have through the venv.
            PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
            HOTSPAN_BENCH_SAMPLE_RATE="2",
            HOTSPAN_CPU_TRIGGER="timer",
            PYTHONHASHSEED="0",
        )
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out_file}",
                python_binary(),
                os.path.join(WORKLOAD_DIR, f"{workload}.py"),
                "--profiler",
                profiler,
                "--server",
                DEAD_SERVER,
                "--params",
                json.dumps(params),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        found = re.search(r"Collected : (\d+)", proc.stderr) or re.search(
            r"I\s+refs:\s+([\d,]+)", proc.stderr
        )
        if proc.returncode != 0 or found is None:
            raise RuntimeError(f"{workload}/{profiler}: {proc.stderr[-2000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        units = float(result.get("units", params[SCALE[workload]]))  # type: ignore[arg-type]
        return int(found.group(1).replace(",", "")), units


def measure(workload: str, seconds: float, server_seconds: float) -> Dict[str, object]:
    small = common.calibrate_agent_workload(
        workload, server_seconds if workload in SERVERS else seconds
    )
    key = SCALE[workload]
    big = dict(small, **{key: int(small[key]) * 3})  # type: ignore[call-overload]
    jobs: List[Tuple[str, str, Dict[str, object]]] = [
        (p, size, params) for p in PROFILERS for size, params in (("1x", small), ("3x", big))
    ]
    # A server and its load generator are pinned to cores of their own (one each on 2 cores):
    # two servers at once would share the server's core, and the agent's work per second of
    # valgrind's clock would fall on half the requests.
    workers = 1 if workload in SERVERS else os.cpu_count() or 2
    with ThreadPoolExecutor(max_workers=workers) as pool:
        counts = list(pool.map(lambda job: instructions(workload, job[0], job[2]), jobs))
    per = {(p, size): n for (p, size, _), n in zip(jobs, counts)}
    # Per unit of work between the two sizes, so that start-up and the exit upload cancel.
    marginal = {
        p: (per[(p, "3x")][0] - per[(p, "1x")][0]) / (per[(p, "3x")][1] - per[(p, "1x")][1])
        for p in PROFILERS
    }
    base = marginal["none"]
    return {
        "workload": workload,
        "params_1x": small,
        "params_3x": big,
        "instructions": {f"{p} {s}": n for (p, s), (n, _) in per.items()},
        "units": {f"{p} {s}": u for (p, s), (_, u) in per.items()},
        "marginal_per_unit": marginal,
        "overhead_pct": {p: 100.0 * (marginal[p] / base - 1) for p in PROFILERS if p != "none"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default=",".join(SCALE))
    ap.add_argument("--seconds", type=float, default=0.15, help="native seconds of the 1x size")
    ap.add_argument(
        "--server-seconds",
        type=float,
        default=5.0,
        help="seconds a server serves at the 1x size, on valgrind's clock",
    )
    ap.add_argument("--repeats", type=int, default=3, help="counts per workload (median)")
    ap.add_argument("--out", default=common.RESULTS_DIR)
    ap.add_argument(
        "--name",
        default="agent_instructions",
        help="results file name (e.g. agent_instructions-3.12 for another interpreter)",
    )
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    machine = common.machine()
    results = []
    for workload in args.workloads.split(","):
        runs = []
        for k in range(args.repeats):
            print(f"{workload} {k + 1}/{args.repeats} ...", file=sys.stderr, flush=True)
            runs.append(measure(workload, args.seconds, args.server_seconds))
        results.append(
            {
                "workload": workload,
                "overhead_pct": {
                    p: statistics.median(r["overhead_pct"][p] for r in runs)  # type: ignore[index]
                    for p in PROFILERS[1:]
                },
                "overhead_range_pct": {
                    p: [
                        min(r["overhead_pct"][p] for r in runs),  # type: ignore[index]
                        max(r["overhead_pct"][p] for r in runs),  # type: ignore[index]
                    ]
                    for p in PROFILERS[1:]
                },
                "runs": runs,
            }
        )
    rows = [
        "| workload | " + " | ".join(LABELS[p] for p in PROFILERS[1:]) + " |",
        "|---|" + "---:|" * (len(PROFILERS) - 1),
    ]
    for r in results:
        cells = " | ".join(
            "{:+.2f} % [{:+.2f}..{:+.2f}]".format(
                r["overhead_pct"][p],  # type: ignore[index]
                *r["overhead_range_pct"][p],  # type: ignore[index]
            )
            for p in PROFILERS[1:]
        )
        rows.append(f"| `{r['workload']}` | {cells} |")
    md = "\n".join(
        [
            "# hotspan agent: extra instructions per unit of work (callgrind)",
            "",
            f"Command: `{common.command_line('agent_instructions.py')}` "
            f"(1x = {args.seconds} s of native work, a server's {args.server_seconds:g} s of "
            "serving under valgrind; 3x its triple; the cost is the extra instructions per "
            "unit of work (a server's: per request) of 3x - 1x against no profiler; "
            "median [range] of "
            f"{args.repeats} counts).",
            "",
            common.machine_text(machine),
            "",
            *rows,
            "",
        ]
    )
    common.write_results(args.name, {"machine": machine, "results": results}, md, args.out)
    print(md)


if __name__ == "__main__":
    main()
