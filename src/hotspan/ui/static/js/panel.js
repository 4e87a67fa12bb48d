// A profile panel: toolbar (search, root top/bottom, reset zoom, view, export), the top table
// and the flame graph side by side (stacked on narrow screens).  Views (profiles, diff, trace
// spans, endpoints) hand it the protojson flame graph the API returned; it decodes, draws and
// exports it, and offers the sandwich view and a right-click menu on functions.
//
// URL state.  What the user does in the panel that a shared link should keep is handed to the
// view through callbacks, and handed back through options when the page loads (all strings,
// "" = the default; the callbacks fire on the user's actions only, never for the initial
// values nor from setData):
//   search / onSearch       the search box's text
//   zoom / onZoom           the zoomed frame: root-first frame names joined by ";", without
//                           the "total" root ("main;app.handle;json.dumps"); a path the data
//                           lacks shows the whole graph
//   sort / onSort           the top table's sort, "<column>:<asc|desc>"; columns name, self,
//                           total, and in a diff name, selfLeft, totalLeft, selfRight,
//                           totalRight, change
//   sandwich / onSandwich   the function the sandwich view is on ("" = not in that view)
// setData keeps zoom and sandwich when the new data still has them (a reload, a new range).

import { debounce, download, el, message } from "./dom.js";
import { standaloneHtml } from "./export.js";
import { FlameGraph } from "./flamegraph.js";
import { openFrameMenu } from "./framemenu.js";
import { decodeFlamegraph, foldedText } from "./flametree.js";
import { formatPercent, formatValue } from "./format.js";
import { sandwich } from "./sandwich.js";
import { sourceLocations } from "./source.js";
import { TopTable } from "./toptable.js";

