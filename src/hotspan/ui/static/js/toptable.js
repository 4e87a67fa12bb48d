// The top table beside the flame graph: one row per function with self and total (and, for
// a diff, how its share changed), sortable by any column.  A row click selects the function,
// which the panel passes on to the flame graph as a highlight.

import { el } from "./dom.js";
import { diffColor, shareChange, topTable } from "./flametree.js";
import { formatChange } from "./flamegraph.js";
import { formatPercent, formatValue } from "./format.js";

// Enough rows to cover what anyone reads; the rest render on demand (a 10k-function table
// would cost more than the flame graph).
const PAGE_ROWS = 200;

/**
 * @typedef {Object} Column
 * @property {string} key
 * @property {string} label
 * @property {(row: Object) => number|string} sortValue
 * @property {(row: Object) => Node|string} cell
 * @property {string} [title]
 */

export class TopTable {
  /**
   * @param {HTMLElement} container
   * @param {{unit?: string, onSelect?: (name: string|null) => void}} [options]
   */
  constructor(container, { unit = "", onSelect = () => {} } = {}) {
    this.container = container;
    this.unit = unit;
    this.onSelect = onSelect;
    this.rows = [];
    this.tree = null;
    this.sortKey = "self";
    this.descending = true;
    this.selected = null;
    this.filter = "";
    this.limit = PAGE_ROWS;
    container.classList.add("hs-toptable");
    container.toptable = this;
    this.thead = el("thead");
    this.tbody = el("tbody", { onclick: (e) => this.onRowClick(e) });
    this.table = el("table", { class: "hs-toptable-table" }, this.thead, this.tbody);
    this.more = el("button", { type: "button", class: "hs-toptable-more", hidden: true });
    this.more.addEventListener("click", () => {
      this.limit = Infinity;
      this.renderBody();
    });
    container.append(this.table, this.more);
  }

  setUnit(unit) {
    this.unit = unit;
  }

  /** @param {import("./flametree.js").FlameTree} tree */
  setData(tree) {
    this.tree = tree;
    this.rows = topTable(tree);
    if (tree.diff) {
      for (const r of this.rows) {
        r.change = shareChange(
          tree.leftTotal ? r.totalLeft / tree.leftTotal : 0,
          tree.rightTotal ? r.totalRight / tree.rightTotal : 0,
        );
      }
    } else if (this.sortKey === "change") {
      this.sortKey = "self";
    }
    this.selected = null;
    this.limit = PAGE_ROWS;
    this.renderHead();
    this.sortRows();
    this.renderBody();
  }

  /** Marks the row of `name` (null clears), without calling onSelect. */
  select(name) {
    this.selected = name || null;
    if (this.selected && !this.visibleRows().some((r) => r.name === this.selected)) {
      this.limit = Infinity;
      this.renderBody();
    }
    for (const tr of this.tbody.rows) {
      tr.classList.toggle("hs-selected", tr.dataset.name === this.selected);
    }
    const row = this.selected && this.rowElement(this.selected);
    if (row && row.scrollIntoView) row.scrollIntoView({ block: "nearest" });
  }

  /** Shows only functions whose name contains `text` (the panel's search). */
  setFilter(text) {
    this.filter = String(text || "").trim().toLowerCase();
    this.renderBody();
  }

  /** Sorts by a column; descending first for numbers, ascending for names. */
  sortBy(key, descending) {
    if (descending === undefined) {
      descending = key === this.sortKey ? !this.descending : key !== "name";
    }
    this.sortKey = key;
    this.descending = descending;
    this.renderHead();
    this.sortRows();
    this.renderBody();
  }

  rowElement(name) {
    for (const tr of this.tbody.rows) if (tr.dataset.name === name) return tr;
    return null;
  }

  // --- internals -----------------------------------------------------------------------

