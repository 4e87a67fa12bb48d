"""The command line's help: every command has it, with examples, in plain text; and the docs'
command line page (docs/cli.md) documents every command and subcommand the parser knows, each
with every option its --help lists, the server's included."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from hotspan.cli import COMMANDS, build_parser, main

CLI_DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _subparsers() -> dict:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _commands() -> List[str]:
    """Every command and subcommand the parser knows, by its words: "server", "settings set"."""
    found: List[str] = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append(f"{prefix}{name}")
                    walk(sub, f"{prefix}{name} ")

    walk(build_parser(), "")
    return found


def _help(command: str) -> str:
    """``hotspan COMMAND --help`` as it prints it.  In-process: ``run`` and ``record`` parse
    their own options, so their help comes from the command, not from the top parser."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--help"])
    assert exit_.value.code in (0, None), out.getvalue()
    return out.getvalue()


def _options(help_text: str) -> List[str]:
    """The options an argparse help lists, one per argument: its long form where it has one
    (``-o FILE, --output FILE`` is ``--output``), else its short one (``-m``)."""
    options = []
    for line in help_text.splitlines():
        if not re.match(r"  -", line):
            continue
        spec = re.split(r"\s{2,}", line.strip())[0]
        names = re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", spec)
        if "--help" in names:
            continue
        longs = [n for n in names if n.startswith("--")]
        options.extend(longs or names[:1])
    return options


def _sections(text: str) -> Dict[str, str]:
    """docs/cli.md's sections titled `hotspan COMMAND`, each up to the next heading."""
    parts = re.split(r"^#{2,6} (.*)$", text, flags=re.M)
    sections = {}
    for title, body in zip(parts[1::2], parts[2::2]):
        match = re.fullmatch(r"`hotspan ([a-z -]+)`", title.strip())
        if match:
            sections[match.group(1)] = body
    return sections


def _mentions(section: str, option: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(option) + r"(?![\w-])", section) is not None


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


def test_option_reader_reads_argparse_help() -> None:
    # The docs check below is only as good as this reader: it must see every kind of line
    # argparse writes (short and long forms, choices, mutually exclusive pairs, groups).
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("-o", "--output", metavar="FILE")
    parser.add_argument("-m", metavar="MODULE")
    parser.add_argument("--level", choices=["a", "b"])
    pair = parser.add_mutually_exclusive_group()
    pair.add_argument("--on", action="store_true")
    pair.add_argument("--off", action="store_true")
    group = parser.add_argument_group("the other side")
    group.add_argument("--a-very-long-option-name", metavar="A_VERY_LONG_METAVAR", help="h")
    parser.add_argument("--flag", action=argparse.BooleanOptionalAction)
    options = _options(parser.format_help())
    assert options == [
        "--output",
        "-m",
        "--level",
        "--on",
        "--off",
        "--flag",
        "--no-flag",
        "--a-very-long-option-name",
    ], options


def test_docs_have_a_section_per_command() -> None:
    sections = _sections(CLI_DOCS.read_text())
    commands = _commands()
    assert {"server", "run", "record", "settings set", "tokens revoke"} <= set(commands)
    missing = [c for c in commands if c not in sections]
    assert not missing, f"docs/cli.md has no section titled `hotspan COMMAND` for {missing}"


@pytest.mark.parametrize("command", _commands())
def test_docs_list_every_option_of(command: str) -> None:
    section = _sections(CLI_DOCS.read_text()).get(command)
    assert section is not None, f"docs/cli.md has no section `hotspan {command}`"
    options = _options(_help(command))
    missing = [o for o in options if not _mentions(section, o)]
    assert not missing, f"docs/cli.md's `hotspan {command}` section leaves out {missing}"


def test_docs_list_every_server_option() -> None:
    section = _sections(CLI_DOCS.read_text())["server"]
    server = _subparsers()["server"]
    options = [
        o for a in server._actions for o in a.option_strings if o.startswith("--") and o != "--help"
    ]
    assert len(options) >= 20, options
    missing = [o for o in options if not _mentions(section, o)]
    assert not missing, f"docs/cli.md's `hotspan server` section leaves out {missing}"
