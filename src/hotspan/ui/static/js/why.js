// "Why is this span slow?" in the trace view: the span (with its descendants) against the
// baseline of its operation (spans of the same service and name over a window, those nearest
// the median duration), as /api/traces/{id}/why answers it: the verdict in a sentence, the
// functions ranked by extra time per request, and a diff flame graph baseline → span drawn by
// the same panel as the diff view.
//
// Its state lives in the trace view's URL (traces.js): why=1, whyWindow=<Go duration>,
// whyType=<profile type id> (when absent: the wall profile for a waiting span, else the
// answer's first, CPU).

import { ApiError, getJSON } from "./api.js";
import { el, message } from "./dom.js";
import { formatDuration, formatValue, unitOf } from "./format.js";
import { decodeFlamegraph } from "./flametree.js";
import { ProfilePanel } from "./panel.js";
import { typeLabel } from "./selection.js";

// The agent's GIL-held profile: the time threads waited, on the stacks that held the GIL.
const GIL_HELD = "gil_held:gil_held:nanoseconds:wall:nanoseconds";

export const DEFAULT_WINDOW = "24h";
// Go durations: the API parses the window as TraceQL durations are parsed (no "d").
export const WINDOWS = [
  ["1h", "last hour"],
  ["6h", "last 6 hours"],
  ["24h", "last 24 hours"],
  ["168h", "last 7 days"],
];

/** "CPU time" out of "CPU time · process_cpu / cpu (ns)": what a sentence names. */
function typeWords(profileType) {
  return typeLabel(profileType).split(" · ")[0];
}

/** A change with its sign: "+412 ms", "-3 ms", "0 ns". */
function signed(value, unit) {
  const n = Number(value) || 0;
  return `${n > 0 ? "+" : ""}${formatValue(n, unit)}`;
}

function share(fraction) {
  if (fraction === null || fraction === undefined || !Number.isFinite(Number(fraction))) return null;
  return Math.max(0, Math.min(1, Number(fraction)));
}

/**
 * The why panel for one span of one trace.  `spanId` "" asks about the trace's root span
 * (the API's default); `onState(changes)` is told the window and profile type the user picks,
 * for the URL.
 */
/** "Its 217 ms: CPU 100 ms · GIL wait 61 ms · CPU wait 5 ms · other (off CPU) 51 ms". */
function splitLine(split) {
  const parts = [
    ["CPU", "cpuNanos", "on CPU (its samples, its child spans' included)"],
    ["GIL wait", "gilWaitNanos", "runnable, waiting for the GIL while other threads held it"],
    ["CPU wait", "cpuWaitNanos", "runnable, waiting for a core"],
    ["other (off CPU)", "otherNanos", "the rest: asleep, in I/O, waiting for a lock or another service"],
  ];
  return el(
    "p",
    { class: "hs-why-split" },
    `Its ${formatDuration(split.durationNanos)}: `,
    ...parts.flatMap(([name, key, title], i) => [
      i ? " · " : "",
      el(
        "span",
        { class: "hs-why-split-part", dataset: { part: key }, title },
        `${name} ${formatDuration(split[key])}`,
      ),
    ]),
  );
}

