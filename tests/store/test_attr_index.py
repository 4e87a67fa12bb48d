"""The span attribute index (``span_attrs``) of both stores: search on an attribute reads it,
spans stored before it existed are still found (ClickHouse indexes them when it opens, DuckDB
reads them as without the index), and retention empties it."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable, Iterator, List

import pytest

from hotspan.model.trace import Condition, TraceQuery
from hotspan.store import attr_index
from hotspan.store.base import Store
from hotspan.store.duckdb import DuckDBStore
from hotspan.store.duckdb_schema import span_attr_rows
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url
from tests.store_contract import SEC, TRACE_A, TRACE_B, TRACE_C, spans_of


def _write(store: Store) -> None:
    store.write_spans(
        "t",
        spans_of(
            [
                (TRACE_A, 1, 0, "GET /a", 100, 101, {"enduser.id": "u-1", "code": "200"}),
                (TRACE_B, 2, 0, "GET /b", 200, 201, {"enduser.id": "u-2"}),
                (TRACE_C, 3, 0, "GET /c", 300, 301, {"enduser.id": "u-1"}),
            ]
        ),
    ).result(timeout=30)


def _found(store: Store, key: str, op: str, value: object, end: int = 1000) -> List[str]:
    query = TraceQuery(0, end * SEC, ((Condition(key, op, value),),))
    return sorted(t.trace_id for t in store.find_traces("t", query))


def _records(store: Store, key: str, op: str, value: object) -> List[int]:
    spans = store.span_records("t", 0, 1000 * SEC, [Condition(key, op, value)])
    return sorted(s.span_id for s in spans)


class IndexCases:
    """What both stores do; each subclass gives the store and a way to reach its SQL."""

    def sql(self, store: Any, statement: str) -> Any:
        raise NotImplementedError

    def make_old(self, store: Any) -> None:
        """Turn the store's database into one an older hotspan left: spans, no index."""
        raise NotImplementedError

    reopen: Callable[[], Any]
    regex_indexed = True

    def test_equality_and_regex_use_the_index(self, store: Any) -> None:
        _write(store)
        assert _found(store, "span.enduser.id", "=", "u-1") == sorted([TRACE_A, TRACE_C])
        assert _found(store, "span.enduser.id", "=~", "u-[12]") == sorted(
            [TRACE_A, TRACE_B, TRACE_C]
        )
        assert _found(store, "span.enduser.id", "=", "u-1", end=250) == [TRACE_A]
        assert _records(store, "span.enduser.id", "=", "u-2") == [2]
        # An attribute written untyped as "200" is the number 200 (model.trace): the string
        # "200" is not it, in the index as in the spans.
        assert _found(store, "span.code", "=", 200) == [TRACE_A]
        assert _found(store, "span.code", "=", "200") == []
        # A regular expression meets strings only: not the number 200, whatever its text.
        assert _found(store, "span.code", "=~", "2.*") == []
        # Without its rows in the index a span is not found by equality, nor by a regular
        # expression where the index answers those (the index is what answers), while other
        # operators still scan.
        self.sql(store, "DELETE FROM span_attrs WHERE span_id = 3")
        assert _found(store, "span.enduser.id", "=", "u-1") == [TRACE_A]
        by_regex = [TRACE_A] if self.regex_indexed else sorted([TRACE_A, TRACE_C])
        assert _found(store, "span.enduser.id", "=~", "u-1") == by_regex
        assert _found(store, "span.enduser.id", "!=", "u-2") == sorted([TRACE_A, TRACE_C])

    def test_spans_stored_before_the_index_are_found(self, store: Any) -> None:
        _write(store)
        self.make_old(store)
        store.close()
        again = self.reopen()
        try:
            assert _found(again, "span.enduser.id", "=", "u-1") == sorted([TRACE_A, TRACE_C])
            # New spans are indexed as they are written.
            again.write_spans(
                "t", spans_of([(TRACE_B, 4, 2, "child", 202, 203, {"enduser.id": "u-1"})])
            ).result(timeout=30)
            assert _found(again, "span.enduser.id", "=", "u-1") == sorted(
                [TRACE_A, TRACE_B, TRACE_C]
            )
        finally:
            again.close()

    def test_retention_empties_the_index(self, store: Any) -> None:
        _write(store)
        store.delete_before(250 * SEC)
        left = self.sql(store, "SELECT DISTINCT span_id FROM span_attrs ORDER BY span_id")
        assert [r[0] for r in left] == [3]


