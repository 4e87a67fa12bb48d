"""Trace search in ClickHouse's SQL: a :class:`TraceQuery` as one statement.

The port of :mod:`hotspan.store.duckdb_search`, with the same conditions, rows and order; read
that module for what a search means.  Values are clickhouse-connect's client-side bindings
(``%(name)s``, quoted into the text by the client), so the statement holds no other ``%``.

Where ClickHouse's functions differ from DuckDB's, the SQL makes up for it: ``match`` finds a
pattern anywhere and lets ``.`` match a newline (a full match is anchored here, with ``(?-s)``),
and ``toFloat64OrNull`` reads a few numbers otherwise than DuckDB's ``TRY_CAST(... AS DOUBLE)``
(:func:`_number`).  A regular expression RE2 refuses fails the statement with ClickHouse's
error 427, CANNOT_COMPILE_REGEXP, which the store turns into a :class:`SearchError`.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

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
)

Params = Dict[str, Any]
_COMPARE = {"=": "=", "!=": "!=", ">": ">", ">=": ">=", "<": "<", "<=": "<="}
_REGEX = ("=~", "!~")
# GLOBAL: over a cluster, span groups are sharded by their own id, not by trace; the matching
# groups are gathered once and sent to every shard (on one server it is a plain IN).
_IN_RESOURCE = "group_id GLOBAL IN (SELECT group_id FROM span_groups WHERE {})"


class _Binder:
    """Names the values of one statement: ``%(v0)s``, ``%(v1)s``...; a value bound twice
    (an attribute of ``.x`` looked up in the span and in its resource) is bound once."""

    def __init__(self, **fixed: Any) -> None:
        self.params: Params = dict(fixed)
        self._names: Dict[Tuple[type, Any], str] = {}

    def __call__(self, value: Any) -> str:
        key = (type(value), value)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"v{len(self._names)}"
            self.params[name] = value
        return f"%({name})s"


def binder(**fixed: Any) -> _Binder:
    """A binder for a statement of the store's own that reuses :func:`span_condition`."""
    return _Binder(**fixed)


def _compare(expr: str, op: str, value: object, bind: _Binder) -> str:
    """``expr op value`` for a text ``expr`` (or any, with the comparison operators)."""
    if op in _COMPARE:
        return f"{expr} {_COMPARE[op]} {bind(value)}"
    if op in _REGEX:
        pattern = str(value)
        neg = "NOT " if op == "!~" else ""
        # Anchoring could pair up the parentheses of a pattern that is none ("a)|(b"): the
        # pattern is also compiled alone, in a constant that ClickHouse folds while planning,
        # so that a bad one fails the query even when no row is read.  Alone, it gets the
        # (?-s) too: without it, match() lets "a)" through, as it does not compile a pattern
        # that looks like plain text.
        return (
            f"match('', {bind('(?-s)' + pattern)}) IN (0, 1) AND "
            f"{neg}match({expr}, {bind('(?-s)^(?:' + pattern + ')$')})"
        )
    raise SearchError(f"unknown operator {op!r}")


def _compare_number(key: str, expr: str, op: str, value: object, bind: _Binder) -> str:
    """``expr op value`` for a numeric ``expr``, which no regular expression applies to."""
    if op in _REGEX:
        # DuckDB fails to bind the statement then (an internal error); it is the query's
        # fault.
        raise SearchError(f"{key} is a number: {op} compares text (names and attributes)")
    if isinstance(value, int) and not -(1 << 127) <= value < 1 << 128:
        # DuckDB refuses integers past 128 bits too; ClickHouse fails to parse long ones.
        raise SearchError(f"{key}: {value} is out of range")
    return _compare(expr, op, value, bind)


def _duration(key: str, value: object) -> object:
    # DuckDB also reads a numeric string ("5") as a duration; the parser never makes one.
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise SearchError(f"{key} compares with a duration, such as 100ms")
    return value


# DuckDB's TRY_CAST(text AS DOUBLE) trims these and takes "_" between digits ("1_000");
# toFloat64OrNull() reads neither, and is the fast path.
_SPACE = "' \\t\\n\\x0b\\f\\r'"
_BAD_UNDERSCORE = "'(^|[^0-9])_|_($|[^0-9])'"


