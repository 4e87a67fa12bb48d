"""The traces pages in a real Chromium against a real server, with data from a real program:
the OpenTelemetry SDK exporting spans to hotspan and the hotspan agent uploading profiles.

Search lists the longest traces first; a result opens the waterfall (spans nested, duration
beside CPU, computing vs waiting); a span shows its own flame graph and top table, with its
descendants on demand; every view reopens from its URL; errors say what to do."""

from __future__ import annotations

import json
import re
import time
from typing import Dict, Iterator, List, Tuple

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import run_programs, traced_program
from tests.ui.conftest import screenshot

PROGRAM = traced_program(
    "shop",
    """
    def slow_function():
        burn(0.4)

    def render_page():
        burn(0.08)

    def fast_work():
        burn(0.004)

    out = {"slow": [], "fast": []}
    for i in range(3):
        with tracer.start_as_current_span("GET /slow") as span:
            span.set_attribute("http.route", "/slow")
            slow_function()
            with tracer.start_as_current_span("render"):
                with tracer.start_as_current_span("template") as template:
                    render_page()
                    template.set_status(trace.Status(trace.StatusCode.ERROR, "missing partial"))
            with tracer.start_as_current_span("wait") as wait:
                wait.add_event("cache miss", {"cache.key": "cart:42"})
                time.sleep(0.15 + 0.1 * i)  # the traces differ in length: 3rd is longest
        ctx = span.get_span_context()
        out["slow"].append({
            "trace": format(ctx.trace_id, "032x"), "span": format(ctx.span_id, "016x"),
            "wait": format(wait.get_span_context().span_id, "016x"),
        })
        for _ in range(4):
            with tracer.start_as_current_span("GET /fast") as fast:
                fast_work()
            out["fast"].append(format(fast.get_span_context().trace_id, "032x"))
    def chain(depth):
        with tracer.start_as_current_span(f"level-{depth}"):
            if depth < 30:
                chain(depth + 1)

    with tracer.start_as_current_span("deep") as deep:
        chain(1)
    out["deep"] = format(deep.get_span_context().trace_id, "032x")
    print("IDS " + json.dumps(out))
    """,
)


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[RunningServer, dict]]:
    with running_server(tmp_path_factory.mktemp("traces-ui") / "data") as srv:
        (out,) = run_programs(PROGRAM, tmp_path_factory.mktemp("prog"), [srv.url])
        line = next(ln for ln in out.splitlines() if ln.startswith("IDS "))
        yield srv, json.loads(line[4:])


_UNITS = {"ns": 1e-6, "µs": 1e-3, "ms": 1.0, "s": 1e3, "min": 60e3, "h": 3600e3}


def ms(text: str) -> float:
    """Milliseconds of a duration as the UI writes it ("1.23 s", "412 ms", "0 ns")."""
    m = re.fullmatch(r"\s*(-?[\d.]+)\s*(ns|µs|ms|s|min|h)\s*", text)
    assert m, f"not a duration: {text!r}"
    return float(m.group(1)) * _UNITS[m.group(2)]


def result_rows(page) -> List[Dict[str, object]]:  # type: ignore[no-untyped-def]
    return page.eval_on_selector_all(
        ".hs-trace-result",
        """rows => rows.map(r => ({
            id: r.dataset.traceId,
            duration: r.querySelector('.hs-result-duration-text').textContent,
            name: r.querySelector('.hs-trace-link').textContent,
        }))""",
    )


def waterfall_rows(page) -> Dict[str, Dict[str, object]]:  # type: ignore[no-untyped-def]
    rows = page.eval_on_selector_all(
        ".hs-wf-span",
        """rows => rows.map(r => ({
            id: r.dataset.spanId,
            name: r.dataset.name,
            depth: Number(r.dataset.depth),
            activity: r.dataset.activity,
            hidden: r.hidden,
            selected: r.classList.contains('hs-selected'),
            duration: r.querySelector('.hs-wf-duration').textContent,
            self: r.querySelector('.hs-wf-cpu-self').textContent,
            total: r.querySelector('.hs-wf-cpu-total').textContent,
            label: r.querySelector('.hs-activity').textContent,
        }))""",
    )
    return {r["name"]: r for r in rows}


# The flame graph of the span's profile panel, through the component's test hook.
FRAMES = """() => {
    const box = document.querySelector('.hs-span-profile');
    const fg = box && [box, ...box.querySelectorAll('*')].find(e => e.flamegraph);
    return fg ? fg.flamegraph.frames().map(f => f.name) : null;
}"""


