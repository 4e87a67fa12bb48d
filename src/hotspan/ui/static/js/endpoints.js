// Per-endpoint profiling: for one service, its endpoints (the names of its local root spans:
// the server span of each request, a consumer's span, a job's root) with their request count,
// error rate, latency percentiles, cost per request, GIL wait per request, total and share of
// the service's profile, and a link to their slowest traces; a row opens that endpoint's
// flame graph below the table.  Every state is in the URL:
//   /endpoints?query={service_name="shop"}&profileType=<id>&from=now-1h&until=now
//              &name=<endpoint>&order=<column>:<asc|desc>   (&zoom=, &sort=, &sandwich=: the panel's)
//              &by=<label>   (a row per value of that label of the service's profiles)

import { CPU, getJSON, querier } from "./api.js";
import { el, message } from "./dom.js";
import { formatDuration, formatPercent, formatValue, unitOf } from "./format.js";
import { formatSelector, parseSelector, serviceOf, withService } from "./labels.js";
import { ProfilePanel } from "./panel.js";
import { panelState, setQuery } from "./router.js";
import { agentHint, catalogue, errorBox, pickType, selectOf, typeLabel } from "./selection.js";
import { DEFAULT_FROM, DEFAULT_UNTIL, TimeRangePicker, describeRange, resolveRange } from "./timerange.js";

const COLUMNS = [
  ["name", "Endpoint", "the span name of the service's local root spans"],
  ["requests", "Requests", "local root spans with this name that started in the range"],
  ["errorRate", "Errors", "share of those requests whose span's status is error"],
  ["p50", "p50", "median duration of the requests (their local root spans)"],
  ["p95", "p95", "95th percentile of the requests' durations"],
  ["p99", "p99", "99th percentile of the requests' durations"],
  ["perRequest", "Per request", "mean profile value of one request (its spans in this service)"],
  ["cpuPerRequest", "CPU / request", "mean CPU time of one request, whatever the profile shown"],
  ["allocPerRequest", "Alloc / request", "mean bytes one request allocated (the allocation profile's estimate)"],
  [
    "gilWaitPerRequest",
    "GIL wait / request",
    "mean time one request's threads waited for the GIL (the gil_wait profile): Python that was ready to run while other threads held the GIL",
  ],
  ["total", "Total", "profile value of all its requests"],
  ["share", "Share", "of the service's whole profile in the range"],
];

/** The service of the page's `{service_name="x"}` selector ("" if none, or unreadable). */
function serviceOfQuery(query) {
  try {
    return serviceOf(parseSelector(query));
  } catch {
    return "";
  }
}

function selectorOf(service) {
  return formatSelector(withService([], service));
}

