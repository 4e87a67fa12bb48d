"""TraceQL's parser and engine (``hotspan.query.traceql``) on spans as the server stores them.

Spans are made by the real OpenTelemetry SDK, encoded by its OTLP encoder and turned into
stored columns by hotspan's own ingest (``formats.otlp_traces``), so attribute texts, ids and
kinds are what the engine meets in production.  Semantics follow Tempo's documentation and
engine: structural operators return the right side, ``by()`` splits spansets, aggregates
filter them, ``&&`` and ``||`` share one precedence.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from hotspan.formats.otlp_traces import to_span_batch
from hotspan.model.trace import Condition, SpanRecord, flatten_attributes
from hotspan.query import traceql
from hotspan.query.engine import QueryError
from hotspan.query.traceql import (
    MetricsStage,
    parse_duration,
    parse_query,
    parse_traceql,
    span_value,
)
from hotspan.query.traceql import evaluate as run

MS = 10**6
BASE = 1_700_000_000 * 10**9


class Shop:
    """One trace through two services, made with the SDK (times in ms after BASE)."""

    def __init__(self) -> None:
        self.exported: List[ReadableSpan] = []
        self.providers: Dict[str, TracerProvider] = {}
        self.memory = InMemorySpanExporter()

    def tracer(self, service: str):  # type: ignore[no-untyped-def]
        if service not in self.providers:
            provider = TracerProvider(
                resource=Resource.create(
                    {"service.name": service, "deployment.environment": "prod"}
                )
            )
            provider.add_span_processor(SimpleSpanProcessor(self.memory))
            self.providers[service] = provider
        return self.providers[service].get_tracer("shop")

    def span(
        self,
        service: str,
        name: str,
        start_ms: float,
        end_ms: float,
        parent=None,  # type: ignore[no-untyped-def]
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Optional[dict] = None,
        error: bool = False,
    ):  # type: ignore[no-untyped-def]
        ctx = set_span_in_context(parent) if parent is not None else None
        span = self.tracer(service).start_span(
            name,
            context=ctx,
            kind=kind,
            attributes=attributes,
            start_time=int(BASE + start_ms * MS),
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, "boom"))
        span.end(end_time=int(BASE + end_ms * MS))
        return span

    def records(self) -> List[SpanRecord]:
        request = encode_spans(self.memory.get_finished_spans())
        batch = to_span_batch(request).batch
        return [
            SpanRecord(
                r.trace_id,
                r.span_id,
                r.parent_span_id,
                r.name,
                r.kind,
                r.service,
                r.start_ns,
                r.end_ns,
                r.status_code,
                r.attrs,
                batch.groups[r.group_id].attrs,
            )
            for r in batch.rows
        ]


def _shop() -> List[SpanRecord]:
    """GET /checkout (frontend, server)
    ├── POST checkout (frontend, client)
    │   └── POST /pay (checkout, server, error, 500)
    │       ├── charge card (checkout, client, error, stripe, 300 ms... )
    │       └── SELECT orders (checkout, client, postgresql)
    └── cache get (frontend, internal, cache.hit)"""
    shop = Shop()
    root = shop.tracer("frontend").start_span(
        "GET /checkout",
        kind=SpanKind.SERVER,
        attributes={"http.method": "GET", "http.status_code": 200, "http.route": "/checkout"},
        start_time=BASE,
    )
    call = shop.span(
        "frontend", "POST checkout", 5, 90, root, SpanKind.CLIENT, {"http.method": "POST"}
    )
    pay = shop.tracer("checkout").start_span(
        "POST /pay",
        context=set_span_in_context(call),
        kind=SpanKind.SERVER,
        attributes={"http.method": "POST", "http.status_code": 500, "retries": 2},
        start_time=BASE + 10 * MS,
    )
    shop.span(
        "checkout",
        "charge card",
        20,
        60,
        pay,
        SpanKind.CLIENT,
        {"payment.provider": "stripe", "amount": 12.5, "retries": 3},
        error=True,
    )
    shop.span(
        "checkout",
        "SELECT orders",
        61,
        70,
        pay,
        SpanKind.CLIENT,
        {"db.system": "postgresql", "db.rows": 7},
    )
    pay.set_status(Status(StatusCode.ERROR))
    pay.end(end_time=BASE + 85 * MS)
    shop.span("frontend", "cache get", 91, 93, root, attributes={"cache.hit": True})
    root.end(end_time=BASE + 100 * MS)
    return shop.records()


SPANS = _shop()
BY_NAME = {s.name: s for s in SPANS}


def names(spansets: Sequence) -> List[List[str]]:  # type: ignore[type-arg]
    return [[s.name for s in ss.spans] for ss in spansets]


def found(q: str, spans: Sequence[SpanRecord] = SPANS) -> List[List[str]]:
    return names(run(parse_query(q), spans))


# -- the trace itself, as stored ----------------------------------------------------------------


def test_the_shop_trace_is_stored_as_expected() -> None:
    assert sorted(BY_NAME) == [
        "GET /checkout",
        "POST /pay",
        "POST checkout",
        "SELECT orders",
        "cache get",
        "charge card",
    ]
    assert len({s.trace_id for s in SPANS}) == 1
    assert BY_NAME["POST /pay"].parent_span_id == BY_NAME["POST checkout"].span_id
    assert BY_NAME["GET /checkout"].parent_span_id == 0


# -- spanset filters --------------------------------------------------------------------------

ALL = ["GET /checkout", "POST checkout", "POST /pay", "charge card", "SELECT orders", "cache get"]
FILTERS = {
    "{}": [ALL],
    "{ }": [ALL],
    "{ true }": [ALL],
    "{ false }": [],
    '{ name = "POST /pay" }': [["POST /pay"]],
    '{ span:name = "POST /pay" }': [["POST /pay"]],
    '{ name != "POST /pay" && kind = client }': [["POST checkout", "charge card", "SELECT orders"]],
    "{ status = error }": [["POST /pay", "charge card"]],
    "{ span:status = error }": [["POST /pay", "charge card"]],
    '{ status = "error" }': [["POST /pay", "charge card"]],
    "{ status != error && kind = server }": [["GET /checkout"]],
    "{ status = unset && kind = internal }": [["cache get"]],
    "{ kind = client }": [["POST checkout", "charge card", "SELECT orders"]],
    "{ duration > 40ms }": [["GET /checkout", "POST checkout", "POST /pay"]],
    "{ span:duration >= 40ms && duration < 80ms }": [["POST /pay", "charge card"]],
    "{ duration < 2500us }": [["cache get"]],
    "{ duration = 2ms }": [["cache get"]],
    "{ span.http.status_code = 200 }": [["GET /checkout"]],
    "{ span.http.status_code >= 400 }": [["POST /pay"]],
    # The int 500 is not the string "500", in Tempo: no string operator finds a number.
    '{ span.http.status_code = "500" }': [],
    "{ span.http.status_code != 200 }": [["POST /pay"]],
    "{ span.http.status_code > 199 && span.http.status_code < 300 }": [["GET /checkout"]],
    '{ .http.method = "POST" }': [["POST checkout", "POST /pay"]],
    '{ span.http.method =~ "P.*" }': [["POST checkout", "POST /pay"]],
    '{ span.http.method =~ "P" }': [],  # anchored, as in Tempo
    '{ span.http.method !~ "P.*" }': [["GET /checkout"]],
    '{ name =~ "(GET|POST) /.*" }': [["GET /checkout", "POST /pay"]],
    "{ span.amount > 12 }": [["charge card"]],
    "{ span.amount = 12.5 }": [["charge card"]],
    "{ span.cache.hit = true }": [["cache get"]],
    "{ span.cache.hit }": [["cache get"]],
    "{ span.cache.hit != false }": [["cache get"]],
    "{ !span.cache.hit }": [],
    "{ span.db.rows * 2 = 14 }": [["SELECT orders"]],
    "{ span.db.rows + 1 > 7 && span.db.rows - 1 < 7 }": [["SELECT orders"]],
    "{ span.db.rows % 4 = 3 && span.db.rows / 2 = 3 }": [["SELECT orders"]],
    "{ span.db.rows ^ 2 = 49 }": [["SELECT orders"]],
    "{ -span.db.rows < -6 }": [["SELECT orders"]],
    "{ span.retries > span.db.rows }": [],
    "{ span.retries = nil }": [["GET /checkout", "POST checkout", "SELECT orders", "cache get"]],
    "{ span.retries != nil }": [["POST /pay", "charge card"]],
    "{ nil != span.retries && kind = server }": [["POST /pay"]],
    '{ resource.service.name = "checkout" }': [["POST /pay", "charge card", "SELECT orders"]],
    '{ .service.name = "frontend" && kind = internal }': [["cache get"]],
    '{ resource.deployment.environment = "prod" && span.db.system = "postgresql" }': [
        ["SELECT orders"]
    ],
    '{ span.deployment.environment = "prod" }': [],  # a resource attribute, not the span's
    '{ .deployment.environment = "prod" && kind = server }': [["GET /checkout", "POST /pay"]],
    '{ span.payment.provider = "stripe" || span.db.system = "postgresql" }': [
        ["charge card", "SELECT orders"]
    ],
    # && and || share one precedence and associate left, as in Tempo's grammar.
    "{ kind = internal || kind = server && status = error }": [["POST /pay"]],
    "{ kind = internal || (kind = server && status = error) }": [["POST /pay", "cache get"]],
    "{ !(kind = client) && status = error }": [["POST /pay"]],
    '{ rootName = "GET /checkout" && kind = internal }': [["cache get"]],
    '{ trace:rootService = "frontend" && status = error }': [["POST /pay", "charge card"]],
    "{ traceDuration > 99ms && duration < 3ms }": [["cache get"]],
    "{ trace:duration > 100ms }": [],
    "{ span:childCount = 2 }": [["GET /checkout", "POST /pay"]],
    "{ childCount = 0 && kind = client }": [["charge card", "SELECT orders"]],
    # Values of another type never compare equal: a string attribute against a number.
    "{ span.http.method > 1 }": [],
    # A regular expression reads strings only (Tempo): not the int 500.
    '{ span.http.status_code =~ "5.." }': [],
    # A literal first.
    '{ "POST /pay" = name }': [["POST /pay"]],
    "{ 100ms < duration }": [],
    "{ 10ms <= duration && 2 < span.retries }": [["charge card"]],
    # Tempo's nested set numbering: root spans (as Traces Drilldown asks for them).
    "{ nestedSetParent < 0 && true }": [["GET /checkout"]],
    "{ nestedSetParent = -1 }": [["GET /checkout"]],
    "{ -1 = nestedSetParent }": [["GET /checkout"]],
    "{ nestedSetParent >= 0 && kind = server }": [["POST /pay"]],
    "{ nestedSetParent = 3 }": [["charge card", "SELECT orders"]],
    "{ nestedSetLeft > 2 && nestedSetRight < 9 }": [["POST /pay", "charge card", "SELECT orders"]],
}


@pytest.mark.parametrize("q", list(FILTERS))
def test_spanset_filters(q: str) -> None:
    assert found(q) == FILTERS[q]


def test_ids_are_intrinsics() -> None:
    pay = BY_NAME["POST /pay"]
    assert found(f'{{ span:id = "{pay.span_id:016x}" }}') == [["POST /pay"]]
    assert found(f'{{ span:parentID = "{pay.parent_span_id:016x}" }}') == [["POST /pay"]]
    assert found(f'{{ trace:id = "{pay.trace_id}" && kind = server }}') == [
        ["GET /checkout", "POST /pay"]
    ]


# -- spanset operators ---------------------------------------------------------------------------

OPERATORS = {
    # && and || between spansets: each side must (may) find spans; both sides' spans come back.
    '{ name = "cache get" } && { status = error }': [["POST /pay", "charge card", "cache get"]],
    '{ name = "nope" } && { status = error }': [],
    '{ name = "nope" } || { status = error }': [["POST /pay", "charge card"]],
    '{ name = "cache get" } || { span.db.system = "postgresql" }': [["SELECT orders", "cache get"]],
    # Structural: the right side's spans.
    '{ resource.service.name = "frontend" } >> { status = error }': [["POST /pay", "charge card"]],
    '{ name = "POST /pay" } > { }': [["charge card", "SELECT orders"]],
    "{ kind = server } > { kind = client }": [["POST checkout", "charge card", "SELECT orders"]],
    '{ name = "GET /checkout" } > { status = error }': [],
    '{ name = "GET /checkout" } >> { status = error }': [["POST /pay", "charge card"]],
    '{ name = "charge card" } < { }': [["POST /pay"]],
    '{ name = "charge card" } << { }': [["GET /checkout", "POST checkout", "POST /pay"]],
    "{ status = error } << { kind = server }": [["GET /checkout", "POST /pay"]],
    '{ name = "charge card" } ~ { }': [["SELECT orders"]],
    "{ kind = client } ~ { kind = client }": [["charge card", "SELECT orders"]],
    '{ name = "cache get" } ~ { }': [["POST checkout"]],
    '{ name = "GET /checkout" } ~ { }': [],
    # Negations: the right side's spans without the relation.
    "{ } !< { }": [["charge card", "SELECT orders", "cache get"]],
    '{ } !< { resource.service.name = "frontend" }': [["cache get"]],
    "{ status = error } !< { status = error }": [["charge card"]],
    "{ kind = server } !> { }": [["GET /checkout", "POST /pay"]],
    '{ name = "GET /checkout" } !>> { }': [["GET /checkout"]],
    "{ status = error } !<< { }": [["charge card", "SELECT orders", "cache get"]],
    '{ name = "charge card" } !~ { kind = client }': [["POST checkout", "charge card"]],
    # Unions: both sides' spans in the relation.
    '{ name = "POST /pay" } &> { }': [["POST /pay", "charge card", "SELECT orders"]],
    '{ name = "charge card" } &< { }': [["POST /pay", "charge card"]],
    '{ name = "POST checkout" } &>> { status = error }': [
        ["POST checkout", "POST /pay", "charge card"]
    ],
    '{ name = "SELECT orders" } &<< { kind = server }': [
        ["GET /checkout", "POST /pay", "SELECT orders"]
    ],
    '{ name = "charge card" } &~ { }': [["charge card", "SELECT orders"]],
    # Precedence: structural operators bind tighter than && and ||.
    # (an error span whose parent is a server span: charge card, not POST /pay)
    '{ name = "cache get" } && { kind = server } > { status = error }': [
        ["charge card", "cache get"]
    ],
    '({ name = "nope" } && { kind = server }) > { status = error }': [],
    '{ kind = server } > { kind = client } > { span.db.system = "postgresql" }': [],
    "{ kind = server } >> ({ kind = client } > { kind = server })": [["POST /pay"]],
}


@pytest.mark.parametrize("q", list(OPERATORS))
def test_spanset_operators(q: str) -> None:
    assert found(q) == OPERATORS[q]


def test_structural_operators_ignore_a_missing_parent() -> None:
    # The client span of the frontend never arrived: POST /pay has a parent id but no parent.
    partial = [s for s in SPANS if s.name != "POST checkout"]
    assert found('{ name = "GET /checkout" } >> { status = error }', partial) == []
    assert found("{ } > { kind = server }", partial) == []
    assert found("{ } !> { kind = server }", partial) == [["GET /checkout", "POST /pay"]]
    # Its root is the span without a parent id, whatever came first.
    assert found('{ rootName = "GET /checkout" && kind = server }', partial) == [
        ["GET /checkout", "POST /pay"]
    ]


def test_a_parent_cycle_does_not_hang() -> None:
    a, b = SPANS[0], SPANS[1]
    looped = [
        a._replace(parent_span_id=b.span_id),
        b._replace(parent_span_id=a.span_id),
    ]
    assert found("{ } >> { }", looped) == [sorted([a.name, b.name], key=ALL.index)]
    assert found("{ } << { }", looped) == [sorted([a.name, b.name], key=ALL.index)]


# -- pipelines ---------------------------------------------------------------------------------


def attrs(q: str) -> List[Tuple[List[str], Dict[str, str]]]:
    return [
        ([s.name for s in ss.spans], {k: str(v) for k, v in ss.attributes.items()})
        for ss in run(parse_query(q), SPANS)
    ]


def test_count_filters_spansets_and_names_its_value() -> None:
    assert attrs("{ kind = client } | count() > 2") == [
        (["POST checkout", "charge card", "SELECT orders"], {"count()": "3"})
    ]
    assert attrs("{ kind = client } | count() > 3") == []
    assert attrs("{ kind = client } | count() = 3") == attrs("{ kind = client } | 3 = count()")
    assert attrs("{ } | count() >= 6") == [(ALL, {"count()": "6"})]
    assert attrs("count() > 5") == [(ALL, {"count()": "6"})]  # a pipeline may start with it


def test_aggregates_over_durations_and_attributes() -> None:
    # Client spans: 85, 40, 9 ms.
    assert attrs("{ kind = client } | avg(duration) > 44ms") == [
        (["POST checkout", "charge card", "SELECT orders"], {"avg(duration)": "44.666666ms"})
    ]
    assert attrs("{ kind = client } | avg(duration) > 45ms") == []
    assert attrs("{ kind = client } | max(duration) = 85ms")[0][1] == {"max(duration)": "85ms"}
    assert attrs("{ kind = client } | min(duration) < 10ms")[0][1] == {"min(duration)": "9ms"}
    assert attrs("{ kind = client } | sum(duration) = 134ms")[0][1] == {"sum(duration)": "134ms"}
    # Attributes: spans without it are left out of the aggregate.
    assert attrs("{ } | sum(span.retries) = 5")[0][1] == {"sum(span.retries)": "5"}
    assert attrs("{ } | avg(span.retries) = 2.5")[0][1] == {"avg(span.retries)": "2.5"}
    assert attrs("{ } | max(span.amount) > 12")[0][1] == {"max(span.amount)": "12.5"}
    # No span has it: no value, no spanset.
    assert attrs("{ } | avg(span.nothing) > 0") == []
    assert attrs("{ } | sum(span.http.method) > 0") == []


def test_by_splits_spansets_per_value() -> None:
    got = attrs("{ } | by(resource.service.name)")
    assert got == [
        (
            ["GET /checkout", "POST checkout", "cache get"],
            {"by(resource.service.name)": "frontend"},
        ),
        (["POST /pay", "charge card", "SELECT orders"], {"by(resource.service.name)": "checkout"}),
    ]
    assert attrs("{ status = error } | by(resource.service.name) | count() > 1") == [
        (
            ["POST /pay", "charge card"],
            {"by(resource.service.name)": "checkout", "count()": "2"},
        )
    ]
    by_kind = attrs("{ } | by(kind) | count() < 3")
    assert sorted((n, a["by(kind)"]) for n, a in by_kind) == [
        (["GET /checkout", "POST /pay"], "server"),
        (["cache get"], "internal"),
    ]
    # A span without the attribute goes to the nil group.
    nil = attrs("{ } | by(span.retries)")
    assert (
        ["GET /checkout", "POST checkout", "SELECT orders", "cache get"],
        {"by(span.retries)": "None"},
    ) in nil
    # by() of an expression.
    assert attrs("{ kind = client } | by(duration > 20ms)") == [
        (["POST checkout", "charge card"], {"by(duration > 20ms)": "True"}),
        (["SELECT orders"], {"by(duration > 20ms)": "False"}),
    ]


def test_coalesce_merges_spansets_back() -> None:
    assert attrs("{ } | by(kind) | coalesce()") == [(ALL, {})]
    assert attrs("{ } | by(kind) | count() < 3 | coalesce() | count() = 3") == [
        (["GET /checkout", "POST /pay", "cache get"], {"count()": "3"})
    ]


def test_chained_pipelines_and_filters_after_a_pipe() -> None:
    assert attrs("{ kind = client } | { status = error } | count() = 1") == [
        (["charge card"], {"count()": "1"})
    ]
    assert attrs("{ } | by(resource.service.name) | { status = error } | count() = 2") == [
        (["POST /pay", "charge card"], {"by(resource.service.name)": "checkout", "count()": "2"})
    ]
    assert attrs('({ kind = client } | count() > 2) && { name = "cache get" }') == [
        (["POST checkout", "charge card", "SELECT orders", "cache get"], {})
    ]


def test_select_keeps_spansets_and_lists_what_to_show() -> None:
    q = parse_query("{ status = error } | select(span.http.status_code, resource.service.name)")
    assert names(run(q, SPANS)) == [["POST /pay", "charge card"]]
    assert [a.text for a in q.shown] == ["status", "span.http.status_code", "resource.service.name"]


def test_spanset_operators_refuse_several_spansets() -> None:
    with pytest.raises(QueryError, match="coalesce"):
        run(parse_query("({ } | by(kind)) > { }"), SPANS)
    # One spanset per side is fine, whatever by() did before the operator.
    assert found("({ } | by(kind) | count() = 3) > { }") == [["POST /pay"]]


def test_empty_input_finds_nothing() -> None:
    assert run(parse_query("{ }"), []) == []
    assert run(parse_query("{ } | count() >= 0"), []) == []


# -- the parse: what search and metrics read of it ---------------------------------------------


def test_simple_queries_keep_the_sql_path() -> None:
    for q in ['{ name = "a" }', '{ name = "a" } && { status = error }', "{}", "{traceDuration>1s}"]:
        assert parse_query(q).simple == parse_traceql(q)
    for q in [
        '{ name = "a" } || { name = "b" }',
        '{ name = "a" } > { }',
        "{ } | count() > 1",
        "{ } | select(span.x)",
        '{ name = "a" || name = "b" }',
        "{ } | rate()",
    ]:
        assert parse_query(q).simple is None, q


PUSHDOWN = {
    "{ }": (),
    '{ name = "a" && span.x > 3 }': (Condition("name", "=", "a"), Condition("span.x", ">", 3)),
    "{ status = error && kind != client && duration >= 1.5s }": (
        Condition("status", "=", "error"),
        Condition("kind", "!=", "client"),
        Condition("duration", ">=", 1_500_000_000),
    ),
    '{ resource.service.name =~ "a.*" && .http.method = "GET" && span.ok = true }': (
        Condition("resource.service.name", "=~", "a.*"),
        Condition(".http.method", "=", "GET"),
        Condition("span.ok", "=", True),
    ),
    "{ 3 < span.x }": (Condition("span.x", ">", 3),),
    # Not a conjunction of simple conditions: nothing to push.
    '{ name = "a" || name = "b" }': (),
    '{ !(name = "a") }': (),
    "{ span.x = nil }": (),
    "{ span.x + 1 > 2 }": (),
    # Trace-wide: not a span's condition.
    '{ traceDuration > 1s && name = "a" }': (Condition("name", "=", "a"),),
    # Both sides needed: the side with more conditions; a negation: the right side's.
    '{ name = "a" } >> { status = error && kind = client }': (
        Condition("status", "=", "error"),
        Condition("kind", "=", "client"),
    ),
    '{ name = "a" && kind = server } && { status = error }': (
        Condition("name", "=", "a"),
        Condition("kind", "=", "server"),
    ),
    '{ name = "a" && kind = server } !< { status = error }': (Condition("status", "=", "error"),),
    # ||: what both sides share.
    '{ kind = server && name = "a" } || { kind = server }': (Condition("kind", "=", "server"),),
    # ||: the alternative both sides share (Traces Drilldown's structure tab: root spans).
    '({ name = "a" } &>> { kind = server }) || ({ name = "a" }) | select(status)': (
        Condition("name", "=", "a"),
    ),
    '({ kind = server } > { name = "a" && status = error }) || { name = "a" }': (
        Condition("name", "=", "a"),
    ),
    # Pipelines: the first stage.
    '{ name = "a" } | by(kind) | count() > 2': (Condition("name", "=", "a"),),
    "{ status = error } | rate() by (resource.service.name)": (Condition("status", "=", "error"),),
}


@pytest.mark.parametrize("q", list(PUSHDOWN))
def test_pushdown(q: str) -> None:
    assert parse_query(q).pushdown == PUSHDOWN[q]


def test_pushdown_never_loses_a_span_the_engine_finds() -> None:
    from hotspan.query.traceql import compile_field

    for q in list(FILTERS) + list(OPERATORS):
        query = parse_query(q)
        if query.needs_traces:
            continue
        pushed = [s for s in SPANS if all(_meets(s, c) for c in query.pushdown)]
        assert names(run(query, pushed)) == names(run(query, SPANS)), q
    assert compile_field  # the engine's own comparisons decide _meets below


def _meets(span: SpanRecord, cond: Condition) -> bool:
    # What the stores do with a pushed condition, by the engine's rules.
    from hotspan.query.traceql import compare

    if cond.key == "span:parentID":  # the stores compare the parent's id as a number
        wanted = int(str(cond.value), 16)
        return (span.parent_span_id == wanted) == (cond.op == "=")
    value = span_value(span, cond.key)
    if value is None:
        return False
    literal: object = cond.value
    if cond.key in ("status", "kind"):
        literal = (traceql.Status if cond.key == "status" else traceql.Kind)(str(cond.value))
        value = type(literal)(value)  # type: ignore[call-arg]
    elif cond.key == "duration":
        literal = traceql.Duration(int(cond.value))
    elif isinstance(value, str) and cond.key.startswith(("span.", "resource.", ".")):
        value = traceql.Text(value)
    elif isinstance(value, bool):  # stored as its text, as the stores compare it
        value = traceql.Text("true" if value else "false")
    elif cond.key.startswith(("span.", "resource.", ".")):
        value = traceql.Text(str(value))
    return compare(cond.op, value, literal)


NEEDS_TRACES = {
    "{ }": False,
    '{ name = "a" } | select(span.x)': False,
    '{ name = "a" } | by(kind)': False,
    "{ span.x = nil || !(kind = server) }": False,
    '{ name = "a" } && { }': True,
    '{ name = "a" } > { }': True,
    "{ } | count() > 1": True,
    "{ traceDuration > 1s }": True,
    '{ rootServiceName = "a" }': True,
    "{ span:childCount > 1 }": True,
    "{ } | rate()": False,
    # The root test needs only the span; other nested set values need the trace.
    "{ nestedSetParent < 0 && true }": False,
    "{ nestedSetParent != -1 }": False,
    "{ nestedSetParent < 1 }": True,
    "{ nestedSetParent > 0 }": True,
    "{ nestedSetLeft = 1 }": True,
}


@pytest.mark.parametrize("q", list(NEEDS_TRACES))
def test_needs_traces(q: str) -> None:
    assert parse_query(q).needs_traces is NEEDS_TRACES[q]


def test_shown_attributes_are_those_the_query_names() -> None:
    q = parse_query(
        '{ span.http.method = "GET" && status = error && name = "x" && duration > 1s } '
        "| by(resource.service.name) | avg(span.size) > 2 "
        "| select(span.http.url, kind, .http.method)"
    )
    assert [a.text for a in q.shown] == [
        "span.http.method",
        "status",
        "resource.service.name",
        "span.size",
        "span.http.url",
        "kind",
        ".http.method",
    ]
    assert parse_query('{ trace:id = "ab" && span:id = "cd" && traceDuration > 1s }').shown == ()


METRICS = {
    "{ } | rate()": MetricsStage("rate", None, (), ()),
    "{ status = error } | rate() by (resource.service.name)": MetricsStage(
        "rate", None, (), ("resource.service.name",)
    ),
    "{ } | count_over_time() by (resource.service.name, span.http.route)": MetricsStage(
        "count_over_time", None, (), ("resource.service.name", "span.http.route")
    ),
    "{ } | quantile_over_time(duration, .5, .9, 0.99, 1)": MetricsStage(
        "quantile_over_time", "duration", (0.5, 0.9, 0.99, 1.0), ()
    ),
    "{ kind = server } | histogram_over_time(duration) by (span:name)": MetricsStage(
        "histogram_over_time", "duration", (), ("span:name",)
    ),
    "{ } | min_over_time(span.http.response_size)": MetricsStage(
        "min_over_time", "span.http.response_size", (), ()
    ),
    "{ } | max_over_time(span:duration) by (.x)": MetricsStage(
        "max_over_time", "span:duration", (), (".x",)
    ),
    "{ } | avg_over_time(duration) by (name)": MetricsStage(
        "avg_over_time", "duration", (), ("name",)
    ),
    '{ } | sum_over_time(span."weird name") by (resource.k8s.namespace.name)': MetricsStage(
        "sum_over_time", 'span."weird name"', (), ("resource.k8s.namespace.name",)
    ),
    "{ } | rate() by (resource.service.name) | topk(10)": MetricsStage(
        "rate", None, (), ("resource.service.name",), (("topk", 10),)
    ),
    "{ } | count_over_time() | bottomk(2)": MetricsStage(
        "count_over_time", None, (), (), (("bottomk", 2),)
    ),
}


@pytest.mark.parametrize("q", list(METRICS))
def test_metrics_stage(q: str) -> None:
    query = parse_query(q)
    assert query.metrics == METRICS[q]
    assert query.simple is None


def test_metrics_query_runs_its_spanset_part() -> None:
    q = parse_query("{ status = error } | rate() by (resource.service.name)")
    assert names(run(q, SPANS)) == [["POST /pay", "charge card"]]
    for span in run(q, SPANS)[0].spans:
        assert span_value(span, q.metrics.by[0]) == "checkout"  # type: ignore[union-attr]


DRILLDOWN_COMPARE = "{nestedSetParent<0 && true} | compare({status = error}, 10, START, END)"


def test_compare_reads_the_selection_top_n_and_window() -> None:
    from hotspan.query.traceql import in_selection, matches

    # As Traces Drilldown's comparison tab sends it (its selection window in unix ns).
    start, end = BASE + 15 * MS, BASE + 80 * MS
    query = parse_query(DRILLDOWN_COMPARE.replace("START", str(start)).replace("END", str(end)))
    stage = query.metrics
    assert stage is not None and stage.function == "compare"
    assert (stage.top_n, stage.compare_start_ns, stage.compare_end_ns) == (10, start, end)
    assert str(stage.compare_filter) == "(status = error)"
    assert query.pushdown == (Condition("span:parentID", "=", "0000000000000000"),)
    assert not query.needs_traces
    errors = sorted(s.name for s in SPANS if matches(stage.compare_filter, s))
    assert errors == ["POST /pay", "charge card"]
    # The window: start < span start <= end (POST /pay starts at 10 ms, charge card at 20).
    assert [s.name for s in SPANS if in_selection(stage, s)] == ["charge card"]
    # Defaults as Tempo's grammar: topN 10, no window; 0, 0 is no window.
    plain = parse_query("{ } | compare({ span.http.status_code >= 500 })").metrics
    assert plain is not None and (plain.top_n, plain.compare_start_ns) == (10, None)
    assert [s.name for s in SPANS if in_selection(plain, s)] == ["POST /pay"]
    zero = parse_query("{ } | compare({ kind = client }, 3, 0, 0)").metrics
    assert zero is not None and (zero.top_n, zero.compare_end_ns) == (3, None)
    # Trace-wide intrinsics in the selection need the trace (then the query says so).
    wide = parse_query('{ } | compare({ rootName = "GET /checkout" && kind = client })')
    assert wide.needs_traces
    selection = wide.metrics.compare_filter  # type: ignore[union-attr]
    assert not any(matches(selection, s) for s in SPANS)
    assert sorted(s.name for s in SPANS if matches(selection, s, SPANS)) == [
        "POST checkout",
        "SELECT orders",
        "charge card",
    ]


@pytest.mark.parametrize(
    "q,message",
    [
        ("{ } | compare(status = error)", "takes a spanset filter first"),
        ("{ } | compare({ } > { })", "closing compare("),
        ("{ } | compare({ }, 10, 5)", "then optionally start and end"),
        ("{ } | compare({ }, 0)", "topN must be positive"),
        ("{ } | compare({ }, 10, 20, 10)", "end must be after its start"),
        ("{ } | compare({ }, 10, 0, 10)", "positive unix nanoseconds"),
        ('{ } | compare({ name =~ "(" })', "invalid regular expression"),
        ("{ } | compare({ name = 5 })", "name is a string"),
        ("{ } | compare({ }, 1.5)", "takes integers"),
    ],
)
def test_compare_errors(q: str, message: str) -> None:
    with pytest.raises(QueryError, match=re.escape(message)):
        parse_query(q)


def test_hints_are_read() -> None:
    q = parse_query("{ } with (most_recent=true, sample=0.1)")
    assert q.hints == (("most_recent", True), ("sample", 0.1))
    assert q.simple is None or q.simple == ((((),), ()))


def test_quoted_attribute_names_and_strings() -> None:
    q = parse_query('{ span."http status" = "a\\"b" && span.x."y z" = `raw\\n` }')
    assert q.pushdown == (
        Condition("span.http status", "=", 'a"b'),
        Condition("span.x.y z", "=", "raw\\n"),
    )
    assert [a.text for a in q.shown] == ['span."http status"', 'span."x.y z"']


# -- span_value ----------------------------------------------------------------------------------

VALUES = {
    ("GET /checkout", "name"): "GET /checkout",
    ("GET /checkout", "span:name"): "GET /checkout",
    ("POST /pay", "status"): "error",
    ("GET /checkout", "span:status"): "unset",
    ("charge card", "kind"): "client",
    ("cache get", "span:kind"): "internal",
    ("GET /checkout", "duration"): 100 * MS,
    ("charge card", "span:duration"): 40 * MS,
    ("GET /checkout", "span.http.status_code"): 200,
    ("GET /checkout", ".http.method"): "GET",
    ("charge card", "span.amount"): 12.5,
    ("cache get", "span.cache.hit"): True,
    ("charge card", "resource.service.name"): "checkout",
    ("charge card", ".service.name"): "checkout",
    ("charge card", "resource.deployment.environment"): "prod",
    ("charge card", ".deployment.environment"): "prod",
    ("charge card", "span.deployment.environment"): None,
    ("charge card", "span.nothing"): None,
    ("GET /checkout", "span:parentID"): None,
}


@pytest.mark.parametrize("name,key", list(VALUES))
def test_span_value(name: str, key: str) -> None:
    assert span_value(BY_NAME[name], key) == VALUES[(name, key)]


def test_span_value_of_trace_wide_intrinsics_needs_the_trace() -> None:
    span = BY_NAME["charge card"]
    assert span_value(span, "rootName") is None
    assert span_value(span, "rootName", SPANS) == "GET /checkout"
    assert span_value(span, "trace:rootService", SPANS) == "frontend"
    assert span_value(span, "traceDuration", SPANS) == 100 * MS
    assert span_value(BY_NAME["POST /pay"], "span:childCount", SPANS) == 2
    assert span_value(span, "trace:id") == span.trace_id
    assert span_value(span, "span:id") == f"{span.span_id:016x}"


def test_nested_set_numbers_the_trace_as_tempo() -> None:
    # Depth first from the root, siblings in start order: left on the way down, right on
    # the way up; the parent is the parent's left, -1 for the root.
    expected = {
        "GET /checkout": (1, 12, -1),
        "POST checkout": (2, 9, 1),
        "POST /pay": (3, 8, 2),
        "charge card": (4, 5, 3),
        "SELECT orders": (6, 7, 3),
        "cache get": (10, 11, 1),
    }
    keys = ("nestedSetLeft", "nestedSetRight", "nestedSetParent")
    got = {s.name: tuple(span_value(s, k, SPANS) for k in keys) for s in SPANS}
    assert got == expected
    # Spans cut off from the root (their parent never arrived) are 0, as in Tempo.
    broken = [s for s in SPANS if s.name != "POST checkout"]
    got = {s.name: tuple(span_value(s, k, broken) for k in keys) for s in broken}
    assert got["POST /pay"] == got["charge card"] == (0, 0, 0)
    assert got["GET /checkout"] == (1, 4, -1) and got["cache get"] == (2, 3, 1)
    assert found("{ nestedSetParent = 0 }", broken) == [
        ["POST /pay", "charge card", "SELECT orders"]
    ]
    # A root is known without its trace; the rest needs it.
    assert span_value(BY_NAME["GET /checkout"], "nestedSetParent") == -1
    assert span_value(BY_NAME["POST /pay"], "nestedSetParent") is None
    assert span_value(BY_NAME["GET /checkout"], "nestedSetLeft") is None


def test_root_spans_are_one_store_condition() -> None:
    root = Condition("span:parentID", "=", "0000000000000000")
    for q in [
        "{ nestedSetParent < 0 && true }",
        "{ nestedSetParent <= -1 }",
        "{ 0 > nestedSetParent }",
    ]:
        assert parse_query(q).pushdown == (root,), q
    assert parse_query("{ nestedSetParent < 0 }").simple == (((root,),), ())
    assert parse_query("{ nestedSetParent > -1 }").pushdown == (
        Condition("span:parentID", "!=", "0000000000000000"),
    )
    query = parse_query("{ nestedSetParent < 0 && true } | rate() by (resource.service.name)")
    assert query.pushdown == (root,) and not query.needs_traces
    for q in ["{ nestedSetParent < 1 }", "{ nestedSetParent = 2 }", "{ nestedSetLeft > 0 }"]:
        assert parse_query(q).pushdown == () and parse_query(q).simple is None, q


def test_literal_comparisons_compile_to_what_compare_decides() -> None:
    # Comparisons with a literal skip compare()'s type dispatch per span: same answers.
    # The compiled fast path is internal to the engine: its own module is tested.
    from hotspan.query.traceql import compare, compile_field
    from hotspan.query.traceql.fields import _compare_static
    from hotspan.query.traceql.trace_view import TraceView

    attrs = ["span.http.status_code", "span.http.method", "span.cache.hit", "span.amount"]
    attrs += ["name", "duration", "status", "kind", "span.nothing", "childCount", "span:id"]
    literals = [200, 12.5, "GET", "200", "true", True, traceql.Duration(40 * MS), -1]
    literals += [traceql.Status("error"), traceql.Status("unset"), traceql.Kind("client"), "error"]
    trace = TraceView(SPANS)
    checked = 0
    for key in attrs:
        attr = parse_query(f"{{ {key} != nil }}").root.expr.expr  # type: ignore[attr-defined]
        get = compile_field(attr)
        for literal in literals:
            for op in ("=", "!=", "<", "<=", ">", ">=", "=~", "!~"):
                for expr in (traceql.Binary(op, attr, traceql.Static(literal)),):
                    fast = _compare_static(expr)
                    if fast is None:
                        continue
                    for span in SPANS:
                        want = compare(op, get(span, trace), literal)
                        assert fast(span, trace) == want, (key, op, literal, span.name)
                        checked += 1
    assert checked > 3000


def test_evaluating_a_parsed_query_compiles_nothing() -> None:
    from hotspan.query.traceql import compile_field

    query = parse_query(
        '{ resource.service.name = "checkout" } >> { status = error } | by(kind) | count() > 0'
    )
    assert len(query.plan) == 3  # two filters, by()'s expression
    before = compile_field.cache_info()
    got = [names(run(query, SPANS)) for _ in range(3)]
    after = compile_field.cache_info()
    assert after.hits + after.misses == before.hits + before.misses
    assert got[0] == [["charge card"]]  # by(kind): client
    # A bare syntax tree still runs (compiled through the cache), alike.
    assert names(run(query.root, SPANS)) == got[0]


def test_span_value_refuses_what_is_not_an_identifier() -> None:
    with pytest.raises(QueryError):
        span_value(SPANS[0], "span.x = 1")
    with pytest.raises(QueryError):
        span_value(SPANS[0], "parent.x")
    # Tempo's intrinsics of what search does not read: nil, not an error.
    assert span_value(SPANS[0], "event:name") is None
    # Only bytes the stored OTLP span must hold narrow such a query's spans in the store.
    raw = (Condition("raw:span", "=", b"x".hex().upper()),)
    assert parse_query('{ event.exception.message = "x" }').pushdown == raw
    assert parse_query('{ event.exception.message != "x" }').pushdown == ()


# -- errors --------------------------------------------------------------------------------------

ERRORS = {
    "": "expected a query",
    "{ name = }": "expected a value, an attribute or an intrinsic at column 10",
    '{ name = "a" ': "expected '}' or an operator at column 14, found the end of the query",
    'name = "a"': "a condition goes inside a spanset filter { }",
    "{ span. = 1 }": "attribute name is missing at column 3",
    "{ foo = 1 }": "unknown identifier 'foo' at column 3",
    "{ name = GET }": "unknown identifier 'GET'",
    '{ span:nonsense = "x" }': "unknown intrinsic 'span:nonsense'",
    "{ } | count() + 1 > 2": "arithmetic on aggregates is not supported",
    "{ } | count()": "expected a comparison",
    "{ } | count(duration) > 1": "count() takes no argument",
    "{ } | avg() > 1": "expected a value",
    "{ } | quantile_over_time(duration)": "quantiles",
    "{ } | quantile_over_time(duration, 2)": "between 0 and 1",
    "{ } | topk(5)": "topk() goes after a metrics function",
    "{ } | rate() | topk(0)": "topk() takes a positive integer",
    "{ } | rate() | count() > 1": "expected topk(n) or bottomk(n)",
    '{ name =~ "(" }': "invalid regular expression '('",
    "{ span.x > nil }": "nil compares only with = and !=",
    "{ } | by()": "expected a value",
    "{ } | select()": "expected an attribute",
    '{ "abc }': "cannot read",
    "{ } )": "unbalanced ')'",
    "{ } {": "expected '|', an operator or the end of the query",
    '{ duration > "long" }': 'duration is a duration, it cannot compare with "long"',
    "{ name = 5 }": "name is a string, it cannot compare with 5",
    "{ status = fast }": "unknown identifier 'fast'",
    '{ status = "fast" }': 'status is a status, it cannot compare with "fast"',
    "{ kind = error }": "kind is a kind, it cannot compare with error",
    "{ 1 }": "is not a condition",
    "{ name }": "{ name } is not a condition",
    "{ span:status }": "is not a condition",
    '{ "" = 1 }': "compares a string with a number",
    "{ } | avg(name) > 1": "avg() reads a number; name is not one",
    "{ } | sum(status) > 1": "sum() reads a number; status is not one",
    "{ } | quantile_over_time(name, .5)": "quantile_over_time() reads a number",
    "{ } | histogram_over_time(kind)": "histogram_over_time() reads a number",
    "{ } | sum_over_time(rootName)": "sum_over_time() reads a number",
    "{ duration > 1e400 }": "out of range",
    '{ span."unterminated = 1 }': "unterminated quote",
    '{ name = "\\q" }': "unknown escape",
    "{ } | coalesce(1)": "coalesce() takes no argument",
    "{ } with (most_recent)": "expected '='",
}


@pytest.mark.parametrize("q", list(ERRORS))
def test_errors_say_what_and_where(q: str) -> None:
    with pytest.raises(QueryError) as caught:
        parse_query(q)
    assert ERRORS[q] in str(caught.value)
    assert str(caught.value).startswith("TraceQL: ")


def test_durations_print_as_go_does() -> None:
    cases = {
        0: "0s",
        999: "999ns",
        1_500: "1.5µs",
        1_500_000: "1.5ms",
        44_666_666: "44.666666ms",
        1_000_000_000: "1s",
        90 * 10**9: "1m30s",
        3_600 * 10**9 + 1: "1h0m0.000000001s",
        -2_000_000: "-2ms",
    }
    assert {ns: str(traceql.Duration(ns)) for ns in cases} == cases


def test_duration_units_as_tempo_reads_them() -> None:
    units = {"1h30m": 5400 * 10**9, "1.5s": 1_500_000_000, "2d": 2 * 86400 * 10**9}
    units.update({"250us": 250_000, "250µs": 250_000, "1w": 7 * 86400 * 10**9})
    # Go's time.ParseDuration (Tempo's fallback) reads a leading or trailing dot too.
    units.update({".5s": 500_000_000, "1.s": 10**9, "1h1.5m": 3690 * 10**9})
    for text, ns in units.items():
        assert parse_query(f"{{ duration > {text} }}").pushdown == (Condition("duration", ">", ns),)


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    for q in ["{" + "(" * 3000 + "true" + ")" * 3000 + "}", "(" * 3000 + "{}" + ")" * 3000]:
        with pytest.raises(QueryError, match="nested too deeply"):
            parse_query(q)
    # Many conditions are fine.
    many = "{ " + " && ".join(["kind = client"] * 200) + " }"
    assert found(many) == [["POST checkout", "charge card", "SELECT orders"]]
    # Many attributes are a reason, not seconds of the store's planning per query.
    parse_query("{ " + " && ".join(f'span.a{i} = "x"' for i in range(64)) + " }")
    with pytest.raises(QueryError, match="names 65 attributes"):
        parse_query("{ " + " && ".join(f'.a{i} = "x"' for i in range(65)) + " }")


def test_attribute_text_reads_as_a_number_only_when_it_is_one() -> None:
    spans = [
        BY_NAME["GET /checkout"]._replace(
            attrs=flatten_attributes([("a", "1_000"), ("b", " 12"), ("c", "1e3", "float")])
        )
    ]
    assert found("{ span.a = 1000 }", spans) == []
    assert found('{ span.a = "1_000" }', spans) == [["GET /checkout"]]
    assert found("{ span.b = 12 }", spans) == []
    assert found("{ span.c = 1000 }", spans) == [["GET /checkout"]]
    assert span_value(spans[0], "span.c") == 1000.0 and span_value(spans[0], "span.a") == "1_000"


def test_wide_and_deep_traces_stay_linear() -> None:
    # Quadratic work would take tens of seconds here; linear work takes milliseconds.
    trace_id = "ab" * 16

    def span(i: int, parent: int) -> SpanRecord:
        return SpanRecord(trace_id, i, parent, f"s{i}", 3, "svc", i, i + 5, 0, "", "")

    wide = [span(1, 0)] + [span(i, 1) for i in range(2, 20_002)]
    deep = [span(1, 0)] + [span(i, i - 1) for i in range(2, 8_002)]
    cases = [
        (wide, "{ } &~ { }", 20_000),
        (wide, "{ } ~ { }", 20_000),
        (wide, "{ } &< { }", 20_001),
        (deep, '{ name = "s1" } >> { }', 8_000),
        (deep, '{ name = "s1" } &>> { }', 8_001),
        (deep, '{ } &<< { name = "s8001" }', 0),
        (deep, '{ name = "s8001" } << { }', 8_000),
        (deep, '{ name = "s8001" } &<< { }', 8_001),
    ]
    for spans, q, count in cases:
        started = time.monotonic()
        got = run(parse_query(q), spans)
        assert sum(len(ss.spans) for ss in got) == count, q
        assert time.monotonic() - started < 3, q


def test_parse_duration_reads_what_go_reads() -> None:
    # Go's time.ParseDuration, which Tempo reads minDuration/maxDuration with.
    ok = {".5s": 500_000_000, "1.s": 10**9, "0": 0, "-1.5ms": -1_500_000, "+2m": 120 * 10**9}
    ok.update({"1μs": 1_000, "1µs": 1_000, "2h45m0.5s": 9_900_500_000_000, "300ms": 300 * MS})
    assert {text: parse_duration(text) for text in ok} == ok
    for bad in ["", ".", ".s", "1", "s", "1d", "1x", "0s0", "--1s", "1 s"]:
        with pytest.raises(QueryError, match="invalid duration"):
            parse_duration(bad)
    # TraceQL's lexer reads its durations with it, adding days and weeks.
    assert parse_duration("1d", {"d": 86400 * 10**9}) == 86400 * 10**9


def test_query_size_is_bounded() -> None:
    with pytest.raises(QueryError, match="pipeline stages"):
        parse_query("{ }" + " | count() > 0" * 33)
    parse_query("{ }" + " | count() > 0" * 31)
    with pytest.raises(QueryError, match="parts, more than"):
        parse_query("{ " + " && ".join(["kind = client"] * 300) + " }")
    with pytest.raises(QueryError):
        parse_query("{ }" + " | count() > 0" * 2000)


# -- the engine search's bounds (a real DuckDB store) ---------------------------------------------


def _search_store(tmp_path, traces: Dict[str, int]):  # type: ignore[no-untyped-def]
    """A DuckDB store holding, per trace id, a root and that many children."""
    from hotspan.store.duckdb import DuckDBStore
    from tests.store_contract import SEC, spans_of

    store = DuckDBStore(str(tmp_path / "data"))
    rows = []
    for n, (trace_id, children) in enumerate(traces.items()):
        rows.append((trace_id, 1, 0, "root", 100 + n, 200 + n, {}))
        rows += [(trace_id, 2 + i, 1, f"child{i}", 101 + n, 102 + n, {}) for i in range(children)]
    store.write_spans("t", spans_of(rows)).result(timeout=30)
    return store, SEC


def test_search_stops_at_its_span_budget_and_deadline(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from hotspan.query import trace_search
    from hotspan.query.trace_search import SearchParams, search

    count = 2 * trace_search.TRACES_PER_BATCH + 50
    store, sec = _search_store(tmp_path, {f"{i + 1:032x}": 2 for i in range(count)})
    try:
        query = parse_query('{ name = "root" } >> { }')
        params = SearchParams(0, 1000 * sec, limit=10_000, spans_per_spanset=1)
        full = search(store, "t", params, query)
        assert len(full["traces"]) == count
        assert full["metrics"]["inspectedTraces"] == count
        assert "additionalMetrics" not in full["metrics"]
        # The candidates (one root per trace) and the first batch's whole traces exceed it.
        per_batch = trace_search.TRACES_PER_BATCH * 3
        budget = count + per_batch - 1
        part = search(store, "t", replace(params, max_spans=budget), query)
        assert part["metrics"]["inspectedTraces"] == trace_search.TRACES_PER_BATCH
        assert part["metrics"]["inspectedSpans"] == str(per_batch)
        assert part["metrics"]["additionalMetrics"] == {"partial": "1", "spanBudgetExceeded": "1"}
        assert len(part["traces"]) == trace_search.TRACES_PER_BATCH
        late = search(store, "t", replace(params, deadline_s=0.0), query)
        assert late["metrics"]["additionalMetrics"] == {"partial": "1", "deadlineExceeded": "1"}
        assert late["metrics"]["inspectedTraces"] == 0 and "traces" not in late
    finally:
        store.close()


def test_search_never_judges_a_trace_it_read_in_part(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from hotspan.query import trace_search
    from hotspan.query.trace_search import SearchParams, search

    small, big, other = "a" * 32, "b" * 32, "c" * 32
    store, sec = _search_store(tmp_path, {small: 2, big: 6, other: 2})
    monkeypatch.setattr(trace_search, "MAX_SPANS_PER_BATCH", 5)
    try:
        # The batch (13 spans) is cut: read again trace by trace; the 7-span one is still cut.
        got = search(store, "t", SearchParams(0, 1000 * sec, limit=20), parse_query("{ } >> { }"))
        assert sorted(t["traceID"] for t in got["traces"]) == [small, other]
        assert got["metrics"]["additionalMetrics"] == {"tracesTooLarge": "1"}
        assert got["metrics"]["inspectedSpans"] == "6"
    finally:
        store.close()


def test_attributes_typed_from_the_index_text_as_from_the_raw_spans(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Only the first RAW_TYPED_TRACES traces of an answer read their raw spans: the others'
    # values, typed from the span index's text, must come out the same.
    from hotspan.query import trace_search
    from hotspan.query.trace_search import SearchParams, search
    from hotspan.store.duckdb import DuckDBStore

    shop = Shop()
    for i in range(3):
        attributes = {"http.status_code": 200 + i, "cache.hit": i % 2 == 0, "ratio": 0.5 + i}
        root = shop.span(
            "frontend",
            "GET /x",
            i * 100,
            i * 100 + 50,
            None,
            SpanKind.SERVER,
            # A string that reads as a number stays a string, from the index too.
            {**attributes, "http.route": f"/r{i}", "build": str(40 + i)},
        )
        shop.span("backend", "db", i * 100 + 1, i * 100 + 9, root, SpanKind.CLIENT, {"db.rows": i})
    store = DuckDBStore(str(tmp_path / "data"))
    batch = to_span_batch(encode_spans(shop.memory.get_finished_spans())).batch
    store.write_spans("t", batch).result(timeout=30)
    params = SearchParams(BASE - 10**9, BASE + 10 * 10**9, limit=20, spans_per_spanset=5)
    queries = [
        "{span.http.status_code >= 200 && span.ratio > 0 && .cache.hit != false}",
        "{span.http.status_code >= 200} | select(span.http.route, resource.deployment.environment)",
        '{span.build != "x"} | select(span.build)',
        "{kind = server} > {kind = client} | select(span.db.rows, childCount, nestedSetLeft)",
    ]
    try:
        typed = [search(store, "t", params, parse_query(q)) for q in queries]
        monkeypatch.setattr(trace_search, "RAW_TYPED_TRACES", 0)
        for q, want in zip(queries, typed):
            assert search(store, "t", params, parse_query(q)) == want, q
        first = typed[0]["traces"][0]["spanSet"]["spans"][0]["attributes"]
        assert [list(a["value"]) for a in first] == [["intValue"], ["doubleValue"], ["boolValue"]]
        build = typed[2]["traces"][0]["spanSet"]["spans"][0]["attributes"]
        assert [a["value"] for a in build] == [{"stringValue": "42"}]
        db = typed[3]["traces"][0]["spanSet"]["spans"][0]["attributes"]
        assert [a["key"] for a in db] == ["kind", "db.rows", "childCount", "nestedSetLeft"]
    finally:
        store.close()
