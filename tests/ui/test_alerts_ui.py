"""The Alerts page in a real Chromium, against a real server's alerts API and evaluator.

An operator adds a rule through the form and sees it listed with its state; the server refuses
a bad rule (in the fields, and as JSON) and the page shows its reason, nothing changed; Delete
takes the rule away.  A rule on data pushed over HTTP, where one function has most of the CPU,
fires under the server's own evaluation loop (started with a one-second interval) and the page
shows it firing, its value and the history of its transitions, which the page picks up by its
own refresh; raised through Edit, it resolves.  At 360 and 390 px in dark mode the page never
scrolls sideways.
"""

from __future__ import annotations

import json
import re
import time
from typing import Iterator, List

import httpx
import pytest
from playwright.sync_api import expect

from tests.conftest import RunningServer, running_server
from tests.helpers import ingest_pprof, make_pprof
from tests.ui.conftest import screenshot
from tests.ui.test_layout_ui import OFFSCREEN, STICKING_OUT, luminance

SERVICE = "checkout"
SELECTOR = f'{{service_name="{SERVICE}"}}'
RULES = "/api/v1/alerts/rules"


def push_profiles(client: httpx.Client) -> None:
    """A minute of CPU where ``app.hot_loop`` takes 80% of the service's CPU."""
    body = make_pprof(
        [
            (["app.hot_loop", "app.handle", "app.main"], 800_000_000, {}),
            (["app.render", "app.handle", "app.main"], 200_000_000, {}),
        ]
    )
    now = int(time.time())
    for start in (now - 50, now - 30, now - 10):
        answer = ingest_pprof(client, f"{SERVICE}{{env=prod}}", body, start)
        assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data = tmp_path_factory.mktemp("ui-alerts") / "data"
    # The form's webhook is a receiver on this machine: loopback, which only an operator's
    # allow list lets rules reach.
    args = ["--alert-interval", "1s", "--alert-lag", "1s", "--alert-webhook-allow", "127.0.0.0/8"]
    with running_server(data, args) as server:
        with server.client() as client:
            push_profiles(client)
        yield server


def rules_of(client: httpx.Client) -> List[dict]:
    answer = client.get(RULES)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return body["rules"] if isinstance(body, dict) else body


def card(page, name: str):  # type: ignore[no-untyped-def]
    return page.locator(f'article.hs-alert[data-name="{name}"]')


def fill_function_share(page, name: str, function: str, above: str, window: str = "1h") -> None:  # type: ignore[no-untyped-def]
    form = page.locator("form.hs-alert-form")
    form.locator('input[name="name"]').fill(name)
    form.locator('input[name="selector"]').fill(SELECTOR)
    form.locator('select[name="kind"]').select_option("function_share")
    fields = form.locator('.hs-alert-kind-fields[data-kind="function_share"]')
    fields.locator('input[name="function"]').fill(function)
    fields.locator('input[name="above"]').fill(above)
    fields.locator('input[name="window"]').fill(window)


def save(page):  # type: ignore[no-untyped-def]
    with page.expect_response(lambda r: f"{RULES}/" in r.url and r.request.method == "PUT") as info:
        page.locator("button.hs-alert-save").click()
    return info.value


def test_the_selector_field_offers_the_services_and_their_labels(page, srv) -> None:  # type: ignore[no-untyped-def]
    page.goto(srv.url + "/alerts")
    field = page.locator('.hs-alert-form input[name="selector"]')
    assert field.get_attribute("list") == "hs-alert-selectors"
    page.wait_for_function(
        "() => document.querySelectorAll('#hs-alert-selectors option').length >= 2"
    )
    offered = page.eval_on_selector_all("#hs-alert-selectors option", "os => os.map(o => o.value)")
    assert SELECTOR in offered and '{service_name="checkout", env="prod"}' in offered, offered


