"""The case "Why slow?" was built for: a Starlette service on uvicorn whose ``GET /report``
prices rows in pure Python (sha256 over each row), called by three clients at once.  Each
request's thread waits for the GIL while the others price theirs: the answer for a slow one is
"contended", and the code that held the GIL meanwhile is the other requests' ``price_rows``,
not an I/O wait that is not there.  Real service, real HTTP, real spans and samples."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Dict, Iterator, List, Tuple

import httpx
import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import TLS, native_states, traced_program

# Three requests at once share one GIL (and two cores with the client): the verdict follows
# their share of it, which the rest of the suite would crowd.
pytestmark = [pytest.mark.timing, native_states]

SERVICE = traced_program(
    "reports",
    """
    import hashlib
    import socket

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    ROWS = [f"order-{i},widget,{i * 7 % 100}.99".encode() for i in range(4000)]

    def price_rows():
        total = 0
        for _ in range(80):
            for row in ROWS:
                total += hashlib.sha256(row).digest()[0]
        return total

    def report(request):
        # A plain function: Starlette runs it on its thread pool, a thread per request.
        with tracer.start_as_current_span("GET /report") as span:
            with tracer.start_as_current_span("price_rows") as child:
                price_rows()
        ids = span.get_span_context(), child.get_span_context()
        return JSONResponse(
            {
                "trace": format(ids[0].trace_id, "032x"),
                "span": format(ids[0].span_id, "016x"),
                "child": format(ids[1].span_id, "016x"),
            }
        )

    async def quit(request):
        server.should_exit = True
        return JSONResponse({})

    app = Starlette(routes=[Route("/report", report), Route("/quit", quit, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is told: uvicorn listens only once its loop has started, and
    # a client that connects before then is refused.
    sock.listen(128)
    print("PORT", sock.getsockname()[1], flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])
    """,
)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[RunningServer, str]]:
    with running_server(tmp_path_factory.mktemp("why-service") / "data") as srv:
        path = tmp_path_factory.mktemp("service") / "service.py"
        path.write_text(SERVICE)
        proc = subprocess.Popen(
            [sys.executable, str(path), srv.url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"OTEL_BSP_SCHEDULE_DELAY": "200", "PATH": "/usr/bin:/bin"},
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("PORT "), line + (proc.stderr.read() if proc.stderr else "")
            yield srv, f"http://127.0.0.1:{int(line.split()[1])}"
        finally:
            try:
                httpx.post(f"http://127.0.0.1:{int(line.split()[1])}/quit", timeout=10, verify=TLS)
                _, err = proc.communicate(timeout=60)
                assert proc.returncode == 0, err
            finally:
                proc.kill()


def get_reports(url: str, count: int) -> List[Dict[str, object]]:
    out = []
    with httpx.Client(timeout=60, verify=TLS) as client:
        for _ in range(count):
            start = time.monotonic()
            body = client.get(url + "/report").json()
            body["seconds"] = time.monotonic() - start
            out.append(body)
    return out


def test_a_request_slowed_by_the_others_is_contended(service) -> None:  # type: ignore[no-untyped-def]
    srv, url = service
    # Calm first: one client, one request at a time, the baseline.  Twelve of them: the
    # baseline is the 8 spans like it nearest their median, calm ones, where with as many
    # calm as crowded requests it would hold crowded ones too, as much GIL wait in its mean
    # as a slow one's extra.
    get_reports(url, 12)
    # Then three clients at once.
    results: List[List[Dict[str, object]]] = [[], [], []]

    def client(k: int) -> None:
        results[k] = get_reports(url, 3)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slowest = max((r for rs in results for r in rs), key=lambda r: float(r["seconds"]))  # type: ignore[arg-type]
    # Its samples come with the agent's uploads (every second, of the second before), its
    # spans sooner: asked at once, the answer waits for them rather than call the part not
    # uploaded yet "waiting".
    params = {"spanID": slowest["span"], "baselineSpans": 8}
    with srv.client() as c:
        early = c.get(f"/api/traces/{slowest['trace']}/why", params=params)
    if early.status_code == 200:
        assert early.json()["verdict"] in ("pending", "contended"), early.json()["summary"]
    time.sleep(2.5)
    deadline = time.monotonic() + 30
    with srv.client() as c:
        while True:
            r = c.get(f"/api/traces/{slowest['trace']}/why", params=params)
            assert r.status_code in (200, 404), r.text
            answer = r.json() if r.status_code == 200 else {}
            if answer.get("verdict") not in (None, "pending") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    summary = answer.get("summary", "")
    assert answer.get("verdict") == "contended", answer
    assert "I/O" not in summary, summary
    # The code that held the GIL while it waited: the other requests' price_rows.
    holders = [h["name"] for h in answer["gilHolders"]]
    assert holders and holders[0] == "__main__.price_rows", answer["gilHolders"]
    assert "__main__.price_rows" in summary
    split = {k: int(v) for k, v in answer["split"].items()}
    assert split["gilWaitNanos"] > split["otherNanos"], split
