"""The 64-bit content hashes that identify frames and stacks.

Pure Python here; ``hotspan._speedups`` computes the very same values in C while decoding
pprof, so either path yields identical ids (``tests/test_speedups.py`` holds them to it).
Not cryptographic: ids only need to be stable and well spread.
"""

from __future__ import annotations

from typing import Sequence

MASK = (1 << 64) - 1
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_GOLDEN = 0x9E3779B97F4A7C15
_K_LEN = 0xC2B2AE3D27D4EB4F
_K_MUL = 0x87C37B91114253D5


def fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK
    h ^= h >> 33
    return h


def to_signed(h: int) -> int:
    return h - (1 << 64) if h >= 1 << 63 else h


def hash_frame(name: bytes, filename: bytes, line: int) -> int:
    """FNV-1a over ``name \\0 filename \\0 line(8 bytes LE)``, then a final mix; signed."""
    h = _FNV_OFFSET
    for byte in name + b"\0" + filename + b"\0" + (line & MASK).to_bytes(8, "little"):
        h = ((h ^ byte) * _FNV_PRIME) & MASK
    return to_signed(fmix64(h))


def hash_stack(frame_ids: Sequence[int]) -> int:
    """Order-sensitive combination of (signed 64-bit) frame ids; signed."""
    h = _GOLDEN ^ ((len(frame_ids) * _K_LEN) & MASK)
    for w in frame_ids:
        h ^= fmix64((w + _GOLDEN) & MASK)
        h = (((h << 31) | (h >> 33)) & MASK) * _K_MUL & MASK
    return to_signed(fmix64(h))
