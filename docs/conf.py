"""Sphinx configuration of hotspan's documentation: Markdown pages (MyST), the Furo theme.

Built with warnings as errors by tests/docs/test_docs_build.py:
``sphinx-build -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The version is the package's, read from pyproject.toml so that building the docs does not
# need hotspan importable (or its C extensions built).
_version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)

project = "hotspan"
author = "the hotspan authors"
copyright = "the hotspan authors"
release = _version.group(1) if _version else ""
version = release

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "README.md"]
# Pages link to each other's sections by their titles' slugs: [the tokens](production.md#tokens).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
# Code blocks are shown as written: no lexer is guessed (the highlighter warns on JSON with
# comments or a shell session otherwise).
highlight_language = "none"

html_theme = "furo"
html_title = f"hotspan {release}"
html_static_path: list = []
html_show_sourcelink = False
