"""One root span around a whole batch job, so its profile can be found by one trace id.

``hotspan run`` starts it in the child before the program runs (see :mod:`.run`).  It uses a
private ``TracerProvider``: setting the global one would take that choice away from the
program, whose own ``trace.set_tracer_provider`` must keep working.  The span is made current
in the main thread, so the program's spans become its children and the samples taken there
carry its span id.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

from hotspan.agent.symbols import agent_code, hide_code

# Seconds the exporter may spend on one request (retries included); also the exit flush's.
EXPORT_TIMEOUT = 2.0


class OpenTelemetryMissing(ImportError):
    """The OpenTelemetry SDK or its OTLP/HTTP exporter is not installed."""


@dataclass
class RootSpan:
    """The started root span; :meth:`end` closes, exports and shuts down its provider."""

    trace_id_hex: str
    span_id_hex: str
    _span: Any = field(repr=False)
    _provider: Any = field(repr=False)
    _token: Any = field(repr=False, default=None)
    _stand_in: Any = field(repr=False, default=None)
    _ended: bool = field(repr=False, default=False)
    _pid: int = field(repr=False, default_factory=os.getpid)

    def end(self, exit_code: Optional[int] = None, timeout: float = EXPORT_TIMEOUT) -> None:
        """End the span (with the exit code, when known) and export it within ``timeout``."""
        # A fork()ed child that exits normally runs the parent's atexit handlers too: the span
        # is the parent's to end, once.
        if self._ended or os.getpid() != self._pid:
            return
        self._ended = True
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        if exit_code is not None:
            self._span.set_attribute("process.exit.code", exit_code)
            if exit_code != 0:
                self._span.set_status(Status(StatusCode.ERROR, f"exit code {exit_code}"))
        self._span.end()
        if self._token is not None:
            # Reset directly (OpenTelemetry's contexts are context variables): ending from
            # another context than the one attached to (a signal handler's, as a server
            # shuts down) fails, and OpenTelemetry's detach would log that as an error.
            reset = getattr(getattr(self._token, "var", None), "reset", None)
            with contextlib.suppress(Exception):
                if reset is not None:
                    reset(self._token)
                else:
                    context.detach(self._token)
        self._flush(timeout)

    def step_aside(self, service: str) -> None:
        """The program serves requests: from now on its spans start traces of their own, and
        this span, renamed ``<service>.start``, ends now as the trace of its start-up.

        The stand-in stays in the program's contexts, as no span.  The span is exported on a
        thread of its own (the SDK exports as a span ends): the caller is the program, about
        to serve.
        """
        if self._ended or self._stand_in is None or os.getpid() != self._pid:
            return
        self._ended = True
        self._stand_in.step_aside()
        self._span.update_name(f"{service}.start")
        end_time = time.time_ns()

        def export() -> None:
            self._span.end(end_time=end_time)
            self._flush(EXPORT_TIMEOUT)

        agent_code(export.__code__)
        threading.Thread(target=export, name="hotspan-run-span", daemon=True).start()

    def _flush(self, timeout: float) -> None:
        self._provider.force_flush(timeout_millis=int(timeout * 1000))
        self._provider.shutdown()


def start_root_span(
    service: str,
    server_address: str,
    headers: Optional[Mapping[str, str]] = None,
    command_args: Optional[List[str]] = None,
    attach: bool = True,
) -> Optional[RootSpan]:
    """Start ``<service>.run`` and export it to ``<server_address>/v1/traces`` when it ends.

    Raises :class:`OpenTelemetryMissing` without the SDK or the exporter.  Returns None when
    the SDK makes no real span (``OTEL_SDK_DISABLED``), as there is no trace to link then.
    """
    try:
        from opentelemetry import context, trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON
    except ImportError as exc:
        raise OpenTelemetryMissing(
            f"no root span, as OpenTelemetry is not installed ({exc}); "
            "pip install 'hotspan[otel]' to get one"
        ) from None

    # The root span is the point of the run: an OTEL_TRACES_SAMPLER ratio must not drop it.
    # Our own atexit handler shuts the provider down, after the span has ended.
    provider = TracerProvider(
        resource=Resource.create({"service.name": service}),
        sampler=ALWAYS_ON,
        shutdown_on_exit=False,
    )
    exporter = OTLPSpanExporter(
        endpoint=f"{server_address.rstrip('/')}/v1/traces",
        # A non-empty mapping, so OTEL_EXPORTER_OTLP_HEADERS meant for another collector
        # are not sent to this one.
        headers=dict(headers or {}) or {"User-Agent": "hotspan"},
        timeout=EXPORT_TIMEOUT,
    )
    # Simple, not batch: one span, exported as it ends (after profiling has stopped, see
    # run.bootstrap), with no worker thread of ours idling in the program's wall profile.
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("hotspan.run")
    args = list(command_args if command_args is not None else _command_args())
    span = tracer.start_span(
        f"{service}.run",
        kind=trace.SpanKind.INTERNAL,
        attributes={"process.command_args": args, "process.pid": os.getpid()},
    )
    span_context = span.get_span_context()
    if not span_context.is_valid:
        provider.shutdown()
        return None
    from hotspan.agent.run_span import RunSpan

    stand_in = RunSpan(span)
    token = context.attach(trace.set_span_in_context(stand_in)) if attach else None
    return RootSpan(
        trace_id_hex=trace.format_trace_id(span_context.trace_id),
        span_id_hex=trace.format_span_id(span_context.span_id),
        _span=span,
        _provider=provider,
        _token=token,
        _stand_in=stand_in,
    )


def _command_args() -> List[str]:
    # sys.argv is not final while sitecustomize runs (``-m mod`` is still "-m");
    # sys.orig_argv (3.10+) is the interpreter's command line as given.
    return [str(a) for a in getattr(sys, "orig_argv", None) or sys.argv]


def with_trace_tags(tags: Mapping[str, str], trace_id: str, span_id: str) -> Dict[str, str]:
    """``tags`` plus trace_id and root_span_id, keeping any value the user gave those keys."""
    merged = dict(tags)
    merged.setdefault("trace_id", trace_id)
    merged.setdefault("root_span_id", span_id)
    return merged


class ExitCodeRecorder:
    """The exit code of this interpreter, as far as an atexit handler can know it.

    ``sys.exit(n)`` in the main thread is recorded by wrapping ``sys.exit``; an uncaught
    exception leaves ``sys.last_value``.  ``raise SystemExit(n)`` leaves no trace, so then
    (and after a normal end, which looks the same) the code is unknown: None, not a guess.
    """

    def __init__(self) -> None:
        self._code: Optional[int] = None
        self._original_exit = sys.exit

    def install(self) -> None:
        original = self._original_exit

        def exit(status: object = None) -> None:
            if threading.current_thread() is threading.main_thread():
                self._code = _status_code(status)
            original(status)  # type: ignore[arg-type]

        exit.__doc__ = original.__doc__
        # The program's own sys.exit() call, not the agent's: no agent frame in its stacks.
        hide_code(exit.__code__)
        hide_code(_status_code.__code__)
        sys.exit = exit  # type: ignore[assignment]

    def exit_code(self) -> Optional[int]:
        last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if isinstance(last, KeyboardInterrupt):
            return 130  # Python ends itself with SIGINT then: what a shell reports as 128+2
        if isinstance(last, BaseException) and not isinstance(last, SystemExit):
            return 1
        return self._code


def _status_code(status: object) -> int:
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF
    return 1  # sys.exit("message") prints it and exits 1