export function renderEndpoints(root, { params }) {
  const state = {
    service: serviceOfQuery(params.get("query")),
    type: params.get("profileType") || CPU,
    from: params.get("from") || DEFAULT_FROM,
    until: params.get("until") || DEFAULT_UNTIL,
    name: params.get("name") || "",
    order: params.get("order") || "total:desc",
    by: params.get("by") || "", // a label of the service's profiles to split the requests by
  };
  const controller = new AbortController();
  let loadController = null;
  let panelController = null; // the endpoint flame graph being loaded
  let panel = null;
  let data = null;

  const serviceBox = el("span", { class: "hs-ep-service-box" });
  const typeBox = el("span", { class: "hs-ep-type-box" });
  const byBox = el("span", { class: "hs-ep-by-box" });
  const rangeBox = el("div", { class: "hs-ep-range" });
  const note = el("p", { class: "hs-note hs-ep-note" });
  const tableBox = el("div", { class: "hs-ep-table-box" }, el("p", { class: "hs-loading" }, "Loading endpoints…"));
  const panelTitle = el("h2", { class: "hs-ep-panel-title" });
  const panelBox = el("div", { class: "hs-ep-profile" });
  const panelSection = el("div", { class: "hs-ep-panel-section", hidden: true }, panelTitle, panelBox);
  new TimeRangePicker(rangeBox, {
    from: state.from,
    until: state.until,
    onChange: (from, until) => {
      state.from = from;
      state.until = until;
      setQuery(
        { from: from === DEFAULT_FROM ? "" : from, until: until === DEFAULT_UNTIL ? "" : until },
        { push: true },
      );
      reload();
    },
  });
  root.append(
    el(
      "section",
      { class: "hs-endpoints" },
      el(
        "div",
        { class: "hs-toolbar hs-ep-toolbar" },
        el("h1", {}, "Endpoints"),
        serviceBox,
        typeBox,
        byBox,
        el("span", { class: "hs-spacer" }),
        rangeBox,
      ),
      note,
      tableBox,
      panelSection,
    ),
  );

  async function reload() {
    if (loadController) loadController.abort();
    // An endpoint's flame graph still loading belongs to the old service, type or range.
    if (panelController) panelController.abort();
    loadController = new AbortController();
    const signal = loadController.signal;
    let range;
    try {
      range = resolveRange(state.from, state.until);
    } catch (err) {
      tableBox.replaceChildren(message("error", `The time range is wrong: ${err.message}`, "pick a range above"));
      return;
    }
    tableBox.replaceChildren(el("p", { class: "hs-loading" }, "Loading endpoints…"));
    let known;
    try {
      known = await catalogue(range.startMs, range.endMs, signal);
    } catch (err) {
      if (err.name === "AbortError") return;
      tableBox.replaceChildren(errorBox(err));
      return;
    }
    // A service named in the URL stays, with or without data: a shared link never shows
    // another service than the one it names.
    if (!state.service) state.service = [...known.keys()].filter(Boolean).sort()[0] || "";
    const services = new Set([...known.keys()].filter(Boolean));
    if (state.service) services.add(state.service);
    serviceBox.replaceChildren(
      el(
        "label",
        {},
        el("span", { class: "hs-ep-label" }, "Service "),
        selectOf(
          "hs-ep-service",
          "Service",
          [...services].sort().map((s) => [s, s]),
          state.service,
          (value) => {
            state.service = value;
            state.name = "";
            setQuery({ query: selectorOf(value), name: "" }, { push: true });
            reload();
          },
        ),
      ),
    );
    const types = known.get(state.service) || new Set();
    // A type the URL names stays (the table then says there is no data); without one, the
    // service's CPU profile or its first type.
    if (!params.get("profileType") && !types.has(state.type) && types.size) state.type = pickType(types, state.type);
    const typeList = new Set([...types, state.type]);
    typeBox.replaceChildren(
      el(
        "label",
        {},
        el("span", { class: "hs-ep-label" }, "Profile "),
        selectOf(
          "hs-ep-type",
          "Profile type",
          [...typeList].sort().map((t) => [t, typeLabel(t)]),
          state.type,
          (value) => {
            state.type = value;
            setQuery({ profileType: value === CPU ? "" : value });
            reload();
          },
        ),
      ),
    );
    if (!state.service) {
      tableBox.replaceChildren(
        message("empty", `No profiles in ${describeRange(state.from, state.until).toLowerCase()}.`, agentHint()),
      );
      return;
    }
    setQuery({ query: selectorOf(state.service) });
    drawSplitPicker(range, signal);
    try {
      data = await getJSON(
        "/api/v1/endpoints",
        {
          service: state.service,
          profileType: state.type,
          start: Math.floor(range.startMs / 1000),
          end: Math.ceil(range.endMs / 1000),
          by: state.by,
        },
        { signal },
      );
    } catch (err) {
      if (err.name === "AbortError") return;
      tableBox.replaceChildren(errorBox(err));
      return;
    }
    data.range = range;
    // Percentiles as columns of their own, to sort on.
    const flat = (e, extra) => Object.assign(e, { p50: 0, p95: 0, p99: 0 }, e.latencyNanos, extra);
    for (const e of data.endpoints) flat(e);
    // Split by a label: a row per (value, endpoint), the value in its own column.
    data.rows = data.groups
      ? data.groups.flatMap((g) => g.endpoints.map((e) => flat(e, { group: g.value })))
      : data.endpoints;
    drawTable();
    if (state.name) openEndpoint(state.name, { push: false });
    else panelSection.hidden = true;
  }

  /** "Split by": the labels of the service's profiles (version, region, ...). */
  async function drawSplitPicker(range, signal) {
    let names = [];
    try {
      const answer = await querier(
        "LabelNames",
        { matchers: [selectorOf(state.service)], start: range.startMs, end: range.endMs },
        { signal },
      );
      names = (answer.names || []).filter((n) => !n.startsWith("__") && n !== "service_name");
    } catch (err) {
      if (err.name === "AbortError") return;
    }
    if (state.by && !names.includes(state.by)) names.push(state.by);
    byBox.replaceChildren(
      el(
        "label",
        { title: "Each request under the value of this label its samples carry" },
        el("span", { class: "hs-ep-label" }, "Split by "),
        selectOf("hs-ep-by", "Split by", [["", "nothing"], ...names.sort().map((n) => [n, n])], state.by, (value) => {
          state.by = value;
          setQuery({ by: value }, { push: true });
          reload();
        }),
      ),
    );
  }

  /** The trace search for one endpoint's requests (its local root spans) in the page's
   * range, the longest first. */
  function slowestTraces(name) {
    const search = new URLSearchParams({ service: state.service, name });
    if (state.from !== DEFAULT_FROM) search.set("from", state.from);
    if (state.until !== DEFAULT_UNTIL) search.set("until", state.until);
    return `/traces?${search}`;
  }

  function drawTable() {
    const unit = unitOf(data.profileType) || "nanoseconds";
    const where = describeRange(state.from, state.until).toLowerCase();
    note.textContent = data.truncated
      ? "Only the latest 100,000 spans of the range are counted: narrow the range for exact figures."
      : "";
    if (!data.endpoints.length) {
      tableBox.replaceChildren(
        message(
          "empty",
          `No endpoints for service "${state.service}" in ${where}.`,
          data.total
            ? "The service sent profiles but no spans: instrument it with the OpenTelemetry SDK so that its samples carry span ids."
            : el("span", {}, `No data for "${state.service}" in this range. `, agentHint()),
        ),
      );
      return;
    }
    const [column, direction] = state.order.split(":");
    const sign = direction === "asc" ? 1 : -1;
    const split = Boolean(data.groups);
    const rows = [...data.rows].sort((a, b) => {
      const x = column === "group" ? a.group || "" : a[column];
      const y = column === "group" ? b.group || "" : b[column];
      const cmp = typeof x === "string" ? x.localeCompare(y) : x - y;
      return sign * cmp || a.name.localeCompare(b.name) || String(a.group || "").localeCompare(String(b.group || ""));
    });
    // The GIL-wait column only where the service's agent records GIL waits (and not per
    // value of a split); a split's value first.
    // CPU and allocations per request where the service records them (not per value of a
    // split, which measures the profile shown).
    const has = (key) => rows.some((e) => e[key] !== null && e[key] !== undefined);
    const shown = {
      gilWaitPerRequest: Boolean(data.gilWaitProfileType) && !split,
      cpuPerRequest: has("cpuPerRequest"),
      allocPerRequest: has("allocPerRequest"),
    };
    const columns = [
      ...(split ? [["group", data.by, `the value of ${data.by} its requests' samples carry`]] : []),
      ...COLUMNS.filter(([key]) => shown[key] !== false),
    ];
    const head = el(
      "tr",
      {},
      columns.map(([key, text, title]) => {
        const active = key === column;
        const th = el(
          "th",
          {
            class: `hs-ep-sort${active ? " hs-ep-sorted" : ""}`,
            dataset: { column: key },
            title: `${title}; click to sort`,
            "aria-sort": active ? (direction === "asc" ? "ascending" : "descending") : "none",
            tabindex: 0,
          },
          text,
          active ? (direction === "asc" ? " ▲" : " ▼") : "",
        );
        const sort = () => {
          const next = active ? (direction === "asc" ? "desc" : "asc") : key === "name" ? "asc" : "desc";
          state.order = `${key}:${next}`;
          setQuery({ order: state.order === "total:desc" ? "" : state.order });
          drawTable();
        };
        th.addEventListener("click", sort);
        th.addEventListener("keydown", (event) => {
          if (event.key === "Enter" || event.key === " ") (event.preventDefault(), sort());
        });
        return th;
      }),
    );
    const body = el("tbody");
    for (const e of rows) {
      const bar = el("span", { class: "hs-ep-share-bar" });
      bar.style.width = `${Math.min(100, 100 * e.share)}%`;
      const row = el(
        "tr",
        { class: `hs-ep-row${e.name === state.name ? " hs-selected" : ""}`, dataset: { name: e.name }, tabindex: 0 },
        split
          ? el(
              "td",
              { class: "hs-ep-group", title: e.group === null ? "requests without samples" : null },
              e.group === null ? "(no samples)" : e.group || `(no ${data.by})`,
            )
          : null,
        el(
          "td",
          { class: "hs-ep-name" },
          e.name,
          el(
            "a",
            {
              class: "hs-ep-traces",
              href: slowestTraces(e.name),
              title: "This endpoint's requests in the range, the longest first",
            },
            "slowest traces",
          ),
        ),
        el("td", { class: "hs-ep-num hs-ep-requests" }, String(e.requests)),
        el(
          "td",
          { class: `hs-ep-num hs-ep-errors${e.errors ? " hs-ep-failing" : ""}`, title: `${e.errors} of ${e.requests}` },
          e.errors ? formatPercent(e.errors, e.requests) : "0",
        ),
        el("td", { class: "hs-ep-num hs-ep-p50" }, formatDuration(e.p50)),
        el("td", { class: "hs-ep-num hs-ep-p95" }, formatDuration(e.p95)),
        el("td", { class: "hs-ep-num hs-ep-p99" }, formatDuration(e.p99)),
        el("td", { class: "hs-ep-num hs-ep-per-request" }, formatValue(e.perRequest, unit)),
        shown.cpuPerRequest
          ? el("td", { class: "hs-ep-num hs-ep-cpu" }, formatValue(e.cpuPerRequest || 0, "nanoseconds"))
          : null,
        shown.allocPerRequest
          ? el("td", { class: "hs-ep-num hs-ep-alloc" }, formatValue(e.allocPerRequest || 0, "bytes"))
          : null,
        shown.gilWaitPerRequest
          ? el("td", { class: "hs-ep-num hs-ep-gil-wait" }, formatValue(e.gilWaitPerRequest || 0, "nanoseconds"))
          : null,
        el("td", { class: "hs-ep-num hs-ep-total" }, formatValue(e.total, unit)),
        el(
          "td",
          { class: "hs-ep-num hs-ep-share" },
          el("span", { class: "hs-ep-share-text" }, formatPercent(e.total, data.total)),
          el("span", { class: "hs-ep-share-track" }, bar),
        ),
      );
      row.addEventListener("click", (event) => {
        if (!event.target.closest("a")) openEndpoint(e.name);
      });
      row.addEventListener("keydown", (event) => {
        if (event.key === "Enter") openEndpoint(e.name);
      });
      body.append(row);
    }
    body.append(
      el(
        "tr",
        {
          class: "hs-ep-unattributed",
          title: "samples without a span, of spans not stored, or of requests that started before the range",
        },
        split ? el("td", {}, "") : null,
        el("td", { class: "hs-ep-name" }, "not attributed to an endpoint"),
        ...Array.from({ length: 6 + (shown.cpuPerRequest ? 1 : 0) + (shown.allocPerRequest ? 1 : 0) }, () =>
          el("td", {}, ""),
        ),
        shown.gilWaitPerRequest ? el("td", {}, "") : null,
        el("td", { class: "hs-ep-num hs-ep-total" }, formatValue(data.unattributed, unit)),
        el("td", { class: "hs-ep-num hs-ep-share" }, formatPercent(data.unattributed, data.total)),
      ),
    );
    tableBox.replaceChildren(
      el(
        "p",
        { class: "hs-note" },
        `${data.endpoints.length} endpoint${data.endpoints.length === 1 ? "" : "s"} of "${state.service}" in ${where} · `,
        `${typeLabel(data.profileType)}: ${formatValue(data.total, unit)} in all. Click a row for its flame graph.`,
      ),
      el(
        "div",
        { class: "hs-table-scroll" },
        el("table", { class: "hs-table hs-ep-table" }, el("thead", {}, head), body),
      ),
    );
  }

  function ensurePanel() {
    if (panel) return panel;
    panel = new ProfilePanel(panelBox, {
      ...panelState(new URLSearchParams(location.search)),
      unit: unitOf(state.type) || "nanoseconds",
      exportName: `endpoint-${state.service}`,
    });
    return panel;
  }

  async function openEndpoint(name, { push = true } = {}) {
    if (!data) return;
    if (push && name !== state.name) setQuery({ name }, { push: true });
    state.name = name;
    for (const row of tableBox.querySelectorAll(".hs-ep-row"))
      row.classList.toggle("hs-selected", row.dataset.name === name);
    panelSection.hidden = false;
    panelTitle.replaceChildren(`${typeLabel(state.type)} of `, el("span", { class: "hs-ep-panel-name" }, name));
    const p = ensurePanel();
    p.setLoading(`Loading the profile of ${name}…`);
    if (panelController) panelController.abort();
    panelController = new AbortController();
    const mine = panelController;
    try {
      const body = await getJSON(
        "/api/v1/endpoints/flamegraph",
        {
          service: state.service,
          profileType: state.type,
          start: Math.floor(data.range.startMs / 1000),
          end: Math.ceil(data.range.endMs / 1000),
          name,
        },
        { signal: mine.signal },
      );
      if (mine.signal.aborted) return;
      const fg = body.flamegraph || {};
      if (!Number(fg.total || 0)) {
        p.setMessage(
          message(
            "empty",
            body.requests
              ? `The ${body.requests} requests of "${name}" hold no samples of this type.`
              : `No requests of "${name}" in this range.`,
            "Short requests that wait rather than compute often hold no CPU sample; pick another endpoint or profile type.",
          ),
        );
        return;
      }
      const per = body.requests ? ` · ${body.requests} requests` : "";
      p.setData(fg, { unit: unitOf(body.profileType) || "nanoseconds", title: `${name}${per}` });
      if (push) panelSection.scrollIntoView({ block: "nearest" });
    } catch (err) {
      if (err.name === "AbortError" || mine.signal.aborted) return;
      p.setMessage(errorBox(err));
    }
  }

  reload();
  return () => {
    controller.abort();
    if (loadController) loadController.abort();
    if (panelController) panelController.abort();
    if (panel) panel.destroy();
  };
}
