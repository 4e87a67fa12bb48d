"""ClickHouse's trace search (``store/search_sql.py``, its ClickHouse dialect) run by
ClickHouse's own engine.

chdb is ClickHouse in process.  The spans are written to it (the ClickHouse store's two tables)
and to a DuckDB store; each search's SQL is bound as clickhouse-connect binds it on the client
and run by chdb, and its rows must be the DuckDB store's, row for row.  The searches are those
of ``store_contract`` and of the Tempo API tests, and cases at the edges (numbers DuckDB reads
oddly, regular expressions, ids, retried exports, roots that never arrived).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from hotspan.model.trace import (
    Condition,
    SearchError,
    SpanBatch,
    SpanGroup,
    SpanWriteRow,
    TraceQuery,
    TraceSummary,
    flatten_attributes,
)
from hotspan.query.traceql import legacy_query, parse_duration, parse_logfmt, parse_traceql
from hotspan.store.clickhouse_schema import _span_attr_rows as span_attr_rows
from hotspan.store.duckdb import DuckDBStore
from hotspan.store.search_sql import CLICKHOUSE, search_sql
from tests import traceql_cases
from tests.store_contract import TRACE_A, TRACE_B, spans_of

chdb_session = pytest.importorskip(
    "chdb.session", reason="chdb (ClickHouse's engine, in process) is not installed"
)
binding = pytest.importorskip(
    "clickhouse_connect.driver.binding", reason="clickhouse-connect is not installed"
)


SEC = 10**9
MS = 10**6
BASE = 1_700_000_000 * SEC
INTERNAL, SERVER, CLIENT = 1, 2, 3
OK, ERROR = 1, 2

# The lead's schema of the ClickHouse store.
SCHEMA = [
    """CREATE TABLE spans (
        tenant LowCardinality(String), trace_id String, span_id UInt64, parent_span_id UInt64,
        name LowCardinality(String), kind Int8, service LowCardinality(String), start_ns Int64,
        end_ns Int64, status_code Int8, attrs String, group_id Int64, raw String
    ) ENGINE = MergeTree PARTITION BY toDate(intDiv(start_ns, 1000000000))
    ORDER BY (tenant, service, start_ns)""",
    """CREATE TABLE span_groups (
        group_id Int64, service LowCardinality(String), resource String,
        resource_schema_url String, scope String, scope_schema_url String, attrs String
    ) ENGINE = ReplacingMergeTree ORDER BY group_id""",
    """CREATE TABLE span_attrs (
        tenant LowCardinality(String), key LowCardinality(String), value String,
        start_ns Int64, end_ns Int64, trace_id String, span_id UInt64
    ) ENGINE = MergeTree ORDER BY (tenant, key, value, start_ns)""",
]

Span = Tuple[str, int, int, str, int, int, int, int, Dict[str, str]]


def batch(service: str, resource: Dict[str, str], spans: Sequence[Span]) -> SpanBatch:
    """spans: (trace id, span id, parent id, name, kind, status, start, end, attributes), the
    times in milliseconds after BASE."""
    out = SpanBatch()
    res = {"service.name": service, **resource}
    gid = out.add_group(
        SpanGroup(service, repr(res).encode(), "", b"scope", "", flatten_attributes(res.items()))
    )
    for trace, span, parent, name, kind, status, start, end, attrs in spans:
        out.rows.append(
            SpanWriteRow(
                trace,
                span,
                parent,
                name,
                kind,
                service,
                BASE + start * MS,
                BASE + end * MS,
                status,
                flatten_attributes(attrs.items()),
                gid,
                f"raw-{span}".encode(),
            )
        )
    return out


# -- the spans -------------------------------------------------------------------------------


def contract_batches() -> List[SpanBatch]:
    """store_contract's two traces (tenant "t")."""
    return [
        spans_of(
            [
                (TRACE_A, 1, 0, "GET /pay", 100, 103, {"http.route": "/pay"}),
                (TRACE_A, 2, 1, "charge", 100, 102, {"db": "pg"}),
                (TRACE_A, 3, 2, "sql", 101, 102, {"db": "pg", "rows": "7"}),
            ]
        ),
        spans_of(
            [(TRACE_B, 9, 0, "GET /home", 200, 200, {"http.route": "/home"})],
            service="web",
            resource_attrs={"region": "eu"},
        ),
    ]


