"""``hotspan attach`` / ``detach``: the agent started in a running server and stopped again.

On CPython 3.14+ (``sys.remote_exec``) against a real uvicorn server under load, instrumented
with the OpenTelemetry SDK: profiles with span ids arrive after attach, the server keeps
serving, and its latency after detach is what it was before.  Elsewhere: the command says what
it needs.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from hotspan.formats.proto import profile_pb2
from tests.helpers import TLS, flamegraph, free_port, function_totals, wait_serving

NEEDS_REMOTE_EXEC = pytest.mark.skipif(
    not hasattr(sys, "remote_exec"),
    reason="attaching needs CPython 3.14+ (sys.remote_exec); run under scripts/matrix.sh 3.14",
)

# A Starlette app on uvicorn: each request a span of the SDK's, whose handler prices rows.
SERVER = """
import os, sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
import uvicorn

provider = TracerProvider(resource=Resource.create({"service.name": sys.argv[3]}))
exporter = OTLPSpanExporter(endpoint=sys.argv[2] + "/v1/traces")
provider.add_span_processor(BatchSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")


def price_rows():
    total = 0
    for i in range(20000):
        total += i * i % 7
    return total


async def price(request):
    with tracer.start_as_current_span("GET /price"):
        return PlainTextResponse(str(price_rows()))


app = Starlette(routes=[Route("/price", price)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


# The service's name, its spans' and (given to attach) its profiles'.
SERVICE = f"attached_{os.getpid()}"


def hotspan(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hotspan", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if not k.startswith("HOTSPAN_")},
    )


class Load:
    """Requests one after another from a thread, each one's latency kept with its time."""

    def __init__(self, url: str) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, timeout=10, verify=TLS)
        self.samples: List[Tuple[float, float]] = []
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                ok = self.client.get("/price").status_code == 200
            except Exception:  # noqa: BLE001 - counted
                ok = False
            if ok:
                self.samples.append((started, time.monotonic() - started))
            else:
                self.errors += 1

    def latency(self, since: float, until: float) -> float:
        return statistics.median(d for t, d in self.samples if since <= t < until)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.client.close()


@pytest.fixture
def served(module_server, tmp_path: Path) -> Iterator[Tuple[subprocess.Popen, Load]]:  # type: ignore[no-untyped-def]
    pytest.importorskip("uvicorn")
    script = tmp_path / "shop.py"
    script.write_text(SERVER)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "OTEL_"))}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), module_server.url, SERVICE],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_serving(f"http://127.0.0.1:{port}/price", proc)
    load = Load(f"http://127.0.0.1:{port}")
    try:
        yield proc, load
    finally:
        load.close()
        proc.terminate()
        proc.communicate(timeout=30)


@NEEDS_REMOTE_EXEC
def test_attach_profiles_a_live_server_and_detach_leaves_it_as_it_was(
    module_server,  # type: ignore[no-untyped-def]
    served: Tuple[subprocess.Popen, Load],
    tmp_path: Path,
) -> None:
    proc, load = served
    time.sleep(3)
    before = (time.monotonic() - 3, time.monotonic())
    service = SERVICE
    started = hotspan(
        "attach",
        "--application-name",
        service,
        "--server-address",
        module_server.url,
        "--upload-interval",
        "1",
        str(proc.pid),
    )
    assert started.returncode == 0, started.stderr
    assert f"profiling process {proc.pid} as {service}" in started.stderr
    # Again: it says so, and leaves the running agent alone.
    again = hotspan("attach", str(proc.pid))
    assert again.returncode == 1 and "already profiles this process" in again.stderr

    # Profiles arrive, their samples linked to the requests' spans.
    deadline = time.monotonic() + 30
    with module_server.client() as client:
        while True:
            now = int(time.time())
            totals = function_totals(
                flamegraph(client, f'{{service_name="{service}"}}', now - 300, now + 60)
            )
            linked = client.get(
                "/api/v1/endpoints",
                params={"service": service, "start": now - 300, "end": now + 60},
            ).json()
            requests = {e["name"]: e for e in linked.get("endpoints", [])}
            price = requests.get("GET /price", {})
            if (
                totals.get("__main__.price_rows")
                and price.get("total")
                or time.monotonic() > deadline
            ):
                break
            time.sleep(0.5)
    assert totals.get("__main__.price_rows", 0) > 0, sorted(totals)[:20]
    assert price.get("requests", 0) > 10 and price.get("total", 0) > 0, linked

    stopped = hotspan("detach", str(proc.pid))
    assert stopped.returncode == 0, stopped.stderr
    gone = hotspan("detach", str(proc.pid))
    assert gone.returncode == 1 and "does not profile this process" in gone.stderr
    detached_at = time.monotonic()
    time.sleep(3)
    after = (detached_at + 0.5, time.monotonic())
    # It kept serving all along, as fast after detach as before attach.
    assert proc.poll() is None and load.errors == 0
    slow, fast = load.latency(*after), load.latency(*before)
    assert slow < 1.3 * fast + 0.002, (fast, slow)
    # No thread of the agent is left behind.
    threads = Path(f"/proc/{proc.pid}/task").iterdir()
    names = {(t / "comm").read_text().strip() for t in threads}
    assert not any(n.startswith("hotspan") for n in names), names

    # A recording of a few seconds to a file, as hotspan record writes it.
    out = tmp_path / "incident.pb.gz"
    recorded = hotspan("attach", "--duration", "2s", "-o", str(out), str(proc.pid))
    assert recorded.returncode == 0, recorded.stderr
    profile = profile_pb2.Profile.FromString(gzip.decompress(out.read_bytes()))
    strings = [bytes(s).decode() for s in profile.string_table]
    assert "__main__.price_rows" in strings, strings[:40]
    assert "recorded" in recorded.stderr or str(out) in recorded.stderr, recorded.stderr
    assert hotspan("detach", str(proc.pid)).returncode == 1  # it detached itself


