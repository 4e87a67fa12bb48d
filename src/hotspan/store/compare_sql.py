"""TraceQL's ``compare()`` as aggregation statements, for DuckDB and ClickHouse.

The query engine (``hotspan.query.traceql.metrics_compare``) hands down a
:class:`ComparePlan`: the conditions of the query's filter and of its selection, the range of
span starts and its intervals.  One statement splits the matching spans into the selection and
the baseline, and counts, per side, interval, attribute and value, the spans that have it:

- span attributes, each record of the flattened text (``hotspan.model.trace``) a row, counted
  per distinct text first (spans of a route share theirs);
- resource attributes, read once per span group, and ``resource.service.name`` from the span's
  service where the resource has none;
- ``name``, ``status`` and ``kind``; ``rootName`` and ``rootServiceName`` from the root span
  of the span's trace, looked for from ``root_lookback_ns`` around the range.

The answer is two kinds of rows (:data:`TOTALS` and :data:`VALUES`).  Totals: spans with each
attribute, per side and interval, all values counted.  Values: per side and attribute the
``value_limit`` values met first reading newest spans first (the engine's bound, which the
statement applies with a window over each value's newest span), the values of most recent
spans first, at most ``max_rows`` rows.  The engine converts values (a typed text reads as a
number) and applies its other bounds.

As :mod:`hotspan.store.metrics_sql`, spans are not deduplicated: a span stored twice counts
twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from hotspan.model.trace import RS, SPAN_KINDS, STATUS_CODES, STRING_US, US, Condition
from hotspan.store.metrics_sql import (
    CLICKHOUSE_METRICS,
    DUCKDB_METRICS,
    EXACT_TRACES,
    MetricsDialect,
    spans_where,
)
from hotspan.store.search_sql import Binder, Dialect, Params, span_condition

# Row kinds: (kind, side, interval, attribute, text, typed, spans, newest start).  typed: 1 for
# a typed attribute text (the engine reads a number from it), 0 for a string, 2 for a status
# or kind code.  Sides: 1 the selection, 0 the baseline.
TOTALS, VALUES = 0, 1
TYPED, STRING, CODE = 1, 0, 2
CompareRow = Tuple[object, ...]


@dataclass(frozen=True)
class ComparePlan:
    """A compare() query the store aggregates.  A span counts when it meets every condition
    and ``low_ns <= start_ns <= high_ns``; its interval is ``(start_ns - origin_ns - 1) //
    step_ns``.  It is in the selection when it meets every ``selection`` condition and, when
    the window is given, ``selection_after_ns < start_ns <= selection_until_ns``."""

    conditions: Tuple[Condition, ...]
    selection: Tuple[Condition, ...]
    selection_after_ns: Optional[int]
    selection_until_ns: Optional[int]
    low_ns: int
    high_ns: int
    origin_ns: int
    step_ns: int
    value_limit: int
    max_rows: int
    root_lookback_ns: int


@dataclass(frozen=True)
class CompareDialect:
    """What the two engines spell differently, on top of the metrics statement's
    :class:`MetricsDialect`."""

    metrics: MetricsDialect
    records: str  # one row per RS-separated record of {0}, as a select expression
    char: str  # the character of code {0}
    to_text: str
    # What a statement whose parts are computed once (MATERIALIZED) ends with.
    materialized_settings: str = ""
    # Whether the spans are grouped by trace before they meet their roots (ClickHouse's join
    # of every span costs more than that grouping; DuckDB's costs less).
    roots_by_trace: bool = False
    # Whether only the roots of traces with a span counted are read (the join to the spans
    # counted keeps no other anyway): on DuckDB finding those traces costs more than
    # reading every root in the range.
    roots_of_counted_traces: bool = False

    @property
    def search(self) -> Dialect:
        return self.metrics.search

    @property
    def position(self) -> str:
        return self.metrics.position

    @property
    def int_div(self) -> str:
        return self.metrics.int_div

    @property
    def any(self) -> str:
        return self.metrics.any

    @property
    def groups(self) -> str:
        return self.metrics.groups


DUCKDB_COMPARE = CompareDialect(
    metrics=DUCKDB_METRICS,
    records="unnest(string_split({0}, chr(30)))",
    char="chr({0})",
    to_text="CAST({0} AS VARCHAR)",
)

CLICKHOUSE_COMPARE = CompareDialect(
    metrics=CLICKHOUSE_METRICS,
    records="arrayJoin(splitByChar(char(30), {0}))",
    char="char({0})",
    to_text="toString({0})",
    materialized_settings=" SETTINGS enable_materialized_cte = 1",
    roots_by_trace=True,
    roots_of_counted_traces=True,
)

assert (ord(RS), ord(US), ord(STRING_US)) == (30, 31, 28)


def _split(d: CompareDialect, source: str, prefix: str) -> str:
    """(side, slot, attribute, text, typed, n, newest) of the records in ``source``'s
    ``rec`` column (``key US text`` or ``key STRING_US text``), named with ``prefix``."""
    us, sus = d.char.format(31), d.char.format(28)
    at_us = d.position.format("rec", us)
    at_sus = d.position.format("rec", sus)
    at = f"(CASE WHEN {at_us} > 0 THEN {at_us} ELSE {at_sus} END)"
    return (
        f"SELECT side, slot, concat('{prefix}', substring(rec, 1, {at} - 1)) AS attribute, "
        f"substring(rec, {at} + 1) AS text, "
        f"CASE WHEN {at_us} > 0 THEN {TYPED} ELSE {STRING} END AS typed, n, newest "
        f"FROM ({source}) WHERE {at_us} > 0 OR {at_sus} > 0"
    )


def _root_test(cond: Condition) -> bool:
    """Whether a condition keeps root spans only (``nestedSetParent < 0``)."""
    return cond.key == "span:parentID" and cond.op == "=" and not str(cond.value).strip("0")


def _code_range(column: str, names: Sequence[str]) -> str:
    return f"{column} >= 0 AND {column} < {len(names)}"


def compare_sql(
    d: CompareDialect, tenant: object, plan: ComparePlan, materialize: bool = True
) -> Tuple[str, Params]:
    """The statement and its parameters: rows as :data:`CompareRow` describes.  Its parts
    read more than once are computed once with ``materialize`` (a ClickHouse server without
    materialized CTEs computes each where it is read, several times slower)."""
    if plan.step_ns <= 0:
        raise ValueError("the step must be positive")
    bind = Binder(
        d.search,
        tenant=tenant,
        low=int(plan.low_ns),
        high=int(plan.high_ns),
        origin=int(plan.origin_ns),
        step=int(plan.step_ns),
        value_limit=int(plan.value_limit),
        max_rows=int(plan.max_rows),
    )
    p = bind.name
    where = spans_where(bind, plan.conditions)
    selected = [f"({span_condition(c, bind)})" for c in plan.selection]
    if plan.selection_after_ns is not None and plan.selection_until_ns is not None:
        selected.append(f"start_ns > {bind(int(plan.selection_after_ns))}")
        selected.append(f"start_ns <= {bind(int(plan.selection_until_ns))}")
    side = f"CASE WHEN {' AND '.join(selected)} THEN 1 ELSE 0 END" if selected else "1"
    slot = d.int_div.format(f"start_ns - {p('origin')} - 1", p("step"))

    def spans(*columns: str) -> str:
        # Each part reads the columns it needs (a scan of a column is cheap; a shared
        # subquery of every column would be carried to every part).
        return (
            f"(SELECT {side} AS side, {slot} AS slot, start_ns, {', '.join(columns)} "
            f"FROM spans WHERE {' AND '.join(where)}) AS s"
        )

    # Spans of a route share their attribute text: each distinct text is split once.
    texts = (
        f"SELECT side, slot, attrs, count(*) AS n, max(start_ns) AS newest FROM {spans('attrs')} "
        "GROUP BY side, slot, attrs"
    )
    span_records = (
        f"SELECT side, slot, rec, sum(n) AS n, max(newest) AS newest FROM (SELECT side, slot, "
        f"n, newest, {d.records.format('attrs')} AS rec FROM ({texts}) AS t) AS r "
        "WHERE rec <> '' GROUP BY side, slot, rec"
    )
    # The spans counted per intrinsic and span group in one reading (`isg`): a route's name
    # is mostly one service's, so this is hardly more rows than either alone.  Read by the
    # intrinsics (`i`), the resource attributes and the services (`sg`).
    keys = "name, status_code, kind, group_id, service"
    both = (
        f"SELECT side, slot, {keys}, count(*) AS n, max(start_ns) AS newest "
        f"FROM {spans(keys)} GROUP BY side, slot, {keys}"
    )
    groups = (
        "SELECT side, slot, group_id, service, sum(n) AS n, max(newest) AS newest FROM isg "
        "GROUP BY side, slot, group_id, service"
    )
    resource_text = "coalesce(g.attrs, '')"
    resource_records = (
        f"SELECT side, slot, rec, sum(n) AS n, max(newest) AS newest FROM (SELECT a.side AS "
        f"side, a.slot AS slot, a.n AS n, a.newest AS newest, "
        f"{d.records.format(resource_text)} AS rec FROM sg AS a "
        f"LEFT JOIN {d.groups} AS g ON g.group_id = a.group_id) AS r "
        "WHERE rec <> '' GROUP BY side, slot, rec"
    )
    # The span's service where the resource has no service.name of its own.
    has_name = " OR ".join(
        f"{d.position.format(resource_text, bind(RS + 'service.name' + sep))} > 0"
        for sep in (US, STRING_US)
    )
    services = (
        "SELECT a.side AS side, a.slot AS slot, 'resource.service.name' AS attribute, "
        f"a.service AS text, {STRING} AS typed, sum(a.n) AS n, max(a.newest) AS newest "
        f"FROM sg AS a LEFT JOIN {d.groups} AS g ON g.group_id = a.group_id "
        f"WHERE a.service <> '' AND NOT ({has_name}) GROUP BY a.side, a.slot, a.service"
    )
    intrinsics = (
        "SELECT side, slot, name, status_code, kind, sum(n) AS n, max(newest) AS newest "
        "FROM isg GROUP BY side, slot, name, status_code, kind"
    )

    def intrinsic(attribute: str, column: str, typed: int, where: str) -> str:
        text = column if typed == STRING else d.to_text.format(column)
        return (
            f"SELECT side, slot, '{attribute}' AS attribute, {text} AS text, {typed} AS typed, "
            f"sum(n) AS n, max(newest) AS newest FROM i WHERE {where} "
            f"GROUP BY side, slot, {column}"
        )

    if any(_root_test(c) for c in plan.conditions):
        # Every span counted is a root: its own root.
        rooted = (
            "SELECT side, slot, name AS root_name, service AS root_service, sum(n) AS n, "
            "max(newest) AS newest FROM isg GROUP BY side, slot, name, service"
        )
    else:
        # The root spans of the traces (looked for around the range, as the engine does;
        # by the dialect, of the traces counted only); the spans counted (or, by the
        # dialect, their counts per trace) joined to their trace's root and grouped by the
        # root's name and service: one small table both root attributes read.
        roots = (
            f"SELECT trace_id, {d.any.format('name')} AS root_name, "
            f"{d.any.format('service')} AS root_service FROM spans "
            f"WHERE {d.search.tenant} = {p('tenant')} AND parent_span_id = 0 "
            f"AND end_ns >= {bind(int(plan.low_ns - plan.root_lookback_ns))} "
            f"AND start_ns < {bind(int(plan.high_ns + plan.root_lookback_ns))} "
            + (
                f"AND trace_id IN (SELECT trace_id FROM {spans('trace_id')}) "
                if d.roots_of_counted_traces
                else ""
            )
            + "GROUP BY trace_id"
        )
        if d.roots_by_trace:
            counted = (
                "(SELECT side, slot, trace_id, count(*) AS n, max(start_ns) AS newest "
                f"FROM {spans('trace_id')} GROUP BY side, slot, trace_id) AS s"
            )
            n, newest = "sum(s.n)", "max(s.newest)"
        else:
            counted, n, newest = spans("trace_id"), "count(*)", "max(s.start_ns)"
        rooted = (
            "SELECT s.side AS side, s.slot AS slot, o.root_name AS root_name, o.root_service "
            f"AS root_service, {n} AS n, {newest} AS newest "
            f"FROM {counted} INNER JOIN ({roots}) AS o ON o.trace_id = s.trace_id "
            "GROUP BY s.side, s.slot, o.root_name, o.root_service"
        )

    def root(attribute: str, column: str, where: str) -> str:
        return (
            f"SELECT side, slot, '{attribute}' AS attribute, {column} AS text, {STRING} AS "
            f"typed, sum(n) AS n, max(newest) AS newest FROM o WHERE {where} "
            f"GROUP BY side, slot, {column}"
        )

    pairs = " UNION ALL ".join(
        [
            _split(d, span_records, "span."),
            _split(d, resource_records, "resource."),
            services,
            intrinsic("name", "name", STRING, "TRUE"),
            intrinsic("status", "status_code", CODE, _code_range("status_code", STATUS_CODES)),
            intrinsic("kind", "kind", CODE, _code_range("kind", SPAN_KINDS)),
            # (A root's name counts even when empty; its service only when it has one.)
            root("rootName", "root_name", "TRUE"),
            root("rootServiceName", "root_service", "root_service <> ''"),
        ]
    )
    totals = (
        f"SELECT {TOTALS} AS kind, side, slot, attribute, NULL AS text, NULL AS typed, "
        "sum(n) AS n, max(newest) AS newest, NULL AS value_newest FROM u "
        "GROUP BY side, slot, attribute"
    )
    # Each value's newest span, its rank among its attribute's values by that, and the
    # values kept: ranked once per value, not once per value and interval.
    ranked = (
        "SELECT side, attribute, text, typed, value_newest, dense_rank() OVER (PARTITION BY "
        "side, attribute ORDER BY value_newest DESC, text, typed) AS value_rank FROM (SELECT "
        "side, attribute, text, typed, max(newest) AS value_newest FROM u "
        "GROUP BY side, attribute, text, typed) AS v"
    )
    kept = f"SELECT * FROM ({ranked}) AS w WHERE value_rank <= {p('value_limit')}"
    values = (
        f"SELECT {VALUES} AS kind, u.side AS side, u.slot AS slot, u.attribute AS attribute, "
        "u.text AS text, u.typed AS typed, u.n AS n, u.newest AS newest, k.value_newest AS "
        f"value_newest FROM u INNER JOIN ({kept}) AS k ON k.side = u.side AND "
        "k.attribute = u.attribute AND k.text = u.text AND k.typed = u.typed "
        f"ORDER BY value_newest DESC, side, attribute, text, typed, slot LIMIT {p('max_rows')}"
    )
    once = " MATERIALIZED" if materialize else ""
    sql = (
        f"WITH isg AS{once} ({both}), i AS{once} ({intrinsics}), o AS{once} ({rooted}), "
        f"sg AS{once} ({groups}), "
        f"u AS{once} ({pairs}) "
        f"SELECT * FROM ({totals}) AS tt UNION ALL SELECT * FROM ({values}) AS vv"
    )
    if materialize:
        sql += d.materialized_settings
    return sql, bind.params


def traces_sql(d: CompareDialect, tenant: object, plan: ComparePlan) -> Tuple[str, Params]:
    """How many traces the plan's spans belong to: one row."""
    bind = Binder(d.search, tenant=tenant, low=int(plan.low_ns), high=int(plan.high_ns))
    where = spans_where(bind, plan.conditions)
    return f"SELECT count(DISTINCT trace_id) FROM spans WHERE {' AND '.join(where)}", bind.params


def compare_rows(
    d: CompareDialect,
    tenant: object,
    plan: ComparePlan,
    run: Callable[[str, Params], Sequence[CompareRow]],
    materialize: bool = True,
) -> Tuple[List[CompareRow], int, Optional[int]]:
    """The rows of a plan, by ``run`` (a store's statement runner); the spans read and the
    traces they belong to (None past EXACT_TRACES spans: counting distinct ids costs more
    than the rest)."""
    sql, params = compare_sql(d, tenant, plan, materialize)
    rows = list(run(sql, params))
    # Every span has a name: the name's totals count the spans.
    spans = sum(int(r[6]) for r in rows if r[0] == TOTALS and r[3] == "name")  # type: ignore[call-overload]
    traces = None
    if spans <= EXACT_TRACES:
        sql, params = traces_sql(d, tenant, plan)
        traces = int(run(sql, params)[0][0] or 0)  # type: ignore[call-overload]
    return rows, spans, traces
