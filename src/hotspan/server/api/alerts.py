"""The alert rules API, per tenant.

Reading rules takes what the other query APIs take (a query token of the tenant, or the
operator's ``--query-token``); changing them, and with them where notifications go, an admin
token of the tenant or the operator's query token (server.auth.route_access).

- ``GET /api/v1/alerts/rules``: ``{"rules": [rule, ...]}``;
- ``PUT /api/v1/alerts/rules/{name}`` (body: the rule's JSON, see hotspan.alerts.rules):
  the rule as kept, with its state; 201 when new, 200 when replaced, 400 naming the problem
  (then nothing is stored);
- ``DELETE /api/v1/alerts/rules/{name}``: 404 when there is none; a firing alert gets its
  resolved notification on the next evaluation;
- ``GET /api/v1/alerts``: ``{"alerts": [alert, ...]}``, each the rule with its state;
- ``GET /api/v1/alerts/rules/{name}``: one alert.

An alert: ``{"name", "rule": {...}, "state": "inactive|pending|firing", "value", "summary",
"since", "activeAt", "firedAt", "resolvedAt", "lastEvaluation", "evaluationSeconds",
"lastError", "generatorURL", "evaluations", "history": [{"state", "at", "value"}] (newest
first), "webhooks": [{"url", "delivered", "error"}]}``; times are RFC 3339 (UTC) or null.
Errors are ``{"error": reason}``.

A rule whose webhook is, or resolves to, a loopback, link-local, private or otherwise not
globally reachable address gets a 400 naming ``--alert-webhook-allow`` (the networks the
operator lets through): see hotspan.alerts.targets.  A webhook's ``error`` is a status
(``HTTP 500``) or the kind of failure, never what the receiver answered.

Webhook URLs are shown with their password and query values as ``REDACTED``
(``http://user:REDACTED@host/hook?token=REDACTED``); a PUT whose webhook is exactly the
redacted form of one of the stored rule's URLs keeps the stored URL, so a rule read from the
API, edited and saved keeps its secrets.  Each rule carries ``uid``, the server's id for it
(16 hex digits): set on create, kept on replace.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.alerts import RULE_KIND, STATE_KIND
from hotspan.alerts.rules import (
    RuleError,
    check_name,
    check_text,
    keep_secrets,
    parse_rule,
    redact_rule,
    redact_url,
)
from hotspan.alerts.state import AlertState
from hotspan.alerts.targets import WebhookRefused, parse_allow, public_error
from hotspan.query.engine import QueryError
from hotspan.server.errors import HTTPError, json_errors
from hotspan.server.request import query_state, read_body
from hotspan.server.state import ServerState

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024
# Rules per tenant: each is evaluated every interval.
MAX_RULES = 200
# A preview measures the rule once per point, as many queries as an evaluation each.
MAX_PREVIEW_POINTS = 48
MAX_PREVIEW_HOURS = 7 * 24


def _name(request: Request) -> str:
    try:
        return check_name(request.path_params["name"])
    except RuleError as exc:
        raise HTTPError(400, str(exc)) from None


def _webhook_urls(rule: Mapping[str, Any], state: AlertState) -> List[str]:
    """Every webhook URL the rule and its state know (including those of retired alerts)."""
    found: List[Any] = list(rule.get("webhooks") or []) + list(state.webhooks)
    found += list(getattr(state, "delivered", {}) or {}) + list(state.delivery_errors or {})
    for old in getattr(state, "retired", None) or []:
        if isinstance(old, Mapping):
            found += list(old.get("webhooks") or []) + list(old.get("delivered") or {})
    urls = {u for u in found if isinstance(u, str) and u and redact_url(u) != u}
    return sorted(urls, key=len, reverse=True)  # the longest first: none is cut by another


def _redact_all(value: Any, urls: List[str]) -> Any:
    """``value`` (the API's JSON) with every occurrence of ``urls`` redacted, in URLs shown as
    such and in error messages that quote them alike."""
    if isinstance(value, str):
        for url in urls:
            if url in value:
                value = value.replace(url, redact_url(url))
        return value
    if isinstance(value, dict):
        return {_redact_all(k, urls): _redact_all(v, urls) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_all(v, urls) for v in value]
    return value


def _alert(rule: Mapping[str, Any], state_body: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The API's view of a stored rule and its state, secrets redacted."""
    uid = rule.get("uid")
    if state_body and uid and state_body.get("uid") not in (None, "", uid):
        # The rule was deleted and made again since the last evaluation: not its state.
        state_body = None
    state = AlertState.from_json(state_body) if state_body else AlertState()
    if not state.webhooks:
        state.webhooks = list(rule.get("webhooks") or [])
    api = _redact_all(state.to_api(), _webhook_urls(rule, state))
    for hook in api["webhooks"]:
        hook["error"] = public_error(hook["error"])
    return {"name": rule.get("name"), "rule": redact_rule(rule), **api}


def _readable(tenant: str, name: str, shown: Any) -> bool:
    """Whether ``shown`` can be sent as JSON.  A rule stored by an older version may hold text
    no UTF-8 writer takes (a lone surrogate): it is left out of lists, with a log line, rather
    than failing the tenant's every list; PUT it again or DELETE it."""
    try:
        check_text(shown)
        json.dumps(shown, ensure_ascii=False).encode("utf-8")
    except (RuleError, UnicodeError, TypeError, ValueError) as exc:
        log.warning("alert rule %s/%s cannot be shown, left out: %s", tenant, name, exc)
        return False
    return True


def _alerts(
    state: ServerState, tenant: str, name: Optional[str] = None
) -> Tuple[List[Dict[str, Any]], List[str]]:
    """The tenant's alerts (or the one named), and the names of those left out as
    unreadable."""
    rules = [d for d in state.store.documents(RULE_KIND, tenant) if name in (None, d.name)]
    if not rules:
        return [], []
    states = {d.name: d.body for d in state.store.documents(STATE_KIND, tenant)}
    shown, unreadable = [], []
    for d in rules:
        try:
            alert = _alert(d.body, states.get(d.name))
        except (TypeError, ValueError, AttributeError) as exc:
            log.warning("alert rule %s/%s cannot be shown, left out: %s", tenant, d.name, exc)
            unreadable.append(d.name)
            continue
        if _readable(tenant, d.name, alert):
            shown.append(alert)
        else:
            unreadable.append(d.name)
    return shown, unreadable


def _rules(state: ServerState, tenant: str) -> List[Dict[str, Any]]:
    out = []
    for d in state.store.documents(RULE_KIND, tenant):
        rule = redact_rule(d.body)
        if _readable(tenant, d.name, rule):
            out.append(rule)
    return out


@json_errors
async def list_rules(request: Request) -> Response:
    state, tenant = query_state(request)
    return JSONResponse({"rules": await run_in_threadpool(_rules, state, tenant)})


@json_errors
async def list_alerts(request: Request) -> Response:
    state, tenant = query_state(request)
    alerts, _ = await run_in_threadpool(_alerts, state, tenant)
    return JSONResponse({"alerts": alerts})


@json_errors
async def get_rule(request: Request) -> Response:
    state, tenant = query_state(request)
    name = _name(request)
    found, unreadable = await run_in_threadpool(_alerts, state, tenant, name)
    if unreadable:
        raise HTTPError(
            409,
            f"alert rule {name!r} is stored in a form this server cannot show (text that "
            "is not UTF-8); PUT it again or DELETE it",
        )
    if not found:
        raise HTTPError(404, f"no alert rule named {name!r}")
    return JSONResponse(found[0])


def _put(state: ServerState, tenant: str, rule: Any) -> Tuple[bool, Dict[str, Any]]:
    docs = {d.name: d.body for d in state.store.documents(RULE_KIND, tenant)}
    stored = docs.get(rule.name)
    # Two PUTs of new rules at once may both pass this check and leave the tenant one or two
    # over the limit: acceptable, the limit bounds the evaluator's work, not a quota.
    if stored is None and len(docs) >= MAX_RULES:
        raise HTTPError(400, f"a tenant has at most {MAX_RULES} alert rules; delete one first")
    rule = keep_secrets(rule, stored)
    uid = stored.get("uid") if isinstance(stored, Mapping) else None
    if not isinstance(uid, str) or not uid:
        uid = secrets.token_hex(8)
    body = {**rule.to_json(), "uid": uid}
    state.store.put_document(tenant, RULE_KIND, rule.name, body)
    found, _ = _alerts(state, tenant, rule.name)
    # A DELETE may land between the put and this read: answer with what was stored.
    return stored is None, found[0] if found else _alert(body, None)


async def _json_body(request: Request, state: ServerState) -> Any:
    raw = await read_body(request, state.config, MAX_BODY_BYTES, limit=MAX_BODY_BYTES)
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise HTTPError(400, f"body is not JSON: {exc}") from None
    except RecursionError:
        raise HTTPError(400, "body is not JSON this server takes: nested too deeply") from None


@json_errors
async def put_rule(request: Request) -> Response:
    state, tenant = query_state(request)
    name = _name(request)
    body = await _json_body(request, state)
    try:
        rule = parse_rule(name, body)
    except RuleError as exc:
        raise HTTPError(400, str(exc)) from None
    try:
        allow = parse_allow(state.config.alert_webhook_allow)
        from hotspan.alerts.webhook_post import check_urls

        await run_in_threadpool(check_urls, rule.webhooks, allow)
    except WebhookRefused as exc:
        raise HTTPError(400, str(exc)) from None
    created, alert = await run_in_threadpool(_put, state, tenant, rule)
    return JSONResponse(alert, status_code=201 if created else 200)


def _preview(
    state: ServerState, tenant: str, rule: Any, hours: float, points: int
) -> Dict[str, Any]:
    from hotspan.alerts.conditions import measure

    # As late behind now as the evaluator looks, for the samples still on their way.
    end = time.time_ns() - int(state.config.alert_lag_s * 1e9)
    step = int(hours * 3600e9) // max(points - 1, 1)
    out = []
    summary = ""
    for i in range(points):
        at = end - (points - 1 - i) * step
        try:
            found = measure(state.engine, tenant, rule, at)
        except QueryError as exc:
            raise HTTPError(400, f"the rule's query fails: {exc}") from None
        out.append({"at": at // 10**9, "value": found.value, "breached": found.breached})
        summary = found.summary
    return {"points": out, "summary": summary}


@json_errors
async def preview_rule(request: Request) -> Response:
    """``POST /api/v1/alerts/preview?hours=3&points=12``: a rule (the body a PUT takes) measured
    at ``points`` moments over the last ``hours``, as the evaluator would have: its value and
    whether it held, before it is saved.  Nothing is stored, no webhook is called."""
    state, tenant = query_state(request)
    body = await _json_body(request, state)
    if isinstance(body, dict):
        # The form sends its name too; a rule not saved yet may not have one.
        body = {k: v for k, v in body.items() if k != "name"}
    try:
        rule = parse_rule("preview", body)
    except RuleError as exc:
        raise HTTPError(400, str(exc)) from None
    try:
        hours = float(request.query_params.get("hours") or 3)
        points = int(request.query_params.get("points") or 12)
    except ValueError:
        raise HTTPError(400, "hours and points must be numbers") from None
    if not 0 < hours <= MAX_PREVIEW_HOURS or not 2 <= points <= MAX_PREVIEW_POINTS:
        raise HTTPError(
            400,
            f"hours must be in (0, {MAX_PREVIEW_HOURS}] and points in [2, {MAX_PREVIEW_POINTS}]",
        )
    answer = await run_in_threadpool(_preview, state, tenant, rule, hours, points)
    return JSONResponse(answer)


@json_errors
async def delete_rule(request: Request) -> Response:
    state, tenant = query_state(request)
    name = _name(request)
    found = await run_in_threadpool(state.store.delete_document, tenant, RULE_KIND, name)
    if not found:
        raise HTTPError(404, f"no alert rule named {name!r}")
    return JSONResponse({"deleted": name})


routes = [
    Route("/api/v1/alerts", list_alerts, methods=["GET"]),
    Route("/api/v1/alerts/rules", list_rules, methods=["GET"]),
    Route("/api/v1/alerts/preview", preview_rule, methods=["POST"]),
    Route("/api/v1/alerts/rules/{name}", get_rule, methods=["GET"]),
    Route("/api/v1/alerts/rules/{name}", put_rule, methods=["PUT"]),
    Route("/api/v1/alerts/rules/{name}", delete_rule, methods=["DELETE"]),
]
