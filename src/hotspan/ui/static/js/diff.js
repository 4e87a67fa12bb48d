// The diff view (`/diff`): a baseline and a comparison, each a selector and a time range.
//
//   /diff?profileType=<id>&leftQuery=...&leftFrom=...&leftUntil=...
//        &rightQuery=...&rightFrom=...&rightUntil=...&search=<flame graph search>

import { CPU, querier, querierBinary, selectMergeProfileRequest } from "./api.js";
import { el, message, rejectInput } from "./dom.js";
import { LabelFilters } from "./filters.js";
import { unitOf } from "./format.js";
import { formatSelector, parseSelector, serviceOf } from "./labels.js";
import { ProfilePanel } from "./panel.js";
import { setQuery } from "./router.js";
import {
  agentHint,
  catalogue,
  errorBox,
  pickType,
  selectOf,
  selectSeries,
  typeLabel,
} from "./selection.js";
import { Timeline, stepFor } from "./timeline.js";
import { absoluteRange, DEFAULT_FROM, DEFAULT_UNTIL, resolveRange, TimeRangePicker } from "./timerange.js";

/** One side of a comparison: a selector and a time range, with its own small timeline. */
class DiffSide {
  constructor(container, { title, className, query, from, until, onChange }) {
    this.query = query;
    this.from = from;
    this.until = until;
    this.onChange = onChange;
    this.input = el("input", { class: "hs-diff-query", "aria-label": `${title} selector`, size: 40, value: query });
    const form = el("form", {
      class: "hs-diff-form",
      onsubmit: (event) => {
        event.preventDefault();
        try {
          parseSelector(this.input.value);
        } catch (err) {
          rejectInput(this.input, err.message);
          return;
        }
        this.query = this.input.value.trim();
        this.renderFilters();
        this.onChange();
      },
    }, this.input, el("button", { type: "submit" }, "Apply"));
    this.title = title;
    this.filterSlot = el("div", { class: "hs-diff-filters" });
    const rangeSlot = el("div", {});
    const timelineSlot = el("div", {});
    container.append(el("section", { class: `hs-diff-side ${className}` },
      el("h2", {}, title), form, this.filterSlot, rangeSlot, timelineSlot));
    this.picker = new TimeRangePicker(rangeSlot, {
      from, until,
      onChange: (f, u) => {
        this.from = f;
        this.until = u;
        this.takeTypedSelector();
        this.onChange();
      },
    });
    this.renderFilters();
    this.timeline = new Timeline(timelineSlot, {
      unit: "",
      onSelect: (startMs, endMs) => {
        const r = absoluteRange(startMs, endMs);
        this.from = r.from;
        this.until = r.until;
        this.picker.set(r.from, r.until);
        this.takeTypedSelector();
        this.onChange();
      },
    });
  }

  /** Label filters picked from the names and values the server knows, like the explorer's. */
  renderFilters() {
    let matchers;
    try {
      matchers = parseSelector(this.query);
    } catch {
      this.filterSlot.replaceChildren();
      return;
    }
    this.filterSlot.replaceChildren();
    new LabelFilters(this.filterSlot, {
      matchers,
      range: () => this.range(),
      onChange: (next) => {
        this.query = formatSelector(next);
        this.input.value = this.query;
        this.onChange();
      },
    });
  }

  /** A selector typed but not applied still counts when the range is applied. */
  takeTypedSelector() {
    const typed = this.input.value.trim();
    if (typed === this.query) return;
    try {
      parseSelector(typed);
    } catch {
      // Not a selector: the field goes back to the one in use, so that both agree.
      this.input.value = this.query;
      this.input.setCustomValidity("");
      return;
    }
    this.query = typed;
    this.renderFilters();
  }

  range() {
    try {
      return resolveRange(this.from, this.until);
    } catch (err) {
      throw new Error(`${this.title}: ${err.message}`);
    }
  }

  request(profileType) {
    const { startMs, endMs } = this.range();
    return { profileTypeID: profileType, labelSelector: this.query, start: startMs, end: endMs };
  }

  async loadTimeline(profileType, signal) {
    const { startMs, endMs } = this.range();
    const stepMs = stepFor(startMs, endMs, 120);
    this.timeline.unit = unitOf(profileType);
    try {
      const series = await selectSeries({ profileType, selector: this.query, startMs, endMs, stepMs }, signal);
      if (signal.aborted) return;
      this.timeline.setData(series, startMs, endMs, stepMs);
    } catch (err) {
      if (err.name !== "AbortError") this.timeline.setMessage(err.message);
    }
  }
}

