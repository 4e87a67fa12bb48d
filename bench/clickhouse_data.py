"""The query data sets of ``bench/clickhouse.py``: one data set in DuckDB and in ClickHouse,
at 10 M samples and grown to 100 M inside each database.

10 M level, written through each store's write path:

- samples: ``bench/query.py``'s data set (1,000 series = 20 services x 50 label sets, 50,000
  stacks, 24 h at a 10 s upload interval), built by ``query.build`` itself: for DuckDB its own
  cache is reused (and copied), for ClickHouse the same function writes through
  ``ClickHouseStore.write``;
- spans: ``bench/traces.py``'s 1 M spans (``traces.generate``, same seed and day), pushed
  through a real ``hotspan server`` over OTLP/HTTP, as ``traces.py`` loads them.

100 M level, made from the 10 M level with SQL (``grow_duckdb`` / ``grow_clickhouse``):

- every sample is there ``GROW`` times: as it was and shifted k seconds later (k = 1..9),
  wrapped back into the same 24 h (so the day keeps its shape and the 24 h window holds exactly
  10x the rows; same series, stacks and values: each series uploads 10x as often);
- every span is there ``GROW`` times, at the same times under another trace id (the first byte
  of the trace id XOR k, in the ``trace_id`` column, in the OTLP message kept in ``raw`` and in
  ClickHouse's ``trace_index``); span ids, resources and tags are the same.

Cached under ``/tmp/hotspan-bench-clickhouse-<hash>/`` (``duckdb-10m/``, ``duckdb-100m/``,
``clickhouse/`` = the chdb data directory with the databases ``hotspan_10m`` and
``hotspan_100m``); each stage records itself in ``stage-<name>.json`` when done, so an
interrupted build resumes.  The hash covers the parameters, ``DATA_VERSION``, the tables of
both stores (DuckDB's ``SCHEMA``, ClickHouse's ``create_statements``) and the span model and
decoding.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import common
import loadgen
import query
import traces

GROW = 10
# One more whenever what this module stores changes (the hash of the cache directory has it).
DATA_VERSION = 1
TENANT = query.TENANT  # the server's default tenant too
DB_10M = "hotspan_10m"
DB_100M = "hotspan_100m"
SEC = 10**9
DAY_NS = 86400 * SEC
SPANS_FULL = {"spans": 1_000_000, "hours": 24, "end_s": traces.END_S, "seed": 5}
SPANS_QUICK = dict(SPANS_FULL, spans=50_000)
SPAN_LOAD_CONCURRENCY = 8
# What decides what is stored: a change here gets a fresh build.
_STORED_FORMAT_SOURCES = (
    "model/trace.py",
    "formats/otlp_traces.py",
)

Log = Callable[[str], None]


def params_for(quick: bool) -> Dict[str, Any]:
    return {
        "samples": query.QUICK if quick else query.FULL,
        "spans": SPANS_QUICK if quick else SPANS_FULL,
        "grow": GROW,
    }


def cache_dir_for(params: Dict[str, Any]) -> str:
    import hotspan
    import hotspan.store.duckdb as duckdb_store
    from hotspan.store import clickhouse_schema

    h = hashlib.sha1(json.dumps(dict(params, version=DATA_VERSION), sort_keys=True).encode())
    # The tables themselves, not the files that make them: a comment does not rebuild.
    h.update(duckdb_store.SCHEMA.encode())
    layout = clickhouse_schema.Layout(DB_10M)
    h.update("\n".join(clickhouse_schema.create_statements(layout)).encode())
    pkg = os.path.dirname(os.path.abspath(hotspan.__file__))
    for rel in _STORED_FORMAT_SOURCES:
        with contextlib.suppress(OSError), open(os.path.join(pkg, rel), "rb") as f:
            h.update(f.read())
    return os.path.join("/tmp", f"hotspan-bench-clickhouse-{h.hexdigest()[:12]}")


# -- ClickHouse: the test fixture (ClickHouse's HTTP interface over chdb) ----------------------


class ClickHouse:
    """A started ``tests/clickhouse_fixture`` process, with what the bench needs of it."""

    def __init__(self, path: str) -> None:
        if common.REPO_DIR not in sys.path:
            sys.path.insert(0, common.REPO_DIR)
        from tests.clickhouse_fixture import start_clickhouse

        t0 = time.perf_counter()
        self.proc = start_clickhouse(path)
        self.startup_s = round(time.perf_counter() - t0, 2)
        self.path = path

    @property
    def pid(self) -> int:
        return int(self.proc.process.pid)

    def url(self, database: str) -> str:
        """The store URL of ``database`` on this ClickHouse."""
        return str(self.proc.url_for(database))

    def client(self, database: str = "default") -> Any:
        """A clickhouse-connect client for the bench's own statements (long ones included)."""
        return self.proc.client(
            database, connect_timeout=30, send_receive_timeout=7200, autogenerate_session_id=False
        )

    def stop(self) -> None:
        self.proc.stop()


