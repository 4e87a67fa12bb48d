"""Ingest benchmark: concurrent pprof uploads to a real ``hotspan server`` over HTTP.

Each upload is shaped like a 10-second Python CPU profile at 100 Hz (~1,000 ticks): about 300
distinct stacks ~40 frames deep, sample type cpu/nanoseconds, period 10 ms, gzipped.  Uploads
vary (tick counts; a quarter of them swap a few stacks for others) and come from several
services, regions and pods.  All request bodies are built before anything is timed; the load
runs from a separate process (``bench/loadgen.py``) over keep-alive connections.

    python bench/ingest.py [--quick] [--concurrency 32] [--compare-src DIR]

writes ``bench/results/ingest.{md,json}``: uploads/s of ``/ingest`` and push, what the store
holds against what was acknowledged, OTLP/HTTP spans/s, and the server's CPU per upload by
thread (event loop, decoding threads, writer, the rest) beside a single-thread breakdown of the
steps.  ``--compare-src DIR`` runs the same loads against the server in ``DIR`` (another
checkout's ``src``, with its C extensions built) first, for a before/after table::

    git archive REV src | tar -x -C /tmp/before
    cp src/hotspan/_speedups/*.so /tmp/before/src/hotspan/_speedups/  # when C is unchanged

Run it under ``nice`` on a shared machine: the numbers are then what the machine left over.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import shutil
import sys
import tempfile
import time
from typing import Dict, Iterator, List, Optional, Tuple

import common
import loadgen
import numpy as np
import synth

SERVICES = ["checkout", "billing", "search", "users", "catalog", "gateway", "notifier", "ledger"]
REGIONS = ["eu-west-1", "us-east-1"]
PODS_PER_SERVICE = 4


def build_uploads(
    n_uploads: int,
    stacks_per_upload: int = 300,
    depth: int = 40,
    ticks_per_upload: int = 1000,
    seed: int = 1,
) -> List[Dict[str, object]]:
    """Pre-built upload bodies with their labels (round-robin over services and pods)."""
    rng = np.random.default_rng(seed)
    frames = synth.frame_universe(rng, 6000)
    templates = {}
    extra = 60
    for service in SERVICES:
        stacks = synth.grow_stacks(
            rng, stacks_per_upload + extra, len(frames), depth - 2, depth + 2
        )
        templates[service] = synth.PprofTemplate(frames, stacks)
    weights = synth.zipf_weights(stacks_per_upload, s=1.0, offset=3.0)
    base_ts = (time.time_ns() // 10**9 - 3600) * 10**9
    uploads = []
    for i in range(n_uploads):
        service = SERVICES[i % len(SERVICES)]
        pod = (i // len(SERVICES)) % PODS_PER_SERVICE
        region = REGIONS[pod % len(REGIONS)]
        idx = np.arange(stacks_per_upload)
        if rng.random() < 0.25:  # some uploads hit a few different code paths
            k = int(rng.integers(3, 15))
            swap = rng.choice(stacks_per_upload, size=k, replace=False)
            idx[swap] = stacks_per_upload + rng.choice(extra, size=k, replace=False)
        # Every stack gets at least one tick; the rest follow a skewed (hot path) distribution.
        ticks = 1 + rng.multinomial(ticks_per_upload - stacks_per_upload, rng.permutation(weights))
        ts = base_ts + (i // len(SERVICES)) * 10 * 10**9
        body = templates[service].build(idx.tolist(), ticks.tolist(), ts, 10 * 10**9)
        uploads.append(
            {
                "service": service,
                "labels": {
                    "region": region,
                    "pod": f"{service}-{pod}",
                    "env": "prod",
                },
                "ts_s": ts // 10**9,
                "body": body,
                "samples": stacks_per_upload,
                "ticks": int(ticks.sum()),
            }
        )
    return uploads


def ingest_request(host: str, port: int, up: Dict[str, object]) -> bytes:
    labels = ",".join(f"{k}={v}" for k, v in sorted(up["labels"].items()))  # type: ignore[union-attr]
    from_s = int(up["ts_s"])  # type: ignore[call-overload]
    name = f"{up['service']}{{{labels}}}"
    return loadgen.ingest_pprof(host, port, name, from_s, from_s + 10, up["body"], "pyspy")  # type: ignore[arg-type]


def push_request(host: str, port: int, up: Dict[str, object]) -> bytes:
    from hotspan.formats.proto import push_pb2

    req = push_pb2.PushRequest()
    series = req.series.add()
    labels = {"__name__": "process_cpu", "service_name": up["service"], "pyroscope_spy": "pyspy"}
    labels.update(up["labels"])  # type: ignore[arg-type]
    for k, v in sorted(labels.items()):
        series.labels.add(name=k, value=str(v))
    series.samples.add(raw_profile=up["body"])  # type: ignore[arg-type]
    headers = {"Content-Type": "application/proto", "Connect-Protocol-Version": "1"}
    return loadgen.request_bytes(
        "POST", host, port, "/push.v1.PusherService/Push", req.SerializeToString(), headers
    )


def ready_request(host: str, port: int, up: Dict[str, object]) -> bytes:
    """The HTTP stack alone: what uvicorn + Starlette cost per request with no work."""
    return loadgen.request_bytes("GET", host, port, "/ready")


# The server's threads by the name the OS shows (``hotspan-decode``, ``hotspan-writer``); the
# main thread runs the event loop (HTTP, routing, the handlers' Python).
THREAD_GROUPS = {"hotspan-decode": "decoding threads", "hotspan-writer": "writer (store)"}


class ThreadGroups:
    """The server's CPU between ``start()`` and ``stop()``, by group of threads."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._t0: Dict[int, Tuple[str, float]] = {}
        self.cpu_s: Dict[str, float] = {}

    def start(self) -> None:
        self._t0 = common.thread_times(self.pid)

    def stop(self) -> None:
        groups: Dict[str, float] = {}
        for tid, (comm, cpu) in common.thread_times(self.pid).items():
            used = cpu - self._t0.get(tid, ("", 0.0))[1]
            name = "event loop (main thread)" if tid == self.pid else THREAD_GROUPS.get(comm)
            name = name or "other threads"
            groups[name] = groups.get(name, 0.0) + used
        self.cpu_s = {k: round(v, 3) for k, v in sorted(groups.items())}


