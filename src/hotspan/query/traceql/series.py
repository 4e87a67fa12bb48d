"""The time series of TraceQL's metrics functions: the math of the answer.

The semantics are Tempo's (``pkg/traceql/engine_metrics.go``), so that Grafana's panels and
Traces Drilldown draw the same picture from hotspan as from Tempo:

- a span counts in the step its *start* falls in; a range query is aligned to the step (start
  rounded down, then one step earlier; end rounded up) and its intervals are right-closed,
  ``(start + i*step, start + (i+1)*step]``, each stamped with its end;
- ``rate()`` is the count divided by the step in seconds; counts (``rate``,
  ``count_over_time``, ``histogram_over_time``) have a sample, maybe 0, in every interval of a
  series, while ``min/max/sum/avg_over_time`` have none where no span had a value;
- ``histogram_over_time(duration)`` keys each span by ``__bucket``: its duration rounded up to
  a power of two nanoseconds, in seconds; ``quantile_over_time`` interpolates the quantile
  exponentially inside those buckets, one series per quantile labelled ``p`` (0 where an
  interval has no span);
- ``by(a, b)`` labels each series with the non-nil values; all nil gives ``a="nil"``; without
  ``by`` a series is labelled ``__name__=<function>``.

Rows stop at ``max_series`` series, and at the cells (rows x intervals) the caller allows.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from hotspan.model.trace import SPAN_KINDS, STATUS_CODES, SpanRecord
from hotspan.query.engine import QueryError
from hotspan.query.traceql import ast
from hotspan.query.traceql.fields import TRACE_WIDE, span_value
from hotspan.query.traceql.names import INTRINSICS
from hotspan.query.traceql.parser import MetricsStage

SEC = 1_000_000_000
MS = 1_000_000
# Bounds of an answer: series, Tempo's defaults for intervals per query and exemplars per
# query.
MAX_SERIES = 1_000
MAX_INTERVALS = 10_000
MAX_EXEMPLARS = 100
MAX_GROUP_BYS = 5
EXEMPLARS_PER_BUCKET = 2

NAME_LABEL = "__name__"
BUCKET_LABEL = "__bucket"
QUANTILE_LABEL = "p"
FUNCTIONS = (
    "rate",
    "count_over_time",
    "min_over_time",
    "max_over_time",
    "avg_over_time",
    "sum_over_time",
    "quantile_over_time",
    "histogram_over_time",
)
VALUE_FUNCTIONS = ("min_over_time", "max_over_time", "avg_over_time", "sum_over_time")
HISTOGRAM_FUNCTIONS = ("histogram_over_time", "quantile_over_time")
# The names of the span's own duration (read from its start and end), and of every duration
# (labels show those as durations), from TraceQL's table of intrinsics.
_SPAN_DURATION_KEYS = tuple(k for k, v in INTRINSICS.items() if v == "duration")
_DURATION_LABEL_KEYS = tuple(k for k, v in INTRINSICS.items() if v in ("duration", "traceDuration"))

# Of the trace-wide intrinsics (fields.TRACE_WIDE), the ones that differ span to span
# (the others are one value per trace).
_PER_SPAN_OF_TRACE = ("childCount", "nestedSetParent", "nestedSetLeft", "nestedSetRight")

LabelValue = Union[str, int, float, bool]  # an ast.Duration shows as Go prints durations
Labels = Tuple[Tuple[str, LabelValue], ...]
Trace = Optional[Sequence[SpanRecord]]  # every span of a span's trace, when read
# A page of matched spans, with each one's trace when read (else None: not needed).
Page = Tuple[List[SpanRecord], Optional[List[Trace]]]
Getter = Callable[[SpanRecord, Trace], object]
_START_NS = operator.itemgetter(SpanRecord._fields.index("start_ns"))
_END_NS = operator.itemgetter(SpanRecord._fields.index("end_ns"))


@dataclass(frozen=True)
class MetricsRequest:
    """A query's range in nanoseconds, as asked (alignment is done here)."""

    start_ns: int
    end_ns: int
    step_ns: int
    instant: bool = False
    exemplars: int = 0
    max_series: int = MAX_SERIES


@dataclass
class Exemplar:
    labels: Labels
    value: float  # NaN: the sample of its interval, filled in at the end (as Tempo)
    timestamp_ms: int


@dataclass
class Series:
    labels: Labels
    values: np.ndarray  # one per interval; NaN: no sample
    exemplars: List[Exemplar] = field(default_factory=list)