def _number(text: str) -> str:
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


def _has_key(key: str, bind: _Binder) -> str:
    """Whether ``attrs`` has the attribute, of any type (see ``model.trace.STRING_US``)."""
    k = clean(key)
    return (
        f"(position(attrs, {bind(RS + k + US)}) > 0 "
        f"OR position(attrs, {bind(RS + k + STRING_US)}) > 0)"
    )


def _attribute(key: str, op: str, value: object, bind: _Binder, what: str) -> str:
    """A condition on the flattened text in ``attrs`` (a span's or a resource's), typed as
    TraceQL types it (as :func:`hotspan.store.duckdb_search._attribute`); ``what`` names it
    in errors."""
    if isinstance(value, bool):
        if op not in ("=", "!="):
            return "0"
        wanted = "true" if value == (op == "=") else "false"
        return f"position(attrs, {bind(RS + clean(key) + US + wanted + RS)}) > 0"
    if isinstance(value, (int, float)):
        # The text after US that reads as a number (strictly, as the engine reads it).
        pattern = f"{RS}{re.escape(clean(key))}{US}([^{RS}]*){RS}"
        extract = f"extract(attrs, {bind(pattern)})"
        number = _compare_number(what, _number(extract), op, float(value), bind)
        strict = f"match({extract}, {bind('^(?:' + NUMBER_PATTERN + ')$')})"
        return f"position(attrs, {bind(RS + clean(key) + US)}) > 0 AND {strict} AND {number}"
    if op == "=" and isinstance(value, str):
        return f"position(attrs, {bind(attribute_pattern(key, value))}) > 0"
    # Any other comparison with a string: the value of a string attribute, after STRING_US,
    # or after US when it does not read as a number or a boolean.
    typed = f"{RS}{re.escape(clean(key))}{US}([^{RS}]*){RS}"
    stringly = f"{RS}{re.escape(clean(key))}{STRING_US}([^{RS}]*){RS}"
    us_text = f"extract(attrs, {bind(typed)})"
    text = f"if(position(attrs, {bind(RS + clean(key) + US)}) > 0, {us_text}, " + (
        f"extract(attrs, {bind(stringly)}))"
    )
    string = (
        f"(position(attrs, {bind(RS + clean(key) + STRING_US)}) > 0 OR "
        f"(position(attrs, {bind(RS + clean(key) + US)}) > 0 AND NOT "
        f"match({us_text}, {bind('^(?:' + NUMBER_PATTERN + '|true|false)$')})))"
    )
    return f"{string} AND {_compare(text, op, value, bind)}"


def span_condition(cond: Condition, bind: _Binder) -> str:
    """SQL over one ``spans`` row."""
    key, op, value = cond.key, cond.op, cond.value
    if key in ("name", "span:name"):
        return _compare("name", op, condition_text(key, value), bind)
    if key in ("status", "span:status"):
        return _compare_number(
            key, "status_code", op, condition_code(STATUS_CODES, value, "status"), bind
        )
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
        return _compare_number(key, "parent_span_id", op, condition_span_id(value), bind)
    if key == "raw:span":  # bytes (hex) of the span's OTLP message: a necessary condition
        return f"position(hex(raw), {bind(str(value))}) > 0"
    if key == "raw:scope":
        return _IN_RESOURCE.format(f"position(hex(scope), {bind(str(value))}) > 0")
    if key.startswith("span."):
        return _attribute(key[5:], op, value, bind, key)
    if key.startswith("resource."):
        return _IN_RESOURCE.format(_attribute(key[9:], op, value, bind, key))
    if not key.startswith("."):
        raise SearchError(
            f"{key!r} is not something hotspan searches on: use name, status, kind, duration, "
            "trace:id, span:id, traceDuration, rootName, rootServiceName, or an attribute "
            "(span.x, resource.x, .x)"
        )
    # Unscoped, as Tempo reads it (and query.traceql_eval): the span's attribute when the span
    # has it, else the resource's (for service.name, the span's service).
    name = key[1:]
    span_sql = _attribute(name, op, value, bind, key)
    if name == "service.name":
        res_sql = _compare("service", op, condition_text(key, value), bind)
    else:
        res_sql = _IN_RESOURCE.format(_attribute(name, op, value, bind, key))
    has_key = _has_key(name, bind)
    return f"(({has_key} AND {span_sql}) OR (NOT {has_key} AND {res_sql}))"


