"""TraceQL metrics at scale, DuckDB and ClickHouse: the queries Grafana and Traces Drilldown
send, aggregated by the store (one statement, ``hotspan.store.metrics_sql``) over an hour of
10,000,000 spans, and the same queries read span by span by the engine over a slice of that
hour, to show the ratio.

The spans are made inside each database by one ``INSERT ... SELECT`` over a range of numbers
(no Python per row): traces of 8 spans a millisecond apart, evenly over the hour, in 10
services (span groups written through ``write_spans``, so that resource attributes are real),
20 routes (``span.http.route``), 100,000 users (``span.enduser.id``), durations spread over
powers of two, 2% errors.  Each query
goes through ``run_metrics`` as the Tempo API calls it (a 15 s step, 100 exemplars asked),
once to warm up, then ``--runs`` times; the median is reported, with spans/s from the spans
the answer says it inspected.  Results: ``bench/results/traceql_metrics.{md,json}``.

    python3 bench/traceql_metrics.py [--spans N] [--engine-spans N] [--runs 3]
        [--only duckdb,clickhouse]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # noqa: E402

TENANT = "bench"
SEC = 10**9
HOUR_NS = 3600 * SEC
START_NS = 1_700_000_000 * SEC
END_NS = START_NS + HOUR_NS
STEP_NS = 15 * SEC
SPANS_PER_TRACE = 8
SERVICES = 10
QUERIES: List[Tuple[str, str]] = [
    ("rate", "{} | rate()"),
    ("quantile_by_service", "{} | quantile_over_time(duration, .9) by (resource.service.name)"),
    ("histogram", "{} | histogram_over_time(duration)"),
    ("rate_by_route", "{} | rate() by (span.http.route)"),
    (
        "drilldown_errors",
        "{nestedSetParent<0 && status = error} | rate() by (resource.service.name)",
    ),
    # Traces Drilldown's comparison tab: errors against the rest, every attribute.
    ("compare_errors", "{} | compare({status = error})"),
    ("compare_slow_roots", "{nestedSetParent<0} | compare({duration > 1s}, 10)"),
]


class Spelling:
    """What the generator spells per engine."""

    def __init__(
        self, char: Callable[[int], str], text: Callable[[str], str], md5: str, hash: str,
        raw: str, source: Callable[[int], str], div: str,
    ) -> None:  # fmt: skip
        self.char, self.text, self.md5, self.hash, self.raw = char, text, md5, hash, raw
        self.source, self.div = source, div


DUCKDB = Spelling(
    lambda c: f"chr({c})",
    lambda e: f"CAST({e} AS VARCHAR)",
    "md5(CAST(t AS VARCHAR))",
    "hash(i)",
    "''::BLOB",
    lambda n: f"range({n}) AS r(i)",
    "i // {}",
)
CLICKHOUSE = Spelling(
    lambda c: f"char({c})",
    lambda e: f"toString({e})",
    "lower(hex(MD5(toString(t))))",
    "cityHash64(i)",
    "''",
    lambda n: f"(SELECT number AS i FROM numbers({n}))",
    "intDiv(i, {})",
)


def span_select(n: int, d: Spelling, tenant: str, groups: List[int]) -> str:
    """A SELECT of ``n`` spans in the columns of both stores' ``spans``."""
    traces = max(n // SPANS_PER_TRACE, 1)
    step = HOUR_NS // traces
    rs, us = d.char(30), d.char(31)
    s = d.text
    # A route, a status code and a user id (100,000 of them: most attribute texts differ).
    attrs = (
        f"concat({rs}, 'http.route', {us}, '/route-', {s('t % 20')}, "
        f"{rs}, 'http.response.status_code', {us}, if(h % 50 = 0, '500', '200'), "
        f"{rs}, 'enduser.id', {us}, 'u-', {s('t % 100000')}, {rs})"
    )
    gids = "[" + ", ".join(str(g) for g in groups) + "]"
    return f"""
SELECT {tenant}, {d.md5}, i + 1, if(j = 0, 0, t * {SPANS_PER_TRACE} + 1),
       concat('op-', {s("(t + j) % 20")}), if(j = 0, 2, 3),
       concat('svc-', {s(f"t % {SERVICES}")}),
       {START_NS} + t * {step} + j * 1000000,
       {START_NS} + t * {step} + j * 1000000 + (1000 + h % 1000) * (1 + h % 4096),
       if(h % 50 = 0, 2, 0), {attrs}, {gids}[t % {SERVICES} + 1], {d.raw}
FROM (SELECT i, t, i - t * {SPANS_PER_TRACE} AS j, {d.hash} AS h
      FROM (SELECT i, {d.div.format(SPANS_PER_TRACE)} AS t FROM {d.source(n)}))
"""


def _groups(store: Any) -> List[int]:
    """One real span per service through ``write_spans``: its group (resource attributes)
    and the tenant are then the store's own; the group ids, by service."""
    from hotspan.model.trace import SpanBatch, SpanGroup, SpanWriteRow, flatten_attributes

    out = []
    for k in range(SERVICES):
        batch = SpanBatch()
        resource = [("service.name", f"svc-{k}", "string"), ("k8s.namespace", "shop", "string")]
        group = SpanGroup(f"svc-{k}", f"r{k}".encode(), "", b"", "", flatten_attributes(resource))
        gid = batch.add_group(group)
        batch.rows.append(
            SpanWriteRow(
                "f" * 32, 2**63 + k, 0, "seed", 2, f"svc-{k}", START_NS - 2 * HOUR_NS,
                START_NS - 2 * HOUR_NS + 1000, 0, "", gid, b"",
            )
        )  # fmt: skip
        store.write_spans(TENANT, batch).result()
        out.append(gid)
    return out


def _timed(
    fn: Callable[[], Any], runs: int, cpu: Callable[[], float]
) -> Tuple[Any, List[float], List[float]]:
    """The result, wall times and CPU times (``cpu``: seconds so far, of every process that
    works on the query) of ``runs`` runs after a warm-up."""
    result = fn()  # warm-up
    times, cpus = [], []
    for _ in range(runs):
        c0, t0 = cpu(), time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        cpus.append(cpu() - c0)
    return result, times, cpus


def _queries(
    store: Any, runs: int, engine_window_ns: int, cpu: Callable[[], float]
) -> Dict[str, Any]:
    from hotspan.query.traceql import MetricsRequest, parse_query, run_metrics

    full = MetricsRequest(START_NS, END_NS, STEP_NS, exemplars=100)
    part = MetricsRequest(START_NS, START_NS + engine_window_ns, STEP_NS, exemplars=100)
    out: Dict[str, Any] = {}
    for key, text in QUERIES:
        query = parse_query(text)
        row: Dict[str, Any] = {"query": text}
        for name, req, in_store, n_runs in (
            ("sql", full, True, runs),
            ("sql_slice", part, True, runs),
            ("engine_slice", part, False, 1),
        ):
            result, times, cpus = _timed(
                lambda r=req, s=in_store: run_metrics(
                    store, TENANT, query, r, max_spans=10**9, in_store=s
                ),
                n_runs,
                cpu,
            )
            median = statistics.median(times)
            cpu_s = statistics.median(cpus)
            row[name] = {
                "median_s": round(median, 4),
                "runs_s": [round(t, 4) for t in times],
                "cpu_s": round(cpu_s, 4),
                "spans": result.inspected_spans,
                "spans_per_s": round(result.inspected_spans / median),
                "spans_per_cpu_s": round(result.inspected_spans / max(cpu_s, 1e-6)),
                "series": len(result.series),
                "exemplars": sum(len(s.exemplars) for s in result.series),
                "partial": result.partial,
            }
            common.log(
                f"    {key} {name}: {median:.3f} s ({cpu_s:.3f} s CPU), "
                f"{result.inspected_spans} spans, {result.inspected_spans / median / 1e6:.2f} M "
                "spans/s"
            )
        row["ratio"] = round(
            row["sql_slice"]["spans_per_s"] / max(row["engine_slice"]["spans_per_s"], 1), 1
        )
        out[key] = row
    return out


def run_duckdb(n: int, runs: int, work: str, window: int) -> Dict[str, Any]:
    from hotspan.store.duckdb import DuckDBStore

    store = DuckDBStore(os.path.join(work, "duckdb"))
    try:
        groups = _groups(store)
        cur = store._cursor()
        tid = cur.execute("SELECT tenant_id FROM tenants WHERE tenant = ?", [TENANT]).fetchone()
        t0 = time.perf_counter()
        cur.execute(
            "INSERT INTO spans (tenant_id, trace_id, span_id, parent_span_id, name, kind, "
            "service, start_ns, end_ns, status_code, attrs, group_id, raw) "
            + span_select(n, DUCKDB, str(tid[0]), groups)
        )
        cur.execute("CHECKPOINT")
        generated = time.perf_counter() - t0
        spans = cur.execute("SELECT count(*) FROM spans").fetchone()[0]
        common.log(f"  duckdb: {spans} spans in {generated:.0f} s")
        out = _queries(store, runs, window, time.process_time)  # DuckDB's threads are ours
    finally:
        store.close()
    return {"spans": spans, "generate_s": round(generated, 1), "queries": out}


def run_clickhouse(n: int, runs: int, work: str, window: int) -> Dict[str, Any]:
    sys.path.insert(0, common.REPO_DIR)
    from hotspan.store.clickhouse import ClickHouseStore
    from tests.clickhouse_fixture import start_clickhouse

    server = start_clickhouse(os.path.join(work, "chdb"))
    try:
        url = f"clickhouse://{server.host}:{server.port}/hotspan_metrics"
        store = ClickHouseStore(url, retention_ns=0)
        try:
            groups = _groups(store)
            client = store._clients.get()
            t0 = time.perf_counter()
            client.command(
                "INSERT INTO spans (tenant, trace_id, span_id, parent_span_id, name, kind, "
                "service, start_ns, end_ns, status_code, attrs, group_id, raw) "
                + span_select(n, CLICKHOUSE, f"'{TENANT}'", groups),
                settings={"max_insert_threads": 2},
            )
            client.command("OPTIMIZE TABLE spans FINAL")
            generated = time.perf_counter() - t0
            spans = client.query("SELECT count() FROM spans").result_rows[0][0]
            common.log(f"  clickhouse: {spans} spans in {generated:.0f} s")
            pid = server.process.pid
            out = _queries(store, runs, window, lambda: time.process_time() + common.proc_cpu(pid))
        finally:
            store.close()
    finally:
        server.stop()
    return {"spans": spans, "generate_s": round(generated, 1), "queries": out}


def markdown(result: Dict[str, Any], command: str, m: Dict[str, Any], wall: float) -> str:
    lines = common.head("TraceQL metrics in the store", command, wall, common.machine_text(m))
    lines += [
        "",
        "The load averages are in the machine line: where other work shared the cores, read "
        "the ratios and the CPU columns more than the wall times.",
        "",
        f"{result['spans']:,} spans over one hour; the engine reads span by span a slice of "
        f"{result['engine_window_s']} s of it (`sql slice` is the store over the same slice). "
        "Step 15 s, 100 exemplars asked, as Grafana asks. Times are medians of run_metrics "
        "(statement, rows into series, exemplars); CPU is that of every process working on the "
        "query (this one, and the chdb server for ClickHouse), the fairer figure on a shared "
        "machine. `ratio`: the store's spans/s over the engine's, on the same slice. For the "
        "last query spans/s counts the spans that meet its conditions (errors), not the spans "
        "scanned.",
    ]
    for store in ("duckdb", "clickhouse"):
        if store not in result:
            continue
        r = result[store]
        lines += [
            "",
            f"## {store}: {r['spans']:,} spans generated in {r['generate_s']} s",
            "",
            "| query | store, hour: wall (CPU) | M spans/s (per CPU-s) | store, slice "
            "| engine, slice: wall (CPU) | engine M spans/s (per CPU-s) | ratio |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in r["queries"].values():
            sql, sl, eng = row["sql"], row["sql_slice"], row["engine_slice"]
            query = row["query"].replace("|", "\\|")
            lines.append(
                f"| `{query}` | {sql['median_s']:.3f} s ({sql['cpu_s']:.3f} s), "
                f"{sql['spans']:,} spans | {sql['spans_per_s'] / 1e6:.1f} "
                f"({sql['spans_per_cpu_s'] / 1e6:.1f}) | {sl['median_s']:.3f} s "
                f"| {eng['median_s']:.2f} s ({eng['cpu_s']:.2f} s), {eng['spans']:,} spans "
                f"| {eng['spans_per_s'] / 1e6:.3f} ({eng['spans_per_cpu_s'] / 1e6:.3f}) "
                f"| {row['ratio']}x |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=10_000_000)
    ap.add_argument("--engine-spans", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="duckdb,clickhouse")
    ap.add_argument("--out", default=common.RESULTS_DIR)
    args = ap.parse_args()
    only = common.comma_list(ap, args.only, ("duckdb", "clickhouse"), "store")
    t0 = time.perf_counter()
    report = {"command": common.command_line("traceql_metrics.py"), "machine": common.machine()}
    window = max(HOUR_NS * args.engine_spans // args.spans // STEP_NS, 1) * STEP_NS
    result: Dict[str, Any] = {"spans": args.spans, "engine_window_s": window // SEC}
    work = tempfile.mkdtemp(prefix="hotspan-metrics-")
    try:
        if "duckdb" in only:
            result["duckdb"] = run_duckdb(args.spans, args.runs, work, window)
        if "clickhouse" in only:
            result["clickhouse"] = run_clickhouse(args.spans, args.runs, work, window)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    quick = args.spans < 10_000_000
    return common.finish_run("traceql_metrics", result, report, t0, markdown, args.out, quick=quick)


if __name__ == "__main__":
    sys.exit(main())