def test_a_rule_is_previewed_before_it_is_saved(page, srv) -> None:  # type: ignore[no-untyped-def]
    page.goto(srv.url + "/alerts")
    # hot_loop holds 80% of the last minute's CPU: above 50% it holds at the latest moments.
    fill_function_share(page, "preview-only", r"^app\.hot_loop$", "50", window="5m")
    preview = page.locator(".hs-alert-preview")
    # The profiles pushed as the module started are committed a moment later: previewed
    # again until the latest moment sees them.
    deadline = time.monotonic() + 20
    while True:
        page.locator("button.hs-alert-preview-button").click()
        preview.wait_for()
        if page.locator(".hs-preview-bar.hs-preview-held").count() or time.monotonic() > deadline:
            break
        page.wait_for_timeout(500)
    bars = page.locator(".hs-preview-bar")
    assert bars.count() == 12
    assert page.locator(".hs-preview-bar.hs-preview-held").count() >= 1, preview.inner_text()
    text = preview.inner_text()
    assert re.search(r"would have held at \d+ of 12 moments; its value now: 80(\.0)?%", text), text
    screenshot(page, "alerts-preview")
    # Nothing was saved.
    assert all(r.get("name") != "preview-only" for r in rules_of(srv.client()))


def test_add_refuse_and_delete_a_rule(page, srv) -> None:  # type: ignore[no-untyped-def]
    client = srv.client()
    page.goto(srv.url + "/profiles")
    page.locator('.hs-nav a[data-nav="alerts"]').click()
    page.wait_for_url(re.compile(r"/alerts$"))
    assert page.locator("h1.hs-title").inner_text() == "Alerts"
    page.locator(".hs-alerts-list .hs-message.hs-empty").wait_for()

    # A rule through the form: labels, annotations and a webhook as well.
    fill_function_share(page, "render-share", r"^app\.render$", "90")
    form = page.locator("form.hs-alert-form")
    form.locator('input[name="for"]').fill("2m")
    form.locator('textarea[name="labels"]').fill("severity=ticket\nteam=checkout")
    form.locator('textarea[name="annotations"]').fill("summary=render is slow")
    form.locator('textarea[name="webhooks"]').fill("http://127.0.0.1:9/hook")
    answer = save(page)
    assert answer.status in (200, 201), answer.text()
    # The page writes its verdict once it has read the answer's body, after the response
    # event: wait for it.
    expect(page.locator(".hs-alert-result")).to_contain_text("Saved")
    stored = rules_of(client)
    assert [r["name"] for r in stored] == ["render-share"], stored
    rule = stored[0]
    assert rule["selector"] == SELECTOR
    assert rule["condition"]["kind"] == "function_share"
    assert rule["condition"]["function"] == r"^app\.render$"
    assert float(rule["condition"]["above"]) == 90
    assert rule["condition"]["window"] == "1h"
    assert rule["for"] == "2m"
    assert rule["labels"] == {"severity": "ticket", "team": "checkout"}
    assert rule["annotations"] == {"summary": "render is slow"}
    assert rule["webhooks"] == ["http://127.0.0.1:9/hook"]

    listed = card(page, "render-share")
    listed.wait_for()
    assert listed.get_attribute("data-state") in ("inactive", "pending", "firing")
    assert listed.locator(".hs-alert-state").first.inner_text() == listed.get_attribute(
        "data-state"
    )
    assert r"^app\.render$" in listed.locator(".hs-alert-condition").inner_text()
    assert "severity=ticket" in listed.locator(".hs-alert-labels").inner_text()
    # app.render has 20% of the CPU: once evaluated, the rule is inactive with that value.
    page.wait_for_function(
        """() => {
            const c = document.querySelector('article.hs-alert[data-name="render-share"]');
            return c && c.querySelector('.hs-alert-evaluated time')
                && c.querySelector('.hs-alert-value-text');
        }""",
        timeout=20_000,
    )
    assert listed.get_attribute("data-state") == "inactive"
    assert listed.locator(".hs-alert-value-text").inner_text() == "20%"

    # A bad regex: the server's reason, inline, and nothing changed.
    fill_function_share(page, "render-share", "app.(render", "90")
    answer = save(page)
    assert 400 <= answer.status < 500, answer.text()
    error = page.locator(".hs-alert-result .hs-alert-error")
    error.wait_for()
    reason = error.inner_text()
    assert "function" in reason, reason
    assert rules_of(client) == stored

    # The same in the JSON editor: an unknown condition kind, refused with its name.
    page.locator("button.hs-alert-mode").click()
    editor = page.locator("textarea.hs-alert-json")
    assert '"function_share"' in editor.input_value()
    assert not page.locator('input[name="name"]').is_visible()
    bad = {"name": "render-share", "selector": SELECTOR, "condition": {"kind": "no_such_kind"}}
    editor.fill(json.dumps(bad))
    answer = save(page)
    assert 400 <= answer.status < 500, answer.text()
    reason = page.locator(".hs-alert-result .hs-alert-error").inner_text()
    assert "no_such_kind" in reason or "kind" in reason, reason
    # JSON that does not parse is not sent at all.
    editor.fill('{"name": "render-share",')
    page.locator("button.hs-alert-save").click()
    assert "JSON" in page.locator(".hs-alert-result .hs-alert-error").inner_text()
    assert rules_of(client) == stored
    screenshot(page, "alerts_refused")

    # Edit fills the editor with the stored rule, and the fields once back to them.
    listed.locator("button.hs-alert-edit").click()
    assert '"render-share"' in editor.input_value() and "ticket" in editor.input_value()
    page.locator("button.hs-alert-mode").click()
    assert not editor.is_visible()
    assert page.locator('input[name="name"]').input_value() == "render-share"
    assert page.locator('textarea[name="labels"]').input_value() == "severity=ticket\nteam=checkout"
    assert page.locator('input[name="function"]').first.input_value() == r"^app\.render$"

    # Delete (asks once more): gone from the page and the server.
    listed.locator("button.hs-alert-delete").click()
    with page.expect_response(
        lambda r: f"{RULES}/render-share" in r.url and r.request.method == "DELETE"
    ) as info:
        listed.locator("button.hs-alert-delete", has_text="Confirm delete").click()
    assert info.value.status in (200, 204), info.value.text()
    listed.wait_for(state="detached")
    page.locator(".hs-alerts-list .hs-message.hs-empty").wait_for()
    assert rules_of(client) == []
    client.close()


