"""The vectorised flame graph builder against a plain tree walk."""

from __future__ import annotations

import random
from typing import Dict, List, Sequence, Tuple

import numpy as np
import pytest

from hotspan.query import flamegraph


def _matrix(stacks: Sequence[Tuple[int, ...]]):  # type: ignore[no-untyped-def]
    depth = max(len(s) for s in stacks)
    m = np.full((len(stacks), depth), -1, dtype=np.int32)
    for i, s in enumerate(stacks):
        m[i, : len(s)] = s
    return m, np.array([len(s) for s in stacks])


def reference_levels(stacks, values, names):  # type: ignore[no-untyped-def]
    """Pyroscope's layout by walking a dict tree: children by name, self on the right."""
    tree: Dict = {}
    for stack, value in zip(stacks, values):
        node = tree
        entry = None
        for name in stack:
            entry = node.setdefault(name, [0, 0, {}])
            entry[0] += value
            node = entry[2]
        entry[1] += value
    levels: List[List[Tuple[int, int, int, str]]] = []

    def walk(node, depth, x):  # type: ignore[no-untyped-def]
        for name in sorted(node, key=lambda n: names[n]):
            total, self_, children = node[name]
            while len(levels) <= depth:
                levels.append([])
            levels[depth].append((x, total, self_, names[name]))
            walk(children, depth + 1, x)
            x += total

    walk(tree, 0, 0)
    return levels


def decode(graph: flamegraph.FlameGraph, width: int = 4):  # type: ignore[no-untyped-def]
    out = []
    for level in graph.levels[1:]:
        x = 0
        row = []
        for node in level.reshape(-1, width):
            x += node[0]
            row.append((int(x), int(node[1]), int(node[2]), graph.names[node[-1]]))
            x += node[1]
        out.append(row)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_matches_tree_walk(seed: int) -> None:
    rng = random.Random(seed)
    names = [f"mod{i % 4}.fn{i}" for i in range(25)]
    stacks = [tuple(rng.randrange(25) for _ in range(rng.randint(1, 9))) for _ in range(400)]
    values = [rng.randint(1, 50) for _ in stacks]
    matrix, lengths = _matrix(stacks)
    graph = flamegraph.build(matrix, lengths, np.array(values), names)
    assert decode(graph) == reference_levels(stacks, values, names)
    assert graph.totals == [sum(values)]
    assert graph.levels[0].tolist() == [0, sum(values), 0, 0]
    assert graph.names[0] == "total"


def test_self_time_is_on_the_right_of_children() -> None:
    names = ["main", "child"]
    matrix, lengths = _matrix([(0,), (0, 1)])
    graph = flamegraph.build(matrix, lengths, np.array([3, 5]), names)
    # level 2: child starts where main starts; main's self (3) is after it.
    assert decode(graph) == [[(0, 8, 3, "main")], [(0, 5, 5, "child")]]
    assert graph.max_self == 5


def test_zero_values_and_empty_input() -> None:
    matrix, lengths = _matrix([(0,), (1,)])
    graph = flamegraph.build(matrix, lengths, np.array([0, 0]), ["a", "b"])
    assert graph.names == ["total"]
    assert graph.levels[0].tolist() == [0, 0, 0, 0]
    assert graph.totals == [0]


def test_max_nodes_folds_small_nodes_into_other() -> None:
    names = ["root"] + [f"leaf{i}" for i in range(50)]
    stacks = [(0, i + 1) for i in range(50)]
    values = [1000] + [1] * 49
    matrix, lengths = _matrix(stacks)
    graph = flamegraph.build(matrix, lengths, np.array(values), names, max_nodes=4)
    levels = decode(graph)
    leaf_names = [n[3] for n in levels[1]]
    assert "leaf0" in leaf_names and "other" in leaf_names
    other = [n for n in levels[1] if n[3] == "other"][0]
    assert other[1] == sum(values) - 1000 - sum(
        n[1] for n in levels[1] if n[3] not in ("leaf0", "other")
    )
    assert sum(len(level) for level in levels) + 1 <= 6
    assert graph.totals == [sum(values)]


def test_diff_has_two_value_columns() -> None:
    names = ["main", "old", "new"]
    matrix, lengths = _matrix([(0, 1), (0, 2), (0, 1)])
    values = np.array([[10, 0], [0, 0], [0, 4]])
    values[1] = [0, 6]
    graph = flamegraph.build(matrix, lengths, values, names)
    assert graph.totals == [10, 10]
    level2 = graph.levels[2].reshape(-1, 7)
    by_name = {graph.names[row[6]]: row[:6].tolist() for row in level2}
    # [x_left, total_left, self_left, x_right, total_right, self_right]
    assert by_name["new"] == [0, 0, 0, 0, 6, 6]
    assert by_name["old"][1:3] == [10, 10] and by_name["old"][4:6] == [4, 4]
