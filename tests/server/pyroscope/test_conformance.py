"""Conformance with Pyroscope on real-world profiles (Pyroscope's own test data).

Every profile is uploaded to a real ``hotspan server`` over HTTP the way agents and SDKs send it
(``/ingest`` with a raw, gzipped, ``Content-Encoding: gzip`` or multipart body, and the push API)
and read back through the Connect querier API.  Expected values are computed here, from the
fixture files, independently of the server's code.
"""

from __future__ import annotations

import base64
import collections
import gzip
import json
import time
import urllib.parse
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import httpx
import pytest

from hotspan.formats.proto import profile_pb2, push_pb2, querier_pb2
from tests.conftest import RunningServer, shared_fixture

PPROF = "og/convert/pprof/testdata"
SPEEDSCOPE = "og/convert/speedscope/testdata"
QUERIER = "/querier.v1.QuerierService"
DAY_MS = 86_400_000
# The upload time given as ``from`` for every /ingest call; profiles without a plausible
# time_nanos are stored at this time.
UPLOAD_FROM_S = int(time.time()) - 120


# -- helpers --------------------------------------------------------------------------------


def load_profile(path: Path) -> profile_pb2.Profile:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return profile_pb2.Profile.FromString(raw)


def strings(p: profile_pb2.Profile) -> List[str]:
    return [s.decode("utf-8", "replace") for s in p.string_table]


def sample_types(p: profile_pb2.Profile) -> List[Tuple[str, str]]:
    s = strings(p)
    return [(s[t.type], s[t.unit]) for t in p.sample_type]


def period_type(p: profile_pb2.Profile) -> Tuple[str, str]:
    s = strings(p)
    return (s[p.period_type.type], s[p.period_type.unit])


def totals(p: profile_pb2.Profile) -> List[int]:
    out = [0] * len(p.sample_type)
    for sample in p.sample:
        for i, v in enumerate(sample.value):
            out[i] += v
    return out


def function_names(p: profile_pb2.Profile) -> set:
    s = strings(p)
    return {s[f.name] for f in p.function}


def function_table(p: profile_pb2.Profile) -> Dict[int, str]:
    """Function id -> name.  Old .NET agents wrote every function with id 0 while their
    locations refer to functions 1..n in table order (Pyroscope repairs this on ingest:
    ``FixFunctionIDForBrokenDotnet``); the ids are then the positions."""
    s = strings(p)
    if p.function and all(f.id == 0 for f in p.function):
        return {i + 1: s[f.name] or s[f.system_name] for i, f in enumerate(p.function)}
    return {f.id: s[f.name] or s[f.system_name] for f in p.function}


def leaf_self(p: profile_pb2.Profile, index: int) -> Dict[str, int]:
    """Self value per leaf function name for sample type ``index``."""
    fn = {k: v or "unknown" for k, v in function_table(p).items()}
    loc = {loc.id: loc for loc in p.location}
    out: Dict[str, int] = collections.Counter()
    for sample in p.sample:
        value = sample.value[index]
        if not value or not sample.location_id:
            continue
        leaf = loc[sample.location_id[0]]
        out[fn[leaf.line[0].function_id]] += value
    return dict(out)


def now_ms() -> int:
    return int(time.time() * 1000)


def wide() -> Dict[str, int]:
    """A time range that covers every fixture's time_nanos (2021..) and now."""
    return {"start": 1, "end": now_ms() + DAY_MS}


def call(client: httpx.Client, method: str, body: dict, **headers: str) -> dict:
    resp = client.post(
        f"{QUERIER}/{method}",
        content=json.dumps(body),
        headers={"content-type": "application/json", **headers},
    )
    assert resp.status_code == 200, f"{method}: {resp.status_code} {resp.text}"
    return resp.json()


