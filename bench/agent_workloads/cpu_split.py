"""CPU-bound: ``func_a`` and ``func_b`` run the same loop, 3:1 in iterations (75/25).

Each round runs ``func_a`` for ~150 ms then ``func_b`` for ~50 ms, the length varied +-30% from
round to round (same seeded sequence in every run).  Long chunks keep the error of a 100 Hz
sampler at the chunk edges small (it is a boundary effect: ~+-0.5 sample per edge), so what
is left is the profiler's bias; the varying lengths stop the 10 ms sampling period from
locking onto the rounds.  The true split is measured with ``time.thread_time`` around each
call, so the profile is compared with the CPU really spent, not with the nominal 75.
"""

from __future__ import annotations

import random
import time
from typing import Any, Dict

import _harness

ROUND_MS = 200.0  # func_a 150 ms + func_b 50 ms


def func_a(n: int) -> int:
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x


def func_b(n: int) -> int:
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x


def run_split(rounds: int, unit: int, seed: int) -> Dict[str, float]:
    rng = random.Random(seed)
    cpu_a = cpu_b = 0.0
    for _ in range(rounds):
        n = int(unit * rng.uniform(0.7, 1.3))
        t0 = time.thread_time()
        func_a(3 * n)
        t1 = time.thread_time()
        func_b(n)
        t2 = time.thread_time()
        cpu_a += t1 - t0
        cpu_b += t2 - t1
    return {"cpu_a_s": cpu_a, "cpu_b_s": cpu_b}


def calibrate(seconds: float) -> Dict[str, Any]:
    per_ms = _harness.loops_per_ms()
    return {
        "rounds": max(1, round(seconds * 1000 / ROUND_MS)),
        "unit": int(per_ms * ROUND_MS / 4),
        "seed": 1,
    }


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    truth = run_split(params["rounds"], params["unit"], params["seed"])
    total = truth["cpu_a_s"] + truth["cpu_b_s"]
    return {
        **truth,
        "true_share_a_pct": 100.0 * truth["cpu_a_s"] / total if total else 0.0,
        "work_function": "run_split",
    }


if __name__ == "__main__":
    _harness.main(calibrate, work)
