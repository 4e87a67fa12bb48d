"""TraceQL, read: Tempo's query language (and its legacy ``tags`` search) into what runs it.

``parse_query`` reads any query hotspan runs: spanset filters with every operator, ``&&`` and
``||`` between spansets, structural operators, pipelines (``by``, ``select``, ``coalesce``,
aggregates), a metrics function at the end (``| rate() by (...)``, ``compare()``) and hints.
It gives a :class:`Query`: the syntax tree (``query.traceql_ast``) with its compiled plan,
which ``query.traceql_eval`` runs on one trace's spans (re-exported here), the conditions
every span a query starts from meets (``pushdown``, for ``store.span_records``), and
``simple`` when the query is only conjunctive spanset filters, which ``parse_traceql`` turns
into one SQL search (``store.find_traces``), the fast path.  Query size is bounded
(MAX_QUERY_NODES, MAX_PIPELINE_STAGES).  ``legacy_query``/``parse_logfmt`` read Tempo's tags
search, and ``parse_duration`` Go's durations, as Tempo reads them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

from hotspan.model.trace import (
    OPERATORS,
    SPAN_KINDS,
    STATUS_CODES,
    TRACE_INTRINSICS,
    Condition,
    TraceQuery,
    reads_typed,
)
from hotspan.query import traceql_ast as ast
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
_TRACE_KEYS = set(TRACE_INTRINSICS) | {"trace:duration", "trace:rootName", "trace:rootService"}
MAX_DURATION_NS = 2.0**63
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
        cond = _condition_of(ast.Binary(op, attr, ast.Static(value)))
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
    spansets = []
    trace_conds = []
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


# -- the whole language: pipelines, structural operators, metrics --------------------------------
#
# ``parse_query`` reads TraceQL as Tempo's grammar does (pkg/traceql/expr.y): ``&&`` and ``||``
# share the lowest precedence and associate left, both between spansets and inside a filter;
# structural operators bind tighter than ``&&``/``||``; ``|`` chains pipeline stages.  The tree
# it builds (``query.traceql_ast``) is run by ``query.traceql_eval`` on one trace's spans.

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

# Intrinsics hotspan computes, by every name TraceQL gives them -> the canonical name.
INTRINSICS = {
    "name": "name",
    "span:name": "name",
    "status": "status",
    "span:status": "status",
    "kind": "kind",
    "span:kind": "kind",
    "duration": "duration",
    "span:duration": "duration",
    "childCount": "childCount",
    "span:childCount": "childCount",
    "span:id": "span:id",
    "span:parentID": "span:parentID",
    "trace:id": "trace:id",
    "traceDuration": "traceDuration",
    "trace:duration": "traceDuration",
    "rootName": "rootName",
    "trace:rootName": "rootName",
    "rootServiceName": "rootServiceName",
    "trace:rootService": "rootServiceName",
    # Tempo's nested set numbering of a trace (see traceql_eval.nested_set): the parent of a
    # root is -1, of a span cut off from the roots 0.
    "nestedSetParent": "nestedSetParent",
    "nestedSetLeft": "nestedSetLeft",
    "nestedSetRight": "nestedSetRight",
}
# Intrinsics of what hotspan keeps only in the stored OTLP span (status message, events,
# links) and its span group (instrumentation scope): search reads them there
# (traceql_eval.RAW_ONLY); metrics and autocomplete, which read the span index only, see nil.
UNSEARCHED = (
    "statusMessage", "event:name", "event:timeSinceStart", "link:spanID", "link:traceID",
    "instrumentation:name", "instrumentation:version",
)  # fmt: skip
INTRINSICS.update({name: name for name in UNSEARCHED})
INTRINSICS["span:statusMessage"] = "statusMessage"
# Attribute scopes of the same: event.x, link.x, instrumentation.x.
UNSEARCHED_SCOPES = ("event", "link", "instrumentation")
_KNOWN_ELSEWHERE = {"parent"}
_STATIC_WORDS = {
    "true": True,
    "false": False,
    "minInt": -(2**63),
    "maxInt": 2**63 - 1,
    **{name: ast.Status(name) for name in STATUS_CODES},
    **{name: ast.Kind(name) for name in SPAN_KINDS},
}
_AGGREGATES = ("count", "avg", "min", "max", "sum")
METRICS_FUNCTIONS = (
    "rate",
    "count_over_time",
    "quantile_over_time",
    "histogram_over_time",
    "min_over_time",
    "max_over_time",
    "avg_over_time",
    "sum_over_time",
    "compare",
)
_NO_ARGUMENT = ("rate", "count_over_time")
# Comparisons after a metrics function: its series' points for which it holds are kept.
_METRICS_FILTERS = ("=", "!=", "<", "<=", ">", ">=")
_STRUCTURAL = (
    ">",
    "<",
    ">>",
    "<<",
    "~",
    "!>",
    "!<",
    "!>>",
    "!<<",
    "!~",
    "&>",
    "&<",
    "&>>",
    "&<<",
    "&~",
)
_COMPARISONS = ("=", "!=", "<", "<=", ">", ">=", "=~", "!~")
_FIELD_LEVELS = (("&&", "||"), _COMPARISONS, ("+", "-"), ("*", "/", "%"))
# Intrinsics a search result does not repeat among a span's attributes (it has fields for
# them), as Tempo's asTraceSearchMetadata.
_NOT_SHOWN = {
    "name",
    "duration",
    "traceDuration",
    "rootName",
    "rootServiceName",
    "trace:id",
    "span:id",
}


@dataclass(frozen=True)
class MetricsStage:
    """The ``| rate() by (...)`` end of a metrics query."""

    function: str  # one of METRICS_FUNCTIONS
    attribute: Optional[str]  # what *_over_time reads, as written canonically: "duration"...
    quantiles: Tuple[float, ...]  # quantile_over_time(duration, .5, .99)
    by: Tuple[str, ...]  # by(resource.service.name, span.http.route)
    # Second-stage functions after it, in order: ("topk", 10), ("bottomk", 5), and filters
    # of the series' values (``> 3``): (">", 3.0).
    second_stage: Tuple[Tuple[str, float], ...] = ()
    # compare({filter}, topN, start, end): the selection's filter (test a span with
    # ``matches``), how many values per attribute, and the selection's window (unix ns; a
    # span is in it when start < its start <= end, as in Tempo), None when not given.
    compare_filter: Optional[ast.Field] = None
    top_n: int = 10
    compare_start_ns: Optional[int] = None
    compare_end_ns: Optional[int] = None


@dataclass(frozen=True)
class Query:
    """A parsed TraceQL query.  ``simple``: what :func:`parse_traceql` reads of it, when the
    query is only that (SQL answers it); ``pushdown``: conditions every span the query can
    start from meets (for ``store.span_records``); ``needs_traces``: whether evaluating it
    needs every span of a trace rather than the spans the pushdown finds."""

    text: str
    simple: Optional[Tuple[Tuple[Tuple[Condition, ...], ...], Tuple[Condition, ...]]]
    pushdown: Tuple[Condition, ...]
    needs_traces: bool
    metrics: Optional[MetricsStage]
    root: ast.Element = ast.Filter(ast.Static(True))
    # The attributes a search result shows on its spans: those the query names (conditions,
    # by(), aggregates, select()), but for the intrinsics a result has fields for.
    shown: Tuple[ast.Attribute, ...] = ()
    hints: Tuple[Tuple[str, object], ...] = ()
    # Every field expression of the query compiled, by id (see traceql_eval.check): kept here
    # so that evaluating the query, once per trace, compiles nothing.
    plan: Dict[int, Callable[..., object]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    # Whether it names what only the stored OTLP spans hold (statusMessage, event:name,
    # link:traceID, instrumentation:name, event.x...): search then reads them.
    needs_raw: bool = False


class _Lexer:
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
                self.tokens.append(("attribute", _attribute(raw, name, pos), pos))
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
            return "attribute", _intrinsic(raw, pos), pos
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


_ATTRIBUTE_QUOTE = re.compile(r"[\s{}()=~!<>&|^,\"]")


def _attribute(prefix: str, name: str, pos: int) -> ast.Attribute:
    scope = prefix[:-1]
    if scope not in ("span", "resource", "", *UNSEARCHED_SCOPES):
        raise QueryError(
            f"TraceQL: {scope}. attributes (column {pos + 1}) are not searchable in hotspan; "
            "use span., resource. or ."
        )
    shown = name
    if _ATTRIBUTE_QUOTE.search(name):
        shown = '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return ast.Attribute(f"{scope}.{shown}" if scope else f".{shown}", scope, name)


def _intrinsic(raw: str, pos: int) -> ast.Attribute:
    canonical = INTRINSICS.get(raw)
    if canonical is None:
        if raw in _KNOWN_ELSEWHERE:
            raise QueryError(
                f"TraceQL: {raw} (column {pos + 1}) is not kept by hotspan's span index"
            )
        raise QueryError(f"TraceQL: unknown intrinsic {raw!r} at column {pos + 1}")
    return ast.Attribute(raw, "intrinsic", canonical)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _Lexer(text).tokens
        self.pos = 0

    # -- tokens --

    def peek(self, ahead: int = 0) -> Tuple[str, object, int]:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def at(self, *values: str, ahead: int = 0) -> bool:
        kind, value, _ = self.peek(ahead)
        return kind in ("op", "word") and value in values

    def take(self) -> Tuple[str, object, int]:
        tok = self.peek()
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return tok

    def expect(self, value: str, what: str = "") -> None:
        if not self.at(value):
            self.fail(f"expected {value!r}{what}")
        self.take()

    def fail(self, message: str) -> None:
        kind, value, pos = self.peek()
        found = "the end of the query" if kind == "end" else repr(_token_text(kind, value))
        raise QueryError(f"TraceQL: {message} at column {pos + 1}, found {found}")

    # -- the query --

    def query(self) -> Tuple[ast.Element, Optional[MetricsStage], Tuple[Tuple[str, object], ...]]:
        if self.peek()[0] == "end":
            self.fail("expected a query such as { }")
        stages = [self.stage()]
        metrics = None
        while self.at("|"):
            self.take()
            if self.peek()[0] == "word" and self.peek()[1] in METRICS_FUNCTIONS:
                metrics = self.metrics()
                break
            if self.peek()[0] == "word" and self.peek()[1] in ("topk", "bottomk"):
                self.fail(f"{self.peek()[1]}() goes after a metrics function such as rate()")
            stages.append(self.stage())
        hints: Tuple[Tuple[str, object], ...] = ()
        if self.at("with"):
            hints = self.hints()
        if self.peek()[0] != "end":
            if self.at(")"):
                self.fail("unbalanced ')'")
            self.fail("expected '|', an operator or the end of the query")
        root = stages[0] if len(stages) == 1 else ast.Pipeline(tuple(stages))
        return root, metrics, hints

    def stage(self) -> ast.Element:
        kind, value, _ = self.peek()
        if kind == "word" and value == "by":
            self.take()
            self.expect("(")
            expr = self.field()
            self.expect(")", " closing by(")
            return ast.GroupBy(expr)
        if kind == "word" and value == "select":
            self.take()
            self.expect("(")
            attrs = [self.attribute_ref()]
            while self.at(","):
                self.take()
                attrs.append(self.attribute_ref())
            self.expect(")", " closing select(")
            return ast.Select(tuple(attrs))
        if kind == "word" and value == "coalesce":
            self.take()
            self.expect("(")
            self.expect(")", ": coalesce() takes no argument")
            return ast.Coalesce()
        if self._scalar_ahead():
            return self.scalar_filter()
        return self.spanset(0)

    def _scalar_ahead(self) -> bool:
        """Whether a stage is a scalar filter: ``count() > 2``, ``(avg(x)) > 1``, ``2 < max(x)``."""
        i = 0
        while self.at("(", ahead=i):
            i += 1
        kind, value, _ = self.peek(i)
        if kind == "word" and value in _AGGREGATES:
            return True
        return kind in ("int", "float", "duration") or self.at("-", ahead=i)

    # -- spanset expressions --

    def spanset(self, level: int) -> ast.Element:
        if level == 2:
            return self.spanset_operand()
        lhs = self.spanset(level + 1)
        ops = ("&&", "||") if level == 0 else _STRUCTURAL
        while self.peek()[0] == "op" and self.peek()[1] in ops:
            op = str(self.take()[1])
            lhs = ast.SpansetOp(op, lhs, self.spanset(level + 1))
        return lhs

    def spanset_operand(self) -> ast.Element:
        if self.at("{"):
            self.take()
            if self.at("}"):
                self.take()
                return ast.Filter(ast.Static(True))
            expr = self.field()
            if not self.at("}"):
                self.fail("expected '}' or an operator")
            self.take()
            if isinstance(expr, ast.Static) and not isinstance(expr.value, bool):
                raise QueryError(f"TraceQL: {{ {expr} }} is not a condition")
            return ast.Filter(expr)
        if self.at("("):
            self.take()
            stages = [self.stage()]
            while self.at("|"):
                self.take()
                stages.append(self.stage())
            self.expect(")", " closing '('")
            return stages[0] if len(stages) == 1 else ast.Pipeline(tuple(stages))
        if self.peek()[0] == "attribute" or self.at("name", "status", "kind", "duration"):
            self.fail("a condition goes inside a spanset filter { }: expected '{'")
        self.fail("expected a spanset filter { ... }")
        raise AssertionError  # fail() raised

    # -- scalar filters (count() > 2) --

    def scalar_filter(self) -> ast.ScalarFilter:
        lhs = self.scalar_operand()
        kind, op, _ = self.peek()
        if kind != "op" or op not in ("=", "!=", "<", "<=", ">", ">="):
            if kind == "op" and op in ("+", "-", "*", "/", "%", "^"):
                self.fail("arithmetic on aggregates is not supported")
            self.fail("expected a comparison (= != < <= > >=) after the aggregate")
        self.take()
        rhs = self.scalar_operand()
        if isinstance(lhs, ast.Aggregate) and not isinstance(rhs, ast.Aggregate):
            return ast.ScalarFilter(str(op), lhs, rhs)
        if isinstance(rhs, ast.Aggregate) and not isinstance(lhs, ast.Aggregate):
            return ast.ScalarFilter(str(op), rhs, lhs, flipped=True)
        raise QueryError(
            "TraceQL: a scalar filter compares one aggregate with a number or duration"
        )

    def scalar_operand(self) -> object:
        if self.at("("):
            self.take()
            inner = self.scalar_operand()
            self.expect(")")
            return inner
        kind, value, _ = self.peek()
        if kind == "word" and value in _AGGREGATES:
            self.take()
            self.expect("(")
            if value == "count":
                self.expect(")", ": count() takes no argument")
                return ast.Aggregate("count", None)
            expr = self.field()
            self.expect(")", f" closing {value}(")
            return ast.Aggregate(str(value), expr)
        negative = False
        if self.at("-"):
            self.take()
            negative = True
        kind, value, _ = self.peek()
        if kind in ("int", "float", "duration"):
            self.take()
            return -value if negative else value  # type: ignore[operator]
        self.fail("expected an aggregate (count(), avg(x)...) or a number")
        raise AssertionError

    # -- field expressions (inside { }) --

    def field(self, level: int = 0) -> ast.Field:
        if level == len(_FIELD_LEVELS):
            return self.power()
        lhs = self.field(level + 1)
        ops = _FIELD_LEVELS[level]
        while self.peek()[0] == "op" and self.peek()[1] in ops:
            op = str(self.take()[1])
            if op in ("=", "!=") and self.at("nil"):
                self.take()
                lhs = ast.Unary("missing" if op == "=" else "exists", lhs)
                continue
            rhs = self.field(level + 1)
            if isinstance(lhs, ast.Static) and lhs.value is ast.NIL and op in ("=", "!="):
                lhs = ast.Unary("missing" if op == "=" else "exists", rhs)
                continue
            if ast.NIL in (_static_value(lhs), _static_value(rhs)):
                raise QueryError("TraceQL: nil compares only with = and != (x = nil, x != nil)")
            lhs = ast.Binary(op, lhs, rhs)
        return lhs

    def power(self) -> ast.Field:
        base = self.unary()
        if self.at("^"):
            self.take()
            return ast.Binary("^", base, self.power())
        return base

    def unary(self) -> ast.Field:
        if self.at("!"):
            self.take()
            return ast.Unary("!", self.unary())
        if self.at("-"):
            self.take()
            inner = self.unary()
            value = _static_value(inner)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return ast.Static(type(value)(-value))  # type: ignore[call-arg]
            return ast.Unary("-", inner)
        return self.primary()

    def primary(self) -> ast.Field:
        kind, value, pos = self.peek()
        if kind == "op" and value == "(":
            self.take()
            expr = self.field()
            self.expect(")", " closing '('")
            return expr
        if kind in ("string", "int", "float", "duration"):
            self.take()
            return ast.Static(value)
        if kind == "attribute":
            self.take()
            return value  # type: ignore[return-value]
        if kind == "word":
            name = str(value)
            if name in INTRINSICS:
                self.take()
                return ast.Attribute(name, "intrinsic", INTRINSICS[name])
            if name in _STATIC_WORDS:
                self.take()
                return ast.Static(_STATIC_WORDS[name])
            if name == "nil":
                self.take()
                return ast.Static(ast.NIL)
            if name in _KNOWN_ELSEWHERE:
                raise QueryError(
                    f"TraceQL: {name} (column {pos + 1}) is not kept by hotspan's span index"
                )
            raise QueryError(
                f"TraceQL: unknown identifier {name!r} at column {pos + 1} (quote strings: "
                f'"{name}"; attributes start with span., resource. or .)'
            )
        self.fail("expected a value, an attribute or an intrinsic")
        raise AssertionError

    def attribute_ref(self) -> ast.Attribute:
        kind, value, pos = self.peek()
        if kind == "attribute":
            self.take()
            return value  # type: ignore[return-value]
        if kind == "word" and value in INTRINSICS:
            self.take()
            return ast.Attribute(str(value), "intrinsic", INTRINSICS[str(value)])
        if kind == "word" and value in _KNOWN_ELSEWHERE:
            raise QueryError(
                f"TraceQL: {value} (column {pos + 1}) is not kept by hotspan's span index"
            )
        self.fail("expected an attribute (span.x, resource.x, .x) or an intrinsic")
        raise AssertionError

    # -- metrics --

    def metrics(self) -> MetricsStage:
        function = str(self.take()[1])
        self.expect("(")
        if function == "compare":
            return self.compare()
        attribute: Optional[str] = None
        quantiles: List[float] = []
        if function not in _NO_ARGUMENT:
            attribute = self.attribute_ref().text
            if function == "quantile_over_time":
                if not self.at(","):
                    self.fail(
                        "quantile_over_time takes an attribute and quantiles (duration, .5, .99):"
                    )
                while self.at(","):
                    self.take()
                    kind, value, _ = self.take()
                    if kind not in ("int", "float") or not 0 <= float(value) <= 1:  # type: ignore[arg-type]
                        self.pos -= 1
                        self.fail("expected a quantile between 0 and 1")
                    quantiles.append(float(value))  # type: ignore[arg-type]
        self.expect(")", f" closing {function}(")
        by: List[str] = []
        if self.at("by"):
            self.take()
            self.expect("(")
            by.append(self.attribute_ref().text)
            while self.at(","):
                self.take()
                by.append(self.attribute_ref().text)
            self.expect(")", " closing by(")
        second: List[Tuple[str, float]] = []
        while self.at("|", *_METRICS_FILTERS):
            if not self.at("|"):
                second.append(self.metrics_filter())
                continue
            self.take()
            if not self.at("topk", "bottomk"):
                self.fail("expected topk(n) or bottomk(n) after a metrics function")
            name = str(self.take()[1])
            self.expect("(")
            kind, value, _ = self.take()
            if kind != "int" or int(value) <= 0:  # type: ignore[call-overload]
                self.pos -= 1
                self.fail(f"{name}() takes a positive integer")
            self.expect(")")
            second.append((name, int(value)))  # type: ignore[call-overload]
        return MetricsStage(function, attribute, tuple(quantiles), tuple(by), tuple(second))

    def metrics_filter(self) -> Tuple[str, float]:
        """``> 3`` after a metrics function (Tempo's metricsFilter): (operator, value), a
        duration in seconds, as Tempo reads it."""
        op = str(self.take()[1])
        negative = self.at("-")
        if negative:
            self.take()
        kind, value, _ = self.peek()
        if kind not in ("int", "float", "duration"):
            self.fail(f"expected a number after {op!r}")
        self.take()
        number = float(value) / 1e9 if kind == "duration" else float(value)  # type: ignore[arg-type]
        return op, -number if negative else number

    def compare(self) -> MetricsStage:
        """``compare({filter})``, ``compare({filter}, topN)``, ``compare({filter}, topN,
        start, end)`` (Tempo's grammar: a spanset filter and integers), after ``compare(``."""
        if not self.at("{"):
            self.fail("compare() takes a spanset filter first, such as compare({status = error})")
        selection = self.spanset_operand()
        if not isinstance(selection, ast.Filter):
            self.fail("compare() takes one spanset filter { }")
        numbers: List[int] = []
        while self.at(","):
            self.take()
            kind, value, _ = self.take()
            if kind != "int":
                self.pos -= 1
                self.fail("compare() takes integers after its filter (topN, start, end)")
            numbers.append(int(value))  # type: ignore[call-overload]
        self.expect(")", " closing compare(")
        if len(numbers) not in (0, 1, 3):
            raise QueryError(
                "TraceQL: compare() takes a filter, then topN, then optionally start and end "
                "(unix nanoseconds): compare({status = error}, 10, start, end)"
            )
        top_n = numbers[0] if numbers else 10
        if top_n <= 0:
            raise QueryError("TraceQL: compare()'s topN must be positive")
        start = end = None
        if len(numbers) == 3 and (numbers[1] or numbers[2]):  # 0, 0: no window, as in Tempo
            start, end = numbers[1], numbers[2]
            if start <= 0 or end <= 0:
                raise QueryError("TraceQL: compare() timestamps are positive unix nanoseconds")
            if end <= start:
                raise QueryError("TraceQL: compare()'s end must be after its start")
        second: List[Tuple[str, int]] = []
        if self.at("|"):
            self.fail("compare() takes no second stage")
        return MetricsStage(
            "compare",
            None,
            (),
            (),
            tuple(second),
            compare_filter=selection.expr,
            top_n=top_n,
            compare_start_ns=start,
            compare_end_ns=end,
        )

    def hints(self) -> Tuple[Tuple[str, object], ...]:
        self.take()
        self.expect("(")
        out: List[Tuple[str, object]] = []
        while True:
            kind, name, _ = self.take()
            if kind != "word":
                self.pos -= 1
                self.fail("expected a hint name")
            self.expect("=")
            value = self.primary()
            if not isinstance(value, ast.Static):
                self.fail("a hint's value is a literal")
            out.append((str(name), value.value))  # type: ignore[union-attr]
            if not self.at(","):
                break
            self.take()
        self.expect(")", " closing with(")
        return tuple(out)


def _token_text(kind: str, value: object) -> str:
    if kind == "attribute":
        return str(value)
    if kind == "string":
        return '"' + str(value) + '"'
    return str(value)


def _static_value(expr: ast.Field) -> object:
    return expr.value if isinstance(expr, ast.Static) else None


def parse_query(text: str) -> Query:
    """Any TraceQL query hotspan runs: spanset filters with every operator, ``&&``/``||``
    between spansets, structural operators, pipelines (``by``, ``select``, ``coalesce``,
    aggregates) and a metrics function at the end.  QueryError says what is wrong, and where."""
    if len(text) > 100_000:
        raise QueryError("TraceQL: the query is longer than 100000 characters")
    try:
        root, metrics, hints = _Parser(text).query()
        _check_size(root, metrics)
        _check_types(root)
        selection = metrics.compare_filter if metrics is not None else None
        if selection is not None:
            _check_types(ast.Filter(selection))
        plan = check(root, () if selection is None else (selection,))
    except RecursionError:
        raise QueryError("TraceQL: the query is nested too deeply") from None
    simple = None
    if metrics is None:
        try:
            simple = parse_traceql(text)
        except QueryError:
            simple = None
    return Query(
        text=text,
        simple=simple,
        pushdown=_pushdown(root),
        needs_traces=_needs_traces(root)
        or (selection is not None and field_needs_trace(selection)),
        metrics=metrics,
        root=root,
        shown=_shown(root),
        hints=hints,
        plan=plan,
        needs_raw=any(reads_raw(n) for n in _walk(root)),
    )


# A query's work is about its size times the spans it reads: bound the size (Tempo's queries,
# Grafana's and Traces Drilldown's included, are a few dozen nodes).
MAX_QUERY_NODES = 1024
MAX_PIPELINE_STAGES = 32


def _check_size(root: ast.Element, metrics: Optional[MetricsStage]) -> None:
    nodes = _walk(root)
    if metrics is not None and metrics.compare_filter is not None:
        nodes += _walk(metrics.compare_filter)
    if len(nodes) > MAX_QUERY_NODES:
        raise QueryError(
            f"TraceQL: the query has {len(nodes)} parts, more than the {MAX_QUERY_NODES} "
            "hotspan runs: split it or simplify it"
        )
    stages = sum(len(n.stages) for n in nodes if isinstance(n, ast.Pipeline))
    if stages > MAX_PIPELINE_STAGES:
        raise QueryError(
            f"TraceQL: the query has {stages} pipeline stages, more than the "
            f"{MAX_PIPELINE_STAGES} hotspan runs"
        )


# The type of each intrinsic's values, for refusing comparisons that can never be true.
_INTRINSIC_TYPES = {
    "name": "string",
    "rootName": "string",
    "rootServiceName": "string",
    "span:id": "string",
    "span:parentID": "string",
    "trace:id": "string",
    "status": "status",
    "kind": "kind",
    "duration": "duration",
    "traceDuration": "duration",
    "childCount": "number",
    "statusMessage": "string",
    "event:name": "string",
    "event:timeSinceStart": "duration",
    "link:spanID": "string",
    "link:traceID": "string",
    "instrumentation:name": "string",
    "instrumentation:version": "string",
    "nestedSetParent": "number",
    "nestedSetLeft": "number",
    "nestedSetRight": "number",
}


def _static_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, ast.Status):
        return "status"
    if isinstance(value, ast.Kind):
        return "kind"
    if isinstance(value, str):
        return "string"
    return "duration" if isinstance(value, ast.Duration) else "number"


def _check_types(root: ast.Element) -> None:
    """Refuse a comparison of an intrinsic with a value of another type (``name = 5``,
    ``duration > "long"``), as Tempo does when it reads the query."""
    for node in _walk(root):
        if not isinstance(node, ast.Binary) or node.op not in _COMPARISONS:
            continue
        for attr, static in ((node.lhs, node.rhs), (node.rhs, node.lhs)):
            if not isinstance(attr, ast.Attribute) or not isinstance(static, ast.Static):
                continue
            want = _INTRINSIC_TYPES.get(attr.name) if attr.scope == "intrinsic" else None
            got = _static_type(static.value)
            if want is None or want == got or (want, got) == ("duration", "number"):
                continue  # a bare number for a duration: nanoseconds
            names = STATUS_CODES if want == "status" else SPAN_KINDS if want == "kind" else ()
            if got == "string" and static.value in names:
                continue  # status = "error": the name as a string, as the SQL search takes it
            example = {
                "string": f'{attr.text} = "text"',
                "number": f"{attr.text} > 1",
                "duration": f"{attr.text} > 100ms",
                "status": f"{attr.text} = error",
                "kind": f"{attr.text} = server",
            }[want]
            raise QueryError(
                f"TraceQL: {attr.text} is a {want}, it cannot compare with {static} "
                f"(as in {example})"
            )


def attribute_ref(text: str) -> ast.Attribute:
    """One identifier (``name``, ``span:duration``, ``resource.service.name``, ``.x``)."""
    parser = _Parser(text)
    attr = parser.attribute_ref()
    if parser.peek()[0] != "end":
        parser.fail(f"{text!r} is not one attribute or intrinsic")
    return attr


def _walk(node: object) -> List[object]:
    """Every node under ``node`` (itself included), depth first, in query order."""
    out = [node]
    if isinstance(node, ast.Pipeline):
        for stage in node.stages:
            out.extend(_walk(stage))
    elif isinstance(node, (ast.SpansetOp, ast.Binary)):
        out.extend(_walk(node.lhs))
        out.extend(_walk(node.rhs))
    elif isinstance(node, (ast.Filter, ast.GroupBy, ast.Unary)):
        out.extend(_walk(node.expr))
    elif isinstance(node, ast.ScalarFilter):
        out.extend(_walk(node.aggregate))
    elif isinstance(node, ast.Aggregate) and node.expr is not None:
        out.extend(_walk(node.expr))
    elif isinstance(node, ast.Select):
        out.extend(node.attributes)
    return out


def _needs_traces(root: ast.Element) -> bool:
    """Whether the query reads more of a trace than the spans its first filter finds."""
    root_tests = set()
    for node in _walk(root):
        if isinstance(node, (ast.SpansetOp, ast.ScalarFilter)):
            return True
        if isinstance(node, ast.Binary) and root_test(node) is not None:
            # nestedSetParent<0 asks only whether the span is a root: the span itself says.
            root_tests.add(id(node.lhs if isinstance(node.lhs, ast.Attribute) else node.rhs))
        elif (
            isinstance(node, ast.Attribute)
            and node.name in TRACE_WIDE
            and id(node) not in root_tests
        ):
            return True
    return False


def _shown(root: ast.Element) -> Tuple[ast.Attribute, ...]:
    seen: Dict[Tuple[str, str], ast.Attribute] = {}
    for node in _walk(root):
        if isinstance(node, ast.Attribute) and node.name not in _NOT_SHOWN:
            seen.setdefault((node.scope, node.name), node)
    return tuple(seen.values())


def _pushdown(node: ast.Element) -> Tuple[Condition, ...]:
    """Conditions every span the query starts from meets: the first stage's, through spanset
    operators that need both sides (then the side with more conditions), and what both sides
    of ``||`` share."""
    options = _pushdown_options(node)
    return max(options, key=len) if options else ()


_MAX_OPTIONS = 16


def _pushdown_options(node: ast.Element) -> List[Tuple[Condition, ...]]:
    """Alternative pushdowns, each met by a span of every trace the query finds (the right
    side's first, so that a tie keeps it).  Operators that need both sides have both sides'
    alternatives, so that ``||`` can pick the one it shares with its other side: Traces
    Drilldown's ``({root} &>> {kind = server}) || ({root})`` starts from root spans."""
    if isinstance(node, ast.Pipeline):
        return _pushdown_options(node.stages[0]) if node.stages else []
    if isinstance(node, ast.Filter):
        conds = (_condition_of(e) for e in conjuncts(node.expr))
        return [tuple(c for c in conds if c is not None)]
    if not isinstance(node, ast.SpansetOp):
        return []
    rhs = _pushdown_options(node.rhs)
    if node.op.startswith("!"):  # the right side's spans without a relation to the left's
        return rhs
    lhs = _pushdown_options(node.lhs)
    if node.op != "||":
        return (rhs + lhs)[:_MAX_OPTIONS]
    shared = [tuple(c for c in b if c in a) for b in rhs for a in lhs]
    shared.sort(key=len, reverse=True)
    return shared[:_MAX_OPTIONS]


def _condition_of(expr: ast.Field) -> Optional[Condition]:
    """``expr`` as a condition the stores filter spans on, if it is one exactly."""
    if not isinstance(expr, ast.Binary) or expr.op not in OPERATORS:
        return None
    root = root_test(expr)
    if root is not None:
        if root == (True, False):
            return ROOT_CONDITION
        return NOT_ROOT_CONDITION if root == (False, True) else None
    attr, static, op = expr.lhs, expr.rhs, expr.op
    if isinstance(attr, ast.Static) and isinstance(static, ast.Attribute):
        attr, static = static, attr
        op = {">": "<", "<": ">", ">=": "<=", "<=": ">="}.get(op, op)
        if op in ("=~", "!~"):
            return None
    if not isinstance(attr, ast.Attribute) or not isinstance(static, ast.Static):
        return None
    value = static.value
    if attr.scope in ("span", "resource", ""):
        key = f"{attr.scope}.{attr.name}" if attr.scope else f".{attr.name}"
        if isinstance(value, bool):
            return Condition(key, op, value) if op in ("=", "!=") else None
        if isinstance(value, (ast.Status, ast.Kind, ast.Nil)):
            return None
        if op in ("=~", "!~") and not isinstance(value, str):
            return None
        if isinstance(value, (str, int, float)):
            return Condition(key, op, int(value) if isinstance(value, ast.Duration) else value)
        return None
    if attr.scope != "intrinsic" or attr.name in RAW_ONLY:
        return _raw_condition(attr, op, value)
    name = attr.name
    if name == "name" and isinstance(value, str) and not isinstance(value, (ast.Status, ast.Kind)):
        return Condition("name", op, str(value))
    if name == "status" and isinstance(value, ast.Status) and op in ("=", "!="):
        return Condition("status", op, str(value))
    if name == "kind" and isinstance(value, ast.Kind) and op in ("=", "!="):
        return Condition("kind", op, str(value))
    if name == "duration" and isinstance(value, int) and not isinstance(value, bool):
        if op in ("=~", "!~"):
            return None
        return Condition("duration", op, int(value))
    return None


def _raw_condition(attr: ast.Attribute, op: str, value: object) -> Optional[Condition]:
    """For what only the stored OTLP message holds (``event:name = "exception"``): bytes the
    span's message (``raw:span``) or its scope's (``raw:scope``) must contain, in hex, for
    the stores to narrow the spans the engine reads (it decides)."""
    if op != "=" or not isinstance(value, str) or isinstance(value, (ast.Status, ast.Kind)):
        return None
    needle = value.encode()
    if attr.name in ("link:traceID", "link:spanID"):
        digits = 32 if attr.name == "link:traceID" else 16
        if not re.fullmatch(f"[0-9a-fA-F]{{{digits}}}", value):
            return None
        needle = bytes.fromhex(value)
    if not needle:
        return None
    scoped = attr.scope == "instrumentation" or attr.name.startswith("instrumentation:")
    return Condition("raw:scope" if scoped else "raw:span", "=", needle.hex().upper())


# The evaluator, re-exported: ``query.traceql`` is where callers find the whole language.
from hotspan.query.traceql_eval import (  # noqa: E402
    NOT_ROOT_CONDITION,
    RAW_ONLY,
    ROOT_CONDITION,
    TRACE_WIDE,
    Spanset,
    check,
    conjuncts,
    evaluate,
    field_needs_trace,
    in_selection,
    matches,
    reads_raw,
    root_test,
    span_value,
)

__all__ = [
    "INTRINSICS",
    "attribute_ref",
    "METRICS_FUNCTIONS",
    "MetricsStage",
    "Query",
    "Spanset",
    "evaluate",
    "field_needs_trace",
    "in_selection",
    "legacy_query",
    "matches",
    "parse_duration",
    "parse_logfmt",
    "parse_query",
    "parse_traceql",
    "span_value",
]
