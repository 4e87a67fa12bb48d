"""Protobuf's wire pieces that the server writes by hand, where building a message would cost
more than the bytes (a length prefix before an already serialized body, a Status of two
fields, Pyroscope's serialized tree)."""

from __future__ import annotations


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
