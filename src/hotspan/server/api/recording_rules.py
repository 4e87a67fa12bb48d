"""The recording rules API, per tenant (query tokens, ``X-Scope-OrgID``).

hotspan's REST form:

- ``GET /api/v1/recording-rules``: ``{"rules": [...]}``
- ``GET /api/v1/recording-rules/{id}``
- ``PUT /api/v1/recording-rules/{id}`` with ``{"metricName", "profileType", "selector" or
  "matchers", "groupBy", "externalLabels": {...}, "functionName", "generation"}``: creates or
  replaces the rule (with ``generation``, only if the stored rule is still at it)
- ``DELETE /api/v1/recording-rules/{id}``

and Pyroscope's Connect service ``settings.v1.RecordingRulesService`` (JSON codec):
``ListRecordingRules``, ``GetRecordingRule``, ``UpsertRecordingRule`` (no id: a new rule
with a random one; an existing rule is replaced only at the generation the request names),
``DeleteRecordingRule``.  Both keep the rules as store documents, which every server of the
store reads (:mod:`hotspan.metrics.recorder`).
"""

from __future__ import annotations

import random
import string
import threading
from typing import Any, Dict, List, Optional, Tuple

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.metrics.rules import (
    KIND,
    MAX_RULES_PER_TENANT,
    RecordingRule,
    RuleError,
    check_family,
    check_id,
    from_connect,
    from_document,
    from_json,
)
from hotspan.server.errors import HTTPError, json_errors
from hotspan.server.pyroscope.connect import json_request, unary
from hotspan.server.request import in_store, parse_json, query_state, read_body
from hotspan.server.state import ServerState

MAX_BODY_BYTES = 64 * 1024
SERVICE = "/settings.v1.RecordingRulesService"
# Read-check-write of a rule's generation, one at a time in this process (servers sharing a
# store can still race; the last write wins there).
_WRITE_LOCK = threading.Lock()


def _rules(state: ServerState, tenant: str) -> List[RecordingRule]:
    return [rule for _, rule in _stored(state, tenant)]


def _stored(state: ServerState, tenant: Optional[str]) -> List[Tuple[str, RecordingRule]]:
    """(tenant, rule) of one tenant's stored rules, or of every tenant's (None)."""
    out = []
    for doc in state.store.documents(KIND, tenant):
        try:
            out.append((doc.tenant, from_document(doc.body)))
        except (RuleError, AttributeError, TypeError):
            continue  # logged by the recorder, which reads the same documents
    return out


def _find(state: ServerState, tenant: str, rule_id: str) -> Optional[RecordingRule]:
    return next((r for r in _rules(state, tenant) if r.id == rule_id), None)


def _upsert(
    state: ServerState, tenant: str, rule: RecordingRule, observed: int, strict: bool
) -> RecordingRule:
    """Store the rule at its next generation.  ``observed``: the generation the client saw,
    which must be the stored one when given (or, ``strict``, always, as Pyroscope does)."""
    with _WRITE_LOCK:
        everyone = _stored(state, None)
        try:
            check_family(rule, tenant, everyone)
        except RuleError as exc:
            raise HTTPError(400, str(exc)) from None
        rules = [r for t, r in everyone if t == tenant]
        current = next((r for r in rules if r.id == rule.id), None)
        if current is None:
            if len(rules) >= MAX_RULES_PER_TENANT:
                raise HTTPError(
                    429, f"the tenant has {len(rules)} recording rules, the most allowed"
                )
            generation = 1
        else:
            if (strict or observed) and observed != current.generation:
                raise HTTPError(
                    409,
                    f"conflicting update: rule {rule.id!r} is at generation "
                    f"{current.generation}, the request names {observed}; read it again",
                    "already_exists",
                )
            generation = current.generation + 1
        stored = rule.with_generation(generation)
        state.store.put_document(tenant, KIND, rule.id, stored.to_json())
    _reload(state)
    return stored


def _delete(state: ServerState, tenant: str, rule_id: str) -> bool:
    with _WRITE_LOCK:
        deleted = state.store.delete_document(tenant, KIND, rule_id)
    _reload(state)
    return deleted


def _reload(state: ServerState) -> None:
    if state.metrics is not None:
        state.metrics.recorder.refresh()


async def _json_body(request: Request, state: ServerState) -> Any:
    body = await read_body(request, state.config, MAX_BODY_BYTES, limit=MAX_BODY_BYTES)
    if not body.strip():
        return {}
    return parse_json(body)


