"""Pyroscope's serialized tree and its truncation, from arrays of stacks, checked against a
decoder written from the format's description and a plain dict-of-paths model of the tree."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Tuple

import numpy as np

from hotspan.query import flamegraph
from tests.server.pyroscope.test_querier_pyroscope_compat import decode_tree

Stacks = Dict[Tuple[str, ...], int]


def arrays(stacks: Stacks, names: List[str]):  # type: ignore[no-untyped-def]
    index = {n: i for i, n in enumerate(names)}
    depth = max(len(s) for s in stacks)
    matrix = np.full((len(stacks), depth), -1, dtype=np.int64)
    for row, stack in enumerate(stacks):
        matrix[row, : len(stack)] = [index[n] for n in stack]
    lengths = np.array([len(s) for s in stacks])
    return matrix, lengths, np.array(list(stacks.values()), dtype=np.int64)


def node_totals(stacks: Stacks) -> Dict[Tuple[str, ...], int]:
    totals: Dict[Tuple[str, ...], int] = defaultdict(int)
    for stack, value in stacks.items():
        for d in range(1, len(stack) + 1):
            totals[stack[:d]] += value
    return totals


def pyroscope_truncation(stacks: Stacks, max_nodes: int) -> Stacks:
    """What Pyroscope's tree truncation keeps: nodes at least as heavy as the max_nodes-th
    heaviest; the rest of each parent's children are one "other" leaf under it."""
    totals = node_totals(stacks)
    if len(totals) <= max_nodes:
        return dict(stacks)
    threshold = sorted(totals.values(), reverse=True)[max_nodes - 1]
    out: Stacks = defaultdict(int)
    for stack, value in stacks.items():
        cut = next((d for d in range(1, len(stack) + 1) if totals[stack[:d]] < threshold), None)
        out[stack if cut is None else stack[: cut - 1] + ("other",)] += value
    return dict(out)


def random_stacks(rng: np.random.Generator, names: List[str], n: int) -> Stacks:
    stacks: Stacks = defaultdict(int)
    for _ in range(n):
        depth = int(rng.integers(1, 7))
        stack = tuple(names[int(i)] for i in rng.integers(0, 6, size=depth))
        stacks[stack] += int(rng.integers(1, 1 << int(rng.integers(1, 40))))
    return dict(stacks)


def test_tree_bytes_round_trip_and_truncate_as_pyroscope() -> None:
    names = ["main", "handle", "rénder", "db.query", "json", "gc"]
    rng = np.random.default_rng(7)
    for _ in range(40):
        stacks = random_stacks(rng, names, int(rng.integers(1, 200)))
        matrix, lengths, values = arrays(stacks, names)
        assert decode_tree(flamegraph.tree_bytes(matrix, lengths, values, names)) == stacks
        for max_nodes in (1, 2, 5, 17, 64):
            data = flamegraph.tree_bytes(matrix, lengths, values, names, max_nodes)
            got = decode_tree(data)
            assert got == pyroscope_truncation(stacks, max_nodes)
            assert sum(got.values()) == sum(stacks.values())


def test_truncated_stacks_keep_the_total_and_cut_at_the_leaf() -> None:
    names = [f"f{i}" for i in range(6)]
    rng = np.random.default_rng(11)
    for _ in range(40):
        stacks = random_stacks(rng, names, int(rng.integers(1, 200)))
        matrix, lengths, values = arrays(stacks, names)
        other = len(names)
        for max_nodes in (1, 3, 10, 50):
            cut, cut_lengths, cut_values = flamegraph.truncated_stacks(
                matrix, lengths, values, max_nodes, other
            )
            got: Stacks = defaultdict(int)
            for row, length, value in zip(cut.tolist(), cut_lengths.tolist(), cut_values):
                got[tuple("other" if f == other else names[f] for f in row[:length])] += value
            assert dict(got) == pyroscope_truncation(stacks, max_nodes)
            # Merged: one sample per distinct stack.
            assert len(got) == len(cut)


def test_empty_tree_is_no_bytes() -> None:
    empty = np.zeros((0, 0), dtype=np.int64)
    assert flamegraph.tree_bytes(empty, np.zeros(0, np.int64), np.zeros(0, np.int64), []) == b""
