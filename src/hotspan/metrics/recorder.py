"""Recording rules' values: counters that grow as profiles are stored.

Why at ingest, and not by querying the store on a cadence: samples are stamped with the start
of their upload window, so a query over "the last 15 s" would miss what is still in flight
and need a lag longer than any agent's upload interval, and anything later still would be
lost; and a query per rule per scrape costs a scan per rule.  Counting each batch once it is
durable is exact (every stored sample counts exactly once, whenever it arrives), costs a few
array operations per batch, and makes a Prometheus counter: ``rate()`` over it is the profile
value per second (CPU nanoseconds per second, bytes allocated per second...) as received,
late by the upload interval at most.  Pyroscope exports its recording rules at ingest for
the same reasons.  A server counts what it stored itself: several servers sharing a store
each export their part (``sum without (instance)`` adds them up), a restart starts the
counters over (which ``rate()`` handles), and a rule counts from its creation on.

Counting runs on one worker thread, fed through a bounded queue by the store's "durable"
callback: ingest never waits for it, and never takes the recorder's lock.  When the worker
falls behind, batches are dropped from counting (not from the store) and the drop is
exported, as a counter reset would be misleading.

Rules come from the store (documents of kind ``recording_rule``), reloaded after each change
through this server's API and every REFRESH_S seconds, for changes made through another
server of the same store.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Set, Tuple

import numpy as np
from prometheus_client.core import Metric

from hotspan.metrics.rules import (
    KIND,
    RULE_ID_LABEL,
    TENANT_LABEL,
    RecordingRule,
    RuleError,
    family_of,
    from_document,
)
from hotspan.metrics.stacks import BatchStacks, FrameNames, FunctionFilter
from hotspan.model.labels import METRIC_NAME, Selector
from hotspan.model.profile import IngestBatch, SeriesInfo
from hotspan.query.engine import synthetic_labels
from hotspan.store.base import Store
from hotspan.store.batching import name_os_thread

log = logging.getLogger(__name__)

REFRESH_S = 10.0
# A groupBy on a label with many values (a pod name, a version per build) must not grow
# /metrics without bound: past any of these many series, new label values are not recorded
# (their value is counted as dropped instead).
MAX_SERIES_PER_RULE = 5_000
MAX_SERIES_PER_TENANT = 10_000
MAX_SERIES = 100_000
# Sample rows waiting to be counted (about 50 bytes each); past it, batches are not counted.
# Rows, not batches: under a burst of pushes the worker shares the interpreter with the event
# loop and falls behind for seconds, then catches up (it counts 5,000+ uploads a second
# alone, bench/results/rules.md); a queue of 64 batches dropped 13 % of them there.
QUEUE_ROWS = 2_000_000
_SERIES_CACHE_LIMIT = 200_000
_STOP = object()

GroupKey = Tuple[str, ...]


@dataclass(eq=False)
class _Active:
    """A rule with what it has counted and what it learnt about series and frames.  The
    caches are the worker's alone; ``values`` and ``dropped`` are read under the lock."""

    tenant: str
    rule: RecordingRule
    selectors: List[Selector]
    function: Optional[FunctionFilter]
    values: Dict[GroupKey, int] = field(default_factory=dict)
    dropped: int = 0
    live: bool = True  # false once a reload removed or changed the rule
    # series id -> its group (None: the series does not match)
    series_groups: Dict[int, Optional[GroupKey]] = field(default_factory=dict)

    @classmethod
    def of(cls, tenant: str, rule: RecordingRule) -> _Active:
        matcher = rule.function_matcher()
        function = FunctionFilter(matcher) if matcher is not None else None
        return cls(tenant, rule, rule.selectors(), function)

    def group_of(self, series_id: int, info: Optional[SeriesInfo]) -> Optional[GroupKey]:
        if series_id in self.series_groups:
            return self.series_groups[series_id]
        group: Optional[GroupKey] = None
        if info is not None and info.profile_type == self.rule.profile_type:
            labels = dict(info.labels)
            labels.setdefault(METRIC_NAME, info.profile_type.name)
            labels.update(synthetic_labels(info.profile_type))
            if all(s.matches(labels) for s in self.selectors):
                group = tuple(labels.get(name, "") for name in self.rule.group_by)
        if len(self.series_groups) >= _SERIES_CACHE_LIMIT:
            self.series_groups.clear()
        self.series_groups[series_id] = group
        return group


