"""The per-endpoint page in a real Chromium against a real server fed by a real traced program
(three endpoints of known cost, see tests/server/api/test_endpoints.py): the table ranks them with
their request counts, sorts on any column, and a row opens that endpoint's flame graph; the
URL reopens it all; an unknown service stays named; the page fits from 390 px up."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Iterator, List
from urllib.parse import quote

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import native_states, run_programs
from tests.server.api.test_endpoints import CONTENDED, PROGRAM, VERSIONED
from tests.ui.conftest import screenshot, sized

SELECTOR = '{service_name="shop"}'


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("endpoints-ui") / "data") as srv:
        run_programs(PROGRAM, tmp_path_factory.mktemp("prog"), [srv.url])
        # Spans and samples are committed a moment after the program ends.
        deadline = time.monotonic() + 20
        with srv.client() as c:
            while time.monotonic() < deadline:
                body = c.get("/api/v1/endpoints", params={"service": "shop"}).json()
                if sum(e["requests"] for e in body["endpoints"]) == 16:
                    break
                time.sleep(0.3)
        yield srv


def open_endpoints(page, srv: RunningServer, query: str) -> None:  # type: ignore[no-untyped-def]
    response = page.goto(f"{srv.url}/endpoints?{query}")
    assert response is not None and response.status == 200
    page.wait_for_selector(".hs-ep-row, .hs-endpoints .hs-message")


def table(page) -> List[dict]:  # type: ignore[no-untyped-def]
    return page.eval_on_selector_all(
        ".hs-ep-row",
        """rows => rows.map(r => ({
            name: r.dataset.name,
            requests: Number(r.querySelector('.hs-ep-requests').textContent),
            share: r.querySelector('.hs-ep-share-text').textContent,
            selected: r.classList.contains('hs-selected'),
        }))""",
    )


def duration_ms(text: str) -> float:
    """A duration as the table shows it ("950 µs", "182 ms", "1.2 s") in milliseconds."""
    m = re.fullmatch(r"([\d.]+) (ns|µs|ms|s)", text.strip())
    assert m, text
    return float(m.group(1)) * {"ns": 1e-6, "µs": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]


FRAMES = """() => {
    const box = document.querySelector('.hs-ep-profile');
    const fg = box && [box, ...box.querySelectorAll('*')].find(e => e.flamegraph);
    return fg ? fg.flamegraph.frames().map(f => f.name) : [];
}"""


def test_endpoints_table_ranks_sorts_and_opens_a_flame_graph(page, shop) -> None:  # type: ignore[no-untyped-def]
    open_endpoints(page, shop, f"query={quote(SELECTOR)}")
    rows = table(page)
    assert [r["name"] for r in rows] == ["GET /checkout", "GET /search", "GET /health"]
    assert [r["requests"] for r in rows] == [3, 5, 8]
    shares = [float(str(r["share"]).rstrip("%")) for r in rows]
    assert shares[0] > shares[1] > 0
    unattributed = page.inner_text(".hs-ep-unattributed")
    assert "not attributed" in unattributed and re.search(r"\d+(\.\d+)?%", unattributed)
    # The service picker names the service; its options come from the catalogue.
    assert page.input_value(".hs-ep-service") == "shop"
    screenshot(page, "endpoints-table")

    # Sorting by request count, most first; again, fewest first; the URL keeps it.
    page.click(".hs-ep-sort[data-column='requests']")
    assert [r["name"] for r in table(page)] == ["GET /health", "GET /search", "GET /checkout"]
    page.wait_for_function("() => location.search.includes('order=requests%3Adesc')")
    page.click(".hs-ep-sort[data-column='requests']")
    assert [r["requests"] for r in table(page)] == [3, 5, 8]
    assert page.get_attribute(".hs-ep-sort[data-column='requests']", "aria-sort") == "ascending"

    # A row opens its flame graph below the table: checkout's functions, not search's.
    page.click(".hs-ep-row[data-name='GET /checkout']")
    page.wait_for_function("() => location.search.includes('name=GET+%2Fcheckout')")
    page.wait_for_function(f"() => ({FRAMES})().includes('__main__.charge_card')")
    names = page.evaluate(FRAMES)
    assert "__main__.checkout" in names and "__main__.search_index" not in names
    assert "GET /checkout" in page.inner_text(".hs-ep-panel-title")
    assert [r["name"] for r in table(page) if r["selected"]] == ["GET /checkout"]
    screenshot(page, "endpoints-flamegraph")

    # The URL reopens the same table order and endpoint.
    query = page.evaluate("() => location.search.slice(1)")
    open_endpoints(page, shop, query)
    page.wait_for_function(f"() => ({FRAMES})().includes('__main__.charge_card')")
    assert [r["requests"] for r in table(page)] == [3, 5, 8]
    assert "name=" in page.url and "order=requests" in page.url


@native_states
def test_error_rate_latency_and_the_way_to_the_slowest_traces(page, shop) -> None:  # type: ignore[no-untyped-def]
    open_endpoints(page, shop, f"query={quote(SELECTOR)}")
    cells = {
        r["name"]: r
        for r in page.eval_on_selector_all(
            ".hs-ep-row",
            """rows => rows.map(r => ({
                name: r.dataset.name,
                errors: r.querySelector('.hs-ep-errors').textContent,
                failing: r.querySelector('.hs-ep-errors').classList.contains('hs-ep-failing'),
                p50: r.querySelector('.hs-ep-p50').textContent,
                p99: r.querySelector('.hs-ep-p99').textContent,
            }))""",
        )
    }
    # Two of five searches failed; the others never did.
    assert (cells["GET /search"]["errors"], cells["GET /search"]["failing"]) == ("40.0%", True)
    assert (cells["GET /checkout"]["errors"], cells["GET /checkout"]["failing"]) == ("0", False)
    # A checkout takes 0.18 s of CPU: its median is at least that (more on a busy machine).
    assert duration_ms(cells["GET /checkout"]["p50"]) >= 170, cells
    # Sorting by p99 puts the slowest endpoint first.  (Which one that is the machine decides:
    # a /health request that waited 200 ms for a core, or for the agent's turn at the GIL on a
    # crowded machine, is the slowest.)
    page.click(".hs-ep-sort[data-column='p99']")
    p99s = page.eval_on_selector_all(
        ".hs-ep-row", "rows => rows.map(r => r.querySelector('.hs-ep-p99').textContent)"
    )
    shown = [duration_ms(text) for text in p99s]
    assert len(shown) == 3 and shown == sorted(shown, reverse=True), p99s
    assert page.get_attribute(".hs-ep-sort[data-column='p99']", "aria-sort") == "descending"

    # One click to the endpoint's slowest traces: the trace search, longest first.
    page.click(".hs-ep-row[data-name='GET /search'] .hs-ep-traces")
    page.wait_for_url(re.compile(r"/traces\?service=shop&name=GET"))
    page.wait_for_function("() => document.querySelectorAll('.hs-trace-result').length === 5")
    names = page.eval_on_selector_all(".hs-trace-link", "links => links.map(a => a.textContent)")
    assert all("GET /search" in n for n in names), names
    assert page.input_value(".hs-trace-sort") == "duration"


def test_endpoints_split_by_version(page, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    with running_server(tmp_path / "data") as srv:
        run_programs(VERSIONED, tmp_path, [srv.url, "v1"], [srv.url, "v2"])
        deadline = time.monotonic() + 20
        with srv.client() as c:
            while time.monotonic() < deadline:
                body = c.get("/api/v1/endpoints", params={"service": "pricing"}).json()
                if sum(e["requests"] for e in body["endpoints"]) == 8:
                    break
                time.sleep(0.3)
        open_endpoints(page, srv, "query=" + quote('{service_name="pricing"}'))
        page.locator(".hs-ep-by option[value=version]").wait_for(state="attached")
        page.select_option(".hs-ep-by", "version")
        page.wait_for_url(re.compile(r"by=version"))
        page.wait_for_selector(".hs-ep-group")
        rows = page.eval_on_selector_all(
            ".hs-ep-row",
            """rows => rows.map(r => [r.querySelector('.hs-ep-group').textContent,
                Number(r.querySelector('.hs-ep-requests').textContent),
                r.querySelector('.hs-ep-errors').textContent])""",
        )
        assert sorted(rows) == [["v1", 4, "0"], ["v2", 4, "25.0%"]], rows
        assert page.inner_text("th.hs-ep-sort[data-column=group]").startswith("version")
        screenshot(page, "endpoints-split")
        # The URL reopens the split.
        page.reload()
        page.wait_for_selector(".hs-ep-group")
        assert page.input_value(".hs-ep-by") == "version"


def test_requests_that_waited_for_the_gil_show_it(page, shop, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run_programs(CONTENDED, tmp_path, [shop.url])
    query = "query=" + quote('{service_name="contended"}')
    deadline = time.monotonic() + 20
    while True:
        open_endpoints(page, shop, query)
        cells = page.eval_on_selector_all(
            ".hs-ep-row",
            "rows => Object.fromEntries(rows.map(r => [r.dataset.name, "
            "r.querySelector('.hs-ep-gil-wait')?.textContent || '']))",
        )
        if cells.get("GET /report", "").endswith("ms") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # The report waited about half its 0.3 s while the other thread spun: tens of ms or more.
    assert re.fullmatch(r"\d{2,3}(\.\d+)? ms", cells["GET /report"]), cells
    header = page.locator(".hs-ep-sort[data-column='gilWaitPerRequest']")
    assert header.inner_text().startswith("GIL wait")
    header.click()
    assert [r["name"] for r in table(page)][0] == "GET /report"


def test_an_unknown_service_stays_named(page, shop) -> None:  # type: ignore[no-untyped-def]
    query = "query=" + quote('{service_name="nosuch"}')
    open_endpoints(page, shop, query)
    text = page.inner_text(".hs-endpoints .hs-message")
    assert 'No endpoints for service "nosuch"' in text
    assert "nosuch" in page.url and page.input_value(".hs-ep-service") == "nosuch"
    # The other services are offered.
    assert page.locator(".hs-ep-service option[value='shop']").count() == 1


@pytest.mark.parametrize("width", [390, 1024, 1440])
def test_endpoints_page_fits(page, shop, width: int) -> None:  # type: ignore[no-untyped-def]
    for scheme in ("light", "dark"):
        with sized(page, width, dark=scheme == "dark"):
            open_endpoints(page, shop, f"query={quote(SELECTOR)}&name=GET+%2Fcheckout")
            page.wait_for_function(f"() => ({FRAMES})().includes('__main__.checkout')")
            box = page.evaluate(
                """() => {
                    const e = document.querySelector('.hs-endpoints');
                    const r = e.getBoundingClientRect();
                    const cell = document.querySelector('.hs-ep-row .hs-ep-total');
                    const wrap = document.querySelector('.hs-ep-table').parentElement;
                    return {right: r.right, scroll: e.scrollWidth, client: e.clientWidth,
                            inner: innerWidth, cell: cell.getBoundingClientRect().width,
                            wrapScroll: wrap.scrollWidth, wrapClient: wrap.clientWidth,
                            row: getComputedStyle(
                                document.querySelector('.hs-ep-row.hs-selected')).backgroundColor};
                }"""
            )
            assert box["right"] <= box["inner"] + 1, box
            assert box["scroll"] <= box["client"] + 1, box
            assert box["cell"] > 20, box
            rgb = [int(x) for x in re.findall(r"\d+", box["row"])[:3]]
            if scheme == "dark":
                assert sum(rgb) < 3 * 110, box
            else:
                assert sum(rgb) > 3 * 180, box
            screenshot(page, f"endpoints-{width}-{scheme}")


def test_zoom_and_sort_of_the_endpoint_profile_live_in_the_url(page, shop) -> None:  # type: ignore[no-untyped-def]
    path = "__main__.<module>;__main__.checkout;__main__.charge_card"
    query = f"query={quote(SELECTOR)}&name=GET+%2Fcheckout&zoom={quote(path)}&sort=name%3Aasc"
    open_endpoints(page, shop, query)
    graph = page.locator(".hs-ep-profile .hs-panel-graph")
    page.wait_for_function(
        "() => document.querySelector('.hs-ep-profile .hs-panel-graph')"
        "?.getAttribute('data-zoomed') === '__main__.charge_card'"
    )
    assert graph.get_attribute("data-zoomed") == "__main__.charge_card"
    assert page.get_attribute(".hs-ep-profile th.hs-toptable-name", "aria-sort") == "ascending"
    # A user's sort goes into the URL.
    page.click('.hs-ep-profile .hs-sort[data-sort="total"]')
    page.wait_for_function("() => location.search.includes('sort=total%3Adesc')")
