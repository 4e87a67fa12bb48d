"""A TraceQL comparison as a condition the stores filter spans on (``model.trace.Condition``),
when it is one exactly; what only the stored OTLP message holds becomes bytes the message must
contain, so that the stores narrow the spans the engine then decides on.
"""

from __future__ import annotations

import re
from typing import Optional

from hotspan.model.trace import OPERATORS, Condition
from hotspan.query.traceql import ast
from hotspan.query.traceql.fields import NOT_ROOT_CONDITION, RAW_ONLY, ROOT_CONDITION
from hotspan.query.traceql.trace_view import root_test


def condition_of(expr: ast.Field) -> Optional[Condition]:
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
        return raw_condition(attr, op, value)
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


def raw_condition(attr: ast.Attribute, op: str, value: object) -> Optional[Condition]:
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
