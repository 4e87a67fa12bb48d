// One side of the diff view: a label selector and a time range with its own timeline, or a
// trace (and one of its spans), with what it is in words and a link back to the trace.

import { getBytes, querierBinary, selectMergeProfileRequest } from "./api.js";
import { checkIds, describeSubject, loadSubject, shortId, traceHref } from "./diffsubject.js";
import { el, message, rejectInput } from "./dom.js";
import { LabelFilters } from "./filters.js";
import { unitOf } from "./format.js";
import { formatSelector, parseSelector, serviceOf } from "./labels.js";
import { selectSeries, typeLabel } from "./selection.js";
import { Timeline, stepFor } from "./timeline.js";
import { absoluteRange, describeRange, resolveRange, TimeRangePicker } from "./timerange.js";

/** The selector of a trace side that takes every sample of the trace, whatever service. */
export const ALL = "{}";

/** "CPU time" out of "CPU time · process_cpu / cpu (ns)": what a sentence names. */
export function typeWords(profileType) {
  return typeLabel(profileType).split(" · ")[0];
}

function capitalise(text) {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** One side of a comparison: a selector and a time range, or a trace or span, with its own form. */
export class DiffSide {
  constructor(container, { title, role, className, query, from, until, traceId, spanId, rangeGiven, onChange }) {
    this.title = title;
    this.role = role; // "baseline" / "comparison", as sentences name the side
    this.query = query;
    this.from = from;
    this.until = until;
    this.onChange = onChange;
    this.traceId = "";
    this.spanId = "";
    this.idError = "";
    this.subject = null; // what loadSubject found for the trace side
    this.rangeGiven = rangeGiven;
    this.rangeFromTrace = false; // the range is the trace's window, not one the user gave
    this.failed = false;
    if (traceId || spanId) {
      try {
        ({ traceId: this.traceId, spanId: this.spanId } = checkIds(traceId, spanId));
      } catch (err) {
        this.idError = err.message;
      }
    }
    this.input = el("input", { class: "hs-diff-query", "aria-label": `${title} selector` });
    this.showQuery();
    const form = el(
      "form",
      {
        class: "hs-diff-form",
        onsubmit: (event) => {
          event.preventDefault();
          try {
            parseSelector(this.input.value);
          } catch (err) {
            rejectInput(this.input, err.message);
            return;
          }
          this.query = this.typedQuery();
          this.renderFilters();
          this.onChange();
        },
      },
      this.input,
      el("button", { type: "submit" }, "Apply"),
    );
    this.subjectSlot = el("div", { class: "hs-diff-subject" });
    this.filterSlot = el("div", { class: "hs-diff-filters" });
    this.note = el("div", { class: "hs-diff-side-note" });
    const rangeSlot = el("div", {});
    this.timelineSlot = el("div", { class: "hs-diff-timeline" });
    // On a trace side the form narrows the trace's samples and the range is the trace's: the
    // captions say so, else they read as a service's "{}" and "Last 1 hour" unrelated to it.
    this.queryCaption = el(
      "p",
      { class: "hs-diff-caption hs-muted" },
      "Narrow the trace's samples by labels (optional):",
    );
    this.rangeCaption = el("p", { class: "hs-diff-caption hs-muted" });
    this.controls = el(
      "div",
      { class: "hs-diff-controls" },
      this.queryCaption,
      form,
      this.filterSlot,
      this.rangeCaption,
      rangeSlot,
    );
    container.append(
      el(
        "section",
        { class: `hs-diff-side ${className}`, "aria-label": title },
        el("h2", {}, title),
        this.subjectSlot,
        this.note,
        this.controls,
        this.timelineSlot,
      ),
    );
    this.picker = new TimeRangePicker(rangeSlot, {
      from,
      until,
      onChange: (f, u) => {
        this.from = f;
        this.until = u;
        this.takeTypedSelector();
        this.onChange();
      },
    });
    this.renderFilters();
    this.timeline = new Timeline(this.timelineSlot, {
      unit: "",
      onSelect: (startMs, endMs) => {
        const r = absoluteRange(startMs, endMs);
        this.from = r.from;
        this.until = r.until;
        this.picker.set(r.from, r.until);
        this.takeTypedSelector();
        this.onChange();
      },
    });
    this.renderSubject();
  }

  get isTrace() {
    return Boolean(this.traceId || this.idError);
  }

  /** A trace side's "{}" (every sample of the trace) shows as an empty field, not as a selector. */
  showQuery() {
    this.input.value = this.query === ALL ? "" : this.query;
    this.input.placeholder = this.isTrace ? 'all of it, or e.g. {service_name="shop"}' : '{service_name="..."}';
  }

  /** The field's selector; empty on a trace side is the whole trace. */
  typedQuery() {
    return this.input.value.trim() || (this.isTrace ? ALL : "");
  }

  /** Label filters picked from the names and values the server knows, like the explorer's. */
  renderFilters() {
    let matchers;
    try {
      matchers = parseSelector(this.query);
    } catch {
      this.filterSlot.replaceChildren();
      return;
    }
    this.filterSlot.replaceChildren();
    new LabelFilters(this.filterSlot, {
      matchers,
      range: () => this.range(),
      onChange: (next) => {
        this.query = formatSelector(next);
        this.showQuery();
        this.onChange();
      },
    });
  }

  /** What a trace side compares, with the way back to the trace and out of it. */
  renderSubject(profileType = "") {
    // SelectSeries has no trace filter: a service's timeline beside one trace's samples
    // would show something else than the flame graph compares.
    this.timelineSlot.hidden = this.isTrace;
    this.queryCaption.hidden = this.rangeCaption.hidden = !this.isTrace;
    this.rangeCaption.textContent =
      this.subject && this.subject.window && this.rangeFromTrace
        ? "The trace's time range (its spans, an hour either side):"
        : "Where to look for the trace's samples:";
    this.showQuery();
    if (!this.isTrace) {
      this.subjectSlot.replaceChildren();
      return;
    }
    const leave = el(
      "button",
      {
        type: "button",
        class: "hs-link hs-diff-leave-trace",
        title: "Compare a label selector and time range on this side instead",
        onclick: () => this.leaveTrace(),
      },
      "Compare a selector instead",
    );
    if (this.idError) {
      // The note above the form says what is wrong, once.
      this.subjectSlot.replaceChildren(el("p", { class: "hs-diff-subject-text" }, leave));
      return;
    }
    const subject = this.subject || { traceId: this.traceId, spanId: this.spanId, span: null, name: "" };
    const parts = [
      el(
        "a",
        { class: "hs-diff-trace-link", href: traceHref(subject, profileType), title: `Open trace ${subject.traceId}` },
        describeSubject(subject),
      ),
    ];
    if (this.subject && subject.spanId) {
      const below = subject.spanIds.length - 1;
      parts.push(below > 0 ? `, with its ${below} descendant span${below === 1 ? "" : "s"}` : "");
      if (!subject.stored) parts.push(" (the trace's spans are not stored: the span's own samples only)");
    }
    this.subjectSlot.replaceChildren(el("p", { class: "hs-diff-subject-text" }, ...parts, " "), leave);
  }

  leaveTrace() {
    const service = this.subject && this.subject.service;
    this.traceId = this.spanId = this.idError = "";
    this.subject = null;
    if (!this.query || this.query === ALL) {
      this.query = service ? formatSelector([{ name: "service_name", op: "=", value: service }]) : "";
      this.renderFilters();
    }
    this.fail(null);
    this.renderSubject();
    this.onChange();
  }

  /** For a trace side: its spans, once per trace and span, and its range if none was given. */
  async resolve(signal) {
    if (this.idError) throw new Error(this.idError);
    if (!this.traceId) return;
    const s = this.subject;
    if (!s || s.traceId !== this.traceId || s.spanId !== this.spanId) {
      this.subject = await loadSubject({ traceId: this.traceId, spanId: this.spanId }, signal);
    }
    // Without its spans or a range there is no telling where its samples are: "Last 1 hour"
    // would be a guess, and its emptiness would not say that the trace is unknown here.
    if (!this.subject.stored && !this.rangeGiven) {
      throw new Error(`trace ${shortId(this.traceId)} was not found on this server`);
    }
    if (!this.rangeGiven && this.subject.window) {
      this.rangeFromTrace = true;
      const r = absoluteRange(this.subject.window.startMs, this.subject.window.endMs);
      this.from = r.from;
      this.until = r.until;
      this.picker.set(r.from, r.until);
    }
    this.rangeGiven = true;
  }

  /** A selector typed but not applied still counts when the range is applied. */
  takeTypedSelector() {
    const typed = this.typedQuery();
    if (typed === this.query) return;
    try {
      parseSelector(typed);
    } catch {
      // Not a selector: the field goes back to the one in use, so that both agree.
      this.showQuery();
      this.input.setCustomValidity("");
      return;
    }
    this.query = typed;
    this.renderFilters();
  }

  range() {
    try {
      return resolveRange(this.from, this.until);
    } catch (err) {
      throw new Error(`${this.title}: ${err.message}`, { cause: err });
    }
  }

  /** The service whose profile types the picker offers. */
  service() {
    if (this.subject && this.subject.service) return this.subject.service;
    try {
      return serviceOf(parseSelector(this.query)) || "";
    } catch {
      return "";
    }
  }

  /** What this side is, in a sentence: the span or trace, or the selector. */
  describe() {
    if (this.traceId) return describeSubject(this.subject || { traceId: this.traceId, spanId: this.spanId });
    return this.query;
  }

  request(profileType) {
    const { startMs, endMs } = this.range();
    const out = { profileTypeID: profileType, labelSelector: this.query || ALL, start: startMs, end: endMs };
    if (this.traceId) out.traceIdSelector = [this.traceId];
    if (this.subject && this.subject.spanIds.length) out.spanSelector = this.subject.spanIds;
    return out;
  }

  /** Says on the side itself what is wrong with it ("" clears). */
  setNote(node) {
    this.note.replaceChildren(...(node ? [node] : []));
  }

  /**
   * A side that cannot be compared says why, on itself and only there; its form and range are
   * put away, as they cannot mend a wrong id (the subject offers a selector instead).  null
   * clears.
   */
  fail(err) {
    this.failed = Boolean(err);
    this.setNote(err ? message("error", `${capitalise(err.message)}.`) : null);
    this.controls.hidden = this.failed;
  }

  emptyText(profileType) {
    return (
      `The ${this.role} (${this.describe()}) has no ${typeWords(profileType)} samples in ` +
      `${describeRange(this.from, this.until).replace(/^Last/, "the last")}`
    );
  }

  emptyHint() {
    if (this.traceId && this.spanId) {
      return (
        "A span has samples only if it ran on CPU long enough to be sampled and its agent " +
        "has uploaded them: pick a longer span or the whole trace, or another profile type."
      );
    }
    if (this.traceId) return "Its agent may not have uploaded them yet, or it sends another profile type.";
    return `Widen the ${this.role}'s time range or change its selector; each side needs samples to compare.`;
  }

  async loadTimeline(profileType, signal) {
    if (this.isTrace) return;
    const { startMs, endMs } = this.range();
    const stepMs = stepFor(startMs, endMs, 120);
    this.timeline.unit = unitOf(profileType);
    try {
      const series = await selectSeries({ profileType, selector: this.query, startMs, endMs, stepMs }, signal);
      if (signal.aborted) return;
      this.timeline.setData(series, startMs, endMs, stepMs);
    } catch (err) {
      if (err.name !== "AbortError") this.timeline.setMessage(err.message);
    }
  }

  /** The side's samples as a pprof file: the span profile for a span, else SelectMergeProfile. */
  exportItem(profileType) {
    const { startMs, endMs } = this.range();
    const label = `pprof (${this.role})`;
    const filename = `${this.role}.pb`;
    if (this.traceId && this.spanId) {
      return {
        label,
        filename,
        fetch: () =>
          getBytes(`/api/traces/${this.traceId}/profile`, {
            spanID: this.spanId,
            descendants: "true",
            format: "pprof",
            profileType,
            labelSelector: this.query && this.query !== ALL ? this.query : null,
            start: Math.floor(startMs / 1000),
            end: Math.ceil(endMs / 1000),
          }),
      };
    }
    return {
      label,
      filename,
      fetch: async () =>
        querierBinary(
          "SelectMergeProfile",
          selectMergeProfileRequest({
            profileTypeID: profileType,
            labelSelector: this.query || ALL,
            start: startMs,
            end: endMs,
            traceIds: this.traceId ? [this.traceId] : [],
          }),
        ),
    };
  }
}
