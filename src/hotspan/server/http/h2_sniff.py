"""gRPC on the main port: connections that open with HTTP/2's preface go to the gRPC server.

Grafana's Tempo data source dials gRPC (cleartext HTTP/2, "prior knowledge") on the same
host:port as its HTTP calls.  uvicorn speaks HTTP/1.1 only, so the main port's protocol is
uvicorn's own with one addition: the first bytes of a connection are looked at, and a
connection that starts with ``PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n`` (which no HTTP/1.1
request does) is handed over, bytes as they are, to the gRPC query server on its loopback
port (server.tempo.grpc_api).  Everything else is uvicorn's, byte for byte; so is every
connection to another port of the same uvicorn (the OTLP/HTTP-only port takes OTLP only).

The hand-over is a transport-level pipe in the event loop, both ways, with backpressure: a
side whose writes back up stops the other side's reads until they drain.  An end of stream
(half-close) is passed on to the other side; once both sides have ended, or either is lost,
both connections are closed.  Piped connections leave uvicorn's connection count
(``--max-connections``) and have a limit of their own, the same number, or DEFAULT_MAX_PIPES
when it is not set, an eighth of which any one client address may hold; the gRPC server
closes idle and old connections (tempo/grpc_api.serve), and their pipes with them.

On every port, a connection that has not sent a whole request head (nor the HTTP/2 preface)
within ``--header-timeout`` of its opening or of its last response is closed, and does not
count against ``--max-connections`` meanwhile (server.http.header_deadline).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Dict, Optional, Type

from hotspan.server.http.header_deadline import with_header_deadline

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# The gRPC server is on loopback: it answers at once, or its accept queue is full.
CONNECT_TIMEOUT_S = 10.0
# Piped connections at once without --max-connections: each holds two sockets and a gRPC
# transport, and Grafana needs one per data source.
DEFAULT_MAX_PIPES = 256
# Piped connections any one address may hold, with a limit under 8 * this.
MIN_PER_ADDRESS = 4
# Tasks connecting pipes, kept referenced until done (the loop holds only weak references).
_PENDING: set[asyncio.Task[None]] = set()


class _End(asyncio.Protocol):
    """One side of a pipe: what it reads goes to its peer's transport."""

    def __init__(self, on_lost: Optional[Callable[[], None]] = None) -> None:
        self.on_lost = on_lost
        self.transport: Optional[asyncio.Transport] = None
        self.peer: Optional[_End] = None
        self.pending = bytearray()  # read before the pipe was linked
        self.eof = False  # this side has sent all it will send
        self.backed_up = False  # writes to this side are over its transport's high-water mark
        self.lost = False

    def linked(self) -> bool:
        return self.peer is not None and self.peer.transport is not None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if not self.linked():
            self.pending += data
        elif not self.peer.transport.is_closing():  # type: ignore[union-attr]
            # (uvloop raises on a write to a closed transport; asyncio drops it)
            self.peer.transport.write(data)  # type: ignore[union-attr]

    def eof_received(self) -> bool:
        # A transport whose reading is paused and resumed after its end of stream reports
        # it again: pass it on once.
        first, self.eof = not self.eof, True
        if not self.linked():
            return True  # passed on when the pipe is linked (_connect)
        return self.pass_eof(first)

    def pass_eof(self, first: bool = True) -> bool:
        """Tell the peer this side is done; False (close this side) when both are."""
        peer = self.peer
        assert peer is not None and peer.transport is not None
        if peer.eof or peer.transport.is_closing() or not peer.transport.can_write_eof():
            # Nothing more will flow either way: close both (each after what it buffered).
            # Left open, a pair ended both ways would hold its two sockets until the garbage
            # collector happened to find them.
            peer.transport.close()
            if self.transport is not None:
                self.transport.close()
            return False
        if first:
            try:
                peer.transport.write_eof()
            except (OSError, RuntimeError):  # its socket is gone already (reset): as lost
                peer.transport.close()
                return False
        return True  # the other direction may still carry data

    def pause_writing(self) -> None:
        # Our transport's buffer is full: stop reading what would be written to it.
        self.backed_up = True
        if self.linked():
            self.peer.transport.pause_reading()  # type: ignore[union-attr]

    def resume_writing(self) -> None:
        self.backed_up = False
        if self.linked():
            self.peer.transport.resume_reading()  # type: ignore[union-attr]

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.lost = True
        if self.linked():
            self.peer.transport.close()  # type: ignore[union-attr]  # after what is buffered
        if self.on_lost is not None:
            self.on_lost()