def ingest(
    client: httpx.Client,
    name: str,
    *,
    fmt: str = "pprof",
    spy: str = "gospy",
    content: Optional[bytes] = None,
    files: Optional[dict] = None,
    headers: Optional[dict] = None,
    extra: Optional[dict] = None,
) -> httpx.Response:
    params = {
        "name": name,
        "from": str(UPLOAD_FROM_S),
        "until": str(UPLOAD_FROM_S + 10),
        "spyName": spy,
    }
    if fmt:
        params["format"] = fmt
    params.update(extra or {})
    url = "/ingest?" + urllib.parse.urlencode(params)
    if files is not None:
        resp = client.post(url, files=files, headers=headers or {})
    else:
        resp = client.post(url, content=content, headers=headers or {})
    assert resp.status_code == 200, f"ingest {name}: {resp.status_code} {resp.text}"
    return resp


class Flame:
    def __init__(self, msg: dict) -> None:
        fg = msg.get("flamegraph", {})
        self.names: List[str] = fg.get("names", [])
        self.levels = [[int(v) for v in lv.get("values", [])] for lv in fg.get("levels", [])]
        self.total = int(fg.get("total", 0))

    def self_by_name(self) -> Dict[str, int]:
        out: Dict[str, int] = collections.Counter()
        for level in self.levels:
            for i in range(0, len(level), 4):
                out[self.names[level[i + 3]]] += level[i + 2]
        return {k: v for k, v in out.items() if v}

    def root_total(self) -> int:
        return self.levels[0][1] if self.levels else 0


def flame(
    client: httpx.Client,
    type_id: str,
    selector: str,
    start: Optional[int] = None,
    end: Optional[int] = None,
    **extra,
) -> Flame:
    rng = wide()
    body = {
        "profileTypeID": type_id,
        "labelSelector": selector,
        "start": rng["start"] if start is None else start,
        "end": rng["end"] if end is None else end,
        "maxNodes": 1_000_000,
        **extra,
    }
    return Flame(call(client, "SelectMergeStacktraces", body))


def profile_type_ids(client: httpx.Client, **headers: str) -> set:
    msg = call(client, "ProfileTypes", wide(), **headers)
    return {t["ID"] for t in msg.get("profileTypes", [])}


def series_labels(client: httpx.Client, selector: str) -> List[Dict[str, str]]:
    msg = call(client, "Series", {"matchers": [selector], **wide()})
    return [
        {pair["name"]: pair.get("value", "") for pair in ls.get("labels", [])}
        for ls in msg.get("labelsSet", [])
    ]


def label_names(client: httpx.Client, selector: str) -> List[str]:
    return call(client, "LabelNames", {"matchers": [selector], **wide()}).get("names", [])


def label_values(client: httpx.Client, name: str, selector: Optional[str] = None) -> List[str]:
    body = {"name": name, **wide()}
    if selector:
        body["matchers"] = [selector]
    return call(client, "LabelValues", body).get("names", [])


@pytest.fixture(scope="module")
def client(module_server: RunningServer):
    with module_server.client() as c:
        yield c


# -- pprof fixtures via /ingest --------------------------------------------------------------

