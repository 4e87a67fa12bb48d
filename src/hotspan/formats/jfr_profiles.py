"""JFR uploads (the Pyroscope Java SDK's ``format=jfr``) into the profiles Pyroscope makes of them.

Pyroscope (through grafana/jfr-parser) turns each kind of JFR event into its own profile:

================================  ===========  =============================================
event                             ``__name__`` sample types (period type)
================================  ===========  =============================================
jdk.ExecutionSample               process_cpu  cpu/nanoseconds (cpu/nanoseconds); also wall
                                               when the recording's ``event`` setting is wall
profiler.WallClockSample          wall         wall/nanoseconds (wall/nanoseconds)
jdk.ObjectAllocationInNewTLAB     memory       alloc_in_new_tlab_objects, _bytes (space/bytes)
jdk.ObjectAllocationOutsideTLAB   memory       alloc_outside_tlab_objects, _bytes (space/bytes)
jdk.ObjectAllocationSample        memory       alloc_sample_objects, _bytes (space/bytes)
jdk.JavaMonitorEnter              mutex        contentions/count, delay/nanoseconds (mutex/count)
jdk.ThreadPark                    block        contentions/count, delay/nanoseconds (block/count)
profiler.LiveObject               memory       live/count (objects/count)
profiler.Malloc                   memory       malloc_objects, malloc_bytes
================================  ===========  =============================================

A cpu or wall sample is worth one sampling period (``1e9 / sampleRate`` ns); durations are the
events' raw values, as Pyroscope stores them.  A frame is named ``class.method`` (JVM-generated
class names merged, see :func:`hotspan.formats.jfr.merge_generated_names`).  Every series also
gets ``jfr_event`` (the profiler's event: cpu, itimer, wall...), and ``service_name`` is the
upload's whole app name.  The optional ``labels`` part (a ``LabelsSnapshot``) names each event's
``contextId``: those labels, and ``span_name``, become series labels, and the span id goes on the
sample, as for pprof.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from google.protobuf.message import DecodeError

from hotspan.formats.compression import maybe_gunzip
from hotspan.formats.jfr import MAX_VALUES, JfrError, Recording, StackFrames
from hotspan.formats.pprof import sanitize_label_name
from hotspan.formats.proto import jfr_labels_pb2
from hotspan.model.labels import METRIC_NAME, SERVICE_NAME, normalize
from hotspan.model.profile import (
    MAX_SAMPLE_VALUE,
    MAX_STACK_DEPTH,
    Frame,
    IngestBatch,
    ProfileType,
)

JFR_EVENT = "jfr_event"
APP_NAME = "app_name"
_ALLOWED_PRIVATE = ("__session_id__",)  # the only ``__`` label Pyroscope ingests


@dataclass(frozen=True)
class Kind:
    """One profile a recording can yield: its ``__name__``, sample types and period type."""

    metric: str
    sample_types: Tuple[Tuple[str, str], ...]
    period: Tuple[str, str]

    def profile_types(self) -> List[ProfileType]:
        return [ProfileType.of(self.metric, t, u, *self.period) for t, u in self.sample_types]


CPU = Kind("process_cpu", (("cpu", "nanoseconds"),), ("cpu", "nanoseconds"))
WALL = Kind("wall", (("wall", "nanoseconds"),), ("wall", "nanoseconds"))
IN_TLAB = Kind(
    "memory",
    (("alloc_in_new_tlab_objects", "count"), ("alloc_in_new_tlab_bytes", "bytes")),
    ("space", "bytes"),
)
OUTSIDE_TLAB = Kind(
    "memory",
    (("alloc_outside_tlab_objects", "count"), ("alloc_outside_tlab_bytes", "bytes")),
    ("space", "bytes"),
)
ALLOC_SAMPLE = Kind(
    "memory",
    (("alloc_sample_objects", "count"), ("alloc_sample_bytes", "bytes")),
    ("space", "bytes"),
)
LOCK = Kind("mutex", (("contentions", "count"), ("delay", "nanoseconds")), ("mutex", "count"))
THREAD_PARK = Kind(
    "block", (("contentions", "count"), ("delay", "nanoseconds")), ("block", "count")
)
LIVE = Kind("memory", (("live", "count"),), ("objects", "count"))
MALLOC = Kind("memory", (("malloc_objects", "count"), ("malloc_bytes", "bytes")), ("", ""))

# (stack, contextId, spanId, spanName id): samples with all four equal are merged.
SampleKey = Tuple[StackFrames, int, int, int]


@dataclass
class JfrProfiles:
    """What a recording holds: per kind, the summed values of each distinct sample."""

    event: str = ""  # the profiler's ``event`` setting (cpu, itimer, wall...), "" if unset
    samples: Dict[Kind, Dict[SampleKey, List[int]]] = field(default_factory=dict)

    def add(self, kind: Kind, key: SampleKey, values: Tuple[int, ...]) -> None:
        per_kind = self.samples.get(kind)
        if per_kind is None:
            per_kind = self.samples[kind] = {}
        known = per_kind.get(key)
        if known is None:
            per_kind[key] = list(values)
        else:
            for i, v in enumerate(values):
                known[i] += v


def _int(value: object) -> int:
    """An event's integer field; absent or malformed counts as 0, huge ones are capped."""
    if not isinstance(value, int):
        return 0
    return min(int(value), MAX_SAMPLE_VALUE)


