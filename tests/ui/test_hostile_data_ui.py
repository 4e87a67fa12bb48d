"""What the UI does with data anyone can send (frame, span and file names, ids in links), in a
real Chromium: patterns that would hang a backtracking engine, names holding the folded
format's separators, parent cycles in a trace, and ids that would steer a request elsewhere."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from tests.conftest import RunningServer, running_server


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("hostile-ui") / "data") as s:
        yield s


def run_js(page, srv: RunningServer, script: str):  # type: ignore[no-untyped-def]
    page.goto(srv.url + "/")
    return page.evaluate(script)


def test_a_pattern_that_backtracks_does_not_hang_the_page(page, srv: RunningServer) -> None:
    started = time.monotonic()
    found = run_js(
        page,
        srv,
        """async () => {
          const { nameMatcher, safePattern } = await import("/static/js/search.js");
          const long = "a".repeat(10000);
          const shapes = ["(a+)+b", "(a|aa)*b", "(x)\\\\1", "\\\\w*\\\\w*x", "a.*a.*b"];
          return {
            evil: shapes.map((p) => nameMatcher(`/${p}/`)(long)),
            refused: shapes.map((p) => safePattern(p) === null),
            // What still runs: RE2's spellings read, a leading and trailing .* dropped.
            re2: [nameMatcher("/(?i)F2/")("f2x"), nameMatcher("/(?P<m>json)\\\\.d/")("json.dumps")],
            wide: nameMatcher("/.*json.*/")("x.json.y"),
            plain: nameMatcher("/json\\\\.dumps$/")("json.dumps"),
            text: nameMatcher("/(a+)+b/")("x/(a+)+b/y"),
          };
        }""",
    )
    assert time.monotonic() - started < 20  # a backtracking run of these takes forever
    assert found["evil"] == [False] * 5, found
    assert all(found["refused"]), found
    assert found["re2"] == [True, True] and found["wide"] and found["plain"], found
    assert found["text"], found  # a refused pattern is searched as its text


def test_folded_export_keeps_frames_whole(page, srv: RunningServer) -> None:
    lines = run_js(
        page,
        srv,
        """async () => {
          const { decodeFlamegraph, foldedText } = await import("/static/js/flametree.js");
          const fg = {
            names: ["total", "main", "a;b;c", "multi\\nline\\rname"],
            levels: [{ values: [0, 80, 0, 0] }, { values: [0, 80, 0, 1] },
                     { values: [0, 50, 50, 2, 0, 30, 30, 3] }],
            numTicks: 80, maxSelf: 50,
          };
          return foldedText(decodeFlamegraph(fg)).split("\\n").filter(Boolean);
        }""",
    )
    assert lines == ["main;a:b:c 50", "main;multi\\nline\\rname 30"], lines


def test_a_trace_whose_parents_form_a_cycle_shows_every_span(page, srv: RunningServer) -> None:
    shown = run_js(
        page,
        srv,
        """async () => {
          const { buildTree } = await import("/static/js/waterfall.js");
          const span = (id, parent, start) => ({ spanID: id, parentSpanID: parent, name: id,
            service: "s", startTimeUnixNano: String(start), durationNanos: "10" });
          const tree = buildTree([span("a1", "b2", 5), span("b2", "a1", 7),
                                  span("c3", "", 1), span("d4", "d4", 9)]);
          return tree.spans.map((s) => s.spanID);
        }""",
    )
    assert sorted(shown) == ["a1", "b2", "c3", "d4"], shown


def test_a_trace_id_in_the_link_is_an_id_or_nothing(page, srv: RunningServer) -> None:
    asked = []
    page.on("request", lambda r: asked.append(r.url))
    page.goto(srv.url + "/profiles?traceId=../../alerts&spanId=..%2F..%2Fx")
    page.wait_for_timeout(1500)
    assert not [u for u in asked if "/alerts/spans" in u or "/x/" in u], asked


def test_zoom_link_of_a_name_with_a_separator(page, srv: RunningServer) -> None:
    found = run_js(
        page,
        srv,
        """async () => {
          const { FlameGraph } = await import("/static/js/flamegraph.js");
          const { decodeFlamegraph } = await import("/static/js/flametree.js");
          const fg = {
            names: ["total", "main", "a;b%3Bc"],
            levels: [{ values: [0, 80, 0, 0] }, { values: [0, 80, 0, 1] },
                     { values: [0, 50, 50, 2] }],
            numTicks: 80, maxSelf: 50,
          };
          const graph = Object.create(FlameGraph.prototype);
          graph.tree = decodeFlamegraph(fg);
          graph.zoomed = 2;
          const path = graph.zoomPath();
          return { path, node: graph.findPath(path) };
        }""",
    )
    assert found["node"] == 2, found
    assert found["path"].count(";") == 1, found


def test_editor_links_keep_hash_and_question_marks_in_paths(page, srv: RunningServer) -> None:
    link = run_js(
        page,
        srv,
        """async () => {
          const { editorLink } = await import("/static/js/source.js");
          return editorLink({ file: "/src/MyApp/c#/Program.cs", line: 42 });
        }""",
    )
    assert link == "vscode://file/src/MyApp/c%23/Program.cs:42", link


def test_a_tenant_no_header_can_carry_is_named_as_such(page, srv: RunningServer) -> None:
    page.goto(srv.url + "/")
    page.evaluate("localStorage.setItem('hotspan.tenant', '日本')")
    try:
        page.goto(srv.url + "/profiles")
        page.wait_for_selector("text=characters an HTTP header cannot carry", timeout=15000)
    finally:
        page.evaluate("localStorage.removeItem('hotspan.tenant')")


def test_settings_refuse_such_a_tenant(page, srv: RunningServer) -> None:
    page.goto(srv.url + "/")
    page.click("#hs-settings-button")
    page.fill("dialog input:not([type=password])", "日本")
    page.click("dialog button.hs-primary")
    assert page.evaluate("localStorage.getItem('hotspan.tenant')") in (None, "")
    assert page.is_visible("dialog")
