"""hotspan's imports point down its layers (model → formats → store → query → server → cli, the
agent on model and _speedups alone), close no cycle and reach no other module's private
names, as ``scripts/check_layers.py`` checks them; and the checker itself finds each kind of
problem in a small package made to have it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Set

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "check_layers.py"

# Problems known and being removed; each line goes when its fix lands.
KNOWN: Set[str] = set()


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["check_layers"] = module  # NamedTuple looks its module up while the class is made
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def violations() -> Set[str]:
    """What the checker finds in hotspan's own source (read once: seconds of parsing)."""
    return set(_checker().violations())


def test_hotspan_imports_follow_the_layers(violations: Set[str]) -> None:
    assert violations - KNOWN == set()


def test_the_script_exits_with_the_problems(violations: Set[str]) -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False
    )
    lines = set(run.stdout.splitlines())
    assert lines == violations
    assert run.returncode == (1 if lines else 0)


def _package(tmp_path: Path, files: dict) -> Path:
    for name, text in files.items():
        path = tmp_path / "src" / "hotspan" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in (tmp_path / "src" / "hotspan").rglob("*"):
        if directory.is_dir() and not (directory / "__init__.py").exists():
            (directory / "__init__.py").write_text("")
    (tmp_path / "src" / "hotspan" / "__init__.py").write_text('__version__ = "0"\n')
    return tmp_path / "src"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (
            {
                "formats/files.py": "from hotspan.ui.standalone import page\n",
                "ui/standalone.py": "",
            },
            {"upward hotspan.formats.files -> hotspan.ui.standalone:page"},
        ),
        (
            # A lazy import inside a function goes up all the same.
            {
                "server/scrape.py": "def f():\n    from hotspan.cli.client import duration_s\n",
                "cli/client.py": "",
            },
            {"upward hotspan.server.scrape -> hotspan.cli.client:duration_s"},
        ),
        (
            {"alerts/rules.py": "from hotspan.ui import standalone\n", "ui/standalone.py": ""},
            {"sideways hotspan.alerts.rules -> hotspan.ui.standalone"},
        ),
        (
            {"agent/core.py": "from hotspan.formats import pprof\n", "formats/pprof.py": ""},
            {"agent hotspan.agent.core -> hotspan.formats.pprof"},
        ),
        (
            {"store/duckdb.py": "from hotspan.agent.config import X\n", "agent/config.py": ""},
            {"upward hotspan.store.duckdb -> hotspan.agent.config:X"},
        ),
        (
            {
                "query/a.py": "from hotspan.query.b import _hidden\n",
                "query/b.py": "from hotspan.query import c\nc._secret()\n",
                "query/c.py": "",
            },
            {
                "private hotspan.query.a -> hotspan.query.b:_hidden",
                "private hotspan.query.b -> hotspan.query.c:_secret",
            },
        ),
        (
            {
                "query/a.py": "from hotspan.query import b\n",
                "query/b.py": "from .c import x\n",
                "query/c.py": "if False:\n    from hotspan.query.a import y\n",
            },
            {"cycle hotspan.query.a -> hotspan.query.b -> hotspan.query.c -> hotspan.query.a"},
        ),
        (
            # Down the layers, the version from the root, a package's own private module.
            {
                "cli/client.py": (
                    "from hotspan.server import app\nfrom hotspan import __version__\n"
                ),
                "server/app.py": (
                    "from hotspan.query.engine import Q\nfrom hotspan.model import labels\n"
                ),
                "query/engine.py": "from hotspan.store.base import S\nfrom ._x import y\n",
                "query/_x.py": "",
                "store/base.py": "from hotspan.formats.pprof import P\n",
                "formats/pprof.py": (
                    "from hotspan.model.labels import L\nfrom hotspan import _speedups\n"
                ),
                "model/labels.py": "",
                "_speedups/__init__.py": "",
                "agent/core.py": (
                    "from hotspan.model import labels\nfrom hotspan import __version__\n"
                ),
            },
            set(),
        ),
    ],
)
def test_the_checker_finds_each_kind_of_problem(tmp_path: Path, files: dict, expected: set) -> None:
    assert set(_checker().violations(_package(tmp_path, files))) == expected
