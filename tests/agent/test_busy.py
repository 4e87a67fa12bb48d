"""The agent on busy programs, where a sampler that needs the GIL starves: a CPU-bound
coroutine yielding with ``await asyncio.sleep(0)`` and a loop of socket ``send``/``recv``
between Python calls here, and a Starlette app under uvicorn taking requests as fast as a
client in another process sends them in test_busy_server.py.  Each runs 3 s (the loops) or
6 s (the server) of work, five times, profiled at 100 Hz, pushing to a real server; each run
must store the CPU its threads really used (within 5%), wall time for the busy thread at the
sample rate (within 5%), and the right span labels.

A profile covers the sampler's life (from inside ``configure`` to ``shutdown``), so each
program measures the CPU of the threads the agent samples (all but its own
``hotspan-sampler`` and ``hotspan-uploader``) over that, from their CPU clocks, from the
moment ``configure`` returns to the moment before ``shutdown``.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Dict

import pytest

from hotspan._speedups import load_sampler
from tests.agent.test_agent import TOTAL, WALL, run_program, span_profile, totals
from tests.helpers import flamegraph

REPETITIONS = 5
# The loops' runs: a sample is weighted by the CPU or wall time it stands for, so the totals
# checked are exact to a period or two whatever the length; 3 s is 300 samples a run (in ten
# runs the CPU and wall totals were within 0.7% and the span's CPU within 2.5%).
LOOP_SECONDS = 3
TOLERANCE = 0.05

native_only = pytest.mark.skipif(
    load_sampler() is None,
    reason="the native sampler is not built: the pure-Python fallback needs the GIL to "
    "sample and promises less on busy programs (docs/agent.md)",
)

# Shared by the programs: the unit of pure-Python work, and the CPU of the sampled threads.
BUSY_PRELUDE = """
import asyncio, socket, threading, time
from opentelemetry import trace

def spin(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x

def sampled_cpu():
    total = 0.0
    for t in threading.enumerate():
        if t.name in ("hotspan-sampler", "hotspan-uploader"):
            continue  # the agent's own threads are not sampled
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, OverflowError):
            pass
    return total

# Context switches of the agent's own threads so far, by thread, [voluntary, involuntary]: a
# voluntary one is a wake-up, and a thread that waits for the GIL beside a busy loop is woken
# at every drop of it, the program paying a futex wake each time; an involuntary one is the
# machine's load (a preemption), not the agent's doing.
AGENT_THREADS = ("hotspan-sampler", "hotspan-uploader")

def agent_switches():
    out = {}
    for t in threading.enumerate():
        if t.name in AGENT_THREADS:
            try:
                with open(f"/proc/self/task/{t.native_id}/status") as f:
                    counts = dict(line.split(":") for line in f if "ctxt_switches" in line)
            except OSError:
                continue
            out[t.name] = [int(counts["voluntary_ctxt_switches"]),
                           int(counts["nonvoluntary_ctxt_switches"])]
    return out

def switches_since(before):
    return {name: [now[0] - before.get(name, [0, 0])[0], now[1] - before.get(name, [0, 0])[1]]
            for name, now in agent_switches().items()}

# When the switches happened, should there be too many: every quarter of a second the
# agent's wake-ups so far and its turns at the GIL (granted, withdrawn, overrun).
timeline = []
next_note = 0.0

def note(now):
    global next_note
    if now >= next_note:
        next_note = now + 0.25
        turns = native.turns() if native is not None else {}
        woken = sum(v for v, _ in switches_since(switches).values())
        timeline.append((round(now - t_start, 2), woken, *turns.values()))

tracer = trace.get_tracer("busy")

