// Client-side routing over the History API.  The URL holds the whole state of a view (path
// plus query string), so any view can be reopened from a link.

const routes = [];
let root = null;
let cleanup = null;

/**
 * Registers a view for paths matching `pattern` (a RegExp; its groups are passed on).
 * A view is `(root, {params, match, path}) => cleanup?`.
 */
export function route(pattern, view) {
  routes.push({ pattern, view });
}

/** Opens `url` (path and query) as a new history entry, or replacing the current one. */
export function navigate(url, { replace = false } = {}) {
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  render();
}

/**
 * Writes `changes` into the current query string without re-rendering, so that the address
 * bar always reopens what is shown.  Empty values are removed.
 */
export function setQuery(changes, { push = false } = {}) {
  const params = new URLSearchParams(location.search);
  for (const [key, value] of Object.entries(changes)) {
    params.delete(key);
    const values = Array.isArray(value) ? value : [value];
    for (const v of values) {
      if (v !== null && v !== undefined && v !== "") params.append(key, String(v));
    }
  }
  const text = params.toString();
  const url = `${location.pathname}${text ? `?${text}` : ""}`;
  if (url === `${location.pathname}${location.search}`) return;
  if (push) history.pushState(null, "", url);
  else history.replaceState(null, "", url);
}

/** What a profile panel keeps in the address: the search, the zoomed frame, the table's sort
 * and the sandwich view's function. */
export const PANEL_STATE = ["search", "zoom", "sort", "sandwich"];

/**
 * ProfilePanel options that restore the panel's state from `params` and write each change the
 * user makes back with `keep` (by default straight into the address), so a reload or a shared
 * link reopens the same graph: `{search, onSearch, zoom, onZoom, ...}`.
 */
export function panelState(params, keep = (changes) => setQuery(changes)) {
  const options = {};
  for (const key of PANEL_STATE) {
    options[key] = params.get(key) || "";
    options[`on${key[0].toUpperCase()}${key.slice(1)}`] = (value) => keep({ [key]: value });
  }
  return options;
}

/** Starts routing: renders the current URL, follows in-app links and back/forward. */
export function start(container) {
  root = container;
  window.addEventListener("popstate", render);
  document.addEventListener("click", (event) => {
    const link = event.target.closest && event.target.closest("a[href]");
    if (!link || event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    if (link.target || link.hasAttribute("download")) return;
    const url = new URL(link.href, location.href);
    if (url.origin !== location.origin || url.pathname.startsWith("/static/")) return;
    if (!routes.some((r) => r.pattern.test(url.pathname))) return;
    event.preventDefault();
    navigate(url.pathname + url.search);
  });
  render();
}

function render() {
  if (cleanup) {
    try {
      cleanup();
    } catch (err) {
      console.error(err);
    }
    cleanup = null;
  }
  const path = location.pathname;
  for (const { pattern, view } of routes) {
    const match = path.match(pattern);
    if (!match) continue;
    root.replaceChildren();
    const result = view(root, { params: new URLSearchParams(location.search), match, path });
    if (typeof result === "function") cleanup = result;
    for (const link of document.querySelectorAll("[data-nav]")) {
      link.classList.toggle("hs-active", path.startsWith(`/${link.dataset.nav}`));
    }
    return;
  }
  root.replaceChildren();
  const p = document.createElement("p");
  p.className = "hs-message hs-error";
  p.textContent = `No page at ${path}. Try Profiles or Traces above.`;
  root.append(p);
}
