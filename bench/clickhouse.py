"""ClickHouse store benchmark: DuckDB and ClickHouse side by side, ingest and queries.

1. Ingest: ``bench/ingest.py``'s Pyroscope pprof pushes (``POST /push.v1.PusherService/Push``,
   32 and 512 in flight) and ``bench/traces.py``'s OTLP/HTTP span exports (512 spans a
   request, 8 and 32 in flight), each against (a) one ``hotspan server`` on DuckDB, (b) one
   ``hotspan server --store clickhouse://...`` and (c) two such servers over the same
   ClickHouse, the requests sent to them in turn (round robin).  Afterwards every acknowledged
   sample and span is counted in the store, and the CPU each process used over the measured
   window is reported.
2. Queries at 10 M and 100 M samples (``bench/clickhouse_data.py``), both backends, through a
   real ``hotspan server`` over HTTP and through the store in this process:
   ``SelectMergeStacktraces`` 1 h and 24 h of one service, ``SelectSeries``, a trace by id and
   trace searches.

ClickHouse here is the test fixture (``tests/clickhouse_fixture.py``): ClickHouse's HTTP
interface served by a Python process over chdb, the ClickHouse engine in-process (the only
ClickHouse this machine can run).  It shares the machine's CPUs with everything else.

    python bench/run.py --only clickhouse [--quick] [--rebuild] [--concurrency N]
    python bench/clickhouse.py [--quick]          # the same, JSON on stdout
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple
from urllib.parse import urlencode

import common
import loadgen
import numpy as np

_fmt = common.fmt_number
Log = Callable[[str], None]

TARGET_UPLOADS_PER_S = 3000
TARGET_SPANS_PER_S = 50_000
TARGET_24H_MS = 1000
TARGET_TRACE_MS = 20
SETUPS = (
    ("duckdb", "1 server, DuckDB"),
    ("clickhouse", "1 server, ClickHouse"),
    ("clickhouse-2", "2 servers, one ClickHouse"),
)
BACKENDS = (("duckdb", "DuckDB"), ("clickhouse", "ClickHouse"))
LEVELS = ("10m", "100m")
PUSH_PATH = "/push.v1.PusherService/Push"


# -- load generator: its own process (python bench/clickhouse.py load SPEC.json) ---------------
#
# Pre-built HTTP/1.1 requests (one list per server) on keep-alive connections, asyncio + uvloop,
# one request in flight per client.  Each client holds a connection to every server and sends
# its requests to them in turn, request by request, as a round-robin load balancer would
# (client w's k-th request to server (w + k) % servers); which request comes next is a counter
# shared by all clients, so every server gets a mix of all the distinct requests.  Every
# acknowledged request is counted, warm-up and the last ones in flight included, so that the
# parent can find them all in the store; a connection the server closed is an error (status 0)
# and the client carries on with a new one.
IDLE_RECONNECT_S = 2.0


async def _load(spec: Dict[str, Any]) -> Dict[str, Any]:
    with open(spec["requests"], "rb") as f:
        per_target: List[List[Tuple[bytes, int, int]]] = pickle.load(f)  # (raw, items, ticks)
    targets: List[str] = spec["targets"]
    n_targets = len(targets)
    n = len(per_target[0])
    loop = asyncio.get_running_loop()
    t_measure = loop.time() + float(spec["warmup"])
    t_end = t_measure + float(spec["duration"])
    st = {"ok": 0, "items": 0, "ticks": 0, "bytes_sent": 0, "errors": 0}
    acked = [{"requests": 0, "items": 0, "ticks": 0} for _ in targets]
    status: Dict[str, int] = {}
    examples: List[str] = []
    latencies: List[float] = []
    counter = [0]

    async def connect(target: str) -> Tuple[Any, Any, float]:
        host, port = target.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return reader, writer, loop.time()

    async def client(w: int) -> None:
        conns = [await connect(target) for target in targets]
        k = 0
        try:
            while loop.time() < t_end:
                i = counter[0]
                counter[0] = i + 1
                t = (w + k) % n_targets
                k += 1
                raw, items, ticks = per_target[t][i % n]
                reader, writer, used = conns[t]
                if loop.time() - used > IDLE_RECONNECT_S:
                    # The server closes a connection idle for its keep-alive timeout (uvicorn:
                    # 5 s); a client opens a new one rather than race that close.
                    writer.close()
                    reader, writer, used = conns[t] = await connect(targets[t])
                t0 = time.perf_counter()
                try:
                    writer.write(raw)
                    code, answer = await loadgen.read_response(reader)
                except (asyncio.IncompleteReadError, ConnectionError) as exc:
                    code, answer = 0, repr(exc).encode()
                    writer.close()
                    conns[t] = await connect(targets[t])
                else:
                    conns[t] = (reader, writer, loop.time())
                dt = time.perf_counter() - t0
                done = loop.time()
                in_window = t_measure <= done < t_end
                if code == 200:
                    acked[t]["requests"] += 1
                    acked[t]["items"] += items
                    acked[t]["ticks"] += ticks
                    if in_window:
                        st["ok"] += 1
                        st["items"] += items
                        st["ticks"] += ticks
                        st["bytes_sent"] += len(raw)
                        latencies.append(dt)
                else:
                    status[str(code)] = status.get(str(code), 0) + 1
                    if in_window:
                        st["errors"] += 1
                    if len(examples) < 3:
                        examples.append(f"{code}: {answer[:300]!r}")
        finally:
            for _, writer, _ in conns:
                writer.close()

    tasks = [asyncio.create_task(client(w)) for w in range(int(spec["concurrency"]))]
    tasks.append(asyncio.create_task(loadgen.mark_window(loop, t_measure, t_end, st)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return {
        **st,
        "acked": acked,
        "status": status,
        "error_examples": examples,
        "worker_failures": [repr(r) for r in results if isinstance(r, BaseException)][:3],
        "latency_ms": loadgen.latency_pcts(latencies),
    }


# -- CPU of every process over the measured window ---------------------------------------------


def _machine_jiffies() -> Tuple[int, int]:
    """(busy, total) jiffies of all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


