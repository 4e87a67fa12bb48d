"""Span conditions: which ended spans were slow, failed, or burnt CPU ("profiling what
matters").  The hook only: :class:`SpanConditions` records a verdict per ended span, and the
upload path asks :meth:`SpanConditions.condition` for a sample's span id.

How it sees spans end: OpenTelemetry's ``use_span`` / ``start_as_current_span`` detach the
span's context *before* the span ends (and records the exception and status after that), so
the span linker (:mod:`hotspan.agent.context`) cannot judge a span at its detach.  Instead, at
the first detach of a span from each SDK ``TracerProvider`` it hands that span's
``_span_processor`` (the provider's ``SynchronousMultiSpanProcessor``, shared by every span of
the provider, those already started included) to :meth:`SpanConditions._on_new_provider`,
which adds a span processor of ours to it once; its ``on_end`` sees each ``ReadableSpan`` with
its final duration, status and attributes.

That relies on an SDK detail, the private ``Span._span_processor`` attribute and its
``add_span_processor`` method (opentelemetry-sdk 1.x).  Without them (another SDK, a span type
without that attribute, or a provider whose spans are never made current through
OpenTelemetry's context) no processor is added for that provider: its spans are never seen
ending and :meth:`~SpanConditions.condition` answers :data:`PENDING` for them for ever, which
the upload path must treat as "no condition known".  ``stats()["providers"]`` counts the
providers hooked.

``high_cpu`` reads the span's ``hotspan.cpu_time_ns`` attribute, which the linker sets at the
detach when ``span_stats`` is on: with span stats off, no span is ``high_cpu``.
"""

from __future__ import annotations

import threading
import time

from hotspan._speedups import load_module
from hotspan.agent import context
from hotspan.agent.context import CPU_TIME_ATTRIBUTE

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Dict, List, Optional, Tuple

# condition(span_id) for a span not seen ending (yet, or ever: see the module's docstring).
PENDING = None
SLOW = "slow"
ERROR = "error"
HIGH_CPU = "high_cpu"
# The order names are joined in: condition() answers e.g. "slow,error".
CONDITIONS = (SLOW, ERROR, HIGH_CPU)
# Parents followed at most by lineage() (broken ids making a cycle must not loop).
MAX_ANCESTORS = 256


_SLOW_BIT, _ERROR_BIT, _HIGH_CPU_BIT = 1, 2, 4
# Verdict by its bits: "", "slow", "error", "slow,error", ...
_VERDICTS = tuple(
    ",".join(c for i, c in enumerate(CONDITIONS) if bits & (1 << i)) for bits in range(8)
)

_native = load_module("_spans")