# file, spyName, sample_type_config file, expected __name__, a function known to be in it,
# how to send it ("raw": the file as is; "gzip-header": gunzipped file re-gzipped with
# Content-Encoding: gzip; "multipart": multipart form with a ``profile`` field).
CASES = [
    ("heap.pb", "gospy", None, "memory", "runtime.malg", "raw"),
    ("heap.pb.gz", "gospy", None, "memory", "runtime.malg", "raw"),
    ("cpu.pb.gz", "gospy", None, "process_cpu", "runtime.pthread_cond_wait", "raw"),
    ("cpu.pb.gz", "gospy", None, "process_cpu", "runtime.pthread_cond_wait", "gzip-header"),
    ("cpu.pb.gz", "gospy", None, "process_cpu", "runtime.pthread_cond_wait", "multipart"),
    ("cpu-exemplars.pb.gz", "gospy", None, "process_cpu", "main.slowFunction", "raw"),
    ("cpu-js.pb.gz", "nodespy", None, "wall", "socketCloseListener", "raw"),
    ("heap-js.pprof", "nodespy", None, "memory", "parserOnIncoming", "raw"),
    (
        "nodejs-heap.pb.gz",
        "nodespy",
        None,
        "memory",
        "node:_http_server:parserOnIncoming:852",
        "raw",
    ),
    ("nodejs-wall.pb.gz", "nodespy", None, "wall", "node:_http_outgoing:onFinish:830", "raw"),
    (
        "dotnet-pprof-211.pb.gz",
        "dotnetspy",
        "dotnet-pprof-211.st.json",
        "process_cpu",
        "System!ModuleHandle.ResolveMethodHandle",
        "multipart",
    ),
    (
        "dotnet-pprof-3.pb.gz",
        "dotnetspy",
        "dotnet-pprof-3.st.json",
        "process_cpu",
        "System.Threading!PortableThreadPool.WorkerThread.WorkerThreadStart",
        "multipart",
    ),
    ("dotnet-pprof-73.pb.gz", "dotnetspy", None, "process_cpu", "System!Buffer.Memmove", "raw"),
    # py-spy's only sample type is "samples": Pyroscope's default sample type mapping
    # (og/storage/tree.DefaultSampleTypeMapping) displays it as "cpu", hence process_cpu.
    ("pyspy-1.pb.gz", "pyspy", None, "process_cpu", "slow_function", "raw"),
    ("invalid_utf8.pb.gz", "gospy", None, "process_cpu", "my", "raw"),
    ("req_2.pprof", "gospy", "req_2.st.json", "goroutines", "runtime.gopark", "multipart"),
    ("req_3.pprof", "gospy", "req_3.st.json", "block", "sync.(*WaitGroup).Wait", "multipart"),
    ("req_4.pprof", "gospy", "req_4.st.json", "mutex", "sync.(*Mutex).Unlock", "multipart"),
    ("req_5.pprof", "gospy", "req_5.st.json", "memory", "compress/flate.NewWriter", "multipart"),
]


def _case_id(case) -> str:  # type: ignore[no-untyped-def]
    return f"{case[0]}-{case[5]}"


def plausible_time(p: profile_pb2.Profile) -> bool:
    # Pyroscope replaces time_nanos that are 0 or in 1970 (old agents wrote microseconds).
    return time.gmtime(p.time_nanos / 1e9).tm_year > 1970


def upload_case(client: httpx.Client, case, app: str) -> profile_pb2.Profile:  # type: ignore[no-untyped-def]
    file, spy, stc, _, _, how = case
    path = shared_fixture(f"{PPROF}/{file}")
    data = path.read_bytes()
    name = f"{app}{{env=conformance,fixture={file}}}"
    if how == "raw":
        ingest(client, name, spy=spy, content=data)
    elif how == "gzip-header":
        plain = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        ingest(
            client,
            name,
            spy=spy,
            content=gzip.compress(plain),
            headers={"Content-Encoding": "gzip"},
        )
    elif how == "multipart":
        files = {"profile": ("profile.pprof", data, "application/octet-stream")}
        if stc:
            cfg = shared_fixture(f"{PPROF}/{stc}").read_bytes()
            files["sample_type_config"] = ("sample_type_config.json", cfg, "application/json")
        # Pyroscope SDKs send multipart without format=pprof.
        ingest(client, name, fmt="", spy=spy, files=files)
    else:  # pragma: no cover
        raise AssertionError(how)
    return load_profile(path)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_pprof_fixture(client: httpx.Client, case) -> None:  # type: ignore[no-untyped-def]
    file, spy, _, metric, known_fn, how = case
    app = "conf." + file.replace(".", "_").replace("-", "_") + "." + how.replace("-", "_")
    profile = upload_case(client, case, app)
    sel = f'{{service_name="{app}"}}'
    types = sample_types(profile)
    ptype, punit = period_type(profile)
    sums = totals(profile)
    if spy == "dotnetspy":
        # Pyroscope's fixSampleTypes: old .NET agents wrote "alloc-samples"; "-" becomes "_".
        types = [(st.replace("-", "_"), su) for st, su in types]
    ids = profile_type_ids(client)
    assert any(sums), f"{file} has no data at all"
    seen_names: set = set()
    for i, ((st, su), total) in enumerate(zip(types, sums)):
        type_id = f"{metric}:{st}:{su}:{ptype}:{punit}"
        fg = flame(client, type_id, sel)
        assert fg.total == total, f"{file}: {type_id} total {fg.total} != {total}"
        if not total:
            continue  # an all-zero sample type holds no samples
        assert type_id in ids, f"{file}: {type_id} not in ProfileTypes {sorted(ids)}"
        assert fg.root_total() == total
        # Every leaf function's self value, as in the fixture.
        assert fg.self_by_name() == leaf_self(profile, i), f"{file}: {type_id} self values"
        seen_names.update(fg.names)
    assert any(known_fn in n for n in seen_names), f"{known_fn!r} not in {sorted(seen_names)[:20]}"

    # The service, its tags and the spy are labels; nothing else leaks into the series.
    assert app in label_values(client, "service_name")
    assert label_values(client, "pyroscope_spy", sel) == [spy]
    assert label_values(client, "fixture", sel) == [file]
    for labels in series_labels(client, sel):
        assert labels["service_name"] == app
        assert labels["env"] == "conformance"
        assert labels["__name__"] == metric
        assert "span_id" not in labels and "profile_id" not in labels

    # The sample time: time_nanos when plausible, else the upload's ``from``.
    st, su = types[sums.index(max(sums))]
    type_id = f"{metric}:{st}:{su}:{ptype}:{punit}"
    at_ms = profile.time_nanos // 1_000_000 if plausible_time(profile) else UPLOAD_FROM_S * 1000
    assert flame(client, type_id, sel, at_ms - 1000, at_ms + 1000).total == max(sums)
    assert flame(client, type_id, sel, at_ms + 1000, at_ms + 60_000).total == 0


