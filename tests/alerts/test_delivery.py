"""Alert notifications under trouble, nothing faked: real servers evaluating twice a second, data
pushed over the Pyroscope ingest API (folded stacks, stamped as they arrive), and real HTTP
receivers in the test that hang, fail, trickle, or speak Alertmanager's own API."""

from __future__ import annotations

import contextlib
import http.server
import json
import select
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import httpx
import pytest

from hotspan.alerts.state import FIRING, AlertState
from hotspan.alerts.targets import parse_allow
from hotspan.alerts.webhook_post import post
from tests.clickhouse_fixture import clickhouse_server as clickhouse_server  # noqa: F401
from tests.clickhouse_fixture import clickhouse_url as clickhouse_url  # noqa: F401
from tests.conftest import RunningServer, running_server
from tests.helpers import TLS

INTERVAL_S = 0.25
# The receivers listen on loopback, which webhooks reach only when the operator allows it.
ALLOW = ["--alert-webhook-allow", "127.0.0.0/8"]
ARGS = ["--alert-interval", f"{INTERVAL_S}s", "--alert-lag", "0s", *ALLOW]
WINDOW_S = 2
HOT = b"main;handle;hot_loop 90\nmain;handle;render 10\n"
COOL = b"main;handle;hot_loop 10\nmain;handle;render 90\n"


def rule(webhooks: List[str], **extra: Any) -> Dict[str, Any]:
    return {
        "selector": '{service_name="shop"}',
        "condition": {
            "kind": "function_share",
            "function": "hot_loop",
            "above": 50,
            "window": f"{WINDOW_S}s",
        },
        "webhooks": webhooks,
        **extra,
    }


