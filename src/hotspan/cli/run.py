"""``hotspan run``: profile a program without changing its code (see hotspan.agent.run)."""

from __future__ import annotations

import argparse
from typing import Callable, List


def _run(argv: List[str]) -> int:
    from hotspan.agent.run import main as run_main

    return run_main(argv)


def add_program_command(
    sub: argparse._SubParsersAction, name: str, help: str, main: Callable[[List[str]], int]
) -> None:
    """A command that starts a program (run, record) and parses its own options with
    ``main(argv)``: everything after the command's name goes there untouched (no '-' prefix
    here, so `--tag`, `-m` or the program's own options are not ours to take)."""
    command = sub.add_parser(name, help=help, add_help=False, prefix_chars="\0")
    command.add_argument("argv", nargs=argparse.REMAINDER)
    command.set_defaults(func=lambda args: main(args.argv), log_level="warning")


def add_parser(sub: argparse._SubParsersAction) -> None:
    add_program_command(
        sub, "run", "profile a program: hotspan run [options] -- python app.py [args...]", _run
    )
