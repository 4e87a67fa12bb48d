"""Run the hotspan benchmarks and write bench/results/latest.{md,json}.

    python bench/run.py            # full: ingest (2 x 20 s) + query on 10 M samples (~3-6 min;
                                   # the query data set is built once, ~1-2 min, and cached)
    python bench/run.py --quick    # small version, ~30 s, for CI-like checks
    python bench/run.py --only ingest|query  [--concurrency 32] [--rebuild]
    python bench/run.py --only agent [--quick]   # agent overhead vs py-spy and pyroscope-io
                                   # (~10 min, quick ~1.5 min; not in the default run)
    python bench/run.py --only traces [--quick] [--rebuild]   # OTLP span ingest, Tempo API
                                   # on 1 M spans, span profiles (~1 min, + ~1.5 min once to
                                   # build the 1 M spans; not in the default run)
    python bench/run.py --only ui [--quick]   # flame graph decode/draw/zoom in Chromium (~5 s)
    python bench/run.py --only clickhouse [--quick] [--rebuild]   # DuckDB beside ClickHouse:
                                   # ingest with 1 and 2 servers, queries at 10 M and 100 M
                                   # samples (~13 min, + ~7 min once to build the data; quick
                                   # ~2 min; not in the default run; see bench/README.md)
    python bench/run.py --only rules [--quick]   # recording rules' ingest cost,
                                   # "why is this trace slow?", alert evaluation (~4 min,
                                   # quick ~1.5 min; not in the default run)
    python bench/run.py --only grafana [--quick]   # JFR ingest beside pprof,
                                   # TraceQL search and metrics, SelectHeatmap beside
                                   # SelectSeries (~4-5 min, quick ~1-1.5 min; not in the
                                   # default run)
    python bench/run.py --only scaleout [--quick]   # one and two servers over one
                                   # ClickHouse, each part under its own CPU quota (root,
                                   # cgroups; ~3 min, quick ~1 min; not in the default run)

Use the project's environment (e.g. ``/tmp/probe/bin/python bench/run.py``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

_fmt = common.fmt_number

TARGET_UPLOADS_PER_S = 1000
TARGET_1H_MS = 100
TARGET_24H_MS = 1000


log = common.log


def _verdict(ok: bool) -> str:
    return "meets target" if ok else "**misses target**"


def markdown(report: Dict[str, object]) -> str:
    m = report["machine"]  # type: ignore[index]
    lines: List[str] = []
    add = lines.append
    lines += common.head(
        f"hotspan benchmark results{' (quick)' if report['quick'] else ''}",
        str(report["command"]),
        float(report["wall_s"]),  # type: ignore[arg-type]
        common.machine_text(m, note="The load generator and the server share these CPUs."),  # type: ignore[arg-type]
    )
    ing = report.get("ingest")
    if ing:
        p = ing["params"]  # type: ignore[index]
        add("")
        add("## Ingest")
        add("")
        add(
            f"Each upload: a 10 s Python CPU profile at 100 Hz as gzipped pprof "
            f"({p['stacks_per_upload']} stacks, {p['frames_per_stack']} frames deep, "
            f"~{p['ticks_per_upload']} ticks, period {p['period_ns']:,} ns, "
            f"~{p['gzip_body_bytes_mean']:,} bytes gzipped); {p['distinct_uploads']} distinct "
            f"pre-built uploads from {p['services']} services x {p['pods_per_service']} pods, "
            f"a quarter with a few different stacks. {p['concurrency']} keep-alive connections "
            f"with one request in flight each, from a separate process; "
            f"{p['warmup_s']} s warm-up, then {p['duration_s']} s measured. "
            f'"samples" = pprof sample rows stored (one per stack per upload); '
            f'"ticks" = 10 ms CPU samples they represent.'
        )
        add("")
        add(
            "| endpoint | uploads/s | samples/s | ticks/s | p50 ms | p99 ms | errors "
            "| server CPU/wall "
            "| main thread CPU | other threads CPU | server peak RSS | target 1,000/s |"
        )
        add("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in [ing.get("baseline_ready")] + list(ing["runs"]):  # type: ignore[index,union-attr]
            if not r:
                continue
            c = r["server_cpu"]
            name = {
                "ingest": "`POST /ingest?format=pprof`",
                "push": "`POST /push.v1.PusherService/Push`",
                "ready": "`GET /ready` (HTTP stack only, baseline)",
            }[r["endpoint"]]
            # Acknowledged uploads that are not on disk would make any rate meaningless.
            stored_ok = (
                r.get("stored", {}).get("sample_rows", 0)
                >= 0.99 * r["samples_per_s"] * ing["params"]["duration_s"]
            )  # type: ignore[index]
            target = (
                ""
                if r["endpoint"] == "ready"
                else _verdict(r["uploads_per_s"] >= TARGET_UPLOADS_PER_S)
                if stored_ok
                else "**DATA MISSING on disk**"
            )
            add(
                f"| {name} | {_fmt(r['uploads_per_s'])} | {_fmt(r['samples_per_s'])} | "
                f"{_fmt(r['ticks_per_s'])} | {r['latency_ms']['p50']} | {r['latency_ms']['p99']} | "
                f"{r['errors']} | {c.get('cpu_per_wall')} | {c.get('main_thread_cpu_s')} s | "
                f"{c.get('other_threads_cpu_s')} s | {r['server_peak_rss_mib']} MiB | {target} |"
            )
        add("")
        add(
            "Server CPU is read from /proc/<pid>/task/*/stat over exactly the measured window: the "
            "main thread runs the event loop (HTTP, pprof decoding, pprof -> IngestBatch); the "
            "other threads are the group-commit writer and DuckDB's workers."
        )
        for r in ing["runs"]:  # type: ignore[index]
            s = r.get("stored", {})
            add(
                f"- {r['endpoint']}: {s.get('sample_rows', 0):,} sample rows, "
                f"{s.get('series')} series, "
                f"{s.get('stacks'):,} stacks, {s.get('frames'):,} frames on disk after shutdown "
                f"({s.get('data_dir_mib')} MiB); load generator used {r['loadgen_cpu_s']} CPU s."
            )
        bd = ing.get("breakdown")  # type: ignore[union-attr]
        if bd and "error" in bd:
            add("")
            add(f"Per-upload breakdown failed: `{bd['error']}`")
        elif bd:
            per = bd["ms_per_upload"]
            add("")
            add(f"Per-upload CPU breakdown (in-process, one thread, {bd['uploads']} uploads):")
            add("")
            add("| step | ms per upload |")
            add("|---|---:|")
            for k, v in per.items():
                label = {
                    "to_batch": "`pprof.to_batch` (frames, stacks, samples into IngestBatch)",
                    "commit_first_pass": f"store commit, {bd['commit_group']} uploads per "
                    "transaction, new stacks",
                    "commit_steady": f"store commit, {bd['commit_group']} uploads per "
                    "transaction, known stacks",
                }.get(k, k)
                add(f"| {label} | {v} |")
            add("")
            add(
                f"Ceilings implied: decoding (`pprof.parse` + `to_batch`) on one thread ≈ "
                f"{bd['single_thread_parse_ceiling_uploads_per_s']:,} uploads/s; the writer thread "
                f"≈ {bd['writer_ceiling_uploads_per_s']:,} uploads/s."
            )
    q = report.get("query")
    if q:
        p = q["params"]  # type: ignore[index]
        b = q["build"]  # type: ignore[index]
        h = q["http"]  # type: ignore[index]
        add("")
        add("## Query")
        add("")
        n_series = p["services"] * p["label_sets_per_service"]
        add(
            f"Data: {p['samples']:,} samples, {n_series:,} series ({p['services']} services x "
            f"{p['label_sets_per_service']} label sets), {p['stacks']:,} stacks "
            f"{p['min_depth']}-{p['max_depth']} frames deep over {p['frames']:,} frames, "
            f"{p['hours']} h at a {p['interval_s']} s upload interval; each service draws from "
            f"{p['stacks_per_service']:,} stacks (Zipf). Written through `DuckDBStore.write` "
            f"({'reused from cache' if q['data_reused'] else 'built in this run'}: "
            f"{q['data_dir']}, "
            f"{b.get('data_dir_mib')} MiB)."
        )
        add("")
        add(
            f"Build: stacks generated in {b.get('generate_stacks_s')} s; `IngestBatch.add_sample` "
            f"{_fmt(b.get('add_sample_rows_per_s'))} rows/s (timed on "
            f"{_fmt(b.get('add_sample_rows'))} rows; `add_columns`: "
            + (
                f"{_fmt(b.get('add_columns_rows_per_s'))} rows/s"
                if b.get("add_columns_rows_per_s")
                else "not in this version of the model"
            )
            + "); `store.write(...).result()` "
            f"{_fmt(b.get('store_write_rows_per_s'))} rows/s ({b.get('store_write_s')} s for all); "
            f"total {b.get('total_build_s')} s."
        )
        add("")
        add(
            f'Queries over HTTP for `{{service_name="{q["service"]}"}}` '
            f"({p['label_sets_per_service']} series), {q['runs']} timed runs after "
            f'{q["warmups"]} warm-ups (the first warm-up reported as "first"; it runs right after '
            f"server start, so the first query of all also loads the stack table). Server started "
            f"in {h['server_startup_s']} s with {h['server_rss_after_start_mib']} MiB RSS; "
            f"peak RSS {h['server_peak_rss_mib']} MiB."
        )
        add("")
        add("| query | median ms | p90 ms | first ms | response bytes | result | target |")
        add("|---|---:|---:|---:|---:|---|---|")
        for key, r in h["queries"].items():
            target = ""
            if key.startswith("merge_1h"):
                target = f"< {TARGET_1H_MS} ms: {_verdict(r['p90_ms'] < TARGET_1H_MS)}"
            elif key.startswith("merge_24h"):
                target = f"< {TARGET_24H_MS} ms: {_verdict(r['p90_ms'] < TARGET_24H_MS)}"
            res = ", ".join(f"{k} {_fmt(v)}" for k, v in r["result"].items())
            add(
                f"| {r['name']} | {r['median_ms']} | {r['p90_ms']} | {r['first_ms']} | "
                f"{r['response_bytes']:,} | {res} | {target} |"
            )
        bd = q["breakdown"]  # type: ignore[index]
        if "error" in bd:
            add("")
            add(f"In-process breakdown failed: `{bd['error']}`")
        for label in ("24h", "1h"):
            part = bd.get(label)
            if not part:
                continue
            info = part["info"]
            add("")
            add(
                f"### Where the {label} SelectMergeStacktraces time goes (in-process, "
                f"median of {bd['repeat']} after a first call)"
            )
            add("")
            add(
                f"{info['series']} series, {info['distinct_stacks']:,} distinct stacks "
                f"(matrix {info['stack_matrix_shape'][0]:,} x {info['stack_matrix_shape'][1]}), "
                f"{info['flamegraph_nodes']:,} flame graph nodes, "
                f"JSON {info['json_bytes']:,} bytes, "
                f"proto {info['proto_bytes']:,} bytes. Sum of the JSON path's warm steps: "
                f"{info['warm_json_path_sum_ms']} ms."
            )
            add("")
            add("| step | first ms | median ms |")
            add("|---|---:|---:|")
            for k, v in part["steps"].items():
                add(f"| {k} | {v['first_ms']} | {v['median_ms']} |")
        sv = bd.get("sql_variants_24h")
        if sv:
            add("")
            add(f"24 h aggregation SQL variants ({sv['_rows']:,} rows in `samples`):")
            add("")
            add("| SQL | first ms | median ms |")
            add("|---|---:|---:|")
            for k, v in sv.items():
                if not k.startswith("_"):
                    add(f"| {k} | {v['first_ms']} | {v['median_ms']} |")
    add("")
    return "\n".join(lines)


# The benchmarks run only when asked for (``--only``), each writing its own results
# (``bench/results/<name>.md``/``.json``): how each is started from this runner's options.
SEPARATE: Dict[str, Callable[[Any, argparse.Namespace], Dict[str, Any]]] = {
    "agent": lambda m, a: m.run(quick=a.quick, log=log),
    "traces": lambda m, a: m.run(
        quick=a.quick, log=log, rebuild=a.rebuild, concurrency=a.concurrency or 8
    ),
    "clickhouse": lambda m, a: m.run(
        quick=a.quick, log=log, rebuild=a.rebuild, concurrency=a.concurrency
    ),
    # The flame graph in Chromium, and the heavy views against a server.
    "ui": lambda m, a: m.run(quick=a.quick, log=log),
    # Recording rules, "why is this trace slow?", alerts.
    "rules": lambda m, a: m.run(quick=a.quick, log=log, concurrency=a.concurrency or 32),
    # JFR ingest, TraceQL search and metrics, heatmaps.
    "grafana": lambda m, a: m.run(quick=a.quick, log=log),
    # Two servers over one ClickHouse against one, each part under a CPU quota.
    "scaleout": lambda m, a: m.run(quick=a.quick, log=log),
}


def run_separate(name: str, args: argparse.Namespace, report: Dict[str, Any], t0: float) -> int:
    module = importlib.import_module(name)
    log(f"{name} benchmark ...")
    result = SEPARATE[name](module, args)
    return common.finish_run(name, result, report, t0, module.markdown, args.out, args.quick)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small, fast version")
    parser.add_argument(
        "--only",
        choices=["ingest", "query", *SEPARATE],
        help="run one benchmark (agent, traces, ui, clickhouse, rules, grafana and scaleout run "
        "only when asked for)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="in-flight ingest requests (default 32 for ingest and clickhouse's pprof pushes, "
        "8 for traces)",
    )
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="rebuild the cached query (or traces, or clickhouse) data",
    )
    parser.add_argument(
        "--out", default=common.RESULTS_DIR, help="results directory (default bench/results)"
    )
    args = parser.parse_args()

    t0 = time.perf_counter()
    report: Dict[str, object] = {
        "command": common.command_line("run.py"),
        "quick": args.quick,
        "machine": common.machine(),
    }
    m = report["machine"]
    log(f"machine: nproc {m['nproc']}, Python {m['python']}, {m['cpu_model']}")  # type: ignore[index]
    if args.only in SEPARATE:
        return run_separate(args.only, args, report, t0)
    if args.only in (None, "ingest"):
        import ingest

        log("ingest benchmark ...")
        report["ingest"] = ingest.run(quick=args.quick, concurrency=args.concurrency or 32)
        for r in report["ingest"]["runs"]:  # type: ignore[index]
            log(
                f"  {r['endpoint']}: {r['uploads_per_s']} uploads/s, "
                f"{r['samples_per_s']:,} samples/s, "
                f"peak RSS {r['server_peak_rss_mib']} MiB, errors {r['errors']}"
            )
    if args.only in (None, "query"):
        import query

        log("query benchmark ...")
        report["query"] = query.run(quick=args.quick, log=log, rebuild=args.rebuild)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    report["machine"]["loadavg_end"] = common.loadavg()  # type: ignore[index]

    md = markdown(report)
    stem = common.write_results("latest", report, md, args.out, args.quick)
    print(md)
    log(f"wrote {stem}.md/.json in {report['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
