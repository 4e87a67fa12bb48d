"""The threads-and-tasks profile (``goroutines:goroutine:count``): a real program with 7 threads
parked in a known function and 13 asyncio tasks suspended in ``outer -> inner ->
asyncio.sleep``, some in OpenTelemetry SDK spans, runs the real agent against a real server;
what the query API gives back must be those counts exactly, per snapshot.

Each upload is a snapshot and the server sums them over the queried range, so the program
holds its state still over a window it reports, and the main thread waits in ``main_wait``
the whole window: it stands there exactly once per snapshot, which makes its count the number
of snapshots the window holds.  Every other count must be that number times its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import httpx

from hotspan._speedups import load_sampler
from hotspan.agent import context
from hotspan.agent.collectors import THREAD_PERIOD_TYPE, THREAD_TYPES
from hotspan.agent.collectors import threads as threads_module
from hotspan.agent.collectors.threads import TASK_ROOT, TASKS_NOT_WALKED, make_collector
from hotspan.agent.config import AgentConfig
from hotspan.agent.symbols import Symbolizer
from tests.helpers import CPU, QUERIER, flamegraph, function_totals

GOROUTINES = "goroutines:goroutine:count:goroutine:count"
WALL = "wall:wall:nanoseconds:wall:nanoseconds"
THREADS, SPAN_THREADS, TASKS, SPAN_TASKS = 7, 2, 13, 5

PROGRAM = """
import asyncio, json, sys, threading, time
import hotspan
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

server, service, native = sys.argv[1], sys.argv[2], sys.argv[3] == "native"
trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("test")
agent = hotspan.configure(
    application_name=service, server_address=server, upload_interval=1,
    alloc_sample_bytes=0, locks=False, native=native,
)
THREADS, SPAN_THREADS, TASKS, SPAN_TASKS = {counts}
stop = threading.Event()
parked = threading.Barrier(THREADS + 1)
ids = {{"threads": [], "tasks": None}}

def span_hex(span):
    return format(span.get_span_context().span_id, "016x")

def park():
    parked.wait()
    stop.wait()

def worker(i):
    if i < SPAN_THREADS:
        with tracer.start_as_current_span("wait") as span:
            ids["threads"].append(span_hex(span))
            park()
    else:
        park()

async def inner():
    await asyncio.sleep(30)

async def outer():
    await inner()

loop_ready = threading.Event()
holder = {{}}

async def loop_main():
    holder["loop"], holder["done"] = asyncio.get_running_loop(), asyncio.Event()
    with tracer.start_as_current_span("batch") as span:
        ids["tasks"] = span_hex(span)
        tasks = [asyncio.ensure_future(outer()) for _ in range(SPAN_TASKS)]
    tasks += [asyncio.ensure_future(outer()) for _ in range(TASKS - SPAN_TASKS)]
    await asyncio.sleep(0.05)  # every task reaches its sleep
    loop_ready.set()
    await holder["done"].wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

def main_wait(seconds):
    time.sleep(seconds)

workers = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
for t in workers:
    t.start()
loop_thread = threading.Thread(target=asyncio.run, args=(loop_main(),))
loop_thread.start()
parked.wait()
loop_ready.wait()
time.sleep(0.3)  # the workers pass the barrier into stop.wait()
start = time.time()
main_wait(3.5)
end = time.time()
stop.set()
holder["loop"].call_soon_threadsafe(holder["done"].set)
for t in workers + [loop_thread]:
    t.join()
collectors = agent.collectors
hotspan.shutdown()
print("RESULT " + json.dumps({{
    "start": start, "end": end, "ids": ids,
    "sampler": agent.sampler_name, "collectors": collectors,
}}), flush=True)
"""


def _run(
    server_url: str, tmp_path: Path, variants: List[str], source: Optional[str] = None
) -> Dict[str, Tuple[str, dict]]:
    path = tmp_path / "threads_program.py"
    if source is None:
        source = PROGRAM.format(counts=(THREADS, SPAN_THREADS, TASKS, SPAN_TASKS))
    path.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "OTEL_"))}
    services = {v: f"threads_{v}_{uuid.uuid4().hex[:6]}" for v in variants}
    procs = {
        v: subprocess.Popen(
            [sys.executable, str(path), server_url, services[v], v],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for v in variants
    }
    out: Dict[str, Tuple[str, dict]] = {}
    for variant, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        assert lines, stdout + stderr
        out[variant] = (services[variant], json.loads(lines[0][len("RESULT ") :]))
    return out


def _query(
    client: httpx.Client, service: str, result: dict, span_ids: Any = None
) -> Dict[str, int]:
    """Per function: the threads and tasks on stacks through it, summed over the snapshots
    taken in the program's still window (milliseconds, so no snapshot outside it counts)."""
    body = {
        "profileTypeID": GOROUTINES,
        "labelSelector": f'{{service_name="{service}"}}',
        "start": int(result["start"] * 1000) + 1,
        "end": int(result["end"] * 1000),
    }
    method = "SelectMergeStacktraces"
    if span_ids is not None:
        method = "SelectMergeSpanProfile"
        body["spanSelector"] = span_ids
    r = client.post(f"{QUERIER}/{method}", json=body)
    assert r.status_code == 200, r.text
    graph = r.json().get("flamegraph", {})
    out = function_totals(graph)
    out["<total>"] = int(graph.get("total", 0) or 0)
    return out