def test_go_heap_types_and_numeric_labels(client: httpx.Client) -> None:
    """Go heap: the four memory types with Go's period type; numeric sample labels (``bytes``)
    are not series labels."""
    path = shared_fixture(f"{PPROF}/heap.pb")
    ingest(client, "conf.goheap{}", content=path.read_bytes())
    sel = '{service_name="conf.goheap"}'
    names = label_names(client, sel)
    assert "bytes" not in names
    types = set(label_values(client, "__profile_type__", sel))
    assert types == {
        "memory:alloc_objects:count:space:bytes",
        "memory:alloc_space:bytes:space:bytes",
        "memory:inuse_objects:count:space:bytes",
        "memory:inuse_space:bytes:space:bytes",
    }
    fg = flame(client, "memory:alloc_space:bytes:space:bytes", sel)
    assert fg.total == 13434386318


def test_go_cpu_type_id(client: httpx.Client) -> None:
    path = shared_fixture(f"{PPROF}/cpu.pb.gz")
    ingest(client, "conf.gocpu", content=path.read_bytes())
    sel = '{service_name="conf.gocpu"}'
    assert set(label_values(client, "__profile_type__", sel)) == {
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "process_cpu:samples:count:cpu:nanoseconds",
    }
    assert flame(client, "process_cpu:cpu:nanoseconds:cpu:nanoseconds", sel).total == 470000000
    assert flame(client, "process_cpu:samples:count:cpu:nanoseconds", sel).total == 47


def test_invalid_utf8_is_repaired(client: httpx.Client) -> None:
    path = shared_fixture(f"{PPROF}/invalid_utf8.pb.gz")
    ingest(client, "conf.badutf8", content=path.read_bytes())
    sel = '{service_name="conf.badutf8"}'
    fg = flame(client, "process_cpu:cpu:nanoseconds:cpu:nanoseconds", sel)
    assert fg.total == 1
    assert "my" in fg.names
    # The bad function name is still there, with its valid part, as valid UTF-8.
    bad = [n for n in fg.names if "0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ" in n]
    assert len(bad) == 1 and "\ufffd" in bad[0]
    # The proto response too (protobuf refuses to serialize invalid UTF-8 strings).
    resp = client.post(
        f"{QUERIER}/SelectMergeStacktraces",
        content=querier_pb2.SelectMergeStacktracesRequest(
            profile_typeID="process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            label_selector=sel,
            **wide(),
        ).SerializeToString(),
        headers={"content-type": "application/proto"},
    )
    assert resp.status_code == 200, resp.text
    msg = querier_pb2.SelectMergeStacktracesResponse.FromString(resp.content)
    assert msg.flamegraph.total == 1
    assert "my" in list(msg.flamegraph.names)


