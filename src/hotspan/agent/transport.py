"""One keep-alive HTTP/1.1 connection that POSTs a body and reads the answer.

A few lines over a socket (wrapped by ``ssl`` for ``https://``), not ``http.client``:
importing ``http.client`` imports the ``email`` package, megabytes of RSS in a program that
may not use it, against an agent budget of 10 MiB; and the connection's waits go through
``wait_io`` when the agent has one, which ``http.client`` has no place for.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

MAX_HEADER_LINES = 100
MAX_LINE = 65536
# How long a name's addresses are used before it is looked up again (and until a connection
# to every one of them fails).
RESOLVED_FOR_S = 60.0
# A TLS write goes out whole, waiting inside ssl's C code; in pieces, each wait is ours.
TLS_WRITE = 256 * 1024

# wait_io(fd, write, timeout) -> whether ready: the native Waker's, whose thread is out of
# its turn at the GIL meanwhile and comes back by one (see _speedups/sampler/turns.c).
WaitIO = Callable[[int, bool, float], bool]


class TransportError(OSError):
    """The server's answer was not HTTP we can read; the connection is closed."""


Response = Tuple[int, Dict[str, str], bytes]  # status, headers (lower-case names), body


class PlainConnection:
    """``timeout`` bounds a whole :meth:`post`, name lookup to last byte: a server that
    trickles its answer must not hold an exit flush past its deadline.  ``context``: an
    ``ssl.SSLContext`` for ``https://``.  ``wait_io``: what the connection waits for its
    socket with (connect, handshake, each send and receive); None: the socket's own waits."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float,
        context: Any = None,
        wait_io: Optional[WaitIO] = None,
    ) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.sock: Any = None  # socket.socket, or ssl.SSLSocket
        self._context = context
        self._wait_io = wait_io
        self._buffer = b""
        self._deadline = 0.0
        self._resolved: Optional[Tuple[float, List[Tuple[int, Tuple[Any, ...]]]]] = None

    def post(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        max_body: int,
        method: str = "POST",
    ) -> Response:
        self._deadline = time.monotonic() + self.timeout
        if self.sock is None:
            self.sock = self._connect()
            self._buffer = b""
        host = f"[{self.host}]" if ":" in self.host else self.host
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {host}:{self.port}",
            f"Content-Length: {len(body)}",
        ]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._send(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        return self._read_response(max_body)

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left

    def _wait(self, sock: Any, write: bool) -> None:
        if self._wait_io is not None and not self._wait_io(sock.fileno(), write, self._remaining()):
            raise TimeoutError("timed out")

    def _connect(self) -> Any:
        # Each address in turn, as the resolver gives them ("localhost": ::1, then 127.0.0.1).
        error: Optional[OSError] = None
        for family, address in self._resolve():
            try:
                sock = self._connect_to(family, address)
                break
            except OSError as exc:
                error = exc
        else:
            self._resolved = None  # the name may point elsewhere now
            raise error if error is not None else OSError(f"no address for {self.host!r}")
        if self._context is None:
            return sock
        try:
            return self._handshake(sock)
        except BaseException:
            sock.close()
            raise

    def _connect_to(self, family: int, address: Tuple[Any, ...]) -> socket.socket:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            if self._wait_io is None:
                sock.settimeout(self._remaining())
                sock.connect(address)
                return sock
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
                self._wait(sock, True)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code:
                raise OSError(code, os.strerror(code))  # ConnectionRefusedError, ...
            return sock
        except BaseException:
            sock.close()
            raise

    def _handshake(self, sock: socket.socket) -> Any:
        import ssl

        tls = self._context.wrap_socket(
            sock, server_hostname=self.host, do_handshake_on_connect=False
        )
        if self._wait_io is None:
            tls.settimeout(self._remaining())
            tls.do_handshake()
            return tls
        tls.setblocking(False)
        while True:
            try:
                tls.do_handshake()
                return tls
            except ssl.SSLWantReadError:
                self._wait(tls, False)
            except ssl.SSLWantWriteError:
                self._wait(tls, True)

    def _send(self, data: bytes) -> None:
        sock = self.sock
        view = memoryview(data)
        piece = TLS_WRITE if self._context is not None else len(view)
        while view:
            self._wait(sock, True)
            sock.settimeout(self._remaining())
            view = view[sock.send(view[:piece]) :]

    def _resolve(self) -> List[Tuple[int, Tuple[Any, ...]]]:
        """(family, address) to connect to, in the resolver's order."""
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                socket.inet_pton(family, self.host)
                return [(family, (self.host, self.port))]  # an address already
            except OSError:
                pass
        now = time.monotonic()
        if self._resolved is not None and now < self._resolved[0]:
            return self._resolved[1]
        # getaddrinfo has no timeout of its own: ask it from a thread and stop waiting.  A
        # thread, and its join, at each new connection would be each a wait for the GIL
        # (uvicorn ends keep-alive after 5 s): the answer is kept a while.
        found: List[Any] = []
        lookup = threading.Thread(
            target=lambda: found.append(
                socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            ),
            name="hotspan-resolve",
            daemon=True,
        )
        lookup.start()
        lookup.join(self._remaining())
        if not found:
            raise TimeoutError(f"cannot resolve {self.host!r} in time")
        addresses = [(info[0], info[4]) for info in found[0]]
        self._resolved = (now + RESOLVED_FOR_S, addresses)
        return addresses

    def _read_response(self, max_body: int) -> Response:
        status_line = self._line()
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise TransportError(f"not an HTTP response: {status_line[:80]!r}")
        status = int(parts[1])
        headers: Dict[str, str] = {}
        for _ in range(MAX_HEADER_LINES):
            line = self._line()
            if not line.strip():
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            raise TransportError("too many response headers")
        # These never have a body (RFC 9112 6.3), whatever the headers say or omit.
        body = b"" if status < 200 or status in (204, 304) else self._body(headers, max_body)
        if headers.get("connection", "").lower() == "close" or parts[0] == b"HTTP/1.0":
            self.close()
        return status, headers, body

    def _body(self, headers: Mapping[str, str], max_body: int) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks: List[bytes] = []
            size = 0
            while True:
                length = int(self._line().split(b";")[0].strip() or b"0", 16)
                if length == 0:
                    while self._line().strip():  # trailers
                        pass
                    return b"".join(chunks)
                chunk = self._read(length)
                self._line()
                size += len(chunk)
                if size <= max_body:
                    chunks.append(chunk)
        if "content-length" in headers:
            length = int(headers["content-length"])
            if length > max_body:
                body = self._read(max_body)
                self.close()  # not worth reading the rest: start afresh next time
                return body
            return self._read(length)
        body = self._read(max_body, to_close=True)  # no length: it ends with the connection
        self.close()
        return body

    def _fill(self) -> bool:
        sock = self.sock
        assert sock is not None
        if self._context is None or not sock.pending():  # TLS may hold a record read already
            self._wait(sock, False)
        sock.settimeout(self._remaining())
        data = sock.recv(65536)
        self._buffer += data
        return bool(data)

    def _line(self) -> bytes:
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_LINE:
                raise TransportError("response line too long")
            if not self._fill():
                raise TransportError("the server closed the connection")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line + b"\n"

    def _read(self, size: int, to_close: bool = False) -> bytes:
        while len(self._buffer) < size:
            if not self._fill():
                if to_close:
                    break
                raise TransportError("the server closed the connection mid-body")
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def close(self) -> None:
        sock, self.sock, self._buffer = self.sock, None, b""
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


