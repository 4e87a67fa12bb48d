"""The diff page in a real Chromium: two spans or two traces compared, what each side is, which
side is empty, and a layout that fits from a phone to a wide screen.

Two runs of one program ("shop") each serve one traced request, "GET /checkout": it renders
(the same in both runs) and prices the cart in a child span, ten times slower in the second
run.  Before the request the program warms a cache outside any trace, so a side that took the
whole service instead of the span would show ``warm_cache``.
"""

from __future__ import annotations

import json
from typing import Dict, Iterator, List
from urllib.parse import parse_qs, urlencode, urlparse

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import run_programs, traced_program
from tests.ui.conftest import artifact_path, screenshot, sized

PROGRAM = traced_program(
    "shop",
    """
    def render():
        burn(0.2)

    def price_cart():
        burn(float(sys.argv[2]))

    def warm_cache():
        burn(0.3)

    # OpenTelemetry's first spans import and set up what they need: done here, outside the
    # request, so that no side of the diff holds a one-off start-up frame.
    with tracer.start_as_current_span("warm-up"):
        with tracer.start_as_current_span("warm-up child"):
            pass
    warm_cache()
    with tracer.start_as_current_span("GET /checkout") as request:
        render()
        with tracer.start_as_current_span("price"):
            price_cart()
        with tracer.start_as_current_span("noop") as noop:
            pass
    print(json.dumps({
        "trace": format(request.get_span_context().trace_id, "032x"),
        "span": format(request.get_span_context().span_id, "016x"),
        "noop": format(noop.get_span_context().span_id, "016x"),
    }))
    """,
)

MAIN = "__main__."


class Data:
    def __init__(self, server: RunningServer, runs: Dict[str, Dict[str, str]]) -> None:
        self.server = server
        self.fast = runs["fast"]  # {"trace", "span" (GET /checkout), "noop"}
        self.slow = runs["slow"]

    def url(self, **params: str) -> str:
        return f"{self.server.url}/diff?{urlencode(params)}"

    def spans_url(self, left: Dict[str, str], right: Dict[str, str], span: str = "span") -> str:
        return self.url(
            leftTraceId=left["trace"],
            leftSpanId=left[span] if span else "",
            rightTraceId=right["trace"],
            rightSpanId=right[span] if span else "",
        )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    with running_server(tmp_path_factory.mktemp("ui-diff") / "data") as srv:
        runs = {"fast": "0.08", "slow": "0.8"}  # price_cart: ten times slower
        outputs = run_programs(
            PROGRAM, tmp_path_factory.mktemp("prog"), *([srv.url, heavy] for heavy in runs.values())
        )
        ids = {name: json.loads(out.strip().splitlines()[-1]) for name, out in zip(runs, outputs)}
        yield Data(srv, ids)


# --- reading the page ----------------------------------------------------------------------


def panel_rows(page) -> List[str]:  # type: ignore[no-untyped-def]
    return page.locator(".hs-diff-profile .hs-toptable tbody tr[data-name]").evaluate_all(
        "rows => rows.map((r) => r.dataset.name)"
    )


def wait_for_rows(page, name: str) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_function(
        """(name) => [...document.querySelectorAll('.hs-diff-profile .hs-toptable tr[data-name]')]
            .some((r) => r.dataset.name === name)""",
        arg=name,
    )


def sort_by_change(page) -> None:  # type: ignore[no-untyped-def]
    header = page.locator(".hs-diff-profile .hs-toptable th.hs-toptable-change")
    header.locator("button").click()
    if header.get_attribute("aria-sort") != "descending":
        header.locator("button").click()
    assert header.get_attribute("aria-sort") == "descending"


def query_of(page) -> Dict[str, List[str]]:  # type: ignore[no-untyped-def]
    return parse_qs(urlparse(page.url).query)


def fits(page) -> bool:  # type: ignore[no-untyped-def]
    """The page's content (under the shared header, which test_layout_ui.py holds to its
    width) needs no sideways scroll: tables may scroll inside themselves, the page may not."""
    return page.evaluate("() => document.getElementById('app').scrollWidth <= window.innerWidth")