@contextlib.contextmanager
def clickhouse(path: str) -> Iterator[ClickHouse]:
    ch = ClickHouse(path)
    try:
        yield ch
    finally:
        ch.stop()


def clickhouse_versions(ch: ClickHouse) -> Dict[str, str]:
    import chdb
    import clickhouse_connect

    client = ch.client()
    try:
        version = client.command("SELECT version()")
    finally:
        client.close()
    return {
        "clickhouse": str(version),
        "chdb": getattr(chdb, "__version__", "?"),
        "clickhouse_connect": getattr(clickhouse_connect, "__version__", "?"),
    }


# -- spans -------------------------------------------------------------------------------------


def generate_spans(params: Dict[str, int]) -> Tuple[List[bytes], Dict[str, Any]]:
    """``traces.py``'s request bodies for ``params`` and what the queries look up: 20 trace ids
    spread over the day and one user id (as ``traces.build`` picks them)."""
    end_ns = params["end_s"] * SEC
    start_ns = end_ns - params["hours"] * 3600 * SEC
    n_traces_est = max(params["spans"] // 14, 1)
    every = max(n_traces_est // 20, 1)
    targets: Dict[str, Any] = {"lookup": []}
    seen = [0]

    def on_trace(spans: List[Any]) -> None:
        i = seen[0]
        seen[0] += 1
        if i % every == every // 2:
            targets["lookup"].append(spans[0][0].hex())
        if i == n_traces_est // 2:
            targets["enduser"] = dict(spans[0][11])["enduser.id"]

    bodies = traces.generate(params["spans"], params["seed"], start_ns, end_ns, on_trace)
    targets["traces"] = seen[0]
    return bodies, targets


def grown_trace_id(trace_id: str, k: int) -> str:
    """The id of copy ``k`` of a trace at the 100 M level (the same rule as the SQL)."""
    return f"{int(trace_id[:2], 16) ^ k:02x}{trace_id[2:]}"


def push_spans(server: common.Server, bodies: List[bytes], n_spans: int, log: Log) -> Dict:
    """Every body once through the server's OTLP/HTTP receiver (8 clients)."""
    assert server.otlp_http is not None, "the server has no OTLP/HTTP receiver"
    host, port = server.otlp_http
    counts = [traces.SPANS_PER_REQUEST] * len(bodies)
    counts[-1] = n_spans - traces.SPANS_PER_REQUEST * (len(bodies) - 1)
    requests = [
        (loadgen.post(host, port, "/v1/traces", b, "application/x-protobuf"), c)
        for b, c in zip(bodies, counts)
    ]
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-clickhouse-load-")
    try:
        log(f"    pushing {n_spans:,} spans over OTLP/HTTP")
        spec = {
            "protocol": "http",
            "mode": "once",
            "concurrency": SPAN_LOAD_CONCURRENCY,
            "target": f"{host}:{port}",
        }
        load = traces.run_load(spec, requests, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if load["errors"] or load["acked_items"] != n_spans:
        raise RuntimeError(f"loading the spans failed: {load}")
    return {
        "load_spans_s": load["wall_s"],
        "load_spans_per_s": round(n_spans / load["wall_s"]),  # type: ignore[operator]
    }


# -- stages ------------------------------------------------------------------------------------


class Stages:
    """``stage-<name>.json`` per finished stage in the cache directory."""

    def __init__(self, root: str, params: Dict[str, Any], rebuild: bool) -> None:
        self.root = root
        self.params = params
        if rebuild:
            shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root, exist_ok=True)

    def _file(self, name: str) -> str:
        return os.path.join(self.root, f"stage-{name}.json")

    def done(self, name: str) -> Optional[Dict[str, Any]]:
        path = self._file(name)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            saved = json.load(f)
        return saved if saved.get("params") == self.params else None

    def record(self, name: str, info: Dict[str, Any]) -> Dict[str, Any]:
        with open(self._file(name), "w") as f:
            json.dump({"params": self.params, **info}, f, indent=2)
        return info

    def forget(self, *names: str) -> None:
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._file(name))


def _dir_mib(path: str) -> float:
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(base, name))
    return common.mib(total)


