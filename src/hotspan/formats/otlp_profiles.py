"""OTLP profiles (``v1development``, the schema the ``opentelemetry-proto`` package ships) in.

The rules are Pyroscope's, so a profile lands where Pyroscope would put it:

- the profile type comes from the sample and period types, with the OpenTelemetry eBPF
  profiler's ``samples:count`` over a ``cpu:nanoseconds`` period turned into CPU nanoseconds
  (``process_cpu:cpu:nanoseconds:cpu:nanoseconds``);
- resource, scope, profile and sample attributes become series labels (strings and integers;
  names sanitised as pprof labels are), ``service.name`` becoming ``service_name``;
- a sample's link gives its ``span_id`` and ``trace_id``, kept on the sample as for pprof.

Unlike a pprof upload, every sample keeps its own timestamps: a sample with N timestamps and
N values is N points in time.  A profile that refers past the end of a table is rejected on its
own (partial success) and the rest of the request is kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
    ExportProfilesServiceResponse,
)

from hotspan.formats.errors import FormatError
from hotspan.formats.otlp import (
    MAX_ITEMS,
    MAX_RESOURCES,
    MAX_SCOPES,
    Rejections,
    check_count,
    check_time,
    decode_request,
    label_value,
)
from hotspan.formats.pprof import DEFAULT_DISPLAY_NAMES, metric_name, sanitize_label_name
from hotspan.model.labels import METRIC_NAME, SERVICE_NAME, SPY_NAME, normalize
from hotspan.model.profile import (
    MAX_SAMPLE_VALUE,
    MAX_STACK_DEPTH,
    Frame,
    IngestBatch,
    ProfileType,
)

SERVICE_NAME_ATTR = "service.name"
UNKNOWN_SERVICE = "unknown_service"

__all__ = [
    "ExportProfilesServiceRequest",
    "ExportProfilesServiceResponse",
    "ProfilesResult",
    "decode",
    "to_batch",
]


@dataclass
class ProfilesResult:
    batch: IngestBatch
    accepted: int = 0
    rejected: Rejections = field(default_factory=Rejections)


def decode(body: bytes, is_json: bool) -> ExportProfilesServiceRequest:
    return decode_request(body, is_json, ExportProfilesServiceRequest)


def to_batch(request: ExportProfilesServiceRequest, now_ns: Optional[int] = None) -> ProfilesResult:
    now_ns = now_ns or time.time_ns()
    result = ProfilesResult(IngestBatch())
    tables = _Tables(request.dictionary)
    check_count(len(request.resource_profiles), MAX_RESOURCES, "resource profiles")
    scopes = [sp for rp in request.resource_profiles for sp in rp.scope_profiles]
    check_count(len(scopes), MAX_SCOPES, "scope profiles")
    samples = sum(len(p.samples) for sp in scopes for p in sp.profiles)
    check_count(samples, MAX_ITEMS, "samples")
    for rp in request.resource_profiles:
        resource = tables.labels_of_kvs(rp.resource.attributes)
        for sp in rp.scope_profiles:
            scope = tables.labels_of_kvs(sp.scope.attributes)
            for i, profile in enumerate(sp.profiles):
                # A profile goes in whole or not at all: convert into a scratch batch first.
                scratch = IngestBatch()
                try:
                    _add_profile(profile, tables, [resource, scope], scratch, now_ns)
                except (FormatError, IndexError) as exc:
                    result.rejected.add(f"profile {i}: {exc}")
                    continue
                _merge(result.batch, scratch)
                result.accepted += 1
    return result


def _merge(into: IngestBatch, part: IngestBatch) -> None:
    into.series.update(part.series)
    into.frames.update(part.frames)
    into.stacks.update(part.stacks)
    into.add_columns(part.columns())


class _Tables:
    """The request's shared dictionary, with bounds-checked access."""

    def __init__(self, dictionary) -> None:
        self.d = dictionary
        self.strings: Sequence[str] = dictionary.string_table
        self._frames: Dict[int, Tuple[Frame, ...]] = {}

    def string(self, index: int) -> str:
        if not 0 <= index < len(self.strings):
            raise FormatError(f"string index {index} is out of the string table")
        return self.strings[index]

    def labels_of_kvs(self, kvs) -> List[Tuple[str, str]]:
        return [(kv.key, label_value(kv.value)) for kv in kvs]

    def labels_of_indices(self, indices: Sequence[int]) -> List[Tuple[str, str]]:
        table = self.d.attribute_table
        out = []
        for index in indices:
            if not 0 <= index < len(table):
                raise FormatError(f"attribute index {index} is out of the attribute table")
            attr = table[index]
            out.append((self.string(attr.key_strindex), label_value(attr.value)))
        return out

    def location_frames(self, index: int) -> Tuple[Frame, ...]:
        """The frames of one location, leaf first (inlined functions before their caller)."""
        frames = self._frames.get(index)
        if frames is not None:
            return frames
        table = self.d.location_table
        if not 0 <= index < len(table):
            raise FormatError(f"location index {index} is out of the location table")
        loc = table[index]
        mappings = self.d.mapping_table
        if loc.mapping_index and not 0 < loc.mapping_index < len(mappings):
            raise FormatError(f"mapping index {loc.mapping_index} is out of the mapping table")
        functions = self.d.function_table
        out = []
        for line in loc.lines:
            if not 0 <= line.function_index < len(functions):
                raise FormatError(f"function index {line.function_index} is out of the table")
            fn = functions[line.function_index]
            name = self.string(fn.name_strindex) or self.string(fn.system_name_strindex)
            out.append(Frame(name or "unknown", self.string(fn.filename_strindex), line.line))
        if not out:
            # Unsymbolized: the binary and the address are all there is.
            binary = ""
            if loc.mapping_index:
                binary = self.string(mappings[loc.mapping_index].filename_strindex)
            address = f"0x{loc.address:x}"
            out.append(Frame(f"{binary} {address}" if binary else address))
        frames = self._frames[index] = tuple(out)
        return frames

    def link(self, index: int) -> Tuple[int, Optional[str]]:
        """(span id as an unsigned integer or 0, trace id in hex or None) of a link index."""
        if index == 0:  # index 0 is the "no link" entry
            return 0, None
        table = self.d.link_table
        if not 0 < index < len(table):
            raise FormatError(f"link index {index} is out of the link table")
        link = table[index]
        span = int.from_bytes(link.span_id, "big") if len(link.span_id) == 8 else 0
        trace = link.trace_id.hex() if len(link.trace_id) == 16 and any(link.trace_id) else None
        return span, trace


