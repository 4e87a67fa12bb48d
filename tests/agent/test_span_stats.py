"""Runtime stats on spans and span conditions, with the real OpenTelemetry SDK.

With ``span_stats`` on, one real program per sampler (the C one, the pure-Python one with
native=False, and the pure-Python one with HOTSPAN_NO_SPEEDUPS=1, where the GC counter, the
process stats and the labels are Python too) makes spans with an InMemorySpanExporter and a
real agent uploading to a real server, and reports what each span got; the tests below read
that report.  Without it (the default), only spans that saw a collection or an allocation
sample get figures.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest

from hotspan._speedups import load_module, load_sampler
from tests.agent.test_agent import configure_line, run_program

PROGRAM = """
import asyncio, gc
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import use_span

exporter = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
{configure}
from hotspan.agent.spans import PENDING, SpanConditions

conditions = SpanConditions(slow_threshold_s=0.3, errors=True, cpu_threshold_percent=30)
conditions.install()
ids = {}

def sid(span):
    return span.get_span_context().span_id

# On a thread without a running loop: the thread's CPU clock.
burnt = {}
with tracer.start_as_current_span("root") as root:
    ids["root"] = sid(root)
    with tracer.start_as_current_span("burn") as span:
        ids["burn"] = sid(span)
        t0 = time.thread_time_ns()
        burn(0.25)
        burnt["burn"] = time.thread_time_ns() - t0
    with tracer.start_as_current_span("alloc") as span:
        keep = [bytearray(1000) for _ in range(20000)]  # 20 MB of payload, and the objects
        del keep
    with tracer.start_as_current_span("collect") as span:
        gc.collect()

# Conditions: slow (sleeps past 0.3 s), error, normal, and one not ended.
with tracer.start_as_current_span("slow") as span:
    ids["slow"] = sid(span)
    time.sleep(0.35)
try:
    with tracer.start_as_current_span("error") as span:
        ids["error"] = sid(span)
        raise ValueError("boom")
except ValueError:
    pass
with tracer.start_as_current_span("normal") as span:
    ids["normal"] = sid(span)
    time.sleep(0.01)
pending = tracer.start_span("pending")
with use_span(pending, end_on_exit=False):
    ids["pending"] = sid(pending)

# Inside a running loop: tasks interleave, each span gets its own sampled CPU, and the outer
# span (whose context the tasks copied) gets theirs too.
async def task(name, seconds):
    with tracer.start_as_current_span(name) as span:
        ids[name] = sid(span)
        own = 0  # the CPU of this task's own steps (the thread's clock runs for both)
        for _ in range(40):
            t0 = time.thread_time_ns()
            burn(seconds / 40)
            own += time.thread_time_ns() - t0
            await asyncio.sleep(0)
        return own

async def main():
    with tracer.start_as_current_span("outer") as span:
        ids["outer"] = sid(span)
        burnt["task_a"], burnt["task_b"] = await asyncio.gather(
            task("task_a", 0.15), task("task_b", 0.45)
        )

