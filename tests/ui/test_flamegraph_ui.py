"""The flame graph, top table, panel and exports in a real Chromium against a real server.

The components are mounted on the server's own page (its CSP in force) from the served
modules, with data the page fetches from the real Connect API for profiles pushed here; the
assertions use the real mouse at coordinates taken from ``FlameGraph.frames()``.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from hotspan.formats.proto import profile_pb2
from tests.conftest import RunningServer, running_server
from tests.helpers import CPU, ingest_pprof, make_pprof
from tests.ui.conftest import screenshot

T0 = 1_700_000_000
MS = 1_000_000  # nanoseconds

# Root first, value in nanoseconds.  Total 1000 ms.
STACKS: List[Tuple[List[str], int]] = [
    (["main", "shop.handle", "shop.slow_function"], 600 * MS),
    (["main", "shop.handle", "json.decoder.JSONDecoder.decode"], 200 * MS),
    (["main", "shop.handle"], 100 * MS),
    (["main", "worker.idle"], 100 * MS),
]
# Diff: the comparison has twice the total, so "stable" keeps its share (30%) although its
# value doubles; "shrinks" goes from 50% to 10%, "grows" from 20% to 60%.
BASELINE = [
    (["main", "stable"], 300 * MS),
    (["main", "shrinks"], 500 * MS),
    (["main", "grows"], 200 * MS),
]
COMPARISON = [
    (["main", "stable"], 600 * MS),
    (["main", "shrinks"], 200 * MS),
    (["main", "grows"], 1200 * MS),
]
BIG_LEAVES = (10, 10, 100)  # 10 x 10 x 100 = 10,000 distinct stacks


def _push(c, name: str, stacks: List[Tuple[List[str], int]]) -> None:  # type: ignore[no-untyped-def]
    body = make_pprof(
        [(list(reversed(frames)), value, {}) for frames, value in stacks], time_ns=T0 * 10**9
    )
    r = ingest_pprof(c, name, body, T0)
    assert r.status_code == 200, r.text


def _big_folded() -> str:
    a, b, n = BIG_LEAVES
    lines = []
    for i in range(a):
        for j in range(b):
            for k in range(n):
                stack = f"main;pkg{i}.module.outer_{i};pkg{i}.sub{j}.Middle.call_{j}"
                lines.append(f"{stack};leaf{k}.work_{i}_{j}_{k} {1 + (i * 7 + j * 3 + k) % 13}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("flamegraph-ui") / "data") as srv:
        with srv.client() as c:
            _push(c, "shop{}", STACKS)
            _push(c, "diffy{version=a}", BASELINE)
            _push(c, "diffy{version=b}", COMPARISON)
            r = c.post(
                "/ingest",
                params={
                    "name": "big{}",
                    "from": str(T0),
                    "until": str(T0 + 10),
                    "sampleRate": "100",
                },
                content=_big_folded().encode(),
            )
            assert r.status_code == 200, r.text
        yield srv


def _select(service: str, **extra: object) -> Dict[str, object]:
    return {
        "profileTypeID": CPU,
        "labelSelector": f'{{service_name="{service}"}}',
        "start": (T0 - 60) * 1000,
        "end": (T0 + 60) * 1000,
        **extra,
    }


# Mounts a ProfilePanel in a fresh body with what the page itself fetches from the API.
MOUNT = """
async ({method, request, options, pprof}) => {
  document.body.replaceChildren();
  const div = document.createElement("div");
  div.id = "fg-test";
  document.body.append(div);
  const { ProfilePanel } = await import("/static/js/panel.js");
  const api = await import("/static/js/api.js");
  const answer = await api.querier(method, request);
  if (pprof) {
    options.exports = () => [{
      key: "pprof", label: "pprof", filename: "profile.pb",
      fetch: () => api.querierBinary("SelectMergeProfile", api.selectMergeProfileRequest(pprof)),
    }];
  }
  const panel = new ProfilePanel(div, options);
  panel.setData(answer.flamegraph, { unit: "nanoseconds", title: options.title || "test" });
  const tree = panel.tree;
  return tree ? { nodes: tree.nodeCount, total: tree.total } : { nodes: 0, total: 0 };
}
"""

FRAMES = """
(selector) => {
  const holder = document.querySelector(selector);
  const rect = holder.flamegraph.canvas.getBoundingClientRect();
  return {
    left: rect.left, top: rect.top, width: rect.width, height: rect.height,
    frames: holder.flamegraph.frames(),
  };
}
"""


def mount(page, server: RunningServer, method: str, request: dict, **options: object) -> dict:  # type: ignore[no-untyped-def]
    page.goto(f"{server.url}/profiles")
    pprof = options.pop("pprof", None)
    return page.evaluate(
        MOUNT, {"method": method, "request": request, "options": options, "pprof": pprof}
    )


def frames(page, selector: str = "#fg-test .hs-flamegraph") -> dict:  # type: ignore[no-untyped-def]
    return page.evaluate(FRAMES, selector)


def frame(view: dict, name: str) -> dict:
    found = [f for f in view["frames"] if f["name"] == name]
    assert found, f"{name} is not drawn; drawn: {[f['name'] for f in view['frames']][:20]}"
    return max(found, key=lambda f: f["width"])


def center(view: dict, f: dict) -> Tuple[float, float]:
    return view["left"] + f["x"] + min(f["width"] / 2, 40), view["top"] + f["y"] + f["height"] / 2


def tooltip(page, scope: str = "#fg-test") -> str:  # type: ignore[no-untyped-def]
    tip = page.locator(f"{scope} .hs-tooltip")
    tip.wait_for(state="visible")
    return tip.inner_text()


def pixel(page, view: dict, f: dict, selector: str = "#fg-test .hs-flamegraph") -> List[int]:  # type: ignore[no-untyped-def]
    """The canvas pixel 2 px inside a frame's top-left corner (no label there)."""
    return page.evaluate(
        """([selector, x, y]) => {
          const canvas = document.querySelector(selector).flamegraph.canvas;
          const dpr = canvas.width / canvas.getBoundingClientRect().width;
          const ctx = canvas.getContext("2d");
          const d = ctx.getImageData(Math.round(x * dpr), Math.round(y * dpr), 1, 1).data;
          return [d[0], d[1], d[2]];
        }""",
        [selector, f["x"] + 1.5, f["y"] + 1.5],
    )


