// Alerts (`/alerts`): the tenant's alert rules with their state (inactive, pending, firing),
// the value of their last evaluation, its error and the history of their transitions; a form
// that puts a rule (one section per condition kind, or the rule as JSON) and Delete.
// Everything goes through the alerts API (/api/v1/alerts, /api/v1/alerts/rules/<name>).
//
// The checks on rules are the server's (hotspan.alerts): this view sends what the person typed,
// as typed, and shows the server's reason when it refuses.

import { CPU, getJSON, sendJSON } from "./api.js";
import { el, message, rejectInput } from "./dom.js";
import { formatTime } from "./format.js";
import { catalogue, errorBox, suggestSelectors, typeLabel } from "./selection.js";

const ALERTS_API = "/api/v1/alerts";
const RULES_API = "/api/v1/alerts/rules";
const REFRESH_MS = 5000;
const STATES = ["firing", "pending", "inactive"];

// Each condition kind's fields, in the form's order.  `number` fields go to the server as
// numbers when they read as one, else as typed, so that its reason names what was wrong.
const KINDS = {
  function_share: {
    label: "A function's share of the profile above a threshold",
    fields: [
      { name: "function", label: "Function (regex)", placeholder: "^app\\.slow_", mono: true },
      { name: "above", label: "Above", unit: "% of the profile", number: true, placeholder: "20" },
      { name: "window", label: "Window", placeholder: "5m" },
    ],
  },
  per_request: {
    label: "CPU per request up against a day earlier or another version",
    fields: [
      { name: "increase", label: "Increase", unit: "%", number: true, placeholder: "30" },
      { name: "window", label: "Window", placeholder: "10m" },
    ],
    against: true,
  },
  share_growth: {
    label: "A function's share grown between two label values (a deploy regression)",
    fields: [
      { name: "function", label: "Function (regex)", placeholder: "^app\\.slow_", mono: true },
      { name: "points", label: "Grown by", unit: "percentage points", number: true, placeholder: "5" },
      { name: "window", label: "Window", placeholder: "1h" },
      { name: "label", label: "Label", placeholder: "version" },
      { name: "baseline", label: "Baseline value", placeholder: "1.2" },
      { name: "comparison", label: "Comparison value", placeholder: "1.3" },
    ],
  },
  gil_wait_share: {
    label: "Threads waiting for the GIL more than a share of the time they want to run",
    fields: [
      {
        name: "above",
        label: "Above",
        unit: "% of their time running or waiting for the GIL",
        number: true,
        placeholder: "20",
      },
      { name: "window", label: "Window", placeholder: "5m" },
    ],
  },
};

const AGAINST_FIELDS = [
  { name: "offset", label: "Offset", placeholder: "24h", mode: "offset" },
  { name: "label", label: "Label", placeholder: "version", mode: "label" },
  { name: "baseline", label: "Baseline value", placeholder: "1.2", mode: "label" },
  { name: "comparison", label: "Comparison value", placeholder: "1.3", mode: "label" },
];

export function alertsPath(name) {
  return name ? `/alerts?rule=${encodeURIComponent(name)}` : "/alerts";
}

function ruleApi(name) {
  return `${RULES_API}/${encodeURIComponent(name)}`;
}

// --- reading the API's answers ---------------------------------------------------------------

/** A time from the API (unix seconds or nanoseconds, RFC 3339 text) in ms, or null. */
function toMs(value) {
  if (value === null || value === undefined || value === "") return null;
  if (typeof value === "string" && !/^-?\d+(\.\d+)?$/.test(value)) {
    const parsed = Date.parse(value);
    return Number.isNaN(parsed) ? null : parsed;
  }
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) return null;
  if (n > 1e17) return n / 1e6; // nanoseconds
  if (n > 1e14) return n / 1e3; // microseconds
  if (n > 1e11) return n; // milliseconds
  return n * 1e3; // seconds
}

