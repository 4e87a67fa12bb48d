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
from typing import Callable, Dict, List, Mapping, Optional, Set, Tuple, Union

import numpy as np
from google.protobuf.message import DecodeError

from hotspan import _speedups
from hotspan.formats.compression import maybe_gunzip
from hotspan.formats.jfr import (
    MAX_VALUES,
    JfrError,
    Recording,
    StackFrames,
    merge_generated_names,
)
from hotspan.formats.pprof import sanitize_label_name
from hotspan.formats.proto import jfr_labels_pb2
from hotspan.model.hashing import hash_frame, hash_stack
from hotspan.model.labels import METRIC_NAME, SERVICE_NAME, normalize
from hotspan.model.profile import (
    MAX_SAMPLE_VALUE,
    MAX_STACK_DEPTH,
    Frame,
    IngestBatch,
    ProfileType,
    SampleColumns,
    StackChunk,
)

# The C reader (hotspan/_speedups/jfr.c): the same profiles as parse(), at a fraction of its
# cost; None when the extension is not built or HOTSPAN_NO_SPEEDUPS is set.
_fast = _speedups.load_module("_jfr")

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
# Every kind, in the order of the C reader's kind numbers.
KINDS = (CPU, WALL, IN_TLAB, OUTSIDE_TLAB, ALLOC_SAMPLE, LOCK, THREAD_PARK, LIVE, MALLOC)

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
            # Capped as each value is: a sum of many stays a number the store can take.
            for i, v in enumerate(values):
                known[i] = min(known[i] + v, MAX_SAMPLE_VALUE)


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


@dataclass
class KindSamples:
    """One kind's distinct samples as columns (row i: a key of JfrProfiles.samples[kind])."""

    stack: np.ndarray  # int64: index into DecodedJfr's stacks
    context_id: np.ndarray  # uint64
    span_id: np.ndarray  # uint64
    span_name: np.ndarray  # uint64 (an id into the labels snapshot's strings)
    values: np.ndarray  # int64, (rows, len(kind.sample_types)), each <= MAX_SAMPLE_VALUE


@dataclass
class DecodedJfr:
    """A recording's profiles in array form, what :func:`to_batch` takes: distinct frames
    (name, line) with their store ids, distinct stacks (frame indexes, leaf first) with their
    store ids (root first, at most MAX_STACK_DEPTH frames), and each kind's samples."""

    event: str
    names: bytes  # every distinct frame name, UTF-8, one after another
    name_off: np.ndarray  # int64, (names + 1): where each starts in ``names``
    frame_name: np.ndarray  # int64: index of the frame's name
    frame_line: np.ndarray  # int64
    frame_id: np.ndarray  # int64: hash_frame(name, "", line)
    stack_off: np.ndarray  # int64, (stacks + 1): where each stack starts in stack_frames
    stack_frames: np.ndarray  # int64: frame indexes, leaf first
    stack_id: np.ndarray  # int64: hash_stack of the root-first frame ids
    samples: Dict[Kind, KindSamples]

    def name(self, i: int) -> str:
        return self.names[int(self.name_off[i]) : int(self.name_off[i + 1])].decode()

    def stack(self, i: int) -> StackFrames:
        frames = self.stack_frames[int(self.stack_off[i]) : int(self.stack_off[i + 1])].tolist()
        lines = self.frame_line.tolist()
        return tuple((self.name(int(self.frame_name[f])), lines[f]) for f in frames)

    def profiles(self) -> JfrProfiles:
        """The same profiles as :func:`parse` gives (how the C reader is held to it)."""
        out = JfrProfiles(self.event)
        stacks: Dict[int, StackFrames] = {}
        for kind, ks in self.samples.items():
            rows: Dict[SampleKey, List[int]] = {}
            for s, c, sp, sn, vals in zip(
                ks.stack.tolist(),
                ks.context_id.tolist(),
                ks.span_id.tolist(),
                ks.span_name.tolist(),
                ks.values.tolist(),
            ):
                stack = stacks.get(s)
                if stack is None:
                    stack = stacks[s] = self.stack(s)
                rows[(stack, c, sp, sn)] = vals
            out.samples[kind] = rows
        return out


