"""The embedded store's documents: agent settings rules (all in memory, versioned per tenant)
and the documents of alert and recording rules and API tokens.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import duckdb

from hotspan.store.base import Document, SettingsRule
from hotspan.store.batching import GroupCommitWriter
from hotspan.store.duckdb_schema import transaction


class DuckDBDocuments:
    """Settings rules and documents, for :class:`~hotspan.store.duckdb.DuckDBStore`."""

    # The store's state that this part reads and changes (and its cursor).
    path: str
    _con: duckdb.DuckDBPyConnection
    _writer: GroupCommitWriter
    _rules: Dict[str, Dict[Tuple[str, str], SettingsRule]]
    _versions: Dict[str, int]
    _cursor: Callable[[], duckdb.DuckDBPyConnection]

    def put_settings_rule(
        self, tenant: str, service: str, selector: str, settings: Mapping[str, Any]
    ) -> SettingsRule:
        text = json.dumps(dict(settings), sort_keys=True)
        # On the writer thread: the one connection that writes is never used by two threads.
        return self._writer.run(lambda: self._put_rule(tenant, service, selector, text)).result()

    def _put_rule(self, tenant: str, service: str, selector: str, text: str) -> SettingsRule:
        version = self._versions.get(tenant, 0) + 1
        rule = SettingsRule(service, selector, json.loads(text), version, time.time_ns())
        self._settings_transaction(
            tenant,
            version,
            "INSERT INTO settings_rules VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "settings = excluded.settings, version = excluded.version, "
            "updated_at = excluded.updated_at",
            [tenant, service, selector, text, version, rule.updated_at],
        )
        rules = dict(self._rules.get(tenant, {}))
        rules[(service, selector)] = rule
        self._rules[tenant] = rules
        return rule

    def delete_settings_rule(self, tenant: str, service: str, selector: str) -> bool:
        return self._writer.run(lambda: self._delete_rule(tenant, service, selector)).result()

    def _delete_rule(self, tenant: str, service: str, selector: str) -> bool:
        if (service, selector) not in self._rules.get(tenant, {}):
            return False
        self._settings_transaction(
            tenant,
            self._versions.get(tenant, 0) + 1,
            "DELETE FROM settings_rules WHERE tenant = ? AND service = ? AND selector = ?",
            [tenant, service, selector],
        )
        rules = dict(self._rules[tenant])
        del rules[(service, selector)]
        self._rules[tenant] = rules
        return True

    def _settings_transaction(self, tenant: str, version: int, sql: str, params: list) -> None:
        """``sql`` and the tenant's new version in one transaction (writer thread)."""
        con = self._con
        with transaction(con):
            con.execute(sql, params)
            con.execute(
                "INSERT INTO settings_versions VALUES (?, ?) "
                "ON CONFLICT DO UPDATE SET version = excluded.version",
                [tenant, version],
            )
        self._versions[tenant] = version

    def settings_rules(self, tenant: str, service: Optional[str] = None) -> List[SettingsRule]:
        rules = self._rules.get(tenant, {})
        return sorted(
            (r for r in rules.values() if service is None or r.service == service),
            key=lambda r: (r.service, r.selector),
        )

    def settings_version(self, tenant: str) -> int:
        return self._versions.get(tenant, 0)

    # -- documents ---------------------------------------------------------------------------

    def put_document(self, tenant: str, kind: str, name: str, body: Mapping[str, Any]) -> Document:
        text = json.dumps(dict(body), sort_keys=True)
        doc = Document(tenant, kind, name, json.loads(text), time.time_ns())
        self._writer.run(
            lambda: self._con.execute(
                "INSERT INTO documents VALUES (?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                "body = excluded.body, updated_at = excluded.updated_at",
                [tenant, kind, name, text, doc.updated_at],
            )
        ).result()
        return doc

    def documents(self, kind: str, tenant: Optional[str] = None) -> List[Document]:
        sql = "SELECT tenant, name, body, updated_at FROM documents WHERE kind = ?"
        params: List[Any] = [kind]
        if tenant is not None:
            sql += " AND tenant = ?"
            params.append(tenant)
        rows = self._cursor().execute(sql + " ORDER BY tenant, name", params).fetchall()
        return [Document(t, kind, name, json.loads(body), at) for t, name, body, at in rows]

    def delete_document(self, tenant: str, kind: str, name: str) -> bool:
        def delete() -> bool:
            found = self._con.execute(
                "DELETE FROM documents WHERE tenant = ? AND kind = ? AND name = ? RETURNING 1",
                [tenant, kind, name],
            ).fetchall()
            return bool(found)

        return self._writer.run(delete).result()
