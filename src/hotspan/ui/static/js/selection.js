// What the profile views share: which services and profile types have data, the pickers
// for them, and what to tell the user when there is nothing or something failed.

import { ApiError, CPU, querier } from "./api.js";
import { el, message } from "./dom.js";
import { formatSelector, withService } from "./labels.js";

/** What an empty server or selection should make the user do next. */
export function agentHint() {
  const origin = location.origin;
  return el(
    "span",
    {},
    "Widen the time range, or check that your programs send profiles to ",
    el("code", {}, origin),
    ": ",
    el("code", {}, `hotspan.configure(server_address="${origin}", application_name="my-app")`),
    ", or a Pyroscope SDK with this server address.",
  );
}

export function errorBox(err) {
  if (err instanceof ApiError) return message("error", err.message, err.hint || null);
  return message("error", String(err.message || err));
}

/** Profile types and services that have data in a range, from one Series call. */
export async function catalogue(startMs, endMs, signal) {
  const answer = await querier(
    "Series",
    { matchers: [], labelNames: ["service_name", "__profile_type__"], start: startMs, end: endMs },
    { signal },
  );
  const types = new Map(); // service -> Set(profile type ids)
  for (const set of answer.labelsSet || []) {
    const labels = Object.fromEntries((set.labels || []).map((l) => [l.name, l.value]));
    const service = labels.service_name || "";
    const type = labels.__profile_type__;
    if (!type) continue;
    if (!types.has(service)) types.set(service, new Set());
    types.get(service).add(type);
  }
  return types;
}

// Selector suggestions offered as one types (a datalist): this many at most.
const MAX_SUGGESTIONS = 300;

/**
 * Selectors worth offering for the series of the last day: `{service_name="x"}` and, for each
 * other label of a service, `{service_name="x", label="value"}`; with `service`, only that
 * service's labels, as `{label="value"}` (a selector within the service: fleet settings).
 */
export async function selectorSuggestions({ service = "", startMs, endMs }, signal) {
  const matchers = service ? [formatSelector(withService([], service))] : [];
  const answer = await querier("Series", { matchers, labelNames: [], start: startMs, end: endMs }, { signal });
  const out = new Set();
  for (const set of answer.labelsSet || []) {
    const labels = (set.labels || []).filter((l) => !l.name.startsWith("__"));
    const own = labels.find((l) => l.name === "service_name");
    if (!service && own) out.add(formatSelector(withService([], own.value)));
    for (const l of labels) {
      if (l.name === "service_name") continue;
      const pair = { name: l.name, op: "=", value: l.value };
      out.add(formatSelector(service || !own ? [pair] : withService([pair], own.value)));
    }
    if (out.size >= MAX_SUGGESTIONS) break;
  }
  return [...out].sort().slice(0, MAX_SUGGESTIONS);
}

/** Fills `datalist` with the suggestions, quietly leaving it empty when they cannot be read. */
export function suggestSelectors(datalist, options, signal) {
  selectorSuggestions(options, signal)
    .then((values) => datalist.replaceChildren(...values.map((value) => el("option", { value }))))
    .catch(() => {});
}