def test_a_firing_rule_shows_its_value_and_history(page, srv) -> None:  # type: ignore[no-untyped-def]
    client = srv.client()
    page.goto(srv.url + "/alerts")
    page.locator(".hs-alerts-list .hs-message, .hs-alerts-list article").first.wait_for()
    fill_function_share(page, "hot-loop-share", r"^app\.hot_loop$", "50")
    answer = save(page)
    assert answer.status in (200, 201), answer.text()
    listed = card(page, "hot-loop-share")
    listed.wait_for()
    # The server's loop evaluates every second; the page refreshes every five.
    page.wait_for_function(
        """() => document.querySelector('article.hs-alert[data-name="hot-loop-share"]')
            ?.dataset.state === 'firing'""",
        timeout=30_000,
    )
    assert listed.locator(".hs-alert-head .hs-alert-state").inner_text() == "firing"
    assert listed.locator(".hs-alert-value-text").inner_text() == "80%"
    assert listed.locator(".hs-alert-since time").count() == 1
    assert "1 firing" in page.locator(".hs-alerts-summary").inner_text()
    history = listed.locator("details.hs-alert-history")
    # Saved from this page, so its history is open.
    assert history.get_attribute("open") is not None
    transitions = history.locator("tr.hs-alert-transition")
    assert transitions.count() >= 1
    assert transitions.first.get_attribute("data-to") == "firing"
    assert "80%" in transitions.first.inner_text()
    screenshot(page, "alerts_firing")

    # What the page shows is what the API says.
    answer = client.get(f"{RULES}/hot-loop-share")
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "firing"

    # Raised above the function's share through Edit, the rule resolves: history shows both.
    listed.locator("button.hs-alert-edit").click()
    form = page.locator("form.hs-alert-form")
    assert form.locator('input[name="name"]').input_value() == "hot-loop-share"
    form.locator('.hs-alert-kind-fields[data-kind="function_share"] input[name="above"]').fill("95")
    answer = save(page)
    assert answer.status == 200, answer.text()
    page.wait_for_function(
        """() => document.querySelector('article.hs-alert[data-name="hot-loop-share"]')
            ?.dataset.state === 'inactive'""",
        timeout=30_000,
    )
    assert [t.get_attribute("data-to") for t in transitions.all()] == ["inactive", "firing"]
    assert "firing → inactive" in transitions.first.inner_text()
    assert listed.locator(".hs-alert-resolved time").count() == 1
    assert client.get(f"{RULES}/hot-loop-share").json()["state"] == "inactive"

    # Its cause: the diff view of the window before against the window, searching the function.
    cause = listed.locator("a.hs-alert-cause")
    href = cause.get_attribute("href") or ""
    assert href.startswith("/diff?") and "leftQuery=" in href and "search=" in href, href
    cause.click()
    page.wait_for_url(re.compile(r"/diff\?"))
    assert page.locator("h1.hs-title").inner_text() == "Diff"
    # The rule's pattern, searched as a regular expression (test_profiles_ui checks that).
    assert page.locator(".hs-search").first.input_value() == r"/^app\.hot_loop$/"
    client.close()


