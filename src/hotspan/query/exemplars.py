"""Exemplars: the individual profiles (or spans within them) behind a point of a timeline or
a cell of a heatmap, as Pyroscope returns them in ``types.v1.Exemplar``.

A profile is the samples of one series at one time: what one upload of one service's profile
type holds (an upload's samples share its time), and what the timeline's ``average`` counts.
Pyroscope gives each stored profile a random UUID that no client ever sees at ingest; hotspan
names a profile by what identifies it instead, its series id and time packed into the same
UUID form (8 + 8 bytes).  So an old database has ids for all its profiles, nothing extra is
stored, and ``profile_id_selector`` finds a profile again from its id alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from hotspan.store.base import ProfileValues

MS = 1_000_000
_MASK64 = (1 << 64) - 1

Group = Tuple[Tuple[str, str], ...]  # the group-by labels of a series: (name, value) pairs


def profile_id(series_id: int, time_ns: int) -> str:
    """The id of the profile of ``series_id`` at ``time_ns``, in UUID form."""
    h = f"{series_id & _MASK64:016x}{time_ns & _MASK64:016x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def parse_profile_id(text: str) -> Tuple[int, int]:
    """(series id, time in ns) of a :func:`profile_id`; ValueError when ``text`` is none."""
    digits = text.strip().replace("-", "").lower()
    if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"profile id {text!r} is not a UUID")
    series_id, time_ns = int(digits[:16], 16), int(digits[16:], 16)
    if series_id >= 1 << 63:  # series ids are signed 64-bit
        series_id -= 1 << 64
    return series_id, time_ns


@dataclass
class Exemplar:
    """One profile, or one span within one profile, with its value: ``types.v1.Exemplar``."""

    time_ns: int
    value: int
    profile_id: str = ""  # individual exemplars
    span_id: int = 0  # span exemplars (0: none)
    trace_id: Optional[str] = None
    labels: Dict[str, str] = field(default_factory=dict)  # series labels but the group's

    @property
    def timestamp_ms(self) -> int:
        return self.time_ns // MS

    @property
    def span_hex(self) -> str:
        return f"{self.span_id:016x}" if self.span_id else ""


def group_points(
    values: ProfileValues,
    labels_of: Mapping[int, Mapping[str, str]],
    group_by: Sequence[str],
    by_span: bool,
) -> Dict[Group, List[Exemplar]]:
    """The candidate exemplars of each group (series with the same group-by labels), in the
    order of ``values`` (time first).

    Per profile, each profile is its own point.  Per span, as Pyroscope does, the span's
    samples of several series of one group at the same millisecond make one point (their
    values added up, their labels those all of them share)."""
    out: Dict[Group, List[Exemplar]] = {}
    merged: Dict[Tuple[Group, int, int, Optional[str]], Exemplar] = {}
    for sid, ts, span, trace, value in zip(
        values.series_ids.tolist(),
        values.times.tolist(),
        values.span_ids.tolist(),
        values.trace_ids,
        values.values.tolist(),
    ):
        labels = labels_of[sid]
        group = tuple((name, labels.get(name, "")) for name in group_by)
        own = {k: v for k, v in labels.items() if k not in group_by}
        if not by_span:
            point = Exemplar(ts, value, profile_id=profile_id(sid, ts), labels=own)
            out.setdefault(group, []).append(point)
            continue
        key = (group, ts // MS, span, trace)
        seen = merged.get(key)
        if seen is None:
            merged[key] = point = Exemplar(ts, value, span_id=span, trace_id=trace, labels=own)
            out.setdefault(group, []).append(point)
        else:
            seen.value += value
            seen.labels = {k: v for k, v in seen.labels.items() if own.get(k) == v}
    return out


def top_per_step(points: Sequence[Exemplar], start_ns: int, step_ns: int) -> Dict[int, Exemplar]:
    """The largest point of each step of a timeline (the earliest of equals), by the step's
    time T (it covers (T - step, T], T = start + k * step): Pyroscope keeps one exemplar per
    point."""
    best: Dict[int, Exemplar] = {}
    for point in points:
        bucket = start_ns + -(-(point.time_ns - start_ns) // step_ns) * step_ns
        held = best.get(bucket)
        if held is None or point.value > held.value:
            best[bucket] = point
    return best
