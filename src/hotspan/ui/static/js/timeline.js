// The timeline above a flame graph: the total of the selection over time, from SelectSeries,
// one line per group when grouped by a label (or stacked areas).  Dragging across it selects
// a time range; a legend entry can narrow the query to its series.

import { el } from "./dom.js";
import { formatTime, formatValue } from "./format.js";

const PALETTE = [
  "#3b82f6",
  "#f97316",
  "#10b981",
  "#e11d48",
  "#8b5cf6",
  "#eab308",
  "#06b6d4",
  "#84cc16",
  "#ec4899",
  "#64748b",
];
const HEIGHT = 130;
// label -> palette index, for the page's life: narrowing the query to a series, or opening
// the breakdown, must not repaint it (a colour is how the eye follows a series).
const COLOURS = new Map();

/**
 * One colour per series label: the one it had before, else one its label hashes to (so a
 * fresh page mostly agrees with the last), moved on to a free one if a series drawn with it
 * already has it.  An ungrouped series (the total) is always the first colour.
 */
export function seriesColours(series) {
  const taken = new Set();
  return series.map((s) => {
    if (!s.group) return PALETTE[0];
    let i = COLOURS.get(s.label);
    if (i === undefined || taken.has(i)) {
      i = hash(s.label) % PALETTE.length;
      for (let k = 0; k < PALETTE.length && taken.has(i); k++) i = (i + 1) % PALETTE.length;
      COLOURS.set(s.label, i);
    }
    taken.add(i);
    return PALETTE[i];
  });
}

function hash(text) {
  let h = 0;
  for (const c of text) h = (Math.imul(h, 31) + c.codePointAt(0)) >>> 0;
  return h;
}
const PAD = { left: 64, right: 12, top: 10, bottom: 22 };
const BYTES = new Set(["bytes"]);

/** Canvas colours from the page's CSS variables, so that the dark theme reaches the plot. */
function themeColour(name, fallback) {
  const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return value || fallback;
}

export class Timeline {
  /**
   * @param {HTMLElement} container
   * @param {{unit: string, onSelect: (startMs: number, endMs: number) => void,
   *   height?: number, stacked?: boolean, colour?: string,
   *   onLegendPick?: (series: object) => void}} options `onLegendPick`: a legend entry becomes
   *   a button that shows only its series (the view adds its label to the query)
   */
  constructor(container, { unit, onSelect, height = HEIGHT, stacked = false, colour = "", onLegendPick = null }) {
    this.unit = unit;
    this.colour = colour;
    this.onSelect = onSelect;
    this.height = height;
    this.stacked = stacked;
    this.onLegendPick = onLegendPick;
    this.series = [];
    this.colours = [];
    this.band = null;
    this.yLabels = [];
    this.canvas = el("canvas", { class: "hs-timeline-canvas", "aria-label": "Timeline" });
    this.selection = el("div", { class: "hs-timeline-selection", hidden: true });
    this.cursor = el("div", { class: "hs-timeline-tooltip", hidden: true });
    this.legend = el("div", { class: "hs-timeline-legend" });
    this.caption = el("div", { class: "hs-timeline-caption", hidden: true });
    this.note = el("div", { class: "hs-timeline-note", hidden: true });
    this.skeleton = el("div", { class: "hs-timeline-skeleton", hidden: true, "aria-hidden": "true" });
    this.plot = el(
      "div",
      { class: "hs-timeline-plot" },
      this.canvas,
      this.selection,
      this.cursor,
      this.note,
      this.skeleton,
    );
    this.node = el("div", { class: "hs-timeline" }, this.plot, this.legend, this.caption);
    this.node.timeline = this;
    container.append(this.node);
    this.listen();
    this.resizer = new ResizeObserver(() => this.draw());
    this.resizer.observe(this.plot);
  }

  destroy() {
    this.resizer.disconnect();
    window.removeEventListener("mousemove", this.onMove);
    window.removeEventListener("mouseup", this.onUp);
  }

