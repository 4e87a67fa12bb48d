"""Evaluates every tenant's alert rules on a thread of its own, every ``--alert-interval``.

A pass reads the rules and states from the store, measures each rule's condition over windows
that end ``--alert-lag`` ago (profiles arrive in uploads, stamped when their window began: a
window ending now would miss what is still on its way), moves its state, hands the
notifications the transitions call for to the :class:`~hotspan.alerts.delivery.Dispatcher`
(which sends them on threads of its own: a pass never waits for a receiver), and stores the
states.  Outcomes of sends are taken into the states on the next pass; a receiver that failed
is tried again after a back-off.  A rule deleted while firing gets its resolved notification,
then its state is dropped.

Over a shared store only the server holding the lease (:mod:`~hotspan.alerts.lease`) evaluates,
so each notification goes out once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from hotspan.alerts import RULE_KIND, STATE_KIND
from hotspan.alerts.conditions import measure
from hotspan.alerts.delivery import Dispatcher, Outcome, Send
from hotspan.alerts.lease import Lease
from hotspan.alerts.rules import AlertRule, RuleError, parse_rule, redact_url
from hotspan.alerts.state import FIRING, RULE_DELETED, AlertState, Notice, is_alertmanager_api
from hotspan.alerts.targets import DEADLINE_S, parse_allow
from hotspan.alerts.webhook import api_payload, payload
from hotspan.query.engine import QueryEngine, QueryError
from hotspan.store.base import Store, StoreClosed

log = logging.getLogger(__name__)

SEC = 10**9
LAG_S = 30.0
# Alertmanager forgets a firing alert not sent again within its resolve_timeout (5 min by
# default): its API gets firing alerts again this often, as Prometheus does.
RESEND_S = 60.0
# The lease runs this many intervals: a holder that misses a pass or two keeps it.
LEASE_INTERVALS = 3
# A firing alert without data resolves after this many intervals of none (or its window).
NO_DATA_INTERVALS = 3


def alert_labels(tenant: str, rule: AlertRule) -> Dict[str, str]:
    """The alert's labels: its name, tenant and service (when the selector pins one), then
    the rule's own labels, which may override the service.  Never the name nor the tenant:
    through a shared Alertmanager a tenant's rule must not page as another tenant.  A label
    without a value is no label (Alertmanager drops it), in both of the payload's forms."""
    labels = {"alertname": rule.name, "tenant": tenant}
    if rule.service:
        labels["service_name"] = rule.service
    labels.update((k, v) for k, v in rule.labels.items() if v != "")
    labels["alertname"] = rule.name
    labels["tenant"] = tenant
    return labels


@dataclass
class _Job:
    tenant: str
    name: str
    state: AlertState
    deleted: bool = False


def _uid(body: Mapping[str, Any]) -> str:
    uid = body.get("uid")
    return uid if isinstance(uid, str) else ""


def _send_body(
    tenant: str, notice: Notice, external_url: str, now_ns: int, resend_ns: int
) -> bytes:
    if is_alertmanager_api(notice.url):
        ends = notice.ends_at_ns if notice.status != FIRING else now_ns + 4 * resend_ns
        body: object = api_payload(
            status=notice.status or FIRING,
            labels=notice.labels,
            annotations=notice.annotations,
            starts_at_ns=notice.starts_at_ns,
            ends_at_ns=ends,
            generator_url=notice.generator_url,
        )
    else:
        body = payload(
            tenant=tenant,
            status=notice.status or FIRING,
            labels=notice.labels,
            annotations=notice.annotations,
            starts_at_ns=notice.starts_at_ns,
            ends_at_ns=notice.ends_at_ns,
            generator_url=notice.generator_url,
            external_url=external_url,
        )
    return json.dumps(body).encode()