class Pusher:
    """Pushes one profile of the service "shop" every 0.3 s: hot (hot_loop holds 90 %), cool
    (10 %), or nothing ("stop"); ``ago_s`` stamps them that long ago (a late upload)."""

    def __init__(self, url: str, ago_s: float = 0) -> None:
        self.url = url
        self.mode = "cool"
        self.ago_s = ago_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10, verify=TLS) as client:
            while not self._stop.wait(0.3):
                if self.mode == "stop":
                    continue
                params = {"name": "shop.cpu", "format": "folded"}
                if self.ago_s:
                    params["from"] = str(time.time_ns() - int(self.ago_s * 1e9))
                with contextlib.suppress(httpx.HTTPError):  # the server restarting
                    client.post(
                        self.url + "/ingest",
                        params=params,
                        content=HOT if self.mode == "hot" else COOL,
                    )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Receiver:
    """Records every POST as it is read.  Modes: "ok" (200), "fail" (500), "hang" (reads the
    request, then answers nothing until the mode changes).  ``most_open`` is the most requests
    it held at once whose sender was still waiting (had not closed the connection)."""

    def __init__(self) -> None:
        self.requests: List[Dict[str, Any]] = []
        self.mode = "ok"
        self.open = 0
        self.most_open = 0
        self.cond = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length))
                with receiver.cond:
                    receiver.open += 1
                    receiver.most_open = max(receiver.most_open, receiver.open)
                    mode = receiver.mode
                    receiver.requests.append({"path": self.path, "body": body, "mode": mode})
                    receiver.cond.notify_all()
                    while receiver.mode == "hang" and not self._sender_gone():
                        receiver.cond.wait(0.05)
                    receiver.open -= 1
                try:
                    self.send_response(500 if mode == "fail" else 200)
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up on us

            def _sender_gone(self) -> bool:
                readable, _, _ = select.select([self.connection], [], [], 0)
                if not readable:
                    return False
                try:
                    return self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set_mode(self, mode: str) -> None:
        with self.cond:
            self.mode = mode
            self.cond.notify_all()

    def statuses(self, path: str = "", mode: str = "") -> List[str]:
        with self.cond:
            return [
                r["body"]["status"]
                for r in self.requests
                if r["path"].startswith(path) and (not mode or r["mode"] == mode)
            ]

    def bodies(self, path: str = "", mode: str = "ok") -> List[Any]:
        with self.cond:
            return [r["body"] for r in self.requests if r["path"] == path and r["mode"] == mode]

    def wait_for(self, what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = check()
                if found:
                    return found
                left = deadline - time.monotonic()
                assert left > 0, f"timed out waiting for {what}; got {self.requests}"
                self.cond.wait(min(left, 0.5))

    def close(self) -> None:
        self.set_mode("ok")
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def put(srv: RunningServer, name: str, body: Dict[str, Any]) -> None:
    with srv.client() as c:
        r = c.put(f"/api/v1/alerts/rules/{name}", json=body)
    assert r.status_code in (200, 201), r.text


def alert(srv: RunningServer, name: str) -> Dict[str, Any]:
    with srv.client() as c:
        r = c.get(f"/api/v1/alerts/rules/{name}")
    assert r.status_code == 200, r.text
    return r.json()


def wait_alert(
    srv: RunningServer, name: str, what: str, check: Callable[[Dict[str, Any]], bool]
) -> Dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        found = alert(srv, name)
        if check(found):
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {found}"
        time.sleep(0.1)


def passes(srv: RunningServer, name: str, count: int) -> Dict[str, Any]:
    start = alert(srv, name)["evaluations"]
    return wait_alert(srv, name, f"{count} passes", lambda a: a["evaluations"] >= start + count)


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- a receiver that accepts and never answers -----------------------------------------------


def test_hanging_receiver_holds_one_send_and_later_gets_only_the_newest_state(
    tmp_path: Path, receiver: Receiver
) -> None:
    receiver.set_mode("hang")
    with running_server(tmp_path / "data", ARGS) as srv:
        pusher = Pusher(srv.url)
        try:
            put(srv, "hot", rule([receiver.url + "/hook"]))
            pusher.mode = "hot"
            receiver.wait_for("a firing send", lambda: receiver.statuses("/hook"))
            # Many passes while the receiver hangs: one send at a time, retried after a
            # deadline and a back-off, never piling up.
            passes(srv, "hot", 8)
            hung = receiver.statuses("/hook")
            assert receiver.most_open == 1, receiver.requests
            assert hung and set(hung) == {FIRING} and len(hung) <= 4, hung
            assert alert(srv, "hot")["webhooks"][0]["error"], "the failure is shown"

            # It cools while a firing send hangs: the resolved waits behind it, never beside.
            receiver.wait_for("a send in flight", lambda: receiver.open == 1)
            pusher.mode = "cool"
            wait_alert(srv, "hot", "inactive", lambda a: a["state"] == "inactive")
            with receiver.cond:
                seen = len(receiver.requests)
            receiver.set_mode("ok")
            receiver.wait_for("resolved", lambda: "resolved" in receiver.statuses("/hook", "ok"))
            done = wait_alert(
                srv, "hot", "delivered", lambda a: a["webhooks"][0]["delivered"] == "resolved"
            )
            passes(srv, "hot", 3)
        finally:
            pusher.close()
    with receiver.cond:
        after = [r["body"]["status"] for r in receiver.requests[seen:]]
    # Once it answers it gets the newest state, once: no stale firing, before or after.
    assert after == ["resolved"], after
    assert receiver.most_open == 1
    assert done["webhooks"][0]["error"] is None


def test_one_tenants_hanging_receivers_hold_up_another_by_a_deadline_at_most() -> None:
    """A tenant with many webhooks, each a different URL of a receiver that accepts and never
    answers, and another tenant with one receiver that works: the second tenant's send waits
    for one deadline at most (a thread freed), not behind the first tenant's queue."""
    from hotspan.alerts.delivery import Dispatcher, Send

    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(128)  # accepted by the kernel, never answered
    ok_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=ok_server.serve_forever, daemon=True).start()
    deadline = 1.0
    dispatcher = Dispatcher(threads=4, deadline_s=deadline, allow=parse_allow(["127.0.0.0/8"]))
    try:
        port = hanging.getsockname()[1]
        for i in range(40):
            url = f"http://127.0.0.1:{port}/hook-{i}"
            assert dispatcher.want(Send(("evil", f"r{i}", url), "a", FIRING, b"{}")) is None
        time.sleep(0.2)  # the first tenant's sends take every thread
        victim_url = f"http://127.0.0.1:{ok_server.server_address[1]}/hook"
        started = time.monotonic()
        assert dispatcher.want(Send(("victim", "r", victim_url), "a", FIRING, b"{}")) is None
        delivered = None
        while delivered is None and time.monotonic() - started < 15:
            for outcome in dispatcher.outcomes():
                if outcome.key[0] == "victim":
                    delivered = time.monotonic() - started
                    assert outcome.error is None, outcome
            time.sleep(0.05)
        # Behind the whole queue it would have waited 40 / 4 deadlines.
        assert delivered is not None and delivered < deadline + 1.0, delivered
        # One tenant cannot fill the queue for all.
        refused = [
            dispatcher.want(
                Send(("evil", f"more{i}", f"http://127.0.0.1:{port}/x{i}"), "a", FIRING, b"{}")
            )
            for i in range(dispatcher.max_pending_per_tenant)
        ]
        assert any(r and "this tenant" in r for r in refused), refused[-1]
        assert dispatcher.want(Send(("victim", "r2", victim_url), "b", FIRING, b"{}")) is None
    finally:
        dispatcher.close()
        ok_server.shutdown()
        hanging.close()


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the standard library's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_trickling_receiver_is_cut_off_at_the_deadline() -> None:
    """One byte of the answer every 0.2 s: no single read ever times out, the POST's deadline
    still ends it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 10_000:
                if stop.wait(0.2):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    threading.Thread(target=serve, daemon=True).start()
    result: List[Optional[str]] = []
    sender = threading.Thread(
        target=lambda: result.append(
            post(
                f"http://127.0.0.1:{listener.getsockname()[1]}/hook",
                b"{}",
                deadline_s=1.0,
                allow=parse_allow(["127.0.0.1/32"]),
            )
        ),
        daemon=True,
    )
    sender.start()
    sender.join(30)
    stop.set()
    listener.close()
    assert result and result[0] is not None and "within 1 s" in result[0], result


# -- restarts ---------------------------------------------------------------------------------


def test_restart_while_firing_sends_nothing_again_and_a_pending_resolved_still_goes_out(
    tmp_path: Path, receiver: Receiver
) -> None:
    data = tmp_path / "data"
    with running_server(data, ARGS) as srv:
        pusher = Pusher(srv.url)
        try:
            put(srv, "hot", rule([receiver.url + "/hook"]))
            pusher.mode = "hot"
            wait_alert(srv, "hot", "firing delivered", lambda a: a["webhooks"][0]["delivered"])
        finally:
            pusher.close()
    assert receiver.statuses("/hook") == [FIRING]

    with running_server(data, ARGS) as srv:
        pusher = Pusher(srv.url)
        pusher.mode = "hot"
        try:
            state = passes(srv, "hot", 4)
            assert state["state"] == "firing", state
            assert receiver.statuses("/hook") == [FIRING], "no firing again after a restart"
            receiver.set_mode("fail")
            pusher.mode = "cool"
            receiver.wait_for("a failed resolved", lambda: receiver.statuses("/hook", "fail"))
        finally:
            pusher.close()
    receiver.set_mode("ok")

    with running_server(data, ARGS) as srv:
        receiver.wait_for(
            "resolved after the restart", lambda: receiver.statuses("/hook", "ok")[1:]
        )
        passes(srv, "hot", 3)
    assert receiver.statuses("/hook", "ok") == [FIRING, "resolved"]
    assert set(receiver.statuses("/hook", "fail")) == {"resolved"}


# -- no data ----------------------------------------------------------------------------------


def test_no_data_resolves_a_firing_alert_after_its_hold_and_ends_pending(
    tmp_path: Path, receiver: Receiver
) -> None:
    with running_server(tmp_path / "data", ARGS) as srv:
        pusher = Pusher(srv.url)
        try:
            put(srv, "hot", rule([receiver.url + "/hook"]))
            put(srv, "hot-for-an-hour", rule([receiver.url + "/pending"], **{"for": "1h"}))
            pusher.mode = "hot"
            receiver.wait_for("firing", lambda: receiver.statuses("/hook"))
            wait_alert(srv, "hot-for-an-hour", "pending", lambda a: a["state"] == "pending")
            pusher.mode = "stop"
            receiver.wait_for("resolved", lambda: "resolved" in receiver.statuses("/hook"))
            hot = wait_alert(srv, "hot", "inactive", lambda a: a["state"] == "inactive")
            pending = alert(srv, "hot-for-an-hour")
        finally:
            pusher.close()
    assert hot["history"][0] == {**hot["history"][0], "state": "inactive", "reason": "no data"}
    assert hot["value"] is None and hot["noDataSince"]
    # Resolved after the hold: max(window 2 s, 3 intervals of 0.25 s) of no data in a row.
    held = parse_time(hot["resolvedAt"]) - parse_time(hot["noDataSince"])
    assert held.total_seconds() >= max(WINDOW_S, 3 * INTERVAL_S), hot
    assert pending["state"] == "inactive", pending
    assert pending["history"][0]["reason"] == "no data", pending
    assert receiver.statuses("/pending") == []


# -- the rule changes under a firing alert ----------------------------------------------------


def test_editing_labels_while_firing_resolves_the_old_alert(
    tmp_path: Path, receiver: Receiver
) -> None:
    with running_server(tmp_path / "data", ARGS) as srv:
        pusher = Pusher(srv.url)
        try:
            put(srv, "hot", rule([receiver.url + "/a"], labels={"team": "a"}))
            pusher.mode = "hot"
            receiver.wait_for("firing at /a", lambda: receiver.bodies("/a"))
            put(srv, "hot", rule([receiver.url + "/b"], labels={"team": "b"}))
            receiver.wait_for("resolved at /a", lambda: len(receiver.bodies("/a")) >= 2)
            receiver.wait_for("firing at /b", lambda: receiver.bodies("/b"))
            passes(srv, "hot", 3)
            state = alert(srv, "hot")
        finally:
            pusher.close()
    fired, ended = receiver.bodies("/a")
    (new,) = receiver.bodies("/b")
    assert [fired["status"], ended["status"], new["status"]] == ["firing", "resolved", "firing"]
    assert ended["alerts"][0]["labels"]["team"] == "a" == fired["alerts"][0]["labels"]["team"]
    assert ended["alerts"][0]["fingerprint"] == fired["alerts"][0]["fingerprint"]
    assert new["alerts"][0]["labels"]["team"] == "b"
    assert new["alerts"][0]["fingerprint"] != fired["alerts"][0]["fingerprint"]
    assert state["state"] == "firing" and state["retired"] == [], state
    assert [h.get("reason") for h in state["history"]][:2] == [None, "rule changed"]


def test_a_rule_deleted_and_created_again_starts_fresh(tmp_path: Path, receiver: Receiver) -> None:
    with running_server(tmp_path / "data", ARGS) as srv:
        pusher = Pusher(srv.url)
        try:
            put(srv, "hot", rule([receiver.url + "/hook"]))
            pusher.mode = "hot"
            receiver.wait_for("firing", lambda: receiver.bodies("/hook"))
            old = alert(srv, "hot")
            with srv.client() as c:
                assert c.delete("/api/v1/alerts/rules/hot").status_code == 200
            put(srv, "hot", rule([receiver.url + "/hook"]))
            receiver.wait_for("resolved, then firing", lambda: len(receiver.bodies("/hook")) >= 3)
            passes(srv, "hot", 3)
            new = alert(srv, "hot")
        finally:
            pusher.close()
    first, ended, again = receiver.bodies("/hook")
    assert [first["status"], ended["status"], again["status"]] == ["firing", "resolved", "firing"]
    assert ended["alerts"][0]["startsAt"] == first["alerts"][0]["startsAt"]
    assert parse_time(again["alerts"][0]["startsAt"]) > parse_time(first["alerts"][0]["startsAt"])
    assert new["firedAt"] != old["firedAt"]
    assert new["rule"]["uid"] != old["rule"]["uid"]
    # Its own story only: the old alert's firing and end are not inherited.
    assert [h["state"] for h in new["history"]] == ["firing"], new["history"]


# -- several servers over one store -----------------------------------------------------------


def test_two_servers_over_one_clickhouse_notify_once(
    tmp_path: Path,
    clickhouse_url: str,  # noqa: F811
    receiver: Receiver,
) -> None:
    # Passes twice a second here: the lease then runs 1.5 s, well beyond a pass over ClickHouse
    # on a busy machine, so that it never changes hands (which would send twice).
    args = ["--alert-interval", "0.5s", "--alert-lag", "0s", "--store", clickhouse_url, *ALLOW]
    with running_server(tmp_path / "a", args) as a, running_server(tmp_path / "b", args) as b:
        pusher = Pusher(a.url)
        try:
            put(b, "hot", rule([receiver.url + "/hook"]))
            pusher.mode = "hot"
            receiver.wait_for("firing", lambda: receiver.statuses("/hook"))
            passes(a, "hot", 5)
            assert receiver.statuses("/hook") == [FIRING]
            pusher.mode = "cool"
            receiver.wait_for("resolved", lambda: "resolved" in receiver.statuses("/hook"))
            passes(b, "hot", 5)
            seen_by = alert(a, "hot"), alert(b, "hot")
        finally:
            pusher.close()
    assert receiver.statuses("/hook") == [FIRING, "resolved"]
    assert seen_by[0]["state"] == seen_by[1]["state"] == "inactive"


# -- Alertmanager's own API -------------------------------------------------------------------


def test_alertmanager_api_gets_postable_alerts(tmp_path: Path, receiver: Receiver) -> None:
    url = receiver.url + "/am/api/v2/alerts"
    with running_server(tmp_path / "data", ARGS) as srv:
        pusher = Pusher(srv.url)
        try:
            put(srv, "hot", rule([url], labels={"severity": "page"}))
            pusher.mode = "hot"
            receiver.wait_for("firing", lambda: receiver.bodies("/am/api/v2/alerts"))
            pusher.mode = "cool"
            wait_alert(
                srv, "hot", "resolved", lambda a: a["webhooks"][0]["delivered"] == "resolved"
            )
        finally:
            pusher.close()
    fired, ended = receiver.bodies("/am/api/v2/alerts")
    now = datetime.now(timezone.utc)
    for body in (fired, ended):
        assert isinstance(body, list) and len(body) == 1, body
        (one,) = body
        assert set(one) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
        assert one["labels"] == {
            "alertname": "hot",
            "tenant": "anonymous",
            "service_name": "shop",
            "severity": "page",
        }
        assert "hot_loop" in one["annotations"]["summary"]
        assert one["generatorURL"].startswith(srv.url + "/diff?")
    assert fired[0]["startsAt"] == ended[0]["startsAt"]
    # Firing: ends some re-sends ahead; resolved: ended, in the past.
    assert parse_time(fired[0]["endsAt"]) > parse_time(fired[0]["startsAt"])
    assert parse_time(fired[0]["endsAt"]) > now
    assert parse_time(ended[0]["endsAt"]) <= now


def test_alertmanager_api_gets_firing_alerts_again_and_webhooks_do_not() -> None:
    state = AlertState()
    state.labels, state.webhooks = {"alertname": "x"}, ["http://am/api/v2/alerts", "http://hook/"]
    state.observe(True, 80.0, 1_000 * 10**9, 0)
    for url in state.webhooks:
        assert state.wanted(url, 1_000 * 10**9, 60 * 10**9) == FIRING
        state.sent(state.alert, url, FIRING, None, 1_000 * 10**9)
        assert state.wanted(url, 1_030 * 10**9, 60 * 10**9) is None
    assert state.wanted("http://am/api/v2/alerts", 1_061 * 10**9, 60 * 10**9) == FIRING
    assert state.wanted("http://hook/", 1_061 * 10**9, 60 * 10**9) is None


# -- late samples -----------------------------------------------------------------------------


def test_windows_end_alert_lag_ago(tmp_path: Path, receiver: Receiver) -> None:
    """Uploads stamped 3 s before they arrive: with --alert-lag 4s the 2 s window sees them
    (a window ending now never would)."""
    lag_s = 4
    args = ["--alert-interval", f"{INTERVAL_S}s", "--alert-lag", f"{lag_s}s", *ALLOW]
    with running_server(tmp_path / "data", args) as srv:
        pusher = Pusher(srv.url, ago_s=3)
        try:
            late = rule([receiver.url + "/hook"])
            late["condition"]["window"] = "2s"
            put(srv, "late", late)
            pusher.mode = "hot"
            firing = receiver.wait_for("firing", lambda: receiver.bodies("/hook"))[0]
        finally:
            pusher.close()
    link = firing["alerts"][0]["generatorURL"]
    until = int(dict(httpx.URL(link).params)["rightUntil"])
    starts = parse_time(firing["alerts"][0]["startsAt"]).timestamp()
    assert lag_s - 1 <= starts - until <= lag_s + 5, (starts, until)


def test_a_rule_deleted_while_firing_owes_its_resolved_until_delivered() -> None:
    state = AlertState()
    state.follow({"alertname": "x"}, ["http://hook/"], 1)
    state.observe(True, 80.0, 10, 0)
    state.sent(state.alert, "http://hook/", FIRING, None, 11)
    stored = AlertState.from_json(state.to_json())
    stored.retire(20, "rule deleted")
    assert [(n.status, n.ends_at_ns) for n in stored.notices(20, 0)] == [("resolved", 20)]
    stored.sent(stored.alert, "http://hook/", "resolved", "HTTP 500: down", 21)
    assert [n.status for n in stored.notices(22, 0)] == ["resolved"] and not stored.done
    stored.sent(stored.alert, "http://hook/", "resolved", None, 23)
    assert stored.done
