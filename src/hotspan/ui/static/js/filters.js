// Label filter chips: the label names and values come from the server (LabelNames,
// LabelValues within the current service and time range).

import { querier } from "./api.js";
import { el } from "./dom.js";
import { formatSelector, OPERATORS, SERVICE_LABEL, suggestedLabel } from "./labels.js";

let editors = 0;

export class LabelFilters {
  /**
   * @param {HTMLElement} container
   * @param {{matchers: Array, range: () => {startMs:number,endMs:number},
   *          onChange: (matchers: Array) => void}} options
   */
  constructor(container, { matchers, range, onChange }) {
    this.matchers = matchers;
    this.range = range;
    this.onChange = onChange;
    this.node = el("div", { class: "hs-filters", "aria-label": "Label filters" });
    container.append(this.node);
    this.render();
  }

  render() {
    const chips = this.matchers
      .map((m, i) => [m, i])
      .filter(([m]) => !(m.name === SERVICE_LABEL && m.op === "="))
      .map(([m, i]) =>
        el(
          "span",
          { class: "hs-chip", dataset: { label: m.name } },
          `${m.name}${m.op}"${m.value}"`,
          el(
            "button",
            {
              type: "button",
              class: "hs-chip-remove",
              title: "Remove this filter",
              "aria-label": `Remove filter ${m.name}`,
              onclick: () => this.update(this.matchers.filter((_, j) => j !== i)),
            },
            "×",
          ),
        ),
      );
    const add = el(
      "button",
      { type: "button", class: "hs-add-filter", onclick: () => this.openEditor(add) },
      "+ Filter",
    );
    this.node.replaceChildren(...chips, add);
  }

  update(matchers) {
    this.matchers = matchers;
    this.render();
    this.onChange(matchers);
  }

  async openEditor(button) {
    const { startMs, endMs } = this.range();
    const selector = formatSelector(this.matchers);
    // Two editors can be open at once (the diff has one per side): their lists need own ids.
    const listId = `hs-filter-values-${++editors}`;
    const nameSelect = el("select", { class: "hs-filter-name", "aria-label": "Label name" });
    const opSelect = el(
      "select",
      { class: "hs-filter-op", "aria-label": "Operator" },
      OPERATORS.map((op) => el("option", { value: op }, op)),
    );
    const valueInput = el("input", {
      class: "hs-filter-value",
      "aria-label": "Label value",
      list: listId,
      placeholder: "value",
    });
    const values = el("datalist", { id: listId });
    const form = el(
      "form",
      {
        class: "hs-filter-editor",
        onsubmit: (event) => {
          event.preventDefault();
          if (!nameSelect.value) return;
          const matcher = { name: nameSelect.value, op: opSelect.value, value: valueInput.value };
          this.update([...this.matchers, matcher]);
        },
      },
      nameSelect,
      opSelect,
      valueInput,
      values,
      el("button", { type: "submit", class: "hs-primary" }, "Add"),
      el("button", { type: "button", onclick: () => this.render() }, "Cancel"),
    );
    button.replaceWith(form);
    const loadValues = async () => {
      values.replaceChildren();
      if (!nameSelect.value) return;
      try {
        const answer = await querier("LabelValues", {
          name: nameSelect.value,
          matchers: [selector],
          start: startMs,
          end: endMs,
        });
        values.replaceChildren(...(answer.names || []).map((v) => el("option", { value: v })));
        // The first value as a suggestion, unless the field is being typed in: an answer that
        // lands between a select-all and the typing would put itself before what is typed.
        const typing = document.activeElement === valueInput;
        if (!typing && !valueInput.value && answer.names && answer.names.length) {
          valueInput.value = answer.names[0];
        }
      } catch (err) {
        valueInput.placeholder = err.message;
      }
    };
    nameSelect.addEventListener("change", () => {
      valueInput.value = "";
      loadValues();
    });
    try {
      const answer = await querier("LabelNames", { matchers: [selector], start: startMs, end: endMs });
      const names = (answer.names || []).filter(suggestedLabel);
      if (!names.length) {
        nameSelect.append(el("option", { value: "" }, "no other labels in this selection"));
      }
      nameSelect.append(...names.map((n) => el("option", { value: n }, n)));
      await loadValues();
      valueInput.focus();
    } catch (err) {
      nameSelect.append(el("option", { value: "" }, err.message));
    }
  }
}
