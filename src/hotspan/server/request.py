"""What every endpoint does first: authenticate, name the tenant, read a bounded body."""

from __future__ import annotations

import base64
import hmac
import re
from typing import TYPE_CHECKING, FrozenSet, Optional, Tuple

from starlette.requests import Request

from hotspan.formats.compression import gunzip
from hotspan.formats.errors import FormatError
from hotspan.server.config import ServerConfig
from hotspan.server.errors import HTTPError

if TYPE_CHECKING:
    from hotspan.server.state import ServerState

TENANT_HEADER = "X-Scope-OrgID"
# The characters Cortex/Mimir/Pyroscope accept in a tenant id.
_TENANT = re.compile(r"[a-zA-Z0-9!\-_.*'()]{1,150}")


def tenant_of(request: Request, config: ServerConfig) -> str:
    return tenant_from(request.headers.get(TENANT_HEADER), config)


def tenant_from(tenant: Optional[str], config: ServerConfig) -> str:
    """The tenant named by an ``X-Scope-OrgID`` value (HTTP header or gRPC metadata)."""
    if tenant is None or tenant == "":
        return config.default_tenant
    if not _TENANT.fullmatch(tenant) or tenant in (".", ".."):
        raise HTTPError(400, f"invalid tenant id in {TENANT_HEADER}: {tenant[:60]!r}")
    return tenant


def query_state(request: Request) -> Tuple[ServerState, str]:
    """The server's state and the tenant of a query, once its query token is checked."""
    state: ServerState = request.app.state.hotspan
    check_token(request, state.config.query_tokens)
    return state, tenant_of(request, state.config)


def check_token(request: Request, tokens: FrozenSet[str]) -> None:
    check_authorization(request.headers.get("authorization", ""), tokens)


def check_authorization(header: str, tokens: FrozenSet[str]) -> None:
    """Refuse (401) unless ``header`` (an Authorization value) carries one of the tokens."""
    if not tokens:
        return
    scheme, _, credential = header.partition(" ")
    token = ""
    if scheme.lower() == "bearer":
        token = credential.strip()
    elif scheme.lower() == "basic":
        try:
            token = base64.b64decode(credential.strip()).decode().partition(":")[2]
        except (ValueError, UnicodeDecodeError):
            token = ""
    if not token or not any(hmac.compare_digest(token, t) for t in tokens):
        raise HTTPError(401, "missing or invalid token (send Authorization: Bearer <token>)")


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
