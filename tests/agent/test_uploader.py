"""The agent's uploader against a real HTTP server on 127.0.0.1 whose behaviour a test switches."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, Iterator, List, Optional
from urllib.parse import parse_qsl, urlencode

import pytest

from hotspan.agent.uploader import Uploader

MiB = 1024 * 1024
PARAMS = {"name": "checkout.cpu{env=prod,region=eu west}", "format": "pprof", "from": "1"}


@dataclass
class Received:
    path: str
    query: str
    headers: Dict[str, str]
    body: bytes
    client_port: int


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
        pass  # a client that gave up on a slow answer is expected here


class FakeServer:
    """Modes: accept, 500, 400, 429 (with Retry-After), slow (then 200), close (200, then
    closes the connection without saying so, like an expired keep-alive)."""

    def __init__(self, port: int = 0) -> None:
        self.mode = "accept"
        self.script: List[str] = []  # modes for the next requests, before self.mode
        self.retry_after = "1"
        self.reason = "bad profile"
        self.slow_seconds = 5.0
        self.release = threading.Event()
        self.received: List[Received] = []
        self.hits: List[float] = []  # monotonic time of every request, whatever the answer
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                fake.handle(self, body)

        self.httpd = _QuietServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def handle(self, h: BaseHTTPRequestHandler, body: bytes) -> None:
        with self.lock:
            self.hits.append(time.monotonic())
            mode = self.script.pop(0) if self.script else self.mode
        if mode == "slow":
            self.release.wait(self.slow_seconds)
            mode = "accept"
        if mode in ("accept", "close"):
            path, _, query = h.path.partition("?")
            with self.lock:
                self.received.append(
                    Received(path, query, dict(h.headers), body, h.client_address[1])
                )
            self.reply(h, 200, b"")
            h.close_connection = mode == "close"
        elif mode == "429":
            self.reply(h, 429, b"slow down", {"Retry-After": self.retry_after})
        elif mode == "400":
            self.reply(h, 400, self.reason.encode())
        else:
            self.reply(h, int(mode), b"boom")

    @staticmethod
    def reply(
        h: BaseHTTPRequestHandler, status: int, body: bytes, headers: Optional[dict] = None
    ) -> None:
        h.send_response(status)
        for name, value in (headers or {}).items():
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.fixture
def servers() -> Iterator[Callable[..., FakeServer]]:
    started: List[FakeServer] = []

    def make(port: int = 0) -> FakeServer:
        started.append(FakeServer(port))
        return started[-1]

    yield make
    for server in started:
        server.close()


@pytest.fixture
def server(servers: Callable[..., FakeServer]) -> FakeServer:
    return servers()


@pytest.fixture
def uploaders() -> Iterator[Callable[..., Uploader]]:
    made: List[Uploader] = []

    def make(address: str, headers: Optional[Dict[str, str]] = None, **kw: object) -> Uploader:
        made.append(Uploader(address, headers or {}, **kw))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for uploader in made:
        uploader.stop(1.0)


def test_delivered_with_params_headers_and_path_prefix(server, uploaders) -> None:
    headers = {"Authorization": "Bearer t0ken", "X-Scope-OrgID": "team-a", "X-Extra": "yes"}
    up = uploaders(server.url + "/pyroscope/", headers)
    up.start()
    body = bytes(range(256)) * 100
    up.submit(PARAMS, body)
    assert wait_until(lambda: up.stats.sent_uploads == 1)
    up.submit({"name": "second"}, b"2")
    assert wait_until(lambda: up.stats.sent_uploads == 2)

    first, second = server.received
    assert first.path == "/pyroscope/ingest"
    assert first.query == urlencode(PARAMS)
    assert dict(parse_qsl(first.query)) == PARAMS
    assert first.body == body
    assert first.headers["Authorization"] == "Bearer t0ken"
    assert first.headers["X-Scope-OrgID"] == "team-a"
    assert first.headers["X-Extra"] == "yes"
    assert first.headers["Content-Type"] == "application/octet-stream"
    assert first.headers["User-Agent"].startswith("hotspan-agent/")
    assert second.client_port == first.client_port  # one keep-alive connection
    stats = up.stats
    assert (stats.sent_bytes, stats.failed_attempts, stats.dropped_uploads) == (len(body) + 1, 0, 0)
    assert up.thread_ident is not None and up.thread_ident != threading.get_ident()


def test_server_away_keeps_newest_within_budget_and_delivers_them_in_order(
    servers, uploaders
) -> None:
    port = closed_port()
    up = uploaders(f"http://127.0.0.1:{port}", max_buffer_bytes=8 * MiB)
    up.start()
    slowest = 0.0
    most_pending = 0
    for i in range(50):
        body = bytes([i]) * MiB
        began = time.perf_counter()
        up.submit({"n": str(i)}, body)
        slowest = max(slowest, time.perf_counter() - began)
        most_pending = max(most_pending, up.pending_bytes)
    assert slowest < 0.05
    assert most_pending <= 8 * MiB
    assert wait_until(lambda: up.stats.failed_attempts >= 1)
    assert up.stats.sent_uploads == 0

    server = servers(port)  # the server comes back; the thread's backoff retry finds it
    assert wait_until(lambda: up.stats.sent_uploads == 8, timeout=10)
    assert [r.query for r in server.received] == [f"n={i}" for i in range(42, 50)]
    assert all(r.body == bytes([i]) * MiB for i, r in zip(range(42, 50), server.received))
    stats = up.stats
    assert (stats.dropped_uploads, stats.dropped_bytes) == (42, 42 * MiB)
    assert "ConnectionRefusedError" in stats.last_error
    assert up.pending_bytes == 0


def test_retryable_errors_back_off_honour_retry_after_and_warn_once(
    server, uploaders, caplog
) -> None:
    caplog.set_level(logging.DEBUG, logger="hotspan.agent")
    server.script = ["429", "500"]
    server.retry_after = "1"
    up = uploaders(server.url)
    up.start()
    for body in (b"a", b"b", b"c"):
        up.submit(PARAMS, body)
    assert wait_until(lambda: up.stats.sent_uploads == 3, timeout=5)

    first, second, third = server.hits[:3]
    assert second - first >= 0.95  # Retry-After, not the 0.5 s first backoff
    assert third - second >= 0.7  # backoff doubled to 1 s (+-25% jitter)
    assert [r.body for r in server.received] == [b"a", b"b", b"c"]  # retried in place
    stats = up.stats
    assert (stats.failed_attempts, stats.rejected_uploads) == (2, 0)
    assert stats.last_error.startswith("HTTP 500")
    warnings = [r for r in caplog.records if r.name == "hotspan.agent" and r.levelno >= 30]
    assert len(warnings) == 1 and "HTTP 429" in warnings[0].getMessage()


def test_client_error_is_rejected_not_retried(server, uploaders, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="hotspan.agent")
    server.mode = "400"
    server.reason = "bad profile: " + "x" * 300 + "END"
    up = uploaders(server.url)  # no thread: flush sends from here
    up.submit(PARAMS, b"rejected")
    assert up.flush(2.0) is True  # nothing left: a rejected upload is not pending
    server.mode = "accept"
    up.submit(PARAMS, b"accepted")
    assert up.flush(2.0) is True

    assert len(server.hits) == 2
    assert [r.body for r in server.received] == [b"accepted"]
    stats = up.stats
    assert (stats.rejected_uploads, stats.failed_attempts, stats.sent_uploads) == (1, 1, 1)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "hotspan.agent"]
    assert "HTTP 400: bad profile: xxx" in warning and "END" not in warning


@pytest.mark.parametrize("thread", [False, True], ids=["flush-sends", "thread-sending"])
def test_flush_against_slow_server_keeps_its_deadline(server, uploaders, thread) -> None:
    server.mode = "slow"
    up = uploaders(server.url, timeout=10.0)
    if thread:
        up.start()
    up.submit(PARAMS, b"slow")
    if thread:
        assert wait_until(lambda: len(server.hits) == 1)  # the thread is waiting on the answer
    began = time.monotonic()
    assert up.flush(1.0) is False
    assert 0.9 <= time.monotonic() - began < 2.5
    if thread:
        server.release.set()  # the thread's attempt completes; flush did not send it again
        assert wait_until(lambda: up.stats.sent_uploads == 1)
        assert len(server.hits) == 1
    else:
        assert "timed out" in up.stats.last_error
        assert up.pending_bytes == len(b"slow")  # kept for a later attempt


def test_flush_ignores_backoff_and_wakes_the_thread(server, uploaders) -> None:
    server.script = ["429"]
    server.retry_after = "30"
    up = uploaders(server.url)
    up.start()
    up.submit(PARAMS, b"one")
    assert wait_until(lambda: up.stats.failed_attempts == 1)
    began = time.monotonic()
    assert up.flush(2.0) is True
    assert time.monotonic() - began < 1.0
    up.submit(PARAMS, b"two")  # success ended the backoff: the thread sends it at once
    assert wait_until(lambda: up.stats.sent_uploads == 2, timeout=1.0)
    assert [r.body for r in server.received] == [b"one", b"two"]


def _in_its_wait(up: Uploader) -> bool:
    frame = sys._current_frames().get(up.thread_ident or 0)
    while frame is not None and frame.f_code is not Uploader._wait.__code__:
        frame = frame.f_back
    return frame is not None


def test_every_start_returns_with_the_thread_in_its_wait(server, uploaders) -> None:
    # Not still running Python towards it, where it would queue for the GIL once the
    # program gets busy: a stop and a start again included.
    up = uploaders(server.url)
    for _ in range(3):
        up.start()
        assert _in_its_wait(up)
        up.stop(1.0)


def test_stop_returns_promptly_during_backoff(server, uploaders) -> None:
    server.mode = "429"
    server.retry_after = "30"
    up = uploaders(server.url)
    up.start()
    up.submit(PARAMS, b"x")
    assert wait_until(lambda: up.stats.failed_attempts == 1)
    thread = next(t for t in threading.enumerate() if t.ident == up.thread_ident)
    assert thread.name == "hotspan-uploader" and thread.daemon
    began = time.monotonic()
    up.stop(5.0)
    assert time.monotonic() - began < 0.5
    assert not thread.is_alive()


def test_zero_budget_hands_off_to_an_idle_thread_only(server, uploaders) -> None:
    up = uploaders(server.url, max_buffer_bytes=0)
    up.submit(PARAMS, b"no thread yet")
    up.start()
    assert wait_until(lambda: up._idle)
    up.submit(PARAMS, b"taken")
    up.submit(PARAMS, b"busy")
    assert wait_until(lambda: up.stats.sent_uploads == 1)
    assert [r.body for r in server.received] == [b"taken"]
    assert up.stats.dropped_uploads == 2 and up.pending_bytes == 0

    small = uploaders(server.url, max_buffer_bytes=100)
    small.submit(PARAMS, b"o" * 50)
    small.submit(PARAMS, b"x" * 101)  # dropped alone: it does not push out older ones
    assert (small.stats.dropped_uploads, small.stats.dropped_bytes) == (1, 101)
    assert small.pending_bytes == 50


def test_expired_keep_alive_is_replaced_without_a_failed_attempt(server, uploaders) -> None:
    server.mode = "close"  # answers, then closes the connection without a Connection header
    up = uploaders(server.url)
    up.start()
    for i in range(3):
        up.submit(PARAMS, bytes([i]))
        assert wait_until(lambda i=i: up.stats.sent_uploads == i + 1)
        time.sleep(0.05)  # the server's FIN arrives
    assert up.stats.failed_attempts == 0
    assert len({r.client_port for r in server.received}) == 3


def test_reset_after_fork_in_process(server, uploaders) -> None:
    server.mode = "500"
    up = uploaders(server.url)
    up.start()
    up.submit(PARAMS, b"parent's")
    assert wait_until(lambda: up.stats.failed_attempts >= 1)
    old_ident = up.thread_ident
    up.reset_after_fork()
    assert up.pending_bytes == 0 and up.thread_ident is None
    assert up.stats.failed_attempts == 0
    server.mode = "accept"
    up.start()
    assert up.thread_ident not in (None, old_ident)
    up.submit(PARAMS, b"child's")
    assert wait_until(lambda: up.stats.sent_uploads == 1)
    assert [r.body for r in server.received] == [b"child's"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_reset_after_real_fork(server, uploaders) -> None:
    up = uploaders(server.url)
    up.start()
    up.submit(PARAMS, b"parent before")
    assert wait_until(lambda: up.stats.sent_uploads == 1)
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 2
        try:
            up.reset_after_fork()
            up.start()
            up.submit({"name": "child"}, b"from the child")
            code = 0 if up.flush(5.0) and up.stats.sent_uploads == 1 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    up.submit(PARAMS, b"parent after")
    assert wait_until(lambda: up.stats.sent_uploads == 2)
    bodies = [r.body for r in server.received]
    assert bodies == [b"parent before", b"from the child", b"parent after"]
    # The child closed only its copy of the parent's keep-alive connection.
    assert server.received[2].client_port == server.received[0].client_port


def test_https_failure_is_an_attempt_not_an_exception(server, uploaders) -> None:
    up = uploaders(f"https://127.0.0.1:{server.port}")  # TLS to a plain HTTP server
    up.submit(PARAMS, b"x")
    assert up.flush(2.0) is False
    assert "SSL" in up.stats.last_error and up.stats.failed_attempts == 1
    assert up.pending_bytes == 1


def test_public_methods_never_raise(uploaders) -> None:
    up = uploaders(f"http://127.0.0.1:{closed_port()}")
    up.submit(PARAMS, "not bytes")  # type: ignore[arg-type]
    up.submit(PARAMS, b"kept")
    assert up.flush(1.0) is False
    assert "ConnectionRefusedError" in up.stats.last_error
    up.stop(0.1)
    up.reset_after_fork()
    up.stop(0.1)