def _id(value: object) -> int:
    """An id field (context, span, string); 0 when absent.  A field the metadata declares
    ``boolean`` reads as a bool: as an id it is the integer, not a bool (which the labels
    snapshot's maps refuse as a key)."""
    return int(value) if isinstance(value, int) and 0 <= value < 1 << 64 else 0


def parse(data: bytes, sample_rate: int, max_values: int = MAX_VALUES) -> JfrProfiles:
    """Sum a recording's profile events (``data``: the JFR bytes, not compressed;
    ``max_values``: see :data:`hotspan.formats.jfr.MAX_VALUES`)."""
    period = 1_000_000_000 // sample_rate if sample_rate > 0 else 0
    out = JfrProfiles()
    for ev in Recording(data, max_values).events():
        v = ev.values
        name = ev.type_name
        if name == "jdk.ActiveSetting":
            if ev.chunk.text(v["name"]) == "event":
                out.event = ev.chunk.text(v["value"]) or ""
            continue
        stack = ev.chunk.stack(v["stackTrace"])
        if stack is None:
            continue  # no such stack trace in the pool: Pyroscope drops the sample too
        ctx = (_id(v.get("contextId")), _id(v.get("spanId")), _id(v.get("spanName")))
        key = (stack,) + ctx
        if name == "jdk.ExecutionSample":
            state = ev.chunk.thread_state(v["state"])
            if state is not None and state != "STATE_SLEEPING":
                out.add(CPU, key, (period,))
            if out.event == "wall":
                out.add(WALL, key, (period,))
        elif name == "profiler.WallClockSample":
            samples = v["samples"] if isinstance(v["samples"], int) else 1
            value = min(samples * period, MAX_SAMPLE_VALUE)
            if out.event == "wall" and ev.chunk.thread_state(v["state"]) == "STATE_RUNNABLE":
                out.add(CPU, key, (value,))
            out.add(WALL, key, (value,))
        elif name == "jdk.ObjectAllocationInNewTLAB":
            out.add(IN_TLAB, key, (1, _int(v["tlabSize"])))
        elif name == "jdk.ObjectAllocationOutsideTLAB":
            out.add(OUTSIDE_TLAB, key, (1, _int(v["allocationSize"])))
        elif name == "jdk.JavaMonitorEnter":
            out.add(LOCK, key, (1, _int(v["duration"])))
        else:
            # Pyroscope keeps no context for these.
            key = (stack, 0, 0, 0)
            if name == "jdk.ThreadPark":
                out.add(THREAD_PARK, key, (1, _int(v["duration"])))
            elif name == "profiler.LiveObject":
                out.add(LIVE, key, (1,))
            elif name == "jdk.ObjectAllocationSample":
                out.add(ALLOC_SAMPLE, key, (1, _int(v["weight"])))
            elif name == "profiler.Malloc":
                out.add(MALLOC, key, (1, _int(v["size"])))
    return out


def parse_labels(data: bytes) -> jfr_labels_pb2.LabelsSnapshot:
    """The ``labels`` part: a ``LabelsSnapshot`` protobuf (already decompressed)."""
    snapshot = jfr_labels_pb2.LabelsSnapshot()
    try:
        snapshot.ParseFromString(data)
    except DecodeError as exc:
        raise JfrError(f"the 'labels' part is not a LabelsSnapshot protobuf: {exc}") from None
    return snapshot


