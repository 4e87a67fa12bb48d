"""The protobuf wire encoding both pprof encoders write with (varints, field keys, integer
fields), and what finishes an encoded profile: its default sample type, and gzip.

Shared by :mod:`hotspan.agent.pprof_writer` (the C encoder's Python side) and the pure-Python
encoder in :mod:`hotspan.agent.pprof_writer_py`.
"""

from __future__ import annotations

import zlib

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Optional, Tuple


def varint(value: int, out: bytearray) -> None:
    """Appends ``value`` as a protobuf varint (an int64 when negative)."""
    if value < 0:
        value &= (1 << 64) - 1  # int64 as protobuf writes it: 64-bit two's complement
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def field_key(field: int, wire: int, out: bytearray) -> None:
    """Appends the key of field number ``field`` with wire type ``wire``."""
    varint((field << 3) | wire, out)


def int_field(field: int, value: int, out: bytearray) -> None:
    """Appends an integer field; zero, the default, is left out as protobuf leaves it."""
    if value:
        field_key(field, 0, out)
        varint(value, out)


def _read_varint(data: bytes, pos: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _string_index(raw: bytes, wanted: bytes) -> Optional[int]:
    """The index of ``wanted`` in the string table (field 6) of a Profile message."""
    pos = index = 0
    while pos < len(raw):
        key, pos = _read_varint(raw, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _read_varint(raw, pos)
        elif wire == 2:
            length, pos = _read_varint(raw, pos)
            if key >> 3 == 6:
                if raw[pos : pos + length] == wanted:
                    return index
                index += 1
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            return None
    return None


def finish(raw: bytes, default_sample_type: str) -> bytes:
    """The encoded profile, gzipped, with ``default_sample_type`` (field 14) naming one of
    its sample types when asked: a field may follow the others, and the string is already in
    the table (the C encoder's table is its own, so it is found in the bytes)."""
    if default_sample_type:
        index = _string_index(raw, default_sample_type.encode())
        if index:
            extra = bytearray()
            int_field(14, index, extra)
            raw += bytes(extra)
    return _gzip(raw)


def _gzip(raw: bytes) -> bytes:
    # zlib with gzip framing (wbits 31): the gzip module would bring five more modules.
    # Level 1: a profile with span labels comes out ~7% larger than at the default 6, for
    # 40% of the CPU, which is the program's (measured on 2,000 rows: 1.3 vs 3.3 us a row).
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    return packer.compress(raw) + packer.flush()
