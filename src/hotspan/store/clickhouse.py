"""The ClickHouse store: many stateless hotspan servers over one ClickHouse (or a cluster).

Nothing one server needs is kept only by another: series, tags and settings rules are read
from ClickHouse (cached for a second or two), and what a server keeps in memory (which stacks,
frames and tags it has written lately, span groups by id) only saves it redundant writes and
reads.  Each server commits its pushes in groups, as the embedded store does; a group is a
handful of columnar inserts, one per table, so that ClickHouse sees a few large inserts a
second rather than one per push.

The query side mirrors the embedded store: ClickHouse sums samples per stack and hotspan
builds the flame graph from the sums (``hotspan.query.flamegraph``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit

import numpy as np

from hotspan.model.profile import MAX_SUM, Frame, IngestBatch, ProfileType, SampleColumns
from hotspan.model.trace import (
    MatchedSpan,
    SearchError,
    SpanBatch,
    SpanGroup,
    SpanRow,
    StoredSpan,
    TraceQuery,
    TraceSummary,
)
from hotspan.store.base import (
    RetentionReport,
    SampleFilter,
    SeriesRecord,
    SettingsRule,
    SpanInfo,
    SpanValues,
    StackValues,
    Store,
    StoreError,
    TraceValues,
)
from hotspan.store.batching import Batch, GroupCommitWriter, series_bounds
from hotspan.store.clickhouse_schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    Layout,
    create_statements,
    ttl_statements,
)

log = logging.getLogger(__name__)

DAY_NS = 86400 * 10**9
# Series and settings rules are read again after this long; a server sees what another wrote
# within it.  Its own writes it sees at once.
SERIES_CACHE_S = 2.0
RULES_CACHE_S = 1.0
# A tag already written is written again only when seen this much later (for its last_seen);
# stacks and frames once a day while in use, so that their TTL follows the samples.
TAG_REFRESH_NS = 3600 * 10**9
REWRITE_IDS_S = 86400.0
MAX_TAG_VALUES = 1000
# A group commit waits this long for more pushes: ClickHouse wants few large inserts.
MIN_COMMIT_INTERVAL_S = 0.2
_CLAMPED_SUM = f"toInt64(least(sum(toInt128(value)), {MAX_SUM}))"
# ClickHouse error codes that are the query's fault, not the store's.
_BAD_QUERY_CODES = (
    "Code: 427.",  # CANNOT_COMPILE_REGEXP
    "Code: 36.",  # BAD_ARGUMENTS
    "Code: 43.",  # ILLEGAL_TYPE_OF_ARGUMENT
    "Code: 53.",  # TYPE_MISMATCH
    "Code: 6.",  # CANNOT_PARSE_TEXT
)


class ClickHouseURL:
    """``clickhouse://user:password@host:8123/database?secure=1`` (``clickhouses://``: TLS)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("clickhouse", "clickhouses", "http", "https"):
            raise StoreError(f"not a ClickHouse URL: {url!r} (clickhouse://host:8123/db)")
        options = dict(parse_qsl(parts.query))
        self.secure = parts.scheme in ("clickhouses", "https") or options.pop("secure", "") in (
            "1",
            "true",
        )
        self.host = parts.hostname or "localhost"
        try:
            self.port = parts.port or (8443 if self.secure else 8123)
        except ValueError:
            raise StoreError(f"bad port in {url!r}") from None
        self.username = unquote(parts.username) if parts.username else "default"
        self.password = unquote(parts.password) if parts.password else ""
        self.database = parts.path.strip("/") or "default"
        self.cluster = options.pop("cluster", None)
        self.settings = options

    def redacted(self) -> str:
        scheme = "clickhouses" if self.secure else "clickhouse"
        return f"{scheme}://{self.username}@{self.host}:{self.port}/{self.database}"


