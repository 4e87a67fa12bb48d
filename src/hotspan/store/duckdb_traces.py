"""The embedded store's span reads: traces, search (the SQL of :mod:`hotspan.store.search_sql`),
span lists and the tags of the tag APIs.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import duckdb

from hotspan.model.trace import (
    UNSCOPED_TAG_SCOPES,
    Condition,
    SearchError,
    SpanGroup,
    SpanRecord,
    StoredSpan,
    TraceQuery,
    TraceSummary,
)
from hotspan.store.base import PARENT_LOOKBACK_NS, RequestSides, SampleFilter, SpanBaseline
from hotspan.store.search_sql import DUCKDB, Binder, search_sql, span_condition


class DuckDBTraces:
    """Spans and their tags, for :class:`~hotspan.store.duckdb.DuckDBStore`."""

    # The store's state that this part reads and changes (and its cursor).
    _tenant_ids: Dict[str, int]
    _groups: Dict[int, SpanGroup]
    _tags: Dict[Tuple[int, str, str, str, str], List[int]]
    _cursor: Callable[[], duckdb.DuckDBPyConnection]

    def _span_groups(self, group_ids: Sequence[int]) -> Dict[int, SpanGroup]:
        missing = [g for g in set(group_ids) if g not in self._groups]
        if missing:
            rows = (
                self._cursor()
                .execute(
                    "SELECT group_id, service, resource, resource_schema_url, scope, "
                    "scope_schema_url, attrs FROM span_groups "
                    "WHERE group_id IN (SELECT unnest(?::BIGINT[]))",
                    [missing],
                )
                .fetchall()
            )
            if len(self._groups) > 100_000:
                self._groups = {}  # a new dict: readers holding the old one are unaffected
            for gid, *fields in rows:
                self._groups[gid] = SpanGroup(*fields)
        cache = self._groups
        return {g: group for g in group_ids if (group := cache.get(g)) is not None}

    def trace(self, tenant: str, trace_id: str) -> List[StoredSpan]:
        rows = (
            self._cursor()
            .execute(
                "SELECT trace_id, span_id, parent_span_id, name, kind, service, start_ns, "
                "end_ns, status_code, raw, group_id FROM spans "
                "WHERE tenant_id = ? AND trace_id = ?",
                [self._tenant_ids.get(tenant, -1), trace_id.lower()],
            )
            .fetchall()
        )
        groups = self._span_groups([r[-1] for r in rows])
        out = []
        seen = set()
        for trace, span_id, parent, name, kind, service, start, end, status, raw, gid in rows:
            if span_id in seen or gid not in groups:
                continue  # an export retried after it landed; a group lost to a crash
            seen.add(span_id)
            group = groups[gid]
            out.append(
                StoredSpan(
                    trace, span_id, parent, name, kind, service, start, end, status, raw, group
                )
            )
        return out

    def _unindexed_before(self) -> int:
        """Where the attribute index starts (duckdb_schema's span_attrs_meta)."""
        row = self._cursor().execute("SELECT max(indexed_from) FROM span_attrs_meta").fetchone()
        return int(row[0] or 0) if row else 0

    def find_traces(self, tenant: str, query: TraceQuery) -> List[TraceSummary]:
        sql, params = search_sql(
            DUCKDB, self._tenant_ids.get(tenant, -1), query, self._unindexed_before()
        )
        try:
            rows = self._cursor().execute(sql, params).fetchall()
        except (duckdb.InvalidInputException, duckdb.ConversionException) as exc:
            # A regular expression RE2 refuses, a value of the wrong type: the query's fault.
            raise SearchError(str(exc).splitlines()[0]) from None
        # One row per (trace, matched span), traces in order.
        return TraceSummary.from_rows(rows)

    def span_traces(self, tenant: str, span_ids: Sequence[int]) -> Dict[int, str]:
        if not span_ids:
            return {}
        rows = (
            self._cursor()
            .execute(
                "SELECT span_id, any_value(trace_id) FROM spans WHERE tenant_id = ? "
                "AND span_id IN (SELECT unnest(?::UBIGINT[])) GROUP BY span_id",
                [self._tenant_ids.get(tenant, -1), [int(s) for s in span_ids]],
            )
            .fetchall()
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
        name: Optional[str] = None,
    ) -> List[SpanRecord]:
        sql = (
            "SELECT DISTINCT ON (trace_id, span_id) trace_id, span_id, parent_span_id, name, "
            "service, start_ns, end_ns, status_code FROM spans "
            "WHERE tenant_id = ? AND start_ns >= ? AND start_ns < ?"
        )
        params: list = [self._tenant_ids.get(tenant, -1), start_ns, end_ns]
        if service is not None:
            sql += " AND service = ?"
            params.append(service)
        if name is not None:
            sql += " AND name = ?"
            params.append(name)
        if trace_ids is not None:
            sql += " AND trace_id IN (SELECT unnest(?::VARCHAR[]))"
            params.append([t.lower() for t in trace_ids])
        # DISTINCT ON: an export retried after it landed stores a span twice.
        sql = f"SELECT * FROM ({sql}) ORDER BY start_ns DESC, span_id LIMIT ?"
        params.append(int(limit))
        rows = self._cursor().execute(sql, params).fetchall()
        return SpanRecord.outlines(rows)

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
            DUCKDB,
            tenant=self._tenant_ids.get(tenant, -1),
            start=int(start_ns),
            end=int(end_ns),
            limit=max(int(limit), 0),
        )
        bind.span_range = ("start", "end")
        bind.unindexed_before = self._unindexed_before()
        sql = (
            "SELECT DISTINCT ON (trace_id, span_id) trace_id, span_id, parent_span_id, name, "
            "kind, service, start_ns, end_ns, status_code, attrs, group_id FROM spans "
            "WHERE tenant_id = $tenant AND end_ns >= $start AND start_ns < $end"
        )
        for cond in conditions:
            sql += f" AND ({span_condition(cond, bind)})"
        if trace_ids is not None:
            traces = bind([t.lower() for t in trace_ids])
            sql += f" AND trace_id IN (SELECT unnest({traces}::VARCHAR[]))"
        sql = f"SELECT * FROM ({sql}) ORDER BY start_ns DESC, span_id LIMIT $limit"
        try:
            rows = self._cursor().execute(sql, bind.params).fetchall()
        except (duckdb.InvalidInputException, duckdb.ConversionException) as exc:
            raise SearchError(str(exc).splitlines()[0]) from None
        groups = self._span_groups([r[-1] for r in rows])
        return [
            SpanRecord._make([*fields, groups[gid].attrs if gid in groups else ""])
            for *fields, gid in rows
        ]

    def count_local_roots(self, tenant: str, service: str, start_ns: int, end_ns: int) -> int:
        tid = self._tenant_ids.get(tenant, -1)
        row = (
            self._cursor()
            .execute(
                "WITH mine AS (SELECT DISTINCT trace_id, span_id, parent_span_id FROM spans "
                "WHERE tenant_id = ? AND service = ? AND start_ns >= ? AND start_ns < ?), "
                "parents AS (SELECT DISTINCT trace_id, span_id FROM spans "
                "WHERE tenant_id = ? AND service = ? AND start_ns >= ? AND start_ns < ? "
                "AND trace_id IN (SELECT trace_id FROM mine WHERE parent_span_id <> 0)) "
                "SELECT count(*) FROM mine WHERE parent_span_id = 0 OR NOT EXISTS ("
                "SELECT 1 FROM parents p WHERE p.trace_id = mine.trace_id "
                "AND p.span_id = mine.parent_span_id AND p.span_id <> mine.span_id)",
                [
                    tid,
                    service,
                    start_ns,
                    end_ns,
                    tid,
                    service,
                    start_ns - PARENT_LOOKBACK_NS,
                    end_ns,
                ],
            )
            .fetchone()
        )
        return int(row[0]) if row else 0

    def baseline_spans(
        self,
        tenant: str,
        service: str,
        name: str,
        start_ns: int,
        end_ns: int,
        limit: int,
        exclude_trace: str = "",
        exclude_span_ids: Sequence[int] = (),
    ) -> SpanBaseline:
        # The median over every candidate as a window aggregate: one pass, and only the
        # chosen rows leave the database.
        rows = (
            self._cursor()
            .execute(
                "WITH c AS (SELECT DISTINCT ON (trace_id, span_id) trace_id, span_id, "
                "parent_span_id, name, service, start_ns, end_ns FROM spans "
                "WHERE tenant_id = ? AND service = ? AND name = ? AND start_ns >= ? "
                "AND start_ns < ? AND NOT (trace_id = ? "
                "AND span_id IN (SELECT unnest(?::UBIGINT[])))), "
                "m AS (SELECT *, median(end_ns - start_ns) OVER () AS med, "
                "count(*) OVER () AS n FROM c) "
                "SELECT * FROM m "
                "ORDER BY abs((end_ns - start_ns) - med), start_ns DESC, span_id LIMIT ?",
                [
                    self._tenant_ids.get(tenant, -1),
                    service,
                    name,
                    int(start_ns),
                    int(end_ns),
                    exclude_trace.lower(),
                    [int(s) for s in exclude_span_ids],
                    max(int(limit), 1),
                ],
            )
            .fetchall()
        )
        return SpanBaseline.from_rows(rows, limit)

    def request_sides(
        self,
        tenant: str,
        service: str,
        start_ns: int,
        end_ns: int,
        sides: Tuple[Sequence[int], Sequence[int]],
        samples: SampleFilter,
    ) -> RequestSides:
        tid = self._tenant_ids.get(tenant, -1)
        a, b = ([int(s) for s in side] for side in sides)
        # Requests as count_local_roots finds them, counted per trace, beside each trace's
        # samples per side: one row per trace, so a trace's samples count once.
        row = (
            self._cursor()
            .execute(
                "WITH mine AS (SELECT DISTINCT trace_id, span_id, parent_span_id FROM spans "
                "WHERE tenant_id = $tenant AND service = $service AND start_ns >= $start "
                "AND start_ns < $end), "
                "parents AS (SELECT DISTINCT trace_id, span_id FROM spans "
                "WHERE tenant_id = $tenant AND service = $service AND start_ns >= $lookback "
                "AND start_ns < $end "
                "AND trace_id IN (SELECT trace_id FROM mine WHERE parent_span_id <> 0)), "
                "roots AS (SELECT trace_id, count(*) AS n FROM mine "
                "WHERE parent_span_id = 0 OR NOT EXISTS (SELECT 1 FROM parents p "
                "WHERE p.trace_id = mine.trace_id AND p.span_id = mine.parent_span_id "
                "AND p.span_id <> mine.span_id) GROUP BY trace_id), "
                "vals AS (SELECT trace_id, "
                "sum(value) FILTER (WHERE list_contains($a::BIGINT[], series_id)) AS va, "
                "sum(value) FILTER (WHERE list_contains($b::BIGINT[], series_id)) AS vb "
                "FROM samples WHERE tenant_id = $tenant AND ts >= $from AND ts < $until "
                "AND series_id IN (SELECT unnest(list_concat($a::BIGINT[], $b::BIGINT[]))) "
                "AND trace_id IN (SELECT trace_id FROM roots) GROUP BY trace_id), "
                "j AS (SELECT n, coalesce(va, 0) AS va, coalesce(vb, 0) AS vb "
                "FROM roots LEFT JOIN vals USING (trace_id)) "
                "SELECT "
                "coalesce(sum(n) FILTER (WHERE (va <> 0 OR vb <> 0) AND va >= vb), 0)::BIGINT, "
                "coalesce(sum(va) FILTER (WHERE (va <> 0 OR vb <> 0) AND va >= vb), 0)::BIGINT, "
                "coalesce(sum(n) FILTER (WHERE vb > va), 0)::BIGINT, "
                "coalesce(sum(vb) FILTER (WHERE vb > va), 0)::BIGINT, "
                "coalesce(sum(n) FILTER (WHERE va = 0 AND vb = 0), 0)::BIGINT FROM j",
                {
                    "tenant": tid,
                    "service": service,
                    "start": int(start_ns),
                    "end": int(end_ns),
                    "lookback": int(start_ns) - PARENT_LOOKBACK_NS,
                    "a": a,
                    "b": b,
                    "from": int(samples.start_ns),
                    "until": int(samples.end_ns),
                },
            )
            .fetchone()
        )
        ra, ta, rb, tb, without = row if row else (0, 0, 0, 0, 0)
        return RequestSides((int(ra), int(rb)), (int(ta), int(tb)), int(without))

    def _tags_of(self, tenant: str, since_ns: int) -> List[Tuple[str, str, str, str]]:
        """(scope, key, value, type) seen for the tenant since the given time, from memory:
        there every tag has its latest time, while the table's may be an hour behind."""
        tid = self._tenant_ids.get(tenant, -1)
        # list() copies the items in one step under the GIL while the writer may add some.
        return [
            tag[1:]
            for tag, entry in list(self._tags.items())
            if tag[0] == tid and entry[1] >= since_ns
        ]

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
            for tag_scope, key, value, kind in self._tags_of(tenant, since_ns)
            if key == name
            and (tag_scope == scope or scope is None and tag_scope in UNSCOPED_TAG_SCOPES)
        }
        return sorted(found)
