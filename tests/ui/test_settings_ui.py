"""Agent settings of a service in a real Chromium, against the real server's operator API.

An operator opens the Settings of "checkout" from the profile explorer's service picker, puts a
rule for ``{env="prod"}`` through the form, sees the server refuse a sample rate of 5000 with
its reason (nothing changed), and watches the instances that upload over real HTTP with the
agent's ``X-Hotspan-Instance`` and ``X-Hotspan-Agent-Status`` headers: the one that applied the
rule's version follows it, the one that did not is shown as not following, and the one no rule
matches follows its own configuration.  Deleting the rule turns the first into one that no
longer follows (it still applies the deleted rule's version).
"""

from __future__ import annotations

import json
import re
import time
from typing import Iterator, Optional
from urllib.parse import quote

import httpx
import pytest

from hotspan.model.agent_settings import INSTANCE_HEADER, STATUS_HEADER
from tests.conftest import RunningServer, running_server
from tests.helpers import ingest_pprof, make_pprof
from tests.ui.conftest import screenshot

SERVICE = "checkout"
PROD = '{env="prod"}'
API = f"/api/v1/settings/{SERVICE}"


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("ui-settings") / "data") as server:
        # An ordinary upload (no agent headers), so that the explorer lists the service.
        with server.client() as client:
            body = make_pprof([(["main.handle", "main.serve"], 10_000_000, {})])
            answer = ingest_pprof(client, f"{SERVICE}{{env=prod}}", body, int(time.time()) - 60)
            assert answer.status_code == 200, answer.text
        yield server


def status(settings_version: int, **changes: object) -> dict:
    """An agent's report, as the agent sends it (the spec's keys and one unknown extra)."""
    out = {
        "settings_version": settings_version,
        "enabled": True,
        "sample_rate": 25,
        "configured_rate": 50,
        "profile_types": ["cpu", "wall"],
        "max_overhead": 2.0,
        "overhead": 2.5,
        "shed_seconds": 12.0,
        "rate_reason": "budget",
        "dropped_samples": 7,
        "dropped_uploads": 1,
        "hostname": "web-1",
        "pid": 101,
        "version": "0.14.0",
        "conditional_only": False,
        "future_key": "kept as given",
    }
    out.update(changes)
    return out