def test_dotnet_sample_type_config_display_names(client: httpx.Client) -> None:
    """The .st.json ``display-name`` takes part in choosing ``__name__`` only: the sample types
    themselves keep their names (``alloc_samples``), so nothing is renamed to ``alloc_objects``."""
    prof = shared_fixture(f"{PPROF}/dotnet-pprof-211.pb.gz").read_bytes()
    cfg = shared_fixture(f"{PPROF}/dotnet-pprof-211.st.json").read_bytes()
    files = {"profile": ("p", prof), "sample_type_config": ("c", cfg)}
    ingest(client, "conf.dotnet{}", fmt="", spy="dotnetspy", files=files)
    sel = '{service_name="conf.dotnet"}'
    types = set(label_values(client, "__profile_type__", sel))
    assert {
        "process_cpu:cpu:nanoseconds::nanoseconds",
        "process_cpu:alloc_samples:count::nanoseconds",
        "process_cpu:alloc_size:bytes::nanoseconds",
    } <= types
    assert flame(client, "process_cpu:alloc_size:bytes::nanoseconds", sel).total == 56064
    assert flame(client, "process_cpu:cpu:nanoseconds::nanoseconds", sel).total == 3213000000


def test_sample_type_config_picks_metric_name(client: httpx.Client) -> None:
    """req_3 (Go block profile: contentions/delay) is only recognisable as ``block`` through the
    display names of its sample_type_config (without one it is ``mutex``: see
    test_default_sample_type_mapping)."""
    prof = shared_fixture(f"{PPROF}/req_3.pprof").read_bytes()
    cfg = shared_fixture(f"{PPROF}/req_3.st.json").read_bytes()
    ingest(
        client,
        "conf.block.with",
        fmt="",
        files={"profile": ("p", prof), "sample_type_config": ("c", cfg)},
    )
    with_cfg = label_values(client, "__name__", '{service_name="conf.block.with"}')
    assert with_cfg == ["block"]
    fg = flame(
        client, "block:delay:nanoseconds:contentions:count", '{service_name="conf.block.with"}'
    )
    assert fg.total == 22674240703


# -- span ids (exemplars) --------------------------------------------------------------------


def test_span_ids_kept_per_sample_not_series(client: httpx.Client) -> None:
    path = shared_fixture(f"{PPROF}/cpu-exemplars.pb.gz")
    profile = load_profile(path)
    s = strings(profile)
    per_span: Dict[str, int] = collections.Counter()
    series_label_values: Dict[str, set] = collections.defaultdict(set)
    cpu_index = [t for t, _ in sample_types(profile)].index("cpu")
    for sample in profile.sample:
        for label in sample.label:
            key, value = s[label.key], s[label.str]
            if key == "profile_id":
                per_span[value] += sample.value[cpu_index]
            else:
                series_label_values[key].add(value)
    assert len(per_span) > 2
    ingest(client, "conf.exemplars", content=path.read_bytes())
    sel = '{service_name="conf.exemplars"}'
    cpu = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"

    # Not series labels...
    names = label_names(client, sel)
    assert "span_id" not in names and "profile_id" not in names
    for labels in series_labels(client, sel):
        assert "span_id" not in labels and "profile_id" not in labels
    # ... while the other string sample labels (foo, function) are.
    for key, values in series_label_values.items():
        assert key in names
        assert set(label_values(client, key, sel)) == values
    # The number of series: one per distinct (foo, function) combination and profile type.
    combos = {
        tuple(sorted((s[lb.key], s[lb.str]) for lb in smp.label if s[lb.key] != "profile_id"))
        for smp in profile.sample
    }
    cpu_series = [x for x in series_labels(client, sel) if x["__type__"] == "cpu"]
    assert len(cpu_series) == len(combos)

    # Per sample: a span's flame graph holds exactly that span's samples.
    spans = sorted(per_span, key=per_span.get, reverse=True)
    one, two = spans[0], spans[-1]
    for chosen in ([one], [two], [one, two]):
        expected = sum(per_span[x] for x in chosen)
        msg = call(
            client,
            "SelectMergeSpanProfile",
            {"profileTypeID": cpu, "labelSelector": sel, "spanSelector": chosen, **wide()},
        )
        assert Flame(msg).total == expected, chosen
        assert flame(client, cpu, sel, spanSelector=chosen).total == expected
    # All samples, with and without a span id.
    assert flame(client, cpu, sel).total == totals(profile)[cpu_index]
    unknown = call(
        client,
        "SelectMergeSpanProfile",
        {
            "profileTypeID": cpu,
            "labelSelector": sel,
            "spanSelector": ["00000000deadbeef"],
            **wide(),
        },
    )
    assert Flame(unknown).total == 0


