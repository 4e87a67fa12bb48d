"""A frame that CPython has already freed while the thread still points at it.

The native sampler's signal handler walks its thread's frames wherever the thread is.  In
CPython 3.11 and 3.12, a function that makes a coroutine (or generator) pops its own frame
before unlinking it (RETURN_GENERATOR), and when that frame was the first of a 16 KiB stack
chunk the chunk is unmapped in between.  A signal that comes during that munmap is delivered
as it returns, so the handler found the thread's newest frame in unmapped memory and the
program died of SIGSEGV (the crash the busy asyncio test saw once under load; this program
crashed in each of 3 runs of 10 s).

The program makes coroutines at every stack depth up to 300 frames, so that some of them are
made right at a chunk boundary, sampled at 1,000 Hz with either CPU trigger.  It must not
crash, the samples that could not be read must be counted, and the CPU they stood for must
still be in the profile (charged to the thread's next sample).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from hotspan._speedups import load_sampler
from tests.agent.test_agent import CPU, TOTAL, run_program, service_profile

pytestmark = pytest.mark.skipif(load_sampler() is None, reason="the native sampler is not built")
# The interpreter that unmaps the chunk under the handler, where a sample must meet it.
NEEDS_WINDOW = sys.version_info[:2] == (3, 11)

PROGRAM = """
def thread_cpu():
    return time.thread_time()

async def nothing():
    pass

def make_coroutines():
    for _ in range(300):
        nothing().close()

def descend(depth):
    if depth == 0:
        return make_coroutines()
    return descend(depth - 1)

cpu_start = thread_cpu()
agent = hotspan.configure(application_name={service!r}, server_address={url!r},
                          upload_interval=60, sample_rate=1000, alloc_sample_bytes=0,
                          locks=False, threads=False)
stop = time.monotonic() + {seconds}
# Where the interpreter unmaps the chunk, on until a sample has met the window at least once
# (a loaded machine gives the program fewer rounds and fewer samples in the same time).
last = stop + ({seconds} * 3 if {needs_window} else 0)
rounds = 0
while time.monotonic() < stop or (
    time.monotonic() < last and agent.sampler_stats["unreadable_stacks"] == 0
):
    for depth in range(300):
        descend(depth)
    rounds += 1
cpu_stop = thread_cpu()
stats = agent.sampler_stats
hotspan.shutdown()
report(cpu=cpu_stop - cpu_start, rounds=rounds, stats=stats)
"""


@pytest.mark.parametrize("trigger", ["perf", "timer"])
def test_frames_popped_under_the_handler_do_not_crash(
    module_server, tmp_path: Path, trigger: str
) -> None:
    service = f"frames_{trigger}_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        PROGRAM.format(
            service=service, url=module_server.url, seconds=6, needs_window=NEEDS_WINDOW
        ),
        env={"HOTSPAN_CPU_TRIGGER": trigger},
        otel=False,
        timeout=120,
    )
    assert result["rounds"] > 0
    stats = result["stats"]
    if NEEDS_WINDOW:
        # This interpreter unmaps the chunk: the window was reached, and no sample read it.
        assert stats["unreadable_stacks"] > 0, stats

    with module_server.client() as client:
        totals = service_profile(client, f'{{service_name="{service}"}}', CPU)
    profiled = totals[TOTAL] / 1e9
    # What the unread samples stood for went to the next ones: the thread's CPU is all there.
    assert abs(profiled - result["cpu"]) <= 0.05 * result["cpu"], (profiled, result, stats)
    assert totals.get("__main__.descend", 0) >= 0.9 * totals[TOTAL], totals
