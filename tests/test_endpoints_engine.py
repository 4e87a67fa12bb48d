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
