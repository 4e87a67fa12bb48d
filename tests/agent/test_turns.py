"""The agent's waits (``_speedups/sampler/turns.c``): a thread of the agent's that wakes beside
a busy asyncio loop gets the GIL back by a turn the main thread hands over, promptly and with
a few wake-ups, where waiting in the GIL's queue would take until the loop idles and wake it
at every drop of the GIL.  Each scenario runs in a fresh interpreter whose main thread runs
the loop (turns are handed over by the main thread; a test worker's may be busy elsewhere)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import threading
import time

import pytest

from hotspan._speedups import load_sampler

native = load_sampler()
pytestmark = pytest.mark.skipif(native is None, reason="the native sampler is not built")
# Turns at the GIL: a free-threaded build has none to hand over (its waker only wakes).
needs_gil = pytest.mark.skipif(
    bool(sysconfig.get_config_var("Py_GIL_DISABLED")), reason="free-threaded: no GIL, no turns"
)

BUSY_LOOP = """
import asyncio, json, statistics, threading, time
from hotspan._speedups import load_sampler
native = load_sampler()

def spin(n):
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFFF
    return x

async def busy(done):
    # Coroutines yielding every ~0.2 ms: the loop drops the GIL at every poll of its selector.
    async def task():
        while not done.is_set():
            spin(1000)
            await asyncio.sleep(0)
    await asyncio.gather(*[task() for _ in range(20)])

def switches():
    with open(f"/proc/thread-self/status") as f:
        return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)

async def watch(done, gaps):
    # The main loop's pauses: (time since its last turn, when), until done.
    last = time.monotonic()
    while not done.is_set():
        await asyncio.sleep(0)
        now = time.monotonic()
        gaps.append((now - last, now))
        last = now
"""


def run_scenario(body: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", BUSY_LOOP + body],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_waker_is_an_event() -> None:
    waker = native.Waker()
    assert not waker.is_set()
    started = time.monotonic()
    assert waker.wait(0.05) is False
    assert time.monotonic() - started >= 0.045
    threading.Timer(0.05, waker.set).start()
    assert waker.wait(5) is True
    assert waker.is_set() and waker.wait(0) is True  # stays set until cleared
    waker.clear()
    assert not waker.is_set()
    with pytest.raises(TypeError):
        native.Waker(1)
    with pytest.raises(TypeError):
        waker.wait(1, 2)


@needs_gil
def test_a_thread_that_wakes_beside_a_busy_loop_gets_the_gil_by_a_turn() -> None:
    result = run_scenario(
        """
done = threading.Event()
waker = native.Waker()
report = {}

def agent_thread():
    # Counted from a turn on: reading them before, outside one, waits in the GIL's queue.
    waker.wait(0.05)
    before = switches()
    delays = []
    for _ in range(10):
        asked = time.monotonic()
        waker.wait(0.05)
        delays.append(time.monotonic() - asked - 0.05)
        spin(2000)  # its Python work, in the turn
    report.update(delays=delays, switches=switches() - before)
    done.set()

turns = native.turns()["granted"]
threading.Thread(target=agent_thread).start()
asyncio.run(busy(done))
report["turns"] = native.turns()["granted"] - turns
print(json.dumps(report))
"""
    )
    delays = sorted(result["delays"])
    # In the GIL's queue the first wait alone took until the loop ended (half a second here),
    # and the thread switched thousands of times a second.
    assert delays[len(delays) // 2] < 0.01, result
    assert delays[-1] < 0.1, result
    assert result["turns"] >= 8, result
    assert result["switches"] <= 100, result


@needs_gil
def test_a_main_thread_asleep_in_c_is_not_waited_for() -> None:
    """The main thread joins a thread (asleep, the GIL free): the agent's thread withdraws its
    ask after one look and takes the GIL, rather than wait for a turn that cannot come."""
    result = run_scenario(
        """
waker = native.Waker()
report = {}

def agent_thread():
    delays = []
    for _ in range(5):
        asked = time.monotonic()
        waker.wait(0.01)
        delays.append(time.monotonic() - asked - 0.01)
    report["delays"] = delays

turns = native.turns()
thread = threading.Thread(target=agent_thread)
thread.start()
thread.join()
after = native.turns()
report.update({k: after[k] - turns[k] for k in after})
print(json.dumps(report))
"""
    )
    assert result["granted"] == 0 and result["withdrawn"] == 5, result
    assert max(result["delays"]) < 0.2, result  # one look: 20 ms, not the 0.5 s cap


def test_a_thread_woken_in_a_turn_runs_in_it() -> None:
    """The loop thread hands the uploader an upload in its turn: the uploader's thread joins
    the turn, so the main thread waits for it too instead of running again at once."""
    result = run_scenario(
        """
done = threading.Event()
loop_waker, upload_waker = native.Waker(), native.Waker()
report = {"delays": []}
handed = []
ready = threading.Event()

def uploader():
    before = switches()  # main waits for ready below: the GIL is free until then
    ready.set()
    while True:
        upload_waker.wait(None)
        upload_waker.clear()
        if done.is_set():
            break
        report["delays"].append(time.monotonic() - handed[-1])
        spin(2000)  # its Python work, still in the turn
    report["switches"] = switches() - before

