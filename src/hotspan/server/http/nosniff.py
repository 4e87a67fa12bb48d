"""``X-Content-Type-Options: nosniff`` on every answer.

An error's text may echo what the client sent (a format, a name), and an answer without a
content type could then be read as HTML by a browser that sniffs: none may be.  The UI's pages
get it here too, beside their own Content-Security-Policy.
"""

from __future__ import annotations

from typing import Any

_HEADER = b"x-content-type-options"


class NoSniff:
    """ASGI middleware adding the header to every HTTP answer that lacks it."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if not any(key.lower() == _HEADER for key, _ in headers):
                    headers.append((_HEADER, b"nosniff"))
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)
