"""``hotspan export SELECTOR -o FILE``: a service's merged profile from a server, saved as pprof,
folded stacks, speedscope JSON or the standalone HTML flame graph.

On a terminal a progress display follows the download and the writing (a range of days can
be tens of megabytes); piped or redirected, stderr stays quiet.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from hotspan.cli.client import (
    Client,
    CLIError,
    add_server_options,
    add_time_options,
    args_time_range,
    profile_type_id,
    selector_query,
)
from hotspan.cli.output import iso, write_output
from hotspan.cli.profiles import add_profile_type_option, fetch_profile, resolve_type

EXAMPLES = """\
The merged profile of SELECTOR over a time range, written to FILE.  The format follows the
file name (.pb.gz/.pprof: pprof, .folded/.txt: folded stacks, .speedscope.json/.json:
speedscope, .html: a flame graph page that opens without a server) unless --format says.

examples:
  hotspan export my-service -o cpu.pb.gz                 then: go tool pprof -top cpu.pb.gz
  hotspan export 'my-service{env=prod}' --time-range 24h -o day.speedscope.json
  hotspan export my-service --profile-type alloc_space -o alloc.html
  hotspan export my-service --from 2026-11-25T10:00:00Z --until 2026-11-25T11:00:00Z \\
      --format folded -o incident.txt
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    from hotspan.formats.files import FORMATS

    parser = sub.add_parser(
        "export",
        help="save a service's profile as pprof, folded, speedscope or HTML",
        description=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("selector", metavar="SELECTOR", help="service{label=value,...}")
    parser.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="the file to write ('-': stdout)"
    )
    parser.add_argument(
        "--format", choices=FORMATS, help="pprof, folded, speedscope or html (default: by FILE)"
    )
    add_profile_type_option(parser)
    add_time_options(parser)
    add_server_options(parser)
    parser.set_defaults(func=run, log_level="warning")


def run(args: argparse.Namespace) -> int:
    from hotspan.cli.profile_files import write_profile
    from hotspan.formats.errors import FormatError
    from hotspan.formats.files import format_for_path

    fmt = args.format
    if fmt is None:
        if args.output == "-":
            raise CLIError("writing to stdout: say which format with --format", 2)
        try:
            fmt = format_for_path(args.output)
        except FormatError as exc:
            raise CLIError(f"{exc}; or give --format", 2) from None
    if args.output == "-" and fmt == "pprof" and sys.stdout.isatty():
        raise CLIError("pprof is binary: write it to a file, or pipe it", 2)
    selector = selector_query(args.selector)
    type_id = profile_type_id(args.profile_type)
    window = args_time_range(args)
    client = Client.from_args(args)
    type_id = resolve_type(client, args.profile_type, type_id, selector, window)
    with _progress(os.path.basename(args.output)) as step:
        profile = fetch_profile(client, selector, type_id, window, step("downloading"))
        step("writing " + fmt)(0, None)
        title = " · ".join(
            (args.selector, args.profile_type, f"{iso(window.start_ms)} .. {iso(window.end_ms)}")
        )
        try:
            data = write_profile(profile, fmt, title=title)
        except FormatError as exc:
            raise CLIError(str(exc)) from None
        write_output(args.output, data)
    if args.output != "-" and sys.stderr.isatty():
        print(f"wrote {args.output} ({fmt}, {len(data):,} bytes)", file=sys.stderr)
    return 0


Step = Callable[[int, Optional[int]], None]


@contextmanager
def _progress(output: str) -> Iterator[Callable[[str], Step]]:
    """``step(label)`` starts a phase and gives its progress callback (doing nothing off a
    terminal)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda label: _quiet
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TransferSpeedColumn,
    )

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}", markup=False),  # file names are not markup
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
    ) as progress:
        tasks = [progress.add_task(f"{output}: connecting", total=None)]

        def step(label: str) -> Step:
            # A task per phase: rich's update cannot set a known total back to unknown.
            progress.remove_task(tasks.pop())
            task = progress.add_task(f"{output}: {label}", total=None)
            tasks.append(task)

            def update(read: int, total: Optional[int]) -> None:
                progress.update(task, completed=read, total=total)

            return update

        yield step


def _quiet(read: int, total: Optional[int]) -> None:
    pass
