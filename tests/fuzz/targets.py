"""Fuzz targets: untrusted bytes through the server's decoders, as the server calls them.

Each target takes one input and returns normally when the input decodes, or is refused with
an error the server answers with a 4xx (:class:`FormatError` and its kinds, an ``HTTPError``
below 500).  Anything else escapes: another exception, a crash, or a decode whose result
breaks what the store relies on (:class:`Finding`: values, times, stacks and frames that
resolve, text that encodes).  The C pprof decoder, JFR reader and OTLP span reader are also
checked against the Python ones (their reference implementations): both accept with the same
result, or both refuse.

The fuzzer (tests/fuzz/run.py) and the crash replay (tests/test_fuzz_crashes.py) share these.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from hotspan.formats import jfr_profiles, pprof
from hotspan.formats import otlp_traces as otlp_traces_format
from hotspan.formats.compression import gunzip, maybe_gunzip
from hotspan.formats.errors import FormatError
from hotspan.formats.pprof_decode import DecodedProfile, _fast, decode_inflating, decode_python
from hotspan.formats.proto import push_pb2
from hotspan.model.labels import is_valid_label_name
from hotspan.model.profile import (
    MAX_SAMPLE_VALUE,
    MAX_STACK_DEPTH,
    MAX_TIME_NS,
    IngestBatch,
    ProfileType,
)
from hotspan.model.trace import SpanBatch
from hotspan.server.config import ServerConfig
from hotspan.server.errors import HTTPError
from hotspan.server.otlp import http_receiver as server_otlp
from hotspan.server.pyroscope.connect import read_message
from hotspan.server.request import read_body

# The server's limits, scaled to inputs of a few KiB: a gzip bomb still reaches its limit
# quickly, and a decoded payload is never so large that plain work on it looks like a hang.
MAX_DECOMPRESSED = 1 << 20
CONFIG = ServerConfig(max_body_bytes=1 << 16, max_decompressed_bytes=MAX_DECOMPRESSED)
TS = 1_700_000_000 * 10**9
LABELS = {"service_name": "fuzz", "pyroscope_spy": "fuzz"}


class Finding(AssertionError):
    """A decode that succeeded with a result the store cannot take."""


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise Finding(what)


def _text(value: object, what: str) -> None:
    _check(isinstance(value, str), f"{what} is not text: {value!r}")
    try:
        value.encode("utf-8")  # type: ignore[union-attr]
    except UnicodeEncodeError as exc:
        raise Finding(f"{what} does not encode as UTF-8: {exc}") from None


def _labels(pairs: Iterable[Tuple[str, str]]) -> None:
    for key, value in pairs:
        _text(key, "label name")
        _text(value, f"value of label {key!r}")
        _check(is_valid_label_name(key), f"invalid label name {key!r}")


def check_batch(batch: IngestBatch) -> None:
    """What the store relies on in a profile batch."""
    cols = batch.columns()
    n = len(cols.value)
    _check(all(len(c) == n for c in cols), "sample columns of different lengths")
    if n:
        _check(int(cols.value.min()) > 0, "a sample value <= 0")
        _check(int(cols.value.max()) <= MAX_SAMPLE_VALUE, "a sample value over the maximum")
        _check(int(cols.ts.min()) >= 0, f"a sample time before 1970: {int(cols.ts.min())}")
        _check(int(cols.ts.max()) < MAX_TIME_NS, f"a sample time past 2116: {int(cols.ts.max())}")
    _check(set(cols.series_id.tolist()) <= batch.series.keys(), "a sample of an unknown series")
    stacks = batch.new_stacks(set())
    _check(set(cols.stack_id.tolist()) <= stacks.keys(), "a sample of an unknown stack")
    wanted = set()
    for frames in stacks.values():
        _check(len(frames) <= MAX_STACK_DEPTH, f"a stack of {len(frames)} frames")
        wanted.update(frames)
    named = batch.frames_for(wanted)
    _check(wanted <= named.keys(), "a stack frame without a name")
    for frame in named.values():
        _text(frame.name, "frame name")
        _text(frame.filename, "frame file name")
        _check(-(1 << 63) <= frame.line < 1 << 63, f"frame line {frame.line} is not an int64")
    for trace in cols.trace_id.tolist():
        _check(trace is None or (isinstance(trace, str) and len(trace) == 32), "a bad trace id")
    for info in batch.series.values():
        ptype = info.profile_type
        _check(ProfileType.parse(ptype.id) == ptype, f"profile type {ptype.id!r} does not parse")
        _text(ptype.id, "profile type")
        _labels(info.labels)


def check_spans(batch: SpanBatch) -> None:
    """What the store relies on in a span batch."""
    for row in batch.rows:
        _check(len(row.trace_id) == 32, f"trace id {row.trace_id!r}")
        _check(0 < row.span_id < 1 << 64, f"span id {row.span_id}")
        _check(0 <= row.parent_span_id < 1 << 64, f"parent span id {row.parent_span_id}")
        _check(0 <= row.start_ns <= row.end_ns < MAX_TIME_NS, "span times out of order or range")
        _check(row.group_id in batch.groups, "a span of an unknown group")
        for text, what in ((row.name, "span name"), (row.service, "service"), (row.attrs, "attrs")):
            _text(text, what)
    for group in batch.groups.values():
        _text(group.service, "service")
        _text(group.attrs, "resource attributes")
    for scope, key, value, kind in batch.tags:
        for text in (scope, key, value, kind):
            _text(text, "tag")


# -- pprof --------------------------------------------------------------------------------------


def _ingest_pprof(decoded: DecodedProfile) -> None:
    batch = IngestBatch()
    try:
        pprof.to_batch(decoded, batch, LABELS, TS)
    except FormatError:
        return
    check_batch(batch)


def _decode_python(raw: bytes) -> Optional[DecodedProfile]:
    try:
        return decode_python(raw)
    except FormatError:
        return None


def pprof_c(data: bytes) -> None:
    """The C decoder (what the server runs), the Python one beside it as the reference."""
    if _fast is None:
        raise RuntimeError("the C extension hotspan._speedups._pprof is not built")
    try:
        # Inflated by the C decoder too (as where ISA-L is not installed).
        decoded: Optional[DecodedProfile] = decode_inflating(data, MAX_DECOMPRESSED)
    except FormatError:
        decoded = None
    if decoded is not None and not len(decoded.sample_types):
        decoded = None  # pprof.parse refuses it
    reference = _reference(data)
    _check(
        (decoded is None) == (reference is None),
        "the C decoder " + ("refuses" if decoded is None else "accepts") + " what Python does not",
    )
    if decoded is None or reference is None:
        return
    for name, mine in vars(decoded).items():
        theirs = getattr(reference, name)
        if isinstance(mine, np.ndarray):
            same = mine.shape == theirs.shape and bool(np.array_equal(mine, theirs))
        elif name == "strings":
            same = list(mine) == list(theirs)
        else:
            same = mine == theirs
        _check(same, f"C and Python decoders differ in {name}")
    _ingest_pprof(decoded)


def _reference(data: bytes) -> Optional[DecodedProfile]:
    """What :func:`pprof.parse` gives with the Python decoder; None where it refuses.  The C
    decoder inflates with zlib, and so does this reference (ISA-L may differ at the edges)."""
    try:
        raw = maybe_gunzip(data, MAX_DECOMPRESSED, zlib.decompressobj)
    except FormatError:
        return None
    decoded = _decode_python(raw) if raw else None
    return decoded if decoded is not None and len(decoded.sample_types) else None


def pprof_python(data: bytes) -> None:
    """The pure-Python decoder (the server's path when the C extension is not built)."""
    decoded = _reference(data)
    if decoded is not None:
        _ingest_pprof(decoded)


# -- JFR ----------------------------------------------------------------------------------------

# An input may carry the multipart upload's ``labels`` part (a LabelsSnapshot) after this.
LABELS_SEPARATOR = b"\n--labels--\n"


def jfr(data: bytes) -> None:
    """``/ingest?format=jfr``: the recording (gzip'd or not), an optional labels part; the C
    reader (when built) is checked against the Python one: both refuse, or same profiles."""
    recording, _, labels_part = data.partition(LABELS_SEPARATOR)
    if jfr_profiles._fast is not None:
        with contextlib.suppress(FormatError):
            raw = maybe_gunzip(recording, MAX_DECOMPRESSED)
            _check(_jfr_outcome(raw, True) == _jfr_outcome(raw, False), "C and Python JFR differ")
    batch = IngestBatch()
    try:
        jfr_profiles.ingest(
            recording, labels_part, batch, "fuzz", {"env": "fuzz"}, TS, 100, MAX_DECOMPRESSED
        )
    except FormatError:
        return
    check_batch(batch)


def _jfr_outcome(raw: bytes, native: bool) -> object:
    try:
        p = jfr_profiles.decode(raw, 100, native=native).profiles()
    except FormatError:
        return None
    return (p.event, p.samples)


# -- OTLP ---------------------------------------------------------------------------------------


def _is_json(data: bytes) -> bool:
    # A protobuf request starts with field 1's key (0x0a); "{" would be field 15 as a group.
    return data.lstrip()[:1] == b"{"


def otlp_traces(data: bytes) -> None:
    """``POST /v1/traces`` (and OTLP/gRPC), protobuf or JSON; the C span reader (when built)
    is checked against the Python one: both refuse, or the same batch."""
    if otlp_traces_format._fast is not None and not _is_json(data):
        _check(_spans_outcome(data, True) == _spans_outcome(data, False), "C and Python differ")
    try:
        result, _ = server_otlp.convert_traces(data, _is_json(data))
    except FormatError:
        return
    check_spans(result.batch)


def _spans_outcome(data: bytes, native: bool) -> object:
    """What the span reader makes of a body, the bytes it keeps read back as messages (the C
    reader slices what Python re-serializes: the same message, not always the same bytes)."""
    try:
        if native:
            result = otlp_traces_format.from_protobuf(data)
        else:
            result = otlp_traces_format.to_span_batch(
                otlp_traces_format.decode(data, False), len(data)
            )
    except FormatError as exc:
        return type(exc)
    b = result.batch

    def group(gid: int) -> tuple:
        g = b.groups[gid]
        r, s = Resource.FromString(g.resource), InstrumentationScope.FromString(g.scope)
        return (g.service, r, g.resource_schema_url, s, g.scope_schema_url, g.attrs)

    rows = [(r[:10], Span.FromString(r.raw), group(r.group_id)) for r in b.rows]
    groups = sorted(str(g) for g in map(group, b.groups))
    return rows, groups, list(b.tags.items()), result.rejected


def otlp_profiles(data: bytes) -> None:
    """``POST /v1development/profiles`` (and OTLP/gRPC), protobuf or JSON."""
    try:
        result, _ = server_otlp.convert_profiles(data, _is_json(data))
    except FormatError:
        return
    check_batch(result.batch)


# -- bodies -------------------------------------------------------------------------------------

_LOOP: Optional[asyncio.AbstractEventLoop] = None


def _request(body: bytes, headers: Dict[str, str]):  # type: ignore[no-untyped-def]
    from starlette.requests import Request

    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "query_string": b"",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
    }
    return Request(scope, receive)


