"""Authentication on a real ``hotspan server``: operator tokens, tenants' tokens (ingest, query,
admin) kept in the store, the tenant each may touch, the role each route needs, credentials
of any bytes, and ``hotspan tokens`` end to end."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import grpc
import httpx
import pytest
from starlette.routing import Route

from hotspan.formats.proto import tempo_pb2
from hotspan.server.auth import CACHE_TTL_S, INGEST, Authenticator, credential_of, token_hash
from hotspan.server.config import ServerConfig
from hotspan.server.errors import HTTPError
from hotspan.server.scrape_config import ScrapeConfigError, parse_scrape_config
from hotspan.store.base import StoredToken
from hotspan.store.duckdb import DuckDBStore
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server  # noqa: F401
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url  # noqa: F401
from tests.conftest import RunningServer, running_server
from tests.helpers import QUERIER, flamegraph, function_totals, ingest_pprof, make_pprof
from tests.server.otlp.test_otlp_profiles import (
    EXPORT,
    cpu_request,
    grpc_error,
    grpc_export,
    http_status,
    post,
)

T0 = 1_700_000_000
OPERATOR = ["--ingest-token", "op-in", "--query-token", "op-q"]
OP_IN = {"Authorization": "Bearer op-in"}
OP_Q = {"Authorization": "Bearer op-q"}
# Credentials that are not ASCII: raw latin-1 bytes, and basic auth whose password is UTF-8.
NON_ASCII: List[bytes] = [b"Bearer \xe9t\xe9", b"Basic dTrDqcOp", b"Basic \xff\xfe", b"\xe9"]


def bearer(token: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create_token(
    c: httpx.Client, role: str, headers: Dict[str, str], name: str = ""
) -> Tuple[str, str]:
    r = c.post("/api/v1/tokens", json={"role": role, "name": name}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["token"], r.json()["id"]


def push(c: httpx.Client, function: str, headers: Dict[str, str]) -> httpx.Response:
    body = make_pprof([([function, "main"], 7, {})], time_ns=T0 * 10**9)
    return ingest_pprof(c, "app{}", body, T0, headers=headers)


def functions(c: httpx.Client, headers: Dict[str, str]) -> Dict[str, int]:
    return function_totals(flamegraph(c, "{}", T0 - 10, T0 + 20, headers=headers))


def search(srv: RunningServer, metadata: Tuple[Tuple[str, str], ...]) -> list:
    """Tempo's streaming Search through the main port, as Grafana calls it."""
    request = tempo_pb2.SearchRequest(Query="{}", start=T0 - 3600, end=T0 + 60)
    with grpc.insecure_channel(srv.url.removeprefix("http://")) as ch:
        call = ch.unary_stream(
            "/tempopb.StreamingQuerier/Search",
            request_serializer=tempo_pb2.SearchRequest.SerializeToString,
            response_deserializer=tempo_pb2.SearchResponse.FromString,
        )
        return list(call(request, metadata=metadata, timeout=30))


def search_error(srv: RunningServer, metadata: Tuple[Tuple[str, str], ...]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        search(srv, metadata)
    return err.value.code()


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("auth") / "data", OPERATOR) as server:
        yield server


@pytest.fixture(scope="module")
def team_a(srv: RunningServer) -> Dict[str, str]:
    """Tokens of tenant team-a: an admin one made with the operator's query token, the
    others made with that admin token."""
    with srv.client() as c:
        admin, _ = create_token(c, "admin", {**OP_Q, "X-Scope-OrgID": "team-a"}, "first")
        ingest, _ = create_token(c, "ingest", bearer(admin), "agents")
        query, _ = create_token(c, "query", bearer(admin), "grafana")
    return {"admin": admin, "ingest": ingest, "query": query}


# -- credentials of any bytes ---------------------------------------------------------------


