"""Where alert webhooks may go, and what of a failed delivery is shown.

Whoever may change a tenant's rules (the query token) chooses where the server sends POSTs:
left alone, that reaches whatever the server can reach, its own loopback services and the
cloud's metadata address included.  So webhooks to loopback, link-local, private, unspecified,
multicast and other addresses that are not globally reachable are refused, unless the operator
lists their network with ``--alert-webhook-allow CIDR``.  IPv4 inside IPv6 (mapped
``::ffff:a.b.c.d``, 6to4, NAT64's ``64:ff9b::/96``) counts as the IPv4 address, and the
spellings C's ``inet_aton`` takes (``127.1``, ``0x7f000001``, ``2130706433``, ``0177.0.0.1``)
as the address they spell.

Checked twice: when a rule is saved (a literal address, or a name as it resolves then) and at
each delivery, which resolves the name, refuses it if any of its addresses is forbidden, and
connects to an address it checked (:mod:`~hotspan.alerts.delivery`): a DNS answer that changes
between the two (rebinding) gains nothing.

A receiver's answer is shown as its status code only (``HTTP 500``), a network failure as its
kind: a receiver's body, or the bytes of whatever non-HTTP service a URL points at, never come
back through the API, so that no one reads internal services through the server.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

__all__ = [
    "ALLOW_SETTING",
    "IPAddress",
    "IPNetwork",
    "Resolver",
    "WebhookRefused",
    "address_kind",
    "check_webhook",
    "literal_address",
    "parse_allow",
    "permitted",
    "public_error",
    "resolve",
]

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
# (host, port, seconds) -> the host's addresses; socket.gaierror when it has none.
Resolver = Callable[[str, int, float], List[IPAddress]]

ALLOW_SETTING = "--alert-webhook-allow CIDR"
# A rule's save waits at most this long for its webhooks' names to resolve.
SAVE_RESOLVE_S = 3.0
# The whole of one POST: resolving, connecting, sending, the answer's headers.
DEADLINE_S = 10.0

_PRIVATE = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",  # carrier-grade NAT's shared space
        "fc00::/7",  # unique local
        "fec0::/10",  # site-local (deprecated, still routed by some)
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_INET_ATON_PART = re.compile(r"0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*")


class WebhookRefused(Exception):
    """A webhook's host is, or resolves to, an address webhooks may not reach; the message
    names the kind of address (``kind``) and the setting that allows it, never a resolved
    address."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def parse_allow(cidrs: Iterable[str]) -> Tuple[IPNetwork, ...]:
    """``--alert-webhook-allow``'s networks (ValueError for one that is not a CIDR)."""
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cidrs)


def _inet_aton(text: str) -> Optional[ipaddress.IPv4Address]:
    """The address C's ``inet_aton`` reads in ``text``: 1 to 4 parts, each decimal, octal
    (leading 0) or hex (0x); the last part fills the bytes the others leave."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or not all(_INET_ATON_PART.fullmatch(p) for p in parts):
        return None
    values: List[int] = []
    for p in parts:
        if p[:2] in ("0x", "0X"):
            values.append(int(p[2:] or "0", 16))
        elif len(p) > 1 and p[0] == "0":
            values.append(int(p, 8))
        else:
            values.append(int(p))
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def literal_address(host: str) -> Optional[IPAddress]:
    """The address ``host`` spells (brackets of an IPv6 literal, a trailing dot and the
    inet_aton forms taken), or None for a name."""
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if text.endswith("."):
        text = text[:-1]
    return _inet_aton(text) if text else None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> Optional[ipaddress.IPv4Address]:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_kind(ip: IPAddress) -> Optional[str]:
    """Why webhooks may not reach ``ip`` ("loopback", "link-local", "private",
    "unspecified", "multicast", "reserved"), or None for a globally reachable address."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            # Mapped and NAT64 addresses reach the IPv4 address alone (DNS64 answers these
            # for public names); a 6to4 one is its own network too, refused either way.
            kind = address_kind(inner)
            if kind is not None or ip.sixtofour is None:
                return kind
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if any(ip in net for net in _PRIVATE):
        return "private"
    if ip.is_private or ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


