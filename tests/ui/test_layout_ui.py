"""Every page fits the window from phone to desktop width, in a real Chromium, on real data.

At 390, 1024 and 1440 px: the page never scrolls sideways (tables and the header's nav scroll
inside themselves), the header's Settings button is on screen, and no control of the page
(button, field, picker, link) sits outside the window.  A screenshot of each is kept in
test-artifacts/ui/layout-<page>-<width>.png to be looked at.
"""

from __future__ import annotations

import re
from typing import Iterator, Tuple
from urllib.parse import quote

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import run_programs, traced_program
from tests.ui.conftest import screenshot

PROGRAM = traced_program(
    "checkout-service-with-a-long-name",
    """
    def handle_checkout_request_with_a_long_function_name():
        burn(0.3)

    def render_page():
        burn(0.1)

    with tracer.start_as_current_span("POST /api/v1/checkout/{cart_id}/confirm") as span:
        handle_checkout_request_with_a_long_function_name()
        with tracer.start_as_current_span("render"):
            render_page()
        time.sleep(0.1)
    print("TRACE " + format(span.get_span_context().trace_id, "032x"))
    """,
    tags='{"commit": "abc", "region": "eu-west-1"}',
)
SERVICE = "checkout-service-with-a-long-name"
WIDTHS = (390, 1024, 1440)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[RunningServer, str]]:
    with running_server(tmp_path_factory.mktemp("ui-layout") / "data") as srv:
        (out,) = run_programs(PROGRAM, tmp_path_factory.mktemp("prog"), [srv.url])
        trace_id = re.search(r"TRACE (\w+)", out).group(1)  # type: ignore[union-attr]
        yield srv, trace_id


def pages(trace_id: str) -> dict:
    query = quote(f'{{service_name="{SERVICE}"}}')
    return {
        "profiles": f"/profiles?query={query}&groupBy=commit",
        "diff": f"/diff?leftQuery={query}&rightQuery={query}",
        "endpoints": f"/endpoints?query={query}",
        "traces": "/traces",
        "hot-traces": (
            "/traces?function=__main__.handle_checkout_request_with_a_long_function_name"
            f"&query={query}"
        ),
        "trace": f"/traces/{trace_id}",
        "why": f"/traces/{trace_id}?why=1",
        "alerts": "/alerts",
        "settings": "/settings",
        "service-settings": f"/settings/{SERVICE}",
    }


# Controls that lie outside the window while no ancestor scrolls them into reach.
OFFSCREEN = """() => {
    const width = window.innerWidth;
    const scrollsInside = (node) => {
        for (let p = node.parentElement; p && p !== document.body; p = p.parentElement) {
            const style = getComputedStyle(p);
            if (['auto', 'scroll', 'hidden', 'clip'].includes(style.overflowX)
                && p.scrollWidth > p.clientWidth + 1) return true;
        }
        return false;
    };
    const out = [];
    for (const node of document.querySelectorAll(
            'header button, header a, #app button, #app select, #app input, #app a, #app canvas')) {
        const r = node.getBoundingClientRect();
        if (!r.width || !r.height || node.closest('[hidden]')) continue;
        // Inside a closed <details> menu, or otherwise not drawn.
        if (node.checkVisibility && !node.checkVisibility({ visibilityProperty: true })) continue;
        if (r.left >= -1 && r.right <= width + 1) continue;
        if (scrollsInside(node)) continue;
        out.push(`${node.tagName.toLowerCase()}.${node.className} ` +
            `"${(node.textContent || node.value || '').trim().slice(0, 30)}" ` +
            `[${Math.round(r.left)}, ${Math.round(r.right)}]`);
    }
    return out;
}"""


