// The flame graph: one canvas, drawn from a FlameTree (flametree.js).
//
// Drawing cost is bounded by what is visible: each level is sorted by x, so a binary search
// finds the first frame in view and the walk stops at the first one past it; frames narrower
// than half a pixel are skipped (their children are narrower still).  Redraws are coalesced
// into one per animation frame.  Hover does not redraw at all: it only moves the tooltip.
//
// Inlined into the standalone HTML export with format.js and flametree.js (see export.js):
// imports only those two, and its top-level names must not collide with theirs.

import { formatPercent, formatValue } from "./format.js";
import { diffChange, diffColor, packageColor, shareChange } from "./flametree.js";

const FG_FRAME_HEIGHT = 18; // as Pyroscope
const FG_MIN_WIDTH = 0.5; // CSS px: narrower frames are not drawn
const FG_LABEL_PAD = 3;
const FG_FONT = "12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
const FG_DIMMED = "rgb(228,228,228)";
const FG_TEXT = "#1f1f1f";
const FG_TEXT_DIMMED = "#9a9a9a";

function fgRgb(c) {
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function fgFade(c) {
  // Ancestors of the zoomed frame: the same hue, paler, so the zoomed subtree stands out.
  return c.map((v) => Math.round(v + (255 - v) * 0.55));
}

/** Relative change as text: "+12.5%", "new", "removed". */
export function formatChange(change) {
  if (Number.isNaN(change)) return "–";
  if (change === Infinity) return "new";
  if (change === -1) return "removed";
  if (Math.abs(change) < 0.0001) return "no change";
  const p = change * 100;
  return `${p > 0 ? "+" : ""}${p.toFixed(Math.abs(p) < 10 ? 2 : 1)}%`;
}

/**
 * @typedef {Object} DrawnFrame
 * @property {number} index   node index in the tree
 * @property {string} name
 * @property {number} x       CSS px from the canvas's left edge
 * @property {number} y       CSS px from the canvas's top edge
 * @property {number} width
 * @property {number} height
 * @property {number} self
 * @property {number} total
 * @property {boolean} highlighted  matches the search or the highlighted function
 * @property {boolean} dimmed       a search/highlight is active and this frame does not match
 * @property {string} color         the fill colour, "rgb(r,g,b)"
 * @property {string} label         the text drawn in the frame ("" when it does not fit)
 */

export class FlameGraph {
  /**
   * @param {HTMLElement} container
   * @param {{unit?: string, inverted?: boolean}} [options]
   */
  constructor(container, { unit = "", inverted = false } = {}) {
    this.container = container;
    this.unit = unit;
    this.inverted = Boolean(inverted);
    this.tree = null;
    this.zoomed = -1; // node index, -1 = whole graph
    this.searchText = "";
    this.highlightName = null;
    this.searchMark = new Uint8Array(0); // per name index
    this.highlightMark = new Uint8Array(0);
    this.drawn = []; // flat: node, x, y, width, label per drawn frame
    this.pending = 0;
    this.cssWidth = 0;

    container.classList.add("hs-flamegraph");
    container.flamegraph = this;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "hs-flamegraph-canvas";
    this.canvas.tabIndex = 0;
    this.canvas.setAttribute("role", "img");
    this.canvas.setAttribute("aria-label", "Flame graph");
    this.tooltip = document.createElement("div");
    this.tooltip.className = "hs-tooltip";
    this.tooltip.hidden = true;
    container.append(this.canvas, this.tooltip);
    this.ctx = this.canvas.getContext("2d");

    this.canvas.addEventListener("mousemove", (e) => this.onMove(e));
    this.canvas.addEventListener("mouseleave", () => this.hideTooltip());
    this.canvas.addEventListener("click", (e) => this.onClick(e));
    this.canvas.addEventListener("keydown", (e) => {
      if (e.key === "Escape") this.resetZoom();
    });
    if (typeof ResizeObserver !== "undefined") {
      this.resizeObserver = new ResizeObserver(() => {
        if (this.measureWidth() !== this.cssWidth) this.requestDraw();
      });
      this.resizeObserver.observe(container);
    }
  }

  /** @param {import("./flametree.js").FlameTree} tree */
  setData(tree) {
    this.tree = tree;
    this.zoomed = -1;
    this.container.removeAttribute("data-zoomed");
    this.colors = this.computeColors(tree);
    this.markSearch();
    this.markHighlight();
    this.hideTooltip();
    this.requestDraw();
  }

  setUnit(unit) {
    this.unit = unit;
  }

  /** Root at the bottom (flame graph) when true, at the top (icicle) when false. */
  setInverted(inverted) {
    this.inverted = Boolean(inverted);
    this.requestDraw();
  }

  /**
   * Highlights frames whose name contains `text` (case-insensitive), dims the rest.
   * @returns {{matches: number, value: number}} matching frames, and the value they cover
   *   (nested matches counted once)
   */
  search(text) {
    this.searchText = String(text || "").trim();
    const result = this.markSearch();
    this.requestDraw();
    return result;
  }

  /** Highlights one function (from the top table); null clears. */
  highlight(name) {
    this.highlightName = name === undefined || name === "" ? null : name;
    this.markHighlight();
    this.requestDraw();
  }

  /**
   * Zooms so that `frame` fills the width.  `frame`: a node index, a frames() entry, or a
   * function name (its widest frame).  The root, or nothing, zooms out.
   */
  zoomTo(frame) {
    const tree = this.tree;
    if (!tree || !tree.nodeCount) return;
    let node = -1;
    if (typeof frame === "number") node = frame;
    else if (frame && typeof frame.index === "number") node = frame.index;
    else if (typeof frame === "string") node = this.widestFrame(frame);
    if (node <= 0 || node >= tree.nodeCount) {
      this.resetZoom();
      return;
    }
    this.zoomed = node;
    this.container.dataset.zoomed = tree.names[tree.name[node]];
    this.notifyZoom();
    this.requestDraw();
  }

  resetZoom() {
    const was = this.zoomed;
    this.zoomed = -1;
    this.container.removeAttribute("data-zoomed");
    if (was !== -1) this.notifyZoom();
    this.requestDraw();
  }

  /** Visible frames as last drawn (a pending draw is done first). @returns {DrawnFrame[]} */
  frames() {
    this.flush();
    const tree = this.tree;
    const out = [];
    for (let i = 0; i < this.drawn.length; i += 5) {
      const node = this.drawn[i];
      const state = this.frameState(node);
      const frame = {
        index: node,
        name: tree.names[tree.name[node]],
        x: this.drawn[i + 1],
        y: this.drawn[i + 2],
        width: this.drawn[i + 3],
        height: FG_FRAME_HEIGHT,
        depth: tree.depth[node],
        self: tree.self[node],
        total: tree.value[node],
        highlighted: state.highlighted,
        dimmed: state.dimmed,
        faded: state.faded,
        color: state.color,
        label: this.drawn[i + 4],
      };
      if (tree.diff) {
        Object.assign(frame, {
          totalLeft: tree.totalLeft[node],
          totalRight: tree.totalRight[node],
          selfLeft: tree.selfLeft[node],
          selfRight: tree.selfRight[node],
          change: diffChange(tree, node),
        });
      }
      out.push(frame);
    }
    return out;
  }

  destroy() {
    if (this.resizeObserver) this.resizeObserver.disconnect();
    if (this.pending) cancelAnimationFrame(this.pending);
    this.tooltip.remove();
    this.canvas.remove();
    delete this.container.flamegraph;
  }

  // --- internals -----------------------------------------------------------------------

  notifyZoom() {
    const name = this.container.dataset.zoomed || null;
    this.container.dispatchEvent(new CustomEvent("hs-zoom", { detail: { name } }));
  }

  widestFrame(name) {
    const tree = this.tree;
    let best = -1;
    for (let i = 1; i < tree.nodeCount; i++) {
      if (tree.names[tree.name[i]] === name && (best < 0 || tree.value[i] > tree.value[best])) {
        best = i;
      }
    }
    return best;
  }

  computeColors(tree) {
    // Single graphs colour by name (so per name index); diffs colour per node.
    if (tree.diff) {
      const colors = new Array(tree.nodeCount);
      for (let i = 0; i < tree.nodeCount; i++) colors[i] = diffColor(diffChange(tree, i));
      return colors;
    }
    return tree.names.map((n) => packageColor(n));
  }

  markSearch() {
    const tree = this.tree;
    const count = tree ? tree.names.length : 0;
    this.searchMark = new Uint8Array(count);
    if (!tree || !this.searchText) return { matches: 0, value: 0 };
    const q = this.searchText.toLowerCase();
    for (let k = 1; k < count; k++) {
      if (tree.names[k].toLowerCase().includes(q)) this.searchMark[k] = 1;
    }
    // Levels come in order, so a parent's "inside a match" is known before its children.
    const inside = new Uint8Array(tree.nodeCount);
    let matches = 0;
    let value = 0;
    for (let i = 1; i < tree.nodeCount; i++) {
      const hit = this.searchMark[tree.name[i]] === 1;
      const parentInside = inside[tree.parent[i]] === 1;
      if (hit) {
        matches++;
        if (!parentInside) value += tree.diff ? tree.totalRight[i] : tree.value[i];
      }
      inside[i] = hit || parentInside ? 1 : 0;
    }
    return { matches, value };
  }

  markHighlight() {
    const tree = this.tree;
    const count = tree ? tree.names.length : 0;
    this.highlightMark = new Uint8Array(count);
    if (!tree || this.highlightName === null) return;
    for (let k = 1; k < count; k++) {
      if (tree.names[k] === this.highlightName) this.highlightMark[k] = 1;
    }
  }

  frameState(node) {
    const tree = this.tree;
    const k = tree.name[node];
    const active = this.searchText !== "" || this.highlightName !== null;
    const highlighted =
      (this.searchText !== "" && this.searchMark[k] === 1) ||
      (this.highlightName !== null && this.highlightMark[k] === 1);
    const dimmed = active && !highlighted;
    const faded = this.zoomed > 0 && tree.depth[node] < tree.depth[this.zoomed];
    let rgb = tree.diff ? this.colors[node] : this.colors[k];
    if (faded) rgb = fgFade(rgb);
    return { highlighted, dimmed, faded, color: dimmed ? FG_DIMMED : fgRgb(rgb) };
  }

  measureWidth() {
    return Math.floor(this.canvas.getBoundingClientRect().width);
  }

  /** The value range [v0, v1) that spans the width. */
  viewRange() {
    const tree = this.tree;
    if (this.zoomed > 0) {
      return [tree.x[this.zoomed], tree.x[this.zoomed] + tree.value[this.zoomed]];
    }
    return [0, tree.nodeCount ? tree.value[0] : 0];
  }

  requestDraw() {
    if (this.pending) return;
    this.pending = requestAnimationFrame(() => {
      this.pending = 0;
      this.draw();
    });
  }

  flush() {
    if (this.pending) {
      cancelAnimationFrame(this.pending);
      this.pending = 0;
      this.draw();
    }
  }

  /** First node of level d whose right edge is past `v` (levels are sorted by x). */
  firstPast(d, v) {
    const tree = this.tree;
    let lo = tree.levelStart[d];
    let hi = tree.levelStart[d + 1];
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (tree.x[mid] + tree.value[mid] <= v) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  draw() {
    const tree = this.tree;
    const ctx = this.ctx;
    const width = this.measureWidth();
    this.cssWidth = width;
    this.drawn = [];
    const rows = tree && tree.nodeCount ? tree.maxDepth + 1 : 0;
    const height = rows * FG_FRAME_HEIGHT;
    const dpr = window.devicePixelRatio || 1;
    const pw = Math.max(1, Math.round(width * dpr));
    const ph = Math.max(1, Math.round(height * dpr));
    if (this.canvas.width !== pw || this.canvas.height !== ph) {
      this.canvas.width = pw;
      this.canvas.height = ph;
    }
    this.canvas.style.height = `${height}px`;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    if (!rows || width <= 0) return;

    const [v0, v1] = this.viewRange();
    if (v1 <= v0) return;
    const scale = width / (v1 - v0);
    ctx.font = FG_FONT;
    ctx.textBaseline = "middle";
    if (this.charWidth === undefined) this.charWidth = ctx.measureText("MMMMMMMMMM").width / 10;
    const charWidth = this.charWidth || 7;
    const drawn = this.drawn;
    const labels = []; // drawn after all fills, so that fillStyle switches less often

    for (let d = 0; d <= tree.maxDepth; d++) {
      const end = tree.levelStart[d + 1];
      const y = (this.inverted ? rows - 1 - d : d) * FG_FRAME_HEIGHT;
      for (let i = this.firstPast(d, v0); i < end && tree.x[i] < v1; i++) {
        const left = Math.max(tree.x[i], v0);
        const right = Math.min(tree.x[i] + tree.value[i], v1);
        const w = (right - left) * scale;
        if (w < FG_MIN_WIDTH) continue;
        const x = (left - v0) * scale;
        const state = this.frameState(i);
        ctx.fillStyle = state.color;
        // A 1px gap between neighbours and rows, as Pyroscope draws them.
        ctx.fillRect(x, y, w > 2 ? w - 1 : w, FG_FRAME_HEIGHT - 1);
        let label = "";
        const fit = Math.floor((w - 2 * FG_LABEL_PAD) / charWidth);
        if (fit >= 3) {
          const name = tree.names[tree.name[i]];
          label = name.length <= fit ? name : `${name.slice(0, fit - 1)}…`;
          labels.push(label, x + FG_LABEL_PAD, y + FG_FRAME_HEIGHT / 2, state.dimmed);
        }
        drawn.push(i, x, y, w, label);
      }
    }
    for (const dimmed of [false, true]) {
      ctx.fillStyle = dimmed ? FG_TEXT_DIMMED : FG_TEXT;
      for (let j = 0; j < labels.length; j += 4) {
        if (labels[j + 3] === dimmed) ctx.fillText(labels[j], labels[j + 1], labels[j + 2]);
      }
    }
  }

  /** The drawn node under a point in canvas CSS px, or -1. */
  nodeAt(px, py) {
    const tree = this.tree;
    if (!tree || !tree.nodeCount || this.cssWidth <= 0) return -1;
    const rows = tree.maxDepth + 1;
    const row = Math.floor(py / FG_FRAME_HEIGHT);
    if (row < 0 || row >= rows) return -1;
    const d = this.inverted ? rows - 1 - row : row;
    const [v0, v1] = this.viewRange();
    const scale = this.cssWidth / (v1 - v0);
    const v = v0 + px / scale;
    const i = this.firstPast(d, v);
    if (i >= tree.levelStart[d + 1] || tree.x[i] > v || v >= v1 || v < v0) return -1;
    const w = (Math.min(tree.x[i] + tree.value[i], v1) - Math.max(tree.x[i], v0)) * scale;
    return w >= FG_MIN_WIDTH ? i : -1;
  }

  eventNode(e) {
    this.flush();
    const rect = this.canvas.getBoundingClientRect();
    return this.nodeAt(e.clientX - rect.left, e.clientY - rect.top);
  }

  onMove(e) {
    const node = this.eventNode(e);
    this.canvas.classList.toggle("hs-pointer", node >= 0);
    if (node < 0) {
      this.hideTooltip();
      return;
    }
    this.showTooltip(node, e.clientX, e.clientY);
  }

  onClick(e) {
    const node = this.eventNode(e);
    if (node < 0) return;
    if (node === 0 || node === this.zoomed) {
      // The root zooms out; so does the zoomed frame itself, back to its parent's view.
      if (node === 0) this.resetZoom();
      else this.zoomTo(this.tree.parent[node]);
    } else {
      this.zoomTo(node);
    }
    // The frame under the pointer changed with the zoom: describe the new one.
    const under = this.eventNode(e);
    if (under < 0) this.hideTooltip();
    else this.showTooltip(under, e.clientX, e.clientY);
  }

  hideTooltip() {
    this.tooltip.hidden = true;
    this.tooltipNode = -1;
  }

  tooltipRows(node) {
    const tree = this.tree;
    const unit = this.unit;
    if (!tree.diff) {
      return [
        ["Total", `${formatValue(tree.value[node], unit)} (${formatPercent(tree.value[node], tree.total)})`],
        ["Self", `${formatValue(tree.self[node], unit)} (${formatPercent(tree.self[node], tree.total)})`],
      ];
    }
    const side = (t, s, all) =>
      `${formatPercent(t, all)} (${formatValue(t, unit)}), self ${formatPercent(s, all)}`;
    const selfChange = shareChange(
      tree.leftTotal ? tree.selfLeft[node] / tree.leftTotal : 0,
      tree.rightTotal ? tree.selfRight[node] / tree.rightTotal : 0,
    );
    return [
      ["Baseline", side(tree.totalLeft[node], tree.selfLeft[node], tree.leftTotal)],
      ["Comparison", side(tree.totalRight[node], tree.selfRight[node], tree.rightTotal)],
      ["Change", `${formatChange(diffChange(tree, node))} total, ${formatChange(selfChange)} self`],
    ];
  }

  showTooltip(node, clientX, clientY) {
    const tip = this.tooltip;
    if (this.tooltipNode !== node) {
      this.tooltipNode = node;
      const title = document.createElement("div");
      title.className = "hs-tooltip-title";
      title.textContent = this.tree.names[this.tree.name[node]];
      const table = document.createElement("table");
      for (const [label, text] of this.tooltipRows(node)) {
        const tr = table.insertRow();
        const th = document.createElement("th");
        th.textContent = label;
        tr.append(th);
        tr.insertCell().textContent = text;
      }
      tip.replaceChildren(title, table);
    }
    tip.hidden = false;
    // Fixed to the viewport, flipped to stay on screen near the right and bottom edges.
    const margin = 14;
    const w = tip.offsetWidth;
    const h = tip.offsetHeight;
    let left = clientX + margin;
    let top = clientY + margin;
    if (left + w > window.innerWidth - 4) left = Math.max(4, clientX - margin - w);
    if (top + h > window.innerHeight - 4) top = Math.max(4, clientY - margin - h);
    tip.style.left = `${left}px`;
    tip.style.top = `${top}px`;
  }
}