def test_non_ascii_credentials_are_refused_not_crashed(srv: RunningServer) -> None:
    with srv.client() as c:
        for credential in NON_ASCII:
            headers = {"Authorization": credential}
            r = c.post(f"{QUERIER}/ProfileTypes", json={}, headers=headers)
            assert r.status_code == 401 and r.json()["code"] == "unauthenticated", credential
            assert push(c, "f", headers).status_code == 401
            for path in ("/api/search", "/metrics", "/api/v1/alerts", "/api/v1/tokens"):
                assert c.get(path, headers=headers).status_code == 401, (path, credential)
            r = c.put("/api/v1/settings/api", json={"settings": {}}, headers=headers)
            assert r.status_code == 401
        # The server is whole: the right token still works.
        assert c.post(f"{QUERIER}/ProfileTypes", json={}, headers=OP_Q).status_code == 200
    body = cpu_request("latin", T0).pb()
    # gRPC clients send ASCII metadata only: a basic password that is UTF-8 is the way in.
    for value in ("Basic dTrDqcOp", "Basic dTr/6Q=="):
        err = grpc_error(srv.otlp_grpc_address or "", body, [("authorization", value)])
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, value
        code = search_error(srv, (("authorization", value),))
        assert code == grpc.StatusCode.UNAUTHENTICATED, value


def test_credentials_are_compared_as_bytes() -> None:
    assert credential_of(b"Bearer \xe9t\xe9") == b"\xe9t\xe9"
    assert credential_of(b"basic dTrDqcOp") == "\u00e9\u00e9".encode()
    assert credential_of(b"Basic !!!") == b""
    assert credential_of(b"Token abc") == b""


# -- tenants' tokens --------------------------------------------------------------------------


def test_ingest_token_writes_its_tenant_only(srv: RunningServer, team_a: Dict[str, str]) -> None:
    ingest = bearer(team_a["ingest"])
    with srv.client() as c:
        assert push(c, "a_secret", ingest).status_code == 200
        r = push(c, "b_forged", {**ingest, "X-Scope-OrgID": "team-b"})
        assert r.status_code == 403 and "team-a" in r.text
        assert push(c, "b_own", {**OP_IN, "X-Scope-OrgID": "team-b"}).status_code == 200
        # Reading is not an ingest token's.
        r = c.post(f"{QUERIER}/ProfileTypes", json={}, headers=ingest)
        assert r.status_code == 403 and r.json()["code"] == "permission_denied"
        assert functions(c, {**OP_Q, "X-Scope-OrgID": "team-a"})["a_secret"] == 7
        seen_b = functions(c, {**OP_Q, "X-Scope-OrgID": "team-b"})
        assert "b_forged" not in seen_b and seen_b["b_own"] == 7


def test_query_token_reads_its_tenant_whatever_it_names(
    srv: RunningServer, team_a: Dict[str, str]
) -> None:
    query = bearer(team_a["query"])
    with srv.client() as c:
        assert push(c, "a_read", bearer(team_a["ingest"])).status_code == 200
        assert push(c, "b_hidden", {**OP_IN, "X-Scope-OrgID": "team-b"}).status_code == 200
        seen = functions(c, query)
        assert seen["a_read"] == 7 and "b_hidden" not in seen and "b_own" not in seen
        assert functions(c, {**query, "X-Scope-OrgID": "team-a"}) == seen
        for tenant in ("team-b", "anonymous"):
            r = c.post(
                f"{QUERIER}/SelectMergeStacktraces",
                json={"profileTypeID": "x", "labelSelector": "{}", "start": 1, "end": 2},
                headers={**query, "X-Scope-OrgID": tenant},
            )
            assert r.status_code == 403 and r.json()["code"] == "permission_denied", tenant
        r = c.get("/pyroscope/label-values", params={"label": "service_name"}, headers=query)
        assert r.status_code == 200
        r = c.get("/api/search", headers={**query, "X-Scope-OrgID": "team-b"})
        assert r.status_code == 403
        # /metrics names a tenant in its query too; a tenant's token sees its own series.
        for tenant, headers in (
            ("a", bearer(team_a["admin"])),
            ("b", {**OP_Q, "X-Scope-OrgID": "team-b"}),
        ):
            rule = {"metricName": f"profiles_recorded_{tenant}_total"}
            r = c.put(f"/api/v1/recording-rules/{tenant}", json=rule, headers=headers)
            assert r.status_code == 200, r.text
        assert c.get("/metrics", params={"tenant": "team-b"}, headers=query).status_code == 403
        mine = c.get("/metrics", headers=query)
        assert mine.status_code == 200 and 'tenant="team-a"' in mine.text
        assert 'tenant="team-b"' not in mine.text
        every = c.get("/metrics", headers=OP_Q).text
        assert 'tenant="team-a"' in every and 'tenant="team-b"' in every
        # Writing is not a query token's.
        assert push(c, "a_forged", query).status_code == 403


