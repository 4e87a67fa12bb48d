// The UI's entry point: which view answers which path, and the settings dialog.

import { renderAlerts } from "./alerts.js";
import { saveSettings, settings } from "./api.js";
import { el } from "./dom.js";
import { renderDiff } from "./diff.js";
import { renderEndpoints } from "./endpoints.js";
import { renderProfiles } from "./profiles.js";
import { route, start } from "./router.js";
import { renderServiceSettings, renderSettingsIndex } from "./settings.js";
import { renderTraceSearch, renderTraceView } from "./traces.js";

route(/^\/(profiles)?$/, renderProfiles);
route(/^\/endpoints\/?$/, renderEndpoints);
route(/^\/diff$/, renderDiff);
route(/^\/traces\/?$/, renderTraceSearch);
route(/^\/traces\/([^/]+)$/, renderTraceView);
route(/^\/alerts\/?$/, renderAlerts);
route(/^\/settings\/?$/, renderSettingsIndex);
route(/^\/settings\/(.+)$/, renderServiceSettings);

function openSettings() {
  const current = settings();
  // Both go out as HTTP headers, which carry ISO-8859-1 only: refused here, not by fetch.
  const header = { pattern: "[\\x20-\\x7e\\xa0-\\xff]*", title: "letters of ISO-8859-1 only" };
  const token = el("input", { type: "password", value: current.token, autocomplete: "off", ...header });
  const tenant = el("input", { value: current.tenant, placeholder: "anonymous", ...header });
  const dialog = el(
    "dialog",
    { class: "hs-dialog" },
    el(
      "form",
      { method: "dialog" },
      el("h2", {}, "Settings"),
      el("p", {}, "Sent with every query this browser makes to this server."),
      el("label", {}, "Query token ", token),
      el("label", {}, "Tenant (X-Scope-OrgID) ", tenant),
      el(
        "div",
        { class: "hs-dialog-buttons" },
        el("button", { value: "cancel", formnovalidate: "" }, "Cancel"),
        el("button", { value: "save", class: "hs-primary" }, "Save and reload"),
      ),
    ),
  );
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "save") {
      saveSettings({ token: token.value.trim(), tenant: tenant.value.trim() });
      location.reload();
    }
    dialog.remove();
  });
  document.body.append(dialog);
  dialog.showModal();
}

document.getElementById("hs-settings-button").addEventListener("click", openSettings);
start(document.getElementById("app"));