# test_traces_api's five traces (tenant "search"), with the texts its SDK spans are stored as.
T = {f"T{i}": f"{i:x}" * 4 + "0000000000000000000000000000" for i in range(1, 6)}
PROD = {"deployment.environment": "prod"}
STAGING = {"deployment.environment": "staging"}
PG = {"db.system": "postgresql"}


def search_batches() -> List[SpanBatch]:
    t1, t2, t3, t4, t5 = T["T1"], T["T2"], T["T3"], T["T4"], T["T5"]
    a, b, c, d, e = (1000 * s for s in (0, 60, 120, 600, 900))  # their start, in ms
    checkout = [
        (t1, 0x11, 0, "POST /pay", SERVER, ERROR, a, a + 120, {"http.status_code": "500"}),
        (t1, 0x12, 0x11, "charge card", CLIENT, 0, a + 10, a + 90, {"payment.provider": "stripe"}),
        (t2, 0x21, 0, "GET /cart", SERVER, 0, b, b + 20, {"http.status_code": "200"}),
        (t2, 0x22, 0x21, "SELECT cart", CLIENT, 0, b + 1, b + 6, PG),
        (t5, 0x52, 0x51, "POST /pay", SERVER, 0, e + 10, e + 40, {"http.status_code": "200"}),
    ]
    inventory = [
        (t3, 0x31, 0, "GET /stock", SERVER, 0, c, c + 300, {"http.status_code": "404"}),
        (t3, 0x32, 0x31, "cache miss", INTERNAL, 0, c + 100, c + 160, {"cache.hit": "false"}),
        (t4, 0x41, 0, "GET /stock", SERVER, 0, d, d + 2000, {"http.status_code": "200"}),
        (t4, 0x42, 0x41, "SELECT stock", CLIENT, ERROR, d + 100, d + 1600, PG),
    ]
    return [
        batch("checkout", PROD, checkout),
        batch("inventory", STAGING, inventory),
        batch("frontend", {}, [(t5, 0x51, 0, "GET /", SERVER, 0, e, e + 50, {})]),
    ]


# Attribute texts that DuckDB's TRY_CAST(... AS DOUBLE) and ClickHouse's toFloat64OrNull read
# differently, or not at all.
NUMBERS = [
    "7", " 7", "7 ", "\t7\n", "1e3", "1.5e+16", "inf", "-inf", "Infinity", "-INFINITY", "nan",
    "NaN", "-nan", "+NaN", "1_000", "1__000", "_1", "1_", "1_0.5_0", "1e1_0", "1e400", "-1e400",
    "1" + "0" * 400, "1e-400", "x", "", "12", "0x10", ".5", "5.", "-0", "+5", "007", "1,5",
    "true", "١", "INF", "+inf", "iNfInItY", "-NAN", "nan(1)", "1 ",
]  # fmt: skip
HIGH = (1 << 64) - 2  # span ids use all 64 bits
ODD_NAMES = ["a\nb", "naïve ¥", 'it\'s "q" \\ back`tick', "100% %(v0)s %s", "tab\there"]
E = 3600 * 1000  # the edge cases' spans start an hour after BASE (ms)
EDGE_WINDOW = (BASE + (E - 10_000) * MS, BASE + (E + 200_000) * MS)


def edge_batches() -> List[SpanBatch]:
    numbers = [
        (f"e{i:04x}" + f"{i:04x}" * 6 + "000", 0x1000 + i, 0, f"n{i}", SERVER, 0,
         E + i * 1000, E + i * 1000 + 1, {"n": text})
        for i, text in enumerate(NUMBERS)
    ]  # fmt: skip
    odd = [
        (f"d{i:04x}" + f"{i:04x}" * 6 + "000", 0x2000 + i, 0, name, INTERNAL, 0,
         E + i * 1000, E + i * 1000 + 2, {"a.b+c": str(i), "x(y)": name, "k": "v" * i})
        for i, name in enumerate(ODD_NAMES)
    ]  # fmt: skip
    ids = "c" * 32
    orphan = "b" * 32  # its root never arrived: the earliest span stands for it
    early = "a" * 32  # started long before the window, overlaps it
    many = "9" * 32  # more matching spans than are shown
    w = E + 100_000
    spans = [
        (ids, HIGH, 0, "high", SERVER, OK, w, w + 1000, {"k": "hi"}),
        (ids, 5, HIGH, "low", CLIENT, 0, w + 1, w + 2, {"k": "lo"}),
        (orphan, 7, 99, "late child", INTERNAL, 0, w + 5, w + 6, {}),
        (orphan, 6, 98, "first child", CLIENT, 0, w + 2, w + 9, {"k": "o"}),
        (early, 8, 0, "early root", SERVER, 0, w - 7_200_000, w + 20_000, {}),
        (early, 10, 8, "inside", CLIENT, ERROR, w + 10_000, w + 11_000, {"k": "e"}),
    ]
    for i in range(7):
        parent = 0 if i == 0 else 0x3000
        start = w + 30_000 + i
        spans.append(
            (many, 0x3000 + i, parent, f"m{i % 3}", CLIENT, 0, start, start + 1, {"k": "m"})
        )
    return [
        batch("nums", {"zone": "z1"}, numbers),
        batch("odd", {"zone": "z2", "weird key": "it's"}, odd),
        batch("ids", {}, spans),
    ]


