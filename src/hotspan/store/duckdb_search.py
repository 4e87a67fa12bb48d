"""Trace search in DuckDB's SQL: a :class:`TraceQuery` as one statement.

Each spanset needs one span of the trace that started in the range and meets all of its
conditions; the first spanset's spans are the ones shown with each trace.  Attribute
conditions work on the flattened attribute text (``hotspan.model.trace``): an equality is a
``contains`` of the exact ``key=value`` record, anything else extracts the value with a regular
expression (RE2 in DuckDB, so no pattern can stall the server).
"""

from __future__ import annotations

import re
from typing import List, Tuple

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

SQL = Tuple[str, list]
_COMPARE = {"=": "=", "!=": "<>", ">": ">", ">=": ">=", "<": "<", "<=": "<="}
_IN_RESOURCE = "group_id IN (SELECT group_id FROM span_groups WHERE {})"


def _compare(expr: str, op: str, value: object) -> SQL:
    if op in _COMPARE:
        return f"{expr} {_COMPARE[op]} ?", [value]
    if op in ("=~", "!~"):
        neg = "NOT " if op == "!~" else ""
        return f"{neg}regexp_full_match({expr}, ?)", [str(value)]
    raise SearchError(f"unknown operator {op!r}")


def _has_key(key: str) -> SQL:
    """Whether ``attrs`` has the attribute, of any type (see ``model.trace.STRING_US``)."""
    one = "contains(attrs, '" + RS + "' || ? || '{}')"
    return f"({one.format(US)} OR {one.format(STRING_US)})", [clean(key), clean(key)]


def _attribute(key: str, op: str, value: object) -> SQL:
    """A condition on the flattened text in ``attrs`` (a span's or a resource's), typed as
    TraceQL types it: a string never meets a number or a boolean, whatever its text (a
    string that reads as one is stored after STRING_US); numbers compare as numbers."""
    if isinstance(value, bool):
        if op not in ("=", "!="):
            return "FALSE", []
        # != true: the boolean false, not an attribute of another type.
        wanted = "true" if value == (op == "=") else "false"
        return "contains(attrs, ?)", [f"{RS}{clean(key)}{US}{wanted}{RS}"]
    typed = f"{RS}{re.escape(clean(key))}{US}([^{RS}]*){RS}"
    if isinstance(value, (int, float)):
        # The text after US that reads as a number (strict: TRY_CAST would take " 1" or "nan").
        extract = "regexp_extract(attrs, ?, 1)"
        sql, params = _compare(f"TRY_CAST({extract} AS DOUBLE)", op, float(value))
        return (
            f"regexp_full_match({extract}, '{NUMBER_PATTERN}') AND {sql}",
            [typed, typed, *params],
        )
    if op == "=" and isinstance(value, str):
        return "contains(attrs, ?)", [attribute_pattern(key, value)]
    # Any other comparison with a string: the value of a string attribute, after STRING_US,
    # or after US when it does not read as a number or a boolean.
    either = f"{RS}{re.escape(clean(key))}([{US}{STRING_US}])([^{RS}]*){RS}"
    sep, text = "regexp_extract(attrs, ?, 1)", "regexp_extract(attrs, ?, 2)"
    string = (
        f"({sep} = '{STRING_US}' OR ({sep} = '{US}' AND NOT regexp_full_match({text}, "
        f"'{NUMBER_PATTERN}|true|false')))"
    )
    sql, params = _compare(text, op, value)
    return f"{string} AND {sql}", [either, either, either, either, *params]


def span_condition(cond: Condition) -> SQL:
    """SQL over one ``spans`` row."""
    key, op, value = cond.key, cond.op, cond.value
    if key in ("name", "span:name"):
        return _compare("name", op, condition_text(key, value))
    if key in ("status", "span:status"):
        return _compare("status_code", op, condition_code(STATUS_CODES, value, "status"))
    if key in ("kind", "span:kind"):
        return _compare("kind", op, condition_code(SPAN_KINDS, value, "kind"))
    if key in ("duration", "span:duration"):
        return _compare("(end_ns - start_ns)", op, value)
    if key in ("resource.service.name", "service.name"):
        return _compare("service", op, condition_text(key, value))
    if key == "trace:id":
        return _compare("trace_id", op, str(value).lower().rjust(32, "0"))
    if key == "span:id":
        return _compare("span_id", op, condition_span_id(value))
    if key == "span:parentID":  # "0000000000000000": a root span (TraceQL's nestedSetParent<0)
        return _compare("parent_span_id", op, condition_span_id(value))
    if key == "raw:span":  # bytes (hex) of the span's OTLP message: a necessary condition
        return "contains(hex(raw), ?)", [str(value)]
    if key == "raw:scope":
        return _IN_RESOURCE.format("contains(hex(scope), ?)"), [str(value)]
    if key.startswith("span."):
        return _attribute(key[5:], op, value)
    if key.startswith("resource."):
        sql, params = _attribute(key[9:], op, value)
        return _IN_RESOURCE.format(sql), params
    if not key.startswith("."):
        raise SearchError(
            f"{key!r} is not something hotspan searches on: use name, status, kind, duration, "
            "trace:id, span:id, traceDuration, rootName, rootServiceName, or an attribute "
            "(span.x, resource.x, .x)"
        )
    # Unscoped, as Tempo reads it (and query.traceql_eval): the span's attribute when the span
    # has it, else the resource's (for service.name, the span's service).
    name = key[1:]
    span_sql, span_params = _attribute(name, op, value)
    if name == "service.name":
        res_sql, res_params = _compare("service", op, condition_text(key, value))
    else:
        sql, res_params = _attribute(name, op, value)
        res_sql = _IN_RESOURCE.format(sql)
    has_key, key_params = _has_key(name)
    return (
        f"(({has_key} AND {span_sql}) OR (NOT {has_key} AND {res_sql}))",
        [*key_params, *span_params, *key_params, *res_params],
    )


