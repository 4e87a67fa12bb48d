"""Allocations at 75/25: ``alloc_a`` and ``alloc_b`` make the same objects, 3:1 in number.

Each round ``alloc_a`` makes ``3 n`` and ``alloc_b`` ``n`` bytes objects of 1-8 KiB (a seeded
sequence of sizes, the same in both, so that neither gets the larger ones), dropping each at
once: the heap stays small while the allocator sees gigabytes.  The truth is what the
functions asked for, counted by the workload (``sys.getsizeof`` of every object, which is the
size ``PyObject_Malloc`` got), so the profile's ``alloc_space`` per function is compared with
the bytes really allocated, not with the nominal 75.  The loop's own small objects (the
``int`` of a size past 256) come in the same 3:1 and are under 1% of the bytes.
"""

from __future__ import annotations

import random
import sys
from typing import Any, Dict, List

import _harness

ROUND = 2_000  # objects of alloc_b per round


def alloc_a(sizes: List[int]) -> int:
    total = 0
    for _ in range(3):
        for size in sizes:
            total += sys.getsizeof(bytes(size))
    return total


def alloc_b(sizes: List[int]) -> int:
    total = 0
    for size in sizes:
        total += sys.getsizeof(bytes(size))
    return total


def run_alloc_split(rounds: int, seed: int) -> Dict[str, int]:
    rng = random.Random(seed)
    sizes = [rng.randrange(1024, 8192) for _ in range(ROUND)]
    a = b = 0
    for _ in range(rounds):
        rng.shuffle(sizes)
        a += alloc_a(sizes)
        b += alloc_b(sizes)
    return {"bytes_a": a, "bytes_b": b}


def calibrate(seconds: float) -> Dict[str, Any]:
    return {"rounds": _harness.scale_to(seconds, 20, lambda k: run_alloc_split(k, 1)), "seed": 1}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    truth = run_alloc_split(params["rounds"], params["seed"])
    total = truth["bytes_a"] + truth["bytes_b"]
    return {
        **truth,
        "true_share_a_pct": 100.0 * truth["bytes_a"] / total,
        "work_function": "run_alloc_split",
    }


if __name__ == "__main__":
    _harness.main(calibrate, work)
