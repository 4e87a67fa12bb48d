"""Retention: a real server deletes samples and spans past their age in the background, while
pushes keep being acknowledged and stored."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import List

from tests.conftest import start_server
from tests.helpers import flamegraph, function_totals, ingest_pprof, make_pprof

HOUR = 3600


def spans_json(trace_id: str, name: str, start_s: float) -> dict:
    start = int(start_s * 1e9)
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "keep"}}]
                },
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": trace_id,
                                "spanId": trace_id[:16],
                                "name": name,
                                "kind": 2,
                                "startTimeUnixNano": str(start),
                                "endTimeUnixNano": str(start + 10**9),
                            }
                        ]
                    }
                ],
            }
        ]
    }


def test_old_data_goes_while_ingest_goes_on(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "data", ["--retention", "1h", "--retention-interval", "1s"])
    now = int(time.time())
    old_trace, new_trace = "1" * 32, "2" * 32
    try:
        with srv.client() as c:
            old = make_pprof([(["old_fn", "main"], 5, {})], time_ns=(now - 2 * HOUR) * 10**9)
            assert ingest_pprof(c, "keep{}", old, now - 2 * HOUR).status_code == 200
            r = c.post("/v1/traces", json=spans_json(old_trace, "old", now - 2 * HOUR))
            assert r.status_code == 200, r.text
            r = c.post("/v1/traces", json=spans_json(new_trace, "new", now - 60))
            assert r.status_code == 200, r.text

        # Pushes of fresh data run all along; every one must be acknowledged and kept.
        stop = threading.Event()
        statuses: List[int] = []

        def push() -> None:
            with srv.client() as pc:
                while not stop.is_set():
                    body = make_pprof([(["new_fn", "main"], 1, {})])
                    statuses.append(ingest_pprof(pc, "keep{}", body, int(time.time())).status_code)

        pusher = threading.Thread(target=push)
        pusher.start()
        deadline = time.monotonic() + 30
        gone = False
        with srv.client() as c:
            while time.monotonic() < deadline and not gone:
                time.sleep(0.5)
                old_graph = flamegraph(c, '{service_name="keep"}', now - 3 * HOUR, now - HOUR)
                old_span = c.get(f"/api/traces/{old_trace}").status_code
                gone = not function_totals(old_graph) and old_span == 404
            time.sleep(1)
            stop.set()
            pusher.join()
            assert gone, "old samples and spans were not deleted within 30 s"
            assert statuses and set(statuses) == {200}
            fresh = flamegraph(c, '{service_name="keep"}', now - 60, int(time.time()) + 60)
            assert function_totals(fresh)["new_fn"] == len(statuses)
            assert c.get(f"/api/traces/{new_trace}").status_code == 200
            # Tags seen only on deleted spans are gone too.
            assert c.get("/api/search/tag/name/values").json()["tagValues"] == ["new"]
    finally:
        assert srv.stop() == 0


def test_retention_goes_on_after_the_store_fails_once(tmp_path: Path) -> None:
    """A store that fails a pass (ClickHouse away for a moment) must not end retention for
    good: only a closed store does."""
    from hotspan.server.retention import RetentionLoop
    from hotspan.store.base import StoreUnavailable
    from hotspan.store.duckdb import DuckDBStore

    class FlakyStore(DuckDBStore):
        calls: List[float] = []

        def delete_before(self, cutoff_ns, should_stop=lambda: False):  # type: ignore[no-untyped-def]
            self.calls.append(time.monotonic())
            if len(self.calls) == 1:
                raise StoreUnavailable("ClickHouse away")
            return super().delete_before(cutoff_ns, should_stop)

    store = FlakyStore(str(tmp_path / "data"))
    loop = RetentionLoop(store, retention_ns=HOUR * 10**9, interval_s=0.05)
    loop.start()
    try:
        deadline = time.monotonic() + 20
        while len(store.calls) < 3:
            assert time.monotonic() < deadline, store.calls
            time.sleep(0.05)
    finally:
        loop.stop()
        store.close()
    # Once closed, the loop ends by itself.
    loop = RetentionLoop(store, retention_ns=HOUR * 10**9, interval_s=0.05)
    store.calls.clear()
    loop.start()
    loop._thread.join(timeout=20)
    assert not loop._thread.is_alive()
