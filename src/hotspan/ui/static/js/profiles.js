// The profile explorer (`/`, `/profiles`).
//
// URL parameters, as Pyroscope names them where it has a name:
//   /profiles?profileType=<id>&query={service_name="api",env="prod"}&from=now-1h&until=now
//             &groupBy=<label>&traceId=<32 hex>|spanId=<16 hex>&search=<flame graph search>

import { CPU, getJSON, querier, querierBinary, selectMergeProfileRequest } from "./api.js";
import { el, message, rejectInput } from "./dom.js";
import { LabelFilters } from "./filters.js";
import { formatTime, unitOf } from "./format.js";
import { formatSelector, parseSelector, serviceOf, withService } from "./labels.js";
import { ProfilePanel } from "./panel.js";
import { setQuery } from "./router.js";
import { settingsPath } from "./settings.js";
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

const TRACE_ID = /^[0-9a-f]{32}$/;
const SPAN_ID = /^[0-9a-f]{16}$/;

class ProfilesView {
  constructor(root, params) {
    this.root = root;
    this.state = {
      profileType: params.get("profileType") || "",
      query: params.get("query") || "{}",
      from: params.get("from") || DEFAULT_FROM,
      until: params.get("until") || DEFAULT_UNTIL,
      groupBy: params.get("groupBy") || "",
      traceId: (params.get("traceId") || "").toLowerCase(),
      spanId: (params.get("spanId") || "").toLowerCase(),
      search: params.get("search") || "",
    };
    this.controller = null;
    this.build();
    this.load();
  }

  build() {
    this.serviceSlot = el("span", { class: "hs-field" });
    this.settingsSlot = el("span", { class: "hs-field" });
    this.typeSlot = el("span", { class: "hs-field" });
    const rangeSlot = el("span", { class: "hs-field" });
    this.traceInput = el("input", {
      class: "hs-trace-filter",
      "aria-label": "Trace or span id",
      placeholder: "trace id or span id",
      size: 34,
      value: this.state.traceId || this.state.spanId,
    });
    const traceForm = el(
      "form",
      { class: "hs-trace-form", onsubmit: (e) => this.applyTraceFilter(e) },
      this.traceInput,
      el("button", { type: "submit" }, "Filter"),
    );
    this.traceNote = el("span", { class: "hs-trace-note" });
    this.toolbar = el(
      "section",
      { class: "hs-toolbar" },
      el("label", {}, "Service ", this.serviceSlot),
      this.settingsSlot,
      el("label", {}, "Profile ", this.typeSlot),
      rangeSlot,
      traceForm,
      this.traceNote,
    );
    this.filterSlot = el("div", { class: "hs-filter-row" });
    this.groupSlot = el("span", { class: "hs-field" });
    this.timelineSlot = el("div", {});
    this.banner = el("div", { class: "hs-banner" });
    const panelSlot = el("section", { class: "hs-profile" });
    this.root.append(
      el("h1", { class: "hs-title" }, "Profiles"),
      this.toolbar,
      this.filterSlot,
      el("section", { class: "hs-timeline-section" },
        el("div", { class: "hs-timeline-head" }, el("span", {}, "Over time"), this.groupSlot),
        this.timelineSlot),
      this.banner,
      panelSlot,
    );
    this.picker = new TimeRangePicker(rangeSlot, {
      from: this.state.from,
      until: this.state.until,
      onChange: (from, until) => this.change({ from, until }, true),
    });
    this.timeline = new Timeline(this.timelineSlot, {
      unit: unitOf(this.state.profileType || CPU),
      onSelect: (startMs, endMs) => {
        const { from, until } = absoluteRange(startMs, endMs);
        this.picker.set(from, until);
        this.change({ from, until }, true);
      },
    });
    this.panel = new ProfilePanel(panelSlot, {
      unit: unitOf(this.state.profileType || CPU),
      title: "",
      exportName: "profile",
      exports: () => this.serverExports(),
      search: this.state.search,
      onSearch: (search) => setQuery({ search }),
    });
    this.renderTraceNote();
  }

  destroy() {
    if (this.controller) this.controller.abort();
    this.timeline.destroy();
  }

  change(changes, push = false) {
    Object.assign(this.state, changes);
    setQuery(changes, { push });
    this.load();
  }

  applyTraceFilter(event) {
    event.preventDefault();
    const id = this.traceInput.value.trim().toLowerCase().replace(/-/g, "");
    if (id && !TRACE_ID.test(id) && !SPAN_ID.test(id)) {
      rejectInput(
        this.traceInput,
        "a trace id is 32 hex digits, a span id 16 (as OpenTelemetry writes them)",
      );
      return;
    }
    const traceId = TRACE_ID.test(id) ? id : "";
    const spanId = SPAN_ID.test(id) ? id : "";
    this.change({ traceId, spanId }, true);
    this.renderTraceNote();
  }