# What became of the agent's turns at the GIL (granted, withdrawn, overrun): the switches'
# likeliest cause when there are too many.
from hotspan._speedups import load_sampler
native = load_sampler()
"""


def agent_line(url: str, service: str, native: bool = True, max_overhead: float = 1.0) -> str:
    # One window (upload_interval > the run): the exit flush sends all of it.  The clocks are
    # read once configure() has returned, with the sampler running: what is compared is what
    # the sampler saw against what the threads did meanwhile, not configure's own imports.
    return (
        f"agent = hotspan.configure(application_name={service!r}, server_address={url!r}, "
        f"upload_interval=60, sample_rate=100, thread_name_label=True, native={native!r}, "
        f"max_overhead={max_overhead!r})\n"
        f"t_start = time.monotonic(); cpu_start = sampled_cpu(); switches = agent_switches()\n"
    )


FINISH = """
t_stop = time.monotonic(); cpu_stop = sampled_cpu(); switches = switches_since(switches)
turns = native.turns() if native is not None else None
hotspan.shutdown()
report(cpu=cpu_stop - cpu_start, elapsed=t_stop - t_start,
       agent_switches=sum(v for v, _ in switches.values()), switches_by_thread=switches,
       turns=turns, timeline=timeline,
       through_shutdown=time.monotonic() - t_start, stats=agent.sampler_stats, **result)
"""

ASYNCIO_YIELD = """
async def busy_loop(seconds):
    with tracer.start_as_current_span("busy-loop") as span:
        inside = time.thread_time()
        end = time.monotonic() + seconds
        while (now := time.monotonic()) < end:
            note(now)
            spin(3000)  # ~0.5 ms
            await asyncio.sleep(0)
        return span_hex(span), time.thread_time() - inside

span_id, in_span = asyncio.run(busy_loop({seconds}))
result = dict(span_id=span_id, in_span=in_span)
"""

SOCKET_PINGPONG = """
a, b = socket.socketpair()
with tracer.start_as_current_span("ping-pong") as span:
    inside = time.thread_time()
    end = time.monotonic() + {seconds}
    while (now := time.monotonic()) < end:
        note(now)
        spin(300)  # ~50 us of Python between short system calls
        a.send(b"ping" * 16)
        b.recv(64)
        b.send(b"pong" * 16)
        a.recv(64)
    in_span = time.thread_time() - inside
result = dict(span_id=span_hex(span), in_span=in_span)
"""


def busy_profile(server, service: str) -> Dict[str, int]:  # type: ignore[no-untyped-def]
    now = int(time.time())
    with server.client() as client:
        return totals(flamegraph(client, f'{{service_name="{service}"}}', now - 600, now + 60))


def main_wall(server, service: str) -> float:  # type: ignore[no-untyped-def]
    now = int(time.time())
    selector = f'{{service_name="{service}", thread_name="MainThread"}}'
    with server.client() as client:
        graph = flamegraph(client, selector, now - 600, now + 60, profile_type=WALL)
    return int(graph.get("total", 0) or 0) / 1e9


def check_run(server, service: str, result: dict, run: int) -> None:  # type: ignore[no-untyped-def]
    """Profiled CPU against real CPU, the main thread's wall against elapsed time."""
    profiled = busy_profile(server, service)[TOTAL] / 1e9
    real = result["cpu"]
    assert abs(profiled / real - 1) <= TOLERANCE, (
        f"run {run}: CPU profiled {profiled:.3f} s, real {real:.3f} s "
        f"({profiled / real:.3f}); sampler {result['stats']}"
    )
    # The sampler stops inside shutdown, after the agent's thread has finished its last
    # round: on a crowded machine that can take a few hundred milliseconds, all of it the main
    # thread's wall time, in shutdown.
    wall = main_wall(server, service)
    elapsed, through_shutdown = result["elapsed"], result["through_shutdown"]
    assert elapsed * (1 - TOLERANCE) <= wall <= through_shutdown * (1 + TOLERANCE), (
        f"run {run}: main thread wall profiled {wall:.3f} s over {elapsed:.3f} s "
        f"({through_shutdown:.3f} s through shutdown: {wall / elapsed:.3f}); "
        f"sampler {result['stats']}"
    )


