"""Container-heavy: batches of dicts, lists and tuples built, used and dropped.

Each step builds a batch of ~``BATCH`` containers (records as dicts holding lists and
tuples, grouped in lists), walks it, and drops it; one record in a hundred is kept in a ring
of ``KEEP`` slots, so the oldest generation holds a changing live set too.  CPython counts
container allocations net of frees, so a loop that frees as fast as it allocates (``alloc``)
never collects; a batch that grows to thousands of containers before it is dropped collects
all the way: full collections come every few steps, and each walks every container the
process holds.  The program's own live heap is small (a batch, the ring), like a service's
between requests, so whatever else the process keeps tracked (an agent's modules, functions,
classes, dicts) is a large share of what every full collection walks.

Truth: ``gc_collections`` (per generation, counted by a ``gc.callbacks`` hook that costs the
same with any profiler), ``gc_s`` (the main thread's CPU inside collections), and
``gc_tracked`` (the objects the GC tracks as the work starts).
"""

from __future__ import annotations

import gc
import time
from typing import Any, Dict, List, Optional

import _harness

BATCH = 12_000  # containers per step
KEEP = 2_000  # records kept alive across steps


def make_batch(i: int) -> List[List[Dict[str, Any]]]:
    records = [{"id": k, "tags": [k, i], "pair": (k, [i])} for k in range(i, i + BATCH // 4)]
    return [records[k : k + 8] for k in range(0, len(records), 8)]


def churn(steps: int) -> int:
    ring: List[Optional[Dict[str, Any]]] = [None] * KEEP
    kept = 0
    total = 0
    for i in range(steps):
        batch = make_batch(i)
        for group in batch:
            total += len(group[0]["tags"])
        for group in batch[::12]:
            ring[kept % KEEP] = group[0]
            kept += 1
        del batch
    return total


def calibrate(seconds: float) -> Dict[str, Any]:
    return {"steps": _harness.scale_to(seconds, 200, churn, time.thread_time)}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    counts = [0, 0, 0]
    spent = [0.0, 0.0]

    def on_gc(phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            spent[1] = time.thread_time()
        else:
            counts[info["generation"]] += 1
            spent[0] += time.thread_time() - spent[1]

    tracked = len(gc.get_objects())
    gc.callbacks.append(on_gc)
    try:
        churn(params["steps"])
    finally:
        gc.callbacks.remove(on_gc)
    return {
        "steps": params["steps"],
        "gc_collections": counts,
        "gc_s": spent[0],
        "gc_tracked": tracked,
        "work_function": "churn",
    }


if __name__ == "__main__":
    _harness.main(calibrate, work)