def _trace_condition(cond: Condition) -> SQL:
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
        return _compare(expr, cond.op, cond.value)
    return _compare(expr, cond.op, condition_text(cond.key, cond.value))


def _spanset(conds: Tuple[Condition, ...], base: str, base_params: list) -> SQL:
    where = [base]
    params = list(base_params)
    for cond in conds:
        sql, args = span_condition(cond)
        where.append(f"({sql})")
        params.extend(args)
    return " AND ".join(where), params


# The root is the span without a parent, else the earliest (its parent never arrived).
_ROOT_COLUMNS = (
    "arg_min(service, (parent_span_id <> 0, start_ns)) AS root_service, "
    "arg_min(name, (parent_span_id <> 0, start_ns)) AS root_name"
)


def search_sql(tenant_id: int, query: TraceQuery) -> SQL:
    # As in Tempo, a span counts when it overlaps the range.
    base = "tenant_id = ? AND end_ns >= ? AND start_ns < ?"
    base_params: List[object] = [tenant_id, query.start_ns, query.end_ns]
    spansets = query.spansets or ((),)
    first_where, params = _spanset(spansets[0], base, base_params)
    others = []
    for conds in spansets[1:]:
        where, args = _spanset(conds, base, base_params)
        others.append(f"AND trace_id IN (SELECT trace_id FROM spans WHERE {where})")
        params.extend(args)
    having: List[str] = []
    having_params: List[object] = []
    for cond in query.trace_conditions:
        sql, args = _trace_condition(cond)
        having.append(sql)
        having_params.extend(args)
    if query.order not in TRACE_ORDERS:
        orders = ", ".join(TRACE_ORDERS)
        raise SearchError(f"order must be one of {orders}, not {query.order!r}")
    by_duration = query.order == "duration"
    if having or by_duration:
        # Trace-wide conditions, and the longest first, need every matching trace's bounds
        # and root.
        candidates = f"""
    SELECT trace_id FROM (
        SELECT trace_id, {_ROOT_COLUMNS}, min(start_ns) AS t0, max(end_ns) AS t1
        FROM spans
        WHERE tenant_id = ? AND trace_id IN (SELECT trace_id FROM matched)
        GROUP BY trace_id
    )
    WHERE {" AND ".join(having) or "TRUE"}
    ORDER BY {"t1 - t0" if by_duration else "t0"} DESC, trace_id
    LIMIT ?"""
        candidate_params = [tenant_id, *having_params, query.limit]
    else:
        # Otherwise the newest traces can be picked from the matching spans alone, and only
        # those few aggregated in full: 10x less work over a day of spans.
        candidates = """
    SELECT trace_id FROM matched GROUP BY trace_id
    ORDER BY min(start_ns) DESC, trace_id
    LIMIT ?"""
        candidate_params = [query.limit]
    sql = f"""
WITH matched AS (
    SELECT trace_id, span_id, name, start_ns, end_ns FROM spans
    WHERE {first_where} {" ".join(others)}
), candidates AS ({candidates}
), found AS (
    -- count(DISTINCT ...) here and DISTINCT ON below: an export retried after it landed
    -- stores its spans twice.  Only the few traces found pay for it.
    SELECT trace_id, {_ROOT_COLUMNS},
           min(start_ns) AS t0, max(end_ns) AS t1, count(DISTINCT span_id) AS spans
    FROM spans
    WHERE tenant_id = ? AND trace_id IN (SELECT trace_id FROM candidates)
    GROUP BY trace_id
), shown AS (
    SELECT *, row_number() OVER (PARTITION BY trace_id ORDER BY start_ns, span_id) AS rn,
           count(*) OVER (PARTITION BY trace_id) AS n
    FROM (
        SELECT DISTINCT ON (trace_id, span_id) * FROM matched
        WHERE trace_id IN (SELECT trace_id FROM candidates)
    )
)
SELECT f.trace_id, f.root_service, f.root_name, f.t0, f.t1, f.spans,
       s.span_id, s.name, s.start_ns, s.end_ns, s.n
FROM found f JOIN shown s ON s.trace_id = f.trace_id AND s.rn <= ?
ORDER BY {"f.t1 - f.t0" if by_duration else "f.t0"} DESC, f.trace_id, s.rn
"""
    return sql, [
        *params,
        *candidate_params,
        tenant_id,
        max(query.spans_per_trace, 1),
    ]
