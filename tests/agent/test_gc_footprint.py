"""What ``hotspan.configure()`` with its defaults leaves for the program's cyclic GC to walk.

Every full collection of CPython's cyclic GC walks every GC-tracked object in the process:
the agent's functions, classes, their dicts and descriptors, its modules' specs and loaders.
On a program with a small live heap that makes many containers
(``bench/agent_workloads/gc_containers.py``: ~11,800 tracked objects of its own) the agent's
~1,240 objects cost about 2.4 points of its CPU, before the agent took a single sample.  So
the pure-Python twins of the C fast paths are imported only where they run, what only an
option that is off by default (or the first upload) needs waits until then, and the code the
agent did import is untracked (agent/gc_footprint.py): what stays is the agent's state.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from hotspan._speedups import load_module, load_sampler

# The pure-Python twins of the C extension, and what only an option that is off by default
# (or the first upload) needs: none of it is imported by configure() where the C extension is.
NOT_AT_CONFIGURE = (
    "hotspan.agent.sampler_py",
    "hotspan.agent.context_py",
    "hotspan.agent.pprof_writer_py",
    "hotspan.agent.collectors.locks_py",
    "hotspan.agent.collectors.alloc_tracemalloc",
    "hotspan.agent.collectors.alloc",  # allocations: off by default
    "hotspan.agent.spans",  # span conditions: off by default
    "hotspan.agent.pull",
    "hotspan.agent.limits",  # the encoder: with the first upload
    "hotspan.agent.pprof_writer",
    "hotspan.agent.pprof_encoding",
)

# GC-tracked objects configure() may leave, its modules included, the standard library's
# modules it imports not counted (how many of those a program already has depends on its
# interpreter's start: a venv's `site` imports fewer than a system Python's).  ~270 right after
# configure() (Python 3.11; ~155 once its loop has woken and untracked what start() imported):
# the agent's state; its code, ~800 more, is untracked.
MAX_NEW_OBJECTS = 350

PROGRAM = """
import gc, json, sys
if sys.argv[1] == "otel":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
for name in filter(None, sys.argv[2].split(",")):
    __import__(name)
# Compiling source (a module whose .pyc is stale or cannot be written) creates the 119 classes
# of the ast module once per interpreter: created now, they are not counted as the agent's.
compile("pass", "<warm-up>", "exec")
gc.collect()
objects, modules = len(gc.get_objects()), set(sys.modules)
import hotspan

# Nothing listens on port 9, and no upload is due within the test.
hotspan.configure(application_name="footprint", server_address="http://127.0.0.1:9",
                  upload_interval=60)
gc.collect()
print(json.dumps({"objects": len(gc.get_objects()) - objects,
                  "modules": sorted(set(sys.modules) - modules),
                  "linker": type(sys.modules["opentelemetry.context"]._RUNTIME_CONTEXT).__name__
                  if "opentelemetry.context" in sys.modules else None}))
