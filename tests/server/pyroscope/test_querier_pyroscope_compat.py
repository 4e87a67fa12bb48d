"""The querier and ingest answer as Pyroscope does where its clients rely on it: the limit on
max nodes, truncation into "other" that keeps every sample, the serialized tree format,
AnalyzeQuery, and the refusal of pyroscope-go's cumulative ``prev_profile`` uploads.

Every test replays the request a Pyroscope client sends against a real ``hotspan server``.
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from typing import Dict, List, Tuple

import httpx
from google.protobuf import json_format

from hotspan.formats.proto import profile_pb2, querier_pb2
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url
from tests.conftest import running_server
from tests.helpers import CPU, QUERIER, ingest_pprof, make_pprof

T0 = 1_700_100_000
LIMIT = 1 << 20  # Pyroscope's -querier.max-flamegraph-nodes-max
TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "00000000000000a1"
PROTO = {"content-type": "application/proto"}

# Under main;handle: render (1000) and work_1..work_40 (i each), all in one span.
SAMPLES = [(["render", "handle", "main"], 1000, {"trace_id": TRACE, "span_id": SPAN})] + [
    ([f"work_{i}", "handle", "main"], i, {"trace_id": TRACE, "span_id": SPAN}) for i in range(1, 41)
]
TOTAL = 1000 + sum(range(1, 41))
# The 8 heaviest nodes of that tree are main, handle, render and work_36..work_40: with
# max nodes 8, work_1..work_35 become one "other" under handle.
TRUNCATED = {("main", "handle", "render"): 1000, ("main", "handle", "other"): sum(range(1, 36))}
TRUNCATED.update({("main", "handle", f"work_{i}"): i for i in range(36, 41)})


def ingest(client: httpx.Client, service: str, t: int = T0) -> None:
    r = ingest_pprof(client, service + "{}", make_pprof(SAMPLES, time_ns=t * 10**9), t)
    assert r.status_code == 200, r.text


def query(service: str, **extra) -> dict:  # type: ignore[no-untyped-def]
    return {
        "profileTypeID": CPU,
        "labelSelector": f'{{service_name="{service}"}}',
        "start": (T0 - 60) * 1000,
        "end": (T0 + 60) * 1000,
        **extra,
    }


def decode_tree(data: bytes) -> Dict[Tuple[str, ...], int]:
    """Pyroscope's tree bytes as root-first stack -> self value.  Each node is
    uvarint(name length), name, uvarint(self), uvarint(child count), depth first, after a
    virtual root with an empty name."""
    pos = 0

    def uvarint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7

    def node() -> Tuple[str, int, int]:
        nonlocal pos
        size = uvarint()
        name = data[pos : pos + size].decode()
        pos += size
        return name, uvarint(), uvarint()

    out: Dict[Tuple[str, ...], int] = defaultdict(int)
    if not data:
        return out
    name, own, children = node()
    assert (name, own) == ("", 0), "the virtual root has no name and no value"
    open_parents: List[Tuple[str, ...]] = [()] * children
    while open_parents:
        parent = open_parents.pop()
        name, own, children = node()
        path = parent + (name,)
        if own:
            out[path] += own
        open_parents.extend([path] * children)
    assert pos == len(data), "bytes after the tree"
    return dict(out)


def pprof_stacks(profile: profile_pb2.Profile) -> Dict[Tuple[str, ...], int]:
    """A pprof profile's samples as root-first function names -> value."""
    strings = [s.decode() for s in profile.string_table]
    fn = {f.id: strings[f.name] for f in profile.function}
    loc = {loc.id: fn[loc.line[0].function_id] for loc in profile.location}
    out: Dict[Tuple[str, ...], int] = defaultdict(int)
    for s in profile.sample:
        out[tuple(loc[i] for i in reversed(s.location_id))] += s.value[0]
    return dict(out)


def assert_limit_error(r: httpx.Response, requested: int) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["code"] == "invalid_argument"
    assert body["message"] == (
        f"max flamegraph nodes limit {requested} is greater than allowed {LIMIT}"
    )


