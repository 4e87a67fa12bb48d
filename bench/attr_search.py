"""Search on a span attribute at scale, DuckDB and ClickHouse: ``{span.enduser.id="…"}`` and
its neighbours, through each store's ``find_traces``, over a day of spans generated with SQL.

The spans are made inside each database by one ``INSERT ... SELECT`` over a range of numbers
(no Python per row), in the store's own tables, as ``bench/traces.py``'s generator shapes them:
traces of 14 spans a few milliseconds apart, evenly over 24 h; the root span (service
``frontend``) carries 9 attributes among them ``enduser.id`` (200,000 users), the others 8
(HTTP client calls: method, url.full, server.port...).  DuckDB's attribute index is then
written as commits leave it (``store/attr_index.py``): runs of ``RUN_ROWS`` rows, each sorted,
one ``INSERT ... SELECT`` per run (timed).  The ClickHouse store (the chdb fixture of
``tests/clickhouse_fixture.py``) is made first and its materialized view indexes the spans as
they are inserted; its tables are then merged (``OPTIMIZE TABLE ... FINAL``, the state once
background merges catch up).  Run with an older ``src`` (``PYTHONPATH``), the same data is
made in its tables, without the index: the numbers before it.

The default of 10,000,000 spans is what the 100 M samples level of ``bench/clickhouse.py``
holds (its 1 M spans grown 10x).  Each query runs once to warm up, then ``--runs`` times;
the median is reported.  Results: ``bench/results/attr_search.{md,json}``.

    python3 bench/attr_search.py [--spans N] [--runs 5] [--only duckdb,clickhouse]
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
DAY_NS = 86400 * SEC
START_NS = 1_700_000_000 * SEC
END_NS = START_NS + DAY_NS
SPANS_PER_TRACE = 14
CLICKHOUSE_PART = 500_000  # spans per INSERT
USERS = 200_000
# The users of the first traces: a rare value (a few traces each).
QUERIES: List[Tuple[str, str]] = [
    ("equal", '{span.enduser.id="user-%d"}'),
    ("regex", '{span.enduser.id=~"user-%d.*"}'),
    ("common_value", '{span.http.request.method="POST"}'),
    ("numeric", "{span.http.response.status_code>=500}"),
]


def _user(trace: int) -> int:
    return trace * 2654435761 % USERS


# One generator for both engines, which spell a few things their own way (``Spelling``).
class Spelling:
    def __init__(
        self,
        char: Callable[[int], str],
        text: Callable[[str], str],
        md5: str,
        raw: str,
        tenant: str,
        source: Callable[[int, int], str],
        div: str,
    ) -> None:
        self.char, self.text, self.md5, self.raw, self.tenant = char, text, md5, raw, tenant
        self.source, self.div = source, div


DUCKDB = Spelling(
    lambda c: f"chr({c})",
    lambda e: f"CAST({e} AS VARCHAR)",
    "md5(CAST(t AS VARCHAR))",
    "'\\x0a\\x00'::BLOB",
    "1",
    lambda first, count: f"range({first}, {first + count}) AS r(i)",
    "i // {}",
)
CLICKHOUSE = Spelling(
    lambda c: f"char({c})",
    lambda e: f"toString({e})",
    "lower(hex(MD5(toString(t))))",
    "''",
    f"'{TENANT}'",
    lambda first, count: f"(SELECT number AS i FROM numbers({first}, {count}))",
    "intDiv(i, {})",
)


def span_select(n: int, d: Spelling, first: int = 0, count: int = 0) -> str:
    """A SELECT of the spans ``first`` to ``first + count`` (all by default) of ``n``, in the
    columns of both stores' ``spans`` (the tenant first)."""
    traces = max(n // SPANS_PER_TRACE, 1)
    step = DAY_NS // traces
    rs, us, sus = d.char(30), d.char(31), d.char(28)
    s = d.text

    def kv(key: str, value: str, mark: str = us) -> str:
        return f"{rs}, '{key}', {mark}, {value}"

    root = ", ".join(
        [
            kv("http.request.method", "if(t % 3 = 0, 'POST', 'GET')"),
            kv("http.route", "'/api/orders/{id}'"),
            kv("url.path", f"'/api/orders/', {s('t % 50000')}"),
            kv("url.scheme", "'https'"),
            kv("http.response.status_code", "if(t % 50 = 0, '500', '200')"),
            kv("server.address", "'shop.example.com'"),
            kv("client.address", f"'10.0.', {s('t % 256')}, '.', {s('t % 251')}"),
            kv("user_agent.original", "'Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0'"),
            kv("enduser.id", f"'user-', {s(f't * 2654435761 % {USERS}')}"),
            rs,
        ]
    )
    child = ", ".join(
        [
            kv("http.request.method", "'GET'"),
            kv("url.full", f"'http://svc-', {s('j % 4')}, ':8080/items/', {s('t % 50000')}"),
            kv("server.address", f"'svc-', {s('j % 4')}"),
            kv("server.port", "'8080'"),
            kv("http.response.status_code", "'200'"),
            kv("network.protocol.version", "'1.1'", sus),
            kv("peer.service", f"'svc-', {s('j % 4')}"),
            kv("http.request.resend_count", "'0'"),
            rs,
        ]
    )
    return f"""
SELECT {d.tenant}, {d.md5}, i + 1, if(j = 0, 0, t * {SPANS_PER_TRACE} + 1),
       if(j = 0, 'GET /api/orders/{{id}}', 'GET /items/{{id}}'), if(j = 0, 2, 3),
       if(j = 0, 'frontend', concat('svc-', {s("j % 4")})),
       {START_NS} + t * {step} + j * 1000000,
       {START_NS} + t * {step} + j * 1000000 + if(j = 0, 70000000 + t % 50000000, 4000000),
       if(t % 50 = 0 AND j < 2, 2, 0),
       if(j = 0, concat({root}), concat({child})),
       1, {d.raw}
FROM (SELECT i, t, i - t * {SPANS_PER_TRACE} AS j
      FROM (SELECT i, {d.div.format(SPANS_PER_TRACE)} AS t FROM {d.source(first, count or n)}))
"""


def _timed(fn: Callable[[], Any], runs: int) -> Tuple[Any, Dict[str, Any]]:
    result = fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1000)
    return result, {
        "median_ms": round(statistics.median(times), 2),
        "min_ms": round(min(times), 2),
        "runs_ms": [round(t, 2) for t in times],
    }


