"""The ASGI application: routes, shared state, lifecycle."""

from __future__ import annotations

import contextlib
import logging
from typing import AsyncIterator, Callable, Optional

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from hotspan.metrics.operational import IngestCounter, QueryTimer
from hotspan.query.engine import QueryEngine
from hotspan.query.traces import TraceEngine
from hotspan.server.api import (
    agent_settings,
    alerts,
    endpoints,
    function_traces,
    metrics,
    recording_rules,
    scrape,
    tokens,
    why,
)
from hotspan.server.auth import Authenticator, AuthMiddleware
from hotspan.server.config import ServerConfig
from hotspan.server.http.nosniff import NoSniff
from hotspan.server.otlp import http_receiver as otlp
from hotspan.server.pyroscope import adhoc, ingest, querier, render, settings, span_profiles
from hotspan.server.redact import Redactor
from hotspan.server.retention import RetentionLoop
from hotspan.server.state import ServerState
from hotspan.server.tempo import api as tempo
from hotspan.server.tempo import metrics as tempo_metrics
from hotspan.store import open_store
from hotspan.store.base import Store, StoreError, StoreUnavailable
from hotspan.ui.routes import not_found
from hotspan.ui.routes import routes as ui_routes

log = logging.getLogger(__name__)


async def ready(request: Request) -> Response:
    return PlainTextResponse("ready\n")


async def store_failed(request: Request, exc: Exception) -> Response:
    """The store failed: 503 with the reason when it may work later (ClickHouse away), else
    500 with the reason; shaped as a Connect error, which Grafana and the CLI read."""
    log.warning("%s %s: %s", request.method, request.url.path, exc)
    if isinstance(exc, StoreUnavailable):
        return JSONResponse(
            {"code": "unavailable", "message": f"store unavailable: {exc}"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
    return JSONResponse({"code": "internal", "message": f"store error: {exc}"}, status_code=500)


def _with_middleware(route: Route, middleware: list) -> Route:
    return Route(route.path, route.endpoint, methods=route.methods, middleware=middleware)


def create_app(config: Optional[ServerConfig] = None, store: Optional[Store] = None) -> Starlette:
    """The server application.  Without ``store`` it opens (and later closes) the embedded
    store in ``config.data_dir``.  RedactError for a bad ``config.redact_patterns``."""
    config = config or ServerConfig()
    # Before the store opens: a bad pattern must not leave an open store behind.
    redactor = Redactor(config.redact_patterns) if config.redact_patterns else None
    owns_store = store is None
    if store is None:
        store = open_store(
            config.store_url or config.data_dir,
            retention_ns=config.retention_ns,
            cluster=config.cluster,
        )
    engine = QueryEngine(store)
    state = ServerState(
        config=config,
        store=store,
        engine=engine,
        traces=TraceEngine(store, engine),
        auth=Authenticator(store, config),
        redactor=redactor,
    )
    server_metrics = metrics.server_metrics(store)
    state.metrics = server_metrics

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        assert state.metrics is not None
        state.metrics.recorder.refresh()  # before the first push: every batch counts
        state.metrics.recorder.start()
        state.on_shutdown.append(state.metrics.recorder.stop)
        retention_ns = store.kept_retention_ns(config.retention_ns)
        if retention_ns > 0:
            retention = RetentionLoop(store, retention_ns, config.retention_interval_s)
            retention.start()
            state.on_shutdown.append(retention.stop)
        scraper = None
        if config.scrape is not None:
            from hotspan.server.api.scrape import Scraper

            scraper = app.state.scraper = Scraper(state, config.scrape)
            scraper.start()
        if config.alert_interval_s > 0:
            from hotspan.alerts.evaluator import AlertLoop

            alerts_loop = AlertLoop(
                store,
                engine,
                config.alert_interval_s,
                lambda: config.external_url or f"http://{config.host}:{config.port}",
                lag_s=config.alert_lag_s,
                webhook_allow=config.alert_webhook_allow,
            )
            alerts_loop.start()
            state.on_shutdown.append(alerts_loop.stop)
        yield
        if scraper is not None:
            await scraper.stop()  # before the store closes: a scrape may be storing
        # Runs after the server stopped taking requests: stop the other receivers, then
        # commit what was accepted.
        for stop in reversed(state.on_shutdown):
            try:
                # Off the event loop: a gRPC stream piped through the main port
                # (server.http.h2_sniff) needs the loop to finish within the gRPC server's grace.
                await run_in_threadpool(stop)
            except Exception:  # noqa: BLE001 - the store must still be closed
                log.exception("error while stopping")
        if owns_store:
            store.close()

    # Query answers are compressed (level 9, the default, costs 50 ms on a 400 KB flame
    # graph; level 1 costs 2 ms); ingest answers are empty and skip the middleware.
    compressed = [Middleware(GZipMiddleware, minimum_size=4096, compresslevel=1)]

    def counted(path: str, endpoint: Callable, name: str) -> Route:
        """An ingest route whose requests, bytes and refusals /metrics counts."""
        counter = Middleware(IngestCounter, server_metrics, name)
        return Route(path, endpoint, methods=["POST"], middleware=[counter])

    routes = [
        Route("/ready", ready, methods=["GET"]),
        counted("/ingest", ingest.ingest, "ingest"),
        counted("/pyroscope/ingest", ingest.ingest, "pyroscope_ingest"),
        counted("/push.v1.PusherService/Push", ingest.push, "push"),
        counted(otlp.PATHS[0], otlp.traces, "otlp_traces"),
        counted(otlp.PATHS[1], otlp.profiles, "otlp_profiles"),
        *metrics.routes,
        *recording_rules.routes,
        *settings.routes,
        *adhoc.routes,
        *agent_settings.routes,
        *scrape.routes,
        *alerts.routes,
        *tokens.routes,
        *(
            _with_middleware(r, [Middleware(QueryTimer, state.metrics, r.path), *compressed])
            for r in querier.routes
            + render.routes
            + span_profiles.routes
            + endpoints.routes
            + function_traces.routes
            + tempo.routes
            + tempo_metrics.routes
            + why.routes
        ),
        *ui_routes,
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        # Every request's token and tenant, resolved before any route runs.
        middleware=[Middleware(NoSniff), Middleware(AuthMiddleware, auth=state.auth)],
        exception_handlers={404: not_found, StoreError: store_failed},
    )
    app.state.hotspan = state
    return app
