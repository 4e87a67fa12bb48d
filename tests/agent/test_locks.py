"""Lock contention in real programs: each test runs a program with the agent (uploading every
second) and real OpenTelemetry SDK spans, against a real ``hotspan server``, and reads the
``mutex`` profiles back through the query API, to compare with what the program measured of
its own waits."""

from __future__ import annotations

import sysconfig
import time
import uuid
from pathlib import Path
from typing import Dict

import httpx
import pytest

from hotspan._speedups import load_module
from tests.agent.test_agent import TOTAL, run_program, span_profile, totals
from tests.helpers import flamegraph

DELAY = "mutex:delay:nanoseconds:contentions:count"
CONTENTIONS = "mutex:contentions:count:contentions:count"

native_locks = pytest.mark.skipif(
    load_module("_locks") is None, reason="hotspan._speedups._locks is not built"
)
IMPLEMENTATIONS = [
    pytest.param(True, marks=native_locks, id="native"),
    pytest.param(False, id="python"),
]


def configure(url: str, service: str, native: bool = True) -> str:
    return (
        f"agent = hotspan.configure(application_name={service!r}, server_address={url!r}, "
        f"upload_interval=1, threads=False, alloc_sample_bytes=0, native={native!r})\n"
        f"report_impl = agent.collectors.get('locks')\n"
    )


def service_profile(client: httpx.Client, service: str, ptype: str = DELAY) -> Dict[str, int]:
    now = int(time.time())
    graph = flamegraph(client, f'{{service_name="{service}"}}', now - 600, now + 60, ptype)
    return totals(graph)


@pytest.mark.parametrize("native", IMPLEMENTATIONS)
def test_contended_lock_delay_matches_the_waits_measured(
    module_server, tmp_path: Path, native: bool
) -> None:
    """Two threads each hold one lock 5 ms of every ~10 ms for ~2 s; each times its own
    acquires.  The delay stored, per waiting function and in all, is what they measured."""
    service = f"locks_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(module_server.url, service, native)
        + """
import random
lock = threading.Lock()  # made after configure: profiled
waited = {}

def hold_and_wait(name, rounds=200):
    # Holds the lock 5 ms, then is away 0-10 ms (5 on average), so the two threads' turns
    # drift against each other instead of settling into alternation.
    pause = random.Random(name).uniform
    total = 0
    for _ in range(rounds):
        start = time.perf_counter_ns()
        lock.acquire()
        total += time.perf_counter_ns() - start
        time.sleep(0.005)
        lock.release()
        time.sleep(pause(0, 0.01))
    waited[name] = total

def worker_a():
    hold_and_wait("a")

def worker_b():
    hold_and_wait("b")

threads = [threading.Thread(target=worker_a), threading.Thread(target=worker_b)]
for t in threads: t.start()
for t in threads: t.join()
stats = agent.collector_stats()["locks"]
hotspan.shutdown()
report(waited=waited, impl=report_impl, stats=stats, kind=type(lock).__name__)
""",
        otel=False,
    )
    assert result["impl"] == ("native" if native else "python")
    assert result["kind"] == ("ProfiledLock" if native else "PyProfiledLock")
    assert result["stats"]["waits_dropped"] == 0
    waited = result["waited"]
    truth = waited["a"] + waited["b"]
    assert truth > 0.5e9, waited  # the program really contended
    with module_server.client() as client:
        delay = service_profile(client, service)
        count = service_profile(client, service, CONTENTIONS)
    assert abs(delay[TOTAL] - truth) <= 0.1 * truth, (delay, waited)
    # On the waiter's stack: the function that called acquire, under the thread's target.
    for name in ("a", "b"):
        function = f"__main__.worker_{name}"
        assert abs(delay.get(function, 0) - waited[name]) <= 0.1 * truth, (delay, waited)
    assert delay.get("__main__.hold_and_wait", 0) == delay[TOTAL]
    # Contended acquires only: most of the 400 wait, none is counted twice.
    assert 100 <= count[TOTAL] <= 400, count


