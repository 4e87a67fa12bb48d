"""Where alert webhooks may go, and what comes back of them, nothing faked: real servers, real
HTTP (and HTTPS) receivers on 127.0.0.1, the real alert loop.

Loopback, link-local, private and other internal addresses, however spelled, are refused when
a rule is saved and again at every delivery, unless ``--alert-webhook-allow`` lets their
network through; a name is resolved once per delivery and the connection goes to the address
checked; redirects are not followed; a receiver's body never comes back through the API or
the CLI; the URL's user and password go as basic auth."""

from __future__ import annotations

import base64
import http.server
import ipaddress
import ssl
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from hotspan.alerts import RULE_KIND, STATE_KIND, webhook_post
from hotspan.alerts.rules import parse_rule
from hotspan.alerts.state import AlertState
from hotspan.alerts.targets import (
    IPAddress,
    WebhookRefused,
    address_kind,
    literal_address,
    parse_allow,
    permitted,
    public_error,
)
from hotspan.alerts.webhook_post import check_urls, post
from hotspan.store import open_store
from tests.alerts.test_delivery import INTERVAL_S, Pusher, put, rule, wait_alert
from tests.conftest import RunningServer, running_server
from tests.helpers import self_signed_certificate

ARGS = ["--alert-interval", f"{INTERVAL_S}s", "--alert-lag", "0s"]
LOOPBACK = ["127.0.0.0/8", "::1/128"]
ALLOW = [arg for net in LOOPBACK for arg in ("--alert-webhook-allow", net)]
SECRET = "SECRET-FROM-AN-INTERNAL-SERVICE"
FORBIDDEN_LOOPBACK = "forbidden address (loopback; see --alert-webhook-allow CIDR)"


