"""Two threads contending on one ``threading.Lock`` that is held 5 ms of every 10 ms.

``holder`` loops: acquire, hold 5 ms, release, 5 ms away.  ``waiter`` loops: acquire, hold
0.1 ms, release, then away for a seeded random 0-10 ms, so that it comes back at every phase
of the holder's cycle (two threads with fixed periods settle into taking turns and stop
contending) and waits ~2.5 ms on average when the lock is held.  Holding and being away are
``time.sleep``: the GIL is free, so a wait is for the lock alone.  Each thread times its own
``acquire`` calls with ``perf_counter_ns``; the sum of both is what a lock profile's total
``delay`` should be.  The main thread waits for the two by polling ``is_alive`` (a ``join``
would itself wait on a lock for the whole run).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Dict, List

import _harness

HOLD_S = 0.005
AWAY_S = 0.005
WAITER_HOLD_S = 0.0001


def timed_acquire(lock: threading.Lock) -> int:
    t0 = time.perf_counter_ns()
    lock.acquire()
    return time.perf_counter_ns() - t0


def holder(lock: threading.Lock, until: float, out: List[int]) -> None:
    waited = n = 0
    while time.perf_counter() < until:
        waited += timed_acquire(lock)
        try:
            time.sleep(HOLD_S)
        finally:
            lock.release()
        n += 1
        time.sleep(AWAY_S)
    out[0], out[1] = waited, n


def waiter(lock: threading.Lock, until: float, seed: int, out: List[int]) -> None:
    rng = random.Random(seed)
    waited = n = 0
    while time.perf_counter() < until:
        waited += timed_acquire(lock)
        try:
            time.sleep(WAITER_HOLD_S)
        finally:
            lock.release()
        n += 1
        time.sleep(rng.uniform(0, HOLD_S + AWAY_S))
    out[2], out[3] = waited, n


def run_contention(seconds: float, seed: int) -> List[int]:
    lock = threading.Lock()
    out = [0] * 4
    until = time.perf_counter() + seconds
    threads = [
        threading.Thread(target=holder, args=(lock, until, out), name="holder"),
        threading.Thread(target=waiter, args=(lock, until, seed, out), name="waiter"),
    ]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(0.02)
    return out


def calibrate(seconds: float) -> Dict[str, Any]:
    return {"seconds": seconds, "seed": 1}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    out = run_contention(params["seconds"], params["seed"])
    return {
        "lock_wait_ns": out[0] + out[2],
        "holder_wait_ns": out[0],
        "waiter_wait_ns": out[2],
        "lock_acquires": out[1] + out[3],
        "work_function": "timed_acquire",
    }


if __name__ == "__main__":
    _harness.main(calibrate, work)
