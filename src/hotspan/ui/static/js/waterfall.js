// The span waterfall of a trace, as Tempo and Jaeger draw it: one row per span, indented by
// depth, subtrees collapsible, a bar placed by start and duration on the trace's time axis,
// coloured by service; beside it the span's CPU time (its own, and with its descendants) and
// whether it was computing (CPU near its duration) or waiting (little CPU).

import { el } from "./dom.js";
import { fnv1a } from "./flametree.js";
import { formatBytes, formatDuration } from "./format.js";

// The share of a span's duration spent on CPU (its own and its descendants') above which it
// was computing, and below which it was waiting.
export const COMPUTING = 0.6;
export const WAITING = 0.2;
// The agent samples CPU at 100 Hz by default (a sample per 10 ms of CPU; the server keeps no
// period per series, and the agent's governor may lower it). A span shorter than a few
// periods can compute all along and still hold no sample, so then no CPU says nothing.
const SAMPLE_PERIOD_NS = 10e6;
const TOO_FEW_NS = 3 * SAMPLE_PERIOD_NS;
const SAMPLE_SLACK_NS = 2 * SAMPLE_PERIOD_NS;
const MAX_INDENT = 8; // levels (of --hs-wf-indent each): most of the name column stays the name's
// Below this width the waterfall scrolls sideways inside its box rather than squeeze the time
// track to nothing (phones get a compact layout instead, in traces.css); each column of
// another profile type adds its own width.
const MIN_WIDTH_PX = 804; // the sum of the grid's minimum columns and gaps (traces.css)
const EXTRA_WIDTH_PX = 84;
// The profile types the waterfall can show beside CPU: their column and unit.
export const EXTRA_KINDS = {
  // The columns show the values with descendants (as "CPU total"); a cell's tooltip has its own.
  alloc: {
    cls: "hs-wf-alloc",
    head: "Allocated total",
    format: formatBytes,
    title:
      "bytes the span and its descendants allocated (sampled, from the allocation profile); " +
      "hover a cell for the span's own",
  },
  locks: {
    cls: "hs-wf-locks",
    head: "Lock wait total",
    format: formatDuration,
    title:
      "time the span and its descendants waited to acquire locks, summed over all their threads " +
      "(so it can exceed the span's duration; from the lock profile); hover a cell for the span's own",
  },
};
// Profile types that name why a span was off CPU, in its activity badge: lock waits (also a
// column), GIL waits and waits for a core (the wall profile's thread_state="cpu_wait"; these
// two in the badge and the span's details only: a third column would not fit beside the time
// track at 1,024 px).
const NONE = { self: 0, total: 0 };
const GIL_NOTE_SHARE = 0.1;

/** Whether an OTLP JSON status is an error (its code a number, 2, or its enum name). */
export function isError(status) {
  return Boolean(status) && (status.code === 2 || status.code === "STATUS_CODE_ERROR");
}

/** A stable colour per service (hue from a hash of the name). */
export function serviceColor(service) {
  return `hsl(${fnv1a(String(service || "")) % 360} 55% 52%)`;
}

/**
 * What a span was doing, from its CPU time (with descendants) against its duration. Off CPU
 * the CPU profile cannot tell why (I/O, sleep, another service, or other threads holding the
 * GIL look alike), so it says no more than "not on CPU"; the lock profile (`locks`: the
 * span's lock waits, {self, total} as the spans API gives them), the GIL-wait profile (`gil`,
 * likewise) and the wall profile's waits for a core (`core`) name a cause, and a span whose
 * time off CPU went mostly to waiting for the GIL or a core says so.
 */
