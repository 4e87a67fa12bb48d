// Profiling settings that agents follow (`/settings`, `/settings/<service>`): an operator's
// rules per service and label selector, and what each instance of the service reports it
// applies.  Everything goes through the operator API, /api/v1/settings.
//
//   /settings                 services that have rules, and a box to open any service
//   /settings/<service>       its rules, a form to add or replace one, and its live instances
//
// The checks on settings are the server's (hotspan.model.agent_settings): this view sends what
// the person typed and shows the server's reason when it refuses.

import { getJSON, sendJSON } from "./api.js";
import { el, message } from "./dom.js";
import { formatTime } from "./format.js";
import { formatSelector, withService } from "./labels.js";
import { navigate } from "./router.js";
import { catalogue, errorBox, suggestSelectors } from "./selection.js";

const API = "/api/v1/settings";
const REFRESH_MS = 5000;
// The agent's profile types (hotspan.model.agent_settings.PROFILE_TYPES).
const PROFILE_TYPES = ["cpu", "wall", "alloc", "locks", "threads"];

// The form's fields, in the order of the spec's settings.  A field left empty (or "not set")
// is left out of the rule: agents keep their own configuration for it.
const FIELDS = [
  { name: "enabled", kind: "bool", label: "Enabled" },
  { name: "sample_rate", kind: "number", label: "Sample rate", unit: "Hz, 1–1000" },
  { name: "profile_types", kind: "types", label: "Profile types" },
  { name: "alloc_sample_bytes", kind: "number", label: "Alloc sample bytes", unit: "bytes, 0 off" },
  { name: "conditional_only", kind: "bool", label: "Conditional only" },
  { name: "slow_request_threshold", kind: "number", label: "Slow request threshold", unit: "s, 0 off" },
  { name: "max_overhead", kind: "number", label: "Max overhead", unit: "% of the process's CPU" },
];

const REASONS = {
  cpu: "lowered: process CPU above cpu_threshold",
  memory: "lowered: memory above mem_threshold",
  budget: "lowered: agent over its overhead budget",
  shed: "shedding load: sampling paused",
  disabled: "profiling disabled",
};

export function settingsPath(service) {
  return `/settings/${encodeURIComponent(service)}`;
}

function apiPath(service) {
  return `${API}/${encodeURIComponent(service)}`;
}

// --- formatting ----------------------------------------------------------------------------

const dash = () => el("span", { class: "hs-muted" }, "–");

function isNumber(x) {
  return typeof x === "number" && Number.isFinite(x);
}

function nsToMs(ns) {
  return Number(ns) / 1e6;
}