def _trace_condition(cond: Condition, bind: _Binder) -> str:
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


def _spanset(conds: Tuple[Condition, ...], base: str, bind: _Binder) -> str:
    where = [base]
    for cond in conds:
        where.append(f"({span_condition(cond, bind)})")
    return " AND ".join(where)


# The root is the span without a parent, else the earliest (its parent never arrived); the
# span id only settles ties, which DuckDB settles as it happens to.
_ROOT_COLUMNS = (
    "argMin(service, (parent_span_id != 0, start_ns, span_id)) AS root_service, "
    "argMin(name, (parent_span_id != 0, start_ns, span_id)) AS root_name"
)


def search_sql(tenant: str, query: TraceQuery) -> Tuple[str, Params]:
    """The statement and its parameters, for ``client.query(sql, parameters=params)``:
    rows of (trace_id, root_service, root_name, t0, t1, spans, span_id, span_name, start_ns,
    end_ns, n), one per (trace, shown matched span), in the order of the answer."""
    bind = _Binder(
        tenant=tenant,
        start_ns=query.start_ns,
        end_ns=query.end_ns,
        limit=query.limit,
        spans_per_trace=max(query.spans_per_trace, 1),
    )
    # As in Tempo, a span counts when it overlaps the range.  The primary key (tenant, service,
    # start_ns) and the parts' start_ns bounds use the bound on start_ns; the one on end_ns
    # skips granules only with a minmax index on end_ns.
    base = "tenant = %(tenant)s AND start_ns < %(end_ns)s AND end_ns >= %(start_ns)s"
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
        WHERE tenant = %(tenant)s AND trace_id IN (SELECT trace_id FROM matched)
        GROUP BY trace_id
    )
    WHERE {" AND ".join(having) or "1"}
    ORDER BY {"t1 - t0" if by_duration else "t0"} DESC, trace_id
    LIMIT %(limit)s"""
    else:
        # Otherwise the newest traces can be picked from the matching spans alone, and only
        # those few aggregated in full.
        candidates = """
    SELECT trace_id FROM matched GROUP BY trace_id
    ORDER BY min(start_ns) DESC, trace_id
    LIMIT %(limit)s"""
    # uniqExact() and LIMIT 1 BY: an export retried after it landed stores its spans twice.
    # Only the few traces found pay for it.
    sql = f"""
WITH matched AS (
    SELECT trace_id, span_id, name, start_ns, end_ns FROM spans
    WHERE {first_where} {" ".join(others)}
), candidates AS ({candidates}
), found AS (
    SELECT trace_id, {_ROOT_COLUMNS},
           min(start_ns) AS t0, max(end_ns) AS t1, uniqExact(span_id) AS spans
    FROM spans
    WHERE tenant = %(tenant)s AND trace_id IN (SELECT trace_id FROM candidates)
    GROUP BY trace_id
), shown AS (
    SELECT *, row_number() OVER (PARTITION BY trace_id ORDER BY start_ns, span_id) AS rn,
           count() OVER (PARTITION BY trace_id) AS n
    FROM (
        SELECT * FROM matched
        WHERE trace_id IN (SELECT trace_id FROM candidates)
        LIMIT 1 BY trace_id, span_id
    )
)
SELECT f.trace_id, f.root_service, f.root_name, f.t0, f.t1, f.spans,
       s.span_id, s.name, s.start_ns, s.end_ns, s.n
FROM found AS f INNER JOIN shown AS s ON s.trace_id = f.trace_id
WHERE s.rn <= %(spans_per_trace)s
ORDER BY {"f.t1 - f.t0" if by_duration else "f.t0"} DESC, f.trace_id, s.rn
"""
    return sql, bind.params
