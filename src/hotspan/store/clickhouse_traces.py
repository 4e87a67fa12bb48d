"""The ClickHouse store's span reads: traces, search (the SQL of :mod:`hotspan.store.search_sql`),
span lists and the tags of the tag APIs.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

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
from hotspan.store.clickhouse_connection import Clients, chunks, in_list, reason_of, store_error
from hotspan.store.clickhouse_write import TAG_REFRESH_NS, Tag
from hotspan.store.search_sql import CLICKHOUSE, Binder, search_sql, span_condition

# ClickHouse errors that are the search's fault (a value ClickHouse cannot compare).
_BAD_SEARCH_CODES = (36, 43, 53, 6)
_CANNOT_COMPILE_REGEXP = 427
# An equality that names more spans of the search's range than this is read by the scan, not
# through the attribute index: past it, the list of the traces it names costs more than
# reading every span of the range (a value that most spans hold, such as an HTTP method).
INDEX_MAX_SPANS = 100_000


class ClickHouseTraces:
    """Spans and their tags, for :class:`~hotspan.store.clickhouse.ClickHouseStore`."""

    # The store's state that this part reads and changes.
    _clients: Clients
    _groups: Dict[int, SpanGroup]
    _tags_written: Dict[Tag, int]
    _tags_seen: Dict[Tag, int]

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
            StoredSpan(
                trace, span_id, parent, name, kind, service, start, end, status, raw, groups[gid]
            )
            for trace, span_id, parent, name, kind, service, start, end, status, raw, gid in rows
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
        def selective(key: str, value: str) -> bool:
            # The index's primary key leads with (tenant, key, value): a few granules read.
            rows = self._clients.query(
                "SELECT count() FROM (SELECT 1 FROM span_attrs WHERE tenant = %(tenant)s "
                "AND key = %(key)s AND value = %(value)s AND start_ns < %(end)s "
                "AND end_ns >= %(start)s LIMIT %(limit)s)",
                {
                    "tenant": tenant,
                    "key": key,
                    "value": value,
                    "start": int(query.start_ns),
                    "end": int(query.end_ns),
                    "limit": INDEX_MAX_SPANS + 1,
                },
            ).result_rows
            return bool(rows) and int(rows[0][0]) <= INDEX_MAX_SPANS

        sql, params = search_sql(CLICKHOUSE, tenant, query, selective=selective)
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
    ) -> List[SpanRecord]:
        sql = (
            "SELECT trace_id, span_id, parent_span_id, name, service, start_ns, end_ns, "
            "status_code FROM spans WHERE tenant = %(tenant)s AND start_ns >= %(start)s "
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
        return SpanRecord.outlines(self._clients.query(sql, params).result_rows)

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
        bind.span_range = ("start", "end")
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
            SpanRecord._make([*fields, groups[gid].attrs if gid in groups else ""])
            for *fields, gid in rows
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
        # The median over every candidate as a window aggregate: the spans are read once,
        # and only the chosen rows leave the database.  quantileExactInclusive(0.5) is the
        # mean of the middle two for an even count, as DuckDB's median.
        exclude = ""
        if exclude_span_ids:
            exclude = f"AND NOT (trace_id = %(trace)s AND span_id IN {in_list(exclude_span_ids)}) "
        rows = self._clients.query(
            "SELECT trace_id, span_id, parent_span_id, name, service, start_ns, end_ns, "
            "quantileExactInclusive(0.5)(end_ns - start_ns) OVER () AS med, "
            "count() OVER () AS n FROM ("
            "SELECT trace_id, span_id, parent_span_id, name, service, start_ns, end_ns "
            "FROM spans WHERE tenant = %(tenant)s AND service = %(service)s "
            "AND name = %(name)s AND start_ns >= %(start)s AND start_ns < %(end)s "
            f"{exclude}LIMIT 1 BY trace_id, span_id) "
            "ORDER BY abs((end_ns - start_ns) - med), start_ns DESC, span_id "
            "LIMIT %(limit)s",
            {
                "tenant": tenant,
                "service": service,
                "name": name,
                "start": int(start_ns),
                "end": int(end_ns),
                "trace": exclude_trace.lower(),
                "limit": max(int(limit), 1),
            },
        ).result_rows
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
        a, b = ([int(s) for s in side] for side in sides)
        # The requests as count_local_roots finds them, counted per trace (spans are sharded
        # by trace: the parents' subquery runs on each shard's own spans), joined to each
        # trace's samples per side (sharded by series: gathered with GLOBAL), one row per
        # trace so that a trace's samples count once.
        rows = self._clients.query(
            "SELECT sumIf(n, (va != 0 OR vb != 0) AND va >= vb), "
            "sumIf(va, (va != 0 OR vb != 0) AND va >= vb), sumIf(n, vb > va), "
            "sumIf(vb, vb > va), sumIf(n, va = 0 AND vb = 0) FROM ("
            "SELECT trace_id, sumIf(value, has(%(a)s, series_id)) AS va, "
            "sumIf(value, has(%(b)s, series_id)) AS vb FROM samples "
            f"WHERE tenant = %(tenant)s AND series_id IN {in_list(a + b)} "
            "AND ts >= %(from)s AND ts < %(until)s AND trace_id != '' GROUP BY trace_id"
            ") AS v GLOBAL RIGHT JOIN ("
            "SELECT trace_id, count() AS n FROM (SELECT trace_id, span_id, "
            "any(parent_span_id) AS parent FROM spans WHERE tenant = %(tenant)s "
            "AND service = %(service)s AND start_ns >= %(start)s AND start_ns < %(end)s "
            "GROUP BY trace_id, span_id) "
            "WHERE parent = 0 OR (trace_id, parent) NOT IN (SELECT trace_id, span_id "
            "FROM spans WHERE tenant = %(tenant)s AND service = %(service)s "
            "AND start_ns >= %(lookback)s AND start_ns < %(end)s "
            "AND span_id <> parent_span_id) GROUP BY trace_id"
            ") AS r ON v.trace_id = r.trace_id",
            {
                "tenant": tenant,
                "service": service,
                "start": int(start_ns),
                "end": int(end_ns),
                "lookback": int(start_ns) - PARENT_LOOKBACK_NS,
                "a": a,
                "b": b,
                "from": int(samples.start_ns),
                "until": int(samples.end_ns),
            },
        ).result_rows
        ra, ta, rb, tb, without = rows[0] if rows else (0, 0, 0, 0, 0)
        return RequestSides((int(ra), int(rb)), (int(ta), int(tb)), int(without))

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
            if tag_scope == scope or scope is None and tag_scope in UNSCOPED_TAG_SCOPES
        }
        return sorted(found)
