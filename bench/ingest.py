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
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple
from urllib.parse import quote

import numpy as np

import common
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
    for si, service in enumerate(SERVICES):
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
    name = quote(f"{up['service']}{{{labels}}}", safe="")
    path = f"/ingest?name={name}&from={up['ts_s']}&until={int(up['ts_s']) + 10}&format=pprof&spyName=pyspy&sampleRate=100"
    body: bytes = up["body"]  # type: ignore[assignment]
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
        f"User-Agent: hotspan-bench\r\n\r\n"
    )
    return head.encode() + body


def push_request(host: str, port: int, up: Dict[str, object]) -> bytes:
    from hotspan.formats.proto import push_pb2

    req = push_pb2.PushRequest()
    series = req.series.add()
    labels = {"__name__": "process_cpu", "service_name": up["service"], "pyroscope_spy": "pyspy"}
    labels.update(up["labels"])  # type: ignore[arg-type]
    for k, v in sorted(labels.items()):
        series.labels.add(name=k, value=str(v))
    series.samples.add(raw_profile=up["body"])  # type: ignore[arg-type]
    body = req.SerializeToString()
    head = (
        f"POST /push.v1.PusherService/Push HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n"
        f"Content-Length: {len(body)}\r\nUser-Agent: hotspan-bench\r\n\r\n"
    )
    return head.encode() + body


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
    result: Dict[str, object] = {"endpoint": endpoint, "server_startup_s": round(server.startup_s, 2)}
    try:
        make = ingest_request if endpoint == "ingest" else push_request
        reqs: List[Tuple[bytes, int, int]] = [
            (make(server.host, server.port, up), int(up["samples"]), int(up["ticks"]))  # type: ignore[arg-type]
            for up in uploads
        ]
        req_file = os.path.join(workdir, f"requests-{endpoint}.pickle")
        with open(req_file, "wb") as f:
            pickle.dump(reqs, f)
        result["request_bytes_mean"] = int(np.mean([len(r[0]) for r in reqs]))
        rss_sampler = common.RssSampler(server.pid)
        rss_sampler.start()
        rss_before = server.memory().get("VmRSS", 0)
        cpu = common.CpuWindow(server.pid)
        proc = subprocess.Popen(
            [
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
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        final = None
        server_cpu: Dict[str, float] = {}
        for line in proc.stdout:
            line = line.strip()
            if line == "measure-start":
                cpu.start()
            elif line == "measure-end":
                server_cpu = cpu.stop()
            elif line.startswith("{"):
                final = line
        proc.wait(timeout=120)
        if final is None:
            raise RuntimeError(f"load generator failed (exit {proc.returncode})")
        import json

        load = json.loads(final)
        mem = server.memory()
        peak_sampled = rss_sampler.stop()
        stop = server.stop()
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
            server_rss_before_mib=common.mib(rss_before),
            server_rss_end_mib=common.mib(mem.get("VmRSS", 0)),
            server_peak_rss_mib=common.mib(max(mem.get("VmHWM", 0), peak_sampled)),
            server_stop=stop,
        )
        result["stored"] = _verify(data_dir)
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


def _verify(data_dir: str) -> Dict[str, object]:
    """Rows that made it to disk (after the server shut down and committed)."""
    import duckdb

    path = os.path.join(data_dir, "hotspan.duckdb")
    con = duckdb.connect(path, read_only=True)
    try:
        samples, series = con.execute(
            "SELECT count(*), count(DISTINCT series_id) FROM samples"
        ).fetchone()
        stacks = con.execute("SELECT count(*) FROM stacks").fetchone()[0]
        frames = con.execute("SELECT count(*) FROM frames").fetchone()[0]
    finally:
        con.close()
    size = sum(os.path.getsize(os.path.join(data_dir, f)) for f in os.listdir(data_dir))
    return {
        "sample_rows": samples,
        "series": series,
        "stacks": stacks,
        "frames": frames,
        "data_dir_mib": common.mib(size),
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
        for endpoint in ("ingest", "push"):
            out["runs"].append(  # type: ignore[union-attr]
                run_endpoint(endpoint, uploads, concurrency, warmup, duration, workdir)
            )
    finally:
        if own_tmp:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
