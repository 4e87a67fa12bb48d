"""``hotspan run``: profile a program without changing its code (see hotspan.agent.run)."""

from __future__ import annotations

import argparse


def _run(args: argparse.Namespace) -> int:
    from hotspan.agent.run import main as run_main

    return run_main(args.argv)


def add_parser(sub: argparse._SubParsersAction) -> None:
    # hotspan.agent.run parses its own options: everything after `run` goes there untouched
    # (no '-' prefix here, so `--tag`, `-m` or the program's own options are not ours to take).
    run = sub.add_parser(
        "run",
        help="profile a program: hotspan run [options] -- python app.py [args...]",
        add_help=False,
        prefix_chars="\0",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER)
    run.set_defaults(func=_run, log_level="warning")
