"""The labels a sample carries, as both span linkers and both samplers share them: the
ContextVar :data:`LABELS`, its per-thread copies for the pure-Python sampler, the key
OpenTelemetry keeps the current span under, and the attributes the linkers set on spans.

:mod:`hotspan.agent.context` (tag sets, the C linker, the choice of twin) and its pure-Python
twins in :mod:`hotspan.agent.context_py` both build on this module, which imports neither.
"""

from __future__ import annotations

import contextvars
import threading

from hotspan._speedups import load_sampler

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict

# What a sample taken in a context must carry: a Labels object (C or Python) or None.
LABELS: contextvars.ContextVar = contextvars.ContextVar("hotspan.labels")

# Labels per thread ident, for the pure-Python sampler, which cannot read another thread's
# context: it is right for threads, and per thread (not per task) under asyncio.  Kept only
# while that sampler runs (it costs every span a little).
THREAD_LABELS: Dict[int, Any] = {}
_keep_thread_labels = False
_sampler = load_sampler()
_native_changed = _sampler.labels_changed if _sampler is not None else None


def keep_thread_labels() -> None:
    global _keep_thread_labels
    _keep_thread_labels = True


def publish(value: Any) -> None:
    """Tells the sampler that ``value`` is now the current thread's labels: the pure-Python
    sampler keeps it; the native one reads labels itself, but samples a waiting thread again
    when they change (its C span linker tells it without this call)."""
    if _keep_thread_labels:
        THREAD_LABELS[threading.get_ident()] = value
    if _native_changed is not None:
        _native_changed()  # returns at once unless the native sampler runs


# The key OpenTelemetry stores the current span under, once the span linker has found it.
_span_key: Any = None


def span_key() -> Any:
    return _span_key


def set_span_key(key: Any) -> None:
    global _span_key
    _span_key = key


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
