"""Pyroscope's binary upload formats, ``trie`` and ``tree``: the stacks they hold, and the
bodies that must be refused (cut short, claiming more than they carry, or standing for far more
text than any body may)."""

from __future__ import annotations

import random
from typing import Dict, List, Tuple

import pytest

from hotspan.formats import folded as folded_text
from hotspan.formats import pyroscope_nodes, pyroscope_tree, pyroscope_trie
from hotspan.formats.errors import FormatError
from hotspan.formats.protowire import read_uvarint, uvarint

LIMIT = 128 * 2**20


def folded(stacks) -> Dict[str, int]:  # type: ignore[no-untyped-def]
    out: Dict[str, int] = {}
    for frames, value in stacks:
        key = ";".join(frames)
        out[key] = out.get(key, 0) + value
    return out


# A trie node as the Go agents build one: [name bytes, value, children].
Node = List[object]


def trie_of(stacks: Dict[str, int]) -> bytes:
    """The stacks as a transport trie, built as its agents build it: each key inserted byte by
    byte, a node split where a new key leaves it, so that names fall inside frames."""
    root: Node = [b"", 0, []]
    for key, value in stacks.items():
        rest, node = key.encode(), root
        while True:
            children: List[Node] = node[2]  # type: ignore[assignment]
            for child in children:
                name: bytes = child[0]  # type: ignore[assignment]
                common = 0
                while common < min(len(name), len(rest)) and name[common] == rest[common]:
                    common += 1
                if not common:
                    continue
                if common < len(name):  # split the child where the key leaves it
                    child[:] = [name[:common], 0, [[name[common:], child[1], child[2]]]]
                node, rest = child, rest[common:]
                break
            else:
                children.append([rest, 0, []])
                node, rest = children[-1], b""
            if not rest:
                node[1] = value
                break
    out = bytearray()
    todo = [root]
    while todo:
        name, value, children = todo.pop()
        out += uvarint(len(name)) + name + uvarint(value) + uvarint(len(children))
        todo.extend(reversed(children))
    return bytes(out)


def tree_of(stacks: Dict[str, int]) -> bytes:
    """The stacks as a serialized tree: one node per frame, under a virtual root."""
    root: Dict[str, list] = {}
    for key, value in stacks.items():
        level = root
        entry = None
        for frame in key.split(";"):
            entry = level.setdefault(frame, [0, {}])
            level = entry[1]
        assert entry is not None
        entry[0] += value
    out = bytearray(b"\x00\x00" + uvarint(len(root)))
    todo: List[Tuple[str, list]] = list(reversed(root.items()))
    while todo:
        name, (own, children) = todo.pop()
        raw = name.encode()
        out += uvarint(len(raw)) + raw + uvarint(own) + uvarint(len(children))
        todo.extend(reversed(children.items()))
    return bytes(out)


STACKS = {
    "main;checkout;tax": 30,
    "main;checkout": 10,
    "main;checkout_v2;taxes": 7,
    "main;idle": 5,
    "main;cache.get;dict": 1,
    "worker;ünïcode;frame": 2,
    "x": 3,
}


def test_the_formats_own_examples() -> None:
    # The bytes Pyroscope's own tests describe: abc=1, abd=2 in a trie; a;b=1, a;c=2 in a tree.
    trie = b"\x00\x00\x01\x02ab\x00\x02\x01c\x01\x00\x01d\x02\x00"
    assert folded(pyroscope_trie.parse(trie, LIMIT)) == {"abc": 1, "abd": 2}
    tree = b"\x00\x00\x01\x01a\x00\x02\x01b\x01\x00\x01c\x02\x00"
    assert folded(pyroscope_tree.parse(tree, LIMIT)) == {"a;b": 1, "a;c": 2}


def test_a_trie_splits_inside_frames_and_at_separators() -> None:
    data = trie_of(STACKS)
    assert b"checkout;tax" not in data  # prefixes are shared: "checkout" is written once
    assert folded(pyroscope_trie.parse(data, LIMIT)) == STACKS


