"""GET /metrics: recording rules (as Pyroscope has them) over real pushes and a real agent,
and the server's own counters, parsed with prometheus_client's parser."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Dict, List, Optional

import grpc
import httpx
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from hotspan.server.otlp.grpc_receiver import TRACE_SERVICE
from tests.conftest import RunningServer, running_server
from tests.helpers import (
    CPU,
    flamegraph,
    function_totals_once,
    ingest_pprof,
    make_pprof,
    run_programs,
    traced_program,
)

RULES = "/api/v1/recording-rules"
CONNECT = "/settings.v1.RecordingRulesService"
T0 = 1_700_000_000


def scrape(client: httpx.Client, headers: Optional[dict] = None, **params: str) -> Dict:
    """Sample name -> [(labels, value)], from the parsed exposition."""
    r = client.get("/metrics", params=params, headers=headers or {})
    assert r.status_code == 200, r.text
    out: Dict[str, List] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(samples: Dict, name: str, **labels: str) -> Optional[float]:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    hits = [v for lbls, v in samples.get(name, []) if labels.items() <= lbls.items()]
    assert len(hits) <= 1, (name, labels, samples.get(name))
    return hits[0] if hits else None


def pprof(samples: list, at: int = T0, **kw) -> bytes:  # type: ignore[no-untyped-def]
    return make_pprof(samples, time_ns=at * 10**9, **kw)


def put_rule(client: httpx.Client, rule_id: str, body: dict, **kw) -> dict:  # type: ignore[no-untyped-def]
    r = client.put(f"{RULES}/{rule_id}", json=body, **kw)
    assert r.status_code == 200, r.text
    return r.json()


def connect(client: httpx.Client, method: str, body: dict, **kw) -> httpx.Response:  # type: ignore[no-untyped-def]
    return client.post(f"{CONNECT}/{method}", json=body, **kw)


# Leaf first, as make_pprof takes them.
SLOW = ["shop.slow_query", "shop.handler", "main"]
FAST = ["shop.render", "shop.handler", "main"]
NESTED = ["shop.slow_query", "shop.render", "shop.handler", "main"]


def test_rules_record_pushed_profiles_per_group_and_function(module_server: RunningServer) -> None:
    with module_server.client() as c:
        put_rule(
            c,
            "shopcpu",
            {
                "metricName": "profiles_recorded_shop_cpu",
                "selector": '{service_name="shop"}',
                "groupBy": ["version"],
                "externalLabels": {"team": "payments"},
            },
        )
        # Pyroscope's Connect form: the profile type as a matcher, the function as a filter,
        # its name exact (as Drilldown sends a flame graph node's).
        r = connect(
            c,
            "UpsertRecordingRule",
            {
                "metricName": "profiles_recorded_shop_slow_total",
                "matchers": [f'{{__profile_type__="{CPU}", service_name="shop"}}'],
                "stacktraceFilter": {"functionName": {"functionName": "shop.slow_query"}},
            },
        )
        assert r.status_code == 200, r.text
        slow_rule = r.json()["rule"]
        assert slow_rule["stacktraceFilter"]["functionName"]["functionName"] == "shop.slow_query"
        # Names that are no regular expressions (a Go method, a Java inner class) are exact
        # names there too.
        for i, name in enumerate(("main.(*Server).Handle", "com.shop.Cart$Item.total", "x[1]")):
            r = connect(
                c,
                "UpsertRecordingRule",
                {
                    "id": f"exact{i}",
                    "metricName": f"profiles_recorded_exact_{i}",
                    "matchers": [f'{{__profile_type__="{CPU}", service_name="gosvc"}}'],
                    "stacktraceFilter": {"functionName": {"functionName": name}},
                },
            )
            assert r.status_code == 200, (name, r.text)
            got = r.json()["rule"]["stacktraceFilter"]["functionName"]["functionName"]
            assert got == name
        assert re.fullmatch(r"[a-zA-Z]{10}", slow_rule["id"]) and slow_rule["generation"] == "1"
        assert slow_rule["profileType"] == CPU
        # The same metric in another tenant: a series of its own, told apart by `tenant`.
        other = {"X-Scope-OrgID": "other"}
        put_rule(c, "all", {"metricName": "profiles_recorded_shop_cpu"}, headers=other)

        pushes = [
            ("shop{version=1.0}", [(SLOW, 700, {}), (FAST, 300, {}), (NESTED, 50, {})]),
            ("shop{version=1.0}", [(SLOW, 1000, {})]),
            ("shop{version=1.1}", [(FAST, 2000, {}), (NESTED, 4000, {})]),
            ("noise{version=1.0}", [(SLOW, 99999, {})]),
        ]
        for i, (name, samples) in enumerate(pushes):
            r = ingest_pprof(c, name, pprof(samples, T0 + 10 * i), T0 + 10 * i)
            assert r.status_code == 200, r.text
        r = ingest_pprof(c, "shop", pprof([(SLOW, 123, {})]), T0, headers=other)
        assert r.status_code == 200, r.text
        go_stacks = [
            (["main.(*Server).Handle", "main"], 77, {}),
            (["main.(xServer)", "main"], 5, {}),
        ]
        assert ingest_pprof(c, "gosvc", pprof(go_stacks), T0).status_code == 200

        m = scrape(c)
        shop = "profiles_recorded_shop_cpu"
        mine = {"tenant": "anonymous", "profiles_rule_id": "shopcpu", "team": "payments"}
        assert value(m, shop, version="1.0", **mine) == 700 + 300 + 50 + 1000
        assert value(m, shop, version="1.1", **mine) == 2000 + 4000
        assert value(m, shop, tenant="other") == 123
        # Stacks holding a shop.slow_* frame count once each (NESTED as well), noise not.
        slow = "profiles_recorded_shop_slow_total"
        assert value(m, slow, profiles_rule_id=slow_rule["id"]) == 700 + 50 + 1000 + 4000
        assert value(m, "profiles_recorded_exact_0", profiles_rule_id="exact0") == 77
        # The same as the server's own answer for those stacks.
        graph = flamegraph(c, '{service_name="shop"}', T0 - 60, T0 + 3600)
        assert function_totals_once(graph)["shop.slow_query"] == 700 + 50 + 1000 + 4000

        only_other = scrape(c, tenant="other")
        assert [lbls["tenant"] for lbls, _ in only_other[shop]] == ["other"]
        assert slow not in only_other

        # A deleted rule's series go; the others stay.
        r = connect(c, "DeleteRecordingRule", {"id": slow_rule["id"]})
        assert r.status_code == 200, r.text
        m = scrape(c)
        assert slow not in m
        assert value(m, shop, version="1.1", **mine) == 6000


def test_rules_follow_a_real_agent(module_server: RunningServer, tmp_path: Path) -> None:
    service = "metrics-agent"
    with module_server.client() as c:
        put_rule(
            c,
            "agentcpu",
            {
                "metricName": "profiles_recorded_agent_cpu",
                "selector": f'{{service_name="{service}"}}',
            },
        )
        put_rule(
            c,
            "agentslow",
            {
                "metricName": "profiles_recorded_agent_slow",
                "selector": f'{{service_name="{service}"}}',
                "functionName": ".*slow_step",
                "groupBy": ["service_name"],
            },
        )
        body = """
        def slow_step():
            burn(0.6)

        def fast_step():
            burn(0.2)

        for _ in range(3):
            slow_step()
            fast_step()
        """
        run_programs(traced_program(service, body), tmp_path, [module_server.url])
        m = scrape(c)
        now = int(time.time())
        graph = flamegraph(c, f'{{service_name="{service}"}}', now - 3600, now + 3600)
        total = int(graph["total"])
        slow = sum(v for k, v in function_totals_once(graph).items() if k.endswith("slow_step"))
        assert total > 0 and 0 < slow < total
        assert value(m, "profiles_recorded_agent_cpu", profiles_rule_id="agentcpu") == total
        got = value(m, "profiles_recorded_agent_slow", service_name=service)
        assert got == slow
        # slow_step burns three fourths of what the loop burns; start-up takes a share too.
        assert slow > 0.4 * total


def test_operational_metrics(tmp_path: Path) -> None:
    args = ["--ingest-token", "in", "--query-token", "q", "--max-body-bytes", "4000"]
    with running_server(tmp_path / "data", args) as srv, srv.client() as c:
        ingest = {"Authorization": "Bearer in"}
        query = {"Authorization": "Bearer q"}
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers=ingest).status_code == 401

        good = pprof([(SLOW, 500, {})])
        garbage = b"this is no profile"
        assert ingest_pprof(c, "shop", good, T0, headers=ingest).status_code == 200
        assert ingest_pprof(c, "shop", good, T0).status_code == 401
        assert ingest_pprof(c, "shop", garbage, T0, headers=ingest).status_code == 400
        big = pprof([([f"f{i}" for i in range(400)], 1, {})], compress=False)
        assert len(big) > 4000
        assert ingest_pprof(c, "shop", big, T0, headers=ingest).status_code == 413
        r = c.post("/v1/traces", content=b"{}", headers={**ingest, "Content-Type": "text/csv"})
        assert r.status_code == 415
        assert flamegraph(c, "{}", T0 - 60, T0 + 60, headers=query)["total"] == "500"
        # OTLP/gRPC, beside the HTTP routes: an export without the ingest token.
        assert srv.otlp_grpc_address
        with grpc.insecure_channel(srv.otlp_grpc_address) as channel:
            export = channel.unary_unary(f"/{TRACE_SERVICE}/Export")
            with pytest.raises(grpc.RpcError) as refused:
                export(b"", timeout=30)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            export(b"", timeout=30, metadata=[("authorization", "Bearer in")])

        m = scrape(c, headers=query)
        requests = "hotspan_ingest_requests_total"
        assert value(m, requests, endpoint="ingest") == 4
        assert value(m, requests, endpoint="otlp_traces") == 1
        assert value(m, requests, endpoint="otlp_grpc_traces") == 2
        # Bytes the server read: the refused-by-token and too-large bodies never were.
        read = len(good) + len(garbage)
        assert value(m, "hotspan_ingest_received_bytes_total", endpoint="ingest") == read
        rejected = "hotspan_ingest_rejected_requests_total"
        for endpoint, reason in [
            ("ingest", "unauthenticated"),
            ("ingest", "invalid"),
            ("ingest", "too_large"),
            ("otlp_traces", "unsupported_media_type"),
            ("otlp_grpc_traces", "unauthenticated"),
        ]:
            assert value(m, rejected, endpoint=endpoint, reason=reason) == 1, reason
        assert value(m, "hotspan_ingested_samples_total") == 1
        route = "/querier.v1.QuerierService/SelectMergeStacktraces"
        assert value(m, "hotspan_query_duration_seconds_count", route=route) == 1
        assert value(m, "hotspan_query_duration_seconds_bucket", route=route, le="+Inf") == 1
        assert value(m, "hotspan_store_size_bytes") > 0
        # OpenMetrics for a scraper that asks for it.
        r = c.get("/metrics", headers={**query, "Accept": "application/openmetrics-text"})
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        assert r.text.endswith("# EOF\n")


BAD_REST = [
    ({}, "metricName is required"),
    ({"metricName": "cpu_usage"}, "profiles_recorded_"),
    ({"metricName": "profiles_recorded_x", "selector": '{a="b"'}, "not a label selector"),
    ({"metricName": "profiles_recorded_x", "functionName": "(unclosed"}, "functionName"),
    ({"metricName": "profiles_recorded_x", "groupBy": ["tenant"]}, "reserved"),
    ({"metricName": "profiles_recorded_x", "groupBy": ["k8s.pod"]}, "Prometheus label name"),
    ({"metricName": "profiles_recorded_x", "groupBy": "version"}, "groupBy must be a list"),
    ({"metricName": "profiles_recorded_x", "externalLabels": {"a-b": "1"}}, "'a-b'"),
    ({"metricName": "profiles_recorded_x", "profileType": "cpu"}, "profileType"),
    ({"metricName": "profiles_recorded_x", "metric": "x"}, "unknown field(s) ['metric']"),
    (
        {
            "metricName": "profiles_recorded_x",
            "profileType": CPU,
            "selector": '{__profile_type__="a:b:c:d:e"}',
        },
        "differs",
    ),
    ({"metricName": "profiles_recorded_x", "generation": -1}, "generation"),
    ({"metricName": "profiles_recorded_x", "generation": 1.5}, "generation"),
    ({"metricName": "profiles_recorded_x", "generation": "1e3"}, "generation"),
    ({"metricName": "profiles_recorded_x", "generation": True}, "generation"),
    ({"metricName": "profiles_recorded_x", "generation": 2**64}, "generation"),
    ({"metricName": "profiles_recorded_x", "matchers": [None]}, "matchers[0] must be a string"),
    ({"metricName": "profiles_recorded_x", "matchers": [""]}, "matchers[0] is empty"),
    ({"metricName": "profiles_recorded_x", "groupBy": [None]}, "groupBy[0] must be a string"),
    ({"metricName": "profiles_recorded_x", "profileType": ""}, "profileType is empty"),
    ({"metricName": "profiles_recorded_x", "functionName": "a" * 501}, "functionName"),
    ({"metricName": "profiles_recorded_x_count"}, "'_count'"),
    ({"metricName": "profiles_recorded_x_created_total"}, "'_created'"),
    ({"metricName": "profiles_recorded_x_bucket"}, "'_bucket'"),
    ({"metricName": "profiles_recorded_x_sum"}, "'_sum'"),
    ({"metricName": "profiles_recorded_x_info"}, "'_info'"),
    ({"metricName": "profiles_recorded_x_total_total"}, "'_total'"),
    ({"metricName": "profiles_recorded_"}, "needs a name"),
]


@pytest.mark.parametrize("body,reason", BAD_REST)
def test_bad_rest_rules_get_400(module_server: RunningServer, body: dict, reason: str) -> None:
    with module_server.client() as c:
        r = c.put(f"{RULES}/bad", json=body)
        assert r.status_code == 400, r.text
        assert reason in r.json()["error"]
        assert c.get(f"{RULES}/bad").status_code == 404


def test_overflowing_generation_gets_400(module_server: RunningServer) -> None:
    # Python's JSON reads 1e400 as infinity, which int() refuses with OverflowError: the
    # server's JSON reader refuses the number itself.
    with module_server.client() as c:
        for raw in (
            '{"metricName": "profiles_recorded_x", "generation": 1e400}',
            '{"metricName": "profiles_recorded_x", "generation": -1e400}',
        ):
            r = c.put(f"{RULES}/bad", content=raw, headers={"Content-Type": "application/json"})
            assert r.status_code == 400, r.text
            assert "1e400 is out of range" in r.json()["error"]
        body = {"metricName": "profiles_recorded_x", "matchers": [f'{{__profile_type__="{CPU}"}}']}
        raw = json.dumps({**body, "generation": 7}).replace('": 7', '": 1e400')
        r = c.post(
            f"{CONNECT}/UpsertRecordingRule",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "invalid_argument"
        assert "1e400 is out of range" in r.json()["message"]
        assert c.get(f"{RULES}/bad").status_code == 404


def test_rule_api_errors(module_server: RunningServer) -> None:
    with module_server.client() as c:
        r = c.put(
            f"{RULES}/bad", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 400 and "not JSON" in r.json()["error"]
        r = c.put(f"{RULES}/no%20spaces", json={"metricName": "profiles_recorded_x"})
        assert r.status_code == 400 and "id" in r.json()["error"]
        assert c.delete(f"{RULES}/missing").status_code == 404

        # Generations guard concurrent edits, as in Pyroscope.
        first = put_rule(c, "gen", {"metricName": "profiles_recorded_gen"})
        assert first["generation"] == 1
        body = {"metricName": "profiles_recorded_gen", "generation": 7}
        r = c.put(f"{RULES}/gen", json=body)
        assert r.status_code == 409 and "generation 1" in r.json()["error"]
        assert put_rule(c, "gen", {**body, "generation": 1})["generation"] == 2
        matchers = [f'{{__profile_type__="{CPU}"}}']
        r = connect(
            c,
            "UpsertRecordingRule",
            {"id": "gen", "metricName": "profiles_recorded_gen", "matchers": matchers},
        )
        assert r.status_code == 409 and r.json()["code"] == "already_exists"
        r = connect(
            c,
            "UpsertRecordingRule",
            {
                "id": "gen",
                "metricName": "profiles_recorded_gen",
                "matchers": matchers,
                "generation": "2",
            },
        )
        assert r.status_code == 200 and r.json()["rule"]["generation"] == "3"
        r = connect(c, "GetRecordingRule", {"id": "gen"})
        assert r.status_code == 200 and r.json()["rule"]["matchers"] == matchers
        listed = connect(c, "ListRecordingRules", {}).json()["rules"]
        assert "gen" in [rule["id"] for rule in listed]

        for body, reason in [
            (
                {"metricName": "profiles_recorded_x", "matchers": ['{service_name="a"}']},
                "__profile_type__",
            ),
            (
                {
                    "metricName": "profiles_recorded_x",
                    "matchers": [f'{{__profile_type__=~"{CPU}"}}'],
                },
                "must use =",
            ),
            (
                {
                    "metricName": "profiles_recorded_x",
                    "matchers": matchers,
                    "stacktraceFilter": {
                        "functionName": {"functionName": "a", "metricType": "SELF"}
                    },
                },
                "metricType",
            ),
        ]:
            r = connect(c, "UpsertRecordingRule", body)
            assert r.status_code == 400, r.text
            assert r.json()["code"] == "invalid_argument" and reason in r.json()["message"]
        r = connect(c, "GetRecordingRule", {})
        assert r.status_code == 400 and "id is required" in r.json()["message"]
        for method in ("GetRecordingRule", "DeleteRecordingRule"):
            r = connect(c, method, {"id": "missing"})
            assert r.status_code == 404 and r.json()["code"] == "not_found"
        r = c.post(
            f"{CONNECT}/ListRecordingRules",
            content=b"",
            headers={"Content-Type": "application/proto"},
        )
        assert r.status_code == 415


def test_rules_outlive_a_restart_and_counters_start_over(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rule = {"metricName": "profiles_recorded_kept", "selector": '{service_name="kept"}'}
    with running_server(data) as srv, srv.client() as c:
        put_rule(c, "kept", rule)
        assert ingest_pprof(c, "kept", pprof([(SLOW, 40, {})]), T0).status_code == 200
        assert value(scrape(c), "profiles_recorded_kept") == 40
    with running_server(data) as srv, srv.client() as c:
        assert c.get(f"{RULES}/kept").json()["generation"] == 1
        # Counted from the restart on: a counter reset, which rate() takes in its stride.
        assert value(scrape(c), "profiles_recorded_kept") is None
        assert ingest_pprof(c, "kept", pprof([(SLOW, 2, {})]), T0).status_code == 200
        assert value(scrape(c), "profiles_recorded_kept") == 2


def test_openmetrics_output_parses_with_rules_of_two_tenants(module_server: RunningServer) -> None:
    other = {"X-Scope-OrgID": "om-other"}
    with module_server.client() as c:
        put_rule(c, "om", {"metricName": "profiles_recorded_om", "selector": '{service_name="om"}'})
        put_rule(
            c,
            "omc",
            {"metricName": "profiles_recorded_omc_total", "selector": '{service_name="om"}'},
        )
        # The same names in another tenant: the same families.
        put_rule(c, "om", {"metricName": "profiles_recorded_om"}, headers=other)
        put_rule(c, "omc", {"metricName": "profiles_recorded_omc_total"}, headers=other)
        # x beside x_total would be two types of one OpenMetrics family: refused, in the
        # rule's tenant and in another, and as a replacement of an existing rule too.
        for rule_id, name, headers in [
            ("om2", "profiles_recorded_om_total", {}),
            ("om2", "profiles_recorded_om_total", {"X-Scope-OrgID": "om-third"}),
            ("omc", "profiles_recorded_omc", other),
        ]:
            r = c.put(f"{RULES}/{rule_id}", json={"metricName": name}, headers=headers)
            assert r.status_code == 400, r.text
            assert "clashes" in r.json()["error"]
            if headers.get("X-Scope-OrgID") == "om-third":  # another tenant's: not named
                assert "of another tenant" in r.json()["error"], r.text
        r = connect(
            c,
            "UpsertRecordingRule",
            {
                "metricName": "profiles_recorded_om_total",
                "matchers": [f'{{__profile_type__="{CPU}"}}'],
            },
        )
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
        assert c.get(f"{RULES}/om2").status_code == 404

        assert ingest_pprof(c, "om", pprof([(SLOW, 11, {})]), T0).status_code == 200
        assert ingest_pprof(c, "om", pprof([(FAST, 5, {})]), T0, headers=other).status_code == 200
        r = c.get("/metrics", headers={"Accept": "application/openmetrics-text"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/openmetrics-text")
        families = {f.name: f for f in openmetrics_families(r.text)}
        om, omc = families["profiles_recorded_om"], families["profiles_recorded_omc"]
        assert om.type == "unknown" and omc.type == "counter"
        by_tenant = {s.labels["tenant"]: s.value for s in om.samples}
        assert by_tenant == {"anonymous": 11, "om-other": 5}
        assert {s.name for s in omc.samples} == {"profiles_recorded_omc_total"}
        assert {s.labels["tenant"]: s.value for s in omc.samples} == {
            "anonymous": 11,
            "om-other": 5,
        }
        assert families["hotspan_recording_rule_refresh_failures"].samples[0].value == 0
        # The classic text format says the same.
        m = scrape(c)
        assert value(m, "profiles_recorded_omc_total", tenant="om-other") == 5


def test_metrics_with_a_tenant_header_show_only_that_tenant(module_server: RunningServer) -> None:
    mine = {"X-Scope-OrgID": "scoped-a"}
    theirs = {"X-Scope-OrgID": "scoped-b"}
    with module_server.client() as c:
        for headers in (mine, theirs):
            put_rule(c, "scoped", {"metricName": "profiles_recorded_scoped"}, headers=headers)
            r = ingest_pprof(c, "scoped", pprof([(SLOW, 7, {})]), T0, headers=headers)
            assert r.status_code == 200, r.text
        m = scrape(c, headers=mine)
        assert [lbls["tenant"] for lbls, _ in m["profiles_recorded_scoped"]] == ["scoped-a"]
        assert value(m, "profiles_recorded_scoped") == 7
        assert [lbls["tenant"] for lbls, _ in m["hotspan_recording_rules"]] == ["scoped-a"]
        # The header decides; ?tenant= may repeat it, not name another.
        assert value(scrape(c, headers=mine, tenant="scoped-a"), "profiles_recorded_scoped") == 7
        r = c.get("/metrics", params={"tenant": "scoped-b"}, headers=mine)
        assert r.status_code == 400 and "X-Scope-OrgID" in r.text
        # Without a header (no query tokens here: an operator), every tenant's.
        every = scrape(c)
        tenants = {lbls["tenant"] for lbls, _ in every["profiles_recorded_scoped"]}
        assert tenants == {"scoped-a", "scoped-b"}
