"""``exporter="otlp"``: the agent's profiles as OTLP profiles, into hotspan's OTLP receiver.

The same samples through the pprof writer into ``/ingest`` and through the OTLP writer into
``/v1development/profiles`` give the same totals per function and span; a real program with
``HOTSPAN_EXPORTER=otlp`` and the standard ``OTEL_EXPORTER_OTLP_*`` variables lands its
profiles, span-linked, under its ``service.name``; the messages parse with the
``opentelemetry-proto`` package's own definitions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hotspan.agent.config import ConfigError, otlp_profiles_target
from hotspan.agent.pprof_writer import ProfileWriter
from tests.helpers import flamegraph, function_totals, ingest_pprof

profiles_service = pytest.importorskip(
    "opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
    reason="the OTLP profiles schema comes with opentelemetry-proto 1.45+",
)
if not hasattr(profiles_service.ExportProfilesServiceRequest(), "dictionary"):
    pytest.skip("opentelemetry-proto predates the profiles dictionary", allow_module_level=True)

from hotspan.agent.otlp_writer import OtlpProfileWriter  # noqa: E402

SEC = 10**9
WALL = "wall:wall:nanoseconds:wall:nanoseconds"
SPAN = ("span_id", "00f067aa0ba902b7")
TRACE = ("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736")
# (stack leaf first, CPU value, labels)
ROWS = [
    ((("app.hash", "app.py", 12, 10), ("app.handle", "app.py", 30, 28)), 70_000_000, (SPAN, TRACE)),
    (
        (("app.render", "app.py", 40, 38), ("app.handle", "app.py", 31, 28)),
        20_000_000,
        (SPAN, TRACE),
    ),
    ((("app.idle", "app.py", 50, 50),), 10_000_000, (("thread_name", "worker-1"),)),
]


def _encode(writer, start_ns: int) -> bytes:  # type: ignore[no-untyped-def]
    for stack, value, labels in ROWS:
        writer.add(stack, value, labels)
    return writer.encode(start_ns, 10 * SEC)


def test_the_same_samples_give_the_same_totals_either_way(module_server) -> None:  # type: ignore[no-untyped-def]
    start = (int(time.time()) - 30) * SEC
    cpu = (("cpu", "nanoseconds"), ("cpu", "nanoseconds"), 10_000_000)
    pprof = _encode(ProfileWriter(*cpu), start)
    otlp = _encode(OtlpProfileWriter(*cpu, {"service.name": "otlp_side", "env": "prod"}), start)
    over_grpc = _encode(
        OtlpProfileWriter(*cpu, {"service.name": "grpc_side", "env": "prod"}), start
    )
    # The message is what opentelemetry-proto defines: one profile, its links and attributes.
    request = profiles_service.ExportProfilesServiceRequest.FromString(otlp)
    (profile,) = request.resource_profiles[0].scope_profiles[0].profiles
    strings = request.dictionary.string_table
    assert strings[profile.sample_type.type_strindex] == "cpu"
    assert len(request.dictionary.link_table) == 2  # the empty entry and the one span
    assert sum(s.values[0] for s in profile.samples) == 100_000_000
    with module_server.client() as client:
        assert ingest_pprof(client, "pprof_side{env=prod}", pprof, start // SEC).status_code == 200
        r = client.post(
            "/v1development/profiles",
            content=otlp,
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert r.status_code == 200, r.text
        # The agent's gRPC transport, one unary Export call (agent/transport.py).
        from hotspan.agent.transport import GrpcConnection

        host, port = module_server.otlp_grpc_address.rsplit(":", 1)
        conn = GrpcConnection(host, int(port), 10.0, secure=False)
        try:
            assert conn.post("", over_grpc, {"Content-Type": "x"}, 1000)[0] == 200
            bad = conn.post("", b"\xff\xff not a request", {}, 1000)
            assert bad[0] == 400, bad  # INVALID_ARGUMENT: dropped, not retried
        finally:
            conn.close()
        now = int(time.time())
        totals = {}
        for side in ("pprof_side", "otlp_side", "grpc_side"):
            deadline = time.monotonic() + 10
            while True:
                got = function_totals(
                    flamegraph(
                        client, f'{{service_name="{side}", env="prod"}}', now - 600, now + 60
                    )
                )
                if got or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            totals[side] = got
        assert totals["otlp_side"] == totals["pprof_side"] == totals["grpc_side"], totals
        assert totals["otlp_side"]["app.hash"] == 70_000_000
        # The span's samples are found by its trace, through either path.
        for side in ("pprof_side", "otlp_side", "grpc_side"):
            traced = function_totals(
                flamegraph(
                    client,
                    f'{{service_name="{side}"}}',
                    now - 600,
                    now + 60,
                    traceIdSelector=[TRACE[1]],
                )
            )
            assert traced.get("app.hash") == 70_000_000 and "app.idle" not in traced, (side, traced)


def test_the_otel_exporter_variables_are_honoured() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-team=core",
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS": "x-team=profiles",
    }
    assert otlp_profiles_target(env) == (
        "http://collector:4318/v1development/profiles",
        {"authorization": "Bearer abc", "x-team": "profiles"},
        "http/protobuf",
    )
    env["OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT"] = "https://gw.example/otlp/profiles"
    assert otlp_profiles_target(env)[0] == "https://gw.example/otlp/profiles"
    # gRPC: the endpoint without a path, 4317 by default; the profiles' own variable wins.
    assert otlp_profiles_target({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})[::2] == (
        "http://localhost:4317",
        "grpc",
    )
    both = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_PROFILES_PROTOCOL": "http/protobuf",
    }
    assert otlp_profiles_target(both)[2] == "http/protobuf"
    with pytest.raises(ConfigError, match="http/protobuf or grpc"):
        otlp_profiles_target({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


PROGRAM = """
import hotspan, time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