export function activityOf(durationNs, cpuNs, locks = NONE, gil = NONE, core = NONE) {
  const ratio = durationNs > 0 ? cpuNs / durationNs : 0;
  // CPU is counted in whole samples (10 ms at 100 Hz), so a busy span can hold a little more
  // CPU than its duration; well past that, several threads worked for it.
  let percent = `${Math.round(100 * ratio)}%`;
  if (ratio > 1) percent = cpuNs - durationNs <= SAMPLE_SLACK_NS ? "≈100%" : `${percent}, several threads`;
  // GIL waits are named from a tenth of the span's time: every thread waits for the GIL a
  // little (the agent's own thread takes it now and then), and a few ms of it explain nothing.
  const gilShown = gil.total >= GIL_NOTE_SHARE * durationNs ? gil : NONE;
  const coreShown = core.total >= GIL_NOTE_SHARE * durationNs ? core : NONE;
  const note = [lockNote(durationNs, locks), gilNote(durationNs, gilShown), coreNote(durationNs, coreShown)]
    .filter(Boolean)
    .join("; ");
  const offCpu = `${Math.round(100 * Math.max(0, 1 - ratio))}%`;
  if (!cpuNs && durationNs < TOO_FEW_NS) {
    // Never "not on CPU": a span this short can have computed all along between two samples.
    const title =
      `lasted ${formatDuration(durationNs)}, under 3 CPU sample periods (10 ms each at 100 Hz): ` +
      "that it holds no sample does not show it was idle";
    return { kind: "short", ratio, label: "too few samples", title, locks: note };
  }
  if (ratio >= COMPUTING)
    return { kind: "computing", ratio, label: `computing ${percent}`, title: "CPU time near its duration", locks: "" };
  const unknown =
    "the CPU profile cannot tell why: I/O, sleep, locks, another service, or other threads holding the GIL";
  // What the named waits leave unexplained of its time off CPU (a sleep of 300 ms with 30 ms
  // of waiting for a core as it woke) is still said to be unknown.
  const named = (locks.self || 0) + (gilShown.self || 0) + (coreShown.self || 0);
  const unexplained = named < 0.5 * Math.max(0, 1 - ratio) * durationNs;
  const why = note ? `; ${note}${unexplained ? `; for the rest, ${unknown}` : ""}` : `; ${unknown}`;
  // Most of its time off CPU waiting for the GIL or for a core: that is the answer, not "not
  // on CPU"; the larger of the two names it.
  const [waitNs, waitFor] = core.self > gil.self ? [core.self, "a core"] : [gil.self, "the GIL"];
  const waited = gil.self + core.self;
  const contended = waitNs > 0 && waited <= durationNs && waited >= 0.5 * (1 - ratio) * durationNs;
  const share = `${Math.round((100 * waitNs) / durationNs)}%`;
  if (ratio < WAITING) {
    return {
      kind: "waiting",
      ratio,
      label: contended ? `waiting for ${waitFor} ${share}` : `not on CPU ${offCpu}`,
      title: `on CPU ${percent} of its duration${why}`,
      locks: note,
    };
  }
  return {
    kind: "mixed",
    ratio,
    label: contended
      ? `${waitFor === "a core" ? "CPU wait" : "GIL wait"} ${share}, CPU ${percent}`
      : `mixed ${percent}`,
    title: `on CPU ${percent} of its duration, off CPU the rest${why}`,
    locks: note,
  };
}

/** Waits for a core beside a span's badge: runnable, but every core was busy. */
function coreNote(durationNs, { self = 0, total = 0 }) {
  const own = self > 0 && self <= durationNs ? `of which ${formatDuration(self)} waiting for a core` : "";
  if (total > self) {
    const sum = `${formatDuration(total)} with descendants`;
    return own ? `${own}; ${sum}` : `CPU waits: ${sum}`;
  }
  if (own) return own;
  return self > 0 ? `CPU waits: ${formatDuration(self)} across its threads` : "";
}

/** GIL waits beside a span's badge, as lockNote gives lock waits. */
function gilNote(durationNs, { self = 0, total = 0 }) {
  const own = self > 0 && self <= durationNs ? `of which ${formatDuration(self)} waiting for the GIL` : "";
  if (total > self) {
    const sum = `${formatDuration(total)} with descendants`;
    return own ? `${own}; ${sum}` : `GIL waits: ${sum}`;
  }
  if (own) return own;
  return self > 0 ? `GIL waits: ${formatDuration(self)} across its threads` : "";
}

