"""What the program sees of OpenTelemetry once the agent links spans to samples.

The agent replaces OpenTelemetry's runtime context with its span linker; the C linker keeps
the current OpenTelemetry Context inside the agent's own labels ContextVar instead of in
OpenTelemetry's.  Whatever it does, the program's tracing must behave exactly as without it:
the current span, parents, ``tag_wrapper`` blocks, asyncio tasks, threads, a context attached
before ``configure`` and detached after it, and a detach in the wrong context (which
OpenTelemetry only logs).  Each case runs in a real program with the real SDK, with the C
linker and with its pure-Python twin.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hotspan._speedups import load_sampler
from tests.agent.test_agent import configure_line, run_program

PROGRAM = (
    """
import asyncio, logging
from opentelemetry import context
from opentelemetry.trace import INVALID_SPAN, get_current_span, set_span_in_context

failures = []
def check(what, ok):
    if not ok:
        failures.append(what)

# A span made current before the agent starts, and ended after.
before = tracer.start_span("before")
before_token = context.attach(set_span_in_context(before))
"""
    + "{configure}"
    + """
check("before is current", get_current_span() is before)
with tracer.start_as_current_span("a") as a:
    check("a current", get_current_span() is a)
    check("a child of before", a.parent.span_id == before.get_span_context().span_id)
    with hotspan.tag_wrapper({"route": "/x"}):
        check("a current in tag_wrapper", get_current_span() is a)
        with tracer.start_as_current_span("b") as b:
            check("b current", get_current_span() is b)
            check("b child of a", b.parent.span_id == a.get_span_context().span_id)
        check("a current after b", get_current_span() is a)
    check("a current after tag_wrapper", get_current_span() is a)
check("before current again", get_current_span() is before)
context.detach(before_token)
before.end()
check("no span at the end", get_current_span() is INVALID_SPAN)

# Tasks: each sees its own span, and a child task its parent's.
async def task(name):
    with tracer.start_as_current_span(name) as span:
        await asyncio.sleep(0)
        check(name + " current after await", get_current_span() is span)
        async def child():
            return get_current_span()
        check(name + " seen by its child task", await asyncio.create_task(child()) is span)
        await asyncio.sleep(0)
        check(name + " still current", get_current_span() is span)

async def main():
    await asyncio.gather(*(task(f"t{i}") for i in range(20)))
    check("no span after the tasks", get_current_span() is INVALID_SPAN)

    # A token detached in another task's context: OpenTelemetry logs it, never raises.
    holder = {}
    async def attach_only():
        holder["token"] = context.attach(set_span_in_context(tracer.start_span("stray")))
    await asyncio.create_task(attach_only())
    context.detach(holder["token"])
    check("no span after a stray detach", get_current_span() is INVALID_SPAN)

logging.disable(logging.CRITICAL)  # OpenTelemetry's "Failed to detach context"
asyncio.run(main())

# A thread starts in an empty context.
seen = []
with tracer.start_as_current_span("main"):
    t = threading.Thread(target=lambda: seen.append(get_current_span()))
    t.start()
    t.join()
check("a new thread has no span", seen == [INVALID_SPAN])
hotspan.shutdown()
report(failures=failures, linker=type(context._RUNTIME_CONTEXT).__name__)
"""
)


@pytest.mark.parametrize("native", [True, False], ids=["c-linker", "python-linker"])
def test_tracing_behaves_as_without_the_agent(module_server, tmp_path: Path, native: bool) -> None:
    if native and load_sampler() is None:
        pytest.skip("the C sampler (and its span linker) is not built")
    configure = configure_line(module_server.url, "linking", native=native)
    result = run_program(tmp_path, PROGRAM.replace("{configure}", configure))
    assert result["failures"] == []
    assert result["linker"] == ("SpanLinker" if native else "SpanLinkingRuntimeContext")
