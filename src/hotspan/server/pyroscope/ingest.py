"""Ingest endpoints: Pyroscope's ``/ingest`` and the push API every recent SDK uses."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from python_multipart.multipart import parse_options_header
from starlette.datastructures import FormData, Headers
from starlette.formparsers import MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hotspan.formats import folded, ingest_params, pyroscope_tree, pyroscope_trie, speedscope
from hotspan.formats.compression import maybe_gunzip
from hotspan.formats.errors import FormatError
from hotspan.formats.proto import push_pb2
from hotspan.model.labels import METRIC_NAME, SERVICE_NAME, SPY_NAME, is_valid_label_name, normalize
from hotspan.model.profile import (
    MAX_SAMPLE_VALUE,
    MAX_STACK_DEPTH,
    Frame,
    IngestBatch,
    ProfileType,
)
from hotspan.server.errors import HTTPError, bare_errors
from hotspan.server.ingestion import commit, observe_agent, off_loop, pprof_to_batch
from hotspan.server.pyroscope.connect import read_message, unary, write_message
from hotspan.server.request import check_token, read_body, tenant_of
from hotspan.server.state import ServerState

# The label Pyroscope keeps an app's name in when its tags name the service.
APP_NAME = "app_name"

FOLDED_FORMATS = ("", "folded", "groups", "collapsed")
# The other formats of stacks, each read by _ingest_stacks.
STACK_FORMATS = ("lines", "speedscope", "trie", "tree")
# Pyroscope's first agents named their binary formats by Content-Type, without ``format``.
BINARY_STACK_TYPES = {"binary/octet-stream+trie": "trie", "binary/octet-stream+tree": "tree"}


class PreviousProfileError(Exception):
    """An upload with a ``prev_profile`` part: older pyroscope-go agents send their mutex and
    block profiles cumulative, with the previous upload beside the current one for the server
    to subtract.  Pyroscope refuses such uploads (422) rather than store counts that only
    grow, and so does hotspan, with the same message."""

    def __init__(self) -> None:
        super().__init__(
            "parsing IngestInput-pprof failed failed to parse pprof /ingest multipart form "
            "unsupported client version. Please update github.com/grafana/pyroscope-go to "
            "the latest version"
        )


def _tags(tags: Mapping[str, str]) -> Dict[str, str]:
    out = {}
    for key, value in tags.items():
        if not is_valid_label_name(key):
            raise HTTPError(400, f"invalid label name {key!r}")
        if key != METRIC_NAME:
            out[key] = value
    return out


@dataclass(frozen=True)
class IngestQuery:
    """What ``/ingest``'s query parameters say about the upload."""

    app: ingest_params.AppName
    # When the samples were taken (nanoseconds), ``from``; now when absent.
    start: int
    sample_rate: int
    spy: str
    # ``format``, lower case; "" for folded.
    fmt: str


def app_param(params: Mapping[str, str]) -> ingest_params.AppName:
    """``name=app.cpu{k=v}``: the application and its tags."""
    if "name" not in params:
        raise HTTPError(400, "query parameter 'name' (app{key=value,...}) is required")
    return ingest_params.parse_app_name(params["name"])


# Samples per second: at most one per nanosecond, the unit their values become.
MAX_SAMPLE_RATE = 1_000_000_000


def ingest_query(params: Mapping[str, str], app: ingest_params.AppName, now: int) -> IngestQuery:
    """The upload's other parameters (``from``, ``sampleRate``, ``spyName``, ``format``)."""
    start = ingest_params.parse_time(params.get("from"), now)
    rate = params.get("sampleRate") or "100"
    try:
        sample_rate = int(rate)
    except ValueError:
        sample_rate = 0
    if not 0 < sample_rate <= MAX_SAMPLE_RATE:
        raise HTTPError(
            400, f"sampleRate must be a whole number of samples per second, 1 to 1e9, not {rate!r}"
        )
    spy = params.get("spyName") or "unknown"
    fmt = (params.get("format") or "").lower()
    return IngestQuery(app, start, sample_rate, spy, fmt)


@bare_errors
async def ingest(request: Request) -> Response:
    """``POST /ingest?name=app.cpu{k=v}&from=..&until=..&format=..&sampleRate=..&spyName=..``"""
    state: ServerState = request.app.state.hotspan
    config = state.config
    try:
        check_token(request, config.ingest_tokens)
        tenant = tenant_of(request, config)
        app = app_param(request.query_params)
        # Before the rest of the request is read: an agent whose upload fails is still
        # alive, and says how it is.
        answer = observe_agent(request.headers, state, tenant, app)
        query = ingest_query(request.query_params, app, time.time_ns())
        body = await read_body(request, config)
        batch = await _decode(request, state, query, body)
        await commit(state, tenant, batch)
    except PreviousProfileError as exc:
        # Pyroscope's answer, word for word, so that an old agent logs what to do.
        return JSONResponse({"code": "unknown", "message": str(exc)}, status_code=422)
    except FormatError as exc:
        raise HTTPError(400, f"bad profile: {exc}") from None
    if answer is not None:
        return JSONResponse(answer)
    return Response(status_code=200)


