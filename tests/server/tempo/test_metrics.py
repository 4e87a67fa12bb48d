"""TraceQL metrics (Tempo's ``/api/metrics/query_range`` and ``/api/metrics/query``) against a
real server, with spans sent as real OTLP/HTTP protobuf made by the OpenTelemetry SDK.

Requests are replayed as Grafana's Tempo data source sends them (``pkg/tsdb/tempo``
``createMetricsQuery``: GET, ``q``, ``start``/``end`` in unix seconds, ``step`` and
``exemplars`` when set, ``Accept: application/json``, keys sorted as Go's url.Values encodes
them).  Every expected number is worked out here from the table of spans sent, by the rules
Tempo documents: a span counts in the step its start falls in, steps are right-closed and
stamped with their end, the range is widened to whole steps with one more step before.
"""

from __future__ import annotations

import math
import time
import urllib.parse
from datetime import datetime, timezone
from typing import Dict, Iterator, List, Optional, Tuple

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from hotspan.formats.otlp_traces import to_span_batch
from hotspan.query.traceql import MetricsRequest, parse_query, run_metrics
from hotspan.store import open_store
from hotspan.store.base import Store
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url
from tests.conftest import RunningServer, start_server
from tests.helpers import TLS

SEC = 10**9
MS = 10**6
STEP_S = 60
# Two hours ago, on a minute: the range starts on a step, so the widened range is known.
T0 = (int(time.time()) // 3600 - 2) * 3600
TENANT = "shop"
GRAFANA_HEADERS = {"Accept": "application/json", "User-Agent": "Grafana/12.1.0"}
Sent = Dict[str, ReadableSpan]  # span name -> the span as the SDK made it

# (service, route, status, start offset in seconds, duration in ms)
SPANS: List[Tuple[str, str, str, float, float]] = [
    ("payments", "/charge", "ok", -30, 4),  # before start: in the extra step Tempo adds
    ("checkout", "/pay", "ok", 5, 3),
    ("checkout", "/pay", "error", 10, 12),
    ("payments", "/charge", "ok", 20, 2),
    ("checkout", "/cart", "ok", 30, 100),
    ("checkout", "/cart", "ok", 60, 20),  # exactly on a step: the step it ends
    ("checkout", "/pay", "ok", 70, 5),
    ("payments", "/charge", "ok", 80, 30),
    ("payments", "/charge", "error", 90, 300),
    ("checkout", "/cart", "error", 130, 40),
    ("checkout", "/pay", "ok", 170, 7),
    ("payments", "/charge", "ok", 179, 1),
    ("payments", "/charge", "ok", 200, 9),  # after end: left out
]
START, END = T0, T0 + 180
# The widened range: (T0 - 60, T0 + 180] in four right-closed steps, stamped with their ends.
STAMPS_MS = [(T0 + STEP_S * i) * 1000 for i in range(4)]


def step_of(offset_s: float) -> Optional[int]:
    """The step (index into STAMPS_MS) a span starting at T0 + offset counts in."""
    for i, stamp in enumerate(STAMPS_MS):
        if stamp / 1000 - STEP_S < T0 + offset_s <= stamp / 1000:
            return i
    return None


def log2_bucket_ns(duration_ns: int) -> int:
    bucket = 1
    while bucket < duration_ns:
        bucket *= 2
    return bucket


def tempo_quantile(p: float, buckets: List[Tuple[float, int]]) -> float:
    """Tempo's Log2Quantile, step by step as its documentation describes it."""
    if not buckets:
        return 0.0
    total = sum(c for _, c in buckets)
    wanted = max(math.ceil(p * total), 1)
    consumed, index = 0, 0
    for top, count in buckets:
        if consumed + count > wanted:
            break
        consumed += count
        if consumed == wanted:
            return top
        index = min(index + 1, len(buckets) - 1)
    top, count = buckets[index]
    low = math.log2(buckets[index - 1][0]) if index > 0 else math.log2(top) - 1
    return 2 ** (low + (math.log2(top) - low) * (wanted - consumed) / count)


# -- the server and the spans -----------------------------------------------------------------


def sdk_spans() -> Dict[str, ReadableSpan]:
    """The SPANS table made by the OpenTelemetry SDK, one trace per span: span name -> span."""
    out: Dict[str, ReadableSpan] = {}
    for service in ("checkout", "payments"):
        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource({"service.name": service, "env": "prod"}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        tracer = provider.get_tracer("hotspan.tests")
        for n, (svc, route, status, offset, duration_ms) in enumerate(SPANS):
            if svc != service:
                continue
            start = int((T0 + offset) * SEC)
            span = tracer.start_span(
                f"span{n}",
                kind=SpanKind.SERVER,
                attributes={
                    "http.route": route,
                    "http.status_code": 500 if status == "error" else 200,
                },
                start_time=start,
            )
            if status == "error":
                span.set_status(Status(StatusCode.ERROR))
            span.end(end_time=start + int(duration_ms * MS))
        provider.force_flush()
        out.update({s.name: s for s in memory.get_finished_spans()})
        provider.shutdown()
    return out


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    s = start_server(tmp_path_factory.mktemp("metrics") / "data")
    try:
        yield s
    finally:
        if s.process.poll() is None:
            s.stop()
        if s.process.stdout:
            s.process.stdout.close()


@pytest.fixture(scope="module")
def sent(srv: RunningServer) -> Dict[str, ReadableSpan]:
    spans = sdk_spans()
    body = encode_spans(list(spans.values())).SerializeToString()
    r = httpx.post(
        srv.url + "/v1/traces",
        content=body,
        headers={"Content-Type": "application/x-protobuf", "X-Scope-OrgID": TENANT},
        timeout=30,
        verify=TLS,
    )
    assert r.status_code == 200, r.text
    return spans


def grafana_get(
    srv: RunningServer, path: str, params: Dict[str, str], tenant: str = TENANT
) -> httpx.Response:
    """GET as Grafana's backend builds it: Go's url.Values.Encode (sorted keys, ``+``)."""
    query = urllib.parse.urlencode(sorted(params.items()))
    headers = {**GRAFANA_HEADERS, "X-Scope-OrgID": tenant}
    return httpx.get(f"{srv.url}{path}?{query}", headers=headers, timeout=30, verify=TLS)


def query_range(srv: RunningServer, q: str, **extra: str) -> dict:
    params = {"q": q, "start": str(START), "end": str(END), "step": "1m", "exemplars": "100"}
    r = grafana_get(srv, "/api/metrics/query_range", {**params, **extra})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    return r.json()


# -- reading answers ----------------------------------------------------------------------------


def label_value(value: dict) -> object:
    (kind, v), *rest = value.items()
    assert not rest, value
    if kind == "intValue":
        assert isinstance(v, str), "int64 is a string in protobuf's JSON mapping"
        return int(v)
    return v


def labels_of(series: dict) -> Tuple[Tuple[str, object], ...]:
    return tuple((kv["key"], label_value(kv["value"])) for kv in series["labels"])


def samples_of(series: dict) -> Dict[int, float]:
    """timestamp ms -> value; Tempo's JSON leaves out a value of 0."""
    out = {}
    for sample in series["samples"]:
        assert set(sample) <= {"timestampMs", "value"}, sample
        assert isinstance(sample["timestampMs"], str)
        out[int(sample["timestampMs"])] = sample.get("value", 0)
    return out


def by_labels(body: dict) -> Dict[Tuple[Tuple[str, object], ...], dict]:
    assert set(body) <= {"series", "metrics", "status", "message"}, body.keys()
    out = {}
    for series in body.get("series", []):
        assert set(series) <= {"labels", "samples", "exemplars"}, series.keys()
        out[labels_of(series)] = series
    return out


def counts(key) -> Dict[object, List[int]]:  # type: ignore[no-untyped-def]
    """Spans per step, per key(span row), worked out from the table."""
    out: Dict[object, List[int]] = {}
    for row in SPANS:
        i = step_of(row[3])
        if i is not None:
            out.setdefault(key(row), [0] * len(STAMPS_MS))[i] += 1
    return out


def check_exemplars(series: dict, sent: Sent, fits) -> None:  # type: ignore[no-untyped-def]
    """Exemplars name a sent span of the series, in a step the series has, valued as asked."""
    by_trace = {f"{s.context.trace_id:032x}": s for s in sent.values()}
    samples = samples_of(series)
    for ex in series.get("exemplars", []):
        labels = dict((kv["key"], label_value(kv["value"])) for kv in ex["labels"])
        span = by_trace[labels["trace:id"]]
        assert labels["span:id"] == f"{span.context.span_id:016x}"
        assert int(ex["timestampMs"]) == span.start_time // MS
        stamp = next(t for t in STAMPS_MS if t - STEP_S * 1000 < int(ex["timestampMs"]) <= t)
        assert stamp in samples
        fits(span, ex.get("value", 0), samples[stamp])


# -- the tests ------------------------------------------------------------------------------------


def test_rate_by_service_as_grafana_asks(srv: RunningServer, sent: Sent) -> None:
    body = query_range(srv, "{} | rate() by (resource.service.name)")
    series = by_labels(body)
    expected = counts(lambda row: row[0])
    assert set(series) == {(("resource.service.name", svc),) for svc in expected}
    for svc, per_step in expected.items():
        s = series[(("resource.service.name", svc),)]
        # Every step of a count has a sample, 0 included; rate is per second over the step.
        assert samples_of(s) == {t: c / STEP_S for t, c in zip(STAMPS_MS, per_step)}
        check_exemplars(s, sent, lambda span, value, sample: value == sample)
        assert s["exemplars"], "exemplars were asked for"
    # By hand: checkout started 3 spans in (T0, T0+60] (5 s, 10 s, 30 s) and one at 60 s.
    checkout = samples_of(series[(("resource.service.name", "checkout"),)])
    assert checkout[(T0 + 60) * 1000] == 4 / 60
    payments = samples_of(series[(("resource.service.name", "payments"),)])
    assert payments[T0 * 1000] == 1 / 60  # the span 30 s before start, in the added step
    assert sum(payments.values()) * 60 == pytest.approx(5)  # the one after end is left out
    # Series in Tempo's order: by label value.
    assert [labels_of(s)[0][1] for s in body["series"]] == ["checkout", "payments"]
    assert body["metrics"] == {
        "inspectedTraces": 12,
        "completedJobs": 1,
        "totalJobs": 1,
        "inspectedSpans": "12",
    }
    assert "status" not in body and "message" not in body


def test_count_over_time_by_two_attributes(srv: RunningServer, sent: Sent) -> None:
    body = query_range(srv, "{ } | count_over_time() by (resource.service.name, span.http.route)")
    series = by_labels(body)
    expected = counts(lambda row: (row[0], row[1]))
    assert set(series) == {
        (("resource.service.name", svc), ("span.http.route", route)) for svc, route in expected
    }
    for (svc, route), per_step in expected.items():
        s = series[(("resource.service.name", svc), ("span.http.route", route))]
        assert samples_of(s) == dict(zip(STAMPS_MS, per_step))
        check_exemplars(
            s,
            sent,
            lambda span, value, sample, route=route, svc=svc: (
                span.attributes["http.route"] == route
                and span.resource.attributes["service.name"] == svc
                and value == sample
            ),
        )
    # By hand: checkout /pay at 5 s and 10 s, /cart at 30 s and 60 s; then /pay at 70 s.
    pay = samples_of(series[(("resource.service.name", "checkout"), ("span.http.route", "/pay"))])
    assert list(pay.values()) == [0, 2, 1, 1]


def test_quantile_over_time(srv: RunningServer, sent: Sent) -> None:
    body = query_range(srv, "{} | quantile_over_time(duration, .5, .9, .99)")
    series = by_labels(body)
    assert set(series) == {(("p", 0.5),), (("p", 0.9),), (("p", 0.99),)}
    per_step: List[Dict[int, int]] = [{} for _ in STAMPS_MS]
    for _, _, _, offset, duration_ms in SPANS:
        i = step_of(offset)
        if i is not None:
            bucket = log2_bucket_ns(int(duration_ms * MS))
            per_step[i][bucket] = per_step[i].get(bucket, 0) + 1
    for p in (0.5, 0.9, 0.99):
        got = samples_of(series[(("p", p),)])
        want = [
            tempo_quantile(p, [(b / SEC, c) for b, c in sorted(buckets.items())])
            for buckets in per_step
        ]
        assert list(got) == STAMPS_MS
        assert list(got.values()) == pytest.approx(want, rel=1e-12)
        # Exemplars carry the span's duration in seconds.
        check_exemplars(
            series[(("p", p),)],
            sent,
            lambda span, value, sample: (
                value == pytest.approx((span.end_time - span.start_time) / SEC)
            ),
        )
    # By hand: the first step holds one 4 ms span (bucket 2^22 ns): every quantile is the
    # bucket's top, 4.194304 ms.
    assert samples_of(series[(("p", 0.5),)])[T0 * 1000] == pytest.approx(0.004194304)


def test_histogram_over_time(srv: RunningServer, sent: Sent) -> None:
    body = query_range(srv, "{} | histogram_over_time(duration)")
    series = by_labels(body)
    expected = counts(lambda row: log2_bucket_ns(int(row[4] * MS)) / SEC)
    assert set(series) == {(("__bucket", b),) for b in expected}
    for bucket, per_step in expected.items():
        assert samples_of(series[(("__bucket", bucket),)]) == dict(zip(STAMPS_MS, per_step))
    # Buckets are powers of two nanoseconds, in seconds: 100 ms falls in 2^27 ns.
    assert (("__bucket", 0.134217728),) in series
    for s in body["series"]:
        assert s["labels"][0]["value"].keys() == {"doubleValue"}


def test_value_functions_and_filters(srv: RunningServer, sent: Sent) -> None:
    errors = by_labels(query_range(srv, "{ status = error } | rate()"))
    assert list(errors) == [(("__name__", "rate"),)]
    want = counts(lambda row: row[2])["error"]
    assert list(samples_of(errors[(("__name__", "rate"),)]).values()) == [c / STEP_S for c in want]
    slowest = by_labels(
        query_range(srv, '{ resource.service.name = "payments" } | max_over_time(duration)')
    )
    got = samples_of(slowest[(("__name__", "max_over_time"),)])
    maxima: Dict[int, float] = {}
    for svc, _, _, offset, duration_ms in SPANS:
        i = step_of(offset)
        if svc == "payments" and i is not None:
            maxima[STAMPS_MS[i]] = max(maxima.get(STAMPS_MS[i], 0), duration_ms / 1000)
    # Unlike counts, steps without a span have no sample at all.
    assert got == pytest.approx(maxima)
    avg = by_labels(query_range(srv, "{} | avg_over_time(duration) by (resource.service.name)"))
    checkout = samples_of(avg[(("resource.service.name", "checkout"),)])
    assert checkout[(T0 + 60) * 1000] == pytest.approx((3 + 12 + 100 + 20) / 4 / 1000)


def test_instant_query(srv: RunningServer, sent: Sent) -> None:
    params = {"q": "{} | count_over_time() by (resource.service.name)"}
    r = grafana_get(srv, "/api/metrics/query", {**params, "start": str(START), "end": str(END)})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"series", "metrics"}
    got = {}
    for s in body["series"]:
        assert set(s) == {"labels", "value"}, "QueryInstantResponse's InstantSeries"
        got[labels_of(s)] = s["value"]
    # One closed interval [start, end], not widened: 7 checkout and 4 payments spans.
    want: Dict[Tuple[Tuple[str, object], ...], int] = {}
    for svc, *_, offset, _ in SPANS:
        if START <= T0 + offset <= END:
            key = (("resource.service.name", svc),)
            want[key] = want.get(key, 0) + 1
    assert (
        got
        == want
        == {
            (("resource.service.name", "checkout"),): 7,
            (("resource.service.name", "payments"),): 4,
        }
    )
    rate = grafana_get(
        srv, "/api/metrics/query", {"q": "{} | rate()", "start": str(START), "end": str(END)}
    ).json()
    assert rate["series"] == [
        {"labels": [{"key": "__name__", "value": {"stringValue": "rate"}}], "value": 11 / 180}
    ]


def test_arithmetic_between_queries_as_tempo_3(srv: RunningServer, sent: Sent) -> None:
    """Tempo 3's metrics math: series of one side meet the other's by their labels, or the
    other side's one series without labels; numbers apply to every value; a division by zero
    is no value; filters and topk apply to what is on their left."""
    by_service = "by (resource.service.name)"
    errors = counts(lambda row: (row[0], row[2] == "error"))
    total = counts(lambda row: row[0])
    services = sorted(total)
    # The error ratio of each service, step by step: a step without spans has no value.
    body = query_range(
        srv,
        f"({{ status = error }} | count_over_time() {by_service}) / "
        f"({{ }} | count_over_time() {by_service})",
    )
    series = by_labels(body)
    assert set(series) == {(("resource.service.name", svc),) for svc in services}
    for svc in services:
        bad = errors.get((svc, True), [0] * len(STAMPS_MS))
        want = {t: e / n for t, e, n in zip(STAMPS_MS, bad, total[svc]) if n}
        assert samples_of(series[(("resource.service.name", svc),)]) == pytest.approx(want)
    # Each fragment reads its spans, the counts add up: 3 errors and all 12 in the range.
    assert body["metrics"]["inspectedSpans"] == "15"
    # Without by(): the names combine, a number applies to each value, * before -.
    body = query_range(srv, "({ status = error } | rate()) / ({ } | rate()) * 100 - 1")
    ((labels, only),) = by_labels(body).items()
    assert labels == (("__name__", "(rate / rate)"),)
    all_errors = counts(lambda row: row[2] == "error")
    bad, every = all_errors.get(True, [0] * 4), [sum(x) for x in zip(*total.values())]
    want = {t: e / n * 100 - 1 for t, e, n in zip(STAMPS_MS, bad, every) if n}
    assert samples_of(only) == pytest.approx(want)
    # A series without labels meets every series of the other side: each service's share.
    body = query_range(
        srv, f"({{ }} | count_over_time() {by_service}) / (2 * ({{ }} | count_over_time()))"
    )
    shares = by_labels(body)
    for svc in services:
        got = samples_of(shares[(("resource.service.name", svc),)])
        assert got == pytest.approx(
            {t: c / n / 2 for t, c, n in zip(STAMPS_MS, total[svc], every) if n}
        )
    # A filter after the arithmetic keeps the points that pass; topk the largest series.
    body = query_range(srv, f"(({{ }} | count_over_time() {by_service}) * 2) > 4 | topk(1)")
    kept = {labels: samples_of(s) for labels, s in by_labels(body).items()}
    want_kept: Dict[Tuple[Tuple[str, object], ...], Dict[int, float]] = {}
    for i, stamp in enumerate(STAMPS_MS):
        doubled = {svc: total[svc][i] * 2 for svc in services}
        best = max(services, key=lambda svc: (doubled[svc], -services.index(svc)))
        if doubled[best] > 4:
            want_kept.setdefault((("resource.service.name", best),), {})[stamp] = doubled[best]
    assert kept == want_kept and kept
    # The instant query takes it too.
    r = grafana_get(
        srv,
        "/api/metrics/query",
        {"q": "({} | count_over_time()) / 11", "start": str(START), "end": str(END)},
    )
    assert r.status_code == 200, r.text
    assert r.json()["series"] == [
        {"labels": [{"key": "__name__", "value": {"stringValue": "count_over_time"}}], "value": 1}
    ]


def test_times_as_tempo_takes_them(srv: RunningServer, sent: Sent) -> None:
    """Seconds, nanoseconds, RFC 3339 and fractional seconds give one answer; ``step`` as a
    number of seconds too; without a step Tempo's default (here 15 s for an hour)."""
    q = "{} | count_over_time()"
    base = query_range(srv, q)
    iso = datetime.fromtimestamp(START, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for start, end, step in [
        (str(START * SEC), str(END * SEC), "60"),
        (iso, str(END), "1m0s"),
        (f"{START}.000", f"{END}.000", "60s"),
    ]:
        assert query_range(srv, q, start=start, end=end, step=step)["series"] == base["series"]
    r = grafana_get(
        srv, "/api/metrics/query_range", {"q": q, "start": str(T0 - 1800), "end": str(T0 + 1800)}
    )
    stamps = list(samples_of(r.json()["series"][0]))
    assert {b - a for a, b in zip(stamps, stamps[1:])} == {15_000}


def test_protobuf_when_asked(srv: RunningServer, sent: Sent) -> None:
    """Tempo answers ``Accept: application/protobuf`` with its messages: the same content."""
    from google.protobuf import json_format

    from hotspan.formats.proto import tempo_pb2

    q = "{} | quantile_over_time(duration, .5) by (resource.service.name)"
    params = {"q": q, "start": str(START), "end": str(END), "step": "1m"}
    for path, message in [
        ("/api/metrics/query_range", tempo_pb2.QueryRangeResponse),
        ("/api/metrics/query", tempo_pb2.QueryInstantResponse),
    ]:
        query = urllib.parse.urlencode(sorted(params.items()))
        r = httpx.get(
            f"{srv.url}{path}?{query}",
            headers={"Accept": "application/protobuf", "X-Scope-OrgID": TENANT},
            timeout=30,
            verify=TLS,
        )
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/protobuf"
        got = message.FromString(r.content)
        assert len(got.series) == 2
        as_json = grafana_get(srv, path, params).json()
        assert got == json_format.ParseDict(as_json, message())


def test_empty_and_other_tenants(srv: RunningServer, sent: Sent) -> None:
    body = query_range(srv, '{ name = "nothing-like-it" } | rate()')
    assert body == {"metrics": {"completedJobs": 1, "totalJobs": 1}}
    params = {"q": "{} | rate()", "start": str(START), "end": str(END), "step": "1m"}
    r = grafana_get(srv, "/api/metrics/query_range", params, tenant="another")
    assert r.status_code == 200 and "series" not in r.json()


def test_series_bound_gives_a_partial_answer(srv: RunningServer, sent: Sent) -> None:
    body = query_range(srv, "{} | rate() by (span.http.route)", maxSeries="2")
    assert len(body["series"]) == 2
    assert body["status"] == "PARTIAL"
    assert "maximum series limit of 2" in body["message"]


@pytest.mark.parametrize(
    "params, reason",
    [
        ({"q": "{ status = }"}, "TraceQL"),
        ({"q": "{ status = error }"}, "not a metrics query"),
        ({"q": ""}, "q is required"),
        ({"q": "{} | quantile_over_time(duration, 1.5)"}, "quantile between 0 and 1"),
        ({"q": "{} | rate()", "start": str(END), "end": str(START)}, "end must be greater"),
        ({"q": "{} | rate()", "step": "soon"}, 'cannot parse "soon" to a valid duration'),
        ({"q": "{} | rate()", "step": "1ms"}, "step of 1ms is too small"),
        ({"q": "{} | rate()", "start": "yesterday"}, "could not parse 'start' parameter"),
        ({"q": "{} | rate()", "since": "an hour"}, "could not parse 'since' parameter"),
        ({"q": "{} | compare({status = error}, 1001)"}, "integer between 1 and 1000"),
        # As Tempo: 5 by() labels, 4 where a place of the key is taken (bucket, count).
        ({"q": "{} | rate() by (.a, .b, .c, .d, .e, .f)"}, "group by 6 values (at most 5)"),
        ({"q": "{} | avg_over_time(duration) by (.a, .b, .c, .d, .e)"}, "by 5 values (at most 4)"),
        ({"q": "{} | histogram_over_time(duration) by (.a, .b, .c, .d, .e)"}, "(at most 4)"),
        ({"q": "({} | rate()) * ({} | compare({status = error}))"}, "compare() does not take"),
        ({"q": "({} | rate()) * (3 / (2 - 2 * 1))"}, "division by zero"),
        ({"q": "({} | rate()) * 100000000000000000000"}, "integer out of range"),
        ({"q": "({} | rate()) * 5m"}, "a duration is not a number"),
        ({"q": "({ status = error })"}, "metrics query"),
        ({"q": "(" * 17 + "{} | rate())" + " + ({} | rate()))" * 16}, "more than 16"),
    ],
)
def test_bad_requests(srv: RunningServer, sent: Sent, params: Dict[str, str], reason: str) -> None:
    full = {"start": str(START), "end": str(END), "step": "1m", **params}
    r = grafana_get(srv, "/api/metrics/query_range", full)
    assert r.status_code == 400, r.text
    assert reason in r.text
    assert r.headers["content-type"].startswith("text/plain")


def nested_traces() -> List[ReadableSpan]:
    """Two traces across services: checkout calls payments twice (from T0 + 10 s), and a
    payments root alone at T0 + 70 s."""
    memory = InMemorySpanExporter()
    tracers = {}
    providers = []
    for service in ("checkout", "payments"):
        provider = TracerProvider(resource=Resource({"service.name": service}))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        providers.append(provider)
        tracers[service] = provider.get_tracer("hotspan.tests")
    t = (T0 + 10) * SEC
    root = tracers["checkout"].start_span("POST /pay", start_time=t)
    for n in range(2):
        child = tracers["payments"].start_span(
            f"charge{n}", context=set_span_in_context(root), start_time=t + (n + 1) * MS
        )
        child.end(end_time=t + (n + 2) * MS)
    root.end(end_time=t + 50 * MS)
    lone = tracers["payments"].start_span("refund", start_time=(T0 + 70) * SEC)
    lone.end(end_time=(T0 + 70) * SEC + 5 * MS)
    for provider in providers:
        provider.force_flush()
    spans = list(memory.get_finished_spans())
    for provider in providers:
        provider.shutdown()
    return spans


@pytest.fixture(scope="module")
def nested(srv: RunningServer) -> List[ReadableSpan]:
    """:func:`nested_traces`, sent to the server as tenant ``nested``."""
    spans = nested_traces()
    body = encode_spans(spans).SerializeToString()
    headers = {"Content-Type": "application/x-protobuf", "X-Scope-OrgID": "nested"}
    r = httpx.post(srv.url + "/v1/traces", content=body, headers=headers, timeout=30, verify=TLS)
    assert r.status_code == 200, r.text
    return spans


def test_structural_and_trace_wide_queries(srv: RunningServer, nested: List[ReadableSpan]) -> None:
    """Queries that need whole traces: structural operators, and by() a trace's root."""
    params = {"start": str(START), "end": str(END), "step": "1m"}
    q = '{resource.service.name="checkout"} >> {resource.service.name="payments"}'
    q += " | count_over_time()"
    r = grafana_get(srv, "/api/metrics/query_range", {**params, "q": q}, tenant="nested")
    assert r.status_code == 200, r.text
    (series,) = r.json()["series"]
    # The two calls below checkout, not the lone payments root.
    assert list(samples_of(series).values()) == [0, 2, 0, 0]
    q = "{} | count_over_time() by (rootServiceName)"
    r = grafana_get(srv, "/api/metrics/query_range", {**params, "q": q}, tenant="nested")
    assert r.status_code == 200, r.text
    got = {labels_of(s): list(samples_of(s).values()) for s in r.json()["series"]}
    assert got == {
        (("rootServiceName", "checkout"),): [0, 3, 0, 0],
        (("rootServiceName", "payments"),): [0, 0, 1, 0],
    }
    # Tempo's nested set numbers need the whole trace: -1 for a root, the parent's left
    # number (1, its trace's root) for the two calls.
    q = "{} | count_over_time() by (nestedSetParent)"
    r = grafana_get(srv, "/api/metrics/query_range", {**params, "q": q}, tenant="nested")
    assert r.status_code == 200, r.text
    got = {labels_of(s): sum(samples_of(s).values()) for s in r.json()["series"]}
    assert got == {(("nestedSetParent", -1),): 2, (("nestedSetParent", 1),): 2}


@pytest.fixture(params=["duckdb", "clickhouse"])
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:  # type: ignore[no-untyped-def]
    """Either store, holding the SPANS table (the engine reads both through span_records)."""
    if request.param == "duckdb":
        s = open_store(str(tmp_path / "data"))
    else:
        from hotspan.store.clickhouse import ClickHouseStore

        s = ClickHouseStore(request.getfixturevalue("clickhouse_url"), retention_ns=0)
    try:
        result = to_span_batch(encode_spans(list(sdk_spans().values())))
        s.write_spans(TENANT, result.batch).result()
        yield s
    finally:
        s.close()


def test_engine_on_each_store_and_the_span_bound(store: Store) -> None:
    """At most ``max_spans`` spans are read, the newest first, and the answer says so."""
    req = MetricsRequest(START * SEC, END * SEC, STEP_S * SEC)
    by_service = run_metrics(
        store, TENANT, parse_query("{} | count_over_time() by (resource.service.name)"), req
    )
    got = {s.labels: list(s.values) for s in by_service.series}
    want = counts(lambda row: row[0])
    assert got == {(("resource.service.name", k),): v for k, v in want.items()}
    query = parse_query("{} | count_over_time()")
    whole = run_metrics(store, TENANT, query, req)
    assert whole.partial is None and whole.inspected_spans == 12
    assert list(whole.series[0].values) == [1, 5, 3, 3]
    bounded = run_metrics(store, TENANT, query, req, max_spans=4, in_store=False)
    assert bounded.inspected_spans == 4
    assert bounded.partial and "at most 4 spans" in bounded.partial
    # The newest four spans (179 s, 170 s, 130 s, 90 s) are those counted.
    assert list(bounded.series[0].values) == [0, 0, 1, 3]


# -- Traces Drilldown ---------------------------------------------------------------------------
# Its queries as it builds them (grafana/traces-drilldown: generateMetricsQuery.ts, histogram.ts,
# comparisonQuery.ts, AttributesComparisonScene.tsx), sent as Grafana's backend sends them:
# start/end in unix seconds, the panel's step, no exemplars parameter (Drilldown sets none).
ROOTS = "nestedSetParent<0"  # Drilldown's default primary signal, "Root spans"


def drilldown(
    srv: RunningServer, q: str, step: str, tenant: str = TENANT, path: str = "query_range"
) -> dict:
    params = {"q": q, "start": str(START), "end": str(END), "step": step}
    r = grafana_get(srv, f"/api/metrics/{path}", params, tenant)
    assert r.status_code == 200, r.text
    return r.json()


def stamps_for(step_s: int) -> List[int]:
    """The interval ends (ms) of [START, END] with a step, widened as Tempo aligns it."""
    start = START - START % step_s - step_s
    end = END + (-END % step_s)
    return [(start + step_s * (i + 1)) * 1000 for i in range((end - start) // step_s)]


def slot_of(offset_s: float, step_s: int) -> Optional[int]:
    for i, stamp in enumerate(stamps_for(step_s)):
        if stamp / 1000 - step_s < T0 + offset_s <= stamp / 1000:
            return i
    return None


def test_drilldown_red_panels(srv: RunningServer, sent: Sent, nested: List[ReadableSpan]) -> None:
    """The RED panels (rate and errors: 64 data points; duration: a heatmap of 24) and the
    breakdown by service, with Drilldown's steps for a 3-minute range (range / data points,
    in whole seconds: 2 s and 7 s) and its query text to the space."""
    step_s = (END - START) // 64
    step = f"{step_s}s"
    stamps = stamps_for(step_s)
    by = "resource.service.name"

    def want(selected, key=lambda row: row[0]) -> Dict[object, Dict[int, float]]:  # type: ignore[no-untyped-def]
        out: Dict[object, List[float]] = {}
        for row in SPANS:
            i = slot_of(row[3], step_s)
            if i is not None and selected(row):
                out.setdefault(key(row), [0.0] * len(stamps))[i] += 1
        return {k: dict(zip(stamps, [c / step_s for c in v])) for k, v in out.items()}

    # The RED panel without breakdown: sampled (a hint hotspan takes, and counts every span).
    red = drilldown(srv, f"{{{ROOTS}}} | rate()  with(sample=true)", step)
    got = {labels_of(s): samples_of(s) for s in red["series"]}
    assert got == {(("__name__", "rate"),): want(lambda row: True, lambda row: "all")["all"]}
    red_errors = drilldown(srv, f"{{{ROOTS} && status=error}} | rate()  with(sample=true)", step)
    (series,) = red_errors["series"]
    assert samples_of(series) == want(lambda row: row[2] == "error", lambda row: "all")["all"]
    rate = drilldown(srv, f"{{{ROOTS} && {by} != nil}} | rate() by({by})", step)
    got = {labels_of(s)[0][1]: samples_of(s) for s in rate["series"]}
    assert got == want(lambda row: True)
    errors = drilldown(srv, f"{{{ROOTS} && status=error && {by} != nil}} | rate() by({by})", step)
    got = {labels_of(s)[0][1]: samples_of(s) for s in errors["series"]}
    assert got == want(lambda row: row[2] == "error")
    # A breakdown tile: its value pinned in the filter, no nil guard.
    tile = drilldown(srv, f'{{{ROOTS} && {by}="payments"}} | rate() by({by})', step)
    got = {labels_of(s)[0][1]: samples_of(s) for s in tile["series"]}
    assert got == {"payments": want(lambda row: True)["payments"]}
    # No breakdown: "by" is left out, the function keeps its trailing space.
    p90 = drilldown(srv, f"{{{ROOTS}}} | quantile_over_time(duration, 0.9) ", step)
    (series,) = p90["series"]
    assert labels_of(series) == (("p", 0.9),)
    one_span = {i: d for _, _, _, off, d in SPANS if (i := slot_of(off, step_s)) is not None}
    # Every step here holds at most one span: its quantile is its bucket's top.
    assert samples_of(series) == pytest.approx(
        {
            t: (log2_bucket_ns(int(one_span[i] * MS)) / SEC if i in one_span else 0)
            for i, t in enumerate(stamps)
        }
    )
    step_s = (END - START) // 24
    step = f"{step_s}s"
    heatmap = drilldown(srv, f"{{{ROOTS}}} | histogram_over_time(duration) with(sample=true)", step)
    assert {labels_of(s) for s in heatmap["series"]} == {
        (("__bucket", log2_bucket_ns(int(d * MS)) / SEC),)
        for _, _, _, off, d in SPANS
        if slot_of(off, step_s) is not None
    }
    # Root spans only: tenant "nested" has two roots (checkout's POST /pay, payments' refund)
    # and two payments spans under checkout's root, which count in "All spans" (true) only.
    for signal, payments in ((ROOTS, 1), ("true", 3)):
        body = drilldown(srv, f"{{{signal}}} | count_over_time() by({by})", "1m", "nested")
        got = {labels_of(s)[0][1]: sum(samples_of(s).values()) for s in body["series"]}
        assert got == {"checkout": 1, "payments": payments}


def compare_table(
    selected, step_s: int, top_n: int = 10
) -> Dict[Tuple[Tuple[str, object], ...], List[int]]:  # type: ignore[no-untyped-def]
    """compare()'s series worked out from the SPANS table (each span is its trace's root):
    spans per interval for each side and attribute value, and each side's totals."""
    values: Dict[Tuple[str, str], Dict[object, List[int]]] = {}
    stamps = stamps_for(step_s)
    for n, row in enumerate(SPANS):
        svc, route, status, offset, _ = row
        i = slot_of(offset, step_s)
        if i is None:
            continue
        side = "selection" if selected(row) else "baseline"
        attributes = {
            "name": f"span{n}",
            "status": "error" if status == "error" else "unset",
            "kind": "server",
            "span.http.route": route,
            "span.http.status_code": 500 if status == "error" else 200,
            "resource.service.name": svc,
            "resource.env": "prod",
            "rootName": f"span{n}",
            "rootServiceName": svc,
        }
        for attribute, value in attributes.items():
            per_value = values.setdefault((side, attribute), {})
            per_value.setdefault(value, [0] * len(stamps))[i] += 1
    out: Dict[Tuple[Tuple[str, object], ...], List[int]] = {}
    for (side, attribute), per_value in values.items():
        top = sorted(per_value, key=lambda v: -sum(per_value[v]))[:top_n]
        for value in top:
            out[(("__meta_type", side), (attribute, value))] = per_value[value]
        totals = [sum(counts) for counts in zip(*per_value.values())]
        out[(("__meta_type", f"{side}_total"), (attribute, "nil"))] = totals
    return out


def test_compare_as_drilldown_asks(srv: RunningServer, sent: Sent) -> None:
    """The comparison tab: ``{filters} | compare({status = error}, 10)`` over the range picked,
    as one step (``${to - from}s``): per attribute value, spans of the selection (errors) and
    of the baseline (the rest), with each side's totals."""
    step_s = END - START
    body = drilldown(srv, f"{{{ROOTS}}} | compare({{status = error}}, 10)", f"{step_s}s")
    got = {labels_of(s): s for s in body["series"]}
    want = compare_table(lambda row: row[2] == "error", step_s)
    assert set(got) == set(want)
    stamps = stamps_for(step_s)
    for labels, counts in want.items():
        # Every interval has a sample (0 left out of the JSON as protobuf leaves it out).
        assert samples_of(got[labels]) == dict(zip(stamps, counts)), labels
        assert "exemplars" not in got[labels]
    # Label values typed as Tempo types them: the nil of totals is the string "nil".
    total = got[(("__meta_type", "baseline_total"), ("span.http.status_code", "nil"))]
    assert total["labels"][1]["value"] == {"stringValue": "nil"}
    code = got[(("__meta_type", "selection"), ("span.http.status_code", 500))]
    assert code["labels"][1]["value"] == {"intValue": "500"}
    # What Drilldown draws: a value's share of its side, e.g. checkout has 2 of the 3 errors.
    selection = samples_of(
        got[(("__meta_type", "selection"), ("resource.service.name", "checkout"))]
    )
    errors = samples_of(got[(("__meta_type", "selection_total"), ("resource.service.name", "nil"))])
    assert sum(selection.values()) / sum(errors.values()) == 2 / 3


def test_compare_window_and_top_n(srv: RunningServer, sent: Sent) -> None:
    """A brushed time window (compare's 3rd and 4th arguments, unix ns) narrows the selection
    to spans started in it; topN keeps the values with the most spans per side."""
    window = ((T0 + 60) * SEC, (T0 + 180) * SEC)
    q = f"{{{ROOTS}}} | compare({{status = error}}, 1, {window[0]}, {window[1]})"
    body = drilldown(srv, q, "1m")
    got = {labels_of(s): list(samples_of(s).values()) for s in body["series"]}

    def selected(row) -> bool:  # type: ignore[no-untyped-def]
        return row[2] == "error" and window[0] < (T0 + row[3]) * SEC <= window[1]

    want = compare_table(selected, STEP_S, top_n=10)
    # Totals are whole; of the values, each side keeps one per attribute, its most frequent
    # where there is one (baseline: 6 checkout spans against 4 payments ones).
    totals = {k: v for k, v in want.items() if k[0][1].endswith("_total")}
    assert {k: v for k, v in got.items() if k[0][1].endswith("_total")} == totals
    kept = [k for k in got if not k[0][1].endswith("_total")]
    assert sorted((k[0][1], k[1][0]) for k in kept) == sorted(
        (k[0][1][: -len("_total")], k[1][0]) for k in totals
    )
    for k in kept:
        assert got[k] == want[k]
    assert (("__meta_type", "baseline"), ("resource.service.name", "checkout")) in got
    assert got[(("__meta_type", "selection_total"), ("status", "nil"))] == [0, 0, 1, 1]


def test_compare_root_attributes_of_child_spans(
    srv: RunningServer, nested: List[ReadableSpan]
) -> None:
    """rootName and rootServiceName of spans below another service's root: read from the
    stored root span of each trace."""
    q = '{resource.service.name="payments"} | compare({name="charge0"}, 10)'
    body = drilldown(srv, q, "1m", "nested")
    got = {labels_of(s): sum(samples_of(s).values()) for s in body["series"]}
    roots = {k: v for k, v in got.items() if k[1][0] in ("rootName", "rootServiceName")}
    assert roots == {
        (("__meta_type", "selection"), ("rootName", "POST /pay")): 1,  # charge0
        (("__meta_type", "baseline"), ("rootName", "POST /pay")): 1,  # charge1
        (("__meta_type", "baseline"), ("rootName", "refund")): 1,  # refund is its own root
        (("__meta_type", "selection_total"), ("rootName", "nil")): 1,
        (("__meta_type", "baseline_total"), ("rootName", "nil")): 2,
        (("__meta_type", "selection"), ("rootServiceName", "checkout")): 1,
        (("__meta_type", "baseline"), ("rootServiceName", "checkout")): 1,
        (("__meta_type", "baseline"), ("rootServiceName", "payments")): 1,
        (("__meta_type", "selection_total"), ("rootServiceName", "nil")): 1,
        (("__meta_type", "baseline_total"), ("rootServiceName", "nil")): 2,
    }


def test_small_pages_read_each_span_once(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans are read a page at a time, over time slices, the newest first: with pages of 3
    spans each span is still read once (the answer says 12 inspected, not more), the counts
    are those of one read, and the span bound cuts at the newest spans."""
    from hotspan.query.traceql import candidates

    req = MetricsRequest(START * SEC, END * SEC, STEP_S * SEC)
    query = parse_query("{} | count_over_time() by (resource.service.name)")
    at_once = run_metrics(store, TENANT, query, req)
    monkeypatch.setattr(candidates, "PAGE_SPANS", 3)
    paged = run_metrics(store, TENANT, query, req, in_store=False)  # at_once: the store's
    assert paged.inspected_spans == at_once.inspected_spans == 12
    assert paged.partial is None
    assert {s.labels: list(s.values) for s in paged.series} == {
        s.labels: list(s.values) for s in at_once.series
    }
    count = parse_query("{} | count_over_time()")
    bounded = run_metrics(store, TENANT, count, req, max_spans=5, in_store=False)
    assert bounded.inspected_spans == 5 and bounded.partial
    # The newest five: 179 s, 170 s and 130 s in the last step, 90 s and 80 s before it.
    assert list(bounded.series[0].values) == [0, 0, 2, 3]


def test_presence_tests_keep_spans_with_the_attribute(
    srv: RunningServer, sent: Sent, nested: List[ReadableSpan]
) -> None:
    """``x != nil`` (Drilldown adds one for the attribute it breaks down by) keeps the spans
    that have x: read as lookups beside the store's conditions, as the engine would judge."""
    for tenant, q, want in [
        (TENANT, "{nestedSetParent<0 && span.http.route != nil && resource.env != nil}", 12),
        (TENANT, "{status = error && .http.route != nil}", 3),
        (TENANT, "{span.http.route != nil && span.nothing != nil}", 0),
        ("nested", "{resource.service.name != nil && kind != nil}", 4),
        ("nested", "{span.http.route != nil}", 0),
    ]:
        body = drilldown(srv, q + " | count_over_time()", "1m", tenant)
        got = sum(sum(samples_of(s).values()) for s in body.get("series", []))
        assert got == want, q


def test_compare_on_each_store(store: Store) -> None:
    """compare() reads both stores alike (root spans through the store's root test)."""
    req = MetricsRequest(START * SEC, END * SEC, STEP_S * SEC)
    result = run_metrics(
        store, TENANT, parse_query(f"{{{ROOTS}}} | compare({{status=error}})"), req
    )
    got = {s.labels: [int(v) for v in s.values] for s in result.series}
    assert got == compare_table(lambda row: row[2] == "error", STEP_S)
    assert result.inspected_spans == 12


# -- bounds on memory and time ------------------------------------------------------------------


@pytest.fixture(scope="module")
def duck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """A DuckDB store holding the SPANS table, shared by the tests of bounds."""
    s = open_store(str(tmp_path_factory.mktemp("bounds") / "data"))
    try:
        s.write_spans(
            TENANT, to_span_batch(encode_spans(list(sdk_spans().values()))).batch
        ).result()
        yield s
    finally:
        s.close()


def series_of(result) -> Dict[Tuple[Tuple[str, object], ...], List[float]]:  # type: ignore[no-untyped-def]
    return {s.labels: list(s.values) for s in result.series}


def test_cell_bound_gives_a_partial_answer(duck: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """maxSeries bounds groups, but a histogram group has a row per bucket: the cells (rows x
    intervals) are bounded too, and an answer past the bound is partial, its series whole."""
    from hotspan.query.traceql import metrics

    req = MetricsRequest(START * SEC, END * SEC, STEP_S * SEC)  # 4 intervals
    histogram = parse_query("{} | histogram_over_time(duration) by (name)")
    whole = run_metrics(duck, TENANT, histogram, req)
    assert whole.partial is None and len(whole.series) == 12  # a span per name
    monkeypatch.setattr(metrics, "MAX_CELLS", 5 * len(STAMPS_MS))
    bounded = run_metrics(duck, TENANT, histogram, req)
    assert bounded.partial and "at most 20 values" in bounded.partial
    assert len(bounded.series) == 5
    complete = series_of(whole)
    assert all(complete[k] == v for k, v in series_of(bounded).items())
    # Quantiles: a service's buckets (checkout's spans fall in 6) are its rows.
    quantiles = parse_query("{} | quantile_over_time(duration, .5) by (resource.service.name)")
    monkeypatch.setattr(metrics, "MAX_CELLS", 3 * len(STAMPS_MS))
    bounded = run_metrics(duck, TENANT, quantiles, req)
    assert bounded.partial and "at most 12 values" in bounded.partial
    monkeypatch.setattr(metrics, "MAX_CELLS", 20_000_000)
    assert run_metrics(duck, TENANT, quantiles, req).partial is None


def test_compare_answer_is_bounded_by_cells(duck: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """compare() writes every interval of each series it keeps: the answer's cells bound
    its series as they bound the other functions' (a span with thousands of attributes over
    a day at a 10 s step made a 163 MB answer)."""
    from hotspan.query.traceql import metrics

    req = MetricsRequest(START * SEC, END * SEC, STEP_S * SEC)
    compare = parse_query("{} | compare({status = error})")
    whole = run_metrics(duck, TENANT, compare, req)
    assert whole.partial is None and len(whole.series) > 3
    monkeypatch.setattr(metrics, "MAX_CELLS", 3 * len(STAMPS_MS))
    bounded = run_metrics(duck, TENANT, compare, req)
    assert bounded.partial and "at most 12 values" in bounded.partial
    assert 0 < len(bounded.series) <= 3
    complete = series_of(whole)
    assert all(complete[k] == v for k, v in series_of(bounded).items())


def test_deadline_gives_a_partial_answer(duck: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A query stops reading when its time is up (checked between pages) and says so."""
    from hotspan.query.traceql import candidates

    req = MetricsRequest(START * SEC, END * SEC, STEP_S * SEC)
    monkeypatch.setattr(candidates, "PAGE_SPANS", 3)
    queries = ["{} | count_over_time()", "{} >> {} | rate()", "{} | compare({status=error})"]
    # (Read span by span: a query the store aggregates has no deadline of its own.)
    for q in queries:
        assert run_metrics(duck, TENANT, parse_query(q), req, in_store=False).partial is None, q
    monkeypatch.setattr(candidates, "DEADLINE_S", 0.0)
    for q in queries:
        result = run_metrics(duck, TENANT, parse_query(q), req, in_store=False)
        assert result.partial and "took longer than 0 s" in result.partial, q
        assert result.inspected_spans < 12, q


def test_compare_series_bound(duck: Store, srv: RunningServer, sent: Sent) -> None:
    """compare() answers at most maxSeries series: whole attributes (both totals, then the
    values by rank), partial past the bound; each series kept is exact."""
    want = compare_table(lambda row: row[2] == "error", STEP_S)
    query = parse_query(f"{{{ROOTS}}} | compare({{status=error}})")
    req = MetricsRequest(START * SEC, END * SEC, STEP_S * SEC, max_series=10)
    bounded = run_metrics(duck, TENANT, query, req)
    got = series_of(bounded)
    assert len(got) == 10 and len(want) > 10
    assert bounded.partial and "maximum series limit of 10" in bounded.partial
    assert all(want[k] == v for k, v in got.items())
    for attribute in {k[1][0] for k in got}:
        for side in ("baseline_total", "selection_total"):
            assert (("__meta_type", side), (attribute, "nil")) in got
    # As Grafana asks, with maxSeries.
    params = {"q": query.text, "start": str(START), "end": str(END), "step": "1m"}
    r = grafana_get(srv, "/api/metrics/query_range", {**params, "maxSeries": "10"})
    assert r.status_code == 200, r.text
    assert len(r.json()["series"]) == 10 and r.json()["status"] == "PARTIAL"


def test_compare_memory_bounds(duck: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """compare() counts the first values of an attribute (the rest in its totals only), a
    bounded number of attributes and of counts: totals stay exact."""
    from hotspan.query.traceql import metrics_compare

    def selected(row) -> bool:  # type: ignore[no-untyped-def]
        return row[2] == "error"

    every = compare_table(selected, STEP_S, top_n=1000)
    totals = {k: v for k, v in every.items() if k[0][1].endswith("_total")}
    req = MetricsRequest(START * SEC, END * SEC, STEP_S * SEC)
    query = parse_query(f"{{{ROOTS}}} | compare({{status=error}}, 2)")

    # Values: each span has its own name; with a bound of one value per side and attribute,
    # the name counted is the newest span's (read first), the others are in the totals only.
    # As Tempo, the answer is not partial for it.
    monkeypatch.setattr(metrics_compare, "MAX_COMPARE_VALUES", 1)
    result = run_metrics(
        duck, TENANT, parse_query(f"{{{ROOTS}}} | compare({{status=error}}, 1)"), req
    )
    got = series_of(result)
    assert result.partial is None
    for side, in_side in (("baseline", lambda r: not selected(r)), ("selection", selected)):
        rows = [n for n, r in enumerate(SPANS) if step_of(r[3]) is not None and in_side(r)]
        newest = f"span{max(rows, key=lambda n: SPANS[n][3])}"
        names = [k for k in got if k[0][1] == side and k[1][0] == "name"]
        assert names == [(("__meta_type", side), ("name", newest))]
        assert got[names[0]] == every[names[0]]
    assert {k: v for k, v in got.items() if k in totals} == totals
    monkeypatch.setattr(metrics_compare, "MAX_COMPARE_VALUES", 1000)

    # Attributes: three of the nine.
    monkeypatch.setattr(metrics_compare, "MAX_COMPARE_ATTRIBUTES", 3)
    result = run_metrics(duck, TENANT, query, req)
    got = series_of(result)
    assert result.partial and "at most 3 attributes" in result.partial
    assert len({k[1][0] for k in got}) == 3
    assert all(every[k] == v for k, v in got.items())
    monkeypatch.setattr(metrics_compare, "MAX_COMPARE_ATTRIBUTES", 250)

    # Counts: ten (side, interval, attribute, value) cells.
    monkeypatch.setattr(metrics_compare, "MAX_COMPARE_CELLS", 10)
    result = run_metrics(duck, TENANT, query, req)
    got = series_of(result)
    assert result.partial and "at most 10 counts" in result.partial
    assert {k: v for k, v in got.items() if k in totals} == totals
    values = [k for k in got if k not in totals]
    assert sum(1 for k in values for v in got[k] if v) <= 10
    assert all(v <= w for k in values for v, w in zip(got[k], every[k]))


def test_a_filter_after_the_function_keeps_the_points_that_pass(
    srv: RunningServer, sent: Sent
) -> None:
    # Tempo's metricsFilter: a point that fails the comparison is dropped, a series left with
    # none is dropped; the others keep their labels and their passing points.
    q = "{ } | count_over_time() by (resource.service.name, span.http.route)"
    whole = by_labels(query_range(srv, q))
    cases = [("> 1", lambda v: v > 1), ("<= 1", lambda v: v <= 1), ("!= 2", lambda v: v != 2)]
    for suffix, test in cases:
        body = query_range(srv, f"{q} {suffix}")
        got = {labels: samples_of(s) for labels, s in by_labels(body).items()}
        want = {}
        for labels, s in whole.items():
            # Tempo's JSON leaves out zeros; a point absent here was a NaN (no sample).
            kept = {t: v for t, v in samples_of(s).items() if test(v)}
            if kept:
                want[labels] = kept
        assert got == want, suffix
        assert want and want != {k: samples_of(s) for k, s in whole.items()}, suffix


def test_boolean_labels_are_typed(srv: RunningServer) -> None:
    """A by() or compare() label of a boolean attribute is Tempo's ``boolValue``: Grafana
    quotes string labels only, so the filter it builds from one (``span.cached = false``)
    matches the spans only when the label is typed.  Through the store's statement and through
    the engine (a structural query, which the store does not aggregate)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "cache"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("hotspan.tests")
    for n in range(4):
        start = int((T0 + 10 + n) * SEC)
        root = tracer.start_span("get", kind=SpanKind.SERVER, start_time=start)
        root.set_attribute("cached", n % 2 == 0)
        root.set_attribute("tag", "true")  # a string that reads as a boolean stays one
        child = tracer.start_span(
            "lookup", context=set_span_in_context(root), start_time=start + 1000
        )
        child.end(end_time=start + 2000)
        root.end(end_time=start + 3000)
    provider.force_flush()
    body = encode_spans(list(memory.get_finished_spans())).SerializeToString()
    headers = {"Content-Type": "application/x-protobuf", "X-Scope-OrgID": "booleans"}
    r = httpx.post(srv.url + "/v1/traces", content=body, headers=headers, timeout=30, verify=TLS)
    assert r.status_code == 200, r.text

    def labels(q: str) -> List[dict]:
        params = {"q": q, "start": str(START), "end": str(END), "step": "1m"}
        r = grafana_get(srv, "/api/metrics/query_range", params, tenant="booleans")
        assert r.status_code == 200, r.text
        return [kv for s in r.json()["series"] for kv in s["labels"]]

    for q in (
        "{} | count_over_time() by (span.cached)",  # the store's statement
        '{ name = "lookup" } << { } | count_over_time() by (span.cached)',  # the engine
    ):
        found = {kv["key"]: kv["value"] for kv in labels(q) if kv["key"] == "span.cached"}
        assert found, q
        values = [kv["value"] for kv in labels(q)]
        assert {"boolValue": True} in values and {"boolValue": False} in values, (q, values)
    compared = labels("{} | compare({ span.cached = true })")
    assert {"key": "span.cached", "value": {"boolValue": True}} in compared, compared
    assert {"key": "span.tag", "value": {"stringValue": "true"}} in compared, compared
