"""The second stage of a metrics answer (``query.traceql.series``): topk and bottomk as Tempo
keeps series, ties included."""

from __future__ import annotations

from typing import List, Sequence

import numpy as np

from hotspan.query.traceql.series import Series, top_k


def _series(*rows: Sequence[object]) -> List[Series]:
    return [
        Series(((("span.foo", name),)), np.array(values, dtype=float)) for name, *values in rows
    ]


def _kept(series: List[Series]) -> dict:
    return {s.labels[0][1]: [None if np.isnan(v) else v for v in s.values] for s in series}


def test_ties_go_by_the_labels_whatever_the_order_the_series_come_in() -> None:
    # As Tempo: topk keeps the alphabetically earlier of equal values, bottomk the later.
    for rows in (
        [("c", 10, 1), ("b", 10, 2), ("a", 10, 3)],
        [("a", 10, 3), ("b", 10, 2), ("c", 10, 1)],
    ):
        assert _kept(top_k(_series(*rows), 2, largest=True)) == {
            "a": [10, 3],
            "b": [10, 2],
        }
        assert _kept(top_k(_series(*rows), 2, largest=False)) == {
            "b": [10, 2],
            "c": [10, 1],
        }


def test_series_without_values_are_dropped_even_when_fewer_than_k() -> None:
    nan = float("nan")
    rows = [("a", nan, nan), ("b", 1, nan)]
    assert _kept(top_k(_series(*rows), 5, largest=True)) == {"b": [1, None]}
    assert _kept(top_k(_series(("a", nan), ("b", nan)), 2, largest=False)) == {}