def frame_names(page) -> List[str]:  # type: ignore[no-untyped-def]
    return page.evaluate(FRAMES) or []


def wait_for_frame(page, name: str, present: bool = True) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function(
        f"""() => {{
            const names = ({FRAMES})();
            return names !== null && names.includes({json.dumps(name)}) === {json.dumps(present)};
        }}"""
    )


def test_search_lists_the_longest_traces_first(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = [s["trace"] for s in ids["slow"]]
    page.goto(f"{srv.url}/traces?service=shop")
    page.wait_for_selector(".hs-trace-result")
    rows = result_rows(page)
    assert len(rows) == len(slow) + len(ids["fast"]) + 1  # and the deep one
    # The three slow traces first (each >= 630 ms: 480 ms of CPU and a sleep), the longest
    # on top.
    assert {r["id"] for r in rows[:3]} == set(slow)
    durations = [ms(str(r["duration"])) for r in rows]
    assert durations == sorted(durations, reverse=True)
    assert durations[2] >= 600
    assert "GET /slow" in str(rows[0]["name"])

    # The form: span name and minimum duration; the URL keeps the query.
    page.wait_for_selector(".hs-trace-service option[value='shop']", state="attached")
    page.wait_for_selector("#hs-span-names option[value='GET /slow']", state="attached")
    page.fill(".hs-trace-name", "GET /slow")
    page.fill(".hs-trace-min", "100ms")
    page.click(".hs-trace-search")
    page.wait_for_url(re.compile(r"minDuration=100ms"))
    page.wait_for_function("() => document.querySelectorAll('.hs-trace-result').length === 3")
    assert "name=GET+%2Fslow" in page.url and "service=shop" in page.url
    rows = result_rows(page)
    assert {r["id"] for r in rows} == set(slow)
    durations = [ms(str(r["duration"])) for r in rows]
    assert durations == sorted(durations, reverse=True)
    assert "duration>=100ms" in page.inner_text(".hs-trace-query")
    screenshot(page, "traces-search")

    # The same URL in a fresh load lists the same traces, the fields filled in.
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('.hs-trace-result').length === 3")
    assert page.input_value(".hs-trace-name") == "GET /slow"
    assert page.input_value(".hs-trace-min") == "100ms"

    # Nothing found: the message says what to do.
    page.goto(f"{srv.url}/traces?service=shop&minDuration=10s")
    text = page.inner_text(".hs-trace-results .hs-message")
    assert 'No traces for service "shop"' in text and "Widen the time range" in text
    assert f"{srv.url}/v1/traces" in text


def test_failing_traces_are_marked_and_the_status_filter_finds_them(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = {s["trace"] for s in ids["slow"]}  # each holds a "template" span with status error
    page.goto(f"{srv.url}/traces?service=shop")
    page.wait_for_selector(".hs-trace-result")
    failed = page.eval_on_selector_all(
        ".hs-trace-result.hs-trace-failed",
        "rows => rows.map(r => "
        "[r.dataset.traceId, r.querySelector('.hs-result-errors').textContent])",
    )
    assert {tid for tid, _ in failed} == slow
    assert all(text == "1 error" for _, text in failed), failed
    assert page.eval_on_selector(
        ".hs-trace-failed .hs-result-errors", "e => getComputedStyle(e).color"
    ) != page.eval_on_selector(".hs-trace-link", "e => getComputedStyle(e).color")

    # The status filter: only the traces with a failing span, and the URL keeps it.
    page.select_option(".hs-trace-status", "error")
    page.wait_for_url(re.compile(r"status=error"))
    page.wait_for_function(
        "() => document.querySelectorAll('.hs-trace-result').length === 3"
        " && document.querySelector('.hs-trace-query').textContent.includes('status=error')"
    )
    assert {r["id"] for r in result_rows(page)} == slow
    page.reload()
    page.wait_for_function("() => document.querySelectorAll('.hs-trace-result').length === 3")
    assert page.input_value(".hs-trace-status") == "error"

    # A duration range: the fast requests (4 ms of CPU) between 1 ms and 100 ms.
    page.goto(f"{srv.url}/traces?service=shop&name=GET%20%2Ffast")
    page.wait_for_selector(".hs-trace-result")
    page.fill(".hs-trace-min", "1ms")
    page.fill(".hs-trace-max", "100ms")
    page.click(".hs-trace-search")
    page.wait_for_url(re.compile(r"maxDuration=100ms"))
    page.wait_for_function(
        "() => document.querySelector('.hs-trace-query')"
        " && document.querySelector('.hs-trace-query').textContent.includes('duration<=100ms')"
    )
    # The fast requests whose span took 1 to 100 ms: all of them, unless a busy machine
    # stretched one's 4 ms of CPU past 100 ms (read from the server's own spans).
    in_range = set()
    with srv.client() as c:
        for trace_id in ids["fast"]:
            spans = c.get(f"/api/traces/{trace_id}").json()["batches"][0]["scopeSpans"][0]
            (span,) = spans["spans"]
            took = int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"])
            if 1_000_000 <= took <= 100_000_000:
                in_range.add(trace_id)
    assert len(in_range) >= len(ids["fast"]) - 2, in_range
    assert {r["id"] for r in result_rows(page)} == in_range
    page.fill(".hs-trace-max", "1ms")
    page.click(".hs-trace-search")
    page.wait_for_selector(".hs-trace-results .hs-message")
    assert "of at most 1ms" in page.inner_text(".hs-trace-results .hs-message")
    # A duration the form cannot read is refused where it was typed.
    page.fill(".hs-trace-max", "soon")
    page.click(".hs-trace-search")
    assert "maxDuration=1ms" in page.url


def test_the_duration_histogram_filters_the_list(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = {s["trace"] for s in ids["slow"]}
    page.goto(f"{srv.url}/traces?service=shop")
    page.wait_for_selector(".hs-trace-result")
    bars = page.locator(".hs-histogram-bar")
    bars.first.wait_for()
    counts = page.eval_on_selector_all(
        ".hs-histogram-bar", "bars => bars.map(b => Number(b.title.split(': ')[1].split(' ')[0]))"
    )
    # Every span of the service: 3 slow requests with 3 children each, 12 fast, 31 deep.
    assert sum(counts) == 3 * 4 + 12 + 31, counts
    screenshot(page, "traces-histogram")
    # Dragging across the longest bars keeps the traces with a span that long: the slow ones.
    last = bars.count() - 1
    bars.nth(last - 1).dispatch_event("pointerdown")
    bars.nth(last).dispatch_event("pointerenter")
    bars.nth(last).dispatch_event("pointerup")
    page.wait_for_url(re.compile(r"maxDuration="))
    page.wait_for_function(
        "() => document.querySelector('.hs-trace-query')"
        " && document.querySelector('.hs-trace-query').textContent.includes('duration<=')"
    )
    page.wait_for_selector(".hs-trace-result")
    found = {r["id"] for r in result_rows(page)}
    assert found and found <= slow, found
    # The range picked is marked on the histogram, which still shows every duration.
    page.wait_for_selector(".hs-histogram-bar.hs-in-range")
    assert page.locator(".hs-histogram-bar").count() == last + 1


def test_a_functions_menu_leads_to_its_hot_traces_and_to_an_alert_on_it(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = {s["trace"] for s in ids["slow"]}  # slow_function runs only in these
    page.goto(f'{srv.url}/profiles?query={{service_name="shop"}}&from=now-30m')
    row = page.locator('.hs-toptable tr[data-name="__main__.slow_function"]')
    row.wait_for()
    row.click(button="right")
    menu = page.locator(".hs-frame-menu")
    menu.wait_for()
    hot = menu.locator('[data-action="hot-traces"]')
    alert = menu.locator('[data-action="alert"]')
    assert hot.inner_text() == "Traces where this function is hot"
    alert_href = alert.get_attribute("href") or ""
    hot.click()
    page.wait_for_url(re.compile(r"/traces\?function="))
    page.wait_for_selector(".hs-hot-row")
    rows = page.eval_on_selector_all(
        ".hs-hot-row",
        "rows => rows.map(r => [r.dataset.traceId, r.querySelector('.hs-trace-link').textContent])",
    )
    assert {tid for tid, _ in rows} == slow, rows
    assert all("GET /slow" in name for _, name in rows), rows
    assert "__main__.slow_function" in page.inner_text(".hs-hot-function")
    screenshot(page, "hot-traces")
    # A row leads to the trace.
    page.click(f'.hs-hot-row[data-trace-id="{rows[0][0]}"] .hs-trace-link')
    page.wait_for_url(re.compile(rf"/traces/{rows[0][0]}"))

    # "Alert on this function": the alert form filled in (not saved).
    page.goto(srv.url + alert_href)
    function = page.locator(".hs-alert-form input[name=function]:visible")
    function.wait_for()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.hs-alert-form input[name=function]')]"
        ".some(i => i.value)"
    )
    assert function.input_value() == "^__main__\\.slow_function$"
    assert page.input_value(".hs-alert-form input[name=selector]") == '{service_name="shop"}'
    assert page.input_value(".hs-alert-form input[name=name]") == "slow_function_share"
    with srv.client() as c:
        assert c.get("/api/v1/alerts").json()["alerts"] == []  # drafted, not saved


def test_a_result_opens_the_waterfall_with_cpu_beside_duration(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = ids["slow"][0]
    page.goto(f"{srv.url}/traces?service=shop&name=GET%20%2Fslow")
    page.click(f".hs-trace-result[data-trace-id='{slow['trace']}'] .hs-trace-link")
    page.wait_for_url(re.compile(rf"/traces/{slow['trace']}"))
    page.wait_for_selector(".hs-wf-span")
    rows = waterfall_rows(page)
    assert set(rows) == {"GET /slow", "render", "template", "wait"}
    root, render, template, wait = (rows[n] for n in ("GET /slow", "render", "template", "wait"))
    assert root["id"] == slow["span"] and wait["id"] == slow["wait"]
    assert (root["depth"], render["depth"], template["depth"], wait["depth"]) == (0, 1, 2, 1)
    order = list(rows)
    assert order == ["GET /slow", "render", "template", "wait"]  # depth first, by start
    # The span burning 400 ms holds several hundred ms of CPU; the sleeping one ~none.
    assert ms(str(root["duration"])) >= 600
    assert 300 <= ms(str(root["self"])) <= ms(str(root["duration"]))
    assert ms(str(root["total"])) >= ms(str(root["self"]))
    assert ms(str(wait["duration"])) >= 150 and ms(str(wait["total"])) <= 20
    assert wait["activity"] == "waiting" and str(wait["label"]).startswith("not on CPU")
    # (How close CPU comes to the duration depends on the machine's load: not "waiting".)
    # template's 80 ms of CPU may be spread over more wall time on a loaded machine: its CPU.
    assert root["activity"] != "waiting" and ms(str(template["total"])) >= 40
    assert ms(str(render["self"])) <= 20 and ms(str(render["total"])) >= 40
    # Collapsing "render" hides its child; expanding shows it again.
    page.click(".hs-wf-span[data-name='render'] .hs-wf-toggle")
    assert waterfall_rows(page)["template"]["hidden"] is True
    screenshot(page, "traces-waterfall-collapsed")
    page.click(".hs-wf-span[data-name='render'] .hs-wf-toggle")
    assert waterfall_rows(page)["template"]["hidden"] is False
    # No span selected: the whole trace's profile, with both functions.
    wait_for_frame(page, "__main__.slow_function")
    assert "__main__.render_page" in frame_names(page)
    assert "whole trace" in page.inner_text(".hs-profile-title")
    screenshot(page, "traces-waterfall")


def _span_self(srv: RunningServer, trace_id: str, name: str) -> int:
    """The CPU the server puts in a span's own samples (ns)."""
    with srv.client() as c:
        spans = c.get(f"/api/traces/{trace_id}/spans").json()["spans"]
    return int(next(s["self"] for s in spans if s["name"] == name))


def test_a_span_shows_its_own_profile_and_its_descendants(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = ids["slow"][1]
    page.goto(f"{srv.url}/traces/{slow['trace']}")
    page.click(".hs-wf-span[data-name='GET /slow'] .hs-wf-span-name")
    page.wait_for_url(re.compile(rf"span={slow['span']}"))
    assert waterfall_rows(page)["GET /slow"]["selected"] is True
    assert "GET /slow" in page.inner_text(".hs-profile-title")
    # Its own samples: slow_function, not its children's render_page.
    wait_for_frame(page, "__main__.render_page", present=False)
    wait_for_frame(page, "__main__.slow_function")
    page.wait_for_selector(".hs-span-profile [data-name='__main__.slow_function']")
    screenshot(page, "traces-span-profile")
    # With its descendants: render_page too; the URL says so.
    page.check(".hs-descendants")
    wait_for_frame(page, "__main__.render_page")
    assert "descendants=1" in page.url
    assert "descendants" in page.inner_text(".hs-profile-title")
    screenshot(page, "traces-span-profile-descendants")
    # The export of the span's profile is a pprof from the server.
    page.click(".hs-span-profile .hs-export-summary")
    with page.expect_download() as info:
        page.click(".hs-span-profile [data-export='pprof']")
    pprof = info.value
    assert pprof.suggested_filename.endswith(f"-span-{slow['span']}-descendants.pb")
    with open(pprof.path(), "rb") as f:
        assert len(f.read()) > 100

    # A waiting span with no CPU samples: the message says why and what to do.  A sleep
    # holds a stray CPU sample about one time in seventy (the signal of a CPU period that
    # ended as the thread went to sleep is taken as it wakes), so the trace looked at is one
    # whose span has none, as the server counts it.
    quiet = next(t for t in ids["slow"] if _span_self(srv, t["trace"], "wait") == 0)
    if quiet is not slow:
        page.goto(f"{srv.url}/traces/{quiet['trace']}")
    page.click(".hs-wf-span[data-name='wait'] .hs-wf-span-name")
    page.wait_for_url(re.compile(rf"span={quiet['wait']}"))
    page.wait_for_selector(".hs-span-profile .hs-message")
    text = page.inner_text(".hs-span-profile .hs-message")
    # It says what the data shows (not on CPU), not a cause it cannot know.
    assert "not on CPU" in text and "I/O" not in text
    # Its facts: no attributes (and no stray text where they would be), its event.
    page.wait_for_selector(".hs-span-events")
    details = page.inner_text(".hs-span-details")
    assert "null" not in details and "Events (1)" in details
    page.click(".hs-span-events summary")
    assert "cache miss" in page.inner_text(".hs-span-events")
    assert "cache.key=cart:42" in page.inner_text(".hs-span-events")
    # A span that failed says so.
    page.click(".hs-wf-span[data-name='template'] .hs-wf-span-name")
    page.wait_for_function(
        "() => document.querySelector('.hs-span-details').innerText.includes('missing partial')"
    )


def test_the_url_reopens_the_same_view(page, browser, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = ids["slow"][2]
    url = f"{srv.url}/traces/{slow['trace']}?span={slow['span']}&descendants=1"
    for step in ("open", "reload"):
        if step == "open":
            page.goto(url)
        else:
            page.reload()
        page.wait_for_selector(".hs-wf-span.hs-selected")
        assert waterfall_rows(page)["GET /slow"]["selected"] is True
        assert page.is_checked(".hs-descendants")
        wait_for_frame(page, "__main__.render_page")
        assert "__main__.slow_function" in frame_names(page)
    # A fresh page of a fresh browser context (no history, no storage), as a chat link.
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    try:
        fresh = context.new_page()
        fresh.goto(url)
        fresh.wait_for_selector(".hs-wf-span.hs-selected")
        wait_for_frame(fresh, "__main__.render_page")
        screenshot(fresh, "traces-deep-link")
    finally:
        context.close()
    # Back in history: the whole trace again, without the span.
    page.click(".hs-whole-trace")
    page.wait_for_function("() => !location.search.includes('span=')")
    page.go_back()
    page.wait_for_function("() => location.search.includes('span=')")


def test_unknown_and_bad_trace_ids_say_what_to_do(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, _ = shop
    page.goto(f"{srv.url}/traces/{'0' * 31}1")
    text = page.inner_text(".hs-message")
    assert "was not found" in text and f"{srv.url}/v1/traces" in text
    screenshot(page, "traces-unknown-id")
    page.goto(f"{srv.url}/traces/not-a-trace-id")
    text = page.inner_text(".hs-message")
    assert "trace" in text.lower()
    screenshot(page, "traces-bad-id")
    # Whatever the router lets through, the view itself explains what a trace id is.
    page.evaluate(
        """async () => {
            const {renderTraceView} = await import('/static/js/traces.js');
            const box = document.createElement('div');
            box.id = 'bad-id-view';
            document.body.append(box);
            renderTraceView(box, {params: new URLSearchParams(), match: ['', 'xyz'], path: ''});
        }"""
    )
    text = page.inner_text("#bad-id-view .hs-message")
    assert '"xyz" is not a trace id' in text and "32 hex digits" in text


def test_an_unknown_span_is_said_and_kept_in_the_url(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    slow = ids["slow"][0]
    page.goto(f"{srv.url}/traces/{slow['trace']}?span=deadbeefdeadbeef")
    page.wait_for_selector(".hs-wf-span")
    # Said where the eye lands (above the waterfall), and the shared link is left as it was.
    note = page.locator(".hs-missing-span")
    note.wait_for()
    assert "span deadbeefdeadbeef is not in this trace" in note.inner_text().lower()
    assert note.evaluate(
        "n => n.compareDocumentPosition(document.querySelector('.hs-waterfall-box'))"
        " & Node.DOCUMENT_POSITION_FOLLOWING"
    )
    assert len(waterfall_rows(page)) == 4  # the whole waterfall still
    wait_for_frame(page, "__main__.slow_function")  # the whole trace's profile, loaded
    assert "span=deadbeefdeadbeef" in page.url
    # Picking a span replaces it, and the note goes.
    page.click(".hs-wf-span[data-name='wait'] .hs-wf-span-name")
    page.wait_for_url(re.compile(rf"span={slow['wait']}"))
    assert page.locator(".hs-missing-span").count() == 0


def test_more_results_and_the_way_to_the_explorer(page, shop) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    page.goto(f"{srv.url}/traces?service=shop&limit=4")
    page.wait_for_selector(".hs-trace-result")
    assert len(result_rows(page)) == 4
    page.click(".hs-more-traces")
    page.wait_for_url(re.compile(r"limit=8"))
    page.wait_for_function("() => document.querySelectorAll('.hs-trace-result').length === 8")
    # From a trace to its samples in the explorer: filtered to the trace, over its time.
    slow = ids["slow"][0]
    page.goto(f"{srv.url}/traces/{slow['trace']}")
    page.click(".hs-open-in-profiles")
    page.wait_for_url(re.compile(rf"/profiles\?traceId={slow['trace']}"))
    names = """() => {
        const fg = [...document.querySelectorAll('.hs-profile *')].find(e => e.flamegraph);
        return fg ? fg.flamegraph.frames().map(f => f.name) : [];
    }"""
    page.wait_for_function(f"() => ({names})().includes('__main__.slow_function')")
    assert "__main__.fast_work" not in page.evaluate(names)
    assert page.locator(".hs-trace-filter").input_value() == slow["trace"]


@pytest.mark.parametrize("width", [900, 1400])
def test_deep_traces_keep_their_names(page, shop, width: int) -> None:  # type: ignore[no-untyped-def]
    srv, ids = shop
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(f"{srv.url}/traces/{ids['deep']}")
    row = page.locator(".hs-wf-span[data-name='level-30']")
    row.wait_for()
    name = row.locator(".hs-wf-span-name")
    assert name.inner_text() == "level-30"
    # The whole name is shown, not cut short by the indent.
    assert name.evaluate("e => e.scrollWidth <= e.clientWidth"), name.bounding_box()
    assert "30›" in row.inner_text()  # past the indent cap, the depth is written
    screenshot(page, f"traces-deep-{width}")


def test_hostile_names_and_long_values_stay_in_their_place(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A span name with a right-to-left override (U+202E) and attribute and event values of
    thousands of characters without a space: the override reorders nothing outside the name's
    element, and the values wrap inside the span's details instead of widening the page."""
    name = "GET /pay\u202e"
    long_value = "x" * 3000
    trace_id = "ab" * 16
    span = {
        "traceId": trace_id,
        "spanId": "cd" * 8,
        "name": name,
        "kind": 2,
        "startTimeUnixNano": str(int(time.time() - 60) * 10**9),
        "endTimeUnixNano": str(int(time.time() - 59) * 10**9),
        "status": {"code": 2, "message": "declined"},
        "attributes": [{"key": "big", "value": {"stringValue": long_value}}],
        "events": [
            {
                "timeUnixNano": str(int(time.time() - 60) * 10**9 + 1000),
                "name": "e",
                "attributes": [{"key": "big", "value": {"stringValue": long_value}}],
            }
        ],
    }
    body = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "rtl"}}]
                },
                "scopeSpans": [{"spans": [span]}],
            }
        ]
    }
    with running_server(tmp_path / "data") as srv:
        with srv.client() as c:
            assert c.post("/v1/traces", json=body).status_code == 200
        page.set_viewport_size({"width": 1200, "height": 900})
        page.goto(f"{srv.url}/traces?service=rtl")
        row = page.locator(".hs-trace-result").first
        row.wait_for()
        # The name is in its link, the error count beside it: each its own island.
        for part in (row.locator("a.hs-trace-link"), row.locator(".hs-result-errors")):
            assert part.evaluate("e => getComputedStyle(e).unicodeBidi") == "isolate"
        assert row.locator(".hs-result-errors").inner_text() == "1 error"
        page.goto(f"{srv.url}/traces/{trace_id}")
        page.locator(".hs-wf-span .hs-wf-span-name").first.click()
        page.wait_for_selector(".hs-span-attributes")
        page.click(".hs-span-attributes summary")
        page.click(".hs-span-events summary")
        width = page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 1200, width
