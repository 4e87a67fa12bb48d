"""A busy event loop: one CPU-bound coroutine that yields between calls.

``crunch`` calls ``_harness.spin`` (~1 ms of pure Python) in a loop with
``await asyncio.sleep(0)`` after every call, inside one OpenTelemetry SDK span (a batch job's
or a request's span).  The loop never sleeps: each ``sleep(0)`` only goes round the event
loop, whose ``select`` with a zero timeout lets the GIL go for a moment and takes it back.  A
Python thread waiting for the GIL (a sampler thread) is starved by exactly this: the main
thread gives the GIL up every millisecond, so the waiting thread's 5 ms switch request is
never made, yet the waiter rarely wins the moment the GIL is free.

Variants (``--params``, for ``bench/agent_starvation.py``): ``call_ms`` (length of one
call), ``sleep_s`` (what the coroutine awaits: 0.0001 s makes the loop really sleep),
``span`` (False: no OpenTelemetry at all).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Dict

import _harness

CALL_MS = 1.0


async def crunch(calls: int, n: int, sleep_s: float, span: bool) -> int:
    x = 0
    # A span around the whole loop, as a traced request or batch job has: the agent's span
    # linking then runs on every task step.
    scope = (
        _harness.otel_tracer().start_as_current_span("crunch") if span else contextlib.nullcontext()
    )
    with scope:
        for _ in range(calls):
            x ^= _harness.spin(n)
            await asyncio.sleep(sleep_s)
    return x


def run_yield(calls: int, n: int, sleep_s: float, span: bool) -> int:
    return asyncio.run(crunch(calls, n, sleep_s, span))


def calibrate(
    seconds: float, call_ms: float = CALL_MS, sleep_s: float = 0.0, span: bool = True
) -> Dict[str, Any]:
    n = max(1, int(_harness.loops_per_ms() * call_ms))
    # ~0.3 s trials: long enough to include the loop's own cost per await.
    trial = max(10, int(300 / (call_ms + 0.05)))
    calls = _harness.scale_to(seconds, trial, lambda k: run_yield(k, n, sleep_s, span))
    return {"calls": calls, "n": n, "call_ms": call_ms, "sleep_s": sleep_s, "span": span}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    run_yield(params["calls"], params["n"], params["sleep_s"], params["span"])
    return {"calls": params["calls"], "work_function": "run_yield"}


if __name__ == "__main__":
    _harness.main(calibrate, work)