_spool_sequence = [0]  # only the upload thread (or an exit flush, holding its lock) writes


class SpoolConnection:
    """The same interface over a directory: each POSTed body becomes one file there.

    ``hotspan record`` points its program's agent (and every Python process that program
    starts) at ``file://<directory>``, so nothing leaves the machine and the recording command
    merges the files when the program has ended.  Files are ``<pid>-<sequence>.pprof``: the
    pid tells processes apart (a live heap is a per-process snapshot) and the sequence keeps
    one process's windows in order.  A body is written to a temporary name first and renamed,
    so a process killed mid-write leaves no half file to read.
    """

    sock = None  # nothing for the uploader to check for a peer's close

    def __init__(self, directory: str, timeout: float = 0.0) -> None:
        self.directory = directory
        self.timeout = timeout

    def post(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        max_body: int,
        method: str = "POST",
    ) -> Response:
        import os

        if method != "POST":
            return 404, {}, b""  # a settings poll: there is no server to have settings
        # Per process, not per connection: the uploader may make a new one after an error.
        _spool_sequence[0] += 1
        name = f"{os.getpid()}-{_spool_sequence[0]:08d}.pprof"
        final = os.path.join(self.directory, name)
        temporary = os.path.join(self.directory, f".{name}.tmp")
        with open(temporary, "wb") as f:
            f.write(body)
        os.replace(temporary, final)
        return 200, {}, b""

    def close(self) -> None:
        pass


# OTLP's profiles service, one unary call per upload (bytes in, bytes out: no stubs needed).
_PROFILES_EXPORT = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"


class GrpcConnection:
    """OTLP/gRPC for ``exporter="otlp"`` with ``grpc``: each :meth:`post` is one Export call;
    its status is told as HTTP's, so the uploader retries and drops as for HTTP.  grpcio is
    imported here only (tens of MiB, its own threads in C)."""

    sock = None  # never "closed by the peer": the channel reconnects by itself

    def __init__(self, host: str, port: int, timeout: float, secure: bool) -> None:
        import grpc

        self._grpc = grpc
        self._target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._secure = secure
        self.channel: Any = None
        self.timeout = timeout
        codes = grpc.StatusCode
        self._http = {
            codes.UNAVAILABLE: 503,
            codes.DEADLINE_EXCEEDED: 504,
            codes.RESOURCE_EXHAUSTED: 429,
            codes.ABORTED: 503,
            codes.UNAUTHENTICATED: 401,
            codes.PERMISSION_DENIED: 403,
            codes.INVALID_ARGUMENT: 400,
            codes.UNIMPLEMENTED: 404,
        }

    def post(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        max_body: int,
        method: str = "POST",
    ) -> Response:
        # HTTP's own headers mean nothing to gRPC; the rest (auth, tenant) are its metadata.
        metadata = [
            (name.lower(), value)
            for name, value in headers.items()
            if name.lower() not in ("content-type", "user-agent", "content-length")
        ]
        if self.channel is None:
            grpc = self._grpc
            self.channel = (
                grpc.secure_channel(self._target, grpc.ssl_channel_credentials())
                if self._secure
                else grpc.insecure_channel(self._target)
            )
            self._export = self.channel.unary_unary(_PROFILES_EXPORT)
        try:
            self._export(body, timeout=self.timeout, metadata=metadata)
        except self._grpc.RpcError as exc:
            code = exc.code()
            detail = (exc.details() or code.name).encode("utf-8", "replace")[:max_body]
            return self._http.get(code, 500), {}, detail
        return 200, {}, b""

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
