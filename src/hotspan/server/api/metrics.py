"""``GET /metrics``: Prometheus exposition of the server's own metrics and the recording
rules' and alerts' series (:mod:`hotspan.metrics`).

/metrics is an operator endpoint: recorded series hold tenants' profile data, so it takes
the query token when the server has any (Prometheus: ``authorization: {credentials: ...}``
in the scrape config).  With ``X-Scope-OrgID``, only that tenant's series are shown (and a
different ``?tenant=`` is refused); without it, ``?tenant=NAME`` keeps one tenant's, and
otherwise every tenant's are shown, each with a ``tenant`` label: anyone who may read
/metrics without a tenant header (no query tokens set, or a query token) is an operator.
The server's own series (ingest requests, store size...) are shown in every case.
OpenMetrics is served to a scraper that asks for it.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from prometheus_client.exposition import choose_encoder
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from hotspan.metrics.operational import ServerMetrics
from hotspan.server.config import ServerConfig
from hotspan.server.errors import HTTPError, text_errors
from hotspan.server.request import TENANT_HEADER, check_token, tenant_from
from hotspan.server.state import ServerState
from hotspan.store.base import Store

FLUSH_TIMEOUT_S = 2.0


def server_metrics(store: Store) -> ServerMetrics:
    """The application's metrics, with the alerts' ``hotspan_alert_*`` series."""
    from hotspan.alerts import metrics as alert_metrics

    out = ServerMetrics(store)
    out.sources.append(lambda tenant: alert_metrics.collect(store, tenant))
    return out


@text_errors
async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.hotspan
    check_token(request, state.config.query_tokens)
    tenant = _scope(request, state.config)
    if state.metrics is None:
        return PlainTextResponse("metrics are turned off\n", status_code=404)
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    # Off the event loop: the wait for counting, the store's size (a directory listing).
    body = await run_in_threadpool(_read, state.metrics, encoder, tenant)
    return Response(body, headers={"Content-Type": content_type})


def _scope(request: Request, config: ServerConfig) -> Optional[str]:
    """The one tenant whose series to show; None: every tenant's."""
    header = request.headers.get(TENANT_HEADER)
    asked = request.query_params.get("tenant")
    if header:
        tenant = tenant_from(header, config)
        if asked is not None and asked != tenant:
            raise HTTPError(
                400, f"?tenant={asked[:60]!r} differs from the {TENANT_HEADER} header's tenant"
            )
        return tenant
    return tenant_from(asked, config) if asked is not None else None


def _read(metrics: ServerMetrics, encoder: Callable[[Any], bytes], tenant: Optional[str]) -> bytes:
    # Pushes acknowledged before the scrape are counted in it (unless counting is far behind).
    metrics.recorder.flush(FLUSH_TIMEOUT_S)
    return encoder(metrics.scrape(tenant))


routes = [Route("/metrics", metrics, methods=["GET"])]
