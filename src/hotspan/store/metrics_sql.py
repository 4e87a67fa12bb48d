"""TraceQL metrics as one aggregation statement, for DuckDB and ClickHouse.

The query engine (``hotspan.query.traceql.metrics``) hands down a :class:`MetricsPlan`, plain
data: the span conditions search compiles (:func:`hotspan.store.search_sql.span_condition`),
the range of span starts, the intervals, the ``by()`` keys and what is measured of each span.
The statement groups the matching spans by interval x keys (x the log2 bucket of the
duration, for histograms and quantiles) and gives one row per group: counts, the duration's
min, max and sum, and optionally the newest span of the group as an exemplar candidate.  The
engine turns rows into series (labels, Tempo's quantiles) as it does for spans it reads.

Keys are read from the flattened attribute text (``hotspan.model.trace``): the text after
``RS key US`` (a typed value: the engine reads a number from it) or ``RS key STRING_US`` (a
string).  Resource attributes are read once per span group: the spans are first grouped by
``group_id`` (and service), then joined with ``span_groups`` and grouped again.

Spans are not deduplicated: a span stored twice (an export retried after it landed) counts
twice here, where the engine's span reads keep one.  Keeping one per (trace, span) costs a
hash of every span, 10 to 30 times the aggregation itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from hotspan.model.trace import RS, STRING_US, US, Condition, clean
from hotspan.store.search_sql import CLICKHOUSE, DUCKDB, Binder, Dialect, Params, span_condition

# What is measured of each span: its count only; its duration (ns: min, max, sum); the log2
# bucket of its duration, a key (bits: the bucket is 2**bits ns).
MEASURES = ("count", "duration", "log2")
# Up to this many spans an answer says how many traces they belong to.
EXACT_TRACES = 1_000_000


@dataclass(frozen=True)
class MetricsPlan:
    """A metrics query the store aggregates.  A span counts when it meets every condition and
    ``low_ns <= start_ns <= high_ns``; its interval is ``(start_ns - origin_ns - 1) //
    step_ns``.  ``keys`` are TraceQL names :func:`key_supported` accepts; ``exemplars`` asks
    for each group's newest span."""

    conditions: Tuple[Condition, ...]
    low_ns: int
    high_ns: int
    origin_ns: int
    step_ns: int
    keys: Tuple[str, ...]
    measure: str
    exemplars: bool = False
    # Whether an exemplar carries its span's duration (quantiles and the value functions);
    # else the engine gives it its interval's sample.
    exemplar_values: bool = False


# Row layout of an answer: the interval, then (value, typed) per key, then these (the
# exemplar's span and value only when asked; the group's newest start always).
# value: text for names, services and attributes, a number for status and kind; typed: whether
# an attribute's text is a typed value (after US) rather than a string (after STRING_US).
TAIL = ("bucket", "count", "min", "max", "sum", "exemplar_span", "exemplar_start", "exemplar_value")
MetricsRow = Tuple[object, ...]

_INTRINSIC_COLUMNS = {
    "name": "name",
    "span:name": "name",
    "status": "status_code",
    "span:status": "status_code",
    "kind": "kind",
    "span:kind": "kind",
}


def key_supported(key: str) -> bool:
    """Whether a ``by()`` key is one the statement reads: name, status, kind, and span,
    resource or unscoped attributes."""
    if key in _INTRINSIC_COLUMNS:
        return True
    for prefix in ("span.", "resource.", "."):
        if key.startswith(prefix) and len(key) > len(prefix):
            return True
    return False


@dataclass(frozen=True)
class MetricsDialect:
    """What the two engines spell differently, on top of search's :class:`Dialect`."""

    search: Dialect
    # 1-based position of ``{1}`` in ``{0}`` (0: absent), and the substring function; text
    # lengths in the unit those count (characters for DuckDB, bytes for ClickHouse).
    position: str
    substring: str
    length: str  # "chars" or "bytes"
    int_div: str
    arg_max: str
    any: str
    # The sum of the durations (ClickHouse sums Int64 in Int64, which a day of hours fills).
    wide_sum: str
    # span_groups, one row per group_id.
    groups: str


