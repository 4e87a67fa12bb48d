"""Labels that follow the program's ``contextvars``: the current span and ``tag_wrapper`` tags.

Every thread and every asyncio task runs in its own ``contextvars.Context``, so one
ContextVar, :data:`LABELS`, holds what a sample taken there must carry.  The native sampler
reads it from a signal handler by walking the context's HAMT (see ``_speedups/sampler/labels.c``),
so the value is a small C object of plain integers; tags are interned into numbered tag sets.

Spans: OpenTelemetry makes a span current with ``opentelemetry.context.attach``.  The agent
wraps the runtime context so every attach/detach also sets/resets :data:`LABELS` in the same
context, which is what makes a span's samples its own even with many tasks on one loop.

Span stats: at the detach of a span that saw a garbage collection or an allocation sample the
linker sets those figures as attributes; with ``span_stats`` on, every span also gets its CPU
(and a local root span the process's RSS, heap blocks and threads).  See
``_speedups/sampler/span_stats.c`` for how each is measured, and :func:`span_stats_attributes`
for the Python twin.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import sys
import threading
import time

from hotspan._speedups import load_sampler
from hotspan.agent.log import logger

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple


_native = load_sampler()


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


Labels: Callable[..., Any] = _native.Labels if _native is not None else PyLabels

LABELS: contextvars.ContextVar = contextvars.ContextVar("hotspan.labels")
_TAG_TOKENS: contextvars.ContextVar = contextvars.ContextVar("hotspan.tag_tokens")

# Labels per thread ident, for the pure-Python sampler, which cannot read another thread's
# context: it is right for threads, and per thread (not per task) under asyncio.  Kept only
# while that sampler runs (it costs every span a little).
THREAD_LABELS: Dict[int, Any] = {}
_keep_thread_labels = False


def keep_thread_labels() -> None:
    global _keep_thread_labels
    _keep_thread_labels = True


def _publish(value: Any) -> None:
    if _keep_thread_labels:
        THREAD_LABELS[threading.get_ident()] = value


def labels_tuple(labels: Any) -> Tuple[int, int, int, int, int]:
    if labels is None:
        return (0, 0, 0, 0, 0)
    return (labels.span_id, labels.trace_hi, labels.trace_lo, labels.root_span_id, labels.tagset)


# ------------------------------------------------------------------ tag sets

MAX_TAGSETS = 10_000
_tagsets: List[Tuple[Tuple[str, str], ...]] = [()]
_tagset_ids: Dict[Tuple[Tuple[str, str], ...], int] = {(): 0}
_tagset_lock = threading.Lock()
_warned_overflow = False


def reset_after_fork() -> None:
    global _tagset_lock
    _tagset_lock = threading.Lock()


def tagset_id(tags: Mapping[str, str]) -> int:
    global _warned_overflow
    key = tuple(sorted((str(k), str(v)) for k, v in tags.items()))
    found = _tagset_ids.get(key)
    if found is not None:
        return found
    with _tagset_lock:
        found = _tagset_ids.get(key)
        if found is not None:
            return found
        if len(_tagsets) >= MAX_TAGSETS:
            # Tag values with unbounded cardinality (a request id) would make one series
            # each; past the limit new combinations are dropped rather than grow forever.
            if not _warned_overflow:
                _warned_overflow = True
                logger.warning(
                    "hotspan: more than %d distinct tag_wrapper tag sets; new ones are ignored",
                    MAX_TAGSETS,
                )
            return 0
        _tagsets.append(key)
        _tagset_ids[key] = len(_tagsets) - 1
        return len(_tagsets) - 1


def tagset(tagset_id: int) -> Tuple[Tuple[str, str], ...]:
    return _tagsets[tagset_id] if 0 <= tagset_id < len(_tagsets) else ()


class tag_wrapper:  # noqa: N801 - the name Pyroscope users know
    """Adds tags to every sample taken inside: ``with hotspan.tag_wrapper({"route": "/a"}):``
    or ``@hotspan.tag_wrapper({...})`` on a function or coroutine function."""

    def __init__(self, tags: Mapping[str, str]) -> None:
        from hotspan.agent.config import check_tag_key

        for key in tags:
            check_tag_key(str(key))
        self._tags = {str(k): str(v) for k, v in tags.items()}

    def __enter__(self) -> tag_wrapper:
        current = LABELS.get(None)
        base = dict(tagset(current.tagset)) if current is not None else {}
        base.update(self._tags)
        s, th, tl, root, _ = labels_tuple(current)
        # The span linker keeps OpenTelemetry's current Context in the labels: new labels
        # carry it on, or the spans inside would lose their parent.
        otel_context = current.otel_context if current is not None else None
        value = Labels(s, th, tl, root, tagset_id(base), otel_context)
        # The token goes on a stack kept in the context itself, so one wrapper object can be
        # entered by many threads and tasks at once, each leaving its own.
        token = LABELS.set(value)
        _TAG_TOKENS.set(_TAG_TOKENS.get(()) + ((id(self), token),))
        _publish(value)
        return self

    def __exit__(self, *exc: object) -> None:
        stack = _TAG_TOKENS.get(())
        mine = [i for i, (owner, _) in enumerate(stack) if owner == id(self)]
        if not mine:
            return  # entered in another context (a generator resumed elsewhere)
        index = mine[-1]
        _TAG_TOKENS.set(stack[:index] + stack[index + 1 :])
        inner = LABELS.get(None)
        try:
            LABELS.reset(stack[index][1])
        except ValueError:
            # Entered in another context (a generator resumed elsewhere): nothing of ours to
            # undo here, and the program must not see an error from its profiler.
            logger.debug("hotspan: tag_wrapper exited in another context")
        outer = LABELS.get(None)
        _publish(outer)
        # What ran inside counts in the span's stats (the wrapper's labels took its samples).
        if (
            inner is not None
            and outer is not None
            and outer is not inner
            and outer.span_id
            and outer.trace_lo == inner.trace_lo
            and (inner.cpu_ns or inner.alloc_bytes)
        ):
            outer._charge(inner.cpu_ns, inner.alloc_bytes)

    def __call__(self, func: Callable) -> Callable:
        # Imported only here: what the agent imports stays in the program, and the GC walks
        # it at every full collection.
        import inspect

        tags = self._tags
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                with tag_wrapper(tags):
                    return await func(*args, **kwargs)

            return run_async

        @functools.wraps(func)
        def run(*args: Any, **kwargs: Any) -> Any:
            with tag_wrapper(tags):
                return func(*args, **kwargs)

        return run


def _hide_wrapper_frames() -> None:
    """tag_wrapper's own frames (the decorator's wrapper functions, making, entering and
    leaving one, and what those call) run in the program's calls but are not the program's:
    stacks leave them out (see Symbolizer.name_stack)."""
    from hotspan.agent.config import check_tag_key
    from hotspan.agent.symbols import hide_code_tree

    for method in (tag_wrapper.__init__, tag_wrapper.__enter__, tag_wrapper.__exit__):
        hide_code_tree(method.__code__)
    hide_code_tree(tag_wrapper.__call__.__code__)  # and run and run_async, made in it
    for function in (tagset_id, tagset, labels_tuple, _publish, check_tag_key):
        hide_code_tree(function.__code__)


_hide_wrapper_frames()


# ------------------------------------------------------------------ OpenTelemetry

PROFILE_ID_ATTRIBUTE = "pyroscope.profile.id"

# Span stats: the attributes set at a span's detach (OpenTelemetry semantic-convention names
# where one exists: the process.* metrics of the same meaning).
CPU_TIME_ATTRIBUTE = "hotspan.cpu_time_ns"
ALLOC_BYTES_ATTRIBUTE = "hotspan.alloc_bytes"
GC_PAUSE_ATTRIBUTE = "hotspan.gc.pause_ns"
GC_COLLECTIONS_ATTRIBUTE = "hotspan.gc.collections"
RSS_ATTRIBUTE = "process.memory.usage"
THREADS_ATTRIBUTE = "process.thread.count"
HEAP_OBJECTS_ATTRIBUTE = "hotspan.process.heap_objects"


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


_py_gc_charge = _GcCharge()


def install_gc_callback(native: bool = True) -> None:
    """Puts the garbage-collection charge in ``gc.callbacks`` (once): C with the C linker
    (which finds the current labels as its sampler does), else Python."""
    import gc

    callback = _native.gc_callback if native and _native is not None else _py_gc_charge
    if callback not in gc.callbacks:
        gc.callbacks.append(callback)


_process_cache: List[Any] = [0, (-1, -1, -1)]


def _py_process_stats() -> Tuple[int, int, int]:
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


process_stats: Callable[[], Tuple[int, int, int]] = (
    _native.process_stats if _native is not None else _py_process_stats
)


def _alloc_sampling() -> bool:
    return _native is not None and bool(_native.alloc_sampling())


def _in_running_loop() -> bool:
    events = sys.modules.get("asyncio.events")
    return events is not None and events._get_running_loop() is not None


def span_stats_start() -> Tuple[Optional[int]]:
    """At attach, with span stats on: (the thread's CPU clock, or None in a running asyncio
    loop, where the sampled CPU of the span's labels is the figure)."""
    return (None if _in_running_loop() else time.thread_time_ns(),)


def has_figures(labels: Any) -> bool:
    """Whether a span's labels hold figures worth attributes without span stats: a garbage
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
    if span is None or not span.is_recording():
        return None
    attributes: Dict[str, int] = {}
    if start is not None:
        thread_cpu = start[0]
        cpu = time.thread_time_ns() - thread_cpu if thread_cpu is not None else labels.cpu_ns
        attributes[CPU_TIME_ATTRIBUTE] = max(cpu, 0)
    # Zero figures are left out, as in C (set_attributes costs ~0.5 us per attribute).
    alloc = labels.alloc_bytes
    if alloc and _alloc_sampling():
        attributes[ALLOC_BYTES_ATTRIBUTE] = alloc
    if labels.gc_count:
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


# SpanConditions (agent/spans.py): called with an SDK span's processor (its provider's multi
# span processor) the first time a span of that provider is detached; None: not wanted.
_on_new_provider: Optional[Callable[[Any], None]] = None


def provider_hook() -> Optional[Callable[[Any], None]]:
    """The callback ``set_provider_hook`` last set (None: none)."""
    return _on_new_provider


def set_provider_hook(callback: Optional[Callable[[Any], None]]) -> None:
    """Has the span linker (now, or when it is installed) call ``callback(span._span_processor)``
    once per SDK TracerProvider whose spans it sees detached; None stops it."""
    global _on_new_provider
    _on_new_provider = callback
    module = sys.modules.get("opentelemetry.context")
    current = getattr(module, "_RUNTIME_CONTEXT", None) if module is not None else None
    if current is not None and _is_hook(current):
        current.on_new_provider = callback


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
            span = context.get(_SPAN_KEY) if _SPAN_KEY is not None else None
            labels = self.labels_for(span)
            stats = span_stats_start() if self.span_stats and labels.span_id else None
            ours = LABELS.set(labels)
        except Exception:  # noqa: BLE001 - never break the program's tracing
            logger.debug("hotspan: span labels not set", exc_info=True)
            return token
        _publish(labels)
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
                LABELS.set(self.labels_for(self.inner.get_current().get(_SPAN_KEY)))
            restored = LABELS.get(None)
            _publish(restored)
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


_SPAN_KEY: Any = None
_span_stats = False


def mark_profiled(span: Any, labels: Any, restored: Any, root_spans_only: bool) -> None:
    """At the detach of a span whose labels got samples: tag it for traces-to-profiles (the
    twin of linker.c's linker_profiled)."""
    if not root_spans_only or labels.root_span_id == labels.span_id:
        if span is not None and span.is_recording():
            span.set_attribute(PROFILE_ID_ATTRIBUTE, format(labels.span_id, "016x"))
    elif restored is not None and restored.root_span_id == labels.root_span_id:
        restored.sampled = True  # the samples belong to the root: it gets the attribute


def install_span_linking(
    root_spans_only: bool, native: bool = True, span_stats: bool = False
) -> bool:
    """Hooks OpenTelemetry when it is installed: now if the program imported it already,
    else when it does (importing it ourselves would cost programs that never trace ~3 MiB).
    False, and no span labels, when it is not installed.  ``span_stats``: spans get their
    stats as attributes at detach (see the module's docstring)."""
    global _span_stats
    _span_stats = span_stats
    module = sys.modules.get("opentelemetry.context")
    if module is not None:
        return _hook(module, root_spans_only, native)
    try:
        if not _installed("opentelemetry"):
            return False
    except (ImportError, ValueError):
        return False
    for finder in sys.meta_path:
        if isinstance(finder, _HookOnImport):
            finder.root_spans_only, finder.native = root_spans_only, native
            return True
    sys.meta_path.insert(0, _HookOnImport(root_spans_only, native))
    return True


def _installed(name: str) -> bool:
    """``importlib.util.find_spec(name) is not None`` for a top-level name, without importing
    importlib.util (what the agent imports stays in the program for its GC to walk)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is not None and find(name, None) is not None:
            return True
    return False


class _HookOnImport:
    """A meta path finder that lets ``opentelemetry.context`` load normally, then hooks it."""

    def __init__(self, root_spans_only: bool, native: bool) -> None:
        self.root_spans_only = root_spans_only
        self.native = native

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "opentelemetry.context":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = _HookingLoader(spec.loader, self.root_spans_only, self.native)  # duck-typed
        spec.loader = loader
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        return spec


class _HookingLoader:
    def __init__(self, loader: Any, root_spans_only: bool, native: bool) -> None:
        self._loader = loader
        self._root_spans_only = root_spans_only
        self._native = native

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            _hook(module, self._root_spans_only, self._native)
        except Exception:  # noqa: BLE001 - never break the program's import
            logger.debug("hotspan: OpenTelemetry not hooked", exc_info=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def _hook(otel_context: Any, root_spans_only: bool, native: bool) -> bool:
    global _SPAN_KEY
    current = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    if current is None:
        logger.warning("hotspan: this OpenTelemetry version has no runtime context to hook")
        return False
    # Only now: a program that never imports OpenTelemetry has no span to give GC pauses to,
    # and should not pay a callback on every collection.
    install_gc_callback(native)
    if _is_hook(current):
        current.root_spans_only = root_spans_only
        current.span_stats = _span_stats
        current.on_new_provider = _on_new_provider
        return True
    try:
        # The key OpenTelemetry stores the current span under; get_current_span() would do
        # the same lookup with more calls, on every attach.
        from opentelemetry.trace.propagation import _SPAN_KEY as span_key
    except ImportError:
        logger.warning("hotspan: this OpenTelemetry version keeps spans differently")
        return False
    _SPAN_KEY = span_key
    hook: Any
    if native and _native is not None:
        # The C twin of SpanLinkingRuntimeContext (thread labels are the Python sampler's).
        def on_reset_failed() -> None:
            LABELS.set(hook.labels_for(hook.get_current().get(_SPAN_KEY)))

        hook = _native.SpanLinker(
            current, span_key, LABELS, on_reset_failed, root_spans_only, _span_stats
        )
    else:
        hook = SpanLinkingRuntimeContext(current, root_spans_only, _span_stats)
    hook.on_new_provider = _on_new_provider
    otel_context._RUNTIME_CONTEXT = hook
    # A span current before the agent started (hotspan.configure inside a span) counts too.
    try:
        LABELS.set(hook.labels_for(current.get_current().get(_SPAN_KEY)))
        _publish(LABELS.get(None))
    except Exception:  # noqa: BLE001
        logger.debug("hotspan: no current span at start", exc_info=True)
    return True


def _is_hook(runtime_context: Any) -> bool:
    return isinstance(runtime_context, SpanLinkingRuntimeContext) or (
        _native is not None and isinstance(runtime_context, _native.SpanLinker)
    )


def enable_native_labels() -> bool:
    """Teaches the C sampler the node types of this CPython's HAMT, from real contexts, and
    checks that it finds :data:`LABELS` exactly as ``ContextVar.get`` does."""
    if _native is None:
        return False
    probe = Labels(1, 2, 3, 4, 0)

    def contexts() -> Tuple[contextvars.Context, contextvars.Context]:
        small = contextvars.Context().run(_context_with, [LABELS], probe)
        filler: List[contextvars.ContextVar[Any]] = [
            contextvars.ContextVar(f"hotspan.probe{i}") for i in range(64)
        ]
        big = contextvars.Context().run(_context_with, filler + [LABELS], probe)
        return small, big

    small, big = contexts()
    if not _native.enable_labels(LABELS, small, big):
        return False
    ok = _native.find_in(small) is probe and _native.find_in(big) is probe
    ok = ok and _native.find_in(contextvars.Context()) is None
    if not ok:
        logger.warning("hotspan: this Python's contextvars layout is unknown; no span labels")
        _native.enable_labels(LABELS, contextvars.Context(), contextvars.Context())
    return ok


def _context_with(variables: List[contextvars.ContextVar], value: Any) -> contextvars.Context:
    for var in variables:
        var.set(value if var is LABELS else 0)
    return contextvars.copy_context()