function ago(ms) {
  const seconds = Math.max(0, (Date.now() - ms) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 129600) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

const dash = () => el("span", { class: "hs-muted" }, "–");

function timeCell(value) {
  const ms = toMs(value);
  if (ms === null) return dash();
  return el("time", { datetime: new Date(ms).toISOString(), title: formatTime(ms) }, ago(ms));
}

function number(x, digits = 2) {
  return String(Number(Number(x).toFixed(digits)));
}

/** The value of an evaluation in the condition's own unit. */
function valueText(value, condition) {
  if (value === null || value === undefined || value === "") return "";
  const n = Number(value);
  if (!Number.isFinite(n)) return String(value);
  const kind = condition && condition.kind;
  if (kind === "share_growth") return `${n >= 0 ? "+" : ""}${number(n)} pp`;
  if (kind === "per_request") return `${n >= 0 ? "+" : ""}${number(n)}%`;
  return `${number(n)}%`;
}

function stateOf(item) {
  const state = String((item && item.state) || "inactive").toLowerCase();
  return STATES.includes(state) ? state : state || "inactive";
}

/**
 * One entry of GET /api/v1/alerts (see hotspan.server.alerts): the rule, its state and the
 * evaluator's record, with the defaults of a rule not evaluated yet.
 */
function normalise(item) {
  const rule = item.rule && typeof item.rule === "object" ? item.rule : {};
  return {
    ...item,
    rule,
    name: String(item.name ?? rule.name ?? ""),
    state: stateOf(item),
    history: Array.isArray(item.history) ? item.history : [],
    webhooks: Array.isArray(item.webhooks) ? item.webhooks : [],
  };
}

function localLink(url) {
  // The generator URL names the server's external address; opened here, it stays in this UI.
  try {
    const parsed = new URL(url, location.href);
    return parsed.pathname.startsWith("/diff") ? parsed.pathname + parsed.search : parsed.href;
  } catch {
    return null;
  }
}

/** The condition in words, e.g. `share of /^app\.slow/ above 20% over 5m`. */
function conditionText(condition) {
  const c = condition || {};
  const fn = c.function ? `/${c.function}/` : "(function)";
  const over = c.window ? ` over ${c.window}` : "";
  if (c.kind === "function_share") return `share of ${fn} above ${c.above ?? "?"}%${over}`;
  if (c.kind === "share_growth") {
    return (
      `share of ${fn} grown more than ${c.points ?? "?"} points${over}, ` +
      `${c.label || "?"}="${c.baseline ?? "?"}" → "${c.comparison ?? "?"}"`
    );
  }
  if (c.kind === "per_request") {
    const a = c.against || {};
    const against = a.label
      ? `${a.label}="${a.baseline ?? "?"}" → "${a.comparison ?? "?"}"`
      : `${a.offset || "24h"} earlier`;
    return `CPU per request up more than ${c.increase ?? "?"}%${over}, against ${against}`;
  }
  if (c.kind === "gil_wait_share") return `GIL wait above ${c.above ?? "?"}% of running or waiting${over}`;
  return JSON.stringify(c);
}

// --- the form --------------------------------------------------------------------------------

// Labels and annotations as lines of `key=value`.  What a line cannot hold as it is (a line
// break, "=" in a key, a backslash) is written `\n`, `\=`, `\\` (and `\r`), so that a rule
// the API stored with such text comes back from the form unchanged.
const PAIR_ESCAPES = { n: "\n", r: "\r", "=": "=", "\\": "\\" };

/** Lines of `key=value` as an object; an unreadable line throws with its text. */
function parsePairs(text, what) {
  const out = Object.create(null); // a key "__proto__" is a key like any other
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line) continue;
    const at = unescapedEquals(line);
    if (at <= 0) throw new Error(`${what}: "${line}" is not key=value`);
    out[unescapePair(line.slice(0, at).trim())] = unescapePair(line.slice(at + 1).trim());
  }
  return { ...out };
}

function unescapedEquals(line) {
  for (let i = 0; i < line.length; i++) {
    if (line[i] === "\\") i++;
    else if (line[i] === "=") return i;
  }
  return -1;
}

function unescapePair(text) {
  return text.replace(/\\([nr=\\])/g, (_, c) => PAIR_ESCAPES[c]);
}

function escapePair(text, isKey) {
  const out = String(text).replace(/[\\\n\r]/g, (c) => (c === "\n" ? "\\n" : c === "\r" ? "\\r" : "\\\\"));
  return isKey ? out.replace(/=/g, "\\=") : out;
}

function pairsText(object) {
  return Object.entries(object || {})
    .map(([k, v]) => `${escapePair(k, true)}=${escapePair(v, false)}`)
    .join("\n");
}

function typed(text, isNumber) {
  if (!isNumber) return text;
  const n = Number(text);
  return text !== "" && Number.isFinite(n) ? n : text;
}

function field(spec, input) {
  return el(
    "label",
    { class: `hs-alert-field hs-alert-field-${spec.name}` },
    el("span", { class: "hs-alert-field-label" }, spec.label),
    input,
    spec.unit ? el("span", { class: "hs-muted" }, spec.unit) : null,
  );
}

