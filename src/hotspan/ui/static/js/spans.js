// Spans as hotspan's trace APIs return them (`/api/traces/<id>/spans`: startTimeUnixNano as a
// decimal string, durationNanos).

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
