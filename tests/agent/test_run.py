"""``hotspan run``: real child processes profiled through the bootstrap ``sitecustomize``,
uploading over real HTTP on 127.0.0.1 to a recording OTLP/ingest receiver or a real server."""

from __future__ import annotations

import gzip
import http.server
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional
from urllib.parse import parse_qs, urlsplit

import pytest

from hotspan.agent import run as run_module
from hotspan.formats.ingest_params import parse_app_name
from hotspan.formats.proto import profile_pb2
from tests.conftest import RunningServer
from tests.helpers import TLS, flamegraph, free_port, function_totals, wait_serving

trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="opentelemetry-proto comes with the test extra (opentelemetry-exporter-otlp)",
)

HOT_FUNCTION = "burn_cpu_for_hotspan_run"
CPU_TYPE = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
WALL_TYPE = "wall:wall:nanoseconds:wall:nanoseconds"
# Frames of hotspan's own work: its agent, the root span's export (OpenTelemetry's SDK and
# exporter, over requests/urllib3), none of which the program calls.
AGENT_MODULES = ("hotspan.", "opentelemetry.", "requests.", "urllib3.", "tag_wrapper")

# Burns CPU in one named function, then says what it saw of argv and of the bootstrap.
SCRIPT = textwrap.dedent(
    f"""
    import os, sys, time

    def {HOT_FUNCTION}(seconds):
        end = time.process_time() + seconds
        n = 0
        while time.process_time() < end:
            n += 1
        return n

    print("ARGV", sys.argv[1:], flush=True)
    print("ROOT", os.environ.get("HOTSPAN_RUN_ROOT_SPAN", ""), flush=True)
    print("SITECUSTOMIZE", sys.modules["sitecustomize"].__file__, flush=True)
    {HOT_FUNCTION}(float(os.environ.get("BURN_SECONDS", "1.0")))
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
    """
)


@dataclass
class Received:
    path: str
    query: Dict[str, List[str]]
    headers: Dict[str, str]  # names in lower case
    body: bytes


@dataclass
class Receiver:
    """Records POSTs: /v1/traces (answered as an OTLP collector does) and profile uploads."""

    url: str
    requests: List[Received] = field(default_factory=list)

    def traces(self) -> List[object]:
        out = []
        for r in self.requests:
            if r.path == "/v1/traces":
                msg = trace_service_pb2.ExportTraceServiceRequest()
                msg.ParseFromString(r.body)
                out.append(msg)
        return out

    def spans(self) -> List[tuple]:
        """(service.name, span) of every span received."""
        out = []
        for msg in self.traces():
            for rs in msg.resource_spans:
                attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    out.extend((attrs.get("service.name"), span) for span in ss.spans)
        return out

    def ingests(self) -> List[Received]:
        return [r for r in self.requests if r.path.endswith("/ingest")]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    recorded: List[Received] = []
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            split = urlsplit(self.path)
            with lock:
                recorded.append(
                    Received(
                        split.path,
                        parse_qs(split.query),
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                    )
                )
            if split.path == "/v1/traces":
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                content_type = "application/x-protobuf"
            else:
                answer, content_type = b"", "text/plain"
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    rec = Receiver(f"http://127.0.0.1:{server.server_address[1]}", recorded)
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()


