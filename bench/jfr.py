"""JFR ingest, the Python reader beside the C one: CPU per upload and uploads/s, in one run.

The Java SDK's ``format=jfr`` uploads are read by ``hotspan.formats.jfr_profiles``: by the C
reader (``hotspan._speedups._jfr``) when it is built, else by the pure-Python reader it
mirrors (``HOTSPAN_NO_SPEEDUPS=1`` asks for that one).  Both are measured here, alternated:

1. In this process, one thread, no HTTP: ``jfr_profiles.ingest`` (gunzip, read, sum, the
   batch) per upload, and the read alone (``decode``), CPU time (``time.process_time``).
   Recordings: bench/grafana.py's, written to the JFR specification (10 s of CPU samples at
   100 Hz, ~300 stacks 38-42 deep), and Pyroscope's async-profiler recordings of a Kafka
   broker (CPU; CPU + locks + allocations) when ``../shared/fixtures`` has them.
2. A real ``hotspan server`` per reader (a fresh one each round), ``bench/loadgen.py`` sending
   the SDK's multipart uploads, 8 in flight: uploads/s and the server's CPU per upload, and
   that every acknowledged upload was stored.

    python bench/jfr.py [--quick]        # Markdown on stdout; bench/results/jfr.md/.json
    python bench/jfr.py --baseline REV   # and the code of commit REV beside them ("before")

``--baseline`` measures the package as it was at a commit (``git archive`` of its src/, pure
Python), in the same run and the same way: what "before" means for a change, measured beside
"after" on the same machine at the same time.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional

import common
import grafana

from hotspan.formats import jfr_profiles as jp
from hotspan.model.profile import IngestBatch

READERS = ["python", "c"]
BASELINE = "before"  # the reader of --baseline's commit
LOCK_FIXTURE = grafana.FIXTURE.replace("cpu__0", "cpu_lock0_alloc0__0")
TAGS = dict(kv.split("=", 1) for kv in grafana.JAVA_TAGS.split(","))


BASELINE_SRC: Optional[str] = None  # src/ of --baseline's commit
BASELINE_REV: Optional[str] = None


@contextlib.contextmanager
def reader_env(reader: str) -> Iterator[None]:
    """Servers started inside read with ``reader`` (the environment they inherit)."""
    saved = {k: os.environ.get(k) for k in ("HOTSPAN_NO_SPEEDUPS", "PYTHONPATH")}
    os.environ.pop("HOTSPAN_NO_SPEEDUPS", None)
    if reader == "python":
        os.environ["HOTSPAN_NO_SPEEDUPS"] = "1"
    elif reader == BASELINE:
        assert BASELINE_SRC is not None
        os.environ["PYTHONPATH"] = BASELINE_SRC  # before the installed package on sys.path
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def export_baseline(rev: str, into: str) -> str:
    """``src/`` of commit ``rev`` (its Python, without built extensions) under ``into``."""
    archive = subprocess.run(
        ["git", "-C", common.REPO_DIR, "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return os.path.join(into, "src")


_BASELINE_SCRIPT = """
import pickle, statistics, sys, time
from hotspan.formats import jfr_profiles as jp
from hotspan.model.profile import IngestBatch
bodies, tags, repeat = pickle.load(open(sys.argv[1], "rb"))
assert jp.__file__.startswith(sys.argv[2]), jp.__file__
def run():
    for body in bodies:
        jp.ingest(body, b"", IngestBatch(), "bench.app", tags, 0, 100, 1 << 28)
run()
times = []
for _ in range(repeat):
    t0 = time.process_time()
    run()
    times.append(time.process_time() - t0)