class Cpu:
    """CPU of named processes (and of the whole machine) between ``start`` and ``stop``."""

    def __init__(self, pids: Dict[str, int]) -> None:
        self.windows = {name: common.CpuWindow(pid) for name, pid in pids.items()}
        self.result: Dict[str, Any] = {}
        self._machine0 = (0, 0)

    def start(self) -> None:
        self._machine0 = _machine_jiffies()
        for w in self.windows.values():
            w.start()

    def stop(self) -> None:
        for name, w in self.windows.items():
            self.result[name] = w.stop()
        busy, total = _machine_jiffies()
        db, dt = busy - self._machine0[0], total - self._machine0[1]
        busy_cores = db / dt * (os.cpu_count() or 1) if dt else 0.0
        self.result["machine_busy_cores"] = round(busy_cores, 2)
        # What the machine did beyond the measured processes: other work on a shared machine.
        measured = sum(w["cpu_per_wall"] for w in self.result.values() if isinstance(w, dict))
        self.result["other_processes_cores"] = round(max(busy_cores - measured, 0.0), 2)


# -- 1. ingest ---------------------------------------------------------------------------------


def _stored(setup: str, data_dir: str, ch: Any) -> Dict[str, Any]:
    """Sample rows, their sum and span rows in the store, after its servers shut down."""
    if setup == "duckdb":
        rows, total = common.stored_samples(data_dir)
        ((spans,),) = common.stored_rows(data_dir, "SELECT count(*) FROM spans")
    else:
        client = ch.client("hotspan")
        try:
            rows, total = client.query("SELECT count(), sum(value) FROM samples").result_rows[0]
            spans = client.command("SELECT count() FROM spans")
        finally:
            client.close()
    return {"sample_rows": int(rows), "sample_value_sum": int(total), "span_rows": int(spans)}


def run_ingest(
    kind: str,
    setup: str,
    payload: List[Dict[str, Any]],
    concurrency: int,
    warmup: float,
    duration: float,
    workdir: str,
    log: Log,
    place: Optional[Callable[[str, int], None]] = None,
) -> Dict[str, Any]:
    """One measured load of ``kind`` (profiles or spans) against ``setup``.  ``place(role,
    pid)`` is told of every process as it starts (``clickhouse``, ``server0``, ``server1``,
    ``loadgen``): ``scaleout.py`` gives each its own CPU quota there."""
    import clickhouse_data
    import ingest
    import synth
    import traces

    run_dir = tempfile.mkdtemp(prefix=f"{kind}-{setup}-", dir=workdir)
    result: Dict[str, Any] = {"kind": kind, "setup": setup}
    servers: List[common.Server] = []
    ch = None
    try:
        if setup == "duckdb":
            servers.append(common.Server(os.path.join(run_dir, "data")).start())
        else:
            ch = clickhouse_data.ClickHouse(os.path.join(run_dir, "clickhouse"))
            result["clickhouse_startup_s"] = ch.startup_s
            if place is not None:
                place("clickhouse", ch.pid)
            url = ch.url("hotspan")
            for i in range(2 if setup == "clickhouse-2" else 1):
                servers.append(
                    common.Server(os.path.join(run_dir, f"server{i}"), ["--store", url]).start()
                )
        result["server_startup_s"] = [round(s.startup_s, 2) for s in servers]
        if place is not None:
            for i, server in enumerate(servers):
                place(f"server{i}", server.pid)
        per_target = []
        target_names = []
        for server in servers:
            if kind == "profiles":
                host, port = server.host, server.port
                reqs = [
                    (ingest.push_request(host, port, up), int(up["samples"]), int(up["ticks"]))
                    for up in payload
                ]
            else:
                assert server.otlp_http is not None, "the server has no OTLP/HTTP receiver"
                host, port = server.otlp_http
                reqs = [
                    (
                        loadgen.post(host, port, "/v1/traces", b, "application/x-protobuf"),
                        traces.SPANS_PER_REQUEST,
                        0,
                    )
                    for b in payload  # type: ignore[misc]
                ]
            per_target.append(reqs)
            target_names.append(f"{host}:{port}")
        req_file = os.path.join(run_dir, "requests.pickle")
        with open(req_file, "wb") as f:
            pickle.dump(per_target, f, protocol=pickle.HIGHEST_PROTOCOL)
        del per_target
        spec_file = os.path.join(run_dir, "load.json")
        with open(spec_file, "w") as f:
            json.dump(
                {
                    "targets": target_names,
                    "requests": req_file,
                    "concurrency": concurrency,
                    "warmup": warmup,
                    "duration": duration,
                },
                f,
            )
        rss = [common.RssSampler(s.pid) for s in servers]
        for r in rss:
            r.start()
        pids = {f"server{i}": s.pid for i, s in enumerate(servers)}
        if ch is not None:
            pids["clickhouse"] = ch.pid
        cpus: List[Cpu] = []
        load = loadgen.follow(
            [sys.executable, os.path.abspath(__file__), "load", spec_file],
            lambda: cpus[0].start(),
            lambda: cpus[0].stop(),
            cwd=common.BENCH_DIR,
            on_spawn=lambda pid: _spawned(cpus, pids, pid, place),
        )
        cpu = cpus[0]
        result["server_peak_rss_mib"] = [
            common.mib(max(s.memory().get("VmHWM", 0), r.stop())) for s, r in zip(servers, rss)
        ]
        result["server_stop"] = [s.stop() for s in servers]
        result["server_stderr"] = [s.stderr_tail()[-1500:] for s in servers]
        acked_items = sum(a["items"] for a in load["acked"])
        acked_ticks = sum(a["ticks"] for a in load["acked"])
        stored = _stored(setup, os.path.join(run_dir, "data"), ch)
        if kind == "profiles":
            stored["all_stored"] = (
                stored["sample_rows"] == acked_items
                and stored["sample_value_sum"] == acked_ticks * synth.PERIOD_NS
            )
        else:
            stored["all_stored"] = stored["span_rows"] == acked_items
        items_per_s = round(load["items"] / duration)
        result.update(
            concurrency=concurrency,
            warmup_s=warmup,
            duration_s=duration,
            requests_per_s=round(load["ok"] / duration, 1),
            items_per_s=items_per_s,
            ticks_per_s=round(load["ticks"] / duration),
            mb_per_s_in=round(load["bytes_sent"] / duration / 1e6, 2),
            errors=load["errors"],
            status_counts=load["status"],
            error_examples=load["error_examples"],
            worker_failures=load["worker_failures"],
            latency_ms=load["latency_ms"],
            acked=load["acked"],
            acked_items=acked_items,
            acked_ticks=acked_ticks,
            stored=stored,
            cpu=cpu.result,
        )
        if ch is not None:
            result["clickhouse_parts"] = _parts(ch)
    finally:
        for s in servers:
            s.stop()
        if ch is not None:
            ch.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _spawned(
    cpus: List[Cpu], pids: Dict[str, int], pid: int, place: Optional[Callable[[str, int], None]]
) -> None:
    if place is not None:
        place("loadgen", pid)
    cpus.append(Cpu({**pids, "loadgen": pid}))


