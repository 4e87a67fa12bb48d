"""Pyroscope's ad hoc profiles, ``/adhocprofiles.v1.AdHocProfileService/{Upload,Get,List}``
(Connect, JSON): a profile file uploaded from the browser (Grafana Profiles Drilldown's "Ad hoc
view"), kept for the tenant and shown as a flame graph.

An upload is a pprof (gzipped or not), folded or speedscope file, base64 in the request as
Pyroscope takes it.  The answer holds the flame graph of one sample type as Pyroscope's
flamebearer JSON, in a string, and the names of the file's sample types, so that the page can
ask ``Get`` for another.  The file is kept as sent (a document of the store) under an id that
starts with a ULID, so that ids sort by upload time, and ends with the file's name.  A tenant
keeps at most :data:`MAX_PROFILES` files and :data:`MAX_TENANT_BYTES` of them: an upload past
either drops the oldest.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hotspan.formats.errors import FormatError
from hotspan.formats.files import read_stacks
from hotspan.model.stack_profile import StackProfile
from hotspan.query import flamegraph
from hotspan.server.errors import HTTPError
from hotspan.server.params import DEFAULT_MAX_NODES, check_max_nodes
from hotspan.server.pyroscope.connect import json_request, unary
from hotspan.server.pyroscope.render import flamebearer_profile
from hotspan.server.request import in_store, query_state
from hotspan.server.state import ServerState
from hotspan.store.base import Document

SERVICE = "/adhocprofiles.v1.AdHocProfileService"
KIND = "adhoc_profile"
# Pyroscope's default limit on a profile's size.
MAX_PROFILE_BYTES = 4 * 1024 * 1024
MAX_BODY_BYTES = MAX_PROFILE_BYTES * 4 // 3 + 64 * 1024
MAX_PROFILES = 50
MAX_TENANT_BYTES = 64 * 1024 * 1024
MAX_NAME_CHARS = 200
_ID = re.compile(r"[A-Za-z0-9._-]{1,300}")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# An upload reads the tenant's files, then writes and drops: one at a time in this server.
_CHANGES = threading.Lock()


def _ulid(millis: int) -> str:
    """A ULID: 48 bits of milliseconds and 80 random bits, in Crockford's base32."""
    value = (millis << 80) | int.from_bytes(os.urandom(10), "big")
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def _safe_name(name: str) -> str:
    """The file's name as Pyroscope keeps it: letters, digits, '.', '-' and '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:MAX_NAME_CHARS]


def _field(body: Dict[str, Any], camel: str, snake: str) -> Any:
    """A field by its JSON name or its proto name: protojson takes both."""
    return body[camel] if camel in body else body.get(snake)


def _max_nodes(body: Dict[str, Any]) -> int:
    value = _field(body, "maxNodes", "max_nodes")
    if value in (None, "", 0, "0"):
        return DEFAULT_MAX_NODES
    if isinstance(value, bool):
        raise HTTPError(400, "maxNodes must be an integer")
    try:
        return check_max_nodes(int(value))
    except (TypeError, ValueError, OverflowError):
        raise HTTPError(400, f"maxNodes must be an integer, got {str(value)[:40]!r}") from None


def _decode(data: str) -> bytes:
    if len(data) > MAX_BODY_BYTES:
        raise HTTPError(400, f"the profile is over {MAX_PROFILE_BYTES} bytes")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise HTTPError(400, "profile must be the file's bytes in base64") from None
    if len(raw) > MAX_PROFILE_BYTES:
        raise HTTPError(400, f"the profile is over {MAX_PROFILE_BYTES} bytes")
    return raw


def _read(name: str, raw: bytes, limit: int) -> StackProfile:
    try:
        return read_stacks(name or "profile", raw, max_size=limit)
    except FormatError as exc:
        raise HTTPError(400, f"failed to parse profile: {exc}") from None


def _answer(
    doc_id: str,
    name: str,
    uploaded_ms: int,
    profile: StackProfile,
    wanted: Optional[str],
    max_nodes: int,
) -> Dict[str, Any]:
    """The Get answer: the flame graph of the sample type asked for (else the file's default,
    else its first) as a flamebearer profile in a JSON string."""
    types = [t.type for t in profile.sample_types]
    position = types.index(wanted) if wanted in types else None
    if position is None:
        default = profile.default_type
        position = types.index(default) if default in types else 0
    sample_type = profile.sample_types[position]
    graph = flamegraph.of_profile(profile, position, max_nodes)
    body = flamebearer_profile(graph, sample_type.type, sample_type.unit, sample_type.type)
    return {
        "id": doc_id,
        "name": name,
        "uploadedAt": str(uploaded_ms),
        "profileType": sample_type.type,
        "profileTypes": types,
        "flamebearerProfile": json.dumps(body, separators=(",", ":")),
    }


def _keep(state: ServerState, tenant: str, doc_id: str, body: Dict[str, Any]) -> None:
    """Stores the upload, then drops the tenant's oldest files past the bounds."""
    with _CHANGES:
        state.store.put_document(tenant, KIND, doc_id, body)
        docs = state.store.documents(KIND, tenant)  # by name: by upload time, oldest first
        sizes = [len(str(d.body.get("data", ""))) for d in docs]
        count, total = len(docs), sum(sizes)
        for doc, size in zip(docs, sizes):
            if count <= MAX_PROFILES and total <= MAX_TENANT_BYTES:
                break
            if doc.name != doc_id:
                state.store.delete_document(tenant, KIND, doc.name)
                count, total = count - 1, total - size


