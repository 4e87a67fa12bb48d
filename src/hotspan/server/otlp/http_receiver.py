"""OTLP/HTTP receivers: ``POST /v1/traces`` and ``POST /v1development/profiles``.

As OTLP/HTTP specifies (opentelemetry.io/docs/specs/otlp/#otlphttp): protobuf or JSON bodies,
gzip allowed; the answer uses the request's encoding; a request with some bad items stores the
rest and answers 200 with ``partial_success``; a request that cannot be used at all gets 400
with a ``google.rpc.Status`` whose message says why.  The OTLP/gRPC receivers
(``hotspan.server.otlp.grpc_receiver``) share the conversion functions below.
"""

from __future__ import annotations

import json
from typing import Awaitable, Callable, Tuple

from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response

from hotspan.formats import otlp_profiles, otlp_traces
from hotspan.formats.errors import FormatError
from hotspan.formats.otlp import TooLarge, encode_json
from hotspan.formats.protowire import uvarint
from hotspan.server.errors import HTTPError
from hotspan.server.ingestion import commit, commit_spans, off_loop
from hotspan.server.request import check_token, read_body, tenant_of
from hotspan.server.state import ServerState

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
PATHS = ("/v1/traces", "/v1development/profiles")
# google.rpc.Code of an HTTP status, for the Status in error answers.
_RPC_CODE = {401: 16, 403: 7, 413: 8, 429: 8, 503: 14}
INVALID_ARGUMENT = 3


def _encoding(request: Request) -> bool:
    """True for JSON, False for protobuf; anything else is refused."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in (PROTOBUF, "application/protobuf"):
        return False
    if ctype == JSON:
        return True
    raise HTTPError(415, f"content type {ctype!r} is not OTLP (use {PROTOBUF} or {JSON})")


def _status_bytes(code: int, message: str) -> bytes:
    """A ``google.rpc.Status`` with a code and a message (its fields 1 and 2)."""
    text = message.encode()
    out = bytearray(b"\x08")
    out += uvarint(code)
    out += b"\x12"
    out += uvarint(len(text))
    return bytes(out + text)


def _error(status: int, message: str, is_json: bool) -> Response:
    code = _RPC_CODE.get(status, INVALID_ARGUMENT)
    if is_json:
        body = json.dumps({"code": code, "message": message}).encode()
    else:
        body = _status_bytes(code, message)
    return Response(body, status_code=status, media_type=JSON if is_json else PROTOBUF)


def _answer(msg: Message, is_json: bool) -> Response:
    if is_json:
        return Response(json.dumps(encode_json(msg)), media_type=JSON)
    return Response(msg.SerializeToString(), media_type=PROTOBUF)


def convert_traces(body: bytes, is_json: bool) -> Tuple[otlp_traces.SpansResult, Message]:
    """Spans to store and the answer to give; FormatError when nothing can be stored."""
    if is_json:
        result = otlp_traces.to_span_batch(otlp_traces.decode(body, is_json), len(body))
    else:
        result = otlp_traces.from_protobuf(body)
    rejected = result.rejected
    if rejected.count and not len(result.batch):
        raise FormatError(f"no span could be stored: {rejected.message()}")
    response = otlp_traces.ExportTraceServiceResponse()
    if rejected.count:
        response.partial_success.rejected_spans = rejected.count
        response.partial_success.error_message = rejected.message()
    return result, response


def convert_profiles(body: bytes, is_json: bool) -> Tuple[otlp_profiles.ProfilesResult, Message]:
    result = otlp_profiles.to_batch(otlp_profiles.decode(body, is_json))
    rejected = result.rejected
    if rejected.count and not result.accepted:
        raise FormatError(f"no profile could be stored: {rejected.message()}")
    response = otlp_profiles.ExportProfilesServiceResponse()
    if rejected.count:
        response.partial_success.rejected_profiles = rejected.count
        response.partial_success.error_message = rejected.message()
    return result, response


async def _store_spans(state: ServerState, tenant: str, body: bytes, is_json: bool) -> Message:
    # On a decoding thread: a request's cost is per item, and the event loop must stay free
    # (the C span reader runs there without the GIL).
    result, response = await off_loop(convert_traces, body, is_json)
    await commit_spans(state, tenant, result.batch)
    return response


async def _store_profiles(state: ServerState, tenant: str, body: bytes, is_json: bool) -> Message:
    result, response = await off_loop(convert_profiles, body, is_json)
    await commit(state, tenant, result.batch)
    return response


Receive = Callable[[ServerState, str, bytes, bool], Awaitable[Message]]


async def _receive(request: Request, store: Receive) -> Response:
    state: ServerState = request.app.state.hotspan
    # Errors found before the body is read answer in the request's encoding as well.
    is_json = request.headers.get("content-type", "").split(";")[0].strip().lower() == JSON
    try:
        check_token(request, state.config.ingest_tokens)
        tenant = tenant_of(request, state.config)
        is_json = _encoding(request)
        # OTLP batches are small; a compressed body may expand only to the body limit.
        body = await read_body(request, state.config, state.config.max_body_bytes)
        response = await store(state, tenant, body, is_json)
    except TooLarge as exc:
        return _error(413, str(exc), is_json)
    except FormatError as exc:
        return _error(400, str(exc), is_json)
    except HTTPError as exc:
        return _error(exc.status, exc.message, is_json)
    return _answer(response, is_json)


async def traces(request: Request) -> Response:
    return await _receive(request, _store_spans)


async def profiles(request: Request) -> Response:
    return await _receive(request, _store_profiles)