@dataclass
class MetricsResult:
    timestamps_ms: np.ndarray  # the end of each interval
    series: List[Series]
    inspected_spans: int = 0
    inspected_traces: int = 0
    partial: Optional[str] = None  # why the answer is incomplete


def default_step(start_ns: int, end_ns: int) -> int:
    """Tempo's step when none is given: about 240 points, rounded down to a round step."""
    delta = end_ns - start_ns
    baseline = delta // 240
    if delta < 60 * SEC:
        grain = 50 * MS
        return baseline // grain * grain if baseline > grain else grain
    for grain in (3600 * SEC, 300 * SEC, 60 * SEC, 15 * SEC, 5 * SEC, SEC):
        if baseline > grain:
            return baseline // grain * grain
    return SEC


def aligned_range(req: MetricsRequest) -> Tuple[int, int, int]:
    """(start, end, intervals) as evaluated: a range query is widened to whole steps, with one
    more step before (Tempo's AlignRequest); an instant query is one interval, as asked."""
    if req.instant:
        return req.start_ns, req.end_ns, 1
    step = req.step_ns
    start = req.start_ns - req.start_ns % step
    end = req.end_ns + (-req.end_ns) % step
    if start > step:
        start -= step
    return start, end, (end - start) // step


def log2_bucket(value: int) -> int:
    """``value`` rounded up to a power of two (Tempo's Log2Bucketize); values below 2 have none."""
    return 1 << (value - 1).bit_length()


