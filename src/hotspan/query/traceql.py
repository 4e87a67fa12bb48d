"""The part of TraceQL that trace search understands, and Tempo's legacy ``tags`` search.

Grafana's Tempo search builder writes spanset filters such as
``{resource.service.name="api" && name="GET /pay" && traceDuration>1s}``; those, and several
of them joined by ``&&`` (``{a} && {b}``: a span matching each), are what this parser takes.
Anything else (``||``, pipelines, structural operators) is refused with a message saying so.
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
)
from hotspan.query.engine import QueryError

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
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_TRACE_KEYS = set(TRACE_INTRINSICS) | {"trace:duration", "trace:rootName", "trace:rootService"}
MAX_DURATION_NS = 2.0**63
_DURATION_KEYS = {"duration", "span:duration", "traceDuration", "trace:duration"}
_KEYWORDS = {"true": True, "false": False}
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "t": "\t"}


def parse_duration(text: str) -> int:
    """A Go duration (``300ms``, ``1.5s``, ``2h45m``) in nanoseconds."""
    text = text.strip()
    pos, total = 0, 0.0
    while pos < len(text):
        m = _DURATION_PART.match(text, pos)
        if m is None:
            break
        total += float(m.group(1)) * _UNIT_NS[m.group(2)]
        pos = m.end()
    if pos == 0 or pos != len(text):
        raise QueryError(f"invalid duration {text!r} (use for example 100ms, 1.5s, 2m)")
    if not total < MAX_DURATION_NS:
        raise QueryError(f"duration {text[:40]!r} is too long")
    return int(total)


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
        return "true" if _KEYWORDS[text] else "false"
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
    if key in _DURATION_KEYS and not isinstance(value, int):
        raise QueryError(f"TraceQL: {key} compares with a duration such as 100ms, not {text}")
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
    spansets = []
    trace_conds = []
    for key, value in tags:
        mapped = _LEGACY_KEYS.get(key, "." + key)
        cond = Condition(mapped, "=", value)
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
