"""Many uploads at once through real HTTP to a real ``hotspan server``: decoding runs on
threads beside the event loop, so uploads finish out of order and share commits.  Every
acknowledged upload must be stored exactly once (also after a restart: shutdown drains), and
a malformed upload among them is refused with a 4xx without touching its neighbours."""

from __future__ import annotations

import asyncio
import gzip
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Tuple

import httpx

from hotspan.formats.proto import push_pb2
from tests.conftest import running_server
from tests.helpers import TLS, flamegraph, function_totals, make_pprof

T0 = 1_700_000_000
UPLOADS = 96
SERVICES = 3


def _upload(i: int) -> Tuple[str, bytes, Dict[str, int]]:
    """Upload ``i``: its service and a pprof body whose leaf functions are its own, with
    values that name it, so that a lost or doubled upload shows in the totals."""
    service = f"conc{i % SERVICES}"
    samples = [([f"leaf_{i}_{k}", f"mid_{k}", "main"], 1000 * (i + 1) + k, {}) for k in range(5)]
    body = make_pprof(samples, time_ns=(T0 + i % 7) * 10**9)
    return service, body, {f"leaf_{i}_{k}": 1000 * (i + 1) + k for k in range(5)}


def _push_body(service: str, raw: bytes) -> bytes:
    req = push_pb2.PushRequest()
    series = req.series.add()
    series.labels.add(name="__name__", value="process_cpu")
    series.labels.add(name="service_name", value=service)
    series.samples.add(raw_profile=raw)
    return req.SerializeToString()


BAD_BODIES = [
    b"this is not a profile",
    gzip.compress(b"\x0a\xff\xff\xff\xff\x0f"),  # a string field longer than the profile
    make_pprof([(["f"], 1, {})])[:40],  # truncated gzip
]


async def _send_all(url: str) -> List[Tuple[str, int, str]]:
    """Every upload (half /ingest, half push) and the malformed ones, all in flight together:
    (kind, status, body) in the order sent."""
    sem = asyncio.Semaphore(32)
    async with httpx.AsyncClient(base_url=url, timeout=60, verify=TLS) as client:

        async def one(kind: str, index: int) -> Tuple[str, int, str]:
            async with sem:
                if kind == "bad-ingest":
                    r = await client.post(
                        "/ingest",
                        params={"name": "conc0", "from": str(T0), "format": "pprof"},
                        content=BAD_BODIES[index % len(BAD_BODIES)],
                    )
                elif kind == "bad-push":
                    r = await client.post(
                        "/push.v1.PusherService/Push",
                        content=_push_body("conc1", BAD_BODIES[index % len(BAD_BODIES)]),
                        headers={"content-type": "application/proto"},
                    )
                else:
                    service, body, _ = _upload(index)
                    if index % 2:
                        r = await client.post(
                            "/ingest",
                            params={
                                "name": f"{service}{{}}",
                                "from": str(T0),
                                "until": str(T0 + 10),
                                "format": "pprof",
                            },
                            content=body,
                        )
                    else:
                        r = await client.post(
                            "/push.v1.PusherService/Push",
                            content=_push_body(service, body),
                            headers={"content-type": "application/proto"},
                        )
                return kind, r.status_code, r.text

        jobs = []
        for i in range(UPLOADS):
            jobs.append(one("good", i))
            if i % 16 == 5:
                jobs.append(one("bad-ingest", i))
            if i % 16 == 11:
                jobs.append(one("bad-push", i))
        return list(await asyncio.gather(*jobs))


def _stored(url: str) -> Dict[str, int]:
    totals: Dict[str, int] = {}
    with httpx.Client(base_url=url, timeout=30, verify=TLS) as c:
        for s in range(SERVICES):
            graph = flamegraph(c, f'{{service_name="conc{s}"}}', T0 - 10, T0 + 20)
            for name, value in function_totals(graph).items():
                totals[name] = totals.get(name, 0) + value
    return totals


def test_concurrent_uploads_stored_exactly_once_and_bad_ones_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    expected: Dict[str, int] = {}
    for i in range(UPLOADS):
        expected.update(_upload(i)[2])
    data = tmp_path / "data"
    with running_server(data) as srv:
        # A thread of its own: in a worker that ran the UI tests first, Playwright's loop
        # is current on this one.
        with ThreadPoolExecutor(1) as pool:
            answers = pool.submit(asyncio.run, _send_all(srv.url)).result()
        good = [a for a in answers if a[0] == "good"]
        bad = [a for a in answers if a[0] != "good"]
        assert len(good) == UPLOADS and all(status == 200 for _, status, _ in good), [
            a for a in good if a[1] != 200
        ][:3]
        assert bad and all(status == 400 for _, status, _ in bad), bad
        assert all("pprof" in text or "gzip" in text for _, _, text in bad), bad
        live = _stored(srv.url)
        assert srv.stop() == 0
    for name, value in expected.items():
        assert live.get(name) == value, (name, live.get(name), value)
    # Every upload's five leaves and nothing else besides the shared frames.
    assert {n for n in live if n.startswith("leaf_")} == set(expected)
    with running_server(data) as srv:
        again = _stored(srv.url)
    assert again == live