# -- the two stores --------------------------------------------------------------------------

TENANT_BATCHES = {"t": contract_batches, "search": search_batches, "edge": edge_batches}


def ch_insert(session: Any, tenant: str, spans: SpanBatch) -> None:
    def values(row: Sequence[Any]) -> str:
        return "(" + ", ".join(str(binding.format_query_value(v)) for v in row) + ")"

    groups = [(gid, *vars(g).values()) for gid, g in spans.groups.items()]
    session.query("INSERT INTO span_groups VALUES " + ", ".join(map(values, groups)))
    rows = [(tenant, *row) for row in spans.rows]
    session.query("INSERT INTO spans VALUES " + ", ".join(map(values, rows)))
    # The attribute index as the store's materialized view fills it, from these spans alone.
    session.query(
        "INSERT INTO span_attrs "
        + span_attr_rows(
            f"(SELECT * FROM spans WHERE tenant = '{tenant}' AND span_id IN "
            + "("
            + ", ".join(str(row[1]) for row in spans.rows)
            + "))"
        )
    )


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[Any, DuckDBStore]]:
    root: Path = tmp_path_factory.mktemp("clickhouse_search")
    try:
        session = chdb_session.Session(str(root / "chdb"))
    except Exception as exc:  # one embedded ClickHouse per process, at one path
        pytest.fail(f"cannot open a chdb session (is another one open?): {exc}")
    duck = DuckDBStore(str(root / "duckdb"))
    try:
        for sql in SCHEMA:
            session.query(sql)
        for tenant, make in TENANT_BATCHES.items():
            for spans in make():
                ch_insert(session, tenant, spans)
                duck.write_spans(tenant, spans).result(timeout=30)
        # An export retried after it landed: the same spans again, in both.
        retried = [
            ("t", contract_batches()[0]),
            ("search", search_batches()[0]),
            ("edge", edge_batches()[2]),
        ]
        for tenant, spans in retried:
            ch_insert(session, tenant, spans)
            duck.write_spans(tenant, spans).result(timeout=30)
        yield session, duck
    finally:
        duck.close()
        session.close()


Row = Tuple[Any, ...]


def ch_query(session: Any, sql: str, params: Dict[str, Any]) -> List[Row]:
    # As clickhouse-connect's client.query(sql, parameters=params) does before it sends.
    text, server_side = binding.bind_query(sql, params)
    assert server_side == {} and isinstance(text, str), "bound on the client, into the text"
    doc = json.loads(session.query(text, "JSONCompact").bytes())
    ints = [i for i, col in enumerate(doc["meta"]) if "Int" in col["type"]]
    return [tuple(int(v) if i in ints else v for i, v in enumerate(r)) for r in doc["data"]]


def ch_rows(session: Any, tenant: str, query: TraceQuery) -> List[Row]:
    """The statement's rows, their service stats parsed as find_traces does."""
    rows = ch_query(session, *search_sql(CLICKHOUSE, tenant, query))
    return [(*row[:11], TraceSummary.from_rows([row])[0].service_stats) for row in rows]


def duck_rows(duck: DuckDBStore, tenant: str, query: TraceQuery) -> List[Row]:
    """find_traces' answer as the rows it was made of."""
    return [
        (
            t.trace_id,
            t.root_service,
            t.root_name,
            t.start_ns,
            t.start_ns + t.duration_ns,
            t.span_count,
            m.span_id,
            m.name,
            m.start_ns,
            m.start_ns + m.duration_ns,
            t.matched_count,
            t.service_stats,
        )
        for t in duck.find_traces(tenant, query)
        for m in t.matched
    ]