class _Pipes:
    """The piped connections open at once, up to a limit, and up to an eighth of it (at least
    MIN_PER_ADDRESS) from any one address: piped connections outlive the header deadline (the
    gRPC server closes them after MAX_CONNECTION_IDLE_MS without a call), so one client that
    opened enough of them and sent nothing more would lock everyone else out of gRPC."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.per_address = max(MIN_PER_ADDRESS, limit // 8)
        self.open = 0
        self.by_address: Dict[str, int] = {}

    def take(self, address: str) -> bool:
        """Count a new pipe from ``address``; False (not counted) when it must be refused."""
        held = self.by_address.get(address, 0)
        if self.open >= self.limit or held >= self.per_address:
            return False
        self.open += 1
        self.by_address[address] = held + 1
        return True

    def closed(self, address: str) -> None:
        self.open -= 1
        held = self.by_address.pop(address, 1) - 1
        if held:
            self.by_address[address] = held


async def _connect(client: _End, port: int, pipes: _Pipes, address: str) -> None:
    """Connect the pipe's upstream side to the gRPC server, then let the client's bytes flow."""
    loop = asyncio.get_running_loop()
    # The pipe counts until its upstream side is gone.
    upstream = _End(lambda: pipes.closed(address))
    try:
        await asyncio.wait_for(
            loop.create_connection(lambda: upstream, "127.0.0.1", port), CONNECT_TIMEOUT_S
        )
    except (OSError, asyncio.TimeoutError) as exc:
        pipes.closed(address)
        log.warning("cannot reach the gRPC server on 127.0.0.1:%d: %r", port, exc)
        if client.transport is not None:
            client.transport.close()
        return
    assert upstream.transport is not None and client.transport is not None
    upstream.peer, client.peer = client, upstream
    if client.lost or upstream.lost:
        client.transport.close()
        upstream.transport.close()
        return
    # Either side may have read bytes (or its end) before they were linked: the server's
    # SETTINGS frame can arrive before this coroutine resumes.
    for end in (client, upstream):
        if end.pending:
            end.peer.transport.write(bytes(end.pending))  # type: ignore[union-attr]
            end.pending.clear()
    for end in (client, upstream):
        if end.eof and not end.pass_eof():
            return
    # Unless the gRPC server's side already backs up with what the client sent.
    if not upstream.backed_up:
        client.transport.resume_reading()


def pipe_to(transport: asyncio.Transport, first: bytes, port: int, pipes: _Pipes) -> None:
    """Hand a connection over to 127.0.0.1:``port``, ``first`` being what it sent so far."""
    peer = transport.get_extra_info("peername")
    address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
    if not pipes.take(address):
        log.warning(
            "refusing a gRPC connection from %s: %d are open, %d of them from there",
            address or "?",
            pipes.open,
            pipes.by_address.get(address, 0),
        )
        transport.close()
        return
    client = _End()
    transport.set_protocol(client)
    client.connection_made(transport)
    client.pending += first
    transport.pause_reading()  # until the upstream side is connected
    task = asyncio.get_running_loop().create_task(_connect(client, port, pipes, address))
    _PENDING.add(task)
    task.add_done_callback(_PENDING.discard)


def sniffing(
    base: Type[asyncio.Protocol],
    grpc_port: int,
    main_port: Optional[int] = None,
    max_connections: Optional[int] = None,
    header_timeout_s: Optional[float] = None,
) -> Type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base``, handing HTTP/2 connections to the gRPC server on
    127.0.0.1:``grpc_port`` (pass it to ``uvicorn.Config(http=...)``): those to
    ``main_port`` only when given, at most ``max_connections`` at once (DEFAULT_MAX_PIPES
    when not given); connections without a whole request head (or preface) within
    ``header_timeout_s`` of opening or of their last response are closed (None or 0: no
    deadline)."""
    pipes = _Pipes(DEFAULT_MAX_PIPES if max_connections is None else max_connections)

    class H2Sniffing(base):  # type: ignore[valid-type, misc]
        _sniffed = b""
        _sniffing = True

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            local = transport.get_extra_info("sockname")
            if main_port is not None and not (isinstance(local, tuple) and local[1] == main_port):
                self._sniffing = False  # another port (OTLP/HTTP): uvicorn's alone

        def data_received(self, data: bytes) -> None:
            if self._sniffing:
                seen = self._sniffed + data
                if len(seen) < len(PREFACE) and PREFACE.startswith(seen):
                    self._sniffed = seen  # too few bytes yet to tell
                    return
                self._sniffing = False
                self._sniffed = b""
                if seen.startswith(PREFACE):
                    self.connections.discard(self)  # no longer uvicorn's connection
                    pipe_to(self.transport, seen, grpc_port, pipes)
                    return
                data = seen
            super().data_received(data)

    H2Sniffing.__name__ = H2Sniffing.__qualname__ = f"H2Sniffing{base.__name__}"
    # Outermost, so that it sees the bytes of a preface still being sniffed as well.
    return with_header_deadline(H2Sniffing, header_timeout_s)
