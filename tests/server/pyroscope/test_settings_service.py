"""Pyroscope's settings API over real HTTP, as Grafana's Profiles Drilldown calls it: its
``pluginSettings`` saved and read back, stamps that keep the later save, one tenant's settings
apart from another's, and what is refused."""

from __future__ import annotations

import json
import time
import uuid
from typing import Dict

import httpx

SETTINGS = "/settings.v1.SettingsService"


def call(c: httpx.Client, method: str, body: object, tenant: str) -> httpx.Response:
    return c.post(f"{SETTINGS}/{method}", json=body, headers={"X-Scope-OrgID": tenant})


def stored(c: httpx.Client, tenant: str) -> Dict[str, dict]:
    r = call(c, "Get", {}, tenant)
    assert r.status_code == 200, r.text
    return {s["name"]: s for s in r.json().get("settings", [])}


def test_drilldown_saves_and_reads_its_settings(module_server) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    plugin = json.dumps({"maxNodes": 16384, "enableFlameGraphDotComExport": True})
    with module_server.client() as c:
        r = call(c, "Get", {}, tenant)
        assert r.status_code == 200 and r.json() == {}, r.text  # protojson: no empty list
        before = int(time.time() * 1000)
        # As a browser's fetch sends a string body: text/plain.
        r = c.post(
            f"{SETTINGS}/Set",
            content=json.dumps({"setting": {"name": "pluginSettings", "value": plugin}}),
            headers={"X-Scope-OrgID": tenant, "content-type": "text/plain;charset=UTF-8"},
        )
        assert r.status_code == 200, r.text
        saved = r.json()["setting"]
        # int64 in protojson: a string; no stamp sent, so stamped now.
        assert saved["name"] == "pluginSettings" and saved["value"] == plugin
        assert isinstance(saved["modifiedAt"], str) and int(saved["modifiedAt"]) >= before
        assert stored(c, tenant) == {"pluginSettings": saved}
        # Another tenant sees none of it.
        assert stored(c, tenant + "-other") == {}


def test_a_save_stamped_older_than_the_stored_one_is_refused(module_server) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    with module_server.client() as c:
        new = {"setting": {"name": "x", "value": "new", "modifiedAt": "2000"}}
        assert call(c, "Set", new, tenant).status_code == 200
        old = {"setting": {"name": "x", "value": "old", "modifiedAt": 1000}}
        r = call(c, "Set", old, tenant)
        assert r.status_code == 409 and r.json()["code"] == "already_exists", r.text
        assert stored(c, tenant)["x"]["value"] == "new"
        same = {"setting": {"name": "x", "value": "same", "modifiedAt": 2000}}
        assert call(c, "Set", same, tenant).status_code == 200
        assert stored(c, tenant)["x"] == {"name": "x", "value": "same", "modifiedAt": "2000"}
        # A delete is stamped now: later than any stamp of 2000.
        r = call(c, "Delete", {"name": "x"}, tenant)
        assert r.status_code == 200 and r.json() == {}, r.text
        assert stored(c, tenant) == {}
        assert call(c, "Delete", {"name": "x"}, tenant).status_code == 200  # already gone
        # A setting stamped ahead (another machine's clock): a save without a stamp is
        # stamped at it, not refused; a delete, stamped now, is refused until then.
        ahead = str(int(time.time() * 1000) + 600_000)
        future = {"setting": {"name": "y", "value": "1", "modifiedAt": ahead}}
        assert call(c, "Set", future, tenant).status_code == 200
        r = call(c, "Set", {"setting": {"name": "y", "value": "2"}}, tenant)
        assert r.status_code == 200 and r.json()["setting"]["modifiedAt"] == ahead
        r = call(c, "Delete", {"name": "y"}, tenant)
        assert r.status_code == 409 and r.json()["code"] == "already_exists", r.text
        assert stored(c, tenant)["y"]["value"] == "2"
        # Over an hour ahead would keep a setting for good: refused.
        for stamp in ("99999999999999", "9223372036854775807"):
            far = {"setting": {"name": "z", "value": "1", "modifiedAt": stamp}}
            r = call(c, "Set", far, tenant)
            assert r.status_code == 400 and "ahead" in r.json()["message"], r.text
        assert "z" not in stored(c, tenant)


def test_bad_requests_get_connect_errors(module_server) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    bad = [
        ("Set", {}),
        ("Set", {"setting": "x"}),
        ("Set", {"setting": {"value": "v"}}),
        ("Set", {"setting": {"name": "", "value": "v"}}),
        ("Set", {"setting": {"name": "n" * 300, "value": "v"}}),
        ("Set", {"setting": {"name": "a\x00b", "value": "v"}}),
        ("Set", {"setting": {"name": "n", "value": 5}}),
        ("Set", {"setting": {"name": "n", "value": "v", "modifiedAt": "soon"}}),
        ("Set", {"setting": {"name": "n", "value": "v", "modifiedAt": 2**70}}),
        ("Set", {"setting": {"name": "n", "value": "v", "modifiedAt": True}}),
        ("Set", {"setting": {"name": "n", "value": "v", "modifiedAt": "1_000"}}),
        ("Set", {"setting": {"name": "n", "value": "v", "modifiedAt": " 12"}}),
        ("Set", [1]),
        ("Delete", {}),
        ("Delete", {"name": 7}),
    ]
    with module_server.client() as c:
        for method, body in bad:
            r = call(c, method, body, tenant)
            assert r.status_code == 400, (method, body, r.status_code, r.text)
            assert r.json()["code"] == "invalid_argument", r.text
        r = c.post(f"{SETTINGS}/Set", content=b"{", headers={"X-Scope-OrgID": tenant})
        assert r.status_code == 400
        # A lone surrogate (JSON may escape one; UTF-8 cannot hold it), in a value or a name.
        for raw in (
            b'{"setting": {"name": "n", "value": "\\ud800"}}',
            b'{"setting": {"name": "a\\ud800", "value": "v"}}',
        ):
            r = c.post(f"{SETTINGS}/Set", content=raw, headers={"X-Scope-OrgID": tenant})
            assert r.status_code == 400 and "UTF-8" in r.text, r.text
        r = c.post(
            f"{SETTINGS}/Get", content=b"\x00", headers={"content-type": "application/proto"}
        )
        assert r.status_code == 415
        huge = {"setting": {"name": "n", "value": "v" * (64 * 1024 + 1)}}
        assert call(c, "Set", huge, tenant).status_code == 413
        assert stored(c, tenant) == {}
        # 64 KiB of quotes arrive escaped, twice the bytes: still a value of 64 KiB.
        quotes = {"setting": {"name": "q", "value": '"' * (64 * 1024)}}
        assert call(c, "Set", quotes, tenant).status_code == 200
        assert stored(c, tenant)["q"]["value"] == '"' * (64 * 1024)
        assert call(c, "Set", {"setting": {"name": "z", "value": None}}, tenant).status_code == 200


def test_a_tenant_keeps_at_most_100_settings(module_server) -> None:  # type: ignore[no-untyped-def]
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    with module_server.client() as c:
        for i in range(100):
            r = call(c, "Set", {"setting": {"name": f"s{i:03}", "value": str(i)}}, tenant)
            assert r.status_code == 200, r.text
        r = call(c, "Set", {"setting": {"name": "one-more", "value": "x"}}, tenant)
        assert r.status_code == 400 and "at most 100" in r.text, r.text
        # Changing one that is there still works.
        assert (
            call(c, "Set", {"setting": {"name": "s000", "value": "y"}}, tenant).status_code == 200
        )
        assert len(stored(c, tenant)) == 100
