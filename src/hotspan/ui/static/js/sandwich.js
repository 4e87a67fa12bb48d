// The sandwich view's data: for one function, the tree of its callers (who called it, and
// their callers, down to the root) and the tree of its callees (what it called), both rooted
// at the function, as Pyroscope, Grafana and speedscope draw them.  Each is a FlameTree
// (flametree.js), so FlameGraph draws it as it draws any profile.
//
// Recursion counts once: only a function's outermost frames on a stack are taken (inner ones
// are already inside the outer frame's subtree), so the root's value is the function's total
// as the top table gives it.

// One trie node's numbers: total, self, and for a diff the four per-side values.
const FIELDS = 6; // value, self, totalLeft, selfLeft, totalRight, selfRight

function trieNode(nameIndex) {
  return { name: nameIndex, vals: new Float64Array(FIELDS), children: new Map() };
}

function child(node, nameIndex) {
  let c = node.children.get(nameIndex);
  if (!c) {
    c = trieNode(nameIndex);
    node.children.set(nameIndex, c);
  }
  return c;
}

function add(target, tree, node, withSelf) {
  const v = target.vals;
  v[0] += tree.value[node];
  if (withSelf) v[1] += tree.self[node];
  if (tree.diff) {
    v[2] += tree.totalLeft[node];
    v[4] += tree.totalRight[node];
    if (withSelf) {
      v[3] += tree.selfLeft[node];
      v[5] += tree.selfRight[node];
    }
  }
}

/** The outermost frames of function `nameIndex` (none of their ancestors is the function). */
function outermost(tree, nameIndex) {
  const out = [];
  const inside = new Uint8Array(tree.nodeCount);
  for (let i = 1; i < tree.nodeCount; i++) {
    const p = tree.parent[i];
    const hit = tree.name[i] === nameIndex;
    if (hit && !inside[p]) out.push(i);
    inside[i] = hit || inside[p] ? 1 : 0;
  }
  return out;
}

/** Merges node's subtree under `target` (same shape, summed by name). */
function mergeSubtree(tree, node, target) {
  const stack = [[node, target]];
  while (stack.length) {
    const [n, t] = stack.pop();
    add(t, tree, n, true);
    const first = tree.firstChild[n];
    for (let c = first; c >= 0 && c < first + tree.childCount[n]; c++) {
      stack.push([c, child(t, tree.name[c])]);
    }
  }
}

/** A FlameTree from a trie; selfs are what the children do not cover. */
function fromTrie(root, tree) {
  // Breadth first, children sorted by name: levels come out in x order.
  const levels = [];
  let level = [{ t: root, x: 0, xl: 0, xr: 0, parent: -1 }];
  while (level.length) {
    levels.push(level);
    const next = [];
    for (const item of level) {
      let x = item.x;
      let xl = item.xl;
      let xr = item.xr;
      const kids = [...item.t.children.values()].sort((a, b) =>
        tree.names[a.name] < tree.names[b.name] ? -1 : tree.names[a.name] > tree.names[b.name] ? 1 : 0,
      );
      for (const k of kids) {
        next.push({ t: k, x, xl, xr, parentItem: item });
        x += k.vals[0];
        xl += k.vals[2];
        xr += k.vals[4];
      }
    }
    level = next;
  }
  const count = levels.reduce((n, l) => n + l.length, 0);
  const out = {
    names: tree.names,
    diff: tree.diff,
    maxDepth: Math.max(0, levels.length - 1),
    nodeCount: count,
    levelStart: new Int32Array(levels.length + 1),
    x: new Float64Array(count),
    value: new Float64Array(count),
    self: new Float64Array(count),
    name: new Int32Array(count),
    parent: new Int32Array(count).fill(-1),
    firstChild: new Int32Array(count).fill(-1),
    childCount: new Int32Array(count),
    depth: new Uint16Array(count),
    totalLeft: tree.diff ? new Float64Array(count) : null,
    selfLeft: tree.diff ? new Float64Array(count) : null,
    totalRight: tree.diff ? new Float64Array(count) : null,
    selfRight: tree.diff ? new Float64Array(count) : null,
  };
  let n = 0;
  levels.forEach((items, d) => {
    out.levelStart[d] = n;
    for (const item of items) {
      item.index = n;
      const v = item.t.vals;
      out.x[n] = item.x;
      out.value[n] = v[0];
      out.name[n] = item.t.name;
      out.depth[n] = d;
      if (item.parentItem) {
        const p = item.parentItem.index;
        out.parent[n] = p;
        if (out.firstChild[p] < 0) out.firstChild[p] = n;
        out.childCount[p]++;
      }
      if (tree.diff) {
        out.totalLeft[n] = v[2];
        out.totalRight[n] = v[4];
      }
      n++;
    }
  });
  out.levelStart[levels.length] = n;
  for (let i = 0; i < count; i++) {
    let covered = 0;
    let coveredL = 0;
    let coveredR = 0;
    for (let c = out.firstChild[i]; c >= 0 && c < out.firstChild[i] + out.childCount[i]; c++) {
      covered += out.value[c];
      if (tree.diff) {
        coveredL += out.totalLeft[c];
        coveredR += out.totalRight[c];
      }
    }
    out.self[i] = Math.max(0, out.value[i] - covered);
    if (tree.diff) {
      out.selfLeft[i] = Math.max(0, out.totalLeft[i] - coveredL);
      out.selfRight[i] = Math.max(0, out.totalRight[i] - coveredR);
    }
  }
  // Percentages stay of the whole profile, as in the main graph.
  out.total = tree.total;
  out.leftTotal = tree.leftTotal;
  out.rightTotal = tree.rightTotal;
  out.source = null;
  return out;
}

/**
 * The callers and callees of function `name` in `tree`, each a FlameTree rooted at the
 * function; null when the function is not in the tree.
 * @param {import("./flametree.js").FlameTree} tree
 * @param {string} name
 * @returns {{callers: Object, callees: Object, frames: number}|null}
 */
export function sandwich(tree, name) {
  const nameIndex = tree.names.indexOf(name);
  if (nameIndex <= 0) return null;
  const nodes = outermost(tree, nameIndex);
  if (!nodes.length) return null;
  const callees = trieNode(nameIndex);
  const callers = trieNode(nameIndex);
  for (const node of nodes) {
    mergeSubtree(tree, node, callees);
    // The path up to (not including) the "total" root, the function first.
    add(callers, tree, node, false);
    let t = callers;
    for (let p = tree.parent[node]; p > 0; p = tree.parent[p]) {
      t = child(t, tree.name[p]);
      add(t, tree, node, false);
    }
  }
  return { callers: fromTrie(callers, tree), callees: fromTrie(callees, tree), frames: nodes.length };
}