def permitted(ip: IPAddress, allow: Sequence[IPNetwork]) -> Optional[str]:
    """None when webhooks may reach ``ip``, else the kind of address it is."""
    kind = address_kind(ip)
    if kind is None:
        return None
    forms: List[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            forms.append(inner)
    if any(form in net for form in forms for net in allow if form.version == net.version):
        return None
    return kind


def _refusal(host: str, kind: str, literal: bool) -> str:
    what = f"host {host!r} is" if literal else f"host {host!r} resolves to"
    article = "an" if kind[0] in "aeiou" else "a"
    return (
        f"{what} {article} {kind} address: webhooks may not reach loopback, link-local, "
        f"private or reserved addresses unless the server's {ALLOW_SETTING} lets them through"
    )


def resolve(host: str, port: int, timeout: float) -> List[IPAddress]:
    """``host``'s addresses: the one it spells, else what the system's resolver answers
    within ``timeout`` seconds (socket.gaierror when it has none, TimeoutError when it does
    not answer in time)."""
    literal = literal_address(host)
    if literal is not None:
        return [literal]
    answer: List[object] = []

    def lookup() -> None:
        try:
            answer.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except (OSError, UnicodeError) as exc:
            answer.append(exc)

    # getaddrinfo takes no timeout: it runs aside, and a resolver that does not answer
    # holds that thread only.
    thread = threading.Thread(target=lookup, name="hotspan-webhook-resolve", daemon=True)
    thread.start()
    thread.join(max(timeout, 0.0))
    if not answer:
        raise TimeoutError(f"no answer from the resolver within {timeout:g} s")
    if isinstance(answer[0], UnicodeError):
        raise socket.gaierror(socket.EAI_NONAME, "not a host name")
    if isinstance(answer[0], OSError):
        raise answer[0]
    found: List[IPAddress] = []
    for *_, sockaddr in answer[0]:  # type: ignore[attr-defined]
        ip = ipaddress.ip_address(str(sockaddr[0]))  # a link-local one keeps its scope
        if ip not in found:
            found.append(ip)
    if not found:
        raise socket.gaierror(socket.EAI_NONAME, "no address")
    return found


def check_addresses(host: str, addresses: Sequence[IPAddress], allow: Sequence[IPNetwork]) -> None:
    """WebhookRefused unless webhooks may reach every one of ``addresses`` (``host``'s)."""
    literal = literal_address(host) is not None
    for ip in addresses:
        kind = permitted(ip, allow)
        if kind is not None:
            raise WebhookRefused(_refusal(host, kind, literal), kind)


def check_webhook(
    host: str,
    port: int,
    allow: Sequence[IPNetwork],
    timeout: float = SAVE_RESOLVE_S,
    resolver: Resolver = resolve,
) -> None:
    """WebhookRefused when ``host`` is or resolves (now) to an address webhooks may not
    reach.  A name that does not resolve now passes: its delivery checks it again."""
    try:
        addresses = resolver(host, port, timeout)
    except (OSError, TimeoutError):
        return
    check_addresses(host, addresses, allow)


# -- what a failure shows ---------------------------------------------------------------------

REFUSED = "connection refused"
RESET = "connection reset"
LOST = "connection lost"
UNREACHABLE = "could not connect"
NO_HTTP = "no valid HTTP answer"
TLS_CERT = "TLS certificate not accepted"
TLS = "TLS handshake failed"
UNRESOLVED = "host name not resolved"
BAD_URL = "bad URL"
FORBIDDEN = "forbidden address ({kind}; see " + ALLOW_SETTING + ")"

_KINDS = (REFUSED, RESET, LOST, UNREACHABLE, NO_HTTP, TLS_CERT, TLS, UNRESOLVED, BAD_URL)
_SHOWN = re.compile(
    r"HTTP \d{3}( \(redirects are not followed\))?"
    r"|no answer within [0-9.]+ s"
    r"|forbidden address \([a-z-]+; see " + re.escape(ALLOW_SETTING) + r"\)"
    r"|delivery queue full \(\d+ notifications waiting\)"
    r"|failed \([A-Za-z_][A-Za-z0-9_.]*\)"
    r"|" + "|".join(re.escape(t) for t in _KINDS)
)
_STATUS = re.compile(r"HTTP \d{3}")


def public_error(error: Optional[str]) -> Optional[str]:
    """A delivery error as the API and the CLI show it: as this server writes them, they
    pass; what an older one stored (``HTTP 500: <the receiver's body>``, an exception's
    message quoting what a non-HTTP service answered) is cut to its status or kind."""
    if error is None or _SHOWN.fullmatch(error):
        return error
    status = _STATUS.match(error)
    if status:
        return status.group(0)
    for known in _KINDS:
        if error.startswith(known):
            return known
    kind = error.split(":", 1)[0].strip()[:80]
    return f"failed ({kind})" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", kind) else "failed"