def rgb(color: str) -> List[int]:
    assert color.startswith("rgb("), color
    return [int(v) for v in color[4:-1].split(",")]


def csp_violations(page) -> List[str]:  # type: ignore[no-untyped-def]
    found: List[str] = []
    page.on(
        "console", lambda m: found.append(m.text) if "Content Security Policy" in m.text else None
    )
    return found


def test_flame_graph_width_tooltip_zoom_search_and_root_position(page, ui_server) -> None:  # type: ignore[no-untyped-def]
    violations = csp_violations(page)
    info = mount(page, ui_server, "SelectMergeStacktraces", _select("shop"))
    assert info["total"] == 1000 * MS
    view = frames(page)
    root, handle, slow = (
        frame(view, "total"),
        frame(view, "shop.handle"),
        frame(view, "shop.slow_function"),
    )
    # Width is value: the root spans the canvas, the others in proportion.
    assert abs(root["width"] - view["width"]) <= 1
    assert abs(slow["width"] / root["width"] - 0.6) < 0.005
    assert abs(handle["width"] / root["width"] - 0.9) < 0.005
    # Root at the top by default, 18 px rows; children start under their parent.
    assert (root["y"], handle["y"], slow["y"]) == (0, 36, 54)
    assert handle["x"] == root["x"]
    assert slow["label"] == "shop.slow_function"
    # Colours by package: both shop.* frames share one; the canvas shows that colour.
    assert slow["color"] == handle["color"]
    assert pixel(page, view, slow) == rgb(slow["color"])

    page.mouse.move(*center(view, slow))
    text = tooltip(page)
    assert "shop.slow_function" in text
    assert "Total" in text and "600 ms (60.0%)" in text
    assert "Self" in text
    page.mouse.move(*center(view, handle))
    text = tooltip(page)
    assert "900 ms (90.0%)" in text and "100 ms (10.0%)" in text
    screenshot(page, "flamegraph-tooltip")

    # Click zooms: the frame fills the width, its children scale with it.
    page.mouse.click(*center(view, handle))
    holder = page.locator("#fg-test .hs-flamegraph")
    assert holder.get_attribute("data-zoomed") == "shop.handle"
    assert page.locator("#fg-test .hs-reset").is_enabled()
    zoomed = frames(page)
    z_handle, z_slow = frame(zoomed, "shop.handle"), frame(zoomed, "shop.slow_function")
    assert abs(z_handle["width"] - view["width"]) <= 1
    assert abs(z_slow["width"] / z_handle["width"] - 600 / 900) < 0.005
    assert frame(zoomed, "main")["faded"]
    assert "worker.idle" not in [f["name"] for f in zoomed["frames"]]
    screenshot(page, "flamegraph-zoomed")
    # Clicking the root zooms back out.
    page.mouse.click(*center(zoomed, frame(zoomed, "total")))
    assert holder.get_attribute("data-zoomed") is None
    assert abs(frame(frames(page), "shop.slow_function")["width"] - slow["width"]) < 0.01
    # The reset button does the same.
    page.mouse.click(*center(view, slow))
    assert holder.get_attribute("data-zoomed") == "shop.slow_function"
    page.locator("#fg-test .hs-reset").click()
    assert holder.get_attribute("data-zoomed") is None

    # Search highlights matches and dims the rest.
    page.locator("#fg-test .hs-search").fill("JSON")
    searched = frames(page)
    for f in searched["frames"]:
        match = "json" in f["name"].lower()
        assert f["highlighted"] == match and f["dimmed"] == (not match), f
    decode = frame(searched, "json.decoder.JSONDecoder.decode")
    assert pixel(page, searched, frame(searched, "main")) == rgb(frame(searched, "main")["color"])
    assert frame(searched, "main")["color"] != decode["color"]
    assert "1 frame," in page.locator("#fg-test .hs-search-info").inner_text()
    assert "20.0%" in page.locator("#fg-test .hs-search-info").inner_text()
    # The table follows the search.
    assert (
        page.locator("#fg-test tbody tr[data-name]").all_inner_texts()[0].startswith("json.decoder")
    )
    screenshot(page, "flamegraph-search")
    page.locator("#fg-test .hs-search").fill("")
    assert not any(f["dimmed"] or f["highlighted"] for f in frames(page)["frames"])

    # Root at the bottom flips y; the choice is remembered.
    page.locator("#fg-test .hs-invert").click()
    flipped = frames(page)
    depth = max(f["depth"] for f in flipped["frames"])
    assert frame(flipped, "total")["y"] == depth * 18
    assert frame(flipped, "shop.slow_function")["y"] == 0
    assert flipped["height"] == (depth + 1) * 18
    page.mouse.move(*center(flipped, frame(flipped, "shop.slow_function")))
    assert "600 ms" in tooltip(page)
    screenshot(page, "flamegraph-root-bottom")
    mount(page, ui_server, "SelectMergeStacktraces", _select("shop"))
    assert frame(frames(page), "total")["y"] == depth * 18
    assert page.locator("#fg-test .hs-invert").get_attribute("aria-pressed") == "true"
    assert not violations, violations


