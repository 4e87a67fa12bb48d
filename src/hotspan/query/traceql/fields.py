"""TraceQL's field expressions on one span: values, comparisons, arithmetic.

Attribute values come as the store keeps them, flattened to text (``model.trace``), so a value
compares as a number against a number and as text against text (:class:`ast.Text`).  Each
field expression is compiled once, when the query is read, to a Python closure the query
keeps (``Query.plan``); comparisons with a literal compile to a direct test (no type dispatch
per span).  Also here: one identifier's value on a span (``span_value``, for metrics'
``by()``), and one filter on one span (``matches``, ``in_selection``: ``compare()``'s
selection).
"""

from __future__ import annotations

import functools
import math
import operator
import re
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from hotspan.formats.otlp import any_value_text
from hotspan.model.labels import RegexError, compile_regex
from hotspan.model.trace import (
    NUMBER_PATTERN,
    RS,
    SPAN_KINDS,
    STATUS_CODES,
    STRING_US,
    US,
    Condition,
    SpanRecord,
    clean,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.parser import attribute_ref
from hotspan.query.traceql.trace_view import Getter, TraceView, Value, nested_parent, root_test

# -- values -------------------------------------------------------------------------------------


def _needles(key: str) -> Tuple[str, str]:
    """What precedes a key's typed value and its string value in a flattened text."""
    k = clean(key)
    return f"{RS}{k}{US}", f"{RS}{k}{STRING_US}"


def _lookup(flat: str, typed: str, string: str) -> object:
    """One attribute's value from a flattened attribute text, without parsing all of it, by
    its :func:`_needles`: an :class:`ast.Text` (typed as its text reads), or a ``str`` for a
    string that reads as a number or a boolean (stored after STRING_US); an
    :class:`ast.Array` when the key has several records (an array's elements)."""
    at = flat.find(typed)
    if at >= 0:
        start = at + len(typed)
        end = flat.find(RS, start)
        if flat.find(typed, end) < 0 and string not in flat:
            return ast.Text(flat[start:end])
        return _elements(flat, typed[:-1])
    at = flat.find(string)
    if at < 0:
        return None
    start = at + len(string)
    end = flat.find(RS, start)
    if flat.find(string, end) < 0:
        return flat[start:end]
    return _elements(flat, typed[:-1])


def _elements(flat: str, prefix: str) -> ast.Array:
    """Every record that starts with ``prefix`` (RS and a key) and a type mark, in order,
    typed as :func:`_lookup` types one."""
    out: List[object] = []
    at = flat.find(prefix)
    while at >= 0:
        mark = at + len(prefix)
        if flat[mark : mark + 1] in (US, STRING_US):
            end = flat.find(RS, mark + 1)
            text = flat[mark + 1 : end]
            out.append(ast.Text(text) if flat[mark] == US else text)
            at = flat.find(prefix, end)
        else:
            at = flat.find(prefix, at + 1)
    return ast.Array(out)


def _first(*values: object) -> object:
    return next((v for v in values if v is not None), None)


def to_number(value: object) -> Optional[float]:
    """A value as a number, if it is one (attribute text that reads as one included)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, ast.Text):
        return _parse_number(value)
    return None


_NUMBER = re.compile(NUMBER_PATTERN)


def _parse_number(text: str) -> Optional[float]:
    """Text that reads as a decimal number (as an int or double attribute is flattened)."""
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:
        number = float(text)
    return number if math.isfinite(number) else None


def to_truth(value: object) -> Optional[bool]:
    if isinstance(value, bool):
        return value
    if isinstance(value, ast.Text) and value in ("true", "false"):
        return value == "true"
    return None


def _attribute_getter(attr: ast.Attribute) -> Getter:
    name = attr.name
    typed, string = _needles(name)
    if attr.scope == "span":
        return lambda s, t: _lookup(s.attrs, typed, string)
    if attr.scope == "resource":
        if name == "service.name":
            return lambda s, t: _lookup(s.resource_attrs, typed, string) or ast.Text(s.service)
        return lambda s, t: _lookup(s.resource_attrs, typed, string)
    if attr.scope == "":
        # Tempo's AttributeFor: the span's attribute when the span has it (even empty), else
        # the resource's.  The stores' span_condition means the same for ``.x``.
        if name == "service.name":
            return lambda s, t: _first(
                _lookup(s.attrs, typed, string),
                _lookup(s.resource_attrs, typed, string),
                ast.Text(s.service),
            )
        return lambda s, t: _first(
            _lookup(s.attrs, typed, string), _lookup(s.resource_attrs, typed, string)
        )
    if attr.scope == "event":
        return lambda s, t: _many(_attribute_of(e.attributes, name) for e in _events(s, t))
    if attr.scope == "link":
        return lambda s, t: _many(_attribute_of(x.attributes, name) for x in _links(s, t))
    if attr.scope == "instrumentation":

        def scoped(s: SpanRecord, t: TraceView) -> object:
            scope = t.scope(s)
            return None if scope is None else _attribute_of(scope.attributes, name)

        return scoped
    getter = _INTRINSICS.get(name)
    if getter is None:
        raise QueryError(f"TraceQL: {attr.text} is not kept by hotspan's span index")
    return getter


def _status(s: SpanRecord, t: TraceView) -> object:
    return ast.Status(STATUS_CODES[s.status_code]) if 0 <= s.status_code < 3 else None


def _kind(s: SpanRecord, t: TraceView) -> object:
    return ast.Kind(SPAN_KINDS[s.kind]) if 0 <= s.kind < len(SPAN_KINDS) else None


# -- what only the OTLP message says: read when the trace came with its stored spans ----------


def _events(s: SpanRecord, t: TraceView) -> Sequence[Any]:
    message = t.message(s)
    return () if message is None else message.events


def _links(s: SpanRecord, t: TraceView) -> Sequence[Any]:
    message = t.message(s)
    return () if message is None else message.links


def _many(values: Iterable[object]) -> Optional[ast.Many]:
    """The values found (a span with no event has no event name: nil)."""
    found = ast.Many(v for v in values if v is not None)
    return found if found else None


def _typed_value(value: Any) -> object:
    """An OTLP AnyValue as TraceQL types it: an array as :class:`ast.Array` of its elements
    (arrays and maps within it, and maps, as their text: strings)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        # An empty array is absent, as it is among a span's own attributes.
        return ast.Array(_typed_element(v) for v in value.array_value.values) or None
    return _typed_element(value)


def _typed_element(value: Any) -> object:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(value, kind)
    return any_value_text(value)


def _attribute_of(attributes: Iterable[Any], name: str) -> object:
    for kv in attributes:
        if kv.key == name:
            return _typed_value(kv.value)
    return None


def _status_message(s: SpanRecord, t: TraceView) -> object:
    message = t.message(s)
    return None if message is None else message.status.message


def _scope_field(field_name: str) -> Getter:
    def get(s: SpanRecord, t: TraceView) -> object:
        scope = t.scope(s)
        return None if scope is None else getattr(scope, field_name)

    return get


_INTRINSICS: Dict[str, Getter] = {
    "name": lambda s, t: s.name,
    "status": _status,
    "kind": _kind,
    "duration": lambda s, t: ast.Duration(s.end_ns - s.start_ns),
    "childCount": lambda s, t: len(t.children.get(s.span_id, ())),
    "span:id": lambda s, t: f"{s.span_id:016x}",
    "span:parentID": lambda s, t: f"{s.parent_span_id:016x}" if s.parent_span_id else None,
    "trace:id": lambda s, t: s.trace_id,
    "traceDuration": lambda s, t: ast.Duration(t.end_ns - t.start_ns),
    "rootName": lambda s, t: t.root.name if t.root is not None else None,
    "rootServiceName": lambda s, t: t.root.service if t.root is not None else None,
    "nestedSetLeft": lambda s, t: t.nested(s)[0],
    "nestedSetRight": lambda s, t: t.nested(s)[1],
    "nestedSetParent": nested_parent,
    # The OTLP message's (nil when the trace came without it: see RAW_ONLY).
    "statusMessage": _status_message,
    "event:name": lambda s, t: _many(e.name for e in _events(s, t)),
    "event:timeSinceStart": lambda s, t: _many(
        ast.Duration(e.time_unix_nano - s.start_ns) for e in _events(s, t)
    ),
    "link:spanID": lambda s, t: _many(x.span_id.hex() for x in _links(s, t)),
    "link:traceID": lambda s, t: _many(x.trace_id.hex() for x in _links(s, t)),
    "instrumentation:name": _scope_field("name"),
    "instrumentation:version": _scope_field("version"),
}
# Intrinsics (canonical names) and attribute scopes only the stored OTLP message holds: a
# query naming one is evaluated with its traces' stored spans (``evaluate``'s ``raw``).
RAW_ONLY = frozenset(
    (
        "statusMessage",
        "event:name",
        "event:timeSinceStart",
        "link:spanID",
        "link:traceID",
        "instrumentation:name",
        "instrumentation:version",
    )
)
RAW_SCOPES = ("event", "link", "instrumentation")


def reads_raw(expr: object) -> bool:
    """Whether an attribute or intrinsic is one only the stored OTLP message holds."""
    if not isinstance(expr, ast.Attribute):
        return False
    return expr.scope in RAW_SCOPES or (expr.scope == "intrinsic" and expr.name in RAW_ONLY)


# -- comparisons and arithmetic -------------------------------------------------------------------

_ORDER = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b}
_ORDER[">="] = lambda a, b: a >= b


