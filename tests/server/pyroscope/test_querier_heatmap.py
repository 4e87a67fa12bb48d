"""SelectHeatmap and SelectSeries exemplars, replayed as Grafana's Pyroscope data source sends
them (pkg/tsdb/grafana-pyroscope-datasource: a connect-go client, so protobuf bodies and
Connect headers; its CLI and tests send protojson) to a real server holding real pprof uploads,
and checked field by field against Pyroscope's api/types/v1 and api/querier/v1 protos.

Grafana draws a heatmap from SelectHeatmap and, on an exemplar, links to the profile behind it
with SelectMergeStacktraces' ``profile_id_selector``: the test follows that link too.
"""

from __future__ import annotations

import gzip
import time
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import httpx
import pytest

from hotspan.formats.proto import profile_pb2, querier_pb2, types_pb2
from hotspan.model.labels import normalize, parse_selector
from hotspan.model.profile import MAX_SUM, Frame, IngestBatch, ProfileType
from hotspan.query.engine import MAX_PROFILE_IDS, MAX_PROFILE_POINTS, QueryEngine, QueryError
from hotspan.query.exemplars import profile_id
from hotspan.store.base import SampleFilter
from hotspan.store.duckdb import DuckDBStore
from tests.conftest import RunningServer, shared_fixture, start_server
from tests.helpers import CPU, QUERIER, TLS, function_totals, ingest_pprof, make_pprof

T0 = 1_700_000_000
TA, TB, TC = "0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736", "c" * 32
S1, S2, S3, S4 = "00000000000000a1", "00000000000000b2", "d00000000000c3f1", "00000000000000e4"

# (region, seconds after T0, samples): each upload is one profile of its series.
PROFILES = [
    (
        "eu",
        0,
        [
            (["render", "handle", "main"], 10, {"span_id": S1, "trace_id": TA}),
            (["query", "handle", "main"], 30, {"span_id": S2, "trace_id": TB}),
            (["idle", "main"], 5, {}),
        ],
    ),
    # The legacy Go SDK names the span ``profile_id``: Pyroscope renames it to span_id.
    (
        "eu",
        10,
        [(["render", "handle", "main"], 100, {"profile_id": S3}), (["idle", "main"], 20, {})],
    ),
    ("us", 20, [(["render", "handle", "main"], 7, {"span_id": S1, "trace_id": TA})]),
    ("us", 25, [(["idle", "main"], 60, {})]),
    ("us", 28, [(["render", "handle", "main"], 3, {"span_id": S4, "trace_id": TC})]),
]
START_MS, END_MS = (T0 - 60) * 1000, (T0 + 60) * 1000
STEP = 15.0  # what Grafana sends for this range: max(interval, minStep 15s, range / 64)

# Grafana's client is connect-go's generated QuerierServiceClient over the data source's HTTP
# client: unary Connect with the protobuf codec.
GRAFANA_HEADERS = {
    "Content-Type": "application/proto",
    "Connect-Protocol-Version": "1",
    "Accept-Encoding": "gzip",
    "User-Agent": "connect-go/1.18.1 (go1.24.4)",
}
PTYPE = ProfileType.parse(CPU)
EXEMPLARS_FIXTURE = "og/convert/pprof/testdata/cpu-exemplars.pb.gz"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    server = start_server(tmp_path_factory.mktemp("heatmap") / "data")
    try:
        with server.client() as c:
            for region, dt, samples in PROFILES:
                body = make_pprof(samples, time_ns=(T0 + dt) * 10**9)
                r = ingest_pprof(c, f"shop{{region={region}}}", body, T0 + dt)
                assert r.status_code == 200, r.text
        yield server
    finally:
        server.stop()
        if server.process.stdout:
            server.process.stdout.close()


def call(srv: RunningServer, method: str, msg, response_cls):  # type: ignore[no-untyped-def]
    """One unary call as Grafana makes it: protobuf in, protobuf out."""
    with srv.client() as c:
        r = c.post(f"{QUERIER}/{method}", content=msg.SerializeToString(), headers=GRAFANA_HEADERS)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/proto"
    out = response_cls()
    out.ParseFromString(r.content)
    return out