/**
 * Lock waits beside a span's badge. "of which" (a part of its wall time) only for its own
 * waits that fit in its duration: its descendants' run on other threads too, and waits summed
 * over threads can exceed the span's duration, so those are given apart.
 */
function lockNote(durationNs, { self = 0, total = 0 }) {
  const own = self > 0 && self <= durationNs ? `of which ${formatDuration(self)} waiting on locks` : "";
  if (total > self) {
    const sum = `${formatDuration(total)} with descendants (all threads)`;
    return own ? `${own}; ${sum}` : `lock waits: ${sum}`;
  }
  if (own) return own;
  return self > 0 ? `lock waits: ${formatDuration(self)} across its threads` : "";
}

/**
 * The spans of /api/traces/{id}/spans as a tree, in display order (depth first, children by
 * start time).  A span whose parent is missing is shown as a root.
 */
export function buildTree(rawSpans) {
  const spans = rawSpans.map((s) => ({
    spanID: String(s.spanID).toLowerCase(),
    parentSpanID: String(s.parentSpanID || "").toLowerCase(),
    name: s.name,
    service: s.service,
    startNs: Number(s.startTimeUnixNano),
    durationNs: Number(s.durationNanos),
    self: Number(s.self || 0),
    total: Number(s.total || 0),
    children: [],
    depth: 0,
  }));
  const byId = new Map(spans.map((s) => [s.spanID, s]));
  const roots = [];
  for (const s of spans) {
    const parent = s.parentSpanID && s.parentSpanID !== s.spanID ? byId.get(s.parentSpanID) : null;
    if (parent) parent.children.push(s);
    else roots.push(s);
  }
  const byStart = (a, b) => a.startNs - b.startNs || a.spanID.localeCompare(b.spanID);
  roots.sort(byStart);
  // Loops, not Math.min(...spans): a trace of a hundred thousand spans would overflow the stack.
  let startNs = spans.length ? Infinity : 0;
  let endNs = spans.length ? -Infinity : 0;
  for (const s of spans) {
    startNs = Math.min(startNs, s.startNs);
    endNs = Math.max(endNs, s.startNs + s.durationNs);
  }
  const ordered = [];
  const seen = new Set();
  const walk = (root) => {
    const stack = [root];
    while (stack.length) {
      const s = stack.pop();
      if (seen.has(s)) continue; // back where a parent cycle started
      seen.add(s);
      ordered.push(s);
      s.offsetNs = s.startNs - startNs;
      s.activity = activityOf(s.durationNs, s.total);
      s.children.sort(byStart);
      for (let i = s.children.length - 1; i >= 0; i--) {
        s.children[i].depth = s.depth + 1;
        stack.push(s.children[i]);
      }
    }
  };
  for (const root of roots) walk(root);
  // Spans whose parents form a cycle (broken data) reach no root: the earliest of each cycle
  // is shown as a root, so that no span of the trace is left out.
  for (const s of ordered.length < spans.length ? [...spans].sort(byStart) : []) {
    if (seen.has(s)) continue;
    s.depth = 0;
    roots.push(s);
    walk(s);
  }
  return { spans: ordered, roots, startNs, durationNs: Math.max(endNs - startNs, 1) };
}

function ticks(durationNs) {
  return [0, 0.25, 0.5, 0.75, 1].map((f) => {
    const tick = el("span", { class: "hs-wf-tick" }, formatDuration(f * durationNs));
    tick.style.left = `${100 * f}%`;
    if (f === 1) tick.classList.add("hs-wf-tick-end");
    return tick;
  });
}

