"""What runtime stats on spans (``span_stats``) and span conditions cost per span: the same
asyncio programs without an agent, with the agent and span_stats off, on, and on with a
the agent's span conditions (slow, error and high CPU rules on) watching span ends, side by
side.

    python bench/agent_span_stats.py            # 5 interleaved rounds (~3 minutes)
    python bench/agent_span_stats.py --quick    # 2 rounds

Each cell is a fresh process running one program for a fixed amount of work, timed
(``perf_counter``, the work only: import and agent start are not in it):

- ``asyncio_spans``: ``bench/agent_workloads/asyncio_spans.py``'s requests (50 in flight, a
  ``request`` span with ``parse``, ``db`` and ``render`` children, ~60 us of CPU each):
  4 spans per request;
- ``empty_spans``: a coroutine on a running loop opening a span and a child span, with
  nothing in them: the per-span cost alone.

The SDK ``TracerProvider`` has no exporter (spans are recorded and ended, sent nowhere).  The
agent uploads to an address where nothing listens, every 3600 s: no upload happens in a run.
Reported: the median time per request (or span pair), its ratio to "none", and the cost per
span of span_stats (on - off) and of the conditions (conditions - on), in microseconds.
Results: ``bench/results/agent_span_stats.md`` and ``.json`` (``-quick`` with --quick).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

VARIANTS = ["none", "span_stats=off", "span_stats=on", "span_stats=on+conditions"]
WORKLOADS = {"asyncio_spans": 4, "empty_spans": 2}  # spans per unit of work
UNITS = {"asyncio_spans": 4000, "empty_spans": 40000}

# Run as a child: python agent_span_stats.py --child VARIANT WORKLOAD UNITS
CHILD = """
import asyncio, os, sys, time
sys.path.insert(0, {workloads!r})
variant, workload, units = sys.argv[1], sys.argv[2], int(sys.argv[3])
import _harness
import asyncio_spans
tracer = _harness.otel_tracer()
if variant != "none":
    import hotspan
    # Conditions are the agent's own (error_condition is on by default): off but in the
    # last variant, which turns every rule on.
    conditions = variant.endswith("+conditions")
    hotspan.configure(application_name="span-stats-bench", server_address="http://127.0.0.1:9",
                      upload_interval=3600, span_stats=variant != "span_stats=off",
                      error_condition=conditions,
                      slow_request_threshold=1.0 if conditions else 0.0,
                      cpu_threshold_percent=50.0 if conditions else 0.0)

async def empty(n):
    for _ in range(n):
        with tracer.start_as_current_span("outer"):
            with tracer.start_as_current_span("inner"):
                pass

def run(n):
    if workload == "asyncio_spans":
        asyncio_spans.run_requests(n)
    else:
        asyncio.run(empty(n))

run(units // 10)  # warm-up: caches, first-span paths
t0 = time.perf_counter()
run(units)
print(time.perf_counter() - t0, flush=True)
os._exit(0)  # no exit flush: the server is absent
"""


def measure(variant: str, workload: str, units: int) -> float:
    code = CHILD.format(workloads=common.AGENT_WORKLOAD_DIR)
    out = subprocess.run(
        [sys.executable, "-c", code, variant, workload, str(units)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def summarize(times: Dict[str, Dict[str, List[float]]]) -> Dict[str, Dict[str, object]]:
    out: Dict[str, Dict[str, object]] = {}
    for workload, per_unit_spans in WORKLOADS.items():
        units = UNITS[workload]
        med = {v: statistics.median(times[workload][v]) / units * 1e6 for v in VARIANTS}
        base = med["none"]
        spans = per_unit_spans
        out[workload] = {
            "us_per_unit": {v: round(med[v], 2) for v in VARIANTS},
            "ratio_to_none": {v: round(med[v] / base, 3) for v in VARIANTS},
            "span_stats_us_per_span": round(
                (med["span_stats=on"] - med["span_stats=off"]) / spans, 2
            ),
            "conditions_us_per_span": round(
                (med["span_stats=on+conditions"] - med["span_stats=on"]) / spans, 2
            ),
            "agent_off_us_per_span": round((med["span_stats=off"] - base) / spans, 2),
            "runs_s": {v: [round(t, 3) for t in times[workload][v]] for v in VARIANTS},
        }
    return out


def markdown(report: Dict[str, object]) -> str:
    results: Dict[str, Dict[str, object]] = report["results"]  # type: ignore[assignment]
    lines = [
        "# Span stats and span conditions: cost per span",
        "",
        f"`{report['command']}`: {report['rounds']} interleaved rounds, a fresh process per "
        f"cell, median; {report['total_s']} s in all.",
        "",
        common.machine_text(report["machine"]),  # type: ignore[arg-type]
        "",
        "| workload | unit | " + " | ".join(VARIANTS) + " |",
        "|---|---|" + "---|" * len(VARIANTS),
    ]
    for workload, r in results.items():
        unit = "request (4 spans)" if workload == "asyncio_spans" else "span pair"
        us: Dict[str, float] = r["us_per_unit"]  # type: ignore[assignment]
        ratio: Dict[str, float] = r["ratio_to_none"]  # type: ignore[assignment]
        cells = [f"{us[v]:.1f} us (x{ratio[v]:.3f})" for v in VARIANTS]
        lines.append(f"| {workload} | {unit} | " + " | ".join(cells) + " |")
    lines += ["", "Per span, in microseconds (differences of the medians):", ""]
    lines += ["| workload | agent, span_stats off | span_stats (on - off) | conditions |"]
    lines += ["|---|---|---|---|"]
    for workload, r in results.items():
        lines.append(
            f"| {workload} | {r['agent_off_us_per_span']} | {r['span_stats_us_per_span']} | "
            f"{r['conditions_us_per_span']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--out", default=common.RESULTS_DIR)
    args = ap.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    scale = 0.25 if args.quick else 1.0
    times: Dict[str, Dict[str, List[float]]] = {w: {v: [] for v in VARIANTS} for w in WORKLOADS}
    started = time.monotonic()
    for r in range(rounds):
        for workload in WORKLOADS:
            units = int(UNITS[workload] * scale)
            for variant in VARIANTS:
                t = measure(variant, workload, units) / scale  # as if at full size
                times[workload][variant].append(t)
                print(f"round {r + 1}: {workload} {variant}: {t:.3f} s", file=sys.stderr)
    command = common.command_line("agent_span_stats.py")
    report: Dict[str, object] = {
        "command": command,
        "rounds": rounds,
        "units": UNITS,
        "total_s": round(time.monotonic() - started),
        "machine": common.machine(["opentelemetry-sdk"]),
    }
    report["results"] = summarize(times)
    md = markdown(report)
    common.write_results("agent_span_stats", report, md, args.out, args.quick)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