# What sticks out: the innermost elements past the right edge (for the failure message).
STICKING_OUT = """() => {
    const width = window.innerWidth;
    const out = [];
    for (const node of document.querySelectorAll('body *')) {
        const r = node.getBoundingClientRect();
        if (r.right <= width + 1 || !r.width) continue;
        const kids = [...node.children].some((c) => c.getBoundingClientRect().right > width + 1);
        if (kids) continue;
        out.push(`${node.tagName.toLowerCase()}.${String(node.className).slice(0, 40)} ` +
            `[${Math.round(r.left)}, ${Math.round(r.right)}]`);
    }
    return out.slice(0, 12);
}"""


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(
    "name",
    [
        "profiles",
        "endpoints",
        "diff",
        "traces",
        "hot-traces",
        "trace",
        "why",
        "alerts",
        "settings",
        "service-settings",
    ],
)
def test_page_fits_the_window(page, site, name: str, width: int) -> None:  # type: ignore[no-untyped-def]
    srv, trace_id = site
    # Sized before it loads: the page lays itself out at this width from the start.
    page.set_viewport_size({"width": width, "height": 844})
    page.goto(srv.url + pages(trace_id)[name])
    page.wait_for_load_state("networkidle")
    page.wait_for_function("() => !document.querySelector('.hs-loading')")
    page.wait_for_timeout(300)  # a resize observer's redraw
    screenshot(page, f"layout-{name}-{width}")
    sizes = page.evaluate(
        "() => ({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})"
    )
    assert sizes["scroll"] <= sizes["inner"] + 1, (
        f"{name} scrolls sideways at {width}: {sizes}",
        page.evaluate(STICKING_OUT),
    )
    button = page.locator("#hs-settings-button").bounding_box()
    assert button and button["x"] >= 0 and button["x"] + button["width"] <= width + 1, button
    assert page.evaluate(OFFSCREEN) == []


def test_header_fits_at_360_px(page, site) -> None:  # type: ignore[no-untyped-def]
    """The narrowest phone the pages are made for: every nav link reachable, Settings on screen."""
    srv, _ = site
    page.set_viewport_size({"width": 360, "height": 740})
    page.goto(srv.url + "/settings")
    assert page.locator('.hs-nav a[data-nav="endpoints"]').count() == 1
    page.wait_for_timeout(100)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= 361
    button = page.locator("#hs-settings-button").bounding_box()
    assert button and button["x"] + button["width"] <= 361, button
    # Every nav link is in sight as the page opens, whole, with nothing to scroll to (a
    # scrolling nav hid "Agent settings" with no sign that it was there).
    seen = page.evaluate(
        """() => [...document.querySelectorAll('.hs-nav a')].map((a) => {
            const r = a.getBoundingClientRect();
            return [a.textContent, r.left >= -1 && r.right <= window.innerWidth + 1
                    && r.top >= 0 && r.bottom <= window.innerHeight];
        })"""
    )
    assert len(seen) == 6 and all(ok for _, ok in seen), seen
    nav = page.evaluate(
        "() => { const n = document.querySelector('.hs-nav');"
        " return [n.scrollWidth, n.clientWidth]; }"
    )
    assert nav[0] <= nav[1] + 1, nav
    screenshot(page, "layout-header-360")


def luminance(css: str) -> float:
    r, g, b = (int(x) / 255 for x in re.findall(r"[\d.]+", css)[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.parametrize("scheme", ["dark", "light"])
@pytest.mark.parametrize("name", ["profiles", "settings", "traces", "hot-traces"])
def test_theme_follows_the_system_setting(page, site, scheme: str, name: str) -> None:  # type: ignore[no-untyped-def]
    srv, trace_id = site
    page.set_viewport_size({"width": 1024, "height": 800})
    page.emulate_media(color_scheme=scheme)
    page.goto(srv.url + pages(trace_id)[name])
    page.wait_for_load_state("networkidle")
    colours = page.evaluate(
        """() => {
            const of = (sel, prop) => {
                const node = document.querySelector(sel);
                return node ? getComputedStyle(node)[prop] : '';
            };
            return { body: of('body', 'backgroundColor'), text: of('body', 'color'),
                panel: of('.hs-timeline-section, .hs-settings-section', 'backgroundColor'),
                control: of('#app select, #app input', 'backgroundColor') };
        }"""
    )
    screenshot(page, f"theme-{name}-{scheme}")
    if scheme == "dark":
        assert luminance(colours["body"]) < 0.15, colours
        assert luminance(colours["text"]) > 0.7, colours
        for part in ("panel", "control"):
            if colours[part]:
                assert luminance(colours[part]) < 0.25, colours
    else:
        assert luminance(colours["body"]) > 0.9 and luminance(colours["text"]) < 0.2, colours


def test_a_page_that_does_not_exist_says_so_in_the_ui(page, site) -> None:  # type: ignore[no-untyped-def]
    srv, _ = site
    response = page.goto(srv.url + "/nosuchpage?x=1")
    assert response is not None and response.status == 404
    assert "No page at /nosuchpage" in page.locator("#app").inner_text()
    page.locator('.hs-nav a[data-nav="profiles"]').click()
    page.wait_for_url("**/profiles*")
    # Programs asking for a path that is not there still get a plain 404.
    with srv.client() as c:
        r = c.get("/nosuchpage")
        assert r.status_code == 404 and r.text == "Not Found"
        r = c.get("/api/nosuch", headers={"Accept": "text/html"})
        assert r.status_code == 404 and "<html" not in r.text
