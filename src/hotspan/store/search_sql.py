"""Trace search as SQL: a :class:`TraceQuery` as one statement, for DuckDB and ClickHouse.

Each spanset needs one span of the trace that started in the range and meets all of its
conditions; the first spanset's spans are the ones shown with each trace.  Attribute
conditions work on the flattened attribute text (``hotspan.model.trace``): an equality finds
the exact ``key=value`` record, anything else extracts the value with a regular expression
(RE2 in both engines, so no pattern can stall the server).

The two engines share the statement; a :class:`Dialect` spells what they write differently
(placeholders, substring and regular-expression functions, reading text as a number, keeping
one row per span, the tenant's column).  Every value is a named parameter, bound by the
client: a ClickHouse statement then holds no ``%`` but its placeholders, and no value is
written into the text by hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from hotspan.model.trace import (
    NUMBER_PATTERN,
    RS,
    SPAN_KINDS,
    STATUS_CODES,
    STRING_US,
    TRACE_ORDERS,
    US,
    Condition,
    SearchError,
    TraceQuery,
    attribute_pattern,
    clean,
    condition_code,
    condition_span_id,
    condition_text,
    reads_typed,
)
from hotspan.store.attr_index import TRACE_ID_TEXT, attr_hash, key_hash_range

Params = Dict[str, Any]


class Binder:
    """Names the values of one statement: ``v0``, ``v1``... spelled as the dialect spells a
    parameter; a value bound twice (an attribute of ``.x`` looked up in the span and in its
    resource) is bound once."""

    def __init__(self, dialect: Dialect, **fixed: Any) -> None:
        self.dialect = dialect
        self.params: Params = dict(fixed)
        self._names: Dict[Tuple[type, Any], str] = {}
        # The fixed values that bound the spans' time range (start, end), when the statement
        # has one: an attribute's equality or regular expression is then looked up in the
        # attribute index (``span_attrs``) over that range.
        self.span_range: Optional[Tuple[str, str]] = None
        # Spans that started before this are not all in the index (stored before it existed):
        # they are read as without it.
        self.unindexed_before = 0
        # Whether an equality (attribute key, index value) names few enough spans of the range
        # for the index to be worth reading; None: always.  A value that most spans hold (an
        # HTTP method) would make the lookup a list of most traces, dearer than the scan.
        self.selective: Optional[Callable[[str, str], bool]] = None

    def __call__(self, value: Any) -> str:
        try:
            key = (type(value), value)
            name = self._names.get(key)
        except TypeError:  # a list: never shared
            key, name = None, None
        if name is None:
            name = f"v{len(self.params)}"
            while name in self.params:
                name += "_"
            self.params[name] = value
            if key is not None:
                self._names[key] = name
        return self.dialect.placeholder.format(name)

    def name(self, fixed: str) -> str:
        """The placeholder of a value given when the binder was made."""
        return self.dialect.placeholder.format(fixed)


@dataclass(frozen=True)
class Dialect:
    """What DuckDB and ClickHouse spell differently, as SQL templates and functions."""

    # A named parameter, from its name.
    placeholder: str
    # The spans' column that holds the tenant (DuckDB numbers its tenants).
    tenant: str
    # ``{0}`` holds the text ``{1}``.
    contains: str
    # The first group of the pattern ``{1}`` in the text ``{0}``; '' when it does not match.
    extract: str
    # Whether the whole text ``expr`` matches the regular expression ``pattern``, which the
    # function binds.
    full_match: Callable[[str, str, Binder], str]
    # The text ``expr`` read as a number (NULL when it is none).
    number: Callable[[str], str]
    # Rows of ``{table}`` that meet ``{where}``, one per (trace_id, span_id): an export
    # retried after it landed stores its spans twice.
    one_per_span: str
    # Membership in the span groups found by a subquery.
    in_groups: str
    # The distinct texts ``{0}`` of a group's rows joined by the separator ``{1}``.
    join_distinct: str
    # The ``ids`` (trace_id, and span_id) of the attribute index's rows that meet ``where``
    # (SQL over its columns), given the attribute's key and, for an equality, its index value
    # (mark and text): the engine narrows what it reads by them.
    attr_traces: Callable[[str, str, Optional[str], str, Binder], str]
    # Every match of the first group of the pattern ``{1}`` in the text ``{0}``, a list.
    extract_all: str = "regexp_extract_all({}, {}, 1)"
    # Whether the condition ``{1}`` on ``elem`` holds for one element of the list ``{0}``,
    # and for every element (a NULL condition does not hold).
    any_element: str = "len(list_filter({0}, lambda elem: coalesce({1}, false))) > 0"
    every_element: str = "len(list_filter({0}, lambda elem: NOT coalesce({1}, false))) = 0"
    # The text of an attribute index value ``{}`` after its type mark.
    after_mark: str = "substring({}, 2)"
    # Whether an equality is answered by the index alone, span by span (its spans' ids, no
    # read of their attribute text), and regular expressions are left to the scan: DuckDB
    # reads no fewer rows for a trace-id lookup, only fewer columns.
    index_by_span: bool = False


def _duckdb_attr_traces(where: str, key: str, value: Optional[str], ids: str, bind: Binder) -> str:
    # The sorted runs and the recent part (attr_index): an equality reads the row groups of
    # each run that hold its sort key, any other lookup those that hold its key's range.
    if value is not None:
        h = f"h = CAST({bind(attr_hash(key, value))} AS UBIGINT)"
    else:
        low, high = key_hash_range(key)
        h = f"h BETWEEN CAST({bind(low)} AS UBIGINT) AND CAST({bind(high)} AS UBIGINT)"
    # The index's trace ids are numbers: the rows found are spelled as spans spell them,
    # rather than every span read spelled as a number.
    found = ", ".join(TRACE_ID_TEXT if c.strip() == "trace_id" else c for c in ids.split(","))
    return " UNION ALL ".join(
        f"SELECT {found} FROM {table} WHERE {h} AND {where}"
        for table in ("span_attrs", "span_attrs_recent")
    )


def _clickhouse_attr_traces(
    where: str, key: str, value: Optional[str], ids: str, bind: Binder
) -> str:
    # Ordered by (tenant, key, value, start): the key and value are a primary-key range.
    return f"SELECT {ids} FROM span_attrs WHERE {where}"


def _duckdb_full_match(expr: str, pattern: str, bind: Binder) -> str:
    return f"regexp_full_match({expr}, {bind(pattern)})"


def _clickhouse_full_match(expr: str, pattern: str, bind: Binder) -> str:
    # match() finds a pattern anywhere and lets "." match a newline: anchored here, with
    # (?-s).  Anchoring could pair up the parentheses of a pattern that is none ("a)|(b"):
    # the pattern is also compiled alone, in a constant that ClickHouse folds while planning,
    # so that a bad one fails the query even when no row is read.  Alone, it gets the (?-s)
    # too: without it, match() lets "a)" through, as it does not compile a pattern that looks
    # like plain text.  A pattern RE2 refuses fails with error 427, CANNOT_COMPILE_REGEXP.
    return (
        f"(match('', {bind('(?-s)' + pattern)}) IN (0, 1) AND "
        f"match({expr}, {bind('(?-s)^(?:' + pattern + ')$')}))"
    )


# DuckDB's TRY_CAST(text AS DOUBLE) trims these and takes "_" between digits ("1_000");
# toFloat64OrNull() reads neither, and is the fast path.
_SPACE = "' \\t\\n\\x0b\\f\\r'"
_BAD_UNDERSCORE = "'(^|[^0-9])_|_($|[^0-9])'"


def _clickhouse_number(text: str) -> str:
    """``text`` as DuckDB's ``TRY_CAST(text AS DOUBLE)``, except NaN, which is +inf here.

    DuckDB orders NaN above every number (and equal to itself), ClickHouse as IEEE does (no
    comparison holds): as +inf, a NaN compares with any finite value as it does in DuckDB.
    """
    fast = f"toFloat64OrNull({text})"
    trimmed = f"trim(BOTH {_SPACE} FROM {text})"
    slow = (
        f"if(match({trimmed}, {_BAD_UNDERSCORE}), NULL, "
        f"toFloat64OrNull(replaceAll({trimmed}, '_', '')))"
    )
    value = f"if(isNull({fast}), {slow}, {fast})"
    return f"if(isNaN({value}), inf, {value})"


DUCKDB = Dialect(
    placeholder="${}",
    tenant="tenant_id",
    contains="contains({}, {})",
    extract="regexp_extract({}, {}, 1)",
    full_match=_duckdb_full_match,
    number="TRY_CAST({} AS DOUBLE)".format,
    one_per_span="SELECT DISTINCT ON (trace_id, span_id) * FROM {table} WHERE {where}",
    in_groups="IN",
    join_distinct="string_agg(DISTINCT {0}, {1})",
    attr_traces=_duckdb_attr_traces,
    index_by_span=True,
)

# Values are clickhouse-connect's client-side bindings, quoted into the text by the client.
CLICKHOUSE = Dialect(
    placeholder="%({})s",
    tenant="tenant",
    contains="position({}, {}) > 0",
    extract="extract({}, {})",
    full_match=_clickhouse_full_match,
    number=_clickhouse_number,
    extract_all="extractAll({}, {})",
    any_element="arrayExists(elem -> ifNull({1}, 0), {0})",
    every_element="arrayAll(elem -> ifNull({1}, 0), {0})",
    one_per_span="SELECT * FROM {table} WHERE {where} LIMIT 1 BY trace_id, span_id",
    # Over a cluster, span groups are sharded by their own id, not by trace: the matching
    # groups are gathered once and sent to every shard (on one server it is a plain IN).
    in_groups="GLOBAL IN",
    join_distinct="arrayStringConcat(groupUniqArray({0}), {1})",
    # Sharded by trace as spans are: each shard looks up its own traces.
    attr_traces=_clickhouse_attr_traces,
)

_COMPARE = {"=": "=", "!=": "!=", ">": ">", ">=": ">=", "<": "<", "<=": "<="}
_REGEX = ("=~", "!~")


def _in_resource(sql: str, bind: Binder) -> str:
    return f"group_id {bind.dialect.in_groups} (SELECT group_id FROM span_groups WHERE {sql})"


def _compare(expr: str, op: str, value: object, bind: Binder) -> str:
    """``expr op value`` for a text ``expr`` (or any, with the comparison operators)."""
    if op in _COMPARE:
        return f"{expr} {_COMPARE[op]} {bind(value)}"
    if op in _REGEX:
        match = bind.dialect.full_match(expr, str(value), bind)
        return f"NOT {match}" if op == "!~" else match
    raise SearchError(f"unknown operator {op!r}")


def _compare_number(key: str, expr: str, op: str, value: object, bind: Binder) -> str:
    """``expr op value`` for a numeric ``expr``, which no regular expression applies to."""
    if op in _REGEX:
        raise SearchError(f"{key} is a number: {op} compares text (names and attributes)")
    if isinstance(value, int) and not -(1 << 127) <= value < 1 << 128:
        # Past what either engine holds: DuckDB refuses it, ClickHouse fails to parse it.
        raise SearchError(f"{key}: {value} is out of range")
    return _compare(expr, op, value, bind)


def _duration(key: str, value: object) -> object:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise SearchError(f"{key} compares with a duration, such as 100ms")
    return value


def _contains(needle: str, bind: Binder) -> str:
    return bind.dialect.contains.format("attrs", bind(needle))


def _has_key(key: str, bind: Binder) -> str:
    """Whether ``attrs`` has the attribute, of any type (see ``model.trace.STRING_US``)."""
    k = clean(key)
    return f"({_contains(RS + k + US, bind)} OR {_contains(RS + k + STRING_US, bind)})"


def _indexed(key: str, op: str, value: object, bind: Binder) -> str:
    """A condition from the attribute index for an equality with a string or a regular
    expression on a span attribute: the span (or, by trace, its trace) is one the index
    holds the attribute for in the range.  It narrows what
    is read to those spans' rows; TRUE when the index cannot tell (other operators, a
    statement without a range)."""
    if bind.span_range is None or isinstance(value, bool):
        return "TRUE"
    d = bind.dialect
    k = clean(key)
    indexed: Optional[str] = None
    if op == "=" and isinstance(value, str):
        text = clean(value)
        indexed = (STRING_US if reads_typed(text) else US) + text
        if bind.selective is not None and not bind.selective(k, indexed):
            return "TRUE"
        found = f"value = {bind(indexed)}"
    elif op == "=~" and isinstance(value, str):
        # The key's rows of the index (on DuckDB one range of h per sorted run), the pattern
        # on string values only, as _attribute decides: a string's mark, or a value after US
        # that does not read as a number or a boolean.  Then the index answers exactly.
        after = d.after_mark.format("value")
        typed = d.full_match(after, NUMBER_PATTERN + "|true|false", bind)
        string = f"(substring(value, 1, 1) = {bind(STRING_US)} OR NOT {typed})"
        found = f"{string} AND {d.full_match(after, value, bind)}"
    else:
        return "TRUE"
    start, end = (bind.name(n) for n in bind.span_range)
    where = (
        f"{d.tenant} = {bind.name('tenant')} AND key = {bind(k)} AND {found} "
        f"AND start_ns < {end} AND end_ns >= {start}"
    )
    ids = "trace_id, span_id" if d.index_by_span else "trace_id"
    lookup = f"({ids}) IN ({d.attr_traces(where, k, indexed, ids, bind)})"
    if bind.unindexed_before > 0:
        return f"(start_ns < {bind(bind.unindexed_before)} OR {lookup})"
    return lookup


def _attribute(key: str, op: str, value: object, bind: Binder, what: str) -> str:
    """A condition on the flattened text in ``attrs`` (a span's or a resource's), typed as
    TraceQL types it: a string never meets a number or a boolean, whatever its text (a
    string that reads as one is stored after STRING_US); numbers compare as numbers.  A key
    with several records (an array's elements) meets a comparison when one record does, and
    ``!=`` or ``!~`` when every record does, as the engine decides (``fields.compare``).
    ``what`` names the attribute in errors."""
    d = bind.dialect
    k = clean(key)
    if isinstance(value, bool) and op not in ("=", "!="):
        return "FALSE"
    if isinstance(value, bool) and op == "=":
        return _contains(RS + k + US + ("true" if value else "false") + RS, bind)
    if op == "=" and isinstance(value, str):
        return _contains(attribute_pattern(key, value), bind)
    # Each record's type mark and text, as ``elem`` in the condition (bound only when used:
    # DuckDB refuses a parameter that the statement does not use).
    records = d.extract_all.format("attrs", bind(f"{RS}{re.escape(k)}([{US}{STRING_US}][^{RS}]*)"))
    if isinstance(value, bool):
        # != true: every record the boolean false (not a string, not a number).
        other = bind(US + ("false" if value else "true"))
        return f"{_has_key(key, bind)} AND {d.every_element.format(records, f'elem = {other}')}"
    each = d.every_element if op in ("!=", "!~") else d.any_element
    text = d.after_mark.format("elem")
    mark = "substring(elem, 1, 1)"
    if isinstance(value, (int, float)):
        # A typed record whose text reads as a number (strictly: both engines' casts read
        # more, such as " 1" or "nan").
        strict = d.full_match(text, NUMBER_PATTERN, bind)
        number = _compare_number(what, d.number(text), op, float(value), bind)
        element = f"{mark} = {bind(US)} AND {strict} AND {number}"
        return f"{_contains(RS + k + US, bind)} AND {each.format(records, element)}"
    # Any other comparison with a string: a string record (after STRING_US, or after US when
    # its text does not read as a number or a boolean).
    typed = d.full_match(text, NUMBER_PATTERN + "|true|false", bind)
    element = f"({mark} = {bind(STRING_US)} OR NOT {typed}) AND {_compare(text, op, value, bind)}"
    return f"{_has_key(key, bind)} AND {each.format(records, element)}"


def span_condition(cond: Condition, bind: Binder) -> str:
    """SQL over one ``spans`` row."""
    key, op, value = cond.key, cond.op, cond.value
    if key in ("name", "span:name"):
        return _compare("name", op, condition_text(key, value), bind)
    if key in ("status", "span:status"):
        code = condition_code(STATUS_CODES, value, "status")
        return _compare_number(key, "status_code", op, code, bind)
    if key in ("kind", "span:kind"):
        return _compare_number(key, "kind", op, condition_code(SPAN_KINDS, value, "kind"), bind)
    if key in ("duration", "span:duration"):
        return _compare_number(key, "(end_ns - start_ns)", op, _duration(key, value), bind)
    if key in ("resource.service.name", "service.name"):
        return _compare("service", op, condition_text(key, value), bind)
    if key == "trace:id":
        return _compare("trace_id", op, str(value).lower().rjust(32, "0"), bind)
    if key == "span:id":
        return _compare_number(key, "span_id", op, condition_span_id(value), bind)
    if key == "span:parentID":  # "0000000000000000": a root span (TraceQL's nestedSetParent<0)
        return _compare_number(key, "parent_span_id", op, condition_span_id(value, key), bind)
    if key == "raw:span":  # bytes (hex) of the span's OTLP message: a necessary condition
        return bind.dialect.contains.format("hex(raw)", bind(str(value)))
    if key == "raw:scope":
        return _in_resource(bind.dialect.contains.format("hex(scope)", bind(str(value))), bind)
    if key.startswith("span."):
        index = _indexed(key[5:], op, value, bind)
        if index == "TRUE":
            return _attribute(key[5:], op, value, bind, key)
        if bind.dialect.index_by_span and bind.unindexed_before <= 0:
            return index  # the index holds exactly the spans with this attribute and value
        return f"{index} AND {_attribute(key[5:], op, value, bind, key)}"
    if key.startswith("resource."):
        return _in_resource(_attribute(key[9:], op, value, bind, key), bind)
    if not key.startswith("."):
        raise SearchError(
            f"{key!r} is not something hotspan searches on: use name, status, kind, duration, "
            "trace:id, span:id, traceDuration, rootName, rootServiceName, or an attribute "
            "(span.x, resource.x, .x)"
        )
    # Unscoped, as Tempo reads it (and the TraceQL engine): the span's attribute when the span
    # has it, else the resource's (for service.name, the span's service).
    name = key[1:]
    span_sql = _attribute(name, op, value, bind, key)
    if name == "service.name":
        res_sql = _compare("service", op, condition_text(key, value), bind)
    else:
        res_sql = _in_resource(_attribute(name, op, value, bind, key), bind)
    has_key = _has_key(name, bind)
    return f"(({has_key} AND {span_sql}) OR (NOT {has_key} AND {res_sql}))"


def _trace_condition(cond: Condition, bind: Binder) -> str:
    """SQL over one row of the per-trace aggregate."""
    expr = {
        "traceDuration": "(t1 - t0)",
        "trace:duration": "(t1 - t0)",
        "rootName": "root_name",
        "trace:rootName": "root_name",
        "rootServiceName": "root_service",
        "trace:rootService": "root_service",
    }.get(cond.key)
    if expr is None:
        raise SearchError(f"{cond.key!r} is not a trace-wide intrinsic")
    if expr == "(t1 - t0)":
        if not isinstance(cond.value, int):
            raise SearchError(f"{cond.key} compares with a duration, such as 100ms")
        return _compare_number(cond.key, expr, cond.op, cond.value, bind)
    return _compare(expr, cond.op, condition_text(cond.key, cond.value), bind)


def _spanset(conds: Tuple[Condition, ...], base: str, bind: Binder) -> str:
    where = [base]
    for cond in conds:
        where.append(f"({span_condition(cond, bind)})")
    return " AND ".join(where)


# The root is the span without a parent, else the earliest (its parent never arrived); the
# span id settles ties.  (argMin: ClickHouse's name, which DuckDB reads as its arg_min.)
_ROOT_COLUMNS = (
    "argMin(service, (parent_span_id != 0, start_ns, span_id)) AS root_service, "
    "argMin(name, (parent_span_id != 0, start_ns, span_id)) AS root_name"
)


_ERROR = STATUS_CODES.index("error")
# One span of a trace for its service stats, counted in Python (TraceSummary.from_rows):
# "span id,1 if its status is error else 0,service" (the service last: it may hold commas),
# distinct, so that a span stored twice counts once; joined by RS, which stored text never
# holds (model.trace.clean).  In the one aggregation that finds the trace's root and bounds.
_STATS_ENTRY = (
    f"concat(CAST(span_id AS VARCHAR), ',', CASE WHEN status_code = {_ERROR} THEN '1' "
    "ELSE '0' END, ',', service)"
)


def search_sql(
    dialect: Dialect,
    tenant: object,
    query: TraceQuery,
    unindexed_before: int = 0,
    selective: Optional[Callable[[str, str], bool]] = None,
) -> Tuple[str, Params]:
    """The statement and its named parameters: rows of (trace_id, root_service, root_name,
    t0, t1, spans, span_id, span_name, start_ns, end_ns, n, service stats), one per (trace,
    shown matched span), in the order of the answer; the service stats are
    :meth:`TraceSummary.from_rows`' text.  ``tenant`` is the value of the dialect's tenant
    column; spans that started before ``unindexed_before`` may be missing from the attribute
    index (:attr:`Binder.unindexed_before`); ``selective`` says which equalities the index
    answers (:attr:`Binder.selective`)."""
    bind = Binder(
        dialect,
        tenant=tenant,
        start_ns=query.start_ns,
        end_ns=query.end_ns,
        limit=query.limit,
        spans_per_trace=max(query.spans_per_trace, 1),
        stats_separator=RS,
    )
    bind.span_range = ("start_ns", "end_ns")
    bind.unindexed_before = unindexed_before
    bind.selective = selective
    p = bind.name
    of_tenant = f"{dialect.tenant} = {p('tenant')}"
    # As in Tempo, a span counts when it overlaps the range.  ClickHouse's primary key
    # (tenant, service, start_ns) and its parts' start_ns bounds use the bound on start_ns.
    base = f"{of_tenant} AND start_ns < {p('end_ns')} AND end_ns >= {p('start_ns')}"
    spansets = query.spansets or ((),)
    first_where = _spanset(spansets[0], base, bind)
    others = []
    for conds in spansets[1:]:
        where = _spanset(conds, base, bind)
        others.append(f"AND trace_id IN (SELECT trace_id FROM spans WHERE {where})")
    having: List[str] = [_trace_condition(cond, bind) for cond in query.trace_conditions]
    if query.order not in TRACE_ORDERS:
        orders = ", ".join(TRACE_ORDERS)
        raise SearchError(f"order must be one of {orders}, not {query.order!r}")
    if query.limit < 0:
        # DuckDB refuses a negative LIMIT; ClickHouse would take it as "all but the last".
        raise SearchError(f"limit must not be negative, not {query.limit}")
    by_duration = query.order == "duration"
    if having or by_duration:
        # Trace-wide conditions, and the longest first, need every matching trace's bounds
        # and root.
        candidates = f"""
    SELECT trace_id FROM (
        SELECT trace_id, {_ROOT_COLUMNS}, min(start_ns) AS t0, max(end_ns) AS t1
        FROM spans
        WHERE {of_tenant} AND trace_id IN (SELECT trace_id FROM matched)
        GROUP BY trace_id
    )
    WHERE {" AND ".join(having) or "TRUE"}
    ORDER BY {"t1 - t0" if by_duration else "t0"} DESC, trace_id
    LIMIT {p("limit")}"""
    else:
        # Otherwise the newest traces can be picked from the matching spans alone, and only
        # those few aggregated in full: 10x less work over a day of spans.
        candidates = f"""
    SELECT trace_id FROM matched GROUP BY trace_id
    ORDER BY min(start_ns) DESC, trace_id
    LIMIT {p("limit")}"""
    shown = dialect.one_per_span.format(table="members", where="hit")
    # The range is read once, for the candidates; then only their traces' spans, whose
    # matching ones (``hit``: the first spanset's conditions, their traces being candidates
    # already) are those shown.  count(DISTINCT ...) here and one row per span below: an
    # export retried after it landed stores its spans twice.  Only the few traces found pay
    # for it.
    sql = f"""
WITH matched AS (
    SELECT trace_id, start_ns FROM spans
    WHERE {first_where} {" ".join(others)}
), candidates AS ({candidates}
), members AS (
    SELECT trace_id, span_id, parent_span_id, name, service, start_ns, end_ns, status_code,
           ({first_where}) AS hit
    FROM spans
    WHERE {of_tenant} AND trace_id IN (SELECT trace_id FROM candidates)
), found AS (
    SELECT trace_id, {_ROOT_COLUMNS},
           min(start_ns) AS t0, max(end_ns) AS t1, count(DISTINCT span_id) AS spans,
           {dialect.join_distinct.format(_STATS_ENTRY, p("stats_separator"))} AS stats
    FROM members
    GROUP BY trace_id
), shown AS (
    SELECT *, row_number() OVER (PARTITION BY trace_id ORDER BY start_ns, span_id) AS rn,
           count(*) OVER (PARTITION BY trace_id) AS n
    FROM ({shown})
)
SELECT f.trace_id, f.root_service, f.root_name, f.t0, f.t1, f.spans,
       s.span_id, s.name, s.start_ns, s.end_ns, s.n, f.stats
FROM found AS f INNER JOIN shown AS s ON s.trace_id = f.trace_id
WHERE s.rn <= {p("spans_per_trace")}
ORDER BY {"f.t1 - f.t0" if by_duration else "f.t0"} DESC, f.trace_id, s.rn
"""
    return sql, bind.params