# -- DuckDB ------------------------------------------------------------------------------------


def duckdb_counts(data_dir: str) -> Dict[str, Any]:
    import duckdb

    con = duckdb.connect(os.path.join(data_dir, "hotspan.duckdb"), read_only=True)
    try:
        samples, value = con.execute("SELECT count(*), sum(value)::BIGINT FROM samples").fetchone()
        spans, traces_n = con.execute(
            "SELECT count(*), count(DISTINCT trace_id) FROM spans"
        ).fetchone()
        series = con.execute("SELECT count(*) FROM series").fetchone()[0]
        stacks = con.execute("SELECT count(*) FROM stacks").fetchone()[0]
    finally:
        con.close()
    return {
        "samples": samples,
        "sample_value_sum": value,
        "spans": spans,
        "traces": traces_n,
        "series": series,
        "stacks": stacks,
        "mib": _dir_mib(data_dir),
    }


def build_duckdb_10m(
    params: Dict[str, Any], data_dir: str, bodies: List[bytes], log: Log
) -> Dict[str, Any]:
    """``query.py``'s cached samples (built there if missing), copied, plus the spans."""
    t0 = time.perf_counter()
    src, build, reused = query.ensure_data(params["samples"], log)
    shutil.rmtree(data_dir, ignore_errors=True)
    os.makedirs(data_dir)
    shutil.copy2(os.path.join(src, "hotspan.duckdb"), os.path.join(data_dir, "hotspan.duckdb"))
    info: Dict[str, Any] = {
        "samples_from": src,
        "samples_reused": reused,
        "samples_build": build,
        "samples_s": round(time.perf_counter() - t0, 1),
    }
    server = common.Server(data_dir).start()
    try:
        info.update(push_spans(server, bodies, params["spans"]["spans"], log))
    finally:
        info["server_stop"] = server.stop()
    info["counts"] = duckdb_counts(data_dir)
    _expect(info["counts"], params, 1)
    return info


def _duckdb_columns(con: Any, table: str) -> List[str]:
    return [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]


