"""The ClickHouse store's write path: pushes committed in groups, a few columnar inserts per
group (see :mod:`hotspan.store.clickhouse` for what lands first and why).
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from hotspan.model.profile import Frame, IngestBatch, SampleColumns
from hotspan.model.trace import SpanBatch, SpanGroup, SpanWriteRow
from hotspan.store.base import StoreError
from hotspan.store.batching import (
    Batch,
    GroupCommitWriter,
    PartialCommit,
    has_trace_ids,
    series_bounds,
)
from hotspan.store.clickhouse_connection import Clients, Insert, insert_columns

# A tag already written is written again only when seen this much later (for its last_seen,
# which the tag APIs' time filter reads); stacks and frames once a day while in use, so that
# their TTL follows the samples.
TAG_REFRESH_NS = 60 * 10**9
REWRITE_IDS_S = 86400.0
MAX_TAG_VALUES = 1000

Tag = Tuple[str, str, str, str, str]  # tenant, scope, key, value, type


class _Plan(NamedTuple):
    """A commit, converted to columns before anything is sent."""

    dimensions: List[Insert]  # safe to write twice
    span_facts: List[Insert]
    sample_facts: List[Insert]
    span_batches: Set[int]  # indexes in the group
    sample_batches: Set[int]
    stacks: Set[int]
    frames: Set[int]
    groups: Set[int]
    tags: Dict[Tag, int]
    series: List[list]


class ClickHouseWriting:
    """Writing, for :class:`~hotspan.store.clickhouse.ClickHouseStore`: what it keeps of what this
    server wrote lately (stacks, frames, span groups, tags) saves it redundant writes."""

    # The store's state that this part reads and changes.
    _clients: Clients
    _writer: GroupCommitWriter
    _written_stacks: Set[int]
    _written_frames: Set[int]
    _written_groups: Set[int]
    _written_since: float
    _tags_written: Dict[Tag, int]
    _tags_seen: Dict[Tag, int]
    _tag_counts: Dict[Tuple[str, str, str], int]
    # The profiles part's (clickhouse_profiles.py).
    _remember_series: Callable[[Sequence[list]], None]

    def write(self, tenant: str, batch: IngestBatch) -> Future[None]:
        return self._writer.submit(tenant, batch)

    def write_spans(self, tenant: str, spans: SpanBatch) -> Future[None]:
        return self._writer.submit(tenant, spans)

    def _commit(self, pending: List[Tuple[str, Batch]]) -> None:
        if time.monotonic() - self._written_since > REWRITE_IDS_S:
            self._written_stacks, self._written_frames = set(), set()
            self._written_since = time.monotonic()
        plan = self._plan(pending)
        # Raising here is safe: nothing but rows that may be written twice has landed.
        for insert in plan.dimensions:
            insert_columns(self._clients, insert)
        commit_id = uuid.uuid4().hex
        failed: Set[int] = set()
        cause: Optional[BaseException] = None
        try:
            # Spans a retry writes twice are read once (every read takes one row per span).
            for insert in plan.span_facts:
                insert_columns(self._clients, insert, token=f"{commit_id}-{insert.table}")
        except StoreError as exc:
            failed |= plan.span_batches
            cause = exc
        try:
            for insert in plan.sample_facts:
                insert_columns(self._clients, insert, token=f"{commit_id}-{insert.table}")
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
        dimensions: List[Insert] = []
        if frames:
            dimensions.append(
                Insert(
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
                Insert(
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
                Insert(
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
        sample_facts: List[Insert] = []
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
            if any(has_trace_ids(c.trace_id) for c in columns):
                sample_columns["trace_id"] = [
                    t or "" for t in np.concatenate([c.trace_id for c in columns]).tolist()
                ]
                types.append("String")
            sample_facts.append(Insert("samples", sample_columns, tuple(types)))
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
    ) -> Tuple[List[Insert], List[Insert], Set[int], Dict[Tag, int]]:
        if not batches:
            return [], [], set(), {}
        groups: Dict[int, SpanGroup] = {}
        tags: Dict[Tag, int] = {}
        new_per_key: Dict[Tuple[str, str, str], int] = {}
        rows: List[SpanWriteRow] = []
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
        dimensions: List[Insert] = []
        if groups:
            g = list(groups.values())
            dimensions.append(
                Insert(
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
                Insert(
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
        facts: List[Insert] = []
        if rows:
            cols = list(zip(*rows))
            f = SpanWriteRow._fields
            trace_ids = cols[f.index("trace_id")]
            starts = np.array(cols[f.index("start_ns")], dtype=np.int64)
            ends = np.array(cols[f.index("end_ns")], dtype=np.int64)
            facts.append(
                Insert(
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
                Insert(
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