def test_tokens_over_grpc(srv: RunningServer, team_a: Dict[str, str]) -> None:
    ingest = ("authorization", f"Bearer {team_a['ingest']}")
    query = ("authorization", f"Bearer {team_a['query']}")
    address = srv.otlp_grpc_address or ""
    grpc_export(address, cpu_request("grpc-a", T0 + 100).msg, [ingest])
    err = grpc_error(address, cpu_request("grpc-b", T0).pb(), [ingest, ("x-scope-orgid", "b")])
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    err = grpc_error(address, cpu_request("grpc-q", T0).pb(), [query])
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    # OTLP/HTTP says so in its own google.rpc.Status, as gRPC does.
    body = cpu_request("http-b", T0).pb()
    headers = {"Authorization": f"Bearer {team_a['ingest']}", "X-Scope-OrgID": "team-b"}
    r = post(srv.otlp_http_url or "", body, headers=headers)
    assert (
        r.status_code == 403 and http_status(r).code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    )
    with srv.client() as c:
        r = c.get(
            "/pyroscope/label-values",
            params={"label": "service_name", "from": T0 - 60, "until": T0 + 600},
            headers={"Authorization": f"Bearer {team_a['query']}"},
        )
        assert "grpc-a" in r.json()
    search(srv, (query,))
    assert search_error(srv, (query, ("x-scope-orgid", "team-b"))) == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    assert search_error(srv, (ingest,)) == grpc.StatusCode.PERMISSION_DENIED


def test_grpc_calls_without_a_token_hold_no_worker(
    srv: RunningServer, team_a: Dict[str, str]
) -> None:
    """Calls that send their headers but never their message, with no token: each gRPC
    server has 8 workers, and such calls held one each until their connection went away.
    They are refused from their metadata; a caller with a token is served meanwhile."""
    release = threading.Event()

    def never() -> Iterator[bytes]:
        release.wait(60)
        return
        yield b""  # a generator that sends nothing until released

    def hold(target: str, method: str) -> Tuple[grpc.Channel, List[grpc.Future]]:
        channel = grpc.insecure_channel(target)
        call = channel.stream_unary(method)
        return channel, [call.future(never(), timeout=60) for _ in range(12)]

    main = srv.url.removeprefix("http://")
    held = [
        hold(srv.otlp_grpc_address or "", EXPORT),
        hold(main, "/tempopb.StreamingQuerier/SearchTags"),
    ]
    try:
        for _, calls in held:
            for call in calls:
                assert call.exception(timeout=10).code() == grpc.StatusCode.UNAUTHENTICATED
        ingest = ("authorization", f"Bearer {team_a['ingest']}")
        grpc_export(srv.otlp_grpc_address or "", cpu_request("held", T0).msg, [ingest])
        search(srv, (("authorization", f"Bearer {team_a['query']}"),))
    finally:
        release.set()
        for channel, _ in held:
            channel.close()


