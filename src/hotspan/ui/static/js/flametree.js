// Flame graph data without the DOM: decoding the server's level encoding into flat typed
// arrays, and the derived views (top table, folded stacks, diff colours, package names).
//
// This file is also inlined into the standalone HTML export (see export.js) next to format.js
// and flamegraph.js as one classic script: it imports nothing, and its top-level names must
// not collide with theirs.

/**
 * @typedef {Object} FlameTree
 * @property {string[]} names      function names; name index 0 is the root "total"
 * @property {number} total        the root's total (left + right for a diff)
 * @property {boolean} diff        true for a FlameGraphDiff
 * @property {number} leftTotal    baseline total (diff only, else = total)
 * @property {number} rightTotal   comparison total (diff only, else = total)
 * @property {number} maxDepth     deepest level (the root is level 0)
 * @property {number} nodeCount
 * @property {Int32Array} levelStart  nodes of level d are [levelStart[d], levelStart[d+1])
 * @property {Float64Array} x       absolute start of each node, in value units
 * @property {Float64Array} value   width of each node (its total; left + right for a diff)
 * @property {Float64Array} self
 * @property {Int32Array} name      index into names
 * @property {Int32Array} parent    -1 for the root
 * @property {Int32Array} firstChild  children are the contiguous run [firstChild, +childCount)
 * @property {Int32Array} childCount
 * @property {Uint16Array} depth
 * @property {Float64Array|null} totalLeft   diff only
 * @property {Float64Array|null} selfLeft
 * @property {Float64Array|null} totalRight
 * @property {Float64Array|null} selfRight
 * @property {Object} source        the protojson object this tree was decoded from
 */

function fgInt(v) {
  // protojson writes int64 as strings; values stay well inside 2^53.
  return v === undefined || v === null ? 0 : Number(v);
}

/**
 * Decodes a protojson FlameGraph (4 ints per node) or FlameGraphDiff (7 ints per node).
 * x deltas are relative to the end of the previous node on the same level (Pyroscope).
 * @param {Object} fg
 * @returns {FlameTree}
 */
export function decodeFlamegraph(fg) {
  fg = fg || {};
  const names = (fg.names || []).slice();
  const levels = (fg.levels || []).map((l) => (l && l.values) || []);
  const diff = fg.leftTicks !== undefined || fg.rightTicks !== undefined || isDiffLevels(levels);
  const stride = diff ? 7 : 4;
  // Drop trailing empty levels: they would only add blank rows.
  while (levels.length && levels[levels.length - 1].length === 0) levels.pop();
  let count = 0;
  for (const l of levels) count += Math.floor(l.length / stride);

  const x = new Float64Array(count);
  const value = new Float64Array(count);
  const self = new Float64Array(count);
  const name = new Int32Array(count);
  const depth = new Uint16Array(count);
  const parent = new Int32Array(count).fill(-1);
  const firstChild = new Int32Array(count).fill(-1);
  const childCount = new Int32Array(count);
  const levelStart = new Int32Array(levels.length + 1);
  const totalLeft = diff ? new Float64Array(count) : null;
  const selfLeft = diff ? new Float64Array(count) : null;
  const totalRight = diff ? new Float64Array(count) : null;
  const selfRight = diff ? new Float64Array(count) : null;

  let n = 0;
  for (let d = 0; d < levels.length; d++) {
    levelStart[d] = n;
    const vals = levels[d];
    let endL = 0;
    let endR = 0;
    for (let i = 0; i + stride <= vals.length; i += stride) {
      if (diff) {
        const xl = endL + fgInt(vals[i]);
        const tl = fgInt(vals[i + 1]);
        const xr = endR + fgInt(vals[i + 3]);
        const tr = fgInt(vals[i + 4]);
        endL = xl + tl;
        endR = xr + tr;
        // Pyroscope lays a diff out on the sum of both sides; each side is still exact.
        x[n] = xl + xr;
        value[n] = tl + tr;
        totalLeft[n] = tl;
        selfLeft[n] = fgInt(vals[i + 2]);
        totalRight[n] = tr;
        selfRight[n] = fgInt(vals[i + 5]);
        self[n] = selfLeft[n] + selfRight[n];
        name[n] = fgInt(vals[i + 6]);
      } else {
        const start = endL + fgInt(vals[i]);
        const total = fgInt(vals[i + 1]);
        endL = start + total;
        x[n] = start;
        value[n] = total;
        self[n] = fgInt(vals[i + 2]);
        name[n] = fgInt(vals[i + 3]);
      }
      depth[n] = d;
      n++;
    }
  }
  levelStart[levels.length] = n;

  // Parents: both levels are sorted by x, so one merge-like walk finds each child's parent.
  for (let d = 1; d < levels.length; d++) {
    let p = levelStart[d - 1];
    const pEnd = levelStart[d];
    for (let c = levelStart[d]; c < levelStart[d + 1]; c++) {
      while (p < pEnd - 1 && x[p] + value[p] <= x[c]) p++;
      parent[c] = p;
      if (firstChild[p] < 0) firstChild[p] = c;
      childCount[p]++;
    }
  }

  const root = count > 0 ? value[0] : 0;
  const total = fgInt(fg.total) || root;
  const leftTotal = diff ? fgInt(fg.leftTicks) || (count ? totalLeft[0] : 0) : total;
  const rightTotal = diff ? fgInt(fg.rightTicks) || (count ? totalRight[0] : 0) : total;
  return {
    names,
    total: diff ? leftTotal + rightTotal : total,
    diff,
    leftTotal,
    rightTotal,
    maxDepth: Math.max(0, levels.length - 1),
    nodeCount: count,
    levelStart,
    x,
    value,
    self,
    name,
    parent,
    firstChild,
    childCount,
    depth,
    totalLeft,
    selfLeft,
    totalRight,
    selfRight,
    source: fg,
  };
}

