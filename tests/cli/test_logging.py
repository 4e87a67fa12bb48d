"""The CLI's logging: what libraries log at the level an operator picks."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import httpx
import pytest

from hotspan.cli import configure_logging
from tests.helpers import TLS


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook?token=s3cr3t"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("level", ["info", "debug"])
def test_request_urls_are_not_logged(
    url: str, level: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A webhook's or a scrape target's URL may carry a secret in its query: httpx logs each
    # request's URL at info, which --log-level info would print.
    saved = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    try:
        caplog.set_level(logging.DEBUG)
        for name in saved:
            logging.getLogger(name).setLevel(logging.NOTSET)
        httpx.get(url, verify=TLS)
        assert "s3cr3t" in caplog.text, "httpx logs URLs unless told not to"
        caplog.clear()
        configure_logging(level)
        httpx.get(url, verify=TLS)
        assert "s3cr3t" not in caplog.text
    finally:
        for name, was in saved.items():
            logging.getLogger(name).setLevel(was)
