"""What Tempo refuses once a query is read, before it runs (its ``validate()``): expressions
whose types can never make sense, found from the types their parts imply.

A literal's type is its own; an intrinsic's is known (``name`` a string, ``status`` a status,
``duration`` a duration); an attribute's is not known until a span is read, so it goes with
anything.  A comparison is a boolean; arithmetic has its operands' type.  Refused, with the
reason: a filter that is no boolean (``{ 1 + 1 }``), operands of two types (``{ 1 != true }``),
an operator the type does not take (``{ status > ok }``, ``{ -name = "a" }``, ``{ !1 = 1 }``),
a span's intrinsic compared with nil (it is never absent), an aggregate of what is no number
or does not read the span (``sum(3)``), ``by()`` of a literal.
"""

from __future__ import annotations

from typing import Optional

from hotspan.model.trace import SPAN_KINDS, STATUS_CODES
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.names import INTRINSIC_TYPES, UNSEARCHED

ATTRIBUTE = "attribute"  # not known until a span is read
_BOOLEAN_OPS = frozenset(("&&", "||", "=", "!=", "<", "<=", ">", ">=", "=~", "!~"))
_NUMERIC = frozenset(("number", "duration"))
# Operators each type takes (Tempo's binaryTypeValid).
_TAKES = {
    "boolean": frozenset(("&&", "||", "=", "!=")),
    "number": frozenset(("+", "-", "*", "/", "%", "^", "=", "!=", ">", ">=", "<", "<=")),
    "string": frozenset(("=", "!=", "=~", "!~", ">", ">=", "<", "<=")),
    "nil": frozenset(("=", "!=")),
    "status": frozenset(("=", "!=")),
    "kind": frozenset(("=", "!=")),
}
_TAKES["duration"] = _TAKES["number"]


def static_type(value: object) -> str:
    """A literal's type: boolean, nil, status, kind, duration, string or number."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, ast.Nil):
        return "nil"
    if isinstance(value, ast.Status):
        return "status"
    if isinstance(value, ast.Kind):
        return "kind"
    if isinstance(value, ast.Duration):
        return "duration"
    return "string" if isinstance(value, str) else "number"


def implied_type(expr: ast.Field) -> str:
    """The type ``expr`` has whatever span it is read on, or :data:`ATTRIBUTE`."""
    if isinstance(expr, ast.Static):
        return static_type(expr.value)
    if isinstance(expr, ast.Attribute):
        if expr.scope == "intrinsic":
            return INTRINSIC_TYPES.get(expr.name, ATTRIBUTE)
        return ATTRIBUTE
    if isinstance(expr, ast.Unary):
        return "boolean" if expr.op in ("exists", "missing") else implied_type(expr.expr)
    if isinstance(expr, ast.Binary):
        if expr.op in _BOOLEAN_OPS:
            return "boolean"
        lhs = implied_type(expr.lhs)
        return lhs if lhs != ATTRIBUTE else implied_type(expr.rhs)
    return ATTRIBUTE


def _reads_span(expr: ast.Field) -> bool:
    return any(isinstance(n, ast.Attribute) for n in ast.walk(expr))


def _matching(a: str, b: str) -> bool:
    return ATTRIBUTE in (a, b) or a == b or (a in _NUMERIC and b in _NUMERIC) or "nil" in (a, b)


def _names_a_code(expr: ast.Field, op: str) -> bool:
    """A status's or a kind's name as a string literal, compared with = or !=: hotspan takes
    ``status = "error"`` (Tempo refuses it), as its own search sends it."""
    names = (*STATUS_CODES, *SPAN_KINDS)
    return (
        op in ("=", "!=")
        and isinstance(expr, ast.Static)
        and isinstance(expr.value, str)
        and expr.value in names
    )


def _check_binary(node: ast.Binary) -> None:
    lhs, rhs = implied_type(node.lhs), implied_type(node.rhs)
    if not _matching(lhs, rhs):
        codes = {"status", "kind"}
        lenient = (lhs in codes and rhs == "string" and _names_a_code(node.rhs, node.op)) or (
            rhs in codes and lhs == "string" and _names_a_code(node.lhs, node.op)
        )
        if not lenient:
            raise QueryError(
                f"TraceQL: {node.op} compares or combines two values of one type, not a {lhs} "
                f"and a {rhs}"
            )
        return
    for t in (lhs, rhs):
        if t != ATTRIBUTE and node.op not in _TAKES[t]:
            raise QueryError(f"TraceQL: a {t} does not take {node.op}")
    if node.op in ("=~", "!~") and (not isinstance(node.rhs, ast.Static) or rhs != "string"):
        raise QueryError(f"TraceQL: {node.op} takes a regular expression in quotes on its right")


def _check_unary(node: ast.Unary) -> None:
    if node.op == "missing" and isinstance(node.expr, ast.Attribute):
        # (What the stored OTLP span may lack, events and links, can be: hotspan takes
        # ``event:name = nil`` for a span without events, where Tempo refuses it.)
        if node.expr.scope == "intrinsic" and node.expr.name not in UNSEARCHED:
            raise QueryError(f"TraceQL: {node.expr.text} = nil: a span always has it")
        if node.expr.scope == "resource" and node.expr.name == "service.name":
            raise QueryError("TraceQL: resource.service.name = nil: every span has a service")
    t = implied_type(node.expr)
    if t == ATTRIBUTE or node.op in ("exists", "missing"):
        return
    if node.op == "-" and t not in _NUMERIC:
        raise QueryError(f"TraceQL: - takes a number, not a {t}")
    if node.op == "!" and t != "boolean":
        raise QueryError(f"TraceQL: ! takes a boolean, not a {t}")


def _check_field_reader(expr: Optional[ast.Field], where: str, numeric: bool) -> None:
    if expr is None:
        return
    t = implied_type(expr)
    if numeric and t != ATTRIBUTE and t not in _NUMERIC:
        raise QueryError(f"TraceQL: {where} reads a number, not a {t}")
    if not _reads_span(expr):
        raise QueryError(f"TraceQL: {where} reads something of the span, not a literal")


def validate(root: ast.Element) -> None:
    """QueryError for what Tempo refuses once the query is read (see the module)."""
    for node in ast.walk(root):
        if isinstance(node, ast.Binary):
            _check_binary(node)
        elif isinstance(node, ast.Unary):
            _check_unary(node)
        elif isinstance(node, ast.Filter):
            t = implied_type(node.expr)
            if t not in (ATTRIBUTE, "boolean"):
                raise QueryError(f"TraceQL: a spanset filter {{ }} holds a condition, not a {t}")
        elif isinstance(node, ast.Aggregate):
            _check_field_reader(node.expr, f"{node.function}()", numeric=True)
        elif isinstance(node, ast.GroupBy):
            _check_field_reader(node.expr, "by()", numeric=False)
