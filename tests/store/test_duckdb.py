"""The embedded DuckDB store against the backend-independent contract."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from hotspan.store.duckdb import DuckDBStore
from tests.store_contract import StoreContract, batch_of


class TestDuckDBStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[DuckDBStore]:
        s = DuckDBStore(str(tmp_path / "data"))
        yield s
        s.close()

    @pytest.fixture
    def reopen(self, tmp_path: Path):  # type: ignore[no-untyped-def]
        return lambda: DuckDBStore(str(tmp_path / "data"))


def test_unopenable_path_is_a_store_error(tmp_path: Path) -> None:
    from hotspan.store.base import StoreError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises((StoreError, OSError)):
        DuckDBStore(str(blocker))


@pytest.mark.parametrize("as_blob", [True, False])
def test_span_messages_are_stored_byte_for_byte(tmp_path: Path, as_blob: bool) -> None:
    """A span's OTLP message goes in as bytes where DuckDB reads them as BLOB (2.x) and as
    hex where it reads them as text (1.x): either way it comes back as it was received."""
    from hotspan.model.trace import SpanBatch, SpanGroup, SpanWriteRow

    store = DuckDBStore(str(tmp_path / "data"))
    try:
        store._bytes_as_blob = as_blob  # what the probe would have found
        raw = bytes(range(256)) + b"\x00\xff"
        batch = SpanBatch()
        gid = batch.add_group(SpanGroup("svc", b"res", "", b"scope", "", ""))
        batch.rows.append(
            SpanWriteRow("ab" * 16, 7, 0, "op", 2, "svc", 10**18, 10**18 + 5, 0, "", gid, raw)
        )
        store.write_spans("t", batch).result(timeout=30)
        (span,) = store.trace("t", "ab" * 16)
        assert span.raw == raw
        # A stack's frame ids go the same way.
        profile, _ = batch_of([(1, ["main", "work"], 10, 0, None)])
        store.write("t", profile).result(timeout=30)
        (stack,) = store._cursor().execute("SELECT stack_id, frame_ids FROM stacks").fetchall()
        assert bytes(stack[1]) == np.asarray(profile.stacks[stack[0]], dtype="<i8").tobytes()
    finally:
        store.close()


def test_span_messages_are_packed_as_zstd_and_read_back_whole(tmp_path: Path) -> None:
    """Spans' messages survive a checkpoint and a reopen as they were received, stored as
    ZSTD where this DuckDB writes it (2.x) and with DuckDB's default before."""
    import duckdb

    from hotspan.model.trace import SpanBatch, SpanGroup, SpanWriteRow
    from hotspan.store.duckdb_schema import RAW_COMPRESSION

    rng = np.random.default_rng(7)
    raws = [rng.bytes(int(rng.integers(0, 600))) for _ in range(3000)]
    batch = SpanBatch()
    gid = batch.add_group(SpanGroup("svc", b"res", "", b"scope", "", ""))
    for i, raw in enumerate(raws):
        trace = f"{i // 10:032x}"
        batch.rows.append(
            SpanWriteRow(
                trace, i + 1, 0, "op", 2, "svc", 10**18 + i, 10**18 + i + 5, 0, "", gid, raw
            )
        )
    store = DuckDBStore(str(tmp_path / "data"))
    try:
        store.write_spans("t", batch).result(timeout=30)
        store._cursor().execute("CHECKPOINT")
    finally:
        store.close()
    store = DuckDBStore(str(tmp_path / "data"))
    try:
        for i in (0, 1234, 2999):
            by_id = {s.span_id: s.raw for s in store.trace("t", f"{i // 10:032x}")}
            assert by_id[i + 1] == raws[i]
        packed = {
            c
            for (c,) in store._cursor()
            .execute(
                "SELECT DISTINCT compression FROM pragma_storage_info('spans') "
                "WHERE column_name = 'raw' AND segment_type = 'BLOB'"
            )
            .fetchall()
        }
    finally:
        store.close()
    assert (packed == {"ZSTD"}) == bool(RAW_COMPRESSION)
    assert bool(RAW_COMPRESSION) == (int(duckdb.__version__.split(".")[0]) >= 2)
