"""Talking to ClickHouse: the store URL, clients, and what its errors mean for hotspan."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple
from urllib.parse import parse_qsl, unquote, urlsplit

from hotspan.store.base import StoreClosed, StoreError, StoreUnavailable

SCHEMES = ("clickhouse://", "clickhouses://")
# Error codes after which trying again later may work: the server is overloaded, restarting,
# or lost its replicas' coordinator.  Anything else is a fault of the statement.
TRANSIENT_CODES = frozenset(
    {
        159,  # TIMEOUT_EXCEEDED
        202,  # TOO_MANY_SIMULTANEOUS_QUERIES
        209,  # SOCKET_TIMEOUT
        210,  # NETWORK_ERROR
        241,  # MEMORY_LIMIT_EXCEEDED
        242,  # TABLE_IS_READ_ONLY (a replica without Keeper)
        252,  # TOO_MANY_PARTS
        319,  # UNKNOWN_STATUS_OF_INSERT
        425,  # SYSTEM_ERROR
        999,  # KEEPER_EXCEPTION
    }
)
# Lists of ids are inlined into the SQL (they are numbers the server produced); ClickHouse
# parses at most ``max_query_size`` bytes of a query, so long lists go in several queries.
IDS_PER_QUERY = 10_000


class ClickHouseURL:
    """``clickhouse://user:password@host:8123/database?setting=value`` (``clickhouses://``:
    TLS on 8443).  Query parameters other than ``cluster`` are ClickHouse settings."""

    def __init__(self, url: str) -> None:
        if not url.startswith(SCHEMES):
            raise StoreError(f"not a ClickHouse URL: {url!r} (clickhouse://host:8123/database)")
        parts = urlsplit(url)
        options = dict(parse_qsl(parts.query))
        self.secure = parts.scheme == "clickhouses"
        self.host = parts.hostname or "localhost"
        try:
            self.port = parts.port or (8443 if self.secure else 8123)
        except ValueError:
            raise StoreError(f"bad port in {url!r}") from None
        self.username = unquote(parts.username) if parts.username else "default"
        self.password = unquote(parts.password) if parts.password else ""
        self.database = unquote(parts.path.strip("/")) or "default"
        self.cluster = options.pop("cluster", None)
        self.settings: Dict[str, str] = options

    def redacted(self) -> str:
        """The URL without its password, for messages."""
        scheme = "clickhouses" if self.secure else "clickhouse"
        return f"{scheme}://{self.username}@{self.host}:{self.port}/{self.database}"


def store_error(exc: BaseException, what: str) -> StoreError:
    """The StoreError for a clickhouse-connect exception: StoreUnavailable when ClickHouse
    could not be reached or asked to be tried later."""
    if isinstance(exc, StoreError):
        return exc
    from clickhouse_connect.driver.exceptions import OperationalError

    reason = reason_of(exc)
    code = getattr(exc, "code", None)
    if isinstance(exc, (OperationalError, OSError)) or code in TRANSIENT_CODES:
        return StoreUnavailable(f"{what}: {reason}")
    return StoreError(f"{what}: {reason}")


def reason_of(exc: BaseException) -> str:
    """The first line of an error, without clickhouse-connect's preamble."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    marker = "server response: "
    return line.split(marker, 1)[1] if marker in line else line


