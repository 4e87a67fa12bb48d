"""A TraceQL query read and planned: :class:`Query`.

``parse_query`` parses the text (``parser``), compiles every field expression once
(``fields.check``), and works out what the stores can do for the engine: the conditions every
span the query starts from meets (``pushdown``, for ``store.span_records``), whether it needs
whole traces or the stored OTLP spans, the attributes a search result shows, and ``simple``,
the conjunctive form one SQL search answers (``search.parse_traceql``), when the query is
only that.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from hotspan.model.trace import (
    Condition,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.conditions import condition_of
from hotspan.query.traceql.fields import TRACE_WIDE, check, conjuncts, field_needs_trace, reads_raw
from hotspan.query.traceql.parser import MetricsStage, parse_tree
from hotspan.query.traceql.search import parse_traceql
from hotspan.query.traceql.trace_view import root_test


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
    # Every field expression of the query compiled, by id (see fields.check): kept here
    # so that evaluating the query, once per trace, compiles nothing.
    plan: Dict[int, Callable[..., object]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    # Whether it names what only the stored OTLP spans hold (statusMessage, event:name,
    # link:traceID, instrumentation:name, event.x...): search then reads them.
    needs_raw: bool = False


MAX_QUERY_TEXT = 100_000


def parse_query(text: str) -> Query:
    """Any TraceQL query hotspan runs: spanset filters with every operator, ``&&``/``||``
    between spansets, structural operators, pipelines (``by``, ``select``, ``coalesce``,
    aggregates) and a metrics function at the end.  QueryError says what is wrong, and where."""
    if len(text) > MAX_QUERY_TEXT:
        raise QueryError(f"TraceQL: the query is longer than {MAX_QUERY_TEXT} characters")
    try:
        root, metrics, hints = parse_tree(text)
        selection = metrics.compare_filter if metrics is not None else None
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
        needs_raw=any(reads_raw(n) for n in ast.walk(root)),
    )


# Intrinsics a search result does not repeat among a span's attributes (it has fields for
# them), as Tempo's asTraceSearchMetadata.
NOT_SHOWN = {
    "name",
    "duration",
    "traceDuration",
    "rootName",
    "rootServiceName",
    "trace:id",
    "span:id",
}


def _needs_traces(root: ast.Element) -> bool:
    """Whether the query reads more of a trace than the spans its first filter finds."""
    root_tests = set()
    for node in ast.walk(root):
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
    for node in ast.walk(root):
        if isinstance(node, ast.Attribute) and node.name not in NOT_SHOWN:
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
        conds = (condition_of(e) for e in conjuncts(node.expr))
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