def _type_of(value: object) -> str:
    """TraceQL's type of a runtime value: number (int, float, duration), boolean, string,
    status or kind.  Attribute text is of the type it reads as (see ``model.trace``)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, ast.Status):
        return "status"
    if isinstance(value, ast.Kind):
        return "kind"
    if isinstance(value, ast.Text):
        if value in ("true", "false"):
            return "boolean"
        return "number" if _parse_number(value) is not None else "string"
    return "string"


def is_string(value: object) -> bool:
    """Whether ``value`` is a TraceQL string (attribute text that reads as a number is not)."""
    return isinstance(value, str) and _type_of(value) == "string"


def _comparable(a: object, b: object) -> Optional[Tuple[object, object]]:
    """``a`` and ``b`` as two values of one type, or None when TraceQL's types do not match
    (then every comparison is false, as in Tempo: a string never equals a number or a
    boolean, whatever its text; int, float and duration compare as numbers)."""
    if isinstance(a, bool) or isinstance(b, bool):
        if _type_of(a) != "boolean" or _type_of(b) != "boolean":
            return None
        return to_truth(a), to_truth(b)
    for x, y, flip in ((a, b, False), (b, a, True)):
        if isinstance(x, (ast.Status, ast.Kind)):
            if isinstance(y, ast.Text) or (
                isinstance(y, (ast.Status, ast.Kind)) and type(x) is not type(y)
            ):
                return None
            if not isinstance(y, str):
                return None
            names = STATUS_CODES if isinstance(x, ast.Status) else SPAN_KINDS
            if y not in names:
                return None
            # By code, so that status ordering follows OTLP's numbers.
            pair = (names.index(x), names.index(y))
            return (pair[1], pair[0]) if flip else pair
    ta, tb = _type_of(a), _type_of(b)
    if ta != tb:
        return None
    if ta == "number":
        return to_number(a), to_number(b)
    if ta == "boolean":
        return to_truth(a), to_truth(b)
    return str(a), str(b)


@functools.lru_cache(maxsize=256)
def _regex(pattern: str):
    try:
        return compile_regex(pattern)
    except RegexError as exc:
        raise QueryError(f"TraceQL: invalid regular expression {pattern!r}: {exc}") from None


# An array meets these when every element does (none equal, none matching), as in Tempo.
_EVERY_ELEMENT = frozenset(("!=", "!~"))


def compare(op: str, a: object, b: object) -> bool:
    """``a op b`` by TraceQL's rules; nil (None) and mismatched types compare false."""
    if a is None or b is None:
        return False
    if isinstance(a, ast.Array) and isinstance(b, ast.Array):
        return False  # Tempo compares an array with one value only (its query errs)
    if isinstance(a, ast.Array):
        each = all if op in _EVERY_ELEMENT else any
        return each(compare(op, x, b) for x in a)
    if isinstance(b, ast.Array):
        each = all if op in _EVERY_ELEMENT else any
        return each(compare(op, a, x) for x in b)
    if isinstance(a, ast.Many):
        return any(compare(op, x, b) for x in a)
    if isinstance(b, ast.Many):
        return any(compare(op, a, x) for x in b)
    if op in ("=~", "!~"):
        if not is_string(a) or not is_string(b):
            return False
        hit = _regex(str(b)).fullmatch(str(a)) is not None
        return hit if op == "=~" else not hit
    pair = _comparable(a, b)
    if pair is None:
        return False
    x, y = pair
    if op == "=":
        return x == y
    if op == "!=":
        return x != y
    return _ORDER[op](x, y)