class Recorder:
    """The rules of every tenant, their counters, and the worker that feeds them."""

    def __init__(self, store: Store, queue_rows: int = QUEUE_ROWS) -> None:
        self.store = store
        self._lock = threading.Lock()  # _active, values, dropped, series counts
        self._active: Dict[str, List[_Active]] = {}  # tenant -> its rules
        self._series: Dict[str, int] = {}  # tenant -> series recorded
        self._series_total = 0
        self._queue: queue.Queue = queue.Queue()
        self._queue_rows = queue_rows
        self._queued_rows = 0  # under _drops_lock
        # Small locks of their own: taken where the recorder lock must not be.
        self._seq_lock = threading.Lock()
        self._seq = 0
        self._loaded_seq = 0
        self._drops_lock = threading.Lock()
        self._dropped_batches: Dict[str, int] = {}
        self.refresh_failures = 0
        self._warned: Set[str] = set()
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []

    # -- rules ---------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Load the rules from the store (blocking).  A rule whose definition is unchanged
        keeps its counters; a changed or deleted one loses them.  Of concurrent reloads, the
        one that read last wins, whichever finishes last."""
        with self._seq_lock:
            self._seq += 1
            seq = self._seq
        try:
            docs = self.store.documents(KIND)
        except Exception:
            with self._seq_lock:
                self.refresh_failures += 1
            raise
        loaded: Dict[str, List[RecordingRule]] = {}
        for doc in docs:
            try:
                rule = from_document(doc.body)
            except (RuleError, AttributeError, TypeError) as exc:
                log.warning("recording rule %r of tenant %r skipped: %s", doc.name, doc.tenant, exc)
                continue
            loaded.setdefault(doc.tenant, []).append(rule)
        self.load(loaded, seq)

    def load(self, rules: Mapping[str, Iterable[RecordingRule]], seq: Optional[int] = None) -> None:
        with self._lock:
            if seq is not None:
                if seq < self._loaded_seq:
                    return  # read before a reload that is already in place
                self._loaded_seq = seq
            old = {(a.tenant, a.rule.id): a for acts in self._active.values() for a in acts}
            active: Dict[str, List[_Active]] = {}
            for tenant, tenant_rules in rules.items():
                for rule in tenant_rules:
                    prev = old.pop((tenant, rule.id), None)
                    if prev is not None and prev.rule.definition() == rule.definition():
                        prev.rule = rule
                        act = prev
                    else:
                        act = _Active.of(tenant, rule)
                    active.setdefault(tenant, []).append(act)
            for gone in old.values():
                gone.live = False
            self._active = active
            self._series = {t: sum(len(a.values) for a in acts) for t, acts in active.items()}
            self._series_total = sum(self._series.values())

    def rule_count(self, tenant: Optional[str] = None) -> Dict[str, int]:
        with self._lock:
            return {
                t: len(acts) for t, acts in self._active.items() if tenant is None or t == tenant
            }

    # -- counting ------------------------------------------------------------------------------

    def submit(self, tenant: str, batch: IngestBatch) -> None:
        """Queue a durable batch for counting; never blocks (a full queue drops it, counted)."""
        if not self._active.get(tenant):
            return  # a plain read: the common case of a tenant without rules costs nothing
        rows = len(batch)
        with self._drops_lock:
            if self._queued_rows + rows > self._queue_rows:
                self._dropped_batches[tenant] = self._dropped_batches.get(tenant, 0) + 1
                return
            self._queued_rows += rows
        self._queue.put_nowait((tenant, batch))

    def flush(self, timeout_s: float) -> bool:
        """Wait until the batches queued before now are counted (at most ``timeout_s``):
        a scrape then shows every push acknowledged before it."""
        if not self._threads:
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout_s)

    def count(self, tenant: str, batch: IngestBatch) -> None:
        """Count a durable batch (on the worker; callable directly where there is none)."""
        acts = self._active.get(tenant)
        if not acts:
            return
        cols = batch.columns()
        if not len(cols.value):
            return
        first = cols.series_id[:1]
        if (cols.series_id == first).all():  # one upload, one series: the common batch
            series_list, inverse = first.tolist(), np.zeros(len(cols.series_id), dtype=np.intp)
        else:
            series, inverse = np.unique(cols.series_id, return_inverse=True)
            series_list = series.tolist()
        infos = [batch.series.get(sid) for sid in series_list]
        plans = []
        for act in acts:
            groups = [act.group_of(sid, info) for sid, info in zip(series_list, infos)]
            if groups.count(None) < len(groups):
                plans.append((act, groups))
        if not plans:
            return
        hits = self._function_hits(batch, cols.stack_id, [a for a, _ in plans])
        values = cols.value
        # Per series sums: a series a rule does not want is summed and left out.
        per_series: Dict[Optional[int], List[int]] = {}  # by function filter's id
        results = []
        for act, groups in plans:
            key = id(act.function) if act.function is not None else None
            sums = per_series.get(key)
            if sums is None:
                chosen = values if key is None else values[hits[key]]
                if len(series_list) == 1:
                    sums = [int(chosen.sum())]
                else:
                    where = inverse if key is None else inverse[hits[key]]
                    acc = np.zeros(len(series_list), dtype=np.int64)
                    np.add.at(acc, where, chosen)
                    sums = acc.tolist()
                per_series[key] = sums
            totals: Dict[GroupKey, int] = {}
            for group, total in zip(groups, sums):
                # A matching series shows at 0 before its function appears: rate() and
                # alerts see "none" rather than "no data".
                if group is not None:
                    totals[group] = totals.get(group, 0) + total
            results.append((act, totals))
        with self._lock:
            for act, totals in results:
                if act.live:
                    for group, total in totals.items():
                        self._add(act, group, total)

    @staticmethod
    def _function_hits(
        batch: IngestBatch, sample_stacks: np.ndarray, acts: List[_Active]
    ) -> Dict[int, np.ndarray]:
        """Per function filter (by ``id``): does each sample's stack hold a matching frame.
        The verdicts come from the filters' memory of stacks; the batch's stacks are laid
        out, and the names of their frames asked of the batch, once for all the filters
        meeting a stack they do not know."""
        filters = [a.function for a in acts if a.function is not None]
        if not filters:
            return {}
        # Per sample, not per distinct stack: an upload's samples have distinct stacks, or
        # nearly, and a sort to find them would cost more than the look-ups it saves.
        ids = sample_stacks.tolist()
        verdicts: Dict[int, np.ndarray] = {}
        todo: List[FunctionFilter] = []
        for f in filters:
            known = f.stack_verdicts(ids)
            if known is None:
                todo.append(f)
            else:
                verdicts[id(f)] = known
        if todo:
            stacks = BatchStacks(batch, sample_stacks)
            unjudged = [(f, f.unjudged(stacks.frames)) for f in todo]
            wanted: Set[int] = set()
            for _, frames in unjudged:
                wanted.update(frames.tolist())
            if wanted:
                names = FrameNames(batch)
                names.ask(wanted)
                for f, frames in unjudged:
                    if len(frames):
                        f.judge(frames, names.names)
            for f in todo:
                found = stacks.sample_hits(f.frame_matches(stacks.frames))
                f.remember_stacks(ids, found, stacks.sample_settled(f.frame_judged(stacks.frames)))
                verdicts[id(f)] = found
        return verdicts

    def _add(self, act: _Active, group: GroupKey, value: int) -> None:
        if group in act.values:
            act.values[group] += value
            return
        tenant_series = self._series.get(act.tenant, 0)
        if (
            len(act.values) >= MAX_SERIES_PER_RULE
            or tenant_series >= MAX_SERIES_PER_TENANT
            or self._series_total >= MAX_SERIES
        ):
            act.dropped += value
            return
        act.values[group] = value
        self._series[act.tenant] = tenant_series + 1
        self._series_total += 1

    # -- export --------------------------------------------------------------------------------

    def families(self, tenant: Optional[str] = None) -> List[Metric]:
        """One family per base name (rules may share one), of every tenant or one."""
        out: Dict[str, Metric] = {}
        with self._lock:
            for t, acts in sorted(self._active.items()):
                if tenant is not None and t != tenant:
                    continue
                for act in acts:
                    rule = act.rule
                    base, kind = family_of(rule.metric_name)
                    family = out.get(base)
                    if family is None:
                        doc = f"hotspan recording rule: sum of {rule.profile_type.id} sample values"
                        family = out[base] = Metric(base, doc, kind)
                    elif family.type != kind:
                        # Refused by the API; possible only for rules stored by another
                        # server racing this one's check.  One type per family, or the
                        # exposition is invalid.
                        self._warn_clash(rule.metric_name)
                        continue
                    fixed = dict(rule.external_labels)
                    fixed[RULE_ID_LABEL] = rule.id
                    fixed[TENANT_LABEL] = t
                    for group, value in act.values.items():
                        labels = dict(fixed)
                        labels.update(zip(rule.group_by, group))
                        family.add_sample(rule.metric_name, labels, value)
        return list(out.values())

    def _warn_clash(self, name: str) -> None:
        if name not in self._warned:
            self._warned.add(name)
            log.warning("recording rule metric %r clashes with another of another type", name)

    def dropped(self, tenant: Optional[str] = None) -> Dict[Tuple[str, str], int]:
        """Value not recorded per (tenant, rule id), for the series budgets."""
        with self._lock:
            return {
                (a.tenant, a.rule.id): a.dropped
                for t, acts in self._active.items()
                if tenant is None or t == tenant
                for a in acts
                if a.dropped
            }

    def dropped_batches(self, tenant: Optional[str] = None) -> Dict[str, int]:
        """Batches not counted per tenant, the worker being too far behind."""
        with self._drops_lock:
            return {t: n for t, n in self._dropped_batches.items() if tenant in (None, t)}

    # -- threads -------------------------------------------------------------------------------

    def start(self) -> None:
        for target, name in ((self._work, "hotspan-recording"), (self._reload, "hotspan-rules")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(_STOP)
        for thread in self._threads:
            thread.join(timeout=30)

    def _work(self) -> None:
        name_os_thread("hotspan-recording")  # top -H (and bench/rules.py) show its CPU
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, threading.Event):
                item.set()  # a flush: everything queued before it is counted
                continue
            tenant, batch = item
            try:
                self.count(tenant, batch)
            except Exception:  # noqa: BLE001 - a bug in a rule must not stop the counting
                log.exception("recording rules could not count a batch")
            finally:
                with self._drops_lock:
                    self._queued_rows -= len(batch)
            del item, batch  # do not hold a decoded batch while waiting for the next

    def _reload(self) -> None:
        while not self._stop.wait(REFRESH_S):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive a store hiccup
                log.warning("could not reload the recording rules: %s", exc)
