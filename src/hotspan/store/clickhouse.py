"""The ClickHouse store: many stateless hotspan servers over one ClickHouse (or a cluster).

Nothing one server needs is kept only by another: series, tags and settings rules are read
from ClickHouse (cached for a second or two; a server's own writes it sees at once), and what
a server keeps in memory (which stacks, frames and tags it has written lately, span groups by
id) only saves it redundant writes and reads.  Each server commits its pushes in groups, as
the embedded store does; a group is a handful of columnar inserts, one per table, so that
ClickHouse sees a few large inserts a second rather than one per push.

A group's inserts are not one transaction.  What is content-addressed (frames, stacks, span
groups) or folded by key (series, tags) is written first and may be written twice; the facts
(spans, then samples) come last, each insert with a deduplication token, so that retrying it
never stores a sample twice; and a group whose spans landed but whose samples did not says so
(``PartialCommit``), so that only the pushes that failed are retried.

The query side mirrors the embedded store: ClickHouse sums samples per stack and hotspan
builds the flame graph from the sums (``hotspan.query.flamegraph``).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from hotspan.model.profile import MAX_SUM, Frame, IngestBatch, ProfileType, SampleColumns
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
    DEFAULT_RETENTION_NS,
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
    StoreUnavailable,
    TraceValues,
)
from hotspan.store.batching import (
    Batch,
    GroupCommitWriter,
    PartialCommit,
    remember_series,
    series_bounds,
)
from hotspan.store.clickhouse_connection import (
    ClickHouseURL,
    Clients,
    chunks,
    in_list,
    quote,
    reason_of,
    store_error,
)
from hotspan.store.clickhouse_schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLE_NAMES,
    Layout,
    create_statements,
    quote_name,
    ttl_days,
    ttl_statements,
)
from hotspan.store.search_sql import CLICKHOUSE, Binder, search_sql, span_condition

log = logging.getLogger(__name__)

DAY_NS = 86400 * 10**9
# Series and settings rules are read again after this long: a server sees what another wrote
# within it.
SERIES_CACHE_S = 2.0
RULES_CACHE_S = 1.0
# A tag already written is written again only when seen this much later (for its last_seen,
# which the tag APIs' time filter reads); stacks and frames once a day while in use, so that
# their TTL follows the samples.
TAG_REFRESH_NS = 60 * 10**9
REWRITE_IDS_S = 86400.0
MAX_TAG_VALUES = 1000
# A fact insert that could not reach ClickHouse is tried again after these pauses (with the
# same deduplication token) before its pushes are failed.
INSERT_RETRY_PAUSES_S = (0.5,)
_CLAMPED_SUM = f"toInt64(least(sum(toInt128(value)), {MAX_SUM}))"
# ClickHouse errors that are the search's fault (a value ClickHouse cannot compare).
_BAD_SEARCH_CODES = (36, 43, 53, 6)
_CANNOT_COMPILE_REGEXP = 427

Tag = Tuple[str, str, str, str, str]  # tenant, scope, key, value, type


class _Insert(NamedTuple):
    table: str
    columns: Dict[str, Any]
    types: Tuple[str, ...]


class _Plan(NamedTuple):
    """A commit, converted to columns before anything is sent."""

    dimensions: List[_Insert]  # safe to write twice
    span_facts: List[_Insert]
    sample_facts: List[_Insert]
    span_batches: Set[int]  # indexes in the group
    sample_batches: Set[int]
    stacks: Set[int]
    frames: Set[int]
    groups: Set[int]
    tags: Dict[Tag, int]
    series: List[list]


class ClickHouseStore(Store):
    def __init__(
        self,
        url: str,
        retention_ns: Optional[int] = None,
        cluster: Optional[str] = None,
    ) -> None:
        """``retention_ns``: keep data this long (0: forever; a TTL on the tables, the same
        for every server); None: what the database already has, 7 days for a new one."""
        try:
            import clickhouse_connect  # noqa: F401
        except ImportError:
            raise StoreError(
                "the ClickHouse store needs clickhouse-connect: pip install 'hotspan[clickhouse]'"
            ) from None
        self.url = ClickHouseURL(url)
        self.layout = Layout(self.url.database, cluster or self.url.cluster)
        self._clients = Clients(self.url, self.layout.cluster)
        try:
            self.retention_days = self._migrate(retention_ns)
        except StoreError as exc:
            self._clients.close()
            raise StoreError(f"cannot open {self.url.redacted()}: {exc}") from exc
        self._series_lock = threading.Lock()
        self._series: Dict[str, Tuple[float, Dict[int, SeriesRecord]]] = {}
        # Every series this server wrote, merged into what it reads: its own pushes are
        # visible at once, whatever a concurrent read of the table installs in the cache.
        self._own_series: Dict[str, Dict[int, SeriesRecord]] = {}
        self._rules_lock = threading.Lock()
        self._rules: Dict[str, Tuple[float, Dict[Tuple[str, str], SettingsRule], int]] = {}
        self._rules_changes: Dict[str, int] = {}
        # Stacks and frames this server wrote since ``_written_since`` (forgotten daily, so
        # that each is written again once a day while in use and its TTL follows the samples).
        self._written_stacks: Set[int] = set()
        self._written_frames: Set[int] = set()
        self._written_since = time.monotonic()
        self._written_groups: Set[int] = set()
        # Tags: the last_seen written, the latest seen here, values written per key (a cap).
        self._tags_written: Dict[Tag, int] = {}
        self._tags_seen: Dict[Tag, int] = {}
        self._tag_counts: Dict[Tuple[str, str, str], int] = {}
        self._groups: Dict[int, SpanGroup] = {}
        # Commits run back to back, each taking what queued during the one before: under
        # load a group holds many pushes (a few large inserts a second), and a push alone
        # waits for no timer.
        self._writer = GroupCommitWriter(self._commit, name="hotspan-clickhouse-writer")

    # -- schema --------------------------------------------------------------------------------

    def _migrate(self, retention_ns: Optional[int]) -> Optional[int]:
        """Create what is missing, bring the schema up to this version, settle the retention;
        returns the retention in days (None: kept forever).  Servers starting together over
        one database all succeed: every statement is idempotent."""
        db = self.url.database
        try:
            admin = self._clients.connect(database="default")
        except Exception as exc:  # noqa: BLE001
            raise store_error(exc, "cannot connect") from exc
        try:
            exists = admin.query(
                "SELECT count() FROM system.databases WHERE name = %(db)s", parameters={"db": db}
            ).result_rows[0][0]
            if not exists:
                admin.command(
                    f"CREATE DATABASE IF NOT EXISTS {quote_name(db)}{self.layout.on_cluster}"
                )
        except Exception as exc:  # noqa: BLE001
            raise store_error(exc, "cannot create the database") from exc
        finally:
            admin.close()
        engines = self._engines()
        fresh = "samples" not in engines
        applied = 0
        if "schema_migrations" in engines:
            rows = self._clients.query("SELECT max(version) FROM schema_migrations").result_rows
            applied = int(rows[0][0] or 0) if rows else 0
        if applied > SCHEMA_VERSION:
            raise StoreError(
                f"the database has schema version {applied}, newer than this hotspan's "
                f"({SCHEMA_VERSION}): upgrade hotspan"
            )
        have_days = ttl_days(engines.get(self.layout.local("samples"), ""))
        if retention_ns is None:
            days = DEFAULT_RETENTION_NS // DAY_NS if fresh else have_days
        else:
            days = math.ceil(retention_ns / DAY_NS) if retention_ns > 0 else None
        if applied < SCHEMA_VERSION or any(
            self.layout.local(t) not in engines for t in TABLE_NAMES
        ):
            # Only when something is missing: ON CLUSTER DDL waits for every node.
            self._clients.command(create_statements(self.layout)[0])
            for version in range(applied + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version](self.layout, days):
                    self._clients.command(statement)
                self._clients.command(f"INSERT INTO schema_migrations (version) VALUES ({version})")
            engines = self._engines()
        if not fresh and days != have_days:
            # Retention belongs to the database, which every server shares: it changes only
            # when a server is told to change it (--retention), and says so.
            log.warning(
                "changing the retention of %s from %s to %s",
                self.url.redacted(),
                f"{have_days} days" if have_days else "forever",
                f"{days} days" if days else "forever",
            )
        client = self._clients.get()
        for table, statement in ttl_statements(self.layout, days):
            current = ttl_days(engines.get(self.layout.local(table.name), ""))
            if current is not None:
                current -= table.ttl_slack_days
            if current == days:
                continue
            try:
                client.command(statement, settings={"materialize_ttl_after_modify": 0})
            except Exception as exc:  # noqa: BLE001
                raise store_error(exc, f"cannot set the retention of {table.name}") from exc
        return days

    def _engines(self) -> Dict[str, str]:
        rows = self._clients.query(
            "SELECT name, engine_full FROM system.tables WHERE database = %(db)s",
            {"db": self.url.database},
        ).result_rows
        return dict(rows)

    def kept_retention_ns(self, configured_ns: Optional[int]) -> int:
        # The database's, which opening the store settled from the server's --retention.
        return self.retention_days * DAY_NS if self.retention_days else 0

    # -- writing -------------------------------------------------------------------------------

    def write(self, tenant: str, batch: IngestBatch) -> Future[None]:
        return self._writer.submit(tenant, batch)

    def write_spans(self, tenant: str, spans: SpanBatch) -> Future[None]:
        return self._writer.submit(tenant, spans)

    def _insert(self, insert: _Insert, token: Optional[str] = None) -> None:
        client = self._clients.get()
        settings = {"insert_deduplication_token": token} if token else None
        pauses = INSERT_RETRY_PAUSES_S if token else ()
        for attempt in range(len(pauses) + 1):
            try:
                client.insert(
                    insert.table,
                    list(insert.columns.values()),
                    column_names=list(insert.columns.keys()),
                    column_type_names=list(insert.types),
                    column_oriented=True,
                    settings=settings,
                )
                return
            except Exception as exc:  # noqa: BLE001
                error = store_error(exc, f"cannot write {insert.table}")
                if attempt == len(pauses) or not isinstance(error, StoreUnavailable):
                    raise error from exc
                time.sleep(pauses[attempt])

    def _commit(self, pending: List[Tuple[str, Batch]]) -> None:
        if time.monotonic() - self._written_since > REWRITE_IDS_S:
            self._written_stacks, self._written_frames = set(), set()
            self._written_since = time.monotonic()
        plan = self._plan(pending)
        # Raising here is safe: nothing but rows that may be written twice has landed.
        for insert in plan.dimensions:
            self._insert(insert)
        commit_id = uuid.uuid4().hex
        failed: Set[int] = set()
        cause: Optional[BaseException] = None
        try:
            # Spans a retry writes twice are read once (every read takes one row per span).
            for insert in plan.span_facts:
                self._insert(insert, token=f"{commit_id}-{insert.table}")
        except StoreError as exc:
            failed |= plan.span_batches
            cause = exc
        try:
            for insert in plan.sample_facts:
                self._insert(insert, token=f"{commit_id}-{insert.table}")
        except StoreError as exc:
            failed |= plan.sample_batches
            cause = exc
        self._remember(plan)
        if cause is not None:
            if len(failed) == len(pending):
                raise cause
            raise PartialCommit(failed, cause)

    def _plan(self, pending: List[Tuple[str, Batch]]) -> _Plan:
        known_stacks, known_frames = self._written_stacks, self._written_frames
        frames: Dict[int, Frame] = {}
        stacks: Dict[int, Tuple[int, ...]] = {}
        series_rows: Dict[Tuple[str, int], list] = {}
        tenants: List[str] = []
        columns: List[SampleColumns] = []
        span_batches: List[Tuple[str, SpanBatch]] = []
        span_index: Set[int] = set()
        sample_index: Set[int] = set()
        for i, (tenant, batch) in enumerate(pending):
            if isinstance(batch, SpanBatch):
                span_batches.append((tenant, batch))
                span_index.add(i)
                continue
            sample_index.add(i)
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
        now_s = int(time.time())
        dimensions: List[_Insert] = []
        if frames:
            dimensions.append(
                _Insert(
                    "frames",
                    {
                        "frame_id": np.fromiter(frames.keys(), dtype=np.int64, count=len(frames)),
                        "name": [f.name for f in frames.values()],
                        "filename": [f.filename for f in frames.values()],
                        "line": np.array([f.line for f in frames.values()], dtype=np.int64),
                        "written": [now_s] * len(frames),
                    },
                    ("Int64", "String", "String", "Int64", "DateTime"),
                )
            )
        if stacks:
            dimensions.append(
                _Insert(
                    "stacks",
                    {
                        "stack_id": np.fromiter(stacks.keys(), dtype=np.int64, count=len(stacks)),
                        "frame_ids": [list(f) for f in stacks.values()],
                        "written": [now_s] * len(stacks),
                    },
                    ("Int64", "Array(Int64)", "DateTime"),
                )
            )
        if series_rows:
            rows = list(zip(*series_rows.values()))
            dimensions.append(
                _Insert(
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
            )
        sample_facts: List[_Insert] = []
        if columns:
            counts = [len(c.value) for c in columns]
            sample_columns: Dict[str, Any] = {
                "tenant": np.repeat(np.array(tenants, dtype=object), counts),
                "series_id": np.concatenate([c.series_id for c in columns]),
                "ts": np.concatenate([c.ts for c in columns]),
                "stack_id": np.concatenate([c.stack_id for c in columns]),
                "value": np.concatenate([c.value for c in columns]),
                "span_id": np.concatenate([c.span_id for c in columns]).astype(np.uint64),
            }
            types = ["LowCardinality(String)", "Int64", "Int64", "Int64", "Int64", "UInt64"]
            # Most pushes carry no trace ids: the column's default ('') then costs nothing.
            traces = [c.trace_id for c in columns if any(t is not None for t in c.trace_id)]
            if traces:
                sample_columns["trace_id"] = [
                    t or "" for t in np.concatenate([c.trace_id for c in columns]).tolist()
                ]
                types.append("String")
            sample_facts.append(_Insert("samples", sample_columns, tuple(types)))
        span_dims, span_facts, groups, tags = self._plan_spans(span_batches)
        dimensions.extend(span_dims)
        return _Plan(
            dimensions,
            span_facts,
            sample_facts,
            span_index,
            sample_index,
            set(stacks),
            set(frames),
            groups,
            tags,
            list(series_rows.values()),
        )

    def _plan_spans(
        self, batches: List[Tuple[str, SpanBatch]]
    ) -> Tuple[List[_Insert], List[_Insert], Set[int], Dict[Tag, int]]:
        if not batches:
            return [], [], set(), {}
        groups: Dict[int, SpanGroup] = {}
        tags: Dict[Tag, int] = {}
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
                if self._tags_seen.get(tag, -1) < seen and tag in self._tags_written:
                    self._tags_seen[tag] = seen
                last = self._tags_written.get(tag)
                if last is None:
                    if tag not in tags:
                        # The cap counts the values of this commit too.
                        per_key = tag[:3]
                        known = self._tag_counts.get(per_key, 0) + new_per_key.get(per_key, 0)
                        if known >= MAX_TAG_VALUES:
                            continue
                        new_per_key[per_key] = new_per_key.get(per_key, 0) + 1
                elif seen < last + TAG_REFRESH_NS:
                    continue
                if tags.get(tag, -1) < seen:
                    tags[tag] = seen
        dimensions: List[_Insert] = []
        if groups:
            g = list(groups.values())
            dimensions.append(
                _Insert(
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
            )
        if tags:
            t = list(zip(*tags.keys()))
            dimensions.append(
                _Insert(
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
            )
        facts: List[_Insert] = []
        if rows:
            cols = list(zip(*rows))
            f = SpanRow._fields
            trace_ids = cols[f.index("trace_id")]
            starts = np.array(cols[f.index("start_ns")], dtype=np.int64)
            ends = np.array(cols[f.index("end_ns")], dtype=np.int64)
            facts.append(
                _Insert(
                    "spans",
                    {
                        "tenant": tenants,
                        "trace_id": list(trace_ids),
                        "span_id": np.array(cols[f.index("span_id")], dtype=np.uint64),
                        "parent_span_id": np.array(
                            cols[f.index("parent_span_id")], dtype=np.uint64
                        ),
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
                        "LowCardinality(String)",
                        "String",
                        "UInt64",
                        "UInt64",
                        "LowCardinality(String)",
                        "Int8",
                        "LowCardinality(String)",
                        "Int64",
                        "Int64",
                        "Int8",
                        "String",
                        "Int64",
                        "String",
                    ),
                )
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
            facts.append(
                _Insert(
                    "trace_index",
                    {
                        "tenant": [k[0] for k in keys],
                        "trace_id": [k[1] for k in keys],
                        "start_ns": np.array([bounds[k][0] for k in keys], dtype=np.int64),
                        "end_ns": np.array([bounds[k][1] for k in keys], dtype=np.int64),
                    },
                    ("LowCardinality(String)", "String", "Int64", "Int64"),
                )
            )
        return dimensions, facts, set(groups), tags

    def _remember(self, plan: _Plan) -> None:
        """After the dimensions landed: what this server need not write again."""
        if len(self._written_stacks) > 2_000_000:
            self._written_stacks.clear()
        if len(self._written_frames) > 2_000_000:
            self._written_frames.clear()
        self._written_stacks.update(plan.stacks)
        self._written_frames.update(plan.frames)
        if len(self._written_groups) > 100_000:
            self._written_groups.clear()
        self._written_groups.update(plan.groups)
        for tag, seen in plan.tags.items():
            if tag not in self._tags_written:
                key = tag[:3]
                self._tag_counts[key] = self._tag_counts.get(key, 0) + 1
            self._tags_written[tag] = max(self._tags_written.get(tag, -1), seen)
            self._tags_seen[tag] = max(self._tags_seen.get(tag, -1), seen)
        self._remember_series(plan.series)

    # -- series --------------------------------------------------------------------------------

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
            sql += " AND trace_id IN %(traces)s"
            params["traces"] = tuple(t.lower() for t in where.trace_ids) or ("-",)
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

    # -- traces --------------------------------------------------------------------------------

    def _span_groups(self, group_ids: Sequence[int]) -> Dict[int, SpanGroup]:
        missing = [g for g in set(group_ids) if g not in self._groups]
        for part in chunks(missing):
            rows = self._clients.query(
                "SELECT group_id, any(service), any(resource) AS resource, "
                "any(resource_schema_url), any(scope) AS scope, any(scope_schema_url), "
                f"any(attrs) FROM span_groups WHERE group_id IN {in_list(part)} "
                "GROUP BY group_id",
                binary=("resource", "scope"),
            ).result_rows
            if len(self._groups) > 100_000:
                self._groups = {}  # a new dict: readers holding the old one are unaffected
            for gid, service, resource, rurl, scope, surl, attrs in rows:
                self._groups[gid] = SpanGroup(service, resource, rurl, scope, surl, attrs)
        cache = self._groups
        return {g: group for g in group_ids if (group := cache.get(g)) is not None}

    def trace(self, tenant: str, trace_id: str) -> List[StoredSpan]:
        params = {"tenant": tenant, "trace": trace_id.lower()}
        # The trace's bounds from its index first (one primary-key lookup, run before the
        # scan), so that the spans' key narrows to the trace's hours and trace id.
        rows = self._clients.query(
            "WITH (SELECT (min(start_ns), max(end_ns)) FROM trace_index "
            "      WHERE tenant = %(tenant)s AND trace_id = %(trace)s) AS bounds "
            "SELECT trace_id, span_id, parent_span_id, name, kind, service, start_ns, end_ns, "
            "status_code, raw, group_id FROM spans "
            "WHERE tenant = %(tenant)s AND trace_id = %(trace)s "
            "AND start_ns >= bounds.1 AND start_ns <= bounds.2 "
            "LIMIT 1 BY span_id",
            params,
            binary=("raw",),
        ).result_rows
        groups = self._span_groups([r[-1] for r in rows])
        return [
            StoredSpan(*fields, group=groups[gid])
            for *fields, gid in rows
            if gid in groups  # else a group lost to a failed commit
        ]

    def _search_rows(self, sql: str, params: Dict[str, Any]) -> List[tuple]:
        """Rows of a statement built from search conditions: what the conditions got wrong
        (a regular expression, a value of the wrong type) is a SearchError, the rest a
        StoreError."""
        client = self._clients.get()  # not _clients.query: it hides ClickHouse's error code
        try:
            return client.query(sql, parameters=params).result_rows
        except Exception as exc:  # noqa: BLE001
            code = getattr(exc, "code", None)
            if code == _CANNOT_COMPILE_REGEXP:
                # The message shows the pattern as wrapped for a full match: say what it is.
                raise SearchError(f"invalid regular expression: {reason_of(exc)}") from None
            if code in _BAD_SEARCH_CODES:
                raise SearchError(reason_of(exc)) from None
            raise store_error(exc, "ClickHouse search failed") from exc

    def find_traces(self, tenant: str, query: TraceQuery) -> List[TraceSummary]:
        sql, params = search_sql(CLICKHOUSE, tenant, query)
        rows = self._search_rows(sql, params)
        # Over a cluster each shard picks its own newest traces: keep the newest of all.
        return TraceSummary.from_rows(rows, query.limit)

    def span_traces(self, tenant: str, span_ids: Sequence[int]) -> Dict[int, str]:
        out: Dict[int, str] = {}
        for part in chunks(list(span_ids)):
            rows = self._clients.query(
                "SELECT span_id, any(trace_id) FROM spans WHERE tenant = %(tenant)s "
                f"AND span_id IN {in_list(part)} GROUP BY span_id",
                {"tenant": tenant},
            ).result_rows
            out.update(rows)
        return out

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
            "SELECT trace_id, span_id, parent_span_id, name, service, start_ns, end_ns "
            "FROM spans WHERE tenant = %(tenant)s AND start_ns >= %(start)s "
            "AND start_ns < %(end)s"
        )
        params: Dict[str, Any] = {"tenant": tenant, "start": int(start_ns), "end": int(end_ns)}
        if service is not None:
            sql += " AND service = %(service)s"
            params["service"] = service
        if name is not None:
            sql += " AND name = %(name)s"
            params["name"] = name
        if trace_ids is not None:
            sql += " AND trace_id IN %(traces)s"
            params["traces"] = tuple(t.lower() for t in trace_ids) or ("-",)
        # LIMIT 1 BY: an export retried after it landed stores a span twice.
        sql += " ORDER BY start_ns DESC, span_id LIMIT 1 BY trace_id, span_id LIMIT %(limit)s"
        params["limit"] = int(limit)
        return [SpanInfo(*row) for row in self._clients.query(sql, params).result_rows]

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
            CLICKHOUSE,
            tenant=tenant,
            start=int(start_ns),
            end=int(end_ns),
            limit=max(int(limit), 0),
        )
        sql = (
            "SELECT trace_id, span_id, parent_span_id, name, kind, service, start_ns, end_ns, "
            "status_code, attrs, group_id FROM spans WHERE tenant = %(tenant)s "
            "AND start_ns < %(end)s AND end_ns >= %(start)s"
        )
        for cond in conditions:
            sql += f" AND ({span_condition(cond, bind)})"
        if trace_ids is not None:
            sql += f" AND trace_id IN {bind(tuple(t.lower() for t in trace_ids) or ('-',))}"
        # LIMIT 1 BY: an export retried after it landed stores a span twice.
        sql += " ORDER BY start_ns DESC, span_id LIMIT 1 BY trace_id, span_id LIMIT %(limit)s"
        rows = self._search_rows(sql, bind.params)
        groups = self._span_groups([r[-1] for r in rows])
        return [
            SpanRecord(*fields, groups[gid].attrs if gid in groups else "") for *fields, gid in rows
        ]

    def count_local_roots(self, tenant: str, service: str, start_ns: int, end_ns: int) -> int:
        # Spans are sharded by trace: a span's parent is on its shard, so the subquery runs
        # on each shard's own spans (distributed_product_mode = 'local').
        rows = self._clients.query(
            "SELECT count() FROM (SELECT trace_id, span_id, any(parent_span_id) AS parent "
            "FROM spans WHERE tenant = %(tenant)s AND service = %(service)s "
            "AND start_ns >= %(start)s AND start_ns < %(end)s GROUP BY trace_id, span_id) "
            "WHERE parent = 0 OR (trace_id, parent) NOT IN (SELECT trace_id, span_id "
            "FROM spans WHERE tenant = %(tenant)s AND service = %(service)s "
            "AND start_ns >= %(lookback)s AND start_ns < %(end)s AND span_id <> parent_span_id)",
            {
                "tenant": tenant,
                "service": service,
                "start": int(start_ns),
                "end": int(end_ns),
                "lookback": int(start_ns) - PARENT_LOOKBACK_NS,
            },
        ).result_rows
        return int(rows[0][0]) if rows else 0

    def _tags_of(self, tenant: str, since_ns: int, name: Optional[str] = None) -> List[tuple]:
        """(scope, key, value, type) seen since the given time.  The table's last_seen may be
        up to TAG_REFRESH_NS behind the latest sighting: this server's own sightings are exact,
        another server's are taken with that slack."""
        sql = (
            "SELECT scope, key, value, type, max(last_seen) FROM span_tags "
            "WHERE tenant = %(tenant)s"
        )
        params: Dict[str, Any] = {"tenant": tenant, "since": int(since_ns) - TAG_REFRESH_NS}
        if name is not None:
            sql += " AND key = %(name)s"
            params["name"] = name
        sql += " GROUP BY scope, key, value, type HAVING max(last_seen) >= %(since)s"
        out = []
        for scope, key, value, kind, table_seen in self._clients.query(sql, params).result_rows:
            tag = (tenant, scope, key, value, kind)
            own_seen = self._tags_seen.get(tag, -1)
            own_written = self._tags_written.get(tag, -1)
            seen_elsewhere = table_seen > own_written  # a row another server wrote
            if max(table_seen, own_seen) >= since_ns or (
                seen_elsewhere and table_seen + TAG_REFRESH_NS >= since_ns
            ):
                out.append((scope, key, value, kind))
        return out

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
            changes = self._rules_changes.get(tenant, 0)
        fetched_at = time.monotonic()
        rows = self._clients.query(
            "SELECT service, selector, argMax(settings, version), argMax(deleted, version), "
            "max(version), argMax(updated_at, version) FROM settings_rules "
            "WHERE tenant = %(tenant)s GROUP BY service, selector",
            {"tenant": tenant},
        ).result_rows
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
            # A change made here while this read ran: the read may predate it, do not keep it.
            if self._rules_changes.get(tenant, 0) == changes:
                self._rules[tenant] = (fetched_at, rules, version)
        return rules, version

    def _fresh_rules(self, tenant: str) -> Tuple[Dict[Tuple[str, str], SettingsRule], int]:
        with self._rules_lock:
            self._rules.pop(tenant, None)
        return self._load_rules(tenant)

    def put_settings_rule(
        self, tenant: str, service: str, selector: str, settings: Mapping[str, Any]
    ) -> SettingsRule:
        text = json.dumps(dict(settings), sort_keys=True)
        # On the writer thread: one change at a time per server, after the pushes before it.
        return self._writer.run(lambda: self._put_rule(tenant, service, selector, text)).result()

    def _put_rule(self, tenant: str, service: str, selector: str, text: str) -> SettingsRule:
        _, version = self._fresh_rules(tenant)
        rule = SettingsRule(service, selector, json.loads(text), version + 1, time.time_ns())
        self._write_rule(tenant, service, selector, text, False, rule.version, rule.updated_at)
        return rule

    def delete_settings_rule(self, tenant: str, service: str, selector: str) -> bool:
        return self._writer.run(lambda: self._delete_rule(tenant, service, selector)).result()

    def _delete_rule(self, tenant: str, service: str, selector: str) -> bool:
        rules, version = self._fresh_rules(tenant)
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
        # A delete leaves a row too: it carries the tenant's version forward.  Versions are one
        # more than the highest read; two servers changing one tenant's rules in the same
        # instant may give two changes one number.
        self._insert(
            _Insert(
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
        )
        with self._rules_lock:
            self._rules_changes[tenant] = self._rules_changes.get(tenant, 0) + 1
            self._rules.pop(tenant, None)

    def settings_rules(self, tenant: str, service: Optional[str] = None) -> List[SettingsRule]:
        rules, _ = self._load_rules(tenant)
        return sorted(
            (r for r in rules.values() if service is None or r.service == service),
            key=lambda r: (r.service, r.selector),
        )

    def settings_version(self, tenant: str) -> int:
        return self._load_rules(tenant)[1]

    def size_bytes(self) -> Optional[int]:
        # Compressed, as on disk; on a cluster, of the node that answers (each shard's parts
        # are its own: sum the nodes' metrics in Prometheus).
        rows = self._clients.query(
            "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = %(db)s AND active",
            {"db": self.url.database},
        ).result_rows
        return int(rows[0][0] or 0) if rows else 0

    # -- documents -----------------------------------------------------------------------------

    def put_document(self, tenant: str, kind: str, name: str, body: Mapping[str, Any]) -> Document:
        text = json.dumps(dict(body), sort_keys=True)
        doc = Document(tenant, kind, name, json.loads(text), time.time_ns())
        self._writer.run(lambda: self._write_document(doc, text, False)).result()
        return doc

    def _write_document(self, doc: Document, text: str, deleted: bool) -> None:
        self._insert(
            _Insert(
                "documents",
                {
                    "tenant": [doc.tenant],
                    "kind": [doc.kind],
                    "name": [doc.name],
                    "body": [text],
                    "deleted": [int(deleted)],
                    "updated_at": [doc.updated_at],
                },
                ("String", "String", "String", "String", "UInt8", "Int64"),
            )
        )

    def documents(self, kind: str, tenant: Optional[str] = None) -> List[Document]:
        # Rows are folded by the query, not by FINAL: merges happen when ClickHouse likes.
        where = "kind = %(kind)s" + (" AND tenant = %(tenant)s" if tenant is not None else "")
        rows = self._clients.query(
            "SELECT tenant, name, argMax(body, updated_at), argMax(deleted, updated_at), "
            f"max(updated_at) FROM documents WHERE {where} GROUP BY tenant, name "
            "ORDER BY tenant, name",
            {"kind": kind, "tenant": tenant or ""},
        ).result_rows
        out = []
        for doc_tenant, name, body, deleted, updated_at in rows:
            if deleted:
                continue
            try:
                out.append(Document(doc_tenant, kind, name, json.loads(body), updated_at))
            except ValueError as exc:
                log.error("skipping unreadable %s %r of tenant %s: %s", kind, name, tenant, exc)
        return out

    def delete_document(self, tenant: str, kind: str, name: str) -> bool:
        def delete() -> bool:
            found = [d for d in self.documents(kind, tenant) if d.name == name]
            if not found:
                return False
            # Newer than the row it hides, even if this server's clock is behind the writer's.
            gone = Document(tenant, kind, name, {}, max(time.time_ns(), found[0].updated_at + 1))
            self._write_document(gone, "{}", True)
            return True

        return self._writer.run(delete).result()

    # -- retention -----------------------------------------------------------------------------

    def delete_before(
        self, cutoff_ns: int, should_stop: Callable[[], bool] = lambda: False
    ) -> RetentionReport:
        """Samples of whole days older than the cutoff go as partitions (no scan).  With a TTL
        (the database's retention) ClickHouse drops the rest, and spans, as their parts
        expire; without one everything older is deleted row by row (lightweight deletes).
        Runs on the calling thread: ingest never waits for it."""
        if self._clients.closed:
            raise StoreClosed("store is closed")
        report = RetentionReport(samples=self._drop_days("samples", cutoff_ns))
        if self.retention_days is None:
            for table, column in (
                ("samples", "ts"),
                ("spans", "end_ns"),
                ("trace_index", "end_ns"),
            ):
                if should_stop():
                    return report
                deleted = self._delete_rows(table, column, cutoff_ns)
                if table == "samples":
                    report += RetentionReport(samples=deleted)
                elif table == "spans":
                    report += RetentionReport(spans=deleted)
        if not should_stop():
            report += RetentionReport(series=self._collect_garbage(cutoff_ns))
        return report

    def _drop_days(self, table: str, cutoff_ns: int) -> int:
        """Drop the partitions (days since the epoch) wholly before the cutoff's day; spans
        are partitioned by start but expire by end, so only samples go this way."""
        local = self.layout.local(table)
        parts = self._clients.query(
            "SELECT partition_id, sum(rows) FROM "
            + (
                f"clusterAllReplicas({quote(self.layout.cluster)}, system.parts)"
                if self.layout.cluster
                else "system.parts"
            )
            + " WHERE database = %(db)s AND table = %(table)s AND active GROUP BY partition_id",
            {"db": self.url.database, "table": local},
        ).result_rows
        deleted = 0
        for partition_id, rows in parts:
            if partition_id.isdigit() and int(partition_id) < cutoff_ns // DAY_NS:
                self._clients.command(
                    f"ALTER TABLE {quote_name(local)}{self.layout.on_cluster} "
                    f"DROP PARTITION ID {quote(partition_id)}"
                )
                deleted += int(rows)
        return deleted

    def _delete_rows(self, table: str, column: str, cutoff_ns: int) -> int:
        params = {"cutoff": int(cutoff_ns)}
        (count,) = self._clients.query(
            f"SELECT count() FROM {table} WHERE {column} < %(cutoff)s", params
        ).result_rows[0]
        if count:
            self._clients.command(
                f"DELETE FROM {quote_name(self.layout.local(table))}{self.layout.on_cluster} "
                f"WHERE {column} < %(cutoff)s",
                params,
            )
        return int(count)

    def _collect_garbage(self, cutoff_ns: int) -> int:
        """Series without samples since the cutoff, and tags not seen since it.  Deletes name
        the rows (no subquery): a replicated table refuses mutations it cannot replay."""
        params = {"cutoff": int(cutoff_ns)}
        gone = self._clients.query(
            "SELECT tenant, series_id FROM series GROUP BY tenant, series_id "
            "HAVING max(last_ts) < %(cutoff)s",
            params,
        ).result_rows
        for part in chunks(gone, 1000):
            rows = ",".join(f"({quote(t)},{int(s)})" for t, s in part)
            self._clients.command(
                f"DELETE FROM {quote_name(self.layout.local('series'))}{self.layout.on_cluster} "
                f"WHERE (tenant, series_id) IN ({rows})"
            )
        old_tags = self._clients.query(
            "SELECT tenant, scope, key, value, type FROM span_tags "
            "GROUP BY tenant, scope, key, value, type HAVING max(last_seen) < %(cutoff)s",
            params,
        ).result_rows
        for part in chunks(old_tags, 500):
            rows = ",".join("(" + ",".join(quote(str(v)) for v in tag) + ")" for tag in part)
            self._clients.command(
                f"DELETE FROM {quote_name(self.layout.local('span_tags'))}"
                f"{self.layout.on_cluster} WHERE (tenant, scope, key, value, type) IN ({rows})"
            )
        with self._series_lock:
            for tenant, sid in gone:
                self._own_series.get(tenant, {}).pop(sid, None)
            self._series = {}
        # Written again when next seen; the writer thread may be adding some meanwhile.
        for tag in old_tags:
            tag = tuple(tag)
            if self._tags_written.pop(tag, None) is not None:
                self._tags_seen.pop(tag, None)
                key = tag[:3]
                self._tag_counts[key] = max(self._tag_counts.get(key, 1) - 1, 0)
        return len(gone)

    def close(self) -> None:
        if self._clients.closed:
            return
        self._writer.close()
        self._clients.close()


__all__ = ["ClickHouseStore", "ClickHouseURL"]
