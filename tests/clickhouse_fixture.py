"""Start the chdb-backed ClickHouse HTTP fixture (tests/clickhouse_http.py) for tests and benches.

In a test module (the redundant ``as`` marks a re-export, so ruff's F401 and F811 stay quiet)::

    from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
    from tests.clickhouse_fixture import clickhouse_url as clickhouse_url

    def test_something(clickhouse_url):  # clickhouse://user:pass@127.0.0.1:PORT/hotspan_test_...
        ...

``clickhouse_server`` is one server for the whole session (its data in a temporary directory);
``clickhouse_url`` gives each test a database of its own on it. Both skip the test when chdb or
clickhouse-connect is not installed. Benchmarks call :func:`start_clickhouse` directly.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Union
from urllib.parse import quote, urlencode

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SKIP_REASON = (
    "ClickHouse tests need chdb and clickhouse-connect (pip install chdb clickhouse-connect; "
    "scripts/test.sh installs them)"
)
_MODULES = ("chdb", "clickhouse_connect")
# The session server's credentials: tests then go through authentication as production does.
TEST_USER = "hotspan"
TEST_PASSWORD = "hotspan-test"


def clickhouse_available() -> bool:
    """True when both chdb (the engine) and clickhouse-connect (the client) are importable."""
    return all(importlib.util.find_spec(name) is not None for name in _MODULES)


@dataclass
class ClickHouseProcess:
    """A running fixture server: a child process serving ClickHouse HTTP over a chdb data dir."""

    process: subprocess.Popen
    host: str
    port: int
    path: Path
    user: Optional[str] = None
    password: Optional[str] = None
    log_path: Optional[Path] = None
    _log_file: Any = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """``clickhouse://user:pass@host:port/default``."""
        return self.url_for("default")

    def url_for(self, database: str) -> str:
        user = quote(self.user or "default", safe="")
        password = quote(self.password or "", safe="")
        return f"clickhouse://{user}:{password}@{self.host}:{self.port}/{quote(database, safe='')}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def command(self, sql: str, database: Optional[str] = None, timeout: float = 60) -> str:
        """Run one statement over plain HTTP (no clickhouse-connect needed) and return its text."""
        params = {"database": database} if database else {}
        request = urllib.request.Request(
            f"{self.http_url}?{urlencode(params)}", data=sql.encode(), method="POST"
        )
        credentials = f"{self.user or 'default'}:{self.password or ''}".encode()
        request.add_header("Authorization", "Basic " + base64.b64encode(credentials).decode())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise RuntimeError(f"ClickHouse fixture: {detail}") from None

    def client(self, database: str = "default", **kwargs: Any) -> Any:
        """A clickhouse-connect client on this server."""
        import clickhouse_connect

        return clickhouse_connect.get_client(
            host=self.host,
            port=self.port,
            username=self.user or "default",
            password=self.password or "",
            database=database,
            **kwargs,
        )

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30) -> Optional[int]:
        """SIGTERM (chdb closes cleanly, so the data directory can be reopened), then SIGKILL."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.process.returncode

    def __enter__(self) -> ClickHouseProcess:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_clickhouse(
    path: Union[str, Path],
    user: Optional[str] = None,
    password: Optional[str] = None,
    *,
    port: int = 0,
    connections: int = 0,
    timeout: float = 60.0,
) -> ClickHouseProcess:
    """Start ``python -m tests.clickhouse_http`` on ``path`` and wait until it listens.

    ``port=0`` picks a free port. The server's output goes to ``<path>.log``; it is quoted in the
    error when the server does not come up within ``timeout`` seconds.
    """
    if not clickhouse_available():
        raise RuntimeError(SKIP_REASON)
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    ready_dir = Path(tempfile.mkdtemp(prefix="clickhouse-ready-"))
    ready_file = ready_dir / "port"
    log_path = path.parent / f"{path.name}.log"
    command = [
        sys.executable,
        "-m",
        "tests.clickhouse_http",
        "--path",
        str(path),
        "--port",
        str(port),
        "--ready-file",
        str(ready_file),
    ]
    if user is not None:
        command += ["--user", user, "--password", password or ""]
    if connections:
        command += ["--connections", str(connections)]
    log_file = open(log_path, "ab")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    server = ClickHouseProcess(process, "127.0.0.1", 0, path, user, password, log_path, log_file)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if ready_file.exists():
                server.port = int(ready_file.read_text())
                return server
            if process.poll() is not None:
                raise RuntimeError(
                    f"ClickHouse fixture exited with {process.returncode}:\n{server.log()[-4000:]}"
                )
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(
                    f"ClickHouse fixture not ready after {timeout:.0f}s:\n{server.log()[-4000:]}"
                )
            time.sleep(0.05)
    finally:
        with contextlib.suppress(OSError):
            ready_file.unlink()
        with contextlib.suppress(OSError):
            ready_dir.rmdir()


@pytest.fixture(scope="session")
def clickhouse_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseProcess]:
    """One fixture server for the test session, with a user and password."""
    if not clickhouse_available():
        pytest.skip(SKIP_REASON)
    server = start_clickhouse(
        tmp_path_factory.mktemp("clickhouse") / "data", TEST_USER, TEST_PASSWORD
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clickhouse_url(clickhouse_server: ClickHouseProcess) -> Iterator[str]:
    """``clickhouse://user:pass@127.0.0.1:PORT/hotspan_test_<uuid>``: a fresh database per test."""
    database = f"hotspan_test_{uuid.uuid4().hex}"
    clickhouse_server.command(f"CREATE DATABASE {database}")
    yield clickhouse_server.url_for(database)
    if clickhouse_server.process.poll() is None:
        with contextlib.suppress(Exception):
            clickhouse_server.command(f"DROP DATABASE IF EXISTS {database}")