def _run(coro):  # type: ignore[no-untyped-def]
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
    return _LOOP.run_until_complete(coro)


BOUNDARY = "fuzzboundary"


async def _multipart(body: bytes) -> None:
    """The multipart form of ``/ingest`` (Pyroscope SDKs: ``profile``, ``sample_type_config``;
    the Java SDK: ``jfr``, ``labels``), read as the ingest endpoint reads it."""
    from hotspan.server.pyroscope.ingest import _field_bytes, _form

    request = _request(body, {"content-type": f"multipart/form-data; boundary={BOUNDARY}"})
    form = await _form(request, CONFIG.max_body_bytes)
    for name in ("profile", "jfr", "labels", "sample_type_config"):
        part = form.get(name)
        if part is not None:
            raw = await _field_bytes(part)
            _check(isinstance(raw, bytes), f"form field {name} is not bytes")
            if name == "sample_type_config":
                with contextlib.suppress(ValueError):
                    json.loads(raw)


async def _push(body: bytes, content_type: str) -> None:
    """``/push.v1.PusherService/Push`` (Connect): the request, then each raw profile."""
    request = _request(body, {"content-type": content_type})
    req = await read_message(request, CONFIG, push_pb2.PushRequest)
    for series in req.series:
        for sample in series.samples:
            pprof_c(sample.raw_profile) if _fast is not None else pprof_python(sample.raw_profile)