DUCKDB_METRICS = MetricsDialect(
    search=DUCKDB,
    position="strpos({0}, {1})",
    substring="substr({0}, {1}, {2})",
    length="chars",
    int_div="({0}) // ({1})",
    arg_max="arg_max({0}, {1})",
    any="any_value({0})",
    wide_sum="sum({0})",
    groups="span_groups",
)

CLICKHOUSE_METRICS = MetricsDialect(
    search=CLICKHOUSE,
    position="position({0}, {1})",
    substring="substring({0}, {1}, {2})",
    length="bytes",
    int_div="intDiv({0}, {1})",
    arg_max="argMax({0}, {1})",
    any="any({0})",
    wide_sum="sum(toInt128({0}))",
    # A ReplacingMergeTree keeps a group's copies until it merges them.
    groups="(SELECT group_id, any(attrs) AS attrs FROM span_groups GROUP BY group_id)",
)


def _text_length(d: MetricsDialect, text: str) -> int:
    return len(text.encode()) if d.length == "bytes" else len(text)


def _value_after(
    d: MetricsDialect,
    column: str,
    needle: str,
    bind: Binder,
    positions: Optional[List[Tuple[str, str]]] = None,
) -> Tuple[str, str]:
    """(whether ``column`` holds ``needle``, the text after it up to the next RS).  With
    ``positions``, the needle's position is a column computed once, added there."""
    at = d.position.format(column, bind(needle))
    if positions is not None:
        positions.append((f"p{len(positions)}", at))
        at = positions[-1][0]
    start = f"{at} + {_text_length(d, needle)}"
    rest = d.substring.format(column, start, "1000000000")
    end = d.position.format(rest, bind(RS))
    return f"{at} > 0", d.substring.format(column, start, f"{end} - 1")


def _attribute(
    d: MetricsDialect,
    column: str,
    name: str,
    bind: Binder,
    positions: Optional[List[Tuple[str, str]]] = None,
) -> Tuple[str, str]:
    """(text, typed) of an attribute in a flattened text: NULL text when absent."""
    k = clean(name)
    has_typed, typed_text = _value_after(d, column, RS + k + US, bind, positions)
    has_string, string_text = _value_after(d, column, RS + k + STRING_US, bind)
    text = f"CASE WHEN {has_typed} THEN {typed_text} WHEN {has_string} THEN {string_text} END"
    return text, f"CASE WHEN {has_typed} THEN 1 ELSE 0 END"


def _log2_bits(d: MetricsDialect, duration: str) -> str:
    """The bits of a duration's log2 bucket, as the engine computes them: the exponent of
    ``frexp(float(d - 1))``, floor(log2) + 1; NULL below 2 ns.  Below 2**40 ns log2 is exact
    on powers of two and at least 1e-12 below the next one, so its floor is right; above, it
    is checked against the powers of two."""
    v = f"CAST({duration} - 1 AS DOUBLE)"
    e = f"floor(log2({v}))"
    fix = f"(CASE WHEN pow(2, {e} + 1) <= {v} THEN 1 WHEN pow(2, {e}) > {v} THEN -1 ELSE 0 END)"
    return (
        f"CASE WHEN {duration} < 2 THEN NULL "
        f"WHEN {duration} <= {1 << 40} THEN CAST({e} AS INTEGER) + 1 "
        f"ELSE CAST({e} + 1 + {fix} AS INTEGER) END"
    )


def _where(d: MetricsDialect, tenant: object, plan: MetricsPlan) -> Tuple[Binder, List[str]]:
    """The parameters of a statement and what its spans meet."""
    if plan.measure not in MEASURES:
        raise ValueError(f"unknown measure {plan.measure!r}")
    if plan.step_ns <= 0:
        raise ValueError("the step must be positive")
    bind = Binder(
        d.search,
        tenant=tenant,
        low=int(plan.low_ns),
        high=int(plan.high_ns),
        origin=int(plan.origin_ns),
        step=int(plan.step_ns),
    )
    return bind, spans_where(bind, plan.conditions)


