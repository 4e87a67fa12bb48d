"""What was acknowledged survives ``kill -9``; SIGTERM finishes accepted work and exits 0."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

import httpx

from tests.conftest import start_server
from tests.helpers import TLS, flamegraph, function_totals, ingest_pprof, make_pprof

T0 = 1_700_000_000


def _push_until_stopped(url: str, stop: threading.Event, acked: list, label: str) -> None:
    with httpx.Client(base_url=url, timeout=10, verify=TLS) as c:
        i = 0
        while not stop.is_set():
            body = make_pprof([([f"fn_{label}_{i % 5}", "main"], 1, {})], time_ns=T0 * 10**9)
            try:
                r = ingest_pprof(c, f"durable{{writer={label}}}", body, T0)
            except httpx.HTTPError:
                return  # the server went away mid-request: not acknowledged
            if r.status_code == 200:
                acked.append(1)
            i += 1


def _total(srv) -> int:  # type: ignore[no-untyped-def]
    with srv.client() as c:
        graph = flamegraph(c, '{service_name="durable"}', T0 - 10, T0 + 10)
        return function_totals(graph).get("main", 0)


@contextlib.contextmanager
def pushing(url: str, until_acked: int) -> Iterator[list]:
    """Four clients pushing until the block ends; entered once ``until_acked`` pushes got 200."""
    stop = threading.Event()
    acked: list = []
    writers = [
        threading.Thread(target=_push_until_stopped, args=(url, stop, acked, str(i)))
        for i in range(4)
    ]
    for w in writers:
        w.start()
    try:
        while len(acked) < until_acked:
            threading.Event().wait(0.02)
        yield acked
    finally:
        stop.set()
        for w in writers:
            w.join()


def test_kill_9_loses_nothing_acknowledged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    srv = start_server(data)
    with pushing(srv.url, 200) as acked:
        srv.process.send_signal(signal.SIGKILL)  # while pushes are in flight
        srv.process.wait(timeout=10)
    srv.process.stdout.close()

    again = start_server(data)  # the store opens again after the crash
    try:
        # Every acknowledged push is there; pushes in flight at the kill may be there too.
        assert _total(again) >= len(acked) >= 200
        with again.client() as c:
            body = make_pprof([(["after_crash", "main"], 1, {})], time_ns=T0 * 10**9)
            assert ingest_pprof(c, "durable{}", body, T0).status_code == 200
    finally:
        again.stop()


def test_sigterm_finishes_accepted_pushes_and_exits_zero(tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    srv = start_server(data)
    with pushing(srv.url, 100) as acked:
        code = srv.stop(signal.SIGTERM)
    assert code == 0
    srv.process.stdout.close()
    again = start_server(data)
    try:
        assert _total(again) >= len(acked)
    finally:
        assert again.stop(signal.SIGINT) == 0