def log2_quantile(p: float, maxes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Tempo's Log2Quantile for every column of ``counts`` (buckets x intervals, buckets
    ascending by ``maxes``): the bucket where the p-th sample falls, interpolated
    exponentially from the previous non-empty bucket (or half the bucket); 0 where empty."""
    nbuckets, width = counts.shape
    out = np.zeros(width)
    if nbuckets == 0 or width == 0:
        return out
    total = counts.sum(axis=0)
    has = total > 0
    # Rounded up, at least one: percentiles of few samples land on a sample.
    wanted = np.maximum(np.ceil(p * total), 1)
    cum = np.cumsum(counts, axis=0)
    reached = cum >= wanted
    found = reached.any(axis=0)
    bucket = np.where(found, reached.argmax(axis=0), nbuckets - 1)
    cols = np.arange(width)
    in_bucket = counts[bucket, cols]
    consumed = np.where(found, cum[bucket, cols] - in_bucket, cum[-1])
    exact = found & (cum[bucket, cols] == wanted)
    # The previous non-empty bucket of each interval: the lower end of the interpolation.
    rows = np.arange(nbuckets)[:, None]
    last_nonzero = np.maximum.accumulate(np.where(counts > 0, rows, -1), axis=0)
    prev = np.where(bucket > 0, last_nonzero[np.maximum(bucket - 1, 0), cols], -1)
    log_max = np.log2(maxes[bucket])
    log_min = np.where(prev >= 0, np.log2(maxes[np.maximum(prev, 0)]), log_max - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        interp = (wanted - consumed) / in_bucket
        value = np.where(exact, maxes[bucket], np.exp2(log_min + (log_max - log_min) * interp))
    out[has] = value[has]
    return out


class _ExemplarBuckets:
    """Tempo's exemplar spread: the range cut into ``limit / 2`` slices of at most two
    exemplars each, ``limit`` in all."""

    def __init__(self, limit: int, start_ms: int, end_ms: int) -> None:
        self.limit = limit
        self.slices = max(limit // EXEMPLARS_PER_BUCKET, 1)
        self.start_ms, self.end_ms = start_ms, end_ms
        self.width = max((end_ms - start_ms) // self.slices, 1)
        self.counts = [0] * self.slices
        self.total = 0

    def full(self) -> bool:
        return self.total >= self.limit

    def take(self, ts_ms: int) -> bool:
        if self.full() or not self.start_ms <= ts_ms <= self.end_ms:
            return False
        i = min((ts_ms - self.start_ms) // self.width, self.slices - 1)
        if self.counts[i] >= EXEMPLARS_PER_BUCKET:
            return False
        self.counts[i] += 1
        self.total += 1
        return True


def _numeric(value: object) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return None if math.isnan(number) else number


class _Aggregator:
    """Rows (a series, or a series and a bucket) by intervals: span counts, and for the
    value functions (``min/max/sum/avg_over_time``) the values.  At most ``max_rows`` rows
    (allocated as they come, doubling, never past it)."""

    def __init__(self, function: str, intervals: int, max_rows: int) -> None:
        self.function = function
        self.intervals = intervals
        self.max_rows = max_rows
        self.rows: Dict[tuple, int] = {}
        first = min(16, max_rows)
        self.counts = np.zeros((first, intervals))
        # min and max start from NaN (fmin/fmax then take the first value); sums from 0.
        self.fill = np.nan if function in ("min_over_time", "max_over_time") else 0.0
        self.values = (
            np.full((first, intervals), self.fill) if function in VALUE_FUNCTIONS else None
        )

    def full(self) -> bool:
        return len(self.rows) >= self.max_rows

    def row(self, key: tuple) -> int:
        """The row of a key, a new one if need be (the caller checks ``full()`` first)."""
        index = self.rows.get(key)
        if index is None:
            index = self.rows[key] = len(self.rows)
            if index >= len(self.counts):
                more = min(len(self.counts), self.max_rows - len(self.counts))
                self.counts = np.vstack([self.counts, np.zeros((more, self.intervals))])
                if self.values is not None:
                    extra = np.full((more, self.intervals), self.fill)
                    self.values = np.vstack([self.values, extra])
        return index

    def add(self, rows: np.ndarray, slots: np.ndarray, values: Optional[np.ndarray]) -> None:
        if len(rows) == 0:
            return
        at = (np.asarray(rows), np.asarray(slots))
        np.add.at(self.counts, at, 1)
        if self.values is None or values is None:
            return
        if self.function == "min_over_time":
            np.fmin.at(self.values, at, np.asarray(values))
        elif self.function == "max_over_time":
            np.fmax.at(self.values, at, np.asarray(values))
        else:
            np.add.at(self.values, at, np.asarray(values))

    def samples(self, index: int, step_s: float) -> np.ndarray:
        counts = self.counts[index]
        if self.function == "rate":
            return counts / step_s
        if self.values is None:
            return counts.copy()
        values = self.values[index]
        if self.function == "avg_over_time":
            values = values / np.where(counts > 0, counts, 1)
        return np.where(counts > 0, values, np.nan)


def _label_value(key: str, value: object) -> LabelValue:
    if key in _DURATION_LABEL_KEYS and isinstance(value, int) and not isinstance(value, bool):
        return ast.Duration(value)
    if isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def _by_labels(by: Sequence[str], values: tuple) -> List[Tuple[str, LabelValue]]:
    """The by() labels of a group: its non-nil values (Tempo drops nil ones)."""
    return [(k, _label_value(k, v)) for k, v in zip(by, values) if v is not None]


def _series_labels(stage: MetricsStage, row_key: tuple) -> Labels:
    """Tempo's labels of a series (quantiles add ``p`` to theirs elsewhere): without by the
    function's name, histograms add ``__bucket``, and labels all nil become ``<first>="nil"``."""
    if stage.function == "histogram_over_time":
        key, bucket = row_key
        return tuple(_by_labels(stage.by, key) + [(BUCKET_LABEL, bucket)])
    if not stage.by:
        return ((NAME_LABEL, stage.function),)
    return tuple(_by_labels(stage.by, row_key)) or ((stage.by[0], "nil"),)


def trace_wide(key: str) -> bool:
    """Whether an identifier's value needs the span's whole trace (``rootServiceName``)."""
    return INTRINSICS.get(key) in TRACE_WIDE


def value_getter(key: str) -> Getter:
    """A TraceQL identifier's value for a span, as ``span_value`` gives it, with its
    trace when the value needs it.  Faster where it can be, as it runs for every span: the
    span's own intrinsics are read directly, a resource attribute is looked up once per
    resource, a trace-wide value once per trace."""
    canonical = INTRINSICS.get(key)
    if canonical == "name":
        return lambda span, trace: span.name
    if canonical == "status":
        return lambda span, trace: (
            STATUS_CODES[span.status_code] if 0 <= span.status_code < len(STATUS_CODES) else None
        )
    if canonical == "kind":
        return lambda span, trace: (
            SPAN_KINDS[span.kind] if 0 <= span.kind < len(SPAN_KINDS) else None
        )
    if canonical in _PER_SPAN_OF_TRACE:
        return lambda span, trace: span_value(span, key, trace)
    if canonical in TRACE_WIDE:
        return _memoized(lambda span, trace: span_value(span, key, trace), "trace_id")
    if key.startswith("resource."):
        # A resource's attributes are one text shared by its spans (and service.name falls
        # back to the span's service): one lookup per resource.
        return _memoized(lambda span, trace: span_value(span, key), "resource")
    return lambda span, trace: span_value(span, key)


