"""The node layout Pyroscope's trie and tree share, read: nodes depth first, each before its
children's subtrees, each::

    uvarint(len(name)) name-bytes uvarint(value) uvarint(number of children)

:func:`walk` gives each node with its depth and checks what every body must hold;
:class:`StackBudget` bounds what a body stands for, since nodes share their paths and a small
body can stand for far more text than it holds (folded and ``lines`` text is bounded by the
same frames: a small gzipped body can hold millions of lines).
"""

from __future__ import annotations

from typing import Iterator, List, Tuple

from hotspan.formats.errors import FormatError
from hotspan.formats.protowire import read_uvarint
from hotspan.model.profile import MAX_SAMPLE_VALUE, MAX_STACK_DEPTH

# The fewest bytes a node takes (an empty name, a value and a child count of one byte each):
# a node cannot claim more children than the bytes after it can hold.
MIN_NODE_BYTES = 3
# What a body may cost besides its folded text: the frames of its stacks (each stack's first
# MAX_STACK_DEPTH, what is stored), and its nesting (a node's children are read before its
# next sibling: each open node is held meanwhile).
# 2M frames: eight times 10 s of a big service's stacks (5,000 of 50 frames), about a
# second of the server's CPU to store.  Nodes are bounded alike: a node is on the path of at
# least one stack, but one of value 0 charges no frame (a body of empty roots would be read
# for nothing, 44M of them in 130 KB gzipped).
MAX_FRAMES = 1 << 21
MAX_OPEN_NODES = 1 << 16


def walk(data: bytes, what: str, one_root: bool) -> Iterator[Tuple[int, bytes, int]]:
    """(depth, name, value) of each node, in the order written; FormatError (its message
    starting with ``what``) for a body cut short or claiming more than it holds.  With
    ``one_root`` the body is one root's subtree and nothing after it (a tree); else roots
    follow one another to the end of the bytes (a trie, as Pyroscope reads one)."""
    left: List[int] = []  # per open node: its children still to read
    pos, end = 0, len(data)
    nodes = 0
    while pos < end or (one_root and left):
        nodes += 1
        if nodes > MAX_FRAMES:
            raise FormatError(f"{what}: it holds more than {MAX_FRAMES} nodes")
        length, pos = read_uvarint(data, pos)
        if length > end - pos:
            raise FormatError(f"{what}: a name of {length} bytes runs past the end at byte {pos}")
        name = data[pos : pos + length]
        pos += length
        value, pos = read_uvarint(data, pos)
        children, pos = read_uvarint(data, pos)
        if value > MAX_SAMPLE_VALUE:
            raise FormatError(f"{what}: the value {value} before byte {pos} is out of range")
        yield len(left), name, value
        if children:
            if children > (end - pos) // MIN_NODE_BYTES:
                raise FormatError(
                    f"{what}: a node claims {children} children, more than the "
                    f"{end - pos} bytes after it can hold"
                )
            if len(left) >= MAX_OPEN_NODES:
                raise FormatError(f"{what}: it nests deeper than {MAX_OPEN_NODES} nodes")
            # Each child is a node: a claim past the bound is refused before its children
            # are read one by one (a root with millions of empty children).
            if nodes + children > MAX_FRAMES:
                raise FormatError(f"{what}: it holds more than {MAX_FRAMES} nodes")
            left.append(children)
            continue
        while left:
            left[-1] -= 1
            if left[-1]:
                break
            left.pop()
        if one_root and not left:
            break
    if left:
        raise FormatError(f"{what}: it ends with {left[-1]} children of a node unread")
    if pos != end:
        raise FormatError(f"{what}: {end - pos} bytes after the end of the {what}")


class StackBudget:
    """What the stacks of one body may come to: ``max_folded_bytes`` of folded text and
    MAX_FRAMES frames."""

    def __init__(self, what: str, max_folded_bytes: int) -> None:
        self.what = what
        self.max_folded_bytes = max_folded_bytes
        self.folded = max_folded_bytes
        self.frames = MAX_FRAMES

    def charge(self, folded_bytes: int, frames: int) -> None:
        """Charge one stack: its folded text's bytes and its frames."""
        self.folded -= folded_bytes
        if self.folded < 0:
            raise FormatError(
                f"{self.what}: its stacks come to more than {self.max_folded_bytes} bytes of "
                "folded text"
            )
        self.frames -= min(frames, MAX_STACK_DEPTH)
        if self.frames < 0:
            raise FormatError(f"{self.what}: its stacks hold more than {MAX_FRAMES} frames")