def chunks(ids: Sequence[Any], size: int = IDS_PER_QUERY) -> Iterator[Sequence[Any]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def in_list(values: Sequence[Any]) -> str:
    """A parenthesised IN list of integers."""
    return "(" + ",".join(str(int(v)) for v in values) + ")" if len(values) else "(NULL)"


def quote(text: str) -> str:
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


class Clients:
    """One clickhouse-connect client per thread: a client holds per-query state, and the
    HTTP interface needs no server-side session, so threads never wait for each other here."""

    def __init__(self, url: ClickHouseURL, cluster: Optional[str]) -> None:
        self.url = url
        self.settings: Dict[str, Any] = {
            # The longest IN list a query carries is IDS_PER_QUERY ids, plus the series.
            "max_query_size": 16 * 1024 * 1024,
            **url.settings,
        }
        if cluster:
            # Acknowledge a push once a quorum of each shard's replicas has it, read from
            # replicas in a fixed order (read-your-writes as far as replication allows), and
            # keep trace-id subqueries on each shard (spans are sharded by trace id).
            self.settings.setdefault("insert_distributed_sync", 1)
            self.settings.setdefault("insert_quorum", "auto")
            self.settings.setdefault("insert_quorum_parallel", 1)
            self.settings.setdefault("load_balancing", "in_order")
            self.settings.setdefault("distributed_product_mode", "local")
        self._local = threading.local()
        self._all: List[Any] = []
        self._lock = threading.Lock()
        self.closed = False

    def connect(self, database: Optional[str] = None) -> Any:
        import clickhouse_connect

        return clickhouse_connect.get_client(
            host=self.url.host,
            port=self.url.port,
            username=self.url.username,
            password=self.url.password,
            database=database or self.url.database,
            secure=self.url.secure,
            autogenerate_session_id=False,
            settings=self.settings,
            # Short: a writer waiting on an unreachable host holds every push behind it.
            connect_timeout=3,
            send_receive_timeout=300,
        )

    def get(self) -> Any:
        if self.closed:
            raise StoreClosed("store is closed")
        client = getattr(self._local, "client", None)
        if client is None:
            try:
                client = self.connect()
            except Exception as exc:  # noqa: BLE001
                raise store_error(exc, "cannot reach ClickHouse") from exc
            self._local.client = client
            with self._lock:
                self._all.append(client)
        return client

    def query(
        self,
        sql: str,
        parameters: Optional[Mapping[str, Any]] = None,
        binary: Sequence[str] = (),
    ) -> Any:
        """The result of a query; the ``binary`` columns as bytes (String is read as text)."""
        formats = {name: "bytes" for name in binary} or None
        client = self.get()
        try:
            return client.query(sql, parameters=parameters, column_formats=formats)
        except Exception as exc:  # noqa: BLE001
            raise store_error(exc, "ClickHouse query failed") from exc

    def command(self, sql: str, parameters: Optional[Mapping[str, Any]] = None) -> Any:
        client = self.get()
        try:
            return client.command(sql, parameters=parameters)
        except Exception as exc:  # noqa: BLE001
            raise store_error(exc, "ClickHouse command failed") from exc

    def close(self) -> None:
        self.closed = True
        with self._lock:
            clients, self._all = self._all, []
        for client in clients:
            with contextlib.suppress(Exception):  # closing: nothing left to tell
                client.close()


# A fact insert that could not reach ClickHouse is tried again after these pauses (with the
# same deduplication token) before its pushes are failed.
INSERT_RETRY_PAUSES_S = (0.5,)


class Insert(NamedTuple):
    """Rows of one table, as columns: ``columns`` by name, ``types`` their ClickHouse types."""

    table: str
    columns: Dict[str, Any]
    types: Tuple[str, ...]


def insert_columns(clients: Clients, insert: Insert, token: Optional[str] = None) -> None:
    """Write the rows.  With a deduplication ``token`` (facts: spans, samples) an insert that
    could not reach ClickHouse is tried again: ClickHouse keeps one copy whatever landed."""
    client = clients.get()
    settings = {"insert_deduplication_token": token} if token else None
    pauses = INSERT_RETRY_PAUSES_S if token else ()
    for attempt in range(len(pauses) + 1):
        try:
            client.insert(
                insert.table,
                list(insert.columns.values()),
                column_names=list(insert.columns.keys()),
                column_type_names=list(insert.types),
                column_oriented=True,
                settings=settings,
            )
            return
        except Exception as exc:  # noqa: BLE001
            error = store_error(exc, f"cannot write {insert.table}")
            if attempt == len(pauses) or not isinstance(error, StoreUnavailable):
                raise error from exc
            time.sleep(pauses[attempt])