def spans_where(bind: Binder, conditions: Sequence[Condition]) -> List[str]:
    """What the spans of a statement meet: the tenant, ``low <= start_ns <= high`` (the
    binder holds tenant, low and high) and every condition."""
    p = bind.name
    where = [
        f"{bind.dialect.tenant} = {p('tenant')}",
        f"start_ns >= {p('low')}",
        f"start_ns <= {p('high')}",
    ]
    return where + [f"({span_condition(cond, bind)})" for cond in conditions]


def traces_sql(d: MetricsDialect, tenant: object, plan: MetricsPlan) -> Tuple[str, Params]:
    """How many traces the plan's spans belong to (Tempo's inspectedTraces): one row."""
    bind, where = _where(d, tenant, plan)
    # (DuckDB refuses a parameter the statement does not use.)
    params = {k: v for k, v in bind.params.items() if k not in ("origin", "step")}
    return f"SELECT count(DISTINCT trace_id) FROM spans WHERE {' AND '.join(where)}", params


def metrics_rows(
    d: MetricsDialect,
    tenant: object,
    plan: MetricsPlan,
    run: Callable[[str, Params], Sequence[MetricsRow]],
) -> List[MetricsRow]:
    """The rows of a plan, by ``run`` (a store's statement runner), and a last row, its
    interval NULL, holding in its count the traces of the spans, or NULL past
    ``EXACT_TRACES`` spans: counting distinct trace ids costs more than the aggregation."""
    sql, params = metrics_sql(d, tenant, plan)
    rows = list(run(sql, params))
    spans = sum(int(r[2 + 2 * len(plan.keys)]) for r in rows)  # type: ignore[call-overload]
    traces = None
    if spans <= EXACT_TRACES:
        sql, params = traces_sql(d, tenant, plan)
        traces = run(sql, params)[0][0]
    rows.append((None,) * (2 + 2 * len(plan.keys)) + (traces,) + (None,) * (len(TAIL) - 2))
    return rows


