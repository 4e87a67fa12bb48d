"""Four threads, each looping ``busy_part`` (~1 ms of CPU) then ``idle_part`` (sleep 4 ms).

Each thread measures its own CPU with ``time.thread_time``; their sum is what a CPU profile of
``worker`` should add up to, and nearly all of it is in ``busy_part`` (``idle_part`` only
enters and leaves ``time.sleep``).  With four threads wanting the GIL 20% of the time each, a
thread often waits for the GIL with ``busy_part`` or ``idle_part`` on its stack but no CPU:
profilers that sample "the thread holding the GIL" or "every thread not in a syscall" get
these wrong in opposite directions.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List

import _harness

THREADS = 4
BUSY_MS = 1.0
SLEEP_S = 0.004


def busy_part(n: int) -> int:
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x


def idle_part() -> None:
    time.sleep(SLEEP_S)


def worker(iterations: int, n: int, barrier: threading.Barrier, out: List[float], k: int) -> None:
    barrier.wait()
    t0 = time.thread_time()
    for _ in range(iterations):
        busy_part(n)
        idle_part()
    out[k] = time.thread_time() - t0


def run_threads(iterations: int, n: int) -> List[float]:
    cpu = [0.0] * THREADS
    barrier = threading.Barrier(THREADS)
    threads = [
        threading.Thread(target=worker, args=(iterations, n, barrier, cpu, k), name=f"worker-{k}")
        for k in range(THREADS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return cpu


def calibrate(seconds: float) -> Dict[str, Any]:
    return {
        # ~5 ms per iteration when the GIL is free; contention makes it a little longer.
        "iterations": max(1, round(seconds / (BUSY_MS / 1000 + SLEEP_S))),
        "n": int(_harness.loops_per_ms() * BUSY_MS),
    }


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    cpu = run_threads(params["iterations"], params["n"])
    return {"threads_cpu_s": cpu, "threads_cpu_total_s": sum(cpu), "work_function": "worker"}


if __name__ == "__main__":
    _harness.main(calibrate, work)
