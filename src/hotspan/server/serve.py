"""Start-up: the application, its listening sockets, the gRPC servers beside it and uvicorn's
server, from a ServerConfig alone.  ``hotspan server`` parses its options into the config and
calls :func:`bind`; tests and embedders start the same server the same way."""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, List, Optional

import uvicorn
from starlette.responses import PlainTextResponse
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from hotspan.server.app import create_app
from hotspan.server.config import ServerConfig
from hotspan.server.http.h2_sniff import sniffing
from hotspan.server.otlp import grpc_receiver
from hotspan.server.otlp.http_receiver import PATHS as OTLP_PATHS
from hotspan.server.state import ServerState
from hotspan.server.tempo import grpc_api

# What failed to listen, for ListenError.what.
MAIN_PORT = "port"
OTLP_HTTP_PORT = "otlp_http_port"
OTLP_GRPC_PORT = "otlp_grpc_port"
QUERY_GRPC = "query_grpc"


class ListenError(Exception):
    """A port could not be bound (``what``: one of MAIN_PORT, OTLP_HTTP_PORT, OTLP_GRPC_PORT,
    or QUERY_GRPC for the gRPC query server the main port pipes HTTP/2 to)."""

    def __init__(self, what: str, port: int, cause: OSError) -> None:
        super().__init__(f"{what} {port}: {cause}")
        self.what = what
        self.port = port
        self.cause = cause


class OTLPPortOnly:
    """Serves only the OTLP paths on the OTLP/HTTP port (4318); everything else stays on the
    main port.  ASGI middleware around the whole application."""

    def __init__(self, app: Any, port: int) -> None:
        self.app = app
        self.port = port

    async def __call__(self, scope, receive, send) -> None:
        on_otlp_port = (scope.get("server") or (None, None))[1] == self.port
        if scope["type"] == "http" and on_otlp_port and scope["path"] not in OTLP_PATHS:
            response = PlainTextResponse(
                "this port takes OTLP only: POST /v1/traces, /v1development/profiles\n",
                status_code=404,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class GracefulServer(uvicorn.Server):
    """Stops on SIGINT/SIGTERM like uvicorn (stop accepting, finish requests, close the
    store), then returns instead of re-raising the signal."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    return sock


def _display_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass
class BoundServer:
    """A server whose ports are bound and whose gRPC servers run; :meth:`run` serves HTTP
    until SIGINT/SIGTERM (or ``should_exit``), then stops everything and closes the store."""

    config: ServerConfig
    state: ServerState
    server: GracefulServer
    sockets: List[socket.socket]
    # The main port bound (not the 0 that asked for any).
    port: int
    # What listens besides the main port, for the start message ("OTLP/HTTP on http://...").
    receivers: List[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{_display_host(self.config.host)}:{self.port}"

    def run(self) -> None:
        self.server.run(sockets=self.sockets)


def bind(
    config: ServerConfig,
    *,
    max_connections: Optional[int] = None,
    log_level: str = "warning",
) -> BoundServer:
    """The server of ``config``, its ports bound and its gRPC servers started.  StoreError or
    RedactError when the application cannot be built, ListenError when a port cannot be
    bound (everything started is stopped again and the store closed)."""
    app: Any = create_app(config)
    state: ServerState = app.state.hotspan
    host = _display_host(config.host)
    sockets: List[socket.socket] = []
    receivers: List[str] = []
    what, port = MAIN_PORT, config.port
    try:
        sockets.append(listen(config.host, config.port))
        if config.otlp_http_port is not None:
            what, port = OTLP_HTTP_PORT, config.otlp_http_port
            sockets.append(listen(config.host, config.otlp_http_port))
            otlp_port = sockets[-1].getsockname()[1]
            app = OTLPPortOnly(app, otlp_port)
            receivers.append(f"OTLP/HTTP on http://{host}:{otlp_port}")
        if config.otlp_grpc_port is not None:
            what, port = OTLP_GRPC_PORT, config.otlp_grpc_port
            grpc_server, grpc_port = grpc_receiver.start(state, config.host, config.otlp_grpc_port)
            state.on_shutdown.append(lambda: grpc_server.stop(grace=5).wait())
            receivers.append(f"OTLP/gRPC on {host}:{grpc_port}")
        # Tempo's streaming queries, which reach it through the main port (http.h2_sniff).
        what, port = QUERY_GRPC, 0
        query_server, query_port = grpc_api.serve(state)
        state.on_shutdown.append(lambda: query_server.stop(grace=5).wait())
    except OSError as exc:
        for stop in state.on_shutdown:
            stop()
        for sock in sockets:
            sock.close()
        state.store.close()
        raise ListenError(what, port, exc) from exc
    main_port = int(sockets[0].getsockname()[1])
    if config.external_url is None:
        # Alert notifications link here: the port bound, not the 0 that asked for any.
        config.external_url = f"http://{host}:{main_port}"
    server = GracefulServer(
        uvicorn.Config(
            app,
            # uvicorn's HTTP/1.1, except that HTTP/2 connections (gRPC) to the main port go to
            # the gRPC query server; as many at once as HTTP connections.
            http=sniffing(
                AutoHTTPProtocol,
                query_port,
                main_port,
                max_connections,
                header_timeout_s=config.header_timeout_s,
            ),
            log_level=log_level,
            access_log=False,
            timeout_graceful_shutdown=30,
            limit_concurrency=max_connections,
        )
    )
    return BoundServer(config, state, server, sockets, main_port, receivers)


def serve(
    config: ServerConfig, *, max_connections: Optional[int] = None, log_level: str = "warning"
) -> None:
    """Bind and run the server of ``config`` until SIGINT/SIGTERM."""
    bind(config, max_connections=max_connections, log_level=log_level).run()
