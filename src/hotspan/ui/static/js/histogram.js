// The duration histogram over a trace search (as Tempo's and Datadog's): the matching spans
// by duration, in TraceQL's power-of-two buckets; dragging across bars (or clicking one)
// picks a duration range, which the search then filters on.

import { getJSON } from "./api.js";
import { el } from "./dom.js";
import { formatDuration } from "./format.js";

const MAX_BAR_HEIGHT = 64; // px

/** A duration in nanoseconds as TraceQL and the search form write it: "4.194ms". */
export function durationText(ns) {
  if (ns >= 1e9) return `${Number((ns / 1e9).toFixed(3))}s`;
  if (ns >= 1e6) return `${Number((ns / 1e6).toFixed(3))}ms`;
  if (ns >= 1e3) return `${Number((ns / 1e3).toFixed(3))}us`;
  return `${Math.round(ns)}ns`;
}

const UNIT_NS = { ns: 1, us: 1e3, µs: 1e3, ms: 1e6, s: 1e9, m: 60e9, h: 3600e9 };

/** Nanoseconds of a duration as the form takes it ("250ms", "1.5s"); NaN if none. */
export function parseDurationNs(text) {
  const m = String(text || "")
    .trim()
    .match(/^(\d+(?:\.\d+)?)\s*(ns|us|µs|ms|s|m|h)$/);
  return m ? Number(m[1]) * UNIT_NS[m[2]] : NaN;
}

/** [{upperNs, count}] of an instant `histogram_over_time(duration)` answer, shortest first. */
export function bucketsOf(body) {
  const out = [];
  for (const s of body.series || []) {
    const label = (s.labels || []).find((l) => l.key === "__bucket");
    const v = label && label.value ? label.value : {};
    const seconds = Number(v.doubleValue ?? v.intValue ?? v.stringValue);
    const count = Number(s.value ?? 0);
    if (Number.isFinite(seconds) && seconds > 0 && count > 0) out.push({ upperNs: seconds * 1e9, count });
  }
  return out.sort((a, b) => a.upperNs - b.upperNs);
}

export class DurationHistogram {
  /**
   * @param {HTMLElement} container
   * @param {{onPick: (min: string, max: string) => void}} options `onPick`: the range picked,
   *   as the form's duration fields take it
   */
  constructor(container, { onPick }) {
    this.container = container;
    this.onPick = onPick;
    this.node = el("div", { class: "hs-histogram", "aria-label": "Span durations" });
    container.append(this.node);
  }

  /** Fetches and draws the histogram of `spanset` (a TraceQL spanset filter) over the range;
   * `selected`: the form's [min, max] in ns, marked on the bars. */
  async load(spanset, startS, endS, selected, signal) {
    this.node.replaceChildren(el("span", { class: "hs-muted hs-histogram-loading" }, "Durations…"));
    let body;
    try {
      body = await getJSON(
        "/api/metrics/query",
        { q: `${spanset} | histogram_over_time(duration)`, start: startS, end: endS },
        { signal },
      );
    } catch (err) {
      if (err.name === "AbortError") return;
      this.node.replaceChildren(el("span", { class: "hs-muted" }, `No duration histogram: ${err.message}`));
      return;
    }
    this.draw(bucketsOf(body), selected);
  }

  draw(buckets, [minNs, maxNs] = [0, Infinity]) {
    if (!buckets.length) {
      this.node.replaceChildren();
      return;
    }
    // Every power of two between the shortest and the longest, empty ones too: the axis
    // stays a scale.
    const all = [];
    for (let b = buckets[0].upperNs; b <= buckets[buckets.length - 1].upperNs * 1.0001; b *= 2) {
      const found = buckets.find((x) => Math.abs(x.upperNs - b) / b < 1e-6);
      all.push({ upperNs: b, count: found ? found.count : 0 });
    }
    const most = Math.max(...all.map((b) => b.count));
    const total = all.reduce((n, b) => n + b.count, 0);
    let anchor = -1;
    const bars = all.map((b, i) => {
      const lower = b.upperNs / 2;
      const inRange = lower >= (minNs || 0) * 0.999 && b.upperNs <= (maxNs || Infinity) * 1.001;
      const bar = el(
        "button",
        {
          type: "button",
          class: `hs-histogram-bar${inRange && (minNs || maxNs !== Infinity) ? " hs-in-range" : ""}`,
          dataset: { index: i, upperNs: b.upperNs },
          title: `${formatDuration(lower)} – ${formatDuration(b.upperNs)}: ${b.count} span${b.count === 1 ? "" : "s"}`,
          "aria-label": `${formatDuration(lower)} to ${formatDuration(b.upperNs)}, ${b.count} spans`,
        },
        el("span", { class: "hs-histogram-fill" }),
      );
      // Through the CSSOM: the page's policy refuses style attributes.
      bar.firstChild.style.height = `${Math.max((MAX_BAR_HEIGHT * b.count) / most, b.count ? 2 : 0)}px`;
      bar.addEventListener("pointerdown", (event) => {
        event.preventDefault();
        anchor = i;
        this.mark(bars, i, i);
      });
      bar.addEventListener("pointerenter", () => {
        if (anchor >= 0) this.mark(bars, anchor, i);
      });
      bar.addEventListener("pointerup", () => {
        if (anchor < 0) return;
        const [lo, hi] = [Math.min(anchor, i), Math.max(anchor, i)];
        anchor = -1;
        this.onPick(durationText(all[lo].upperNs / 2), durationText(all[hi].upperNs));
      });
      bar.addEventListener("keydown", (event) => {
        if (event.key === "Enter" || event.key === " ") {
          event.preventDefault();
          this.onPick(durationText(b.upperNs / 2), durationText(b.upperNs));
        }
      });
      return bar;
    });
    this.node.onpointerleave = () => {
      anchor = -1;
    };
    this.node.replaceChildren(
      el("div", { class: "hs-histogram-bars" }, bars),
      el(
        "div",
        { class: "hs-histogram-axis" },
        el("span", {}, formatDuration(all[0].upperNs / 2)),
        el("span", { class: "hs-muted" }, `${total} spans · drag across bars to filter by duration`),
        el("span", {}, formatDuration(all[all.length - 1].upperNs)),
      ),
    );
  }

  mark(bars, a, b) {
    const [lo, hi] = [Math.min(a, b), Math.max(a, b)];
    bars.forEach((bar, i) => bar.classList.toggle("hs-picking", i >= lo && i <= hi));
  }
}