function textInput(name, { placeholder = "", mono = false, size = 12, numeric = false } = {}) {
  return el("input", {
    name,
    placeholder,
    size,
    autocomplete: "off",
    spellcheck: "false",
    inputmode: numeric ? "decimal" : null,
    class: mono ? "hs-mono" : null,
  });
}

class RuleForm {
  constructor({ onSaved }) {
    this.onSaved = onSaved;
    this.mode = "form";
    this.types = el("datalist", { id: "hs-alert-types" });
    this.selectors = el("datalist", { id: "hs-alert-selectors" });
    this.name = textInput("name", { placeholder: "checkout-slow-path", size: 24 });
    this.name.required = true;
    this.selector = textInput("selector", { placeholder: '{service_name="checkout"}', mono: true, size: 36 });
    // Offered as one types: the services and labels of the last day.
    this.selector.setAttribute("list", "hs-alert-selectors");
    this.profileType = el("input", {
      name: "profileType",
      list: "hs-alert-types",
      placeholder: CPU,
      size: 40,
      autocomplete: "off",
      class: "hs-mono",
    });
    this.for = textInput("for", { placeholder: "0s", size: 6 });
    this.kind = el(
      "select",
      { name: "kind", class: "hs-alert-kind", onchange: () => this.showKind() },
      Object.entries(KINDS).map(([kind, spec]) => el("option", { value: kind }, spec.label)),
    );
    this.kindInputs = {};
    this.kindSections = {};
    for (const [kind, spec] of Object.entries(KINDS)) {
      const inputs = {};
      const fields = spec.fields.map((f) => {
        inputs[f.name] = textInput(f.name, {
          placeholder: f.placeholder,
          mono: f.mono,
          numeric: f.number,
          size: f.mono ? 24 : 10,
        });
        return field(f, inputs[f.name]);
      });
      let against = null;
      if (spec.against) against = this.buildAgainst(inputs);
      this.kindInputs[kind] = inputs;
      this.kindSections[kind] = el("div", { class: "hs-alert-kind-fields", dataset: { kind } }, fields, against);
    }
    this.labels = el("textarea", { name: "labels", rows: 2, placeholder: "severity=page", spellcheck: "false" });
    this.annotations = el("textarea", {
      name: "annotations",
      rows: 2,
      placeholder: "summary=checkout got slower",
      spellcheck: "false",
    });
    this.webhooks = el("textarea", {
      name: "webhooks",
      rows: 2,
      placeholder: "http://alertmanager:9093/api/v2/alerts",
      spellcheck: "false",
    });
    this.json = el("textarea", {
      name: "json",
      class: "hs-alert-json hs-mono",
      rows: 16,
      spellcheck: "false",
      "aria-label": "The rule as JSON",
    });

    this.fieldsBox = el(
      "div",
      { class: "hs-alert-form-fields" },
      el(
        "div",
        { class: "hs-alert-row" },
        field({ name: "name", label: "Name" }, this.name),
        field({ name: "selector", label: "Selector" }, this.selector),
      ),
      el(
        "div",
        { class: "hs-alert-row" },
        field({ name: "profileType", label: "Profile type" }, this.profileType),
        field({ name: "for", label: "For", unit: "pending this long before firing" }, this.for),
      ),
      el("div", { class: "hs-alert-row" }, field({ name: "kind", label: "Condition" }, this.kind)),
      Object.values(this.kindSections),
      el(
        "div",
        { class: "hs-alert-row hs-alert-row-text" },
        field({ name: "labels", label: "Labels", unit: "key=value, one a line" }, this.labels),
        field({ name: "annotations", label: "Annotations", unit: "key=value, one a line" }, this.annotations),
        field(
          { name: "webhooks", label: "Webhooks", unit: "Alertmanager-format receivers, one URL a line" },
          this.webhooks,
        ),
      ),
      el(
        "p",
        { class: "hs-muted hs-alert-form-note" },
        "Empty fields are left out of the rule, for the server's defaults. A rule with the name of another replaces it.",
      ),
    );
    this.jsonBox = el(
      "div",
      { class: "hs-alert-json-box", hidden: true },
      el("p", { class: "hs-muted" }, "The rule exactly as the API takes it (PUT /api/v1/alerts/rules/<name>)."),
      this.json,
    );
    this.modeButton = el(
      "button",
      { type: "button", class: "hs-alert-mode", onclick: () => this.toggleMode() },
      "Edit as JSON",
    );
    this.result = el("div", { class: "hs-alert-result", "aria-live": "polite" });
    this.form = el(
      "form",
      { class: "hs-alert-form", novalidate: true, onsubmit: (e) => this.save(e) },
      this.types,
      this.selectors,
      this.fieldsBox,
      this.jsonBox,
      el(
        "div",
        { class: "hs-alert-buttons" },
        el("button", { type: "submit", class: "hs-primary hs-alert-save" }, "Save rule"),
        el(
          "button",
          {
            type: "button",
            class: "hs-alert-preview-button",
            title: "Its value over the last 3 hours, as the server would have measured it",
            onclick: () => this.preview(),
          },
          "Preview",
        ),
        el("button", { type: "button", class: "hs-alert-clear", onclick: () => this.fill(null) }, "Clear"),
        this.modeButton,
      ),
      this.result,
    );
    this.section = el(
      "section",
      { class: "hs-alerts-section hs-alert-editor" },
      el("h2", {}, "Add or replace a rule"),
      this.form,
    );
    this.showKind();
  }

