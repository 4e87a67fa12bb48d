"""A WSGI app under a threaded server, taking requests from another process.

``serve`` runs the standard library's ``wsgiref.simple_server.WSGIServer`` with
``socketserver.ThreadingMixIn`` (a thread per connection, as a threaded development server
does) on a listening socket bound to 127.0.0.1 in the setup, for a fixed ``seconds``: the main
thread accepts, and each connection's thread (``serve_connection``) answers its requests one
after another.  wsgiref answers one request per connection in HTTP/1.0; here its handler
speaks HTTP/1.1 and keeps the connection, as the load generator expects, and its request log
is off.  The app is a plain WSGI callable that renders an HTML table in pure Python
(``_harness.render_page``, ~0.5 ms of CPU, sized by ``_harness.calibrate_server``) for every
request.  The load is ``web_server.py``'s (``_harness.http_load``): ``bench/loadgen.py`` in a
process of its own, started before any profiler, with 8 keep-alive connections, so 8
connection threads take turns at the GIL.

The unit of work is one request (``units`` = requests served): the bench's slowdown is time
per request.  Truth for the CPU profile: each connection thread's ``time.thread_time`` from
start to end (``threads_cpu_total_s``), all the work but the accept loop, against the CPU the
profile puts in ``serve_connection``.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import time
from typing import Any, Callable, Dict, Iterable, List, Set, Tuple
from urllib.parse import parse_qs
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer

import _harness

App = Callable[[Dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def make_app(rows: int) -> App:
    def app(environ: Dict[str, Any], start_response: Callable[..., Any]) -> List[bytes]:
        page = int(parse_qs(environ.get("QUERY_STRING", "")).get("page", ["0"])[0])
        body = _harness.render_page(rows, page).encode()
        headers = [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))]
        start_response("200 OK", headers)
        return [body]

    return app


class _ServerHandler11(ServerHandler):
    http_version = "1.1"


class Handler(WSGIRequestHandler):
    """wsgiref's request handler, kept on the connection for the next request (HTTP/1.1)."""

    protocol_version = "HTTP/1.1"
    # wsgiref writes the status line, the headers and the body apart: with Nagle's algorithm
    # on, each answer waits for the client's delayed ACK (40 ms).
    disable_nagle_algorithm = True
    server: ThreadedWSGIServer

    def __init__(self, request: socket.socket, client_address: Any, server: Any) -> None:
        self.served = 0
        try:
            super().__init__(request, client_address, server)  # handles until the close
        finally:
            server.served.append(self.served)

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one()
        while not self.close_connection and not self.server.stopping:
            self.handle_one()

    def handle_one(self) -> None:
        """wsgiref's ``handle`` with an HTTP/1.1 ``ServerHandler``."""
        self.raw_requestline = self.rfile.readline(65537)
        if len(self.raw_requestline) > 65536 or not self.parse_request():
            # The client closed (parse_request sets close_connection) or sent nonsense.
            self.close_connection = True
            return
        handler = _ServerHandler11(
            self.rfile, self.wfile, self.get_stderr(), self.get_environ(), multithread=True
        )
        handler.request_handler = self  # type: ignore[attr-defined]
        handler.run(self.server.get_app())
        self.served += 1

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # no request log


def serve_connection(server: ThreadedWSGIServer, request: socket.socket, address: Any) -> None:
    """A connection's thread, from accept to close, timing its own CPU."""
    t0 = time.thread_time()
    server.connections.add(request)
    try:
        server.finish_request(request, address)
    except Exception:
        server.handle_error(request, address)
    finally:
        server.connections.discard(request)
        server.shutdown_request(request)
        server.cpu.append(time.thread_time() - t0)


class ThreadedWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server, a thread per connection, on a socket bound beforehand."""

    def __init__(self, listener: socket.socket, app: App) -> None:
        address: Tuple[str, int] = listener.getsockname()[:2]
        super().__init__(address, Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listener
        # What HTTPServer.server_bind would set (without its reverse DNS lookup).
        self.server_name, self.server_port = address
        self.setup_environ()
        self.set_app(app)
        self.stopping = False
        self.connections: Set[socket.socket] = set()
        self.cpu: List[float] = []  # CPU seconds per connection thread
        self.served: List[int] = []  # requests per connection

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        serve_connection(self, request, client_address)


def serve(params: Dict[str, Any]) -> ThreadedWSGIServer:
    server = ThreadedWSGIServer(params["listener"], make_app(params["rows"]))
    server.timeout = 0.05  # how long the accept loop waits before it looks at the clock
    deadline = time.perf_counter() + params["seconds"]
    while time.perf_counter() < deadline:
        server.handle_request()
    # Each connection thread ends after the request it is answering: reading the next one
    # finds the end of the stream.
    server.stopping = True
    for conn in list(server.connections):
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RD)
    server.server_close()  # joins the connection threads
    return server


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    t0 = time.perf_counter()
    server = serve(params)
    return {
        **_harness.served(sum(server.served), time.perf_counter() - t0),
        "connections": len(server.cpu),
        "threads_cpu_total_s": sum(server.cpu),
        "work_function": "serve_connection",
    }


if __name__ == "__main__":
    _harness.main(_harness.calibrate_server, work, _harness.http_load)