export class WhyPanel {
  constructor(container, { traceId, spanId = "", window = DEFAULT_WINDOW, type = "", onState = () => {} }) {
    this.container = container;
    this.traceId = traceId;
    this.spanId = spanId;
    this.window = window || DEFAULT_WINDOW;
    this.type = type;
    this.onState = onState;
    this.answer = null;
    this.controller = null;
    this.panel = null;
    this.selected = "";

    this.windowSelect = el(
      "select",
      { class: "hs-why-window", "aria-label": "Baseline window" },
      WINDOWS.map(([value, label]) => el("option", { value }, label)),
    );
    if (!WINDOWS.some(([value]) => value === this.window)) {
      this.windowSelect.append(el("option", { value: this.window }, `last ${this.window}`));
    }
    this.windowSelect.value = this.window;
    this.windowSelect.addEventListener("change", () => {
      this.window = this.windowSelect.value;
      this.onState({ whyWindow: this.window === DEFAULT_WINDOW ? "" : this.window });
      this.load();
    });
    this.typeTabs = el("span", { class: "hs-why-types", role: "group", "aria-label": "Profile type" });
    this.head = el("div", { class: "hs-why-head" });
    this.facts = el("div", { class: "hs-why-facts-box" });
    this.ranking = el("div", { class: "hs-why-ranking" });
    this.graphTitle = el("h3", { class: "hs-why-subtitle" });
    this.graphNote = el(
      "p",
      { class: "hs-note hs-why-graph-note" },
      "The baseline is the mean per span of the spans compared; each side is drawn as a share of its own " +
        "total: red frames take a larger share in this span, green ones a smaller one. The ranking above " +
        "is in time per request.",
    );
    this.graphBox = el("div", { class: "hs-why-graph" });
    this.graphSection = el(
      "div",
      { class: "hs-why-graph-section", hidden: true },
      this.graphTitle,
      this.graphNote,
      this.graphBox,
    );
    this.node = el(
      "section",
      { class: "hs-why", "aria-label": "Why slow" },
      el(
        "div",
        { class: "hs-why-controls" },
        el("label", { class: "hs-why-window-label" }, "Baseline: same operation, ", this.windowSelect),
        this.typeTabs,
      ),
      this.head,
      this.facts,
      this.ranking,
      this.graphSection,
    );
    container.replaceChildren(this.node);
    this.load();
  }

  /** Asks about another span ("" = the root span) of the same trace. */
  setSpan(spanId) {
    if (spanId === this.spanId && (this.answer || this.controller)) return;
    this.spanId = spanId;
    this.load();
  }

  async load() {
    if (this.controller) this.controller.abort();
    const controller = new AbortController();
    this.controller = controller;
    this.answer = null;
    this.head.replaceChildren(el("p", { class: "hs-loading" }, "Comparing the span with others of its operation…"));
    this.facts.replaceChildren();
    this.ranking.replaceChildren();
    this.typeTabs.replaceChildren();
    this.graphSection.hidden = true;
    let answer;
    try {
      answer = await getJSON(
        `/api/traces/${this.traceId}/why`,
        { spanID: this.spanId || null, window: this.window === DEFAULT_WINDOW ? null : this.window },
        { signal: controller.signal },
      );
    } catch (err) {
      if (err.name === "AbortError" || controller.signal.aborted) return;
      this.head.replaceChildren(this.errorMessage(err));
      return;
    } finally {
      if (this.controller === controller) this.controller = null;
    }
    if (controller.signal.aborted) return;
    this.answer = answer;
    this.render();
  }

  errorMessage(err) {
    if (err instanceof ApiError && err.status === 404) {
      return message(
        "error",
        `Cannot compare: ${err.message}.`,
        "A span arrives a few seconds after it ends; pick another span in the waterfall, or reload.",
      );
    }
    if (err instanceof ApiError && err.status === 400) {
      return message("error", `Cannot compare: ${err.message}.`, "Pick another baseline window or span.");
    }
    return message(
      "error",
      `The comparison failed: ${err.message || err}`,
      (err instanceof ApiError && err.hint) || "reload the page; if it persists, see the server's log",
    );
  }

  render() {
    const a = this.answer;
    const profiles = a.profiles || [];
    let profile = profiles.find((p) => p.profileType === this.type);
    // Waiting rather than computing: the wall profile (where the agent sends one) shows where
    // the time went, the CPU profile only what little ran.
    if (!profile && a.verdict === "waiting") profile = profiles.find((p) => /^wall:/.test(p.profileType));
    if (!profile) profile = profiles[0] || null;
    this.renderHead(a);
    this.renderFacts(a);
    this.typeTabs.replaceChildren(
      ...(profiles.length > 1
        ? profiles.map((p) =>
            el(
              "button",
              {
                type: "button",
                class: `hs-why-type${p === profile ? " hs-active" : ""}`,
                "aria-pressed": String(p === profile),
                dataset: { type: p.profileType },
                title: typeLabel(p.profileType),
                onclick: () => {
                  this.type = p.profileType;
                  // Always kept: the default depends on the verdict (wall for a waiting span).
                  this.onState({ whyType: p.profileType });
                  this.render();
                },
              },
              typeWords(p.profileType),
            ),
          )
        : []),
    );
    if (!profile) {
      this.ranking.replaceChildren();
      this.graphSection.hidden = true;
      return;
    }
    this.renderRanking(a, profile);
    this.renderGraph(a, profile);
  }

