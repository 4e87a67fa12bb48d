// The top table beside the flame graph: one row per function with self and total, sortable
// by any column.  A diff shows both sides next to each other (Baseline self/total, Comparison
// self/total) and the change of the share.  A row click selects the function, which the panel
// passes on to the flame graph as a highlight; a right click asks the panel for its menu.
//
// Names are cut from the left (CSS, see .hs-toptable-name) so the function, the end of the
// name, stays readable; the full name is in the title.

import { el } from "./dom.js";
import { diffColor, shareChange, topTable } from "./flametree.js";
import { formatChange } from "./flamegraph.js";
import { formatPercent, formatValue } from "./format.js";
import { nameMatcher } from "./search.js";

// Enough rows to cover what anyone reads; the rest render on demand (a 10k-function table
// would cost more than the flame graph).
const PAGE_ROWS = 200;

// Below these widths of the table's box (px) the table drops its less important numbers
// before it squeezes the names to a few characters (two "…s>.<genexpr>" rows read the same):
// a single profile first loses the self share; a diff first its self columns ("medium"),
// then the totals' values, keeping the shares and the change ("small").
const FULL_SINGLE = 440;
const FULL_DIFF = 760;
const MEDIUM_DIFF = 500;

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
   * @param {{unit?: string, onSelect?: (name: string|null) => void, sort?: string,
   *   onSort?: (sort: string) => void, onMenu?: (name: string, x: number, y: number) => void}}
   *   [options] `sort`: "column:asc|desc" to start with; `onSort`: told of the user's sorts
   */
  constructor(container, { unit = "", onSelect = () => {}, sort = "", onSort = null, onMenu = null } = {}) {
    this.container = container;
    this.unit = unit;
    this.onSelect = onSelect;
    this.onSort = onSort;
    this.onMenu = onMenu;
    this.wantedSort = sort;
    this.rows = [];
    this.tree = null;
    this.sortKey = "self";
    this.descending = true;
    this.selected = null;
    this.filter = "";
    this.matches = nameMatcher("");
    this.limit = PAGE_ROWS;
    this.fit = "full"; // "full" | "medium" | "small": see FULL_SINGLE
    container.classList.add("hs-toptable");
    container.toptable = this;
    this.thead = el("thead");
    this.tbody = el("tbody", {
      onclick: (e) => this.onRowClick(e),
      oncontextmenu: (e) => this.onRowMenu(e),
      onkeydown: (e) => this.onRowKey(e),
    });
    this.colgroup = el("colgroup");
    this.table = el("table", { class: "hs-toptable-table" }, this.colgroup, this.thead, this.tbody);
    this.more = el("button", { type: "button", class: "hs-toptable-more", hidden: true });
    this.more.addEventListener("click", () => {
      this.limit = Infinity;
      this.renderBody();
    });
    container.append(this.table, this.more);
    // The table's box follows the panel's layout, not the table's content (see
    // flamegraph.css), so redrawing on its width cannot feed back into it.
    if (typeof ResizeObserver !== "undefined") {
      this.resizeObserver = new ResizeObserver(() => this.refit());
      this.resizeObserver.observe(container);
    }
  }

  /** Which columns fit the table's box; redraws when that changes. */
  refit() {
    const width = this.container.clientWidth;
    if (!width) return; // hidden (another view): keep what it had
    const diff = Boolean(this.tree && this.tree.diff);
    const fit = diff
      ? width >= FULL_DIFF
        ? "full"
        : width >= MEDIUM_DIFF
          ? "medium"
          : "small"
      : width >= FULL_SINGLE
        ? "full"
        : "small";
    if (fit === this.fit) return;
    this.fit = fit;
    if (!this.tree) return;
    this.renderHead();
    this.renderBody();
  }

  destroy() {
    if (this.resizeObserver) this.resizeObserver.disconnect();
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
        r.shareLeft = tree.leftTotal ? r.totalLeft / tree.leftTotal : 0;
        r.shareRight = tree.rightTotal ? r.totalRight / tree.rightTotal : 0;
        r.change = shareChange(r.shareLeft, r.shareRight);
      }
    }
    this.applySort(this.wantedSort);
    this.selected = null;
    this.limit = PAGE_ROWS;
    this.fit = "";
    this.refit();
    if (!this.fit) this.fit = "full";
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
    if (row) this.scrollToRow(row);
  }

  /** Brings `row` into view inside the table's own scrolling box, never by scrolling the
   * page (scrollIntoView would: entering the sandwich view then put its function at the
   * bottom of the window, the graphs out of sight). */
  scrollToRow(row) {
    let box = row.parentElement;
    while (box && box !== this.container.parentElement) {
      const overflow = getComputedStyle(box).overflowY;
      if ((overflow === "auto" || overflow === "scroll") && box.scrollHeight > box.clientHeight) break;
      box = box.parentElement;
    }
    if (!box || box === this.container.parentElement) return;
    const r = row.getBoundingClientRect();
    const b = box.getBoundingClientRect();
    // The sticky header covers the top of the box.
    const head = this.container.querySelector("thead");
    const top = b.top + (head ? head.getBoundingClientRect().height : 0);
    if (r.top < top) box.scrollTop -= top - r.top;
    else if (r.bottom > b.bottom) box.scrollTop += r.bottom - b.bottom;
  }

  /** Shows only functions the panel's search finds (search.js). */
  setFilter(text) {
    this.filter = String(text || "").trim();
    this.matches = nameMatcher(this.filter);
    this.renderBody();
  }

  /** Sorts by a column; descending first for numbers, ascending for names. */
  sortBy(key, descending) {
    if (descending === undefined) {
      descending = key === this.sortKey ? !this.descending : key !== "name";
    }
    this.sortKey = key;
    this.descending = descending;
    this.wantedSort = this.sortState();
    this.renderHead();
    this.sortRows();
    this.renderBody();
  }

  /** The sort as "column:asc|desc" (what the URL keeps). */
  sortState() {
    return `${this.sortKey}:${this.descending ? "desc" : "asc"}`;
  }

  /**
   * Takes a sortState() string; one that names no column of this table (a diff column on a
   * single profile, garbage from a URL) falls back to the default: self descending, or for a
   * diff the change, the regressions first (as `hotspan diff` ranks them).
   */
  applySort(state) {
    const [key, order] = String(state || "").split(":");
    const keys = this.columns().map((c) => c.key);
    if (keys.includes(key)) {
      this.sortKey = key;
      this.descending = order !== "asc";
    } else {
      this.sortKey = this.tree && this.tree.diff ? "change" : "self";
      this.descending = true;
    }
  }

  /** Sorts as `state` says, keeping it for later data too; does not call onSort. */
  setSort(state) {
    this.wantedSort = state;
    if (!this.tree) return;
    this.applySort(state);
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
      cell: (r) =>
        el(
          "span",
          { class: "hs-toptable-name", title: r.name },
          el("span", { class: "hs-toptable-name-text" }, r.name),
        ),
    };
    // `show`: "both", or only the "value" or the "percent" where the table is narrow; the
    // title keeps both.
    const measure = (v, total, title, show = "both") => {
      const value = formatValue(v, unit);
      const percent = formatPercent(v, total);
      return el(
        "span",
        {
          class: "hs-toptable-measure",
          title: show === "both" ? title : `${title ? `${title}: ` : ""}${value}, ${percent}`,
        },
        show !== "percent" ? el("span", { class: "hs-toptable-value" }, value) : null,
        show !== "value" ? el("span", { class: "hs-toptable-percent" }, percent) : null,
      );
    };
    const small = this.fit === "small";
    if (!tree || !tree.diff) {
      return [
        name,
        {
          key: "self",
          label: "Self",
          sortValue: (r) => r.self,
          cell: (r) => measure(r.self, tree.total, "Self", small ? "value" : "both"),
        },
        { key: "total", label: "Total", sortValue: (r) => r.total, cell: (r) => measure(r.total, tree.total) },
      ];
    }
    // Diff: both sides side by side, each normalised by its own total; the change is of the
    // total's share, as the flame graph colours it.
    const side = (key, label, group, value, sideTotal) => ({
      key,
      label,
      group,
      title: `${group} ${label.toLowerCase()}: share of the ${group.toLowerCase()} total`,
      sortValue: value,
      cell: (r) => measure(value(r), sideTotal, `${group} ${label.toLowerCase()}`, small ? "percent" : "both"),
    });
    // A narrow table drops the `minor` columns: the totals and the change say what moved; the
    // self columns are for drilling in, on a wider screen.  (It still sorts by them.)
    return [
      name,
      { ...side("selfLeft", "Self", "Baseline", (r) => r.selfLeft, tree.leftTotal), minor: true },
      side("totalLeft", "Total", "Baseline", (r) => r.totalLeft, tree.leftTotal),
      { ...side("selfRight", "Self", "Comparison", (r) => r.selfRight, tree.rightTotal), minor: true },
      side("totalRight", "Total", "Comparison", (r) => r.totalRight, tree.rightTotal),
      {
        key: "change",
        label: "Change",
        title:
          "change of the share of the total, each side normalised by its own total; " +
          "sorts by how many points of the total the share moved (the default order of a diff)",
        // By points moved, not by the relative change: a function new at 0.01% is "new"
        // (an infinite change) but explains nothing, while one that went from 5% to 40% of
        // the total is the regression to look at first (as `hotspan diff` ranks them).
        sortValue: (r) => r.shareRight - r.shareLeft,
        cell: (r) => {
          const points = (r.shareRight - r.shareLeft) * 100;
          const span = el(
            "span",
            {
              class: "hs-toptable-change",
              title:
                `share of the total ${formatPercent(r.totalLeft, tree.leftTotal)} → ` +
                `${formatPercent(r.totalRight, tree.rightTotal)} ` +
                `(${points >= 0 ? "+" : ""}${points.toFixed(2)} points)`,
            },
            formatChange(r.change),
          );
          const [red, green, blue] = diffColor(r.change);
          span.style.backgroundColor = `rgb(${red},${green},${blue})`;
          return span;
        },
      },
    ];
  }

  /** The columns drawn at the table's current width. */
  shownColumns() {
    return this.columns().filter((c) => !c.minor || this.fit === "full");
  }

  renderHead() {
    const cols = this.shownColumns();
    const grouped = cols.some((c) => c.group);
    const cells = cols.map((col) => {
      const sorted = col.key === this.sortKey;
      return el(
        "th",
        {
          class: `hs-toptable-${col.key}${col.group ? ` hs-toptable-${col.group.toLowerCase()}` : ""}`,
          "aria-sort": sorted ? (this.descending ? "descending" : "ascending") : "none",
          title: col.title || null,
          rowSpan: grouped && !col.group ? 2 : null,
        },
        el(
          "button",
          {
            type: "button",
            class: "hs-sort",
            dataset: { sort: col.key },
            "aria-label": col.group ? `${col.group} ${col.label.toLowerCase()}` : null,
            onclick: () => {
              this.sortBy(col.key);
              if (this.onSort) this.onSort(this.sortState());
            },
          },
          col.label,
          el("span", { class: "hs-sort-mark", "aria-hidden": "true" }, sorted ? (this.descending ? "▼" : "▲") : ""),
        ),
      );
    });
    this.colgroup.replaceChildren(...cols.map((col) => el("col", { class: `hs-col-${col.key}` })));
    this.table.dataset.fit = this.fit;
    if (!grouped) {
      this.thead.replaceChildren(el("tr", {}, cells));
      return;
    }
    // Two header rows: the side names over their columns, ungrouped columns spanning both.
    const top = [];
    const bottom = [];
    cols.forEach((col, i) => {
      if (!col.group) {
        top.push(cells[i]);
      } else {
        bottom.push(cells[i]);
        if (i === 0 || cols[i - 1].group !== col.group) {
          const span = cols.filter((c) => c.group === col.group).length;
          top.push(
            el(
              "th",
              { class: `hs-toptable-group hs-toptable-${col.group.toLowerCase()}`, colSpan: span, scope: "colgroup" },
              col.group,
            ),
          );
        }
      }
    });
    this.thead.replaceChildren(el("tr", {}, top), el("tr", {}, bottom));
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
    return this.rows.filter((r) => this.matches(r.name));
  }

  renderBody() {
    const cols = this.shownColumns();
    const rows = this.visibleRows();
    const shown = rows.length > this.limit ? rows.slice(0, this.limit) : rows;
    const fragment = document.createDocumentFragment();
    for (const r of shown) {
      // One row in the tab order; arrows move between rows from there.
      const tr = el(
        "tr",
        {
          dataset: { name: r.name },
          tabIndex: r === shown[0] ? 0 : -1,
          class: r.name === this.selected ? "hs-selected" : null,
        },
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

  onRowMenu(e) {
    const tr = e.target.closest("tr[data-name]");
    if (!tr || !this.onMenu) return;
    e.preventDefault();
    this.onMenu(tr.dataset.name, e.clientX, e.clientY, tr);
  }

  onRowKey(e) {
    const tr = e.target.closest("tr[data-name]");
    if (!tr) return;
    if (e.key === "ContextMenu" || (e.key === "F10" && e.shiftKey)) {
      if (!this.onMenu) return;
      e.preventDefault();
      const r = tr.getBoundingClientRect();
      this.onMenu(tr.dataset.name, r.left + 24, r.bottom, tr);
    } else if (e.key === "Enter") {
      e.preventDefault();
      tr.click();
    } else if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      const next = e.key === "ArrowDown" ? tr.nextElementSibling : tr.previousElementSibling;
      if (next && next.dataset.name) {
        e.preventDefault();
        next.focus();
      }
    }
  }
}
