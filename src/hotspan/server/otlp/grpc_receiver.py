"""OTLP/gRPC receivers: ``TraceService/Export`` and ``ProfilesService/Export`` (port 4317).

Requests arrive as raw bytes and are decoded here, so that a message that does not parse is an
``INVALID_ARGUMENT`` with the reason rather than grpcio's generic ``INTERNAL``.  Tokens come
from the ``authorization`` metadata and the tenant from ``x-scope-orgid``, as over HTTP.
Handlers run on grpcio's thread pool and wait for the store to make the data durable.
Tempo's streaming queries have a gRPC server of their own, on loopback (server.tempo.grpc_api):
this port takes OTLP only, as the OTLP/HTTP port does, and queries never hold up ingest.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Callable, Tuple

import grpc

from hotspan.formats.errors import FormatError
from hotspan.formats.otlp import TooLarge
from hotspan.server.auth import INGEST, grpc_tenant
from hotspan.server.errors import HTTPError
from hotspan.server.grpc_auth import TokenCheck, status_of
from hotspan.server.ingestion import commit_spans_sync, commit_sync
from hotspan.server.otlp.http_receiver import convert_profiles, convert_traces
from hotspan.server.state import ServerState
from hotspan.store.base import StoreError

log = logging.getLogger(__name__)

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
PROFILES_SERVICE = "opentelemetry.proto.collector.profiles.v1development.ProfilesService"
WRITE_TIMEOUT_S = 60


def _handler(
    state: ServerState, export: Callable[[ServerState, str, bytes], bytes]
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def handle(body: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            tenant = grpc_tenant(state.auth, INGEST, context.invocation_metadata())
            return export(state, tenant, body)
        except TooLarge as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except FormatError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except HTTPError as exc:
            context.abort(status_of(exc), exc.message)
        except StoreError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"could not store the data: {exc}")
        except futures.TimeoutError:
            # The write may still land; OTLP clients retry UNAVAILABLE, and reads dedup spans.
            context.abort(grpc.StatusCode.UNAVAILABLE, "the store is busy; try again")
        raise AssertionError("unreachable: abort raises")

    return handle


def _export_traces(state: ServerState, tenant: str, body: bytes) -> bytes:
    result, response = convert_traces(body, is_json=False)
    commit_spans_sync(state, tenant, result.batch, WRITE_TIMEOUT_S)
    return response.SerializeToString()


def _export_profiles(state: ServerState, tenant: str, body: bytes) -> bytes:
    result, response = convert_profiles(body, is_json=False)
    commit_sync(state, tenant, result.batch, WRITE_TIMEOUT_S)
    return response.SerializeToString()


# The endpoint each method's requests are counted as (hotspan_ingest_requests_total).
ENDPOINTS = {
    f"/{TRACE_SERVICE}/Export": "otlp_grpc_traces",
    f"/{PROFILES_SERVICE}/Export": "otlp_grpc_profiles",
}


def _count_refused(state: ServerState) -> Callable[[str, int], None]:
    """Counts a call TokenCheck refused as its handler counts the calls it refuses."""

    def refused(method: str, status: int) -> None:
        endpoint = ENDPOINTS.get(method)
        if state.metrics is not None and endpoint is not None:
            state.metrics.ingest_done(endpoint, 0, status)

    return refused


def start(state: ServerState, host: str, port: int) -> Tuple[grpc.Server, int]:
    """Serve both services on ``host:port`` (0: any free port); returns the bound port."""
    limit = state.config.max_body_bytes
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="hotspan-grpc"),
        # Beyond this many requests in progress, RESOURCE_EXHAUSTED (clients retry) rather
        # than an unbounded queue of bodies waiting for a worker.
        maximum_concurrent_rpcs=32,
        interceptors=[TokenCheck(state.auth, INGEST, _count_refused(state))],
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.so_reuseport", 0),
        ],
    )
    for service, export in ((TRACE_SERVICE, _export_traces), (PROFILES_SERVICE, _export_profiles)):
        name = ENDPOINTS[f"/{service}/Export"]
        handler = _handler(state, export)
        if state.metrics is not None:
            handler = state.metrics.grpc_counted(name, handler)
        method: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"Export": method}),)
        )
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0  # grpcio says why on stderr; the caller names the option to change
    if bound == 0:
        raise OSError("the address is in use or cannot be bound")
    server.start()
    return server, bound
