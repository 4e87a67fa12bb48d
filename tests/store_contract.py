"""The behaviour every storage backend must have.  A backend's test module subclasses
:class:`StoreContract` and provides the ``store`` and ``reopen`` fixtures."""

from __future__ import annotations

import threading
import time
from typing import Callable

import numpy as np
import pytest

from hotspan.model.labels import normalize
from hotspan.model.profile import Frame, IngestBatch, ProfileType
from hotspan.model.trace import (
    Condition,
    SearchError,
    SpanBatch,
    SpanGroup,
    SpanWriteRow,
    TraceQuery,
    flatten_attributes,
    parse_attributes,
)
from hotspan.store.base import SampleFilter, Store, StoredToken

CPU = ProfileType.parse("process_cpu:cpu:nanoseconds:cpu:nanoseconds")
ALLOC = ProfileType.parse("memory:alloc_space:bytes:space:bytes")
SEC = 1_000_000_000


def batch_of(rows, ptype=CPU, labels=None):  # type: ignore[no-untyped-def]
    """rows: (ts_s, [frame names root first], value, span_id, trace_id)"""
    batch = IngestBatch()
    sid = batch.add_series(ptype, normalize(labels or {"service_name": "svc"}))
    for ts, names, value, span, trace in rows:
        fids = tuple(batch.add_frame(Frame(n, f"{n}.py", i + 1)) for i, n in enumerate(names))
        batch.add_sample(sid, ts * SEC, batch.add_stack(fids), value, span, trace)
    return batch, sid


TRACE_A = "0af7651916cd43dd8448eb211c80319c"
TRACE_B = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACE_C = "5b8aa5a2d2c872e8321cf37308d69df2"


def spans_of(rows, service="api", resource_attrs=None):  # type: ignore[no-untyped-def]
    """rows: (trace id, span id, parent id, name, start s, end s, {span attributes})"""
    batch = SpanBatch()
    res_attrs = {"service.name": service, **(resource_attrs or {})}
    gid = batch.add_group(
        SpanGroup(
            service, service.encode(), "", b"scope", "", flatten_attributes(res_attrs.items())
        )
    )
    for trace, span, parent, name, start, end, attrs in rows:
        batch.rows.append(
            SpanWriteRow(
                trace,
                span,
                parent,
                name,
                2,
                service,
                start * SEC,
                end * SEC,
                0,
                flatten_attributes(attrs.items()),
                gid,
                f"raw-{span}".encode(),
            )
        )
        batch.add_tags("span", [(k, v, "string") for k, v in attrs.items()], end * SEC)
        batch.add_tags("intrinsic", [("name", name, "string")], end * SEC)
    resource_tags = [(k, v, "string") for k, v in res_attrs.items()]
    batch.add_tags("resource", resource_tags, max(r[5] for r in rows) * SEC)
    return batch


