"""The call graph in DOT: each function's own and cumulative value (a recursive function's
stacks counted once), each call's value, the heaviest functions kept."""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import numpy as np

from hotspan.query import dot

NAMES = ["main", "work", "hash", "idle", "unused"]


def matrix(stacks: List[Tuple[List[str], int]]):  # type: ignore[no-untyped-def]
    depth = max(len(s) for s, _ in stacks)
    m = np.full((len(stacks), depth), -1, dtype=np.int64)
    for row, (frames, _) in enumerate(stacks):
        m[row, : len(frames)] = [NAMES.index(f) for f in frames]
    lengths = np.array([len(s) for s, _ in stacks])
    values = np.array([v for _, v in stacks])
    return m, lengths, values


def parse(text: str) -> Tuple[Dict[str, Tuple[str, str]], Dict[Tuple[str, str], str]]:
    """node name -> (flat, cum) texts; (caller, callee) -> value text."""
    ids: Dict[str, str] = {}
    nodes: Dict[str, Tuple[str, str]] = {}
    for node, name, flat, cum in re.findall(
        r'^(N\d+) \[label="([^\\"]+)\\n(\S+) \([\d.]+%\)\\nof (\S+) ', text, re.M
    ):
        ids[node] = name
        nodes[name] = (flat, cum)
    edges = {
        (ids[a], ids[b]): v
        for a, b, v in re.findall(r'^(N\d+) -> (N\d+) \[label=" (\S+)"', text, re.M)
    }
    return nodes, edges


def test_values_count_each_stack_once() -> None:
    stacks = [
        (["main", "work", "hash"], 30),
        (["main", "work"], 10),
        (["main", "idle"], 5),
        (["main", "work", "main", "work"], 2),  # recursion: still 2 for main and work
    ]
    text = dot.write(*matrix(stacks), NAMES, 100, "samples", "count")
    assert text.startswith('digraph "samples" {') and text.endswith("}\n")
    nodes, edges = parse(text)
    assert nodes == {
        "main": ("0", "47"),
        "work": ("12", "42"),
        "hash": ("30", "30"),
        "idle": ("5", "5"),
    }
    assert edges == {
        ("main", "work"): "42",
        ("work", "hash"): "30",
        ("main", "idle"): "5",
        ("work", "main"): "2",
    }
    assert "Showing nodes accounting for 47, 100.00% of 47 total" in text


def test_the_heaviest_functions_are_kept_and_units_read_as_people_read_them() -> None:
    stacks = [(["main", "work", "hash"], 3_000_000_000), (["main", "idle"], 1_500_000)]
    text = dot.write(*matrix(stacks), NAMES, 2, "cpu", "nanoseconds")
    nodes, edges = parse(text)
    # By cumulative value, then own: hash's own 3 s puts it before work (no edge between the
    # two kept).
    assert nodes == {"main": ("0ns", "3.00s"), "hash": ("3.00s", "3.00s")}
    assert edges == {}
    assert "Showing nodes accounting for 3.00s, 99.95% of 3.00s total" in text
    nodes, edges = parse(dot.write(*matrix(stacks), NAMES, 3, "cpu", "nanoseconds"))
    assert set(nodes) == {"main", "work", "hash"} and edges[("work", "hash")] == "3.00s"


def test_no_samples_is_an_empty_graph_and_names_are_quoted() -> None:
    assert dot.write(
        np.zeros((0, 0), dtype=np.int64), np.zeros(0), np.zeros(0), NAMES, 10, "x", ""
    ) == ('digraph "x" {\nnode [style=filled fillcolor="#f8f8f8"]\n}\n')
    names = ['say "hi"\\']
    text = dot.write(np.array([[0]]), np.array([1]), np.array([4]), names, 10, "x", "bytes")
    assert 'tooltip="say \\"hi\\"\\\\"' in text and "4B (100.00%)" in text


def test_control_characters_in_a_name_are_written_escaped() -> None:
    # A trie upload's frame may hold any character; a raw CR or NUL in a label is what a DOT
    # reader misreads (Graphviz reads "\r" as a right-justified line).
    names = ["a\x00b\rc\x7fd\te"]
    text = dot.write(np.array([[0]]), np.array([1]), np.array([4]), names, 10, "x", "bytes")
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", text)
    assert 'tooltip="a\\x00b\\x0dc\\x7fd\te"' in text