def body(data: bytes) -> None:
    """What is read before any decoder: the first byte picks how the rest is sent."""
    mode, rest = (data[0] % 5, data[1:]) if data else (0, b"")
    try:
        if mode == 0:
            out = gunzip(rest, CONFIG.max_decompressed_bytes)
            _check(len(out) <= CONFIG.max_decompressed_bytes, "gunzip past its limit")
        elif mode == 1:
            request = _request(rest, {"content-encoding": "gzip"})
            out = _run(read_body(request, CONFIG))
            _check(len(out) <= CONFIG.max_decompressed_bytes, "read_body past its limit")
        elif mode == 2:
            _run(_multipart(rest))
        else:
            _run(_push(rest, "application/proto" if mode == 3 else "application/json"))
    except FormatError:
        return
    except HTTPError as exc:
        if exc.status >= 500:
            raise


# -- stacks as text or Pyroscope's binary trees -------------------------------------------------

STACK_FORMATS = ("folded", "lines", "speedscope", "trie", "tree")


def stacks(data: bytes) -> None:
    """``/ingest`` of stacks (what the first byte picks of folded, lines, speedscope, trie and
    tree), read into a batch as the endpoint reads them."""
    from hotspan.server.pyroscope.ingest import _ingest_stacks

    fmt, rest = (STACK_FORMATS[data[0] % len(STACK_FORMATS)], data[1:]) if data else ("", b"")
    batch = IngestBatch()
    try:
        _ingest_stacks(rest, fmt, "app.cpu", {}, TS, 100, MAX_DECOMPRESSED, batch)
    except FormatError:
        return
    check_batch(batch)


TARGETS: Dict[str, Callable[[bytes], None]] = {
    "pprof_c": pprof_c,
    "pprof_python": pprof_python,
    "jfr": jfr,
    "otlp_traces": otlp_traces,
    "otlp_profiles": otlp_profiles,
    "body": body,
    "stacks": stacks,
}


def available() -> List[str]:
    """The targets this build can run (the C decoder's needs the extension)."""
    return [name for name in TARGETS if name != "pprof_c" or _fast is not None]
