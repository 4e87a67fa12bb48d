"""One webhook POST: to addresses webhooks may reach only (:mod:`~hotspan.alerts.targets`),
checked when the host is resolved and connected to as checked, within one deadline for the
whole of it; redirects are not followed, and of the answer only its status is kept.  Imported
when the first notification is sent or the first rule is saved (httpx is not small)."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import httpcore
import httpx

from hotspan import __version__
from hotspan.alerts.rules import redact_url
from hotspan.alerts.targets import (
    BAD_URL,
    DEADLINE_S,
    FORBIDDEN,
    LOST,
    NO_HTTP,
    REFUSED,
    RESET,
    SAVE_RESOLVE_S,
    TLS,
    TLS_CERT,
    UNREACHABLE,
    UNRESOLVED,
    IPNetwork,
    Resolver,
    WebhookRefused,
    check_addresses,
    check_webhook,
    resolve,
)

# httpcore's SOCKET_OPTION, which it defines in a private module.
SocketOption = Union[
    Tuple[int, int, int], Tuple[int, int, Union[bytes, bytearray]], Tuple[int, int, None, int]
]


class _Deadline:
    """The whole POST's deadline: when it passes, every socket the POST opened is shut, which
    wakes a read blocked in the sending thread (however slowly the receiver trickles)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = threading.Event()
        self._lock = threading.Lock()
        # Duplicates of the POST's sockets, ours to close: shutting one down ends the
        # connection whatever httpcore did with the original (wrapped it in TLS, closed it).
        self._sockets: List[socket.socket] = []
        self._done = False
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        return max(self.end - time.monotonic(), 0.0)

    def watch(self, sock: socket.socket) -> None:
        dup = sock.dup()
        with self._lock:
            self._sockets.append(dup)
            if self.expired.is_set():
                with contextlib.suppress(OSError):
                    dup.shutdown(socket.SHUT_RDWR)

    def _cut(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired.set()
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._done = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()


class _CheckedBackend(httpcore.NetworkBackend):
    """Connects only to addresses webhooks may reach: resolves the host once, refuses it if
    any of its addresses is forbidden, and connects to those very addresses (the HTTP stack
    never resolves the name again).  TLS is still verified against the URL's host name."""

    def __init__(self, allow: Sequence[IPNetwork], deadline: _Deadline, resolver: Resolver) -> None:
        self._allow = allow
        self._deadline = deadline
        self._resolver = resolver
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: Optional[float] = None,
        local_address: Optional[str] = None,
        socket_options: Optional[Iterable[SocketOption]] = None,
    ) -> httpcore.NetworkStream:
        addresses = self._resolver(host, port, self._deadline.left())
        check_addresses(host, addresses, self._allow)
        failure: Optional[Exception] = None
        for ip in addresses:
            left = self._deadline.left()
            try:
                stream = self._inner.connect_tcp(
                    str(ip),
                    port,
                    timeout=left if timeout is None else min(timeout, left),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
                continue
            self._deadline.watch(stream.get_extra_info("socket"))
            return stream
        assert failure is not None
        raise failure

    def connect_unix_socket(
        self,
        path: str,
        timeout: Optional[float] = None,
        socket_options: Optional[Iterable[SocketOption]] = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("webhooks go over TCP only")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _Body(httpx.SyncByteStream):
    def __init__(self, response: httpcore.Response) -> None:
        self._response = response

    def __iter__(self) -> Iterator[bytes]:
        yield from self._response.iter_stream()

    def close(self) -> None:
        self._response.close()


def _tls() -> ssl.SSLContext:
    """The system's CAs, host names checked: what an https receiver presents is verified
    against the URL's host, whichever address it was reached at."""
    return _tls_trusting(os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))


@functools.lru_cache(maxsize=4)
def _tls_trusting(cafile: Optional[str], capath: Optional[str]) -> ssl.SSLContext:
    # One context for every delivery to the trust store the environment names: loading the
    # CAs costs ~30 ms of CPU, more than a delivery's own work.
    return ssl.create_default_context()


class _CheckedTransport(httpx.BaseTransport):
    """httpx over a connection pool of :class:`_CheckedBackend`; httpcore's exceptions and
    WebhookRefused come out as they are (:func:`_failure` names them)."""

    def __init__(self, backend: _CheckedBackend) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=_tls(),
            max_connections=1,
            retries=0,
            network_backend=backend,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        response = self._pool.handle_request(
            httpcore.Request(
                method=request.method,
                url=httpcore.URL(
                    scheme=request.url.raw_scheme,
                    host=request.url.raw_host,
                    port=request.url.port,
                    target=request.url.raw_path,
                ),
                headers=request.headers.raw,
                content=request.stream,
                extensions=request.extensions,
            )
        )
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_Body(response),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()


def _failure(exc: BaseException, deadline: _Deadline) -> str:
    """What a failed POST shows: the kind of failure, never what the peer sent (an
    exception's message may quote it)."""
    if isinstance(exc, WebhookRefused):
        return FORBIDDEN.format(kind=exc.kind)
    if deadline.expired.is_set() or isinstance(
        exc, (httpcore.TimeoutException, httpx.TimeoutException, TimeoutError)
    ):
        return f"no answer within {deadline.seconds:g} s"
    if isinstance(exc, socket.gaierror):
        return UNRESOLVED
    seen: List[BaseException] = []
    cause: Optional[BaseException] = exc
    while cause is not None and cause not in seen:
        seen.append(cause)
        if isinstance(cause, ConnectionRefusedError):
            return REFUSED
        if isinstance(cause, ConnectionResetError):
            return RESET
        if isinstance(cause, ssl.SSLCertVerificationError):
            return TLS_CERT
        if isinstance(cause, ssl.SSLError):
            return TLS
        cause = cause.__cause__ or cause.__context__
    if isinstance(exc, (httpcore.ConnectError, httpx.ConnectError)):
        return UNREACHABLE
    if isinstance(exc, (httpcore.RemoteProtocolError, httpx.RemoteProtocolError)):
        return NO_HTTP
    if isinstance(exc, (httpcore.NetworkError, httpx.NetworkError, OSError)):
        return LOST
    return f"failed ({type(exc).__name__})"


def check_urls(
    urls: Sequence[str],
    allow: Sequence[IPNetwork],
    timeout: float = SAVE_RESOLVE_S,
    resolver: Resolver = resolve,
) -> None:
    """WebhookRefused (its message naming the URL, redacted) when one of ``urls`` has a host
    that is, or now resolves to, an address webhooks may not reach; names that do not
    resolve within ``timeout`` seconds (for all) pass, their deliveries check them again.
    The host is taken both as :func:`post` reads it and as urllib does, should they differ."""
    end = time.monotonic() + timeout
    for url in urls:
        targets: List[Tuple[str, int]] = []
        with contextlib.suppress(ValueError):
            parts = urllib.parse.urlsplit(url)
            if parts.hostname:
                targets.append((parts.hostname, parts.port or _default_port(parts.scheme)))
        with contextlib.suppress(httpx.InvalidURL, ValueError, TypeError):
            parsed = httpx.URL(url)
            if parsed.host:
                targets.append((parsed.host, parsed.port or _default_port(parsed.scheme)))
        for host, port in dict.fromkeys(targets):
            try:
                check_webhook(host, port, allow, max(end - time.monotonic(), 0.0), resolver)
            except WebhookRefused as exc:
                raise WebhookRefused(
                    f"webhooks: {redact_url(url)[:200]!r}: {exc}", exc.kind
                ) from None


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def post(
    url: str,
    body: bytes,
    deadline_s: float = DEADLINE_S,
    allow: Sequence[IPNetwork] = (),
    resolver: Resolver = resolve,
) -> Optional[str]:
    """POST JSON; None once the receiver answered 2xx within ``deadline_s``, else why not:
    its status (``HTTP 500``; a redirect is not followed) or the kind of failure, never its
    body.  The host must be, or resolve to, addresses webhooks may reach (``allow`` lists the
    networks let through besides the global ones: :mod:`~hotspan.alerts.targets`); the
    URL's user and password go as basic auth."""
    try:
        target = httpx.URL(url)
        if target.scheme not in ("http", "https") or not target.host:
            return BAD_URL
    except (httpx.InvalidURL, ValueError, TypeError):
        return BAD_URL
    auth = None
    if target.username or target.password:
        auth = httpx.BasicAuth(target.username, target.password)
        target = target.copy_with(userinfo=b"")
    deadline = _Deadline(deadline_s)
    try:
        client = httpx.Client(
            transport=_CheckedTransport(_CheckedBackend(allow, deadline, resolver)),
            timeout=deadline_s,
            follow_redirects=False,
            trust_env=False,  # no proxy from the environment: the address checked is the peer
        )
        headers = {"Content-Type": "application/json", "User-Agent": f"hotspan/{__version__}"}
        with (
            client,
            client.stream("POST", target, content=body, auth=auth, headers=headers) as response,
        ):
            # The body is not read: nothing of it is kept or shown.
            status = response.status_code
    except Exception as exc:  # noqa: BLE001 - any failure of a receiver is its answer
        return _failure(exc, deadline)
    finally:
        deadline.close()
    if deadline.expired.is_set():
        return f"no answer within {deadline_s:g} s"
    if 200 <= status < 300:
        return None
    if 300 <= status < 400:
        return f"HTTP {status} (redirects are not followed)"
    return f"HTTP {status}"
