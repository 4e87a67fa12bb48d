"""JFR ingest: the Pyroscope Java SDK's ``format=jfr`` uploads.

* Conformance: Pyroscope's two JFR fixtures (async-profiler recordings of a Kafka broker) parse
  to exactly the profiles and stack totals of their expected JSON.
* A real server on 127.0.0.1 receives them as the Java SDK sends them (OkHttp multipart, chunked,
  gzip'd parts) and answers the querier and render APIs with those totals.
* Recordings written here to the format's specification cover what the fixtures do not: context
  labels from the ``labels`` part, wall-clock mode, several chunks, uncompressed integers.
* Truncated, corrupted and hostile input is a clear 400 (JfrError), quickly, never a 500.
* Every test of the reader runs twice: through the Python reader (the reference) and the C
  one (hotspan._speedups._jfr, what the server runs when it is built).
"""

from __future__ import annotations

import collections
import functools
import gzip
import json
import random
import struct
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import httpx
import pytest

from hotspan.formats import jfr_profiles as jp
from hotspan.formats.errors import FormatError
from hotspan.formats.jfr import MAX_VALUES, JfrError, Recording
from hotspan.formats.proto import jfr_labels_pb2, profile_pb2, querier_pb2
from hotspan.model.profile import IngestBatch
from tests.conftest import RunningServer, shared_fixture
from tests.helpers import CPU, QUERIER, flamegraph, function_totals

JFR_DIR = "og/convert/jfr/testdata"
FIXTURES = ("cortex-dev-01__kafka-0__cpu__0", "cortex-dev-01__kafka-0__cpu_lock0_alloc0__0")
T0 = 1_700_000_000
PERIOD = 10_000_000  # 100 Hz

# The expected JSON's keys (Pyroscope's legacy names) -> hotspan/Pyroscope profile type ids.
LEGACY_TYPES = {
    "cpu": CPU,
    "itimer": CPU,
    "wall": "wall:wall:nanoseconds:wall:nanoseconds",
    "alloc_in_new_tlab_objects": "memory:alloc_in_new_tlab_objects:count:space:bytes",
    "alloc_in_new_tlab_bytes": "memory:alloc_in_new_tlab_bytes:bytes:space:bytes",
    "alloc_outside_tlab_objects": "memory:alloc_outside_tlab_objects:count:space:bytes",
    "alloc_outside_tlab_bytes": "memory:alloc_outside_tlab_bytes:bytes:space:bytes",
    "lock_count": "mutex:contentions:count:mutex:count",
    "lock_duration": "mutex:delay:nanoseconds:mutex:count",
    "thread_park_count": "block:contentions:count:block:count",
    "thread_park_duration": "block:delay:nanoseconds:block:count",
    "live": "memory:live:count:objects:count",
}
_SCALED = {"cpu", "itimer", "wall"}  # the JSON counts samples; profiles hold nanoseconds

Parse = Callable[..., jp.JfrProfiles]


@pytest.fixture(params=["python", "c"])
def parse(request: pytest.FixtureRequest) -> Parse:
    """jfr_profiles' profiles of a recording, by the Python reader or the C one."""
    native = request.param == "c"
    if native and jp._fast is None:
        pytest.skip(
            "the C extension hotspan._speedups._jfr is not built (or HOTSPAN_NO_SPEEDUPS is set)"
        )

    def run(data: bytes, sample_rate: int = 100, max_values: int = MAX_VALUES) -> jp.JfrProfiles:
        return jp.decode(data, sample_rate, max_values, native=native).profiles()

    return run


def fixture_bytes(name: str, ext: str) -> bytes:
    return gzip.decompress(shared_fixture(f"{JFR_DIR}/{name}.{ext}.gz").read_bytes())


def expected_stacks(name: str) -> Dict[str, Dict[str, int]]:
    """The fixture's expected JSON as {legacy type: {"a;b;c": total}}.

    The JSON was made before Pyroscope's JFR parser changed how it merges lambda class names
    (grafana/jfr-parser #28, Jan 2024: ``Foo$$Lambda$12/0x..`` became ``Foo$$Lambda_``, not
    ``Foo$$Lambda$_``); hotspan names them as Pyroscope does today, so the old spelling is
    mapped to the new one.  Every stack and total must still match exactly."""
    out: Dict[str, Dict[str, int]] = {}
    for key, text in json.loads(fixture_bytes(name, "json")).items():
        assert key.startswith("kafka.app.") and key.endswith("{}"), key
        totals: Dict[str, int] = collections.Counter()
        for line in text.strip().splitlines():
            stack, _, value = line.rpartition(" ")
            totals[stack.replace("$$Lambda$_", "$$Lambda_")] += int(value)
        out[key[len("kafka.app.") : -2]] = {s: v for s, v in totals.items() if v}
    return out


def legacy_view(profiles: jp.JfrProfiles) -> Dict[str, Dict[str, int]]:
    """Parsed profiles in the JSON's terms (names, sample counts), as Pyroscope's old test
    compared them."""
    names = {
        jp.IN_TLAB: ("alloc_in_new_tlab_objects", "alloc_in_new_tlab_bytes"),
        jp.OUTSIDE_TLAB: ("alloc_outside_tlab_objects", "alloc_outside_tlab_bytes"),
        jp.LOCK: ("lock_count", "lock_duration"),
        jp.THREAD_PARK: ("thread_park_count", "thread_park_duration"),
        jp.LIVE: ("live",),
        jp.WALL: ("wall",),
        jp.CPU: ("itimer" if profiles.event == "itimer" else "cpu",),
    }
    out: Dict[str, Dict[str, int]] = {}
    for kind, samples in profiles.samples.items():
        for i, legacy in enumerate(names[kind]):
            scale = PERIOD if legacy in _SCALED else 1
            totals: Dict[str, int] = collections.Counter()
            for (stack, *_), values in samples.items():
                totals[";".join(name for name, _ in reversed(stack))] += values[i]
            out[legacy] = {s: v // scale for s, v in totals.items() if v}
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_conformance(name: str, parse: Parse) -> None:
    expected = expected_stacks(name)
    started = time.perf_counter()
    profiles = parse(fixture_bytes(name, "jfr"), 100)
    elapsed = time.perf_counter() - started
    assert profiles.event == "cpu"
    got = legacy_view(profiles)
    assert sorted(got) == sorted(expected)
    for legacy, stacks in expected.items():
        assert got[legacy] == stacks, legacy
    assert elapsed < 5, f"parsing took {elapsed:.2f}s"


# -- the Java SDK's upload ----------------------------------------------------------------------


def sdk_multipart(jfr: bytes, labels: Optional[bytes]) -> Tuple[Iterator[bytes], Dict[str, str]]:
    """The body and headers OkHttp's MultipartBody writes for the SDK: part ``jfr`` (gzip, no
    content type), part ``labels`` (gzip, application/x-protobuf), lengths unknown so the
    request is chunked."""
    boundary = str(uuid.uuid4())
    parts = [(b'name="jfr"; filename="jfr"', None, gzip.compress(jfr, 1))]
    if labels:
        parts.append((b'name="labels"; filename="labels"', b"application/x-protobuf", labels))
    body = b""
    for disposition, ctype, data in parts:
        body += b"--" + boundary.encode() + b"\r\n"
        body += b"Content-Disposition: form-data; " + disposition + b"\r\n"
        if ctype:
            body += b"Content-Type: " + ctype + b"\r\n"
        body += b"\r\n" + data + b"\r\n"
    body += b"--" + boundary.encode() + b"--\r\n"

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(body), 8192):
            yield body[i : i + 8192]

    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary}",
        "User-Agent": "okhttp/4.12.0",
        "Accept-Encoding": "gzip",
    }
    return chunks(), headers


