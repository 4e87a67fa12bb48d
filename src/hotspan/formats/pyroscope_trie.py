"""Pyroscope's transport trie: the ``/ingest?format=trie`` bodies of its first agents (the
``pyroscope`` CLI's ``exec`` and ``connect``, and the clients built on them).

The trie holds folded stacks (``a;b;c``) with their prefixes shared: a node's name is a run of
bytes, not a frame, and a node's key is the names on its path joined as they are (a split may
fall inside a frame or at a ``;``).  Nodes are written depth first, each before its children::

    uvarint(len(name)) name-bytes uvarint(value) uvarint(number of children)

A node with a value is a stack with that many samples.  A trie ends where the bytes end:
Pyroscope reads on past the end of the first root, and so does this reader (each further root
starting a key of its own).
"""

from __future__ import annotations

from typing import Iterator, List

from hotspan.formats.errors import FormatError
from hotspan.formats.folded import Stack
from hotspan.formats.protowire import read_uvarint
from hotspan.model.profile import MAX_SAMPLE_VALUE, MAX_STACK_DEPTH

# The fewest bytes a node takes (an empty name, a value and a child count of one byte each):
# a node cannot claim more children than the bytes after it can hold.
MIN_NODE_BYTES = 3
# What a body may cost besides its folded text: the frames of its stacks (each stack's first
# MAX_STACK_DEPTH, what is stored), and its nesting (a node's children are read before its
# next sibling: each open node is held meanwhile).
# 2M frames: eight times 10 s of a big service's stacks (5,000 of 50 frames), about a
# second of the server's CPU to store.
MAX_FRAMES = 1 << 21
MAX_OPEN_NODES = 1 << 16


def parse(data: bytes, max_folded_bytes: int) -> Iterator[Stack]:
    """The trie's stacks, root frame first.  The keys share their prefixes, so a small trie
    can stand for far more text: past ``max_folded_bytes`` of folded keys it is refused."""
    key = bytearray()
    open_nodes: List[
        List[int]
    ] = []  # per node whose children are being read: [left, key length before it]
    budget, frame_budget = max_folded_bytes, MAX_FRAMES
    pos, end = 0, len(data)
    while pos < end:
        length, pos = read_uvarint(data, pos)
        if length > end - pos:
            raise FormatError(f"trie: a name of {length} bytes runs past the end at byte {pos}")
        base = len(key)
        key += data[pos : pos + length]
        pos += length
        value, pos = read_uvarint(data, pos)
        children, pos = read_uvarint(data, pos)
        if value > MAX_SAMPLE_VALUE:
            raise FormatError(f"trie: the value {value} before byte {pos} is out of range")
        if value:
            budget -= len(key) + 1
            if budget < 0:
                raise FormatError(
                    f"trie: its stacks come to more than {max_folded_bytes} bytes of folded text"
                )
            frames = [f for f in key.decode("utf-8", "replace").split(";") if f]
            if frames:
                frame_budget -= min(len(frames), MAX_STACK_DEPTH)
                if frame_budget < 0:
                    raise FormatError(f"trie: its stacks hold more than {MAX_FRAMES} frames")
                yield frames, value
        if children:
            if children > (end - pos) // MIN_NODE_BYTES:
                raise FormatError(
                    f"trie: a node claims {children} children, more than the "
                    f"{end - pos} bytes after it can hold"
                )
            if len(open_nodes) >= MAX_OPEN_NODES:
                raise FormatError(f"trie: it nests deeper than {MAX_OPEN_NODES} nodes")
            open_nodes.append([children, base])
            continue
        del key[base:]
        while open_nodes:
            parent = open_nodes[-1]
            parent[0] -= 1
            if parent[0]:
                break
            open_nodes.pop()
            del key[parent[1] :]
    if open_nodes:
        raise FormatError(f"trie: it ends with {open_nodes[-1][0]} children of a node unread")
