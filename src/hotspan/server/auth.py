"""Who a request is, resolved once per request: its token, its role and its tenant.

Two kinds of token open the server:

- the operator's, given to ``hotspan server --ingest-token/--query-token``: an ingest token
  writes, a query token reads and changes rules, settings and tokens, for any tenant (named by
  ``X-Scope-OrgID``, the server's default tenant otherwise);
- a tenant's, created through ``/api/v1/tokens`` (server.api.tokens) and kept in the store as a
  hash: an ``ingest`` token writes its tenant, a ``query`` token reads it, an ``admin`` token
  does both and alone changes the tenant's rules, settings and tokens.  The tenant is the
  token's: a request that names another one is refused (403).

With no token at all the server is open, as is a side (ingest or query) with no operator
token while the store holds no token; once the store holds one, every route but the public
ones (``/ready``, the UI's pages, Tempo's echo and build info) needs a token.

:class:`AuthMiddleware` resolves each HTTP request (:meth:`Authenticator.resolve`) and puts
the outcome in its scope: a :class:`Principal`, or the refusal (an HTTPError) that the
endpoint answers in its own shape when it asks (server.request's helpers).  The gRPC receivers
resolve their calls with :func:`authenticate`.  The store's tokens are read at most once per
:data:`CACHE_TTL_S`, and again at once after a token is created or revoked on this server.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.routing import compile_path

from hotspan.server.config import ServerConfig
from hotspan.server.errors import HTTPError
from hotspan.server.tenants import is_tenant
from hotspan.store.base import Store, StoredToken, StoreError
from hotspan.ui.routes import PAGES

log = logging.getLogger(__name__)

TENANT_HEADER = "X-Scope-OrgID"

INGEST = "ingest"
QUERY = "query"
ADMIN = "admin"
# What a tenant's token of each role may do.
GRANTS = {INGEST: (INGEST,), QUERY: (QUERY,), ADMIN: (INGEST, QUERY, ADMIN)}
_DOING = {INGEST: "write data", QUERY: "read data", ADMIN: "change rules, settings or tokens"}

# How long the store's tokens are trusted before they are read again; a token revoked
# through another server over the same store stops working within it.
CACHE_TTL_S = 5.0
# After a failed read of the store's tokens, the next try is this much later.
RETRY_S = 1.0

TOKEN_PREFIX = "hst_"
SCOPE_KEY = "hotspan.principal"

_UNAUTHENTICATED = "missing or invalid token (send Authorization: Bearer <token>)"
_NO_TOKEN_ADMIN = (
    "tenants' tokens are made with the server's query token: start it with --query-token "
    "(or HOTSPAN_QUERY_TOKEN) and send that"
)


def tenant_from(tenant: Optional[str], config: ServerConfig) -> str:
    """The tenant named by an ``X-Scope-OrgID`` value (HTTP header or gRPC metadata)."""
    if tenant is None or tenant == "":
        return config.default_tenant
    if not is_tenant(tenant):
        raise HTTPError(400, f"invalid tenant id in {TENANT_HEADER}: {tenant[:60]!r}")
    return tenant


@dataclass(frozen=True)
class Principal:
    """Who made a request: the tenant it reads or writes and the role it was let in as.
    ``token_id`` is the tenant's token it used; None for an operator's token or an open
    server, whose requests name their tenant."""

    tenant: str
    role: str
    token_id: Optional[str] = None

    @property
    def bound(self) -> bool:
        """Whether its tenant is fixed by its token rather than named by the request."""
        return self.token_id is not None


# -- routes ---------------------------------------------------------------------------------

# What a route needs: the role, and (for "tokens") that it is closed by any operator token.
Access = str
TOKENS = "tokens"

_PUBLIC_PATHS = frozenset({"/ready", "/api/echo", "/api/status/buildinfo"})
_PUBLIC_PAGES = tuple(compile_path(page)[0] for page in PAGES)
_INGEST_PATHS = frozenset(
    {
        "/ingest",
        "/pyroscope/ingest",
        "/push.v1.PusherService/Push",
        "/v1/traces",
        "/v1development/profiles",
        "/api/v1/agent/settings",
    }
)
# Changes to what lies below these paths are the admin's; reading them is a query.
_ADMIN_TREES = ("/api/v1/alerts", "/api/v1/recording-rules", "/api/v1/settings")
_ADMIN_CALLS = frozenset(
    {
        "/settings.v1.RecordingRulesService/UpsertRecordingRule",
        "/settings.v1.RecordingRulesService/DeleteRecordingRule",
        "/settings.v1.SettingsService/Set",
        "/settings.v1.SettingsService/Delete",
    }
)
# POSTs below the admin trees that change nothing: what a rule would have said, before saving.
_QUERY_POSTS = frozenset({"/api/v1/alerts/preview"})
TOKENS_PATH = "/api/v1/tokens"
# Routes whose query parameter ``tenant`` names a tenant, as the header does.
_TENANT_PARAM_PATHS = frozenset({"/metrics"})


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree + "/")


def route_access(method: str, path: str) -> Optional[Access]:
    """What a request needs: ``ingest``, ``query``, ``admin`` or ``tokens`` (admin, on the
    token API); None for a public route.  A path not listed is a query: a new route is
    never open by mistake."""
    if path in _PUBLIC_PATHS or path.startswith("/static/"):
        return None
    if method in ("GET", "HEAD") and any(p.fullmatch(path) for p in _PUBLIC_PAGES):
        return None
    if path in _INGEST_PATHS:
        return INGEST
    if _under(path, TOKENS_PATH):
        return TOKENS
    if path in _ADMIN_CALLS:
        return ADMIN
    if path in _QUERY_POSTS:
        return QUERY
    if method not in ("GET", "HEAD") and any(_under(path, tree) for tree in _ADMIN_TREES):
        return ADMIN
    return QUERY


def _role(access: Access) -> str:
    return ADMIN if access == TOKENS else access


# -- credentials ----------------------------------------------------------------------------


def credential_of(authorization: bytes) -> bytes:
    """The token an ``Authorization`` value carries, as bytes (b"": none): a bearer token,
    or basic auth's password (what Pyroscope SDKs send).  Any bytes are taken: a header of
    non-ASCII bytes is just a token that matches nothing."""
    scheme, _, rest = authorization.strip().partition(b" ")
    scheme = scheme.lower()
    if scheme == b"bearer":
        return rest.strip()
    if scheme == b"basic":
        try:
            decoded = base64.b64decode(rest.strip())
        except ValueError:
            return b""
        return decoded.partition(b":")[2]
    return b""


def as_bytes(value: Union[str, bytes, None]) -> bytes:
    """A header or metadata value as the bytes sent: HTTP stacks decode them as latin-1."""
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


def token_hash(token: bytes) -> str:
    """What the store keeps of a token.  Tokens are random (:func:`new_token`), so a plain
    SHA-256 is enough: there is no guessable password to slow down."""
    return hashlib.sha256(token).hexdigest()


def new_token() -> str:
    """A new token: 256 random bits, URL-safe, with a prefix that says what it is."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _matches(credential: bytes, tokens: Iterable[bytes]) -> bool:
    found = False
    for token in tokens:
        found |= hmac.compare_digest(credential, token)
    return found


