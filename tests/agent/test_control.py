"""Steering a running agent: its control endpoint mounted in a real ASGI app (Starlette under
uvicorn) and a real WSGI app (wsgiref), or on its own port, each a separate process profiled
under load and uploading to a real ``hotspan server``; what it does is read back from the
server's stored profiles."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import httpx
import pytest

from tests.helpers import TLS, flamegraph, free_port

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"

PRELUDE = """
import os, sys, time, threading
import hotspan, hotspan.control

def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

def handle_work():
    burn(0.004)
    return b"ok"
"""

ASGI_APP = """
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Mount, Route

async def work(request):
    return Response(handle_work())

app = Starlette(routes=[Route("/work", work), Mount("/hotspan", hotspan.control.asgi_app())])

if __name__ == "__main__":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""

WSGI_APP = """
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from socketserver import ThreadingMixIn

control = hotspan.control.wsgi_app()

def app(environ, start_response):
    path = environ.get("PATH_INFO", "")
    if path.startswith("/hotspan"):
        return control(environ, start_response)
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [handle_work()]

class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass

class Threading(ThreadingMixIn, WSGIServer):
    daemon_threads = True

make_server("127.0.0.1", int(sys.argv[1]), app, Threading, Quiet).serve_forever()
"""

PLAIN_PROGRAM = """
stop = False
while not os.path.exists(sys.argv[2]):
    burn(0.01)
"""


class App:
    def __init__(self, proc: subprocess.Popen, url: str, control: str) -> None:
        self.proc = proc
        self.url = url
        self.control = control
        self._stop = threading.Event()
        self._load: Optional[threading.Thread] = None
        self.requests = 0

    def load(self) -> None:
        """Requests without a pause from a thread of the test, until stop_load."""

        def run() -> None:
            with httpx.Client(base_url=self.url, timeout=30, verify=TLS) as client:
                while not self._stop.is_set():
                    client.get("/work")
                    self.requests += 1

        self._load = threading.Thread(target=run, daemon=True)
        self._load.start()

    def stop_load(self) -> None:
        self._stop.set()
        if self._load is not None:
            self._load.join(30)