def _parts(ch: Any) -> Dict[str, int]:
    """Active parts per table after the run: how many inserts ClickHouse has not merged yet."""
    client = ch.client("hotspan")
    try:
        rows = client.query(
            "SELECT table, count() FROM system.parts WHERE database = 'hotspan' AND active "
            "GROUP BY table ORDER BY table"
        ).result_rows
    finally:
        client.close()
    return {t: int(n) for t, n in rows}


# In flight: what bench/ingest.py and bench/traces.py use, then what a fleet puts in flight.
# N clients with one request each make at most N / latency requests a second, and a push is
# acknowledged only once its group commit has landed in the store: a store further away
# (ClickHouse, over HTTP) needs more pushes in flight for the same rate.  Thousands of agents
# each pushing every 10 s keep hundreds in flight.
PROFILE_CONCURRENCY = (32, 512)
SPAN_CONCURRENCY = (8, 32)
# --quick measures 2 s: 512 uploads in flight take longer than that to come back at all.
QUICK_FLEET_PROFILE_CONCURRENCY = 128


def run_ingest_all(quick: bool, concurrency: Optional[int], log: Log) -> Dict[str, Any]:
    import ingest
    import traces

    warmup, duration = (0.5, 2.0) if quick else (3.0, 20.0)
    span_warmup, span_duration = (0.5, 2.0) if quick else (2.0, 15.0)
    n_uploads = 64 if quick else 512
    n_bodies, distinct = (120, 30) if quick else (1200, 100)
    fleet = QUICK_FLEET_PROFILE_CONCURRENCY if quick else PROFILE_CONCURRENCY[1]
    profile_conc = (concurrency or PROFILE_CONCURRENCY[0], fleet)
    t0 = time.perf_counter()
    uploads = ingest.build_uploads(n_uploads)
    bodies = traces.ingest_pool(n_bodies, distinct)
    out: Dict[str, Any] = {
        "params": {
            "distinct_uploads": n_uploads,
            "upload_gzip_bytes_mean": int(np.mean([len(u["body"]) for u in uploads])),
            "stacks_per_upload": 300,
            "profile_concurrency": list(profile_conc),
            "profile_warmup_s": warmup,
            "profile_duration_s": duration,
            "distinct_span_requests": n_bodies,
            "span_request_bytes_mean": int(np.mean([len(b) for b in bodies])),
            "spans_per_request": traces.SPANS_PER_REQUEST,
            "span_concurrency": list(SPAN_CONCURRENCY),
            "span_warmup_s": span_warmup,
            "span_duration_s": span_duration,
        },
        "payload_build_s": round(time.perf_counter() - t0, 1),
        "runs": [],
    }
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-clickhouse-ingest-")
    try:
        for kind, payload, concs, w, d in (
            ("profiles", uploads, profile_conc, warmup, duration),
            ("spans", bodies, SPAN_CONCURRENCY, span_warmup, span_duration),
        ):
            for conc in concs:
                for setup, label in SETUPS:
                    log(f"  ingest {kind}: {label}, {conc} in flight, {d} s")
                    r = run_ingest(kind, setup, payload, conc, w, d, workdir, log)  # type: ignore[arg-type]
                    st = r["stored"]
                    log(
                        f"    {_fmt(r['items_per_s'])} "
                        f"{'samples' if kind == 'profiles' else 'spans'}/s, "
                        f"{r['requests_per_s']} requests/s, errors {r['errors']}, "
                        f"p99 {r['latency_ms']['p99']} ms; stored "
                        f"{_fmt(st['sample_rows'] if kind == 'profiles' else st['span_rows'])} of "
                        f"{_fmt(r['acked_items'])} acknowledged; machine busy "
                        f"{r['cpu'].get('machine_busy_cores')} cores"
                    )
                    out["runs"].append(r)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


# -- 2. queries --------------------------------------------------------------------------------