@pytest.mark.parametrize("width", [360, 390])
def test_fits_a_phone_in_dark_mode(page, srv, width: int) -> None:  # type: ignore[no-untyped-def]
    with srv.client() as client:
        rule = {
            "name": "a-rule-with-a-rather-long-name-for-a-narrow-phone-screen",
            "selector": '{service_name="checkout", env="prod", region!="eu-west-1-long-region"}',
            "condition": {
                "kind": "function_share",
                "function": r"^app\.hot_loop_with_a_long_function_name_that_never_wraps$"
                r"|^app\.hot_loop$",
                "above": 50,
                "window": "1h",
            },
            "labels": {
                "severity": "page",
                "runbook": "https://example.com/runbooks/checkout/hot-loop",
            },
        }
        answer = client.put(f"{RULES}/{rule['name']}", json=rule)
        assert answer.status_code in (200, 201), answer.text
    page.set_viewport_size({"width": width, "height": 844})
    page.emulate_media(color_scheme="dark")
    page.goto(srv.url + "/alerts")
    page.wait_for_function(
        """(name) => [...document.querySelectorAll('article.hs-alert')]
            .some((c) => c.dataset.name === name && c.dataset.state === 'firing')""",
        arg=rule["name"],
        timeout=30_000,
    )
    for summary in page.locator("details.hs-alert-history summary").all():
        summary.click()
    page.locator("button.hs-alert-mode").click()  # the JSON editor too
    page.wait_for_timeout(200)
    screenshot(page, f"alerts-{width}-dark")
    sizes = page.evaluate(
        "() => ({scroll: document.documentElement.scrollWidth, inner: window.innerWidth})"
    )
    assert sizes["scroll"] <= sizes["inner"] + 1, (sizes, page.evaluate(STICKING_OUT))
    assert page.evaluate(OFFSCREEN) == []
    colours = page.evaluate(
        """() => {
            const bg = (sel) => getComputedStyle(document.querySelector(sel)).backgroundColor;
            return {body: bg('body'), text: getComputedStyle(document.body).color,
                panel: bg('.hs-alerts-section'), editor: bg('textarea.hs-alert-json')};
        }"""
    )
    assert luminance(colours["body"]) < 0.15 and luminance(colours["text"]) > 0.7, colours
    assert luminance(colours["panel"]) < 0.25 and luminance(colours["editor"]) < 0.25, colours


