// Label breakdown (as in Grafana's Explore Profiles): one small timeline per value of the
// grouped-by label, largest first, capped so that the page stays readable.  Picking a value
// narrows the query to it; "vs <baseline>" opens the diff of that value against the baseline
// value (the largest, until another card is made the baseline).

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
   *   onPick: (group: {name: string, value: string}) => void,
   *   compareHref?: (baseline: {name: string, value: string},
   *     comparison: {name: string, value: string}) => string | null}} options
   */
  constructor(container, { onSelect, onPick, compareHref = null }) {
    this.container = container;
    this.onSelect = onSelect;
    this.onPick = onPick;
    this.compareHref = compareHref;
    this.timelines = [];
    this.heads = []; // [group, the element its compare controls go in]
    this.baseline = null; // the group the others are compared with
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
    this.heads = [];
    const groups = shown.map(({ series: s }) => s.group).filter(Boolean);
    const kept = this.baseline && groups.find((g) => g.name === this.baseline.name && g.value === this.baseline.value);
    this.baseline = kept || groups[0] || null;
    shown.forEach(({ series: s, total, colour }) => {
      const value = s.group ? s.group.value : "";
      const slot = el("div", { class: "hs-breakdown-plot" });
      const compare = el("span", { class: "hs-breakdown-compare-box" });
      if (s.group) this.heads.push([s.group, compare]);
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
          compare,
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
    this.renderCompare();
  }

  /** Each card's compare controls: the baseline's mark, or a link to the diff against it and
   * a button that makes this card the baseline. */
  renderCompare() {
    if (!this.compareHref) return;
    const base = this.baseline;
    for (const [group, box] of this.heads) {
      if (base && group.value === base.value) {
        box.replaceChildren(
          el(
            "span",
            { class: "hs-breakdown-baseline", title: "The other values are compared with this one" },
            "baseline",
          ),
        );
        continue;
      }
      const href = base ? this.compareHref(base, group) : null;
      box.replaceChildren(
        href
          ? el(
              "a",
              {
                class: "hs-breakdown-compare",
                href,
                title: `Diff: ${base.name}="${base.value}" (baseline) against ${group.name}="${group.value}"`,
              },
              `vs ${base.value || "(none)"}`,
            )
          : null,
        el(
          "button",
          {
            type: "button",
            class: "hs-link hs-breakdown-make-baseline",
            title: "Compare the other values with this one",
            onclick: () => {
              this.baseline = group;
              this.renderCompare();
            },
          },
          "as baseline",
        ),
      );
    }
  }
}