def sized_page(page, width: int, dark: bool = False):  # type: ignore[no-untyped-def]
    """The tab at a phone's height below 600 px wide, a desktop's above."""
    return sized(page, width, 844 if width < 600 else 900, dark)


# --- two spans, two traces -----------------------------------------------------------------


def test_two_spans_put_the_function_that_slowed_down_first(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.spans_url(data.fast, data.slow))
    wait_for_rows(page, MAIN + "price_cart")
    sort_by_change(page)
    rows = panel_rows(page)
    # Change sorts by points of the total moved: a library sliver new on one side (the agent
    # samples at span boundaries) is "new" but does not rank above the function that slowed.
    assert rows[0] == MAIN + "price_cart", rows[:8]
    # The span's descendants are in (price_cart ran in a child span), the rest of the run is not.
    assert MAIN + "render" in rows
    assert MAIN + "warm_cache" not in rows
    screenshot(page, "diff-two-spans")

    # Each side says what it is and links back to its trace, with the span selected.
    left = page.locator(".hs-diff-left .hs-diff-subject")
    text = left.inner_text()
    fast = data.fast
    assert f"span GET /checkout ({fast['span'][:8]}…) of trace {fast['trace'][:8]}…" in text
    assert "with its 2 descendant spans" in text, text  # price, noop
    link = left.locator("a.hs-diff-trace-link")
    href = urlparse(link.get_attribute("href"))
    assert href.path == f"/traces/{data.fast['trace']}"
    assert parse_qs(href.query)["span"] == [data.fast["span"]]
    assert data.slow["trace"][:8] in page.locator(".hs-diff-right .hs-diff-subject").inner_text()
    # No service timeline beside one trace's samples: it would show something else.
    assert not page.locator(".hs-diff-left .hs-timeline-canvas").is_visible()
    # The range the trace ran in went into the address, so a reload compares the same.
    params = query_of(page)
    assert params["leftTraceId"] == [data.fast["trace"]]
    assert params["rightSpanId"] == [data.slow["span"]]
    assert params["leftFrom"][0].isdigit() and params["rightUntil"][0].isdigit()

    link.click()
    page.wait_for_url(f"**/traces/{data.fast['trace']}?*")
    page.locator(".hs-profile-section").wait_for()


def test_two_traces_compare_all_of_each_traces_samples(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.spans_url(data.fast, data.slow, span=""))
    wait_for_rows(page, MAIN + "price_cart")
    sort_by_change(page)
    rows = panel_rows(page)
    assert rows[0] == MAIN + "price_cart", rows[:8]
    assert MAIN + "warm_cache" not in rows
    subject = page.locator(".hs-diff-left .hs-diff-subject").inner_text()
    assert f"trace {data.fast['trace'][:8]}… (GET /checkout)" in subject
    assert "Compare GET /checkout" not in subject
    # Out of the trace: the side becomes the trace's service, with its timeline.
    page.locator(".hs-diff-left .hs-diff-leave-trace").click()
    page.wait_for_function("() => !new URLSearchParams(location.search).get('leftTraceId')")
    assert page.locator(".hs-diff-left .hs-diff-query").input_value() == '{service_name="shop"}'
    page.locator(".hs-diff-left .hs-timeline-canvas").wait_for()
    wait_for_rows(page, MAIN + "warm_cache")  # the baseline is the whole service now


# --- empty sides and bad ids ----------------------------------------------------------------


