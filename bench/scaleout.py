"""Scale-out: does a second ``hotspan server`` over the same ClickHouse take more?

On a machine of 2 cores every part of the deployment (servers, ClickHouse, the load generator)
competes for the same CPUs, so two servers cannot show more than one does: whatever the first
leaves idle, the second only takes from the others.  Here each part runs under a CPU quota of
its own (a cgroup of the ``cpu`` controller, v1 or v2), as it would on a machine of that size
(:data:`QUOTAS`): each server 0.1 of a core, ClickHouse 1.4 (enough for two servers: a span
costs it 4-6 times what it costs a server, a profile sample 1.3-1.8 times), the load generator
0.3.  The same loads as ``clickhouse.py``'s ingest (``bench/ingest.py``'s pprof pushes,
``bench/traces.py``'s OTLP span exports) are sent to one server on DuckDB, one server on
ClickHouse and two servers on one ClickHouse (round robin); every acknowledged sample and span
is counted in the store afterwards.  The report gives the two servers' rate over one server's,
and the sizing figures: items per second per core of a server and per core of ClickHouse.

ClickHouse is the test fixture (``tests/clickhouse_fixture.py``: ClickHouse's HTTP interface
served by a Python process over chdb, the ClickHouse engine in-process); Debian's
``clickhouse-server`` (18.16, 2018) is too old for the schema.  Needs root (cgroups).

    python bench/scaleout.py [--quick] [--server-cpus 0.1] [--clickhouse-cpus 1.4]
    python bench/run.py --only scaleout [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import clickhouse
import common

_fmt = common.fmt_number
PERIOD_US = 100_000
SETUPS = (
    ("duckdb", "1 server, DuckDB"),
    ("clickhouse", "1 server, ClickHouse"),
    ("clickhouse-2", "2 servers, one ClickHouse"),
)
PROFILE_CONCURRENCY = 32
SPAN_CONCURRENCY = 16


class Quotas:
    """A cgroup with a CPU quota per role, under the machine's ``cpu`` hierarchy."""

    def __init__(self, cpus: Dict[str, float]) -> None:
        self.cpus = cpus
        self.root, self.v2 = _cpu_hierarchy()
        self.dirs: Dict[str, Path] = {}

    def place(self, role: str, pid: int) -> None:
        """``pid`` and its descendants into ``role``'s group (its threads move with it)."""
        group = self.dirs.get(role)
        if group is None:
            group = self.root / f"hotspan-scaleout-{os.getpid()}-{role}"
            group.mkdir(exist_ok=True)
            quota = int(self._cpus(role) * PERIOD_US)
            if self.v2:
                (group / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
            else:
                (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
                (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
            self.dirs[role] = group
        for each in [pid, *_descendants(pid)]:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                (group / "cgroup.procs").write_text(f"{each}\n")

    def throttled_s(self) -> Dict[str, float]:
        """Seconds each group spent throttled so far (its quota reached)."""
        out = {}
        for role, group in self.dirs.items():
            stat = dict(line.split()[:2] for line in (group / "cpu.stat").read_text().splitlines())
            ns = int(stat.get("throttled_time", 0)) if not self.v2 else 0
            us = int(stat.get("throttled_usec", 0)) if self.v2 else 0
            out[role] = round(ns / 1e9 + us / 1e6, 2)
        return out

    def close(self) -> None:
        for group in self.dirs.values():
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.root / "cgroup.procs").write_text(f"{pid}\n")
            with contextlib.suppress(OSError):
                group.rmdir()
        self.dirs.clear()

    def _cpus(self, role: str) -> float:
        return self.cpus["server" if role.startswith("server") else role]


def _cpu_hierarchy() -> Tuple[Path, bool]:
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists() or (v1 / "tasks").exists():
        return v1, False
    for v2 in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        controllers = v2 / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            subtree = v2 / "cgroup.subtree_control"
            if "cpu" not in subtree.read_text().split():
                subtree.write_text("+cpu\n")
            return v2, True
    raise SystemExit(
        "scaleout.py needs the cgroup cpu controller (v1 at /sys/fs/cgroup/cpu, or v2 with "
        "cpu enabled) and root to give each process a CPU quota"
    )


def _descendants(pid: int) -> List[int]:
    out: List[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{p}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


# Each part's quota, in cores.  ClickHouse takes 1.3-1.8 times a server's CPU for a profile
# sample and 4-6 times for a span (the sizing this benchmark measures): it gets enough for two
# servers of either, as a deployment would size it, so that what is measured is whether
# servers scale.  With two servers the sum stays under the 2 cores.
QUOTAS = {"server": 0.1, "clickhouse": 1.4, "loadgen": 0.3}


def run(
    quick: bool = False,
    log: Any = common.log,
    cpus: Optional[Dict[str, float]] = None,
) -> Dict[str, Any]:
    import ingest
    import traces

    cpus = cpus or QUOTAS
    warmup, duration = (0.5, 3.0) if quick else (2.0, 15.0)
    uploads = ingest.build_uploads(64 if quick else 512)
    bodies = traces.ingest_pool(*((120, 30) if quick else (1200, 100)))
    root, v2 = _cpu_hierarchy()
    out: Dict[str, Any] = {
        "params": {
            "quick": quick,
            "warmup_s": warmup,
            "duration_s": duration,
            "cpu_quotas": cpus,
            "cgroup": f"{root} ({'v2' if v2 else 'v1'})",
            "profile_concurrency": PROFILE_CONCURRENCY,
            "span_concurrency": SPAN_CONCURRENCY,
        },
        "runs": [],
    }
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-scaleout-")
    try:
        for kind, payload, conc in (
            ("profiles", uploads, PROFILE_CONCURRENCY),
            ("spans", bodies, SPAN_CONCURRENCY),
        ):
            for setup, label in SETUPS:
                log(f"  {kind}: {label}, {conc} in flight, {duration} s")
                quotas = Quotas(cpus)
                try:
                    r = clickhouse.run_ingest(
                        kind, setup, payload, conc, warmup, duration, workdir, log, quotas.place
                    )
                    # The groups are this run's own: what they were throttled is the run's.
                    r["throttled_s"] = quotas.throttled_s()
                finally:
                    quotas.close()
                r["label"] = label
                log(
                    f"    {_fmt(r['items_per_s'])} {kind[:-1] if kind == 'spans' else 'sample'}"
                    f"s/s, {r['requests_per_s']} requests/s, errors {r['errors']}, stored = "
                    f"acknowledged: {r['stored']['all_stored']}"
                )
                out["runs"].append(r)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def _cores(run: Dict[str, Any], role: str) -> float:
    return float(run["cpu"].get(role, {}).get("cpu_per_wall", 0.0))


def _servers_cores(run: Dict[str, Any]) -> float:
    return sum(_cores(run, r) for r in ("server0", "server1"))


def markdown(result: Dict[str, Any], command: str, m: Dict[str, Any], wall: float) -> str:
    p = result["params"]
    q = p["cpu_quotas"]
    lines = common.head(
        "Scale-out: servers over one ClickHouse, each part under its own CPU quota",
        command,
        wall,
        common.machine_text(m),
    )
    add = lines.append
    add("")
    add(
        f"CPU quotas (cgroup `cpu` controller, {p['cgroup']}): each server {q['server']} of a "
        f"core, ClickHouse {q['clickhouse']}, the load generator {q['loadgen']}; "
        f"{p['warmup_s']} s of warm-up, then {p['duration_s']} s measured. ClickHouse is the "
        "chdb fixture. Profiles: `bench/ingest.py`'s pprof pushes, "
        f"{p['profile_concurrency']} in flight; spans: `bench/traces.py`'s OTLP/HTTP exports, "
        f"{p['span_concurrency']} in flight. *CPU* columns: cores used over the measured "
        "window (the quota is the most each can use); *throttled*: seconds the group waited "
        "for its quota."
    )
    for kind, unit in (("profiles", "samples"), ("spans", "spans")):
        runs = [r for r in result["runs"] if r["kind"] == kind]
        if not runs:
            continue
        add("")
        add(f"## {kind}")
        add("")
        add(
            f"| setup | {unit}/s | requests/s | p99 ms | errors | servers' CPU | ClickHouse "
            "CPU | load generator CPU | throttled s | stored = acknowledged |"
        )
        add("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
        for r in runs:
            throttled = ", ".join(f"{k} {v}" for k, v in sorted(r["throttled_s"].items()) if v)
            add(
                f"| {r['label']} | {_fmt(r['items_per_s'])} | {r['requests_per_s']} | "
                f"{r['latency_ms'].get('p99')} | {r['errors']} | {_servers_cores(r):.2f} | "
                f"{_cores(r, 'clickhouse'):.2f} | {_cores(r, 'loadgen'):.2f} | "
                f"{throttled or '–'} | {'yes' if r['stored']['all_stored'] else '**no**'} |"
            )
        by = {r["setup"]: r for r in runs}
        one, two = by.get("clickhouse"), by.get("clickhouse-2")
        if one and two and one["items_per_s"]:
            add("")
            ratio = two["items_per_s"] / one["items_per_s"]
            add(
                f"Two servers over one ClickHouse take **{ratio:.2f}×** "
                f"what one server takes ({_fmt(two['items_per_s'])} against "
                f"{_fmt(one['items_per_s'])} {unit}/s)."
            )
        add("")
        add("Sizing from these runs (items per second per core used):")
        add("")
        add(f"| setup | {unit}/s per server core | {unit}/s per ClickHouse core |")
        add("|---|---:|---:|")
        for r in runs:
            server = _servers_cores(r)
            ch = _cores(r, "clickhouse")
            add(
                f"| {r['label']} | {_fmt(round(r['items_per_s'] / server)) if server else '–'} | "
                f"{_fmt(round(r['items_per_s'] / ch)) if ch else '–'} |"
            )
    errors = [
        f"{r['label']} ({r['kind']}): {text.strip()[-400:]}"
        for r in result["runs"]
        for text in r.get("server_stderr", [])
        if text and text.strip()
    ]
    lines += common.stderr_section(errors)
    add("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="3 s loads instead of 15 s")
    for role, cpus in QUOTAS.items():
        ap.add_argument(
            f"--{role}-cpus", type=float, default=cpus, help=f"the {role}'s quota, cores"
        )
    ap.add_argument("--out", default=common.RESULTS_DIR, help="results directory")
    args = ap.parse_args()
    t0 = time.perf_counter()
    report: Dict[str, Any] = {
        "command": common.command_line("scaleout.py"),
        "quick": args.quick,
        "machine": common.machine(),
    }
    quotas = {role: getattr(args, f"{role}_cpus") for role in QUOTAS}
    result = run(args.quick, common.log, quotas)
    return common.finish_run("scaleout", result, report, t0, markdown, args.out, args.quick)


if __name__ == "__main__":
    sys.exit(main())
