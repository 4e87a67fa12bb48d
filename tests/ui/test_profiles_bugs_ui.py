"""The Profiles page's bugs of issue 16, each as a user meets it, in a real Chromium.

Two services push CPU profiles with the real agent: "aardvark" (alphabetically first, no trace
worth a look) and "checkout", part of whose work runs inside a span, so its samples carry that
trace id.  A trace-filtered, unknown-service or empty-range view must never show aardvark's
data in checkout's place.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Dict, Iterator, List
from urllib.parse import parse_qs, quote, urlparse

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import run_programs, traced_program
from tests.ui.conftest import screenshot
from tests.ui.test_profiles_ui import PROGRAM, frames, wait_for_frame

# The profile explorer's "checkout" program, run once as commit "def" (the heavy price_cart).
CHECKOUT_ARGS = ("def", "0.2")

AARDVARK = traced_program(
    "aardvark",
    """
    def dig():
        burn(0.4)

    dig()
    """,
    # What `hotspan run` tags a batch job with: its trace, one value per run.
    tags='{"batch": "nightly", "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", '
    '"root_span_id": "00f067aa0ba902b7"}',
)

MAIN = "__main__."
CPU = "process_cpu:cpu:nanoseconds:cpu:nanoseconds"


class Data:
    def __init__(self, server: RunningServer, trace_id: str) -> None:
        self.server = server
        self.trace_id = trace_id


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    with running_server(tmp_path_factory.mktemp("ui-bugs") / "data") as srv:
        run_programs(AARDVARK, tmp_path_factory.mktemp("aardvark"), [srv.url])
        (out,) = run_programs(
            PROGRAM, tmp_path_factory.mktemp("checkout"), [srv.url, *CHECKOUT_ARGS]
        )
        trace_id = re.search(r"TRACE (\w+)", out).group(1)  # type: ignore[union-attr]
        yield Data(srv, trace_id)


def querier(server: RunningServer, method: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"{server.url}/querier.v1.QuerierService/{method}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def frame_names(page) -> List[str]:  # type: ignore[no-untyped-def]
    return [f["name"] for f in frames(page)]


def query_of(page) -> Dict[str, List[str]]:  # type: ignore[no-untyped-def]
    return parse_qs(urlparse(page.url).query)


def timeline_state(page) -> dict:  # type: ignore[no-untyped-def]
    """What the (first) timeline draws: the sum of its series, its caption and its band."""
    return page.evaluate(
        """() => {
            const t = document.querySelector('.hs-timeline').timeline;
            const sum = t.series.reduce((a, s) => a + s.points.reduce((b, p) => b + p[1], 0), 0);
            return {
                series: t.series.length,
                sum,
                band: t.band || null,
                caption: t.caption.hidden ? '' : t.caption.textContent,
                note: t.note.hidden ? '' : t.note.textContent,
            };
        }"""
    )


# --- bug 1: a trace's samples without a service --------------------------------------------


def test_trace_without_service_plots_the_trace_not_the_first_service(page, data) -> None:  # type: ignore[no-untyped-def]
    now_ms = int(time.time() * 1000)
    trace_total = float(
        querier(
            data.server,
            "SelectMergeStacktraces",
            {
                "profileTypeID": CPU,
                "labelSelector": "{}",
                "start": now_ms - 3600_000,
                "end": now_ms + 60_000,
                "traceIdSelector": [data.trace_id],
            },
        )["flamegraph"]["total"]
    )
    assert trace_total > 0
    page.goto(f"{data.server.url}/profiles?traceId={data.trace_id}")
    wait_for_frame(page, MAIN + "price_cart")
    # The Service picker says the view is the trace's, across services, not "aardvark".
    service = page.locator(".hs-service")
    service.wait_for()
    text = service.evaluate(
        "(e) => e.tagName === 'SELECT' ? e.options[e.selectedIndex].text : e.textContent"
    )
    assert "aardvark" not in text and "trace" in text and "all services" in text, text
    assert "service_name" not in " ".join(query_of(page).get("query", [""]))
    # The Profile picker offers the types that have data (here CPU).
    types = page.locator("select.hs-profile-type option").all_inner_texts()
    assert any("CPU" in t for t in types), types
    # The timeline shows the trace's samples (the flame graph's total), never aardvark's.
    page.wait_for_function("() => document.querySelector('.hs-timeline').timeline.series.length")
    state = timeline_state(page)
    assert abs(state["sum"] - trace_total) <= 0.02 * trace_total, (state, trace_total)
    assert "trace" in state["caption"], state
    screenshot(page, "bugs-trace-without-service")


def test_trace_timeline_on_a_server_without_trace_series_marks_when_it_ran(page, data) -> None:  # type: ignore[no-untyped-def]
    # A server (or Pyroscope) that ignores SelectSeries' trace selector answers for the whole
    # selection: the page must notice and mark the trace's time instead of plotting that.
    def without_trace(route) -> None:  # type: ignore[no-untyped-def]
        body = json.loads(route.request.post_data or "{}")
        body.pop("traceIdSelector", None)
        body.pop("spanSelector", None)
        route.continue_(post_data=json.dumps(body))

    page.route("**/querier.v1.QuerierService/SelectSeries", without_trace)
    page.goto(f"{data.server.url}/profiles?traceId={data.trace_id}")
    wait_for_frame(page, MAIN + "price_cart")
    page.wait_for_function("() => document.querySelector('.hs-timeline').timeline.band")
    state = timeline_state(page)
    assert state["series"] == 0 and "trace" in state["caption"], state
    screenshot(page, "bugs-trace-band")


# --- bug 2: unknown service, or no data in range ------------------------------------------


def test_unknown_service_is_kept_and_said(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="nosuch"}'))
    box = page.locator(".hs-profile .hs-message.hs-empty")
    box.wait_for()
    assert "no data for nosuch" in box.inner_text().lower(), box.inner_text()
    # The address is the shared link, untouched; no other service's data is shown.
    assert query_of(page)["query"] == ['{service_name="nosuch"}']
    page.wait_for_timeout(300)
    assert query_of(page)["query"] == ['{service_name="nosuch"}']
    assert not frame_names(page)
    assert timeline_state(page)["series"] == 0
    # The Service picker stays usable: the services with data, and nosuch marked as having none.
    select = page.locator("select.hs-service")
    assert select.input_value() == "nosuch"
    options = select.locator("option").all_inner_texts()
    assert "checkout" in options and "aardvark" in options, options
    assert any("nosuch" in o and "no data" in o for o in options), options
    screenshot(page, "bugs-unknown-service")
    select.select_option("checkout")
    wait_for_frame(page, MAIN + "price_cart")
    assert query_of(page)["query"] == ['{service_name="checkout"}']


def test_service_without_data_in_range_offers_the_nearest_range(page, data) -> None:  # type: ignore[no-untyped-def]
    now = int(time.time())
    query = quote('{service_name="checkout"}')
    page.goto(f"{data.server.url}/profiles?query={query}&from={now - 7200}&until={now - 5400}")
    box = page.locator(".hs-profile .hs-message.hs-empty")
    box.wait_for()
    assert "no data for checkout" in box.inner_text().lower(), box.inner_text()
    jump = page.locator(".hs-nearest-range")
    jump.wait_for()
    # The programs ran minutes ago: the last hour is the nearest range with their data.
    assert "last 1 hour" in jump.inner_text().lower(), jump.inner_text()
    params = query_of(page)
    assert params["query"] == ['{service_name="checkout"}']
    assert params["from"] == [str(now - 7200)]
    assert page.locator("select.hs-service").input_value() == "checkout"
    screenshot(page, "bugs-no-data-in-range")
    jump.click()
    wait_for_frame(page, MAIN + "price_cart")
    assert query_of(page)["from"] == ["now-1h"]
    assert query_of(page)["query"] == ['{service_name="checkout"}']


# --- bug 3: an empty dragged range, a bad range ------------------------------------------


def test_drag_across_empty_stretch_keeps_pickers_and_titles_the_new_range(page, data) -> None:  # type: ignore[no-untyped-def]
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    wait_for_frame(page, MAIN + "price_cart")
    page.wait_for_function("() => document.querySelector('.hs-timeline').timeline.series.length")
    # The programs ran in the last minutes; the first half of the last hour is empty.
    box = page.locator(".hs-timeline-canvas").first.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.15, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.3, y, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.45, y, steps=5)
    page.mouse.up()
    page.wait_for_function("() => /from=\\d+/.test(location.search)")
    box = page.locator(".hs-profile .hs-message.hs-empty")
    box.wait_for()
    assert "no data for checkout" in box.inner_text().lower(), box.inner_text()
    start = page.locator(".hs-range-from").input_value()
    title = page.locator(".hs-panel-title").first
    page.wait_for_function(
        "(s) => document.querySelector('.hs-panel-title').textContent.includes(s)", arg=start
    )
    assert "Last 1 hour" not in title.inner_text()
    # Both pickers stay, so the user can switch service or type from here: the other
    # services once the look further back has found them (its button comes with them).
    page.locator(".hs-nearest-range").wait_for()
    service = page.locator("select.hs-service")
    assert service.input_value() == "checkout"
    options = service.locator("option").all_inner_texts()
    assert any(o.startswith("aardvark") for o in options), options
    assert page.locator("select.hs-profile-type option").count() >= 1
    assert page.locator(".hs-toolbar label").first.inner_text().split()[-1] != "none"
    screenshot(page, "bugs-empty-drag")


def test_bad_time_range_keeps_the_pickers(page, data) -> None:  # type: ignore[no-untyped-def]
    query = quote('{service_name="checkout"}')
    page.goto(f"{data.server.url}/profiles?query={query}&from=garbage&until=now")
    box = page.locator(".hs-message.hs-error")
    box.wait_for()
    assert "is not a time" in box.inner_text()
    service = page.locator("select.hs-service")
    service.wait_for()
    assert service.input_value() == "checkout"
    assert page.locator("select.hs-profile-type option").count() >= 1
    assert query_of(page)["from"] == ["garbage"]


# --- per-execution labels -----------------------------------------------------------------


def test_group_by_and_filters_leave_out_per_execution_labels(page, data) -> None:  # type: ignore[no-untyped-def]
    query = quote('{service_name="aardvark"}')
    page.goto(data.server.url + "/profiles?query=" + query)
    wait_for_frame(page, MAIN + "dig")
    group = page.locator("select.hs-group-by")
    page.wait_for_function(
        "() => [...document.querySelectorAll('select.hs-group-by option')]"
        ".some((o) => o.value === 'batch')"
    )
    offered = group.locator("option").evaluate_all("(os) => os.map((o) => o.value)")
    for label in ("trace_id", "span_id", "root_span_id", "profile_id"):
        assert label not in offered, offered
    page.locator(".hs-add-filter").click()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.hs-filter-name option')]"
        ".some((o) => o.value === 'batch')"
    )
    names = page.locator(".hs-filter-name option").evaluate_all("(os) => os.map((o) => o.value)")
    for label in ("trace_id", "span_id", "root_span_id", "profile_id"):
        assert label not in names, names
    # One in the address keeps working.
    page.goto(data.server.url + "/profiles?groupBy=trace_id&query=" + query)
    page.wait_for_function(
        "() => document.querySelector('select.hs-group-by')?.value === 'trace_id'"
    )
    page.locator(".hs-legend-item", has_text="4bf92f35").wait_for()


# --- timeline axis and loading ----------------------------------------------------------


def test_timeline_zero_has_no_unit_and_loading_draws_a_skeleton(page, data) -> None:  # type: ignore[no-untyped-def]
    # Slow every querier answer down so that the loading state can be seen.
    def slow(route) -> None:  # type: ignore[no-untyped-def]
        time.sleep(0.6)
        route.continue_()

    page.route("**/querier.v1.QuerierService/SelectSeries", slow)
    page.goto(data.server.url + "/profiles?query=" + quote('{service_name="checkout"}'))
    page.locator(".hs-timeline-skeleton").wait_for()
    page.wait_for_function("() => document.querySelector('.hs-timeline').timeline.series.length")
    assert (
        page.locator(".hs-timeline-skeleton").count() == 0
        or not page.locator(".hs-timeline-skeleton").first.is_visible()
    )
    labels = page.evaluate("() => document.querySelector('.hs-timeline').timeline.yLabels")
    assert labels[0] == "0", labels
    assert all(re.search(r"\d (ms|s|min)$", t) for t in labels[1:]), labels


# --- review findings: a profile type without data, a stopped server, a trace link ----------


def test_unknown_profile_type_is_kept_and_said(page, data) -> None:  # type: ignore[no-untyped-def]
    # A shared link with a profile type the service has no data of must not show CPU instead.
    query = quote('{service_name="checkout"}')
    page.goto(f"{data.server.url}/profiles?query={query}&profileType=foo:bar")
    box = page.locator(".hs-profile .hs-message.hs-empty")
    box.wait_for()
    text = box.inner_text()
    assert "no data of profile type foo:bar for checkout" in text.lower(), text
    assert "CPU time" in text, text  # the types checkout has in this range
    page.wait_for_timeout(300)
    assert query_of(page)["profileType"] == ["foo:bar"]
    assert not frame_names(page)
    state = timeline_state(page)
    assert state["series"] == 0 and "foo:bar" in state["note"], state
    # The Profile picker shows the type asked for, marked, and the ones with data.
    select = page.locator("select.hs-profile-type")
    assert select.input_value() == "foo:bar"
    options = select.locator("option").all_inner_texts()
    assert any("foo" in o and "no data" in o for o in options), options
    screenshot(page, "bugs-unknown-profile-type")
    select.select_option(CPU)
    wait_for_frame(page, MAIN + "price_cart")
    assert query_of(page)["profileType"] == [CPU]
    # The same for a trace's samples.
    page.goto(f"{data.server.url}/profiles?traceId={data.trace_id}&profileType=foo:bar")
    box.wait_for()
    assert "no data of profile type foo:bar for trace" in box.inner_text().lower()
    assert query_of(page)["profileType"] == ["foo:bar"]


def test_a_stopped_server_is_said_in_the_timeline_too(page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with running_server(tmp_path / "stopping") as srv:
        page.goto(srv.url + "/profiles")
        page.locator(".hs-message.hs-empty").wait_for()
        srv.stop()
        page.locator(".hs-range-preset").select_option("now-6h")
        page.locator(".hs-profile .hs-message.hs-error").wait_for()
        note = page.locator(".hs-timeline-note")
        assert "cannot reach the hotspan server" in note.inner_text(), note.inner_text()
        screenshot(page, "bugs-server-stopped")


def test_trace_link_without_a_range_fits_the_range_to_the_trace(page, data) -> None:  # type: ignore[no-untyped-def]
    url = f"{data.server.url}/api/traces/{data.trace_id}/spans"
    with urllib.request.urlopen(url, timeout=30) as r:
        spans = json.loads(r.read())["spans"]
    start = min(int(s["startTimeUnixNano"]) for s in spans) / 1e9
    end = max(int(s["startTimeUnixNano"]) + int(s["durationNanos"]) for s in spans) / 1e9
    page.goto(f"{data.server.url}/profiles?traceId={data.trace_id}")
    # The range the trace ran in, written into the address (a reload shows the same).
    page.wait_for_function("() => /from=\\d+/.test(location.search)")
    params = query_of(page)
    frm, until = int(params["from"][0]), int(params["until"][0])
    assert frm < start and end < until and until - frm <= 15 * 60, (frm, until, start, end)
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", page.locator(".hs-range-from").input_value()
    )
    wait_for_frame(page, MAIN + "price_cart")
    # The trace's samples are wider than a one-pixel spike on the timeline.
    page.wait_for_function("() => document.querySelector('.hs-timeline').timeline.series.length")
    share = page.evaluate(
        """() => {
            const t = document.querySelector('.hs-timeline').timeline;
            const drawn = t.fill(t.series[0].points);
            return drawn.filter(([, v]) => v > 0).length / drawn.length;
        }"""
    )
    assert share >= 1 / 80, share
    screenshot(page, "bugs-trace-range-fitted")