@contextlib.contextmanager
def server_src(src: Optional[str]) -> Iterator[None]:
    """Servers started inside import hotspan from ``src`` (another checkout's) when given."""
    if not src:
        yield
        return
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.path.abspath(src) + (os.pathsep + old if old else "")
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def drive_load(
    server: common.Server,
    req_file: str,
    concurrency: int,
    warmup: float,
    duration: float,
    groups: Optional[ThreadGroups] = None,
) -> Tuple[Dict[str, object], Dict[str, float]]:
    """Runs bench/loadgen.py on the pickled requests against the server: (the load
    generator's final report, the server's CPU over the measured window only); ``groups``
    reads the CPU by thread over the same window."""
    cpu = common.CpuWindow(server.pid)
    server_cpu: Dict[str, float] = {}

    def start() -> None:
        cpu.start()
        if groups is not None:
            groups.start()

    def stop() -> None:
        server_cpu.update(cpu.stop())
        if groups is not None:
            groups.stop()

    cmd = [
        sys.executable,
        os.path.join(common.BENCH_DIR, "loadgen.py"),
        "--host",
        server.host,
        "--port",
        str(server.port),
        "--requests",
        req_file,
        "--concurrency",
        str(concurrency),
        "--warmup",
        str(warmup),
        "--duration",
        str(duration),
    ]
    load = loadgen.follow(cmd, start, stop, timeout=120)
    return load, server_cpu


