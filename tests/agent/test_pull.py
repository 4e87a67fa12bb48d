"""Pull mode: a real Python program serves Go's /debug/pprof paths (mounted in a Starlette app,
in a WSGI app, on the control port) and ``go tool pprof`` reads them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from tests.helpers import GO, free_port, go_env

needs_go = pytest.mark.skipif(GO is None, reason="`go` is not on PATH (go tool pprof reads them)")

# The program scraped in tests/server/test_scrape.py too: known functions burn CPU, allocate
# and keep memory, contend on a lock, wait on an event, and sleep in asyncio tasks.  Pull only
# (server_address "none"), its endpoints on the control port.
TARGET = textwrap.dedent(
    """
    import asyncio, os, sys, threading, time
    import hotspan

    hotspan.configure(
        application_name="pulled", server_address="none", control_port=int(sys.argv[1]),
        upload_interval=1, alloc_sample_bytes=64 * 1024,
    )

    def burn_cpu_known():
        x = 0
        while True:
            for i in range(10000):
                x += i % 7

    KEPT = []

    def allocate_known():
        while True:
            KEPT.append(bytearray(256 * 1024))
            if len(KEPT) > 40:
                del KEPT[:20]
            time.sleep(0.005)

    LOCK = threading.Lock()

    def contend_known():
        while True:
            with LOCK:
                time.sleep(0.005)

    def wait_known(event):
        event.wait()

    async def sleep_known():
        await asyncio.sleep(3600)

    async def main():
        tasks = [asyncio.ensure_future(sleep_known()) for _ in range(3)]
        print("READY", flush=True)
        await asyncio.sleep(3600)

    STOP = threading.Event()
    for target, args in ((burn_cpu_known, ()), (allocate_known, ()), (contend_known, ()),
                         (contend_known, ()), (wait_known, (STOP,)), (wait_known, (STOP,))):
        threading.Thread(target=target, args=args, daemon=True).start()
    asyncio.run(main())
    """
)

STARLETTE_APP = textwrap.dedent(
    """
    import sys, time
    import hotspan, hotspan.debug_pprof
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    hotspan.configure(application_name="asgi-app", server_address="none", upload_interval=1)

    def starlette_hot_loop(n):
        total = 0
        for i in range(n):
            total += i * i % 13
        return total

    async def burn(request):
        # On the event loop, on purpose: the pull must still answer while it burns.
        return PlainTextResponse(str(starlette_hot_loop(200_000)))

    async def ping(request):
        return PlainTextResponse("pong")

    app = Starlette(routes=[
        Route("/burn", burn), Route("/ping", ping),
        Mount("/debug/pprof", hotspan.debug_pprof.asgi_app()),
    ])
    print("READY", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)

WSGI_APP = textwrap.dedent(
    """
    import sys, threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
    import hotspan, hotspan.debug_pprof

    hotspan.configure(application_name="wsgi-app", server_address="none", upload_interval=1)

    def wsgi_hot_loop():
        x = 0
        while True:
            for i in range(10000):
                x += i % 11

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):
            pass

    class Threaded(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    pprof = hotspan.debug_pprof.wsgi_app()

    def app(environ, start_response):
        if environ["PATH_INFO"].startswith("/debug/pprof"):
            return pprof(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no"]

    threading.Thread(target=wsgi_hot_loop, daemon=True).start()
    server = make_server("127.0.0.1", int(sys.argv[1]), app, Threaded, Quiet)
    print("READY", flush=True)
    server.serve_forever()
    """
)


def start_program(
    tmp: Path, name: str, source: str, env: Optional[Dict[str, str]] = None
) -> Tuple[subprocess.Popen, int]:
    """Runs ``source`` with a free port as argv[1]; returns once it printed READY and the
    port answers."""
    script = tmp / f"{name}.py"
    script.write_text(source)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOTSPAN_REMOTE_SETTINGS": "false", **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", f"{name} did not start: {line!r} {proc.stderr.read()}"  # type: ignore[union-attr]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"{name} does not listen on {port}")


def stop_program(proc: subprocess.Popen) -> str:
    """Stops it; returns its stderr."""
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err or ""