class TestDuckDB(IndexCases):
    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[DuckDBStore]:
        self.reopen = lambda: DuckDBStore(str(tmp_path / "data"))
        s = DuckDBStore(str(tmp_path / "data"))
        yield s
        s.close()

    def sql(self, store: Any, statement: str) -> Any:
        if statement.startswith("SELECT"):
            # Both parts of the index: its sorted runs and its recent rows.
            both = "(SELECT * FROM span_attrs UNION ALL SELECT * FROM span_attrs_recent)"
            return store._cursor().execute(statement.replace("span_attrs", both)).fetchall()
        for table in ("span_attrs", "span_attrs_recent"):
            store._cursor().execute(statement.replace("span_attrs", table))
        return None

    def make_old(self, store: Any) -> None:
        for table in ("span_attrs", "span_attrs_recent", "span_attrs_meta"):
            store._cursor().execute(f"DROP TABLE {table}")

    def test_spans_from_before_the_index_are_read_until_retention_drops_them(
        self, store: Any
    ) -> None:
        _write(store)
        self.make_old(store)
        store.close()
        again = self.reopen()
        try:
            meta = "SELECT indexed_from FROM span_attrs_meta"
            assert again._cursor().execute(meta).fetchall() == [(300 * SEC + 1,)]
            assert _found(again, "span.enduser.id", "=", "u-1") == sorted([TRACE_A, TRACE_C])
            again.delete_before(250 * SEC)
            assert again._cursor().execute(meta).fetchall() == [(300 * SEC + 1,)]
            again.delete_before(400 * SEC)
            assert again._cursor().execute(meta).fetchall() == [(0,)]
        finally:
            again.close()

    def test_a_duckdb_that_hashes_otherwise_reads_the_spans_so_far(self, store: Any) -> None:
        _write(store)
        # As a database written by a DuckDB whose hash() differs: its index rows are not
        # found by this one's hashes.
        store._cursor().execute("UPDATE span_attrs_meta SET hash_check = hash_check + 1")
        store._cursor().execute("UPDATE span_attrs SET h = h + 1")
        store._cursor().execute("UPDATE span_attrs_recent SET h = h + 1")
        store.close()
        again = self.reopen()
        try:
            meta = again._cursor().execute("SELECT indexed_from FROM span_attrs_meta")
            assert meta.fetchall() == [(300 * SEC + 1,)]
            assert _found(again, "span.enduser.id", "=", "u-1") == sorted([TRACE_A, TRACE_C])
        finally:
            again.close()

    def test_an_index_with_text_trace_ids_is_made_anew(self, store: Any) -> None:
        _write(store)
        # As an older hotspan left it: the same rows, trace ids as their hex text.
        cur = store._cursor()
        for table in ("span_attrs", "span_attrs_recent"):
            cur.execute(
                f"CREATE TABLE old AS SELECT * REPLACE (lower(lpad(hex(trace_id), 32, '0')) "
                f"AS trace_id) FROM {table}"
            )
            cur.execute(f"DROP TABLE {table}")
            cur.execute(f"ALTER TABLE old RENAME TO {table}")
        store.close()
        again = self.reopen()
        try:
            cur = again._cursor()
            kind = cur.execute("SELECT typeof(trace_id) FROM span_attrs_recent LIMIT 1")
            assert kind.fetchall() == []  # made anew, empty
            assert cur.execute("SELECT indexed_from FROM span_attrs_meta").fetchall() == [
                (300 * SEC + 1,)
            ]
            # The spans so far are read without it; new ones are indexed with numbers.
            assert _found(again, "span.enduser.id", "=", "u-1") == sorted([TRACE_A, TRACE_C])
            again.write_spans(
                "t", spans_of([(TRACE_B, 4, 2, "child", 402, 403, {"enduser.id": "u-1"})])
            ).result(timeout=30)
            found = cur.execute("SELECT typeof(trace_id) FROM span_attrs_recent LIMIT 1")
            assert found.fetchall() == [("UHUGEINT",)]
            assert _found(again, "span.enduser.id", "=", "u-1") == sorted(
                [TRACE_A, TRACE_B, TRACE_C]
            )
        finally:
            again.close()

    def test_recent_rows_move_to_a_sorted_run(self, store: Any, monkeypatch: Any) -> None:
        import hotspan.store.duckdb_write as write

        monkeypatch.setattr(write, "RUN_ROWS", 3)
        _write(store)  # 4 attribute rows: one run
        cur = store._cursor()
        assert cur.execute("SELECT count(*) FROM span_attrs_recent").fetchone() == (0,)
        hs = [r[0] for r in cur.execute("SELECT h FROM span_attrs").fetchall()]
        assert len(hs) == 4 and hs == sorted(hs)
        store.write_spans(
            "t", spans_of([(TRACE_B, 4, 2, "child", 202, 203, {"enduser.id": "u-1"})])
        ).result(timeout=30)
        assert cur.execute("SELECT count(*) FROM span_attrs_recent").fetchone() == (1,)
        # Found in the runs and in the recent part alike.
        assert _found(store, "span.enduser.id", "=", "u-1") == sorted([TRACE_A, TRACE_B, TRACE_C])
        assert _found(store, "span.enduser.id", "=~", "u-.*") == sorted([TRACE_A, TRACE_B, TRACE_C])
        # The rows are counted as they are written, not recounted: two more make a run.
        store.write_spans(
            "t", spans_of([(TRACE_B, 5, 2, "child", 204, 205, {"a": "1", "b": "2"})])
        ).result(timeout=30)
        assert cur.execute("SELECT count(*) FROM span_attrs_recent").fetchone() == (0,)
        assert cur.execute("SELECT count(*) FROM span_attrs").fetchone() == (7,)

    def test_written_rows_are_those_the_schema_reads(self, store: Any) -> None:
        # The writer splits attributes itself (attr_index.split_attributes); the SQL that
        # defines the index (duckdb_schema.span_attr_rows) reads the same rows from the spans.
        attrs = [
            {"enduser.id": "u-1", "code": "200"},
            {},
            {"ключ": "значение 🙂", "": "empty key", "e": ""},
            {"a\x1eb": "c\x1fd", "n": "1.5e3", "t": "true", "x": "\U0001f600" * 3},
        ]
        rows = [(TRACE_A, i + 1, 0, "op", 100 + i, 101 + i, a) for i, a in enumerate(attrs)]
        rows.append((TRACE_B.upper(), 9, 0, "op", 110, 111, {"k": "v"}))
        store.write_spans("t", spans_of(rows)).result(timeout=30)
        written = self.sql(store, "SELECT * FROM span_attrs ORDER BY ALL")
        schema = f"SELECT * FROM ({span_attr_rows('spans')}) ORDER BY ALL"
        assert written == store._cursor().execute(schema).fetchall()
        assert len(written) == 2 + 0 + 3 + 4 + 1


@pytest.mark.skipif(attr_index._native is None, reason="the C extension is not built")
def test_the_c_split_is_the_python_one() -> None:
    texts = [
        "\x1ek\x1fv\x1ek2\x1c200\x1e",
        "",
        "no separator at all",
        "\x1e\x1e\x1fonly a value\x1e\x1e",
        "key\x1cstring mark\x1funit mark",
        "\x1eключ\x1fзначение\x1e",
        "\x1ewide\x1f\U0001f600\x1e\x1fx",
        "\x1ea\x1f" + "b" * 100_000,
    ]
    for i in range(200):
        rng = random.Random(i)
        texts.append(
            "".join(rng.choice("ab\x1e\x1f\x1cé\U0001f600") for _ in range(rng.randrange(30)))
        )
    assert attr_index._native.split_attributes(texts) == attr_index.py_split_attributes(texts)
    assert attr_index._native.split_attributes(tuple(texts[:2])) == attr_index.py_split_attributes(
        texts[:2]
    )
    with pytest.raises(TypeError):
        attr_index._native.split_attributes(["ok", b"bytes"])


def test_trace_ids_split_into_halves() -> None:
    high, low = attr_index.trace_id_halves([TRACE_A, TRACE_B.upper()])
    assert [(int(h) << 64) | int(lo) for h, lo in zip(high, low)] == [
        int(TRACE_A, 16),
        int(TRACE_B, 16),
    ]
    with pytest.raises(ValueError):
        attr_index.trace_id_halves(["abc"])


class TestClickHouse(IndexCases):
    @pytest.fixture
    def store(self, clickhouse_url: str) -> Iterator[Any]:
        from hotspan.store.clickhouse import ClickHouseStore

        self.reopen = lambda: ClickHouseStore(clickhouse_url, retention_ns=0)
        s = self.reopen()
        yield s
        s.close()

    def sql(self, store: Any, statement: str) -> Any:
        client = store._clients.get()
        if statement.startswith("SELECT"):
            return client.query(statement).result_rows
        # Deletes wait for their mutation: the next query sees the rows gone.
        client.command(statement, settings={"mutations_sync": 2})
        return None

    def make_old(self, store: Any) -> None:
        client = store._clients.get()
        client.command("DROP VIEW span_attrs_view")
        client.command("DROP TABLE span_attrs")
        client.command(
            "ALTER TABLE schema_migrations DELETE WHERE version = 3",
            settings={"mutations_sync": 2},
        )

    def test_a_value_most_spans_hold_is_read_by_the_scan(
        self, store: Any, monkeypatch: Any
    ) -> None:
        # Past INDEX_MAX_SPANS spans of the range, the list of traces the index names costs
        # more than the scan: such an equality reads the spans, so it finds a span whose index
        # rows are gone (u-1 keeps one row, above the bound of 0 here), while a value the
        # index names no span of goes through the index.
        from hotspan.store import clickhouse_traces

        monkeypatch.setattr(clickhouse_traces, "INDEX_MAX_SPANS", 0)
        _write(store)
        self.sql(store, "DELETE FROM span_attrs WHERE span_id = 3")
        assert _found(store, "span.enduser.id", "=", "u-1") == sorted([TRACE_A, TRACE_C])
        self.sql(store, "DELETE FROM span_attrs WHERE span_id = 2")
        assert _found(store, "span.enduser.id", "=", "u-2") == []
