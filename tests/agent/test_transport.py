"""The agent's HTTP/1.1 connection against answers http.server does not give: chunked
bodies, keep-alive reuse, oversized error bodies and garbage; over TLS; with its waits on the
socket's own timeouts and through a native Waker's wait_io."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import pytest

from hotspan._speedups import load_sampler
from hotspan.agent.transport import PlainConnection, TransportError
from tests.helpers import self_signed_certificate

native = load_sampler()
Calls = List[Tuple[bool, float]]


@pytest.fixture(params=["socket", "wait_io"])
def waits(request: pytest.FixtureRequest) -> Tuple[Optional[Callable[..., bool]], Calls]:
    """The connection's waits: the socket's timeouts, or a Waker's wait_io (on this thread,
    the main one or a worker's, a plain wait), recorded as (write, timeout)."""
    calls: Calls = []
    if request.param == "socket":
        return None, calls
    if native is None:
        pytest.skip("the native sampler is not built")
    waker = native.Waker()

    def wait_io(fd: int, write: bool, timeout: float) -> bool:
        calls.append((write, timeout))
        return bool(waker.wait_io(fd, write, timeout))

    return wait_io, calls


def _read_request(conn: Any, buf: bytes) -> Tuple[bytes, bytes, bytes]:
    """One whole request from ``conn`` (``buf``: what was read already): its head, its body
    (Content-Length bytes, none without one) and what came after it."""
    while b"\r\n\r\n" not in buf:
        buf += conn.recv(65536)
    head, _, buf = buf.partition(b"\r\n\r\n")
    lengths = [
        line.split(b":")[1]
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    ]
    length = int(lengths[0]) if lengths else 0
    while len(buf) < length:
        buf += conn.recv(65536)
    return head, buf[:length], buf[length:]


def _serve(answers: List[bytes]) -> tuple:
    """A one-connection server that reads each request fully, then sends the next answer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    requests: List[bytes] = []

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            buf = b""
            for answer in answers:
                head, body, buf = _read_request(conn, buf)
                requests.append(head + b"\r\n\r\n" + body)
                conn.sendall(answer)
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], requests, thread


def test_chunked_and_keep_alive_on_one_connection(waits: Any) -> None:
    port, requests, thread = _serve(
        [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
            b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\nRetry-After: 7\r\n\r\nbusy",
        ]
    )
    wait_io, calls = waits
    conn = PlainConnection("127.0.0.1", port, timeout=5, wait_io=wait_io)
    assert conn.post("/ingest?a=1", b"x" * 100_000, {"X-Scope-OrgID": "t"}, 1000) == (
        200,
        {"transfer-encoding": "chunked"},
        b"abcde",
    )
    sock = conn.sock
    status, headers, body = conn.post("/ingest?a=2", b"y", {}, 1000)
    assert (status, headers["retry-after"], body) == (503, "7", b"busy")
    assert conn.sock is sock  # the same keep-alive connection served both
    thread.join(5)
    assert requests[0].startswith(b"POST /ingest?a=1 HTTP/1.1\r\n")
    assert b"\r\nX-Scope-OrgID: t\r\n" in requests[0] and requests[0].endswith(b"x" * 100_000)
    conn.close()
    if wait_io is not None:  # every wait was the connection's: to connect, send and read
        assert {write for write, _ in calls} == {True, False}
        assert all(0 < timeout <= 5 for _, timeout in calls)


def test_long_error_body_is_cut_and_connection_dropped() -> None:
    port, _, thread = _serve([b"HTTP/1.1 400 Bad\r\nContent-Length: 5000\r\n\r\n" + b"e" * 5000])
    conn = PlainConnection("127.0.0.1", port, timeout=5)
    status, _, body = conn.post("/ingest", b"", {}, 100)
    assert (status, body) == (400, b"e" * 100) and conn.sock is None
    thread.join(5)


def test_garbage_answer_is_an_error() -> None:
    port, _, thread = _serve([b"SSH-2.0-OpenSSH\r\n\r\n"])
    conn = PlainConnection("127.0.0.1", port, timeout=5)
    with pytest.raises(TransportError, match="not an HTTP response"):
        conn.post("/ingest", b"", {}, 100)
    thread.join(5)


def test_no_content_needs_no_length() -> None:
    # nginx and Go proxies answer 204 without Content-Length; waiting for a body would time
    # out and send an accepted upload again.
    port, _, thread = _serve(
        [b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
    )
    conn = PlainConnection("127.0.0.1", port, timeout=5)
    assert conn.post("/ingest", b"a", {}, 100) == (204, {}, b"")
    assert conn.post("/ingest", b"b", {}, 100)[2] == b"ok"
    thread.join(5)


def test_timeout_bounds_the_whole_exchange(waits: Any) -> None:
    """A server that trickles one byte every 0.2 s never trips a per-read timeout; the
    connection's timeout is for the whole post."""
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 100:
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.2)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    conn = PlainConnection("127.0.0.1", listener.getsockname()[1], timeout=1.0, wait_io=waits[0])
    started = time.monotonic()
    with pytest.raises(OSError):  # TimeoutError, or socket.timeout on 3.9
        conn.post("/ingest", b"", {}, 1000)
    assert time.monotonic() - started < 2.0
    conn.close()
    listener.close()