  buildAgainst(inputs) {
    this.againstMode = el(
      "select",
      { name: "against", class: "hs-alert-against", onchange: () => this.showAgainst() },
      el("option", { value: "offset" }, "the same window earlier"),
      el("option", { value: "label" }, "another label value"),
    );
    this.againstFields = AGAINST_FIELDS.map((f) => {
      inputs[`against.${f.name}`] = textInput(`against.${f.name}`, { placeholder: f.placeholder, size: 10 });
      const node = field(f, inputs[`against.${f.name}`]);
      node.dataset.mode = f.mode;
      return node;
    });
    return el(
      "div",
      { class: "hs-alert-against-box" },
      field({ name: "against", label: "Against" }, this.againstMode),
      this.againstFields,
    );
  }

  showKind() {
    for (const [kind, section] of Object.entries(this.kindSections)) section.hidden = kind !== this.kind.value;
    this.showAgainst();
  }

  showAgainst() {
    for (const node of this.againstFields) node.hidden = node.dataset.mode !== this.againstMode.value;
  }

  setTypes(types) {
    this.types.replaceChildren(...[...types].sort().map((t) => el("option", { value: t }, typeLabel(t))));
  }

  /** The rule the fields describe, as typed (empty fields left out). */
  readFields() {
    const rule = { name: this.name.value.trim() };
    const put = (object, key, text, isNumber = false) => {
      const value = text.trim();
      if (value) object[key] = typed(value, isNumber);
    };
    put(rule, "selector", this.selector.value);
    put(rule, "profileType", this.profileType.value);
    const kind = this.kind.value;
    const condition = { kind };
    const inputs = this.kindInputs[kind];
    for (const f of KINDS[kind].fields) put(condition, f.name, inputs[f.name].value, f.number);
    if (KINDS[kind].against) {
      const against = {};
      for (const f of AGAINST_FIELDS) {
        if (f.mode === this.againstMode.value) put(against, f.name, inputs[`against.${f.name}`].value);
      }
      if (Object.keys(against).length) condition.against = against;
    }
    rule.condition = condition;
    put(rule, "for", this.for.value);
    const labels = parsePairs(this.labels.value, "Labels");
    if (Object.keys(labels).length) rule.labels = labels;
    const annotations = parsePairs(this.annotations.value, "Annotations");
    if (Object.keys(annotations).length) rule.annotations = annotations;
    const webhooks = this.webhooks.value
      .split(/\s+/)
      .map((s) => s.trim())
      .filter(Boolean);
    if (webhooks.length) rule.webhooks = webhooks;
    return rule;
  }

  /** The rule to send: from the fields, or the JSON editor's text (which must parse). */
  read() {
    if (this.mode === "json") {
      const rule = JSON.parse(this.json.value);
      if (!rule || typeof rule !== "object" || Array.isArray(rule)) throw new Error("the rule must be a JSON object");
      return rule;
    }
    return this.readFields();
  }

