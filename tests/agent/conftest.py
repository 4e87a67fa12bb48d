"""The agent's tests share one ``hotspan server`` for the whole run.

Each test's program pushes under a service name of its own (a fresh uuid) and every query
selects that name, so a test never sees another's profiles; a server per module would only
add its start (a couple of seconds each, in the suite's serial phase) to the run."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.conftest import RunningServer, running_server


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("agent-server") / "data") as srv:
        yield srv


@pytest.fixture(scope="module")
def module_server(agent_server: RunningServer) -> RunningServer:
    """The shared server, under the name the tests (and tests/conftest.py) know it by."""
    return agent_server
