"""Exemplars: the individual profiles (or spans within them) behind a point of a timeline or
a cell of a heatmap, as Pyroscope returns them in ``types.v1.Exemplar``.

A profile is the samples of one series at one time: what one upload of one service's profile
type holds (an upload's samples share its time), and what the timeline's ``average`` counts.
Pyroscope gives each stored profile a random UUID that no client ever sees at ingest; hotspan
names a profile by what identifies it instead, its series id and time packed into the same
UUID form (8 + 8 bytes).  So an old database has ids for all its profiles, nothing extra is
stored, and ``profile_id_selector`` finds a profile again from its id alone.

A range can hold a million points (the engine reads ``MAX_PROFILE_POINTS`` at most), so they
stay in numpy columns (:class:`Points`): an :class:`Exemplar` object, with its labels, is only
made for the few points an answer names (one per timeline point or heatmap cell).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from hotspan.model.profile import MAX_SUM
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


def group_of(labels: Mapping[str, str], group_by: Sequence[str]) -> Group:
    """A series' group: its value of each group-by label ("" when it has none)."""
    return tuple((name, labels.get(name, "")) for name in group_by)


def group_sort_key(group: Group) -> Tuple[Tuple[str, str], ...]:
    """How Pyroscope orders series: by the group-by labels a series has, in group-by order
    (a label a series lacks is left out, not an empty value)."""
    return tuple((name, value) for name, value in group if value)


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


@dataclass
class Points:
    """The candidate exemplars of a range, one row per point, in numpy columns.

    Per profile each profile is a point.  Per span, as Pyroscope does, the span's samples of
    the series of one group at the same millisecond make one point: their values added up,
    their labels those all of them share (``member_*`` keep the series each point adds up)."""

    groups: List[Group]  # the distinct groups; ``group`` indexes it
    group: np.ndarray  # int64
    time_ns: np.ndarray  # int64: the point's (earliest) time
    value: np.ndarray  # int64
    series_id: np.ndarray  # int64: the (first) series of the point
    span_id: np.ndarray  # uint64, 0 per profile
    trace_id: List[Optional[str]]
    # The series of point i are member_series[member_start[i]:member_start[i + 1]].
    member_start: np.ndarray
    member_series: np.ndarray
    labels_of: Mapping[int, Mapping[str, str]]
    group_by: Tuple[str, ...]
    by_span: bool

    def __len__(self) -> int:
        return len(self.value)

    def exemplar(self, i: int) -> Exemplar:
        """Point ``i`` as Pyroscope's exemplar: its labels but the group-by ones."""
        members = self.member_series[self.member_start[i] : self.member_start[i + 1]]
        shared: Optional[Dict[str, str]] = None
        for sid in dict.fromkeys(members.tolist()):
            own = {k: v for k, v in self.labels_of[sid].items() if k not in self.group_by}
            shared = own if shared is None else {k: v for k, v in shared.items() if own.get(k) == v}
        time_ns, value = int(self.time_ns[i]), int(self.value[i])
        if not self.by_span:
            pid = profile_id(int(self.series_id[i]), time_ns)
            return Exemplar(time_ns, value, profile_id=pid, labels=shared or {})
        span = int(self.span_id[i])
        return Exemplar(
            time_ns, value, span_id=span, trace_id=self.trace_id[i], labels=shared or {}
        )


def lex_key(*columns: np.ndarray) -> np.ndarray:
    """One int64 per row that orders the rows as the columns do, first column first: a
    single stable argsort then replaces a lexsort over several keys (far slower)."""
    key: Optional[np.ndarray] = None
    bound = 1
    for column in columns:
        distinct, rank = np.unique(column, return_inverse=True)
        rank = rank.reshape(-1).astype(np.int64)
        if key is None:
            key, bound = rank, len(distinct)
            continue
        if bound * len(distinct) >= 1 << 62:  # ranked again, below the row count: no overflow
            seen, key = np.unique(key, return_inverse=True)
            key, bound = key.reshape(-1).astype(np.int64), len(seen)
        key, bound = key * len(distinct) + rank, bound * len(distinct)
    return key if key is not None else np.zeros(0, dtype=np.int64)