def from_profiles(profiles: JfrProfiles, max_depth: int = MAX_STACK_DEPTH) -> DecodedJfr:
    """:func:`parse`'s profiles in the array form (the pure-Python path to :func:`to_batch`)."""
    names: Dict[str, int] = {}
    frames: Dict[Tuple[str, int], int] = {}
    frame_name: List[int] = []
    frame_line: List[int] = []
    frame_id: List[int] = []
    stacks: Dict[StackFrames, int] = {}
    stack_off = [0]
    stack_frames: List[int] = []
    stack_id: List[int] = []
    samples: Dict[Kind, KindSamples] = {}
    for kind, rows in profiles.samples.items():
        cols: List[List[int]] = [[], [], [], []]
        values: List[List[int]] = []
        for (stack, ctx, span, span_name), vals in rows.items():
            s = stacks.get(stack)
            if s is None:
                ids = []
                for name, line in stack:
                    f = frames.get((name, line))
                    if f is None:
                        f = frames[(name, line)] = len(frame_id)
                        frame_name.append(names.setdefault(name, len(names)))
                        frame_line.append(line)
                        frame_id.append(_frame_id(name, line))
                    ids.append(f)
                s = stacks[stack] = len(stack_id)
                stack_frames.extend(ids)
                stack_off.append(len(stack_frames))
                stack_id.append(hash_stack([frame_id[f] for f in reversed(ids)][:max_depth]))
            for col, v in zip(cols, (s, ctx, span, span_name)):
                col.append(v)
            values.append([int(v) for v in vals])
        samples[kind] = KindSamples(
            np.array(cols[0], dtype=np.int64),
            np.array(cols[1], dtype=np.uint64),
            np.array(cols[2], dtype=np.uint64),
            np.array(cols[3], dtype=np.uint64),
            np.array(values, dtype=np.int64).reshape(len(values), len(kind.sample_types)),
        )
    encoded = [n.encode() for n in names]
    name_off = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=name_off[1:])
    i64 = np.int64
    return DecodedJfr(
        profiles.event,
        b"".join(encoded),
        name_off,
        np.array(frame_name, dtype=i64),
        np.array(frame_line, dtype=i64),
        np.array(frame_id, dtype=i64),
        np.array(stack_off, dtype=i64),
        np.array(stack_frames, dtype=i64),
        np.array(stack_id, dtype=i64),
        samples,
    )


_FRAME_IDS: Dict[Tuple[str, int], int] = {}


def _frame_id(name: str, line: int) -> int:
    fid = _FRAME_IDS.get((name, line))
    if fid is None:
        if len(_FRAME_IDS) > 200_000:
            _FRAME_IDS.clear()
        fid = _FRAME_IDS[(name, line)] = hash_frame(name.encode(), b"", line)
    return fid


