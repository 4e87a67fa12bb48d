"""Keeping the agent within budget: the process's load and the agent's own CPU decide the
sample rate in force, or pause profiling altogether.

Every ``resource_check_interval`` seconds the agent's loop hands the :class:`Governor` a
:class:`Reading` (what ``/proc`` and the clocks say now) and gets back the rate to sample at
and whether to shed.  The decision is a small state machine with hysteresis, so a load that
hovers at a threshold does not restart the sampler every check:

- CPU at or above ``load_shedding_cpu``: shed (no sampling, no uploads) until it falls
  ``HYSTERESIS`` points below.
- CPU at or above ``cpu_threshold``, memory at or above ``mem_threshold``, or the agent's own
  CPU above ``max_overhead`` percent of the process's: halve the rate (not below the floor).
  A halving for the budget that did not lower the agent's share is undone: that cost is not
  the sampling's, and fewer samples would only make the profile worse.
- All of them well below (CPU ``HYSTERESIS`` points under, overhead under half the budget):
  double the rate again, up to the rate asked for.
"""

from __future__ import annotations

import os
import time

from hotspan.agent.context import process_stats
from hotspan.agent.sampler import KERNEL_CLOCKS, kernel_cpu_clock

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Dict, Iterable, Optional, Tuple

HYSTERESIS = 10.0  # percentage points
# A budget halving that leaves more than this share of the overhead did not help: undone,
# and the budget rule rests this long before it tries again.
FUTILE_SHARE = 0.8
BUDGET_RETRY_S = 300.0
# Below this much process CPU over a check (percent of one core), the agent's share of it is
# noise (an idle service: a few ms of our upload against a few ms of its own), not judged.
MIN_CPU_FOR_BUDGET = 5.0


class Reading:
    """What a check measured: percentages, and the CPU seconds behind the overhead."""

    __slots__ = ("cpu_percent", "mem_percent", "overhead_percent", "process_cpu_s", "wall_s")

    def __init__(
        self,
        cpu_percent: float,
        mem_percent: float,
        overhead_percent: float,
        process_cpu_s: float = 0.0,
        wall_s: float = 1.0,
    ) -> None:
        self.cpu_percent = cpu_percent
        self.mem_percent = mem_percent
        self.overhead_percent = overhead_percent
        self.process_cpu_s = process_cpu_s
        self.wall_s = wall_s

    def __repr__(self) -> str:
        return (
            f"Reading(cpu={self.cpu_percent:.1f}%, mem={self.mem_percent:.1f}%, "
            f"overhead={self.overhead_percent:.2f}%)"
        )


