"""The agent's plain HTTP/1.1 connection against answers http.server does not give:
chunked bodies, keep-alive reuse, oversized error bodies and garbage."""

from __future__ import annotations

import socket
import threading
from typing import List

import pytest

from hotspan.agent.transport import PlainConnection, TransportError


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
                while b"\r\n\r\n" not in buf:
                    buf += conn.recv(65536)
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = int(
                    next(
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    )
                )
                while len(buf) < length:
                    buf += conn.recv(65536)
                requests.append(head + b"\r\n\r\n" + buf[:length])
                buf = buf[length:]
                conn.sendall(answer)
        listener.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], requests, thread


def test_chunked_and_keep_alive_on_one_connection() -> None:
    port, requests, thread = _serve(
        [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
            b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\nRetry-After: 7\r\n\r\nbusy",
        ]
    )
    conn = PlainConnection("127.0.0.1", port, timeout=5)
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


def test_timeout_bounds_the_whole_exchange() -> None:
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
    conn = PlainConnection("127.0.0.1", listener.getsockname()[1], timeout=1.0)
    started = time.monotonic()
    with pytest.raises(OSError):  # TimeoutError, or socket.timeout on 3.9
        conn.post("/ingest", b"", {}, 1000)
    assert time.monotonic() - started < 2.0
    conn.close()
    listener.close()
