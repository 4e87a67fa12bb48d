"""A real headless Chromium for the UI tests (Debian's ``chromium``, driven by Playwright).

``scripts/test.sh`` installs Chromium and sets ``HOTSPAN_REQUIRE_BROWSER=1``, so in CI a
missing browser fails the tests; elsewhere they skip and say what to install.  Every test
leaves a screenshot of its last state in ``test-artifacts/ui/`` (or ``$HOTSPAN_TEST_ARTIFACTS``).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Iterator, List

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("HOTSPAN_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "ui"
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


@pytest.fixture
def page(browser, request) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """A fresh page (own storage) 1400x900.  An uncaught script error fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    context.set_default_timeout(15_000)
    page = context.new_page()
    errors: List[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    try:
        page.screenshot(path=str(artifact_path(f"{request.node.name}.png")), full_page=True)
    finally:
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def screenshot(page, name: str) -> Path:  # type: ignore[no-untyped-def]
    """Keeps a screenshot of the page now, under a name of the test's choosing."""
    path = artifact_path(f"{name}.png")
    page.screenshot(path=str(path), full_page=True)
    return path
