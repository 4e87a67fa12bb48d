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

The store is put together from its parts, one module each: writing (``clickhouse_write``),
series and samples (``clickhouse_profiles``), spans and tags (``clickhouse_traces``), settings
rules and documents (``clickhouse_documents``) and retention (``clickhouse_retention``).
Opening it, its schema and closing it are here; so is the state the parts share, which each
names at its top.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Dict, Optional, Set, Tuple

from hotspan.model.trace import SpanGroup
from hotspan.store.base import DEFAULT_RETENTION_NS, SeriesRecord, SettingsRule, Store, StoreError
from hotspan.store.batching import GroupCommitWriter
from hotspan.store.clickhouse_connection import ClickHouseURL, Clients, store_error
from hotspan.store.clickhouse_documents import ClickHouseDocuments
from hotspan.store.clickhouse_metrics import ClickHouseMetrics
from hotspan.store.clickhouse_profiles import ClickHouseProfiles
from hotspan.store.clickhouse_retention import DAY_NS, ClickHouseRetention
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
from hotspan.store.clickhouse_traces import ClickHouseTraces
from hotspan.store.clickhouse_write import ClickHouseWriting, Tag

log = logging.getLogger(__name__)


class ClickHouseStore(
    ClickHouseWriting,
    ClickHouseProfiles,
    ClickHouseTraces,
    ClickHouseMetrics,
    ClickHouseDocuments,
    ClickHouseRetention,
    Store,
):
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

    def size_bytes(self) -> Optional[int]:
        # Compressed, as on disk; on a cluster, of the node that answers (each shard's parts
        # are its own: sum the nodes' metrics in Prometheus).
        rows = self._clients.query(
            "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = %(db)s AND active",
            {"db": self.url.database},
        ).result_rows
        return int(rows[0][0] or 0) if rows else 0

    def close(self) -> None:
        if self._clients.closed:
            return
        self._writer.close()
        self._clients.close()


__all__ = ["ClickHouseStore", "ClickHouseURL"]