async def _decode(
    request: Request, state: ServerState, query: IngestQuery, body: bytes
) -> IngestBatch:
    """The upload's profiles, in the format its ``format`` and content type say."""
    fmt = query.fmt
    ctype = request.headers.get("content-type", "").lower()
    if fmt not in ("trie", "tree") and ctype in BINARY_STACK_TYPES:
        fmt = BINARY_STACK_TYPES[ctype]  # as in Pyroscope, over any other format named
    labels = _tags(query.app.tags)
    labels[SPY_NAME] = query.spy
    name, start, sample_rate = query.app.name, query.start, query.sample_rate
    batch = IngestBatch()
    if fmt == "jfr":  # before multipart: the Java SDK sends JFR as multipart too
        await _ingest_jfr(request, body, ctype, name, labels, start, sample_rate, batch)
    elif ctype.startswith("multipart/form-data") or fmt == "pprof":
        await _ingest_pprof(request, body, ctype, name, labels, start, batch, state)
    elif fmt in FOLDED_FORMATS or fmt in STACK_FORMATS:
        limit = state.config.max_decompressed_bytes
        await off_loop(_ingest_stacks, body, fmt, name, labels, start, sample_rate, limit, batch)
    else:
        raise HTTPError(
            400,
            f"unknown format {fmt!r} (use folded, lines, pprof, jfr, speedscope, trie or tree)",
        )
    return batch


async def _form(request: Request, max_part_bytes: int) -> FormData:
    """The multipart body's parts, or a 400 saying why they cannot be read."""
    # A part sent without a filename (curl -F "profile=<file") comes as text, decoded as the
    # Content-Type's charset, else UTF-8, else Latin-1: a binary profile would not come back
    # as the bytes sent.  Decoded as Latin-1 always, every byte is one character.
    _, params = parse_options_header(request.headers.get("content-type", ""))
    boundary = params.get(b"boundary")
    if not boundary:
        raise HTTPError(400, "malformed multipart body: the Content-Type has no boundary")
    quoted = boundary.decode("latin-1").replace("\\", "\\\\").replace('"', '\\"')
    headers = Headers(
        {"content-type": f'multipart/form-data; charset=latin-1; boundary="{quoted}"'}
    )
    try:
        parser = MultiPartParser(headers, request.stream(), max_part_size=max_part_bytes)
        return await parser.parse()
    except Exception as exc:  # noqa: BLE001 - Starlette raises several kinds here
        raise HTTPError(400, f"malformed multipart body: {exc}") from None


async def _ingest_pprof(
    request: Request,
    body: bytes,
    ctype: str,
    app_name: str,
    labels: Dict[str, str],
    start: int,
    batch: IngestBatch,
    state: ServerState,
) -> None:
    config = state.config
    sample_type_config: Optional[dict] = None
    if ctype.startswith("multipart/form-data"):
        form = await _form(request, config.max_body_bytes)
        previous = form.get("prev_profile")
        if previous is not None and await _field_bytes(previous):
            raise PreviousProfileError()
        part = form.get("profile")
        if part is None:
            hint = " (a JFR upload needs format=jfr)" if "jfr" in form else ""
            raise HTTPError(400, f"multipart body has no 'profile' field{hint}")
        data = await _field_bytes(part)
        stc = form.get("sample_type_config")
        if stc is not None:
            raw = await _field_bytes(stc)
            try:
                sample_type_config = json.loads(raw)
            except RecursionError:
                raise HTTPError(400, "sample_type_config is nested too deeply") from None
            except ValueError as exc:
                raise HTTPError(400, f"sample_type_config is not JSON: {exc}") from None
            if not isinstance(sample_type_config, dict):
                raise HTTPError(400, "sample_type_config must be a JSON object")
    else:
        data = body
    # A pprof upload's type comes from its sample types, so a ``.cpu`` suffix is only a name.
    base, _ = ingest_params.split_suffix(app_name)
    labels.setdefault(SERVICE_NAME, base)
    await off_loop(
        pprof_to_batch,
        data,
        config.max_decompressed_bytes,
        batch,
        labels,
        start,
        sample_type_config,
    )


async def _ingest_jfr(
    request: Request,
    body: bytes,
    ctype: str,
    app_name: str,
    labels: Dict[str, str],
    start: int,
    sample_rate: int,
    batch: IngestBatch,
) -> None:
    """``format=jfr``: a JFR recording, as the whole body or (the Java SDK) as the multipart
    part ``jfr`` with an optional ``labels`` part naming the events' contexts."""
    config = request.app.state.hotspan.config
    labels_part = b""
    if ctype.startswith("multipart/form-data"):
        form = await _form(request, config.max_body_bytes)
        part = form.get("jfr")
        if part is None:
            raise HTTPError(400, "multipart body has no 'jfr' field (format=jfr)")
        data = await _field_bytes(part)
        extra = form.get("labels")
        if extra is not None:
            labels_part = await _field_bytes(extra)
    else:
        data = body
    # Here, not with the module: JFR's reader (its symbol expressions and record types) is
    # ~20 ms of every server start, and most servers never see a recording.
    from hotspan.formats import jfr_profiles

    # A thread: a large recording takes a while to decode, and the loop must keep serving.
    await asyncio.to_thread(
        jfr_profiles.ingest,
        data,
        labels_part,
        batch,
        app_name,
        labels,
        start,
        sample_rate if sample_rate > 0 else 100,
        config.max_decompressed_bytes,
    )


