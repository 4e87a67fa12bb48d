"""TraceQL's ``compare()``: how the attribute values of a selection of spans differ from the
rest (Traces Drilldown's comparison tab and its "highest difference" panels).

``{ <filter> } | compare({ <selection> }, topN, start, end)`` splits the spans the filter
matches in two: the *selection* (spans the selection's expression is true for and, when
``start``/``end`` are given, that started in ``(start, end]``) and the *baseline* (the other
ones).  As Tempo (``pkg/traceql/engine_metrics_compare.go``), for each side and each attribute a
span has, it counts the spans per interval of the (aligned) range:

- ``{__meta_type="baseline", <attribute>=<value>}`` (and ``"selection"``): spans with that
  value, for the ``topN`` values with the most spans over the range, per side and attribute;
- ``{__meta_type="baseline_total", <attribute>="nil"}`` (and ``"selection_total"``): spans with
  any value of the attribute.

A span's attributes are its span and resource attributes (``span.x``, ``resource.x``, values
read as numbers when their text is one, as ``by()`` reads them), its ``name``, ``status`` and
``kind``, and its trace's ``rootName`` and ``rootServiceName`` when the root span is stored.
Durations and ids are not counted (Tempo leaves them out: every value differs). Tempo also
counts ``statusMessage``, event, link and instrumentation-scope attributes, which hotspan's span
records do not hold, and ``span:childCount``, which would need every span of every trace read.
Tempo's ``__meta_error="__too_many_values__"`` series carry no samples, so its answer never
shows them; neither does this one. No exemplars.

The store counts them in one statement when it can (:mod:`hotspan.store.compare_sql`): when
the query's filter and the selection are both ``{...}`` of conditions the store filters spans
on, joined by ``&&``.  Then every matching span is counted, with no bound on the spans read;
the other bounds hold, met reading the newest spans first as the engine does (the statement
gives each value's newest span).  The rest is read span by span.

Bounds: reading stops as for the other metrics functions (spans read, wall time: see
:mod:`hotspan.query.traceql.candidates`).  Of memory and answer size: at most
``MAX_COMPARE_ATTRIBUTES`` attributes are counted (about Tempo's, which stops reading at
``maxSeries`` / 4 of them); per side and attribute, the first ``max(MAX_COMPARE_VALUES, topN)``
values seen (newest spans first; later values are in the totals only: ids and urls have a
value per span, and Tempo marks such an attribute ``__too_many_values__`` anyway); at most
``MAX_COMPARE_CELLS`` (side, interval, attribute, value) counts; and at most ``maxSeries``
series in the answer, whole attributes first, those with the most spans first.  Hitting a
bound other than the values' makes the answer partial, with a message.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from hotspan.model.trace import (
    RS,
    SPAN_KINDS,
    STATUS_CODES,
    STRING_US,
    US,
    SearchError,
    SpanRecord,
)
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.candidates import (
    Candidates,
    cell_bound_message,
    matched_spans,
    presence_tests,
    series_bound_message,
)
from hotspan.query.traceql.conditions import condition_of
from hotspan.query.traceql.fields import (
    ROOT_CONDITION,
    conjuncts,
    field_needs_trace,
    in_selection,
    plain,
    reads_raw,
)
from hotspan.query.traceql.metrics_pushdown import statement_range
from hotspan.query.traceql.parser import MetricsStage
from hotspan.query.traceql.plan import Query
from hotspan.query.traceql.series import (
    MS,
    LabelValue,
    MetricsRequest,
    MetricsResult,
    Series,
    Trace,
    aligned_range,
)
from hotspan.store.base import PARENT_LOOKBACK_NS, Store
from hotspan.store.compare_sql import CODE, TOTALS, TYPED, ComparePlan, CompareRow

META_TYPE = "__meta_type"
BASELINE, SELECTION = "baseline", "selection"
MAX_TOP_N = 1000  # Tempo's maxCompareTopN
NIL = "nil"  # how Tempo writes the nil value of a *_total series' attribute
_MEMO_LIMIT = 100_000
# Bounds (see the module's doc): attributes counted, values per side and attribute (at least
# topN), counts kept (a count and its keys cost about 300 bytes: 150 MB).
MAX_COMPARE_ATTRIBUTES = 250
MAX_COMPARE_VALUES = 1_000
MAX_COMPARE_CELLS = 500_000

# (side, interval, attribute, value) -> spans
Counts = Dict[Tuple[str, int, str, LabelValue], int]


def validate(stage: MetricsStage) -> None:
    """Refuse what Tempo refuses (QueryError with its reason)."""
    if stage.compare_filter is None:
        raise QueryError("compare() needs a filter, such as compare({status = error})")
    if not 1 <= stage.top_n <= MAX_TOP_N:
        raise QueryError(
            f"compare() top number of values must be an integer between 1 and {MAX_TOP_N}"
        )


class _Attributes:
    """The (attribute, value) pairs of a flattened attribute text, read once per text (a
    resource's), each key and value text converted once (values repeat across spans)."""

    def __init__(self, prefix: str, memo: bool) -> None:
        self.prefix = prefix
        self.remember = memo  # span attribute texts rarely repeat (ids, urls): no memo
        self.memo: Dict[str, Tuple[Tuple[str, LabelValue], ...]] = {}
        self.keys: Dict[str, str] = {}
        self.values: Dict[str, LabelValue] = {}

    def __call__(self, flat: str) -> Tuple[Tuple[str, LabelValue], ...]:
        pairs = self.memo.get(flat)
        if pairs is not None:
            return pairs
        if len(self.memo) > _MEMO_LIMIT:
            self.memo.clear()
        if len(self.values) > _MEMO_LIMIT:
            self.values.clear()
        keys, values = self.keys, self.values
        out = []
        for record in flat.split(RS):
            if record:
                key, sep, text = record.partition(US)
                if not sep:  # a string that reads as a number or a boolean stays a string
                    key, _, text = record.partition(STRING_US)
                    text_key = STRING_US + text
                else:
                    text_key = text
                name = keys.get(key)
                if name is None:
                    name = keys[key] = self.prefix + key
                value = values.get(text_key)
                if value is None:
                    value = values[text_key] = _value(text) if sep else text
                out.append((name, value))
        pairs = tuple(out)
        if self.remember:
            self.memo[flat] = pairs
        return pairs


def _value(text: str) -> LabelValue:
    value = plain(ast.Text(text))
    return value if isinstance(value, (str, int, float, bool)) else text


def _intrinsics(name: str, status: int, kind: int) -> Tuple[Tuple[str, LabelValue], ...]:
    out: List[Tuple[str, LabelValue]] = [("name", name)]
    if 0 <= status < len(STATUS_CODES):
        out.append(("status", STATUS_CODES[status]))
    if 0 <= kind < len(SPAN_KINDS):
        out.append(("kind", SPAN_KINDS[kind]))
    return tuple(out)


class _Compare:
    """Counts of a compare() query, page by page."""

    def __init__(
        self, stage: MetricsStage, req: MetricsRequest, max_cells: Optional[int] = None
    ) -> None:
        self.stage = stage
        self.req = req
        self.max_cells = max_cells
        self.answer_cells_limited = False
        self.start, self.end, self.intervals = aligned_range(req)
        self.step = self.end - self.start if req.instant else req.step_ns
        self.counts: Counts = {}
        # Spans with each attribute, per side and interval (values past the bound included).
        self.totals: Dict[Tuple[str, str], List[int]] = {}
        self.attributes: Dict[str, None] = {}  # those counted
        self.tracked: set = set()  # (side, attribute, value) counted
        self.values: Counter = Counter()  # (side, attribute) -> values counted
        self.value_limit = max(MAX_COMPARE_VALUES, stage.top_n)
        self.attributes_limited = False
        self.cells_limited = False
        self.series_limited = False
        self.span_attributes = _Attributes("span.", memo=False)
        self.resource_attributes = _Attributes("resource.", memo=True)
        self.roots: Dict[str, Tuple[str, str]] = {}  # trace id -> (root name, root service)
        self.whole = field_needs_trace(stage.compare_filter)  # type: ignore[arg-type]

    def observe(self, spans: List[SpanRecord], traces: Optional[List[Trace]]) -> None:
        if not spans:
            return
        stage = self.stage
        if traces is not None:
            sides = [
                SELECTION if in_selection(stage, s, t) else BASELINE for s, t in zip(spans, traces)
            ]
        else:
            sides = [SELECTION if in_selection(stage, s) else BASELINE for s in spans]
        starts = np.fromiter((s.start_ns for s in spans), np.int64, len(spans))
        if self.req.instant:
            slots = [0] * len(spans)
        else:
            slots = ((starts - self.start - 1) // self.step).tolist()
        counts: Counter[Tuple[str, int, str, LabelValue]] = Counter()
        # Spans of a side and interval share their resources, names and attribute texts:
        # count those first, then spread each over its attributes once.
        ones: List[Tuple[str, int, str, LabelValue]] = []
        span_attributes = self.span_attributes
        for (side, slot, flat), n in Counter(zip(sides, slots, (s.attrs for s in spans))).items():
            if n == 1:
                ones.extend([(side, slot, a, v) for a, v in span_attributes(flat)])
            else:
                for attribute, value in span_attributes(flat):
                    counts[(side, slot, attribute, value)] += n
        counts.update(ones)
        for (side, slot, flat, service), n in Counter(
            zip(sides, slots, (s.resource_attrs for s in spans), (s.service for s in spans))
        ).items():
            pairs = self.resource_attributes(flat)
            for attribute, value in pairs:
                counts[(side, slot, attribute, value)] += n
            if service and not any(a == "resource.service.name" for a, _ in pairs):
                counts[(side, slot, "resource.service.name", service)] += n
        for (side, slot, name, status, kind), n in Counter(
            zip(sides, slots, *zip(*((s.name, s.status_code, s.kind) for s in spans)))
        ).items():
            for attribute, value in _intrinsics(name, status, kind):
                counts[(side, slot, attribute, value)] += n
        for (side, slot, trace_id), n in Counter(
            zip(sides, slots, (s.trace_id for s in spans))
        ).items():
            root = self.roots.get(trace_id)
            if root is not None:
                counts[(side, slot, "rootName", root[0])] += n
                if root[1]:
                    counts[(side, slot, "rootServiceName", root[1])] += n
        self._merge(counts)

    def _merge(self, page: Counts) -> None:
        """A page's counts into the query's, within the bounds."""
        counts, totals, tracked, values = self.counts, self.totals, self.tracked, self.values
        intervals = self.intervals
        for key, n in page.items():
            side, slot, attribute, value = key
            if not 0 <= slot < intervals:
                continue
            total = totals.get((side, attribute))
            if total is None:
                if attribute not in self.attributes:
                    if len(self.attributes) >= MAX_COMPARE_ATTRIBUTES:
                        self.attributes_limited = True
                        continue
                    self.attributes[attribute] = None
                total = totals[(side, attribute)] = [0] * intervals
            total[slot] += n
            old = counts.get(key)
            if old is not None:
                counts[key] = old + n
                continue
            if len(counts) >= MAX_COMPARE_CELLS:
                self.cells_limited = True
                continue
            if (side, attribute, value) not in tracked:
                if values[(side, attribute)] >= self.value_limit:
                    continue  # one value too many: in the totals only
                tracked.add((side, attribute, value))
                values[(side, attribute)] += 1
            counts[key] = n

    def absorb(self, rows: Sequence[CompareRow]) -> None:
        """The store's rows (:mod:`hotspan.store.compare_sql`) into the query's counts: the
        totals of the attributes met first reading newest first, then the values, newest
        first, within the bounds."""
        sides = (BASELINE, SELECTION)
        intervals = self.intervals
        totals: List[Tuple[str, int, str, int, int]] = []  # side, slot, attribute, n, newest
        values: List[Tuple[int, str, int, str, str, object, int]] = []
        for kind, side, slot, attribute, text, typed, n, newest_start, value_newest in rows:
            cell = (sides[int(side)], int(slot), str(attribute))  # type: ignore[call-overload]
            if kind == TOTALS:
                totals.append((*cell, int(n), int(newest_start)))  # type: ignore[call-overload]
            else:
                values.append((int(value_newest), *cell, str(text), typed, int(n)))  # type: ignore[call-overload]
        latest: Dict[str, int] = {}
        for _, _, attribute, _, at in totals:
            latest[attribute] = max(latest.get(attribute, at), at)
        kept = sorted(latest, key=lambda a: -latest[a])[:MAX_COMPARE_ATTRIBUTES]
        self.attributes_limited = len(latest) > len(kept)
        self.attributes = dict.fromkeys(kept)
        for side_name, slot, attribute, n, _ in totals:
            if attribute in self.attributes and 0 <= slot < intervals:
                total = self.totals.get((side_name, attribute))
                if total is None:
                    total = self.totals[(side_name, attribute)] = [0] * intervals
                total[slot] += n
        values.sort(key=lambda v: -v[0])
        if len(values) > MAX_COMPARE_CELLS:
            self.cells_limited = True
            del values[MAX_COMPARE_CELLS:]
        counts, tracked, per_attribute = self.counts, self.tracked, self.values
        converted: Dict[Tuple[str, str, object], Optional[LabelValue]] = {}
        for _, side_name, slot, attribute, text, typed, n in values:
            if attribute not in self.attributes or not 0 <= slot < intervals:
                continue
            stored = (attribute, text, typed)
            if stored not in converted:
                converted[stored] = _stored_value(attribute, text, typed)
            value = converted[stored]
            if value is None:
                continue
            key = (side_name, slot, attribute, value)
            old = counts.get(key)
            if old is not None:
                counts[key] = old + n
                continue
            if (side_name, attribute, value) not in tracked:
                if per_attribute[(side_name, attribute)] >= self.value_limit:
                    continue
                tracked.add((side_name, attribute, value))
                per_attribute[(side_name, attribute)] += 1
            counts[key] = n

    def learn_roots(
        self, store: Store, tenant: str, spans: Sequence[SpanRecord], low: int, high: int
    ) -> None:
        """The root spans of the page's traces (a root span is its own), read from the store
        for the traces whose root is not on the page."""
        if len(self.roots) > _MEMO_LIMIT:
            self.roots.clear()
        for s in spans:
            if s.parent_span_id == 0:
                self.roots.setdefault(s.trace_id, (s.name, s.service))
        missing = list(dict.fromkeys(s.trace_id for s in spans if s.trace_id not in self.roots))
        if not missing:
            return
        try:
            roots = store.span_records(
                tenant,
                low - PARENT_LOOKBACK_NS,
                high + PARENT_LOOKBACK_NS,
                (ROOT_CONDITION,),
                trace_ids=missing,
                limit=len(missing) * 2,
            )
        except SearchError:  # a store without the root test: no root attributes
            return
        for r in roots:
            self.roots.setdefault(r.trace_id, (r.name, r.service))

    def series(self) -> List[Series]:
        """The topN values per side and attribute, and each side's totals per attribute: at
        most ``maxSeries``, whole attributes first, the attributes with most spans first."""
        intervals = self.intervals
        sums: Dict[Tuple[str, str], Dict[LabelValue, int]] = {}
        for (side, _, attribute, value), n in self.counts.items():
            per_value = sums.setdefault((side, attribute), {})
            per_value[value] = per_value.get(value, 0) + n
        spans: Counter = Counter()
        for (_, attribute), total in self.totals.items():
            spans[attribute] += sum(total)
        budget = self.req.max_series
        if self.max_cells is not None:
            # Each series has a value per interval, and the answer writes every one.
            by_cells = max(1, self.max_cells // max(intervals, 1))
            if by_cells < budget:
                budget = by_cells
                self.answer_cells_limited = True
        shown: List[Tuple[str, str]] = []  # (side, attribute) totals shown
        kept = set()
        for attribute in sorted(spans, key=lambda a: (-spans[a], a)):
            sides = [side for side in (SELECTION, BASELINE) if (side, attribute) in self.totals]
            tops = [list(_top(sums.get((side, attribute), {}), self.stage.top_n)) for side in sides]
            # Totals, then the values of both sides by rank (the most frequent first).
            wanted: List[Tuple[str, str, Optional[LabelValue]]] = [
                (side, attribute, None) for side in sides
            ] + [
                (side, attribute, top[rank])
                for rank in range(max(map(len, tops), default=0))
                for side, top in zip(sides, tops)
                if rank < len(top)
            ]
            if len(wanted) > budget:
                self.series_limited = True
                # Part of an attribute: its totals and some of its values, or nothing.
                wanted = wanted[:budget] if budget > len(sides) else []
            budget -= len(wanted)
            for side, _, wanted_value in wanted:
                if wanted_value is None:
                    shown.append((side, attribute))
                else:
                    kept.add((side, attribute, wanted_value))
        rows: Dict[Tuple[str, str, LabelValue], np.ndarray] = {}
        for (side, slot, attribute, value), n in self.counts.items():
            if (side, attribute, value) in kept:
                row = rows.get((side, attribute, value))
                if row is None:
                    row = rows[(side, attribute, value)] = np.zeros(intervals)
                row[slot] += n
        out = [
            Series(((META_TYPE, side), (attribute, value)), row)
            for (side, attribute, value), row in rows.items()
        ]
        out.extend(
            Series(
                ((META_TYPE, side + "_total"), (attribute, NIL)),
                np.array(self.totals[(side, attribute)], dtype=float),
            )
            for side, attribute in shown
        )
        return out

    def partial(self) -> List[str]:
        """Messages of the bounds the answer hit (call after ``series()``)."""
        out = []
        if self.series_limited:
            if self.answer_cells_limited:
                assert self.max_cells is not None
                out.append(cell_bound_message(self.max_cells))
            else:
                out.append(series_bound_message(self.req.max_series))
        if self.attributes_limited:
            out.append(
                f"compare() counts at most {MAX_COMPARE_ATTRIBUTES} attributes: the spans' "
                "other attributes are left out"
            )
        if self.cells_limited:
            out.append(
                f"compare() keeps at most {MAX_COMPARE_CELLS} counts (attribute values by "
                "interval): values met after that are in the totals only (use a larger step "
                "or a narrower query)"
            )
        return out


def _stored_value(attribute: str, text: str, typed: object) -> Optional[LabelValue]:
    """A value as the store wrote it (text, typed) as the engine reads it from a span."""
    if typed == CODE:
        names = STATUS_CODES if attribute == "status" else SPAN_KINDS
        code = int(text)
        return names[code] if 0 <= code < len(names) else None
    return _value(text) if typed == TYPED else text


def compare_plan(query: Query, req: MetricsRequest, max_rows: int) -> Optional[ComparePlan]:
    """The plan of a compare() query the store can count, or None (the engine reads the
    spans): the filter is the store's conditions exactly, and so is the selection."""
    stage = query.metrics
    if stage is None or stage.compare_filter is None:
        return None
    if query.needs_raw or any(c.key.startswith("raw:") for c in query.pushdown):
        return None
    if presence_tests(query) != []:
        return None  # the engine must run, or a span must show an attribute: read
    expr = stage.compare_filter
    if field_needs_trace(expr) or any(reads_raw(n) for n in ast.walk(expr)):
        return None
    selection = []
    for part in conjuncts(expr):
        if isinstance(part, ast.Static) and part.value is True:
            continue
        cond = condition_of(part)
        if cond is None or cond.key.startswith("raw:"):
            return None
        selection.append(cond)
    low, high, origin, step = statement_range(req)
    window = stage.compare_start_ns is not None and stage.compare_end_ns is not None
    return ComparePlan(
        tuple(query.pushdown),
        tuple(selection),
        stage.compare_start_ns if window else None,
        stage.compare_end_ns if window else None,
        low,
        high,
        origin,
        step,
        max(MAX_COMPARE_VALUES, stage.top_n),
        max_rows,
        PARENT_LOOKBACK_NS,
    )


def _top(per_value: Dict[LabelValue, int], n: int) -> Iterable[LabelValue]:
    """The n values with the most spans (ties: in the order of their text, to be stable)."""
    if len(per_value) <= n:
        return per_value.keys()
    return heapq.nsmallest(n, per_value, key=lambda v: (-per_value[v], str(v)))


def run_compare(
    store: Store,
    tenant: str,
    query: Query,
    req: MetricsRequest,
    max_spans: int,
    in_store: bool = True,
    max_cells: Optional[int] = None,
) -> MetricsResult:
    """The series of a ``compare()`` query over the stored spans, counted by the store when
    it can (``in_store`` False: read span by span, to compare the two); at most
    ``max_cells`` (series x intervals) in the answer."""
    stage = query.metrics
    assert stage is not None
    validate(stage)
    builder = _Compare(stage, req, max_cells)
    if req.instant:
        low, high = builder.start, builder.end
    else:
        low, high = builder.start + 1, builder.end
    state = Candidates()
    plan = compare_plan(query, req, MAX_COMPARE_CELLS + 1) if in_store else None
    got = store.compare_rows(tenant, plan) if plan is not None else None
    trace_count: Optional[int] = None
    if got is not None:
        rows, state.read, trace_count = got
        builder.absorb(rows)
    else:
        pages = matched_spans(store, tenant, query, low, high, max_spans, builder.whole, state)
        for spans, traces in pages:
            builder.learn_roots(store, tenant, spans, low, high)
            builder.observe(spans, traces)
    timestamps = (
        np.array([builder.end // MS], dtype=np.int64)
        if req.instant
        else (builder.start + builder.step * np.arange(1, builder.intervals + 1)) // MS
    )
    series = builder.series()
    messages = ([state.partial] if state.partial else []) + builder.partial()
    partial = "; ".join(messages) or None
    if trace_count is None:
        trace_count = len(state.traces)
    return MetricsResult(timestamps, series, state.read, trace_count, partial)
