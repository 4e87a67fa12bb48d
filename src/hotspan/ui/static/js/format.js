// Numbers as people read them: durations, bytes, counts, percentages and times.

/** The unit of a profile type id `name:sample_type:sample_unit:period_type:period_unit`. */
export function unitOf(profileTypeId) {
  const parts = String(profileTypeId || "").split(":");
  return parts.length >= 3 ? parts[2] : "";
}

const DURATION_STEPS = [
  [3600e9, "h"],
  [60e9, "min"],
  [1e9, "s"],
  [1e6, "ms"],
  [1e3, "µs"],
];

/** 1234567 -> "1.23 ms" */
export function formatDuration(ns) {
  const n = Number(ns);
  if (!Number.isFinite(n)) return "–";
  const abs = Math.abs(n);
  for (const [size, unit] of DURATION_STEPS) {
    if (abs >= size) return `${trim(n / size)} ${unit}`;
  }
  return `${trim(n)} ns`;
}

const BYTE_STEPS = [
  [1024 ** 4, "TiB"],
  [1024 ** 3, "GiB"],
  [1024 ** 2, "MiB"],
  [1024, "KiB"],
];

export function formatBytes(bytes) {
  const n = Number(bytes);
  const abs = Math.abs(n);
  for (const [size, unit] of BYTE_STEPS) {
    if (abs >= size) return `${trim(n / size)} ${unit}`;
  }
  return `${trim(n)} B`;
}

export function formatCount(count) {
  const n = Number(count);
  const abs = Math.abs(n);
  if (abs >= 1e9) return `${trim(n / 1e9)} G`;
  if (abs >= 1e6) return `${trim(n / 1e6)} M`;
  if (abs >= 1e4) return `${trim(n / 1e3)} k`;
  return `${trim(n)}`;
}

/** A value in the unit of its profile type ("nanoseconds", "bytes", "count", ...). */
export function formatValue(value, unit) {
  if (unit === "nanoseconds") return formatDuration(value);
  if (unit === "microseconds") return formatDuration(Number(value) * 1e3);
  if (unit === "milliseconds") return formatDuration(Number(value) * 1e6);
  if (unit === "seconds") return formatDuration(Number(value) * 1e9);
  if (unit === "bytes") return formatBytes(value);
  return formatCount(value);
}

export function formatPercent(part, total) {
  if (!total) return "0%";
  const p = (100 * Number(part)) / Number(total);
  if (p !== 0 && Math.abs(p) < 0.01) return p > 0 ? "<0.01%" : ">-0.01%";
  return `${p.toFixed(Math.abs(p) < 10 ? 2 : 1)}%`;
}

function trim(x) {
  const abs = Math.abs(x);
  const digits = abs >= 100 ? 0 : abs >= 10 ? 1 : 2;
  return String(Number(x.toFixed(digits)));
}

function pad(n, width = 2) {
  return String(n).padStart(width, "0");
}

/** Local time "2026-11-22 14:03:07" (with milliseconds when `withMs`). */
export function formatTime(ms, withMs = false) {
  const d = new Date(Number(ms));
  const text =
    `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return withMs ? `${text}.${pad(d.getMilliseconds(), 3)}` : text;
}