def same_rows(stores: Tuple[Any, DuckDBStore], tenant: str, query: TraceQuery) -> List[str]:
    """Both backends' rows, which must be equal; the trace ids found, in order."""
    session, duck = stores
    got = ch_rows(session, tenant, query)
    assert got == duck_rows(duck, tenant, query)
    return list(dict.fromkeys(r[0] for r in got))


# -- store_contract ----------------------------------------------------------------------------


def _q(
    *spansets: Sequence[Condition],
    trace: Sequence[Condition] = (),
    start: int = 0,
    end: int = 1000,
    **kw: Any,
) -> TraceQuery:
    return TraceQuery(start * SEC, end * SEC, tuple(map(tuple, spansets)), tuple(trace), **kw)


C = Condition
CONTRACT = [
    (_q(), [TRACE_B, TRACE_A]),
    (_q([C("name", "=", "sql")]), [TRACE_A]),
    (_q([C(".db", "=", "pg"), C("name", "=", "charge")]), [TRACE_A]),
    (_q([C("span.http.route", "=", "/pay"), C("name", "=", "sql")]), []),
    (_q([C("span.http.route", "=", "/pay")], [C("name", "=", "sql")]), [TRACE_A]),
    (_q([C("resource.region", "=", "eu")]), [TRACE_B]),
    (_q([C(".region", "=", "eu")]), [TRACE_B]),
    (_q([C("resource.service.name", "=", "web")]), [TRACE_B]),
    (_q([C("span.rows", ">", 5)]), [TRACE_A]),
    (_q([C("span.rows", "<", 5)]), []),
    (_q([C("name", "=~", "GET .*")]), [TRACE_B, TRACE_A]),
    (_q([C("span.db", "!=", "mysql")]), [TRACE_A]),
    (_q([C("duration", ">=", 2 * SEC)]), [TRACE_A]),
    (_q(trace=[C("traceDuration", ">", SEC)]), [TRACE_A]),
    (_q(trace=[C("rootServiceName", "=", "web")]), [TRACE_B]),
    (_q(start=150), [TRACE_B]),
    (_q([C("span.db", "=", "pg")]), [TRACE_A]),
    (_q(limit=1, spans_per_trace=1), [TRACE_B]),
    (_q(order="duration"), [TRACE_A, TRACE_B]),
    (_q(limit=1, order="duration"), [TRACE_A]),
    (_q([C("name", "=", "sql")], order="duration"), [TRACE_A]),
]


@pytest.mark.parametrize("query, expected", CONTRACT)
def test_store_contract_searches(stores, query: TraceQuery, expected: List[str]) -> None:  # type: ignore[no-untyped-def]
    assert same_rows(stores, "t", query) == expected


def test_store_contract_summary(stores) -> None:  # type: ignore[no-untyped-def]
    rows = ch_rows(stores[0], "t", _q([C("span.db", "=", "pg")]))
    # root, start, duration and span count of the trace, the spans that matched, in order;
    # the trace's three spans are stored twice (a retried export) and count once.
    assert rows == [
        (TRACE_A, "api", "GET /pay", 100 * SEC, 103 * SEC, 3, 2, "charge", 100 * SEC, 102 * SEC, 2)
        + ((("api", 3, 0),),),
        (TRACE_A, "api", "GET /pay", 100 * SEC, 103 * SEC, 3, 3, "sql", 101 * SEC, 102 * SEC, 2)
        + ((("api", 3, 0),),),
    ]
    assert ch_rows(stores[0], "other", _q()) == []


# -- test_traces_api's searches ----------------------------------------------------------------

WINDOW = (BASE - 60 * SEC, BASE + 3600 * SEC)

TRACEQL = {
    **traceql_cases.TRACEQL,
    "{kind=client}": ["T4", "T2", "T1"],
    '{name="no such span"}': [],
}


def traceql(q: str, start: int = WINDOW[0], end: int = WINDOW[1], **kw: Any) -> TraceQuery:
    spansets, trace_conds = parse_traceql(q)
    return TraceQuery(start, end, spansets, trace_conds, **kw)


