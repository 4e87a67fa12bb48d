"""pprof in (any profiler's) and out (what ``go tool pprof`` reads).

Ingest follows what Pyroscope does with a pprof upload: every sample type becomes its own profile
type, the profile's metric name (``process_cpu``, ``memory``, ``wall``, ...) is derived from its
sample types, the sample labels ``span_id``/``profile_id`` and ``trace_id`` stay on the sample,
and every other sample label becomes a series label.
"""

from __future__ import annotations

import gzip
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Union

import numpy as np

from hotspan.formats.errors import FormatError
from hotspan.formats.pprof_decode import DecodedProfile, decode_upload
from hotspan.formats.proto import profile_pb2
from hotspan.model.labels import METRIC_NAME, SPY_NAME, normalize
from hotspan.model.profile import (
    MAX_SAMPLE_VALUE,
    MAX_TIME_NS,
    Frame,
    IngestBatch,
    ProfileType,
    SampleColumns,
    StackChunk,
    span_id_to_int,
)
from hotspan.model.stack_profile import SampleType, StackProfile

Profile = profile_pb2.Profile

SPAN_LABELS = ("span_id", "profile_id")  # profile_id: the legacy name of the span id
TRACE_LABEL = "trace_id"
_HEX16 = re.compile(r"[0-9a-fA-F]{16}")
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_BAD_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_.]")


def parse(data: bytes, max_size: int) -> DecodedProfile:
    """Decode a pprof payload, gzip-compressed or not."""
    try:
        profile = decode_upload(data, max_size)
    except FormatError:
        if data[:4] == b"FLR\x00":
            raise FormatError("a JFR recording, not pprof: send it with format=jfr") from None
        raise
    if not len(profile.sample_types):
        raise FormatError("malformed pprof: no sample types")
    return profile


# Pyroscope's display names for sample types when the client sends no sample_type_config.
DEFAULT_DISPLAY_NAMES = {
    "samples": "cpu",
    "goroutine": "goroutines",
    "contentions": "mutex_count",
    "delay": "mutex_duration",
}


def metric_name(sample_types: Sequence[str], display_names: Mapping[str, str]) -> str:
    """The ``__name__`` Pyroscope gives a pprof upload, from its sample types."""
    if "wall" in sample_types:
        return "wall"
    st = ""
    for st in sample_types:
        st = display_names.get(st, st)
        if "cpu" in st:
            return "process_cpu"
        if "alloc_" in st or "inuse_" in st or st in ("space", "objects"):
            return "memory"
        if "mutex_" in st:
            return "mutex"
        if "block_" in st:
            return "block"
        if "goroutines" in st:
            return "goroutines"
    return st


def sanitize_label_name(name: str) -> str:
    """A label name from any text: what is not a letter, digit, '_' or '.' becomes '_', and a
    name that cannot start a label name (a digit, a '.') gets a '_' in front."""
    name = _BAD_LABEL_CHARS.sub("_", name)
    return "_" + name if name[:1].isdigit() or name[:1] == "." else name


class _Text:
    """String-table entries decoded on demand; invalid UTF-8 is repaired, not rejected."""

    def __init__(self, strings: Sequence[bytes]) -> None:
        self._raw = strings
        self._cache: Dict[int, str] = {}

    def __call__(self, index: int) -> str:
        text = self._cache.get(index)
        if text is None:
            text = self._cache[index] = self._raw[index].decode("utf-8", "replace")
        return text


