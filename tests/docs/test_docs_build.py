"""The documentation site builds with Sphinx (MyST pages, the Furo theme) without a single
warning: a broken link between pages, a section anchor that no longer exists, a result file in
bench/results/ that is gone, an image that is missing or a page left out of the table of
contents all fail here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="the test extra installs sphinx, myst-parser and furo on Python 3.11 and later",
)


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    missing = [m for m in ("sphinx", "myst_parser", "furo") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: pip install -e '.[test]'")
    out = tmp_path / "html"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-q",
            "-b",
            "html",
            "-d",
            str(tmp_path / "doctrees"),
            str(DOCS),
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"sphinx-build failed:\n{result.stderr}{result.stdout}"
    assert not result.stderr.strip(), result.stderr
    # Every page is built, and reachable from the front page's table of contents.
    pages = sorted(p.stem for p in DOCS.glob("*.md"))
    front = (out / "index.html").read_text()
    for page in pages:
        assert (out / f"{page}.html").is_file(), page
        if page != "index":
            assert f'href="{page}.html"' in front, f"{page} is not linked from the front page"
