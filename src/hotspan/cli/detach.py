"""``hotspan detach PID``: stop the agent ``hotspan attach`` started (see :mod:`.attach`)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspan.cli.attach import command_parser, detach_main

    parser = command_parser(sub, "detach", "stop the agent hotspan attach started: detach PID")
    parser.set_defaults(func=detach_main, log_level="warning")