export class Waterfall {
  /** `onSelect(spanID)` runs when a row is clicked (or Enter on it). */
  constructor(container, tree, { onSelect }) {
    this.tree = tree;
    this.onSelect = onSelect;
    this.collapsed = new Set();
    this.rows = new Map();
    const head = el(
      "div",
      { class: "hs-wf-row hs-wf-head" },
      el("div", { class: "hs-wf-name" }, `Span (${tree.spans.length})`),
      el("div", { class: "hs-wf-track hs-wf-axis" }, ticks(tree.durationNs)),
      // Classed as their cells, so that the compact (phone) layout places both alike.
      el("div", { class: "hs-wf-num hs-wf-duration", title: "wall-clock time of the span" }, "Duration"),
      el(
        "div",
        { class: "hs-wf-num hs-wf-cpu-self", title: "CPU time of the span itself, without its children" },
        "CPU own",
      ),
      el("div", { class: "hs-wf-num hs-wf-cpu-total", title: "CPU time of the span and its descendants" }, "CPU total"),
      ...Object.values(EXTRA_KINDS).map((k) =>
        el("div", { class: `hs-wf-num ${k.cls}`, title: k.title, hidden: true }, k.head),
      ),
      el("div", { class: "hs-wf-activity", title: "CPU total against duration" }, "Activity"),
    );
    this.head = head;
    this.extras = {};
    this.body = el("div", { class: "hs-wf-rows", role: "tree" });
    for (const span of tree.spans) this.body.append(this.row(span));
    this.node = el("div", { class: "hs-waterfall" }, head, this.body);
    this.layout();
    this.body.addEventListener("keydown", (event) => this.key(event));
    container.replaceChildren(this.node);
  }

  row(span) {
    const total = this.tree.durationNs;
    const toggle = span.children.length
      ? el(
          "button",
          {
            type: "button",
            class: "hs-wf-toggle",
            "aria-label": "Collapse or expand",
            title: "collapse or expand its children",
            onclick: (event) => {
              event.stopPropagation();
              this.toggle(span.spanID);
            },
          },
          "▾",
        )
      : el("span", { class: "hs-wf-toggle hs-wf-leaf" });
    const name = el(
      "div",
      { class: "hs-wf-name", title: `${span.service}: ${span.name}` },
      toggle,
      el("span", { class: "hs-wf-swatch" }),
      el("span", { class: "hs-wf-service" }, span.service),
      " ",
      el("span", { class: "hs-wf-span-name" }, span.name),
      span.children.length ? el("span", { class: "hs-wf-count", hidden: true }, ` (+${countDescendants(span)})`) : null,
    );
    // Past MAX_INDENT levels the indent stops growing and the depth is written instead, so
    // that the names of a deep chain stay readable.
    name.style.paddingLeft = `calc(var(--hs-wf-indent) * ${Math.min(span.depth, MAX_INDENT)} + 4px)`;
    if (span.depth > MAX_INDENT) name.prepend(el("span", { class: "hs-wf-depth" }, `${span.depth}›`));
    const cpuShare = Math.min(span.durationNs > 0 ? span.total / span.durationNs : 0, 1);
    const cpu = el("div", { class: "hs-wf-cpu-bar" });
    cpu.style.width = `${100 * cpuShare}%`;
    const bar = el("div", { class: "hs-wf-bar" }, cpu);
    const left = (100 * span.offsetNs) / total;
    bar.style.left = `${left}%`;
    bar.style.width = `max(2px, ${(100 * span.durationNs) / total}%)`;
    // The duration beside the bar, where there is room (the Duration column has it anyway).
    const right = left + (100 * span.durationNs) / total;
    const label = el("span", { class: "hs-wf-bar-label" }, formatDuration(span.durationNs));
    if (right <= 82) {
      label.style.left = `calc(${right}% + 4px)`;
    } else if (left >= 18) {
      label.classList.add("hs-wf-label-left");
      label.style.right = `calc(${100 - left}% + 4px)`;
    } else {
      label.hidden = true;
    }
    const track = el("div", { class: "hs-wf-track" }, bar, label);
    track.title =
      `${span.name}: starts at +${formatDuration(span.offsetNs)}, lasts ${formatDuration(span.durationNs)}; ` +
      `CPU ${formatDuration(span.total)} with descendants (${Math.round(100 * span.activity.ratio)}% of its duration)`;
    const row = el(
      "div",
      {
        class: `hs-wf-row hs-wf-span hs-${span.activity.kind}`,
        role: "treeitem",
        tabindex: 0,
        "aria-level": span.depth + 1,
        "aria-expanded": span.children.length ? "true" : null,
        dataset: { spanId: span.spanID, depth: span.depth, name: span.name, activity: span.activity.kind },
        onclick: () => this.onSelect(span.spanID),
      },
      name,
      track,
      el("div", { class: "hs-wf-num hs-wf-duration" }, formatDuration(span.durationNs)),
      el("div", { class: "hs-wf-num hs-wf-cpu-self" }, formatDuration(span.self)),
      el("div", { class: "hs-wf-num hs-wf-cpu-total" }, formatDuration(span.total)),
      ...Object.values(EXTRA_KINDS).map((k) => el("div", { class: `hs-wf-num ${k.cls}`, hidden: true })),
      activityCell(span.activity),
    );
    row.style.setProperty("--hs-service", serviceColor(span.service));
    this.rows.set(span.spanID, { row, span });
    return row;
  }