def pprof_top(tmp: Path, *args: str) -> str:
    """``go tool pprof -top ARGS``'s output (it fetches the URL itself)."""
    assert GO is not None
    done = subprocess.run(
        [GO, "tool", "pprof", "-top", "-nodecount=200", *args],
        capture_output=True,
        text=True,
        env=go_env(tmp),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def top_self(output: str) -> Dict[str, float]:
    """flat% by function name from ``-top`` output."""
    out: Dict[str, float] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[1].endswith("%") and parts[2].endswith("%"):
            out[" ".join(parts[5:])] = float(parts[1].rstrip("%"))
    return out


def get(url: str, timeout: float = 60) -> Tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[int, List[str]]]:
    proc, port = start_program(tmp_path_factory.mktemp("target"), "target", TARGET)
    errors: List[str] = []
    try:
        time.sleep(1.5)  # a collectors' round or two
        yield port, errors
    finally:
        errors.append(stop_program(proc))


@needs_go
def test_starlette_mount_cpu_read_by_go_tool_pprof(tmp_path: Path) -> None:
    proc, port = start_program(tmp_path, "asgi", STARLETTE_APP)
    stop = threading.Event()
    pings: List[float] = []

    def load() -> None:
        while not stop.is_set():
            get(f"http://127.0.0.1:{port}/burn", timeout=10)

    def ping() -> None:
        time.sleep(0.5)
        while not stop.is_set():
            started = time.monotonic()
            get(f"http://127.0.0.1:{port}/ping", timeout=10)
            pings.append(time.monotonic() - started)
            time.sleep(0.1)

    threads = [threading.Thread(target=load), threading.Thread(target=ping)]
    for t in threads:
        t.start()
    try:
        # Two pulls at once: both are answered, each with its own copy of the samples.
        other: Dict[str, Tuple[int, bytes]] = {}
        second = threading.Thread(
            target=lambda: other.setdefault(
                "r", get(f"http://127.0.0.1:{port}/debug/pprof/profile?seconds=2")
            )
        )
        second.start()
        started = time.monotonic()
        out = pprof_top(tmp_path, "-seconds", "2", f"http://127.0.0.1:{port}/debug/pprof/profile")
        elapsed = time.monotonic() - started
        second.join(30)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
        stop_program(proc)
    assert "Type: cpu" in out, out
    flat = top_self(out)
    assert flat.get("__main__.starlette_hot_loop", 0) > 30, out
    assert 1.9 < elapsed < 15, elapsed
    assert other["r"][0] == 200 and other["r"][1][:2] == b"\x1f\x8b", other["r"][:1]
    # The event loop kept answering while the pulls waited their 2 seconds.
    assert pings and max(pings) < 1.0, pings


@needs_go
@pytest.mark.parametrize("sampler", ["native", "python"])
def test_wsgi_app_cpu_read_by_go_tool_pprof(tmp_path: Path, sampler: str) -> None:
    # The pure-Python sampler closes its windows for a pull as the native one does.
    env = {"HOTSPAN_NO_SPEEDUPS": "1"} if sampler == "python" else {}
    proc, port = start_program(tmp_path, "wsgi", WSGI_APP, env)
    try:
        out = pprof_top(tmp_path, f"http://127.0.0.1:{port}/debug/pprof/profile?seconds=2")
        status, body = get(f"http://127.0.0.1:{port}/debug/pprof/")
    finally:
        err = stop_program(proc)
    assert "Type: cpu" in out, out
    assert top_self(out).get("__main__.wsgi_hot_loop", 0) > 50, out
    assert status == 200 and b"goroutine" in body and b"profile" in body
    assert "Traceback" not in err, err


@needs_go
def test_control_port_cpu(tmp_path: Path, target: Tuple[int, List[str]]) -> None:
    port, _ = target
    out = pprof_top(tmp_path, "-seconds", "1", f"http://127.0.0.1:{port}/debug/pprof/profile")
    assert "Type: cpu" in out, out
    assert top_self(out).get("__main__.burn_cpu_known", 0) > 30, out


