"""The API tokens of a tenant: ``/api/v1/tokens`` (``hotspan tokens``).

- ``POST /api/v1/tokens`` with ``{"role": "ingest"|"query"|"admin", "name": "..."}``: a new
  token of the caller's tenant; the answer (201) is the only place its value is ever shown;
- ``GET /api/v1/tokens``: the tenant's tokens (id, role, name, creation time; never a value);
- ``DELETE /api/v1/tokens/{id}``: revoke one.

Only an admin token of the tenant, or the operator's query token, gets here
(server.auth.route_access).  The store keeps a token's SHA-256, not the token.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.server.auth import TOKENS_PATH, new_token, token_hash
from hotspan.server.errors import HTTPError, json_errors
from hotspan.server.request import parse_json, query_state, read_body
from hotspan.store.base import TOKEN_ROLES, StoredToken, StoreError

MAX_BODY_BYTES = 16 * 1024
MAX_NAME_CHARS = 200


async def _body(request: Request, config: Any) -> Any:
    body = await read_body(request, config, MAX_BODY_BYTES, limit=MAX_BODY_BYTES)
    return parse_json(body or b"{}")


@json_errors
async def create(request: Request) -> Response:
    state, tenant = query_state(request)
    body = await _body(request, state.config)
    if not isinstance(body, dict):
        raise HTTPError(400, 'body must be a JSON object {"role": ..., "name": ...}')
    unknown = sorted(set(body) - {"role", "name"})
    if unknown:
        raise HTTPError(400, f"unknown field(s) {unknown} (known: role, name)")
    role = body.get("role")
    if role not in TOKEN_ROLES:
        raise HTTPError(400, f"role must be one of {', '.join(TOKEN_ROLES)}, not {role!r}")
    name = body.get("name") or ""
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise HTTPError(400, f"name must be up to {MAX_NAME_CHARS} printable characters")
    value = new_token()
    token = StoredToken(
        tenant=tenant,
        token_id=secrets.token_hex(8),
        role=role,
        sha256=token_hash(value.encode()),
        name=name,
        created_at=time.time_ns(),
    )
    try:
        await run_in_threadpool(state.store.put_token, token)
    except StoreError as exc:
        raise HTTPError(503, f"could not store the token: {exc}") from None
    await run_in_threadpool(state.auth.changed)
    return JSONResponse({**token.to_json(), "token": value}, status_code=201)


@json_errors
async def list_tokens(request: Request) -> Response:
    state, tenant = query_state(request)
    tokens = await run_in_threadpool(state.store.tokens, tenant)
    return JSONResponse({"tokens": [t.to_json() for t in tokens]})


@json_errors
async def revoke(request: Request) -> Response:
    state, tenant = query_state(request)
    token_id = request.path_params["id"]
    try:
        found = await run_in_threadpool(state.store.delete_token, tenant, token_id)
    except StoreError as exc:
        raise HTTPError(503, f"could not revoke the token: {exc}") from None
    if not found:
        raise HTTPError(404, f"tenant {tenant!r} has no token {token_id[:60]!r}")
    await run_in_threadpool(state.auth.changed)
    return JSONResponse({"revoked": token_id})


routes = [
    Route(TOKENS_PATH, list_tokens, methods=["GET"]),
    Route(TOKENS_PATH, create, methods=["POST"]),
    Route(TOKENS_PATH + "/{id}", revoke, methods=["DELETE"]),
]
