"""Staying within budget: the governor's decisions on measured readings, and a real program
whose CPU hog drives its agent's rate down (and sheds it), then back up when the hog stops."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import httpx

from hotspan.agent.governor import Governor, Meter, Reading, agent_threads, usable_cpus
from tests.helpers import TLS, flamegraph, free_port

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


def reading(cpu: float = 10, mem: float = 10, overhead: float = 0.1) -> Reading:
    return Reading(cpu, mem, overhead, process_cpu_s=0.5, wall_s=1.0)


def test_rate_halves_under_cpu_load_down_to_the_floor_and_comes_back() -> None:
    gov = Governor(
        cpu_threshold=80, mem_threshold=90, load_shedding_cpu=0, max_overhead=1, min_rate=10
    )
    rates = [gov.decide(100, reading(cpu=85))[0] for _ in range(5)]
    assert rates == [50, 25, 12, 10, 10] and gov.reason == "cpu"
    # At the threshold's edge (within the hysteresis) the rate stays where it is.
    assert gov.decide(100, reading(cpu=75)) == (10, False)
    rates = [gov.decide(100, reading(cpu=30))[0] for _ in range(5)]
    assert rates == [20, 40, 80, 100, 100] and gov.reason == ""


def test_memory_and_budget_lower_the_rate_too() -> None:
    gov = Governor(80, 90, 0, 1.0, 10)
    assert gov.decide(100, reading(mem=95)) == (50, False) and gov.reason == "memory"
    gov = Governor(80, 90, 0, 1.0, 10)
    assert gov.decide(100, reading(overhead=2.5)) == (50, False) and gov.reason == "budget"
    # Within budget but above half of it: no doubling yet (it would go over again).
    assert gov.decide(100, reading(overhead=0.7)) == (50, False)
    assert gov.decide(100, reading(overhead=0.3)) == (100, False)
    # An idle process: the agent's share of almost nothing is not judged.
    gov = Governor(80, 90, 0, 1.0, 10)
    idle = Reading(0.5, 10, 40.0, process_cpu_s=0.002, wall_s=1.0)
    assert gov.decide(100, idle) == (100, False)


def test_a_budget_halving_that_does_not_help_is_undone() -> None:
    """The agent's cost that is not the sampling's (threads woken by a busy event loop's
    GIL switches) does not fall with the rate: the rate goes back and the rule rests."""
    gov = Governor(80, 90, 0, 1.0, 10)
    assert gov.decide(100, reading(overhead=6.0)) == (50, False) and gov.reason == "budget"
    assert gov.decide(100, reading(overhead=5.8)) == (100, False)
    assert gov.reason == "" and gov.futile
    assert gov.decide(100, reading(overhead=6.0)) == (100, False)  # resting
    # One that helps stays, and goes on until within budget.
    gov = Governor(80, 90, 0, 1.0, 10)
    assert gov.decide(100, reading(overhead=3.0))[0] == 50
    assert gov.decide(100, reading(overhead=1.6))[0] == 25
    assert gov.decide(100, reading(overhead=0.8)) == (25, False) and not gov.futile


def test_shedding_holds_until_load_falls_below_the_hysteresis() -> None:
    gov = Governor(80, 90, 90, 1.0, 10)
    assert gov.decide(100, reading(cpu=95))[1] is True and gov.reason == "shed"
    assert gov.decide(100, reading(cpu=85))[1] is True  # 90 - 10 < 85: still shedding
    rate, shed = gov.decide(100, reading(cpu=50))
    assert shed is False and rate == 100


def test_a_lower_wanted_rate_wins_and_the_floor_never_exceeds_it() -> None:
    gov = Governor(80, 90, 0, 1.0, 10)
    assert gov.decide(5, reading(cpu=95))[0] == 5


def test_meter_reads_this_process() -> None:
    meter = Meter()
    assert meter.read() is None
    end = time.process_time() + 0.2
    while time.process_time() < end:
        pass
    got = meter.read()
    assert got is not None
    # 0.2 s of CPU in a bit more than 0.2 s of wall: most of one CPU alone, and at least a
    # quarter of one beside the timing phase's other file (which may keep both cores busy).
    assert got.cpu_percent > 100 / usable_cpus() * 0.25, got
    assert 0 < got.mem_percent < 100
    assert got.overhead_percent == 0  # no agent running here


def test_a_slow_thread_lookup_is_outside_the_readings_window(monkeypatch) -> None:
    """Beside a busy program the lookup of the agent's threads waits for the GIL at each file
    it reads (seconds, measured); the wall and CPU clocks of a reading must cover the same
    span, or the waiting counts as wall time without the program's CPU."""
    import hotspan.agent.governor as governor

    real = governor.agent_threads

    def waiting_for_the_gil():
        time.sleep(0.5)
        return real()

    monkeypatch.setattr(governor, "agent_threads", waiting_for_the_gil)
    meter = Meter()
    assert meter.read() is None  # the baseline, after a slow lookup
    wall_start, cpu_start = time.monotonic(), time.process_time()
    end = cpu_start + 0.2
    while time.process_time() < end:
        pass
    wall_stop, cpu_stop = time.monotonic(), time.process_time()
    got = meter.read()  # no lookup this time (twice a minute)
    assert got is not None
    assert abs(got.wall_s - (wall_stop - wall_start)) < 0.1, (got.wall_s, wall_stop - wall_start)
    assert abs(got.process_cpu_s - (cpu_stop - cpu_start)) < 0.1, got


