"""Notifications in Alertmanager's formats, so that Alertmanager itself, Grafana OnCall and
the chat relays written for Alertmanager take them as they are:

- to a webhook receiver, Alertmanager's webhook JSON (version 4): one rule is one group of one
  alert, ``groupKey`` names the tenant and the rule, ``fingerprint`` hashes the labels as
  Prometheus does;
- to Alertmanager's own API (a URL whose path ends with ``/api/v2/alerts``), what Prometheus
  posts there: a JSON array of alerts (labels, annotations, startsAt, endsAt, generatorURL).
  A firing alert's endsAt is a few re-sends ahead (Alertmanager resolves it then, should this
  server stop sending); a resolved one's is when it ended.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping

from hotspan.alerts.state import FIRING, fingerprint, rfc3339

__all__ = ["fingerprint", "payload", "api_payload"]

RECEIVER = "hotspan"
# What Alertmanager writes for an alert that has not ended.
ZERO_TIME = "0001-01-01T00:00:00Z"


def _quoted(labels: Mapping[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"'.replace("\n", " ") for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def payload(
    *,
    tenant: str,
    status: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    starts_at_ns: int,
    ends_at_ns: int,
    generator_url: str,
    external_url: str,
) -> Dict[str, Any]:
    """The JSON body Alertmanager's webhook_config would POST for one alert."""
    alert = {
        "status": status,
        "labels": dict(labels),
        "annotations": dict(annotations),
        "startsAt": rfc3339(starts_at_ns) or ZERO_TIME,
        "endsAt": ZERO_TIME if status == FIRING else (rfc3339(ends_at_ns) or ZERO_TIME),
        "generatorURL": generator_url,
        "fingerprint": fingerprint(labels),
    }
    group = {"alertname": labels.get("alertname", "")}
    return {
        "version": "4",
        "groupKey": f'{{}}/{{tenant="{tenant}"}}:{_quoted(group)}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": RECEIVER,
        "groupLabels": group,
        "commonLabels": dict(labels),
        "commonAnnotations": dict(annotations),
        "externalURL": external_url,
        "alerts": [alert],
    }


def api_payload(
    *,
    status: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    starts_at_ns: int,
    ends_at_ns: int,
    generator_url: str,
) -> List[Dict[str, Any]]:
    """The body of ``POST /api/v2/alerts`` for one alert (``ends_at_ns``: for a firing alert,
    when Alertmanager may take it as resolved without hearing again).  Empty label values are
    left out, as Prometheus does: Alertmanager takes a label without value as no label."""
    alert: Dict[str, Any] = {
        "labels": {k: v for k, v in labels.items() if v},
        "annotations": dict(annotations),
        "startsAt": rfc3339(starts_at_ns),
        "endsAt": rfc3339(ends_at_ns),
    }
    if generator_url:
        alert["generatorURL"] = generator_url
    return [alert]
