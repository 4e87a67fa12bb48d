"""Heatmaps of profile values over time, as Pyroscope's ``SelectHeatmap`` draws them.

Each point (a profile, or a span within a profile: see :mod:`hotspan.query.exemplars`) falls
in a time slot and a value bucket; a cell counts its points and keeps its largest one as the
exemplar.  The value axis is cut into 20 equal buckets between the smallest and the largest
value of all series, so that every series and slot shares them; the time slot of a point at t
is the one whose right edge T = start + k * step has T - step < t <= T, clamped to the range.
All times here are milliseconds, as in the API.  The points are counted in numpy: only the
cells (at most groups x slots x 20) become Python objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from hotspan.query.exemplars import (
    MS,
    Exemplar,
    Points,
    best_per_run,
    group_sort_key,
    lex_key,
    run_starts,
)

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


def bucket_of(values: np.ndarray, lows: List[int]) -> np.ndarray:
    """The bucket of each value: the last whose lower bound it reaches.  That is Pyroscope's
    first bucket with low <= value < next low (empty buckets, whose bounds are equal, skipped),
    the last one holding the largest values; -1 below the first."""
    return np.searchsorted(np.asarray(lows, dtype=np.int64), values, side="right") - 1


def _round_up(t, start: int, step: int):
    # To the next T = start + k * step at or after t (ints or int64 arrays alike).
    offset = start % step
    return -((offset - t) // step) * step + offset


def slot_of(t_ms, start_ms: int, end_ms: int, step_ms: int):
    """The right edge of the slot holding time ``t_ms`` (an int or an int64 array): slots are
    (start - step, start], (start, start + step], ... and times outside go to the first or
    the last one."""
    last = _round_up(end_ms, start_ms, step_ms)
    return np.clip(_round_up(t_ms, start_ms, step_ms), start_ms, last)


def build(
    points: Points,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    with_exemplars: bool,
    limit: Optional[int] = None,
) -> Tuple[List[Heatmap], List[int]]:
    """One heatmap per group (ordered by labels; the ``limit`` with most points, then by
    labels, when given) and the lower bounds of the value buckets they share."""
    if not len(points):
        return [], []
    lows = y_buckets(int(points.value.min()), int(points.value.max()))
    bucket = bucket_of(points.value, lows)
    slot = slot_of(points.time_ns // MS, start_ms, end_ms, step_ms)
    # A cell is a run of (group, slot, bucket) in the stable order by them; its exemplar the
    # largest point, the earliest of equals.
    key = lex_key(points.group, slot, bucket)
    order = np.argsort(key, kind="stable")
    starts = run_starts(key[order])
    counts = np.diff(np.append(starts, len(order)))
    best = best_per_run(order, starts, points.value)
    slots: Dict[int, Dict[int, Slot]] = {}
    for g, ts, b, count, i in zip(
        points.group[best].tolist(),
        slot[best].tolist(),
        bucket[best].tolist(),
        counts.tolist(),
        best.tolist(),
    ):
        cell = slots.setdefault(g, {}).setdefault(ts, Slot(ts, [0] * len(lows)))
        cell.counts[b] = count
        if with_exemplars:
            cell.exemplars.append(points.exemplar(i))
    per_group = np.bincount(points.group, minlength=len(points.groups)).tolist()
    ranked = sorted(slots, key=lambda g: group_sort_key(points.groups[g]))
    if limit and len(ranked) > limit:
        # Pyroscope's top series: the most points, then the labels.
        ranked = sorted(ranked, key=lambda g: -per_group[g])[:limit]
    out = [
        Heatmap(
            {k: v for k, v in points.groups[g] if v},
            [slots[g][ts] for ts in sorted(slots[g])],
        )
        for g in ranked
    ]
    return out, lows