  /**
   * @param {Array<{label: string, points: Array<[number, number]>}>} series
   * @param {number} startMs
   * @param {number} endMs
   * @param {number} stepMs
   */
  setData(series, startMs, endMs, stepMs) {
    this.series = series;
    this.colours = seriesColours(series);
    this.startMs = startMs;
    this.endMs = endMs;
    this.stepMs = stepMs;
    this.band = null;
    this.note.hidden = true;
    this.skeleton.hidden = true;
    // A grouped series keeps its legend entry even alone: it names the group and narrows to it.
    const grouped = series.length > 1 || series.some((s) => s.group);
    this.legend.replaceChildren(
      ...(grouped ? series : []).map((s, i) => {
        const swatch = el("span", { class: "hs-legend-swatch" });
        swatch.style.background = this.colour || this.colours[i];
        if (!this.onLegendPick || !s.group) {
          return el("span", { class: "hs-legend-item" }, swatch, s.label);
        }
        return el(
          "button",
          {
            type: "button",
            class: "hs-legend-item hs-legend-pick",
            title: `Show only this series (adds ${s.label} to the query)`,
            onclick: () => this.onLegendPick(s),
          },
          swatch,
          s.label,
        );
      }),
    );
    this.draw();
  }

  /** A line over an empty plot; `error` when the answer failed (it reads as the panel's error,
   * not as a quiet "nothing here"). */
  setMessage(text, { error = false } = {}) {
    this.note.classList.toggle("hs-timeline-error", error);
    this.series = [];
    this.band = null;
    this.startMs = undefined; // no axis for a range that has no answer
    this.setCaption("");
    this.skeleton.hidden = true;
    this.note.textContent = text;
    this.note.hidden = false;
    this.legend.replaceChildren();
    this.draw();
  }

  /** An animated placeholder while the series load (the old plot would mislead). */
  setLoading() {
    this.series = [];
    this.band = null;
    this.startMs = undefined;
    this.note.hidden = true;
    this.legend.replaceChildren();
    this.setCaption("");
    this.skeleton.hidden = false;
    this.draw();
  }

  /**
   * An axis over the range with a shaded band from `bandStart` to `bandEnd` and no series:
   * when a time is known (a trace ran then) but its samples cannot be plotted.
   */
  setBand(startMs, endMs, stepMs, bandStart, bandEnd) {
    this.setData([], startMs, endMs, stepMs);
    this.band = { startMs: bandStart, endMs: bandEnd };
    this.draw();
  }

  /** A line under the plot that qualifies what it shows ("" hides it). */
  setCaption(text) {
    this.caption.textContent = text;
    this.caption.hidden = !text;
  }

  /** x in CSS px within the canvas -> time in ms. */
  timeAt(x) {
    const width = this.canvas.clientWidth - PAD.left - PAD.right;
    const f = Math.min(1, Math.max(0, (x - PAD.left) / width));
    return this.startMs + f * (this.endMs - this.startMs);
  }

  xOf(ms) {
    const width = this.canvas.clientWidth - PAD.left - PAD.right;
    return PAD.left + ((ms - this.startMs) / (this.endMs - this.startMs)) * width;
  }

