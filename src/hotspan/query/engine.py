"""Answers the questions the APIs ask, on top of any :class:`~hotspan.store.base.Store`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from hotspan.formats.pprof import Profile, ProfileBuilder
from hotspan.model.labels import (
    METRIC_NAME,
    PROFILE_TYPE,
    Selector,
    SelectorError,
    parse_selector,
)
from hotspan.model.profile import MAX_SUM, Frame, ProfileType
from hotspan.query import flamegraph, heatmap
from hotspan.query.exemplars import (
    Exemplar,
    Points,
    concat_values,
    group_of,
    group_points,
    parse_profile_id,
    top_per_step,
)
from hotspan.query.flamegraph import FlameGraph
from hotspan.query.stacks import StackTable
from hotspan.store.base import ProfileValues, SampleFilter, SeriesRecord, StackValues, Store

DEFAULT_MAX_NODES = 8192
# Profiles (or spans in profiles) a heatmap or a timeline's exemplars read at most.
MAX_PROFILE_POINTS = 1_000_000
# Profiles a flame graph selects by id (``profile_id_selector``) at most: one read each.
MAX_PROFILE_IDS = 1_000
# A timeline's exemplars are read newest first in about this many windows of its steps.
EXEMPLAR_WINDOWS = 16


class QueryError(ValueError):
    """A query that cannot be answered as asked (bad selector, range, profile type...)."""


def synthetic_labels(ptype: ProfileType) -> Dict[str, str]:
    """Labels Pyroscope derives from the profile type; selectors and label APIs see them."""
    return {
        PROFILE_TYPE: ptype.id,
        "__type__": ptype.sample_type,
        "__unit__": ptype.sample_unit,
        "__period_type__": ptype.period_type,
        "__period_unit__": ptype.period_unit,
    }


def all_labels(record: SeriesRecord) -> Dict[str, str]:
    labels = dict(record.labels)
    labels.setdefault(METRIC_NAME, record.profile_type.name)
    labels.update(synthetic_labels(record.profile_type))
    return labels


@dataclass
class TimeSeries:
    labels: Dict[str, str]
    timestamps_ms: List[int]
    values: List[float]
    # Per point, the exemplars behind it (when asked for): at most one, the largest.
    exemplars: List[List[Exemplar]] = field(default_factory=list)


@dataclass
class QueryAnalysis:
    """What a query over a time range reads, for AnalyzeQuery: the tenant's series, profiles
    and an estimate of their bytes in the range, and the series the query selects."""

    series: int
    profiles: int
    bytes: int
    queried_series: int


class QueryEngine:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.stacks = StackTable(store)
        self.max_points = MAX_PROFILE_POINTS

    # -- series ------------------------------------------------------------------------------

    def find_series(
        self,
        tenant: str,
        selectors: Sequence[Selector],
        start_ns: int,
        end_ns: int,
        profile_type: Optional[ProfileType] = None,
    ) -> List[SeriesRecord]:
        """Series overlapping the range that match any of the selectors (all if none)."""
        out = []
        for rec in self.store.series(tenant):
            if profile_type is not None and rec.profile_type != profile_type:
                continue
            if not rec.overlaps(start_ns, end_ns):
                continue
            if selectors:
                labels = all_labels(rec)
                if not any(_selector_matches(sel, labels) for sel in selectors):
                    continue
            out.append(rec)
        return out

    def profile_types(self, tenant: str, start_ns: int, end_ns: int) -> List[ProfileType]:
        types = {rec.profile_type for rec in self.find_series(tenant, [], start_ns, end_ns)}
        return sorted(types, key=lambda t: t.id)

    def label_names(
        self, tenant: str, matchers: Sequence[str], start_ns: int, end_ns: int
    ) -> List[str]:
        names: Set[str] = set()
        for rec in self.find_series(tenant, parse_selectors(matchers), start_ns, end_ns):
            names.update(all_labels(rec))
        return sorted(names)

    def label_values(
        self, tenant: str, name: str, matchers: Sequence[str], start_ns: int, end_ns: int
    ) -> List[str]:
        values = set()
        for rec in self.find_series(tenant, parse_selectors(matchers), start_ns, end_ns):
            value = all_labels(rec).get(name)
            if value:
                values.add(value)
        return sorted(values)

    def series_labels(
        self,
        tenant: str,
        matchers: Sequence[str],
        label_names: Sequence[str],
        start_ns: int,
        end_ns: int,
    ) -> List[Dict[str, str]]:
        seen = set()
        out = []
        for rec in self.find_series(tenant, parse_selectors(matchers), start_ns, end_ns):
            labels = all_labels(rec)
            if label_names:
                labels = {k: v for k, v in labels.items() if k in label_names}
            key = tuple(sorted(labels.items()))
            if key not in seen:
                seen.add(key)
                out.append(dict(key))
        return sorted(out, key=lambda d: sorted(d.items()))

    def analyze(
        self, tenant: str, selector: Optional[Selector], start_ns: int, end_ns: int
    ) -> QueryAnalysis:
        """Figures for AnalyzeQuery.  Profiles are counted per series and distinct sample
        time, as the store keeps them; the bytes are the store's size times the share of the
        tenant's profiles that fall in the range."""
        in_range = self.find_series(tenant, [], start_ns, end_ns)
        queried = self.find_series(tenant, [selector] if selector else [], start_ns, end_ns)
        profiles = self._profile_count(tenant, in_range, start_ns, end_ns)
        size = self.store.size_bytes() or 0
        estimate = 0
        if profiles and size:
            every = self.store.series(tenant)
            first = min(rec.first_ts for rec in every)
            last = max(rec.last_ts for rec in every) + 1
            total = self._profile_count(tenant, every, first, last)
            estimate = size * min(profiles, total) // max(total, 1)
        return QueryAnalysis(len(in_range), profiles, estimate, len(queried))

    def _profile_count(
        self, tenant: str, series: Sequence[SeriesRecord], start_ns: int, end_ns: int
    ) -> int:
        if not series:
            return 0
        where = SampleFilter(start_ns, end_ns)
        # One step for the whole range: the store counts each series' distinct sample times.
        _, _, _, counts = self.store.time_series(
            tenant, [s.series_id for s in series], where, max(end_ns - start_ns, 1)
        )
        return int(np.asarray(counts, dtype=np.int64).sum())

    # -- profiles ----------------------------------------------------------------------------

    def stack_values(
        self,
        tenant: str,
        profile_type: ProfileType,
        selector: Selector,
        where: SampleFilter,
    ) -> StackValues:
        series = self.find_series(tenant, [selector], where.start_ns, where.end_ns, profile_type)
        if not series:
            return StackValues.empty()
        return self.store.stack_values(tenant, [s.series_id for s in series], where)

    def filter_call_site(self, values: StackValues, call_site: Sequence[str]) -> StackValues:
        """Keep the stacks that start (at the root) with the given frame names."""
        if not call_site or len(values.stack_ids) == 0:
            return values
        matrix, lengths, known = self._matrix(values.stack_ids)
        wanted = np.array([self.stacks.find_name(n) for n in call_site], dtype=np.int64)
        if (wanted < 0).any():
            return StackValues.empty()  # a name no stored stack has
        depth = len(wanted)
        if matrix.shape[1] < depth:
            return StackValues.empty()
        hit = (matrix[:, :depth] == wanted[None, :]).all(axis=1)
        ids = values.stack_ids[known][hit]
        return StackValues(ids, values.values[known][hit])

    def name_matrix(self, values: StackValues) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The known stacks of ``values`` as root-first indexes into ``self.stacks.names``
        (an (n, depth) matrix padded with -1), each one's length, and its value."""
        matrix, lengths, known = self._matrix(values.stack_ids)
        return matrix, lengths, values.values[known]

    def _matrix(
        self, stack_ids: np.ndarray, frames: bool = False
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = self.stacks.rows(stack_ids)
        known = rows >= 0
        matrix, lengths = self.stacks.matrix(rows[known], frames=frames)
        return matrix, lengths, known

    def flamegraph(
        self, values: StackValues, max_nodes: Optional[int] = DEFAULT_MAX_NODES
    ) -> FlameGraph:
        _check_total(values)
        matrix, lengths, known = self._matrix(values.stack_ids)
        return flamegraph.build(matrix, lengths, values.values[known], self.stacks.names, max_nodes)

    def diff(
        self,
        left: StackValues,
        right: StackValues,
        max_nodes: Optional[int] = DEFAULT_MAX_NODES,
    ) -> FlameGraph:
        _check_total(left)
        _check_total(right)
        ids = np.concatenate([left.stack_ids, right.stack_ids])
        both = np.zeros((len(ids), 2), dtype=np.int64)
        both[: len(left.stack_ids), 0] = left.values
        both[len(left.stack_ids) :, 1] = right.values
        matrix, lengths, known = self._matrix(ids)
        return flamegraph.build(matrix, lengths, both[known], self.stacks.names, max_nodes)

    def tree(self, values: StackValues, max_nodes: Optional[int] = DEFAULT_MAX_NODES) -> bytes:
        """The stacks as Pyroscope's serialized tree (``format=PROFILE_FORMAT_TREE``)."""
        _check_total(values)
        matrix, lengths, known = self._matrix(values.stack_ids)
        return flamegraph.tree_bytes(
            matrix, lengths, values.values[known], self.stacks.names, max_nodes
        )

    def pprof(
        self,
        profile_type: ProfileType,
        values: StackValues,
        where: SampleFilter,
        max_nodes: Optional[int] = None,
    ) -> Profile:
        """The stacks as a pprof profile.  With ``max_nodes``, as Pyroscope truncates one:
        the frames of nodes lighter than the ``max_nodes``-th heaviest of the call tree
        become one frame named ``other`` under their parent, so no value is lost."""
        rows = self.stacks.rows(values.stack_ids)
        known = rows >= 0
        matrix, lengths = self.stacks.matrix(rows[known], frames=True)
        vals = values.values[known]
        frames = self.stacks.frames
        cols = np.arange(matrix.shape[1])
        valid = cols[None, :] < lengths[:, None]
        # Dense indexes instead of frame ids (signed hashes): -1 pads, len(ids) is "other".
        ids, dense = np.unique(matrix[valid], return_inverse=True)
        stacks: np.ndarray = np.full(matrix.shape, -1, dtype=np.int64)
        stacks[valid] = dense.reshape(-1)
        frame_of = [frames[f] for f in ids.tolist()] + [Frame(flamegraph.OTHER)]
        if max_nodes:
            _check_total(values)
            stacks, lengths, vals = flamegraph.truncated_stacks(
                stacks, lengths, vals, max_nodes, len(ids)
            )
        builder = ProfileBuilder.of_type(profile_type)
        for row, length, value in zip(stacks.tolist(), lengths.tolist(), vals.tolist()):
            builder.add((frame_of[f] for f in row[:length]), value)
        builder.profile.time_nanos = where.start_ns
        builder.profile.duration_nanos = max(where.end_ns - where.start_ns, 0)
        return builder.profile

    def select_series(
        self,
        tenant: str,
        profile_type: ProfileType,
        selector: Selector,
        where: SampleFilter,
        step_ns: int,
        group_by: Sequence[str],
        average: bool = False,
        limit: Optional[int] = None,
        exemplars: Optional[str] = None,
    ) -> List[TimeSeries]:
        """The summed (or per-profile average) value per step of each group of series;
        with ``exemplars`` ("individual" or "span") each point also names its largest
        profile or span."""
        series = self.find_series(tenant, [selector], where.start_ns, where.end_ns, profile_type)
        if not series:
            return []
        sids, buckets, sums, profiles = self.store.time_series(
            tenant, [s.series_id for s in series], where, step_ns
        )
        group_of: Dict[int, Tuple[Tuple[str, str], ...]] = {}
        for rec in series:
            labels = all_labels(rec)
            group_of[rec.series_id] = tuple((name, labels.get(name, "")) for name in group_by)
        # group -> point -> [sum, number of profiles]: Pyroscope's average is per profile.
        acc: Dict[Tuple[Tuple[str, str], ...], Dict[int, List[float]]] = {}
        for sid, bucket, value, count in zip(
            sids.tolist(), buckets.tolist(), sums.tolist(), profiles.tolist()
        ):
            cell = acc.setdefault(group_of[sid], {}).setdefault(bucket, [0.0, 0])
            cell[0] += value
            cell[1] += count
        out = []
        for group, points in acc.items():
            ordered = sorted(points.items())
            out.append(
                TimeSeries(
                    labels={k: v for k, v in group if v},
                    timestamps_ms=[b // 1_000_000 for b, _ in ordered],
                    values=[c[0] / c[1] if average else c[0] for _, c in ordered],
                )
            )
        out.sort(key=lambda ts: -sum(ts.values))
        if limit:
            out = out[:limit]
        if exemplars:
            self._attach_exemplars(tenant, series, where, step_ns, group_by, exemplars, out)
        return out

    def _attach_exemplars(
        self,
        tenant: str,
        series: Sequence[SeriesRecord],
        where: SampleFilter,
        step_ns: int,
        group_by: Sequence[str],
        kind: str,
        found: List[TimeSeries],
    ) -> None:
        points = self._recent_points(tenant, series, where, step_ns, group_by, kind == "span")
        best = top_per_step(points, where.start_ns, step_ns)
        for ts in found:
            group = group_of(ts.labels, group_by)
            rows = [best.get((group, t)) for t in ts.timestamps_ms]
            ts.exemplars = [[points.exemplar(i)] if i is not None else [] for i in rows]

    def _recent_points(
        self,
        tenant: str,
        series: Sequence[SeriesRecord],
        where: SampleFilter,
        step_ns: int,
        group_by: Sequence[str],
        by_span: bool,
    ) -> Points:
        """The points of as many of the timeline's latest steps as ``max_points`` allows: past
        it, the oldest steps go without exemplars (the recent ones are those looked at), and
        the timeline still draws.  Then read again newest first, in windows of whole steps, so
        that every step read is read entire and its exemplar is its largest point."""
        sids = [s.series_id for s in series]
        labels_of = {s.series_id: all_labels(s) for s in series}
        whole = self.store.profile_values(tenant, sids, where, by_span, self.max_points + 1)
        if len(whole.values) <= self.max_points:  # the usual case: one read
            return group_points(whole, labels_of, group_by, by_span)
        del whole  # a million rows: not kept while the windows are read
        steps = -(-(where.end_ns - where.start_ns) // step_ns)
        per_window = -(-steps // EXEMPLAR_WINDOWS)
        parts: List[ProfileValues] = []
        budget, high, k = self.max_points, where.end_ns, steps
        while high > where.start_ns and budget > 0:
            k -= per_window
            # Step T = start + k * step holds (T - step, T]: a window starts just after a T.
            low = where.start_ns + k * step_ns + 1 if k > 0 else where.start_ns
            window = where._replace(start_ns=low, end_ns=high, stack_ids=None)
            part = self.store.profile_values(tenant, sids, window, by_span, budget + 1)
            if len(part.values) > budget:
                break
            parts.append(part)
            budget, high = budget - len(part.values), low
        parts.reverse()  # time order, as one read gives
        return group_points(concat_values(parts), labels_of, group_by, by_span)

    def _points(
        self,
        tenant: str,
        series: Sequence[SeriesRecord],
        where: SampleFilter,
        group_by: Sequence[str],
        by_span: bool,
    ) -> Points:
        """The profiles (or spans within profiles) of the series, see group_points; a
        QueryError past ``max_points`` (a heatmap counts them all or says so)."""
        values = self.store.profile_values(
            tenant, [s.series_id for s in series], where, by_span, self.max_points + 1
        )
        if len(values.values) > self.max_points:
            raise QueryError(
                f"over {self.max_points} profiles in the range; narrow the range or the selector"
            )
        labels_of = {s.series_id: all_labels(s) for s in series}
        return group_points(values, labels_of, group_by, by_span)

    def heatmap(
        self,
        tenant: str,
        profile_type: ProfileType,
        selector: Selector,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        group_by: Sequence[str],
        by_span: bool,
        with_exemplars: bool,
        limit: Optional[int] = None,
    ) -> Tuple[List[heatmap.Heatmap], List[int]]:
        """Heatmaps of the profiles (or spans) of each group of series, and the lower bounds
        of their value buckets.  The slot at ``start`` holds (start - step, start], so the
        profiles of the step before the range count."""
        ms = 1_000_000
        where = SampleFilter(max(start_ms - step_ms, 0) * ms, (end_ms + 1) * ms)
        series = self.find_series(tenant, [selector], where.start_ns, where.end_ns, profile_type)
        points = self._points(tenant, series, where, group_by, by_span)
        return heatmap.build(points, start_ms, end_ms, step_ms, with_exemplars, limit)

    def profile_stack_values(
        self,
        tenant: str,
        profile_type: ProfileType,
        selector: Selector,
        where: SampleFilter,
        profile_ids: Sequence[str],
    ) -> StackValues:
        """Per-stack sums of the named profiles (ids from exemplars) among the series the
        selector picks, within the filter."""
        wanted: Dict[int, List[int]] = {}
        for text in profile_ids:
            try:
                sid, ts = parse_profile_id(text)
            except ValueError as exc:
                raise QueryError(str(exc)) from None
            if where.start_ns <= ts < where.end_ns:
                wanted.setdefault(sid, []).append(ts)
        series = self.find_series(tenant, [selector], where.start_ns, where.end_ns, profile_type)
        # One read per profile: a bounded number of them (Grafana's link names one).
        reads = [
            (rec.series_id, ts)
            for rec in series
            for ts in sorted(set(wanted.get(rec.series_id, ())))
        ]
        if len(reads) > MAX_PROFILE_IDS:
            raise QueryError(
                f"{len(reads)} profiles selected by id; at most {MAX_PROFILE_IDS} at a time"
            )
        parts = [
            self.store.stack_values(
                tenant, [sid], where._replace(start_ns=ts, end_ns=ts + 1, stack_ids=None)
            )
            for sid, ts in reads
        ]
        if not parts:
            return StackValues.empty()
        if len(parts) == 1:
            return parts[0]
        ids = np.concatenate([p.stack_ids for p in parts])
        vals = np.concatenate([p.values for p in parts])
        unique, inverse = np.unique(ids, return_inverse=True)
        sums = np.zeros(len(unique), dtype=np.int64)
        np.add.at(sums, inverse, vals)
        # As the stores sum: past MAX_SUM a stack's sum is MAX_SUM, not a wrapped int64.
        approx = np.zeros(len(unique), dtype=np.float64)
        np.add.at(approx, inverse, vals.astype(np.float64))
        return StackValues(unique, np.where(approx >= MAX_SUM, MAX_SUM, sums))


def _check_total(values: StackValues) -> None:
    # Each per-stack sum is clamped below 2^62; their total must fit in int64 as well.
    if float(values.values.astype(np.float64).sum()) >= 2.0**63:
        raise QueryError("the selected samples add up past 64 bits; narrow the selection")


def _selector_matches(selector: Selector, labels: Mapping[str, str]) -> bool:
    # ``process_cpu:cpu:...{}`` names a profile type; a plain metric is ``__name__``.
    if selector.metric and selector.metric not in (
        labels.get(METRIC_NAME),
        labels.get(PROFILE_TYPE),
    ):
        return False
    return selector.matches(labels)


def parse_selectors(texts: Iterable[str]) -> List[Selector]:
    out = []
    for text in texts:
        try:
            out.append(parse_selector(text))
        except SelectorError as exc:
            raise QueryError(f"bad label selector {text!r}: {exc}") from None
    return out
