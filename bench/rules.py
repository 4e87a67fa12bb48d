"""Three features side by side: recording rules at ingest, "why is this trace slow?", alerts.

Against real ``hotspan server`` processes over 127.0.0.1, in one run:

1. Recording rules' ingest cost: ``bench/ingest.py``'s pprof pushes
   (``POST /push.v1.PusherService/Push``) from ``bench/loadgen.py``, to a fresh server with no
   recording rule and to one with 20 (10 with a function regex, 10 grouping only), alternated;
   uploads/s and server CPU per upload, rules / no rules; then ``GET /metrics`` with and
   without the rules, and the recorded total checked against what the store holds.
2. "Why is this trace slow?": a data set of one busy service (traces of ~10 spans over 26 h,
   CPU and wall profiles whose samples carry the spans' ids, a few requests slow in one
   function), built fresh each run (the alerts judge windows ending now);
   ``GET /api/traces/{id}/why`` for slow root spans beside ``GET /api/traces/{id}/profile``
   for the same spans and the service's flame graph (``SelectMergeStacktraces``) over 24 h/1 h.
3. Alert evaluation: a server with ``--alert-interval 1s`` and three rules (function share,
   CPU per request against a day earlier, share growth between two versions) on that data;
   each rule's ``evaluationSeconds`` from ``GET /api/v1/alerts`` over ~20 evaluations, beside
   the 1 h flame graph of the same service.

    python bench/run.py --only rules [--quick]
    python bench/rules.py [--quick]              # the same, JSON on stdout

Machines here are shared and noisy: the results are ratios measured in one run, no targets.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import common
import ingest
import loadgen
import numpy as np
import synth
import traces

_fmt = common.fmt_number
SEC = 10**9
MS = 10**6
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
WALL = "wall:wall:nanoseconds:wall:nanoseconds"
CONNECT_JSON = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
Log = Callable[[str], None]

# -- 1. recording rules at ingest ------------------------------------------------------------

# Anchored at both ends, as Pyroscope's functionName: each matches frames of bench/synth.py's
# universe (module.qualname names).
FUNCTION_REGEXES = [
    r"sqlalchemy\..*",
    r"json\..*",
    r".*execute.*",
    r"app\.api\..*",
    r"redis\..*",
    r".*encode.*",
    r"asyncio\.tasks\..*",
    r"pydantic\..*",
    r".*\.Session\..*",
    r"re\..*",
]
GROUP_BY_RULES: List[Tuple[str, List[str]]] = [
    ("{}", ["service_name"]),
    ("{}", ["region"]),
    ("{}", ["service_name", "pod"]),
    ('{env="prod"}', ["service_name", "region"]),
    ('{region="eu-west-1"}', ["pod"]),
    ('{service_name="checkout"}', ["pod"]),
    ('{service_name="search"}', ["region"]),
    ('{service_name=~"users|catalog"}', ["service_name"]),
    ("{}", ["env"]),
    ('{service_name!="gateway"}', ["service_name"]),
]
# The rule whose sum must equal every CPU sample value the store holds.
TOTAL_RULE = "group-01"


def ingest_rules() -> Dict[str, Dict[str, Any]]:
    """20 recording rules over the ingest bench's services: 10 filtering stacks by a
    function regex (one service each, half of them grouped by region), 10 grouping only."""
    rules: Dict[str, Dict[str, Any]] = {}
    for i, regex in enumerate(FUNCTION_REGEXES, 1):
        service = ingest.SERVICES[(i - 1) % len(ingest.SERVICES)]
        rules[f"function-{i:02d}"] = {
            "metricName": f"profiles_recorded_bench_function_{i:02d}_cpu_nanoseconds_total",
            "profileType": CPU,
            "selector": f'{{service_name="{service}"}}',
            "groupBy": ["region"] if i % 2 else [],
            "functionName": regex,
        }
    for i, (selector, group_by) in enumerate(GROUP_BY_RULES, 1):
        rules[f"group-{i:02d}"] = {
            "metricName": f"profiles_recorded_bench_group_{i:02d}_cpu_nanoseconds_total",
            "profileType": CPU,
            "selector": selector,
            "groupBy": group_by,
        }
    return rules


def put_ok(client: common.Client, path: str, body: Dict[str, Any]) -> Any:
    status, answer, _ = client.call("PUT", path, body)
    if status not in (200, 201):
        raise RuntimeError(f"PUT {path}: HTTP {status}: {str(answer)[:400]}")
    return answer


def _metric_families(text: str) -> Dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def scrape_metrics(client: common.Client, runs: int, warmups: int) -> Dict[str, object]:
    """``GET /metrics``: latency over ``runs`` after ``warmups``, and what the last one held."""
    times: List[float] = []
    body = b""
    for i in range(warmups + runs):
        status, body, dt = client.request("GET", "/metrics", {})
        if status != 200:
            raise RuntimeError(f"GET /metrics: HTTP {status}: {body[:300]!r}")
        if i >= warmups:
            times.append(dt)
    text = body.decode()
    families = _metric_families(text)
    recorded = {n: f for n, f in families.items() if n.startswith("profiles_recorded_")}
    return {
        **common.latency_summary(times),
        "response_bytes": len(body),
        "families": len(families),
        "recorded_families": len(recorded),
        "recorded_series": sum(len(f.samples) for f in recorded.values()),
        "_families": families,
    }


def _rule_total(families: Dict[str, Any], rule_id: str) -> Optional[int]:
    total, seen = 0, False
    for name, fam in families.items():
        if not name.startswith("profiles_recorded_"):
            continue
        for s in fam.samples:
            if s.labels.get("profiles_rule_id") == rule_id and not s.name.endswith("_created"):
                total += int(s.value)
                seen = True
    return total if seen else None


def _recorder_health(families: Dict[str, Any]) -> Dict[str, object]:
    """The recorder's own series: rules loaded, and anything it had to drop."""
    out: Dict[str, object] = {}
    for name, fam in families.items():
        if name.startswith("hotspan_recording") or ("record" in name and "drop" in name):
            out[name] = round(sum(s.value for s in fam.samples if not s.name.endswith("_created")))
    return out


RECORDING_THREAD = "recording rules (hotspan-recording)"