function isDiffLevels(levels) {
  // A diff answer without leftTicks/rightTicks (both sides empty) still has 7-int nodes.
  const first = levels[0];
  return Boolean(first && first.length === 7);
}

/**
 * Visits nodes depth first (children in x order), calling enter(node) then, after the
 * subtree, leave(node).  Iterative: real stacks can be hundreds of frames deep.
 * @param {FlameTree} tree
 */
export function walkTree(tree, enter, leave) {
  if (!tree.nodeCount) return;
  const stack = [0];
  const next = [0];
  enter(0);
  while (stack.length) {
    const top = stack.length - 1;
    const node = stack[top];
    const i = next[top]++;
    if (i < tree.childCount[node]) {
      const child = tree.firstChild[node] + i;
      enter(child);
      stack.push(child);
      next.push(0);
    } else {
      if (leave) leave(node);
      stack.pop();
      next.pop();
    }
  }
}

/**
 * One row per function.  `total` counts a function once per stack even when it recurses
 * (only its outermost frames add up), so it never exceeds the graph's total.
 * @param {FlameTree} tree
 * @returns {{name: string, self: number, total: number, selfLeft?: number,
 *   selfRight?: number, totalLeft?: number, totalRight?: number}[]}
 */
export function topTable(tree) {
  const rows = new Map();
  const onPath = new Int32Array(tree.names.length);
  const row = (nameIndex) => {
    let r = rows.get(nameIndex);
    if (!r) {
      r = { name: tree.names[nameIndex], self: 0, total: 0 };
      if (tree.diff) Object.assign(r, { selfLeft: 0, selfRight: 0, totalLeft: 0, totalRight: 0 });
      rows.set(nameIndex, r);
    }
    return r;
  };
  walkTree(
    tree,
    (node) => {
      if (node === 0) return; // the "total" root is not a function
      const k = tree.name[node];
      const r = row(k);
      r.self += tree.self[node];
      if (tree.diff) {
        r.selfLeft += tree.selfLeft[node];
        r.selfRight += tree.selfRight[node];
      }
      if (onPath[k] === 0) {
        r.total += tree.value[node];
        if (tree.diff) {
          r.totalLeft += tree.totalLeft[node];
          r.totalRight += tree.totalRight[node];
        }
      }
      onPath[k]++;
    },
    (node) => {
      if (node !== 0) onPath[tree.name[node]]--;
    },
  );
  return [...rows.values()];
}

/**
 * Folded stacks ("a;b;c 123" per line, root first, the "total" root left out) from self
 * values; for a diff, the comparison side.  This is what flamegraph.pl and Pyroscope read.
 * @param {FlameTree} tree
 * @returns {string}
 */
