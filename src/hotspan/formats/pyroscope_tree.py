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

from typing import Iterator, List, Sequence

from hotspan.formats.errors import FormatError
from hotspan.formats.folded import Stack
from hotspan.formats.protowire import read_uvarint, uvarint
from hotspan.model.profile import MAX_SAMPLE_VALUE, MAX_STACK_DEPTH

# The fewest bytes a node takes: a node cannot claim more children than the bytes after it hold.
MIN_NODE_BYTES = 3
# What a body may cost besides its folded text: the frames of its stacks (each stack's first
# MAX_STACK_DEPTH, what is stored), and its nesting (each open node is held meanwhile).
# 2M frames: eight times 10 s of a big service's stacks (5,000 of 50 frames), about a
# second of the server's CPU to store.
MAX_FRAMES = 1 << 21
MAX_OPEN_NODES = 1 << 16


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
    text: past ``max_folded_bytes`` of folded stacks it is refused."""
    if not data:
        return
    frames: List[str] = []  # the path's frames, below the virtual root
    open_nodes: List[
        List[int]
    ] = []  # per node whose children are being read: [left, len(frames) before it]
    budget, frame_budget = max_folded_bytes, MAX_FRAMES
    folded_length = 0  # of ";".join(frames)
    lengths: List[int] = []  # folded_length before each open node
    pos, end = 0, len(data)
    while True:
        length, pos = read_uvarint(data, pos)
        if length > end - pos:
            raise FormatError(f"tree: a name of {length} bytes runs past the end at byte {pos}")
        name = data[pos : pos + length]
        pos += length
        own, pos = read_uvarint(data, pos)
        children, pos = read_uvarint(data, pos)
        if own > MAX_SAMPLE_VALUE:
            raise FormatError(f"tree: the value {own} before byte {pos} is out of range")
        base, base_length = len(frames), folded_length
        if open_nodes:  # below the virtual root
            frames += [f for f in name.decode("utf-8", "replace").split(";") if f]
            folded_length += length + 1
            if own and frames:
                budget -= folded_length
                if budget < 0:
                    raise FormatError(
                        f"tree: its stacks come to more than {max_folded_bytes} bytes of "
                        "folded text"
                    )
                frame_budget -= min(len(frames), MAX_STACK_DEPTH)
                if frame_budget < 0:
                    raise FormatError(f"tree: its stacks hold more than {MAX_FRAMES} frames")
                yield list(frames), own
        if children:
            if children > (end - pos) // MIN_NODE_BYTES:
                raise FormatError(
                    f"tree: a node claims {children} children, more than the "
                    f"{end - pos} bytes after it can hold"
                )
            if len(open_nodes) >= MAX_OPEN_NODES:
                raise FormatError(f"tree: it nests deeper than {MAX_OPEN_NODES} nodes")
            open_nodes.append([children, base])
            lengths.append(base_length)
            continue
        del frames[base:]
        folded_length = base_length
        while open_nodes:
            parent = open_nodes[-1]
            parent[0] -= 1
            if parent[0]:
                break
            open_nodes.pop()
            del frames[parent[1] :]
            folded_length = lengths.pop()
        if not open_nodes:
            break
    if pos != end:
        raise FormatError(f"tree: {end - pos} bytes after the end of the tree")