  /**
   * Shows another profile type's value per span in its own column (`kind`: a key of
   * EXTRA_KINDS, "gil" or "cpuWait"; `values`: span id -> {self, total}), if any span holds
   * some. Lock, GIL and CPU waits also name the cause in the activity badges of spans that
   * were not on CPU.
   */
  /** Marks the spans whose status is an error (known once the trace's attributes arrive):
   * their swatch and bar in the error colour, and an "error" badge by the name. */
  markErrors() {
    for (const { row, span } of this.rows.values()) {
      const failed = isError(span.status);
      row.classList.toggle("hs-wf-error", failed);
      // The error colour where the service's would be: swatch, bar and its CPU part.
      row.style.setProperty("--hs-service", failed ? "var(--hs-error)" : serviceColor(span.service));
      const name = row.querySelector(".hs-wf-name");
      let badge = name.querySelector(".hs-wf-error-badge");
      if (failed && !badge) {
        badge = el("span", { class: "hs-wf-error-badge" }, "error");
        name.querySelector(".hs-wf-span-name").after(badge);
      }
      if (badge) badge.hidden = !failed;
      if (failed) badge.title = `status ERROR${span.status.message ? `: ${span.status.message}` : ""}`;
    }
  }

  setValues(kind, values) {
    const spec = EXTRA_KINDS[kind]; // none for GIL and CPU waits: no column
    if (!this.causes) this.causes = {}; // lock and GIL waits, which both name causes
    this.causes[kind] = values;
    const any = [...values.values()].some((v) => v.total > 0);
    if (spec) {
      this.extras[kind] = any;
      this.head.querySelector(`.${spec.cls}`).hidden = !any;
    }
    for (const { row, span } of this.rows.values()) {
      const v = values.get(span.spanID) || { self: 0, total: 0 };
      if (spec) {
        const cell = row.querySelector(`.${spec.cls}`);
        cell.hidden = !any;
        cell.textContent = v.total ? spec.format(v.total) : "–";
        cell.title = `${spec.head}: ${spec.format(v.self)} own, ${spec.format(v.total)} with descendants`;
      }
      if (kind === "locks" || kind === "gil" || kind === "cpuWait") {
        const of = (k) => (this.causes[k] && this.causes[k].get(span.spanID)) || NONE;
        span.activity = activityOf(span.durationNs, span.total, of("locks"), of("gil"), of("cpuWait"));
        row.className = row.className.replace(/\bhs-(computing|waiting|mixed|short)\b/, `hs-${span.activity.kind}`);
        row.dataset.activity = span.activity.kind;
        row.querySelector(".hs-wf-activity").replaceWith(activityCell(span.activity));
      }
    }
    this.layout();
  }

