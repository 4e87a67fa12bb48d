"""Live agent settings on the server (issue 14): the operator API, the answer agents get to
uploads and polls, the instances they report, the CLI, and server-side redaction; over real
HTTP against real server processes and the real DuckDB store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import duckdb
import httpx
import pytest

from hotspan.model.agent_settings import INSTANCE_HEADER, STATUS_HEADER
from hotspan.model.labels import normalize
from hotspan.model.profile import Frame, IngestBatch, ProfileType
from hotspan.server.instances import InstanceRegistry
from hotspan.server.redact import REDACTED, Redactor
from tests.conftest import RunningServer, running_server
from tests.helpers import QUERIER, flamegraph, function_totals, ingest_pprof, make_pprof

T0 = 1_700_000_000
SETTINGS = "/api/v1/settings"
POLL = "/api/v1/agent/settings"


def put(c: httpx.Client, service: str, settings: dict, selector: str = "", **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
    return c.put(f"{SETTINGS}/{service}", json={"selector": selector, "settings": settings}, **kw)


def agent_headers(instance: str, **status) -> dict:  # type: ignore[no-untyped-def]
    return {INSTANCE_HEADER: instance, STATUS_HEADER: json.dumps(status)}


def upload(c: httpx.Client, name: str, headers: dict, body: bytes = b"main;work 3\n"):  # type: ignore[no-untyped-def]
    return c.post("/ingest", params={"name": name, "from": str(T0)}, content=body, headers=headers)


def test_settings_round_trip_and_versions(server: RunningServer) -> None:
    with server.client() as c:
        assert c.get(SETTINGS).json() == {"rules": []}
        r = put(c, "api", {"sample_rate": 50, "profile_types": ["wall", "cpu", "cpu"]})
        assert r.status_code == 200, r.text
        first = r.json()
        assert first["service"] == "api" and first["selector"] == "" and first["version"] == 1
        assert first["settings"] == {"sample_rate": 50, "profile_types": ["cpu", "wall"]}
        assert isinstance(first["updated_at"], int) and first["updated_at"] > 0
        # The selector comes back in one spelling, whatever spacing or order it was sent in.
        r = put(c, "api", {"enabled": False}, ' { region = "eu", env="prod" } ')
        assert r.json()["selector"] == '{env="prod", region="eu"}' and r.json()["version"] == 2
        assert put(c, "web", {"max_overhead": 0.5}).json()["version"] == 3
        # Same (service, selector) in another spelling: its settings are replaced.
        r = put(c, "api", {"sample_rate": 10}, '{env="prod",region="eu"}')
        assert r.json()["version"] == 4 and r.json()["settings"] == {"sample_rate": 10}
        rules = c.get(SETTINGS).json()["rules"]
        assert [(x["service"], x["selector"], x["version"]) for x in rules] == [
            ("api", "", 1),
            ("api", '{env="prod", region="eu"}', 4),
            ("web", "", 3),
        ]
        one = c.get(f"{SETTINGS}/api").json()
        assert one["service"] == "api" and len(one["rules"]) == 2 and one["instances"] == []
        r = c.delete(f"{SETTINGS}/api", params={"selector": '{region="eu", env="prod"}'})
        assert r.status_code == 200 and r.json() == {"deleted": True}
        r = c.delete(f"{SETTINGS}/api", params={"selector": '{region="eu", env="prod"}'})
        assert r.status_code == 404 and "no rule" in r.json()["error"]
        # The delete counted: the next change is version 6.
        assert put(c, "api", {"enabled": True}).json()["version"] == 6
    # Rules and the version counter outlive the server.
    server.stop()
    with running_server(server.data_dir) as again, again.client() as c:
        rules = c.get(SETTINGS).json()["rules"]
        assert [(x["service"], x["selector"], x["version"]) for x in rules] == [
            ("api", "", 6),
            ("web", "", 3),
        ]
        assert put(c, "web", {"enabled": False}).json()["version"] == 7


def test_most_specific_rule_wins_then_the_latest(server: RunningServer) -> None:
    with server.client() as c:

        def answer(name: str) -> dict:
            r = c.get(POLL, params={"name": name}, headers=agent_headers("host/1/aaaa"))
            assert r.status_code == 200, r.text
            return r.json()

        assert answer("api{env=prod}") == {"version": 0, "settings": None}
        put(c, "api", {"sample_rate": 1})
        put(c, "api", {"sample_rate": 2}, '{env="prod"}')
        put(c, "api", {"sample_rate": 3}, '{env="prod", region=~"eu-.*"}')
        put(c, "other", {"sample_rate": 4})
        assert answer("api{env=dev}") == {"version": 1, "settings": {"sample_rate": 1}}
        assert answer("api.cpu{env=prod}") == {"version": 2, "settings": {"sample_rate": 2}}
        assert answer("api{env=prod,region=eu-west}")["settings"] == {"sample_rate": 3}
        assert answer("api{env=prod,region=us}")["settings"] == {"sample_rate": 2}
        # A service_name tag names the service, as it does for the upload itself.
        assert answer("whatever{service_name=other}")["settings"] == {"sample_rate": 4}
        assert answer("nobody{env=prod}") == {"version": 0, "settings": None}
        # Two matching rules with as many matchers: the one changed last wins.
        put(c, "api", {"sample_rate": 5}, '{host="h1"}')
        assert answer("api{host=h1,env=prod}") == {"version": 5, "settings": {"sample_rate": 5}}
        put(c, "api", {"sample_rate": 6}, '{env="prod"}')
        assert answer("api{host=h1,env=prod}") == {"version": 6, "settings": {"sample_rate": 6}}
        c.delete(f"{SETTINGS}/api", params={"selector": '{env="prod"}'})
        assert answer("api{host=h1,env=prod}") == {"version": 5, "settings": {"sample_rate": 5}}


def test_agents_get_settings_with_uploads_and_show_as_instances(server: RunningServer) -> None:
    with server.client() as c:
        # Before any rule: version 0 and no settings (the agent keeps its own configuration).
        r = upload(c, "shop.cpu{env=prod}", agent_headers("h/1/0001", settings_version=0))
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/json"
        assert r.json() == {"version": 0, "settings": None}
        rule = put(c, "shop", {"sample_rate": 20}, '{env="prod"}').json()
        status = {
            "settings_version": rule["version"],
            "enabled": True,
            "sample_rate": 20,
            "overhead": 0.2,
            "rate_reason": "",
            "future_key": {"kept": [1, 2]},  # unknown keys are stored as sent
        }
        r = upload(c, "shop.cpu{env=prod}", agent_headers("h/1/0001", **status))
        assert r.json() == {"version": rule["version"], "settings": {"sample_rate": 20}}
        # Another instance, on an old version, and one of another environment.
        upload(c, "shop.cpu{env=prod}", agent_headers("h/2/0002", settings_version=0))
        upload(c, "shop.cpu{env=dev}", agent_headers("h/3/0003", settings_version=0))
        # A poll is recorded like an upload (an agent that sheds load still shows up).
        r = c.get(POLL, params={"name": "shop{env=dev}"}, headers=agent_headers("h/4/0004", shed=1))
        assert r.json() == {"version": 0, "settings": None}
        got = c.get(f"{SETTINGS}/shop").json()
        by_id = {i["instance"]: i for i in got["instances"]}
        assert sorted(by_id) == ["h/1/0001", "h/2/0002", "h/3/0003", "h/4/0004"]
        one = by_id["h/1/0001"]
        assert one["status"] == status and one["labels"] == {"env": "prod", "service_name": "shop"}
        assert one["rule_selector"] == '{env="prod"}' and one["expected_version"] == 1
        assert one["follows"] is True and one["last_seen"] > 0
        assert by_id["h/2/0002"]["follows"] is False
        assert by_id["h/3/0003"]["rule_selector"] is None
        assert by_id["h/3/0003"]["expected_version"] == 0 and by_id["h/3/0003"]["follows"]
        assert by_id["h/4/0004"]["status"] == {"shed": 1} and not by_id["h/4/0004"]["follows"]
        assert c.get(f"{SETTINGS}/other").json()["instances"] == []
        # The uploads themselves were stored.
        graph = flamegraph(c, '{service_name="shop"}', T0 - 60, T0 + 60)
        assert function_totals(graph)["work"] == 4 * 3 * 10**7


def test_pyroscope_uploads_without_the_header_keep_an_empty_answer(server: RunningServer) -> None:
    with server.client() as c:
        put(c, "legacy", {"enabled": False})
        r = upload(c, "legacy.cpu{}", {})
        assert r.status_code == 200 and r.content == b""
        assert "json" not in r.headers.get("content-type", "")
        r = ingest_pprof(c, "legacy{}", make_pprof([(["leaf", "main"], 7, {})]), T0)
        assert r.status_code == 200 and r.content == b""
        assert c.get(f"{SETTINGS}/legacy").json()["instances"] == []


def test_a_bad_status_header_never_fails_the_upload(server: RunningServer) -> None:
    bad_statuses = ["{not json", '["a list"]', "x" * 5000, '{"a":' * 3000]
    with server.client() as c:
        for i, status in enumerate(bad_statuses):
            headers = {INSTANCE_HEADER: f"h/{i}/beef", STATUS_HEADER: status}
            r = upload(c, "tough.cpu{}", headers)
            assert r.status_code == 200, (status[:20], r.text)
            assert r.json() == {"version": 0, "settings": None}
        # An instance id past 200 characters is not recorded, yet the upload goes through.
        r = upload(c, "tough.cpu{}", {INSTANCE_HEADER: "i" * 201, STATUS_HEADER: "{}"})
        assert r.status_code == 200 and r.json()["version"] == 0
        # A good status, then a bad one: the good one stays.
        upload(c, "tough.cpu{}", agent_headers("h/9/beef", settings_version=0, sample_rate=9))
        upload(c, "tough.cpu{}", {INSTANCE_HEADER: "h/9/beef", STATUS_HEADER: "{oops"})
        instances = c.get(f"{SETTINGS}/tough").json()["instances"]
        by_id = {i["instance"]: i for i in instances}
        assert sorted(by_id) == ["h/0/beef", "h/1/beef", "h/2/beef", "h/3/beef", "h/9/beef"]
        assert by_id["h/0/beef"]["status"] == {}
        assert by_id["h/9/beef"]["status"] == {"settings_version": 0, "sample_rate": 9}
        graph = flamegraph(c, '{service_name="tough"}', T0 - 60, T0 + 60)
        assert function_totals(graph)["work"] == 7 * 3 * 10**7


@pytest.mark.parametrize(
    "body, reason",
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"settings": {"sample_rat": 5}}', "unknown setting 'sample_rat'"),
        (b'{"settings": {"sample_rate": 0}}', "sample_rate 0 must be between 1 and 1000"),
        (b'{"settings": {"sample_rate": 5.5}}', "whole number"),
        (b'{"settings": {"enabled": "yes"}}', "enabled must be true or false"),
        (b'{"settings": {"profile_types": ["cpu", "gpu"]}}', "unknown profile type"),
        (b'{"settings": {"max_overhead": 0}}', "max_overhead"),
        (b'{"settings": "fast"}', "settings must be a JSON object"),
        (b'{"selector": "{env=prod}", "settings": {}}', "bad selector"),
        (b'{"selector": "app{env=\\"x\\"}", "settings": {}}', "labels only"),
        (b'{"selector": "{env=~\\"(\\"}", "settings": {}}', "bad selector"),
        (b'{"selector": 5, "settings": {}}', "selector must be a string"),
        (b'{"sample_rate": 5}', "unknown field"),
        (b'{"selector": ""}', "'settings'"),
        (b'{"service": "other", "settings": {}}', "not the path's"),
    ],
)
def test_bad_settings_are_refused_and_change_nothing(
    module_server: RunningServer, body: bytes, reason: str
) -> None:
    with module_server.client() as c:
        before = c.get(SETTINGS).json()
        r = c.put(f"{SETTINGS}/badinput", content=body)
        assert r.status_code == 400, r.text
        assert reason in r.json()["error"]
        assert c.get(SETTINGS).json() == before


def test_bad_requests_of_the_other_endpoints(module_server: RunningServer) -> None:
    with module_server.client() as c:
        r = c.put(f"{SETTINGS}/big", content=b'{"settings": {}, "x": "' + b"a" * 70000 + b'"}')
        assert r.status_code == 413
        r = c.delete(f"{SETTINGS}/big", params={"selector": "{env="})
        assert r.status_code == 400 and "bad selector" in r.json()["error"]
        r = c.get(f"{SETTINGS}/" + "s" * 201)
        assert r.status_code == 400 and "service name" in r.json()["error"]
        r = c.get(POLL)
        assert r.status_code == 400 and "'name'" in r.json()["error"]
        r = c.get(POLL, params={"name": "{env=prod}"})
        assert r.status_code == 400
        r = c.get(SETTINGS, headers={"X-Scope-OrgID": "bad/tenant"})
        assert r.status_code == 400 and "tenant" in r.json()["error"]


def test_tokens_and_tenants(tmp_path: Path) -> None:
    args = ["--ingest-token", "in-tok", "--query-token", "q-tok"]
    with running_server(tmp_path / "data", args) as srv, srv.client() as c:
        ingest = {"Authorization": "Bearer in-tok"}
        query = {"Authorization": "Bearer q-tok"}
        r = put(c, "api", {"enabled": False}, headers=ingest)
        assert r.status_code == 401
        assert put(c, "api", {"enabled": False}).status_code == 401
        assert c.get(SETTINGS, headers=ingest).status_code == 401
        assert c.delete(f"{SETTINGS}/api", headers=ingest).status_code == 401
        r = put(c, "api", {"enabled": False}, headers={**query, "X-Scope-OrgID": "team-a"})
        assert r.status_code == 200 and r.json()["version"] == 1
        # Agents poll and upload with the ingest token; the query token does not do for them.
        agent = {**ingest, **agent_headers("h/1/0001", settings_version=0)}
        r = c.get(POLL, params={"name": "api{}"}, headers={**agent, "X-Scope-OrgID": "team-a"})
        assert r.json() == {"version": 1, "settings": {"enabled": False}}
        r = c.get(POLL, params={"name": "api{}"}, headers={**query, "X-Scope-OrgID": "team-a"})
        assert r.status_code == 401
        r = upload(c, "api.cpu{}", {**agent, "X-Scope-OrgID": "team-a"})
        assert r.json() == {"version": 1, "settings": {"enabled": False}}
        # Another tenant sees none of it, and its agents follow nothing.
        r = upload(c, "api.cpu{}", {**agent, "X-Scope-OrgID": "team-b"})
        assert r.json() == {"version": 0, "settings": None}
        b = {**query, "X-Scope-OrgID": "team-b"}
        assert c.get(SETTINGS, headers=b).json() == {"rules": []}
        got = c.get(f"{SETTINGS}/api", headers=b).json()
        assert got["rules"] == [] and [i["instance"] for i in got["instances"]] == ["h/1/0001"]
        assert c.delete(f"{SETTINGS}/api", headers=b).status_code == 404
        assert put(c, "api", {"sample_rate": 5}, headers=b).json()["version"] == 1
        a = c.get(f"{SETTINGS}/api", headers={**query, "X-Scope-OrgID": "team-a"}).json()
        assert [r["settings"] for r in a["rules"]] == [{"enabled": False}]
        # The CLI sends its token and tenant.
        done = _cli(srv, "get", "api", "--json", "--token", "q-tok", "--tenant", "team-a")
        assert done.returncode == 0, done.stderr
        assert [r["settings"] for r in json.loads(done.stdout)["rules"]] == [{"enabled": False}]
        done = _cli(srv, "set", "api", "--rate", "9", "--token", "in-tok")
        assert done.returncode == 1 and "401" in done.stderr


def _cli(srv: RunningServer, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hotspan", "settings", *args, "--server", srv.url],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_set_get_delete(module_server: RunningServer) -> None:
    srv = module_server
    done = _cli(srv, "set", "cliapp", "--rate", "50", "--types", "cpu,wall")
    assert done.returncode == 0, done.stderr
    assert "version" in done.stdout and "sample_rate=50" in done.stdout
    sel = '{env="prod"}'
    done = _cli(srv, "set", "cliapp", "--selector", sel, "--disable", "--max-overhead", "0.5")
    assert done.returncode == 0, done.stderr
    # set merges into the rule's settings; --replace starts afresh.
    done = _cli(srv, "set", "cliapp", "--selector", sel, "--no-conditional-only")
    assert done.returncode == 0, done.stderr
    with srv.client() as c:
        upload(c, "cliapp.cpu{env=prod}", agent_headers("web-1/42/abcd", settings_version=0))
        rules = {r["selector"]: r for r in c.get(f"{SETTINGS}/cliapp").json()["rules"]}
    assert rules[""]["settings"] == {"sample_rate": 50, "profile_types": ["cpu", "wall"]}
    assert rules[sel]["settings"] == {
        "enabled": False,
        "max_overhead": 0.5,
        "conditional_only": False,
    }
    done = _cli(srv, "get", "cliapp")
    assert done.returncode == 0, done.stderr
    assert "sample_rate=50" in done.stdout and "enabled=false" in done.stdout
    assert "web-1/42/abcd" in done.stdout and "NO" in done.stdout
    raw = json.loads(_cli(srv, "get", "cliapp", "--json").stdout)
    assert raw["instances"][0]["rule_selector"] == sel
    done = _cli(srv, "set", "cliapp", "--selector", sel, "--replace", "--enable")
    assert done.returncode == 0, done.stderr
    raw = json.loads(_cli(srv, "get", "cliapp", "--json").stdout)
    assert {r["selector"]: r["settings"] for r in raw["rules"]}[sel] == {"enabled": True}
    done = _cli(srv, "delete", "cliapp", "--selector", '{ env = "prod" }')
    assert done.returncode == 0, done.stderr
    raw = json.loads(_cli(srv, "get", "cliapp", "--json").stdout)
    assert [r["selector"] for r in raw["rules"]] == [""]
    # Errors: a message naming the problem and a non-zero exit, nothing changed.
    for args, message in [
        (["set", "cliapp", "--rate", "0"], "sample_rate 0 must be between 1 and 1000"),
        (["set", "cliapp", "--types", "cpu,gpu"], "unknown profile type"),
        (["set", "cliapp"], "nothing to set"),
        (["set", "cliapp", "--selector", "{env=", "--rate", "5"], "bad --selector"),
        (["delete", "cliapp", "--selector", '{env="none"}'], "404 no rule"),
    ]:
        done = _cli(srv, *args)
        assert done.returncode != 0 and message in done.stderr, (args, done.stderr)
    raw = json.loads(_cli(srv, "get", "cliapp", "--json").stdout)
    assert [r["settings"] for r in raw["rules"]] == [
        {"sample_rate": 50, "profile_types": ["cpu", "wall"]}
    ]
    done = subprocess.run(
        [sys.executable, "-m", "hotspan", "settings", "get", "x", "--server", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "cannot reach" in done.stderr


# -- redaction -----------------------------------------------------------------------------------


@pytest.fixture
def redacting_server(tmp_path: Path) -> Iterator[RunningServer]:
    args = ["--redact", "secret", "--redact", r"passw(or)?d"]
    with running_server(tmp_path / "data", args) as srv:
        yield srv


def _stored_texts(data_dir: Path) -> List[str]:
    con = duckdb.connect(str(data_dir / "hotspan.duckdb"), read_only=True)
    try:
        texts = [
            t for row in con.execute("SELECT name, filename FROM frames").fetchall() for t in row
        ]
        texts += [labels for (labels,) in con.execute("SELECT labels FROM series").fetchall()]
    finally:
        con.close()
    return texts


def test_redaction_of_pprof_and_folded_uploads(redacting_server: RunningServer) -> None:
    srv = redacting_server
    with srv.client() as c:
        r = c.post(
            "/ingest",
            params={"name": "vault.cpu{env=prod,user=PassWord1}", "from": str(T0)},
            content=b"main;load_SECRET_key;parse 4\nmain;load_secret_key 1\nmain;fine 2\n",
        )
        assert r.status_code == 200, r.text
        pprof = make_pprof(
            [
                (["leaf", "secrets.decrypt", "main"], 5, {"owner": "top-secret"}),
                (["leaf", "main"], 3, {"owner": "alice"}),
            ],
            time_ns=T0 * 10**9,
        )
        r = ingest_pprof(c, "vault2{}", pprof, T0)
        assert r.status_code == 200, r.text
        folded = function_totals(flamegraph(c, '{service_name="vault"}', T0 - 60, T0 + 60))
        assert folded == {
            "main": 7 * 10**7,
            REDACTED: 5 * 10**7,
            "parse": 4 * 10**7,
            "fine": 2 * 10**7,
        }
        graph = flamegraph(c, '{service_name="vault2"}', T0 - 60, T0 + 60)
        assert function_totals(graph) == {"main": 8, REDACTED: 5, "leaf": 8}
        r = c.post(
            f"{QUERIER}/LabelValues",
            json={"name": "owner", "start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000},
        )
        assert sorted(r.json()["names"]) == [REDACTED, "alice"]
        r = c.post(
            f"{QUERIER}/LabelValues",
            json={"name": "user", "start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000},
        )
        assert r.json()["names"] == [REDACTED]
    srv.stop()
    texts = _stored_texts(srv.data_dir)
    assert any(REDACTED in t for t in texts)
    leaked = [t for t in texts if "secret" in t.lower() or "password" in t.lower()]
    assert leaked == []


def test_redaction_of_otlp_profiles_over_http_and_grpc(redacting_server: RunningServer) -> None:
    from tests.server.otlp.test_otlp_profiles import PERIOD, Builder, grpc_export, http_ok

    srv = redacting_server
    assert srv.otlp_grpc_address is not None
    for service, send in [
        ("otlp-http", lambda b: http_ok(srv.url, b.pb())),
        ("otlp-grpc", lambda b: grpc_export(srv.otlp_grpc_address, b.msg)),
    ]:
        b = Builder()
        p = b.profile(resource={"service.name": service, "db.user": "the-password-owner"})
        leaf = b.location(("read_secret", 12), filename="/srv/app.py")
        main = b.location(("main", 1), filename="/srv/secret_app/main.py")
        p.samples.add(stack_index=b.stack(leaf, main), values=[2])
        send(b)
    with srv.client() as c:
        for service in ("otlp-http", "otlp-grpc"):
            graph = flamegraph(c, f'{{service_name="{service}"}}', T0 - 60, T0 + 60)
            # "main" keeps its name; its file name is redacted (the store check below).
            assert function_totals(graph) == {"main": 2 * PERIOD, REDACTED: 2 * PERIOD}
    srv.stop()
    texts = _stored_texts(srv.data_dir)
    leaked = [t for t in texts if "secret" in t.lower() or "password" in t.lower()]
    assert leaked == []


def test_a_bad_redaction_pattern_stops_the_server_at_startup(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hotspan", "server", "--data-dir", str(tmp_path), "--redact", "("],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--redact" in done.stderr and "not a regular expression" in done.stderr


# -- units ---------------------------------------------------------------------------------------


def test_redactor_leaves_clean_batches_alone_and_merges_what_it_redacts() -> None:
    cpu = ProfileType.parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
    redactor = Redactor(["token"])
    clean = IngestBatch()
    sid = clean.add_series(cpu, normalize({"service_name": "token-svc"}))
    clean.add_sample(sid, 1, clean.add_stack((clean.add_frame(Frame("main")),)), 1)
    assert redactor.batch(clean) is clean  # service_name is never redacted
    batch = IngestBatch()
    for i, owner in enumerate(["TOKEN-a", "token-b"]):
        sid = batch.add_series(cpu, normalize({"service_name": "svc", "owner": owner}))
        fid = batch.add_frame(Frame(f"get_token_{i}", "app.py", 3))
        batch.add_sample(sid, 1, batch.add_stack((batch.add_frame(Frame("main")), fid)), 2)
    out = redactor.batch(batch)
    cols = out.columns()
    # Two series and two stacks that differed only by what was redacted become one of each.
    assert len(set(cols.series_id.tolist())) == 1 and len(set(cols.stack_id.tolist())) == 1
    (info,) = [out.series[s] for s in set(cols.series_id.tolist())]
    assert dict(info.labels) == {"service_name": "svc", "owner": REDACTED}
    (frames,) = {out.stacks[s] for s in cols.stack_id.tolist()}
    assert [out.frames[f] for f in frames] == [Frame("main"), Frame(REDACTED, "app.py", 3)]
    assert int(cols.value.sum()) == 4


def test_instance_registry_is_bounded_per_tenant() -> None:
    reg = InstanceRegistry(max_per_tenant=3)
    for i in range(5):
        reg.record("t", "api", f"i{i}", {}, {"n": i}, now_ns=100 + i)
    reg.record("u", "api", "other", {}, None, now_ns=100)
    assert [i.instance for i in reg.instances("t", "api", 0)] == ["i2", "i3", "i4"]
    reg.record("t", "api", "i2", {}, None, now_ns=200)  # seen again: now the newest
    reg.record("t", "api", "i5", {}, {}, now_ns=201)
    assert [i.instance for i in reg.instances("t", "api", 0)] == ["i2", "i4", "i5"]
    assert reg.instances("t", "api", 0)[0].status == {"n": 2}
    assert [i.instance for i in reg.instances("t", "api", 150)] == ["i2", "i5"]
    assert [i.instance for i in reg.instances("u", "api", 0)] == ["other"]


def test_a_service_name_with_a_slash(module_server: RunningServer) -> None:
    with module_server.client() as c:
        assert put(c, "team/api", {"sample_rate": 20}).status_code == 200
        got = c.get("/api/v1/settings/team%2Fapi")
        assert got.status_code == 200, got.text
        assert got.json()["rules"][0]["settings"] == {"sample_rate": 20}
        assert c.delete("/api/v1/settings/team%2Fapi", params={"selector": ""}).status_code == 200