# -- folded, lines, speedscope ---------------------------------------------------------------


def test_folded_upload(client: httpx.Client) -> None:
    body = b"main;handler;parse 30\nmain;handler;render 12\nmain;idle 8\n"
    ingest(
        client,
        "conf.folded.cpu{region=eu}",
        fmt="folded",
        spy="ebpfspy",
        content=body,
        extra={"sampleRate": "100"},
    )
    sel = '{service_name="conf.folded"}'
    fg = flame(client, "process_cpu:cpu:nanoseconds:cpu:nanoseconds", sel)
    period = 1_000_000_000 // 100
    assert fg.total == 50 * period
    assert fg.self_by_name() == {"parse": 30 * period, "render": 12 * period, "idle": 8 * period}
    assert label_values(client, "region", sel) == ["eu"]
    assert (
        flame(
            client,
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            sel,
            UPLOAD_FROM_S * 1000,
            UPLOAD_FROM_S * 1000 + 1,
        ).total
        == 50 * period
    )


def test_a_service_named_in_the_tags_keeps_the_app_name(client: httpx.Client) -> None:
    # As Pyroscope's ingest adapter: service_name from the tags, the app's name in app_name.
    ingest(client, "conf.named.cpu{service_name=conf-svc}", fmt="folded", content=b"main 3\n")
    assert label_values(client, "app_name", '{service_name="conf-svc"}') == ["conf.named"]
    ingest(client, "conf.unnamed.cpu", fmt="folded", content=b"main 3\n")
    assert label_values(client, "app_name", '{service_name="conf.unnamed"}') == []


def test_lines_upload(client: httpx.Client) -> None:
    body = b"main;work\nmain;work\nmain;work;inner\nmain\n"
    ingest(client, "conf.lines.cpu", fmt="lines", content=body, extra={"sampleRate": "50"})
    fg = flame(client, "process_cpu:cpu:nanoseconds:cpu:nanoseconds", '{service_name="conf.lines"}')
    period = 1_000_000_000 // 50
    assert fg.total == 4 * period
    assert fg.self_by_name() == {"work": 2 * period, "inner": period, "main": period}


def _speedscope_expected(doc: dict) -> Dict[str, Dict[Tuple[str, ...], float]]:
    """Per profile name: root-first stack -> weight, computed from the speedscope file."""
    frames = [f["name"] for f in doc["shared"]["frames"]]
    out: Dict[str, Dict[Tuple[str, ...], float]] = collections.defaultdict(collections.Counter)
    for prof in doc["profiles"]:
        acc = out[prof["name"]]
        if prof["type"] == "sampled":
            for sample, weight in zip(prof["samples"], prof["weights"]):
                acc[tuple(frames[i] for i in sample)] += weight
        else:
            stack: List[int] = []
            last = prof["startValue"]
            for ev in prof["events"]:
                if stack and ev["at"] > last:
                    acc[tuple(frames[i] for i in stack)] += ev["at"] - last
                last = ev["at"]
                if ev["type"] == "O":
                    stack.append(ev["frame"])
                else:
                    stack.pop()
    return out


def _self(stacks: Dict[Tuple[str, ...], float], scale: int) -> Dict[str, int]:
    out: Dict[str, int] = collections.Counter()
    for stack, weight in stacks.items():
        out[stack[-1]] += int(weight * scale)
    return {k: v for k, v in out.items() if v}