  /** Fills the fields (and the JSON) with `rule` to edit it, or empties them. */
  fill(rule) {
    const r = rule || {};
    const c = r.condition || {};
    this.name.value = r.name || "";
    this.selector.value = r.selector || "";
    this.profileType.value = r.profileType || "";
    this.for.value = r.for || "";
    this.kind.value = KINDS[c.kind] ? c.kind : "function_share";
    for (const [kind, inputs] of Object.entries(this.kindInputs)) {
      for (const [key, input] of Object.entries(inputs)) {
        let value;
        if (kind !== this.kind.value) value = "";
        else if (key.startsWith("against.")) value = (c.against || {})[key.slice(8)];
        else value = c[key];
        input.value = value === undefined || value === null ? "" : String(value);
      }
    }
    this.againstMode.value = c.against && c.against.label !== undefined ? "label" : "offset";
    this.labels.value = pairsText(r.labels);
    this.annotations.value = pairsText(r.annotations);
    this.webhooks.value = (r.webhooks || []).join("\n");
    this.json.value = rule ? JSON.stringify(rule, null, 2) : "";
    this.showKind();
    this.result.replaceChildren();
    if (rule) {
      this.section.scrollIntoView({ block: "start" });
      (this.mode === "json" ? this.json : this.name).focus({ preventScroll: true });
    }
  }

  toggleMode() {
    this.result.replaceChildren();
    if (this.mode === "form") {
      let rule;
      try {
        rule = this.readFields();
      } catch (err) {
        this.showError(err.message);
        return;
      }
      this.json.value = JSON.stringify(rule, null, 2);
      this.mode = "json";
    } else {
      let rule = null;
      try {
        // An emptied editor goes back to empty fields.
        if (this.json.value.trim()) rule = this.read();
      } catch (err) {
        this.showError(
          `The JSON does not read: ${err.message}`,
          "Fix it, or clear the form, to go back to the fields.",
        );
        return;
      }
      this.fill(rule);
      this.mode = "form";
    }
    const json = this.mode === "json";
    this.fieldsBox.hidden = json;
    this.jsonBox.hidden = !json;
    this.modeButton.textContent = json ? "Edit as fields" : "Edit as JSON";
    this.form.dataset.mode = this.mode;
  }

  showError(text, hint = null) {
    this.result.replaceChildren(el("div", { class: "hs-alert-error" }, message("error", text, hint)));
  }

  /** The rule measured over the last hours before it is saved: a bar per moment, red where
   * it would have held. */
  async preview() {
    let rule;
    try {
      rule = this.read();
    } catch (err) {
      this.showError(err.message, "Nothing was sent.");
      return;
    }
    const button = this.form.querySelector(".hs-alert-preview-button");
    button.disabled = true;
    this.result.replaceChildren(el("p", { class: "hs-loading" }, "Measuring the last 3 hours…"));
    try {
      const answer = await sendJSON("POST", PREVIEW_API, rule, { hours: 3, points: 12 });
      this.result.replaceChildren(previewChart(answer, rule.condition));
    } catch (err) {
      this.showError(`No preview: ${err.message}`, "Fix the rule and try again.");
    } finally {
      button.disabled = false;
    }
  }

  async save(event) {
    event.preventDefault();
    let rule;
    try {
      rule = this.read();
    } catch (err) {
      if (this.mode === "json") this.showError(`The JSON does not read: ${err.message}`, "Nothing was sent.");
      else this.showError(err.message, "Nothing was sent.");
      return;
    }
    const name = typeof rule.name === "string" ? rule.name.trim() : "";
    if (!name) {
      if (this.mode === "form") rejectInput(this.name, "A rule needs a name.");
      this.showError("A rule needs a name: it is its address in the API.", "Nothing was sent.");
      return;
    }
    if (name.includes("/")) {
      // It is a path segment of the API: the server would not even see the rule.
      if (this.mode === "form") rejectInput(this.name, "A rule's name cannot hold '/'.");
      this.showError(`A rule's name cannot hold "/": ${name}`, "Nothing was sent.");
      return;
    }
    const button = this.form.querySelector(".hs-alert-save");
    button.disabled = true;
    this.result.replaceChildren();
    try {
      await sendJSON("PUT", ruleApi(name), rule);
      this.result.replaceChildren(
        message("info", `Saved the rule ${name}.`, "The server evaluates it from its next evaluation on."),
      );
      await this.onSaved(name);
    } catch (err) {
      const refused = err.status && err.status < 500;
      this.showError(
        refused ? `The server refused the rule: ${err.message}` : err.message,
        refused ? "Nothing was changed. Fix the rule and save again." : err.hint || null,
      );
    } finally {
      button.disabled = false;
    }
  }
}

// --- the page ----------------------------------------------------------------------------------

