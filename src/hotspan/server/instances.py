"""The last status each agent instance reported, kept in memory.

Agents send it with every upload and poll (``X-Hotspan-Instance`` and
``X-Hotspan-Agent-Status``).  It is only what the operator sees next to the settings (which
instances follow them), so a restart may lose it: the next upload of each agent brings it back.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hotspan.model.agent_settings import MAX_INSTANCE_CHARS, MAX_STATUS_BYTES

MAX_INSTANCES_PER_TENANT = 10_000
# Instances silent this long are dropped (the operator API already hides them after 10 min).
FORGET_AFTER_NS = 3600 * 10**9
# How many records between two sweeps of forgotten instances of every tenant.
_SWEEP_EVERY = 1000


@dataclass(frozen=True)
class Instance:
    service: str
    instance: str
    labels: Mapping[str, str]
    status: Mapping[str, Any]
    last_seen: int  # unix nanoseconds


def _utf8(header: str) -> str:
    # HTTP headers reach Starlette as latin-1; agents send UTF-8 (host names, ...).
    try:
        return header.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return header


def parse_instance(header: Optional[str]) -> Optional[str]:
    """The instance id of an ``X-Hotspan-Instance`` value, or None if it is not one."""
    if header is None:
        return None
    text = _utf8(header).strip()
    if not text or len(text) > MAX_INSTANCE_CHARS or not text.isprintable():
        return None
    return text


def parse_status(header: Optional[str]) -> Optional[Dict[str, Any]]:
    """An ``X-Hotspan-Agent-Status`` value as a dict, or None when absent or malformed: a bad
    status never costs the agent its upload."""
    if header is None or len(header) > MAX_STATUS_BYTES:
        return None
    try:
        status = json.loads(_utf8(header))
    except (ValueError, RecursionError):
        return None
    return status if isinstance(status, dict) else None


class InstanceRegistry:
    """Per tenant, the latest report of at most ``max_per_tenant`` instances (the least
    recently seen go first)."""

    def __init__(self, max_per_tenant: int = MAX_INSTANCES_PER_TENANT) -> None:
        self.max_per_tenant = max_per_tenant
        self._lock = threading.Lock()
        self._tenants: Dict[str, OrderedDict[Tuple[str, str], Instance]] = {}
        self._records = 0

    def record(
        self,
        tenant: str,
        service: str,
        instance: str,
        labels: Mapping[str, str],
        status: Optional[Mapping[str, Any]],
        now_ns: Optional[int] = None,
    ) -> None:
        """Remember a report; without a usable ``status`` the previous one is kept."""
        now = time.time_ns() if now_ns is None else now_ns
        key = (service, instance)
        with self._lock:
            by_key = self._tenants.setdefault(tenant, OrderedDict())
            old = by_key.pop(key, None)
            if status is None:
                status = old.status if old is not None else {}
            by_key[key] = Instance(service, instance, dict(labels), dict(status), now)
            while len(by_key) > self.max_per_tenant:
                by_key.popitem(last=False)
            self._records += 1
            if self._records % _SWEEP_EVERY == 0:
                self._sweep(now - FORGET_AFTER_NS)

    def _sweep(self, before_ns: int) -> None:
        for tenant in list(self._tenants):
            by_key = self._tenants[tenant]
            # Least recently seen first: stop at the first one still wanted.
            while by_key and next(iter(by_key.values())).last_seen < before_ns:
                by_key.popitem(last=False)
            if not by_key:
                del self._tenants[tenant]

    def instances(self, tenant: str, service: str, since_ns: int) -> List[Instance]:
        """The instances of a service seen since ``since_ns``, by instance id."""
        with self._lock:
            found = [
                inst
                for inst in self._tenants.get(tenant, {}).values()
                if inst.service == service and inst.last_seen >= since_ns
            ]
        return sorted(found, key=lambda i: i.instance)
