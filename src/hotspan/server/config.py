"""Server settings, with the defaults ``hotspan server`` uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, FrozenSet, Optional, Tuple

if TYPE_CHECKING:
    from hotspan.server.scrape_config import ScrapeConfig

MiB = 1024 * 1024
DAY_NS = 86400 * 10**9


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 4040
    data_dir: str = "./hotspan-data"
    # Where data lives when not in ``data_dir``'s embedded store: ``clickhouse://...``; and
    # the ClickHouse cluster whose nodes get the tables (None: one ClickHouse server).
    store_url: Optional[str] = None
    cluster: Optional[str] = None
    max_body_bytes: int = 16 * MiB
    # A compressed body may expand up to this much; beyond it the payload is refused.
    max_decompressed_bytes: int = 128 * MiB
    default_tenant: str = "anonymous"
    # Empty: no token needed.  Otherwise ``Authorization: Bearer <token>`` (or basic auth with
    # the token as password, which is what Pyroscope SDKs send) must carry one of them.
    ingest_tokens: FrozenSet[str] = field(default_factory=frozenset)
    query_tokens: FrozenSet[str] = field(default_factory=frozenset)
    # OTLP receivers beside the main port (which serves OTLP/HTTP too); None: turned off,
    # 0: any free port.
    otlp_http_port: Optional[int] = 4318
    otlp_grpc_port: Optional[int] = 4317
    # Samples and spans older than this are deleted (0: kept forever), checked this often.
    # None: 7 days, or what a store shared by several servers already keeps
    # (``Store.kept_retention_ns``).
    retention_ns: Optional[int] = None
    retention_interval_s: float = 600.0
    # Case-insensitive regular expressions: frame names, file names and label values (but
    # __name__ and service_name) of ingested profiles that match one become "[REDACTED]".
    redact_patterns: Tuple[str, ...] = ()
    # ``--scrape FILE``, read and checked: the targets whose /debug/pprof the server pulls
    # (server/scrape_config.py); None: none.
    scrape: Optional[ScrapeConfig] = None
    # Alert rules are evaluated this often (0: not by this server, e.g. all but one of the
    # servers over a shared store); links in notifications start with external_url (None:
    # http://host:port of this server).
    alert_interval_s: float = 60.0
    external_url: Optional[str] = None
    # Alert conditions look at windows ending this long ago: samples arrive in uploads,
    # stamped at the start of the agent's upload window.
    alert_lag_s: float = 30.0
    # Alert webhooks may reach these networks (CIDRs) though they are loopback, link-local
    # or private addresses, which are refused otherwise.
    alert_webhook_allow: Tuple[str, ...] = ()
    # A connection that has not sent a whole request head (or HTTP/2's preface) this long
    # after it opened, or after its previous response, is closed.
    header_timeout_s: float = 10.0
