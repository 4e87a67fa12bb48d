"""Which of the servers over one store evaluates the alert rules: the one holding the lease,
a store document (kind ``alert_lease``, tenant "", name ``evaluator``) with body
``{"holder": server id, "expires": unix ns}``.

A server renews the lease it holds on each pass.  One that finds it expired (or absent) writes
its own, waits a moment for any other server doing the same, and reads it back: the newest
write wins in both stores (DuckDB replaces the row; ClickHouse's ``documents()`` takes the row
with the latest ``updated_at``), so exactly one of them reads its own id.  A server that stops
lets it go, so another takes over on its next pass rather than after the lease runs out.
Servers' clocks are taken to agree to well within a lease (NTP).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any, Mapping, Optional

from hotspan.store.base import Store

LEASE_KIND = "alert_lease"
LEASE_TENANT = ""
LEASE_NAME = "evaluator"


class Lease:
    def __init__(
        self,
        store: Store,
        duration_s: float,
        settle_s: float = 0.3,
        holder: Optional[str] = None,
        stop: Optional[threading.Event] = None,
    ) -> None:
        self.store = store
        self.duration_ns = int(duration_s * 1e9)
        self.settle_s = settle_s
        self.holder = holder or uuid.uuid4().hex
        self._stop = stop or threading.Event()

    def _current(self) -> Optional[Mapping[str, Any]]:
        for doc in self.store.documents(LEASE_KIND, LEASE_TENANT):
            if doc.name == LEASE_NAME:
                return doc.body
        return None

    def _write(self, expires_ns: int) -> None:
        self.store.put_document(
            LEASE_TENANT, LEASE_KIND, LEASE_NAME, {"holder": self.holder, "expires": expires_ns}
        )

    def hold(self) -> bool:
        """True when this server holds the lease (renewed, or taken) until a lease from now."""
        now = time.time_ns()
        current = self._current() or {}
        mine = current.get("holder") == self.holder
        live = int(current.get("expires") or 0) > now
        if live and not mine:
            return False
        self._write(now + self.duration_ns)
        if live:
            return True  # renewed: nobody else may take a lease that had not run out
        # Taken: let a server that found it expired at the same time write too, then see
        # whose write is the newest.
        if self._stop.wait(self.settle_s):
            return False
        return (self._current() or {}).get("holder") == self.holder

    def release(self) -> None:
        """Give the lease up if this server holds it."""
        if (self._current() or {}).get("holder") == self.holder:
            self._write(0)