def _queries(store: Any, runs: int) -> Dict[str, Any]:
    from hotspan.model.trace import TraceQuery
    from hotspan.query.traceql import parse_traceql

    out: Dict[str, Any] = {}
    for key, text in QUERIES:
        if "%d" in text:
            text = text % _user(3)
        spansets, conds = parse_traceql(text)
        query = TraceQuery(START_NS, END_NS, spansets, conds, 20, 3)
        found, summary = _timed(lambda q=query: store.find_traces(TENANT, q), runs)
        summary.update(
            query=text,
            traces=len(found),
            trace_ids=[t.trace_id for t in found],
        )
        out[key] = summary
        common.log(f"    {key} {text}: {summary['median_ms']} ms, {len(found)} traces")
    return out


def run_duckdb(n: int, runs: int, work: str) -> Dict[str, Any]:
    import duckdb

    from hotspan.store.duckdb import DuckDBStore

    data = os.path.join(work, "duckdb")
    store = DuckDBStore(data)
    store.close()
    path = os.path.join(data, "hotspan.duckdb")
    con = duckdb.connect(path)
    t0 = time.perf_counter()
    con.execute("INSERT INTO tenants VALUES (1, ?)", [TENANT])
    con.execute("INSERT INTO span_groups VALUES (1, 'frontend', ''::BLOB, '', ''::BLOB, '', '')")
    con.execute(f"INSERT INTO spans {span_select(n, DUCKDB)}")
    generated = time.perf_counter() - t0
    t0 = time.perf_counter()
    tables = {r[0] for r in con.execute("SHOW TABLES").fetchall()}
    if "span_attrs" in tables:
        # The index as commits leave it: runs of RUN_ROWS attribute rows, each sorted.
        from hotspan.store.attr_index import RUN_ROWS
        from hotspan.store.duckdb_schema import span_attr_rows

        per_span = con.execute(
            "SELECT avg(len(string_split(attrs, chr(30))) - 2) FROM spans"
        ).fetchone()[0]
        step = max(int(RUN_ROWS / per_span), 1)
        for first in range(0, n, step):
            rows = span_attr_rows(
                f"(SELECT * FROM spans WHERE span_id > {first} AND span_id <= {first + step})"
            )
            con.execute(f"INSERT INTO span_attrs SELECT * FROM ({rows}) ORDER BY h")
    indexed = time.perf_counter() - t0
    con.execute("CHECKPOINT")
    con.close()
    store = DuckDBStore(data)
    try:
        cur = store._cursor()
        spans = cur.execute("SELECT count(*) FROM spans").fetchone()[0]
        attrs = (
            cur.execute("SELECT count(*) FROM span_attrs").fetchone()[0]
            if "span_attrs" in tables
            else None
        )
        common.log(f"  duckdb: {spans} spans, {attrs} attribute rows")
        out = _queries(store, runs)
    finally:
        store.close()
    return {
        "spans": spans,
        "attribute_rows": attrs,
        "generate_s": round(generated, 1),
        "index_s": round(indexed, 1),
        "on_disk_mib": round(common.dir_mib(data), 1),
        "queries": out,
    }


