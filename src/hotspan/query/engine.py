"""Answers the questions the APIs ask, on top of any :class:`~hotspan.store.base.Store`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from hotspan.formats.pprof import Profile, ProfileBuilder
from hotspan.model.labels import (
    METRIC_NAME,
    PROFILE_TYPE,
    Selector,
    SelectorError,
    parse_selector,
)
from hotspan.model.profile import ProfileType
from hotspan.query import flamegraph
from hotspan.query.stacks import StackTable
from hotspan.store.base import SampleFilter, SeriesRecord, StackValues, Store

DEFAULT_MAX_NODES = 8192


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


class QueryEngine:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.stacks = StackTable(store)

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
        names = set()
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
    ) -> flamegraph.FlameGraph:
        _check_total(values)
        matrix, lengths, known = self._matrix(values.stack_ids)
        return flamegraph.build(matrix, lengths, values.values[known], self.stacks.names, max_nodes)

    def diff(
        self,
        left: StackValues,
        right: StackValues,
        max_nodes: Optional[int] = DEFAULT_MAX_NODES,
    ) -> flamegraph.FlameGraph:
        _check_total(left)
        _check_total(right)
        ids = np.concatenate([left.stack_ids, right.stack_ids])
        both = np.zeros((len(ids), 2), dtype=np.int64)
        both[: len(left.stack_ids), 0] = left.values
        both[len(left.stack_ids) :, 1] = right.values
        matrix, lengths, known = self._matrix(ids)
        return flamegraph.build(matrix, lengths, both[known], self.stacks.names, max_nodes)

    def pprof(
        self,
        profile_type: ProfileType,
        values: StackValues,
        where: SampleFilter,
        max_nodes: Optional[int] = None,
    ) -> Profile:
        rows = self.stacks.rows(values.stack_ids)
        known = rows >= 0
        matrix, lengths = self.stacks.matrix(rows[known], frames=True)
        vals = values.values[known]
        if max_nodes and len(vals) > max_nodes:
            keep = np.argsort(vals)[::-1][:max_nodes]
            matrix, lengths, vals = matrix[keep], lengths[keep], vals[keep]
        builder = ProfileBuilder.of_type(profile_type)
        frames = self.stacks.frames
        for row, length, value in zip(matrix.tolist(), lengths.tolist(), vals.tolist()):
            builder.add((frames[f] for f in row[:length]), value)
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
    ) -> List[TimeSeries]:
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
        return out


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
