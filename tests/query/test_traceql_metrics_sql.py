"""TraceQL metrics aggregated by the store (``metrics_pushdown``, ``store.metrics_sql``; for
``compare()``, ``store.compare_sql``) give the answers of the engine that reads every span:
each pushed-down query shape runs both ways over the same spans, written through
``write_spans``, on DuckDB and on ClickHouse (chdb).
"""

from __future__ import annotations

import math
import random
from typing import Dict, Iterator, List, Tuple

import numpy as np
import pytest

from hotspan.model.trace import SpanBatch, SpanGroup, SpanWriteRow, flatten_attributes
from hotspan.query.traceql import MetricsRequest, parse_query, run_metrics
from hotspan.query.traceql.metrics_compare import MAX_COMPARE_CELLS, compare_plan
from hotspan.query.traceql.metrics_pushdown import pushdown
from hotspan.query.traceql.series import MetricsResult
from hotspan.store import open_store
from hotspan.store.base import Store
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url

SEC = 10**9
MS = 10**6
TENANT = "t1"
BASE = 1_700_000_040 * SEC  # a whole minute
SPAN = 600 * SEC  # spans start over ten minutes
STEP = 60 * SEC
# (service, resource attributes as (key, value, type)): a resource whose service.name is a
# string that reads as a number, one with an empty one, one without.
RESOURCES = [
    ("api", [("service.name", "api", "string"), ("deployment.environment", "prod", "string")]),
    ("db", [("service.name", "db", "string"), ("deployment.environment", "staging", "string")]),
    ("worker", [("service.name", "worker", "string"), ("k8s.pod", "wörker-1", "string")]),
    ("7", [("service.name", "7", "string")]),
    ("blank", [("service.name", "", "string"), ("deployment.environment", "prod", "string")]),
    ("nameless", [("host.name", "h1", "string")]),
]
DURATIONS = [0, 1, 2, 3, 4, 5, 7, 8, 9, 1023, 1024, 1025, 2**20, 2**20 + 1]


def _attributes(rng: random.Random) -> List[Tuple[str, str, str]]:
    attrs: List[Tuple[str, str, str]] = []
    if rng.random() < 0.8:
        attrs.append(("http.route", rng.choice(["/a", "/b", "/ü/c", ""]), "string"))
    if rng.random() < 0.7:
        attrs.append(("http.status_code", rng.choice(["200", "404", "500"]), "int"))
    if rng.random() < 0.3:
        attrs.append(("code", rng.choice(["404", "x404"]), "string"))  # "404": a string
    if rng.random() < 0.3:
        attrs.append(("ratio", rng.choice(["1.5", "2", "-0.25", "1e3"]), "double"))
    if rng.random() < 0.3:
        attrs.append(("flag", rng.choice(["true", "false"]), "bool"))
    if rng.random() < 0.2:
        attrs.append(("deployment.environment", "canary", "string"))  # over the resource's
    if rng.random() < 0.1:
        attrs.append(("service.name", "from-span", "string"))
    if rng.random() < 0.3:
        attrs.append(("päth", rng.choice(["wörld", "wörld2"]), "string"))
    rng.shuffle(attrs)
    # Arrays: one record per element, kept together as ingest writes them (strings that
    # read as numbers or booleans among the strings).
    if rng.random() < 0.3:
        for _ in range(rng.randrange(1, 4)):
            attrs.append(("tags", rng.choice(["a", "b", "404", "true"]), "string"))
    if rng.random() < 0.3:
        for _ in range(rng.randrange(1, 4)):
            attrs.append(("retries", rng.choice(["1", "3", "30"]), "int"))
    if rng.random() < 0.3:  # elements of several types, as OTLP allows
        for _ in range(rng.randrange(1, 4)):
            attrs.append(
                rng.choice(
                    [("mixed", "true", "bool"), ("mixed", "false", "bool")]
                    + [("mixed", "x", "string"), ("mixed", "3", "int"), ("mixed", "true", "string")]
                )
            )
    return attrs


