"""A leak at a known rate: ``leak_step`` keeps a 4 KiB bytes object per step, for ever.

Between two leaked objects ``churn`` makes and drops eight objects of the same size and spins
a little (a calibrated loop): the allocator sees nine times the leaked bytes, so a profile that
counted freed objects as live, or lost the leaked ones, is off by far more than the target.
The leaked objects stay alive until the process exits, so the profile's ``inuse_space`` at its
last upload should be the leaked bytes; the truth is counted by the workload
(``sys.getsizeof`` of every leaked object, plus the list holding them) and the rate is that
over the work's wall time.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Dict, List

import _harness

OBJECT_BYTES = 4096
CHURN = 8
STEPS = 64_000  # ~256 MiB leaked: enough 512 KiB samples (~500) for a few % of sampling error
_LEAKED: List[bytes] = []


def leak_step(size: int) -> int:
    obj = bytes(size)
    _LEAKED.append(obj)
    return sys.getsizeof(obj)


def churn(size: int, spin: int) -> int:
    for _ in range(CHURN):
        bytes(size)
    return _harness.spin(spin)


def run_leak(steps: int, spin: int) -> int:
    leaked = 0
    for _ in range(steps):
        leaked += leak_step(OBJECT_BYTES)
        churn(OBJECT_BYTES, spin)
    return leaked


def calibrate(seconds: float, steps: int = STEPS) -> Dict[str, Any]:
    per_ms = _harness.loops_per_ms()
    # The allocations' own time is small beside the spin at these sizes; measured anyway.
    t0 = time.perf_counter()
    for _ in range(2_000):
        for _ in range(CHURN + 1):
            bytes(OBJECT_BYTES)
    alloc_ms = (time.perf_counter() - t0) * 1000 / 2_000
    spin_ms = max(seconds * 1000 / steps - alloc_ms, 0.0)
    return {"steps": steps, "spin": int(per_ms * spin_ms)}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    t0 = time.perf_counter()
    leaked = run_leak(params["steps"], params["spin"])
    elapsed = time.perf_counter() - t0
    leaked += sys.getsizeof(_LEAKED)
    return {
        "leaked_bytes": leaked,
        "leak_bytes_per_s": leaked / elapsed,
        "work_function": "run_leak",
    }


if __name__ == "__main__":
    _harness.main(calibrate, work)