def _arithmetic(op: str, a: object, b: object) -> object:
    x, y = to_number(a), to_number(b)
    if x is None or y is None:
        return None
    try:
        if op == "+":
            out = x + y
        elif op == "-":
            out = x - y
        elif op == "*":
            out = x * y
        elif op == "/":
            if y == 0:
                return None
            both_int = isinstance(x, int) and isinstance(y, int)
            out = int(x / y) if both_int and abs(x) < 2**52 else x // y if both_int else x / y
        elif op == "%":
            if y == 0:
                return None
            out = (
                math.fmod(x, y)
                if isinstance(x, float) or isinstance(y, float)
                else int(math.fmod(x, y))
            )
        else:
            out = float(x) ** float(y)
    except (OverflowError, ValueError, ZeroDivisionError):
        return None
    if isinstance(out, float) and not math.isfinite(out):
        return None
    if isinstance(a, ast.Duration) or isinstance(b, ast.Duration):
        return ast.Duration(int(out))
    return out


# -- compiling field expressions ------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def compile_field(expr: ast.Field) -> Getter:
    """``expr`` as a function of (span, trace); QueryError for what cannot run (a bad
    regular expression, an intrinsic hotspan does not keep)."""
    if isinstance(expr, ast.Static):
        value = expr.value
        return lambda s, t: value
    if isinstance(expr, ast.Attribute):
        return _attribute_getter(expr)
    if isinstance(expr, ast.Unary):
        inner = compile_field(expr.expr)
        if expr.op == "exists":
            return lambda s, t: inner(s, t) is not None
        if expr.op == "missing":
            return lambda s, t: inner(s, t) is None
        if expr.op == "!":

            def negate(s: SpanRecord, t: TraceView) -> object:
                truth = to_truth(inner(s, t))
                return None if truth is None else not truth

            return negate
        return lambda s, t: _arithmetic("-", 0, inner(s, t))
    lhs, rhs, op = compile_field(expr.lhs), compile_field(expr.rhs), expr.op
    if op in ("=~", "!~") and isinstance(expr.rhs, ast.Static):
        _regex(str(expr.rhs.value))  # refuse a bad pattern when the query is read
    fast = _compare_static(expr)
    if fast is not None:
        return fast
    if op == "&&":
        return lambda s, t: to_truth(lhs(s, t)) is True and to_truth(rhs(s, t)) is True
    if op == "||":
        return lambda s, t: to_truth(lhs(s, t)) is True or to_truth(rhs(s, t)) is True
    if op in ("=", "!=", "<", "<=", ">", ">=", "=~", "!~"):
        return lambda s, t: compare(op, lhs(s, t), rhs(s, t))
    return lambda s, t: _arithmetic(op, lhs(s, t), rhs(s, t))


