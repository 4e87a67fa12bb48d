"""What the request handlers share: configuration, store and query engine."""

from __future__ import annotations

from dataclasses import dataclass

from hotspan.query.engine import QueryEngine
from hotspan.server.config import ServerConfig
from hotspan.store.base import Store


@dataclass
class ServerState:
    config: ServerConfig
    store: Store
    engine: QueryEngine