class AlertsView {
  constructor(root, params) {
    this.root = root;
    this.focus = params.get("rule") || "";
    this.controller = new AbortController();
    this.timer = null;
    this.confirming = null;
    this.openHistory = new Set(this.focus ? [this.focus] : []);
    this.banner = el("div", { class: "hs-banner" });
    this.summary = el("p", { class: "hs-alerts-summary" });
    this.updated = el("span", { class: "hs-muted hs-alerts-updated" });
    this.list = el("div", { class: "hs-alerts-list" }, el("p", { class: "hs-loading" }, "Loading…"));
    this.form = new RuleForm({
      onSaved: (name) => {
        this.openHistory.add(name);
        return this.refresh();
      },
    });
    root.append(
      el("h1", { class: "hs-title" }, "Alerts"),
      el(
        "p",
        { class: "hs-muted hs-alerts-intro" },
        "Rules the server evaluates on the profiles of this tenant. A rule whose condition holds is pending, ",
        'then firing once it has held for its "for"; its webhooks hear of each change, in Alertmanager\'s format.',
      ),
      this.banner,
      el(
        "section",
        { class: "hs-alerts-section" },
        el("div", { class: "hs-alerts-head" }, el("h2", {}, "Rules"), this.summary, this.updated),
        this.list,
      ),
      this.form.section,
    );
    this.loadTypes();
    this.refresh();
    // "Alert on this function" (a flame graph's menu): the form filled in, not saved.
    if (params.get("function")) this.form.fill(draftFromParams(params));
  }

  destroy() {
    this.controller.abort();
    clearTimeout(this.timer);
    clearTimeout(this.confirmTimer);
  }

  async loadTypes() {
    const now = Date.now();
    suggestSelectors(this.form.selectors, { startMs: now - 24 * 3600e3, endMs: now }, this.controller.signal);
    try {
      const services = await catalogue(now - 24 * 3600e3, now, this.controller.signal);
      const types = new Set([CPU]);
      for (const set of services.values()) for (const t of set) types.add(t);
      this.form.setTypes(types);
    } catch {
      this.form.setTypes(new Set([CPU]));
    }
  }

  async refresh() {
    clearTimeout(this.timer);
    const { signal } = this.controller;
    try {
      const answer = await getJSON(ALERTS_API, {}, { signal });
      if (signal.aborted) return;
      const items = Array.isArray(answer) ? answer : answer.alerts || answer.rules || [];
      this.render(items.map(normalise));
      this.updated.textContent = `updated ${formatTime(Date.now())} · refreshes every ${REFRESH_MS / 1000} s`;
      this.root.querySelector(".hs-alerts-load-error")?.remove();
    } catch (err) {
      if (err.name === "AbortError" || signal.aborted) return;
      const box = errorBox(err);
      box.classList.add("hs-alerts-load-error");
      this.root.querySelector(".hs-alerts-load-error")?.remove();
      // Until a first answer there is no list to keep: the reason takes its place.
      if (this.lastAlerts) this.banner.after(box);
      else this.list.replaceChildren(box);
      this.updated.textContent = `no answer at ${formatTime(Date.now())}; retrying`;
    }
    if (!signal.aborted) this.timer = setTimeout(() => this.refresh(), REFRESH_MS);
  }

  render(alerts) {
    this.lastAlerts = alerts;
    const counts = Object.fromEntries(STATES.map((s) => [s, 0]));
    for (const a of alerts) counts[a.state] = (counts[a.state] || 0) + 1;
    this.summary.replaceChildren(
      ...STATES.filter((s) => counts[s]).map((s) =>
        el("span", { class: `hs-alert-state hs-state-${s}`, dataset: { state: s } }, `${counts[s]} ${s}`),
      ),
    );
    if (!alerts.length) {
      this.list.replaceChildren(
        message(
          "empty",
          "No alert rules yet.",
          "Add one below: for example, a function's share of a service's CPU above 20% over 5 minutes.",
        ),
      );
      return;
    }
    const rank = (s) => (STATES.includes(s) ? STATES.indexOf(s) : STATES.length);
    const sorted = [...alerts].sort((a, b) => rank(a.state) - rank(b.state) || a.name.localeCompare(b.name));
    this.list.replaceChildren(...sorted.map((a) => this.card(a)));
  }

