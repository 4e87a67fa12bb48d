"""The ClickHouse store's documents: agent settings rules (versioned per tenant, read through a
short cache) and the documents of alert and recording rules and API tokens.  Each change is
one more row; reads fold them by version.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hotspan.store.base import Document, SettingsRule
from hotspan.store.batching import GroupCommitWriter
from hotspan.store.clickhouse_connection import ClickHouseURL, Clients, Insert, insert_columns

log = logging.getLogger(__name__)

# Settings rules are read again after this long: a server sees what another wrote within it.
RULES_CACHE_S = 1.0


class ClickHouseDocuments:
    """Settings rules and documents, for :class:`~hotspan.store.clickhouse.ClickHouseStore`."""

    # The store's state that this part reads and changes.
    _clients: Clients
    url: ClickHouseURL
    _writer: GroupCommitWriter
    _rules_lock: threading.Lock
    _rules: Dict[str, Tuple[float, Dict[Tuple[str, str], SettingsRule], int]]
    _rules_changes: Dict[str, int]

    def _load_rules(self, tenant: str) -> Tuple[Dict[Tuple[str, str], SettingsRule], int]:
        with self._rules_lock:
            cached = self._rules.get(tenant)
            if cached is not None and time.monotonic() - cached[0] < RULES_CACHE_S:
                return cached[1], cached[2]
            changes = self._rules_changes.get(tenant, 0)
        fetched_at = time.monotonic()
        rows = self._clients.query(
            "SELECT service, selector, argMax(settings, version), argMax(deleted, version), "
            "max(version), argMax(updated_at, version) FROM settings_rules "
            "WHERE tenant = %(tenant)s GROUP BY service, selector",
            {"tenant": tenant},
        ).result_rows
        rules: Dict[Tuple[str, str], SettingsRule] = {}
        version = 0
        for service, selector, settings, deleted, ver, updated in rows:
            version = max(version, ver)
            if deleted:
                continue
            try:
                rules[(service, selector)] = SettingsRule(
                    service, selector, json.loads(settings), ver, updated
                )
            except ValueError as exc:
                log.error("skipping unreadable settings rule of tenant %s: %s", tenant, exc)
        with self._rules_lock:
            # A change made here while this read ran: the read may predate it, do not keep it.
            if self._rules_changes.get(tenant, 0) == changes:
                self._rules[tenant] = (fetched_at, rules, version)
        return rules, version

    def _fresh_rules(self, tenant: str) -> Tuple[Dict[Tuple[str, str], SettingsRule], int]:
        with self._rules_lock:
            self._rules.pop(tenant, None)
        return self._load_rules(tenant)

    def put_settings_rule(
        self, tenant: str, service: str, selector: str, settings: Mapping[str, Any]
    ) -> SettingsRule:
        text = json.dumps(dict(settings), sort_keys=True)
        # On the writer thread: one change at a time per server, after the pushes before it.
        return self._writer.run(lambda: self._put_rule(tenant, service, selector, text)).result()

    def _put_rule(self, tenant: str, service: str, selector: str, text: str) -> SettingsRule:
        _, version = self._fresh_rules(tenant)
        rule = SettingsRule(service, selector, json.loads(text), version + 1, time.time_ns())
        self._write_rule(tenant, service, selector, text, False, rule.version, rule.updated_at)
        return rule

    def delete_settings_rule(self, tenant: str, service: str, selector: str) -> bool:
        return self._writer.run(lambda: self._delete_rule(tenant, service, selector)).result()

    def _delete_rule(self, tenant: str, service: str, selector: str) -> bool:
        rules, version = self._fresh_rules(tenant)
        if (service, selector) not in rules:
            return False
        self._write_rule(tenant, service, selector, "{}", True, version + 1, time.time_ns())
        return True

    def _write_rule(
        self,
        tenant: str,
        service: str,
        selector: str,
        text: str,
        deleted: bool,
        version: int,
        updated_at: int,
    ) -> None:
        # A delete leaves a row too: it carries the tenant's version forward.  Versions are one
        # more than the highest read; two servers changing one tenant's rules in the same
        # instant may give two changes one number.
        insert_columns(
            self._clients,
            Insert(
                "settings_rules",
                {
                    "tenant": [tenant],
                    "service": [service],
                    "selector": [selector],
                    "settings": [text],
                    "deleted": [int(deleted)],
                    "version": [version],
                    "updated_at": [updated_at],
                },
                ("String", "String", "String", "String", "UInt8", "Int64", "Int64"),
            ),
        )
        with self._rules_lock:
            self._rules_changes[tenant] = self._rules_changes.get(tenant, 0) + 1
            self._rules.pop(tenant, None)

    def settings_rules(self, tenant: str, service: Optional[str] = None) -> List[SettingsRule]:
        rules, _ = self._load_rules(tenant)
        return sorted(
            (r for r in rules.values() if service is None or r.service == service),
            key=lambda r: (r.service, r.selector),
        )

    def settings_version(self, tenant: str) -> int:
        return self._load_rules(tenant)[1]

    # -- documents -----------------------------------------------------------------------------

    def put_document(self, tenant: str, kind: str, name: str, body: Mapping[str, Any]) -> Document:
        text = json.dumps(dict(body), sort_keys=True)

        def put() -> Document:
            _, newest = self._newest_row(tenant, kind, name)
            doc = Document(tenant, kind, name, json.loads(text), _stamp_after(newest))
            self._write_document(doc, text, False)
            return doc

        return self._writer.run(put).result()

    def _newest_row(self, tenant: str, kind: str, name: str) -> Tuple[bool, int]:
        """Whether the document's newest row is a deletion, and that row's stamp (0: none)."""
        rows = self._clients.query(
            "SELECT argMax(deleted, updated_at), max(updated_at) FROM documents "
            "WHERE tenant = %(tenant)s AND kind = %(kind)s AND name = %(name)s",
            {"tenant": tenant, "kind": kind, "name": name},
        ).result_rows
        if not rows or not rows[0][1]:
            return False, 0
        return bool(rows[0][0]), int(rows[0][1])

    def _write_document(self, doc: Document, text: str, deleted: bool) -> None:
        insert_columns(
            self._clients,
            Insert(
                "documents",
                {
                    "tenant": [doc.tenant],
                    "kind": [doc.kind],
                    "name": [doc.name],
                    "body": [text],
                    "deleted": [int(deleted)],
                    "updated_at": [doc.updated_at],
                },
                ("String", "String", "String", "String", "UInt8", "Int64"),
            ),
        )

    def documents(self, kind: str, tenant: Optional[str] = None) -> List[Document]:
        # Rows are folded by the query, not by FINAL: merges happen when ClickHouse likes.
        where = "kind = %(kind)s" + (" AND tenant = %(tenant)s" if tenant is not None else "")
        rows = self._clients.query(
            "SELECT tenant, name, argMax(body, updated_at), argMax(deleted, updated_at), "
            f"max(updated_at) FROM documents WHERE {where} GROUP BY tenant, name "
            "ORDER BY tenant, name",
            {"kind": kind, "tenant": tenant or ""},
        ).result_rows
        out = []
        for doc_tenant, name, body, deleted, updated_at in rows:
            if deleted:
                continue
            try:
                out.append(Document(doc_tenant, kind, name, json.loads(body), updated_at))
            except ValueError as exc:
                log.error("skipping unreadable %s %r of tenant %s: %s", kind, name, tenant, exc)
        return out

    def delete_document(self, tenant: str, kind: str, name: str) -> bool:
        def delete() -> bool:
            deleted, newest = self._newest_row(tenant, kind, name)
            if deleted or not newest:
                return False
            self._write_document(Document(tenant, kind, name, {}, _stamp_after(newest)), "{}", True)
            return True

        return self._writer.run(delete).result()


def _stamp_after(newest: int) -> int:
    """A new row's stamp: newer than the document's newest row (a replacement, a deletion or
    the write that undoes one), even if this server's clock is behind that row's writer's,
    since reads keep the newest stamp."""
    return max(time.time_ns(), newest + 1)
