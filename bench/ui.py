"""UI benchmark: the flame graph in a real headless Chromium, for 1k, 10k and 50k nodes.

The flame graphs are encoded by the server's own code (``hotspan.query.flamegraph.build``)
from random call trees and written as the protojson the querier answers.  The UI's modules
are served as they are (``src/hotspan/ui/static``) by a local HTTP server; the page fetches
the JSON and times, with ``performance.now()`` in the page:

- parse: ``JSON.parse`` of the answer's text;
- decode: ``decodeFlamegraph`` (levels -> typed arrays, parents, children);
- first draw: ``FlameGraph.setData`` + the draw it schedules (run at once);
- top table: ``TopTable.setData`` (aggregation per function, sort, first 200 rows in the DOM);
- zoom redraw: ``zoomTo(frame)`` + draw, for frames across the graph, and back out;
- hover: one ``mousemove`` event on the canvas (hit test + tooltip update; hover does not
  redraw);
- sandwich: the sandwich view's two trees (callers and callees) of the function with the most
  frames, built (``sandwich.js``) and drawn, when this checkout has the sandwich view.

Times are the JavaScript main thread's (canvas commands are recorded there; rasterising is
Chromium's, off the main thread); medians over several runs, after a warm-up.

Then the heavy views against a real server (``bench/ui_views.py``): profiles, sandwich, label
breakdown, endpoints and the diff of two spans, API call and page load to drawn.

    python bench/run.py --only ui [--quick]
    python bench/ui.py [--quick]          # the same, Markdown on stdout
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import random
import shutil
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import ui_views  # noqa: E402

STATIC_DIR = os.path.join(common.REPO_DIR, "src", "hotspan", "ui", "static")
SIZES = [1_000, 10_000, 50_000]
REPEAT = 7
QUICK_REPEAT = 3
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><link rel="stylesheet" href="/static/css/flamegraph.css">
</head><body><div id="bench"></div></body></html>
"""


def chromium() -> str:
    for path in [os.environ.get("HOTSPAN_CHROMIUM", "")] + [
        shutil.which(n) or "" for n in CHROMIUM_NAMES
    ]:
        if path and os.path.exists(path):
            return path
    raise SystemExit(
        "no Chromium found: install it (apt-get install chromium) or set HOTSPAN_CHROMIUM"
    )