@pytest.mark.parametrize(
    "file,type_id,scale",
    [
        # unit seconds: weights are durations, stored as nanoseconds of wall time
        ("two-sampled.speedscope.json", "wall:wall:nanoseconds:cpu:nanoseconds", 10**9),
        ("duplicates.speedscope.json", "wall:wall:nanoseconds:cpu:nanoseconds", 10**9),
        # unit bytes
        ("two-sampled-bytes.speedscope.json", "memory:samples:bytes::", 1),
        # unit none: samples, each worth one period at the default 100 Hz
        ("simple.speedscope.json", "process_cpu:cpu:nanoseconds:cpu:nanoseconds", 10**7),
    ],
)
def test_speedscope_upload(client: httpx.Client, file: str, type_id: str, scale: int) -> None:
    path = shared_fixture(f"{SPEEDSCOPE}/{file}")
    app = "conf.ss." + file.split(".")[0]
    ingest(client, app, fmt="speedscope", spy="", content=path.read_bytes())
    expected = _speedscope_expected(json.loads(path.read_bytes()))
    sel = f'{{service_name="{app}"}}'
    assert type_id in set(label_values(client, "__profile_type__", sel))
    everything: Dict[Tuple[str, ...], float] = collections.Counter()
    for name, stacks in expected.items():
        everything.update(stacks)
        by_name = f'{{service_name="{app}",profile_name="{name}"}}'
        fg = flame(client, type_id, by_name)
        assert fg.total == int(sum(stacks.values()) * scale), name
        assert fg.self_by_name() == _self(stacks, scale)
    fg = flame(client, type_id, sel)
    assert fg.total == int(sum(everything.values()) * scale)
    assert set(label_values(client, "profile_name", sel)) == set(expected)


# -- push API --------------------------------------------------------------------------------


def test_push_proto_gzip(client: httpx.Client) -> None:
    path = shared_fixture(f"{PPROF}/cpu.pb.gz")
    profile = load_profile(path)
    req = push_pb2.PushRequest()
    series = req.series.add()
    for k, v in (("__name__", "process_cpu"), ("service_name", "conf.push.proto"), ("env", "p")):
        series.labels.add(name=k, value=v)
    series.samples.add(raw_profile=path.read_bytes(), ID="3f1b6a0e-1111-2222-3333-444455556666")
    resp = client.post(
        "/push.v1.PusherService/Push",
        content=gzip.compress(req.SerializeToString()),
        headers={"content-type": "application/proto", "content-encoding": "gzip"},
    )
    assert resp.status_code == 200, resp.text
    push_pb2.PushResponse.FromString(resp.content)
    sel = '{service_name="conf.push.proto"}'
    sums = totals(profile)
    for (st, su), total in zip(sample_types(profile), sums):
        fg = flame(client, f"process_cpu:{st}:{su}:cpu:nanoseconds", sel)
        assert fg.total == total
    fg = flame(client, "process_cpu:cpu:nanoseconds:cpu:nanoseconds", sel)
    assert fg.self_by_name() == leaf_self(profile, 1)
    assert label_values(client, "env", sel) == ["p"]
    # The profile's own time_nanos is kept (2021-04-25).
    at_ms = profile.time_nanos // 1_000_000
    assert (
        flame(
            client, "process_cpu:cpu:nanoseconds:cpu:nanoseconds", sel, at_ms - 1, at_ms + 1
        ).total
        == sums[1]
    )


