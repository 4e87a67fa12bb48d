"""One keep-alive HTTP/1.1 connection that POSTs a body and reads the answer.

For ``http://`` addresses this is a few lines over a socket, not ``http.client``: importing
``http.client`` imports ``ssl`` and the ``email`` package, 8.6 MiB of RSS in a program that
may use neither, against an agent budget of 10 MiB.  ``https://`` addresses use
``http.client`` (imported then), since TLS is what it is for.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any, Dict, Mapping, Optional, Tuple

MAX_HEADER_LINES = 100
MAX_LINE = 65536


class TransportError(OSError):
    """The server's answer was not HTTP we can read; the connection is closed."""


Response = Tuple[int, Dict[str, str], bytes]  # status, headers (lower-case names), body


class PlainConnection:
    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.sock: Optional[socket.socket] = None
        self._reader: Any = None

    def post(self, path: str, body: bytes, headers: Mapping[str, str], max_body: int) -> Response:
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            self._reader = self.sock.makefile("rb")
        self.sock.settimeout(self.timeout)
        host = f"[{self.host}]" if ":" in self.host else self.host
        lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{self.port}",
                 f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        return self._read_response(max_body)

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
        body = self._body(headers, max_body)
        if headers.get("connection", "").lower() == "close" or parts[0] == b"HTTP/1.0":
            self.close()
        return status, headers, body

    def _body(self, headers: Mapping[str, str], max_body: int) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks = []
            size = 0
            while True:
                length = int(self._line().split(b";")[0].strip() or b"0", 16)
                if length == 0:
                    while self._line().strip():  # trailers
                        pass
                    return b"".join(chunks)
                chunk = self._reader.read(length)
                self._line()
                size += len(chunk)
                if size <= max_body:
                    chunks.append(chunk)
        if "content-length" in headers:
            length = int(headers["content-length"])
            if length > max_body:
                body = self._reader.read(max_body)
                self.close()  # not worth reading the rest: start afresh next time
                return body
            return self._reader.read(length)
        body = self._reader.read(max_body)  # no length: the body ends with the connection
        self.close()
        return body

    def _line(self) -> bytes:
        line = self._reader.readline(MAX_LINE)
        if not line:
            raise TransportError("the server closed the connection")
        return line

    def close(self) -> None:
        reader, sock, self._reader, self.sock = self._reader, self.sock, None, None
        for part in (reader, sock):
            if part is not None:
                with contextlib.suppress(OSError):
                    part.close()


class TLSConnection:
    """The same interface over ``http.client.HTTPSConnection``."""

    def __init__(self, host: str, port: int, timeout: float, context: Any) -> None:
        import http.client

        self._conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=context)
        self.timeout = timeout

    @property
    def sock(self) -> Any:
        return self._conn.sock

    def post(self, path: str, body: bytes, headers: Mapping[str, str], max_body: int) -> Response:
        self._conn.timeout = self.timeout
        if self._conn.sock is not None:
            self._conn.sock.settimeout(self.timeout)
        self._conn.request("POST", path, body=body, headers=dict(headers))
        response = self._conn.getresponse()
        data = response.read(max_body)
        if not response.isclosed():
            self._conn.close()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data

    def close(self) -> None:
        self._conn.close()