ADMIN_CHANGES = [
    ("PUT", "/api/v1/alerts/rules/slow", {"selector": "{}"}),
    ("DELETE", "/api/v1/alerts/rules/slow", None),
    ("PUT", "/api/v1/recording-rules/r1", {"metric_name": "x"}),
    ("DELETE", "/api/v1/recording-rules/r1", None),
    ("POST", "/settings.v1.RecordingRulesService/UpsertRecordingRule", {}),
    ("POST", "/settings.v1.RecordingRulesService/DeleteRecordingRule", {"id": "r1"}),
    ("POST", "/settings.v1.SettingsService/Set", {"setting": {"name": "a", "value": "1"}}),
    ("POST", "/settings.v1.SettingsService/Delete", {"name": "a"}),
    ("PUT", "/api/v1/settings/api", {"settings": {"enabled": False}}),
    ("DELETE", "/api/v1/settings/api", None),
    ("POST", "/api/v1/tokens", {"role": "query"}),
    ("GET", "/api/v1/tokens", None),
    ("DELETE", "/api/v1/tokens/0123", None),
]


def test_only_admins_change_rules_settings_and_tokens(
    srv: RunningServer, team_a: Dict[str, str]
) -> None:
    with srv.client() as c:
        for method, path, body in ADMIN_CHANGES:
            for who in ("ingest", "query"):
                r = c.request(method, path, json=body, headers=bearer(team_a[who]))
                assert r.status_code == 403, (method, path, who, r.text)
            r = c.request(method, path, json=body)
            assert r.status_code == 401, (method, path)
            for headers in (bearer(team_a["admin"]), OP_Q):
                r = c.request(method, path, json=body, headers=headers)
                assert r.status_code not in (401, 403), (method, path, r.text)
        # Reading rules and settings is a query.
        for path in ("/api/v1/alerts/rules", "/api/v1/recording-rules", "/api/v1/settings"):
            assert c.get(path, headers=bearer(team_a["query"])).status_code == 200, path
        # An admin token manages its own tenant only.
        r = c.get("/api/v1/tokens", headers={**bearer(team_a["admin"]), "X-Scope-OrgID": "b"})
        assert r.status_code == 403
        mine = c.get("/api/v1/tokens", headers=bearer(team_a["admin"])).json()["tokens"]
        assert {t["tenant"] for t in mine} == {"team-a"}
        assert {"first", "agents", "grafana"} <= {t["name"] for t in mine}
        assert all(set(t) == {"id", "tenant", "role", "name", "created_at"} for t in mine)
        assert c.get("/api/v1/tokens", headers={**OP_Q, "X-Scope-OrgID": "b"}).json() == {
            "tokens": []
        }


def test_revoked_token_stops_at_once(srv: RunningServer, team_a: Dict[str, str]) -> None:
    with srv.client() as c:
        token, token_id = create_token(c, "query", bearer(team_a["admin"]))
        assert c.get("/api/v1/alerts", headers=bearer(token)).status_code == 200
        # Another tenant's admin (the operator naming team-b) cannot revoke it.
        r = c.delete(f"/api/v1/tokens/{token_id}", headers={**OP_Q, "X-Scope-OrgID": "team-b"})
        assert r.status_code == 404
        r = c.delete(f"/api/v1/tokens/{token_id}", headers=bearer(team_a["admin"]))
        assert r.status_code == 200 and r.json() == {"revoked": token_id}
        assert c.get("/api/v1/alerts", headers=bearer(token)).status_code == 401


def test_bad_token_requests_are_refused(srv: RunningServer) -> None:
    admin = {**OP_Q, "X-Scope-OrgID": "team-c"}
    with srv.client() as c:
        for body in (
            {"role": "root"},
            {"role": "query", "extra": 1},
            [1],
            {"role": "query", "name": 5},
        ):
            r = c.post("/api/v1/tokens", json=body, headers=admin)
            assert r.status_code == 400 and r.json()["error"], body
        r = c.post("/api/v1/tokens", content=b"{", headers=admin)
        assert r.status_code == 400
        r = c.post(
            "/api/v1/tokens", json={"role": "query"}, headers={**OP_Q, "X-Scope-OrgID": "../x"}
        )
        assert r.status_code == 400 and "tenant" in r.json()["error"]


# -- every route --------------------------------------------------------------------------