def grow_duckdb(params: Dict[str, Any], src_dir: str, data_dir: str, log: Log) -> Dict[str, Any]:
    """A new DuckDB file with the 10 M level's tables, samples and spans ``GROW`` times
    (module docstring), each table written in time order as a server appends it."""
    import duckdb

    from hotspan.store.duckdb import DuckDBStore

    samples = params["samples"]
    end_ns = samples["end_s"] * SEC
    start_ns = end_ns - samples["hours"] * 3600 * SEC
    shutil.rmtree(data_dir, ignore_errors=True)
    DuckDBStore(data_dir).close()  # the schema, as the store makes it
    con = duckdb.connect(os.path.join(data_dir, "hotspan.duckdb"))
    timings: Dict[str, Any] = {}
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute(f"ATTACH '{os.path.join(src_dir, 'hotspan.duckdb')}' AS src (READ_ONLY)")
        for table in [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = 'src'"
            ).fetchall()
        ]:
            if table in ("samples", "spans"):
                continue
            con.execute(f"INSERT INTO {table} SELECT * FROM src.{table}")
        cols = _duckdb_columns(con, "samples")
        shifted = ", ".join(
            f"CASE WHEN k = 0 THEN ts ELSE {start_ns} + (ts - {start_ns} + k * {SEC}) % {DAY_NS} "
            "END"
            if c == "ts"
            else c
            for c in cols
        )
        log(f"    DuckDB: samples x{GROW} (time-shifted copies, sorted by time)")
        t0 = time.perf_counter()
        con.execute(
            f"INSERT INTO samples SELECT {shifted} FROM src.samples, range(0, {GROW}) AS r(k) "
            "ORDER BY ts"
        )
        timings["samples_s"] = round(time.perf_counter() - t0, 1)
        cols = _duckdb_columns(con, "spans")
        new_tid = "printf('%02x', xor(('0x' || trace_id[1:2])::INTEGER, k)) || trace_id[3:]"
        exprs = []
        for c in cols:
            if c == "trace_id":
                exprs.append(f"CASE WHEN k = 0 THEN trace_id ELSE {new_tid} END")
            elif c == "raw":
                # The OTLP Span message starts with its trace id (field 1, 16 bytes).
                exprs.append(
                    "CASE WHEN k = 0 OR raw[1:2] <> from_hex('0a10') THEN raw "
                    f"ELSE raw[1:2] || from_hex({new_tid}) || raw[19:] END"
                )
            else:
                exprs.append(c)
        log(f"    DuckDB: spans x{GROW} (copies under other trace ids, sorted by start)")
        t0 = time.perf_counter()
        con.execute(
            f"INSERT INTO spans SELECT {', '.join(exprs)} FROM src.spans, range(0, {GROW}) "
            "AS r(k) ORDER BY start_ns"
        )
        timings["spans_s"] = round(time.perf_counter() - t0, 1)
        timings["raw_not_patched"] = con.execute(
            "SELECT count(*) FROM src.spans WHERE raw[1:2] <> from_hex('0a10')"
        ).fetchone()[0]
        con.execute("DETACH src")
        t0 = time.perf_counter()
        con.execute("CHECKPOINT")
        timings["checkpoint_s"] = round(time.perf_counter() - t0, 1)
    finally:
        con.close()
    counts = duckdb_counts(data_dir)
    _expect(counts, params, GROW)
    return {"grow": timings, "counts": counts}


# -- ClickHouse --------------------------------------------------------------------------------

_CH_TABLES_OPTIMIZED = ("samples", "spans", "trace_index", "series", "stacks", "frames")


def clickhouse_counts(ch: ClickHouse, database: str) -> Dict[str, Any]:
    client = ch.client(database)
    try:
        samples, value = client.query("SELECT count(), sum(value) FROM samples").result_rows[0]
        spans, traces_n = client.query(
            "SELECT count(), uniqExact(trace_id) FROM spans"
        ).result_rows[0]
        series = client.command("SELECT uniqExact(tenant, series_id) FROM series")
        stacks = client.command("SELECT uniqExact(stack_id) FROM stacks")
        parts = client.query(
            "SELECT table, count(), sum(rows), sum(bytes_on_disk) FROM system.parts "
            "WHERE database = %(db)s AND active GROUP BY table ORDER BY table",
            parameters={"db": database},
        ).result_rows
    finally:
        client.close()
    return {
        "samples": int(samples),
        "sample_value_sum": int(value),
        "spans": int(spans),
        "traces": int(traces_n),
        "series": int(series),
        "stacks": int(stacks),
        "parts": {t: {"parts": int(n), "rows": int(r)} for t, n, r, _ in parts},
        "mib": common.mib(sum(int(b) for *_, b in parts)),
    }


def optimize(ch: ClickHouse, database: str, log: Log) -> float:
    """``OPTIMIZE TABLE ... FINAL``: one part per partition, the state a server settles into
    once its background merges have caught up (what a long-running ClickHouse would hold)."""
    client = ch.client(database)
    t0 = time.perf_counter()
    try:
        for table in _CH_TABLES_OPTIMIZED:
            log(f"    ClickHouse {database}: OPTIMIZE TABLE {table} FINAL")
            client.command(f"OPTIMIZE TABLE {table} FINAL")
    finally:
        client.close()
    return round(time.perf_counter() - t0, 1)


@contextlib.contextmanager
def _store_factory(make: Callable[[str], Any]) -> Iterator[None]:
    """``query.build`` opens ``hotspan.store.duckdb.DuckDBStore(data_dir)``: for the length of
    the block that name makes another store, so the same function (same generator, same
    batches, same write calls) fills ClickHouse."""
    import hotspan.store.duckdb as duckdb_store

    original = duckdb_store.DuckDBStore
    duckdb_store.DuckDBStore = make  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        duckdb_store.DuckDBStore = original  # type: ignore[misc]