def test_a_tree_gives_each_frame_its_node() -> None:
    assert folded(pyroscope_tree.parse(tree_of(STACKS), LIMIT)) == STACKS
    # hotspan's own tree writer (the querier's answers) is read back the same way.
    names = ["main", "a", "b"]
    data = pyroscope_tree.encode(names, [0, 1, 2], [0, 4, 6], [1, 1, 0])
    assert folded(pyroscope_tree.parse(data, LIMIT)) == {"main;a": 4, "main;a;b": 6}


def test_random_stacks_round_trip() -> None:
    rng = random.Random(7)
    frames = ["f", "fo", "foo", "foo;bar", "b", "ba", "bar", "é"]
    for _ in range(50):
        stacks: Dict[str, int] = {}
        for _ in range(rng.randrange(1, 40)):
            key = ";".join(rng.choice(frames) for _ in range(rng.randrange(1, 8)))
            stacks[key] = rng.randrange(1, 1000)
        want = folded((k.split(";"), v) for k, v in stacks.items())
        assert folded(pyroscope_trie.parse(trie_of(stacks), LIMIT)) == want
        assert folded(pyroscope_tree.parse(tree_of(stacks), LIMIT)) == want


def test_empty_bodies_hold_nothing() -> None:
    assert list(pyroscope_trie.parse(b"", LIMIT)) == []
    assert list(pyroscope_tree.parse(b"", LIMIT)) == []
    assert list(pyroscope_tree.parse(b"\x00\x00\x00", LIMIT)) == []


@pytest.mark.parametrize("parse", [pyroscope_trie.parse, pyroscope_tree.parse])
def test_malformed_bodies_are_refused(parse) -> None:  # type: ignore[no-untyped-def]
    good = trie_of(STACKS) if parse is pyroscope_trie.parse else tree_of(STACKS)
    for cut in range(1, len(good)):
        with pytest.raises(FormatError):
            list(parse(good[:cut], LIMIT))
    bad = [
        b"\xff" * 11,  # a varint past 64 bits
        b"\x05ab",  # a name longer than the body
        b"\x00\x00\x81\x7d",  # 16,001 children in four bytes
        b"\x00" + uvarint(2**62) + b"\x00",  # a value past any sample's
    ]
    for body in bad:
        with pytest.raises(FormatError):
            list(parse(body, LIMIT))


def test_a_tree_is_one_tree() -> None:
    with pytest.raises(FormatError, match="after the end"):
        list(pyroscope_tree.parse(tree_of({"a": 1}) + b"\x00", LIMIT))


@pytest.mark.parametrize("kind", ["trie", "tree"])
def test_a_small_body_cannot_stand_for_unbounded_text(kind: str) -> None:
    # A chain of 50,000 nodes, each with a value: 150 KB whose stacks would come to 1.25e9
    # frames of folded text.
    depth = 50_000
    node, last = (
        (b"\x02a;\x01\x01", b"\x01a\x01\x00")
        if kind == "trie"
        else (b"\x01a\x01\x01", b"\x01a\x01\x00")
    )
    parse = pyroscope_trie.parse if kind == "trie" else pyroscope_tree.parse
    body = b"\x00\x00\x01" + node * (depth - 1) + last
    assert len(body) < 6 * depth
    total = 0
    with pytest.raises(FormatError, match="more than 1048576 bytes of folded text"):
        for frames, _ in parse(body, 2**20):
            total += 2 * len(frames)
    assert total <= 2**20
    # Under a limit it can meet, a shorter chain reads whole.
    short = b"\x00\x00\x01" + node * 99 + last
    assert [len(frames) for frames, _ in parse(short, LIMIT)] == list(range(1, 101))


