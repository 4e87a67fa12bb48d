"""The embedded DuckDB store against the backend-independent contract."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from hotspan.store.duckdb import DuckDBStore
from tests.store_contract import StoreContract


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