class AlertLoop:
    def __init__(
        self,
        store: Store,
        engine: QueryEngine,
        interval_s: float,
        external_url: Callable[[], str],
        lag_s: float = LAG_S,
        resend_s: float = RESEND_S,
        webhook_allow: Tuple[str, ...] = (),
    ) -> None:
        self.store = store
        self.webhook_allow = webhook_allow
        self.engine = engine
        self.interval_s = interval_s
        self.external_url = external_url
        self.lag_ns = int(lag_s * SEC)
        self.resend_ns = int(max(resend_s, interval_s) * SEC)
        self._stop = threading.Event()
        # A POST's deadline follows the interval (2 to 10 s): sends do not hold passes up, but
        # a receiver that takes longer than a pass is as good as down.
        self._dispatcher = Dispatcher(
            deadline_s=min(max(interval_s, 2.0), DEADLINE_S), allow=parse_allow(webhook_allow)
        )
        self.lease = Lease(
            store,
            LEASE_INTERVALS * interval_s,
            settle_s=min(0.5, interval_s / 4),
            stop=self._stop,
        )
        self._thread = threading.Thread(target=self._run, name="hotspan-alerts", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._dispatcher.close()
        try:
            self.lease.release()
        except Exception:  # noqa: BLE001 - the store may be closing too; the lease runs out
            log.debug("could not release the alert lease", exc_info=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except StoreClosed:
                return  # the server is stopping
            except Exception:  # noqa: BLE001 - alerting must never take the server down
                log.exception("alert evaluation failed; trying again later")

    # -- one pass ---------------------------------------------------------------------------

    def run_once(self, now_ns: Optional[int] = None) -> None:
        if not self.lease.hold():
            # Another server evaluates; what this one sent before losing the lease is its
            # business now (it sends what the stored states say is owed).
            self._dispatcher.outcomes()
            return
        now_ns = time.time_ns() if now_ns is None else now_ns
        outcomes: Dict[Tuple[str, str], List[Outcome]] = defaultdict(list)
        for outcome in self._dispatcher.outcomes():
            outcomes[outcome.key[:2]].append(outcome)
        states = {(d.tenant, d.name): d.body for d in self.store.documents(STATE_KIND)}
        jobs: List[_Job] = []
        for doc in self.store.documents(RULE_KIND):
            if self._stop.is_set():
                return
            key = (doc.tenant, doc.name)
            body = states.pop(key, None)
            uid = _uid(doc.body)
            state = AlertState.from_json(body) if body else AlertState(uid=uid)
            _take(state, outcomes.pop(key, []))
            if state.uid != uid:
                # Deleted and created again: a new rule, which does not inherit the old alert.
                state = state.succeeded_by(uid, now_ns)
            state = self._evaluate(doc.tenant, doc.name, doc.body, state, now_ns)
            jobs.append(_Job(doc.tenant, doc.name, state))
        for (tenant, name), body in states.items():
            state = AlertState.from_json(body)
            _take(state, outcomes.pop((tenant, name), []))
            state.retire(now_ns, RULE_DELETED)
            jobs.append(_Job(tenant, name, state, deleted=True))
        self._notify(jobs, now_ns)
        for job in jobs:
            if job.deleted and job.state.done:
                self.store.delete_document(job.tenant, STATE_KIND, job.name)
            else:
                self.store.put_document(job.tenant, STATE_KIND, job.name, job.state.to_json())

    def _evaluate(
        self, tenant: str, name: str, body: Mapping[str, Any], state: AlertState, now_ns: int
    ) -> AlertState:
        try:
            # Stored rules were checked when put; a newer server may check more.
            rule = parse_rule(name, {k: v for k, v in body.items() if k != "uid"})
        except RuleError as exc:
            state.failed(f"invalid rule: {exc}", now_ns)
            return state
        state.follow(alert_labels(tenant, rule), list(rule.webhooks), now_ns)
        started = time.monotonic()
        try:
            result = measure(self.engine, tenant, rule, now_ns - self.lag_ns)
        except StoreClosed:
            raise
        except (QueryError, ValueError) as exc:
            state.failed(str(exc), now_ns)
            return state
        except Exception as exc:  # noqa: BLE001 - one rule's failure must not stop the others
            log.warning("alert rule %s/%s: %s", tenant, name, exc, exc_info=True)
            state.failed(f"{type(exc).__name__}: {exc}", now_ns)
            return state
        finally:
            state.evaluation_s = round(time.monotonic() - started, 6)
        was = state.state
        if result.value is None:
            hold_ns = max(rule.condition.window_ns, int(NO_DATA_INTERVALS * self.interval_s * SEC))
            state.no_data(now_ns, hold_ns)
        else:
            state.observe(result.breached, result.value, now_ns, rule.for_ns)
        state.summary = result.summary
        annotations = {"summary": result.summary}
        if result.value is not None:
            annotations["value"] = f"{result.value:.6g}"
        annotations.update(rule.annotations)
        state.annotations = annotations
        if state.state == FIRING and was != FIRING:
            # The link shows what the condition saw when it fired; resolved keeps it.
            state.generator_url = result.link.url(self.external_url())
        return state

    def _notify(self, jobs: List[_Job], now_ns: int) -> None:
        external = self.external_url()
        for job in jobs:
            for notice in job.state.notices(now_ns, self.resend_ns):
                key = (job.tenant, job.name, notice.url)
                if notice.status is None:
                    self._dispatcher.cancel(key, notice.alert)
                    continue
                body = _send_body(job.tenant, notice, external, now_ns, self.resend_ns)
                refused = self._dispatcher.want(Send(key, notice.alert, notice.status, body))
                if refused is not None:
                    log.warning("alert %s/%s: %s", job.tenant, job.name, refused)
                    job.state.delivery_errors[notice.url] = refused


def _take(state: AlertState, outcomes: List[Outcome]) -> None:
    for outcome in outcomes:
        if outcome.error is not None:
            # The URL may hold a password or a token: logs show it redacted, as the API does.
            url = outcome.key[2]
            log.warning(
                "alert %s/%s: %s webhook %s failed: %s",
                outcome.key[0],
                outcome.key[1],
                outcome.status,
                redact_url(url),
                outcome.error.replace(url, redact_url(url)),
            )
        state.sent(outcome.alert, outcome.key[2], outcome.status, outcome.error, outcome.at_ns)
