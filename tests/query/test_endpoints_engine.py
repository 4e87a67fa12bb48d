"""Which spans are a service's requests, against a real DuckDB store: local roots under
another service's span, requests that began before the range, calls back into the service."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from hotspan.query.endpoints import EndpointEngine
from hotspan.query.engine import QueryEngine
from hotspan.store.duckdb import DuckDBStore
from tests.store_contract import CPU, SEC, TRACE_A, TRACE_B, batch_of, spans_of

TRACE_C = "c" * 32


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DuckDBStore]:
    s = DuckDBStore(str(tmp_path / "data"))
    try:
        yield s
    finally:
        s.close()


def test_requests_are_local_roots_that_started_in_the_range(store: DuckDBStore) -> None:
    write = lambda rows, service: store.write_spans("t", spans_of(rows, service)).result(30)  # noqa: E731
    # A: the gateway calls api's GET /pay, which runs sql.
    write([(TRACE_A, 1, 0, "GET /", 100, 104, {})], "gateway")
    write([(TRACE_A, 2, 1, "GET /pay", 100, 103, {}), (TRACE_A, 3, 2, "sql", 101, 102, {})], "api")
    # B: a request that began before the range; its child span ran in it.
    write(
        [(TRACE_B, 10, 0, "GET /old", 50, 125, {}), (TRACE_B, 11, 10, "render", 120, 125, {})],
        "api",
    )
    # C: api calls db, which calls back into api: the callback is a request of its own.
    write(
        [(TRACE_C, 20, 0, "GET /pay", 130, 140, {}), (TRACE_C, 22, 21, "callback", 131, 132, {})],
        "api",
    )
    write([(TRACE_C, 21, 20, "query", 130, 133, {})], "db")
    batch, _ = batch_of(
        [
            (150, ["pay"], 5, 2, TRACE_A),
            (150, ["sql"], 7, 3, TRACE_A),
            (150, ["render"], 100, 11, TRACE_B),
            (150, ["pay"], 1, 20, TRACE_C),
            (150, ["callback"], 4, 22, TRACE_C),
            (150, ["idle"], 50, 0, None),
        ],
        labels={"service_name": "api"},
    )
    store.write("t", batch).result(30)
    engine = EndpointEngine(store, QueryEngine(store))

    found = engine.endpoints("t", "api", CPU, 100 * SEC, 200 * SEC)
    assert [(e.name, e.requests, e.total) for e in found.endpoints] == [
        ("GET /pay", 2, 13),
        ("callback", 1, 4),
    ]
    assert found.total == 167 and found.unattributed == 150 and not found.truncated
    values, requests = engine.endpoint_values("t", "api", "GET /pay", CPU, 100 * SEC, 200 * SEC)
    assert requests == 2 and int(values.values.sum()) == 13
    # The whole history: GET /old is a request too, with its child's samples.
    early = engine.endpoints("t", "api", CPU, 0, 200 * SEC)
    assert ("GET /old", 1, 100) in [(e.name, e.requests, e.total) for e in early.endpoints]
    assert engine.endpoints("other", "api", CPU, 0, 200 * SEC).endpoints == ()


def test_cut_spans_never_make_a_child_a_request(
    store: DuckDBStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With more spans than are looked at, the latest are kept; a kept child whose parent
    was cut is looked up, not taken for a request of its own."""
    rows = []
    for k in range(10):
        trace = f"{k + 1:032x}"
        rows += [
            (trace, 100 + k, 0, "GET /pay", 100 + 2 * k, 102 + 2 * k, {}),
            (trace, 200 + k, 100 + k, "sql", 101 + 2 * k, 102 + 2 * k, {}),
        ]
    store.write_spans("t", spans_of(rows, "api")).result(30)
    engine = EndpointEngine(store, QueryEngine(store))
    whole = engine.endpoints("t", "api", CPU, 100 * SEC, 200 * SEC)
    assert [(e.name, e.requests) for e in whole.endpoints] == [("GET /pay", 10)]
    assert not whole.truncated

    # 11 of 20: the last five requests whole, and the sql span of the one before them.
    monkeypatch.setattr("hotspan.query.endpoints.MAX_SPANS", 11)
    cut = engine.endpoints("t", "api", CPU, 100 * SEC, 200 * SEC)
    assert [(e.name, e.requests) for e in cut.endpoints] == [("GET /pay", 5)]
    assert cut.truncated
    # Exactly as many spans as are looked at: nothing was cut.
    monkeypatch.setattr("hotspan.query.endpoints.MAX_SPANS", 20)
    assert not engine.endpoints("t", "api", CPU, 100 * SEC, 200 * SEC).truncated


def test_samples_stamped_before_the_range_still_count_for_its_requests(
    store: DuckDBStore,
) -> None:
    """Samples carry the start of their upload window: a request that began at 105 s can
    hold samples stamped 100 s, and a range from 102 s still counts them for it."""
    store.write_spans("t", spans_of([(TRACE_A, 1, 0, "GET /pay", 105, 107, {})], "api")).result(30)
    batch, _ = batch_of(
        [(100, ["pay"], 30, 1, TRACE_A), (100, ["before"], 9, 0, None)],
        labels={"service_name": "api"},
    )
    store.write("t", batch).result(30)
    engine = EndpointEngine(store, QueryEngine(store))
    found = engine.endpoints("t", "api", CPU, 102 * SEC, 200 * SEC)
    assert [(e.name, e.requests, e.total) for e in found.endpoints] == [("GET /pay", 1, 30)]
    assert found.total == 30 and found.unattributed == 0
    values, requests = engine.endpoint_values("t", "api", "GET /pay", CPU, 102 * SEC, 200 * SEC)
    assert requests == 1 and int(values.values.sum()) == 30
