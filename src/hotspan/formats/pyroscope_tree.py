"""Pyroscope's serialized tree: the ``tree`` bytes of ``SelectMergeStacktraces`` with
``format=PROFILE_FORMAT_TREE`` (and of ``SelectMergeSpanProfile``).

The tree is written depth first, each node before its children, starting with a virtual root
whose children are the stacks' root frames.  A node is::

    uvarint(len(name)) name-bytes uvarint(self) uvarint(number of children)

and its children's subtrees follow it, one after the other.  A node's total is not written: a
reader adds up the self values below it.  The virtual root has an empty name and self 0.  A
tree without nodes is written as no bytes at all.

The same bytes are an upload format too (``/ingest?format=tree``, Pyroscope's cloud agents):
:func:`parse` reads them as stacks.
"""

from __future__ import annotations

from typing import Iterator, List, Sequence, Tuple

from hotspan.formats.folded import Stack
from hotspan.formats.protowire import uvarint
from hotspan.formats.pyroscope_nodes import StackBudget, walk


def encode(
    names: Sequence[str],
    node_names: Sequence[int],
    node_self: Sequence[int],
    node_children: Sequence[int],
) -> bytes:
    """The nodes, given in depth-first order (a node, then its children's subtrees), as
    tree bytes.  ``node_names[i]`` indexes ``names``; nodes of depth 0 are the roots."""
    if not len(node_names):
        return b""
    name_blobs = []
    for text in names:
        raw = text.encode("utf-8", "replace")
        name_blobs.append(uvarint(len(raw)) + raw)
    small = [bytes((i,)) for i in range(0x80)]
    roots = 0
    # Roots are the nodes that are nobody's children: the virtual root's child count.
    pending = 0
    for count in node_children:
        if pending == 0:
            roots += 1
        else:
            pending -= 1
        pending += count
    parts: List[bytes] = [b"\x00\x00", uvarint(roots)]
    append = parts.append
    for name, own, count in zip(node_names, node_self, node_children):
        append(name_blobs[name])
        append(small[own] if own < 0x80 else uvarint(own))
        append(small[count] if count < 0x80 else uvarint(count))
    return b"".join(parts)


def parse(data: bytes, max_folded_bytes: int) -> Iterator[Stack]:
    """The tree's stacks, root frame first: each node with a self value is a stack of the
    names on its path (the virtual root's left out; a name holding ``;`` is split there, as
    Pyroscope folds it).  Nodes share their paths, so a small tree can stand for far more
    text: past ``max_folded_bytes`` of folded stacks (or the frames of :class:`StackBudget`)
    it is refused."""
    frames: List[str] = []  # the path's frames, below the virtual root
    ends: List[Tuple[int, int]] = []  # after each node of the path: (frames, folded length)
    budget = StackBudget("tree", max_folded_bytes)
    for depth, name, own in walk(data, "tree", one_root=True):
        count, length = ends[depth - 1] if depth else (0, 0)
        del frames[count:]
        del ends[depth:]
        if depth:  # below the virtual root
            frames += [f for f in name.decode("utf-8", "replace").split(";") if f]
            length += len(name) + 1
        ends.append((len(frames), length))
        if own and frames:
            budget.charge(length, len(frames))
            yield list(frames), own
