"""The syntax tree of a TraceQL query, as ``parser`` builds it and ``pipeline`` runs it.

Values carry TraceQL's types where Python's would lose them: a :class:`Duration` is an ``int``
of nanoseconds that prints as Go does (``1.5s``), :class:`Status` and :class:`Kind` are the
names of an OTLP status or span kind (``error``, ``server``), and :class:`Text` is an
attribute's value as stored: text whose type was not kept, compared as a number against a
number and as text against text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

Value = Union[str, int, float]


class Duration(int):
    """Nanoseconds."""

    def __str__(self) -> str:
        return go_duration(int(self))

    __repr__ = __str__


class Status(str):
    """An OTLP status code by name: unset, ok or error."""


class Kind(str):
    """An OTLP span kind by name: unspecified, internal, server, client, producer, consumer."""


class Text(str):
    """An attribute's value as stored (the flattened text keeps no type)."""


class Many(tuple):
    """The values of a field a span holds several of (its events' names, its links' trace
    ids): a comparison holds when it holds for one of them."""


class Array(tuple):
    """An array attribute's elements (one record each in the flattened text): as in Tempo, a
    comparison holds when it holds for one element, but ``!=`` and ``!~`` when they hold for
    every element (none is equal, none matches)."""


class Nil:
    """TraceQL's ``nil``: in ``x = nil`` and ``x != nil``, whether ``x`` is absent."""

    def __repr__(self) -> str:
        return "nil"


NIL = Nil()


def go_duration(ns: int) -> str:
    """``ns`` as Go's ``time.Duration.String`` writes it (``1h2m3.5s``, ``1.5ms``, ``0s``)."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return sign + _fraction(ns, 1_000) + "µs"
    if ns < 1_000_000_000:
        return sign + _fraction(ns, 1_000_000) + "ms"
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    out = sign
    if hours:
        out += f"{hours}h"
    if hours or minutes:
        out += f"{minutes}m"
    return out + _fraction(rest, 1_000_000_000) + "s"


def _fraction(value: int, unit: int) -> str:
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    digits = str(frac).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


# -- field expressions (inside { }, by(), aggregates) -------------------------------------------


@dataclass(frozen=True, eq=False)
class Static:
    value: object  # str, int, float, bool, Duration, Status, Kind or NIL

    # Equal only with the same type: 1, 1.0, True and 1ns are four literals (Python's == would
    # make them one, and compiled expressions are cached by equality).
    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Static)
            and type(self.value) is type(other.value)
            and self.value == other.value
        )

    def __hash__(self) -> int:
        return hash((type(self.value).__name__, self.value))

    def __str__(self) -> str:
        v = self.value
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (Status, Kind, Duration)):
            return str(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(v) if isinstance(v, float) else str(v)


@dataclass(frozen=True)
class Attribute:
    """An intrinsic (``name``, ``span:duration``, ``trace:rootService``) or an attribute
    (``span.x``, ``resource.x``, ``.x``).  ``text`` is how it is written, canonically."""

    text: str
    scope: str  # "span", "resource", "" (either) for attributes; "intrinsic" for intrinsics
    name: str  # the attribute's name, or the intrinsic's canonical name (see INTRINSICS)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Binary:
    op: str  # && || = != < <= > >= =~ !~ + - * / % ^
    lhs: Field
    rhs: Field

    def __str__(self) -> str:
        return f"({self.lhs} {self.op} {self.rhs})"


@dataclass(frozen=True)
class Unary:
    op: str  # ! (not), - (negation), exists (x != nil), missing (x = nil)
    expr: Field

    def __str__(self) -> str:
        if self.op == "exists":
            return f"{self.expr} != nil"
        if self.op == "missing":
            return f"{self.expr} = nil"
        return f"{self.op}{self.expr}"


Field = Union[Static, Attribute, Binary, Unary]

# -- spanset expressions and pipelines ----------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    """``{ expr }``: the spans of each spanset for which ``expr`` is true."""

    expr: Field


@dataclass(frozen=True)
class SpansetOp:
    """``lhs op rhs`` between spansets: ``&&``, ``||`` and the structural operators
    (``>``, ``>>``, ``<``, ``<<``, ``~``, their negations ``!>``... and unions ``&>``...)."""

    op: str
    lhs: Element
    rhs: Element


@dataclass(frozen=True)
class Aggregate:
    """``count()``, ``avg(x)``, ``min(x)``, ``max(x)``, ``sum(x)`` over a spanset's spans."""

    function: str
    expr: Optional[Field]

    def __str__(self) -> str:
        return f"{self.function}({'' if self.expr is None else _bare(self.expr)})"


@dataclass(frozen=True)
class ScalarFilter:
    """``count() > 2``: keeps the spansets whose aggregate compares true with the value."""

    op: str
    aggregate: Aggregate
    value: object  # a number or Duration
    flipped: bool = False  # written ``2 < count()``


@dataclass(frozen=True)
class GroupBy:
    """``by(expr)``: each spanset split into one per value of ``expr``."""

    expr: Field

    def __str__(self) -> str:
        return f"by({_bare(self.expr)})"


@dataclass(frozen=True)
class Coalesce:
    """``coalesce()``: every spanset of the trace merged back into one."""


@dataclass(frozen=True)
class Select:
    """``select(a, b)``: spansets unchanged; their spans show these attributes."""

    attributes: Tuple[Attribute, ...]


@dataclass(frozen=True)
class Pipeline:
    stages: Tuple[Element, ...]


Element = Union[Filter, SpansetOp, ScalarFilter, GroupBy, Coalesce, Select, Pipeline]


def _bare(expr: Field) -> str:
    """A field expression as Tempo names it in spanset attributes (``by(resource.x)``)."""
    text = str(expr)
    return text[1:-1] if isinstance(expr, Binary) else text


def walk(node: object) -> List[object]:
    """Every node under ``node`` (itself included), depth first, in query order."""
    out = [node]
    if isinstance(node, Pipeline):
        for stage in node.stages:
            out.extend(walk(stage))
    elif isinstance(node, (SpansetOp, Binary)):
        out.extend(walk(node.lhs))
        out.extend(walk(node.rhs))
    elif isinstance(node, (Filter, GroupBy, Unary)):
        out.extend(walk(node.expr))
    elif isinstance(node, ScalarFilter):
        out.extend(walk(node.aggregate))
    elif isinstance(node, Aggregate) and node.expr is not None:
        out.extend(walk(node.expr))
    elif isinstance(node, Select):
        out.extend(node.attributes)
    return out
