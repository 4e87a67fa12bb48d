// The right-click menu of a function (a flame graph frame or a top-table row): focus on it,
// sandwich it, copy its name, search for it, and where it lives in the source.  The source
// location comes from the panel's pprof export, fetched only when a menu asks for it.

import { el } from "./dom.js";
import { showMenu } from "./menu.js";
import { editorLink, formatLocation } from "./source.js";

/** Copies text; where the clipboard is refused, shows it selected for the user to copy. */
async function copyText(text, menu, what) {
  try {
    await navigator.clipboard.writeText(text);
    status(menu, `Copied ${what}`);
    setTimeout(() => menu.close(), 700);
  } catch {
    const input = el("input", { class: "hs-menu-copytext", readOnly: true, value: text, "aria-label": what });
    status(menu, "Copy it from here (Ctrl+C):");
    menu.node.append(input);
    input.focus();
    input.select();
  }
}

function status(menu, text) {
  let line = menu.node.querySelector(".hs-menu-status");
  if (!line) {
    line = el("div", { class: "hs-menu-status", role: "status" });
    menu.node.append(line);
  }
  line.textContent = text;
}

/**
 * @param {{name: string, x: number, y: number, zoom?: () => void, sandwich: () => void,
 *   search: () => void, source: () => Promise<{file: string, line: number}|null>|null,
 *   links?: {key: string, label: string, href: string, title?: string}[]}} options
 *   `zoom`: focus on the frame (absent where there is none to zoom to); `source`: the
 *   function's location, null when the view has no profile to read it from; `links`: the
 *   view's own ways on from this function (its traces, an alert on it)
 */
export function openFrameMenu({ name, x, y, zoom, sandwich, search, source, links = [] }) {
  const items = [];
  if (zoom) items.push({ key: "zoom", label: "Focus on subtree", action: zoom });
  items.push(
    { key: "sandwich", label: "Sandwich: callers and callees", action: sandwich },
    { key: "copy", label: "Copy function name", keepOpen: true, action: () => copyText(name, menu, "function name") },
    { key: "search", label: "Search for it", action: search },
  );
  for (const link of links) {
    const a = el(
      "a",
      {
        class: "hs-menu-link",
        role: "menuitem",
        tabIndex: -1,
        href: link.href,
        title: link.title || null,
        dataset: { action: link.key },
      },
      link.label,
    );
    a.addEventListener("click", () => menu.close());
    items.push({ node: a });
  }
  const where = el("div", { class: "hs-menu-source", role: "status" }, "Source: looking it up…");
  items.push({ node: el("div", { class: "hs-menu-title", title: name }, name) });
  items.push({ node: where });
  const menu = showMenu({ x, y, items, label: `Actions for ${name}`, className: "hs-frame-menu" });
  // The name heads the menu; the source line follows the actions.
  menu.node.prepend(menu.node.querySelector(".hs-menu-title"));

  const lookup = source ? source() : null;
  if (!lookup) {
    where.textContent = "Source location not available here";
    return menu;
  }
  lookup.then(
    (loc) => {
      if (!menu.node.isConnected) return;
      if (!loc || !loc.file) {
        where.textContent = "Source location not recorded for this function";
        return;
      }
      const text = formatLocation(loc);
      where.replaceChildren(el("span", { class: "hs-menu-location", title: text }, text));
      const copy = el(
        "button",
        { type: "button", role: "menuitem", class: "hs-menu-item", tabIndex: -1, dataset: { action: "copy-location" } },
        "Copy source location",
      );
      copy.addEventListener("click", () => copyText(text, menu, "source location"));
      const open = el(
        "a",
        { class: "hs-menu-link", role: "menuitem", tabIndex: -1, href: editorLink(loc), dataset: { action: "editor" } },
        "Open in editor (VS Code)",
      );
      open.addEventListener("click", () => menu.close());
      where.after(copy, open);
    },
    (err) => {
      if (menu.node.isConnected) where.textContent = `Source location unavailable: ${err.message}`;
    },
  );
  return menu;
}