  renderTraceNote() {
    const { traceId, spanId } = this.state;
    this.traceNote.replaceChildren();
    if (traceId) {
      this.traceNote.append(
        "Only samples of trace (all services) ",
        el("a", { href: `/traces/${traceId}` }, traceId.slice(0, 8)),
        " · ",
        el("button", { type: "button", class: "hs-link", onclick: () => this.clearTrace() }, "clear"),
      );
    } else if (spanId) {
      this.traceNote.append(
        `Only samples of span ${spanId} · `,
        el("button", { type: "button", class: "hs-link", onclick: () => this.clearTrace() }, "clear"),
      );
    }
  }

  clearTrace() {
    this.traceInput.value = "";
    this.change({ traceId: "", spanId: "" }, true);
    this.renderTraceNote();
  }

  matchers() {
    return parseSelector(this.state.query);
  }

  async load() {
    if (this.controller) this.controller.abort();
    const controller = new AbortController();
    this.controller = controller;
    const { signal } = controller;
    this.banner.replaceChildren();
    let range;
    let matchers;
    try {
      range = resolveRange(this.state.from, this.state.until);
      matchers = this.matchers();
    } catch (err) {
      this.panel.setMessage(message("error", err.message, "Fix it in the address bar or pick a preset."));
      return;
    }
    this.range = range;
    this.panel.setLoading("Loading profiles…");
    try {
      const services = await catalogue(range.startMs, range.endMs, signal);
      if (signal.aborted) return;
      if (!services.size) {
        this.serviceSlot.replaceChildren(el("span", { class: "hs-muted" }, "none"));
        this.typeSlot.replaceChildren();
        this.settingsSlot.replaceChildren();
        this.timeline.setMessage("no data");
        this.panel.setMessage(
          message("empty", `No profiles in this time range (${describeRange(this.state.from, this.state.until)}).`, agentHint()),
        );
        if (this.state.traceId) this.offerTraceRange(this.state.traceId, signal);
        return;
      }
      let service = serviceOf(matchers);
      const names = [...services.keys()].sort();
      if (!service || !services.has(service)) {
        if (service) {
          this.banner.replaceChildren(message("info",
            `Service "${service}" has no profiles in this range; showing "${names[0]}".`,
            "Pick another service or widen the time range."));
        }
        service = names[0];
        matchers = withService(matchers, service);
        this.state.query = formatSelector(matchers);
        setQuery({ query: this.state.query });
      }
      const profileType = pickType(services.get(service), this.state.profileType);
      if (this.state.profileType && profileType !== this.state.profileType) {
        this.banner.append(message("info",
          `Profile type "${this.state.profileType}" has no data for "${service}" in this range; showing ${typeLabel(profileType)}.`,
          "Pick another profile type, or widen the time range."));
      }
      if (profileType !== this.state.profileType) {
        this.state.profileType = profileType;
        setQuery({ profileType });
      }
      this.renderPickers(names, services.get(service), matchers, range);
      const unit = unitOf(profileType);
      this.timeline.unit = unit;
      await Promise.all([this.loadTimeline(range, signal), this.loadGraph(range, unit, signal)]);
    } catch (err) {
      if (err.name === "AbortError") return;
      this.timeline.setMessage("no answer");
      this.panel.setTitle("");
      this.panel.setMessage(errorBox(err));
    }
  }

  renderPickers(serviceNames, types, matchers, range) {
    const service = serviceOf(matchers);
    this.serviceSlot.replaceChildren(
      selectOf("hs-service", "Service", serviceNames.map((s) => [s, s || "(no service_name)"]),
        service, (value) => this.change({ query: formatSelector(withService(matchers, value)) }, true)),
    );
    this.settingsSlot.replaceChildren(service
      ? el("a", {
        class: "hs-service-settings",
        href: settingsPath(service),
        title: `Profiling settings that the agents of ${service} follow, and their instances`,
      }, "Settings")
      : "");
    this.typeSlot.replaceChildren(
      selectOf("hs-profile-type", "Profile type", [...types].sort().map((t) => [t, typeLabel(t)]),
        this.state.profileType, (value) => this.change({ profileType: value }, true)),
    );
    this.filterSlot.replaceChildren();
    new LabelFilters(this.filterSlot, {
      matchers,
      range: () => range,
      onChange: (next) => this.change({ query: formatSelector(next) }, true),
    });
    this.renderGroupBy(matchers, range);
  }

  async renderGroupBy(matchers, range) {
    const select = el("select", { class: "hs-group-by", "aria-label": "Group by" },
      el("option", { value: "" }, "no grouping"));
    select.addEventListener("change", () => this.change({ groupBy: select.value }, true));
    this.groupSlot.replaceChildren("Group by ", select);
    try {
      const answer = await querier("LabelNames", {
        matchers: [formatSelector(matchers)], start: range.startMs, end: range.endMs,
      });
      const names = (answer.names || []).filter((n) => !n.startsWith("__") && n !== "service_name");
      select.append(...names.map((n) => el("option", { value: n }, n)));
    } catch {
      // The timeline still works ungrouped; the graph shows the error if the server is away.
    }
    if (this.state.groupBy && ![...select.options].some((o) => o.value === this.state.groupBy)) {
      select.append(el("option", { value: this.state.groupBy }, this.state.groupBy));
    }
    select.value = this.state.groupBy;
  }