class Governor:
    def __init__(
        self,
        cpu_threshold: float,
        mem_threshold: float,
        load_shedding_cpu: float,
        max_overhead: float,
        min_rate: int,
    ) -> None:
        self.cpu_threshold = cpu_threshold
        self.mem_threshold = mem_threshold
        self.load_shedding_cpu = load_shedding_cpu
        self.max_overhead = max_overhead
        self.min_rate = min_rate
        self.rate = 0  # in force; 0 until the first decision
        self.shedding = False
        self._shed_since = 0.0
        self._shed_before = 0.0  # seconds shed in the stretches that have ended
        self.reason = ""
        # A halving for the budget is checked at the next reading (see decide): the rate and
        # overhead before it, and until when the budget rule rests after it did not help.
        self._probe: Optional[Tuple[int, float, str]] = None
        self._budget_off = 0.0
        self.futile = False  # the last budget halving did not lower the agent's share

    def _shed(self, on: bool) -> None:
        if on != self.shedding:
            now = time.monotonic()
            if on:
                self._shed_since = now
            else:
                self._shed_before += now - self._shed_since
            self.shedding = on

    def stop_shedding(self) -> None:
        """Profiling was disabled meanwhile: nothing to shed, and the rule starts afresh."""
        self._shed(False)
        if self.reason == "shed":
            self.reason = ""

    def shed_seconds(self) -> float:
        """Seconds shed in all, the current stretch included."""
        current = time.monotonic() - self._shed_since if self.shedding else 0.0
        return self._shed_before + current

    def rate_for(self, wanted_rate: int) -> int:
        """The rate in force for the rate asked for: that one, unless load lowered it."""
        if not self.reason or not self.rate:
            return wanted_rate
        return min(self.rate, wanted_rate)

    def decide(self, wanted_rate: int, reading: Reading) -> Tuple[int, bool]:
        """(rate to sample at, shed) for the rate asked for and what was measured."""
        floor = min(self.min_rate, wanted_rate)
        rate = self.rate_for(wanted_rate)
        cpu, mem = reading.cpu_percent, reading.mem_percent
        shed_at = self.load_shedding_cpu
        if shed_at and (cpu >= shed_at or (self.shedding and cpu >= shed_at - HYSTERESIS)):
            self._shed(True)
            self.reason = "shed"
            return rate, True
        self._shed(False)
        judged = reading.process_cpu_s / max(reading.wall_s, 1e-9) * 100 >= MIN_CPU_FOR_BUDGET
        now = time.monotonic()
        over_budget = (
            judged and reading.overhead_percent > self.max_overhead and now >= self._budget_off
        )
        probe, self._probe = self._probe, None
        if probe is not None and self.reason == "budget":
            before_rate, before_overhead, before_reason = probe
            if reading.overhead_percent > FUTILE_SHARE * before_overhead:
                # Half the samples, about the same cost: what costs is not sampling (a busy
                # event loop makes every thread that waits for the GIL wake at each switch,
                # whatever the rate).  Lowering the rate would only blur the profile.
                self._budget_off = now + BUDGET_RETRY_S
                self.futile = True
                # Back to where it was, for the reason it was there (cpu, say), if any.
                self.rate = before_rate
                self.reason = before_reason if before_rate < wanted_rate else ""
                return before_rate, False
        if self.cpu_threshold and cpu >= self.cpu_threshold:
            rate, self.reason = max(floor, rate // 2), "cpu"
        elif self.mem_threshold and mem >= self.mem_threshold:
            rate, self.reason = max(floor, rate // 2), "memory"
        elif over_budget and rate > floor:
            self._probe = (rate, reading.overhead_percent, self.reason)
            rate, self.reason = max(floor, rate // 2), "budget"
            self.futile = False
        elif rate < wanted_rate:
            calm = (not self.cpu_threshold or cpu < self.cpu_threshold - HYSTERESIS) and (
                not self.mem_threshold or mem < self.mem_threshold - HYSTERESIS
            )
            if calm and (not judged or reading.overhead_percent < self.max_overhead / 2):
                rate = min(wanted_rate, rate * 2)
            if rate == wanted_rate:
                self.reason = ""
        else:
            self.reason = ""
        self.rate = rate
        return rate, False


# ------------------------------------------------------------------ measuring


def usable_cpus() -> float:
    """CPUs the process may use: its affinity, capped by a cgroup v2 CPU quota."""
    try:
        count = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        count = float(os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            count = min(count, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return max(count, 0.01)


def memory_limit() -> int:
    """Bytes of memory the process may use: a cgroup v2 limit, else the machine's."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            text = f.read().strip()
        if text != "max":
            return int(text)
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 0


def rss_bytes() -> int:
    """The process's RSS, as span stats read it (C where built, a few reads cached)."""
    return max(process_stats()[0], 0)


def thread_cpu_ns(tids: Iterable[int]) -> int:
    """CPU time of these kernel threads of this process (ended ones count nothing; 0 where
    the kernel's per-thread clocks cannot be named)."""
    if not KERNEL_CLOCKS:
        return 0
    total = 0
    for tid in tids:
        # Not contextlib.suppress: contextlib is ~200 objects for the GC to walk in a program
        # that had not imported it (see agent/log.py).
        try:  # noqa: SIM105
            total += time.clock_gettime_ns(kernel_cpu_clock(tid))
        except (OSError, OverflowError):  # ended: counts nothing
            pass
    return total


def named_threads(prefix: str) -> Dict[int, str]:
    """Kernel thread ids of this process whose name starts with ``prefix``: the agent's own
    threads, the C ones included (they name themselves, see sampler/collector.c)."""
    out: Dict[int, str] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith(prefix):
            out[int(tid)] = name
    return out


def agent_threads() -> Dict[int, str]:
    """The agent's threads: Python ones by their ``threading`` name (the kernel learns it only
    from 3.14), C ones by their kernel name."""
    import threading

    found = named_threads("hotspan")
    for thread in threading.enumerate():
        native = getattr(thread, "native_id", None)
        if native is not None and thread.name.startswith("hotspan"):
            found[native] = thread.name
    return found


class Meter:
    """Turns the clocks into a :class:`Reading` per check (differences since the last)."""

    def __init__(self) -> None:
        self._cpus = usable_cpus()
        self._memory = memory_limit()
        self._last: Optional[Tuple[int, int, int]] = None
        self._agent_tids: Dict[int, str] = {}
        self._tids_at = 0.0

    def read(self) -> Optional[Reading]:
        """None on the first call (nothing to compare with yet)."""
        if time.monotonic() - self._tids_at > 30:  # threads come and go rarely: twice a minute
            self._agent_tids = agent_threads()
            self._tids_at = time.monotonic()
        # The clocks are read together, after the lookup: it reads /proc and gives the GIL up
        # at each file, so beside a busy program it can take a second, which read between
        # them would count as wall time without the program's CPU.
        sample = (time.monotonic_ns(), time.process_time_ns(), thread_cpu_ns(self._agent_tids))
        last, self._last = self._last, sample
        if last is None:
            return None
        wall = max(sample[0] - last[0], 1)
        process = max(sample[1] - last[1], 0)
        agent = max(sample[2] - last[2], 0)
        mem = rss_bytes() * 100.0 / self._memory if self._memory else 0.0
        return Reading(
            cpu_percent=process * 100.0 / wall / self._cpus,
            mem_percent=mem,
            overhead_percent=agent * 100.0 / process if process else 0.0,
            process_cpu_s=process / 1e9,
            wall_s=wall / 1e9,
        )
