// The traces where a function is hot, from a flame graph frame's menu: the traces whose
// samples hold most of that function's time in the range, the largest first, each with the
// function's part of the trace's profile.
//   /traces?function=<frame name>&query={service_name="api"}&profileType=…&from=now-1h&until=now

import { CPU, getJSON } from "./api.js";
import { el, message } from "./dom.js";
import { formatDuration, formatPercent, formatValue, unitOf } from "./format.js";
import { errorBox, typeLabel } from "./selection.js";
import { DEFAULT_FROM, DEFAULT_UNTIL, describeRange, resolveRange } from "./timerange.js";

export function renderHotTraces(root, { params }) {
  const fn = params.get("function") || "";
  const query = params.get("query") || "{}";
  const type = params.get("profileType") || CPU;
  const from = params.get("from") || DEFAULT_FROM;
  const until = params.get("until") || DEFAULT_UNTIL;
  const unit = unitOf(type) || "nanoseconds";
  const controller = new AbortController();
  const results = el("div", { class: "hs-hot-results" }, el("p", { class: "hs-loading" }, "Finding its traces…"));
  const back = new URLSearchParams({ query, from, until });
  if (params.get("profileType")) back.set("profileType", type);
  root.append(
    el(
      "section",
      { class: "hs-hot-traces" },
      el("h1", {}, "Traces where a function is hot"),
      el(
        "p",
        { class: "hs-hot-what" },
        el("code", { class: "hs-hot-function" }, fn),
        ` · ${typeLabel(type)} · `,
        el("code", {}, query),
        ` · ${describeRange(from, until)} · `,
        el("a", { href: `/profiles?${back}` }, "back to the profile"),
      ),
      results,
    ),
  );
  let range;
  try {
    range = resolveRange(from, until);
  } catch (err) {
    results.replaceChildren(message("error", `The time range is wrong: ${err.message}`, "fix it in the address"));
    return () => controller.abort();
  }
  getJSON(
    "/api/v1/function/traces",
    {
      function: fn,
      query,
      profileType: type,
      start: Math.floor(range.startMs / 1000),
      end: Math.ceil(range.endMs / 1000),
      limit: 50,
    },
    { signal: controller.signal },
  )
    .then((body) => results.replaceChildren(...answer(body, unit)))
    .catch((err) => {
      if (err.name !== "AbortError") results.replaceChildren(errorBox(err));
    });
  return () => controller.abort();
}

function answer(body, unit) {
  const traces = body.traces || [];
  if (!body.value) {
    return [message("empty", "This function has no samples in this range and selection.", "Widen the time range.")];
  }
  const summary = el(
    "p",
    { class: "hs-hot-summary" },
    `${formatValue(body.value, unit)} in this function (${formatPercent(body.value, body.total)} of the selection); `,
    `${formatPercent(body.inTraces, body.value)} of it in samples of a trace.`,
  );
  if (!traces.length) {
    return [
      summary,
      message(
        "empty",
        "None of its samples carries a trace id.",
        "Spans link samples to traces: instrument the program with OpenTelemetry and keep hotspan's trace correlation on.",
      ),
    ];
  }
  const longest = Math.max(...traces.map((t) => t.value), 1);
  const rows = traces.map((t) => {
    const bar = el("span", { class: "hs-result-bar" });
    bar.style.width = `${Math.max((100 * t.value) / longest, 0.5)}%`;
    return el(
      "tr",
      { class: "hs-hot-row", dataset: { traceId: t.traceID } },
      el(
        "td",
        { class: "hs-result-name" },
        el(
          "a",
          { href: `/traces/${t.traceID}`, class: "hs-trace-link" },
          t.rootServiceName ? el("span", { class: "hs-service-name" }, `${t.rootServiceName} `) : null,
          t.rootTraceName || "<spans not stored>",
        ),
        el("div", { class: "hs-result-id" }, t.traceID),
      ),
      el(
        "td",
        { class: "hs-hot-value" },
        el("span", { class: "hs-hot-value-text" }, formatValue(t.value, unit)),
        el("span", { class: "hs-result-track" }, bar),
      ),
      el("td", { class: "hs-hot-share" }, formatPercent(t.value, t.traceTotal)),
      el("td", { class: "hs-hot-duration" }, t.durationNanos ? formatDuration(t.durationNanos) : "–"),
    );
  });
  return [
    summary,
    el(
      "div",
      { class: "hs-table-scroll" },
      el(
        "table",
        { class: "hs-table hs-hot-table" },
        el(
          "thead",
          {},
          el(
            "tr",
            {},
            el("th", {}, "Trace"),
            el("th", { title: "The function's samples in the trace" }, "In this function"),
            el("th", { title: "Of the trace's samples in the range" }, "Of the trace"),
            el("th", {}, "Duration"),
          ),
        ),
        el("tbody", {}, rows),
      ),
    ),
  ];
}