# -- resolution -----------------------------------------------------------------------------


class Authenticator:
    """The operator's tokens, and the store's (cached): resolves requests to principals."""

    def __init__(self, store: Store, config: ServerConfig, ttl_s: float = CACHE_TTL_S) -> None:
        self.store = store
        self.config = config
        self.ttl_s = ttl_s
        self._ingest = tuple(t.encode("utf-8") for t in config.ingest_tokens)
        self._query = tuple(t.encode("utf-8") for t in config.query_tokens)
        # sha256 -> token; None until the store's tokens were read once.
        self._by_hash: Optional[Dict[str, StoredToken]] = None
        self._fresh_until = 0.0
        self._generation = 0
        self._lock = threading.Lock()

    def stale(self) -> bool:
        return time.monotonic() >= self._fresh_until

    def refresh(self, wait: bool = False) -> None:
        """Read the store's tokens if the cache is stale.  One reader at a time: the others
        go on with the tokens read last, or wait (``wait``, or when none were read yet)."""
        if not self._lock.acquire(blocking=wait or self._by_hash is None):
            return
        try:
            if not self.stale():
                return
            generation = self._generation
            try:
                tokens = self.store.tokens()
            except StoreError as exc:
                log.warning("cannot read the API tokens from the store: %s", exc)
                self._fresh_until = time.monotonic() + RETRY_S
                return
            self._by_hash = {t.sha256: t for t in tokens}
            # A create or revoke while reading: what was read may predate it.
            if generation == self._generation:
                self._fresh_until = time.monotonic() + self.ttl_s
        finally:
            self._lock.release()

    def changed(self) -> None:
        """A token was created or revoked: read them again now."""
        self._generation += 1
        self._fresh_until = 0.0
        self.refresh(wait=True)

    def _closed_without_store_tokens(self, access: Access) -> bool:
        """Whether the route needs a token while the store holds none (as before tenants
        had tokens: each side is closed by its operator tokens).  Tokens are always managed
        with one: the first closes every route, which on an open server would let anyone
        who reaches it lock everyone else out."""
        if access == INGEST:
            return bool(self._ingest)
        if access == TOKENS:
            return True
        return bool(self._query)

    def resolve(self, access: Access, authorization: bytes, named: Optional[str]) -> Principal:
        """Who a request is, for a route that needs ``access``, from its ``Authorization``
        value and the tenant it names (None: none).  HTTPError 401 (no valid token), 403
        (a tenant's token beyond its role or tenant), 400 (a malformed tenant), 503 (the
        store's tokens could not be read yet)."""
        role = _role(access)
        credential = credential_of(authorization)
        stored = self._by_hash
        closed = self._closed_without_store_tokens(access)
        if credential:
            if _matches(credential, self._ingest if role == INGEST else self._query):
                return Principal(tenant_from(named, self.config), role)
            if stored is None:
                raise HTTPError(503, "cannot check the token: the store is unavailable")
            token = stored.get(token_hash(credential))
            if token is not None:
                return self._of_token(token, role, named)
        if stored is None and not closed:
            raise HTTPError(503, "cannot tell whether tokens are needed: the store is unavailable")
        if access == TOKENS and not stored and not self._query:
            raise HTTPError(401, _NO_TOKEN_ADMIN)
        if stored or closed:
            raise HTTPError(401, _UNAUTHENTICATED)
        # Open: a token sent anyway is ignored, as a server without tokens always did.
        return Principal(tenant_from(named, self.config), role)

    def _of_token(self, token: StoredToken, role: str, named: Optional[str]) -> Principal:
        if role not in GRANTS.get(token.role, ()):
            raise HTTPError(403, f"a {token.role} token may not {_DOING[role]}")
        if named and tenant_from(named, self.config) != token.tenant:
            raise HTTPError(403, f"the token is for tenant {token.tenant!r}, not {named[:60]!r}")
        return Principal(token.tenant, role, token.token_id)


