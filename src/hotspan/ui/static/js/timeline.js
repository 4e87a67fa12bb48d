// The timeline above a flame graph: the total of the selection over time, from SelectSeries,
// one line per group when grouped by a label.  Dragging across it selects a time range.

import { el } from "./dom.js";
import { formatTime, formatValue } from "./format.js";

export const PALETTE = ["#3b82f6", "#f97316", "#10b981", "#e11d48", "#8b5cf6", "#eab308",
  "#06b6d4", "#84cc16", "#ec4899", "#64748b"];
const HEIGHT = 130;
const PAD = { left: 64, right: 12, top: 10, bottom: 22 };

export class Timeline {
  /**
   * @param {HTMLElement} container
   * @param {{unit: string, onSelect: (startMs: number, endMs: number) => void}} options
   */
  constructor(container, { unit, onSelect }) {
    this.unit = unit;
    this.onSelect = onSelect;
    this.series = [];
    this.canvas = el("canvas", { class: "hs-timeline-canvas", "aria-label": "Timeline" });
    this.selection = el("div", { class: "hs-timeline-selection", hidden: true });
    this.cursor = el("div", { class: "hs-timeline-tooltip", hidden: true });
    this.legend = el("div", { class: "hs-timeline-legend" });
    this.caption = el("div", { class: "hs-timeline-caption", hidden: true });
    this.note = el("div", { class: "hs-timeline-note", hidden: true });
    this.plot = el("div", { class: "hs-timeline-plot" }, this.canvas, this.selection, this.cursor,
      this.note);
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
    this.startMs = startMs;
    this.endMs = endMs;
    this.stepMs = stepMs;
    this.note.hidden = true;
    this.legend.replaceChildren(
      ...(series.length > 1 ? series : []).map((s, i) =>
        el("span", { class: "hs-legend-item" },
          el("span", { class: "hs-legend-swatch", dataset: { color: String(i) } }), s.label),
      ),
    );
    for (const swatch of this.legend.querySelectorAll(".hs-legend-swatch")) {
      swatch.style.background = PALETTE[Number(swatch.dataset.color) % PALETTE.length];
    }
    this.draw();
  }

  setMessage(text) {
    this.series = [];
    this.startMs = undefined; // no axis for a range that has no answer
    this.setCaption("");
    this.note.textContent = text;
    this.note.hidden = false;
    this.legend.replaceChildren();
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
    this.canvas.height = Math.round(HEIGHT * ratio);
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${HEIGHT}px`;
    const ctx = this.canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, HEIGHT);
    if (this.startMs === undefined) return;
    const filled = this.series.map((s) => this.fill(s.points));
    const max = Math.max(1, ...filled.flatMap((points) => points.map(([, v]) => v)));
    const y = (v) => PAD.top + (1 - v / max) * (HEIGHT - PAD.top - PAD.bottom);
    this.drawAxes(ctx, width, max, y);
    filled.forEach((points, i) => {
      const color = PALETTE[i % PALETTE.length];
      ctx.beginPath();
      points.forEach(([t, v], j) => {
        const px = this.xOf(t);
        if (j === 0) ctx.moveTo(px, y(v));
        else ctx.lineTo(px, y(v));
      });
      ctx.strokeStyle = color;
      ctx.lineWidth = 1.5;
      ctx.stroke();
      if (filled.length === 1 && points.length) {
        ctx.lineTo(this.xOf(points[points.length - 1][0]), y(0));
        ctx.lineTo(this.xOf(points[0][0]), y(0));
        ctx.closePath();
        ctx.globalAlpha = 0.18;
        ctx.fillStyle = color;
        ctx.fill();
        ctx.globalAlpha = 1;
      }
    });
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

  drawAxes(ctx, width, max, y) {
    ctx.fillStyle = "#6b7280";
    ctx.strokeStyle = "#e5e7eb";
    ctx.lineWidth = 1;
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    for (const f of [0, 0.5, 1]) {
      const v = max * f;
      ctx.beginPath();
      ctx.moveTo(PAD.left, Math.round(y(v)) + 0.5);
      ctx.lineTo(width - PAD.right, Math.round(y(v)) + 0.5);
      ctx.stroke();
      ctx.fillText(formatValue(v, this.unit), PAD.left - 6, y(v));
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const ticks = Math.max(2, Math.floor((width - PAD.left - PAD.right) / 160));
    const span = this.endMs - this.startMs;
    // Days for long ranges ("11-22 08:00"), seconds for short ones ("08:26:40").
    const [first, last] = span > 86400e3 ? [5, 16] : span > 900e3 ? [11, 16] : [11, 19];
    for (let i = 0; i <= ticks; i++) {
      const t = this.startMs + (span * i) / ticks;
      ctx.textAlign = i === 0 ? "left" : i === ticks ? "right" : "center";
      ctx.fillText(formatTime(t).slice(first, last), this.xOf(t), HEIGHT - PAD.bottom + 6);
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
    const inside = event.clientY >= rect.top && event.clientY <= rect.bottom && x >= PAD.left &&
      x <= rect.width - PAD.right;
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

/** A step (ms) that gives about `points` points over the range, at least 10 s. */
export function stepFor(startMs, endMs, points = 240) {
  return Math.max(10_000, Math.ceil((endMs - startMs) / points / 1000) * 1000);
}
