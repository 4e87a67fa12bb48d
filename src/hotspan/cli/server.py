"""``hotspan server``: the server on its embedded store, with the web UI."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import TYPE_CHECKING, Optional

from hotspan import __version__
from hotspan.cli.client import duration_s

if TYPE_CHECKING:
    from hotspan.server.config import ServerConfig


def _tokens(value: Optional[str]) -> frozenset:
    return frozenset(t.strip() for t in (value or "").split(",") if t.strip())


def _interval_s(text: str) -> float:
    """How often something runs: a duration (``30s``, ``10m``) or a bare number of seconds."""
    try:
        seconds = float(text)
    except ValueError:
        return duration_s(text)
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds or a duration")
    return seconds


def _port_or_off(text: str) -> Optional[int]:
    if text.strip().lower() in ("off", "none", "-"):
        return None
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number or 'off'") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range")
    return port


def _redact_pattern(text: str) -> str:
    # Checked while parsing, so that a bad pattern stops the server before it starts.
    from hotspan.model.redaction import RedactError, Redactor

    try:
        Redactor([text])  # compiled as the server will compile it
    except RedactError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a regular expression: {exc.reason}"
        ) from None
    return text


def _external_url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r} is not an http:// or https:// URL")
    return text


def _cidr(text: str) -> str:
    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a network (CIDR)") from None


def _server(args: argparse.Namespace) -> int:
    from hotspan.server import ServerConfig
    from hotspan.server.ingestion import tune_gc
    from hotspan.server.redact import RedactError
    from hotspan.server.serve import QUERY_GRPC, ListenError, bind
    from hotspan.store.base import StoreError

    scrape_config = None
    if args.scrape:
        from hotspan.server.scrape_config import ScrapeConfigError, load_scrape_config

        try:
            scrape_config = load_scrape_config(args.scrape)
        except ScrapeConfigError as exc:
            print(f"hotspan: --scrape {exc}", file=sys.stderr)
            return 1
    config = ServerConfig(
        host=args.host,
        port=args.port,
        data_dir=args.data_dir,
        store_url=args.store or os.environ.get("HOTSPAN_STORE") or None,
        cluster=args.cluster,
        max_body_bytes=args.max_body_bytes,
        default_tenant=args.default_tenant,
        ingest_tokens=_tokens(args.ingest_token or os.environ.get("HOTSPAN_INGEST_TOKEN")),
        query_tokens=_tokens(args.query_token or os.environ.get("HOTSPAN_QUERY_TOKEN")),
        otlp_http_port=args.otlp_http_port,
        otlp_grpc_port=args.otlp_grpc_port,
        retention_ns=None if args.retention is None else int(args.retention * 1e9),
        retention_interval_s=max(args.retention_interval, 1.0),
        redact_patterns=tuple(args.redact or ()),
        scrape=scrape_config,
        alert_interval_s=args.alert_interval,
        alert_lag_s=args.alert_lag,
        external_url=args.external_url.rstrip("/") if args.external_url else None,
        alert_webhook_allow=tuple(args.alert_webhook_allow or ()),
        header_timeout_s=args.header_timeout,
    )
    try:
        server = bind(config, max_connections=args.max_connections, log_level=args.log_level)
    except (StoreError, RedactError) as exc:
        print(f"hotspan: {exc}", file=sys.stderr)
        return 1
    except ListenError as exc:
        if exc.what == QUERY_GRPC:
            print(f"hotspan: cannot start the gRPC queries server: {exc.cause}", file=sys.stderr)
        else:
            option = "--" + exc.what.replace("_", "-")
            print(
                f"hotspan: cannot listen on {config.host}:{exc.port}: {exc.cause} "
                f"(move it with {option} PORT" + (", or 'off')" if option != "--port" else ")"),
                file=sys.stderr,
            )
        return 1
    if server.receivers:
        print(f"hotspan {__version__} receivers: {', '.join(server.receivers)}", flush=True)
    if scrape_config is not None:
        jobs = sorted({t.job for t in scrape_config.targets})
        print(
            f"hotspan {__version__} scraping {len(scrape_config.targets)} target(s) of job(s) "
            f"{', '.join(jobs)} from {args.scrape} (their state: GET /api/v1/scrape/targets)",
            flush=True,
        )
    print(
        f"hotspan {__version__} listening on {server.url} "
        f"(web UI at that address; data in {_where(config)})",
        flush=True,
    )
    tune_gc()  # this process is the server from here on
    server.run()
    return 0


EXAMPLES = """\
examples:
  hotspan server                                   UI and APIs on http://127.0.0.1:4040
  hotspan server --host 0.0.0.0 --retention 30d --data-dir /var/lib/hotspan
  hotspan server --ingest-token s3cret --query-token r3ad --otlp-grpc-port off
  hotspan server --host 0.0.0.0 --store clickhouse://hotspan:pw@ch1:8123/hotspan