_OPERATORS = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_FLIPPED = {"<": ">", ">": "<", "<=": ">=", ">=": "<="}


def _compare_static(expr: ast.Binary) -> Optional[Getter]:
    """A comparison with a literal, compiled to what :func:`compare` would decide for it,
    without its type dispatch per span (the common case: ``status = error``,
    ``span.http.status_code >= 500``, ``resource.service.name = "api"``)."""
    if reads_raw(expr.lhs) or reads_raw(expr.rhs):
        return None  # several values (events, links): compare() tries each
    root = root_test(expr)
    if root is not None:
        when_root, otherwise = root
        return lambda s, t: when_root if s.parent_span_id == 0 else otherwise
    if expr.op in ("=~", "!~") and isinstance(expr.rhs, ast.Static):
        if not is_string(expr.rhs.value):
            return lambda s, t: False
        get, pattern, hit = compile_field(expr.lhs), _regex(expr.rhs.value), expr.op == "=~"
        each = any if hit else all

        def regex(s: SpanRecord, t: TraceView) -> bool:
            got = get(s, t)
            if type(got) is ast.Array:
                return each(is_string(x) and (pattern.fullmatch(x) is not None) == hit for x in got)
            return is_string(got) and (pattern.fullmatch(got) is not None) == hit

        return regex
    if expr.op not in _OPERATORS:
        return None
    attr, static, op = expr.lhs, expr.rhs, expr.op
    if isinstance(attr, ast.Static):
        attr, static, op = static, attr, _FLIPPED.get(op, op)
    if not isinstance(attr, ast.Attribute) or not isinstance(static, ast.Static):
        return None
    value, test = static.value, _OPERATORS[op]
    if attr.scope == "intrinsic" and attr.name in ("status", "kind"):
        names = STATUS_CODES if attr.name == "status" else SPAN_KINDS
        wanted = ast.Status if attr.name == "status" else ast.Kind
        if not isinstance(value, str) or value not in names:
            return None
        if isinstance(value, (ast.Status, ast.Kind)) and not isinstance(value, wanted):
            return lambda s, t: False  # a kind against a status: never true
        code, count = names.index(value), len(names)
        if attr.name == "status":
            return lambda s, t: 0 <= s.status_code < count and test(s.status_code, code)
        return lambda s, t: 0 <= s.kind < count and test(s.kind, code)
    get = compile_field(attr)
    each = all if op in _EVERY_ELEMENT else any
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # A number against a number (attribute text that reads as one, a duration).
        def number_meets(got: object) -> bool:
            number = to_number(got)
            return number is not None and test(number, value)

        def numeric(s: SpanRecord, t: TraceView) -> bool:
            got = get(s, t)
            if type(got) is ast.Array:
                return each(number_meets(x) for x in got)
            return number_meets(got)

        return numeric
    if isinstance(value, str) and not isinstance(value, (ast.Status, ast.Kind, ast.Text)):
        # Text against text; a status or kind name (a str too) never equals a string literal,
        # nor does attribute text that reads as a number or a boolean.
        def text_meets(got: object) -> bool:
            return (
                isinstance(got, str)
                and not isinstance(got, (ast.Status, ast.Kind))
                and test(str(got), value)
                and (not isinstance(got, ast.Text) or _type_of(got) == "string")
            )

        def text(s: SpanRecord, t: TraceView) -> bool:
            got = get(s, t)
            if type(got) is ast.Array:
                return each(text_meets(x) for x in got)
            return text_meets(got)

        return text
    return None