def _upload(
    state: ServerState, tenant: str, name: str, data: str, max_nodes: int
) -> Dict[str, Any]:
    raw = _decode(data)
    profile = _read(name, raw, state.config.max_decompressed_bytes)
    millis = time.time_ns() // 1_000_000
    safe = _safe_name(name)
    doc_id = f"{_ulid(millis)}-{safe}" if safe else _ulid(millis)
    _keep(state, tenant, doc_id, {"name": safe, "data": data, "uploadedAt": millis})
    return _answer(doc_id, safe, millis, profile, None, max_nodes)


def _find(state: ServerState, tenant: str, doc_id: str) -> Document:
    doc = next((d for d in state.store.documents(KIND, tenant) if d.name == doc_id), None)
    if doc is None:
        raise HTTPError(404, f"profile {doc_id} not found")
    return doc


def _get(
    state: ServerState, tenant: str, doc_id: str, wanted: Optional[str], max_nodes: int
) -> Dict[str, Any]:
    doc = _find(state, tenant, doc_id)
    name = str(doc.body.get("name", ""))
    profile = _read(
        name, _decode(str(doc.body.get("data", ""))), state.config.max_decompressed_bytes
    )
    return _answer(doc_id, name, int(doc.body.get("uploadedAt", 0)), profile, wanted, max_nodes)


def _list(state: ServerState, tenant: str) -> List[Dict[str, str]]:
    docs = state.store.documents(KIND, tenant)
    rows: List[Tuple[int, Dict[str, str]]] = []
    for doc in docs:
        millis = int(doc.body.get("uploadedAt", 0))
        item = {"id": doc.name, "name": str(doc.body.get("name", "")), "uploadedAt": str(millis)}
        rows.append((millis, item))
    rows.sort(key=lambda r: r[0], reverse=True)  # newest first, as Pyroscope lists them
    return [item for _, item in rows]


@unary
async def upload(request: Request) -> Response:
    state, tenant = query_state(request)
    body = await json_request(request, request.app.state.hotspan.config, MAX_BODY_BYTES)
    name = body.get("name", "")
    data = body.get("profile")
    if not isinstance(name, str):
        raise HTTPError(400, "name must be a string")
    if not isinstance(data, str) or not data:
        raise HTTPError(400, "profile (the file, in base64) is required")
    answer = await in_store(_upload, state, tenant, name, data, _max_nodes(body))
    return JSONResponse(answer)


@unary
async def get(request: Request) -> Response:
    state, tenant = query_state(request)
    body = await json_request(request, request.app.state.hotspan.config, MAX_BODY_BYTES)
    doc_id = body.get("id")
    if not isinstance(doc_id, str) or not _ID.fullmatch(doc_id):
        raise HTTPError(400, f"id {str(doc_id)[:80]!r} is invalid: can only contain [a-zA-Z0-9_-.]")
    wanted = _field(body, "profileType", "profile_type")
    if wanted is not None and not isinstance(wanted, str):
        raise HTTPError(400, "profile_type must be a string")
    answer = await in_store(_get, state, tenant, doc_id, wanted, _max_nodes(body))
    return JSONResponse(answer)


@unary
async def list_(request: Request) -> Response:
    state, tenant = query_state(request)
    await json_request(request, request.app.state.hotspan.config, MAX_BODY_BYTES)
    profiles = await in_store(_list, state, tenant)
    return JSONResponse({"profiles": profiles} if profiles else {})


routes = [
    Route(f"{SERVICE}/Upload", upload, methods=["POST"]),
    Route(f"{SERVICE}/Get", get, methods=["POST"]),
    Route(f"{SERVICE}/List", list_, methods=["POST"]),
]
