"""The profile explorer and the diff view in a real Chromium, on data the agent pushed.

Two runs of one program ("checkout") push CPU profiles with the real agent: commit "abc", where
``price_cart`` is cheap, and commit "def", where it burns ten times as much.  Part of each run
happens inside an OpenTelemetry span, so its samples carry that trace id.
"""

from __future__ import annotations

import gzip
import re
import time
from typing import Dict, Iterator, List, Tuple
from urllib.parse import parse_qs, quote, urlparse

import pytest

from hotspan.formats.proto import profile_pb2
from tests.conftest import RunningServer, running_server
from tests.helpers import run_programs, traced_program
from tests.ui.conftest import hold, let_through, screenshot

PROGRAM = traced_program(
    "checkout",
    """
    def parse_order():
        burn(0.05)

    def price_cart():
        burn(float(sys.argv[3]))

    def warm_cache():
        burn(0.25)

    warm_cache()
    with tracer.start_as_current_span("nightly-job") as span:
        for _ in range(4):
            parse_order()
            price_cart()
    print("TRACE " + format(span.get_span_context().trace_id, "032x"))
    """,
    tags='{"commit": sys.argv[2]}',
)

MAIN = "__main__."


class Data:
    def __init__(self, server: RunningServer, traces: Dict[str, str]) -> None:
        self.server = server
        self.traces = traces  # commit -> trace id of its job span


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    with running_server(tmp_path_factory.mktemp("ui-profiles") / "data") as srv:
        runs = {"abc": "0.02", "def": "0.2"}
        outputs = run_programs(
            PROGRAM,
            tmp_path_factory.mktemp("prog"),
            *([srv.url, commit, heavy] for commit, heavy in runs.items()),
        )
        traces = {
            commit: re.search(r"TRACE (\w+)", out).group(1)  # type: ignore[union-attr]
            for commit, out in zip(runs, outputs)
        }
        yield Data(srv, traces)


# --- helpers that read the page ------------------------------------------------------------


def frames(page) -> List[dict]:  # type: ignore[no-untyped-def]
    """The flame graph's visible frames (name, x, y, width, height, ...), canvas-relative."""
    return page.evaluate(
        """() => {
            const host = [...document.querySelectorAll('*')].find((e) => e.flamegraph);
            return host ? host.flamegraph.frames() : [];
        }"""
    )


def wait_for_frame(page, name: str) -> dict:  # type: ignore[no-untyped-def]
    page.wait_for_function(
        """(name) => {
            const host = [...document.querySelectorAll('*')].find((e) => e.flamegraph);
            return host && host.flamegraph.frames().some((f) => f.name === name);
        }""",
        arg=name,
    )
    return next(f for f in frames(page) if f.get("name") == name)


def click_frame(page, frame: dict) -> None:  # type: ignore[no-untyped-def]
    box = page.evaluate(
        """() => {
            const host = [...document.querySelectorAll('*')].find((e) => e.flamegraph);
            const r = host.flamegraph.canvas.getBoundingClientRect();
            return {x: r.left, y: r.top};
        }"""
    )
    page.mouse.click(box["x"] + frame["x"] + min(frame["width"] / 2, 20), box["y"] + frame["y"] + 4)


def query_of(page) -> Dict[str, List[str]]:  # type: ignore[no-untyped-def]
    return parse_qs(urlparse(page.url).query)


def widths(page) -> Dict[str, float]:  # type: ignore[no-untyped-def]
    out: Dict[str, float] = {}
    for f in frames(page):
        out[f["name"]] = out.get(f["name"], 0.0) + f["width"]
    return out


# --- tests ------------------------------------------------------------------------------


