"""What the agent leaves in a program (modules, objects its GC walks), and CPU that a sampler
driven by per-thread CPU timers loses unless it charges it (short threads, the exit)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

from hotspan._speedups import load_module
from tests.agent.test_agent import configure_line, native_only, run_program, service_profile

# Imported by nothing the agent needs before its first upload: each stays in the program for
# good, and every full collection of the cyclic GC walks what it brought.
NOT_AT_CONFIGURE = (
    "urllib.parse",
    "random",
    "importlib.util",
    "socket",
    "http.client",
    "ssl",
    # Loaded only when needed: logging when the agent first logs, tracemalloc only for the
    # fallback that asks for it; typing, dataclasses, gzip, base64, dis never.
    "logging",
    "typing",
    "dataclasses",
    "gzip",
    "base64",
    "dis",
    "inspect",
    "tracemalloc",
    # Pull mode's endpoints, for the programs that serve them (debug_pprof, the control port).
    "hotspan.agent.pull",
)
# The Python twins, imported only where the C extension is missing.
NATIVE_NOT_AT_CONFIGURE = ("hotspan.agent.collectors.locks_py",)

FOOTPRINT = """
import gc, json, sys, threading
g0, m0 = len(gc.get_objects()), set(sys.modules)
import hotspan
# Every collector on, as by default.
hotspan.configure(application_name="footprint", server_address=sys.argv[1],
                  upload_interval=3600)
gc.collect()
print(json.dumps({"objects": len(gc.get_objects()) - g0,
                  "modules": sorted(set(sys.modules) - m0)}))
hotspan.shutdown(flush=False)
"""


def test_configure_leaves_little_for_the_gc_to_walk(module_server) -> None:
    # -S: no site packages, the small program where the agent's share is largest.
    proc = subprocess.run(
        [sys.executable, "-S", "-c", FOOTPRINT, module_server.url],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": ":".join(p for p in sys.path if p)},
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not set(NOT_AT_CONFIGURE) & set(found["modules"]), found["modules"]
    if load_module("_locks") is not None:
        assert not set(NATIVE_NOT_AT_CONFIGURE) & set(found["modules"]), found["modules"]
    # ~2,200, of which the agent's modules ~1,200 (bench/results/agent_footprint.md has how
    # it came down from 7,200: dataclasses, typing, logging, urllib.parse, socket, ...).
    assert found["objects"] < 3_000, found


@native_only
def test_short_threads_cpu_adds_up(module_server, tmp_path: Path) -> None:
    """Forty threads of 3 ms of CPU each, a third of the sampling interval: sampled one in
    three at random, each for a whole interval, their total was off by +-25%.  Each sample
    now stands for the CPU since the one before, and what a thread used after its last one
    is charged as it ends."""
    service = f"short_{uuid.uuid4().hex[:6]}"
    result = run_program(
        tmp_path,
        configure_line(module_server.url, service, alloc_sample_bytes=0, locks=False, threads=False)
        + """
used = []
def worker():
    start = time.thread_time()
    burn(0.003)
    used.append(time.thread_time() - start)
for _ in range(40):
    t = threading.Thread(target=worker)
    t.start()
    t.join()
hotspan.shutdown()
report(cpu_used=sum(used))
""",
        otel=False,
    )
    with module_server.client() as client:
        cpu = service_profile(client, f'{{service_name="{service}"}}')
    profiled = cpu.get("__main__.worker", 0) / 1e9
    assert abs(profiled / result["cpu_used"] - 1) < 0.1, (profiled, result, cpu)
