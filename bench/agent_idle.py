"""What the agent costs a process that does nothing: its own CPU while the program's threads
all wait, with 1, 100 and 500 idle threads (a web server's thread pool between requests).

    python bench/agent_idle.py            # 3 rounds x 10 s per cell (~5 minutes)
    python bench/agent_idle.py --quick    # 1 round x 3 s

Each cell is a fresh process: N threads blocked on an event, the profiler started, then its
CPU (all threads, from getrusage) over a measured window, as % of one core.  "none" is the same
process without a profiler: the floor this machine's timers and /proc reads give.  Results:
``bench/results/agent_idle.md`` and ``.json``.
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

PROFILERS = ["none", "hotspan", "hotspan-python", "pyroscope"]
THREADS = [1, 100, 500]

# Run as a child: python agent_idle.py --child PROFILER THREADS SECONDS
CHILD = """
import resource, sys, threading, time
profiler, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
done = threading.Event()
threads = [threading.Thread(target=done.wait) for _ in range(n - 1)]
for t in threads:
    t.start()
if profiler.startswith("hotspan"):
    import hotspan
    hotspan.configure(application_name="idle-bench", server_address="http://127.0.0.1:9",
                      upload_interval=3600, native=profiler == "hotspan")
elif profiler == "pyroscope":
    import pyroscope
    pyroscope.configure(application_name="idle-bench", server_address="http://127.0.0.1:9",
                        sample_rate=100)
time.sleep(1.0)  # past start-up
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
time.sleep(seconds)
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(cpu / (t1 - t0) * 100, flush=True)
done.set()
import os
os._exit(0)  # no exit flush: nothing was sampled that matters, and the server is absent
"""


def measure(profiler: str, threads: int, seconds: float) -> float:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, profiler, str(threads), str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{profiler} with {threads} threads: {out.stderr[-1000:]}")
    return float(out.stdout.split()[-1])


def markdown(report: Dict[str, object], cells: Dict[str, Dict[str, List[float]]]) -> str:
    lines = [
        "# hotspan agent: CPU of an idle process",
        "",
        f"Command: `{report['command']}` — {report['rounds']} rounds of "
        f"{report['seconds']} s per cell, interleaved.",
        "",
        common.machine_text(report["machine"]),  # type: ignore[arg-type]
        "",
        "CPU of the whole process (every thread: the profiler's and the idle program's), as % "
        "of one core, median over rounds [min..max]. All profilers at 100 Hz; pyroscope-io with "
        "its defaults.",
        "",
        "| profiler | " + " | ".join(f"{n} idle threads" for n in THREADS) + " |",
        "|---|" + "---:|" * len(THREADS),
    ]
    for profiler in PROFILERS:
        row = []
        for n in THREADS:
            values = cells[profiler][str(n)]
            row.append(f"{statistics.median(values):.2f} [{min(values):.2f}..{max(values):.2f}]")
        lines.append(f"| {profiler} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=common.RESULTS_DIR)
    args = ap.parse_args()
    rounds, seconds = (1, 3.0) if args.quick else (3, 10.0)
    cells: Dict[str, Dict[str, List[float]]] = {p: {str(n): [] for n in THREADS} for p in PROFILERS}
    started = time.monotonic()
    for r in range(rounds):
        for n in THREADS:
            for profiler in PROFILERS:
                value = measure(profiler, n, seconds)
                cells[profiler][str(n)].append(value)
                print(f"round {r + 1}: {profiler}, {n} threads: {value:.2f}%", file=sys.stderr)
    report = {
        "command": "python bench/agent_idle.py" + (" --quick" if args.quick else ""),
        "rounds": rounds,
        "seconds": seconds,
        "total_s": round(time.monotonic() - started),
        "machine": common.machine(["pyroscope-io"]),
        "cpu_percent_of_a_core": cells,
    }
    md = markdown(report, cells)
    common.write_results("agent_idle", report, md, args.out, args.quick)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