@pytest.mark.parametrize("kind", ["trie", "tree"])
def test_nesting_and_frames_are_bounded(kind: str) -> None:
    parse = pyroscope_trie.parse if kind == "trie" else pyroscope_tree.parse
    # 70,000 nested nodes without values: nothing emitted, but each open node is held.
    body = b"\x00\x00\x01" + b"\x01a\x00\x01" * 70_000 + b"\x01a\x01\x00"
    with pytest.raises(FormatError, match="nests deeper than 65536"):
        list(parse(body, LIMIT))
    # A prefix of 999 frames under which 3,000 one-frame stacks hang: 3 million frames in
    # 14 KB, under the folded-text limit.
    if kind == "trie":
        prefix = (";".join(["f"] * 999) + ";").encode()
        head = b"\x00\x00\x01" + uvarint(len(prefix)) + prefix + b"\x00" + uvarint(3000)
    else:
        head = b"\x00\x00\x01" + b"\x01f\x00\x01" * 998 + b"\x01f\x00" + uvarint(3000)
    body = head + b"\x01g\x01\x00" * 3000
    with pytest.raises(FormatError, match="more than 2097152 frames"):
        list(parse(body, LIMIT))


def test_nodes_without_values_are_bounded_too() -> None:
    # Empty nodes charge no frame: a root with 3 million empty children (9 MB, 20 KB
    # gzipped) is refused as it claims them, before any is read (a trie of empty roots,
    # refused at the 2,097,153rd: tests/server/pyroscope/test_binary_ingest.py).
    body = b"\x00\x00" + uvarint(3_000_000) + b"\x00\x00\x00" * 3_000_000
    with pytest.raises(FormatError, match="more than 2097152 nodes"):
        list(pyroscope_tree.parse(body, LIMIT))


def test_a_claim_of_children_up_to_the_bound_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # The bound made small, to read up to it: the root and its children, all of them counted.
    monkeypatch.setattr(pyroscope_nodes, "MAX_FRAMES", 1000)
    fits = b"\x00\x00" + uvarint(999) + b"\x00\x00\x00" * 999
    assert sum(1 for _ in pyroscope_nodes.walk(fits, "tree", True)) == 1000
    over = b"\x00\x00" + uvarint(1000) + b"\x00\x00\x00" * 1000
    with pytest.raises(FormatError, match="more than 1000 nodes"):
        list(pyroscope_nodes.walk(over, "tree", True))
    # Nested claims count the nodes read before them.
    nested = b"\x00\x00\x02" + b"\x00\x00\x00" + b"\x00\x00" + uvarint(998)
    nested += b"\x00\x00\x00" * 998
    with pytest.raises(FormatError, match="more than 1000 nodes"):
        list(pyroscope_nodes.walk(nested, "tree", True))


@pytest.mark.parametrize("fmt", ["folded", "lines"])
def test_folded_and_lines_text_is_bounded_as_a_trie_is(fmt: str) -> None:
    parse = folded_text.parse_folded if fmt == "folded" else folded_text.parse_lines
    line = b"ab 1\n" if fmt == "folded" else b"ab\n"
    # 6 million lines (44 KB gzipped; 23 s and 1.8 GB of memory to read before): refused
    # before any is read.
    with pytest.raises(FormatError, match=f"{fmt}: more than 2097152 lines"):
        list(parse(line * 6_000_000))
    # Fewer lines, more frames than a body may hold.
    deep = (b"a;b;c 1\n" if fmt == "folded" else b"a;b;c\n") * 700_000
    with pytest.raises(FormatError, match="more than 2097152 frames"):
        list(parse(deep))
    assert len(list(parse(line * 1000))) == 1000


def test_read_uvarint() -> None:
    for value in (0, 1, 127, 128, 300, 2**32, 2**64 - 1):
        assert read_uvarint(uvarint(value) + b"rest", 0) == (value, len(uvarint(value)))
    with pytest.raises(FormatError):
        read_uvarint(b"\x80", 0)
