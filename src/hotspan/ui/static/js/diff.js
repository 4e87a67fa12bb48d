// The diff view (`/diff`): a baseline and a comparison, each a selector and a time range, or
// a trace (and one of its spans) from the trace view.
//
//   /diff?profileType=<id>&leftQuery=...&leftFrom=...&leftUntil=...
//        &rightQuery=...&rightFrom=...&rightUntil=...
//        &leftTraceId=<32 hex>&leftSpanId=<16 hex>&rightTraceId=...&rightSpanId=...
//        &search=...&zoom=...&sort=...&sandwich=...   (the flame graph's state)
//
// A side with a trace id compares that trace's samples, or with a span id that span's and
// its descendants'; its selector (leftQuery/rightQuery) still narrows it when given.

import { CPU, querier } from "./api.js";
import { ALL, DiffSide, typeWords } from "./diffside.js";
import { el, message } from "./dom.js";
import { unitOf } from "./format.js";
import { formatSelector } from "./labels.js";
import { ProfilePanel } from "./panel.js";
import { panelState, setQuery } from "./router.js";
import { agentHint, catalogue, errorBox, pickType, selectOf, typeLabel } from "./selection.js";
import { DEFAULT_FROM, DEFAULT_UNTIL } from "./timerange.js";

class DiffView {
  constructor(root, params) {
    this.root = root;
    this.profileType = params.get("profileType") || "";
    const common = params.get("query") || "";
    this.controller = null;
    this.typeSlot = el("span", { class: "hs-field" });
    // The picker is there from the start, so that a side that fails still leaves it to change.
    this.renderTypes(new Set([this.profileType || CPU]));
    const sides = el("div", { class: "hs-diff-sides" });
    this.notice = el("div", { class: "hs-banner" });
    const panelSlot = el("section", { class: "hs-profile hs-diff-profile" });
    root.append(
      el("h1", { class: "hs-title" }, "Diff"),
      el(
        "section",
        { class: "hs-toolbar hs-diff-toolbar" },
        el("label", {}, "Profile ", this.typeSlot),
        el(
          "span",
          { class: "hs-muted" },
          "Red frames grew from baseline to comparison, green ones shrank (each side as a share of its own total).",
        ),
      ),
      sides,
      this.notice,
      panelSlot,
    );
    const onChange = () => this.changed();
    const side = (prefix, title, role) => {
      const traceId = params.get(`${prefix}TraceId`) || "";
      const spanId = params.get(`${prefix}SpanId`) || "";
      const from = params.get(`${prefix}From`);
      const until = params.get(`${prefix}Until`);
      return new DiffSide(sides, {
        title,
        role,
        className: `hs-diff-${prefix}`,
        // A trace side without a selector takes every sample of the trace, whatever service.
        query: params.get(`${prefix}Query`) || common || (traceId || spanId ? ALL : ""),
        from: from || DEFAULT_FROM,
        until: until || DEFAULT_UNTIL,
        traceId,
        spanId,
        rangeGiven: Boolean(from || until),
        onChange,
      });
    };
    this.left = side("left", "Baseline", "baseline");
    this.right = side("right", "Comparison", "comparison");
    this.panel = new ProfilePanel(panelSlot, {
      unit: unitOf(this.profileType || CPU),
      title: "",
      exportName: "diff",
      exports: () => this.serverExports(),
      ...panelState(params),
    });
    this.load();
  }

  destroy() {
    if (this.controller) this.controller.abort();
    this.left.timeline.destroy();
    this.right.timeline.destroy();
    this.panel.destroy();
  }

  changed() {
    this.writeAddress({ push: true });
    this.load();
  }

  /** Both sides and the profile type into the address, so that it reopens this comparison. */
  writeAddress({ push = false } = {}) {
    const address = {};
    for (const [prefix, side] of [
      ["left", this.left],
      ["right", this.right],
    ]) {
      Object.assign(address, {
        [`${prefix}Query`]: side.query,
        [`${prefix}From`]: side.from,
        [`${prefix}Until`]: side.until,
        [`${prefix}TraceId`]: side.traceId,
        [`${prefix}SpanId`]: side.spanId,
      });
    }
    setQuery({ profileType: this.profileType, ...address }, { push });
  }

