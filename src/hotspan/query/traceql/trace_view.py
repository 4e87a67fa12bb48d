"""One trace's spans as TraceQL's engine sees them: their relations (parent, children,
Tempo's nested set numbering), each computed once, when a query first needs it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hotspan.model.trace import (
    SpanRecord,
)
from hotspan.query.traceql import ast

Value = ast.Value
Getter = Callable[[SpanRecord, "TraceView"], object]


class TraceView:
    """One trace's spans with their relations, each computed once, when first needed (a
    filter reads none of them); ``raw``: the stored spans (``StoredSpan``, by span id) for
    what only the OTLP message says (status message, events, links, scope)."""

    def __init__(self, spans: Iterable[SpanRecord], raw: Optional[Dict[int, Any]] = None) -> None:
        self.raw = raw or {}
        self._messages: Dict[int, Optional[Span]] = {}
        self._scopes: Dict[bytes, InstrumentationScope] = {}
        by_id: Dict[int, SpanRecord] = {}
        for span in spans:
            by_id.setdefault(span.span_id, span)
        self.spans = sorted(by_id.values(), key=lambda s: (s.start_ns, s.span_id))
        self.by_id = by_id
        self.filtered: Dict[int, Dict[int, bool]] = {}  # id(filter) -> span id -> kept
        self.plan: Dict[int, Getter] = {}  # id(expression) -> compiled, of the query
        self._nested: Optional[Dict[int, Tuple[int, int, int]]] = None

    @functools.cached_property
    def children(self) -> Dict[int, List[SpanRecord]]:
        out: Dict[int, List[SpanRecord]] = {}
        for span in self.spans:
            if span.parent_span_id in self.by_id and span.parent_span_id != span.span_id:
                out.setdefault(span.parent_span_id, []).append(span)
        return out

    @functools.cached_property
    def root(self) -> Optional[SpanRecord]:
        # The span without a parent, else the earliest (its parent never arrived), as the
        # SQL search picks it.
        first = self.spans[0] if self.spans else None
        return next((s for s in self.spans if s.parent_span_id == 0), first)

    @functools.cached_property
    def start_ns(self) -> int:
        return min((s.start_ns for s in self.spans), default=0)

    @functools.cached_property
    def end_ns(self) -> int:
        return max((s.end_ns for s in self.spans), default=0)

    def message(self, span: SpanRecord) -> Optional[Span]:
        """The span's OTLP message, when the trace came with its stored spans."""
        if span.span_id not in self._messages:
            stored = self.raw.get(span.span_id)
            message = None
            if stored is not None:
                try:
                    message = Span.FromString(stored.raw)
                except DecodeError:
                    message = None  # what no OTLP ingest stores: as a span without them
            self._messages[span.span_id] = message
        return self._messages[span.span_id]

    def scope(self, span: SpanRecord) -> Optional[InstrumentationScope]:
        """The instrumentation scope of the span, when the trace came with its stored spans."""
        stored = self.raw.get(span.span_id)
        if stored is None:
            return None
        data = stored.group.scope
        scope = self._scopes.get(data)
        if scope is None:
            try:
                scope = InstrumentationScope.FromString(data)
            except DecodeError:
                scope = InstrumentationScope()
            self._scopes[data] = scope
        return scope

    def nested(self, span: SpanRecord) -> Tuple[int, int, int]:
        """(nestedSetLeft, nestedSetRight, nestedSetParent) of a span, numbered once."""
        if self._nested is None:
            self._nested = nested_set(self.spans)
        return self._nested.get(span.span_id, (0, 0, 0))

    def parent(self, span: SpanRecord) -> Optional[SpanRecord]:
        if span.parent_span_id == span.span_id:
            return None
        return self.by_id.get(span.parent_span_id) if span.parent_span_id else None

    def ancestors(self, span: SpanRecord) -> Iterable[SpanRecord]:
        seen = {span.span_id}
        parent = self.parent(span)
        while parent is not None and parent.span_id not in seen:
            yield parent
            seen.add(parent.span_id)
            parent = self.parent(parent)


