"""The control endpoint on its own port (``HOTSPAN_CONTROL_PORT``), for programs that serve
no HTTP of their own or should not expose it there; Go's ``/debug/pprof`` paths are answered
there too (:mod:`.pull`).  127.0.0.1 unless told otherwise: it
turns profiling of the process on and off."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from hotspan.agent import pull
from hotspan.agent.control import authorized, handle_stream

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Optional


class _Handler(BaseHTTPRequestHandler):
    server_version = "hotspan-control"

    def _answer(self) -> None:
        path, _, query = self.path.partition("?")
        if pull.subpath(path) is not None:
            self._pull(path, query)
            return
        status, payload = handle_stream(
            self.command,
            self.headers.get("Content-Length"),
            self.rfile.read,
            self.headers.get("Authorization", ""),
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _pull(self, path: str, query: str) -> None:
        """Go's /debug/pprof paths (agent/pull.py), beside the control API.  With a
        control_token they need it too (Bearer, or Basic with it as password)."""
        from hotspan.agent.current import current_agent

        agent = current_agent()
        token = agent.config.control_token if agent is not None else ""
        if self.command not in ("GET", "HEAD"):
            status, ctype, body = 405, pull.TEXT, b"use GET\n"
        elif not authorized(self.headers.get("Authorization", ""), token, basic=True):
            status, ctype, body = pull.UNAUTHORIZED
        else:
            rest = pull.subpath(path) or ""
            status, ctype, body = pull.answer(rest, pull.split_query(query))
        self.send_response(status)
        for name, value in pull.headers(ctype, body, status):
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _answer  # noqa: N815 - http.server's names

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # the program's stderr is not ours to write to on every request


class ControlServer:
    def __init__(self, host: str, port: int) -> None:
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="hotspan-control",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
