"""The chdb-backed ClickHouse HTTP fixture, driven by the real clickhouse-connect client."""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from typing import Any, Dict, Optional, Tuple
from urllib.parse import unquote, urlencode, urlsplit

import pytest

from tests.clickhouse_fixture import ClickHouseProcess, clickhouse_available, start_clickhouse
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url

pytestmark = pytest.mark.skipif(
    not clickhouse_available(), reason="ClickHouse tests need chdb and clickhouse-connect"
)


def connect(url: str, **kwargs: Any) -> Any:
    """A clickhouse-connect client from a ``clickhouse://user:pass@host:port/db`` URL."""
    import clickhouse_connect

    parts = urlsplit(url)
    return clickhouse_connect.get_client(
        host=parts.hostname,
        port=parts.port,
        username=unquote(parts.username or "default"),
        password=unquote(parts.password or ""),
        database=unquote(parts.path.lstrip("/")),
        **kwargs,
    )


def http(
    server: ClickHouseProcess,
    query: str,
    body: bytes = b"",
    method: str = "POST",
    headers: Optional[Dict[str, str]] = None,
    **params: str,
) -> Tuple[int, Any, bytes]:
    """One raw HTTP exchange: (status, headers, body)."""
    request = urllib.request.Request(
        f"{server.http_url}?{urlencode(dict(params, query=query))}",
        data=body if method == "POST" else None,
        method=method,
    )
    credentials = f"{server.user}:{server.password}".encode()
    request.add_header("Authorization", "Basic " + base64.b64encode(credentials).decode())
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def test_columnar_insert_and_read_back(clickhouse_url: str) -> None:
    import numpy as np

    client = connect(clickhouse_url)
    assert client.ping()
    client.command(
        "CREATE TABLE t (id UInt64, delta Int64, name String, kind LowCardinality(String), "
        "tag FixedString(4), pair Array(UInt32)) ENGINE = MergeTree ORDER BY id"
    )
    n = 100_000
    ids = np.arange(n, dtype=np.uint64)
    deltas = np.arange(n, dtype=np.int64) - 50_000
    names = [f"name-{i}" for i in range(n)]
    kinds = [f"kind-{i % 7}" for i in range(n)]
    tags = [b"ab%02d" % (i % 100) for i in range(n)]
    pairs = [[i % 10, 1] for i in range(n)]
    summary = client.insert(
        "t",
        [ids, deltas, names, kinds, tags, pairs],
        column_names=["id", "delta", "name", "kind", "tag", "pair"],
        column_oriented=True,
    )
    assert summary.written_rows == n

    row = client.query(
        "SELECT count(), sum(id), sum(delta), uniqExact(kind), sum(arraySum(pair)), "
        "countIf(tag = 'ab07'), max(length(name)) FROM t"
    ).result_rows[0]
    assert row == (
        n,
        int(ids.sum()),
        int(deltas.sum()),
        7,
        sum(i % 10 + 1 for i in range(n)),
        n // 100,
        len("name-99999"),
    )

    arrays = client.query_np("SELECT id, delta FROM t WHERE kind = 'kind-3' ORDER BY id")
    expected = ids[ids % 7 == 3]
    assert np.array_equal(arrays["id"], expected)
    assert np.array_equal(arrays["delta"], expected.astype(np.int64) - 50_000)
    assert client.query("SELECT name, kind, tag, pair FROM t WHERE id = 12").result_rows == [
        ("name-12", "kind-5", b"ab12", [2, 1])
    ]
    # Bound parameters: client-side (%(x)s) and server-side ({x:Type}, sent as param_x).
    assert client.command("SELECT count() FROM t WHERE kind = %(k)s", {"k": "kind-1"}) == 14286
    assert client.command("SELECT count() FROM t WHERE id < {n:UInt64}", {"n": 10}) == 10
    assert client.query_arrow("SELECT id FROM t ORDER BY id LIMIT 3").num_rows == 3


def test_compressed_inserts(clickhouse_url: str) -> None:
    import numpy as np

    connect(clickhouse_url).command(
        "CREATE TABLE c (a UInt64, s String) ENGINE = MergeTree ORDER BY a"
    )
    n = 20_000
    for compression in ("lz4", "gzip", False):
        client = connect(clickhouse_url, compress=compression)
        client.insert(
            "c",
            [np.arange(n, dtype=np.uint64), [str(i) for i in range(n)]],
            column_names=["a", "s"],
            column_oriented=True,
        )
    assert connect(clickhouse_url).query("SELECT count(), sum(a) FROM c").result_rows == [
        (3 * n, 3 * n * (n - 1) // 2)
    ]


def test_errors_raise_and_the_server_keeps_answering(clickhouse_url: str) -> None:
    from clickhouse_connect.driver.exceptions import DatabaseError

    client = connect(clickhouse_url)
    with pytest.raises(DatabaseError, match="UNKNOWN_TABLE") as missing:
        client.query("SELECT * FROM no_such_table")
    assert missing.value.code == 60
    with pytest.raises(DatabaseError, match="SYNTAX_ERROR"):
        client.command("SELEC 1")
    with pytest.raises(DatabaseError, match="Multi-statements"):
        client.command("SELECT 1; SELECT 2")
    with pytest.raises(DatabaseError, match="UNKNOWN_SETTING"):
        client.query("SELECT 1", settings={"no_such_setting": 1})
    assert client.ping()
    assert client.command("SELECT 40 + 2") == 42


def test_wrong_password_is_refused(clickhouse_server: ClickHouseProcess) -> None:
    from clickhouse_connect.driver.exceptions import DatabaseError

    url = clickhouse_server.url.replace(f":{clickhouse_server.password}@", ":wrong@")
    with pytest.raises(DatabaseError, match="Authentication failed") as refused:
        connect(url)
    assert refused.value.code == 516
    status, headers, body = http(
        clickhouse_server,
        "SELECT 1",
        headers={"X-ClickHouse-User": "hotspan", "X-ClickHouse-Key": "x"},
    )
    assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "516")
    assert body.startswith(b"Code: 516. DB::Exception: ")


