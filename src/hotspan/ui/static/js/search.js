// What the panel's search finds: function names that contain the text, in any case; or, for
// a text between slashes (`/json\.dumps/`), the names a regular expression finds, as an
// alert rule's function pattern does (the diff an alert links to searches so).
//
// The alert evaluator runs patterns with RE2, in linear time; the browser's engine
// backtracks, and a pattern such as `(a+)+b` against a long frame name (profiles are anyone's
// data) would hang the page.  So a pattern runs here only when its shape cannot blow up:
// no repeated group that holds a repetition or an alternative, no back-reference, one
// unbounded repetition (a leading or trailing `.*` changes nothing and is dropped); and it
// reads at most MAX_NAME_CHARS of each name.  Any other pattern is searched as the text it
// is, as one JavaScript cannot read.

const MAX_NAME_CHARS = 500;
const MAX_UNBOUNDED = 1;

/**
 * A test of function names for the search `text`.
 * @param {string} text
 * @returns {(name: string) => boolean}
 */
export function nameMatcher(text) {
  const t = String(text || "").trim();
  const slashed = /^\/(.+)\/$/.exec(t);
  if (slashed) {
    const pattern = safePattern(slashed[1]);
    if (pattern) return (name) => pattern.test(name.length > MAX_NAME_CHARS ? name.slice(0, MAX_NAME_CHARS) : name);
  }
  const q = t.toLowerCase();
  return (name) => name.toLowerCase().includes(q);
}

/**
 * The RegExp of an RE2 pattern (its `(?i)` prefix as the `i` flag, `(?P<name>` groups as
 * JavaScript spells them), or null when JavaScript cannot read it or could take exponential
 * time on it.
 * @param {string} source
 * @returns {RegExp | null}
 */
export function safePattern(source) {
  let flags = "";
  let body = source;
  const inline = /^\(\?([imsU]+)\)/.exec(body);
  if (inline && !/U/.test(inline[1])) {
    flags = [...new Set(inline[1])].join("");
    body = body.slice(inline[0].length);
  }
  body = body.replace(/\(\?P</g, "(?<");
  // An unanchored search needs no `.*` at either end (`/.*json.*/` is `/json/`).
  body = body.replace(/^(\.\*)+/, "").replace(/(?<!\\)(\.\*)+$/, "") || ".*";
  if (!boundedShape(body)) return null;
  try {
    return new RegExp(body, flags);
  } catch {
    return null;
  }
}

/**
 * Whether a pattern's repetitions are few and none repeats a group that repeats or
 * alternates (the shapes that make a backtracking engine exponential).
 * @param {string} p
 */
function boundedShape(p) {
  const groups = [{ repeats: false, alternates: false }];
  let unbounded = 0;
  for (let i = 0; i < p.length; i++) {
    const c = p[i];
    if (c === "\\") {
      if (/[1-9k]/.test(p[i + 1] || "")) return false; // a back-reference
      i++;
    } else if (c === "[") {
      // A character class: its content is no syntax here.
      i++;
      if (p[i] === "^") i++;
      if (p[i] === "]") i++;
      while (i < p.length && p[i] !== "]") i += p[i] === "\\" ? 2 : 1;
    } else if (c === "(") {
      groups.push({ repeats: false, alternates: false });
      if (p[i + 1] === "?") {
        // (?: (?= (?! (?<= (?<! (?<name>: what follows "(" there is no repetition.
        i += 2;
        if (p[i] === "<" && p[i + 1] !== "=" && p[i + 1] !== "!") i = Math.max(p.indexOf(">", i), i);
        else if (p[i] === "<") i++;
      }
    } else if (c === ")") {
      const group = groups.length > 1 ? groups.pop() : groups[0];
      const after = p[i + 1] || "";
      const repeated = after === "*" || after === "+" || (after === "{" && /^\{\d*,?\d*\}/.test(p.slice(i + 1)));
      if (repeated && (group.repeats || group.alternates)) return false;
      const top = groups[groups.length - 1];
      top.repeats ||= group.repeats;
    } else if (c === "|") {
      groups[groups.length - 1].alternates = true;
    } else if (c === "*" || c === "+" || c === "?" || c === "{") {
      const braces = c === "{" ? /^\{(\d*)(,?)(\d*)\}/.exec(p.slice(i)) : null;
      if (c === "{" && !braces) continue; // a literal brace
      groups[groups.length - 1].repeats = true;
      if (c === "*" || c === "+" || (braces && braces[2] && !braces[3])) unbounded++;
      if (braces) i += braces[0].length - 1;
    }
  }
  return unbounded <= MAX_UNBOUNDED;
}
