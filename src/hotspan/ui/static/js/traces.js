// Traces: the search (service, span name, status, duration range, time range; the longest
// first, over a histogram of the durations) and the trace view (span waterfall with CPU beside
// duration; a span's own profile).  Every state is in the URL:
//   /traces?service=shop&name=GET%20/slow&status=error&minDuration=100ms&maxDuration=2s
//          &from=now-1h&until=now
//          (&q=<TraceQL> replaces the fields; &sort=recent lists the newest first;
//          &limit=N, 50 by default; &function=<frame>: the traces where it is hot, hottraces.js)
//   /traces/<trace id>?span=<span id>&descendants=1&type=<profile type id>
//          (&zoom=, &sort=, &sandwich=: the span profile's flame graph and table state)
//          (&why=1: "Why slow?" in place of the span's profile; &whyWindow=, &whyType=: its
//          baseline window and profile type, see why.js)

import { ApiError, CPU, getBytes, getJSON } from "./api.js";
import { el, message, rejectInput } from "./dom.js";
import { DurationHistogram, parseDurationNs } from "./histogram.js";
import { renderHotTraces } from "./hottraces.js";
import { formatBytes, formatDuration, formatTime, unitOf } from "./format.js";
import { ProfilePanel } from "./panel.js";
import { catalogue, selectOf, typeLabel } from "./selection.js";
import { navigate, panelState, setQuery } from "./router.js";
import { traceIdOf } from "./spans.js";
import {
  DEFAULT_FROM,
  DEFAULT_UNTIL,
  TimeRangePicker,
  absoluteRange,
  describeRange,
  resolveRange,
} from "./timerange.js";
import { Waterfall, buildTree, isError, serviceColor } from "./waterfall.js";
import { DEFAULT_WINDOW, WhyPanel } from "./why.js";
import { compareBox, traceRange } from "./compare.js";

const DEFAULT_LIMIT = 50;
const MAX_LIMIT = 1000; // a page of results the browser still lists at ease (the server allows 10,000)
let lastSearchUrl = "/traces"; // the trace view's way back to the results it was opened from

/** Where the OpenTelemetry exporter should send spans, for the hints. */
function otlpHint() {
  return (
    `check that the OpenTelemetry exporter sends to ${location.origin}/v1/traces ` +
    `(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=${location.origin}/v1/traces)`
  );
}

function errorMessage(err, what) {
  if (err instanceof ApiError) {
    return message("error", `${what}: ${err.message}`, err.hint || "fix the query above and search again");
  }
  return message("error", `${what}: ${err.message || err}`, "reload the page; if it persists, see the browser console");
}

/** A TraceQL string literal. */
function quote(text) {
  return `"${String(text).replace(/\\/g, "\\\\").replace(/"/g, '\\"')}"`;
}

// The span statuses the search can ask for (TraceQL's `status=`).
const STATUSES = ["error", "ok", "unset"];

/** The TraceQL query of the search fields: `{resource.service.name="x" && name="y" && ...}`:
 * one span with all of them. */
export function traceQL({ service, name, minDuration, maxDuration, status }) {
  const conds = [];
  if (service) conds.push(`resource.service.name=${quote(service)}`);
  if (name) conds.push(`name=${quote(name)}`);
  if (status && STATUSES.includes(status)) conds.push(`status=${status}`);
  if (minDuration) conds.push(`duration>=${minDuration.replace(/\s+/g, "")}`);
  if (maxDuration) conds.push(`duration<=${maxDuration.replace(/\s+/g, "")}`);
  return conds.length ? `{${conds.join(" && ")}}` : "{}";
}

// --- search -------------------------------------------------------------------------------

