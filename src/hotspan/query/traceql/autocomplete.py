"""Tag names and values of the spans a (partial) TraceQL query matches: Tempo's ``q=`` on
``/api/v2/search/tags`` and ``/api/v2/search/tag/<tag>/values``.

Grafana's editor sends the whole text being typed, so the query is often unfinished:
``{resource.service.name="api" && span.http.route=}``.  As Tempo does (its lenient parser),
a matcher with nothing after its operator is dropped, an unclosed brace is closed, and only
the part before the first pipe counts.  Tempo narrows with the conditions of the query's
first spanset filter; a query that still does not parse, a match-all (``{}``), several
spansets (``{a} && {b}``, structural operators) or a matcher dropped from an ``||`` all mean
no narrowing: the autocomplete falls back to every tag, as Tempo's does.  Where Tempo splits
an ``||`` inside the filter into groups and lists the union of what each group matches,
hotspan narrows by the conditions common to every group (TraceQL's pushdown): more values,
never fewer.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from hotspan.model.trace import (
    MAX_TAG_VALUE_LENGTH,
    SPAN_KINDS,
    STATUS_CODES,
    TRACE_INTRINSICS,
    Condition,
    SpanRecord,
    attribute_records,
    parse_attributes,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.plan import parse_query
from hotspan.query.traceql.search import parse_traceql

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<string>"(?:[^"\\]|\\.)*"?)
    | (?P<op>&&|\|\||!=|=~|!~|>=|<=|=|>|<|\{|\}|\(|\)|\|)
    | (?P<word>[^\s"&|!=~<>{}()]+)
    )""",
    re.VERBOSE,
)
_COMPARISONS = {"=", "!=", "=~", "!~", ">", ">=", "<", "<="}
_ENDS_MATCHER = {None, "}", ")", "&&", "||"}
_TRACE_KEYS = {*TRACE_INTRINSICS, "trace:duration", "trace:rootName", "trace:rootService"}


def _tokens(text: str) -> Tuple[List[str], bool]:
    """The tokens of ``text``, and whether they are all of it (False: a character none of
    them takes stopped the reading, such as those of ``~``, ``&>>``, ``!>``)."""
    out: List[str] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            return out, not text[pos:].strip()  # trailing blanks, or a stray character
        out.append(m.group(m.lastgroup or ""))
        pos = m.end()
    return out, True


def complete_query(text: str) -> Optional[str]:
    """The query with its unfinished matchers dropped and its brace closed, or None when what
    remains cannot narrow anything (a matcher dropped beside ``||`` matches every span)."""
    tokens, whole = _tokens(text)
    if "|" in tokens:
        tokens = tokens[: tokens.index("|")]
    elif not whole:
        # What was read is only the start of the query: the part before a structural
        # operator (``{a} ~ {b}``) would narrow to the spans of ``{a}``, where Tempo does not
        # narrow at all.
        return None
    kept: List[str] = []
    i = 0
    while i < len(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        after = tokens[i + 2] if i + 2 < len(tokens) else None
        is_attribute = tokens[i] not in _COMPARISONS and tokens[i] not in ("{", "}", "(", ")")
        if is_attribute and nxt in _COMPARISONS and after in _ENDS_MATCHER:
            if after == "||" or (kept and kept[-1] == "||"):
                return None
            if kept and kept[-1] == "&&":
                kept.pop()
            elif after == "&&":
                i += 1  # the connector after it goes with it
            i += 2
            continue
        kept.append(tokens[i])
        i += 1
    opened = kept.count("{") - kept.count("}")
    if opened < 0:
        return None
    return " ".join(kept + ["}"] * opened)


def narrowing_conditions(query: str) -> Optional[Tuple[Condition, ...]]:
    """The span conditions that narrow the autocomplete, or None for no narrowing."""
    if not query.strip():
        return None
    text = complete_query(query)
    if text is None:
        return None
    try:
        spansets, _ = parse_traceql(text)
    except QueryError:
        return _pushdown(text)
    # Several spansets: Tempo narrows only with a lone spanset filter.  Trace-wide conditions
    # (traceDuration, rootName) say nothing about which span a tag is on: not used.
    if len(spansets) != 1 or not spansets[0]:
        return None
    return spansets[0]


def _pushdown(text: str) -> Optional[Tuple[Condition, ...]]:
    """For a lone spanset filter beyond parse_traceql (``||``, parentheses, ``!``): the
    conditions every span it matches meets (parse_query's pushdown), so the autocomplete
    lists what those spans have: a superset of Tempo's narrowing, never less."""
    try:
        query = parse_query(text)
    except QueryError:
        return None
    if not isinstance(query.root, ast.Filter):
        return None  # structural operators, spanset || and &&: Tempo does not narrow
    conditions = tuple(c for c in query.pushdown if c.key not in _TRACE_KEYS)
    return conditions or None


class _Attributes:
    """Parsed attributes of span records; a resource's text is parsed once for its spans."""

    def __init__(self) -> None:
        self._resources: Dict[str, Dict[str, str]] = {}

    def span(self, record: SpanRecord) -> Dict[str, str]:
        return parse_attributes(record.attrs)

    def resource(self, record: SpanRecord) -> Dict[str, str]:
        parsed = self._resources.get(record.resource_attrs)
        if parsed is None:
            parsed = self._resources[record.resource_attrs] = parse_attributes(
                record.resource_attrs
            )
        return parsed


def tag_names(records: Iterable[SpanRecord]) -> Dict[str, List[str]]:
    """Attribute names of the spans, per scope (``span``, ``resource``), sorted."""
    attributes = _Attributes()
    span: Set[str] = set()
    resource: Set[str] = set()
    seen_resources: Set[str] = set()
    for record in records:
        span.update(attributes.span(record))
        if record.resource_attrs not in seen_resources:
            seen_resources.add(record.resource_attrs)
            resource.update(attributes.resource(record))
    return {"span": sorted(span), "resource": sorted(resource)}


def tag_values(records: Sequence[SpanRecord], scope: Optional[str], name: str) -> Set[str]:
    """Values the spans have for an attribute (of one scope, or either with None), or for an
    intrinsic (scope ``intrinsic``: name, status, kind); overlong values left out as the tag
    index leaves them out."""
    out: Set[str] = set()
    if scope == "intrinsic":
        for record in records:
            if name == "name":
                out.add(record.name)
            elif name == "status":
                out.add(STATUS_CODES[record.status_code])
            elif name == "kind":
                out.add(SPAN_KINDS[record.kind])
    else:
        # Every record of the key: an array attribute's elements are each a value.
        seen_resources: Set[str] = set()
        for record in records:
            if scope in (None, "span"):
                out.update(v for k, v in attribute_records(record.attrs) if k == name)
            if scope in (None, "resource") and record.resource_attrs not in seen_resources:
                seen_resources.add(record.resource_attrs)
                out.update(v for k, v in attribute_records(record.resource_attrs) if k == name)
    return {v for v in out if len(v) <= MAX_TAG_VALUE_LENGTH}
