// A flame graph as one self-contained HTML file: it opens from file:// with no network and
// no server, and keeps hover tooltips, click to zoom, search and the root top/bottom toggle.
//
// The page's own modules are fetched and inlined as one classic script (module scripts do
// not load from file://): format.js, flametree.js and flamegraph.js import nothing else and
// keep their top-level names distinct, so stripping import/export is enough.

const INLINED_SCRIPTS = ["format.js", "flametree.js", "flamegraph.js"];
const STATIC_ROOT = new URL("../", import.meta.url);

async function fetchText(path) {
  const response = await fetch(new URL(path, STATIC_ROOT));
  if (!response.ok) throw new Error(`cannot read ${path} from the server (HTTP ${response.status})`);
  return response.text();
}

/** A module's source as classic script text: no import statements, no export keywords. */
export function stripModule(source) {
  return source
    .replace(/^\s*import\s[^;]*?from\s*["'][^"']+["'];?[ \t]*$/gm, "")
    .replace(/^export\s+(?=(async\s+)?(function|class|const|let|var)\b)/gm, "");
}

// Inside <script>, "</script" (any case) would end the element early; "<\/" means the same
// to JavaScript.  Our own sources never contain "<!--".
function scriptSafe(text) {
  return text.replace(/<\/(script)/gi, "<\\/$1");
}

// JSON data: "<" only occurs inside strings, where \u003c is the same character.
function jsonSafe(text) {
  return text.replace(/</g, "\\u003c");
}

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

// Runs in the exported file, after the inlined modules.
const STANDALONE_MAIN = `
(function () {
  var data = JSON.parse(document.getElementById("hs-data").textContent);
  var tree = decodeFlamegraph(data.flamegraph);
  var holder = document.getElementById("hs-graph");
  var graph = new FlameGraph(holder, { unit: data.unit, inverted: data.inverted });
  graph.setData(tree);
  var search = document.getElementById("hs-search");
  var found = document.getElementById("hs-found");
  search.addEventListener("input", function () {
    var r = graph.search(search.value);
    found.textContent = search.value.trim()
      ? r.matches + (r.matches === 1 ? " frame, " : " frames, ") +
        formatPercent(r.value, tree.diff ? tree.rightTotal : tree.total) + " of the total"
      : "";
  });
  document.getElementById("hs-total").textContent = tree.diff
    ? "baseline " + formatValue(tree.leftTotal, data.unit) + ", comparison " + formatValue(tree.rightTotal, data.unit)
    : "total " + formatValue(tree.total, data.unit);
  var invert = document.getElementById("hs-invert");
  invert.textContent = graph.inverted ? "Root: bottom" : "Root: top";
  invert.addEventListener("click", function () {
    graph.setInverted(!graph.inverted);
    invert.textContent = graph.inverted ? "Root: bottom" : "Root: top";
  });
  document.getElementById("hs-reset").addEventListener("click", function () { graph.resetZoom(); });
})();
`;

/**
 * The standalone HTML for a tree (decoded from the JSON it carries in `tree.source`).
 * @param {import("./flametree.js").FlameTree} tree
 * @param {{title?: string, unit?: string, inverted?: boolean}} [options] `inverted`: the root
 *   at the bottom, as the user had it when exporting
 * @returns {Promise<string>}
 */
export async function standaloneHtml(tree, { title = "hotspan flame graph", unit = "", inverted = false } = {}) {
  const [css, ...scripts] = await Promise.all([
    fetchText("css/flamegraph.css"),
    ...INLINED_SCRIPTS.map((name) => fetchText(`js/${name}`)),
  ]);
  const code = scripts.map((s, i) => `// --- ${INLINED_SCRIPTS[i]}\n${stripModule(s)}`).join("\n");
  const data = JSON.stringify({ unit, inverted: Boolean(inverted), flamegraph: tree.source });
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<style>
body { font: 14px system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px; color: #1f1f1f; }
h1 { font-size: 16px; margin: 0 0 4px; }
.hs-standalone-meta { color: #666; margin: 0 0 10px; font-size: 12px; }
.hs-standalone-toolbar { display: flex; gap: 8px; align-items: center; margin-bottom: 8px; }
${css}
</style>
</head>
<body>
<h1>${escapeHtml(title)}</h1>
<p class="hs-standalone-meta">Exported from hotspan ${escapeHtml(new Date().toISOString())} — <span id="hs-total"></span>. Click a frame to zoom into it, click the root frame ("total") to zoom out.</p>
<div class="hs-standalone-toolbar">
<input id="hs-search" class="hs-search" type="search" placeholder="Search functions" aria-label="Search functions">
<span id="hs-found"></span>
<button id="hs-invert" type="button" title="Draw the root frame at the top or at the bottom">Root: top</button>
<button id="hs-reset" type="button">Reset zoom</button>
</div>
<div id="hs-graph"></div>
<script type="application/json" id="hs-data">${jsonSafe(data)}</script>
<script>
${scriptSafe(code)}
${STANDALONE_MAIN}
</script>
</body>
</html>
`;
}