class StoreContract:
    store: Store
    reopen: Callable[[], Store]

    def test_write_then_read_sums_per_stack(self, store: Store) -> None:
        batch, sid = batch_of(
            [
                (10, ["main", "a"], 5, 0, None),
                (11, ["main", "a"], 7, 0, None),
                (12, ["main", "b"], 3, 0, None),
            ]
        )
        store.write("t", batch).result(timeout=30)
        got = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC))
        assert sorted(got.values.tolist()) == [3, 12]
        stacks = store.stacks(got.stack_ids.tolist())
        frames = store.frames([f for fs in stacks.values() for f in fs])
        named = {
            tuple(frames[f].name for f in stacks[s]): int(v)
            for s, v in zip(got.stack_ids.tolist(), got.values.tolist())
        }
        assert named == {("main", "a"): 12, ("main", "b"): 3}
        assert frames[stacks[got.stack_ids[0]][0]].filename == "main.py"

    def test_time_range_is_half_open(self, store: Store) -> None:
        batch, sid = batch_of([(10, ["x"], 1, 0, None), (20, ["x"], 2, 0, None)])
        store.write("t", batch).result(timeout=30)
        assert store.stack_values("t", [sid], SampleFilter(10 * SEC, 20 * SEC)).values.tolist() == [
            1
        ]
        assert store.stack_values("t", [sid], SampleFilter(21 * SEC, 30 * SEC)).values.size == 0

    def test_series_records_labels_type_and_bounds(self, store: Store) -> None:
        batch, sid = batch_of(
            [(10, ["x"], 1, 0, None), (30, ["x"], 1, 0, None)],
            ALLOC,
            {"service_name": "api", "env": "prod"},
        )
        store.write("t", batch).result(timeout=30)
        (rec,) = store.series("t")
        assert rec.series_id == sid
        assert rec.profile_type == ALLOC
        assert dict(rec.labels) == {"service_name": "api", "env": "prod"}
        assert (rec.first_ts, rec.last_ts) == (10 * SEC, 30 * SEC)
        batch, _ = batch_of([(5, ["x"], 1, 0, None)], ALLOC, {"service_name": "api", "env": "prod"})
        store.write("t", batch).result(timeout=30)
        (rec,) = store.series("t")
        assert (rec.first_ts, rec.last_ts) == (5 * SEC, 30 * SEC)

    def test_tenants_are_apart(self, store: Store) -> None:
        batch, sid = batch_of([(10, ["secret"], 1, 0, None)])
        store.write("a", batch).result(timeout=30)
        assert store.series("b") == []
        assert store.stack_values("b", [sid], SampleFilter(0, 100 * SEC)).values.size == 0
        assert store.time_series("b", [sid], SampleFilter(0, 100 * SEC), SEC)[2].size == 0

    def test_span_and_trace_filters(self, store: Store) -> None:
        big_span = (1 << 64) - 2  # span ids use all 64 bits
        trace = "0af7651916cd43dd8448eb211c80319c"
        batch, sid = batch_of(
            [(10, ["a"], 1, big_span, trace), (10, ["b"], 2, 7, trace), (10, ["c"], 4, 0, None)]
        )
        store.write("t", batch).result(timeout=30)
        span_only = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC, span_ids=[big_span]))
        assert span_only.values.tolist() == [1]
        traced = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC, trace_ids=[trace]))
        assert sorted(traced.values.tolist()) == [1, 2]

    def test_trace_filter_adds_samples_labelled_with_one_of_its_spans_only(
        self, store: Store
    ) -> None:
        # Pyroscope's SDKs label a sample with span_id alone: such a sample is its trace's
        # when the filter names the trace's spans; a sample of another trace never is.
        batch, sid = batch_of(
            [
                (10, ["traced"], 1, 5, TRACE_A),
                (10, ["span_only"], 2, 6, None),
                (10, ["other_span"], 4, 8, None),
                (10, ["other_trace"], 8, 6, TRACE_B),
                (10, ["no_span"], 16, 0, None),
            ]
        )
        store.write("t", batch).result(timeout=30)

        def total(where: SampleFilter) -> int:
            return int(store.stack_values("t", [sid], where).values.sum())

        assert total(SampleFilter(0, 100 * SEC, trace_ids=[TRACE_A])) == 1
        with_spans = SampleFilter(0, 100 * SEC, trace_ids=[TRACE_A], trace_span_ids=[5, 6])
        assert total(with_spans) == 1 + 2
        one_span = with_spans._replace(span_ids=[6])
        assert total(one_span) == 2
        only_spans = SampleFilter(0, 100 * SEC, trace_ids=[], trace_span_ids=[6, 8])
        got = store.span_values("t", [sid], only_spans)
        assert dict(zip(got.span_ids.tolist(), got.values.tolist())) == {6: 2, 8: 4}

    def test_time_series_points_cover_the_step_before_them(self, store: Store) -> None:
        # As in Pyroscope, the point at T holds (T - step, T].
        batch, sid = batch_of(
            [
                (0, ["a"], 1, 0, None),
                (5, ["a"], 2, 0, None),
                (5, ["b"], 16, 0, None),
                (10, ["a"], 4, 0, None),
                (25, ["b"], 8, 0, None),
            ]
        )
        store.write("t", batch).result(timeout=30)
        sids, points, sums, profiles = store.time_series(
            "t", [sid], SampleFilter(0, 30 * SEC), 10 * SEC
        )
        assert set(sids.tolist()) == {sid}
        got = {
            p: (s, n) for p, s, n in zip((points // SEC).tolist(), sums.tolist(), profiles.tolist())
        }
        # Point 10 holds t=5 (two samples of one profile) and t=10: two profiles.
        assert got == {0: (1, 1), 10: (22, 2), 30: (8, 1)}

    def test_same_stack_written_twice_is_stored_once(self, store: Store) -> None:
        b1, sid = batch_of([(10, ["m", "f"], 1, 0, None)])
        b2, _ = batch_of([(11, ["m", "f"], 2, 0, None)])
        store.write("t", b1).result(timeout=30)
        store.write("t", b2).result(timeout=30)
        got = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC))
        assert got.values.tolist() == [3]

    def test_concurrent_writes_all_land(self, store: Store) -> None:
        futures = []
        lock = threading.Lock()

        def push(i: int) -> None:
            batch, _ = batch_of([(10 + i, ["main", f"f{i % 7}"], 1, 0, None)])
            fut = store.write("t", batch)
            with lock:
                futures.append(fut)

        threads = [threading.Thread(target=push, args=(i,)) for i in range(200)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for fut in futures:
            fut.result(timeout=60)
        (rec,) = store.series("t")
        got = store.stack_values("t", [rec.series_id], SampleFilter(0, 1000 * SEC))
        assert int(got.values.sum()) == 200
        assert len(got.stack_ids) == 7

    def test_data_survives_reopen(self, store: Store, reopen) -> None:  # type: ignore[no-untyped-def]
        batch, sid = batch_of([(10, ["main", "kept"], 42, 9, None)])
        store.write("t", batch).result(timeout=30)
        store.close()
        again = reopen()
        try:
            (rec,) = again.series("t")
            got = again.stack_values("t", [sid], SampleFilter(0, 100 * SEC, span_ids=[9]))
            assert got.values.tolist() == [42]
            assert np.all(got.stack_ids == got.stack_ids)
        finally:
            again.close()

    def test_write_after_close_fails_cleanly(self, store: Store) -> None:
        store.close()
        batch, _ = batch_of([(10, ["x"], 1, 0, None)])
        with pytest.raises(Exception, match="closed"):
            store.write("t", batch).result(timeout=30)

    # -- spans ---------------------------------------------------------------------------------

    def _two_traces(self, store: Store) -> None:
        store.write_spans(
            "t",
            spans_of(
                [
                    (TRACE_A, 1, 0, "GET /pay", 100, 103, {"http.route": "/pay"}),
                    (TRACE_A, 2, 1, "charge", 100, 102, {"db": "pg"}),
                    (TRACE_A, 3, 2, "sql", 101, 102, {"db": "pg", "rows": "7"}),
                ]
            ),
        ).result(timeout=30)
        store.write_spans(
            "t",
            spans_of(
                [(TRACE_B, 9, 0, "GET /home", 200, 200, {"http.route": "/home"})],
                service="web",
                resource_attrs={"region": "eu"},
            ),
        ).result(timeout=30)

    def test_trace_returns_its_spans_with_their_group(self, store: Store) -> None:
        self._two_traces(store)
        spans = sorted(store.trace("t", TRACE_A), key=lambda s: s.span_id)
        assert [(s.span_id, s.parent_span_id, s.name) for s in spans] == [
            (1, 0, "GET /pay"),
            (2, 1, "charge"),
            (3, 2, "sql"),
        ]
        assert spans[0].raw == b"raw-1"
        assert spans[0].group.service == "api" and spans[0].group.scope == b"scope"
        assert (spans[2].start_ns, spans[2].end_ns) == (101 * SEC, 102 * SEC)
        assert store.trace("t", TRACE_B.upper())[0].name == "GET /home"
        assert store.trace("other", TRACE_A) == []
        assert store.span_traces("t", [3, 9, 12345]) == {3: TRACE_A, 9: TRACE_B}
        assert store.span_traces("other", [3]) == {}

    def test_find_traces_conditions_and_order(self, store: Store) -> None:
        self._two_traces(store)

        def ids(*spansets, trace_conditions=(), start=0, end=1000):  # type: ignore[no-untyped-def]
            query = TraceQuery(start * SEC, end * SEC, tuple(spansets), tuple(trace_conditions))
            return [t.trace_id for t in store.find_traces("t", query)]

        assert ids() == [TRACE_B, TRACE_A]  # the most recent first
        assert ids((Condition("name", "=", "sql"),)) == [TRACE_A]
        assert ids((Condition(".db", "=", "pg"), Condition("name", "=", "charge"))) == [TRACE_A]
        # One spanset: both conditions on one span; two spansets: on any two spans.
        assert ids((Condition("span.http.route", "=", "/pay"), Condition("name", "=", "sql"))) == []
        assert ids(
            (Condition("span.http.route", "=", "/pay"),), (Condition("name", "=", "sql"),)
        ) == [TRACE_A]
        assert ids((Condition("resource.region", "=", "eu"),)) == [TRACE_B]
        assert ids((Condition(".region", "=", "eu"),)) == [TRACE_B]
        assert ids((Condition("resource.service.name", "=", "web"),)) == [TRACE_B]
        assert ids((Condition("span.rows", ">", 5),)) == [TRACE_A]
        assert ids((Condition("span.rows", "<", 5),)) == []
        assert ids((Condition("name", "=~", "GET .*"),)) == [TRACE_B, TRACE_A]
        assert ids((Condition("span.db", "!=", "mysql"),)) == [TRACE_A]
        assert ids((Condition("duration", ">=", 2 * SEC),)) == [TRACE_A]
        assert ids(trace_conditions=[Condition("traceDuration", ">", SEC)]) == [TRACE_A]
        assert ids(trace_conditions=[Condition("rootServiceName", "=", "web")]) == [TRACE_B]
        assert ids(start=150) == [TRACE_B]  # spans must start in the range
        (found,) = store.find_traces(
            "t", TraceQuery(0, 1000 * SEC, ((Condition("span.db", "=", "pg"),),))
        )
        assert (found.root_name, found.root_service, found.span_count) == ("GET /pay", "api", 3)
        assert (found.start_ns, found.duration_ns, found.matched_count) == (100 * SEC, 3 * SEC, 2)
        assert [m.span_id for m in found.matched] == [2, 3]
        assert store.find_traces("other", TraceQuery(0, 1000 * SEC)) == []
        limited = store.find_traces("t", TraceQuery(0, 1000 * SEC, limit=1, spans_per_trace=1))
        assert [t.trace_id for t in limited] == [TRACE_B]
        # order="duration": the longest first, and the limit keeps the longest.
        longest = TraceQuery(0, 1000 * SEC, order="duration")
        assert [t.trace_id for t in store.find_traces("t", longest)] == [TRACE_A, TRACE_B]
        longest = TraceQuery(0, 1000 * SEC, limit=1, order="duration")
        assert [t.trace_id for t in store.find_traces("t", longest)] == [TRACE_A]
        # The trace's duration, not the matching span's: "sql" (1 s) is in a 3 s trace.
        (found,) = store.find_traces(
            "t", TraceQuery(0, 1000 * SEC, ((Condition("name", "=", "sql"),),), order="duration")
        )
        assert (found.trace_id, found.duration_ns) == (TRACE_A, 3 * SEC)

    def test_tags_and_values(self, store: Store) -> None:
        self._two_traces(store)
        names = store.tag_names("t")
        assert names["span"] == ["db", "http.route", "rows"]
        assert names["resource"] == ["region", "service.name"]

        def values(scope, name, since_ns=0):  # type: ignore[no-untyped-def]
            return [v for v, _ in store.tag_values("t", scope, name, since_ns)]

        assert values("resource", "service.name") == ["api", "web"]
        assert values(None, "http.route") == ["/home", "/pay"]
        assert values("intrinsic", "name") == ["GET /home", "GET /pay", "charge", "sql"]
        assert values(None, "http.route", since_ns=150 * SEC) == ["/home"]
        assert store.tag_values("t", "span", "rows") == [("7", "string")]
        assert store.tag_names("other") == {}

    def test_span_values_sum_per_span(self, store: Store) -> None:
        batch, sid = batch_of(
            [(10, ["a"], 1, 5, TRACE_A), (10, ["b"], 2, 5, TRACE_A), (10, ["c"], 4, 0, None)]
        )
        store.write("t", batch).result(timeout=30)
        got = store.span_values("t", [sid], SampleFilter(0, 100 * SEC, trace_ids=[TRACE_A]))
        assert dict(zip(got.span_ids.tolist(), got.values.tolist())) == {5: 3}
        everything = store.span_values("t", [sid], SampleFilter(0, 100 * SEC))
        assert dict(zip(everything.span_ids.tolist(), everything.values.tolist())) == {5: 3, 0: 4}

    def test_trace_values_sum_per_trace(self, store: Store) -> None:
        batch, sid = batch_of(
            [
                (10, ["a"], 1, 5, TRACE_A),
                (11, ["b"], 2, 6, TRACE_A),
                (10, ["c"], 4, 7, TRACE_B),
                (10, ["d"], 8, 0, None),
            ]
        )
        store.write("t", batch).result(timeout=30)

        def sums(where):  # type: ignore[no-untyped-def]
            got = store.trace_values("t", [sid], where)
            return dict(zip(got.trace_ids, got.values.tolist()))

        # One query answers for a list of traces; samples without a trace are left out.
        assert sums(SampleFilter(0, 100 * SEC)) == {TRACE_A: 3, TRACE_B: 4}
        assert sums(SampleFilter(0, 100 * SEC, trace_ids=[TRACE_A.upper()])) == {TRACE_A: 3}
        assert sums(SampleFilter(0, 11 * SEC, trace_ids=[TRACE_A, TRACE_B])) == {
            TRACE_A: 1,
            TRACE_B: 4,
        }
        assert sums(SampleFilter(0, 100 * SEC, trace_ids=["f" * 32])) == {}
        assert store.trace_values("other", [sid], SampleFilter(0, 100 * SEC)).trace_ids == []
        assert store.trace_values("t", [], SampleFilter(0, 100 * SEC)).trace_ids == []
        # Only the samples of some stacks (those holding one function, say), per trace.
        stacks = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC))
        by_value = dict(zip(stacks.values.tolist(), stacks.stack_ids.tolist()))
        b_and_c = [by_value[2], by_value[4]]
        assert sums(SampleFilter(0, 100 * SEC, stack_ids=b_and_c)) == {TRACE_A: 2, TRACE_B: 4}
        assert sums(SampleFilter(0, 100 * SEC, stack_ids=[])) == {}
        got = store.stack_values("t", [sid], SampleFilter(0, 100 * SEC, stack_ids=[by_value[8]]))
        assert got.values.tolist() == [8]

    def test_profile_values_sum_per_profile_and_per_span(self, store: Store) -> None:
        big_span = (1 << 64) - 2  # span ids use all 64 bits
        batch, sid = batch_of(
            [
                (10, ["a"], 1, 5, TRACE_A),
                (10, ["b"], 2, 5, TRACE_A),
                (10, ["c"], 4, big_span, TRACE_B),
                (10, ["d"], 8, 0, None),
                (20, ["a"], 16, 0, None),
            ]
        )
        other, sid2 = batch_of([(10, ["x"], 32, 6, None)], labels={"service_name": "b"})
        store.write("t", batch).result(timeout=30)
        store.write("t", other).result(timeout=30)

        def rows(where, by_span=False, limit=1000):  # type: ignore[no-untyped-def]
            got = store.profile_values("t", [sid, sid2], where, by_span, limit)
            return list(
                zip(
                    (got.times // SEC).tolist(),
                    got.series_ids.tolist(),
                    got.span_ids.tolist(),
                    got.trace_ids,
                    got.values.tolist(),
                )
            )

        # A profile: a series' samples at one time; ordered by time, then series id.
        first, second = sorted([sid, sid2])
        per_profile = {(10, sid, 0, None, 15), (10, sid2, 0, None, 32), (20, sid, 0, None, 16)}
        assert set(rows(SampleFilter(0, 100 * SEC))) == per_profile
        got = rows(SampleFilter(0, 100 * SEC))
        assert [(t, s) for t, s, *_ in got] == [(10, first), (10, second), (20, sid)]
        # Per span within each profile; samples without a span are left out.
        assert set(rows(SampleFilter(0, 100 * SEC), by_span=True)) == {
            (10, sid, 5, TRACE_A, 3),
            (10, sid, big_span, TRACE_B, 4),
            (10, sid2, 6, None, 32),
        }
        # The filter applies (time, traces); the limit keeps the first rows.
        assert rows(SampleFilter(15 * SEC, 100 * SEC)) == [(20, sid, 0, None, 16)]
        assert rows(SampleFilter(0, 100 * SEC, trace_ids=[TRACE_B]), by_span=True) == [
            (10, sid, big_span, TRACE_B, 4)
        ]
        assert len(rows(SampleFilter(0, 100 * SEC), limit=2)) == 2
        assert rows(SampleFilter(0, 100 * SEC), limit=1)[0][:2] == (10, first)
        assert store.profile_values("other", [sid], SampleFilter(0, 100 * SEC)).values.size == 0
        assert store.profile_values("t", [], SampleFilter(0, 100 * SEC)).trace_ids == []

    def test_span_infos_by_time_service_and_trace(self, store: Store) -> None:
        self._two_traces(store)

        def infos(start=0, end=1000, **kwargs):  # type: ignore[no-untyped-def]
            return [
                (i.trace_id, i.span_id, i.parent_span_id, i.name, i.service)
                for i in store.span_infos("t", start * SEC, end * SEC, **kwargs)
            ]

        # The latest first; spans that started in the range.
        assert infos() == [
            (TRACE_B, 9, 0, "GET /home", "web"),
            (TRACE_A, 3, 2, "sql", "api"),
            (TRACE_A, 1, 0, "GET /pay", "api"),
            (TRACE_A, 2, 1, "charge", "api"),
        ]
        assert [i[1] for i in infos(start=101, end=200)] == [3]
        assert [i[1] for i in infos(service="web")] == [9]
        assert [i[1] for i in infos(trace_ids=[TRACE_A], service="api")] == [3, 1, 2]
        assert infos(trace_ids=[]) == []
        assert [i[1] for i in infos(limit=2)] == [9, 3]
        # The name filter applies before the limit: the latest spans of that name.
        assert [i[1] for i in infos(name="GET /pay", limit=1)] == [1]
        assert [i[1] for i in infos(name="GET /pay", service="web")] == []
        (sql,) = store.span_infos("t", 101 * SEC, 102 * SEC)
        assert (sql.start_ns, sql.end_ns) == (101 * SEC, 102 * SEC)
        # The columns aggregations do not read are left neutral, attributes unread.
        records = store.span_records("t", 101 * SEC, 102 * SEC)
        (whole,) = [r for r in records if r.span_id == sql.span_id]
        assert whole.kind == 2
        assert "pg" in whole.attrs and whole.resource_attrs
        assert (sql.kind, sql.status_code, sql.attrs, sql.resource_attrs) == (0, 0, "", "")
        assert sql == whole._replace(kind=0, status_code=0, attrs="", resource_attrs="")
        assert store.span_infos("other", 0, 1000 * SEC) == []
        # An export retried after it landed stores a span twice: it is one span still.
        store.write_spans(
            "t", spans_of([(TRACE_A, 3, 2, "sql", 101, 102, {"db": "pg", "rows": "7"})])
        ).result(timeout=30)
        assert [i[1] for i in infos()] == [9, 3, 1, 2]

    @pytest.mark.parametrize(
        "cond",
        [
            Condition("status", "=~", "error"),
            Condition("duration", "!~", 5),
            Condition("span.rows", "=~", 5),
            Condition("span:id", "=~", "3"),
        ],
    )
    def test_a_regular_expression_on_a_number_is_the_querys_fault(
        self, store: Store, cond: Condition
    ) -> None:
        self._two_traces(store)
        with pytest.raises(SearchError, match="compares text"):
            store.find_traces("t", TraceQuery(0, 1000 * SEC, ((cond,),)))
        with pytest.raises(SearchError, match="compares text"):
            store.span_records("t", 0, 1000 * SEC, [cond])

    def test_a_negative_search_limit_is_the_querys_fault(self, store: Store) -> None:
        self._two_traces(store)
        with pytest.raises(SearchError, match="negative"):
            store.find_traces("t", TraceQuery(0, 1000 * SEC, ((),), limit=-1))

    def test_span_records_conditions_traces_and_attributes(self, store: Store) -> None:
        self._two_traces(store)

        def ids(*conditions, start=0, end=1000, **kwargs):  # type: ignore[no-untyped-def]
            records = store.span_records("t", start * SEC, end * SEC, conditions, **kwargs)
            return [r.span_id for r in records]

        # The latest first (ties by span id); spans overlapping the range, as search.
        assert ids() == [9, 3, 1, 2]
        assert ids(start=102, end=150) == [3, 1, 2]  # 3 ends at 102: it overlaps
        assert ids(start=103, end=150) == [1]
        assert ids(Condition(".db", "=", "pg")) == [3, 2]
        assert ids(Condition("span.rows", ">", 5), Condition("name", "=", "sql")) == [3]
        assert ids(Condition("resource.region", "=", "eu")) == [9]
        assert ids(Condition("duration", ">=", 2 * SEC)) == [1, 2]
        assert ids(Condition("name", "=~", "GET .*"), limit=1) == [9]
        # Root spans (TraceQL's nestedSetParent<0), and children of one span.
        assert ids(Condition("span:parentID", "=", "0000000000000000")) == [9, 1]
        assert ids(Condition("span:parentID", "=", "0000000000000001")) == [2]
        assert ids(Condition("span:parentID", "!=", "0000000000000000")) == [3, 2]
        assert ids(trace_ids=[TRACE_A.upper()]) == [3, 1, 2]
        assert ids(trace_ids=[]) == []
        # A pattern the regular-expression engine refuses is the query's fault.
        with pytest.raises(SearchError):
            ids(Condition("name", "=~", "(unclosed"))
        assert store.span_records("other", 0, 1000 * SEC) == []
        (home,) = store.span_records("t", 0, 1000 * SEC, trace_ids=[TRACE_B])
        assert (home.trace_id, home.parent_span_id, home.name, home.service) == (
            TRACE_B,
            0,
            "GET /home",
            "web",
        )
        assert (home.kind, home.status_code, home.duration_ns) == (2, 0, 0)
        assert parse_attributes(home.attrs) == {"http.route": "/home"}
        assert parse_attributes(home.resource_attrs) == {"service.name": "web", "region": "eu"}
        # An export retried after it landed stores a span twice: it is one span still.
        store.write_spans(
            "t", spans_of([(TRACE_A, 3, 2, "sql", 101, 102, {"db": "pg", "rows": "7"})])
        ).result(timeout=30)
        assert ids() == [9, 3, 1, 2]

    def test_unscoped_attribute_is_the_spans_else_the_resources(self, store: Store) -> None:
        # Tempo's meaning of `.x` (and query.traceql_eval's): the span's value when the span
        # has the attribute, even empty, else the resource's.  Resource x=b on every span.
        rows = [
            (TRACE_A, 1, 0, "own", 100, 101, {"x": "a", "n": "5", "service.name": "other"}),
            (TRACE_A, 2, 1, "inherits", 100, 101, {}),
            (TRACE_A, 3, 1, "empty", 100, 101, {"x": ""}),
        ]
        resource = {"x": "b", "n": "50"}
        store.write_spans("t", spans_of(rows, resource_attrs=resource)).result(timeout=30)

        def ids(key, op, value):  # type: ignore[no-untyped-def]
            conds = (Condition(key, op, value),)
            return sorted(r.span_id for r in store.span_records("t", 0, 1000 * SEC, conds))

        assert ids(".x", "=", "b") == [2]
        assert ids(".x", "=", "a") == [1]
        assert ids(".x", "=", "") == [3]
        assert ids(".x", "!=", "b") == [1, 3]
        assert ids(".x", "=~", "a|b") == [1, 2]
        assert ids(".n", ">", 10) == [2, 3]
        assert ids(".n", "<", 10) == [1]
        assert ids(".service.name", "=", "api") == [2, 3]
        assert ids(".service.name", "=", "other") == [1]

    def test_spans_survive_reopen(self, store: Store, reopen) -> None:  # type: ignore[no-untyped-def]
        self._two_traces(store)
        store.close()
        again = reopen()
        try:
            assert len(again.trace("t", TRACE_A)) == 3
            assert again.tag_values("t", "resource", "region") == [("eu", "string")]
        finally:
            again.close()

    def test_delete_before_drops_old_samples_spans_and_series(self, store: Store) -> None:
        old, old_sid = batch_of([(10, ["old_fn"], 1, 0, None)], labels={"service_name": "gone"})
        new, new_sid = batch_of([(500, ["new_fn"], 2, 0, None), (5, ["early"], 4, 0, None)])
        store.write("t", old).result(timeout=30)
        store.write("t", new).result(timeout=30)
        self._two_traces(store)
        report = store.delete_before(150 * SEC)
        assert (report.samples, report.spans, report.series) == (2, 3, 1)
        assert [r.series_id for r in store.series("t")] == [new_sid]
        kept = store.stack_values("t", [new_sid], SampleFilter(0, 1000 * SEC))
        assert kept.values.tolist() == [2]
        assert store.trace("t", TRACE_A) == []
        assert len(store.trace("t", TRACE_B)) == 1
        assert "db" not in store.tag_names("t").get("span", [])
        assert store.tag_values("t", "resource", "service.name") == [("web", "string")]
        # Writes go on after a retention pass, including stacks it may have collected.
        again, _ = batch_of([(600, ["old_fn"], 8, 0, None)], labels={"service_name": "gone"})
        store.write("t", again).result(timeout=30)
        got = store.stack_values("t", [old_sid], SampleFilter(0, 1000 * SEC))
        stacks = store.stacks(got.stack_ids.tolist())
        assert got.values.tolist() == [8] and len(stacks) == 1
        assert store.delete_before(150 * SEC).samples == 0

    # -- agent settings rules ------------------------------------------------------------------

    def test_settings_rules_put_list_replace_delete(self, store: Store) -> None:
        assert store.settings_rules("t") == [] and store.settings_version("t") == 0
        first = store.put_settings_rule("t", "api", "", {"sample_rate": 50})
        assert (first.service, first.selector, first.version) == ("api", "", 1)
        assert dict(first.settings) == {"sample_rate": 50} and first.updated_at > 0
        prod = store.put_settings_rule("t", "api", '{env="prod"}', {"enabled": False})
        other = store.put_settings_rule("t", "web", "", {"profile_types": ["cpu", "wall"]})
        assert (prod.version, other.version) == (2, 3)
        assert [(r.service, r.selector) for r in store.settings_rules("t")] == [
            ("api", ""),
            ("api", '{env="prod"}'),
            ("web", ""),
        ]
        assert [r.selector for r in store.settings_rules("t", "api")] == ["", '{env="prod"}']
        assert store.settings_rules("t", "nobody") == []
        # The same (service, selector) again: its settings are replaced, not merged.
        again = store.put_settings_rule("t", "api", "", {"enabled": True})
        assert again.version == 4 and again.updated_at >= first.updated_at
        (kept,) = [r for r in store.settings_rules("t", "api") if r.selector == ""]
        assert dict(kept.settings) == {"enabled": True} and kept.version == 4
        assert store.settings_version("t") == 4
        assert store.delete_settings_rule("t", "api", '{env="prod"}') is True
        assert store.settings_version("t") == 5
        assert store.delete_settings_rule("t", "api", '{env="prod"}') is False
        assert store.settings_version("t") == 5
        assert [(r.service, r.selector) for r in store.settings_rules("t")] == [
            ("api", ""),
            ("web", ""),
        ]

    def test_settings_rules_of_tenants_are_apart(self, store: Store) -> None:
        store.put_settings_rule("a", "api", "", {"sample_rate": 7})
        store.put_settings_rule("a", "api", "", {"sample_rate": 8})
        assert store.settings_rules("b") == [] and store.settings_rules("b", "api") == []
        assert store.settings_version("b") == 0
        assert store.delete_settings_rule("b", "api", "") is False
        mine = store.put_settings_rule("b", "api", "", {"sample_rate": 9})
        assert mine.version == 1  # per tenant: b's counter ignores a's two changes
        assert dict(store.settings_rules("a")[0].settings) == {"sample_rate": 8}
        assert store.settings_version("a") == 2

    def test_settings_rules_survive_reopen(self, store: Store, reopen) -> None:  # type: ignore[no-untyped-def]
        store.put_settings_rule("t", "api", '{env="prod"}', {"max_overhead": 0.5})
        store.put_settings_rule("t", "gone", "", {"enabled": False})
        store.delete_settings_rule("t", "gone", "")
        store.close()
        again = reopen()
        try:
            (rule,) = again.settings_rules("t")
            assert (rule.service, rule.selector, rule.version) == ("api", '{env="prod"}', 1)
            assert dict(rule.settings) == {"max_overhead": 0.5}
            # The delete's version too, though it left no rule: versions never go back.
            assert again.settings_version("t") == 3
            assert again.put_settings_rule("t", "api", "", {}).version == 4
        finally:
            again.close()

    def test_settings_rule_put_after_close_fails_cleanly(self, store: Store) -> None:
        store.close()
        with pytest.raises(Exception, match="closed"):
            store.put_settings_rule("t", "api", "", {"enabled": True})

    # -- documents -------------------------------------------------------------------------

    def test_documents_put_list_replace_delete(self, store: Store) -> None:
        assert store.documents("alert_rule") == []
        first = store.put_document("t", "alert_rule", "b-rule", {"above": 20, "labels": {}})
        store.put_document("t", "alert_rule", "a-rule", {"above": 5})
        store.put_document("t", "alert_state", "a-rule", {"state": "firing"})
        assert first.body == {"above": 20, "labels": {}} and first.updated_at > 0
        rules = store.documents("alert_rule", "t")
        assert [(d.tenant, d.kind, d.name) for d in rules] == [
            ("t", "alert_rule", "a-rule"),
            ("t", "alert_rule", "b-rule"),
        ]
        # A kind is its own namespace: the state named like a rule is not a rule.
        assert [d.body for d in store.documents("alert_state", "t")] == [{"state": "firing"}]
        again = store.put_document("t", "alert_rule", "b-rule", {"above": 30})
        assert again.updated_at >= first.updated_at
        assert {d.name: dict(d.body) for d in store.documents("alert_rule", "t")} == {
            "a-rule": {"above": 5},
            "b-rule": {"above": 30},
        }
        assert store.delete_document("t", "alert_rule", "a-rule") is True
        assert store.delete_document("t", "alert_rule", "a-rule") is False
        assert [d.name for d in store.documents("alert_rule", "t")] == ["b-rule"]
        assert [d.name for d in store.documents("alert_state", "t")] == ["a-rule"]

    def test_a_document_written_by_a_clock_behind_still_replaces(
        self, store: Store, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Servers over one store whose clocks disagree: the later write wins, a replacement
        and a write after a deletion alike."""
        store.put_document("t", "alert_rule", "skew", {"above": 1})
        real = time.time_ns
        monkeypatch.setattr(time, "time_ns", lambda: real() - 120 * 10**9)
        store.put_document("t", "alert_rule", "skew", {"above": 2})
        assert [dict(d.body) for d in store.documents("alert_rule", "t")] == [{"above": 2}]
        assert store.delete_document("t", "alert_rule", "skew") is True
        store.put_document("t", "alert_rule", "skew", {"above": 3})
        assert [dict(d.body) for d in store.documents("alert_rule", "t")] == [{"above": 3}]

    def test_documents_of_tenants_are_apart(self, store: Store) -> None:
        store.put_document("a", "recording_rule", "cpu", {"metric": "a_cpu"})
        store.put_document("b", "recording_rule", "cpu", {"metric": "b_cpu"})
        assert [d.body["metric"] for d in store.documents("recording_rule", "a")] == ["a_cpu"]
        assert store.delete_document("c", "recording_rule", "cpu") is False
        every = store.documents("recording_rule")
        assert [(d.tenant, d.body["metric"]) for d in every] == [("a", "a_cpu"), ("b", "b_cpu")]
        assert store.delete_document("a", "recording_rule", "cpu") is True
        assert [d.tenant for d in store.documents("recording_rule")] == ["b"]

    def test_documents_survive_reopen(self, store: Store, reopen) -> None:  # type: ignore[no-untyped-def]
        store.put_document("t", "alert_rule", "kept", {"nested": {"list": [1, 2.5, "x"]}})
        store.put_document("t", "alert_rule", "gone", {})
        store.delete_document("t", "alert_rule", "gone")
        store.close()
        again = reopen()
        try:
            (doc,) = again.documents("alert_rule")
            assert (doc.tenant, doc.name) == ("t", "kept")
            assert doc.body == {"nested": {"list": [1, 2.5, "x"]}}
        finally:
            again.close()

    def test_document_put_after_close_fails_cleanly(self, store: Store) -> None:
        store.close()
        with pytest.raises(Exception, match="closed"):
            store.put_document("t", "alert_rule", "x", {})

    # -- API tokens ------------------------------------------------------------------------

    def test_tokens_put_list_revoke_survive_reopen(self, store: Store, reopen) -> None:  # type: ignore[no-untyped-def]
        assert store.tokens() == []
        a = StoredToken("team-a", "id-a", "ingest", "a" * 64, "ci", 5)
        store.put_token(a)
        store.put_token(StoredToken("team-b", "id-b", "admin", "b" * 64))
        store.put_token(StoredToken("team-a", "id-c", "query", "c" * 64, "grafana"))
        # An alert rule is no token, whatever its name.
        store.put_document("team-a", "alert_rule", "id-d", {"role": "admin", "sha256": "d" * 64})
        assert store.tokens("team-a")[0] == a
        assert [(t.tenant, t.token_id, t.role) for t in store.tokens()] == [
            ("team-a", "id-a", "ingest"),
            ("team-a", "id-c", "query"),
            ("team-b", "id-b", "admin"),
        ]
        with pytest.raises(ValueError, match="role"):
            store.put_token(StoredToken("team-a", "id-e", "root", "e" * 64))
        # Revoking is per tenant: another tenant cannot revoke it by its id.
        assert store.delete_token("team-b", "id-a") is False
        assert store.delete_token("team-a", "id-a") is True
        assert store.delete_token("team-a", "id-a") is False
        assert [t.token_id for t in store.tokens()] == ["id-c", "id-b"]
        store.close()
        again = reopen()
        try:
            kept = again.tokens()
            assert [(t.tenant, t.token_id, t.sha256, t.name) for t in kept] == [
                ("team-a", "id-c", "c" * 64, "grafana"),
                ("team-b", "id-b", "b" * 64, ""),
            ]
        finally:
            again.close()

    # -- requests --------------------------------------------------------------------------

    def test_count_local_roots(self, store: Store) -> None:
        self._two_traces(store)
        # Trace C: web calls api (a request of api), whose child calls api again through web
        # (a second request of api); a span of api whose parent started before the range.
        store.write_spans(
            "t", spans_of([(TRACE_C, 20, 0, "GET /", 300, 310, {})], service="web")
        ).result(timeout=30)
        store.write_spans(
            "t",
            spans_of(
                [
                    (TRACE_C, 21, 20, "POST /pay", 301, 309, {}),
                    (TRACE_C, 22, 21, "charge", 302, 303, {}),
                    (TRACE_C, 24, 23, "POST /refund", 305, 306, {}),
                ]
            ),
        ).result(timeout=30)
        store.write_spans(
            "t", spans_of([(TRACE_C, 23, 22, "call", 304, 307, {})], service="web")
        ).result(timeout=30)

        def count(service: str, start: int = 0, end: int = 1000) -> int:
            return store.count_local_roots("t", service, start * SEC, end * SEC)

        # api: GET /pay (no parent), POST /pay (parent of web), POST /refund (parent of web).
        assert count("api") == 3
        assert count("web") == 3  # GET /home, GET /, and call (its parent is api's)
        # charge's parent (POST /pay) started before the range: still not a request.
        assert count("api", 302, 1000) == 1
        assert count("api", 100, 101) == 1 and count("nobody") == 0
        assert store.count_local_roots("other", "api", 0, 1000 * SEC) == 0
        # An export retried after it landed: one request still.
        store.write_spans("t", spans_of([(TRACE_C, 21, 20, "POST /pay", 301, 309, {})])).result(
            timeout=30
        )
        assert count("api") == 3

    def test_baseline_spans_nearest_the_median_of_every_candidate(self, store: Store) -> None:
        # GET /x of api: durations 1..9 s (median 5), one of them also in another trace kept
        # out, one stored twice; spans of another name, service or time are no candidates.
        rows = [(TRACE_A, 100 + d, 0, "GET /x", 10 * d, 10 * d + d, {}) for d in range(1, 10)]
        store.write_spans("t", spans_of(rows)).result(timeout=30)
        store.write_spans("t", spans_of(rows[:1])).result(timeout=30)  # a retried export
        others = [
            (TRACE_B, 200, 0, "GET /y", 10, 15, {}),
            (TRACE_B, 201, 0, "GET /x", 500, 600, {}),  # after the window
            (TRACE_C, 202, 0, "GET /x", 20, 70, {}),  # the one asked about: left out
        ]
        store.write_spans("t", spans_of(others)).result(timeout=30)
        store.write_spans(
            "t", spans_of([(TRACE_B, 203, 0, "GET /x", 30, 31, {})], service="web")
        ).result(timeout=30)

        def pick(limit: int, **kw):  # type: ignore[no-untyped-def]
            return store.baseline_spans(
                "t", "api", "GET /x", 0, 400 * SEC, limit, TRACE_C, [202, 999], **kw
            )

        got = pick(3)
        assert got.median_ns == 5 * SEC and got.candidates == 9
        # 5 s, then 4 s and 6 s (equally near: the later start first).
        assert [s.span_id for s in got.spans] == [105, 106, 104]
        assert got.spans[0].trace_id == TRACE_A and got.spans[0].name == "GET /x"
        assert got.spans[0].end_ns - got.spans[0].start_ns == 5 * SEC
        # An even count: the mean of the middle two.
        even = store.baseline_spans("t", "api", "GET /x", 0, 90 * SEC, 2, TRACE_C, [202])
        assert even.candidates == 8 and even.median_ns == 4.5 * SEC
        assert [s.span_id for s in even.spans] == [105, 104]
        # Without exclusion the span asked about is a candidate too.
        assert store.baseline_spans("t", "api", "GET /x", 0, 400 * SEC, 1).candidates == 10
        assert store.baseline_spans("t", "api", "nothing", 0, 400 * SEC, 5) == ([], None, 0)
        assert store.baseline_spans("other", "api", "GET /x", 0, 400 * SEC, 5).candidates == 0

    def test_request_sides_split_requests_by_their_traces_samples(self, store: Store) -> None:
        # Requests of api: trace A (two requests: a root and a call back from web), trace B,
        # trace C (no samples); a child span of api is no request.
        store.write_spans(
            "t",
            spans_of(
                [
                    (TRACE_A, 1, 0, "GET /a", 10, 20, {}),
                    (TRACE_A, 2, 1, "child", 11, 12, {}),
                    (TRACE_A, 4, 3, "GET /back", 13, 14, {}),
                    (TRACE_B, 5, 0, "GET /b", 30, 40, {}),
                    (TRACE_C, 6, 0, "GET /c", 50, 60, {}),
                ]
            ),
        ).result(timeout=30)
        store.write_spans(
            "t", spans_of([(TRACE_A, 3, 2, "call", 12, 15, {})], service="web")
        ).result(timeout=30)
        old, old_sid = batch_of(
            [(10, ["a"], 7, 1, TRACE_A), (11, ["b"], 2, 2, TRACE_A), (30, ["c"], 1, 5, TRACE_B)],
            labels={"service_name": "api", "version": "1"},
        )
        new, new_sid = batch_of(
            [(30, ["c"], 6, 5, TRACE_B), (9, ["d"], 100, 0, None)],
            labels={"service_name": "api", "version": "2"},
        )
        store.write("t", old).result(timeout=30)
        store.write("t", new).result(timeout=30)
        got = store.request_sides(
            "t", "api", 0, 100 * SEC, ([old_sid], [new_sid]), SampleFilter(0, 100 * SEC)
        )
        # A: 9 of old, none of new -> old, two requests, its 9 once; B: 1 old, 6 new -> new.
        assert got == ((2, 1), (9, 6), 1)
        # The first side on a tie; a side without series holds nothing.
        same = store.request_sides(
            "t", "api", 0, 100 * SEC, ([old_sid], [old_sid]), SampleFilter(0, 100 * SEC)
        )
        assert same == ((3, 0), (10, 0), 1)
        none = store.request_sides("t", "api", 0, 100 * SEC, ([], []), SampleFilter(0, 100 * SEC))
        assert none == ((0, 0), (0, 0), 4)
        # Samples outside their range do not count; requests outside the range are none.
        early = store.request_sides(
            "t", "api", 0, 25 * SEC, ([old_sid], [new_sid]), SampleFilter(0, 11 * SEC)
        )
        assert early == ((2, 0), (7, 0), 0)
        assert store.request_sides(
            "other", "api", 0, 100 * SEC, ([old_sid], [new_sid]), SampleFilter(0, 100 * SEC)
        ) == ((0, 0), (0, 0), 0)

    def test_size_bytes_counts_what_is_stored(self, store: Store) -> None:
        before = store.size_bytes()
        batch, _ = batch_of([(10 + i, ["main", f"f{i}"], i + 1, 0, None) for i in range(2000)])
        store.write("t", batch).result(timeout=30)
        after = store.size_bytes()
        # Every backend here knows its size; a backend that cannot tell answers None.
        assert before is not None and after is not None
        assert after > before >= 0
