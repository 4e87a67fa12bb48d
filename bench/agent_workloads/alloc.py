"""Allocation-heavy: small dicts, strings, lists, tuples and bytes made and dropped in a loop.

The records go into a ring of 20,000 slots, each new one replacing (and freeing) the oldest:
the heap stays at a steady size while the allocator and the cyclic GC (dicts and lists are
tracked) keep working.  Not "fill a list, drop it all": that frees whole pymalloc arenas,
which go back to the OS and fault back in, so the run would mostly time page faults, and
anything else in the process that happens to keep an arena alive (an agent's thread
allocating now and then) would make it faster.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import _harness

RING = 20_000


def make_records(n: int) -> int:
    ring: List[Optional[Dict[str, Any]]] = [None] * RING
    for i in range(n):
        ring[i % RING] = {
            "id": i,
            "name": f"item-{i}",
            "tags": [i, i + 1, i + 2],
            "point": (i, i * 2),
            "blob": b"x" * (64 + i % 64),
        }
    return n


def calibrate(seconds: float) -> Dict[str, Any]:
    # Tries of 300k records: shorter ones run slower per record (a cold heap) and undersize
    # the run.
    return {"n": _harness.scale_to(seconds, 300_000, make_records, time.thread_time)}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    made = make_records(params["n"])
    return {"records": made, "work_function": "make_records"}


if __name__ == "__main__":
    _harness.main(calibrate, work)
