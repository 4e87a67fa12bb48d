"""Arithmetic between TraceQL metrics queries (``query.traceql.metrics_math``): how it reads,
and how series combine, on series made here (the server's answers are in
tests/server/tempo/test_metrics.py)."""

from __future__ import annotations

import math
import re
from typing import Dict, List

import numpy as np
import pytest

from hotspan.query.engine import QueryError
from hotspan.query.traceql import parse_query
from hotspan.query.traceql.metrics_math import (
    Arithmetic,
    Fragment,
    Node,
    Scalar,
    Staged,
    fragments,
    parse_metrics_expression,
    run_metrics_expression,
)
from hotspan.query.traceql.plan import Query
from hotspan.query.traceql.series import Exemplar, MetricsRequest, MetricsResult, Series

READ = [
    ("{} | rate()", Fragment),
    ("({} | rate())", Fragment),
    ("({} | rate()) > 10", Staged),
    ("({} | rate() > 6) * 100", Arithmetic),
    ("({ status = error } | rate()) / ({ } | rate())", Arithmetic),
    ("(({} | rate()) * ({} | count_over_time())) + ({} | rate())", Arithmetic),
    ("2 * 3 + ({} | rate() by (resource.service.name))", Arithmetic),
    ("({} | rate()) + ({} | rate()) | topk(5) > 10", Staged),
    ("({} | max_over_time(duration)) > 10s", Staged),
    ("-1.5 * ({} | rate() with (exemplars = false))", Arithmetic),
]


@pytest.mark.parametrize("text, kind", READ)
def test_what_reads(text: str, kind: type) -> None:
    node = parse_metrics_expression(text)
    assert isinstance(node, kind)
    assert all(f.query.metrics is not None for f in fragments(node))


def _scalar_of(node: Node) -> object:
    assert isinstance(node, Arithmetic)
    return node.lhs.value if isinstance(node.lhs, Scalar) else node.rhs.value  # type: ignore[union-attr]


def test_numbers_are_computed_as_read_integers_as_integers() -> None:
    assert _scalar_of(parse_metrics_expression("100 / 3 + ({} | rate())")) == 33
    assert _scalar_of(parse_metrics_expression("-7 / 2 + ({} | rate())")) == -3
    assert _scalar_of(parse_metrics_expression("(1 + 2) * 2.5 - ({} | rate())")) == 7.5
    assert _scalar_of(parse_metrics_expression("({} | rate()) - -5")) == -5
    staged = parse_metrics_expression("({} | rate()) >= 1 / 2")
    assert isinstance(staged, Staged) and staged.stages == ((">=", 0.0),)
    # Between aggregates in a pipeline too: count() > 2 * 3 is count() > 6.
    six = parse_query("{ } | count() > 2 * 3").root
    assert six == parse_query("{ } | count() > 6").root


@pytest.mark.parametrize(
    "text, message",
    [
        ("({} | rate()) * (1 / 0)", "division by zero"),
        ("({} | rate()) * 1h", "a duration is not a number"),
        ("({} | rate()) + ({} | compare({status = error}))", "compare() does not take"),
        ("-({} | rate())", "minus sign goes before a number"),
        ("({} | rate()) +", "expected a metrics query in parentheses"),
        ("({} | rate()) ({} | rate())", "expected an operator"),
        ("({ } | rate()) > count()", "or a number"),
        ("({} | rate()) * 9223372036854775808", "integer out of range"),
        ("coalesce() | { true }", "coalesce() goes after a spanset"),
        ("{ } | count() > 2 / (1 - 1)", "division by zero"),
        ("{ } | count() > 1 + count()", "arithmetic on aggregates"),
        ("(" * 3000 + "{} | rate()" + ")" * 3000 + " * 2", "nested too deeply"),
        ("-" * 5000 + "1 * ({} | rate())", "nested too deeply"),
        ("({} | rate()) * (9223372036854775807 * 2)", "past a 64-bit integer"),
    ],
)
def test_what_does_not_read(text: str, message: str) -> None:
    with pytest.raises(QueryError, match=re.escape(message)):
        parse_metrics_expression(text)


# -- combining series -------------------------------------------------------------------------


