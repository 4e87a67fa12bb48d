"""The pure-Python twins of the C sampler's span labels, span linker and span stats
(``_speedups/sampler/labels.c``, ``linker.c``, ``span_stats.c``), with their interfaces.

Used where the extension is not built, or where ``native=False`` asks for the Python linker:
:mod:`hotspan.agent.context` imports this module when the extension is missing, and
``context._hook``/``install_gc_callback`` when they choose the Python linker, so a program
profiled by the C one does not keep these classes and functions for its GC to walk.  What it
shares with :mod:`hotspan.agent.context` is in :mod:`hotspan.agent.labels`.
"""

from __future__ import annotations

import sys
import threading
import time

from hotspan._speedups import load_sampler
from hotspan.agent.labels import (
    ALLOC_BYTES_ATTRIBUTE,
    CPU_TIME_ATTRIBUTE,
    GC_COLLECTIONS_ATTRIBUTE,
    GC_PAUSE_ATTRIBUTE,
    HEAP_OBJECTS_ATTRIBUTE,
    LABELS,
    PROFILE_ID_ATTRIBUTE,
    RSS_ATTRIBUTE,
    THREADS_ATTRIBUTE,
    publish,
    span_key,
)
from hotspan.agent.log import logger

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    import contextvars
    from typing import Any, Callable, Dict, List, Optional, Tuple


class PyLabels:
    """Pure-Python twin of the C ``Labels`` type (same constructor and attributes)."""

    __slots__ = (
        "span_id",
        "trace_hi",
        "trace_lo",
        "root_span_id",
        "tagset",
        "sampled",
        "otel_context",
        "cpu_ns",
        "alloc_bytes",
        "gc_pause_ns",
        "gc_count",
    )

    def __init__(
        self,
        span_id: int = 0,
        trace_hi: int = 0,
        trace_lo: int = 0,
        root_span_id: int = 0,
        tagset: int = 0,
        otel_context: Any = None,
    ) -> None:
        self.span_id = span_id
        self.trace_hi = trace_hi
        self.trace_lo = trace_lo
        self.root_span_id = root_span_id
        self.tagset = tagset
        self.sampled = False
        # OpenTelemetry's Context, where the C span linker keeps it (see linker_attach).
        self.otel_context = otel_context
        # Span stats: CPU of the samples taken with these labels, allocation estimate.
        self.cpu_ns = 0
        self.alloc_bytes = 0
        # Garbage collections that ran while these labels were current, and their pauses.
        self.gc_pause_ns = 0
        self.gc_count = 0

    def _charge(
        self, cpu_ns: int, alloc_bytes: int, gc_pause_ns: int = 0, gc_count: int = 0
    ) -> None:
        self.cpu_ns += cpu_ns
        self.alloc_bytes += alloc_bytes
        self.gc_pause_ns += gc_pause_ns
        self.gc_count += gc_count

    def _forget_span(self) -> None:
        self.span_id = self.root_span_id = self.trace_hi = self.trace_lo = 0


class _GcCharge:
    """The pure-Python twin of span_stats.c's gc_callback: each collection's pause is charged to
    the span current where it ran."""

    __slots__ = ("_started",)

    def __init__(self) -> None:
        self._started = 0

    def __call__(self, phase: str, info: Any) -> None:
        if phase == "start":
            self._started = time.monotonic_ns()
        elif phase == "stop" and self._started:
            pause = time.monotonic_ns() - self._started
            self._started = 0
            labels = LABELS.get(None)
            if labels is not None and labels.span_id:
                labels._charge(0, 0, pause, 1)


gc_charge = _GcCharge()

# The labels the Python linker makes, of the type hotspan.agent.context.Labels is: the C one
# wherever the extension is built (native=False too), else PyLabels.
_native = load_sampler()
Labels: Any = _native.Labels if _native is not None else PyLabels


_process_cache: List[Any] = [0, (-1, -1, -1)]


def process_stats() -> Tuple[int, int, int]:
    """(RSS bytes, threads, allocated blocks), -1 where unknown, read at most every 10 ms (as
    span_stats.c's process_stats)."""
    now = time.monotonic_ns()
    if _process_cache[0] and now - _process_cache[0] <= 10_000_000:
        return _process_cache[1]
    rss = threads = -1
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        threads = int(fields[17])  # field 20 of the line; fields[0] is field 3
        rss = int(fields[21]) * _page_size()
    except (OSError, IndexError, ValueError):
        threads = threading.active_count()
    stats = (rss, threads, sys.getallocatedblocks())
    _process_cache[0], _process_cache[1] = now, stats
    return stats