PUBLIC = {"/ready", "/api/echo", "/api/status/buildinfo"}
INGEST_ROUTES = {
    "/ingest",
    "/pyroscope/ingest",
    "/push.v1.PusherService/Push",
    "/v1/traces",
    "/v1development/profiles",
    "/api/v1/agent/settings",
}


def _expected_role(method: str, path: str, pages: List[str]) -> Optional[str]:
    """The role each route needs, written out independently of server.auth's table."""
    if path in PUBLIC or path in pages:
        return None
    if path in INGEST_ROUTES:
        return "ingest"
    if path.startswith("/api/v1/tokens"):
        return "admin"
    if path.endswith(("/UpsertRecordingRule", "/DeleteRecordingRule")):
        return "admin"
    if path in ("/settings.v1.SettingsService/Set", "/settings.v1.SettingsService/Delete"):
        return "admin"
    admin_trees = ("/api/v1/alerts/rules/", "/api/v1/recording-rules/", "/api/v1/settings/")
    if method in ("PUT", "DELETE") and path.startswith(admin_trees):
        return "admin"
    return "query"


def _routes(tmp: Path) -> List[Tuple[str, str, Optional[str]]]:
    from hotspan.server.app import create_app
    from hotspan.ui.routes import PAGES

    store = DuckDBStore(str(tmp / "routes"))
    try:
        app = create_app(ServerConfig(), store=store)
        out = []
        for route in app.routes:
            if not isinstance(route, Route):
                continue
            for method in sorted((route.methods or set()) - {"HEAD"}):
                role = _expected_role(method, route.path, PAGES)
                out.append((method, re.sub(r"\{[^}]*\}", "x1", route.path), role))
        return out
    finally:
        store.close()


def test_every_route_needs_its_role(tmp_path: Path) -> None:
    routes = _routes(tmp_path)
    assert len(routes) > 60 and {r for _, _, r in routes} == {None, "ingest", "query", "admin"}
    with running_server(tmp_path / "data", ["--query-token", "op-q"]) as srv, srv.client() as c:
        admin, _ = create_token(c, "admin", OP_Q)
        tokens = {"admin": admin}
        tokens.update({role: create_token(c, role, bearer(admin))[0] for role in (INGEST, "query")})
        for method, path, role in routes:
            r = c.request(method, path)
            if role is None:
                assert r.status_code not in (401, 403), (method, path)
                continue
            assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
            for holder, token in tokens.items():
                allowed = holder == role or holder == "admin"
                r = c.request(method, path, headers=bearer(token))
                if allowed:
                    assert r.status_code not in (401, 403), (method, path, holder, r.text[:200])
                else:
                    assert r.status_code == 403, (method, path, holder, r.status_code)


# -- when the server is open ------------------------------------------------------------------


def test_open_server_makes_no_tokens(tmp_path: Path) -> None:
    # Anyone who reaches an open server may push and query, as its operator chose; a token
    # made there would close every route to everyone else: none can be.
    with running_server(tmp_path / "data") as srv, srv.client() as c:
        r = c.post("/api/v1/tokens", json={"role": "ingest"}, headers={"X-Scope-OrgID": "x"})
        assert r.status_code == 401 and "--query-token" in r.text
        assert c.get("/api/v1/tokens").status_code == 401
        assert push(c, "open", {}).status_code == 200
        assert c.post(f"{QUERIER}/ProfileTypes", json={}).status_code == 200