class _ThreadGroups(ingest.ThreadGroups):
    """ingest.ThreadGroups with the recording rules' worker thread apart (its OS name,
    ``hotspan-recording``, cut to 15 characters)."""

    def stop(self) -> None:
        groups: Dict[str, float] = {}
        for tid, (comm, cpu) in common.thread_times(self.pid).items():
            used = cpu - self._t0.get(tid, ("", 0.0))[1]
            if tid == self.pid:
                name = "event loop (main thread)"
            elif comm.startswith("hotspan-record"):
                name = RECORDING_THREAD
            else:
                name = ingest.THREAD_GROUPS.get(comm) or "other threads"
            groups[name] = groups.get(name, 0.0) + used
        self.cpu_s = {k: round(v, 3) for k, v in sorted(groups.items())}


def run_ingest_once(
    rules: Dict[str, Dict[str, Any]],
    uploads: List[Dict[str, object]],
    concurrency: int,
    warmup: float,
    duration: float,
    scrapes: int,
    workdir: str,
) -> Dict[str, object]:
    """A fresh server with ``rules``, the push load for warm-up + ``duration`` seconds, then
    ``/metrics``; after shutdown, the recorded total against the store's."""
    data_dir = tempfile.mkdtemp(prefix="rules-ingest-", dir=workdir)
    server = common.Server(data_dir).start()
    out: Dict[str, object] = {"rules": len(rules), "server_startup_s": round(server.startup_s, 2)}
    try:
        client = common.Client(server.url)
        t0 = time.perf_counter()
        for rule_id, body in rules.items():
            put_ok(client, f"/api/v1/recording-rules/{rule_id}", body)
        out["put_rules_s"] = round(time.perf_counter() - t0, 3)
        reqs = [
            (
                ingest.push_request(server.host, server.port, up),
                int(up["samples"]),
                int(up["ticks"]),
            )  # type: ignore[arg-type]
            for up in uploads
        ]
        req_file = os.path.join(workdir, "requests-push.pickle")
        with open(req_file, "wb") as f:
            pickle.dump(reqs, f)
        groups = _ThreadGroups(server.pid)
        load, window = ingest.drive_load(server, req_file, concurrency, warmup, duration, groups)
        os.unlink(req_file)
        ok = int(load["ok"])
        if ok:
            out["cpu_ms_per_upload_by_thread"] = {
                name: round(cpu_s * 1000 / ok, 3) for name, cpu_s in groups.cpu_s.items()
            }
            out["recording_ms_per_upload"] = out["cpu_ms_per_upload_by_thread"].get(  # type: ignore[attr-defined]
                RECORDING_THREAD, 0.0
            )
        out.update(
            uploads_ok=ok,
            uploads_per_s=round(ok / duration, 1),
            errors=load["errors"],
            status_counts=load["status"],
            error_examples=load["error_examples"],
            latency_ms=load["latency_ms"],
            server_cpu=window,
            cpu_ms_per_upload=round(window.get("cpu_s", 0.0) * 1000 / ok, 3) if ok else None,
            loadgen_cpu_s=load.get("loadgen_cpu_s"),
        )
        # The recorder counts on its own thread, behind the acknowledgements.
        time.sleep(1.0)
        scrape = scrape_metrics(client, scrapes, 2)
        families = scrape.pop("_families")
        out["metrics"] = scrape
        out["recorder"] = _recorder_health(families)  # type: ignore[arg-type]
        recorded = _rule_total(families, TOTAL_RULE) if rules else None  # type: ignore[arg-type]
        client.close()
        out["server_stop"] = server.stop()
        out["server_stderr"] = server.stderr_tail()[-2000:]
        rows, stored = common.stored_samples(data_dir)
        out["stored"] = {"sample_rows": rows, "value_sum": stored}
        if rules:
            out["recorded_total"] = recorded
            out["recorded_matches_store"] = recorded == stored
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


def count_breakdown(
    uploads: List[Dict[str, object]], rules: Dict[str, Dict[str, Any]], repeat: int = 3
) -> Dict[str, object]:
    """``Recorder.count`` per decoded upload, in this process on one thread (no HTTP, no
    store): what the recording worker spends per batch, for the function-regex rules, the
    group-by rules and all 20; the first pass fills the rules' caches (series -> group, frame
    -> verdict), the later ones find them filled, as a running server does."""
    from hotspan.formats import pprof
    from hotspan.metrics.recorder import Recorder
    from hotspan.metrics.rules import from_json
    from hotspan.model.profile import IngestBatch

    batches = []
    for up in uploads:
        batch = IngestBatch()
        labels = {"service_name": str(up["service"]), "pyroscope_spy": "pyspy"}
        labels.update(up["labels"])  # type: ignore[arg-type]
        pprof.to_batch(pprof.parse(up["body"], 1 << 27), batch, labels, 0)  # type: ignore[arg-type]
        batches.append(batch)
    sets = {
        "10 function-regex rules": {k: v for k, v in rules.items() if "functionName" in v},
        "10 group-by rules": {k: v for k, v in rules.items() if "functionName" not in v},
        "all 20 rules": rules,
    }
    out: Dict[str, object] = {"batches": len(batches)}
    for label, chosen in sets.items():
        recorder = Recorder(None)  # type: ignore[arg-type]  # load() needs no store
        recorder.load({"anonymous": [from_json(body, rid)[0] for rid, body in chosen.items()]})
        passes = []
        for _ in range(1 + repeat):
            t0 = time.perf_counter()
            for batch in batches:
                recorder.count("anonymous", batch)
            passes.append((time.perf_counter() - t0) * 1000 / len(batches))
        steady = statistics.median(passes[1:])
        out[label] = {
            "first_pass_ms_per_batch": round(passes[0], 3),
            "steady_ms_per_batch": round(steady, 3),
            "worker_ceiling_uploads_per_s": round(1000 / steady) if steady else None,
        }
    return out


