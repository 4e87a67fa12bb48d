"""Test-side builders: pprof payloads made directly with the protobuf classes, small clients
for the query API, and real traced programs (OpenTelemetry SDK + hotspan agent) to run."""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import ssl
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import httpx
import pytest

from hotspan._speedups import load_sampler
from hotspan.formats.proto import profile_pb2

# What the native sampler reads from the interpreter (the GIL's holder and waiters, the garbage
# collector's state): on CPython 3.9-3.14 with a GIL only, as docs/agent.md says.
native_states = pytest.mark.skipif(
    load_sampler() is None
    or sys.version_info >= (3, 15)
    or bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    reason="GIL waits, thread states and the [GC] frame come from the native sampler on "
    "CPython 3.9-3.14 with a GIL (docs/agent.md)",
)

CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"
QUERIER = "/querier.v1.QuerierService"
GO = shutil.which("go")
# The TLS settings of every test client (``verify=TLS``).  httpx builds a context for each
# client it makes, loading the CA bundle (~40 ms of CPU), and the suite makes thousands of
# clients, nearly all to http://127.0.0.1: one context, loaded once, is shared.
TLS = ssl.create_default_context()


def go_env(tmp: Path) -> Dict[str, str]:
    """An environment for ``go build``/``go tool pprof`` that needs no network and leaves the
    user's Go setup alone: a shared build cache (so the stdlib compiles once), GOPATH and HOME
    in ``tmp``, no modules, no proxy."""
    cache = Path(os.environ.get("HOTSPAN_TEST_GOCACHE", "/tmp/hotspan-test-gocache"))
    cache.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "GOCACHE": str(cache),
        "GOPATH": str(tmp / "gopath"),
        "GO111MODULE": "off",
        "GOFLAGS": "",
        "GOTOOLCHAIN": "local",
        "GOPROXY": "off",
        "PPROF_TMPDIR": str(tmp),
        "HOME": str(tmp),
    }


# Real Go profiles, written by runtime/pprof, for the file-format and CLI tests (built and run
# once per session by the ``go_profiles`` fixture).  CPU: about 0.5 s of process CPU time, most
# in burnHot (sha256), less in burnWarm (sort) and burnCold (fmt), through the standard library
# so that the profile has well over 20 functions.  Heap: every allocation recorded
# (MemProfileRate 1), some kept (in use) and some dropped (allocated only), one of them under a
# long method name, as Go's often are.
GO_PROFILES_PROGRAM = r"""
package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"
)

var kept [][]byte
var sink int

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Each burns until the process has used d more CPU time, so that a busy machine does not
// shorten the profile.
//go:noinline
func burnHot(d time.Duration) {
	buf := make([]byte, 64<<10)
	for end := cpuTime() + d; cpuTime() < end; {
		for i := 0; i < 20; i++ {
			sum := sha256.Sum256(buf)
			buf[0] = sum[0]
		}
	}
}

//go:noinline
func burnWarm(d time.Duration) {
	xs := make([]int, 20000)
	for end := cpuTime() + d; cpuTime() < end; {
		for i := range xs {
			xs[i] = (i * 7919) % len(xs)
		}
		sort.Ints(xs)
	}
}

//go:noinline
func burnCold(d time.Duration) {
	for end := cpuTime() + d; cpuTime() < end; {
		var b strings.Builder
		for i := 0; i < 2000; i++ {
			fmt.Fprintf(&b, "%d:%x:%q ", i, i*31, "v")
		}
		sink += b.Len()
	}
}

type requestScopedSessionCacheForTheWholeServiceLifetime struct{ entries [][]byte }

//go:noinline
func (
	c *requestScopedSessionCacheForTheWholeServiceLifetime,
) fillEntriesWithFreshlyAllocatedBuffers() {
	for i := 0; i < 64; i++ {
		c.entries = append(c.entries, make([]byte, 16<<10))
	}
}

//go:noinline
func allocKept() {
	for i := 0; i < 32; i++ {
		kept = append(kept, make([]byte, 32<<10))
	}
}

//go:noinline
func allocDropped() {
	for i := 0; i < 2000; i++ {
		sink += len(fmt.Sprintf("dropped %d", i)) + len(make([]byte, 512))
	}
}

func main() {
	runtime.MemProfileRate = 1
	dir := os.Args[1]
	cpu, err := os.Create(filepath.Join(dir, "cpu.pb.gz"))
	if err != nil {
		panic(err)
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		panic(err)
	}
	burnHot(300 * time.Millisecond)
	burnWarm(150 * time.Millisecond)
	burnCold(100 * time.Millisecond)
	pprof.StopCPUProfile()
	cpu.Close()

	cache := &requestScopedSessionCacheForTheWholeServiceLifetime{}
	cache.fillEntriesWithFreshlyAllocatedBuffers()
	allocKept()
	allocDropped()
	runtime.GC() // the heap profile is as of the last collection
	heap, err := os.Create(filepath.Join(dir, "heap.pb.gz"))
	if err != nil {
		panic(err)
	}
	if err := pprof.WriteHeapProfile(heap); err != nil {
		panic(err)
	}
	heap.Close()
	runtime.KeepAlive(cache)
}
"""