def check_agent_threads(result: dict, run: int) -> None:
    """The agent's threads wake a few times a second (its loop once a second, ten times in
    the first two; the uploader for an upload or a poll) and take the GIL back by a turn the
    main thread hands over, a handful of switches each: not thousands a second in the GIL's
    queue, as beside the asyncio loop before turns (4,500 a second).  Wake-ups: the
    voluntary switches (a preemption is the machine's load)."""
    per_second = result["agent_switches"] / result["elapsed"]
    assert per_second <= 100, (
        f"run {run}: the agent's threads were woken {result['agent_switches']} times in "
        f"{result['elapsed']:.1f} s; by thread [voluntary, involuntary] "
        f"{result['switches_by_thread']}; turns {result['turns']} (before shutdown); "
        f"(s, wake-ups, granted, withdrawn, overrun) {result['timeline']}"
    )


def check_span(server, service: str, result: dict, run: int, task: str = "") -> None:  # type: ignore[no-untyped-def]
    """CPU under the span against CPU spent in it.  In a task (``task`` names its coroutine),
    the event loop's own work between the task's steps runs outside the task's context, so
    outside the span: there, what runs inside the coroutine must all be under the span."""
    with server.client() as client:
        in_span = span_profile(client, service, [result["span_id"]])[TOTAL] / 1e9
    if not task:
        assert abs(in_span / result["in_span"] - 1) <= TOLERANCE, (
            f"run {run}: CPU under the span {in_span:.3f} s, spent in it {result['in_span']:.3f} s"
        )
        return
    in_task = busy_profile(server, service).get(task, 0) / 1e9
    assert abs(in_span / in_task - 1) <= TOLERANCE, (
        f"run {run}: CPU under the span {in_span:.3f} s, in {task} {in_task:.3f} s"
    )
    assert 0.8 <= in_span / result["in_span"] <= 1 + TOLERANCE, (
        f"run {run}: CPU under the span {in_span:.3f} s, "
        f"the thread's CPU while it was open {result['in_span']:.3f} s"
    )


# (program, the coroutine its span is current in, or "" for a plain thread)
LOOPS = {
    "asyncio": (ASYNCIO_YIELD, "__main__.busy_loop"),
    "socket": (SOCKET_PINGPONG, ""),
}


@native_only
@pytest.mark.parametrize("run", range(REPETITIONS))
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_busy_loop(module_server, tmp_path: Path, loop: str, run: int) -> None:
    program, task = LOOPS[loop]
    service = f"busy_{loop}_{uuid.uuid4().hex[:6]}"
    body = (
        BUSY_PRELUDE
        + agent_line(module_server.url, service)
        + program.format(seconds=LOOP_SECONDS)
        + FINISH
    )
    result = run_program(tmp_path, body, timeout=120)
    check_run(module_server, service, result, run)
    check_agent_threads(result, run)
    check_span(module_server, service, result, run, task=task)


def test_busy_asyncio_loop_python_fallback(module_server, tmp_path: Path) -> None:
    """The pure-Python sampler needs the GIL to tick, so it ticks from a SIGPROF handler on
    the busy main thread too; its totals come from the threads' CPU clocks and the time that
    passed, so they hold however late a tick is (its stacks are the coarser part: docs/agent.md)."""
    service = f"busy_async_py_{uuid.uuid4().hex[:6]}"
    body = (
        BUSY_PRELUDE
        # Beside a busy loop the fallback costs a little over 1% of the process (ticks, in its
        # thread's turns at the GIL and in the handler), over the 1% budget: the governor
        # would halve the rate (a new sampler) mid-run, and the ticks counted here are at one
        # rate (the budget: test_governor.py).
        + agent_line(module_server.url, service, native=False, max_overhead=100.0)
        + ASYNCIO_YIELD.format(seconds=LOOP_SECONDS)
        + FINISH
    )
    result = run_program(tmp_path, body, timeout=120)
    # The handler ticks every 10 ms of the process's CPU: on a loaded machine the program gets
    # less than the run's wall time of CPU, and the ticks are counted against what it got.
    assert result["stats"]["ticks"] >= result["cpu"] * 100 * 0.9, (result["stats"], result)
    check_run(module_server, service, result, 0)