def random_graph(target_nodes: int, seed: int = 5) -> Dict[str, object]:
    """A protojson FlameGraph with about ``target_nodes`` nodes: a random call tree many
    frames deep (at most 40) whose functions come from a pool of module.qualname names."""
    from hotspan.query.flamegraph import build

    rng = random.Random(seed)
    pool = [
        f"pkg{rng.randrange(60)}.mod{rng.randrange(8)}.Class{rng.randrange(5)}.method_{i}"
        for i in range(max(200, target_nodes // 3))
    ]
    parent = [-1]
    depth = [0]
    name = [0]
    # New nodes hang off recent ones (deep stacks) or random older ones (wide fan-out).
    while len(parent) < target_nodes:
        p = (
            len(parent) - 1 - rng.randrange(min(len(parent), 8))
            if rng.random() < 0.7
            else rng.randrange(len(parent))
        )
        if depth[p] >= 40:
            p = rng.randrange(len(parent))
        parent.append(p)
        depth.append(depth[p] + 1)
        name.append(rng.randrange(len(pool)))
    is_parent = set(parent)
    rows: List[List[int]] = []
    values: List[int] = []
    for node in range(1, len(parent)):
        if node in is_parent and rng.random() < 0.7:
            continue  # most inner frames have no self time
        path = []
        n = node
        while n > 0:
            path.append(name[n])
            n = parent[n]
        rows.append(path[::-1])
        values.append(int(rng.paretovariate(1.2) * 10_000_000))
    width = max(len(r) for r in rows)
    stacks = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        stacks[i, : len(r)] = r
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    graph = build(stacks, lengths, np.array(values, dtype=np.int64), pool)
    return {
        "flamegraph": {
            "names": graph.names,
            "levels": [{"values": [str(v) for v in level.tolist()]} for level in graph.levels],
            "total": str(sum(graph.totals)),
            "maxSelf": str(graph.max_self),
        }
    }


def node_count(answer: Dict[str, object]) -> int:
    levels = answer["flamegraph"]["levels"]  # type: ignore[index]
    return sum(len(level["values"]) // 4 for level in levels)


# Runs in the page: times each step for one data set, `repeat` times after a warm-up.
MEASURE = """
async ({url, repeat}) => {
  const { decodeFlamegraph } = await import("/static/js/flametree.js");
  const { FlameGraph } = await import("/static/js/flamegraph.js");
  const { TopTable } = await import("/static/js/toptable.js");
  // The sandwich view is newer than this benchmark: timed where the checkout has it.
  const sandwich = await import("/static/js/sandwich.js").then((m) => m.sandwich, () => null);
  const text = await (await fetch(url)).text();
  const holder = document.getElementById("bench");
  const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[s.length >> 1]; };
  const timed = (fn) => { const t = performance.now(); fn(); return performance.now() - t; };
  const out = {
    parse: [], decode: [], firstDraw: [], topTable: [], zoom: [], unzoom: [], hover: [],
    sandwich: [],
  };
  let drawn = 0, nodes = 0, depth = 0, functions = 0, hoverHits = 0;
  for (let run = 0; run <= repeat; run++) {
    holder.replaceChildren();
    const graphBox = document.createElement("div");
    const tableBox = document.createElement("div");
    holder.append(graphBox, tableBox);
    let json, tree;
    const parse = timed(() => { json = JSON.parse(text); });
    const decode = timed(() => { tree = decodeFlamegraph(json.flamegraph); });
    const graph = new FlameGraph(graphBox, { unit: "nanoseconds" });
    const firstDraw = timed(() => { graph.setData(tree); graph.flush(); });
    const table = new TopTable(tableBox, { unit: "nanoseconds" });
    const topTable = timed(() => table.setData(tree));
    drawn = graph.drawn.length / 5;
    nodes = tree.nodeCount;
    depth = tree.maxDepth;
    functions = tree.names.length - 1;
    // Zoom into frames spread over the graph: the widest frame of every other level.
    const targets = [];
    const step = Math.max(1, tree.maxDepth >> 3);
    for (let d = 1; d <= tree.maxDepth && targets.length < 10; d += step) {
      let best = -1;
      for (let i = tree.levelStart[d]; i < tree.levelStart[d + 1]; i++) {
        if (best < 0 || tree.value[i] > tree.value[best]) best = i;
      }
      if (best > 0) targets.push(best);
    }
    const zoom = [], unzoom = [], hover = [];
    for (const node of targets) {
      zoom.push(timed(() => { graph.zoomTo(node); graph.flush(); }));
      unzoom.push(timed(() => { graph.resetZoom(); graph.flush(); }));
    }
    const rect = graph.canvas.getBoundingClientRect();
    hoverHits = 0;
    for (let k = 0; k < 40; k++) {
      const x = rect.left + ((k * 37) % 100) / 100 * rect.width;
      const y = rect.top + Math.min(rect.height - 1, (k % 12) * 18 + 9);
      const ev = new MouseEvent("mousemove", { clientX: x, clientY: y, bubbles: true });
      hover.push(timed(() => graph.canvas.dispatchEvent(ev)));
      if (!graph.tooltip.hidden) hoverHits++;
    }
    let sandwichMs = null;
    if (sandwich) {
      // The function with the most frames: the most work for the sandwich's two trees.
      const frames = new Map();
      for (let i = 1; i < tree.nodeCount; i++) {
        frames.set(tree.name[i], (frames.get(tree.name[i]) || 0) + 1);
      }
      const busiest = [...frames].reduce((a, b) => (b[1] > a[1] ? b : a))[0];
      const boxes = [document.createElement("div"), document.createElement("div")];
      holder.append(...boxes);
      const graphs = boxes.map((b) => new FlameGraph(b, { unit: "nanoseconds" }));
      sandwichMs = timed(() => {
        const s = sandwich(tree, tree.names[busiest]);
        graphs[0].setData(s.callers); graphs[0].flush();
        graphs[1].setData(s.callees); graphs[1].flush();
      });
      for (const g of graphs) g.destroy();
    }
    if (run === 0) {
      graph.destroy();
      continue; // warm-up: JIT and font caches
    }
    if (sandwichMs !== null) out.sandwich.push(sandwichMs);
    out.parse.push(parse); out.decode.push(decode); out.firstDraw.push(firstDraw);
    out.topTable.push(topTable); out.zoom.push(median(zoom)); out.unzoom.push(median(unzoom));
    out.hover.push(median(hover));
    graph.destroy();
  }
  const result = { nodes, drawn, depth, functions, jsonBytes: text.length, hoverHits };
  for (const [k, v] of Object.entries(out)) {
    result[k] = v.length ? Math.round(median(v) * 100) / 100 : null;
  }
  return result;
}
"""


class _Handler(http.server.SimpleHTTPRequestHandler):
    data: Dict[str, bytes] = {}

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/":
            self._send(PAGE, "text/html")
        elif self.path.startswith("/data/"):
            self._send(self.data[self.path], "application/json")
        elif self.path.startswith("/static/"):
            self.path = self.path[len("/static") :]
            super().do_GET()
        else:
            self.send_error(404)

    def _send(self, body: bytes, ctype: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def run(quick: bool = False, log: Callable[[str], None] = print) -> Dict[str, object]:
    from playwright.sync_api import sync_playwright

    repeat = QUICK_REPEAT if quick else REPEAT
    data: Dict[str, bytes] = {}
    built: Dict[int, Dict[str, object]] = {}
    for size in SIZES:
        t = time.perf_counter()
        answer = random_graph(size)
        data[f"/data/{size}.json"] = json.dumps(answer).encode()
        built[size] = {"nodes": node_count(answer), "build_s": round(time.perf_counter() - t, 2)}
        log(f"  {size}: {built[size]['nodes']} nodes, {len(data[f'/data/{size}.json']):,} bytes")
    handler = type("Handler", (_Handler,), {"data": data})
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=STATIC_DIR)
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    rows = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=chromium(), args=["--no-sandbox", "--disable-dev-shm-usage"]
            )
            version = browser.version
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(url + "/")
            for size in SIZES:
                r = page.evaluate(MEASURE, {"url": f"/data/{size}.json", "repeat": repeat})
                log(f"  {size}: {r}")
                rows.append({"target": size, **r})
            browser.close()
    finally:
        httpd.shutdown()
    log("ui benchmark: heavy views against a server ...")
    try:
        views = ui_views.run(quick, log, chromium())
    except Exception as exc:  # noqa: BLE001 - the flame graph numbers still stand
        views = {"error": f"{type(exc).__name__}: {exc}"}
        log(f"  views failed: {views['error']}")
    return {
        "chromium": version,
        "repeat": repeat,
        "viewport": "1400x900, devicePixelRatio 1",
        "rows": rows,
        "views": views,
    }


def markdown(result: Dict[str, object], command: str, m: Dict[str, object], wall: float) -> str:
    lines: List[str] = []
    add = lines.append
    lines += common.head(
        "hotspan UI benchmark: flame graph"
        + (" (quick)" if result["repeat"] == QUICK_REPEAT else ""),
        command,
        wall,
        common.machine_text(
            m,
            {"headless Chromium (software rendering)": str(result["chromium"])},
            note=f"Viewport {result['viewport']}.",
        ),
    )
    add("")
    add(
        "Random call trees (about 40 frames deep at most, module.qualname names) encoded by the "
        "server's "
        "flame graph code as the querier's protojson; times in the page's main thread, median of "
        f"{result['repeat']} runs after a warm-up (zoom and hover: median over 10 frames and 40 "
        'pointer positions per run; "hover hits": how many of those landed on a frame and '
        'rebuilt the tooltip). "first draw" is setData plus the draw; "drawn" is the frames at '
        "least 0.5 px wide at 1400 px."
    )
    add("")
    add(
        "| nodes | depth | functions | JSON bytes | parse ms | decode ms | first draw ms "
        "| top table ms "
        "| zoom redraw ms | zoom out ms | hover ms | hover hits | frames drawn | sandwich ms |"
    )
    add("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in result["rows"]:  # type: ignore[union-attr]
        add(
            f"| {r['nodes']:,} | {r['depth']} | {r['functions']:,} | {r['jsonBytes']:,} "
            f"| {r['parse']} | {r['decode']} | "
            f"{r['firstDraw']} | {r['topTable']} | {r['zoom']} | {r['unzoom']} | {r['hover']} "
            f"| {r['hoverHits']}/40 | "
            f"{r['drawn']:,} | {'–' if r.get('sandwich') is None else r['sandwich']} |"
        )
    add("")
    add(
        "A frame at 60 Hz is 16.7 ms: zoom and hover stay well inside it at every size; the "
        "one-off cost of a new answer (parse + decode + draw + table) is what grows with nodes. "
        '"sandwich" builds and draws the callers and callees of the function with the most '
        'frames ("–": this checkout has no sandwich view).'
    )
    add("")
    views = result.get("views") or {}
    if "error" in views:  # type: ignore[operator]
        add(f"Heavy views: not measured ({views['error']}).")  # type: ignore[index]
        add("")
    elif views:
        lines.extend(ui_views.markdown(views))  # type: ignore[arg-type]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=common.RESULTS_DIR)
    args = parser.parse_args(argv)
    command = "python bench/ui.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    t0 = time.perf_counter()
    report = {"command": command, "machine": common.machine()}
    result = run(quick=args.quick, log=common.log)
    return common.finish_run("ui", result, report, t0, markdown, args.out, args.quick)


if __name__ == "__main__":
    raise SystemExit(main())
