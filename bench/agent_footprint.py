"""The agent's footprint, before and after a change: what ``configure()`` leaves in the
program (GC-tracked objects, modules), what that costs a container-heavy program
(``gc_containers``), whether the CPU profile adds up on bursty short threads
(``bursty_threads``), and the agent's own CPU per second of profiled time on short and long
runs.

"Before" and "after" are two source trees of hotspan (``--tree NAME=DIR``, DIR holding the
``hotspan`` package, its extensions built), run side by side in interleaved rounds with a
no-profiler A/A control, so that the load of the machine falls on all of them alike::

    python bench/agent_footprint.py --tree before=/tmp/base/src --tree after=src

Workload processes run with ``python -S`` (no site packages: 30-odd modules, ~4,000 GC-tracked
objects, the small program where the agent's share is largest) and the CPU and wall profiles
only (``alloc_sample_bytes=0, locks=False, threads=False``: the other collectors are measured
in ``bench/agent.py``).  Results go to ``bench/results/agent_footprint.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import common

WORKLOAD_DIR = common.AGENT_WORKLOAD_DIR
CPU_TYPE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
CPU_ONLY = "hotspan-cpuonly"

PROBE = """
import gc, json, sys, threading
g0, m0 = len(gc.get_objects()), len(sys.modules)
import hotspan
hotspan.configure(application_name="probe", server_address=sys.argv[1], upload_interval=3600,
                  alloc_sample_bytes=0, locks=False, threads=False)
gc.collect()
out = {"objects_before": g0, "objects_after": len(gc.get_objects()),
       "modules_before": m0, "modules_after": len(sys.modules)}