def test_queue_condition_semaphore_still_work_and_waits_for_notify_are_not_contention(
    module_server, tmp_path: Path
) -> None:
    """Locks made after the agent starts, inside queue.Queue, Condition, Semaphore,
    BoundedSemaphore, Event and Barrier, are profiled and behave as before; waiting for a
    notify (or a semaphore release, or an event) is not contention, waiting for the lock is."""
    service = f"locksync_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(module_server.url, service)
        + """
import queue

# Producer/consumer through a bounded queue: both sides wait on its conditions.
q = queue.Queue(maxsize=2)
got = []
def producer():
    for i in range(300):
        q.put(i)
    q.put(None)
def consumer():
    while True:
        item = q.get()
        if item is None:
            return
        got.append(item)
threads = [threading.Thread(target=producer), threading.Thread(target=consumer)]
for t in threads: t.start()
for t in threads: t.join()

# A condition waited on for 0.4 s before its notify, on a profiled RLock and a profiled Lock.
def wait_for_notify(cond, seen):
    with cond:
        seen.append(cond.wait(5))
seen = []
for cond in (threading.Condition(), threading.Condition(threading.Lock())):
    t = threading.Thread(target=wait_for_notify, args=(cond, seen))
    t.start()
    time.sleep(0.4)
    with cond:
        cond.notify()
    t.join()

# A semaphore, an event and a barrier waited on for 0.3 s each.
sem = threading.BoundedSemaphore(1)
sem.acquire()
threading.Timer(0.3, sem.release).start()
def wait_for_semaphore():
    sem.acquire()
wait_for_semaphore()
try:
    sem.release(); sem.release()
    bounded_ok = False
except ValueError:
    bounded_ok = True
event = threading.Event()
threading.Timer(0.3, event.set).start()
event_ok = event.wait(5)
barrier = threading.Barrier(2)
threading.Timer(0.3, barrier.wait).start()
barrier.wait(5)

# And one real wait: a lock held 0.3 s by another thread.
lock = threading.RLock()
held = threading.Event()
def holder():
    with lock:
        held.set()
        time.sleep(0.3)
def really_contended():
    start = time.perf_counter_ns()
    with lock:
        return time.perf_counter_ns() - start
t = threading.Thread(target=holder)
t.start()
held.wait()
waited = really_contended()
t.join()
hotspan.shutdown()
report(got=got == list(range(300)), seen=seen, bounded_ok=bounded_ok, event_ok=event_ok,
       waited=waited, kinds=[type(q.mutex).__name__, type(cond._lock).__name__])
""",
        otel=False,
    )
    assert result["got"] and result["seen"] == [True, True], result
    assert result["bounded_ok"] and result["event_ok"], result
    assert result["kinds"] == ["ProfiledLock", "ProfiledLock"] or result["kinds"] == [
        "PyProfiledLock",
        "PyProfiledLock",
    ]
    with module_server.client() as client:
        delay = service_profile(client, service)
    real = delay.get("__main__.really_contended", 0)
    assert abs(real - result["waited"]) <= 0.1 * result["waited"], (delay, result)
    # 1.6 s of waiting for notifies, releases, events and barriers, none of it counted: what
    # else there is, is the queue's threads taking its mutex from each other.
    assert delay.get("__main__.wait_for_notify", 0) < 0.05e9, delay
    assert delay.get("__main__.wait_for_semaphore", 0) < 0.05e9, delay
    assert delay[TOTAL] - real < 0.1e9, delay


@pytest.mark.parametrize("native", IMPLEMENTATIONS)
def test_asyncio_lock_waits_carry_the_waiting_tasks_span(
    module_server, tmp_path: Path, native: bool
) -> None:
    """Two tasks on one loop, each in its own span, take turns on an asyncio.Lock: each
    task's waits are stored under its own span, on the coroutine that entered ``async with``."""
    service = f"alocks_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(module_server.url, service, native)
        + """
import asyncio
ids, waited = {}, {}

async def take_turns(name, lock):
    total = 0
    for _ in range(25):
        start = time.perf_counter_ns()
        async with lock:
            total += time.perf_counter_ns() - start
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)
    waited[name] = total

async def request(name, lock):
    with tracer.start_as_current_span("request " + name) as span:
        ids[name] = span_hex(span)
        await take_turns(name, lock)

async def main():
    lock = asyncio.Lock()
    await asyncio.gather(request("a", lock), request("b", lock))
    # Uncontended: nothing to record.
    for _ in range(1000):
        async with lock:
            pass

asyncio.run(main())
hotspan.shutdown()
report(ids=ids, waited=waited, impl=report_impl)
""",
    )
    assert result["impl"] == ("native" if native else "python")
    ids, waited = result["ids"], result["waited"]
    with module_server.client() as client:
        a = span_profile(client, service, [ids["a"]], DELAY)
        b = span_profile(client, service, [ids["b"]], DELAY)
        whole = service_profile(client, service)
    truth = waited["a"] + waited["b"]
    assert truth > 0.3e9, waited
    for name, profile in (("a", a), ("b", b)):
        assert abs(profile[TOTAL] - waited[name]) <= 0.1 * truth, (name, profile, waited)
        # The leaf is the coroutine that entered `async with`, not asyncio's __aenter__.
        assert profile.get("__main__.take_turns", 0) == profile[TOTAL], profile
        assert not any("__aenter__" in f for f in profile), profile
    assert abs(whole[TOTAL] - truth) <= 0.1 * truth, (whole, waited)


