"""Encoding a profile as gzipped pprof (profile.proto), in the agent's own process.

This writes the dozen fields the agent needs directly instead of importing the protobuf
runtime: loading ``profile_pb2`` costs about 6 MiB of RSS and 7,000 objects the garbage
collector then tracks in every profiled program, against an RSS budget of 10 MiB.  The test
suite decodes the output with ``protobuf`` and with ``go tool pprof``.

:class:`ProfileWriter` is the C encoder (``_speedups/pprof_writer.c``) when it is built, else
:class:`PyProfileWriter`; both give the same bytes for the same calls.  The Python one lives in
:mod:`hotspan.agent.pprof_writer_py`, imported only where it runs (it is still
``hotspan.agent.pprof_writer.PyProfileWriter``).
"""

from __future__ import annotations

import zlib

from hotspan._speedups import load_module

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Optional, Tuple

    from hotspan.agent.pprof_writer_py import PyProfileWriter


def _varint(value: int, out: bytearray) -> None:
    if value < 0:
        value &= (1 << 64) - 1  # int64 as protobuf writes it: 64-bit two's complement
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _key(field: int, wire: int, out: bytearray) -> None:
    _varint((field << 3) | wire, out)


def _int(field: int, value: int, out: bytearray) -> None:
    if value:
        _key(field, 0, out)
        _varint(value, out)


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


def _finish(raw: bytes, default_sample_type: str) -> bytes:
    """The encoded profile, gzipped, with ``default_sample_type`` (field 14) naming one of
    its sample types when asked: a field may follow the others, and the string is already in
    the table (the C encoder's table is its own, so it is found in the bytes)."""
    if default_sample_type:
        index = _string_index(raw, default_sample_type.encode())
        if index:
            extra = bytearray()
            _int(14, index, extra)
            raw += bytes(extra)
    return _gzip(raw)


def _gzip(raw: bytes) -> bytes:
    # zlib with gzip framing (wbits 31): the gzip module would bring five more modules.
    # Level 1: a profile with span labels comes out ~7% larger than at the default 6, for
    # 40% of the CPU, which is the program's (measured on 2,000 rows: 1.3 vs 3.3 us a row).
    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    return packer.compress(raw) + packer.flush()


_native = load_module("_pprof_writer")

if TYPE_CHECKING:
    # The C encoder has no stubs; it has PyProfileWriter's interface.
    ProfileWriter = PyProfileWriter
elif _native is not None:

    class ProfileWriter(_native.ProfileEncoder):
        """The C encoder (same interface as :class:`PyProfileWriter`)."""

        __slots__ = ()  # no __dict__: instances stay out of the cyclic GC, as the base is

        def encode(self, time_ns: int, duration_ns: int, default_sample_type: str = "") -> bytes:
            """The profile, gzipped, as pprof is sent."""
            return _finish(self.encode_raw(time_ns, duration_ns), default_sample_type)


def __getattr__(name: str) -> Any:
    # The pure-Python encoder lives in its own module, imported only where it is used (the C
    # one is not built, or a test asks for it), but keeps its name here; without the C one it
    # is ProfileWriter too.
    if name == "PyProfileWriter" or (name == "ProfileWriter" and _native is None):
        from hotspan.agent.pprof_writer_py import PyProfileWriter

        return PyProfileWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
