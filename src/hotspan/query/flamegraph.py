"""Flame graphs built with array operations instead of a Python tree walk.

The stacks of a query (root first, one row each, padded with -1) are sorted lexicographically.
After sorting, every node of the flame graph is a run of consecutive rows that share a prefix,
so each level is found with one vectorised comparison of neighbouring rows, node totals are
differences of a running sum, and a node's x position is the running sum at its first row.
That yields Pyroscope's level encoding directly: ``[x_delta, total, self, name]`` per node
(``[xl, totall, selfl, xr, totalr, selfr, name]`` for a diff, with one value column per side).

``max_nodes`` works as in Pyroscope: the smallest nodes are folded, per parent, into a node
named ``other``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from hotspan.formats import pyroscope_tree
from hotspan.model.stack_profile import StackProfile

TOTAL = "total"
OTHER = "other"
# Padding after the end of a stack.  It sorts after every name, so a node's self time comes
# after its children, on the right, as Pyroscope draws it.
_PAD = np.int64(1) << 62


@dataclass
class FlameGraph:
    names: List[str]
    levels: List[np.ndarray]  # per level: flat int64 array, (3 * columns + 1) ints per node
    totals: List[int]  # total per value column
    max_self: int


@dataclass
class _Level:
    x: np.ndarray  # (m, k) absolute x offsets
    total: np.ndarray  # (m, k)
    self_: np.ndarray  # (m, k)
    name: np.ndarray  # (m,) name ranks


def _prepare(
    stacks: np.ndarray,
    lengths: np.ndarray,
    values: np.ndarray,
    names: Sequence[str],
    max_nodes: Optional[int],
    pyroscope_ties: bool,
):
    """Rows ranked by name, sorted, with the smallest nodes folded into ``other``: returns
    (ranked, lengths, values, starts, names of the ranks, rank of ``other``, totals)."""
    values = np.asarray(values, dtype=np.int64)
    if values.ndim == 1:
        values = values[:, None]
    keep = values.any(axis=1) & (lengths > 0)
    stacks, lengths, values = stacks[keep], lengths[keep], values[keep]
    totals = values.sum(axis=0)

    # Ranks instead of raw indexes, so that siblings come out in name order as in Pyroscope.
    used = np.unique(stacks[stacks >= 0]) if stacks.size else np.zeros(0, dtype=np.int64)
    by_name = sorted(range(len(used)), key=lambda i: names[int(used[i])])
    out_names = [TOTAL] + [names[int(used[i])] for i in by_name] + [OTHER]
    rank = np.zeros(int(used.max()) + 1 if len(used) else 1, dtype=np.int64)
    rank[used[by_name]] = np.arange(1, len(used) + 1)
    ranked = np.where(stacks >= 0, rank[np.maximum(stacks, 0)], _PAD)
    other_rank = len(out_names) - 1

    ranked, lengths, values = _sort(ranked, lengths, values)
    starts = _boundaries(ranked)
    # A flame graph's root counts as one of its nodes; a tree has no such node.
    nodes = int((starts & (ranked != _PAD)).sum()) + (0 if pyroscope_ties else 1)
    if max_nodes and 0 < max_nodes < nodes:
        folded = _fold_small(ranked, lengths, values, starts, max_nodes, other_rank, pyroscope_ties)
        if folded is not None:
            # Folding moves "other" after its siblings: sort again (the only second sort).
            ranked, lengths, values = _sort(folded[0], folded[1], values)
            starts = _boundaries(ranked)
    return ranked, lengths, values, starts, out_names, other_rank, totals


def build(
    stacks: np.ndarray,
    lengths: np.ndarray,
    values: np.ndarray,
    names: Sequence[str],
    max_nodes: Optional[int] = None,
) -> FlameGraph:
    """``stacks``: (n, depth) name indexes into ``names``, root first, -1 padded;
    ``values``: (n,) or (n, k) non-negative sample values."""
    ranked, lengths, values, starts, out_names, other_rank, totals = _prepare(
        stacks, lengths, values, names, max_nodes, False
    )
    k = values.shape[1]
    levels = _levels(ranked, lengths, values, starts)

    root = np.concatenate([[0, int(t), 0] for t in totals] + [[0]]).astype(np.int64)
    encoded = [root]
    max_self = 0
    for lv in levels:
        prev_end = np.concatenate([np.zeros((1, k), dtype=np.int64), (lv.x + lv.total)[:-1]])
        # The first node of a level is relative to 0, the others to the end of their neighbour.
        delta = lv.x - prev_end
        cols = []
        for j in range(k):
            cols += [delta[:, j], lv.total[:, j], lv.self_[:, j]]
        cols.append(lv.name)
        encoded.append(np.stack(cols, axis=1).reshape(-1).astype(np.int64))
        if len(lv.self_):
            max_self = max(max_self, int(lv.self_.max()))
    if not (ranked == other_rank).any():
        out_names.pop()
    return FlameGraph(out_names, encoded, [int(t) for t in totals], max_self)


def stack_matrix(
    stacks: Sequence[Tuple[Sequence[str], Sequence[int]]],
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, List[str]]:
    """What :func:`build` takes, from (frame names root first, values) pairs: name-index rows
    (-1 padded), their lengths, the values and the names."""
    index: Dict[str, int] = {}
    depth = max((len(s) for s, _ in stacks), default=0)
    matrix = np.full((len(stacks), depth), -1, dtype=np.int64)
    lengths = np.zeros(len(stacks), dtype=np.int64)
    width = len(stacks[0][1]) if stacks else 1
    values = np.zeros((len(stacks), width), dtype=np.int64)
    for row, (names, vals) in enumerate(stacks):
        matrix[row, : len(names)] = [index.setdefault(n, len(index)) for n in names]
        lengths[row] = len(names)
        values[row] = vals
    return matrix, lengths, values, list(index)


def profile_stacks(profile: StackProfile, position: int) -> List[Tuple[Tuple[str, ...], int]]:
    """One sample type of a profile as (frame names root first, value) pairs."""
    return [(tuple(f.name for f in stack), value) for stack, value in profile.values(position)]


def of_profile(profile: StackProfile, position: int, max_nodes: Optional[int] = None) -> FlameGraph:
    """One sample type of a profile (a file's, not the store's) as a flame graph."""
    stacks = [(names, [value]) for names, value in profile_stacks(profile, position)]
    return build(*stack_matrix(stacks), max_nodes)


def tree_bytes(
    stacks: np.ndarray,
    lengths: np.ndarray,
    values: np.ndarray,
    names: Sequence[str],
    max_nodes: Optional[int] = None,
) -> bytes:
    """The stacks as Pyroscope's serialized tree (:mod:`hotspan.formats.pyroscope_tree`).
    As Pyroscope truncates a tree: when it has over ``max_nodes`` nodes, those lighter than
    the ``max_nodes``-th heaviest are folded, per parent, into a node named ``other``."""
    ranked, lengths, values, starts, out_names, _, _ = _prepare(
        stacks, lengths, values, names, max_nodes, True
    )
    n = len(ranked)
    if n == 0:
        return b""
    weight = values[:, 0]
    firsts, depths, own, name_ranks, children = [], [], [], [], []
    prev: Optional[Tuple[np.ndarray, np.ndarray]] = None
    for d in range(ranked.shape[1]):
        group_first = np.flatnonzero(starts[:, d])
        group_last = np.append(group_first[1:], n)
        real = ranked[group_first, d] != _PAD
        first, last = group_first[real], group_last[real]
        if len(first) == 0:
            break
        ends_here = np.concatenate([[0], np.cumsum(np.where(lengths == d + 1, weight, 0))])
        own.append(ends_here[last] - ends_here[first])
        firsts.append(first)
        depths.append(np.full(len(first), d, dtype=np.int64))
        name_ranks.append(ranked[first, d])
        if prev is not None:
            children.append(_child_counts(prev[0], prev[1], first))
        prev = (first, last)
    if prev is not None:
        children.append(np.zeros(len(prev[0]), dtype=np.int64))
    first_all = np.concatenate(firsts)
    depth_all = np.concatenate(depths)
    order = np.lexsort((depth_all, first_all))
    return pyroscope_tree.encode(
        out_names,
        np.concatenate(name_ranks)[order].tolist(),
        np.concatenate(own)[order].tolist(),
        np.concatenate(children)[order].tolist(),
    )


def _child_counts(first: np.ndarray, last: np.ndarray, child_first: np.ndarray) -> np.ndarray:
    """How many of the nodes one level down (by first row) start within each [first, last)."""
    return np.searchsorted(child_first, last) - np.searchsorted(child_first, first)


def truncated_stacks(
    stacks: np.ndarray,
    lengths: np.ndarray,
    values: np.ndarray,
    max_nodes: int,
    other: int,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stacks of ids (root first, -1 padded) cut as Pyroscope cuts a profile to ``max_nodes``
    nodes: in the tree of the stacks, every node lighter than the ``max_nodes``-th heaviest
    (with its subtree) becomes the id ``other`` under its parent.  Identical stacks are then
    merged, so the values' total is unchanged.  Returns (stacks, lengths, values)."""
    values = np.asarray(values, dtype=np.int64)
    keep = (values != 0) & (lengths > 0)
    stacks, lengths, values = stacks[keep], lengths[keep], values[keep][:, None]
    ranked = np.where(stacks >= 0, stacks.astype(np.int64), _PAD)
    ranked, lengths, values = _sort(ranked, lengths, values)
    starts = _boundaries(ranked)
    folded = _fold_small(ranked, lengths, values, starts, max_nodes, other, True)
    if folded is not None:
        ranked, lengths = folded
    out = np.where(ranked == _PAD, -1, ranked)
    if len(out) == 0:
        return out, lengths, values[:, 0]
    unique, inverse = np.unique(out, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    sums = np.zeros(len(unique), dtype=np.int64)
    np.add.at(sums, inverse, values[:, 0])
    unique_lengths = np.zeros(len(unique), dtype=np.int64)
    unique_lengths[inverse] = lengths
    return unique, unique_lengths, sums


def _sort(ranked: np.ndarray, lengths: np.ndarray, values: np.ndarray):
    if len(ranked) == 0:
        return ranked, lengths, values
    order = np.lexsort(ranked.T[::-1]) if ranked.shape[1] else np.arange(len(ranked))
    return ranked[order], lengths[order], values[order]


def _boundaries(ranked: np.ndarray) -> np.ndarray:
    """(n, depth) bool: row i starts a new group of shared prefix at depth d."""
    n, depth = ranked.shape
    starts = np.ones((n, depth), dtype=bool)
    if n > 1 and depth:
        starts[1:] = np.logical_or.accumulate(ranked[1:] != ranked[:-1], axis=1)
    return starts


def _levels(
    ranked: np.ndarray, lengths: np.ndarray, values: np.ndarray, starts: np.ndarray
) -> List[_Level]:
    """Nodes per depth from sorted rows and their group boundaries."""
    n = len(ranked)
    k = values.shape[1]
    if n == 0:
        return []
    depth = ranked.shape[1]
    csum = np.zeros((n + 1, k), dtype=np.int64)
    np.cumsum(values, axis=0, out=csum[1:])
    out = []
    for d in range(depth):
        first = np.flatnonzero(starts[:, d])
        last = np.append(first[1:], n)
        real = ranked[first, d] != _PAD
        first, last = first[real], last[real]
        if len(first) == 0:
            break
        ends_here = (lengths == d + 1)[:, None]
        self_sum = np.zeros((n + 1, k), dtype=np.int64)
        np.cumsum(values * ends_here, axis=0, out=self_sum[1:])
        out.append(
            _Level(
                x=csum[first],
                total=csum[last] - csum[first],
                self_=self_sum[last] - self_sum[first],
                name=ranked[first, d],
            )
        )
    return out


def _fold_small(
    ranked: np.ndarray,
    lengths: np.ndarray,
    values: np.ndarray,
    starts: np.ndarray,
    max_nodes: int,
    other_rank: int,
    pyroscope_ties: bool = False,
):
    """Replace every node too small to be among the ``max_nodes`` largest (and its subtree)
    by ``other`` under its parent.  Takes sorted rows; returns (ranked, lengths), unsorted,
    or None when the rows have no more than ``max_nodes`` nodes.

    A flame graph counts its root among the nodes and keeps only nodes heavier than the
    first one that does not fit, so that ties at the boundary cannot push the count over the
    limit.  With ``pyroscope_ties`` (trees and pprof, as Pyroscope truncates them) the root
    is not counted and nodes as heavy as the ``max_nodes``-th heaviest are kept."""
    weight = values.sum(axis=1)
    n, depth = ranked.shape
    csum = np.concatenate([[0], np.cumsum(weight)])
    node_weight = np.zeros((n, depth), dtype=np.int64)
    all_weights = []
    for d in range(depth):
        first = np.flatnonzero(starts[:, d])
        last = np.append(first[1:], n)
        group_total = csum[last] - csum[first]
        node_weight[:, d] = group_total[np.cumsum(starts[:, d]) - 1]
        all_weights.append(group_total[ranked[first, d] != _PAD])
    weights = np.sort(np.concatenate(all_weights) if all_weights else np.zeros(0, np.int64))
    weights = weights[::-1]
    if pyroscope_ties:
        if len(weights) <= max_nodes:
            return None
        threshold = weights[max_nodes - 1]
    else:
        if len(weights) + 1 <= max_nodes:
            return None
        keep = max(max_nodes - 1, 1)  # the root counts too
        threshold = weights[keep] + 1 if len(weights) > keep else 0
    cols = np.arange(depth)
    small = (node_weight < threshold) & (cols[None, :] < lengths[:, None])
    cut_rows = np.flatnonzero(small.any(axis=1))
    first_cut = small[cut_rows].argmax(axis=1)
    ranked = ranked.copy()
    lengths = lengths.copy()
    ranked[cut_rows, first_cut] = other_rank
    after = cols[None, :] > first_cut[:, None]
    sub = ranked[cut_rows]
    sub[after] = _PAD
    ranked[cut_rows] = sub
    lengths[cut_rows] = first_cut + 1
    return ranked, lengths


def to_message(graph: FlameGraph, out) -> None:
    """Fills ``out``, a querier ``FlameGraph`` or (for a graph of two sides) ``FlameGraphDiff``
    message: what the querier answers and what the standalone page (ui/standalone.py)
    embeds."""
    out.names.extend(graph.names)
    for level in graph.levels:
        out.levels.add().values.extend(level.tolist())
    out.total = int(sum(graph.totals))
    if len(graph.totals) == 2:
        out.leftTicks, out.rightTicks = graph.totals
    out.max_self = graph.max_self