def run_endpoint(
    endpoint: str,
    uploads: List[Dict[str, object]],
    concurrency: int,
    warmup: float,
    duration: float,
    workdir: str,
    src: Optional[str] = None,
) -> Dict[str, object]:
    data_dir = tempfile.mkdtemp(prefix=f"ingest-{endpoint}-", dir=workdir)
    with server_src(src):
        server = common.Server(data_dir).start()
    result: Dict[str, object] = {
        "endpoint": endpoint,
        "server_startup_s": round(server.startup_s, 2),
    }
    try:
        make = {"ingest": ingest_request, "push": push_request, "ready": ready_request}[endpoint]
        reqs: List[Tuple[bytes, int, int]] = [
            (
                make(server.host, server.port, up),
                0 if endpoint == "ready" else int(up["samples"]),  # type: ignore[arg-type]
                0 if endpoint == "ready" else int(up["ticks"]),  # type: ignore[arg-type]
            )
            for up in uploads
        ]
        req_file = os.path.join(workdir, f"requests-{endpoint}.pickle")
        with open(req_file, "wb") as f:
            pickle.dump(reqs, f)
        result["request_bytes_mean"] = int(np.mean([len(r[0]) for r in reqs]))
        memory = common.LoadMemory(server)
        groups = ThreadGroups(server.pid)
        load, server_cpu = drive_load(server, req_file, concurrency, warmup, duration, groups)
        result.update(memory.stop_server())
        result.update(
            concurrency=concurrency,
            warmup_s=warmup,
            duration_s=duration,
            uploads_ok=load["ok"],
            uploads_per_s=round(load["ok"] / duration, 1),
            samples_per_s=round(load["samples"] / duration),
            ticks_per_s=round(load["ticks"] / duration),
            mb_per_s_in=round(load["bytes_sent"] / duration / 1e6, 2),
            errors=load["errors"],
            status_counts=load["status"],
            error_examples=load["error_examples"],
            latency_ms=load["latency_ms"],
            loadgen_cpu_s=load.get("loadgen_cpu_s"),
            server_cpu=server_cpu,
            server_cpu_by_thread_s=groups.cpu_s,
            acknowledged=load.get("acked"),
        )
        ok = int(load["ok"])  # type: ignore[call-overload]
        if ok:
            result["server_cpu_ms_per_upload"] = {
                name: round(cpu_s / ok * 1000, 3) for name, cpu_s in groups.cpu_s.items()
            }
            result["server_cpu_ms_per_upload"]["total"] = round(  # type: ignore[index]
                server_cpu["cpu_s"] / ok * 1000, 3
            )
        if endpoint != "ready":
            stored = _verify(data_dir)
            # Every upload stores one sample row per stack (every stack has a tick).
            per_upload = int(uploads[0]["samples"])  # type: ignore[call-overload]
            stored["uploads"] = stored["sample_rows"] / per_upload  # type: ignore[operator]
            stored["equals_acknowledged"] = stored["uploads"] == load.get("acked")
            result["stored"] = stored
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


def _verify(data_dir: str) -> Dict[str, object]:
    """Rows that made it to disk (after the server shut down and committed)."""
    (samples, series), (stacks,), (frames,) = common.stored_rows(
        data_dir,
        "SELECT count(*), count(DISTINCT series_id) FROM samples",
        "SELECT count(*) FROM stacks",
        "SELECT count(*) FROM frames",
    )
    return {
        "sample_rows": samples,
        "series": series,
        "stacks": stacks,
        "frames": frames,
        "data_dir_mib": common.dir_mib(data_dir),
    }


def _decode_upload(body: bytes) -> object:
    from hotspan.formats import pprof

    return pprof.parse(body, 128 * 1024 * 1024)


