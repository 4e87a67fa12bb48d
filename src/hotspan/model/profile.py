"""Profile types, frames and the columnar batch every wire format is turned into.

Frames and stacks are content-addressed: a frame id is a 64-bit hash of (function, file, line)
and a stack id a 64-bit hash of its frame ids, root first.  Any ingest process, on any machine,
computes the same ids without asking the store, so writes need no coordination and the same
stack pushed a million times is stored once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from hotspan.model.hashing import hash_frame, hash_stack
from hotspan.model.labels import LabelSet

_MASK64 = (1 << 64) - 1

# Frames kept per stack, root first; deeper frames are dropped (Pyroscope's default limit).
MAX_STACK_DEPTH = 1000
# Largest sample value accepted (2^53: exact in the float64 of every JSON consumer); sums are
# clamped below 2^62, so no query can overflow 64 bits.
MAX_SAMPLE_VALUE = (1 << 53) - 1
MAX_SUM = 1 << 62
# Timestamps accepted, in nanoseconds since the epoch (up to the year 2116).
MAX_TIME_NS = 1 << 62
# Frames one profile may expand to (inlined lines multiply): beyond it the profile is refused.
MAX_PROFILE_FRAMES = 20_000_000


class ProfileTypeError(ValueError):
    """A profile type id that is not ``name:sample_type:sample_unit:period_type:period_unit``."""


@dataclass(frozen=True)
class ProfileType:
    name: str
    sample_type: str
    sample_unit: str
    period_type: str
    period_unit: str

    def __post_init__(self) -> None:
        # The id joins the parts with ':'; a part containing one would make an id that no
        # longer parses back.  Ingest sanitises with :meth:`of`, so this only guards bugs.
        if any(":" in part for part in self._parts()):
            raise ProfileTypeError(f"profile type part contains ':': {self._parts()!r}")

    def _parts(self) -> Tuple[str, str, str, str, str]:
        return (self.name, self.sample_type, self.sample_unit, self.period_type, self.period_unit)

    @classmethod
    def of(cls, *parts: str) -> ProfileType:
        """A profile type from names a client sent: ':' (the id separator) becomes '_'."""
        return cls(*(p.replace(":", "_") for p in parts))

    @property
    def id(self) -> str:
        return ":".join(self._parts())

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
    return hash_frame(
        frame.name.encode("utf-8", "replace"), frame.filename.encode("utf-8", "replace"), frame.line
    )


def stack_id(frame_ids: Sequence[int]) -> int:
    return hash_stack(frame_ids)


def span_id_to_int(span_id: str) -> int:
    """16 hex digits to the unsigned 64-bit integer stored per sample (0 means no span)."""
    return int(span_id, 16) & _MASK64


class _BoundedCache(dict):
    """A dict that forgets everything once it is full: cheap, and ingest refills it quickly."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def remember(self, key, value):
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
class StackChunk:
    """Stacks in array form: entry i is stack ``ids[i]`` with root-first frames
    ``frames[offsets[i]:offsets[i + 1]]`` (entries may repeat)."""

    ids: np.ndarray
    frames: np.ndarray
    offsets: np.ndarray


class SampleColumns(NamedTuple):
    series_id: np.ndarray  # int64
    ts: np.ndarray  # int64 nanoseconds since the epoch
    stack_id: np.ndarray  # int64
    value: np.ndarray  # int64
    span_id: np.ndarray  # uint64, 0: no span
    trace_id: np.ndarray  # object: 32 lowercase hex digits or None


@dataclass
class IngestBatch:
    """Samples of one push with the series, frames and stacks they reference.

    Formats add samples one by one (:meth:`add_sample`) or as whole columns
    (:meth:`add_columns`, the fast pprof path); stores read :meth:`columns`.
    """

    series: Dict[int, SeriesInfo] = field(default_factory=dict)
    frames: Dict[int, Frame] = field(default_factory=dict)
    # Frames a format can name on demand (``wanted ids -> frames``): the store asks only for
    # the frames of stacks it has not stored yet, so known stacks cost no string work.
    frame_sources: List[Callable[[Set[int]], Dict[int, Frame]]] = field(default_factory=list)
    stacks: Dict[int, Tuple[int, ...]] = field(default_factory=dict)
    stack_chunks: List[StackChunk] = field(default_factory=list)
    _rows: List[tuple] = field(default_factory=list)
    _chunks: List[SampleColumns] = field(default_factory=list)
    _chunk_len: int = 0

    def __len__(self) -> int:
        return len(self._rows) + self._chunk_len

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
        self._rows.append((series_id, ts, stack, value, span_id, trace_id))

    def add_columns(self, columns: SampleColumns) -> None:
        if len(columns.value):
            self._chunks.append(columns)
            self._chunk_len += len(columns.value)

    def columns(self) -> SampleColumns:
        parts = list(self._chunks)
        if self._rows:
            series, ts, stack, value, span, trace = zip(*self._rows)
            parts.append(
                SampleColumns(
                    np.array(series, dtype=np.int64),
                    np.array(ts, dtype=np.int64),
                    np.array(stack, dtype=np.int64),
                    np.array(value, dtype=np.int64),
                    np.array(span, dtype=np.uint64),
                    np.array(trace, dtype=object),
                )
            )
        if not parts:
            return SampleColumns._make(
                np.zeros(0, dtype=t)
                for t in (np.int64, np.int64, np.int64, np.int64, np.uint64, object)
            )
        if len(parts) == 1:
            return parts[0]
        return SampleColumns._make(np.concatenate(col) for col in zip(*parts))

    def frames_for(self, wanted: Set[int]) -> Dict[int, Frame]:
        """The frames among ``wanted`` that this batch can name."""
        out = {fid: self.frames[fid] for fid in wanted if fid in self.frames}
        for source in self.frame_sources:
            missing = wanted - out.keys()
            if not missing:
                break
            out.update(source(missing))
        return out

    def new_stacks(self, known: Set[int]) -> Dict[int, Tuple[int, ...]]:
        """Stacks of this batch whose id is not in ``known``."""
        out = {sid: frames for sid, frames in self.stacks.items() if sid not in known}
        for chunk in self.stack_chunks:
            ids = chunk.ids.tolist()
            # Most pushes name only stacks the store has: one set operation says so.
            if known.issuperset(ids):
                continue
            for i, sid in enumerate(ids):
                if sid not in known and sid not in out:
                    out[sid] = tuple(chunk.frames[chunk.offsets[i] : chunk.offsets[i + 1]].tolist())
        return out
