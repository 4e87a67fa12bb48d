"""The control endpoint: turn profiling on and off, and change its settings, in a running
process.

``GET`` answers the agent's state as JSON; ``POST`` enables profiling, ``DELETE`` disables it;
``PUT`` takes a settings object (see :mod:`hotspan.model.agent_settings`) whose keys override
the agent's own until the next ``PUT`` (``{}`` clears them).  The endpoint is mountable in the
program (:func:`asgi_app`, :func:`wsgi_app`) or served on its own port
(``HOTSPAN_CONTROL_PORT``, see :mod:`.control_server`); all three answer through
:func:`handle`.  A change is applied by the agent's loop; the answer waits (2 s at most) for
it, so it shows the state that results.
"""

from __future__ import annotations

import hmac
import json

from hotspan.model.agent_settings import SettingsError, validate_settings

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing stays out of the program at run time: see agent/log.py
    from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

MAX_BODY = 64 * 1024
METHODS = ("GET", "POST", "PUT", "DELETE")

if TYPE_CHECKING:
    Answer = Tuple[int, Dict[str, Any]]  # HTTP status, JSON object


def _agent() -> Any:
    from hotspan.agent.current import current_agent

    return current_agent()


def handle(method: str, body: bytes, authorization: str, token: Optional[str] = None) -> Answer:
    """(HTTP status, JSON object) for one control request.  ``token``: the one requests must
    carry (None: the agent's ``control_token``)."""
    agent = _agent()
    if agent is None:
        return 503, {"error": "hotspan is not running in this process (call hotspan.configure)"}
    wanted = agent.config.control_token if token is None else token
    if not authorized(authorization, wanted):
        return 401, {"error": "missing or invalid token (send Authorization: Bearer <token>)"}
    method = method.upper()
    if method == "GET":
        return 200, agent.status()
    if method in ("POST", "DELETE"):
        agent.live.set_enabled(method == "POST")
    elif method == "PUT":
        if len(body) > MAX_BODY:
            return 413, {"error": f"body over {MAX_BODY} bytes"}
        try:
            settings = validate_settings(json.loads(body or b"null"))
        except RecursionError:
            return 400, {"error": "body is not JSON we read: nested too deeply"}
        except ValueError as exc:  # SettingsError, and json's own for what is not JSON
            problem = exc if isinstance(exc, SettingsError) else f"body is not JSON: {exc}"
            return 400, {"error": str(problem)}
        agent.live.replace_local(settings)
    else:
        return 405, {"error": f"method {method} not allowed (use {', '.join(METHODS)})"}
    applied = agent.wait_applied()
    state = agent.status()
    if not applied:
        state["pending"] = True  # the loop has not got to it yet (a very busy program)
    return 200, state


def authorized(authorization: str, token: Optional[str], basic: bool = False) -> bool:
    """Whether ``Authorization`` carries ``token`` (anything does when there is none): as
    ``Bearer <token>``, or with ``basic`` also as Basic auth's password (what ``go tool pprof
    http://user:TOKEN@host/...`` sends)."""
    if not token:
        return True
    scheme, _, given = authorization.partition(" ")
    given = given.strip()
    if basic and scheme.lower() == "basic":
        import binascii

        try:
            given = binascii.a2b_base64(given).decode("utf-8").partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            return False
    elif scheme.lower() != "bearer":
        return False
    # As bytes: compare_digest refuses str with characters beyond ASCII.
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode())


def status_line(status: int) -> str:
    """``"404 Not Found"``, as WSGI's start_response takes it."""
    from http import HTTPStatus

    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Error"


async def serve_lifespan(scope: Dict[str, Any], receive: Callable, send: Callable) -> bool:
    """Answers an ASGI ``lifespan`` scope (an app mounted at the root gets one); False for
    any other scope, which the caller serves."""
    if scope["type"] != "lifespan":
        return False
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return True


def _encode(answer: Answer) -> Tuple[int, bytes]:
    status, payload = answer
    return status, json.dumps(payload).encode() + b"\n"


def handle_stream(
    method: str,
    content_length: Optional[str],
    read: Callable[[int], bytes],
    authorization: str,
    token: Optional[str] = None,
) -> Tuple[int, bytes]:
    """(HTTP status, JSON bytes) for a request whose body is ``content_length`` bytes to
    ``read`` (WSGI, http.server): never more than MAX_BODY is read."""
    try:
        length = int(content_length or 0)
    except ValueError:
        length = -1
    if length < 0 or length > MAX_BODY:
        return _encode((413, {"error": f"body over {MAX_BODY} bytes or of no length"}))
    body = read(length) if length else b""
    return _encode(handle(method, body, authorization, token))


def asgi_app(token: Optional[str] = None) -> Callable[..., Any]:
    """An ASGI application to mount in the program (Starlette ``Mount("/hotspan", app)``,
    FastAPI ``app.mount(...)``).  ``token``: requests must carry ``Authorization: Bearer``
    with it (None: the agent's ``control_token``)."""

    async def app(scope: Dict[str, Any], receive: Callable, send: Callable) -> None:
        if await serve_lifespan(scope, receive, send) or scope["type"] != "http":
            return
        body = b""
        too_big = False
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            if not too_big:
                body += message.get("body", b"")
                too_big = len(body) > MAX_BODY
            more = message.get("more_body", False)
        authorization = ""
        for name, value in scope.get("headers", ()):
            if name.lower() == b"authorization":
                authorization = value.decode("latin-1")
        if too_big:
            answer: Answer = (413, {"error": f"body over {MAX_BODY} bytes"})
        else:
            import asyncio

            # handle() may wait for the agent's loop: never on the program's event loop.
            answer = await asyncio.get_running_loop().run_in_executor(
                None, handle, scope["method"], body, authorization, token
            )
        status, data = _encode(answer)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})

    return app


def wsgi_app(token: Optional[str] = None) -> Callable[..., Iterable[bytes]]:
    """A WSGI application to mount in the program (for example with
    ``werkzeug.middleware.dispatcher.DispatcherMiddleware`` under ``/hotspan``)."""

    def app(environ: Dict[str, Any], start_response: Callable) -> List[bytes]:
        status, data = handle_stream(
            environ.get("REQUEST_METHOD", "GET"),
            environ.get("CONTENT_LENGTH"),
            environ["wsgi.input"].read,
            environ.get("HTTP_AUTHORIZATION", ""),
            token,
        )
        start_response(
            status_line(status),
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    return app
