// The flame graph: one canvas, drawn from a FlameTree (flametree.js).
//
// Drawing cost is bounded by what is visible: each level is sorted by x, so a binary search
// finds the first frame in view and the walk stops at the first one past it; frames narrower
// than half a pixel are skipped (their children are narrower still).  Redraws are coalesced
// into one per animation frame.  Hover does not redraw at all: it only moves the tooltip.
//
// Keyboard: the canvas is focusable; arrows move a focus between frames (up/down: the frame
// drawn above/below, left/right: the neighbours on the same row), Enter zooms into it, Escape
// zooms out.  Wheel: plain wheel scrolls the page as everywhere else; ctrl (or cmd) + wheel
// zooms horizontally around the pointer and shift + wheel pans a zoomed graph, as speedscope
// does, so scrolling past a graph never gets trapped in it.
//
// Inlined into the standalone HTML export with format.js and flametree.js (see export.js):
// imports only those two, and its top-level names must not collide with theirs.

import { formatPercent, formatValue } from "./format.js";
import { diffChange, diffColor, packageColor, shareChange } from "./flametree.js";
import { nameMatcher } from "./search.js";

const FG_FRAME_HEIGHT = 18; // as Pyroscope
const FG_MIN_WIDTH = 0.5; // CSS px: narrower frames are not drawn
const FG_LABEL_PAD = 3;
const FG_FONT = "12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
const FG_ZOOM_STEP = 0.0015; // per wheel delta unit: a notch (100) is about 16%
// Fallbacks when flamegraph.css is not loaded; the CSS variables win (dark theme).
const FG_THEME_DEFAULTS = {
  text: ["--hs-fg-frame-text", "#1f1f1f"],
  textDimmed: ["--hs-fg-frame-text-dimmed", "#9a9a9a"],
  dimmed: ["--hs-fg-frame-dimmed", "rgb(228,228,228)"],
  focus: ["--hs-fg-focus", "#1f1f1f"],
};

/** The canvas colours from the CSS variables in force on `node` (read at draw time). */
function fgTheme(node) {
  const style = typeof getComputedStyle === "function" ? getComputedStyle(node) : null;
  const theme = {};
  for (const [key, [name, fallback]] of Object.entries(FG_THEME_DEFAULTS)) {
    const v = style ? style.getPropertyValue(name).trim() : "";
    theme[key] = v || fallback;
  }
  return theme;
}

/**
 * A label for a frame `fit` characters wide, cut from the left so that the function name (the
 * end of "module.Class.method") stays readable, as Grafana cuts them.
 */
