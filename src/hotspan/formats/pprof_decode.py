"""pprof wire bytes to flat arrays: every sample resolved to its root-first frame ids and
its stack id.  ``hotspan._speedups`` does this in C; :func:`decode_python` is the reference
implementation with the same output, used when the extension is not built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple, Union, overload

import numpy as np
from google.protobuf.message import DecodeError

from hotspan import _speedups
from hotspan.formats import compression
from hotspan.formats.errors import FormatError
from hotspan.formats.proto import profile_pb2
from hotspan.model.hashing import hash_frame, hash_stack
from hotspan.model.profile import MAX_PROFILE_FRAMES, MAX_STACK_DEPTH

_fast = _speedups.load()


class StringTable(Sequence[bytes]):
    """A pprof string table left in the payload the C decoder read: entry ``i`` is the bytes
    at ``pos[i]`` (offset, length), sliced when asked for.  An upload names a few hundred
    strings of which the server reads a handful once its stacks are known, and making them
    all would be the larger part of the work done with the GIL held."""

    __slots__ = ("_payload", "_pos")

    def __init__(self, payload: Any, pos: np.ndarray) -> None:
        # bytes, or a buffer the C decoder lends (an upload it inflated, not copied again).
        self._payload = payload if isinstance(payload, bytes) else memoryview(payload)
        self._pos = pos

    def __reduce__(self) -> Tuple[type, Tuple[bytes, np.ndarray]]:
        return StringTable, (bytes(self._payload), self._pos)

    def __len__(self) -> int:
        return len(self._pos)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> List[bytes]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[bytes, List[bytes]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        offset, length = self._pos[index].tolist()
        return bytes(self._payload[offset : offset + length])


@dataclass
class DecodedProfile:
    strings: Sequence[bytes]
    sample_types: np.ndarray  # (n_types, 2): string indexes of type and unit
    period_type: int
    period_unit: int
    has_period_type: bool
    period: int
    time_nanos: int
    duration_nanos: int
    frame_id: np.ndarray  # one entry per location line (duplicates possible)
    frame_name: np.ndarray  # string index; -1: unsymbolized, frame_line holds the address
    frame_file: np.ndarray
    frame_line: np.ndarray
    stack: np.ndarray  # (n_samples,) stack ids
    frame_off: np.ndarray  # (n_samples + 1,) offsets into frames
    frames: np.ndarray  # root-first frame ids of every sample, concatenated
    values: np.ndarray  # (n_samples, n_types)
    labels: np.ndarray  # (n_labels, 3): sample index, key, str (string labels only)
    default_sample_type: int = 0  # string index of the type shown by default; 0: none


def _i64(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.int64)


def decode(
    raw: bytes, max_depth: int = MAX_STACK_DEPTH, max_frames: int = MAX_PROFILE_FRAMES
) -> DecodedProfile:
    """Root-first stacks of at most ``max_depth`` frames; refuses (FormatError) a profile that
    expands to more than ``max_frames`` frames in all."""
    if _fast is not None:
        return _from_c(_fast_decode(raw, max_depth, max_frames))
    return decode_python(raw, max_depth, max_frames)


def decode_upload(
    data: bytes,
    max_size: int,
    max_depth: int = MAX_STACK_DEPTH,
    max_frames: int = MAX_PROFILE_FRAMES,
) -> DecodedProfile:
    """:func:`decode` of an upload, gzipped or not: at most ``max_size`` bytes once inflated,
    and not empty."""
    if _fast is not None and not (compression.ISAL and data[:2] == compression.GZIP_MAGIC):
        return decode_inflating(data, max_size, max_depth, max_frames)
    # ISA-L inflates in about half the CPU time zlib takes, worth the two more waits for the
    # GIL it costs a decoding thread (measured: the same uploads/s, less CPU per upload).
    raw = compression.maybe_gunzip(data, max_size)
    if not raw:
        raise FormatError("empty pprof profile")
    return decode(raw, max_depth, max_frames)


def decode_inflating(
    data: bytes,
    max_size: int,
    max_depth: int = MAX_STACK_DEPTH,
    max_frames: int = MAX_PROFILE_FRAMES,
) -> DecodedProfile:
    """:func:`decode_upload` in C alone: zlib inflates a gzipped upload and the decoder reads
    it in one stretch without the GIL (``_speedups/inflate.c`` says why)."""
    return _from_c(_fast_decode(data, max_depth, max_frames, max_size))


def _fast_decode(data: bytes, *args: int) -> tuple:
    assert _fast is not None
    try:
        return _fast.decode(data, *args)
    except ValueError as exc:
        raise FormatError(str(exc)) from None


def _from_c(t: tuple) -> DecodedProfile:
    n_types = len(t[2]) // 16
    values = _i64(t[16])
    return DecodedProfile(
        strings=StringTable(t[0], _i64(t[1]).reshape(-1, 2)),
        sample_types=_i64(t[2]).reshape(-1, 2),
        period_type=t[3],
        period_unit=t[4],
        has_period_type=bool(t[5]),
        period=t[6],
        time_nanos=t[7],
        duration_nanos=t[8],
        frame_id=_i64(t[9]),
        frame_name=_i64(t[10]),
        frame_file=_i64(t[11]),
        frame_line=_i64(t[12]),
        stack=_i64(t[13]),
        frame_off=_i64(t[14]),
        frames=_i64(t[15]),
        values=values.reshape(-1, n_types) if n_types else values.reshape(0, 0),
        labels=_i64(t[17]).reshape(-1, 3),
        default_sample_type=t[18],
    )


def decode_python(
    raw: bytes, max_depth: int = MAX_STACK_DEPTH, max_frames: int = MAX_PROFILE_FRAMES
) -> DecodedProfile:
    try:
        p = profile_pb2.Profile.FromString(raw)
    except DecodeError as exc:
        raise FormatError(f"malformed pprof: {exc}") from None
    strings = list(p.string_table)
    if not strings:
        raise FormatError("malformed pprof: empty string table")
    n_strings = len(strings)

    def check(idx: int) -> int:
        if not 0 <= idx < n_strings:
            raise FormatError("malformed pprof: string index out of range")
        return idx

    sample_types = [(check(vt.type), check(vt.unit)) for vt in p.sample_type]
    has_pt = p.HasField("period_type")
    if has_pt:
        check(p.period_type.type)
        check(p.period_type.unit)
    fn_ids = repaired_function_ids([f.id for f in p.function], [loc.id for loc in p.location])
    functions: Dict[int, Tuple[int, int]] = {}
    for fid, fn in zip(fn_ids, p.function):
        name = check(fn.name)
        system_name = check(fn.system_name)
        functions.setdefault(fid, (name or system_name, check(fn.filename)))
    mappings: Dict[int, int] = {}
    for m in p.mapping:
        mappings.setdefault(m.id, check(m.filename))
    frame_id: List[int] = []
    frame_name: List[int] = []
    frame_file: List[int] = []
    frame_line: List[int] = []
    loc_frames: Dict[int, List[int]] = {}

    def add(name: int, file: int, line: int, out: List[int]) -> None:
        fid = hash_frame(strings[name] if name >= 0 else b"", strings[file], line)
        frame_id.append(fid)
        frame_name.append(name)
        frame_file.append(file)
        frame_line.append(line)
        out.append(fid)

    for loc in p.location:
        out: List[int] = []
        if not loc.line:
            add(-1, mappings.get(loc.mapping_id, 0), _signed(loc.address), out)
        for line in reversed(loc.line):  # line[0] is the innermost inlined callee
            name, file = functions.get(line.function_id, (0, 0))
            add(name, file, line.line, out)
        loc_frames.setdefault(loc.id, out)
    n_types = len(sample_types)
    stack: List[int] = []
    frame_off = [0]
    frames: List[int] = []
    values: List[int] = []
    labels: List[Tuple[int, int, int]] = []
    for i, sample in enumerate(p.sample):
        start = len(frames)
        for loc_id in reversed(sample.location_id):
            if loc_id not in loc_frames:
                raise FormatError(f"malformed pprof: unknown location id {loc_id}")
            room = max_depth - (len(frames) - start)
            if room > 0:
                frames.extend(loc_frames[loc_id][:room])
        if len(frames) > max_frames:
            raise FormatError("malformed pprof: profile expands to too many frames")
        if len(sample.value) != n_types:
            raise FormatError(
                f"malformed pprof: sample has {len(sample.value)} values for {n_types} sample types"
            )
        stack.append(hash_stack(frames[start:]))
        frame_off.append(len(frames))
        values.extend(sample.value)
        for label in sample.label:
            check(label.key)
            if check(label.str):
                labels.append((i, label.key, label.str))
    return DecodedProfile(
        strings=strings,
        sample_types=np.array(sample_types, dtype=np.int64).reshape(-1, 2),
        period_type=p.period_type.type,
        period_unit=p.period_type.unit,
        has_period_type=has_pt,
        period=p.period,
        time_nanos=p.time_nanos,
        duration_nanos=p.duration_nanos,
        default_sample_type=p.default_sample_type,
        frame_id=np.array(frame_id, dtype=np.int64),
        frame_name=np.array(frame_name, dtype=np.int64),
        frame_file=np.array(frame_file, dtype=np.int64),
        frame_line=np.array(frame_line, dtype=np.int64),
        stack=np.array(stack, dtype=np.int64),
        frame_off=np.array(frame_off, dtype=np.int64),
        frames=np.array(frames, dtype=np.int64),
        values=np.array(values, dtype=np.int64).reshape(-1, n_types)
        if n_types
        else np.zeros((0, 0), np.int64),
        labels=np.array(labels, dtype=np.int64).reshape(-1, 3),
    )


def repaired_function_ids(function_ids: List[int], location_ids: List[int]) -> List[int]:
    """Some .NET profilers write every function id as 0, one function per location: give
    function i the id of location i, as Pyroscope does, so that the names are not lost."""
    if (
        function_ids
        and all(f == 0 for f in function_ids)
        and len(function_ids) == len(location_ids)
    ):
        return list(location_ids)
    return function_ids


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value
