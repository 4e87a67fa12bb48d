""" "Why slow?" in the trace view, in a real Chromium against a real server, with data from a
real program (the OpenTelemetry SDK exporting spans, the hotspan agent uploading profiles).

The program serves "GET /checkout" ten times; one request also recalculates the taxes, which
burns 0.4 s of CPU.  Opening that trace and asking "Why slow?" on its span says that it was
computing, ranks the tax function first and draws the diff flame graph baseline → span, where
that function grew.  "GET /report" is slow once because it sleeps (and formats a longer report
first): the answer says it was waiting and shows the wall-clock profile, where the sleeping
function is first; its CPU profile ranks the formatting first.  The view fits a phone (360 and
390 px) in dark mode without scrolling sideways."""

from __future__ import annotations

import json
import re
from typing import Iterator, List, Tuple

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import run_programs, traced_program
from tests.ui.conftest import screenshot
from tests.ui.test_layout_ui import OFFSCREEN, STICKING_OUT, luminance
from tests.ui.test_traces_ui import ms

# The verdict follows the span's CPU over its duration, which a crowded machine lowers (a
# runnable thread waiting for a core is not on CPU): this module runs in the timing phase.
pytestmark = pytest.mark.timing

# Each function burns CPU in its own loop (not through a shared helper), so that the time is
# its own ("self") and the ranking, by extra self time, names it.
PROGRAM = traced_program(
    "store",
    """
    def compute_cart():
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass

    def recalculate_taxes():
        end = time.thread_time() + 0.4
        while time.thread_time() < end:
            pass

    def wait_for_report_backend():
        time.sleep(0.6)

    def format_long_report():
        end = time.thread_time() + 0.08
        while time.thread_time() < end:
            pass

    def render_report():
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass

    def ids_of(span):
        ctx = span.get_span_context()
        return {"trace": format(ctx.trace_id, "032x"), "span": format(ctx.span_id, "016x")}

    out = {"checkout": [], "report": []}
    for i in range(10):
        with tracer.start_as_current_span("GET /checkout") as span:
            compute_cart()
            if i == 6:
                recalculate_taxes()
        out["checkout"].append(ids_of(span))
    for i in range(6):
        with tracer.start_as_current_span("GET /report") as span:
            render_report()
            if i == 4:
                format_long_report()
                wait_for_report_backend()
        out["report"].append(ids_of(span))
    out["slow"] = out["checkout"][6]
    out["waiting"] = out["report"][4]
    print("IDS " + json.dumps(out))
    """,
)
SLOW_FUNCTION = "__main__.recalculate_taxes"
WAITING_FUNCTION = "__main__.wait_for_report_backend"
# What the waiting request computed beyond the others.  Without it, its CPU ranking would rest
# on a sample or two either way, and a CPU timer that expires as the thread goes to sleep (the
# CPU it spends getting there) is handled with the thread at its call to sleep: one such
# sample put the sleeping function first in CI runs.
FORMAT_FUNCTION = "__main__.format_long_report"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[RunningServer, dict]]:
    with running_server(tmp_path_factory.mktemp("why-ui") / "data") as srv:
        (out,) = run_programs(PROGRAM, tmp_path_factory.mktemp("prog"), [srv.url])
        line = next(ln for ln in out.splitlines() if ln.startswith("IDS "))
        yield srv, json.loads(line[4:])


# The diff flame graph of the why panel, through the component's test hook.
GRAPH = """() => {
    const box = document.querySelector('.hs-why-graph');
    const fg = box && [box, ...box.querySelectorAll('*')].find(e => e.flamegraph);
    return fg ? { diff: Boolean(fg.flamegraph.tree && fg.flamegraph.tree.diff),
                  frames: fg.flamegraph.frames().map(f => ({
                      name: f.name, width: f.width, change: f.change, highlighted: f.highlighted,
                      left: f.totalLeft, right: f.totalRight })) } : null;
}"""


def graph(page) -> dict:  # type: ignore[no-untyped-def]
    return page.evaluate(GRAPH) or {"diff": False, "frames": []}


def wait_for_graph_frame(page, name: str) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function(
        f"() => {{ const g = ({GRAPH})();"
        f" return g && g.frames.some(f => f.name === {json.dumps(name)}); }}"
    )


def ranking(page) -> List[dict]:  # type: ignore[no-untyped-def]
    return page.eval_on_selector_all(
        ".hs-why-row",
        """rows => rows.map(r => ({
            name: r.dataset.name,
            extra: r.querySelector('.hs-why-extra').textContent,
            share: (r.querySelector('.hs-why-share') || {}).textContent || null,
            selected: r.classList.contains('hs-selected'),
        }))""",
    )


