"""A deadline for request heads on uvicorn's HTTP/1.1 connections.

uvicorn closes a keep-alive connection that stays silent after a response, but a connection
that has sent part of a request head, or trickles one a byte at a time, it keeps open for
good; and every open connection counts towards ``limit_concurrency`` (``--max-connections``),
compared when a request head completes.  A few hundred connections that send half a head
then nothing would lock every other client out with 503 for as long as they stay open.

Here a connection waiting for a request head (from its opening, and from the end of each
response while it is kept alive) is closed if the whole head has not come within the
deadline, and does not count against the limit meanwhile.  Bytes that trickle in do not
extend the deadline; a head sent slowly but completely within it is served as usual.

What this relies on in uvicorn's protocol classes (httptools' and h11's alike):

- constructed with ``server_state``, whose ``connections`` set each connection joins in
  ``connection_made`` and leaves with ``discard`` (or ``remove``) when it is closed or
  handed over; the server measures it with ``len()`` for the limit and iterates over it at
  shutdown, calling each connection's ``shutdown()``;
- ``self.cycle``, replaced by a new request/response cycle whenever a request head
  completes, with ``response_complete`` set once its response is sent;
- ``on_response_complete()``, called at the end of every response (after the transport is
  closed if the connection is not kept alive).

Connections waiting for a head stay in uvicorn's set, so that a graceful shutdown closes
them as it closes idle keep-alive connections; only the set's size leaves them out.

Neither parser bounds a head's size, and a head that never ends is held in memory until the
deadline: past MAX_HEAD_BYTES a connection gets 431 and is closed (Go's servers, Pyroscope's
and Tempo's, allow 1 MiB; hotspan's longest, the UI's list of 1,000 trace ids, is ~41 KiB).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Iterable, Optional, Set, Type

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
_TOO_LARGE_BODY = b"request head over 64 KiB: not served\r\n"
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TOO_LARGE_BODY), _TOO_LARGE_BODY)
)


class _Connections(set):
    """uvicorn's set of open connections, whose size leaves out those waiting for a head.

    ``waiting`` is always a subset: whatever leaves the set leaves it too.
    """

    def __init__(self, members: Iterable[Any] = ()) -> None:
        super().__init__(members)
        self.waiting: Set[Any] = set()

    def __len__(self) -> int:
        return set.__len__(self) - len(self.waiting)

    def discard(self, member: Any) -> None:
        set.discard(self, member)
        self.waiting.discard(member)

    def remove(self, member: Any) -> None:
        set.remove(self, member)
        self.waiting.discard(member)


def with_header_deadline(
    base: Type[asyncio.Protocol], timeout_s: Optional[float]
) -> Type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base`` (or a subclass of it), closing connections that have
    not sent a whole request head ``timeout_s`` after they opened or after their previous
    response; ``base`` itself when ``timeout_s`` is None or 0 (no deadline)."""
    if not timeout_s:
        return base
    deadline_s: float = timeout_s  # narrowed, for the methods below

    class HeaderDeadline(base):  # type: ignore[valid-type, misc]
        _deadline: Optional[asyncio.TimerHandle] = None  # set while waiting for a head
        _transport: Optional[asyncio.BaseTransport] = None
        _head_bytes = 0  # received while waiting for the head
        # httptools' callbacks (h11 bounds its heads itself, 16 KiB): a request's head came and
        # its body has not all come; its body ended in the bytes being read.
        _in_message = False
        _message_ended = False

        def __init__(self, config: Any, server_state: Any, *args: Any, **kwargs: Any) -> None:
            # The first connection of a server swaps its set for one that can leave some
            # members out of its size, before any protocol holds the set.
            if type(server_state.connections) is set and not server_state.connections:
                server_state.connections = _Connections()
            super().__init__(config, server_state, *args, **kwargs)
            self._all: Set[Any] = server_state.connections
            # (A set some other class swapped in: the deadline holds, the count is uvicorn's.)
            self._waiting: Set[Any] = getattr(self._all, "waiting", set())

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._transport = transport
            self._wait_for_head()

        def data_received(self, data: bytes) -> None:
            if self._deadline is None:
                super().data_received(data)
                return
            cycle = self.cycle
            # Counted while its head may complete: the limit is compared then, and this
            # connection is one of those it counts.
            self._waiting.discard(self)
            self._message_ended = False
            super().data_received(data)
            assert self._transport is not None
            if (
                self.cycle is not cycle  # a request head came whole
                or self._transport.is_closing()  # refused (400), or closed
                or self not in self._all  # handed over (HTTP/2, WebSocket)
            ):
                self._deadline.cancel()
                self._deadline = None
            else:
                # Bytes of a head, not the rest of a body answered before it all came (nor what
                # came with its end: at most one read more than the bound is held).
                if not (self._in_message or self._message_ended):
                    self._head_bytes += len(data)
                    if self._head_bytes > MAX_HEAD_BYTES:
                        self._head_too_large()
                        return
                self._waiting.add(self)

        def on_headers_complete(self) -> None:
            self._in_message = True
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_message = False
            self._message_ended = True
            super().on_message_complete()

        def _head_too_large(self) -> None:
            assert self._deadline is not None and self._transport is not None
            self._deadline.cancel()
            self._deadline = None
            log.debug("closing a connection whose request head passed %s bytes", MAX_HEAD_BYTES)
            self._transport.write(_TOO_LARGE)  # type: ignore[attr-defined]
            self._transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # Kept alive, and no pipelined request started in its place: the next head is
            # due within the deadline of this moment.
            assert self._transport is not None
            if (
                self._deadline is None
                and not self._transport.is_closing()
                and self.cycle.response_complete
                and self in self._all
            ):
                self._wait_for_head()

        def connection_lost(self, exc: Optional[Exception]) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            super().connection_lost(exc)

        def _wait_for_head(self) -> None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(deadline_s, self._head_overdue)
            self._head_bytes = 0
            self._waiting.add(self)

        def _head_overdue(self) -> None:
            self._deadline = None
            log.debug("closing a connection that sent no whole request head in %ss", timeout_s)
            assert self._transport is not None
            self._transport.close()

    HeaderDeadline.__name__ = HeaderDeadline.__qualname__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline
