// What the panel's search finds: function names that contain the text, in any case; or, for
// a text between slashes (`/json\.dumps/`), the names a regular expression finds, as an
// alert rule's function pattern does (the diff an alert links to searches so).

/**
 * A test of function names for the search `text`.
 * @param {string} text
 * @returns {(name: string) => boolean}
 */
export function nameMatcher(text) {
  const t = String(text || "").trim();
  const slashed = /^\/(.+)\/$/.exec(t);
  if (slashed) {
    try {
      const pattern = new RegExp(slashed[1]);
      return (name) => pattern.test(name);
    } catch {
      // Not a pattern JavaScript reads: searched as the text it is.
    }
  }
  const q = t.toLowerCase();
  return (name) => name.toLowerCase().includes(q);
}
