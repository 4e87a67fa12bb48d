"""The ClickHouse store against the same contract as the embedded store, through the real
clickhouse-connect client into ClickHouse's engine (``tests/clickhouse_http.py`` serves its HTTP
interface over chdb); and several ``hotspan server`` processes over one ClickHouse."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from hotspan.store.base import SampleFilter, StoreError
from hotspan.store.clickhouse_schema import (
    TABLE_NAMES,
    Layout,
    create_statements,
    ttl_statements,
)
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url
from tests.conftest import running_server
from tests.helpers import TLS, flamegraph, function_totals, ingest_pprof, make_pprof
from tests.server.tempo.test_traces_api import Tracing, hex_id, http_exporter
from tests.store_contract import SEC, TRACE_A, StoreContract, batch_of, spans_of


def _store(url: str, **kwargs):  # type: ignore[no-untyped-def]
    """A store that keeps everything unless told: the contract writes data stamped 1970,
    which the default retention's TTL would drop as it lands."""
    from hotspan.store.clickhouse import ClickHouseStore

    kwargs.setdefault("retention_ns", 0)
    return ClickHouseStore(url, **kwargs)


class TestClickHouseStore(StoreContract):
    @pytest.fixture
    def store(self, clickhouse_url: str) -> Iterator:
        s = _store(clickhouse_url)
        yield s
        s.close()

    @pytest.fixture
    def reopen(self, clickhouse_url: str):  # type: ignore[no-untyped-def]
        return lambda: _store(clickhouse_url)


def test_two_stores_over_one_database_see_each_other(clickhouse_url: str) -> None:
    a, b = _store(clickhouse_url), _store(clickhouse_url)
    try:
        batch, sid = batch_of([(10, ["main", "from_a"], 5, 0, None)])
        a.write("t", batch).result(timeout=30)
        batch, _ = batch_of([(11, ["main", "from_b"], 7, 0, None)])
        b.write("t", batch).result(timeout=30)
        b.write_spans("t", spans_of([(TRACE_A, 1, 0, "GET /", 10, 12, {})])).result(timeout=30)
        for store in (a, b):
            deadline = time.monotonic() + 5  # series are cached for two seconds
            while [r.series_id for r in store.series("t")] != [sid]:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            got = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC))
            assert sorted(got.values.tolist()) == [5, 7]
            assert [s.name for s in store.trace("t", TRACE_A)] == ["GET /"]
        a.put_settings_rule("t", "api", "", {"sample_rate": 50})
        deadline = time.monotonic() + 5
        while b.settings_version("t") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert b.put_settings_rule("t", "api", "", {"sample_rate": 10}).version == 2
    finally:
        a.close()
        b.close()


def test_a_version_1_database_is_brought_up_to_date(clickhouse_url: str) -> None:
    """A database an older hotspan made (schema 1, no documents table) gets the missing
    table when a newer server starts, and keeps its data."""
    from hotspan.store.clickhouse_connection import ClickHouseURL, Clients

    url = ClickHouseURL(clickhouse_url)
    layout = Layout(url.database)
    clients = Clients(url, None)
    try:
        admin = clients.connect(database="default")
        admin.command(f"CREATE DATABASE IF NOT EXISTS {url.database}")
        admin.close()
        old = [t for t in TABLE_NAMES if t != "documents"]
        for statement in create_statements(layout, None, only=old):
            clients.command(statement)
        clients.command("INSERT INTO schema_migrations (version) VALUES (1)")
    finally:
        clients.close()
    store = _store(clickhouse_url)
    try:
        client = store._clients.get()
        versions = client.query("SELECT version FROM schema_migrations FINAL ORDER BY 1")
        assert versions.result_rows == [(1,), (2,), (3,)]
        store.put_document("t", "alert_rule", "r", {"above": 1})
        assert [d.body for d in store.documents("alert_rule", "t")] == [{"above": 1}]
    finally:
        store.close()