def heatmap_request(**fields) -> querier_pb2.SelectHeatmapRequest:  # type: ignore[no-untyped-def]
    # Exactly the fields PyroscopeClient.GetHeatmap sets.
    req = querier_pb2.SelectHeatmapRequest(
        profile_typeID=CPU,
        label_selector='{service_name="shop"}',
        start=START_MS,
        end=END_MS,
        step=STEP,
        query_type=querier_pb2.HEATMAP_QUERY_TYPE_INDIVIDUAL,
        exemplar_type=types_pb2.EXEMPLAR_TYPE_INDIVIDUAL,
    )
    for name, value in fields.items():
        if name == "group_by":
            req.group_by.extend(value)
        else:
            setattr(req, name, value)
    return req


def lows(values: List[int]) -> List[float]:
    """Pyroscope's value buckets: 20 equal ones from the smallest to the largest value."""
    lo, hi = min(values), max(values)
    return [float(lo + int(i * (hi - lo) / 20)) for i in range(20)]


def bucket(value: int, bounds: List[float]) -> int:
    return max(i for i, b in enumerate(bounds) if b <= value)


def slot_time(seconds_after_t0: int) -> int:
    """The right edge (ms) of the slot (T - step, T] holding a time, T = start + k * step."""
    t, step = (T0 + seconds_after_t0) * 1000, int(STEP * 1000)
    return START_MS + -(-(t - START_MS) // step) * step


def labels_of(pairs) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    names = [p.name for p in pairs]
    assert names == sorted(names), "label pairs come sorted by name"
    return {p.name: p.value for p in pairs}


def merge_profiles(srv: RunningServer, profile_ids: List[str]) -> Dict[str, int]:
    """Grafana's "View profile" link: the flame graph of the profiles an exemplar names."""
    req = querier_pb2.SelectMergeStacktracesRequest(
        profile_typeID=CPU,
        label_selector='{service_name="shop"}',
        start=START_MS,
        end=END_MS,
        max_nodes=16384,
        profile_id_selector=profile_ids,
    )
    resp = call(srv, "SelectMergeStacktraces", req, querier_pb2.SelectMergeStacktracesResponse)
    graph = {
        "names": list(resp.flamegraph.names),
        "levels": [{"values": list(lv.values)} for lv in resp.flamegraph.levels],
        "total": resp.flamegraph.total,
    }
    return function_totals(graph) if graph["levels"] else {}


def totals(region: str, dt: int) -> Tuple[int, Dict[str, int]]:
    """A pushed profile's total and its per-function totals."""
    for reg, t, samples in PROFILES:
        if (reg, t) == (region, dt):
            per: Counter = Counter()
            for names, value, _ in samples:
                for name in set(names):
                    per[name] += value
            return sum(v for _, v, _ in samples), dict(per)
    raise KeyError((region, dt))


_HM = querier_pb2.SelectHeatmapResponse


def _span() -> dict:
    return {
        "query_type": querier_pb2.HEATMAP_QUERY_TYPE_SPAN,
        "exemplar_type": types_pb2.EXEMPLAR_TYPE_SPAN,
        "group_by": ["region"],
    }


def _span_ungrouped() -> dict:
    return {
        "query_type": querier_pb2.HEATMAP_QUERY_TYPE_SPAN,
        "exemplar_type": types_pb2.EXEMPLAR_TYPE_SPAN,
    }


def merge_profiles_of(srv: RunningServer, profile_id: str, window: dict) -> int:
    req = querier_pb2.SelectMergeStacktracesRequest(
        profile_typeID=CPU,
        label_selector=window["label_selector"],
        start=window["start"],
        end=window["end"],
        profile_id_selector=[profile_id],
    )
    resp = call(srv, "SelectMergeStacktraces", req, querier_pb2.SelectMergeStacktracesResponse)
    return resp.flamegraph.total


def test_individual_heatmap_counts_each_profile_and_links_to_it(srv: RunningServer) -> None:
    resp = call(srv, "SelectHeatmap", heatmap_request(), querier_pb2.SelectHeatmapResponse)
    values = [totals(reg, dt)[0] for reg, dt, _ in PROFILES]
    bounds = lows(values)
    (series,) = resp.series
    assert list(series.labels) == []  # no group_by: one series without labels
    expected: Dict[int, Counter] = {}
    for (_, dt, _), value in zip(PROFILES, values):
        expected.setdefault(slot_time(dt), Counter())[bucket(value, bounds)] += 1
    assert [s.timestamp for s in series.slots] == sorted(expected)
    for slot in series.slots:
        assert list(slot.y_min) == bounds  # the same 20 buckets in every slot
        assert len(slot.counts) == 20
        assert {i: c for i, c in enumerate(slot.counts) if c} == dict(expected[slot.timestamp])
        # One exemplar per non-empty bucket: the largest profile in it.
        assert len(slot.exemplars) == sum(1 for c in slot.counts if c)
        for ex in slot.exemplars:
            assert ex.span_id == "" and ex.trace_id == ""
            assert len(ex.profile_id) == 36 and ex.profile_id.count("-") == 4  # UUID form
            assert slot_time((ex.timestamp // 1000) - T0) == slot.timestamp
            region = labels_of(ex.labels)["region"]
            assert ex.value == totals(region, ex.timestamp // 1000 - T0)[0]
            assert labels_of(ex.labels)["service_name"] == "shop"
            same_cell = [
                totals(r, dt)[0]
                for r, dt, _ in PROFILES
                if slot_time(dt) == slot.timestamp
                and bucket(totals(r, dt)[0], bounds) == bucket(ex.value, bounds)
            ]
            assert ex.value == max(same_cell)
    # The slot ending at T0+30 holds three profiles (us at +20, +25, +28): 7 and 3 share the
    # lowest bucket, whose exemplar is the 7.
    slot = next(s for s in series.slots if s.timestamp == (T0 + 30) * 1000)
    assert sorted(c for c in slot.counts if c) == [1, 2]
    assert sorted(ex.value for ex in slot.exemplars) == [7, 60]

    # Following an exemplar's link gives exactly that profile.
    ex = next(e for s in series.slots for e in s.exemplars if e.value == 120)
    assert ex.timestamp == (T0 + 10) * 1000
    _, per_function = totals("eu", 10)
    assert merge_profiles(srv, [ex.profile_id]) == per_function
    both = [e.profile_id for s in series.slots for e in s.exemplars if e.value in (45, 120)]
    merged = merge_profiles(srv, both)
    assert merged["main"] == 165 and merged["render"] == 110 and merged["query"] == 30


def test_span_heatmap_grouped_with_span_exemplars(srv: RunningServer) -> None:
    req = heatmap_request(
        query_type=querier_pb2.HEATMAP_QUERY_TYPE_SPAN,
        exemplar_type=types_pb2.EXEMPLAR_TYPE_SPAN,
        group_by=["region"],
    )
    resp = call(srv, "SelectHeatmap", req, querier_pb2.SelectHeatmapResponse)
    # A point per span within a profile; samples without a span (idle) are no point.
    points = {
        reg: [
            (dt, labels.get("span_id") or labels["profile_id"], labels.get("trace_id", ""), v)
            for reg2, dt, samples in PROFILES
            if reg2 == reg
            for _, v, labels in samples
            if "span_id" in labels or "profile_id" in labels
        ]
        for reg in ("eu", "us")
    }
    bounds = lows([p[3] for ps in points.values() for p in ps])
    assert [labels_of(s.labels) for s in resp.series] == [{"region": "eu"}, {"region": "us"}]
    for series in resp.series:
        region = labels_of(series.labels)["region"]
        assert sum(sum(s.counts) for s in series.slots) == len(points[region])
        got = sorted(
            (ex.timestamp // 1000 - T0, ex.span_id, ex.trace_id, ex.value)
            for s in series.slots
            for ex in s.exemplars
        )
        # Each point sits alone in its cell here, so each is its cell's exemplar.
        assert got == sorted(points[region])
        for slot in series.slots:
            assert list(slot.y_min) == bounds
            for ex in slot.exemplars:
                assert ex.profile_id == ""
                own = labels_of(ex.labels)
                assert "region" not in own and own["service_name"] == "shop"
                assert slot.counts[bucket(ex.value, bounds)] >= 1
                assert slot.timestamp == slot_time(ex.timestamp // 1000 - T0)

    # limit: the series with most points (eu has 3, us 2).
    limited = call(srv, "SelectHeatmap", heatmap_request(**{**_span(), "limit": 1}), _HM)
    assert [labels_of(s.labels) for s in limited.series] == [{"region": "eu"}]


def test_heatmap_without_exemplars_and_in_json(srv: RunningServer) -> None:
    # Grafana without the exemplars toggle: EXEMPLAR_TYPE_NONE, counts only.
    req = heatmap_request(exemplar_type=types_pb2.EXEMPLAR_TYPE_NONE)
    resp = call(srv, "SelectHeatmap", req, querier_pb2.SelectHeatmapResponse)
    assert sum(sum(s.counts) for s in resp.series[0].slots) == len(PROFILES)
    assert all(len(s.exemplars) == 0 for s in resp.series[0].slots)

    # protojson, as Grafana's CLI sends it: enum names, int64 as strings.
    with srv.client() as c:
        r = c.post(
            f"{QUERIER}/SelectHeatmap",
            json={
                "profileTypeID": CPU,
                "labelSelector": '{service_name="shop"}',
                "start": str(START_MS),
                "end": str(END_MS),
                "step": STEP,
                "queryType": "HEATMAP_QUERY_TYPE_SPAN",
                "exemplarType": "EXEMPLAR_TYPE_SPAN",
                "limit": "25",
            },
        )
    assert r.status_code == 200, r.text
    body = r.json()
    (series,) = body["series"]
    slot = next(s for s in series["slots"] if s["timestamp"] == str(slot_time(0)))
    assert set(slot) == {"timestamp", "yMin", "counts", "exemplars"}
    ex = max(slot["exemplars"], key=lambda e: int(e["value"]))
    assert (ex["spanId"], ex["traceId"], ex["value"]) == (S2, TB, "30")
    assert ex["timestamp"] == str(T0 * 1000) and "profileId" not in ex


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"step": 0.0}, "step must be >= 1ms"),
        ({"query_type": querier_pb2.HEATMAP_QUERY_TYPE_UNSPECIFIED}, "query type"),
        ({"exemplar_type": types_pb2.EXEMPLAR_TYPE_SPAN}, "only available for span query"),
        ({"exemplar_type": 42}, "unknown exemplar type"),
        ({"limit": -1}, "limit must be non-negative"),
        ({"profile_typeID": "nope"}, "profile type"),
        # 1 ms over the 2 minutes: 120,000 slots, over SelectSeries' limit of points.
        ({"step": 0.001}, "step is too small for the time range (over 100,000 points)"),
        ({"step": 0.001, "start": 0, "end": 0}, "step is too small for the time range"),
    ],
)
def test_heatmap_bad_requests(srv: RunningServer, fields: dict, message: str) -> None:
    with srv.client() as c:
        r = c.post(
            f"{QUERIER}/SelectHeatmap",
            content=heatmap_request(**fields).SerializeToString(),
            headers=GRAFANA_HEADERS,
        )
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_argument"
    assert message in r.json()["message"]


def test_heatmap_and_series_steps_up_to_the_limit(srv: RunningServer) -> None:
    """2 ms over the 2 minutes: 60,000 steps, within the limit; 1 ms is refused for
    SelectSeries as for SelectHeatmap."""
    resp = call(
        srv, "SelectHeatmap", heatmap_request(step=0.002), querier_pb2.SelectHeatmapResponse
    )
    assert sum(sum(s.counts) for hm in resp.series for s in hm.slots) == len(PROFILES)
    with srv.client() as c:
        r = c.post(
            f"{QUERIER}/SelectSeries",
            content=series_request(step=0.001).SerializeToString(),
            headers=GRAFANA_HEADERS,
        )
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "invalid_argument"
    assert r.json()["message"] == "step is too small for the time range (over 100,000 points)"
    # Under a millisecond is refused, as Pyroscope does, not rounded up to one.
    with srv.client() as c:
        r = c.post(
            f"{QUERIER}/SelectSeries",
            content=series_request(step=0.0005).SerializeToString(),
            headers=GRAFANA_HEADERS,
        )
    assert r.status_code == 400 and r.json()["message"] == "step must be >= 1ms, got 0.0005"


def series_request(**fields) -> querier_pb2.SelectSeriesRequest:  # type: ignore[no-untyped-def]
    # Exactly the fields PyroscopeClient.GetSeries sets (exemplars toggle on).
    req = querier_pb2.SelectSeriesRequest(
        profile_typeID=CPU,
        label_selector='{service_name="shop"}',
        start=START_MS,
        end=END_MS,
        step=STEP,
        exemplar_type=types_pb2.EXEMPLAR_TYPE_INDIVIDUAL,
    )
    for name, value in fields.items():
        if name == "group_by":
            req.group_by.extend(value)
        else:
            setattr(req, name, value)
    return req


def test_select_series_individual_exemplars(srv: RunningServer) -> None:
    resp = call(srv, "SelectSeries", series_request(), querier_pb2.SelectSeriesResponse)
    (series,) = resp.series
    by_point: Dict[int, List[Tuple[str, int]]] = {}
    for reg, dt, _ in PROFILES:
        by_point.setdefault(slot_time(dt), []).append((reg, dt))
    assert [p.timestamp for p in series.points] == sorted(by_point)
    for point in series.points:
        members = by_point[point.timestamp]
        assert point.value == sum(totals(r, dt)[0] for r, dt in members)
        (ex,) = point.exemplars  # Pyroscope keeps one exemplar per point: the largest
        region, dt = max(members, key=lambda m: totals(*m)[0])
        assert ex.value == totals(region, dt)[0]
        assert ex.timestamp == (T0 + dt) * 1000  # the profile's own time, not the point's
        assert ex.span_id == "" and ex.trace_id == ""
        own = labels_of(ex.labels)
        assert own["region"] == region and own["service_name"] == "shop"
        assert own["__profile_type__"] == CPU
        assert merge_profiles(srv, [ex.profile_id]) == totals(region, dt)[1]

    # Grouped: the group's label leaves the exemplar's labels (it is the series').
    grouped = call(
        srv, "SelectSeries", series_request(group_by=["region"]), querier_pb2.SelectSeriesResponse
    )
    assert sorted(labels_of(s.labels)["region"] for s in grouped.series) == ["eu", "us"]
    for s in grouped.series:
        for p in s.points:
            (ex,) = p.exemplars
            assert "region" not in labels_of(ex.labels)
    us = next(s for s in grouped.series if labels_of(s.labels)["region"] == "us")
    assert [(p.value, p.exemplars[0].value) for p in us.points] == [(70.0, 60)]

    # Without exemplars asked (Grafana's default), none.
    plain = call(
        srv,
        "SelectSeries",
        series_request(exemplar_type=types_pb2.EXEMPLAR_TYPE_NONE),
        querier_pb2.SelectSeriesResponse,
    )
    assert [p.value for p in plain.series[0].points] == [p.value for p in series.points]
    assert all(len(p.exemplars) == 0 for p in plain.series[0].points)


def test_select_series_span_exemplars(srv: RunningServer) -> None:
    resp = call(
        srv,
        "SelectSeries",
        series_request(exemplar_type=types_pb2.EXEMPLAR_TYPE_SPAN),
        querier_pb2.SelectSeriesResponse,
    )
    got = {
        p.timestamp: [(e.span_id, e.trace_id, e.value, e.profile_id) for e in p.exemplars]
        for p in resp.series[0].points
    }
    # Per point the largest span of a profile in it; a point with no span has none.
    assert got == {
        slot_time(0): [(S2, TB, 30, "")],
        slot_time(10): [(S3, "", 100, "")],
        slot_time(20): [(S1, TA, 7, "")],
    }


@pytest.fixture(scope="module")
def exemplars_fixture(srv: RunningServer) -> Tuple[int, profile_pb2.Profile]:
    """The Go SDK's real CPU profile with span ids (as ``profile_id`` sample labels)."""
    path = shared_fixture(EXEMPLARS_FIXTURE)
    profile = profile_pb2.Profile()
    profile.ParseFromString(gzip.decompress(path.read_bytes()))
    with srv.client() as c:
        r = ingest_pprof(c, "go-app{}", path.read_bytes(), profile.time_nanos // 10**9)
        assert r.status_code == 200, r.text
    return profile.time_nanos, profile


def test_go_fixture_span_heatmap_and_exemplars(
    srv: RunningServer, exemplars_fixture: Tuple[int, profile_pb2.Profile]
) -> None:
    time_ns, profile = exemplars_fixture
    strings = [s.decode() for s in profile.string_table]  # bytes in hotspan's profile.proto
    cpu = next(i for i, t in enumerate(profile.sample_type) if strings[t.type] == "cpu")
    per_span: Counter = Counter()
    for sample in profile.sample:
        for label in sample.label:
            if strings[label.key] in ("profile_id", "span_id"):
                per_span[strings[label.str]] += sample.value[cpu]
    assert len(per_span) > 100  # real data: hundreds of spans

    t_ms = time_ns // 10**6
    window = {
        "start": t_ms - 30_000,
        "end": t_ms + 30_000,
        "label_selector": '{service_name="go-app"}',
    }
    resp = call(srv, "SelectHeatmap", heatmap_request(**window, **_span_ungrouped()), _HM)
    (series,) = resp.series
    # Every span is one point (its samples in several series of the profile added up).
    assert sum(sum(s.counts) for s in series.slots) == len(per_span)
    exemplars = [e for s in series.slots for e in s.exemplars]
    by_span = {e.span_id: e for e in exemplars}
    top_span, top_value = per_span.most_common(1)[0]
    assert by_span[top_span].value == top_value == max(e.value for e in exemplars)
    for e in exemplars:
        assert e.value == per_span[e.span_id] and e.timestamp == t_ms
    assert list(series.slots[0].y_min) == lows(list(per_span.values()))

    # The timeline's point holds the whole profile; its exemplar is the largest series'
    # profile, and its link gives that profile's samples.
    resp = call(srv, "SelectSeries", series_request(**window), querier_pb2.SelectSeriesResponse)
    (point,) = resp.series[0].points
    assert point.value == sum(s.value[cpu] for s in profile.sample)
    (ex,) = point.exemplars
    linked = merge_profiles_of(srv, ex.profile_id, window)
    assert linked == ex.value and 0 < ex.value <= point.value


def test_profile_id_selector_rejects_what_is_no_profile_id(srv: RunningServer) -> None:
    with httpx.Client(base_url=srv.url, verify=TLS) as c:
        r = c.post(
            f"{QUERIER}/SelectMergeStacktraces",
            json={
                "profileTypeID": CPU,
                "labelSelector": "{}",
                "start": str(START_MS),
                "end": str(END_MS),
                "profileIdSelector": ["not-a-uuid"],
            },
        )
    assert r.status_code == 400 and "not a UUID" in r.json()["message"]


def test_select_series_exemplars_when_the_step_is_no_whole_ms(srv: RunningServer) -> None:
    # Steps of 1.5 ms put most points between two milliseconds (the point's time is its
    # millisecond): each point still names its profile.
    resp = call(srv, "SelectSeries", series_request(step=0.0015), querier_pb2.SelectSeriesResponse)
    (series,) = resp.series
    assert len(series.points) == len(PROFILES)  # each profile alone in its step
    for point in series.points:
        (ex,) = point.exemplars
        assert ex.value == point.value
        assert 0 <= point.timestamp - ex.timestamp < 2


# A week of profiles of 2,000 series, one every 2.5 s: what a Grafana heatmap or timeline over
# a long range reads (the engine reads a million at most).
MANY_SERIES, MANY_PROFILES = 2_000, 240_000


@pytest.fixture(scope="module")
def many_profiles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueryEngine]:
    store = DuckDBStore(str(tmp_path_factory.mktemp("many") / "data"))
    batch = IngestBatch()
    stack = batch.add_stack((batch.add_frame(Frame("main", "main.py", 1)),))
    series = [
        batch.add_series(PTYPE, normalize({"service_name": f"svc{i % 20}", "pod": f"p{i}"}))
        for i in range(MANY_SERIES)
    ]
    for i in range(MANY_PROFILES):  # profile i: value i + 1, at T0 + i * 2.5 s
        batch.add_sample(series[i % MANY_SERIES], T0 * 10**9 + i * 2_500_000_000, stack, i + 1)
    store.write("t", batch).result(timeout=60)
    try:
        yield QueryEngine(store)
    finally:
        store.close()


def test_heatmap_and_exemplars_of_many_profiles_stay_quick(many_profiles: QueryEngine) -> None:
    engine, sel = many_profiles, parse_selector("{}")
    end_ms = (T0 * 10**9 + MANY_PROFILES * 2_500_000_000) // 10**6
    step_ms = (end_ms - T0 * 1000) // 64
    began = time.perf_counter()
    maps, lows = engine.heatmap(
        "t", PTYPE, sel, T0 * 1000, end_ms, step_ms, ["service_name"], False, True
    )
    where = SampleFilter(T0 * 10**9, end_ms * 10**6)
    found = engine.select_series("t", PTYPE, sel, where, 3600 * 10**9, [], exemplars="individual")
    took = time.perf_counter() - began
    # One point per profile, all counted; each cell's exemplar is its largest profile.
    assert len(maps) == 20 and lows[0] == 1
    assert sum(sum(s.counts) for m in maps for s in m.slots) == MANY_PROFILES
    top = max((e for m in maps for s in m.slots for e in s.exemplars), key=lambda e: e.value)
    assert top.value == MANY_PROFILES and "service_name" not in top.labels
    # Profile values grow with time: each hour's exemplar is its last profile.
    (ts,) = found
    for t, (ex,) in zip(ts.timestamps_ms, ts.exemplars):
        assert t - 3_600_000 < ex.timestamp_ms <= t
        assert ex.value == (ex.time_ns - T0 * 10**9) // 2_500_000_000 + 1
    # Python work per point made this ~10 s; numpy columns take well under a second.
    assert took < 4.0, took


def test_heatmaps_past_the_cell_cap_are_refused(many_profiles: QueryEngine) -> None:
    """Cells are the non-empty slots of every series times the value buckets; past the cap,
    a 400 that says what to narrow."""
    from hotspan.query.heatmap import Y_BUCKETS
    from hotspan.server.errors import HTTPError
    from hotspan.server.pyroscope.querier import check_heatmap_cells

    engine, sel = many_profiles, parse_selector('{service_name="svc3"}')
    end_ms = (T0 * 10**9 + MANY_PROFILES * 2_500_000_000) // 10**6
    maps, lows = engine.heatmap("t", PTYPE, sel, T0 * 1000, end_ms, 25_000, ["pod"], False, False)
    # svc3's profiles, a slot each: a pod's are MANY_SERIES * 2.5 s apart, slots 25 s wide.
    profiles = MANY_PROFILES // 20
    assert len(maps) == MANY_SERIES // 20 and len(lows) == Y_BUCKETS
    assert sum(len(m.slots) for m in maps) == profiles
    cells = profiles * Y_BUCKETS
    check_heatmap_cells(maps, lows, cells)  # at the cap: answered
    with pytest.raises(HTTPError) as err:
        check_heatmap_cells(maps, lows, cells - 1)
    assert err.value.status == 400
    assert f"too many cells ({cells:,}, over {cells - 1:,})" in err.value.message


def test_past_the_cap_the_latest_points_keep_their_exemplars(many_profiles: QueryEngine) -> None:
    engine, sel = many_profiles, parse_selector("{}")
    end_ns = T0 * 10**9 + MANY_PROFILES * 2_500_000_000
    where, hour = SampleFilter(T0 * 10**9, end_ns), 3600 * 10**9
    engine.max_points = 100_000  # of the 240,000 profiles: the cap, made small
    try:
        (ts,) = engine.select_series("t", PTYPE, sel, where, hour, [], exemplars="individual")
        with pytest.raises(QueryError, match="over 100000 profiles"):
            engine.heatmap("t", PTYPE, sel, T0 * 1000, end_ns // 10**6, 3_600_000, [], False, True)
    finally:
        engine.max_points = MAX_PROFILE_POINTS
    # The timeline draws whole; its latest points (those one looks at) keep their exemplars,
    # each still the largest profile of its hour; the oldest go without.
    assert len(ts.timestamps_ms) == 1 + -(-(MANY_PROFILES - 1) * 2_500_000_000 // hour)
    has = [bool(e) for e in ts.exemplars]
    first = has.index(True)
    assert first > 0 and all(has[first:])
    assert 100_000 // 1440 - 20 <= len(has) - first <= 100_000 // 1440  # 1,440 per hour
    for t, (ex,) in zip(ts.timestamps_ms[first:], ts.exemplars[first:]):
        last = (t * 10**6 - T0 * 10**9) // 2_500_000_000  # the hour's last profile
        assert ex.value == min(last, MANY_PROFILES - 1) + 1


def test_profiles_by_id_sum_without_wrapping_and_in_bounded_reads(tmp_path: Path) -> None:
    store = DuckDBStore(str(tmp_path / "data"))
    try:
        batch = IngestBatch()
        stack = batch.add_stack((batch.add_frame(Frame("main", "main.py", 1)),))
        sid = batch.add_series(PTYPE, normalize({"service_name": "big"}))
        huge = (1 << 62) - 1  # the most one profile's stack holds
        for k in range(3):
            batch.add_sample(sid, (T0 + k) * 10**9, stack, huge)
        store.write("t", batch).result(timeout=30)
        engine, sel = QueryEngine(store), parse_selector('{service_name="big"}')
        where = SampleFilter(T0 * 10**9, (T0 + 60) * 10**9)
        ids = [profile_id(sid, (T0 + k) * 10**9) for k in range(3)]
        # Three such profiles merged: the stack's sum stops at the stores' cap, as a range's
        # sum does, instead of wrapping round to a negative int64.
        merged = engine.profile_stack_values("t", PTYPE, sel, where, ids)
        assert merged.values.tolist() == [MAX_SUM]
        assert engine.stack_values("t", PTYPE, sel, where).values.tolist() == [MAX_SUM]
        # Each id is one read: a request naming thousands of profiles is refused up front.
        many = [profile_id(sid, T0 * 10**9 + k) for k in range(MAX_PROFILE_IDS + 1)]
        with pytest.raises(QueryError, match=f"at most {MAX_PROFILE_IDS}"):
            engine.profile_stack_values("t", PTYPE, sel, where, many)
        assert engine.profile_stack_values("t", PTYPE, sel, where, many[:2]).values.size == 1
    finally:
        store.close()


def test_heatmap_series_come_in_pyroscopes_order(
    srv: RunningServer, exemplars_fixture: Tuple[int, profile_pb2.Profile]
) -> None:
    # Pyroscope orders series by the group-by labels each has, in group-by order: go-app has
    # no region, so its key starts at service_name, after the shop series' region=...
    start = exemplars_fixture[0] // 10**6 - 60_000
    window = {"label_selector": "{}", "start": start, "end": END_MS, "step": 30 * 86400.0}
    req = heatmap_request(**window, group_by=["region", "service_name"])
    resp = call(srv, "SelectHeatmap", req, _HM)
    assert [labels_of(s.labels) for s in resp.series] == [
        {"region": "eu", "service_name": "shop"},
        {"region": "us", "service_name": "shop"},
        {"service_name": "go-app"},
    ]
