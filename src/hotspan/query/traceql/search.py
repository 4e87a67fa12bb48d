"""TraceQL's fast path and Tempo's legacy tag search, read into SQL search conditions.

``parse_traceql`` reads spanset filters joined by ``&&`` whose matchers are all ``&&``ed
comparisons the stores have columns for, into one ``store.find_traces`` search (anything
else raises QueryError and runs in the engine).  ``parse_logfmt`` and ``legacy_query`` read
Tempo's ``tags``/``minDuration``/``maxDuration`` search as Tempo does.
"""

from __future__ import annotations

import math
import re
from typing import List, Optional, Sequence, Tuple, Union

from hotspan.model.trace import (
    OPERATORS,
    SPAN_KINDS,
    STATUS_CODES,
    TRACE_INTRINSICS,
    Condition,
    TraceQuery,
    reads_typed,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.conditions import condition_of
from hotspan.query.traceql.lexer import parse_duration

Value = Union[str, int, float]

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<duration>\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h)(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))*)
    | (?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
    | (?P<op>&&|\|\||!=|=~|!~|>=|<=|=|>|<|\{|\}|\(|\)|\|)
    | (?P<ident>[A-Za-z_.:][A-Za-z0-9_.:\-/]*)
    )""",
    re.VERBOSE,
)

_TRACE_KEYS = set(TRACE_INTRINSICS) | {"trace:duration", "trace:rootName", "trace:rootService"}

_DURATION_KEYS = {"duration", "span:duration", "traceDuration", "trace:duration"}
_KEYWORDS = {"true": True, "false": False}
# What the SQL search (store.find_traces) has columns for; anything else runs in the engine.
_SQL_ATTRIBUTE_PREFIXES = ("span.", "resource.", ".")
_SQL_INTRINSICS = _TRACE_KEYS | {
    "name", "span:name", "status", "span:status", "kind", "span:kind", "duration",
    "span:duration", "trace:id", "span:id", "span:parentID", "nestedSetParent",
}  # fmt: skip
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "t": "\t"}


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items: List[Tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise QueryError(f"TraceQL: cannot read {text[pos : pos + 30]!r}")
            kind = m.lastgroup or ""
            self.items.append((kind, m.group(kind)))
            pos = m.end()
            while pos < len(text) and text[pos].isspace():
                pos += 1
        self.pos = 0

    def peek(self) -> Optional[Tuple[str, str]]:
        return self.items[self.pos] if self.pos < len(self.items) else None

    def take(self, expected: Optional[str] = None) -> Tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise QueryError(f"TraceQL: the query ends where {expected or 'more'} was expected")
        if expected is not None and tok[1] != expected:
            raise QueryError(f"TraceQL: expected {expected!r}, found {tok[1]!r}")
        self.pos += 1
        return tok


def _value(kind: str, text: str, key: str) -> Value:
    if kind == "string":
        return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), text[1:-1])
    if kind == "duration":
        return parse_duration(text)
    if kind == "number":
        number = float(text)
        if not math.isfinite(number) or abs(number) >= 2.0**63:
            raise QueryError(f"TraceQL: {text[:40]} is out of range")
        if key in _DURATION_KEYS:
            return int(number)  # a bare number for a duration: nanoseconds
        return int(number) if number.is_integer() and "." not in text else number
    if kind == "ident" and (text in STATUS_CODES or text in SPAN_KINDS):
        return text
    if kind == "ident" and text in _KEYWORDS:
        return _KEYWORDS[text]
    raise QueryError(f"TraceQL: {text!r} is not a value")


def _condition(tokens: _Tokens) -> Condition:
    kind, key = tokens.take()
    if kind != "ident":
        raise QueryError(f"TraceQL: expected an attribute or intrinsic, found {key!r}")
    op_kind, op = tokens.take()
    if op not in OPERATORS:
        raise QueryError(f"TraceQL: {op!r} is not a comparison ({' '.join(OPERATORS)})")
    value_kind, text = tokens.take()
    value = _value(value_kind, text, key)
    if value_kind == "ident" and text not in _KEYWORDS and key.startswith(_SQL_ATTRIBUTE_PREFIXES):
        # A status or kind against an attribute never holds (an attribute is no status): the
        # engine says so, where SQL would compare the name as a string.
        raise QueryError(f"TraceQL: {key} {op} {text} compares an attribute with a {text}")
    if key in _DURATION_KEYS and not isinstance(value, int):
        raise QueryError(f"TraceQL: {key} compares with a duration such as 100ms, not {text}")
    if not key.startswith(_SQL_ATTRIBUTE_PREFIXES) and key not in _SQL_INTRINSICS:
        # span:childCount, event:name...: the engine reads what SQL cannot.
        raise QueryError(f"TraceQL: {key} is not a column of the SQL search")
    if key.startswith("nestedSet"):
        # Only the root test is a column the stores have (parent_span_id = 0).
        attr = ast.Attribute(key, "intrinsic", key)
        cond = condition_of(ast.Binary(op, attr, ast.Static(value)))
        if cond is None or not isinstance(value, int):
            raise QueryError(f"TraceQL: {key} {op} {text} needs whole traces")
        return cond
    return Condition(key, op, value)


def parse_traceql(text: str) -> Tuple[Tuple[Tuple[Condition, ...], ...], Tuple[Condition, ...]]:
    """(spansets, trace-wide conditions) of a query made of ``{...} && {...}``."""
    tokens = _Tokens(text)
    spansets: List[Tuple[Condition, ...]] = []
    trace_conds: List[Condition] = []
    while True:
        tokens.take("{")
        conds: List[Condition] = []
        if tokens.peek() != ("op", "}"):
            while True:
                cond = _condition(tokens)
                (trace_conds if cond.key in _TRACE_KEYS else conds).append(cond)
                nxt = tokens.peek()
                if nxt == ("op", "&&"):
                    tokens.take()
                    continue
                if nxt is not None and nxt[1] in ("||", "("):
                    raise QueryError("TraceQL: only conditions joined by && are supported")
                break
        tokens.take("}")
        spansets.append(tuple(conds))
        nxt = tokens.peek()
        if nxt is None:
            break
        if nxt != ("op", "&&"):
            raise QueryError(
                f"TraceQL: {nxt[1]!r} is not supported here (hotspan reads spanset filters "
                'joined by &&, such as {resource.service.name="api" && duration>100ms})'
            )
        tokens.take()
    return tuple(spansets), tuple(trace_conds)


def parse_logfmt(text: str) -> List[Tuple[str, str]]:
    """``key=value key2="a value"`` (logfmt, as Tempo's ``tags`` parameter)."""
    out: List[Tuple[str, str]] = []
    pos, n = 0, len(text)
    while pos < n:
        while pos < n and text[pos] == " ":
            pos += 1
        if pos >= n:
            break
        start = pos
        while pos < n and text[pos] not in ' ="':
            pos += 1
        key = text[start:pos]
        if not key or pos >= n or text[pos] != "=":
            raise QueryError(f"tags: expected key=value at {text[start : start + 40]!r}")
        pos += 1
        if pos < n and text[pos] == '"':
            pos += 1
            chars = []
            while pos < n and text[pos] != '"':
                if text[pos] == "\\" and pos + 1 < n:
                    pos += 1
                    chars.append({"n": "\n", "t": "\t"}.get(text[pos], text[pos]))
                else:
                    chars.append(text[pos])
                pos += 1
            if pos >= n:
                raise QueryError(f"tags: unterminated quote after {key}=")
            pos += 1
            value = "".join(chars)
        else:
            start = pos
            while pos < n and text[pos] != " ":
                pos += 1
            value = text[start:pos]
        if any(k == key for k, _ in out):
            raise QueryError(f"tags: {key} is set twice")
        out.append((key, value))
    return out


# Tempo's legacy tag names with a meaning of their own; any other name is an attribute of a
# span or of its resource.
_LEGACY_KEYS = {
    "service.name": "resource.service.name",
    "name": "name",
    "status.code": "status",
    "root.service.name": "rootServiceName",
    "root.name": "rootName",
}


def _legacy_value(text: str) -> Value:
    """A tag's value as TraceQL types it: ``http.status_code=200`` finds the int 200 (as
    Tempo's tags search does), ``ok=true`` the boolean, anything else a string."""
    if text in _KEYWORDS:
        return _KEYWORDS[text]
    if reads_typed(text):
        number = float(text)
        if math.isfinite(number) and abs(number) < 2.0**63:
            return int(text) if re.fullmatch(r"[-+]?[0-9]+", text) else number
    return text


def legacy_query(
    tags: Sequence[Tuple[str, str]],
    start_ns: int,
    end_ns: int,
    min_duration_ns: Optional[int],
    max_duration_ns: Optional[int],
    limit: int,
) -> TraceQuery:
    """Tempo's ``tags``/``minDuration``/``maxDuration`` search: every tag must be found in the
    trace (not necessarily on one span), the durations bound the trace's."""
    spansets: List[Condition] = []
    trace_conds: List[Condition] = []
    for key, value in tags:
        mapped = _LEGACY_KEYS.get(key, "." + key)
        cond = Condition(mapped, "=", _legacy_value(value) if mapped[0] == "." else value)
        (trace_conds if mapped in _TRACE_KEYS else spansets).append(cond)
    if min_duration_ns:
        trace_conds.append(Condition("traceDuration", ">=", min_duration_ns))
    if max_duration_ns:
        trace_conds.append(Condition("traceDuration", "<=", max_duration_ns))
    return TraceQuery(
        start_ns,
        end_ns,
        spansets=tuple((c,) for c in spansets),
        trace_conditions=tuple(trace_conds),
        limit=limit,
    )