def to_batch(
    profile: DecodedProfile,
    batch: IngestBatch,
    labels: Mapping[str, str],
    default_ts_ns: int,
    sample_type_config: Optional[Mapping[str, Mapping[str, object]]] = None,
) -> int:
    """Add the samples of ``profile`` to ``batch``; returns how many samples were added.

    ``labels`` are the series labels of the upload; ``__name__`` is derived from the sample
    types when absent.
    """
    text = _Text(profile.strings)
    spy = labels.get(SPY_NAME, "")
    sample_types = [text(t) for t in profile.sample_types[:, 0].tolist()]
    if "dotnet" in spy:
        sample_types = [t.replace("-", "_") for t in sample_types]  # old .NET agents
    if not all(sample_types):
        # It would name a profile type no query can ask for (``name::unit:...``).
        raise FormatError("malformed pprof: a sample type without a name")
    sample_units = [text(u) for u in profile.sample_types[:, 1].tolist()]
    if sample_type_config is None:
        display = DEFAULT_DISPLAY_NAMES
    else:
        display = {
            k: str(v.get("display-name") or "")
            for k, v in sample_type_config.items()
            if isinstance(v, dict) and v.get("display-name")
        }
    base = dict(labels)
    if not base.get(METRIC_NAME):
        base[METRIC_NAME] = metric_name(sample_types, display)
    period_type = text(profile.period_type) if profile.has_period_type else ""
    period_unit = text(profile.period_unit) if profile.has_period_type else ""
    types = [
        ProfileType.of(base[METRIC_NAME], st, unit, period_type, period_unit)
        for st, unit in zip(sample_types, sample_units)
    ]
    ts = profile.time_nanos
    # Old py-spy/rbspy/pyroscope-rs builds wrote microseconds, or nothing, here.
    if ts < 365 * 86400 * 10**9:
        ts = default_ts_ns
    elif ts >= MAX_TIME_NS:
        # No query reaches it, and no retention would ever delete it.
        raise FormatError(f"profile time {ts} ns is past the year 2116")

    batch.frame_sources.append(_frame_source(profile, text))
    n = len(profile.stack)
    if n == 0:
        return 0
    batch.stack_chunks.append(StackChunk(profile.stack, profile.frames, profile.frame_off))
    groups: List[Tuple[Tuple[str, str], ...]] = [()]
    if len(profile.labels):
        span = np.zeros(n, dtype=np.uint64)
        trace = np.full(n, None, dtype=object)
        group = np.zeros(n, dtype=np.int64)
        groups = _apply_labels(profile.labels, text, span, trace, group)
    else:
        # Most uploads have no sample labels: shared read-only columns instead of new ones,
        # since NumPy lets go of the GIL to allocate a zeroed array, and on a busy server
        # each time costs two thread switches.
        span, trace, group = _unlabelled(n)
    series = np.empty((len(groups), len(types)), dtype=np.int64)
    for g, extra in enumerate(groups):
        merged = dict(base)
        merged.update(extra)
        labelset = normalize(merged)
        for t, ptype in enumerate(types):
            series[g, t] = batch.add_series(ptype, labelset)
    if len(profile.values) and (
        int(profile.values.min()) < 0 or int(profile.values.max()) > MAX_SAMPLE_VALUE
    ):
        raise FormatError(f"sample values must be between 0 and {MAX_SAMPLE_VALUE}")
    added = 0
    for t in range(len(types)):
        values = profile.values[:, t]
        keep = values != 0
        count = int(np.count_nonzero(keep))
        if count == 0:
            continue
        if count == n:
            # Every sample has a value of this type (a profile of one type, always).
            ids = series[group, t] if len(groups) > 1 else np.full(n, series[0, t])
            columns = SampleColumns(ids, np.full(n, ts), profile.stack, values, span, trace)
        else:
            columns = SampleColumns(
                series[group[keep], t],
                np.full(count, ts, dtype=np.int64),
                profile.stack[keep],
                values[keep],
                span[keep],
                trace[keep],
            )
        batch.add_columns(columns)
        added += count
    return added


_SHARED: Tuple[np.ndarray, np.ndarray, np.ndarray] = (
    np.zeros(0, dtype=np.uint64),
    np.zeros(0, dtype=object),
    np.zeros(0, dtype=np.int64),
)