hotspan.shutdown(flush=True)
gc.collect()
out["objects_after_upload"] = len(gc.get_objects())
out["modules_after_upload"] = len(sys.modules)
print(json.dumps(out))
"""


log = common.log


def _env(tree: Optional[str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "PYROSCOPE_"))}
    if tree:
        env["PYTHONPATH"] = os.path.abspath(tree)
    return env


def probe(tree: str, server: str) -> Dict[str, Any]:
    common.compile_hotspan(sys.executable, _env(tree))
    out = subprocess.run(
        [sys.executable, "-S", "-c", PROBE, server],
        env=_env(tree),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(
    workload: str, profiler: str, tree: Optional[str], params: Dict[str, Any], server: str, app: str
) -> Dict[str, Any]:
    cmd = common.workload_command(workload, profiler, app, server, params, ["-S"])
    env = _env(tree)
    if tree is None:
        # The no-profiler runs import nothing of hotspan; the harness needs none of it.
        env["PYTHONPATH"] = ""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=common.REPO_DIR)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{workload} {profiler}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    result: Dict[str, Any] = json.loads(lines[-1])
    result["process_wall_s"] = time.perf_counter() - t0
    result["app"] = app
    return result


def cpu_by_function(server: str, app: str, start_ns: int, end_ns: int) -> Dict[str, int]:
    """CPU ns per function name (counted once per stack: the workloads do not recurse) in
    what the server stored for ``app``, through the querier API the UI uses."""
    graph = common.flamegraph(
        server,
        CPU_TYPE,
        f'{{service_name="{app}"}}',
        # Uploads are stamped with their window, which ends at the exit flush.
        start_ns // 1_000_000 - 120_000,
        end_ns // 1_000_000 + 120_000,
    )
    return common.flamegraph_totals(graph)[1]


_med = common.median_or_none


def _rounds(
    workload: str,
    trees: Dict[str, str],
    rounds: int,
    params: Dict[str, Any],
    server: str,
    app: str,
    progress: Optional[Callable[[int, str, Dict[str, Any]], None]] = None,
) -> Dict[str, List[Dict[str, Any]]]:
    """``workload`` under each tree's agent and twice without a profiler (the A/A pair), once
    per round, the order reversed every other round so that drift falls on all alike."""
    runs: Dict[str, List[Dict[str, Any]]] = {"none": [], "none-again": []}
    runs.update({name: [] for name in trees})
    for r in range(rounds):
        order = ["none", *trees, "none-again"]
        if r % 2:
            order.reverse()
        for who in order:
            tree = trees.get(who)
            profiler = CPU_ONLY if tree else who
            res = run(workload, profiler, tree, params, server, f"{app}_{who}_{r}")
            runs[who].append(res)
            if progress:
                progress(r, who, res)
    return runs


def gc_rounds(trees: Dict[str, str], rounds: int, seconds: float, server: str) -> Dict[str, Any]:
    params = common.calibrate_agent_workload("gc_containers", seconds, env=_env(None))

    def progress(r: int, who: str, res: Dict[str, Any]) -> None:
        log(
            f"  gc_containers round {r} {who}: work {res['work_s']:.3f} s, main CPU "
            f"{res['main_thread_cpu_s']:.3f} s, gc {res['gc_s']:.3f} s, tracked "
            f"{res['gc_tracked']}"
        )

    runs = _rounds("gc_containers", trees, rounds, params, server, "gcc", progress)
    out: Dict[str, Any] = {"params": params, "rounds": rounds, "runs": runs, "summary": {}}
    for who, rs in runs.items():
        if who == "none":
            continue
        base = runs["none"]
        summary = {}
        for key in ("work_s", "main_thread_cpu_s", "gc_s"):
            ratios = [100.0 * (a[key] / b[key] - 1) for a, b in zip(rs, base) if b[key] > 0]
            summary[f"{key}_vs_none_pct"] = _med(ratios)
            summary[f"{key}_vs_none_pct_all"] = ratios
        summary["gc_tracked"] = _med([x["gc_tracked"] for x in rs])
        summary["full_collections"] = _med([x["gc_collections"][2] for x in rs])
        out["summary"][who] = summary
    out["summary"]["none"] = {
        "gc_tracked": _med([x["gc_tracked"] for x in runs["none"]]),
        "full_collections": _med([x["gc_collections"][2] for x in runs["none"]]),
    }
    return out


def gc_instructions(trees: Dict[str, str], steps: int, server: str) -> Dict[str, Any]:
    """gc_containers under callgrind: instructions in the cyclic GC and in all, per tree and
    without a profiler.  Instruction counts do not move with the machine's load, which on a
    shared 2-core machine swamps a few percent of wall or CPU time; they do not count cache
    misses either, which a collection walking objects all over the heap has many of."""
    import shutil

    python = os.path.realpath(sys.executable)
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        return {"skipped": "valgrind is not installed"}
    out: Dict[str, Any] = {"steps": steps}
    for who, tree in [("none", None), *trees.items()]:
        with tempfile.TemporaryDirectory() as tmp:
            cg = os.path.join(tmp, "cg.out")
            env = _env(tree)
            if tree is None:
                env["PYTHONPATH"] = ""
            proc = subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    f"--callgrind-out-file={cg}",
                    python,
                    "-S",
                    os.path.join(WORKLOAD_DIR, "gc_containers.py"),
                    "--profiler",
                    CPU_ONLY if tree else "none",
                    "--server",
                    server,
                    "--params",
                    json.dumps({"steps": steps}),
                ],
                capture_output=True,
                text=True,
                env=env,
                cwd=common.REPO_DIR,
                timeout=1800,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            result = json.loads(lines[-1]) if lines else {}
            annotated = subprocess.run(
                ["callgrind_annotate", "--inclusive=yes", cg], capture_output=True, text=True
            ).stdout
        row: Dict[str, Any] = {
            "gc_tracked": result.get("gc_tracked"),
            "gc_collections": result.get("gc_collections"),
        }
        for line in annotated.splitlines():
            count = line.strip().split(" ", 1)[0].replace(",", "")
            if "PROGRAM TOTALS" in line and count.isdigit():
                row["instructions"] = int(count)
            elif "gc_collect_main [" in line and count.isdigit():
                row["gc_instructions"] = int(count)
        out[who] = row
        log(f"  callgrind {who}: {row}")
    base = out.get("none", {}).get("gc_instructions")
    for who in trees:
        row = out.get(who, {})
        if base and row.get("gc_instructions"):
            row["gc_instructions_vs_none_pct"] = 100.0 * (row["gc_instructions"] / base - 1)
    return out


def bursty_rounds(
    trees: Dict[str, str], rounds: int, seconds: float, server: str, stamp: str
) -> Dict[str, Any]:
    """CPU correctness, and the process CPU the agent adds, on bursty short threads."""
    params = common.calibrate_agent_workload("bursty_threads", seconds, env=_env(None))
    runs = _rounds("bursty_threads", trees, rounds, params, server, f"bt{stamp}")
    time.sleep(2)  # the server makes what it ingested queryable
    out: Dict[str, Any] = {"params": params, "rounds": rounds, "summary": {}}
    base = runs["none"]
    for who, rs in runs.items():
        summary: Dict[str, Any] = {}
        if who in trees:
            seen, split = [], []
            for res in rs:
                fn = cpu_by_function(server, res["app"], res["start_ns"], res["end_ns"])
                truth = res["threads_cpu_total_s"]
                seen.append(100.0 * fn.get("worker", 0) / 1e9 / truth)
                a, b = fn.get("burst_a", 0), fn.get("burst_b", 0)
                if a + b:
                    split.append(100.0 * a / (a + b) - res["true_share_a_pct"])
                res["cpu_seen_pct"] = seen[-1]
            summary["cpu_seen_pct"] = _med(seen)
            summary["cpu_seen_pct_all"] = seen
            summary["split_error_pp"] = _med(split)
            summary["split_error_pp_all"] = split
            summary["worst_split_error_pp"] = max(split, key=abs) if split else None
            worst = max(seen, key=lambda s: abs(s - 100)) if seen else None
            summary["worst_cpu_seen_pct"] = worst
        if who != "none":
            # The agent's CPU: the whole process's (start, work, exit flush) over the same
            # run without it, per second of profiled (work) time.
            extra = [a["process_cpu_s"] - b["process_cpu_s"] for a, b in zip(rs, base)]
            summary["process_cpu_vs_none_pct"] = _med(
                [100.0 * (a["process_cpu_s"] / b["process_cpu_s"] - 1) for a, b in zip(rs, base)]
            )
            summary["agent_cpu_ms_per_s"] = _med(
                [1000.0 * e / a["work_s"] for e, a in zip(extra, rs)]
            )
            summary["agent_cpu_ms"] = _med([1000.0 * e for e in extra])
            summary["work_cpu_vs_none_pct"] = _med(
                [100.0 * (a["work_cpu_s"] / b["work_cpu_s"] - 1) for a, b in zip(rs, base)]
            )
            summary["start_ms"] = _med([1000.0 * a["import_start_s"] for a in rs])
            summary["shutdown_ms"] = _med([1000.0 * a["shutdown_s"] for a in rs])
        summary["work_s"] = _med([a["work_s"] for a in rs])
        summary["threads_started"] = rs[0].get("threads_started") if rs else None
        out["summary"][who] = summary
    return out


_f = common.fmt_opt


def markdown(report: Dict[str, Any], command: str) -> str:
    trees = list(report["trees"])
    lines = [
        "# Agent footprint: before/after",
        "",
        f"`{command}`.",
        "",
        common.machine_text(report["machine"]),
        "",
        "Workloads run with `python -S`; hotspan with the CPU and wall profiles only.",
        "",
        "## What configure() leaves in the program",
        "",
        "| tree | GC-tracked objects (before -> after configure) | modules "
        "| after the exit upload |",
        "|---|---|---|---|",
    ]
    for name in trees:
        p = report["probe"][name]
        lines.append(
            f"| {name} | {p['objects_before']} -> {p['objects_after']} "
            f"(+{p['objects_after'] - p['objects_before']}) | {p['modules_before']} -> "
            f"{p['modules_after']} | {p['objects_after_upload']} objects, "
            f"{p['modules_after_upload']} modules |"
        )
    g = report.get("gc_containers")
    if g:
        lines += [
            "",
            f"## gc_containers ({g['rounds']} interleaved rounds, {g['params']})",
            "",
            "Median per-round change against the no-profiler run of the same round.",
            "",
            "| run | work (wall) | main thread CPU | CPU in GC | GC-tracked at start | "
            "full collections |",
            "|---|---|---|---|---|---|",
        ]
        for who, s in g["summary"].items():
            lines.append(
                f"| {who} | {_f(s.get('work_s_vs_none_pct'), 1, True)} % | "
                f"{_f(s.get('main_thread_cpu_s_vs_none_pct'), 1, True)} % | "
                f"{_f(s.get('gc_s_vs_none_pct'), 1, True)} % | {_f(s.get('gc_tracked'), 0)} | "
                f"{_f(s.get('full_collections'), 0)} |"
            )
    c = report.get("gc_callgrind")
    if c and "skipped" not in c:
        lines += [
            "",
            f"## gc_containers under callgrind ({c['steps']} steps; instructions, load-free)",
            "",
            "| run | GC-tracked at start | collections (gen 0/1/2) | instructions in the GC "
            "| vs none | all instructions |",
            "|---|---|---|---|---|---|",
        ]
        for who, row in c.items():
            if not isinstance(row, dict):
                continue
            lines.append(
                f"| {who} | {row.get('gc_tracked')} | {row.get('gc_collections')} | "
                f"{row.get('gc_instructions', 0) / 1e6:.1f} M | "
                f"{_f(row.get('gc_instructions_vs_none_pct'), 1, True)} % | "
                f"{row.get('instructions', 0) / 1e6:.1f} M |"
            )
    for key in ("bursty_short", "bursty_long"):
        b = report.get(key)
        if not b:
            continue
        lines += [
            "",
            f"## bursty_threads, {key.split('_')[1]} runs ({b['rounds']} interleaved rounds, "
            f"{b['params']})",
            "",
            "| run | profiled CPU / thread_time (median; worst) | burst_a share error, pp "
            "(median; worst) | process CPU vs none | agent CPU per s profiled | agent CPU "
            "per run | start | shutdown |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for who, s in b["summary"].items():
            if who == "none":
                continue
            lines.append(
                f"| {who} | {_f(s.get('cpu_seen_pct'))} %; {_f(s.get('worst_cpu_seen_pct'))} % | "
                f"{_f(s.get('split_error_pp'), 2, True)}; "
                f"{_f(s.get('worst_split_error_pp'), 2, True)} | "
                f"{_f(s.get('process_cpu_vs_none_pct'), 1, True)} % | "
                f"{_f(s.get('agent_cpu_ms_per_s'))} ms | {_f(s.get('agent_cpu_ms'))} ms | "
                f"{_f(s.get('start_ms'))} ms | {_f(s.get('shutdown_ms'))} ms |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--gc-rounds", type=int, default=7)
    ap.add_argument("--gc-seconds", type=float, default=2.0)
    ap.add_argument("--bursty-rounds", type=int, default=5)
    ap.add_argument("--short-seconds", type=float, default=1.6)
    ap.add_argument("--long-seconds", type=float, default=30.0)
    ap.add_argument("--long-rounds", type=int, default=3)
    ap.add_argument("--callgrind-steps", type=int, default=40)
    ap.add_argument("--only", default="probe,callgrind,gc,short,long")
    ap.add_argument("--out", default=common.RESULTS_DIR)
    args = ap.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree) or {"after": "src"}
    only = set(args.only.split(","))
    report: Dict[str, Any] = {"trees": trees, "machine": common.machine(), "probe": {}}
    with tempfile.TemporaryDirectory() as tmp, common.Server(tmp) as server:
        for name, tree in trees.items():
            report["probe"][name] = probe(tree, server.url)
            log(f"probe {name}: {report['probe'][name]}")
        if "callgrind" in only:
            report["gc_callgrind"] = gc_instructions(trees, args.callgrind_steps, server.url)
        if "gc" in only:
            report["gc_containers"] = gc_rounds(trees, args.gc_rounds, args.gc_seconds, server.url)
        stamp = str(int(time.time()))
        if "short" in only:
            report["bursty_short"] = bursty_rounds(
                trees, args.bursty_rounds, args.short_seconds, server.url, stamp + "s"
            )
        if "long" in only:
            report["bursty_long"] = bursty_rounds(
                trees, args.long_rounds, args.long_seconds, server.url, stamp + "l"
            )
    command = "python bench/agent_footprint.py " + " ".join(sys.argv[1:])
    md = markdown(report, command)
    common.write_results("agent_footprint", report, md, args.out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
