"""What the request handlers share: configuration, store and query engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, List, Optional

from hotspan.query.engine import QueryEngine
from hotspan.query.traces import TraceEngine
from hotspan.server.auth import Authenticator
from hotspan.server.config import ServerConfig
from hotspan.server.instances import InstanceRegistry
from hotspan.server.redact import Redactor
from hotspan.store.base import Store

if TYPE_CHECKING:
    from hotspan.metrics.operational import ServerMetrics


@dataclass
class ServerState:
    config: ServerConfig
    store: Store
    engine: QueryEngine
    traces: TraceEngine
    # Resolves requests and gRPC calls to their tenant and role (server.auth).
    auth: Authenticator
    # Run when the server stops, before the store closes (the gRPC server, retention).
    on_shutdown: List[Callable[[], object]] = field(default_factory=list)
    # The last status of each agent instance (X-Hotspan-Instance on uploads and polls).
    instances: InstanceRegistry = field(default_factory=InstanceRegistry)
    # From config.redact_patterns; None: profiles are stored as received.
    redactor: Optional[Redactor] = None
    # /metrics: request counters and the recording rules, which see every stored batch.
    metrics: Optional[ServerMetrics] = None