  draw() {
    const width = this.plot.clientWidth;
    if (!width) return;
    const ratio = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(width * ratio);
    const height = this.height;
    this.canvas.height = Math.round(height * ratio);
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    if (this.startMs === undefined) return;
    const filled = this.series.map((s) => this.fill(s.points));
    if (this.stacked) {
      // Each series sits on the ones before it: the top line is the total.
      for (let i = 1; i < filled.length; i++) {
        filled[i] = filled[i].map(([t, v], j) => [t, v + filled[i - 1][j][1]]);
      }
    }
    const top = Math.max(0, ...filled.flatMap((points) => points.map(([, v]) => v)));
    const ticks = niceTicks(top, this.unit);
    const max = ticks[ticks.length - 1];
    const y = (v) => PAD.top + (1 - v / max) * (height - PAD.top - PAD.bottom);
    this.drawAxes(ctx, width, ticks, y);
    if (this.band) this.drawBand(ctx);
    filled.forEach((points, i) => {
      const color = this.colour || this.colours[i];
      ctx.beginPath();
      points.forEach(([t, v], j) => {
        const px = this.xOf(t);
        if (j === 0) ctx.moveTo(px, y(v));
        else ctx.lineTo(px, y(v));
      });
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.5;
      ctx.stroke();
      if ((filled.length === 1 || this.stacked) && points.length) {
        const below = this.stacked && i > 0 ? filled[i - 1] : null;
        if (below) {
          for (let j = below.length - 1; j >= 0; j--) ctx.lineTo(this.xOf(below[j][0]), y(below[j][1]));
        } else {
          ctx.lineTo(this.xOf(points[points.length - 1][0]), y(0));
          ctx.lineTo(this.xOf(points[0][0]), y(0));
        }
        ctx.closePath();
        ctx.globalAlpha = this.stacked ? 0.45 : 0.18;
        ctx.fillStyle = color;
        ctx.fill();
        ctx.globalAlpha = 1;
      }
    });
  }

  drawBand(ctx) {
    const left = Math.max(PAD.left, this.xOf(this.band.startMs));
    // At least a few pixels: a trace of milliseconds in an hour is still to be seen.
    const right = Math.max(left + 3, Math.min(this.canvas.clientWidth - PAD.right, this.xOf(this.band.endMs)));
    ctx.globalAlpha = 0.3;
    ctx.fillStyle = themeColour("--hs-accent", "#e4572e");
    ctx.fillRect(left, PAD.top, right - left, this.height - PAD.top - PAD.bottom);
    ctx.globalAlpha = 1;
  }

  /** The step a time falls in.  A point at T holds the samples of (T - step, T], so points
   * sit on start + k * step, k = 0..steps, as the server (and Pyroscope) place them. */
  stepIndex(t) {
    return Math.round((t - this.startMs) / this.stepMs);
  }

  /** Steps without a point are zero: no samples arrived in them. */
  fill(points) {
    const byStep = new Map();
    for (const [t, v] of points) byStep.set(this.stepIndex(t), v);
    const out = [];
    const steps = Math.max(1, Math.ceil((this.endMs - this.startMs) / this.stepMs));
    for (let i = 0; i <= steps; i++) {
      // The last step may end after the range: its point is drawn at the range's end.
      out.push([Math.min(this.startMs + i * this.stepMs, this.endMs), byStep.get(i) || 0]);
    }
    return out;
  }

  drawAxes(ctx, width, ticks, y) {
    ctx.fillStyle = themeColour("--hs-muted", "#6b7280");
    ctx.strokeStyle = themeColour("--hs-border", "#e5e7eb");
    ctx.lineWidth = 1;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    // Small timelines keep the zero line and the top only; a plot without series (a band
    // alone) has no values to scale.
    const shown = !this.series.length ? [0] : this.height < 100 ? [ticks[0], ticks[ticks.length - 1]] : ticks;
    this.yLabels = shown.map((v) => tickLabel(v, this.unit));
    shown.forEach((v, i) => {
      ctx.beginPath();
      ctx.moveTo(PAD.left, Math.round(y(v)) + 0.5);
      ctx.lineTo(width - PAD.right, Math.round(y(v)) + 0.5);
      ctx.stroke();
      ctx.fillText(this.yLabels[i], PAD.left - 6, y(v));
    });
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const xTicks = Math.max(2, Math.floor((width - PAD.left - PAD.right) / 160));
    const span = this.endMs - this.startMs;
    // Days for long ranges ("11-22 08:00"), seconds for short ones ("08:26:40").
    const [first, last] = span > 86400e3 ? [5, 16] : span > 900e3 ? [11, 16] : [11, 19];
    for (let i = 0; i <= xTicks; i++) {
      const t = this.startMs + (span * i) / xTicks;
      ctx.textAlign = i === 0 ? "left" : i === xTicks ? "right" : "center";
      ctx.fillText(formatTime(t).slice(first, last), this.xOf(t), this.height - PAD.bottom + 6);
    }
  }

