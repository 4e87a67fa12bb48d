"""Pyroscope's settings API, ``/settings.v1.SettingsService/{Get,Set,Delete}`` (Connect, JSON):
a tenant's named string values.  Grafana's Profiles Drilldown keeps its own settings there (the
``pluginSettings`` setting) and reads it as it opens.

As in Pyroscope, a value stamped older than the one stored (``modifiedAt``, in milliseconds) is
refused (``already_exists``), so that two browsers saving at once keep the later save; a value
without a stamp is stamped now (or at the stored stamp, if that is later).  Unlike Pyroscope, a
stamp over an hour ahead of the server's clock is refused: it would keep its setting for good.
Settings are documents of the store (one per name), so every server over a shared store sees the
same ones; the stamps are compared within one server (two servers saving the same setting at once
may both write).  Reading them is a query; changing them is an admin's, as with the server's
other settings.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Dict, List, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.server.errors import HTTPError
from hotspan.server.pyroscope.connect import json_request, unary
from hotspan.server.request import in_store, query_state
from hotspan.server.state import ServerState
from hotspan.store.base import Document

SERVICE = "/settings.v1.SettingsService"
KIND = "pyroscope_setting"
# Bounds a tenant's settings: Drilldown's one setting is a JSON object of a few hundred bytes.
MAX_NAME_CHARS = 256
MAX_VALUE_BYTES = 64 * 1024
MAX_SETTINGS = 100
# A value is JSON in a JSON string: every quote of it arrives escaped.
MAX_BODY_BYTES = 6 * MAX_VALUE_BYTES + 4096
# How far ahead of this server's clock a save's stamp may be (another machine's clock): a
# stamp far in the future would keep its setting from every later save and from deletion.
MAX_AHEAD_MS = 3600 * 1000
# A change reads the stored stamp, then writes: one change at a time in this server.
_CHANGES = threading.Lock()
_INT64 = re.compile(r"-?[0-9]{1,19}")


def _setting(doc: Document) -> Dict[str, Any]:
    # int64 as protojson writes it: a string.
    return {
        "name": doc.name,
        "value": doc.body.get("value", ""),
        "modifiedAt": str(doc.body.get("modifiedAt", 0)),
    }


def _name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise HTTPError(400, "no setting name provided")
    if len(value) > MAX_NAME_CHARS or "\x00" in value:
        raise HTTPError(400, f"a setting name is at most {MAX_NAME_CHARS} characters, no NUL")
    return value


def _millis(value: object) -> int:
    """``modifiedAt``: a number or a string of digits (protojson's int64); 0 when absent."""
    if value is None or value == "":
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise HTTPError(400, "modifiedAt must be an integer (milliseconds)")
    if isinstance(value, str) and not _INT64.fullmatch(value):
        raise HTTPError(400, f"modifiedAt {value[:40]!r} is not an integer")
    millis = int(value)
    if not -(2**63) <= millis < 2**63:
        raise HTTPError(400, "modifiedAt is out of range")
    return millis


def _find(docs: List[Document], name: str) -> Optional[Document]:
    return next((d for d in docs if d.name == name), None)


@unary
async def get(request: Request) -> Response:
    state, tenant = query_state(request)
    await json_request(request, request.app.state.hotspan.config, MAX_BODY_BYTES)
    docs = await in_store(state.store.documents, KIND, tenant)
    if not docs:
        return JSONResponse({})  # protojson leaves an empty list out
    return JSONResponse({"settings": [_setting(d) for d in docs]})


def _set(state: ServerState, tenant: str, name: str, value: str, millis: int) -> Document:
    """Stores the setting; ``millis`` 0: stamped now, or at the stored stamp where that is
    later (another server's clock ahead of this one's must not refuse a save)."""
    now = time.time_ns() // 1_000_000
    if millis > now + MAX_AHEAD_MS:
        raise HTTPError(400, "modifiedAt is more than an hour ahead of the server's clock")
    with _CHANGES:
        docs = state.store.documents(KIND, tenant)
        old = _find(docs, name)
        if millis <= 0:
            millis = max(now, _stamp(old))
        if old is None and len(docs) >= MAX_SETTINGS:
            raise HTTPError(
                400, f"a tenant keeps at most {MAX_SETTINGS} settings", "failed_precondition"
            )
        if _stamp(old) > millis:
            raise HTTPError(
                409, f"failed to update {name}: newer update already written", "already_exists"
            )
        return state.store.put_document(tenant, KIND, name, {"value": value, "modifiedAt": millis})


@unary
async def set_(request: Request) -> Response:
    state, tenant = query_state(request)
    body = await json_request(request, request.app.state.hotspan.config, MAX_BODY_BYTES)
    setting = body.get("setting")
    if not isinstance(setting, dict):
        raise HTTPError(400, "no setting values provided")
    name = _name(setting.get("name"))
    value = setting.get("value")
    if value is None:
        value = ""  # protojson's null: the default
    if not isinstance(value, str):
        raise HTTPError(400, "a setting's value must be a string")
    if len(value.encode("utf-8")) > MAX_VALUE_BYTES:
        raise HTTPError(413, f"a setting's value is at most {MAX_VALUE_BYTES} bytes")
    millis = _millis(setting.get("modifiedAt"))
    doc = await in_store(_set, state, tenant, name, value, millis)
    return JSONResponse({"setting": _setting(doc)})


def _stamp(doc: Optional[Document]) -> int:
    return int(doc.body.get("modifiedAt", 0)) if doc is not None else 0


def _delete(state: ServerState, tenant: str, name: str) -> None:
    with _CHANGES:
        old = _find(state.store.documents(KIND, tenant), name)
        # Stamped now, as Pyroscope does: a setting stamped in the future stays.
        if _stamp(old) > time.time_ns() // 1_000_000:
            raise HTTPError(
                409, f"failed to delete {name}: newer update already written", "already_exists"
            )
        state.store.delete_document(tenant, KIND, name)


@unary
async def delete(request: Request) -> Response:
    state, tenant = query_state(request)
    body = await json_request(request, request.app.state.hotspan.config, MAX_BODY_BYTES)
    name = _name(body.get("name"))
    await in_store(_delete, state, tenant, name)
    return JSONResponse({})


routes = [
    Route(f"{SERVICE}/Get", get, methods=["POST"]),
    Route(f"{SERVICE}/Set", set_, methods=["POST"]),
    Route(f"{SERVICE}/Delete", delete, methods=["POST"]),
]
