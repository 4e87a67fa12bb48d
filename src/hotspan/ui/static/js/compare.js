// Comparing two spans or two traces from the trace view: a span (or the whole trace) is set
// as the baseline, then another one, of this trace or another, opens the diff of the two
// profiles; or a trace id typed in opens the diff of this trace against that one.
// The baseline lives in sessionStorage, so it survives opening another trace in the tab.
//   /diff?profileType=..&leftTraceId=..&leftSpanId=..&rightTraceId=..&rightSpanId=..
//        &leftFrom=..&leftUntil=..&rightFrom=..&rightUntil=..   (span ids optional)

import { ApiError, getJSON } from "./api.js";
import { el, rejectInput } from "./dom.js";
import { navigate } from "./router.js";
import { spanExtentMs, traceIdOf } from "./spans.js";
import { absoluteRange } from "./timerange.js";

const BASELINE_KEY = "hotspan.compare.baseline";
// Samples are stamped with the start of the agent's upload window: look a little around.
const SLACK_MS = 5 * 60e3;

/** The absolute range ({from, until}) to look for the samples of a trace (buildTree's). */
export function traceRange(tree) {
  const startMs = tree.startNs / 1e6;
  return absoluteRange(startMs - SLACK_MS, startMs + tree.durationNs / 1e6 + SLACK_MS);
}

/** The diff of two sides ({traceId, spanId?, range}) in profile type `type`. */
export function diffUrl(type, left, right) {
  const params = new URLSearchParams({ profileType: type });
  for (const [side, what] of [
    ["left", left],
    ["right", right],
  ]) {
    params.set(`${side}TraceId`, what.traceId);
    if (what.spanId) params.set(`${side}SpanId`, what.spanId);
    params.set(`${side}From`, what.range.from);
    params.set(`${side}Until`, what.range.until);
  }
  return `/diff?${params}`;
}

function loadBaseline() {
  try {
    return JSON.parse(sessionStorage.getItem(BASELINE_KEY) || "null");
  } catch {
    return null;
  }
}

function saveBaseline(value) {
  try {
    if (value) sessionStorage.setItem(BASELINE_KEY, JSON.stringify(value));
    else sessionStorage.removeItem(BASELINE_KEY);
  } catch {
    // Not remembered past this page; the comparison still works within it.
  }
  memory = value;
}

let memory = null; // when sessionStorage is disabled

function describe(side) {
  return side.spanId
    ? `span "${side.name}" of trace ${side.traceId.slice(0, 8)}…`
    : `trace ${side.traceId.slice(0, 8)}…`;
}

/**
 * The compare actions for what the trace view shows: `span` (a waterfall span, or null for
 * the whole trace) of trace `traceId`, in profile type `type`; `range` is the trace's
 * absolute range (traceRange).
 */
export function compareBox({ traceId, span, type, range }) {
  const current = { traceId, spanId: span ? span.spanID : "", name: span ? span.name : "", range };
  const box = el("div", { class: "hs-compare" });
  const draw = () => {
    const baseline = loadBaseline() || memory;
    const same = baseline && baseline.traceId === current.traceId && baseline.spanId === current.spanId;
    const setButton = el(
      "button",
      {
        type: "button",
        class: "hs-compare-baseline",
        title: "Pick this as the baseline, then open another span or trace to compare",
      },
      same ? "Baseline ✓" : `Set ${span ? "span" : "trace"} as baseline`,
    );
    setButton.addEventListener("click", () => {
      saveBaseline(same ? null : current);
      draw();
    });
    const parts = [el("span", { class: "hs-compare-label" }, "Compare"), setButton];
    if (baseline && !same) {
      parts.push(
        el(
          "a",
          { class: "hs-compare-link", href: diffUrl(type, baseline, current) },
          `Diff against baseline: ${describe(baseline)}`,
        ),
      );
    }
    const input = el("input", {
      class: "hs-compare-trace",
      placeholder: "another trace id",
      "aria-label": "Trace id to compare with",
      size: 34,
    });
    const status = el("span", { class: "hs-compare-status", "aria-live": "polite" });
    const form = el(
      "form",
      { class: "hs-compare-form", onsubmit: (event) => (event.preventDefault(), compareTrace(input, status)) },
      input,
      el("button", { type: "submit", class: "hs-compare-trace-go" }, "Compare traces"),
      status,
    );
    parts.push(form);
    box.replaceChildren(...parts);
  };

  /** This whole trace (left) against another whole trace (right), over that one's time. */
  async function compareTrace(input, status) {
    const other = traceIdOf(input.value);
    if (!other) {
      rejectInput(input, "a trace id: up to 32 hex digits");
      return;
    }
    status.textContent = "Looking up the trace…";
    try {
      const spans = (await getJSON(`/api/traces/${other}/spans`)).spans || [];
      if (!spans.length) {
        status.textContent = `Trace ${other} has no spans on this server.`;
        return;
      }
      const { startMs, endMs } = spanExtentMs(spans);
      const tree = { startNs: startMs * 1e6, durationNs: (endMs - startMs) * 1e6 };
      const left = { traceId, range };
      navigate(diffUrl(type, left, { traceId: other, range: traceRange(tree) }));
    } catch (err) {
      status.textContent =
        err instanceof ApiError && err.status === 404
          ? `Trace ${other} was not found on this server.`
          : `The trace could not be looked up: ${err.message || err}`;
    }
  }

  draw();
  return box;
}