@pytest.mark.parametrize("q", sorted(TRACEQL))
def test_traceql_search(stores, q: str) -> None:  # type: ignore[no-untyped-def]
    assert same_rows(stores, "search", traceql(q)) == [T[n] for n in TRACEQL[q]]


LEGACY = {**traceql_cases.LEGACY, "": ["T5", "T4", "T3", "T2", "T1"]}


def legacy(tags: str, low: Optional[str] = None, high: Optional[str] = None) -> TraceQuery:
    return legacy_query(
        parse_logfmt(tags),
        *WINDOW,
        parse_duration(low) if low else None,
        parse_duration(high) if high else None,
        20,
    )


@pytest.mark.parametrize("tags", sorted(LEGACY))
def test_legacy_tag_search(stores, tags: str) -> None:  # type: ignore[no-untyped-def]
    assert same_rows(stores, "search", legacy(tags)) == [T[n] for n in LEGACY[tags]]


@pytest.mark.parametrize(
    "tags, low, high, expected",
    [
        ("", "250ms", None, ["T4", "T3"]),
        ("", None, "100ms", ["T5", "T2"]),
        ("", "120ms", "300ms", ["T3", "T1"]),
        ("", "1.5s", None, ["T4"]),
        ("payment.provider=stripe", "100ms", None, ["T1"]),
        ("service.name=checkout", "200ms", None, []),
        ("service.name=checkout", None, "60ms", ["T5", "T2"]),
    ],
)
def test_legacy_durations(stores, tags: str, low, high, expected: List[str]) -> None:  # type: ignore[no-untyped-def]
    assert same_rows(stores, "search", legacy(tags, low, high)) == [T[n] for n in expected]


def test_window_limit_spans_shown_and_order(stores) -> None:  # type: ignore[no-untyped-def]
    def ids(q: TraceQuery) -> List[str]:
        return same_rows(stores, "search", q)

    names = {v: k for k, v in T.items()}
    assert [names[i] for i in ids(traceql("{}", limit=2))] == ["T5", "T4"]
    assert [names[i] for i in ids(traceql("{}", limit=1))] == ["T5"]
    assert [names[i] for i in ids(traceql("{}", limit=0))] == []
    window = (BASE + 100 * SEC, BASE + 700 * SEC)
    assert [names[i] for i in ids(traceql("{}", *window))] == ["T4", "T3"]
    assert [names[i] for i in ids(traceql("{}", BASE - 3600 * SEC, BASE - 60 * SEC))] == []
    for spss in (0, 1, 2, 5):
        ids(traceql("{}", spans_per_trace=spss))
    durations = ["T4", "T3", "T1", "T5", "T2"]
    assert [names[i] for i in ids(traceql("{}", order="duration"))] == durations
    assert [names[i] for i in ids(traceql("{}", order="duration", limit=2))] == ["T4", "T3"]
    q = traceql('{resource.service.name="checkout"}', order="duration")
    assert [names[i] for i in ids(q)] == ["T1", "T5", "T2"]
    q = traceql("{traceDuration>100ms}", order="duration")
    assert [names[i] for i in ids(q)] == ["T4", "T3", "T1"]


# -- the edges ---------------------------------------------------------------------------------

EDGE = (
    [[C("span.n", op, v)] for op in (">", ">=", "<", "<=", "=", "!=") for v in (5, 0.5, -1e308)]
    + [
        [C("span.n", "=", 1000)],
        [C("span.n", ">", 1e308)],
        [C("span.n", "<", 10.5)],
        [C("span.n", ">=", 7)],
    ]
    + [
        [C("span.n", "=", "nan")],
        [C("span.n", "!=", "7")],
        [C("span.n", ">", "5")],  # as text
        [C("span.n", "=~", " ?7 ?")],
        [C("name", "=~", "a.b")],  # "." matches no newline, as in DuckDB
        [C("name", "=~", "(?s)a.b")],
        [C("name", "=~", "na.ve ¥")],
        [C("name", "=", ODD_NAMES[2])],
        [C("name", "=~", ".*%.*")],
        [C("name", "=", ODD_NAMES[3])],
        [C("name", "!~", "n.*")],
        [C("name", "=~", "")],
        [C("name", ">", "m")],
        [C("span.a.b+c", "!=", "2")],
        [C("span.a.b+c", "=", 3)],
        [C("span.x(y)", "=~", "(?s)a.b|tab.*")],
        [C("span.x(y)", "=", ODD_NAMES[3])],
        [C("span.k", ">=", "vvv")],
        [C("span.k", "=", True)],
        [C(".zone", "=", "z2")],
        [C(".zone", "!=", "z2")],
        [C(".zone", "=~", "z[12]")],
        [C("resource.weird key", "=", "it's")],
        [C("resource.zone", "!~", "z1")],
        [C("span:id", "=", f"{HIGH:x}")],
        [C("span:id", ">", "ff")],
        [C("span:id", "=", "-5")],
        [C("span:id", "=", "1" + "0" * 20)],
        [C("trace:id", "=", "C" * 32)],
        [C("trace:id", "<", "c")],
        [C("trace:id", "=~", "b+")],
        [C("status", "=", 1)],
        [C("status", "=", "error")],
        [C("kind", "!=", "client")],
        [C("kind", "<", 2)],
        [C("duration", ">", 1.5 * MS)],
        [C("span.k", "=", "m")],
        [C("span.k", "=", "m"), C("name", "=", "m1")],
        [C("name", "=", "inside")],  # its trace started two hours before the window
        [C("name", "=", "first child")],  # the trace's root never arrived
        [C("name", "=", "low")],
    ]
)