def test_each_condition_kind_through_the_form(page, srv) -> None:  # type: ignore[no-untyped-def]
    client = srv.client()
    page.goto(srv.url + "/alerts")
    form = page.locator("form.hs-alert-form")
    form.wait_for()

    def fill(name: str, kind: str, values: dict) -> None:
        form.locator('input[name="name"]').fill(name)
        form.locator('input[name="selector"]').fill(SELECTOR)
        form.locator('select[name="kind"]').select_option(kind)
        fields = form.locator(f'.hs-alert-kind-fields[data-kind="{kind}"]')
        for key, value in values.items():
            if key == "against":
                fields.locator('select[name="against"]').select_option(value)
            else:
                fields.locator(f'input[name="{key}"]').fill(value)

    fill(
        "cpu-per-request-day",
        "per_request",
        {"increase": "30", "window": "10m", "against": "offset", "against.offset": "24h"},
    )
    assert save(page).status == 201
    fill(
        "cpu-per-request-version",
        "per_request",
        {
            "increase": "25",
            "window": "15m",
            "against": "label",
            "against.label": "version",
            "against.baseline": "1.2",
            "against.comparison": "1.3",
        },
    )
    assert save(page).status == 201
    fill(
        "deploy-regression",
        "share_growth",
        {
            "function": "json",
            "points": "5",
            "window": "1h",
            "label": "version",
            "baseline": "1.2",
            "comparison": "1.3",
        },
    )
    assert save(page).status == 201
    fill("gil-bound", "gil_wait_share", {"above": "20", "window": "5m"})
    assert save(page).status == 201
    stored = {r["name"]: r["condition"] for r in rules_of(client)}
    assert stored["gil-bound"] == {"kind": "gil_wait_share", "above": 20, "window": "5m"}, stored
    assert stored["cpu-per-request-day"] == {
        "kind": "per_request",
        "increase": 30,
        "window": "10m",
        "against": {"offset": "1d"},
    }, stored
    assert stored["cpu-per-request-version"] == {
        "kind": "per_request",
        "increase": 25,
        "window": "15m",
        "against": {"label": "version", "baseline": "1.2", "comparison": "1.3"},
    }, stored
    assert stored["deploy-regression"] == {
        "kind": "share_growth",
        "function": "json",
        "points": 5,
        "window": "1h",
        "label": "version",
        "baseline": "1.2",
        "comparison": "1.3",
    }, stored
    text = card(page, "deploy-regression").locator(".hs-alert-condition")
    text.wait_for()
    assert 'version="1.2" → "1.3"' in text.inner_text()
    assert "against 1d earlier" in card(page, "cpu-per-request-day").inner_text()
    assert "GIL wait above 20%" in card(page, "gil-bound").inner_text()

    # A name the API cannot take as a path segment is refused before sending.
    form.locator('input[name="name"]').fill("a/b")
    page.locator("button.hs-alert-save").click()
    assert "/" in page.locator(".hs-alert-result .hs-alert-error").inner_text()

    # Edit of a label comparison brings back its fields.
    card(page, "cpu-per-request-version").locator("button.hs-alert-edit").click()
    assert form.locator('select[name="against"]').input_value() == "label"
    assert form.locator('input[name="against.comparison"]').input_value() == "1.3"
    assert not form.locator('input[name="against.offset"]').is_visible()
    for name in stored:
        assert client.delete(f"{RULES}/{name}").status_code == 200
    client.close()


def test_a_rule_whose_texts_need_escapes_saves_unchanged(page, srv) -> None:  # type: ignore[no-untyped-def]
    """Annotations the API takes (a line break in a value, "=" in a key, a backslash, a key
    named __proto__) come back from the form's key=value lines as they were."""
    client = srv.client()
    annotations = {
        "multi": "line1\nline2",
        "a=b": "c",
        "path": "C:\\new\\dir",
        "__proto__": "kept",
    }
    rule = {
        "name": "escapes",
        "selector": SELECTOR,
        "condition": {
            "kind": "function_share",
            "function": "app.render",
            "above": 90,
            "window": "1h",
        },
        "labels": {"team": "checkout"},
        "annotations": annotations,
    }
    answer = client.put(f"{RULES}/escapes", json=rule)
    assert answer.status_code in (200, 201), answer.text
    page.goto(srv.url + "/alerts")
    listed = card(page, "escapes")
    listed.locator("button.hs-alert-edit").click()
    if page.locator("textarea.hs-alert-json").is_visible():
        page.locator("button.hs-alert-mode").click()
    assert "line1\\nline2" in page.locator('textarea[name="annotations"]').input_value()
    saved = save(page)
    assert saved.status in (200, 201), saved.text()
    stored = {r["name"]: r for r in rules_of(client)}["escapes"]
    assert stored["annotations"] == annotations, stored
    assert stored["labels"] == {"team": "checkout"}
    client.delete(f"{RULES}/escapes")
    client.close()