def series_labels(app_name: str, labels: Mapping[str, str], event: str) -> Dict[str, str]:
    """The labels every series of a JFR upload gets, as Pyroscope's ingest gives them: the
    name's tags (no ``__`` ones), ``jfr_event``, and the app name as ``service_name`` (as
    ``app_name`` when the tags already have a ``service_name``)."""
    out = {k: v for k, v in labels.items() if not k.startswith("__") or k in _ALLOWED_PRIVATE}
    out[JFR_EVENT] = event
    out[APP_NAME if SERVICE_NAME in out else SERVICE_NAME] = app_name
    return out


def _signed(n: int) -> int:
    """An unsigned 64-bit id as the int64 with the same bits."""
    return n - (1 << 64) if n >= 1 << 63 else n


class _Context:
    """Resolves an event's (contextId, spanId, spanName) to sample labels and a span id."""

    def __init__(self, snapshot: Optional[jfr_labels_pb2.LabelsSnapshot]) -> None:
        self.snapshot = snapshot
        self._cache: Dict[Tuple[int, int], Tuple[Tuple[str, str], ...]] = {}

    def labels(self, context_id: int, span_name: int) -> Tuple[Tuple[str, str], ...]:
        key = (context_id, span_name)
        known = self._cache.get(key)
        if known is not None:
            return known
        pairs: Dict[str, str] = {}
        snap = self.snapshot
        if snap is not None:
            # The events' ids are unsigned 64-bit, the snapshot's keys int64: Pyroscope casts
            # (int64(contextId)), so an id above 2^63 names a negative key.
            context_id, span_name = _signed(context_id), _signed(span_name)
            strings = snap.strings
            if context_id in snap.contexts:
                for k, v in snap.contexts[context_id].labels.items():
                    name = sanitize_label_name(strings.get(k, ""))
                    value = strings.get(v, "")
                    if name and value and not name.startswith("__"):
                        pairs[name] = value
            if span_name:
                name = strings.get(span_name, "")
                if name:
                    pairs["span_name"] = name
        out = self._cache[key] = tuple(sorted(pairs.items()))
        return out


def to_batch(
    profiles: JfrProfiles,
    batch: IngestBatch,
    base_labels: Mapping[str, str],
    ts: int,
    snapshot: Optional[jfr_labels_pb2.LabelsSnapshot] = None,
) -> int:
    """Add the profiles to ``batch`` at time ``ts``; returns how many samples were added.
    ``base_labels``: every series' labels (see :func:`series_labels`)."""
    context = _Context(snapshot)
    stacks: Dict[StackFrames, int] = {}
    added = 0
    for kind, samples in profiles.samples.items():
        types = kind.profile_types()
        base = dict(base_labels)
        base[METRIC_NAME] = kind.metric
        series: Dict[Tuple[Tuple[str, str], ...], List[int]] = {}
        for (stack, context_id, span_id, span_name), values in samples.items():
            extra = context.labels(context_id, span_name)
            sids = series.get(extra)
            if sids is None:
                labels = normalize({**base, **dict(extra)})
                sids = series[extra] = [batch.add_series(t, labels) for t in types]
            stack_id = stacks.get(stack)
            if stack_id is None:
                root_first = stack[::-1][:MAX_STACK_DEPTH]
                frame_ids = tuple(batch.add_frame(Frame(n, "", line)) for n, line in root_first)
                stack_id = stacks[stack] = batch.add_stack(frame_ids)
            for sid, value in zip(sids, values):
                if value > 0:
                    batch.add_sample(sid, ts, stack_id, min(value, MAX_SAMPLE_VALUE), span_id)
                    added += 1
    return added


def ingest(
    jfr: bytes,
    labels_part: bytes,
    batch: IngestBatch,
    app_name: str,
    tags: Mapping[str, str],
    ts: int,
    sample_rate: int,
    max_bytes: int,
) -> int:
    """One ``/ingest?format=jfr`` upload: the recording (gzip'd or not), the optional
    ``labels`` part, the name's app and tags; adds its samples to ``batch``."""
    if not jfr:
        raise JfrError("the 'jfr' part is empty")
    data = maybe_gunzip(jfr, max_bytes)
    snapshot = parse_labels(maybe_gunzip(labels_part, max_bytes)) if labels_part else None
    profiles = parse(data, sample_rate)
    return to_batch(profiles, batch, series_labels(app_name, tags, profiles.event), ts, snapshot)