  card(alert) {
    const { rule, name, state } = alert;
    const confirming = this.confirming === name;
    const del = el(
      "button",
      {
        type: "button",
        class: `hs-alert-delete${confirming ? " hs-danger" : ""}`,
        onclick: (e) => this.remove(name, e.currentTarget),
      },
      confirming ? "Confirm delete" : "Delete",
    );
    const link = alert.generatorURL ? localLink(alert.generatorURL) : null;
    const hasValue = alert.value !== null && alert.value !== undefined;
    const evaluated = timeCell(alert.lastEvaluation);
    if (alert.evaluations) {
      evaluated.title =
        `${evaluated.title || ""} · ${alert.evaluations} evaluations` +
        (alert.evaluationSeconds ? `, the last took ${number(alert.evaluationSeconds, 3)} s` : "");
    }
    const facts = [
      [
        "Value",
        hasValue ? el("span", { class: "hs-alert-value-text" }, valueText(alert.value, rule.condition)) : dash(),
        "value",
      ],
      [`${state[0].toUpperCase()}${state.slice(1)} since`, timeCell(alert.since), "since"],
      ["Last evaluation", evaluated, "evaluated"],
      ["Profile", el("span", { title: rule.profileType || CPU }, typeLabel(rule.profileType || CPU)), "type"],
      ["For", rule.for || "0s", "for"],
    ];
    if (alert.firedAt) facts.push(["Last fired", timeCell(alert.firedAt), "fired"]);
    if (alert.resolvedAt) facts.push(["Last resolved", timeCell(alert.resolvedAt), "resolved"]);
    const labels = Object.entries(rule.labels || {});
    return el(
      "article",
      { class: `hs-alert hs-alert-${state}`, dataset: { name, state } },
      el(
        "header",
        { class: "hs-alert-head" },
        el("h3", { class: "hs-alert-name" }, name),
        el("span", { class: `hs-alert-state hs-state-${state}` }, state),
        el("span", { class: "hs-spacer" }),
        el(
          "span",
          { class: "hs-alert-actions" },
          link ? el("a", { class: "hs-alert-cause", href: link }, "Show the cause") : null,
          el("button", { type: "button", class: "hs-alert-edit", onclick: () => this.form.fill(rule) }, "Edit"),
          del,
        ),
      ),
      el(
        "p",
        { class: "hs-alert-condition" },
        el("span", { class: "hs-mono hs-alert-selector" }, rule.selector || "{}"),
        " ",
        el("span", {}, conditionText(rule.condition)),
      ),
      labels.length
        ? el(
            "p",
            { class: "hs-alert-labels" },
            labels.map(([k, v]) => el("span", { class: "hs-chip" }, `${k}=${v}`)),
          )
        : null,
      alert.summary ? el("p", { class: "hs-alert-summary-text" }, alert.summary) : null,
      el(
        "dl",
        { class: "hs-alert-facts" },
        facts.map(([term, value, key]) =>
          el("div", { class: `hs-alert-fact hs-alert-${key}` }, el("dt", {}, term), el("dd", {}, value)),
        ),
      ),
      alert.lastError
        ? el(
            "div",
            { class: "hs-alert-last-error" },
            message(
              "error",
              `The last evaluation failed: ${alert.lastError}`,
              "The rule keeps its state until an evaluation succeeds.",
            ),
          )
        : null,
      this.webhooks(alert),
      this.history(alert),
    );
  }

  webhooks(alert) {
    if (!alert.webhooks.length) return null;
    return el(
      "ul",
      { class: "hs-alert-webhooks", "aria-label": "Webhooks" },
      alert.webhooks.map((hook) => {
        let status;
        if (hook.error)
          status = el(
            "span",
            { class: "hs-alert-hook-error" },
            `failed, retried at the next evaluation: ${hook.error}`,
          );
        else if (hook.delivered) status = el("span", { class: "hs-muted" }, `took ${hook.delivered}`);
        else status = el("span", { class: "hs-muted" }, "nothing sent yet");
        return el(
          "li",
          {
            class: "hs-alert-webhook",
            dataset: { delivered: hook.delivered || "", failed: String(Boolean(hook.error)) },
          },
          el("span", { class: "hs-muted" }, "webhook "),
          el("span", { class: "hs-mono" }, hook.url),
          " ",
          status,
        );
      }),
    );
  }

