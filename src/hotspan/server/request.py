"""What every endpoint does first: authenticate, name the tenant, read a bounded body.

Authentication and the tenant are resolved once per request, before the endpoint runs, by
server.auth's middleware; these helpers read what it resolved."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Callable, FrozenSet, Optional, Tuple, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from hotspan.formats.compression import gunzip
from hotspan.formats.errors import FormatError
from hotspan.server.auth import SCOPE_KEY, TENANT_HEADER, Principal, tenant_from
from hotspan.server.config import ServerConfig
from hotspan.server.errors import HTTPError
from hotspan.store.base import StoreError

if TYPE_CHECKING:
    from hotspan.server.state import ServerState

__all__ = [
    "TENANT_HEADER",
    "check_token",
    "principal_of",
    "query_state",
    "read_body",
    "tenant_from",
    "tenant_of",
]


def principal_of(request: Request) -> Principal:
    """Who made the request; raises the middleware's refusal (401, 403, 400 for a malformed
    tenant).  A request the middleware did not resolve is refused: never open by mistake."""
    found = request.scope.get(SCOPE_KEY)
    if isinstance(found, Principal):
        return found
    if isinstance(found, HTTPError):
        raise HTTPError(found.status, found.message, found.code)
    raise HTTPError(401, "this request was not authenticated")


def tenant_of(request: Request, config: ServerConfig) -> str:
    """The tenant the request reads or writes (its token's, or the one it names)."""
    return principal_of(request).tenant


def query_state(request: Request) -> Tuple[ServerState, str]:
    """The server's state and the tenant of a request the middleware let in."""
    state: ServerState = request.app.state.hotspan
    return state, principal_of(request).tenant


def check_token(request: Request, tokens: FrozenSet[str]) -> None:
    """Refuse the request unless the middleware let it in.  The role it needs comes from the
    route (server.auth.route_access); ``tokens`` are the operator's of that side, which the
    middleware checked already."""
    principal_of(request)


async def read_body(
    request: Request,
    config: ServerConfig,
    max_decompressed: Optional[int] = None,
    limit: Optional[int] = None,
) -> bytes:
    """The request body, refused past the size limit (``limit``, by default the server's),
    gunzipped if Content-Encoding says so (to at most ``max_decompressed`` bytes, by default
    the server's limit)."""
    limit = config.max_body_bytes if limit is None else limit
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPError(413, f"body of {declared} bytes is over the limit of {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "gzip":
        try:
            body = gunzip(body, max_decompressed or config.max_decompressed_bytes)
        except FormatError as exc:
            raise HTTPError(400, f"Content-Encoding gzip: {exc}") from None
    elif encoding not in ("", "identity"):
        raise HTTPError(415, f"unsupported Content-Encoding {encoding!r} (use gzip or none)")
    # Later readers (form parsing) see the decoded body.
    request._body = body  # noqa: SLF001 - Starlette caches the body here
    return body


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(body: bytes) -> Any:
    """A request body's JSON, or a 400 saying why not: malformed, nested too deep, holding a
    number no double holds (``1e400``, Python's ``NaN`` and ``Infinity``, which JSON does
    not have: no handler need check for them), or a string no UTF-8 writer takes (JSON may
    escape a lone surrogate, ``"\\ud800"``, which the store, and every later answer that held
    it, would then fail on)."""
    try:
        parsed = json.loads(body, parse_float=_finite, parse_constant=_not_json)
        json.dumps(parsed, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise HTTPError(400, "body holds text that is not UTF-8 (a lone surrogate?)") from None
    except (ValueError, RecursionError) as exc:
        raise HTTPError(400, f"body is not JSON: {exc}") from None
    return parsed


T = TypeVar("T")


async def in_store(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` (store work, blocking) on a worker thread; a StoreError is a 503 that says
    the store failed, as the rule and settings APIs answer it."""
    try:
        return await run_in_threadpool(fn, *args)
    except StoreError as exc:
        raise HTTPError(503, f"the store failed: {exc}") from None