  layout() {
    const extra = Object.values(this.extras).filter(Boolean).length;
    this.node.style.setProperty(
      "--hs-wf-extra",
      Array(extra)
        .fill(`${EXTRA_WIDTH_PX - 8}px`)
        .join(" "),
    );
    // A variable, not min-width itself: the compact layout of phones (traces.css) needs none.
    this.node.style.setProperty("--hs-wf-min-width", `${MIN_WIDTH_PX + extra * EXTRA_WIDTH_PX}px`);
  }

  /** Marks `spanID` selected (or nothing, for ""), and scrolls it into view. */
  select(spanID) {
    for (const { row } of this.rows.values()) {
      row.classList.remove("hs-selected");
      row.removeAttribute("aria-selected");
    }
    const entry = this.rows.get(spanID);
    if (!entry) return;
    // Open the collapsed subtrees it is in.
    const byId = new Map(this.tree.spans.map((s) => [s.spanID, s]));
    for (let p = byId.get(entry.span.parentSpanID); p; p = byId.get(p.parentSpanID)) {
      if (this.collapsed.delete(p.spanID)) this.refresh();
    }
    entry.row.classList.add("hs-selected");
    entry.row.setAttribute("aria-selected", "true");
    if (entry.row.scrollIntoView) entry.row.scrollIntoView({ block: "nearest" });
  }

  toggle(spanID) {
    if (this.collapsed.has(spanID)) this.collapsed.delete(spanID);
    else this.collapsed.add(spanID);
    this.refresh();
  }

  refresh() {
    const hidden = new Set();
    for (const span of this.tree.spans) {
      const { row } = this.rows.get(span.spanID);
      const parentHidden = hidden.has(span.parentSpanID) || this.collapsed.has(span.parentSpanID);
      if (parentHidden && this.rows.has(span.parentSpanID)) hidden.add(span.spanID);
      row.hidden = hidden.has(span.spanID);
      const isCollapsed = this.collapsed.has(span.spanID);
      row.classList.toggle("hs-collapsed", isCollapsed);
      if (span.children.length) {
        row.setAttribute("aria-expanded", String(!isCollapsed));
        row.querySelector(".hs-wf-toggle").textContent = isCollapsed ? "▸" : "▾";
        row.querySelector(".hs-wf-count").hidden = !isCollapsed;
      }
    }
  }

  key(event) {
    const row = event.target.closest(".hs-wf-span");
    // A button in the row (collapse) handles its own keys.
    if (!row || event.target.closest("button")) return;
    const id = row.dataset.spanId;
    const visible = [...this.body.querySelectorAll(".hs-wf-span:not([hidden])")];
    const index = visible.indexOf(row);
    if (event.key === "Enter" || event.key === " ") this.onSelect(id);
    else if (event.key === "ArrowDown" && visible[index + 1]) visible[index + 1].focus();
    else if (event.key === "ArrowUp" && visible[index - 1]) visible[index - 1].focus();
    else if (event.key === "ArrowLeft" && !this.collapsed.has(id) && this.rows.get(id).span.children.length)
      this.toggle(id);
    else if (event.key === "ArrowRight" && this.collapsed.has(id)) this.toggle(id);
    else return;
    event.preventDefault();
  }

  destroy() {
    this.node.remove();
  }
}

function activityCell(activity) {
  return el(
    "div",
    { class: "hs-wf-activity", title: activity.title },
    el("span", { class: `hs-activity hs-activity-${activity.kind}` }, activity.label),
    activity.locks ? el("span", { class: "hs-wf-lock-note" }, activity.locks) : null,
  );
}

function countDescendants(span) {
  let n = 0;
  const stack = [...span.children];
  while (stack.length) {
    const s = stack.pop();
    n += 1;
    stack.push(...s.children);
  }
  return n;
}