def _memoized(get: Getter, by: str) -> Getter:
    cache: Dict[object, object] = {}

    def memo(span: SpanRecord, trace: Trace) -> object:
        k = span.trace_id if by == "trace_id" else (span.resource_attrs, span.service)
        try:
            return cache[k]
        except KeyError:
            if len(cache) > 100_000:
                cache.clear()
            value = cache[k] = get(span, trace)
            return value

    return memo


def _value_of(stage: MetricsStage) -> Callable[[SpanRecord, Trace], Optional[float]]:
    """What ``min/max/sum/avg_over_time`` and the quantile exemplars read from a span:
    durations in seconds, other attributes as numbers (spans without one are skipped)."""
    attribute = stage.attribute or "duration"
    if attribute in _SPAN_DURATION_KEYS:
        return lambda s, trace: (s.end_ns - s.start_ns) / SEC
    get = value_getter(attribute)
    scale = SEC if attribute in _DURATION_LABEL_KEYS else 1
    return lambda s, trace: _scaled(_numeric(get(s, trace)), scale)


def _scaled(value: Optional[float], scale: int) -> Optional[float]:
    return None if value is None else value / scale


def _bucket_of(stage: MetricsStage) -> Callable[[SpanRecord, Trace], Optional[float]]:
    """The ``__bucket`` of a span (histograms and quantiles): durations rounded up to a power
    of two nanoseconds, in seconds; integers rounded up to a power of two; none below 2 or
    for other values (as Tempo, which skips those spans)."""
    attribute = stage.attribute or "duration"
    if attribute in _SPAN_DURATION_KEYS:

        def duration_bucket(s: SpanRecord, trace: Trace) -> Optional[float]:
            d = s.end_ns - s.start_ns
            return log2_bucket(d) / SEC if d >= 2 else None

        return duration_bucket
    get = value_getter(attribute)

    def attribute_bucket(s: SpanRecord, trace: Trace) -> Optional[float]:
        value = get(s, trace)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 2:
            return None
        if isinstance(value, float) and not value.is_integer():
            return None  # Tempo buckets integers and durations only
        bucket = log2_bucket(int(value))
        return bucket / SEC if attribute in _DURATION_LABEL_KEYS else float(bucket)

    return attribute_bucket


def validate_stage(stage: MetricsStage) -> None:
    """Refuse what Tempo refuses (QueryError with its reason)."""
    if stage.function not in FUNCTIONS:
        raise QueryError(f"unsupported metrics function {stage.function}()")
    # As Tempo: histograms keep one place of the key for the bucket, averages one for the
    # count they carry, so they take one by() label less.
    limit = MAX_GROUP_BYS - (stage.function in (*HISTOGRAM_FUNCTIONS, "avg_over_time"))
    if len(stage.by) > limit:
        raise QueryError(f"unsupported: metrics group by {len(stage.by)} values (at most {limit})")
    for q in stage.quantiles:
        if not 0 <= q <= 1:
            raise QueryError(f"quantile must be between 0 and 1: {q}")
    if stage.function == "quantile_over_time" and not stage.quantiles:
        raise QueryError("quantile_over_time needs at least one quantile")


