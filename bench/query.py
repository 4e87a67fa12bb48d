"""Query benchmark: a large store queried through a real ``hotspan server``.

The data (10 M samples, 1,000 series = 20 services x 50 label sets, 50,000 stacks 20-40 frames
deep, 24 h at a 10 s upload interval) is written straight through the store API
(``DuckDBStore.write``) once and cached under /tmp; a server is then started on that
directory and the Connect querier endpoints are timed over HTTP.  Afterwards the 24 h flame
graph query is taken apart in-process (SQL aggregation, stack table, flame graph build,
message construction, encoding) to show where its time goes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sys
import time
from typing import Callable, Dict, List, Tuple

import common
import numpy as np
import synth

PROFILE_TYPE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
TENANT = "anonymous"
REGIONS = ["eu-west-1", "eu-central-1", "us-east-1", "us-west-2", "ap-south-1"]

FULL = {
    "samples": 10_000_000,
    "services": 20,
    "label_sets_per_service": 50,  # 5 regions x 10 pods
    "stacks": 50_000,
    "frames": 8_000,
    "min_depth": 20,
    "max_depth": 40,
    "hours": 24,
    "interval_s": 10,
    "stacks_per_service": 10_000,  # each service draws from its own (overlapping) window
    "batch_samples": 500_000,
    "seed": 7,
    "end_s": 1_767_225_600,  # fixed (2026-01-01 00:00 UTC) so the cache is reusable
}
QUICK = dict(
    FULL,
    samples=300_000,
    services=10,
    label_sets_per_service=10,
    stacks=5_000,
    frames=2_000,
    stacks_per_service=1_500,
    batch_samples=100_000,
)


def data_dir_for(params: Dict[str, object]) -> str:
    """Cache directory: keyed by the parameters and the store's schema, so that a store that
    changes its on-disk layout gets a fresh build."""
    import hotspan.store.duckdb as store_mod

    schema = getattr(store_mod, "SCHEMA", "") + getattr(store_mod, "DB_FILE", "")
    key = hashlib.sha1((json.dumps(params, sort_keys=True) + schema).encode()).hexdigest()[:12]
    return os.path.join("/tmp", f"hotspan-bench-query-{key}")


def _series_labels(params: Dict[str, int]) -> List[Dict[str, str]]:
    out = []
    per = params["label_sets_per_service"]
    for svc in range(params["services"]):
        for j in range(per):
            out.append(
                {
                    "__name__": "process_cpu",
                    "service_name": f"svc-{svc:02d}",
                    "region": REGIONS[j % len(REGIONS)],
                    "pod": f"svc-{svc:02d}-{j // len(REGIONS)}",
                    "pyroscope_spy": "pyspy",
                }
            )
    return out


def build(params: Dict[str, int], data_dir: str, log: Callable[[str], None]) -> Dict[str, object]:
    """Write the data set through the store API; returns timings."""
    from hotspan.model.labels import normalize
    from hotspan.model.profile import Frame, IngestBatch, ProfileType
    from hotspan.store.duckdb import DuckDBStore

    try:  # the columnar fast path, in models that have it
        from hotspan.model.profile import SampleColumns
    except ImportError:
        SampleColumns = None  # noqa: N806

    timings: Dict[str, object] = {}
    t0 = time.perf_counter()
    rng = np.random.default_rng(params["seed"])
    frames = synth.frame_universe(rng, params["frames"])
    stacks = synth.grow_stacks(
        rng, params["stacks"], len(frames), params["min_depth"], params["max_depth"]
    )
    timings["generate_stacks_s"] = round(time.perf_counter() - t0, 2)

    t0 = time.perf_counter()
    n = params["samples"]
    n_series = params["services"] * params["label_sets_per_service"]
    slots = params["hours"] * 3600 // params["interval_s"]
    start_s = params["end_s"] - params["hours"] * 3600
    slot = np.sort(rng.integers(0, slots, size=n))
    series = rng.integers(0, n_series, size=n)
    order = np.lexsort((series, slot))  # arrival order: by upload time, one upload per series
    slot, series = slot[order], series[order]
    service = series // params["label_sets_per_service"]
    window = params["stacks_per_service"]
    rank = rng.choice(window, size=n, p=synth.zipf_weights(window, s=1.05, offset=10.0))
    # Hot ranks are scattered over the service's window, windows overlap between services.
    stride = params["stacks"] // params["services"]
    stack_index = (service * stride + (rank * 7919) % window) % params["stacks"]
    # Uploads of different series are not synchronised: offset each series within the slot.
    ts = (start_s + slot * params["interval_s"]) * 10**9 + (series * 7919 % 10_000) * 10**6
    value = rng.geometric(0.15, size=n).astype(np.int64) * synth.PERIOD_NS
    timings["generate_samples_s"] = round(time.perf_counter() - t0, 2)

    shutil.rmtree(data_dir, ignore_errors=True)
    store = DuckDBStore(data_dir)
    ptype = ProfileType.parse(PROFILE_TYPE)
    labels = [normalize(lbl) for lbl in _series_labels(params)]
    try:
        t0 = time.perf_counter()
        head = IngestBatch()
        series_ids = np.array([head.add_series(ptype, lbl) for lbl in labels], dtype=np.int64)
        frame_ids = [head.add_frame(Frame(*f)) for f in frames]
        stack_ids = np.array(
            [head.add_stack(tuple(frame_ids[i] for i in st)) for st in stacks], dtype=np.int64
        )
        timings["ids_and_hashes_s"] = round(time.perf_counter() - t0, 2)

        batch_n = params["batch_samples"]
        add_sample_s = bulk_s = commit_s = 0.0
        add_sample_rows = bulk_rows = 0
        for b, lo in enumerate(range(0, n, batch_n)):
            hi = min(lo + batch_n, n)
            t0 = time.perf_counter()
            batch = head if b == 0 else IngestBatch()
            if b > 0:
                for lbl in labels:
                    batch.add_series(ptype, lbl)
            if b == 0 or SampleColumns is None:
                sid = series_ids[series[lo:hi]].tolist()
                tss = ts[lo:hi].tolist()
                stk = stack_ids[stack_index[lo:hi]].tolist()
                val = value[lo:hi].tolist()
            if b == 0 or SampleColumns is None:
                # The documented per-sample API, timed, to show what it costs per row.
                for row in zip(sid, tss, stk, val):
                    batch.add_sample(*row)
                add_sample_s += time.perf_counter() - t0
                add_sample_rows += hi - lo
            else:
                # Whole columns at once (IngestBatch.add_columns, where the model has it).
                m = hi - lo
                batch.add_columns(
                    SampleColumns(
                        series_ids[series[lo:hi]],
                        ts[lo:hi],
                        stack_ids[stack_index[lo:hi]],
                        value[lo:hi],
                        np.zeros(m, dtype=np.uint64),
                        np.full(m, None, dtype=object),
                    )
                )
                bulk_s += time.perf_counter() - t0
                bulk_rows += m
            t0 = time.perf_counter()
            store.write(TENANT, batch).result()
            commit_s += time.perf_counter() - t0
            if b % 5 == 0:
                log(f"  query data: {hi:,}/{n:,} samples written")
        timings["add_sample_rows"] = add_sample_rows
        timings["add_sample_s"] = round(add_sample_s, 2)
        timings["add_sample_rows_per_s"] = (
            round(add_sample_rows / add_sample_s) if add_sample_s else None
        )
        timings["add_columns_rows_per_s"] = round(bulk_rows / bulk_s) if bulk_s else None
        timings["store_write_s"] = round(commit_s, 2)
        timings["store_write_rows_per_s"] = round(n / commit_s) if commit_s else None
        t0 = time.perf_counter()
    finally:
        store.close()
    timings["close_s"] = round(time.perf_counter() - t0, 2)
    timings["data_dir_mib"] = common.dir_mib(data_dir)
    common.mark_data(data_dir, params, build=timings)
    return timings


def ensure_data(params: Dict[str, int], log: Callable[[str], None], rebuild: bool = False):  # type: ignore[no-untyped-def]
    data_dir = data_dir_for(params)
    saved = common.cached_data(data_dir, params, rebuild)
    if saved is not None:
        log(f"  query data: reusing {data_dir}")
        return data_dir, saved["build"], True
    log(f"  query data: building {data_dir} ({params['samples']:,} samples)")
    t0 = time.perf_counter()
    timings = build(params, data_dir, log)
    timings["total_build_s"] = round(time.perf_counter() - t0, 1)
    common.mark_data(data_dir, params, build=timings)
    return data_dir, timings, False


# -- HTTP queries ----------------------------------------------------------------------------


def _queries(params: Dict[str, int], service: str) -> List[Dict[str, object]]:
    from hotspan.formats.proto import querier_pb2

    end_ms = params["end_s"] * 1000
    h1 = (end_ms - 3600 * 1000, end_ms)
    h24 = (end_ms - params["hours"] * 3600 * 1000, end_ms)
    sel = f'{{service_name="{service}"}}'
    svc = "/querier.v1.QuerierService/"
    json_h = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    proto_h = {"Content-Type": "application/proto", "Connect-Protocol-Version": "1"}

    def merge(rng_ms: Tuple[int, int], codec: str) -> bytes:
        if codec == "json":
            return json.dumps(
                {
                    "profile_typeID": PROFILE_TYPE,
                    "label_selector": sel,
                    "start": str(rng_ms[0]),
                    "end": str(rng_ms[1]),
                }
            ).encode()
        return querier_pb2.SelectMergeStacktracesRequest(
            profile_typeID=PROFILE_TYPE, label_selector=sel, start=rng_ms[0], end=rng_ms[1]
        ).SerializeToString()

    return [
        {
            "name": "SelectMergeStacktraces 1h JSON",
            "key": "merge_1h_json",
            "path": svc + "SelectMergeStacktraces",
            "headers": json_h,
            "body": merge(h1, "json"),
            "check": "flamegraph_json",
        },
        {
            "name": "SelectMergeStacktraces 1h proto",
            "key": "merge_1h_proto",
            "path": svc + "SelectMergeStacktraces",
            "headers": proto_h,
            "body": merge(h1, "proto"),
            "check": "flamegraph_proto",
        },
        {
            "name": "SelectMergeStacktraces 24h JSON",
            "key": "merge_24h_json",
            "path": svc + "SelectMergeStacktraces",
            "headers": json_h,
            "body": merge(h24, "json"),
            "check": "flamegraph_json",
        },
        {
            "name": "SelectMergeStacktraces 24h proto",
            "key": "merge_24h_proto",
            "path": svc + "SelectMergeStacktraces",
            "headers": proto_h,
            "body": merge(h24, "proto"),
            "check": "flamegraph_proto",
        },
        {
            "name": "SelectMergeStacktraces 24h JSON, Accept-Encoding: gzip",
            "key": "merge_24h_json_gzip",
            "path": svc + "SelectMergeStacktraces",
            "headers": dict(json_h, **{"Accept-Encoding": "gzip"}),
            "body": merge(h24, "json"),
            "check": "flamegraph_json",
        },
        {
            "name": "SelectSeries 24h step 60s proto",
            "key": "series_24h_proto",
            "path": svc + "SelectSeries",
            "headers": proto_h,
            "check": "series",
            "body": querier_pb2.SelectSeriesRequest(
                profile_typeID=PROFILE_TYPE, label_selector=sel, start=h24[0], end=h24[1], step=60.0
            ).SerializeToString(),
        },
        {
            "name": "SelectMergeProfile 1h (pprof)",
            "key": "merge_profile_1h_proto",
            "path": svc + "SelectMergeProfile",
            "headers": proto_h,
            "check": "pprof",
            "body": querier_pb2.SelectMergeProfileRequest(
                profile_typeID=PROFILE_TYPE, label_selector=sel, start=h1[0], end=h1[1]
            ).SerializeToString(),
        },
    ]


def _check(kind: str, data: bytes, headers: Dict[str, str]) -> Dict[str, object]:
    from hotspan.formats.proto import profile_pb2, querier_pb2

    if headers.get("Accept-Encoding") == "gzip" and data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if kind == "flamegraph_json":
        fg = json.loads(data)["flamegraph"]
        return {
            "total": int(fg["total"]),
            "names": len(fg["names"]),
            "levels": len(fg["levels"]),
            "nodes": sum(len(lv.get("values", [])) // 4 for lv in fg["levels"]),
        }
    if kind == "flamegraph_proto":
        fg = querier_pb2.SelectMergeStacktracesResponse.FromString(data).flamegraph
        return {
            "total": fg.total,
            "names": len(fg.names),
            "levels": len(fg.levels),
            "nodes": sum(len(lv.values) // 4 for lv in fg.levels),
        }
    if kind == "series":
        resp = querier_pb2.SelectSeriesResponse.FromString(data)
        return {"series": len(resp.series), "points": sum(len(s.points) for s in resp.series)}
    prof = profile_pb2.Profile.FromString(data)
    return {"samples": len(prof.sample), "locations": len(prof.location)}


def run_http(
    params: Dict[str, int],
    data_dir: str,
    service: str,
    runs: int,
    warmups: int,
    log: Callable[[str], None],
) -> Dict[str, object]:
    results = {}
    with common.measured_server(data_dir) as (server, out):
        client = common.Client(server.url)
        for q in _queries(params, service):
            data, first, times = common.repeat_timed(
                lambda _, q=q: client.fetch(q["name"], "POST", q["path"], q["headers"], q["body"]),  # type: ignore[misc]
                warmups,
                runs,
            )
            check = _check(q["check"], data, q["headers"])  # type: ignore[arg-type]
            summary = common.latency_summary(times)
            summary.update(
                first_ms=round(first * 1000, 2),
                response_bytes=len(data),
                result=check,
                name=q["name"],
            )
            results[q["key"]] = summary
            log(
                f"  {q['name']}: median {summary['median_ms']} ms, p90 {summary['p90_ms']} ms, "
                f"first {summary['first_ms']} ms"
            )
    out["queries"] = results
    return out


# -- in-process breakdown --------------------------------------------------------------------


_timed = common.first_and_median


def breakdown(
    params: Dict[str, int], data_dir: str, service: str, repeat: int
) -> Dict[str, object]:
    """Where the 24 h SelectMergeStacktraces time goes, step by step, in this process."""
    from google.protobuf import json_format

    from hotspan.formats.proto import querier_pb2
    from hotspan.model.labels import parse_selector
    from hotspan.model.profile import ProfileType
    from hotspan.query import flamegraph
    from hotspan.query.engine import DEFAULT_MAX_NODES, QueryEngine
    from hotspan.store.base import SampleFilter
    from hotspan.store.duckdb import DuckDBStore

    t0 = time.perf_counter()
    store = DuckDBStore(data_dir)
    open_s = time.perf_counter() - t0
    engine = QueryEngine(store)
    ptype = ProfileType.parse(PROFILE_TYPE)
    sel = parse_selector(f'{{service_name="{service}"}}')
    end_ns = params["end_s"] * 10**9
    out: Dict[str, object] = {"store_open_s": round(open_s, 3), "repeat": repeat}
    ms = lambda s: round(s * 1000, 2)  # noqa: E731
    try:
        for label, hours in (("24h", params["hours"]), ("1h", 1)):
            where = SampleFilter(end_ns - hours * 3600 * 10**9, end_ns)
            steps: Dict[str, Dict[str, float]] = {}
            series, f, m = _timed(
                lambda: engine.find_series(TENANT, [sel], where.start_ns, where.end_ns, ptype),
                repeat,
            )
            steps["find_series"] = {"first_ms": ms(f), "median_ms": ms(m)}
            sids = [s.series_id for s in series]  # type: ignore[union-attr]
            values, f, m = _timed(lambda: store.stack_values(TENANT, sids, where), repeat)
            steps["sql_stack_values"] = {"first_ms": ms(f), "median_ms": ms(m)}
            _, f, m = _timed(lambda: engine.stacks.rows(values.stack_ids), repeat)  # type: ignore[union-attr]
            steps["stack_table_rows (first: load stacks+frames from DuckDB)"] = {
                "first_ms": ms(f),
                "median_ms": ms(m),
            }
            (matrix, lengths, known), f, m = _timed(
                lambda: engine._matrix(values.stack_ids), repeat
            )  # type: ignore[union-attr]  # noqa: SLF001
            steps["stack_matrix"] = {"first_ms": ms(f), "median_ms": ms(m)}
            graph, f, m = _timed(
                lambda: flamegraph.build(
                    matrix,
                    lengths,
                    values.values[known],  # type: ignore[union-attr]
                    engine.stacks.names,
                    DEFAULT_MAX_NODES,
                ),
                repeat,
            )
            steps["flamegraph_build"] = {"first_ms": ms(f), "median_ms": ms(m)}

            def message():  # type: ignore[no-untyped-def]
                resp = querier_pb2.SelectMergeStacktracesResponse()
                flamegraph.to_message(graph, resp.flamegraph)
                return resp

            resp, f, m = _timed(message, repeat)
            steps["protobuf_message_build"] = {"first_ms": ms(f), "median_ms": ms(m)}
            text, f, m = _timed(
                lambda: json_format.MessageToJson(
                    resp, indent=None, preserving_proto_field_name=False
                ),
                repeat,
            )
            steps["json_encode (MessageToJson)"] = {"first_ms": ms(f), "median_ms": ms(m)}
            blob, f, m = _timed(lambda: resp.SerializeToString(), repeat)  # type: ignore[union-attr]
            steps["proto_encode (SerializeToString)"] = {"first_ms": ms(f), "median_ms": ms(m)}
            _, f, m = _timed(lambda: gzip.compress(text.encode(), 9), max(1, repeat // 2))  # type: ignore[union-attr]
            steps["gzip level 9 of the JSON (Starlette default)"] = {
                "first_ms": ms(f),
                "median_ms": ms(m),
            }
            _, f, m = _timed(lambda: gzip.compress(text.encode(), 1), max(1, repeat // 2))  # type: ignore[union-attr]
            steps["gzip level 1 of the JSON (what the server uses)"] = {
                "first_ms": ms(f),
                "median_ms": ms(m),
            }
            pprof_msg, f, m = _timed(
                lambda: engine.pprof(ptype, values, where, None), max(1, repeat // 2)
            )
            steps["pprof_build (SelectMergeProfile, all stacks)"] = {
                "first_ms": ms(f),
                "median_ms": ms(m),
            }
            series_q, f, m = _timed(
                lambda: store.time_series(TENANT, sids, where, 60 * 10**9), max(1, repeat // 2)
            )
            steps["sql_time_series step 60s (SelectSeries)"] = {
                "first_ms": ms(f),
                "median_ms": ms(m),
            }
            _, f, m = _timed(
                lambda: engine.select_series(TENANT, ptype, sel, where, 60 * 10**9, []),
                max(1, repeat // 2),
            )
            steps["select_series total (SQL + Python grouping)"] = {
                "first_ms": ms(f),
                "median_ms": ms(m),
            }
            json_path = sum(
                steps[k]["median_ms"]
                for k in (
                    "find_series",
                    "sql_stack_values",
                    "stack_table_rows (first: load stacks+frames from DuckDB)",
                    "stack_matrix",
                    "flamegraph_build",
                    "protobuf_message_build",
                    "json_encode (MessageToJson)",
                )
            )
            info = {
                "series": len(sids),
                "distinct_stacks": int(len(values.stack_ids)),  # type: ignore[union-attr]
                "stack_matrix_shape": list(matrix.shape),
                "flamegraph_nodes": int(sum(len(lv) for lv in graph.levels) // 4),  # type: ignore[union-attr]
                "json_bytes": len(text),  # type: ignore[arg-type]
                "proto_bytes": len(blob),  # type: ignore[arg-type]
                "pprof_samples": len(pprof_msg.sample),  # type: ignore[union-attr]
                "warm_json_path_sum_ms": round(json_path, 2),
            }
            out[label] = {"info": info, "steps": steps}
        out["sql_variants_24h"] = _sql_variants(
            store, params, sids_for(store, engine, sel, ptype, params), repeat
        )
    finally:
        store.close()
    return out


def sids_for(store, engine, sel, ptype, params):  # type: ignore[no-untyped-def]
    end_ns = params["end_s"] * 10**9
    return [s.series_id for s in engine.find_series(TENANT, [sel], 0, end_ns + 1, ptype)]


def _sql_variants(store, params, sids, repeat):  # type: ignore[no-untyped-def]
    """The 24 h aggregation written a few ways, to see what the SQL itself costs."""
    con = store._cursor()  # noqa: SLF001
    end_ns = params["end_s"] * 10**9
    start_ns = end_ns - params["hours"] * 3600 * 10**9
    from hotspan.store.base import SampleFilter

    cond, shipped_args = store._sample_where(TENANT, sids, SampleFilter(start_ns, end_ns))  # noqa: SLF001
    tid = shipped_args[0]
    variants = {
        "as shipped (the store's own WHERE clause)": (
            f"SELECT stack_id, sum(value)::BIGINT FROM samples WHERE {cond} GROUP BY stack_id",
            shipped_args,
        ),
        "series_id = ANY(?) instead of IN (SELECT unnest)": (
            "SELECT stack_id, sum(value)::BIGINT FROM samples WHERE tenant_id = ? AND "
            "series_id = ANY(?::BIGINT[]) AND ts >= ? AND ts < ? GROUP BY stack_id",
            [tid, sids, start_ns, end_ns],
        ),
        "inlined literal IN list": (
            "SELECT stack_id, sum(value)::BIGINT FROM samples "
            "WHERE tenant_id = ? AND series_id IN ("
            + ",".join(str(int(s)) for s in sids)
            + ") AND ts >= ? AND ts < ? GROUP BY stack_id",
            [tid, start_ns, end_ns],
        ),
        "without the tenant predicate": (
            "SELECT stack_id, sum(value)::BIGINT FROM samples WHERE series_id IN "
            "(SELECT unnest(?::BIGINT[])) AND ts >= ? AND ts < ? GROUP BY stack_id",
            [sids, start_ns, end_ns],
        ),
        "full scan floor: count(*) of all samples in range": (
            "SELECT count(*) FROM samples WHERE ts >= ? AND ts < ?",
            [start_ns, end_ns],
        ),
    }
    out = {}
    for name, (sql, args) in variants.items():
        _, f, m = _timed(lambda: con.execute(sql, args).fetchnumpy(), max(1, repeat // 2))
        out[name] = {"first_ms": round(f * 1000, 2), "median_ms": round(m * 1000, 2)}
    out["_rows"] = con.execute("SELECT count(*) FROM samples").fetchone()[0]
    return out


def run(
    quick: bool = False, log: Callable[[str], None] = print, rebuild: bool = False
) -> Dict[str, object]:
    params = QUICK if quick else FULL
    data_dir, build_timings, reused = ensure_data(params, log, rebuild)
    service = "svc-07"
    runs, warmups = (5, 1) if quick else (15, 2)
    t0 = time.perf_counter()
    http = run_http(params, data_dir, service, runs, warmups, log)
    http["wall_s"] = round(time.perf_counter() - t0, 1)
    log("  query breakdown (in-process)")
    try:
        bd = breakdown(params, data_dir, service, 3 if quick else 5)
    except Exception as exc:  # noqa: BLE001 - internal APIs move; keep the HTTP numbers
        bd = {"error": repr(exc)}
    return {
        "params": params,
        "data_dir": data_dir,
        "data_reused": reused,
        "build": build_timings,
        "service": service,
        "runs": runs,
        "warmups": warmups,
        "http": http,
        "breakdown": bd,
    }


if __name__ == "__main__":
    common.print_json(run(quick="--quick" in sys.argv, log=common.log))