def test_explorer_shows_what_the_agent_pushed(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/")
    price = wait_for_frame(page, MAIN + "price_cart")
    parse = wait_for_frame(page, MAIN + "parse_order")
    # Both commits together: price_cart burned 4 x 0.22 s, parse_order 8 x 0.05 s.
    assert 1.4 < price["width"] / parse["width"] < 3.6, (price, parse)
    assert page.locator("select.hs-service").input_value() == "checkout"
    assert "process_cpu" in page.locator("select.hs-profile-type").input_value()
    # The timeline holds the CPU the two runs burned (1.7 s in all), on the steps they ran in.
    page.wait_for_function(
        """() => {
            const t = document.querySelector('.hs-timeline').timeline;
            return t.series.length > 0;
        }"""
    )
    drawn = page.evaluate(
        """() => {
            const t = document.querySelector('.hs-timeline').timeline;
            return t.fill(t.series[0].points).map(([, v]) => v);
        }"""
    )
    assert 1.3e9 < sum(drawn) < 2.5e9, sum(drawn)
    # The top table lists the functions, and the address reopens this view.
    page.locator("tr[data-name='__main__.price_cart']").wait_for()
    params = query_of(page)
    assert params["query"] == ['{service_name="checkout"}']
    assert params["profileType"][0].startswith("process_cpu:cpu:nanoseconds")
    screenshot(page, "profiles-explorer")


def test_zoom_search_and_table_selection(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    price = wait_for_frame(page, MAIN + "price_cart")
    click_frame(page, price)
    host = page.locator("[data-zoomed]")
    host.wait_for()
    assert host.get_attribute("data-zoomed") == MAIN + "price_cart"
    zoomed = next(f for f in frames(page) if f["name"] == MAIN + "price_cart")
    canvas_width = page.evaluate(
        "() => [...document.querySelectorAll('*')].find((e) => e.flamegraph)"
        ".flamegraph.canvas.clientWidth"
    )
    assert zoomed["width"] > 0.95 * canvas_width
    screenshot(page, "profiles-zoomed")
    # Clicking the root zooms back out.
    click_frame(page, next(f for f in frames(page) if f["depth"] == 0))
    page.wait_for_selector("[data-zoomed]", state="detached")
    assert MAIN + "parse_order" in widths(page)
    # "parse_o", not "parse_": the program's span exporter thread runs http.client's
    # parse_headers, and a CPU sample lands there now and then.
    page.locator(".hs-search").fill("parse_o")
    page.wait_for_function(
        """() => [...document.querySelectorAll('*')].find((e) => e.flamegraph)
            .flamegraph.frames().some((f) => f.highlighted)"""
    )
    highlighted = {f["name"] for f in frames(page) if f.get("highlighted")}
    assert highlighted == {MAIN + "parse_order"}, highlighted
    # The search is part of the address: a copied link highlights the same frames.
    page.wait_for_function("() => location.search.includes('search=parse_o')")
    fresh = page.context.new_page()
    fresh.goto(page.url)
    fresh.wait_for_function(
        """() => [...document.querySelectorAll('*')].find((e) => e.flamegraph)
            ?.flamegraph.frames().some((f) => f.highlighted && f.name === '__main__.parse_order')"""
    )
    assert fresh.locator(".hs-search").input_value() == "parse_o"
    fresh.close()
    # Between slashes, a regular expression (what an alert's link searches): the table
    # keeps the names it finds.
    page.locator(".hs-search").fill(r"/\.(parse_order|warm_cache)$/")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.hs-toptable-name-text')]
            .map((e) => e.textContent).sort().join() ===
            '__main__.parse_order,__main__.warm_cache'"""
    )
    page.locator(".hs-search").fill("")
    page.locator("tr[data-name='__main__.warm_cache']").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('*')].find((e) => e.flamegraph)
            .flamegraph.frames().some((f) => f.highlighted && f.name === '__main__.warm_cache')"""
    )
    screenshot(page, "profiles-table-selection")


def test_label_filter_group_by_and_timeline_drag(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "price_cart")
    before = widths(page)
    # Add commit="def" from the names and values the server knows.
    page.locator(".hs-add-filter").click()
    page.locator(".hs-filter-name").select_option("commit")
    page.locator(".hs-filter-value").fill("def")
    page.locator(".hs-filter-editor button[type=submit]").click()
    page.wait_for_function("() => location.search.includes('commit')")
    assert query_of(page)["query"] == ['{service_name="checkout", commit="def"}']
    page.wait_for_function(
        """(w) => {
            const fs = [...document.querySelectorAll('*')].find((e) => e.flamegraph)
                .flamegraph.frames();
            const p = fs.find((f) => f.name === '__main__.price_cart');
            const o = fs.find((f) => f.name === '__main__.parse_order');
            return p && o && p.width / o.width > w;
        }""",
        arg=before[MAIN + "price_cart"] / before[MAIN + "parse_order"] * 1.3,
    )
    page.locator(".hs-chip[data-label=commit]").wait_for()
    # Group the timeline by commit: one line per value.
    page.locator(".hs-chip-remove").click()
    page.wait_for_function("() => !location.search.includes('commit')")
    page.locator("select.hs-group-by").select_option("commit")
    page.locator(".hs-legend-item", has_text="commit=abc").wait_for()
    page.locator(".hs-legend-item", has_text="commit=def").wait_for()
    assert query_of(page)["groupBy"] == ["commit"]
    screenshot(page, "profiles-grouped-timeline")
    # Drag across the timeline: the range becomes absolute and lands in the address.
    box = page.locator(".hs-timeline-canvas").first.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.5, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.7, y, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.98, y, steps=5)
    page.mouse.up()
    page.wait_for_function("() => /from=\\d+/.test(location.search)")
    params = query_of(page)
    start, end = int(params["from"][0]), int(params["until"][0])
    now = time.time()
    assert now - 3700 < start < end <= now + 60
    # The fields show the dragged range as local times; the address keeps unix seconds.
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page.locator(".hs-range-from").input_value()
    )


