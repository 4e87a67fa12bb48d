"""The server's own metrics: ingest requests, bytes and rejections per endpoint, query
latency per route, samples stored, store size, and the recording rules' series.

Everything lives in one :class:`ServerMetrics` per application, with a registry of its own
(not prometheus_client's global one): a process may run several applications (the tests do),
and each must count only its own requests.  Requests are counted by ASGI middleware around
the routes, so the handlers stay as they are; the gRPC receivers, which are no ASGI routes,
call :meth:`ServerMetrics.ingest_done` themselves.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hotspan.metrics.recorder import Recorder
from hotspan.model.profile import IngestBatch
from hotspan.store.base import Store, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

# The *_created series (one per counter) only double /metrics for Prometheus, which ignores
# them.  Process-wide, like the option itself (prometheus_client >= 0.18).
_disable_created = getattr(prometheus_client, "disable_created_metrics", None)
if _disable_created is not None:
    _disable_created()

# Reasons a push is refused, by HTTP status; others are "http_<status>".
REASONS = {
    400: "invalid",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    408: "timeout",
    413: "too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
    500: "internal",
    503: "unavailable",
}
_HTTP_OF_GRPC = {
    "INVALID_ARGUMENT": 400,
    "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 413,
    "UNAVAILABLE": 503,
}
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def reason_of(status: int) -> str:
    return REASONS.get(status, f"http_{status}")


class _Scrape(Collector):
    """What one read of /metrics shows: the server's own metrics, and the recording rules'
    and alerts' series of every tenant (None) or one."""

    def __init__(self, metrics: ServerMetrics, tenant: Optional[str]) -> None:
        self.metrics = metrics
        self.tenant = tenant

    def collect(self) -> Iterable[Metric]:
        m = self.metrics
        yield from m.registry.collect()
        yield from self._bookkeeping()
        yield from m.recorder.families(self.tenant)
        for source in m.sources:
            try:
                yield from source(self.tenant)
            except Exception:  # noqa: BLE001 - one broken source must not hide the rest
                log.exception("a /metrics source failed")

    def _bookkeeping(self) -> Iterable[Metric]:
        m, tenant = self.metrics, self.tenant
        try:
            on_disk = m.store.size_bytes()
        except StoreError as exc:  # ClickHouse away: the other metrics still answer
            log.warning("/metrics: no store size: %s", exc)
            on_disk = None
        if on_disk is not None:
            size = GaugeMetricFamily("hotspan_store_size_bytes", "Bytes the store takes on disk")
            size.add_metric([], on_disk)
            yield size
        rules = GaugeMetricFamily(
            "hotspan_recording_rules", "Recording rules loaded, per tenant", labels=["tenant"]
        )
        for t, count in sorted(m.recorder.rule_count(tenant).items()):
            rules.add_metric([t], count)
        yield rules
        dropped = CounterMetricFamily(
            "hotspan_recording_rule_dropped_value",
            "Value not recorded because a series budget was spent (per rule, per tenant, "
            "for the server)",
            labels=["tenant", "profiles_rule_id"],
        )
        for (t, rule_id), value in sorted(m.recorder.dropped(tenant).items()):
            dropped.add_metric([t, rule_id], value)
        yield dropped
        batches = CounterMetricFamily(
            "hotspan_recording_rule_dropped_batches",
            "Stored batches the recording rules did not count: their worker was behind",
            labels=["tenant"],
        )
        for t, count in sorted(m.recorder.dropped_batches(tenant).items()):
            batches.add_metric([t], count)
        yield batches
        failures = CounterMetricFamily(
            "hotspan_recording_rule_refresh_failures",
            "Reloads of the recording rules from the store that failed",
        )
        failures.add_metric([], m.recorder.refresh_failures)
        yield failures


