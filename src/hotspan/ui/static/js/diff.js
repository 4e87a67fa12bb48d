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

import { CPU, getBytes, querier, querierBinary, selectMergeProfileRequest } from "./api.js";
import { checkIds, describeSubject, loadSubject, traceHref } from "./diffsubject.js";
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
import {
  absoluteRange,
  DEFAULT_FROM,
  DEFAULT_UNTIL,
  describeRange,
  resolveRange,
  TimeRangePicker,
} from "./timerange.js";

const STYLESHEET = "/static/css/diff.css";
const ALL = "{}";

/** The page's own styles (layout of the two sides); a no-op once index.html links them. */
function linkStylesheet() {
  if (document.querySelector(`link[href^="${STYLESHEET}"]`)) return;
  document.head.append(el("link", { rel: "stylesheet", href: STYLESHEET }));
}

/** "CPU time" out of "CPU time · process_cpu / cpu (ns)": what a sentence names. */
function typeWords(profileType) {
  return typeLabel(profileType).split(" · ")[0];
}

/** One side of a comparison: a selector and a time range, or a trace or span, with its own form. */
class DiffSide {
  constructor(container, { title, role, className, query, from, until, traceId, spanId, rangeGiven, onChange }) {
    this.title = title;
    this.role = role; // "baseline" / "comparison", as sentences name the side
    this.query = query;
    this.from = from;
    this.until = until;
    this.onChange = onChange;
    this.traceId = "";
    this.spanId = "";
    this.idError = "";
    this.subject = null; // what loadSubject found for the trace side
    this.rangeGiven = rangeGiven;
    if (traceId || spanId) {
      try {
        ({ traceId: this.traceId, spanId: this.spanId } = checkIds(traceId, spanId));
      } catch (err) {
        this.idError = err.message;
      }
    }
    this.input = el("input", { class: "hs-diff-query", "aria-label": `${title} selector`, value: query });
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
    this.subjectSlot = el("div", { class: "hs-diff-subject" });
    this.filterSlot = el("div", { class: "hs-diff-filters" });
    this.note = el("div", { class: "hs-diff-side-note" });
    const rangeSlot = el("div", {});
    this.timelineSlot = el("div", { class: "hs-diff-timeline" });
    container.append(el("section", { class: `hs-diff-side ${className}`, "aria-label": title },
      el("h2", {}, title), this.subjectSlot, form, this.filterSlot, rangeSlot, this.note, this.timelineSlot));
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
    this.timeline = new Timeline(this.timelineSlot, {
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
    this.renderSubject();
  }

  get isTrace() {
    return Boolean(this.traceId || this.idError);
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

  /** What a trace side compares, with the way back to the trace and out of it. */
  renderSubject(profileType = "") {
    // SelectSeries has no trace filter: a service's timeline beside one trace's samples
    // would show something else than the flame graph compares.
    this.timelineSlot.hidden = this.isTrace;
    if (!this.isTrace) {
      this.subjectSlot.replaceChildren();
      return;
    }
    const leave = el("button", {
      type: "button",
      class: "hs-link hs-diff-leave-trace",
      title: "Compare a label selector and time range on this side instead",
      onclick: () => this.leaveTrace(),
    }, "Compare a selector instead");
    if (this.idError) {
      this.subjectSlot.replaceChildren(el("p", { class: "hs-diff-subject-text" }, this.idError, " "), leave);
      return;
    }
    const subject = this.subject || { traceId: this.traceId, spanId: this.spanId, span: null, name: "" };
    const parts = [
      el("a", { class: "hs-diff-trace-link", href: traceHref(subject, profileType), title: `Open trace ${subject.traceId}` },
        describeSubject(subject)),
    ];
    if (this.subject && subject.spanId) {
      const below = subject.spanIds.length - 1;
      parts.push(below > 0 ? `, with its ${below} descendant span${below === 1 ? "" : "s"}` : "");
      if (!subject.stored) parts.push(" (the trace's spans are not stored: the span's own samples only)");
    }
    this.subjectSlot.replaceChildren(el("p", { class: "hs-diff-subject-text" }, ...parts, " "), leave);
  }

  leaveTrace() {
    const service = this.subject && this.subject.service;
    this.traceId = this.spanId = this.idError = "";
    this.subject = null;
    if (!this.query || this.query === ALL) {
      this.query = service ? formatSelector([{ name: "service_name", op: "=", value: service }]) : "";
      this.input.value = this.query;
      this.renderFilters();
    }
    this.renderSubject();
    this.onChange();
  }

  /** For a trace side: its spans, once per trace and span, and its range if none was given. */
  async resolve(signal) {
    if (this.idError) throw new Error(this.idError);
    if (!this.traceId) return;
    const s = this.subject;
    if (!s || s.traceId !== this.traceId || s.spanId !== this.spanId) {
      this.subject = await loadSubject({ traceId: this.traceId, spanId: this.spanId }, signal);
    }
    if (!this.rangeGiven && this.subject.window) {
      const r = absoluteRange(this.subject.window.startMs, this.subject.window.endMs);
      this.from = r.from;
      this.until = r.until;
      this.picker.set(r.from, r.until);
    }
    this.rangeGiven = true;
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

  /** The service whose profile types the picker offers. */
  service() {
    if (this.subject && this.subject.service) return this.subject.service;
    try {
      return serviceOf(parseSelector(this.query)) || "";
    } catch {
      return "";
    }
  }

  /** What this side is, in a sentence: the span or trace, or the selector. */
  describe() {
    if (this.traceId) return describeSubject(this.subject || { traceId: this.traceId, spanId: this.spanId });
    return this.query;
  }

  request(profileType) {
    const { startMs, endMs } = this.range();
    const out = { profileTypeID: profileType, labelSelector: this.query || ALL, start: startMs, end: endMs };
    if (this.traceId) out.traceIdSelector = [this.traceId];
    if (this.subject && this.subject.spanIds.length) out.spanSelector = this.subject.spanIds;
    return out;
  }

  /** Says on the side itself what is wrong with it ("" clears). */
  setNote(node) {
    this.note.replaceChildren(...(node ? [node] : []));
  }

  emptyText(profileType) {
    return `The ${this.role} (${this.describe()}) has no ${typeWords(profileType)} samples in ` +
      `${describeRange(this.from, this.until).replace(/^Last/, "the last")}`;
  }

  emptyHint() {
    if (this.traceId && this.spanId) {
      return "A span has samples only if it ran on CPU long enough to be sampled and its agent " +
        "has uploaded them: pick a longer span or the whole trace, or another profile type.";
    }
    if (this.traceId) return "Its agent may not have uploaded them yet, or it sends another profile type.";
    return `Widen the ${this.role}'s time range or change its selector; each side needs samples to compare.`;
  }

  async loadTimeline(profileType, signal) {
    if (this.isTrace) return;
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

  /** The side's samples as a pprof file: the span profile for a span, else SelectMergeProfile. */
  exportItem(profileType) {
    const { startMs, endMs } = this.range();
    const label = `pprof (${this.role})`;
    const filename = `${this.role}.pb`;
    if (this.traceId && this.spanId) {
      return {
        label, filename,
        fetch: () => getBytes(`/api/traces/${this.traceId}/profile`, {
          spanID: this.spanId, descendants: "true", format: "pprof", profileType,
          labelSelector: this.query && this.query !== ALL ? this.query : null,
          start: Math.floor(startMs / 1000), end: Math.ceil(endMs / 1000),
        }),
      };
    }
    return {
      label, filename,
      fetch: async () => querierBinary("SelectMergeProfile", selectMergeProfileRequest({
        profileTypeID: profileType, labelSelector: this.query || ALL,
        start: startMs, end: endMs, traceIds: this.traceId ? [this.traceId] : [],
      })),
    };
  }
}

class DiffView {
  constructor(root, params) {
    linkStylesheet();
    this.root = root;
    this.profileType = params.get("profileType") || "";
    const common = params.get("query") || "";
    this.controller = null;
    this.typeSlot = el("span", { class: "hs-field" });
    const sides = el("div", { class: "hs-diff-sides" });
    this.notice = el("div", { class: "hs-banner" });
    const panelSlot = el("section", { class: "hs-profile hs-diff-profile" });
    root.append(
      el("h1", { class: "hs-title" }, "Diff"),
      el("section", { class: "hs-toolbar hs-diff-toolbar" }, el("label", {}, "Profile ", this.typeSlot),
        el("span", { class: "hs-muted" },
          "Red frames grew from baseline to comparison, green ones shrank (each side as a share of its own total).")),
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
        title, role, className: `hs-diff-${prefix}`,
        // A trace side without a selector takes every sample of the trace, whatever service.
        query: params.get(`${prefix}Query`) || common || (traceId || spanId ? ALL : ""),
        from: from || DEFAULT_FROM, until: until || DEFAULT_UNTIL,
        traceId, spanId, rangeGiven: Boolean(from || until),
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
      // The flame graph's own state lives in the address too, so a reload reopens it.
      search: params.get("search") || "",
      onSearch: (search) => setQuery({ search }),
      zoom: params.get("zoom") || "",
      onZoom: (zoom) => setQuery({ zoom }),
      sort: params.get("sort") || "",
      onSort: (sort) => setQuery({ sort }),
      sandwich: params.get("sandwich") || "",
      onSandwich: (sandwich) => setQuery({ sandwich }),
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
    const address = {};
    for (const [prefix, side] of [["left", this.left], ["right", this.right]]) {
      Object.assign(address, {
        [`${prefix}Query`]: side.query, [`${prefix}From`]: side.from, [`${prefix}Until`]: side.until,
        [`${prefix}TraceId`]: side.traceId, [`${prefix}SpanId`]: side.spanId,
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
    for (const side of sides) side.setNote(null);
    try {
      for (const side of sides) {
        try {
          await side.resolve(signal);
        } catch (err) {
          if (err.name === "AbortError") throw err;
          side.setNote(message("error", err.message));
          side.renderSubject(this.profileType);
          throw new Error(`The ${side.role} cannot be compared: ${err.message}.`, { cause: err });
        }
        if (signal.aborted) return;
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
          side.input.value = side.query;
          side.renderFilters();
        }
      }
      const service = this.right.service() || this.left.service() || names[0];
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
      for (const side of sides) side.renderSubject(this.profileType);
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

  /** Which side has nothing, and with what; both forms stay, so either can be changed. */
  showEmpty(empty) {
    for (const side of empty) {
      side.setNote(message("empty", `No ${typeWords(this.profileType)} samples here.`));
    }
    const texts = empty.map((side) => side.emptyText(this.profileType));
    const text = empty.length === 2 ? `Neither side has samples. ${texts.join("; ")}.` : `${texts[0]}.`;
    const hint = empty.length === 2
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
