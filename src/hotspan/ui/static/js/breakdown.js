// Label breakdown (as in Grafana's Explore Profiles): one small timeline per value of the
// grouped-by label, largest first, capped so that the page stays readable.  Picking a value
// narrows the query to it.

import { el } from "./dom.js";
import { formatValue } from "./format.js";
import { seriesTotal } from "./selection.js";
import { seriesColours, Timeline } from "./timeline.js";

export const BREAKDOWN_LIMIT = 12;
const SMALL_HEIGHT = 72;

export class Breakdown {
  /**
   * @param {HTMLElement} container
   * @param {{onSelect: (startMs: number, endMs: number) => void,
   *   onPick: (group: {name: string, value: string}) => void}} options
   */
  constructor(container, { onSelect, onPick }) {
    this.container = container;
    this.onSelect = onSelect;
    this.onPick = onPick;
    this.timelines = [];
  }

  clear() {
    for (const t of this.timelines) t.destroy();
    this.timelines = [];
    this.container.replaceChildren();
  }

  destroy() {
    this.clear();
  }

  render(series, { startMs, endMs, stepMs, unit, label }) {
    this.clear();
    // In the series' own order, as the grouped timeline colours them: ranking must not repaint.
    const colours = seriesColours(series);
    const ranked = series
      .map((s, i) => ({ series: s, total: seriesTotal(s), colour: colours[i] }))
      .sort((a, b) => b.total - a.total);
    const shown = ranked.slice(0, BREAKDOWN_LIMIT);
    const left = ranked.length - shown.length;
    const grid = el("div", { class: "hs-breakdown", "aria-label": `Breakdown by ${label}` });
    shown.forEach(({ series: s, total, colour }) => {
      const value = s.group ? s.group.value : "";
      const slot = el("div", { class: "hs-breakdown-plot" });
      const card = el(
        "div",
        { class: "hs-breakdown-card", dataset: { value } },
        el(
          "div",
          { class: "hs-breakdown-head" },
          el(
            "button",
            {
              type: "button",
              class: "hs-link hs-breakdown-pick",
              title: `Show only ${label}="${value}"`,
              onclick: () => s.group && this.onPick(s.group),
            },
            value || `(no ${label})`,
          ),
          el("span", { class: "hs-muted" }, formatValue(total, unit)),
        ),
        slot,
      );
      grid.append(card);
      const timeline = new Timeline(slot, { unit, onSelect: this.onSelect, height: SMALL_HEIGHT, colour });
      timeline.setData([{ ...s, group: null }], startMs, endMs, stepMs);
      this.timelines.push(timeline);
    });
    const parts = [grid];
    if (!ranked.length) parts.push(el("p", { class: "hs-muted" }, `No values of ${label} in this range.`));
    if (left > 0) {
      parts.push(
        el(
          "p",
          { class: "hs-muted hs-breakdown-more" },
          `${left} more ${left === 1 ? "value" : "values"} of ${label} not shown (the ${BREAKDOWN_LIMIT} largest are).`,
        ),
      );
    }
    this.container.replaceChildren(...parts);
  }
}