@needs_go
@pytest.mark.parametrize(
    "path, sample_index, kind, function",
    [
        ("heap", "", "inuse_space", "__main__.allocate_known"),
        ("heap", "alloc_space", "alloc_space", "__main__.allocate_known"),
        ("allocs", "", "alloc_space", "__main__.allocate_known"),
        ("mutex", "", "delay", "__main__.contend_known"),
        ("mutex", "contentions", "contentions", "__main__.contend_known"),
        ("goroutine", "", "goroutine", "__main__.wait_known"),
        ("goroutine", "", "goroutine", "__main__.sleep_known"),
    ],
)
def test_other_profiles_read_by_go_tool_pprof(
    tmp_path: Path,
    target: Tuple[int, List[str]],
    path: str,
    sample_index: str,
    kind: str,
    function: str,
) -> None:
    port, _ = target
    args = [f"-sample_index={sample_index}"] if sample_index else []
    out = pprof_top(tmp_path, *args, f"http://127.0.0.1:{port}/debug/pprof/{path}")
    assert f"Type: {kind}" in out, out
    assert function in out, out


def test_goroutine_counts_threads_and_tasks(target: Tuple[int, List[str]]) -> None:
    port, _ = target
    status, body = get(f"http://127.0.0.1:{port}/debug/pprof/goroutine?debug=1")
    assert status == 200
    text = body.decode()
    # Two threads wait in wait_known, three tasks sleep in sleep_known.
    blocks = text.split("\n\n")
    assert blocks[0].startswith("goroutine profile: total ")

    def count(function: str) -> int:
        # Each block: "N @", then one "#\tname\tfile:line" a frame.
        heads = [b.split(" @")[0].splitlines()[-1] for b in blocks if f"\t{function}\t" in b]
        return sum(int(h) for h in heads)

    assert count("__main__.wait_known") == 2, text
    assert count("__main__.sleep_known") == 3, text


def test_cumulative_allocs_grow(target: Tuple[int, List[str]]) -> None:
    from hotspan.formats.pprof import read_stack_profile

    port, _ = target
    totals = []
    for _ in range(2):
        status, body = get(f"http://127.0.0.1:{port}/debug/pprof/allocs")
        assert status == 200
        profile = read_stack_profile(body)
        totals.append(profile.total(profile.select("alloc_space")))
        time.sleep(1.5)
    # Since the start: the second look includes the first (allocate_known never stops).
    assert totals[1] > totals[0] > 0, totals


def test_bad_requests_are_refused_with_a_reason(target: Tuple[int, List[str]]) -> None:
    port, _ = target
    base = f"http://127.0.0.1:{port}/debug/pprof"
    for query, words in (
        ("seconds=abc", "whole number"),
        ("seconds=0", "between 1 and 300"),
        ("seconds=100000", "between 1 and 300"),
        ("seconds=1.5", "whole number"),
    ):
        status, body = get(f"{base}/profile?{query}")
        assert status == 400, (query, status, body)
        assert words in body.decode(), body
    status, body = get(f"{base}/nosuch")
    assert status == 404 and b"unknown profile" in body


def test_a_profile_turned_off_is_404_not_empty(target: Tuple[int, List[str]]) -> None:
    port, _ = target
    control = f"http://127.0.0.1:{port}/"

    def put(body: bytes) -> None:
        req = urllib.request.Request(control, data=body, method="PUT")
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200

    put(b'{"profile_types": ["cpu", "wall", "threads"]}')
    try:
        for path, words in (("heap", b"alloc profile is turned off"), ("mutex", b"locks")):
            status, body = get(f"http://127.0.0.1:{port}/debug/pprof/{path}")
            assert status == 404, (path, status, body)
            assert words in body, body
    finally:
        put(b"{}")
    status, _ = get(f"http://127.0.0.1:{port}/debug/pprof/heap")
    assert status == 200


def test_pull_only_program_stderr_is_quiet(tmp_path: Path) -> None:
    proc, port = start_program(tmp_path, "quiet", TARGET)
    time.sleep(3.5)  # three upload intervals
    status, _ = get(f"http://127.0.0.1:{port}/debug/pprof/goroutine")
    err = stop_program(proc)
    assert status == 200
    assert "hotspan" not in err and "Traceback" not in err, err


def test_an_upload_beside_the_import_of_pull_mode_finds_no_hub(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's loop looks for the hub while the program's thread may be importing pull
    mode (starting the control port does): CPython puts a module in sys.modules before its
    names exist, and an upload then must neither fail nor stop profiling."""
    import types

    from hotspan.agent.outbox import pull_hub

    importing = types.ModuleType("hotspan.agent.pull")
    monkeypatch.setitem(sys.modules, "hotspan.agent.pull", importing)
    assert pull_hub() is None
    importing.HUB = hub = object()  # its body has run
    assert pull_hub() is hub