print(statistics.median(times) * 1000 / len(bodies))
"""


def baseline_ingest_ms(bodies: List[bytes], repeat: int) -> float:
    """CPU ms per upload of --baseline's ``jfr_profiles.ingest``, in a process of its own."""
    assert BASELINE_SRC is not None
    with tempfile.NamedTemporaryFile(suffix=".pickle") as f:
        pickle.dump((bodies, TAGS, repeat), f)
        f.flush()
        with reader_env(BASELINE):
            out = subprocess.run(
                [sys.executable, "-c", _BASELINE_SCRIPT, f.name, BASELINE_SRC],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
    return round(float(out.strip().splitlines()[-1]), 3)


def cpu_ms(fn: Any, n: int, repeat: int) -> float:
    """Median CPU ms per item of ``repeat`` passes of ``fn`` (which handles ``n`` items)."""
    fn()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return round(statistics.median(times) * 1000 / n, 3)


def in_process(recordings: List[bytes], repeat: int) -> Dict[str, Any]:
    bodies = [gzip.compress(r, 1) for r in recordings]
    out: Dict[str, Any] = {}
    for reader in ("python", "c"):
        native = reader == "c"

        def ingest(native: bool = native) -> None:
            fast = jp._fast
            if not native:
                jp._fast = None  # what HOTSPAN_NO_SPEEDUPS=1 gives at import
            try:
                for body in bodies:
                    jp.ingest(body, b"", IngestBatch(), "bench.app", TAGS, 0, 100, 1 << 28)
            finally:
                jp._fast = fast

        def decode(native: bool = native) -> None:
            for r in recordings:
                jp.decode(r, 100, native=native)

        out[reader] = {
            "ingest_ms": cpu_ms(ingest, len(bodies), repeat),
            "decode_ms": cpu_ms(decode, len(recordings), repeat),
        }
    if BASELINE_SRC is not None:
        out[BASELINE] = {"ingest_ms": baseline_ingest_ms(bodies, repeat), "decode_ms": None}
        out["speedup_ingest_vs_before"] = round(
            out[BASELINE]["ingest_ms"] / out["c"]["ingest_ms"], 1
        )
    out["speedup_ingest"] = round(out["python"]["ingest_ms"] / out["c"]["ingest_ms"], 1)
    out["speedup_decode"] = round(out["python"]["decode_ms"] / out["c"]["decode_ms"], 1)
    return out


def server_runs(
    uploads: List[Dict[str, Any]], rounds: int, warmup: float, duration: float
) -> List[Dict[str, Any]]:
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-jfr-")
    runs = []
    try:
        for r in range(rounds):
            for reader in READERS:  # alternated: a drift of the machine's load hits both
                with reader_env(reader):
                    res = grafana.run_upload_load("jfr", uploads, 8, warmup, duration, workdir)
                res.update(reader=reader, round=r + 1)
                for key in ("server_stderr", "error_examples", "status_counts"):
                    res.pop(key, None)
                runs.append(res)
                common.log(
                    f"  server {reader} round {r + 1}: {res['uploads_per_s']} uploads/s, "
                    f"{res['cpu_ms_per_upload']} ms CPU/upload, stored {res['stored']}"
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return runs


def _mean(runs: List[Dict[str, Any]], reader: str, key: str) -> Optional[float]:
    vals = [float(r[key]) for r in runs if r["reader"] == reader and r.get(key)]
    return round(statistics.mean(vals), 2) if vals else None


def run(quick: bool) -> Dict[str, Any]:
    if jp._fast is None:
        sys.exit("the C reader is not built: python3 setup.py build_ext --inplace")
    warmup, duration = (0.5, 3.0) if quick else (2.0, 10.0)
    rounds, repeat = (1, 3) if quick else (2, 5)
    synthetic = grafana.synthetic_recordings(8 if quick else 32)
    sets: List[Dict[str, Any]] = [
        {"name": "synthetic", "recordings": synthetic, "load": True, "app": "bench.app"}
    ]
    fixtures: Dict[str, Any] = {}
    # Only CPU recordings go to the server (bench/grafana.py's uploads check their totals).
    fixture_sets = (
        ("kafka cpu", grafana.FIXTURE, True),
        ("kafka cpu+lock+alloc", LOCK_FIXTURE, False),
    )
    for name, path, load in fixture_sets:
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = gzip.decompress(f.read())
            # The same recording again and again: the server keeps nothing of an upload that
            # would make a repeat cheaper.
            sets.append({"name": name, "recordings": [data] * 8, "load": load, "app": "kafka.app"})
        else:
            fixtures[name] = f"{os.path.normpath(path)} not found: skipped"
            common.log(f"  {name}: {fixtures[name]}")
    out_sets = []
    for s in sets:
        recordings = s.pop("recordings")
        item: Dict[str, Any] = {
            "name": s["name"],
            "recordings": len(recordings),
            "jfr_bytes": int(statistics.mean(len(r) for r in recordings)),
            "gzip_bytes": int(statistics.mean(len(gzip.compress(r, 1)) for r in recordings)),
        }
        item["in_process"] = in_process(recordings, repeat)
        common.log(f"  {s['name']}: in-process {item['in_process']}")
        if s["load"]:
            upload_set = grafana._upload_set(s["name"], recordings, s["app"])
            runs = server_runs(upload_set["uploads"], rounds, warmup, duration)
            item["server_runs"] = runs
            item["server"] = {
                reader: {
                    "uploads_per_s": _mean(runs, reader, "uploads_per_s"),
                    "cpu_ms_per_upload": _mean(runs, reader, "cpu_ms_per_upload"),
                    "all_stored": all(
                        r["stored"]["complete"] for r in runs if r["reader"] == reader
                    ),
                }
                for reader in READERS
            }
            c = item["server"]["c"]
            for reader, key in (
                ("python", "speedup_uploads_per_s"),
                (BASELINE, "speedup_vs_before"),
            ):
                other = item["server"].get(reader, {})
                if other.get("uploads_per_s") and c["uploads_per_s"]:
                    item["server"][key] = round(c["uploads_per_s"] / other["uploads_per_s"], 1)
        out_sets.append(item)
    return {
        "params": {"warmup_s": warmup, "duration_s": duration, "rounds": rounds},
        "baseline": BASELINE_REV,
        "skipped": fixtures,
        "sets": out_sets,
    }


def markdown(result: Dict[str, Any], command: str, machine: Dict[str, Any], wall: float) -> str:
    p = result["params"]
    lines = common.head(
        "hotspan benchmark: JFR ingest, the Python reader beside the C one",
        command,
        wall,
        common.machine_text(machine),
    )
    lines += [
        "",
        "Per upload, CPU ms: `jfr_profiles.ingest` (gunzip, read, sum, batch) and the read "
        "alone (`decode`), in this process, one thread, no HTTP. Server: a fresh `hotspan "
        "server` per reader and round (`HOTSPAN_NO_SPEEDUPS=1` for the Python one), the Java "
        f"SDK's multipart uploads from `bench/loadgen.py`, 8 in flight, {p['warmup_s']} s "
        f"warm-up, {p['duration_s']} s measured, {p['rounds']} round(s) alternated.",
        "",
        "| recording | bytes (gzip) | reader | ingest ms/upload | decode ms | server uploads/s "
        "| server CPU ms/upload | all stored |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for s in result["sets"]:
        for reader in [r for r in (BASELINE, "python", "c") if r in s["in_process"]]:
            ip = s["in_process"][reader]
            label = f"before ({result['baseline']})" if reader == BASELINE else reader
            sv = s.get("server", {}).get(reader, {})
            lines.append(
                f"| {s['name']} | {s['jfr_bytes']:,} ({s['gzip_bytes']:,}) | {label} | "
                f"{ip['ingest_ms']} | {ip['decode_ms'] or ''} | {sv.get('uploads_per_s', '')} | "
                f"{sv.get('cpu_ms_per_upload', '')} | "
                f"{'yes' if sv.get('all_stored') else ('' if not sv else 'NO')} |"
            )
    lines += ["", "C / Python (and C / before, with --baseline):", ""]
    for s in result["sets"]:
        ip = s["in_process"]
        text = f"- {s['name']}: ingest x{ip['speedup_ingest']} less CPU per upload, "
        text += f"read x{ip['speedup_decode']}"
        if "speedup_uploads_per_s" in s.get("server", {}):
            text += f"; the server takes x{s['server']['speedup_uploads_per_s']} the uploads/s"
        if "speedup_ingest_vs_before" in ip:
            text += f". Against {result['baseline']}: ingest x{ip['speedup_ingest_vs_before']}"
            if "speedup_vs_before" in s.get("server", {}):
                text += f", uploads/s x{s['server']['speedup_vs_before']}"
        lines.append(text + ".")
    for name, why in result.get("skipped", {}).items():
        lines.append(f"- {name}: {why}.")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer uploads, shorter load")
    ap.add_argument("--baseline", metavar="REV", help="also measure the code of commit REV")
    args = ap.parse_args()
    t0 = time.perf_counter()
    global BASELINE_SRC, BASELINE_REV
    tmp = None
    if args.baseline:
        tmp = tempfile.mkdtemp(prefix="hotspan-bench-jfr-baseline-")
        BASELINE_SRC = export_baseline(args.baseline, tmp)
        BASELINE_REV = args.baseline
        READERS.insert(0, BASELINE)
    report = {"command": common.command_line("jfr.py"), "machine": common.machine()}
    try:
        result = run(args.quick)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return common.finish_run("jfr", result, report, t0, markdown, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