def test_top_table_sorts_and_highlights_in_the_graph(page, ui_server) -> None:  # type: ignore[no-untyped-def]
    mount(page, ui_server, "SelectMergeStacktraces", _select("shop"))
    rows = page.locator("#fg-test .hs-toptable tbody tr[data-name]")

    def names() -> List[str]:
        return [rows.nth(i).get_attribute("data-name") for i in range(rows.count())]

    # Self, descending, by default.
    assert names() == [
        "shop.slow_function",
        "json.decoder.JSONDecoder.decode",
        "shop.handle",
        "worker.idle",
        "main",
    ]
    first = rows.nth(0).inner_text()
    assert "600 ms" in first and "60.0%" in first
    sort = page.locator("#fg-test .hs-toptable thead .hs-sort")
    sort.filter(has_text="Total").click()
    assert names()[:2] == ["main", "shop.handle"]
    assert "1 s" in rows.nth(0).inner_text() and "100.0%" in rows.nth(0).inner_text()
    assert page.locator("#fg-test th.hs-toptable-total").get_attribute("aria-sort") == "descending"
    sort.filter(has_text="Total").click()
    assert names()[0] in ("worker.idle", "json.decoder.JSONDecoder.decode")
    assert names()[-1] == "main"
    assert page.locator("#fg-test th.hs-toptable-total").get_attribute("aria-sort") == "ascending"
    sort.filter(has_text="Function").click()
    assert names() == sorted(names())
    sort.filter(has_text="Function").click()
    assert names() == sorted(names(), reverse=True)
    sort.filter(has_text="Self").click()
    assert names()[0] == "shop.slow_function"

    # A row click highlights that function in the flame graph.
    page.locator('#fg-test tr[data-name="worker.idle"]').click()
    assert "hs-selected" in (
        page.locator('#fg-test tr[data-name="worker.idle"]').get_attribute("class") or ""
    )
    view = frames(page)
    for f in view["frames"]:
        assert f["highlighted"] == (f["name"] == "worker.idle"), f
        assert f["dimmed"] == (f["name"] != "worker.idle"), f
    idle = frame(view, "worker.idle")
    assert pixel(page, view, idle) == rgb(idle["color"])
    assert (
        pixel(page, view, frame(view, "main"))
        == rgb(frame(view, "main")["color"])
        == [228, 228, 228]
    )
    screenshot(page, "toptable-highlight")
    # A second click clears it.
    page.locator('#fg-test tr[data-name="worker.idle"]').click()
    assert not any(f["dimmed"] for f in frames(page)["frames"])

    # View switch: table only, graph only.
    page.locator('#fg-test .hs-view[data-view="flamegraph"]').click()
    assert page.locator("#fg-test .hs-panel-table").is_hidden()
    assert frame(frames(page), "total")["width"] > 1000
    page.locator('#fg-test .hs-view[data-view="both"]').click()
    assert page.locator("#fg-test .hs-panel-table").is_visible()


