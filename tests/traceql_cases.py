"""Trace search cases both the HTTP API (tests/server/tempo/test_traces_api.py) and ClickHouse's SQL
(tests/store/test_clickhouse_search.py) are checked on: each query, and which of the five traces
T1..T5 both tests store it finds, newest first."""

from __future__ import annotations

from typing import Dict, List

LEGACY: Dict[str, List[str]] = {
    "service.name=checkout": ["T5", "T2", "T1"],
    "service.name=inventory": ["T4", "T3"],
    'name="GET /stock"': ["T4", "T3"],
    'name="charge card"': ["T1"],
    "http.status_code=500": ["T1"],
    "db.system=postgresql": ["T4", "T2"],
    "deployment.environment=staging": ["T4", "T3"],  # a resource attribute
    "cache.hit=false": ["T3"],
    "status.code=error": ["T4", "T1"],
    "root.service.name=frontend": ["T5"],
    'root.name="GET /cart"': ["T2"],
    # Every tag must hold in the trace, each on any span or resource of it.
    "service.name=checkout payment.provider=stripe": ["T1"],
    "service.name=inventory payment.provider=stripe": [],
    'name="GET /" service.name=checkout': ["T5"],
    "deployment.environment=prod http.status_code=200": ["T5", "T2"],
    "service.name=nobody": [],
    "http.status_code=5": [],  # exact, not a substring
}


TRACEQL: Dict[str, List[str]] = {
    '{resource.service.name="checkout" && name="POST /pay"}': ["T5", "T1"],
    '{resource.service.name="inventory"}': ["T4", "T3"],
    '{.service.name="frontend"}': ["T5"],
    '{resource.deployment.environment="staging"}': ["T4", "T3"],
    '{.deployment.environment="prod" && kind=client}': ["T2", "T1"],
    "{span.http.status_code>=500}": ["T1"],
    "{span.http.status_code >= 400}": ["T3", "T1"],
    "{span.http.status_code<300}": ["T5", "T4", "T2"],
    "{span.http.status_code=200}": ["T5", "T4", "T2"],
    "{span.http.status_code!=200}": ["T3", "T1"],
    "{status=error}": ["T4", "T1"],
    "{status=error && kind=server}": ["T1"],
    "{status!=error && kind=server}": ["T5", "T4", "T3", "T2"],
    "{duration>50ms}": ["T4", "T3", "T1"],
    "{duration>250ms}": ["T4", "T3"],
    "{duration>50ms && kind=client}": ["T4", "T1"],
    "{duration<=5ms}": ["T2"],
    "{}": ["T5", "T4", "T3", "T2", "T1"],
    "{traceDuration>1s}": ["T4"],
    '{resource.service.name="inventory" && traceDuration<1s}': ["T3"],
    '{resource.service.name="checkout" && traceDuration>=50ms && traceDuration<=120ms}': [
        "T5",
        "T1",
    ],
    '{rootServiceName="frontend"}': ["T5"],
    '{rootName="GET /stock"}': ["T4", "T3"],
    "{span.cache.hit=false}": ["T3"],
    # && inside a spanset: one span meets all; {a} && {b}: each by a span of the trace.
    '{span.http.status_code=500 && span.payment.provider="stripe"}': [],
    '{span.http.status_code=500} && {span.payment.provider="stripe"}': ["T1"],
    '{name="GET /stock"} && {span.db.system="postgresql"}': ["T4"],
    '{name="GET /stock" && span.db.system="postgresql"}': [],
    '{resource.service.name="frontend"} && {resource.service.name="checkout"}': ["T5"],
    '{resource.service.name="frontend" && resource.service.name="checkout"}': [],
    '{span.db.system="postgresql"} && {status=error}': ["T4"],
    # Regular expressions, fully anchored as in Tempo.
    '{name=~"GET /.*"}': ["T5", "T4", "T3", "T2"],
    '{name=~"GET"}': [],
    '{name=~"(POST|GET) /(pay|cart)"}': ["T5", "T2", "T1"],
    '{resource.service.name=~"check.*|front.*" && kind=server}': ["T5", "T2", "T1"],
    '{name!~"GET.*" && kind=server}': ["T5", "T1"],
    '{span.payment.provider=~"str.*"}': ["T1"],
    '{span.db.system!~"post.*"}': [],
    '{resource.deployment.environment=~"sta.*"}': ["T4", "T3"],
}