def test_refused_connection_is_the_usual_error(waits: Any) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    conn = PlainConnection("127.0.0.1", port, timeout=2, wait_io=waits[0])
    with pytest.raises(ConnectionRefusedError):
        conn.post("/ingest", b"", {}, 100)
    assert conn.sock is None


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"), "localhost")


def _serve_tls(cert: Tuple[Path, Path], answers: int) -> Tuple[int, List[bytes], threading.Thread]:
    """A TLS server on one connection: reads each request whole (up to its Content-Length)
    and answers 200 with the body's length."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*cert)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    bodies: List[bytes] = []

    def run() -> None:
        raw, _ = listener.accept()
        listener.close()
        try:
            conn = context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):
            raw.close()  # a client that did not trust us
            return
        with conn:
            buf = b""
            for _ in range(answers):
                _, body, buf = _read_request(conn, buf)
                bodies.append(body)
                answer = str(len(body)).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer)
                )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], bodies, thread


def test_tls_with_the_hosts_certificate(certificate: Tuple[Path, Path], waits: Any) -> None:
    port, bodies, thread = _serve_tls(certificate, answers=2)
    context = ssl.create_default_context(cafile=str(certificate[0]))
    conn = PlainConnection("localhost", port, timeout=5, context=context, wait_io=waits[0])
    big = bytes(range(256)) * 4000  # past one TLS write's piece
    assert conn.post("/ingest", big, {}, 100) == (200, {"content-length": "7"}, b"1024000")
    sock = conn.sock
    assert conn.post("/ingest", b"small", {}, 100)[2] == b"5"
    assert conn.sock is sock and isinstance(sock, ssl.SSLSocket)
    thread.join(5)
    assert bodies == [big, b"small"]
    conn.close()


def test_tls_refuses_a_certificate_for_another_name(
    certificate: Tuple[Path, Path], waits: Any
) -> None:
    port, bodies, thread = _serve_tls(certificate, answers=1)
    context = ssl.create_default_context(cafile=str(certificate[0]))
    conn = PlainConnection("127.0.0.1", port, timeout=5, context=context, wait_io=waits[0])
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.post("/ingest", b"secret", {}, 100)
    assert conn.sock is None
    thread.join(5)
    assert bodies == []


def test_each_address_of_a_name_is_tried_and_the_answer_kept(
    waits: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name whose first address refuses ("localhost" as ::1 beside a server on 127.0.0.1)
    connects to the next; the lookup is kept for the next connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(2)
    port = listener.getsockname()[1]
    heads: List[bytes] = []

    def run() -> None:  # two connections, one exchange and a close each
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                heads.append(_read_request(conn, b"")[0])
                conn.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    lookups: List[str] = []

    def getaddrinfo(host: str, port_: int, *args: Any, **kwargs: Any) -> List[Any]:
        lookups.append(host)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    conn = PlainConnection("server.test", port, timeout=5, wait_io=waits[0])
    for body in (b"a", b"b"):
        assert conn.post("/ingest", body, {}, 100) == (204, {"connection": "close"}, b"")
        assert conn.sock is None  # the server closed it: the next post connects again
    thread.join(5)
    assert [h.split(b"\r\n")[1] for h in heads] == [f"Host: server.test:{port}".encode()] * 2
    assert lookups == ["server.test"]
