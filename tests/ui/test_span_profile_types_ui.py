"""A span opens every profile type the agent links to it, not only CPU: a real program (the
OpenTelemetry SDK and the hotspan agent with its allocation and lock collectors) allocates in
one span and waits for a contended lock in another; in a real Chromium, the trace view's type
picker lists the types with their units and shows each span's allocations and lock waits."""

from __future__ import annotations

import json
import re
from typing import Iterator, Tuple

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import run_programs, traced_program
from tests.ui.conftest import screenshot
from tests.ui.test_traces_ui import frame_names, wait_for_frame

ALLOC = "memory:alloc_space:bytes:space:bytes"
DELAY = "mutex:delay:nanoseconds:contentions:count"

PROGRAM = traced_program(
    "ledger",
    """
    import threading

    def build_rows():
        # ~48 MiB in 64 KiB pieces: about 96 samples at the default 512 KiB.
        return [bytearray(64 * 1024) for _ in range(768)]

    def wait_for_ledger(lock):
        with lock:
            pass

    lock = threading.Lock()  # made after configure: a profiled lock

    def holder(started):
        with lock:
            started.set()
            time.sleep(0.3)

    with tracer.start_as_current_span("GET /export") as export:
        rows = build_rows()
        del rows
        with tracer.start_as_current_span("lock ledger") as locked:
            started = threading.Event()
            t = threading.Thread(target=holder, args=(started,))
            t.start()
            started.wait()
            wait_for_ledger(lock)
            t.join()
    ctx = export.get_span_context()
    print("IDS " + json.dumps({
        "trace": format(ctx.trace_id, "032x"),
        "export": format(ctx.span_id, "016x"),
        "locked": format(locked.get_span_context().span_id, "016x"),
    }))
    """,
    # The allocation profile is off by default (it costs every allocation): on here.
    agent="alloc_sample_bytes=512 * 1024",
)


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[RunningServer, dict]]:
    with running_server(tmp_path_factory.mktemp("types-ui") / "data") as srv:
        (out,) = run_programs(PROGRAM, tmp_path_factory.mktemp("prog"), [srv.url])
        line = next(ln for ln in out.splitlines() if ln.startswith("IDS "))
        yield srv, json.loads(line[4:])


def test_a_span_opens_its_allocations_and_lock_waits(page, ledger) -> None:  # type: ignore[no-untyped-def]
    srv, ids = ledger
    page.goto(f"{srv.url}/traces/{ids['trace']}?span={ids['export']}")
    picker = ".hs-span-profile-type"
    page.wait_for_selector(f"{picker} option[value='{ALLOC}']", state="attached")
    options = page.eval_on_selector_all(
        f"{picker} option", "os => Object.fromEntries(os.map(o => [o.value, o.textContent]))"
    )
    # The types come with words and units a person reads.
    assert options[ALLOC] == "Allocated bytes · memory / alloc_space (bytes)"
    assert options[DELAY] == "Lock wait time · mutex / delay (ns)"
    assert "(objects)" in options["memory:alloc_objects:count:space:bytes"]
    assert options["process_cpu:cpu:nanoseconds:cpu:nanoseconds"].startswith("CPU time")

    # The export span's allocations: build_rows, with bytes in the tooltip's unit.
    page.select_option(picker, ALLOC)
    page.wait_for_url(re.compile(r"type=memory%3Aalloc_space"))
    # build_rows burns CPU too: wait for the allocation profile itself, in bytes.
    page.wait_for_function(
        """() => /\\d MiB/.test(document.querySelector('.hs-span-profile').innerText)
              && !document.querySelector('.hs-span-profile').innerText.includes('Loading')"""
    )
    wait_for_frame(page, "__main__.build_rows")
    assert "Allocated bytes" in page.inner_text(".hs-profile-title")
    assert "wait_for_ledger" not in " ".join(frame_names(page))  # a child span's, not its own
    screenshot(page, "span-profile-alloc")

    # The child span that waited for the lock: its lock wait, ~300 ms, on the waiter.
    page.click(".hs-wf-span[data-name='lock ledger'] .hs-wf-span-name")
    page.wait_for_url(re.compile(rf"span={ids['locked']}"))
    page.select_option(picker, DELAY)
    page.wait_for_url(re.compile(r"type=mutex%3Adelay"))
    wait_for_frame(page, "__main__.wait_for_ledger")
    assert "Lock wait time" in page.inner_text(".hs-profile-title")
    assert re.search(r"\d+(\.\d+)? ms", page.inner_text(".hs-span-profile"))
    screenshot(page, "span-profile-lock-delay")

    # The URL reopens the same type and span.
    page.reload()
    wait_for_frame(page, "__main__.wait_for_ledger")
    assert page.input_value(picker) == DELAY
