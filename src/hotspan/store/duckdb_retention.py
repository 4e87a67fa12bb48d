"""The embedded store's retention: samples and spans deleted an hour at a time on the writer
thread, then the series, stacks, frames, span groups and tags nothing refers to.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Dict, List, Optional, Set, Tuple

import duckdb
import numpy as np

from hotspan.store.base import RetentionReport, SeriesRecord
from hotspan.store.batching import GroupCommitWriter
from hotspan.store.duckdb_schema import transaction

# Retention deletes at most this much time of samples (or spans) per writer job.
RETENTION_SLICE_NS = 3600 * 10**9


class DuckDBRetention:
    """Retention, for :class:`~hotspan.store.duckdb.DuckDBStore`."""

    # The store's state that this part reads and changes (and its cursor).
    _con: duckdb.DuckDBPyConnection
    _writer: GroupCommitWriter
    _known_stacks: Set[int]
    _known_groups: Set[int]
    _recent_attrs: Optional[int]
    _series_lock: threading.Lock
    _series: Dict[str, Dict[int, SeriesRecord]]
    _tags: Dict[Tuple[int, str, str, str, str], List[int]]
    _tag_counts: Dict[Tuple[int, str, str], int]
    _cursor: Callable[[], duckdb.DuckDBPyConnection]

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
                    functools.partial(self._delete_older, table, column, upto)
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
        if table == "spans":  # and their attributes' index rows
            for index in ("span_attrs", "span_attrs_recent"):
                self._con.execute(f"DELETE FROM {index} WHERE end_ns < ?", [upto_ns])
            self._recent_attrs = None  # counted again at the next commit
        row = self._con.execute(f"DELETE FROM {table} WHERE {column} < ?", [upto_ns]).fetchone()
        if table == "spans":  # the spans from before the index gone: every span is in it
            self._con.execute(
                "UPDATE span_attrs_meta SET indexed_from = 0 WHERE indexed_from > 0 AND NOT "
                "EXISTS (SELECT 1 FROM spans WHERE start_ns < span_attrs_meta.indexed_from)"
            )
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
        with transaction(con):
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
