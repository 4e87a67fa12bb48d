"""The flame graph panel beyond drawing, in a real Chromium on data the real agent pushed: the
diff table's two sides, labels that keep the function name, keyboard and wheel navigation,
the right-click menu (with the source location read from the server's pprof), the sandwich
view, the URL-state callbacks, the loading skeleton, the dark theme and narrow screens.

Two runs of one program ("invoice") push CPU profiles: commit "abc", where
``render_line_items_with_totals`` is cheap, and commit "def", where it burns ten times as much.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Iterator, List
from urllib.parse import quote

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.conftest import RunningServer, running_server
from tests.helpers import CPU, run_programs, traced_program
from tests.ui.conftest import screenshot
from tests.ui.test_flamegraph_ui import FRAMES, frame

PROGRAM = traced_program(
    "invoice",
    """
    class InvoiceRenderer:
        def render_header_and_customer_block(self):
            burn(0.1)

        def render_line_items_with_totals(self):
            burn(float(sys.argv[3]))

    def handle_invoice_request():
        r = InvoiceRenderer()
        r.render_header_and_customer_block()
        r.render_line_items_with_totals()

    def warm_cache():
        burn(0.2)

    warm_cache()
    with tracer.start_as_current_span("render-invoices"):
        for _ in range(4):
            handle_invoice_request()
    """,
    tags='{"commit": sys.argv[2]}',
)

MAIN = "__main__."
LONG = MAIN + "InvoiceRenderer.render_line_items_with_totals"
HEADER = MAIN + "InvoiceRenderer.render_header_and_customer_block"
HANDLER = MAIN + "handle_invoice_request"
LEFT = '{service_name="invoice", commit="abc"}'
RIGHT = '{service_name="invoice", commit="def"}'


class Data:
    def __init__(self, server: RunningServer, program: Path) -> None:
        self.server = server
        self.program = program

    def def_line(self, text: str) -> int:
        lines = self.program.read_text().splitlines()
        return next(i for i, line in enumerate(lines, 1) if line.strip().startswith(f"def {text}("))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    with running_server(tmp_path_factory.mktemp("ui-fgnav") / "data") as srv:
        directory = tmp_path_factory.mktemp("prog")
        run_programs(PROGRAM, directory, [srv.url, "abc", "0.03"], [srv.url, "def", "0.3"])
        yield Data(srv, directory / "program.py")


# Mounts a ProfilePanel on the server's own page (its CSP in force) with what the page fetches
# from the real API; the URL-state callbacks record into window.calls.
MOUNT = """
async ({request, options, pprof, width, diff}) => {
  document.body.replaceChildren();
  const div = document.createElement("div");
  div.id = "fg-test";
  if (width) div.style.width = width + "px";
  document.body.append(div);
  const { ProfilePanel } = await import("/static/js/panel.js");
  const api = await import("/static/js/api.js");
  window.calls = { zoom: [], sort: [], sandwich: [], search: [] };
  options.onZoom = (v) => window.calls.zoom.push(v);
  options.onSort = (v) => window.calls.sort.push(v);
  options.onSandwich = (v) => window.calls.sandwich.push(v);
  options.onSearch = (v) => window.calls.search.push(v);
  if (pprof) {
    options.exports = () => [{
      key: "pprof", label: "pprof", filename: "profile.pb",
      fetch: () => api.querierBinary("SelectMergeProfile", api.selectMergeProfileRequest(pprof)),
    }];
  }
  const panel = new ProfilePanel(div, options);
  window.panel = panel;
  const answer = await api.querier(diff ? "Diff" : "SelectMergeStacktraces", request);
  panel.setData(answer.flamegraph, { unit: "nanoseconds", title: "test" });
  window.answer = answer.flamegraph;
  return panel.tree.nodeCount;
}
"""


def _request(selector: str) -> Dict[str, object]:
    now_ms = int(__import__("time").time() * 1000)
    return {
        "profileTypeID": CPU,
        "labelSelector": selector,
        "start": now_ms - 3_600_000,
        "end": now_ms + 60_000,
    }


def mount(
    page,
    data: Data,
    selector: str = RIGHT,
    *,
    pprof: bool = False,
    width: int = 0,
    **options: object,
) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{data.server.url}/profiles")
    request = _request(selector)
    nodes = page.evaluate(
        MOUNT,
        {
            "request": request,
            "options": options,
            "pprof": request if pprof else None,
            "width": width,
            "diff": False,
        },
    )
    assert nodes > 3
    # Two frames: the panel's width-dependent layout (and any scroll bar) has settled.
    page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")


def frames(page, selector: str = "#fg-test .hs-panel-graph") -> dict:  # type: ignore[no-untyped-def]
    return page.evaluate(FRAMES, selector)


def point(view: dict, f: dict) -> List[float]:
    return [view["left"] + f["x"] + min(f["width"] / 2, 30), view["top"] + f["y"] + f["height"] / 2]


def right_click(page, name: str) -> None:  # type: ignore[no-untyped-def]
    """Right-clicks the widest frame of `name`, where it is drawn now."""
    view = frames(page)
    page.mouse.click(*point(view, frame(view, name)), button="right")


def open_menu(page, name: str):  # type: ignore[no-untyped-def]
    """Right-clicks `name` until its menu opens: under the suite's load the graph may still
    be laying out as the frames are read, and the click then lands beside the frame (no
    menu) or on another one (another frame's menu, closed again)."""
    menu = page.locator(".hs-frame-menu")
    for _ in range(3):
        right_click(page, name)
        try:
            menu.wait_for(timeout=3000)
        except PlaywrightTimeout:
            continue
        if menu.locator(".hs-menu-title").inner_text() == name:
            return menu
        page.keyboard.press("Escape")
        menu.wait_for(state="detached")
    right_click(page, name)
    menu.wait_for()
    return menu


def calls(page) -> Dict[str, List[str]]:  # type: ignore[no-untyped-def]
    return page.evaluate("() => window.calls")


def tooltip_title(page) -> str:  # type: ignore[no-untyped-def]
    tip = page.locator("#fg-test .hs-panel-graph .hs-tooltip")
    tip.wait_for(state="visible")
    return tip.locator(".hs-tooltip-title").inner_text()


def end_visible(page, locator) -> bool:  # type: ignore[no-untyped-def]
    """Whether the last character of a (possibly cut) name is inside its cell's visible box."""
    return locator.evaluate(
        """(cell) => {
            const text = cell.querySelector('.hs-toptable-name-text') || cell;
            const node = text.firstChild;
            const range = document.createRange();
            range.setStart(node, node.length - 1);
            range.setEnd(node, node.length);
            const last = range.getBoundingClientRect();
            const box = (cell.querySelector('.hs-toptable-name') || cell).getBoundingClientRect();
            return last.width > 0 && last.right <= box.right + 0.5 && last.left >= box.left - 0.5;
        }"""
    )


def fits(page) -> bool:  # type: ignore[no-untyped-def]
    return page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")


# --- bug 4: the diff table ------------------------------------------------------------------


def _open_diff(page, data: Data) -> None:  # type: ignore[no-untyped-def]
    page.goto(
        f"{data.server.url}/diff?leftQuery={quote(LEFT)}&rightQuery={quote(RIGHT)}&from=now-1h"
    )
    page.wait_for_selector(f'.hs-toptable tbody tr[data-name="{LONG}"]')


def _cell(page, name: str, column: str) -> str:  # type: ignore[no-untyped-def]
    return page.locator(
        f'.hs-toptable tbody tr[data-name="{name}"] td.hs-toptable-{column}'
    ).inner_text()


def _percent(text: str) -> float:
    return float(text.split()[-1].rstrip("%"))


def test_diff_table_has_baseline_comparison_and_change_side_by_side(page, data) -> None:  # type: ignore[no-untyped-def]
    _open_diff(page, data)
    head = page.locator(".hs-toptable thead")
    head_text = " ".join(head.inner_text().split())
    # Each side labelled over its own Self and Total, then the change.
    assert "Baseline" in head_text and "Comparison" in head_text and "Change" in head_text
    groups = head.locator("th.hs-toptable-group")
    assert groups.count() == 2
    sorts = head.locator(".hs-sort")
    labels = {
        sorts.nth(i).get_attribute("aria-label") or sorts.nth(i).inner_text().strip("▲▼ ")
        for i in range(sorts.count())
    }
    assert labels == {
        "Function",
        "Baseline self",
        "Baseline total",
        "Comparison self",
        "Comparison total",
        "Change",
    }
    columns = (
        page.locator(".hs-toptable tbody tr[data-name]")
        .first.locator("td")
        .evaluate_all("(cells) => cells.map((c) => c.className)")
    )
    assert columns == [
        f"hs-toptable-{k}"
        for k in ("name", "selfLeft", "totalLeft", "selfRight", "totalRight", "change")
    ]
    # The side headers sit over their columns.
    base = groups.nth(0).bounding_box()
    base_self = head.locator("th.hs-toptable-selfLeft").bounding_box()
    base_total = head.locator("th.hs-toptable-totalLeft").bounding_box()
    assert (
        base["x"] <= base_self["x"] + 1
        and base_total["x"] + base_total["width"] <= base["x"] + base["width"] + 1
    )

    # The heavy function: a small share of the baseline, a large one of the comparison.
    left_total, right_total = (
        _percent(_cell(page, LONG, "totalLeft")),
        _percent(_cell(page, LONG, "totalRight")),
    )
    assert left_total < right_total / 2, (left_total, right_total)
    assert _cell(page, LONG, "change").startswith("+")
    # The values are each side's own, as the flame graph's tooltip says.
    fg = page.evaluate(
        """(name) => {
            const host = [...document.querySelectorAll('*')].find((e) => e.flamegraph);
            const t = host.flamegraph.tree;
            let l = 0, r = 0;
            for (let i = 0; i < t.nodeCount; i++) {
              if (t.names[t.name[i]] === name) { l += t.totalLeft[i]; r += t.totalRight[i]; }
            }
            return { l: 100 * l / t.leftTotal, r: 100 * r / t.rightTotal };
        }""",
        LONG,
    )
    assert abs(fg["l"] - left_total) < max(0.11, left_total * 0.011)
    assert abs(fg["r"] - right_total) < max(0.11, right_total * 0.011)

    # The whole name is readable (not "__main__.render…"): its end is on screen, the full
    # name in the title.
    cell = page.locator(f'.hs-toptable tbody tr[data-name="{LONG}"] td.hs-toptable-name')
    assert cell.locator("[title]").first.get_attribute("title") == LONG
    assert end_visible(page, cell)
    assert fits(page)
    screenshot(page, "diff-table-1400")

    # Sorting by the baseline's total orders by that side.
    head.locator('.hs-sort[aria-label="Baseline total"]').click()
    head.locator('.hs-sort[aria-label="Baseline total"]').click()  # ascending, then descending
    rows = page.locator(".hs-toptable tbody tr[data-name]")
    values = [
        _percent(rows.nth(i).locator("td.hs-toptable-totalLeft").inner_text())
        for i in range(min(rows.count(), 6))
    ]
    assert values == sorted(values, reverse=True) or values == sorted(values), values


@pytest.mark.parametrize("width", [390, 1024])
def test_diff_table_at_narrow_widths_scrolls_inside_itself(page, data, width: int) -> None:  # type: ignore[no-untyped-def]
    page.set_viewport_size({"width": width, "height": 844})
    _open_diff(page, data)
    cell = page.locator(f'.hs-toptable tbody tr[data-name="{LONG}"] td.hs-toptable-name')
    assert cell.locator("[title]").first.get_attribute("title") == LONG
    assert end_visible(page, cell)
    table = page.locator(".hs-panel-table")
    box = table.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5
    screenshot(page, f"diff-table-{width}")


# --- labels ---------------------------------------------------------------------------------


def test_labels_and_table_names_keep_the_function_name(page, data) -> None:  # type: ignore[no-untyped-def]
    mount(page, data, width=420)
    view = frames(page)
    cut = [f for f in view["frames"] if f["label"] and f["label"] != f["name"]]
    assert cut, "nothing was cut at 420 px"
    for f in cut:
        assert f["label"].startswith("…") and f["name"].endswith(f["label"][1:]), f
    long = frame(view, LONG)
    if long["label"]:
        assert long["label"].endswith("render_line_items_with_totals") or long["label"] == LONG
    # The table's names, cut as well, show their end.
    cell = page.locator(f'#fg-test tr[data-name="{LONG}"] td.hs-toptable-name')
    cell.wait_for()
    assert end_visible(page, cell)


# --- keyboard and wheel ---------------------------------------------------------------------


def test_keyboard_moves_between_frames_and_zooms(page, data) -> None:  # type: ignore[no-untyped-def]
    mount(page, data)
    canvas = page.locator("#fg-test .hs-panel-graph canvas")
    page.keyboard.press("Tab")  # into the page
    canvas.focus()
    page.keyboard.press("ArrowDown")
    assert tooltip_title(page) == "total"
    view = frames(page)
    root_children = [f for f in view["frames"] if f["depth"] == 1]
    widest = max(root_children, key=lambda f: f["width"])
    page.keyboard.press("ArrowDown")
    assert tooltip_title(page) == widest["name"]
    # Down to the handler, then along its row and back.
    path = []
    for _ in range(12):
        title = tooltip_title(page)
        path.append(title)
        if title == HANDLER:
            break
        page.keyboard.press("ArrowDown")
    assert HANDLER in path, path
    page.keyboard.press("ArrowDown")
    child = tooltip_title(page)
    assert child in (LONG, HEADER)
    # Left/right: the neighbour on the same row.
    page.keyboard.press("ArrowRight" if child == HEADER else "ArrowLeft")
    other = tooltip_title(page)
    assert other in (LONG, HEADER) and other != child
    page.keyboard.press("ArrowUp")
    assert tooltip_title(page) == HANDLER
    # A visible focus ring: the frame's edge is drawn in the focus colour.
    focus_pixel = page.evaluate(
        """(name) => {
            const g = document.querySelector('#fg-test .hs-panel-graph').flamegraph;
            const f = g.frames().filter((x) => x.name === name)
              .sort((a, b) => b.width - a.width)[0];
            const dpr = g.canvas.width / g.canvas.getBoundingClientRect().width;
            const x = Math.round((f.x + f.width / 2) * dpr);
            const d = g.ctx.getImageData(x, Math.round((f.y + 1) * dpr), 1, 1).data;
            return [d[0], d[1], d[2]];
        }""",
        HANDLER,
    )
    assert max(focus_pixel) < 60, focus_pixel  # near-black ring on a pastel frame

    # The menu from the keyboard, on the focused frame; Escape gives the focus back.
    page.keyboard.press("Shift+F10")
    menu = page.locator(".hs-frame-menu")
    menu.wait_for()
    assert menu.locator(".hs-menu-title").inner_text() == HANDLER
    page.keyboard.press("Escape")
    assert menu.count() == 0
    assert page.evaluate("() => document.activeElement.tagName") == "CANVAS"

    page.keyboard.press("Enter")
    holder = page.locator("#fg-test .hs-panel-graph")
    assert holder.get_attribute("data-zoomed") == HANDLER
    zoom = calls(page)["zoom"]
    assert zoom[-1].split(";")[-1] == HANDLER and zoom[-1].count(";") >= 1, zoom
    view = frames(page)
    assert abs(frame(view, HANDLER)["width"] - view["width"]) < 1
    assert not page.locator("#fg-test .hs-reset").is_disabled()
    page.keyboard.press("Escape")
    assert holder.get_attribute("data-zoomed") != HANDLER
    while holder.get_attribute("data-zoomed"):
        page.keyboard.press("Escape")
    assert calls(page)["zoom"][-1] == ""

    # The zoom path comes back from the URL: a fresh panel with it zooms to the same frame.
    path = zoom[-1]
    mount(page, data, zoom=path)
    assert page.locator("#fg-test .hs-panel-graph").get_attribute("data-zoomed") == HANDLER
    assert calls(page)["zoom"] == []  # restoring is not a user's change
    # An unknown path shows the whole graph, without an error.
    mount(page, data, zoom="no;such;frame")
    assert page.locator("#fg-test .hs-panel-graph").get_attribute("data-zoomed") is None
    assert frames(page)["frames"]


def test_wheel_scrolls_the_page_and_ctrl_wheel_zooms(page, data) -> None:  # type: ignore[no-untyped-def]
    mount(page, data)
    page.evaluate("() => { document.body.style.paddingBottom = '2000px'; }")
    view = frames(page)
    before = frame(view, HEADER)["width"]
    page.mouse.move(*point(view, frame(view, HEADER)))
    page.mouse.wheel(0, 300)
    page.wait_for_function("() => window.scrollY > 0")
    assert abs(frame(frames(page), HEADER)["width"] - before) < 0.5  # plain wheel: no zoom
    page.evaluate("() => window.scrollTo(0, 0)")
    view = frames(page)
    page.mouse.move(*point(view, frame(view, HEADER)))
    page.keyboard.down("Control")
    page.mouse.wheel(0, -400)
    page.keyboard.up("Control")
    page.wait_for_function(
        "([name, w]) => document.querySelector('#fg-test .hs-panel-graph').flamegraph.frames()"
        ".some((f) => f.name === name && f.width > w * 1.5)",
        arg=[HEADER, before],
    )
    assert page.evaluate("() => window.scrollY") == 0
    reset = page.locator("#fg-test .hs-reset")
    assert not reset.is_disabled()
    reset.click()
    assert abs(frame(frames(page), HEADER)["width"] - before) < 0.5


# --- the menu -------------------------------------------------------------------------------


def test_right_click_menu_on_a_frame(page, data) -> None:  # type: ignore[no-untyped-def]
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=data.server.url)
    mount(page, data, pprof=True)
    menu = open_menu(page, LONG)
    assert menu.locator(".hs-menu-title").inner_text() == LONG
    items = [t.strip() for t in menu.locator("[role=menuitem]").all_inner_texts()]
    assert items[:4] == [
        "Focus on subtree",
        "Sandwich: callers and callees",
        "Copy function name",
        "Search for it",
    ]
    # Keyboard: focus starts on the first item, arrows move it.
    assert page.evaluate("() => document.activeElement.textContent") == "Focus on subtree"
    page.keyboard.press("ArrowDown")
    assert (
        page.evaluate("() => document.activeElement.textContent") == "Sandwich: callers and callees"
    )
    page.keyboard.press("ArrowUp")
    page.keyboard.press("ArrowUp")  # wraps to the last
    assert page.evaluate("() => document.activeElement.closest('.hs-frame-menu') !== null")

    # The source location, read from the server's pprof: the file and a line in the function.
    location = menu.locator(".hs-menu-location")
    location.wait_for()
    text = location.inner_text()
    path, line = text.rsplit(":", 1)
    assert Path(path).name == "program.py", text
    start = data.def_line("render_line_items_with_totals")
    assert start <= int(line) <= start + 2, (text, start)
    link = menu.locator("a.hs-menu-link")
    assert link.get_attribute("href") == f"vscode://file{path}:{line}"
    screenshot(page, "frame-menu")

    # Escape closes it; the graph has the focus back.
    page.keyboard.press("Escape")
    assert menu.count() == 0

    # Copy the name.
    right_click(page, LONG)
    menu.locator('[data-action="copy"]').click()
    page.wait_for_function("(n) => navigator.clipboard.readText().then((t) => t === n)", arg=LONG)

    # A click elsewhere closes it.
    right_click(page, LONG)
    menu.wait_for()
    page.mouse.click(5, 5)
    assert menu.count() == 0

    # Search for it fills the search box (and tells the view, for its URL).
    right_click(page, LONG)
    menu.locator('[data-action="search"]').click()
    assert page.locator("#fg-test .hs-search").input_value() == LONG
    page.wait_for_function("(n) => window.calls.search.includes(n)", arg=LONG)
    page.locator("#fg-test .hs-search").fill("")

    # Focus on subtree zooms to that frame.
    right_click(page, HANDLER)
    menu.locator('[data-action="zoom"]').click()
    assert page.locator("#fg-test .hs-panel-graph").get_attribute("data-zoomed") == HANDLER

    # The table's rows have the menu too; keyboard: Shift+F10 on a focused row.
    row = page.locator(f'#fg-test tr[data-name="{HEADER}"]')
    row.focus()
    page.keyboard.press("Shift+F10")
    menu.wait_for()
    assert menu.locator(".hs-menu-title").inner_text() == HEADER
    page.keyboard.press("Escape")