def start_app(
    tmp_path: Path,
    source: str,
    server_url: str,
    service: str,
    env: Optional[Dict[str, str]] = None,
    args: Optional[List[str]] = None,
    control_path: str = "/hotspan/",
    configure: str = "",
    control_url: Optional[str] = None,
) -> App:
    port = free_port()
    script = tmp_path / f"{service}.py"
    configure = configure or (
        f"hotspan.configure(application_name={service!r}, server_address={server_url!r}, "
        "upload_interval=1, max_overhead=100)\n"
    )
    script.write_text(PRELUDE + configure + textwrap.dedent(source))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), *(args or [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    control = control_url or url + control_path
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the app exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            httpx.get(control, timeout=2, verify=TLS)
            return App(proc, url, control)
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the app did not start")


@pytest.fixture
def apps() -> Iterator[List[App]]:
    started: List[App] = []
    yield started
    for app in started:
        app.stop_load()
        app.proc.kill()
        app.proc.wait(10)
        if app.proc.stdout:
            app.proc.stdout.close()


def cpu_between(client: httpx.Client, service: str, start: float, end: float) -> int:
    graph = flamegraph(client, f'{{service_name="{service}"}}', int(start), int(end) + 1, CPU)
    return int(graph.get("total", 0) or 0)


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def check_switching(app: App, client: httpx.Client, service: str) -> None:
    """DELETE stops the uploads within one interval, POST brings them back within one, a
    bad PUT changes nothing, a good one takes effect."""
    app.load()
    assert wait_for(lambda: cpu_between(client, service, time.time() - 60, time.time()) > 0, 15)
    state = httpx.get(app.control, verify=TLS).json()
    assert state["enabled"] and state["profiling"] and state["sample_rate"] == 100

    off = httpx.delete(app.control, verify=TLS)
    assert off.status_code == 200, off.text
    assert off.json()["enabled"] is False and off.json()["profiling"] is False
    # The last upload (what was sampled until DELETE) is on its way: from the next second on,
    # nothing, while the app stays busy.
    quiet_from = time.time() + 1.5
    time.sleep(4.5)
    assert app.requests > 0
    assert cpu_between(client, service, quiet_from, time.time()) == 0

    on = httpx.post(app.control, verify=TLS)
    assert on.status_code == 200 and on.json()["enabled"] is True
    back_at = time.time()
    # Within one upload interval (1 s) of sampling plus its upload.
    assert wait_for(lambda: cpu_between(client, service, back_at, time.time() + 1) > 0, 4)

    for body, problem in (
        (b'{"sample_rate": 20', "not JSON"),
        (b'{"sample_rate": 5000}', "sample_rate"),
        (b'{"sampel_rate": 20}', "unknown setting 'sampel_rate'"),
        (b'{"profile_types": ["cpu", "gpu"]}', "gpu"),
        (b"[1, 2]", "JSON object"),
        (b'{"sample_rate": Infinity}', "finite"),
        (b'{"max_overhead": NaN}', "finite"),
        (b"[" * 60000, "nested too deeply"),
    ):
        bad = httpx.put(app.control, content=body, verify=TLS)
        assert bad.status_code == 400, (body, bad.text)
        assert problem in bad.json()["error"]
    assert httpx.get(app.control, verify=TLS).json()["sample_rate"] == 100  # nothing changed

    put = httpx.put(app.control, json={"sample_rate": 20, "profile_types": ["cpu"]}, verify=TLS)
    assert put.status_code == 200, put.text
    state = put.json()
    assert state["sample_rate"] == 20 and state["profile_types"] == ["cpu"]
    assert state["local_overrides"] == ["enabled", "profile_types", "sample_rate"]
    assert (
        httpx.put(app.control, json={}, verify=TLS).json()["sample_rate"] == 100
    )  # overrides cleared
    assert httpx.patch(app.control, verify=TLS).status_code == 405


@pytest.mark.parametrize("kind", ["asgi", "wsgi"])
def test_app_switched_off_and_on_under_load(server, apps, tmp_path: Path, kind: str) -> None:
    service = f"ctl-{kind}"
    app = start_app(tmp_path, ASGI_APP if kind == "asgi" else WSGI_APP, server.url, service)
    apps.append(app)
    with server.client() as client:
        check_switching(app, client, service)


def start_on_own_port(
    tmp_path: Path, server_url: str, service: str, env: Dict[str, str], configure: str = ""
) -> Tuple[App, Path]:
    """A program that serves no HTTP, with the control endpoint on HOTSPAN_CONTROL_PORT; it
    runs until the returned file exists."""
    port = free_port()
    flag = tmp_path / "stop"
    app = start_app(
        tmp_path,
        PLAIN_PROGRAM,
        server_url,
        service,
        env={"HOTSPAN_CONTROL_PORT": str(port), **env},
        args=[str(flag)],
        control_url=f"http://127.0.0.1:{port}/",
        configure=configure,
    )
    return app, flag


def test_own_port_with_a_token(server, apps, tmp_path: Path) -> None:
    app, flag = start_on_own_port(tmp_path, server.url, "ctl-port", {"HOTSPAN_CONTROL_TOKEN": "s3"})
    apps.append(app)
    url = app.control
    assert httpx.get(url, verify=TLS).status_code == 401
    assert (
        httpx.get(url, headers={"Authorization": b"Bearer \xff\xfe"}, verify=TLS).status_code == 401
    )
    assert (
        httpx.delete(url, headers={"Authorization": "Bearer wrong"}, verify=TLS).status_code == 401
    )
    assert (
        httpx.get(url, headers={"Authorization": "Bearer s3"}, verify=TLS).json()["enabled"] is True
    )
    off = httpx.delete(url, headers={"Authorization": "Bearer s3"}, verify=TLS)
    assert off.status_code == 200 and off.json()["enabled"] is False
    flag.write_text("")
    assert app.proc.wait(20) == 0


def test_control_without_an_agent_says_so() -> None:
    code = textwrap.dedent(
        """
        import hotspan.control
        status, answer = hotspan.control.handle("GET", b"", "")
        print(status, answer["error"])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("503 hotspan is not running"), out.stdout + out.stderr


def test_an_unreachable_server_never_blocks_the_app(apps, tmp_path: Path) -> None:
    """Uploads and settings polls to a port where nobody listens, and one where a server
    accepts and never answers: requests and control calls go on."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(100)
    away = f"http://127.0.0.1:{free_port()}"
    hanging = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        for name, address in (("away", away), ("hanging", hanging)):
            app = start_app(tmp_path, ASGI_APP, address, f"ctl-{name}")
            apps.append(app)
            with httpx.Client(base_url=app.url, timeout=10, verify=TLS) as client:
                for _ in range(200):
                    assert client.get("/work").status_code == 200
            assert httpx.delete(app.control, timeout=10, verify=TLS).json()["enabled"] is False
            assert httpx.post(app.control, timeout=10, verify=TLS).json()["enabled"] is True
            state = httpx.get(app.control, timeout=10, verify=TLS).json()
            assert state["profiling"] is True
    finally:
        silent.close()


def test_fleet_settings_from_the_server_are_followed(server, apps, tmp_path: Path) -> None:
    """A rule put on the server reaches the agent in the answer to its next upload (or poll,
    while it uploads nothing), and the server shows the instance following it."""
    service = "ctl-fleet"
    app, flag = start_on_own_port(
        tmp_path,
        server.url,
        service,
        {},
        configure=(
            f"hotspan.configure(application_name={service!r}, server_address={server.url!r}, "
            "upload_interval=1, max_overhead=100, tags={'env': 'prod'})\n"
        ),
    )
    apps.append(app)

    def agent() -> dict:
        return httpx.get(app.control, timeout=10, verify=TLS).json()

    def instances(client: httpx.Client) -> list:
        answer = client.get(f"/api/v1/settings/{service}")
        assert answer.status_code == 200, answer.text
        return answer.json()["instances"]

    with server.client() as client:
        assert wait_for(lambda: len(instances(client)) == 1, 10)
        (seen,) = instances(client)
        assert seen["labels"].get("env") == "prod" and seen["status"]["enabled"] is True

        put = client.put(
            f"/api/v1/settings/{service}",
            json={"selector": '{env="prod"}', "settings": {"enabled": False}},
        )
        assert put.status_code == 200, put.text
        version = put.json()["version"]
        # One upload interval (1 s) and the answer to the upload that follows.
        assert wait_for(lambda: agent()["settings_version"] == version, 4)
        state = agent()
        assert state["enabled"] is False and state["profiling"] is False
        disabled_at = time.time()

        # Disabled, it uploads nothing and polls instead: it still reports, and still follows.
        def follows() -> bool:
            (row,) = instances(client)
            return row["follows"] and row["status"]["enabled"] is False

        assert wait_for(follows, 5)
        time.sleep(3)
        assert cpu_between(client, service, disabled_at + 1.5, time.time()) == 0

        put = client.put(
            f"/api/v1/settings/{service}",
            json={"settings": {"enabled": True, "sample_rate": 50, "profile_types": ["cpu"]}},
        )
        assert put.status_code == 200
        # The rule for env="prod" is more specific and still says disabled.
        time.sleep(2.5)
        assert agent()["enabled"] is False
        assert client.delete(
            f"/api/v1/settings/{service}", params={"selector": '{env="prod"}'}
        ).is_success
        assert wait_for(lambda: agent()["sample_rate"] == 50, 4)
        state = agent()
        assert state["enabled"] and state["profile_types"] == ["cpu"]
        enabled_at = time.time()
        assert wait_for(lambda: cpu_between(client, service, enabled_at, time.time() + 1) > 0, 4)

        assert client.delete(f"/api/v1/settings/{service}", params={"selector": ""}).is_success
        # No rule: the agent goes back to its own configuration.
        assert wait_for(lambda: agent()["settings_version"] == 0, 4)
        assert agent()["sample_rate"] == 100, agent()
    flag.write_text("")
    assert app.proc.wait(20) == 0
    # Its last upload, at exit, said it stopped: listed as such, following nothing.
    with server.client() as client:
        (row,) = instances(client)
        assert row["stopped"] is True and row["follows"] is None, row
        assert row["status"]["profiling"] is False


def test_a_forked_worker_of_a_disabled_agent_can_be_enabled(server, tmp_path: Path) -> None:
    """gunicorn --preload: the agent starts disabled in the parent; each worker has its own
    loop, which applies what it is told."""
    code = textwrap.dedent(
        f"""
        import os, sys, time
        import hotspan
        agent = hotspan.configure(application_name="ctl-fork", server_address={server.url!r},
                                  upload_interval=1, enabled=False, max_overhead=100)
        pid = os.fork()
        if pid == 0:
            agent.live.set_enabled(True)
            applied = agent.wait_applied(10)
            state = agent.status()
            hotspan.shutdown()
            os._exit(0 if applied and state["profiling"] else 3)
        _, status = os.waitpid(pid, 0)
        assert agent.status()["profiling"] is False
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_python_sampler_keeps_its_signal_ticks_across_a_rate_change(tmp_path: Path) -> None:
    """The fallback's SIGPROF ticks (what keeps it sampling a busy main thread) survive a
    restart the agent's own thread makes, where no signal handler may be set."""
    code = textwrap.dedent(
        """
        import hotspan
        agent = hotspan.configure(application_name="ctl-py", native=False,
                                  server_address="http://127.0.0.1:9", upload_interval=60)
        assert agent._sampler._signal_ticks
        agent.live.replace_local({"sample_rate": 50})
        assert agent.wait_applied(10)
        assert agent.status()["sample_rate"] == 50, agent.status()
        assert agent._sampler._signal_ticks, "signal ticks lost"
        agent.live.set_enabled(False)
        agent.wait_applied(10)
        agent.live.set_enabled(True)
        agent.wait_applied(10)
        assert agent._sampler._signal_ticks, "signal ticks lost after re-enabling"
        hotspan.shutdown(flush=False)
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr
