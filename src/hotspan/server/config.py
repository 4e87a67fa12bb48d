"""Server settings, with the defaults ``hotspan server`` uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import FrozenSet

MiB = 1024 * 1024


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 4040
    data_dir: str = "./hotspan-data"
    max_body_bytes: int = 16 * MiB
    # A compressed body may expand up to this much; beyond it the payload is refused.
    max_decompressed_bytes: int = 128 * MiB
    default_tenant: str = "anonymous"
    # Empty: no token needed.  Otherwise ``Authorization: Bearer <token>`` (or basic auth with
    # the token as password, which is what Pyroscope SDKs send) must carry one of them.
    ingest_tokens: FrozenSet[str] = field(default_factory=frozenset)
    query_tokens: FrozenSet[str] = field(default_factory=frozenset)