VARIANTS = ["native", "python"] if load_sampler() is not None else ["python"]


def test_threads_and_tasks_counted_exactly(module_server, tmp_path: Path) -> None:
    results = _run(module_server.url, tmp_path, VARIANTS)
    with module_server.client() as client:
        for variant, (service, result) in results.items():
            assert result["collectors"].get("threads") == "python", result
            assert result["sampler"] == variant, result
            got = _query(client, service, result)
            snapshots = got.get("__main__.main_wait", 0)
            # 3.5 s still, one snapshot a second.
            assert snapshots >= 2, (variant, got)
            where = (variant, snapshots, got)
            assert got["__main__.park"] == THREADS * snapshots, where
            assert got["__main__.worker"] == THREADS * snapshots, where
            assert got["__main__.inner"] == TASKS * snapshots, where
            assert got["__main__.outer"] == TASKS * snapshots, where
            assert got["__main__.loop_main"] == snapshots, where  # the main task
            assert got[TASK_ROOT[0]] == (TASKS + 1) * snapshots, where
            # The main thread, the workers and the loop's thread; the tasks; nothing of the
            # agent's own threads (a thread more would break the total).
            assert got["<total>"] == (1 + THREADS + 1 + TASKS + 1) * snapshots, where
            agent_code = (
                "hotspan.agent.core",
                "hotspan.agent.outbox",
                "hotspan.agent.uploader",
                "hotspan.agent.collectors",
            )
            assert not [name for name in got if name.startswith(agent_code)], where

            in_batch = _query(client, service, result, [result["ids"]["tasks"]])
            assert in_batch["__main__.inner"] == SPAN_TASKS * snapshots, (variant, in_batch)
            assert in_batch["<total>"] == SPAN_TASKS * snapshots, (variant, in_batch)
            waiting = _query(client, service, result, result["ids"]["threads"])
            assert waiting["__main__.park"] == SPAN_THREADS * snapshots, (variant, waiting)
            assert waiting["<total>"] == SPAN_THREADS * snapshots, (variant, waiting)


SHORT_PROGRAM = """
import json, sys, threading, time
import hotspan

server, service, native = sys.argv[1], sys.argv[2], sys.argv[3] == "native"
agent = hotspan.configure(
    application_name=service, server_address=server, upload_interval=10,
    alloc_sample_bytes=0, locks=False, native=native,
)
started = threading.Barrier(3)

def work(seconds):
    started.wait()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)
        sum(range(20000))

start = time.time()
workers = [threading.Thread(target=work, args=(1.5,)) for _ in range(2)]
for t in workers:
    t.start()
started.wait()
time.sleep(0.5)
print("RESULT " + json.dumps({
    "start": start, "sampler": agent.sampler_name, "collectors": agent.collectors,
}), flush=True)
# The main thread ends with its workers still working: the interpreter joins them, then the
# agent shuts down.
"""


