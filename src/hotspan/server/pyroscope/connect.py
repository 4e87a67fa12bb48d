"""The unary half of the Connect protocol (connectrpc.com/docs/protocol), enough for
Grafana's Pyroscope data source, ``profilecli`` and the Pyroscope SDKs.

Requests and responses are protobuf (``application/proto``) or protojson
(``application/json``, int64 as strings); errors are ``{"code": ..., "message": ...}``.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Dict, Type, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from starlette.requests import Request
from starlette.responses import Response

from hotspan.server.config import ServerConfig
from hotspan.server.errors import CONNECT_STATUS, HTTPError
from hotspan.server.request import parse_json, read_body

M = TypeVar("M", bound=Message)

PROTO = "application/proto"
JSON = "application/json"


def _codec(request: Request) -> str:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in (PROTO, "application/x-protobuf", "application/protobuf"):
        return PROTO
    if ctype == JSON or ctype == "":
        return JSON
    raise HTTPError(
        415, f"content type {ctype!r} is not supported (use {PROTO} or {JSON})", "unknown"
    )


async def read_message(request: Request, config: ServerConfig, cls: Type[M]) -> M:
    codec = _codec(request)
    body = await read_body(request, config)
    msg = cls()
    try:
        if codec == PROTO:
            msg.ParseFromString(body)
        elif body.strip():
            json_format.Parse(body, msg, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, ValueError, UnicodeDecodeError) as exc:
        raise HTTPError(400, f"cannot decode {cls.DESCRIPTOR.name}: {exc}") from None
    return msg


def write_message(request: Request, msg: Message) -> Response:
    if _codec(request) == PROTO:
        return Response(msg.SerializeToString(), media_type=PROTO)
    text = json_format.MessageToJson(msg, indent=None, preserving_proto_field_name=False)
    return Response(text, media_type=JSON)


def error_response(exc: HTTPError) -> Response:
    code = exc.code if exc.code in CONNECT_STATUS else "unknown"
    # Connect answers an unsupported codec with a bare 415; a too-large body keeps its 413.
    status = exc.status if exc.status in (413, 415) else CONNECT_STATUS[code]
    return Response(
        json.dumps({"code": code, "message": exc.message}),
        status_code=status,
        media_type=JSON,
    )


Handler = Callable[[Request], Awaitable[Response]]


def unary(handler: Handler) -> Handler:
    """Wrap a handler so that every HTTPError becomes a Connect error."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except HTTPError as exc:
            return error_response(exc)

    endpoint.__name__ = handler.__name__
    return endpoint


async def json_request(request: Request, config: ServerConfig, max_bytes: int) -> Dict[str, Any]:
    """A Connect request in JSON (the services hotspan answers in JSON only): the object of
    its body, ``{}`` for none.  JSON whatever the type says but protobuf, which is a 415: a
    browser's fetch of a string body, as Grafana's apps may send, says text/plain."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype.startswith(("application/proto", "application/grpc", "application/x-protobuf")):
        raise HTTPError(415, f"content type {ctype!r} is not supported here (use application/json)")
    body = await read_body(request, config, max_bytes, limit=max_bytes)
    if not body.strip():
        return {}
    parsed = parse_json(body)
    if not isinstance(parsed, dict):
        raise HTTPError(400, "the request must be a JSON object")
    return parsed
