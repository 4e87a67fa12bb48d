"""pprof in (any profiler's) and out (what ``go tool pprof`` reads).

Ingest follows what Pyroscope does with a pprof upload: every sample type becomes its own profile
type, the profile's metric name (``process_cpu``, ``memory``, ``wall``, ...) is derived from its
sample types, the sample labels ``span_id``/``profile_id`` and ``trace_id`` stay on the sample,
and every other sample label becomes a series label.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from google.protobuf.message import DecodeError

from hotspan.formats.compression import maybe_gunzip
from hotspan.formats.errors import FormatError
from hotspan.formats.proto import profile_pb2
from hotspan.model.labels import METRIC_NAME, normalize
from hotspan.model.profile import Frame, IngestBatch, ProfileType, span_id_to_int

Profile = profile_pb2.Profile

SPAN_LABELS = ("span_id", "profile_id")  # profile_id: the legacy name of the span id
TRACE_LABEL = "trace_id"
_HEX16 = re.compile(r"[0-9a-fA-F]{16}")
_HEX32 = re.compile(r"[0-9a-fA-F]{32}")
_BAD_LABEL_CHARS = re.compile(r"[^a-zA-Z0-9_.]")


def parse(data: bytes, max_size: int) -> Profile:
    """Parse a pprof payload, gzip-compressed or not."""
    raw = maybe_gunzip(data, max_size)
    if not raw:
        raise FormatError("empty pprof profile")
    try:
        profile = Profile.FromString(raw)
    except DecodeError as exc:
        raise FormatError(f"malformed pprof: {exc}") from None
    if not profile.sample_type:
        raise FormatError("malformed pprof: no sample types")
    return profile


def strings_of(profile: Profile) -> List[str]:
    # Invalid UTF-8 (seen from some profilers) is repaired rather than rejected.
    return [s.decode("utf-8", "replace") for s in profile.string_table]


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


def _sanitize_label_name(name: str) -> str:
    name = _BAD_LABEL_CHARS.sub("_", name)
    return "_" + name if name[:1].isdigit() else name


def to_batch(
    profile: Profile,
    batch: IngestBatch,
    labels: Mapping[str, str],
    default_ts_ns: int,
    sample_type_config: Optional[Mapping[str, Mapping[str, object]]] = None,
) -> int:
    """Add the samples of ``profile`` to ``batch``; returns how many samples were added.

    ``labels`` are the series labels of the upload; ``__name__`` is derived from the sample
    types when absent.
    """
    strings = strings_of(profile)
    n_strings = len(strings)

    def s(index: int) -> str:
        if 0 <= index < n_strings:
            return strings[index]
        raise FormatError(f"malformed pprof: string index {index} out of range")

    sample_types = [s(vt.type) for vt in profile.sample_type]
    sample_units = [s(vt.unit) for vt in profile.sample_type]
    config = sample_type_config or {}
    display = {
        k: str(v.get("display-name") or "") for k, v in config.items() if isinstance(v, dict)
    }
    display = {k: v for k, v in display.items() if v}
    base = dict(labels)
    if not base.get(METRIC_NAME):
        base[METRIC_NAME] = metric_name(sample_types, display)
    period_type = s(profile.period_type.type) if profile.HasField("period_type") else ""
    period_unit = s(profile.period_type.unit) if profile.HasField("period_type") else ""
    types = [
        ProfileType(base[METRIC_NAME], st, unit, period_type, period_unit)
        for st, unit in zip(sample_types, sample_units)
    ]
    ts = profile.time_nanos
    # Old py-spy/rbspy/pyroscope-rs builds wrote microseconds, or nothing, here.
    if ts < 365 * 86400 * 10**9:
        ts = default_ts_ns

    loc_frames = _location_frames(profile, s, batch)
    stack_of: Dict[Tuple[int, ...], int] = {}
    series_of: Dict[Tuple[Tuple[str, str], ...], List[int]] = {}
    added = 0
    for sample in profile.sample:
        span = 0
        trace = None
        extra: Tuple[Tuple[str, str], ...] = ()
        if sample.label:
            pairs = []
            for label in sample.label:
                key = s(label.key)
                if not label.str:
                    continue  # numeric labels (bytes, object counts) are not series labels
                value = s(label.str)
                if key in SPAN_LABELS:
                    if _HEX16.fullmatch(value):
                        span = span_id_to_int(value)
                elif key == TRACE_LABEL:
                    if _HEX32.fullmatch(value):
                        trace = value.lower()
                elif value:
                    pairs.append((_sanitize_label_name(key), value))
            extra = tuple(sorted(pairs))
        series_ids = series_of.get(extra)
        if series_ids is None:
            merged = dict(base)
            merged.update(extra)
            labelset = normalize(merged)
            series_ids = series_of[extra] = [batch.add_series(pt, labelset) for pt in types]
        locations = tuple(sample.location_id)
        stack = stack_of.get(locations)
        if stack is None:
            frames: List[int] = []
            try:
                for loc in reversed(locations):  # pprof lists the leaf first
                    frames.extend(loc_frames[loc])
            except KeyError:
                raise FormatError(f"malformed pprof: unknown location id {loc}") from None
            stack = stack_of[locations] = batch.add_stack(tuple(frames))
        values = sample.value
        if len(values) != len(types):
            raise FormatError(
                f"malformed pprof: sample has {len(values)} values for {len(types)} sample types"
            )
        for sid, value in zip(series_ids, values):
            if value:
                batch.add_sample(sid, ts, stack, value, span, trace)
                added += 1
    return added


def _location_frames(profile: Profile, s, batch: IngestBatch) -> Dict[int, Tuple[int, ...]]:  # type: ignore[no-untyped-def]
    """Frame ids of every location, root-most first (a location holds inlined frames)."""
    functions = {}
    for fn in profile.function:
        functions[fn.id] = (s(fn.name) or s(fn.system_name), s(fn.filename))
    mappings = {m.id: s(m.filename) for m in profile.mapping}
    out: Dict[int, Tuple[int, ...]] = {}
    for loc in profile.location:
        frames = []
        for line in reversed(loc.line):  # line[0] is the innermost inlined callee
            name, filename = functions.get(line.function_id, ("", ""))
            frames.append(batch.add_frame(Frame(name or "unknown", filename, line.line)))
        if not frames:
            # Unsymbolized: the address is all there is; the binary helps a person place it.
            binary = mappings.get(loc.mapping_id, "")
            name = f"{binary} 0x{loc.address:x}" if binary else f"0x{loc.address:x}"
            frames.append(batch.add_frame(Frame(name)))
        out[loc.id] = tuple(frames)
    return out


class ProfileBuilder:
    """Builds a pprof profile from frames and values (used for query output)."""

    def __init__(self, profile_type: ProfileType, period: int = 0) -> None:
        self.profile = Profile()
        self._strings: Dict[str, int] = {}
        self._functions: Dict[Tuple[str, str], int] = {}
        self._locations: Dict[Frame, int] = {}
        self.string("")
        self.profile.sample_type.add(
            type=self.string(profile_type.sample_type), unit=self.string(profile_type.sample_unit)
        )
        if profile_type.period_type:
            self.profile.period_type.type = self.string(profile_type.period_type)
            self.profile.period_type.unit = self.string(profile_type.period_unit)
        self.profile.period = period

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

    def add(self, root_first: Iterable[Frame], value: int) -> None:
        ids = [self.location(f) for f in root_first]
        ids.reverse()
        self.profile.sample.add(location_id=ids, value=[value])