asyncio.run(main())
verdicts = {name: conditions.condition(span_id) for name, span_id in ids.items()}
pending.end()
stats = conditions.stats()
conditions.uninstall()
spans = {s.name: dict(s.attributes) for s in exporter.get_finished_spans()}
hotspan.shutdown()
report(
    spans=spans, burnt=burnt, verdicts=verdicts, stats=stats, pending_is_none=PENDING is None,
    sampler=agent.sampler_name,
)
"""

CPU = "hotspan.cpu_time_ns"
ALLOC = "hotspan.alloc_bytes"
GC_PAUSE = "hotspan.gc.pause_ns"
GC_COUNT = "hotspan.gc.collections"
ROOT_STATS = ("process.memory.usage", "process.thread.count", "hotspan.process.heap_objects")

VARIANTS = {
    "native": ({"native": True}, {}),
    "python": ({"native": False}, {}),
    "no-speedups": ({}, {"HOTSPAN_NO_SPEEDUPS": "1"}),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def run(request: Any, module_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    kwargs, env = VARIANTS[request.param]
    if request.param == "native" and load_sampler() is None:
        pytest.skip("the C sampler is not built")
    # 1,000 Hz: the sampled (task) figures carry ~1 ms per sample.
    configure = configure_line(
        module_server.url,
        "span_stats",
        sample_rate=1000,
        span_stats=True,
        alloc_sample_bytes=512 * 1024,
        **kwargs,
    )
    result = run_program(
        tmp_path_factory.mktemp("span_stats"), PROGRAM.replace("{configure}", configure), env=env
    )
    result["variant"] = request.param
    yield result


def test_thread_span_cpu_is_the_cpu_it_burnt(run: Dict[str, Any]) -> None:
    spans, burnt = run["spans"], run["burnt"]
    assert spans["burn"][CPU] == pytest.approx(burnt["burn"], rel=0.10)
    # Inclusive: the root's CPU clock covers its children.
    assert spans["root"][CPU] >= spans["burn"][CPU]


def test_task_spans_get_their_own_cpu(run: Dict[str, Any]) -> None:
    if run["variant"] != "native":
        pytest.skip("the pure-Python sampler labels per thread, not per task (docs/agent.md)")
    spans, burnt = run["spans"], run["burnt"]
    a, b = spans["task_a"][CPU], spans["task_b"][CPU]
    # ~150 and ~450 samples at 1 ms: a few percent of sampling error, plus the loop's own
    # switching, charged to whichever task is current.
    assert a == pytest.approx(burnt["task_a"], rel=0.25)
    assert b == pytest.approx(burnt["task_b"], rel=0.15)
    assert b > 2 * a
    # The outer span includes the tasks' CPU (their figures are added to it).
    assert spans["outer"][CPU] >= 0.9 * (a + b)


def test_alloc_bytes(run: Dict[str, Any]) -> None:
    spans = run["spans"]
    if run["variant"] != "native" or load_module("_alloc") is None:
        # No labelled allocation sampler runs with the fallback, nor without the allocator
        # hook (free-threaded builds): no figure rather than 0.
        assert ALLOC not in spans["alloc"]
        return
    # ~20 MB of bytearrays (plus their objects) at one sample per 512 KiB on average.
    assert 10e6 <= spans["alloc"][ALLOC] <= 60e6
    assert spans["root"][ALLOC] >= spans["alloc"][ALLOC]  # inclusive
    assert spans["normal"].get(ALLOC, 0) < 2e6  # asleep (burn() allocates: its ints)


def test_gc_during_the_span(run: Dict[str, Any]) -> None:
    spans = run["spans"]
    assert spans["collect"][GC_PAUSE] > 0
    assert spans["collect"][GC_COUNT] >= 1
    assert spans["root"][GC_COUNT] >= spans["collect"][GC_COUNT]
    # Left out when no collection ended during the span (a sleep allocates nothing).
    assert GC_COUNT not in spans["normal"] and GC_PAUSE not in spans["normal"]


def test_process_stats_at_root_spans_only(run: Dict[str, Any]) -> None:
    spans = run["spans"]
    for root in ("root", "outer", "slow"):
        for key in ROOT_STATS:
            assert spans[root][key] > 0, (root, key)
    assert spans["root"]["process.thread.count"] >= 2  # the program's and the agent's
    assert spans["root"]["process.memory.usage"] > 10 * 1024 * 1024
    for child in ("burn", "alloc", "collect", "task_a", "task_b"):
        assert not set(ROOT_STATS) & set(spans[child]), child


def test_span_conditions(run: Dict[str, Any]) -> None:
    verdicts = run["verdicts"]
    assert run["pending_is_none"]
    assert verdicts["pending"] is None  # PENDING: not seen ending
    assert verdicts["normal"] == ""
    assert verdicts["error"] == "error"
    assert verdicts["slow"] == "slow"  # asleep: no high_cpu
    # 0.25 s of CPU: at least 30% of its duration, unless the machine is very busy.
    assert "high_cpu" in verdicts["burn"].split(",")
    assert "error" not in verdicts["burn"]
    assert run["stats"]["providers"] == 1
    assert run["stats"]["error"] == 1


DEFAULT_STATS = """
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
{configure}
gc.disable()  # only the collection the program asks for
with tracer.start_as_current_span("root"):
    with tracer.start_as_current_span("plain"):
        time.sleep(0.02)  # allocates nothing
    with tracer.start_as_current_span("collect"):
        gc.collect()
    with tracer.start_as_current_span("alloc"):
        keep = [bytearray(1000) for _ in range(20000)]
        del keep