def pool_cost(uploads: List[Dict[str, object]], rounds: int = 4) -> Dict[str, object]:
    """Where the decode could run beside the event loop: decoding threads, or worker processes
    that send the decoded profile back (pickled).  CPU of this process per upload (the
    server's side; a worker process's own CPU is not in it) and wall time per upload."""
    from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor

    bodies = [up["body"] for up in uploads] * rounds
    out: Dict[str, object] = {}
    pools: List[Tuple[str, Executor]] = [
        ("threads (4)", ThreadPoolExecutor(4)),
        ("processes (2)", ProcessPoolExecutor(2)),
    ]
    for name, pool in pools:
        # Worker processes' CPU shows in RUSAGE_CHILDREN once they have exited: the whole
        # pool's life (start, warm-up, the measured uploads) for the total.
        children0 = _children_cpu()
        with pool:
            list(pool.map(_decode_upload, bodies[:32]))  # started and warm
            cpu0, t0 = time.process_time(), time.perf_counter()
            for future in [pool.submit(_decode_upload, b) for b in bodies]:
                future.result()
            n = len(bodies)
            own = time.process_time() - cpu0
            wall = time.perf_counter() - t0
        workers = _children_cpu() - children0
        out[name] = {
            "this_process_cpu_ms_per_upload": round(own / n * 1e3, 3),
            "workers_cpu_ms_per_upload": round(workers / (n + 32) * 1e3, 3),
            "total_cpu_ms_per_upload": round((own + workers * n / (n + 32)) / n * 1e3, 3),
            "wall_ms_per_upload": round(wall / n * 1e3, 3),
        }
    return out


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def breakdown(uploads: List[Dict[str, object]], workdir: str, group: int = 32) -> Dict[str, object]:
    """Per-upload CPU of each ingest step, in this process with time.perf_counter (one thread,
    no HTTP): gunzip, protobuf decode, pprof -> IngestBatch, and the store's group commit
    (``group`` uploads per transaction, as the writer thread coalesces them under load)."""
    from hotspan.formats import pprof
    from hotspan.formats.compression import maybe_gunzip
    from hotspan.model.profile import IngestBatch
    from hotspan.store.duckdb import DuckDBStore

    limit = 128 * 1024 * 1024
    n = len(uploads)
    # Warm the id caches the way a running server has them warm.
    for up in uploads[: min(n, 64)]:
        pprof.to_batch(pprof.parse(up["body"], limit), IngestBatch(), {"service_name": "w"}, 0)  # type: ignore[arg-type]
    t = {"gunzip (part of pprof.parse)": 0.0, "pprof.parse (gunzip + decode)": 0.0, "to_batch": 0.0}
    batches = []
    for up in uploads:
        t0 = time.perf_counter()
        maybe_gunzip(up["body"], limit)  # type: ignore[arg-type]
        t1 = time.perf_counter()
        prof = pprof.parse(up["body"], limit)  # type: ignore[arg-type]
        t2 = time.perf_counter()
        batch = IngestBatch()
        labels = {"service_name": str(up["service"]), "pyroscope_spy": "pyspy"}
        labels.update(up["labels"])  # type: ignore[arg-type]
        pprof.to_batch(prof, batch, labels, 0)
        t3 = time.perf_counter()
        t["gunzip (part of pprof.parse)"] += t1 - t0
        t["pprof.parse (gunzip + decode)"] += t2 - t1
        t["to_batch"] += t3 - t2
        batches.append(batch)
    data_dir = tempfile.mkdtemp(prefix="breakdown-", dir=workdir)
    store = DuckDBStore(data_dir)
    try:
        # First pass inserts new frames/stacks; the second pass is the steady state (known ids).
        commit_s = []
        for _ in range(2):
            t0 = time.perf_counter()
            for i in range(0, n, group):
                # Queued together, so the group-commit writer takes them as one transaction.
                futures = [store.write("anonymous", b) for b in batches[i : i + group]]
                for fut in futures:
                    fut.result()
            commit_s.append(time.perf_counter() - t0)
    finally:
        store.close()
        shutil.rmtree(data_dir, ignore_errors=True)
    per = {k: round(v / n * 1000, 3) for k, v in t.items()}
    per["commit_first_pass"] = round(commit_s[0] / n * 1000, 3)
    per["commit_steady"] = round(commit_s[1] / n * 1000, 3)
    parse_ms = per["pprof.parse (gunzip + decode)"] + per["to_batch"]
    return {
        "uploads": n,
        "commit_group": group,
        "ms_per_upload": per,
        "parse_total_ms": round(parse_ms, 3),
        "single_thread_parse_ceiling_uploads_per_s": round(1000 / parse_ms) if parse_ms else None,
        "writer_ceiling_uploads_per_s": round(1000 / per["commit_steady"])
        if per["commit_steady"]
        else None,
    }


def run_spans(quick: bool, workdir: str, src: Optional[str] = None) -> Dict[str, object]:
    """OTLP/HTTP span ingest (bench/traces.py's requests of 512 spans, 8 clients)."""
    import traces

    warmup, duration = (1.0, 3.0) if quick else (2.0, 15.0)
    n_bodies, distinct = (120, 30) if quick else (600, 60)
    bodies = traces.ingest_pool(n_bodies, distinct)
    with server_src(src):
        # run_ingest starts its server inside: the environment is read then.
        r = traces.run_ingest("http", bodies, 8, warmup, duration, workdir)
    cpu = r["server_cpu"]
    spans = r["spans_per_s"] * duration  # type: ignore[operator]
    keep = (
        "spans_per_s",
        "requests_per_s",
        "errors",
        "latency_ms",
        "acked_spans",
        "stored",
        "server_cpu",
        "loadgen_cpu_s",
        "status_counts",
    )
    out = {k: r[k] for k in keep if k in r}
    out["server_cpu_us_per_span"] = round(cpu["cpu_s"] / spans * 1e6, 2) if spans else None  # type: ignore[index]
    out["main_thread_us_per_span"] = (
        round(cpu["main_thread_cpu_s"] / spans * 1e6, 2) if spans else None  # type: ignore[index]
    )
    return out