def test_schema_is_created_once_and_versioned(clickhouse_url: str) -> None:
    first = _store(clickhouse_url, retention_ns=3 * 86400 * SEC)
    try:
        client = first._clients.get()
        tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
        assert {
            "samples",
            "series",
            "stacks",
            "frames",
            "spans",
            "trace_index",
            "documents",
        } <= tables
        ddl = client.command("SHOW CREATE TABLE samples")
        assert "ORDER BY (tenant, series_id, ts)" in ddl and "PARTITION BY" in ddl
        assert "TTL" in ddl and "toIntervalDay(3)" in ddl
        assert "LowCardinality(String)" in ddl and "Delta" in ddl
        # Stacks outlive the samples that name them.
        assert "toIntervalDay(5)" in client.command("SHOW CREATE TABLE stacks")
    finally:
        first.close()
    # A server not told a retention keeps the database's: it is the same for all servers.
    adopted = _store(clickhouse_url, retention_ns=None)
    try:
        assert adopted.retention_days == 3
        assert adopted.kept_retention_ns(None) == 3 * 86400 * SEC
    finally:
        adopted.close()
    # Told another, it changes the TTL for everyone, not the data or the schema version.
    again = _store(clickhouse_url, retention_ns=10 * 86400 * SEC)
    try:
        client = again._clients.get()
        assert "toIntervalDay(10)" in client.command("SHOW CREATE TABLE samples")
        versions = client.query("SELECT version FROM schema_migrations FINAL ORDER BY 1")
        assert versions.result_rows == [(1,), (2,), (3,)]
    finally:
        again.close()
    forever = _store(clickhouse_url, retention_ns=0)
    try:
        assert "TTL" not in forever._clients.get().command("SHOW CREATE TABLE samples")
        assert forever.kept_retention_ns(None) == 0
    finally:
        forever.close()


def test_retention_with_ttl_drops_whole_days_only(clickhouse_url: str) -> None:
    day = 86400
    store = _store(clickhouse_url, retention_ns=30 * day * SEC)
    try:
        # Within the TTL (ClickHouse drops rows already expired as they are written).
        today = int(time.time()) // day * day
        old, _ = batch_of([(today - 20 * day + 5, ["old"], 1, 0, None)])
        mid, sid = batch_of(
            [
                (today - 10 * day + 5, ["mid"], 2, 0, None),
                (today - 10 * day + 900, ["x"], 3, 0, None),
            ]
        )
        store.write("t", old).result(timeout=30)
        store.write("t", mid).result(timeout=30)
        # The old day goes as a partition; rows of the cutoff's own day are left to the TTL.
        report = store.delete_before((today - 10 * day + 600) * SEC)
        assert report.samples == 1
        left = store.stack_values("t", [sid], SampleFilter(0, (today + day) * SEC))
        assert sorted(left.values.tolist()) == [2, 3]
    finally:
        store.close()


def test_unreachable_clickhouse_is_a_store_error() -> None:
    pytest.importorskip("clickhouse_connect")
    with pytest.raises(StoreError, match="cannot open clickhouse://default@127.0.0.1:9/"):
        _store("clickhouse://127.0.0.1:9/hotspan")


def test_bad_store_url_is_refused() -> None:
    from hotspan.store import open_store

    pytest.importorskip("clickhouse_connect")
    with pytest.raises(StoreError, match="bad port"):
        open_store("clickhouse://host:notaport/db")
    with pytest.raises(StoreError, match="--cluster needs a ClickHouse store"):
        open_store("/tmp/somewhere", cluster="main")


