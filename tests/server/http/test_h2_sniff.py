"""The main port's HTTP/2 hand-over (server.http.h2_sniff), byte for byte, in one event loop.

uvicorn (the server's own HTTP protocol class, as ``hotspan server`` runs it) serves a small
ASGI app on two sockets, a main port and another one (as the OTLP/HTTP port); the gRPC
server's place is taken by a plain TCP server on loopback that records what reaches it, so
that bytes, ends of stream and closes can be checked exactly.  No sleeps but the few
milliseconds that make a client's writes arrive as separate reads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import socket
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, List, Optional

import pytest
import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from hotspan.server.http import h2_sniff

PREFACE = h2_sniff.PREFACE
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Runner = Callable[[Callable[[], Awaitable[None]]], None]


async def _app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    body = f"path {scope['path']}".encode()
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Harness:
    def __init__(self, main_port: int, other_port: int, backend_port: int) -> None:
        self.main_port = main_port
        self.other_port = other_port
        self.backend_port = backend_port
        self.backend_connections = 0
        self.received: List[bytes] = []  # per backend connection, once it ended

    async def open(self, port: Optional[int] = None, source: Optional[str] = None):  # type: ignore[no-untyped-def]
        local = (source, 0) if source else None
        return await asyncio.open_connection("127.0.0.1", port or self.main_port, local_addr=local)


def _bound() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 10)


async def _echo_end(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The backend by default: read to the end, then say how much came, then close."""
    data = await reader.read()
    writer.write(b"got %d" % len(data))
    await writer.drain()
    writer.close()


@asynccontextmanager
async def harness(
    handler: Handler = _echo_end,
    max_connections: Optional[int] = None,
    backend_up: bool = True,
    grpc_port: Optional[int] = None,
) -> AsyncIterator[Harness]:
    main, other = _bound(), _bound()
    received: List[bytes] = []

    async def on_backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        h.backend_connections += 1
        await handler(reader, writer)

    backend = await asyncio.start_server(on_backend, "127.0.0.1", 0)
    backend_port = backend.sockets[0].getsockname()[1]
    if not backend_up:
        backend.close()
        await backend.wait_closed()
    h = Harness(main.getsockname()[1], other.getsockname()[1], grpc_port or backend_port)
    h.received = received
    protocol = h2_sniff.sniffing(AutoHTTPProtocol, h.backend_port, h.main_port, max_connections)
    config = uvicorn.Config(_app, http=protocol, lifespan="off", log_level="critical")
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[main, other]))
    while not server.started:
        await asyncio.sleep(0.005)
    try:
        yield h
    finally:
        server.should_exit = True
        await task
        if backend_up:
            backend.close()
        main.close()
        other.close()


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner:
    """Run a test's coroutine on asyncio's loop, and on uvloop's (what uvicorn picks when
    it is installed, as hotspan's dependencies have it outside Windows)."""
    if request.param == "asyncio":
        new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    else:
        new_loop = pytest.importorskip("uvloop").new_event_loop

    def on_its_own_thread(main: Callable[[], Awaitable[None]]) -> None:
        # A thread of its own: the test process's main thread may already run a loop (the UI
        # tests' Playwright does, and a worker of pytest -n runs them before these).
        def run_loop() -> None:
            loop = new_loop()
            try:
                loop.run_until_complete(main())
            finally:
                loop.close()

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(run_loop).result()

    return on_its_own_thread


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _without_gc(run: Runner, main: Callable[[], Awaitable[None]]) -> None:
    """Run with the cyclic garbage collector off: a socket the pipe left open would otherwise
    be closed, some time later, by the collection of its unreachable transport."""
    gc.disable()
    try:
        run(main)
    finally:
        gc.enable()


async def _settled(baseline: int) -> int:
    """Open file descriptors once closes have run their course (or 2 s went by)."""
    for _ in range(200):
        if _fds() <= baseline:
            break
        await asyncio.sleep(0.01)
    return _fds()


def test_preface_in_pieces_is_piped_byte_for_byte(run: Runner) -> None:
    async def main() -> None:
        async with harness() as h:
            reader, writer = await h.open()
            payload = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" * 3
            for piece in (b"P", PREFACE[1:5], PREFACE[5:] + payload):
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.02)  # separate reads on the server's side
            writer.write_eof()
            assert await _read_all(reader) == b"got %d" % (len(PREFACE) + len(payload))
            writer.close()

    run(main)


