"""A real headless Chromium for the UI tests (Debian's ``chromium``, driven by Playwright).

``scripts/test.sh`` installs Chromium and sets ``HOTSPAN_REQUIRE_BROWSER=1``, so in CI a
missing browser fails the tests; elsewhere they skip and say what to install.  A test that
fails leaves a screenshot of its last state in ``test-artifacts/ui/`` (or
``$HOTSPAN_TEST_ARTIFACTS``); with ``HOTSPAN_UI_SCREENSHOTS=1`` every test does, and the named
views the tests pass through (``screenshot()``) are kept too.  Not by default: a full-page
screenshot costs Chromium about half a second of CPU, and the suite would take ~170 of them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from pathlib import Path
from typing import Iterator, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("HOTSPAN_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "ui"
VIEWPORT = {"width": 1400, "height": 900}
EVERY_SCREENSHOT = os.environ.get("HOTSPAN_UI_SCREENSHOTS", "") not in ("", "0")
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _unavailable(reason: str) -> None:
    if os.environ.get("HOTSPAN_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def chromium_path() -> str:
    candidates = [os.environ.get("HOTSPAN_CHROMIUM", "")]
    candidates += [shutil.which(name) or "" for name in CHROMIUM_NAMES]
    for path in candidates:
        if path and os.path.exists(path):
            return path
    _unavailable(
        "no Chromium found: install it (apt-get install chromium) or set HOTSPAN_CHROMIUM; "
        "`bash scripts/test.sh` does both"
    )
    raise AssertionError("unreachable")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """Whether the test itself failed, for the ``page`` fixture's teardown to read."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.ui_failed = report.failed


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright is not installed: pip install -e '.[test]'")
    executable = chromium_path()
    with sync_playwright() as playwright:
        # --no-sandbox: CI containers run as root, where Chromium's sandbox cannot start.
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        yield browser
        browser.close()


def artifact_path(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


@pytest.fixture(scope="module")
def _tab(browser) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """One tab for a test module's ``page`` tests.  A new tab costs Chromium about 0.7 s of
    CPU (its page and renderer set up) against 0.15 s for a navigation, and the suite opens
    hundreds: the same tab, put back as new between tests, runs it a minute faster."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


@pytest.fixture
def page(_tab, request) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """A page 1400x900 with no storage, routes or other tabs left by an earlier test: the
    module's tab, put back as a new one would be.  An uncaught script error fails the test."""
    page = _tab
    page.set_viewport_size(VIEWPORT)
    page.emulate_media(color_scheme="light", reduced_motion="no-preference")
    errors: List[str] = []

    def on_error(exc: object) -> None:
        errors.append(str(exc))

    page.on("pageerror", on_error)
    yield page
    try:
        if EVERY_SCREENSHOT or getattr(request.node, "ui_failed", True):
            page.screenshot(path=str(artifact_path(f"{request.node.name}.png")), full_page=True)
    finally:
        page.remove_listener("pageerror", on_error)
        reset_tab(page)
    assert not errors, f"uncaught errors in the page: {errors}"


def reset_tab(page) -> None:  # type: ignore[no-untyped-def]
    """What a test leaves in the tab that the next one must not see: its storage (the UI keeps
    its choices in localStorage), cookies, permissions, request routes, other tabs, the page's
    scripts."""
    context = page.context
    for other in context.pages:
        if other is not page:
            other.close()
    page.unroute_all(behavior="ignoreErrors")
    if page.url.startswith("http"):
        # A page that navigated away mid-test has nothing of its own to clear.
        with contextlib.suppress(Exception):
            page.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
    context.clear_cookies()
    context.clear_permissions()
    page.goto("about:blank")


@contextlib.contextmanager
def sized(page, width: int, height: int = 844, dark: bool = False) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """The tab at ``width`` x ``height`` in a colour scheme, put back as new afterwards: for
    a test that looks at several sizes or schemes, each as a fresh tab would show it."""
    page.set_viewport_size({"width": width, "height": height})
    page.emulate_media(color_scheme="dark" if dark else "light")
    try:
        yield page
    finally:
        reset_tab(page)


def screenshot(page, name: str) -> Path:  # type: ignore[no-untyped-def]
    """Keeps a screenshot of the page now, under a name of the test's choosing, with
    ``HOTSPAN_UI_SCREENSHOTS=1``."""
    path = artifact_path(f"{name}.png")
    if EVERY_SCREENSHOT:
        page.screenshot(path=str(path), full_page=True)
    return path


def hold(page, pattern: str) -> List[object]:  # type: ignore[no-untyped-def]
    """Holds back every request matching ``pattern`` (a Playwright route) until
    :func:`let_through`: for a test of what a page does while an answer is on its way."""
    held: List[object] = []
    page.route(pattern, lambda route: held.append(route))
    return held


def let_through(page, pattern: str, held: List[object], url_part: str, what: str) -> None:  # type: ignore[no-untyped-def]
    """Lets the requests :func:`hold` kept go on (one at least, within 5 s, else ``what`` is
    said), waits for an answer whose address holds ``url_part``, and holds no more."""
    deadline = time.monotonic() + 5
    while not held and time.monotonic() < deadline:
        page.wait_for_timeout(20)  # route handlers run while Playwright waits
    assert held, what
    with page.expect_response(lambda r: url_part in r.url):
        for route in held:
            route.continue_()  # type: ignore[attr-defined]
    page.unroute(pattern)
