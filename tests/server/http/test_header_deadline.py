"""Connections that send no whole request head in time (server.http.header_deadline).

Half a request head, or half of HTTP/2's preface, then nothing: such connections must neither
lock other clients out with 503 (``--max-connections``) nor stay open past the deadline, on
the main port and on the OTLP/HTTP port, from a connection's opening and again from the end
of each response on a kept-alive one.  Checked against a real ``hotspan server`` (uvicorn's
httptools protocol, as it runs), and in-process with both of uvicorn's HTTP/1.1 protocol
classes, httptools' and h11's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable, Iterator, List, Sequence, Tuple, Type
from urllib.parse import urlsplit

import pytest
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hotspan.server.http import h2_sniff, header_deadline
from tests.conftest import RunningServer, running_server

HALF_HEAD = b"GET /ready HTTP/1.1\r\n"
HALF_PREFACE = b"PRI * HTTP/2.0\r\n"
REQUEST = b"GET /ready HTTP/1.1\r\nhost: x\r\n\r\n"
Stream = Tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _run(main: Callable[[], Awaitable[None]]) -> None:
    """On a thread of its own: the test process's main thread may run a loop already."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, main()).result()  # type: ignore[arg-type]


def _now() -> float:
    return asyncio.get_running_loop().time()


async def _open(port: int, data: bytes = b"") -> Stream:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def _response(reader: asyncio.StreamReader) -> int:
    """The status of the next response, its body read."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await asyncio.wait_for(reader.readexactly(length), 10)
    return int(head.split(b" ")[1])


async def _status(port: int, pieces: Sequence[bytes] = (REQUEST,), pause_s: float = 0) -> int:
    reader, writer = await _open(port)
    try:
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(pause_s)
            writer.write(piece)
            await writer.drain()
        return await _response(reader)
    finally:
        writer.close()


async def _closed_after(stream: Stream, since: float, timeout_s: float) -> float:
    """How long after ``since`` the server closed the connection (it sends nothing)."""
    reader, writer = stream
    try:
        rest = await asyncio.wait_for(reader.read(), timeout_s + 5)
    except asyncio.TimeoutError:
        pytest.fail(f"still open {timeout_s + 5:.1f}s on with a {timeout_s}s deadline")
    except ConnectionResetError:
        # Closed with bytes the client trickled still unread: the kernel answers with a reset.
        rest = b""
    finally:
        writer.close()
    assert rest == b""
    return _now() - since


def _assert_closed_at_deadline(waited: List[float], timeout_s: float) -> None:
    assert min(waited) >= timeout_s * 0.9, waited  # not before the deadline
    assert max(waited) < timeout_s + 3, waited  # and not long after it


async def half_heads_and_prefaces(
    main_port: int, other_port: int, limit: int, timeout_s: float
) -> None:
    """Twice the limit of half heads and of half prefaces on the main port, and of half heads
    on the other port: a client is served meanwhile, and they are all closed at the deadline."""
    began = _now()
    idle = [await _open(main_port, HALF_HEAD) for _ in range(2 * limit)]
    idle += [await _open(main_port, HALF_PREFACE) for _ in range(2 * limit)]
    idle += [await _open(other_port, HALF_HEAD) for _ in range(2 * limit)]
    assert await _status(main_port) == 200
    waited = await asyncio.gather(*(_closed_after(s, began, timeout_s) for s in idle))
    _assert_closed_at_deadline(waited, timeout_s)
    # Room for everyone once they are gone.
    assert await _status(main_port) == 200


async def keep_alive_trickling(main_port: int, limit: int, timeout_s: float) -> None:
    """Connections answered once, then trickling half a head a byte at a time: bytes do not
    extend the deadline that runs from their response, and they do not lock others out."""
    kept: List[Stream] = []
    answered: List[float] = []
    for _ in range(2 * limit):
        reader, writer = await _open(main_port, REQUEST)
        assert await _response(reader) == 200
        answered.append(_now())
        kept.append((reader, writer))

    async def trickle(writer: asyncio.StreamWriter) -> None:
        for byte in HALF_HEAD:
            await asyncio.sleep(timeout_s / 10)
            if writer.is_closing():
                return
            writer.write(bytes([byte]))

    trickling = [asyncio.ensure_future(trickle(w)) for _, w in kept]
    await asyncio.sleep(timeout_s / 5)
    assert await _status(main_port) == 200
    waited = await asyncio.gather(*(_closed_after(s, t, timeout_s) for s, t in zip(kept, answered)))
    for task in trickling:
        task.cancel()
    await asyncio.gather(*trickling, return_exceptions=True)
    _assert_closed_at_deadline(waited, timeout_s)


async def slow_heads_served(main_port: int, limit: int, timeout_s: float) -> None:
    """Heads sent in pieces, complete within the deadline, are served (and a kept-alive
    connection's next one too), while twice the limit of half heads are open."""
    idle = [await _open(main_port, HALF_HEAD) for _ in range(2 * limit)]
    pieces = (b"GET /ready HT", b"TP/1.1\r\nhost:", b" x\r\n", b"\r\n")
    pause_s = timeout_s * 0.6 / len(pieces)
    assert await _status(main_port, pieces, pause_s) == 200
    reader, writer = await _open(main_port)
    for round in range(2):
        for piece in pieces:
            await asyncio.sleep(pause_s)
            writer.write(piece)
        assert await _response(reader) == 200, round
    writer.close()
    for _, w in idle:
        w.close()


# -- a real server -----------------------------------------------------------------------

LIMIT, TIMEOUT_S = 4, 1.0


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data = tmp_path_factory.mktemp("deadline") / "data"
    args = ["--max-connections", str(LIMIT), "--header-timeout", str(TIMEOUT_S)]
    with running_server(data, args) as srv:
        yield srv


def _ports(srv: RunningServer) -> Tuple[int, int]:
    assert srv.otlp_http_url is not None
    return urlsplit(srv.url).port or 0, urlsplit(srv.otlp_http_url).port or 0


def test_server_half_heads_and_prefaces(real_server: RunningServer) -> None:
    main_port, otlp_port = _ports(real_server)
    _run(lambda: half_heads_and_prefaces(main_port, otlp_port, LIMIT, TIMEOUT_S))


def test_server_keep_alive_trickling(real_server: RunningServer) -> None:
    main_port, _ = _ports(real_server)
    _run(lambda: keep_alive_trickling(main_port, LIMIT, TIMEOUT_S))


def test_server_slow_heads_served(real_server: RunningServer) -> None:
    main_port, _ = _ports(real_server)
    _run(lambda: slow_heads_served(main_port, LIMIT, TIMEOUT_S))


# -- in-process, both protocol classes ---------------------------------------------------

IN_PROCESS_TIMEOUT_S = 0.5


async def _app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    body = b"ok"
    headers = [(b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The gRPC server's place: echoes what it reads."""
    while data := await reader.read(65536):
        writer.write(data)
    writer.close()


def _bound() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@asynccontextmanager
async def serving(
    base: Type[asyncio.Protocol], limit: int, timeout_s: float
) -> AsyncIterator[Tuple[int, int, uvicorn.Server, asyncio.Task[None]]]:
    """uvicorn as ``hotspan server`` runs it, on a main port and another (OTLP/HTTP) one."""
    main, other = _bound(), _bound()
    backend = await asyncio.start_server(_echo, "127.0.0.1", 0)
    main_port = main.getsockname()[1]
    protocol = h2_sniff.sniffing(
        base, backend.sockets[0].getsockname()[1], main_port, limit, header_timeout_s=timeout_s
    )
    config = uvicorn.Config(
        _app, http=protocol, lifespan="off", log_level="critical", limit_concurrency=limit
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[main, other]))
    while not server.started:
        await asyncio.sleep(0.005)
    try:
        yield main_port, other.getsockname()[1], server, task
    finally:
        server.should_exit = True
        await task
        backend.close()
        main.close()
        other.close()


PROTOCOLS = pytest.mark.parametrize(
    "base", [HttpToolsProtocol, H11Protocol], ids=["httptools", "h11"]
)


@PROTOCOLS
def test_half_heads_and_prefaces(base: Type[asyncio.Protocol]) -> None:
    async def main() -> None:
        async with serving(base, LIMIT, IN_PROCESS_TIMEOUT_S) as (port, other, _, _):
            await half_heads_and_prefaces(port, other, LIMIT, IN_PROCESS_TIMEOUT_S)

    _run(main)


@PROTOCOLS
def test_keep_alive_trickling(base: Type[asyncio.Protocol]) -> None:
    async def main() -> None:
        async with serving(base, LIMIT, IN_PROCESS_TIMEOUT_S) as (port, _, _, _):
            await keep_alive_trickling(port, LIMIT, IN_PROCESS_TIMEOUT_S)

    _run(main)


@PROTOCOLS
def test_slow_heads_served(base: Type[asyncio.Protocol]) -> None:
    async def main() -> None:
        async with serving(base, LIMIT, IN_PROCESS_TIMEOUT_S) as (port, _, _, _):
            await slow_heads_served(port, LIMIT, IN_PROCESS_TIMEOUT_S)

    _run(main)


@PROTOCOLS
def test_pipelined_requests_then_the_deadline(base: Type[asyncio.Protocol]) -> None:
    """Two requests in one write: both answered, and the deadline runs from the second
    response only (not from the first, while the second was being served)."""

    async def main() -> None:
        timeout_s = IN_PROCESS_TIMEOUT_S
        async with serving(base, LIMIT, timeout_s) as (port, _, _, _):
            stream = await _open(port, REQUEST * 2)
            assert await _response(stream[0]) == 200
            assert await _response(stream[0]) == 200
            answered = _now()
            _assert_closed_at_deadline(
                [await _closed_after(stream, answered, timeout_s)], timeout_s
            )

    _run(main)


@PROTOCOLS
def test_a_piped_http2_connection_outlives_the_deadline(base: Type[asyncio.Protocol]) -> None:
    async def main() -> None:
        timeout_s = IN_PROCESS_TIMEOUT_S
        async with serving(base, LIMIT, timeout_s) as (port, _, _, _):
            reader, writer = await _open(port, h2_sniff.PREFACE)
            assert await reader.readexactly(len(h2_sniff.PREFACE)) == h2_sniff.PREFACE
            await asyncio.sleep(timeout_s * 2)
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
            writer.close()

    _run(main)


@PROTOCOLS
def test_shutdown_closes_connections_waiting_for_a_head(base: Type[asyncio.Protocol]) -> None:
    """They are left out of the count, not out of uvicorn's connections: a graceful shutdown
    closes them at once, as it does idle keep-alive ones, long before their deadline."""

    async def main() -> None:
        timeout_s = 30.0
        async with serving(base, LIMIT, timeout_s) as (port, other, server, task):
            idle = [await _open(port, HALF_HEAD), await _open(other, HALF_HEAD)]
            kept = await _open(port, REQUEST)
            assert await _response(kept[0]) == 200
            idle.append(kept)
            began = _now()
            server.should_exit = True
            await asyncio.wait_for(asyncio.shield(task), 5)
            waited = await asyncio.gather(*(_closed_after(s, began, 5) for s in idle))
            assert max(waited) < 2, waited

    _run(main)


@PROTOCOLS
def test_a_head_past_its_size_limit_gets_431(base: Type[asyncio.Protocol]) -> None:
    """A head that keeps growing is not held until the deadline: past MAX_HEAD_BYTES it is
    refused.  A long head under the limit, and a body sent with its head, are served."""
    filler = b"x-filler: " + b"a" * 1000 + b"\r\n"

    async def main() -> None:
        async with serving(base, LIMIT, 30.0) as (port, _, _, _):
            # (h11 itself refuses heads over 16 KiB; httptools has no limit of its own.)
            long_head = HALF_HEAD + filler * 12 + b"host: x\r\n\r\n"
            assert await _status(port, (long_head,)) == 200
            body = b"b" * (2 * header_deadline.MAX_HEAD_BYTES)
            with_body = b"POST /ready HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (
                len(body),
                body,
            )
            assert await _status(port, (with_body,)) == 200
            reader, writer = await _open(port, HALF_HEAD)
            began = _now()
            try:
                for _ in range(header_deadline.MAX_HEAD_BYTES // len(filler) + 2):
                    writer.write(filler)
                    await writer.drain()
            except ConnectionError:
                pass  # closed under the writes: the answer is still read below
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.split(b" ")[1] in (b"431", b"400"), head
                await asyncio.wait_for(reader.read(), 10)  # the reason, then the end
            except ConnectionResetError:
                pass  # closed with the filler still unread: the kernel dropped the answer
            assert _now() - began < 10
            writer.close()

    _run(main)


@PROTOCOLS
def test_the_rest_of_a_body_answered_early_is_no_head(base: Type[asyncio.Protocol]) -> None:
    """An answer may come before its request's body has (a 413 for a body past the limit):
    the rest of that body is not the next head, whatever its size, and the next request on
    the connection is served."""
    body = b"b" * (4 * header_deadline.MAX_HEAD_BYTES)
    head = b"POST /ready HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)

    async def main() -> None:
        async with serving(base, LIMIT, 30.0) as (port, _, _, _):
            reader, writer = await _open(port, head)
            assert await _response(reader) == 200  # answered before any of its body
            try:
                for start in range(0, len(body), 16384):
                    writer.write(body[start : start + 16384])
                    await writer.drain()
                    await asyncio.sleep(0.001)
                writer.write(REQUEST)
                await writer.drain()
                status = await _response(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                status = None  # a parser may close such a connection instead (h11 does)
            assert status in (200, None), status
            if base is HttpToolsProtocol:
                assert status == 200
            writer.close()

    _run(main)
