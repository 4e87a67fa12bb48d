"""Tempo's streaming query service (``tempopb.StreamingQuerier``) for Grafana.

With its streaming options on, Grafana's Tempo data source runs searches and TraceQL metrics
over gRPC on the data source's host:port instead of HTTP (pkg/tsdb/tempo: search_stream.go,
metrics_stream.go); the tag RPCs are there for other clients of the service.  Each call is
answered by the same code as its HTTP endpoint, so both give the same answer: the request's
fields become that endpoint's query parameters, its JSON answer the protobuf messages
(``json_format``, whose names are the JSON names of Tempo's own messages).

Tempo streams partial results as its jobs finish, then the rest; hotspan has its answer at
once, and sends it as one message, or as several when it would exceed what a gRPC client
takes in one message (4 MiB in Go by default): Grafana adds up the traces of every message
and draws every series message.  Tokens (``authorization``) and tenants (``x-scope-orgid``)
come from the call's metadata, as over HTTP.

The service has a gRPC server of its own, listening on a free port of 127.0.0.1 only
(``serve``): the main port hands it its HTTP/2 connections (server.http.h2_sniff).  Not on the
OTLP/gRPC port, which takes OTLP only (it may be open to collectors that must not query),
and with its own threads, so that slow queries never hold up ingest.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Type, Union

import grpc
from google.protobuf import json_format
from google.protobuf.message import Message

from hotspan.formats.proto import tempo_pb2
from hotspan.server.auth import QUERY, grpc_tenant
from hotspan.server.errors import HTTPError
from hotspan.server.grpc_auth import TokenCheck, status_of
from hotspan.server.state import ServerState
from hotspan.server.tempo import api as tempo
from hotspan.server.tempo import metrics as tempo_metrics
from hotspan.store.base import StoreError

log = logging.getLogger(__name__)

SERVICE = "tempopb.StreamingQuerier"
SEC = 1_000_000_000
# Below the 4 MiB a Go gRPC client takes by default in one message.
MAX_MESSAGE_BYTES = 3 * 1024 * 1024
# Connections are closed once idle this long, or this old (see serve).
MAX_CONNECTION_IDLE_MS = 5 * 60 * 1000
MAX_CONNECTION_AGE_MS = 60 * 60 * 1000
MAX_CONNECTION_AGE_GRACE_MS = 5 * 60 * 1000

Params = Dict[str, str]
# A call's answer (JSON of the response message) from the state, its tenant and its request
# (Any: each call takes its own request message).
Answer = Callable[[ServerState, str, Any], Dict[str, Any]]


def _put(params: Params, name: str, value: object) -> None:
    """A request field as a query parameter; proto3's zero means "not given"."""
    if value:
        params[name] = str(value)


def _duration(ns: int) -> str:
    return f"{ns // SEC}s" if ns % SEC == 0 else f"{ns}ns"


def _logfmt_value(value: str) -> str:
    """A value of the ``tags`` parameter (logfmt), quoted and escaped as needed."""
    if value and not any(c in value for c in ' ="\\'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def search_params(request: tempo_pb2.SearchRequest) -> Params:
    """GET /api/search's parameters for a SearchRequest."""
    params: Params = {}
    _put(params, "q", request.Query)
    if request.Tags:
        params["tags"] = " ".join(
            f"{k}={_logfmt_value(v)}" for k, v in sorted(request.Tags.items())
        )
    _put(params, "minDuration", request.MinDurationMs and f"{request.MinDurationMs}ms")
    _put(params, "maxDuration", request.MaxDurationMs and f"{request.MaxDurationMs}ms")
    _put(params, "limit", request.Limit)
    _put(params, "spss", request.SpansPerSpanSet)
    _put(params, "start", request.start)
    _put(params, "end", request.end)
    return params


def metrics_params(
    request: Union[tempo_pb2.QueryRangeRequest, tempo_pb2.QueryInstantRequest],
) -> Params:
    """GET /api/metrics/query_range's (or query's) parameters for a QueryRangeRequest or a
    QueryInstantRequest: start and end stay nanoseconds, as Tempo's HTTP API takes them."""
    params: Params = {}
    _put(params, "q", request.query)
    _put(params, "start", request.start)
    _put(params, "end", request.end)
    if isinstance(request, tempo_pb2.QueryRangeRequest):
        _put(params, "step", request.step and _duration(request.step))
        _put(params, "exemplars", request.exemplars)
        _put(params, "maxSeries", request.maxSeries)
        # Tempo's frontend passes the flag on when it is set (false too): true makes the
        # range one step from start to end, as an instant query is computed.
        if request.HasField("instant"):
            params["instant"] = str(request.instant).lower()
    return params


def tag_params(
    request: Union[tempo_pb2.SearchTagsRequest, tempo_pb2.SearchTagValuesRequest],
) -> Params:
    """The tag endpoints' parameters for a SearchTagsRequest or a SearchTagValuesRequest."""
    params: Params = {}
    _put(params, "q", request.query)
    _put(params, "start", request.start)
    _put(params, "end", request.end)
    if isinstance(request, tempo_pb2.SearchTagsRequest):
        _put(params, "scope", request.scope)
        _put(params, "limit", request.maxTagsPerScope)
    else:
        _put(params, "limit", request.maxTagValues)
    return params


def _search(state: ServerState, tenant: str, request: tempo_pb2.SearchRequest) -> Dict[str, Any]:
    return tempo.search_json(state, tenant, search_params(request))


def _metrics_range(
    state: ServerState, tenant: str, request: tempo_pb2.QueryRangeRequest
) -> Dict[str, Any]:
    return tempo_metrics.query_range_json(state, tenant, metrics_params(request))


def _metrics_instant(
    state: ServerState, tenant: str, request: tempo_pb2.QueryInstantRequest
) -> Dict[str, Any]:
    return tempo_metrics.query_instant_json(state, tenant, metrics_params(request))


def _tag_names(version: int) -> Answer:
    def answer(
        state: ServerState, tenant: str, request: tempo_pb2.SearchTagsRequest
    ) -> Dict[str, Any]:
        return tempo.tag_names_json(state, tenant, tag_params(request), version)

    return answer


def _tag_values(version: int) -> Answer:
    def answer(
        state: ServerState, tenant: str, request: tempo_pb2.SearchTagValuesRequest
    ) -> Dict[str, Any]:
        return tempo.tag_values_json(state, tenant, request.tagName, tag_params(request), version)

    return answer


def _segments(message: Message, field: str) -> List[Message]:
    """The message, or pieces of it each under MAX_MESSAGE_BYTES: its repeated ``field``
    split between them, the rest of it (metrics) in the last one."""
    items = list(getattr(message, field))
    if message.ByteSize() <= MAX_MESSAGE_BYTES or len(items) < 2:
        return [message]
    half = len(items) // 2
    first = type(message)()
    getattr(first, field).extend(items[:half])
    rest = type(message)()
    rest.CopyFrom(message)
    del getattr(rest, field)[:half]
    return _segments(first, field) + _segments(rest, field)


def _handler(
    state: ServerState,
    answer: Answer,
    response_type: Type[Message],
    field: Optional[str],
) -> Callable[[Message, grpc.ServicerContext], Iterator[Message]]:
    def handle(request: Message, context: grpc.ServicerContext) -> Iterator[Message]:
        try:
            tenant = grpc_tenant(state.auth, QUERY, context.invocation_metadata())
            body = answer(state, tenant, request)
        except HTTPError as exc:
            context.abort(status_of(exc), exc.message)
        except StoreError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"the store is unavailable: {exc}")
        message = json_format.ParseDict(body, response_type(), ignore_unknown_fields=True)
        yield from _segments(message, field) if field else [message]

    return handle