def build_clickhouse_10m(
    params: Dict[str, Any], ch: ClickHouse, bodies: List[bytes], log: Log
) -> Dict[str, Any]:
    from hotspan.store.clickhouse import ClickHouseStore

    client = ch.client()
    try:
        client.command(f"DROP DATABASE IF EXISTS {DB_10M}")
    finally:
        client.close()
    url = ch.url(DB_10M)
    scratch = tempfile.mkdtemp(prefix="hotspan-bench-clickhouse-build-")

    def make(data_dir: str) -> Any:
        os.makedirs(data_dir, exist_ok=True)
        # Kept forever: the data set's day is in the past, and a new database's default
        # retention (7 days) would drop it as it lands.
        return ClickHouseStore(url, retention_ns=0)

    info: Dict[str, Any] = {}
    try:
        log(f"    ClickHouse {DB_10M}: {params['samples']['samples']:,} samples via query.build")
        t0 = time.perf_counter()
        with _store_factory(make):
            info["samples_build"] = query.build(params["samples"], scratch, log)
        info["samples_s"] = round(time.perf_counter() - t0, 1)
        server = common.Server(scratch, ["--store", url]).start()
        try:
            info.update(push_spans(server, bodies, params["spans"]["spans"], log))
        finally:
            info["server_stop"] = server.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    info["optimize_s"] = optimize(ch, DB_10M, log)
    info["counts"] = clickhouse_counts(ch, DB_10M)
    _expect(info["counts"], params, 1)
    return info


def _expect(counts: Dict[str, Any], params: Dict[str, Any], factor: int) -> None:
    """Every sample and span written is there (a store that drops writes fails the build)."""
    want = (params["samples"]["samples"] * factor, params["spans"]["spans"] * factor)
    if (counts["samples"], counts["spans"]) != want:
        raise RuntimeError(
            f"expected {want[0]:,} samples and {want[1]:,} spans, the store holds "
            f"{counts['samples']:,} and {counts['spans']:,}"
        )


def grow_clickhouse(params: Dict[str, Any], ch: ClickHouse, log: Log) -> Dict[str, Any]:
    """``hotspan_100m`` from ``hotspan_10m``, as ``grow_duckdb`` does (module docstring)."""
    from hotspan.store.clickhouse import ClickHouseStore

    samples = params["samples"]
    end_ns = samples["end_s"] * SEC
    start_ns = end_ns - samples["hours"] * 3600 * SEC
    client = ch.client()
    try:
        client.command(f"DROP DATABASE IF EXISTS {DB_100M}")
    finally:
        client.close()
    ClickHouseStore(ch.url(DB_100M), retention_ns=0).close()  # the schema, no TTL
    client = ch.client(DB_100M)
    timings: Dict[str, Any] = {}
    src = DB_10M
    new_tid = (
        "concat(lower(hex(bitXor(reinterpretAsUInt8(unhex(substring(trace_id, 1, 2))), "
        "toUInt8(k)))), substring(trace_id, 3))"
    )
    try:
        for table in ("series", "stacks", "frames", "span_groups", "span_tags"):
            client.command(f"INSERT INTO {table} SELECT * FROM {src}.{table}")
        log(f"    ClickHouse {DB_100M}: samples x{GROW} (time-shifted copies)")
        t0 = time.perf_counter()
        client.command(
            "INSERT INTO samples (tenant, series_id, ts, stack_id, value, span_id, trace_id) "
            f"SELECT tenant, series_id, if(k = 0, ts, {start_ns} + (ts - {start_ns} + k * {SEC})"
            f" % {DAY_NS}), stack_id, value, span_id, trace_id FROM {src}.samples "
            f"ARRAY JOIN range({GROW}) AS k"
        )
        timings["samples_s"] = round(time.perf_counter() - t0, 1)
        log(f"    ClickHouse {DB_100M}: spans x{GROW} (copies under other trace ids)")
        t0 = time.perf_counter()
        client.command(
            "INSERT INTO spans (tenant, trace_id, span_id, parent_span_id, name, kind, service, "
            "start_ns, end_ns, status_code, attrs, group_id, raw) "
            f"SELECT tenant, if(k = 0, trace_id, {new_tid}) AS tid, span_id, parent_span_id, "
            "name, kind, service, start_ns, end_ns, status_code, attrs, group_id, "
            "if(k = 0 OR substring(raw, 1, 2) != unhex('0a10'), raw, "
            "concat(substring(raw, 1, 2), unhex(tid), substring(raw, 19))) "
            f"FROM {src}.spans ARRAY JOIN range({GROW}) AS k"
        )
        client.command(
            "INSERT INTO trace_index (tenant, trace_id, start_ns, end_ns) "
            f"SELECT tenant, if(k = 0, trace_id, {new_tid}), start_ns, end_ns "
            f"FROM {src}.trace_index ARRAY JOIN range({GROW}) AS k"
        )
        timings["spans_s"] = round(time.perf_counter() - t0, 1)
    finally:
        client.close()
    timings["optimize_s"] = optimize(ch, DB_100M, log)
    counts = clickhouse_counts(ch, DB_100M)
    _expect(counts, params, GROW)
    return {"grow": timings, "counts": counts}