  async load() {
    if (this.controller) this.controller.abort();
    const controller = new AbortController();
    this.controller = controller;
    const { signal } = controller;
    const sides = [this.left, this.right];
    this.panel.setLoading("Comparing…");
    for (const side of sides) side.fail(null);
    try {
      // Both sides resolve, each saying on itself what is wrong with it (once: the panel
      // below only points at them).
      const resolved = await Promise.allSettled(sides.map((side) => side.resolve(signal)));
      if (signal.aborted) return;
      resolved.forEach((result, i) => {
        if (result.status === "rejected") {
          if (result.reason.name === "AbortError") throw result.reason;
          sides[i].fail(result.reason);
        }
        sides[i].renderSubject(this.profileType);
      });
      const failed = sides.filter((side) => side.failed);
      if (failed.length) {
        const which = failed.map((side) => side.role).join(" and the ");
        const notes = failed.length > 1 ? "their notes" : "its note";
        this.panel.setMessage(
          message(
            "error",
            `The ${which} cannot be compared: see ${notes} above.`,
            "Correct the trace or span id in the address, or compare a selector on that side instead.",
          ),
        );
        return;
      }
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
      for (const side of sides) {
        if (!side.isTrace && (!side.query || side.query === ALL)) {
          side.query = formatSelector([{ name: "service_name", op: "=", value: names[0] }]);
          side.showQuery();
          side.renderFilters();
        }
      }
      const service = this.right.service() || this.left.service() || names[0];
      const types = services.get(service) || services.get(names[0]);
      const wanted = this.profileType;
      this.profileType = pickType(types, wanted);
      this.notice.replaceChildren();
      if (wanted && wanted !== this.profileType) {
        this.notice.append(
          message(
            "info",
            `Profile type "${wanted}" has no data here; comparing ${typeLabel(this.profileType)}.`,
            "Pick another profile type, or widen the time ranges.",
          ),
        );
      }
      this.writeAddress();
      for (const side of sides) side.renderSubject(this.profileType);
      this.renderTypes(types);
      const unit = unitOf(this.profileType);
      this.left.loadTimeline(this.profileType, signal);
      this.right.loadTimeline(this.profileType, signal);
      const answer = await querier(
        "Diff",
        {
          left: this.left.request(this.profileType),
          right: this.right.request(this.profileType),
        },
        { signal },
      );
      if (signal.aborted) return;
      const graph = answer.flamegraph || {};
      const empty = sides.filter((side, i) => !Number([graph.leftTicks, graph.rightTicks][i] || 0));
      if (empty.length) {
        this.showEmpty(empty);
        return;
      }
      this.panel.setData(graph, { unit, title: `${this.left.describe()} → ${this.right.describe()}` });
    } catch (err) {
      if (err.name === "AbortError") return;
      this.panel.setMessage(errorBox(err));
    }
  }

  renderTypes(types) {
    this.typeSlot.replaceChildren(
      selectOf(
        "hs-profile-type",
        "Profile type",
        [...types].sort().map((t) => [t, typeLabel(t)]),
        this.profileType || CPU,
        (value) => {
          this.profileType = value;
          this.changed();
        },
      ),
    );
  }

  /** Which side has nothing, and with what; both forms stay, so either can be changed. */
  showEmpty(empty) {
    for (const side of empty) {
      side.setNote(message("empty", `No ${typeWords(this.profileType)} samples here.`));
    }
    const texts = empty.map((side) => side.emptyText(this.profileType));
    const text = empty.length === 2 ? `Neither side has samples. ${texts.join("; ")}.` : `${texts[0]}.`;
    const hint =
      empty.length === 2
        ? "Change either side (a wider range, another selector or profile type); each side needs samples to compare."
        : empty[0].emptyHint();
    this.panel.setMessage(message("empty", text, hint));
  }

  serverExports() {
    const out = [];
    for (const side of [this.left, this.right]) {
      try {
        out.push(side.exportItem(this.profileType));
      } catch {
        // A side whose range does not parse has nothing to export.
      }
    }
    return out;
  }
}

export function renderDiff(root, { params }) {
  const view = new DiffView(root, params);
  return () => view.destroy();
}