def nested_set(spans: Sequence[SpanRecord]) -> Dict[int, Tuple[int, int, int]]:
    """Tempo's nested set model of a trace: span id -> (left, right, parent).  Walking depth
    first from each root (a span without a parent), a span's left is numbered on the way
    down and its right on the way up, one counter for the trace, from 1; its parent is its
    parent's left, -1 for a root.  Spans not under a root keep (0, 0, 0), as in Tempo.
    Siblings go in start order (Tempo takes them in the order it stored them)."""
    ordered = sorted(spans, key=lambda s: (s.start_ns, s.span_id))
    ids = {s.span_id for s in ordered}
    children: Dict[int, List[SpanRecord]] = {}
    for s in ordered:
        if s.parent_span_id and s.parent_span_id in ids and s.parent_span_id != s.span_id:
            children.setdefault(s.parent_span_id, []).append(s)
    out: Dict[int, Tuple[int, int, int]] = {}
    bound = 1
    for root in ordered:
        if root.parent_span_id != 0 or root.span_id in out:
            continue
        # An explicit stack (a trace may be thousands of spans deep): (span, its parent's
        # left, its left, index of the next child to visit).
        left = bound
        bound += 1
        stack: List[List[Any]] = [[root, _NESTED_SET_ROOT, left, 0]]
        out[root.span_id] = (left, 0, _NESTED_SET_ROOT)
        while stack:
            top = stack[-1]
            kids = children.get(top[0].span_id, ())
            if top[3] < len(kids):
                child = kids[top[3]]
                top[3] += 1
                if child.span_id in out:
                    continue  # a cycle of parent ids
                out[child.span_id] = (bound, 0, top[2])
                stack.append([child, top[2], bound, 0])
                bound += 1
            else:
                out[top[0].span_id] = (top[2], bound, top[1])
                bound += 1
                stack.pop()
    return out


_NESTED_SET_ROOT = -1  # Tempo's nestedSetParent of a root span


def root_test(expr: ast.Field) -> Optional[Tuple[bool, bool]]:
    """For ``nestedSetParent op N`` (or ``N op nestedSetParent``) whose truth depends only on
    whether the span is a root (``nestedSetParent<0``, ``=-1``, ``>=0``): (its truth for a
    root, for any other span).  A root's nestedSetParent is -1, another span's is 0 (cut off
    from the roots) or its parent's nestedSetLeft (positive): = and != with a negative
    number, and orderings that 0 and a huge number answer alike (they are monotonic)."""
    if not isinstance(expr, ast.Binary) or expr.op not in ("=", "!=", "<", "<=", ">", ">="):
        return None
    attr, static, op = expr.lhs, expr.rhs, expr.op
    if isinstance(attr, ast.Static):
        attr, static = static, attr
        op = {">": "<", "<": ">", ">=": "<=", "<=": ">="}.get(op, op)
    if not (
        isinstance(attr, ast.Attribute)
        and attr.scope == "intrinsic"
        and attr.name == "nestedSetParent"
        and isinstance(static, ast.Static)
        and isinstance(static.value, (int, float))
        and not isinstance(static.value, (bool, ast.Duration))
    ):
        return None
    n = static.value
    test = {
        "=": lambda v: v == n,
        "!=": lambda v: v != n,
        "<": lambda v: v < n,
        "<=": lambda v: v <= n,
        ">": lambda v: v > n,
        ">=": lambda v: v >= n,
    }[op]
    if op in ("=", "!=") and n >= 0:
        return None  # some non-root spans have the value, others not
    if test(0) != test(2**62):
        return None
    return test(_NESTED_SET_ROOT), test(0)


def nested_parent(s: SpanRecord, t: TraceView) -> object:
    # A root's is known without the rest of its trace (the root test nestedSetParent<0 runs
    # on spans read alone); another span's needs the trace (trace-wide).
    return _NESTED_SET_ROOT if s.parent_span_id == 0 else t.nested(s)[2]
