"""The embedded store's write path: pushes committed in groups, each group one transaction."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import duckdb
import numpy as np

from hotspan.model.profile import Frame, IngestBatch, SampleColumns
from hotspan.model.trace import SpanBatch, SpanGroup, SpanWriteRow
from hotspan.store.attr_index import (
    RUN_ROWS,
    attr_hash_sql,
    split_attributes,
    trace_id_halves,
)
from hotspan.store.batching import Batch, GroupCommitWriter, has_trace_ids, series_bounds
from hotspan.store.duckdb_schema import transaction

# Values the tag-values API offers per attribute: past it, ids and timestamps would swamp it.
MAX_TAG_VALUES = 1000
# A tag already stored is written again only when seen this much later (for its last_seen).
TAG_REFRESH_NS = 3600 * 10**9


class DuckDBWriting:
    """Writing, for :class:`~hotspan.store.duckdb.DuckDBStore`: tenants are numbered as they
    first write; ids already written are remembered, to skip their no-op inserts."""

    # The store's state that this part reads and changes.
    _con: duckdb.DuckDBPyConnection
    _writer: GroupCommitWriter
    _tenant_ids: Dict[str, int]
    _known_frames: Set[int]
    _known_stacks: Set[int]
    _known_groups: Set[int]
    _tags: Dict[Tuple[int, str, str, str, str], List[int]]
    _tag_counts: Dict[Tuple[int, str, str], int]
    _recent_attrs: Optional[int]
    _bytes_as_blob: Optional[bool]
    # The profiles part's (duckdb_profiles.py).
    _has_series: Callable[[str, int], bool]
    _remember_series: Callable[[Iterable[Sequence[Any]]], None]

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

        new_series = [
            row for (tenant, sid), row in series_rows.items() if not self._has_series(tenant, sid)
        ]
        # A group of known stacks and series is one INSERT, atomic without a transaction:
        # that spares the writer two statements, each a wait for the GIL on a busy server.
        samples_only = (
            not frames
            and not stacks
            and not new_series
            and not span_batches
            and all(t in self._tenant_ids for t in tenants)
        )
        # Tenants numbered in a failed transaction do not exist.
        atomic = (
            contextlib.nullcontext()
            if samples_only
            else transaction(con, undo=self._reload_tenant_ids)
        )
        with atomic:
            if frames:
                frame_table = {  # noqa: F841 - read by DuckDB's replacement scan
                    "frame_id": np.fromiter(frames.keys(), dtype=np.int64, count=len(frames)),
                    "name": np.array([f.name for f in frames.values()], dtype=object),
                    "filename": np.array([f.filename for f in frames.values()], dtype=object),
                    "line": np.array([f.line for f in frames.values()], dtype=np.int64),
                }
                con.execute("INSERT INTO frames SELECT * FROM frame_table ON CONFLICT DO NOTHING")
            if stacks:
                stack_table = {  # noqa: F841
                    "stack_id": np.fromiter(stacks.keys(), dtype=np.int64, count=len(stacks)),
                    "frame_ids": self._blob_column(
                        [np.asarray(f, dtype="<i8").tobytes() for f in stacks.values()]
                    ),
                }
                con.execute(
                    f"INSERT INTO stacks SELECT stack_id, {self._blob_sql('frame_ids')} "
                    "FROM stack_table ON CONFLICT DO NOTHING"
                )
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
                # Reading Python objects is the slow part of an insert: the trace column is
                # left out when no sample of the commit has a trace id.
                traced = any(has_trace_ids(c.trace_id) for c in columns)
                names = [n for n in SampleColumns._fields if traced or n != "trace_id"]
                sample_table = {  # noqa: F841
                    "tenant_id": np.repeat(np.array(tenant_ids, dtype=np.int32), counts),
                    **{name: np.concatenate([getattr(c, name) for c in columns]) for name in names},
                }
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
        rows: List[SpanWriteRow] = []
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
            f = SpanWriteRow._fields
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
                "raw": self._blob_column(cols[f.index("raw")]),
            }
            con.execute(
                "INSERT INTO spans SELECT tenant_id, trace_id, span_id, parent_span_id, name, "
                "kind, service, start_ns, end_ns, status_code, attrs, group_id, "
                f"{self._blob_sql('raw')} FROM span_table"
            )
            added = self._insert_attr_rows(
                con, span_table, cols[f.index("attrs")], cols[f.index("trace_id")]
            )
            if self._recent_attrs is None:  # counted once, then kept (a count is a scan)
                found = con.execute("SELECT count(*) FROM span_attrs_recent").fetchone()
                self._recent_attrs = int(found[0]) if found else 0
            else:
                self._recent_attrs += added
            if self._recent_attrs >= RUN_ROWS:
                # The recent attributes become one run of the index, sorted for lookups.
                con.execute("INSERT INTO span_attrs SELECT * FROM span_attrs_recent ORDER BY h")
                con.execute("DELETE FROM span_attrs_recent")
                self._recent_attrs = 0
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

    @staticmethod
    def _insert_attr_rows(
        con: duckdb.DuckDBPyConnection,
        spans: Dict[str, np.ndarray],
        attrs: Sequence[str],
        trace_ids: Sequence[str],
    ) -> int:
        """The attribute index's rows of the spans (their columns as inserted, and the texts
        of two): the rows ``span_attr_rows`` gives in SQL, split here (attr_index); how many."""
        counts, keys, values = split_attributes(attrs)
        per_span = np.frombuffer(counts, dtype=np.int64)
        high, low = trace_id_halves(trace_ids)
        attr_table = {  # noqa: F841 - read by DuckDB's replacement scan
            **{
                name: np.repeat(spans[name], per_span)
                for name in ("tenant_id", "start_ns", "end_ns", "span_id")
            },
            "key": np.array(keys, dtype=object),
            "value": np.array(values, dtype=object),
            "trace_high": np.repeat(high, per_span),
            "trace_low": np.repeat(low, per_span),
        }
        con.execute(
            "INSERT INTO span_attrs_recent SELECT tenant_id, key, value, "
            f"{attr_hash_sql('key', 'value')}, start_ns, end_ns, "
            "(trace_high::UHUGEINT << 64) | trace_low, span_id FROM attr_table"
        )
        return len(keys)

    def _reads_bytes(self) -> bool:
        """Whether this DuckDB reads an array of Python bytes as BLOB (2.x; 1.x reads it as
        VARCHAR, so bytes go as hex there and are unhexed in SQL), asked once."""
        if self._bytes_as_blob is None:
            probe = {"b": np.array([b"\x00"], dtype=object)}  # noqa: F841 - replacement scan
            found = self._con.execute("SELECT typeof(b) FROM probe").fetchone()
            self._bytes_as_blob = bool(found and found[0] == "BLOB")
        return self._bytes_as_blob

    def _blob_column(self, values: Sequence[bytes]) -> np.ndarray:
        """Bytes as the insert reads them (see :meth:`_reads_bytes`): hex costs ~1.4 us a
        span message more; read back with :meth:`_blob_sql`."""
        if self._reads_bytes():
            return np.array(values, dtype=object)
        return np.array([v.hex() for v in values], dtype=object)

    def _blob_sql(self, column: str) -> str:
        """A :meth:`_blob_column` as BLOB in the insert's SELECT."""
        return column if self._reads_bytes() else f"unhex({column})"

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
