"""TraceQL's tokens, and Go's durations as Tempo reads them.

``parse_duration`` reads a Go duration (``300ms``, ``.5s``, ``2h45m``) as ``time.ParseDuration``
does; TraceQL adds the units ``d``, ``w`` and ``y``.  :class:`Lexer` cuts a query into
(kind, value, offset) tokens, reading strings, numbers, durations, attribute names and
intrinsics as Tempo's lexer (``pkg/traceql/lexer.go``) does; :class:`TokenReader` walks them
for the parsers (``parser``, ``metrics_math``).
"""

from __future__ import annotations

import math
import re
from typing import Dict, List, NoReturn, Optional, Tuple

from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.names import attribute, intrinsic

# Go's time.ParseDuration: an optional sign, then one or more "number unit" parts, where the
# number may lack either side of its point (".5s", "1.s") but not both; "0" alone is zero.
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([a-zµμ]+)")
_UNIT_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC Greek mu: Go takes both
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}

MAX_DURATION_NS = 2.0**63


def parse_duration(text: str, units: Optional[Dict[str, int]] = None) -> int:
    """A Go duration (``300ms``, ``.5s``, ``1.5s``, ``2h45m``, ``-1s``, ``0``) in nanoseconds,
    as Go's ``time.ParseDuration`` reads it (Tempo reads ``minDuration`` and TraceQL's
    durations with it); ``units`` replaces Go's units (TraceQL adds ``d``, ``w``, ``y``)."""
    units = _UNIT_NS if units is None else units
    text = text.strip()
    body = text[1:] if text[:1] in ("-", "+") else text
    if body == "0":
        return 0
    pos, total = 0, 0.0
    while pos < len(body):
        m = _DURATION_PART.match(body, pos)
        if m is None or m.group(2) not in units:
            break
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos == 0 or pos != len(body):
        raise QueryError(f"invalid duration {text[:40]!r} (use for example 100ms, 1.5s, 2m)")
    if not total < MAX_DURATION_NS:
        raise QueryError(f"duration {text[:40]!r} is too long")
    return -int(total) if text.startswith("-") else int(total)


_QUERY_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|`[^`]*`)
    | (?P<duration>(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h|d|w|y))+(?![A-Za-z0-9_.]))
    | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)
    | (?P<scoped>(?:span|resource|parent|event|link|instrumentation)\.)
    | (?P<colon>(?:span|trace|event|link|instrumentation):[A-Za-z_][A-Za-z0-9_]*)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<dot>\.)
    | (?P<op>!>>|!<<|&>>|&<<|&&|\|\||!=|=~|!~|>=|<=|>>|<<|!>|!<|&>|&<|&~
             |[=<>~!{}(),|+\-*/%^])
    """,
    re.VERBOSE,
)
_DURATION_UNITS = {
    **_UNIT_NS,
    "d": 86_400 * 10**9,
    "w": 7 * 86_400 * 10**9,
    "y": 365 * 86_400 * 10**9,
}
# What ends an attribute name (Tempo's isAttributeRune): spaces and TraceQL's punctuation.
_ATTRIBUTE_END = set(" \t\r\n{}()=~!<>&|^,")
_STRING_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}


class Lexer:
    """TraceQL's tokens: (kind, value, offset).  Kinds: string, int, float, duration, op,
    word, attribute (value: an ast.Attribute), end."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: List[Tuple[str, object, int]] = []
        pos, n = 0, len(text)
        while True:
            while pos < n and text[pos].isspace():
                pos += 1
            if pos >= n:
                break
            m = _QUERY_TOKEN.match(text, pos)
            if m is None:
                raise QueryError(
                    f"TraceQL: cannot read {text[pos : pos + 20]!r} at column {pos + 1}"
                )
            kind = m.lastgroup or ""
            raw = m.group(kind)
            if kind == "scoped" or kind == "dot":
                name, end = self._attribute_name(m.end(), pos)
                self.tokens.append(("attribute", attribute(raw, name, pos), pos))
                pos = end
                continue
            self.tokens.append(self._token(kind, raw, pos))
            pos = m.end()
        self.tokens.append(("end", "", n))

    def _token(self, kind: str, raw: str, pos: int) -> Tuple[str, object, int]:
        if kind == "string":
            return "string", _unquote(raw, pos), pos
        if kind == "duration":
            return "duration", ast.Duration(_query_duration(raw, pos)), pos
        if kind == "number":
            if re.fullmatch(r"\d+", raw):
                return "int", int(raw), pos
            number = float(raw)
            if not math.isfinite(number):
                raise QueryError(f"TraceQL: {raw[:40]} at column {pos + 1} is out of range")
            return "float", number, pos
        if kind == "colon":
            return "attribute", intrinsic(raw, pos), pos
        return kind, raw, pos

    def _attribute_name(self, pos: int, start: int) -> Tuple[str, int]:
        text, n = self.text, len(self.text)
        out: List[str] = []
        while pos < n:
            c = text[pos]
            if c == '"':
                pos += 1
                while pos < n and text[pos] != '"':
                    if text[pos] == "\\":
                        if pos + 1 >= n or text[pos + 1] not in '"\\':
                            raise QueryError(
                                f"TraceQL: a quoted attribute name at column {start + 1} takes "
                                'only the escapes \\" and \\\\'
                            )
                        pos += 1
                    out.append(text[pos])
                    pos += 1
                if pos >= n:
                    raise QueryError(
                        f"TraceQL: unterminated quote in the attribute at column {start + 1}"
                    )
                pos += 1
            elif c.isspace() or c in _ATTRIBUTE_END:
                break
            else:
                out.append(c)
                pos += 1
        if not out:
            raise QueryError(f"TraceQL: an attribute name is missing at column {start + 1}")
        return "".join(out), pos


def _unquote(raw: str, pos: int) -> str:
    if raw[0] == "`":
        return raw[1:-1]
    body = raw[1:-1]
    out: List[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[nxt])
            i += 2
        elif nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6]):
            out.append(chr(int(body[i + 2 : i + 6], 16)))
            i += 6
        else:
            raise QueryError(f"TraceQL: unknown escape \\{nxt} in the string at column {pos + 1}")
    return "".join(out)


def _query_duration(raw: str, pos: int) -> int:
    try:
        return parse_duration(raw, _DURATION_UNITS)
    except QueryError as exc:
        raise QueryError(f"TraceQL: {exc} at column {pos + 1}") from None


Token = Tuple[str, object, int]


class TokenReader:
    """A position in a query's tokens, and the errors that name it."""

    def __init__(self, text: str, tokens: Optional[List[Token]] = None) -> None:
        self.text = text
        self.tokens = Lexer(text).tokens if tokens is None else tokens
        self.pos = 0

    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def at(self, *values: str, ahead: int = 0) -> bool:
        kind, value, _ = self.peek(ahead)
        return kind in ("op", "word") and value in values

    def take(self) -> Token:
        tok = self.peek()
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return tok

    def expect(self, value: str, what: str = "") -> None:
        if not self.at(value):
            self.fail(f"expected {value!r}{what}")
        self.take()

    def fail(self, message: str) -> NoReturn:
        kind, value, pos = self.peek()
        found = "the end of the query" if kind == "end" else repr(_token_text(kind, value))
        raise QueryError(f"TraceQL: {message} at column {pos + 1}, found {found}")


def _token_text(kind: str, value: object) -> str:
    if kind == "string":
        return '"' + str(value) + '"'
    return str(value)
