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
import time
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import duckdb
import numpy as np

from hotspan.model.profile import MAX_SUM, Frame, IngestBatch, SampleColumns
from hotspan.model.trace import (
    Condition,
    SearchError,
    SpanBatch,
    SpanGroup,
    SpanRecord,
    SpanRow,
    StoredSpan,
    TraceQuery,
    TraceSummary,
)
from hotspan.store.base import (
    PARENT_LOOKBACK_NS,
    Document,
    ProfileValues,
    RetentionReport,
    SampleFilter,
    SeriesRecord,
    SettingsRule,
    SpanInfo,
    SpanValues,
    StackValues,
    Store,
    StoreClosed,
    StoreError,
    TraceValues,
)
from hotspan.store.batching import Batch, GroupCommitWriter, remember_series, series_bounds
from hotspan.store.search_sql import DUCKDB, Binder, search_sql, span_condition

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
CREATE TABLE IF NOT EXISTS span_groups (
    group_id BIGINT PRIMARY KEY,      -- content hash of resource and scope
    service VARCHAR NOT NULL,
    resource BLOB NOT NULL,           -- OTLP Resource message
    resource_schema_url VARCHAR NOT NULL,
    scope BLOB NOT NULL,              -- OTLP InstrumentationScope message
    scope_schema_url VARCHAR NOT NULL,
    attrs VARCHAR NOT NULL            -- resource attributes, flattened (model.trace)
);
CREATE TABLE IF NOT EXISTS spans (
    tenant_id INTEGER NOT NULL,
    trace_id VARCHAR NOT NULL,        -- 32 hex digits
    span_id UBIGINT NOT NULL,
    parent_span_id UBIGINT NOT NULL,  -- 0: a root span
    name VARCHAR NOT NULL,
    kind TINYINT NOT NULL,
    service VARCHAR NOT NULL,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    status_code TINYINT NOT NULL,
    attrs VARCHAR NOT NULL,           -- span attributes, flattened (model.trace)
    group_id BIGINT NOT NULL,
    raw BLOB NOT NULL                 -- the OTLP Span message as received
);
CREATE TABLE IF NOT EXISTS span_tags (
    tenant_id INTEGER NOT NULL,
    scope VARCHAR NOT NULL,           -- span, resource or intrinsic
    key VARCHAR NOT NULL,
    value VARCHAR NOT NULL,
    type VARCHAR NOT NULL,            -- TraceQL's: string, int, float, bool or keyword
    last_seen BIGINT NOT NULL,        -- end of a recent span with it (rewritten hourly)
    PRIMARY KEY (tenant_id, scope, key, value, type)
);
CREATE TABLE IF NOT EXISTS settings_rules (
    tenant VARCHAR NOT NULL,
    service VARCHAR NOT NULL,
    selector VARCHAR NOT NULL,
    settings VARCHAR NOT NULL,        -- JSON object
    version BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,       -- unix nanoseconds
    PRIMARY KEY (tenant, service, selector)
);
CREATE TABLE IF NOT EXISTS documents (
    tenant VARCHAR NOT NULL,
    kind VARCHAR NOT NULL,            -- alert_rule, alert_state, recording_rule...
    name VARCHAR NOT NULL,
    body VARCHAR NOT NULL,            -- JSON
    updated_at BIGINT NOT NULL,       -- unix nanoseconds
    PRIMARY KEY (tenant, kind, name)
);
CREATE TABLE IF NOT EXISTS settings_versions (
    tenant VARCHAR PRIMARY KEY,
    version BIGINT NOT NULL           -- also counts deletes, which leave no rule behind
);
"""

DB_FILE = "hotspan.duckdb"
# Values the tag-values API offers per attribute: past it, ids and timestamps would swamp it.
MAX_TAG_VALUES = 1000
# A tag already stored is written again only when seen this much later (for its last_seen).
TAG_REFRESH_NS = 3600 * 10**9
# Retention deletes at most this much time of samples (or spans) per writer job.
RETENTION_SLICE_NS = 3600 * 10**9
# Sums are HUGEINT in DuckDB: clamp them so that they always fit (and add up) in int64.
_CLAMPED_SUM = f"least(sum(value), {MAX_SUM})::BIGINT"
log = logging.getLogger(__name__)


@contextlib.contextmanager
def _transaction(con: Any, undo: Optional[Callable[[], None]] = None) -> Iterator[None]:
    """What the block writes, all or nothing; ``undo`` forgets what the block cached of a
    transaction that failed."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except Exception:
        with contextlib.suppress(duckdb.Error):  # a failed COMMIT has already rolled back
            con.execute("ROLLBACK")
        if undo is not None:
            undo()
        raise


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
        self._tenant_ids: Dict[str, int] = {}
        self._reload_tenant_ids()
        # Ids already written by this process; a restart only costs redundant no-op inserts.
        self._known_frames: set = set()
        self._known_stacks: set = set()
        self._known_groups: set = set()
        self._groups: Dict[int, SpanGroup] = {}
        # (tenant_id, scope, key, value, type) -> [last_seen written, latest seen]: the row is
        # rewritten only when an hour newer, retention goes by the latest;
        # (tenant_id, scope, key) -> how many values.
        self._tags: Dict[Tuple[int, str, str, str, str], List[int]] = {}
        self._tag_counts: Dict[Tuple[int, str, str], int] = {}
        for tid, scope, key, value, kind, seen in self._con.execute(
            "SELECT tenant_id, scope, key, value, type, last_seen FROM span_tags"
        ).fetchall():
            self._tags[(tid, scope, key, value, kind)] = [seen, seen]
            self._tag_counts[(tid, scope, key)] = self._tag_counts.get((tid, scope, key), 0) + 1
        # Rules are read on every agent upload: all of them live in memory, replaced (never
        # changed in place) by the writer thread after each commit.
        self._rules: Dict[str, Dict[Tuple[str, str], SettingsRule]] = {}
        self._versions: Dict[str, int] = dict(
            self._con.execute("SELECT tenant, version FROM settings_versions").fetchall()
        )
        for tenant, service, selector, settings, version, updated in self._con.execute(
            "SELECT tenant, service, selector, settings, version, updated_at FROM settings_rules"
        ).fetchall():
            try:
                rule = SettingsRule(service, selector, json.loads(settings), version, updated)
            except ValueError as exc:
                log.error("skipping unreadable settings rule of tenant %s: %s", tenant, exc)
                continue
            self._rules.setdefault(tenant, {})[(service, selector)] = rule
        self._writer = GroupCommitWriter(self._commit)
        self._closed = False

    # -- writing -----------------------------------------------------------------------------

    def write(self, tenant: str, batch: IngestBatch) -> Future[None]:
        return self._writer.submit(tenant, batch)

    def write_spans(self, tenant: str, spans: SpanBatch) -> Future[None]:
        return self._writer.submit(tenant, spans)

    def _commit(self, pending: List[Tuple[str, Batch]]) -> None:
        con = self._con
        frames: Dict[int, Frame] = {}
        stacks: Dict[int, Tuple[int, ...]] = {}
        series_rows: Dict[Tuple[str, int], list] = {}
        tenants: List[str] = []
        columns: List[SampleColumns] = []
        span_batches: List[Tuple[str, SpanBatch]] = []
        for tenant, batch in pending:
            if isinstance(batch, SpanBatch):
                span_batches.append((tenant, batch))
                continue
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
                series_bounds(tenant, batch, cols, series_rows)
                tenants.append(tenant)
                columns.append(cols)

        # Tenants numbered in a failed transaction do not exist.
        with _transaction(con, undo=self._reload_tenant_ids):
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
            new_groups, new_tags, seen_tags = self._insert_spans(con, span_batches)
        if len(self._known_frames) > 2_000_000:
            self._known_frames.clear()
        if len(self._known_stacks) > 2_000_000:
            self._known_stacks.clear()
        self._known_frames.update(frames)
        self._known_stacks.update(stacks)
        self._known_groups.update(new_groups)
        for tag, seen in new_tags.items():
            entry = self._tags.get(tag)
            if entry is None:
                count_key = tag[:3]
                self._tag_counts[count_key] = self._tag_counts.get(count_key, 0) + 1
                self._tags[tag] = [seen, seen]
            else:
                entry[0] = max(entry[0], seen)
                entry[1] = max(entry[1], seen)
        for tag, seen in seen_tags.items():
            entry = self._tags.get(tag)
            if entry is not None and entry[1] < seen:
                entry[1] = seen
        self._remember_series(series_rows.values())

    def _insert_spans(
        self, con: duckdb.DuckDBPyConnection, batches: List[Tuple[str, SpanBatch]]
    ) -> Tuple[set, Dict[Tuple[int, str, str, str, str], int], Dict[tuple, int]]:
        """Insert spans, their new groups and tags inside the running transaction; returns
        what to remember once it commits: new groups, tags written, tags seen not written."""
        if not batches:
            return set(), {}, {}
        groups: Dict[int, SpanGroup] = {}
        tags: Dict[Tuple[int, str, str, str, str], int] = {}
        seen_only: Dict[tuple, int] = {}
        new_per_key: Dict[Tuple[int, str, str], int] = {}
        rows: List[SpanRow] = []
        tenant_ids: List[int] = []
        for tenant, batch in batches:
            tid = self._tenant_id(con, tenant)
            rows.extend(batch.rows)
            tenant_ids.extend([tid] * len(batch.rows))
            for gid, group in batch.groups.items():
                if gid not in self._known_groups:
                    groups[gid] = group
            for (scope, key, value, kind), seen in batch.tags.items():
                tag = (tid, scope, key, value, kind)
                entry = self._tags.get(tag)
                if entry is None:
                    if tag not in tags:
                        # The cap counts the values of this commit too.
                        per_key = tag[:3]
                        known = self._tag_counts.get(per_key, 0) + new_per_key.get(per_key, 0)
                        if known >= MAX_TAG_VALUES:
                            continue
                        new_per_key[per_key] = new_per_key.get(per_key, 0) + 1
                elif seen < entry[0] + TAG_REFRESH_NS:
                    if seen_only.get(tag, 0) < seen:
                        seen_only[tag] = seen
                    continue
                if tags.get(tag, 0) < seen:
                    tags[tag] = seen
        if groups:
            g = list(groups.values())
            group_table = {  # noqa: F841 - read by DuckDB's replacement scan
                "group_id": np.fromiter(groups.keys(), dtype=np.int64, count=len(groups)),
                "service": np.array([x.service for x in g], dtype=object),
                "resource": np.array([x.resource.hex() for x in g], dtype=object),
                "resource_schema_url": np.array([x.resource_schema_url for x in g], dtype=object),
                "scope": np.array([x.scope.hex() for x in g], dtype=object),
                "scope_schema_url": np.array([x.scope_schema_url for x in g], dtype=object),
                "attrs": np.array([x.attrs for x in g], dtype=object),
            }
            con.execute(
                "INSERT INTO span_groups SELECT group_id, service, unhex(resource), "
                "resource_schema_url, unhex(scope), scope_schema_url, attrs FROM group_table "
                "ON CONFLICT DO NOTHING"
            )
        if rows:
            cols = list(zip(*rows))
            f = SpanRow._fields
            span_table = {  # noqa: F841
                "tenant_id": np.array(tenant_ids, dtype=np.int32),
                "trace_id": np.array(cols[f.index("trace_id")], dtype=object),
                "span_id": np.array(cols[f.index("span_id")], dtype=np.uint64),
                "parent_span_id": np.array(cols[f.index("parent_span_id")], dtype=np.uint64),
                "name": np.array(cols[f.index("name")], dtype=object),
                "kind": np.array(cols[f.index("kind")], dtype=np.int8),
                "service": np.array(cols[f.index("service")], dtype=object),
                "start_ns": np.array(cols[f.index("start_ns")], dtype=np.int64),
                "end_ns": np.array(cols[f.index("end_ns")], dtype=np.int64),
                "status_code": np.array(cols[f.index("status_code")], dtype=np.int8),
                "attrs": np.array(cols[f.index("attrs")], dtype=object),
                "group_id": np.array(cols[f.index("group_id")], dtype=np.int64),
                "raw": np.array([r.hex() for r in cols[f.index("raw")]], dtype=object),
            }
            con.execute(
                "INSERT INTO spans SELECT tenant_id, trace_id, span_id, parent_span_id, name, "
                "kind, service, start_ns, end_ns, status_code, attrs, group_id, unhex(raw) "
                "FROM span_table"
            )
        if tags:
            t = list(zip(*tags.keys()))
            tag_table = {  # noqa: F841
                "tenant_id": np.array(t[0], dtype=np.int32),
                "scope": np.array(t[1], dtype=object),
                "key": np.array(t[2], dtype=object),
                "value": np.array(t[3], dtype=object),
                "type": np.array(t[4], dtype=object),
                "last_seen": np.fromiter(tags.values(), dtype=np.int64, count=len(tags)),
            }
            con.execute(
                "INSERT INTO span_tags SELECT * FROM tag_table ON CONFLICT DO UPDATE "
                "SET last_seen = greatest(span_tags.last_seen, excluded.last_seen)"
            )
        return set(groups), tags, seen_only

    def _reload_tenant_ids(self) -> None:
        self._tenant_ids = dict(
            self._con.execute("SELECT tenant, tenant_id FROM tenants").fetchall()
        )

    def _tenant_id(self, con: duckdb.DuckDBPyConnection, tenant: str) -> int:
        """The number of a tenant, created inside the running transaction if new."""
        tid = self._tenant_ids.get(tenant)
        if tid is None:
            tid = len(self._tenant_ids) + 1
            con.execute("INSERT INTO tenants VALUES (?, ?)", [tid, tenant])
            self._tenant_ids[tenant] = tid
        return tid

    # -- reading -----------------------------------------------------------------------------

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        if self._closed:
            raise StoreClosed("store is closed")
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
            sql += " AND trace_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append([t.lower() for t in where.trace_ids])
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

    # -- traces ------------------------------------------------------------------------------

    def _span_groups(self, group_ids: Sequence[int]) -> Dict[int, SpanGroup]:
        missing = [g for g in set(group_ids) if g not in self._groups]
        if missing:
            rows = (
                self._cursor()
                .execute(
                    "SELECT group_id, service, resource, resource_schema_url, scope, "
                    "scope_schema_url, attrs FROM span_groups "
                    "WHERE group_id IN (SELECT unnest(?::BIGINT[]))",
                    [missing],
                )
                .fetchall()
            )
            if len(self._groups) > 100_000:
                self._groups = {}  # a new dict: readers holding the old one are unaffected
            for gid, *fields in rows:
                self._groups[gid] = SpanGroup(*fields)
        cache = self._groups
        return {g: group for g in group_ids if (group := cache.get(g)) is not None}

    def trace(self, tenant: str, trace_id: str) -> List[StoredSpan]:
        rows = (
            self._cursor()
            .execute(
                "SELECT trace_id, span_id, parent_span_id, name, kind, service, start_ns, "
                "end_ns, status_code, raw, group_id FROM spans "
                "WHERE tenant_id = ? AND trace_id = ?",
                [self._tenant_ids.get(tenant, -1), trace_id.lower()],
            )
            .fetchall()
        )
        groups = self._span_groups([r[-1] for r in rows])
        out = []
        seen = set()
        for *fields, gid in rows:
            if fields[1] in seen or gid not in groups:
                continue  # an export retried after it landed; a group lost to a crash
            seen.add(fields[1])
            out.append(StoredSpan(*fields, group=groups[gid]))
        return out

    def find_traces(self, tenant: str, query: TraceQuery) -> List[TraceSummary]:
        sql, params = search_sql(DUCKDB, self._tenant_ids.get(tenant, -1), query)
        try:
            rows = self._cursor().execute(sql, params).fetchall()
        except (duckdb.InvalidInputException, duckdb.ConversionException) as exc:
            # A regular expression RE2 refuses, a value of the wrong type: the query's fault.
            raise SearchError(str(exc).splitlines()[0]) from None
        # One row per (trace, matched span), traces in order.
        return TraceSummary.from_rows(rows)

    def span_traces(self, tenant: str, span_ids: Sequence[int]) -> Dict[int, str]:
        if not span_ids:
            return {}
        rows = (
            self._cursor()
            .execute(
                "SELECT span_id, any_value(trace_id) FROM spans WHERE tenant_id = ? "
                "AND span_id IN (SELECT unnest(?::UBIGINT[])) GROUP BY span_id",
                [self._tenant_ids.get(tenant, -1), [int(s) for s in span_ids]],
            )
            .fetchall()
        )
        return dict(rows)

    def span_infos(
        self,
        tenant: str,
        start_ns: int,
        end_ns: int,
        service: Optional[str] = None,
        trace_ids: Optional[Sequence[str]] = None,
        limit: int = 100_000,
        name: Optional[str] = None,
    ) -> List[SpanInfo]:
        sql = (
            "SELECT DISTINCT ON (trace_id, span_id) trace_id, span_id, parent_span_id, name, "
            "service, start_ns, end_ns FROM spans "
            "WHERE tenant_id = ? AND start_ns >= ? AND start_ns < ?"
        )
        params: list = [self._tenant_ids.get(tenant, -1), start_ns, end_ns]
        if service is not None:
            sql += " AND service = ?"
            params.append(service)
        if name is not None:
            sql += " AND name = ?"
            params.append(name)
        if trace_ids is not None:
            sql += " AND trace_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append([t.lower() for t in trace_ids])
        # DISTINCT ON: an export retried after it landed stores a span twice.
        sql = f"SELECT * FROM ({sql}) ORDER BY start_ns DESC, span_id LIMIT ?"
        params.append(int(limit))
        rows = self._cursor().execute(sql, params).fetchall()
        return [SpanInfo(*row) for row in rows]

    def span_records(
        self,
        tenant: str,
        start_ns: int,
        end_ns: int,
        conditions: Sequence[Condition] = (),
        trace_ids: Optional[Sequence[str]] = None,
        limit: int = 100_000,
    ) -> List[SpanRecord]:
        bind = Binder(
            DUCKDB,
            tenant=self._tenant_ids.get(tenant, -1),
            start=int(start_ns),
            end=int(end_ns),
            limit=max(int(limit), 0),
        )
        sql = (
            "SELECT DISTINCT ON (trace_id, span_id) trace_id, span_id, parent_span_id, name, "
            "kind, service, start_ns, end_ns, status_code, attrs, group_id FROM spans "
            "WHERE tenant_id = $tenant AND end_ns >= $start AND start_ns < $end"
        )
        for cond in conditions:
            sql += f" AND ({span_condition(cond, bind)})"
        if trace_ids is not None:
            traces = bind([t.lower() for t in trace_ids])
            sql += f" AND trace_id IN (SELECT unnest({traces}::VARCHAR[]))"
        sql = f"SELECT * FROM ({sql}) ORDER BY start_ns DESC, span_id LIMIT $limit"
        try:
            rows = self._cursor().execute(sql, bind.params).fetchall()
        except (duckdb.InvalidInputException, duckdb.ConversionException) as exc:
            raise SearchError(str(exc).splitlines()[0]) from None
        groups = self._span_groups([r[-1] for r in rows])
        return [
            SpanRecord(*fields, groups[gid].attrs if gid in groups else "") for *fields, gid in rows
        ]

    def count_local_roots(self, tenant: str, service: str, start_ns: int, end_ns: int) -> int:
        tid = self._tenant_ids.get(tenant, -1)
        row = (
            self._cursor()
            .execute(
                "WITH mine AS (SELECT DISTINCT trace_id, span_id, parent_span_id FROM spans "
                "WHERE tenant_id = ? AND service = ? AND start_ns >= ? AND start_ns < ?), "
                "parents AS (SELECT DISTINCT trace_id, span_id FROM spans "
                "WHERE tenant_id = ? AND service = ? AND start_ns >= ? AND start_ns < ? "
                "AND trace_id IN (SELECT trace_id FROM mine WHERE parent_span_id <> 0)) "
                "SELECT count(*) FROM mine WHERE parent_span_id = 0 OR NOT EXISTS ("
                "SELECT 1 FROM parents p WHERE p.trace_id = mine.trace_id "
                "AND p.span_id = mine.parent_span_id AND p.span_id <> mine.span_id)",
                [
                    tid,
                    service,
                    start_ns,
                    end_ns,
                    tid,
                    service,
                    start_ns - PARENT_LOOKBACK_NS,
                    end_ns,
                ],
            )
            .fetchone()
        )
        return int(row[0]) if row else 0

    def _tags_of(self, tenant: str, since_ns: int) -> List[Tuple[str, str, str, str]]:
        """(scope, key, value, type) seen for the tenant since the given time, from memory:
        there every tag has its latest time, while the table's may be an hour behind."""
        tid = self._tenant_ids.get(tenant, -1)
        # list() copies the items in one step under the GIL while the writer may add some.
        return [
            tag[1:]
            for tag, entry in list(self._tags.items())
            if tag[0] == tid and entry[1] >= since_ns
        ]

    def tag_names(self, tenant: str, since_ns: int = 0) -> Dict[str, List[str]]:
        out: Dict[str, set] = {}
        for scope, key, _, _ in self._tags_of(tenant, since_ns):
            out.setdefault(scope, set()).add(key)
        return {scope: sorted(keys) for scope, keys in sorted(out.items())}

    def tag_values(
        self, tenant: str, scope: Optional[str], name: str, since_ns: int = 0
    ) -> List[Tuple[str, str]]:
        found = {
            (value, kind)
            for tag_scope, key, value, kind in self._tags_of(tenant, since_ns)
            if key == name and (scope is None or tag_scope == scope)
        }
        return sorted(found)

    # -- agent settings ------------------------------------------------------------------------

    def put_settings_rule(
        self, tenant: str, service: str, selector: str, settings: Mapping[str, Any]
    ) -> SettingsRule:
        text = json.dumps(dict(settings), sort_keys=True)
        # On the writer thread: the one connection that writes is never used by two threads.
        return self._writer.run(lambda: self._put_rule(tenant, service, selector, text)).result()

    def _put_rule(self, tenant: str, service: str, selector: str, text: str) -> SettingsRule:
        version = self._versions.get(tenant, 0) + 1
        rule = SettingsRule(service, selector, json.loads(text), version, time.time_ns())
        self._settings_transaction(
            tenant,
            version,
            "INSERT INTO settings_rules VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "settings = excluded.settings, version = excluded.version, "
            "updated_at = excluded.updated_at",
            [tenant, service, selector, text, version, rule.updated_at],
        )
        rules = dict(self._rules.get(tenant, {}))
        rules[(service, selector)] = rule
        self._rules[tenant] = rules
        return rule

    def delete_settings_rule(self, tenant: str, service: str, selector: str) -> bool:
        return self._writer.run(lambda: self._delete_rule(tenant, service, selector)).result()

    def _delete_rule(self, tenant: str, service: str, selector: str) -> bool:
        if (service, selector) not in self._rules.get(tenant, {}):
            return False
        self._settings_transaction(
            tenant,
            self._versions.get(tenant, 0) + 1,
            "DELETE FROM settings_rules WHERE tenant = ? AND service = ? AND selector = ?",
            [tenant, service, selector],
        )
        rules = dict(self._rules[tenant])
        del rules[(service, selector)]
        self._rules[tenant] = rules
        return True

    def _settings_transaction(self, tenant: str, version: int, sql: str, params: list) -> None:
        """``sql`` and the tenant's new version in one transaction (writer thread)."""
        con = self._con
        with _transaction(con):
            con.execute(sql, params)
            con.execute(
                "INSERT INTO settings_versions VALUES (?, ?) "
                "ON CONFLICT DO UPDATE SET version = excluded.version",
                [tenant, version],
            )
        self._versions[tenant] = version

    def settings_rules(self, tenant: str, service: Optional[str] = None) -> List[SettingsRule]:
        rules = self._rules.get(tenant, {})
        return sorted(
            (r for r in rules.values() if service is None or r.service == service),
            key=lambda r: (r.service, r.selector),
        )

    def settings_version(self, tenant: str) -> int:
        return self._versions.get(tenant, 0)

    def size_bytes(self) -> Optional[int]:
        # The database file and its write-ahead log, which holds the latest commits.
        total = 0
        for path in (self.path, self.path + ".wal"):
            try:
                total += os.stat(path).st_size
            except OSError:
                continue  # no WAL right after a checkpoint
        return total

    # -- documents ---------------------------------------------------------------------------

    def put_document(self, tenant: str, kind: str, name: str, body: Mapping[str, Any]) -> Document:
        text = json.dumps(dict(body), sort_keys=True)
        doc = Document(tenant, kind, name, json.loads(text), time.time_ns())
        self._writer.run(
            lambda: self._con.execute(
                "INSERT INTO documents VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                "body = excluded.body, updated_at = excluded.updated_at",
                [tenant, kind, name, text, doc.updated_at],
            )
        ).result()
        return doc

    def documents(self, kind: str, tenant: Optional[str] = None) -> List[Document]:
        sql = "SELECT tenant, name, body, updated_at FROM documents WHERE kind = ?"
        params: List[Any] = [kind]
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        rows = self._cursor().execute(sql + " ORDER BY tenant, name", params).fetchall()
        return [Document(t, kind, name, json.loads(body), at) for t, name, body, at in rows]

    def delete_document(self, tenant: str, kind: str, name: str) -> bool:
        def delete() -> bool:
            found = self._con.execute(
                "DELETE FROM documents WHERE tenant = ? AND kind = ? AND name = ? RETURNING 1",
                [tenant, kind, name],
            ).fetchall()
            return bool(found)

        return self._writer.run(delete).result()

    # -- retention ---------------------------------------------------------------------------

    def delete_before(
        self, cutoff_ns: int, should_stop: Callable[[], bool] = lambda: False
    ) -> RetentionReport:
        report = RetentionReport()
        for table, column in (("samples", "ts"), ("spans", "end_ns")):
            while not should_stop():
                oldest = self._cursor().execute(f"SELECT min({column}) FROM {table}").fetchone()
                if oldest is None or oldest[0] is None or oldest[0] >= cutoff_ns:
                    break
                upto = min(cutoff_ns, oldest[0] + RETENTION_SLICE_NS)
                deleted = self._writer.run(
                    lambda t=table, c=column, u=upto: self._delete_older(t, c, u)
                ).result()
                if table == "samples":
                    report += RetentionReport(samples=deleted)
                else:
                    report += RetentionReport(spans=deleted)
        if report.samples or report.spans:
            series = self._writer.run(lambda: self._collect_garbage(cutoff_ns)).result()
            report += RetentionReport(series=series)
        return report

    def _delete_older(self, table: str, column: str, upto_ns: int) -> int:
        row = self._con.execute(f"DELETE FROM {table} WHERE {column} < ?", [upto_ns]).fetchone()
        return int(row[0]) if row else 0

    def _collect_garbage(self, cutoff_ns: int) -> int:
        """On the writer thread: forget what only deleted rows referenced."""
        con = self._con
        with self._series_lock:
            gone = [
                (tenant, sid)
                for tenant, by_id in self._series.items()
                for sid, rec in by_id.items()
                if rec.last_ts < cutoff_ns
            ]
        # By the latest time a tag was seen (the row's last_seen may be an hour behind).
        gone_tags = [tag for tag, (_, latest) in self._tags.items() if latest < cutoff_ns]
        with _transaction(con):
            if gone:
                gone_table = {  # noqa: F841
                    "tenant": np.array([t for t, _ in gone], dtype=object),
                    "series_id": np.array([s for _, s in gone], dtype=np.int64),
                }
                con.execute(
                    "DELETE FROM series WHERE (tenant, series_id) IN "
                    "(SELECT (tenant, series_id) FROM gone_table)"
                )
            if gone_tags:
                t = list(zip(*gone_tags))
                gone_tag_table = {  # noqa: F841
                    "tenant_id": np.array(t[0], dtype=np.int32),
                    "scope": np.array(t[1], dtype=object),
                    "key": np.array(t[2], dtype=object),
                    "value": np.array(t[3], dtype=object),
                    "type": np.array(t[4], dtype=object),
                }
                con.execute(
                    "DELETE FROM span_tags WHERE (tenant_id, scope, key, value, type) IN "
                    "(SELECT (tenant_id, scope, key, value, type) FROM gone_tag_table)"
                )
            con.execute(
                "DELETE FROM span_groups WHERE group_id NOT IN "
                "(SELECT DISTINCT group_id FROM spans)"
            )
            con.execute(
                "DELETE FROM stacks WHERE stack_id NOT IN (SELECT DISTINCT stack_id FROM samples)"
            )
        # Stacks and groups deleted above are written again by the next push that has them.
        self._known_stacks.clear()
        self._known_groups.clear()
        for tag in gone_tags:
            del self._tags[tag]
            self._tag_counts[tag[:3]] -= 1
        with self._series_lock:
            for tenant, sid in gone:
                self._series.get(tenant, {}).pop(sid, None)
            for by_id in self._series.values():
                for sid, rec in by_id.items():
                    if rec.first_ts < cutoff_ns:
                        by_id[sid] = SeriesRecord(
                            sid, rec.profile_type, rec.labels, cutoff_ns, rec.last_ts
                        )
        return len(gone)

    def close(self) -> None:
        if self._closed:
            return
        self._writer.close()
        self._closed = True
        self._con.close()