def test_http1_keep_alive_pipelining_and_a_leading_p_stay_uvicorns(run: Runner) -> None:
    async def main() -> None:
        async with harness() as h:
            reader, writer = await h.open()
            writer.write(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\nGET /b HTTP/1.1\r\nhost: x\r\n\r\n")
            await writer.drain()
            for path in (b"/a", b"/b"):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                assert await reader.readexactly(length) == b"path " + path
            # Same connection: a request whose first read is a prefix of the preface.
            writer.write(b"P")
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"OST /c HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(7) == b"path /c"
            writer.close()
            assert h.backend_connections == 0

    run(main)


def test_closed_once_both_sides_have_ended_no_socket_left(run: Runner) -> None:
    """Client half-closes, the gRPC side answers and closes: the old pipe kept both of its
    sockets open for good (each side half-closed, never closed)."""

    async def main() -> None:
        async with harness() as h:
            reader, writer = await h.open()  # warm up: the loop's own descriptors
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            await _read_all(reader)
            writer.close()
            baseline = await _settled(_fds())
            for _ in range(5):
                reader, writer = await h.open()
                writer.write(PREFACE + b"x" * 10)
                writer.write_eof()
                assert await _read_all(reader) == b"got %d" % (len(PREFACE) + 10)
                writer.close()
                await writer.wait_closed()
            assert await _settled(baseline) <= baseline

    _without_gc(run, main)


def test_a_half_close_from_the_grpc_side_is_passed_on(run: Runner) -> None:
    """The gRPC side ends first; the client can still send, then both close."""

    async def ends_first(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readexactly(len(PREFACE))
        writer.write(b"bye" if head == PREFACE else b"?")
        writer.write_eof()
        rest = await reader.read()
        received.append(rest)
        writer.close()

    received: List[bytes] = []

    async def main() -> None:
        async with harness(ends_first) as h:
            baseline = _fds()
            reader, writer = await h.open()
            writer.write(PREFACE)
            assert await _read_all(reader) == b"bye"  # and its end
            writer.write(b"after the end")
            writer.write_eof()
            for _ in range(200):
                if received:
                    break
                await asyncio.sleep(0.01)
            assert received == [b"after the end"]
            writer.close()
            await writer.wait_closed()
            assert await _settled(baseline) <= baseline

    _without_gc(run, main)


def test_only_the_main_port_hands_over(run: Runner) -> None:
    """The other port (OTLP/HTTP, OTLP only) must not reach the gRPC queries."""

    async def main() -> None:
        async with harness() as h:
            reader, writer = await h.open(h.other_port)
            writer.write(PREFACE + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            await writer.drain()
            answer = await _read_all(reader)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 400")
            writer.close()
            assert h.backend_connections == 0

    run(main)


@pytest.mark.parametrize("given", [True, False], ids=["max_connections", "default"])
def test_piped_connections_are_limited(
    run: Runner, given: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At most --max-connections piped connections, or DEFAULT_MAX_PIPES without it (set
    to 1 here: the cap must not be "none" when the option is not given)."""
    monkeypatch.setattr(h2_sniff, "DEFAULT_MAX_PIPES", 1 if not given else 1000)
    release = asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.write(b"done")
        writer.close()

    async def main() -> None:
        async with harness(held, max_connections=1 if given else None) as h:
            first_reader, first = await h.open()
            first.write(PREFACE)
            await first.drain()
            while h.backend_connections == 0:
                await asyncio.sleep(0.005)
            reader, writer = await h.open()
            writer.write(PREFACE)
            assert await _read_all(reader) == b""  # refused: closed
            writer.close()
            assert h.backend_connections == 1
            release.set()
            assert await _read_all(first_reader) == b"done"
            first.close()
            # The first one gone, there is room again.
            release.clear()
            reader, writer = await h.open()
            writer.write(PREFACE)
            await writer.drain()
            while h.backend_connections == 1:
                await asyncio.sleep(0.005)
            release.set()
            assert await _read_all(reader) == b"done"
            writer.close()
            # HTTP/1.1 is not counted against it.
            reader, writer = await h.open()
            writer.write(b"GET /d HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert (await _read_all(reader)).endswith(b"path /d")
            writer.close()

    run(main)


def test_one_address_holds_an_eighth_of_the_pipes(run: Runner) -> None:
    """Piped connections outlive the header deadline: one client that opened many and sent
    nothing more would hold them all.  Any one address gets an eighth of the limit (at
    least MIN_PER_ADDRESS); another address is served meanwhile."""
    release = asyncio.Event()

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()
        writer.close()

    async def main() -> None:
        limit = 16 * h2_sniff.MIN_PER_ADDRESS  # an eighth: 2 * MIN_PER_ADDRESS each
        async with harness(held, max_connections=limit) as h:
            kept = []
            for _ in range(limit // 8):
                reader, writer = await h.open()
                writer.write(PREFACE)
                kept.append((reader, writer))
            while h.backend_connections < limit // 8:
                await asyncio.sleep(0.005)
            reader, writer = await h.open()
            writer.write(PREFACE)
            assert await _read_all(reader) == b""  # refused: closed
            writer.close()
            reader, writer = await h.open(source="127.0.0.2")
            writer.write(PREFACE)
            while h.backend_connections < limit // 8 + 1:
                await asyncio.sleep(0.005)
            writer.close()
            release.set()
            for _, w in kept:
                w.close()

    run(main)


def test_grpc_server_unreachable_closes_the_connection_only(run: Runner) -> None:
    async def main() -> None:
        async with harness(backend_up=False) as h:
            reader, writer = await h.open()
            writer.write(PREFACE)
            assert await _read_all(reader) == b""
            writer.close()
            reader, writer = await h.open()
            writer.write(b"GET /e HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            assert (await _read_all(reader)).endswith(b"path /e")
            writer.close()

    run(main)


def test_a_grpc_server_that_does_not_accept_is_given_up_on(
    run: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its accept queue full, a connect to it hangs (SYNs dropped): the client must not."""
    monkeypatch.setattr(h2_sniff, "CONNECT_TIMEOUT_S", 0.3, raising=False)
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(full.getsockname())
        queued.append(s)

    async def main() -> None:
        async with harness(grpc_port=full.getsockname()[1]) as h:
            reader, writer = await h.open()
            writer.write(PREFACE)
            assert await _read_all(reader) == b""
            writer.close()

    try:
        run(main)
    finally:
        for s in [*queued, full]:
            s.close()


def test_backpressure_both_ways(run: Runner) -> None:
    """A side that does not read stops the other side's writes (they would otherwise pile
    up in the server's memory): far more than socket buffers hold never drains."""
    much = b"x" * (64 << 20)
    reading, done = asyncio.Event(), asyncio.Event()

    async def writes_much(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(PREFACE))
        writer.write(much)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(writer.drain(), 0.3)  # the client does not read
        reading.set()
        await done.wait()  # not reading what the client sends
        writer.close()

    async def main() -> None:
        async with harness(writes_much) as h:
            reader, writer = await h.open()
            writer.write(PREFACE)
            await asyncio.wait_for(reading.wait(), 10)
            writer.write(much)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(writer.drain(), 0.3)  # the gRPC side does not read
            done.set()
            writer.close()

    run(main)


def test_client_reads_stay_paused_while_the_grpc_side_backs_up_from_the_start(run: Runner) -> None:
    """What the client sent before the pipe was linked can already fill the gRPC side's
    buffers: its reads must then stay paused (the old pipe resumed them regardless)."""
    big = PREFACE + b"x" * (32 << 20)  # past loopback's socket buffers

    async def main() -> None:
        stalled = asyncio.Event()

        async def not_reading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await stalled.wait()
            writer.close()

        backend = await asyncio.start_server(not_reading, "127.0.0.1", 0)
        port = backend.sockets[0].getsockname()[1]
        handed: List[asyncio.Transport] = []

        class HandOver(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                handed.append(transport)  # type: ignore[arg-type]
                h2_sniff.pipe_to(transport, big, port, h2_sniff._Pipes(h2_sniff.DEFAULT_MAX_PIPES))

        front = await asyncio.get_running_loop().create_server(HandOver, "127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        while not handed or h2_sniff._PENDING:
            await asyncio.sleep(0.005)
        assert not handed[0].is_reading()
        writer.close()
        stalled.set()
        front.close()
        backend.close()

    run(main)


# An empty SETTINGS frame: what an HTTP/2 client sends after the preface.
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GOAWAY = 7


def _frame_types(data: bytes) -> List[int]:
    types, at = [], 0
    while at + 9 <= len(data):
        types.append(data[at + 3])
        at += 9 + int.from_bytes(data[at : at + 3], "big")
    return types


def test_an_idle_grpc_connection_is_closed_and_frees_its_pipe(run: Runner, tmp_path: Path) -> None:
    """The real query gRPC server behind the pipe, its idle time made short: a client that
    opens HTTP/2 and makes no call is sent GOAWAY and closed, and its pipe counts no more."""
    from hotspan.server.app import create_app
    from hotspan.server.config import ServerConfig
    from hotspan.server.tempo import grpc_api as tempo_grpc

    idle_s = 0.3
    state = create_app(ServerConfig(data_dir=str(tmp_path))).state.hotspan
    grpc_server, grpc_port = tempo_grpc.serve(state, idle_ms=int(idle_s * 1000))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with harness(grpc_port=grpc_port, max_connections=1) as h:
            for _ in range(2):  # the second gets the one pipe once the first is closed
                reader, writer = await h.open()
                began = loop.time()
                writer.write(PREFACE + SETTINGS)
                data = await asyncio.wait_for(reader.read(), 3)  # to the end: closed
                waited = loop.time() - began
                assert _frame_types(data)[0] == 4  # the server's SETTINGS: it was piped
                assert _frame_types(data)[-1] == GOAWAY and b"idle" in data
                assert idle_s * 0.6 < waited < idle_s + 2
                writer.close()

    try:
        run(main)
    finally:
        grpc_server.stop(None)
        state.store.close()
