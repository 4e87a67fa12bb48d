"""Delivers notifications on a few threads of its own, so that no receiver can hold up the
evaluation nor make the work pile up:

- at most one send in flight per (tenant, rule, URL), and behind it at most one waiting per
  alert: a newer status for the same alert replaces the waiting one (resolved replaces a
  firing not yet sent), and a send no longer wanted is dropped before it starts;
- at most ``max_pending`` sends waiting in all, and a quarter of that per tenant: past that,
  new ones are refused (the evaluator asks again on its next pass);
- tenants take turns: the next send is that of the tenant with the fewest sends in flight,
  and while another tenant has one waiting, no tenant holds more than half the threads, so
  that one tenant's receivers that hang (many URLs, each waiting out the deadline) hold up
  another tenant's sends by one deadline at most;
- a URL that failed waits before its next send, twice as long after each failure in a row
  (from 2 s up to 5 min);
- each POST has a deadline for the whole of it (resolving, connecting, sending, the answer's
  headers): when it passes the socket is shut, even under a receiver that trickles a byte at
  a time (a per-read timeout never fires then);
- each POST goes only to addresses webhooks may reach (:mod:`~hotspan.alerts.targets`),
  checked when the host is resolved and connected to as checked; redirects are not followed,
  and of the answer only its status is kept.

Outcomes are kept until the evaluator collects them (:meth:`Dispatcher.outcomes`).
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from hotspan.alerts.targets import DEADLINE_S, IPNetwork

Key = Tuple[str, str, str]  # tenant, rule name, URL

THREADS = 4
MAX_PENDING = 1000
BACKOFF_FIRST_S = 2.0
BACKOFF_MAX_S = 300.0
# Alerts waiting behind one (tenant, rule, URL): a rule rarely has more than two (the one that
# ended with an edit, and the one after).
MAX_WAITING_PER_KEY = 4


@dataclass(frozen=True)
class Send:
    key: Key
    alert: str  # which alert (state.alert_id): a newer send of the same one replaces it
    status: str
    body: bytes


@dataclass(frozen=True)
class Outcome:
    key: Key
    alert: str
    status: str
    error: Optional[str]
    at_ns: int


class _Slot:
    def __init__(self) -> None:
        self.in_flight: Optional[Send] = None
        self.waiting: collections.OrderedDict[str, Send] = collections.OrderedDict()


class Dispatcher:
    def __init__(
        self,
        threads: int = THREADS,
        deadline_s: float = DEADLINE_S,
        max_pending: int = MAX_PENDING,
        backoff_first_s: float = BACKOFF_FIRST_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        allow: Sequence[IPNetwork] = (),
    ) -> None:
        self.deadline_s = deadline_s
        self.allow = tuple(allow)
        self.max_pending = max_pending
        self.backoff_first_s = backoff_first_s
        self.backoff_max_s = backoff_max_s
        self._cond = threading.Condition()
        self._slots: Dict[Key, _Slot] = {}
        self._pending = 0
        self.max_pending_per_tenant = max(1, max_pending // 4)
        self._max_in_flight_per_tenant = max(1, threads // 2)
        self._pending_by_tenant: Dict[str, int] = collections.Counter()
        self._in_flight_by_tenant: Dict[str, int] = collections.Counter()
        # URL -> (failures in a row, monotonic time before which it is not tried).
        self._backoff: Dict[str, Tuple[int, float]] = {}
        self._outcomes: List[Outcome] = []
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"hotspan-alert-send-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    # -- the evaluator's side ---------------------------------------------------------------

    def want(self, send: Send) -> Optional[str]:
        """Have ``send`` delivered, unless it is under way or delivered already; None, or why
        it was refused."""
        with self._cond:
            slot = self._slots.setdefault(send.key, _Slot())
            if _same(slot.in_flight, send) or any(
                o.key == send.key and o.alert == send.alert and o.status == send.status
                for o in self._outcomes
                if o.error is None
            ):
                self._drop_waiting(slot, send.alert)
                return None
            if send.alert in slot.waiting:
                slot.waiting[send.alert] = send  # the newest status, in the same place
                return None
            tenant = send.key[0]
            if self._pending >= self.max_pending or len(slot.waiting) >= MAX_WAITING_PER_KEY:
                return f"delivery queue full ({self._pending} notifications waiting)"
            if self._pending_by_tenant[tenant] >= self.max_pending_per_tenant:
                return (
                    f"delivery queue full for this tenant "
                    f"({self._pending_by_tenant[tenant]} notifications waiting)"
                )
            slot.waiting[send.alert] = send
            self._pending += 1
            self._pending_by_tenant[tenant] += 1
            self._cond.notify()
            return None

    def cancel(self, key: Key, alert: str) -> None:
        """A send of ``alert`` to ``key`` not yet started is no longer wanted."""
        with self._cond:
            slot = self._slots.get(key)
            if slot is not None:
                self._drop_waiting(slot, alert)

    def outcomes(self) -> List[Outcome]:
        """The outcomes since the last call, oldest first."""
        with self._cond:
            out, self._outcomes = self._outcomes, []
            for key in [k for k, s in self._slots.items() if not s.in_flight and not s.waiting]:
                del self._slots[key]
            for counts in (self._pending_by_tenant, self._in_flight_by_tenant):
                for tenant in [t for t, n in counts.items() if n == 0]:
                    del counts[tenant]
            return out

    def pending(self) -> int:
        with self._cond:
            return self._pending

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the sending threads ----------------------------------------------------------------

    def _drop_waiting(self, slot: _Slot, alert: str) -> None:
        send = slot.waiting.pop(alert, None)
        if send is not None:
            self._pending -= 1
            self._pending_by_tenant[send.key[0]] -= 1

    def _next(self) -> Optional[Send]:
        """The next send that may start (its key idle, its URL not waiting out a failure):
        of the tenant with the fewest sends in flight; one at half the threads only when no
        other tenant has one ready."""
        now = time.monotonic()
        wake = None
        best: Optional[Tuple[_Slot, str, Send]] = None
        for slot in self._slots.values():
            if slot.in_flight is not None or not slot.waiting:
                continue
            alert, send = next(iter(slot.waiting.items()))
            _, until = self._backoff.get(send.key[2], (0, 0.0))
            if until > now:
                wake = until if wake is None else min(wake, until)
                continue
            flying = self._in_flight_by_tenant[send.key[0]]
            if best is None or flying < self._in_flight_by_tenant[best[2].key[0]]:
                best = (slot, alert, send)
                if flying == 0:
                    break
        self._wake_at = wake
        if best is None:
            return None
        slot, alert, send = best
        tenant = send.key[0]
        if self._in_flight_by_tenant[tenant] >= self._max_in_flight_per_tenant and any(
            t != tenant and n > 0 for t, n in self._pending_by_tenant.items()
        ):
            # Another tenant's send waits (out a backoff, or behind its own key's send): the
            # threads left are for it; this one's turn comes as a send ends.
            return None
        del slot.waiting[alert]
        self._pending -= 1
        self._pending_by_tenant[tenant] -= 1
        self._in_flight_by_tenant[tenant] += 1
        slot.in_flight = send
        return send

    def _work(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    send = self._next()
                    if send is not None:
                        break
                    timeout = None if self._wake_at is None else self._wake_at - time.monotonic()
                    self._cond.wait(None if timeout is None else max(timeout, 0.01))
            # At the first send, not as the thread starts: httpx and httpcore (with whatever
            # async backends they find installed) are a tenth of a second of CPU and megabytes
            # that a server without webhooks to send never needs.
            from hotspan.alerts import webhook_post

            error = webhook_post.post(send.key[2], send.body, self.deadline_s, self.allow)
            with self._cond:
                slot = self._slots.get(send.key)
                if slot is not None:
                    slot.in_flight = None
                self._in_flight_by_tenant[send.key[0]] -= 1
                self._outcomes.append(
                    Outcome(send.key, send.alert, send.status, error, time.time_ns())
                )
                url = send.key[2]
                if error is None:
                    self._backoff.pop(url, None)
                else:
                    failures = self._backoff.get(url, (0, 0.0))[0] + 1
                    delay = min(self.backoff_first_s * 2 ** (failures - 1), self.backoff_max_s)
                    self._backoff[url] = (failures, time.monotonic() + delay)
                self._cond.notify_all()

    _wake_at: Optional[float] = None


def _same(a: Optional[Send], b: Send) -> bool:
    return a is not None and a.alert == b.alert and a.status == b.status
