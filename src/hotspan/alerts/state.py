"""An alert's state between evaluations, as Prometheus keeps it: inactive, pending (the
condition holds, for less than the rule's ``for``), firing; with the last transitions, and what
each webhook last took, so that a notification goes out once per transition (and again when
the receiver failed).

The alert a receiver knows is its labels and the URLs it went to, frozen when it fires: a rule
edited while firing (other labels or webhooks), or deleted, or deleted and created again (a
new ``uid``), "retires" the alert: it ends, its resolved notification goes to the old URLs
with the old labels (kept in :attr:`AlertState.retired` until delivered), and the rule as it
now is starts as a new alert.

An evaluation without data, or one that failed, ends a pending alert (as Prometheus does).  A
firing alert with no data resolves once no data has lasted the rule's window or three
evaluation intervals, whichever is longer (like Grafana's NoData -> OK): a service that stopped
or stopped being profiled must not page forever.  A failed evaluation leaves it firing.
"""

from __future__ import annotations

import datetime as _dt
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional

logger = logging.getLogger(__name__)

INACTIVE = "inactive"
PENDING = "pending"
FIRING = "firing"
RESOLVED = "resolved"
STATES = (INACTIVE, PENDING, FIRING)
HISTORY = 20
MAX_ERROR_CHARS = 500
# Retired alerts whose resolved notification is still owed, at most; and how many failed
# attempts each gets before it is given up.
MAX_RETIRED = 20
MAX_RETIRED_FAILURES = 10

NO_DATA = "no data"
EVALUATION_FAILED = "evaluation failed"
RULE_CHANGED = "rule changed"
RULE_DELETED = "rule deleted"


def rfc3339(ns: Optional[int]) -> Optional[str]:
    """UTC time with milliseconds, as Alertmanager writes it; None for 0/None."""
    if not ns:
        return None
    moment = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fingerprint(labels: Mapping[str, str]) -> str:
    """Prometheus's label-set fingerprint: FNV-1a over sorted names and values, each followed
    by the 0xff separator."""
    value = 14695981039346656037
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode() + b"\xff":
                value = ((value ^ byte) * 1099511628211) & (2**64 - 1)
    return f"{value:016x}"


def alert_id(labels: Mapping[str, str], starts_at_ns: int) -> str:
    """One firing of one alert: what a receiver tells apart."""
    return f"{fingerprint(labels)}@{starts_at_ns}"


def is_alertmanager_api(url: str) -> bool:
    """URLs of Alertmanager's own API (``.../api/v2/alerts``) rather than a webhook receiver."""
    path = url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    return path.endswith("/api/v2/alerts")


def _wanted_resolved(record: Mapping[str, Any]) -> Optional[str]:
    """A receiver that was sent (or may have been sent) firing gets resolved, until it took it."""
    status = record.get("status")
    if status == FIRING or (status == RESOLVED and not record.get("ok")):
        return RESOLVED
    return None


@dataclass(frozen=True)
class Notice:
    """One notification the state calls for now (or, with ``status`` None, none: a send of
    that alert not yet started is no longer wanted)."""

    alert: str  # alert_id
    url: str
    status: Optional[str]
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at_ns: int
    ends_at_ns: int
    generator_url: str