def test_a_label_value_being_typed_is_not_overwritten_by_the_suggestion(page, data) -> None:  # type: ignore[no-untyped-def]
    """The first known value is put in the value field as a suggestion when the values come,
    unless the field is being typed in: an answer that came between Playwright's select-all
    and its typing made commit="abc" + "def" = commit="abcdef" in a CI run."""
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "price_cart")
    values = "**/querier.v1.QuerierService/LabelValues"
    held = hold(page, values)
    page.locator(".hs-add-filter").click()
    page.locator(".hs-filter-name").select_option("commit")
    page.wait_for_function("() => document.querySelector('.hs-filter-value')")
    page.focus(".hs-filter-value")  # about to type
    let_through(page, values, held, "LabelValues", "the editor did not ask for the label's values")
    page.wait_for_function("() => document.querySelectorAll('datalist option').length > 0")
    assert page.input_value(".hs-filter-value") == ""
    # Not being typed in: the suggestion is put there.
    page.locator(".hs-filter-name").focus()
    page.locator(".hs-filter-name").select_option("commit")
    page.locator(".hs-filter-name").dispatch_event("change")
    page.wait_for_function("() => document.querySelector('.hs-filter-value').value !== ''")
    assert page.input_value(".hs-filter-value") in ("abc", "def")


@pytest.mark.parametrize("width", [900, 1150, 1400])
def test_top_table_numbers_fit_at_any_width(page, data, width: int) -> None:  # type: ignore[no-untyped-def]
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "price_cart")
    body = page.locator(".hs-panel-body").first.bounding_box()
    table = page.locator(".hs-panel-table").first.bounding_box()
    graph = page.locator(".hs-panel-graph").first.bounding_box()
    assert body and table and graph
    if width <= 1100:  # narrow: the table above the graph, both at full width
        assert table["width"] > 0.95 * body["width"] and graph["width"] > 0.95 * body["width"]
        assert graph["y"] >= table["y"] + table["height"]
    else:  # side by side, the graph keeps most of the room
        assert graph["x"] >= table["x"] + table["width"] and graph["width"] > 400
    # Each number fits its cell (names may end in an ellipsis; numbers must not spill over).
    spilled = page.evaluate(
        """() => [...document.querySelectorAll('.hs-panel-table tbody tr')].slice(0, 5)
            .flatMap((tr) => [...tr.children].slice(1))
            .filter((td) => td.scrollWidth > td.clientWidth + 1)
            .map((td) => td.textContent)"""
    )
    assert spilled == []
    screenshot(page, f"profiles-width-{width}")


def test_trace_id_filter_shows_only_that_traces_samples(page, data) -> None:  # type: ignore[no-untyped-def]
    trace_id = data.traces["def"]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "warm_cache")
    page.locator(".hs-trace-filter").fill(trace_id)
    page.locator(".hs-trace-form button").click()
    page.wait_for_function("(id) => location.search.includes(id)", arg=trace_id)
    page.wait_for_function(
        """() => {
            const fs = [...document.querySelectorAll('*')].find((e) => e.flamegraph)
                .flamegraph.frames();
            return fs.some((f) => f.name === '__main__.price_cart')
                && !fs.some((f) => f.name === '__main__.warm_cache');
        }"""
    )
    screenshot(page, "profiles-trace-filter")
    # The address reopens the filtered view in a fresh page.
    url = page.url
    fresh = page.context.new_page()
    fresh.goto(url)
    wait_for_frame(fresh, MAIN + "price_cart")
    assert MAIN + "warm_cache" not in {f["name"] for f in frames(fresh)}
    assert fresh.locator(".hs-trace-filter").input_value() == trace_id
    fresh.close()
    # A malformed id is refused in the form, with the reason; a good one is taken after it.
    page.locator(".hs-trace-filter").fill("not-an-id")
    page.locator(".hs-trace-form button").click()
    assert "32 hex" in page.locator(".hs-trace-filter").evaluate("e => e.validationMessage")
    other = data.traces["abc"]
    page.locator(".hs-trace-filter").fill(other)
    page.locator(".hs-trace-form button").click()
    page.wait_for_function("(id) => location.search.includes(id)", arg=other)