@NEEDS_REMOTE_EXEC
def test_what_cannot_be_attached_is_said(tmp_path: Path) -> None:
    assert "no process" in hotspan("attach", "999999999").stderr
    # A process that turned remote debugging off.
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"],
        env={**os.environ, "PYTHON_DISABLE_REMOTE_DEBUG": "1"},
    )
    try:
        time.sleep(0.5)
        refused = hotspan("attach", "--timeout", "3", str(sleeper.pid))
        assert refused.returncode == 1
        assert "cannot take the agent" in refused.stderr, refused.stderr
    finally:
        sleeper.kill()
        sleeper.wait()
    # A program that runs its own agent: attach leaves it, and so does detach.
    own = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import hotspan, time\n"
            "hotspan.configure(application_name='own', server_address='none')\n"
            "while True: time.sleep(0.05)",
        ],
        env={k: v for k, v in os.environ.items() if not k.startswith("HOTSPAN_")},
    )
    try:
        time.sleep(1.0)
        again = hotspan("attach", str(own.pid))
        assert again.returncode == 1 and "already profiles" in again.stderr, again.stderr
        kept = hotspan("detach", str(own.pid))
        assert kept.returncode == 1 and "started its agent itself" in kept.stderr, kept.stderr
        assert own.poll() is None
    finally:
        own.kill()
        own.wait()


# The CLI (the server's query language among what it imports) needs google-re2, which has no
# free-threaded build: there only the agent is installed (scripts/matrix.sh).
NEEDS_CLI = pytest.mark.skipif(
    importlib.util.find_spec("re2") is None,
    reason="the CLI's dependencies are not installed (google-re2 has no free-threaded build)",
)


@NEEDS_CLI
@pytest.mark.skipif(hasattr(sys, "remote_exec"), reason="this Python can attach")
def test_attach_on_an_older_python_says_what_it_needs() -> None:
    for command in ("attach", "detach"):
        result = hotspan(command, str(os.getpid()))
        assert result.returncode == 1
        assert "needs Python 3.14 or newer" in result.stderr, result.stderr
        assert "hotspan run" in result.stderr
    bad = hotspan("attach", "--duration", "2s", str(os.getpid()))
    assert bad.returncode == 1 and "--duration and -o go together" in bad.stderr


@NEEDS_CLI
def test_attach_settings_are_checked_and_take_the_types_asked_for() -> None:
    import argparse

    from hotspan.cli.attach import _settings
    from hotspan.cli.client import CLIError

    def options(**given: object) -> argparse.Namespace:
        base = dict.fromkeys(
            ("application_name", "server_address", "sample_rate", "upload_interval"),
        )
        base.update(auth_token=None, tenant_id=None, tag=None, types=None, pid=os.getpid())
        base.update(given)
        return argparse.Namespace(**base)

    env = _settings(options(types="cpu,alloc", tag=["env=prod"]), None)
    assert env["HOTSPAN_CPU"] == "true" and env["HOTSPAN_WALL"] == "false"
    assert env["HOTSPAN_ALLOC_SAMPLE_BYTES"] == str(512 * 1024)
    assert env["HOTSPAN_TAGS"] == "env=prod"
    # Recording: every type, into the spool, with span ids off (a file keeps no labels).
    recording = _settings(options(), "/tmp/spool")
    assert recording["HOTSPAN_SERVER_ADDRESS"] == "file:///tmp/spool"
    assert recording["HOTSPAN_LOCKS"] == "true" and recording["HOTSPAN_ALLOC_SAMPLE_BYTES"] != "0"
    with pytest.raises(CLIError):
        _settings(options(sample_rate=-5), None)
    with pytest.raises(CLIError, match="--tag"):
        _settings(options(tag=["no equals sign"]), None)
