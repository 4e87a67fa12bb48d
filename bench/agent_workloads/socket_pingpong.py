"""A plain loop of Python bits and short blocking syscalls: a client talking to a fast peer.

``run_pingpong`` calls ``_harness.spin`` (``call_ms`` of pure Python, 0.1 ms by default) and
then sends a 32-byte message over a loopback TCP connection (``TCP_NODELAY``) and reads the
echo, like a service calling a cache or a database between bits of its own work.  Every
``send`` and ``recv`` lets the GIL go and takes it back.

The peer (``peer``):

- ``process`` (default): an echo loop in a forked process, forked in the setup, before any
  profiler starts (so that no profiler's fork handler runs in it) and not part of the profiled
  process's CPU.  ``recv`` really blocks for the round trip, as against a real server.
- ``loop``: the other end of the connection is served by the same loop (send, echo, read
  back): no syscall ever waits, the GIL is released and retaken in a few microseconds, again
  and again; the case that starves a sampler thread most.

``send_recv=False`` leaves the socket out: a plain loop of calls, the control.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any, Dict, Iterator, Tuple

import _harness

CALL_MS = 0.1
MESSAGE = b"0123456789abcdef" * 2


def recv_exact(sock: socket.socket, size: int) -> bytes:
    parts = []
    while size:
        data = sock.recv(size)
        if not data:
            raise ConnectionError("peer closed the connection")
        parts.append(data)
        size -= len(data)
    return b"".join(parts)


def _echo_until_closed(sock: socket.socket) -> None:
    with contextlib.suppress(ConnectionError):
        while True:
            sock.sendall(recv_exact(sock, len(MESSAGE)))


def _tcp_pair() -> Tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
    for sock in (client, server):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client, server


@contextlib.contextmanager
def connection(params: Dict[str, Any]) -> Iterator[Dict[str, Any]]:
    """The client socket (and, for ``peer=loop``, the server end) in the params."""
    client, server = _tcp_pair()
    pid = 0
    try:
        if params["peer"] == "process":
            pid = os.fork()
            if pid == 0:
                # The child must never return into the harness, whatever happens here.
                try:
                    client.close()
                    _echo_until_closed(server)
                finally:
                    os._exit(0)
            server.close()
            yield {**params, "client": client}
        else:
            yield {**params, "client": client, "server": server}
    finally:
        client.close()
        server.close()
        if pid:
            # The peer exits at EOF; reaped, its CPU goes to RUSAGE_CHILDREN, not to ours.
            os.waitpid(pid, 0)


def run_pingpong(calls: int, n: int, live: Dict[str, Any]) -> int:
    client = live["client"]
    server = live.get("server")
    send_recv = live["send_recv"]
    x = 0
    for _ in range(calls):
        x ^= _harness.spin(n)
        if send_recv:
            client.sendall(MESSAGE)
            if server is not None:
                server.sendall(recv_exact(server, len(MESSAGE)))
            recv_exact(client, len(MESSAGE))
    return x


def calibrate(
    seconds: float, call_ms: float = CALL_MS, peer: str = "process", send_recv: bool = True
) -> Dict[str, Any]:
    if peer not in ("process", "loop"):
        raise SystemExit(f"peer is process or loop, not {peer!r}")
    n = max(1, int(_harness.loops_per_ms() * call_ms))
    params = {"call_ms": call_ms, "peer": peer, "send_recv": send_recv, "n": n}
    with connection(params) as live:
        # ~0.3 s trials, round trips included (~0.05 ms each here).
        trial = max(10, int(300 / (call_ms + 0.05)))
        calls = _harness.scale_to(seconds, trial, lambda k: run_pingpong(k, n, live))
    return {**params, "calls": calls}


def work(params: Dict[str, Any]) -> Dict[str, Any]:
    run_pingpong(params["calls"], params["n"], params)
    return {"calls": params["calls"], "work_function": "run_pingpong"}


if __name__ == "__main__":
    _harness.main(calibrate, work, connection)