def test_trace_filter_offers_the_range_the_trace_ran_in(page, data) -> None:  # type: ignore[no-untyped-def]
    # A link with a trace id but a range from before the trace: hotspan has the trace's spans,
    # so it offers the time around it.
    trace_id = data.traces["def"]
    now = int(time.time())
    page.goto(f"{data.server.url}/profiles?traceId={trace_id}&from={now - 7200}&until={now - 5400}")
    page.locator(".hs-trace-range").click()
    wait_for_frame(page, MAIN + "price_cart")
    assert MAIN + "warm_cache" not in widths(page)
    start = int(query_of(page)["from"][0])
    assert now - 600 < start < now


def test_diff_colours_what_grew(page, data) -> None:  # type: ignore[no-untyped-def]
    left = quote('{service_name="checkout", commit="abc"}')
    right = quote('{service_name="checkout", commit="def"}')
    page.goto(f"{data.server.url}/diff?leftQuery={left}&rightQuery={right}")
    price = wait_for_frame(page, MAIN + "price_cart")
    parse = wait_for_frame(page, MAIN + "parse_order")
    grew, shrank = colour(page, price), colour(page, parse)
    # price_cart's share grew from ~30% to ~80%: red; parse_order's share shrank: green.
    assert grew[0] > grew[1] + 40, grew
    assert shrank[1] > shrank[0] + 20, shrank
    screenshot(page, "diff")
    params = query_of(page)
    assert params["leftQuery"] == ['{service_name="checkout", commit="abc"}']
    assert params["rightQuery"] == ['{service_name="checkout", commit="def"}']


def test_diff_sides_built_from_label_pickers(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{data.server.url}/diff")
    wait_for_frame(page, MAIN + "price_cart")  # both sides: the whole service, no difference
    for side, commit in (("left", "abc"), ("right", "def")):
        page.locator(f".hs-diff-{side} .hs-add-filter").click()
        page.locator(f".hs-diff-{side} .hs-filter-name").select_option("commit")
        page.locator(f".hs-diff-{side} .hs-filter-value").fill(commit)
        page.locator(f".hs-diff-{side} .hs-filter-editor button[type=submit]").click()
        page.wait_for_function(
            '(c) => decodeURIComponent(location.search).includes(`commit="${c}"`)', arg=commit
        )
    page.wait_for_function(
        """() => {
            const host = [...document.querySelectorAll('*')].find((e) => e.flamegraph);
            const f = host && host.flamegraph.frames().find(
                (x) => x.name === '__main__.price_cart');
            return f && f.change > 0.2;
        }"""
    )
    grew = colour(page, next(f for f in frames(page) if f["name"] == MAIN + "price_cart"))
    assert grew[0] > grew[1] + 40, grew
    # A bad time range is refused in its own side's field, with the reason.
    page.locator(".hs-diff-right .hs-range-from").fill("someday")
    page.locator(".hs-diff-right .hs-range-apply").click()
    message = page.locator(".hs-diff-right .hs-range-from").evaluate("e => e.validationMessage")
    assert "someday" in message


def colour(page, frame: dict) -> Tuple[int, int, int]:  # type: ignore[no-untyped-def]
    """The pixel colour in the middle-left of a frame (where no label is drawn)."""
    return tuple(
        page.evaluate(
            """(f) => {
                const host = [...document.querySelectorAll('*')].find((e) => e.flamegraph);
                const canvas = host.flamegraph.canvas;
                const ratio = canvas.width / canvas.clientWidth;
                const x = Math.round((f.x + Math.min(f.width - 2, 3)) * ratio);
                const y = Math.round((f.y + f.height - 3) * ratio);
                return [...canvas.getContext('2d').getImageData(x, y, 1, 1).data].slice(0, 3);
            }""",
            frame,
        )
    )


def test_exports_pprof_and_folded(page, data, tmp_path) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "price_cart")
    exports = {}
    names = {}
    for kind in ("pprof", "folded"):
        item = page.locator(f"[data-export={kind}]")
        if not item.is_visible():
            page.locator(".hs-export-summary").click()
        with page.expect_download() as info:
            item.click()
        path = tmp_path / kind
        info.value.save_as(path)
        exports[kind] = path.read_bytes()
        names[kind] = info.value.suggested_filename
    # Named after what was exported and from when, so that exports do not overwrite each
    # other: service, profile type, start of the range.
    assert re.fullmatch(r"checkout-cpu-\d{8}T\d{4}\.pb", names["pprof"]), names
    assert re.fullmatch(r"checkout-cpu-\d{8}T\d{4}\.folded\.txt", names["folded"]), names
    raw = exports["pprof"]
    profile = profile_pb2.Profile.FromString(
        gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    )
    names = {bytes(profile.string_table[f.name]).decode() for f in profile.function}
    assert MAIN + "price_cart" in names and MAIN + "parse_order" in names
    folded = exports["folded"].decode()
    assert re.search(
        r"^__main__\.<module>;__main__\.price_cart;__main__\.burn \d+$", folded, re.M
    ), folded[:500]