def _in_list(values: Sequence[Any]) -> str:
    """An IN list of integers, inlined: the lists are numbers the server produced."""
    return "(" + ",".join(str(int(v)) for v in values) + ")" if len(values) else "(NULL)"


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ClickHouseStore(Store):
    def __init__(
        self,
        url: str,
        retention_ns: int = 0,
        cluster: Optional[str] = None,
        create: bool = True,
    ) -> None:
        try:
            import clickhouse_connect  # noqa: F401
        except ImportError:
            raise StoreError(
                "the ClickHouse store needs clickhouse-connect: pip install 'hotspan[clickhouse]'"
            ) from None
        self.url = ClickHouseURL(url)
        self.layout = Layout(self.url.database, cluster or self.url.cluster)
        self.retention_days = math.ceil(retention_ns / DAY_NS) if retention_ns > 0 else None
        self._local = threading.local()
        self._closed = False
        try:
            self._admin = self._connect(database="default" if create else self.url.database)
            if create:
                self._migrate()
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001 - connection refused, auth, bad database...
            raise StoreError(f"cannot open {self.url.redacted()}: {_reason(exc)}") from exc
        self._series_lock = threading.Lock()
        self._series: Dict[str, Tuple[float, Dict[int, SeriesRecord]]] = {}
        self._rules_lock = threading.Lock()
        self._rules: Dict[str, Tuple[float, Dict[Tuple[str, str], SettingsRule], int]] = {}
        # Stacks and frames this server wrote since ``_written_since`` (forgotten daily, so
        # that each is written again once a day while in use and its TTL follows the samples).
        self._written_stacks: Set[int] = set()
        self._written_frames: Set[int] = set()
        self._written_since = time.monotonic()
        self._written_groups: Set[int] = set()
        self._written_tags: Dict[Tuple[str, str, str, str, str], int] = {}
        self._tag_counts: Dict[Tuple[str, str, str], int] = {}
        self._groups: Dict[int, SpanGroup] = {}
        self._writer = GroupCommitWriter(
            self._commit, name="hotspan-clickhouse-writer", min_interval_s=MIN_COMMIT_INTERVAL_S
        )

    # -- connections ---------------------------------------------------------------------------

    def _connect(self, database: Optional[str] = None) -> Any:
        import clickhouse_connect

        settings: Dict[str, Any] = dict(self.url.settings)
        if self.layout.cluster:
            # A push is acknowledged once every shard has its rows, not when queued locally.
            settings.setdefault("insert_distributed_sync", 1)
        return clickhouse_connect.get_client(
            host=self.url.host,
            port=self.url.port,
            username=self.url.username,
            password=self.url.password,
            database=database or self.url.database,
            secure=self.url.secure,
            # Several threads each use their own client; no server-side session is needed.
            autogenerate_session_id=False,
            settings=settings,
            connect_timeout=10,
            send_receive_timeout=300,
        )

    def _client(self) -> Any:
        if self._closed:
            raise StoreError("store is closed")
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._connect()
        return client

    def _query(
        self,
        sql: str,
        parameters: Optional[Mapping[str, Any]] = None,
        binary: Sequence[str] = (),
    ) -> List[tuple]:
        """Rows of a query; the ``binary`` columns as bytes (String is read as text)."""
        formats = {name: "bytes" for name in binary} or None
        try:
            return (
                self._client().query(sql, parameters=parameters, column_formats=formats).result_rows
            )
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"ClickHouse query failed: {_reason(exc)}") from exc

    def _columns(
        self, sql: str, width: int, parameters: Optional[Mapping[str, Any]] = None
    ) -> List[Sequence[Any]]:
        """The ``width`` columns of a query's result (empty ones when no row matched)."""
        try:
            columns = self._client().query(sql, parameters=parameters).result_columns
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"ClickHouse query failed: {_reason(exc)}") from exc
        return list(columns) if columns else [[] for _ in range(width)]

    def _command(self, sql: str, client: Any = None) -> None:
        try:
            (client or self._client()).command(sql)
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"ClickHouse command failed: {_reason(exc)}") from exc

    def _migrate(self) -> None:
        """Create the database and tables, or bring them up to this version's schema."""
        from hotspan.store.clickhouse_schema import quote_name

        admin = self._admin
        admin.command(
            f"CREATE DATABASE IF NOT EXISTS {quote_name(self.url.database)}{self.layout.on_cluster}"
        )
        self._admin = client = self._connect()
        admin.close()
        # IF NOT EXISTS throughout: servers starting together over one database all succeed.
        client.command(create_statements(self.layout)[0])
        applied = client.query("SELECT max(version) FROM schema_migrations").result_rows
        current = int(applied[0][0] or 0) if applied else 0
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"{self.url.redacted()} has schema version {current}, newer than this hotspan "
                f"({SCHEMA_VERSION}): upgrade hotspan"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version](self.layout, self.retention_days):
                client.command(statement)
            client.command(f"INSERT INTO schema_migrations (version) VALUES ({version})")
        # The retention period is the server's setting: each start applies its own, when it
        # differs from the tables' (an ALTER per start would queue needless mutations).
        engines = dict(
            client.query(
                "SELECT name, engine_full FROM system.tables WHERE database = %(db)s",
                parameters={"db": self.url.database},
            ).result_rows
        )
        wanted = f"toIntervalDay({self.retention_days})" if self.retention_days else None
        for table, statement in ttl_statements(self.layout, self.retention_days):
            engine = engines.get(table, "")
            has_ttl = " TTL " in engine
            if (wanted is None and not has_ttl) or (wanted is not None and wanted in engine):
                continue
            client.command(statement)

    # -- writing -------------------------------------------------------------------------------

    def write(self, tenant: str, batch: IngestBatch) -> Future[None]:
        return self._writer.submit(tenant, batch)

    def write_spans(self, tenant: str, spans: SpanBatch) -> Future[None]:
        return self._writer.submit(tenant, spans)

    def _insert(self, table: str, columns: Dict[str, Any], types: Sequence[str]) -> None:
        client = self._client()
        client.insert(
            table,
            list(columns.values()),
            column_names=list(columns.keys()),
            column_type_names=list(types),
            column_oriented=True,
        )

    def _commit(self, pending: List[Tuple[str, Batch]]) -> None:
        if time.monotonic() - self._written_since > REWRITE_IDS_S:
            self._written_stacks, self._written_frames = set(), set()
            self._written_since = time.monotonic()
        known_stacks, known_frames = self._written_stacks, self._written_frames
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
            new = batch.new_stacks(known_stacks)
            if new:
                wanted = {f for ids in new.values() for f in ids}
                wanted -= known_frames
                wanted -= frames.keys()
                if wanted:
                    frames.update(batch.frames_for(wanted))
                stacks.update(new)
            cols = batch.columns()
            if len(cols.value):
                series_bounds(tenant, batch, cols, series_rows)
                tenants.append(tenant)
                columns.append(cols)
        written = np.datetime64(int(time.time()), "s")
        # What others reference first: a sample is never readable before its stack.
        if frames:
            self._insert(
                "frames",
                {
                    "frame_id": np.fromiter(frames.keys(), dtype=np.int64, count=len(frames)),
                    "name": [f.name for f in frames.values()],
                    "filename": [f.filename for f in frames.values()],
                    "line": [int(f.line) for f in frames.values()],
                    "written": [written.item()] * len(frames),
                },
                ("Int64", "String", "String", "Int64", "DateTime"),
            )
        if stacks:
            self._insert(
                "stacks",
                {
                    "stack_id": np.fromiter(stacks.keys(), dtype=np.int64, count=len(stacks)),
                    "frame_ids": [list(f) for f in stacks.values()],
                    "written": [written.item()] * len(stacks),
                },
                ("Int64", "Array(Int64)", "DateTime"),
            )
        if series_rows:
            rows = list(zip(*series_rows.values()))
            self._insert(
                "series",
                {
                    "tenant": list(rows[0]),
                    "series_id": np.array(rows[1], dtype=np.int64),
                    "profile_type": list(rows[2]),
                    "labels": list(rows[3]),
                    "first_ts": np.array(rows[4], dtype=np.int64),
                    "last_ts": np.array(rows[5], dtype=np.int64),
                },
                ("String", "Int64", "String", "String", "Int64", "Int64"),
            )
        if columns:
            counts = [len(c.value) for c in columns]
            traces = np.concatenate([c.trace_id for c in columns])
            self._insert(
                "samples",
                {
                    "tenant": np.repeat(np.array(tenants, dtype=object), counts).tolist(),
                    "series_id": np.concatenate([c.series_id for c in columns]),
                    "ts": np.concatenate([c.ts for c in columns]),
                    "stack_id": np.concatenate([c.stack_id for c in columns]),
                    "value": np.concatenate([c.value for c in columns]),
                    "span_id": np.concatenate([c.span_id for c in columns]).astype(np.uint64),
                    "trace_id": [t or "" for t in traces.tolist()],
                },
                ("String", "Int64", "Int64", "Int64", "Int64", "UInt64", "String"),
            )
        new_tags, seen_tags = self._insert_spans(span_batches)
        # Remembered once everything landed: a failed commit is written again in full.
        if len(known_stacks) > 2_000_000:
            known_stacks.clear()
        if len(known_frames) > 2_000_000:
            known_frames.clear()
        known_stacks.update(stacks)
        known_frames.update(frames)
        for tag, seen in new_tags.items():
            if tag not in self._written_tags:
                key = tag[:3]
                self._tag_counts[key] = self._tag_counts.get(key, 0) + 1
            self._written_tags[tag] = max(self._written_tags.get(tag, 0), seen)
        self._remember_series(series_rows.values())
        del seen_tags

    def _insert_spans(
        self, batches: List[Tuple[str, SpanBatch]]
    ) -> Tuple[Dict[Tuple[str, str, str, str, str], int], Dict[tuple, int]]:
        if not batches:
            return {}, {}
        groups: Dict[int, SpanGroup] = {}
        tags: Dict[Tuple[str, str, str, str, str], int] = {}
        skipped: Dict[tuple, int] = {}
        new_per_key: Dict[Tuple[str, str, str], int] = {}
        rows: List[SpanRow] = []
        tenants: List[str] = []
        for tenant, batch in batches:
            rows.extend(batch.rows)
            tenants.extend([tenant] * len(batch.rows))
            for gid, group in batch.groups.items():
                if gid not in self._written_groups:
                    groups[gid] = group
            for (scope, key, value, kind), seen in batch.tags.items():
                tag = (tenant, scope, key, value, kind)
                last = self._written_tags.get(tag)
                if last is None:
                    if tag not in tags:
                        per_key = tag[:3]
                        known = self._tag_counts.get(per_key, 0) + new_per_key.get(per_key, 0)
                        if known >= MAX_TAG_VALUES:
                            continue
                        new_per_key[per_key] = new_per_key.get(per_key, 0) + 1
                elif seen < last + TAG_REFRESH_NS:
                    skipped[tag] = seen
                    continue
                if tags.get(tag, 0) < seen:
                    tags[tag] = seen
        if groups:
            g = list(groups.values())
            self._insert(
                "span_groups",
                {
                    "group_id": np.fromiter(groups.keys(), dtype=np.int64, count=len(groups)),
                    "service": [x.service for x in g],
                    "resource": [x.resource for x in g],
                    "resource_schema_url": [x.resource_schema_url for x in g],
                    "scope": [x.scope for x in g],
                    "scope_schema_url": [x.scope_schema_url for x in g],
                    "attrs": [x.attrs for x in g],
                },
                ("Int64", "String", "String", "String", "String", "String", "String"),
            )
        if tags:
            t = list(zip(*tags.keys()))
            self._insert(
                "span_tags",
                {
                    "tenant": list(t[0]),
                    "scope": list(t[1]),
                    "key": list(t[2]),
                    "value": list(t[3]),
                    "type": list(t[4]),
                    "last_seen": np.fromiter(tags.values(), dtype=np.int64, count=len(tags)),
                },
                ("String", "String", "String", "String", "String", "Int64"),
            )
        if rows:
            cols = list(zip(*rows))
            f = SpanRow._fields
            trace_ids = cols[f.index("trace_id")]
            starts = np.array(cols[f.index("start_ns")], dtype=np.int64)
            ends = np.array(cols[f.index("end_ns")], dtype=np.int64)
            self._insert(
                "spans",
                {
                    "tenant": tenants,
                    "trace_id": list(trace_ids),
                    "span_id": np.array(cols[f.index("span_id")], dtype=np.uint64),
                    "parent_span_id": np.array(cols[f.index("parent_span_id")], dtype=np.uint64),
                    "name": list(cols[f.index("name")]),
                    "kind": np.array(cols[f.index("kind")], dtype=np.int8),
                    "service": list(cols[f.index("service")]),
                    "start_ns": starts,
                    "end_ns": ends,
                    "status_code": np.array(cols[f.index("status_code")], dtype=np.int8),
                    "attrs": list(cols[f.index("attrs")]),
                    "group_id": np.array(cols[f.index("group_id")], dtype=np.int64),
                    "raw": list(cols[f.index("raw")]),
                },
                (
                    "String",
                    "String",
                    "UInt64",
                    "UInt64",
                    "String",
                    "Int8",
                    "String",
                    "Int64",
                    "Int64",
                    "Int8",
                    "String",
                    "Int64",
                    "String",
                ),
            )
            # One row per (tenant, trace) of this commit: a trace by id finds its time range.
            bounds: Dict[Tuple[str, str], List[int]] = {}
            for tenant, trace, lo, hi in zip(tenants, trace_ids, starts.tolist(), ends.tolist()):
                entry = bounds.get((tenant, trace))
                if entry is None:
                    bounds[(tenant, trace)] = [lo, hi]
                else:
                    entry[0], entry[1] = min(entry[0], lo), max(entry[1], hi)
            keys = list(bounds)
            self._insert(
                "trace_index",
                {
                    "tenant": [k[0] for k in keys],
                    "trace_id": [k[1] for k in keys],
                    "start_ns": np.array([bounds[k][0] for k in keys], dtype=np.int64),
                    "end_ns": np.array([bounds[k][1] for k in keys], dtype=np.int64),
                },
                ("String", "String", "Int64", "Int64"),
            )
        self._written_groups.update(groups)
        if len(self._written_groups) > 100_000:
            self._written_groups = set(groups)
        return tags, skipped

    # -- series --------------------------------------------------------------------------------

    def _remember_series(self, rows: Any) -> None:
        """This server's own writes, seen at once (others' within SERIES_CACHE_S)."""
        with self._series_lock:
            for tenant, sid, ptype, labels, first, last in rows:
                cached = self._series.get(tenant)
                if cached is None:
                    continue
                by_id = cached[1]
                old = by_id.get(sid)
                try:
                    if old is not None:
                        rec = SeriesRecord(
                            sid,
                            old.profile_type,
                            old.labels,
                            min(first, old.first_ts),
                            max(last, old.last_ts),
                        )
                    else:
                        rec = SeriesRecord(
                            sid, ProfileType.parse(ptype), json.loads(labels), first, last
                        )
                except (ValueError, TypeError):
                    continue
                by_id[sid] = rec

    def series(self, tenant: str) -> List[SeriesRecord]:
        with self._series_lock:
            cached = self._series.get(tenant)
            if cached is not None and time.monotonic() - cached[0] < SERIES_CACHE_S:
                return list(cached[1].values())
        fetched_at = time.monotonic()
        rows = self._query(
            "SELECT series_id, any(profile_type), any(labels), min(first_ts), max(last_ts) "
            "FROM series WHERE tenant = %(tenant)s GROUP BY series_id",
            {"tenant": tenant},
        )
        by_id: Dict[int, SeriesRecord] = {}
        for sid, ptype, labels, first, last in rows:
            try:
                by_id[sid] = SeriesRecord(
                    sid, ProfileType.parse(ptype), json.loads(labels), first, last
                )
            except (ValueError, TypeError) as exc:
                log.error("skipping unreadable series %s of tenant %s: %s", sid, tenant, exc)
        with self._series_lock:
            old = self._series.get(tenant)
            if old is not None and old[0] > fetched_at:
                return list(old[1].values())
            self._series[tenant] = (fetched_at, by_id)
        return list(by_id.values())

    # -- samples -------------------------------------------------------------------------------

    def _sample_where(
        self, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> Tuple[str, Dict[str, Any]]:
        sql = (
            f"tenant = %(tenant)s AND series_id IN {_in_list(series_ids)} "
            "AND ts >= %(start)s AND ts < %(end)s"
        )
        params: Dict[str, Any] = {
            "tenant": tenant,
            "start": int(where.start_ns),
            "end": int(where.end_ns),
        }
        if where.span_ids is not None:
            sql += f" AND span_id IN {_in_list(where.span_ids)}"
        if where.trace_ids is not None:
            sql += " AND trace_id IN %(traces)s"
            params["traces"] = tuple(t.lower() for t in where.trace_ids) or ("-",)
        return sql, params

    def _sums_by(
        self, column: str, tenant: str, series_ids: Sequence[int], where: SampleFilter
    ) -> Tuple[list, np.ndarray]:
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
        if not cols or not len(cols[0]):
            return empty, empty, empty, empty
        return tuple(np.asarray(c, dtype=np.int64) for c in cols)  # type: ignore[return-value]

    def stacks(self, stack_ids: Sequence[int]) -> Dict[int, Tuple[int, ...]]:
        if len(stack_ids) == 0:
            return {}
        ids, frame_ids = self._columns(
            f"SELECT stack_id, any(frame_ids) FROM stacks WHERE stack_id IN {_in_list(stack_ids)} "
            "GROUP BY stack_id",
            2,
        )
        return {int(s): tuple(f) for s, f in zip(ids, frame_ids)}

    def frames(self, frame_ids: Sequence[int]) -> Dict[int, Frame]:
        if len(frame_ids) == 0:
            return {}
        rows = self._query(
            "SELECT frame_id, any(name), any(filename), any(line) FROM frames "
            f"WHERE frame_id IN {_in_list(frame_ids)} GROUP BY frame_id"
        )
        return {fid: Frame(name, filename, line) for fid, name, filename, line in rows}

    # -- traces --------------------------------------------------------------------------------

    def _span_groups(self, group_ids: Sequence[int]) -> Dict[int, SpanGroup]:
        missing = [g for g in set(group_ids) if g not in self._groups]
        if missing:
            rows = self._query(
                "SELECT group_id, any(service), any(resource) AS resource, "
                "any(resource_schema_url), any(scope) AS scope, any(scope_schema_url), "
                "any(attrs) FROM span_groups "
                f"WHERE group_id IN {_in_list(missing)} GROUP BY group_id",
                binary=("resource", "scope"),
            )
            if len(self._groups) > 100_000:
                self._groups = {}
            for gid, service, resource, rurl, scope, surl, attrs in rows:
                self._groups[gid] = SpanGroup(
                    service, _bytes(resource), rurl, _bytes(scope), surl, attrs
                )
        cache = self._groups
        return {g: group for g in group_ids if (group := cache.get(g)) is not None}

    def trace(self, tenant: str, trace_id: str) -> List[StoredSpan]:
        params = {"tenant": tenant, "trace": trace_id.lower()}
        # The trace's bounds from its index first (a primary-key lookup), so that the spans
        # are read from its days only; ClickHouse runs the scalar subqueries before the scan.
        rows = self._query(
            "SELECT trace_id, span_id, parent_span_id, name, kind, service, start_ns, end_ns, "
            "status_code, raw, group_id FROM spans "
            "WHERE tenant = %(tenant)s AND trace_id = %(trace)s "
            "AND start_ns >= (SELECT min(start_ns) FROM trace_index "
            "                 WHERE tenant = %(tenant)s AND trace_id = %(trace)s) "
            "AND start_ns <= (SELECT max(end_ns) FROM trace_index "
            "                 WHERE tenant = %(tenant)s AND trace_id = %(trace)s) "
            "LIMIT 1 BY span_id",
            params,
            binary=("raw",),
        )
        groups = self._span_groups([r[-1] for r in rows])
        out = []
        for *fields, gid in rows:
            if gid not in groups:
                continue  # a group lost to a failed commit
            fields[9] = _bytes(fields[9])
            out.append(StoredSpan(*fields, group=groups[gid]))
        return out

    def find_traces(self, tenant: str, query: TraceQuery) -> List[TraceSummary]:
        from hotspan.store.clickhouse_search import search_sql

        sql, params = search_sql(tenant, query)
        try:
            rows = self._client().query(sql, parameters=params).result_rows
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            reason = _reason(exc)
            if "Code: 427." in reason:
                # The message shows the pattern as wrapped for a full match: say what it is.
                raise SearchError(f"invalid regular expression: {reason}") from None
            if any(code in reason for code in _BAD_QUERY_CODES):
                raise SearchError(reason) from None
            raise StoreError(f"ClickHouse query failed: {reason}") from exc
        found: Dict[str, list] = {}
        for trace_id, service, name, t0, t1, count, span_id, span_name, start, end, n in rows:
            entry = found.get(trace_id)
            if entry is None:
                entry = found[trace_id] = [trace_id, service, name, t0, t1 - t0, count, [], n]
            entry[6].append(MatchedSpan(span_id, span_name, start, end - start))
        return [
            TraceSummary(*fields[:6], matched=tuple(spans), matched_count=n)
            for *fields, spans, n in found.values()
        ]

    def span_traces(self, tenant: str, span_ids: Sequence[int]) -> Dict[int, str]:
        if not span_ids:
            return {}
        rows = self._query(
            "SELECT span_id, any(trace_id) FROM spans WHERE tenant = %(tenant)s "
            f"AND span_id IN {_in_list(span_ids)} GROUP BY span_id",
            {"tenant": tenant},
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
    ) -> List[SpanInfo]:
        sql = (
            "SELECT trace_id, span_id, parent_span_id, name, service, start_ns, end_ns "
            "FROM spans WHERE tenant = %(tenant)s AND start_ns >= %(start)s "
            "AND start_ns < %(end)s"
        )
        params: Dict[str, Any] = {"tenant": tenant, "start": int(start_ns), "end": int(end_ns)}
        if service is not None:
            sql += " AND service = %(service)s"
            params["service"] = service
        if trace_ids is not None:
            sql += " AND trace_id IN %(traces)s"
            params["traces"] = tuple(t.lower() for t in trace_ids) or ("-",)
        # LIMIT 1 BY: an export retried after it landed stores a span twice.
        sql += " ORDER BY start_ns DESC, span_id LIMIT 1 BY trace_id, span_id LIMIT %(limit)s"
        params["limit"] = int(limit)
        return [SpanInfo(*row) for row in self._query(sql, params)]

    def _tags_of(self, tenant: str, since_ns: int, name: Optional[str] = None) -> List[tuple]:
        sql = "SELECT scope, key, value, any(type) AS kind FROM span_tags WHERE tenant = %(tenant)s"
        params: Dict[str, Any] = {"tenant": tenant, "since": int(since_ns)}
        if name is not None:
            sql += " AND key = %(name)s"
            params["name"] = name
        sql += (
            " GROUP BY scope, key, value, type HAVING max(last_seen) >= %(since)s "
            f"ORDER BY value LIMIT {MAX_TAG_VALUES} BY scope, key"
        )
        return self._query(sql, params)

    def tag_names(self, tenant: str, since_ns: int = 0) -> Dict[str, List[str]]:
        rows = self._query(
            "SELECT scope, key FROM span_tags WHERE tenant = %(tenant)s "
            "GROUP BY scope, key HAVING max(last_seen) >= %(since)s",
            {"tenant": tenant, "since": int(since_ns)},
        )
        out: Dict[str, set] = {}
        for scope, key in rows:
            out.setdefault(scope, set()).add(key)
        return {scope: sorted(keys) for scope, keys in sorted(out.items())}

    def tag_values(
        self, tenant: str, scope: Optional[str], name: str, since_ns: int = 0
    ) -> List[Tuple[str, str]]:
        found = {
            (value, kind)
            for tag_scope, _, value, kind in self._tags_of(tenant, since_ns, name)
            if scope is None or tag_scope == scope
        }
        return sorted(found)

    # -- agent settings ------------------------------------------------------------------------

    def _load_rules(self, tenant: str) -> Tuple[Dict[Tuple[str, str], SettingsRule], int]:
        with self._rules_lock:
            cached = self._rules.get(tenant)
            if cached is not None and time.monotonic() - cached[0] < RULES_CACHE_S:
                return cached[1], cached[2]
        fetched_at = time.monotonic()
        rows = self._query(
            "SELECT service, selector, argMax(settings, version), argMax(deleted, version), "
            "max(version), argMax(updated_at, version) FROM settings_rules "
            "WHERE tenant = %(tenant)s GROUP BY service, selector",
            {"tenant": tenant},
        )
        rules: Dict[Tuple[str, str], SettingsRule] = {}
        version = 0
        for service, selector, settings, deleted, ver, updated in rows:
            version = max(version, ver)
            if deleted:
                continue
            try:
                rules[(service, selector)] = SettingsRule(
                    service, selector, json.loads(settings), ver, updated
                )
            except ValueError as exc:
                log.error("skipping unreadable settings rule of tenant %s: %s", tenant, exc)
        with self._rules_lock:
            self._rules[tenant] = (fetched_at, rules, version)
        return rules, version

    def _forget_rules(self, tenant: str) -> None:
        with self._rules_lock:
            self._rules.pop(tenant, None)

    def put_settings_rule(
        self, tenant: str, service: str, selector: str, settings: Mapping[str, Any]
    ) -> SettingsRule:
        text = json.dumps(dict(settings), sort_keys=True)
        return self._writer.run(lambda: self._put_rule(tenant, service, selector, text)).result()

    def _put_rule(self, tenant: str, service: str, selector: str, text: str) -> SettingsRule:
        self._forget_rules(tenant)
        _, version = self._load_rules(tenant)
        rule = SettingsRule(service, selector, json.loads(text), version + 1, time.time_ns())
        self._write_rule(tenant, service, selector, text, False, rule.version, rule.updated_at)
        return rule

    def delete_settings_rule(self, tenant: str, service: str, selector: str) -> bool:
        return self._writer.run(lambda: self._delete_rule(tenant, service, selector)).result()

    def _delete_rule(self, tenant: str, service: str, selector: str) -> bool:
        self._forget_rules(tenant)
        rules, version = self._load_rules(tenant)
        if (service, selector) not in rules:
            return False
        self._write_rule(tenant, service, selector, "{}", True, version + 1, time.time_ns())
        return True

    def _write_rule(
        self,
        tenant: str,
        service: str,
        selector: str,
        text: str,
        deleted: bool,
        version: int,
        updated_at: int,
    ) -> None:
        # Versions are one more than the highest a server has read; two servers changing the
        # same tenant's rules in the same instant may give two changes one number.
        self._insert(
            "settings_rules",
            {
                "tenant": [tenant],
                "service": [service],
                "selector": [selector],
                "settings": [text],
                "deleted": [int(deleted)],
                "version": [version],
                "updated_at": [updated_at],
            },
            ("String", "String", "String", "String", "UInt8", "Int64", "Int64"),
        )
        self._forget_rules(tenant)

    def settings_rules(self, tenant: str, service: Optional[str] = None) -> List[SettingsRule]:
        rules, _ = self._load_rules(tenant)
        return sorted(
            (r for r in rules.values() if service is None or r.service == service),
            key=lambda r: (r.service, r.selector),
        )

    def settings_version(self, tenant: str) -> int:
        return self._load_rules(tenant)[1]

    # -- retention -----------------------------------------------------------------------------

    def delete_before(
        self, cutoff_ns: int, should_stop: Callable[[], bool] = lambda: False
    ) -> RetentionReport:
        """Whole days older than the cutoff go as partitions (no scan).  With a TTL set
        (the server's ``--retention``) ClickHouse drops the rest as it merges; without one,
        the rest is deleted row by row (lightweight deletes)."""
        if self._closed:
            raise StoreError("store is closed")
        report = RetentionReport()
        for table, column, counted in (
            ("samples", "ts", "samples"),
            ("spans", "end_ns", "spans"),
            ("trace_index", "end_ns", None),
        ):
            if should_stop():
                return report
            deleted = self._writer.run(
                lambda t=table, c=column: self._delete_older(t, c, cutoff_ns)
            ).result()
            if counted == "samples":
                report += RetentionReport(samples=deleted)
            elif counted == "spans":
                report += RetentionReport(spans=deleted)
        if not should_stop():
            series = self._writer.run(lambda: self._collect_garbage(cutoff_ns)).result()
            report += RetentionReport(series=series)
        return report

    def _delete_older(self, table: str, column: str, cutoff_ns: int) -> int:
        local = self.layout.local(table)
        parts_table = (
            f"clusterAllReplicas({_quote(self.layout.cluster)}, system.parts)"
            if self.layout.cluster
            else "system.parts"
        )
        parts = self._query(
            f"SELECT partition_id, sum(rows) FROM {parts_table} "
            "WHERE database = %(db)s AND table = %(table)s AND active "
            "GROUP BY partition_id",
            {"db": self.url.database, "table": local},
        )
        deleted = 0
        # Partitions are days since the epoch: those before the cutoff's day go whole.
        for partition_id, rows in parts:
            if partition_id.isdigit() and int(partition_id) < cutoff_ns // DAY_NS:
                self._command(
                    f"ALTER TABLE {local}{self.layout.on_cluster} "
                    f"DROP PARTITION ID {_quote(str(partition_id))}"
                )
                deleted += int(rows)
        if self.retention_days is None:
            (count,) = self._query(
                f"SELECT count() FROM {table} WHERE {column} < %(cutoff)s",
                {"cutoff": int(cutoff_ns)},
            )[0]
            if count:
                self._command_params(
                    f"DELETE FROM {local}{self.layout.on_cluster} WHERE {column} < %(cutoff)s",
                    {"cutoff": int(cutoff_ns)},
                )
                deleted += int(count)
        return deleted

    def _command_params(self, sql: str, parameters: Mapping[str, Any]) -> None:
        try:
            self._client().command(sql, parameters=parameters)
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"ClickHouse command failed: {_reason(exc)}") from exc

    def _collect_garbage(self, cutoff_ns: int) -> int:
        """Series without samples since the cutoff, and tags not seen since it."""
        params = {"cutoff": int(cutoff_ns)}
        gone = self._query(
            "SELECT tenant, series_id FROM series GROUP BY tenant, series_id "
            "HAVING max(last_ts) < %(cutoff)s",
            params,
        )
        on = self.layout.on_cluster
        if gone:
            self._command_params(
                f"DELETE FROM {self.layout.local('series')}{on} WHERE (tenant, series_id) IN "
                "(SELECT tenant, series_id FROM series GROUP BY tenant, series_id "
                " HAVING max(last_ts) < %(cutoff)s)",
                params,
            )
        self._command_params(
            f"DELETE FROM {self.layout.local('span_tags')}{on} "
            "WHERE (tenant, scope, key, value, type) IN "
            "(SELECT tenant, scope, key, value, type FROM span_tags "
            " GROUP BY tenant, scope, key, value, type HAVING max(last_seen) < %(cutoff)s)",
            params,
        )
        # Written again by the next push that has them.
        self._written_tags = {}
        self._tag_counts = {}
        with self._series_lock:
            self._series = {}
        return len(gone)

    def close(self) -> None:
        if self._closed:
            return
        self._writer.close()
        self._closed = True
        for client in (getattr(self._local, "client", None), self._admin):
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()


def _bytes(value: Any) -> bytes:
    """A String column as bytes (clickhouse-connect decodes String as UTF-8 text)."""
    if isinstance(value, bytes):
        return value
    return str(value).encode("utf-8", "surrogateescape")


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["ClickHouseStore", "ClickHouseURL"]