def upload(client: httpx.Client, instance: str, env: str, report: dict) -> dict:
    """One upload as the agent makes it; the server's answer (the settings it should apply)."""
    body = make_pprof([(["main.handle", "main.serve"], 10_000_000, {})])
    answer = ingest_pprof(
        client,
        f"{SERVICE}{{env={env}}}",
        body,
        int(time.time()) - 10,
        headers={
            INSTANCE_HEADER: instance,
            STATUS_HEADER: json.dumps(report, separators=(",", ":")),
        },
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json"), answer.headers
    return answer.json()


def rules_of(client: httpx.Client) -> list:
    answer = client.get(API)
    assert answer.status_code == 200, answer.text
    return answer.json()["rules"]


def instance_row(page, instance: str):  # type: ignore[no-untyped-def]
    return page.locator(f'tr.hs-instance-row[data-instance="{instance}"]')


def wait_follows(page, instance: str, follows: bool, timeout: float = 15_000) -> None:  # type: ignore[no-untyped-def]
    """Waits (through the view's own refresh, never a reload) for the instance's follows cell."""
    page.wait_for_function(
        """([instance, follows]) => {
            const row = [...document.querySelectorAll('tr.hs-instance-row')]
                .find((r) => r.dataset.instance === instance);
            const cell = row && row.querySelector('.hs-inst-follows');
            return cell && cell.dataset.follows === follows;
        }""",
        arg=[instance, "true" if follows else "false"],
        timeout=timeout,
    )


def put_through_form(page, selector: str, sample_rate: str, max_overhead: Optional[str] = None):  # type: ignore[no-untyped-def]
    form = page.locator("form.hs-rule-form")
    form.locator("input.hs-rule-selector").fill(selector)
    form.locator('select[name="enabled"]').select_option("true")
    form.locator('input[name="sample_rate"]').fill(sample_rate)
    for box in form.locator('input[name="profile_types"]').all():
        box.set_checked(box.get_attribute("value") in ("cpu", "wall"))
    form.locator('input[name="alloc_sample_bytes"]').fill("524288")
    form.locator('select[name="conditional_only"]').select_option("false")
    form.locator('input[name="slow_request_threshold"]').fill("0.5")
    if max_overhead is not None:
        form.locator('input[name="max_overhead"]').fill(max_overhead)
    with page.expect_response(lambda r: r.url.endswith(API) and r.request.method == "PUT") as info:
        form.locator("button.hs-rule-save").click()
    return info.value


def test_settings_of_a_service(page, srv) -> None:  # type: ignore[no-untyped-def]
    client = srv.client()

    # Reached from the explorer's service picker.
    page.goto(srv.url + "/profiles?query=" + quote(f'{{service_name="{SERVICE}"}}'))
    link = page.locator("a.hs-service-settings")
    link.wait_for()
    link.click()
    page.wait_for_url(re.compile(rf"/settings/{SERVICE}$"))
    assert page.locator("h1.hs-title").inner_text() == f"Settings · {SERVICE}"
    page.locator(".hs-settings-rules .hs-message.hs-empty").wait_for()
    page.locator(".hs-settings-instances .hs-message.hs-empty").wait_for()
    # The selector field offers the labels this service's profiles carry.
    page.wait_for_function(
        "() => document.querySelectorAll('#hs-settings-selectors option').length"
    )
    offered = page.eval_on_selector_all(
        "#hs-settings-selectors option", "os => os.map(o => o.value)"
    )
    assert PROD in offered, offered
    assert page.get_attribute("input.hs-rule-selector", "list") == "hs-settings-selectors"

    # A rule through the form.
    answer = put_through_form(page, PROD, "50", max_overhead="2")
    assert answer.status == 200, answer.text()
    row = page.locator(f"tr.hs-rule-row[data-selector='{PROD}']")
    row.wait_for()
    stored = rules_of(client)
    assert len(stored) == 1, stored
    rule = stored[0]
    expected = {
        "enabled": True,
        "sample_rate": 50,
        "profile_types": ["cpu", "wall"],
        "alloc_sample_bytes": 524288,
        "conditional_only": False,
        "slow_request_threshold": 0.5,
        "max_overhead": 2.0,
    }
    assert rule["selector"] == PROD and rule["settings"] == expected, rule
    version = rule["version"]
    assert version >= 1
    chips = row.locator(".hs-setting-chip").all_inner_texts()
    assert "sample_rate=50" in chips and "profile_types=cpu,wall" in chips, chips
    assert row.locator(".hs-rule-version").inner_text() == str(version)
    assert "Saved" in page.locator(".hs-rule-result").inner_text()

    # A value out of range: the server's reason, inline, and nothing changed.
    answer = put_through_form(page, PROD, "5000")
    assert answer.status == 400, answer.text()
    error = page.locator(".hs-rule-result .hs-rule-error")
    error.wait_for()
    reason = error.inner_text()
    assert "sample_rate" in reason and "5000" in reason, reason
    assert rules_of(client) == [rule]
    assert row.locator(".hs-rule-version").inner_text() == str(version)
    screenshot(page, "settings_refused")

    # Instances that upload with the agent's headers, over real HTTP.
    told = upload(client, "web-1/101/ab12", "prod", status(0))
    assert told == {"version": version, "settings": expected}, told
    # web-1 applies what it was told; web-2 has not (an agent that ignores the server);
    # web-3 is in an env no rule selects, so it follows its own configuration.
    upload(client, "web-1/101/ab12", "prod", status(told["version"]))
    upload(client, "web-2/102/cd34", "prod", status(0, hostname="web-2", pid=102, rate_reason=""))
    assert upload(client, "web-3/103/ef56", "dev", status(0, hostname="web-3")) == {
        "version": 0,
        "settings": None,
    }
    wait_follows(page, "web-1/101/ab12", True)
    wait_follows(page, "web-2/102/cd34", False)
    wait_follows(page, "web-3/103/ef56", True)
    web1 = instance_row(page, "web-1/101/ab12")
    versions = web1.locator(".hs-inst-versions").inner_text()
    assert versions == f"applies v{version}, expected v{version}", versions
    assert PROD in web1.locator(".hs-inst-rule").inner_text()
    assert "env=prod" in web1.locator(".hs-inst-labels").inner_text()
    rate = web1.locator(".hs-inst-rate").inner_text()
    assert "25 Hz" in rate and "50 configured" in rate and "budget" in rate, rate
    assert web1.locator(".hs-inst-overhead").inner_text() == "2.5% of 2% budget"
    assert web1.locator(".hs-inst-shed").inner_text() == "12 s"
    assert web1.locator(".hs-inst-dropped").inner_text() == "7 samples · 1 uploads"
    assert web1.locator(".hs-inst-enabled").inner_text() == "on"
    assert web1.locator(".hs-inst-conditional").inner_text() == "off"
    web2 = instance_row(page, "web-2/102/cd34")
    assert web2.locator(".hs-inst-versions").inner_text() == f"applies v0, expected v{version}"
    web3 = instance_row(page, "web-3/103/ef56")
    assert web3.locator(".hs-inst-versions").inner_text() == "applies v0, expected v0"
    assert "no rule" in web3.locator(".hs-inst-rule").inner_text()
    # An agent that shut down, with an old settings version and a last report over budget:
    # greyed as stopped, not flagged as not following, no rate or budget shown.
    upload(
        client,
        "web-4/104/aa00",
        "prod",
        status(0, hostname="web-4", pid=104, stopped=True, sample_rate=0, overhead=68.2),
    )
    web4 = instance_row(page, "web-4/104/aa00")
    web4.locator(".hs-inst-stopped-badge").wait_for()
    assert "hs-inst-stopped" in (web4.get_attribute("class") or "")
    assert "hs-not-following" not in (web4.get_attribute("class") or "")
    text = web4.inner_text()
    assert "stopped" in text and "does not follow" not in text and "budget" not in text, text
    assert "web-4" in web4.locator(".hs-inst-name").inner_text()
    assert page.eval_on_selector(
        'tr[data-instance="web-4/104/aa00"]', "r => getComputedStyle(r).color"
    ) != page.eval_on_selector(
        'tr[data-instance="web-1/101/ab12"]', "r => getComputedStyle(r).color"
    )
    screenshot(page, "settings_instances")

    # The index lists the service, by URL through the router.
    page.goto(srv.url + "/settings")
    page.locator(f'tr[data-service="{SERVICE}"] a').click()
    page.wait_for_url(re.compile(rf"/settings/{SERVICE}$"))
    row.wait_for()

    # Edit fills the form with the rule.
    row.locator("button.hs-rule-edit").click()
    assert page.locator("input.hs-rule-selector").input_value() == PROD
    assert page.locator('input[name="sample_rate"]').input_value() == "50"

    # Delete (asks once more), and the rule is gone from the page and the server.
    row.locator("button.hs-rule-delete").click()
    with page.expect_response(lambda r: API in r.url and r.request.method == "DELETE") as info:
        row.locator("button.hs-rule-delete", has_text="Confirm delete").click()
    assert info.value.status == 200, info.value.text()
    row.wait_for(state="detached")
    page.locator(".hs-settings-rules .hs-message.hs-empty").wait_for()
    assert rules_of(client) == []
    # web-1 still applies the deleted rule's version: no longer what the server expects.
    wait_follows(page, "web-1/101/ab12", False)
    client.close()
