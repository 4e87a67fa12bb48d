// Label selectors as Pyroscope writes them: {service_name="api", env!="dev", region=~"eu-.*"}.

export const OPERATORS = ["=", "!=", "=~", "!~"];
export const SERVICE_LABEL = "service_name";

/**
 * Labels with one value per run, request or profile (`hotspan run` tags a batch job with its
 * trace): grouping by one draws a series per execution, so they are not offered as group-by
 * or filter suggestions.  One given in the URL still works.
 */
export const PER_EXECUTION_LABELS = Object.freeze(["trace_id", "span_id", "root_span_id", "profile_id"]);

/** Whether a label name is worth offering for grouping and filtering. */
export function suggestedLabel(name) {
  return !name.startsWith("__") && name !== SERVICE_LABEL && !PER_EXECUTION_LABELS.includes(name);
}

/** `matchers` plus `name="value"`, replacing an exact matcher on the same label. */
export function withMatcher(matchers, name, value) {
  const rest = matchers.filter((x) => !(x.name === name && x.op === "="));
  return [...rest, { name, op: "=", value }];
}

const MATCHER = /\s*([A-Za-z_.][A-Za-z0-9_.]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)/y;

/** `{a="b", c!="d"}` -> [{name, op, value}]; throws an Error naming what is wrong. */
export function parseSelector(text) {
  const t = String(text || "").trim();
  if (t === "" || t === "{}") return [];
  if (!t.startsWith("{") || !t.endsWith("}")) {
    throw new Error(`a label selector is written {name="value", ...}, not ${t}`);
  }
  const body = t.slice(1, -1);
  const out = [];
  MATCHER.lastIndex = 0;
  while (MATCHER.lastIndex < body.length) {
    const start = MATCHER.lastIndex;
    const m = MATCHER.exec(body);
    if (!m) throw new Error(`cannot read the label selector from "${body.slice(start)}"`);
    out.push({ name: m[1], op: m[2], value: m[3].replace(/\\(.)/g, "$1") });
    if (m[4] === "") break;
  }
  return out;
}

export function formatSelector(matchers) {
  const parts = matchers.map(({ name, op, value }) => `${name}${op}"${String(value).replace(/["\\]/g, "\\$&")}"`);
  return `{${parts.join(", ")}}`;
}

/** The service an exact `service_name="x"` matcher selects, or "". */
export function serviceOf(matchers) {
  const m = matchers.find((x) => x.name === SERVICE_LABEL && x.op === "=");
  return m ? m.value : "";
}

/** `matchers` with the service matcher replaced by `service` (removed when empty). */
export function withService(matchers, service) {
  const rest = matchers.filter((x) => !(x.name === SERVICE_LABEL && x.op === "="));
  return service ? [{ name: SERVICE_LABEL, op: "=", value: service }, ...rest] : rest;
}