def _rule_id(request: Request) -> str:
    try:
        return check_id(request.path_params["id"])
    except RuleError as exc:
        raise HTTPError(400, str(exc)) from None


# -- REST -------------------------------------------------------------------------------------


@json_errors
async def list_rules(request: Request) -> Response:
    state, tenant = query_state(request)
    rules = await in_store(_rules, state, tenant)
    return JSONResponse({"rules": [r.to_json() for r in rules]})


@json_errors
async def get_rule(request: Request) -> Response:
    state, tenant = query_state(request)
    rule_id = _rule_id(request)
    rule = await in_store(_find, state, tenant, rule_id)
    if rule is None:
        raise HTTPError(404, f"no recording rule {rule_id!r}")
    return JSONResponse(rule.to_json())


@json_errors
async def put_rule(request: Request) -> Response:
    state, tenant = query_state(request)
    rule_id = _rule_id(request)
    try:
        rule, observed = from_json(await _json_body(request, state), rule_id)
    except RuleError as exc:
        raise HTTPError(400, str(exc)) from None
    stored = await in_store(_upsert, state, tenant, rule, observed, False)
    return JSONResponse(stored.to_json())


@json_errors
async def delete_rule(request: Request) -> Response:
    state, tenant = query_state(request)
    rule_id = _rule_id(request)
    if not await in_store(_delete, state, tenant, rule_id):
        raise HTTPError(404, f"no recording rule {rule_id!r}")
    return JSONResponse({"deleted": True})


# -- Connect (Pyroscope's settings.v1.RecordingRulesService) ----------------------------------


async def _connect_request(request: Request) -> Dict[str, Any]:
    state: ServerState = request.app.state.hotspan
    return await json_request(request, state.config, MAX_BODY_BYTES)


def _connect_id(body: Dict[str, Any]) -> str:
    rule_id = body.get("id")
    if not isinstance(rule_id, str) or not rule_id.strip():
        raise HTTPError(400, "id is required")
    try:
        return check_id(rule_id.strip())
    except RuleError as exc:
        raise HTTPError(400, str(exc)) from None


def _new_id() -> str:
    # Pyroscope's shape: ten letters.
    return "".join(random.choices(string.ascii_letters, k=10))


@unary
async def connect_list(request: Request) -> Response:
    state, tenant = query_state(request)
    await _connect_request(request)
    rules = await in_store(_rules, state, tenant)
    return JSONResponse({"rules": [r.to_connect() for r in rules]})


@unary
async def connect_get(request: Request) -> Response:
    state, tenant = query_state(request)
    rule_id = _connect_id(await _connect_request(request))
    rule = await in_store(_find, state, tenant, rule_id)
    if rule is None:
        raise HTTPError(404, f"no rule with id={rule_id!r} found")
    return JSONResponse({"rule": rule.to_connect()})


@unary
async def connect_upsert(request: Request) -> Response:
    state, tenant = query_state(request)
    body = await _connect_request(request)
    rule_id = body.get("id") or _new_id()
    if not isinstance(rule_id, str):
        raise HTTPError(400, "id must be a string")
    try:
        rule, observed = from_connect(body, rule_id.strip())
    except RuleError as exc:
        raise HTTPError(400, f"invalid request: {exc}") from None
    stored = await in_store(_upsert, state, tenant, rule, observed, bool(body.get("id")))
    return JSONResponse({"rule": stored.to_connect()})


@unary
async def connect_delete(request: Request) -> Response:
    state, tenant = query_state(request)
    rule_id = _connect_id(await _connect_request(request))
    if not await in_store(_delete, state, tenant, rule_id):
        raise HTTPError(404, f"no rule with ID={rule_id!r} found")
    return JSONResponse({})


routes = [
    Route("/api/v1/recording-rules", list_rules, methods=["GET"]),
    Route("/api/v1/recording-rules/{id}", get_rule, methods=["GET"]),
    Route("/api/v1/recording-rules/{id}", put_rule, methods=["PUT"]),
    Route("/api/v1/recording-rules/{id}", delete_rule, methods=["DELETE"]),
    Route(f"{SERVICE}/ListRecordingRules", connect_list, methods=["POST"]),
    Route(f"{SERVICE}/GetRecordingRule", connect_get, methods=["POST"]),
    Route(f"{SERVICE}/UpsertRecordingRule", connect_upsert, methods=["POST"]),
    Route(f"{SERVICE}/DeleteRecordingRule", connect_delete, methods=["POST"]),
]
