"""Alerts on profiles: rules a server keeps per tenant, evaluated on a timer, with
notifications to webhooks in Alertmanager's format.

- :mod:`~hotspan.alerts.rules`: a rule's JSON, checked (``RuleError`` names the problem);
- :mod:`~hotspan.alerts.conditions`: what a condition measures, through the query engine;
- :mod:`~hotspan.alerts.state`: an alert's state (inactive, pending, firing) and history;
- :mod:`~hotspan.alerts.webhook`: Alertmanager webhook payloads;
- :mod:`~hotspan.alerts.delivery`: their delivery; :mod:`~hotspan.alerts.targets`: the
  addresses webhooks may reach;
- :mod:`~hotspan.alerts.evaluator`: the loop that evaluates every rule of every tenant;
- :mod:`~hotspan.alerts.metrics`: the alerts as ``hotspan_alert_*`` series for ``/metrics``.

Rules and states are store documents (kinds :data:`RULE_KIND`, :data:`STATE_KIND`), so every
server over a shared store answers the same, whichever one evaluates.
"""

RULE_KIND = "alert_rule"
STATE_KIND = "alert_state"
