"""The store's aggregations for ``why`` and alerts over more spans than a read into Python
ever held: the answer covers the whole window, and DuckDB and ClickHouse agree."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, List, Sequence

import pytest

from hotspan.model.trace import SpanBatch, SpanGroup, SpanRecord, SpanWriteRow, flatten_attributes
from hotspan.store.base import SampleFilter, Store
from hotspan.store.duckdb import DuckDBStore
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url
from tests.store_contract import SEC, batch_of

MS = 10**6
# More spans of one name than the 20,000 latest that the baseline was once chosen from.
SPANS = 30_000
FAR = 10**9  # seconds: after every span


def _spans(service: str = "api") -> SpanBatch:
    """SPANS spans of GET /x, one per trace, a second apart: the older 20,000 take
    300-319 ms, the latest 10,000 100-109 ms; every 7th trace also has a child span."""
    batch = SpanBatch()
    gid = batch.add_group(
        SpanGroup(service, b"r", "", b"s", "", flatten_attributes([("service.name", service)]))
    )
    for i in range(SPANS):
        trace = f"{i + 1:032x}"
        duration = (300 + i % 20) * MS if i < 20_000 else (100 + i % 10) * MS
        start = (1000 + i) * SEC
        batch.rows.append(
            SpanWriteRow(
                trace, i + 1, 0, "GET /x", 2, service, start, start + duration, 0, "", gid, b""
            )
        )
        if i % 7 == 0:
            batch.rows.append(
                SpanWriteRow(
                    trace,
                    SPANS + i + 1,
                    i + 1,
                    "db",
                    3,
                    service,
                    start,
                    start + MS,
                    0,
                    "",
                    gid,
                    b"",
                )
            )
    return batch


def _load(store: Store) -> None:
    store.write_spans("t", _spans()).result(timeout=120)
    # Samples of two versions: version 2 holds the latest 10,000 requests' traces.
    rows: List[Any] = []
    for i in range(0, SPANS, 3):
        rows.append((1000 + i, ["a"], 10 + i % 5, i + 1, f"{i + 1:032x}"))
    old = [r for r in rows if r[0] < 21_000]
    new = [r for r in rows if r[0] >= 21_000]
    store.write("t", batch_of(old, labels={"service_name": "api", "v": "1"})[0]).result(timeout=120)
    store.write("t", batch_of(new, labels={"service_name": "api", "v": "2"})[0]).result(timeout=120)


def _reference(spans: Sequence[SpanRecord], cap: int) -> List[int]:
    median = statistics.median(s.end_ns - s.start_ns for s in spans)
    ordered = sorted(
        spans, key=lambda s: (abs(s.end_ns - s.start_ns - median), -s.start_ns, s.span_id)
    )
    return [s.span_id for s in ordered[:cap]]


def _answers(store: Store) -> Any:
    window = (0, (1000 + SPANS) * SEC)
    baseline = store.baseline_spans("t", "api", "GET /x", *window, 50, f"{1:032x}", [1, SPANS + 1])
    series = {s.labels["v"]: s.series_id for s in store.series("t")}
    sides = store.request_sides(
        "t", "api", *window, ([series["1"]], [series["2"]]), SampleFilter(*window)
    )
    return baseline, sides


@pytest.fixture
def duckdb_store(tmp_path: Path) -> Any:
    store = DuckDBStore(str(tmp_path / "data"))
    _load(store)
    yield store
    store.close()


def test_baseline_covers_the_whole_window(duckdb_store: DuckDBStore) -> None:
    baseline, _ = _answers(duckdb_store)
    assert baseline.candidates == SPANS - 1  # every span of the name but the one asked about
    # Two thirds of the spans are the older, slower ones: the median is one of theirs, which
    # the latest 20,000 spans alone would never give.
    assert baseline.median_ns is not None and baseline.median_ns >= 300 * MS
    everything = duckdb_store.span_infos("t", 0, FAR * SEC, name="GET /x", limit=SPANS)
    assert len(everything) == SPANS
    candidates = [s for s in everything if s.span_id != 1]
    assert [s.span_id for s in baseline.spans] == _reference(candidates, 50)


def test_request_sides_count_every_request(duckdb_store: DuckDBStore) -> None:
    _, sides = _answers(duckdb_store)
    # Every third trace has samples: version 1 the traces before 21,000 s, version 2 after.
    with_v1 = sum(1 for i in range(0, 20_000, 3))
    with_v2 = sum(1 for i in range(20_001, SPANS, 3))
    assert sides.requests == (with_v1, with_v2)
    assert sides.without == SPANS - with_v1 - with_v2
    assert sides.totals[0] == sum(10 + i % 5 for i in range(0, 20_000, 3))


def test_duckdb_and_clickhouse_agree(duckdb_store: DuckDBStore, clickhouse_url: str) -> None:
    from hotspan.store.clickhouse import ClickHouseStore

    store = ClickHouseStore(clickhouse_url, retention_ns=0)
    try:
        _load(store)
        assert _answers(store) == _answers(duckdb_store)
    finally:
        store.close()