@pytest.mark.parametrize(
    "conds", EDGE, ids=lambda c: " && ".join(f"{x.key}{x.op}{x.value!r}" for x in c)
)
def test_edge_searches(stores, conds: List[Condition]) -> None:  # type: ignore[no-untyped-def]
    found = same_rows(stores, "edge", TraceQuery(*EDGE_WINDOW, (tuple(conds),)))
    if conds == [C("span.n", ">", 5)]:
        # Texts that read as numbers strictly (as an int or a double is written): " 7",
        # "inf" or "1_000" are strings, which TraceQL never compares with a number.
        assert len(found) == 7, "the numbers were read"


@pytest.mark.parametrize("order", ["recent", "duration"])
@pytest.mark.parametrize("limit, spss", [(2, 1), (20, 3), (1, 0)])
def test_edge_limits_and_orders(stores, order: str, limit: int, spss: int) -> None:  # type: ignore[no-untyped-def]
    for conds in ((), (C("span.k", "=", "m"),)):
        query = TraceQuery(*EDGE_WINDOW, (conds,), (), limit, spss, order)
        assert same_rows(stores, "edge", query)


@pytest.mark.parametrize(
    "spansets, trace_conds",
    [
        ((), (C("rootName", "=", "first child"),)),
        ((), (C("rootServiceName", "=~", "i.s"),)),
        ((), (C("traceDuration", ">", 10 * SEC),)),
        ((), (C("rootName", "<", "h"), C("traceDuration", "<=", SEC))),
        (((C("span.k", "=", "m"),), (C("name", "=", "m2"),)), ()),
        (((C("span.k", "=", "e"),), (C("status", "=", "error"),), (C(".k", "!=", "z"),)), ()),
    ],
)
def test_edge_trace_conditions(stores, spansets, trace_conds) -> None:  # type: ignore[no-untyped-def]
    for order in ("recent", "duration"):
        found = same_rows(
            stores, "edge", TraceQuery(*EDGE_WINDOW, spansets, trace_conds, order=order)
        )
        assert found, "something to compare"