def _batches(seed: int = 7, traces: int = 400) -> List[SpanBatch]:
    rng = random.Random(seed)
    out = []
    for r, (service, resource) in enumerate(RESOURCES):
        batch = SpanBatch()
        group = SpanGroup(
            service, f"res-{r}".encode(), "", b"scope", "", flatten_attributes(resource)
        )
        gid = batch.add_group(group)
        for t in range(traces // len(RESOURCES)):
            trace_id = f"{r:02x}{t:030x}"
            root = rng.getrandbits(63) | 1
            for s in range(rng.randint(1, 5)):
                span_id = root if s == 0 else rng.getrandbits(63) | 1
                # Starts on interval bounds too (intervals are right-closed).  Not on the
                # range's end: groups whose newest spans start at the same nanosecond come in
                # another order (the engine's by span id), which topk's ties would show.
                if rng.random() < 0.1:
                    start = BASE + rng.randint(0, 9) * STEP
                else:
                    start = BASE + rng.randrange(-STEP, SPAN + STEP)
                if rng.random() < 0.5:
                    duration = rng.choice(DURATIONS)
                else:
                    duration = int(rng.lognormvariate(17, 2.5))
                batch.rows.append(
                    SpanWriteRow(
                        trace_id,
                        span_id,
                        0 if s == 0 else root,
                        rng.choice(["GET /a", "POST /b", "SELECT", "cache get"]),
                        rng.randrange(6),
                        service,
                        start,
                        start + duration,
                        rng.randrange(3),
                        flatten_attributes(_attributes(rng)),
                        gid,
                        b"raw",
                    )
                )
        out.append(batch)
    return out


def _write(store: Store) -> Store:
    for batch in _batches():
        store.write_spans(TENANT, batch).result()
    return store


@pytest.fixture(scope="module")
def duck(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = open_store(str(tmp_path_factory.mktemp("metrics-sql")))
    try:
        yield _write(store)
    finally:
        store.close()


@pytest.fixture
def clickhouse(clickhouse_url: str) -> Iterator[Store]:
    from hotspan.store.clickhouse import ClickHouseStore

    store = ClickHouseStore(clickhouse_url, retention_ns=0)
    try:
        yield _write(store)
    finally:
        store.close()


# Every shape the store aggregates: functions, by() on intrinsics and on span, resource and
# unscoped attributes (typed, strings that read as numbers, absent, empty, non-ASCII), and the
# filters search compiles.
PUSHED = [
    "{} | rate()",
    "{} | count_over_time()",
    "{} | rate() by (resource.service.name)",
    "{} | rate() by (span.http.route)",
    "{} | count_over_time() by (name, status)",
    "{} | rate() by (span:kind, span:name)",
    "{} | rate() by (span.http.status_code)",
    "{} | rate() by (span.code)",
    "{} | rate() by (span.ratio, span.flag)",
    '{} | rate() by (span."päth")',
    "{} | rate() by (.deployment.environment)",
    "{} | rate() by (resource.deployment.environment, resource.k8s.pod)",
    "{} | rate() by (.service.name)",
    "{} | rate() by (resource.service.name, span.http.route, status)",
    "{ status = error } | rate() by (resource.service.name)",
    '{ span.http.route = "/a" } | rate()',
    "{ duration > 100ms } | count_over_time() by (kind)",
    '{ resource.service.name = "api" && kind = server } | rate() by (span.http.route)',
    "{ span.http.status_code >= 404 } | rate() by (span.http.status_code)",
    '{ name =~ "GET.*|SELECT" } | rate()',
    '{ .deployment.environment = "prod" } | rate() by (resource.service.name)',
    "{ nestedSetParent < 0 } | rate() by (resource.service.name)",
    "{ span.http.route != nil } | rate() by (span.http.route)",
    "{ nestedSetParent<0 && true && span.code != nil } | rate() by (span.code)",
    "{} | min_over_time(duration)",
    "{} | max_over_time(duration) by (resource.service.name)",
    "{} | avg_over_time(duration) by (span.http.route)",
    "{ status = error } | sum_over_time(span:duration) by (name)",
    "{} | histogram_over_time(duration)",
    "{} | histogram_over_time(duration) by (resource.service.name)",
    "{} | quantile_over_time(duration, .5, .9, .99)",
    "{} | quantile_over_time(duration, .9) by (resource.service.name)",
    "{ kind = server } | quantile_over_time(duration, 0, .25, 1) by (span.http.route, status)",
    "{} | rate() by (resource.service.name) | topk(2)",
    "{} | count_over_time() by (span.http.route) > 10",
    # Arrays: one element meets = and >; every element meets != and !~; by() an array takes
    # its first typed element, else its first string.
    '{ span.tags = "a" } | rate() by (span.tags)',
    '{ span.tags = "404" } | rate()',
    '{ span.tags != "b" } | count_over_time() by (span.tags)',
    '{ span.tags =~ "a|b" } | rate()',
    '{ span.tags !~ "a" } | rate()',
    "{ span.retries > 2 } | rate() by (span.retries)",
    "{ span.retries != 3 } | rate()",
    "{} | rate() by (span.tags, span.retries)",
    "{ span.mixed != true } | rate()",
    "{ span.mixed = true } | rate()",
    "{ span.mixed != false } | rate()",
    "{ span.mixed = 3 } | rate()",
    '{ span.mixed != "x" } | rate()',
    '{ span.mixed = "true" } | rate() by (span.mixed)',
]

# Shapes the engine keeps: structural, ||, trace-wide keys, attribute values, compare().
FALLBACK = [
    "{} >> { status = error } | rate()",
    '{ .a = 1 || name = "x" } | rate()',
    "{} | rate() by (rootServiceName)",
    "{} | rate() by (duration)",
    "{} | histogram_over_time(span.ratio)",
    "{} | avg_over_time(span.ratio)",
    "{ traceDuration > 1s } | rate()",
    "{ span.http.route != nil && rootName != nil } | rate()",
]

# compare() shapes the store counts: selections of the conditions search compiles, with and
# without a window, under filters and topN; attributes typed and not, resources with and
# without service.name, roots in and out of the range.
COMPARED = [
    "{} | compare({ status = error })",
    "{} | compare({ true })",
    '{ kind = server } | compare({ span.http.route = "/a" }, 3)',
    '{} | compare({ duration > 100ms && resource.service.name = "api" })',
    "{ span.http.status_code >= 404 } | compare({ nestedSetParent < 0 }, 2)",
    "{ nestedSetParent < 0 } | compare({ status = error })",
    '{ name =~ "GET.*|SELECT" } | compare({ .deployment.environment = "prod" })',
    f"{{}} | compare({{ status = error }}, 5, {BASE + 120 * SEC}, {BASE + 300 * SEC})",
    '{} | compare({ span.tags = "a" && span.retries != 30 })',
]
# compare() shapes the engine keeps: a selection or a filter that is not the store's
# conditions exactly.
COMPARE_FALLBACK = [
    '{} | compare({ status = error || name = "SELECT" })',
    '{} | compare({ rootName = "GET /a" })',
    "{} | compare({ span.code != nil })",
    "{} >> { status = error } | compare({ kind = server })",
    "{ span.code != nil } | compare({ status = error })",
]

# Values that are sums of floats, added in another order by the engine: equal to 1e-12.
_SUMMED = ("sum_over_time", "avg_over_time")


def _request(instant: bool, exemplars: int = 0, max_series: int = 1000) -> MetricsRequest:
    if instant:
        return MetricsRequest(BASE, BASE + SPAN, SPAN, True, 0, max_series)
    return MetricsRequest(BASE + 1, BASE + SPAN, STEP, False, exemplars, max_series)


def _series(result: MetricsResult) -> Dict[tuple, np.ndarray]:
    out = {s.labels: np.asarray(s.values, dtype=float) for s in result.series}
    assert len(out) == len(result.series), "two series with the same labels"
    return out


def _same(store: Store, text: str, instant: bool, max_series: int = 1000) -> None:
    query = parse_query(text)
    req = _request(instant, max_series=max_series)
    assert pushdown(query, req) is not None, f"{text} is not pushed down"
    sql = run_metrics(store, TENANT, query, req)
    engine = run_metrics(store, TENANT, query, req, in_store=False)
    assert sql.partial == engine.partial
    assert (engine.partial is not None) == (max_series < 1000)
    assert sql.inspected_spans == engine.inspected_spans
    assert sql.inspected_traces == engine.inspected_traces
    assert list(sql.timestamps_ms) == list(engine.timestamps_ms)
    got, want = _series(sql), _series(engine)
    assert set(got) == set(want), text
    # Labels equal as values and as types (the int 404 is not the string "404").
    types = {k: [type(v) for _, v in k] for k in want}
    assert {k: [type(v) for _, v in k] for k in got} == types
    assert want, f"{text}: no series (the data should give some)"
    summed = any(f in text for f in _SUMMED)
    for labels, values in want.items():
        if summed:
            np.testing.assert_allclose(got[labels], values, rtol=1e-12, err_msg=text)
        else:
            np.testing.assert_array_equal(got[labels], values, err_msg=f"{text} {labels}")


def _check_all(store: Store) -> None:
    failures = []
    for text in PUSHED:
        for instant in (False, True):
            try:
                _same(store, text, instant)
            except AssertionError as exc:
                failures.append(f"{text} (instant={instant}): {exc}")
    # Past maxSeries both keep the same groups: those of the newest spans.
    for text in (
        "{} | rate() by (span.http.route, status)",
        "{} | quantile_over_time(duration, .5, .9) by (resource.service.name)",
        "{} | histogram_over_time(duration) by (name)",
    ):
        try:
            _same(store, text, False, max_series=5)
        except AssertionError as exc:
            failures.append(f"{text} (max_series=5): {exc}")
    assert not failures, "\n".join(failures)


def test_every_pushed_down_shape_answers_as_the_engine_duckdb(duck: Store) -> None:
    _check_all(duck)


def test_every_pushed_down_shape_answers_as_the_engine_clickhouse(clickhouse: Store) -> None:
    _check_all(clickhouse)
    _check_exemplars(clickhouse)


@pytest.mark.parametrize("text", FALLBACK)
def test_the_engine_keeps_what_one_statement_cannot_answer(text: str) -> None:
    assert pushdown(parse_query(text), _request(False)) is None


def test_a_store_without_aggregation_falls_back_to_the_engine(duck: Store) -> None:
    """A query the store cannot aggregate (metrics_rows None) is read span by span, with the
    engine's bound on the spans read."""
    query = parse_query("{} | count_over_time()")
    req = _request(False)
    sql = run_metrics(duck, TENANT, query, req)
    assert sql.partial is None and sql.inspected_spans > 100
    bounded = run_metrics(duck, TENANT, query, req, max_spans=100, in_store=False)
    assert bounded.partial and "at most 100 spans" in bounded.partial
    # Pushed down, no span bound applies.
    assert run_metrics(duck, TENANT, query, req, max_spans=100).partial is None


def _check_exemplars(store: Store) -> None:
    """Exemplars of a pushed-down query: at most the asked number, of distinct stored traces,
    each in an interval of its series that has a sample; a quantile's carries its span's
    duration, a rate's the sample."""
    for text, limit in (
        ("{} | quantile_over_time(duration, .5, .99) by (resource.service.name)", 20),
        ("{} | rate() by (span.http.route)", 100),
        ("{} | histogram_over_time(duration)", 8),
    ):
        req = _request(False, exemplars=limit)
        result = run_metrics(store, TENANT, parse_query(text), req)
        exemplars = [(s, e) for s in result.series for e in s.exemplars]
        assert 0 < len(exemplars) <= limit, text
        traces = [dict(e.labels)["trace:id"] for _, e in exemplars]
        assert len(set(traces)) == len(traces)
        for series, e in exemplars:
            labels = dict(e.labels)
            spans = store.trace(TENANT, labels["trace:id"])
            span = next(s for s in spans if f"{s.span_id:016x}" == labels["span:id"])
            assert span.start_ns // MS == e.timestamp_ms
            slot = (e.timestamp_ms * MS - (BASE - STEP) - 1) // STEP
            assert not math.isnan(series.values[slot])
            if "quantile" in text:
                assert e.value == (span.end_ns - span.start_ns) / SEC
            else:
                assert e.value == series.values[slot]


def test_exemplars_duckdb(duck: Store) -> None:
    _check_exemplars(duck)


def _same_compare(store: Store, text: str, instant: bool) -> None:
    query = parse_query(text)
    req = _request(instant)
    assert compare_plan(query, req, MAX_COMPARE_CELLS + 1) is not None, f"{text}: not counted"
    sql = run_metrics(store, TENANT, query, req)
    engine = run_metrics(store, TENANT, query, req, in_store=False)
    assert sql.partial is None and engine.partial is None
    assert (sql.inspected_spans, sql.inspected_traces) == (
        engine.inspected_spans,
        engine.inspected_traces,
    )
    assert list(sql.timestamps_ms) == list(engine.timestamps_ms)
    got, want = _series(sql), _series(engine)
    assert want, f"{text}: no series (the data should give some)"
    assert set(got) == set(want), f"{text}: {set(got) ^ set(want)}"
    types = {k: [type(v) for _, v in k] for k in want}
    assert {k: [type(v) for _, v in k] for k in got} == types
    for labels, values in want.items():
        np.testing.assert_array_equal(got[labels], values, err_msg=f"{text} {labels}")


def _check_compare(store: Store) -> None:
    failures = []
    for text in COMPARED:
        for instant in (False, True):
            try:
                _same_compare(store, text, instant)
            except AssertionError as exc:
                failures.append(f"{text} (instant={instant}): {exc}")
    assert not failures, "\n".join(failures)


def test_compare_counted_by_the_store_answers_as_the_engine_duckdb(duck: Store) -> None:
    _check_compare(duck)


def test_compare_counted_by_the_store_answers_as_the_engine_clickhouse(
    clickhouse: Store,
) -> None:
    _check_compare(clickhouse)
    # A server without materialized CTEs reads each part where it is used: the same answer.
    clickhouse._materialized_cte = False  # type: ignore[attr-defined]
    _same_compare(clickhouse, COMPARED[0], False)


@pytest.mark.parametrize("text", COMPARE_FALLBACK)
def test_the_engine_keeps_the_compare_queries_no_statement_answers(text: str) -> None:
    assert compare_plan(parse_query(text), _request(False), MAX_COMPARE_CELLS + 1) is None