def run(
    quick: bool = False,
    concurrency: int = 32,
    workdir: str = "",
    src: Optional[str] = None,
    spans: bool = False,
) -> Dict[str, object]:
    warmup, duration = (1.0, 3.0) if quick else (3.0, 20.0)
    n_uploads = 64 if quick else 512
    t0 = time.perf_counter()
    uploads = build_uploads(n_uploads)
    gen_s = time.perf_counter() - t0
    sizes = [len(u["body"]) for u in uploads]  # type: ignore[arg-type]
    own_tmp = not workdir
    workdir = workdir or tempfile.mkdtemp(prefix="hotspan-bench-ingest-")
    out: Dict[str, object] = {
        "params": {
            "distinct_uploads": n_uploads,
            "stacks_per_upload": 300,
            "frames_per_stack": "38-42",
            "ticks_per_upload": 1000,
            "period_ns": synth.PERIOD_NS,
            "services": len(SERVICES),
            "pods_per_service": PODS_PER_SERVICE,
            "gzip_body_bytes_mean": int(np.mean(sizes)),
            "concurrency": concurrency,
            "warmup_s": warmup,
            "duration_s": duration,
        },
        "generate_s": round(gen_s, 2),
        "runs": [],
    }
    try:
        try:
            # In this process: the code this checkout has, so not for another's server.
            out["breakdown"] = {} if src else breakdown(uploads, workdir)
            if not src:
                out["decode_pools"] = pool_cost(uploads)
        except Exception as exc:  # noqa: BLE001 - internal APIs move; keep the HTTP numbers
            out["breakdown"] = {"error": repr(exc)}
        out["baseline_ready"] = run_endpoint(
            "ready", uploads[:8], concurrency, warmup / 2, min(duration, 5.0), workdir, src
        )
        for endpoint in ("ingest", "push"):
            common.log(f"ingest: {endpoint} {'(' + src + ') ' if src else ''}...")
            out["runs"].append(  # type: ignore[union-attr]
                run_endpoint(endpoint, uploads, concurrency, warmup, duration, workdir, src)
            )
        if spans:
            common.log("ingest: OTLP/HTTP spans ...")
            out["spans"] = run_spans(quick, workdir, src)
    finally:
        if own_tmp:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


def _ms(run: Dict[str, object], key: str) -> str:
    per = run.get("server_cpu_ms_per_upload") or {}
    value = per.get(key)  # type: ignore[attr-defined]
    return f"{value:.3f}" if isinstance(value, (int, float)) else "–"


def _per_core(run: Dict[str, object]) -> str:
    """Uploads a second that one core of server CPU takes: what does not depend on how much
    of the machine the server got (on a shared machine, little)."""
    per = run.get("server_cpu_ms_per_upload") or {}
    total = per.get("total")  # type: ignore[attr-defined]
    return f"{1000 / total:,.0f}" if total else "–"