async def _field_bytes(value) -> bytes:
    """A form field as bytes, whether sent as a file part or as a plain value."""
    if hasattr(value, "read"):
        return await value.read()
    return str(value).encode("latin-1")  # _form's parts: one character a byte


def _ingest_stacks(
    body: bytes,
    fmt: str,
    app_name: str,
    labels: Dict[str, str],
    start: int,
    sample_rate: int,
    limit: int,
    batch: IngestBatch,
) -> None:
    """The stacks of a folded, lines, speedscope, trie or tree upload into ``batch`` (blocking:
    it runs on a decoding thread).  ``limit`` bounds the folded text a trie or tree stands for,
    as it bounds a body's decompressed bytes."""
    # Gzipped without saying so (Content-Encoding), as pprof and JFR bodies may be.
    body = maybe_gunzip(body, limit)
    base, suffix = ingest_params.split_suffix(app_name)
    if labels.get(SERVICE_NAME):
        # As Pyroscope's ingest adapter: a service named in the tags keeps the app's name
        # beside it.
        labels.setdefault(APP_NAME, base)
    labels.setdefault(SERVICE_NAME, base)
    if fmt == "speedscope":
        for prof in speedscope.parse(body):
            prof_labels = dict(labels)
            if prof.name:
                prof_labels["profile_name"] = prof.name
            if prof.unit in speedscope.TIME_UNITS:
                # Weights are durations: store them as wall nanoseconds.
                ltype = ingest_params.legacy_type("wall", 1_000_000_000)
                scale = speedscope.TIME_UNITS[prof.unit]
            elif prof.unit == "bytes":
                ltype = ingest_params.legacy_type("bytes", 0)
                scale = 1
            else:
                ltype = ingest_params.legacy_type(suffix, sample_rate)
                scale = ltype.scale
            stacks = ((list(k), int(v * scale)) for k, v in prof.stacks.items())
            _add_stacks(batch, ltype, prof_labels, start, stacks, 1)
        return
    ltype = ingest_params.legacy_type(suffix, sample_rate)
    if fmt == "trie":
        parsed = pyroscope_trie.parse(body, limit)
    elif fmt == "tree":
        parsed = pyroscope_tree.parse(body, limit)
    elif fmt == "lines":
        parsed = folded.parse_lines(body)
    else:
        parsed = folded.parse_folded(body)
    _add_stacks(batch, ltype, labels, start, parsed, ltype.scale)


def _add_stacks(batch, ltype, labels, ts, stacks, scale) -> None:
    ptype = ProfileType(
        ltype.metric, ltype.sample_type, ltype.sample_unit, ltype.period_type, ltype.period_unit
    )
    series_labels = dict(labels)
    series_labels[METRIC_NAME] = ltype.metric
    sid = batch.add_series(ptype, normalize(series_labels))
    for names, value in stacks:
        if value <= 0:
            continue
        if value * scale > MAX_SAMPLE_VALUE:
            raise FormatError(f"value {value} times the period {scale} is out of range")
        frame_ids = tuple(batch.add_frame(Frame(name)) for name in names[:MAX_STACK_DEPTH])
        batch.add_sample(sid, ts, batch.add_stack(frame_ids), value * scale)


@unary
async def push(request: Request) -> Response:
    """``/push.v1.PusherService/Push``: series labels plus raw pprof per sample."""
    state: ServerState = request.app.state.hotspan
    config = state.config
    check_token(request, config.ingest_tokens)
    tenant = tenant_of(request, config)
    req = await read_message(request, config, push_pb2.PushRequest)
    batch = await off_loop(_push_batch, req, config.max_decompressed_bytes, time.time_ns())
    await commit(state, tenant, batch)
    return write_message(request, push_pb2.PushResponse())


def _push_batch(req: push_pb2.PushRequest, budget: int, now: int) -> IngestBatch:
    """The push's profiles as one batch (blocking: it runs on a decoding thread); HTTPError
    (400) naming the series that cannot be read.  ``budget`` is one decompression budget for
    the whole request, not one per profile in it."""
    batch = IngestBatch()
    for i, series in enumerate(req.series):
        labels: Dict[str, str] = {}
        for pair in series.labels:
            if not is_valid_label_name(pair.name):
                raise HTTPError(400, f"series {i}: invalid label name {pair.name!r}")
            labels[pair.name] = pair.value
        if not labels.get(SERVICE_NAME):
            raise HTTPError(400, f"series {i}: the label service_name is required")
        for sample in series.samples:
            try:
                raw = maybe_gunzip(sample.raw_profile, budget)
                budget -= len(raw)
                pprof_to_batch(raw, budget, batch, labels, now)
            except FormatError as exc:
                raise HTTPError(400, f"series {i}: {exc}") from None
    return batch