  async loadTimeline(range, signal) {
    const stepMs = stepFor(range.startMs, range.endMs);
    try {
      const series = await selectSeries({
        profileType: this.state.profileType,
        selector: this.state.query,
        startMs: range.startMs,
        endMs: range.endMs,
        stepMs,
        groupBy: this.state.groupBy,
      }, signal);
      if (signal.aborted) return;
      this.timeline.setData(series, range.startMs, range.endMs, stepMs);
      this.timeline.setCaption(this.state.traceId || this.state.spanId
        ? "The timeline shows the whole selection; only the flame graph is filtered to the trace."
        : "");
    } catch (err) {
      if (err.name !== "AbortError") this.timeline.setMessage(err.message);
    }
  }

  /** The selector of the flame graph: a trace spans services, so its filter drops the
   * service matcher and keeps the other filters. */
  graphSelector() {
    if (!this.state.traceId && !this.state.spanId) return this.state.query;
    return formatSelector(withService(this.matchers(), ""));
  }

  async loadGraph(range, unit, signal) {
    const request = {
      profileTypeID: this.state.profileType,
      labelSelector: this.graphSelector(),
      start: range.startMs,
      end: range.endMs,
      maxNodes: 16384,
    };
    if (this.state.traceId) request.traceIdSelector = [this.state.traceId];
    if (this.state.spanId) request.spanSelector = [this.state.spanId];
    const answer = await querier("SelectMergeStacktraces", request, { signal });
    if (signal.aborted) return;
    const graph = answer.flamegraph || {};
    if (!Number(graph.total || 0)) {
      const what = this.state.traceId
        ? `No samples carry trace ${this.state.traceId} in ${describeRange(this.state.from, this.state.until)}.`
        : this.state.spanId
          ? `No samples carry span ${this.state.spanId} in ${describeRange(this.state.from, this.state.until)}.`
          : `No data for ${this.state.query} in ${describeRange(this.state.from, this.state.until)}.`;
      const hint = this.state.traceId || this.state.spanId
        ? "Widen the time range to when the trace ran. Samples carry trace and span ids only when the hotspan agent runs in the process that made the span."
        : "Widen the time range or remove a filter.";
      this.panel.setMessage(message("empty", what, hint));
      if (this.state.traceId) this.offerTraceRange(this.state.traceId, signal);
      return;
    }
    const parts = [this.graphSelector(), describeRange(this.state.from, this.state.until)];
    if (this.state.traceId) parts.push(`trace ${this.state.traceId}`);
    if (this.state.spanId) parts.push(`span ${this.state.spanId}`);
    this.panel.setData(graph, { unit, title: parts.join(" · ") });
  }

  /** When hotspan has the trace's spans, offers the range it ran in (padded by the agent's
   * upload window, since samples are stamped with the start of theirs). */
  async offerTraceRange(traceId, signal) {
    let spans;
    try {
      spans = (await getJSON(`/api/traces/${traceId}/spans`, {}, { signal })).spans || [];
    } catch {
      return; // Not a trace hotspan received: the message above already says what to do.
    }
    if (!spans.length || signal.aborted) return;
    const start = Math.min(...spans.map((s) => Number(s.startTimeUnixNano) / 1e6));
    const end = Math.max(...spans.map((s) => (Number(s.startTimeUnixNano) + Number(s.durationNanos)) / 1e6));
    const range = absoluteRange(start - 5 * 60e3, end + 5 * 60e3);
    this.panel.setMessage(message("empty",
      `No samples carry trace ${traceId} in ${describeRange(this.state.from, this.state.until)}.`,
      el("span", {}, `The trace ran at ${formatTime(start)}. `,
        el("button", {
          type: "button",
          class: "hs-primary hs-trace-range",
          onclick: () => {
            this.picker.set(range.from, range.until);
            this.change(range, true);
          },
        }, "Show the time around it"))));
  }

  serverExports() {
    const range = this.range;
    if (!range || this.state.spanId) return [];
    return [
      {
        label: "pprof",
        filename: "profile.pb",
        fetch: async () =>
          querierBinary("SelectMergeProfile", selectMergeProfileRequest({
            profileTypeID: this.state.profileType,
            labelSelector: this.graphSelector(),
            start: range.startMs,
            end: range.endMs,
            traceIds: this.state.traceId ? [this.state.traceId] : [],
          })),
      },
    ];
  }
}

export function renderProfiles(root, { params }) {
  const view = new ProfilesView(root, params);
  return () => view.destroy();
}