def hotspan_run(
    args: List[str], env: Optional[Dict[str, str]] = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "PYROSCOPE_", "OTEL_"))
    }
    env = dict(env or {})
    # The hotspan under test (a checkout's src on PYTHONPATH) stays importable in the child.
    inherited = os.environ.get("PYTHONPATH")
    if "PYTHONPATH" in env and inherited:
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], inherited])
    base.update({"HOTSPAN_UPLOAD_INTERVAL": "1", **env})
    return subprocess.run(
        [sys.executable, "-m", "hotspan", "run", *args],
        env=base,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "generator.py"
    path.write_text(SCRIPT)
    return path


def app_names(rec: Receiver) -> List[tuple]:
    return [parse_app_name(r.query["name"][0]) for r in rec.ingests()]


def sample_labels(rec: Receiver) -> List[Dict[str, str]]:
    """String labels of every sample in every pprof upload received."""
    return [labels for labels, _ in labelled_stacks(rec)]


def labelled_stacks(rec: Receiver) -> List[tuple]:
    """(string labels, function names) of every sample in every pprof upload received."""
    out = []
    for r in rec.ingests():
        body = gzip.decompress(r.body) if r.body[:2] == b"\x1f\x8b" else r.body
        profile = profile_pb2.Profile()
        profile.ParseFromString(body)
        strings = [bytes(s).decode() for s in profile.string_table]
        names = {f.id: strings[f.name] for f in profile.function}
        locations = {
            loc.id: [names[line.function_id] for line in loc.line] for loc in profile.location
        }
        for sample in profile.sample:
            labels = {strings[lb.key]: strings[lb.str] for lb in sample.label if lb.str}
            stack = {name for loc in sample.location_id for name in locations[loc]}
            out.append((labels, stack))
    return out


def test_script_gets_root_span_and_trace_tags(receiver: Receiver, script: Path) -> None:
    result = hotspan_run(
        ["--application-name", "gen", "--tag", "env=dev", "--server-address", receiver.url]
        + ["--", "python", str(script), "arg1", "--flag"],
        env={"EXIT_CODE": "3"},
    )
    assert result.returncode == 3, result.stderr
    assert "ARGV ['arg1', '--flag']" in result.stdout
    # One line of ours: the trace id, to find the job's profile by (checked below).
    (trace_line,) = [line for line in result.stderr.splitlines() if "hotspan" in line]
    # The bootstrap stays sitecustomize when no other one hides behind it.
    assert "SITECUSTOMIZE " + run_module.BOOTSTRAP_DIR in result.stdout

    spans = receiver.spans()
    assert [(service, span.name) for service, span in spans] == [("gen", "gen.run")]
    span = spans[0][1]
    assert span.kind == span.SPAN_KIND_INTERNAL
    assert not span.parent_span_id
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["process.exit.code"].int_value == 3
    assert attrs["process.pid"].int_value > 0
    command = [v.string_value for v in attrs["process.command_args"].array_value.values]
    assert command[-3:] == [str(script), "arg1", "--flag"]
    trace_id, span_id = span.trace_id.hex(), span.span_id.hex()
    assert f"ROOT {trace_id}-{span_id}" in result.stdout
    assert trace_line == f"hotspan: trace {trace_id}, its profile: {receiver.url}/traces/{trace_id}"

    names = app_names(receiver)
    assert names, "no profile uploaded"
    for name in names:
        assert name.name == "gen"
        assert name.tags == {"env": "dev", "trace_id": trace_id, "root_span_id": span_id}
    # The main thread ran inside the root span, so its samples carry its ids.
    labels = sample_labels(receiver)
    assert {"span_id": span_id, "trace_id": trace_id} in [
        {k: v for k, v in lb.items() if k in ("span_id", "trace_id")} for lb in labels
    ]


def test_user_trace_id_tag_is_kept(receiver: Receiver, script: Path) -> None:
    result = hotspan_run(
        ["--tag", "trace_id=mine", "--server-address", receiver.url, str(script)],
        env={"BURN_SECONDS": "0.2", "PYROSCOPE_TAGS": "env=staging,team=batch"},
    )
    assert result.returncode == 0, result.stderr
    (service, span), *_ = receiver.spans()
    # Application name defaults to the script's name.
    assert (service, span.name) == ("generator", "generator.run")
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["process.exit.code"].int_value == 0
    names = app_names(receiver)
    assert names
    for name in names:
        assert name.name == "generator"
        assert name.tags == {
            "env": "staging",
            "team": "batch",
            "trace_id": "mine",
            "root_span_id": span.span_id.hex(),
        }


def test_module_with_user_sitecustomize(receiver: Receiver, tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    (lib / "jobs").mkdir(parents=True)
    (lib / "jobs" / "__init__.py").write_text("")
    (lib / "jobs" / "nightly.py").write_text(
        "import os, sys, time\n"
        "print('MODULE', __name__, sys.argv[1:], flush=True)\n"
        "end = time.process_time() + 0.2\n"
        "while time.process_time() < end: pass\n"
        "print('USER_SITE', os.environ.get('USER_SITECUSTOMIZE_RAN'), flush=True)\n"
    )
    (lib / "sitecustomize.py").write_text(
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n"
    )
    result = hotspan_run(
        ["--server-address", receiver.url, "--no-trace-correlation", "-m", "jobs.nightly"]
        + ["a", "-m", "b"],
        env={"PYTHONPATH": str(lib)},
    )
    assert result.returncode == 0, result.stderr
    assert "MODULE __main__ ['a', '-m', 'b']" in result.stdout
    assert "USER_SITE yes" in result.stdout
    assert "hotspan:" not in result.stderr, result.stderr
    # No trace correlation: no root span, nothing sent to /v1/traces, no trace tags.
    assert not [r for r in receiver.requests if r.path == "/v1/traces"]
    names = app_names(receiver)
    assert names and {n.name for n in names} == {"jobs.nightly"}
    assert all("trace_id" not in n.tags for n in names)


def test_trace_correlation_off_by_env(receiver: Receiver, script: Path) -> None:
    result = hotspan_run(
        ["--server-address", receiver.url, "--", "python3", str(script)],
        env={"BURN_SECONDS": "0.2", "PYROSCOPE_TRACE_CORRELATION": "false"},
    )
    assert result.returncode == 0, result.stderr
    assert "ROOT \n" in result.stdout
    assert receiver.ingests()
    assert not [r for r in receiver.requests if r.path == "/v1/traces"]


def test_console_script_and_auth_headers(receiver: Receiver, tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "nightly-tool"
    tool.parent.mkdir()
    tool.write_text(f"#!{sys.executable}\nimport sys\nprint('TOOL', sys.argv[1:])\n")
    tool.chmod(0o755)
    result = hotspan_run(
        ["--server-address", receiver.url, "--auth-token", "s3cret", "--tenant-id", "team-a"]
        + ["--", str(tool), "x"],
    )
    assert result.returncode == 0, result.stderr
    assert "TOOL ['x']" in result.stdout
    (service, span), *_ = receiver.spans()
    assert (service, span.name) == ("nightly-tool", "nightly-tool.run")
    assert receiver.requests
    for r in receiver.requests:  # the span and the profiles reach the same tenant
        assert r.headers.get("authorization") == "Bearer s3cret", r.path
        assert r.headers.get("x-scope-orgid") == "team-a", r.path


def test_bootstrap_failure_leaves_program_running(script: Path) -> None:
    # Bad settings can only reach the child through its own environment changes; an
    # unreachable server must not matter either.
    env = {"BURN_SECONDS": "0", "EXIT_CODE": "0", "HOTSPAN_SAMPLE_RATE": "5000"}
    bootstrap = run_module.BOOTSTRAP_DIR
    result = subprocess.run(
        [sys.executable, str(script), "ok"],
        env={**os.environ, **env, "PYTHONPATH": bootstrap, "HOTSPAN_APPLICATION_NAME": "x"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0
    assert "ARGV ['ok']" in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("hotspan: "), result.stderr
    assert "sample_rate" in lines[0]


def test_only_the_program_itself_says_it_is_not_profiled(tmp_path: Path) -> None:
    """Processes the program starts inherit PYTHONPATH: one whose agent cannot start (another
    Python without hotspan, or settings of its own) runs unprofiled without a line in the
    stderr its parent reads; the program itself still says why it is not profiled."""
    program = tmp_path / "parent.py"
    program.write_text(
        textwrap.dedent(
            """
            import os, subprocess, sys
            env = dict(os.environ, HOTSPAN_SAMPLE_RATE="5000")
            done = subprocess.run(
                [sys.executable, "-c", "print('child out')"],
                env=env, capture_output=True, text=True,
            )
            print("CHILD", repr(done.stdout), repr(done.stderr))
            """
        )
    )
    out = tmp_path / "profiles"
    out.mkdir()
    done = hotspan_run(["--server-address", out.as_uri(), "--", sys.executable, str(program)])
    assert done.returncode == 0, done.stderr
    assert "CHILD 'child out\\n' ''" in done.stdout, done.stdout


def _python_without_hotspan() -> Optional[str]:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and os.path.realpath(candidate) != os.path.realpath(
            sys.executable
        ):
            probe = subprocess.run(
                [candidate, "-c", "import hotspan"], capture_output=True, env={}, timeout=30
            )
            if probe.returncode != 0:
                return candidate
    return None


def test_a_program_run_by_a_python_without_hotspan_says_so(tmp_path: Path) -> None:
    python = _python_without_hotspan()
    if python is None:
        pytest.skip("no Python without hotspan on this machine (/usr/bin/python3 has it)")
    out = tmp_path / "profiles"
    out.mkdir()
    done = hotspan_run(["--server-address", out.as_uri(), "--", python, "-c", "print('x')"])
    assert done.returncode == 0 and done.stdout == "x\n", done.stderr
    assert "hotspan: not profiling" in done.stderr and "hotspan" in done.stderr, done.stderr


def test_usage_errors() -> None:
    nothing = hotspan_run([])
    assert nothing.returncode == 2
    assert "nothing to run" in nothing.stderr
    bad_tag = hotspan_run(["--tag", "novalue", "--", "python", "-c", "pass"])
    assert bad_tag.returncode == 2
    assert "not key=value" in bad_tag.stderr
    missing = hotspan_run(["--", "no-such-program-hotspan"])
    assert missing.returncode == 127


def test_signal_is_forwarded(receiver: Receiver, tmp_path: Path) -> None:
    waiter = tmp_path / "waiter.py"
    waiter.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('READY', flush=True)\n"
        "time.sleep(30)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "PYROSCOPE_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hotspan", "run", "--server-address", receiver.url]
        + ["--", "python", str(waiter)],
        env={**env, "HOTSPAN_UPLOAD_INTERVAL": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY"
        proc.send_signal(__import__("signal").SIGTERM)
        assert proc.wait(timeout=20) == 7
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The program's own handler turned SIGTERM into sys.exit(7), so the span knows it.
    (_, span), *_ = receiver.spans()
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["process.exit.code"].int_value == 7


def test_profile_queryable_by_trace_id(server: RunningServer, script: Path) -> None:
    """Against a real server: the root span lands in its trace store, and the batch job's
    profile is found by the trace id, through the label and through the trace's profile."""
    start = int(time.time()) - 5
    result = hotspan_run(
        ["--application-name", "gen", "--server-address", server.url, "--tag", "env=dev"]
        + ["--", "python", str(script)],
    )
    assert result.returncode == 0, result.stderr
    assert "Failed to export" not in result.stderr, result.stderr
    root = next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("ROOT "))
    trace_id, _, span_id = root.partition("-")
    # What hotspan run printed is the id the server has the job's profile under.
    printed = re.fullmatch(
        r"hotspan: trace ([0-9a-f]{32}), its profile: (\S+)", result.stderr.strip()
    )
    assert printed is not None, result.stderr
    assert printed.groups() == (trace_id, f"{server.url}/traces/{trace_id}")
    with server.client() as client:
        graph = flamegraph(
            client, f'{{service_name="gen", trace_id="{trace_id}"}}', start, int(time.time()) + 5
        )
        totals = function_totals(graph)
        assert any(HOT_FUNCTION in name for name in totals), sorted(totals)[:20]

        trace = client.get(f"/api/traces/{trace_id}").json()
        (batch,) = trace["batches"]
        (span,) = batch["scopeSpans"][0]["spans"]
        assert (span["name"], span["traceId"], span["spanId"]) == ("gen.run", trace_id, span_id)
        resource = {a["key"]: a["value"]["stringValue"] for a in batch["resource"]["attributes"]}
        assert resource["service.name"] == "gen"

        found = client.get("/api/search", params={"tags": 'name="gen.run"'}).json()
        assert [t["traceID"] for t in found["traces"]] == [trace_id]

        whole = client.get(f"/api/traces/{trace_id}/profile").json()
        names = whole["flamegraph"]["names"]
        assert any(HOT_FUNCTION in name for name in names), names[:20]
        for profile_type in (CPU_TYPE, WALL_TYPE):
            query = {"profileType": profile_type}
            found = client.get(f"/api/traces/{trace_id}/profile", params=query).json()
            assert not agent_frames(found["flamegraph"]["names"]), profile_type
        page = client.get(printed.group(2).replace(server.url, ""))
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        per_span = client.get(f"/api/traces/{trace_id}/spans").json()
        (row,) = per_span["spans"]
        # The main thread ran inside the root span: its CPU is the span's own.
        assert row["spanID"] == span_id and row["self"] > 0
        assert row["self"] == row["total"] <= per_span["total"]


def test_python_children_share_the_trace(receiver: Receiver, tmp_path: Path) -> None:
    parent = tmp_path / "parent.py"
    parent.write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            child = "import time\\nend = time.process_time() + 0.3\\n" \\
                "while time.process_time() < end: pass\\n"
            sys.exit(subprocess.run([sys.executable, "-c", child]).returncode)
            """
        )
    )
    result = hotspan_run(["--server-address", receiver.url, str(parent)])
    assert result.returncode == 0, result.stderr
    spans = receiver.spans()
    assert [span.name for _, span in spans] == ["parent.run"]  # one root span, the parent's
    span = spans[0][1]
    names = app_names(receiver)
    assert names
    for name in names:  # the child's profiles carry the parent's trace
        assert name.tags == {"trace_id": span.trace_id.hex(), "root_span_id": span.span_id.hex()}


@pytest.mark.parametrize(
    ("argv", "own", "command", "name"),
    [
        (["--", "python", "a.py", "-x"], [], [sys.executable, "a.py", "-x"], "a"),
        (["--tag", "k=v", "python3", "a.py"], ["--tag", "k=v"], [sys.executable, "a.py"], "a"),
        (["--tag=k=v", "job.py", "--tag", "x"], ["--tag=k=v"], [sys.executable, "job.py"], "job"),
        (["-m", "pkg.mod", "-m", "z"], ["-m", "pkg.mod"], [sys.executable, "-m", "pkg.mod"], None),
        (["--", "gunicorn", "app:app"], [], ["gunicorn", "app:app"], "gunicorn"),
        (["--", "/venv/bin/celery", "-A", "x"], [], ["/venv/bin/celery", "-A", "x"], "celery"),
        (["--", "python", "-X", "dev", "-m", "svc"], [], [sys.executable, "-X", "dev"], "svc"),
        (["--", "python", "-c", "pass"], [], [sys.executable, "-c", "pass"], "python"),
        (["--", "python2", "a.py"], [], ["python2", "a.py"], "python2"),
    ],
)
def test_command_line_split(
    argv: List[str], own: List[str], command: List[str], name: Optional[str]
) -> None:
    parser = run_module.build_parser()
    got_own, rest = run_module.split_argv(argv, parser)
    assert got_own == own
    built = run_module.build_command(parser.parse_args(got_own), rest)
    assert built[: len(command)] == command
    expected = name or "pkg.mod"
    assert run_module.default_application_name(built) == expected


def test_forked_child_does_not_end_the_root_span(receiver: Receiver, tmp_path: Path) -> None:
    forker = tmp_path / "forker.py"
    forker.write_text(
        "import os, sys\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    sys.exit(0)  # runs the atexit handlers inherited from the parent\n"
        "os.waitpid(pid, 0)\n"
        "sys.exit(5)\n"
    )
    result = hotspan_run(["--server-address", receiver.url, str(forker)])
    assert result.returncode == 5, result.stderr
    spans = receiver.spans()
    assert [span.name for _, span in spans] == ["forker.run"]
    attrs = {a.key: a.value for a in spans[0][1].attributes}
    assert attrs["process.exit.code"].int_value == 5


def test_uncaught_exception_marks_the_span(receiver: Receiver, tmp_path: Path) -> None:
    failing = tmp_path / "failing.py"
    failing.write_text("raise ValueError('bad input row')\n")
    result = hotspan_run(["--server-address", receiver.url, str(failing)])
    assert result.returncode == 1
    assert "ValueError: bad input row" in result.stderr
    (_, span), *_ = receiver.spans()
    attrs = {a.key: a.value for a in span.attributes}
    assert attrs["process.exit.code"].int_value == 1
    assert span.status.code == span.status.STATUS_CODE_ERROR


def agent_frames(names: List[str]) -> List[str]:
    return [n for n in names if any(m in n for m in AGENT_MODULES)]


def function_names(rec: Receiver, service: Optional[str] = None) -> set:
    """Every function name in the pprof uploads received (of one service)."""
    out: set = set()
    for r in rec.ingests():
        if service is not None and parse_app_name(r.query["name"][0]).name != service:
            continue
        body = gzip.decompress(r.body) if r.body[:2] == b"\x1f\x8b" else r.body
        profile = profile_pb2.Profile()
        profile.ParseFromString(body)
        strings = [bytes(s).decode() for s in profile.string_table]
        out.update(strings[f.name] for f in profile.function)
    return out


def test_agent_work_is_not_in_the_jobs_profile(receiver: Receiver, script: Path) -> None:
    """The root span's export at exit (OpenTelemetry over HTTP) and the SDK's threads are
    hotspan's, not the job's: no profile of the job shows them."""
    result = hotspan_run(["--server-address", receiver.url, str(script)])
    assert result.returncode == 0, result.stderr
    assert receiver.spans()  # the span was exported
    names = function_names(receiver)
    assert any(HOT_FUNCTION in n for n in names), sorted(names)
    assert not agent_frames(sorted(names)), sorted(names)


def test_missing_opentelemetry_is_said_plainly(receiver: Receiver, script: Path, tmp_path: Path):
    # A package named opentelemetry without the SDK's modules, first on the path: what an
    # environment with only some opentelemetry-* distributions looks like.
    shim = tmp_path / "shim"
    (shim / "opentelemetry").mkdir(parents=True)
    (shim / "opentelemetry" / "__init__.py").write_text("")
    result = hotspan_run(
        ["--server-address", receiver.url, str(script)],
        env={"PYTHONPATH": str(shim), "BURN_SECONDS": "0.3"},
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("hotspan:")]
    assert len(lines) == 1, result.stderr  # and no trace line: there is no trace
    assert "the OpenTelemetry SDK is not installed" in lines[0]
    assert "pip install 'hotspan[otel]'" in lines[0]
    assert "pip install -e '.[otel]'" in lines[0]
    assert receiver.ingests()  # profiling went on
    assert not receiver.spans()


NAMING_JOB = textwrap.dedent(
    """
    import os, time
    if os.environ.get("CONFIGURE_ITSELF"):
        import hotspan
        hotspan.configure(application_name=os.environ["APP"])

    def work_for_naming():
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass

    work_for_naming()
    """
)


@pytest.mark.parametrize("interval", ["10", "0.1"])
def test_main_script_has_one_name(receiver: Receiver, tmp_path: Path, interval: str) -> None:
    """The same script's frames are named alike however it starts, and whether first named
    while it runs (short windows) or by the exit flush (a window longer than the job)."""
    (tmp_path / "job.py").write_text(NAMING_JOB)
    env = {"HOTSPAN_UPLOAD_INTERVAL": interval, "HOTSPAN_SERVER_ADDRESS": receiver.url}
    ways = {
        "itself": None,
        "run-python": ["--", "python", "job.py"],
        "run-script": ["job.py"],
        "run-module": ["-m", "job"],
    }
    for app, args in ways.items():
        if args is None:
            base = {k: v for k, v in os.environ.items() if not k.startswith("HOTSPAN_")}
            done = subprocess.run(
                [sys.executable, "job.py"],
                cwd=tmp_path,
                env={**base, **env, "CONFIGURE_ITSELF": "1", "APP": app},
                capture_output=True,
                text=True,
                timeout=60,
            )
        else:
            done = subprocess.run(
                [sys.executable, "-m", "hotspan", "run", "--application-name", app, *args],
                cwd=tmp_path,
                env={**os.environ, **env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
                capture_output=True,
                text=True,
                timeout=60,
            )
        assert done.returncode == 0, done.stderr
    for app in ways:
        named = {n for n in function_names(receiver, app) if n.endswith("work_for_naming")}
        assert named == {"__main__.work_for_naming"}, (app, named)


def test_the_exit_code_recorder_stays_out_of_the_programs_stacks() -> None:
    """``hotspan run`` wraps ``sys.exit`` to learn the exit code; a sample taken inside the
    program's own ``sys.exit()`` call shows the program's frames only."""
    from hotspan.agent import batch
    from hotspan.agent.symbols import HIDDEN_CODE

    saved = sys.exit
    try:
        batch.ExitCodeRecorder().install()
        assert sys.exit.__code__ in HIDDEN_CODE
        assert batch._status_code.__code__ in HIDDEN_CODE
    finally:
        sys.exit = saved


@pytest.mark.parametrize(
    "command, serves",
    [
        (["gunicorn", "app:app"], True),
        (["/venv/bin/uvicorn", "app:app", "--port", "8000"], True),
        ([sys.executable, "-m", "uvicorn", "app:app"], True),
        ([sys.executable, "-mhypercorn", "app:app"], True),
        ([sys.executable, "manage.py", "runserver"], True),
        (["flask", "run"], True),
        ([sys.executable, "-m", "flask", "run"], True),
        ([sys.executable, "-m", "http.server"], True),
        ([sys.executable, "job.py", "runserver"], False),
        ([sys.executable, "manage.py", "migrate"], False),
        ([sys.executable, "-m", "jobs.nightly"], False),
        (["flask", "routes"], False),
        (["celery", "-A", "proj", "worker"], True),
        # The interpreter's own options, read as the run reads them for the service name.
        ([sys.executable, "-W", "ignore", "manage.py", "runserver"], True),
        ([sys.executable, "-X", "dev", "-m", "uvicorn", "app:app"], True),
        ([sys.executable, "-c", "import app", "runserver"], False),
    ],
)
def test_servers_are_told_from_jobs(command: List[str], serves: bool) -> None:
    assert run_module.serves_requests(command) is serves


# A Starlette app (or a WSGI one, for gunicorn) whose requests are spans of the OpenTelemetry
# SDK, sent to the receiver.
SERVER_APP = """
import os
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
provider.add_span_processor(
    SimpleSpanProcessor(OTLPSpanExporter(endpoint=os.environ["RECEIVER"] + "/v1/traces"))
)
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("shop")


def hello(request):
    with tracer.start_as_current_span("GET /hello"):
        return PlainTextResponse("hello")


app = Starlette(routes=[Route("/hello", hello)])


def wsgi(environ, start_response):
    with tracer.start_as_current_span("GET /hello"):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"hello"]
"""


def _serve_three_requests(
    receiver: Receiver,
    tmp_path: Path,
    server: List[str],
    options: List[str],
    app: str = SERVER_APP,
) -> subprocess.CompletedProcess:
    import signal as signals

    import httpx

    (tmp_path / "shopapp.py").write_text(app)
    port = free_port()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "PYROSCOPE_", "OTEL_"))
    }
    env.update({"RECEIVER": receiver.url, "HOTSPAN_UPLOAD_INTERVAL": "1"})
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p
    )
    command = [sys.executable, "-m", "hotspan", "run", "--server-address", receiver.url, *options]
    proc = subprocess.Popen(
        [*command, "--", *[a.replace("PORT", str(port)) for a in server]],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        wait_serving(f"http://127.0.0.1:{port}/hello", proc)
        for _ in range(2):
            assert (
                httpx.get(f"http://127.0.0.1:{port}/hello", timeout=5, verify=TLS).status_code
                == 200
            )
        # A profile upload or two (every second) before it is stopped.
        while not receiver.ingests() and time.monotonic() < deadline + 10:
            time.sleep(0.2)
    finally:
        proc.send_signal(signals.SIGTERM)  # hotspan run passes it on
        out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize(
    "server",
    [
        pytest.param(["uvicorn", "shopapp:app", "--port", "PORT"], id="uvicorn"),
        pytest.param(
            ["gunicorn", "-w", "1", "-b", "127.0.0.1:PORT", "shopapp:wsgi"], id="gunicorn"
        ),
    ],
)
def test_a_server_under_hotspan_run_has_a_trace_per_request(
    receiver: Receiver, tmp_path: Path, server: List[str]
) -> None:
    pytest.importorskip(server[0], reason=f"{server[0]} comes with the test extra")
    result = _serve_three_requests(receiver, tmp_path, server, [])
    assert "no root span for this run; each request is a trace of its own" in result.stderr
    assert "its profile:" not in result.stderr, result.stderr
    spans = [span for service, span in receiver.spans()]
    # Three requests, three traces, no span around them.
    assert [s.name for s in spans] == ["GET /hello"] * 3, [s.name for s in spans]
    assert len({s.trace_id for s in spans}) == 3
    assert not any(s.parent_span_id for s in spans)
    # Profiles still go up, without a run's trace tags.
    names = app_names(receiver)
    assert names and all("trace_id" not in n.tags for n in names), names


def test_root_span_asked_for_wraps_a_server(receiver: Receiver, tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="uvicorn comes with the server's dependencies")
    result = _serve_three_requests(
        receiver, tmp_path, ["uvicorn", "shopapp:app", "--port", "PORT"], ["--root-span"]
    )
    spans = receiver.spans()
    (root,) = [span for _, span in spans if span.name.endswith(".run")]
    requests = [span for _, span in spans if span.name == "GET /hello"]
    assert len(requests) == 3
    assert all(s.trace_id == root.trace_id and s.parent_span_id == root.span_id for s in requests)
    assert f"hotspan: trace {root.trace_id.hex()}" in result.stderr


# Scripts that serve by themselves: the command says nothing; their first listen() does.  Each
# request burns CPU before its span starts, with whatever labels the context had: the run's
# root span's, if they were not forgotten when the script began to listen.
SERVING_SCRIPTS = {
    "uvicorn.run": """
import sys, time
import uvicorn
from shopapp import app, tracer

with tracer.start_as_current_span("warm cache"):
    time.sleep(0.05)
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
""",
    "http.server": """
import sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
from shopapp import burn, tracer


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        burn()
        # The span ends (and is exported) before the answer: the test stops the server as
        # soon as it has its answers.
        with tracer.start_as_current_span("GET /hello"):
            body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


with tracer.start_as_current_span("warm cache"):
    time.sleep(0.05)
HTTPServer(("127.0.0.1", int(sys.argv[1])), Hello).serve_forever()
""",
}
BURNING_APP = SERVER_APP.replace(
    'def hello(request):\n    with tracer.start_as_current_span("GET /hello"):',
    "def burn():\n    end = time.process_time() + 0.15\n    while time.process_time() < end:\n"
    "        pass\n\n\ndef hello(request):\n    burn()\n"
    '    with tracer.start_as_current_span("GET /hello"):',
).replace("import os\n", "import os\nimport time\n")


@pytest.mark.parametrize("kind", sorted(SERVING_SCRIPTS))
def test_a_script_that_listens_gives_each_request_its_own_trace(
    receiver: Receiver, tmp_path: Path, kind: str
) -> None:
    if kind == "uvicorn.run":
        pytest.importorskip("uvicorn", reason="uvicorn comes with the server's dependencies")
    assert "burn()" in BURNING_APP
    (tmp_path / "serve.py").write_text(SERVING_SCRIPTS[kind])
    result = _serve_three_requests(
        receiver,
        tmp_path,
        [sys.executable, "serve.py", "PORT"],
        ["--application-name", "shoprun"],
        app=BURNING_APP,
    )
    # Told as it happens (a server runs until it is stopped), and no trace line at the end.
    assert re.search(
        r"the program listens on 127\.0\.0\.1:\d+, so it serves requests: each request is a "
        r"trace of its own from now on; its start-up is trace [0-9a-f]{32}",
        result.stderr,
    ), result.stderr
    assert "its profile:" not in result.stderr, result.stderr
    spans = [span for _, span in receiver.spans()]
    (start,) = [s for s in spans if s.name == "shoprun.start"]
    (warm,) = [s for s in spans if s.name == "warm cache"]
    assert warm.trace_id == start.trace_id and warm.parent_span_id == start.span_id
    assert start.end_time_unix_nano > warm.end_time_unix_nano
    requests = [s for s in spans if s.name == "GET /hello"]
    assert len(requests) == 3
    assert len({s.trace_id for s in requests}) == 3 and start.trace_id not in {
        s.trace_id for s in requests
    }
    assert not any(s.parent_span_id for s in requests)
    # The run's trace tags leave the profiles, and no sample names the start-up span once
    # the requests run (3 x 150 ms of CPU outside their spans).
    names = app_names(receiver)
    assert names and "trace_id" not in names[-1].tags, names
    burning = [labels for labels, stack in labelled_stacks(receiver) if "shopapp.burn" in stack]
    assert burning, "no sample of the requests' work"
    assert not any(lb.get("span_id") == start.span_id.hex() for lb in burning), burning
    assert not any(lb.get("trace_id") == start.trace_id.hex() for lb in burning), burning