def test_cluster_layout_replicates_and_distributes() -> None:
    """DDL only: no ClickHouse cluster (Keeper and replicas) runs here."""
    statements = create_statements(Layout("hotspan", "prod"), retention_days=7)
    text = "\n".join(statements)
    assert all(" ON CLUSTER `prod`" in s for s in statements)
    assert "CREATE TABLE IF NOT EXISTS `samples_local` ON CLUSTER `prod`" in text
    assert "ENGINE = ReplicatedMergeTree()" in text
    assert "ENGINE = ReplicatedReplacingMergeTree(written)" in text
    assert (
        "`samples` ON CLUSTER `prod` AS `samples_local` ENGINE = Distributed(`prod`, "
        "`hotspan`, `samples_local`, cityHash64(tenant, series_id))" in text
    )
    alters = {t.name: sql for t, sql in ttl_statements(Layout("hotspan", "prod"), None)}
    assert alters["samples"] == "ALTER TABLE `samples_local` ON CLUSTER `prod` REMOVE TTL"


def test_two_servers_share_one_clickhouse(tmp_path: Path, clickhouse_url: str) -> None:
    """Pushes to either server, queries from either: the same answers."""
    # One told by option, the other by environment.
    with (
        running_server(tmp_path / "a", ["--store", clickhouse_url]) as a,
        running_server(tmp_path / "b", env={"HOTSPAN_STORE": clickhouse_url}) as b,
    ):
        now = int(time.time())
        with a.client() as ca, b.client() as cb:
            for i, (client, fn) in enumerate(((ca, "on_a"), (cb, "on_b"))):
                body = make_pprof([(["work." + fn, "main.main"], 100 + i, {})])
                assert ingest_pprof(client, "shop{env=prod}", body, now - 60 + i).status_code == 200
            for client in (ca, cb):
                deadline = time.monotonic() + 10
                while True:
                    totals = function_totals(
                        flamegraph(client, '{service_name="shop"}', now - 3600, now + 60)
                    )
                    if totals.get("work.on_a") and totals.get("work.on_b"):
                        break
                    assert time.monotonic() < deadline, totals
                    time.sleep(0.3)
                assert (totals["work.on_a"], totals["work.on_b"]) == (100, 101)
        # Spans exported by a real OpenTelemetry SDK to one server, the trace read from the
        # other.
        tracing = Tracing({"service.name": "shop"}, [http_exporter(a.url)])
        root = tracing.span("GET /cart", time.time_ns() - 10**9, 10**8, end=False)
        tracing.span("SELECT cart", time.time_ns() - 10**9, 5 * 10**7, parent=root)
        root.end()
        (trace_id,) = {hex_id(s.context.trace_id, 32) for s in tracing.finish()}
        r = httpx.get(f"{b.url}/api/v2/traces/{trace_id}", timeout=10, verify=TLS)
        assert r.status_code == 200, r.text
        names = sorted(
            span["name"]
            for batch in r.json()["trace"]["resourceSpans"]
            for scope in batch["scopeSpans"]
            for span in scope["spans"]
        )
        assert names == ["GET /cart", "SELECT cart"]


