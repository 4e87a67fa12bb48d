"""Traces benchmark: OTLP span ingest, Tempo API queries on 1 M spans, span-profile queries.

Against a real ``hotspan server`` over 127.0.0.1:

1. Ingest: pre-built ``ExportTraceServiceRequest`` bodies of 512 spans (traces of 8-20 spans
   across a few services, ~8 attributes per span) pushed by concurrent clients from a separate
   process over OTLP/HTTP (``POST /v1/traces``, keep-alive HTTP/1.1) and over OTLP/gRPC
   (``TraceService/Export``, grpc.aio), each to a fresh data directory; afterwards the spans on
   disk are counted against the spans acknowledged.
2. Queries with 1,000,000 spans stored (loaded through OTLP/HTTP once and cached under /tmp,
   24 h of traces): trace by id (v1 JSON and protobuf, v2), ``/api/search`` (no condition,
   ``tags``, TraceQL, ``minDuration``, attribute conditions), tag names and tag values.
3. Span profiles: CPU profiles whose samples carry ``span_id``/``trace_id`` labels of stored
   spans (pushed with the data set), then ``SelectMergeSpanProfile``, ``/api/traces/{id}/profile``
   and ``/api/traces/{id}/spans``.

    python bench/run.py --only traces [--quick] [--rebuild]
    python bench/traces.py [--quick]            # the same, JSON on stdout
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlencode

import common
import loadgen
import numpy as np
import synth

_fmt = common.fmt_number

END_S = 1_767_225_600  # 2026-01-01 00:00 UTC: fixed, so that the cached data set is reusable
SEC = 10**9
MS = 10**6
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
SPANS_PER_REQUEST = 512
TRACE_SERVICE_EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

# -- synthetic traces ------------------------------------------------------------------------

# service -> (what its HTTP handlers are called, what they do below themselves)
SERVICES = [
    "frontend",
    "cart",
    "checkout",
    "payment",
    "shipping",
    "catalog",
    "users",
    "recommendation",
]
PODS_PER_SERVICE = 3
# Routes of the frontend (the root spans), with weights and the services each one calls.
ROUTES: List[Tuple[str, str, int, Tuple[str, ...]]] = [
    ("GET", "/api/products/{id}", 30, ("catalog", "recommendation", "users")),
    ("GET", "/api/products", 20, ("catalog", "recommendation")),
    ("GET", "/api/cart", 15, ("cart", "catalog", "users")),
    ("POST", "/api/cart/items", 10, ("cart", "catalog")),
    ("POST", "/api/checkout", 6, ("checkout", "cart", "payment", "shipping", "users")),
    ("GET", "/api/orders/{id}", 8, ("checkout", "shipping", "users")),
    ("GET", "/api/users/{id}", 6, ("users", "recommendation")),
    ("POST", "/api/login", 5, ("users",)),
]
# A service's own handlers: (method, route, operations below it).
HANDLERS: Dict[str, List[Tuple[str, str]]] = {
    "cart": [("GET", "/cart/{user_id}"), ("POST", "/cart/{user_id}/items")],
    "checkout": [("POST", "/orders"), ("GET", "/orders/{id}")],
    "payment": [("POST", "/charge"), ("POST", "/refund")],
    "shipping": [("GET", "/quote"), ("POST", "/shipments")],
    "catalog": [("GET", "/products/{id}"), ("GET", "/products"), ("GET", "/search")],
    "users": [("GET", "/users/{id}"), ("POST", "/sessions")],
    "recommendation": [("GET", "/recommendations/{user_id}")],
}
TABLES = {
    "cart": ["carts", "cart_items"],
    "checkout": ["orders", "order_lines", "outbox"],
    "payment": ["payments", "ledger_entries"],
    "shipping": ["shipments", "rates"],
    "catalog": ["products", "prices", "inventory"],
    "users": ["users", "sessions", "addresses"],
    "recommendation": ["user_events", "product_scores"],
}
INTERNAL = [
    ("serialize_response", "app.api.serializers"),
    ("validate_request", "app.api.validation"),
    ("render_template", "app.views"),
    ("compute_price", "app.services.pricing"),
    ("rank_candidates", "app.services.ranking"),
    ("load_feature_flags", "app.config"),
]
SCOPES = {
    "server": ("opentelemetry.instrumentation.fastapi", "0.48b0"),
    "client": ("opentelemetry.instrumentation.httpx", "0.48b0"),
    "db": ("opentelemetry.instrumentation.sqlalchemy", "0.48b0"),
    "cache": ("opentelemetry.instrumentation.redis", "0.48b0"),
    "internal": ("app", "1.0.0"),
}
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3

# A span before it becomes protobuf: (trace_id bytes, span_id bytes, parent bytes, name, kind,
# service, pod, scope key, start ns, end ns, status code, attributes, error event or None)
SpanRec = Tuple[bytes, bytes, bytes, str, int, str, int, str, int, int, int, list, object]


class TraceGen:
    """Traces of 8-20 spans: a frontend request (SERVER span) calling a few services (a CLIENT
    span in the caller, a SERVER span in the callee), which run SQL queries, Redis commands and
    internal steps.  ~2% of the traces fail somewhere (status ERROR, HTTP 500 up the chain)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.route_weights = [r[2] for r in ROUTES]

    def _id(self, n: int) -> bytes:
        return self.rng.getrandbits(8 * n).to_bytes(n, "big") or b"\x01" * n

    def trace(self, start_ns: int) -> List[SpanRec]:
        rng = self.rng
        tid = self._id(16)
        method, route, _, callees = rng.choices(ROUTES, self.route_weights)[0]
        n_target = rng.randint(8, 20)
        failing = rng.random() < 0.02
        dur = int(rng.lognormvariate(4.2, 0.8) * MS)  # median ~70 ms
        user = rng.randint(1, 200_000)
        item = rng.randint(1, 50_000)
        path = route.replace("{id}", str(item))
        root_id = self._id(8)
        status = 500 if failing else rng.choice((200, 200, 200, 200, 200, 200, 304, 404))
        spans: List[SpanRec] = []
        pod = rng.randrange(PODS_PER_SERVICE)
        root_attrs = [
            ("http.request.method", method),
            ("http.route", route),
            ("url.path", path),
            ("url.scheme", "https"),
            ("http.response.status_code", status),
            ("server.address", "shop.example.com"),
            (
                "client.address",
                f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(256)}",
            ),
            ("user_agent.original", rng.choice(_USER_AGENTS)),
            ("enduser.id", f"user-{user}"),
        ]
        end_ns = start_ns + dur
        spans.append(
            (tid, root_id, b"", f"{method} {route}", KIND_SERVER, "frontend", pod, "server",
             start_ns, end_ns, 2 if failing else 0, root_attrs, None)
        )  # fmt: skip
        # Downstream calls, one after the other inside the root span.
        i = 0
        cursor = start_ns + dur // 20
        calls = list(callees)
        rng.shuffle(calls)
        while len(spans) < n_target:
            callee = calls[i % len(calls)]
            i += 1
            left = end_ns - cursor
            c_dur = max(int(left * rng.uniform(0.15, 0.5)), 200_000)
            c_start, c_end = cursor, min(cursor + c_dur, end_ns)
            cursor = c_end + int(rng.uniform(0.0, 0.05) * dur)
            if cursor >= end_ns:
                cursor = start_ns + dur // 10
            fail_here = failing and i == 1
            h_method, h_route = rng.choice(HANDLERS[callee])
            h_path = h_route.replace("{id}", str(item)).replace("{user_id}", str(user))
            client_id = self._id(8)
            code = 500 if fail_here else 200
            spans.append(
                (tid, client_id, root_id, h_method, KIND_CLIENT, "frontend", pod, "client",
                 c_start, c_end, 2 if fail_here else 0,
                 [("http.request.method", h_method),
                  ("url.full", f"http://{callee}:8080{h_path}"),
                  ("server.address", callee),
                  ("server.port", 8080),
                  ("http.response.status_code", code),
                  ("network.protocol.version", "1.1"),
                  ("peer.service", callee),
                  ("http.request.resend_count", 0)],
                 None)
            )  # fmt: skip
            server_id = self._id(8)
            s_pod = rng.randrange(PODS_PER_SERVICE)
            s_start = c_start + min(300_000, (c_end - c_start) // 10)
            s_end = max(c_end - min(200_000, (c_end - c_start) // 10), s_start + 1)
            spans.append(
                (tid, server_id, client_id, f"{h_method} {h_route}", KIND_SERVER, callee, s_pod,
                 "server", s_start, s_end, 2 if fail_here else 0,
                 [("http.request.method", h_method),
                  ("http.route", h_route),
                  ("url.path", h_path),
                  ("url.scheme", "http"),
                  ("http.response.status_code", code),
                  ("server.address", callee),
                  ("client.address", f"10.1.{rng.randrange(256)}.{rng.randrange(256)}"),
                  ("user_agent.original", "python-httpx/0.27.0")],
                 ("ConnectionError", "upstream reset the connection") if fail_here else None)
            )  # fmt: skip
            # What the handler does: 1-4 steps, one after another.
            steps = rng.randint(1, 4)
            t = s_start
            step_len = max((s_end - s_start) // (steps + 1), 1000)
            for _ in range(steps):
                if len(spans) >= n_target:
                    break
                a, b = t, min(t + int(step_len * rng.uniform(0.3, 1.0)) + 1000, s_end)
                t = b + step_len // 8
                spans.append(self._step(tid, server_id, callee, s_pod, a, b, item, user))
        return spans[:n_target]

    def _step(
        self,
        tid: bytes,
        parent: bytes,
        service: str,
        pod: int,
        a: int,
        b: int,
        item: int,
        user: int,
    ) -> SpanRec:
        rng = self.rng
        r = rng.random()
        sid = self._id(8)
        if r < 0.5:
            table = rng.choice(TABLES[service])
            op = rng.choice(("SELECT", "SELECT", "SELECT", "INSERT", "UPDATE"))
            stmt = {
                "SELECT": f"SELECT * FROM {table} WHERE id = $1",
                "INSERT": f"INSERT INTO {table} VALUES ($1, $2, $3)",
                "UPDATE": f"UPDATE {table} SET updated_at = now() WHERE id = $1",
            }[op]
            attrs = [
                ("db.system", "postgresql"),
                ("db.name", service),
                ("db.statement", stmt),
                ("db.operation", op),
                ("db.sql.table", table),
                ("server.address", f"{service}-db"),
                ("server.port", 5432),
                ("db.user", f"{service}_app"),
            ]
            return (tid, sid, parent, f"{op} {table}", KIND_CLIENT, service, pod, "db", a, b, 0,
                    attrs, None)  # fmt: skip
        if r < 0.75:
            op = rng.choice(("GET", "GET", "SET", "HGETALL", "EXPIRE"))
            key = f"{service}:{rng.choice(('item', 'user', 'session'))}"
            attrs = [
                ("db.system", "redis"),
                ("db.statement", f"{op} {key}:?"),
                ("db.operation", op),
                ("db.redis.database_index", 0),
                ("server.address", "redis"),
                ("server.port", 6379),
                ("network.transport", "tcp"),
                ("app.cache.hit", rng.random() < 0.8),
            ]
            return (tid, sid, parent, op, KIND_CLIENT, service, pod, "cache", a, b, 0, attrs, None)
        func, namespace = rng.choice(INTERNAL)
        attrs = [
            ("code.function", func),
            ("code.namespace", namespace),
            ("code.filepath", f"/app/{namespace.replace('.', '/')}.py"),
            ("code.lineno", rng.randint(10, 900)),
            ("thread.name", "MainThread"),
            ("app.items", rng.randint(0, 50)),
            ("app.item_id", item),
            ("app.region", rng.choice(("eu-west-1", "us-east-1"))),
        ]
        return (tid, sid, parent, func, KIND_INTERNAL, service, pod, "internal", a, b, 0, attrs,
                None)  # fmt: skip


_USER_AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 Version/17.5 Safari/605",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/126.0 Safari/537.36",
    "okhttp/4.12.0",
]


def _any_value(av, value: object) -> None:  # type: ignore[no-untyped-def]
    if isinstance(value, bool):
        av.bool_value = value
    elif isinstance(value, int):
        av.int_value = value
    elif isinstance(value, float):
        av.double_value = value
    else:
        av.string_value = str(value)


class BodyBuilder:
    """``ExportTraceServiceRequest`` bodies from span records, one ``ResourceSpans`` per
    service pod and one ``ScopeSpans`` per instrumentation library, as an SDK's batch span
    processor (or a collector) would send them."""

    def __init__(self) -> None:
        from opentelemetry.proto.resource.v1.resource_pb2 import Resource

        self.resources = {}
        for service in SERVICES:
            for pod in range(PODS_PER_SERVICE):
                res = Resource()
                for k, v in [
                    ("service.name", service),
                    ("service.namespace", "shop"),
                    ("service.version", "1.42.0"),
                    ("deployment.environment", "production"),
                    ("host.name", f"node-{(SERVICES.index(service) * 3 + pod) % 5}"),
                    ("k8s.namespace.name", "shop"),
                    ("k8s.pod.name", f"{service}-7d9f8b-{pod}"),
                    ("telemetry.sdk.language", "python"),
                    ("telemetry.sdk.name", "opentelemetry"),
                    ("telemetry.sdk.version", "1.27.0"),
                ]:
                    _any_value(res.attributes.add(key=k).value, v)
                self.resources[(service, pod)] = res

    def build(self, spans: Sequence[SpanRec]) -> bytes:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        req = ExportTraceServiceRequest()
        by_res: Dict[Tuple[str, int], object] = {}
        by_scope: Dict[Tuple[str, int, str], object] = {}
        for tid, sid, parent, name, kind, service, pod, scope, a, b, code, attrs, err in spans:
            key = (service, pod, scope)
            ss = by_scope.get(key)
            if ss is None:
                rs = by_res.get((service, pod))
                if rs is None:
                    rs = by_res[(service, pod)] = req.resource_spans.add(
                        schema_url="https://opentelemetry.io/schemas/1.24.0"
                    )
                    rs.resource.CopyFrom(self.resources[(service, pod)])  # type: ignore[attr-defined]
                ss = by_scope[key] = rs.scope_spans.add()  # type: ignore[attr-defined]
                ss.scope.name, ss.scope.version = SCOPES[scope]  # type: ignore[attr-defined]
            span = ss.spans.add()  # type: ignore[attr-defined]
            span.trace_id = tid
            span.span_id = sid
            if parent:
                span.parent_span_id = parent
            span.name = name
            span.kind = kind
            span.start_time_unix_nano = a
            span.end_time_unix_nano = b
            for k, v in attrs:
                _any_value(span.attributes.add(key=k).value, v)
            if code:
                span.status.code = code
                span.status.message = "HTTP 500" if err is None else err[1]
            if err is not None:
                ev = span.events.add(name="exception", time_unix_nano=b)
                _any_value(ev.attributes.add(key="exception.type").value, err[0])
                _any_value(ev.attributes.add(key="exception.message").value, err[1])
        return req.SerializeToString()


def generate(
    n_spans: int,
    seed: int,
    start_ns: int,
    end_ns: int,
    on_trace: Optional[Callable[[List[SpanRec]], None]] = None,
) -> List[bytes]:
    """Request bodies of 512 spans: traces with start times spread evenly over
    [start_ns, end_ns), in time order, cut into requests in that order (a trace may straddle
    two requests, as with a batch span processor).  ``on_trace`` sees every trace."""
    gen = TraceGen(seed)
    builder = BodyBuilder()
    n_traces = max(n_spans // 14, 1)  # 14: the mean trace size, to spread the start times
    step = (end_ns - start_ns) / n_traces
    bodies: List[bytes] = []
    pending: List[SpanRec] = []
    total = i = 0
    while total < n_spans:
        t0 = int(start_ns + min(i, n_traces - 1) * step + gen.rng.random() * step)
        i += 1
        spans = gen.trace(t0)[: n_spans - total]
        total += len(spans)
        if on_trace is not None:
            on_trace(spans)
        pending.extend(spans)
        while len(pending) >= SPANS_PER_REQUEST or (pending and total >= n_spans):
            bodies.append(builder.build(pending[:SPANS_PER_REQUEST]))
            del pending[:SPANS_PER_REQUEST]
    return bodies


def reid(body: bytes, key: int) -> bytes:
    """The same spans under other trace and span ids (each id XOR a key derived from ``key``;
    parents stay consistent): a cheap way to many distinct request bodies."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    h = hashlib.blake2b(key.to_bytes(8, "little"), digest_size=24).digest()
    kt, ks = int.from_bytes(h[:16], "big"), int.from_bytes(h[16:], "big")
    req = ExportTraceServiceRequest.FromString(body)
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                s.trace_id = (int.from_bytes(s.trace_id, "big") ^ kt).to_bytes(16, "big")
                s.span_id = (int.from_bytes(s.span_id, "big") ^ ks).to_bytes(8, "big")
                if s.parent_span_id:
                    p = int.from_bytes(s.parent_span_id, "big") ^ ks
                    s.parent_span_id = p.to_bytes(8, "big")
    return req.SerializeToString()


# -- load generator: its own process (python bench/traces.py load SPEC.json) -------------------
#
# OTLP/HTTP: pre-built HTTP/1.1 requests on keep-alive connections (asyncio streams, uvloop when
# present), one request in flight per connection; OTLP/gRPC: grpc.aio calls on one channel (an
# OTLP exporter has one), raw bytes with no serializers.  "duration" mode cycles through the
# requests for warm-up + duration seconds, printing measure-start / measure-end around the
# measured window; "once" mode sends every request exactly once.  Every acknowledged request
# is counted, in or out of the window, so that the parent can check them all on disk.


async def _load(spec: Dict[str, object]) -> Dict[str, object]:
    with open(str(spec["requests"]), "rb") as f:
        requests: List[Tuple[bytes, int]] = pickle.load(f)  # (request, spans or samples)
    protocol = spec["protocol"]
    once = spec.get("mode") == "once"
    loop = asyncio.get_running_loop()
    warmup = 0.0 if once else float(spec["warmup"])  # type: ignore[arg-type]
    t_measure = loop.time() + warmup
    t_end = t_measure + (1e9 if once else float(spec["duration"]))  # type: ignore[arg-type]
    st = {"ok": 0, "items": 0, "bytes_sent": 0, "errors": 0, "acked": 0, "acked_items": 0}
    st["partial"] = 0
    status: Dict[str, int] = {}
    examples: List[str] = []
    latencies: List[float] = []
    counter = [0]
    n = len(requests)

    def record(t0: float, ok: bool, code: str, answer: bytes, items: int, size: int) -> None:
        t1 = time.perf_counter()
        done = loop.time()
        in_window = t_measure <= done < t_end
        if ok:
            st["acked"] += 1
            st["acked_items"] += items
            if answer:  # an OTLP answer with content is a partial success
                st["partial"] += 1
                if len(examples) < 3:
                    examples.append(f"partial success: {answer[:200]!r}")
            if in_window:
                st["ok"] += 1
                st["items"] += items
                st["bytes_sent"] += size
                latencies.append(t1 - t0)
        else:
            status[code] = status.get(code, 0) + 1
            if in_window:
                st["errors"] += 1
            if len(examples) < 3:
                examples.append(f"{code}: {answer[:300]!r}")

    def next_request() -> Optional[Tuple[bytes, int]]:
        if loop.time() >= t_end:
            return None
        i = counter[0]
        if once and i >= n:
            return None
        counter[0] = i + 1
        return requests[i % n]

    if protocol == "grpc":
        import grpc

        channel = grpc.aio.insecure_channel(
            str(spec["target"]),
            options=[
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ],
        )
        export = channel.unary_unary(TRACE_SERVICE_EXPORT)  # bytes in, bytes out
        await channel.channel_ready()

        async def worker() -> None:
            while True:
                req = next_request()
                if req is None:
                    return
                body, items = req
                t0 = time.perf_counter()
                try:
                    answer = await export(body, timeout=120)
                    record(t0, True, "OK", answer, items, len(body))
                except grpc.aio.AioRpcError as exc:
                    record(t0, False, exc.code().name, str(exc.details()).encode(), items, 0)

    else:
        host, port = str(spec["target"]).rsplit(":", 1)

        async def worker() -> None:
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                while True:
                    req = next_request()
                    if req is None:
                        return
                    raw, items = req
                    t0 = time.perf_counter()
                    writer.write(raw)
                    code, answer = await loadgen.read_response(reader)
                    record(t0, code == 200, str(code), answer, items, len(raw))
            finally:
                writer.close()

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(worker()) for _ in range(int(spec["concurrency"]))]  # type: ignore[call-overload]
    if not once:
        tasks.append(asyncio.create_task(loadgen.mark_window(loop, t_measure, t_end, st)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    if protocol == "grpc":
        await channel.close()
    out: Dict[str, object] = dict(st)
    out.update(
        wall_s=round(time.perf_counter() - t0, 2),
        status=status,
        error_examples=examples,
        worker_failures=[repr(r) for r in results if isinstance(r, BaseException)][:3],
        latency_ms=loadgen.latency_pcts(latencies),
    )
    return out


def run_load(
    spec: Dict[str, object],
    requests: List[Tuple[bytes, int]],
    workdir: str,
    on_start: Optional[Callable[[], None]] = None,
    on_end: Optional[Callable[[], None]] = None,
) -> Dict[str, object]:
    """Runs the load generator process on ``requests``; ``on_start``/``on_end`` are called at
    the edges of the measured window."""
    req_file = os.path.join(workdir, "requests.pickle")
    with open(req_file, "wb") as f:
        pickle.dump(requests, f, protocol=pickle.HIGHEST_PROTOCOL)
    spec = dict(spec, requests=req_file)
    spec_file = os.path.join(workdir, "load.json")
    with open(spec_file, "w") as f:
        json.dump(spec, f)
    try:
        return loadgen.follow(
            [sys.executable, os.path.abspath(__file__), "load", spec_file],
            on_start,
            on_end,
            cwd=common.BENCH_DIR,
        )
    finally:
        os.unlink(req_file)


# -- 1. ingest -------------------------------------------------------------------------------


def ingest_pool(n_bodies: int, distinct: int, seed: int = 11) -> List[bytes]:
    """``n_bodies`` distinct request bodies: ``distinct`` generated ones (the last hour before
    now), the rest copies of them under other ids (:func:`reid`)."""
    end = time.time_ns() // SEC * SEC
    base = generate(distinct * SPANS_PER_REQUEST, seed, end - 3600 * SEC, end)
    out = list(base)
    key = 0
    while len(out) < n_bodies:
        key += 1
        out.append(reid(base[len(out) % len(base)], key))
    return out


def _count_spans(data_dir: str) -> Dict[str, object]:
    """What is on disk after the server shut down (and committed)."""
    (rows, distinct, traces_n), (groups,), (tags,) = common.stored_rows(
        data_dir,
        "SELECT count(*), count(DISTINCT span_id), count(DISTINCT trace_id) FROM spans",
        "SELECT count(*) FROM span_groups",
        "SELECT count(*) FROM span_tags",
    )
    return {
        "span_rows": rows,
        "distinct_span_ids": distinct,
        "traces": traces_n,
        "span_groups": groups,
        "span_tags": tags,
        "data_dir_mib": common.dir_mib(data_dir),
    }


def run_ingest(
    protocol: str,
    bodies: List[bytes],
    concurrency: int,
    warmup: float,
    duration: float,
    workdir: str,
) -> Dict[str, object]:
    data_dir = tempfile.mkdtemp(prefix=f"traces-ingest-{protocol}-", dir=workdir)
    server = common.Server(data_dir).start()
    result: Dict[str, object] = {
        "protocol": protocol,
        "server_startup_s": round(server.startup_s, 2),
    }
    try:
        if protocol == "http":
            assert server.otlp_http is not None, "the server has no OTLP/HTTP receiver"
            host, port = server.otlp_http
            target = f"{host}:{port}"
            requests = [
                (
                    loadgen.post(host, port, "/v1/traces", b, "application/x-protobuf"),
                    SPANS_PER_REQUEST,
                )
                for b in bodies
            ]
        else:
            assert server.otlp_grpc is not None, "the server has no OTLP/gRPC receiver"
            target = f"{server.otlp_grpc[0]}:{server.otlp_grpc[1]}"
            requests = [(b, SPANS_PER_REQUEST) for b in bodies]
        memory = common.LoadMemory(server)
        cpu = common.CpuWindow(server.pid)
        window: Dict[str, object] = {}
        load = run_load(
            {
                "protocol": protocol,
                "target": target,
                "concurrency": concurrency,
                "warmup": warmup,
                "duration": duration,
            },
            requests,
            workdir,
            on_start=cpu.start,
            on_end=lambda: window.update(cpu.stop()),
        )
        result.update(memory.stop_server())
        result.update(
            concurrency=concurrency,
            warmup_s=warmup,
            duration_s=duration,
            distinct_bodies=len(bodies),
            body_bytes_mean=int(np.mean([len(b) for b in bodies])),
            requests_per_s=round(load["ok"] / duration, 1),  # type: ignore[operator]
            spans_per_s=round(load["items"] / duration),  # type: ignore[operator]
            mb_per_s_in=round(load["bytes_sent"] / duration / 1e6, 2),  # type: ignore[operator]
            errors=load["errors"],
            partial_successes=load["partial"],
            status_counts=load["status"],
            error_examples=load["error_examples"],
            latency_ms=load["latency_ms"],
            loadgen_cpu_s=load.get("loadgen_cpu_s"),
            acked_requests=load["acked"],
            acked_spans=load["acked_items"],
            server_cpu=window,
            server_stderr=server.stderr_tail()[-2000:],
        )
        stored = _count_spans(data_dir)
        stored["all_acked_spans_stored"] = stored["span_rows"] >= load["acked_items"]  # type: ignore[operator]
        result["stored"] = stored
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


# -- 2./3. the data set: 1 M spans and CPU profiles labelled with their span ids --------------

FULL = {
    "spans": 1_000_000,
    "hours": 24,
    "end_s": END_S,
    "seed": 5,
    # Profiles: each service pod uploads one pprof per window; a SERVER span gets samples
    # with probability 0.7, an internal step 0.8, a SQL query 0.3 (the driver's CPU), 1-3
    # stacks each.
    "profile_window_s": 600,
    "stacks_per_service": 150,
    "frames": 4000,
    "min_depth": 20,
    "max_depth": 34,
    "load_concurrency": 8,
}
QUICK = dict(FULL, spans=100_000)
SAMPLE_PROB = {"server": 0.7, "internal": 0.8, "db": 0.3}


class ProfileGen:
    """CPU profiles (pprof) per service pod and upload window whose samples carry the
    ``span_id`` and ``trace_id`` labels of spans that ran then, as the hotspan agent sends
    them.  Each service has its own stacks (shared prefixes, ``bench/synth.py``); the table of
    functions and locations of all of them is serialized once per service and every upload
    appends its samples and new strings to it (protobuf concatenation is a merge)."""

    def __init__(self, params: Dict[str, int]) -> None:
        from hotspan.formats.proto import profile_pb2

        self.pb = profile_pb2
        rng = np.random.default_rng(params["seed"])
        self.rng = random.Random(params["seed"] + 1)
        frames = synth.frame_universe(rng, params["frames"])
        self.stacks: Dict[str, List[List[int]]] = {}  # service -> location ids, leaf first
        self.header: Dict[str, Tuple[bytes, int]] = {}  # service -> (bytes, strings)
        n = params["stacks_per_service"]
        self.weights = list(synth.zipf_weights(n, s=1.05, offset=3.0))
        for service in SERVICES:
            stacks = synth.grow_stacks(
                rng, n, len(frames), params["min_depth"], params["max_depth"]
            )
            prof = profile_pb2.Profile()
            strings: Dict[str, int] = {"": 0}

            def s(text: str, strings: Dict[str, int] = strings) -> int:
                return strings.setdefault(text, len(strings))

            prof.sample_type.add(type=s("cpu"), unit=s("nanoseconds"))
            prof.period_type.type, prof.period_type.unit = s("cpu"), s("nanoseconds")
            prof.period = synth.PERIOD_NS
            assert (s("span_id"), s("trace_id")) == (3, 4)  # the label keys of every upload
            prof.mapping.add(id=1, filename=s("python"), has_functions=True)
            locs: Dict[int, int] = {}
            funcs: Dict[Tuple[str, str], int] = {}
            out = []
            for st in stacks:
                ids = []
                for f in reversed(st):
                    loc = locs.get(f)
                    if loc is None:
                        name, filename, line = frames[f]
                        fn = funcs.get((name, filename))
                        if fn is None:
                            fn = funcs[(name, filename)] = len(funcs) + 1
                            prof.function.add(
                                id=fn, name=s(name), system_name=s(name), filename=s(filename)
                            )
                        loc = locs[f] = len(locs) + 1
                        prof.location.add(id=loc, mapping_id=1).line.add(function_id=fn, line=line)
                    ids.append(loc)
                out.append(ids)
            prof.string_table.extend(t.encode() for t in strings)
            self.stacks[service] = out
            self.header[service] = (prof.SerializeToString(), len(strings))
        self.samples: Dict[Tuple[str, int, int], list] = {}
        self.window_ns = params["profile_window_s"] * SEC

    def add_trace(self, spans: Sequence[SpanRec]) -> int:
        """Samples for the spans of one trace; returns how many sample rows."""
        rng = self.rng
        n = 0
        for tid, sid, _, _, _, service, pod, scope, a, _, _, _, _ in spans:
            p = SAMPLE_PROB.get(scope, 0.0)
            if p and rng.random() < p:
                key = (service, pod, a // self.window_ns)
                rows = self.samples.setdefault(key, [])
                stacks = rng.choices(range(len(self.weights)), self.weights, k=rng.randint(1, 3))
                for st in stacks:
                    rows.append((st, 1 + int(rng.expovariate(0.5)), sid.hex(), tid.hex()))
                n += len(stacks)
        return n

    def uploads(self, host: str, port: int) -> List[Tuple[bytes, int]]:
        """One ``POST /ingest`` (gzipped pprof) per service pod and window."""
        out = []
        for (service, pod, window), rows in sorted(self.samples.items()):
            header, n_strings = self.header[service]
            loc_ids = self.stacks[service]
            prof = self.pb.Profile()
            prof.time_nanos = window * self.window_ns
            prof.duration_nanos = self.window_ns
            new: Dict[str, int] = {}
            for st, ticks, span_hex, trace_hex in rows:
                sample = prof.sample.add(location_id=loc_ids[st], value=[ticks * synth.PERIOD_NS])
                for key, text in ((3, span_hex), (4, trace_hex)):
                    sample.label.add(key=key, str=new.setdefault(text, n_strings + len(new)))
            prof.string_table.extend(t.encode() for t in new)
            body = gzip.compress(header + prof.SerializeToString(), compresslevel=1)
            from_s = window * self.window_ns // SEC
            until_s = from_s + self.window_ns // SEC
            name = f"{service}{{pod={service}-7d9f8b-{pod},env=production}}"
            request = loadgen.ingest_pprof(host, port, name, from_s, until_s, body, "hotspan")
            out.append((request, len(rows)))
        return out


def data_dir_for(params: Dict[str, int]) -> str:
    """Cache directory, keyed by the parameters, this generator and the server code that
    decides what a stored span or sample looks like (store, span model, OTLP and pprof
    decoding): a change there gets a fresh build."""
    import hotspan

    with open(os.path.abspath(__file__), "rb") as f:
        source = f.read()
    h = hashlib.sha1(json.dumps(params, sort_keys=True).encode())
    h.update(source[source.index(b"# -- synthetic traces") : source.index(b"def reid(")])
    h.update(source[source.index(b"class ProfileGen") : source.index(b"def data_dir_for")])
    pkg = os.path.dirname(os.path.abspath(hotspan.__file__))
    for rel in STORED_FORMAT_SOURCES:
        with contextlib.suppress(OSError), open(os.path.join(pkg, rel), "rb") as f:
            h.update(f.read())
    return os.path.join("/tmp", f"hotspan-bench-traces-{h.hexdigest()[:12]}")


STORED_FORMAT_SOURCES = (
    "store/duckdb.py",
    "model/trace.py",
    "formats/otlp.py",
    "formats/otlp_traces.py",
    "formats/pprof.py",
)


def build(params: Dict[str, int], data_dir: str, log: Callable[[str], None]) -> Dict[str, object]:
    """Generate the traces and their profiles, push them through a real server (OTLP/HTTP,
    then ``/ingest``), record what the queries will look for."""
    t_all = time.perf_counter()
    end_ns = params["end_s"] * SEC
    start_ns = end_ns - params["hours"] * 3600 * SEC
    n_traces_est = max(params["spans"] // 14, 1)
    every = max(n_traces_est // 20, 1)
    profiles = ProfileGen(params)
    targets: Dict[str, object] = {"lookup": []}
    best: List[object] = [-1, None]
    seen = [0]

    def on_trace(spans: List[SpanRec]) -> None:
        i = seen[0]
        seen[0] += 1
        n_rows = profiles.add_trace(spans)
        if i % every == every // 2:
            targets["lookup"].append(spans[0][0].hex())  # type: ignore[union-attr]
        if i == n_traces_est // 2:
            targets["enduser"] = dict(spans[0][11])["enduser.id"]
        # The span-profile target: the last hour's trace with the most profile samples.
        if spans[0][8] >= end_ns - 3600 * SEC and n_rows > best[0]:
            best[0], best[1] = n_rows, spans

    t0 = time.perf_counter()
    bodies = generate(params["spans"], params["seed"], start_ns, end_ns, on_trace)
    timings: Dict[str, object] = {"generate_spans_s": round(time.perf_counter() - t0, 1)}
    timings["traces"] = seen[0]
    timings["request_bodies"] = len(bodies)
    timings["body_bytes_mean"] = int(np.mean([len(b) for b in bodies]))
    spans: List[SpanRec] = best[1]  # type: ignore[assignment]
    callee_servers = [s for s in spans if s[4] == KIND_SERVER and s[2]]
    children = {s[2] for s in spans}
    pick = next((s for s in callee_servers if s[1] in children), callee_servers[0])
    targets["profile"] = {
        "trace_id": spans[0][0].hex(),
        "root_span_id": spans[0][1].hex(),
        "root_service": spans[0][5],
        "span_id": pick[1].hex(),
        "span_service": pick[5],
        "span_name": pick[3],
        "spans": len(spans),
        "sample_rows": best[0],
        "start_ns": min(s[8] for s in spans),
        "end_ns": max(s[9] for s in spans),
    }

    shutil.rmtree(data_dir, ignore_errors=True)
    os.makedirs(data_dir)
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-traces-load-")
    server = common.Server(data_dir).start()
    try:
        assert server.otlp_http is not None, "the server has no OTLP/HTTP receiver"
        host, port = server.otlp_http
        counts = [SPANS_PER_REQUEST] * len(bodies)
        counts[-1] = params["spans"] - SPANS_PER_REQUEST * (len(bodies) - 1)
        requests = [
            (loadgen.post(host, port, "/v1/traces", b, "application/x-protobuf"), c)
            for b, c in zip(bodies, counts)
        ]
        del bodies
        log(f"  traces data: pushing {params['spans']:,} spans over OTLP/HTTP")
        spec = {"protocol": "http", "mode": "once", "concurrency": params["load_concurrency"]}
        load = run_load(dict(spec, target=f"{host}:{port}"), requests, workdir)
        del requests
        if load["errors"] or load["acked_items"] != params["spans"]:
            raise RuntimeError(f"loading the spans failed: {load}")
        timings["load_spans_s"] = load["wall_s"]
        timings["load_spans_per_s"] = round(params["spans"] / load["wall_s"])  # type: ignore[operator]
        timings["load_latency_ms"] = load["latency_ms"]

        t0 = time.perf_counter()
        uploads = profiles.uploads(server.host, server.port)
        timings["generate_profiles_s"] = round(time.perf_counter() - t0, 1)
        timings["profile_uploads"] = len(uploads)
        timings["profile_sample_rows_sent"] = sum(n for _, n in uploads)
        log(f"  traces data: pushing {len(uploads):,} profiles (/ingest)")
        load = run_load(dict(spec, target=f"{server.host}:{server.port}"), uploads, workdir)
        if load["errors"] or load["acked"] != len(uploads):
            raise RuntimeError(f"loading the profiles failed: {load}")
        timings["load_profiles_s"] = load["wall_s"]
        timings["server_peak_rss_mib"] = common.mib(server.memory().get("VmHWM", 0))
    finally:
        timings["server_stop"] = server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    stored = _count_spans(data_dir)
    (stored["sample_rows"], stored["samples_with_span"]), (stored["series"],) = common.stored_rows(
        data_dir,
        "SELECT count(*), count(*) FILTER (WHERE span_id <> 0) FROM samples",
        "SELECT count(*) FROM series",
    )
    if stored["span_rows"] != params["spans"]:
        raise RuntimeError(
            f"{params['spans']:,} spans acknowledged, {stored['span_rows']:,} stored"
        )
    timings["stored"] = stored
    timings["total_build_s"] = round(time.perf_counter() - t_all, 1)
    common.mark_data(data_dir, params, build=timings, targets=targets)
    return {"build": timings, "targets": targets}


def ensure_data(
    params: Dict[str, int], log: Callable[[str], None], rebuild: bool = False
) -> Tuple[str, Dict[str, object], bool]:
    data_dir = data_dir_for(params)
    saved = common.cached_data(data_dir, params, rebuild)
    if saved is not None:
        log(f"  traces data: reusing {data_dir}")
        return data_dir, saved, True
    log(f"  traces data: building {data_dir} ({params['spans']:,} spans)")
    saved = build(params, data_dir, log)
    return data_dir, saved, False


# -- 2./3. queries ---------------------------------------------------------------------------


def _spans_in_traces_json(resource_spans: list) -> int:
    return sum(len(ss.get("spans", [])) for rs in resource_spans for ss in rs.get("scopeSpans", []))


def _check(kind: str, data: bytes) -> Dict[str, object]:
    """A few facts about an answer, to show what was computed (and that it is not empty)."""
    if kind == "trace_json":
        return {"spans": _spans_in_traces_json(json.loads(data)["batches"])}
    if kind == "trace_v2_json":
        return {"spans": _spans_in_traces_json(json.loads(data)["trace"].get("resourceSpans", []))}
    if kind == "trace_proto":
        from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

        td = TracesData.FromString(data)
        return {"spans": sum(len(ss.spans) for rs in td.resource_spans for ss in rs.scope_spans)}
    if kind == "search":
        found = json.loads(data).get("traces", [])
        return {
            "traces": len(found),
            "matched_spans_first": found[0]["spanSet"]["matched"] if found else 0,
        }
    if kind == "tags":
        scopes = json.loads(data)["scopes"]
        return {s["name"]: len(s["tags"]) for s in scopes}
    if kind == "tag_values":
        return {"values": len(json.loads(data)["tagValues"])}
    if kind == "flamegraph":
        doc = json.loads(data)
        fg = doc["flamegraph"]
        out = {
            "total": int(fg.get("total", 0)),
            "names": len(fg.get("names", [])),
            "nodes": sum(len(lv.get("values", [])) // 4 for lv in fg.get("levels", [])),
        }
        if doc.get("spans"):
            out["span_ids"] = len(doc["spans"])
        return out
    if kind == "trace_spans":
        doc = json.loads(data)
        return {
            "spans": len(doc["spans"]),
            "spans_with_samples": sum(1 for s in doc["spans"] if s["self"]),
            "total": doc["total"],
        }
    raise ValueError(kind)


def _queries(params: Dict[str, int], targets: Dict[str, object]) -> List[Dict[str, object]]:
    end_s = params["end_s"]
    h1 = {"start": end_s - 3600, "end": end_s}
    h24 = {"start": end_s - params["hours"] * 3600, "end": end_s}
    lookup: List[str] = targets["lookup"]  # type: ignore[assignment]
    prof: Dict[str, object] = targets["profile"]  # type: ignore[assignment]
    tid = prof["trace_id"]
    proto = {"Accept": "application/protobuf"}

    def search(label: str, key: str, rng: Dict[str, int], **extra: object) -> Dict[str, object]:
        query = urlencode({**extra, **rng, "limit": 20})
        return {"name": label, "key": key, "path": f"/api/search?{query}", "check": "search"}

    def by_id(fmt: str) -> Callable[[int], str]:
        return lambda i: fmt.format(lookup[i % len(lookup)])

    # A span profile as Grafana's traces-to-profiles asks for it: the span's service, the
    # trace's time an hour either side (ms).  With its descendants, every service (``{}``): the
    # spans below a frontend span run in other services.
    def span_profile(span_hex: str, selector: str, descendants: bool) -> bytes:
        return json.dumps(
            {
                "profile_typeID": CPU,
                "label_selector": selector,
                "span_selector": [span_hex],
                "start": str(int(prof["start_ns"]) // MS - 3600 * 1000),  # type: ignore[call-overload]
                "end": str(int(prof["end_ns"]) // MS + 3600 * 1000),  # type: ignore[call-overload]
                "include_descendants": descendants,
            }
        ).encode()

    connect = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    merge_span = "/querier.v1.QuerierService/SelectMergeSpanProfile"
    span_svc = prof["span_service"]
    return [
        {"name": "`GET /api/traces/{id}` JSON", "key": "trace_v1_json",
         "path": by_id("/api/traces/{}"), "check": "trace_json"},
        {"name": "`GET /api/traces/{id}` protobuf", "key": "trace_v1_proto",
         "path": by_id("/api/traces/{}"), "headers": proto, "check": "trace_proto"},
        {"name": "`GET /api/v2/traces/{id}` JSON", "key": "trace_v2_json",
         "path": by_id("/api/v2/traces/{}"), "check": "trace_v2_json"},
        search("search, no condition, last 1 h", "search_1h", h1),
        search("search, no condition, 24 h", "search_24h", h24),
        search("search `tags=service.name=payment`, 24 h", "search_tags_service", h24,
               tags="service.name=payment"),
        search('search `{resource.service.name="checkout" && name="POST /orders"}`, 24 h',
               "search_traceql_service_name", h24,
               q='{resource.service.name="checkout" && name="POST /orders"}'),
        search("search `minDuration=500ms`, 24 h", "search_min_duration", h24,
               minDuration="500ms"),
        # What the UI's trace search asks: the longest traces of a service first.
        search("search `service.name=checkout` `sort=duration` (UI), 24 h",
               "search_sort_duration", h24, tags="service.name=checkout", sort="duration"),
        search(f'search `{{span.enduser.id="{targets["enduser"]}"}}`, 24 h',
               "search_attr_equal", h24, q=f'{{span.enduser.id="{targets["enduser"]}"}}'),
        search("search `{span.http.response.status_code>=500}`, 24 h",
               "search_attr_numeric", h24, q="{span.http.response.status_code>=500}"),
        {"name": "`GET /api/v2/search/tags`", "key": "tags_v2",
         "path": "/api/v2/search/tags", "check": "tags"},
        {"name": "`GET /api/v2/search/tag/resource.service.name/values`",
         "key": "tag_values_service", "path": "/api/v2/search/tag/resource.service.name/values",
         "check": "tag_values"},
        {"name": "`GET /api/v2/search/tag/span.http.route/values`", "key": "tag_values_route",
         "path": "/api/v2/search/tag/span.http.route/values", "check": "tag_values"},
        {"name": f'`SelectMergeSpanProfile`, one span, `{{service_name="{span_svc}"}}`',
         "key": "span_profile_one", "method": "POST", "path": merge_span, "headers": connect,
         "check": "flamegraph", "section": "profiles",
         "body": span_profile(str(prof["span_id"]), f'{{service_name="{span_svc}"}}', False)},
        {"name": "`SelectMergeSpanProfile`, root span, `includeDescendants: true`, `{}`",
         "key": "span_profile_descendants", "method": "POST", "path": merge_span,
         "headers": connect, "check": "flamegraph", "section": "profiles",
         "body": span_profile(str(prof["root_span_id"]), "{}", True)},
        {"name": "`GET /api/traces/{id}/profile` (whole trace)", "key": "trace_profile",
         "path": f"/api/traces/{tid}/profile", "check": "flamegraph", "section": "profiles"},
        {"name": "`GET /api/traces/{id}/profile?spanID=..&descendants=true`",
         "key": "trace_profile_span", "check": "flamegraph", "section": "profiles",
         "path": f"/api/traces/{tid}/profile?spanID={prof['span_id']}&descendants=true"},
        {"name": "`GET /api/traces/{id}/spans`", "key": "trace_spans", "check": "trace_spans",
         "path": f"/api/traces/{tid}/spans", "section": "profiles"},
    ]  # fmt: skip


def run_queries(
    params: Dict[str, int],
    data_dir: str,
    targets: Dict[str, object],
    runs: int,
    warmups: int,
    log: Callable[[str], None],
) -> Dict[str, object]:
    results: Dict[str, object] = {}
    with common.measured_server(data_dir) as (server, out):
        client = common.Client(server.url)
        for q in _queries(params, targets):

            def request(i: int, q: Dict[str, object] = q) -> bytes:
                path = q["path"](i) if callable(q["path"]) else q["path"]
                return client.fetch(
                    str(q["name"]),
                    str(q.get("method", "GET")),
                    str(path),
                    dict(q.get("headers", {})),  # type: ignore[call-overload]
                    q.get("body"),  # type: ignore[arg-type]
                )

            data, first, times = common.repeat_timed(request, warmups, runs)
            info = _check(str(q["check"]), data)
            summary = common.latency_summary(times)
            results[str(q["key"])] = {
                "name": q["name"],
                "section": q.get("section", "tempo"),
                **summary,
                "first_ms": round(first * 1000, 2),
                "response_bytes": len(data),
                "result": info,
            }
            log(
                f"  {q['name']}: median {summary['median_ms']} ms, p90 {summary['p90_ms']} ms "
                f"(first {round(first * 1000, 1)} ms) {info}"
            )
    out["queries"] = results
    return out


# -- where the search time goes (in-process, on the same data) ------------------------------


_timed = common.first_and_median


def breakdown(
    params: Dict[str, int], data_dir: str, targets: Dict[str, object], repeat: int
) -> Dict[str, object]:
    """The searches again, without HTTP: ``DuckDBStore.find_traces`` as a whole, and its SQL
    statement cut after ``matched`` (the spans that meet the conditions) and after ``found``
    (the 20 newest of their traces, with each trace's aggregates; with a trace-wide condition,
    every matching trace is aggregated first); plus ``DuckDBStore.trace`` and the JSON rendering
    of a trace.  Internal APIs: a failure here keeps the HTTP numbers."""
    from hotspan.formats.otlp import encode_json
    from hotspan.formats.otlp_traces import traces_data
    from hotspan.model.trace import TraceQuery
    from hotspan.query.traceql import legacy_query, parse_duration, parse_logfmt, parse_traceql
    from hotspan.store.duckdb import DuckDBStore
    from hotspan.store.search_sql import DUCKDB, search_sql

    end = params["end_s"] * SEC
    h24 = end - params["hours"] * 3600 * SEC

    def traceql(text: str, start: int = h24) -> TraceQuery:
        spansets, conds = parse_traceql(text)
        return TraceQuery(start, end, spansets, conds, 20, 3)

    searches = {
        "search_1h": TraceQuery(end - 3600 * SEC, end, (), (), 20, 3),
        "search_24h": TraceQuery(h24, end, (), (), 20, 3),
        "search_tags_service": legacy_query(
            parse_logfmt("service.name=payment"), h24, end, None, None, 20
        ),
        "search_traceql_service_name": traceql(
            '{resource.service.name="checkout" && name="POST /orders"}'
        ),
        "search_min_duration": legacy_query([], h24, end, parse_duration("500ms"), None, 20),
        "search_attr_equal": traceql(f'{{span.enduser.id="{targets["enduser"]}"}}'),
        "search_attr_numeric": traceql("{span.http.response.status_code>=500}"),
    }
    store = DuckDBStore(data_dir)
    ms = lambda s: round(s * 1000, 2)  # noqa: E731
    out: Dict[str, object] = {"repeat": repeat}
    try:
        con = store._cursor()  # noqa: SLF001
        tenant = "anonymous"
        tid = store._tenant_ids.get(tenant, -1)  # noqa: SLF001
        rows = {}
        for key, query in searches.items():
            sql, args = search_sql(DUCKDB, tid, query)
            step: Dict[str, object] = {}
            _, f, m = _timed(lambda: store.find_traces(tenant, query), repeat)
            step["find_traces"] = {"first_ms": ms(f), "median_ms": ms(m)}
            # The statement cut after a CTE: count what it holds.
            for cte, nxt in (("matched", "), found AS"), ("found", "), shown AS")):
                if nxt not in sql:
                    continue
                head = sql[: sql.index(nxt)] + ")"
                # min() of every column, so that all of them are computed, as the full
                # statement computes them.
                cut = f"{head} SELECT count(*), min(COLUMNS(*)) FROM {cte}"
                # DuckDB refuses a parameter the statement does not use.
                used = set(re.findall(r"\$(\w+)", head))
                cut_args = {k: v for k, v in args.items() if k in used}
                row, f, m = _timed(lambda: con.execute(cut, cut_args).fetchone(), repeat)
                count = row[0]  # type: ignore[index]
                step[f"sql up to `{cte}`"] = {"first_ms": ms(f), "median_ms": ms(m), "rows": count}
            rows[key] = step
        out["searches"] = rows
        lookup: List[str] = targets["lookup"]  # type: ignore[assignment]
        i = [0]

        def one_trace() -> object:
            i[0] += 1
            return store.trace(tenant, lookup[i[0] % len(lookup)])

        spans, f, m = _timed(one_trace, repeat)
        trace = {"store.trace (SQL + rows)": {"first_ms": ms(f), "median_ms": ms(m)}}
        data, f, m = _timed(lambda: traces_data(spans), repeat)  # type: ignore[arg-type]
        trace["traces_data (OTLP message)"] = {"first_ms": ms(f), "median_ms": ms(m)}
        _, f, m = _timed(lambda: json.dumps({"batches": encode_json(data)}), repeat)  # type: ignore[arg-type]
        trace["encode_json + json.dumps"] = {"first_ms": ms(f), "median_ms": ms(m)}
        _, f, m = _timed(lambda: data.SerializeToString(), repeat)  # type: ignore[attr-defined]
        trace["SerializeToString"] = {"first_ms": ms(f), "median_ms": ms(m)}
        out["trace"] = trace
        out["spans_table_rows"] = con.execute("SELECT count(*) FROM spans").fetchone()[0]
        out["spans_row_groups"] = con.execute(
            "SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('spans')"
        ).fetchone()[0]
    finally:
        store.close()
    return out


# -- the whole benchmark ---------------------------------------------------------------------


def run(
    quick: bool = False,
    log: Callable[[str], None] = print,
    rebuild: bool = False,
    concurrency: int = 8,
) -> Dict[str, object]:
    params = QUICK if quick else FULL
    warmup, duration = (1.0, 3.0) if quick else (2.0, 15.0)
    n_bodies, distinct = (120, 30) if quick else (1200, 100)
    runs, warmups = (5, 1) if quick else (15, 2)
    out: Dict[str, object] = {"params": params, "stages_s": {}}
    stages: Dict[str, float] = out["stages_s"]  # type: ignore[assignment]

    t0 = time.perf_counter()
    log(f"  building {n_bodies} distinct OTLP requests of {SPANS_PER_REQUEST} spans")
    bodies = ingest_pool(n_bodies, distinct)
    stages["ingest_requests_build"] = round(time.perf_counter() - t0, 1)
    workdir = tempfile.mkdtemp(prefix="hotspan-bench-traces-")
    runs_out = []
    try:
        for protocol in ("http", "grpc"):
            t0 = time.perf_counter()
            log(f"  ingest over {_PROTOCOL[protocol]}: {concurrency} clients, {duration} s")
            r = run_ingest(protocol, bodies, concurrency, warmup, duration, workdir)
            stages[f"ingest_{protocol}"] = round(time.perf_counter() - t0, 1)
            log(
                f"    {r['spans_per_s']:,} spans/s, {r['requests_per_s']} requests/s, "
                f"p50 {r['latency_ms']['p50']} ms, p99 {r['latency_ms']['p99']} ms, "  # type: ignore[index]
                f"errors {r['errors']}, peak RSS {r['server_peak_rss_mib']} MiB, "
                f"stored {r['stored']['span_rows']:,} of {r['acked_spans']:,} acknowledged"  # type: ignore[index]
            )
            runs_out.append(r)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    del bodies
    out["ingest"] = {
        "concurrency": concurrency,
        "warmup_s": warmup,
        "duration_s": duration,
        "distinct_requests": n_bodies,
        "runs": runs_out,
    }

    t0 = time.perf_counter()
    data_dir, saved, reused = ensure_data(params, log, rebuild)
    stages["data_set" + ("_reused" if reused else "_built")] = round(time.perf_counter() - t0, 1)
    out.update(data_dir=data_dir, data_reused=reused, build=saved["build"])
    out["targets"] = saved["targets"]
    t0 = time.perf_counter()
    out["queries"] = run_queries(params, data_dir, saved["targets"], runs, warmups, log)  # type: ignore[arg-type]
    out["runs"], out["warmups"] = runs, warmups
    stages["queries"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    log("  search breakdown (in-process)")
    try:
        out["breakdown"] = breakdown(params, data_dir, saved["targets"], 3 if quick else 5)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - internal APIs move; keep the HTTP numbers
        out["breakdown"] = {"error": repr(exc)}
    stages["breakdown"] = round(time.perf_counter() - t0, 1)
    return out


_PROTOCOL = {"http": "OTLP/HTTP", "grpc": "OTLP/gRPC"}


def markdown(result: Dict[str, object], command: str, m: Dict[str, object], wall: float) -> str:
    lines: List[str] = []
    add = lines.append
    quick = result["params"] is QUICK or result["params"] == QUICK
    lines += common.head(
        f"hotspan traces benchmark{' (quick)' if quick else ''}",
        command,
        wall,
        common.machine_text(m, note="The load generator and the server share these CPUs."),
    )
    ing: Dict[str, object] = result["ingest"]  # type: ignore[assignment]
    runs: List[Dict[str, object]] = ing["runs"]  # type: ignore[assignment]
    add("")
    add("## Ingest")
    add("")
    add(
        f"`ExportTraceServiceRequest` bodies of {SPANS_PER_REQUEST} spans (~"
        f"{_fmt(runs[0]['body_bytes_mean'])} bytes, protobuf, not compressed): traces of 8-20 "
        f"spans over {len(SERVICES)} services x {PODS_PER_SERVICE} pods (HTTP server and client "
        "spans, SQL and Redis calls, internal steps), 8-9 attributes per span, 10 per resource; "
        f"{ing['distinct_requests']} distinct requests built before timing. "
        f"{ing['concurrency']} concurrent clients, one request in flight each, from a separate "
        f"process; {ing['warmup_s']} s warm-up, {ing['duration_s']} s measured; each protocol "
        "against a fresh server and data directory. OTLP/HTTP: `POST /v1/traces` "
        "(`application/x-protobuf`) on keep-alive connections to the OTLP/HTTP port; OTLP/gRPC: "
        "`TraceService/Export` on one channel (grpc.aio)."
    )
    add("")
    add(
        "| protocol | spans/s | requests/s | p50 ms | p99 ms | errors | server CPU/wall "
        "| server peak RSS | stored / acknowledged spans |"
    )
    add("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in runs:
        lat: Dict[str, float] = r["latency_ms"]  # type: ignore[assignment]
        st: Dict[str, object] = r["stored"]  # type: ignore[assignment]
        cpu: Dict[str, object] = r["server_cpu"]  # type: ignore[assignment]
        ok = "all stored" if st["all_acked_spans_stored"] else "**SPANS MISSING**"
        add(
            f"| {_PROTOCOL[str(r['protocol'])]} | {_fmt(r['spans_per_s'])} | "
            f"{r['requests_per_s']} | {lat['p50']} | {lat['p99']} | {r['errors']} | "
            f"{cpu.get('cpu_per_wall')} | {r['server_peak_rss_mib']} MiB | "
            f"{_fmt(st['span_rows'])} / {_fmt(r['acked_spans'])}: {ok} |"
        )
    add("")
    add(
        "Acknowledged = every request answered 200 / OK, warm-up and the requests still in "
        "flight at the end included; stored = rows in `spans` counted with DuckDB after a "
        "graceful shutdown. Server CPU from /proc over exactly the measured window "
        "(`main thread` runs the HTTP event loop; the gRPC handlers and the writer are other "
        "threads):"
    )
    for r in runs:
        cpu = r["server_cpu"]  # type: ignore[assignment]
        add(
            f"- {_PROTOCOL[str(r['protocol'])]}: main thread {cpu.get('main_thread_cpu_s')} s, "
            f"other threads {cpu.get('other_threads_cpu_s')} s (busiest "
            f"{cpu.get('busiest_other_thread_cpu_s')} s) over {cpu.get('wall_s')} s; "
            f"{r['mb_per_s_in']} MB/s in; partial successes {r['partial_successes']}; "
            f"load generator CPU {r['loadgen_cpu_s']} s."
        )
    p: Dict[str, int] = result["params"]  # type: ignore[assignment]
    b: Dict[str, object] = result["build"]  # type: ignore[assignment]
    st = b["stored"]  # type: ignore[assignment]
    add("")
    add("## Data set")
    add("")
    add(
        f"{_fmt(p['spans'])} spans in {_fmt(b['traces'])} traces over {p['hours']} h "
        f"(start times evenly spread), pushed as {_fmt(b['request_bodies'])} OTLP/HTTP requests "
        f"of {SPANS_PER_REQUEST} spans ({p['load_concurrency']} clients): "
        f"{_fmt(b['load_spans_per_s'])} spans/s into the growing store, {b['load_spans_s']} s; "
        f"then {_fmt(b['profile_uploads'])} CPU profiles (`POST /ingest`, gzipped pprof, one per "
        f"service pod and {p['profile_window_s'] // 60}-minute window) with "
        f"{_fmt(st['sample_rows'])} sample rows, each labelled with the `span_id` and "  # type: ignore[index]
        f"`trace_id` of a stored span (a SERVER span has samples with probability 0.7, an "
        f"internal step 0.8, a SQL query 0.3; 1-3 stacks each, from {p['stacks_per_service']} "
        f"stacks per service). On disk: {st['data_dir_mib']} MiB, {_fmt(st['span_tags'])} tag "  # type: ignore[index]
        f"values, {st['span_groups']} resource/scope groups. "  # type: ignore[index]
        + (
            f"Reused from `{result['data_dir']}` (built in {b['total_build_s']} s)."
            if result["data_reused"]
            else f"Built in this run in {b['total_build_s']} s, cached in `{result['data_dir']}`."
        )
    )
    q: Dict[str, object] = result["queries"]  # type: ignore[assignment]
    tg: Dict[str, object] = result["targets"]["profile"]  # type: ignore[index]
    add("")
    add("## Queries")
    add("")
    add(
        f"Over HTTP on one keep-alive connection, {result['runs']} timed runs after "
        f'{result["warmups"]} warm-up(s) (the first reported as "first"; the server '
        f"was just started). Trace by id: a different one of {len(result['targets']['lookup'])} "  # type: ignore[index]
        "traces spread over the 24 h each run. Searches with `limit=20` (the default 3 spans "
        f"per trace). Server started in {q['server_startup_s']} s with "
        f"{q['server_rss_after_start_mib']} MiB RSS; peak RSS {q.get('server_peak_rss_mib')} MiB."
    )
    sections = [
        ("tempo", "Tempo API"),
        (
            "profiles",
            f"Span profiles: trace `{tg['trace_id']}` ({tg['spans']} spans, "
            f"{tg['sample_rows']} sample rows; the last hour's trace with the most), its root "
            f"span and its {tg['span_service']} span `{tg['span_name']}`; the time range is the "
            "trace's, an hour either side.",
        ),
    ]
    queries: Dict[str, Dict[str, object]] = q["queries"]  # type: ignore[assignment]
    for section, title in sections:
        add("")
        add(title)
        add("")
        add("| query | median ms | p90 ms | first ms | response bytes | result |")
        add("|---|---:|---:|---:|---:|---|")
        for r in queries.values():
            if r["section"] != section:
                continue
            res = ", ".join(f"{k} {_fmt(v)}" for k, v in r["result"].items())  # type: ignore[attr-defined]
            add(
                f"| {r['name']} | {r['median_ms']} | {r['p90_ms']} | {r['first_ms']} | "
                f"{_fmt(r['response_bytes'])} | {res} |"
            )
    bd: Dict[str, object] = result["breakdown"]  # type: ignore[assignment]
    add("")
    add("## Where the search time goes (in-process)")
    add("")
    if "error" in bd:
        add(f"In-process breakdown failed: `{bd['error']}`")
    else:
        add(
            f"The same searches through `DuckDBStore.find_traces` without HTTP, and the search "
            f"statement cut after `matched` (the spans meeting the conditions) and after "
            f"`found` (the 20 newest of their traces with their aggregates; with a trace-wide "
            f"condition, every matching trace is aggregated first); median of {bd['repeat']}. "
            f"`spans` has {_fmt(bd['spans_table_rows'])} rows in {bd['spans_row_groups']} row "
            "groups."
        )
        add("")
        add("| search | find_traces ms | SQL up to `matched` ms (rows) | SQL up to `found` ms |")
        add("|---|---:|---:|---:|")
        for key, step in bd["searches"].items():  # type: ignore[attr-defined]
            name = queries.get(key, {}).get("name", key)
            mt = step.get("sql up to `matched`", {})
            fd = step.get("sql up to `found`", {})
            add(
                f"| {name} | {step['find_traces']['median_ms']} | {mt.get('median_ms')} "
                f"({_fmt(mt.get('rows'))}) | {fd.get('median_ms')} |"
            )
        add("")
        add("Trace by id, in-process: " + ", ".join(
            f"{k} {v['median_ms']} ms" for k, v in bd["trace"].items()  # type: ignore[attr-defined]
        ) + ".")  # fmt: skip
    add("")
    add(
        "Stages (s): "
        + ", ".join(f"{k} {v}" for k, v in result["stages_s"].items())  # type: ignore[attr-defined]
        + "."
    )
    errors = [
        f"{name}: {text.strip()[-500:]}"
        for name, text in [(f"ingest {r['protocol']}", r.get("server_stderr", "")) for r in runs]
        + [("queries", q.get("server_stderr", ""))]
        if text and str(text).strip()
    ]
    lines += common.stderr_section(errors)
    add("")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["load"]:
        loadgen.spec_main(_load, sys.argv[2])
    else:
        common.print_json(run(quick="--quick" in sys.argv, log=common.log))