  renderHead(a) {
    const verdict = a.verdict || "";
    const badge = el("span", { class: `hs-why-verdict hs-why-${verdict}` }, verdictLabel(verdict));
    const parts = [el("p", { class: "hs-why-summary" }, badge, " ", a.summary || "")];
    if (a.split) parts.push(splitLine(a.split));
    const gilNs = Number(a.split?.gilWaitNanos || 0);
    const coreNs = Number(a.split?.cpuWaitNanos || 0);
    if (verdict === "no-baseline") {
      parts.push(
        message(
          "info",
          `Nothing to compare with in the ${windowWords(this.window)}.`,
          'Pick a longer baseline window above, or press "Why slow?" again for the span\'s own profile.',
        ),
      );
    } else if (verdict === "no-profile") {
      parts.push(
        message(
          "info",
          "No CPU samples are linked to this span.",
          "Check that the service runs the hotspan agent with the OpenTelemetry SDK (its samples then carry " +
            "span ids); samples arrive with the agent's next upload (about 10 s).",
        ),
      );
    } else if (verdict === "pending") {
      parts.push(
        message(
          "info",
          "The span ended moments ago: its samples may not be uploaded yet.",
          'The agent uploads about every 10 s; ask again (press "Why slow?") in a few seconds.',
        ),
      );
    } else if (verdict === "too-short") {
      parts.push(
        el(
          "p",
          { class: "hs-note" },
          "At the agent's 100 samples a second, a span this short holds a sample or two: too few to tell " +
            "computing from waiting. The functions below are still what its samples hold.",
        ),
      );
    } else if (verdict === "gc") {
      parts.push(
        el(
          "p",
          { class: "hs-note" },
          "Python's garbage collector ran for most of its extra time. The [GC] frame in the flame graph is the " +
            "collector; the frames under it allocated the objects that set it off (its generation is the " +
            "gc_generation label). Fewer container objects kept alive, gc.freeze() after start-up, or " +
            "higher gc.set_threshold() values make collections rarer.",
        ),
      );
    } else if (verdict === "contended" && coreNs > 3 * gilNs) {
      parts.push(
        el(
          "p",
          { class: "hs-note hs-why-cores" },
          "It was runnable but had no core: more busy threads or processes than cores, or the container's CPU " +
            'quota spent. That time is its wall profile\'s thread_state="cpu_wait" samples.',
        ),
      );
    } else if (verdict === "contended") {
      const holders = a.gilHolders || [];
      const range = a.gilRange || {};
      const query = `{service_name="${String(a.service || "").replace(/["\\]/g, "\\$&")}"}`;
      const href = `/profiles?${new URLSearchParams({ profileType: GIL_HELD, query, from: String(range.start), until: String(range.end) })}`;
      parts.push(
        el(
          "p",
          { class: "hs-note hs-why-holders" },
          "It was runnable but waited for the GIL while other threads of the service held it. ",
          holders.length
            ? [
                "Held meanwhile most by ",
                ...holders
                  .slice(0, 3)
                  .flatMap((h, i) => [i ? ", " : "", el("code", {}, h.name), ` (${formatDuration(h.nanos)})`]),
                ": ",
                el("a", { href }, "their flame graph (GIL held while others wait)"),
                ".",
              ]
            : "Which code held it is not in the GIL-held profile for that time.",
        ),
      );
    } else if (verdict === "waiting") {
      const hasWall = (a.profiles || []).some((p) => /^wall:/.test(p.profileType));
      parts.push(
        el(
          "p",
          { class: "hs-note" },
          "Its CPU is well under its duration: the time went to waiting (I/O, sleep, locks, another service). ",
          hasWall
            ? "Its wall-clock profile (Wall time) shows where it waited."
            : "The CPU profile cannot say on what; a wall-clock or lock profile from the agent would.",
        ),
      );
    }
    this.head.replaceChildren(...parts);
  }