# -- everything --------------------------------------------------------------------------------


class DataSets:
    """Where the four data sets are and what they hold."""

    def __init__(self, root: str, params: Dict[str, Any], info: Dict[str, Any]) -> None:
        self.root = root
        self.params = params
        self.info = info
        self.duckdb_10m = os.path.join(root, "duckdb-10m")
        self.duckdb_100m = os.path.join(root, "duckdb-100m")
        self.clickhouse_path = os.path.join(root, "clickhouse")

    @property
    def targets(self) -> Dict[str, Any]:
        return self.info["targets"]  # type: ignore[no-any-return]


def ensure(quick: bool, log: Log, rebuild: bool = False) -> DataSets:
    """Build what is missing of the data sets (see the module docstring)."""
    params = params_for(quick)
    root = cache_dir_for(params)
    stages = Stages(root, params, rebuild)
    sets = DataSets(root, params, {})
    info: Dict[str, Any] = {}
    bodies: Optional[List[bytes]] = None

    def spans() -> List[bytes]:
        nonlocal bodies
        if bodies is None:
            t0 = time.perf_counter()
            log(f"  generating {params['spans']['spans']:,} spans (traces.generate)")
            bodies, targets = generate_spans(params["spans"])
            info["targets"] = targets
            info["generate_spans_s"] = round(time.perf_counter() - t0, 1)
        return bodies

    saved = stages.done("targets")
    if saved is None:
        spans()
        stages.record("targets", {"targets": info["targets"]})
    else:
        info["targets"] = saved["targets"]

    built_now = set()
    for name, build in (
        ("duckdb-10m", lambda: build_duckdb_10m(params, sets.duckdb_10m, spans(), log)),
        ("duckdb-100m", lambda: grow_duckdb(params, sets.duckdb_10m, sets.duckdb_100m, log)),
    ):
        saved = stages.done(name)
        if saved is None:
            if name == "duckdb-10m":
                stages.forget("duckdb-100m")
            log(f"  data set {name}: building in {root}")
            t0 = time.perf_counter()
            saved = stages.record(name, {**build(), "total_s": round(time.perf_counter() - t0, 1)})
            built_now.add(name)
        else:
            log(f"  data set {name}: reusing {root}")
        info[name] = saved

    need = [n for n in ("clickhouse-10m", "clickhouse-100m") if stages.done(n) is None]
    if "clickhouse-10m" in need:
        stages.forget("clickhouse-100m")
        need = ["clickhouse-10m", "clickhouse-100m"]
    if need:
        with clickhouse(sets.clickhouse_path) as ch:
            for name in need:
                log(f"  data set {name}: building in {sets.clickhouse_path}")
                t0 = time.perf_counter()
                built = (
                    build_clickhouse_10m(params, ch, spans(), log)
                    if name == "clickhouse-10m"
                    else grow_clickhouse(params, ch, log)
                )
                built["total_s"] = round(time.perf_counter() - t0, 1)
                stages.record(name, built)
                built_now.add(name)
    for name in ("clickhouse-10m", "clickhouse-100m"):
        saved = stages.done(name)
        assert saved is not None
        if name not in built_now:
            log(f"  data set {name}: reusing {sets.clickhouse_path}")
        info[name] = saved
    for name in ("duckdb-10m", "duckdb-100m", "clickhouse-10m", "clickhouse-100m"):
        info[name] = {**info[name], "reused": name not in built_now}
    sets.info = info
    return sets