def _labels(groups: Sequence[Sequence[Tuple[str, str]]]) -> Dict[str, str]:
    """Labels from attribute lists, the first occurrence of a name winning."""
    out: Dict[str, str] = {}
    for pairs in groups:
        for key, value in pairs:
            if not value:
                continue
            name = SERVICE_NAME if key == SERVICE_NAME_ATTR else sanitize_label_name(key)
            if not name:
                continue  # an attribute without a key names no label
            out.setdefault(name, value)
    return out


def _add_profile(
    profile, tables: _Tables, outer: List[List[Tuple[str, str]]], batch: IngestBatch, now_ns: int
) -> None:
    sample_type = tables.string(profile.sample_type.type_strindex)
    sample_unit = tables.string(profile.sample_type.unit_strindex)
    period_type = period_unit = ""
    if profile.HasField("period_type") and profile.period:
        period_type = tables.string(profile.period_type.type_strindex)
        period_unit = tables.string(profile.period_type.unit_strindex)
    if not sample_type:
        raise FormatError("the profile has no sample type")
    scale = 1
    if (sample_type, sample_unit, period_type, period_unit) == (
        "samples",
        "count",
        "cpu",
        "nanoseconds",
    ):
        # The eBPF profiler counts samples; each stands for one period of CPU.
        sample_type, sample_unit, scale = "cpu", "nanoseconds", profile.period
    if (sample_type, sample_unit, period_type) == ("off_cpu", "nanoseconds", ""):
        name = "off_cpu"  # Pyroscope's name for the eBPF profiler's off-CPU profiles
    else:
        name = metric_name([sample_type], DEFAULT_DISPLAY_NAMES)
    ptype = ProfileType.of(name, sample_type, sample_unit, period_type, period_unit)
    base_ts = profile.time_unix_nano or now_ns
    check_time(base_ts, "profile time")
    profile_labels = tables.labels_of_indices(profile.attribute_indices)
    stack_ids: Dict[int, int] = {}
    series_ids: Dict[Tuple[int, ...], int] = {}
    for sample in profile.samples:
        index = sample.stack_index
        stack = stack_ids.get(index)
        if stack is None:
            stack = stack_ids[index] = _stack(index, tables, batch)
        attrs = tuple(sample.attribute_indices)
        sid = series_ids.get(attrs)
        if sid is None:
            labels = _labels([tables.labels_of_indices(attrs), *outer, profile_labels])
            labels.setdefault(SERVICE_NAME, UNKNOWN_SERVICE)
            labels[METRIC_NAME] = name
            labels.setdefault(SPY_NAME, "otlp")
            sid = series_ids[attrs] = batch.add_series(ptype, normalize(labels))
        span, trace = tables.link(sample.link_index)
        for ts, value in _points(sample, base_ts):
            value *= scale
            if value < 0 or value > MAX_SAMPLE_VALUE:
                raise FormatError(f"sample value {value} is outside 0..{MAX_SAMPLE_VALUE}")
            if value:
                batch.add_sample(sid, ts, stack, value, span, trace)


def _points(sample, base_ts: int) -> List[Tuple[int, int]]:
    """(time, value) pairs of a sample: one per timestamp when there are timestamps."""
    values = list(sample.values)
    stamps = list(sample.timestamps_unix_nano)
    for ts in stamps:
        check_time(ts, "sample timestamp")
    if stamps and len(values) == len(stamps):
        return list(zip(stamps, values))
    if stamps and not values:
        return [(ts, 1) for ts in stamps]  # no values: each timestamp is one event
    if not values:
        raise FormatError("a sample has neither values nor timestamps")
    return [(stamps[0] if stamps else base_ts, sum(values))]


def _stack(index: int, tables: _Tables, batch: IngestBatch) -> int:
    table = tables.d.stack_table
    if not 0 <= index < len(table):
        raise FormatError(f"stack index {index} is out of the stack table")
    leaf_first: List[Frame] = []
    for loc in table[index].location_indices:
        leaf_first.extend(tables.location_frames(loc))
    root_first = leaf_first[::-1][:MAX_STACK_DEPTH]
    return batch.add_stack(tuple(batch.add_frame(f) for f in root_first))