def service_handler(state: ServerState) -> grpc.GenericRpcHandler:
    """The StreamingQuerier service, for a grpcio server."""
    methods: Dict[str, Tuple[Type[Message], Type[Message], Answer, Optional[str]]] = {
        "Search": (tempo_pb2.SearchRequest, tempo_pb2.SearchResponse, _search, "traces"),
        "MetricsQueryRange": (
            tempo_pb2.QueryRangeRequest,
            tempo_pb2.QueryRangeResponse,
            _metrics_range,
            "series",
        ),
        "MetricsQueryInstant": (
            tempo_pb2.QueryInstantRequest,
            tempo_pb2.QueryInstantResponse,
            _metrics_instant,
            "series",
        ),
        "SearchTags": (
            tempo_pb2.SearchTagsRequest,
            tempo_pb2.SearchTagsResponse,
            _tag_names(1),
            None,
        ),
        "SearchTagsV2": (
            tempo_pb2.SearchTagsRequest,
            tempo_pb2.SearchTagsV2Response,
            _tag_names(2),
            None,
        ),
        "SearchTagValues": (
            tempo_pb2.SearchTagValuesRequest,
            tempo_pb2.SearchTagValuesResponse,
            _tag_values(1),
            None,
        ),
        "SearchTagValuesV2": (
            tempo_pb2.SearchTagValuesRequest,
            tempo_pb2.SearchTagValuesV2Response,
            _tag_values(2),
            "tagValues",
        ),
    }
    handlers = {
        name: grpc.unary_stream_rpc_method_handler(
            _handler(state, answer, response, field),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        for name, (request, response, answer, field) in methods.items()
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def serve(
    state: ServerState,
    idle_ms: int = MAX_CONNECTION_IDLE_MS,
    age_ms: int = MAX_CONNECTION_AGE_MS,
) -> Tuple[grpc.Server, int]:
    """Start a gRPC server answering the service on a free port of 127.0.0.1; returns it
    and the port (OSError if no port can be bound).  A connection without a call for
    ``idle_ms`` is closed (GOAWAY, then close), and so is any connection after ``age_ms``, its
    calls given MAX_CONNECTION_AGE_GRACE_MS more to finish: each holds one of the main port's
    pipes (server.http.h2_sniff), which end with it, and gRPC clients reconnect on their own."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="hotspan-tempo-grpc"),
        # Beyond this many calls in progress, RESOURCE_EXHAUSTED rather than a queue.
        maximum_concurrent_rpcs=32,
        interceptors=[TokenCheck(state.auth, QUERY)],
        options=[
            ("grpc.max_receive_message_length", state.config.max_body_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.max_connection_idle_ms", idle_ms),
            ("grpc.max_connection_age_ms", age_ms),
            ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
        ],
    )
    server.add_generic_rpc_handlers((service_handler(state),))
    try:
        port = server.add_insecure_port("127.0.0.1:0")
    except RuntimeError:
        port = 0
    if port == 0:
        raise OSError("no port of 127.0.0.1 can be bound for the gRPC queries")
    server.start()
    return server, port
