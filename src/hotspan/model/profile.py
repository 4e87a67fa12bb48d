"""Profile types, frames and the columnar batch every wire format is turned into.

Frames and stacks are content-addressed: a frame id is a 64-bit hash of (function, file, line)
and a stack id a 64-bit hash of its frame ids, root first.  Any ingest process, on any machine,
computes the same ids without asking the store, so writes need no coordination and the same
stack pushed a million times is stored once.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from hotspan.model.labels import LabelSet

_MASK64 = (1 << 64) - 1


class ProfileTypeError(ValueError):
    """A profile type id that is not ``name:sample_type:sample_unit:period_type:period_unit``."""


@dataclass(frozen=True)
class ProfileType:
    name: str
    sample_type: str
    sample_unit: str
    period_type: str
    period_unit: str

    @property
    def id(self) -> str:
        return ":".join(
            (self.name, self.sample_type, self.sample_unit, self.period_type, self.period_unit)
        )

    @classmethod
    def parse(cls, text: str) -> ProfileType:
        parts = text.split(":")
        if len(parts) != 5 or not all(parts[:2]):
            raise ProfileTypeError(
                f"profile type {text!r} is not name:sample_type:sample_unit:period_type:period_unit"
            )
        return cls(*parts)

    def __str__(self) -> str:
        return self.id


class Frame(NamedTuple):
    name: str
    filename: str = ""
    line: int = 0


def _hash64(data: bytes) -> int:
    """Signed 64-bit hash: fits BIGINT columns in every SQL engine."""
    value = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
    return value - (1 << 64) if value >= 1 << 63 else value


def frame_id(frame: Frame) -> int:
    return _hash64(f"{frame.name}\x00{frame.filename}\x00{frame.line}".encode("utf-8", "replace"))


def stack_id(frame_ids: Sequence[int]) -> int:
    return _hash64(struct.pack(f"<{len(frame_ids)}q", *frame_ids))


def span_id_to_int(span_id: str) -> int:
    """16 hex digits to the unsigned 64-bit integer stored per sample (0 means no span)."""
    return int(span_id, 16) & _MASK64


def span_id_to_hex(value: int) -> str:
    return f"{value & _MASK64:016x}"


class _BoundedCache(dict):
    """A dict that forgets everything once it is full: cheap, and ingest refills it quickly."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key, value):  # type: ignore[no-untyped-def]
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


_FRAME_IDS = _BoundedCache(1_000_000)
_STACK_IDS = _BoundedCache(500_000)


@dataclass
class SeriesInfo:
    profile_type: ProfileType
    labels: LabelSet


@dataclass
class IngestBatch:
    """Samples of one push, column by column, with the symbols and stacks they reference.

    ``span_id`` is an unsigned 64-bit integer (0 when the sample has no span); ``trace_id`` is
    32 lowercase hex digits or None.  Timestamps are nanoseconds since the epoch.
    """

    series: Dict[int, SeriesInfo] = field(default_factory=dict)
    frames: Dict[int, Frame] = field(default_factory=dict)
    stacks: Dict[int, Tuple[int, ...]] = field(default_factory=dict)
    series_id: List[int] = field(default_factory=list)
    ts: List[int] = field(default_factory=list)
    stack_id: List[int] = field(default_factory=list)
    value: List[int] = field(default_factory=list)
    span_id: List[int] = field(default_factory=list)
    trace_id: List[Optional[str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.value)

    def add_series(self, profile_type: ProfileType, labels: LabelSet) -> int:
        sid = _hash64(
            "\x00".join([profile_type.id] + [f"{k}\x01{v}" for k, v in labels]).encode(
                "utf-8", "replace"
            )
        )
        if sid not in self.series:
            self.series[sid] = SeriesInfo(profile_type, labels)
        return sid

    def add_frame(self, frame: Frame) -> int:
        fid = _FRAME_IDS.get(frame)
        if fid is None:
            fid = _FRAME_IDS.remember(frame, frame_id(frame))
        if fid not in self.frames:
            self.frames[fid] = frame
        return fid

    def add_stack(self, frame_ids: Tuple[int, ...]) -> int:
        """Register a stack given root-first frame ids and return its id."""
        sid = _STACK_IDS.get(frame_ids)
        if sid is None:
            sid = _STACK_IDS.remember(frame_ids, stack_id(frame_ids))
        if sid not in self.stacks:
            self.stacks[sid] = frame_ids
        return sid

    def add_sample(
        self,
        series_id: int,
        ts: int,
        stack: int,
        value: int,
        span_id: int = 0,
        trace_id: Optional[str] = None,
    ) -> None:
        self.series_id.append(series_id)
        self.ts.append(ts)
        self.stack_id.append(stack)
        self.value.append(value)
        self.span_id.append(span_id)
        self.trace_id.append(trace_id)

    def extend(self, other: IngestBatch) -> None:
        self.series.update(other.series)
        self.frames.update(other.frames)
        self.stacks.update(other.stacks)
        self.series_id.extend(other.series_id)
        self.ts.extend(other.ts)
        self.stack_id.extend(other.stack_id)
        self.value.extend(other.value)
        self.span_id.extend(other.span_id)
        self.trace_id.extend(other.trace_id)