  listen() {
    let dragFrom = null;
    const xOf = (event) => event.clientX - this.canvas.getBoundingClientRect().left;
    this.canvas.addEventListener("mousedown", (event) => {
      if (this.startMs === undefined) return;
      dragFrom = xOf(event);
      event.preventDefault();
    });
    // Moves and releases outside the canvas still belong to a drag that started on it.
    this.onMove = (event) => {
      if (this.startMs === undefined) return;
      const x = xOf(event);
      if (dragFrom !== null) {
        const left = Math.max(PAD.left, Math.min(dragFrom, x));
        const right = Math.min(this.canvas.clientWidth - PAD.right, Math.max(dragFrom, x));
        Object.assign(this.selection.style, { left: `${left}px`, width: `${right - left}px` });
        this.selection.hidden = false;
      }
      this.hover(event, x);
    };
    this.onUp = (event) => {
      if (dragFrom === null) return;
      const x = xOf(event);
      const from = dragFrom;
      dragFrom = null;
      this.selection.hidden = true;
      if (Math.abs(x - from) < 4) return;
      const a = this.timeAt(Math.min(from, x));
      const b = this.timeAt(Math.max(from, x));
      if (b > a) this.onSelect(Math.floor(a), Math.ceil(b));
    };
    window.addEventListener("mousemove", this.onMove);
    window.addEventListener("mouseup", this.onUp);
    this.canvas.addEventListener("mouseleave", () => {
      this.cursor.hidden = true;
    });
  }

  hover(event, x) {
    const rect = this.canvas.getBoundingClientRect();
    const inside =
      event.clientY >= rect.top && event.clientY <= rect.bottom && x >= PAD.left && x <= rect.width - PAD.right;
    if (!inside || !this.series.length) {
      this.cursor.hidden = true;
      return;
    }
    const t = this.timeAt(x);
    const step = this.stepIndex(t);
    const lines = this.series.slice(0, 8).map((s) => {
      const point = s.points.find(([pt]) => this.stepIndex(pt) === step);
      return `${s.label}: ${formatValue(point ? point[1] : 0, this.unit)}`;
    });
    this.cursor.textContent = [formatTime(this.startMs + step * this.stepMs), ...lines].join("\n");
    this.cursor.style.left = `${Math.min(x + 12, rect.width - 220)}px`;
    this.cursor.hidden = false;
  }
}

/** Zero is "0" in every unit: "0 ns" on an axis of seconds reads as a precision it has not. */
export function tickLabel(value, unit) {
  return value === 0 ? "0" : formatValue(value, unit);
}

/**
 * Axis ticks from 0 to at least `top`, on round numbers of the unit: 1, 2, 2.5 or 5 times a
 * power of ten of the unit people read (ns -> ms/s, bytes -> KiB/MiB), at most 4 steps.
 */
export function niceTicks(top, unit) {
  if (!(top > 0)) return [0, 1];
  const base = unitBase(top, unit);
  const raw = top / base / 4;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * power).find((m) => m >= raw) * base;
  const out = [0];
  while (out[out.length - 1] < top - 1e-9 * top) out.push(out.length * step);
  return out;
}

/** The size of the unit a value of this magnitude is written in (1 s = 1e9 ns, 1 MiB...). */
function unitBase(value, unit) {
  if (BYTES.has(unit)) {
    for (const size of [1024 ** 4, 1024 ** 3, 1024 ** 2, 1024]) if (value >= size) return size;
    return 1;
  }
  const scale = { nanoseconds: 1, microseconds: 1e3, milliseconds: 1e6, seconds: 1e9 }[unit];
  if (scale) {
    const ns = value * scale;
    for (const size of [3600e9, 60e9]) if (ns >= size) return size / scale;
  }
  return 1;
}

/** A step (ms) that gives about `points` points over the range, at least 10 s. */
export function stepFor(startMs, endMs, points = 240) {
  return Math.max(10_000, Math.ceil((endMs - startMs) / points / 1000) * 1000);
}
