"""Heatmaps of profile values over time, as Pyroscope's ``SelectHeatmap`` draws them.

Each point (a profile, or a span within a profile: see :mod:`hotspan.query.exemplars`) falls
in a time slot and a value bucket; a cell counts its points and keeps its largest one as the
exemplar.  The value axis is cut into 20 equal buckets between the smallest and the largest
value of all series, so that every series and slot shares them; the time slot of a point at t
is the one whose right edge T = start + k * step has T - step < t <= T, clamped to the range.
All times here are milliseconds, as in the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from hotspan.query.exemplars import Exemplar, Group

Y_BUCKETS = 20


@dataclass
class Slot:
    timestamp_ms: int  # the right edge of the slot
    counts: List[int]  # per value bucket
    exemplars: List[Exemplar] = field(default_factory=list)  # per non-empty bucket, in order


@dataclass
class Heatmap:
    labels: Dict[str, str]
    slots: List[Slot]


def y_buckets(low: int, high: int, n: int = Y_BUCKETS) -> List[int]:
    """The lower bounds of ``n`` equal buckets over [low, high] (one wide when all equal)."""
    if high == low:
        high = low + 1
    width = (high - low) / n
    return [low + int(i * width) for i in range(n)]


def bucket_of(value: int, lows: Sequence[int], high: int) -> int:
    """The bucket a value falls in: the first whose [low, next low) holds it, the last for the
    largest values; -1 below the first."""
    for i, low in enumerate(lows):
        upper = lows[i + 1] if i + 1 < len(lows) else high
        if low <= value < upper:
            return i
    return len(lows) - 1 if lows and value >= lows[-1] else -1


def _round_up(t: int, start: int, step: int) -> int:
    offset = start % step
    t -= offset
    if t % step:
        t = (t // step + 1) * step
    return t + offset


def slot_of(t_ms: int, start_ms: int, end_ms: int, step_ms: int) -> int:
    """The right edge of the slot holding time ``t_ms``: slots are (start - step, start],
    (start, start + step], ... and times outside go to the first or the last one."""
    last = _round_up(end_ms, start_ms, step_ms)
    return min(max(_round_up(t_ms, start_ms, step_ms), start_ms), last)


def build(
    groups: Dict[Group, List[Exemplar]],
    start_ms: int,
    end_ms: int,
    step_ms: int,
    with_exemplars: bool,
    limit: Optional[int] = None,
) -> Tuple[List[Heatmap], List[int]]:
    """One heatmap per group (sorted by labels; the ``limit`` with most points when given)
    and the lower bounds of the value buckets they share."""
    values = [p.value for points in groups.values() for p in points]
    if not values:
        return [], []
    low, high = min(values), max(values)
    if high == low:
        high = low + 1
    lows = y_buckets(low, high)
    out: List[Tuple[Group, Heatmap, int]] = []
    for group, points in sorted(groups.items()):
        cells: Dict[Tuple[int, int], List] = {}  # (slot, bucket) -> [count, best point]
        for point in points:
            bucket = bucket_of(point.value, lows, high)
            if bucket < 0:
                continue
            cell = cells.setdefault(
                (slot_of(point.timestamp_ms, start_ms, end_ms, step_ms), bucket), [0, point]
            )
            cell[0] += 1
            if point.value > cell[1].value:
                cell[1] = point
        slots: Dict[int, Slot] = {}
        for (ts, bucket), (count, best) in sorted(cells.items()):
            slot = slots.setdefault(ts, Slot(ts, [0] * len(lows)))
            slot.counts[bucket] = count
            if with_exemplars:
                slot.exemplars.append(best)
        labels = {k: v for k, v in group if v}
        out.append((group, Heatmap(labels, [slots[t] for t in sorted(slots)]), len(points)))
    if limit and len(out) > limit:
        # Pyroscope's top series: the most points, then the labels.
        out.sort(key=lambda g: -g[2])
        out = out[:limit]
    return [h for _, h, _ in out], lows
