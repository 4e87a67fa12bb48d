"""Array attributes in the TraceQL engine (``query.traceql.fields``): one record per element
in the flattened text, compared as Tempo compares an array, element types kept.  (The stores'
SQL is held to the same answers in tests/query/test_traceql_metrics_sql.py and
tests/server/tempo/test_search_pipelines.py.)"""

from __future__ import annotations

from typing import List, Tuple

import pytest

from hotspan.model.trace import SpanRecord, flatten_attributes
from hotspan.query.traceql import compile_field, parse_query

Pairs = List[Tuple[str, str, str]]


def _span(pairs: Pairs) -> SpanRecord:
    return SpanRecord("0" * 31 + "1", 1, 0, "op", 0, "svc", 0, 1, 0, flatten_attributes(pairs), "")


def _meets(query: str, pairs: Pairs) -> bool:
    return compile_field(parse_query(query).root.expr)(_span(pairs), None) is True  # type: ignore[attr-defined]


MIXED: Pairs = [("a", "false", "bool"), ("a", "x", "string"), ("a", "3", "int")]
BOOLS: Pairs = [("a", "false", "bool"), ("a", "false", "bool")]
STRINGS: Pairs = [("a", "x", "string"), ("a", "1", "string"), ("ab", "y", "string")]


@pytest.mark.parametrize(
    "query, pairs, expected",
    [
        ("{ span.a = false }", MIXED, True),
        ("{ span.a != true }", MIXED, False),  # "x" and 3 are no booleans
        ("{ span.a != true }", BOOLS, True),
        ("{ span.a = 3 }", MIXED, True),
        ("{ span.a > 2 }", MIXED, True),
        ("{ span.a != 4 }", MIXED, False),  # not every element is a number
        ('{ span.a = "x" }', MIXED, True),
        ('{ span.a != "z" }', MIXED, False),
        ('{ span.a != "z" }', STRINGS, True),
        ('{ span.a != "1" }', STRINGS, False),  # a string that reads as a number, equal
        ('{ span.a = "y" }', STRINGS, False),  # "ab" is another key
        ('{ span.a =~ "[0-9]" }', STRINGS, True),
        ('{ span.a !~ "[a-z]" }', STRINGS, False),
        ("{ span.a != nil }", STRINGS, True),
        ("{ span.a = nil }", [], True),
    ],
)
def test_an_array_compared_as_tempo_compares_it(query: str, pairs: Pairs, expected: bool) -> None:
    assert _meets(query, pairs) is expected
