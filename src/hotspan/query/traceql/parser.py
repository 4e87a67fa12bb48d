"""TraceQL's grammar: a query's text into its syntax tree (``ast``).

``parse_tree`` reads TraceQL as Tempo's grammar does (``pkg/traceql/expr.y``): ``&&`` and
``||`` share the lowest precedence and associate left, both between spansets and inside a
filter; structural operators bind tighter than ``&&``/``||``; ``|`` chains pipeline stages,
the last of which may be a metrics function (:class:`MetricsStage`).  It bounds the query's
size (``MAX_QUERY_NODES``, ``MAX_PIPELINE_STAGES``) and refuses comparisons of types that
can never be equal, as Tempo does.  ``attribute_ref`` reads one identifier.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

from hotspan.model.trace import (
    SPAN_KINDS,
    STATUS_CODES,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.lexer import TokenReader
from hotspan.query.traceql.names import (
    INTRINSIC_TYPES,
    INTRINSICS,
    KNOWN_ELSEWHERE,
    NUMERIC_INTRINSICS,
)
from hotspan.query.traceql.validate import static_type, validate

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


class _Parser(TokenReader):
    # -- the query --

    def query(self) -> Tuple[ast.Element, Optional[MetricsStage], Tuple[Tuple[str, object], ...]]:
        if self.peek()[0] == "end":
            self.fail("expected a query such as { }")
        if self.at("coalesce"):
            self.fail("coalesce() goes after a spanset, such as { } | coalesce()")
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
            if isinstance(expr, ast.Attribute) and expr.scope == "intrinsic":
                # (An attribute alone may hold a boolean; no intrinsic does.)
                raise QueryError(
                    f"TraceQL: {{ {expr} }} is not a condition: compare it, as {{ {expr} = ... }}"
                )
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
        lhs = self.scalar_side()
        kind, op, _ = self.peek()
        if kind != "op" or op not in ("=", "!=", "<", "<=", ">", ">="):
            if kind == "op" and op in ("+", "-", "*", "/", "%", "^"):
                self.fail("arithmetic on aggregates is not supported")
            self.fail("expected a comparison (= != < <= > >=) after the aggregate")
        self.take()
        rhs = self.scalar_side()
        if isinstance(lhs, ast.Aggregate) and not isinstance(rhs, ast.Aggregate):
            return ast.ScalarFilter(str(op), lhs, rhs)
        if isinstance(rhs, ast.Aggregate) and not isinstance(lhs, ast.Aggregate):
            return ast.ScalarFilter(str(op), rhs, lhs, flipped=True)
        raise QueryError(
            "TraceQL: a scalar filter compares one aggregate with a number or duration"
        )

    def scalar_side(self, level: int = 0) -> object:
        """An aggregate, or a number: arithmetic of numbers is computed as it is read
        (``count() > 2 * 3``, as Tempo folds it); arithmetic on an aggregate is refused by
        the caller."""
        if level == 2:
            return self.scalar_operand()
        lhs = self.scalar_side(level + 1)
        ops = ("+", "-") if level == 0 else ("*", "/")
        while self.at(*ops) and not isinstance(lhs, ast.Aggregate):
            op = str(self.take()[1])
            rhs = self.scalar_side(level + 1)
            if isinstance(rhs, ast.Aggregate):
                self.fail("arithmetic on aggregates is not supported")
            lhs = fold_numbers(op, lhs, rhs)  # type: ignore[arg-type]
        return lhs

    def scalar_operand(self) -> object:
        if self.at("("):
            self.take()
            inner = self.scalar_side()
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
            _numeric(expr, f"{value}()")
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
                if _static_value(lhs) is ast.NIL:  # nil = nil, nil != nil: false, as in Tempo
                    lhs = ast.Static(False)
                    continue
                lhs = ast.Unary("missing" if op == "=" else "exists", lhs)
                continue
            rhs = self.field(level + 1)
            if isinstance(lhs, ast.Static) and lhs.value is ast.NIL and op in ("=", "!="):
                lhs = ast.Unary("missing" if op == "=" else "exists", rhs)
                continue
            if ast.NIL in (_static_value(lhs), _static_value(rhs)):
                raise QueryError("TraceQL: nil compares only with = and != (x = nil, x != nil)")
            kinds = {_static_kind(lhs), _static_kind(rhs)}
            if kinds == {"string", "number"}:
                raise QueryError(f"TraceQL: {lhs} {op} {rhs} compares a string with a number")
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
                return ast.Static(type(value)(-value))
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
            if name in KNOWN_ELSEWHERE:
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
        if kind == "word" and value in KNOWN_ELSEWHERE:
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
            read = self.attribute_ref()
            _numeric(read, f"{function}()")
            attribute = read.text
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
            out.append((str(name), value.value))
            if not self.at(","):
                break
            self.take()
        self.expect(")", " closing with(")
        return tuple(out)


def fold_numbers(op: str, a: Union[int, float], b: Union[int, float]) -> Union[int, float]:
    """``a op b`` for numbers written in a query, as Tempo computes them: integers stay
    integers (division truncates toward zero; by zero, an error), durations stay durations."""
    if op == "+":
        out: Union[int, float] = a + b
    elif op == "-":
        out = a - b
    elif op == "*":
        out = a * b
    elif b == 0 and isinstance(a, int) and isinstance(b, int):
        raise QueryError("TraceQL: division by zero")
    elif b == 0:  # a float: IEEE's infinity (NaN for 0 / 0), as Go computes it
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    elif isinstance(a, int) and isinstance(b, int):
        quotient = abs(a) // abs(b)
        out = quotient if (a < 0) == (b < 0) else -quotient
    else:
        out = a / b
    if isinstance(out, int) and not -(1 << 63) <= out < 1 << 63:
        raise QueryError(f"TraceQL: {a} {op} {b} is past a 64-bit integer")
    if isinstance(a, ast.Duration) and isinstance(b, ast.Duration) and op in ("+", "-"):
        return ast.Duration(int(out))
    return out


def _static_value(expr: ast.Field) -> object:
    return expr.value if isinstance(expr, ast.Static) else None


def _static_kind(field: ast.Field) -> Optional[str]:
    """ "string" or "number" for a literal of that kind, else None."""
    if not isinstance(field, ast.Static) or isinstance(field.value, bool):
        return None
    if isinstance(field.value, str):
        return "string"
    if isinstance(field.value, (int, float)):
        return "number"
    return None


def _numeric(field: ast.Field, where: str) -> None:
    """QueryError when ``field`` is an intrinsic that is no number (name, status, ...)."""
    if (
        isinstance(field, ast.Attribute)
        and field.scope == "intrinsic"
        and field.name not in NUMERIC_INTRINSICS
    ):
        raise QueryError(f"TraceQL: {where} reads a number; {field} is not one")


# A query's work is about its size times the spans it reads: bound the size (Tempo's queries,
# Grafana's and Traces Drilldown's included, are a few dozen nodes).
MAX_QUERY_NODES = 1024
MAX_PIPELINE_STAGES = 32
# Each attribute (not intrinsic) a query names is a text search in its SQL statement, and
# DuckDB's planning of those grows with their square: 250 in one spanset took it 5 s on a
# store of 72 spans, 64 about 0.2 s.
MAX_QUERY_ATTRIBUTES = 64


def _check_size(root: ast.Element, metrics: Optional[MetricsStage]) -> None:
    nodes = ast.walk(root)
    if metrics is not None and metrics.compare_filter is not None:
        nodes += ast.walk(metrics.compare_filter)
    if len(nodes) > MAX_QUERY_NODES:
        raise QueryError(
            f"TraceQL: the query has {len(nodes)} parts, more than the {MAX_QUERY_NODES} "
            "hotspan runs: split it or simplify it"
        )
    attributes = sum(1 for n in nodes if isinstance(n, ast.Attribute) and n.scope != "intrinsic")
    if attributes > MAX_QUERY_ATTRIBUTES:
        raise QueryError(
            f"TraceQL: the query names {attributes} attributes, more than the "
            f"{MAX_QUERY_ATTRIBUTES} hotspan runs: split it or simplify it"
        )
    stages = sum(len(n.stages) for n in nodes if isinstance(n, ast.Pipeline))
    if stages > MAX_PIPELINE_STAGES:
        raise QueryError(
            f"TraceQL: the query has {stages} pipeline stages, more than the "
            f"{MAX_PIPELINE_STAGES} hotspan runs"
        )


def _check_types(root: ast.Element) -> None:
    """Refuse a comparison of an intrinsic with a value of another type (``name = 5``,
    ``duration > "long"``), as Tempo does when it reads the query."""
    for node in ast.walk(root):
        if not isinstance(node, ast.Binary) or node.op not in _COMPARISONS:
            continue
        for attr, static in ((node.lhs, node.rhs), (node.rhs, node.lhs)):
            if not isinstance(attr, ast.Attribute) or not isinstance(static, ast.Static):
                continue
            want = INTRINSIC_TYPES.get(attr.name) if attr.scope == "intrinsic" else None
            got = static_type(static.value)
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


def parse_tree(
    text: str,
) -> Tuple[ast.Element, Optional[MetricsStage], Tuple[Tuple[str, object], ...]]:
    """The syntax tree of a query, its metrics stage and its hints, within the size bounds
    and with comparisons of types that can match (QueryError otherwise; deep nesting raises
    RecursionError, which the caller turns into a message)."""
    root, metrics, hints = _Parser(text).query()
    _check_size(root, metrics)
    _check_types(root)
    validate(root)
    if metrics is not None and metrics.compare_filter is not None:
        _check_types(ast.Filter(metrics.compare_filter))
        validate(ast.Filter(metrics.compare_filter))
    return root, metrics, hints