class SeriesBuilder:
    """Spans of a metrics query into rows of an aggregator, with exemplars, bounded in
    series."""

    def __init__(self, stage: MetricsStage, req: MetricsRequest, max_cells: int) -> None:
        self.stage = stage
        self.req = req
        self.start, self.end, intervals = aligned_range(req)
        self.step = self.end - self.start if req.instant else req.step_ns
        # Tempo bounds series only; the cells bound memory too (by(span.id) histograms).
        self.agg = _Aggregator(stage.function, intervals, max(max_cells // intervals, 1))
        function = stage.function
        self.by = [value_getter(k) for k in stage.by]
        self.bucket_of = _bucket_of(stage) if function in HISTOGRAM_FUNCTIONS else None
        self.value_of = _value_of(stage) if function in VALUE_FUNCTIONS else None
        quantiles = function == "quantile_over_time"
        self.exemplar_value = _value_of(stage) if quantiles else self.value_of
        # A quantile series per group and quantile; a histogram series per group and bucket.
        self.group_limit = max(req.max_series // len(stage.quantiles), 1) if quantiles else None
        self.groups: Dict[tuple, None] = {}
        self.limited = False
        self.cells_limited = False
        self.buckets = (
            _ExemplarBuckets(req.exemplars, self.start // MS, self.end // MS)
            if req.exemplars and not req.instant
            else None
        )
        self.exemplars: Dict[int, List[Exemplar]] = {}
        self.exemplar_traces: set = set()
        self.row_of: Dict[tuple, int] = {}  # row key -> aggregator row (-1: over the bound)
        # Durations are read straight from the spans, for all of a page at once.
        self.duration_attribute = (stage.attribute or "duration") in _SPAN_DURATION_KEYS and (
            function in HISTOGRAM_FUNCTIONS or function in VALUE_FUNCTIONS
        )

    def observe(self, spans: List[SpanRecord], traces: Optional[List[Trace]]) -> None:
        """Count a page of matched spans.  Column at a time (a list comprehension per key,
        numpy for the rest): this runs for every span a query reads."""
        n = len(spans)
        if n == 0:
            return

        def column(get: Getter) -> list:
            if traces is None:
                return [get(s, None) for s in spans]
            return [get(s, t) for s, t in zip(spans, traces)]

        starts = np.fromiter(map(_START_NS, spans), np.int64, n)
        valid = np.ones(n, dtype=bool)
        durations_s: Optional[np.ndarray] = None
        if self.duration_attribute:
            durations = np.fromiter(map(_END_NS, spans), np.int64, n) - starts
            durations_s = durations / SEC
        buckets: Optional[list] = None
        if self.bucket_of is not None:
            if durations_s is not None:
                # Rounded up to a power of two ns: 2 ** bit_length(d - 1); none below 2.
                bits = np.frexp(np.maximum(durations - 1, 1).astype(np.float64))[1]
                valid &= durations >= 2
                buckets = (np.ldexp(1.0, bits) / SEC).tolist()
            else:
                buckets = column(self.bucket_of)
                valid &= np.fromiter((b is not None for b in buckets), bool, n)
        values: Optional[np.ndarray] = None
        if self.value_of is not None:
            if durations_s is not None:
                values = durations_s
            else:
                raw = column(self.value_of)
                valid &= np.fromiter((v is not None for v in raw), bool, n)
                values = np.array([0.0 if v is None else v for v in raw], dtype=np.float64)
        if not self.by:
            keys: list = [()] * n
        elif len(self.by) == 1:
            keys = [(v,) for v in column(self.by[0])]
        else:
            keys = list(zip(*(column(get) for get in self.by)))
        taken = np.flatnonzero(valid)
        if buckets is not None:
            row_keys = [(keys[i], buckets[i]) for i in taken.tolist()]
        else:
            row_keys = keys if len(taken) == n else [keys[i] for i in taken.tolist()]
        lookup = self.row_of
        for key in dict.fromkeys(row_keys):
            if key not in lookup:
                lookup[key] = self._new_row(key)
        rows = np.array([lookup[k] for k in row_keys], dtype=np.int64)
        kept = rows >= 0
        if not kept.all():
            taken, rows = taken[kept], rows[kept]
        if len(rows) == 0:
            return
        start_ns = starts[taken]
        if self.req.instant:
            slots = np.zeros(len(rows), dtype=np.int64)
        else:
            slots = (start_ns - self.start - 1) // self.step
        self.agg.add(rows, slots, values[taken] if values is not None else None)
        if self.buckets is not None and not self.buckets.full():
            self._exemplars(spans, traces, taken.tolist(), rows.tolist(), start_ns // MS)

    def row_of_key(self, key: tuple) -> int:
        """The aggregator's row of a row key (a new one if need be), -1 when over a bound."""
        row = self.row_of.get(key)
        if row is None:
            row = self.row_of[key] = self._new_row(key)
        return row

    def add_groups(
        self,
        rows: np.ndarray,
        slots: np.ndarray,
        counts: np.ndarray,
        mins: Optional[np.ndarray] = None,
        maxs: Optional[np.ndarray] = None,
        sums: Optional[np.ndarray] = None,
    ) -> None:
        """Groups of spans aggregated elsewhere (the store's metrics statement): each one's
        row, interval, span count, and for the value functions the min, max and sum of its
        values (rows of -1, over a bound, are left out)."""
        kept = rows >= 0
        at = (rows[kept], slots[kept])
        np.add.at(self.agg.counts, at, counts[kept])
        values = self.agg.values
        if values is None:
            return
        function = self.stage.function
        if function == "min_over_time" and mins is not None:
            np.fmin.at(values, at, mins[kept])
        elif function == "max_over_time" and maxs is not None:
            np.fmax.at(values, at, maxs[kept])
        elif sums is not None:
            np.add.at(values, at, sums[kept])

    def add_exemplar(
        self, row: int, trace_id: str, span_id: int, value: Optional[float], ts_ms: int
    ) -> None:
        """An exemplar of a row, chosen elsewhere; NaN value: its interval's sample."""
        labels: Labels = (("trace:id", trace_id), ("span:id", f"{span_id:016x}"))
        exemplar = Exemplar(labels, math.nan if value is None else value, ts_ms)
        self.exemplars.setdefault(row, []).append(exemplar)

    def _new_row(self, key: tuple) -> int:
        """The aggregator's row of a new row key, or -1 when its group is one too many
        (groups: by() values, and for histograms the bucket too)."""
        group = key[0] if self.bucket_of is not None and self.group_limit is not None else key
        if group not in self.groups and len(self.groups) >= (
            self.group_limit or self.req.max_series
        ):
            self.limited = True
            return -1
        if self.agg.full():
            self.cells_limited = True
            return -1
        self.groups[group] = None
        return self.agg.row(key)

    def _exemplars(
        self,
        spans: List[SpanRecord],
        traces: Optional[List[Trace]],
        taken: List[int],
        rows: List[int],
        ts_ms: np.ndarray,
    ) -> None:
        """Exemplars of a page, spread over time as Tempo spreads them, at most one per trace
        (as Tempo, which picks one span of a spanset).  Per time slice rather than per span:
        once the slices are full, a span costs nothing."""
        buckets = self.buckets
        assert buckets is not None
        slices = np.clip((ts_ms - buckets.start_ms) // buckets.width, 0, buckets.slices - 1)
        order = np.argsort(slices, kind="stable")
        cuts = np.flatnonzero(np.diff(slices[order])) + 1
        for group in np.split(order, cuts):
            if buckets.full():
                return
            if buckets.counts[int(slices[group[0]])] >= EXEMPLARS_PER_BUCKET:
                continue
            for i in group.tolist():
                span = spans[taken[i]]
                trace = traces[taken[i]] if traces is not None else None
                if span.trace_id in self.exemplar_traces:
                    continue
                if not buckets.take(int(ts_ms[i])):
                    break
                self.exemplar_traces.add(span.trace_id)
                value = self.exemplar_value(span, trace) if self.exemplar_value else None
                labels: Labels = (
                    ("trace:id", span.trace_id),
                    ("span:id", f"{span.span_id:016x}"),
                )
                exemplar = Exemplar(labels, math.nan if value is None else value, int(ts_ms[i]))
                self.exemplars.setdefault(rows[i], []).append(exemplar)

    def timestamps_ms(self) -> np.ndarray:
        if self.req.instant:
            return np.array([self.end // MS], dtype=np.int64)
        count = self.agg.intervals
        return (self.start + self.step * np.arange(1, count + 1, dtype=np.int64)) // MS

    def series(self) -> List[Series]:
        if self.stage.function == "quantile_over_time":
            out = _quantile_series(self.agg, self.stage, self.exemplars)
        else:
            out = [
                Series(
                    _series_labels(self.stage, key),
                    self.agg.samples(i, self.step / SEC),
                    self.exemplars.get(i, []),
                )
                for key, i in self.agg.rows.items()
            ]
        for s in out:
            _attach_exemplars(s, self.start, self.step, self.req.instant)
        return out


_FILTER_TESTS = {
    "=": np.equal,
    "!=": np.not_equal,
    "<": np.less,
    "<=": np.less_equal,
    ">": np.greater,
    ">=": np.greater_equal,
}


def filter_values(series: List[Series], op: str, value: float) -> List[Series]:
    """Tempo's metrics filter (``| rate() > 3``): a point for which ``point op value`` does
    not hold is dropped (NaN), and so is a series left without points, with the exemplars
    of the points dropped."""
    test = _FILTER_TESTS[op]
    out = []
    for s in series:
        values = np.asarray(s.values, dtype=float)
        with np.errstate(invalid="ignore"):
            kept = np.where(test(values, value), values, np.nan)
        if np.isnan(kept).all():
            continue
        exemplars = [e for e in s.exemplars if math.isnan(e.value) or bool(test(e.value, value))]
        out.append(Series(s.labels, kept, exemplars))
    return out


def top_k(series: List[Series], k: int, largest: bool) -> List[Series]:
    """Tempo's ``topk(k)``/``bottomk(k)``: at each timestamp the k series with the largest
    (smallest) values keep that sample, ties going as :func:`_tie_order` says; a series never
    among them is dropped."""
    if len(series) <= k:
        return [s for s in series if not np.isnan(np.asarray(s.values, dtype=float)).all()]
    values = np.vstack([s.values for s in series])
    kept = np.full_like(values, np.nan)
    order = np.arange(len(series))
    rank = _tie_order(series)
    for j in range(values.shape[1]):
        column = values[:, j]
        present = order[~np.isnan(column)]
        if len(present) == 0:
            continue
        if largest:
            ranked = present[np.lexsort((rank[present], -column[present]))]
        else:
            ranked = present[np.lexsort((-rank[present], column[present]))]
        top = ranked[:k]
        kept[top, j] = column[top]
    out = []
    for i, s in enumerate(series):
        if not np.isnan(kept[i]).all():
            out.append(Series(s.labels, kept[i], s.exemplars))
    return out


# Tempo's order of a label value's type (its StaticType numbering).
_TYPE_ORDER = {int: 3, float: 4, str: 5, bool: 6}


def _tie_order(series: List[Series]) -> np.ndarray:
    """Each series' place among equal values, as Tempo's topk breaks ties (its series key
    compared label by label: the value's text and the name alphabetically earlier first,
    then the larger type and number); bottomk takes the other end."""

    def key(s: Series) -> List[Tuple[str, str, int, float]]:
        return [
            (
                value if isinstance(value, str) else "",
                name,
                -_TYPE_ORDER.get(type(value), 0),
                -float(value) if isinstance(value, (int, float)) else 0.0,
            )
            for name, value in s.labels
            if name != NAME_LABEL
        ]

    places = sorted(range(len(series)), key=lambda i: key(series[i]))
    rank = np.empty(len(series), dtype=np.int64)
    rank[places] = np.arange(len(series))
    return rank


def _quantile_series(
    agg: _Aggregator, stage: MetricsStage, exemplars: Dict[int, List[Exemplar]]
) -> List[Series]:
    """One series per group and quantile, from the group's bucket counts; each exemplar goes
    to the quantile whose value over all groups and intervals is the closest to its own."""
    per_group: Dict[tuple, List[Tuple[float, int]]] = {}
    for (key, bucket), index in agg.rows.items():
        per_group.setdefault(key, []).append((bucket, index))
    all_maxes = np.array(sorted({b for (_, b) in agg.rows}), dtype=float)
    totals = np.zeros((len(all_maxes), 1))
    for (_, bucket), index in agg.rows.items():
        totals[np.searchsorted(all_maxes, bucket), 0] += agg.counts[index].sum()
    overall = [float(log2_quantile(q, all_maxes, totals)[0]) for q in stage.quantiles]
    out: List[Series] = []
    for key, rows in per_group.items():
        rows.sort()
        maxes = np.array([b for b, _ in rows], dtype=float)
        counts = agg.counts[[i for _, i in rows]]
        group_exemplars = [e for _, i in rows for e in exemplars.get(i, [])]
        base = _by_labels(stage.by, key)
        for qi, q in enumerate(stage.quantiles):
            mine = [
                e
                for e in group_exemplars
                if min(range(len(overall)), key=lambda j: abs(e.value - overall[j])) == qi
            ]
            labels = tuple(base + [(QUANTILE_LABEL, float(q))])
            out.append(Series(labels, log2_quantile(q, maxes, counts), mine))
    return out


def _attach_exemplars(series: Series, start: int, step: int, instant: bool) -> None:
    """Exemplars in an interval with a sample; the placeholders (NaN) take its value."""
    kept = []
    for e in series.exemplars:
        slot = 0 if instant else (e.timestamp_ms * MS - start - 1) // step
        if not 0 <= slot < len(series.values) or math.isnan(series.values[slot]):
            continue
        if math.isnan(e.value):
            e.value = float(series.values[slot])
        kept.append(e)
    series.exemplars = sorted(kept, key=lambda e: e.timestamp_ms)