def _series(labels: tuple, *values: float, exemplars: List[float] = ()) -> Series:  # type: ignore[assignment]
    return Series(
        labels,
        np.array(values, dtype=float),
        [Exemplar((("trace:id", f"{i}"),), v, 1000 * i) for i, v in enumerate(exemplars)],
    )


def _run(text: str, answers: Dict[str, List[Series]]) -> MetricsResult:
    """``text`` with each fragment answered by the series given for its query text."""
    node = parse_metrics_expression(text)

    def run(query: Query) -> MetricsResult:
        return MetricsResult(np.array([1000, 2000]), answers[query.text.strip()], 5, 2, None)

    return run_metrics_expression(None, "t", node, MetricsRequest(0, 2, 1, False, 0, 10), run)  # type: ignore[arg-type]


def _values(result: MetricsResult) -> Dict[tuple, List[float]]:
    return {s.labels: [None if math.isnan(v) else v for v in s.values] for s in result.series}


SVC_A, SVC_B = (("svc", "a"),), (("svc", "b"),)


def test_series_meet_by_labels_and_a_division_by_zero_is_no_value() -> None:
    answers = {
        "{ status = error } | rate() by (resource.svc)": [_series(SVC_A, 1, 0)],
        "{ } | rate() by (resource.svc)": [_series(SVC_A, 4, 0), _series(SVC_B, 2, 2)],
    }
    result = _run(
        "({ status = error } | rate() by (resource.svc)) / ({ } | rate() by (resource.svc))",
        answers,
    )
    # Only a's series meet (b has no errors series); 0 / 0 is no value.
    assert _values(result) == {SVC_A: [0.25, None]}
    assert result.inspected_spans == 10 and result.inspected_traces == 4


def test_a_series_without_labels_meets_every_series_and_names_combine() -> None:
    answers = {
        "{ } | rate() by (resource.svc)": [_series(SVC_A, 1, 3), _series(SVC_B, 3, 1)],
        "{ } | rate()": [_series((("__name__", "rate"),), 4, 4, exemplars=[2.0])],
        "{ } | count_over_time()": [_series((("__name__", "count_over_time"),), 2, 8)],
    }
    share = _run("({ } | rate() by (resource.svc)) / ({ } | rate())", answers)
    assert _values(share) == {SVC_A: [0.25, 0.75], SVC_B: [0.75, 0.25]}
    # The side fanned out keeps the other side's exemplars only.
    assert [s.exemplars for s in share.series] == [[], []]
    named = _run("({ } | rate()) * ({ } | count_over_time())", answers)
    assert _values(named) == {(("__name__", "(rate * count_over_time)"),): [8, 32]}
    assert [e.value for e in named.series[0].exemplars] == [2.0]


def test_numbers_apply_to_values_and_exemplars_then_filters_and_topk() -> None:
    answers = {
        "{ } | rate() by (resource.svc)": [
            _series(SVC_A, 1, 3, exemplars=[3]),
            _series(SVC_B, 2, 1),
        ]
    }
    scaled = _run("100 - 10 * ({ } | rate() by (resource.svc))", answers)
    assert _values(scaled) == {SVC_A: [90, 70], SVC_B: [80, 90]}
    assert scaled.series[0].exemplars[0].value == 70
    top = _run("(({ } | rate() by (resource.svc)) * 2) > 2 | topk(1)", answers)
    assert _values(top) == {SVC_A: [None, 6], SVC_B: [4, None]}
    # Series with labels of their own meet only the other side's with the same labels.
    answers["{ } | rate() by (resource.svc, span.route)"] = [
        _series(SVC_A + (("route", "/x"),), 5, 5)
    ]
    pairs = _run(
        "({ } | rate() by (resource.svc, span.route)) - ({ } | rate() by (resource.svc))", answers
    )
    assert _values(pairs) == {}


def test_a_float_divided_by_zero_is_infinite_as_go_computes_it() -> None:
    assert _scalar_of(parse_metrics_expression("({} | rate()) + (1.0 / 0)")) == math.inf
    assert _scalar_of(parse_metrics_expression("({} | rate()) + (-1 / 0.0)")) == -math.inf
    assert math.isnan(_scalar_of(parse_metrics_expression("({} | rate()) + (0.0 / 0)")))  # type: ignore[arg-type]