export function fgLabel(name, fit) {
  if (fit < 3) return "";
  return name.length <= fit ? name : `…${name.slice(name.length - (fit - 1))}`;
}

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
    this.range = null; // [v0, v1] from wheel zoom/pan, over the zoomed frame's range
    this.focused = -1; // the keyboard's frame, -1 = none
    this.theme = null;

    container.classList.add("hs-flamegraph");
    container.flamegraph = this;
    this.canvas = document.createElement("canvas");
    this.canvas.className = "hs-flamegraph-canvas";
    this.canvas.tabIndex = 0;
    this.canvas.setAttribute("role", "application");
    this.canvas.setAttribute(
      "aria-label",
      "Flame graph: arrow keys move between frames, Enter zooms in, Escape zooms out",
    );
    this.tooltip = document.createElement("div");
    this.tooltip.className = "hs-tooltip";
    this.tooltip.hidden = true;
    // What the keyboard focus is on, for screen readers (the canvas itself has no text).
    this.announcer = document.createElement("div");
    this.announcer.className = "hs-fg-announce";
    this.announcer.setAttribute("aria-live", "polite");
    container.append(this.canvas, this.tooltip, this.announcer);
    this.ctx = this.canvas.getContext("2d");

    this.canvas.addEventListener("mousemove", (e) => this.onMove(e));
    this.canvas.addEventListener("mouseleave", () => this.hideTooltip());
    this.canvas.addEventListener("click", (e) => this.onClick(e));
    this.canvas.addEventListener("keydown", (e) => this.onKey(e));
    this.canvas.addEventListener("blur", () => {
      if (this.focused >= 0) this.hideTooltip();
    });
    this.canvas.addEventListener("wheel", (e) => this.onWheel(e), { passive: false });
    this.canvas.addEventListener("contextmenu", (e) => {
      const node = this.eventNode(e);
      if (node < 0) return;
      if (this.requestMenu(node, e.clientX, e.clientY)) e.preventDefault();
    });
    // A switch of the system's theme changes the CSS colours; the canvas must redraw to follow.
    this.schemeQuery = typeof matchMedia === "function" ? matchMedia("(prefers-color-scheme: dark)") : null;
    this.onScheme = () => this.requestDraw();
    if (this.schemeQuery) this.schemeQuery.addEventListener("change", this.onScheme);
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
    this.range = null;
    this.focused = -1;
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
   * Highlights frames whose name contains `text` (case-insensitive; `/re/`: a regular
   * expression finds), dims the rest.
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
    this.range = null;
    this.container.dataset.zoomed = tree.names[tree.name[node]];
    if (this.focused >= 0 && !this.isVisible(this.focused)) this.focused = node;
    this.notifyZoom();
    this.requestDraw();
  }

  resetZoom() {
    const was = this.zoomed !== -1 || this.range !== null;
    this.zoomed = -1;
    this.range = null;
    this.container.removeAttribute("data-zoomed");
    if (was) this.notifyZoom();
    this.requestDraw();
  }

  /**
   * The zoomed frame as its root-first path of names joined by ";" ("" = whole graph): what a
   * URL keeps, so that a reload (or slightly different data) zooms to the same place.  A ";"
   * or "%" inside a name is written %3B or %25.
   */
  zoomPath() {
    const tree = this.tree;
    if (!tree || this.zoomed <= 0) return "";
    const names = [];
    for (let n = this.zoomed; n > 0; n = tree.parent[n]) {
      names.push(tree.names[tree.name[n]].replace(/[%;]/g, (c) => (c === "%" ? "%25" : "%3B")));
    }
    return names.reverse().join(";");
  }

  /** The frame a zoomPath() names (the widest match at each step), or -1. */
  findPath(path) {
    const tree = this.tree;
    if (!tree || !tree.nodeCount || !path) return -1;
    let node = 0;
    for (const part of String(path).split(";")) {
      const name = part.replace(/%(25|3B)/gi, (_, code) => (code === "25" ? "%" : ";"));
      let best = -1;
      const first = tree.firstChild[node];
      for (let c = first; c >= 0 && c < first + tree.childCount[node]; c++) {
        if (tree.names[tree.name[c]] === name && (best < 0 || tree.value[c] > tree.value[best])) best = c;
      }
      if (best < 0) return -1;
      node = best;
    }
    return node;
  }

  /** Zooms to a zoomPath() without telling listeners; unknown paths show the whole graph. */
  restoreZoom(path) {
    const node = this.findPath(path);
    this.zoomed = node > 0 ? node : -1;
    this.range = null;
    if (this.zoomed > 0) this.container.dataset.zoomed = this.tree.names[this.tree.name[node]];
    else this.container.removeAttribute("data-zoomed");
    this.requestDraw();
    return this.zoomed > 0;
  }

  /** Moves the keyboard focus to a node (-1 clears) and describes it. */
  focusFrame(node) {
    const tree = this.tree;
    if (!tree || node >= tree.nodeCount) return;
    this.focused = node;
    this.requestDraw();
    if (node < 0) {
      this.hideTooltip();
      this.announcer.textContent = "";
      return;
    }
    this.flush();
    const rect = this.frameRect(node);
    const box = this.canvas.getBoundingClientRect();
    if (rect) {
      const x = box.left + rect.x + Math.min(rect.width, 40);
      this.showTooltip(node, x, box.top + rect.y + FG_FRAME_HEIGHT);
      if (this.canvas.scrollIntoView && document.activeElement === this.canvas) {
        this.scrollFrameIntoView(box.top + rect.y);
      }
    }
    const rows = this.tooltipRows(node)
      .map(([k, v]) => `${k} ${v}`)
      .join(", ");
    this.announcer.textContent = `${tree.names[tree.name[node]]}: ${rows}`;
  }

  /** The drawn rectangle of a node (canvas CSS px), or null when it is not drawn. */
  frameRect(node) {
    for (let i = 0; i < this.drawn.length; i += 5) {
      if (this.drawn[i] === node) {
        return { x: this.drawn[i + 1], y: this.drawn[i + 2], width: this.drawn[i + 3] };
      }
    }
    return null;
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
    if (this.schemeQuery) this.schemeQuery.removeEventListener("change", this.onScheme);
    if (this.pending) cancelAnimationFrame(this.pending);
    this.tooltip.remove();
    this.canvas.remove();
    delete this.container.flamegraph;
  }

  // --- internals -----------------------------------------------------------------------

  notifyZoom() {
    const name = this.container.dataset.zoomed || null;
    this.container.dispatchEvent(
      new CustomEvent("hs-zoom", { detail: { name, path: this.zoomPath(), ranged: this.range !== null } }),
    );
  }

  /**
   * Asks the page for a menu on a frame: an "hs-frame-menu" event that a listener takes by
   * calling preventDefault(); true when one did.  The standalone page has none, so there the
   * browser's own menu stays.
   */
  requestMenu(node, clientX, clientY) {
    const tree = this.tree;
    const event = new CustomEvent("hs-frame-menu", {
      cancelable: true,
      detail: { node, name: tree.names[tree.name[node]], clientX, clientY, graph: this },
    });
    this.container.dispatchEvent(event);
    return event.defaultPrevented;
  }

  scrollFrameIntoView(top) {
    if (top < 0 || top + FG_FRAME_HEIGHT > window.innerHeight) {
      window.scrollBy(0, top < 0 ? top - 40 : top + FG_FRAME_HEIGHT + 40 - window.innerHeight);
    }
  }

  /** Drawn at least half a pixel wide in the current view. */
  isVisible(node) {
    const tree = this.tree;
    const [v0, v1] = this.viewRange();
    const left = Math.max(tree.x[node], v0);
    const right = Math.min(tree.x[node] + tree.value[node], v1);
    return right > left && ((right - left) * (this.cssWidth || 1)) / (v1 - v0) >= FG_MIN_WIDTH;
  }

  /** Widest visible node in [lo, hi) (a child run), or -1. */
  widestVisible(lo, hi) {
    let best = -1;
    for (let i = lo; i < hi; i++) {
      if (this.isVisible(i) && (best < 0 || this.tree.value[i] > this.tree.value[best])) best = i;
    }
    return best;
  }

  /** The next visible node on the same row, in x order (`step` +1 or -1), or -1. */
  neighbour(node, step) {
    const tree = this.tree;
    const d = tree.depth[node];
    for (let i = node + step; i >= tree.levelStart[d] && i < tree.levelStart[d + 1]; i += step) {
      if (this.isVisible(i)) return i;
    }
    return -1;
  }

  onKey(e) {
    const tree = this.tree;
    if (!tree || !tree.nodeCount || e.altKey || e.ctrlKey || e.metaKey) return;
    const key = e.key === "F10" && e.shiftKey ? "ContextMenu" : e.key;
    const node = this.focused >= 0 && this.isVisible(this.focused) ? this.focused : -1;
    const start = this.zoomed > 0 ? this.zoomed : 0;
    // Up and down follow the picture: the root is drawn at the bottom when inverted.
    const towardsRoot = this.inverted ? "ArrowDown" : "ArrowUp";
    let next;
    switch (key) {
      case "ArrowUp":
      case "ArrowDown":
        if (node < 0) next = start;
        else if (e.key === towardsRoot) next = node > 0 ? tree.parent[node] : -1;
        else
          next = tree.childCount[node]
            ? this.widestVisible(tree.firstChild[node], tree.firstChild[node] + tree.childCount[node])
            : -1;
        break;
      case "ArrowLeft":
      case "ArrowRight":
        next = node < 0 ? start : this.neighbour(node, e.key === "ArrowRight" ? 1 : -1);
        break;
      case "Home":
        next = start;
        break;
      case "Enter":
      case " ":
        if (node >= 0) {
          if (node === 0) this.resetZoom();
          else this.zoomTo(node);
          this.focusFrame(node);
        }
        e.preventDefault();
        return;
      case "Escape":
        if (this.zoomed > 0 || this.range) {
          // One step out: a wheel zoom first, then the zoomed frame's parent.
          if (this.range) {
            this.range = null;
            this.notifyZoom();
            this.requestDraw();
          } else if (tree.parent[this.zoomed] > 0) this.zoomTo(tree.parent[this.zoomed]);
          else this.resetZoom();
          if (node >= 0) this.focusFrame(node);
          e.preventDefault();
        } else if (node >= 0) {
          this.focusFrame(-1);
          e.preventDefault();
        }
        return;
      case "ContextMenu":
        if (node >= 0) {
          const rect = this.frameRect(node);
          const box = this.canvas.getBoundingClientRect();
          if (
            rect &&
            this.requestMenu(node, box.left + rect.x + Math.min(rect.width, 40), box.top + rect.y + FG_FRAME_HEIGHT)
          ) {
            e.preventDefault();
          }
        }
        return;
      default:
        return;
    }
    e.preventDefault();
    if (next >= 0) this.focusFrame(next);
  }

  onWheel(e) {
    const tree = this.tree;
    if (!tree || !tree.nodeCount) return;
    const zoom = e.ctrlKey || e.metaKey;
    const [v0, v1] = this.viewRange();
    const [b0, b1] = this.zoomRange();
    if (!zoom && !(e.shiftKey && (v0 > b0 || v1 < b1))) return; // the page scrolls
    e.preventDefault();
    const width = v1 - v0;
    let n0;
    let n1;
    if (zoom) {
      const rect = this.canvas.getBoundingClientRect();
      const at = Math.min(1, Math.max(0, (e.clientX - rect.left) / (rect.width || 1)));
      const anchor = v0 + at * width;
      // Not narrower than ~2 px per unit of value, not wider than the zoomed frame.
      const minWidth = Math.min(b1 - b0, Math.max(1, (b1 - b0) / 1e6));
      const next = Math.min(b1 - b0, Math.max(minWidth, width * Math.exp(e.deltaY * FG_ZOOM_STEP)));
      n0 = anchor - at * next;
      n1 = n0 + next;
    } else {
      const delta = (e.deltaX || e.deltaY) * (width / (this.cssWidth || 1));
      n0 = v0 + delta;
      n1 = v1 + delta;
    }
    if (n0 < b0) [n0, n1] = [b0, b0 + (n1 - n0)];
    if (n1 > b1) [n0, n1] = [b1 - (n1 - n0), b1];
    n0 = Math.max(b0, n0);
    const whole = n0 <= b0 && n1 >= b1;
    const was = this.range !== null;
    this.range = whole ? null : [n0, n1];
    if (was !== (this.range !== null)) this.notifyZoom();
    this.hideTooltip();
    this.requestDraw();
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
    const finds = nameMatcher(this.searchText);
    for (let k = 1; k < count; k++) {
      if (finds(tree.names[k])) this.searchMark[k] = 1;
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
    const theme = this.theme || (this.theme = fgTheme(this.container));
    return { highlighted, dimmed, faded, color: dimmed ? theme.dimmed : fgRgb(rgb) };
  }

  measureWidth() {
    return Math.floor(this.canvas.getBoundingClientRect().width);
  }

  /** The value range [v0, v1) that spans the width. */
  viewRange() {
    return this.range || this.zoomRange();
  }

  /** The zoomed frame's range (the whole graph when none). */
  zoomRange() {
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
    // Read per draw, so a theme switch (system dark mode) shows at the next redraw.
    this.theme = fgTheme(this.container);
    const theme = this.theme;
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
          label = fgLabel(tree.names[tree.name[i]], fit);
          labels.push(label, x + FG_LABEL_PAD, y + FG_FRAME_HEIGHT / 2, state.dimmed);
        }
        drawn.push(i, x, y, w, label);
      }
    }
    for (const dimmed of [false, true]) {
      ctx.fillStyle = dimmed ? theme.textDimmed : theme.text;
      for (let j = 0; j < labels.length; j += 4) {
        if (labels[j + 3] === dimmed) ctx.fillText(labels[j], labels[j + 1], labels[j + 2]);
      }
    }
    const focus = this.focused >= 0 ? this.frameRect(this.focused) : null;
    if (focus) {
      ctx.strokeStyle = theme.focus;
      ctx.lineWidth = 2;
      ctx.strokeRect(focus.x + 1, focus.y + 1, Math.max(1, focus.width - 2), FG_FRAME_HEIGHT - 3);
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
    if (this.focused >= 0) this.focused = node;
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
    const side = (t, s, all) => `${formatPercent(t, all)} (${formatValue(t, unit)}), self ${formatPercent(s, all)}`;
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
