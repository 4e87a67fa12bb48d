"""Errors that become HTTP responses with a reason, never a crashed server."""

from __future__ import annotations

import functools
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response


class HTTPError(Exception):
    def __init__(self, status: int, message: str, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _CODE_OF_STATUS.get(status, "unknown")


_CODE_OF_STATUS = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    408: "deadline_exceeded",
    413: "resource_exhausted",
    415: "invalid_argument",
    429: "resource_exhausted",
    500: "internal",
    501: "unimplemented",
    503: "unavailable",
}

# Connect's code -> HTTP status table (connectrpc.com/docs/protocol#error-codes).
CONNECT_STATUS = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}


Endpoint = Callable[[Request], Awaitable[Response]]


def answering(shape: Callable[[HTTPError], Response]) -> Callable[[Endpoint], Endpoint]:
    """A decorator: the endpoint, with an HTTPError it raises answered in ``shape``, the error
    form of the protocol it serves."""

    def decorate(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def answered(request: Request) -> Response:
            try:
                return await endpoint(request)
            except HTTPError as exc:
                return shape(exc)

        return answered

    return decorate


def json_error(exc: HTTPError) -> Response:
    """``{"error": reason}``: the shape of hotspan's own JSON APIs."""
    return JSONResponse({"error": exc.message}, status_code=exc.status)


def text_error(exc: HTTPError) -> Response:
    """The reason as a line of plain text: Tempo's HTTP API, the trace views beside it,
    /metrics."""
    return PlainTextResponse(exc.message + "\n", status_code=exc.status)


def bare_error(exc: HTTPError) -> Response:
    """The reason as a line without a content type: Pyroscope's ``/ingest`` answers."""
    return Response(exc.message + "\n", status_code=exc.status)


json_errors = answering(json_error)
text_errors = answering(text_error)
bare_errors = answering(bare_error)
