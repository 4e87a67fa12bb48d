"""The embedded store's TraceQL metrics: one aggregation statement
(:mod:`hotspan.store.metrics_sql`, :mod:`hotspan.store.compare_sql`) over the spans."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import duckdb

from hotspan.model.trace import SearchError
from hotspan.store.compare_sql import DUCKDB_COMPARE, ComparePlan, CompareRow, compare_rows
from hotspan.store.metrics_sql import DUCKDB_METRICS, MetricsPlan, MetricsRow, metrics_rows


class DuckDBMetrics:
    """TraceQL metrics for :class:`~hotspan.store.duckdb.DuckDBStore`."""

    _tenant_ids: Dict[str, int]
    _cursor: Callable[[], duckdb.DuckDBPyConnection]

    def _run(self) -> Callable[[str, Dict[str, Any]], List[tuple]]:
        cursor = self._cursor()

        def run(sql: str, params: Dict[str, Any]) -> List[tuple]:
            try:
                return cursor.execute(sql, params).fetchall()
            except (duckdb.InvalidInputException, duckdb.ConversionException) as exc:
                # A regular expression RE2 refuses, a value of the wrong type: the query's
                # fault.
                raise SearchError(str(exc).splitlines()[0]) from None

        return run

    def metrics_rows(self, tenant: str, plan: MetricsPlan) -> Optional[List[MetricsRow]]:
        return metrics_rows(DUCKDB_METRICS, self._tenant_ids.get(tenant, -1), plan, self._run())

    def compare_rows(
        self, tenant: str, plan: ComparePlan
    ) -> Optional[Tuple[List[CompareRow], int, Optional[int]]]:
        return compare_rows(DUCKDB_COMPARE, self._tenant_ids.get(tenant, -1), plan, self._run())
