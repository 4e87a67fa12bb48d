"""The run's root span as the program's own spans see it.

``hotspan run`` makes its root span current before the program starts, so a batch job's spans
become its children.  A program that turns out to serve requests (it listens on a TCP socket)
must not have its requests made one trace: the span in the program's contexts is therefore a
stand-in that, once :meth:`RunSpan.step_aside` is called, is no span at all.  Contexts copied
before that (an asyncio task's, a thread's) hold the same stand-in, so they all let go at once,
which resetting a context variable in one of them could not do.

Imported only where OpenTelemetry is installed (:func:`hotspan.agent.batch.start_root_span`).
"""

from __future__ import annotations

from typing import Any, Optional

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext
from opentelemetry.util import types


class RunSpan(trace.Span):
    """Forwards to the run's span until :meth:`step_aside`; then an invalid span, so a span
    started under it begins a trace of its own.

    There is no ``_context`` attribute on purpose: the span linker reads that attribute of the
    SDK's spans instead of calling ``get_span_context``, which here must be called.
    """

    def __init__(self, span: trace.Span) -> None:
        self._span: Optional[trace.Span] = span

    def step_aside(self) -> None:
        self._span = None

    def get_span_context(self) -> SpanContext:
        span = self._span
        return span.get_span_context() if span is not None else INVALID_SPAN_CONTEXT

    def is_recording(self) -> bool:
        span = self._span
        return span is not None and span.is_recording()

    def end(self, end_time: Optional[int] = None) -> None:
        """The run's span is hotspan's to end (when the program exits), not the program's."""

    def set_attributes(self, attributes: Any) -> None:
        if self._span is not None:
            self._span.set_attributes(attributes)

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        if self._span is not None:
            self._span.set_attribute(key, value)

    def add_event(
        self, name: str, attributes: types.Attributes = None, timestamp: Optional[int] = None
    ) -> None:
        if self._span is not None:
            self._span.add_event(name, attributes, timestamp)

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        if self._span is not None:
            self._span.add_link(context, attributes)

    def update_name(self, name: str) -> None:
        if self._span is not None:
            self._span.update_name(name)

    def set_status(self, status: Any, description: Optional[str] = None) -> None:
        if self._span is not None:
            self._span.set_status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: Optional[int] = None,
        escaped: bool = False,
    ) -> None:
        if self._span is not None:
            self._span.record_exception(exception, attributes, timestamp, escaped)