def test_menu_without_a_pprof_source_says_so(page, data) -> None:  # type: ignore[no-untyped-def]
    mount(page, data)
    menu = open_menu(page, LONG)
    assert "Source location not available here" in menu.inner_text()


# A second panel on the page, drawing the tree the first one shows.
OTHER_PANEL = """
async () => {
  const { ProfilePanel } = await import("/static/js/panel.js");
  const div = document.createElement("div");
  document.body.append(div);
  new ProfilePanel(div, {}).setData(window.answer, { unit: "nanoseconds", title: "other" });
}
"""


def test_new_data_closes_its_own_panels_menu_only(page, data) -> None:  # type: ignore[no-untyped-def]
    """A page with two panels (a comparison's sides, a view still loading beside one): the
    other one's answer arriving leaves the menu the user opened on this one open; this one's
    own new data closes it."""
    mount(page, data)
    menu = open_menu(page, LONG)
    page.evaluate(OTHER_PANEL)
    assert menu.locator(".hs-menu-title").inner_text(timeout=2000) == LONG
    page.evaluate('() => window.panel.setData(window.answer, { unit: "nanoseconds" })')
    menu.wait_for(state="detached", timeout=2000)


# --- sandwich -------------------------------------------------------------------------------


def test_sandwich_from_the_menu_and_from_the_url(page, data) -> None:  # type: ignore[no-untyped-def]
    mount(page, data)
    menu = open_menu(page, LONG)
    scrolled = page.evaluate("() => window.scrollY")
    menu.locator('[data-action="sandwich"]').click()
    assert calls(page)["sandwich"] == [LONG]
    sandwich = page.locator("#fg-test .hs-panel-sandwich")
    assert sandwich.is_visible()
    # The table's row is brought into view inside the table: the page does not move (it
    # used to scroll the function's row to the window's bottom, the graphs out of sight).
    assert page.evaluate("() => window.scrollY") == scrolled
    assert not page.locator("#fg-test .hs-panel-graph").is_visible()
    assert (
        page.locator('#fg-test .hs-view[data-view="sandwich"]').get_attribute("aria-pressed")
        == "true"
    )

    callers = frames(page, "#fg-test .hs-sandwich-callers")
    callees = frames(page, "#fg-test .hs-sandwich-callees")
    # Callers: the function at the bottom, its caller right above it, then theirs.
    fn = frame(callers, LONG)
    handler = frame(callers, HANDLER)
    assert abs(fn["width"] - callers["width"]) < 1 and fn["y"] > handler["y"]
    assert abs(handler["width"] - callers["width"]) < 1  # its only caller
    # The captions say what the graphs draw (review finding 10: "root at the bottom" was wrong).
    labels = page.locator("#fg-test .hs-sandwich-label").all_inner_texts()
    assert "the function at the bottom" in labels[0] and "root at the bottom" not in labels[0]
    assert "the function at the top" in labels[1], labels
    # Callees: the function at the top, burn under it.
    top = frame(callees, LONG)
    burn = frame(callees, MAIN + "burn")
    assert top["y"] < burn["y"] and top["depth"] == 0
    # The root's value is the function's total, as the table gives it.
    table_total = page.evaluate(
        "(n) => window.panel.table.rows.find((r) => r.name === n).total", LONG
    )
    assert fn["total"] == table_total == top["total"]
    screenshot(page, "sandwich")

    # In the sandwich view a table row picks the function.
    page.locator(f'#fg-test tr[data-name="{HANDLER}"] td.hs-toptable-name').click()
    assert calls(page)["sandwich"] == [LONG, HANDLER]
    assert frame(frames(page, "#fg-test .hs-sandwich-callees"), HANDLER)["depth"] == 0
    # Back to the flame graph: the view leaves the URL's sandwich.
    page.locator('#fg-test .hs-view[data-view="both"]').click()
    assert calls(page)["sandwich"][-1] == ""
    assert page.locator("#fg-test .hs-panel-graph").is_visible()

    # From the URL: the panel opens in the sandwich view on that function.
    mount(page, data, sandwich=LONG)
    assert page.locator("#fg-test .hs-panel-sandwich").is_visible()
    assert frame(frames(page, "#fg-test .hs-sandwich-callers"), HANDLER)
    assert calls(page)["sandwich"] == []
    # Unknown: says so, no error.
    mount(page, data, sandwich="no.such.function")
    assert "not in this profile" in page.locator("#fg-test .hs-panel-sandwich").inner_text()


