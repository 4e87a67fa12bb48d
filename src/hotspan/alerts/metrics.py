"""The alerts as Prometheus series, for the server's ``/metrics``.

:func:`alert_metric_families` reads the rules and states from the store (so any server over a
shared store answers, whichever evaluates) and returns plain families; :func:`collect` turns
them into ``prometheus_client`` metric families for a custom collector::

    hotspan_alert_state{tenant, alertname, state="inactive|pending|firing"}   1 for the current
    hotspan_alert_value{tenant, alertname}                     the condition's last value
    hotspan_alert_last_evaluation_timestamp_seconds{tenant, alertname}
    hotspan_alert_evaluations_total{tenant, alertname}
    hotspan_alert_evaluation_failures_total{tenant, alertname}
    hotspan_alert_notifications_total{tenant, alertname}
    hotspan_alert_notification_failures_total{tenant, alertname}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from hotspan.alerts import RULE_KIND, STATE_KIND
from hotspan.alerts.state import STATES, AlertState
from hotspan.store.base import Store

Sample = Tuple[Dict[str, str], float]


@dataclass
class MetricFamily:
    """``name`` is the series name without ``_total``; ``type`` is gauge or counter."""

    name: str
    type: str
    help: str
    samples: List[Sample] = field(default_factory=list)


def alert_metric_families(store: Store, tenant: Optional[str] = None) -> List[MetricFamily]:
    """The ``hotspan_alert_*`` families of every rule (of one tenant, or all)."""
    state = MetricFamily(
        "hotspan_alert_state",
        "gauge",
        "1 for the alert's current state (inactive, pending, firing)",
    )
    value = MetricFamily(
        "hotspan_alert_value",
        "gauge",
        "the value of the alert rule's condition at its last evaluation",
    )
    last = MetricFamily(
        "hotspan_alert_last_evaluation_timestamp_seconds",
        "gauge",
        "when the alert rule was last evaluated (unix seconds)",
    )
    counters = [
        ("evaluations", "hotspan_alert_evaluations", "evaluations of the alert rule"),
        ("failures", "hotspan_alert_evaluation_failures", "evaluations that failed"),
        ("notifications", "hotspan_alert_notifications", "webhook notifications sent"),
        (
            "notification_failures",
            "hotspan_alert_notification_failures",
            "webhook notifications that failed",
        ),
    ]
    counter_families = [MetricFamily(name, "counter", text) for _, name, text in counters]
    states = {(d.tenant, d.name): d.body for d in store.documents(STATE_KIND, tenant)}
    for doc in store.documents(RULE_KIND, tenant):
        body = states.get((doc.tenant, doc.name))
        uid = doc.body.get("uid")
        if body and uid and body.get("uid") not in (None, "", uid):
            body = None  # the state of a rule since deleted and made again under this name
        st = AlertState.from_json(body) if body else AlertState()
        labels = {"tenant": doc.tenant, "alertname": doc.name}
        for name in STATES:
            state.samples.append(({**labels, "state": name}, 1.0 if st.state == name else 0.0))
        if st.value is not None:
            value.samples.append((labels, float(st.value)))
        if st.last_evaluation_ns:
            last.samples.append((labels, st.last_evaluation_ns / 1e9))
        for (attr, _, _), family in zip(counters, counter_families):
            family.samples.append((labels, float(getattr(st, attr))))
    return [state, value, last, *counter_families]


def collect(store: Store, tenant: Optional[str] = None) -> Iterator[Any]:
    """The families as ``prometheus_client`` metric families (``GaugeMetricFamily``,
    ``CounterMetricFamily``), for a collector's ``collect()``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for family in alert_metric_families(store, tenant):
        names = sorted({k for labels, _ in family.samples for k in labels}) or [
            "tenant",
            "alertname",
        ]
        cls = CounterMetricFamily if family.type == "counter" else GaugeMetricFamily
        out = cls(family.name, family.help, labels=names)
        for labels, number in family.samples:
            out.add_metric([labels.get(n, "") for n in names], number)
        yield out