@pytest.mark.parametrize("native", IMPLEMENTATIONS)
def test_uncontended_locks_record_nothing(module_server, tmp_path: Path, native: bool) -> None:
    service = f"nolocks_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(module_server.url, service, native)
        + """
import asyncio, queue
lock, rlock, q = threading.Lock(), threading.RLock(), queue.Queue()
def uncontended():
    for i in range(20000):
        with lock:
            pass
        with rlock:
            with rlock:
                pass
        q.put(i)
        q.get()
def in_threads():
    # One thread after another: each lock is free whenever it is taken.
    for _ in range(3):
        t = threading.Thread(target=uncontended)
        t.start()
        t.join()
async def tasks():
    alock = asyncio.Lock()
    for _ in range(2000):
        async with alock:
            pass
in_threads()
asyncio.run(tasks())
stats = agent.collector_stats()["locks"]
hotspan.shutdown()
report(stats=stats)
""",
        otel=False,
    )
    waits = result["stats"]["waits_recorded"]
    with module_server.client() as client:
        delay = service_profile(client, service)
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        assert waits == 0, result
        assert not any(name.startswith("__main__.") for name in delay), delay
    else:
        # Free-threaded, a thread's start and join hand an Event over between two threads
        # that run at once, and its Condition's lock can be contended: a wait of threading's
        # (3 threads, 2 handshakes each), never one in the locks the program takes itself.
        assert waits <= 6, result
        assert not {"__main__.uncontended", "__main__.tasks"} & set(delay), delay


@native_locks
def test_fork_child_starts_clean_and_inherited_locks_act_as_originals(
    module_server, tmp_path: Path
) -> None:
    """A child forked while another thread holds a profiled lock sees it held, as it would
    an original lock; ``_at_fork_reinit`` frees it; the parent's waits are not the child's."""
    service = f"forklocks_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure(module_server.url, service)
        + """
import _thread
profiled, original = threading.Lock(), _thread.allocate_lock()
busy = threading.Lock()
def holder(release):
    with busy:
        time.sleep(0.2)
    with profiled:
        original.acquire()
        release.wait()
        original.release()
def parent_wait():
    with busy:
        pass
release = threading.Event()
t = threading.Thread(target=holder, args=(release,))
t.start()
time.sleep(0.05)
parent_wait()  # a 0.15 s wait in the parent, not yet uploaded at the fork
time.sleep(0.05)
before = agent.collector_stats()["locks"]["entries"]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    try:
        # What the child's collector holds: not the parent's wait.
        (locks,) = [c for c in agent._collectors if c.name == "locks"]
        samples = [s for p in locks.collect() for s in p.samples]
        out = {"stacks": [[f[0].co_name for f in s.stack] for s in samples]}
        out["profiled"] = profiled.acquire(timeout=0.05)
        out["original"] = original.acquire(timeout=0.05)
        profiled._at_fork_reinit()
        out["reinit"] = profiled.acquire(timeout=0.05)
    except Exception as exc:
        out = {"error": repr(exc)}
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 4096))
release.set()
t.join()
hotspan.shutdown()
report(child=child, before=before)
""",
        otel=False,
    )
    child = result["child"]
    assert result["before"] >= 1
    assert not [stack for stack in child.pop("stacks") if "parent_wait" in stack], result
    assert child == {"profiled": False, "original": False, "reinit": True}, child
    with module_server.client() as client:
        delay = service_profile(client, service)
    assert 0.1e9 < delay.get("__main__.parent_wait", 0) < 0.25e9, delay
