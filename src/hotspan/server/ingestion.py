"""What every ingest path does with what it decoded: HTTP /ingest and push, the OTLP
receivers (HTTP and gRPC) and the scraper all turn profiles into batches here, record the
agent that sent them, and hand the batches to the store (redacted when the server was told
to), so that those steps are written once."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Mapping, Optional, TypeVar

from hotspan.formats import ingest_params, pprof
from hotspan.model.agent_settings import INSTANCE_HEADER, STATUS_HEADER
from hotspan.model.labels import METRIC_NAME, SERVICE_NAME
from hotspan.model.profile import IngestBatch
from hotspan.model.settings_rules import matching_rule
from hotspan.model.trace import SpanBatch
from hotspan.server.errors import HTTPError
from hotspan.server.instances import parse_instance, parse_status
from hotspan.server.state import ServerState
from hotspan.store.base import SettingsRule, StoreError
from hotspan.store.batching import name_os_thread

T = TypeVar("T")

# Decoding threads: gunzip and the C pprof decoder run without the GIL, so with the decode
# on these threads the event loop keeps parsing HTTP while other uploads decode on the other
# core.  A few per core, so that one waiting for the GIL does not leave a core idle.
DECODE_THREADS = max(2, min(8, 2 * (os.cpu_count() or 1)))
_decoders: Optional[ThreadPoolExecutor] = None
_decoders_lock = threading.Lock()


def _decode_pool() -> ThreadPoolExecutor:
    global _decoders
    if _decoders is None:
        with _decoders_lock:
            if _decoders is None:
                _decoders = ThreadPoolExecutor(
                    DECODE_THREADS,
                    thread_name_prefix="hotspan-decode",
                    initializer=name_os_thread,
                    initargs=("hotspan-decode",),
                )
    return _decoders


# The cyclic collector's young generation is collected every 700 net allocations by default:
# under ingest that is hundreds of collections a second, each also walking the objects that
# survive, about 6% of the server's CPU (perf).  Collected 30 times less often, the server
# spends ~8% less CPU per upload; cycles are still freed, a little later.
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """For a server process about to serve: what was built at startup (modules, the app, the
    store's caches) lives as long as the process, so the collector stops looking at it, and
    young objects are collected less often (see :data:`GC_THRESHOLDS`)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a decoding thread; its exception (a FormatError, an HTTPError) is
    raised here as it was raised there."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_decode_pool(), functools.partial(fn, *args))


def pprof_to_batch(
    data: bytes,
    limit: int,
    batch: IngestBatch,
    labels: Mapping[str, str],
    start: int,
    sample_type_config: Optional[dict] = None,
) -> None:
    """Add an uncompressed or gzipped pprof profile (at most ``limit`` bytes once
    decompressed) to ``batch`` under ``labels``, its samples at ``start`` unless it says
    when; FormatError when it cannot be read.  Blocking: the server calls it through
    :func:`off_loop`."""
    pprof.to_batch(pprof.parse(data, limit), batch, labels, start, sample_type_config)


def agent_labels(app: ingest_params.AppName) -> Dict[str, str]:
    """An agent's labels from its parsed ``name`` parameter (``app.cpu{k=v}``): its tags and
    the service, named as ``/ingest`` names it."""
    labels = {k: v for k, v in app.tags.items() if k != METRIC_NAME}
    if not labels.get(SERVICE_NAME):
        labels[SERVICE_NAME] = ingest_params.split_suffix(app.name)[0]
    return labels


def answer_for(rule: Optional[SettingsRule]) -> Dict[str, Any]:
    """The settings answer an agent reads: the rule's version and settings (0 and none)."""
    if rule is None:
        return {"version": 0, "settings": None}
    return {"version": rule.version, "settings": dict(rule.settings)}


def settings_answer(state: ServerState, tenant: str, labels: Mapping[str, str]) -> Dict[str, Any]:
    """The settings answer for an agent with these labels: its service's rule that matches."""
    rules = state.store.settings_rules(tenant, labels[SERVICE_NAME])
    return answer_for(matching_rule(rules, labels))


def observe_agent(
    headers: Mapping[str, str], state: ServerState, tenant: str, app: ingest_params.AppName
) -> Optional[Dict[str, Any]]:
    """For a request from a hotspan agent (it has ``X-Hotspan-Instance``): record its status
    and return the settings answer.  None for any other client (a Pyroscope SDK's upload),
    whose answer stays as it was.
    """
    header = headers.get(INSTANCE_HEADER)
    if header is None:
        return None
    labels = agent_labels(app)
    instance = parse_instance(header)
    if instance is not None:
        status = parse_status(headers.get(STATUS_HEADER))
        state.instances.record(tenant, labels[SERVICE_NAME], instance, labels, status)
    return settings_answer(state, tenant, labels)


# Pyroscope's limits on a series' labels (its validation defaults), but twice the names.
MAX_LABEL_NAMES = 60
MAX_LABEL_NAME_LENGTH = 1024
MAX_LABEL_VALUE_LENGTH = 2048


def check_labels(batch: IngestBatch) -> None:
    """HTTPError (400) for a series whose labels pass a limit: labels are kept per series,
    listed by every label query and shown in every view, and an upload is refused whole, as
    Pyroscope refuses it, rather than stored cut."""
    for info in batch.series.values():
        if len(info.labels) > MAX_LABEL_NAMES:
            raise HTTPError(
                400, f"a series has {len(info.labels)} labels; at most {MAX_LABEL_NAMES}"
            )
        for name, value in info.labels:
            if len(name) > MAX_LABEL_NAME_LENGTH:
                raise HTTPError(
                    400, f"label name {name[:40]!r}... is over {MAX_LABEL_NAME_LENGTH} characters"
                )
            if len(value) > MAX_LABEL_VALUE_LENGTH:
                raise HTTPError(
                    400,
                    f"label {name[:60]!r} has a value over {MAX_LABEL_VALUE_LENGTH} characters",
                )
            if "\0" in name or "\0" in value:
                raise HTTPError(400, f"label {name[:60]!r} holds a NUL character")


def stored_form(state: ServerState, batch: IngestBatch) -> IngestBatch:
    """The batch as the store keeps it: redacted when the server was told to."""
    return state.redactor.batch(batch) if state.redactor is not None else batch


async def commit(state: ServerState, tenant: str, batch: IngestBatch) -> None:
    """Hand the batch to the store and return once it is durable; HTTPError (503) when the
    store refuses it."""
    if not len(batch):
        return
    check_labels(batch)
    stored = stored_form(state, batch)
    write = state.store.write(tenant, stored)
    if state.metrics is not None:
        state.metrics.watch(tenant, stored, write)
    try:
        # Shielded: a request cancelled (client gone, timeout) must not cancel the queued
        # write, which the store completes anyway and /metrics counts.
        await asyncio.shield(asyncio.wrap_future(write))
    except StoreError as exc:
        raise HTTPError(503, f"could not store the profile: {exc}") from None


def commit_sync(state: ServerState, tenant: str, batch: IngestBatch, timeout_s: float) -> None:
    """:func:`commit` for callers on a thread of their own (the gRPC receivers): StoreError,
    or concurrent.futures.TimeoutError after ``timeout_s``."""
    if len(batch):
        check_labels(batch)
        stored = stored_form(state, batch)
        write = state.store.write(tenant, stored)
        if state.metrics is not None:
            state.metrics.watch(tenant, stored, write)
        write.result(timeout=timeout_s)


async def commit_spans(state: ServerState, tenant: str, spans: SpanBatch) -> None:
    """Hand the spans to the store and return once they are durable; HTTPError (503) when
    the store refuses them."""
    if len(spans):
        try:
            await asyncio.wrap_future(state.store.write_spans(tenant, spans))
        except StoreError as exc:
            raise HTTPError(503, f"could not store the spans: {exc}") from None


def commit_spans_sync(state: ServerState, tenant: str, spans: SpanBatch, timeout_s: float) -> None:
    """:func:`commit_spans` for callers on a thread of their own: StoreError, or
    concurrent.futures.TimeoutError after ``timeout_s``."""
    if len(spans):
        state.store.write_spans(tenant, spans).result(timeout=timeout_s)
