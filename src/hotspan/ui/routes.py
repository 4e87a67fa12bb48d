"""Routes that serve the single-page UI: every page path answers with the same shell, which
reads the path and query string in the browser, so a deep link reopens its view."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from hotspan import __version__

STATIC_DIR = Path(__file__).parent / "static"

# The pages load only their own scripts and styles; exports are built in the browser as blobs.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'self'; base-uri 'none'; form-action 'self'"
)


@lru_cache(maxsize=1)
def _shell() -> str:
    # Assets carry the version in their URL, so an upgraded server is never paired with a
    # stale cached script.
    return (
        (STATIC_DIR / "index.html").read_text(encoding="utf-8").replace("{{version}}", __version__)
    )


def _shell_response(status_code: int = 200) -> Response:
    return HTMLResponse(
        _shell(),
        status_code=status_code,
        headers={
            "Content-Security-Policy": CONTENT_SECURITY_POLICY,
            "Cache-Control": "no-cache",
        },
    )


async def page(request: Request) -> Response:
    return _shell_response()


async def not_found(request: Request, exc: Exception) -> Response:
    """A 404 for every path no route takes.  A browser opening a page that does not exist
    gets the UI's own page (status 404), which names the path and links to the views; API
    clients get a plain answer."""
    wants_page = (
        request.method == "GET"
        and "text/html" in request.headers.get("accept", "")
        and not request.url.path.startswith(("/static/", "/api/"))
    )
    if wants_page:
        return _shell_response(404)
    return PlainTextResponse("Not Found", status_code=404)


PAGES = [
    "/",
    "/profiles",
    "/endpoints",
    "/diff",
    "/traces",
    "/traces/{trace_id}",
    "/alerts",
    "/settings",
    "/settings/{service:path}",
]

routes: list[BaseRoute] = [
    *(Route(path, page, methods=["GET"]) for path in PAGES),
    Mount("/static", app=StaticFiles(directory=STATIC_DIR), name="static"),
]
