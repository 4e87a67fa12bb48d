"""Spans: the columnar batch OTLP traces are turned into, and what trace queries return.

A span keeps its searchable fields as columns (ids, name, kind, service, times, status, and its
attributes flattened to one text) and the span message itself, as received, in ``raw``: the
trace API hands spans back exactly as they came in (typed attributes, events, links), while
search only ever reads the columns.  Spans of one resource and instrumentation scope share a
:class:`SpanGroup`, stored once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

# Separators of the flattened attribute text: a record separator before each pair and after
# the last, a unit separator between key and value.  ``contains(attrs, RS k US v RS)`` is then
# an exact match on one pair.  The separators are removed from keys and values first.
RS = "\x1e"
US = "\x1f"
# In place of US before a string value that reads as a number or a boolean ("200", "true"):
# TraceQL, as Tempo, never finds the string "200" with the int 200, nor the int with "200".
# Other values read as their type: a number's text is the number, "true" the boolean.
STRING_US = "\x1c"
_STRIP = str.maketrans({RS: " ", US: " ", STRING_US: " "})
# A number's text (RE2's syntax too: the SQL stores read it alike), or a boolean's.
NUMBER_PATTERN = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_TYPED_TEXT = re.compile(NUMBER_PATTERN + "|true|false")

# Tag values longer than this are searchable but not offered by the tag-values API.
MAX_TAG_VALUE_LENGTH = 200
# The tag index's scopes.  Besides span and resource attributes and the intrinsics, it holds
# those of events, links and instrumentation scopes.  A tag asked without a scope (``.x``,
# Tempo's version 1 API) is looked for where Tempo looks for it, and among the intrinsics
# (version 1's ``name``): not among events' and links' attributes.
TAG_SCOPES = ("span", "resource", "intrinsic", "event", "link", "instrumentation")
UNSCOPED_TAG_SCOPES = frozenset(("span", "resource", "instrumentation", "intrinsic"))

SPAN_KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
STATUS_CODES = ("unset", "ok", "error")


def clean(text: str) -> str:
    # The test first: translate() costs a microsecond per call, and it is called for every
    # attribute key and value of every span.
    if RS in text or US in text or STRING_US in text:
        return text.translate(_STRIP)
    return text


def reads_typed(text: str) -> bool:
    """Whether ``text`` reads as a number or a boolean (as an int, double or bool is written)."""
    return _TYPED_TEXT.fullmatch(text) is not None


def flatten_attributes(pairs: Iterable[Sequence[str]]) -> str:
    """``(key, value, type)`` pairs (or ``(key, value)``: typed as the text reads) as one
    searchable text (see :data:`RS` and :data:`STRING_US`)."""
    parts = []
    for p in pairs:
        value = clean(p[1])
        string = len(p) > 2 and p[2] == "string"
        sep = STRING_US if string and value[:1] in _TYPED_START and reads_typed(value) else US
        parts.append(f"{RS}{clean(p[0])}{sep}{value}")
    return "".join(parts) + RS if parts else ""


_TYPED_START = frozenset("0123456789+-.tf")


def attribute_pattern(key: str, value: str) -> str:
    """What a flattened text contains exactly when it has the string attribute ``key=value``."""
    value = clean(value)
    return f"{RS}{clean(key)}{STRING_US if reads_typed(value) else US}{value}{RS}"


def group_id(*parts: bytes) -> int:
    """Signed 64-bit content hash of a resource and scope (fits a BIGINT column)."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    value = int.from_bytes(h.digest(), "little")
    return value - (1 << 64) if value >= 1 << 63 else value


@dataclass(frozen=True)
class SpanGroup:
    """A resource and instrumentation scope, as received (serialized protobuf)."""

    service: str
    resource: bytes
    resource_schema_url: str
    scope: bytes
    scope_schema_url: str
    attrs: str  # the resource's attributes, flattened


class SpanWriteRow(NamedTuple):
    """A span as ingest writes it: one row of the spans table, its fields the table's columns.
    Its resource and scope are a ``group_id`` into :attr:`SpanBatch.groups`, written once per
    batch rather than once per span; reading a span back whole is :class:`StoredSpan`."""

    trace_id: str  # 32 lowercase hex digits
    span_id: int  # unsigned 64-bit
    parent_span_id: int  # 0: a root span
    name: str
    kind: int  # OTLP SpanKind number
    service: str
    start_ns: int
    end_ns: int
    status_code: int  # OTLP StatusCode number
    attrs: str  # the span's attributes, flattened
    group_id: int
    raw: bytes  # the OTLP Span message