export function renderTraceSearch(root, { params }) {
  // From a flame graph frame's menu: the traces where that function is hot.
  if (params.get("function")) return renderHotTraces(root, { params });
  const state = {
    service: params.get("service") || "",
    name: params.get("name") || "",
    minDuration: params.get("minDuration") || "",
    maxDuration: params.get("maxDuration") || "",
    status: STATUSES.includes(params.get("status")) ? params.get("status") : "",
    q: params.get("q") || "",
    sort: params.get("sort") === "recent" ? "recent" : "duration",
    from: params.get("from") || DEFAULT_FROM,
    until: params.get("until") || DEFAULT_UNTIL,
    limit: Math.min(Math.max(parseInt(params.get("limit"), 10) || DEFAULT_LIMIT, 1), MAX_LIMIT),
    profiled: params.get("profiled") === "1", // hide the traces without samples
  };
  lastSearchUrl = location.pathname + location.search;
  let noServices = false; // the tag API knows no service at all
  let lastEmpty = false; // the search found nothing
  const controller = new AbortController();
  const signal = controller.signal;

  const serviceSelect = el(
    "select",
    { class: "hs-trace-service", name: "service", "aria-label": "Service" },
    el("option", { value: "" }, "All services"),
  );
  if (state.service) serviceSelect.append(el("option", { value: state.service }, state.service));
  serviceSelect.value = state.service;
  const namesList = el("datalist", { id: "hs-span-names" });
  const nameInput = el("input", {
    class: "hs-trace-name",
    name: "name",
    list: "hs-span-names",
    value: state.name,
    placeholder: "any span name",
    "aria-label": "Span name",
    size: 28,
  });
  const minInput = el("input", {
    class: "hs-trace-min",
    name: "minDuration",
    value: state.minDuration,
    placeholder: "e.g. 100ms",
    "aria-label": "Minimum duration",
    title: "A span of the trace (with this name, if given) took at least this long: 250ms, 1.5s, 2m",
    size: 9,
  });
  const maxInput = el("input", {
    class: "hs-trace-max",
    name: "maxDuration",
    value: state.maxDuration,
    placeholder: "e.g. 2s",
    "aria-label": "Maximum duration",
    title: "A span of the trace (the one matching the other fields) took at most this long",
    size: 9,
  });
  const statusSelect = el(
    "select",
    { class: "hs-trace-status", name: "status", "aria-label": "Status" },
    el("option", { value: "" }, "Any status"),
    el("option", { value: "error" }, "Error"),
    el("option", { value: "ok" }, "OK"),
    el("option", { value: "unset" }, "Unset"),
  );
  statusSelect.value = state.status;
  const sortSelect = el(
    "select",
    { class: "hs-trace-sort", "aria-label": "Order" },
    el("option", { value: "duration" }, "Longest first"),
    el("option", { value: "recent" }, "Newest first"),
  );
  sortSelect.value = state.sort;
  const qInput = el("input", {
    class: "hs-trace-q",
    name: "q",
    value: state.q,
    placeholder: traceQL(state),
    "aria-label": "TraceQL",
    size: 50,
  });
  const rangeBox = el("div", { class: "hs-trace-range" });
  const results = el("div", { class: "hs-trace-results" });
  const histogramBox = el("div", { class: "hs-trace-histogram" });
  const histogram = new DurationHistogram(histogramBox, {
    onPick: (min, max) => {
      minInput.value = min;
      maxInput.value = max;
      submit();
    },
  });
  const form = el(
    "form",
    { class: "hs-tsearch-form", onsubmit: (event) => (event.preventDefault(), submit()) },
    el("label", {}, el("span", {}, "Service"), serviceSelect),
    el("label", {}, el("span", {}, "Span name"), nameInput, namesList),
    el("label", {}, el("span", {}, "Status"), statusSelect),
    el("label", {}, el("span", {}, "Min duration"), minInput),
    el("label", {}, el("span", {}, "Max duration"), maxInput),
    el("label", {}, el("span", {}, "Order"), sortSelect),
    el("button", { type: "submit", class: "hs-primary hs-trace-search" }, "Search"),
    el(
      "details",
      { class: "hs-trace-advanced", open: Boolean(state.q) },
      el("summary", {}, "TraceQL"),
      el("label", {}, qInput),
      el("p", { class: "hs-note" }, "A TraceQL query here replaces the fields above."),
    ),
  );
  const picker = new TimeRangePicker(rangeBox, {
    from: state.from,
    until: state.until,
    onChange: (from, until) => {
      state.from = from;
      state.until = until;
      submit();
    },
  });
  sortSelect.addEventListener("change", () => submit());
  statusSelect.addEventListener("change", () => submit());
  root.append(
    el(
      "section",
      { class: "hs-traces" },
      el("div", { class: "hs-toolbar" }, el("h1", {}, "Traces"), el("span", { class: "hs-spacer" }), rangeBox),
      form,
      histogramBox,
      results,
    ),
  );

  function submit() {
    const minDuration = minInput.value.trim();
    const maxDuration = maxInput.value.trim();
    for (const [input, value] of [
      [minInput, minDuration],
      [maxInput, maxDuration],
    ]) {
      if (value && Number.isNaN(parseDurationNs(value))) {
        rejectInput(input, "a duration such as 100ms, 1.5s or 2m");
        return;
      }
    }
    const query = {
      service: serviceSelect.value,
      name: nameInput.value.trim(),
      status: statusSelect.value,
      minDuration,
      maxDuration,
      q: qInput.value.trim(),
      sort: sortSelect.value === "recent" ? "recent" : "",
      from: picker.from === DEFAULT_FROM ? "" : picker.from,
      until: picker.until === DEFAULT_UNTIL ? "" : picker.until,
      limit: state.limit === DEFAULT_LIMIT ? "" : state.limit,
      profiled: state.profiled ? "1" : "",
    };
    const search = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) if (value) search.set(key, value);
    const text = search.toString();
    navigate(`/traces${text ? `?${text}` : ""}`);
  }

  // The choices of the fields, from the tag APIs (over the last week: a service that sent
  // nothing in the range is still offered).
  const since = Math.floor(Date.now() / 1000) - 7 * 86400;
  getJSON("/api/search/tag/service.name/values", { start: since }, { signal })
    .then((body) => {
      const values = body.tagValues || [];
      for (const value of values) {
        if (value !== state.service) serviceSelect.append(el("option", { value }, value));
      }
      serviceSelect.value = state.service;
      noServices = values.length === 0;
      if (noServices && lastEmpty) showEmpty();
    })
    .catch(() => {}); // the search below reports what is wrong with the server
  // v2: span names only (the intrinsic), not attributes that happen to be called "name".
  getJSON("/api/v2/search/tag/name/values", { start: since, limit: 1000 }, { signal })
    .then((body) => {
      const names = [...new Set((body.tagValues || []).map((v) => v.value))].sort();
      namesList.append(...names.map((value) => el("option", { value })));
    })
    .catch(() => {});

  function showEmpty() {
    const where = describeRange(state.from, state.until).toLowerCase();
    if (noServices) {
      results.replaceChildren(
        message(
          "empty",
          "hotspan has received no traces yet.",
          `Instrument the program with the OpenTelemetry SDK and ${otlpHint()}.`,
        ),
      );
      return;
    }
    const what = state.q
      ? "no traces match this TraceQL query"
      : `no traces${state.service ? ` for service "${state.service}"` : ""}` +
        `${state.name ? ` with a span "${state.name}"` : ""}` +
        `${state.status ? ` whose status is ${state.status}` : ""}` +
        `${state.minDuration ? ` of at least ${state.minDuration}` : ""}` +
        `${state.maxDuration ? ` of at most ${state.maxDuration}` : ""}`;
    results.replaceChildren(
      message(
        "empty",
        `${what[0].toUpperCase()}${what.slice(1)} in ${where}.`,
        `Widen the time range${state.minDuration || state.maxDuration || state.name || state.status ? " or loosen the filters" : ""}, ` +
          `or ${otlpHint()}.`,
      ),
    );
  }

  let range;
  try {
    range = resolveRange(state.from, state.until);
  } catch (err) {
    results.replaceChildren(message("error", `The time range is wrong: ${err.message}`, "pick a range above"));
    return () => controller.abort();
  }
  const q = state.q || traceQL(state);
  const request = {
    q,
    start: Math.floor(range.startMs / 1000),
    end: Math.ceil(range.endMs / 1000),
    limit: state.limit,
    spss: 3,
    sort: state.sort,
  };
  results.replaceChildren(el("p", { class: "hs-loading" }, "Searching…"));
  // The histogram shows every duration the other fields allow: the range picked on it is
  // the one the list is filtered by.
  const spread = state.q || traceQL({ ...state, minDuration: "", maxDuration: "" });
  const picked = [parseDurationNs(state.minDuration) || 0, parseDurationNs(state.maxDuration) || Infinity];
  histogram.load(spread, request.start, request.end, picked, signal);
  getJSON("/api/search", request, { signal })
    .then((body) => {
      const traces = body.traces || [];
      if (!traces.length) {
        lastEmpty = true;
        showEmpty();
        return;
      }
      results.replaceChildren(resultTable(traces, state, q));
      markProfiled(results, traces, request, signal);
    })
    .catch((err) => {
      if (err.name === "AbortError") return;
      results.replaceChildren(errorMessage(err, "The search failed"));
    });

  return () => controller.abort();
}