@dataclass
class AlertState:
    uid: str = ""  # the rule's uid this state belongs to ("" for rules stored without one)
    state: str = INACTIVE
    value: Optional[float] = None
    summary: str = ""
    since_ns: int = 0  # when the current state began
    active_at_ns: int = 0  # when the condition began to hold (pending, then firing)
    fired_at_ns: int = 0  # startsAt of the current (or last) firing
    resolved_at_ns: int = 0  # endsAt of the last firing
    no_data_since_ns: int = 0  # first of the evaluations without data in a row (0: had data)
    last_evaluation_ns: int = 0
    evaluation_s: float = 0.0
    last_error: Optional[str] = None
    generator_url: str = ""
    history: List[Dict[str, Any]] = field(default_factory=list)
    # Webhook URL -> what it was last sent for the current alert: {"alert": alert_id, "status",
    # "ok": whether it answered 2xx, "at": ns, "confirmed": the last status it took}.
    delivered: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    delivery_errors: Dict[str, str] = field(default_factory=dict)
    evaluations: int = 0
    failures: int = 0
    notifications: int = 0
    notification_failures: int = 0
    # The current alert as its receivers know it: frozen while firing.
    labels: Dict[str, str] = field(default_factory=dict)
    annotations: Dict[str, str] = field(default_factory=dict)
    webhooks: List[str] = field(default_factory=list)
    # Alerts that ended with a rule's change or deletion, owing their resolved notification:
    # {"alert", "labels", "annotations", "webhooks", "startsAt", "endsAt", "generatorURL",
    #  "delivered", "failures"}.
    retired: List[Dict[str, Any]] = field(default_factory=list)

    # -- transitions ----------------------------------------------------------------------

    def observe(self, breached: bool, value: Optional[float], now_ns: int, for_ns: int) -> None:
        """One evaluation's outcome."""
        self._evaluated(now_ns)
        self.value = value
        self.no_data_since_ns = 0
        if breached:
            if self.state == INACTIVE:
                self.active_at_ns = now_ns
                if for_ns > 0:
                    self._move(PENDING, now_ns)
            if self.state != FIRING and now_ns - self.active_at_ns >= for_ns:
                self.fired_at_ns = now_ns
                self.resolved_at_ns = 0
                self._move(FIRING, now_ns)
        elif self.state != INACTIVE:
            self._end(now_ns)

    def no_data(self, now_ns: int, hold_ns: int) -> None:
        """An evaluation with nothing to judge (no samples in the window).  Pending ends; firing
        holds for ``hold_ns`` of no data in a row (an upload may just be late), then resolves."""
        self._evaluated(now_ns)
        self.value = None
        if not self.no_data_since_ns:
            self.no_data_since_ns = now_ns
        held = now_ns - self.no_data_since_ns >= hold_ns
        if self.state == PENDING or (self.state == FIRING and held):
            self._end(now_ns, NO_DATA)

    def failed(self, error: str, now_ns: int) -> None:
        """An evaluation that could not be made: pending ends, firing stays."""
        self._evaluated(now_ns)
        self.failures += 1
        self.last_error = error[:MAX_ERROR_CHARS]
        if self.state == PENDING:
            self._end(now_ns, EVALUATION_FAILED)

    def _evaluated(self, now_ns: int) -> None:
        self.evaluations += 1
        self.last_evaluation_ns = now_ns
        self.last_error = None

    def _end(self, now_ns: int, reason: Optional[str] = None) -> None:
        if self.state == FIRING:
            self.resolved_at_ns = now_ns
        self.active_at_ns = 0
        self._move(INACTIVE, now_ns, reason)

    def _move(self, state: str, now_ns: int, reason: Optional[str] = None) -> None:
        self.state = state
        self.since_ns = now_ns
        entry: Dict[str, Any] = {"state": state, "at": now_ns, "value": self.value}
        if reason:
            entry["reason"] = reason
        self.history.append(entry)
        del self.history[:-HISTORY]

    # -- what receivers know --------------------------------------------------------------

    @property
    def alert(self) -> str:
        return alert_id(self.labels, self.fired_at_ns)

    def follow(self, labels: Dict[str, str], webhooks: List[str], now_ns: int) -> None:
        """Take the rule's labels and webhooks.  Firing, with other ones: the alert receivers
        know ends first (retired); then the state goes on as a new alert."""
        if labels == self.labels and webhooks == self.webhooks:
            return
        same_alert = labels == self.labels and set(webhooks) == set(self.webhooks)
        if not same_alert:
            if self.state == FIRING:
                self._end(now_ns, RULE_CHANGED)
            self.retire(now_ns)
        else:
            for gone in set(self.delivered) - set(webhooks):
                del self.delivered[gone]
        self.labels = dict(labels)
        self.webhooks = list(webhooks)
        for gone in set(self.delivery_errors) - set(webhooks):
            del self.delivery_errors[gone]

    def retire(self, now_ns: int, reason: str = RULE_CHANGED) -> None:
        """End the current alert (a firing one resolves) and keep what its receivers are still
        owed, so that the state can go on for another alert or be dropped."""
        if self.state == FIRING:
            self._end(now_ns, reason)
        owed = [u for u in self.webhooks if _wanted_resolved(self.delivered.get(u) or {})]
        if owed:
            self.retired.append(
                {
                    "alert": self.alert,
                    "labels": dict(self.labels),
                    "annotations": dict(self.annotations),
                    "webhooks": owed,
                    "startsAt": self.fired_at_ns,
                    "endsAt": self.resolved_at_ns or now_ns,
                    "generatorURL": self.generator_url,
                    "delivered": {u: dict(self.delivered[u]) for u in owed},
                    "failures": 0,
                }
            )
            del self.retired[:-MAX_RETIRED]
        self.delivered = {}
        self.delivery_errors = {}

    def succeeded_by(self, uid: str, now_ns: int) -> AlertState:
        """A fresh state for the rule's new ``uid`` (deleted and created again), which keeps
        what this one's receivers are owed."""
        self.retire(now_ns, RULE_DELETED)
        fresh = AlertState(uid=uid)
        fresh.retired = self.retired
        return fresh

    @property
    def done(self) -> bool:
        """Nothing more to send (for a deleted rule's state: it can go)."""
        return not any(True for n in self.notices(0, 0) if n.status is not None)

    # -- notifications --------------------------------------------------------------------

    def wanted(self, url: str, now_ns: int = 0, resend_ns: int = 0) -> Optional[str]:
        """The status to send ``url`` now for the current alert (firing/resolved), or None.
        Alertmanager's own API is sent firing again every ``resend_ns``: it forgets alerts
        not sent again within its resolve_timeout."""
        record = self.delivered.get(url) or {}
        mine = record.get("alert") == self.alert
        if self.state == FIRING:
            if not (mine and record.get("status") == FIRING and record.get("ok")):
                return FIRING
            if resend_ns and is_alertmanager_api(url) and now_ns - record["at"] >= resend_ns:
                return FIRING
            return None
        return _wanted_resolved(record) if mine else None

    def notices(self, now_ns: int, resend_ns: int) -> Iterator[Notice]:
        """Every notification called for (retired alerts first: their resolved goes before a
        new alert to the same receiver), and None for sends no longer wanted."""
        for old in self.retired:
            for url in old["webhooks"]:
                yield Notice(
                    old["alert"],
                    url,
                    _wanted_resolved(old["delivered"].get(url) or {}),
                    old["labels"],
                    old["annotations"],
                    old["startsAt"],
                    old["endsAt"],
                    old["generatorURL"],
                )
        # A retired alert's sends are its own, though the state (deleted, or deleted and made
        # again) still names it.
        if not self.fired_at_ns or any(old["alert"] == self.alert for old in self.retired):
            return
        for url in self.webhooks:
            yield Notice(
                self.alert,
                url,
                self.wanted(url, now_ns, resend_ns),
                self.labels,
                self.annotations,
                self.fired_at_ns,
                self.resolved_at_ns or now_ns,
                self.generator_url,
            )

    def sent(self, alert: str, url: str, status: str, error: Optional[str], at_ns: int) -> None:
        """A send's outcome (``error`` None: the receiver answered 2xx)."""
        self.notifications += 1
        if error is not None:
            self.notification_failures += 1
        for old in self.retired:
            if old["alert"] == alert and url in old["webhooks"]:
                record = old["delivered"].setdefault(url, {})
                _record(record, alert, status, error, at_ns)
                if error is not None:
                    old["failures"] += 1
                break
        else:
            if alert != self.alert or url not in self.webhooks:
                return  # an alert since forgotten
            _record(self.delivered.setdefault(url, {}), alert, status, error, at_ns)
            if error is None:
                self.delivery_errors.pop(url, None)
            else:
                self.delivery_errors[url] = error[:MAX_ERROR_CHARS]
        kept = []
        for old in self.retired:
            if not any(_wanted_resolved(old["delivered"].get(u) or {}) for u in old["webhooks"]):
                continue
            if old["failures"] >= MAX_RETIRED_FAILURES:
                logger.warning(
                    "hotspan: alert %s: gave up sending the resolved of an earlier alert "
                    "(the rule deleted or edited) to %d webhook(s) after %d failures",
                    old.get("labels", {}).get("alertname", "?"),
                    len(old["webhooks"]),
                    old["failures"],
                )
                continue
            kept.append(old)
        self.retired = kept

    # -- JSON -----------------------------------------------------------------------------

    def to_json(self) -> Dict[str, Any]:
        """The stored document's body (times in unix nanoseconds)."""
        return {k: v for k, v in self.__dict__.items()}

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> AlertState:
        known = cls.__dataclass_fields__
        state = cls(**{k: v for k, v in body.items() if k in known})
        if state.state not in STATES:
            state.state = INACTIVE
        # States stored before deliveries carried their alert: {"status", "startsAt"}.
        for record in state.delivered.values():
            if "alert" not in record:
                record["alert"] = state.alert
                record.setdefault("ok", True)
                record.setdefault("at", 0)
                record.setdefault("confirmed", record.get("status"))
        return state

    def to_api(self) -> Dict[str, Any]:
        """The API's view: RFC 3339 times, one entry per webhook."""
        return {
            "state": self.state,
            "value": self.value,
            "summary": self.summary,
            "since": rfc3339(self.since_ns),
            "activeAt": rfc3339(self.active_at_ns),
            "firedAt": rfc3339(self.fired_at_ns),
            "resolvedAt": rfc3339(self.resolved_at_ns),
            "noDataSince": rfc3339(self.no_data_since_ns),
            "lastEvaluation": rfc3339(self.last_evaluation_ns),
            "evaluationSeconds": self.evaluation_s,
            "lastError": self.last_error,
            "generatorURL": self.generator_url or None,
            "evaluations": self.evaluations,
            "history": [_api_history(h) for h in reversed(self.history)],
            "webhooks": [
                {
                    "url": url,
                    "delivered": (self.delivered.get(url) or {}).get("confirmed"),
                    "error": self.delivery_errors.get(url),
                }
                for url in self.webhooks
            ],
            "retired": [
                {
                    "labels": old["labels"],
                    "startsAt": rfc3339(old["startsAt"]),
                    "endsAt": rfc3339(old["endsAt"]),
                    "webhooks": old["webhooks"],
                }
                for old in self.retired
            ],
        }


def _record(
    record: Dict[str, Any], alert: str, status: str, error: Optional[str], at_ns: int
) -> None:
    if record.get("alert") != alert:
        record.clear()
    record.update(alert=alert, status=status, ok=error is None, at=at_ns)
    if error is None:
        record["confirmed"] = status
    else:
        record.setdefault("confirmed", None)


def _api_history(entry: Mapping[str, Any]) -> Dict[str, Any]:
    out = {"state": entry["state"], "at": rfc3339(entry["at"]), "value": entry.get("value")}
    if entry.get("reason"):
        out["reason"] = entry["reason"]
    return out
