"""Shared fixtures: a real ``hotspan server`` process on 127.0.0.1 and its data directory."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import httpx
import pytest

from .helpers import GO, TLS, GoProfiles, build_go_profiles

# The order pytest-xdist hands out whole files in, with --no-loadscope-reorder
# (scripts/test.sh).  The longest files of each phase go first, so that none of them is left
# for last, one worker running it while the others are done (xdist's own order, the files with
# the most tests first, put test_delivery.py near the end): in the timing phase the busy agent
# modules (about a minute each, so that the two go one a worker), then control and agent (half
# a minute); in the other, alert deliveries waiting on their intervals, servers over one
# ClickHouse, the browser (most of a minute each on two cores).  The browser
# tests (tests/ui/) go after all the others: from the first one on, Playwright's event loop
# runs on the worker's main thread for the rest of the session, and a later test there that
# runs an event loop of its own, or Playwright's sync API, would fail.
LONGEST_FIRST = (
    "tests/agent/test_busy.py",
    "tests/agent/test_control.py",
    "tests/agent/test_busy_server.py",
    "tests/agent/test_agent.py",
    "tests/agent/test_pull.py",
    "tests/alerts/test_delivery.py",
    "tests/store/test_clickhouse.py",
    "tests/ui/test_layout_ui.py",
    "tests/alerts/test_alerts.py",
    "tests/server/tempo/test_traces_api.py",
    "tests/ui/test_profiles_ui.py",
    "tests/ui/test_alerts_ui.py",
    "tests/server/test_auth.py",
    "tests/agent/test_run.py",
    "tests/store/test_clickhouse_search.py",
    "tests/server/test_scrape.py",
    "tests/cli/test_query_export.py",
    "tests/cli/test_record.py",
    "tests/agent/test_code_lifetime.py",
    "tests/server/api/test_agent_settings.py",
)
_ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list) -> None:
    def rank(item: pytest.Item) -> Tuple[bool, int]:
        path = item.path.relative_to(_ROOT).as_posix()
        longest = LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)
        return path.startswith("tests/ui/"), longest

    items.sort(key=rank)  # stable: every other test keeps its place


SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FIXTURES = SHARED / "fixtures" / "pyroscope-testdata" / "pkg"


def shared_fixture(relative: str) -> Path:
    """A file from ../shared/fixtures/pyroscope-testdata/pkg, or skip with a clear reason."""
    path = FIXTURES / relative
    if not path.exists():
        pytest.skip(
            f"conformance fixture {relative} not found: ../shared/ (the team's shared fixtures) "
            "is absent in this checkout"
        )
    return path


@dataclass
class RunningServer:
    process: subprocess.Popen
    url: str
    data_dir: Path
    otlp_http_url: Optional[str] = None  # the OTLP-only port (4318 by default)
    otlp_grpc_address: Optional[str] = None  # host:port of OTLP/gRPC (4317 by default)

    def client(self, **kwargs) -> httpx.Client:  # type: ignore[no-untyped-def]
        kwargs.setdefault("timeout", 30)
        kwargs.setdefault("verify", TLS)
        return httpx.Client(base_url=self.url, **kwargs)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)


def start_server(
    data_dir: Path, extra_args: Optional[List[str]] = None, env: Optional[dict] = None
) -> RunningServer:
    # HOTSPAN_TEST_SERVER_PYTHON: the server on another interpreter than the agent under test
    # (scripts/matrix.sh on free-threaded builds, where the server's DuckDB has no wheel).
    python = os.environ.get("HOTSPAN_TEST_SERVER_PYTHON") or sys.executable
    cmd = [python, "-m", "hotspan", "server", "--port", "0", "--data-dir", str(data_dir)]
    extra_args = list(extra_args or [])
    # Any free port for the OTLP receivers, so that servers of parallel tests never collide.
    for option in ("--otlp-http-port", "--otlp-grpc-port"):
        if option not in extra_args:
            extra_args += [option, "0"]
    # Tests push data stamped in 2023: keep it unless a test is about retention.
    if "--retention" not in extra_args:
        extra_args += ["--retention", "0"]
    proc = subprocess.Popen(
        cmd + extra_args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    line = ""
    otlp_http = otlp_grpc = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        m = re.search(r"OTLP/HTTP on (http://[^\s,]+)", line)
        otlp_http = m.group(1) if m else otlp_http
        m = re.search(r"OTLP/gRPC on ([^\s,]+)", line)
        otlp_grpc = m.group(1) if m else otlp_grpc
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return RunningServer(proc, m.group(1), data_dir, otlp_http, otlp_grpc)
    proc.kill()
    raise RuntimeError(f"server did not start; last line: {line!r}")


@contextlib.contextmanager
def running_server(
    data_dir: Path, extra_args: Optional[List[str]] = None, env: Optional[dict] = None
) -> Iterator[RunningServer]:
    """A server for the length of a ``with`` block (or a fixture's ``yield``)."""
    srv = start_server(data_dir, extra_args, env)
    try:
        yield srv
    finally:
        if srv.process.poll() is None:
            srv.stop()
        if srv.process.stdout:
            srv.process.stdout.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RunningServer]:
    with running_server(tmp_path / "data") as srv:
        yield srv


@pytest.fixture(scope="module")
def module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("server") / "data")
    try:
        yield srv
    finally:
        if srv.process.poll() is None:
            srv.stop()
        if srv.process.stdout:
            srv.process.stdout.close()


@pytest.fixture(scope="session")
def go_profiles(tmp_path_factory: pytest.TempPathFactory) -> GoProfiles:
    """Real Go CPU and heap profiles, written by runtime/pprof in a program built once per
    session (tests.helpers.GO_PROFILES_PROGRAM); skips only where ``go`` is not installed."""
    if GO is None:
        pytest.skip("`go` is not on PATH (it builds the program that writes the Go profiles)")
    return build_go_profiles(tmp_path_factory.mktemp("go-profiles"))
