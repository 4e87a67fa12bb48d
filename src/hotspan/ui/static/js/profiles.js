// The profile explorer (`/`, `/profiles`).
//
// URL parameters, as Pyroscope names them where it has a name:
//   /profiles?profileType=<id>&query={service_name="api",env="prod"}&from=now-1h&until=now
//             &groupBy=<label>&groupView=stacked|breakdown&traceId=<32 hex>|spanId=<16 hex>
//             &search=<flame graph search>&zoom=<flame graph zoom>&sort=<table column:dir>
//             &sandwich=<function>
//
// A shared link is shown as written: a service without data in the range is said to have
// none (with the nearest range that has some), never replaced by another service.

import { CPU, getJSON, querier, querierBinary, selectMergeProfileRequest } from "./api.js";
import { Breakdown } from "./breakdown.js";
import { el, message, rejectInput } from "./dom.js";
import { LabelFilters } from "./filters.js";
import { formatTime, unitOf } from "./format.js";
import { formatSelector, parseSelector, serviceOf, suggestedLabel, withMatcher, withService } from "./labels.js";
import { ProfilePanel } from "./panel.js";
import { panelState, setQuery } from "./router.js";
import { alertOnFunctionHref } from "./alerts.js";
import { settingsPath } from "./settings.js";
import { SPAN_ID, TRACE_ID, spanExtentMs } from "./spans.js";
import {
  agentHint,
  catalogue,
  errorBox,
  pickType,
  selectOf,
  selectSeries,
  seriesTotal,
  typeLabel,
} from "./selection.js";
import { Timeline, stepFor } from "./timeline.js";
import {
  absoluteRange,
  DEFAULT_FROM,
  DEFAULT_UNTIL,
  describeRange,
  PRESETS,
  resolveRange,
  TimeRangePicker,
} from "./timerange.js";

const GROUP_VIEWS = [
  ["", "Lines"],
  ["stacked", "Stacked"],
  ["breakdown", "Breakdown"],
];
// Where to look for data when the range shown has none, nearest first.
const WIDER_RANGES = ["now-1h", "now-6h", "now-24h", "now-7d", "now-30d"];
const NO_DATA = "(no data in this range)";
// Around a trace's spans: samples are stamped with the start of the agent's upload window, so
// some come before the first span.  The trace view's "Profiles" link pads the same.
const TRACE_PAD_MS = 5 * 60e3;

class ProfilesView {
  constructor(root, params) {
    this.root = root;
    this.state = {
      profileType: params.get("profileType") || "",
      query: params.get("query") || "{}",
      from: params.get("from") || DEFAULT_FROM,
      until: params.get("until") || DEFAULT_UNTIL,
      groupBy: params.get("groupBy") || "",
      groupView: params.get("groupView") || "",
      // Ids go into API paths: anything but the hex OpenTelemetry writes is no id at all.
      traceId: idParam(params.get("traceId"), TRACE_ID),
      spanId: idParam(params.get("spanId"), SPAN_ID),
    };
    // A trace link without a range (typed by hand) gets the trace's, not the last hour's,
    // where a request of a second is a one-pixel spike.
    this.fitTrace = Boolean(this.state.traceId) && !params.get("from") && !params.get("until");
    this.controller = null;
    this.known = null; // the last catalogue: service -> Set(profile types)
    this.build();
    this.load();
  }

