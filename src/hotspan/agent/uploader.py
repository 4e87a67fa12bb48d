"""Getting profiles to the server without ever hurting the program being profiled.

:meth:`Uploader.submit` only queues a body; one daemon thread does the HTTP.  While the server
is away the queue is capped in bytes (oldest dropped first) and attempts back off, so an outage
costs bounded memory, some counters and one warning a minute, never the caller's time.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from hotspan import __version__
from hotspan.agent.collectors import alloc_exclusion
from hotspan.agent.config import DEFAULT_BUFFER_BYTES
from hotspan.agent.first_wait import FirstWait
from hotspan.agent.log import logger as log

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, Deque, Mapping, Optional, Tuple

    _Item = Tuple[str, bytes]  # (path and query, body)

# Not imported here: urllib.parse, random, dataclasses and the transport's socket module.
# Everything the agent imports stays in the program for good, and every full collection of
# the cyclic GC walks the functions, classes and dicts it brought (a program with a small
# heap that makes many containers measured +11 to +17% slower for them).  The transport
# (socket) is imported by the upload thread as it first connects.


_FIRST_DELAY = 0.5
_MAX_DELAY = 30.0
_MAX_RETRY_AFTER = 60.0
_WARN_EVERY = 60.0
# Enough for the server's reason; a longer error body is not worth keeping the connection for.
_MAX_ERROR_BODY = 64 * 1024


class UploadStats:
    __slots__ = (
        "sent_uploads",
        "sent_bytes",
        "dropped_uploads",
        "dropped_bytes",
        "failed_attempts",
        "rejected_uploads",
        "last_error",
    )

    def __init__(self) -> None:
        self.sent_uploads = 0
        self.sent_bytes = 0
        self.dropped_uploads = 0
        self.dropped_bytes = 0
        self.failed_attempts = 0
        self.rejected_uploads = 0
        self.last_error = ""

    def copy(self) -> UploadStats:
        out = UploadStats()
        for name in self.__slots__:
            setattr(out, name, getattr(self, name))
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UploadStats) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__
        )

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"UploadStats({fields})"


class Uploader:
    def __init__(
        self,
        server_address: str,
        headers: Mapping[str, str],
        *,
        max_buffer_bytes: int = DEFAULT_BUFFER_BYTES,
        timeout: float = 10.0,
        user_agent: str = f"hotspan-agent/{__version__}",
        waker: Optional[Callable[[], Any]] = None,
        otlp: str = "",
    ) -> None:
        """``waker``: makes what the upload thread waits on instead of its condition (the
        agent passes the native ``Waker``, whose wait takes the GIL back by turns: see
        ``_speedups/sampler/turns.c``); None: the condition.  ``otlp``: the protocol
        (``http/protobuf`` or ``grpc``) of an OTLP profiles endpoint at ``server_address``,
        where each upload goes as it is."""
        scheme, host, port, path = split_address(server_address)
        self._make_waker = waker
        self._address = server_address
        self._https = scheme == "https"
        # file://DIR: each upload becomes a file in DIR (hotspan record; see SpoolConnection).
        self._spool = path if scheme == "file" else None
        self._host = host or "localhost"
        self._port = port or (443 if self._https else 80)
        self._prefix = "" if self._spool is not None else path.rstrip("/")
        self._otlp = bool(otlp)
        self._grpc = otlp == "grpc"
        self._headers = {
            **headers,
            "Content-Type": "application/x-protobuf" if otlp else "application/octet-stream",
            "User-Agent": user_agent,
        }
        self._max_bytes = max(0, max_buffer_bytes)
        self._timeout = timeout
        self._thread: Optional[threading.Thread] = None
        self._conn: Optional[Any] = None  # a connection of agent/transport.py
        self._ssl_context: Any = None
        self._last_warning: Optional[float] = None
        # Following the server's settings (see follow_settings): None otherwise.
        self._status_headers: Optional[Callable[[], Mapping[str, str]]] = None
        self._on_answer: Optional[Callable[[Any], None]] = None
        self._init_state()

    def _init_state(self) -> None:
        self._first_wait = FirstWait()  # of the upload thread's latest start
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._waker: Any = self._make_waker() if self._make_waker is not None else None
        # Held around taking an item and sending it: the connection serves one thread at a
        # time, and whoever holds it owns the only copy of the upload in flight.
        self._send_lock = threading.Lock()
        self._pending: Deque[_Item] = deque()
        self._pending_bytes = 0
        # With max_buffer_bytes=0 nothing may wait, but an idle thread can still take one.
        self._handoff: Optional[_Item] = None
        self._idle = False
        self._stopping = False
        self._delay = _FIRST_DELAY
        self._retry_at = 0.0
        self._stats = UploadStats()
        # A settings poll waiting to go (its path), sent even while uploads are paused.
        self._poll: Optional[str] = None
        self._paused = False
        self._last_attempt = time.monotonic()

    def follow_settings(
        self,
        status_headers: Callable[[], Mapping[str, str]],
        on_answer: Callable[[Any], None],
    ) -> None:
        """Every request also carries ``status_headers()``, and a JSON answer goes to
        ``on_answer`` (the server's settings for this agent)."""
        self._status_headers = status_headers
        self._on_answer = on_answer

    def pause(self, paused: bool) -> None:
        """Load shedding: uploads wait (bounded as ever) until resumed; polls still go."""
        with self._cond:
            self._paused = paused
            self._notify()

    def poll(self, path: str) -> None:
        """Ask ``GET path`` once, when nothing else is being sent (one poll waits at most)."""
        with self._cond:
            self._poll = self._prefix + path  # behind a gateway path, as /ingest is
            self._notify()

    def idle_for(self, seconds: float) -> bool:
        """Whether no request has been attempted for ``seconds``."""
        return time.monotonic() - self._last_attempt >= seconds

    @property
    def stats(self) -> UploadStats:
        with self._lock:
            return self._stats.copy()

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def thread_ident(self) -> Optional[int]:
        thread = self._thread
        return thread.ident if thread is not None else None

    def start(self) -> None:
        try:
            with self._cond:
                self._stopping = False
                if self._thread is not None and self._thread.is_alive():
                    return
                self._first_wait = first_wait = FirstWait()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(alloc_exclusion(),),
                    name="hotspan-uploader",
                    daemon=True,
                )
                self._thread.start()
            first_wait.wait()
        except Exception:
            self._thread = None
            log.debug("hotspan: upload thread not started", exc_info=True)

    def submit(self, params: Mapping[str, str], body: bytes) -> None:
        try:
            path = self._prefix if self._otlp else f"{self._prefix}/ingest?{query_string(params)}"
            item = (path, bytes(body))
            size = len(item[1])
            with self._cond:
                if self._max_bytes == 0:
                    if self._idle and self._handoff is None:
                        self._handoff, self._idle = item, False
                        self._notify()
                    else:
                        self._count_drop(size)
                elif size > self._max_bytes:
                    self._count_drop(size)
                else:
                    self._pending.append(item)
                    self._pending_bytes += size
                    self._trim()
                    self._notify()
        except Exception:
            log.debug("hotspan: upload not queued", exc_info=True)

    def flush(self, timeout: float) -> bool:
        """Send what is pending now, within ``timeout`` seconds; True if nothing is left.

        Backoff is ignored, but the first retryable failure ends the flush: a server that is
        away now will hardly be back within an exit deadline, and the program should not wait.
        """
        deadline = time.monotonic() + timeout
        try:
            while True:
                remaining = deadline - time.monotonic()
                if not self._send_lock.acquire(timeout=max(0.0, remaining)):
                    return False  # the thread is still sending its upload
                try:
                    with self._cond:
                        item = self._take()
                    if item is None:
                        return True
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        with self._cond:
                            self._requeue(item)
                        return False
                    if self._send(item, min(remaining, self._timeout)) == "retry":
                        return False
                finally:
                    self._send_lock.release()
        except Exception:
            log.debug("hotspan: flush failed", exc_info=True)
            return False

    def stop(self, timeout: float) -> None:
        try:
            with self._cond:
                self._stopping = True
                self._notify()
            thread = self._thread
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, timeout))
            # A thread stuck in a slow send keeps the connection; it exits after that attempt.
            if (thread is None or not thread.is_alive()) and self._send_lock.acquire(False):
                try:
                    if self._conn is not None:
                        self._conn.close()
                finally:
                    self._send_lock.release()
        except Exception:
            log.debug("hotspan: upload thread not stopped cleanly", exc_info=True)

    def reset_after_fork(self) -> None:
        try:
            # The parent's thread is gone here and may have held the locks: never touch them.
            conn, self._conn, self._thread = self._conn, None, None
            self._init_state()
            if conn is not None:
                conn.close()  # only this process's descriptor; the parent keeps its connection
        except Exception:
            log.debug("hotspan: uploader not reset after fork", exc_info=True)

    # -- everything below runs with self._cond held, or in the sending thread ----------------

    def _notify(self) -> None:
        if self._waker is None:
            self._cond.notify_all()
        else:
            self._waker.set()

    def _wait(self, timeout: Optional[float]) -> None:
        """The upload thread's wait for news, self._cond held (and released meanwhile)."""
        self._first_wait.reached()
        waker = self._waker
        if waker is None:
            self._cond.wait(timeout)
            return
        # What the thread waits for is in the state under self._cond, read again after this:
        # a set() between that read and this wait makes it return at once, nothing is lost.
        self._cond.release()
        try:
            waker.wait(timeout)
        finally:
            self._cond.acquire()
        waker.clear()

    def _wait_io(self, fd: int, write: bool, timeout: float) -> bool:
        """The connection's waits, on this process's waker (a fork makes a new one)."""
        return bool(self._waker.wait_io(fd, write, timeout))

    def _count_drop(self, size: int) -> None:
        self._stats.dropped_uploads += 1
        self._stats.dropped_bytes += size

    def _trim(self) -> None:
        while self._pending_bytes > self._max_bytes and self._pending:
            _, body = self._pending.popleft()
            self._pending_bytes -= len(body)
            self._count_drop(len(body))

    def _take(self) -> Optional[_Item]:
        item, self._handoff = self._handoff, None
        if item is None and self._pending:
            item = self._pending.popleft()
            self._pending_bytes -= len(item[1])
        return item

    def _requeue(self, item: _Item) -> None:
        # Back in front, so order is kept, and again the oldest: first to go if space runs out.
        self._pending.appendleft(item)
        self._pending_bytes += len(item[1])
        self._trim()

    def _run(self, leave_alloc_profile: Callable[[], None]) -> None:
        leave_alloc_profile()
        try:
            while True:
                with self._cond:
                    while not self._stopping:
                        wait = self._retry_at - time.monotonic()
                        uploads = not self._paused and (self._pending or self._handoff)
                        if wait <= 0 and (uploads or self._poll is not None):
                            break
                        self._idle = wait <= 0 and not self._paused
                        self._wait(wait if wait > 0 else None)
                    self._idle = False
                    if self._stopping:
                        return
                with self._send_lock:
                    with self._cond:
                        # None if a flush got there first, or if stop() came meanwhile.
                        poll = None
                        item = None
                        if not self._stopping:
                            if self._paused or not (self._pending or self._handoff):
                                poll, self._poll = self._poll, None
                            else:
                                item = self._take()
                    if item is not None:
                        self._send(item, self._timeout)
                    elif poll is not None:
                        self._send_poll(poll)
        except Exception:
            log.debug("hotspan: upload thread failed", exc_info=True)

    def _send(self, item: _Item, timeout: float) -> str:
        """One attempt, send lock held; the upload is counted, dropped or queued again."""
        outcome, error, retry_after = self._attempt(item, timeout)
        with self._cond:
            stats = self._stats
            if outcome == "sent":
                stats.sent_uploads += 1
                stats.sent_bytes += len(item[1])
                self._delay, self._retry_at = _FIRST_DELAY, 0.0
            else:
                stats.failed_attempts += 1
                stats.last_error = error
                if outcome == "rejected":
                    stats.rejected_uploads += 1
                else:
                    self._requeue(item)
                    pause = min(_MAX_DELAY, self._delay * _jitter(0.75, 1.25))
                    if retry_after is not None:
                        pause = min(retry_after, _MAX_RETRY_AFTER)
                    self._retry_at = time.monotonic() + pause
                    self._delay = min(self._delay * 2, _MAX_DELAY)
            self._notify()
        if outcome == "rejected":
            self._warn(f"server rejected a profile upload ({error}); dropped")
        elif outcome == "retry":
            self._warn(f"cannot upload profiles to {self._address} ({error}); will retry")
        return outcome

    def _send_poll(self, path: str) -> None:
        """A settings poll: answered or not, it is not retried (the next comes soon)."""
        outcome, error, _ = self._attempt((path, b""), self._timeout, method="GET")
        if outcome != "sent":
            with self._cond:
                self._stats.failed_attempts += 1
                self._stats.last_error = error
            log.debug("hotspan: settings poll failed: %s", error)

    def _attempt(
        self, item: _Item, timeout: float, method: str = "POST"
    ) -> Tuple[str, str, Optional[float]]:
        """POST one upload: ("sent" | "retry" | "rejected", error, Retry-After seconds)."""
        path, body = item
        self._last_attempt = time.monotonic()
        headers = self._headers
        if self._status_headers is not None:
            try:
                headers = {**headers, **self._status_headers()}
            except Exception:  # noqa: BLE001 - the upload goes without its report
                log.debug("hotspan: no status for this upload", exc_info=True)
        try:
            conn = self._connection(timeout)
            status, answer, reason = conn.post(path, body, headers, _MAX_ERROR_BODY, method)
        except Exception as exc:  # refused, reset, timeout, TLS, bad response: all transient
            if self._conn is not None:
                self._conn.close()
            return "retry", f"{type(exc).__name__}: {exc}", None
        if 200 <= status < 300:
            self._take_answer(answer, reason)
            return "sent", "", None
        error = f"HTTP {status}: {reason.decode('utf-8', 'replace')[:200].strip()}"
        if status >= 500 or status in (408, 429):
            return "retry", error, _seconds(answer.get("retry-after"))
        return "rejected", error, None

    def _take_answer(self, headers: Mapping[str, str], body: bytes) -> None:
        """A JSON answer is the server's settings for this agent (hotspan servers send one
        to agents that announce themselves; other servers answer nothing)."""
        if self._on_answer is None or not body:
            return
        if not headers.get("content-type", "").startswith("application/json"):
            return
        try:
            import json

            self._on_answer(json.loads(body))
        except Exception:  # noqa: BLE001 - a bad answer changes nothing
            log.debug("hotspan: the server's answer was not understood", exc_info=True)

    def _connection(self, timeout: float) -> Any:
        conn = self._conn
        if conn is None:
            from hotspan.agent.transport import PlainConnection, SpoolConnection

            if self._spool is not None:
                conn = SpoolConnection(self._spool, timeout)
            elif self._grpc:
                from hotspan.agent.transport import GrpcConnection

                conn = GrpcConnection(self._host, self._port, timeout, self._https)
            else:
                if self._https and self._ssl_context is None:
                    # Only https pays for ssl and its CA store (megabytes).
                    import ssl

                    self._ssl_context = ssl.create_default_context()
                context = self._ssl_context if self._https else None
                wait_io = self._wait_io if hasattr(self._waker, "wait_io") else None
                conn = PlainConnection(self._host, self._port, timeout, context, wait_io)
            self._conn = conn
        elif conn.sock is not None and _closed_by_peer(conn.sock):
            conn.close()  # the server's keep-alive ran out (uvicorn's is 5 s): a new one
        conn.timeout = timeout
        return conn

    def _warn(self, message: str) -> None:
        # Sending thread only (send lock held), and outside self._cond: a slow log handler
        # must not block submit().
        now = time.monotonic()
        if self._last_warning is None or now - self._last_warning >= _WARN_EVERY:
            self._last_warning = now
            log.warning("hotspan: %s (more such warnings within a minute are not shown)", message)
        else:
            log.debug("hotspan: %s", message)


