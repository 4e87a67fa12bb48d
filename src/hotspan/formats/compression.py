"""Bounded decompression: a small gzip body must not expand into gigabytes."""

from __future__ import annotations

import zlib
from typing import Any, Callable, Optional, Tuple, Type

from hotspan.formats.errors import FormatError

_decompressobj: Callable[..., Any] = zlib.decompressobj
_errors: Tuple[Type[BaseException], ...] = (zlib.error,)
# Whether ISA-L inflates (the C pprof decoder inflates with zlib unless it does).
ISAL = False
try:
    # ISA-L inflates gzip about twice as fast as zlib, without the GIL as zlib does; it is
    # the larger part of decoding a pprof upload.
    from isal import isal_zlib

    _decompressobj = isal_zlib.decompressobj
    ISAL = True
    # Its stub declares ``error`` as an instance; it is the class IsalError.
    _errors = (zlib.error, isal_zlib.error)  # type: ignore[assignment]
except ImportError:  # not on every platform: zlib does the same, slower
    pass

GZIP_MAGIC = b"\x1f\x8b"


def gunzip(data: bytes, max_size: int, decompressobj: Optional[Callable[..., Any]] = None) -> bytes:
    """Decompress gzip (possibly several members) to at most ``max_size`` bytes;
    ``decompressobj`` is ISA-L's where installed, else zlib's, unless given."""
    make = decompressobj or _decompressobj
    out = []
    total = 0
    while data:
        d = make(wbits=31)
        try:
            chunk = d.decompress(data, max_size - total + 1)
        except _errors as exc:
            raise FormatError(f"bad gzip data: {exc}") from None
        total += len(chunk)
        if total > max_size:
            raise FormatError(f"decompressed payload is larger than the limit of {max_size} bytes")
        if not d.eof:
            raise FormatError("truncated gzip data")
        out.append(chunk)
        data = d.unused_data
    return b"".join(out)


def maybe_gunzip(
    data: bytes, max_size: int, decompressobj: Optional[Callable[..., Any]] = None
) -> bytes:
    """Decompress if the payload starts with the gzip magic, else return it unchanged."""
    return gunzip(data, max_size, decompressobj) if data[:2] == GZIP_MAGIC else data