def sdk_params(app: str, event: str = "cpu") -> Dict[str, str]:
    """The query string of the SDK's ``/ingest`` (PyroscopeExporter.urlForSnapshot)."""
    tags = "otel.scope.name=com.grafana.pyroscope/java,process.runtime.name=OpenJDK Runtime"
    params = {
        "name": f"{app}{{{tags}}}",
        "units": "samples",
        "aggregationType": "sum",
        "from": str(T0),
        "until": str(T0 + 10),
        "spyName": "javaspy",
    }
    if event in ("cpu", "itimer", "wall"):
        params["sampleRate"] = "100"
    params["format"] = "jfr"
    return params


def upload(c: httpx.Client, app: str, jfr: bytes, labels: Optional[bytes] = None) -> httpx.Response:
    content, headers = sdk_multipart(jfr, labels)
    return c.post("/ingest", params=sdk_params(app), content=content, headers=headers)


def merged_stacks(c: httpx.Client, type_id: str, selector: str) -> Dict[str, int]:
    """SelectMergeProfile (protobuf, as Grafana's backend asks) collapsed to "a;b;c" totals."""
    req = querier_pb2.SelectMergeProfileRequest(
        profile_typeID=type_id,
        label_selector=selector,
        start=(T0 - 60) * 1000,
        end=(T0 + 60) * 1000,
    )
    r = c.post(
        f"{QUERIER}/SelectMergeProfile",
        content=req.SerializeToString(),
        headers={"Content-Type": "application/proto"},
    )
    assert r.status_code == 200, r.text
    p = profile_pb2.Profile.FromString(r.content)
    strings = [t.decode() for t in p.string_table]
    fn = {f.id: strings[f.name] for f in p.function}
    loc = {x.id: [fn[line.function_id] for line in x.line] for x in p.location}
    out: Dict[str, int] = collections.Counter()
    for s in p.sample:
        names = [n for lid in reversed(s.location_id) for n in reversed(loc[lid])]
        out[";".join(names)] += s.value[0]
    return {k: v for k, v in out.items() if v}


@pytest.fixture(scope="module")
def client(module_server: RunningServer) -> Iterator[httpx.Client]:
    with module_server.client() as c:
        yield c


@pytest.fixture(scope="module")
def uploaded(client: httpx.Client) -> httpx.Client:
    """Both fixtures uploaded as the SDK does, one app each."""
    for i, name in enumerate(FIXTURES):
        r = upload(client, f"kafka{i}.app", fixture_bytes(name, "jfr"))
        assert r.status_code == 200, r.text
    return client


