"""Bursty, short-lived threads: a pool that keeps ``THREADS`` workers alive, each burning
short bursts of CPU between sleeps for a few hundred milliseconds and then ending, its place
taken by a new one.

A burst is ``burst_a`` then ``burst_b``, 3:1 in iterations (75/25), ~1 ms together, the
length varied +-50% (seeded); then the thread sleeps 1-5 ms (seeded).  The sleeps vary: with
a fixed cycle close to the kernel's scheduler tick (4 ms at HZ=250), which is when CPU timers
are checked, samples land at one phase of the cycle and the split is off by ~9 pp with any
CPU-timer sampler (measured: ``bench/results/agent_footprint.md``).  This is where a CPU-timer
sampler loses CPU: each thread ends with CPU its samples do not cover yet (half an interval
on average), a timer that expires just before a sleep signals only in a later burst, and
one that expires just before the thread ends never signals.

Truth, measured by each thread with ``time.thread_time``: ``threads_cpu_total_s`` (all the
CPU of ``worker``), ``cpu_a_s`` and ``cpu_b_s`` (inside ``burst_a`` and ``burst_b``) and
``true_share_a_pct``; ``threads_started`` counts the threads.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Dict, List

import _harness

THREADS = 4  # alive at once
BURST_MS = 1.0  # burst_a + burst_b
SLEEP_S = 0.003
LIFE_BURSTS = 60  # ~240 ms per thread


def burst_a(n: int) -> int:
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x


def burst_b(n: int) -> int:
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x


def worker(bursts: int, unit: int, seed: int, out: List[List[float]]) -> None:
    rng = random.Random(seed)
    total0 = time.thread_time()
    cpu_a = cpu_b = 0.0
    for _ in range(bursts):
        n = int(unit * rng.uniform(0.5, 1.5))
        t0 = time.thread_time()
        burst_a(3 * n)
        t1 = time.thread_time()
        burst_b(n)
        t2 = time.thread_time()
        cpu_a += t1 - t0
        cpu_b += t2 - t1
        time.sleep(SLEEP_S * rng.uniform(0.3, 1.7))
    out.append([time.thread_time() - total0, cpu_a, cpu_b])


def run_pool(threads: int, unit: int, seed: int) -> List[List[float]]:
    out: List[List[float]] = []
    live: List[threading.Thread] = []
    for k in range(threads):
        # Lifetimes spread so that threads end (and start) at different moments.
        bursts = LIFE_BURSTS // 2 + (k * 7919) % LIFE_BURSTS
        t = threading.Thread(target=worker, args=(bursts, unit, seed + k, out), name=f"burst-{k}")
        live.append(t)
        t.start()
        while sum(1 for x in live if x.is_alive()) >= THREADS:
            time.sleep(0.001)
    for t in live:
        t.join()
    return out


def calibrate(seconds: float, threads_alive: int = THREADS) -> Dict[str, Any]:
    per_ms = _harness.loops_per_ms()
    per_thread_s = LIFE_BURSTS * (BURST_MS / 1000 + SLEEP_S)
    # THREADS threads at a time, each ~per_thread_s long.
    return {
        "threads": max(THREADS, round(seconds * threads_alive / per_thread_s)),
        "unit": int(per_ms * BURST_MS / 4),
        "seed": 1,
    }


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    rows = run_pool(params["threads"], params["unit"], params["seed"])
    total = sum(r[0] for r in rows)
    cpu_a = sum(r[1] for r in rows)
    cpu_b = sum(r[2] for r in rows)
    return {
        "threads_started": len(rows),
        "threads_cpu_total_s": total,
        "cpu_a_s": cpu_a,
        "cpu_b_s": cpu_b,
        "true_share_a_pct": 100.0 * cpu_a / (cpu_a + cpu_b) if cpu_a + cpu_b else 0.0,
        "work_function": "worker",
    }


if __name__ == "__main__":
    _harness.main(calibrate, work)