  renderFacts(a) {
    const b = a.baseline || {};
    const extra = Number(a.extraDurationNanos || 0);
    const items = [
      fact("Duration", formatDuration(a.durationNanos)),
      fact(
        "Baseline",
        b.spans
          ? `${b.spans} span${b.spans === 1 ? "" : "s"}, ${windowWords(this.window)}`
          : `none in the ${windowWords(this.window)}`,
      ),
      b.spans ? fact("Baseline median", formatDuration(b.medianDurationNanos)) : null,
      b.spans ? fact("Baseline mean", formatDuration(b.meanDurationNanos)) : null,
      b.spans ? fact("Extra duration", `${extra > 0 ? "+" : ""}${formatDuration(extra)}`) : null,
    ];
    this.facts.replaceChildren(el("dl", { class: "hs-span-facts hs-why-facts" }, items));
  }

  renderRanking(a, profile) {
    const unit = unitOf(profile.profileType);
    // The answer ranks every function the two sides hold; those that explain the difference
    // are the ones with extra self time of their own, not a rounding error of it (under 1% of
    // all the extra): the others would fill the table with "+0 ns" and "0%".
    const all = profile.functions || [];
    const positive = all.reduce((sum, f) => sum + Math.max(Number(f.self.extra) || 0, 0), 0);
    const functions = all.filter((f) => Number(f.self.extra) > 0 && Number(f.self.extra) >= 0.01 * positive);
    const left = all.length - functions.length;
    const words = typeWords(profile.profileType);
    const title = el(
      "h3",
      { class: "hs-why-subtitle" },
      `Functions that explain the difference · ${words}`,
      el(
        "span",
        { class: "hs-why-subnote" },
        ` this span ${formatValue(profile.spanValue, unit)}, baseline ${formatValue(profile.baselineMean, unit)} per span, ` +
          `${signed(profile.extra, unit)}`,
      ),
    );
    if (!functions.length) {
      this.ranking.replaceChildren(
        title,
        message("empty", `No function holds more ${words} in this span than in the baseline.`),
      );
      return;
    }
    const timeType = functions.some((f) => f.shareOfExtraDuration !== null && f.shareOfExtraDuration !== undefined);
    const body = el(
      "tbody",
      {},
      functions.map((f, i) => {
        const s = share(f.shareOfExtraDuration);
        const bar = el("span", { class: "hs-why-share-bar" });
        bar.style.width = `${100 * (s || 0)}%`;
        const row = el(
          "tr",
          {
            class: "hs-why-row",
            tabindex: 0,
            title: "Highlight it in the diff flame graph",
            dataset: { name: f.name },
            onclick: () => this.pick(f.name),
            onkeydown: (event) => {
              if (event.key === "Enter" || event.key === " ") {
                event.preventDefault();
                this.pick(f.name);
              }
            },
          },
          el("td", { class: "hs-why-rank" }, String(i + 1)),
          el("td", { class: "hs-why-fn", title: f.name }, breakable(f.name)),
          el("td", { class: "hs-why-num hs-why-extra" }, signed(f.self.extra, unit)),
          el(
            "td",
            { class: "hs-why-num hs-why-self" },
            formatValue(f.self.span, unit),
            el("span", { class: "hs-muted" }, ` vs ${formatValue(f.self.baseline, unit)}`),
          ),
          el("td", { class: "hs-why-num hs-why-total" }, signed(f.total.extra, unit)),
          timeType
            ? el(
                "td",
                { class: "hs-why-share" },
                s === null
                  ? "–"
                  : el(
                      "span",
                      { class: "hs-why-share-cell" },
                      el("span", { class: "hs-why-share-track" }, bar),
                      `${Math.round(100 * s)}%`,
                    ),
              )
            : null,
        );
        return row;
      }),
    );
    const head = el(
      "tr",
      {},
      el("th", {}, "#"),
      el("th", {}, "Function"),
      el(
        "th",
        { class: "hs-why-num", title: "its own time in this span minus the baseline's mean per span" },
        "Extra self",
      ),
      el(
        "th",
        { class: "hs-why-num hs-why-self", title: "its own time: this span vs the baseline's mean per span" },
        "Self: span vs baseline",
      ),
      el(
        "th",
        { class: "hs-why-num hs-why-total", title: "with what it called: this span minus the baseline's mean" },
        "Extra total",
      ),
      timeType
        ? el(
            "th",
            { class: "hs-why-share", title: "the part of the span's extra duration its extra self time accounts for" },
            "Share of extra duration",
          )
        : null,
    );
    this.ranking.replaceChildren(
      title,
      el(
        "div",
        { class: "hs-table-scroll" },
        el("table", { class: "hs-table hs-why-table" }, el("thead", {}, head), body),
      ),
      left
        ? el(
            "p",
            { class: "hs-note hs-why-left-out" },
            `${left} more function${left === 1 ? "" : "s"} of the span took no more ${words} than the baseline's (or under 1% of the extra): not listed.`,
          )
        : null,
    );
    this.markSelected();
  }