trace.set_tracer_provider(TracerProvider())
tracer = trace.get_tracer("job")
hotspan.configure(upload_interval=1)  # the service name from HOTSPAN_APPLICATION_NAME

def checksum_rows():
    end = time.process_time() + 0.6
    while time.process_time() < end:
        sum(range(500))

with tracer.start_as_current_span("nightly") as span:
    checksum_rows()
print(format(span.get_span_context().trace_id, "032x"))
"""


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_program_sends_otlp_profiles_where_the_otel_variables_say(
    module_server,  # type: ignore[no-untyped-def]
    tmp_path: Path,
    protocol: str,
) -> None:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(PROGRAM))
    service = f"otlp_job_{os.getpid()}_{protocol.split('/')[0]}"
    endpoint = (
        f"http://{module_server.otlp_grpc_address}" if protocol == "grpc" else module_server.url
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "OTEL_"))}
    env.update(
        {
            "HOTSPAN_EXPORTER": "otlp",
            "HOTSPAN_APPLICATION_NAME": service,
            "HOTSPAN_TAGS": "env=test",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        }
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "hotspan" not in done.stderr, done.stderr  # no warning: every upload went through
    trace_id = done.stdout.split()[-1]
    now = int(time.time())
    with module_server.client() as client:
        deadline = time.monotonic() + 10
        while True:
            totals = function_totals(
                flamegraph(client, f'{{service_name="{service}", env="test"}}', now - 300, now + 60)
            )
            if totals.get("__main__.checksum_rows") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert totals.get("__main__.checksum_rows", 0) >= 0.3 * SEC, totals
        traced = function_totals(
            flamegraph(
                client,
                f'{{service_name="{service}"}}',
                now - 300,
                now + 60,
                traceIdSelector=[trace_id],
            )
        )
        assert traced.get("__main__.checksum_rows", 0) >= 0.3 * SEC, traced
        wall = function_totals(
            flamegraph(client, f'{{service_name="{service}"}}', now - 300, now + 60, WALL)
        )
        assert wall.get("__main__.checksum_rows", 0) > 0, wall
