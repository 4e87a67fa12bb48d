"""Telling that a program serves requests, as it starts to: it listens on a TCP socket.

``hotspan run`` knows servers by their commands (gunicorn, uvicorn, ...), but ``python
shop.py`` may call ``uvicorn.run(app)`` itself.  Such a program's first listening socket is the
moment it becomes a server; :func:`on_first_listen` says so once, then takes itself out.

Two doors lead there: ``socket.socket.listen`` (asyncio's own loops, ``socketserver``,
``http.server``, gunicorn, waitress, Twisted, Tornado) and uvloop's ``create_server``, which
binds and listens in libuv without Python's socket module.  Only Internet sockets count:
``multiprocessing``'s managers listen on Unix sockets in batch jobs too.
"""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any, Callable, List

from hotspan.agent.after_import import AfterImport
from hotspan.agent.log import logger
from hotspan.agent.symbols import hide_code

_FAMILIES = (socket.AF_INET, socket.AF_INET6)


class _FirstListen:
    def __init__(self, callback: Callable[[Any], None]) -> None:
        self.callback = callback
        self.fired = threading.Lock()
        self.undo: List[Callable[[], None]] = []

    def saw(self, sockets: Any) -> None:
        """A call that may have made listening ``sockets``: the callback, if the first TCP
        one."""
        found = next((s for s in sockets if s.family in _FAMILIES), None)
        if found is None or not self.fired.acquire(blocking=False):
            return
        self.remove()
        try:
            address = found.getsockname()
        except OSError:
            address = None
        try:
            self.callback(address)
        except Exception:  # noqa: BLE001 - the program listens either way
            logger.warning("hotspan: could not act on the program's listening", exc_info=True)

    def remove(self) -> None:
        while self.undo:
            self.undo.pop()()

    def wrap(self, owner: type, name: str, make: Callable[[Any], Any]) -> None:
        """Put ``make(original)`` in place of ``owner.name``, undone by :meth:`remove` if it is
        still there then."""
        own = name in owner.__dict__  # socket.socket inherits listen from _socket.socket
        original = getattr(owner, name)
        wrapper = make(original)
        # The wrapper is not the program's code: its frame stays out of the program's stacks.
        hide_code(wrapper.__code__)
        setattr(owner, name, wrapper)

        def undo() -> None:
            if owner.__dict__.get(name) is wrapper:
                if own:
                    setattr(owner, name, original)
                else:
                    delattr(owner, name)

        self.undo.append(undo)

    def hook_uvloop(self, module: Any) -> None:
        if self.fired.locked():
            return

        def make(original: Any) -> Any:
            async def create_server(loop: Any, *args: Any, **kwargs: Any) -> Any:
                server = await original(loop, *args, **kwargs)
                self.saw(getattr(server, "sockets", None) or ())
                return server

            return create_server

        self.wrap(module.Loop, "create_server", make)


def on_first_listen(callback: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``callback(address)`` once the program first listens on a TCP socket.

    Returns a function that takes the hooks out without calling ``callback``.  The callback's
    errors are logged, never raised into the program.
    """
    first = _FirstListen(callback)

    def make_listen(original: Any) -> Any:
        def listen(sock: socket.socket, *args: Any) -> None:
            original(sock, *args)
            first.saw((sock,))

        return listen

    first.wrap(socket.socket, "listen", make_listen)
    if "uvloop" in sys.modules:
        first.hook_uvloop(sys.modules["uvloop"])
    else:
        after = AfterImport("uvloop", first.hook_uvloop)
        after.install()
        first.undo.append(after.uninstall)
    return first.remove