  history(alert) {
    // Newest first; each entry is the state entered, so the one before it is where it came from.
    const entries = [...alert.history].sort((a, b) => (toMs(b.at) || 0) - (toMs(a.at) || 0));
    const details = el(
      "details",
      {
        class: "hs-alert-history",
        open: this.openHistory.has(alert.name),
        ontoggle: () => {
          if (details.open) this.openHistory.add(alert.name);
          else this.openHistory.delete(alert.name);
        },
      },
      el("summary", {}, `History (${entries.length})`),
    );
    if (!entries.length) {
      details.append(el("p", { class: "hs-muted" }, "No transitions yet."));
      return details;
    }
    const rows = entries.map((h, i) => {
      const to = stateOf(h);
      const from = i + 1 < entries.length ? stateOf(entries[i + 1]) : null;
      const ms = toMs(h.at);
      return el(
        "tr",
        { class: "hs-alert-transition", dataset: { to } },
        el("td", { class: "hs-alert-transition-time" }, ms === null ? dash() : formatTime(ms)),
        el(
          "td",
          {},
          from ? el("span", { class: `hs-alert-state hs-state-${from}` }, from) : null,
          from ? " → " : null,
          el("span", { class: `hs-alert-state hs-state-${to}` }, to),
        ),
        el(
          "td",
          { class: "hs-alert-transition-value" },
          h.value === undefined || h.value === null ? dash() : valueText(h.value, alert.rule.condition),
        ),
      );
    });
    details.append(
      el(
        "div",
        { class: "hs-table-scroll" },
        el(
          "table",
          { class: "hs-table hs-alert-history-table" },
          el(
            "thead",
            {},
            el(
              "tr",
              {},
              ["When", "Change", "Value"].map((h) => el("th", {}, h)),
            ),
          ),
          el("tbody", {}, rows),
        ),
      ),
    );
    return details;
  }

  async remove(name, button) {
    if (this.confirming !== name) {
      this.confirming = name;
      button.textContent = "Confirm delete";
      button.classList.add("hs-danger");
      clearTimeout(this.confirmTimer);
      this.confirmTimer = setTimeout(() => {
        this.confirming = null;
        if (this.lastAlerts) this.render(this.lastAlerts);
      }, 5000);
      return;
    }
    this.confirming = null;
    button.disabled = true;
    try {
      await sendJSON("DELETE", ruleApi(name));
      this.banner.replaceChildren(
        message(
          "info",
          `Deleted the rule ${name}.`,
          "Were it firing, its webhooks hear it resolved at the next evaluation.",
        ),
      );
    } catch (err) {
      this.banner.replaceChildren(errorBox(err));
    }
    await this.refresh();
  }
}

const PREVIEW_API = "/api/v1/alerts/preview";

function previewChart(answer, condition) {
  const points = answer.points || [];
  const values = points.map((p) => (p.value === null || p.value === undefined ? null : Number(p.value)));
  const top = Math.max(...values.filter((v) => v !== null).map(Math.abs), 1e-9);
  const held = points.filter((p) => p.breached).length;
  const bars = points.map((p, i) => {
    const v = values[i];
    const bar = el("span", {
      class: `hs-preview-bar${p.breached ? " hs-preview-held" : ""}${v === null ? " hs-preview-none" : ""}`,
      title: `${formatTime(p.at * 1000)}: ${v === null ? "no data" : valueText(v, condition)}${p.breached ? " (holds)" : ""}`,
    });
    bar.style.height = `${v === null ? 2 : Math.max((48 * Math.abs(v)) / top, 2)}px`;
    return bar;
  });
  return el(
    "div",
    { class: "hs-alert-preview" },
    el(
      "p",
      {},
      `Over the last 3 hours it would have held at ${held} of ${points.length} moments`,
      values.length && values[values.length - 1] !== null
        ? `; its value now: ${valueText(values[values.length - 1], condition)}.`
        : ".",
    ),
    el("div", { class: "hs-preview-bars" }, bars),
    answer.summary ? el("p", { class: "hs-muted hs-preview-summary" }, answer.summary) : null,
  );
}

/** A function_share rule drafted from a link: `selector`, `function` (a regex), and the
 * `profileType`; the name and threshold are the user's to choose. */
export function draftFromParams(params) {
  const fn = params.get("function") || "";
  const short =
    fn
      .replace(/^\^|\$$/g, "")
      .replace(/\\(.)/g, "$1")
      .split(".")
      .pop() || "function";
  return {
    name: `${short.replace(/[^\w-]+/g, "_").slice(0, 60)}_share`,
    selector: params.get("selector") || "{}",
    profileType: params.get("profileType") || "",
    condition: { kind: "function_share", function: fn, above: 20, window: "5m" },
    for: "5m",
  };
}

/** The alerts page's address that drafts a rule on one function's share. */
export function alertOnFunctionHref({ selector, profileType, name }) {
  const escaped = name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const search = new URLSearchParams({ selector, function: `^${escaped}$` });
  if (profileType) search.set("profileType", profileType);
  return `/alerts?${search}`;
}

export function renderAlerts(root, { params }) {
  const view = new AlertsView(root, params);
  return () => view.destroy();
}
