// Trace and span ids as OpenTelemetry writes them, and spans as hotspan's trace APIs return
// them (`/api/traces/<id>/spans`: startTimeUnixNano as a decimal string, durationNanos).

export const TRACE_ID = /^[0-9a-f]{32}$/;
export const SPAN_ID = /^[0-9a-f]{16}$/;

/**
 * A trace id as people paste it (up to 32 hex digits, any case; Tempo and Jaeger drop leading
 * zeros) as the 32 lowercase digits the APIs take, or null when it is not one.
 */
export function traceIdOf(text) {
  const id = String(text || "")
    .trim()
    .toLowerCase();
  return /^[0-9a-f]{1,32}$/.test(id) ? id.padStart(32, "0") : null;
}

/**
 * When the spans ran, `{startMs, endMs}`, or null for none.  A loop rather than
 * Math.min(...spans): a trace of a hundred thousand spans would overflow the call stack.
 */
export function spanExtentMs(spans) {
  if (!spans.length) return null;
  let startMs = Infinity;
  let endMs = -Infinity;
  for (const s of spans) {
    const start = Number(BigInt(s.startTimeUnixNano || "0") / 1000n) / 1000;
    startMs = Math.min(startMs, start);
    endMs = Math.max(endMs, start + Number(s.durationNanos || 0) / 1e6);
  }
  return { startMs, endMs };
}
