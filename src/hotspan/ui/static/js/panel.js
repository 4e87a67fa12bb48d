// A profile panel: toolbar (search, root top/bottom, reset zoom, view, export), the top table
// and the flame graph side by side.  Views (profiles, diff, trace spans) hand it the
// protojson flame graph the API returned; it decodes, draws and exports it.

import { debounce, download, el, message } from "./dom.js";
import { standaloneHtml } from "./export.js";
import { FlameGraph } from "./flamegraph.js";
import { decodeFlamegraph, foldedText } from "./flametree.js";
import { formatPercent, formatValue } from "./format.js";
import { TopTable } from "./toptable.js";

const INVERTED_KEY = "hotspan.flamegraph.inverted";
const VIEW_KEY = "hotspan.flamegraph.view";
const VIEWS = [
  ["both", "Both"],
  ["table", "Top table"],
  ["flamegraph", "Flame graph"],
];

function stored(key, fallback) {
  try {
    return localStorage.getItem(key) ?? fallback;
  } catch {
    return fallback; // storage can be disabled; the defaults still work
  }
}

function store(key, value) {
  try {
    localStorage.setItem(key, value);
  } catch {
    // Not remembered, nothing else lost.
  }
}

/**
 * @typedef {Object} ServerExport
 * @property {string} label      button text, e.g. "pprof"
 * @property {string} filename
 * @property {() => Promise<Blob|ArrayBuffer>} fetch
 * @property {string} [key]      data-export value (default: derived from the label, "pprof")
 */

export class ProfilePanel {
  /**
   * @param {HTMLElement} container
   * @param {{unit?: string, title?: string, exportName?: string,
   *   exports?: () => ServerExport[], search?: string,
   *   onSearch?: (text: string) => void}} [options] `search`: the search to start with (from
   *   the view's URL); `onSearch`: told of each change, so the view can keep it in its URL
   */
  constructor(
    container,
    { unit = "", title = "", exportName = "flamegraph", exports = null, search = "", onSearch = null } = {},
  ) {
    this.container = container;
    this.unit = unit;
    this.title = title;
    this.exportName = exportName;
    this.serverExports = exports;
    this.tree = null;
    this.inverted = stored(INVERTED_KEY, "false") === "true";
    this.view = stored(VIEW_KEY, "both");
    container.classList.add("hs-panel");
    container.panel = this;

    this.titleNode = el("h2", { class: "hs-panel-title" }, title);
    this.searchInput = el("input", {
      type: "search",
      class: "hs-search",
      placeholder: "Search functions",
      "aria-label": "Search functions",
      value: search,
      oninput: () => {
        this.applySearch();
        if (onSearch) this.reportSearch(this.searchInput.value);
      },
    });
    this.reportSearch = debounce((text) => onSearch(text.trim()), 300);
    this.searchInfo = el("span", { class: "hs-search-info", "aria-live": "polite" });
    this.invertButton = el("button", {
      type: "button",
      class: "hs-invert",
      title: "Draw the root frame at the top (icicle) or at the bottom (flame)",
      onclick: () => this.setInverted(!this.inverted),
    });
    this.resetButton = el(
      "button",
      { type: "button", class: "hs-reset", disabled: true, onclick: () => this.graph.resetZoom() },
      "Reset zoom",
    );
    this.viewButtons = VIEWS.map(([key, label]) =>
      el(
        "button",
        { type: "button", class: "hs-view", dataset: { view: key }, onclick: () => this.setView(key) },
        label,
      ),
    );
    this.exportMenu = el("div", { class: "hs-export-menu", role: "menu" });
    this.exportDetails = el(
      "details",
      { class: "hs-export" },
      el("summary", { class: "hs-export-summary" }, "Export"),
      this.exportMenu,
    );
    this.exportDetails.addEventListener("toggle", () => {
      if (this.exportDetails.open) this.renderExports();
    });
    this.exportStatus = el("span", { class: "hs-export-status", "aria-live": "polite" });

    const toolbar = el(
      "div",
      { class: "hs-panel-toolbar" },
      this.searchInput,
      this.searchInfo,
      el("span", { class: "hs-panel-spacer" }),
      this.invertButton,
      this.resetButton,
      el("span", { class: "hs-view-group", role: "group", "aria-label": "View" }, this.viewButtons),
      this.exportDetails,
      this.exportStatus,
    );
    this.tableNode = el("div", { class: "hs-panel-table" });
    this.graphNode = el("div", { class: "hs-panel-graph" });
    this.body = el("div", { class: "hs-panel-body" }, this.tableNode, this.graphNode);
    this.messageNode = el("div", { class: "hs-panel-message", hidden: true });
    container.append(el("div", { class: "hs-panel-head" }, this.titleNode), toolbar, this.messageNode, this.body);

    this.graph = new FlameGraph(this.graphNode, { unit, inverted: this.inverted });
    this.table = new TopTable(this.tableNode, {
      unit,
      onSelect: (name) => this.graph.highlight(name),
    });
    this.graphNode.addEventListener("hs-zoom", (e) => {
      this.resetButton.disabled = !e.detail.name;
    });
    this.setInverted(this.inverted);
    this.setView(this.view);
    this.setLoading("Loading…");
  }

