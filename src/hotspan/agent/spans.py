"""Span conditions: which ended spans were slow, failed, or burnt CPU (issue 14, "Profiling what
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


class SpanConditions:
    """Watches span ends and keeps each one's verdict for a while.

    ``slow_threshold_s``: a span is ``slow`` when its duration is at least this (0: off);
    ``errors``: ``error`` when its status code is ERROR; ``cpu_threshold_percent``:
    ``high_cpu`` when its CPU (``hotspan.cpu_time_ns``, span stats) is at least this percent of
    its duration (0: off).  Verdicts are kept for the most recent ``max_spans`` ended spans at
    most and about ``max_age_s`` seconds at most (two generations: when the newer one holds
    ``max_spans // 2`` verdicts or is ``max_age_s / 2`` old, looked at every 1,024 span ends,
    the older one is dropped), so a verdict stays at least ``max_spans // 2`` spans or
    ``max_age_s / 2`` seconds, whichever comes first.
    """

    def __init__(
        self,
        slow_threshold_s: float,
        errors: bool,
        cpu_threshold_percent: float,
        max_spans: int = 50_000,
        max_age_s: float = 600.0,
    ) -> None:
        self.slow_threshold_ns = 0
        self.set_slow_threshold(slow_threshold_s)
        self.errors = bool(errors)
        self.cpu_ratio = cpu_threshold_percent / 100.0 if cpu_threshold_percent > 0 else 0.0
        self._generation_size = max(1, max_spans // 2)
        self._generation_ns = int(max_age_s * 1e9 / 2)
        self._current: Dict[int, int] = {}
        self._older: Dict[int, int] = {}
        self._generation_start = time.monotonic_ns()
        self._processor: Any = None
        self._error_code: Any = None  # StatusCode.ERROR, once the SDK is loaded
        self._multis: List[Any] = []
        self._lock = threading.Lock()
        self.installed = False
        # Counters (approximate under concurrent span ends: no lock on the hot path).
        self.ended = 0
        self.slow = 0
        self.error = 0
        self.high_cpu = 0
        self.forgotten = 0

    def set_slow_threshold(self, seconds: float) -> None:
        """Spans of at least ``seconds`` are ``slow`` from now on (0: the rule is off)."""
        self.slow_threshold_ns = int(seconds * 1e9) if seconds > 0 else 0

    # -------------------------------------------------------------- the hook

    def install(self) -> None:
        """From now on, the span linker hands each new SDK provider's span processor to us
        (the linker itself is installed by the agent's start: trace_correlation)."""
        context.set_provider_hook(self._on_new_provider)
        self.installed = True

    def uninstall(self) -> None:
        """No more verdicts: our processor leaves every provider it joined."""
        if context._on_new_provider == self._on_new_provider:
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
                    p for p in multi._span_processors if p is not self._processor
                )

    def _on_new_provider(self, multi: Any) -> None:
        """A provider's multi span processor, seen for the first time by the linker."""
        with self._lock:
            if not self.installed or any(m is multi for m in self._multis):
                return
            add = getattr(multi, "add_span_processor", None)
            if add is None:
                return
            if self._processor is None:
                self._processor = _make_processor(self)
            if any(p is self._processor for p in getattr(multi, "_span_processors", ())):
                return
            add(self._processor)
            self._multis.append(multi)

    # -------------------------------------------------------------- verdicts

    def condition(self, span_id: int) -> Optional[str]:
        """:data:`PENDING` (None) when the span was not seen ending (or its verdict is
        forgotten), ``""`` when it ended meeting no rule, else the rules it met joined by
        ``","`` in the order of :data:`CONDITIONS`."""
        entry = self.entry(span_id)
        return entry[0] if entry is not None else PENDING

    def entry(self, span_id: int) -> Optional[Tuple[str, int]]:
        """(verdict, local parent's span id or 0) of an ended span, or None (pending): the
        upload path follows parents, so a query in a slow request counts as slow too."""
        packed = self._packed(span_id)
        return (_VERDICTS[packed & 7], packed >> 3) if packed is not None else None

    def _packed(self, span_id: int) -> Optional[int]:
        packed = self._current.get(span_id)
        return packed if packed is not None else self._older.get(span_id)

    def lineage(self, span_id: int) -> Tuple[str, bool]:
        """The conditions ``span_id`` and its local ancestors met (joined as
        :meth:`condition` joins them: a query in a slow request is part of the slow request),
        and whether all of them have ended (False: one is pending, and the verdict may grow)."""
        bits = 0
        depth = 0
        while span_id and depth < MAX_ANCESTORS:
            packed = self._packed(span_id)
            if packed is None:
                return _VERDICTS[bits], False
            bits |= packed & 7
            span_id = packed >> 3
            depth += 1
        return _VERDICTS[bits], True

    @property
    def hooked(self) -> bool:
        """Whether a provider's span ends reach us at all (else every span stays pending)."""
        return bool(self._multis)

    def stats(self) -> Dict[str, int]:
        return {
            "ended": self.ended,
            "slow": self.slow,
            "error": self.error,
            "high_cpu": self.high_cpu,
            "kept": len(self._current) + len(self._older),
            "forgotten": self.forgotten,
            "providers": len(self._multis),
        }

    def on_end(self, span: Any) -> None:
        """A span ended (our processor's on_end): its verdict.  Runs for every span the
        program ends: kept to a few attribute reads and one dict store."""
        try:
            duration = span._end_time - span._start_time
            met = 0
            if self.slow_threshold_ns and duration >= self.slow_threshold_ns:
                met = _SLOW_BIT
                self.slow += 1
            if self.errors and span._status.status_code is self._error_code:
                met |= _ERROR_BIT
                self.error += 1
            if self.cpu_ratio and duration > 0:
                cpu = span._attributes.get(CPU_TIME_ATTRIBUTE)
                if cpu is not None and cpu >= self.cpu_ratio * duration:
                    met |= _HIGH_CPU_BIT
                    self.high_cpu += 1
            span_id = span._context.span_id
            parent = span._parent
            parent_id = parent.span_id if parent is not None and not parent.is_remote else 0
        except (AttributeError, TypeError):
            return  # not the SDK's ReadableSpan as we know it
        self.ended += 1
        current = self._current
        if len(current) >= self._generation_size or (
            not self.ended & 1023 and self._generation_ns and self._generation_too_old()
        ):
            current = self._rotate()
        # One int per span, (parent << 3) | conditions: a root span that met none stores the
        # shared 0, and no span a tuple and a string (at 50,000 spans that was 7 MiB).
        current[span_id] = (parent_id << 3) | met

    def _generation_too_old(self) -> bool:
        return time.monotonic_ns() - self._generation_start > self._generation_ns

    def _rotate(self) -> Dict[int, int]:
        self.forgotten += len(self._older)
        self._older, self._current = self._current, {}
        self._generation_start = time.monotonic_ns()
        return self._current


def _make_processor(conditions: SpanConditions) -> Any:
    """Our SpanProcessor: the SDK's base class (its other hooks do nothing), made when the SDK
    is known to be loaded (a span of it was seen), so importing this module imports no
    OpenTelemetry."""
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.trace import StatusCode

    conditions._error_code = StatusCode.ERROR

    class _ConditionsProcessor(SpanProcessor):  # type: ignore[misc]
        def __init__(self) -> None:
            # The bound method itself: one call per span end, not two.
            self.on_end = conditions.on_end  # type: ignore[method-assign]

    return _ConditionsProcessor()
