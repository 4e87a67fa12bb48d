"""Alerts end to end, nothing faked: a program with the hotspan agent and the OpenTelemetry
SDK pushes to a real server that evaluates rules several times a second; one of its functions
becomes 3x slower (the test flips a file the program reads), the rule fires, the fix resolves
it, and a real HTTP receiver in the test gets Alertmanager's webhook payloads for both, once
each.
Rules comparing two label values (versions) fire on two programs running side by side; bad
rules get a 400 naming the problem; the CLI and the /metrics series work on the same data."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from tests.conftest import RunningServer, running_server
from tests.helpers import CPU, native_states, traced_program

ZERO_TIME = "0001-01-01T00:00:00Z"
# Windows end 2 s ago: profiles are uploaded every second (the default lag is for real agents),
# so a window's last upload has arrived.  Passes run twice a second, to keep the tests short.
LAG_S = 2
# The receivers listen on loopback, which webhooks reach only when the operator allows it.
ALLOW = ["--alert-webhook-allow", "127.0.0.0/8"]
ALERT_ARGS = ["--alert-interval", "0.5s", "--alert-lag", f"{LAG_S}s", *ALLOW]
# A function's share is a ratio within the profiles: a window still missing its last upload
# measures it as well, so rules on shares alone can look at windows ending 1 s ago.
SHARE_LAG_S = 1
SHARE_ARGS = ["--alert-interval", "0.25s", "--alert-lag", f"{SHARE_LAG_S}s", *ALLOW]
# Spans leave the programs within a fifth of a second (the SDK waits 5 s by default), so that
# the request counts of windows ending LAG_S ago are complete.
SPAN_ENV = {"OTEL_BSP_SCHEDULE_DELAY": "200"}

# The request handler does its own work (render) and one step that regresses (checksum):
# 5 ms of CPU normally, 15 ms when the control file says "slow".  checksum's share of the
# service's CPU goes from about a third to about 60 %.
PROGRAM = traced_program(
    "orders",
    """
    control = sys.argv[2]
    slow_factor = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0

    def render_page(seconds):
        burn(seconds)

    def checksum_orders(seconds):
        burn(seconds)

    while True:
        try:
            mode = open(control).read().strip()
        except OSError:
            mode = "fast"
        if mode == "stop":
            break
        factor = 3.0 if mode == "slow" else slow_factor
        with tracer.start_as_current_span("GET /orders"):
            render_page(0.010)
            checksum_orders(0.005 * factor)
    """,
    tags="json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}",
)


class Receiver:
    """An HTTP server that records the JSON bodies POSTed to it; the first ``fail_first``
    requests get a 500, as from a receiver that is down for a moment."""

    def __init__(self, fail_first: int = 0) -> None:
        self.received: List[Dict[str, Any]] = []  # every request, failed ones included
        self.fail_first = fail_first
        self.cond = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                with receiver.cond:
                    failed = len(receiver.received) < receiver.fail_first
                    receiver.received.append(
                        {
                            "path": self.path,
                            "body": body,
                            "failed": failed,
                            "content_type": self.headers.get("Content-Type"),
                        }
                    )
                    receiver.cond.notify_all()
                self.send_response(500 if failed else 200)
                self.end_headers()
                self.wfile.write(b"down for a moment" if failed else b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def delivered(self, path: str = "", status: str = "") -> List[Dict[str, Any]]:
        with self.cond:
            return [
                r["body"]
                for r in self.received
                if not r["failed"]
                and r["path"].startswith(path)
                and (not status or r["body"]["status"] == status)
            ]

    def wait_for(self, path: str, status: str, timeout: float = 90) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = self.delivered(path, status)
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                assert left > 0, f"no {status} payload at {path}; got {self.received}"
                self.cond.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=1)
    try:
        yield r
    finally:
        r.close()


class Program:
    """The program above, running until the test writes "stop" into its control file."""

    def __init__(
        self, directory: Path, server: str, tags: Optional[dict] = None, slow_factor: float = 1.0
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.control = directory / "mode"
        self.control.write_text("fast")
        path = directory / "program.py"
        path.write_text(PROGRAM)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "OTEL_"))}
        env.update(SPAN_ENV)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(path),
                server,
                str(self.control),
                str(slow_factor),
                json.dumps(tags or {}),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def mode(self, text: str) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(self.control)

    def stop(self) -> None:
        self.mode("stop")
        self.wait()

    def wait(self) -> None:
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        assert self.proc.returncode == 0, err


def alert(srv: RunningServer, name: str) -> Dict[str, Any]:
    with srv.client() as c:
        r = c.get(f"/api/v1/alerts/rules/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def wait_until(what: str, check: Callable[[], Any], timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def put_rule(srv: RunningServer, name: str, rule: Dict[str, Any]) -> Dict[str, Any]:
    with srv.client() as c:
        r = c.put(f"/api/v1/alerts/rules/{name}", json=rule)
    assert r.status_code in (200, 201), r.text
    return r.json()


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- a function gets 3x slower, then is fixed ---------------------------------------------------


def test_rule_fires_when_a_function_gets_slower_and_resolves_when_fixed(
    tmp_path: Path, receiver: Receiver
) -> None:
    with running_server(tmp_path / "data", SHARE_ARGS) as srv:
        put_rule(
            srv,
            "checksum-heavy",
            {
                "selector": '{service_name="orders"}',
                "condition": {
                    "kind": "function_share",
                    "function": "checksum_orders",
                    "above": 45,
                    "window": "2s",
                },
                "labels": {"severity": "page"},
                "annotations": {"runbook_url": "https://runbooks.example/checksum"},
                "webhooks": [receiver.url + "/hook"],
            },
        )
        program = Program(tmp_path / "prog", srv.url)
        try:
            # Healthy first: the rule sees data, and it stays under the threshold.
            wait_until(
                "data in the rule's window",
                lambda: alert(srv, "checksum-heavy")["value"] is not None,
            )
            start = alert(srv, "checksum-heavy")["evaluations"]
            healthy = wait_until(
                "three more evaluations",
                lambda: (a := alert(srv, "checksum-heavy"))["evaluations"] >= start + 3 and a,
            )
            assert healthy["state"] == "inactive" and healthy["history"] == [], healthy
            assert 15 < healthy["value"] < 45, healthy
            assert receiver.received == []

            program.mode("slow")
            firing = receiver.wait_for("/hook", "firing")
            # The receiver failed the first delivery: the next evaluation sent it again.
            attempts = [r for r in receiver.received if r["body"]["status"] == "firing"]
            assert [r["failed"] for r in attempts] == [True, False]
            assert attempts[1]["content_type"] == "application/json"

            # Still slow for several more evaluations: no repeat while firing.
            start = alert(srv, "checksum-heavy")["evaluations"]
            state = wait_until(
                "four more evaluations",
                lambda: (a := alert(srv, "checksum-heavy"))["evaluations"] >= start + 4 and a,
            )
            assert state["state"] == "firing", state
            assert state["value"] > 45
            assert len(receiver.received) == 2
            # The same rule previewed, as the form does before saving: measured at moments of
            # the last half minute as the evaluator measures it, nothing stored or sent.
            with srv.client() as c:
                r = c.post(
                    "/api/v1/alerts/preview",
                    params={"hours": "0.01", "points": "6"},
                    json={"name": "not-saved", **alert(srv, "checksum-heavy")["rule"]},
                )
                assert r.status_code == 200, r.text
                points = r.json()["points"]
                assert len(points) == 6 and points[-1]["breached"] is True, points
                assert points[-1]["value"] > 45 and points[0]["at"] < points[-1]["at"], points
                assert "checksum_orders" in r.json()["summary"]
                names = [a["name"] for a in c.get("/api/v1/alerts").json()["alerts"]]
                assert names == ["checksum-heavy"], names
                bad = c.post("/api/v1/alerts/preview", params={"points": "1000"}, json={})
                assert bad.status_code == 400
            assert len(receiver.received) == 2

            program.mode("fast")
            resolved = receiver.wait_for("/hook", "resolved")
            final = wait_until(
                "the resolved delivery recorded",
                lambda: (
                    (a := alert(srv, "checksum-heavy"))["webhooks"][0]["delivered"] == "resolved"
                    and a
                ),
            )
        finally:
            program.stop()
        assert len(receiver.delivered(status="firing")) == 1
        with srv.client() as c:
            page = c.get(firing["alerts"][0]["generatorURL"])
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert len(receiver.delivered(status="resolved")) == 1

    # Alertmanager's webhook format, field by field.
    for body, status in ((firing, "firing"), (resolved, "resolved")):
        assert body["version"] == "4"
        assert body["status"] == status
        assert body["receiver"] == "hotspan"
        assert body["externalURL"] == srv.url
        assert body["truncatedAlerts"] == 0
        assert 'alertname="checksum-heavy"' in body["groupKey"]
        assert body["groupLabels"] == {"alertname": "checksum-heavy"}
        (one,) = body["alerts"]
        assert one["status"] == status
        assert one["labels"] == {
            "alertname": "checksum-heavy",
            "severity": "page",
            "service_name": "orders",
            "tenant": "anonymous",
        }
        assert body["commonLabels"] == one["labels"]
        assert one["annotations"]["runbook_url"] == "https://runbooks.example/checksum"
        assert "checksum_orders" in one["annotations"]["summary"]
        assert len(one["fingerprint"]) == 16
    fired, ended = firing["alerts"][0], resolved["alerts"][0]
    assert fired["endsAt"] == ZERO_TIME
    assert ended["startsAt"] == fired["startsAt"]
    assert ended["fingerprint"] == fired["fingerprint"]
    assert parse_time(ended["endsAt"]) > parse_time(fired["startsAt"])
    assert float(fired["annotations"]["value"]) > 45

    # The link opens the diff view: the window before the regression against the window
    # that fired, searching for the function.
    link = urllib.parse.urlsplit(fired["generatorURL"])
    assert f"{link.scheme}://{link.netloc}" == srv.url and link.path == "/diff"
    params = dict(urllib.parse.parse_qsl(link.query))
    assert params["profileType"] == CPU
    assert params["leftQuery"] == params["rightQuery"] == '{service_name="orders"}'
    assert params["search"] == "/checksum_orders/"  # the rule's pattern, for the UI
    left = int(params["leftFrom"]), int(params["leftUntil"])
    right = int(params["rightFrom"]), int(params["rightUntil"])
    assert left[0] < left[1] <= right[0] + 1 and right[0] < right[1]
    assert abs(right[1] + SHARE_LAG_S - parse_time(fired["startsAt"]).timestamp()) < 5
    assert ended["generatorURL"] == fired["generatorURL"]

    # The API kept the story.
    states = [h["state"] for h in final["history"]]
    assert states[:2] == ["inactive", "firing"], final["history"]
    assert final["state"] == "inactive" and final["resolvedAt"] and final["lastError"] is None


# -- two versions side by side ----------------------------------------------------------------


def test_rules_comparing_two_versions(tmp_path: Path, receiver: Receiver) -> None:
    with running_server(tmp_path / "data", ALERT_ARGS) as srv:
        common = {"label": "version", "baseline": "1.2", "comparison": "1.3"}
        put_rule(
            srv,
            "cpu-per-request",
            {
                "selector": '{service_name="orders"}',
                "condition": {
                    "kind": "per_request",
                    "increase": 30,
                    "window": "3s",
                    "against": common,
                },
            },
        )
        put_rule(
            srv,
            "checksum-grew",
            {
                "selector": '{service_name="orders"}',
                "condition": {
                    "kind": "share_growth",
                    "function": r"\.checksum_orders$",
                    "points": 10,
                    "window": "3s",
                    **common,
                },
                "webhooks": [receiver.url + "/grew"],
            },
        )
        put_rule(
            srv,
            "no-such-version",
            {
                "selector": '{service_name="orders"}',
                "condition": {
                    "kind": "per_request",
                    "increase": 1,
                    "window": "3s",
                    "against": {"label": "version", "baseline": "0.1", "comparison": "1.3"},
                },
            },
        )
        put_rule(
            srv,
            "vs-an-hour-ago",
            {
                "selector": '{service_name="orders"}',
                "condition": {
                    "kind": "per_request",
                    "increase": 1,
                    "window": "3s",
                    "against": {"offset": "1h"},
                },
            },
        )
        put_rule(
            srv,
            "grew-for-an-hour",
            {
                "selector": '{service_name="orders"}',
                "condition": {
                    "kind": "share_growth",
                    "function": "checksum_orders",
                    "points": 10,
                    "window": "3s",
                    **common,
                },
                "for": "1h",
            },
        )
        old = Program(tmp_path / "old", srv.url, {"version": "1.2"})
        new = Program(tmp_path / "new", srv.url, {"version": "1.3"}, slow_factor=3.0)
        try:
            firing = receiver.wait_for("/grew", "firing")
            per_request = wait_until(
                "cpu-per-request firing",
                lambda: (a := alert(srv, "cpu-per-request"))["state"] == "firing" and a,
            )
            grew = alert(srv, "checksum-grew")
            missing = alert(srv, "no-such-version")
            an_hour_ago = alert(srv, "vs-an-hour-ago")
            pending = alert(srv, "grew-for-an-hour")
        finally:
            old.mode("stop")
            new.mode("stop")
            old.wait()
            new.wait()
        # The deleted rule's alert resolves at its receiver.
        with srv.client() as c:
            assert c.delete("/api/v1/alerts/rules/checksum-grew").status_code == 200
            assert c.get("/api/v1/alerts/rules/checksum-grew").status_code == 404
        resolved = receiver.wait_for("/grew", "resolved")

    # 25 ms of CPU per request against 15 ms: about +67 %.
    assert 30 < per_request["value"] < 120, per_request
    assert "per request" in per_request["summary"]
    # checksum's share: about 60 % against about 33 %.
    assert grew["state"] == "firing" and 10 < grew["value"] < 50, grew
    assert missing["state"] == "inactive" and missing["value"] is None
    assert "no baseline" in missing["summary"], missing
    assert missing["lastError"] is None
    assert an_hour_ago["value"] is None and "no baseline" in an_hour_ago["summary"]
    assert an_hour_ago["evaluations"] > 0 and an_hour_ago["lastError"] is None
    # Breached, but not for an hour yet.
    assert pending["state"] == "pending" and pending["firedAt"] is None, pending
    assert "firing" not in [h["state"] for h in pending["history"]], pending

    params = dict(
        urllib.parse.parse_qsl(urllib.parse.urlsplit(firing["alerts"][0]["generatorURL"]).query)
    )
    assert params["leftQuery"] == '{service_name="orders", version="1.2"}'
    assert params["rightQuery"] == '{service_name="orders", version="1.3"}'
    assert resolved["alerts"][0]["fingerprint"] == firing["alerts"][0]["fingerprint"]
    assert resolved["alerts"][0]["endsAt"] != ZERO_TIME


# -- bad rules, CLI, metrics ------------------------------------------------------------------

GOOD = {
    "selector": '{service_name="orders"}',
    "condition": {"kind": "function_share", "function": "json", "above": 20, "window": "5m"},
}


def _with(**changes: Any) -> Dict[str, Any]:
    rule = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if key.startswith("condition_"):
            rule["condition"][key[len("condition_") :]] = value
        else:
            rule[key] = value
    return rule


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (_with(selector='{service_name="orders"'), "selector"),
        (_with(selector=None), "selector is required"),
        (_with(condition=None), "condition is required"),
        (_with(condition_kind="p99"), "condition.kind"),
        (_with(condition_function="(unclosed"), "not a regular expression"),
        (_with(condition_function="x" * 2000), "longer than"),
        (_with(condition_above=150), "condition.above"),
        (_with(condition_above="20"), "condition.above must be a number"),
        (_with(condition_window="5 minutes"), "condition.window"),
        (_with(condition_window="0s"), "condition.window must be from 1s"),
        (_with(condition_extra=1), "unknown field(s) 'extra' in condition"),
        (_with(colour="red"), "unknown field(s) 'colour' in rule"),
        (_with(profileType="cpu:nope"), "profileType"),
        (_with(webhooks=["ftp://example.com/x"]), "webhooks"),
        (_with(webhooks="http://example.com"), "webhooks must be a list"),
        (_with(labels={"bad name": "x"}), "not a label name"),
        (_with(labels={"alertname": "x"}), "alertname"),
        (_with(annotations={"summary": 3}), "annotations.summary must be a string"),
        (_with(**{"for": "soon"}), "for"),
        (_with(name="other"), "is not the path's"),
        # Lone surrogates: JSON spells them, no UTF-8 writer takes them.
        (_with(annotations={"summary": "\ud800"}), "annotations.summary is not valid UTF-8"),
        (_with(annotations={"\ud800": "x"}), "a key in annotations is not valid UTF-8"),
        (_with(labels={"team": "a\udfff"}), "labels.team is not valid UTF-8"),
        (_with(webhooks=["http://127.0.0.1/\ud800"]), "webhooks[0] is not valid UTF-8"),
        (_with(condition_function="json\ud800"), "condition.function is not valid UTF-8"),
        (_with(selector='{service_name="\ud800"}'), "selector is not valid UTF-8"),
        (_with(**{"\ud800": 1}), "a key in rule is not valid UTF-8"),
        (_with(webhooks=["http://[::1/x"]), "is not a URL: Invalid IPv6 URL"),
        (_with(webhooks=["http://127.0.0.1:99999/x"]), "Port out of range"),
        (_with(webhooks=["http://a b/hook"]), "spaces or control characters"),
        (_with(profileType=0), "profileType must be a profile type id"),
        (_with(profileType=""), "profileType must be a profile type id"),
        (_with(profileType=False), "profileType must be a profile type id"),
        (_with(annotations={"k" * 129: "x"}), "keys must be 1 to 128 characters"),
        (_with(annotations={str(i): "x" for i in range(40)}), "more than 32 entries"),
        (_with(selector="{}"), 'name a service: {service_name="..."}'),
        (_with(uid="not-an-id"), "uid"),
        (
            _with(
                condition={
                    "kind": "per_request",
                    "increase": 10,
                    "window": "5m",
                    "against": {"offset": "1d"},
                },
                selector='{env="prod"}',
            ),
            "service_name",
        ),
        (
            _with(condition={"kind": "per_request", "increase": 10, "window": "5m"}),
            "condition.against is required",
        ),
        (
            _with(
                condition={
                    "kind": "share_growth",
                    "function": "x",
                    "points": 5,
                    "window": "1h",
                    "label": "version",
                    "baseline": "1.2",
                    "comparison": "1.2",
                }
            ),
            "the same value",
        ),
        (
            _with(condition={"kind": "gil_wait_share", "above": 120, "window": "5m"}),
            "condition.above",
        ),
        (
            _with(
                condition={"kind": "gil_wait_share", "above": 20, "window": "5m", "function": "x"}
            ),
            "condition",
        ),
    ],
)
def test_bad_rules_get_a_400_naming_the_problem(
    module_server: RunningServer, body: Any, problem: str
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    with module_server.client() as c:
        r = c.put("/api/v1/alerts/rules/bad", content=data)
        assert r.status_code == 400, r.text
        assert problem in r.json()["error"], r.json()
        # Nothing was stored: the rule is not there and the tenant's lists still answer.
        assert c.get("/api/v1/alerts/rules/bad").status_code == 404
        assert c.get("/api/v1/alerts").status_code == 200
        assert "bad" not in [r["name"] for r in c.get("/api/v1/alerts/rules").json()["rules"]]


def test_deeply_nested_body_gets_a_400(module_server: RunningServer) -> None:
    with module_server.client() as c:
        r = c.put("/api/v1/alerts/rules/deep", content=b"[" * 30000)
        assert r.status_code == 400 and "nested too deeply" in r.json()["error"], r.text
        assert c.get("/api/v1/alerts/rules/deep").status_code == 404


def test_a_bad_replacement_leaves_the_stored_rule(module_server: RunningServer) -> None:
    with module_server.client() as c:
        assert c.put("/api/v1/alerts/rules/kept", json=GOOD).status_code == 201
        bad = _with(annotations={"summary": "\ud800"})
        r = c.put("/api/v1/alerts/rules/kept", content=json.dumps(bad).encode())
        assert r.status_code == 400, r.text
        kept = c.get("/api/v1/alerts/rules/kept")
        assert kept.status_code == 200 and kept.json()["rule"]["annotations"] == {}
        assert c.get("/api/v1/alerts").status_code == 200
        assert c.delete("/api/v1/alerts/rules/kept").status_code == 200


def test_a_stored_rule_that_cannot_be_shown_is_left_out(tmp_path: Path) -> None:
    """A rule an older version stored with a lone surrogate: the lists skip it (with a log
    line) instead of failing, and it can still be deleted."""
    from hotspan.alerts import RULE_KIND
    from hotspan.store import open_store

    store = open_store(str(tmp_path / "data"), retention_ns=0)
    try:
        store.put_document("anonymous", RULE_KIND, "old", {**GOOD, "annotations": {"a": "\ud800"}})
        store.put_document("anonymous", RULE_KIND, "fine", {**GOOD, "name": "fine"})
    finally:
        store.close()
    with running_server(tmp_path / "data") as srv:
        with srv.client() as c:
            alerts = c.get("/api/v1/alerts")
            assert alerts.status_code == 200, alerts.text
            assert [a["name"] for a in alerts.json()["alerts"]] == ["fine"]
            rules = c.get("/api/v1/alerts/rules")
            assert rules.status_code == 200, rules.text
            assert [r["name"] for r in rules.json()["rules"]] == ["fine"]
            one = c.get("/api/v1/alerts/rules/old")
            assert one.status_code == 409 and "DELETE it" in one.json()["error"]
            assert c.delete("/api/v1/alerts/rules/old").status_code == 200
            assert c.get("/api/v1/alerts/rules/old").status_code == 404
        srv.stop()
        assert srv.process.stdout is not None
        log = srv.process.stdout.read()
    assert "alert rule anonymous/old cannot be shown, left out" in log, log


def test_names_and_missing_rules(module_server: RunningServer) -> None:
    with module_server.client() as c:
        r = c.put("/api/v1/alerts/rules/.hidden", json=GOOD)
        assert r.status_code == 400 and "rule name" in r.json()["error"]
        r = c.delete("/api/v1/alerts/rules/never-made")
        assert r.status_code == 404 and "never-made" in r.json()["error"]
        r = c.put("/api/v1/alerts/rules/x", json=GOOD, headers={"X-Scope-OrgID": "bad tenant"})
        assert r.status_code == 400
        # Per tenant: a rule of one tenant is not another's.
        assert (
            c.put(
                "/api/v1/alerts/rules/mine", json=GOOD, headers={"X-Scope-OrgID": "team-a"}
            ).status_code
            == 201
        )
        assert (
            c.put(
                "/api/v1/alerts/rules/mine", json=GOOD, headers={"X-Scope-OrgID": "team-a"}
            ).status_code
            == 200
        )
        assert c.get("/api/v1/alerts/rules/mine").status_code == 404
        rules = c.get("/api/v1/alerts/rules", headers={"X-Scope-OrgID": "team-a"}).json()
        assert [r["name"] for r in rules["rules"]] == ["mine"]
        assert rules["rules"][0]["condition"]["window"] == "5m"


def hotspan_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hotspan", "alerts", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


# A globally reachable address (loopback ones are refused without --alert-webhook-allow); the
# rule has no data, so nothing is ever sent there.
CLI_HOOK = "http://8.8.8.8:9/hook"


def test_cli(module_server: RunningServer, tmp_path: Path) -> None:
    server = ["--server", module_server.url, "--tenant", "cli"]
    rule = tmp_path / "rule.json"
    rule.write_text(json.dumps({**GOOD, "webhooks": [CLI_HOOK]}))
    done = hotspan_cli("set", "json-heavy", "--file", str(rule), "--profile-type", "wall", *server)
    assert done.returncode == 0, done.stderr
    assert "json-heavy" in done.stdout
    done = hotspan_cli("set", "from-stdin", *server, stdin=json.dumps(GOOD))
    assert done.returncode == 0, done.stderr
    listed = hotspan_cli("list", *server)
    assert listed.returncode == 0
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["NAME", "STATE", "VALUE"]
    assert {ln.split()[0] for ln in lines[1:]} == {"json-heavy", "from-stdin"}
    shown = hotspan_cli("get", "json-heavy", "--json", *server)
    doc = json.loads(shown.stdout)
    assert doc["rule"]["profileType"] == "wall:wall:nanoseconds:wall:nanoseconds"
    assert doc["webhooks"] == [{"url": CLI_HOOK, "delivered": None, "error": None}]
    detail = hotspan_cli("get", "json-heavy", *server)
    assert "function_share" in detail.stdout and CLI_HOOK in detail.stdout
    bad = hotspan_cli("set", "broken", *server, stdin=json.dumps(_with(condition_above=-1)))
    assert bad.returncode == 1 and "condition.above" in bad.stderr
    assert hotspan_cli("set", "broken", *server, stdin="nope").returncode == 2
    # The selector spelled as the other commands take it.
    typed = hotspan_cli(
        "set", "typed", "--json", *server, stdin=json.dumps(_with(selector="orders{env=prod}"))
    )
    assert typed.returncode == 0, typed.stderr
    assert json.loads(typed.stdout)["rule"]["selector"] == '{service_name="orders", env="prod"}'
    assert hotspan_cli("delete", "typed", *server).returncode == 0
    for name in ("", "a/b"):
        refused = hotspan_cli("set", name, *server, stdin=json.dumps(GOOD))
        assert refused.returncode == 2 and "rule name" in refused.stderr, refused.stderr
    assert hotspan_cli("delete", "json-heavy", *server).returncode == 0
    gone = hotspan_cli("delete", "json-heavy", *server)
    assert gone.returncode == 1 and "404" in gone.stderr


def test_metric_families_parse_with_prometheus_client(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hotspan.alerts import RULE_KIND, STATE_KIND
    from hotspan.alerts.metrics import collect
    from hotspan.alerts.state import AlertState
    from hotspan.store import open_store

    store = open_store(str(tmp_path / "data"), retention_ns=0)
    try:
        store.put_document("t1", RULE_KIND, "hot", {**GOOD, "name": "hot"})
        store.put_document("t1", RULE_KIND, "new", {**GOOD, "name": "new"})
        state = AlertState()
        state.observe(True, 61.5, 1_700_000_000 * 10**9, 0)
        store.put_document("t1", STATE_KIND, "hot", state.to_json())

        class Collector:
            def collect(self):  # type: ignore[no-untyped-def]
                return collect(store)

        registry = CollectorRegistry()
        registry.register(Collector())
        text = generate_latest(registry).decode()
    finally:
        store.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    hot = (("alertname", "hot"), ("tenant", "t1"))
    new = (("alertname", "new"), ("tenant", "t1"))
    assert samples[("hotspan_alert_state", tuple(sorted(hot + (("state", "firing"),))))] == 1
    assert samples[("hotspan_alert_state", tuple(sorted(new + (("state", "inactive"),))))] == 1
    assert samples[("hotspan_alert_state", tuple(sorted(new + (("state", "firing"),))))] == 0
    assert samples[("hotspan_alert_value", hot)] == 61.5
    assert samples[("hotspan_alert_evaluations_total", hot)] == 1
    assert samples[("hotspan_alert_last_evaluation_timestamp_seconds", hot)] == 1_700_000_000
    assert ("hotspan_alert_value", new) not in samples


# -- secrets in webhook URLs, the rule's uid ----------------------------------------------------

SECRET_HOOK = "http://alerts:pa55word@127.0.0.1:9/hook?token=s3cret&team=core"
SHOWN_HOOK = "http://alerts:REDACTED@127.0.0.1:9/hook?token=REDACTED&team=REDACTED"


def test_webhook_secrets_are_redacted_and_kept_on_save(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", ALLOW) as srv:
        with srv.client() as c:
            put = c.put("/api/v1/alerts/rules/hooked", json={**GOOD, "webhooks": [SECRET_HOOK]})
            assert put.status_code == 201, put.text
            uid = put.json()["rule"]["uid"]
            assert len(uid) == 16 and int(uid, 16) >= 0
            answers = [
                put,
                c.get("/api/v1/alerts/rules"),
                c.get("/api/v1/alerts"),
                c.get("/api/v1/alerts/rules/hooked"),
            ]
            for r in answers:
                assert r.status_code == 200 or r is put
                assert "pa55word" not in r.text and "s3cret" not in r.text, r.text
                assert SHOWN_HOOK in r.text
            one = answers[-1].json()
            assert one["rule"]["webhooks"] == [SHOWN_HOOK]
            assert [h["url"] for h in one["webhooks"]] == [SHOWN_HOOK]

            # The UI's round trip: what GET showed, edited, saved: the secret stays.
            edited = {**one["rule"], "annotations": {"summary": "edited"}}
            again = c.put("/api/v1/alerts/rules/hooked", json=edited)
            assert again.status_code == 200, again.text
            assert again.json()["rule"]["uid"] == uid
            assert again.json()["rule"]["webhooks"] == [SHOWN_HOOK]
            # Another rule with the redacted form does not borrow the secret.
            other = c.put("/api/v1/alerts/rules/other", json={**GOOD, "webhooks": [SHOWN_HOOK]})
            assert other.status_code == 201 and other.json()["rule"]["uid"] != uid

            # Refusals do not echo the secret either.
            bad = c.put(
                "/api/v1/alerts/rules/hooked",
                json={**GOOD, "webhooks": ["http://u:pa55word@127.0.0.1:99999/x?token=s3cret"]},
            )
            assert bad.status_code == 400 and "pa55word" not in bad.text, bad.text
            assert "s3cret" not in bad.text and "REDACTED" in bad.text

            # A rule deleted and made again is a new rule.
            assert c.delete("/api/v1/alerts/rules/other").status_code == 200
            remade = c.put("/api/v1/alerts/rules/other", json=GOOD)
            assert remade.json()["rule"]["uid"] != other.json()["rule"]["uid"]

        cli = hotspan_cli("get", "hooked", "--server", srv.url)
        assert cli.returncode == 0, cli.stderr
        assert SHOWN_HOOK in cli.stdout and "pa55word" not in cli.stdout
        cli = hotspan_cli("list", "--json", "--server", srv.url)
        assert "s3cret" not in cli.stdout

    from hotspan.alerts import RULE_KIND
    from hotspan.store import open_store

    store = open_store(str(tmp_path / "data"), retention_ns=0)
    try:
        stored = {d.name: d.body for d in store.documents(RULE_KIND, "anonymous")}
    finally:
        store.close()
    assert stored["hooked"]["webhooks"] == [SECRET_HOOK]
    assert stored["hooked"]["annotations"] == {"summary": "edited"}
    assert stored["hooked"]["uid"] == uid
    assert stored["other"]["webhooks"] == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "https://hooks.slack.com/services/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",
            "https://hooks.slack.com/services/REDACTED/REDACTED/REDACTED",
        ),
        (
            "https://discord.com/api/webhooks/112233445566778899/AbCdEf-gHiJkLmNoPqRsTuVwXyZ",
            "https://discord.com/api/webhooks/REDACTED/REDACTED",
        ),
        ("http://am:9093/api/v2/alerts", "http://am:9093/api/v2/alerts"),
        ("http://h/relay?channel=ops", "http://h/relay?channel=REDACTED"),
    ],
)
def test_keys_in_a_webhook_path_are_redacted(url: str, shown: str) -> None:
    from hotspan.alerts.rules import redact_url

    assert redact_url(url) == shown


def test_webhooks_that_redact_alike_all_come_back_on_save() -> None:
    """Two channels of one relay show alike; a rule read back and saved unchanged keeps both."""
    from hotspan.alerts.rules import keep_secrets, parse_rule, redact_rule

    hooks = ["http://h/relay?channel=ops", "http://h/relay?channel=dev"]
    stored = {**GOOD, "webhooks": hooks}
    shown = redact_rule(stored)
    assert shown["webhooks"] == ["http://h/relay?channel=REDACTED"] * 2
    saved = keep_secrets(parse_rule("r", shown), stored)
    assert list(saved.webhooks) == hooks


# -- CPU per request of a service called by others, against an earlier window -----------------

# Every request is the server span of a call from another service (a remote parent), as in a
# service behind a gateway: none of its spans is a trace root.  "slow" makes a request 50 ms
# of CPU instead of 15.  Spans are flushed twice a second, so that they are stored about as
# soon as the profiles (uploaded every second).
CALLED_PROGRAM = traced_program(
    "orders",
    """
    import random
    from opentelemetry.trace import (
        NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context,
    )

    control = sys.argv[2]
    flushed = time.monotonic()
    while True:
        try:
            mode = open(control).read().strip()
        except OSError:
            mode = "fast"
        if mode == "stop":
            break
        caller = SpanContext(
            random.getrandbits(128) | 1, random.getrandbits(64) | 1, is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        with tracer.start_as_current_span(
            "GET /orders", context=set_span_in_context(NonRecordingSpan(caller)),
            kind=SpanKind.SERVER,
        ):
            burn(0.010)
            burn(0.040 if mode == "slow" else 0.005)
        if time.monotonic() - flushed > 0.5:
            provider.force_flush()
            flushed = time.monotonic()
    """,
)


def test_per_request_of_a_called_service_against_an_earlier_window(tmp_path: Path) -> None:
    rule = {
        "selector": '{service_name="orders"}',
        "condition": {
            "kind": "per_request",
            "increase": 50,
            "window": "2s",
            "against": {"offset": "2s"},
        },
    }
    # Bare numbers of seconds for --alert-interval and --alert-lag.
    with running_server(tmp_path / "data", ["--alert-interval", "0.5", "--alert-lag", "1"]) as srv:
        put_rule(srv, "called", rule)
        with srv.client() as c:
            r = c.put("/api/v1/alerts/rules/called", json=rule, headers={"X-Scope-OrgID": "b"})
            assert r.status_code == 201, r.text
        path = tmp_path / "called" / "program.py"
        path.parent.mkdir()
        path.write_text(CALLED_PROGRAM)
        control = tmp_path / "called" / "mode"
        control.write_text("fast")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "OTEL_"))}
        proc = subprocess.Popen(
            [sys.executable, str(path), srv.url, str(control)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            # Both windows hold requests: a value, near 0 % while nothing changed.
            wait_until("a value", lambda: alert(srv, "called")["value"] is not None)
            start = alert(srv, "called")["evaluations"]
            steady = wait_until(
                "three more evaluations",
                lambda: (a := alert(srv, "called"))["evaluations"] >= start + 3 and a,
            )
            assert steady["state"] == "inactive" and steady["value"] < 50, steady
            assert "per request" in steady["summary"], steady
            control.write_text("slow")
            fired = wait_until(
                "the rule firing",
                lambda: [h for h in alert(srv, "called")["history"] if h["state"] == "firing"],
            )
            other_tenant = alert_of(srv, "called", "b")
        finally:
            control.write_text("stop")
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    # 50 ms of CPU per request against 15 ms two seconds earlier.
    assert fired[-1]["value"] > 50, fired
    # The same rule of another tenant sees none of this tenant's data.
    assert other_tenant["evaluations"] > 0 and other_tenant["value"] is None, other_tenant
    assert other_tenant["state"] == "inactive" and other_tenant["lastError"] is None


def alert_of(srv: RunningServer, name: str, tenant: str) -> Dict[str, Any]:
    with srv.client() as c:
        r = c.get(f"/api/v1/alerts/rules/{name}", headers={"X-Scope-OrgID": tenant})
    assert r.status_code == 200, r.text
    return r.json()


# Requests that run Python; while the control file says "contended", a thread spins in Python
# beside them, and they wait for the GIL about half the time they want to run.
GIL_PROGRAM = traced_program(
    "reports",
    """
    import threading

    control = sys.argv[2]
    spinning = threading.Event()

    def spin():
        while True:
            spinning.wait()
            sum(range(300))

    threading.Thread(target=spin, daemon=True).start()
    while True:
        try:
            mode = open(control).read().strip()
        except OSError:
            mode = "calm"
        if mode == "stop":
            break
        if mode == "contended":
            spinning.set()
        else:
            spinning.clear()
        with tracer.start_as_current_span("GET /report"):
            end = time.monotonic() + 0.01
            while time.monotonic() < end:
                sum(range(300))
    """,
)


@native_states
def test_gil_wait_share_fires_while_threads_take_turns_at_the_gil(
    tmp_path: Path, receiver: Receiver
) -> None:
    with running_server(tmp_path / "data", SHARE_ARGS) as srv:
        put_rule(
            srv,
            "gil-bound",
            {
                "selector": '{service_name="reports"}',
                "condition": {"kind": "gil_wait_share", "above": 20, "window": "2s"},
                "webhooks": [receiver.url + "/hook"],
            },
        )
        control = tmp_path / "mode"
        control.write_text("calm")
        script = tmp_path / "program.py"
        script.write_text(GIL_PROGRAM)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HOTSPAN_", "OTEL_"))}
        proc = subprocess.Popen(
            [sys.executable, str(script), srv.url, str(control)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            wait_until("a value", lambda: alert(srv, "gil-bound")["value"] is not None)
            start = alert(srv, "gil-bound")["evaluations"]
            calm = wait_until(
                "three more evaluations",
                lambda: (a := alert(srv, "gil-bound"))["evaluations"] >= start + 3 and a,
            )
            assert calm["state"] == "inactive" and calm["value"] < 20, calm
            control.write_text("contended")
            firing = receiver.wait_for("/hook", "firing")
            fired = alert(srv, "gil-bound")
            control.write_text("calm")
            receiver.wait_for("/hook", "resolved")
        finally:
            control.write_text("stop")
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    # Half the time it wanted to run, give or take.
    value = float(firing["alerts"][0]["annotations"]["value"])
    assert 20 < value < 80, firing
    summary = firing["alerts"][0]["annotations"]["summary"]
    assert "waited for the GIL" in summary, summary
    assert fired["history"][0]["state"] == "firing", fired
    # The link opens the diff of the GIL waits: the stretch before against the window.
    link = dict(
        urllib.parse.parse_qsl(urllib.parse.urlsplit(firing["alerts"][0]["generatorURL"]).query)
    )
    assert link["profileType"] == "gil_wait:gil_wait:nanoseconds:wall:nanoseconds"


def test_a_rule_cannot_page_as_another_tenant() -> None:
    from hotspan.alerts.evaluator import alert_labels
    from hotspan.alerts.rules import parse_rule

    rule = parse_rule(
        "r", {**GOOD, "labels": {"tenant": "team-b", "service_name": "payments", "team": ""}}
    )
    labels = alert_labels("team-a", rule)
    assert labels["tenant"] == "team-a" and labels["alertname"] == "r"
    assert labels["service_name"] == "payments"  # the service may be named
    assert "team" not in labels  # no value, no label, in both of the payload's forms