const INVERTED_KEY = "hotspan.flamegraph.inverted";
const VIEW_KEY = "hotspan.flamegraph.view";
const NARROW = 1100; // px: below, the table goes above the graph (flamegraph.css)
// px: the least height of a table beside the graph, which otherwise is as tall as the graph.
const TABLE_BESIDE_MIN = 360;
const VIEWS = [
  ["both", "Both"],
  ["table", "Top table"],
  ["flamegraph", "Flame graph"],
  ["sandwich", "Sandwich"],
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
   *   exports?: () => ServerExport[], search?: string, onSearch?: (text: string) => void,
   *   zoom?: string, onZoom?: (zoom: string) => void, sort?: string,
   *   onSort?: (sort: string) => void, sandwich?: string,
   *   onSandwich?: (name: string) => void,
   *   frameLinks?: (name: string) => {key: string, label: string, href: string}[]}} [options]
   *   the URL state, see the top of the file; `frameLinks`: the view's links in a function's
   *   menu
   */
  constructor(
    container,
    {
      unit = "",
      title = "",
      exportName = "flamegraph",
      exports = null,
      search = "",
      onSearch = null,
      zoom = "",
      onZoom = null,
      sort = "",
      onSort = null,
      sandwich: sandwichName = "",
      onSandwich = null,
      frameLinks = null,
    } = {},
  ) {
    this.container = container;
    this.frameLinks = frameLinks;
    this.unit = unit;
    this.title = title;
    this.exportName = exportName;
    this.serverExports = exports;
    this.tree = null;
    this.zoomState = zoom || "";
    this.onZoom = onZoom;
    this.sandwichName = sandwichName || "";
    this.onSandwich = onSandwich;
    this.sources = null; // {tree, promise} of the source lookup for the shown data
    this.menu = null; // the frame menu this panel opened, while open
    this.inverted = stored(INVERTED_KEY, "false") === "true";
    // The sandwich view is only ever entered with a function, from the URL or the menu.
    this.view = this.sandwichName ? "sandwich" : stored(VIEW_KEY, "both");
    if (this.view === "sandwich" && !this.sandwichName) this.view = "both";
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
      { type: "button", class: "hs-reset", disabled: true, onclick: () => this.activeGraphsResetZoom() },
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
    this.sandwichTitle = el("h3", { class: "hs-sandwich-title" });
    this.callersNode = el("div", { class: "hs-sandwich-callers" });
    this.calleesNode = el("div", { class: "hs-sandwich-callees" });
    this.sandwichNote = el("div", { class: "hs-sandwich-note" });
    this.sandwichNode = el(
      "div",
      { class: "hs-panel-sandwich", hidden: true },
      this.sandwichTitle,
      this.sandwichNote,
      el(
        "div",
        { class: "hs-sandwich-label" },
        "Callers (who called it: the function at the bottom, its callers above it)",
      ),
      this.callersNode,
      el(
        "div",
        { class: "hs-sandwich-label" },
        "Callees (what it called: the function at the top, its callees below it)",
      ),
      this.calleesNode,
    );
    this.graphs = el("div", { class: "hs-panel-graphs" }, this.graphNode, this.sandwichNode);
    this.body = el("div", { class: "hs-panel-body" }, this.tableNode, this.graphs);
    this.messageNode = el("div", { class: "hs-panel-message", hidden: true });
    container.append(el("div", { class: "hs-panel-head" }, this.titleNode), toolbar, this.messageNode, this.body);

    this.graph = new FlameGraph(this.graphNode, { unit, inverted: this.inverted });
    this.callers = null; // the sandwich's graphs, made when first shown
    this.callees = null;
    this.table = new TopTable(this.tableNode, {
      unit,
      sort,
      onSort,
      onSelect: (name) => {
        if (this.view === "sandwich") {
          if (name) this.setSandwich(name, { notify: true });
        } else {
          this.graph.highlight(name);
        }
      },
      onMenu: (name, x, y) => this.openMenu({ name, x, y }),
    });
    this.graphNode.addEventListener("hs-zoom", (e) => {
      this.resetButton.disabled = !e.detail.name && !e.detail.ranged;
      const path = e.detail.path || "";
      if (path !== this.zoomState) {
        this.zoomState = path;
        if (this.onZoom) this.onZoom(path);
      }
    });
    for (const node of [this.graphNode, this.callersNode, this.calleesNode]) {
      node.addEventListener("hs-frame-menu", (e) => {
        e.preventDefault();
        const { node: frame, name, clientX, clientY, graph } = e.detail;
        this.openMenu({ name, x: clientX, y: clientY, graph, frame });
      });
    }
    for (const node of [this.callersNode, this.calleesNode]) {
      node.addEventListener("hs-zoom", () => this.updateResetButton());
    }
    // The layout follows the panel's own width (a view may give it a narrow column).
    if (typeof ResizeObserver !== "undefined") {
      this.resizeObserver = new ResizeObserver(() => {
        this.fitWidth();
        this.fitTableHeight();
      });
      this.resizeObserver.observe(container);
      this.resizeObserver.observe(this.graphs);
    }
    this.fitWidth();
    this.setInverted(this.inverted);
    this.setView(this.view);
    this.setLoading("Loading…");
  }

  /**
   * Decodes and shows a protojson FlameGraph or FlameGraphDiff.  Search, view, sort, zoom
   * and the sandwich'd function are kept (where the new data has them); the table's
   * selection starts afresh.
   */
  setData(flamegraphJson, { unit, title } = {}) {
    if (unit !== undefined) {
      this.unit = unit;
      for (const g of [this.graph, ...this.sandwichGraphs()]) g.setUnit(unit);
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
    this.sources = null;
    // Its own menu only: another panel's answer arriving must not close the one a user opened.
    this.closeMenu();
    this.container.classList.toggle("hs-panel-diff", tree.diff);
    this.graph.setData(tree);
    // The zoom the URL asked for, or the user's, wherever the new data has it.
    if (this.zoomState) this.graph.restoreZoom(this.zoomState);
    this.table.setData(tree);
    this.updateResetButton();
    this.renderExports();
    this.applySearch();
    this.renderSandwich();
  }

  /** The zoom as the URL keeps it (see the top of the file); "" = whole graph. */
  setZoom(path) {
    this.zoomState = path || "";
    if (this.tree) {
      if (this.zoomState) this.graph.restoreZoom(this.zoomState);
      else this.graph.restoreZoom("");
      this.updateResetButton();
    }
  }

  /** Sorts the table as the URL says ("column:asc|desc"). */
  setSort(sort) {
    this.table.setSort(sort);
  }

  /**
   * Shows the sandwich view on function `name` ("" leaves it for the flame graph).
   * `notify`: tell onSandwich (a user's action, not the URL's own state).
   */
  setSandwich(name, { notify = false } = {}) {
    const before = this.sandwichName;
    this.sandwichName = name || "";
    if (this.sandwichName) this.showView("sandwich");
    else if (this.view === "sandwich") this.showView(stored(VIEW_KEY, "both"));
    this.renderSandwich();
    if (notify && before !== this.sandwichName && this.onSandwich) this.onSandwich(this.sandwichName);
  }

  renderSandwich() {
    if (this.view !== "sandwich" || !this.tree) return;
    const name = this.sandwichName;
    this.table.select(name || null);
    const result = name ? sandwich(this.tree, name) : null;
    const show = Boolean(result);
    this.callersNode.hidden = !show;
    this.calleesNode.hidden = !show;
    for (const label of this.sandwichNode.querySelectorAll(".hs-sandwich-label")) label.hidden = !show;
    if (!name) {
      this.sandwichTitle.textContent = "Sandwich";
      this.sandwichNote.textContent =
        "Pick a function: click its row in the table, or right-click a frame and choose Sandwich.";
      return;
    }
    this.sandwichTitle.textContent = name;
    this.sandwichTitle.title = name;
    if (!result) {
      this.sandwichNote.textContent = `${name} is not in this profile.`;
      return;
    }
    this.sandwichNote.textContent = "";
    if (!this.callers) {
      this.callers = new FlameGraph(this.callersNode, { unit: this.unit, inverted: true });
      this.callees = new FlameGraph(this.calleesNode, { unit: this.unit, inverted: false });
    }
    this.callers.setData(result.callers);
    this.callees.setData(result.callees);
    this.callers.search(this.searchInput.value);
    this.callees.search(this.searchInput.value);
  }

  /** A table beside the graph is no taller than the graph (or TABLE_BESIDE_MIN): a shallow
   * profile's graph is 100 px high, and an 80vh table beside it left the rest of the page
   * empty under the graph.  Above the graph (narrow, diff) the stylesheet's height holds. */
  fitTableHeight() {
    const table = this.tableNode.getBoundingClientRect();
    const graphs = this.graphs.getBoundingClientRect();
    const beside = !this.tableNode.hidden && !this.graphs.hidden && Math.abs(table.top - graphs.top) < 2;
    this.tableNode.style.maxHeight = beside ? `${Math.max(Math.round(graphs.height), TABLE_BESIDE_MIN)}px` : "";
  }

  fitWidth() {
    const width = this.container.getBoundingClientRect().width;
    if (width > 0) this.container.classList.toggle("hs-panel-narrow", width < NARROW);
  }

  /** The sandwich view's two graphs, once made. */
  sandwichGraphs() {
    return this.callers ? [this.callers, this.callees] : [];
  }

  activeGraphsResetZoom() {
    if (this.view === "sandwich") {
      for (const g of this.sandwichGraphs()) g.resetZoom();
    } else {
      this.graph.resetZoom();
    }
    this.updateResetButton();
  }

  updateResetButton() {
    const zoomed = (g) => g.zoomed > 0 || g.range !== null;
    this.resetButton.disabled = this.view === "sandwich" ? !this.sandwichGraphs().some(zoomed) : !zoomed(this.graph);
  }

  /**
   * The source location of a function, from the view's pprof exports (fetched once per data;
   * a diff has one per side, and a function may be on one side only).
   */
  sourceOf(name) {
    const pprofs = ((this.serverExports && this.serverExports()) || []).filter(
      (x) => x.key === "pprof" || /^pprof\b/i.test(String(x.label)),
    );
    if (!pprofs.length || !this.tree) return null;
    if (!this.sources || this.sources.tree !== this.tree) {
      const promise = Promise.all(pprofs.map((x) => Promise.resolve(x.fetch()).then(sourceLocations))).then((maps) => {
        const merged = new Map();
        for (const map of maps) for (const [k, v] of map) if (!merged.has(k)) merged.set(k, v);
        return merged;
      });
      this.sources = { tree: this.tree, promise };
      // A failed fetch is tried again at the next menu, not remembered.
      promise.catch(() => {
        if (this.sources && this.sources.promise === promise) this.sources = null;
      });
    }
    return this.sources.promise.then((map) => map.get(name) || null);
  }

  /** Closes the frame menu this panel opened, if it is still open (not another panel's). */
  closeMenu() {
    if (this.menu) this.menu.close();
    this.menu = null;
  }

  /** The function menu, for a frame (`graph`, `frame`) or a table row (name only). */
  openMenu({ name, x, y, graph = null, frame = -1 }) {
    if (!this.tree) return;
    const main = graph === null || graph === this.graph;
    let zoom = null;
    if (graph && frame > 0) {
      zoom = () => {
        if (main && this.view === "sandwich") this.showView(stored(VIEW_KEY, "both"));
        graph.zoomTo(frame);
      };
    } else if (main && this.graph.widestFrame(name) > 0) {
      zoom = () => {
        if (this.view === "sandwich") {
          this.sandwichName = "";
          this.showView(stored(VIEW_KEY, "both"));
          if (this.onSandwich) this.onSandwich("");
        }
        this.graph.zoomTo(name);
      };
    }
    this.menu = openFrameMenu({
      name,
      x,
      y,
      zoom,
      sandwich: () => this.setSandwich(name, { notify: true }),
      search: () => {
        this.searchInput.value = name;
        this.searchInput.dispatchEvent(new Event("input"));
        this.searchInput.focus();
      },
      source: () => this.sourceOf(name),
      links: this.frameLinks ? this.frameLinks(name) : [],
    });
  }

  setTitle(title) {
    this.title = title;
    this.titleNode.textContent = title;
  }

  /**
   * Shows that data is on its way: placeholder bars in the shape of a table and a flame
   * graph, or, while an older graph is shown (it stays until the new data comes), a moving
   * strip above it.  `text` is read out and shown beside the bars.
   */
  setLoading(text = "Loading…") {
    const keep = Boolean(this.tree);
    const note = el("p", { class: "hs-loading hs-skeleton-text", role: "status" }, text);
    if (keep) {
      this.setMessage(
        el("div", { class: "hs-skeleton hs-skeleton-strip" }, note, el("div", { class: "hs-skeleton-progress" })),
        { keepBody: true },
      );
      return;
    }
    const bars = (n, cls) => Array.from({ length: n }, () => el("div", { class: `hs-skeleton-bar ${cls}` }));
    this.setMessage(
      el(
        "div",
        { class: "hs-skeleton", "aria-busy": "true" },
        note,
        el(
          "div",
          { class: "hs-skeleton-body" },
          el("div", { class: "hs-skeleton-table" }, bars(8, "hs-skeleton-row")),
          el("div", { class: "hs-skeleton-graph" }, bars(6, "hs-skeleton-level")),
        ),
      ),
    );
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

  /** "both", "table", "flamegraph" or "sandwich" (the user's choice, from the buttons). */
  setView(view) {
    if (!VIEWS.some(([key]) => key === view)) view = "both";
    const wasSandwich = this.view === "sandwich" && this.sandwichName;
    if (view !== "sandwich") store(VIEW_KEY, view);
    this.showView(view);
    if (view === "sandwich") {
      // Straight onto the function the table has selected, if any.
      const picked = this.sandwichName || this.table.selected || "";
      if (picked && picked !== this.sandwichName) this.setSandwich(picked, { notify: true });
      else this.renderSandwich();
    } else if (wasSandwich) {
      this.sandwichName = "";
      if (this.onSandwich) this.onSandwich("");
    }
  }

  showView(view) {
    this.view = view;
    this.body.dataset.view = view;
    this.tableNode.hidden = view === "flamegraph";
    this.graphs.hidden = view === "table";
    this.graphNode.hidden = view === "sandwich";
    this.sandwichNode.hidden = view !== "sandwich";
    for (const b of this.viewButtons) {
      b.classList.toggle("hs-active", b.dataset.view === view);
      b.setAttribute("aria-pressed", String(b.dataset.view === view));
    }
    this.graph.highlight(view === "sandwich" ? null : this.table.selected);
    this.graph.requestDraw();
    for (const g of this.sandwichGraphs()) g.requestDraw();
    if (this.resetButton) this.updateResetButton();
  }

  applySearch() {
    const text = this.searchInput.value;
    const result = this.graph.search(text);
    for (const g of this.sandwichGraphs()) g.search(text);
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
      {
        key: "folded",
        label: "Folded text",
        filename: `${this.exportName}.folded.txt`,
        build: () => foldedText(this.tree),
        type: "text/plain",
      },
      {
        key: "html",
        label: "Standalone HTML",
        filename: `${this.exportName}.html`,
        build: () =>
          standaloneHtml(this.tree, {
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
    this.closeMenu();
    if (this.reportSearch) this.reportSearch.cancel();
    if (this.resizeObserver) this.resizeObserver.disconnect();
    this.graph.destroy();
    this.table.destroy();
    for (const g of this.sandwichGraphs()) g.destroy();
  }
}