def run_ingest_cost(quick: bool, concurrency: int, log: Log) -> Dict[str, object]:
    warmup, duration = (1.0, 3.0) if quick else (3.0, 15.0)
    rounds = 1 if quick else 2
    scrapes = 5 if quick else 20
    uploads = ingest.build_uploads(64 if quick else 512)
    rules = ingest_rules()
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-rules-ingest-")
    runs: List[Dict[str, object]] = []
    try:
        breakdown = count_breakdown(uploads, rules)
    except Exception as exc:  # noqa: BLE001 - internal APIs move; keep the HTTP numbers
        breakdown = {"error": repr(exc)}
    log(f"  Recorder.count in-process: {breakdown}")
    try:
        for r in range(rounds):
            # Alternated, so that a drift of the machine's load weighs on both alike.
            for with_rules in (False, True):
                label = "20 rules" if with_rules else "no rules"
                log(
                    f"  ingest round {r + 1}/{rounds}, {label}: {concurrency} clients, {duration} s"
                )
                res = run_ingest_once(
                    rules if with_rules else {},
                    uploads,
                    concurrency,
                    warmup,
                    duration,
                    scrapes,
                    workdir,
                )
                res["round"] = r + 1
                runs.append(res)
                m: Dict[str, object] = res["metrics"]  # type: ignore[assignment]
                log(
                    f"    {res['uploads_per_s']} uploads/s, {res['cpu_ms_per_upload']} ms CPU per "
                    f"upload, errors {res['errors']}; /metrics median {m['median_ms']} ms "
                    f"({m['recorded_series']} recorded series)"
                    + (
                        f"; recorded {res.get('recorded_total')} vs stored "
                        f"{res['stored']['value_sum']}"  # type: ignore[index]
                        if with_rules
                        else ""
                    )
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    def mean(key: str, with_rules: bool) -> float:
        vals = [float(r[key]) for r in runs if bool(r["rules"]) == with_rules and r[key]]  # type: ignore[arg-type]
        return statistics.mean(vals) if vals else float("nan")

    def scrape_median(with_rules: bool) -> float:
        vals = [r["metrics"]["median_ms"] for r in runs if bool(r["rules"]) == with_rules]  # type: ignore[index]
        return statistics.median(vals) if vals else float("nan")

    ratios = {
        "uploads_per_s": _ratio(mean("uploads_per_s", True), mean("uploads_per_s", False)),
        "cpu_per_upload": _ratio(mean("cpu_ms_per_upload", True), mean("cpu_ms_per_upload", False)),
        "metrics_scrape": _ratio(scrape_median(True), scrape_median(False)),
        # The recording worker's own CPU against the whole server's without rules: what the
        # rules cost, read from one thread rather than from two runs' difference (on a shared
        # machine, two runs differ by more than the rules cost).
        "recording_thread_share": _ratio(
            mean("recording_ms_per_upload", True), mean("cpu_ms_per_upload", False)
        ),
    }
    return {
        "params": {
            "distinct_uploads": len(uploads),
            "concurrency": concurrency,
            "warmup_s": warmup,
            "duration_s": duration,
            "rounds": rounds,
            "scrapes": scrapes,
            "rules": rules,
        },
        "runs": runs,
        "ratios": ratios,
        "count_breakdown": breakdown,
    }


def _ratio(a: float, b: float) -> Optional[float]:
    if not b or a != a or b != b:  # zero or NaN
        return None
    return round(a / b, 3)


# -- 2./3. one busy service: traces, span-labelled CPU and wall profiles ----------------------

SERVICE = "checkout"
PODS = 3
VERSIONS = ("1.2", "1.2", "1.3")  # per pod: two pods still on 1.2, one on 1.3
# (span name, weight, the handler function its stacks run under)
ROUTES = [
    ("POST /orders", 70, ("app.api.orders.create_order", "/app/app/api/orders.py", 41)),
    ("GET /orders/{id}", 20, ("app.api.orders.get_order", "/app/app/api/orders.py", 88)),
    ("GET /cart", 10, ("app.api.cart.get_cart", "/app/app/api/cart.py", 17)),
]
SLOW_ROUTE = "POST /orders"
# Share of the slow route's requests that spend 0.3-0.6 s of CPU in apply_discounts: more on
# the new version (what the share-growth alert looks for).
SLOW_SHARE = {"1.2": 0.02, "1.3": 0.05}
SLOW_FUNCTION = "app.services.pricing.apply_discounts"
# kind -> (span name(s), OTLP kind, scope, the frame under the handler, CPU share of its time)
KINDS: Dict[str, Tuple[Tuple[str, ...], int, str, Tuple[str, str, int], float]] = {
    "root": ((), traces.KIND_SERVER, "server", ("", "", 0), 0.6),
    "validate": (("validate_request",), traces.KIND_INTERNAL, "internal",
                 ("app.api.validation.validate_request", "/app/app/api/validation.py", 12), 0.9),
    "db": (("SELECT orders", "SELECT order_lines", "INSERT outbox"), traces.KIND_CLIENT, "db",
           ("app.db.orders.run_query", "/app/app/db/orders.py", 30), 0.15),
    "cache": (("GET",), traces.KIND_CLIENT, "cache",
              ("app.cache.get_cached", "/app/app/cache.py", 22), 0.1),
    "price": (("compute_price",), traces.KIND_INTERNAL, "internal",
              ("app.services.pricing.compute_price", "/app/app/services/pricing.py", 64), 0.9),
    "serialize": (("serialize_response",), traces.KIND_INTERNAL, "internal",
                  ("app.api.serializers.dump", "/app/app/api/serializers.py", 9), 0.9),
}  # fmt: skip
ASGI = [
    ("starlette.applications.Starlette.__call__", f"{synth.SITE}/starlette/applications.py", 122),
    ("starlette.routing.Router.__call__", f"{synth.SITE}/starlette/routing.py", 718),
    ("starlette.routing.Route.handle", f"{synth.SITE}/starlette/routing.py", 276),
]
WAIT_LEAF = {
    "root": ("selectors.EpollSelector.select", f"{synth.STDLIB}/selectors.py", 468),
    "db": ("socket.socket.recv_into", f"{synth.STDLIB}/socket.py", 706),
    "cache": ("socket.socket.recv_into", f"{synth.STDLIB}/socket.py", 706),
}
SLOW_FRAMES = [
    (SLOW_FUNCTION, "/app/app/services/pricing.py", 120),
    ("app.services.pricing.match_rules", "/app/app/services/pricing.py", 151),
]
SLOW_NAMES = {f[0] for f in SLOW_FRAMES}
TAILS_PER_KIND = 40

FULL_DATA = {"traces": 20_000, "hours": 26, "profile_window_s": 300, "seed": 18}
QUICK_DATA = dict(FULL_DATA, traces=2_000)


class ServiceData:
    """Traces of ``SERVICE`` (a root SERVER span and 6-11 children: validation, SQL, Redis,
    pricing, serialization) over ``hours`` ending now, and for each span CPU and wall samples
    labelled with its ``span_id``/``trace_id``, as the hotspan agent uploads them: one pprof
    per pod, profile type and ``profile_window_s``."""

    def __init__(self, params: Dict[str, int], end_ns: int) -> None:
        from hotspan.model.profile import Frame

        self.params = params
        self.end_ns = end_ns
        self.start_ns = end_ns - params["hours"] * 3600 * SEC
        self.window_ns = params["profile_window_s"] * SEC
        self.rng = random.Random(params["seed"])
        self.np_rng = np.random.default_rng(params["seed"])
        frames = synth.frame_universe(self.np_rng, 2500)
        n_tails = TAILS_PER_KIND * len(KINDS)
        tails = synth.grow_stacks(
            self.np_rng, n_tails, len(frames), 6, 16, prefix=(), frame_lo=len(synth.BOOTSTRAP)
        )
        head = [Frame(*f) for f in synth.BOOTSTRAP + ASGI]
        self.weights = list(synth.zipf_weights(TAILS_PER_KIND, s=1.1, offset=3.0))
        # (route index, kind) -> root-first stacks
        self.stacks: Dict[Tuple[int, str], List[Tuple[Any, ...]]] = {}
        for r, (_, _, handler) in enumerate(ROUTES):
            base = head + [Frame(*handler)]
            for k, (kind, spec) in enumerate(KINDS.items()):
                mid = base if kind == "root" else base + [Frame(*spec[3])]
                own = tails[k * TAILS_PER_KIND : (k + 1) * TAILS_PER_KIND]
                self.stacks[(r, kind)] = [tuple(mid + [Frame(*frames[f]) for f in t]) for t in own]
                if kind in WAIT_LEAF:
                    self.stacks[(r, kind + ":wait")] = [tuple(mid + [Frame(*WAIT_LEAF[kind])])]
            price = base + [Frame(*KINDS["price"][3])]
            self.stacks[(r, "slow")] = [
                tuple(price + [Frame(*f) for f in SLOW_FRAMES[: i + 1]]) for i in range(2)
            ]
        # (pod, window, "cpu"|"wall") -> [(stack key, stack index, ticks, span hex, trace hex)]
        self.samples: Dict[Tuple[int, int, str], List[Tuple[Tuple[int, str], int, int, str, str]]]
        self.samples = {}
        self.slow: List[Dict[str, object]] = []
        self.n_spans = 0
        self.n_traces = 0

    def _id(self, n: int) -> bytes:
        return self.rng.getrandbits(8 * n).to_bytes(n, "big") or b"\x01" * n

    def _add(self, pod: int, a: int, ptype: str, key: Tuple[int, str], ticks: int,
             sid: bytes, tid: bytes) -> None:  # fmt: skip
        if ticks <= 0:
            return
        stacks = self.stacks[key]
        rows = self.samples.setdefault((pod, a // self.window_ns, ptype), [])
        if len(stacks) == 1:
            rows.append((key, 0, ticks, sid.hex(), tid.hex()))
            return
        # Ticks spread over the kind's stacks, hot ones more often.
        weights = self.weights if len(stacks) == len(self.weights) else None
        picks = self.np_rng.choice(len(stacks), size=ticks, p=weights)
        for idx, n in zip(*np.unique(picks, return_counts=True)):
            rows.append((key, int(idx), int(n), sid.hex(), tid.hex()))

    def _profile(self, pod: int, route: int, kind: str, a: int, self_ns: int, sid: bytes,
                 tid: bytes) -> None:  # fmt: skip
        share = KINDS[kind][4]
        period = synth.PERIOD_NS
        cpu = int(self.np_rng.poisson(self_ns * share / period))
        wall = int(self.np_rng.poisson(self_ns / period))
        self._add(pod, a, "cpu", (route, kind), cpu, sid, tid)
        waited = max(wall - cpu, 0)
        self._add(pod, a, "wall", (route, kind), wall - waited, sid, tid)
        wait_key = (route, kind + ":wait")
        self._add(pod, a, "wall", wait_key if wait_key in self.stacks else (route, kind),
                  waited, sid, tid)  # fmt: skip

    def trace(self, start_ns: int) -> List[traces.SpanRec]:
        rng = self.rng
        tid, root = self._id(16), self._id(8)
        pod = rng.randrange(PODS)
        version = VERSIONS[pod]
        route = rng.choices(range(len(ROUTES)), [w for _, w, _ in ROUTES])[0]
        name = ROUTES[route][0]
        slow = name == SLOW_ROUTE and rng.random() < SLOW_SHARE[version]
        extra = int(rng.uniform(0.3, 0.6) * SEC) if slow else 0
        dur = int(rng.lognormvariate(4.3, 0.5) * MS)  # median ~74 ms
        n_children = rng.randint(6, 11)
        kinds = ["validate", "price", "serialize"]
        kinds[1:1] = rng.choices(["db", "db", "cache"], k=n_children - 3)
        cursor = start_ns + dur // 20
        budget = dur * 85 // 100
        shares = [rng.uniform(0.5, 1.5) for _ in kinds]
        scale = budget / sum(shares)
        spans: List[traces.SpanRec] = []
        busy = 0
        for kind, part in zip(kinds, shares):
            names, otlp_kind, scope, _, _ = KINDS[kind]
            length = max(int(part * scale), 100_000)
            if kind == "price":
                length += extra
            sid = self._id(8)
            a, b = cursor, cursor + length
            cursor = b + 50_000
            busy += length
            attrs: list = [("code.function", names[0])] if scope == "internal" else []
            if scope == "db":
                attrs = [("db.system", "postgresql"), ("db.name", "orders")]
            spans.append((tid, sid, root, rng.choice(names), otlp_kind, SERVICE, pod, scope, a, b,
                          0, attrs, None))  # fmt: skip
            if kind == "price" and slow:
                self._add(pod, a, "cpu", (route, "slow"), int(extra * 0.95) // synth.PERIOD_NS,
                          sid, tid)  # fmt: skip
                self._add(pod, a, "wall", (route, "slow"), extra // synth.PERIOD_NS, sid, tid)
                self._profile(pod, route, kind, a, length - extra, sid, tid)
            else:
                self._profile(pod, route, kind, a, length, sid, tid)
        end = max(start_ns + dur + extra, cursor + 200_000)
        self._profile(pod, route, "root", start_ns, end - start_ns - busy, root, tid)
        attrs = [("http.route", name.split(" ", 1)[1]), ("http.request.method", name.split()[0]),
                 ("http.response.status_code", 200)]  # fmt: skip
        spans.insert(0, (tid, root, b"", name, traces.KIND_SERVER, SERVICE, pod, "server",
                         start_ns, end, 0, attrs, None))  # fmt: skip
        if slow:
            self.slow.append({"trace_id": tid.hex(), "span_id": root.hex(), "start_ns": start_ns,
                              "end_ns": end, "version": version})  # fmt: skip
        return spans

    def span_bodies(self) -> List[Tuple[bytes, int]]:
        """OTLP request bodies of up to 512 spans, traces in time order, and their spans."""
        builder = traces.BodyBuilder()
        n = self.params["traces"]
        step = (self.end_ns - 10 * SEC - self.start_ns) / n
        out: List[Tuple[bytes, int]] = []
        pending: List[traces.SpanRec] = []
        for i in range(n):
            pending.extend(self.trace(int(self.start_ns + i * step + self.rng.random() * step)))
            while len(pending) >= traces.SPANS_PER_REQUEST or (pending and i == n - 1):
                chunk = pending[: traces.SPANS_PER_REQUEST]
                del pending[: traces.SPANS_PER_REQUEST]
                out.append((builder.build(chunk), len(chunk)))
                self.n_spans += len(chunk)
        self.n_traces = n
        return out

    def uploads(self, host: str, port: int) -> List[Tuple[bytes, int]]:
        """One ``POST /ingest`` (gzipped pprof) per pod, window and profile type."""
        import gzip

        from hotspan.formats.pprof import ProfileBuilder
        from hotspan.model.profile import ProfileType

        types = {"cpu": ProfileType.parse(CPU), "wall": ProfileType.parse(WALL)}
        out = []
        for (pod, window, ptype), rows in sorted(self.samples.items()):
            builder = ProfileBuilder.of_type(types[ptype], synth.PERIOD_NS)
            span_key, trace_key = builder.string("span_id"), builder.string("trace_id")
            prof = builder.profile
            for key, idx, ticks, span_hex, trace_hex in rows:
                builder.add(self.stacks[key][idx], ticks * synth.PERIOD_NS)
                sample = prof.sample[-1]
                sample.label.add(key=span_key, str=builder.string(span_hex))
                sample.label.add(key=trace_key, str=builder.string(trace_hex))
            prof.time_nanos = window * self.window_ns
            prof.duration_nanos = self.window_ns
            body = gzip.compress(prof.SerializeToString(), compresslevel=1)
            from_s = window * self.window_ns // SEC
            labels = f"pod={SERVICE}-{pod},version={VERSIONS[pod]},env=production"
            until_s = from_s + self.window_ns // SEC
            name = f"{SERVICE}{{{labels}}}"
            request = loadgen.ingest_pprof(host, port, name, from_s, until_s, body, "hotspan")
            out.append((request, len(rows)))
        return out


def build_service_data(params: Dict[str, int], data_dir: str, log: Log) -> Dict[str, object]:
    """Generate and push the data set through a real server; the slow requests to ask about."""
    t_all = time.perf_counter()
    end_ns = (time.time_ns() // SEC - 60) * SEC
    gen = ServiceData(params, end_ns)
    t0 = time.perf_counter()
    bodies = gen.span_bodies()
    info: Dict[str, object] = {
        "end_ns": end_ns,
        "generate_s": round(time.perf_counter() - t0, 1),
        "traces": gen.n_traces,
        "spans": gen.n_spans,
        "slow_traces": len(gen.slow),
    }
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-rules-load-")
    server = common.Server(data_dir).start()
    try:
        assert server.otlp_http is not None, "the server has no OTLP/HTTP receiver"
        host, port = server.otlp_http
        requests = [
            (loadgen.post(host, port, "/v1/traces", b, "application/x-protobuf"), n)
            for b, n in bodies
        ]
        log(f"  service data: pushing {gen.n_spans:,} spans ({gen.n_traces:,} traces), OTLP/HTTP")
        spec = {"protocol": "http", "mode": "once", "concurrency": 8}
        load = traces.run_load(dict(spec, target=f"{host}:{port}"), requests, workdir)
        if load["errors"] or load["acked_items"] != gen.n_spans:
            raise RuntimeError(f"loading the spans failed: {load}")
        info["load_spans_s"] = load["wall_s"]
        t0 = time.perf_counter()
        uploads = gen.uploads(server.host, server.port)
        info["generate_profiles_s"] = round(time.perf_counter() - t0, 1)
        info["profile_uploads"] = len(uploads)
        info["profile_sample_rows"] = sum(n for _, n in uploads)
        log(
            f"  service data: pushing {len(uploads):,} profiles "
            f"({info['profile_sample_rows']:,} rows)"
        )
        load = traces.run_load(dict(spec, target=f"{server.host}:{server.port}"), uploads, workdir)
        if load["errors"] or load["acked"] != len(uploads):
            raise RuntimeError(f"loading the profiles failed: {load}")
        info["load_profiles_s"] = load["wall_s"]
    finally:
        info["server_stop"] = server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    # Slow requests whose 24 h baseline window is full of data: 2-8 h before the end.
    lo, hi = end_ns - 8 * 3600 * SEC, end_ns - 2 * 3600 * SEC
    chosen = [s for s in gen.slow if lo <= int(s["start_ns"]) <= hi] or gen.slow  # type: ignore[call-overload]
    step = max(len(chosen) // 10, 1)
    info["targets"] = chosen[::step][:10]
    info["total_build_s"] = round(time.perf_counter() - t_all, 1)
    return info


# -- 2. why, span profile, flame graph --------------------------------------------------------


def _why_check(answer: Dict[str, Any]) -> Dict[str, object]:
    cpu = next((p for p in answer.get("profiles", []) if p["profileType"] == CPU), None)
    first = cpu["functions"][0]["name"] if cpu and cpu["functions"] else None
    return {
        "verdict": answer.get("verdict"),
        "baseline_spans": answer.get("baseline", {}).get("spans"),
        "profiles": len(answer.get("profiles", [])),
        "top_cpu_function": first,
        # Either frame of the slow path: the extra self time is split between the two.
        "names_slow_path_first": "yes" if first in SLOW_NAMES else "no",
    }


def _flame_check(answer: Dict[str, Any]) -> Dict[str, object]:
    fg = answer.get("flamegraph", {})
    return {
        "total": int(fg.get("total", 0)),
        "names": len(fg.get("names", [])),
        "nodes": sum(len(lv.get("values", [])) // 4 for lv in fg.get("levels", [])),
    }


def time_query(
    client: common.Client,
    name: str,
    request: Callable[[int], Tuple[str, str, Optional[Any], Optional[Dict[str, str]]]],
    check: Callable[[Dict[str, Any]], Dict[str, object]],
    runs: int,
    warmups: int,
    log: Log,
) -> Dict[str, object]:
    """``request(i)`` -> (method, path, JSON body, headers) for run ``i``; the first run's
    answer is checked; median and p95 of the timed ones."""

    def send(i: int) -> bytes:
        method, path, body, headers = request(i)
        data = None if body is None else json.dumps(body).encode()
        if not headers and data is not None:
            headers = {"Content-Type": "application/json"}
        return client.fetch(f"{name}: {method} {path}", method, path, headers, data)

    raw, first, times = common.repeat_timed(send, warmups, runs)
    answer = json.loads(raw) if raw else None
    info = check(answer)  # type: ignore[arg-type]
    size = len(json.dumps(answer))
    summary = common.latency_summary(times)
    summary["p95_ms"] = round(common.percentile([t * 1000 for t in times], 95), 2)
    out = {"name": name, **summary, "first_ms": round(first * 1000, 2), "response_bytes": size,
           "result": info}  # fmt: skip
    log(f"  {name}: median {summary['median_ms']} ms, p95 {summary['p95_ms']} ms {info}")
    return out


def merge_request(end_ns: int, hours: int) -> Tuple[str, str, Dict[str, str], Dict[str, str]]:
    end_ms = end_ns // MS
    body = {
        "profile_typeID": CPU,
        "label_selector": f'{{service_name="{SERVICE}"}}',
        "start": str(end_ms - hours * 3600 * 1000),
        "end": str(end_ms),
    }
    return "POST", "/querier.v1.QuerierService/SelectMergeStacktraces", body, CONNECT_JSON


def run_why(
    data_dir: str, data: Dict[str, object], runs: int, warmups: int, log: Log
) -> Dict[str, object]:
    targets: List[Dict[str, Any]] = data["targets"]  # type: ignore[assignment]
    if not targets:
        raise RuntimeError("the data set has no slow request to ask about")
    end_ns = int(data["end_ns"])  # type: ignore[call-overload]
    queries: Dict[str, object] = {}
    with common.measured_server(data_dir) as (server, out):
        client = common.Client(server.url)

        def target(i: int) -> Dict[str, Any]:
            return targets[i % len(targets)]

        queries["why"] = time_query(
            client,
            "`GET /api/traces/{id}/why?spanID=<root>`",
            lambda i: (
                "GET",
                f"/api/traces/{target(i)['trace_id']}/why?spanID={target(i)['span_id']}",
                None,
                None,
            ),  # fmt: skip
            _why_check,
            runs,
            warmups,
            log,
        )
        queries["span_profile"] = time_query(
            client,
            "`GET /api/traces/{id}/profile?spanID=<root>&descendants=true`",
            lambda i: (
                "GET",
                f"/api/traces/{target(i)['trace_id']}/profile?"
                f"spanID={target(i)['span_id']}&descendants=true",
                None,
                None,
            ),  # fmt: skip
            _flame_check,
            runs,
            warmups,
            log,
        )
        for hours in (24, 1):
            queries[f"merge_{hours}h"] = time_query(
                client,
                f'`SelectMergeStacktraces` `{{service_name="{SERVICE}"}}` {hours} h (JSON)',
                lambda i, h=hours: merge_request(end_ns, h),  # type: ignore[misc]
                _flame_check,
                runs,
                warmups,
                log,
            )
        # Every target once: does the answer name the slow function first for each of them?
        named = 0
        for t in targets:
            status, answer, _ = client.call(
                "GET", f"/api/traces/{t['trace_id']}/why?spanID={t['span_id']}"
            )
            named += status == 200 and _why_check(answer)["names_slow_path_first"] == "yes"
        out["targets_named_first"] = f"{named}/{len(targets)}"
        client.close()
    out["queries"] = queries
    why_ms = queries["why"]["median_ms"]  # type: ignore[index]
    out["ratios"] = {
        "why_over_span_profile": _ratio(why_ms, queries["span_profile"]["median_ms"]),  # type: ignore[index]
        "why_over_merge_24h": _ratio(why_ms, queries["merge_24h"]["median_ms"]),  # type: ignore[index]
    }
    return out


# -- 3. alert evaluation -----------------------------------------------------------------------

ALERT_WINDOW = "1h"


def alert_rules() -> Dict[str, Dict[str, Any]]:
    selector = f'{{service_name="{SERVICE}"}}'
    return {
        "discounts-share": {
            "selector": selector,
            "profileType": CPU,
            "condition": {"kind": "function_share", "function": "apply_discounts",
                          "above": 50, "window": ALERT_WINDOW},
        },
        "cpu-per-request-vs-yesterday": {
            "selector": selector,
            "profileType": CPU,
            "condition": {"kind": "per_request", "increase": 50, "window": ALERT_WINDOW,
                          "against": {"offset": "24h"}},
        },
        "discounts-share-growth-1.3": {
            "selector": selector,
            "profileType": CPU,
            "condition": {"kind": "share_growth", "function": "apply_discounts", "points": 5,
                          "window": ALERT_WINDOW, "label": "version", "baseline": "1.2",
                          "comparison": "1.3"},
        },
    }  # fmt: skip


def run_alerts(
    data_dir: str, evaluations: int, timeout_s: float, merge_1h_ms: float, log: Log
) -> Dict[str, object]:
    rules = alert_rules()
    seen: Dict[str, List[Dict[str, Any]]] = {name: [] for name in rules}
    last: Dict[str, Any] = {}
    server = common.Server(data_dir, ["--alert-interval", "1s"]).start()
    out: Dict[str, object] = {"interval": "1s", "window": ALERT_WINDOW, "rules": rules}
    cpu = common.CpuWindow(server.pid)
    try:
        client = common.Client(server.url)
        for name, body in rules.items():
            put_ok(client, f"/api/v1/alerts/rules/{name}", body)
        cpu.start()
        t0 = time.perf_counter()
        log(f"  alerts: waiting for {evaluations} evaluations of each of {len(rules)} rules")
        while time.perf_counter() - t0 < timeout_s:
            status, answer, _ = client.call("GET", "/api/v1/alerts")
            if status != 200:
                raise RuntimeError(f"GET /api/v1/alerts: HTTP {status}: {str(answer)[:300]}")
            for alert in answer.get("alerts", []):
                name = alert.get("name")
                if name not in seen:
                    continue
                n = alert.get("evaluations") or 0
                if n and (not seen[name] or seen[name][-1]["evaluations"] != n):
                    seen[name].append(
                        {
                            "evaluations": n,
                            "seconds": alert.get("evaluationSeconds"),
                            "at": alert.get("lastEvaluation"),
                            "at_s": time.perf_counter() - t0,
                        }
                    )
                last[name] = alert
            if all(len(v) >= evaluations for v in seen.values()):
                break
            time.sleep(0.2)
        out["observed_s"] = round(time.perf_counter() - t0, 1)
        out["server_cpu"] = cpu.stop()
        client.close()
    finally:
        out["server_stop"] = server.stop()
        out["server_stderr"] = server.stderr_tail()[-2000:]
    per_rule: Dict[str, object] = {}
    for name, evs in seen.items():
        secs = [float(e["seconds"]) for e in evs if e["seconds"] is not None]
        gaps = [b["at_s"] - a["at_s"] for a, b in zip(evs, evs[1:])]
        alert = last.get(name, {})
        median_ms = round(statistics.median(secs) * 1000, 2) if secs else None
        per_rule[name] = {
            "kind": rules[name]["condition"]["kind"],
            "evaluations_seen": len(evs),
            "missed_between_polls": (evs[-1]["evaluations"] - evs[0]["evaluations"] + 1 - len(evs))
            if evs
            else None,
            "median_ms": median_ms,
            "p95_ms": round(common.percentile(secs, 95) * 1000, 2) if secs else None,
            "max_ms": round(max(secs) * 1000, 2) if secs else None,
            "seconds_between_evaluations": round(statistics.median(gaps), 2) if gaps else None,
            "ratio_to_merge_1h": _ratio(median_ms, merge_1h_ms) if median_ms else None,
            "state": alert.get("state"),
            "value": alert.get("value"),
            "summary": alert.get("summary"),
            "last_error": alert.get("lastError"),
        }
        log(f"  alert {name}: {per_rule[name]}")
    out["per_rule"] = per_rule
    return out


# -- the whole benchmark -----------------------------------------------------------------------


def run(quick: bool = False, log: Log = print, concurrency: int = 32) -> Dict[str, object]:
    out: Dict[str, object] = {"quick": quick, "stages_s": {}}
    stages: Dict[str, float] = out["stages_s"]  # type: ignore[assignment]
    t0 = time.perf_counter()
    log("  1. recording rules at ingest")
    out["ingest"] = run_ingest_cost(quick, concurrency, log)
    stages["ingest"] = round(time.perf_counter() - t0, 1)

    params = QUICK_DATA if quick else FULL_DATA
    runs, warmups = (5, 1) if quick else (15, 2)
    data_dir = tempfile.mkdtemp(prefix="hotspan-bench-rules-data-")
    try:
        t0 = time.perf_counter()
        log(f"  2. service data set: {params['traces']:,} traces over {params['hours']} h")
        data = build_service_data(params, data_dir, log)
        out["data"] = {"params": params, **data}
        stages["data_set"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        out["why"] = run_why(data_dir, data, runs, warmups, log)
        stages["why"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        log("  3. alert evaluation")
        merge_1h = out["why"]["queries"]["merge_1h"]["median_ms"]  # type: ignore[index]
        out["alerts"] = run_alerts(
            data_dir, 5 if quick else 20, 90.0 if quick else 240.0, merge_1h, log
        )
        stages["alerts"] = round(time.perf_counter() - t0, 1)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


def markdown(result: Dict[str, Any], command: str, m: Dict[str, Any], wall: float) -> str:
    lines: List[str] = []
    add = lines.append
    lines += common.head(
        "hotspan rules benchmark: recording rules, why, alerts"
        + (" (quick)" if result["quick"] else ""),
        command,
        wall,
        common.machine_text(m, note=common.SHARED_CPUS),
    )
    ing = result["ingest"]
    p = ing["params"]
    add("")
    add("## 1. Recording rules at ingest")
    add("")
    add(
        "`bench/ingest.py`'s pprof pushes (`POST /push.v1.PusherService/Push`, "
        f"{p['distinct_uploads']} "
        f"distinct 10 s CPU profiles of 300 stacks, 8 services x 4 pods) from `bench/loadgen.py`, "
        f"{p['concurrency']} in flight, {p['warmup_s']} s warm-up and {p['duration_s']} s "
        "measured, "
        f"to a fresh server with no rule and to one with 20 recording rules put before the load "
        f"(10 with a `functionName` regex such as `sqlalchemy\\..*` or `.*execute.*`, one service "
        f"each, half grouped by region; 10 grouping only, over `{{}}` or a few services, by "
        f"service, region, pod or env); {p['rounds']} round(s), alternated. `/metrics`: median of "
        f"{p['scrapes']} scrapes after the load. Recorded = the sum of rule `{TOTAL_RULE}` "
        f"(`{{}}` by service_name), which must equal the sum of every stored sample value."
    )
    add("")
    add(
        "| round | rules | uploads/s | p50 ms | p99 ms | errors | server CPU s | CPU ms/upload "
        "| recording thread ms/upload "
        "| /metrics median ms | /metrics p90 ms | bytes | recorded series | batches not counted "
        "| recorded = stored |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in ing["runs"]:
        mt = r["metrics"]
        check = "" if not r["rules"] else ("yes" if r.get("recorded_matches_store") else
                                            f"**no**: {r.get('recorded_total')} vs "
                                            f"{r['stored']['value_sum']}")  # fmt: skip
        add(
            f"| {r['round']} | {r['rules']} | {r['uploads_per_s']} | {r['latency_ms']['p50']} | "
            f"{r['latency_ms']['p99']} | {r['errors']} | {r['server_cpu'].get('cpu_s')} | "
            f"{r['cpu_ms_per_upload']} | {r.get('recording_ms_per_upload', '')} | "
            f"{mt['median_ms']} | {mt['p90_ms']} | "
            f"{_fmt(mt['response_bytes'])} | {mt['recorded_series']} | "
            f"{r['recorder'].get('hotspan_recording_rule_dropped_batches', '')} | {check} |"
        )
    ratios = ing["ratios"]
    add("")
    add(
        "Ratios, 20 rules / no rules (means over the rounds): uploads/s "
        f"x{ratios['uploads_per_s']}, "
        f"server CPU per upload x{ratios['cpu_per_upload']}, `/metrics` scrape time "
        f"x{ratios['metrics_scrape']}."
    )
    if ratios.get("recording_thread_share") is not None:
        add("")
        add(
            "The recording worker's thread (`hotspan-recording`) used "
            f"{ratios['recording_thread_share']:.1%} of the CPU per upload that the server "
            "without rules used in all: what counting costs, read from its own thread (the "
            "two runs' totals differ by more than that on a shared machine)."
        )
    add("")
    add(
        "Batches not counted: `hotspan_recording_rule_dropped_batches`, stored batches the "
        "recording worker skipped because its queue was full; recorded = stored only when it "
        "is 0."
    )
    bd = ing.get("count_breakdown", {})
    add("")
    if "error" in bd:
        add(f"In-process `Recorder.count` breakdown failed: `{bd['error']}`")
    elif bd:
        add(
            f"`Recorder.count` in-process (one thread, no HTTP, the {bd['batches']} decoded "
            "uploads; the first pass fills the rules' caches):"
        )
        add("")
        add("| rules | first pass ms/batch | steady ms/batch | worker ceiling uploads/s |")
        add("|---|---:|---:|---:|")
        for label, v in bd.items():
            if isinstance(v, dict):
                add(
                    f"| {label} | {v['first_pass_ms_per_batch']} | {v['steady_ms_per_batch']} "
                    f"| {_fmt(v['worker_ceiling_uploads_per_s'])} |"
                )
    d = result.get("data")
    if d:
        dp = d["params"]
        add("")
        add("## Data set for 2 and 3")
        add("")
        add(
            f"One service, `{SERVICE}`, {PODS} pods (versions {', '.join(VERSIONS)}): "
            f"{_fmt(d['traces'])} traces ({_fmt(d['spans'])} spans: a SERVER root "
            f"`POST /orders` 70 %, `GET /orders/{{id}}` 20 %, `GET /cart` 10 %, and 6-11 children: "
            f"validation, SQL, Redis, `compute_price`, serialization; roots ~74 ms median) with "
            f"start times spread over the {dp['hours']} h before the run, pushed over OTLP/HTTP "
            f"({d['load_spans_s']} s); CPU and wall profiles per span (Poisson ticks at 100 Hz "
            f"from each span's own time, CPU share by kind), labelled with its `span_id` and "
            f"`trace_id`, one pprof per pod, type and {dp['profile_window_s'] // 60}-minute window "
            f"through `POST /ingest`: {_fmt(d['profile_uploads'])} uploads, "
            f"{_fmt(d['profile_sample_rows'])} sample rows ({d['load_profiles_s']} s). "
            f"{d['slow_traces']} requests are slow: 0.3-0.6 s more CPU in `{SLOW_FUNCTION}` "
            f"({SLOW_SHARE['1.2']:.0%} of `POST /orders` on 1.2, {SLOW_SHARE['1.3']:.0%} on 1.3). "
            f"Built fresh in {d['total_build_s']} s (the alerts judge windows ending now)."
        )
    w = result.get("why")
    if w:
        add("")
        add("## 2. Why is this trace slow?")
        add("")
        add(
            f"One keep-alive connection; each query {w['queries']['why']['runs']} timed runs "
            "after warm-up(s), median and p95. `why` and the span profile rotate over "
            f"{len(d['targets'])} slow requests that started 2-8 h before the end (a full 24 h "
            f"baseline window); the answer's first CPU function was `{SLOW_FUNCTION}` or the "
            f"function it calls (the slow path's self time is split between them) for "
            f"{w['targets_named_first']} of them."
        )
        add("")
        add("| query | median ms | p95 ms | first ms | response bytes | result |")
        add("|---|---:|---:|---:|---:|---|")
        for q in w["queries"].values():
            res = ", ".join(f"{k} {_fmt(v)}" for k, v in q["result"].items())
            add(
                f"| {q['name']} | {q['median_ms']} | {q['p95_ms']} | {q['first_ms']} | "
                f"{_fmt(q['response_bytes'])} | {res} |"
            )
        rt = w["ratios"]
        add("")
        add(
            f"Ratios (medians): why / span profile x{rt['why_over_span_profile']}, why / 24 h "
            f"flame graph of the service x{rt['why_over_merge_24h']}."
        )
    a = result.get("alerts")
    if a:
        add("")
        add("## 3. Alert evaluation")
        add("")
        add(
            f"A server on the same data with `--alert-interval {a['interval']}` and three rules "
            f'on `{{service_name="{SERVICE}"}}`, window {a["window"]}: function share of '
            f"`apply_discounts` above 50 %, CPU per request +50 % against 24 h earlier, "
            f"`apply_discounts`'s share grown 5 points from version 1.2 to 1.3. "
            f"`evaluationSeconds` of each evaluation read from `GET /api/v1/alerts` (polled "
            f"every 0.2 s) for {a['observed_s']} s; server CPU meanwhile "
            f"{a['server_cpu'].get('cpu_s')} s ({a['server_cpu'].get('cpu_per_wall')} of a core). "
            f"Ratio: the median evaluation over the median 1 h `SelectMergeStacktraces` of the "
            f"service from part 2 (an evaluation runs in-process, the flame graph over HTTP)."
        )
        add("")
        add(
            "| rule | kind | evaluations | median ms | p95 ms | max ms | s between | "
            "x 1 h flame graph | state | value | last error |"
        )
        add("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
        for name, r in a["per_rule"].items():
            value = r["value"] if r["value"] is None else f"{r['value']:.4g}"
            add(
                f"| {name} | {r['kind']} | {r['evaluations_seen']} | {r['median_ms']} | "
                f"{r['p95_ms']} | {r['max_ms']} | {r['seconds_between_evaluations']} | "
                f"{r['ratio_to_merge_1h']} | {r['state']} | {value} | {r['last_error'] or ''} |"
            )
        add("")
        for name, r in a["per_rule"].items():
            add(f"- {name}: {r['summary']}")
    add("")
    add("Stages (s): " + ", ".join(f"{k} {v}" for k, v in result["stages_s"].items()) + ".")
    errors = [
        f"{label}: {text.strip()[-600:]}"
        for label, text in [
            *[(f"ingest round {r['round']} ({r['rules']} rules)", r.get("server_stderr", ""))
              for r in ing["runs"]],
            ("why", (w or {}).get("server_stderr", "")),
            ("alerts", (a or {}).get("server_stderr", "")),
        ]
        if text and str(text).strip()
    ]  # fmt: skip
    lines += common.stderr_section(errors)
    add("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(common.print_json(run(quick="--quick" in sys.argv, log=common.log)))
