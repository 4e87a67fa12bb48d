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
``_speedups/sampler/span_stats.c`` for how each is measured, and
:func:`hotspan.agent.context_py.span_stats_attributes` for the Python twin.

The pure-Python twins of the C types and functions used here (labels, span linker, span
stats) are in :mod:`hotspan.agent.context_py`, imported only where they run.  What both this
module and the twins use (:data:`LABELS`, the span key, the attribute names) is in
:mod:`hotspan.agent.labels`.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import threading

from hotspan._speedups import load_sampler
from hotspan.agent.after_import import AfterImport

# The attribute names, THREAD_LABELS and keep_thread_labels are here too for the modules that
# find them here (spans.py, the Python sampler, the collectors).
from hotspan.agent.labels import (  # noqa: F401
    ALLOC_BYTES_ATTRIBUTE,
    CPU_TIME_ATTRIBUTE,
    GC_COLLECTIONS_ATTRIBUTE,
    GC_PAUSE_ATTRIBUTE,
    HEAP_OBJECTS_ATTRIBUTE,
    LABELS,
    PROFILE_ID_ATTRIBUTE,
    RSS_ATTRIBUTE,
    THREAD_LABELS,
    THREADS_ATTRIBUTE,
    keep_thread_labels,
    publish,
    set_span_key,
)
from hotspan.agent.log import logger

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple


_native = load_sampler()


# The C sampler's labels type and process figures where the extension is built; else their
# pure-Python twins (agent/context_py.py), imported only then.
if _native is not None:
    Labels: Callable[..., Any] = _native.Labels
    process_stats: Callable[[], Tuple[int, int, int]] = _native.process_stats
else:
    from hotspan.agent.context_py import PyLabels as Labels
    from hotspan.agent.context_py import process_stats  # noqa: F401 - for governor.py

_TAG_TOKENS: contextvars.ContextVar = contextvars.ContextVar("hotspan.tag_tokens")


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
        publish(value)
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
        publish(outer)
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
    for function in (tagset_id, tagset, labels_tuple, publish, check_tag_key):
        hide_code_tree(function.__code__)


_hide_wrapper_frames()


# ------------------------------------------------------------------ OpenTelemetry


def install_gc_callback(native: bool = True) -> None:
    """Puts the garbage-collection charge in ``gc.callbacks`` (once): C with the C linker
    (which finds the current labels as its sampler does), else Python."""
    import gc

    if native and _native is not None:
        callback = _native.gc_callback
    else:
        from hotspan.agent.context_py import gc_charge as callback
    if callback not in gc.callbacks:
        gc.callbacks.append(callback)


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
    module = sys.modules.get(_OTEL_CONTEXT)
    current = getattr(module, "_RUNTIME_CONTEXT", None) if module is not None else None
    if current is not None and _is_hook(current):
        current.on_new_provider = callback


_OTEL_CONTEXT = "opentelemetry.context"
# How spans are linked: install_span_linking's settings, read by _hook (now, or as the program
# imports OpenTelemetry).
_span_stats = False
_root_spans_only = False
_native_linker = True


def install_span_linking(
    root_spans_only: bool, native: bool = True, span_stats: bool = False
) -> bool:
    """Hooks OpenTelemetry when it is installed: now if the program imported it already,
    else when it does (importing it ourselves would cost programs that never trace ~3 MiB).
    False, and no span labels, when it is not installed.  ``span_stats``: spans get their
    stats as attributes at detach (see the module's docstring)."""
    global _span_stats, _root_spans_only, _native_linker
    _span_stats, _root_spans_only, _native_linker = span_stats, root_spans_only, native
    module = sys.modules.get(_OTEL_CONTEXT)
    if module is not None:
        return _hook(module)
    try:
        if not _installed("opentelemetry"):
            return False
    except (ImportError, ValueError):
        return False
    if not any(isinstance(f, AfterImport) and f.name == _OTEL_CONTEXT for f in sys.meta_path):
        AfterImport(_OTEL_CONTEXT, _hook).install()  # hooks it with the settings of then
    return True


def _installed(name: str) -> bool:
    """``importlib.util.find_spec(name) is not None`` for a top-level name, without importing
    importlib.util (what the agent imports stays in the program for its GC to walk)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is not None and find(name, None) is not None:
            return True
    return False


def _hook(otel_context: Any) -> bool:
    """Puts the span linker in ``opentelemetry.context``, as install_span_linking was last
    told."""
    root_spans_only, native = _root_spans_only, _native_linker
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
        from opentelemetry.trace.propagation import _SPAN_KEY as found_key
    except ImportError:
        logger.warning("hotspan: this OpenTelemetry version keeps spans differently")
        return False
    set_span_key(found_key)
    hook: Any
    if native and _native is not None:
        # The C twin of SpanLinkingRuntimeContext (thread labels are the Python sampler's).
        def on_reset_failed() -> None:
            LABELS.set(hook.labels_for(hook.get_current().get(found_key)))

        hook = _native.SpanLinker(
            current, found_key, LABELS, on_reset_failed, root_spans_only, _span_stats
        )
    else:
        from hotspan.agent.context_py import SpanLinkingRuntimeContext

        hook = SpanLinkingRuntimeContext(current, root_spans_only, _span_stats)
    hook.on_new_provider = _on_new_provider
    otel_context._RUNTIME_CONTEXT = hook
    # A span current before the agent started (hotspan.configure inside a span) counts too.
    try:
        LABELS.set(hook.labels_for(current.get_current().get(found_key)))
        publish(LABELS.get(None))
    except Exception:  # noqa: BLE001
        logger.debug("hotspan: no current span at start", exc_info=True)
    return True


def _is_hook(runtime_context: Any) -> bool:
    if _native is not None and isinstance(runtime_context, _native.SpanLinker):
        return True
    # The Python linker exists only if its module was imported (see _hook).
    twins = sys.modules.get("hotspan.agent.context_py")
    return twins is not None and isinstance(runtime_context, twins.SpanLinkingRuntimeContext)


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
