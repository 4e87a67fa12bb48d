"""The ingest and query APIs over real HTTP against a real server process."""

from __future__ import annotations

import base64
import gzip
import time

from hotspan.formats.proto import profile_pb2, push_pb2, querier_pb2, types_pb2
from tests.conftest import start_server
from tests.helpers import (
    CPU,
    QUERIER,
    flamegraph,
    function_totals,
    ingest_pprof,
    make_pprof,
    self_totals,
)

T0 = 1_700_000_000


def test_folded_ingest_and_render(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        r = c.post(
            "/ingest",
            params={
                "name": "shop.cpu{env=prod}",
                "from": str(T0),
                "until": str(T0 + 10),
                "sampleRate": "100",
                "spyName": "pyspy",
            },
            content=b"main;checkout;tax 30\nmain;checkout 10\nmain;idle 5\n",
        )
        assert r.status_code == 200, r.text
        graph = flamegraph(c, '{service_name="shop"}', T0 - 60, T0 + 60)
        # 100 Hz: one sample is 10 ms of CPU.
        assert function_totals(graph) == {
            "main": 45 * 10**7,
            "checkout": 40 * 10**7,
            "tax": 30 * 10**7,
            "idle": 5 * 10**7,
        }
        assert self_totals(graph)["checkout"] == 10 * 10**7
        r = c.get(
            "/pyroscope/render",
            params={"query": 'shop.cpu{env="prod"}', "from": str(T0 - 60), "until": str(T0 + 60)},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["flamebearer"]["numTicks"] == 45 * 10**7
        assert "tax" in body["flamebearer"]["names"]
        assert sum(body["timeline"]["samples"]) == 45 * 10**7
        # Pyroscope's timeline: 15 s steps over two minutes, from a whole step, through the
        # step the range ends in.
        timeline = body["timeline"]
        assert timeline["durationDelta"] == 15
        assert timeline["startTime"] == (T0 - 60) // 15 * 15
        assert len(timeline["samples"]) == (-(-(T0 + 60) // 15) * 15 - (T0 - 60) // 15 * 15) // 15
        week = c.get(
            "/pyroscope/render",
            params={
                "query": 'shop.cpu{env="prod"}',
                "from": str(T0 - 7 * 86400),
                "until": str(T0 + 60),
            },
        ).json()["timeline"]
        assert week["durationDelta"] == 300 and sum(week["samples"]) == 45 * 10**7
        # The sample of the step the profile (at T0) falls in.
        for tl in (timeline, week):
            at = [i for i, v in enumerate(tl["samples"]) if v]
            assert at == [(T0 - tl["startTime"]) // tl["durationDelta"]], tl
        # A profile on a step's first second, in a range that starts there: the first sample.
        edge = T0 + 10  # a multiple of 15
        r = c.post(
            "/ingest",
            params={
                "name": "edge.cpu",
                "from": str(edge),
                "until": str(edge + 10),
                "spyName": "pyspy",
            },
            content=b"main 7\n",
        )
        assert r.status_code == 200, r.text
        starting = c.get(
            "/pyroscope/render",
            params={"query": "edge.cpu{}", "from": str(edge), "until": str(edge + 600)},
        ).json()["timeline"]
        assert (starting["startTime"], starting["durationDelta"]) == (edge, 15)
        assert starting["samples"][0] == 7 * 10**7 and sum(starting["samples"]) == 7 * 10**7
        r = c.get(
            "/pyroscope/label-values",
            params={"label": "env", "from": str(T0 - 60), "until": str(T0 + 60)},
        )
        assert r.json() == ["prod"]
        r = c.post(
            f"{QUERIER}/LabelValues",
            json={"name": "pyroscope_spy", "start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000},
        )
        assert r.json()["names"] == ["pyspy"]
        # The same lines gzipped without a Content-Encoding, as pprof may come.
        r = c.post(
            "/ingest",
            params={"name": "zipped.cpu", "from": str(T0), "until": str(T0 + 10)},
            content=gzip.compress(b"main;checkout;tax 30\nmain;idle 5\n"),
        )
        assert r.status_code == 200, r.text
        graph = flamegraph(c, '{service_name="zipped"}', T0 - 60, T0 + 60)
        assert function_totals(graph)["tax"] == 30 * 10**7


def test_every_sample_type_is_a_profile_type_and_spans_stay_on_samples(server) -> None:  # type: ignore[no-untyped-def]
    p = profile_pb2.Profile()
    strings = [
        "",
        "alloc_objects",
        "count",
        "alloc_space",
        "bytes",
        "space",
        "main",
        "alloc",
        "span_id",
        "00000000000000a1",
        "region",
        "eu",
        "trace_id",
        "0af7651916cd43dd8448eb211c80319c",
    ]
    p.string_table.extend(s.encode() for s in strings)
    p.sample_type.add(type=1, unit=2)
    p.sample_type.add(type=3, unit=4)
    p.period_type.type, p.period_type.unit = 5, 4
    p.time_nanos = T0 * 10**9
    p.function.add(id=1, name=6)
    p.function.add(id=2, name=7)
    p.location.add(id=1).line.add(function_id=1)
    p.location.add(id=2).line.add(function_id=2)
    s = p.sample.add(location_id=[2, 1], value=[3, 300])
    s.label.add(key=8, str=9)
    s.label.add(key=12, str=13)
    s = p.sample.add(location_id=[1], value=[1, 100])
    s.label.add(key=10, str=11)
    with server.client() as c:
        r = ingest_pprof(c, "heapy{}", gzip.compress(p.SerializeToString()), T0)
        assert r.status_code == 200, r.text
        r = c.post(
            f"{QUERIER}/ProfileTypes", json={"start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000}
        )
        ids = sorted(t["ID"] for t in r.json()["profileTypes"])
        assert ids == [
            "memory:alloc_objects:count:space:bytes",
            "memory:alloc_space:bytes:space:bytes",
        ]
        r = c.post(
            f"{QUERIER}/LabelNames", json={"start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000}
        )
        names = r.json()["names"]
        assert "region" in names and "service_name" in names
        assert "span_id" not in names and "trace_id" not in names
        r = c.post(
            f"{QUERIER}/Series",
            json={
                "matchers": ['{service_name="heapy"}'],
                "start": (T0 - 60) * 1000,
                "end": (T0 + 60) * 1000,
            },
        )
        # Two sample types x two label sets (with and without region): four series, no span.
        assert len(r.json()["labelsSet"]) == 4
        space = "memory:alloc_space:bytes:space:bytes"
        assert function_totals(flamegraph(c, "{}", T0 - 60, T0 + 60, space))["main"] == 400
        r = c.post(
            f"{QUERIER}/SelectMergeSpanProfile",
            json={
                "profileTypeID": space,
                "labelSelector": "{}",
                "spanSelector": ["00000000000000a1"],
                "start": (T0 - 60) * 1000,
                "end": (T0 + 60) * 1000,
            },
        )
        assert r.status_code == 200, r.text
        assert function_totals(r.json()["flamegraph"]) == {"main": 300, "alloc": 300}
        traced = flamegraph(
            c, "{}", T0 - 60, T0 + 60, space, traceIdSelector=["0af7651916cd43dd8448eb211c80319c"]
        )
        assert function_totals(traced) == {"main": 300, "alloc": 300}

        # The timeline of a trace or a span sums what its flame graph shows.
        def series_total(**selectors: list) -> float:
            r = c.post(
                f"{QUERIER}/SelectSeries",
                json={
                    "profileTypeID": space,
                    "labelSelector": "{}",
                    "start": (T0 - 60) * 1000,
                    "end": (T0 + 60) * 1000,
                    "step": 10,
                    **selectors,
                },
            )
            assert r.status_code == 200, r.text
            return sum(p.get("value", 0) for s in r.json().get("series", []) for p in s["points"])

        assert series_total() == 400
        assert series_total(traceIdSelector=["0af7651916cd43dd8448eb211c80319c"]) == 300
        assert series_total(spanSelector=["00000000000000a1"]) == 300
        assert series_total(traceIdSelector=["0" * 32]) == 0
        r = c.post(
            f"{QUERIER}/SelectSeries",
            json={
                "profileTypeID": space,
                "labelSelector": "{}",
                "step": 10,
                "traceIdSelector": ["nothex"],
            },
        )
        assert r.status_code == 400 and "not 32 hex digits" in r.text


def test_connect_proto_codec_select_series_and_diff(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        for i, hot in enumerate(["old_code", "old_code", "new_code"]):
            body = make_pprof(
                [(["work", hot, "main"], 70, {}), (["main"], 30, {})], time_ns=(T0 + 10 * i) * 10**9
            )
            assert (
                ingest_pprof(
                    c, f"svc{{version={'v1' if i < 2 else 'v2'}}}", body, T0 + 10 * i
                ).status_code
                == 200
            )
        req = querier_pb2.SelectSeriesRequest(
            profile_typeID=CPU,
            label_selector='{service_name="svc"}',
            start=T0 * 1000,
            end=(T0 + 30) * 1000,
            step=10,
            group_by=["version"],
        )
        r = c.post(
            f"{QUERIER}/SelectSeries",
            content=req.SerializeToString(),
            headers={"content-type": "application/proto"},
        )
        assert r.status_code == 200 and r.headers["content-type"] == "application/proto"
        resp = querier_pb2.SelectSeriesResponse.FromString(r.content)
        # AVERAGE divides by the number of profiles (uploads) in the step, as Pyroscope does.
        avg = req.__class__()
        avg.CopyFrom(req)
        avg.start, avg.step, avg.aggregation = (T0 - 1) * 1000, 30, 1
        r2 = c.post(
            f"{QUERIER}/SelectSeries",
            content=avg.SerializeToString(),
            headers={"content-type": "application/proto"},
        )
        averaged = querier_pb2.SelectSeriesResponse.FromString(r2.content)
        assert {s.labels[0].value: [p.value for p in s.points] for s in averaged.series} == {
            "v1": [100.0],
            "v2": [100.0],
        }
        by_version = {
            s.labels[0].value: [(p.timestamp, p.value) for p in s.points] for s in resp.series
        }
        assert by_version == {
            "v1": [(T0 * 1000, 100.0), ((T0 + 10) * 1000, 100.0)],
            "v2": [((T0 + 20) * 1000, 100.0)],
        }
        diff = querier_pb2.DiffRequest(
            left=querier_pb2.SelectMergeStacktracesRequest(
                profile_typeID=CPU,
                label_selector='{version="v1"}',
                start=T0 * 1000,
                end=(T0 + 30) * 1000,
            ),
            right=querier_pb2.SelectMergeStacktracesRequest(
                profile_typeID=CPU,
                label_selector='{version="v2"}',
                start=T0 * 1000,
                end=(T0 + 30) * 1000,
            ),
        )
        r = c.post(
            f"{QUERIER}/Diff",
            content=gzip.compress(diff.SerializeToString()),
            headers={"content-type": "application/proto", "content-encoding": "gzip"},
        )
        assert r.status_code == 200, r.text
        graph = querier_pb2.DiffResponse.FromString(r.content).flamegraph
        assert (graph.leftTicks, graph.rightTicks) == (200, 100)
        nodes = {}
        for level in graph.levels[1:]:
            v = list(level.values)
            for i in range(0, len(v), 7):
                nodes[graph.names[v[i + 6]]] = (v[i + 1], v[i + 4])
        assert nodes["old_code"] == (140, 0) and nodes["new_code"] == (0, 70)
        r = c.get(
            "/pyroscope/render-diff",
            params={
                "leftQuery": 'svc.cpu{version="v1"}',
                "rightQuery": 'svc.cpu{version="v2"}',
                "leftFrom": str(T0),
                "leftUntil": str(T0 + 30),
                "rightFrom": str(T0),
                "rightUntil": str(T0 + 30),
            },
        )
        assert r.status_code == 200, r.text
        assert (r.json()["leftTicks"], r.json()["rightTicks"]) == (200, 100)
        assert r.json()["metadata"]["format"] == "double"


def test_select_merge_profile_returns_pprof(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        body = make_pprof(
            [(["leafy", "middle", "main"], 500, {}), (["main"], 20, {})], time_ns=T0 * 10**9
        )
        assert ingest_pprof(c, "pp{}", body, T0).status_code == 200
        req = querier_pb2.SelectMergeProfileRequest(
            profile_typeID=CPU, label_selector="{}", start=(T0 - 10) * 1000, end=(T0 + 10) * 1000
        )
        r = c.post(
            f"{QUERIER}/SelectMergeProfile",
            content=req.SerializeToString(),
            headers={"content-type": "application/proto"},
        )
        assert r.status_code == 200
        prof = profile_pb2.Profile.FromString(r.content)
        strings = [s.decode() for s in prof.string_table]
        assert strings[prof.sample_type[0].type] == "cpu"
        assert sum(s.value[0] for s in prof.sample) == 520
        func_names = {f.id: strings[f.name] for f in prof.function}
        loc_fn = {loc.id: func_names[loc.line[0].function_id] for loc in prof.location}
        leafy = [s for s in prof.sample if loc_fn[s.location_id[0]] == "leafy"]
        assert [loc_fn[i] for i in leafy[0].location_id] == ["leafy", "middle", "main"]


def test_push_api_json_and_proto(server) -> None:  # type: ignore[no-untyped-def]
    raw = make_pprof([(["pushed_fn", "main"], 1000, {})], time_ns=T0 * 10**9)
    req = push_pb2.PushRequest()
    series = req.series.add()
    series.labels.extend(
        [
            types_pb2.LabelPair(name="__name__", value="process_cpu"),
            types_pb2.LabelPair(name="service_name", value="pusher"),
        ]
    )
    series.samples.add(raw_profile=raw, ID="a")
    with server.client() as c:
        r = c.post(
            "/push.v1.PusherService/Push",
            content=gzip.compress(req.SerializeToString()),
            headers={"content-type": "application/proto", "content-encoding": "gzip"},
        )
        assert r.status_code == 200, r.text
        as_json = {
            "series": [
                {
                    "labels": [{"name": "service_name", "value": "pusher"}],
                    "samples": [{"rawProfile": base64.b64encode(raw).decode()}],
                }
            ]
        }
        r = c.post("/push.v1.PusherService/Push", json=as_json)
        assert r.status_code == 200, r.text
        graph = flamegraph(c, '{service_name="pusher"}', T0 - 10, T0 + 10)
        assert function_totals(graph)["pushed_fn"] == 2000


def test_tenants_never_see_each_other(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        body = make_pprof([(["tenant_a_secret", "main"], 100, {})], time_ns=T0 * 10**9)
        assert (
            ingest_pprof(c, "app{}", body, T0, headers={"X-Scope-OrgID": "team-a"}).status_code
            == 200
        )
        seen_a = flamegraph(c, "{}", T0 - 10, T0 + 10, headers={"X-Scope-OrgID": "team-a"})
        assert "tenant_a_secret" in seen_a["names"]
        for headers in ({"X-Scope-OrgID": "team-b"}, {}):
            graph = flamegraph(c, "{}", T0 - 10, T0 + 10, headers=headers)
            assert "tenant_a_secret" not in graph.get("names", [])
            r = c.post(
                f"{QUERIER}/LabelValues",
                json={"name": "service_name", "start": (T0 - 10) * 1000, "end": (T0 + 10) * 1000},
                headers=headers,
            )
            assert r.json().get("names", []) == []
        r = c.post(f"{QUERIER}/ProfileTypes", json={}, headers={"X-Scope-OrgID": "bad tenant/.."})
        assert r.status_code == 400 and "tenant" in r.json()["message"]


def test_tokens_guard_ingest_and_query(tmp_path) -> None:  # type: ignore[no-untyped-def]
    srv = start_server(
        tmp_path / "data", ["--ingest-token", "push-secret", "--query-token", "read-secret"]
    )
    try:
        with srv.client() as c:
            body = make_pprof([(["guarded", "main"], 5, {})], time_ns=T0 * 10**9)
            r = ingest_pprof(c, "g{}", body, T0)
            assert r.status_code == 401 and "token" in r.text
            r = ingest_pprof(c, "g{}", body, T0, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401
            basic = base64.b64encode(b"user:push-secret").decode()
            assert (
                ingest_pprof(
                    c, "g{}", body, T0, headers={"Authorization": f"Basic {basic}"}
                ).status_code
                == 200
            )
            r = c.post(f"{QUERIER}/ProfileTypes", json={})
            assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
            # The UI shell holds no data (its API calls are guarded), so it loads for anyone.
            assert c.get("/").status_code == 200
            assert c.get("/pyroscope/render", params={"query": "g.cpu{}"}).status_code == 401
            r = c.post(
                f"{QUERIER}/ProfileTypes",
                json={"start": (T0 - 10) * 1000, "end": (T0 + 10) * 1000},
                headers={"Authorization": "Bearer read-secret"},
            )
            assert r.status_code == 200 and r.json()["profileTypes"][0]["ID"] == CPU
    finally:
        srv.stop()


def test_max_nodes_limits_the_flame_graph(server) -> None:  # type: ignore[no-untyped-def]
    samples = [([f"fn{i}", "main"], 1000 if i == 0 else 1, {}) for i in range(300)]
    with server.client() as c:
        assert (
            ingest_pprof(c, "wide{}", make_pprof(samples, time_ns=T0 * 10**9), T0).status_code
            == 200
        )
        r = c.post(
            f"{QUERIER}/SelectMergeStacktraces",
            headers={"accept-encoding": "gzip"},
            json={
                "profileTypeID": CPU,
                "labelSelector": "{}",
                "start": (T0 - 10) * 1000,
                "end": (T0 + 10) * 1000,
            },
        )
        assert r.headers.get("content-encoding") == "gzip"  # large query answers are compressed
        assert len(r.json()["flamegraph"]["names"]) == 302
        graph = flamegraph(c, "{}", T0 - 10, T0 + 10, maxNodes=10)
        count = sum(len(level["values"]) // 4 for level in graph["levels"])
        assert count <= 11
        assert "other" in graph["names"] and "fn0" in graph["names"]
        assert int(graph["total"]) == 1299


def test_profile_stats(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        r = c.post(f"{QUERIER}/GetProfileStats", json={})
        assert r.status_code == 200 and r.json() == {}  # nothing ingested: all defaults
        body = make_pprof([(["x", "main"], 5, {})], time_ns=T0 * 10**9)
        assert ingest_pprof(c, "stats{}", body, T0).status_code == 200
        stats = c.post(f"{QUERIER}/GetProfileStats", json={}).json()
        assert stats["dataIngested"] is True
        assert int(stats["oldestProfileTime"]) == int(stats["newestProfileTime"]) == T0 * 1000


def test_ready_and_index(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        assert c.get("/ready").text.strip() == "ready"
        assert "hotspan" in c.get("/").text
    assert time.time() > T0
