"""The Grafana and Java SDK paths side by side: JFR ingest, TraceQL search and metrics, heatmaps.

Against real ``hotspan server`` processes over 127.0.0.1, each number beside a reference
measured in the same run (read the ratios: these machines are shared and noisy):

1. JFR ingest: the Java SDK's upload (``POST /ingest?format=jfr``, multipart with a gzip'd
   ``jfr`` part, chunked, as OkHttp sends it) from ``bench/loadgen.py``, beside pprof uploads
   carrying the same samples (the recording parsed with ``hotspan.formats.jfr_profiles``,
   written with hotspan's pprof writer): uploads/s and server CPU per upload, jfr / pprof.
   Two recordings: async-profiler's Kafka CPU recording from Pyroscope's test data (when
   ``../shared/fixtures`` has it) and recordings written here to the format's specification
   (so the bench runs without it).
2. TraceQL search on a store of traces loaded through OTLP/HTTP (``bench/traces.py``'s
   generator, the last hour): a query on the SQL path, the same answer through the engine
   (``| count() > 0``), a structural query; median latency, ratio to the SQL path, an A/A row.
3. TraceQL metrics (``/api/metrics/query_range``) over every span of the hour, beside a plain
   ``/api/search`` over the same range: median seconds, spans/s read.
4. ``SelectHeatmap`` beside ``SelectSeries`` (Connect JSON), same range and selector, with
   exemplars (individual and span), on span-labelled CPU profiles of those traces.

    python bench/run.py --only grafana [--quick]
    python bench/grafana.py [--quick]             # the same, JSON on stdout
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import statistics
import struct
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import quote, urlencode

import common
import ingest
import loadgen
import numpy as np
import synth
import traces

_fmt = common.fmt_number
Log = Callable[[str], None]
SEC = 10**9
MS = 10**6
PERIOD_NS = synth.PERIOD_NS  # 100 Hz
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
CONNECT_JSON = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
# What Grafana's backend sends with a Tempo query (pkg/tsdb/tempo): JSON answers.
TEMPO_HEADERS = {"Accept": "application/json", "User-Agent": "Grafana/12.0.0"}
FIXTURE = os.path.join(
    common.REPO_DIR,
    "..",
    "shared",
    "fixtures",
    "pyroscope-testdata",
    "pkg",
    "og",
    "convert",
    "jfr",
    "testdata",
    "cortex-dev-01__kafka-0__cpu__0.jfr.gz",
)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if not a or not b or a != a or b != b:  # zero, None or NaN
        return None
    return round(a / b, 3)


# -- 1. JFR recordings, written to the format's specification ---------------------------------
#
# A chunk: the 68-byte header, a metadata event declaring the types, one constant pool (symbols,
# classes, methods, stack traces, thread states), an ``event`` setting, then one
# jdk.ExecutionSample event per sample, as async-profiler writes a CPU recording.  Integers are
# LEB128 varints (the compressed-integers feature async-profiler uses); an event starts with
# its size as a 4-byte varint (padded, as the JDK writes it).


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(text: str) -> bytes:
    raw = text.encode()
    return b"\x03" + _varint(len(raw)) + raw  # 3: UTF-8 bytes


def _event(body: bytes) -> bytes:
    size = len(body) + 4
    b = [(size >> s) & 0x7F for s in (0, 7, 14, 21)]
    return bytes([b[0] | 0x80, b[1] | 0x80, b[2] | 0x80, b[3]]) + body


_LONG, _INT, _BOOL, _STRING = 1, 2, 3, 4
_SYMBOL, _CLASS, _METHOD, _FRAME, _TRACE, _STATE = 10, 11, 12, 13, 14, 15
_EXEC, _SETTING = 20, 21
# type id -> (name, fields: (name, type, in the constant pool, array))
_TYPES: Dict[int, Tuple[str, Sequence[Tuple[str, int, bool, bool]]]] = {
    _LONG: ("long", ()),
    _INT: ("int", ()),
    _BOOL: ("boolean", ()),
    _STRING: ("java.lang.String", ()),
    _SYMBOL: ("jdk.types.Symbol", [("string", _STRING, False, False)]),
    _CLASS: ("java.lang.Class", [("name", _SYMBOL, True, False)]),
    _METHOD: ("jdk.types.Method", [("type", _CLASS, True, False), ("name", _SYMBOL, True, False)]),
    _FRAME: (
        "jdk.types.StackFrame",
        [("method", _METHOD, True, False), ("lineNumber", _INT, False, False)],
    ),
    _TRACE: (
        "jdk.types.StackTrace",
        [("truncated", _BOOL, False, False), ("frames", _FRAME, False, True)],
    ),
    _STATE: ("jdk.types.ThreadState", [("name", _STRING, False, False)]),
    _EXEC: (
        "jdk.ExecutionSample",
        [
            ("startTime", _LONG, False, False),
            ("stackTrace", _TRACE, True, False),
            ("state", _STATE, True, False),
        ],
    ),
    _SETTING: (
        "jdk.ActiveSetting",
        [
            ("startTime", _LONG, False, False),
            ("name", _STRING, False, False),
            ("value", _STRING, False, False),
        ],
    ),
}


def _metadata() -> bytes:
    strings: Dict[str, int] = {}

    def s(text: str) -> bytes:
        return _varint(strings.setdefault(text, len(strings)))

    def element(name: str, attrs: Dict[str, str], children: Sequence[bytes]) -> bytes:
        out = s(name) + _varint(len(attrs))
        for k, v in attrs.items():
            out += s(k) + s(v)
        return out + _varint(len(children)) + b"".join(children)

    classes = []
    for type_id, (name, fields) in _TYPES.items():
        kids = []
        for fname, ftype, pooled, array in fields:
            attrs = {"name": fname, "class": str(ftype)}
            if pooled:
                attrs["constantPool"] = "true"
            if array:
                attrs["dimension"] = "1"
            kids.append(element("field", attrs, []))
        classes.append(element("class", {"id": str(type_id), "name": name}, kids))
    root = element(
        "root", {}, [element("metadata", {}, classes), element("region", {"locale": "en"}, [])]
    )
    head = _varint(0) + _varint(0) + _varint(0) + _varint(1)  # type 0, start, duration, id
    table = _varint(len(strings)) + b"".join(_string(t) for t in strings)
    return _event(head + table + root)


def write_jfr(
    stacks: Sequence[Sequence[Tuple[str, str, int]]],
    samples: Sequence[int],
    start_ns: int,
    duration_ns: int,
) -> bytes:
    """One chunk of a CPU recording: ``stacks`` as (class, method, line) frames, leaf first;
    one execution sample (thread running) per entry of ``samples`` (an index into stacks)."""
    symbols: Dict[str, int] = {}
    classes: Dict[str, int] = {}
    methods: Dict[Tuple[str, str], int] = {}
    for frames in stacks:
        for cls, meth, _ in frames:
            symbols.setdefault(cls, len(symbols) + 1)
            symbols.setdefault(meth, len(symbols) + 1)
            classes.setdefault(cls, len(classes) + 1)
            methods.setdefault((cls, meth), len(methods) + 1)

    def trace(frames: Sequence[Tuple[str, str, int]]) -> bytes:
        body = b"".join(_varint(methods[(c, m)]) + _varint(line) for c, m, line in frames)
        return b"\x00" + _varint(len(frames)) + body

    pools = [
        (_SYMBOL, [(i, _string(t)) for t, i in symbols.items()]),
        (_CLASS, [(i, _varint(symbols[c])) for c, i in classes.items()]),
        (
            _METHOD,
            [(i, _varint(classes[c]) + _varint(symbols[m])) for (c, m), i in methods.items()],
        ),  # noqa: E501
        (_TRACE, [(i + 1, trace(frames)) for i, frames in enumerate(stacks)]),
        (_STATE, [(1, _string("STATE_RUNNABLE"))]),
    ]
    body = _varint(1) + _varint(0) + _varint(0) + _varint(0) + b"\x00" + _varint(len(pools))
    for type_id, values in pools:
        body += _varint(type_id) + _varint(len(values))
        body += b"".join(_varint(k) + v for k, v in values)
    meta = _metadata()
    cpool = _event(body)
    out = [_event(_varint(_SETTING) + _varint(0) + _string("event") + _string("cpu"))]
    for st in samples:
        out.append(_event(_varint(_EXEC) + _varint(0) + _varint(st + 1) + _varint(1)))
    events = b"".join(out)
    size = 68 + len(meta) + len(cpool) + len(events)
    header = b"FLR\x00" + struct.pack(
        ">HHqqqqqqqI", 2, 1, size, 68 + len(meta), 68, start_ns, duration_ns, 0, 10**9, 1
    )
    return header + meta + cpool + events


def synthetic_recordings(
    n: int, stacks_per_recording: int = 300, samples: int = 1000, seed: int = 19
) -> List[bytes]:
    """``n`` distinct 10 s CPU recordings at 100 Hz shaped like bench/ingest.py's uploads:
    ~300 stacks 38-42 frames deep (bench/synth.py's frames as Java classes and methods), 1,000
    execution samples spread over them (Zipf), a quarter with a few different stacks."""
    rng = np.random.default_rng(seed)
    universe = synth.frame_universe(rng, 6000)
    frames = []
    for name, _, line in universe:
        cls, _, meth = name.rpartition(".")
        frames.append((cls.replace(".", "/") or "Main", meth, line))
    extra = 60
    pool = synth.grow_stacks(rng, stacks_per_recording + extra, len(frames), 38, 42)
    weights = synth.zipf_weights(stacks_per_recording, s=1.0, offset=3.0)
    base_ns = (time.time_ns() // SEC - 3600) * SEC
    out = []
    for i in range(n):
        idx = np.arange(stacks_per_recording)
        if rng.random() < 0.25:
            k = int(rng.integers(3, 15))
            swap = rng.choice(stacks_per_recording, size=k, replace=False)
            idx[swap] = stacks_per_recording + rng.choice(extra, size=k, replace=False)
        stacks = [[frames[f] for f in reversed(pool[j])] for j in idx.tolist()]
        ticks = 1 + rng.multinomial(samples - stacks_per_recording, rng.permutation(weights))
        order = np.repeat(np.arange(stacks_per_recording), ticks)
        rng.shuffle(order)  # events in time order, the stacks interleaved
        out.append(write_jfr(stacks, order.tolist(), base_ns + i * 10 * SEC, 10 * SEC))
    return out


def jfr_to_pprof(jfr: bytes, sample_rate: int = 100) -> Tuple[bytes, Dict[str, int]]:
    """The same samples as pprof: the recording parsed as the server parses it, written with
    hotspan's pprof writer (gzip'd); and what both hold (rows, events' total)."""
    from hotspan.formats import jfr_profiles as jp
    from hotspan.formats.pprof import ProfileBuilder
    from hotspan.model.profile import Frame

    profiles = jp.parse(jfr, sample_rate)
    if set(profiles.samples) != {jp.CPU}:
        raise ValueError(f"expected a CPU-only recording, got {list(profiles.samples)}")
    builder = ProfileBuilder(list(jp.CPU.sample_types), jp.CPU.period, 1_000_000_000 // sample_rate)
    merged: Dict[Any, int] = {}
    for (stack, *_), values in profiles.samples[jp.CPU].items():
        merged[stack] = merged.get(stack, 0) + values[0]
    for stack, value in merged.items():
        builder.add([Frame(name, "", line) for name, line in reversed(stack)], value)
    body = gzip.compress(builder.profile.SerializeToString(), compresslevel=6)
    return body, {"rows": len(merged), "value": sum(merged.values())}


JAVA_TAGS = "otel.scope.name=com.grafana.pyroscope/java,process.runtime.name=OpenJDK Runtime"


def _ingest_path(app: str, ts_s: int, fmt: str) -> str:
    """The query string of the Java SDK's ``/ingest`` (PyroscopeExporter.urlForSnapshot)."""
    params = {
        "name": f"{app}{{{JAVA_TAGS}}}",
        "units": "samples",
        "aggregationType": "sum",
        "from": str(ts_s),
        "until": str(ts_s + 10),
        "spyName": "javaspy",
        "sampleRate": "100",
        "format": fmt,
    }
    return "/ingest?" + urlencode(params, quote_via=quote)


def jfr_request(host: str, port: int, app: str, jfr: bytes, ts_s: int) -> bytes:
    """The SDK's upload as OkHttp writes it: multipart, part ``jfr`` gzip'd with no content
    type, length unknown so the body is chunked (8 KiB chunks)."""
    boundary = str(uuid.uuid4()).encode()
    body = (
        b"--" + boundary + b"\r\n"
        b'Content-Disposition: form-data; name="jfr"; filename="jfr"\r\n\r\n'
        + gzip.compress(jfr, 1)
        + b"\r\n--" + boundary + b"--\r\n"
    )  # fmt: skip
    chunked = (
        b"".join(
            f"{len(body[i : i + 8192]):x}\r\n".encode() + body[i : i + 8192] + b"\r\n"
            for i in range(0, len(body), 8192)
        )
        + b"0\r\n\r\n"
    )
    headers = {
        "Content-Type": f"multipart/form-data; boundary={boundary.decode()}",
        "Transfer-Encoding": "chunked",
        "Accept-Encoding": "gzip",
        "User-Agent": "okhttp/4.12.0",
    }
    return loadgen.request_bytes(
        "POST", host, port, _ingest_path(app, ts_s, "jfr"), chunked, headers
    )


def pprof_request(host: str, port: int, app: str, pprof_gz: bytes, ts_s: int) -> bytes:
    path = _ingest_path(app, ts_s, "pprof")
    return loadgen.post(host, port, path, pprof_gz, "application/octet-stream")


def run_upload_load(
    fmt: str,
    uploads: List[Dict[str, Any]],
    concurrency: int,
    warmup: float,
    duration: float,
    workdir: str,
) -> Dict[str, object]:
    """A fresh server, ``bench/loadgen.py`` pushing ``uploads`` in ``fmt`` for warm-up +
    ``duration`` s; after a graceful stop, what reached the disk."""
    data_dir = tempfile.mkdtemp(prefix=f"grafana-{fmt}-", dir=workdir)
    server = common.Server(data_dir).start()
    out: Dict[str, object] = {"format": fmt}
    try:
        make = jfr_request if fmt == "jfr" else pprof_request
        reqs = [
            (
                make(server.host, server.port, up["app"], up[fmt], up["ts_s"]),
                up["rows"],
                up["events"],
            )  # fmt: skip
            for up in uploads
        ]
        req_file = os.path.join(workdir, f"requests-{fmt}.pickle")
        with open(req_file, "wb") as f:
            pickle.dump(reqs, f)
        load, window = ingest.drive_load(server, req_file, concurrency, warmup, duration)
        os.unlink(req_file)
        ok = int(load["ok"])  # type: ignore[call-overload]
        out.update(
            request_bytes_mean=int(np.mean([len(r[0]) for r in reqs])),
            uploads_ok=ok,
            uploads_per_s=round(ok / duration, 1),
            errors=load["errors"],
            status_counts=load["status"],
            error_examples=load["error_examples"],
            latency_ms=load["latency_ms"],
            server_cpu=window,
            cpu_ms_per_upload=round(window.get("cpu_s", 0.0) * 1000 / ok, 2) if ok else None,
            acked_outside_window=load.get("warmup_ok"),
        )
        out["server_stop"] = server.stop()
        out["server_stderr"] = server.stderr_tail()[-1500:]
        rows, value = common.stored_samples(data_dir)
        # Every upload of a set carries the same total: stored value / total = uploads stored.
        per_upload = uploads[0]["value"]
        acked = ok + int(load.get("warmup_ok") or 0)  # type: ignore[call-overload]
        stored_uploads = value / per_upload
        out["stored"] = {
            "sample_rows": rows,
            "value_sum": value,
            "uploads": round(stored_uploads, 2),
            "acknowledged_before_end": acked,
            # The requests in flight when the window closed land too (at most one per client).
            "complete": acked <= stored_uploads <= acked + concurrency,
        }
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


def in_process(uploads: List[Dict[str, Any]], repeat: int) -> Dict[str, object]:
    """ms per upload in this process, one thread, no HTTP: ``jfr_profiles.ingest`` (gunzip +
    parse + batch) beside ``pprof.parse`` + ``pprof.to_batch`` for the same samples."""
    from hotspan.formats import jfr_profiles as jp
    from hotspan.formats import pprof
    from hotspan.model.profile import IngestBatch

    tags = dict(kv.split("=", 1) for kv in JAVA_TAGS.split(","))
    jfr_gz = [gzip.compress(up["jfr"], 1) for up in uploads]

    def jfr_pass() -> None:
        for body in jfr_gz:
            jp.ingest(body, b"", IngestBatch(), "bench.app", tags, 0, 100, 1 << 28)

    def pprof_pass() -> None:
        labels = {"service_name": "bench.app", **tags}
        for up in uploads:
            pprof.to_batch(pprof.parse(up["pprof"], 1 << 28), IngestBatch(), labels, 0)

    out: Dict[str, object] = {"uploads": len(uploads)}
    for label, fn in (("jfr", jfr_pass), ("pprof", pprof_pass)):
        fn()  # warm
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[f"{label}_ms_per_upload"] = round(statistics.median(times) * 1000 / len(uploads), 3)
    out["ratio"] = _ratio(out["jfr_ms_per_upload"], out["pprof_ms_per_upload"])  # type: ignore[arg-type]
    return out


def _upload_set(name: str, recordings: List[bytes], app: str) -> Dict[str, Any]:
    t0 = time.perf_counter()
    base_s = time.time_ns() // SEC - 3600
    uploads = []
    for i, jfr in enumerate(recordings):
        pprof_gz, info = jfr_to_pprof(jfr)
        uploads.append(
            {
                "app": app,
                "ts_s": base_s + i * 10,
                "jfr": jfr,
                "pprof": pprof_gz,
                "rows": info["rows"],
                "events": info["value"] // PERIOD_NS,
                "value": info["value"],
            }
        )
    return {
        "name": name,
        "uploads": uploads,
        "distinct": len(set(recordings)),
        "jfr_bytes": int(np.mean([len(u["jfr"]) for u in uploads])),
        "jfr_gzip_bytes": int(np.mean([len(gzip.compress(u["jfr"], 1)) for u in uploads])),
        "pprof_gzip_bytes": int(np.mean([len(u["pprof"]) for u in uploads])),
        "pprof_rows": int(np.mean([u["rows"] for u in uploads])),
        "events": int(np.mean([u["events"] for u in uploads])),
        "convert_s": round(time.perf_counter() - t0, 2),
    }


def run_jfr(quick: bool, log: Log) -> Dict[str, object]:
    warmup, duration = (0.5, 3.0) if quick else (2.0, 10.0)
    rounds = 1 if quick else 2
    concurrency = 8
    sets = [_upload_set("synthetic", synthetic_recordings(16 if quick else 64), "bench.app")]
    fixture: Dict[str, object] = {"path": os.path.normpath(FIXTURE)}
    if os.path.exists(FIXTURE):
        with open(FIXTURE, "rb") as f:
            kafka = gzip.decompress(f.read())
        # One recording, sent again and again at other times: the server keeps no state of
        # an upload that would make a repeat cheaper.
        sets.append(_upload_set("kafka fixture", [kafka] * 16, "kafka.app"))
    else:
        fixture["skipped"] = "not found: only the recordings written here are measured"
        log(f"  JFR fixture {fixture['path']} not found: skipped")
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-grafana-jfr-")
    out_sets = []
    try:
        for s in sets:
            uploads = s.pop("uploads")
            s["in_process"] = in_process(uploads[:16], 3 if quick else 5)
            log(f"  JFR {s['name']}: in-process {s['in_process']}")
            runs = []
            for r in range(rounds):
                # Alternated, so that a drift of the machine's load weighs on both alike.
                for fmt in ("jfr", "pprof"):
                    res = run_upload_load(fmt, uploads, concurrency, warmup, duration, workdir)
                    res["round"] = r + 1
                    runs.append(res)
                    log(
                        f"  JFR {s['name']} round {r + 1} {fmt}: {res['uploads_per_s']} "
                        f"uploads/s, {res['cpu_ms_per_upload']} ms CPU/upload, errors "
                        f"{res['errors']}, stored {res['stored']}"  # type: ignore[index]
                    )
            s["runs"] = runs

            def mean(key: str, fmt: str, runs: List[Dict[str, Any]] = runs) -> float:
                vals = [float(r[key]) for r in runs if r["format"] == fmt and r[key]]
                return statistics.mean(vals) if vals else float("nan")

            s["ratios"] = {
                "uploads_per_s": _ratio(
                    mean("uploads_per_s", "jfr"), mean("uploads_per_s", "pprof")
                ),
                "cpu_per_upload": _ratio(
                    mean("cpu_ms_per_upload", "jfr"), mean("cpu_ms_per_upload", "pprof")
                ),
            }
            out_sets.append(s)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {
        "params": {
            "concurrency": concurrency,
            "warmup_s": warmup,
            "duration_s": duration,
            "rounds": rounds,
        },
        "fixture": fixture,
        "sets": out_sets,
    }


# -- 2.-4. a store of traces and span-labelled profiles, the last hour --------------------------

FULL_DATA = {"spans": 280_000, "profile_window_s": 60}
QUICK_DATA = {"spans": 28_000, "profile_window_s": 60}
ROUTE = "/api/checkout"  # a frontend route: ~6 % of the traces


def build_data(params: Dict[str, int], data_dir: str, log: Log) -> Dict[str, Any]:
    """Traces over the hour before now through OTLP/HTTP (``traces.generate``: 8-20 spans,
    8 services, ~2 % failing), then CPU profiles whose samples carry their spans' ids, one
    pprof per service pod and minute (``traces.ProfileGen``) through ``POST /ingest``."""
    t_all = time.perf_counter()
    end_ns = (time.time_ns() // SEC - 30) * SEC
    start_ns = end_ns - 3600 * SEC
    gen_params = dict(traces.FULL, **params, seed=19)
    profiles = traces.ProfileGen(gen_params)
    route_traces: Dict[str, int] = {}  # trace id -> start ns
    failing: Dict[str, int] = {}
    counts = {"traces": 0, "spans": 0, "first_start_ns": end_ns, "last_start_ns": start_ns}

    def on_trace(spans: List[Any]) -> None:
        profiles.add_trace(spans)
        tid, start = spans[0][0].hex(), spans[0][8]
        counts["traces"] += 1
        counts["spans"] += len(spans)
        counts["first_start_ns"] = min(counts["first_start_ns"], min(s[8] for s in spans))
        counts["last_start_ns"] = max(counts["last_start_ns"], max(s[8] for s in spans))
        if dict(spans[0][11]).get("http.route") == ROUTE:
            route_traces[tid] = start
        if any(s[10] == 2 for s in spans):
            failing[tid] = start

    t0 = time.perf_counter()
    bodies = traces.generate(params["spans"], 19, start_ns, end_ns - 10 * SEC, on_trace)
    info: Dict[str, Any] = {"generate_s": round(time.perf_counter() - t0, 1)}
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-grafana-load-")
    server = common.Server(data_dir).start()
    try:
        assert server.otlp_http is not None, "the server has no OTLP/HTTP receiver"
        host, port = server.otlp_http
        n = [traces.SPANS_PER_REQUEST] * len(bodies)
        n[-1] = params["spans"] - traces.SPANS_PER_REQUEST * (len(bodies) - 1)
        requests = [
            (loadgen.post(host, port, "/v1/traces", b, "application/x-protobuf"), c)
            for b, c in zip(bodies, n)
        ]
        log(f"  data: pushing {params['spans']:,} spans ({counts['traces']:,} traces), OTLP/HTTP")
        spec = {"protocol": "http", "mode": "once", "concurrency": 8}
        load = traces.run_load(dict(spec, target=f"{host}:{port}"), requests, workdir)
        if load["errors"] or load["acked_items"] != params["spans"]:
            raise RuntimeError(f"loading the spans failed: {load}")
        info["load_spans_s"] = load["wall_s"]
        uploads = profiles.uploads(server.host, server.port)
        info["profile_uploads"] = len(uploads)
        info["profile_sample_rows"] = sum(c for _, c in uploads)
        log(f"  data: pushing {len(uploads):,} profiles ({info['profile_sample_rows']:,} rows)")
        load = traces.run_load(dict(spec, target=f"{server.host}:{server.port}"), uploads, workdir)
        if load["errors"] or load["acked"] != len(uploads):
            raise RuntimeError(f"loading the profiles failed: {load}")
        info["load_profiles_s"] = load["wall_s"]
    finally:
        info["server_stop"] = server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    info.update(
        counts,
        start_ns=start_ns,
        end_ns=end_ns,
        route_traces=len(route_traces),
        failing_traces=len(failing),
        total_build_s=round(time.perf_counter() - t_all, 1),
    )
    info["_route_ids"] = route_traces
    info["_failing_ids"] = failing
    return info


Check = Callable[[Any], Dict[str, object]]


def time_queries(
    client: common.Client,
    queries: List[Dict[str, Any]],
    runs: int,
    warmups: int,
    budget_s: float,
    log: Log,
) -> Dict[str, Dict[str, Any]]:
    """Every query ``warmups`` times, then timed runs round robin (a drift of the machine's
    load weighs on every query alike) until ``runs`` or, past 3 runs, ``budget_s`` seconds of
    one query's time; the first answer of each is checked."""
    out: Dict[str, Dict[str, Any]] = {}
    for q in queries:
        key = q["key"]
        r = out[key] = {"name": q["name"], "times": [], "skipped": None}
        for i in range(warmups):
            status, body, dt = client.request(q.get("method", "GET"), q["path"], q["headers"],
                                              q.get("body"))  # fmt: skip
            if status != 200:
                r["skipped"] = f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}"
                log(f"  {q['name']}: {r['skipped']}")
                break
            if i == 0:
                r["first_ms"] = round(dt * 1000, 2)
                r["response_bytes"] = len(body)
                r["result"] = q["check"](json.loads(body))
    live = [q for q in queries if not out[q["key"]]["skipped"]]
    for i in range(runs):
        for q in live:
            r = out[q["key"]]
            if i >= 3 and sum(r["times"]) > budget_s:
                continue
            status, body, dt = client.request(q.get("method", "GET"), q["path"], q["headers"],
                                              q.get("body"))  # fmt: skip
            if status != 200:
                raise RuntimeError(f"{q['name']}: HTTP {status}: {body[:300]!r}")
            r["times"].append(dt)
    for q in live:
        r = out[q["key"]]
        times = r.pop("times")
        r.update(common.latency_summary(times))
        shown = {k: v for k, v in r["result"].items() if k[0] != "_"}
        log(f"  {r['name']}: median {r['median_ms']} ms over {r['runs']} runs; {shown}")
    for r in out.values():
        r.pop("times", None)
    return out


def _search_check(expected: Optional[Dict[str, int]]) -> Check:
    """The traces an answer lists; whether each is one the query should find."""

    def check(body: Dict[str, Any]) -> Dict[str, object]:
        ids = [t["traceID"].rjust(32, "0") for t in body.get("traces", [])]
        out: Dict[str, object] = {"traces": len(ids), "_ids": ids}
        m = body.get("metrics", {})
        if "inspectedTraces" in m:
            out["inspected_traces"] = int(m["inspectedTraces"])
        if expected is not None:
            out["all_expected"] = all(i in expected for i in ids)
        return out

    return check


def _metrics_check(per_step: Optional[float]) -> Check:
    """Series, samples, exemplars; for a count (``per_step``: what a sample's value is
    multiplied by to give spans: the step in seconds for rate(), 1 for a histogram's counts)
    the spans counted, to set beside the spans stored."""

    def check(body: Dict[str, Any]) -> Dict[str, object]:
        series = body.get("series", [])
        out: Dict[str, object] = {
            "series": len(series),
            "samples": sum(len(s.get("samples", [])) for s in series),
            "exemplars": sum(len(s.get("exemplars", [])) for s in series),
        }
        if per_step is not None:
            total = sum(x.get("value", 0) for s in series for x in s.get("samples", []))
            out["spans_counted"] = round(total * per_step)
        if body.get("status") == "PARTIAL":  # a bound of the engine was hit: say which
            out["partial"] = body.get("message", "")
        return out

    return check


def _heatmap_check(body: Dict[str, Any]) -> Dict[str, object]:
    series = body.get("series", [])
    slots = [slot for s in series for slot in s.get("slots", [])]
    return {
        "series": len(series),
        "slots": len(slots),
        "counted": sum(int(c) for slot in slots for c in slot.get("counts", [])),
        "exemplars": sum(len(slot.get("exemplars", [])) for slot in slots),
    }


def _series_check(body: Dict[str, Any]) -> Dict[str, object]:
    series = body.get("series", [])
    points = [p for s in series for p in s.get("points", [])]
    return {
        "series": len(series),
        "points": len(points),
        "exemplars": sum(len(p.get("exemplars", [])) for p in points),
    }


def _path(query: str) -> str:
    """Which path the server takes for a TraceQL query: SQL (store.find_traces) or engine."""
    from hotspan.query import traceql

    try:
        return "SQL" if traceql.parse_query(query).simple is not None else "engine"
    except Exception as exc:  # noqa: BLE001 - the server answers the same error
        return f"refused: {exc}"


def trace_queries(data: Dict[str, Any], end_s: int) -> Tuple[List[Dict[str, Any]], ...]:
    start_s = data["start_ns"] // SEC - 60
    rng = {"start": str(start_s), "end": str(end_s)}
    route_ids, failing_ids = data["_route_ids"], data["_failing_ids"]

    def search(key: str, name: str, q: Optional[str], expected: Optional[Dict[str, int]]) -> Dict:
        params = dict(rng, limit="20", spss="3", **({"q": q} if q is not None else {}))
        return {
            "key": key,
            "name": name,
            "q": q,
            "path": "/api/search?" + urlencode(sorted(params.items())),
            "headers": TEMPO_HEADERS,
            "check": _search_check(expected),
        }

    route_q = f'{{span.http.route="{ROUTE}"}}'
    searches = [
        search("sql_route", f"`{route_q}` (SQL path)", route_q, route_ids),
        search("sql_route_again", f"`{route_q}` again (A/A)", route_q, route_ids),
        search("engine_route", f"`{route_q} | count() > 0`", route_q + " | count() > 0", route_ids),
        search("structural", "`{kind=server} >> {status=error}`",
               "{kind=server} >> {status=error}", failing_ids),
    ]  # fmt: skip

    def metrics(key: str, q: str, per_step: Optional[float] = None) -> Dict[str, Any]:
        params = dict(rng, q=q, step="60s", exemplars="100")
        return {
            "key": key,
            "name": f"`{q}`",
            "q": q,
            "path": "/api/metrics/query_range?" + urlencode(sorted(params.items())),
            "headers": TEMPO_HEADERS,
            "check": _metrics_check(per_step),
        }

    metric_queries = [
        search("plain_search", "`/api/search`, no query (SQL, reference)", None, None),
        metrics("rate", "{} | rate()", 60.0),
        metrics(
            "root_rate_by_service", "{nestedSetParent<0} | rate() by (resource.service.name)", 60.0
        ),
        metrics("histogram", "{} | histogram_over_time(duration)", 1.0),
        metrics(
            "quantiles_by_service",
            "{} | quantile_over_time(duration, .5, .9, .99) by (resource.service.name)",
        ),
    ]
    start_ms, end_ms = start_s * 1000, end_s * 1000

    def connect(key: str, name: str, method: str, body: Dict[str, Any], check: Check) -> Dict:
        full = {"profileTypeID": CPU, "labelSelector": "{}", "start": str(start_ms),
                "end": str(end_ms), "step": 60.0, **body}  # fmt: skip
        return {
            "key": key,
            "name": name,
            "method": "POST",
            "path": f"/querier.v1.QuerierService/{method}",
            "headers": CONNECT_JSON,
            "body": json.dumps(full).encode(),
            "check": check,
        }

    profile_queries = [
        connect("series_plain", "`SelectSeries`, no exemplars", "SelectSeries", {}, _series_check),
        connect("series_individual", "`SelectSeries`, `EXEMPLAR_TYPE_INDIVIDUAL`", "SelectSeries",
                {"exemplarType": "EXEMPLAR_TYPE_INDIVIDUAL"}, _series_check),
        connect("heatmap_individual", "`SelectHeatmap` individual, `EXEMPLAR_TYPE_INDIVIDUAL`",
                "SelectHeatmap", {"queryType": "HEATMAP_QUERY_TYPE_INDIVIDUAL",
                                  "exemplarType": "EXEMPLAR_TYPE_INDIVIDUAL"}, _heatmap_check),
        connect("series_span", "`SelectSeries`, `EXEMPLAR_TYPE_SPAN`", "SelectSeries",
                {"exemplarType": "EXEMPLAR_TYPE_SPAN"}, _series_check),
        connect("heatmap_span", "`SelectHeatmap` span, `EXEMPLAR_TYPE_SPAN`", "SelectHeatmap",
                {"queryType": "HEATMAP_QUERY_TYPE_SPAN", "exemplarType": "EXEMPLAR_TYPE_SPAN"},
                _heatmap_check),
    ]  # fmt: skip
    return searches, metric_queries, profile_queries


def run_queries(data_dir: str, data: Dict[str, Any], quick: bool, log: Log) -> Dict[str, object]:
    runs, warmups = (5, 1) if quick else (15, 2)
    budget = 8.0 if quick else 15.0
    end_s = time.time_ns() // SEC + 1
    searches, metric_queries, profile_queries = trace_queries(data, end_s)
    out: Dict[str, object] = {"runs": runs, "warmups": warmups, "budget_s": budget}
    with common.measured_server(data_dir) as (server, info):
        client = common.Client(server.url)
        for label, queries in (
            ("search", searches),
            ("metrics", metric_queries),
            ("profiles", profile_queries),
        ):
            log(f"  {label} queries")
            t0 = time.perf_counter()
            cpu = common.CpuWindow(server.pid)
            cpu.start()
            res = time_queries(client, queries, runs, warmups, budget, log)
            for q in queries:
                if q.get("q") is not None:
                    res[q["key"]]["path"] = _path(q["q"])
            out[label] = res
            out[f"{label}_server_cpu"] = cpu.stop()
            out[f"{label}_s"] = round(time.perf_counter() - t0, 1)
        client.close()
    out["server"] = info
    search = out["search"]
    ids = {k: v.get("result", {}).pop("_ids", None) for k, v in search.items()}  # type: ignore[union-attr]
    for v in out["metrics"].values():  # type: ignore[union-attr]
        v.get("result", {}).pop("_ids", None)
    sql, eng = ids.get("sql_route"), ids.get("engine_route")
    out["same_traces"] = {
        "sql_vs_engine": None if sql is None or eng is None else set(sql) == set(eng),
        "same_order": None if sql is None or eng is None else sql == eng,
        "common": None if sql is None or eng is None else len(set(sql) & set(eng)),
    }
    return out


def _ratios(result: Dict[str, Any], data: Dict[str, Any]) -> Dict[str, object]:
    def med(part: str, key: str) -> Optional[float]:
        r = result.get(part, {}).get(key, {})
        return r.get("median_ms")

    out: Dict[str, object] = {}
    for key in ("sql_route_again", "engine_route", "structural"):
        out[f"search_{key}"] = _ratio(med("search", key), med("search", "sql_route"))
    spans = data["spans"]
    for key in ("rate", "root_rate_by_service", "histogram", "quantiles_by_service"):
        m = med("metrics", key)
        out[f"metrics_{key}"] = _ratio(m, med("metrics", "plain_search"))
        # The root-span query reads the roots alone (its pushdown): no spans/s for it.
        if key != "root_rate_by_service":
            out[f"metrics_{key}_spans_per_s"] = round(spans / (m / 1000)) if m else None
    out["heatmap_individual_over_series"] = _ratio(
        med("profiles", "heatmap_individual"), med("profiles", "series_individual")
    )
    out["heatmap_span_over_series"] = _ratio(
        med("profiles", "heatmap_span"), med("profiles", "series_span")
    )
    out["series_individual_over_plain"] = _ratio(
        med("profiles", "series_individual"), med("profiles", "series_plain")
    )
    out["series_span_over_plain"] = _ratio(
        med("profiles", "series_span"), med("profiles", "series_plain")
    )
    return out


# -- the whole benchmark -----------------------------------------------------------------------


def run(quick: bool = False, log: Log = print) -> Dict[str, object]:
    out: Dict[str, object] = {"quick": quick, "stages_s": {}}
    stages: Dict[str, float] = out["stages_s"]  # type: ignore[assignment]
    t0 = time.perf_counter()
    log("  1. JFR ingest beside pprof")
    out["jfr"] = run_jfr(quick, log)
    stages["jfr"] = round(time.perf_counter() - t0, 1)
    params = QUICK_DATA if quick else FULL_DATA
    data_dir = tempfile.mkdtemp(prefix="hotspan-bench-grafana-data-")
    try:
        t0 = time.perf_counter()
        data = build_data(params, data_dir, log)
        stages["data_set"] = round(time.perf_counter() - t0, 1)
        out["data"] = {"params": params, **{k: v for k, v in data.items() if k[0] != "_"}}
        t0 = time.perf_counter()
        res = run_queries(data_dir, data, quick, log)
        out["queries"] = res
        out["ratios"] = _ratios(res, data)
        stages["queries"] = round(time.perf_counter() - t0, 1)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


def _cell(text: str) -> str:
    """Text for a Markdown table cell: TraceQL's pipes escaped."""
    return text.replace("|", "\\|").replace("\n", " ")


def _value(v: object) -> str:
    return ("yes" if v else "**no**") if isinstance(v, bool) else _fmt(v)


def _row(r: Dict[str, Any], ratio: Optional[float], extra: Optional[str] = None) -> str:
    """One query's table row; ``extra``: a further column (spans/s) when not None."""
    more = "" if extra is None else f" {extra} |"
    if r.get("skipped"):
        return f"| {_cell(r['name'])} | skipped: {_cell(r['skipped'][:200])} | | | |{more} |"
    res = ", ".join(f"{k} {_value(v)}" for k, v in r.get("result", {}).items() if k[0] != "_")
    path = f"{r['path']}; " if r.get("path") else ""
    return (
        f"| {_cell(r['name'])} | {r['median_ms']} | {r['p90_ms']} | {r['runs']} | "
        f"{'' if ratio is None else f'x{ratio}'} |{more} {_cell(path + res)} |"
    )


def markdown(result: Dict[str, Any], command: str, m: Dict[str, Any], wall: float) -> str:
    lines: List[str] = []
    add = lines.append
    lines += common.head(
        "hotspan Grafana benchmark: JFR ingest, TraceQL search and metrics, heatmaps"
        + (" (quick)" if result["quick"] else ""),
        command,
        wall,
        common.machine_text(m, note=common.SHARED_CPUS),
    )
    j = result["jfr"]
    p = j["params"]
    add("")
    add("## 1. JFR ingest beside pprof")
    add("")
    add(
        "The Java SDK's upload: `POST /ingest?name=<app>{otel.scope.name=...}&units=samples&"
        "aggregationType=sum&from=..&until=..&spyName=javaspy&sampleRate=100&format=jfr`, "
        "multipart with the recording gzip'd in part `jfr`, chunked (OkHttp, length unknown). "
        "Beside it, the same samples as pprof: the recording parsed by `jfr_profiles.parse`, "
        "written by hotspan's `ProfileBuilder`, gzip'd, `POST /ingest?...&format=pprof` (raw "
        f"body). `bench/loadgen.py`, {p['concurrency']} in flight, {p['warmup_s']} s warm-up, "
        f"{p['duration_s']} s measured, a fresh server each run, {p['rounds']} round(s) "
        "alternated. Stored: sample value on disk after shutdown / each upload's total = uploads "
        "stored, against those acknowledged (the requests in flight at the end land too)."
    )
    if j["fixture"].get("skipped"):
        add("")
        add(f"Kafka fixture `{j['fixture']['path']}`: {j['fixture']['skipped']}.")
    for s in j["sets"]:
        add("")
        desc = (
            "async-profiler's CPU recording of a Kafka broker (Pyroscope's test data), sent "
            "again and again at other times"
            if s["name"] == "kafka fixture"
            else "10 s CPU recordings at 100 Hz written here to the JFR specification "
            "(bench/synth.py's frames as Java classes, ~300 stacks 38-42 deep, 1,000 "
            "jdk.ExecutionSample events each)"
        )
        add(
            f"**{s['name']}**: {desc}; {s['distinct']} distinct, {_fmt(s['events'])} samples each, "
            f"{_fmt(s['jfr_bytes'])} bytes of JFR ({_fmt(s['jfr_gzip_bytes'])} gzip'd) beside "
            f"{_fmt(s['pprof_gzip_bytes'])} bytes of gzip'd pprof with {s['pprof_rows']} rows."
        )
        add("")
        add(
            "| round | format | uploads/s | p50 ms | p99 ms | errors | server CPU s "
            "| CPU ms/upload | stored = acknowledged |"
        )
        add("|---:|---|---:|---:|---:|---:|---:|---:|---|")
        for r in s["runs"]:
            st = r["stored"]
            ok = (
                "yes"
                if st["complete"]
                else f"**no**: {st['uploads']} vs {st['acknowledged_before_end']}"
            )
            add(
                f"| {r['round']} | {r['format']} | {r['uploads_per_s']} | {r['latency_ms']['p50']} "
                f"| {r['latency_ms']['p99']} | {r['errors']} | {r['server_cpu'].get('cpu_s')} | "
                f"{r['cpu_ms_per_upload']} | {ok} |"
            )
        ip = s["in_process"]
        add("")
        add(
            "Ratios jfr / pprof (means over the rounds): uploads/s "
            f"x{s['ratios']['uploads_per_s']}, "
            f"server CPU per upload x{s['ratios']['cpu_per_upload']}. In-process, one thread, no "
            f"HTTP ({ip['uploads']} uploads): `jfr_profiles.ingest` {ip['jfr_ms_per_upload']} ms "
            f"per upload, `pprof.parse` + `to_batch` {ip['pprof_ms_per_upload']} ms "
            f"(x{ip['ratio']})."
        )
    d = result.get("data")
    q = result.get("queries")
    if d and q:
        add("")
        add("## Data set for 2-4")
        add("")
        add(
            f"{_fmt(d['spans'])} spans in {_fmt(d['traces'])} traces (`bench/traces.py`'s "
            "generator: a frontend request calling 1-5 of 7 services, SQL, Redis and internal "
            "steps, 8-20 spans, ~2 % failing) with start times over the hour before the run, "
            f"pushed over OTLP/HTTP ({d['load_spans_s']} s); {_fmt(d['route_traces'])} traces "
            f"of route `{ROUTE}`, {_fmt(d['failing_traces'])} failing. CPU profiles labelled "
            f"with the spans' ids, one pprof per service pod and minute through `POST /ingest`: "
            f"{_fmt(d['profile_uploads'])} uploads, {_fmt(d['profile_sample_rows'])} sample rows. "
            f"Built fresh in {d['total_build_s']} s. Every query covers the whole hour (start "
            "a minute before the first trace, end at the run's start)."
        )
        add("")
        add(
            f"One keep-alive connection, Grafana's headers; each query {q['warmups']} warm-up(s) "
            f"(the first answer checked), then up to {q['runs']} timed runs round robin over the "
            f"queries of a part (fewer once a query has taken {q['budget_s']} s, at least 3)."
        )
        rt = result["ratios"]
        s = q["search"]
        add("")
        add("## 2. TraceQL search")
        add("")
        add("`GET /api/search?q=...&limit=20&spss=3&start=..&end=..`.")
        add("")
        add("| query | median ms | p90 ms | runs | x SQL path | path; answer |")
        add("|---|---:|---:|---:|---:|---|")
        for key, r in s.items():
            add(_row(r, rt.get(f"search_{key}")))
        same = q["same_traces"]
        add("")
        add(
            f"SQL and engine paths list the same traces: {same['sql_vs_engine']} (in the same "
            f"order: {same['same_order']}; {same['common']} in common). `all_expected`: every "
            "trace listed is one the generator made to match (route, or a failing trace)."
        )
        add("")
        add("## 3. TraceQL metrics")
        add("")
        add(
            "`GET /api/metrics/query_range?q=...&start=..&end=..&step=60s&exemplars=100` over "
            f"every span of the hour ({_fmt(d['spans'])}); spans/s = spans in the range / median. "
            "`spans_counted` (the samples' values times the step, or the histogram's counts) must "
            f"be every span for `{{}}` and every trace's root ({_fmt(d['traces'])}) for "
            "`{nestedSetParent<0}`."
        )
        add("")
        add("| query | median ms | p90 ms | runs | x plain search | spans/s | path; answer |")
        add("|---|---:|---:|---:|---:|---:|---|")
        for key, r in q["metrics"].items():
            sps = rt.get(f"metrics_{key}_spans_per_s")
            add(_row(r, rt.get(f"metrics_{key}"), _fmt(sps) if sps else ""))
        add("")
        add("## 4. SelectHeatmap beside SelectSeries")
        add("")
        add(
            "Connect JSON (`Content-Type: application/json`, `Connect-Protocol-Version: 1`), "
            "`labelSelector: {}`, CPU, the hour, `step: 60`; ratios: heatmap / SelectSeries with "
            "the same exemplars, SelectSeries with exemplars / without. The individual heatmap "
            f"counts each profile once: {_fmt(d['profile_uploads'])} uploads, one profile each."
        )
        add("")
        add("| query | median ms | p90 ms | runs | ratio | answer |")
        add("|---|---:|---:|---:|---:|---|")
        pr = q["profiles"]
        ratio_of = {
            "series_individual": rt.get("series_individual_over_plain"),
            "heatmap_individual": rt.get("heatmap_individual_over_series"),
            "series_span": rt.get("series_span_over_plain"),
            "heatmap_span": rt.get("heatmap_span_over_series"),
        }
        for key, r in pr.items():
            add(_row(r, ratio_of.get(key)))
        add("")
        add(
            "Server CPU per part (s, over the wall time of the part): "
            + ", ".join(
                f"{part} {q[f'{part}_server_cpu'].get('cpu_s')} / {q[f'{part}_s']}"
                for part in ("search", "metrics", "profiles")
            )
            + f". Server peak RSS {q['server'].get('server_peak_rss_mib')} MiB."
        )
    add("")
    add("Stages (s): " + ", ".join(f"{k} {v}" for k, v in result["stages_s"].items()) + ".")
    errors = [
        f"JFR {s['name']} round {r['round']} {r['format']}: {r['server_stderr'].strip()[-600:]}"
        for s in result["jfr"]["sets"]
        for r in s["runs"]
        if str(r.get("server_stderr", "")).strip()
    ]
    if q and str(q["server"].get("server_stderr", "")).strip():
        errors.append(f"queries: {q['server']['server_stderr'].strip()[-600:]}")
    lines += common.stderr_section(errors)
    add("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(common.print_json(run(quick="--quick" in sys.argv, log=common.log)))
