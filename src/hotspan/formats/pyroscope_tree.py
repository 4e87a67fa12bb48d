"""Pyroscope's serialized tree: the ``tree`` bytes of ``SelectMergeStacktraces`` with
``format=PROFILE_FORMAT_TREE`` (and of ``SelectMergeSpanProfile``).

The tree is written depth first, each node before its children, starting with a virtual root
whose children are the stacks' root frames.  A node is::

    uvarint(len(name)) name-bytes uvarint(self) uvarint(number of children)

and its children's subtrees follow it, one after the other.  A node's total is not written: a
reader adds up the self values below it.  The virtual root has an empty name and self 0.  A
tree without nodes is written as no bytes at all.
"""

from __future__ import annotations

from typing import List, Sequence

from hotspan.formats.protowire import uvarint


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
