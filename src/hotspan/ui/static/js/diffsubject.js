// One side of a diff that names a trace, and maybe one of its spans: what it compares.
//
// A span side is the span and its descendants, as the trace view's span profile is; a trace
// side is every sample of the trace.  The descendants are listed here from the trace's stored
// spans and sent as the querier's span_selector, so the server's Diff narrows each side the
// way SelectMergeStacktraces does.

import { ApiError, getJSON } from "./api.js";
import { SPAN_ID, TRACE_ID, spanExtentMs } from "./spans.js";

const HOUR_MS = 3600e3;

/** Lower-cased ids, or throws an Error saying which one is not an id. */
export function checkIds(traceId, spanId) {
  const trace = String(traceId || "").toLowerCase();
  const span = String(spanId || "").toLowerCase();
  if (!TRACE_ID.test(trace)) throw new Error(`"${traceId}" is not a trace id (32 hex digits)`);
  if (span && !SPAN_ID.test(span)) throw new Error(`"${spanId}" is not a span id (16 hex digits)`);
  return { traceId: trace, spanId: span };
}

/** "9c1e4d5f…": enough of an id to tell two apart on screen; the full one is in the link. */
export function shortId(id) {
  return id.length > 8 ? `${id.slice(0, 8)}…` : id;
}

/** Every span below `root` in the trace, from the spans' parent ids. */
function descendants(spans, root) {
  const children = new Map();
  for (const s of spans) {
    if (!children.has(s.parentSpanID)) children.set(s.parentSpanID, []);
    children.get(s.parentSpanID).push(s.spanID);
  }
  const out = new Set();
  const todo = [...(children.get(root) || [])];
  while (todo.length) {
    const id = todo.pop();
    if (out.has(id) || id === root) continue; // a malformed trace may loop
    out.add(id);
    for (const child of children.get(id) || []) todo.push(child);
  }
  return [...out];
}

/**
 * What a trace side compares, from the trace's stored spans:
 * `{traceId, spanId, span, spanIds, stored, service, name, window}` where `spanIds` is the span
 * and its descendants ([] for a whole trace), `stored` whether the server has the trace's spans,
 * `window` the range its samples fall in ({startMs, endMs}, an hour either side, as the trace
 * view's), or null when no span is stored.  Throws an Error for a span the trace does not hold.
 */
export async function loadSubject({ traceId, spanId }, signal) {
  let spans = [];
  try {
    const answer = await getJSON(`/api/traces/${traceId}/spans`, {}, { signal });
    spans = answer.spans || [];
  } catch (err) {
    // Samples can name a trace whose spans never reached this server: still comparable.
    if (!(err instanceof ApiError && err.status === 404)) throw err;
  }
  const stored = spans.length > 0;
  const span = spanId ? spans.find((s) => s.spanID === spanId) || null : null;
  if (spanId && stored && !span) {
    throw new Error(`trace ${shortId(traceId)} has no span ${spanId}`);
  }
  const ids = new Set(spans.map((s) => s.spanID));
  const root = spans.find((s) => !s.parentSpanID || !ids.has(s.parentSpanID));
  let window = null;
  if (stored) {
    const { startMs, endMs } = spanExtentMs(spans);
    window = { startMs: startMs - HOUR_MS, endMs: endMs + HOUR_MS };
  }
  return {
    traceId,
    spanId,
    span,
    spanIds: spanId ? [spanId, ...(span ? descendants(spans, spanId) : [])] : [],
    stored,
    service: (span || root || {}).service || "",
    name: (span || root || {}).name || "",
    window,
  };
}

/** "span GET /checkout (3f2a1b2c…) of trace 9c1e4d5f…", or "trace 9c1e4d5f… (GET /checkout)". */
export function describeSubject(subject) {
  const trace = `trace ${shortId(subject.traceId)}`;
  if (subject.spanId) {
    const name = subject.span ? `${subject.span.name} ` : "";
    return `span ${name}(${shortId(subject.spanId)}) of ${trace}`;
  }
  return subject.name ? `${trace} (${subject.name})` : trace;
}

/** The trace view of the subject, with its span selected and its descendants included. */
export function traceHref(subject, profileType) {
  const params = new URLSearchParams();
  if (subject.spanId) {
    params.set("span", subject.spanId);
    params.set("descendants", "1");
  }
  if (profileType) params.set("type", profileType);
  const query = params.toString();
  return `/traces/${subject.traceId}${query ? `?${query}` : ""}`;
}