gc.enable()
spans = {s.name: dict(s.attributes) for s in exporter.get_finished_spans()}
hotspan.shutdown()
report(spans=spans)
"""


def _ours(attributes: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in attributes.items() if k.startswith(("hotspan.", "process."))}


@pytest.mark.parametrize("native", [True, False], ids=["c-linker", "python-linker"])
@pytest.mark.parametrize("alloc", [True, False], ids=["alloc-on", "alloc-off"])
def test_default_stats_only_on_spans_with_figures(
    module_server: Any, tmp_path: Path, native: bool, alloc: bool
) -> None:
    """By default no span pays set_attributes for its CPU: only a span that saw a garbage
    collection (on its own thread) gets its pause, and one with an allocation sample its
    bytes (when the allocation profile runs); each figure includes its children's."""
    if native and load_sampler() is None:
        pytest.skip("the C sampler is not built")
    configure = configure_line(
        module_server.url,
        "span_stats",
        native=native,
        # Sampled per byte: the spans that allocate only the SDK's few KiB of their own
        # objects must draw no sample, the one of ~21 MB about 80 (a mean of 64 KiB made the
        # first odds a few percent a run, and CI drew one for "collect").
        alloc_sample_bytes=256 * 1024 if alloc else 0,
    )
    program = "import gc\n" + DEFAULT_STATS.replace("{configure}", configure)
    spans = run_program(tmp_path, program)["spans"]
    assert all(CPU not in attributes for attributes in spans.values())
    assert _ours(spans["plain"]) == {}
    collect = _ours(spans["collect"])
    assert collect.get(GC_COUNT) == 1 and collect[GC_PAUSE] > 0
    assert set(collect) == {GC_COUNT, GC_PAUSE}
    assert spans["root"][GC_COUNT] == 1 and spans["root"][GC_PAUSE] == collect[GC_PAUSE]
    if alloc and native and load_module("_alloc") is not None:
        assert 10e6 <= spans["alloc"][ALLOC] <= 60e6
        assert spans["root"][ALLOC] >= spans["alloc"][ALLOC]
    else:
        assert _ours(spans["alloc"]) == {}


# Without span_stats (the default): a span gets the garbage collector's figures only when its
# collections paused it 1 ms or more; shorter pauses add up in its parent.
DEFAULTS_PROGRAM = """
import gc
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
{configure}
gc.collect()
young = []
with tracer.start_as_current_span("root"):
    for i in range(50):
        with tracer.start_as_current_span(f"young{i}"):
            t0 = time.perf_counter_ns()
            gc.collect(0)  # the young generation: a few objects, microseconds
            young.append(time.perf_counter_ns() - t0)
    with tracer.start_as_current_span("full"):
        keep = []
        for _ in range(200_000):
            a, b = [], []
            a.append(b)
            b.append(a)
            keep.append(a)
        t0 = time.perf_counter_ns()
        gc.collect()  # every generation, 400k containers: milliseconds
        full = time.perf_counter_ns() - t0
        del keep
spans = {s.name: dict(s.attributes) for s in exporter.get_finished_spans()}
hotspan.shutdown()
report(spans=spans, young=sorted(young), full=full)
"""


@pytest.mark.parametrize("variant", ["native", "python"])
def test_gc_figures_by_default_only_where_the_pause_matters(
    variant: str, module_server: Any, tmp_path: Path
) -> None:
    kwargs, env = VARIANTS[variant]
    if variant == "native" and load_sampler() is None:
        pytest.skip("the C sampler is not built")
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        pytest.skip("free-threaded CPython's collector has no young generation to collect")
    configure = configure_line(module_server.url, "gc_defaults", **kwargs)
    result = run_program(tmp_path, DEFAULTS_PROGRAM.replace("{configure}", configure), env=env)
    spans = result["spans"]
    assert result["young"][-5] < 1e6 <= result["full"], result  # what the program measured
    young = [name for name in spans if name.startswith("young")]
    assert len(young) == 50
    marked = [name for name in young if GC_COUNT in spans[name] or GC_PAUSE in spans[name]]
    assert len(marked) <= 5, marked  # none but one that happened to pause for a millisecond
    assert spans["full"][GC_COUNT] >= 1
    assert spans["full"][GC_PAUSE] >= 1e6
    # The root adds up every collection under it, the young ones included.
    assert spans["root"][GC_COUNT] >= 50 + spans["full"][GC_COUNT]
    assert spans["root"][GC_PAUSE] >= spans["full"][GC_PAUSE]
    assert CPU not in spans["root"]  # span_stats is off