function resultTable(traces, state, q) {
  // The server sorted them already (sort=duration); sorting again keeps the list right
  // against a server without the extension, which answers the newest first.
  const rows = [...traces];
  if (state.sort === "duration") rows.sort((a, b) => durationNs(b) - durationNs(a));
  const longest = Math.max(...rows.map(durationNs), 1);
  const body = el("tbody");
  for (const t of rows) {
    const href = `/traces/${t.traceID}`;
    const spans = (t.spanSet && t.spanSet.spans) || [];
    const matched = (t.spanSet && t.spanSet.matched) || spans.length;
    const bar = el("span", { class: "hs-result-bar" });
    bar.style.width = `${Math.max((100 * durationNs(t)) / longest, 0.5)}%`;
    bar.style.setProperty("--hs-service", serviceColor(t.rootServiceName));
    // Tempo's serviceStats: per service of the trace, its spans and those that failed.
    const errors = Object.values(t.serviceStats || {}).reduce((n, s) => n + (Number(s.errorCount) || 0), 0);
    const row = el(
      "tr",
      { class: `hs-trace-result${errors ? " hs-trace-failed" : ""}`, dataset: { traceId: t.traceID } },
      el(
        "td",
        { class: "hs-result-name" },
        el(
          "a",
          { href, class: "hs-trace-link" },
          el("span", { class: "hs-service-name" }, t.rootServiceName),
          " ",
          t.rootTraceName || "<root span not yet received>",
        ),
        errors
          ? el(
              "span",
              { class: "hs-result-errors", title: "Spans of this trace whose status is error" },
              `${errors} error${errors === 1 ? "" : "s"}`,
            )
          : null,
        el("div", { class: "hs-result-id" }, t.traceID),
      ),
      el(
        "td",
        { class: "hs-result-duration" },
        el("span", { class: "hs-result-duration-text" }, formatDuration(durationNs(t))),
        el("span", { class: "hs-result-track" }, bar),
      ),
      el("td", { class: "hs-result-cpu" }, el("span", { class: "hs-muted" }, "…")),
      el(
        "td",
        { class: "hs-result-spans" },
        spans.map((s) =>
          el(
            "div",
            { class: "hs-result-span" },
            // An element of its own: the name's direction controls (isolated in CSS) stay in it.
            el("bdi", {}, s.name),
            " ",
            el("span", { class: "hs-muted" }, formatDuration(s.durationNanos)),
          ),
        ),
        matched > spans.length
          ? el("div", { class: "hs-muted" }, `+${matched - spans.length} more matching spans`)
          : null,
      ),
      el("td", { class: "hs-result-start" }, formatTime(Number(BigInt(t.startTimeUnixNano || "0") / 1000000n), true)),
    );
    row.addEventListener("click", (event) => {
      if (event.target.closest("a")) return;
      navigate(href);
    });
    body.append(row);
  }
  const onlyProfiled = el("input", { type: "checkbox", class: "hs-only-profiled", checked: state.profiled });
  const box = el(
    "div",
    { class: state.profiled ? "hs-hide-unprofiled" : "" },
    el(
      "p",
      { class: "hs-result-summary" },
      `${rows.length} trace${rows.length === 1 ? "" : "s"}`,
      rows.length >= state.limit ? ` (the ${state.sort === "duration" ? "longest" : "newest"} ${state.limit})` : "",
      state.sort === "duration" ? ", longest first" : ", newest first",
      " · ",
      el("code", { class: "hs-trace-query" }, q),
      " · ",
      el(
        "label",
        { class: "hs-only-profiled-label", title: "Hide the traces that hold no CPU samples" },
        onlyProfiled,
        " only traces with a profile",
      ),
    ),
    el(
      "div",
      { class: "hs-table-scroll" },
      el(
        "table",
        { class: "hs-table hs-trace-table" },
        el(
          "thead",
          {},
          el(
            "tr",
            {},
            el("th", {}, "Trace"),
            el("th", {}, "Duration"),
            el("th", { title: "CPU time of the samples linked to the trace" }, "CPU"),
            el("th", {}, "Matching spans"),
            el("th", {}, "Started"),
          ),
        ),
        body,
      ),
    ),
    rows.length >= state.limit && state.limit < MAX_LIMIT ? moreLink(state.limit) : null,
  );
  onlyProfiled.addEventListener("change", () => {
    state.profiled = onlyProfiled.checked;
    box.classList.toggle("hs-hide-unprofiled", onlyProfiled.checked);
    setQuery({ profiled: onlyProfiled.checked ? "1" : "" });
  });
  return box;
}