def test_a_program_shorter_than_an_upload_interval_sends_its_threads(
    module_server, tmp_path: Path
) -> None:
    """A program of 2 s with an upload interval of 10 s never reaches its first upload: all
    it sends, it sends at exit, and by the agent's shutdown the interpreter has joined its
    threads.  Its threads profile is the look taken as its main thread finished: the two
    workers, nothing of the main thread (done) or of the agent's threads.  And no stack of
    it holds a frame of the agent's."""
    results = _run(module_server.url, tmp_path, VARIANTS, SHORT_PROGRAM)
    with module_server.client() as client:
        for variant, (service, result) in results.items():
            assert result["collectors"].get("threads") == "python", result
            assert result["sampler"] == variant, result
            window = {"start": result["start"] - 1, "end": time.time() + 1}
            got = _query(client, service, window)
            assert got.get("__main__.work") == 2, (variant, got)
            assert got["<total>"] == 2, (variant, got)
            profiles = {GOROUTINES: got}
            if variant == "native":
                # Its thread hook wraps every thread's bootstrap: the frame left out here.
                for profile_type in (CPU, WALL):
                    profiles[profile_type] = function_totals(
                        flamegraph(
                            client,
                            f'{{service_name="{service}"}}',
                            int(window["start"]),
                            int(window["end"]) + 1,
                            profile_type,
                        )
                    )
                assert profiles[CPU].get("__main__.work", 0) > 0, (variant, profiles)
                assert profiles[WALL].get("__main__.work", 0) > 0, (variant, profiles)
            for profile_type, totals in profiles.items():
                agent = [name for name in totals if name.startswith("hotspan.")]
                assert not agent, (variant, profile_type, agent)


# ------------------------------------------------------------------ in process


@contextlib.contextmanager
def running_loop(main: Any) -> Iterator[Dict[str, Any]]:
    """``main(state)`` runs as the main task of a loop in its own thread; the block runs once
    it set ``state["ready"]``, and the loop is stopped after it."""
    state: Dict[str, Any] = {"ready": threading.Event()}

    async def runner() -> None:
        state["stop"] = asyncio.Event()
        task = asyncio.ensure_future(main(state))
        await state["stop"].wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    thread = threading.Thread(target=asyncio.run, args=(runner(),), name="test-loop")
    thread.start()
    try:
        assert state["ready"].wait(10)
        yield state
    finally:
        loop = state.get("loop")
        if loop is not None:
            loop.call_soon_threadsafe(state["stop"].set)
        thread.join(10)


def _named(samples: Any) -> List[Tuple[List[str], Tuple[int, ...], int]]:
    symbols = Symbolizer()
    return [
        (
            [e[0] if len(e) == 4 else symbols.frame(e[0], e[1])[0] for e in s.stack],
            s.labels,
            s.values[0],
        )
        for s in samples
    ]


async def _sleeper() -> None:
    await asyncio.sleep(30)


async def _chain_inner() -> None:
    await _sleeper()


async def _gen() -> Any:
    await asyncio.sleep(30)
    yield 1


async def _consumer() -> None:
    async for _ in _gen():
        pass


def test_make_collector_follows_config() -> None:
    assert make_collector(AgentConfig(application_name="x", threads=False)) is None
    collector = make_collector(AgentConfig(application_name="x", max_depth=3))
    assert collector is not None
    assert (collector.name, collector.implementation) == ("threads", "python")
    assert collector.collect() == []  # not started
    collector.start()
    profile = collector.collect()[0]
    assert (profile.sample_types, profile.period_type, profile.period) == (
        THREAD_TYPES,
        THREAD_PERIOD_TYPE,
        1,
    )
    assert profile.end_ns - profile.start_ns == 1_000_000_000
    assert all(len(s.stack) <= 3 for s in profile.samples)
    assert len(collector.collect(final=True)) == 1  # the only one of a short program
    collector.stop()
    assert collector.collect() == []


def test_task_stacks_labels_and_running_task() -> None:
    """Task chains through coroutines and async generators, a task's span labels from its
    context, and a task running at the snapshot counted on its thread only."""
    release = threading.Event()
    blocked = threading.Event()

    async def runs_now() -> None:
        blocked.set()
        release.wait(10)  # holds its loop's thread inside this task's step

    async def main(state: Dict[str, Any]) -> None:
        state["loop"] = asyncio.get_running_loop()
        context.LABELS.set(context.Labels(11, 1, 2, 11, 0))
        labelled = [asyncio.ensure_future(_chain_inner()) for _ in range(3)]
        context.LABELS.set(None)
        plain = [asyncio.ensure_future(_consumer()) for _ in range(2)]
        await asyncio.sleep(0.05)
        state["ready"].set()
        await asyncio.sleep(0.2)
        running = asyncio.ensure_future(runs_now())
        await asyncio.gather(running, *labelled, *plain)

    collector = threads_module.ThreadsCollector(64)
    collector.start()
    with running_loop(main):
        rows = _named(collector.snapshot().samples)
        chain = [r for r in rows if "tests.agent.test_threads._chain_inner" in r[0]]
        assert [(r[0][:4], r[1], r[2]) for r in chain] == [
            (
                [
                    "asyncio.tasks.sleep",
                    "tests.agent.test_threads._sleeper",
                    "tests.agent.test_threads._chain_inner",
                    TASK_ROOT[0],
                ],
                (11, 1, 2, 11, 0),
                3,
            )
        ]
        consumers = [r for r in rows if "tests.agent.test_threads._consumer" in r[0]]
        assert [(r[0][:3], r[2]) for r in consumers] == [
            (
                [
                    "asyncio.tasks.sleep",
                    "tests.agent.test_threads._gen",
                    "tests.agent.test_threads._consumer",
                ],
                2,
            )
        ]
        assert blocked.wait(10)
        try:
            rows = _named(collector.snapshot().samples)
        finally:
            release.set()
        running = [r for r in rows if any(name.endswith(".runs_now") for name in r[0])]
        # One stack, the loop thread's: no task stack for it while it runs.
        assert len(running) == 1 and running[0][2] == 1, running
        assert TASK_ROOT[0] not in running[0][0]
        assert running[0][0][-1] != TASK_ROOT[0]