HOG_PROGRAM = """
import os, sys, threading, time
import hotspan

port = int(sys.argv[1])
hotspan.configure(
    application_name="governed", server_address=sys.argv[2], upload_interval=1,
    control_port=port, resource_check_interval=0.3, cpu_threshold={cpu_threshold},
    load_shedding_cpu={shedding}, min_sample_rate=10,
)

def hog():
    while not os.path.exists(sys.argv[3]):
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

threads = [threading.Thread(target=hog) for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
while not os.path.exists(sys.argv[4]):
    time.sleep(0.05)
"""


def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _run_hog(tmp_path: Path, server_url: str, cpu_threshold: float, shedding: float):  # type: ignore[no-untyped-def]
    port = free_port()
    script = tmp_path / "hog.py"
    script.write_text(
        textwrap.dedent(HOG_PROGRAM).format(cpu_threshold=cpu_threshold, shedding=shedding)
    )
    calm, done = tmp_path / "calm", tmp_path / "done"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), server_url, str(calm), str(done)],
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    url = f"http://127.0.0.1:{port}/"

    def state() -> dict:
        try:
            return httpx.get(url, timeout=5, verify=TLS).json()
        except httpx.TransportError:
            return {}

    return proc, state, calm, done


def test_a_cpu_hog_drives_the_rate_down_and_back_up(server, tmp_path: Path) -> None:
    # Two hog threads keep the process near 100% of what two CPUs give a GIL-bound program
    # (about one CPU): a threshold well under that is crossed whatever the machine.
    threshold = 100 / usable_cpus() * 0.4
    proc, state, calm, done = _run_hog(tmp_path, server.url, threshold, 0)
    try:
        assert _wait(lambda: state().get("rate_reason") == "cpu", 15), state()
        assert _wait(lambda: state().get("sample_rate") == 10, 10), state()
        calm.write_text("")
        assert _wait(lambda: state().get("sample_rate") == 100, 15), state()
        assert state()["rate_reason"] == ""
        done.write_text("")
        assert proc.wait(30) == 0
    finally:
        proc.kill()


def test_load_shedding_pauses_profiling_and_counts_the_time(server, tmp_path: Path) -> None:
    threshold = 100 / usable_cpus() * 0.3
    proc, state, calm, done = _run_hog(tmp_path, server.url, 0, threshold)
    try:
        assert _wait(lambda: state().get("profiling") is False, 15), state()
        snapshot = state()
        assert snapshot["shedding"] is True
        assert snapshot["profiling"] is False and snapshot["rate_reason"] == "shed"
        shed_from = time.time() + 1
        time.sleep(3.5)
        assert state()["shed_seconds"] >= 3.0
        shed_until = time.time() - 0.5
        calm.write_text("")
        assert _wait(lambda: state().get("profiling") is True, 15), state()
        after = state()
        assert after["profiling"] is True and after["shed_seconds"] >= 2.0
        done.write_text("")
        assert proc.wait(30) == 0
        # What was held back while shedding went once it ended; nothing was sampled meanwhile.
        with server.client() as client:
            before = flamegraph(client, '{service_name="governed"}', 0, int(shed_from) - 1, CPU)
            during = flamegraph(
                client, '{service_name="governed"}', int(shed_from) + 1, int(shed_until), CPU
            )
        assert int(before.get("total", 0)) > 0
        assert int(during.get("total", 0) or 0) == 0
    finally:
        proc.kill()


def test_agent_threads_are_found_by_name() -> None:
    import threading

    started = threading.Event()
    stop = threading.Event()

    def run() -> None:
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=run, name="hotspan-test")
    thread.start()
    started.wait(5)
    try:
        assert thread.native_id in agent_threads()
    finally:
        stop.set()
        thread.join()
