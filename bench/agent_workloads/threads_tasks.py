"""Known numbers of threads and pending asyncio tasks on known stacks, alive at every upload.

``threads`` daemon threads sleep in ``sleeper`` -> ``nap`` -> ``time.sleep``, and ``tasks``
asyncio tasks, on an event loop running in a thread of its own, wait in ``pending_task`` ->
``wait_for_signal`` -> ``asyncio.Event.wait``.  They are all started (each says so) before the
work section ends and never finish: they are still there when the profiler takes its last
threads profile at shutdown, and die with the process.  A threads profile should count
exactly ``threads`` stacks through ``sleeper`` and ``tasks`` through ``pending_task``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List

import _harness

THREADS = 50
TASKS = 200


def nap() -> None:
    time.sleep(3600)


def sleeper(started: threading.Semaphore) -> None:
    started.release()
    nap()


async def wait_for_signal(signal: asyncio.Event) -> None:
    await signal.wait()


async def pending_task(signal: asyncio.Event, started: List[int]) -> None:
    started[0] += 1
    await wait_for_signal(signal)


def run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


_KEEP: List[Any] = []  # the loop, its tasks and the signal, alive until the process exits


def start_all(threads: int, tasks: int) -> Dict[str, int]:
    started = threading.Semaphore(0)
    for k in range(threads):
        threading.Thread(target=sleeper, args=(started,), name=f"sleeper-{k}", daemon=True).start()
    for _ in range(threads):
        started.acquire()

    loop = asyncio.new_event_loop()
    threading.Thread(target=run_loop, args=(loop,), name="event-loop", daemon=True).start()
    counter = [0]

    async def create() -> List[asyncio.Task[None]]:
        signal = asyncio.Event()
        _KEEP.append(signal)
        return [asyncio.ensure_future(pending_task(signal, counter)) for _ in range(tasks)]

    _KEEP.extend([loop, asyncio.run_coroutine_threadsafe(create(), loop).result(10)])
    while counter[0] < tasks:  # every task has run up to its await
        time.sleep(0.01)
    return {"threads": threads, "tasks": tasks}


def calibrate(seconds: float, threads: int = THREADS, tasks: int = TASKS) -> Dict[str, Any]:
    return {"seconds": seconds, "threads": threads, "tasks": tasks}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    truth = start_all(params["threads"], params["tasks"])
    time.sleep(params["seconds"])
    return {
        "sleeping_threads": truth["threads"],
        "pending_tasks": truth["tasks"],
        "work_function": "start_all",
    }


if __name__ == "__main__":
    _harness.main(calibrate, work)