def _summary(seconds: List[float], first: float) -> Dict[str, Any]:
    ms = [s * 1000 for s in seconds]
    return {
        "runs": len(ms),
        "median_ms": round(statistics.median(ms), 2),
        "p95_ms": round(common.percentile(ms, 95), 2),
        "min_ms": round(min(ms), 2),
        "max_ms": round(max(ms), 2),
        "first_ms": round(first * 1000, 2),
    }


def _lookup(sets: Any, level: str) -> List[str]:
    """The trace ids asked for by id: at 100 M originals and copies alike (copy ``i % GROW`` of
    the i-th trace, the original for every tenth)."""
    import clickhouse_data

    lookup: List[str] = sets.targets["lookup"]
    if level != "100m":
        return lookup
    return [
        clickhouse_data.grown_trace_id(t, i % clickhouse_data.GROW) if i % 10 else t
        for i, t in enumerate(lookup)
    ]


def _http_queries(sets: Any, level: str) -> List[Dict[str, Any]]:
    import query

    qp = sets.params["samples"]
    service = SERVICE
    picked = {
        "merge_1h_json": "SelectMergeStacktraces 1h JSON",
        "merge_24h_json": "SelectMergeStacktraces 24h JSON",
        "merge_24h_proto": "SelectMergeStacktraces 24h proto",
        "series_24h_proto": "SelectSeries 24h step 60s proto",
    }
    out = []
    for q in query._queries(qp, service):  # noqa: SLF001 - the same requests as query.py
        if q["key"] in picked:
            out.append(
                {
                    "key": q["key"],
                    "name": picked[q["key"]],
                    "method": "POST",
                    "path": q["path"],
                    "headers": q["headers"],
                    "body": q["body"],
                    "check": ("query", q["check"]),
                }
            )
    targets = sets.targets
    lookup = _lookup(sets, level)
    end_s = sets.params["spans"]["end_s"]
    h1 = {"start": end_s - 3600, "end": end_s}
    h24 = {"start": end_s - 24 * 3600, "end": end_s}

    def search(key: str, name: str, rng: Dict[str, int], **extra: str) -> Dict[str, Any]:
        return {
            "key": key,
            "name": name,
            "method": "GET",
            "path": "/api/search?" + urlencode({**extra, **rng, "limit": 20}),
            "headers": {},
            "check": ("traces", "search"),
        }

    user = targets["enduser"]
    out += [
        {
            "key": "trace_by_id",
            "name": "trace by id `GET /api/traces/{id}` JSON",
            "method": "GET",
            "path": lambda i: f"/api/traces/{lookup[i % len(lookup)]}",
            "headers": {},
            "check": ("traces", "trace_json"),
        },
        search("search_1h", "search, no condition, 1 h", h1),
        search(
            "search_tags_service",
            "search `tags=service.name=payment`, 24 h",
            h24,
            tags="service.name=payment",
        ),
        search(
            "search_traceql",
            'search `{resource.service.name="checkout" && name="POST /orders"}`, 24 h',
            h24,
            q='{resource.service.name="checkout" && name="POST /orders"}',
        ),
        search(
            "search_attr",
            f'search `{{span.enduser.id="{user}"}}`, 24 h',
            h24,
            q=f'{{span.enduser.id="{user}"}}',
        ),
        search("search_min_duration", "search `minDuration=500ms`, 24 h", h24, minDuration="500ms"),
    ]
    return out


SERVICE = "svc-07"


def _check(check: Tuple[str, str], data: bytes, headers: Dict[str, str]) -> Dict[str, Any]:
    import query
    import traces

    module, kind = check
    if module == "query":
        return query._check(kind, data, headers)  # noqa: SLF001
    return traces._check(kind, data)  # noqa: SLF001


def query_http(
    sets: Any,
    level: str,
    server_args: List[str],
    data_dir: str,
    extra_pids: Dict[str, int],
    runs: int,
    warmups: int,
    log: Log,
) -> Dict[str, Any]:
    results: Dict[str, Any] = {}
    with common.measured_server(data_dir, server_args) as (server, out):
        client = common.Client(server.url, timeout=600)
        for q in _http_queries(sets, level):
            cpu = Cpu({"server": server.pid, **extra_pids})

            def request(i: int, q: Dict[str, Any] = q) -> bytes:
                path = q["path"](i) if callable(q["path"]) else q["path"]
                return client.fetch(q["name"], q["method"], path, q["headers"], q.get("body"))

            data, first, times = common.repeat_timed(request, warmups, runs, cpu.start)
            info = _check(q["check"], data, q["headers"])
            info["response_bytes"] = len(data)
            cpu.stop()
            summary = _summary(times, first)
            summary["cpu_ms_per_query"] = {
                name: round(w["cpu_s"] * 1000 / runs, 1)
                for name, w in cpu.result.items()
                if isinstance(w, dict)
            }
            # Anything else busy on the machine meanwhile: a noisy neighbour, not the query.
            summary["other_processes_cores"] = cpu.result["other_processes_cores"]
            results[q["key"]] = {"name": q["name"], **summary, "result": info}
            log(
                f"    {q['name']}: median {summary['median_ms']} ms, p95 {summary['p95_ms']} ms "
                f"(first {summary['first_ms']} ms) {info}"
            )
    out["queries"] = results
    return out


def _timed(fn: Callable[[int], Any], runs: int, warmups: int) -> Tuple[Any, Dict[str, Any]]:
    result, first, times = common.repeat_timed(fn, warmups, runs)
    return result, _summary(times, first)