def loop():
    for _ in range(10):
        loop_waker.wait(0.05)
        handed.append(time.monotonic())
        upload_waker.set()
        spin(500)
    loop_waker.wait(0.05)  # the last upload handled before the end is told
    done.set()
    upload_waker.set()

turns = native.turns()["granted"]
threads = [threading.Thread(target=uploader), threading.Thread(target=loop)]
threads[0].start()
ready.wait()
threads[1].start()
asyncio.run(busy(done))
for t in threads:
    t.join()
report["turns"] = native.turns()["granted"] - turns
print(json.dumps(report))
"""
    )
    delays = sorted(result["delays"])
    assert len(delays) == 10, result
    assert delays[len(delays) // 2] < 0.01, result
    assert delays[-1] < 0.1, result
    assert result["switches"] <= 100, result


@needs_gil
def test_a_turn_that_overruns_gives_the_main_thread_back() -> None:
    """A turn whose thread blocks (here: sleeps 1 s) lets the main thread wait 0.1 s at most.

    The loop runs 2.5 s, then stops whether the thread is back or not: after an overrun the
    thread takes the GIL in CPython's queue, which a saturated loop may not let it through
    until the loop idles (docs/agent.md: 6 to 93 s on one host)."""
    result = run_scenario(
        """
done = threading.Event()
waker = native.Waker()
back = []

def agent_thread():
    waker.wait(0.05)
    time.sleep(1.0)  # the GIL released, the turn not ended
    back.append(True)  # (with the GIL again)

gaps = []

async def stop_later():
    await asyncio.sleep(2.5)
    done.set()

async def main():
    await asyncio.gather(busy(done), watch(done, gaps), stop_later())

threading.Thread(target=agent_thread).start()
started = time.monotonic()
asyncio.run(main())
ran = time.monotonic() - started
print(json.dumps({"longest_gap": max(gap for gap, _ in gaps), "ran": ran, "back": bool(back)}))
"""
    )
    assert 0.05 <= result["longest_gap"] < 0.5, result
    assert result["ran"] < 10, result


@needs_gil
def test_a_thread_waiting_for_its_socket_leaves_its_turn_and_comes_back_by_one() -> None:
    """The uploader waits for a server's answer with wait_io: the main thread runs meanwhile
    (a wait inside the turn would hold it 0.1 s, then leave the thread to the GIL's queue),
    and the thread comes back by a turn, with a handful of switches."""
    result = run_scenario(
        """
import os, subprocess
done = threading.Event()
waker = native.Waker()
report = {}

def agent_thread():
    waker.wait(0.05)  # in a turn from here
    before = switches()
    r, w = os.pipe()
    # The answer comes from another process half a second later: nothing of this one's.
    subprocess.Popen(["sh", "-c", "sleep 0.5; printf x"], stdout=w)
    os.close(w)
    report["not_yet"] = waker.wait_io(r, False, 0.01)
    report["ready"] = waker.wait_io(r, False, 5.0)
    report["data"] = os.read(r, 1).decode()
    spin(2000)  # its Python work, back in a turn
    report["switches"] = switches() - before
    report["writable"] = waker.wait_io(os.pipe()[1], True, 1.0)  # ready at once
    report["end"] = time.monotonic()
    report["turns"] = native.turns()
    done.set()  # and the thread ends in its turn, which the main thread ends after 0.1 s

gaps = []

async def main():
    await asyncio.gather(busy(done), watch(done, gaps))

turns = native.turns()
threading.Thread(target=agent_thread).start()
asyncio.run(main())
after = report.pop("turns")
report.update(longest_gap=max(gap for gap, at in gaps if at <= report["end"]),
              overrun=after["overrun"] - turns["overrun"],
              granted=after["granted"] - turns["granted"])
print(json.dumps(report))
"""
    )
    assert result["not_yet"] is False and result["ready"] is True, result
    assert result["data"] == "x" and result["writable"] is True, result
    assert result["overrun"] == 0, result
    assert result["longest_gap"] < 0.09, result
    assert result["granted"] >= 3, result  # the first wait, each wait_io's way back, the last
    assert result["switches"] <= 50, result


def test_a_gevent_program_keeps_its_greenlets_running() -> None:
    """Under gevent's monkey-patching the agent's threads are greenlets on the main thread:
    its waits stay gevent's (a native wait there would stop every greenlet for its length;
    the uploader's, with no timeout, for ever)."""
    pytest.importorskip("gevent", reason="gevent is not installed (pip install -e .[test])")
    code = """
from gevent import monkey; monkey.patch_all()
import json, time, gevent, hotspan
agent = hotspan.configure(application_name="gevent-turns", server_address="http://127.0.0.1:9",
                          upload_interval=3600)
gaps = []
def ticker():
    last = time.monotonic()
    end = last + 2.5  # past the agent's first waits (0.1 s apart for two seconds)
    while time.monotonic() < end:
        gevent.sleep(0.01)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
gevent.spawn(ticker).join()
hotspan.shutdown(flush=False)
print(json.dumps({"longest_gap": max(gaps), "ticks": len(gaps)}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["longest_gap"] < 0.5, result
    assert result["ticks"] > 100, result
