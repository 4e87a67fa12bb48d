"""Bounded decompression: a small gzip body must not expand into gigabytes."""

from __future__ import annotations

import zlib

from hotspan.formats.errors import FormatError

GZIP_MAGIC = b"\x1f\x8b"


def gunzip(data: bytes, max_size: int) -> bytes:
    """Decompress gzip (possibly several members) to at most ``max_size`` bytes."""
    out = []
    total = 0
    while data:
        d = zlib.decompressobj(wbits=31)
        try:
            chunk = d.decompress(data, max_size - total + 1)
        except zlib.error as exc:
            raise FormatError(f"bad gzip data: {exc}") from None
        total += len(chunk)
        if total > max_size:
            raise FormatError(f"decompressed payload is larger than the limit of {max_size} bytes")
        if not d.eof:
            raise FormatError("truncated gzip data")
        out.append(chunk)
        data = d.unused_data
    return b"".join(out)


def maybe_gunzip(data: bytes, max_size: int) -> bytes:
    """Decompress if the payload starts with the gzip magic, else return it unchanged."""
    return gunzip(data, max_size) if data[:2] == GZIP_MAGIC else data