def query_store(sets: Any, level: str, store: Any, runs: int, warmups: int, log: Log) -> Dict:
    """The store's own calls behind the HTTP queries, in this process."""
    import clickhouse_data

    from hotspan.model.trace import TraceQuery
    from hotspan.query.traceql import legacy_query, parse_duration, parse_logfmt, parse_traceql
    from hotspan.store.base import SampleFilter

    tenant = clickhouse_data.TENANT
    qp = sets.params["samples"]
    end_ns = qp["end_s"] * 10**9
    h1 = SampleFilter(end_ns - 3600 * 10**9, end_ns)
    h24 = SampleFilter(end_ns - qp["hours"] * 3600 * 10**9, end_ns)
    sids = [s.series_id for s in store.series(tenant) if s.labels.get("service_name") == SERVICE]
    targets = sets.targets
    lookup = _lookup(sets, level)

    def traceql(text: str, start: int) -> Any:
        spansets, conds = parse_traceql(text)
        return TraceQuery(start, end_ns, spansets, conds, 20, 3)

    searches = {
        "search_1h": TraceQuery(end_ns - 3600 * 10**9, end_ns, (), (), 20, 3),
        "search_tags_service": legacy_query(
            parse_logfmt("service.name=payment"), h24.start_ns, end_ns, None, None, 20
        ),
        "search_traceql": traceql(
            '{resource.service.name="checkout" && name="POST /orders"}', h24.start_ns
        ),
        "search_attr": traceql(f'{{span.enduser.id="{targets["enduser"]}"}}', h24.start_ns),
        "search_min_duration": legacy_query(
            [], h24.start_ns, end_ns, parse_duration("500ms"), None, 20
        ),
    }
    calls: Dict[str, Tuple[str, Callable[[int], Any], Callable[[Any], Dict[str, Any]]]] = {
        "stack_values_1h": (
            "`stack_values` 1 h",
            lambda i: store.stack_values(tenant, sids, h1),
            lambda r: {"stacks": len(r.stack_ids), "total": int(r.values.sum())},
        ),
        "stack_values_24h": (
            "`stack_values` 24 h",
            lambda i: store.stack_values(tenant, sids, h24),
            lambda r: {"stacks": len(r.stack_ids), "total": int(r.values.sum())},
        ),
        "time_series_24h": (
            "`time_series` 24 h step 60 s",
            lambda i: store.time_series(tenant, sids, h24, 60 * 10**9),
            lambda r: {"points": len(r[0]), "total": int(np.sum(r[2]))},
        ),
        "trace_by_id": (
            "`trace`",
            lambda i: store.trace(tenant, lookup[i % len(lookup)]),
            lambda r: {"spans": len(r)},
        ),
    }
    for key, q in searches.items():
        calls[key] = (
            f"`find_traces` {key}",
            lambda i, q=q: store.find_traces(tenant, q),
            lambda r: {"traces": len(r)},
        )
    out: Dict[str, Any] = {"series": len(sids)}
    for key, (name, fn, describe) in calls.items():
        try:
            result, summary = _timed(fn, runs, warmups)
            summary["result"] = describe(result)
        except Exception as exc:  # noqa: BLE001 - one failing call keeps the others' numbers
            summary = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        out[key] = {"name": name, **summary}
        log(f"    store {name}: {summary.get('median_ms', summary.get('error'))} ms")
    return out


def _round_trip(ch: Any, runs: int, warmups: int) -> Dict[str, Any]:
    """``SELECT 1`` through clickhouse-connect: what any statement costs before the engine
    does work (client, the fixture's HTTP handling, chdb's per-query setup)."""
    client = ch.client()
    try:
        _, summary = _timed(lambda i: client.query("SELECT 1").result_rows, runs, warmups)
    finally:
        client.close()
    return summary


def run_queries(sets: Any, quick: bool, log: Log) -> Dict[str, Any]:
    import clickhouse_data

    from hotspan.store.clickhouse import ClickHouseStore
    from hotspan.store.duckdb import DuckDBStore

    runs, warmups = (5, 1) if quick else (20, 2)
    out: Dict[str, Any] = {"runs": runs, "warmups": warmups, "http": {}, "store": {}}
    scratch = tempfile.mkdtemp(prefix="hotspan-bench-clickhouse-query-")
    try:
        with clickhouse_data.clickhouse(sets.clickhouse_path) as ch:
            out["clickhouse_startup_s"] = ch.startup_s
            out["versions"] = clickhouse_data.clickhouse_versions(ch)
            out["clickhouse_round_trip"] = _round_trip(ch, runs, warmups)
            for level, db in (("10m", clickhouse_data.DB_10M), ("100m", clickhouse_data.DB_100M)):
                key = f"clickhouse-{level}"
                log(f"  queries: ClickHouse {level} over HTTP")
                out["http"][key] = query_http(
                    sets, level, ["--store", ch.url(db)], scratch, {"clickhouse": ch.pid},
                    runs, warmups, log,
                )  # fmt: skip
                log(f"  queries: ClickHouse {level}, store calls in-process")
                store = ClickHouseStore(ch.url(db), retention_ns=0)
                try:
                    out["store"][key] = query_store(sets, level, store, runs, warmups, log)
                finally:
                    store.close()
        for level, data_dir in (("10m", sets.duckdb_10m), ("100m", sets.duckdb_100m)):
            key = f"duckdb-{level}"
            log(f"  queries: DuckDB {level} over HTTP")
            out["http"][key] = query_http(sets, level, [], data_dir, {}, runs, warmups, log)
            log(f"  queries: DuckDB {level}, store calls in-process")
            store = DuckDBStore(data_dir)
            try:
                out["store"][key] = query_store(sets, level, store, runs, warmups, log)
            finally:
                store.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out["agreement"] = _agreement(out)
    return out