def test_max_nodes_over_the_limit_is_refused_everywhere(server) -> None:  # type: ignore[no-untyped-def]
    huge = 4611686018427387904  # what the replayed client sent, as a protojson string
    with server.client() as c:
        ingest(c, "limits")
        r = c.post(f"{QUERIER}/SelectMergeStacktraces", json=query("limits", maxNodes=str(huge)))
        assert_limit_error(r, huge)
        # At the limit, a flame graph; one over, the same refusal.
        r = c.post(f"{QUERIER}/SelectMergeStacktraces", json=query("limits", maxNodes=LIMIT))
        assert r.status_code == 200, r.text
        assert int(r.json()["flamegraph"]["total"]) == TOTAL
        r = c.post(f"{QUERIER}/SelectMergeStacktraces", json=query("limits", maxNodes=LIMIT + 1))
        assert_limit_error(r, LIMIT + 1)
        r = c.post(f"{QUERIER}/SelectMergeStacktraces", json=query("limits", maxNodes=-1))
        assert r.status_code == 400
        assert r.json()["message"] == (
            f"max flamegraph nodes limit must be set (max allowed {LIMIT})"
        )
        for fmt in ("PROFILE_FORMAT_TREE", "PROFILE_FORMAT_FLAMEGRAPH"):
            r = c.post(
                f"{QUERIER}/SelectMergeStacktraces",
                json=query("limits", maxNodes=str(huge), format=fmt),
            )
            assert_limit_error(r, huge)

        r = c.post(f"{QUERIER}/SelectMergeProfile", json=query("limits", maxNodes=str(huge)))
        assert_limit_error(r, huge)
        span = query("limits", maxNodes=str(huge), spanSelector=[SPAN])
        r = c.post(f"{QUERIER}/SelectMergeSpanProfile", json=span)
        assert_limit_error(r, huge)
        r = c.post(
            f"{QUERIER}/Diff",
            json={"left": query("limits"), "right": query("limits", maxNodes=str(huge))},
        )
        assert_limit_error(r, huge)

        # The render API and hotspan's trace profile take the same limit.
        params = {"query": "limits.cpu{}", "from": str(T0 - 60), "until": str(T0 + 60)}
        r = c.get("/pyroscope/render", params={**params, "max-nodes": str(huge)})
        assert r.status_code == 400, r.text
        assert r.json()["error"] == (
            f"max flamegraph nodes limit {huge} is greater than allowed {LIMIT}"
        )
        r = c.get("/pyroscope/render", params={**params, "max-nodes": "5"})
        assert r.status_code == 200, r.text
        assert r.json()["flamebearer"]["numTicks"] == TOTAL
        r = c.get(f"/api/traces/{TRACE}/profile", params={"maxNodes": str(huge)})
        assert r.status_code == 400
        assert f"greater than allowed {LIMIT}" in r.text