class PyVerdicts:
    """The pure-Python twin of ``_speedups/spans.c``'s ``Verdicts``: a span processor whose
    ``on_end`` judges each ended span, and the table of verdicts it keeps (two generations:
    see :class:`SpanConditions`).  ``entry`` and ``lineage`` answer in condition bits."""

    def __init__(
        self,
        slow_ns: int,
        errors: bool,
        cpu_ratio: float,
        max_spans: int = 50_000,
        max_age_ns: int = 600_000_000_000,
    ) -> None:
        self.slow_ns = slow_ns
        self.errors = bool(errors)
        self.cpu_ratio = cpu_ratio if cpu_ratio > 0 else 0.0
        self.error_code: Any = None
        self.cpu_key: Any = None
        self._generation_size = max(1, max_spans // 2)
        self._generation_ns = max_age_ns // 2
        # (span id) -> (local parent's span id, condition bits)
        self._current: Dict[int, Tuple[int, int]] = {}
        self._older: Dict[int, Tuple[int, int]] = {}
        self._generation_start = time.monotonic_ns()
        self._counts = {"ended": 0, "slow": 0, "error": 0, "high_cpu": 0, "forgotten": 0}

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def _on_ending(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def on_end(self, span: Any) -> None:
        try:
            duration = span._end_time - span._start_time
            bits = 0
            if self.slow_ns and duration >= self.slow_ns:
                bits = _SLOW_BIT
            if self.errors and span._status.status_code is self.error_code is not None:
                bits |= _ERROR_BIT
            if self.cpu_ratio and duration > 0 and self.cpu_key is not None:
                cpu = span._attributes.get(self.cpu_key)
                if cpu is not None and cpu >= self.cpu_ratio * duration:
                    bits |= _HIGH_CPU_BIT
            span_id = span._context.span_id
            parent = span._parent
            parent_id = parent.span_id if parent is not None and not parent.is_remote else 0
        except (AttributeError, TypeError):
            return  # not the SDK's ReadableSpan as we know it
        counts = self._counts
        counts["ended"] += 1
        for bit, name in ((_SLOW_BIT, SLOW), (_ERROR_BIT, ERROR), (_HIGH_CPU_BIT, HIGH_CPU)):
            if bits & bit:
                counts[name] += 1
        if len(self._current) >= self._generation_size or (
            not counts["ended"] & 1023
            and self._generation_ns
            and time.monotonic_ns() - self._generation_start > self._generation_ns
        ):
            counts["forgotten"] += len(self._older)
            self._older, self._current = self._current, {}
            self._generation_start = time.monotonic_ns()
        self._current[span_id] = (parent_id, bits)

    def entry(self, span_id: int) -> Optional[Tuple[int, int]]:
        found = self._current.get(span_id)
        if found is None:
            found = self._older.get(span_id)
        return (found[1], found[0]) if found is not None else None

    def lineage(self, span_id: int) -> Tuple[int, bool]:
        bits = 0
        depth = 0
        while span_id and depth < MAX_ANCESTORS:
            found = self.entry(span_id)
            if found is None:
                return bits, False
            bits |= found[0]
            span_id = found[1]
            depth += 1
        return bits, True

    def stats(self) -> Dict[str, int]:
        return {**self._counts, "kept": len(self._current) + len(self._older)}


class SpanConditions:
    """Watches span ends and keeps each one's verdict for a while.

    ``slow_threshold_s``: a span is ``slow`` when its duration is at least this (0: off);
    ``errors``: ``error`` when its status code is ERROR; ``cpu_threshold_percent``:
    ``high_cpu`` when its CPU (``hotspan.cpu_time_ns``, span stats) is at least this percent of
    its duration (0: off).  Verdicts are kept for the most recent ``max_spans`` ended spans at
    most and about ``max_age_s`` seconds at most (two generations: when the newer one holds
    ``max_spans // 2`` verdicts or is ``max_age_s / 2`` old, looked at every 1,024 span ends,
    the older one is dropped), so a verdict stays at least ``max_spans // 2`` spans or
    ``max_age_s / 2`` seconds, whichever comes first.  The table is C where built (24 bytes a
    verdict, 2.4 MiB at most with the default bound), else a dict.
    """

    def __init__(
        self,
        slow_threshold_s: float,
        errors: bool,
        cpu_threshold_percent: float,
        max_spans: int = 50_000,
        max_age_s: float = 600.0,
        native: bool = True,
    ) -> None:
        cpu_ratio = cpu_threshold_percent / 100.0 if cpu_threshold_percent > 0 else 0.0
        make = _native.Verdicts if native and _native is not None else PyVerdicts
        self._verdicts: Any = make(0, bool(errors), cpu_ratio, max_spans, int(max_age_s * 1e9))
        self._verdicts.cpu_key = CPU_TIME_ATTRIBUTE
        self.set_slow_threshold(slow_threshold_s)
        self._multis: List[Any] = []
        self._lock = threading.Lock()
        self.installed = False

    @property
    def native(self) -> bool:
        return not isinstance(self._verdicts, PyVerdicts)

    def set_slow_threshold(self, seconds: float) -> None:
        """Spans of at least ``seconds`` are ``slow`` from now on (0: the rule is off)."""
        self._verdicts.slow_ns = int(seconds * 1e9) if seconds > 0 else 0

    # -------------------------------------------------------------- the hook

    def install(self) -> None:
        """From now on, the span linker hands each new SDK provider's span processor to us
        (the linker itself is installed by the agent's start: trace_correlation)."""
        context.set_provider_hook(self._on_new_provider)
        self.installed = True

    def uninstall(self) -> None:
        """No more verdicts: our processor leaves every provider it joined."""
        if context.provider_hook() == self._on_new_provider:
            context.set_provider_hook(None)
        self.installed = False
        with self._lock:
            multis, self._multis = self._multis, []
        for multi in multis:
            lock = getattr(multi, "_lock", None)
            if lock is None:
                continue
            with lock:
                multi._span_processors = tuple(
                    p for p in multi._span_processors if p is not self._verdicts
                )

    def _on_new_provider(self, multi: Any) -> None:
        """A provider's multi span processor, seen for the first time by the linker."""
        with self._lock:
            if not self.installed or any(m is multi for m in self._multis):
                return
            add = getattr(multi, "add_span_processor", None)
            if add is None:
                return
            if self._verdicts.error_code is None:
                # Only now: a span of the SDK was seen, so importing this costs nothing new.
                from opentelemetry.trace import StatusCode

                self._verdicts.error_code = StatusCode.ERROR
            if any(p is self._verdicts for p in getattr(multi, "_span_processors", ())):
                return
            add(self._verdicts)
            self._multis.append(multi)

    # -------------------------------------------------------------- verdicts

    def on_end(self, span: Any) -> None:
        """A span ended: its verdict (what our processor does for each span the SDK ends)."""
        self._verdicts.on_end(span)

    def condition(self, span_id: int) -> Optional[str]:
        """:data:`PENDING` (None) when the span was not seen ending (or its verdict is
        forgotten), ``""`` when it ended meeting no rule, else the rules it met joined by
        ``","`` in the order of :data:`CONDITIONS`."""
        entry = self.entry(span_id)
        return entry[0] if entry is not None else PENDING

    def entry(self, span_id: int) -> Optional[Tuple[str, int]]:
        """(verdict, local parent's span id or 0) of an ended span, or None (pending): the
        upload path follows parents, so a query in a slow request counts as slow too."""
        found = self._verdicts.entry(span_id)
        return (_VERDICTS[found[0]], found[1]) if found is not None else None

    def lineage(self, span_id: int) -> Tuple[str, bool]:
        """The conditions ``span_id`` and its local ancestors met (joined as
        :meth:`condition` joins them: a query in a slow request is part of the slow request),
        and whether all of them have ended (False: one is pending, and the verdict may grow)."""
        bits, complete = self._verdicts.lineage(span_id)
        return _VERDICTS[bits], complete

    @property
    def hooked(self) -> bool:
        """Whether a provider's span ends reach us at all (else every span stays pending)."""
        return bool(self._multis)

    def stats(self) -> Dict[str, int]:
        return {**self._verdicts.stats(), "providers": len(self._multis)}