"""


def _where(config: ServerConfig) -> str:
    """Where the data lives, for the start message (never a password)."""
    url = config.store_url
    if url and url.startswith(("clickhouse://", "clickhouses://")):
        from hotspan.store.clickhouse_connection import ClickHouseURL

        return ClickHouseURL(url).redacted()
    if url:
        return os.path.abspath(url[len("duckdb:") :] if url.startswith("duckdb:") else url)
    return os.path.abspath(config.data_dir)


def add_parser(sub: argparse._SubParsersAction) -> None:
    srv = sub.add_parser(
        "server",
        help="run the server on the embedded store, with the web UI",
        description="The server: takes pushes (Pyroscope /ingest and push API, OTLP traces\n"
        "and profiles), keeps them in DuckDB under --data-dir (or in ClickHouse with --store),\n"
        "answers queries and serves the web UI on the main port.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    srv.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    srv.add_argument("--port", type=int, default=4040, help="port (default %(default)s, 0: any)")
    srv.add_argument(
        "--data-dir", default="./hotspan-data", help="store directory (default %(default)s)"
    )
    srv.add_argument(
        "--store",
        metavar="URL",
        help="keep data in ClickHouse instead: clickhouse://user:password@host:8123/database "
        "(clickhouses:// for TLS; or HOTSPAN_STORE); any number of servers can share one",
    )
    srv.add_argument(
        "--cluster",
        metavar="NAME",
        help="with a ClickHouse --store: create replicated tables and distributed tables over "
        "them ON CLUSTER NAME",
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
        "--otlp-http-port",
        type=_port_or_off,
        default=4318,
        help="OTLP/HTTP port besides the main one (default %(default)s; 'off': none)",
    )
    srv.add_argument(
        "--otlp-grpc-port",
        type=_port_or_off,
        default=4317,
        help="OTLP/gRPC port (default %(default)s; 'off': none)",
    )
    srv.add_argument(
        "--retention",
        type=duration_s,
        default=None,
        help="delete samples and spans older than this (default 7d; 0: keep all). A ClickHouse "
        "store keeps its own (whole days): given, it changes it for every server",
    )
    srv.add_argument(
        "--retention-interval",
        type=_interval_s,
        default="10m",
        help="how often retention runs (default %(default)s)",
    )
    srv.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="answer 503 to connections beyond this many open at once, and refuse gRPC "
        "(HTTP/2) connections to the main port beyond as many again (default: no limit for "
        "HTTP/1.1, 256 gRPC connections)",
    )
    srv.add_argument(
        "--header-timeout",
        type=_interval_s,
        default="10s",
        help="close connections that have not sent a whole request head (or HTTP/2's "
        "preface) this long after they opened or after their last response; they do not "
        "count against --max-connections meanwhile (default %(default)s; 0: no deadline)",
    )
    srv.add_argument(
        "--redact",
        action="append",
        type=_redact_pattern,
        metavar="PATTERN",
        help="store frame names, file names and label values matching this case-insensitive "
        "regular expression as [REDACTED] (repeatable)",
    )
    srv.add_argument(
        "--scrape",
        metavar="FILE",
        help="pull the /debug/pprof endpoints of the targets this YAML file lists "
        "(scrape_configs: job_name, static_configs targets and labels, as Prometheus) and "
        "store what they serve",
    )
    srv.add_argument(
        "--alert-interval",
        type=_interval_s,
        default="60s",
        help="evaluate alert rules this often (default %(default)s; 0: not on this server, "
        "for all but one of the servers over a shared store)",
    )
    srv.add_argument(
        "--alert-lag",
        type=_interval_s,
        default="30s",
        help="alert conditions look at windows ending this long ago, so that samples still "
        "on their way (uploads are stamped when their window began) count (default "
        "%(default)s)",
    )
    srv.add_argument(
        "--alert-webhook-allow",
        action="append",
        type=_cidr,
        metavar="CIDR",
        help="let alert webhooks reach this network although it is loopback, link-local, "
        "private, multicast or reserved (refused otherwise; repeatable)",
    )
    srv.add_argument(
        "--external-url",
        type=_external_url,
        metavar="URL",
        help="the address people reach the UI at, for links in alert notifications "
        "(default http://HOST:PORT)",
    )
    srv.add_argument(
        "--log-level",
        default="warning",
        choices=["critical", "error", "warning", "info", "debug"],
        help="the server's own log messages (default %(default)s)",
    )
    srv.set_defaults(func=_server)
