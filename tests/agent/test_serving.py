"""hotspan.agent.serving: the first listening TCP socket of a program, by either door."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
from typing import Any, List

import pytest

from hotspan.agent.serving import on_first_listen


def test_the_first_tcp_listen_is_told_once_and_the_hook_leaves(tmp_path: Any) -> None:
    seen: List[Any] = []
    remove = on_first_listen(seen.append)
    try:
        # A Unix socket (multiprocessing's managers in a batch job) is not serving requests.
        with socket.socket(socket.AF_UNIX) as unix:
            unix.bind(str(tmp_path / "s"))
            unix.listen()
        assert seen == []
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            first.listen()
            second.bind(("127.0.0.1", 0))
            second.listen()
            assert seen == [first.getsockname()]
        # Taken out as it fired: the program's socket class is as it was.
        assert "listen" not in socket.socket.__dict__
    finally:
        remove()


def test_a_failed_listen_is_not_serving_and_the_callback_never_raises() -> None:
    def fails(address: Any) -> None:
        raise RuntimeError("callback bug")

    remove = on_first_listen(fails)
    try:
        closed = socket.socket()
        closed.close()
        with pytest.raises(OSError):
            closed.listen()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen()  # the callback's error is logged, not raised here
    finally:
        remove()
    assert "listen" not in socket.socket.__dict__


def test_remove_without_a_listen_restores_everything() -> None:
    remove = on_first_listen(lambda address: None)
    assert "listen" in socket.socket.__dict__
    remove()
    assert "listen" not in socket.socket.__dict__
    assert not any(getattr(f, "name", None) == "uvloop" for f in sys.meta_path)


def test_uvloop_servers_listen_in_libuv_and_are_told_too() -> None:
    pytest.importorskip("uvloop", reason="uvloop comes with uvicorn's standard extra")
    # In a fresh interpreter: uvloop imported after the hook, as a program would.
    code = textwrap.dedent(
        """
        import asyncio, socket
        from hotspan.agent.serving import on_first_listen
        seen = []
        on_first_listen(seen.append)
        import uvloop

        async def main():
            server = await asyncio.get_running_loop().create_server(
                asyncio.Protocol, "127.0.0.1", 0
            )
            print("SEEN", seen == [server.sockets[0].getsockname()], len(seen))
            server.close()

        uvloop.run(main()) if hasattr(uvloop, "run") else asyncio.run(main())
        print("RESTORED", "create_server" not in uvloop.Loop.__dict__)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "SEEN True 1" in out and "RESTORED True" in out, out


def test_asyncio_servers_are_told() -> None:
    seen: List[Any] = []
    remove = on_first_listen(seen.append)

    async def main() -> Any:
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
        address = server.sockets[0].getsockname()
        server.close()
        await server.wait_closed()
        return address

    try:
        address = asyncio.run(main())
    finally:
        remove()
    assert seen == [address]
