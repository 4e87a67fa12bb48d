"""The ClickHouse store's profile reads: series (cached for a moment, merged with this server's
own) and sums of samples per stack, per label, per time bucket.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from hotspan.model.profile import MAX_SUM, Frame, ProfileType
from hotspan.store.base import (
    ProfileValues,
    SampleFilter,
    SeriesRecord,
    SpanValues,
    StackValues,
    TraceValues,
)
from hotspan.store.batching import remember_series
from hotspan.store.clickhouse_connection import Clients, chunks, in_list

log = logging.getLogger(__name__)

# Series and settings rules are read again after this long: a server sees what another wrote
# within it.
SERIES_CACHE_S = 2.0
_CLAMPED_SUM = f"toInt64(least(sum(toInt128(value)), {MAX_SUM}))"


class ClickHouseProfiles:
    """Series and samples, for :class:`~hotspan.store.clickhouse.ClickHouseStore`."""

    # The store's state that this part reads and changes.
    _clients: Clients
    _series_lock: threading.Lock
    _series: Dict[str, Tuple[float, Dict[int, SeriesRecord]]]
    _own_series: Dict[str, Dict[int, SeriesRecord]]

    def _remember_series(self, rows: Sequence[list]) -> None:
        with self._series_lock:
            remember_series(self._own_series, rows)

    def series(self, tenant: str) -> List[SeriesRecord]:
        with self._series_lock:
            cached = self._series.get(tenant)
        if cached is None or time.monotonic() - cached[0] >= SERIES_CACHE_S:
            fetched_at = time.monotonic()
            by_id = self._read_series(tenant)
            with self._series_lock:
                self._series[tenant] = cached = (fetched_at, by_id)
        with self._series_lock:
            merged = dict(cached[1])
            for sid, own in self._own_series.get(tenant, {}).items():
                rec = merged.get(sid)
                if rec is None:
                    merged[sid] = own
                elif own.first_ts < rec.first_ts or own.last_ts > rec.last_ts:
                    merged[sid] = SeriesRecord(
                        sid,
                        rec.profile_type,
                        rec.labels,
                        min(rec.first_ts, own.first_ts),
                        max(rec.last_ts, own.last_ts),
                    )
        return list(merged.values())

    def _read_series(self, tenant: str) -> Dict[int, SeriesRecord]:
        rows = self._clients.query(
            "SELECT series_id, any(profile_type), any(labels), min(first_ts), max(last_ts) "
            "FROM series WHERE tenant = %(tenant)s GROUP BY series_id",
            {"tenant": tenant},
        ).result_rows
        by_id: Dict[int, SeriesRecord] = {}
        for sid, ptype, labels, first, last in rows:
            try:
                by_id[sid] = SeriesRecord(
                    sid, ProfileType.parse(ptype), json.loads(labels), first, last
                )
            except (ValueError, TypeError) as exc:
                log.error("skipping unreadable series %s of tenant %s: %s", sid, tenant, exc)
        return by_id

    # -- samples -------------------------------------------------------------------------------

    def _sample_where(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> Tuple[str, Dict[str, Any]]:
        sql = (
            f"tenant = %(tenant)s AND series_id IN {in_list(series_ids)} "
            "AND ts >= %(start)s AND ts < %(end)s"
        )
        params: Dict[str, Any] = {
            "tenant": tenant,
            "start": int(where.start_ns),
            "end": int(where.end_ns),
        }
        if where.span_ids is not None:
            sql += f" AND span_id IN {in_list(where.span_ids)}"
        if where.trace_ids is not None:
            traces = "trace_id IN %(traces)s"
            params["traces"] = tuple(t.lower() for t in where.trace_ids) or ("-",)
            if where.trace_span_ids:
                traces = (
                    f"({traces} OR (trace_id = '' AND span_id IN {in_list(where.trace_span_ids)}))"
                )
            sql += f" AND {traces}"
        if where.stack_ids is not None:
            sql += f" AND stack_id IN {in_list(where.stack_ids)}"
        return sql, params

    def _columns(
        self, sql: str, width: int, parameters: Optional[Mapping[str, Any]] = None
    ) -> List[Sequence[Any]]:
        """The ``width`` columns of a query's result (empty ones when no row matched)."""
        columns = self._clients.query(sql, parameters).result_columns
        return list(columns) if columns else [[] for _ in range(width)]

    def _sums_by(
        self, column: str, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> Tuple[Sequence[Any], np.ndarray]:
        if not series_ids:
            return [], np.zeros(0, dtype=np.int64)
        cond, params = self._sample_where(tenant, series_ids, where)
        if column == "trace_id":
            cond += " AND trace_id != ''"
        keys, values = self._columns(
            f"SELECT {column}, {_CLAMPED_SUM} FROM samples WHERE {cond} GROUP BY {column}",
            2,
            params,
        )
        return keys, np.asarray(values, dtype=np.int64)

    def stack_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> StackValues:
        keys, values = self._sums_by("stack_id", tenant, series_ids, where)
        return StackValues(np.asarray(keys, dtype=np.int64), values)

    def span_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> SpanValues:
        keys, values = self._sums_by("span_id", tenant, series_ids, where)
        return SpanValues(np.asarray(keys, dtype=np.uint64), values)

    def trace_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> TraceValues:
        keys, values = self._sums_by("trace_id", tenant, series_ids, where)
        return TraceValues([str(k) for k in keys], values)

    def profile_values(
        self,
        tenant: str,
        series_ids: Sequence[int],
        where: SampleFilter,
        by_span: bool = False,
        limit: int = 1_000_000,
    ) -> ProfileValues:
        keys = "ts, series_id, span_id, trace_id" if by_span else "ts, series_id"
        width = 5 if by_span else 3
        cols: List[Sequence[Any]] = [[] for _ in range(width)]
        if series_ids:
            cond, params = self._sample_where(tenant, series_ids, where)
            if by_span:
                cond += " AND span_id != 0"
            params["limit"] = int(limit)
            cols = self._columns(
                f"SELECT {keys}, {_CLAMPED_SUM} FROM samples WHERE {cond} "
                f"GROUP BY {keys} ORDER BY {keys} LIMIT %(limit)s",
                width,
                params,
            )
        n = len(cols[0])
        return ProfileValues(
            np.asarray(cols[1], dtype=np.int64),
            np.asarray(cols[0], dtype=np.int64),
            np.asarray(cols[2], dtype=np.uint64) if by_span else np.zeros(n, dtype=np.uint64),
            [str(t) or None for t in cols[3]] if by_span else [None] * n,
            np.asarray(cols[-1], dtype=np.int64),
        )

    def time_series(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter, step_ns: int
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        empty = np.zeros(0, dtype=np.int64)
        if not series_ids:
            return empty, empty, empty, empty
        cond, params = self._sample_where(tenant, series_ids, where)
        params["step"] = int(step_ns)
        # A point at T holds the samples in (T - step, T], as in Pyroscope.
        cols = self._columns(
            "SELECT series_id, %(start)s + intDiv(ts - %(start)s + %(step)s - 1, %(step)s) "
            f"* %(step)s AS bucket, {_CLAMPED_SUM}, uniqExact(ts) FROM samples WHERE {cond} "
            "GROUP BY series_id, bucket ORDER BY bucket, series_id",
            4,
            params,
        )
        if not len(cols[0]):
            return empty, empty, empty, empty
        sids, buckets, values, profiles = (np.asarray(c, dtype=np.int64) for c in cols)
        return sids, buckets, values, profiles

    def stacks(self, stack_ids: Sequence[int]) -> Dict[int, Tuple[int, ...]]:
        out: Dict[int, Tuple[int, ...]] = {}
        for part in chunks(list(stack_ids)):
            ids, frame_ids = self._columns(
                f"SELECT stack_id, any(frame_ids) FROM stacks WHERE stack_id IN {in_list(part)} "
                "GROUP BY stack_id",
                2,
            )
            out.update((int(s), tuple(f)) for s, f in zip(ids, frame_ids))
        return out

    def frames(self, frame_ids: Sequence[int]) -> Dict[int, Frame]:
        out: Dict[int, Frame] = {}
        for part in chunks(list(frame_ids)):
            rows = self._clients.query(
                "SELECT frame_id, any(name), any(filename), any(line) FROM frames "
                f"WHERE frame_id IN {in_list(part)} GROUP BY frame_id"
            ).result_rows
            out.update((fid, Frame(name, filename, line)) for fid, name, filename, line in rows)
        return out
