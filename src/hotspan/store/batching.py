"""Group commit: many concurrent pushes become one transaction.

A commit costs about a millisecond whatever its size, so committing each push on its own caps
ingest near 1,000 pushes/s.  The writer thread instead takes everything queued since the last
commit, writes it in one transaction and then resolves every push's future, so a push is still
acknowledged only after it is durable.

Other writes (retention's deletes) run on the same thread as jobs between two groups: one
writer means no write ever conflicts with another, and a job kept short never holds ingest up
for long.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import queue
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterable, List, Sequence, Set, Tuple, TypeVar, Union

import numpy as np

from hotspan.model.profile import IngestBatch, ProfileType, SampleColumns
from hotspan.model.trace import SpanBatch
from hotspan.store.base import SeriesRecord, StoreClosed, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

Batch = Union[IngestBatch, SpanBatch]
Pending = Tuple[str, Batch, "Future[None]"]
T = TypeVar("T")


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` (15 bytes at most) where the OS shows it (``top -H``,
    ``/proc/PID/task/TID/comm``), so that an operator, or the ingest benchmark, sees which of
    the server's threads spends the CPU.  Linux only; elsewhere it does nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


class _Job:
    def __init__(self, fn: Callable[[], Any], future: Future) -> None:
        self.fn = fn
        self.future = future


_STOP = object()


class GroupCommitWriter:
    def __init__(
        self,
        commit: Callable[[List[Tuple[str, Batch]]], None],
        max_batch_samples: int = 1_000_000,
        name: str = "hotspan-writer",
    ) -> None:
        self._commit = commit
        self._max_batch_samples = max_batch_samples
        self._queue: queue.Queue = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, tenant: str, batch: Batch) -> Future[None]:
        future: Future[None] = Future()
        self._put((tenant, batch, future), future)
        return future

    def run(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn`` on the writer thread, between two groups."""
        future: Future[T] = Future()
        self._put(_Job(fn, future), future)
        return future

    def _put(self, item: object, future: Future) -> None:
        with self._lock:
            if self._closed:
                future.set_exception(StoreClosed("store is closed"))
                return
            self._queue.put(item)

    def close(self) -> None:
        """Stop taking writes, commit what was queued, wait for the writer to finish."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        name_os_thread(self._thread.name)
        stopping = False
        while not stopping:
            item = self._queue.get()
            if item is _STOP:
                break
            if isinstance(item, _Job):
                self._run_job(item)
                continue
            pending: List[Pending] = [item]
            samples = len(item[1])
            job = None
            while samples < self._max_batch_samples:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stopping = True
                    break
                if isinstance(item, _Job):
                    job = item  # after the writes queued before it
                    break
                pending.append(item)
                samples += len(item[1])
            self._flush(pending)
            if job is not None:
                self._run_job(job)
            # Do not keep the last group (decoded profiles) alive until the next push.
            del pending, item, job

    @staticmethod
    def _run_job(job: _Job) -> None:
        try:
            job.future.set_result(job.fn())
        except Exception as exc:  # noqa: BLE001 - the caller hears about it
            log.exception("store job failed")
            job.future.set_exception(exc)

    def _flush(self, pending: List[Pending]) -> None:
        # ``commit`` must raise only when nothing was committed (a retry re-writes the group),
        # or PartialCommit naming what was not.
        try:
            self._commit([(tenant, batch) for tenant, batch, _ in pending])
        except PartialCommit as partial:
            failed = [pending[i] for i in sorted(partial.failed)]
            for i, (_, _, future) in enumerate(pending):
                if i not in partial.failed:
                    future.set_result(None)
            self._fail(failed, partial.cause)
            return
        except Exception as exc:  # noqa: BLE001 - every waiting push must hear about it
            self._fail(pending, exc)
            return
        for _, _, future in pending:
            future.set_result(None)

    def _fail(self, pending: List[Pending], exc: BaseException) -> None:
        if len(pending) > 1 and not isinstance(exc, StoreUnavailable):
            # One bad push must not fail its neighbours: retry them one by one.  Not when the
            # store is away: each retry would wait for it again, and all would fail anyway.
            for one in pending:
                self._flush([one])
            return
        log.error("commit failed: %s", exc, exc_info=not isinstance(exc, StoreError))
        error = exc if isinstance(exc, StoreError) else StoreError(f"commit failed: {exc}")
        for _, _, future in pending:
            future.set_exception(error)


class PartialCommit(StoreError):
    """Raised by a commit when some of its group is durable and the rest is not (a store
    whose commit is several statements): ``failed`` are the indexes of the batches that were
    not committed, ``cause`` why."""

    def __init__(self, failed: Set[int], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.failed = failed
        self.cause = cause


# What a sample without a trace id has in its trace column.
_NO_TRACE = np.array(None, dtype=object)


def has_trace_ids(trace_id: np.ndarray) -> bool:
    """Whether a column of trace ids (None for a sample without one) holds any: most pushes
    hold none, and a store writes the column only when they do."""
    return bool(np.not_equal(trace_id, _NO_TRACE).any())


def series_bounds(
    tenant: str, batch: IngestBatch, cols: SampleColumns, out: Dict[Tuple[str, int], list]
) -> None:
    """Add to ``out`` the first and last sample time of every series in the batch, as
    ``(tenant, series_id) -> [tenant, series_id, profile type, labels JSON, first, last]``."""
    sids, ts = cols.series_id, cols.ts
    if not len(sids):
        return
    if not (sids != sids[0]).any():
        # One series, as most pushes are: no sort, and no NumPy call that lets go of the
        # GIL (a sort, a reduceat) for the writer to wait for it again.
        bounds = [(int(sids[0]), int(ts.min()), int(ts.max()))]
    else:
        order = np.argsort(sids, kind="stable")
        sids, ts = sids[order], ts[order]
        starts = np.flatnonzero(np.concatenate(([True], sids[1:] != sids[:-1])))
        lows = np.minimum.reduceat(ts, starts)
        highs = np.maximum.reduceat(ts, starts)
        bounds = list(zip(sids[starts].tolist(), lows.tolist(), highs.tolist()))
    for sid, lo, hi in bounds:
        row = out.get((tenant, sid))
        if row is None:
            info = batch.series[sid]
            out[(tenant, sid)] = [
                tenant,
                sid,
                info.profile_type.id,
                json.dumps(dict(info.labels)),
                lo,
                hi,
            ]
        else:
            row[4], row[5] = min(row[4], lo), max(row[5], hi)


def remember_series(
    series: Dict[str, Dict[int, SeriesRecord]], rows: Iterable[Sequence[Any]]
) -> None:
    """Merge :func:`series_bounds` rows into ``tenant -> series id -> record``, widening the
    bounds of series already there; never raises (it runs after a commit, and at open)."""
    for tenant, sid, ptype, labels, first, last in rows:
        by_id = series.setdefault(tenant, {})
        old = by_id.get(sid)
        try:
            if old is not None:
                first, last = min(first, old.first_ts), max(last, old.last_ts)
                record = SeriesRecord(sid, old.profile_type, old.labels, first, last)
            else:
                record = SeriesRecord(
                    sid, ProfileType.parse(ptype), json.loads(labels), first, last
                )
        except (ValueError, TypeError) as exc:
            log.error("skipping unreadable series %s of tenant %s: %s", sid, tenant, exc)
            continue
        by_id[sid] = record