def _seconds(value: Optional[str]) -> Optional[float]:
    """A Retry-After in seconds; the HTTP-date form is rare enough to fall back to backoff."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None


def _closed_by_peer(sock: Any) -> bool:
    """An idle keep-alive socket with something to read has been closed (or is out of step)."""
    import select  # a C module: nothing for the GC to walk

    try:
        if hasattr(select, "poll"):  # select() fails on descriptors above 1023
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([sock], [], [], 0)[0])
    except Exception:
        return True


def _jitter(low: float, high: float) -> float:
    return low + (high - low) * int.from_bytes(os.urandom(2), "big") / 65535


def split_address(address: str) -> Tuple[str, str, int, str]:
    """``scheme://host[:port][/path]`` -> (scheme, host, port or 0, path), as
    ``urllib.parse.urlsplit`` reads it (brackets around an IPv6 host; a bare "::1" must not
    be read as host ":" and port 1).  Raises ValueError for a port that is not one."""
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "", address
    scheme = scheme.lower()
    cut = min(
        (i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest)
    )
    netloc, path = rest[:cut], rest[cut:]
    path = path.split("?", 1)[0].split("#", 1)[0]
    netloc = netloc.rpartition("@")[2]
    port_text = ""
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise ValueError(f"invalid IPv6 address in {address!r}")
        host, after = netloc[1:end], netloc[end + 1 :]
        if after.startswith(":"):
            port_text = after[1:]
    else:
        host, _, port_text = netloc.partition(":")
    port = 0
    if port_text:
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise ValueError(f"port out of range in {address!r}")
        port = int(port_text)
    return scheme, host.lower(), port, path


_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")


def _quote_plus(text: str) -> str:
    return "".join(
        chr(b) if b in _SAFE else "+" if b == 0x20 else f"%{b:02X}" for b in text.encode()
    )


def query_string(params: Mapping[str, str]) -> str:
    """``urllib.parse.urlencode`` of string parameters."""
    return "&".join(f"{_quote_plus(str(k))}={_quote_plus(str(v))}" for k, v in params.items())
