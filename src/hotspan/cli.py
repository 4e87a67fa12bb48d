"""The ``hotspan`` command."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from typing import Iterator, List, Optional

from hotspan import __version__


def _tokens(value: Optional[str]) -> frozenset:
    return frozenset(t.strip() for t in (value or "").split(",") if t.strip())


def _server(args: argparse.Namespace) -> int:
    import uvicorn

    from hotspan.server import ServerConfig, create_app

    graceful_server = _graceful_server_class()
    from hotspan.store.base import StoreError

    config = ServerConfig(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        max_body_bytes=args.max_body_bytes,
        default_tenant=args.default_tenant,
        ingest_tokens=_tokens(args.ingest_token or os.environ.get("HOTSPAN_INGEST_TOKEN")),
        query_tokens=_tokens(args.query_token or os.environ.get("HOTSPAN_QUERY_TOKEN")),
    )
    try:
        app = create_app(config)
    except StoreError as exc:
        print(f"hotspan: {exc}", file=sys.stderr)
        return 1
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        print(f"hotspan: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        app.state.hotspan.store.close()
        return 1
    sock.listen(2048)
    port = sock.getsockname()[1]
    host = f"[{config.host}]" if family == socket.AF_INET6 else config.host
    print(
        f"hotspan {__version__} listening on http://{host}:{port} "
        f"(data in {os.path.abspath(config.data_dir)})",
        flush=True,
    )
    server = graceful_server(
        uvicorn.Config(
            app,
            log_level=args.log_level,
            access_log=False,
            timeout_graceful_shutdown=30,
            limit_concurrency=args.max_connections,
        )
    )
    server.run(sockets=[sock])
    return 0


def _run(args: argparse.Namespace) -> int:
    from hotspan.agent.run import main as run_main

    return run_main(args.argv)


def _graceful_server_class():  # type: ignore[no-untyped-def]
    import uvicorn

    class GracefulServer(uvicorn.Server):
        """Stops on SIGINT/SIGTERM like uvicorn (stop accepting, finish requests, close the
        store), then exits 0 instead of re-raising the signal."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {
                s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)
            }
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return GracefulServer


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hotspan", description=__doc__)
    parser.add_argument("--version", action="version", version=f"hotspan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    srv = sub.add_parser("server", help="run the server on the embedded store")
    srv.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    srv.add_argument("--port", type=int, default=4040, help="port (default %(default)s, 0: any)")
    srv.add_argument(
        "--data-dir", default="./hotspan-data", help="store directory (default %(default)s)"
    )
    srv.add_argument(
        "--max-body-bytes",
        type=int,
        default=16 * 1024 * 1024,
        help="largest accepted request body (default %(default)s)",
    )
    srv.add_argument(
        "--default-tenant",
        default="anonymous",
        help="tenant of requests without X-Scope-OrgID (default %(default)s)",
    )
    srv.add_argument(
        "--ingest-token", help="comma-separated tokens required to push (or HOTSPAN_INGEST_TOKEN)"
    )
    srv.add_argument(
        "--query-token", help="comma-separated tokens required to query (or HOTSPAN_QUERY_TOKEN)"
    )
    srv.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="refuse connections beyond this many with 503",
    )
    srv.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )
    srv.set_defaults(func=_server)

    # hotspan.agent.run parses its own options: everything after `run` goes there untouched
    # (no '-' prefix here, so `--tag`, `-m` or the program's own options are not ours to take).
    run = sub.add_parser(
        "run",
        help="profile a program: hotspan run [options] -- python app.py [args...]",
        add_help=False,
        prefix_chars="\0",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER)
    run.set_defaults(func=_run, log_level="warning")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.WARNING))
    return int(args.func(args))