def check(root: ast.Element, extra: Sequence[ast.Field] = ()) -> Dict[int, Getter]:
    """Compile every field expression of a query (and ``extra`` ones, compare()'s filter), so
    its errors show when it is read: the compiled forms by ``id`` of their expression, which
    the query keeps (``Query.plan``) so that evaluating it compiles nothing."""
    plan: Dict[int, Getter] = {}
    nodes: List[object] = [root]
    fields: List[ast.Field] = list(extra)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.Pipeline):
            nodes.extend(node.stages)
        elif isinstance(node, ast.SpansetOp):
            nodes.extend((node.lhs, node.rhs))
        elif isinstance(node, (ast.Filter, ast.GroupBy)):
            fields.append(node.expr)
        elif isinstance(node, ast.ScalarFilter) and node.aggregate.expr is not None:
            fields.append(node.aggregate.expr)
        elif isinstance(node, ast.Select):
            fields.extend(node.attributes)
    for expr in fields:
        plan[id(expr)] = compile_field(expr)
    return plan


def compiled(expr: ast.Field, trace: TraceView) -> Getter:
    got = trace.plan.get(id(expr))
    return got if got is not None else compile_field(expr)


# -- one identifier's value -----------------------------------------------------------------------


def span_value(
    span: SpanRecord, key: str, spans: Optional[Sequence[SpanRecord]] = None
) -> Optional[Value]:
    """The value of a TraceQL identifier (``name``, ``status``, ``span:duration``,
    ``span.http.route``, ``resource.service.name``, ``.x``...) for ``span``: intrinsics as
    their names (status ``error``, kind ``server``) or nanoseconds (durations), attributes
    as numbers when their text reads as one.  Trace-wide intrinsics (``rootName``,
    ``traceDuration``, ``span:childCount``) need the trace's ``spans``.  None when absent."""
    getter = _key_getter(key)
    trace = TraceView(spans) if spans is not None else _EMPTY
    try:
        value = getter(span, trace)
    except AttributeError:  # a trace-wide intrinsic asked without the trace
        return None
    return plain(value)


def plain(value: object) -> Optional[Value]:
    """A runtime value as a plain str, int, float or bool (attribute text that reads as a
    number or a boolean becomes one, as the attribute was typed; durations are nanoseconds).
    Kept typed so that a by() label of a boolean attribute is one (Tempo's ``boolValue``),
    which a filter built from it (``span.cached = false``) matches."""
    if value is None or isinstance(value, ast.Nil):
        return None
    if isinstance(value, ast.Array):
        # The value a store's by() reads: the first record after US (any but a string that
        # reads as a number or a boolean), else the first.
        if not value:
            return None
        return plain(next((v for v in value if isinstance(v, ast.Text)), value[0]))
    if isinstance(value, bool):
        return value
    if isinstance(value, ast.Text):
        if value in ("true", "false"):
            return value == "true"
        number = _parse_number(value)
        return number if number is not None else str(value)
    if isinstance(value, ast.Duration):
        return int(value)
    if isinstance(value, str):
        return str(value)
    return value  # type: ignore[return-value]