  build() {
    this.serviceSlot = el("span", { class: "hs-field" });
    this.settingsSlot = el("span", { class: "hs-field" });
    this.typeSlot = el("span", { class: "hs-field" });
    const rangeSlot = el("span", { class: "hs-field hs-range-field" });
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
      el("label", { class: "hs-picker" }, "Service ", this.serviceSlot),
      this.settingsSlot,
      el("label", { class: "hs-picker" }, "Profile ", this.typeSlot),
      rangeSlot,
      traceForm,
      this.traceNote,
    );
    this.filterSlot = el("div", { class: "hs-filter-row" });
    this.groupSlot = el("span", { class: "hs-field hs-group-controls" });
    this.timelineSlot = el("div", {});
    this.breakdownSlot = el("div", { class: "hs-breakdown-slot", hidden: true });
    const panelSlot = el("section", { class: "hs-profile" });
    this.root.append(
      el("h1", { class: "hs-title" }, "Profiles"),
      this.toolbar,
      this.filterSlot,
      el(
        "section",
        { class: "hs-timeline-section" },
        el("div", { class: "hs-timeline-head" }, el("span", {}, "Over time"), this.groupSlot),
        this.timelineSlot,
        this.breakdownSlot,
      ),
      panelSlot,
    );
    this.picker = new TimeRangePicker(rangeSlot, {
      from: this.state.from,
      until: this.state.until,
      onChange: (from, until) => this.change({ from, until }, true),
    });
    const onSelect = (startMs, endMs) => {
      const { from, until } = absoluteRange(startMs, endMs);
      this.picker.set(from, until);
      this.change({ from, until }, true);
    };
    this.timeline = new Timeline(this.timelineSlot, {
      unit: unitOf(this.state.profileType || CPU),
      onSelect,
      onLegendPick: (series) => this.narrowTo(series.group, {}),
    });
    this.breakdown = new Breakdown(this.breakdownSlot, {
      onSelect,
      onPick: (group) => this.narrowTo(group, { groupView: "" }),
      compareHref: (baseline, comparison) => this.compareHref(baseline, comparison),
    });
    this.panel = new ProfilePanel(panelSlot, {
      unit: unitOf(this.state.profileType || CPU),
      title: "",
      exportName: "profile",
      exports: () => this.serverExports(),
      frameLinks: (name) => this.frameLinks(name),
      ...panelState(new URLSearchParams(location.search)),
    });
    this.renderTraceNote();
  }

  destroy() {
    if (this.controller) this.controller.abort();
    this.timeline.destroy();
    this.breakdown.destroy();
    this.panel.destroy();
  }

  change(changes, push = false) {
    Object.assign(this.state, changes);
    setQuery(changes, { push });
    this.load();
  }

  /** A function's ways on from its menu: the traces where it is hot, an alert on its share. */
  frameLinks(name) {
    if (this.state.traceId || this.state.spanId) return [];
    const selector = this.graphSelector();
    const hot = new URLSearchParams({
      function: name,
      query: selector,
      from: this.state.from,
      until: this.state.until,
    });
    if (this.state.profileType) hot.set("profileType", this.state.profileType);
    return [
      {
        key: "hot-traces",
        label: "Traces where this function is hot",
        href: `/traces?${hot}`,
        title: "The traces whose spans hold most of this function's samples in the range",
      },
      {
        key: "alert",
        label: "Alert on this function",
        href: alertOnFunctionHref({ selector, profileType: this.state.profileType, name }),
        title: "A new alert rule on this function's share of the profile, filled in",
      },
    ];
  }

  /** The diff of two values of a label over the page's range (Explore Profiles'
   * comparison): the query with `name="baseline"` against it with `name="comparison"`. */
  compareHref(baseline, comparison) {
    let matchers;
    try {
      matchers = this.matchers();
    } catch {
      return null;
    }
    const search = new URLSearchParams({
      profileType: this.state.profileType || CPU,
      leftQuery: formatSelector(withMatcher(matchers, baseline.name, baseline.value)),
      leftFrom: this.state.from,
      leftUntil: this.state.until,
      rightQuery: formatSelector(withMatcher(matchers, comparison.name, comparison.value)),
      rightFrom: this.state.from,
      rightUntil: this.state.until,
    });
    return `/diff?${search}`;
  }

  /** Adds `name="value"` to the query: "show only this series". */
  narrowTo(group, extra) {
    if (!group) return;
    let matchers;
    try {
      matchers = this.matchers();
    } catch {
      return;
    }
    this.change({ query: formatSelector(withMatcher(matchers, group.name, group.value)), ...extra }, true);
  }

  applyTraceFilter(event) {
    event.preventDefault();
    const id = this.traceInput.value.trim().toLowerCase().replace(/-/g, "");
    if (id && !TRACE_ID.test(id) && !SPAN_ID.test(id)) {
      rejectInput(this.traceInput, "a trace id is 32 hex digits, a span id 16 (as OpenTelemetry writes them)");
      return;
    }
    const traceId = TRACE_ID.test(id) ? id : "";
    const spanId = SPAN_ID.test(id) ? id : "";
    this.change({ traceId, spanId }, true);
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
  }

  matchers() {
    return parseSelector(this.state.query);
  }

  traced() {
    return Boolean(this.state.traceId || this.state.spanId);
  }

  /** What the panel shows, in its title: follows the range even when there is no data. */
  title() {
    const parts = [this.graphSelector(), describeRange(this.state.from, this.state.until)];
    if (this.state.traceId) {
      parts[0] = "all services";
      parts.push(`trace ${this.state.traceId}`);
    }
    if (this.state.spanId) parts.push(`span ${this.state.spanId}`);
    return parts.join(" · ");
  }

  /** The exports' file name, without its extension: what was exported and when, so that
   * two exports do not overwrite each other (`shop-cpu-20261129T1130`). */
  fileStem() {
    let service = "";
    try {
      service = serviceOf(this.matchers()) || "";
    } catch {
      // an unreadable selector: the other parts still tell
    }
    const type = String(this.state.profileType || CPU).split(":")[1] || "profile";
    const start = this.range ? new Date(this.range.startMs).toISOString() : "";
    const when = start.slice(0, 16).replace(/[-:]/g, "");
    const parts = [service || "profile", type, when];
    if (this.state.traceId) parts.push(`trace-${this.state.traceId.slice(0, 16)}`);
    if (this.state.spanId) parts.push(`span-${this.state.spanId}`);
    return parts
      .filter(Boolean)
      .join("-")
      .replace(/[^\w.-]+/g, "_");
  }

  async load() {
    if (this.controller) this.controller.abort();
    const controller = new AbortController();
    this.controller = controller;
    const { signal } = controller;
    this.renderTraceNote();
    // The one timeline says what is wrong or loading; a breakdown comes back with its data.
    this.timelineSlot.hidden = false;
    this.breakdownSlot.hidden = true;
    if (this.fitTrace) {
      this.fitTrace = false;
      await this.fitRangeToTrace(signal);
      if (signal.aborted) return;
    }
    let range;
    let matchers = null;
    try {
      matchers = this.matchers();
      range = resolveRange(this.state.from, this.state.until);
    } catch (err) {
      await this.showProblem(err, matchers, signal);
      return;
    }
    this.range = range;
    this.panel.exportName = this.fileStem();
    this.panel.setTitle(this.title());
    this.panel.setLoading("Loading profiles…");
    this.timeline.setLoading();
    this.breakdown.clear();
    try {
      const services = await catalogue(range.startMs, range.endMs, signal);
      if (signal.aborted) return;
      this.known = services;
      if (this.traced()) {
        await this.loadTrace(services, matchers, range, signal);
        return;
      }
      let service = serviceOf(matchers);
      const names = [...services.keys()].sort();
      if (!service && names.length) {
        // No service asked for (the landing page): the first one, written into the URL.
        service = names[0];
        matchers = withService(matchers, service);
        this.state.query = formatSelector(matchers);
        setQuery({ query: this.state.query });
        this.panel.setTitle(this.title());
      }
      if (!services.has(service)) {
        await this.showNoData(service, services, matchers, range, signal);
        return;
      }
      const types = services.get(service);
      this.defaultType(types);
      this.renderPickers(serviceOptions(names, [], service), types, matchers, range);
      if (this.missingType(types, service)) return;
      const { profileType } = this.state;
      const unit = unitOf(profileType);
      this.timeline.unit = unit;
      await Promise.all([this.loadTimeline(range, signal), this.loadGraph(range, unit, signal)]);
    } catch (err) {
      if (err.name === "AbortError") return;
      // The timeline's answer failed with the graph's: it says why, as the panel does.
      this.timeline.setMessage(err.message || String(err), { error: true });
      this.panel.setMessage(errorBox(err));
      if (!this.serviceSlot.firstChild) this.renderFallbackPickers(matchers, range);
    }
  }

  /** No profile type asked for (the landing page): CPU (or the first there is), written into
   * the URL.  One asked for is never replaced: a shared link shows what it names or says why not. */
  defaultType(types) {
    if (this.state.profileType) return;
    this.state.profileType = pickType(types, "");
    setQuery({ profileType: this.state.profileType });
  }

  /**
   * The profile type asked for has no data of `what` (a service, a trace) in the range: like
   * an unknown service, the shared link is kept and the view says so, with the types there are.
   * True when it said so.
   */
  missingType(types, what) {
    const wanted = this.state.profileType;
    if (!wanted || types.has(wanted)) return false;
    const when = describeRange(this.state.from, this.state.until);
    this.timeline.setMessage(`no data of profile type ${wanted} in this range`);
    this.panel.setTitle(this.title());
    const choices = [...types].sort().map((t) =>
      el(
        "button",
        {
          type: "button",
          class: "hs-link hs-type-choice",
          onclick: () => this.change({ profileType: t }, true),
        },
        typeLabel(t),
      ),
    );
    this.panel.setMessage(
      message(
        "empty",
        `No data of profile type ${wanted} for ${what} in this range (${when}).`,
        choices.length
          ? el("span", {}, `${what} has: `, ...choices.flatMap((c, i) => (i ? [", ", c] : [c])), ".")
          : "Pick another profile type, or widen the time range.",
      ),
    );
    return true;
  }

  /**
   * A range or selector that cannot be read: the panel says why, and the pickers stay (from
   * the last catalogue, or the last hour's on a fresh page) so the user can go on from here.
   */
  async showProblem(err, matchers, signal) {
    this.panel.setTitle("");
    this.panel.setMessage(message("error", err.message, "Fix it in the address bar or pick a preset."));
    this.timeline.setMessage(matchers ? "no time range to show" : "no selection to show");
    this.breakdown.clear();
    const fallback = resolveRange(DEFAULT_FROM, DEFAULT_UNTIL);
    if (!this.known) {
      try {
        this.known = await catalogue(fallback.startMs, fallback.endMs, signal);
      } catch {
        this.known = new Map();
      }
      if (signal.aborted) return;
    }
    this.renderFallbackPickers(matchers, fallback);
  }

  renderFallbackPickers(matchers, range) {
    const known = this.known || new Map();
    const service = serviceOf(matchers || []);
    const names = [...known.keys()].sort();
    const types = known.get(service) || allTypes(known);
    this.renderPickers(
      serviceOptions(names, [], service),
      types,
      matchers || [],
      range || resolveRange(DEFAULT_FROM, DEFAULT_UNTIL),
    );
  }

  /**
   * The service asked for has no data in the range (or does not exist): say so, keep the URL,
   * and look further back for the nearest range that has its data.
   */
  async showNoData(service, services, matchers, range, signal) {
    const names = [...services.keys()].sort();
    const when = describeRange(this.state.from, this.state.until);
    const what = service
      ? `No data for ${service} in this range (${when}).`
      : `No profiles in this time range (${when}).`;
    const typesOf = (map) => map.get(service) || allTypes(map);
    this.renderPickers(serviceOptions(names, [], service), typesOf(services), matchers, range);
    this.timeline.setMessage(service ? `no data for ${service} in this range` : "no data");
    this.panel.setTitle(this.title());
    const looking = service ? "Looking for the nearest range with its data…" : agentHint();
    this.panel.setMessage(message("empty", what, looking));
    const found = await this.nearestRange(service, signal);
    if (signal.aborted) return;
    if (!found) {
      this.panel.setMessage(
        message(
          "empty",
          what,
          service
            ? `Nothing for ${service} in the last 30 days either: check the service name, or pick another service.`
            : agentHint(),
        ),
      );
      return;
    }
    // The services of the wider range stay pickable, marked: there is nothing of theirs here.
    const wider = [...found.services.keys()].filter((n) => !services.has(n));
    this.renderPickers(serviceOptions(names, wider, service), typesOf(found.services), matchers, range);
    const label = PRESETS.find(([v]) => v === found.from)?.[1] || found.from;
    this.panel.setMessage(
      message(
        "empty",
        what,
        el(
          "span",
          {},
          `${service || "Profiles"}: data in the ${label.toLowerCase()}. `,
          el(
            "button",
            {
              type: "button",
              class: "hs-primary hs-nearest-range",
              onclick: () => {
                this.picker.set(found.from, "now");
                this.change({ from: found.from, until: "now" }, true);
              },
            },
            `Show the ${label.toLowerCase()}`,
          ),
        ),
      ),
    );
  }

  /** The nearest relative range (1 h, 6 h, ... 30 days) that has data of `service` (or any). */
  async nearestRange(service, signal) {
    let shown;
    try {
      shown = resolveRange(this.state.from, this.state.until);
    } catch {
      return null;
    }
    for (const from of WIDER_RANGES) {
      const range = resolveRange(from, "now");
      // A range inside the one shown has no data either.
      if (range.startMs >= shown.startMs && range.endMs <= shown.endMs + 60e3) continue;
      let services;
      try {
        services = await catalogue(range.startMs, range.endMs, signal);
      } catch {
        return null;
      }
      if (signal.aborted) return null;
      if (service ? services.has(service) : services.size) return { from, services };
    }
    return null;
  }

  /**
   * A trace's (or span's) samples across services: the Service picker says so, the Profile
   * picker lists the types of the services the trace went through, and the timeline shows
   * the trace's samples when the server can filter the series by trace, else when it ran.
   */
  async loadTrace(services, matchers, range, signal) {
    const { traceId, spanId } = this.state;
    const spans = traceId ? await this.traceSpans(traceId, signal) : null;
    if (signal.aborted) return;
    const through = spans ? new Set(spans.map((s) => s.service)) : null;
    let types = new Set();
    for (const [service, ids] of services) {
      if (!through || through.has(service)) for (const t of ids) types.add(t);
    }
    if (!types.size) types = allTypes(services);
    if (!types.size) types = new Set([this.state.profileType || CPU]);
    const what = traceId ? `trace ${traceId.slice(0, 8)}` : `span ${spanId.slice(0, 8)}`;
    this.defaultType(types);
    this.renderPickers([["", `all services (${what})`]], types, matchers, range, { traced: true });
    if (this.missingType(types, what)) return;
    const { profileType } = this.state;
    const unit = unitOf(profileType);
    this.timeline.unit = unit;
    this.panel.setTitle(this.title());
    const [total, series] = await Promise.all([this.loadGraph(range, unit, signal), this.traceSeries(range, signal)]);
    if (signal.aborted) return;
    const { startMs, endMs } = range;
    const stepMs = stepFor(startMs, endMs);
    const sum = series ? series.reduce((a, s) => a + seriesTotal(s), 0) : -1;
    if (series && total > 0 && Math.abs(sum - total) <= 0.01 * total) {
      this.timeline.setData(series, startMs, endMs, stepMs);
      this.timeline.setCaption(`The samples of ${what} over time, across services.`);
      return;
    }
    const extent = spans && spanExtentMs(spans);
    if (extent && extent.endMs >= startMs && extent.startMs <= endMs) {
      // The server answered for the whole selection (it cannot filter series by trace):
      // drawing that would show other requests' samples, so mark when the trace ran.
      this.timeline.setBand(startMs, endMs, stepMs, extent.startMs, extent.endMs);
      this.timeline.setCaption(
        total > 0
          ? `The band marks when ${what} ran (from its spans); this server cannot plot one trace's samples over time.`
          : `The band marks when ${what} ran; none of its samples are in this range.`,
      );
      return;
    }
    this.timeline.setMessage(
      total > 0 ? `this server cannot plot the samples of ${what} over time` : `no samples of ${what} in this range`,
    );
  }

  /** The range around the trace's spans, into the picker and the URL (so a reload keeps it);
   * the default range stays when hotspan does not have the trace. */
  async fitRangeToTrace(signal) {
    let spans;
    try {
      spans = await this.traceSpans(this.state.traceId, signal);
    } catch {
      return; // aborted: another load took over
    }
    const extent = spans && spanExtentMs(spans);
    if (!extent) return;
    const range = traceRange(extent);
    Object.assign(this.state, range);
    setQuery(range);
    this.picker.set(range.from, range.until);
  }

  async traceSpans(traceId, signal) {
    try {
      return (await getJSON(`/api/traces/${traceId}/spans`, {}, { signal })).spans || [];
    } catch (err) {
      if (err.name === "AbortError") throw err;
      return null; // not a trace hotspan received: no spans, no extent
    }
  }

  /** The trace's series, or null when the server refused; the caller checks the answer. */
  async traceSeries(range, signal) {
    try {
      return await selectSeries(
        {
          profileType: this.state.profileType,
          selector: this.graphSelector(),
          startMs: range.startMs,
          endMs: range.endMs,
          stepMs: stepFor(range.startMs, range.endMs),
          groupBy: this.state.groupBy,
          traceIds: this.state.traceId ? [this.state.traceId] : [],
          spanIds: this.state.spanId ? [this.state.spanId] : [],
        },
        signal,
      );
    } catch (err) {
      if (err.name === "AbortError") throw err;
      return null;
    }
  }

  renderPickers(serviceChoices, types, matchers, range, { traced = false } = {}) {
    const service = traced ? "" : serviceOf(matchers);
    if (!serviceChoices.length) serviceChoices = [["", "no service has sent data yet"]];
    const select = selectOf("hs-service", "Service", serviceChoices, service, (value) =>
      this.change({ query: formatSelector(withService(matchers, value)) }, true),
    );
    if (traced) {
      select.disabled = true;
      select.title = "A trace's samples come from every service it went through; clear the trace filter to pick one";
    }
    this.serviceSlot.replaceChildren(select);
    this.settingsSlot.replaceChildren(
      service && !traced
        ? el(
            "a",
            {
              class: "hs-service-settings",
              href: settingsPath(service),
              title: `Profiling settings that the agents of ${service} follow, and their instances`,
            },
            "Settings",
          )
        : "",
    );
    const typeIds = new Set(types);
    if (this.state.profileType) typeIds.add(this.state.profileType);
    if (!typeIds.size) typeIds.add(CPU);
    const shownType = this.state.profileType || pickType(typeIds, "");
    this.typeSlot.replaceChildren(
      selectOf(
        "hs-profile-type",
        "Profile type",
        [...typeIds].sort().map((t) => [t, types.has(t) ? typeLabel(t) : `${typeLabel(t)} ${NO_DATA}`]),
        shownType,
        (value) => this.change({ profileType: value }, true),
      ),
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
    const select = el(
      "select",
      { class: "hs-group-by", "aria-label": "Group by" },
      el("option", { value: "" }, "no grouping"),
    );
    select.addEventListener("change", () => this.change({ groupBy: select.value }, true));
    const view = selectOf("hs-group-view", "Grouped view", GROUP_VIEWS, this.state.groupView, (value) =>
      this.change({ groupView: value }, true),
    );
    view.hidden = !this.state.groupBy;
    this.groupSlot.replaceChildren(el("label", { class: "hs-field" }, "Group by ", select), view);
    try {
      const answer = await querier("LabelNames", {
        matchers: [formatSelector(matchers)],
        start: range.startMs,
        end: range.endMs,
      });
      const names = (answer.names || []).filter(suggestedLabel);
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
    const { startMs, endMs } = range;
    const stepMs = stepFor(startMs, endMs);
    const { groupBy, groupView } = this.state;
    try {
      const series = await selectSeries(
        {
          profileType: this.state.profileType,
          selector: this.state.query,
          startMs,
          endMs,
          stepMs,
          groupBy,
        },
        signal,
      );
      if (signal.aborted) return;
      const breakdown = Boolean(groupBy) && groupView === "breakdown";
      this.timelineSlot.hidden = breakdown;
      this.breakdownSlot.hidden = !breakdown;
      if (breakdown) {
        this.breakdown.render(series, { startMs, endMs, stepMs, unit: this.timeline.unit, label: groupBy });
        return;
      }
      this.timeline.stacked = Boolean(groupBy) && groupView === "stacked";
      this.timeline.setData(series, startMs, endMs, stepMs);
    } catch (err) {
      if (err.name !== "AbortError") this.timeline.setMessage(err.message, { error: true });
    }
  }

  /** The selector of the flame graph: a trace spans services, so its filter drops the
   * service matcher and keeps the other filters. */
  graphSelector() {
    if (!this.traced()) return this.state.query;
    try {
      return formatSelector(withService(this.matchers(), ""));
    } catch {
      return this.state.query;
    }
  }

  /** Loads and shows the flame graph; its total (0 when empty). */
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
    if (signal.aborted) return 0;
    const graph = answer.flamegraph || {};
    const total = Number(graph.total || 0);
    if (!total) {
      const what = this.state.traceId
        ? `No samples carry trace ${this.state.traceId} in ${describeRange(this.state.from, this.state.until)}.`
        : this.state.spanId
          ? `No samples carry span ${this.state.spanId} in ${describeRange(this.state.from, this.state.until)}.`
          : `No data for ${this.state.query} in ${describeRange(this.state.from, this.state.until)}.`;
      const hint = this.traced()
        ? "Widen the time range to when the trace ran. Samples carry trace and span ids only when the hotspan agent runs in the process that made the span."
        : "Widen the time range or remove a filter.";
      this.panel.setMessage(message("empty", what, hint));
      if (this.state.traceId) this.offerTraceRange(this.state.traceId, signal);
      return 0;
    }
    this.panel.setData(graph, { unit, title: this.title() });
    return total;
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
    const extent = spanExtentMs(spans);
    const range = traceRange(extent);
    this.panel.setMessage(
      message(
        "empty",
        `No samples carry trace ${traceId} in ${describeRange(this.state.from, this.state.until)}.`,
        el(
          "span",
          {},
          `The trace ran at ${formatTime(extent.startMs)}. `,
          el(
            "button",
            {
              type: "button",
              class: "hs-primary hs-trace-range",
              onclick: () => {
                this.picker.set(range.from, range.until);
                this.change(range, true);
              },
            },
            "Show the time around it",
          ),
        ),
      ),
    );
  }

  serverExports() {
    const range = this.range;
    if (!range || this.state.spanId) return [];
    return [
      {
        label: "pprof",
        filename: `${this.fileStem()}.pb`,
        fetch: async () =>
          querierBinary(
            "SelectMergeProfile",
            selectMergeProfileRequest({
              profileTypeID: this.state.profileType,
              labelSelector: this.graphSelector(),
              start: range.startMs,
              end: range.endMs,
              traceIds: this.state.traceId ? [this.state.traceId] : [],
            }),
          ),
      },
    ];
  }
}

/** [value, text] choices for the Service picker: the services with data, then `wider` ones
 * (data only in a wider range) and the asked-for service, marked, when they have none here. */
function serviceOptions(names, wider, service) {
  const out = names.map((s) => [s, s || "(no service_name)"]);
  for (const s of wider) if (!names.includes(s)) out.push([s, `${s} ${NO_DATA}`]);
  if (service && !names.includes(service) && !wider.includes(service)) {
    out.push([service, `${service} ${NO_DATA}`]);
  }
  return out;
}

function traceRange({ startMs, endMs }) {
  return absoluteRange(startMs - TRACE_PAD_MS, endMs + TRACE_PAD_MS);
}

function allTypes(services) {
  const out = new Set();
  for (const ids of services.values()) for (const t of ids) out.add(t);
  return out;
}

export function renderProfiles(root, { params }) {
  const view = new ProfilesView(root, params);
  return () => view.destroy();
}

/**
 * A trace or span id from the URL, lower case, or "" when it is not one.
 * @param {string | null} text
 * @param {RegExp} shape
 */
function idParam(text, shape) {
  const id = String(text || "").toLowerCase();
  return shape.test(id) ? id : "";
}
