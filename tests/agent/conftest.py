"""The agent's tests share one ``hotspan server`` for the whole run.

Each test's program pushes under a service name of its own (a fresh uuid) and every query
selects that name, so a test never sees another's profiles; a server per module would only
add its start (a couple of seconds each, in the suite's serial phase) to the run.

The modules that judge sampling, overhead or timing against the clocks are marked ``timing``:
scripts/test.sh runs those on their own (two files at a time), and the others beside the rest
of the suite (crash checks under valgrind, encoding, transport, redaction, symbols: nothing a busy
neighbour changes)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.conftest import RunningServer, running_server

TIMING_MODULES = frozenset(
    (
        "test_agent",
        "test_alloc",
        "test_busy",
        "test_busy_server",
        "test_conditions",
        "test_control",
        "test_governor",
        "test_locks",
        "test_pull",
        "test_sampler",
        "test_span_stats",
        "test_threads",
        "test_turns",
    )
)


def pytest_collection_modifyitems(items: list) -> None:
    # The order the files are handed out in (the longest first) is tests/conftest.py's.
    here = Path(__file__).parent
    for item in items:
        if item.path.parent == here and item.path.stem in TIMING_MODULES:
            item.add_marker(pytest.mark.timing)


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("agent-server") / "data") as srv:
        yield srv


@pytest.fixture(scope="module")
def module_server(agent_server: RunningServer) -> RunningServer:
    """The shared server, under the name the tests (and tests/conftest.py) know it by."""
    return agent_server
