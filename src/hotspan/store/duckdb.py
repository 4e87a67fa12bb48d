"""The embedded store: one DuckDB file in the data directory.

Stacks are kept in a hashed stack table (stack id -> frame ids, root first), the way Parca,
Coroot and qryn store them, rather than in Pyroscope's per-block parent-pointer tree.  A
content hash needs no coordination between writers and no read before a write, and the query
side does not need a tree on disk: it sums samples per stack in SQL and builds the flame graph
from those sums with vectorised array operations (``hotspan.query.flamegraph``).  Samples are
appended in arrival order, which is roughly time order, so DuckDB's per-row-group min/max
indexes skip most of the table for a short time range.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from concurrent.futures import Future
from typing import Dict, List, Sequence, Tuple

import duckdb
import numpy as np

from hotspan.model.profile import MAX_SUM, Frame, IngestBatch, ProfileType, SampleColumns
from hotspan.store.base import SampleFilter, SeriesRecord, StackValues, Store, StoreError
from hotspan.store.batching import GroupCommitWriter

SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    tenant VARCHAR NOT NULL,
    series_id BIGINT NOT NULL,
    profile_type VARCHAR NOT NULL,
    labels VARCHAR NOT NULL,          -- JSON object
    PRIMARY KEY (tenant, series_id)
);
CREATE TABLE IF NOT EXISTS frames (
    frame_id BIGINT PRIMARY KEY,
    name VARCHAR NOT NULL,
    filename VARCHAR NOT NULL,
    line BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS stacks (
    stack_id BIGINT PRIMARY KEY,
    frame_ids BLOB NOT NULL           -- little-endian int64 frame ids, root first
);
CREATE TABLE IF NOT EXISTS tenants (
    tenant_id INTEGER PRIMARY KEY,
    tenant VARCHAR NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS samples (
    tenant_id INTEGER NOT NULL,       -- tenants.tenant_id: a number per row, not a string
    series_id BIGINT NOT NULL,
    ts BIGINT NOT NULL,               -- nanoseconds since the epoch
    stack_id BIGINT NOT NULL,
    value BIGINT NOT NULL,
    span_id UBIGINT NOT NULL,         -- 0: no span
    trace_id VARCHAR                  -- 32 hex digits or NULL
);
"""

DB_FILE = "hotspan.duckdb"
# Sums are HUGEINT in DuckDB: clamp them so that they always fit (and add up) in int64.
_CLAMPED_SUM = f"least(sum(value), {MAX_SUM})::BIGINT"
log = logging.getLogger(__name__)


