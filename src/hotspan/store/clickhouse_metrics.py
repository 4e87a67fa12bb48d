"""The ClickHouse store's TraceQL metrics: one aggregation statement
(:mod:`hotspan.store.metrics_sql`, :mod:`hotspan.store.compare_sql`) over the spans."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from hotspan.store.compare_sql import CLICKHOUSE_COMPARE, ComparePlan, CompareRow, compare_rows
from hotspan.store.metrics_sql import CLICKHOUSE_METRICS, MetricsPlan, MetricsRow, metrics_rows


class ClickHouseMetrics:
    """TraceQL metrics for :class:`~hotspan.store.clickhouse.ClickHouseStore`."""

    # ClickHouseTraces': what a condition got wrong is a SearchError, the rest a StoreError.
    _search_rows: Callable[[str, Dict[str, Any]], List[tuple]]
    # Whether the server computes a CTE once when asked (None: not asked yet).
    _materialized_cte: Optional[bool] = None

    def metrics_rows(self, tenant: str, plan: MetricsPlan) -> Optional[List[MetricsRow]]:
        return metrics_rows(CLICKHOUSE_METRICS, tenant, plan, self._search_rows)

    def compare_rows(
        self, tenant: str, plan: ComparePlan
    ) -> Optional[Tuple[List[CompareRow], int, Optional[int]]]:
        if self._materialized_cte is None:
            # Servers before materialized CTEs (26.x) read each part where it is used.
            found = self._search_rows(
                "SELECT count() FROM system.settings WHERE name = 'enable_materialized_cte'", {}
            )
            self._materialized_cte = bool(found and found[0][0])
        return compare_rows(
            CLICKHOUSE_COMPARE, tenant, plan, self._search_rows, self._materialized_cte
        )