def test_numbers_are_read_as_duckdb_reads_them(stores) -> None:  # type: ignore[no-untyped-def]
    import duckdb

    more = ["+-5", "- 5", "1e5.5", "+.5e-3", "1.", "-.5", "\x0b7", "\r7", "\xa07", "infinit",
            "nana", "1e", "-", "."]  # fmt: skip
    texts = NUMBERS + more
    # toString(): JSON has no infinities.
    got = ch_query(
        stores[0],
        f"SELECT toString({CLICKHOUSE.number('x')}) FROM (SELECT arrayJoin(%(texts)s) AS x)",
        {"texts": texts},
    )
    want = (
        duckdb.connect()
        .execute("SELECT TRY_CAST(x AS DOUBLE) FROM unnest(?) AS t(x)", [texts])
        .fetchall()
    )
    differ = []
    for text, (value,), (expected,) in zip(texts, got, want):
        if expected is not None and math.isnan(expected):
            expected = math.inf  # NaN: DuckDB's greatest value
        mine = None if value is None else float(value)
        if mine != expected:
            differ.append((text, mine, expected))
    # "+-5": DuckDB reads -5, a sign too many; nobody writes it.
    assert differ == [("+-5", None, -5.0)]


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query",
    [
        _q([C("name", "=", 5)]),
        _q([C("resource.service.name", "=", 5)]),
        _q([C("status", ">", "fast")]),
        _q([C("kind", "=", "sideways")]),
        _q([C("span:id", "=", "xyz")]),
        _q([C("foo", "=", "x")]),
        _q([C("name", "<>", "x")]),
        _q([C("span.a", "~", "x")]),
        _q([C("name", "=", "x")], [C("status", "=", "weird")]),
        _q(trace=[C("traceDuration", ">", "long")]),
        _q(trace=[C("rootServiceName", "=", 5)]),
        _q(trace=[C("name", "=", "x")]),
        _q(trace=[C("rootName", "~", "x")]),
        _q(order="slowest"),
        _q([C("name", "=", 5)], order="slowest"),
    ],
)
def test_refused_as_duckdb_refuses(stores, query: TraceQuery) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SearchError) as duck:
        stores[1].find_traces("t", query)
    with pytest.raises(SearchError) as click:
        search_sql(CLICKHOUSE, "t", query)
    assert str(click.value) == str(duck.value)


@pytest.mark.parametrize(
    "cond",
    [C("span:id", "=", "f" * 40), C("span:id", ">", "-" + "f" * 300), C("status", "=", 1 << 130)],
)
def test_integers_past_128_bits_are_refused(stores, cond: Condition) -> None:  # type: ignore[no-untyped-def]
    # DuckDB with its own message.
    with pytest.raises(SearchError):
        stores[1].find_traces("t", _q([cond]))
    with pytest.raises(SearchError, match="out of range"):
        search_sql(CLICKHOUSE, "t", _q([cond]))


BAD_PATTERNS = ["(", "a)|(b", "a)", ")", "[z-a]", "x**", "\\8", "(?P<n"]
CANNOT_COMPILE_REGEXP = r"Code: 427\b.*CANNOT_COMPILE_REGEXP"


@pytest.mark.parametrize("pattern", BAD_PATTERNS)
def test_a_bad_regular_expression_fails_with_code_427(stores, pattern: str) -> None:  # type: ignore[no-untyped-def]
    query = TraceQuery(*WINDOW, ((C("name", "=~", pattern),),))
    with pytest.raises(SearchError):
        stores[1].find_traces("search", query)
    with pytest.raises(Exception, match=CANNOT_COMPILE_REGEXP):
        ch_rows(stores[0], "search", query)
    attribute = TraceQuery(*WINDOW, ((C(".db.system", "!~", pattern),), ()))
    with pytest.raises(Exception, match=CANNOT_COMPILE_REGEXP):
        ch_rows(stores[0], "search", attribute)


@pytest.mark.parametrize("pattern", ["a)|(b", "["])
def test_a_bad_regular_expression_fails_with_no_span_to_read(stores, pattern: str) -> None:  # type: ignore[no-untyped-def]
    # The pattern alone is a constant that ClickHouse folds while planning.
    query = TraceQuery(*WINDOW, ((C("span.x", "=~", pattern),),))
    with pytest.raises(Exception, match=CANNOT_COMPILE_REGEXP):
        ch_rows(stores[0], "nobody", query)


@pytest.mark.parametrize(
    "cond",
    [
        C("status", "=~", "error"),
        C("duration", "!~", 5),
        C("span.n", "=~", 5),
        C("span:id", "=~", "5"),
    ],
)
def test_a_regular_expression_on_a_number_is_refused(stores, cond: Condition) -> None:  # type: ignore[no-untyped-def]
    # DuckDB fails to bind the SQL (a server error); here the query is at fault.
    with pytest.raises(SearchError, match="compares text"):
        search_sql(CLICKHOUSE, "t", _q([cond]))


def test_values_are_bound_into_the_text_safely() -> None:
    sql, params = search_sql(
        CLICKHOUSE,
        "it's %(tenant)s",
        _q([C("name", "=", "x' OR 1=1 --"), C("span.q", "=~", "\\d+'")]),
    )
    text, server_side = binding.bind_query(sql, params)
    assert server_side == {}
    assert "'it\\'s %(tenant)s'" in text and "'x\\' OR 1=1 --'" in text
    assert sql.count("%") == sql.count("%(")