class DiffView {
  constructor(root, params) {
    this.root = root;
    this.profileType = params.get("profileType") || "";
    const common = params.get("query") || "";
    this.controller = null;
    this.typeSlot = el("span", { class: "hs-field" });
    const sides = el("div", { class: "hs-diff-sides" });
    this.notice = el("div", { class: "hs-banner" });
    const panelSlot = el("section", { class: "hs-profile" });
    root.append(
      el("h1", { class: "hs-title" }, "Diff"),
      el("section", { class: "hs-toolbar" }, el("label", {}, "Profile ", this.typeSlot),
        el("span", { class: "hs-muted" },
          "Red frames grew from baseline to comparison, green ones shrank (each side as a share of its own total).")),
      sides,
      this.notice,
      panelSlot,
    );
    const onChange = () => this.changed();
    this.left = new DiffSide(sides, {
      title: "Baseline", className: "hs-diff-left",
      query: params.get("leftQuery") || common,
      from: params.get("leftFrom") || DEFAULT_FROM, until: params.get("leftUntil") || DEFAULT_UNTIL,
      onChange,
    });
    this.right = new DiffSide(sides, {
      title: "Comparison", className: "hs-diff-right",
      query: params.get("rightQuery") || common,
      from: params.get("rightFrom") || DEFAULT_FROM, until: params.get("rightUntil") || DEFAULT_UNTIL,
      onChange,
    });
    this.panel = new ProfilePanel(panelSlot, {
      unit: unitOf(this.profileType || CPU),
      title: "",
      exportName: "diff",
      exports: () => this.serverExports(),
      search: params.get("search") || "",
      onSearch: (search) => setQuery({ search }),
    });
    this.load();
  }

  destroy() {
    if (this.controller) this.controller.abort();
    this.left.timeline.destroy();
    this.right.timeline.destroy();
  }

  changed() {
    this.writeAddress({ push: true });
    this.load();
  }

  /** Both sides and the profile type into the address, so that it reopens this comparison. */
  writeAddress({ push = false } = {}) {
    setQuery({
      profileType: this.profileType,
      leftQuery: this.left.query, leftFrom: this.left.from, leftUntil: this.left.until,
      rightQuery: this.right.query, rightFrom: this.right.from, rightUntil: this.right.until,
    }, { push });
  }

  async load() {
    if (this.controller) this.controller.abort();
    const controller = new AbortController();
    this.controller = controller;
    const { signal } = controller;
    this.panel.setLoading("Comparing…");
    try {
      const whole = {
        startMs: Math.min(this.left.range().startMs, this.right.range().startMs),
        endMs: Math.max(this.left.range().endMs, this.right.range().endMs),
      };
      const services = await catalogue(whole.startMs, whole.endMs, signal);
      if (signal.aborted) return;
      if (!services.size) {
        this.panel.setMessage(message("empty", "No profiles in these time ranges.", agentHint()));
        return;
      }
      const names = [...services.keys()].sort();
      for (const side of [this.left, this.right]) {
        if (!side.query || side.query === "{}") {
          side.query = formatSelector([{ name: "service_name", op: "=", value: names[0] }]);
          side.input.value = side.query;
          side.renderFilters();
        }
      }
      const service = serviceOf(parseSelector(this.right.query)) || names[0];
      const types = services.get(service) || services.get(names[0]);
      const wanted = this.profileType;
      this.profileType = pickType(types, wanted);
      this.notice.replaceChildren();
      if (wanted && wanted !== this.profileType) {
        this.notice.append(message("info",
          `Profile type "${wanted}" has no data here; comparing ${typeLabel(this.profileType)}.`,
          "Pick another profile type, or widen the time ranges."));
      }
      this.writeAddress();
      this.typeSlot.replaceChildren(
        selectOf("hs-profile-type", "Profile type", [...types].sort().map((t) => [t, typeLabel(t)]),
          this.profileType, (value) => {
            this.profileType = value;
            this.changed();
          }),
      );
      const unit = unitOf(this.profileType);
      this.left.loadTimeline(this.profileType, signal);
      this.right.loadTimeline(this.profileType, signal);
      const answer = await querier("Diff", {
        left: this.left.request(this.profileType),
        right: this.right.request(this.profileType),
      }, { signal });
      if (signal.aborted) return;
      const graph = answer.flamegraph || {};
      const leftTicks = Number(graph.leftTicks || 0);
      const rightTicks = Number(graph.rightTicks || 0);
      if (!leftTicks || !rightTicks) {
        const empty = !leftTicks && !rightTicks ? "Neither side has data" : !leftTicks
          ? `The baseline ${this.left.query} has no data in its range` : `The comparison ${this.right.query} has no data in its range`;
        this.panel.setMessage(message("empty", `${empty}.`,
          "Widen that side's time range or change its selector; each side needs samples to compare."));
        return;
      }
      this.panel.setData(graph, { unit, title: `${this.left.query} → ${this.right.query}` });
    } catch (err) {
      if (err.name === "AbortError") return;
      this.panel.setMessage(errorBox(err));
    }
  }

  serverExports() {
    const out = [];
    for (const [side, label] of [[this.left, "baseline"], [this.right, "comparison"]]) {
      let range;
      try {
        range = side.range();
      } catch {
        continue;
      }
      out.push({
        label: `pprof (${label})`,
        filename: `${label}.pb`,
        fetch: async () => querierBinary("SelectMergeProfile", selectMergeProfileRequest({
          profileTypeID: this.profileType, labelSelector: side.query,
          start: range.startMs, end: range.endMs,
        })),
      });
    }
    return out;
  }
}

export function renderDiff(root, { params }) {
  const view = new DiffView(root, params);
  return () => view.destroy();
}