def test_tasks_beyond_the_bound_are_counted() -> None:
    async def main(state: Dict[str, Any]) -> None:
        state["loop"] = asyncio.get_running_loop()
        tasks = [asyncio.ensure_future(_sleeper()) for _ in range(25)]
        await asyncio.sleep(0.05)
        # Ready once this task waits in gather (the callback runs at the loop's next turn):
        # set here, a free-threaded build can take the snapshot while this task still runs,
        # and a running task is counted on its thread's stack, not as a pending one.
        state["loop"].call_soon(state["ready"].set)
        await asyncio.gather(*tasks)

    collector = threads_module.ThreadsCollector(64, max_tasks=10)
    collector.start()
    collector.snapshot()
    before = collector.stats()["tasks"]  # pending in loops other tests left behind, if any
    with running_loop(main):
        profile = collector.snapshot()
    stats = collector.stats()
    # 25 sleepers, main and the loop's runner.
    assert stats["tasks"] == before + 27, stats
    assert stats["tasks_not_walked"] == before + 17, stats
    not_walked = [s for s in profile.samples if s.stack[0] == TASKS_NOT_WALKED]
    assert [s.values for s in not_walked] == [(before + 17,)]
    walked = sum(s.values[0] for s in profile.samples if s.stack[-1] == TASK_ROOT)
    assert walked == before + 27  # the ten walked and the rest counted


def test_loops_found_on_thread_stacks() -> None:
    """3.14 keeps C tasks in per-thread lists readable one loop at a time; the loops come from
    the threads' stacks (``run_forever``, ``asyncio.Runner``)."""

    async def main(state: Dict[str, Any]) -> None:
        state["loop"] = asyncio.get_running_loop()
        state["ready"].set()
        await asyncio.sleep(30)

    with running_loop(main) as state:
        loops = threads_module._find_loops(sys._current_frames(), [])
        assert state["loop"] in loops


BATCH_JOB = """
import sys, threading, time
import hotspan

server, service = sys.argv[1], sys.argv[2]
hotspan.configure(application_name=service, server_address=server, upload_interval=60)

def crunch(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))

workers = [threading.Thread(target=crunch, args=(1.6,)) for _ in range(3)]
for w in workers:
    w.start()
crunch(1.6)
for w in workers:
    w.join()
print(time.time())
"""


def test_short_batch_job_sends_its_threads(module_server, tmp_path: Path) -> None:
    """A program that ends before its first upload, its threads joined before it exits: the
    threads profile still arrives, from the window's early look at the threads at work (at its
    end only the main thread was left, shutting down)."""
    service = f"batch_{uuid.uuid4().hex[:6]}"
    script = tmp_path / "batch.py"
    script.write_text(BATCH_JOB)
    started = time.time()
    out = subprocess.run(
        [sys.executable, str(script), module_server.url, service],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    ended = float(out.stdout.strip().splitlines()[-1]) + 5
    body = {
        "profileTypeID": GOROUTINES,
        "labelSelector": f'{{service_name="{service}"}}',
        "start": int(started * 1000),
        "end": int(ended * 1000),
    }
    with module_server.client() as client:
        r = client.post(f"{QUERIER}/SelectMergeStacktraces", json=body)
    assert r.status_code == 200, r.text
    got = function_totals(r.json().get("flamegraph", {}))
    # One look: the three workers and the main thread, each inside crunch.
    assert got.get("__main__.crunch") == 4, got