def test_server_outlives_clickhouse_going_away(tmp_path: Path) -> None:
    """ClickHouse stops: pushes and queries get 503 with the reason, the server stays up,
    and once ClickHouse is back everything acknowledged before is still there."""
    from tests.clickhouse_fixture import SKIP_REASON, clickhouse_available, start_clickhouse

    if not clickhouse_available():
        pytest.skip(SKIP_REASON)
    ch = start_clickhouse(tmp_path / "ch")
    port = ch.port
    try:
        with running_server(tmp_path / "srv", ["--store", ch.url_for("hotspan")]) as srv:
            now = int(time.time())
            with srv.client() as c:
                body = make_pprof([(["work.before", "main.main"], 40, {})])
                assert ingest_pprof(c, "svc", body, now - 120).status_code == 200
                # /metrics shows the size ClickHouse reports for the database.
                assert _store_size(c) > 0
                ch.stop()
                # With ClickHouse away /metrics still answers, without the store's size.
                assert _store_size(c) is None
                body = make_pprof([(["work.during", "main.main"], 50, {})])
                r = ingest_pprof(c, "svc", body, now - 90)
                assert r.status_code == 503 and "could not store" in r.text
                r = c.post(
                    "/querier.v1.QuerierService/SelectMergeStacktraces",
                    json={
                        "profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
                        "labelSelector": '{service_name="svc"}',
                        "start": (now - 3600) * 1000,
                        "end": (now + 60) * 1000,
                    },
                )
                # Series may still be cached: either the store's 503 or an answer, never a 500.
                assert r.status_code in (200, 503), r.text
                if r.status_code == 503:
                    assert r.json()["code"] == "unavailable"
                ch = start_clickhouse(tmp_path / "ch", port=port)
                body = make_pprof([(["work.after", "main.main"], 60, {})])
                assert ingest_pprof(c, "svc", body, now - 60).status_code == 200
                totals = function_totals(
                    flamegraph(c, '{service_name="svc"}', now - 3600, now + 60)
                )
                assert (totals.get("work.before"), totals.get("work.after")) == (40, 60)
                assert "work.during" not in totals
    finally:
        ch.stop()


def _store_size(client: httpx.Client) -> Optional[float]:
    from prometheus_client.parser import text_string_to_metric_families

    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    for family in text_string_to_metric_families(r.text):
        if family.name == "hotspan_store_size_bytes":
            return family.samples[0].value
    return None


def test_server_refuses_to_start_without_its_clickhouse(tmp_path: Path) -> None:
    import subprocess
    import sys

    pytest.importorskip("clickhouse_connect")
    done = subprocess.run(
        [sys.executable, "-m", "hotspan", "server", "--port", "0", "--otlp-http-port", "off"]
        + ["--otlp-grpc-port", "off", "--store", "clickhouse://u:secret@127.0.0.1:9/hs"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "hotspan: cannot open clickhouse://u@127.0.0.1:9/hs" in done.stderr
    assert "secret" not in done.stderr


def test_lookups_of_many_ids_stay_under_the_query_size_limit(clickhouse_url: str) -> None:
    """A day's flame graph of a busy service needs tens of thousands of stacks at once."""
    store = _store(clickhouse_url)
    try:
        rows = [(10 + i % 50, ["main", f"handler_{i}"], 1 + i % 3, 0, None) for i in range(25_000)]
        batch, sid = batch_of(rows)
        store.write("t", batch).result(timeout=120)
        got = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC))
        assert len(got.stack_ids) == 25_000
        stacks = store.stacks(got.stack_ids.tolist())
        assert len(stacks) == 25_000
        frames = store.frames(sorted({f for fs in stacks.values() for f in fs}))
        assert len(frames) == 25_001
        spans = store.span_traces("t", list(range(1, 30_001)))
        assert spans == {}
    finally:
        store.close()


def test_spans_that_fail_do_not_fail_the_profiles_of_their_group(clickhouse_url: str) -> None:
    """One commit, two kinds of pushes: the spans insert fails (its table is gone), the
    samples land once, and only the span export hears of the failure."""
    store = _store(clickhouse_url)
    try:
        first, sid = batch_of([(5, ["main", "warmup"], 1, 0, None)])
        store.write("t", first).result(timeout=30)
        store._clients.command("DROP TABLE spans")
        # Both queued while the writer is busy: they make one group.
        busy = store._writer.run(lambda: time.sleep(0.5))
        profile, _ = batch_of([(10, ["main", "work"], 7, 0, None)])
        samples_done = store.write("t", profile)
        spans_done = store.write_spans("t", spans_of([(TRACE_A, 1, 0, "GET /", 10, 12, {})]))
        busy.result(timeout=30)
        assert samples_done.result(timeout=30) is None
        with pytest.raises(StoreError, match="spans"):
            spans_done.result(timeout=30)
        got = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC))
        assert sorted(got.values.tolist()) == [1, 7]
    finally:
        store.close()