def _page_size() -> int:
    import os

    return os.sysconf("SC_PAGESIZE")


def _alloc_sampling() -> bool:
    # The C sampler may be built and the Python linker in use all the same (native=False).
    native = load_sampler()
    return native is not None and bool(native.alloc_sampling())


def _in_running_loop() -> bool:
    events = sys.modules.get("asyncio.events")
    return events is not None and events._get_running_loop() is not None


def span_stats_start() -> Tuple[Optional[int]]:
    """At attach, with span stats on: (the thread's CPU clock, or None in a running asyncio
    loop, where the sampled CPU of the span's labels is the figure)."""
    return (None if _in_running_loop() else time.thread_time_ns(),)


# Garbage-collection pauses go on a span as attributes from this total on, without span
# stats (linker.c's GC_ATTRIBUTE_MIN_NS: shorter ones add up in the parent only).
GC_ATTRIBUTE_MIN_NS = 1_000_000


def has_figures(labels: Any) -> bool:
    """Whether a span's labels hold figures its parent adds up without span stats: a garbage
    collection ran inside, or an allocation was sampled (linker.c's has_figures)."""
    return bool(labels.gc_count or (labels.alloc_bytes and _alloc_sampling()))


def span_stats_attributes(
    labels: Any, start: Optional[Tuple[Optional[int]]], restored: Any, span: Any
) -> Optional[Dict[str, int]]:
    """At detach (the Python twin of linker.c's linker_span_done): adds the span's figures to
    its parent's labels, and gives its stats attributes.  ``start``: where span stats started
    (``span_stats`` on), or None: then only the garbage collection and allocation figures."""
    if (
        restored is not None
        and restored is not labels
        and restored.trace_lo == labels.trace_lo
        and restored.trace_hi == labels.trace_hi
    ):
        restored._charge(labels.cpu_ns, labels.alloc_bytes, labels.gc_pause_ns, labels.gc_count)
    alloc = labels.alloc_bytes if _alloc_sampling() else 0
    long_pause = labels.gc_count and labels.gc_pause_ns >= GC_ATTRIBUTE_MIN_NS
    if start is None and not alloc and not long_pause:
        return None
    if span is None or not span.is_recording():
        return None
    attributes: Dict[str, int] = {}
    if start is not None:
        thread_cpu = start[0]
        cpu = time.thread_time_ns() - thread_cpu if thread_cpu is not None else labels.cpu_ns
        attributes[CPU_TIME_ATTRIBUTE] = max(cpu, 0)
    # Zero figures are left out, as in C (set_attributes costs ~0.5 us per attribute).
    if alloc:
        attributes[ALLOC_BYTES_ATTRIBUTE] = alloc
    if labels.gc_count and (start is not None or long_pause):
        attributes[GC_PAUSE_ATTRIBUTE] = labels.gc_pause_ns
        attributes[GC_COLLECTIONS_ATTRIBUTE] = labels.gc_count
    if start is not None and labels.root_span_id == labels.span_id:
        rss, threads, heap = process_stats()
        if rss >= 0:
            attributes[RSS_ATTRIBUTE] = rss
        if threads >= 0:
            attributes[THREADS_ATTRIBUTE] = threads
        if heap >= 0:
            attributes[HEAP_OBJECTS_ATTRIBUTE] = heap
    return attributes


class _Pair:
    """The token our runtime context hands out: OpenTelemetry's and ours for LABELS, plus what
    detach needs to tag the span if it got samples, and where its stats started."""

    __slots__ = ("inner", "ours", "labels", "span", "stats")

    def __init__(
        self, inner: Any, ours: contextvars.Token, labels: Any, span: Any, stats: Any
    ) -> None:
        self.inner = inner
        self.ours = ours
        self.labels = labels
        self.span = span
        self.stats = stats


