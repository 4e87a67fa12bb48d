"""What a query is refused for once it is read, by Tempo's rules (``query.traceql.validate``):
types that can never make sense; and what stays accepted."""

from __future__ import annotations

import pytest

from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast, parse_query

REFUSED = [
    ("{ 2 * 3 }", "holds a condition, not a number"),
    ("{ name }", "is not a condition"),
    ("{ 1 != false }", "not a number and a boolean"),
    ("{ duration = error }", "duration is a duration, it cannot compare with error"),
    ("{ span:childCount + 1 = ok }", "not a number and a status"),
    ('{ 2 =~ "2" }', "compares a string with a number"),
    ("{ 2 =~ 3 }", "a number does not take =~"),
    ("{ .a =~ .b }", "regular expression in quotes"),
    ("{ false && 2.5 }", "not a boolean and a number"),
    ("{ kind >= client }", "a kind does not take >="),
    ("{ status < error }", "a status does not take <"),
    ('{ status > "error" }', "not a status and a string"),
    ("{ true + true }", "a boolean does not take +"),
    ('{ "a" * "b" = "ab" }', "a string does not take *"),
    ("{ -kind = server }", "- takes a number, not a kind"),
    ("{ -false }", "- takes a number, not a boolean"),
    ("{ !duration > 1s }", "! takes a boolean, not a duration"),
    ('{ !"x" = "y" }', "! takes a boolean, not a string"),
    ("{ name = nil }", "a span always has it"),
    ("{ nil = duration }", "a span always has it"),
    ("{ resource.service.name = nil }", "every span has a service"),
    ("{ } | max(2 = 2) > 1", "reads a number, not a boolean"),
    ("{ } | avg(7) > 1", "reads something of the span"),
    ("{ } | sum(1m - 30s) > 1", "reads something of the span"),
    ("{ } | by(42)", "reads something of the span"),
    ('{ } | by("route")', "reads something of the span"),
    ("{ } | rate() by (.a) | compare({ 1 }) ", "expected"),
]


@pytest.mark.parametrize("text, message", REFUSED)
def test_refused(text: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        parse_query(text)


ACCEPTED = [
    "{ .a }",
    "{ !.a }",
    "{ -.a > 3 }",
    "{ .a + 1 = .b * 2 }",
    "{ duration > 100 && duration < 2s }",  # a number for a duration: nanoseconds
    '{ status = "error" }',  # a status's name as a string, as hotspan's own search sends it
    '{ kind != "server" }',
    "{ .a = nil && span:status != nil }",
    '{ event:name = nil && name = "charge" }',  # a span without events
    '{ name > "m" && name =~ "GET.*" }',
    "{ } | avg(duration) > 1s",
    "{ } | max(span.bytes * 8) > 1000",
    "{ } | by(span.http.route) | count() > 2",
    "{ } | compare({ status = error })",
    "{ nestedSetParent < 0 && true }",
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_accepted(text: str) -> None:
    parse_query(text)


def test_nil_compared_with_nil_is_false() -> None:
    # As Tempo reads it: neither nil = nil nor nil != nil holds.
    for text in ("{ nil != nil }", "{ nil = nil }"):
        assert parse_query(text).root == ast.Filter(ast.Static(False)), text