def test_push_json(client: httpx.Client) -> None:
    path = shared_fixture(f"{PPROF}/heap.pb.gz")
    profile = load_profile(path)
    body = {
        "series": [
            {
                "labels": [{"name": "service_name", "value": "conf.push.json"}],
                "samples": [{"rawProfile": base64.b64encode(path.read_bytes()).decode()}],
            }
        ]
    }
    resp = client.post(
        "/push.v1.PusherService/Push",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {}
    sel = '{service_name="conf.push.json"}'
    # No __name__ sent: derived from the sample types, as for /ingest.
    assert label_values(client, "__name__", sel) == ["memory"]
    for (st, su), total in zip(sample_types(profile), totals(profile)):
        assert flame(client, f"memory:{st}:{su}:space:bytes", sel).total == total


def test_push_requires_service_name(client: httpx.Client) -> None:
    req = push_pb2.PushRequest()
    req.series.add().labels.add(name="env", value="x")
    resp = client.post(
        "/push.v1.PusherService/Push",
        content=req.SerializeToString(),
        headers={"content-type": "application/proto"},
    )
    assert resp.status_code == 400
    assert resp.json()["code"] == "invalid_argument"


def test_profile_types_response_fields(client: httpx.Client) -> None:
    path = shared_fixture(f"{PPROF}/nodejs-wall.pb.gz")
    ingest(client, "conf.fields", spy="nodespy", content=path.read_bytes())
    msg = call(client, "ProfileTypes", wide())
    by_id = {t["ID"]: t for t in msg["profileTypes"]}
    t = by_id["wall:wall:microseconds:wall:microseconds"]
    assert t["name"] == "wall"
    assert t["sampleType"] == "wall" and t["sampleUnit"] == "microseconds"
    assert t["periodType"] == "wall" and t["periodUnit"] == "microseconds"


@pytest.mark.parametrize(
    "file,spy,metric",
    [
        ("req_2.pprof", "gospy", "goroutines"),  # goroutine -> display name goroutines
        ("req_3.pprof", "gospy", "mutex"),  # contentions -> mutex_count
        ("req_4.pprof", "gospy", "mutex"),
        ("pyspy-1.pb.gz", "pyspy", "process_cpu"),  # samples -> cpu
        ("heap.pb.gz", "gospy", "memory"),
    ],
)
def test_default_sample_type_mapping(
    client: httpx.Client, file: str, spy: str, metric: str
) -> None:
    """Without a sample_type_config Pyroscope names the profile with its default mapping
    (pkg/og/storage/tree.DefaultSampleTypeMapping: samples->cpu, goroutine->goroutines,
    contentions->mutex_count, delay->mutex_duration)."""
    path = shared_fixture(f"{PPROF}/{file}")
    app = "conf.default." + file.split(".")[0].replace("-", "_")
    ingest(client, app, spy=spy, content=path.read_bytes())
    assert label_values(client, "__name__", f'{{service_name="{app}"}}') == [metric]


def test_dotnet_sample_type_names_fixed(client: httpx.Client) -> None:
    """Pyroscope's ``fixSampleTypes`` for dotnetspy: old .NET agents named sample types
    ``alloc-samples``/``alloc-size``; ``-`` becomes ``_`` so they match newer agents."""
    path = shared_fixture(f"{PPROF}/dotnet-pprof-73.pb.gz")
    ingest(client, "conf.dotnet73", spy="dotnetspy", content=path.read_bytes())
    sel = '{service_name="conf.dotnet73"}'
    assert set(label_values(client, "__type__", sel)) >= {"cpu", "alloc_samples", "alloc_size"}
    assert not [t for t in label_values(client, "__type__", sel) if "-" in t]
    assert flame(client, "process_cpu:alloc_size:bytes::nanoseconds", sel).total == 60192


def test_dotnet_broken_function_ids_repaired(client: httpx.Client) -> None:
    """dotnet-pprof-3 has every function with id 0 while its locations refer to functions
    1..n: Pyroscope's FixFunctionIDForBrokenDotnet gives function i the id of location i."""
    path = shared_fixture(f"{PPROF}/dotnet-pprof-3.pb.gz")
    profile = load_profile(path)
    assert all(f.id == 0 for f in profile.function)
    assert len(profile.function) == len(profile.location)
    s = strings(profile)
    expected = {s[f.name] for f in profile.function}
    ingest(client, "conf.dotnet3", spy="dotnetspy", content=path.read_bytes())
    fg = flame(client, "process_cpu:cpu:nanoseconds::nanoseconds", '{service_name="conf.dotnet3"}')
    assert fg.total == 5653000000
    assert "unknown" not in fg.names
    assert set(fg.names) - {"total"} == expected
