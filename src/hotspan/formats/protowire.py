"""Protobuf's wire pieces that the server writes by hand, where building a message would cost
more than the bytes (a length prefix before an already serialized body, a Status of two
fields, Pyroscope's serialized tree), and the varints of the binary formats it reads
by hand."""

from __future__ import annotations

from typing import Tuple

from hotspan.formats.errors import FormatError


def uvarint(value: int) -> bytes:
    """``value`` (0 <= value < 2**64) as an unsigned LEB128 varint."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_uvarint(data: bytes, pos: int) -> Tuple[int, int]:
    """The unsigned LEB128 varint at ``data[pos]`` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise FormatError(f"a varint runs past the end at byte {pos}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise FormatError(f"a varint longer than 64 bits ends at byte {pos}")
