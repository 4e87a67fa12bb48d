"""A profile as a call graph in Graphviz's DOT language, the shape ``go tool pprof -dot``
draws and Pyroscope's ``/render?format=dot`` answers (Grafana's "Explain flame graph" hands
it to a language model): a box per function with its own and its cumulative value, an edge
per call with the value that went through it, the ``max_nodes`` heaviest functions kept.

A function's cumulative value counts each stack once, however often the function recurs in
it; so does an edge's.
"""

from __future__ import annotations

import re
from typing import List, Sequence

import numpy as np

_PAD = -1
# What a label may not hold raw: control characters but the tab (a newline is escaped).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f]")


def _unit_text(value: float, unit: str) -> str:
    if unit == "nanoseconds":
        for scale, suffix in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
            if value >= scale:
                return f"{value / scale:.2f}{suffix}"
        return f"{int(value)}ns"
    if unit == "bytes":
        for scale, suffix in ((2**30, "GB"), (2**20, "MB"), (2**10, "kB")):
            if value >= scale:
                return f"{value / scale:.2f}{suffix}"
        return f"{int(value)}B"
    return f"{int(value)}"


def _quote(text: str) -> str:
    # Control characters (a trie's frame may hold any) as Graphviz would only misread them.
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text) + '"'


def _once_per_stack(
    rows: np.ndarray, keys: np.ndarray, values: np.ndarray, size: int
) -> np.ndarray:
    """The sum over stacks of ``values`` per key, each (stack, key) pair counted once."""
    if not len(keys):
        return np.zeros(size, dtype=np.int64)
    pairs = np.unique(np.stack([rows, keys], axis=1), axis=0)
    return np.bincount(pairs[:, 1], weights=values[pairs[:, 0]], minlength=size).astype(np.int64)


def write(
    matrix: np.ndarray,
    lengths: np.ndarray,
    values: np.ndarray,
    names: Sequence[str],
    max_nodes: int,
    sample_type: str,
    unit: str,
) -> str:
    """``matrix``: (n, depth) root-first indexes into ``names``, -1 padded; ``values``: (n,)."""
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    total = int(values.sum())
    lines: List[str] = [
        f"digraph {_quote(sample_type)} {{",
        'node [style=filled fillcolor="#f8f8f8"]',
    ]
    if not len(values) or total <= 0:
        lines.append("}")
        return "\n".join(lines) + "\n"
    n, depth = matrix.shape
    valid = matrix != _PAD
    # Names as indexes of their own, 0..size-1, over the names these stacks use.
    used, local = np.unique(matrix[valid], return_inverse=True)
    size = len(used)
    ids = np.full(matrix.shape, _PAD, dtype=np.int64)
    ids[valid] = local
    rows = np.broadcast_to(np.arange(n)[:, None], (n, depth))
    cum = _once_per_stack(rows[valid], ids[valid], values, size)
    has = lengths > 0
    leaf = ids[np.arange(n)[has], lengths[has] - 1]
    flat = np.bincount(leaf, weights=values[has], minlength=size).astype(np.int64)
    # The heaviest functions by cumulative value, then by their own.
    order = np.lexsort((-flat, -cum))
    kept = [int(i) for i in order[: max(1, max_nodes)] if cum[i] > 0]
    shown = int(flat[kept].sum())
    label = (
        f"Type: {sample_type}\\lShowing nodes accounting for {_unit_text(shown, unit)}, "
        f"{100 * shown / total:.2f}% of {_unit_text(total, unit)} total\\l"
    )
    lines.append(
        f'subgraph cluster_L {{ {_quote(sample_type)} [shape=box fontsize=16 label="{label}"] }}'
    )
    node_id = {name: i + 1 for i, name in enumerate(kept)}
    top = max(int(cum[kept].max()), 1)
    for name in kept:
        text = (
            f"{names[int(used[name])]}\n"
            f"{_unit_text(flat[name], unit)} ({100 * flat[name] / total:.2f}%)\n"
            f"of {_unit_text(cum[name], unit)} ({100 * cum[name] / total:.2f}%)"
        )
        lines.append(
            f'N{node_id[name]} [label={_quote(text)} id="node{node_id[name]}" '
            f"fontsize={8 + int(42 * flat[name] / top)} shape=box "
            f"tooltip={_quote(names[int(used[name])])}]"
        )
    if depth > 1:
        both = ids[:, 1:] != _PAD
        calls = np.stack([rows[:, 1:][both], ids[:, :-1][both], ids[:, 1:][both]], axis=1)
        calls = np.unique(calls, axis=0)  # each call once per stack
        edges, inverse = np.unique(calls[:, 1:], axis=0, return_inverse=True)
        weights = np.bincount(inverse.reshape(-1), weights=values[calls[:, 0]])
        for (caller, callee), weight in zip(edges.tolist(), weights.tolist()):
            if caller in node_id and callee in node_id and caller != callee:
                lines.append(
                    f"N{node_id[caller]} -> N{node_id[callee]} "
                    f'[label=" {_unit_text(weight, unit)}" '
                    f"weight={max(1, int(100 * weight / total))} "
                    f"penwidth={1 + int(5 * weight / top)}]"
                )
    lines.append("}")
    return "\n".join(lines) + "\n"
