"""TraceQL's engine: a parsed query run on the spans of one trace.

As in Tempo, a query is a pipeline of stages, each taking the trace's spansets to new ones:
the first input is one spanset holding every span of the trace; a filter ``{...}`` keeps the
spans it is true for, ``by()`` splits a spanset per value, aggregates (``count() > 2``) drop
spansets, and spanset operators (``&&``, ``||``, ``>``, ``>>``, ``<``, ``<<``, ``~``, their
negations and unions) combine what their two sides find in the same input.  Structural
operators return the right side's spans.  Each filter is evaluated once per span of a trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from hotspan.model.trace import (
    SpanRecord,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.fields import compare, compiled, to_number, to_truth
from hotspan.query.traceql.trace_view import TraceView

MULTIPLE_SPANSETS = (
    "TraceQL: spanset operators are not supported for multiple spansets per trace "
    "(by() made several): consider coalesce() before them"
)


@dataclass(frozen=True)
class Spanset:
    """Spans of one trace a query found, with what its pipeline says of them (``by(x)``'s
    value, aggregates), keyed as Tempo names them (``by(resource.service.name)``, ``count()``)."""

    spans: Tuple[SpanRecord, ...]
    attributes: Dict[str, object] = field(default_factory=dict)


# -- running a pipeline ---------------------------------------------------------------------------


def evaluate(
    query: object, spans: Sequence[SpanRecord], raw: Optional[Dict[int, Any]] = None
) -> List[Spanset]:
    """The spansets ``query`` (a ``Query``, or a bare syntax tree) finds among
    ``spans``: every span of one trace when the query needs whole traces, else any of them.
    ``raw``: the trace's stored spans by span id, for what only their OTLP messages hold
    (statusMessage, events, links, instrumentation scope; nil without them)."""
    if not spans:
        return []
    root = getattr(query, "root", query)
    trace = TraceView(spans, raw)
    trace.plan = getattr(query, "plan", None) or {}
    try:
        found = _run(root, [Spanset(tuple(trace.spans), {})], trace)  # type: ignore[arg-type]
    except RecursionError:
        raise QueryError("TraceQL: the query is nested too deeply") from None
    return [ss for ss in found if ss.spans]


def _run(node: ast.Element, spansets: List[Spanset], trace: TraceView) -> List[Spanset]:
    if isinstance(node, ast.Pipeline):
        for stage in node.stages:
            spansets = _run(stage, spansets, trace)
            if not spansets:
                break
        return spansets
    if isinstance(node, ast.Filter):
        return _filter(node, spansets, trace)
    if isinstance(node, ast.SpansetOp):
        return _spanset_op(node, spansets, trace)
    if isinstance(node, ast.ScalarFilter):
        return _scalar_filter(node, spansets, trace)
    if isinstance(node, ast.GroupBy):
        return _group(node, spansets, trace)
    if isinstance(node, ast.Coalesce):
        merged = _ordered(s for ss in spansets for s in ss.spans)
        return [Spanset(merged, {})] if merged else []
    if isinstance(node, ast.Select):
        return spansets
    raise QueryError(f"TraceQL: cannot run {type(node).__name__}")


def _ordered(spans: Iterable[SpanRecord]) -> Tuple[SpanRecord, ...]:
    unique = {s.span_id: s for s in spans}
    return tuple(sorted(unique.values(), key=lambda s: (s.start_ns, s.span_id)))


def _filter(node: ast.Filter, spansets: List[Spanset], trace: TraceView) -> List[Spanset]:
    test = compiled(node.expr, trace)
    done = trace.filtered.setdefault(id(node), {})
    out = []
    for ss in spansets:
        kept = []
        for span in ss.spans:
            hit = done.get(span.span_id)
            if hit is None:
                hit = done[span.span_id] = to_truth(test(span, trace)) is True
            if hit:
                kept.append(span)
        if kept:
            out.append(Spanset(tuple(kept), dict(ss.attributes)))
    return out


def _spanset_op(node: ast.SpansetOp, spansets: List[Spanset], trace: TraceView) -> List[Spanset]:
    out = []
    for ss in spansets:
        lhs = _run(node.lhs, [ss], trace)
        rhs = _run(node.rhs, [ss], trace)
        if node.op in ("&&", "||"):
            if (lhs and rhs) if node.op == "&&" else (lhs or rhs):
                spans = _ordered(s for part in (lhs, rhs) for x in part for s in x.spans)
                out.append(Spanset(spans, dict(ss.attributes)))
            continue
        if len(lhs) > 1 or len(rhs) > 1:
            raise QueryError(MULTIPLE_SPANSETS)
        if not rhs:
            continue
        left = lhs[0].spans if lhs else ()
        matched = _related(node.op, left, rhs[0].spans, trace)
        if matched:
            out.append(Spanset(_ordered(matched), dict(ss.attributes)))
    return out


def _related(
    op: str, left: Sequence[SpanRecord], right: Sequence[SpanRecord], trace: TraceView
) -> List[SpanRecord]:
    """The right side's spans in relation ``op`` with a left side's span (without one for
    ``!`` operators; with those left side's partners too for ``&`` ones).  Linear in the
    spans (times the depth for ``>>`` and ``<<``): a trace may have thousands of siblings."""
    relation = op.lstrip("!&")
    negate, union = op.startswith("!"), op.startswith("&")
    lset = {s.span_id for s in left}
    has = _relation_test(relation, left, lset, trace)
    matched = [r for r in right if has(r) != negate]
    if not union or not matched:
        return matched
    # The left spans on the other end of a relation with a matched span.
    mset = {r.span_id for r in matched}
    if relation == ">":
        partners = {r.parent_span_id for r in matched}
        return matched + [x for x in left if x.span_id in partners]
    if relation == "<":
        return matched + [x for x in left if x.parent_span_id in mset and trace.parent(x)]
    if relation == ">>":
        above: set = set()
        for r in matched:
            for a in trace.ancestors(r):
                if a.span_id in above:
                    break
                above.add(a.span_id)
        return matched + [x for x in left if x.span_id in above]
    if relation == "<<":
        below = _under(mset, trace)
        return matched + [x for x in left if below(x)]
    per_parent = _per_parent(matched, trace)  # ~
    return matched + [
        x
        for x in left
        if trace.parent(x) is not None
        and per_parent.get(x.parent_span_id, 0) - (x.span_id in mset) > 0
    ]


def _under(targets: set, trace: TraceView) -> Callable[[SpanRecord], bool]:
    """Whether a span has an ancestor among ``targets`` (span ids), each answer remembered
    for every span on the way up, so that a deep trace is walked once, not once per span."""
    known: Dict[int, bool] = {}

    def test(span: SpanRecord) -> bool:
        if span.span_id in known:
            return known[span.span_id]
        path = [span.span_id]
        seen = {span.span_id}
        parent = trace.parent(span)
        answer = False
        while parent is not None:
            if parent.span_id in targets:
                answer = True
                break
            if parent.span_id in known:
                answer = known[parent.span_id]
                break
            if parent.span_id in seen:
                break  # a cycle of parent ids
            path.append(parent.span_id)
            seen.add(parent.span_id)
            parent = trace.parent(parent)
        for span_id in path:
            known[span_id] = answer
        return answer

    return test


def _per_parent(spans: Iterable[SpanRecord], trace: TraceView) -> Dict[int, int]:
    out: Dict[int, int] = {}
    for x in spans:
        if trace.parent(x) is not None:
            out[x.parent_span_id] = out.get(x.parent_span_id, 0) + 1
    return out


def _relation_test(
    relation: str, left: Sequence[SpanRecord], lset: set, trace: TraceView
) -> Callable[[SpanRecord], bool]:
    """Whether a span is in ``relation`` with one of ``left`` (its span ids: ``lset``)."""
    if relation == ">":
        return lambda r: trace.parent(r) is not None and r.parent_span_id in lset
    if relation == "<":
        parents = {x.parent_span_id for x in left if trace.parent(x) is not None}
        return lambda r: r.span_id in parents
    if relation == ">>":
        return _under(lset, trace)
    if relation == "<<":
        above = set()
        for x in left:
            for a in trace.ancestors(x):
                if a.span_id in above:
                    break
                above.add(a.span_id)
        return lambda r: r.span_id in above
    per_parent = _per_parent(left, trace)  # ~: another child of the same parent
    return lambda r: (
        trace.parent(r) is not None
        and per_parent.get(r.parent_span_id, 0) - (r.span_id in lset) > 0
    )


def _group(node: ast.GroupBy, spansets: List[Spanset], trace: TraceView) -> List[Spanset]:
    get = compiled(node.expr, trace)
    label = str(node)
    out = []
    for ss in spansets:
        groups: Dict[object, List[SpanRecord]] = {}
        values: Dict[object, object] = {}
        for span in ss.spans:
            value = get(span, trace)
            key: object = (
                (type(value).__name__, value) if not isinstance(value, ast.Text) else ("str", value)
            )
            groups.setdefault(key, []).append(span)
            values.setdefault(key, value)
        for key, spans in groups.items():
            out.append(Spanset(tuple(spans), {**ss.attributes, label: values[key]}))
    return out


def _aggregate(agg: ast.Aggregate, spans: Sequence[SpanRecord], trace: TraceView) -> object:
    if agg.function == "count":
        return len(spans)
    get = compiled(agg.expr, trace)  # type: ignore[arg-type]
    values = []
    durations = True
    for span in spans:
        raw = get(span, trace)
        number = to_number(raw)
        if number is None:
            continue
        durations = durations and isinstance(raw, ast.Duration)
        values.append(number)
    if not values:
        return None
    if agg.function == "sum":
        out: object = sum(values)
    elif agg.function == "avg":
        out = sum(values) / len(values)
    elif agg.function == "min":
        out = min(values)
    else:
        out = max(values)
    return ast.Duration(int(out)) if durations else out  # type: ignore[call-overload]


def _scalar_filter(
    node: ast.ScalarFilter, spansets: List[Spanset], trace: TraceView
) -> List[Spanset]:
    label = str(node.aggregate)
    out = []
    for ss in spansets:
        value = _aggregate(node.aggregate, ss.spans, trace)
        if value is None:
            continue
        a, b = (node.value, value) if node.flipped else (value, node.value)
        if compare(node.op, a, b):
            out.append(Spanset(ss.spans, {**ss.attributes, label: value}))
    return out
