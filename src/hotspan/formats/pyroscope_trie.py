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

from hotspan.formats.folded import Stack
from hotspan.formats.pyroscope_nodes import StackBudget, walk


def parse(data: bytes, max_folded_bytes: int) -> Iterator[Stack]:
    """The trie's stacks, root frame first.  The keys share their prefixes, so a small trie
    can stand for far more text: past ``max_folded_bytes`` of folded keys (or the frames of
    :class:`StackBudget`) it is refused."""
    key = bytearray()
    ends: List[int] = []  # the key's length after each node of the path
    budget = StackBudget("trie", max_folded_bytes)
    for depth, name, value in walk(data, "trie", one_root=False):
        del key[ends[depth - 1] if depth else 0 :]
        del ends[depth:]
        key += name
        ends.append(len(key))
        if value:
            frames = [f for f in key.decode("utf-8", "replace").split(";") if f]
            budget.charge(len(key) + 1, len(frames))
            if frames:
                yield frames, value