def test_server_with_a_query_token_closes_with_its_first_tenant_token(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", ["--query-token", "op-q"]) as srv, srv.client() as c:
        assert push(c, "open", {}).status_code == 200  # no ingest token: pushes are open
        assert c.post(f"{QUERIER}/ProfileTypes", json={}).status_code == 401
        # Bytes of any kind on an open side are ignored, as before.
        assert push(c, "open", {"Authorization": NON_ASCII[0]}).status_code == 200
        assert c.post("/api/v1/tokens", json={"role": "admin"}).status_code == 401
        admin, _ = create_token(c, "admin", OP_Q)
        assert push(c, "closed", {}).status_code == 401
        assert functions(c, bearer(admin))["open"] == 14


def test_operator_ingest_token_alone_keeps_its_old_meaning(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", ["--ingest-token", "op-in"]) as srv, srv.client() as c:
        assert push(c, "f", {}).status_code == 401
        assert push(c, "f", OP_IN).status_code == 200
        # Queries stay open, as they were; tokens can't be made without an operator's
        # query token, or ingest would be open to anyone who made one.
        assert c.post(f"{QUERIER}/ProfileTypes", json={}).status_code == 200
        assert c.post("/api/v1/tokens", json={"role": "ingest"}).status_code == 401
        r = c.post("/api/v1/tokens", json={"role": "ingest"}, headers=OP_IN)
        assert r.status_code == 401


# -- the cache ------------------------------------------------------------------------------


def test_tokens_are_read_from_the_store_once_per_ttl(tmp_path: Path) -> None:
    store = DuckDBStore(str(tmp_path / "data"))
    try:
        auth = Authenticator(store, ServerConfig(), ttl_s=60)
        auth.refresh()
        assert auth.resolve(INGEST, b"", None).tenant == "anonymous"  # open: no tokens
        # Another server over the same store adds a token: this one does not read the store
        # again before the TTL (or a change on this server).
        store.put_token(StoredToken("t", "id1", "ingest", token_hash(b"secret")))
        assert not auth.stale()
        assert auth.resolve(INGEST, b"", None).tenant == "anonymous"
        auth.changed()
        with pytest.raises(HTTPError) as refused:
            auth.resolve(INGEST, b"", None)
        assert refused.value.status == 401
        assert auth.resolve(INGEST, b"Bearer secret", None).tenant == "t"
        store.delete_token("t", "id1")
        assert auth.resolve(INGEST, b"Bearer secret", None).tenant == "t"  # within the TTL
        auth.ttl_s = 0.05
        auth.changed()
        store.put_token(StoredToken("t", "id2", "query", token_hash(b"other")))
        time.sleep(0.1)
        assert auth.stale()
        auth.refresh()
        with pytest.raises(HTTPError) as refused:
            auth.resolve(INGEST, b"Bearer secret", None)
        assert refused.value.status == 401
        with pytest.raises(HTTPError) as refused:
            auth.resolve(INGEST, b"Bearer other", None)
        assert refused.value.status == 403
    finally:
        store.close()


def _seconds_until(client: httpx.Client, token: str, status: int) -> float:
    start = time.monotonic()
    while client.get("/api/v1/alerts", headers=bearer(token)).status_code != status:
        assert time.monotonic() - start < 20, f"still not {status}"
        time.sleep(0.1)
    return time.monotonic() - start


def test_servers_over_one_clickhouse_share_tokens(tmp_path: Path, clickhouse_url: str) -> None:
    """A token made through one server opens the other; revoked through one, it stops at once
    there and within the cache's TTL on the other."""
    args = ["--store", clickhouse_url, "--query-token", "op-q"]
    with (
        running_server(tmp_path / "a", args) as a,
        running_server(tmp_path / "b", args) as b,
        a.client() as ca,
        b.client() as cb,
    ):
        assert cb.get("/api/v1/alerts", headers=OP_Q).status_code == 200  # b reads the tokens
        token, token_id = create_token(ca, "query", {**OP_Q, "X-Scope-OrgID": "shared"})
        assert ca.get("/api/v1/alerts", headers=bearer(token)).status_code == 200
        assert _seconds_until(cb, token, 200) <= CACHE_TTL_S + 1
        assert ca.delete(f"/api/v1/tokens/{token_id}", headers=bearer(token)).status_code == 403
        r = ca.delete(f"/api/v1/tokens/{token_id}", headers={**OP_Q, "X-Scope-OrgID": "shared"})
        assert r.status_code == 200
        assert ca.get("/api/v1/alerts", headers=bearer(token)).status_code == 401
        assert _seconds_until(cb, token, 401) <= CACHE_TTL_S + 1


# -- scrape targets -------------------------------------------------------------------------


def test_scrape_targets_show_the_callers_tenant_only(tmp_path: Path) -> None:
    config = tmp_path / "scrape.yaml"
    config.write_text(
        """scrape_interval: 60s
scrape_configs:
  - job_name: job-a
    tenant: team-a
    profiles: [heap]
    static_configs: [{targets: ["127.0.0.1:9"]}]
  - job_name: job-default
    profiles: [heap]
    static_configs: [{targets: ["127.0.0.1:9"]}]
"""
    )
    args = ["--scrape", str(config), "--query-token", "op-q"]
    with running_server(tmp_path / "data", args) as srv, srv.client() as c:

        def jobs(tenant: Optional[str]) -> List[str]:
            headers = {**OP_Q, "X-Scope-OrgID": tenant} if tenant is not None else OP_Q
            r = c.get("/api/v1/scrape/targets", headers=headers)
            assert r.status_code == 200, r.text
            return [t["job"] for t in r.json()["targets"]]

        assert jobs("team-a") == ["job-a"]
        assert jobs(None) == ["job-default"]
        assert jobs("team-b") == []
        for bad in ("../x", "a/b", ".."):
            r = c.get("/api/v1/scrape/targets", headers={**OP_Q, "X-Scope-OrgID": bad})
            assert r.status_code == 400 and "tenant" in r.text, bad
        admin, _ = create_token(c, "admin", {**OP_Q, "X-Scope-OrgID": "team-a"})
        r = c.get("/api/v1/scrape/targets", headers=bearer(admin))
        assert [t["job"] for t in r.json()["targets"]] == ["job-a"]
        r = c.get("/api/v1/scrape/targets", headers={**bearer(admin), "X-Scope-OrgID": "anonymous"})
        assert r.status_code == 403


def test_scrape_file_tenant_must_be_a_tenant_id() -> None:
    doc = {
        "scrape_configs": [
            {"job_name": "j", "tenant": "../x", "static_configs": [{"targets": ["h:1"]}]}
        ]
    }
    with pytest.raises(ScrapeConfigError, match="tenant"):
        parse_scrape_config(doc)


# -- hotspan tokens -------------------------------------------------------------------------


def _cli(srv: RunningServer, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hotspan", "tokens", *args, "--server", srv.url],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_create_list_revoke(srv: RunningServer) -> None:
    done = _cli(srv, "create", "--tenant", "team-cli", "--role", "admin", "--token", "op-q")
    assert done.returncode == 0, done.stderr
    admin = done.stdout.strip()
    assert admin.startswith("hst_") and len(admin) > 40 and "not shown again" in done.stderr
    done = _cli(srv, "create", "--role", "ingest", "--name", "ci agents", "--token", admin)
    assert done.returncode == 0, done.stderr
    ingest = done.stdout.strip()
    done = _cli(srv, "list", "--token", admin)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["ID", "TENANT", "ROLE", "CREATED", "NAME"]
    rows = {line.split()[2]: line for line in lines[1:]}
    assert set(rows) == {"admin", "ingest"} and "ci agents" in rows["ingest"]
    assert admin not in done.stdout and ingest not in done.stdout
    ingest_id = rows["ingest"].split()[0]
    with srv.client() as c:
        assert push(c, "cli", bearer(ingest)).status_code == 200
        done = _cli(srv, "revoke", ingest_id, "--token", admin)
        assert done.returncode == 0 and f"token {ingest_id} revoked" in done.stdout
        assert push(c, "cli", bearer(ingest)).status_code == 401
    # The ingest token could not manage tokens; an unknown id is an error.
    done = _cli(srv, "list", "--token", ingest)
    assert done.returncode == 1 and "401" in done.stderr
    done = _cli(srv, "revoke", "nope", "--token", admin)
    assert done.returncode == 1 and "404" in done.stderr
    done = _cli(srv, "create", "--role", "query", "--token", admin, "--tenant", "other")
    assert done.returncode == 1 and "403" in done.stderr