def test_select_merge_profile_folds_into_other_and_keeps_the_total(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        ingest(c, "merge")
        req = querier_pb2.SelectMergeProfileRequest(
            profile_typeID=CPU,
            label_selector='{service_name="merge"}',
            start=(T0 - 60) * 1000,
            end=(T0 + 60) * 1000,
        )
        r = c.post(f"{QUERIER}/SelectMergeProfile", content=req.SerializeToString(), headers=PROTO)
        assert r.status_code == 200, r.text
        whole = pprof_stacks(profile_pb2.Profile.FromString(r.content))
        assert sum(whole.values()) == TOTAL and len(whole) == 41

        req.max_nodes = 8
        r = c.post(f"{QUERIER}/SelectMergeProfile", content=req.SerializeToString(), headers=PROTO)
        assert r.status_code == 200, r.text
        profile = profile_pb2.Profile.FromString(r.content)
        assert pprof_stacks(profile) == TRUNCATED
        assert sum(s.value[0] for s in profile.sample) == TOTAL

        # SelectMergeStacktraces's pprof format truncates alike.
        body = query("merge", format="PROFILE_FORMAT_PPROF", maxNodes=8)
        r = c.post(f"{QUERIER}/SelectMergeStacktraces", json=body)
        assert r.status_code == 200, r.text
        resp = querier_pb2.SelectMergeStacktracesResponse()
        json_format.Parse(r.text, resp)
        assert pprof_stacks(resp.pprof.profile) == TRUNCATED


def test_tree_format_is_pyroscope_serialized_tree(server) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        ingest(c, "tree")
        r = c.post(
            f"{QUERIER}/SelectMergeStacktraces", json=query("tree", format="PROFILE_FORMAT_TREE")
        )
        assert r.status_code == 200, r.text
        assert "flamegraph" not in r.json()
        tree = decode_tree(base64.b64decode(r.json()["tree"]))
        assert tree == {
            ("main", "handle", "render"): 1000,
            **{("main", "handle", f"work_{i}"): i for i in range(1, 41)},
        }

        # Truncated as Pyroscope truncates a tree: the rest of handle's children in "other".
        req = querier_pb2.SelectMergeStacktracesRequest(
            profile_typeID=CPU,
            label_selector='{service_name="tree"}',
            start=(T0 - 60) * 1000,
            end=(T0 + 60) * 1000,
            max_nodes=8,
            format=querier_pb2.PROFILE_FORMAT_TREE,
        )
        r = c.post(
            f"{QUERIER}/SelectMergeStacktraces", content=req.SerializeToString(), headers=PROTO
        )
        assert r.status_code == 200, r.text
        resp = querier_pb2.SelectMergeStacktracesResponse.FromString(r.content)
        assert decode_tree(resp.tree) == TRUNCATED

        # A span's profile in the same format; nothing selected is no bytes at all.
        span = query("tree", spanSelector=[SPAN], format="PROFILE_FORMAT_TREE", maxNodes=8)
        r = c.post(f"{QUERIER}/SelectMergeSpanProfile", json=span)
        assert r.status_code == 200, r.text
        assert decode_tree(base64.b64decode(r.json()["tree"])) == TRUNCATED
        r = c.post(
            f"{QUERIER}/SelectMergeStacktraces",
            json=query("nothing-here", format="PROFILE_FORMAT_TREE"),
        )
        assert r.status_code == 200 and r.json().get("tree", "") == ""


def test_analyze_query(server) -> None:  # type: ignore[no-untyped-def]
    analyze_query(server, "Embedded store (DuckDB)")


def test_analyze_query_and_truncation_on_clickhouse(tmp_path, clickhouse_url) -> None:  # type: ignore[no-untyped-def]
    with running_server(tmp_path / "data", ["--store", clickhouse_url]) as srv:
        analyze_query(srv, "ClickHouse")
        with srv.client() as c:
            ingest(c, "chtree")
            body = query("chtree", format="PROFILE_FORMAT_TREE", maxNodes=8)
            r = c.post(f"{QUERIER}/SelectMergeStacktraces", json=body)
            assert r.status_code == 200, r.text
            assert decode_tree(base64.b64decode(r.json()["tree"])) == TRUNCATED


def analyze_query(server, component: str) -> None:  # type: ignore[no-untyped-def]
    with server.client() as c:
        ingest(c, "shop", T0)
        ingest(c, "shop", T0 + 20)
        ingest(c, "cart", T0)
        body = {
            "start": (T0 - 60) * 1000,
            "end": (T0 + 60) * 1000,
            "query": f'{CPU}{{service_name="shop"}}',
        }
        r = c.post(f"{QUERIER}/AnalyzeQuery", json=body)
        assert r.status_code == 200, r.text
        found = r.json()
        (scope,) = found["queryScopes"]
        assert scope["componentType"] == component
        assert int(scope["componentCount"]) == 1
        assert int(scope["seriesCount"]) == 2
        assert int(scope["profileCount"]) == 3
        whole_bytes = int(scope["profileBytes"])
        assert whole_bytes > 0
        impact = found["queryImpact"]
        assert int(impact["totalQueriedSeries"]) == 1
        assert int(impact["totalBytesInTimeRange"]) == whole_bytes

        # Two of the three profiles: their share of the store.
        r = c.post(f"{QUERIER}/AnalyzeQuery", json={**body, "end": (T0 + 10) * 1000})
        part = r.json()["queryScopes"][0]
        assert int(part["profileCount"]) == 2
        assert 0 < int(part["profileBytes"]) < whole_bytes

        # As Pyroscope: no range, no analysis; a bad selector is an invalid argument.
        r = c.post(f"{QUERIER}/AnalyzeQuery", json={"query": "{}"})
        assert r.status_code == 200 and r.json() == {}
        r = c.post(f"{QUERIER}/AnalyzeQuery", json={**body, "query": "{service_name="})
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument"


def go_upload(client: httpx.Client, profile: bytes, prev_profile: bytes) -> httpx.Response:
    """An upload as older pyroscope-go agents send a mutex profile: multipart with profile,
    prev_profile and sample_type_config parts, times in nanoseconds."""
    config = {
        "contentions": {"units": "lock_samples", "cumulative": True},
        "delay": {"units": "lock_nanoseconds", "cumulative": True},
    }
    files = [
        ("profile", ("profile.pprof", profile, "application/octet-stream")),
        ("prev_profile", ("profile.pprof", prev_profile, "application/octet-stream")),
        (
            "sample_type_config",
            ("sample_type_config.json", json.dumps(config).encode(), "application/octet-stream"),
        ),
    ]
    params = {
        "name": "gomutex{}",
        "from": str(T0 * 10**9),
        "until": str((T0 + 10) * 10**9),
        "spyName": "gospy",
        "sampleRate": "100",
        "units": "",
        "aggregationType": "",
    }
    return client.post("/ingest", params=params, files=files)


def mutex_profile(value: int) -> bytes:
    samples = [(["sync.(*Mutex).Lock", "main.worker"], value, {})]
    return make_pprof(samples, ("delay", "nanoseconds"), ("contentions", "count"), T0 * 10**9)


def test_cumulative_upload_with_prev_profile_is_refused(server) -> None:  # type: ignore[no-untyped-def]
    def stored_types() -> List[str]:
        r = c.post(f"{QUERIER}/ProfileTypes", json={"start": (T0 - 60) * 1000})
        return [t["ID"] for t in r.json().get("profileTypes", [])]

    with server.client() as c:
        r = go_upload(c, mutex_profile(500), mutex_profile(300))
        assert r.status_code == 422, r.text
        assert r.json() == {
            "code": "unknown",
            "message": "parsing IngestInput-pprof failed failed to parse pprof /ingest "
            "multipart form unsupported client version. Please update "
            "github.com/grafana/pyroscope-go to the latest version",
        }
        assert stored_types() == []

        # An empty prev_profile part is no previous profile: stored as sent.
        r = go_upload(c, mutex_profile(500), b"")
        assert r.status_code == 200, r.text
        (delay,) = stored_types()
        r = c.post(
            f"{QUERIER}/SelectMergeStacktraces",
            json={**query("gomutex"), "profileTypeID": delay},
        )
        assert r.status_code == 200, r.text
        assert int(r.json()["flamegraph"]["total"]) == 500