  renderGraph(a, profile) {
    const fg = profile.flamegraph || {};
    const unit = unitOf(profile.profileType);
    const b = a.baseline || {};
    this.graphSection.hidden = false;
    this.graphTitle.textContent = `Diff flame graph · ${typeWords(profile.profileType)}: baseline → this span`;
    if (!this.panel) {
      this.panel = new ProfilePanel(this.graphBox, { unit, title: "", exportName: `why-${this.traceId.slice(0, 16)}` });
    }
    // The answer is a FlameGraph whose nodes carry both sides: the span is the right one.
    const tree = decodeFlamegraph(fg);
    if (!(tree.diff ? tree.rightTotal : tree.total)) {
      this.panel.setMessage(
        message(
          "empty",
          `This span holds no ${typeWords(profile.profileType)} samples.`,
          a.verdict === "waiting" ? "It was waiting, not computing: look at a wall-clock profile." : null,
        ),
      );
      return;
    }
    const baseline = b.spans ? `mean of ${b.spans} span${b.spans === 1 ? "" : "s"}` : "no baseline";
    this.panel.setData(fg, { unit, title: `baseline (${baseline}) → ${a.name}` });
    if (this.selected) this.panel.graph.highlight(this.selected);
  }

  /** A ranked function, highlighted in the graph (again: no highlight). */
  pick(name) {
    this.selected = this.selected === name ? "" : name;
    if (this.panel && this.panel.tree) this.panel.graph.highlight(this.selected || null);
    this.markSelected();
  }

  markSelected() {
    for (const row of this.ranking.querySelectorAll(".hs-why-row")) {
      const on = row.dataset.name === this.selected;
      row.classList.toggle("hs-selected", on);
      row.setAttribute("aria-selected", String(on));
    }
  }

  destroy() {
    if (this.controller) this.controller.abort();
    if (this.panel) this.panel.destroy();
    this.node.remove();
  }
}

function verdictLabel(verdict) {
  return (
    {
      gc: "garbage collection",
      contended: "contended",
      computing: "computing",
      waiting: "waiting",
      "too-short": "too short",
      pending: "pending",
      "no-profile": "no profile",
      "no-baseline": "no baseline",
    }[verdict] ||
    verdict ||
    "?"
  );
}

function windowWords(window) {
  const known = WINDOWS.find(([value]) => value === window);
  return known ? known[1] : `last ${window}`;
}

/** A qualified name that wraps after its dots and slashes (`pkg.module.function`) on a
 * narrow screen, rather than anywhere in a word. */
function breakable(name) {
  const parts = String(name).split(/(?<=[./:])/);
  const out = [];
  parts.forEach((part, i) => {
    if (i) out.push(el("wbr"));
    out.push(part);
  });
  return out;
}

function fact(term, value) {
  return el("div", { class: "hs-fact" }, el("dt", {}, term), el("dd", {}, value));
}