def test_http_protocol_details(clickhouse_server: ClickHouseProcess, clickhouse_url: str) -> None:
    database = urlsplit(clickhouse_url).path.lstrip("/")
    with urllib.request.urlopen(f"{clickhouse_server.http_url}ping", timeout=10) as response:
        assert response.read() == b"Ok.\n"

    status, headers, body = http(clickhouse_server, "SELECT 1 AS x, 'a' AS y", method="GET")
    assert (status, body, headers["X-ClickHouse-Format"]) == (200, b"1\ta\n", "TabSeparated")
    assert headers["X-ClickHouse-Timezone"] == "UTC"
    status, _, body = http(clickhouse_server, "SELECT 1 AS x", default_format="JSONEachRow")
    assert body == b'{"x":1}\n'

    # GET is read-only, as on a real server.
    status, headers, _ = http(
        clickhouse_server,
        "CREATE TABLE g (a UInt8) ENGINE = Memory",
        method="GET",
        database=database,
    )
    assert headers["X-ClickHouse-Exception-Code"] == "164"

    # Query in the URL, data in the body, parsed by ClickHouse's own input format.
    http(
        clickhouse_server,
        "CREATE TABLE r (a UInt32, b String) ENGINE = MergeTree ORDER BY a",
        database=database,
    )
    status, headers, _ = http(
        clickhouse_server, "INSERT INTO r FORMAT TSV", b"1\tx\n2\ty\n", database=database
    )
    assert status == 200 and "X-ClickHouse-Format" not in headers
    assert json.loads(headers["X-ClickHouse-Summary"])["written_rows"] == "2"
    status, headers, _ = http(
        clickhouse_server, "INSERT INTO r FORMAT TSV", b"3\tz\nnot-a-number\tw\n", database=database
    )
    assert status == 400 and headers["X-ClickHouse-Exception-Code"] == "27"
    _, _, body = http(clickhouse_server, "SELECT sum(a), groupArray(b) FROM r", database=database)
    assert body == b"3\t['x','y']\n"

    # Responses are compressed when asked, as ClickHouse does with enable_http_compression.
    _, headers, body = http(
        clickhouse_server,
        "SELECT number FROM numbers(1000)",
        headers={"Accept-Encoding": "gzip"},
        enable_http_compression="1",
    )
    import gzip

    assert headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body).splitlines()[-1] == b"999"

    # A SET holds for later requests of the same session only.
    client = connect(clickhouse_url)
    client.command("SET max_block_size = 1234")
    assert client.command("SELECT getSetting('max_block_size')") == 1234
    assert connect(clickhouse_url).command("SELECT getSetting('max_block_size')") != 1234


def test_parallel_clients_all_rows_land(clickhouse_url: str) -> None:
    import numpy as np

    connect(clickhouse_url).command(
        "CREATE TABLE p (writer UInt8, i UInt64) ENGINE = MergeTree ORDER BY (writer, i)"
    )
    errors = []

    def write(writer: int) -> None:
        try:
            client = connect(clickhouse_url)
            for batch in range(10):
                rows = np.arange(batch * 1000, (batch + 1) * 1000, dtype=np.uint64)
                client.insert(
                    "p",
                    [np.full(1000, writer, dtype=np.uint8), rows],
                    column_names=["writer", "i"],
                    column_oriented=True,
                )
                client.query("SELECT writer, count() FROM p GROUP BY writer")
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert connect(clickhouse_url).query(
        "SELECT writer, count(), uniqExact(i) FROM p GROUP BY writer ORDER BY writer"
    ).result_rows == [(0, 10_000, 10_000), (1, 10_000, 10_000)]


def test_data_survives_a_restart(tmp_path: Any) -> None:
    with start_clickhouse(tmp_path / "data", "admin", "s3cret") as server:
        client = server.client()
        client.command("CREATE DATABASE keep")
        client.command("CREATE TABLE keep.k (a UInt64) ENGINE = MergeTree ORDER BY a")
        client.insert("keep.k", [list(range(1000))], column_names=["a"], column_oriented=True)
    assert server.process.returncode == 0, server.log()
    with start_clickhouse(tmp_path / "data", "admin", "s3cret") as server:
        assert server.client(database="keep").command("SELECT count(), sum(a) FROM k") == [
            "1000",
            "499500",
        ]
