"""The embedded store: one DuckDB file in the data directory.

Stacks are kept in a hashed stack table (stack id -> frame ids, root first), the way Parca,
Coroot and qryn store them, rather than in Pyroscope's per-block parent-pointer tree.  A
content hash needs no coordination between writers and no read before a write, and the query
side does not need a tree on disk: it sums samples per stack in SQL and builds the flame graph
from those sums with vectorised array operations (``hotspan.query.flamegraph``).  Samples are
appended in arrival order, which is roughly time order, so DuckDB's per-row-group min/max
indexes skip most of the table for a short time range.

The store is put together from its parts, one module each: the tables (``duckdb_schema``),
writing (``duckdb_write``), series and samples (``duckdb_profiles``), spans and tags
(``duckdb_traces``), settings rules and documents (``duckdb_documents``) and retention
(``duckdb_retention``).  Opening it, its cursors and closing it are here; so is the state the
parts share, which each names at its top.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

import duckdb

from hotspan.model.trace import SpanGroup
from hotspan.store.base import SeriesRecord, SettingsRule, Store, StoreClosed, StoreError
from hotspan.store.batching import GroupCommitWriter
from hotspan.store.duckdb_documents import DuckDBDocuments
from hotspan.store.duckdb_metrics import DuckDBMetrics
from hotspan.store.duckdb_profiles import DuckDBProfiles
from hotspan.store.duckdb_retention import DuckDBRetention
from hotspan.store.duckdb_schema import SCHEMA, upgrade
from hotspan.store.duckdb_traces import DuckDBTraces
from hotspan.store.duckdb_write import DuckDBWriting

DB_FILE = "hotspan.duckdb"
log = logging.getLogger(__name__)
CHECKPOINT_THRESHOLD = "128MiB"


class DuckDBStore(
    DuckDBWriting,
    DuckDBProfiles,
    DuckDBTraces,
    DuckDBMetrics,
    DuckDBDocuments,
    DuckDBRetention,
    Store,
):
    def __init__(self, data_dir: str, threads: int = 0) -> None:
        os.makedirs(data_dir, exist_ok=True)
        self.path = os.path.join(data_dir, DB_FILE)
        # A checkpoint (the WAL folded into the file) costs more than its share of the new
        # data, ~0.2 s whatever the WAL holds: at DuckDB's 16 MB it was half the CPU of span
        # ingest, at 64 MB still 40% of the writer's (750k spans: 18 us a span; at 128 MB
        # 13.9, at 256 MB 12.8).  What it costs is a longer WAL to replay at a start after a
        # crash (~2 s) and that much more data in memory.
        config: Dict[str, Any] = {"checkpoint_threshold": CHECKPOINT_THRESHOLD}
        if threads:
            config["threads"] = threads
        try:
            self._con = duckdb.connect(self.path, config=config)
        except duckdb.Error as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        upgrade(self._con)
        self._con.execute(SCHEMA)
        self._local = threading.local()
        self._series_lock = threading.Lock()
        self._series: Dict[str, Dict[int, SeriesRecord]] = {}
        self._load_series()
        self._tenant_ids: Dict[str, int] = {}
        self._reload_tenant_ids()
        # Ids already written by this process; a restart only costs redundant no-op inserts.
        self._known_frames: Set[int] = set()
        self._known_stacks: Set[int] = set()
        self._known_groups: Set[int] = set()
        self._groups: Dict[int, SpanGroup] = {}
        # Rows in span_attrs_recent (None: to count), kept on the writer thread.
        self._recent_attrs: Optional[int] = None
        self._bytes_as_blob: Optional[bool] = None  # asked on the writer thread
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

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        if self._closed:
            raise StoreClosed("store is closed")
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            cur = self._con.cursor()
            self._local.cursor = cur
        return cur

    def size_bytes(self) -> Optional[int]:
        # The database file and its write-ahead log, which holds the latest commits.
        total = 0
        for path in (self.path, self.path + ".wal"):
            try:
                total += os.stat(path).st_size
            except OSError:
                continue  # no WAL right after a checkpoint
        return total

    def close(self) -> None:
        if self._closed:
            return
        self._writer.close()
        self._closed = True
        self._con.close()
