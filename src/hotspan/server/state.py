"""What the request handlers share: configuration, store and query engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List

from hotspan.query.engine import QueryEngine
from hotspan.query.traces import TraceEngine
from hotspan.server.config import ServerConfig
from hotspan.store.base import Store


@dataclass
class ServerState:
    config: ServerConfig
    store: Store
    engine: QueryEngine
    traces: TraceEngine
    # Run when the server stops, before the store closes (the gRPC server, retention).
    on_shutdown: List[Callable[[], None]] = field(default_factory=list)
