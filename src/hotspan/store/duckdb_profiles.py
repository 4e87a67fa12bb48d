"""The embedded store's profile reads: series (all in memory) and sums of samples per stack,
per label, per time bucket.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterable, List, Sequence, Tuple

import duckdb
import numpy as np

from hotspan.model.profile import MAX_SUM, Frame
from hotspan.store.base import (
    ProfileValues,
    SampleFilter,
    SeriesRecord,
    SpanValues,
    StackValues,
    TraceValues,
)
from hotspan.store.batching import remember_series

# Sums are HUGEINT in DuckDB: clamp them so that they always fit (and add up) in int64.
_CLAMPED_SUM = f"least(sum(value), {MAX_SUM})::BIGINT"


class DuckDBProfiles:
    """Series and samples, for :class:`~hotspan.store.duckdb.DuckDBStore`."""

    # The store's state that this part reads and changes (and its cursor).
    _con: duckdb.DuckDBPyConnection
    _tenant_ids: Dict[str, int]
    _series_lock: threading.Lock
    _series: Dict[str, Dict[int, SeriesRecord]]
    _cursor: Callable[[], duckdb.DuckDBPyConnection]

    def _load_series(self) -> None:
        rows = self._con.execute(
            "SELECT s.tenant, s.series_id, s.profile_type, s.labels, b.lo, b.hi FROM series s "
            "JOIN tenants t ON t.tenant = s.tenant "
            "JOIN (SELECT tenant_id, series_id, min(ts) AS lo, max(ts) AS hi FROM samples "
            "      GROUP BY ALL) b ON b.tenant_id = t.tenant_id AND b.series_id = s.series_id"
        ).fetchall()
        self._remember_series(rows)

    def _has_series(self, tenant: str, sid: int) -> bool:
        return sid in self._series.get(tenant, ())

    def _remember_series(self, rows: Iterable[Sequence[Any]]) -> None:
        """Update the in-memory series; never raises (it runs after a commit, and at open)."""
        with self._series_lock:
            remember_series(self._series, rows)

    def series(self, tenant: str) -> List[SeriesRecord]:
        with self._series_lock:
            return list(self._series.get(tenant, {}).values())

    def _sample_where(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> Tuple[str, list]:
        sql = "tenant_id = ? AND series_id IN (SELECT unnest(?::BIGINT[])) AND ts >= ? AND ts < ?"
        params: list = [
            self._tenant_ids.get(tenant, -1),
            list(series_ids),
            where.start_ns,
            where.end_ns,
        ]
        if where.span_ids is not None:
            sql += " AND span_id IN (SELECT unnest(?::UBIGINT[]))"
            params.append(list(where.span_ids))
        if where.trace_ids is not None:
            traces = "trace_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append([t.lower() for t in where.trace_ids])
            if where.trace_span_ids:
                traces = (
                    f"({traces} OR (coalesce(trace_id, '') = '' AND span_id IN "
                    "(SELECT unnest(?::UBIGINT[]))))"
                )
                params.append([int(s) for s in where.trace_span_ids])
            sql += f" AND {traces}"
        if where.stack_ids is not None:
            sql += " AND stack_id IN (SELECT unnest(?::BIGINT[]))"
            params.append([int(s) for s in where.stack_ids])
        return sql, params

    def stack_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> StackValues:
        stack_ids, values = self._sums_by("stack_id", tenant, series_ids, where)
        return StackValues(stack_ids.astype(np.int64), values)

    def _sums_by(
        self, column: str, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> Tuple[np.ndarray, np.ndarray]:
        """Sum of sample values per distinct ``column`` (a sample column name)."""
        if not series_ids:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        cond, params = self._sample_where(tenant, series_ids, where)
        result = (
            self._cursor()
            .execute(
                f"SELECT {column} AS k, {_CLAMPED_SUM} AS v FROM samples WHERE {cond} "
                f"GROUP BY {column}",
                params,
            )
            .fetchnumpy()
        )
        return np.asarray(result["k"]), np.asarray(result["v"], dtype=np.int64)

    def time_series(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter, step_ns: int
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if not series_ids:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty, empty, empty
        cond, params = self._sample_where(tenant, series_ids, where)
        # A point at T holds the samples in (T - step, T], as in Pyroscope.
        result = (
            self._cursor()
            .execute(
                f"SELECT series_id, ? + ((ts - ? + ? - 1) // ?) * ? AS bucket, "
                f"{_CLAMPED_SUM} AS v, count(DISTINCT ts) AS profiles "
                f"FROM samples WHERE {cond} GROUP BY ALL ORDER BY bucket",
                [where.start_ns, where.start_ns, step_ns, step_ns, step_ns, *params],
            )
            .fetchnumpy()
        )
        return (
            np.asarray(result["series_id"], dtype=np.int64),
            np.asarray(result["bucket"], dtype=np.int64),
            np.asarray(result["v"], dtype=np.int64),
            np.asarray(result["profiles"], dtype=np.int64),
        )

    def stacks(self, stack_ids: Sequence[int]) -> Dict[int, Tuple[int, ...]]:
        if len(stack_ids) == 0:
            return {}
        rows = (
            self._cursor()
            .execute(
                "SELECT stack_id, frame_ids FROM stacks "
                "WHERE stack_id IN (SELECT unnest(?::BIGINT[]))",
                [[int(s) for s in stack_ids]],
            )
            .fetchall()
        )
        return {sid: tuple(np.frombuffer(blob, dtype="<i8").tolist()) for sid, blob in rows}

    def frames(self, frame_ids: Sequence[int]) -> Dict[int, Frame]:
        if len(frame_ids) == 0:
            return {}
        rows = (
            self._cursor()
            .execute(
                "SELECT frame_id, name, filename, line FROM frames "
                "WHERE frame_id IN (SELECT unnest(?::BIGINT[]))",
                [[int(f) for f in frame_ids]],
            )
            .fetchall()
        )
        return {fid: Frame(name, filename, line) for fid, name, filename, line in rows}

    def span_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> SpanValues:
        span_ids, values = self._sums_by("span_id", tenant, series_ids, where)
        return SpanValues(span_ids.astype(np.uint64), values)

    def trace_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> TraceValues:
        trace_ids, values = self._sums_by("trace_id", tenant, series_ids, where)
        keep = [i for i, t in enumerate(trace_ids.tolist()) if t]
        return TraceValues([str(trace_ids[i]) for i in keep], values[keep])

    def profile_values(
        self,
        tenant: str,
        series_ids: Sequence[int],
        where: SampleFilter,
        by_span: bool = False,
        limit: int = 1_000_000,
    ) -> ProfileValues:
        if not series_ids:
            return ProfileValues(
                np.zeros(0, dtype=np.int64),
                np.zeros(0, dtype=np.int64),
                np.zeros(0, dtype=np.uint64),
                [],
                np.zeros(0, dtype=np.int64),
            )
        cond, params = self._sample_where(tenant, series_ids, where)
        keys = "ts, series_id, span_id, trace_id" if by_span else "ts, series_id"
        if by_span:
            cond += " AND span_id != 0"
        rows = (
            self._cursor()
            .execute(
                f"SELECT {keys}, {_CLAMPED_SUM} AS v FROM samples WHERE {cond} "
                f"GROUP BY {keys} ORDER BY {keys} LIMIT ?",
                [*params, int(limit)],
            )
            .fetchnumpy()
        )
        n = len(rows["v"])
        return ProfileValues(
            np.asarray(rows["series_id"], dtype=np.int64),
            np.asarray(rows["ts"], dtype=np.int64),
            np.asarray(rows["span_id"], dtype=np.uint64)
            if by_span
            else np.zeros(n, dtype=np.uint64),
            [t or None for t in rows["trace_id"].tolist()] if by_span else [None] * n,
            np.asarray(rows["v"], dtype=np.int64),
        )
