// Time ranges as Grafana and Pyroscope write them in URLs: `from`/`until` that are either
// relative ("now-1h", "now") or absolute (unix seconds or milliseconds).

import { el, rejectInput } from "./dom.js";
import { formatTime } from "./format.js";

export const PRESETS = [
  ["now-5m", "Last 5 minutes"],
  ["now-15m", "Last 15 minutes"],
  ["now-1h", "Last 1 hour"],
  ["now-6h", "Last 6 hours"],
  ["now-24h", "Last 24 hours"],
  ["now-7d", "Last 7 days"],
  ["now-30d", "Last 30 days"],
];
export const DEFAULT_FROM = "now-1h";
export const DEFAULT_UNTIL = "now";

const UNIT_MS = { s: 1e3, m: 60e3, h: 3600e3, d: 86400e3, w: 7 * 86400e3 };

/** One end of a range in milliseconds, or NaN when the text is not a time. */
export function parseTime(text, nowMs = Date.now()) {
  const t = String(text || "").trim();
  if (t === "now") return nowMs;
  const relative = t.match(/^now-(\d+)([smhdw])$/);
  if (relative) return nowMs - Number(relative[1]) * UNIT_MS[relative[2]];
  if (/^\d+$/.test(t)) {
    const n = Number(t);
    // Pyroscope's links carry seconds; Grafana's carry milliseconds.
    return n < 1e11 ? n * 1000 : n;
  }
  const date = Date.parse(t);
  return Number.isNaN(date) ? NaN : date;
}

/** {startMs, endMs} for `from`/`until`, or throws an Error naming the bad end. */
export function resolveRange(from, until, nowMs = Date.now()) {
  const startMs = parseTime(from || DEFAULT_FROM, nowMs);
  const endMs = parseTime(until || DEFAULT_UNTIL, nowMs);
  if (Number.isNaN(startMs)) throw new Error(`"${from}" is not a time (try now-1h or unix seconds)`);
  if (Number.isNaN(endMs)) throw new Error(`"${until}" is not a time (try now or unix seconds)`);
  if (endMs <= startMs) throw new Error("the end of the time range is not after its start");
  return { startMs: Math.floor(startMs), endMs: Math.floor(endMs) };
}

export function describeRange(from, until) {
  const preset = PRESETS.find(([value]) => value === from);
  if (preset && (until || DEFAULT_UNTIL) === "now") return preset[1];
  try {
    const { startMs, endMs } = resolveRange(from, until);
    return `${formatTime(startMs)} – ${formatTime(endMs)}`;
  } catch (err) {
    return err.message;
  }
}

/**
 * A picker: preset menu plus editable from/until fields.  `onChange(from, until)` runs when
 * the user picks a preset or applies edited fields.
 */
export class TimeRangePicker {
  constructor(container, { from = DEFAULT_FROM, until = DEFAULT_UNTIL, onChange }) {
    this.onChange = onChange;
    this.select = el(
      "select",
      {
        class: "hs-range-preset",
        "aria-label": "Time range",
        onchange: () => {
          if (this.select.value) this.apply(this.select.value, "now");
        },
      },
      PRESETS.map(([value, label]) => el("option", { value }, label)),
      el("option", { value: "" }, "Custom"),
    );
    this.fromInput = el("input", { class: "hs-range-from", size: 19, "aria-label": "From" });
    this.untilInput = el("input", { class: "hs-range-until", size: 19, "aria-label": "Until" });
    const form = el(
      "form",
      {
        class: "hs-range",
        onsubmit: (event) => {
          event.preventDefault();
          this.apply(this.fromInput.value.trim(), this.untilInput.value.trim());
        },
      },
      this.select,
      this.fromInput,
      el("span", {}, "to"),
      this.untilInput,
      el("button", { type: "submit", class: "hs-range-apply" }, "Apply"),
      el(
        "button",
        {
          type: "button",
          class: "hs-range-zoom-out",
          title: "Zoom out: a range twice as long, around the same middle",
          "aria-label": "Zoom out",
          onclick: () => {
            const wider = zoomOut(this.from, this.until);
            this.apply(wider.from, wider.until);
          },
        },
        "− Zoom out",
      ),
    );
    container.append(form);
    this.set(from, until);
  }

  /** Shows `from`/`until` without calling onChange. */
  set(from, until) {
    // A range set from outside (a preset, a drag) replaces whatever was wrong in the fields.
    this.fromInput.setCustomValidity("");
    this.untilInput.setCustomValidity("");
    this.from = from || DEFAULT_FROM;
    this.until = until || DEFAULT_UNTIL;
    const isPreset = PRESETS.some(([v]) => v === this.from) && this.until === "now";
    this.select.value = isPreset ? this.from : "";
    this.fromInput.value = readable(this.from);
    this.untilInput.value = readable(this.until);
    this.fromInput.title = this.untilInput.title = `${describeRange(this.from, this.until)} (${TIME_ZONE})`;
  }

  apply(from, until) {
    from = canonical(from);
    until = canonical(until);
    try {
      resolveRange(from, until);
    } catch (err) {
      const bad = Number.isNaN(parseTime(until)) ? this.untilInput : this.fromInput;
      rejectInput(bad, err.message);
      return;
    }
    this.set(from, until);
    this.onChange(this.from, this.until);
  }
}

const TIME_ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || "local time";

function isRelative(text) {
  return /^now(-\d+[smhdw])?$/.test(text);
}

/** What the input shows: relative times as written, absolute ones as local date and time. */
function readable(text) {
  if (isRelative(text)) return text;
  const ms = parseTime(text);
  return Number.isNaN(ms) ? text : formatTime(ms);
}

/** What the URL keeps: relative times as written, absolute ones as unix seconds. */
function canonical(text) {
  const t = String(text || "").trim();
  if (isRelative(t) || /^\d+$/.test(t)) return t;
  const ms = parseTime(t);
  return Number.isNaN(ms) ? t : String(Math.floor(ms / 1000));
}

/**
 * The range twice as long around the same middle, as Grafana's zoom out: a range up to now
 * stays one ("now-1h" gives "now-2h"); an absolute one grows both ways, and becomes one up to
 * now when its end would pass it.
 */
export function zoomOut(from, until, nowMs = Date.now()) {
  const { startMs, endMs } = resolveRange(from, until, nowMs);
  const width = endMs - startMs;
  if ((until || DEFAULT_UNTIL) === "now") {
    const seconds = Math.ceil((2 * width) / 1000);
    return {
      from: `now-${seconds % 3600 === 0 ? `${seconds / 3600}h` : seconds % 60 === 0 ? `${seconds / 60}m` : `${seconds}s`}`,
      until: "now",
    };
  }
  const end = endMs + width / 2;
  if (end >= nowMs) return { from: String(Math.floor((startMs - width / 2) / 1000)), until: "now" };
  return absoluteRange(startMs - width / 2, end);
}

/** An absolute range in seconds, as the URL writes a range dragged on a timeline. */
export function absoluteRange(startMs, endMs) {
  return { from: String(Math.floor(startMs / 1000)), until: String(Math.ceil(endMs / 1000)) };
}