  /** @returns {Column[]} */
  columns() {
    const tree = this.tree;
    const unit = this.unit;
    const name = {
      key: "name",
      label: "Function",
      sortValue: (r) => r.name,
      cell: (r) => el("span", { class: "hs-toptable-name", title: r.name }, r.name),
    };
    const measure = (v, total, title) =>
      el(
        "span",
        { class: "hs-toptable-measure", title },
        el("span", { class: "hs-toptable-value" }, formatValue(v, unit)),
        el("span", { class: "hs-toptable-percent" }, formatPercent(v, total)),
      );
    if (!tree || !tree.diff) {
      return [
        name,
        { key: "self", label: "Self", sortValue: (r) => r.self, cell: (r) => measure(r.self, tree.total) },
        { key: "total", label: "Total", sortValue: (r) => r.total, cell: (r) => measure(r.total, tree.total) },
      ];
    }
    // Diff: the comparison side's values, with each side's share in the title; the change is
    // of the total's share, as the flame graph colours it.
    const sides = (left, right) =>
      `baseline ${formatValue(left, unit)} (${formatPercent(left, tree.leftTotal)}), ` +
      `comparison ${formatValue(right, unit)} (${formatPercent(right, tree.rightTotal)})`;
    return [
      name,
      {
        key: "self",
        label: "Self",
        title: "comparison side; hover a cell for both sides",
        sortValue: (r) => r.selfRight,
        cell: (r) => measure(r.selfRight, tree.rightTotal, sides(r.selfLeft, r.selfRight)),
      },
      {
        key: "total",
        label: "Total",
        title: "comparison side; hover a cell for both sides",
        sortValue: (r) => r.totalRight,
        cell: (r) => measure(r.totalRight, tree.rightTotal, sides(r.totalLeft, r.totalRight)),
      },
      {
        key: "change",
        label: "Change",
        title: "change of the share of the total, each side normalised by its own total",
        sortValue: (r) => (Number.isNaN(r.change) ? 0 : r.change === Infinity ? 1e12 : r.change),
        cell: (r) => {
          const span = el("span", { class: "hs-toptable-change" }, formatChange(r.change));
          const [red, green, blue] = diffColor(r.change);
          span.style.backgroundColor = `rgb(${red},${green},${blue})`;
          return span;
        },
      },
    ];
  }

  renderHead() {
    const cells = this.columns().map((col) => {
      const sorted = col.key === this.sortKey;
      return el(
        "th",
        {
          class: `hs-toptable-${col.key}`,
          "aria-sort": sorted ? (this.descending ? "descending" : "ascending") : "none",
          title: col.title || null,
        },
        el(
          "button",
          {
            type: "button",
            class: "hs-sort",
            dataset: { sort: col.key },
            onclick: () => this.sortBy(col.key),
          },
          col.label,
          el("span", { class: "hs-sort-mark", "aria-hidden": "true" }, sorted ? (this.descending ? "▼" : "▲") : ""),
        ),
      );
    });
    this.thead.replaceChildren(el("tr", {}, cells));
  }

  sortRows() {
    const col = this.columns().find((c) => c.key === this.sortKey) || this.columns()[1];
    const sign = this.descending ? -1 : 1;
    const byName = (a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
    this.rows.sort((a, b) => {
      const va = col.sortValue(a);
      const vb = col.sortValue(b);
      const c = typeof va === "string" ? byName(a, b) : va - vb;
      return c !== 0 ? sign * c : byName(a, b);
    });
  }

  visibleRows() {
    if (!this.filter) return this.rows;
    return this.rows.filter((r) => r.name.toLowerCase().includes(this.filter));
  }

  renderBody() {
    const cols = this.columns();
    const rows = this.visibleRows();
    const shown = rows.length > this.limit ? rows.slice(0, this.limit) : rows;
    const fragment = document.createDocumentFragment();
    for (const r of shown) {
      const tr = el(
        "tr",
        { dataset: { name: r.name }, class: r.name === this.selected ? "hs-selected" : null },
        cols.map((c) => el("td", { class: `hs-toptable-${c.key}` }, c.cell(r))),
      );
      fragment.append(tr);
    }
    if (!rows.length) {
      const text = this.filter ? `no function matches "${this.filter}"` : "no samples";
      fragment.append(el("tr", { class: "hs-toptable-empty" }, el("td", { colSpan: cols.length }, text)));
    }
    this.tbody.replaceChildren(fragment);
    this.more.hidden = rows.length <= shown.length;
    this.more.textContent = `Show all ${rows.length} functions`;
  }

  onRowClick(e) {
    const tr = e.target.closest("tr[data-name]");
    if (!tr) return;
    // A second click on the selected row clears the highlight.
    const name = tr.dataset.name === this.selected ? null : tr.dataset.name;
    this.select(name);
    this.onSelect(name);
  }
}
