// Small DOM helpers shared by every view: building elements, and the messages that tell the
// user what to do when there is nothing to show or something failed.

/**
 * el("div", {class: "x", onclick: fn, dataset: {a: 1}}, child, "text", [more])
 * Attributes named on* become listeners; `null`/`false` children are skipped.
 */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === "dataset") {
      Object.assign(node.dataset, value);
    } else if (key === "class") {
      node.className = value;
    } else if (key in node && typeof value !== "string") {
      node[key] = value;
    } else {
      node.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(node, child);
    else node.append(child instanceof Node ? child : String(child));
  }
}

/**
 * A message box: kind is "empty" (nothing to show), "error" or "info".  `hint` says what to
 * do next; it may be a string or a node.
 */
export function message(kind, text, hint) {
  return el(
    "div",
    { class: `hs-message hs-${kind}`, role: kind === "error" ? "alert" : "status" },
    el("p", { class: "hs-message-text" }, text),
    hint ? el("p", { class: "hs-message-hint" }, hint) : null,
  );
}

/** Offers `data` (a Blob, or text) to the user as a file download. */
export function download(filename, data, type = "application/octet-stream") {
  const blob = data instanceof Blob ? data : new Blob([data], { type });
  const url = URL.createObjectURL(blob);
  const link = el("a", { href: url, download: filename, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

/** Runs `fn` at most once per `ms`, with the last arguments (for input and resize events). */
export function debounce(fn, ms) {
  let timer = null;
  const call = (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
  // A view that goes away drops the pending call: it would write into the next view's URL.
  call.cancel = () => clearTimeout(timer);
  return call;
}

/**
 * Marks `input` invalid with `reason` and shows it.  The mark goes at the next edit: while an
 * input is invalid the browser refuses to submit its form, so it must not outlive the error.
 */
export function rejectInput(input, reason) {
  input.setCustomValidity(reason);
  input.reportValidity();
  input.addEventListener("input", () => input.setCustomValidity(""), { once: true });
}