def _unlabelled(n: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Span ids (0), trace ids (None) and series groups (0) of ``n`` unlabelled samples:
    views of arrays shared by every upload, read-only."""
    global _SHARED
    shared = _SHARED
    if len(shared[0]) < n:
        size = max(n, 4096)
        shared = (
            np.zeros(size, dtype=np.uint64),
            np.full(size, None, dtype=object),
            np.zeros(size, dtype=np.int64),
        )
        for column in shared:
            column.flags.writeable = False
        _SHARED = shared
    return shared[0][:n], shared[1][:n], shared[2][:n]


def _frame_source(profile: DecodedProfile, text: _Text):
    """Names the profile's frames on demand (the store asks only for unseen stacks' frames)."""

    def frames(wanted: Set[int]) -> Dict[int, Frame]:
        out: Dict[int, Frame] = {}
        for fid, name, file, line in zip(
            profile.frame_id.tolist(),
            profile.frame_name.tolist(),
            profile.frame_file.tolist(),
            profile.frame_line.tolist(),
        ):
            if fid not in wanted or fid in out:
                continue
            if name < 0:
                # Unsymbolized: the address (in ``line``) is all there is; the binary helps.
                binary = text(file)
                address = f"0x{line & 0xFFFFFFFFFFFFFFFF:x}"
                out[fid] = Frame(f"{binary} {address}" if binary else address)
            else:
                out[fid] = Frame(text(name) or "unknown", text(file), line)
        return out

    return frames


def _apply_labels(
    labels: np.ndarray, text: _Text, span: np.ndarray, trace: np.ndarray, group: np.ndarray
) -> List[Tuple[Tuple[str, str], ...]]:
    """Span and trace ids go on the samples; other labels make series groups."""
    per_sample: Dict[int, List[Tuple[str, str]]] = {}
    for sample, key_idx, str_idx in labels.tolist():
        key = text(key_idx)
        value = text(str_idx)
        if key in SPAN_LABELS:
            if _HEX16.fullmatch(value):
                span[sample] = span_id_to_int(value)
        elif key == TRACE_LABEL:
            if _HEX32.fullmatch(value):
                trace[sample] = value.lower()
        elif value and key and not key.startswith("__"):
            # A label without a name names no series label; "__" ones are the server's own
            # (__name__, __profile_type__), which a sample may not rename.
            per_sample.setdefault(sample, []).append((sanitize_label_name(key), value))
    groups: List[Tuple[Tuple[str, str], ...]] = [()]
    index: Dict[Tuple[Tuple[str, str], ...], int] = {(): 0}
    for sample, pairs in per_sample.items():
        series_labels = tuple(sorted(pairs))
        g = index.get(series_labels)
        if g is None:
            g = index[series_labels] = len(groups)
            groups.append(series_labels)
        group[sample] = g
    return groups


class ProfileBuilder:
    """Builds a pprof profile from frames and values: query output, and the files the command
    line writes.  ``sample_types``: (type, unit) pairs, one value per pair in :meth:`add`."""

    def __init__(
        self,
        sample_types: Sequence[Tuple[str, str]],
        period_type: Tuple[str, str] = ("", ""),
        period: int = 0,
    ) -> None:
        self.profile = Profile()
        self._strings: Dict[str, int] = {}
        self._functions: Dict[Tuple[str, str], int] = {}
        self._locations: Dict[Frame, int] = {}
        self.string("")
        for sample_type, unit in sample_types:
            self.profile.sample_type.add(type=self.string(sample_type), unit=self.string(unit))
        if period_type[0]:
            self.profile.period_type.type = self.string(period_type[0])
            self.profile.period_type.unit = self.string(period_type[1])
        self.profile.period = period

    @classmethod
    def of_type(cls, profile_type: ProfileType, period: int = 0) -> ProfileBuilder:
        return cls(
            [(profile_type.sample_type, profile_type.sample_unit)],
            (profile_type.period_type, profile_type.period_unit),
            period,
        )

    def string(self, text: str) -> int:
        idx = self._strings.get(text)
        if idx is None:
            idx = self._strings[text] = len(self._strings)
            self.profile.string_table.append(text.encode("utf-8", "replace"))
        return idx

    def location(self, frame: Frame) -> int:
        loc_id = self._locations.get(frame)
        if loc_id is None:
            key = (frame.name, frame.filename)
            fn_id = self._functions.get(key)
            if fn_id is None:
                fn_id = self._functions[key] = len(self._functions) + 1
                self.profile.function.add(
                    id=fn_id,
                    name=self.string(frame.name),
                    system_name=self.string(frame.name),
                    filename=self.string(frame.filename),
                )
            loc_id = self._locations[frame] = len(self._locations) + 1
            loc = self.profile.location.add(id=loc_id)
            loc.line.add(function_id=fn_id, line=frame.line)
        return loc_id

    def add(self, root_first: Iterable[Frame], value: Union[int, Sequence[int]]) -> None:
        ids = [self.location(f) for f in root_first]
        ids.reverse()
        values = [value] if isinstance(value, int) else list(value)
        self.profile.sample.add(location_id=ids, value=values)


def read_stack_profile(data: bytes, max_size: int = 1 << 31) -> StackProfile:
    """A whole pprof file (gzip-compressed or not) as a :class:`StackProfile`."""
    decoded = parse(data, max_size)
    text = _Text(decoded.strings)
    types = [text(t) for t in decoded.sample_types[:, 0].tolist()]
    units = [text(u) for u in decoded.sample_types[:, 1].tolist()]
    frames: Dict[int, Frame] = {}
    for fid, fname, ffile, fline in zip(
        decoded.frame_id.tolist(),
        decoded.frame_name.tolist(),
        decoded.frame_file.tolist(),
        decoded.frame_line.tolist(),
    ):
        if fname < 0:  # unsymbolized: the line holds the address
            frames[fid] = Frame(f"0x{fline:x}")
        else:
            frames[fid] = Frame(text(fname), text(ffile), fline)
    out = StackProfile(
        [SampleType(t, u, metric_name([t], DEFAULT_DISPLAY_NAMES)) for t, u in zip(types, units)],
        period_type=(
            (text(decoded.period_type), text(decoded.period_unit))
            if decoded.has_period_type
            else ("", "")
        ),
        period=decoded.period,
        time_ns=decoded.time_nanos,
        duration_ns=decoded.duration_nanos,
        default_type=text(decoded.default_sample_type)
        if 0 < decoded.default_sample_type < len(decoded.strings)
        else "",
    )
    offsets = decoded.frame_off.tolist()
    all_frames = decoded.frames.tolist()
    for i, values in enumerate(decoded.values.tolist()):
        stack = [frames[f] for f in all_frames[offsets[i] : offsets[i + 1]]]
        out.add(stack, values)
    return out


def write_stack_profile(
    profile: StackProfile, compress: bool = True, default_sample_type: Optional[str] = None
) -> bytes:
    """``profile`` as pprof (gzip-compressed unless ``compress`` is False), every sample type
    a value column, as ``go tool pprof -sample_index=...`` picks them; ``default_sample_type``
    the one it shows without that option."""
    builder = ProfileBuilder(
        [(st.type, st.unit) for st in profile.sample_types], profile.period_type, profile.period
    )
    for stack, values in profile.stacks.items():
        builder.add(stack, values)
    builder.profile.time_nanos = profile.time_ns
    builder.profile.duration_nanos = profile.duration_ns
    default_sample_type = default_sample_type or profile.default_type
    if default_sample_type:
        builder.profile.default_sample_type = builder.string(default_sample_type)
    raw = builder.profile.SerializeToString()
    return gzip.compress(raw, compresslevel=6, mtime=0) if compress else raw
