"""Test-side builders: pprof payloads made directly with the protobuf classes, small clients
for the query API, and real traced programs (OpenTelemetry SDK + hotspan agent) to run."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import httpx

from hotspan.formats.proto import profile_pb2

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
QUERIER = "/querier.v1.QuerierService"


def make_pprof(
    samples: Sequence[Tuple[Sequence[str], int, Dict[str, str]]],
    sample_type: Tuple[str, str] = ("cpu", "nanoseconds"),
    period_type: Tuple[str, str] = ("cpu", "nanoseconds"),
    time_ns: Optional[int] = None,
    compress: bool = True,
) -> bytes:
    """samples: (frame names leaf first, value, string labels)."""
    strings: List[str] = [""]

    def s(text: str) -> int:
        if text not in strings:
            strings.append(text)
        return strings.index(text)

    p = profile_pb2.Profile()
    p.sample_type.add(type=s(sample_type[0]), unit=s(sample_type[1]))
    p.period_type.type, p.period_type.unit = s(period_type[0]), s(period_type[1])
    p.period = 10_000_000
    p.time_nanos = time_ns if time_ns is not None else time.time_ns()
    funcs: Dict[str, int] = {}
    for names, value, labels in samples:
        loc_ids = []
        for name in names:
            if name not in funcs:
                funcs[name] = len(funcs) + 1
                p.function.add(id=funcs[name], name=s(name), filename=s(name.split(".")[0] + ".py"))
                loc = p.location.add(id=funcs[name])
                loc.line.add(function_id=funcs[name], line=funcs[name])
            loc_ids.append(funcs[name])
        sample = p.sample.add(location_id=loc_ids, value=[value])
        for k, v in labels.items():
            sample.label.add(key=s(k), str=s(v))
    p.string_table.extend(x.encode() for x in strings)
    raw = p.SerializeToString()
    return gzip.compress(raw) if compress else raw


def ingest_pprof(
    client: httpx.Client, name: str, body: bytes, start_s: int, headers: Optional[dict] = None
) -> httpx.Response:
    return client.post(
        "/ingest",
        params={"name": name, "from": str(start_s), "until": str(start_s + 10), "format": "pprof"},
        content=body,
        headers=headers or {},
    )


def flamegraph(
    client: httpx.Client,
    selector: str,
    start_s: int,
    end_s: int,
    profile_type: str = CPU,
    headers: Optional[dict] = None,
    **extra,
) -> dict:  # type: ignore[no-untyped-def]
    r = client.post(
        f"{QUERIER}/SelectMergeStacktraces",
        json={
            "profileTypeID": profile_type,
            "labelSelector": selector,
            "start": start_s * 1000,
            "end": end_s * 1000,
            **extra,
        },
        headers=headers or {},
    )
    assert r.status_code == 200, r.text
    return r.json().get("flamegraph", {})


def _per_function(graph: dict, column: int) -> Dict[str, int]:
    """Sum of one node column (1: total, 2: self) per function name, over all its nodes."""
    names = graph.get("names", [])
    out: Dict[str, int] = {}
    for level in graph.get("levels", [])[1:]:
        values = [int(v) for v in level.get("values", [])]
        for i in range(0, len(values), 4):
            name = names[values[i + 3]]
            out[name] = out.get(name, 0) + values[i + column]
    return out


def function_totals(graph: dict) -> Dict[str, int]:
    return _per_function(graph, 1)


def self_totals(graph: dict) -> Dict[str, int]:
    return _per_function(graph, 2)


_TRACED_HEAD = """\
import json, sys, time
import hotspan
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

server = sys.argv[1]
provider = TracerProvider(resource=Resource.create({{"service.name": "{service}"}}))
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=server + "/v1/traces")))
trace.set_tracer_provider(provider)
hotspan.configure(
    application_name="{service}", server_address=server, upload_interval=1, tags={tags}
)
tracer = trace.get_tracer("{service}")


def burn(seconds):
    # Each caller burns CPU in this loop, so the caller sits right under the leaf.
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

"""

_TRACED_TAIL = """
provider.shutdown()
hotspan.shutdown()
"""


def traced_program(service: str, body: str, tags: str = "{}") -> str:
    """A program that sends its spans (OpenTelemetry SDK, OTLP/HTTP) and its profiles (the
    hotspan agent, uploading every second) to the server whose URL is its first argument.
    ``body`` runs with ``tracer``, ``burn(seconds)``, ``json``, ``sys`` and ``time`` in scope;
    both are flushed after it.  ``tags``: a Python expression for the agent's tags."""
    head = _TRACED_HEAD.format(service=service, tags=tags)
    return head + textwrap.dedent(body) + _TRACED_TAIL


def run_programs(source: str, directory: Path, *argvs: Sequence[str]) -> List[str]:
    """Runs ``source`` once per argument list, all at once, and returns their outputs.  The
    environment is the test's without HOTSPAN_*/OTEL_* settings, so only the arguments count."""
    path = directory / "program.py"
    path.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "OTEL_"))}
    procs = [
        subprocess.Popen(
            [sys.executable, str(path), *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for argv in argvs
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out)
    return outputs
