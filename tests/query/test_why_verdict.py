"""The verdict of "why is this span slow" from its numbers alone: computing, waiting,
contended.  The whole path (agent, store, API) is in ``tests/server/api/test_why.py``."""

from __future__ import annotations

from typing import Optional

from hotspan.model.trace import SpanGroup, StoredSpan
from hotspan.query.flamegraph import FlameGraph
from hotspan.query.why import CPU, WALL, Baseline, Delta, ProfileComparison, _verdict

MS = 10**6
NOW = 10**18


def span(duration_ms: float) -> StoredSpan:
    group = SpanGroup("shop", b"", "", b"", "", "")
    end = NOW - 60 * 10**9  # long enough ago that its samples are all in
    start = end - int(duration_ms * MS)
    return StoredSpan("0" * 31 + "1", 1, 0, "POST /upload", 2, "shop", start, end, 0, b"", group)


def baseline(mean_ms: float) -> Baseline:
    mean = int(mean_ms * MS)
    return Baseline((object(),) * 5, 0, 0, mean, mean, (2, 3, 4, 5, 6), ())  # type: ignore[arg-type]


def compared(ptype: object, span_ms: float, baseline_ms: float) -> ProfileComparison:
    empty = FlameGraph([], [], [], 0)
    value = Delta(int(span_ms * MS), baseline_ms * MS)
    return ProfileComparison(ptype, value, (), empty)  # type: ignore[arg-type]


def verdict(
    duration: float, cpu: float, mean: float, mean_cpu: float, cpu_wait: Optional[Delta] = None
) -> str:
    profiles = (compared(CPU, cpu, mean_cpu), compared(WALL, duration, mean))
    return _verdict(span(duration), baseline(mean), profiles, 86400 * 10**9, NOW, (), cpu_wait)[0]


def test_a_span_that_computed_more_was_computing() -> None:
    assert verdict(330, cpu=300, mean=30, mean_cpu=20) == "computing"
    # Stretched threefold by a loaded machine, its extra CPU still a third of its extra time.
    assert verdict(990, cpu=300, mean=30, mean_cpu=20) == "computing"
    # A little slower than its like, by noise: its CPU share decides.
    assert verdict(105, cpu=98, mean=100, mean_cpu=97) == "computing"


def test_a_span_that_computed_as_much_but_took_twice_as_long_was_not_computing() -> None:
    # Half of it on CPU, yet that half is what its like computed too: the extra 100 ms were
    # spent off CPU, where nothing the span measured says why.
    assert verdict(208, cpu=100, mean=107, mean_cpu=100) == "waiting"
    # Where its wall samples say it was runnable for a core, the verdict says so.
    assert verdict(208, cpu=100, mean=107, mean_cpu=100, cpu_wait=Delta(90 * MS, 5 * MS)) == (
        "contended"
    )


def test_a_span_mostly_off_cpu_was_waiting() -> None:
    assert verdict(300, cpu=20, mean=40, mean_cpu=18) == "waiting"