class SpanLinkingRuntimeContext:
    """Wraps OpenTelemetry's runtime context: attach/detach also set/reset :data:`LABELS`.

    This runs for every span the program makes current, so it does the least it can: the
    ``pyroscope.profile.id`` attribute is set at detach, and only on spans that got samples
    (the sampler marks their labels), not on the many short spans that never do.
    """

    def __init__(self, inner: Any, root_spans_only: bool, span_stats: bool = False) -> None:
        self.inner = inner
        self.root_spans_only = root_spans_only
        self.span_stats = span_stats
        self._on_new_provider: Optional[Callable[[Any], None]] = None
        self._providers: List[Any] = []
        # The key OpenTelemetry keeps the current span under: context._hook finds it before
        # it makes the hook.
        self._span_key = span_key()

    @property
    def on_new_provider(self) -> Optional[Callable[[Any], None]]:
        return self._on_new_provider

    @on_new_provider.setter
    def on_new_provider(self, callback: Optional[Callable[[Any], None]]) -> None:
        # A new watcher hears of every provider again, as the C linker's setter does.
        self._on_new_provider = callback
        self._providers = []

    def attach(self, context: Any) -> Any:
        token = self.inner.attach(context)
        try:
            key = self._span_key
            span = context.get(key) if key is not None else None
            labels = self.labels_for(span)
            stats = span_stats_start() if self.span_stats and labels.span_id else None
            ours = LABELS.set(labels)
        except Exception:  # noqa: BLE001 - never break the program's tracing
            logger.debug("hotspan: span labels not set", exc_info=True)
            return token
        publish(labels)
        return _Pair(token, ours, labels, span, stats)

    def detach(self, token: Any) -> None:
        if not isinstance(token, _Pair):
            self.inner.detach(token)
            return
        self.inner.detach(token.inner)
        try:
            try:
                LABELS.reset(token.ours)
            except ValueError:
                # Reset from another context than the attach (OpenTelemetry itself logs
                # "Failed to detach context" for this); keep ours consistent with its value.
                LABELS.set(self.labels_for(self.inner.get_current().get(self._span_key)))
            restored = LABELS.get(None)
            publish(restored)
            labels = token.labels
            if labels.sampled and labels.span_id:
                mark_profiled(token.span, labels, restored, self.root_spans_only)
            span = token.span
            if span is not None and self.on_new_provider is not None:
                self._watch_provider(span)
            if labels.span_id and (token.stats is not None or has_figures(labels)):
                attributes = span_stats_attributes(labels, token.stats, restored, span)
                if attributes:
                    span.set_attributes(attributes)
        except Exception:  # noqa: BLE001
            logger.debug("hotspan: span labels not reset", exc_info=True)

    def _watch_provider(self, span: Any) -> None:
        processor = getattr(span, "_span_processor", None)
        if processor is None or any(p is processor for p in self._providers):
            return
        self._providers.append(processor)
        callback = self.on_new_provider
        if callback is not None:
            callback(processor)

    def get_current(self) -> Any:
        return self.inner.get_current()

    def labels_for(self, span: Any) -> Any:
        previous = LABELS.get(None)
        tags = previous.tagset if previous is not None else 0
        if span is None:
            return Labels(0, 0, 0, 0, tags)
        ctx = span.get_span_context()
        span_id = ctx.span_id
        if not span_id or not ctx.trace_id:
            return Labels(0, 0, 0, 0, tags)
        trace_id = ctx.trace_id
        trace_hi, trace_lo = trace_id >> 64, trace_id & 0xFFFFFFFFFFFFFFFF
        root = span_id
        if previous is not None and previous.root_span_id and previous.trace_lo == trace_lo:
            parent = getattr(span, "parent", None)
            if parent is not None and not parent.is_remote and previous.trace_hi == trace_hi:
                root = previous.root_span_id
        return Labels(span_id, trace_hi, trace_lo, root, tags)


def mark_profiled(span: Any, labels: Any, restored: Any, root_spans_only: bool) -> None:
    """At the detach of a span whose labels got samples: tag it for traces-to-profiles (the
    twin of linker.c's linker_profiled)."""
    if not root_spans_only or labels.root_span_id == labels.span_id:
        if span is not None and span.is_recording():
            span.set_attribute(PROFILE_ID_ATTRIBUTE, format(labels.span_id, "016x"))
    elif restored is not None and restored.root_span_id == labels.root_span_id:
        restored.sampled = True  # the samples belong to the root: it gets the attribute
