"""Coverage-guided fuzzing of the server's decoders (atheris, i.e. libFuzzer for Python).

    python3 tests/fuzz/run.py                      # every target, 60 s in all (CI: --jobs 2)
    python3 tests/fuzz/run.py --seconds 3600 --work ~/.cache/hotspan-fuzz   # longer, resumable
    python3 tests/fuzz/run.py --targets jfr,pprof_c --seconds 600 --instrumented-c

Targets are in tests/fuzz/targets.py; seeds in tests/fuzz/corpus/<target>/ (and libFuzzer
dictionaries in tests/fuzz/dicts/), both written by make_seeds.py.  ``--seconds`` is
the wall time of the whole run: the targets share it, ``--jobs`` at a time.  Each input must
finish within ``--timeout`` seconds and the worker stay under ``--rss-limit-mb``; an input
that crashes, hangs, blows the memory up or raises anything but the server's 4xx errors is a
finding: it is copied to tests/fuzz/crashes/<target>/ (which tests/test_fuzz_crashes.py
replays on every test run), and the run exits 1.  New inputs the fuzzer finds go to
``--work`` (a temporary directory unless given), never into the committed seeds.

``--instrumented-c`` builds the C pprof decoder, JFR reader and OTLP span reader with clang,
AddressSanitizer and libFuzzer's coverage (``-fsanitize=address,fuzzer-no-link``) into the work
directory and fuzzes that build, under atheris' ASan runtime; the in-place build the tests use
is left alone.
``--extra-seeds DIR`` adds seed directories (e.g. ../shared/fixtures, read, never written).
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = HERE / "corpus"
CRASHES = HERE / "crashes"
TARGET_NAMES = (
    "pprof_c",
    "pprof_python",
    "jfr",
    "otlp_traces",
    "otlp_profiles",
    "body",
    "stacks",
)
# A worker's start (imports under instrumentation, reading the corpus) before libFuzzer's own
# clock starts: taken off each target's share so that the run keeps to --seconds.
STARTUP_S = 3.0
ARTIFACT = re.compile(r"^(crash|timeout|oom|leak|slow-unit)-")
# Shared fixtures by target (file name patterns), for --extra-seeds.
SEED_PATTERNS = {
    "pprof_c": ("*.pb", "*.pb.gz", "*.pprof"),
    "pprof_python": ("*.pb", "*.pb.gz", "*.pprof"),
    "jfr": ("*.jfr", "*.jfr.gz"),
}


@dataclass
class Result:
    target: str
    seconds: float
    runs: int
    coverage: str
    findings: List[Path]
    log: Path
    error: str = ""


def build_instrumented(work: Path) -> Path:
    """The C pprof decoder and JFR reader built with ASan and libFuzzer coverage, in a
    directory of their own."""
    cc = os.environ.get("CC") or next(
        (c for c in ("clang", "clang-19", "clang-18", "clang-17", "clang-16") if shutil.which(c)),
        None,
    )
    if cc is None:
        sys.exit("--instrumented-c needs clang (apt-get install clang)")
    out = work / "speedups"
    out.mkdir(parents=True, exist_ok=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for source, module in (("pprof.c", "_pprof"), ("jfr.c", "_jfr"), ("otlp.c", "_otlp")):
        cmd = [
            cc,
            "-shared",
            "-fPIC",
            "-std=c11",
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fsanitize=address,fuzzer-no-link",
            f"-I{sysconfig.get_paths()['include']}",
            str(ROOT / "src/hotspan/_speedups" / source),
            "-o",
            str(out / f"{module}{suffix}"),
        ]
        subprocess.run(cmd, check=True)
    return out


def sanitizer_env(speedups: Path) -> dict:
    import atheris

    return {
        "HOTSPAN_FUZZ_SPEEDUPS": str(speedups),
        "LD_PRELOAD": str(Path(atheris.path()) / "asan_with_fuzzer.so"),
        # Python is not built with ASan: its own leaks are not findings.  Every allocation
        # through malloc, so ASan sees the bytes objects the decoder reads.
        "ASAN_OPTIONS": (
            "detect_leaks=0:allocator_may_return_null=1:quarantine_size_mb=64:"
            # Symbolizing a crash's stack can outlast the input's timeout (a SIGALRM then ends
            # the worker before it saves the input): the Python traceback names the place.
            "symbolize=0"
        ),
        "PYTHONMALLOC": "malloc",
    }


def seed_dirs(target: str, extra: List[Path], scratch: Path) -> List[Path]:
    """The committed seeds and crashes, plus matching files of ``extra``: recordings for the
    JFR target decompressed (raw bytes mutate into more of the reader than a gzip stream
    does), profiles as they are.  Files past ``--max-len`` are cut there by libFuzzer."""
    dirs = [d for d in (CORPUS / target, CRASHES / target) if d.is_dir()]
    patterns = SEED_PATTERNS.get(target, ())
    if extra and patterns:
        copy = scratch / "extra-seeds" / target
        copy.mkdir(parents=True, exist_ok=True)
        for base in extra:
            for pattern in patterns:
                for path in base.rglob(pattern):
                    data = path.read_bytes()
                    if path.suffix == ".gz" and target == "jfr":
                        data = gzip.decompress(data)
                    (copy / path.name).write_bytes(data)
        dirs.append(copy)
    return dirs


def run_target(
    target: str, seconds: int, work: Path, args: argparse.Namespace, env: dict, extra: List[Path]
) -> Result:
    corpus = work / "corpus" / target
    artifacts = work / "artifacts" / target
    corpus.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    log = work / f"{target}.log"
    dictionary = HERE / "dicts" / f"{target}.dict"  # tokens of a text format (make_seeds.py)
    started = time.monotonic()
    deadline = started + seconds
    runs = 0
    coverage = ""
    findings: List[Path] = []
    error = ""
    with log.open("w") as out:
        # After a finding the worker stops; with --keep-going it starts again for the rest of
        # the target's time (a long run is not ended by its first bug).
        while True:
            left = int(deadline - time.monotonic())
            if left < 1:
                break
            launched = time.time()
            cmd = [
                sys.executable,
                str(HERE / "worker.py"),
                target,
                f"-max_total_time={left}",
                f"-timeout={args.timeout}",
                f"-rss_limit_mb={args.rss_limit_mb}",
                f"-max_len={args.max_len}",
                f"-artifact_prefix={artifacts}/",
                "-print_final_stats=1",
                *([f"-dict={dictionary}"] if dictionary.is_file() else []),
                str(corpus),
                *map(str, seed_dirs(target, extra, work)),
            ]
            proc = subprocess.run(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                cwd=ROOT,
                timeout=left + args.timeout + 120,
            )
            # By time, not name: an input found again is written over its earlier file.
            written = [
                p
                for p in sorted(artifacts.iterdir())
                if ARTIFACT.match(p.name) and p.stat().st_mtime >= launched - 1
            ]
            new = [p for p in written if p not in findings]
            findings.extend(new)
            if proc.returncode != 0 and not written:
                error = f"worker exited with status {proc.returncode} without a finding"
                break
            # Again an input it found before: one the seeds hold (it fails as they are read).
            if proc.returncode == 0 or not args.keep_going or not new:
                break
    text = log.read_text(errors="replace")
    for m in re.finditer(r"stat::number_of_executed_units: *(\d+)", text):
        runs += int(m.group(1))
    stats = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)", text)
    if stats:
        cov, ft, corp = stats[-1]
        coverage = f"cov {cov} ft {ft} corpus {corp}"
    return Result(target, time.monotonic() - started, runs, coverage, findings, log, error)


def keep_findings(result: Result) -> List[Path]:
    """Copy a run's findings into tests/fuzz/crashes/<target>/ (the replayed crash corpus)."""
    kept = []
    dest = CRASHES / result.target
    for path in result.findings:
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / path.name
        if not target.exists():
            shutil.copyfile(path, target)
        kept.append(target)
    return kept


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=60, help="wall time of the whole run")
    parser.add_argument("--jobs", type=int, default=1, help="targets fuzzed at once")
    parser.add_argument("--targets", default="", help="comma-separated (default: all)")
    parser.add_argument("--timeout", type=int, default=5, help="seconds one input may take")
    parser.add_argument(
        "--rss-limit-mb", type=int, help="worker memory limit (default 1024, ASan build 3072)"
    )
    parser.add_argument("--max-len", type=int, default=8192, help="largest input, in bytes")
    parser.add_argument("--work", type=Path, help="corpus and logs (default: a temporary dir)")
    parser.add_argument(
        "--instrumented-c", action="store_true", help="the C decoder under ASan, with coverage"
    )
    parser.add_argument(
        "--extra-seeds", type=Path, action="append", default=[], help="more seeds (read only)"
    )
    parser.add_argument("--keep-going", action="store_true", help="go on after a finding")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from tests.fuzz.targets import available

    names = [t for t in args.targets.split(",") if t] or list(TARGET_NAMES)
    if not args.targets and "pprof_c" in available():
        # pprof_c runs the Python decoder on every input as its reference, and is guided by
        # its coverage: pprof_python's share of the minute goes to the other targets.
        names.remove("pprof_python")
    unknown = set(names) - set(TARGET_NAMES)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)} (known: {', '.join(TARGET_NAMES)})")
    runnable = set(available())
    skipped = [t for t in names if t not in runnable]
    names = [t for t in names if t in runnable]
    for t in skipped:
        print(f"fuzz {t}: skipped (the C extension is not built)")
    jobs = max(1, min(args.jobs, len(names)))
    rounds = -(-len(names) // jobs)
    share = int(args.seconds / rounds - STARTUP_S)
    if share < 1:
        parser.error(f"--seconds {args.seconds} leaves no time for {len(names)} targets")

    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="hotspan-fuzz-")
        work = Path(tmp.name)
    else:
        work = args.work.expanduser().resolve()
        work.mkdir(parents=True, exist_ok=True)
    env = sanitizer_env(build_instrumented(work)) if args.instrumented_c else {}
    if args.rss_limit_mb is None:
        # Python under ASan, every allocation through malloc: ~600 MB before the first input.
        args.rss_limit_mb = 3072 if args.instrumented_c else 1024

    print(f"fuzz: {len(names)} targets, {share} s each, {jobs} at a time, work dir {work}")
    status = 0
    with ThreadPoolExecutor(jobs) as pool:
        futures = [
            pool.submit(run_target, t, share, work, args, env, args.extra_seeds) for t in names
        ]
        for future in futures:
            r = future.result()
            kept = keep_findings(r)
            verdict = "ok" if not kept and not r.error else "FAILED"
            print(f"fuzz {r.target}: {verdict}, {r.runs} inputs in {r.seconds:.0f} s, {r.coverage}")
            for path in kept:
                print(f"  finding: {path.relative_to(ROOT)} (log: {r.log})")
                print(_excerpt(r.log, path.name))
            if r.error:
                print(f"  {r.error}; the log's end:\n" + _tail(r.log))
            if kept or r.error:
                status = 1
    if status and tmp is not None:
        print("fuzz: logs are in the temporary work dir, removed now; rerun with --work DIR")
    if tmp is not None:
        tmp.cleanup()
    return status


def _excerpt(log: Path, artifact: str) -> str:
    """What the worker said about one finding: from the error to the input's file name."""
    lines = log.read_text(errors="replace").splitlines()
    end = next((i for i, line in enumerate(lines) if artifact in line), len(lines) - 1)
    start = end
    for marker in (r"=== Uncaught", r"ERROR: AddressSanitizer", r"ERROR: libFuzzer"):
        found = [i for i in range(max(0, end - 80), end + 1) if re.search(marker, lines[i])]
        if found:
            start = found[-1]
            break
    return "\n".join("    " + line for line in lines[start : end + 1])


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


if __name__ == "__main__":
    sys.exit(main())