# Geometry of the mounted panel's top table: cells cut, the table box's sideways scroll.
NARROW_TABLE = """
() => {
  const box = document.querySelector('#fg-test .hs-panel-table');
  const rows = [...box.querySelectorAll('tbody tr[data-name]')];
  const right = box.getBoundingClientRect().right;
  return {
    scroll: box.scrollWidth - box.clientWidth,
    cut: rows.flatMap((r) => [...r.cells]).filter((td) => td.scrollWidth > td.clientWidth + 1)
      .map((td) => td.className + ': ' + td.textContent),
    beyond: rows.flatMap((r) => [...r.cells])
      .filter((td) => td.getBoundingClientRect().right > right + 0.5).length,
    columns: [...box.querySelectorAll('thead th')].map((th) => th.textContent),
    nameShare: rows[0].cells[0].getBoundingClientRect().width / box.clientWidth,
    selfText: rows[0].cells[1].textContent,
    totalText: rows[0].cells[2].textContent,
  };
}
"""


def test_top_table_at_390_keeps_the_total_share_and_the_names(page, ui_server) -> None:  # type: ignore[no-untyped-def]
    # Review finding 7: on a phone the Total % was cut at the table's edge while the names
    # shrank to a few characters; the self share goes first.
    page.set_viewport_size({"width": 390, "height": 844})
    mount(page, ui_server, "SelectMergeStacktraces", _select("shop"))
    # As wide as the panel's table on the Profiles page at 390 px (inside the page's padding).
    page.evaluate("() => { document.getElementById('fg-test').style.width = '330px'; }")
    page.wait_for_timeout(100)  # the table's resize observer
    geo = page.evaluate(NARROW_TABLE)
    screenshot(page, "toptable-390")
    assert geo["scroll"] <= 0 and geo["beyond"] == 0, geo
    assert not geo["cut"], geo
    assert "600 ms" in geo["selfText"] and "%" not in geo["selfText"], geo
    assert "60.0%" in geo["totalText"], geo
    assert geo["nameShare"] >= 0.4, geo
    # Wide again: the self share comes back.
    page.set_viewport_size({"width": 1400, "height": 900})
    page.evaluate("() => { document.getElementById('fg-test').style.width = ''; }")
    page.wait_for_function(
        """() => document.querySelector('#fg-test tbody tr[data-name] td.hs-toptable-self')
            .textContent.includes('%')"""
    )