hotspan.shutdown(flush=False)
"""

NATIVE = all(
    module is not None
    for module in (load_sampler(), load_module("_pprof_writer"), load_module("_locks"))
)


def _configure(tmp_path: Path, variant: str, preload: str = "") -> dict:
    """What configure() left; ``preload``: modules imported before the count."""
    env = {"PYTHONPATH": ":".join(p for p in sys.path if p), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, variant, preload],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not NATIVE, reason="the C extension is not built: the twins are what runs")
@pytest.mark.parametrize("variant", ["plain", "otel"])
def test_defaults_leave_no_twin_and_few_objects(tmp_path: Path, variant: str) -> None:
    if variant == "otel":
        pytest.importorskip("opentelemetry.sdk.trace")
    found = _configure(tmp_path, variant)
    assert "hotspan.agent.core" in found["modules"], found  # the agent did start
    assert not set(NOT_AT_CONFIGURE) & set(found["modules"]), found["modules"]
    if variant == "otel":
        # Spans are linked, by the C linker.
        assert found["linker"] == "SpanLinker", found
    # Again, with the other modules the agent imported already there.
    others = [m for m in found["modules"] if not m.startswith("hotspan")]
    own = _configure(tmp_path, variant, ",".join(others))
    assert all(m.startswith("hotspan") for m in own["modules"]), own["modules"]
    assert own["objects"] < MAX_NEW_OBJECTS, (own, others)


UNTRACKED_PROGRAM = textwrap.dedent(
    """
    import gc, json, sys, time, weakref
    brought = "contextvars" not in sys.modules
    import hotspan
    import csv  # the program's, between import hotspan and configure()
    hotspan.configure(application_name="gc-footprint", server_address="http://127.0.0.1:9",
                      upload_interval=3600)
    import hotspan.agent as agent
    import hotspan.agent.core as core
    gc.collect()
    untracked = {
        "function": not gc.is_tracked(core.Agent.start),
        "module dict": not gc.is_tracked(vars(core)),
        "class": not gc.is_tracked(core.Agent),
        "module": not gc.is_tracked(core),
        "package path": not gc.is_tracked(agent.__path__),
        "spec": not gc.is_tracked(vars(core.__spec__)),
        "finder": not gc.is_tracked(sys.path_importer_cache[agent.__path__[0]]),
        "subclass reference": not any(gc.is_tracked(r) for r in weakref.getweakrefs(core.Agent)),
    }
    import contextvars
    # The standard library's modules the agent brought are its code; those the program had
    # are the program's.
    stdlib = {"brought": brought, "untracked": not gc.is_tracked(vars(contextvars))}
    program_modules = {"before": gc.is_tracked(vars(json)), "meanwhile": gc.is_tracked(vars(csv))}
    # Later walks (the agent's loop, as it imports more of itself) take its new modules only,
    # not what the program imported since.
    import fractions
    import hotspan.agent.gc_footprint as footprint
    import hotspan.agent.pprof_encoding as later
    footprint.untrack_new_code()
    program_modules["after"] = gc.is_tracked(vars(fractions))
    untracked["module imported later"] = not gc.is_tracked(vars(later))
    # The program's own objects stay tracked, and its cycles are collected.
    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    freed = gc.collect()
    # A dict among the untracked that is given a container tracks itself again.
    core.__dict__["_probe"] = [1]
    retracked = gc.is_tracked(vars(core))
    # Functions of the agent replaced and dropped: kept, not freed untracked (a crash).
    core.Agent.start = None
    for name in [n for n, v in vars(core).items() if callable(v) and n.startswith("_")][:5]:
        setattr(core, name, None)
    gc.collect()
    hotspan.shutdown(flush=False)
    print(json.dumps({"untracked": untracked, "freed": freed, "retracked": retracked,
                      "stdlib": stdlib, "program_modules": program_modules}))
    """
)


@pytest.mark.skipif(not NATIVE, reason="untracking needs the C extension")
def test_the_agent_code_is_untracked_and_never_freed() -> None:
    """Its functions, classes, module dicts, specs, finders and the standard library's
    modules it brought untracked, and its modules imported later; the program's own objects
    and modules tracked, those it imports after hotspan too,
    and its cycles collected; a dict given a container tracked again; and functions of the
    agent replaced and dropped are kept, not freed (CPython would crash freeing a function
    the GC does not track), through a collection and the interpreter's exit."""
    result = subprocess.run(
        [sys.executable, "-c", UNTRACKED_PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(answer["untracked"].values()), answer
    assert answer["freed"] >= 2, answer  # the program's cycle
    assert answer["retracked"], answer
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        # json, imported by the program first; csv, before configure(); fractions, after.  (A
        # free-threaded CPython itself stops tracking module dicts once a second thread has
        # started.)
        assert all(answer["program_modules"].values()), answer
    if answer["stdlib"]["brought"] and sys.version_info >= (3, 10):
        assert answer["stdlib"]["untracked"], answer