def _agreement(out: Dict[str, Any]) -> Dict[str, Any]:
    """Per level and query: do DuckDB and ClickHouse return the same thing?"""
    found: Dict[str, Any] = {}
    for part in ("http", "store"):
        for level in LEVELS:
            a = out[part].get(f"duckdb-{level}", {})
            b = out[part].get(f"clickhouse-{level}", {})
            qa = a.get("queries", a) if part == "http" else a
            qb = b.get("queries", b) if part == "http" else b
            for key, ra in qa.items():
                if not isinstance(ra, dict) or "result" not in ra:
                    continue
                rb = qb.get(key, {})
                x = {k: v for k, v in ra["result"].items() if k != "response_bytes"}
                y = {k: v for k, v in rb.get("result", {}).items() if k != "response_bytes"}
                if x != y:
                    found[f"{part} {level} {key}"] = {"duckdb": x, "clickhouse": y}
    return found


# -- the whole benchmark -----------------------------------------------------------------------


def run(
    quick: bool = False,
    log: Log = print,
    rebuild: bool = False,
    concurrency: Optional[int] = None,
) -> Dict[str, Any]:
    import clickhouse_data

    out: Dict[str, Any] = {"quick": quick, "stages_s": {}}
    t0 = time.perf_counter()
    log("ingest ...")
    out["ingest"] = run_ingest_all(quick, concurrency, log)
    out["stages_s"]["ingest"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    log("query data sets ...")
    sets = clickhouse_data.ensure(quick, log, rebuild)
    out["stages_s"]["data_sets"] = round(time.perf_counter() - t0, 1)
    out["data"] = {"dir": sets.root, "params": sets.params, **sets.info}
    t0 = time.perf_counter()
    log("queries ...")
    out["queries"] = run_queries(sets, quick, log)
    out["stages_s"]["queries"] = round(time.perf_counter() - t0, 1)
    return out


# -- report ------------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "meets target" if ok else "**misses target**"


def _cpu_cell(w: Optional[Dict[str, Any]]) -> str:
    if not w:
        return "–"
    return f"{w['cpu_per_wall']}"


def markdown(result: Dict[str, Any], command: str, m: Dict[str, Any], wall: float) -> str:
    lines: List[str] = []
    add = lines.append
    q = result["queries"]
    v = q.get("versions", {})
    versions = {
        "ClickHouse": str(v.get("clickhouse")),
        "chdb": str(v.get("chdb")),
        "clickhouse-connect": str(v.get("clickhouse_connect")),
    }
    lines += common.head(
        f"hotspan ClickHouse benchmark{' (quick)' if result['quick'] else ''}",
        command,
        wall,
        common.machine_text(m, versions),
    )
    add("")
    add(
        "ClickHouse is `tests/clickhouse_fixture.py`: ClickHouse's HTTP interface served by a "
        "Python process (`tests/clickhouse_http.py`, a thread per request, 2 chdb connections) "
        "over chdb, the ClickHouse engine in-process. It is the only ClickHouse this machine can "
        "run, and it shares the 2 CPUs with the hotspan servers and the load generator: the "
        "ratios between the backends mean more than the absolute numbers, and a real "
        "ClickHouse on its own machines would take its CPU column off these ones."
    )
    ing = result["ingest"]
    p = ing["params"]
    add("")
    add("## Ingest")
    add("")
    add(
        f"Profiles: `POST {PUSH_PATH}` (`application/proto` PushRequest), each a 10 s Python CPU "
        f"profile at 100 Hz as gzipped pprof ({p['stacks_per_upload']} stacks ~40 frames deep, "
        f"~{_fmt(p['upload_gzip_bytes_mean'])} bytes; `bench/ingest.py`'s uploads, "
        f"{p['distinct_uploads']} distinct), {p['profile_warmup_s']} s warm-up, "
        f"{p['profile_duration_s']} s measured. Spans: `POST /v1/traces` on the OTLP/HTTP port, "
        f"`ExportTraceServiceRequest`s of {p['spans_per_request']} spans "
        f"(~{_fmt(p['span_request_bytes_mean'])} bytes; `bench/traces.py`'s, "
        f"{p['distinct_span_requests']} distinct), {p['span_warmup_s']} s warm-up, "
        f"{p['span_duration_s']} s measured. One load-generator process (asyncio + uvloop, "
        "keep-alive HTTP/1.1, one request in flight per client); with two servers each client "
        "sends its requests to them in turn. Every run starts fresh (new data directory, new "
        "ClickHouse data directory). Each load runs twice: with the clients "
        f"`bench/ingest.py` and `bench/traces.py` use ({p['profile_concurrency'][0]} and "
        f"{p['span_concurrency'][0]} in flight), and with more "
        f"({p['profile_concurrency'][1]} and {p['span_concurrency'][1]}), as a fleet has: a "
        "push is acknowledged once its group commit has landed, so N clients make at most "
        "N / latency requests a second, and a store further away needs more in flight."
    )
    add("")
    add(
        "| load | in flight | setup | per s | requests/s | p50 ms | p99 ms | errors "
        "| stored / acknowledged | hotspan server(s) | ClickHouse | load gen | other processes "
        "| machine busy | target |"
    )
    add("|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|")
    labels = dict(SETUPS)
    for r in ing["runs"]:
        c = r["cpu"]
        servers = " + ".join(
            _cpu_cell(c.get(f"server{i}")) for i in range(2) if c.get(f"server{i}")
        )
        st = r["stored"]
        if r["kind"] == "profiles":
            per = f"{_fmt(r['requests_per_s'])} uploads"
            stored = (
                f"{_fmt(st['sample_rows'])} / {_fmt(r['acked_items'])} sample rows, "
                + ("values match" if st["sample_value_sum"] == r["acked_ticks"] * 10**7 else
                   "**VALUES DIFFER**")
            )  # fmt: skip
            target = (
                f"≥ {_fmt(TARGET_UPLOADS_PER_S)} uploads/s: "
                + _verdict(r["requests_per_s"] >= TARGET_UPLOADS_PER_S)
                if r["setup"] == "clickhouse-2"
                else ""
            )
        else:
            per = f"{_fmt(r['items_per_s'])} spans"
            stored = f"{_fmt(st['span_rows'])} / {_fmt(r['acked_items'])} spans"
            target = (
                f"≥ {_fmt(TARGET_SPANS_PER_S)} spans/s: "
                + _verdict(r["items_per_s"] >= TARGET_SPANS_PER_S)
                if r["setup"] == "clickhouse-2"
                else ""
            )
        stored += ": all stored" if st["all_stored"] else ": **MISSING**"
        lat = r["latency_ms"]
        add(
            f"| {r['kind']} | {r['concurrency']} | {labels[r['setup']]} | {per} | "
            f"{_fmt(r['requests_per_s'])} | {lat['p50']} | {lat['p99']} | {r['errors']} | "
            f"{stored} | {servers} | {_cpu_cell(c.get('clickhouse'))} | "
            f"{_cpu_cell(c.get('loadgen'))} | {c.get('other_processes_cores')} | "
            f"{c.get('machine_busy_cores')} | {target} |"
        )
    add("")
    add(
        "Acknowledged = every request answered 200, warm-up and the last requests in flight "
        "included; stored = rows counted in the store after the servers shut down gracefully "
        "(DuckDB read-only; ClickHouse `count()` and `sum(value)` of `samples`, `count()` of "
        "`spans`); for profiles the sum of the stored values must equal the acknowledged ticks "
        "x 10 ms. CPU columns: cores used over exactly the measured window, from "
        "/proc/<pid>/task/*/stat (1.0 = one core busy); machine busy from /proc/stat; other "
        "processes = machine busy minus the processes measured (anything else running on this "
        "shared machine). The same CPU per request, in ms, to see where an upload's cost goes: "
        "server main thread (event loop: HTTP, protobuf and pprof decoding, building the batch), "
        "server other threads (group-commit writer: DuckDB, or clickhouse-connect's inserts; the "
        "OTLP/HTTP receiver's thread for spans), the ClickHouse fixture process (its HTTP "
        "handling and the engine)."
    )
    add("")
    add(
        "| load | in flight | setup | server main | server other | ClickHouse | total "
        "| = requests/s on 2 busy cores | ClickHouse parts after | requests per server |"
    )
    add("|---|---:|---|---:|---:|---:|---:|---:|---|---|")
    for r in ing["runs"]:
        c = r["cpu"]
        n = r["requests_per_s"] * r["duration_s"]
        if not n:
            continue
        ws = [c[k] for k in ("server0", "server1") if c.get(k)]
        main = sum(w["main_thread_cpu_s"] for w in ws) * 1000 / n
        other = sum(w["other_threads_cpu_s"] for w in ws) * 1000 / n
        chc = c["clickhouse"]["cpu_s"] * 1000 / n if c.get("clickhouse") else 0.0
        total = main + other + chc
        parts = r.get("clickhouse_parts") or {}
        part_text = ", ".join(f"{t} {parts[t]}" for t in ("samples", "spans") if t in parts)
        add(
            f"| {r['kind']} | {r['concurrency']} | {labels[r['setup']]} | {main:.2f} | "
            f"{other:.2f} | {chc:.2f} | {total:.2f} | "
            f"{_fmt(round(2000 / total)) if total else '–'} | {part_text or '–'} | "
            + (" / ".join(_fmt(a["requests"]) for a in r["acked"]) if len(r["acked"]) > 1 else "")
            + " |"
        )
    errors = [
        (r, e) for r in ing["runs"] for e in r.get("error_examples", []) + r["worker_failures"]
    ]
    if errors:
        add("")
    for r, e in errors[:6]:
        add(f"- error, {r['kind']} {labels[r['setup']]}: `{e[:200]}`")

    d = result["data"]
    sp = d["params"]
    qp = sp["samples"]
    add("")
    add("## Queries")
    add("")
    add(
        f"10 M level: `bench/query.py`'s data set ({_fmt(qp['samples'])} samples, "
        f"{qp['services'] * qp['label_sets_per_service']:,} series = {qp['services']} services x "
        f"{qp['label_sets_per_service']} label sets, {_fmt(qp['stacks'])} stacks "
        f"{qp['min_depth']}-{qp['max_depth']} frames deep, {qp['hours']} h at a "
        f"{qp['interval_s']} s interval; written by `query.build` through each store's `write`) "
        f"and `bench/traces.py`'s {_fmt(sp['spans']['spans'])} spans over the same 24 h "
        f"(`traces.generate`, pushed through a `hotspan server` over OTLP/HTTP). 100 M level: "
        f"the same grown {sp['grow']}x inside each database with SQL — each sample as it was "
        f"and shifted k s later for k = 1..{sp['grow'] - 1} (wrapped back into the same 24 h), "
        "same series, stacks and values (each series uploads 10x as often); each span as it "
        f"was and under {sp['grow'] - 1} other trace ids (first byte of the id XOR k, in the "
        "column, in the stored OTLP message and in ClickHouse's `trace_index`), same times. "
        "DuckDB: `INSERT INTO samples SELECT ... FROM src.samples, range(0, 10) ORDER BY ts` "
        "(and spans `ORDER BY start_ns`) into a new file, as a server appends them in time "
        "order; ClickHouse: `INSERT INTO hotspan_100m.samples SELECT ... FROM "
        "hotspan_10m.samples ARRAY JOIN range(10) AS k`. Every ClickHouse table of both "
        "levels then had `OPTIMIZE TABLE ... FINAL` (the state once background merges have "
        f"caught up). Cached in `{d['dir']}`."
    )
    add("")
    add("| data set | samples | spans | traces | series | on disk | built |")
    add("|---|---:|---:|---:|---:|---:|---|")
    for name in ("duckdb-10m", "clickhouse-10m", "duckdb-100m", "clickhouse-100m"):
        info = d[name]
        c = info["counts"]
        built = "reused from cache" if info.get("reused") else f"{info.get('total_s')} s"
        add(
            f"| {name} | {_fmt(c['samples'])} | {_fmt(c['spans'])} | {_fmt(c['traces'])} | "
            f"{_fmt(c['series'])} | {c['mib']} MiB | {built} |"
        )
    add("")
    add(
        f'For `{{service_name="{SERVICE}"}}` ({qp["label_sets_per_service"]} series), '
        f"{q['runs']} timed runs after {q['warmups']} warm-ups each, one keep-alive connection "
        "to a server started for each data set (ClickHouse's first: right after its server "
        "started). Trace by id asks for another of 20 traces spread over the day on each run "
        "(at 100 M, originals and copies). Median / p95 in ms; growth = 100 M median / 10 M "
        "median."
    )
    add("")
    add(
        "| query | DuckDB 10M | DuckDB 100M | growth | ClickHouse 10M | ClickHouse 100M | "
        "growth | 100M CH / DuckDB | target at 100M |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    http = q["http"]
    keys = list(http["duckdb-10m"]["queries"].keys())
    for key in keys:
        cells = {}
        for b, _ in BACKENDS:
            for level in LEVELS:
                cells[(b, level)] = http.get(f"{b}-{level}", {}).get("queries", {}).get(key)
        add(_row(cells, http["duckdb-10m"]["queries"][key]["name"], key))
    rt = q.get("clickhouse_round_trip")
    if rt:
        add("")
        add(
            f"The floor under every ClickHouse statement here: `SELECT 1` through "
            f"clickhouse-connect and the fixture takes {rt['median_ms']} ms (median, p95 "
            f"{rt['p95_ms']} ms); a store call makes one to three statements."
        )
    add("")
    add("Server and ClickHouse CPU per query (ms, mean of the timed runs):")
    add("")
    add("| query | DuckDB 10M server | DuckDB 100M server | CH 10M server + ClickHouse | "
        "CH 100M server + ClickHouse |")  # fmt: skip
    add("|---|---:|---:|---:|---:|")
    for key in keys:
        row = [http["duckdb-10m"]["queries"][key]["name"]]
        for name in ("duckdb-10m", "duckdb-100m", "clickhouse-10m", "clickhouse-100m"):
            r = http.get(name, {}).get("queries", {}).get(key)
            if not r:
                row.append("–")
                continue
            c = r["cpu_ms_per_query"]
            row.append(
                f"{c.get('server')}" + (f" + {c.get('clickhouse')}" if "clickhouse" in c else "")
            )
        add("| " + " | ".join(row) + " |")
    others = [
        r.get("other_processes_cores", 0.0)
        for part in http.values()
        for r in part.get("queries", {}).values()
    ]
    if others:
        add("")
        add(
            f"Other processes on the machine used up to {max(others)} cores during a query's "
            f"timed runs (median {statistics.median(others)})."
        )
    add("")
    add("Store calls in this process (the SQL and its result, no HTTP, no flame graph):")
    add("")
    add(
        "| call | DuckDB 10M | DuckDB 100M | growth | ClickHouse 10M | ClickHouse 100M | "
        "growth | 100M CH / DuckDB | result at 100M (DuckDB) |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    store = q["store"]
    for key, r0 in store["duckdb-10m"].items():
        if not isinstance(r0, dict):
            continue
        cells = {(b, lv): store.get(f"{b}-{lv}", {}).get(key) for b, _ in BACKENDS for lv in LEVELS}
        add(_row(cells, r0["name"], key, store_level=True))
    add("")
    agree = q.get("agreement", {})
    if agree:
        add("Results that differ between DuckDB and ClickHouse (same data):")
        add("")
        for k, diff in agree.items():
            add(f"- {k}: DuckDB {diff['duckdb']}, ClickHouse {diff['clickhouse']}")
    else:
        add("DuckDB and ClickHouse returned the same results (totals, sizes, counts) throughout.")
    add("")
    return "\n".join(lines)


def _ms(r: Optional[Dict[str, Any]]) -> str:
    if not r:
        return "–"
    if "error" in r:
        return "error"
    return f"{r['median_ms']} / {r['p95_ms']}"


def _growth(a: Optional[Dict[str, Any]], b: Optional[Dict[str, Any]]) -> str:
    if not a or not b or "median_ms" not in a or "median_ms" not in b or not a["median_ms"]:
        return "–"
    return f"x{b['median_ms'] / a['median_ms']:.1f}"


def _row(cells: Dict[Tuple[str, str], Any], name: str, key: str, store_level: bool = False) -> str:
    d10, d100 = cells[("duckdb", "10m")], cells[("duckdb", "100m")]
    c10, c100 = cells[("clickhouse", "10m")], cells[("clickhouse", "100m")]
    last = ""
    if store_level:
        last = ", ".join(f"{k} {_fmt(v)}" for k, v in (d100 or {}).get("result", {}).items())
    elif c100 and "p95_ms" in c100:
        if key == "merge_24h_json" or key == "merge_24h_proto":
            last = f"p95 < {TARGET_24H_MS} ms: " + _verdict(c100["p95_ms"] < TARGET_24H_MS)
        elif key == "trace_by_id":
            last = f"p95 < {TARGET_TRACE_MS} ms: " + _verdict(c100["p95_ms"] < TARGET_TRACE_MS)
    return (
        f"| {name} | {_ms(d10)} | {_ms(d100)} | {_growth(d10, d100)} | {_ms(c10)} | "
        f"{_ms(c100)} | {_growth(c10, c100)} | {_growth(d100, c100)} | {last} |"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["load"]:
        loadgen.spec_main(_load, sys.argv[2])
    else:
        common.print_json(run(quick="--quick" in sys.argv, log=common.log))
