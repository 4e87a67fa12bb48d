"""The HTTP server: ingest, the Pyroscope query API and the legacy render API."""

from hotspan.server.app import create_app
from hotspan.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]
