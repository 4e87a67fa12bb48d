"""The command line's help: every command has it, with examples, in plain text, and the
README's server options list is the server's."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hotspan.cli import COMMANDS, build_parser

README = Path(__file__).resolve().parents[2] / "README.md"


def _subparsers() -> dict:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_is_registered() -> None:
    assert set(_subparsers()) == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_is_plain_text(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hotspan", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "``" not in out.stdout and ":func:" not in out.stdout, out.stdout
    assert f"hotspan {command}" in out.stdout
    assert "examples:" in out.stdout, f"hotspan {command} --help shows no examples"


def test_top_level_help_has_examples() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hotspan", "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    assert "``" not in out.stdout
    assert "examples:" in out.stdout
    for command in COMMANDS:
        assert command in out.stdout


def test_readme_lists_every_server_option() -> None:
    section = README.read_text().split("## Server options", 1)[1].split("\n## ", 1)[0]
    server = _subparsers()["server"]
    options = [
        o for a in server._actions for o in a.option_strings if o.startswith("--") and o != "--help"
    ]
    missing = [o for o in options if not re.search(re.escape(o) + r"\b", section)]
    assert not missing, f"README's Server options section leaves out {missing}"
