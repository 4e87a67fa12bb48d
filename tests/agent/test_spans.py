"""The span conditions' processor and its verdict table, C and Python twins side by side, fed
by the real OpenTelemetry SDK: the same spans must get the same verdicts from both."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, Iterator, List

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

from hotspan.agent import spans as spans_module
from hotspan.agent.spans import PyVerdicts, SpanConditions

NATIVE = spans_module._native
twins = pytest.mark.skipif(NATIVE is None, reason="the C span processor is not built")

SLOW_NS = 20_000_000


def _both(max_spans: int = 50_000) -> List[Any]:
    made = [PyVerdicts(SLOW_NS, True, 0.5, max_spans)]
    if NATIVE is not None:
        made.append(NATIVE.Verdicts(SLOW_NS, True, 0.5, max_spans))
    for verdicts in made:
        verdicts.error_code = StatusCode.ERROR
        verdicts.cpu_key = "hotspan.cpu_time_ns"
    return made


def _provider(processors: List[Any]) -> Any:
    provider = TracerProvider()
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


@contextlib.contextmanager
def _timed(tracer: Any, name: str, start_ns: int, duration_ns: int) -> Iterator[Any]:
    """A current span that ends ``duration_ns`` after ``start_ns``, whatever the clock says:
    on a loaded machine a span with nothing in it can last longer than the slow threshold."""
    with tracer.start_as_current_span(name, start_time=start_ns, end_on_exit=False) as span:
        yield span
    span.end(end_time=start_ns + duration_ns)


def _spans(provider: Any) -> Dict[str, int]:
    """A request with a slow child, a failing child and a busy one; a lone normal span."""
    tracer = provider.get_tracer("test")
    ids: Dict[str, int] = {}
    ms = 1_000_000
    t0 = time.time_ns()
    with _timed(tracer, "request", t0, 2 * SLOW_NS + 10 * ms) as request:
        ids["request"] = request.get_span_context().span_id
        with _timed(tracer, "slow", t0 + ms, SLOW_NS * 3 // 2) as span:
            ids["slow"] = span.get_span_context().span_id
        with _timed(tracer, "failing", t0 + SLOW_NS * 2, ms // 10) as span:
            ids["failing"] = span.get_span_context().span_id
            span.set_status(Status(StatusCode.ERROR))
        with _timed(tracer, "busy", t0 + SLOW_NS * 2 + ms, ms) as span:
            ids["busy"] = span.get_span_context().span_id
            # As span stats would set it: CPU over half the span's duration.
            span.set_attribute("hotspan.cpu_time_ns", 10**9)
    with _timed(tracer, "normal", t0 + 3 * SLOW_NS, ms // 10) as span:
        ids["normal"] = span.get_span_context().span_id
    return ids


@twins
def test_the_twins_judge_alike() -> None:
    made = _both()
    ids = _spans(_provider(made))
    for verdicts in made:
        entry = {name: verdicts.entry(span_id) for name, span_id in ids.items()}
        assert entry["slow"] == (1, ids["request"]), type(verdicts)
        assert entry["failing"] == (2, ids["request"])
        assert entry["busy"] == (4, ids["request"])
        assert entry["normal"] == (0, 0)
        # The request is slow itself (it holds the slow child), and its children's verdicts
        # are not its own: lineage joins them going up, not down.
        assert entry["request"] == (1, 0)
        assert verdicts.lineage(ids["failing"]) == (3, True)
        assert verdicts.lineage(12345) == (0, False)
        stats = verdicts.stats()
        assert stats["ended"] == 5 and stats["slow"] == 2 and stats["error"] == 1
        assert stats["high_cpu"] == 1 and stats["kept"] == 5 and stats["forgotten"] == 0


@twins
def test_the_twins_forget_alike() -> None:
    """Two generations of max_spans / 2: the oldest verdicts go first, and the count of what
    was forgotten is the same."""
    made = _both(max_spans=4)
    provider = _provider(made)
    tracer = provider.get_tracer("test")
    ids = []
    for _ in range(7):
        with tracer.start_as_current_span("s") as span:
            ids.append(span.get_span_context().span_id)
    for verdicts in made:
        known = [verdicts.entry(i) is not None for i in ids]
        # Generations of 2: [0,1] [2,3] [4,5] [6]: the newest two generations are kept.
        assert known == [False, False, False, False, True, True, True], type(verdicts)
        assert verdicts.stats()["forgotten"] == 4


def test_spans_of_another_kind_stay_pending() -> None:
    """An object that is not the SDK's ReadableSpan is never judged, and never raises."""

    class Odd:
        _start_time = "never"

    for verdicts in _both():
        verdicts.on_end(Odd())
        verdicts.on_end(None)
        assert verdicts.stats()["ended"] == 0


def test_span_conditions_use_the_c_table_where_built() -> None:
    conditions = SpanConditions(0.02, True, 0)
    assert conditions.native == (NATIVE is not None)
    assert not SpanConditions(0.02, True, 0, native=False).native
    conditions._verdicts.error_code = StatusCode.ERROR  # as its first provider sets it
    ids = _spans(_provider([conditions._verdicts]))
    assert conditions.condition(ids["failing"]) == "error"
    assert conditions.condition(ids["normal"]) == ""
    assert conditions.condition(ids["slow"]) == "slow"
    assert conditions.lineage(ids["slow"]) == ("slow", True)
    assert conditions.condition(999) is None
