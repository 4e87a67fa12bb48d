// A flame graph as one self-contained HTML file: it opens from file:// with no network and
// no server, and keeps hover tooltips, click to zoom, search and the root top/bottom toggle.
//
// The page's own modules are fetched and inlined as one classic script (module scripts do
// not load from file://): format.js, flametree.js, search.js and flamegraph.js import nothing
// else and keep their top-level names distinct, so stripping import/export is enough.  The
// page itself is static/standalone.html, which the command line (hotspan/ui/standalone.py)
// fills in the same way: keep the two in step.

const INLINED_SCRIPTS = ["format.js", "flametree.js", "search.js", "flamegraph.js"];
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

/** The page template (static/standalone.html, shared with the command line) filled in: each
 * {{name}} replaced once, in one pass, so the inlined sources are never rescanned. */
export function fillTemplate(template, values) {
  return template.replace(/\{\{(\w+)\}\}/g, (whole, key) => (key in values ? values[key] : whole));
}

/**
 * The standalone HTML for a tree (decoded from the JSON it carries in `tree.source`).
 * @param {import("./flametree.js").FlameTree} tree
 * @param {{title?: string, unit?: string, inverted?: boolean}} [options] `inverted`: the root
 *   at the bottom, as the user had it when exporting
 * @returns {Promise<string>}
 */
export async function standaloneHtml(tree, { title = "hotspan flame graph", unit = "", inverted = false } = {}) {
  const [template, css, ...scripts] = await Promise.all([
    fetchText("standalone.html"),
    fetchText("css/flamegraph.css"),
    ...INLINED_SCRIPTS.map((name) => fetchText(`js/${name}`)),
  ]);
  const code = scripts.map((s, i) => `// --- ${INLINED_SCRIPTS[i]}\n${stripModule(s)}`).join("\n");
  const data = JSON.stringify({ unit, inverted: Boolean(inverted), flamegraph: tree.source });
  return fillTemplate(template, {
    title: escapeHtml(title),
    exported: escapeHtml(new Date().toISOString()),
    css,
    data: jsonSafe(data),
    scripts: scriptSafe(code),
  });
}