export function foldedText(tree) {
  const lines = [];
  const path = [];
  const selfOf = tree.diff ? tree.selfRight : tree.self;
  walkTree(
    tree,
    (node) => {
      if (node === 0) return;
      path.push(foldedFrame(tree.names[tree.name[node]]));
      if (selfOf[node] > 0) lines.push(`${path.join(";")} ${selfOf[node]}`);
    },
    (node) => {
      if (node !== 0) path.pop();
    },
  );
  return lines.length ? `${lines.join("\n")}\n` : "";
}

/**
 * A frame name as folded text can hold it, as the server writes it (formats/folded.py): ';'
 * separates frames and a line ends a stack, so ';' becomes ':' and a line break `\n`.
 * @param {string} name
 */
export function foldedFrame(name) {
  return String(name).replace(/;/g, ":").replace(/\r/g, "\\r").replace(/\n/g, "\\n");
}

/**
 * The package part of a function name, which picks its colour: Go
 * `github.com/x/y.(*T).Method` -> `github.com/x/y`; Python `json.decoder.JSONDecoder.decode`
 * -> `json.decoder` (module path, up to a class or the function).
 * @param {string} fname
 */
export function packageOf(fname) {
  const s = String(fname);
  const slash = s.lastIndexOf("/");
  if (slash >= 0) {
    const dot = s.indexOf(".", slash);
    return dot > 0 ? s.slice(0, dot) : s;
  }
  const parts = s.split(".");
  if (parts.length < 2) return s;
  const out = [];
  for (let i = 0; i < parts.length - 1; i++) {
    const part = parts[i];
    // A class or a Go receiver ends the module path.
    if (i > 0 && /^[A-Z(<*]/.test(part)) break;
    out.push(part);
  }
  return out.join(".") || s;
}

/** A 32-bit FNV-1a hash: the stable colour of a name, here and in the trace waterfall. */
export function fnv1a(text) {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

// Warm pastels as in Pyroscope's default palette: dark text stays readable on all of them.
const FRAME_PALETTE = [
  [223, 140, 100],
  [229, 168, 96],
  [226, 196, 104],
  [196, 205, 110],
  [158, 200, 120],
  [120, 196, 150],
  [110, 190, 190],
  [118, 172, 214],
  [142, 156, 222],
  [172, 146, 214],
  [206, 140, 196],
  [224, 138, 160],
  [200, 160, 130],
  [170, 186, 150],
  [140, 180, 200],
  [214, 178, 140],
];

/**
 * A frame's colour as [r, g, b], stable for its package across queries and page loads.
 * @param {string} fname
 */
export function packageColor(fname) {
  return FRAME_PALETTE[fnv1a(packageOf(fname)) % FRAME_PALETTE.length];
}

/**
 * How a node changed between baseline and comparison, each side normalised by its own total
 * (as Pyroscope does, so a longer comparison window does not make everything "grow"):
 * +1 = new or doubled and more, -1 = gone, 0 = same share.  NaN when absent on both sides.
 * @param {FlameTree} tree
 * @param {number} node
 */
export function diffChange(tree, node) {
  const l = tree.leftTotal ? tree.totalLeft[node] / tree.leftTotal : 0;
  const r = tree.rightTotal ? tree.totalRight[node] / tree.rightTotal : 0;
  return shareChange(l, r);
}

/** Relative change of a share `l` -> `r` (1 = +100%); Infinity for new, NaN for none. */
export function shareChange(l, r) {
  if (l === 0 && r === 0) return NaN;
  if (l === 0) return Infinity;
  return (r - l) / l;
}

/**
 * Diff colour as [r, g, b]: grey when the share is unchanged, towards red as it grew and
 * green as it shrank; saturated at +-100%.
 * @param {number} change from diffChange
 */
export function diffColor(change) {
  const grey = [206, 206, 206];
  if (Number.isNaN(change) || Math.abs(change) < 0.01) return grey;
  const target = change > 0 ? [232, 86, 76] : [76, 184, 96];
  // sqrt: small changes already show a tint, large ones saturate.
  const t = Math.sqrt(Math.min(1, Math.abs(change)));
  return grey.map((g, i) => Math.round(g + (target[i] - g) * t));
}