def test_empty_server_says_what_to_do(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with running_server(tmp_path / "empty") as srv:
        page.goto(srv.url + "/")
        box = page.locator(".hs-message.hs-empty")
        box.wait_for()
        text = box.inner_text()
        assert "No profiles in this time range" in text
        assert srv.url in text and "hotspan.configure" in text
        screenshot(page, "profiles-empty")


def test_query_token_is_asked_for_and_used(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with running_server(tmp_path / "guarded", ["--query-token", "read-secret"]) as srv:
        page.goto(srv.url + "/")
        error = page.locator(".hs-message.hs-error")
        error.wait_for()
        assert "token" in error.inner_text() and "Settings" in error.inner_text()
        page.locator("#hs-settings-button").click()
        page.locator(".hs-dialog input[type=password]").fill("read-secret")
        page.locator(".hs-dialog button[value=save]").click()
        page.locator(".hs-message.hs-empty").wait_for()  # authorised now: just no data


def test_bad_address_parameters_get_a_message(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?from=yesterday-ish&until=now")
    box = page.locator(".hs-message.hs-error")
    box.wait_for()
    assert "is not a time" in box.inner_text()
    page.goto(data.server.url + "/profiles?query=" + quote("service_name=checkout"))
    box = page.locator(".hs-message.hs-error")
    box.wait_for()
    assert "label selector" in box.inner_text()


def test_pages_are_served_with_a_strict_policy(data) -> None:  # type: ignore[no-untyped-def]
    with data.server.client() as c:
        for path in ("/", "/profiles", "/diff", "/traces", "/traces/" + "a" * 32):
            r = c.get(path)
            assert r.status_code == 200 and '<main id="app"' in r.text
            assert "script-src 'self'" in r.headers["content-security-policy"]
            assert r.headers["x-content-type-options"] == "nosniff"
        r = c.get("/static/js/app.js")
        assert r.status_code == 200 and "javascript" in r.headers["content-type"]
        assert c.get("/static/js/missing.js").status_code == 404


# --- grouped timelines: legend, stacked, breakdown ------------------------------------------


def test_legend_stacked_and_breakdown_narrow_the_query(page, data) -> None:  # type: ignore[no-untyped-def]
    query = quote('{service_name="checkout"}')
    page.goto(f"{data.server.url}/profiles?groupBy=commit&query={query}")
    wait_for_frame(page, MAIN + "price_cart")
    # Stacked: the grouped view is in the address and the top line is the total.
    page.locator("select.hs-group-view").select_option("stacked")
    page.wait_for_function("() => location.search.includes('groupView=stacked')")
    page.locator(".hs-legend-pick", has_text="commit=abc").wait_for()
    screenshot(page, "profiles-stacked-timeline")
    # Breakdown: one small timeline per commit, largest first.
    page.locator("select.hs-group-view").select_option("breakdown")
    page.wait_for_function("() => location.search.includes('groupView=breakdown')")
    cards = page.locator(".hs-breakdown-card")
    cards.nth(1).wait_for()
    assert cards.count() == 2
    assert cards.nth(0).get_attribute("data-value") == "def"  # price_cart burned 10x there
    screenshot(page, "profiles-breakdown")
    # Explore Profiles' comparison: the largest value is the baseline; another card's
    # "vs def" is the diff of the two values, one click away; "as baseline" swaps them.
    assert page.inner_text(".hs-breakdown-card[data-value=def] .hs-breakdown-compare-box") == (
        "baseline"
    )
    page.locator(".hs-breakdown-card[data-value=abc] .hs-breakdown-make-baseline").click()
    page.locator(".hs-breakdown-card[data-value=def] .hs-breakdown-compare").wait_for()
    assert page.inner_text(".hs-breakdown-card[data-value=def] .hs-breakdown-compare") == "vs abc"
    href = page.get_attribute(".hs-breakdown-card[data-value=def] .hs-breakdown-compare", "href")
    diff = parse_qs(urlparse(href or "").query)
    assert diff["leftQuery"] == ['{service_name="checkout", commit="abc"}'], diff
    assert diff["rightQuery"] == ['{service_name="checkout", commit="def"}'], diff
    page.locator(".hs-breakdown-card[data-value=def] .hs-breakdown-compare").click()
    page.wait_for_url(re.compile(r"/diff\?"))
    page.wait_for_selector(f".hs-diff-profile .hs-toptable tbody tr[data-name='{MAIN}price_cart']")
    page.go_back()
    page.wait_for_function("() => location.search.includes('groupView=breakdown')")
    cards.nth(1).wait_for()
    # Picking a value keeps only its series and leaves the breakdown.
    page.locator(".hs-breakdown-card[data-value=def] .hs-breakdown-pick").click()
    page.wait_for_function("() => decodeURIComponent(location.search).includes('commit=\"def\"')")
    assert "groupView" not in query_of(page)
    assert query_of(page)["query"] == ['{service_name="checkout", commit="def"}']
    # The legend of a grouped timeline does the same: "show only this series".
    page.goto(f"{data.server.url}/profiles?groupBy=commit&query={query}")
    page.locator(".hs-legend-pick", has_text="commit=abc").click()
    page.wait_for_function("() => decodeURIComponent(location.search).includes('commit=\"abc\"')")
    assert query_of(page)["query"] == ['{service_name="checkout", commit="abc"}']
    page.locator(".hs-legend-pick", has_text="commit=abc").wait_for()
    assert page.locator(".hs-legend-pick", has_text="commit=def").count() == 0


def legend_colours(page) -> Dict[str, str]:  # type: ignore[no-untyped-def]
    """The colour of each series as its legend swatch shows it, by label."""
    return dict(
        page.locator(".hs-timeline-legend .hs-legend-item").evaluate_all(
            """(items) => items.map((i) => [i.textContent,
                getComputedStyle(i.querySelector('.hs-legend-swatch')).backgroundColor])"""
        )
    )


def rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def test_a_series_keeps_its_colour_when_narrowed_to_and_in_the_breakdown(page, data) -> None:  # type: ignore[no-untyped-def]
    query = quote('{service_name="checkout"}')
    page.goto(f"{data.server.url}/profiles?groupBy=commit&groupView=stacked&query={query}")
    page.locator(".hs-legend-pick", has_text="commit=def").wait_for()
    page.locator(".hs-legend-pick", has_text="commit=abc").wait_for()
    colours = legend_colours(page)
    assert len(set(colours.values())) == 2, colours
    # The breakdown draws each value in its colour in the grouped timeline.
    page.locator("select.hs-group-view").select_option("breakdown")
    page.locator(".hs-breakdown-card").nth(1).wait_for()
    cards = page.locator(".hs-breakdown-card .hs-timeline").evaluate_all(
        "(ts) => ts.map((t) => [t.closest('.hs-breakdown-card').dataset.value, t.timeline.colour])"
    )
    assert {f"commit={v}": rgb(c) for v, c in cards} == colours, (cards, colours)
    # Narrowed to the second series (the first's colour would be the palette's first anyway),
    # it keeps its colour.
    page.locator("select.hs-group-view").select_option("stacked")
    second = page.locator(".hs-legend-pick").nth(1)
    label = second.inner_text()
    second.click()
    page.wait_for_function(
        "(v) => decodeURIComponent(location.search).includes(v)",
        arg=label.replace("=", '="') + '"',
    )
    page.wait_for_function(
        "() => document.querySelectorAll('.hs-timeline-legend .hs-legend-item').length === 1"
    )
    assert legend_colours(page) == {label: colours[label]}
    screenshot(page, "profiles-series-colour-kept")


def test_breakdown_shows_the_largest_values_and_says_how_many_are_left_out(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "price_cart")
    shown = page.evaluate(
        """async () => {
            const { Breakdown } = await import('/static/js/breakdown.js');
            const host = document.createElement('div');
            document.querySelector('.hs-main').append(host);
            const b = new Breakdown(host, { onSelect() {}, onPick() {} });
            const now = Date.now();
            const series = Array.from({ length: 15 }, (_, i) => ({
                label: `pod=p${i}`, group: { name: 'pod', value: `p${i}` },
                points: [[now - 60000, (i + 1) * 1e9]],
            }));
            b.render(series, { startMs: now - 3600000, endMs: now, stepMs: 15000,
                unit: 'nanoseconds', label: 'pod' });
            const cards = [...host.querySelectorAll('.hs-breakdown-card')];
            return { values: cards.map((c) => c.dataset.value),
                more: host.querySelector('.hs-breakdown-more').textContent };
        }"""
    )
    assert shown["values"] == [f"p{i}" for i in range(14, 2, -1)], shown
    assert "3 more values of pod" in shown["more"], shown


def test_profile_types_are_named_with_their_units(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "price_cart")
    ids = [
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "wall:wall:nanoseconds:wall:nanoseconds",
        "memory:alloc_space:bytes:space:bytes",
        "memory:alloc_objects:count:space:bytes",
        "memory:inuse_space:bytes:space:bytes",
        "memory:inuse_objects:count:space:bytes",
        "mutex:delay:nanoseconds:contentions:count",
        "mutex:contentions:count:contentions:count",
        "block:delay:nanoseconds:contentions:count",
        "goroutines:goroutine:count:goroutine:count",
        "memory:alloc_in_new_tlab_bytes:bytes:space:bytes",
        "memory:alloc_in_new_tlab_objects:count:space:bytes",
    ]
    labels = page.evaluate(
        """async (ids) => {
            const { typeLabel } = await import('/static/js/selection.js');
            return ids.map(typeLabel);
        }""",
        ids,
    )
    expected = [
        ("CPU time", "(ns)"),
        ("Wall time", "(ns)"),
        ("Allocated bytes", "(bytes)"),
        ("Allocated objects", "(objects)"),
        ("Live heap bytes", "(bytes)"),
        ("Live heap objects", "(objects)"),
        ("Lock wait time", "(ns)"),
        ("Lock contentions", "(count)"),
        ("Blocked time", "(ns)"),
        ("Threads and tasks", "(count)"),
        ("Allocated bytes (new TLABs)", "(bytes)"),
        ("Allocated objects (new TLABs)", "(objects)"),
    ]
    for label, (words, unit) in zip(labels, expected):
        assert label.startswith(words) and label.endswith(unit), (label, words, unit)


def test_timeline_ticks_are_round_in_every_unit(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "price_cart")
    cases = [
        (2.4e9, "nanoseconds", ["0", "1 s", "2 s", "3 s"]),
        (340e6, "nanoseconds", ["0", "100 ms", "200 ms", "300 ms", "400 ms"]),
        (5.5 * 60e9, "nanoseconds", ["0", "2 min", "4 min", "6 min"]),
        (3.5 * 1024**2, "bytes", ["0", "1 MiB", "2 MiB", "3 MiB", "4 MiB"]),
        (37, "count", ["0", "10", "20", "30", "40"]),
        (7, "count", ["0", "2", "4", "6", "8"]),
        (0, "nanoseconds", ["0", "1 ns"]),
    ]
    got = page.evaluate(
        """async (cases) => {
            const { niceTicks, tickLabel } = await import('/static/js/timeline.js');
            return cases.map(([top, unit]) => niceTicks(top, unit).map((v) => tickLabel(v, unit)));
        }""",
        [[top, unit] for top, unit, _ in cases],
    )
    assert got == [want for _, _, want in cases]


# --- zoom and sort in the URL ----------------------------------------------------------------


def test_flame_graph_zoom_and_table_sort_live_in_the_url(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    price = wait_for_frame(page, MAIN + "price_cart")
    click_frame(page, price)
    page.wait_for_function("() => new URLSearchParams(location.search).get('zoom')")
    zoom = query_of(page)["zoom"][0]
    assert "price_cart" in zoom, zoom
    page.locator(".hs-panel-table th", has_text="Total").first.click()
    page.wait_for_function(
        "() => (new URLSearchParams(location.search).get('sort') || '').startsWith('total')"
    )
    # A fresh page from the address shows the same zoom and order.
    fresh = page.context.new_page()
    fresh.goto(page.url)
    fresh.locator("[data-zoomed]").wait_for()
    assert "price_cart" in (fresh.locator("[data-zoomed]").get_attribute("data-zoomed") or "")
    fresh.locator(".hs-panel-table tbody tr").first.wait_for()
    sort = query_of(fresh)["sort"][0]
    names = fresh.locator(".hs-panel-table tbody tr").evaluate_all(
        "(rows) => rows.map((r) => r.dataset.name)"
    )
    if sort.endswith("desc"):
        assert names[0] == MAIN + "<module>", names
    fresh.close()
    # A zoom that does not match the data is the whole graph, without an error.
    query = quote('{service_name="checkout"}')
    page.goto(data.server.url + "/profiles?zoom=no.such;frame&query=" + query)
    wait_for_frame(page, MAIN + "price_cart")


# --- leaving a page ------------------------------------------------------------------------


def live_flame_graphs(page) -> int:  # type: ignore[no-untyped-def]
    """FlameGraph objects still alive in the page after a garbage collection (DevTools)."""
    cdp = page.context.new_cdp_session(page)
    try:
        proto = cdp.send(
            "Runtime.evaluate",
            {
                "expression": "import('/static/js/flamegraph.js')"
                ".then((m) => m.FlameGraph.prototype)",
                "awaitPromise": True,
            },
        )["result"]["objectId"]
        cdp.send("HeapProfiler.collectGarbage")
        found = cdp.send("Runtime.queryObjects", {"prototypeObjectId": proto})["objects"]
        count = cdp.send(
            "Runtime.callFunctionOn",
            {
                "objectId": found["objectId"],
                "functionDeclaration": "function () { return this.length; }",
                "returnByValue": True,
            },
        )
        return int(count["result"]["value"])
    finally:
        cdp.detach()


def test_leaving_a_page_leaves_nothing_behind(page, data) -> None:  # type: ignore[no-untyped-def]
    checkout = "/profiles?query=" + quote('{service_name="checkout"}')
    page.goto(data.server.url + checkout)
    wait_for_frame(page, MAIN + "price_cart")
    # A search typed just before leaving must not land in the next page's address.
    page.locator(".hs-search").fill("price")
    page.locator('.hs-nav a[data-nav="diff"]').click()
    page.wait_for_url("**/diff*")
    page.wait_for_timeout(600)  # past the search box's debounce
    assert "search" not in parse_qs(urlparse(page.url).query), page.url

    # Back and forth between the views: only the graphs on screen stay alive.
    for _ in range(4):
        page.locator('.hs-nav a[data-nav="profiles"]').click()
        wait_for_frame(page, MAIN + "price_cart")
        page.locator('.hs-nav a[data-nav="diff"]').click()
        page.wait_for_url("**/diff*")
        page.locator(".hs-diff-profile canvas").first.wait_for()
    shown = page.evaluate(
        "() => document.querySelectorAll('canvas.flamegraph, .flamegraph canvas').length"
    )
    assert live_flame_graphs(page) <= max(shown, 1) + 1


def test_zoom_out_doubles_the_range_around_its_middle(page, data) -> None:  # type: ignore[no-untyped-def]
    query = quote('{service_name="checkout"}')
    page.goto(f"{data.server.url}/profiles?query={query}&from=now-1h&until=now")
    wait_for_frame(page, MAIN + "price_cart")
    page.locator(".hs-range-zoom-out").first.click()
    page.wait_for_function("() => location.search.includes('from=now-2h')")
    # An absolute range in the past grows both ways, its middle kept.
    start, end = int(time.time()) - 7200, int(time.time()) - 3600
    page.goto(f"{data.server.url}/profiles?query={query}&from={start}&until={end}")
    page.locator(".hs-range-zoom-out").first.click()
    page.wait_for_function(f"() => location.search.includes('from={start - 1800}')")
    assert query_of(page)["until"] == [str(end + 1800)]