// Samples are stamped with the start of the agent's upload window: look a little around.
const SAMPLE_SLACK_S = 300;

/** Fills the CPU column: each trace's CPU (one request for the whole list) and whether it has
 * a profile at all, so that traces without samples can be skipped. */
async function markProfiled(results, traces, request, signal) {
  const cells = new Map([...results.querySelectorAll(".hs-trace-result")].map((row) => [row.dataset.traceId, row]));
  let totals;
  try {
    const body = await getJSON(
      "/api/v1/traces/profiled",
      {
        traceID: traces.map((t) => t.traceID),
        start: request.start - SAMPLE_SLACK_S,
        end: request.end + SAMPLE_SLACK_S,
      },
      { signal },
    );
    totals = body.traces || {};
  } catch (err) {
    if (err.name === "AbortError") return;
    for (const row of cells.values()) {
      row
        .querySelector(".hs-result-cpu")
        .replaceChildren(el("span", { class: "hs-muted", title: String(err.message || err) }, "?"));
    }
    return;
  }
  for (const [id, row] of cells) {
    const key = id.toLowerCase().padStart(32, "0");
    const cpu = Number(totals[key] || 0);
    row.classList.toggle("hs-no-profile", !cpu);
    row.dataset.profiled = cpu ? "yes" : "no";
    row
      .querySelector(".hs-result-cpu")
      .replaceChildren(
        cpu
          ? el(
              "span",
              { class: "hs-profiled", title: "CPU samples are linked to this trace: its spans have profiles" },
              el("span", { class: "hs-profiled-mark", "aria-label": "has profile" }, "●"),
              " ",
              formatDuration(cpu),
            )
          : el("span", { class: "hs-muted", title: "no CPU samples are linked to this trace" }, "no samples"),
      );
  }
}

/** A link to the same search with twice as many results (the router opens it in place). */
function moreLink(limit) {
  const params = new URLSearchParams(location.search);
  params.set("limit", String(Math.min(limit * 2, MAX_LIMIT)));
  return el("p", {}, el("a", { class: "hs-more-traces", href: `${location.pathname}?${params}` }, "Show more traces"));
}

function durationNs(t) {
  const spans = (t.spanSet && t.spanSet.spans) || [];
  // durationMs is whole milliseconds; a matched span may be more precise (and longer).
  const fromSpans = Math.max(0, ...spans.map((s) => Number(s.durationNanos || 0)));
  return Math.max(Number(t.durationMs || 0) * 1e6, fromSpans);
}

// --- trace view ---------------------------------------------------------------------------