def run_clickhouse(n: int, runs: int, work: str) -> Dict[str, Any]:
    sys.path.insert(0, common.REPO_DIR)
    from hotspan.store.clickhouse import ClickHouseStore
    from tests.clickhouse_fixture import start_clickhouse

    server = start_clickhouse(os.path.join(work, "chdb"))
    try:
        url = f"clickhouse://{server.host}:{server.port}/hotspan_attrs"
        store = ClickHouseStore(url, retention_ns=0)
        try:
            client = store._clients.get()
            t0 = time.perf_counter()
            # In parts: the materialized view writes ~8 index rows per span, and one insert of
            # every span would outlast the client's timeout on a busy machine.
            for first in range(0, n, CLICKHOUSE_PART):
                client.command(
                    "INSERT INTO spans (tenant, trace_id, span_id, parent_span_id, name, kind, "
                    "service, start_ns, end_ns, status_code, attrs, group_id, raw) "
                    f"{span_select(n, CLICKHOUSE, first, min(CLICKHOUSE_PART, n - first))}",
                    settings={"max_insert_threads": 2},
                )
            generated = time.perf_counter() - t0
            tables = {r[0] for r in client.query("SHOW TABLES").result_rows}
            t0 = time.perf_counter()
            for table in ("spans", "span_attrs"):
                if table in tables:
                    client.command(f"OPTIMIZE TABLE {table} FINAL")
            # OPTIMIZE returns with merges of other parts still running: let them finish.
            deadline = time.monotonic() + 120
            while (
                time.monotonic() < deadline
                and client.query(
                    "SELECT count() FROM system.merges WHERE database = currentDatabase()"
                ).result_rows[0][0]
            ):
                time.sleep(1)
            merged = time.perf_counter() - t0
            spans = client.query("SELECT count() FROM spans").result_rows[0][0]
            attrs = (
                client.query("SELECT count() FROM span_attrs").result_rows[0][0]
                if "span_attrs" in tables
                else None
            )
            size = client.query(
                "SELECT sum(bytes_on_disk) FROM system.parts WHERE active "
                "AND database = currentDatabase()"
            ).result_rows[0][0]
            common.log(f"  clickhouse: {spans} spans, {attrs} attribute rows")
            out = _queries(store, runs)
        finally:
            store.close()
    finally:
        server.stop()
    return {
        "spans": spans,
        "attribute_rows": attrs,
        "generate_s": round(generated, 1),
        "optimize_s": round(merged, 1),
        "on_disk_mib": round(common.mib(size), 1),
        "queries": out,
    }


def markdown(result: Dict[str, Any], command: str, machine: Dict[str, Any], wall: float) -> str:
    lines = common.head("Search on a span attribute", command, wall, common.machine_text(machine))
    add = lines.append
    add("")
    add(
        f"{result['spans_asked']:,} spans over 24 h generated with SQL in each store "
        "(`bench/attr_search.py`'s docstring: traces of 14 spans, 9 attributes on the root "
        f"with `enduser.id` among {USERS:,} users, 8 on the others). `find_traces` over the "
        f"whole day, limit 20, 3 spans per trace; 1 warm-up then {result['runs']} runs, "
        "median (min) in ms."
    )
    add("")
    add("| query | " + " | ".join(result["stores"]) + " |")
    add("|---|" + "---|" * len(result["stores"]))
    for key, _ in QUERIES:
        cells = []
        text = ""
        for name in result["stores"]:
            q = result["stores"][name]["queries"].get(key, {})
            text = q.get("query", text)
            cells.append(f"{q.get('median_ms')} ({q.get('min_ms')}), {q.get('traces')} traces")
        add(f"| `{text}` | " + " | ".join(cells) + " |")
    add("")
    add(
        "| store | spans | attribute rows | spans generated (s) | indexed / merged (s) "
        "| on disk (MiB) |"
    )
    add("|---|---|---|---|---|---|")
    for name, s in result["stores"].items():
        prep = s.get("index_s", s.get("optimize_s"))
        add(
            f"| {name} | {s['spans']:,} | {s['attribute_rows'] or '–'} | {s['generate_s']} | "
            f"{prep} | {s['on_disk_mib']} |"
        )
    if "agree" in result:
        add("")
        add(f"DuckDB and ClickHouse found the same traces for every query: {result['agree']}.")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default="duckdb,clickhouse")
    ap.add_argument("--out", default=common.RESULTS_DIR)
    ap.add_argument("--name", default="attr_search", help="results file name")
    args = ap.parse_args()
    t0 = time.perf_counter()
    report = {"command": common.command_line("attr_search.py"), "machine": common.machine()}
    result: Dict[str, Any] = {"spans_asked": args.spans, "runs": args.runs, "stores": {}}
    work = tempfile.mkdtemp(prefix="hotspan-bench-attrs-")
    try:
        for name in args.only.split(","):
            common.log(f"{name}: {args.spans:,} spans")
            run = run_duckdb if name == "duckdb" else run_clickhouse
            result["stores"][name] = run(args.spans, args.runs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stores = result["stores"]
    if len(stores) == 2:
        a, b = stores.values()
        result["agree"] = all(
            a["queries"][k]["trace_ids"] == b["queries"][k]["trace_ids"] for k, _ in QUERIES
        )
    return common.finish_run(args.name, result, report, t0, markdown, args.out)


if __name__ == "__main__":
    sys.exit(main())