def markdown(result: Dict[str, object], command: str, m: Dict[str, object], wall: float) -> str:
    """The report: uploads/s and CPU per upload by thread, per server measured, the
    single-thread breakdown and span ingest."""
    lines = common.head(
        "hotspan ingest throughput",
        command,
        wall,
        common.machine_text(m, note="The load generator and the server share these CPUs."),  # type: ignore[arg-type]
    )
    p = result["after"]["params"]  # type: ignore[index]
    add = lines.append
    add("")
    add(
        f"Each upload: a 10 s Python CPU profile at 100 Hz as gzipped pprof "
        f"({p['stacks_per_upload']} stacks, {p['frames_per_stack']} frames deep, "
        f"~{p['gzip_body_bytes_mean']:,} bytes gzipped), {p['distinct_uploads']} distinct uploads "
        f"from {p['services']} services x {p['pods_per_service']} pods; {p['concurrency']} "
        f"keep-alive connections from a separate process, {p['warmup_s']} s warm-up, "
        f"{p['duration_s']} s measured. Server CPU per acknowledged upload in the measured "
        "window, by thread: the event loop (HTTP, routing, handlers), the decoding threads "
        "(gunzip, the C pprof decoder, batch building), the store's writer (one transaction per "
        "group of uploads), the rest (gRPC, rules, alerts). Uploads/s is what the server "
        "managed with the CPU it got (server CPU / wall, in cores: on a shared machine, less than "
        "two); uploads/s per core (1,000 / total ms) is what one core of server CPU takes."
    )
    add("")
    add(
        "| server | endpoint | uploads/s | server CPU / wall | total ms/upload | uploads/s per "
        "core | event loop | decoding threads | writer | other | stored = acknowledged | errors "
        "| p50 / p99 ms |"
    )
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for label in ("before", "after"):
        rep = result.get(label)
        if not rep:
            continue
        for r in rep["runs"]:  # type: ignore[index]
            st = r.get("stored") or {}
            ack = r.get("acknowledged")
            add(
                f"| {label} | {r['endpoint']} | {r['uploads_per_s']:,} | "
                f"{r['server_cpu']['cpu_per_wall']} | {_ms(r, 'total')} | {_per_core(r)} | "
                f"{_ms(r, 'event loop (main thread)')} | {_ms(r, 'decoding threads')} | "
                f"{_ms(r, 'writer (store)')} | {_ms(r, 'other threads')} | "
                f"{'yes' if st.get('equals_acknowledged') else 'NO'} "
                f"({st.get('uploads', 0):,.0f} / {ack:,}) | {r['errors']} | "
                f"{r['latency_ms']['p50']} / {r['latency_ms']['p99']} |"
            )
    b = result["after"].get("breakdown") or {}  # type: ignore[union-attr]
    if "ms_per_upload" in b:
        add("")
        add(
            f"Single-thread breakdown (this process, no HTTP, {b['uploads']} uploads; commit "
            f"in groups of {b['commit_group']}), ms per upload:"
        )
        add("")
        add("| step | ms |")
        add("|---|---:|")
        for k, v in b["ms_per_upload"].items():
            add(f"| {k} | {v} |")
    pools = result["after"].get("decode_pools")  # type: ignore[union-attr]
    if pools:
        add("")
        add(
            "Decoding beside the event loop, threads or worker processes (this process, "
            "gunzip + decode of every upload, the decoded profile sent back by a process "
            "pickled): CPU of the submitting process per upload (the server's side), of the "
            "worker processes, both together, and wall time per upload."
        )
        add("")
        add("| pool | this process's CPU ms/upload | workers' CPU | total CPU | wall ms/upload |")
        add("|---|---:|---:|---:|---:|")
        for name, p in pools.items():  # type: ignore[union-attr]
            add(
                f"| {name} | {p['this_process_cpu_ms_per_upload']} | "
                f"{p['workers_cpu_ms_per_upload']} | {p['total_cpu_ms_per_upload']} | "
                f"{p['wall_ms_per_upload']} |"
            )
    for label in ("before", "after"):
        sp = (result.get(label) or {}).get("spans")  # type: ignore[union-attr]
        if sp:
            add("")
            add(
                f"OTLP/HTTP spans ({label}): {sp['spans_per_s']:,} spans/s "
                f"({sp['requests_per_s']} requests of 512 spans/s, 8 clients), "
                f"{sp['server_cpu_us_per_span']} µs of server CPU per span "
                f"({_span_threads(sp)}), p99 {sp['latency_ms']['p99']} ms, errors "
                f"{sp['errors']}, stored {sp['stored']['span_rows']:,} of "
                f"{sp['acked_spans']:,} acknowledged."
            )
    return "\n".join(lines) + "\n"


# The server's threads by OS name, as the span run reads them: DuckDB's own worker threads
# keep the interpreter's name.
SPAN_THREADS = {
    "main": "event loop",
    "hotspan-decode": "decoding",
    "hotspan-writer": "writer",
    "python3": "DuckDB's threads",
}


def _span_threads(sp: Dict[str, object]) -> str:
    """µs of server CPU per span by thread, from the run's CPU window."""
    cpu = sp["server_cpu"]
    spans = sp["spans_per_s"] * cpu["wall_s"]  # type: ignore[index,operator]
    by_name = cpu.get("by_thread_name") or {}  # type: ignore[union-attr]
    if not spans or not by_name:
        return f"{sp['main_thread_us_per_span']} µs on the event loop"
    parts = [
        f"{label} {by_name.get(name, 0.0) / spans * 1e6:.1f}"
        for name, label in SPAN_THREADS.items()
    ]
    return "µs: " + ", ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--compare-src", default="", help="another checkout's src to measure first")
    ap.add_argument("--no-spans", action="store_true", help="skip OTLP span ingest")
    ap.add_argument("--out", default=common.RESULTS_DIR)
    args = ap.parse_args()
    t0 = time.perf_counter()
    report = {"command": common.command_line("ingest.py"), "machine": common.machine()}
    result: Dict[str, object] = {}
    if args.compare_src:
        result["before"] = run(
            args.quick, args.concurrency, src=args.compare_src, spans=not args.no_spans
        )
    result["after"] = run(args.quick, args.concurrency, spans=not args.no_spans)
    return common.finish_run(
        "ingest", result, report, t0, markdown, out_dir=args.out, quick=args.quick
    )


if __name__ == "__main__":
    sys.exit(main())