def wait_for_answer(page) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_selector(".hs-why-summary")
    page.wait_for_function("() => !document.querySelector('.hs-why .hs-loading')")


def test_why_slow_names_the_function_that_made_the_span_slow(page, store) -> None:  # type: ignore[no-untyped-def]
    srv, ids = store
    slow = ids["slow"]
    page.goto(f"{srv.url}/traces/{slow['trace']}")
    page.click(".hs-wf-span[data-name='GET /checkout'] .hs-wf-span-name")
    page.wait_for_url(re.compile(rf"span={slow['span']}"))
    page.click(".hs-why-button")
    page.wait_for_url(re.compile(r"why=1"))
    assert page.get_attribute(".hs-why-button", "aria-pressed") == "true"
    wait_for_answer(page)
    assert "Why is span GET /checkout slow?" in page.inner_text(".hs-profile-title")
    # The span's own profile gives way to the comparison.
    assert page.locator(".hs-span-profile").is_hidden()

    summary = page.inner_text(".hs-why-summary")
    assert "GET /checkout" in summary, summary
    assert page.inner_text(".hs-why-verdict").strip() == "computing", summary
    # Its time split under the summary: mostly CPU.
    split = page.inner_text(".hs-why-split")
    found = re.fullmatch(
        r"Its (.+): CPU (.+) · GIL wait (.+) · CPU wait (.+) · other \(off CPU\) (.+)", split
    )
    assert found and ms(found.group(2)) >= 0.5 * ms(found.group(1)), split
    facts = page.inner_text(".hs-why-facts")
    # The six requests before it: the baseline window ends where the span ends.
    assert "6 spans" in facts, facts
    extra = re.search(r"extra duration\s+\+(.+)", facts.lower())
    assert extra and ms(extra.group(1)) >= 300, facts  # 400 ms of taxes on top

    rows = ranking(page)
    assert rows, page.inner_text(".hs-why-ranking")
    assert rows[0]["name"] == SLOW_FUNCTION, rows
    assert str(rows[0]["extra"]).startswith("+"), rows[0]
    # It accounts for the largest share of the extra duration (how large depends on how
    # busy the machine was: its 400 ms of CPU may have taken longer than 400 ms).
    shares = [int((re.findall(r"(\d+)%", str(r["share"])) or ["0"])[0]) for r in rows]
    assert shares[0] > 0 and shares[0] == max(shares), rows
    # Only functions that took more than the baseline's are listed; how many others there
    # were is said below the table.
    assert all(str(r["extra"]).startswith("+") and str(r["extra"]) != "+0 ns" for r in rows), rows
    assert re.search(
        r"\d+ more functions? of the span took no more", page.inner_text(".hs-why-ranking")
    )
    screenshot(page, "why-ranking")

    # The diff flame graph baseline → span: the tax function is there, grown.
    wait_for_graph_frame(page, SLOW_FUNCTION)
    drawn = graph(page)
    assert drawn["diff"] is True
    assert page.locator(".hs-why-graph.hs-panel-diff").count() == 1
    taxes = [f for f in drawn["frames"] if f["name"] == SLOW_FUNCTION]
    assert taxes and taxes[0]["width"] > 0 and taxes[0]["right"] > taxes[0]["left"], taxes
    assert taxes[0]["change"] is None or taxes[0]["change"] > 0, taxes  # Infinity arrives as null
    canvas = page.locator(".hs-why-graph canvas").first.bounding_box()
    assert canvas and canvas["width"] > 300 and canvas["height"] > 20, canvas

    # A ranked function is highlighted in the graph.
    page.click(f".hs-why-row[data-name='{SLOW_FUNCTION}']")
    assert ranking(page)[0]["selected"] is True
    highlighted = {f["name"] for f in graph(page)["frames"] if f["highlighted"]}
    assert highlighted == {SLOW_FUNCTION}, highlighted
    screenshot(page, "why-graph")

    # The URL reopens the comparison; "Why slow?" again gives back the span's profile.
    page.reload()
    wait_for_answer(page)
    assert ranking(page)[0]["name"] == SLOW_FUNCTION
    page.click(".hs-why-button")
    page.wait_for_function("() => !location.search.includes('why=1')")
    assert page.locator(".hs-why-box").is_hidden()
    page.wait_for_selector(".hs-span-profile [data-name='__main__.recalculate_taxes']")


