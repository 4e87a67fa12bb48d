"""Ingest benchmark: concurrent pprof uploads to a real ``hotspan server`` over HTTP.

Each upload is shaped like a 10-second Python CPU profile at 100 Hz (~1,000 ticks): about 300
distinct stacks ~40 frames deep, sample type cpu/nanoseconds, period 10 ms, gzipped.  Uploads
vary (tick counts; a quarter of them swap a few stacks for others) and come from several
services, regions and pods.  All request bodies are built before anything is timed; the load
runs from a separate process (``bench/loadgen.py``) over keep-alive connections.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Tuple

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


def drive_load(
    server: common.Server, req_file: str, concurrency: int, warmup: float, duration: float
) -> Tuple[Dict[str, object], Dict[str, float]]:
    """Runs bench/loadgen.py on the pickled requests against the server: (the load
    generator's final report, the server's CPU over the measured window only)."""
    cpu = common.CpuWindow(server.pid)
    server_cpu: Dict[str, float] = {}
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
    load = loadgen.follow(cmd, cpu.start, lambda: server_cpu.update(cpu.stop()), timeout=120)
    return load, server_cpu


def run_endpoint(
    endpoint: str,
    uploads: List[Dict[str, object]],
    concurrency: int,
    warmup: float,
    duration: float,
    workdir: str,
) -> Dict[str, object]:
    data_dir = tempfile.mkdtemp(prefix=f"ingest-{endpoint}-", dir=workdir)
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
        load, server_cpu = drive_load(server, req_file, concurrency, warmup, duration)
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
        )
        if endpoint != "ready":
            result["stored"] = _verify(data_dir)
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


def run(quick: bool = False, concurrency: int = 32, workdir: str = "") -> Dict[str, object]:
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
            out["breakdown"] = breakdown(uploads, workdir)
        except Exception as exc:  # noqa: BLE001 - internal APIs move; keep the HTTP numbers
            out["breakdown"] = {"error": repr(exc)}
        out["baseline_ready"] = run_endpoint(
            "ready", uploads[:8], concurrency, warmup / 2, min(duration, 5.0), workdir
        )
        for endpoint in ("ingest", "push"):
            out["runs"].append(  # type: ignore[union-attr]
                run_endpoint(endpoint, uploads, concurrency, warmup, duration, workdir)
            )
    finally:
        if own_tmp:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


if __name__ == "__main__":
    common.print_json(run(quick="--quick" in sys.argv))