def run_starts(sorted_key: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in a sorted key."""
    if not len(sorted_key):
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.concatenate(([True], sorted_key[1:] != sorted_key[:-1])))


def best_per_run(order: np.ndarray, starts: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Per run of ``order`` (rows sorted stably by a key; runs begin at ``starts``), the row
    with the largest value, the first of equals (the earliest: rows come in time order)."""
    if not len(order):
        return order
    ordered = value[order]
    counts = np.diff(np.append(starts, len(order)))
    top = np.flatnonzero(ordered == np.repeat(np.maximum.reduceat(ordered, starts), counts))
    run = np.repeat(np.arange(len(starts)), counts)[top]
    return order[top[np.concatenate(([True], run[1:] != run[:-1]))]]


def concat_values(parts: Sequence[ProfileValues]) -> ProfileValues:
    """The rows of several reads, one after the other."""
    return ProfileValues(
        np.concatenate([np.zeros(0, dtype=np.int64), *(p.series_ids for p in parts)]),
        np.concatenate([np.zeros(0, dtype=np.int64), *(p.times for p in parts)]),
        np.concatenate([np.zeros(0, dtype=np.uint64), *(p.span_ids for p in parts)]),
        [t for p in parts for t in p.trace_ids],
        np.concatenate([np.zeros(0, dtype=np.int64), *(p.values for p in parts)]),
    )


def group_points(
    values: ProfileValues,
    labels_of: Mapping[int, Mapping[str, str]],
    group_by: Sequence[str],
    by_span: bool,
) -> Points:
    """The points of ``values`` (per profile, or per span merged within each group: see
    :class:`Points`), each with the group of its series."""
    n = len(values.values)
    sids = np.asarray(values.series_ids, dtype=np.int64)
    index: Dict[Group, int] = {}
    distinct, inverse = np.unique(sids, return_inverse=True)
    group_ids = [
        index.setdefault(group_of(labels_of[s], group_by), len(index)) for s in distinct.tolist()
    ]
    gid = np.asarray(group_ids, dtype=np.int64)[inverse.reshape(-1)] if n else np.zeros(0, np.int64)
    times = np.asarray(values.times, dtype=np.int64)
    vals = np.asarray(values.values, dtype=np.int64)
    spans = np.asarray(values.span_ids, dtype=np.uint64)
    common: Dict[str, Any] = dict(labels_of=labels_of, group_by=tuple(group_by), by_span=by_span)
    if not by_span:
        return Points(
            groups=list(index),
            group=gid,
            time_ns=times,
            value=vals,
            series_id=sids,
            span_id=spans,
            trace_id=list(values.trace_ids),
            member_start=np.arange(n + 1),
            member_series=sids,
            **common,
        )
    codes: Dict[Optional[str], int] = {}
    seen = np.fromiter(
        (codes.setdefault(t, len(codes)) for t in values.trace_ids), dtype=np.int64, count=n
    )
    # Codes in trace id order (none first), for Pyroscope's order of a ms's spans' points.
    names = sorted(codes, key=lambda t: t or "")
    rank = np.zeros(len(codes), dtype=np.int64)
    rank[[codes[t] for t in names]] = np.arange(len(names))
    trace_code = rank[seen]
    # Sorted by the merge key, stably: the store's time order stays within each run, and
    # each run is one point.
    key = lex_key(gid, times // MS, spans, trace_code)
    order = np.argsort(key, kind="stable")
    starts = run_starts(key[order])
    firsts = order[starts]
    summed = np.add.reduceat(vals[order], starts) if n else vals
    # As the stores do, a sum past MAX_SUM is MAX_SUM rather than a wrapped int64.
    approx = np.add.reduceat(vals[order].astype(np.float64), starts) if n else vals
    summed = np.where(approx >= MAX_SUM, MAX_SUM, summed)
    return Points(
        groups=list(index),
        group=gid[firsts],
        time_ns=times[firsts],
        value=summed,
        series_id=sids[firsts],
        span_id=spans[firsts],
        trace_id=[names[c] for c in trace_code[firsts].tolist()],
        member_start=np.append(starts, n),
        member_series=sids[order],
        **common,
    )


def top_per_step(points: Points, start_ns: int, step_ns: int) -> Dict[Tuple[Group, int], int]:
    """The largest point (its row; the earliest of equals) of each group and step of a
    timeline, by the group and the step's time T in milliseconds: the step covers
    (T - step, T], T = start + k * step, as the timeline's points.  Pyroscope keeps one
    exemplar per point."""
    if not len(points):
        return {}
    # Ceiling division (-(-x // step)) stays exact in int64 where float would round.
    step_of = start_ns - ((start_ns - points.time_ns) // step_ns) * step_ns
    key = lex_key(points.group, step_of)
    order = np.argsort(key, kind="stable")
    best = best_per_run(order, run_starts(key[order]), points.value)
    return {
        (points.groups[g], t // MS): i
        for g, t, i in zip(points.group[best].tolist(), step_of[best].tolist(), best.tolist())
    }
