"""Arithmetic between TraceQL metrics queries, as Tempo 3 reads it:
``({ status = error } | rate()) / ({ } | rate())``, ``({} | rate()) * 100``,
``(({} | rate() by (resource.service.name)) * 60) > 10 | topk(5)``.

Each metrics query in parentheses (a fragment) runs as a query of its own (``run_metrics``:
in the store when it can), then their series are combined by Tempo's rules
(``ast_metrics_math.go``): a series of one side meets the series of the other side with the
same labels (the function's ``__name__`` aside), or the other side's only series when that one
has no labels; the labels of both are kept (the left's first) and the names combined
(``(rate / rate)``); a division by zero is no value.  A number applies to every value of a
series.  Numbers alone are computed as the query is read, integers as integers (``1 / 2`` is
0).  Filters of values (``> 10``) and ``| topk(n)`` apply to what is on their left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from hotspan.query.engine import QueryError
from hotspan.query.traceql.lexer import Lexer, Token, TokenReader
from hotspan.query.traceql.metrics import run_metrics
from hotspan.query.traceql.parser import METRICS_FUNCTIONS, fold_numbers
from hotspan.query.traceql.plan import MAX_QUERY_TEXT, Query, parse_query
from hotspan.query.traceql.series import (
    NAME_LABEL,
    Exemplar,
    Labels,
    MetricsRequest,
    MetricsResult,
    Series,
    filter_values,
    top_k,
)
from hotspan.store.base import Store

# Each fragment is a query over the stored spans of its own: a bound on what one request runs.
MAX_FRAGMENTS = 16
_FILTERS = ("=", "!=", "<", "<=", ">", ">=")
Number = Union[int, float]


@dataclass(frozen=True)
class Fragment:
    """A metrics query in parentheses."""

    query: Query


@dataclass(frozen=True)
class Scalar:
    value: Number


@dataclass(frozen=True)
class Arithmetic:
    op: str  # + - * /
    lhs: Node
    rhs: Node


@dataclass(frozen=True)
class Staged:
    """Filters of values and topk/bottomk after an expression, in order: (">", 10.0)..."""

    inner: Node
    stages: Tuple[Tuple[str, float], ...]


Node = Union[Fragment, Scalar, Arithmetic, Staged]


def parse_metrics_expression(text: str) -> Node:
    """A metrics query, or arithmetic between metrics queries in parentheses (QueryError,
    the plain query's when the text is not arithmetic)."""
    try:
        return Fragment(parse_query(text))
    except QueryError:
        if len(text) > MAX_QUERY_TEXT:
            raise
        tokens = Lexer(text).tokens
        # Arithmetic has a metrics query inside parentheses.
        if not any(d > 0 for d in _fragment_depths(tokens, 0, len(tokens) - 1)):
            raise
    try:
        return _Parser(text, tokens).parse()
    except RecursionError:
        raise QueryError("TraceQL: the query is nested too deeply") from None


def fragments(node: Node) -> List[Fragment]:
    """The metrics queries in an expression, in the order written."""
    if isinstance(node, Fragment):
        return [node]
    if isinstance(node, Arithmetic):
        return fragments(node.lhs) + fragments(node.rhs)
    if isinstance(node, Staged):
        return fragments(node.inner)
    return []


def _fragment_depths(tokens: Sequence[Token], start: int, end: int) -> List[int]:
    """The depths, in parentheses counted from ``start``, of each ``| <metrics function>`` in
    tokens [start, end)."""
    depths = []
    depth = 0
    for i in range(start, end):
        kind, value, _ = tokens[i]
        if kind == "op" and value == "(":
            depth += 1
        elif kind == "op" and value == ")":
            depth -= 1
        elif kind == "op" and value == "|":
            nxt = tokens[i + 1]
            if nxt[0] == "word" and nxt[1] in METRICS_FUNCTIONS:
                depths.append(depth)
    return depths


class _Parser(TokenReader):
    def __init__(self, text: str, tokens: List[Token]) -> None:
        super().__init__(text, tokens)
        self.count = 0

    def parse(self) -> Node:
        node = self.expression()
        if self.peek()[0] != "end":
            self.fail("expected an operator, a filter such as > 10, | topk(n) or the end")
        if not fragments(node):
            raise QueryError("TraceQL: arithmetic needs a metrics query in parentheses")
        return node

    def expression(self) -> Node:
        node = self.additive()
        stages: List[Tuple[str, float]] = []
        while True:
            if self.at(*_FILTERS):
                op = str(self.take()[1])
                stages.append((op, float(self.constant())))
            elif self.at("|") and self.at("topk", "bottomk", ahead=1):
                self.take()
                name = str(self.take()[1])
                self.expect("(", f" after {name}")
                kind, value, _ = self.peek()
                if kind != "int" or int(value) <= 0:  # type: ignore[call-overload]
                    self.fail(f"{name}() takes a positive integer")
                self.take()
                self.expect(")", f" closing {name}(")
                stages.append((name, int(value)))  # type: ignore[call-overload]
            else:
                break
        return Staged(node, tuple(stages)) if stages else node

    def constant(self) -> Number:
        """A number after a filter: arithmetic of numbers, a duration in seconds."""
        kind, value, _ = self.peek()
        if kind == "duration":
            self.take()
            return int(value) / 1e9  # type: ignore[call-overload]
        node = self.additive()
        if not isinstance(node, Scalar):
            self.fail("a filter compares with a number")
        return node.value

    def additive(self) -> Node:
        node = self.term()
        while self.at("+", "-"):
            op = str(self.take()[1])
            node = self._combine(op, node, self.term())
        return node

    def term(self) -> Node:
        node = self.unary()
        while self.at("*", "/"):
            op = str(self.take()[1])
            node = self._combine(op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.at("-"):
            self.take()
            inner = self.unary()
            if not isinstance(inner, Scalar):
                self.fail("a minus sign goes before a number, not a query")
            return Scalar(-inner.value)
        return self.primary()

    def primary(self) -> Node:
        kind, value, _ = self.peek()
        if kind in ("int", "float"):
            if kind == "int" and not -(1 << 63) <= int(value) < 1 << 63:  # type: ignore[call-overload]
                self.fail("an integer out of range")
            self.take()
            return Scalar(value)  # type: ignore[arg-type]
        if kind == "duration":
            self.fail("a duration is not a number to compute with")
        if not self.at("("):
            self.fail("expected a metrics query in parentheses, such as ({} | rate()), or a number")
        close = self._closing(self.pos)
        # One metrics query: its ``| rate()`` directly inside these parentheses.
        if 0 in _fragment_depths(self.tokens, self.pos + 1, close):
            start, end = self.tokens[self.pos + 1][2], self.tokens[close][2]
            query = parse_query(self.text[start:end])
            if query.metrics is None:
                self.fail("expected a metrics query, ending with a function such as rate()")
            if query.metrics.function == "compare":
                self.fail("compare() does not take part in arithmetic")
            self.count += 1
            if self.count > MAX_FRAGMENTS:
                raise QueryError(f"TraceQL: more than {MAX_FRAGMENTS} metrics queries in one")
            self.pos = close + 1
            return Fragment(query)
        self.take()
        node = self.expression()
        self.expect(")")
        return node

    def _closing(self, open_at: int) -> int:
        depth = 0
        for i in range(open_at, len(self.tokens)):
            kind, value, _ = self.tokens[i]
            if kind == "op" and value == "(":
                depth += 1
            elif kind == "op" and value == ")":
                depth -= 1
                if depth == 0:
                    return i
        self.fail("unbalanced '('")

    def _combine(self, op: str, lhs: Node, rhs: Node) -> Node:
        if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
            return Scalar(fold_numbers(op, lhs.value, rhs.value))
        return Arithmetic(op, lhs, rhs)


# -- running it ---------------------------------------------------------------------------------


Run = Callable[[Query], MetricsResult]


def run_metrics_expression(
    store: Store, tenant: str, node: Node, req: MetricsRequest, run: Optional[Run] = None
) -> MetricsResult:
    """The series of a metrics query or of arithmetic between metrics queries."""
    if run is None:

        def run(query: Query) -> MetricsResult:
            return run_metrics(store, tenant, query, req)

    results: List[MetricsResult] = []

    def fragment(query: Query) -> List[Series]:
        result = run(query)
        results.append(result)
        return result.series

    if isinstance(node, Fragment):
        return run(node.query)
    value = _evaluate(node, fragment)
    if not isinstance(value, list):
        raise QueryError("TraceQL: arithmetic needs a metrics query in parentheses")
    first = results[0]
    return MetricsResult(
        first.timestamps_ms,
        value,
        sum(r.inspected_spans for r in results),
        sum(r.inspected_traces for r in results),
        next((r.partial for r in results if r.partial), None),
    )


def _evaluate(node: Node, fragment: Callable[[Query], List[Series]]) -> Union[Number, List[Series]]:
    if isinstance(node, Fragment):
        return fragment(node.query)
    if isinstance(node, Scalar):
        return node.value
    if isinstance(node, Staged):
        series = _evaluate(node.inner, fragment)
        if not isinstance(series, list):
            raise QueryError("TraceQL: a filter or topk() applies to a metrics query")
        for name, arg in node.stages:
            if name in ("topk", "bottomk"):
                series = top_k(series, int(arg), largest=name == "topk")
            else:
                series = filter_values(series, name, arg)
        return series
    lhs, rhs = _evaluate(node.lhs, fragment), _evaluate(node.rhs, fragment)
    if isinstance(lhs, list) and isinstance(rhs, list):
        return _between(node.op, lhs, rhs)
    if isinstance(lhs, list):
        return [_with_scalar(node.op, s, float(rhs), left=False) for s in lhs]  # type: ignore[arg-type]
    if isinstance(rhs, list):
        return [_with_scalar(node.op, s, float(lhs), left=True) for s in rhs]
    return fold_numbers(node.op, lhs, rhs)


def _apply(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        return np.where(b == 0, np.nan, a / np.where(b == 0, 1, b))


def _value(op: str, a: float, b: float) -> float:
    return float(_apply(op, np.array([a]), np.array([b]))[0])


def _with_scalar(op: str, series: Series, number: float, left: bool) -> Series:
    values = np.asarray(series.values, dtype=float)
    scalar = np.full_like(values, number)
    computed = _apply(op, scalar, values) if left else _apply(op, values, scalar)
    exemplars = [
        Exemplar(
            e.labels,
            _value(op, number, e.value) if left else _value(op, e.value, number),
            e.timestamp_ms,
        )
        for e in series.exemplars
    ]
    return Series(series.labels, computed, exemplars)


def _key(labels: Labels) -> Labels:
    return tuple(label for label in labels if label[0] != NAME_LABEL)


def _between(op: str, lhs: List[Series], rhs: List[Series]) -> List[Series]:
    left: Dict[Labels, Series] = {_key(s.labels): s for s in lhs}
    right: Dict[Labels, Series] = {_key(s.labels): s for s in rhs}
    # The side whose series are matched: the right, unless it has one without labels.
    target = lhs if () in right else rhs
    out = []
    for s in target:
        key = _key(s.labels)
        l_series, l_fan = _match(left, key)
        r_series, r_fan = _match(right, key)
        if l_series is None or r_series is None:
            continue
        if l_fan == r_fan:
            exemplars = l_series.exemplars + r_series.exemplars
        else:
            exemplars = list(r_series.exemplars if l_fan else l_series.exemplars)
        values = _apply(
            op,
            np.asarray(l_series.values, dtype=float),
            np.asarray(r_series.values, dtype=float),
        )
        out.append(Series(_merged(op, l_series.labels, r_series.labels), values, exemplars))
    return out


def _match(side: Dict[Labels, Series], key: Labels) -> Tuple[Optional[Series], bool]:
    """The series with these labels, else the side's series without labels (True: fanned
    out to every series of the other side)."""
    found = side.get(key)
    if found is not None:
        return found, False
    return side.get(()), True


def _merged(op: str, lhs: Labels, rhs: Labels) -> Labels:
    names = {name for name, _ in lhs}
    out = list(lhs) + [(n, v) for n, v in rhs if n != NAME_LABEL and n not in names]
    left_name = dict(lhs).get(NAME_LABEL)
    right_name = dict(rhs).get(NAME_LABEL)
    if isinstance(left_name, str) and isinstance(right_name, str):
        combined = f"({left_name} {op} {right_name})"
        return tuple((n, combined if n == NAME_LABEL else v) for n, v in out)
    return tuple((n, v) for n, v in out if n != NAME_LABEL)