def test_an_empty_side_is_named_and_both_forms_stay(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(
        data.url(
            leftTraceId=data.fast["trace"],
            leftSpanId=data.fast["span"],
            rightTraceId=data.slow["trace"],
            rightSpanId=data.slow["noop"],
        )
    )
    # An error box instead (a failed Diff) ends the wait too, and says what failed.
    shown = page.locator(
        ".hs-diff-profile .hs-message.hs-empty, .hs-diff-profile .hs-message.hs-error"
    )
    shown.wait_for()
    msg = page.locator(".hs-diff-profile .hs-message.hs-empty")
    assert msg.count() == 1, shown.inner_text()
    text = msg.inner_text()
    assert "The comparison (span noop (" in text, text
    assert data.slow["trace"][:8] in text and "baseline" not in text.split(".")[0], text
    assert "no CPU time samples" in text, text
    # The empty side says so itself; the other does not.
    assert "No CPU time samples" in page.locator(".hs-diff-right .hs-diff-side-note").inner_text()
    assert page.locator(".hs-diff-left .hs-diff-side-note").inner_text() == ""
    for side in ("left", "right"):
        assert page.locator(f".hs-diff-{side} .hs-diff-query").is_visible()
        assert page.locator(f".hs-diff-{side} .hs-range-from").is_visible()

    # A selector side with nothing: the baseline is named, with its selector and range.
    page.goto(
        data.url(
            leftQuery='{service_name="nosuch"}',
            rightTraceId=data.slow["trace"],
        )
    )
    msg.wait_for()
    text = msg.inner_text()
    expected = 'The baseline ({service_name="nosuch"}) has no CPU time samples in the last 1 hour'
    assert expected in text, text
    assert page.locator(".hs-diff-left .hs-diff-query").input_value() == '{service_name="nosuch"}'
    assert query_of(page)["leftQuery"] == ['{service_name="nosuch"}']


def test_bad_trace_and_span_ids_name_their_side(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.url(leftTraceId="xyz", rightTraceId=data.slow["trace"]))
    error = page.locator(".hs-diff-profile .hs-message.hs-error")
    error.wait_for()
    assert "The baseline cannot be compared" in error.inner_text()
    assert '"xyz" is not a trace id' in page.locator(".hs-diff-left").inner_text()
    # A span the trace does not hold.
    page.goto(
        data.url(
            leftTraceId=data.fast["trace"],
            leftSpanId=data.fast["span"],
            rightTraceId=data.slow["trace"],
            rightSpanId="00000000000000ff",
        )
    )
    error.wait_for()
    text = error.inner_text()
    assert "The comparison cannot be compared" in text or "comparison" in text, text
    assert "comparison" in text, text
    assert "has no span 00000000000000ff" in page.locator(".hs-diff-right").inner_text()
    # The way out of the wrong span stays.
    assert page.locator(".hs-diff-right .hs-diff-leave-trace").is_visible()


def test_trace_id_errors_show_once_on_their_side(page, data) -> None:  # type: ignore[no-untyped-def]
    # Review finding 4: a wrong id and a trace this server does not know.
    page.goto(data.url(leftTraceId="abc", rightTraceId="0123456789abcdef0123456789abcdef"))
    page.locator(".hs-diff-profile .hs-message").wait_for()
    page.locator(".hs-diff-right .hs-diff-side-note .hs-message").wait_for()
    left = page.locator(".hs-diff-left")
    right = page.locator(".hs-diff-right")
    whole = page.locator("#app").inner_text()
    # Each side names what is wrong with it, once in the page, on that side.
    assert whole.count("is not a trace id") == 1, whole
    assert '"abc" is not a trace id' in left.inner_text()
    assert "trace 01234567… was not found on this server" in right.inner_text().lower()
    assert whole.lower().count("was not found") == 1, whole
    text = page.locator(".hs-diff-profile .hs-message").inner_text()
    assert "baseline" in text and "comparison" in text, text
    # The profile type can still be picked.
    assert page.locator(".hs-diff-toolbar select.hs-profile-type").is_visible()
    # No selector form nor "Last 1 hour" that have nothing to do with a wrong id.
    for side in (left, right):
        assert not side.locator(".hs-diff-query").is_visible()
        assert not side.locator(".hs-range").is_visible()
        assert side.locator(".hs-diff-leave-trace").is_visible()
    screenshot(page, "diff-bad-trace-ids")

    # A trace side that compares: no "{}" in its field, and its range is said to be the trace's.
    page.goto(data.spans_url(data.fast, data.slow, span=""))
    wait_for_rows(page, MAIN + "price_cart")
    assert left.locator(".hs-diff-query").input_value() == ""
    assert "The trace's time range" in left.inner_text()
    assert query_of(page)["leftQuery"] == ["{}"]


# --- the flame graph's state in the address ----------------------------------------------


def test_sort_and_zoom_survive_a_reload(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.spans_url(data.fast, data.slow))
    wait_for_rows(page, MAIN + "price_cart")
    # A diff lists the regressions first by default, as its Change column's tooltip says.
    header = page.locator(".hs-diff-profile .hs-toptable th.hs-toptable-change")
    assert header.get_attribute("aria-sort") == "descending"
    assert "default order of a diff" in (header.get_attribute("title") or "")
    assert panel_rows(page)[0] == MAIN + "price_cart"
    sort_by_change(page)
    assert query_of(page)["sort"] == ["change:desc"]
    page.reload()
    wait_for_rows(page, MAIN + "price_cart")
    header = page.locator(".hs-diff-profile .hs-toptable th.hs-toptable-change")
    assert header.get_attribute("aria-sort") == "descending"
    assert panel_rows(page)[0] == MAIN + "price_cart"

    # Zoom on price_cart: after a reload it still fills the flame graph.
    frame = page.evaluate(
        """() => {
            const host = [...document.querySelectorAll('*')].find((e) => e.flamegraph);
            const f = host.flamegraph.frames().find((x) => x.name === '__main__.price_cart');
            const r = host.flamegraph.canvas.getBoundingClientRect();
            return {x: r.left + f.x + Math.min(f.width / 2, 20), y: r.top + f.y + 4};
        }"""
    )
    page.mouse.click(frame["x"], frame["y"])
    page.wait_for_function("() => new URLSearchParams(location.search).get('zoom')")
    page.reload()
    page.wait_for_function(
        """() => {
            const host = [...document.querySelectorAll('*')].find((e) => e.flamegraph);
            if (!host) return false;
            const width = host.flamegraph.canvas.clientWidth;
            const f = host.flamegraph.frames().find((x) => x.name === '__main__.price_cart');
            return f && f.width > width * 0.95;
        }"""
    )


# --- layout ------------------------------------------------------------------------------

# Where each header cell and the first row's cells sit, and whether any cell's content is cut.
TABLE_GEOMETRY = """
(scope) => {
  const box = document.querySelector(`${scope} .hs-panel-table`);
  const table = box.querySelector('table');
  const rect = (e) => {
    const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom};
  };
  const heads = {};
  for (const th of table.querySelectorAll('thead th')) {
    const button = th.querySelector('button');
    heads[th.className] = {...rect(th), label: button ? rect(button) : null};
  }
  const row = table.querySelector('tbody tr[data-name]');
  const cells = {};
  for (const td of row.cells) cells[td.className] = rect(td);
  const cut = [...table.querySelectorAll('tbody tr[data-name] td')]
    .filter((td) => td.scrollWidth > td.clientWidth + 1)
    .map((td) => td.className + ': ' + td.textContent);
  const [scrollWidth, clientWidth] = [box.scrollWidth, box.clientWidth];
  return {box: rect(box), scrollWidth, clientWidth, heads, cells, cut};
}
"""


def test_diff_table_header_labels_sit_on_the_column_row(page, data) -> None:  # type: ignore[no-untyped-def]
    # Review finding 14: "Change" and "Function" span both header rows, their labels level
    # with Self and Total, and Change sits over its own column.
    page.goto(data.spans_url(data.fast, data.slow))
    wait_for_rows(page, MAIN + "price_cart")
    geo = page.evaluate(TABLE_GEOMETRY, ".hs-diff-profile")
    heads = geo["heads"]
    change = next(v for k, v in heads.items() if "hs-toptable-change" in k)
    name = next(v for k, v in heads.items() if "hs-toptable-name" in k)
    total = next(v for k, v in heads.items() if "hs-toptable-totalRight" in k)
    group = next(v for k, v in heads.items() if "hs-toptable-group" in k)
    for cell in (change, name):
        assert abs(cell["top"] - group["top"]) < 1.5, heads
        assert abs(cell["bottom"] - total["bottom"]) < 1.5, heads
        assert abs(cell["label"]["bottom"] - total["label"]["bottom"]) < 1.5, heads
    column = next(v for k, v in geo["cells"].items() if "hs-toptable-change" in k)
    assert abs(change["left"] - column["left"]) < 1.5
    assert abs(change["right"] - column["right"]) < 1.5


def test_diff_table_at_390_shows_the_change_without_scrolling(page, data) -> None:  # type: ignore[no-untyped-def]
    # Review finding 8: on a phone the self columns go, the shares and the Change stay in view.
    with sized_page(page, 390):
        page.goto(data.spans_url(data.fast, data.slow))
        wait_for_rows(page, MAIN + "price_cart")
        geo = page.evaluate(TABLE_GEOMETRY, ".hs-diff-profile")
        screenshot(page, "diff-table-390")
        assert geo["scrollWidth"] <= geo["clientWidth"], geo
        assert not geo["cut"], geo["cut"]
        kept = {k.split()[0] for k in geo["cells"]}
        assert kept == {
            "hs-toptable-name",
            "hs-toptable-totalLeft",
            "hs-toptable-totalRight",
            "hs-toptable-change",
        }, kept
        for cell in geo["cells"].values():
            assert cell["right"] <= geo["box"]["right"] + 0.5, geo
        name = next(v for k, v in geo["cells"].items() if "hs-toptable-name" in k)
        assert name["right"] - name["left"] >= 100, geo
        # Names are whole, wrapped onto more lines, not cut to their last dozen characters.
        whole = page.eval_on_selector_all(
            ".hs-diff-profile .hs-toptable tbody span.hs-toptable-name",
            "spans => spans.map((s) => [s.textContent, s.scrollWidth <= s.clientWidth + 1])",
        )
        assert whole and all(ok for _, ok in whole), whole
        assert any(t == MAIN + "price_cart" for t, _ in whole), whole
        first = page.locator(".hs-diff-profile .hs-toptable tbody tr[data-name]").first
        assert "%" in first.locator("td.hs-toptable-totalLeft").inner_text()
        # The side names stand over their columns, each within its own.
        groups = page.locator(".hs-diff-profile th.hs-toptable-group").evaluate_all(
            "ths => ths.map((th) => th.scrollWidth <= th.clientWidth)"
        )
        assert groups == [True, True], groups
    # A wide screen keeps all five number columns.
    with sized_page(page, 1440):
        page.goto(data.spans_url(data.fast, data.slow))
        wait_for_rows(page, MAIN + "price_cart")
        assert page.locator(".hs-diff-profile thead th.hs-toptable-selfLeft").is_visible()
        assert page.locator(".hs-diff-profile thead th.hs-toptable-selfRight").is_visible()


@pytest.mark.parametrize("width", [390, 1024, 1440])
def test_diff_page_fits_its_width(page, data, width: int) -> None:  # type: ignore[no-untyped-def]
    urls = {
        "spans": data.spans_url(data.fast, data.slow),
        "selectors": data.url(
            leftQuery='{service_name="shop"}',
            rightQuery='{service_name="shop", a_rather_long_label_name="with a long value"}',
        ),
    }
    for dark in (False, True):
        with sized_page(page, width, dark):
            for name, url in urls.items():
                page.goto(url)
                done = ".hs-diff-profile .hs-panel-title:not(:empty), .hs-diff-profile .hs-message"
                page.locator(done).first.wait_for()
                if name == "spans":
                    wait_for_rows(page, MAIN + "price_cart")
                left = page.locator(".hs-diff-left").bounding_box()
                right = page.locator(".hs-diff-right").bounding_box()
                shot = artifact_path(f"diff-{name}-{width}{'-dark' if dark else ''}.png")
                page.screenshot(path=str(shot), full_page=True)
                sizes = page.evaluate(
                    "() => [document.getElementById('app').scrollWidth, window.innerWidth]"
                )
                assert fits(page), f"{name} at {width}px: page is {sizes[0]} px wide"
                assert right["x"] + right["width"] <= width, (name, width, right)
                if width >= 1024:
                    assert abs(left["y"] - right["y"]) < 1, "sides should stand side by side"
                else:
                    assert right["y"] >= left["y"] + left["height"], "sides should stack"


def test_long_selector_does_not_widen_the_page(page, data) -> None:  # type: ignore[no-untyped-def]
    long = '{service_name="shop", ' + ", ".join(f'label_{i}="value-{i}"' for i in range(12)) + "}"
    with sized_page(page, 1024):
        page.goto(data.url(leftQuery=long, rightQuery=long))
        page.locator(".hs-diff-profile .hs-message").first.wait_for()
        assert fits(page)