@dataclass
class SpanBatch:
    """Spans of one export request with the groups they belong to."""

    rows: List[SpanWriteRow] = field(default_factory=list)
    groups: Dict[int, SpanGroup] = field(default_factory=dict)
    # (scope, key, value, type) -> latest end time of a span with it, for the tag APIs; scope
    # is one of TAG_SCOPES, type TraceQL's (string, int, float, bool, keyword).
    tags: Dict[Tuple[str, str, str, str], int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    def add_group(self, group: SpanGroup) -> int:
        gid = group_id(
            group.resource,
            group.resource_schema_url.encode(),
            group.scope,
            group.scope_schema_url.encode(),
        )
        self.groups.setdefault(gid, group)
        return gid

    def add_tags(self, scope: str, attrs: Iterable[Tuple[str, str, str]], seen_ns: int) -> None:
        """Record ``(key, value, type)`` attributes for the tag APIs."""
        tags = self.tags
        for key, value, kind in attrs:
            if len(value) <= MAX_TAG_VALUE_LENGTH:
                tag = (scope, key, value, kind)
                if tags.get(tag, 0) < seen_ns:
                    tags[tag] = seen_ns


@dataclass(frozen=True)
class StoredSpan:
    """A span as the store gives it back whole (a trace by id): its columns, its OTLP
    message and its group, looked up, so that the span can be sent back as OTLP.  Unlike
    :class:`SpanWriteRow` it carries no flattened attributes, which ``raw`` holds and no reader
    of a whole trace needs."""

    trace_id: str
    span_id: int
    parent_span_id: int
    name: str
    kind: int
    service: str
    start_ns: int
    end_ns: int
    status_code: int
    raw: bytes
    group: SpanGroup

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


class SpanRecord(NamedTuple):
    """A span as queries read it: its searchable columns with its own and its resource's
    attributes (flattened).  TraceQL's engine (``query.traceql``) reads them where SQL cannot
    answer, such as ``||``, structural operators, pipelines and metrics.  Aggregations over
    many spans (a service's requests, a span's baseline) read them without attributes
    (:meth:`outlines`).
    """

    trace_id: str  # 32 lowercase hex digits
    span_id: int  # unsigned 64-bit
    parent_span_id: int  # 0: a root span
    name: str
    kind: int  # OTLP SpanKind number
    service: str
    start_ns: int
    end_ns: int
    status_code: int  # OTLP StatusCode number
    attrs: str  # the span's attributes, flattened
    resource_attrs: str  # its resource's attributes, flattened

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @staticmethod
    def outlines(rows: Iterable[Sequence[Any]]) -> List[SpanRecord]:
        """Records from rows of (trace id, span id, parent span id, name, service, start,
        end, status code): the columns aggregations read.  The others are not read, so that
        such reads do not pay for attributes: ``kind`` is 0, ``attrs`` and ``resource_attrs``
        empty."""
        make = SpanRecord._make  # a tuple in, without keyword handling: the cheapest per span
        return [
            make((trace_id, span_id, parent, name, 0, service, start, end, status, "", ""))
            for trace_id, span_id, parent, name, service, start, end, status in rows
        ]


def attribute_records(flat: str) -> Iterator[Tuple[str, str]]:
    """The (key, value text) records of a flattened attribute text, in order: an array
    attribute has one for each element."""
    for record in flat.split(RS):
        if record:
            at = record.find(US)
            at = record.find(STRING_US) if at < 0 else at
            if at < 0:
                yield record, ""
            else:
                yield record[:at], record[at + 1 :]


def parse_attributes(flat: str) -> Dict[str, str]:
    """A flattened attribute text (:func:`flatten_attributes`) back to a dict (of an array,
    its last element)."""
    return dict(attribute_records(flat))


# Intrinsics that describe a whole trace rather than one span.
TRACE_INTRINSICS = ("traceDuration", "rootName", "rootServiceName")
OPERATORS = ("=", "!=", "=~", "!~", ">", ">=", "<", "<=")
# TraceQuery.order: "recent" (Tempo's order, the newest first), "duration" (the longest first).
TRACE_ORDERS = ("recent", "duration")


class SearchError(ValueError):
    """A search condition that cannot be evaluated (say, ``status > "fast"``)."""


@dataclass(frozen=True)
class Condition:
    """``key op value``.  Keys are TraceQL's: intrinsics (``name``, ``status``, ``kind``,
    ``duration``, and the trace-wide :data:`TRACE_INTRINSICS`), ``span.<attr>``,
    ``resource.<attr>``, or ``.<attr>`` (either).  Durations are nanoseconds."""

    key: str
    op: str
    value: Union[str, int, float]


@dataclass(frozen=True)
class TraceQuery:
    """Traces with, for each spanset, a span that started in the range and meets all of the
    spanset's conditions; and that meet the trace-wide conditions; in ``order``."""

    start_ns: int
    end_ns: int
    spansets: Tuple[Tuple[Condition, ...], ...] = ()
    trace_conditions: Tuple[Condition, ...] = ()
    limit: int = 20
    spans_per_trace: int = 3
    # Which traces come first and survive ``limit``: one of TRACE_ORDERS.
    order: str = "recent"


def condition_code(names: Tuple[str, ...], value: object, what: str) -> int:
    """A condition's status or kind as its OTLP number (given as a number or a name)."""
    if isinstance(value, int):
        return value
    if value in names:
        return names.index(str(value))
    raise SearchError(f"{what} must be one of {', '.join(names)}, not {value!r}")


def condition_span_id(value: object, key: str = "span:id") -> int:
    """A ``span:id`` (or ``key``: ``span:parentID``) condition's value as a number."""
    try:
        return int(str(value), 16)
    except ValueError:
        raise SearchError(f"{key} {value!r} is not hex") from None


def condition_text(key: str, value: object) -> str:
    """A condition's value that must be a string."""
    if not isinstance(value, str):
        raise SearchError(f'{key} compares with a string, such as {key}="value"')
    return value


@dataclass(frozen=True)
class MatchedSpan:
    """A span that met a search's conditions, as a trace's summary shows it."""

    span_id: int
    name: str
    start_ns: int
    duration_ns: int


@dataclass(frozen=True)
class TraceSummary:
    trace_id: str
    root_service: str
    root_name: str
    start_ns: int
    duration_ns: int
    span_count: int
    matched: Tuple[MatchedSpan, ...]
    matched_count: int
    # Per service of the trace: (service, its spans, those whose status is error).
    service_stats: Tuple[Tuple[str, int, int], ...] = ()

    @property
    def error_count(self) -> int:
        return sum(errors for _, _, errors in self.service_stats)

    @staticmethod
    def from_rows(rows: Iterable[Sequence[Any]], limit: Optional[int] = None) -> List[TraceSummary]:
        """Summaries from a search's rows, one per (trace, matched span shown): (trace id,
        root service, root name, start, end, span count, span id, span name, span start, span
        end, matched count, service stats), traces in order; the first ``limit`` traces.  The
        service stats are one text: "span id,error (1 or 0),service" per span, joined by RS."""
        found: Dict[str, list] = {}
        for row in rows:
            trace_id, service, name, t0, t1, count, span_id, span_name, start, end, n, stats = row
            entry = found.get(trace_id)
            if entry is None:
                if limit is not None and len(found) >= limit:
                    continue
                entry = found[trace_id] = [
                    trace_id,
                    service,
                    name,
                    t0,
                    t1 - t0,
                    count,
                    [],
                    n,
                    _service_stats(stats),
                ]
            entry[6].append(MatchedSpan(span_id, span_name, start, end - start))
        return [
            TraceSummary(tid, service, name, t0, duration, count, tuple(spans), n, stats)
            for tid, service, name, t0, duration, count, spans, n, stats in found.values()
        ]


def _service_stats(text: Optional[str]) -> Tuple[Tuple[str, int, int], ...]:
    """(service, spans, error spans) from the search's "span id,error,service" entries."""
    counts: Dict[str, List[int]] = {}
    for entry in (text or "").split(RS):
        span, _, rest = entry.partition(",")
        error, _, service = rest.partition(",")
        if span and error in ("0", "1"):
            figures = counts.setdefault(service, [0, 0])
            figures[0] += 1
            figures[1] += error == "1"
    return tuple(sorted((service, n, e) for service, (n, e) in counts.items()))