class ServerMetrics:
    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.recorder = Recorder(store)
        self.store = store
        # More metric families per read, of every tenant (None) or one: the alerts' states.
        self.sources: List[Callable[[Optional[str]], Iterable[Metric]]] = []
        r = self.registry
        self.ingest_requests = Counter(
            "hotspan_ingest_requests",
            "Ingest requests received, per endpoint",
            ["endpoint"],
            registry=r,
        )
        self.ingest_bytes = Counter(
            "hotspan_ingest_received_bytes",
            "Request body bytes received by ingest endpoints (as sent: compressed or not)",
            ["endpoint"],
            registry=r,
        )
        self.ingest_rejected = Counter(
            "hotspan_ingest_rejected_requests",
            "Ingest requests refused or failed, per endpoint and reason",
            ["endpoint", "reason"],
            registry=r,
        )
        self._ingest_children: Dict[str, Tuple[Counter, Counter]] = {}
        self.samples = Counter("hotspan_ingested_samples", "Profile samples stored", registry=r)
        self.query_duration = Histogram(
            "hotspan_query_duration_seconds",
            "Time to answer a query, per route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def scrape(self, tenant: Optional[str] = None) -> Collector:
        """What one read of /metrics shows: everything, with the recorded series of every
        tenant or of one."""
        return _Scrape(self, tenant)

    def ingest_done(self, endpoint: str, received: int, status: int) -> None:
        # Children looked up once per endpoint: labels() validates and locks on every call,
        # a few microseconds of the event loop per upload.
        children = self._ingest_children.get(endpoint)
        if children is None:
            children = (self.ingest_requests.labels(endpoint), self.ingest_bytes.labels(endpoint))
            self._ingest_children[endpoint] = children
        children[0].inc()
        children[1].inc(received)
        if status >= 400:
            self.ingest_rejected.labels(endpoint, reason_of(status)).inc()

    def grpc_counted(
        self, endpoint: str, handler: Callable[[bytes, Any], bytes]
    ) -> Callable[[bytes, Any], bytes]:
        """A gRPC unary handler (body, context) whose requests are counted as an ingest
        endpoint's, its abort codes read back as the HTTP status they stand for."""

        def handle(body: bytes, context: Any) -> bytes:
            try:
                answer = handler(body, context)
            except Exception:
                code = getattr(context, "code", lambda: None)()
                status = _HTTP_OF_GRPC.get(getattr(code, "name", ""), 500)
                self.ingest_done(endpoint, len(body), status)
                raise
            self.ingest_done(endpoint, len(body), 200)
            return answer

        return handle

    def watch(self, tenant: str, batch: IngestBatch, write: Future) -> None:
        """Count ``batch`` once its store write is durable, whether or not its request is
        still waiting (it may have timed out, or its client gone).  Call before anything
        else waits on ``write``: the count then precedes the client's acknowledgement."""

        def done(future: Future) -> None:
            if not future.cancelled() and future.exception() is None:
                self.committed(tenant, batch)

        write.add_done_callback(done)

    def committed(self, tenant: str, batch: IngestBatch) -> None:
        """A batch is durable: count it, and queue it for the recording rules.  Runs on the
        store's writer thread; never blocks, never raises."""
        try:
            self.samples.inc(len(batch))
            self.recorder.submit(tenant, batch)
        except Exception:  # noqa: BLE001 - the batch is stored, whatever the counting does
            log.exception("could not count a stored batch")


class IngestCounter:
    """ASGI middleware around an ingest route: counts the request, its body bytes as they
    arrive, and its refusal reason."""

    def __init__(self, app: Any, metrics: ServerMetrics, endpoint: str) -> None:
        self.app = app
        self.metrics = metrics
        self.endpoint = endpoint

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0
        status = 0

        async def counting_receive() -> Any:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def status_send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, counting_receive, status_send)
        except Exception as exc:
            # The application's exception handlers answer it (503 for a store away).
            status = status or (503 if isinstance(exc, StoreUnavailable) else 500)
            raise
        finally:
            self.metrics.ingest_done(self.endpoint, received, status or 500)


class QueryTimer:
    """ASGI middleware around a query route: its latency, labelled by the route's path."""

    def __init__(self, app: Any, metrics: ServerMetrics, route: str) -> None:
        self.app = app
        self.metrics = metrics
        self.route = route

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            elapsed = time.perf_counter() - started
            self.metrics.query_duration.labels(self.route).observe(elapsed)
