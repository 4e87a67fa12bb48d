"""The behaviour every storage backend must have.  A backend's test module subclasses
:class:`StoreContract` and provides the ``store`` and ``reopen`` fixtures."""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import pytest

from hotspan.model.labels import normalize
from hotspan.model.profile import Frame, IngestBatch, ProfileType
from hotspan.store.base import SampleFilter, Store

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