def test_a_normal_request_has_nothing_much_to_explain(page, store) -> None:  # type: ignore[no-untyped-def]
    """A request like the others: the tax function is not what its ranking leads with."""
    srv, ids = store
    normal = ids["checkout"][2]
    page.goto(f"{srv.url}/traces/{normal['trace']}?span={normal['span']}&why=1")
    wait_for_answer(page)
    assert "GET /checkout" in page.inner_text(".hs-why-summary")
    rows = ranking(page)
    assert not rows or rows[0]["name"] != SLOW_FUNCTION, rows
    # The baseline window is picked above the answer, and kept in the URL.
    page.select_option(".hs-why-window", "1h")
    page.wait_for_function("() => location.search.includes('whyWindow=1h')")
    wait_for_answer(page)
    assert "last hour" in page.inner_text(".hs-why-facts")
    # A window the server refuses: its reason, not a broken page.
    page.goto(f"{srv.url}/traces/{normal['trace']}?span={normal['span']}&why=1&whyWindow=soon")
    page.wait_for_selector(".hs-why .hs-message.hs-error")
    text = page.inner_text(".hs-why .hs-message")
    assert "Cannot compare" in text and "window" in text and "soon" in text, text


def test_a_waiting_span_says_so_and_shows_where_it_waited(page, store) -> None:  # type: ignore[no-untyped-def]
    srv, ids = store
    waiting = ids["waiting"]
    # No span in the URL: the trace's root span, which is this request.
    page.goto(f"{srv.url}/traces/{waiting['trace']}?why=1")
    wait_for_answer(page)
    assert "root span GET /report" in page.inner_text(".hs-profile-title")
    assert page.inner_text(".hs-why-verdict").strip() == "waiting"
    head = page.inner_text(".hs-why-head")
    assert "waiting" in head.lower(), head
    # CPU cannot say where the time went; the wall-clock profile can, and it is shown.
    active = page.locator(".hs-why-type.hs-active")
    assert active.count() == 1 and (active.get_attribute("data-type") or "").startswith("wall:")
    rows = ranking(page)
    assert rows and rows[0]["name"] == WAITING_FUNCTION, rows
    # The CPU comparison is a click away, and the URL keeps it.
    page.click(".hs-why-type[data-type^='process_cpu:']")
    page.wait_for_function("() => location.search.includes('whyType=process_cpu')")
    active_type = page.locator(".hs-why-type.hs-active").get_attribute("data-type") or ""
    assert active_type.startswith("process_cpu:"), active_type
    wait_for_answer(page)
    cpu_rows = ranking(page)
    assert cpu_rows and cpu_rows[0]["name"] == FORMAT_FUNCTION, cpu_rows
    screenshot(page, "why-waiting")


@pytest.mark.parametrize("width", [360, 390, 1024])
def test_why_fits_a_phone_in_dark_mode(page, store, width: int) -> None:  # type: ignore[no-untyped-def]
    srv, ids = store
    slow = ids["slow"]
    page.set_viewport_size({"width": width, "height": 844})
    page.emulate_media(color_scheme="dark")
    page.goto(f"{srv.url}/traces/{slow['trace']}?span={slow['span']}&why=1")
    wait_for_answer(page)
    wait_for_graph_frame(page, SLOW_FUNCTION)
    page.wait_for_load_state("networkidle")
    page.wait_for_timeout(300)  # a resize observer's redraw
    screenshot(page, f"why-dark-{width}")
    assert ranking(page)[0]["name"] == SLOW_FUNCTION
    sizes = page.evaluate(
        "() => ({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})"
    )
    assert sizes["scroll"] <= sizes["inner"] + 1, (sizes, page.evaluate(STICKING_OUT))
    assert page.evaluate(OFFSCREEN) == []
    # The graph fits the window, and is drawn.
    canvas = page.locator(".hs-why-graph canvas").first.bounding_box()
    assert canvas and canvas["width"] > 100, canvas
    assert canvas["x"] >= 0 and canvas["x"] + canvas["width"] <= width + 1, canvas
    colours = page.evaluate(
        """() => {
            const of = (sel, prop) => getComputedStyle(document.querySelector(sel))[prop];
            return { section: of('.hs-profile-section', 'backgroundColor'),
                     text: of('.hs-why-summary', 'color'),
                     table: of('.hs-why-table', 'backgroundColor'),
                     window: of('.hs-why-window', 'backgroundColor') };
        }"""
    )
    for part in ("section", "table", "window"):
        assert luminance(colours[part]) < 0.25, colours
    assert luminance(colours["text"]) > 0.7, colours
