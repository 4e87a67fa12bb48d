"""The hotspan command: the server, profiling a program, and querying a server.

Each command is a module here with ``add_parser(sub)``; :data:`COMMANDS` is their order in
``hotspan --help``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import List, Optional

from hotspan import __version__
from hotspan.cli.client import CLIError

COMMANDS = (
    "server",
    "run",
    "record",
    "attach",
    "detach",
    "settings",
    "query",
    "export",
    "convert",
    "view",
    "diff",
    "why",
    "alerts",
    "tokens",
)

DESCRIPTION = """\
Continuous profiling for Python services, linked to their traces.

examples:
  hotspan server                                   the server, with its UI on :4040
  hotspan run --application-name job -- python job.py
  hotspan record -o job.pb.gz -- python job.py     a profile file, no server
  hotspan diff --baseline 'app{commit=abc}' --comparison 'app{commit=def}' --fail-above 5
"""


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` (one of :data:`COMMANDS`) that command alone:
    each command's module imports what it runs, and building all of them to run one costs a
    tenth of a second of imports (``hotspan server`` starts that much sooner)."""
    parser = argparse.ArgumentParser(
        prog="hotspan",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"hotspan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in (only,) if only in COMMANDS else COMMANDS:
        importlib.import_module(f"hotspan.cli.{name}").add_parser(sub)
    return parser


def configure_logging(level_name: str) -> None:
    """The root logger at ``level_name``, and the libraries' loggers that would say too much
    there: the ClickHouse client logs each failed request on its own, then raises (the store
    reports the error once, with what it was doing); httpx and httpcore log every request's
    URL at info, and a webhook's or a scrape target's URL may hold a secret in its query."""
    level = getattr(logging, level_name.upper(), logging.WARNING)
    logging.basicConfig(level=level)
    if level > logging.DEBUG:
        for name in ("clickhouse_connect", "urllib3"):
            logging.getLogger(name).setLevel(logging.ERROR)
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def main(argv: Optional[List[str]] = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # A command named first needs only its own parser; anything else (no command, --help,
    # --version, a mistyped command) gets the whole one, which lists every command.
    parser = build_parser(only=words[0] if words else None)
    args = parser.parse_args(words)
    configure_logging(args.log_level)
    try:
        return int(args.func(args))
    except CLIError as exc:
        print(f"hotspan {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        # Ctrl-C: the user knows why it stopped; the shell's status for SIGINT.
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `hotspan query ... | head`: the reader has all it wanted.  Python would report the
        # pipe again when it flushes stdout at exit; point stdout at nothing first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
