"""Live agent settings for a fleet: rules operators set per service, which agents follow.

Operators put rules through ``/api/v1/settings/{service}`` (query tokens); agents learn the
rule that matches them in the answer to each upload that carries ``X-Hotspan-Instance``, or
from ``GET /api/v1/agent/settings`` (ingest tokens), and report what they applied, which the
operator API shows per instance (docs/agent.md, "Fleet settings from the server").  The settings'
checks are :func:`hotspan.model.agent_settings.validate_settings`, shared with the agent and
the CLI.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Iterable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.formats import ingest_params
from hotspan.formats.errors import FormatError
from hotspan.model.agent_settings import (
    SettingsError,
    validate_settings,
)
from hotspan.model.labels import SelectorError
from hotspan.model.settings_rules import matching_rule, normalize_selector
from hotspan.server.errors import HTTPError, json_errors
from hotspan.server.ingestion import agent_labels, observe_agent, settings_answer
from hotspan.server.instances import Instance
from hotspan.server.request import check_token, parse_json, query_state, read_body, tenant_of
from hotspan.server.state import ServerState
from hotspan.store.base import SettingsRule, StoreError

MAX_BODY_BYTES = 64 * 1024
MAX_SERVICE_CHARS = 200
# The operator API leaves out instances silent for longer than this.
INSTANCE_SHOWN_NS = 600 * 10**9


# -- endpoints ----------------------------------------------------------------------------------


@json_errors
async def poll(request: Request) -> Response:
    """``GET /api/v1/agent/settings?name=app{k=v}``: an agent that is not uploading asks."""
    state: ServerState = request.app.state.hotspan
    check_token(request, state.config.ingest_tokens)
    tenant = tenant_of(request, state.config)
    name = request.query_params.get("name")
    if not name:
        raise HTTPError(400, "query parameter 'name' (app{key=value,...}) is required")
    try:
        app = ingest_params.parse_app_name(name)
    except FormatError as exc:
        raise HTTPError(400, str(exc)) from None
    # A poll without the instance header still learns its settings; it is just not recorded.
    answer = observe_agent(request.headers, state, tenant, app)
    if answer is None:
        answer = settings_answer(state, tenant, agent_labels(app))
    return JSONResponse(answer)


def _service(request: Request) -> str:
    service = request.path_params["service"]
    if not service or len(service) > MAX_SERVICE_CHARS or not service.isprintable():
        raise HTTPError(400, f"service name must be 1 to {MAX_SERVICE_CHARS} printable characters")
    return service


def _selector_param(text: str) -> str:
    try:
        return normalize_selector(text)
    except SelectorError as exc:
        raise HTTPError(400, f"bad selector {text[:100]!r}: {exc}") from None


def instance_json(inst: Instance, rules: Iterable[SettingsRule]) -> Dict[str, Any]:
    rule = matching_rule(rules, inst.labels)
    expected = rule.version if rule is not None else 0
    # A stopped agent (its last upload said so) follows nothing any more: neither following
    # nor failing to follow a rule changed since.
    stopped = inst.status.get("stopped") is True
    return {
        "instance": inst.instance,
        "labels": dict(inst.labels),
        "last_seen": inst.last_seen,
        "status": dict(inst.status),
        "stopped": stopped,
        "rule_selector": rule.selector if rule is not None else None,
        "expected_version": expected,
        "follows": None if stopped else inst.status.get("settings_version") == expected,
    }


@json_errors
async def list_rules(request: Request) -> Response:
    """``GET /api/v1/settings``: every rule of the tenant."""
    state, tenant = query_state(request)
    return JSONResponse({"rules": [r.to_json() for r in state.store.settings_rules(tenant)]})


@json_errors
async def get_service(request: Request) -> Response:
    """``GET /api/v1/settings/{service}``: its rules and the instances seen lately."""
    state, tenant = query_state(request)
    service = _service(request)
    rules = state.store.settings_rules(tenant, service)
    since = time.time_ns() - INSTANCE_SHOWN_NS
    instances = state.instances.instances(tenant, service, since)
    return JSONResponse(
        {
            "service": service,
            "rules": [r.to_json() for r in rules],
            "instances": [instance_json(i, rules) for i in instances],
        }
    )


async def _json_body(request: Request, config: Any) -> Any:
    return parse_json(await read_body(request, config, MAX_BODY_BYTES, limit=MAX_BODY_BYTES))


@json_errors
async def put_rule(request: Request) -> Response:
    """``PUT /api/v1/settings/{service}`` with ``{"selector": "...", "settings": {...}}``."""
    state, tenant = query_state(request)
    service = _service(request)
    body = await _json_body(request, state.config)
    if not isinstance(body, dict):
        raise HTTPError(400, 'body must be a JSON object {"selector": ..., "settings": ...}')
    # "service" is tolerated when it repeats the path; any other key is likely a typo.
    unknown = sorted(set(body) - {"selector", "settings", "service"})
    if unknown:
        raise HTTPError(400, f"unknown field(s) {unknown} (known: selector, settings)")
    if "service" in body and body["service"] != service:
        raise HTTPError(400, f"field service {body['service']!r} is not the path's {service!r}")
    selector = body.get("selector") or ""
    if not isinstance(selector, str):
        raise HTTPError(400, f"selector must be a string, not {selector!r}")
    selector = _selector_param(selector)
    if "settings" not in body:
        raise HTTPError(400, "field 'settings' (an object of settings) is required")
    try:
        settings = validate_settings(body["settings"])
    except SettingsError as exc:
        raise HTTPError(400, str(exc)) from None
    try:
        rule = await run_in_threadpool(
            state.store.put_settings_rule, tenant, service, selector, settings
        )
    except StoreError as exc:
        raise HTTPError(503, f"could not store the rule: {exc}") from None
    return JSONResponse(rule.to_json())


@json_errors
async def delete_rule(request: Request) -> Response:
    """``DELETE /api/v1/settings/{service}?selector=...``"""
    state, tenant = query_state(request)
    service = _service(request)
    selector = _selector_param(request.query_params.get("selector", ""))
    try:
        deleted = await run_in_threadpool(
            state.store.delete_settings_rule, tenant, service, selector
        )
    except StoreError as exc:
        raise HTTPError(503, f"could not delete the rule: {exc}") from None
    if not deleted:
        shown = selector or "(none)"
        raise HTTPError(404, f"no rule for service {service!r} with selector {shown}")
    return JSONResponse({"deleted": True})


routes = [
    Route("/api/v1/agent/settings", poll, methods=["GET"]),
    Route("/api/v1/settings", list_rules, methods=["GET"]),
    Route("/api/v1/settings/{service:path}", get_service, methods=["GET"]),
    Route("/api/v1/settings/{service:path}", put_rule, methods=["PUT"]),
    Route("/api/v1/settings/{service:path}", delete_rule, methods=["DELETE"]),
]
