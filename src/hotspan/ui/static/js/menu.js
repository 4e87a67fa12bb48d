// A popup menu at a point (the flame graph's and top table's right-click menu): keyboard
// reachable (focus goes to the first item, arrows move, Home/End jump, Escape and Tab close)
// and closed by a click anywhere else.  Focus goes back where it was when it closes.  Scrolling
// leaves it open: a table re-rendering under it scrolls too, and that is not the user leaving.

import { el } from "./dom.js";

let openMenu = null;

/** Closes the open menu, if any: one menu is open at a time. */
function closeMenu() {
  if (openMenu) openMenu.close();
}

/**
 * @typedef {Object} MenuItem
 * @property {string} [label]      a button that runs `action` and closes the menu
 * @property {() => void} [action]
 * @property {boolean} [keepOpen]  the action updates the menu instead of closing it
 * @property {Node} [node]         any other content (a status line, a link)
 */

/**
 * Opens a menu at viewport point (x, y), kept on screen.
 * @param {{x: number, y: number, items: MenuItem[], label?: string, className?: string}} options
 * @returns {{node: HTMLElement, close: () => void, focusFirst: () => void}}
 */
export function showMenu({ x, y, items, label = "Actions", className = "" }) {
  closeMenu();
  const returnFocus = document.activeElement;
  const node = el("div", { class: `hs-menu ${className}`.trim(), role: "menu", "aria-label": label });
  const menu = { node, close, focusFirst: () => focusAt(0) };

  for (const item of items) {
    if (item.node) {
      node.append(item.node);
      continue;
    }
    node.append(
      el(
        "button",
        {
          type: "button",
          role: "menuitem",
          class: "hs-menu-item",
          tabIndex: -1,
          dataset: item.key ? { action: item.key } : {},
          onclick: () => {
            if (!item.keepOpen) close();
            item.action();
          },
        },
        item.label,
      ),
    );
  }

  const entries = () => [...node.querySelectorAll("[role=menuitem], a.hs-menu-link, input.hs-menu-copytext")];
  function focusAt(i) {
    const list = entries();
    if (!list.length) return;
    list[(i + list.length) % list.length].focus();
  }
  function onKey(e) {
    const list = entries();
    const at = list.indexOf(document.activeElement);
    if (e.key === "ArrowDown") focusAt(at + 1);
    else if (e.key === "ArrowUp") focusAt(at < 0 ? -1 : at - 1);
    else if (e.key === "Home") focusAt(0);
    else if (e.key === "End") focusAt(-1);
    else if (e.key === "Escape") {
      close();
      if (returnFocus && returnFocus.focus) returnFocus.focus();
    } else if (e.key === "Tab") {
      close();
      return;
    } else return;
    e.preventDefault();
    e.stopPropagation();
  }
  function onOutside(e) {
    if (!node.contains(e.target)) close();
  }
  function close() {
    if (openMenu !== menu) return;
    openMenu = null;
    node.remove();
    document.removeEventListener("pointerdown", onOutside, true);
    window.removeEventListener("resize", close);
  }

  node.addEventListener("keydown", onKey);
  document.body.append(node);
  // Kept inside the viewport, flipped to the left/top near the right/bottom edges.
  const w = node.offsetWidth;
  const h = node.offsetHeight;
  const left = x + w > window.innerWidth - 4 ? Math.max(4, x - w) : x;
  const top = y + h > window.innerHeight - 4 ? Math.max(4, y - h) : y;
  node.style.left = `${left}px`;
  node.style.top = `${top}px`;
  openMenu = menu;
  document.addEventListener("pointerdown", onOutside, true);
  window.addEventListener("resize", close);
  focusAt(0);
  return menu;
}