def test_a_table_beside_a_shallow_graph_is_as_tall_as_the_graph(page, ui_server) -> None:  # type: ignore[no-untyped-def]
    # "big" is four frames deep and has hundreds of functions: its graph is ~90 px high, and
    # an 80vh table beside it left the page empty under the graph.
    page.set_viewport_size({"width": 1440, "height": 900})
    mount(page, ui_server, "SelectMergeStacktraces", _select("big"))
    page.wait_for_timeout(200)  # the resize observer
    geo = page.evaluate(
        """() => {
            const q = (s) => document.querySelector('#fg-test ' + s);
            const t = q('.hs-panel-table'), g = q('.hs-panel-graphs');
            return {table: t.getBoundingClientRect().height, top: t.getBoundingClientRect().top,
                    graphs: g.getBoundingClientRect().height, gtop: g.getBoundingClientRect().top,
                    scroll: t.scrollHeight, client: t.clientHeight};
        }"""
    )
    assert abs(geo["top"] - geo["gtop"]) < 2, geo  # side by side
    assert geo["graphs"] < 200, geo
    assert geo["table"] <= max(geo["graphs"], 360) + 2, geo
    assert geo["scroll"] > geo["client"], geo  # the rest of the table scrolls inside it


def test_diff_colours_by_normalised_change(page, ui_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    request = {
        "left": _select("diffy", labelSelector='{service_name="diffy", version="a"}'),
        "right": _select("diffy", labelSelector='{service_name="diffy", version="b"}'),
    }
    info = mount(page, ui_server, "Diff", request, title="diff")
    assert info["total"] == 3000 * MS
    view = frames(page)
    grows, shrinks, stable = frame(view, "grows"), frame(view, "shrinks"), frame(view, "stable")
    # Widths: each side's sum (Pyroscope's diff layout).
    assert abs(grows["width"] / view["width"] - 1400 / 3000) < 0.005
    r, g, b = pixel(page, view, grows)
    assert [r, g, b] == rgb(grows["color"])
    assert r > g + 60 and r > b + 60, ("grew: red-ish", grows["color"])
    r, g, b = pixel(page, view, shrinks)
    assert g > r + 60 and g > b + 40, ("shrank: green-ish", shrinks["color"])
    # Doubled in value with the doubled total: the same share, grey.
    r, g, b = pixel(page, view, stable)
    assert max(r, g, b) - min(r, g, b) < 10, ("unchanged share: grey", stable["color"])
    assert abs(stable["change"]) < 1e-9 and abs(grows["change"] - 2.0) < 1e-9

    page.mouse.move(*center(view, grows))
    text = tooltip(page)
    assert "grows" in text
    assert "Baseline" in text and "20.0% (200 ms)" in text
    assert "Comparison" in text and "60.0% (1.2 s)" in text
    assert "+200.0%" in text
    page.mouse.move(*center(view, shrinks))
    assert "-80.0%" in tooltip(page)
    screenshot(page, "flamegraph-diff")

    # A diff's table lists the largest growth first by default; its Change header turns it.
    rows = page.locator("#fg-test .hs-toptable tbody tr[data-name]")
    assert rows.nth(0).get_attribute("data-name") == "grows"
    assert "+200.0%" in rows.nth(0).inner_text()
    page.locator("#fg-test .hs-toptable thead .hs-sort").filter(has_text="Change").click()
    assert rows.nth(0).get_attribute("data-name") == "shrinks"

    # The standalone export keeps the diff colours and tooltip.
    page.goto(_download(page, "html", tmp_path).as_uri())
    exported = frames(page, "#hs-graph")
    assert frame(exported, "grows")["color"] == grows["color"]
    page.mouse.move(*center(exported, frame(exported, "grows")))
    assert "+200.0%" in tooltip(page, "#hs-graph")


def _download(page, key: str, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    page.locator("#fg-test .hs-export-summary").click()
    with page.expect_download() as info:
        page.locator(f'#fg-test [data-export="{key}"]').click()
    path = tmp_path / info.value.suggested_filename
    info.value.save_as(path)
    return path


def test_exports_folded_pprof_and_standalone_html(page, ui_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pprof = {
        "profileTypeID": CPU,
        "labelSelector": '{service_name="shop"}',
        "start": (T0 - 60) * 1000,
        "end": (T0 + 60) * 1000,
    }
    mount(
        page,
        ui_server,
        "SelectMergeStacktraces",
        _select("shop"),
        exportName="shop-cpu",
        pprof=pprof,
    )

    folded = _download(page, "folded", tmp_path)
    assert folded.name == "shop-cpu.folded.txt"
    lines = folded.read_text().splitlines()
    assert sorted(lines) == sorted(f"{';'.join(frames_)} {value}" for frames_, value in STACKS)

    raw = _download(page, "pprof", tmp_path).read_bytes()
    profile = profile_pb2.Profile.FromString(
        gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    )
    strings = [s.decode() if isinstance(s, bytes) else s for s in profile.string_table]
    assert "shop.slow_function" in strings and sum(s.value[0] for s in profile.sample) == 1000 * MS

    html = _download(page, "html", tmp_path)
    assert html.name == "shop-cpu.html"
    text = html.read_text()
    assert "<script src" not in text and "import " not in text.split("<script>", 1)[1]
    # Opened from file://: no server, no network; the graph draws and is interactive.
    requests: List[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(html.as_uri())
    view = frames(page, "#hs-graph")
    slow = frame(view, "shop.slow_function")
    assert abs(slow["width"] / frame(view, "total")["width"] - 0.6) < 0.005
    page.mouse.move(*center(view, slow))
    text = tooltip(page, "#hs-graph")
    assert "shop.slow_function" in text and "600 ms (60.0%)" in text
    page.mouse.click(*center(view, frame(view, "shop.handle")))
    assert page.locator("#hs-graph").get_attribute("data-zoomed") == "shop.handle"
    assert abs(frame(frames(page, "#hs-graph"), "shop.handle")["width"] - view["width"]) <= 1
    page.locator("#hs-search").fill("slow")
    assert frame(frames(page, "#hs-graph"), "main")["dimmed"]
    screenshot(page, "flamegraph-standalone-html")
    page.mouse.click(*center(view, frame(view, "total")))
    assert page.locator("#hs-graph").get_attribute("data-zoomed") is None
    assert [u for u in requests if not u.startswith("file:")] == []


def test_ten_thousand_nodes(page, ui_server) -> None:  # type: ignore[no-untyped-def]
    info = mount(page, ui_server, "SelectMergeStacktraces", _select("big", maxNodes="20000"))
    a, b, n = BIG_LEAVES
    assert info["nodes"] == 1 + 1 + a + a * b + a * b * n  # root, main, outer, middle, leaves
    view = frames(page)
    drawn = view["frames"]
    assert drawn and all(f["width"] >= 0.5 for f in drawn)
    # The 10,000 leaves share ~900 px: each is under half a pixel, so none is drawn.
    assert {f["depth"] for f in drawn} == {0, 1, 2, 3}
    assert len(drawn) == info["nodes"] - a * b * n
    for f in drawn:
        if f["label"]:
            # Cut from the left: the function, at the end of the name, stays readable.
            assert f["label"] == f["name"] or (
                f["label"].startswith("…") and f["name"].endswith(f["label"][1:])
            )
    assert any(f["label"].startswith("…") for f in drawn)
    assert any(not f["label"] for f in drawn)  # too narrow for a label
    # Hover and zoom work at this size, and zooming brings the leaves into view.
    middle = frame(view, "pkg3.sub4.Middle.call_4")
    page.mouse.move(*center(view, middle))
    assert "pkg3.sub4.Middle.call_4" in tooltip(page)
    page.mouse.click(*center(view, middle))
    zoomed = frames(page)
    leaves = [f for f in zoomed["frames"] if f["depth"] == 4]
    assert len(leaves) == n and all(f["name"].startswith("leaf") for f in leaves)
    assert abs(sum(f["width"] for f in leaves) - zoomed["width"]) < 1
    screenshot(page, "flamegraph-10k-zoomed")
    # The table shows its first rows and offers the rest.
    more = page.locator("#fg-test .hs-toptable-more")
    assert more.is_visible() and "Show all" in more.inner_text()
    # Laying out 10,111 rows takes seconds on a slow machine (5 s here alone, more beside
    # the rest of the suite): the click waits for it, past the default 15 s under load.
    more.click(timeout=60_000)
    assert page.locator("#fg-test .hs-toptable tbody tr[data-name]").count() == info["nodes"] - 1


def test_no_samples_says_what_to_do(page, ui_server) -> None:  # type: ignore[no-untyped-def]
    mount(page, ui_server, "SelectMergeStacktraces", _select("nobody"))
    msg = page.locator("#fg-test .hs-message")
    assert "No samples" in msg.inner_text() and "time range" in msg.inner_text()
    assert page.locator("#fg-test .hs-panel-body").is_hidden()
    assert page.locator('#fg-test [data-export="folded"]').is_disabled()
