"""Errors that become HTTP responses with a reason, never a crashed server."""

from __future__ import annotations

import functools
from typing import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response


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


def json_errors(
    endpoint: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint, with an HTTPError it raises answered as ``{"error": reason}``: the shape
    of hotspan's own JSON APIs (agent settings, recording rules)."""

    @functools.wraps(endpoint)
    async def answered(request: Request) -> Response:
        try:
            return await endpoint(request)
        except HTTPError as exc:
            return JSONResponse({"error": exc.message}, status_code=exc.status)

    return answered