def authenticate(
    auth: Authenticator,
    access: Access,
    authorization: Union[str, bytes, None],
    named: Optional[str],
    refresh: bool = True,
) -> Principal:
    """:meth:`Authenticator.resolve` for a call that may block (gRPC's worker threads), the
    tokens read again first if due and ``refresh``."""
    if refresh and auth.stale():
        auth.refresh()
    return auth.resolve(access, as_bytes(authorization), named)


def grpc_tenant(
    auth: Authenticator,
    access: Access,
    metadata: Iterable[Tuple[str, Any]],
    refresh: bool = True,
) -> str:
    """The tenant of a gRPC call (its invocation metadata), its token checked for ``access``
    as the middleware checks an HTTP request's; HTTPError when it is refused."""
    found = {key.lower(): value for key, value in metadata}
    named = found.get(TENANT_HEADER.lower())
    return authenticate(auth, access, found.get("authorization"), named, refresh).tenant


# -- the middleware -------------------------------------------------------------------------


_TENANT_KEY = TENANT_HEADER.lower().encode()


def _credentials(headers: List[Tuple[bytes, bytes]]) -> Tuple[bytes, Optional[bytes]]:
    """The first ``Authorization`` value (b"": none) and the first ``X-Scope-OrgID`` one
    (None: none) of a request's headers, in one pass over them."""
    authorization: Optional[bytes] = None
    tenant: Optional[bytes] = None
    for key, value in headers:
        key = key.lower()
        if key == b"authorization":
            if authorization is None:
                authorization = value
                if tenant is not None:
                    break
        elif key == _TENANT_KEY and tenant is None:
            tenant = value
            if authorization is not None:
                break
    return authorization or b"", tenant


class AuthMiddleware:
    """Resolves every request but the public ones (:func:`route_access`) and puts the
    :class:`Principal`, or the HTTPError that refuses it, in ``scope[SCOPE_KEY]``.  For a
    tenant's token, ``X-Scope-OrgID`` is set to the token's tenant: code that reads the
    header sees the tenant the request is bound to."""

    def __init__(self, app: Any, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            access = route_access(scope["method"], scope["path"])
            if access is not None:
                if self.auth.stale():
                    await run_in_threadpool(self.auth.refresh)
                scope[SCOPE_KEY] = self._resolve(scope, access)
        await self.app(scope, receive, send)

    def _resolve(self, scope: Any, access: Access) -> Union[Principal, HTTPError]:
        headers: List[Tuple[bytes, bytes]] = scope["headers"]
        authorization, tenant = _credentials(headers)
        named = tenant.decode("latin-1") if tenant is not None else None
        try:
            principal = self.auth.resolve(access, authorization, named)
            if principal.bound:
                if scope["path"] in _TENANT_PARAM_PATHS:
                    query = scope.get("query_string", b"").decode("latin-1")
                    for key, value in parse_qsl(query, keep_blank_values=True):
                        if key == "tenant" and value != principal.tenant:
                            raise HTTPError(
                                403,
                                f"the token is for tenant {principal.tenant!r}, not {value[:60]!r}",
                            )
                scope["headers"] = [(k, v) for k, v in headers if k.lower() != _TENANT_KEY] + [
                    (_TENANT_KEY, principal.tenant.encode())
                ]
        except HTTPError as exc:
            return exc
        return principal