class Receiver:
    """Records each POST (path, Authorization and Host headers).  /fail answers 500 with a
    body only an internal service would know; /redirect answers 302 to /target."""

    def __init__(self, tls: Optional[ssl.SSLContext] = None) -> None:
        self.requests: List[Dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.requests.append(
                        {
                            "path": self.path,
                            "authorization": self.headers.get("Authorization"),
                            "host": self.headers.get("Host"),
                        }
                    )
                if self.path.startswith("/fail"):
                    self._answer(500, SECRET.encode())
                elif self.path.startswith("/redirect"):
                    self._answer(302, SECRET.encode(), {"Location": receiver.url + "/target"})
                else:
                    self._answer(200, b"ok")

            def _answer(self, status: int, body: bytes, headers: Optional[dict] = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> List[str]:
        with self.lock:
            return [r["path"] for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


# -- which addresses ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.1", "loopback"),
        ("0x7f000001", "loopback"),
        ("2130706433", "loopback"),
        ("0177.0.0.1", "loopback"),
        ("127.0.0.1.", "loopback"),
        ("[::1]", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:7f00:1", "loopback"),
        ("64:ff9b::7f00:1", "loopback"),  # NAT64
        ("2002:7f00:1::1", "loopback"),  # 6to4
        ("169.254.169.254", "link-local"),  # the clouds' metadata service
        ("fe80::1", "link-local"),
        ("10.1.2.3", "private"),
        ("012.1.2.3", "private"),  # octal 10
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fd00::1", "private"),
        ("::ffff:10.0.0.1", "private"),
        ("0.0.0.0", "unspecified"),
        ("0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "reserved"),
        ("2001:db8::1", "reserved"),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::808:808", None),  # DNS64's answer for a public IPv4 name
    ],
)
def test_address_kinds_whatever_the_spelling(host: str, kind: Optional[str]) -> None:
    ip = literal_address(host)
    assert ip is not None, host
    assert address_kind(ip) == kind


def test_names_are_not_addresses_and_allow_lists_let_networks_through() -> None:
    for name in ("alertmanager", "hook.example.com", "08.1.2.3", "1.2.3.256", "0x1g"):
        assert literal_address(name) is None, name
    allow = parse_allow(LOOPBACK)
    loopback: List[IPAddress] = [
        ipaddress.ip_address(a) for a in ("127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1")
    ]
    for ip in loopback:
        assert permitted(ip, ()) == "loopback"
        assert permitted(ip, allow) is None, ip
    assert permitted(ipaddress.ip_address("10.0.0.1"), allow) == "private"


def test_errors_shown_are_a_status_or_a_kind() -> None:
    """What an older server stored (a receiver's body, an exception quoting the peer) is cut."""
    assert public_error(f"HTTP 500: {SECRET}") == "HTTP 500"
    assert public_error("RemoteProtocolError: illegal status line: b'-ERR'") == (
        "failed (RemoteProtocolError)"
    )
    assert public_error("bad URL: nonnumeric port") == "bad URL"
    for kept in ("HTTP 404", "connection refused", "no answer within 2 s", FORBIDDEN_LOOPBACK):
        assert public_error(kept) == kept
    assert public_error(None) is None


# -- when a rule is saved -----------------------------------------------------------------------

INTERNAL_HOOKS = [
    "http://127.0.0.1:9093/hook",
    "http://[::1]:9093/hook",
    "http://localhost:9093/hook",
    "http://0x7f000001:9093/hook",
    "http://127.1:9093/hook",
    "http://2130706433:9093/hook",
    "http://0177.0.0.1:9093/hook",
    "http://[::ffff:127.0.0.1]:9093/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/hook",
    "http://10.0.0.5:8123/?query=SELECT+1",
    "http://192.168.1.1/admin",
    "http://[fd12::1]/hook",
    "http://0.0.0.0:8123/",
    "https://224.0.0.1/hook",
]


@pytest.mark.parametrize("url", INTERNAL_HOOKS)
def test_rules_with_internal_webhooks_get_a_400_naming_the_setting(
    module_server: RunningServer, url: str
) -> None:
    with module_server.client() as c:
        r = c.put("/api/v1/alerts/rules/internal", json=rule([url]))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "--alert-webhook-allow" in error and "address" in error, error
        assert c.get("/api/v1/alerts/rules/internal").status_code == 404


def test_a_refusal_does_not_echo_the_urls_secrets(module_server: RunningServer) -> None:
    with module_server.client() as c:
        r = c.put(
            "/api/v1/alerts/rules/internal",
            json=rule(["http://ops:pa55word@localhost:8123/?password=s3cret"]),
        )
    assert r.status_code == 400, r.text
    assert "pa55word" not in r.text and "s3cret" not in r.text and "REDACTED" in r.text
    assert "resolves to a loopback address" in r.json()["error"]


def test_allowed_networks_are_accepted_and_the_others_still_refused(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", ALLOW) as srv, srv.client() as c:
        for url in INTERNAL_HOOKS[:8]:  # loopback, every spelling
            r = c.put("/api/v1/alerts/rules/local", json=rule([url]))
            assert r.status_code in (200, 201), (url, r.text)
        for url in INTERNAL_HOOKS[8:]:
            r = c.put("/api/v1/alerts/rules/internal", json=rule([url]))
            assert r.status_code == 400, (url, r.text)


# -- at every delivery --------------------------------------------------------------------------


def hotspan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hotspan", "alerts", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_delivery_refuses_internal_addresses_a_stored_rule_points_at(
    tmp_path: Path, receiver: Receiver
) -> None:
    """A rule stored while its network was allowed (or by an older server): each delivery
    checks again, and nothing reaches the receiver."""
    hooks = [
        f"http://127.0.0.1:{receiver.port}/literal",
        f"http://0x7f000001:{receiver.port}/odd",
        f"http://localhost:{receiver.port}/name",
    ]
    body = parse_rule("hot", rule(hooks)).to_json()
    # And a state an older server stored, with a receiver's body in its delivery error.
    old_hook = "http://8.8.8.8:9/old"
    old = parse_rule("old", {**rule([old_hook]), "selector": '{service_name="quiet"}'})
    old_state = AlertState(uid="fedcba9876543210")
    labels = {"alertname": "old", "tenant": "anonymous", "service_name": "quiet"}
    old_state.follow(labels, [old_hook], 1)  # as the evaluator will: it keeps the error
    old_state.delivery_errors[old_hook] = f"HTTP 500: {SECRET}"
    store = open_store(str(tmp_path / "data"), retention_ns=0)
    try:
        store.put_document("anonymous", RULE_KIND, "hot", {**body, "uid": "0123456789abcdef"})
        store.put_document("anonymous", RULE_KIND, "old", {**old.to_json(), "uid": old_state.uid})
        store.put_document("anonymous", STATE_KIND, "old", old_state.to_json())
    finally:
        store.close()
    with running_server(tmp_path / "data", ARGS) as srv:
        pusher = Pusher(srv.url)
        pusher.mode = "hot"
        try:
            refused = wait_alert(
                srv,
                "hot",
                "firing, every delivery refused",
                lambda a: a["state"] == "firing" and all(h["error"] for h in a["webhooks"]),
            )
            with srv.client() as c:
                listed = c.get("/api/v1/alerts").text
                shown = c.get("/api/v1/alerts/rules/old").json()
            cli = hotspan_cli("get", "old", "--server", srv.url)
        finally:
            pusher.close()
    assert shown["webhooks"][0]["error"] == "HTTP 500", shown
    assert SECRET not in listed and SECRET not in cli.stdout and "HTTP 500" in cli.stdout
    assert [h["error"] for h in refused["webhooks"]] == [FORBIDDEN_LOOPBACK] * 3, refused
    assert [h["delivered"] for h in refused["webhooks"]] == [None] * 3
    assert receiver.paths() == []


def test_allowed_delivery_sends_basic_auth_follows_no_redirect_and_echoes_no_body(
    tmp_path: Path, receiver: Receiver
) -> None:
    port = receiver.port
    hooks = [
        f"http://alerts:pa%24%24word@127.0.0.1:{port}/auth",
        f"http://127.0.0.1:{port}/fail",
        f"http://127.0.0.1:{port}/redirect",
    ]
    with running_server(tmp_path / "data", ARGS + ALLOW) as srv:
        pusher = Pusher(srv.url)
        try:
            put(srv, "hot", rule(hooks))
            pusher.mode = "hot"
            done = wait_alert(
                srv,
                "hot",
                "the three deliveries' outcomes",
                lambda a: (
                    a["webhooks"][0]["delivered"] == "firing"
                    and all(h["error"] for h in a["webhooks"][1:])
                ),
            )
            with srv.client() as c:
                answers = [
                    c.get("/api/v1/alerts").text,
                    c.get("/api/v1/alerts/rules").text,
                    c.get("/api/v1/alerts/rules/hot").text,
                ]
            cli = [
                hotspan_cli("get", "hot", "--server", srv.url),
                hotspan_cli("get", "hot", "--json", "--server", srv.url),
                hotspan_cli("list", "--json", "--server", srv.url),
            ]
        finally:
            pusher.close()
    auth = [r["authorization"] for r in receiver.requests if r["path"] == "/auth"]
    assert auth and set(auth) == {"Basic " + base64.b64encode(b"alerts:pa$$word").decode()}
    assert all(r["authorization"] is None for r in receiver.requests if r["path"] != "/auth")
    errors = [h["error"] for h in done["webhooks"]]
    assert errors == [None, "HTTP 500", "HTTP 302 (redirects are not followed)"], errors
    assert "/target" not in receiver.paths()
    for out in cli:
        assert out.returncode == 0, out.stderr
    shown = answers + [out.stdout for out in cli]
    assert "HTTP 500" in shown[2] and "HTTP 500" in cli[0].stdout
    for text in shown:
        assert SECRET not in text and "pa$$word" not in text and "pa%24%24word" not in text


# -- one delivery: resolved once, connected as checked -------------------------------------------


class Resolver:
    """The system's resolver cannot be told what to answer in a test: this one answers a
    fixed list of addresses for any name, and counts the questions."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = [ipaddress.ip_address(a) for a in addresses]
        self.asked: List[str] = []

    def __call__(self, host: str, port: int, timeout: float) -> List[IPAddress]:
        self.asked.append(host)
        return list(self.addresses)


def test_a_name_is_resolved_once_and_connected_to_at_the_address_checked(
    receiver: Receiver,
) -> None:
    allow = parse_allow(LOOPBACK)
    # hook.invalid has no address in DNS: reaching the receiver shows the connection went to
    # the address checked, not to one the HTTP client looked up again.
    to_loopback = Resolver("127.0.0.1")
    assert (
        post(f"http://hook.invalid:{receiver.port}/named", b"{}", 2.0, allow, to_loopback) is None
    )
    assert to_loopback.asked == ["hook.invalid"]
    assert receiver.requests[-1]["path"] == "/named"
    assert receiver.requests[-1]["host"] == f"hook.invalid:{receiver.port}"

    # Not allowed: refused before any connection.
    url = f"http://hook.invalid:{receiver.port}/refused"
    assert post(url, b"{}", 2.0, (), Resolver("127.0.0.1")) == FORBIDDEN_LOOPBACK
    # One forbidden address among global ones is enough to refuse.
    mixed = Resolver("8.8.8.8", "127.0.0.1")
    assert post(url, b"{}", 2.0, (), mixed) == FORBIDDEN_LOOPBACK
    assert "/refused" not in receiver.paths()

    # A name that resolves to a public address when the rule is saved passes then; the
    # delivery resolves it again and refuses what it finds (a rebinding gains nothing).
    check_urls([url], (), resolver=Resolver("8.8.8.8"))
    with pytest.raises(WebhookRefused, match="resolves to a loopback address"):
        check_urls([url], (), resolver=Resolver("127.0.0.1"))
    with pytest.raises(WebhookRefused, match="private"):
        check_urls([url], (), resolver=Resolver("2606:4700::1111", "10.0.0.7"))


def test_refused_and_unresolved_show_their_kind() -> None:
    allow = parse_allow(LOOPBACK)
    closed = Receiver()
    closed.close()
    assert post(closed.url + "/x", b"{}", 2.0, allow) == "connection refused"
    # A long deadline: the point is the resolver's answer, however slow it gives it.
    assert post("http://no-such-host.invalid/x", b"{}", 30.0, allow) == "host name not resolved"


def test_https_is_verified_against_the_host_name_not_the_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = self_signed_certificate(tmp_path, "hook.test")
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    # The certificate is its own CA: the system's trust store is told to take it.
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    receiver = Receiver(tls=server_tls)
    try:
        allow = parse_allow(LOOPBACK)
        to_loopback = Resolver("127.0.0.1")
        url = f"https://hook.test:{receiver.port}/tls"
        assert post(url, b"{}", 5.0, allow, to_loopback) is None
        assert receiver.paths() == ["/tls"]
        # The same receiver under another name, or its address: the certificate does not
        # name them.
        other = f"https://other.test:{receiver.port}/tls"
        assert post(other, b"{}", 5.0, allow, to_loopback) == "TLS certificate not accepted"
        assert post(receiver.url + "/tls", b"{}", 5.0, allow) == "TLS certificate not accepted"
        assert receiver.paths() == ["/tls"]
    finally:
        receiver.close()


def test_deliveries_share_the_trust_store_they_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading the CAs costs more CPU than a delivery: loaded once, and again only for
    another trust store (SSL_CERT_FILE / SSL_CERT_DIR)."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    first = webhook_post._tls()
    assert webhook_post._tls() is first
    cert, _ = self_signed_certificate(tmp_path, "hook.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert webhook_post._tls() is not first