export function renderTraceView(root, { params, match }) {
  const raw = (match && match[1]) || "";
  const controller = new AbortController();
  const signal = controller.signal;
  const section = el("section", { class: "hs-trace-view" });
  root.append(section);
  const back = el("a", { href: lastSearchUrl, class: "hs-back" }, "← Search traces");
  const traceId = traceIdOf(raw);
  if (!traceId) {
    section.append(
      back,
      message(
        "error",
        `"${raw}" is not a trace id.`,
        "A trace id is up to 32 hex digits, as Grafana, Jaeger or your logs show it: open /traces/<trace id>, or search below.",
      ),
    );
    return () => controller.abort();
  }
  const state = {
    span: (params.get("span") || "").toLowerCase(),
    descendants: ["1", "true", "yes"].includes(params.get("descendants") || ""),
    type: params.get("type") || CPU,
    why: params.get("why") === "1",
    whyWindow: params.get("whyWindow") || DEFAULT_WINDOW,
    whyType: params.get("whyType") || "",
  };

  const header = el("div", { class: "hs-trace-header" }, back, el("h1", {}, "Trace ", el("code", {}, traceId)));
  const summary = el("div", { class: "hs-trace-summary" });
  const waterfallBox = el("div", { class: "hs-waterfall-box" }, el("p", { class: "hs-loading" }, "Loading the trace…"));
  const details = el("div", { class: "hs-span-details" });
  const profileTitle = el("h2", { class: "hs-profile-title" });
  const descendantsBox = el("input", { type: "checkbox", class: "hs-descendants", checked: state.descendants });
  const descendantsLabel = el(
    "label",
    {
      class: "hs-descendants-label",
      title: "Add the CPU samples of the spans it called (its children, their children, ...)",
    },
    descendantsBox,
    " include descendants",
  );
  const wholeButton = el("button", { type: "button", class: "hs-whole-trace" }, "Whole trace");
  // The span (or, with none picked, the root span) against others of its operation.
  const whyButton = el(
    "button",
    {
      type: "button",
      class: "hs-why-button",
      title: "Compare this span with others of the same service and name: which functions made it slower",
    },
    "Why slow?",
  );
  const whyBox = el("div", { class: "hs-why-box", hidden: true });
  // Every profile type the agent links to spans (CPU, wall, allocations, heap, lock waits,
  // threads and tasks) opens here; the picker lists those the trace's services sent.
  const typeBox = el("span", { class: "hs-span-type-box" });
  const panelBox = el("div", { class: "hs-span-profile" });
  const profileSection = el(
    "div",
    { class: "hs-profile-section" },
    el(
      "div",
      { class: "hs-toolbar" },
      profileTitle,
      el("span", { class: "hs-spacer" }),
      typeBox,
      descendantsLabel,
      wholeButton,
      whyButton,
    ),
    details,
    whyBox,
    panelBox,
  );
  section.append(header, summary, waterfallBox, profileSection);

  let spans = [];
  let tree = null;
  const extras = {}; // kind ("alloc", "locks", "gil", "cpuWait") -> span id -> {self, total}
  let knownTypes = new Set([CPU]); // the profile types the trace's services sent
  let byId = new Map();
  let waterfall = null;
  let panel = null;
  let profileController = null;
  let why = null;

  function ensurePanel() {
    if (panel) return panel;
    panel = new ProfilePanel(panelBox, {
      ...panelState(new URLSearchParams(location.search)),
      unit: unitOf(state.type) || "nanoseconds",
      title: typeLabel(state.type),
      exportName: `trace-${traceId.slice(0, 16)}`,
      exports: () => [
        {
          label: "pprof",
          filename: `trace-${traceId.slice(0, 16)}${state.span ? `-span-${state.span}` : ""}${state.span && state.descendants ? "-descendants" : ""}.pb`,
          fetch: () =>
            getBytes(`/api/traces/${traceId}/profile`, {
              spanID: state.span || null,
              descendants: state.span && state.descendants ? "true" : null,
              profileType: state.type === CPU ? null : state.type,
              format: "pprof",
            }),
        },
      ],
    });
    return panel;
  }

  let missingNote = null; // the URL's span is not in the trace: said until a span is picked

  function select(spanId, { push = true } = {}) {
    state.span = spanId && byId.has(spanId) ? spanId : "";
    if (missingNote) missingNote.remove();
    missingNote = null;
    setQuery({ span: state.span, descendants: state.descendants ? "1" : "" }, { push });
    if (waterfall) waterfall.select(state.span);
    showDetails();
    loadProfile();
  }

  // The details are redrawn as attributes and extra columns arrive: the compare box is kept
  // while it is about the same span and type, so what was typed in it, and its answer, stay.
  let compareKept = { key: null, box: null };
  function compareFor(span) {
    const key = `${span ? span.spanID : ""} ${state.type}`;
    if (compareKept.key !== key) {
      compareKept = { key, box: compareBox({ traceId, span, type: state.type, range: traceRange(tree) }) };
    }
    return compareKept.box;
  }

  function showDetails() {
    const span = byId.get(state.span);
    descendantsBox.disabled = !span;
    descendantsLabel.classList.toggle("hs-disabled", !span);
    wholeButton.hidden = !span;
    // "Why slow?" compares the span with its descendants in every type the answer has.
    whyButton.classList.toggle("hs-active", state.why);
    whyButton.setAttribute("aria-pressed", String(state.why));
    typeBox.hidden = descendantsLabel.hidden = state.why;
    const what = state.type === CPU ? "CPU profile" : typeLabel(state.type);
    const compare = tree ? compareFor(span) : null;
    if (state.why) {
      const root = tree && tree.roots[0];
      profileTitle.replaceChildren(
        "Why is ",
        span || !root ? "span " : "this trace's root span ",
        el("span", { class: "hs-span-title" }, (span || root || { name: "the root span" }).name),
        " slow?",
      );
    }
    if (!span) {
      if (!state.why) profileTitle.textContent = `${what} of the whole trace`;
      details.replaceChildren(
        el(
          "p",
          { class: "hs-note" },
          state.why
            ? "Click a span in the waterfall to ask about it instead."
            : "Click a span in the waterfall to see its own profile.",
        ),
        compare,
      );
      return;
    }
    if (!state.why) {
      profileTitle.replaceChildren(
        `${what} of span `,
        el("span", { class: "hs-span-title" }, span.name),
        state.descendants && span.children.length ? " and its descendants" : "",
      );
    }
    const attrs = span.attributes || [];
    const facts = [
      el(
        "dl",
        { class: "hs-span-facts" },
        fact("Service", span.service),
        fact("Span ID", span.spanID),
        fact("Start", `+${formatDuration(span.offsetNs)}`),
        fact("Duration", formatDuration(span.durationNs)),
        fact("CPU (own)", formatDuration(span.self)),
        fact("CPU (with descendants)", formatDuration(span.total)),
        fact("Activity", `${span.activity.label}${span.activity.locks ? `, ${span.activity.locks}` : ""}`),
        extraFact("alloc", "Allocated (with descendants)", formatBytes),
        extraFact("locks", "Lock waits (with descendants, all threads)", formatDuration),
        extraFact("gil", "GIL waits (with descendants)", formatDuration),
        extraFact("cpuWait", "CPU waits (with descendants): runnable, no core free", formatDuration),
        gcFact(),
        isError(span.status) ? fact("Status", `error${span.status.message ? `: ${span.status.message}` : ""}`) : null,
      ),
    ];
    if (span.events && span.events.length) {
      facts.push(
        el(
          "details",
          { class: "hs-span-events" },
          el("summary", {}, `Events (${span.events.length})`),
          el(
            "table",
            { class: "hs-table" },
            el(
              "tbody",
              {},
              span.events.map((e) =>
                el(
                  "tr",
                  {},
                  el("th", {}, e.name),
                  el("td", {}, `+${formatDuration(e.offsetNs)}`),
                  el("td", {}, e.attributes),
                ),
              ),
            ),
          ),
        ),
      );
    }
    if (attrs.length) {
      facts.push(
        el(
          "details",
          { class: "hs-span-attributes" },
          el("summary", {}, `Attributes (${attrs.length})`),
          el(
            "table",
            { class: "hs-table" },
            el(
              "tbody",
              {},
              attrs.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))),
            ),
          ),
        ),
      );
    }
    facts.push(compare);
    details.replaceChildren(...facts);

    /** The collections that paused the span's thread (the hotspan agent's span attributes). */
    function gcFact() {
      const of = (key) => attrs.find(([k]) => k === key)?.[1];
      const pause = Number(of("hotspan.gc.pause_ns") || 0);
      if (!pause) return null;
      const count = Number(of("hotspan.gc.collections") || 0);
      return fact("GC pauses", `${formatDuration(pause)}${count ? ` (${count} collections)` : ""}`);
    }

    function extraFact(kind, term, format) {
      const v = extras[kind] && extras[kind].get(span.spanID);
      return v && v.total ? fact(term, `${format(v.total)} (own ${format(v.self)})`) : null;
    }
  }

  /** The "Why slow?" answer for the picked span (or the root span), in place of its profile. */
  function loadWhy() {
    whyBox.hidden = false;
    panelBox.hidden = true;
    if (why) {
      why.setSpan(state.span);
      return;
    }
    why = new WhyPanel(whyBox, {
      traceId,
      spanId: state.span,
      window: state.whyWindow,
      type: state.whyType,
      onState: (changes) => setQuery(changes),
    });
  }

  async function loadProfile() {
    if (state.why) {
      loadWhy();
      return;
    }
    whyBox.hidden = true;
    panelBox.hidden = false;
    if (profileController) profileController.abort();
    profileController = new AbortController();
    const mine = profileController;
    const p = ensurePanel();
    const span = byId.get(state.span);
    p.setLoading(span ? `Loading the profile of ${span.name}…` : "Loading the profile of the trace…");
    try {
      const body = await getJSON(
        `/api/traces/${traceId}/profile`,
        {
          spanID: span ? span.spanID : null,
          descendants: span && state.descendants ? "true" : null,
          profileType: state.type === CPU ? null : state.type,
        },
        { signal: mine.signal },
      );
      if (mine.signal.aborted) return;
      const fg = body.flamegraph || {};
      if (!Number(fg.total || 0)) {
        p.setMessage(
          state.type === CPU
            ? emptyProfileMessage(span, state.descendants, offersFor(span))
            : emptyTypeMessage(span, state.type),
        );
        return;
      }
      const title = span ? `${span.name}${state.descendants ? " (with descendants)" : ""}` : `trace ${traceId}`;
      p.setData(fg, { unit: unitOf(body.profileType) || "nanoseconds", title });
    } catch (err) {
      if (err.name === "AbortError" || mine.signal.aborted) return;
      p.setMessage(errorMessage(err, "The profile could not be loaded"));
    }
  }

  /** Another profile type for the span's profile, as the type picker chooses it. */
  function switchType(value) {
    state.type = value;
    setQuery({ type: value === CPU ? "" : value });
    const picker = typeBox.querySelector("select");
    if (picker) picker.value = value;
    showDetails();
    loadProfile();
  }

  /** For a span without CPU samples: buttons to the profiles that hold where it waited
   * (its lock waits, its GIL waits), those the span has. */
  function offersFor(span) {
    if (!span) return [];
    const wanted = [
      ["locks", "mutex:delay:", "Show its lock waits"],
      ["gil", "gil_wait:gil_wait:", "Show its GIL waits"],
    ];
    const out = [];
    for (const [kind, prefix, label] of wanted) {
      const v = extras[kind] && extras[kind].get(span.spanID);
      const type = [...knownTypes].find((t) => t.startsWith(prefix));
      if (v && v.total > 0 && type) {
        out.push(el("button", { type: "button", class: "hs-offer", onclick: () => switchType(type) }, label));
      }
    }
    return out;
  }

  descendantsBox.addEventListener("change", () => {
    state.descendants = descendantsBox.checked;
    setQuery({ descendants: state.descendants ? "1" : "" });
    showDetails();
    loadProfile();
  });
  wholeButton.addEventListener("click", () => select(""));
  whyButton.addEventListener("click", () => {
    state.why = !state.why;
    setQuery({ why: state.why ? "1" : "" }, { push: true });
    showDetails();
    loadProfile();
  });

  async function load() {
    let body;
    try {
      body = await getJSON(`/api/traces/${traceId}/spans`, {}, { signal });
    } catch (err) {
      if (err.name === "AbortError") return;
      if (err instanceof ApiError && err.status === 404) {
        waterfallBox.replaceChildren(
          message(
            "error",
            `Trace ${traceId} was not found on this server.`,
            el(
              "span",
              {},
              "Check the id (copy it from Grafana, Jaeger or your logs). A trace arrives a few seconds after its " +
                `spans end; an old one may be past retention. If no trace ever arrives, ${otlpHint()}. Or `,
              el("a", { href: lastSearchUrl }, "search for traces"),
              ".",
            ),
          ),
        );
      } else {
        waterfallBox.replaceChildren(errorMessage(err, "The trace could not be loaded"));
      }
      profileSection.hidden = true;
      return;
    }
    tree = buildTree(body.spans || []);
    spans = tree.spans;
    byId = new Map(spans.map((s) => [s.spanID, s]));
    showSummary(tree, body);
    waterfall = new Waterfall(waterfallBox, tree, { onSelect: (id) => select(id === state.span ? "" : id) });
    if (state.span && !byId.has(state.span)) {
      // The link is left as it was (a shared link must not quietly show something else) and
      // the note stands above the waterfall, where it is seen before the whole trace is read.
      missingNote = message(
        "info",
        `Span ${state.span} is not in this trace.`,
        `The waterfall shows the trace's ${spans.length} spans and the profile below is the whole trace's: ` +
          "check the link, or pick a span in the waterfall.",
      );
      missingNote.classList.add("hs-missing-span");
      waterfallBox.before(missingNote);
      state.span = "";
      showDetails();
      loadProfile();
    } else {
      select(state.span, { push: false });
    }
    loadAttributes();
    loadTypes(tree);
  }

  /** The profile types the trace's services sent around the time it ran. */
  async function loadTypes(tree) {
    const startMs = tree.startNs / 1e6;
    const endMs = startMs + tree.durationNs / 1e6;
    const services = new Set(spans.map((s) => s.service));
    const types = new Set([CPU, state.type]);
    try {
      // The agent stamps samples with the start of their upload window: look a little around.
      const known = await catalogue(Math.floor(startMs - 5 * 60e3), Math.ceil(endMs + 5 * 60e3), signal);
      for (const [service, ids] of known) {
        if (services.has(service)) for (const id of ids) types.add(id);
      }
    } catch {
      // CPU is always offered; the other types are a convenience.
    }
    knownTypes = types;
    loadExtras(types);
    typeBox.replaceChildren(
      selectOf(
        "hs-span-profile-type",
        "Profile type",
        [...types].sort().map((t) => [t, typeLabel(t)]),
        state.type,
        switchType,
      ),
    );
  }

  /** Allocations and lock waits per span, beside CPU, for the types the services sent; each
   * fills its waterfall column when it arrives (after the waterfall is drawn). */
  function loadExtras(types) {
    const wanted = {
      alloc: ["memory:alloc_space:"],
      locks: ["mutex:delay:"],
      gil: ["gil_wait:gil_wait:"],
      // The wall samples of threads that were runnable with no core free.
      cpuWait: ["wall:wall:", '{thread_state="cpu_wait"}'],
    };
    for (const [kind, [prefix, labelSelector]] of Object.entries(wanted)) {
      const type = [...types].find((t) => t.startsWith(prefix));
      if (!type) continue;
      const params = labelSelector ? { profileType: type, labelSelector } : { profileType: type };
      getJSON(`/api/traces/${traceId}/spans`, params, { signal })
        .then((body) => {
          const values = new Map(
            (body.spans || []).map((s) => [
              String(s.spanID).toLowerCase(),
              { self: Number(s.self || 0), total: Number(s.total || 0) },
            ]),
          );
          if (![...values.values()].some((v) => v.total > 0)) return;
          extras[kind] = values;
          if (waterfall) waterfall.setValues(kind, values);
          showDetails();
        })
        .catch(() => {}); // a column less; CPU is what the view is about
    }
  }

  function showSummary(tree, body) {
    const rootSpan = tree.roots[0];
    const services = [...new Set(spans.map((s) => s.service))];
    summary.replaceChildren(
      el(
        "dl",
        { class: "hs-span-facts" },
        fact("Root", rootSpan ? `${rootSpan.service}: ${rootSpan.name}` : "–"),
        fact("Started", formatTime(tree.startNs / 1e6, true)),
        fact("Duration", formatDuration(tree.durationNs)),
        fact("Spans", String(spans.length)),
        fact("Services", services.join(", ")),
        fact("CPU in spans", formatDuration(body.total - (body.unattributed || 0))),
      ),
      el(
        "p",
        { class: "hs-trace-links" },
        el("a", { class: "hs-open-in-profiles", href: profilesLink(tree) }, "Open this trace's samples in Profiles"),
        " (timeline, label filters, diff)",
      ),
    );
  }

  /** The explorer filtered to this trace, over the time it ran (plus the agent's upload
   * window: samples are stamped with the start of theirs). */
  function profilesLink(tree) {
    const startMs = tree.startNs / 1e6;
    const endMs = startMs + tree.durationNs / 1e6;
    const range = absoluteRange(startMs - 5 * 60e3, endMs + 5 * 60e3);
    const params = new URLSearchParams({ traceId, from: range.from, until: range.until });
    return `/profiles?${params}`;
  }

  // Span attributes, from the Tempo trace API (typed values as OTLP JSON has them).
  async function loadAttributes() {
    try {
      const body = await getJSON(`/api/v2/traces/${traceId}`, {}, { signal });
      for (const rs of (body.trace && body.trace.resourceSpans) || []) {
        for (const ss of rs.scopeSpans || []) {
          for (const s of ss.spans || []) {
            const span = byId.get(String(s.spanId || "").toLowerCase());
            if (!span) continue;
            span.attributes = (s.attributes || []).map((a) => [a.key, anyValue(a.value)]);
            span.status = s.status || null;
            span.events = (s.events || []).map((e) => ({
              name: e.name || "",
              offsetNs: Number(e.timeUnixNano || 0) - Number(span.startNs || 0),
              attributes: (e.attributes || []).map((a) => `${a.key}=${anyValue(a.value)}`).join(" "),
            }));
          }
        }
      }
      if (waterfall) waterfall.markErrors();
      showDetails();
    } catch {
      // The waterfall and profiles do without attributes.
    }
  }

  load();
  return () => {
    controller.abort();
    if (profileController) profileController.abort();
    if (waterfall) waterfall.destroy();
    if (panel) panel.destroy();
    if (why) why.destroy();
  };
}