# --- sort in the URL ------------------------------------------------------------------------


def test_sort_is_reported_and_restored(page, data) -> None:  # type: ignore[no-untyped-def]
    mount(page, data)
    page.locator('#fg-test .hs-sort[data-sort="name"]').click()
    assert calls(page)["sort"] == ["name:asc"]
    page.locator('#fg-test .hs-sort[data-sort="total"]').click()
    assert calls(page)["sort"] == ["name:asc", "total:desc"]

    mount(page, data, sort="name:desc")
    names = page.locator("#fg-test tbody tr[data-name]").evaluate_all(
        "(rows) => rows.map((r) => r.dataset.name)"
    )
    assert names == sorted(names, reverse=True)
    assert page.locator("#fg-test th.hs-toptable-name").get_attribute("aria-sort") == "descending"
    # A column this table lacks (a diff's) falls back to self, descending.
    mount(page, data, sort="change:asc")
    assert page.locator("#fg-test th.hs-toptable-self").get_attribute("aria-sort") == "descending"
    assert calls(page)["sort"] == []


# --- loading, dark theme, widths ------------------------------------------------------------


def test_loading_draws_a_skeleton(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{data.server.url}/profiles")
    page.evaluate(
        """async () => {
            document.body.replaceChildren();
            const div = document.createElement("div");
            div.id = "fg-test";
            document.body.append(div);
            const { ProfilePanel } = await import("/static/js/panel.js");
            window.panel = new ProfilePanel(div, {});
            window.panel.setLoading("Loading profiles…");
        }"""
    )
    skeleton = page.locator("#fg-test .hs-skeleton")
    assert skeleton.is_visible()
    assert "Loading profiles…" in skeleton.inner_text()
    bars = page.locator("#fg-test .hs-skeleton-bar")
    assert bars.count() >= 6
    boxes = [bars.nth(i).bounding_box() for i in range(bars.count())]
    assert all(b["height"] >= 10 and b["width"] > 30 for b in boxes)
    assert (
        page.evaluate(
            "() => getComputedStyle(document.querySelector('#fg-test .hs-skeleton-bar'))"
            ".animationName"
        )
        == "hs-skeleton-shine"
    )
    screenshot(page, "panel-skeleton")


def test_dark_theme(page, data) -> None:  # type: ignore[no-untyped-def]
    page.emulate_media(color_scheme="dark")
    mount(page, data)
    page.locator("#fg-test .hs-search").fill("render_line_items")
    view = frames(page)
    dimmed = [f for f in view["frames"] if f["dimmed"]]
    assert dimmed
    assert all(f["color"].replace(" ", "") == "rgb(58,62,68)" for f in dimmed), dimmed[0]["color"]
    head = page.locator("#fg-test .hs-toptable thead th").first
    bg = head.evaluate("(e) => getComputedStyle(e).backgroundColor")
    rgb = [int(v) for v in bg[bg.index("(") + 1 : bg.index(")")].split(",")[:3]]
    assert max(rgb) < 80, bg
    # The canvas reads its colours when it draws: the focus ring is light on dark.
    focus = page.evaluate(
        "() => getComputedStyle(document.querySelector('#fg-test .hs-flamegraph'))"
        ".getPropertyValue('--hs-fg-focus').trim()"
    )
    assert focus == "#ffffff"
    screenshot(page, "panel-dark")


@pytest.mark.parametrize("width", [390, 1024, 1440])
def test_panel_fits_the_width(page, data, width: int) -> None:  # type: ignore[no-untyped-def]
    page.set_viewport_size({"width": width, "height": 844})
    mount(page, data)
    assert fits(page)
    toolbar = page.locator("#fg-test .hs-panel-toolbar").bounding_box()
    assert toolbar["x"] + toolbar["width"] <= width + 0.5
    table = page.locator("#fg-test .hs-panel-table").bounding_box()
    graph = page.locator("#fg-test .hs-panel-graph").bounding_box()
    for box in (table, graph):
        assert box["x"] >= 0 and box["x"] + box["width"] <= width + 0.5
    if width < 1100:
        assert graph["y"] >= table["y"] + table["height"] - 1  # stacked
    screenshot(page, f"panel-{width}")