def metrics_sql(d: MetricsDialect, tenant: object, plan: MetricsPlan) -> Tuple[str, Params]:
    """The statement and its parameters; rows as :data:`TAIL` describes, after the interval
    and two columns per key."""
    bind, where = _where(d, tenant, plan)
    p = bind.name

    # The span level: (alias, expression) grouped on, and what the second level computes.
    inner: List[Tuple[str, str]] = [
        ("slot", d.int_div.format(f"start_ns - {p('origin')} - 1", p("step")))
    ]
    outer_keys: List[Tuple[str, str]] = []  # (value, typed) of each key, over the first level
    positions: List[Tuple[str, str]] = []  # where a span attribute starts, computed once
    needs_groups = False
    for i, key in enumerate(plan.keys):
        if not key_supported(key):
            raise ValueError(f"{key!r} is not a key the statement reads")
        column = _INTRINSIC_COLUMNS.get(key)
        if column is not None:
            inner.append((f"k{i}", column))
            outer_keys.append((f"k{i}", "NULL"))
            continue
        if key.startswith("resource."):
            needs_groups = True
            text, typed = _attribute(d, "g.attrs", key[9:], bind)
            if key == "resource.service.name":
                # The resource's service.name when not empty, else the span's service.
                given = f"({text}) IS NOT NULL AND ({text}) <> ''"
                outer_keys.append(
                    (
                        f"CASE WHEN {given} THEN {text} ELSE a.service END",
                        f"CASE WHEN {given} THEN {typed} ELSE 1 END",
                    )
                )
            else:
                outer_keys.append((text, typed))
            continue
        name = key[5:] if key.startswith("span.") else key[1:]
        text, typed = _attribute(d, "attrs", name, bind, positions)
        inner.append((f"k{i}", text))
        inner.append((f"t{i}", typed))
        if key.startswith("span."):
            outer_keys.append((f"k{i}", f"t{i}"))
            continue
        # Unscoped: the span's attribute when it has one, else its resource's (and for
        # service.name, else the span's service).
        needs_groups = True
        r_text, r_typed = _attribute(d, "g.attrs", name, bind)
        if name == "service.name":
            r_typed = f"CASE WHEN ({r_text}) IS NOT NULL THEN {r_typed} ELSE 1 END"
            r_text = f"coalesce({r_text}, a.service)"
        outer_keys.append(
            (
                f"CASE WHEN a.k{i} IS NOT NULL THEN a.k{i} ELSE {r_text} END",
                f"CASE WHEN a.k{i} IS NOT NULL THEN a.t{i} ELSE {r_typed} END",
            )
        )
    if plan.measure == "log2":
        # NULL below 2 ns: the engine counts those spans as read, in no bucket.
        inner.append(("bucket", _log2_bits(d, "end_ns - start_ns")))
    if needs_groups:
        inner.append(("group_id", "group_id"))

    duration = "end_ns - start_ns"
    aggregates = ["count(*) AS n"]
    if needs_groups:
        # A span's service comes from its resource, which its group_id hashes: one per group.
        aggregates.append(f"{d.any.format('service')} AS service")
    if plan.measure == "duration":
        aggregates += [
            f"min({duration}) AS mn",
            f"max({duration}) AS mx",
            f"{d.wide_sum.format(duration)} AS sm",
        ]
    else:
        aggregates += ["NULL AS mn", "NULL AS mx", "NULL AS sm"]
    # The newest start of each group orders the groups as the engine meets them.
    if plan.exemplars:
        aggregates += [
            f"{d.arg_max.format('span_id', 'start_ns')} AS es",
            "max(start_ns) AS et",
            f"{d.arg_max.format(duration, 'start_ns')} AS ev"
            if plan.exemplar_values
            else "NULL AS ev",
        ]
    else:
        aggregates += ["NULL AS es", "max(start_ns) AS et", "NULL AS ev"]
    names = [alias for alias, _ in inner]
    source = f"spans WHERE {' AND '.join(where)}"
    if positions:
        found = ", ".join(f"{expr} AS {alias}" for alias, expr in positions)
        source = f"(SELECT *, {found} FROM {source})"
    span_level = (
        f"SELECT {', '.join(f'{expr} AS {alias}' for alias, expr in inner)}, "
        f"{', '.join(aggregates)} FROM {source} GROUP BY {', '.join(names)}"
    )
    bucket = "bucket" if plan.measure == "log2" else "NULL"
    if not needs_groups:
        columns = ["slot"]
        for value, typed in outer_keys:
            columns += [value, typed]
        columns += [bucket, "n", "mn", "mx", "sm", "es", "et", "ev"]
        sql = f"SELECT {', '.join(columns)} FROM ({span_level})"
        return sql, bind.params

    # The second level: each span group's resource attributes read once, groups merged.
    columns = ["a.slot AS slot"]
    group = ["slot"]
    for i, (value, typed) in enumerate(outer_keys):
        columns += [f"{value} AS key{i}", f"{typed} AS typed{i}"]
        group += [f"key{i}", f"typed{i}"]
    if plan.measure == "log2":
        columns.append("a.bucket AS b")
        group.append("b")
    else:
        columns.append("NULL AS b")
    columns.append("sum(a.n) AS n")
    if plan.measure == "duration":
        columns += ["min(a.mn)", "max(a.mx)", "sum(a.sm)"]
    else:
        columns += ["NULL", "NULL", "NULL"]
    if plan.exemplars:
        columns += [
            d.arg_max.format("a.es", "a.et"),
            "max(a.et)",
            d.arg_max.format("a.ev", "a.et") if plan.exemplar_values else "NULL",
        ]
    else:
        columns += ["NULL", "max(a.et)", "NULL"]
    sql = (
        f"SELECT {', '.join(columns)} FROM ({span_level}) AS a "
        f"LEFT JOIN {d.groups} AS g ON g.group_id = a.group_id "
        f"GROUP BY {', '.join(group)}"
    )
    return sql, bind.params