class DuckDBStore(Store):
    def __init__(self, data_dir: str, threads: int = 0) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.path = os.path.join(data_dir, DB_FILE)
        config = {"threads": threads} if threads else {}
        try:
            self._con = duckdb.connect(self.path, config=config)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        self._con.execute(SCHEMA)
        self._local = threading.local()
        self._series_lock = threading.Lock()
        self._series: Dict[str, Dict[int, SeriesRecord]] = {}
        self._load_series()
        self._tenant_ids: Dict[str, int] = dict(
            self._con.execute("SELECT tenant, tenant_id FROM tenants").fetchall()
        )
        # Ids already written by this process; a restart only costs redundant no-op inserts.
        self._known_frames: set = set()
        self._known_stacks: set = set()
        self._writer = GroupCommitWriter(self._commit)
        self._closed = False

    # -- writing -----------------------------------------------------------------------------

    def write(self, tenant: str, batch: IngestBatch) -> Future[None]:
        return self._writer.submit(tenant, batch)

    def _commit(self, pending: List[Tuple[str, IngestBatch]]) -> None:
        con = self._con
        frames: Dict[int, Frame] = {}
        stacks: Dict[int, Tuple[int, ...]] = {}
        series_rows: Dict[Tuple[str, int], list] = {}
        tenants: List[str] = []
        columns: List[SampleColumns] = []
        for tenant, batch in pending:
            new = batch.new_stacks(self._known_stacks)
            if new:
                wanted = {f for ids in new.values() for f in ids}
                wanted -= self._known_frames
                wanted -= frames.keys()
                if wanted:
                    frames.update(batch.frames_for(wanted))
                for sid, frame_ids in new.items():
                    stacks.setdefault(sid, frame_ids)
            cols = batch.columns()
            if len(cols.value):
                self._series_bounds(tenant, batch, cols, series_rows)
                tenants.append(tenant)
                columns.append(cols)

        con.execute("BEGIN TRANSACTION")
        try:
            if frames:
                frame_table = {  # noqa: F841 - read by DuckDB's replacement scan
                    "frame_id": np.fromiter(frames.keys(), dtype=np.int64, count=len(frames)),
                    "name": np.array([f.name for f in frames.values()], dtype=object),
                    "filename": np.array([f.filename for f in frames.values()], dtype=object),
                    "line": np.array([f.line for f in frames.values()], dtype=np.int64),
                }
                con.execute("INSERT INTO frames SELECT * FROM frame_table ON CONFLICT DO NOTHING")
            if stacks:
                # Hex text: DuckDB 1.x reads an array of Python bytes as VARCHAR, not BLOB.
                stack_table = {  # noqa: F841
                    "stack_id": np.fromiter(stacks.keys(), dtype=np.int64, count=len(stacks)),
                    "frame_ids": np.array(
                        [np.asarray(f, dtype="<i8").tobytes().hex() for f in stacks.values()],
                        dtype=object,
                    ),
                }
                con.execute(
                    "INSERT INTO stacks SELECT stack_id, unhex(frame_ids) FROM stack_table "
                    "ON CONFLICT DO NOTHING"
                )
            new_series = [
                row
                for (tenant, sid), row in series_rows.items()
                if not self._has_series(tenant, sid)
            ]
            if new_series:
                # Only new series are written: their time bounds live in memory and are
                # recomputed from the samples at open, so a push never updates a series row.
                rows = list(zip(*new_series))
                series_table = {  # noqa: F841
                    "tenant": np.array(rows[0], dtype=object),
                    "series_id": np.array(rows[1], dtype=np.int64),
                    "profile_type": np.array(rows[2], dtype=object),
                    "labels": np.array(rows[3], dtype=object),
                }
                con.execute("INSERT INTO series SELECT * FROM series_table ON CONFLICT DO NOTHING")
            if columns:
                counts = [len(c.value) for c in columns]
                tenant_ids = [self._tenant_id(con, t) for t in tenants]
                sample_table = {  # noqa: F841
                    "tenant_id": np.repeat(np.array(tenant_ids, dtype=np.int32), counts),
                    **{
                        name: np.concatenate([getattr(c, name) for c in columns])
                        for name in SampleColumns._fields
                    },
                }
                # Reading Python objects is the slow part of an insert: skip the trace
                # column when no sample of the commit has a trace id.
                traced = any(t is not None for c in columns for t in c.trace_id.tolist())
                con.execute(
                    "INSERT INTO samples SELECT tenant_id, series_id, ts, stack_id, value, "
                    f"span_id, {'trace_id' if traced else 'NULL'} FROM sample_table"
                )
            con.execute("COMMIT")
        except Exception:
            with contextlib.suppress(duckdb.Error):  # a failed COMMIT has already rolled back
                con.execute("ROLLBACK")
            # Tenants numbered in the failed transaction do not exist.
            self._tenant_ids = dict(con.execute("SELECT tenant, tenant_id FROM tenants").fetchall())
            raise
        if len(self._known_frames) > 2_000_000:
            self._known_frames.clear()
        if len(self._known_stacks) > 2_000_000:
            self._known_stacks.clear()
        self._known_frames.update(frames)
        self._known_stacks.update(stacks)
        self._remember_series(series_rows.values())

    def _tenant_id(self, con: duckdb.DuckDBPyConnection, tenant: str) -> int:
        """The number of a tenant, created inside the running transaction if new."""
        tid = self._tenant_ids.get(tenant)
        if tid is None:
            tid = len(self._tenant_ids) + 1
            con.execute("INSERT INTO tenants VALUES (?, ?)", [tid, tenant])
            self._tenant_ids[tenant] = tid
        return tid

    @staticmethod
    def _series_bounds(
        tenant: str, batch: IngestBatch, cols: SampleColumns, out: Dict[Tuple[str, int], list]
    ) -> None:
        """First and last sample time of every series in the batch."""
        order = np.argsort(cols.series_id, kind="stable")
        sids = cols.series_id[order]
        ts = cols.ts[order]
        starts = np.flatnonzero(np.concatenate(([True], sids[1:] != sids[:-1])))
        lows = np.minimum.reduceat(ts, starts)
        highs = np.maximum.reduceat(ts, starts)
        for sid, lo, hi in zip(sids[starts].tolist(), lows.tolist(), highs.tolist()):
            row = out.get((tenant, sid))
            if row is None:
                info = batch.series[sid]
                out[(tenant, sid)] = [
                    tenant,
                    sid,
                    info.profile_type.id,
                    json.dumps(dict(info.labels)),
                    lo,
                    hi,
                ]
            else:
                row[4], row[5] = min(row[4], lo), max(row[5], hi)

    # -- reading -----------------------------------------------------------------------------

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        if self._closed:
            raise StoreError("store is closed")
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._con.cursor()
            self._local.cursor = cur
        return cur

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

    def _remember_series(self, rows) -> None:  # type: ignore[no-untyped-def]
        """Update the in-memory series; never raises (it runs after a commit, and at open)."""
        with self._series_lock:
            for tenant, sid, ptype, labels, first, last in rows:
                by_id = self._series.setdefault(tenant, {})
                old = by_id.get(sid)
                try:
                    if old is not None:
                        first, last = min(first, old.first_ts), max(last, old.last_ts)
                        record = SeriesRecord(sid, old.profile_type, old.labels, first, last)
                    else:
                        record = SeriesRecord(
                            sid, ProfileType.parse(ptype), json.loads(labels), first, last
                        )
                except (ValueError, TypeError) as exc:
                    log.error("skipping unreadable series %s of tenant %s: %s", sid, tenant, exc)
                    continue
                by_id[sid] = record

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
            sql += " AND trace_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append([t.lower() for t in where.trace_ids])
        return sql, params

    def stack_values(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> StackValues:
        if not series_ids:
            return StackValues.empty()
        cond, params = self._sample_where(tenant, series_ids, where)
        result = (
            self._cursor()
            .execute(
                f"SELECT stack_id, {_CLAMPED_SUM} AS v FROM samples WHERE {cond} GROUP BY stack_id",
                params,
            )
            .fetchnumpy()
        )
        return StackValues(
            np.asarray(result["stack_id"], dtype=np.int64), np.asarray(result["v"], dtype=np.int64)
        )

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

    def close(self) -> None:
        if self._closed:
            return
        self._writer.close()
        self._closed = True
        self._con.close()