class _NoTrace:
    """Stands for the trace when a span is judged without it: what needs the trace raises
    AttributeError (callers make it nil)."""

    def __getattr__(self, name: str) -> object:
        raise AttributeError(f"{name} needs the trace")


# Any: it stands in for a TraceView wherever a getter takes one.
_EMPTY: Any = _NoTrace()


@functools.lru_cache(maxsize=256)
def _key_getter(key: str) -> Getter:
    attr = attribute_ref(key)
    getter = _attribute_getter(attr)
    if attr.name in (
        "traceDuration",
        "rootName",
        "rootServiceName",
        "childCount",
        "nestedSetLeft",
        "nestedSetRight",
    ):
        inner = getter

        def trace_wide(s: SpanRecord, t: TraceView) -> object:
            if isinstance(t, _NoTrace):
                return None
            return inner(s, t)

        return trace_wide
    return getter


# -- one filter on one span (compare()'s selection) ------------------------------------------------

# Intrinsics (canonical names) a span's record alone cannot say: they need its whole trace.
TRACE_WIDE = frozenset(
    (
        "traceDuration",
        "rootName",
        "rootServiceName",
        "childCount",
        "nestedSetParent",
        "nestedSetLeft",
        "nestedSetRight",
    )
)
# The store condition of "a root span" (``{nestedSetParent < 0}``) and of its negation.
ROOT_CONDITION = Condition("span:parentID", "=", "0000000000000000")
NOT_ROOT_CONDITION = Condition("span:parentID", "!=", "0000000000000000")


def conjuncts(expr: ast.Field) -> List[ast.Field]:
    """The parts of a top-level ``&&`` chain (``a || b && c`` is ``(a || b) && c`` in
    TraceQL, so only the top level is a conjunction)."""
    if isinstance(expr, ast.Binary) and expr.op == "&&":
        return conjuncts(expr.lhs) + conjuncts(expr.rhs)
    return [expr]


def field_needs_trace(expr: ast.Field) -> bool:
    """Whether ``expr`` reads more of a trace than the span (``rootName``, ``childCount``...);
    the root test ``nestedSetParent < 0`` does not."""
    if isinstance(expr, ast.Attribute):
        return expr.scope == "intrinsic" and expr.name in TRACE_WIDE
    if isinstance(expr, ast.Binary):
        if root_test(expr) is not None:
            return False
        return field_needs_trace(expr.lhs) or field_needs_trace(expr.rhs)
    if isinstance(expr, ast.Unary):
        return field_needs_trace(expr.expr)
    return False


# Compiled selections by id of their expression (each kept alive with it, so that its id is
# not reused), and the trace last asked with: a metrics query tests every span it reads.
_SELECTIONS: Dict[int, Tuple[ast.Field, Getter]] = {}
_LAST_TRACE: List[Tuple[object, TraceView]] = []


def matches(
    expr: ast.Field, span: SpanRecord, spans: Optional[Sequence[SpanRecord]] = None
) -> bool:
    """Whether the filter expression ``expr`` (what ``{ }`` holds) is true for ``span``.
    ``spans``, the span's whole trace, is read only for trace-wide intrinsics (without it
    they are nil); pass the same list for every span of a trace (it is remembered)."""
    entry = _SELECTIONS.get(id(expr))
    if entry is None or entry[0] is not expr:
        if len(_SELECTIONS) > 256:
            _SELECTIONS.clear()
        entry = _SELECTIONS[id(expr)] = (expr, compile_field(expr))
    trace: object = _EMPTY
    if spans is not None:
        last = _LAST_TRACE[0] if _LAST_TRACE else None
        if last is not None and last[0] is spans:
            trace = last[1]
        else:
            trace = TraceView(spans)
            _LAST_TRACE[:] = [(spans, trace)]
    try:
        return to_truth(entry[1](span, trace)) is True  # type: ignore[arg-type]
    except AttributeError:  # a trace-wide intrinsic asked without the trace: nil
        return False


def in_selection(
    stage: object, span: SpanRecord, spans: Optional[Sequence[SpanRecord]] = None
) -> bool:
    """Whether ``span`` is in a ``compare()`` stage's selection: its filter is true and, when
    the stage has a window, the span started in it (start < span start <= end, as Tempo)."""
    expr = getattr(stage, "compare_filter", None)
    if expr is None:
        return False
    start, end = getattr(stage, "compare_start_ns", None), getattr(stage, "compare_end_ns", None)
    if start is not None and end is not None and not start < span.start_ns <= end:
        return False
    return matches(expr, span, spans)