@pytest.mark.parametrize("index", range(len(FIXTURES)))
def test_sdk_upload_matches_expected_totals(uploaded: httpx.Client, index: int) -> None:
    expected = expected_stacks(FIXTURES[index])
    selector = f'{{service_name="kafka{index}.app"}}'
    r = uploaded.post(
        f"{QUERIER}/ProfileTypes", json={"start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000}
    )
    types = {t["ID"] for t in r.json()["profileTypes"]}
    for legacy, stacks in expected.items():
        type_id = LEGACY_TYPES[legacy]
        assert type_id in types
        scale = PERIOD if legacy in _SCALED else 1
        got = merged_stacks(uploaded, type_id, selector)
        assert got == {s: v * scale for s, v in stacks.items()}, legacy
    # The flame graph Grafana draws, and the series labels Pyroscope gives a JFR upload.
    total = sum(expected["cpu"].values()) * PERIOD
    graph = flamegraph(uploaded, selector, T0 - 60, T0 + 60, CPU)
    assert int(graph["total"]) == total
    assert function_totals(graph)["java/lang/Thread.run"] == PERIOD * sum(
        v for s, v in expected["cpu"].items() if s.startswith("java/lang/Thread.run")
    )
    r = uploaded.post(
        f"{QUERIER}/Series",
        json={"matchers": [selector], "start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000},
    )
    label_sets = [{p["name"]: p["value"] for p in s["labels"]} for s in r.json()["labelsSet"]]
    assert len(label_sets) == len({LEGACY_TYPES[k] for k in expected})
    for labels in label_sets:
        assert labels["jfr_event"] == "cpu"
        assert labels["pyroscope_spy"] == "javaspy"
        assert labels["otel.scope.name"] == "com.grafana.pyroscope/java"
        assert labels["__name__"] in ("process_cpu", "memory", "mutex", "block")


def test_render_api_answers_the_legacy_name(uploaded: httpx.Client) -> None:
    expected = expected_stacks(FIXTURES[0])
    r = uploaded.get(
        "/pyroscope/render",
        params={"query": "kafka0.app.cpu{}", "from": str(T0 - 60), "until": str(T0 + 60)},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["flamebearer"]["numTicks"] == sum(expected["cpu"].values()) * PERIOD
    assert "libc-2.31.so.clock_gettime" in body["flamebearer"]["names"]
    assert ".unknown_Java" in body["flamebearer"]["names"]


def test_bad_uploads_are_clear_400s(client: httpx.Client) -> None:
    c = client
    params = sdk_params("broken.app")
    r = c.post("/ingest", params=params, content=b"definitely not a recording")
    assert r.status_code == 400 and "not a JFR recording" in r.text, r.text
    good = chunk(STACKS, [(EXEC, (1, 0, 0, 0, 0))])
    content, headers = sdk_multipart(good[: len(good) // 2], None)
    r = c.post("/ingest", params=params, content=content, headers=headers)
    assert r.status_code == 400 and "truncated" in r.text, r.text
    content, headers = sdk_multipart(good, b"\xff\xff\xff")
    r = c.post("/ingest", params=params, content=content, headers=headers)
    assert r.status_code == 400 and "LabelsSnapshot" in r.text, r.text
    files = {"profile": ("profile", b"x")}
    r = c.post("/ingest", params=params, files=files)
    assert r.status_code == 400 and "no 'jfr' field" in r.text, r.text
    # A JFR multipart without format=jfr is taken for pprof; the answer says what is missing.
    content, headers = sdk_multipart(b"FLR\x00", None)
    no_format = {k: v for k, v in params.items() if k != "format"}
    r = c.post("/ingest", params=no_format, content=content, headers=headers)
    assert r.status_code == 400 and "format=jfr" in r.text, r.text
    # Nothing of the broken uploads was stored.
    r = c.post(
        f"{QUERIER}/LabelValues",
        json={"name": "service_name", "start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000},
    )
    assert "broken.app" not in r.json().get("names", [])


# -- recordings written here, to the format's specification ------------------------------------


class Enc:
    """JFR integers: LEB128 varints (the compressed-integers feature) or fixed big-endian."""

    def __init__(self, compressed: bool = True) -> None:
        self.compressed = compressed

    def int(self, n: int) -> bytes:
        return varint(n) if self.compressed else struct.pack(">I", n)

    def long(self, n: int) -> bytes:
        if self.compressed:
            return varint(n) if n < 1 << 63 else long9(n)  # JFR's 9th byte holds 8 bits
        return struct.pack(">Q", n)

    def string(self, s: str) -> bytes:
        raw = s.encode()
        return b"\x03" + self.int(len(raw)) + raw

    def event(self, body: bytes) -> bytes:
        """size (including itself) + body; the size padded to 4 bytes as the JDK writes it."""
        size = len(body) + 4
        if self.compressed:
            b = [(size >> s) & 0x7F for s in (0, 7, 14, 21)]
            return bytes([b[0] | 0x80, b[1] | 0x80, b[2] | 0x80, b[3]]) + body
        return struct.pack(">I", size) + body


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append((n & 0x7F) | 0x80)
        n >>= 7


LONG, INT, BOOL, STRING = 1, 2, 3, 4
SYMBOL, CLASS, METHOD, FRAME, TRACE, STATE = 10, 11, 12, 13, 14, 15
EXEC, SETTING, MONITOR, TLAB, LIVE, PARK, WALL_SAMPLE, OTHER = 20, 21, 22, 23, 24, 25, 26, 27
F = Tuple[str, int, bool, bool]  # field: name, type, constant pool, array
TYPES: Dict[int, Tuple[str, Sequence[F]]] = {
    LONG: ("long", ()),
    INT: ("int", ()),
    BOOL: ("boolean", ()),
    STRING: ("java.lang.String", ()),
    SYMBOL: ("jdk.types.Symbol", [("string", STRING, False, False)]),
    CLASS: ("java.lang.Class", [("name", SYMBOL, True, False)]),
    METHOD: ("jdk.types.Method", [("type", CLASS, True, False), ("name", SYMBOL, True, False)]),
    FRAME: (
        "jdk.types.StackFrame",
        [("method", METHOD, True, False), ("lineNumber", INT, False, False)],
    ),
    TRACE: (
        "jdk.types.StackTrace",
        [("truncated", BOOL, False, False), ("frames", FRAME, False, True)],
    ),
    STATE: ("jdk.types.ThreadState", [("name", STRING, False, False)]),
    EXEC: (
        "jdk.ExecutionSample",
        [
            ("startTime", LONG, False, False),
            ("stackTrace", TRACE, True, False),
            ("state", STATE, True, False),
            ("contextId", LONG, False, False),
            ("spanId", LONG, False, False),
            ("spanName", LONG, False, False),
        ],
    ),
    SETTING: (
        "jdk.ActiveSetting",
        [
            ("startTime", LONG, False, False),
            ("name", STRING, False, False),
            ("value", STRING, False, False),
        ],
    ),
    MONITOR: (
        "jdk.JavaMonitorEnter",
        [
            ("startTime", LONG, False, False),
            ("duration", LONG, False, False),
            ("stackTrace", TRACE, True, False),
            ("contextId", LONG, False, False),
        ],
    ),
    TLAB: (
        "jdk.ObjectAllocationInNewTLAB",
        [
            ("startTime", LONG, False, False),
            ("stackTrace", TRACE, True, False),
            ("tlabSize", LONG, False, False),
            ("contextId", LONG, False, False),
        ],
    ),
    LIVE: (
        "profiler.LiveObject",
        [("startTime", LONG, False, False), ("stackTrace", TRACE, True, False)],
    ),
    PARK: (
        "jdk.ThreadPark",
        [
            ("startTime", LONG, False, False),
            ("duration", LONG, False, False),
            ("stackTrace", TRACE, True, False),
        ],
    ),
    WALL_SAMPLE: (
        "profiler.WallClockSample",
        [
            ("startTime", LONG, False, False),
            ("stackTrace", TRACE, True, False),
            ("state", STATE, True, False),
            ("samples", INT, False, False),
        ],
    ),
    OTHER: (
        "custom.Unrelated",
        [("startTime", LONG, False, False), ("note", STRING, False, False)],
    ),
}
Stack = Sequence[Tuple[str, str, int]]  # (class, method, line), leaf first
STATES = ("STATE_RUNNABLE", "STATE_SLEEPING")


def metadata_event(enc: Enc, types: Dict[int, Tuple[str, Sequence[F]]]) -> bytes:
    strings: List[str] = []

    def s(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    def element(name: str, attrs: Dict[str, str], children: Sequence[bytes]) -> bytes:
        out = enc.int(s(name)) + enc.int(len(attrs))
        for k, v in attrs.items():
            out += enc.int(s(k)) + enc.int(s(v))
        return out + enc.int(len(children)) + b"".join(children)

    classes = []
    for type_id, (name, fields) in types.items():
        kids = []
        for fname, ftype, cp, array in fields:
            attrs = {"name": fname, "class": str(ftype)}
            if cp:
                attrs["constantPool"] = "true"
            if array:
                attrs["dimension"] = "1"
            kids.append(element("field", attrs, []))
        classes.append(element("class", {"id": str(type_id), "name": name}, kids))
    root = element(
        "root", {}, [element("metadata", {}, classes), element("region", {"locale": "en"}, [])]
    )
    head = enc.long(0) + enc.long(0) + enc.long(0) + enc.long(1)
    table = enc.int(len(strings)) + b"".join(enc.string(x) for x in strings)
    return enc.event(head + table + root)


def long9(n: int) -> bytes:
    """A long in JFR's longest varint form (8 x 7 bits, then 8): any 64-bit pattern."""
    n &= (1 << 64) - 1
    return bytes([((n >> (7 * i)) & 0x7F) | 0x80 for i in range(8)] + [(n >> 56) & 0xFF])


def chunk(
    stacks: Dict[int, Stack],
    events: Sequence[Tuple[int, Sequence[object]]],
    enc: Optional[Enc] = None,
    setting: Optional[str] = "cpu",
    id_base: int = 1,
    types: Dict[int, Tuple[str, Sequence[F]]] = TYPES,
    cp_delta: int = 0,
    chain_back: bool = False,
    frames_count: Optional[int] = None,
) -> bytes:
    """One chunk: metadata, one constant pool (symbols, classes, methods, stack traces and
    thread states, ids from ``id_base``), the ``event`` setting, then ``events``: (type, field
    values after startTime; a stack as its key in ``stacks``, a state as its index in STATES).

    For hostile input: ``types`` declared in the metadata, the pool's ``cp_delta`` to a previous
    pool, ``chain_back``: an empty pool before it whose chain leads back to it (a loop), and
    ``frames_count`` claimed by every stack trace."""
    enc = enc or Enc()
    symbols: Dict[str, int] = {}
    classes: Dict[str, int] = {}
    methods: Dict[Tuple[str, str], int] = {}
    for frames in stacks.values():
        for cls, meth, _ in frames:
            for text in (cls, meth):
                symbols.setdefault(text, id_base + len(symbols))
            classes.setdefault(cls, id_base + len(classes))
            methods.setdefault((cls, meth), id_base + len(methods))

    def trace(frames: Stack) -> bytes:
        count = len(frames) if frames_count is None else frames_count
        body = b"".join(enc.long(methods[(c, m)]) + enc.int(line) for c, m, line in frames)
        return b"\x00" + enc.int(count) + body

    pools = [
        (SYMBOL, [(i, enc.string(t)) for t, i in symbols.items()]),
        (CLASS, [(i, enc.long(symbols[c])) for c, i in classes.items()]),
        (
            METHOD,
            [(i, enc.long(classes[c]) + enc.long(symbols[m])) for (c, m), i in methods.items()],
        ),
        (TRACE, [(id_base + key, trace(frames)) for key, frames in stacks.items()]),
        (STATE, [(id_base + i, enc.string(name)) for i, name in enumerate(STATES)]),
    ]

    def pool_event(delta: int, entries: Sequence[Tuple[int, list]]) -> bytes:
        delta_bytes = long9(delta) if enc.compressed else enc.long(delta & ((1 << 64) - 1))
        body = enc.long(1) + enc.long(0) + enc.long(0) + delta_bytes + b"\x00"
        body += enc.int(len(entries))
        for type_id, values in entries:
            body += enc.long(type_id) + enc.int(len(values))
            body += b"".join(enc.long(k) + v for k, v in values)
        return enc.event(body)

    meta = metadata_event(enc, types)
    before = b""
    if chain_back:
        size = len(pool_event(0, []))
        before = pool_event(size, [])  # leads forward to the real pool...
        cp_delta = -size  # ...which leads back to it
    cpool = before + pool_event(cp_delta, pools)
    out = b""
    if setting is not None:
        out += enc.event(
            enc.long(SETTING) + enc.long(0) + enc.string("event") + enc.string(setting)
        )
    for type_id, values in events:
        fields = TYPES[type_id][1][1:]
        payload = enc.long(type_id) + enc.long(0)
        for (fname, ftype, _, _), v in zip(fields, values):
            if fname in ("stackTrace", "state"):
                payload += enc.long(id_base + int(v))  # type: ignore[call-overload]
            elif ftype == STRING:
                payload += enc.string(str(v))
            else:
                payload += enc.long(int(v)) if ftype == LONG else enc.int(int(v))  # type: ignore[call-overload]
        out += enc.event(payload)
    size = 68 + len(meta) + len(cpool) + len(out)
    header = b"FLR\x00" + struct.pack(
        ">HHqqqqqqqI",
        2,
        1,
        size,
        68 + len(meta) + len(before),
        68,
        T0 * 10**9,
        10**10,
        0,
        10**9,
        1 if enc.compressed else 0,
    )
    return header + meta + cpool + out


STACKS: Dict[int, Stack] = {
    1: [("app/Cart", "total", 12), ("app/Api", "handle", 40), ("java/lang/Thread", "run", 1)],
    2: [("app/Tax", "rate", 7), ("app/Cart", "total", 14), ("java/lang/Thread", "run", 1)],
    3: [("Foo$$Lambda$12/0x0000000800c01220", "apply", 0), ("java/lang/Thread", "run", 1)],
}


def folded(profiles: jp.JfrProfiles, kind: jp.Kind, column: int = 0) -> Dict[str, int]:
    out: Dict[str, int] = collections.Counter()
    for (stack, *_), values in profiles.samples.get(kind, {}).items():
        out[";".join(n for n, _ in reversed(stack))] += values[column]
    return dict(out)


def test_every_event_kind_of_a_written_recording(parse: Parse) -> None:
    events = [
        (EXEC, (1, 0, 0, 0, 0)),
        (EXEC, (1, 0, 0, 0, 0)),
        (EXEC, (2, 1, 0, 0, 0)),  # sleeping: no cpu
        (OTHER, ("skipped by its size",)),
        (MONITOR, (500, 2, 0)),
        (MONITOR, (700, 2, 0)),
        (TLAB, (3, 4096, 0)),
        (LIVE, (1,)),
        (PARK, (90, 1)),
    ]
    for enc in (Enc(True), Enc(False)):
        p = parse(chunk(STACKS, events, enc), 100)
        assert p.event == "cpu"
        assert folded(p, jp.CPU) == {
            "java/lang/Thread.run;app/Api.handle;app/Cart.total": 2 * PERIOD
        }
        assert jp.WALL not in p.samples
        lock = "java/lang/Thread.run;app/Cart.total;app/Tax.rate"
        assert folded(p, jp.LOCK, 0) == {lock: 2} and folded(p, jp.LOCK, 1) == {lock: 1200}
        assert folded(p, jp.IN_TLAB, 1) == {"java/lang/Thread.run;Foo$$Lambda_.apply": 4096}
        assert folded(p, jp.LIVE) == {"java/lang/Thread.run;app/Api.handle;app/Cart.total": 1}
        assert folded(p, jp.THREAD_PARK, 1) == {
            "java/lang/Thread.run;app/Api.handle;app/Cart.total": 90
        }


def test_a_frame_without_a_line_has_line_0(parse: Parse) -> None:
    """JFR writes an int line number of -1 for a frame without one (a lambda's, a native
    method's): stored as pprof's "no line", 0, not as 4294967295."""
    stacks = {1: [("app/Cart", "total", 2**32 - 1), ("java/lang/Thread", "run", 9)]}
    for enc in (Enc(True), Enc(False)):
        p = parse(chunk(stacks, [(EXEC, (1, 0, 0, 0, 0))], enc), 100)
        [stack] = [stack for (stack, *_) in p.samples[jp.CPU]]
        assert [line for _, line in stack] == [0, 9]


def test_wall_mode_and_wall_clock_samples(parse: Parse) -> None:
    events = [(EXEC, (1, 0, 0, 0, 0)), (EXEC, (2, 1, 0, 0, 0)), (WALL_SAMPLE, (1, 0, 3))]
    p = parse(chunk(STACKS, events, setting="wall"), 100)
    assert p.event == "wall"
    s1 = "java/lang/Thread.run;app/Api.handle;app/Cart.total"
    s2 = "java/lang/Thread.run;app/Cart.total;app/Tax.rate"
    # Every sample counts as wall time; only the running ones as cpu.
    assert folded(p, jp.WALL) == {s1: 4 * PERIOD, s2: PERIOD}
    assert folded(p, jp.CPU) == {s1: 4 * PERIOD}
    labels = jp.series_labels("shop", {"pyroscope_spy": "javaspy", "__x": "y"}, p.event)
    assert labels == {"pyroscope_spy": "javaspy", "jfr_event": "wall", "service_name": "shop"}
    assert jp.series_labels("a", {"service_name": "s"}, "cpu")["app_name"] == "a"


def test_several_chunks_each_with_its_own_pools(parse: Parse) -> None:
    one = chunk(STACKS, [(EXEC, (1, 0, 0, 0, 0))])
    # The second chunk numbers its constants differently, and says itimer.
    two = chunk(
        STACKS, [(EXEC, (1, 0, 0, 0, 0)), (EXEC, (3, 0, 0, 0, 0))], setting="itimer", id_base=50
    )
    p = parse(one + two, 100)
    assert p.event == "itimer"
    assert folded(p, jp.CPU) == {
        "java/lang/Thread.run;app/Api.handle;app/Cart.total": 2 * PERIOD,
        "java/lang/Thread.run;Foo$$Lambda_.apply": PERIOD,
    }
    assert {e.chunk.offset for e in Recording(one + two).events()} == {0, len(one)}


def labels_snapshot() -> bytes:
    snap = jfr_labels_pb2.LabelsSnapshot()
    for i, text in {1: "region", 2: "eu", 3: "us", 4: "GET /cart", 5: "__name__", 6: "x"}.items():
        snap.strings[i] = text
    snap.contexts[1].labels[1] = 2
    snap.contexts[1].labels[5] = 6  # a private name: dropped, as Pyroscope drops it
    snap.contexts[2].labels[1] = 3
    return snap.SerializeToString()


def test_context_labels_and_spans_through_the_server(client: httpx.Client) -> None:
    uploaded = client
    span = 0xA1
    events = [
        (EXEC, (1, 0, 1, span, 4)),
        (EXEC, (1, 0, 1, span, 4)),
        (EXEC, (2, 0, 2, 0, 0)),
        (EXEC, (2, 0, 0, 0, 0)),
        (MONITOR, (300, 1, 2)),
    ]
    r = upload(uploaded, "shop", chunk(STACKS, events), gzip.compress(labels_snapshot()))
    assert r.status_code == 200, r.text
    window = {"start": (T0 - 60) * 1000, "end": (T0 + 60) * 1000}
    eu = flamegraph(uploaded, '{service_name="shop", region="eu"}', T0 - 60, T0 + 60)
    assert function_totals(eu) == {
        "java/lang/Thread.run": 2 * PERIOD,
        "app/Api.handle": 2 * PERIOD,
        "app/Cart.total": 2 * PERIOD,
    }
    us = flamegraph(uploaded, '{service_name="shop", region="us"}', T0 - 60, T0 + 60)
    assert function_totals(us)["app/Tax.rate"] == PERIOD
    everything = flamegraph(uploaded, '{service_name="shop"}', T0 - 60, T0 + 60)
    assert function_totals(everything)["java/lang/Thread.run"] == 4 * PERIOD
    lock = flamegraph(
        uploaded,
        '{service_name="shop", region="us"}',
        T0 - 60,
        T0 + 60,
        "mutex:delay:nanoseconds:mutex:count",
    )
    assert function_totals(lock)["app/Api.handle"] == 300
    r = uploaded.post(
        f"{QUERIER}/LabelValues",
        json={"name": "span_name", "matchers": ['{service_name="shop"}'], **window},
    )
    assert r.json()["names"] == ["GET /cart"]
    r = uploaded.post(
        f"{QUERIER}/LabelNames", json={"matchers": ['{service_name="shop"}'], **window}
    )
    assert "region" in r.json()["names"] and "x" not in r.json()["names"]
    r = uploaded.post(
        f"{QUERIER}/SelectMergeSpanProfile",
        json={
            "profileTypeID": CPU,
            "labelSelector": '{service_name="shop"}',
            "spanSelector": [f"{span:016x}"],
            **window,
        },
    )
    assert r.status_code == 200, r.text
    assert function_totals(r.json()["flamegraph"])["app/Cart.total"] == 2 * PERIOD


def test_labels_resolve_in_batches() -> None:
    """Without a labels part, contexts name nothing; with it, each context is its own series."""
    events = [(EXEC, (1, 0, 1, 0, 0)), (EXEC, (1, 0, 2, 0, 0))]
    data = chunk(STACKS, events)
    bare, labelled = IngestBatch(), IngestBatch()
    jp.ingest(data, b"", bare, "shop", {}, T0 * 10**9, 100, 1 << 20)
    jp.ingest(
        gzip.compress(data), labels_snapshot(), labelled, "shop", {}, T0 * 10**9, 100, 1 << 20
    )
    assert len(bare.series) == 1 and len(labelled.series) == 2
    regions = sorted(dict(s.labels).get("region") for s in labelled.series.values())
    assert regions == ["eu", "us"]


# -- bad input ----------------------------------------------------------------------------------


def parse_or_error(data: bytes, parse: Parse = jp.parse) -> Optional[str]:
    """None if it parses, else the JfrError's message; any other exception fails the test."""
    try:
        parse(data, 100)
    except JfrError as exc:
        return str(exc)
    return None


def test_truncations_are_errors_naming_the_problem(parse: Parse) -> None:
    err = functools.partial(parse_or_error, parse=parse)
    data = chunk(STACKS, [(EXEC, (1, 0, 0, 0, 0)), (TLAB, (3, 4096, 0))])
    for cut in range(0, len(data)):
        message = err(data[:cut])
        assert message, f"a recording cut at {cut} of {len(data)} parsed"
    assert err(data) is None
    assert "not a JFR recording" in err(b"PK\x03\x04 a zip file, say")
    assert "truncated" in err(data[:-5])


def test_corrupt_recordings_fail_cleanly_and_quickly(parse: Parse) -> None:
    """Random byte damage, seeded: every variant parses or raises JfrError, in bounded time."""
    err = functools.partial(parse_or_error, parse=parse)
    rng = random.Random(19)
    small = chunk(STACKS, [(EXEC, (1, 0, 1, 0, 0)), (MONITOR, (5, 2, 0)), (OTHER, ("x",))])
    big = fixture_bytes(FIXTURES[0], "jfr") if (shared := _has_fixtures()) else small
    started = time.perf_counter()
    for base, rounds in ((small, 600), (big, 40 if shared else 0)):
        for _ in range(rounds):
            damaged = bytearray(base)
            for _ in range(rng.randint(1, 4)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            err(bytes(damaged))
    assert time.perf_counter() - started < 10


def _has_fixtures() -> bool:
    try:
        shared_fixture(f"{JFR_DIR}/{FIXTURES[0]}.jfr.gz")
    except pytest.skip.Exception:
        return False
    return True


def test_hostile_structures_are_refused(parse: Parse) -> None:
    err = functools.partial(parse_or_error, parse=parse)
    events = [(EXEC, (1, 0, 0, 0, 0))]
    assert err(chunk(STACKS, events)) is None
    # Constant pools chained in a loop, outside the chunk, or onto a non-pool event.
    assert "chain back" in err(chunk(STACKS, events, chain_back=True))
    assert "outside the chunk" in err(chunk(STACKS, events, cp_delta=10**6))
    meta_len = len(metadata_event(Enc(), TYPES))
    onto_meta = err(chunk(STACKS, events, cp_delta=-meta_len))
    assert "type 0" in onto_meta
    # A type that contains itself inline.
    selfish = dict(TYPES)
    selfish[FRAME] = (
        "jdk.types.StackFrame",
        [("method", METHOD, True, False), ("me", FRAME, False, False)],
    )
    assert "contains itself" in err(chunk(STACKS, events, types=selfish))
    # A stack trace claiming 10^12 frames: refused at once, not looped over.
    started = time.perf_counter()
    assert "runs past the end" in err(chunk(STACKS, events, frames_count=10**12))
    assert time.perf_counter() - started < 1
    # An undeclared type in a pool, and garbage after the last chunk.
    undeclared = dict(TYPES)
    del undeclared[STATE]
    assert "undeclared type" in err(chunk(STACKS, events, types=undeclared))
    good = chunk(STACKS, events)
    assert f"chunk at offset {len(good)}" in err(good + b"trailing garbage" * 8)


def _padded_size(n: int) -> bytes:
    """A size as the JDK writes it: a varint padded to 4 bytes."""
    b = [(n >> s) & 0x7F for s in (0, 7, 14, 21)]
    return bytes([b[0] | 0x80, b[1] | 0x80, b[2] | 0x80, b[3]])


def test_constant_pools_nested_in_each_other_are_refused(parse: Parse) -> None:
    """A pool chain leading into the middle of a pool event already read (each would decode
    the bytes of the ones inside it again: quadratic work) is refused."""
    enc = Enc()
    meta = metadata_event(enc, TYPES)
    pad = 4096

    def pool_head(size: int, delta: int) -> bytes:
        body = enc.long(1) + enc.long(0) + enc.long(0) + long9(delta) + b"\x00" + enc.int(0)
        return _padded_size(size) + body

    head_len = len(pool_head(0, 0))
    inner = pool_head(head_len + pad, 0)  # reaches the end of the chunk...
    outer = pool_head(2 * head_len + pad, head_len)  # ...and so does the pool around it
    size = 68 + len(meta) + len(outer) + len(inner) + pad
    header = b"FLR\x00" + struct.pack(
        ">HHqqqqqqqI", 2, 1, size, 68 + len(meta), 68, T0 * 10**9, 10**10, 0, 10**9, 1
    )
    message = parse_or_error(header + meta + outer + inner + bytes(pad), parse)
    assert message is not None and "overlaps another pool" in message


def test_values_a_recording_may_hold_are_capped(parse: Parse) -> None:
    """Pool values, frames and events cost ~50-300 bytes of memory each, however few bytes they
    took: a recording holding more than the cap is refused, whatever its size, and the cap
    counts every chunk of it."""
    events = [(EXEC, (1, 0, 0, 0, 0))] * 3
    one = chunk(STACKS, events)
    frames = sum(len(f) for f in STACKS.values())
    symbols = len({t for f in STACKS.values() for c, m, _ in f for t in (c, m)})
    classes = len({c for f in STACKS.values() for c, _, _ in f})
    methods = len({(c, m) for f in STACKS.values() for c, m, _ in f})
    pooled = symbols + classes + methods + len(STACKS) + len(STATES)
    needed = pooled + frames + len(events) + 1  # + the ActiveSetting event
    assert parse(one, 100, max_values=needed).samples
    with pytest.raises(JfrError, match=f"more than {needed - 1} constant-pool values"):
        parse(one, 100, max_values=needed - 1)  # the last event is one too many
    with pytest.raises(JfrError, match="constant-pool values"):
        parse(one + one, 100, max_values=2 * needed - 1)  # both chunks count
    assert parse(one + one, 100, max_values=2 * needed).samples


def test_ids_above_2_63_name_negative_snapshot_keys(client: httpx.Client) -> None:
    """contextId, spanId and spanName are unsigned 64-bit; the LabelsSnapshot's keys are int64,
    and Pyroscope looks an id up as int64(id)."""
    context, span_name, span = (1 << 64) - 1, (1 << 64) - 2, (1 << 64) - 3
    snap = jfr_labels_pb2.LabelsSnapshot()
    snap.strings[1], snap.strings[2], snap.strings[-2] = "region", "ap", "GET /big"
    snap.contexts[-1].labels[1] = 2
    events = [(EXEC, (1, 0, context, span, span_name)), (EXEC, (2, 0, 0, 0, 0))]
    r = upload(client, "bigids", chunk(STACKS, events), snap.SerializeToString())
    assert r.status_code == 200, r.text
    ap = flamegraph(
        client, '{service_name="bigids", region="ap", span_name="GET /big"}', T0 - 60, T0 + 60
    )
    assert function_totals(ap) == {
        "java/lang/Thread.run": PERIOD,
        "app/Api.handle": PERIOD,
        "app/Cart.total": PERIOD,
    }
    r = client.post(
        f"{QUERIER}/SelectMergeSpanProfile",
        json={
            "profileTypeID": CPU,
            "labelSelector": '{service_name="bigids"}',
            "spanSelector": [f"{span:016x}"],
            "start": (T0 - 60) * 1000,
            "end": (T0 + 60) * 1000,
        },
    )
    assert r.status_code == 200, r.text
    assert function_totals(r.json()["flamegraph"])["app/Cart.total"] == PERIOD


def test_gzip_bombs_in_either_part_stop_at_the_limit() -> None:
    """Both parts are gunzipped to at most the server's max_decompressed_bytes."""
    limit = 1 << 20
    bomb = gzip.compress(bytes(limit + 1), 9)
    good = chunk(STACKS, [(EXEC, (1, 0, 0, 0, 0))])
    for jfr_part, labels_part in ((bomb, b""), (gzip.compress(good), bomb)):
        with pytest.raises(FormatError, match="larger than the limit"):
            jp.ingest(jfr_part, labels_part, IngestBatch(), "a", {}, T0 * 10**9, 100, limit)


def test_types_nested_too_deep_or_in_themselves_through_arrays_are_refused(parse: Parse) -> None:
    """Whether a type can be read in bounded work depends on the types alone: 32 levels of
    inline types at most, and no type inside itself, inline or through an array."""
    events = [(EXEC, (1, 0, 0, 0, 0))]

    def with_chain(depth: int) -> Dict[int, Tuple[str, Sequence[F]]]:
        types = dict(TYPES)
        for i in range(depth):
            tail: Sequence[F] = [("next", 100 + i + 1, False, False)] if i < depth - 1 else []
            types[100 + i] = (f"custom.Level{i}", [("n", LONG, False, False), *tail])
        name, fields = types[EXEC]
        types[EXEC] = (name, [*fields, ("deep", 100, False, False)])  # after the wanted ones
        return types

    assert parse_or_error(chunk(STACKS, events, types=with_chain(31)), parse) is None
    assert "nest more than 32" in parse_or_error(chunk(STACKS, events, types=with_chain(32)), parse)
    looped = dict(TYPES)
    looped[FRAME] = (
        "jdk.types.StackFrame",
        [("method", METHOD, True, False), ("lineNumber", INT, False, False)]
        + [("callees", FRAME, False, True)],
    )
    assert "contains itself" in parse_or_error(chunk(STACKS, events, types=looped), parse)


# -- the C reader gives the Python reader's profiles --------------------------------------------

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
DATA = Path(__file__).resolve().parent / "data"
needs_c = pytest.mark.skipif(
    jp._fast is None,
    reason="the C extension hotspan._speedups._jfr is not built (or HOTSPAN_NO_SPEEDUPS is set)",
)


def _recordings() -> Dict[str, bytes]:
    """Every recording of the test corpus that needs nothing outside the project: the fuzz
    seeds and crashes (decompressed, without the labels part), and recordings written here."""
    out: Dict[str, bytes] = {}
    for directory in (FUZZ / "corpus" / "jfr", FUZZ / "crashes" / "jfr"):
        for path in sorted(directory.iterdir()):
            data = path.read_bytes()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
            out[f"{directory.parent.name}/{path.name}"] = data.partition(b"\n--labels--\n")[0]
    events = [
        (EXEC, (1, 0, 1, 0xA1, 4)),
        (EXEC, (2, 1, 0, 0, 0)),
        (MONITOR, (500, 2, 2)),
        (TLAB, (3, 4096, 0)),
        (LIVE, (1,)),
        (PARK, (90, 1)),
        (WALL_SAMPLE, (1, 0, 3)),
        (OTHER, ("x",)),
    ]
    for path in sorted(DATA.glob("*.jfr.gz")):
        out[f"data/{path.name}"] = gzip.decompress(path.read_bytes())
    out["written/compressed"] = chunk(STACKS, events)
    out["written/fixed"] = chunk(STACKS, events, Enc(False))
    out["written/wall"] = chunk(STACKS, events, setting="wall")
    out["written/two-chunks"] = chunk(STACKS, events) + chunk(STACKS, events[:3], id_base=9)
    return out


RECORDINGS = _recordings()


def outcome(data: bytes, native: bool) -> object:
    """What a reader makes of a recording: its profiles, or that it refuses it."""
    try:
        p = jp.decode(data, 100, native=native).profiles()
    except JfrError:
        return "refused"
    return (p.event, p.samples)


def assert_same(data: bytes) -> object:
    python, c = outcome(data, False), outcome(data, True)
    assert c == python
    return c


@needs_c
@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_c_reader_gives_the_same_profiles(name: str) -> None:
    assert_same(RECORDINGS[name])


@needs_c
@pytest.mark.parametrize("name", FIXTURES)
def test_c_reader_gives_the_same_profiles_of_the_fixtures(name: str) -> None:
    assert assert_same(fixture_bytes(name, "jfr")) != "refused"


@needs_c
def test_c_reader_agrees_on_damaged_recordings() -> None:
    """Seeded damage (bytes changed, inserted, cut out): both refuse, or both read the same."""
    rng = random.Random(35)
    bases = list(RECORDINGS.values())
    if _has_fixtures():
        bases.append(fixture_bytes(FIXTURES[1], "jfr"))
    refused = read = 0
    for base in bases:
        for _ in range(300 if len(base) < 20_000 else 20):
            damaged = bytearray(base)
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(damaged))
                what = rng.random()
                if what < 0.6:
                    damaged[at] = rng.randrange(256)
                elif what < 0.8:
                    damaged[at:at] = bytes([rng.randrange(256)])
                else:
                    del damaged[at : at + rng.randint(1, 8)]
            if assert_same(bytes(damaged)) == "refused":
                refused += 1
            else:
                read += 1
    assert refused and read  # the damage reaches both outcomes


def batch_view(batch: IngestBatch) -> Tuple[object, ...]:
    cols = batch.columns()
    rows = sorted(
        zip(cols.series_id.tolist(), cols.ts.tolist(), cols.stack_id.tolist(),
            cols.value.tolist(), cols.span_id.tolist())
    )  # fmt: skip
    stacks = batch.new_stacks(set())
    frames = batch.frames_for({f for s in stacks.values() for f in s})
    series = {sid: (info.profile_type.id, info.labels) for sid, info in batch.series.items()}
    return series, rows, stacks, frames


@needs_c
def test_both_readers_fill_the_same_batch() -> None:
    """Series, samples, stacks and frame names: what the store receives is the same."""
    data = RECORDINGS["written/two-chunks"]
    if _has_fixtures():
        data += fixture_bytes(FIXTURES[1], "jfr")
    views = []
    for native in (False, True):
        batch = IngestBatch()
        decoded = jp.decode(data, 100, native=native)
        labels = jp.series_labels("shop", {"env": "prod"}, decoded.event)
        snapshot = jp.parse_labels(labels_snapshot())
        added = jp.to_batch(decoded, batch, labels, T0 * 10**9, snapshot)
        assert added == len(batch)
        views.append(batch_view(batch))
    assert views[0] == views[1]
    assert views[1][1] and views[1][2]


@needs_c
def test_generated_class_names_are_merged_alike() -> None:
    """The C reader merges common lambda names itself and leaves the rest to Python's
    merge_generated_names: every case gives the same names."""
    classes = [
        "Foo$$Lambda$12/0x0000000800c01220",
        "Fib$$Lambda.0x00007ffa600c4da0",
        "X$$Lambda$4/12",
        "X$$Lambda123",
        "A$$Lambda$$Lambda$1/0x1",
        "F$$Lambda$1/2$$Lambda$3/4",
        "I$$Lambda$$1/2",
        "$$Lambda$1/2",
        "B$$Lambda",
        "B$$Lambda$",
        "B$$Lambda$0x",
        "B$$Lambda$1.0x",
        "C$$Lambda$1.0xg",
        "G$$Lambda/ab",
        "H$$Lambda$/0xAB",
        "D$$Lambda$1/2$$EnhancerBySpringCGLIB$$abc",
        "jdk/internal/reflect/GeneratedMethodAccessor31",
        "libzstd-jni-1.5.2-3.so",
        "E$$Lambda$1/0xabc\n",
        "É$$Lambda$1/2",
        "K$$Lambda$1/٣",
        "x" * 4090 + "$$Lambda$1/2",
    ]
    stacks = {i + 1: [(c, "run", 1), ("java/lang/Thread", "run", 1)] for i, c in enumerate(classes)}
    events = [(EXEC, (k, 0, 0, 0, 0)) for k in stacks]
    profiles = assert_same(chunk(stacks, events))
    assert profiles != "refused"
    names = {key[0][0][0] for key in profiles[1][jp.CPU]}  # type: ignore[index]
    assert "Foo$$Lambda_.run" in names and "X$$Lambda_.run" in names


# What the JDK's own tool says of tests/formats/data/jdk17-cpu-alloc-lock-park.jfr.gz
# (`jfr summary`, `jfr print --json`): a recording by OpenJDK 17's recorder (not
# async-profiler) of Work.java with jfr-profile.jfc beside it, 1.2 s, three threads
# computing, allocating, contending for a monitor and parking:
#   java -XX:StartFlightRecording=filename=x.jfr,settings=jfr-profile.jfc Work 1200
JDK_TOTALS = {
    jp.CPU: [31 * PERIOD],  # 31 jdk.ExecutionSample, all STATE_RUNNABLE
    jp.IN_TLAB: [23, 2_959_896],  # count, sum of tlabSize
    jp.OUTSIDE_TLAB: [599, 59_909_584],  # sum of allocationSize
    jp.ALLOC_SAMPLE: [226, 77_804_928],  # sum of weight
    jp.LOCK: [296, 330_618_790],  # jdk.JavaMonitorEnter, durations in ticks (ns here)
    jp.THREAD_PARK: [2010, 1_846_802_970],
}


def test_a_jdk_recording_matches_the_jdks_own_totals(parse: Parse) -> None:
    data = gzip.decompress((DATA / "jdk17-cpu-alloc-lock-park.jfr.gz").read_bytes())
    p = parse(data, 100)
    totals = {
        kind: [sum(v[i] for v in rows.values()) for i in range(len(kind.sample_types))]
        for kind, rows in p.samples.items()
    }
    assert totals == JDK_TOTALS
    assert p.event == ""  # the JDK records no async-profiler ``event`` setting
    frames = {name for rows in p.samples.values() for key in rows for name, _ in key[0]}
    assert "Work.contend" in frames and "Work.lambda$main$1" in frames