class GoProfiles(NamedTuple):
    cpu: Path  # samples/count and cpu/nanoseconds, as Go writes them
    heap: Path  # alloc_objects, alloc_space, inuse_objects, inuse_space


def build_go_profiles(directory: Path) -> GoProfiles:
    """Builds and runs GO_PROFILES_PROGRAM in ``directory``."""
    assert GO is not None
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "main.go").write_text(GO_PROFILES_PROGRAM)
    env = go_env(directory)
    built = subprocess.run(
        [GO, "build", "-o", str(directory / "profiles"), str(directory / "main.go")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    ran = subprocess.run(
        [str(directory / "profiles"), str(directory)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    return GoProfiles(directory / "cpu.pb.gz", directory / "heap.pb.gz")


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


def label_values(client: httpx.Client, service: str, name: str) -> List[str]:
    """The values of label ``name`` in the service's profiles of the last ten minutes."""
    now = int(time.time())
    r = client.post(
        f"{QUERIER}/LabelValues",
        json={
            "name": name,
            "matchers": [f'{{service_name="{service}"}}'],
            "start": (now - 600) * 1000,
            "end": (now + 60) * 1000,
        },
    )
    assert r.status_code == 200, r.text
    return list(r.json().get("names", []))


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


def function_totals_once(graph: dict) -> Dict[str, int]:
    """Total per function counted once per stack, as ``hotspan query`` and folded files count
    it: a recursive function's inner nodes are not added again.  Nodes are placed by their
    absolute x (the encoding's offset is from the end of the node before it in the level)."""
    names = graph.get("names", [])
    out: Dict[str, int] = {}
    above: List[Tuple[int, int, frozenset]] = [(0, 2**63, frozenset())]  # (x, end, ancestors)
    for level in graph.get("levels", [])[1:]:
        values = [int(v) for v in level.get("values", [])]
        nodes: List[Tuple[int, int, frozenset]] = []
        x, parent = 0, 0
        for i in range(0, len(values), 4):
            x += values[i]
            total, name = values[i + 1], names[values[i + 3]]
            while not (above[parent][0] <= x < above[parent][1]):
                parent += 1
            ancestors = above[parent][2]
            if name not in ancestors:
                out[name] = out.get(name, 0) + total
            nodes.append((x, x + total, ancestors | {name}))
            x += total
        above = nodes
    return out


def self_totals(graph: dict) -> Dict[str, int]:
    return _per_function(graph, 2)


# A test program's own reading of its thread's run delay: the kernel's count of the time the
# thread was runnable without a core (None where the kernel keeps none), the truth a profile's
# wait for a core is checked against.
RUN_DELAY_SOURCE = """
def run_delay():
    import threading
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            ran, waited, scheduled = map(int, f.read().split())
    except (OSError, ValueError):
        return None
    return waited if scheduled else None
"""

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
    application_name="{service}", server_address=server, upload_interval=1, tags={tags}{agent}
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


def traced_program(service: str, body: str, tags: str = "{}", agent: str = "") -> str:
    """A program that sends its spans (OpenTelemetry SDK, OTLP/HTTP) and its profiles (the
    hotspan agent, uploading every second) to the server whose URL is its first argument.
    ``body`` runs with ``tracer``, ``burn(seconds)``, ``json``, ``sys`` and ``time`` in scope;
    both are flushed after it.  ``tags``: a Python expression for the agent's tags; ``agent``:
    more of its settings, as keyword arguments (``"alloc_sample_bytes=512 * 1024"``)."""
    head = _TRACED_HEAD.format(service=service, tags=tags, agent=", " + agent if agent else "")
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_serving(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Until ``url`` answers 200; fails with the process's output if it ends or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2, verify=TLS).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)


def self_signed_certificate(directory: Path, name: str) -> Tuple[Path, Path]:
    """A certificate for DNS name ``name`` that is its own CA, and its key, made by the
    ``openssl`` command (the test is skipped without it)."""
    if shutil.which("openssl") is None:
        pytest.skip("`openssl` makes the certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}"]
        + ["-addext", f"subjectAltName=DNS:{name}"],
        check=True,
        capture_output=True,
    )
    return cert, key
