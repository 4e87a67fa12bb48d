"""The spans a TraceQL metrics query counts, read from a store.

Spans are read newest first, a page at a time over time slices sized from the spans seen so
far (each span read once), at most ``max_spans`` of them, for at most ``DEADLINE_S`` seconds
(checked between pages); a bound hit makes the answer partial, with a message saying which
bound.  A root-span filter (``{nestedSetParent<0}``, Traces Drilldown's default) is the
store's condition, so only roots are read.  The spans of a query that needs whole traces
come with their trace.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Dict, Iterator, List, Optional, Sequence

from hotspan.model.trace import Condition, SpanRecord
from hotspan.query.traceql import ast
from hotspan.query.traceql.fields import conjuncts
from hotspan.query.traceql.pipeline import evaluate
from hotspan.query.traceql.plan import Query
from hotspan.query.traceql.series import SEC, Page, Trace, trace_wide, value_getter
from hotspan.store.base import PARENT_LOOKBACK_NS, Store

# Bounds of the spans read (a page at a time, so memory stays at one page).  A span read
# costs about 7 us of CPU when the store's conditions are the whole filter, 20 us when the
# TraceQL engine runs on it, 35 us for structural queries (whole traces): a million stays
# within Grafana's 30 s data source timeout on one core.
MAX_SPANS = 1_000_000
PAGE_SPANS = 50_000
# Wall time a query may read for: checked between pages (a page takes 2 s at most),
# so the partial answer, with the spans counted so far, comes before Grafana's data source
# gives up (30 s by default).
DEADLINE_S = 25.0
TRACES_PER_FETCH = 500


@dataclass
class Candidates:
    """What reading the spans came to: how many, of how many traces, and why it stopped
    early if it did; and until when (``time.monotonic()``) reading may go on."""

    read: int = 0
    traces: set = field(default_factory=set)
    partial: Optional[str] = None
    deadline: float = field(default_factory=lambda: time.monotonic() + DEADLINE_S)

    def out_of_time(self, oldest_ns: Optional[int]) -> bool:
        """Whether the time is up; if so the answer is partial, counting the spans that
        started from ``oldest_ns`` on."""
        if time.monotonic() < self.deadline:
            return False
        self.partial = _deadline_message(oldest_ns)
        return True


def _filter_parts(query: Query) -> Optional[List[object]]:
    """The ``&&``-joined parts of a query that is one ``{...}`` judging each span alone
    (``true`` left out), or None."""
    if query.needs_traces or not isinstance(query.root, ast.Filter):
        return None
    return [
        p for p in conjuncts(query.root.expr) if not (isinstance(p, ast.Static) and p.value is True)
    ]


def exact_pushdown(query: Query) -> bool:
    """Whether the store's conditions are the whole filter (one ``{...}`` whose every
    ``&&``-joined part became a pushdown condition): then every span read matches, and the
    engine need not run on it."""
    parts = _filter_parts(query)
    return parts is not None and len(parts) == len(query.pushdown)


def presence_tests(query: Query) -> Optional[List[str]]:
    """When the store's conditions are the whole filter but for ``x != nil`` parts (Traces
    Drilldown adds one for the attribute it breaks down by): those attributes, whose presence
    is then all a span read must show (no engine).  None when the engine must run."""
    parts = _filter_parts(query)
    if parts is None:
        return None
    present = [
        p.expr.text
        for p in parts
        if isinstance(p, ast.Unary) and p.op == "exists" and isinstance(p.expr, ast.Attribute)
    ]
    if len(parts) - len(present) != len(query.pushdown) or any(map(trace_wide, present)):
        return None
    return present


def _by_trace(spans: Sequence[SpanRecord]) -> Dict[str, List[SpanRecord]]:
    out: Dict[str, List[SpanRecord]] = {}
    for span in spans:
        out.setdefault(span.trace_id, []).append(span)
    return out


def _evaluated(query: Query, spans: Sequence[SpanRecord]) -> List[SpanRecord]:
    """The spans of ``spans`` (of one trace) in the spansets the query gives, once each."""
    seen = set()
    out = []
    for spanset in evaluate(query, spans):
        for span in spanset.spans:
            if span.span_id not in seen:
                seen.add(span.span_id)
                out.append(span)
    return out


def _from(spans: List[SpanRecord], low_ns: int) -> List[SpanRecord]:
    """The spans of a store page (newest first) that started at ``low_ns`` or later: the
    store gives also those that started before and were still running."""
    if spans and spans[-1].start_ns < low_ns:
        return [s for s in spans if s.start_ns >= low_ns]
    return spans


def _evaluated_page(query: Query, page: Sequence[SpanRecord]) -> List[SpanRecord]:
    """The spans of a page a query that needs no whole trace matches.  Such a query judges
    each span alone, so the page goes in at once (the engine compiles the query once per
    call); per trace only if two of its spans share an id, which the engine would merge."""
    if len({s.span_id for s in page}) == len(page):
        return _evaluated(query, page)
    return [s for spans in _by_trace(page).values() for s in _evaluated(query, spans)]


def _slices(
    store: Store,
    tenant: str,
    conditions: Sequence[Condition],
    low_ns: int,
    high_ns: int,
    max_spans: int,
    state: Candidates,
) -> Iterator[List[SpanRecord]]:
    """The spans meeting ``conditions`` that started in [low_ns, high_ns], newest first, a
    page of at most ``PAGE_SPANS`` at a time, at most ``max_spans`` in all.

    Each page is read over a time slice below the previous one rather than over all the rest
    of the range: a store query costs about the spans in its range (DuckDB deduplicates them
    before it sorts), so the slices keep the whole read at one pass.  A slice's width is
    guessed from the spans per second seen so far, to hold about 80 % of a page."""
    cursor = high_ns + 1  # exclusive: span_records takes the spans that start before its end
    width = max((high_ns - low_ns) // 8, 1)
    while cursor > low_ns:
        # Between pages (the first is always read): the time a query takes is bounded.
        if cursor <= high_ns and state.out_of_time(cursor):
            return
        budget = max_spans - state.read
        if budget <= 0:
            # Spans started before the range (still running in it) sort last: the first row
            # says whether any span of the range is left.
            left = store.span_records(tenant, low_ns, cursor, conditions, limit=1)
            if left and left[0].start_ns >= low_ns:
                state.partial = _span_bound_message(max_spans, cursor)
            return
        size = min(PAGE_SPANS, budget)
        lo = max(low_ns, cursor - width)
        # One more than the page: whether the slice holds more.
        rows = store.span_records(tenant, lo, cursor, conditions, limit=size + 1)
        whole = len(rows) <= size or rows[size].start_ns < lo
        page = _from(rows[:size], lo)
        if whole:
            seen, next_cursor = cursor - lo, lo
        elif size == budget or page[-1].start_ns == page[0].start_ns:
            # The last page the bound allows (or one start fills a page): count it, stop.
            state.read += len(page)
            state.partial = _span_bound_message(max_spans, page[-1].start_ns)
            yield page
            return
        else:
            # The oldest start may continue past the page: leave those spans to the next.
            oldest = page[-1].start_ns
            page = [s for s in page if s.start_ns > oldest]
            seen, next_cursor = cursor - oldest - 1, oldest + 1
        state.read += len(page)
        if page:
            yield page
        cursor = next_cursor
        # Spans per ns so far -> the next slice's width (grown at most 8-fold at a time).
        width = min(max(seen * (PAGE_SPANS * 8 // 10) // max(len(page), 1), 1), width * 8)


def matched_spans(
    store: Store,
    tenant: str,
    query: Query,
    low_ns: int,
    high_ns: int,
    max_spans: int,
    whole_traces: bool,
    state: Candidates,
) -> Iterator[Page]:
    """Pages of the spans the query matches that started in [low_ns, high_ns], the newest
    first, each with its whole trace when ``whole_traces`` (or the query) needs it.  Reads at
    most ``max_spans`` spans; ``state`` says how many and whether it stopped early."""
    # The store's conditions and x != nil tests (cheaper as lookups) can be the whole filter.
    tests = presence_tests(query)
    present = [value_getter(k) for k in tests or ()]
    whole_traces = whole_traces or query.needs_traces
    done_traces: set = set()
    for page in _slices(store, tenant, query.pushdown, low_ns, high_ns, max_spans, state):
        state.traces.update(s.trace_id for s in page)
        if whole_traces:
            new = [t for t in dict.fromkeys(s.trace_id for s in page) if t not in done_traces]
            done_traces.update(new)
            yield from _whole_traces(store, tenant, query, new, low_ns, high_ns, max_spans, state)
            # A bound hit there ends the read (counting spans later than the cut is wrong).
            if state.partial:
                return
        elif tests is not None:
            if present:
                page = [s for s in page if all(get(s, None) is not None for get in present)]
            yield page, None
        else:
            yield _evaluated_page(query, page), None


def _whole_traces(
    store: Store,
    tenant: str,
    query: Query,
    trace_ids: List[str],
    low_ns: int,
    high_ns: int,
    max_spans: int,
    state: Candidates,
) -> Iterator[Page]:
    """Matched spans of whole traces (structural operators, pipelines and trace-wide
    intrinsics need every span of a trace), read around the range: a parent may have started
    up to an hour earlier."""
    for i in range(0, len(trace_ids), TRACES_PER_FETCH):
        if i and state.out_of_time(None):
            return
        budget = max_spans - state.read
        if budget <= 0:
            state.partial = _span_bound_message(max_spans, None)
            return
        spans = store.span_records(
            tenant,
            low_ns - PARENT_LOOKBACK_NS,
            high_ns + PARENT_LOOKBACK_NS,
            (),
            trace_ids=trace_ids[i : i + TRACES_PER_FETCH],
            limit=budget,
        )
        state.read += len(spans)
        if len(spans) >= budget:
            state.partial = _span_bound_message(max_spans, None)
        page: List[SpanRecord] = []
        traces: List[Trace] = []
        for trace in _by_trace(spans).values():
            for s in _evaluated(query, trace):
                if low_ns <= s.start_ns <= high_ns:
                    page.append(s)
                    traces.append(trace)
        yield page, traces


def _span_bound_message(limit: int, oldest_ns: Optional[int]) -> str:
    counted = "the newest spans"
    if oldest_ns is not None:
        when = datetime.fromtimestamp(oldest_ns / SEC, timezone.utc).isoformat()
        counted = f"the spans that started from {when} on"
    return (
        f"the query reads at most {limit} spans and the range has more: the answer counts "
        f"{counted} (narrow the range or the query)"
    )


def _deadline_message(oldest_ns: Optional[int]) -> str:
    counted = "the newest spans"
    if oldest_ns is not None:
        when = datetime.fromtimestamp(oldest_ns / SEC, timezone.utc).isoformat()
        counted = f"the spans that started from {when} on"
    return (
        f"the query took longer than {DEADLINE_S:g} s: the answer counts {counted} "
        "(narrow the range or the query)"
    )


def cell_bound_message(limit: int) -> str:
    return (
        f"the answer holds at most {limit} values (series x intervals) and this query needs "
        "more: series past the bound are left out (use a larger step, fewer by() labels or "
        "a narrower query)"
    )


def series_bound_message(limit: int) -> str:
    return (
        f"Response exceeds maximum series limit of {limit}, a partial response is returned. "
        "Warning: the accuracy of each individual value is not guaranteed."
    )
