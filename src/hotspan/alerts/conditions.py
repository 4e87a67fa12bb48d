"""What a rule's condition measures, answered by the query engine.

Each condition gives a :class:`Measure`: its value (None when there is no data to judge, which
leaves the alert's state as it was), whether it breaches the rule's threshold, a sentence for
people, and the two sides of the diff view that show the cause (:class:`DiffLink`).
"""

from __future__ import annotations

import collections
import functools
import threading
import time
import urllib.parse
import weakref
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

from hotspan.alerts.rules import (
    CPU,
    AlertRule,
    FunctionShare,
    GilWaitShare,
    LabelPair,
    PerRequest,
    ShareGrowth,
    compile_function,
    selector_text,
)
from hotspan.model.durations import format_duration
from hotspan.model.labels import Matcher, Selector
from hotspan.model.profile import ProfileType
from hotspan.query.endpoints import STAMP_SLACK_NS
from hotspan.query.engine import QueryEngine
from hotspan.query.stacks import StackTable, stack_hits
from hotspan.query.why import GIL_WAIT
from hotspan.store.base import SampleFilter, StackValues

SEC = 10**9
# Function regexes whose matches are remembered per stack table (rules of every tenant).
MAX_CACHED_PATTERNS = 1024


@dataclass(frozen=True)
class Side:
    selector: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class DiffLink:
    """The diff view's baseline and comparison (and the function pattern to search for)."""

    profile_type: str
    baseline: Side
    comparison: Side
    search: str = ""

    def url(self, external_url: str) -> str:
        params = {"profileType": self.profile_type}
        for prefix, side in (("left", self.baseline), ("right", self.comparison)):
            params[f"{prefix}Query"] = side.selector
            # Unix seconds, whole ones covering the window (the UI reads seconds).
            params[f"{prefix}From"] = str(side.start_ns // SEC)
            params[f"{prefix}Until"] = str(-(-side.end_ns // SEC))
        if self.search:
            # Between slashes: the UI's search reads it as the rule's regular expression.
            params["search"] = f"/{self.search}/"
        return external_url.rstrip("/") + "/diff?" + urllib.parse.urlencode(params)


@dataclass(frozen=True)
class Measure:
    value: Optional[float]
    breached: bool
    summary: str
    link: DiffLink
    details: Dict[str, Any]


def measure(engine: QueryEngine, tenant: str, rule: AlertRule, now_ns: int) -> Measure:
    cond = rule.condition
    if isinstance(cond, FunctionShare):
        return _function_share(engine, tenant, rule, cond, now_ns)
    if isinstance(cond, PerRequest):
        return _per_request(engine, tenant, rule, cond, now_ns)
    if isinstance(cond, GilWaitShare):
        return _gil_wait_share(engine, tenant, rule, cond, now_ns)
    return _share_growth(engine, tenant, rule, cond, now_ns)


# -- function share ---------------------------------------------------------------------------


def _values(
    engine: QueryEngine, tenant: str, rule: AlertRule, sel: Selector, side: Side
) -> StackValues:
    return engine.stack_values(
        tenant, rule.profile_type, sel, SampleFilter(side.start_ns, side.end_ns)
    )


@functools.lru_cache(maxsize=MAX_CACHED_PATTERNS)
def _regex(pattern: str) -> Any:
    return compile_function(pattern)


class _NameHits:
    """The names of a stack table that match one regex.  A table's names only grow, so each
    name is tested once: a pass tests only those added since the last."""

    def __init__(self) -> None:
        self.tested = 0
        self.hits = np.zeros(0, dtype=np.int64)  # indexes of matching names


_name_hits: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_name_hits_lock = threading.Lock()


def matching_names(table: StackTable, pattern: str) -> np.ndarray:
    """A boolean per name of ``table`` (one more, False, for padding): does it match?"""
    regex = _regex(pattern)
    with _name_hits_lock:
        per_table = _name_hits.get(table)
        if per_table is None:
            per_table = _name_hits[table] = collections.OrderedDict()
        entry = per_table.get(pattern)
        if entry is None:
            entry = per_table[pattern] = _NameHits()
            while len(per_table) > MAX_CACHED_PATTERNS:
                per_table.popitem(last=False)
        per_table.move_to_end(pattern)
        # Names are appended under the table's lock; the first len() of them never change.
        names = table.names
        count = len(names)
        if count > entry.tested:
            new = [i for i in range(entry.tested, count) if regex.search(names[i]) is not None]
            if new:
                entry.hits = np.concatenate((entry.hits, np.asarray(new, dtype=np.int64)))
            entry.tested = count
        hit = np.zeros(count + 1, dtype=bool)
        hit[entry.hits] = True
    return hit


def function_value(engine: QueryEngine, values: StackValues, pattern: str) -> Tuple[int, int]:
    """(value of the stacks with a frame whose name matches ``pattern``, total value)."""
    total = int(values.values.sum()) if len(values.values) else 0
    if total == 0:
        return 0, 0
    table = engine.stacks
    rows = table.rows(values.stack_ids)
    known = rows >= 0
    hit = stack_hits(table, rows[known], matching_names(table, pattern))
    return int(values.values[known][hit].sum()), total


def _share(
    engine: QueryEngine, tenant: str, rule: AlertRule, sel: Selector, side: Side, function: str
) -> Tuple[Optional[float], int]:
    matched, total = function_value(engine, _values(engine, tenant, rule, sel, side), function)
    return (100.0 * matched / total if total else None), total


def _function_share(
    engine: QueryEngine, tenant: str, rule: AlertRule, cond: FunctionShare, now_ns: int
) -> Measure:
    now = Side(rule.selector_text, now_ns - cond.window_ns, now_ns)
    share, total = _share(engine, tenant, rule, rule.selector, now, cond.function)
    # The stretch before the window is the baseline: where the function weighed what it did.
    before = Side(rule.selector_text, now.start_ns - cond.window_ns, now.start_ns)
    link = DiffLink(rule.profile_type.id, before, now, cond.function)
    window = format_duration(cond.window_ns)
    if share is None:
        summary = (
            f"no {rule.profile_type.name} samples for {rule.selector_text} in the last {window}"
        )
    else:
        summary = (
            f"functions matching /{cond.function}/ hold {share:.1f}% of {rule.selector_text} "
            f"over the last {window} (threshold {cond.above:g}%; {window_words(now)})"
        )
    return Measure(
        share,
        share is not None and share > cond.above,
        summary,
        link,
        {"total": total},
    )


# -- GIL wait share ---------------------------------------------------------------------------

_CPU_TYPE = ProfileType.parse(CPU)


def _total(engine: QueryEngine, tenant: str, ptype: ProfileType, sel: Selector, side: Side) -> int:
    values = engine.stack_values(tenant, ptype, sel, SampleFilter(side.start_ns, side.end_ns))
    return int(values.values.sum()) if len(values.values) else 0


def _gil_wait_share(
    engine: QueryEngine, tenant: str, rule: AlertRule, cond: GilWaitShare, now_ns: int
) -> Measure:
    """The selected threads' GIL wait over their time running or waiting for the GIL: of the
    time their Python could have run, the part it waited (threads asleep or in I/O do not
    count, so a mostly idle pool does not dilute it)."""
    now = Side(rule.selector_text, now_ns - cond.window_ns, now_ns)
    waited = _total(engine, tenant, GIL_WAIT, rule.selector, now)
    ran = _total(engine, tenant, _CPU_TYPE, rule.selector, now)
    # The diff view of the GIL waits, the stretch before the window against the window.
    before = Side(rule.selector_text, now.start_ns - cond.window_ns, now.start_ns)
    link = DiffLink(GIL_WAIT.id, before, now)
    window = format_duration(cond.window_ns)
    share = 100.0 * waited / (waited + ran) if waited + ran else None
    if share is None:
        summary = f"no CPU or GIL-wait samples for {rule.selector_text} in the last {window}"
    else:
        summary = (
            f"threads of {rule.selector_text} waited for the GIL {share:.1f}% of the time they "
            f"ran or waited for it over the last {window} ({waited / 1e9:.3g} s of "
            f"{(waited + ran) / 1e9:.3g} s; threshold {cond.above:g}%; {window_words(now)})"
        )
    return Measure(
        share,
        share is not None and share > cond.above,
        summary,
        link,
        {"gilWait": waited, "cpu": ran},
    )


# -- CPU per request --------------------------------------------------------------------------


def _with_label(sel: Selector, label: str, value: str) -> Tuple[Selector, str]:
    extra = Matcher(label, "=", value)
    kept = tuple(m for m in sel.matchers if m.name != label)
    narrowed = Selector(sel.metric, kept + (extra,))
    return narrowed, selector_text(Selector(sel.metric, kept), extra)


# What "per request" counts.  A request is a local root span of the rule's service that
# started in the window: a span whose parent is not a span of the same service in its trace
# (a root span, or the server span of a call from another service), as the endpoints view
# counts them (hotspan.query.endpoints), so that a service only ever called by others has
# requests too.
#
# - Against an offset: the value is every sample of the selector in the window (the
#   requests' own and the process's other work) over the requests of the window, counted
#   by the store (Store.count_local_roots: no span crosses into Python, and no cap).
# - Against two label values: spans carry no profile labels, so a request belongs to the side
#   whose samples its trace holds (the side holding more, when both do), and a side's total
#   is the samples of its requests' traces (not the process's start, say, which would weigh
#   on whichever side started last).  A request shorter than the sampling interval often has
#   no samples at all: those requests are split between the sides in proportion to the
#   requests each side has (the same traffic mix on both), and their count is in the details
#   as "requestsWithoutSamples".  The store does the matching over every request of the
#   window (Store.request_sides): only the sums reach Python.


@dataclass
class _Count:
    total: int = 0
    requests: float = 0.0

    def json(self) -> Dict[str, Any]:
        per = self.total / self.requests if self.requests else None
        return {"perRequest": per, "total": self.total, "requests": round(self.requests, 2)}


def _count_by_offset(engine: QueryEngine, tenant: str, rule: AlertRule, side: Side) -> _Count:
    requests = engine.store.count_local_roots(
        tenant, rule.service or "", side.start_ns, side.end_ns
    )
    values = _values(engine, tenant, rule, rule.selector, side)
    total = int(values.values.sum()) if len(values.values) else 0
    return _Count(total, float(requests))


def _count_by_label(
    engine: QueryEngine,
    tenant: str,
    rule: AlertRule,
    sides: Tuple[Tuple[Selector, Side], Tuple[Selector, Side]],
) -> Tuple[_Count, _Count, int]:
    """(baseline, comparison, requests without samples) over the one window both sides
    share, counted by the store over every request of the window."""
    side = sides[0][1]
    # Samples carry the start of their upload window: a request's first ones may be stamped
    # a little before the window began (they are picked by trace, so no other request's).
    start_ns = side.start_ns - STAMP_SLACK_NS
    series = tuple(
        [
            s.series_id
            for s in engine.find_series(tenant, [sel], start_ns, side.end_ns, rule.profile_type)
        ]
        for sel, _ in sides
    )
    found = engine.store.request_sides(
        tenant,
        rule.service or "",
        side.start_ns,
        side.end_ns,
        (series[0], series[1]),
        SampleFilter(start_ns, side.end_ns),
    )
    base = _Count(found.totals[0], float(found.requests[0]))
    cmp_ = _Count(found.totals[1], float(found.requests[1]))
    without = found.without
    sampled = base.requests + cmp_.requests
    if without and sampled:
        share = base.requests / sampled
        base.requests += without * share
        cmp_.requests += without * (1 - share)
    return base, cmp_, without


def _per_request(
    engine: QueryEngine, tenant: str, rule: AlertRule, cond: PerRequest, now_ns: int
) -> Measure:
    window = format_duration(cond.window_ns)
    details: Dict[str, Any] = {}
    if cond.labels is not None:
        base_sel, base_text = _with_label(rule.selector, cond.labels.label, cond.labels.baseline)
        cmp_sel, cmp_text = _with_label(rule.selector, cond.labels.label, cond.labels.comparison)
        base = Side(base_text, now_ns - cond.window_ns, now_ns)
        cmp_ = Side(cmp_text, now_ns - cond.window_ns, now_ns)
        against = _pair_words(cond.labels)
        base_n, cmp_n, without = _count_by_label(
            engine, tenant, rule, ((base_sel, base), (cmp_sel, cmp_))
        )
        details["requestsWithoutSamples"] = without
    else:
        offset = cond.offset_ns or 0
        base = Side(rule.selector_text, now_ns - offset - cond.window_ns, now_ns - offset)
        cmp_ = Side(rule.selector_text, now_ns - cond.window_ns, now_ns)
        against = f"the same {window} {format_duration(offset)} earlier"
        base_n = _count_by_offset(engine, tenant, rule, base)
        cmp_n = _count_by_offset(engine, tenant, rule, cmp_)
    # Every request of the window is counted: nothing is ever cut (the key stays for
    # readers of the details).
    details.update(baseline=base_n.json(), comparison=cmp_n.json(), truncated=False)
    before = details["baseline"]["perRequest"]
    after = details["comparison"]["perRequest"]
    link = DiffLink(rule.profile_type.id, base, cmp_)
    unit = rule.profile_type.sample_unit
    if before is None or after is None or before <= 0:
        missing = "baseline" if before is None or before <= 0 else "comparison"
        summary = (
            f"no {missing} to compare: {rule.service} needs profiles and requests (local root "
            f"spans) on both sides ({against})"
        )
        return Measure(None, False, summary, link, details)
    increase = 100.0 * (after / before - 1.0)
    summary = (
        f"{rule.service}: {rule.profile_type.name} per request {_amount(after, unit)} over the "
        f"last {window}, {increase:+.1f}% against {against} ({_amount(before, unit)}; "
        f"threshold +{cond.increase:g}%; {window_words(cmp_, base)})"
    )
    return Measure(increase, increase > cond.increase, summary, link, details)


# -- share growth between two label values ----------------------------------------------------


def _share_growth(
    engine: QueryEngine, tenant: str, rule: AlertRule, cond: ShareGrowth, now_ns: int
) -> Measure:
    base_sel, base_text = _with_label(rule.selector, cond.labels.label, cond.labels.baseline)
    cmp_sel, cmp_text = _with_label(rule.selector, cond.labels.label, cond.labels.comparison)
    base = Side(base_text, now_ns - cond.window_ns, now_ns)
    cmp_ = Side(cmp_text, now_ns - cond.window_ns, now_ns)
    before, _ = _share(engine, tenant, rule, base_sel, base, cond.function)
    after, _ = _share(engine, tenant, rule, cmp_sel, cmp_, cond.function)
    link = DiffLink(rule.profile_type.id, base, cmp_, cond.function)
    details = {"baselineShare": before, "comparisonShare": after}
    if before is None or after is None:
        missing = "baseline" if before is None else "comparison"
        summary = f"no {missing} samples to compare ({_pair_words(cond.labels)})"
        return Measure(None, False, summary, link, details)
    growth = after - before
    summary = (
        f"functions matching /{cond.function}/ went from {before:.1f}% to {after:.1f}% "
        f"({growth:+.1f} points, threshold {cond.points:g}) {_pair_words(cond.labels)} "
        f"({window_words(cmp_)})"
    )
    return Measure(growth, growth > cond.points, summary, link, details)


def window_words(window: Side, baseline: Optional[Side] = None) -> str:
    """The windows a value was measured over, as the diff behind it shows them: "window
    10:27:03-10:32:03 UTC" (and the baseline's, when it is another stretch).  Samples that
    arrive after the evaluation can still move the figures the diff shows later."""

    def span(side: Side) -> str:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(side.start_ns // SEC))
        end = time.strftime("%H:%M:%S", time.gmtime(-(-side.end_ns // SEC)))
        return f"{start}-{end} UTC"

    text = f"window {span(window)}"
    if baseline is not None and (baseline.start_ns, baseline.end_ns) != (
        window.start_ns,
        window.end_ns,
    ):
        text += f", baseline {span(baseline)}"
    return text


def _pair_words(pair: LabelPair) -> str:
    return f"{pair.label}={pair.baseline!r} -> {pair.label}={pair.comparison!r}"


def _amount(value: float, unit: str) -> str:
    if unit == "nanoseconds":
        for size, name in ((SEC, "s"), (10**6, "ms"), (10**3, "µs")):
            if value >= size:
                return f"{value / size:.3g} {name}"
        return f"{value:.0f} ns"
    if unit == "bytes":
        for size, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if value >= size:
                return f"{value / size:.3g} {name}"
        return f"{value:.0f} B"
    return f"{value:.3g} {unit}"