  /**
   * Decodes and shows a protojson FlameGraph or FlameGraphDiff.  Search and view are kept;
   * zoom and the table's selection start afresh.
   */
  setData(flamegraphJson, { unit, title } = {}) {
    if (unit !== undefined) {
      this.unit = unit;
      this.graph.setUnit(unit);
      this.table.setUnit(unit);
    }
    if (title !== undefined) this.setTitle(title);
    const tree = decodeFlamegraph(flamegraphJson);
    this.tree = tree;
    if (!tree.nodeCount || !tree.total) {
      this.setMessage(
        message(
          "empty",
          "No samples in this selection.",
          "Widen the time range, check the label selector and the profile type, or check that an agent is sending profiles to this server.",
        ),
      );
      return;
    }
    this.messageNode.hidden = true;
    this.messageNode.replaceChildren();
    this.body.hidden = false;
    this.container.classList.toggle("hs-panel-diff", tree.diff);
    this.graph.setData(tree);
    this.table.setData(tree);
    this.resetButton.disabled = true;
    this.renderExports();
    this.applySearch();
  }

  setTitle(title) {
    this.title = title;
    this.titleNode.textContent = title;
  }

  /** Shows a loading note in place of the graph (the last graph stays until data comes). */
  setLoading(text = "Loading…") {
    this.setMessage(el("p", { class: "hs-loading" }, text), { keepBody: Boolean(this.tree) });
  }

  /** Shows a node (usually dom.message(...)) instead of the graph and table. */
  setMessage(node, { keepBody = false } = {}) {
    this.messageNode.replaceChildren(node);
    this.messageNode.hidden = false;
    this.body.hidden = !keepBody;
    if (!keepBody) {
      this.tree = null;
      this.renderExports();
    }
  }

  setInverted(inverted) {
    this.inverted = Boolean(inverted);
    store(INVERTED_KEY, String(this.inverted));
    this.graph.setInverted(this.inverted);
    this.invertButton.textContent = this.inverted ? "Root: bottom" : "Root: top";
    this.invertButton.setAttribute("aria-pressed", String(this.inverted));
  }

  /** "both", "table" or "flamegraph". */
  setView(view) {
    if (!VIEWS.some(([key]) => key === view)) view = "both";
    this.view = view;
    store(VIEW_KEY, view);
    this.body.dataset.view = view;
    this.tableNode.hidden = view === "flamegraph";
    this.graphNode.hidden = view === "table";
    for (const b of this.viewButtons) {
      b.classList.toggle("hs-active", b.dataset.view === view);
      b.setAttribute("aria-pressed", String(b.dataset.view === view));
    }
    this.graph.requestDraw();
  }

  applySearch() {
    const text = this.searchInput.value;
    const result = this.graph.search(text);
    this.table.setFilter(text);
    const tree = this.tree;
    if (!text.trim() || !tree) {
      this.searchInfo.textContent = "";
      return;
    }
    const total = tree.diff ? tree.rightTotal : tree.total;
    this.searchInfo.textContent = result.matches
      ? `${result.matches} ${result.matches === 1 ? "frame" : "frames"}, ${formatValue(result.value, this.unit)} (${formatPercent(result.value, total)})`
      : "no match";
  }

  exportList() {
    const list = [
      { key: "folded", label: "Folded text", filename: `${this.exportName}.folded.txt`, build: () => foldedText(this.tree), type: "text/plain" },
      {
        key: "html",
        label: "Standalone HTML",
        filename: `${this.exportName}.html`,
        build: () => standaloneHtml(this.tree, {
          title: this.title || this.exportName,
          unit: this.unit,
          inverted: this.inverted,
        }),
        type: "text/html",
      },
    ];
    for (const x of (this.serverExports && this.serverExports()) || []) {
      const key = x.key || String(x.label).toLowerCase().split(/\s+/)[0] || "server";
      list.push({ key, label: x.label, filename: x.filename, build: x.fetch, type: "application/octet-stream" });
    }
    return list;
  }

  renderExports() {
    this.exportMenu.replaceChildren(
      ...this.exportList().map((x) =>
        el(
          "button",
          {
            type: "button",
            role: "menuitem",
            class: "hs-export-item",
            dataset: { export: x.key },
            disabled: !this.tree,
            onclick: () => this.runExport(x),
          },
          x.label,
        ),
      ),
    );
  }

  async runExport(x) {
    if (!this.tree) return;
    this.exportStatus.textContent = `Preparing ${x.label}…`;
    try {
      const data = await x.build();
      download(x.filename, data instanceof ArrayBuffer ? new Blob([data]) : data, x.type);
      this.exportStatus.textContent = "";
      this.exportDetails.open = false;
    } catch (err) {
      this.exportStatus.textContent = `${x.label} export failed: ${err.message}`;
    }
  }

  destroy() {
    this.graph.destroy();
  }
}