function fact(term, value) {
  return el("div", { class: "hs-fact" }, el("dt", {}, term), el("dd", {}, value));
}

function anyValue(v) {
  if (!v) return "";
  if ("stringValue" in v) return v.stringValue;
  if ("intValue" in v) return String(v.intValue);
  if ("doubleValue" in v) return String(v.doubleValue);
  if ("boolValue" in v) return String(v.boolValue);
  if ("arrayValue" in v) return `[${(v.arrayValue.values || []).map(anyValue).join(", ")}]`;
  if ("kvlistValue" in v) {
    return `{${(v.kvlistValue.values || []).map((kv) => `${kv.key}: ${anyValue(kv.value)}`).join(", ")}}`;
  }
  if ("bytesValue" in v) return v.bytesValue;
  return JSON.stringify(v);
}

function emptyTypeMessage(span, type) {
  const what = typeLabel(type);
  return message(
    "empty",
    span ? `Span "${span.name}" has no samples of ${what}.` : `No samples of ${what} are linked to this trace.`,
    "Allocations are sampled every 512 KiB allocated on average and lock waits only when a lock was contended: " +
      'short spans often hold none. Tick "include descendants", look at the whole trace, or pick another type.',
  );
}

function emptyProfileMessage(span, descendants, offers = []) {
  if (!span) {
    return message(
      "empty",
      "No CPU samples are linked to this trace.",
      "Check that the traced program runs the hotspan agent (hotspan.configure(...)) with the OpenTelemetry " +
        "SDK, so that its samples carry span ids; samples arrive with the agent's next upload (about 10 s).",
    );
  }
  if (!descendants && span.total > 0) {
    return message(
      "empty",
      `Span "${span.name}" has no CPU samples of its own.`,
      `Its descendants used ${formatDuration(span.total)} of CPU: tick "include descendants" to see them.`,
    );
  }
  if (span.activity.kind === "short") {
    return message(
      "empty",
      `Span "${span.name}" lasted ${formatDuration(span.durationNs)}: too few samples to tell whether it was on CPU.`,
      "The agent takes a CPU sample every 10 ms of CPU (at 100 Hz), so a span this short can compute " +
        "all along and hold none. Look at its parent, or at the whole trace.",
    );
  }
  // Off CPU the CPU profile cannot tell why; the lock and GIL-wait profiles name their waits
  // when they have them, and are offered in one click.
  const text =
    `Span "${span.name}" holds no CPU samples: it was not on CPU` +
    `${span.activity.locks ? `, ${span.activity.locks}` : ""}.`;
  if (offers.length) {
    const box = message("empty", text, "Where it waited is in another profile:");
    box.append(el("p", { class: "hs-offers" }, ...offers));
    return box;
  }
  return message(
    "empty",
    text,
    "CPU is sampled every few milliseconds, so very short spans rarely hold samples. Pick a span with CPU time " +
      "in the waterfall, or look at the whole trace.",
  );
}
