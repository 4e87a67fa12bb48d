"""The ClickHouse store's retention: whole days of samples dropped as partitions, the rest (without
a TTL) deleted by rows, and series and tags no longer seen.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Tuple

from hotspan.store.base import RetentionReport, SeriesRecord, StoreClosed
from hotspan.store.clickhouse_connection import ClickHouseURL, Clients, chunks, quote
from hotspan.store.clickhouse_schema import Layout, quote_name
from hotspan.store.clickhouse_write import Tag

DAY_NS = 86400 * 10**9


class ClickHouseRetention:
    """Retention, for :class:`~hotspan.store.clickhouse.ClickHouseStore`."""

    # The store's state that this part reads and changes.
    _clients: Clients
    url: ClickHouseURL
    layout: Layout
    retention_days: Optional[int]
    _series_lock: threading.Lock
    _series: Dict[str, Tuple[float, Dict[int, SeriesRecord]]]
    _own_series: Dict[str, Dict[int, SeriesRecord]]
    _tags_written: Dict[Tag, int]
    _tags_seen: Dict[Tag, int]
    _tag_counts: Dict[Tuple[str, str, str], int]

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
                ("span_attrs", "end_ns"),
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