// What each profile type measures, in words, for the pickers: Pyroscope's names for Go (which
// hotspan's agent reuses for Python's allocations, heap, locks and threads), Java's
// async-profiler types and .NET's exceptions.
const TYPE_WORDS = {
  "process_cpu:cpu": "CPU time",
  "process_cpu:samples": "CPU samples",
  "wall:wall": "Wall time",
  "gil_wait:gil_wait": "GIL wait time",
  "gil_held:gil_held": "GIL held while others wait",
  "memory:alloc_space": "Allocated bytes",
  "memory:alloc_objects": "Allocated objects",
  "memory:inuse_space": "Live heap bytes",
  "memory:inuse_objects": "Live heap objects",
  "mutex:delay": "Lock wait time",
  "mutex:contentions": "Lock contentions",
  "block:delay": "Blocked time",
  "block:contentions": "Blocking events",
  "goroutines:goroutine": "Threads and tasks (goroutines)",
  "goroutine:goroutine": "Threads and tasks (goroutines)",
  "memory:alloc_in_new_tlab_bytes": "Allocated bytes (new TLABs)",
  "memory:alloc_in_new_tlab_objects": "Allocated objects (new TLABs)",
  "memory:alloc_outside_tlab_bytes": "Allocated bytes (outside TLABs)",
  "memory:alloc_outside_tlab_objects": "Allocated objects (outside TLABs)",
  "memory:live": "Live objects",
  "lock:delay": "Lock wait time",
  "lock:contentions": "Lock contentions",
  "exception:exceptions": "Exceptions thrown",
};

/** The unit a person reads: "ns", "bytes", "objects", "count". */
export function unitWord(id) {
  const [, sampleType = "", unit = ""] = String(id).split(":");
  if (unit === "nanoseconds") return "ns";
  if (unit === "count" && (sampleType.endsWith("_objects") || sampleType === "live")) return "objects";
  return unit;
}

/** name:sample_type:sample_unit:period_type:period_unit -> "Allocated bytes · memory / alloc_space (bytes)" */
export function typeLabel(id) {
  const [name, sampleType] = String(id).split(":");
  // (An id from the address may have no sample type: it is shown as it is.)
  const technical = sampleType === undefined || name === sampleType ? name : `${name} / ${sampleType}`;
  const unit = unitWord(id);
  const words = TYPE_WORDS[`${name}:${sampleType}`];
  return `${words ? `${words} · ` : ""}${technical}${unit ? ` (${unit})` : ""}`;
}

export function pickType(available, wanted) {
  const list = [...available].sort();
  if (wanted && available.has(wanted)) return wanted;
  if (available.has(CPU)) return CPU;
  return list.find((t) => t.includes(":cpu:")) || list[0] || wanted || CPU;
}

export function selectOf(className, label, options, value, onChange) {
  const select = el(
    "select",
    { class: className, "aria-label": label, onchange: () => onChange(select.value) },
    options.map(([v, text]) => el("option", { value: v }, text)),
  );
  select.value = value;
  return select;
}

/**
 * The timeline of a selection from SelectSeries: one series per value of `groupBy` (or one,
 * "total"), as `{label, points: [[ms, value]]}` for Timeline.setData.
 */
export async function selectSeries(
  { profileType, selector, startMs, endMs, stepMs, groupBy = "", traceIds = [], spanIds = [] },
  signal,
) {
  const request = {
    profileTypeID: profileType,
    labelSelector: selector,
    start: startMs,
    end: endMs,
    step: stepMs / 1000,
    groupBy: groupBy ? [groupBy] : [],
  };
  // hotspan's extension of SelectSeriesRequest (fields 100, 101).  A server without it
  // ignores them and answers for the whole selector, so a caller that passes them checks
  // the answer against the flame graph before drawing it.
  if (traceIds.length) request.traceIdSelector = traceIds;
  if (spanIds.length) request.spanSelector = spanIds;
  const answer = await querier("SelectSeries", request, { signal });
  return (answer.series || []).map((s) => {
    const labels = Object.fromEntries((s.labels || []).map((l) => [l.name, l.value]));
    const value = labels[groupBy] ?? "";
    return {
      label: groupBy ? `${groupBy}=${value}` : "total",
      // The label and value a grouped series stands for, to narrow the query to it.
      group: groupBy ? { name: groupBy, value } : null,
      points: (s.points || []).map((p) => [Number(p.timestamp), Number(p.value || 0)]),
    };
  });
}

/** The sum of a series' points (to rank series and compare with a flame graph's total). */
export function seriesTotal(series) {
  return series.points.reduce((sum, [, v]) => sum + v, 0);
}
