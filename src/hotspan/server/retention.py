"""Deletes what is older than the retention period, on a thread of its own.

The store does the deleting in short steps on its writer thread, so ingest goes on between
them (``Store.delete_before``); this only decides when.
"""

from __future__ import annotations

import logging
import threading
import time

from hotspan.store.base import Store, StoreClosed

log = logging.getLogger(__name__)


class RetentionLoop:
    def __init__(self, store: Store, retention_ns: int, interval_s: float) -> None:
        self.store = store
        self.retention_ns = retention_ns
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hotspan-retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def run_once(self) -> None:
        cutoff = time.time_ns() - self.retention_ns
        started = time.monotonic()
        report = self.store.delete_before(cutoff, self._stop.is_set)
        if report.samples or report.spans:
            log.info(
                "retention: deleted %d samples, %d spans, %d series older than %s in %.1f s",
                report.samples,
                report.spans,
                report.series,
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(cutoff / 1e9)),
                time.monotonic() - started,
            )

    def _run(self) -> None:
        # A first pass soon after start: a server that was down for a while catches up.
        delay = min(self.interval_s, 5.0)
        while not self._stop.wait(delay):
            delay = self.interval_s
            try:
                self.run_once()
            except StoreClosed:
                return  # the server is stopping
            except Exception:  # noqa: BLE001 - retention must never take the server down
                log.exception("retention pass failed; trying again later")