def decode(
    data: bytes,
    sample_rate: int,
    max_values: int = MAX_VALUES,
    native: Optional[bool] = None,
) -> DecodedJfr:
    """A recording's profiles in array form: by the C reader when it is built (``native``
    None) or asked for (True), else by :func:`parse`.  Both give the same profiles."""
    if native is None:
        native = _fast is not None
    if not native:
        return from_profiles(parse(data, sample_rate, max_values))
    if _fast is None:
        raise RuntimeError("the C extension hotspan._speedups._jfr is not built")
    period = 1_000_000_000 // sample_rate if sample_rate > 0 else 0
    try:
        t = _fast.decode(data, period, max_values, MAX_STACK_DEPTH, merge_generated_names)
    except ValueError as exc:
        raise JfrError(str(exc)) from None
    i64 = np.int64
    samples = {}
    for kind_no, stack, ctx, span, span_name, values in t[9]:
        kind = KINDS[kind_no]
        samples[kind] = KindSamples(
            np.frombuffer(stack, dtype=i64),
            np.frombuffer(ctx, dtype=np.uint64),
            np.frombuffer(span, dtype=np.uint64),
            np.frombuffer(span_name, dtype=np.uint64),
            np.frombuffer(values, dtype=i64).reshape(-1, len(kind.sample_types)),
        )
    names_off, frame_name, frame_line, frame_id, stack_off, stack_frames, stack_id = (
        np.frombuffer(b, dtype=i64) for b in t[2:9]
    )
    return DecodedJfr(
        t[0],
        t[1],
        names_off,
        frame_name,
        frame_line,
        frame_id,
        stack_off,
        stack_frames,
        stack_id,
        samples,
    )


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
    profiles: Union[DecodedJfr, JfrProfiles],
    batch: IngestBatch,
    base_labels: Mapping[str, str],
    ts: int,
    snapshot: Optional[jfr_labels_pb2.LabelsSnapshot] = None,
) -> int:
    """Add the profiles to ``batch`` at time ``ts``; returns how many samples were added.
    ``base_labels``: every series' labels (see :func:`series_labels`).  Whole columns, as
    pprof's to_batch adds them: frames are named only when the store asks for them."""
    decoded = profiles if isinstance(profiles, DecodedJfr) else from_profiles(profiles)
    if not decoded.samples:
        return 0
    context = _Context(snapshot)
    used = np.unique(np.concatenate([ks.stack for ks in decoded.samples.values()]))
    batch.stack_chunks.append(_stack_chunk(decoded, used))
    batch.frame_sources.append(_frame_source(decoded))
    added = 0
    for kind, ks in decoded.samples.items():
        types = kind.profile_types()
        base = dict(base_labels)
        base[METRIC_NAME] = kind.metric
        n = len(ks.stack)
        group = np.zeros(n, dtype=np.int64)
        groups: List[Tuple[Tuple[str, str], ...]] = [()]
        if snapshot is not None:
            groups = []  # only those some sample names: a series per group
            index: Dict[Tuple[Tuple[str, str], ...], int] = {}
            known: Dict[Tuple[int, int], int] = {}
            for i, key in enumerate(zip(ks.context_id.tolist(), ks.span_name.tolist())):
                g = known.get(key)
                if g is None:
                    extra = context.labels(*key)
                    g = index.get(extra)
                    if g is None:
                        g = index[extra] = len(groups)
                        groups.append(extra)
                    known[key] = g
                group[i] = g
        series = np.array(
            [
                [batch.add_series(t, normalize({**base, **dict(extra)})) for t in types]
                for extra in groups
            ],
            dtype=np.int64,
        )
        stack_ids = decoded.stack_id[ks.stack]
        for t in range(len(types)):
            values = ks.values[:, t]
            keep = values > 0
            count = int(keep.sum())
            if not count:
                continue
            batch.add_columns(
                SampleColumns(
                    series[group[keep], t],
                    np.full(count, ts, dtype=np.int64),
                    stack_ids[keep],
                    values[keep],
                    ks.span_id[keep],
                    np.full(count, None, dtype=object),
                )
            )
            added += count
    return added


def _stack_chunk(decoded: DecodedJfr, used: np.ndarray) -> StackChunk:
    """The used stacks, root first, at most MAX_STACK_DEPTH frames each."""
    ends = decoded.stack_off[used + 1]
    depth = np.minimum(ends - decoded.stack_off[used], MAX_STACK_DEPTH)
    offsets = np.zeros(len(used) + 1, dtype=np.int64)
    np.cumsum(depth, out=offsets[1:])
    # Entry j of stack k is leaf-first position (end - 1 - j): the list reversed.
    within = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], depth)
    frames = decoded.frame_id[decoded.stack_frames[np.repeat(ends - 1, depth) - within]]
    return StackChunk(decoded.stack_id[used], frames, offsets)


def _frame_source(decoded: DecodedJfr) -> Callable[[Set[int]], Dict[int, Frame]]:
    """Names the recording's frames on demand (the store asks only for unseen stacks')."""

    def frames(wanted: Set[int]) -> Dict[int, Frame]:
        out: Dict[int, Frame] = {}
        for fid, name, line in zip(
            decoded.frame_id.tolist(), decoded.frame_name.tolist(), decoded.frame_line.tolist()
        ):
            if fid in wanted and fid not in out:
                out[fid] = Frame(decoded.name(name), "", line)
        return out

    return frames


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
    profiles = decode(data, sample_rate)
    return to_batch(profiles, batch, series_labels(app_name, tags, profiles.event), ts, snapshot)
