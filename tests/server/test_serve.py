"""The server started in-process from a ServerConfig alone (server.serve), without the CLI:
its ports bound, its answers on each, and a clean stop."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from hotspan.server.config import ServerConfig
from hotspan.server.serve import MAIN_PORT, OTLP_HTTP_PORT, ListenError, bind
from tests.helpers import TLS


def _wait_ready(url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2, verify=TLS).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("the server did not become ready")


def test_bind_starts_the_whole_server_and_run_stops_it(tmp_path: Path) -> None:
    config = ServerConfig(
        port=0, otlp_http_port=0, otlp_grpc_port=0, data_dir=str(tmp_path / "data")
    )
    server = bind(config)
    assert server.port != 0
    # Alert links name the port bound, not the 0 that asked for any.
    assert config.external_url == server.url == f"http://127.0.0.1:{server.port}"
    otlp_http = next(r for r in server.receivers if r.startswith("OTLP/HTTP"))
    assert server.receivers[1].startswith("OTLP/gRPC on 127.0.0.1:")
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        _wait_ready(server.url)
        otlp_url = otlp_http.split(" on ")[1]
        # The OTLP port takes the OTLP paths only; the main port the rest.
        refused = httpx.get(otlp_url + "/ready", timeout=5, verify=TLS)
        assert refused.status_code == 404
        assert refused.text.startswith("this port takes OTLP only")
        taken = httpx.post(
            otlp_url + "/v1/traces",
            content=b"",
            headers={"content-type": "application/x-protobuf"},
            timeout=5,
            verify=TLS,
        )
        assert taken.status_code == 200
    finally:
        server.server.should_exit = True
        thread.join(30)
    assert not thread.is_alive()
    with pytest.raises(httpx.TransportError):
        httpx.get(server.url + "/ready", timeout=2, verify=TLS)


def test_a_port_in_use_is_a_listen_error_naming_it(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(ListenError) as main:
            bind(ServerConfig(port=port, data_dir=str(tmp_path / "a")))
        assert (main.value.what, main.value.port) == (MAIN_PORT, port)
        with pytest.raises(ListenError) as otlp:
            bind(
                ServerConfig(
                    port=0, otlp_http_port=port, otlp_grpc_port=None, data_dir=str(tmp_path / "b")
                )
            )
        assert (otlp.value.what, otlp.value.port) == (OTLP_HTTP_PORT, port)
        # The store of a server that failed to start was closed: another can open it.
        bind(
            ServerConfig(
                port=0, otlp_http_port=None, otlp_grpc_port=None, data_dir=str(tmp_path / "b")
            )
        ).state.store.close()
    finally:
        taken.close()