function ago(ns) {
  const seconds = Math.max(0, (Date.now() - nsToMs(ns)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  return `${Math.round(seconds / 3600)} h ago`;
}

function number(x, digits = 2) {
  return String(Number(Number(x).toFixed(digits)));
}

function settingText(name, value) {
  if (Array.isArray(value)) return `${name}=${value.join(",") || "(none)"}`;
  return `${name}=${typeof value === "string" ? JSON.stringify(value) : String(value)}`;
}

function settingChips(settings) {
  // In the form's order (the server may keep them sorted by name); unknown ones last.
  const order = (name) => {
    const i = FIELDS.findIndex((f) => f.name === name);
    return i < 0 ? FIELDS.length : i;
  };
  const entries = Object.entries(settings || {}).sort(([a], [b]) => order(a) - order(b));
  if (!entries.length) return el("span", { class: "hs-muted" }, "(no settings: agents keep their own)");
  return el(
    "span",
    { class: "hs-setting-chips" },
    entries.map(([name, value]) =>
      el("span", { class: "hs-chip hs-setting-chip", dataset: { setting: name } }, settingText(name, value)),
    ),
  );
}

function selectorText(selector) {
  return selector ? selector : "(every instance)";
}

function onOff(value) {
  if (typeof value !== "boolean") return dash();
  return el("span", { class: value ? "hs-on" : "hs-off" }, value ? "on" : "off");
}

// --- /settings -----------------------------------------------------------------------------

class SettingsIndex {
  constructor(root) {
    this.root = root;
    this.controller = new AbortController();
    this.list = el("section", { class: "hs-settings-section" }, el("p", { class: "hs-loading" }, "Loading…"));
    this.services = el("datalist", { id: "hs-settings-services" });
    const input = el("input", {
      class: "hs-settings-open-service",
      "aria-label": "Service",
      placeholder: "service name",
      list: "hs-settings-services",
      required: true,
      size: 28,
    });
    const form = el(
      "form",
      {
        class: "hs-settings-open",
        onsubmit: (event) => {
          event.preventDefault();
          const service = input.value.trim();
          if (service) navigate(settingsPath(service));
        },
      },
      el("label", {}, "Service ", input),
      this.services,
      el("button", { type: "submit" }, "Open"),
    );
    root.append(
      el("h1", { class: "hs-title" }, "Agent settings"),
      el(
        "p",
        { class: "hs-muted" },
        "Profiling settings that the agents of a service follow, set per service and label selector. ",
        "Agents read them in the answer to each upload and report what they apply.",
      ),
      form,
      this.list,
    );
    this.load();
  }

  destroy() {
    this.controller.abort();
  }

  async load() {
    const { signal } = this.controller;
    const now = Date.now();
    catalogue(now - 24 * 3600e3, now, signal)
      .then((services) => {
        this.services.replaceChildren(
          ...[...services.keys()]
            .filter(Boolean)
            .sort()
            .map((s) => el("option", { value: s })),
        );
      })
      .catch(() => {});
    let rules;
    try {
      rules = (await getJSON(API, {}, { signal })).rules || [];
    } catch (err) {
      if (err.name === "AbortError") return;
      this.list.replaceChildren(errorBox(err));
      return;
    }
    if (!rules.length) {
      this.list.replaceChildren(
        message(
          "empty",
          "No service has settings rules yet.",
          "Open a service above (or from its Profiles view) to add one; until then agents use their own configuration.",
        ),
      );
      return;
    }
    const byService = new Map();
    for (const rule of rules) {
      if (!byService.has(rule.service)) byService.set(rule.service, []);
      byService.get(rule.service).push(rule);
    }
    const rows = [...byService.keys()].sort().map((service) => {
      const list = byService.get(service);
      const latest = list.reduce((a, b) => (Number(b.updated_at) > Number(a.updated_at) ? b : a));
      return el(
        "tr",
        { dataset: { service } },
        el("td", {}, el("a", { href: settingsPath(service) }, service)),
        el(
          "td",
          {},
          list.map((r) => el("div", { class: "hs-mono" }, selectorText(r.selector))),
        ),
        el("td", {}, formatTime(nsToMs(latest.updated_at))),
      );
    });
    this.list.replaceChildren(
      scrolling(
        el(
          "table",
          { class: "hs-table hs-settings-services" },
          el("thead", {}, el("tr", {}, el("th", {}, "Service"), el("th", {}, "Rules"), el("th", {}, "Last changed"))),
          el("tbody", {}, rows),
        ),
      ),
    );
  }
}

/** A wide table scrolls inside its own box on a narrow screen, never the page. */
function scrolling(table) {
  return el("div", { class: "hs-table-scroll" }, table);
}

// --- /settings/<service> -------------------------------------------------------------------

class ServiceSettings {
  constructor(root, service) {
    this.root = root;
    this.service = service;
    this.controller = new AbortController();
    this.timer = null;
    this.confirming = null; // the selector whose Delete asks for confirmation
    this.build();
    this.refresh();
  }

  destroy() {
    this.controller.abort();
    clearTimeout(this.timer);
    clearTimeout(this.confirmTimer);
  }

  build() {
    const profiles = `/profiles?query=${encodeURIComponent(formatSelector(withService([], this.service)))}`;
    this.banner = el("div", { class: "hs-banner" });
    this.rules = el("div", { class: "hs-settings-rules" }, el("p", { class: "hs-loading" }, "Loading…"));
    this.instances = el("div", { class: "hs-settings-instances" });
    this.updated = el("span", { class: "hs-muted hs-settings-updated" });
    this.root.append(
      el("h1", { class: "hs-title" }, "Settings · ", el("span", { class: "hs-settings-service" }, this.service)),
      el(
        "p",
        { class: "hs-settings-links" },
        el("a", { href: "/settings" }, "All services"),
        " · ",
        el("a", { href: profiles }, "Profiles of this service"),
      ),
      this.banner,
      el(
        "section",
        { class: "hs-settings-section" },
        el("h2", {}, "Rules"),
        el(
          "p",
          { class: "hs-muted" },
          "An instance follows the rule whose selector matches its labels with the most matchers (the most recently changed on a tie). ",
          "Settings a rule leaves out stay as the agent configured them.",
        ),
        this.rules,
      ),
      this.buildForm(),
      el(
        "section",
        { class: "hs-settings-section" },
        el("div", { class: "hs-settings-head" }, el("h2", {}, "Instances"), this.updated),
        this.instances,
      ),
    );
  }

  buildForm() {
    this.inputs = {};
    this.selectorInput = el("input", {
      class: "hs-rule-selector",
      name: "selector",
      placeholder: '{env="prod"} — empty for every instance',
      size: 36,
      autocomplete: "off",
      list: "hs-settings-selectors",
    });
    // Offered as one types: the labels this service's profiles carried in the last day.
    this.selectorList = el("datalist", { id: "hs-settings-selectors" });
    const now = Date.now();
    suggestSelectors(
      this.selectorList,
      { service: this.service, startMs: now - 24 * 3600e3, endMs: now },
      this.controller.signal,
    );
    const fields = FIELDS.map((field) => {
      let input;
      if (field.kind === "bool") {
        input = el(
          "select",
          { name: field.name },
          el("option", { value: "" }, "not set"),
          el("option", { value: "true" }, "on"),
          el("option", { value: "false" }, "off"),
        );
      } else if (field.kind === "types") {
        input = el(
          "span",
          { class: "hs-rule-types", role: "group", "aria-label": field.label },
          PROFILE_TYPES.map((type) =>
            el(
              "label",
              { class: "hs-check" },
              el("input", { type: "checkbox", name: "profile_types", value: type }),
              type,
            ),
          ),
        );
      } else {
        // Text, not type=number: what the person typed goes to the server as typed, so its
        // reason ("sample_rate 5000 must be between 1 and 1000") is the one shown.
        input = el("input", {
          name: field.name,
          inputmode: "decimal",
          size: 10,
          autocomplete: "off",
          placeholder: "not set",
        });
      }
      this.inputs[field.name] = input;
      const label = field.kind === "types" ? el("span", { class: "hs-rule-label" }, field.label) : field.label;
      const wrapper = field.kind === "types" ? "div" : "label";
      return el(
        wrapper,
        { class: `hs-rule-field hs-rule-${field.name}` },
        label,
        input,
        field.unit ? el("span", { class: "hs-muted" }, field.unit) : null,
      );
    });
    this.formError = el("div", { class: "hs-rule-result", "aria-live": "polite" });
    this.form = el(
      "form",
      { class: "hs-rule-form", novalidate: true, onsubmit: (e) => this.save(e) },
      el("label", { class: "hs-rule-field hs-rule-selector-field" }, "Selector", this.selectorInput, this.selectorList),
      el("div", { class: "hs-rule-fields" }, fields),
      el(
        "p",
        { class: "hs-muted" },
        "Empty fields and unticked profile types are left out of the rule. A rule for a selector that already has one replaces its settings.",
      ),
      el(
        "div",
        { class: "hs-rule-buttons" },
        el("button", { type: "submit", class: "hs-primary hs-rule-save" }, "Save rule"),
        el("button", { type: "button", class: "hs-rule-clear", onclick: () => this.fill(null) }, "Clear"),
      ),
      this.formError,
    );
    return el("section", { class: "hs-settings-section" }, el("h2", {}, "Add or replace a rule"), this.form);
  }

  /** The rule the form describes: `{selector, settings}`, exactly as typed. */
  read() {
    const settings = {};
    for (const field of FIELDS) {
      const input = this.inputs[field.name];
      if (field.kind === "bool") {
        if (input.value) settings[field.name] = input.value === "true";
      } else if (field.kind === "types") {
        const checked = [...input.querySelectorAll("input:checked")].map((i) => i.value);
        if (checked.length) settings[field.name] = checked;
      } else {
        const text = input.value.trim();
        if (!text) continue;
        const value = Number(text);
        settings[field.name] = Number.isFinite(value) ? value : text;
      }
    }
    return { selector: this.selectorInput.value.trim(), settings };
  }

  /** Fills the form with `rule` (to edit it), or empties it. */
  fill(rule) {
    const settings = (rule && rule.settings) || {};
    this.selectorInput.value = rule ? rule.selector || "" : "";
    for (const field of FIELDS) {
      const input = this.inputs[field.name];
      const value = settings[field.name];
      if (field.kind === "types") {
        for (const box of input.querySelectorAll("input")) {
          box.checked = Array.isArray(value) && value.includes(box.value);
        }
      } else if (field.kind === "bool") {
        input.value = typeof value === "boolean" ? String(value) : "";
      } else {
        input.value = value === undefined || value === null ? "" : String(value);
      }
    }
    this.formError.replaceChildren();
    if (rule) this.selectorInput.focus();
  }

  async save(event) {
    event.preventDefault();
    const rule = this.read();
    const button = this.form.querySelector(".hs-rule-save");
    button.disabled = true;
    this.formError.replaceChildren();
    try {
      const stored = await sendJSON("PUT", apiPath(this.service), rule);
      this.formError.replaceChildren(
        message(
          "info",
          `Saved the rule for ${selectorText(stored.selector)} (version ${stored.version}).`,
          "Agents of this service apply it with their next upload.",
        ),
      );
      await this.refresh();
    } catch (err) {
      this.formError.replaceChildren(
        el(
          "div",
          { class: "hs-rule-error" },
          message(
            "error",
            `The server refused the rule: ${err.message}`,
            err.status && err.status < 500 ? "Nothing was changed. Fix the value and save again." : err.hint || null,
          ),
        ),
      );
    } finally {
      button.disabled = false;
    }
  }

  async remove(rule, button) {
    if (this.confirming !== rule.selector) {
      this.confirming = rule.selector;
      button.textContent = "Confirm delete";
      button.classList.add("hs-danger");
      clearTimeout(this.confirmTimer);
      this.confirmTimer = setTimeout(() => {
        this.confirming = null;
        if (this.lastRules) this.renderRules(this.lastRules);
      }, 5000);
      return;
    }
    this.confirming = null;
    button.disabled = true;
    try {
      await sendJSON("DELETE", apiPath(this.service), undefined, { selector: rule.selector });
      this.banner.replaceChildren(
        message(
          "info",
          `Deleted the rule for ${selectorText(rule.selector)}.`,
          "Its instances go back to another matching rule, or to their own configuration.",
        ),
      );
    } catch (err) {
      this.banner.replaceChildren(errorBox(err));
    }
    await this.refresh();
  }

  async refresh() {
    clearTimeout(this.timer);
    const { signal } = this.controller;
    try {
      const answer = await getJSON(apiPath(this.service), {}, { signal });
      if (signal.aborted) return;
      this.renderRules(answer.rules || []);
      this.renderInstances(answer.instances || []);
      this.updated.textContent = `updated ${formatTime(Date.now())} · refreshes every ${REFRESH_MS / 1000} s`;
      this.root.querySelector(".hs-settings-load-error")?.remove();
    } catch (err) {
      if (err.name === "AbortError" || signal.aborted) return;
      const box = errorBox(err);
      box.classList.add("hs-settings-load-error");
      this.root.querySelector(".hs-settings-load-error")?.remove();
      this.banner.after(box);
      this.updated.textContent = `no answer at ${formatTime(Date.now())}; retrying`;
    }
    if (!signal.aborted) this.timer = setTimeout(() => this.refresh(), REFRESH_MS);
  }

  renderRules(rules) {
    this.lastRules = rules;
    if (!rules.length) {
      this.rules.replaceChildren(
        message("empty", `No rules for ${this.service}: its agents use their own configuration.`, "Add one below."),
      );
      return;
    }
    const sorted = [...rules].sort((a, b) => String(a.selector).localeCompare(String(b.selector)));
    const rows = sorted.map((rule) => {
      const confirming = this.confirming === rule.selector;
      const del = el(
        "button",
        {
          type: "button",
          class: `hs-rule-delete${confirming ? " hs-danger" : ""}`,
          onclick: (e) => this.remove(rule, e.currentTarget),
        },
        confirming ? "Confirm delete" : "Delete",
      );
      return el(
        "tr",
        { class: "hs-rule-row", dataset: { selector: rule.selector || "" } },
        el("td", { class: "hs-mono hs-rule-selector-cell" }, selectorText(rule.selector)),
        el("td", { class: "hs-rule-settings" }, settingChips(rule.settings)),
        el("td", { class: "hs-rule-version" }, String(rule.version)),
        el("td", { class: "hs-rule-updated", title: formatTime(nsToMs(rule.updated_at)) }, ago(rule.updated_at)),
        el(
          "td",
          { class: "hs-rule-actions" },
          el("button", { type: "button", class: "hs-rule-edit", onclick: () => this.fill(rule) }, "Edit"),
          " ",
          del,
        ),
      );
    });
    this.rules.replaceChildren(
      scrolling(
        el(
          "table",
          { class: "hs-table hs-rules" },
          el(
            "thead",
            {},
            el(
              "tr",
              {},
              ["Selector", "Settings", "Version", "Updated", ""].map((h) => el("th", {}, h)),
            ),
          ),
          el("tbody", {}, rows),
        ),
      ),
    );
  }

  renderInstances(instances) {
    if (!instances.length) {
      this.instances.replaceChildren(
        message(
          "empty",
          `No instance of ${this.service} reported in the last 10 minutes.`,
          el(
            "span",
            {},
            "Agents report with each upload (hotspan 14+, ",
            el("code", {}, "remote_settings"),
            " on). Other SDKs upload without a report and are not listed.",
          ),
        ),
      );
      return;
    }
    const sorted = [...instances].sort((a, b) => String(a.instance).localeCompare(String(b.instance)));
    const head = [
      "Instance",
      "Labels",
      "Last seen",
      "Enabled",
      "Rate",
      "Overhead",
      "Shed",
      "Dropped",
      "Conditional only",
      "Follows",
    ];
    this.instances.replaceChildren(
      scrolling(
        el(
          "table",
          { class: "hs-table hs-instances" },
          el(
            "thead",
            {},
            el(
              "tr",
              {},
              head.map((h) => el("th", {}, h)),
            ),
          ),
          el(
            "tbody",
            {},
            sorted.map((inst) => this.instanceRow(inst)),
          ),
        ),
      ),
    );
  }

  instanceRow(inst) {
    const s = inst.status && typeof inst.status === "object" ? inst.status : {};
    // An agent that shut down (its last upload said so): what it last reported is history,
    // not a rate, a budget or a rule it fails to follow.
    if (inst.stopped) return this.stoppedRow(inst, s);

    const rate = [];
    if (isNumber(s.sample_rate)) {
      rate.push(el("span", { class: "hs-inst-rate-value" }, `${s.sample_rate} Hz`));
      if (isNumber(s.configured_rate) && s.configured_rate !== s.sample_rate) {
        rate.push(el("span", { class: "hs-muted" }, ` of ${s.configured_rate} configured`));
      }
    } else {
      rate.push(dash());
    }
    if (s.rate_reason) {
      rate.push(
        el(
          "div",
          {
            class: "hs-badge hs-warn hs-inst-reason",
            title: Object.hasOwn(REASONS, s.rate_reason) ? REASONS[s.rate_reason] : "",
          },
          String(s.rate_reason),
        ),
      );
    }

    let overhead = dash();
    if (isNumber(s.overhead)) {
      const over = isNumber(s.max_overhead) && s.overhead > s.max_overhead;
      overhead = el(
        "span",
        { class: over ? "hs-over" : "" },
        `${number(s.overhead)}%`,
        isNumber(s.max_overhead) ? el("span", { class: "hs-muted" }, ` of ${number(s.max_overhead)}% budget`) : null,
      );
    }

    const dropped =
      isNumber(s.dropped_samples) || isNumber(s.dropped_uploads)
        ? `${isNumber(s.dropped_samples) ? s.dropped_samples : "–"} samples · ${isNumber(s.dropped_uploads) ? s.dropped_uploads : "–"} uploads`
        : dash();

    const applied = isNumber(s.settings_version) ? s.settings_version : null;
    const expected = Number(inst.expected_version || 0);
    const versions = `applies v${applied === null ? "?" : applied}, expected v${expected}`;
    const ruleNote =
      inst.rule_selector === null || inst.rule_selector === undefined
        ? "no rule: own configuration"
        : `rule ${selectorText(inst.rule_selector)}`;
    const follows = el(
      "td",
      { class: "hs-inst-follows", dataset: { follows: String(Boolean(inst.follows)) } },
      el(
        "span",
        { class: `hs-badge ${inst.follows ? "hs-ok" : "hs-warn"}` },
        inst.follows ? "follows" : "does not follow",
      ),
      el("div", { class: "hs-muted hs-inst-versions" }, versions),
      el("div", { class: "hs-muted hs-mono hs-inst-rule" }, ruleNote),
    );

    return el(
      "tr",
      { class: `hs-instance-row${inst.follows ? "" : " hs-not-following"}`, dataset: { instance: inst.instance } },
      ...this.identityCells(inst, s),
      el("td", { class: "hs-inst-enabled" }, onOff(s.enabled)),
      el("td", { class: "hs-inst-rate" }, rate),
      el("td", { class: "hs-inst-overhead" }, overhead),
      el("td", { class: "hs-inst-shed" }, isNumber(s.shed_seconds) ? `${number(s.shed_seconds, 1)} s` : dash()),
      el("td", { class: "hs-inst-dropped" }, dropped),
      el("td", { class: "hs-inst-conditional" }, onOff(s.conditional_only)),
      follows,
    );
  }

  /** Instance, labels and last seen: the first cells of every row. */
  identityCells(inst, s) {
    const labels = Object.entries(inst.labels || {})
      .filter(([k]) => k !== "service_name")
      .sort();
    const about = [
      s.hostname,
      isNumber(s.pid) ? `pid ${s.pid}` : null,
      typeof s.version === "string" && s.version ? `hotspan ${s.version}` : null,
    ]
      .filter(Boolean)
      .join(" · ");
    return [
      el(
        "td",
        { class: "hs-inst-name" },
        el("div", { class: "hs-mono" }, inst.instance),
        about ? el("div", { class: "hs-muted" }, about) : null,
      ),
      el(
        "td",
        { class: "hs-inst-labels" },
        labels.length ? labels.map(([k, v]) => el("span", { class: "hs-chip" }, `${k}=${v}`)) : dash(),
      ),
      el("td", { class: "hs-inst-seen", title: formatTime(nsToMs(inst.last_seen)) }, ago(inst.last_seen)),
    ];
  }

  stoppedRow(inst, s) {
    return el(
      "tr",
      { class: "hs-instance-row hs-inst-stopped", dataset: { instance: inst.instance } },
      ...this.identityCells(inst, s),
      el(
        "td",
        { class: "hs-inst-state", colspan: 7 },
        el("span", { class: "hs-badge hs-inst-stopped-badge" }, "stopped"),
        el(
          "span",
          { class: "hs-muted" },
          " the agent shut down with its process; it is listed until 10 minutes after its last upload",
        ),
      ),
    );
  }
}

export function renderSettingsIndex(root) {
  const view = new SettingsIndex(root);
  return () => view.destroy();
}

export function renderServiceSettings(root, { match }) {
  let service;
  try {
    service = decodeURIComponent(match[1]);
  } catch {
    service = match[1];
  }
  const view = new ServiceSettings(root, service);
  return () => view.destroy();
}
